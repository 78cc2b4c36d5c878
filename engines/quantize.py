"""Weight-only int8 draft for ONNX Runtime (``specrt build --draft-weights int8``).

The draft only proposes tokens: the target verifies every one with its own
unquantized logits, so a quantized draft cannot change greedy output or the sampled
distribution (DESIGN.md §4 uses whatever q the proposal was drawn from). What it can
change is how often proposals are accepted, which the acceptance canary and
``specrt bench`` measure.

Two forms (``--draft-weights int8:blocks`` / ``int8:dynamic``; plain ``int8`` builds both,
times a draft pass of each on this machine and keeps the faster, ``choose_form``):

* blocks: each Gemm/MatMul of the draft whose weight is an initializer becomes
  ``com.microsoft.MatMulNBits`` (ONNX Runtime's blocked weight-only kernel): 8-bit
  symmetric blocks of ``block_size`` along the input dimension, one scale per block,
  ``accuracy_level`` 4 (int8 activations in the kernel, quantized per block; 0 keeps fp32
  activations and ran 7x slower here);
* dynamic: ONNX Runtime's ``quantize_dynamic`` on the weights of ``DYNAMIC_SLOTS`` only
  (the MLP's gate and up projections and the head, whose inputs are normed hidden
  states): per output column symmetric int8 codes in [-64, 64] (``reduce_range``: u8 x s8
  pairs cannot saturate AVX2's 16-bit sums), the activations quantized to uint8 with one
  scale per call (DynamicQuantizeLinear), MatMulInteger; fc (the target's aux hidden
  states, whose outlier channels one activation scale cannot hold), q/k/v/o and down stay
  float.

Everything else, the embedding Gather included (a lookup reads one row, not the table),
stays as exported.

Measured on the SmolLM2 P-EAGLE draft. On the AVX-512 host (2 cores, K = 4,
results/engines.txt) the blocks form's pass took 1.22 vs 1.77 ms in float; on the
AVX2-only host of 2026-12-02 MatMulNBits grows ~0.65 ms a row, and a pass at blocks 1 / 2 /
4 / 8 took 2.10 / 2.90 / 4.10 / 6.82 ms in blocks, 2.09 / 2.36 / 2.80 / 3.87 dynamic, 2.87 /
3.16 / 3.40 / 4.28 float, both int8 forms accepting as the float draft does
(tools/exp_draft_quant.py; results/README.md "The draft's int8 form"). Quantizing every
matmul dynamically lost acceptance (tau 1.72 vs 1.83 at fixed:4). Blocks' draft logits
move by up to 0.5-0.8 from the fp32 graph's on the compare inputs (rows of std ~2; compare.py
INT8_DRAFT), greedy draft tokens unchanged there.
``check_int8_weights`` (used by ``specrt compare``) checks a built draft's codes against
the float weights exactly, either form. 4-bit blocks agreed with the fp32 draft on only
75% of greedy tokens, so 8 bits is the one offered.
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from pathlib import Path

from specrt.engines.base import load_onnx
from specrt.errors import UserError

INT8_FORMS = ("blocks", "dynamic")
DRAFT_WEIGHTS = ("fp", "int8", *(f"int8:{f}" for f in INT8_FORMS))
# the dynamic form's weights, by the draft graph's slot names (export/slots.py), exactly
DYNAMIC_SLOTS = re.compile(r"layers\.\d+\.(gate|up)|lm_head")
DYNAMIC_RANGE = 64  # codes in [-64, 64]: step = a column's largest |weight| / 64
# plain int8 keeps the dynamic form only if its passes take less than this share of the blocks form's
DYNAMIC_MARGIN = 0.97
BITS = 8
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4


def _attr(node, name: str, default):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def input_readers(graph) -> dict[str, int]:
    """How many node inputs read each tensor name (a weight read twice is shared)."""
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    return readers


def gemms_to_matmul(model) -> int:
    """Rewrite ``Gemm(A, W, transB=1)`` (and transB=0) without bias, alpha = beta = 1, whose
    W is an initializer, as ``MatMul(A, W^T)`` in place: MatMulNBits quantizes MatMul only.
    Returns how many were rewritten."""
    import onnx
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    uses = input_readers(g)
    done = 0
    for n in g.node:
        if n.op_type != "Gemm" or len(n.input) != 2 or n.input[1] not in inits:
            continue
        if not _plain_product(n):
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


def quantize_draft(src: Path, dst: Path, dtype: str, form: str = "blocks") -> dict:
    """Write ``src`` (the export's draft graph) to ``dst`` + ``dst.data`` with int8 weights
    in ``form`` (INT8_FORMS); returns the engines.json record of what was done."""
    import onnx

    if dtype != "float32":
        raise UserError(f"{src}: int8 draft weights need a float32 graph, not {dtype}")
    if form not in INT8_FORMS:
        raise UserError(f"int8 form '{form}' is not one of {', '.join(INT8_FORMS)}")
    model = load_onnx(src)  # with its external weights: the draft is small
    gemms_to_matmul(model)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)  # it logs every node at INFO
    if form == "blocks":
        try:
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        except ImportError as e:  # it imports onnx_ir, a dependency of specrt that an old install may lack
            raise UserError(f"--draft-weights int8 needs onnxruntime.quantization's MatMulNBits quantizer, which "
                            f"failed to import ({e}); pip install 'onnx-ir>=1.1'") from None
        blocks = dict(block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL)
        try:
            q = MatMulNBitsQuantizer(model, bits=BITS, **blocks)
        except TypeError:  # onnxruntime 1.23 (the last for Python 3.10 and Intel macOS) takes no bits here
            from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig

            q = MatMulNBitsQuantizer(model, algo_config=DefaultWeightOnlyQuantConfig(bits=BITS, **blocks), **blocks)
        q.process()
        out = q.model.model
        record = {"weights": "int8", "form": "blocks", "op": "com.microsoft.MatMulNBits", "bits": BITS,
                  "block_size": BLOCK_SIZE, "symmetric": True, "accuracy_level": ACCURACY_LEVEL}
        quantized = sum(1 for n in out.graph.node if n.op_type == "MatMulNBits")
    else:
        out, kept = _quantize_dynamic(model)
        record = {"weights": "int8", "form": "dynamic", "op": "MatMulInteger", "bits": BITS,
                  "codes": [-DYNAMIC_RANGE, DYNAMIC_RANGE], "scales": "per output column",
                  "activations": "uint8, one scale per call (DynamicQuantizeLinear)", "kept_float": kept}
        quantized = sum(1 for n in out.graph.node if n.op_type == "MatMulInteger")
    if quantized == 0:
        raise UserError(f"{src}: no MatMul with a constant weight to quantize")
    onnx.save_model(out, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    return {**record, "matmuls_quantized": quantized}


def _quantize_dynamic(model):
    """(the quantized model, the weights kept float): quantize_dynamic on DYNAMIC_SLOTS' MatMuls."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    inits = {t.name for t in model.graph.initializer}
    weighted = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    keep = [n for n in weighted if not DYNAMIC_SLOTS.fullmatch(n.input[1])]
    root = logging.getLogger()
    level = root.level
    with tempfile.TemporaryDirectory() as tmp:  # quantize_dynamic reads and writes files
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(model, str(src), save_as_external_data=True, location="float.onnx.data")
        root.setLevel(max(level, logging.ERROR))  # it logs every tensor (and advice) on the root logger
        try:
            quantize_dynamic(str(src), str(dst), per_channel=True, reduce_range=True, weight_type=QuantType.QInt8,
                             op_types_to_quantize=["MatMul"], nodes_to_exclude=[n.name for n in keep])
        finally:
            root.setLevel(level)
        return load_onnx(dst), sorted(n.input[1] for n in keep)


def choose_form(src: Path, folder: Path, name: str, dtype: str, feeds: list[dict], threads: int,
                repeats: int = 10, providers=("CPUExecutionProvider",)) -> tuple[str, dict]:
    """Quantize ``src`` in both INT8_FORMS, each to ``folder/<form>/<name>`` (+ .data, so the
    kept one moves into place as it is), and time a draft pass of each on ``feeds`` (the
    loop's shapes; ``time_passes``); -> (the form kept, {form: {"ms": [median per feeds],
    "record": quantize_draft's record, "path"}}). The dynamic form is kept when its passes
    take under DYNAMIC_MARGIN of the blocks form's in all."""
    forms = {}
    for form in INT8_FORMS:
        (folder / form).mkdir()
        path = folder / form / name
        forms[form] = {"record": quantize_draft(src, path, dtype, form), "path": path}
    times = time_passes({f: v["path"] for f, v in forms.items()}, feeds, threads, repeats, providers)
    for f in forms:
        forms[f]["ms"] = [round(t, 4) for t in times[f]]
    # decided on the recorded (rounded) times, so that the record explains the choice: on
    # unrounded ones a near tie could keep the form the record shows as slower (a flaky test)
    ms = {f: forms[f]["ms"] for f in forms}
    kept = "dynamic" if sum(ms["dynamic"]) < DYNAMIC_MARGIN * sum(ms["blocks"]) else "blocks"
    return kept, forms


def time_passes(paths: dict[str, Path], feeds: list[dict], threads: int, repeats: int = 10,
                providers=("CPUExecutionProvider",)) -> dict[str, list[float]]:
    """{name: [median ms per feeds]}: one session per graph in ``paths`` on ``providers``,
    without spinning threads (a spinning one steals the next one's cores), ``repeats`` calls
    of each in turn on each feeds after one untimed call. The sessions are released on return."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = {k: ort.InferenceSession(str(p), so, providers=list(providers)) for k, p in paths.items()}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for f in feeds:
        for s in sessions.values():
            s.run(None, f)
        per: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(repeats):
            for k, s in sessions.items():
                t = time.perf_counter()
                s.run(None, f)
                per[k].append(time.perf_counter() - t)
        for k in sessions:
            times[k].append(float(np.median(per[k])) * 1e3)
    return times


# ONNX Runtime's symmetric 8-bit blocks (measured on the SmolLM2 drafts, 2026-11-30):
# step = the block's signed largest weight / -128, so that weight is code 0 (-128 after the
# zero point 128) exactly; every other weight rounds to the nearest code, within half a
# step, except where rounding would give +128, which clips to code 255 (+127): up to one
# step. Float32 rounding of the step and the dequantization is ~1e-7 relative.
STEP_DIVISOR = 128
ZERO_POINT = 128
_REL = 1e-5


def check_int8_weights(float_graph: Path, int8_graph: Path) -> dict:
    """Check every int8 weight of ``int8_graph`` against the float weight it came from in
    ``float_graph`` (the export's draft). MatMulNBits (the blocks form; matched by the
    MatMul's output name): each block's step must be its largest |weight| / 128 and each
    weight must dequantize to within half a step of the float one (one step where it
    clipped at the top code). MatMulInteger (the dynamic form; matched by the weight's name,
    ``<name>_quantized`` with ``<name>_scale``): each column's step must be its largest
    |weight| / 64, its zero point 0, and each code within half a step. This is exact, not
    statistical: a wrong scale, a swapped or stale weight fails it by a whole multiple.
    Each weight is read as its own graph's node reads it (a Gemm with transB = 1 transposed),
    never through the build's rewrite (gemms_to_matmul): a rewrite that lost a transpose fails.
    Every other weight (embeddings, norms, d2t, what stays float) must be the float graph's,
    byte for byte, under its name, and every float weight must be there or quantized and
    checked (a changed norm weight passed the outputs' loose int8 tolerances).
    Returns {"matmuls", "op", "unit", "blocks" (blocks, or columns of the dynamic form), "max_error_steps",
    "max_clipped_error_steps", "max_step_error", "float_weights", "bad": [{"matmul", "problem"}], "passed"}."""
    import numpy as np

    fmodel = load_onnx(float_graph)  # as exported: the check never runs gemms_to_matmul, what built it
    qmodel = load_onnx(int8_graph)
    fnodes, qnodes = _weight_readers(fmodel.graph), _weight_readers(qmodel.graph)
    finits = {t.name: _Oriented(t, fnodes.get(t.name)) for t in fmodel.graph.initializer}
    by_output = {n.output[0]: n.input[1] for n in fmodel.graph.node
                 if len(n.input) == 2 and n.input[1] in finits and _plain_product(n)}
    qinits = {t.name: _Oriented(t, qnodes.get(t.name)) for t in qmodel.graph.initializer}
    bad: list[dict] = []
    ops: set[str] = set()
    matmuls = blocks = 0
    quantized = {by_output[n.output[0]] for n in qmodel.graph.node
                 if n.op_type == "MatMulNBits" and n.output[0] in by_output}
    quantized |= {n.input[1][: -len("_quantized")] for n in qmodel.graph.node
                  if n.op_type == "MatMulInteger" and n.input[1].endswith("_quantized")}
    same = 0
    for name, ft in finits.items():
        if name in qinits:
            a, b = ft.array(), qinits[name].array()  # each as its graph's MatMul or Gemm reads it
            if a.dtype != b.dtype or a.shape != b.shape or a.tobytes() != b.tobytes():
                diff = "" if a.shape != b.shape or a.dtype != b.dtype else \
                    f" (element {int(np.flatnonzero(a.reshape(-1) != b.reshape(-1))[0]) if (a != b).any() else '?'})"
                bad.append({"matmul": name, "problem": f"weight {name} differs from {float_graph.name}'s{diff}"})
            same += 1
        elif name not in quantized:
            bad.append({"matmul": name, "problem": f"weight {name} of {float_graph.name} is neither in the int8 graph "
                                                   "nor quantized there"})
    worst = worst_clipped = worst_step = 0.0
    for n in qmodel.graph.node:
        if n.op_type == "MatMulInteger" and n.input[1] in qinits:
            matmuls += 1
            r = _check_columns(n, finits, qinits)
            if isinstance(r, str):
                bad.append({"matmul": n.input[1], "problem": r})
                continue
            cols, e_plain, s_err, problems = r
            blocks += cols
            ops.add("MatMulInteger")
            worst, worst_step = max(worst, e_plain), max(worst_step, s_err)
            if problems:
                bad.append({"matmul": n.input[1], "problem": "; ".join(problems)})
            continue
        if n.op_type != "MatMulNBits":
            continue
        matmuls += 1
        ops.add("MatMulNBits")
        out = n.output[0]
        if out not in by_output:
            bad.append({"matmul": out, "problem": f"no MatMul of {float_graph.name} with a constant weight writes it"})
            continue
        bits, block = _attr(n, "bits", 0), _attr(n, "block_size", 0)
        if bits != BITS or len(n.input) > 3 and n.input[3]:
            bad.append({"matmul": out, "problem": f"bits {bits}, zero points {n.input[3:] or 'none'}: expected "
                                                  f"{BITS} bits, symmetric (no zero-point input)"})
            continue
        w = finits[by_output[out]].array().astype(np.float64)  # [K, N], as the float graph's node reads it
        codes = qinits[n.input[1]].raw()  # [N, blocks, block bytes]
        step = qinits[n.input[2]].raw().astype(np.float64)
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
        # the last block's rows past K are padding, code 0, which ONNX Runtime never reads (a K not
        # a multiple of the block size failed every correct build by 128 steps there)
        err = np.where(np.arange(nb * block).reshape(1, nb, block) >= k, 0.0, err)
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
        if problems:  # (named by its float weight too: a node's output alone, Gemm_0/out0, named no weight)
            bad.append({"matmul": out, "weight": by_output[out], "problem": "; ".join(problems)})
    return {"matmuls": matmuls, "op": "+".join(sorted(ops)) or "none",
            "unit": "blocks" if ops == {"MatMulNBits"} else "columns" if ops == {"MatMulInteger"} else "blocks/columns",
            "blocks": blocks, "max_error_steps": worst, "max_clipped_error_steps": worst_clipped,
            "max_step_error": worst_step, "float_weights": same, "bad": bad, "passed": matmuls > 0 and not bad}


def _weight_readers(graph) -> dict:
    """{initializer name: the first MatMul or Gemm node reading it as its second input}."""
    readers: dict = {}
    for n in graph.node:
        if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1:
            readers.setdefault(n.input[1], n)
    return readers


def _plain_product(n) -> bool:
    """A MatMul, or a Gemm without bias, scaling or transposed A: input 0 times the weight."""
    return n.op_type == "MatMul" or n.op_type == "Gemm" and _attr(n, "alpha", 1.0) == 1.0 and \
        _attr(n, "beta", 1.0) == 1.0 and not _attr(n, "transA", 0)


class _Oriented:
    """An initializer and the node that reads it: ``array()`` is the weight as a [K, N]
    MatMul operand, transposed where a Gemm reads it with transB = 1, so that the export's
    Gemm weights and the int8 graph's rewritten MatMul ones compare without running the
    rewrite (``gemms_to_matmul``) whose output is being checked."""

    def __init__(self, tensor, reader):
        self.tensor, self.reader = tensor, reader

    def raw(self):
        from onnx import numpy_helper

        return numpy_helper.to_array(self.tensor)

    def array(self):
        a = self.raw()
        if self.reader is not None and self.reader.op_type == "Gemm" and _attr(self.reader, "transB", 0):
            return a.T
        return a


def _check_columns(n, finits: dict, qinits: dict):
    """One MatMulInteger of the dynamic form against its float weight: (columns, worst
    error in steps, worst relative step error, problems) or a problem string."""
    import numpy as np

    qname = n.input[1]
    name = qname[: -len("_quantized")] if qname.endswith("_quantized") else None
    if name is None or name not in finits or name + "_scale" not in qinits:
        return f"weight {qname}: no float weight of that name (without _quantized) with a {name}_scale beside it"
    zp = qinits[n.input[3]].raw() if len(n.input) > 3 and n.input[3] in qinits else None
    if zp is None or np.any(zp != 0):
        return "the weight's zero point is not 0: expected symmetric codes"
    w = finits[name].array().astype(np.float64)  # [K, N], as the float graph's node reads it
    codes = qinits[qname].raw().astype(np.float64)
    step = qinits[name + "_scale"].raw().astype(np.float64).reshape(-1)
    if codes.shape != w.shape or step.size != w.shape[1]:
        return f"codes {list(codes.shape)} and {step.size} steps do not fit a {list(w.shape)} weight by columns"
    top = np.abs(w).max(0)
    step_err = np.where(top > 0, np.abs(step * DYNAMIC_RANGE - top) / np.maximum(top, 1e-30), 0.0)
    err = np.abs(codes * step - w) / np.maximum(step, 1e-30)
    e_plain, s_err = float(err.max()), float(step_err.max())
    problems = []
    if s_err > _REL:
        j = int(np.argmax(step_err))
        problems.append(f"column {j}: step {step[j]:.4g} x {DYNAMIC_RANGE} = {step[j] * DYNAMIC_RANGE:.4g}, its largest "
                        f"|weight| is {top[j]:.4g}")
    if e_plain > 0.5 + _REL or np.abs(codes).max() > DYNAMIC_RANGE:
        problems.append(f"a weight dequantizes {e_plain:.3g} steps from the float one (at most 0.5, codes within "
                        f"+-{DYNAMIC_RANGE})")
    return w.shape[1], e_plain, s_err, problems
