"""Two specrt processes on the same folders at once, as a user's shell scripts, cron jobs and CI
runners run them. Each race is made deterministic: one process is paused at a known point (just
after a function returns, waiting on a FIFO the test writes) while the other runs. Whatever the
order, no output is half-written, an earlier output is kept or replaced whole, a process that
cannot go on says so in one `error:` line with exit code 1 and no traceback, and no reader runs
a mix of two writers' files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"

# run as `python -c`: the CLI with one function wrapped so that, the first time it returns (for a
# call whose arguments hold PAUSE_MATCH), the process makes PAUSE_SIGNAL and waits on PAUSE_FIFO
_PAUSED_CLI = """
import importlib, os
mod, _, name = os.environ["PAUSE_AT"].partition(":")
owner = importlib.import_module(mod)
*path, attr = name.split(".")
for a in path:
    owner = getattr(owner, a)
real = getattr(owner, attr)
def paused(*args, **kwargs):
    result = real(*args, **kwargs)
    if os.environ.get("PAUSE_MATCH", "") in " ".join(map(str, args)) and os.environ.pop("PAUSE_FIFO", None):
        open(os.environ["PAUSE_SIGNAL"], "w").close()
        with open(os.environ["PAUSE_FIFO_PATH"]) as f:
            f.read()
    return result
setattr(owner, attr, paused)
from specrt.cli import entry
entry()
"""


def _cli(*args: str, cwd: Path, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen([*prefix, sys.executable, "-c", "from specrt.cli import entry; entry()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env={**os.environ, "SPECRT_THP": "0"})


class Paused:
    """`specrt ARGS` paused just after ``at`` ("module:function" or "module:Class.method")
    returns for a call whose arguments hold ``match``, until resume()."""

    def __init__(self, tmp: Path, at: str, *args: str, match: str = "", prefix: tuple[str, ...] = ()):
        self.fifo, self.signal = tmp / f"fifo-{len(os.listdir(tmp))}", tmp / f"paused-{len(os.listdir(tmp))}"
        os.mkfifo(self.fifo)
        env = {**os.environ, "SPECRT_THP": "0", "PAUSE_AT": at, "PAUSE_MATCH": match, "PAUSE_FIFO": "1",
               "PAUSE_FIFO_PATH": str(self.fifo), "PAUSE_SIGNAL": str(self.signal)}
        self.p = subprocess.Popen([*prefix, sys.executable, "-c", _PAUSED_CLI, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, cwd=tmp, env=env)
        end = time.monotonic() + 120
        while not self.signal.exists():
            assert self.p.poll() is None, self.p.communicate()
            assert time.monotonic() < end
            time.sleep(0.02)

    def resume(self) -> tuple[int, str]:
        with open(self.fifo, "w"):
            pass
        _, err = self.p.communicate(timeout=300)
        return self.p.returncode, err.decode()


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=300)
    return p.returncode, err.decode()


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (unshare's child)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid, *(q for k in kids for q in _family(int(k)))]


def _blocked_or_done(p: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until ``p`` (or its child) waits on a lock (flock) or has ended."""
    end = time.monotonic() + timeout
    while p.poll() is None and time.monotonic() < end:
        for pid in _family(p.pid):
            try:
                if "lock" in Path(f"/proc/{pid}/wchan").read_text():
                    return
            except OSError:
                pass
        time.sleep(0.05)


def _leftovers(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".old-" in n or ".partial-" in n)


def _whole_export(out: Path) -> None:
    from specrt.manifest import load_export

    load_export(out, verify=True)


@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="needs Linux's /proc/PID/wchan")
def test_two_forced_exports_into_one_folder_replace_it_in_turn(pair, tmp_path):
    """Two `specrt export --force` into one -o: the second, finishing while the first was between
    its two renames (the earlier output moved aside, its own not yet in place), put its own in
    place; the first's rename then met it: "Directory not empty", a traceback, exit 1, and the
    earlier output left moved aside as .out.old-PID. The renames are now made under a lock on the
    folder: the second waits, then replaces the first's output whole; both exit 0, nothing left."""
    out = tmp_path / "out"
    args = ["export", str(REFERENCE / "verifier"), "--draft", str(REFERENCE / "draft"), "-o", str(out), "--force"]
    assert _finish(_cli(*args, cwd=tmp_path))[0] == 0
    first = Paused(tmp_path, "pathlib:Path.rename", *args, match=".out.old-")
    assert not out.exists()  # (paused between its two renames)
    second = _cli(*args, cwd=tmp_path)
    _blocked_or_done(second)
    rc1, err1 = first.resume()
    rc2, err2 = _finish(second)
    assert (rc1, rc2) == (0, 0) and "Traceback" not in err1 + err2, err1 + err2
    _whole_export(out)
    assert _leftovers(tmp_path) == []


@pytest.mark.skipif(shutil.which("unshare") is None or subprocess.run(
    ["unshare", "--user", "--map-root-user", "--pid", "--fork", "true"], capture_output=True).returncode != 0,
    reason="needs unshare(1) and PID namespaces")
