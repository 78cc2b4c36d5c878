"""Spike: an exact greedy argmax from an int8 lm_head plus a rigorous error bound.

    .venv/bin/python tools/spike_screened_head.py [--model ~/.cache/specrt/smollm2-135m-instruct]
        [--prompts 4] [--tokens 48] [--repeats 30]

Greedy decoding needs each row's argmax, not its logits. With the head W [V, H] quantized
per token to W' (7-bit symmetric: ONNX Runtime's u8s8 kernel on AVX2 without VNNI adds
pairs of u8 x s8 products in int16 with saturation, 2 * 255 * 63 < 32768) and h to
uint8 h' (DynamicQuantizeLinear, one scale a call), approximate logits a = W' h' miss
the exact ones by at most b_j = ||w_j - w'_j|| ||h|| + ||w'_j|| ||h - h'|| (Cauchy-Schwarz):
every token with a_j + b_j >= max_i (a_i - b_i) is a candidate, the exact argmax is among
them, and rescoring the candidates from the fp32 rows finds it. This measures, on
SmolLM2-135M's tied head (49152 x 576) and the final hidden states of its own greedy
answers (transformers, after the final norm):
(1) the head's time per call at M rows (verify depth M - 1): fp32 MatMul, MatMulNBits
    (8-bit, fp32 or int8 compute) and DynamicQuantizeLinear + MatMulInteger;
(2) candidates per row: weight-only (h exact), and with h quantized per row, the k
    channels of largest |h| kept in fp32 beside the int8 product (k = 0, 4, 16, 48),
    ||h - h'|| exact (replicating the quantization) or its worst case sqrt(H) * scale.
Session 27 built k = 48 into `specrt build --target-head screened` (specrt/head.py, with
h quantized symmetrically per row rather than DynamicQuantizeLinear's asymmetric grid);
results/README.md "A screened head".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def head_graph(wt: np.ndarray, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    h, v = wt.shape
    g = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["logits"])], "head",
                          [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["M", h])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["M", v])],
                          [numpy_helper.from_array(wt, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data")


def quantize(src: Path, dst: Path, bits: int, block: int, accuracy: int) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=accuracy, bits=bits)
    q = MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=cfg)
    q.process()
    onnx.save(q.model.model, str(dst), save_as_external_data=True, location=dst.name + ".data")


QMAX = 63


def quantize_rows(w: np.ndarray) -> np.ndarray:
    """W [V, H] -> the dequantized 7-bit per-token W' (float32)."""
    s = np.abs(w).max(1) / QMAX
    s[s == 0] = 1.0
    return (np.clip(np.rint(w / s[:, None]), -QMAX, QMAX) * s[:, None]).astype(np.float32)


