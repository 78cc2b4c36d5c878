"""Which int8 form of the draft is fastest on this host? Draft passes of several quantizations, timed in turn.

    .venv/bin/python tools/exp_draft_quant.py ENGINES [--pending 2] [--blocks 1,2,4,8]
        [--past 256] [--repeats 7] [--keep DIR]

ENGINES: a build whose export folder holds the float draft graph. Variants of that graph,
written to a scratch folder (``--keep`` keeps them):

- ``nbits8``: `specrt build --draft-weights int8:blocks`'s draft (engines/quantize.py:
  MatMulNBits, 8-bit blocks of 32, accuracy level 4, on every weight matmul);
- ``dynamic_all``: ONNX Runtime's ``quantize_dynamic`` (per-column symmetric int8 weights
  in [-64, 64], ``reduce_range``; each call's activations quantized per tensor to uint8;
  MatMulInteger) on every weight matmul;
- ``dynamic_gate_up_head``: `--draft-weights int8:dynamic`'s draft, the same on the MLP's
  gate and up projections and the head only (their inputs are normed hidden states); fc
  (the aux hidden states, with their outlier channels), q/k/v/o and down stay float;
- ``float``: the export's graph (Gemm rewritten as MatMul).

(Plain ``--draft-weights int8`` times nbits8 and dynamic_gate_up_head at build and keeps
the faster: quantize.choose_form.)

Each is timed on the same synthetic feeds (engines/costs.py ``synthetic_feeds``: ``--pending``
real slots + block - 1 mask slots after ``--past`` draft-cache rows), one call of each in
turn, sessions without spinning threads (engines/quantize.py ``time_passes``, what the build
times its two int8 forms with), medians of ``--repeats`` rounds of 15 calls.

Measured 2026-12-02 on the 2-core AMD EPYC without AVX-512 (out/ng/engines, pending 2,
past 256; ms a draft pass at blocks 1 / 2 / 4 / 8): nbits8 2.08 / 2.73 / 4.06 / 6.74,
dynamic_gate_up_head 2.07 / 2.32 / 2.71 / 3.81, float 2.84 / 3.08 / 3.31 / 4.20 (MatMulNBits'
int8 path grows ~0.65 ms a row here, so past block 2 the float draft is faster than it).
Acceptance (specrt run --governor fixed:4, P40, scratch engine folders with the variant as
draft.onnx): nbits8 tau 1.8286 (0.543 at position 1), dynamic_gate_up_head 1.8279
(0.541), dynamic_all 1.7167 (0.478: the fc's per-tensor activation scale). results/README.md,
"The draft's int8 form".
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

def variants(engines: Path, scratch: Path) -> dict[str, Path]:
    """name -> draft graph path (written under ``scratch``)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from specrt.engines.quantize import gemms_to_matmul, quantize_draft

    src = engines / "export" / "draft.onnx"
    if not src.is_file():
        raise SystemExit(f"error: {src}: no export draft graph")
    model = onnx.load(str(src))
    gemms_to_matmul(model)
    flt = scratch / "float.onnx"
    onnx.save_model(model, str(flt), save_as_external_data=True, location="float.onnx.data")
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.WARNING)  # quantize_dynamic logs every tensor at INFO
    out = {}
    for name, form in (("nbits8", "blocks"), ("dynamic_gate_up_head", "dynamic")):
        quantize_draft(src, scratch / f"{name}.onnx", "float32", form)
        out[name] = scratch / f"{name}.onnx"
    quantize_dynamic(str(flt), str(scratch / "dynamic_all.onnx"), per_channel=True, reduce_range=True,
                     weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    out["dynamic_all"] = scratch / "dynamic_all.onnx"
    out["float"] = flt
    return out


def main(argv: list[str] | None = None) -> int:
    from types import SimpleNamespace

    from specrt import contracts as C
    from specrt.engines.base import specs_from_json
    from specrt.engines.costs import synthetic_feeds
    from specrt.engines.quantize import time_passes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--pending", type=int, default=2)
    ap.add_argument("--blocks", default="1,2,4,8")
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None, help="write the variant graphs here and keep them")
    args = ap.parse_args(argv)
    blocks = [int(b) for b in args.blocks.split(",")]
    exp = json.loads((args.engines / "export" / "export.json").read_text())
    draft_in = SimpleNamespace(inputs=specs_from_json(exp["graphs"]["draft"]["io"]["inputs"]))
    rng = np.random.default_rng(0)
    a = args.pending  # P-EAGLE: a real slots and block - 1 mask slots after --past rows
    feeds = [synthetic_feeds(draft_in, {C.DIM_NEW: a + b - 1, C.DIM_AUX: a, C.DIM_PAST: args.past},
                             int(exp["target"]["vocab_size"]), rng) for b in blocks]
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        paths = variants(args.engines, scratch)
        res: dict[str, dict[int, list[float]]] = {k: {b: [] for b in blocks} for k in paths}
        for _ in range(args.repeats):  # rounds of 15 calls a variant and block, in turn
            for k, ms in time_passes(paths, feeds, args.threads, repeats=15).items():
                for b, t in zip(blocks, ms):
                    res[k][b].append(t)
    print(f"ms a draft pass ({args.pending} pending slots, past {args.past}; medians of {args.repeats} rounds)")
    for k, by in res.items():
        print(f"{k:>22}", "  ".join(f"block {b}: {np.median(t):.3f}" for b, t in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
