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

Each is timed on the same synthetic feeds (``--pending`` real slots + block - 1 mask slots
after ``--past`` draft-cache rows), one call of each in turn, sessions without spinning
threads (a spinning session would steal the next one's cores), medians of ``--repeats``
rounds of 15 calls.

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
import logging
import sys
import tempfile
import time
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


def feeds_for(session, pending: int, block: int, past: int, rng) -> dict[str, np.ndarray]:
    """Synthetic draft feeds: ``pending`` real slots and block - 1 mask slots after ``past`` rows."""
    f = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else pending if "aux" in d else past if "past" in d else pending + block - 1
                 for d in i.shape]
        if i.type == "tensor(int64)":
            f[i.name] = (np.arange(past, past + shape[1])[None] if "position" in i.name
                         else rng.integers(0, 1000, shape)).astype(np.int64)
        else:
            f[i.name] = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return f


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

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
    with tempfile.TemporaryDirectory() as tmp:
        scratch = args.keep or Path(tmp)
        scratch.mkdir(parents=True, exist_ok=True)
        paths = variants(args.engines, scratch)
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sessions = {k: ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for k, p in paths.items()}
        rng = np.random.default_rng(0)
        first = next(iter(sessions.values()))
        res: dict[str, dict[int, list[float]]] = {k: {b: [] for b in blocks} for k in sessions}
        for _ in range(args.repeats):
            for b in blocks:
                feeds = feeds_for(first, args.pending, b, args.past, rng)
                for s in sessions.values():
                    for _ in range(2):
                        s.run(None, feeds)
                times: dict[str, list[float]] = {k: [] for k in sessions}
                for _ in range(15):
                    for k, s in sessions.items():
                        t = time.perf_counter()
                        s.run(None, feeds)
                        times[k].append(time.perf_counter() - t)
                for k in sessions:
                    res[k][b].append(float(np.median(times[k])) * 1e3)
    print(f"ms a draft pass ({args.pending} pending slots, past {args.past}; medians of {args.repeats} rounds)")
    for k, by in res.items():
        print(f"{k:>22}", "  ".join(f"block {b}: {np.median(t):.3f}" for b, t in by.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
