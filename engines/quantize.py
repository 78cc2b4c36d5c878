"""Weight-only int8 draft for ONNX Runtime (``specrt build --draft-weights int8``).

The draft only proposes tokens: the target verifies every one with its own
unquantized logits, so a quantized draft cannot change greedy output or the sampled
distribution (DESIGN.md §4 uses whatever q the proposal was drawn from). What it can
change is how often proposals are accepted, which the acceptance canary and
``specrt bench`` measure.

Lowering: each Gemm/MatMul of the draft whose weight is an initializer becomes
``com.microsoft.MatMulNBits`` (ONNX Runtime's blocked weight-only kernel): 8-bit
symmetric blocks of ``block_size`` along the input dimension, one scale per block,
``accuracy_level`` 4 (int8 activations in the kernel; 0 keeps fp32 activations and
ran 7x slower here). Everything else, the embedding Gather included (a lookup reads
one row, not the table), stays as exported.

Measured on the SmolLM2 P-EAGLE draft (2 cores, K = 4, results/engines.txt): one draft
pass 1.22 vs 1.77 ms; draft logits within ~0.1 of the fp32 graph, greedy draft tokens
unchanged on the compare inputs. ``check_int8_weights`` (used by ``specrt compare``) checks
a built draft's blocks against the float weights exactly. 4-bit blocks agreed with the
fp32 draft on only 75% of greedy tokens, so 8 bits is the one offered.
"""

from __future__ import annotations

import logging
from pathlib import Path

from specrt.errors import UserError

DRAFT_WEIGHTS = ("fp", "int8")
BITS = 8
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4


