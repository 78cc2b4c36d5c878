"""Lower the target and the drafts to ONNX graphs, from numpy weights keyed by slot.

``get(slot) -> np.ndarray`` serves the canonical slots of export/slots.py in HF layout
([out, in]); ``bind_target``/``bind_draft`` (export/binding.py) provide it. The graphs'
inputs and outputs are exactly those of specrt/contracts.py; the blocks they are made
of (RMSNorm, RoPE, GQA attention over past + new KV, SwiGLU) live in export/onnx_ops.py.

dtype: "float32" (default), "float16" or "bfloat16" sets the weights and every float
input/output; RMSNorm statistics, RoPE tables and softmax are float32 inside.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from specrt import contracts as C
from specrt.errors import InternalError, UserError
from specrt.export import onnx_ops as ops
from specrt.export.config import DecoderConfig, DraftConfig

# Above this many bytes of tensors a model is saved with its weights in a side file
# (protobuf cannot serialise a single message past 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_500_000_000


def _weights(b: ops.GraphBuilder, get: ops.Get):
    """Slot -> initializer name; each slot is fetched once, converted, and its numpy
    array dropped (a tied head reuses the embedding without fetching it again)."""
    return lambda slot: slot if b.has_weight(slot) else b.weight(slot, get(slot))


def _kv_names(i: int) -> tuple[str, str, str, str]:
    return C.past_key(i), C.past_value(i), C.new_key(i), C.new_value(i)


def _inplace_kv_names(i: int) -> tuple[str, str, str, str]:
    return C.cache_key(i), C.cache_value(i), C.cache_key_out(i), C.cache_value_out(i)


def _layers(b: ops.GraphBuilder, cfg: DecoderConfig, h: str, ctx, W, start: int,
            taps: dict[int, str] | None = None) -> str:
    """Decoder layers start..L-1 on the residual h [S, H]; taps[i] = residual entering layer i."""
    for i in range(start, cfg.num_layers):
        if taps is not None:
            taps[i] = h
        h = ops.decoder_layer(b, cfg, h, ctx, W, i, _kv_names(i))
    if taps is not None:
        taps[cfg.num_layers] = h
    return h


def _inplace_layers(b: ops.GraphBuilder, cfg: DecoderConfig, W, aux: tuple[int, ...], cache_len: int) -> str:
    """The in-place flavour's decoder (onnx_ops module doc): embeddings [1, S, H] through
    every layer, each residual add fused into the norm after it; writes aux_hidden and
    returns the final norm's output [1, S, H]."""
    ctx = ops.inplace_context(b, C.POSITION_IDS, cfg, cache_len)
    h = b.op("Gather", W("embed"), C.INPUT_IDS)  # [1, S, H]
    taps = {0: h}
    x = ops.rmsnorm(b, h, W("layers.0.attn_norm"), cfg.rms_norm_eps)
    for i in range(cfg.num_layers):
        nxt = W(f"layers.{i + 1}.attn_norm") if i + 1 < cfg.num_layers else W("final_norm")
        x, h = ops.ort_decoder_layer(b, cfg, h, x, ctx, W, i, _inplace_kv_names(i), nxt)
        taps[i + 1] = h
    b.op("Concat", *[taps[i] for i in aux], axis=-1, out=C.AUX_HIDDEN)
    return x


# ---- target ----------------------------------------------------------------------------


