"""Attention's share of a verify: ONNX Runtime's GroupQueryAttention per layer, by new rows S and past.

    .venv/bin/python tools/bench_gqa.py [--pasts 128,512,1024] [--rows 1,2,3,5,9]
                                        [--cache-len 2048] [--threads 2] [--repeats 200] [--rows-agree]

The in-place engines run one ``com.microsoft.GroupQueryAttention`` per layer over KV
buffers of the context limit (export/onnx_ops.py ``ort_attention``; SmolLM2-135M: 9 query
heads, 3 KV heads, head size 64). This times that node alone, with the engines' I/O
binding (the KV buffers bound as both input and output), for S new rows (a verify at
depth d has S = d + 1) after ``past`` committed ones, and prints the median microseconds
per call and per S relative to S = 1.

Measured 2026-11-30 on the 2-core AVX2 VM (training paused; two runs): per layer,
S = 1 / 2 / 9 took 22-26 / 30-48 / 54-75 us at past 128, 57-77 / 88-105 / 158-164 us at
past 512 and 100-107 / 161-165 / 295-304 us at past 1024. Two rows cost 1.4-1.8x one and
nine 2.1-3.0x: the CPU kernel's cost grows with the query rows although every row reads
the same cached K and V, and it reads them slowly (past 512, S = 1: 0.8 MB of K and V in
57 us, 14 GB/s, where the weights stream at 28-37 GB/s). Over 30 layers that is most of
the context-proportional part of a verify (depth 1 at past 512: about 3 ms of 22.5 ms;
depth 8: about 5 ms). An attention that reads each KV head's cache once for its 3 query
heads and S rows would cut it, but GroupQueryAttention is ONNX Runtime's only operator
that updates a KV buffer in place, and the other layouts pay a copy of the cache per step
(``append`` engines: results/engines.txt), so specrt keeps it.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def gqa_model(num_heads: int, kv_heads: int, head_dim: int, cache_len: int, theta: float = 100000.0) -> bytes:
    """One GroupQueryAttention node as the in-place engines use it (packed qkv, rotary inside)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    qkv = helper.make_tensor_value_info("qkv", T.FLOAT, [1, "S", (num_heads + 2 * kv_heads) * head_dim])
    cache = [helper.make_tensor_value_info(n, T.FLOAT, [1, kv_heads, cache_len, head_dim]) for n in ("ck", "cv")]
    seqlens = helper.make_tensor_value_info("seqlens_k", T.INT32, [1])
    total = helper.make_tensor_value_info("total", T.INT32, [])
    freqs = np.arange(cache_len)[:, None] * (1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim))[None]
    tables = [numpy_helper.from_array(f(freqs).astype(np.float32), n) for f, n in ((np.cos, "cos"), (np.sin, "sin"))]
    node = helper.make_node("GroupQueryAttention", ["qkv", "", "", "ck", "cv", "seqlens_k", "total", "cos", "sin"],
                            ["o", "ok", "ov"], domain="com.microsoft", num_heads=num_heads, kv_num_heads=kv_heads,
                            scale=head_dim ** -0.5, do_rotary=1, rotary_interleaved=0)
    outs = [helper.make_tensor_value_info("o", T.FLOAT, [1, "S", num_heads * head_dim]),
            *(helper.make_tensor_value_info(n, T.FLOAT, [1, kv_heads, cache_len, head_dim]) for n in ("ok", "ov"))]
    g = helper.make_graph([node], "gqa", [qkv, *cache, seqlens, total], outs, tables)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def measure(pasts, rows, cache_len: int, threads: int, repeats: int, heads=(9, 3, 64)) -> dict:
    """{past: {S: median seconds}}; S rows after ``past`` need past + S <= cache_len."""
    import onnxruntime as ort

    nh, kvh, d = heads
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(gqa_model(nh, kvh, d, cache_len), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ck, cv = (ort.OrtValue.ortvalue_from_numpy(rng.random((1, kvh, cache_len, d), dtype=np.float32) * 0.1)
              for _ in range(2))
    out: dict[int, dict[int, float]] = {}
    for past in pasts:
        out[past] = {}
        for S in rows:
            if past + S > cache_len:
                raise ValueError(f"past {past} + {S} rows exceed --cache-len {cache_len}")
            io = s.io_binding()
            io.bind_cpu_input("qkv", rng.random((1, S, (nh + 2 * kvh) * d), dtype=np.float32))
            io.bind_ortvalue_input("ck", ck)
            io.bind_ortvalue_input("cv", cv)
            io.bind_cpu_input("seqlens_k", np.array([past + S - 1], np.int32))
            io.bind_cpu_input("total", np.array(past + S, np.int32))
            io.bind_output("o")
            io.bind_ortvalue_output("ok", ck)  # in place, as the engines bind them
            io.bind_ortvalue_output("ov", cv)
            for _ in range(5):
                s.run_with_iobinding(io)
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                s.run_with_iobinding(io)
                ts.append(time.perf_counter() - t0)
            out[past][S] = float(np.median(ts))
    return out


def rows_agree(pasts, rows, cache_len: int, threads: int, heads=(9, 3, 64)) -> dict:
    """``--rows-agree``: {past: {S: (max |row 0 of an S-row call - the one-row call's|, the
    same against the two-row call's, whether the K/V row written equals the one-row call's)}}
    on random q/k/v and caches (one set a past, the same for every S).
    Measured 2026-12-02 (AVX2 host, pasts 5 / 128 / 511): calls of 2, 3, 5, 9 rows give row 0
    bit for bit alike (0.0 against the two-row call), their K/V rows equal; against the
    one-row call 3.6e-7 / 4.5e-8 / 7.5e-8 (results/README.md, "Serving")."""
    import onnxruntime as ort

    nh, kvh, d = heads
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    s = ort.InferenceSession(gqa_model(nh, kvh, d, cache_len), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    out: dict[int, dict[int, tuple[float, float, bool]]] = {}
    for past in pasts:
        ck0, cv0 = ((rng.standard_normal((1, kvh, cache_len, d)) * 0.5).astype(np.float32) for _ in range(2))
        qkv = rng.standard_normal((1, max(rows), (nh + 2 * kvh) * d)).astype(np.float32)
        got = {}
        for S in sorted(set(rows) | {1, 2}):
            o, ok, _ = s.run(None, {"qkv": qkv[:, :S], "ck": ck0.copy(), "cv": cv0.copy(),
                                     "seqlens_k": np.array([past + S - 1], np.int32),
                                     "total": np.array(past + S, np.int32)})
            got[S] = (o[0, 0], ok[0, :, past])
        out[past] = {S: (float(np.abs(o - got[1][0]).max()), float(np.abs(o - got[2][0]).max()),
                         bool((k == got[1][1]).all())) for S, (o, k) in got.items()}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pasts", default="128,512,1024")
    ap.add_argument("--rows", default="1,2,3,5,9")
    ap.add_argument("--cache-len", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--rows-agree", action="store_true",
                    help="Instead of timing: whether a row comes out the same in calls of different row counts.")
    a = ap.parse_args(argv)
    try:
        pasts = [int(x) for x in a.pasts.split(",")]
        rows = [int(x) for x in a.rows.split(",")]
        if 1 not in rows or min(rows) < 1 or min(pasts) < 0:
            raise ValueError("--rows must include 1 and be >= 1; --pasts >= 0")
        if a.rows_agree:
            for past, by in rows_agree(pasts, rows, a.cache_len, a.threads).items():
                print(f"past {past:5d}: " + "  ".join(f"S={S} vs 1-row {x:.2g} vs 2-row {y:.2g} kv {'=' if k else '!='}"
                                                       for S, (x, y, k) in by.items()))
            return 0
        res = measure(pasts, rows, a.cache_len, a.threads, a.repeats)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"GroupQueryAttention (9 heads, 3 KV heads, 64) per call, KV buffers of {a.cache_len} rows, "
          f"{a.threads} threads, median of {a.repeats}")
    for past, by in res.items():
        print(f"past {past:5d}: " + "  ".join(f"S={S} {t * 1e6:.0f} us ({t / by[1]:.2f}x)" for S, t in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
