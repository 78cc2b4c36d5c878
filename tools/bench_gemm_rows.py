"""Why verify latency jumps between depths on a CPU: ONNX Runtime's MatMul time per row count.

    .venv/bin/python tools/bench_gemm_rows.py [--export out/bench-all/export] [--max-rows 12]
                                              [--threads 2] [--repeats 30]

A verify at depth d multiplies S = d + 1 rows by every weight matrix of the target. On a
CPU, MLAS computes a block of rows per pass over the weights; past the block's height a
second pass begins and the cost steps up. This times one ``MatMul`` with a constant weight
(prepacked by ONNX Runtime, as in the engines) at M = 1..max_rows rows for the target's
weight shapes (from the export's export.json, target.decoder: q/k/v, o, gate/up, down, lm_head; or
SmolLM2-135M's when no export is given), each row count in turn per repeat, and prints the
median per M relative to M = 1 with the CPU's vector extensions.

Measured here (2-core AMD EPYC, AVX2 without AVX-512, ONNX Runtime 1.32, 2 threads): the
lm_head [576 x 49152] costs 1.16x at M = 6 and 1.43x at M = 7 (the layers' smaller GEMMs,
whose weights stay in cache, step up at M = 5 and again at M = 7: 1.3-1.5x at M = 6,
1.6-2.2x at M = 7), so verify depths 6-8 pay for a second row block
(results/gemm_rows.txt). Earlier sessions' VM ran on an AVX-512 host, where the same
engines measured depth 8 at 1.25x depth 1 (1.48-1.55x here).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lib import machine_info  # noqa: E402

SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "vocab_size": 49152, "num_heads": 9,
           "num_kv_heads": 3, "head_dim": 64}


def shapes(target: dict) -> dict[str, tuple[int, int]]:
    """Weight shapes [K, N] of one decoder layer and the head."""
    h, i, v = int(target["hidden_size"]), int(target["intermediate_size"]), int(target["vocab_size"])
    hd = int(target.get("head_dim") or h // int(target["num_heads"]))
    qkv = (int(target["num_heads"]) + 2 * int(target["num_kv_heads"])) * hd
    return {"qkv": (h, qkv), "o": (int(target["num_heads"]) * hd, h), "gate_up": (h, 2 * i), "down": (i, h),
            "lm_head": (h, v)}


def session(k: int, n: int, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = (np.random.default_rng(0).standard_normal((k, n), dtype=np.float32) * 0.02)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", type=Path, help="an export folder (export.json gives the target's shapes)")
    ap.add_argument("--max-rows", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    target = SMOLLM2
    if a.export is not None:
        try:
            target = json.loads((a.export / "export.json").read_text())["target"]["decoder"]
        except (OSError, KeyError, ValueError) as e:
            print(f"error: {a.export / 'export.json'}: cannot read the target's shapes ({e})", file=sys.stderr)
            return 1
    info = machine_info(a.threads)
    print(f"machine: {info['cpu_model']}, isa {info['isa']}, {a.threads} threads, onnxruntime "
          f"{info['versions']['onnxruntime']}")
    rows = range(1, a.max_rows + 1)
    print(f"MatMul median ms per row count M (verify depth d has M = d + 1), relative to M = 1; {a.repeats} repeats")
    for name, (k, n) in shapes(target).items():
        s = session(k, n, a.threads)
        xs = {m: np.random.default_rng(m).standard_normal((m, k), dtype=np.float32) for m in rows}
        for m in rows:  # warm-up
            s.run(None, {"x": xs[m]})
        ts: dict[int, list[float]] = {m: [] for m in rows}
        for _ in range(a.repeats):
            for m in rows:
                t0 = time.perf_counter()
                s.run(None, {"x": xs[m]})
                ts[m].append(time.perf_counter() - t0)
        med = {m: float(np.median(v)) * 1e3 for m, v in ts.items()}
        print(f"{name:8s} [{k} x {n}]  M=1 {med[1]:.3f} ms  "
              + "  ".join(f"{m}:{med[m] / med[1]:.2f}" for m in rows if m > 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