def build_target_graph(cfg: DecoderConfig, get: ops.Get, aux_layer_ids, dtype: str = "float32",
                       kv: str = "append", cache_len: int | None = None, head: str = "full",
                       outliers: np.ndarray | None = None) -> onnx.ModelProto:
    """The target: any S >= 1 new tokens over any P >= 0 committed ones (prefill and verify).

    I/O: ``contracts.target_io``. ``aux_hidden`` [1, S, 3H] = concat of the residual
    stream entering layer i for each aux id (id 0 = embeddings; id L = the last layer's
    output before the final norm). Tied models share the embedding for the head.
    ``kv="inplace"``: the ONNX Runtime flavour over in-place buffers of ``cache_len`` rows
    (contracts.py; float32/float16 only: GroupQueryAttention's CPU kernel has no bfloat16).
    ``head="screened"``: int8 logits for an exact greedy argmax beside the fp32 head
    (specrt/head.py; float32 graphs; ``outliers``: the channels kept in fp32), with
    ``head_hidden`` and ``head_norms`` out; ``head="hidden"``: the full head and
    ``head_hidden`` (to choose those channels).
    """
    if kv not in C.KV_LAYOUTS:
        raise InternalError(f"kv layout {kv!r} is not one of {C.KV_LAYOUTS}")
    if kv == "inplace" and (dtype not in ("float32", "float16") or not cache_len or cache_len < 1):
        raise InternalError(f"in-place KV needs float32/float16 and a cache length (got {dtype}, {cache_len})")
    aux = tuple(int(i) for i in aux_layer_ids)
    if not aux or not all(0 <= i <= cfg.num_layers for i in aux):
        raise UserError(f"aux layer ids {list(aux)}: expected 1 or more ids (3 by default) in [0, {cfg.num_layers}]")
    b = ops.GraphBuilder(dtype)
    H, V = cfg.hidden_size, cfg.vocab_size
    if kv == "inplace":
        W = _weights(b, ops.fusing_get(get))
        h = b.reshape(_inplace_layers(b, cfg, W, aux, int(cache_len)), -1, H)  # the final norm's output
        # only rows logits_from.. reach the head (contracts.py "Logits of the last rows only")
        h = b.op("Slice", h, b.reshape(C.LOGITS_FROM, 1), b.ints(np.iinfo(np.int64).max), b.ints(0))
    else:
        W = _weights(b, get)
        ctx = ops.attn_context(b, C.POSITION_IDS, C.past_key(0), cfg)
        taps: dict[int, str] = {}
        h = _layers(b, cfg, ops.embed(b, C.INPUT_IDS, W("embed"), H), ctx, W, 0, taps)
        b.reshape(b.op("Concat", *[taps[i] for i in aux], axis=-1), 1, -1, len(aux) * H, out=C.AUX_HIDDEN)
        h = ops.rmsnorm(b, h, W("final_norm"), cfg.rms_norm_eps)
    head_slot = "embed" if cfg.tie_word_embeddings else "lm_head"
    if head == "screened":
        if dtype != "float32":
            raise UserError(f"a screened head needs a float32 target (this one is {dtype})")
        if outliers is None:
            raise InternalError("a screened head needs its outlier channels (specrt/head.py)")
        _screened_head(b, h, W(head_slot), get(head_slot), V, H, outliers)
    elif head in ("full", "hidden"):
        # Tied: Gemm(transB=1) reads the embedding table itself, stored once.
        ops.lm_head(b, h, W(head_slot), V, C.LOGITS)
        if head == "hidden":  # the build's calibration of a screened head (engines/onnxruntime.py)
            b.reshape(h, 1, -1, H, out=C.HEAD_HIDDEN)
    else:
        raise InternalError(f"head {head!r} is not one of {C.HEADS}")
    io = C.target_io(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, V, H, dtype, kv=kv, head=head, num_aux=len(aux))
    return b.model(io, "specrt_target", f"target {cfg.model_type}, aux ids {list(aux)}"
                   + (f", in-place KV of {cache_len} rows (ONNX Runtime GroupQueryAttention)" if kv == "inplace" else ""))


