"""Why specrt has no quantized target: weight-only int8 / int4 target engines, measured.

    python tools/exp_quantized_target.py ENGINES --bits 8 [--accuracy-level 4] -o OUT_ENGINES
    python tools/exp_quantized_target.py ENGINES --check OUT_ENGINES [--prompts FILE --n 10]

The first form writes OUT_ENGINES: a copy of ENGINES (hard links) whose target graph has
every matmul weight, the head included (untied from the embedding, which stays float), in
symmetric ``bits``-bit blocks of 32 (ONNX Runtime's ``MatMulNBits``, as onnxruntime-genai's
CPU int8 / int4 builds), engines.json's hashes rewritten so that it loads. The second
measures, on OUT_ENGINES:

* the target's row for the same token from a one-row call (decode) and a two- / five-row
  call (verify) after the same prompt: the largest logit difference, against the float
  engines' (``--check`` runs both);
* greedy outputs of ``fixed:1``, ``fixed:2`` and ``dspark`` against ``off`` on the same
  engines, ``--n`` chat prompts x 64 tokens (identical or not, the first differing token).

Measured 2026-12-02 on the AVX2 host (results/quantized_targets): with ``accuracy_level``
4 (int8 activations in the kernel: the fast path) a decode and a verify row differ by
0.38-0.53 in the logits (float engines: 3e-5): the fp32 parts of a call (attention) differ
by ~1e-6 between one and several rows, and each layer's int8 rounding of the activations
turns that into whole quantization steps, growing over 30 layers. So speculative output
cannot equal one-token decoding of such a target (1 of 10 prompts identical in the
benchmark), which is specrt's invariant. ``accuracy_level`` 0 / 1 (fp32 activations)
keeps it (5e-5) but is slow on this CPU (int8: 35x a float decode; int4: ~0.8x float at
one row, slower than float from two rows).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def untie_matmul_weights(model) -> list[str]:
    """A Gemm/MatMul weight another node also reads (a head tied to the embedding) gets a
    copy of its own, so that quantizing the matmul leaves the embedding float."""
    from onnx import numpy_helper

    from specrt.engines.quantize import input_readers

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    readers = input_readers(g)
    untied = []
    for n in g.node:
        if n.op_type in ("Gemm", "MatMul") and len(n.input) >= 2 and readers.get(n.input[1], 0) > 1 \
                and n.input[1] in inits:
            copy = numpy_helper.from_array(numpy_helper.to_array(inits[n.input[1]]).copy(), n.input[1] + ".matmul")
            g.initializer.append(copy)
            readers[n.input[1]] -= 1
            untied.append(n.input[1])
            n.input[1] = copy.name
    return untied


def quantize(engines: Path, out: Path, bits: int, accuracy_level: int) -> dict:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from specrt.engines.quantize import gemms_to_matmul

    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    if out.exists():
        raise SystemExit(f"{out} exists")
    out.mkdir(parents=True)
    for f in engines.iterdir():
        if f.name in ("engines.json", "target.onnx", "target.onnx.data"):
            continue
        if f.is_dir():
            shutil.copytree(f, out / f.name, copy_function=os.link)
        else:
            os.link(f, out / f.name)
    model = onnx.load(str(engines / "target.onnx"))
    untied = untie_matmul_weights(model)
    gemms_to_matmul(model)
    q = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=True, accuracy_level=accuracy_level)
    q.process()
    onnx.save_model(q.model.model, str(out / "target.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="target.onnx.data", size_threshold=1024)
    m = json.loads((engines / "engines.json").read_text())
    for rec in m["files"]:
        p = out / rec["file"]
        rec["sha256"], rec["bytes"] = hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size
    record = {"bits": bits, "block_size": 32, "accuracy_level": accuracy_level, "untied": untied,
              "matmul_nbits": sum(1 for n in q.model.model.graph.node if n.op_type == "MatMulNBits"),
              "note": "tools/exp_quantized_target.py: an experiment, not a specrt build option"}
    m.setdefault("experiment", {})["quantized_target"] = record
    (out / "engines.json").write_text(json.dumps(m, indent=1))
    return record


def row_difference(folder: Path) -> dict:
    """The largest |logit| difference between a one-row call's row and the same row in a
    two- and a five-row call, after a 40-token prompt (the portable contract)."""
    from specrt import contracts as C
    from specrt.engines import load_engines

    rng = np.random.default_rng(0)
    with load_engines(folder) as e:
        t = e.export["target"]
        n_layers, kvh, hd = t["num_layers"], t["num_kv_heads"], t["head_dim"]
        with_from = C.LOGITS_FROM in [i.name for i in e.portable("prefill").get_input_metadata()]

        def feeds(tok, pos, past):
            f = {C.INPUT_IDS: np.asarray(tok, np.int64)[None], C.POSITION_IDS: np.arange(pos, pos + len(tok))[None]}
            for i in range(n_layers):
                f[C.past_key(i)], f[C.past_value(i)] = past[0][i], past[1][i]
            if with_from:
                f[C.LOGITS_FROM] = np.array(0, np.int64)
            return f

        empty = [np.zeros((1, 0, kvh, hd), np.float32)] * n_layers
        out = e.portable("prefill").infer(feeds(rng.integers(100, 20000, 40), 0, (empty, empty)))
        past = ([out[C.new_key(i)] for i in range(n_layers)], [out[C.new_value(i)] for i in range(n_layers)])
        x = int(out[C.LOGITS][0, -1].argmax())
        one = e.portable_target(1).infer(feeds([x], 40, past))[C.LOGITS][0, 0]
        res = {}
        for s in (2, 5):
            rows = e.portable_target(s).infer(feeds([x, *range(5, 4 + s)], 40, past))[C.LOGITS][0, 0]
            res[f"rows_{s}"] = float(np.abs(one - rows).max())
        res["logit_std"] = float(one.std())
        return res


def identity(folder: Path, prompts: Path, n: int, tokens: int) -> dict:
    from specrt.runtime.session import Session

    rows = [json.loads(line)["prompt"] for line in open(prompts)][:n]
    out = {}
    for gov in ("off", "fixed:1", "fixed:2", "dspark"):
        with Session(folder, governor=gov) as s:
            out[gov] = []
            for p in rows:
                "".join(s.stream(p, chat=True, max_new_tokens=tokens))
                out[gov].append(s.stats()["output_token_ids"])
    res = {}
    for gov in ("fixed:1", "fixed:2", "dspark"):
        same = [a == b for a, b in zip(out["off"], out[gov])]
        first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                 for a, b in zip(out["off"], out[gov]) if a != b]
        res[gov] = {"identical": f"{sum(same)}/{len(same)}", "first_differences": first}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--bits", type=int, choices=(4, 8))
    ap.add_argument("--accuracy-level", type=int, default=4, choices=(0, 1, 2, 3, 4))
    ap.add_argument("-o", "--out", type=Path)
    ap.add_argument("--check", type=Path, help="a folder this tool wrote: measure it (and ENGINES)")
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "data" / "heldout_prompts.jsonl")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    if a.check is None:
        if a.bits is None or a.out is None:
            raise SystemExit("give --bits and -o, or --check")
        print(json.dumps(quantize(a.engines, a.out, a.bits, a.accuracy_level)))
        return
    report = {"float": {"rows": row_difference(a.engines)},
              "quantized": {"rows": row_difference(a.check), "identity": identity(a.check, a.prompts, a.n, a.tokens),
                            "build": json.loads((a.check / "engines.json").read_text())["experiment"]["quantized_target"]}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
