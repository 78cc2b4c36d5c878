"""tools/bench_gemm_rows.py: the target's weight shapes and a short real run."""

from __future__ import annotations

import importlib
import json
import sys

from tests.real_model import ROOT


def _tool():
    tools = str(ROOT / "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    return importlib.import_module("bench_gemm_rows")


def test_shapes_of_a_gqa_decoder():
    t = _tool()
    assert t.shapes(t.SMOLLM2) == {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072),
                                   "down": (1536, 576), "lm_head": (576, 49152)}


def test_runs_on_an_export_and_rejects_a_missing_one(tmp_path, capsys):
    t = _tool()
    dec = {"hidden_size": 32, "intermediate_size": 64, "vocab_size": 100, "num_heads": 4, "num_kv_heads": 2,
           "head_dim": 8}
    (tmp_path / "export.json").write_text(json.dumps({"target": {"decoder": dec}}))
    assert t.main(["--export", str(tmp_path), "--max-rows", "3", "--repeats", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "lm_head  [32 x 100]" in out and "2:" in out and "3:" in out and "4:" not in out.split("lm_head")[1]
    assert t.main(["--export", str(tmp_path / "missing")]) == 1
    assert "missing/export.json" in capsys.readouterr().err