def _screened_head(b: ops.GraphBuilder, h: str, w_name: str, w: np.ndarray, V: int, H: int,
                   outliers: np.ndarray) -> None:
    """h [S, H] -> ``head_hidden`` [1, S, H] = h, and behind an If on the ``head_exact``
    input (bool []): true, the fp32 head's ``logits`` (``w_name``, the graph's own weight)
    and zero ``head_norms``; false, screened ``logits`` (the outlier channels' fp32 product
    + the rest's MatMulInteger with each row's h quantized on its own scale) and
    ``head_norms`` [1, S, 2] = (||h_R||, ||h_R - h'_R||) (specrt/head.py)."""
    from onnx import TensorProto, helper, numpy_helper

    from specrt.head import HMAX, quantize_head, rest_channels

    outliers = np.asarray(outliers, np.int64)
    rest = rest_channels(H, outliers)
    q, s, _ = quantize_head(w, outliers)
    g = b.proto.graph
    for name, a in (("head_q", np.ascontiguousarray(q.T)),  # [|R|, V] int8
                    ("head_scale", s),  # [V]
                    ("head_w_outlier", np.ascontiguousarray(np.asarray(w, np.float32)[:, outliers].T)),  # [k, V]
                    ("head_outlier_ids", outliers), ("head_rest_ids", rest)):
        g.initializer.add().CopyFrom(numpy_helper.from_array(a, name))
    f = lambda x: b.const(np.float32(x), "float32")  # noqa: E731
    outer, b.nodes = b.nodes, []
    # the exact branch: the full head, as a "full" graph computes it
    exact = b.reshape(ops.linear(b, h, w_name), 1, -1, V)
    zero = b.op("ConstantOfShape", b.op("Concat", b.op("Shape", h, end=-1), b.ints(2), axis=0),
                value=numpy_helper.from_array(np.zeros(1, np.float32)))
    zero = b.reshape(zero, 1, -1, 2)
    then_nodes, b.nodes = b.nodes, []
    # the screened branch
    h_o = b.op("Gather", h, "head_outlier_ids", axis=-1)
    h_r = b.op("Gather", h, "head_rest_ids", axis=-1)
    # per row: t = max|h_R| / 127 (a tiny floor keeps an all-zero row finite: q = 0, exact)
    t = b.op("Max", b.op("Div", b.op("ReduceMax", b.op("Abs", h_r), axes=[-1], keepdims=1), f(HMAX)), f(1e-30))
    qf = b.op("Clip", b.op("Round", b.op("Div", h_r, t)), f(-HMAX), f(HMAX))
    qu = b.op("Cast", b.op("Add", qf, f(128)), to=TensorProto.UINT8)
    acc = b.op("Cast", b.op("MatMulInteger", qu, "head_q", b.const(np.uint8(128), "uint8")), to=TensorProto.FLOAT)
    rest_part = b.op("Mul", b.op("Mul", acc, "head_scale"), t)
    approx = b.reshape(b.op("Add", rest_part, b.op("MatMul", h_o, "head_w_outlier")), 1, -1, V)
    norms = b.op("Concat", b.op("ReduceL2", h_r, axes=[-1], keepdims=1),
                 b.op("ReduceL2", b.op("Sub", h_r, b.op("Mul", qf, t)), axes=[-1], keepdims=1), axis=-1)
    norms = b.reshape(norms, 1, -1, 2)
    else_nodes, b.nodes = b.nodes, outer

    def branch(nodes, outs, name):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outs])

    b.ops("If", [C.HEAD_EXACT], 2, outs=[C.LOGITS, C.HEAD_NORMS],
          then_branch=branch(then_nodes, [exact, zero], "head_exact"),
          else_branch=branch(else_nodes, [approx, norms], "head_screened"))
    b.reshape(h, 1, -1, H, out=C.HEAD_HIDDEN)


# ---- drafts ----------------------------------------------------------------------------


def _check_draft(dc: DraftConfig) -> None:
    """(Nothing refused now: ``norm_output``, speculators' opt-in EAGLE 3.1 flag (default false), is
    built by build_eagle3_graph; for P-EAGLE it changes nothing, its head normalises
    either way and no hidden state goes on to another step.)"""


