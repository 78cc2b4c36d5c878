"""Shared fixtures of the CLI tests that run specrt as a user's processes do."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The tiny reference pair exported and built (depths 1, 2, context 64), and a prompts file of
    token ids (one module's own)."""
    from specrt.engines.build import build_engines
    from specrt.export.export import export

    root = tmp_path_factory.mktemp("pair")
    export(REFERENCE / "verifier", REFERENCE / "draft", root / "export", log=_quiet)
    build_engines(root / "export", "onnxruntime", (1, 2), root / "engines", profile_repeats=1, profile_pasts=(16,),
                  max_context=64, log=_quiet)
    rng = random.Random(0)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(3, 1000) for _ in range(8)]}) + "\n"
                               for _ in range(4)))
    return root / "export", root / "engines", prompts
