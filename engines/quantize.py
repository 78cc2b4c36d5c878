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
unchanged on the compare inputs. 4-bit blocks agreed with the fp32 draft on only 75%
of greedy tokens, so 8 bits is the one offered.
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

