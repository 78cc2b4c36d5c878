"""tools/corrupt_engine.py as a user runs it: a copy of a build with one target weight changed,
or an error naming what is wrong, exit 1, no traceback and nothing written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.real_model import ROOT

REFERENCE = ROOT / "tests" / "data" / "speculators-peagle-tiny"


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Path:
    from specrt.engines.build import build_engines
    from specrt.export.export import export

    root = tmp_path_factory.mktemp("corrupt")
    export(REFERENCE / "verifier", REFERENCE / "draft", root / "export", log=lambda _: None)
    build_engines(root / "export", "onnxruntime", (1,), root / "engines", profile_repeats=1, profile_pasts=(16,),
                  max_context=64, log=lambda _: None)
    return root / "engines"


def corrupt(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "corrupt_engine.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_the_copy_points_every_target_role_at_the_changed_graph(engines, tmp_path):
    r = corrupt(engines, tmp_path / "out", "--index", 3, "--delta", 0.5)
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path / 'out'}: embed[3] " in r.stdout
    m = json.loads((tmp_path / "out" / "engines.json").read_text())
    assert {role["engine"]["onnx"] for role in m["roles"].values() if role["graph"] == "target"} == {
        "corrupt/target.onnx"}
    assert "corrupt/target.onnx" in {f["file"] for f in m["files"]}


def test_a_wrong_folder_weight_or_index_is_refused_by_name_with_nothing_written(engines, tmp_path):
    """Before: a folder that is no build was copied whole, then a traceback (FileNotFoundError on
    its export/); a wrong --initializer or --index a traceback after the copy, which stayed; an
    OUT inside ENGINES was copied into the folder it copies."""
    export = engines.parent / "export"
    for args, match in (([tmp_path / "nowhere", tmp_path / "out"], r"nowhere: cannot read engines.json \(No such"),
                        ([export, tmp_path / "out"], r"export: cannot read engines.json"),
                        ([engines, engines / "out"], r"engines/out lies inside .*engines: give OUT outside"),
                        ([engines, tmp_path / "out", "--initializer", "nosuch"],
                         r"engines: the target engine has no weight 'nosuch' \(.*out not written\)"),
                        ([engines, tmp_path / "out", "--index", 10 ** 9],
                         r"engines: --index 1000000000 is outside the target engine's weight 'embed' \(\d+ elem")):
        r = corrupt(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
        assert len(r.stderr.splitlines()) == 1 and re.search(match, r.stderr), r.stderr
        assert not (tmp_path / "out").exists() and not (engines / "out").exists()


def test_a_copy_that_fails_part_way_is_said_and_removed(engines, tmp_path):
    """The engine files' copy itself failing part way (a full disk; here a link in ENGINES to a
    file since removed, which copytree cannot follow) was a shutil.Error traceback, the
    half-made OUT left behind: it ran before the try that removes a failed copy."""
    link = engines / "notes.txt"
    link.symlink_to(tmp_path / "gone.txt")
    try:
        r = corrupt(engines, tmp_path / "out")
    finally:
        link.unlink()
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert re.search(r"^error: .*engines: \[Errno 2\] No such file .*notes\.txt.* \(.*out not written\)$",
                     r.stderr), r.stderr
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere")  # OUT a dead link: refused as there, not followed
    r = corrupt(engines, tmp_path / "out")
    assert r.returncode == 1 and r.stderr == f"error: {tmp_path / 'out'} exists\n", r.stderr
    assert (tmp_path / "out").is_symlink() and not (tmp_path / "elsewhere").exists()