def _pre_fc(x, dc: DraftConfig, get: ops.Get, b: ops.GraphBuilder | None = None, W=None):
    """The optional norms on the n*Ht aux input before fc (n = dc.num_aux): input_norm over
    all of it (norm_before_fc), then fc_norm.j over each Ht part (fc_norm). On a graph tensor when
    ``b``/``W`` are given, else on a numpy array (constants folded at export)."""
    eps = dc.decoder.rms_norm_eps

    def norm(v, slot):
        return ops.np_rmsnorm(v, get(slot), eps) if b is None else ops.rmsnorm(b, v, W(slot), eps)

    if dc.norm_before_fc:
        x = norm(x, "input_norm")
    if dc.fc_norm:
        n = dc.num_aux
        parts = np.split(x, n, axis=-1) if b is None else b.ops("Split", [x], n, axis=-1) if n > 1 else [x]
        normed = [norm(p, f"fc_norm.{j}") for j, p in enumerate(parts)]
        x = np.concatenate(normed, axis=-1) if b is None else b.op("Concat", *normed, axis=-1)
    return x


def _fc_aux(b: ops.GraphBuilder, dc: DraftConfig, get: ops.Get, W, target_hidden: int) -> str:
    """aux_hidden [1, A, n*Ht] -> g = fc(norms(aux)) [A, H]."""
    x = _pre_fc(b.reshape(C.DRAFT_AUX_IN, -1, dc.num_aux * target_hidden), dc, get, b, W)
    return ops.linear(b, x, W("fc"))


def _draft_body(b: ops.GraphBuilder, dc: DraftConfig, W, g: str) -> str:
    """EAGLE-3 layer 0 then ordinary layers; g [S, H] -> pre-norm output [S, H].

    Layer 0: x = concat(input_layernorm(embed(tok)), hidden_norm(g)) [S, 2H] into q/k/v;
    residual = g, or hidden_norm(g) when norm_before_residual.
    """
    cfg = dc.decoder
    eps = cfg.rms_norm_eps
    ctx = ops.attn_context(b, C.POSITION_IDS, C.past_key(0), cfg, window=dc.attention_window)
    e = ops.rmsnorm(b, ops.embed(b, C.INPUT_IDS, W("embed"), cfg.hidden_size), W("layers.0.attn_norm"), eps)
    gn = ops.rmsnorm(b, g, W("layers.0.hidden_norm"), eps)
    x = b.op("Concat", e, gn, axis=-1)
    h = ops.decoder_layer(b, cfg, gn if dc.norm_before_residual else g, ctx, W, 0, _kv_names(0), attn_in=x)
    return _layers(b, cfg, h, ctx, W, 1)


def _draft_head(b: ops.GraphBuilder, dc: DraftConfig, get: ops.Get, W, h: str, normed: bool = False) -> None:
    """h [K, H] -> draft_logits [1, K, Vd] (times logit_scale) and draft_token_ids [1, K] in target
    ids (``normed``: h has been through the final norm already); with a confidence head also
    draft_confidence [1, K] = sigmoid(confidence_head(normed h)), DeepSpec DSpark's
    AcceptRatePredictor on the hidden state its LM head reads."""
    Vd = dc.draft_vocab_size
    if not normed:
        h = ops.rmsnorm(b, h, W("final_norm"), dc.decoder.rms_norm_eps)
    # vLLM's LogitsProcessor(scale=logit_scale): the draft-vocabulary logits times it
    logits = ops.lm_head(b, h, W("lm_head"), Vd, C.DRAFT_LOGITS, scale=dc.logit_scale)
    if dc.confidence_head:  # w . h as a mean of products, not a MatMul: no int8 form quantizes it
        H = dc.decoder.hidden_size
        dot = b.op("ReduceMean", b.op("Mul", h, W("confidence_head")), axes=[-1], keepdims=0)  # [K]
        z = b.op("Add", b.op("Mul", dot, b.const(np.float32(H), b.dtype)), W("confidence_head_bias"))
        b.reshape(b.op("Sigmoid", z), 1, -1, out=C.DRAFT_CONFIDENCE)
    if Vd < dc.decoder.vocab_size:
        ids = b.op("ArgMax", logits, axis=-1, keepdims=0)  # [1, K] draft ids
        # target_id = draft_id + d2t[draft_id]
        d2t = b.const(np.asarray(get("d2t"), dtype=np.int64), "int64")
        b.op("Add", ids, b.op("Gather", d2t, ids), out=C.DRAFT_TOKENS)
    else:
        b.op("ArgMax", logits, axis=-1, keepdims=0, out=C.DRAFT_TOKENS)


