"""Can the in-place target verify a token tree? A probe of ONNX Runtime's GroupQueryAttention.

    .venv/bin/python tools/probe_tree_attention.py

A tree round would verify the last accepted token x, the draft's chain a1.. and, beside
a1, the draft's runner-up b1 at the same position, in one call: b1 must attend to x and
the past but not to a1, and be rotated at a1's position. This builds one GQA node as the
in-place graphs use it (packed q/k/v, a shared [1, KVH, C, D] buffer bound as input and
output, RoPE in the op) and checks, against chains run separately, that with the op's
``position_ids`` and ``attention_bias`` inputs the rows of x, a1 and b1 equal the
chains' rows, and that b1's K/V row (written at the buffer slot after a1's) equals the
chain x -> b1's row at a1's slot, so that accepting b1 would cost one row copy per layer.

Measured 2026-12-01 with ONNX Runtime 1.32 (CPU): all four checks hold; the bias must be
[1, 1, S, past + S] (the buffer's length is refused). The in-place target graph now
builds that bias from the positions (export/onnx_ops.py ``inplace_context``) and the
build's probe (engines/onnxruntime.py ``probe_inplace_gqa``) checks a tree like this one.
"""

from __future__ import annotations

import sys

import numpy as np


def main() -> int:
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper

    NH, KVH, D, C, past = 4, 2, 16, 64, 10
    W = (NH + 2 * KVH) * D

    def session(tree: bool):
        vi = helper.make_tensor_value_info
        ins = [vi("qkv", TP.FLOAT, [1, "S", W]), vi("ck", TP.FLOAT, [1, KVH, C, D]), vi("cv", TP.FLOAT, [1, KVH, C, D]),
               vi("seqlens_k", TP.INT32, [1]), vi("total", TP.INT32, []), vi("cos", TP.FLOAT, [C, D // 2]),
               vi("sin", TP.FLOAT, [C, D // 2])]
        names = ["qkv", "", "", "ck", "cv", "seqlens_k", "total", "cos", "sin"]
        if tree:
            ins += [vi("pos", TP.INT64, [1, "S"]), vi("bias", TP.FLOAT, [1, 1, "S", "T"])]
            names += ["pos", "bias"]
        node = helper.make_node("GroupQueryAttention", names, ["o", "pk", "pv"], domain="com.microsoft",
                                num_heads=NH, kv_num_heads=KVH, do_rotary=1, rotary_interleaved=0)
        outs = [vi("o", TP.FLOAT, [1, "S", NH * D]), vi("pk", TP.FLOAT, [1, KVH, C, D]), vi("pv", TP.FLOAT, [1, KVH, C, D])]
        m = helper.make_model(helper.make_graph([node], "g", ins, outs),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.log_severity_level = 4  # the refused bias below is an expected failure, not a log line
        return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])

    rng = np.random.default_rng(0)
    ang = np.outer(np.arange(C), 1.0 / (10000 ** (np.arange(0, D, 2) / D)))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    cache_k, cache_v = (rng.standard_normal((1, KVH, C, D), dtype=np.float32) for _ in range(2))
    x, a, b = (rng.standard_normal((1, 1, W), dtype=np.float32) for _ in range(3))

    def run(sess, rows, extra=None):
        ck, cv = cache_k.copy(), cache_v.copy()
        qkv = np.concatenate(rows, 1)
        S = qkv.shape[1]
        feeds = {"qkv": qkv, "ck": ck, "cv": cv, "seqlens_k": np.array([past + S - 1], np.int32),
                 "total": np.array(past + S, np.int32), "cos": cos, "sin": sin, **(extra or {})}
        bind = sess.io_binding()
        for k, v in feeds.items():
            bind.bind_cpu_input(k, v)
        bind.bind_output("o", "cpu")
        for name, buf in (("pk", ck), ("pv", cv)):
            bind.bind_output(name, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
        sess.run_with_iobinding(bind)
        return bind.get_outputs()[0].numpy()[0], ck, cv

    chain = session(False)
    o_xa, _, _ = run(chain, [x, a])
    o_xb, kb, vb = run(chain, [x, b])
    bias = np.zeros((1, 1, 3, past + 3), np.float32)
    bias[0, 0, 2, past + 1] = -np.inf  # b1 does not see a1
    o, k, v = run(session(True), [x, a, b], {"pos": np.array([[past, past + 1, past + 1]]), "bias": bias})
    checks = {"row x equals the chain's": np.allclose(o[0], o_xa[0], atol=1e-5),
              "row a1 equals chain x -> a1": np.allclose(o[1], o_xa[1], atol=1e-5),
              "row b1 equals chain x -> b1": np.allclose(o[2], o_xb[1], atol=1e-5),
              "b1's K/V row moved to a1's slot equals the chain's": bool(
                  np.allclose(k[:, :, past + 2], kb[:, :, past + 1], atol=1e-6)
                  and np.allclose(v[:, :, past + 2], vb[:, :, past + 1], atol=1e-6))}
    try:
        run(session(True), [x, a, b], {"pos": np.array([[past, past + 1, past + 1]]),
                                       "bias": np.zeros((1, 1, 3, C), np.float32)})
        checks["a bias over the whole buffer is accepted"] = True
    except Exception:  # onnxruntime raises its own Fail class
        checks["a bias over the whole buffer is accepted"] = False
    print(f"onnxruntime {ort.__version__}, GroupQueryAttention on CPU, shared KV buffer:")
    for what, ok in checks.items():
        print(f"  {'yes' if ok else 'NO '}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
