"""tools/bench_runtime.py's child peak RSS (also tools/bench_export.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.real_model import tool


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
    for depths, error in (("1,,2", "--depths '1,,2': an empty entry; expected comma-separated integers"),
                          ("2,2", "--depths '2,2': depth 2 is named twice (entries 1 and 2)")):
        with pytest.raises(SystemExit) as e:
            bench_runtime.main([str(tmp_path / "nowhere"), "--depths", depths])
        assert e.value.code == 2 and error in capsys.readouterr().err, depths