def _target_hidden(dc: DraftConfig, get: ops.Get) -> tuple[int, np.ndarray]:
    fc = get("fc")  # [H, n*Ht]
    n = dc.num_aux
    if fc.shape[0] != dc.decoder.hidden_size or fc.shape[1] % n:
        raise UserError(f"draft fc weight has shape {list(fc.shape)}, "
                        f"expected [{dc.decoder.hidden_size}, {n} * target hidden size]")
    return fc.shape[1] // n, fc


def build_peagle_graph(draft_cfg: DraftConfig, get: ops.Get, dtype: str = "float32") -> onnx.ModelProto:
    """One P-EAGLE parallel drafting pass (DESIGN.md §3). I/O: ``contracts.peagle_io``.

    Slots: A real (g = fc(aux)), then M mask slots (g = fc(mask_hidden), folded to a
    constant here); M = S - A from the input shapes. Logits at the last real slot and the
    M mask slots: K = M + 1 rows. Needs A >= 1.
    """
    dc = draft_cfg
    _check_draft(dc)
    if dc.kind != "peagle":
        raise UserError(f"build_peagle_graph needs a P-EAGLE draft, got speculators_model_type '{dc.kind}'")
    cfg = dc.decoder
    H = cfg.hidden_size
    Ht, fc = _target_hidden(dc, get)
    b = ops.GraphBuilder(dtype)
    W = _weights(b, get)
    g_real = _fc_aux(b, dc, get, W, Ht)  # [A, H]
    mask_g = _pre_fc(np.asarray(get("mask_hidden"), np.float32).reshape(1, dc.num_aux * Ht), dc, get) @ fc.astype(np.float32).T
    n_aux, n_new = b.dim(C.DRAFT_AUX_IN, 1), b.dim(C.INPUT_IDS, 1)
    n_mask = b.op("Sub", n_new, n_aux)
    g_mask = b.op("Expand", b.const(mask_g, dtype), b.op("Concat", n_mask, b.ints(H), axis=0))  # [M, H]
    h = _draft_body(b, dc, W, b.op("Concat", g_real, g_mask, axis=0))
    # rows A-1 .. S-1: the last real slot and the mask slots
    last_real = b.op("Sub", n_aux, b.ints(1))
    h = b.op("Slice", h, last_real, n_new, b.ints(0))
    _draft_head(b, dc, get, W, h)
    io = C.peagle_io(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dc.draft_vocab_size, Ht, dtype,
                     confidence=dc.confidence_head, num_aux=dc.num_aux)
    return b.model(io, "specrt_peagle", f"P-EAGLE draft, mask_token_id {dc.mask_token_id}")


def build_eagle3_graph(draft_cfg: DraftConfig, get: ops.Get, dtype: str = "float32") -> onnx.ModelProto:
    """One sequential EAGLE-3 step over S = A + B positions. I/O: ``contracts.eagle3_io``.

    g = concat(fc(aux_hidden) [A, H], prev_hidden [B, H]); outputs logits, greedy target
    ids and hidden_out (the draft's pre-norm output, the next step's prev_hidden) for all S.
    With ``norm_output`` (speculators' eagle3/core.py: ``hidden_states = self.norm(...)``
    before the head) hidden_out is the final norm's output, which the next step takes.
    """
    dc = draft_cfg
    _check_draft(dc)
    cfg = dc.decoder
    H = cfg.hidden_size
    Ht, _ = _target_hidden(dc, get)
    b = ops.GraphBuilder(dtype)
    W = _weights(b, get)
    g = b.op("Concat", _fc_aux(b, dc, get, W, Ht), b.reshape(C.DRAFT_PREV_HIDDEN, -1, H), axis=0)
    h = _draft_body(b, dc, W, g)
    if dc.norm_output:
        h = ops.rmsnorm(b, h, W("final_norm"), cfg.rms_norm_eps)
    b.reshape(h, 1, -1, H, out=C.DRAFT_HIDDEN_OUT)
    _draft_head(b, dc, get, W, h, normed=dc.norm_output)
    io = C.eagle3_io(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dc.draft_vocab_size, H, Ht, dtype,
                     confidence=dc.confidence_head, num_aux=dc.num_aux)
    return b.model(io, "specrt_eagle3", "EAGLE-3 draft step")


