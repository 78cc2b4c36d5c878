"""Why verify latency jumps between depths on a CPU: ONNX Runtime's MatMul time per row count.

    .venv/bin/python tools/bench_gemm_rows.py [--export out/bench-all/export] [--max-rows 12]
                                              [--threads 2] [--repeats 30] [--engines ENGINES]

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

It then measures the fastest fp32 MatMul rate the machine reaches (the same shapes at
``--peak-rows`` rows, where every row block is full and the weights are reused) and the
rate at which the lm_head's weights stream at M = 1, and prints each depth's roofline for
the target's matmuls: max(weight bytes / streaming rate, (d + 1) rows x flops / fastest
rate). With ``--engines`` it sets the build's measured verify latencies beside them.

Measured here (results/gemm_rows.txt; two runs on the noisy VM): 157-170 GFLOP/s at best,
weights streaming at 28-37 GB/s. Depth 8's nine rows (2.4 GFLOP, 14-15 ms at that rate) fit
under the 14-19 ms it takes to stream the 513 MiB of weights once, so the matmul roofline
puts every depth up to 8 at 1.00x depth 1, where the build's cost table measures 1.40x at
depth 8 and 1.09x at depth 4. The ratio targets are not held back by this CPU's arithmetic
or memory but by the GEMM kernel: from M = 7 its second row block costs nearly as much as
the first. A one-pass nine-row kernel does not help on AVX2 (tools/spike_onepass_gemm.py:
load-bound with 16 vector registers, as slow as MLAS); an AVX-512 host (1.25x measured) is
where depth 8 <= 1.35x lies.
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
           "num_kv_heads": 3, "head_dim": 64, "num_layers": 30}


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


def flops_per_row(target: dict) -> float:
    """Multiply-add flops of the target's matmuls for one token: every layer's and the head's."""
    per_layer = sum(k * n for name, (k, n) in shapes(target).items() if name != "lm_head")
    k, n = shapes(target)["lm_head"]
    return 2.0 * (per_layer * int(target["num_layers"]) + k * n)


def roofline_lines(target: dict, peak_flops: float, bandwidth: float, costs: dict | None,
                   depths: list[int]) -> list[str]:
    """Each depth's fp32 matmul roofline, max(weight bytes / bandwidth, rows x flops / peak rate),
    beside the build's measured verify latency when its cost table is given."""
    row = flops_per_row(target)
    weights = row / 2.0 * 4  # fp32 bytes: one weight per multiply-add of a row
    out = [f"the target's matmuls: {row / 1e9:.3f} GFLOP per token over {weights / 2**20:.0f} MiB of fp32 weights; "
           f"fastest rate {peak_flops / 1e9:.0f} GFLOP/s, weight streaming {bandwidth / 1e9:.0f} GB/s "
           "(lm_head at M = 1)"]
    roof = {d: max(weights / bandwidth, (d + 1) * row / peak_flops) for d in [1, *depths]}
    for d in depths:
        line = (f"depth {d}: matmul roofline {roof[d] * 1e3:.1f} ms = {roof[d] / roof[1]:.2f}x depth 1's "
                f"({'compute' if (d + 1) * row / peak_flops > weights / bandwidth else 'weight streaming'})")
        if costs:
            line += (f"; measured verify {costs[str(d)] * 1e3:.1f} ms = {costs[str(d)] / costs['1']:.2f}x "
                     f"(+{(costs[str(d)] - roof[d]) * 1e3:.1f} ms over its roofline)")
        out.append(line)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", type=Path, help="an export folder (export.json gives the target's shapes)")
    ap.add_argument("--max-rows", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--peak-rows", type=int, default=96, help="rows of the throughput measurement")
    ap.add_argument("--engines", type=Path, help="a build whose cost table gives depth 1's latency for the floor")
    a = ap.parse_args(argv)
    target = SMOLLM2
    if a.export is not None:
        try:
            target = json.loads((a.export / "export.json").read_text())["target"]["decoder"]
        except (OSError, KeyError, ValueError) as e:
            print(f"error: {a.export / 'export.json'}: cannot read the target's shapes ({e})", file=sys.stderr)
            return 1
    costs, depths = None, [1, 2, 4, 8]
    if a.engines is not None:
        try:
            costs = {str(d): float(v) for d, v in
                     json.loads((a.engines / "engines.json").read_text())["costs"]["verify"].items()}
            depths = sorted(int(d) for d in costs)
            if 1 not in depths:
                raise KeyError("no depth 1")
        except (OSError, KeyError, TypeError, ValueError) as e:
            print(f"error: {a.engines / 'engines.json'}: cannot read the cost table's depth-1 latency ({e})",
                  file=sys.stderr)
            return 1
    info = machine_info(a.threads)
    print(f"machine: {info['cpu_model']}, isa {info['isa']}, {a.threads} threads, onnxruntime "
          f"{info['versions']['onnxruntime']}")
    rows = range(1, a.max_rows + 1)
    print(f"MatMul median ms per row count M (verify depth d has M = d + 1), relative to M = 1; {a.repeats} repeats")
    rates: dict[str, float] = {}
    bandwidth = 0.0
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
        xp = np.random.default_rng(0).standard_normal((a.peak_rows, k), dtype=np.float32)
        s.run(None, {"x": xp})
        tp = []
        for _ in range(max(5, a.repeats // 3)):
            t0 = time.perf_counter()
            s.run(None, {"x": xp})
            tp.append(time.perf_counter() - t0)
        rates[name] = 2.0 * a.peak_rows * k * n / float(np.median(tp))
        if name == "lm_head":
            bandwidth = 4.0 * k * n / (med[1] * 1e-3)
    print(f"fp32 MatMul rate at M = {a.peak_rows} (median): "
          + "  ".join(f"{name} {r / 1e9:.0f}" for name, r in rates.items()) + " GFLOP/s")
    for line in roofline_lines(target, max(rates.values()), bandwidth, costs, depths):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