def _attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def gemms_to_matmul(model) -> int:
    """Rewrite ``Gemm(A, W, transB=1)`` (and transB=0) without bias, alpha = beta = 1, whose
    W is an initializer, as ``MatMul(A, W^T)`` in place: MatMulNBits quantizes MatMul only.
    Returns how many were rewritten."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    done = 0
    for n in g.node:
        if n.op_type != "Gemm" or len(n.input) != 2 or n.input[1] not in inits:
            continue
        if _attr(n, "alpha", 1.0) != 1.0 or _attr(n, "beta", 1.0) != 1.0 or _attr(n, "transA", 0):
            continue
        w = inits[n.input[1]]
        if _attr(n, "transB", 0):
            if uses[w.name] != 1:
                continue  # shared weight: leave it (transposing would change the other user)
            arr = numpy_helper.to_array(w).T.copy()
            w.CopyFrom(numpy_helper.from_array(arr, w.name))
        n.op_type = "MatMul"
        del n.attribute[:]
        done += 1
    onnx.checker.check_model(model)
    return done


def quantize_draft(src: Path, dst: Path, dtype: str) -> dict:
    """Write ``src`` (the export's draft graph) to ``dst`` + ``dst.data`` with int8 weights;
    returns the engines.json record of what was done."""
    import onnx
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:  # it imports onnx_ir, a dependency of specrt that an old install may lack
        raise UserError(f"--draft-weights int8 needs onnxruntime.quantization's MatMulNBits quantizer, which "
                        f"failed to import ({e}); pip install 'onnx-ir>=1.1'") from None

    if dtype != "float32":
        raise UserError(f"{src}: int8 draft weights need a float32 graph, not {dtype}")
    model = onnx.load(str(src))  # with its external weights: the draft is small
    gemms_to_matmul(model)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)  # it logs every node at INFO
    q = MatMulNBitsQuantizer(model, bits=BITS, block_size=BLOCK_SIZE, is_symmetric=True,
                             accuracy_level=ACCURACY_LEVEL)
    q.process()
    out = q.model.model
    quantized = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    if quantized == 0:
        raise UserError(f"{src}: no MatMul with a constant weight to quantize")
    onnx.save_model(out, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    return {"weights": "int8", "op": "com.microsoft.MatMulNBits", "bits": BITS, "block_size": BLOCK_SIZE,
            "symmetric": True, "accuracy_level": ACCURACY_LEVEL, "matmuls_quantized": quantized}


# ONNX Runtime's symmetric 8-bit blocks (measured on the SmolLM2 drafts, 2026-11-30):
# step = the block's signed largest weight / -128, so that weight is code 0 (-128 after the
# zero point 128) exactly; every other weight rounds to the nearest code, within half a
# step, except where rounding would give +128, which clips to code 255 (+127): up to one
# step. Float32 rounding of the step and the dequantization is ~1e-7 relative.
STEP_DIVISOR = 128
ZERO_POINT = 128
_REL = 1e-5


def check_int8_weights(float_graph: Path, int8_graph: Path) -> dict:
    """Check every MatMulNBits weight of ``int8_graph`` against the float weight it came from
    in ``float_graph`` (the export's draft; matched by the MatMul's output name): each block's
    step must be its largest |weight| / 128 and each weight must dequantize to within half a
    step of the float one (one step where it clipped at the top code). This is exact, not
    statistical: a wrong scale, a swapped or stale weight fails it by a whole multiple.
    Returns {"matmuls", "blocks", "max_error_steps", "max_clipped_error_steps",
    "max_step_error", "bad": [{"matmul", "problem"}], "passed"}."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    fmodel = onnx.load(str(float_graph))
    gemms_to_matmul(fmodel)
    finits = {t.name: t for t in fmodel.graph.initializer}
    by_output = {n.output[0]: n.input[1] for n in fmodel.graph.node
                 if n.op_type == "MatMul" and n.input[1] in finits}
    qmodel = onnx.load(str(int8_graph))
    qinits = {t.name: t for t in qmodel.graph.initializer}
    bad: list[dict] = []
    matmuls = blocks = 0
    worst = worst_clipped = worst_step = 0.0
    for n in qmodel.graph.node:
        if n.op_type != "MatMulNBits":
            continue
        matmuls += 1
        out = n.output[0]
        if out not in by_output:
            bad.append({"matmul": out, "problem": f"no MatMul of {float_graph.name} with a constant weight writes it"})
            continue
        bits, block = _attr(n, "bits", 0), _attr(n, "block_size", 0)
        if bits != BITS or len(n.input) > 3 and n.input[3]:
            bad.append({"matmul": out, "problem": f"bits {bits}, zero points {n.input[3:] or 'none'}: expected "
                                                  f"{BITS} bits, symmetric (no zero-point input)"})
            continue
        w = numpy_helper.to_array(finits[by_output[out]]).astype(np.float64)  # [K, N]
        codes = numpy_helper.to_array(qinits[n.input[1]])  # [N, blocks, block bytes]
        step = numpy_helper.to_array(qinits[n.input[2]]).astype(np.float64)
        k, cols = w.shape
        nb = -(-k // block)
        if codes.shape != (cols, nb, block) or step.size != cols * nb:
            bad.append({"matmul": out, "problem": f"codes {list(codes.shape)} and {step.size} steps do not fit a "
                                                  f"[{k}, {cols}] weight in blocks of {block}"})
            continue
        step = step.reshape(cols, nb, 1)
        wb = np.zeros((cols, nb * block))
        wb[:, :k] = w.T
        wb = wb.reshape(cols, nb, block)
        top = np.abs(wb).max(-1, keepdims=True)
        blocks += cols * nb
        step_err = np.abs(np.abs(step) * STEP_DIVISOR - top) / np.maximum(top, 1e-30)
        err = np.abs((codes.astype(np.float64) - ZERO_POINT) * step - wb) / np.maximum(np.abs(step), 1e-30)
        clipped = codes == 255
        e_plain = float(np.where(clipped, 0.0, err).max())
        e_clip = float(np.where(clipped, err, 0.0).max())
        s_err = float(np.where(top > 0, step_err, 0.0).max())
        worst, worst_clipped, worst_step = max(worst, e_plain), max(worst_clipped, e_clip), max(worst_step, s_err)
        problems = []
        if s_err > _REL:
            i = np.unravel_index(int(np.argmax(np.where(top > 0, step_err, 0.0))), step_err.shape)
            problems.append(f"block ({i[0]}, {i[1]}): step {abs(step[i]):.4g} x {STEP_DIVISOR} = "
                            f"{abs(step[i]) * STEP_DIVISOR:.4g}, its largest |weight| is {top[i]:.4g}")
        if e_plain > 0.5 + _REL or e_clip > 1 + _REL:
            problems.append(f"a weight dequantizes {max(e_plain, e_clip):.3g} steps from the float one (at most 0.5, "
                            f"1 where clipped)")
        if problems:
            bad.append({"matmul": out, "problem": "; ".join(problems)})
    return {"matmuls": matmuls, "blocks": blocks, "max_error_steps": worst, "max_clipped_error_steps": worst_clipped,
            "max_step_error": worst_step, "bad": bad, "passed": matmuls > 0 and not bad}
