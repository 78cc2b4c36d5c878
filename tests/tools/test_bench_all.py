"""tools/bench_all.sh's arguments (the benchmarks themselves take the better part of an hour on an
idle machine and are run by hand). Run with no PATH, so that a script that went on to its work
would fail at once instead of installing and benchmarking."""

from __future__ import annotations

import subprocess

from tests.real_model import ROOT

USAGE = "usage: bash tools/bench_all.sh [OUT]  (default out/bench-all, in the checkout; reports under results/)"


def bench_all(*args, cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(ROOT / "tools" / "bench_all.sh"), *args], cwd=cwd,
                          env={"PATH": "/nonexistent", **env}, capture_output=True, text=True, timeout=60)


def test_help_an_option_or_a_second_folder_get_the_usage_line_not_the_benchmarks(tmp_path):
    """Before: `--help` was taken as OUT (every benchmark run into a folder named --help, the
    results/ reports replaced), a second argument ignored."""
    for flag in ("-h", "--help"):
        r = bench_all(flag, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (0, USAGE + "\n"), r.stderr
    for args, error in ((["--quick"], "error: --quick is no option of it"),
                        (["out/a", "out/b"], "error: one OUT folder: got 2 arguments")):
        r = bench_all(*args, cwd=tmp_path)
        assert (r.returncode, r.stderr.splitlines()) == (2, [error, USAGE])
    assert list(tmp_path.iterdir()) == []


def test_a_bench_engines_value_it_does_not_know_is_refused_before_the_work(tmp_path):
    """SPECRT_BENCH_ENGINES skipped the engine step for "0" only: "off" or "false" ran its five
    minutes without a word (an environment walk's 14). Those are taken now, and a value neither
    on nor off is refused before anything runs (the work itself needs PATH: none here)."""
    for value in ("maybe", "2", "of f0"):
        r = bench_all(cwd=tmp_path, SPECRT_BENCH_ENGINES=value)
        assert (r.returncode, r.stderr) == (2, f"error: SPECRT_BENCH_ENGINES={value}: expected 0 (or false, no, off) "
                                               "to skip the engine step, or 1\n")
    for value in ("OFF", " false", "0", "1", "yes"):  # (taken: it goes on to its work, which fails without PATH)
        r = bench_all(cwd=tmp_path, SPECRT_BENCH_ENGINES=value)
        assert "SPECRT_BENCH_ENGINES" not in r.stderr and r.returncode not in (0, 2), (value, r.stderr)
    assert list(tmp_path.iterdir()) == []


# what bash 3.2 (macOS's /bin/bash) lacks, as used: case modification (${v,,}, ${v^^}), associative
# arrays, mapfile / readarray, coproc, the case fall-throughs ;& and ;;&, |& and &>>
BASH_4 = r"\$\{[#!]?\w+(\[[^]]*\])?(\^|,)|\b(declare|local|typeset) -\w*A|\b(mapfile|readarray|coproc)\b|;;?&|\|&|&>>"


def test_the_script_uses_nothing_bash_3_2_lacks(tmp_path):
    """The review's 5 (session 71; h74c): `${bench_engines,,}` needs bash 4, so macOS's bash 3.2
    stopped at the script's start ("bad substitution"). No bash here is older than 4.0, so the
    script is read for what 3.2 lacks (its comments left out), then its syntax checked; the
    spellings it lowercased are taken in any case still (the test above runs them)."""
    import re

    code = [(n, line) for n, line in enumerate((ROOT / "tools" / "bench_all.sh").read_text().splitlines(), 1)
            if not line.lstrip().startswith("#")]
    assert [(n, line) for n, line in code if re.search(BASH_4, line)] == []
    assert subprocess.run(["/bin/bash", "-n", str(ROOT / "tools" / "bench_all.sh")]).returncode == 0
    for value in ("Off", "FALSE", "nO", "YES"):
        r = bench_all(cwd=tmp_path, SPECRT_BENCH_ENGINES=value)
        assert "SPECRT_BENCH_ENGINES" not in r.stderr and r.returncode not in (0, 2), (value, r.stderr)
