"""tools/device_train_draft.sh's two commands run on this machine (prepare, restore) and its
arguments, in a git repository of a few files laid out as the checkout's; the device job
itself needs a GPU and is never started here."""

from __future__ import annotations

import shutil
import subprocess

from tests.real_model import ROOT

SCRIPT = ROOT / "tools" / "device_train_draft.sh"


def git(repo, *args) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo, check=True,
                   capture_output=True)


def repository(tmp_path):
    repo = tmp_path / "checkout with space"
    files = {"results/a.txt": "a figure\n", "results/r.md": "# results\n", "tests/b.py": "def test_b(): pass\n",
             "tests/t.py": "def test_t(): pass\n", "tests/data/c.txt": "data\n",
             "fixtures/peagle-smollm2/model.safetensors": "weights"}
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "tools").mkdir()
    shutil.copy(SCRIPT, repo / "tools")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "files")
    return repo, files


def test_restore_brings_back_the_emptied_files_and_keeps_a_contributors_edits(tmp_path):
    """Before: restore checked out every tracked file of results/ and tests/, so an edit of one's
    own there (restore run twice, or without prepare) was dropped while it said "restored"."""
    repo, files = repository(tmp_path)
    for name in ("results/a.txt", "tests/b.py", "fixtures/peagle-smollm2/model.safetensors"):  # as prepare does
        (repo / name).write_text("")
    (repo / "results/r.md").write_text("# results\nmy notes\n")
    (repo / "tests/t.py").write_text("def test_t(): assert 1\n")
    r = subprocess.run(["bash", str(repo / "tools" / "device_train_draft.sh"), "restore"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "restored the 3 emptied files" in r.stdout and "left 2 files there with changes of their own" in r.stdout
    for name in ("results/a.txt", "tests/b.py", "fixtures/peagle-smollm2/model.safetensors", "tests/data/c.txt"):
        assert (repo / name).read_text() == files[name]
    assert (repo / "results/r.md").read_text() == "# results\nmy notes\n"
    assert (repo / "tests/t.py").read_text() == "def test_t(): assert 1\n"


def test_an_argument_it_does_not_know_is_refused_before_the_device_job(tmp_path):
    """Before: any argument but prepare / restore (`--help`, `prepar`) ran the device job (the
    GPU's), which here wrote OUT/device.log and failed on the machine check."""
    repo, _ = repository(tmp_path)
    script = str(repo / "tools" / "device_train_draft.sh")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out")}
    for arg in ("prepar", "--restore", "-x"):
        r = subprocess.run(["bash", script, arg], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.startswith("usage: bash tools/device_train_draft.sh prepare|restore")
        assert not (tmp_path / "out").exists()
    r = subprocess.run(["bash", script, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "bash tools/device_train_draft.sh prepare " in r.stdout
    assert not (tmp_path / "out").exists()
    subprocess.run(["git", "diff", "--exit-code"], cwd=repo, check=True)  # nothing emptied
