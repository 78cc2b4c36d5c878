"""tools/bench_gemm_rows.py: the target's weight shapes, the roofline arithmetic and a short real run."""

from __future__ import annotations

import json

from tests.real_model import tool


def _tool():
    return tool("bench_gemm_rows")


def test_shapes_of_a_gqa_decoder():
    t = _tool()
    assert t.shapes(t.SMOLLM2) == {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072),
                                   "down": (1536, 576), "lm_head": (576, 49152)}


def test_runs_on_an_export_and_rejects_a_missing_one(tmp_path, capsys):
    t = _tool()
    dec = {"hidden_size": 32, "intermediate_size": 64, "vocab_size": 100, "num_heads": 4, "num_kv_heads": 2,
           "head_dim": 8, "num_layers": 2}
    (tmp_path / "export.json").write_text(json.dumps({"target": {"decoder": dec}}))
    assert t.main(["--export", str(tmp_path), "--max-rows", "3", "--repeats", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "lm_head  [32 x 100]" in out and "2:" in out and "3:" in out and "4:" not in out.split("lm_head")[1]
    assert "fp32 MatMul rate at M = 96" in out and "depth 8: matmul roofline" in out
    assert t.main(["--export", str(tmp_path / "missing")]) == 1
    assert "missing/export.json" in capsys.readouterr().err
    (tmp_path / "engines.json").write_text(json.dumps({"costs": {"verify": {"2": 0.01}}}))
    assert t.main(["--export", str(tmp_path), "--engines", str(tmp_path)]) == 1
    assert "engines.json: cannot read the cost table's depth-1 latency" in capsys.readouterr().err


def test_flops_and_roofline_of_smollm2():
    t = _tool()
    # 30 layers of q/k/v, o, gate/up and down, plus the head: 135M multiply-adds per token.
    assert t.flops_per_row(t.SMOLLM2) == 2 * (30 * (576 * 960 + 576 * 576 + 576 * 3072 + 1536 * 576) + 576 * 49152)
    row = t.flops_per_row(t.SMOLLM2)
    weights = row * 2  # fp32 bytes
    # Streaming the weights takes 10 ms; 3 rows of compute take 10 ms: depths 1-2 are streaming-bound,
    # depth 8 (9 rows) compute-bound at 30 ms = 3x depth 1.
    lines = t.roofline_lines(t.SMOLLM2, peak_flops=3 * row / 0.010, bandwidth=weights / 0.010,
                             costs={"1": 0.012, "2": 0.0125, "8": 0.036}, depths=[1, 2, 8])
    assert "depth 1: matmul roofline 10.0 ms = 1.00x depth 1's (weight streaming); measured verify 12.0 ms" in lines[1]
    assert "depth 2: matmul roofline 10.0 ms = 1.00x" in lines[2] and "+2.5 ms over its roofline" in lines[2]
    assert "depth 8: matmul roofline 30.0 ms = 3.00x depth 1's (compute); measured verify 36.0 ms = 3.00x" in lines[3]
