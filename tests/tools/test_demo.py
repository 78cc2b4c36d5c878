"""tools/demo.sh's arguments (the demo itself, minutes on the real model, is the README's main
job, run by hand). Run with no PATH, so that a script that went on to its work would fail at
once instead of installing and converting."""

from __future__ import annotations

import subprocess

from tests.real_model import ROOT


def demo(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(ROOT / "tools" / "demo.sh"), *args], cwd=cwd, env={"PATH": "/nonexistent"},
                          capture_output=True, text=True, timeout=60)


def test_help_and_an_unquoted_prompt_get_the_usage_line_not_the_demo(tmp_path):
    """Before: `--help` was taken as the prompt and an unquoted prompt cut to its first word; the
    whole demo ran either way."""
    for flag in ("-h", "--help"):
        r = demo(flag, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("usage: bash tools/demo.sh [PROMPT]"), r.stderr
    r = demo("Give", "me", "three", "tips", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == ["error: one prompt, in quotes: got 4 arguments",
                                     "usage: bash tools/demo.sh [PROMPT]  (SPECRT_DEMO_OUT=DIR for its files: default "
                                     "out/demo, in the checkout)"]
    assert list(tmp_path.iterdir()) == []
