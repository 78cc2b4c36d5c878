"""Spike: does ONNX Runtime multiply a verify's few rows faster with the weights as the left operand?

    python tools/spike_transposed_gemm.py [--layers 30] [--threads 2] [--repeats 7]

A verify of M rows computes x [M, K] @ W [K, N] per matmul; on AVX2 MLAS takes a second row
block from M = 7 (results/README.md, the toolchain's own efficiency). Written the other way
round, y^T = W^T [N, K] @ x^T [K, M], the weights become the operand MLAS streams row by
row and the M activations a packed panel of 8 or 16 columns, so one pass over the weights
might serve every verify depth. This builds both forms as ONNX graphs of SmolLM2-135M's
layer matmuls (``--layers`` x [576 x 1536] and [1536 x 576], 53M weights, 212 MB: past any cache),
runs them interleaved in ONNX Runtime (CPU, intra-op threads, spinning) at M = 1..16 and
prints the median time of each and their largest difference. Not part of specrt.

Measured 2026-12-01 21:59 (AMD EPYC, AVX2 only, 2 threads, the host noisy): the transposed
form was never faster: M = 1 28.6 vs 32.1 ms, M = 2 26.3 vs 48.7, M = 6 39.0 vs 47.6, M = 8
47.3 vs 47.5, M = 9 59.7 vs 65.9, M = 16 67.2 vs 71.3 (normal vs transposed; with a batch
dimension [1, M, K] the transposed form was 1.3-2.2x slower still); again at 23:27
(results/gemm_transposed.txt): M = 2 23.1 vs 35.9 ms, M = 6 30.6 vs 36.9, M = 9 33.0 vs
59.8. Not pursued.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(weights, transposed: bool, folder: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, x = [], [], "x"
    if transposed:
        nodes.append(helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]))
        x = "xt"
    for i, w in enumerate(weights):
        a = np.ascontiguousarray(w.T) if transposed else w
        inits.append(numpy_helper.from_array(a, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"w{i}", x] if transposed else [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    nodes.append(helper.make_node("Transpose", [x], ["out"], perm=[1, 0]) if transposed
                 else helper.make_node("Identity", [x], ["out"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", 576])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    path = folder / f"m{int(transposed)}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
              save_as_external_data=True, location=path.name + ".data")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    import numpy as np
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    weights = []
    for _ in range(args.layers):
        weights.append(rng.standard_normal((576, 1536), dtype=np.float32) * 0.03)
        weights.append(rng.standard_normal((1536, 576), dtype=np.float32) * 0.03)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    with tempfile.TemporaryDirectory() as tmp:
        sessions = [ort.InferenceSession(str(build(weights, t, Path(tmp))), so, providers=["CPUExecutionProvider"])
                    for t in (False, True)]
        print(f"{2 * args.layers} matmuls, {sum(w.size for w in weights) / 1e6:.0f}M weights, {args.threads} threads")
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16):
            x = rng.standard_normal((m, 576), dtype=np.float32)
            outs = [s.run(None, {"x": x})[0] for s in sessions]
            times: list[list[float]] = [[], []]
            for _ in range(args.repeats):
                for j, s in enumerate(sessions):
                    t = time.perf_counter()
                    s.run(None, {"x": x})
                    times[j].append(time.perf_counter() - t)
            print(f"M = {m:2d}: normal {1e3 * statistics.median(times[0]):6.2f} ms, transposed "
                  f"{1e3 * statistics.median(times[1]):6.2f} ms, max difference {np.abs(outs[0] - outs[1]).max():.1e}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