def test_a_replacement_in_another_pid_namespace_with_the_same_pid_is_left_alone(pair, tmp_path):
    """Two containers sharing a volume, each run its container's PID 1: a run took the other's
    earlier output, moved aside as .out.old-1 while it replaced it, for a killed run's (its own
    PID on it) and put it back as out; the other's rename then failed ("Directory not empty", a
    traceback) and its output was lost. Settling moved-aside outputs now waits on the lock a
    live replacement holds over its renames."""
    out = tmp_path / "out"
    ns = ("unshare", "--user", "--map-root-user", "--pid", "--fork")
    args = ["export", str(REFERENCE / "verifier"), "--draft", str(REFERENCE / "draft"), "-o", str(out), "--force"]
    assert _finish(_cli(*args, cwd=tmp_path))[0] == 0
    first = Paused(tmp_path, "pathlib:Path.rename", *args, match=".out.old-", prefix=ns)
    assert (tmp_path / ".out.old-1").is_dir()  # (PID 1 in its namespace, as in a container)
    second = _cli(*args, cwd=tmp_path, prefix=ns)
    _blocked_or_done(second)
    rc1, err1 = first.resume()
    rc2, err2 = _finish(second)
    assert (rc1, rc2) == (0, 0) and "Traceback" not in err1 + err2, err1 + err2
    assert "restored" not in err2, err2
    _whole_export(out)
    assert _leftovers(tmp_path) == []


def test_a_run_whose_engines_are_rebuilt_while_it_loads_them_says_so(pair, tmp_path):
    """`specrt build --force` replacing the engines while `specrt run` loaded them: the run had
    read the earlier engines.json and checked the earlier files' hashes, then opened the new
    build's graphs (an int8 draft under a manifest of an fp one) and ran them, exit 0, without
    a word. It now finds the folder replaced once its files are read: one error line naming the
    folder, exit 1, nothing run."""
    export_dir, engines, prompts = pair
    eng = tmp_path / "engines"
    shutil.copytree(engines, eng)
    reader = Paused(tmp_path, "specrt.engines.engine_set:verify_engines", "run", str(eng), "--prompts", str(prompts),
                    "--max-new-tokens", "4")
    rc, err = _finish(_cli("build", str(export_dir), "-o", str(eng), "--force", "--depths", "1,2", "--max-context",
                           "64", "--profile-repeats", "1", "--draft-weights", "int8", "--no-canary", cwd=tmp_path))
    assert rc == 0, err
    rc, err = reader.resume()
    assert rc == 1 and "Traceback" not in err, err
    assert f"error: {eng}: replaced while its engines were being loaded" in err, err


def test_two_runs_with_one_grow_file_keep_both_runs_answers(pair, tmp_path):
    """Two `specrt run --grow-file G` at once (a nightly job and a CI run): each read G, then
    wrote back its own growth, and the last to write lost the other's answers without a word.
    G is now read again under a lock when it is written: both runs' sequences are in it."""
    from specrt.runtime.corpus import Growth

    _, engines, prompts = pair
    grow = tmp_path / "grow.npz"
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"prompt_ids": [7, 8, 9, 10 + i]}) + "\n" for i in range(3)))
    args = ["--max-new-tokens", "6", "--governor", "off:ngram:grow", "--grow-file", str(grow)]
    first = Paused(tmp_path, "specrt.runtime.session:Session.load_growth", "run", str(engines), "--prompts",
                   str(prompts), *args)
    rc, err = _finish(_cli("run", str(engines), "--prompts", str(other), *args, cwd=tmp_path))
    assert rc == 0, err
    rc, err = first.resume()
    assert rc == 0 and "Traceback" not in err, err
    with np.load(grow) as z:
        assert len(z["lengths"]) == 4 + 3  # every prompt's answer of both runs
    Growth.load(grow, 10**6)


def _paused_bench(tmp_path: Path, at: str, eng: Path, prompts: Path, out: Path) -> Paused:
    """A short `specrt bench` of ``eng`` (no peers, `off` alone) into ``out``, paused after ``at``."""
    return Paused(tmp_path, at, "bench", str(eng), "--prompts", str(prompts), "--peers", "none", "--governors", "off",
                  "--max-new-tokens", "4", "--threads", "1", "--no-profile", "-o", str(out), "--quiet")


def test_a_bench_whose_engines_are_rebuilt_while_it_runs_writes_no_report(pair, tmp_path):
    """`specrt build --force` while `specrt bench` ran: each worker loads the engines again by
    their path, so the configurations after the rebuild measured the new build (an int8 draft)
    in a report whose settings and costs were the earlier build's, exit 0. The bench now finds
    the folder replaced before it writes the report: one error line, exit 1, no report."""
    export_dir, engines, prompts = pair
    eng, out = tmp_path / "engines", tmp_path / "report"
    shutil.copytree(engines, eng)
    bench = _paused_bench(tmp_path, "specrt.engines.engine_set:load_engines", eng, prompts, out)
    rc, err = _finish(_cli("build", str(export_dir), "-o", str(eng), "--force", "--depths", "1,2", "--max-context",
                           "64", "--profile-repeats", "1", "--draft-weights", "int8", "--no-canary", cwd=tmp_path))
    assert rc == 0, err
    rc, err = bench.resume()
    assert rc == 1 and "Traceback" not in err, err
    assert f"error: {eng}: replaced while this bench ran" in err and f"{out} not written" in err, err
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_bench_whose_engines_are_removed_before_its_report_says_removed(pair, tmp_path):
    """The engines folder removed (not rebuilt) after the last worker: said "removed", not
    "replaced while this bench ran (rebuilt: ...)" as before; no report."""
    _, engines, prompts = pair
    eng, out = tmp_path / "engines", tmp_path / "report"
    shutil.copytree(engines, eng)
    bench = _paused_bench(tmp_path, "specrt.cmd_bench:efficiency", eng, prompts, out)
    shutil.rmtree(eng)
    rc, err = bench.resume()
    assert rc == 1 and "Traceback" not in err, err
    assert err.endswith(f"error: {eng}: removed while this bench ran; {out} not written\n"), err
    assert not out.exists()