# ---- saving ----------------------------------------------------------------------------


def tensor_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def save_model(model: onnx.ModelProto, path: str | Path, external_data: bool | None = None) -> Path:
    """Write ``model`` to ``path``; weights go to ``<name>.data`` beside it when
    ``external_data`` is true, or (None) when they exceed ~1.5 GB.

    Memory: neither way holds a second copy of the weights. A single file is streamed
    one tensor at a time (``onnx.save_model`` would serialise the whole model, twice
    over inside protobuf); with external data onnx writes tensor by tensor, and the
    model object is modified in place (its tensors become references to the data file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if external_data is None:
        external_data = tensor_bytes(model) > EXTERNAL_DATA_THRESHOLD
    if not external_data:
        _write_streamed(model, path)
        return path
    location = path.name + ".data"
    data = path.parent / location
    if data.exists():  # onnx appends to an existing data file
        os.remove(data)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=1024)
    return path


# Protobuf wire format: a length-delimited field is varint(field << 3 | 2), varint(len), bytes.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    return _varint(number << 3 | 2) + _varint(length)


def _without(msg, skip: str):
    """A copy of ``msg`` without field ``skip`` (the big field is never copied)."""
    out = type(msg)()
    for fd, v in msg.ListFields():
        if fd.name == skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == fd.LABEL_REPEATED
        if repeated:
            getattr(out, fd.name).extend(v)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(out, fd.name).CopyFrom(v)
        else:
            setattr(out, fd.name, v)
    return out


def _tensor_chunks(t: onnx.TensorProto) -> tuple[int, list]:
    """(encoded length, pieces) of one initializer: its header fields, then raw_data, which
    is fetched only when written (one copy of one tensor at a time)."""
    if not t.raw_data:
        b = t.SerializeToString()
        return len(b), [b]
    # Our initializers carry name, dims, data_type and raw_data only; copying the header
    # field by field avoids materialising raw_data here. _write_streamed checks the sizes.
    head = onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type).SerializeToString()
    return t.ByteSize(), [head, t]


def _write_streamed(model: onnx.ModelProto, path: Path) -> None:
    """The model's protobuf encoding, written field by field: the model without its graph,
    then the graph field, whose initializers follow one at a time. Parsers accept fields
    in any order, so the file reads back as exactly ``model``."""
    graph = _without(model.graph, "initializer").SerializeToString()
    tensors = [_tensor_chunks(t) for t in model.graph.initializer]
    graph_len = len(graph) + sum(len(_field(_GRAPH_INITIALIZER, n)) + n for n, _ in tensors)
    with open(path, "wb") as f:
        f.write(_without(model, "graph").SerializeToString())
        f.write(_field(_MODEL_GRAPH, graph_len) + graph)
        for n, pieces in tensors:
            f.write(_field(_GRAPH_INITIALIZER, n))
            for p in pieces:
                if isinstance(p, bytes):
                    f.write(p)
                    continue
                raw = p.raw_data
                head = _field(_TENSOR_RAW_DATA, len(raw))
                if len(pieces[0]) + len(head) + len(raw) != n:
                    raise InternalError(f"initializer '{p.name}' has fields besides name/dims/data_type/raw_data")
                f.write(head)
                f.write(raw)
                del raw