def integer_graph(w: np.ndarray, path: Path) -> None:
    """h -> DynamicQuantizeLinear -> MatMulInteger with the 7-bit head -> x scales."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    V, H = w.shape
    s = (np.abs(w).max(1) / QMAX).astype(np.float32)
    q = np.clip(np.rint(w / s[:, None]), -QMAX, QMAX).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["h"], ["hq", "hs", "hz"]),
             helper.make_node("MatMulInteger", ["hq", "Q", "hz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["hs", "S"], ["sc"]),
             helper.make_node("Mul", ["accf", "sc"], ["logits"])]
    g = helper.make_graph(nodes, "head_int", [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["M", H])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["M", V])],
                          [numpy_helper.from_array(np.ascontiguousarray(q.T), "Q"), numpy_helper.from_array(s, "S")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def session(path: Path):
    import onnxruntime as ort

    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), o, providers=["CPUExecutionProvider"])


def timed(sess, x: np.ndarray, repeats: int) -> float:
    for _ in range(3):
        sess.run(None, {"h": x})
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, {"h": x})
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def hidden_states(model_dir: Path, n_prompts: int, tokens: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    m = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    held = [json.loads(x) for x in (ROOT / "tools" / "data" / "heldout_prompts.jsonl").read_text().splitlines() if x]
    out = []
    with torch.no_grad():
        for d in held[:: max(1, len(held) // n_prompts)][:n_prompts]:
            ids = tok.apply_chat_template([{"role": "user", "content": d["prompt"]}], add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True)["input_ids"]
            seq = m.generate(ids, max_new_tokens=tokens, do_sample=False)
            hs = m(seq, output_hidden_states=True).hidden_states[-1][0]  # after the final norm
            out.append(hs[ids.shape[1] - 1 :].numpy())
    return np.concatenate(out).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort
    from safetensors.numpy import load_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=Path.home() / ".cache" / "specrt" / "smollm2-135m-instruct")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    st = load_file(str(a.model / "model.safetensors"))
    w = st.get("lm_head.weight", st["model.embed_tokens.weight"]).astype(np.float32)  # [V, H]
    V, H = w.shape
    print(f"onnxruntime {ort.__version__}, head {V} x {H}, 2 threads")
    with tempfile.TemporaryDirectory() as tmp:
        fp = Path(tmp) / "fp32.onnx"
        head_graph(np.ascontiguousarray(w.T), fp)
        variants = {"fp32 MatMul": fp}
        for acc in (0, 4):
            p = Path(tmp) / f"nbits8_acc{acc}.onnx"
            quantize(fp, p, 8, 32, acc)
            variants[f"MatMulNBits 8-bit b32 {'fp32' if acc == 0 else 'int8'} compute"] = p
        p = Path(tmp) / "integer.onnx"
        integer_graph(w, p)
        variants["DynamicQuantizeLinear + MatMulInteger"] = p
        rng = np.random.default_rng(0)
        print(f"(1) head ms per call at M rows (median of {a.repeats}):")
        for k, p in variants.items():
            sess = session(p)
            row = [timed(sess, rng.standard_normal((m, H)).astype(np.float32), a.repeats) * 1e3 for m in (1, 2, 5, 9)]
            print(f"  {k:40s} " + "  ".join(f"M={m} {t:.2f}" for m, t in zip((1, 2, 5, 9), row)), flush=True)
    hs = hidden_states(a.model, a.prompts, a.tokens).astype(np.float64)
    print(f"(2) {len(hs)} hidden states; ||h|| median {np.median(np.linalg.norm(hs, axis=1)):.1f}, "
          f"max |h_i| median {np.median(np.abs(hs).max(1)):.1f}")
    deq = quantize_rows(w)
    err = w - deq

    def count(approx, b):
        n = (approx + b >= (approx - b).max(1, keepdims=True)).sum(1)
        return f"median {int(np.median(n))}, p90 {int(np.percentile(n, 90))}, max {n.max()}"

    exact = hs @ w.T.astype(np.float64)
    b = np.linalg.norm(err.astype(np.float64), axis=1)[None] * np.linalg.norm(hs, axis=1)[:, None]
    approx = hs @ deq.T.astype(np.float64)
    print(f"  weight-only (h exact): candidates per row {count(approx, b)}")
    order = np.argsort(-np.abs(hs).max(0))
    for k_out in (0, 4, 16, 48):
        out, rest = order[:k_out], np.sort(order[k_out:])
        hr = hs[:, rest]
        lo, hi = np.minimum(hr.min(1), 0), np.maximum(hr.max(1), 0)
        sc = (hi - lo) / 255
        z = np.clip(np.rint(-lo / sc), 0, 255)[:, None]
        hq = sc[:, None] * (np.clip(np.rint(hr / sc[:, None]) + z, 0, 255) - z)
        approx = hq @ deq[:, rest].T.astype(np.float64) + hs[:, out] @ w[:, out].T.astype(np.float64)
        assert (approx.argmax(1) == exact.argmax(1)).mean() > 0.5
        nrm = np.linalg.norm(deq[:, rest].astype(np.float64), axis=1)[None]
        res = np.linalg.norm(err[:, rest].astype(np.float64), axis=1)[None] * np.linalg.norm(hr, axis=1)[:, None]
        b_exact = res + nrm * np.linalg.norm(hr - hq, axis=1)[:, None]
        b_worst = res + nrm * (np.sqrt(len(rest)) * sc)[:, None]
        print(f"  h uint8 per row, {k_out:2d} channels fp32: candidates with ||h - h'|| exact {count(approx, b_exact)}; "
              f"worst case {count(approx, b_worst)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
