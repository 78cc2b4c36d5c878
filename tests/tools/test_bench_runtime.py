"""tools/bench_runtime.py's child peak RSS (also tools/bench_export.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.real_model import tool
from tests.runtime.test_corpus import tiny_engines  # noqa: F401


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc (Linux)")
def test_a_child_s_peak_rss_is_its_own_not_its_parent_s():
    """A child touching 200 MiB peaks near 200 MiB, whatever this process held when it spawned
    it: Linux carries the spawner's ru_maxrss into the child across exec (a pytest at 1.36 GB
    made a 0.84 GB export read 1.36 GB and fail its bound), so a figure that is not above ours
    is replaced by the child's polled VmHWM."""
    t = tool("bench_runtime")
    hold = bytearray(400 * 2**20)  # this process's high-water mark above the child's peak
    hold[:: 4096] = b"1" * len(hold[:: 4096])
    child = "import time; x = bytearray(200 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(0.3)"
    detail: dict = {}
    peak, rc = t.child_peak_rss([sys.executable, "-c", child], detail)
    assert rc == 0 and 200 * 2**20 < peak < 300 * 2**20, detail
    assert detail["ru_maxrss"] > 400 * 2**20  # what ru_maxrss alone says: this process's peak, not the child's
    peak, rc = t.child_peak_rss([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert rc == 3
    del hold


def test_depths_are_parsed_as_build_parses_them_before_the_engines_load(tmp_path, capsys):
    """r74 (h74e made bench_engines' --depths go through parse_depths; this tool's did not):
    `--depths 1,,2` was a ValueError traceback once the engines had loaded, `--depths 2,2` ran
    fixed:2 twice; now said as `specrt build --depths` says it (the same parse_depths), before
    the engines load (here a folder that does not exist), argparse's exit 2."""
    bench_runtime = tool("bench_runtime")
    for depths, error in (("1,,2", "--depths '1,,2': item 2 of 3 is empty; expected comma-separated integers"),
                          ("2,2", "--depths '2,2': depth 2 is named twice (items 1 and 2)")):
        with pytest.raises(SystemExit) as e:
            bench_runtime.main([str(tmp_path / "nowhere"), "--depths", depths])
        assert e.value.code == 2 and error in capsys.readouterr().err, depths


def test_empty_depths_are_refused_not_read_as_every_built_depth(tmp_path, capsys):
    """Mutant m74d-48 (the check skipped for a falsy --depths): `--depths ''` (an unset shell
    variable) ran every depth the engines hold, as no --depths does, without a word; it is
    refused as build refuses it, before the engines load."""
    bench_runtime = tool("bench_runtime")
    with pytest.raises(SystemExit) as e:
        bench_runtime.main([str(tmp_path / "nowhere"), "--depths", ""])
    assert e.value.code == 2 and "--depths: at least one verify depth is needed" in capsys.readouterr().err


def test_the_depths_parsed_are_the_depths_run(tiny_engines, tmp_path, capsys):  # noqa: F811
    """Mutant m74d-47 (--depths checked by parse_depths, the string then kept): `--depths 1-2`
    passed the check and then asked for the governors fixed:1, "fixed:-" and fixed:2: "fixed:-"
    refused in the worker once the engines had loaded, the run "failed" with every configuration
    (one worker runs them); a range runs the depths it names, each once, beside off."""
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n')
    rc = tool("bench_runtime").main([str(tiny_engines), "--prompts", str(tmp_path / "p.jsonl"), "--n", "1",
                                     "--max-new-tokens", "2", "--depths", "1-2", "--threads", "1"])
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("specrt:")]
    assert rc == 0 and rows == ["specrt:off", "specrt:fixed:1", "specrt:fixed:2"], rows


def test_an_engines_folder_that_is_not_one_is_an_error_line_not_a_traceback(tmp_path):
    """m74d's finding: `tools/bench_runtime.py /tmp/nowhere` printed load_engines' UserError as a
    traceback; now one "error:" line and exit 1, as tools/bench_governors.py says it."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "tools" / "bench_runtime.py"), str(tmp_path / "nowhere")],
                       capture_output=True, text=True, cwd=root, env={**os.environ, "SPECRT_THP": "0"}, timeout=300)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert str(tmp_path / "nowhere") in r.stderr, r.stderr
