"""tools/check_min_versions.sh where python3 is Python 3.10, pyproject.toml's floor (Ubuntu 22.04's
python3): the check itself (two venvs, about 5 minutes) is run by hand."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.real_model import ROOT


def python310() -> str | None:
    for c in [shutil.which("python3.10"), *sorted(map(str, Path.home().glob(".pyenv/versions/3.10.*/bin/python3.10")))]:
        if c and subprocess.run([c, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"],
                                capture_output=True).returncode == 0:
            return c
    return None


def test_a_python3_without_tomllib_and_no_newer_python_is_one_error_line(tmp_path):
    """Before: `No module named 'tomllib'` with its traceback, from the first line reading
    pyproject.toml; now said, exit 1, before any venv."""
    py = python310()
    if py is None:
        pytest.skip("no Python 3.10 here")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").symlink_to(py)
    (bin_ / "dirname").symlink_to(shutil.which("dirname"))
    r = subprocess.run(["/bin/bash", str(ROOT / "tools" / "check_min_versions.sh")], cwd=tmp_path, timeout=60,
                       env={"PATH": str(bin_), "HOME": str(tmp_path), "SPECRT_MIN_VENV": str(tmp_path / "v")},
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.fullmatch(r"error: reading pyproject.toml needs Python 3.11 or later \(tomllib\); python3 here is "
                        r"Python 3\.10\.\d+: put python3.11 or later on PATH\n", r.stderr), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]
