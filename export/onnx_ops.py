"""Building blocks of the Llama-family graphs, written with ``onnx.helper``.

Every function appends nodes to a ``GraphBuilder`` and returns the name of its output
tensor. Conventions of the export's (portable) graphs (batch is always 1, so the residual
stream is kept 2-D):

* hidden states are ``[S, H]`` (S new tokens); projections are ``Gemm(x, W, transB=1)``
  on the checkpoint's ``[out, in]`` weights, so no weight is ever transposed or copied;
* float tensors are in the graph dtype ``b.dtype`` (float32/float16/bfloat16); RMSNorm
  statistics, the RoPE tables and the softmax are computed in float32;
* opset 17, default domain only (TensorRT's ONNX parser reads it).

The in-place KV flavour for ONNX Runtime (``ort_decoder_layer``) is written in ONNX
Runtime's own ops and laid out as onnxruntime-genai's builder lays out its models (10
ops per layer against 14), so that the two runtimes are compared graph for graph: a
``[1, S, H]`` residual, ``MatMul`` over pre-transposed ``[in, out]`` weights (slots
``<slot>.T`` of ``fusing_get``), each residual add fused into the norm that follows it
(``com.microsoft.SkipSimplifiedLayerNormalization``), and
``com.microsoft.GroupQueryAttention`` on packed q/k/v over in-place KV buffers. Measured
on SmolLM2-135M: the same speed per step as onnxruntime-genai's own model (median
0.99-1.00x over 6 processes, S = 1 and 2), and as this module's earlier 2-D in-place
layout within noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from specrt.contracts import GraphIO, TensorSpec
from specrt.errors import UserError
from specrt.export.config import DecoderConfig, RopeConfig

OPSET = 17
DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
_ELEM = {**DTYPES, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}

# Score of a masked key: finite, so a fully masked row could never produce NaN via inf-inf.
# Applied to float32 scores only (it does not fit in float16).
MASKED = np.float32(-1e30)
INT64_MAX = np.iinfo(np.int64).max  # a Slice end meaning "to the end"

Get = Callable[[str], np.ndarray]


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"dtype '{dtype}' is not supported (supported: {', '.join(DTYPES)})")


def _bf16_bits(a: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bit patterns (uint16), round to nearest even, as torch does."""
    if a.dtype.name == "bfloat16":  # already bf16 (ml_dtypes): reinterpret, no rounding
        return a.view(np.uint16)
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def to_tensor(name: str, a: np.ndarray, dtype: str) -> onnx.TensorProto:
    """numpy -> TensorProto in ``dtype`` ("float32"/"float16"/"bfloat16"/"int64"/"bool")."""
    if dtype == "bfloat16":
        bits = _bf16_bits(np.asarray(a))
        return helper.make_tensor(name, TensorProto.BFLOAT16, bits.shape, bits.tobytes(), raw=True)
    if dtype == "float16" and np.asarray(a).dtype.kind == "f":
        big = np.abs(np.asarray(a, np.float32)[np.isfinite(a)])  # finite weights past float16's range become inf
        if big.size and big.max() > np.finfo(np.float16).max:
            raise UserError(f"weight '{name}' holds {float(big.max()):.4g}, past float16's range (65504); "
                            "export it in float32 or bfloat16")
    return numpy_helper.from_array(np.asarray(a, dtype=np.dtype(dtype)), name)


class GraphBuilder:
    """Accumulates nodes and initializers; names every node and intermediate uniquely."""

    def __init__(self, dtype: str):
        check_dtype(dtype)
        self.dtype = dtype
        self.elem = DTYPES[dtype]
        self.nodes: list[onnx.NodeProto] = []
        # Initializers are written straight into the final model's graph: make_graph and
        # make_model would each copy every tensor (3x the weights at peak).
        self.proto = onnx.ModelProto()
        self._count: dict[str, int] = {}
        self._consts: dict[tuple, str] = {}
        self._weights: set[str] = set()
        self.domains: set[str] = set()  # non-default opset domains used (com.microsoft)

    def fresh(self, base: str) -> str:
        n = self._count.get(base, 0)
        self._count[base] = n + 1
        return f"{base}_{n}"

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """One node with one output; returns the output name (``out`` names a graph output)."""
        return self.ops(op_type, list(inputs), 1, outs=[out] if out else None, **attrs)[0]

    def ops(self, op_type: str, inputs: list[str], n_out: int, outs: list[str] | None = None, **attrs) -> list[str]:
        name = self.fresh(op_type)
        outs = outs or [f"{name}/out{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs

    # ---- initializers -------------------------------------------------------------

    def has_weight(self, name: str) -> bool:
        return name in self._weights

    def weight(self, name: str, a: np.ndarray) -> str:
        """A weight in the graph dtype, named by its slot (each slot stored once)."""
        if name not in self._weights:
            self.proto.graph.initializer.add().CopyFrom(to_tensor(name, a, self.dtype))
            self._weights.add(name)
        return name

    def const(self, value, dtype: str) -> str:
        """A small constant (shapes, eps, scales), deduplicated by value."""
        a = np.asarray(value)
        key = (dtype, a.shape, a.tobytes())
        if key not in self._consts:
            name = self.fresh("const")
            self.proto.graph.initializer.add().CopyFrom(to_tensor(name, a, dtype))
            self._consts[key] = name
        return self._consts[key]

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64), "int64")

    def f32(self, x: str) -> str:
        return x if self.dtype == "float32" else self.op("Cast", x, to=TensorProto.FLOAT)

    def model_dtype(self, x: str) -> str:
        return x if self.dtype == "float32" else self.op("Cast", x, to=self.elem)

    def reshape(self, x: str, *shape: int, out: str | None = None) -> str:
        return self.op("Reshape", x, self.ints(*shape), out=out)

    def dim(self, x: str, axis: int) -> str:
        """int64 [1]: the runtime size of ``x`` along ``axis``."""
        return self.op("Shape", x, start=axis, end=axis + 1)

    # ---- the model ----------------------------------------------------------------

    def value_info(self, t: TensorSpec) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(t.name, _ELEM[t.dtype], list(t.shape))

    def model(self, io: GraphIO, graph_name: str, doc: str = "") -> onnx.ModelProto:
        """The finished model (call once: the builder hands over its proto, not a copy)."""
        m, g = self.proto, self.proto.graph
        g.name, g.doc_string = graph_name, doc
        g.node.extend(self.nodes)
        g.input.extend(self.value_info(t) for t in io.inputs)
        g.output.extend(self.value_info(t) for t in io.outputs)
        m.opset_import.append(helper.make_opsetid("", OPSET))
        for d in sorted(self.domains):
            m.opset_import.append(helper.make_opsetid(d, 1))
        m.producer_name = "specrt"
        m.ir_version = 8  # opset 17 needs IR >= 8; the lowest keeps older TensorRT/ORT readers happy
        return m


# ---- numerics ------------------------------------------------------------------------


def rmsnorm(b: GraphBuilder, x: str, w: str, eps: float) -> str:
    """y = w * x / sqrt(mean(x^2, -1) + eps), statistics in float32 (as transformers'
    LlamaRMSNorm: normalise in fp32, cast back, then scale). Shape preserved.
    The Pow/ReduceMean/Add/Sqrt/Div chain is the pattern ONNX Runtime fuses."""
    xf = b.f32(x)
    var = b.op("ReduceMean", b.op("Pow", xf, b.const(np.float32(2), "float32")), axes=[-1], keepdims=1)
    y = b.op("Div", xf, b.op("Sqrt", b.op("Add", var, b.const(np.float32(eps), "float32"))))
    return b.op("Mul", b.model_dtype(y), w)


def np_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """The same RMSNorm in numpy (float32), for constants folded at export."""
    x = x.astype(np.float32)
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))) * w.astype(np.float32)


def linear(b: GraphBuilder, x: str, w: str, bias: str | None = None) -> str:
    """x [M, in] @ W^T + bias, W in HF layout [out, in] -> [M, out]."""
    return b.op("Gemm", x, w, *([bias] if bias else []), transB=1)


def silu(b: GraphBuilder, x: str) -> str:
    return b.op("Mul", x, b.op("Sigmoid", x))


@dataclass(frozen=True)
class AttnContext:
    """Per-graph tensors every attention layer shares.

    cos, sin_signed: [S, 1, D] in the graph dtype; future: bool [g*S, S], true where the
    key's position is after the query's; past_len: int64 [1] = P, where the new score
    block starts along the key axis.
    """

    cos: str
    sin: str
    future: str
    past_len: str
    # a sliding window (draft graphs): bool [g*S, P], true where a past key is older than
    # the query's window; None: every past key visible
    past_masked: str | None = None


def rope_tables(b: GraphBuilder, position_ids: str, inv_freq: np.ndarray, scale: float = 1.0) -> tuple[str, str]:
    """cos/sin for rotate_half RoPE, computed in float32 from position_ids [1, S].

    freqs[s, j] = pos[s] * inv_freq[j] (j < D/2); cos = [cos f, cos f];
    sin_signed = [-sin f, sin f], so that rotate_half(x) * sin == swap_halves(x) * sin_signed.
    Both are multiplied by ``scale`` (YaRN's attention factor) when it is not 1. Returns two
    [S, 1, D] tensors in the graph dtype (transformers casts them the same way).
    """
    pos = b.reshape(b.op("Cast", position_ids, to=TensorProto.FLOAT), -1, 1)  # [S, 1]
    freqs = b.op("Mul", pos, b.const(inv_freq, "float32"))  # [S, D/2], float32 as transformers'
    c, s = b.op("Cos", freqs), b.op("Sin", freqs)
    if scale != 1.0:
        f = b.const(np.float32(scale), "float32")
        c, s = b.op("Mul", c, f), b.op("Mul", s, f)
    cos = b.op("Concat", c, c, axis=-1)
    sin = b.op("Concat", b.op("Neg", s), s, axis=-1)
    d = 2 * len(inv_freq)
    return b.model_dtype(b.reshape(cos, -1, 1, d)), b.model_dtype(b.reshape(sin, -1, 1, d))


def apply_rope(b: GraphBuilder, x: str, cos: str, sin: str) -> str:
    """x [S, heads, D] -> x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]."""
    x1, x2 = b.ops("Split", [x], 2, axis=-1)  # equal halves of D
    swapped = b.op("Concat", x2, x1, axis=-1)
    return b.op("Add", b.op("Mul", x, cos), b.op("Mul", swapped, sin))


def attn_context(b: GraphBuilder, position_ids: str, past_key0: str, cfg: DecoderConfig,
                 window: int | None = None) -> AttnContext:
    """RoPE tables, the causal mask among the S new tokens, and the past length P. With a
    ``window`` W (a draft trained on sliding-window attention, speculators' mask: key j
    visible to query i while pos_i - pos_j < W) keys W or more positions back are masked
    too, the past's included: past row j holds position j (the draft KV's real slots). The
    window is counted from each query's position: EAGLE-3's step k (position anchor + k)
    sees k keys fewer than speculators' training gave it, which counts from the anchor's
    index (acceptance only, past W tokens; P-EAGLE's mask slots match training)."""
    cos, sin = rope_tables(b, position_ids, cfg.rope.inv_freq(), cfg.rope.attention_factor)
    g = cfg.num_heads // cfg.num_kv_heads
    # future[r, j] = pos[j] > pos[query of row r]: that query may not see new key j (the past
    # is always visible). Query rows are laid out (group, token) -> row group*S + token.
    q_pos = b.reshape(position_ids, -1, 1)  # [S, 1]
    if g > 1:
        q_pos = b.op("Tile", q_pos, b.ints(g, 1))  # [g*S, 1]
    future = b.op("Greater", position_ids, q_pos)  # [g*S, S]
    past_len = b.dim(past_key0, 1)
    if window is None:
        return AttnContext(cos, sin, future, past_len)
    oldest = b.op("Sub", q_pos, b.ints(int(window) - 1))  # [g*S, 1]: the oldest position still seen
    future = b.op("Or", future, b.op("Less", position_ids, oldest))
    zero, one = b.const(np.array(0, np.int64), "int64"), b.const(np.array(1, np.int64), "int64")
    past_pos = b.op("Unsqueeze", b.op("Range", zero, b.reshape(past_len), one), b.ints(0))  # [1, P]
    return AttnContext(cos, sin, future, past_len, b.op("Less", past_pos, oldest))  # [g*S, P]


@dataclass(frozen=True)
class InplaceContext:
    """Per-graph tensors of the in-place flavour: GroupQueryAttention's ``seqlens_k``
    (int32 [1] = the last new token's buffer slot) and ``total_sequence_length`` (int32
    scalar = that slot + 1), the tokens' ``position_ids`` (int64 [1, S], for RoPE), the
    ``attention_bias`` [1, 1, S, past + S] of a token tree (see ``inplace_context``) and
    the RoPE caches [C, D/2], all but the ints in the graph dtype."""

    seqlens_k: str
    total: str
    cos_cache: str
    sin_cache: str
    position_ids: str
    bias: str


def inplace_context(b: GraphBuilder, position_ids: str, cfg: DecoderConfig, cache_len: int) -> InplaceContext:
    """GroupQueryAttention writes the S new tokens' K/V at buffer slots past .. past + S - 1
    (past = the first token's position, the committed length) and rotates each token at
    its own position. New token i sees the past and every new token j with position_j <
    position_i, and itself: for consecutive positions that is the causal mask; for a
    token tree laid out as a chain x, a1 .. ad followed by siblings of a1 (each at a1's
    position, contracts.py "Token trees") it is the tree's: a sibling sees x and the past
    only. The runner checks that positions have one of these two forms."""
    pos = b.reshape(position_ids, -1)  # int64 [S]
    first = b.op("Gather", pos, b.ints(0))  # int64 [1]: the committed length
    s = b.dim(position_ids, 1)  # int64 [1]
    last = b.op("Sub", b.op("Add", first, s), b.ints(1))  # the last new token's slot
    seqlens = b.op("Cast", last, to=TensorProto.INT32)
    total = b.op("Cast", b.reshape(b.op("Add", last, b.ints(1))), to=TensorProto.INT32)
    idx = b.op("Range", b.const(np.array(0, np.int64), "int64"), b.reshape(s), b.const(np.array(1, np.int64), "int64"))
    visible = b.op("Or", b.op("Less", b.op("Unsqueeze", pos, b.ints(0)), b.op("Unsqueeze", pos, b.ints(1))),
                   b.op("Equal", b.op("Unsqueeze", idx, b.ints(0)), b.op("Unsqueeze", idx, b.ints(1))))  # [S, S]
    lowest = np.finfo(np.float16 if b.dtype == "float16" else np.float32).min  # exp() of it is 0
    new = b.op("Where", visible, b.const(np.array(0.0, np.float32), "float32"),
               b.const(np.array(lowest, np.float32), "float32"))
    past = b.op("ConstantOfShape", b.op("Concat", s, first, axis=0),
                value=numpy_helper.from_array(np.zeros(1, np.float32)))  # [S, past]: all visible
    bias = b.model_dtype(b.op("Unsqueeze", b.op("Concat", past, new, axis=1), b.ints(0, 1)))  # [1, 1, S, past + S]
    cos, sin = rope_cache(cfg.rope, cache_len)
    return InplaceContext(seqlens, total, b.const(cos, b.dtype), b.const(sin, b.dtype), position_ids, bias)


ROPE_ROWS = 4096  # rows of rope_cache's tables computed at a time (2 MB a float64 array at D/2 = 64)


def rope_cache(rope: RopeConfig, cache_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [cache_len, D/2] float32 of positions 0 .. cache_len - 1, as transformers'
    rotary embedding computes them: position times frequency in float32, its cos and sin
    (correctly rounded here) times the attention factor (YaRN's; 1 otherwise). A float64
    angle would differ from that float32 one by up to 1e-4 at position 4096, 4e-3 at 131072.
    The float64 cos and sin round correctly to float32 (numpy's float32 ones need not); they
    are taken ROPE_ROWS rows at a time, so the float64 copies stay ~6 MB whatever cache_len
    (a whole one was 67 MB at 131072 positions x 64)."""
    inv, scale = rope.inv_freq(), np.float32(rope.attention_factor)
    positions = np.arange(cache_len, dtype=np.float32)
    cos = np.empty((cache_len, inv.size), np.float32)
    sin = np.empty((cache_len, inv.size), np.float32)
    for start in range(0, cache_len, ROPE_ROWS):
        rows = slice(start, start + ROPE_ROWS)
        angle = (positions[rows, None] * inv[None, :]).astype(np.float64)  # the float32 products
        cos[rows], sin[rows] = np.cos(angle), np.sin(angle)  # (rounded to float32 on assignment)
    cos *= scale
    sin *= scale
    return cos, sin


def attention(b: GraphBuilder, cfg: DecoderConfig, x: str, ctx: AttnContext, W: Callable[[str], str], i: int,
              past_k: str, past_v: str, new_k: str, new_v: str) -> str:
    """Self-attention of layer i over the committed past and the S new tokens.

    x [S, in] -> [S, H]. Writes new_k/new_v [1, S, KVH, D] (keys after RoPE).
    GQA without repeating KV: query head h = kv*g + j uses kv head h // g, so the
    queries are regrouped to [1, KVH, g*S, D] and multiply each KV head once.
    Scores against the past [1, KVH, g*S, P] and against the new keys [.., S] are two
    blocks joined on the key axis; the past is never concatenated with the new KV.
    """
    NH, KVH, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = NH // KVH
    p = f"layers.{i}."
    bias = (lambda n: W(p + n)) if cfg.qkv_bias else (lambda n: None)
    q = b.reshape(linear(b, x, W(p + "q"), bias("q_bias")), -1, NH, D)  # [S, NH, D]
    k = b.reshape(linear(b, x, W(p + "k"), bias("k_bias")), -1, KVH, D)  # [S, KVH, D]
    v = b.reshape(linear(b, x, W(p + "v"), bias("v_bias")), 1, -1, KVH, D, out=new_v)  # [1, S, KVH, D]
    if cfg.qk_norm:  # Qwen3: RMSNorm over D of every head, before RoPE
        q = rmsnorm(b, q, W(p + "q_norm"), cfg.rms_norm_eps)
        k = rmsnorm(b, k, W(p + "k_norm"), cfg.rms_norm_eps)
    # 1/sqrt(D) folded into q (S*NH*D multiplies instead of NH*S*(P+S))
    q = b.op("Mul", apply_rope(b, q, ctx.cos, ctx.sin), b.const(np.float32(D ** -0.5), b.dtype))
    k = b.reshape(apply_rope(b, k, ctx.cos, ctx.sin), 1, -1, KVH, D, out=new_k)  # [1, S, KVH, D]

    q = b.op("Transpose", b.reshape(q, -1, KVH, g, D), perm=[1, 2, 0, 3])  # [KVH, g, S, D]
    q = b.reshape(q, 1, KVH, -1, D)  # [1, KVH, g*S, D]
    kt_past = b.op("Transpose", past_k, perm=[0, 2, 3, 1])  # [1, KVH, D, P]
    kt_new = b.op("Transpose", k, perm=[0, 2, 3, 1])  # [1, KVH, D, S]
    v_past = b.op("Transpose", past_v, perm=[0, 2, 1, 3])  # [1, KVH, P, D]
    v_new = b.op("Transpose", v, perm=[0, 2, 1, 3])  # [1, KVH, S, D]

    s_past = b.f32(b.op("MatMul", q, kt_past))  # [1, KVH, g*S, P]
    if ctx.past_masked is not None:
        s_past = b.op("Where", ctx.past_masked, b.const(MASKED, "float32"), s_past)
    s_new = b.f32(b.op("MatMul", q, kt_new))  # [1, KVH, g*S, S]
    s_new = b.op("Where", ctx.future, b.const(MASKED, "float32"), s_new)
    probs = b.model_dtype(b.op("Softmax", b.op("Concat", s_past, s_new, axis=-1), axis=-1))
    # Two Slices rather than a Split with runtime sizes, which TensorRT parses less surely.
    p_past = b.op("Slice", probs, b.ints(0), ctx.past_len, b.ints(-1))
    p_new = b.op("Slice", probs, ctx.past_len, b.ints(INT64_MAX), b.ints(-1))
    o = b.op("Add", b.op("MatMul", p_past, v_past), b.op("MatMul", p_new, v_new))  # [1, KVH, g*S, D]
    o = b.op("Transpose", b.reshape(o, KVH, g, -1, D), perm=[2, 0, 1, 3])  # [S, KVH, g, D]
    return linear(b, b.reshape(o, -1, NH * D), W(p + "o"))  # [S, H]


def mlp(b: GraphBuilder, x: str, W: Callable[[str], str], i: int) -> str:
    """SwiGLU: down(silu(gate x) * up x). [S, H] -> [S, H]."""
    p = f"layers.{i}."
    gate, up = linear(b, x, W(p + "gate")), linear(b, x, W(p + "up"))
    h = b.op("Mul", silu(b, gate), up)
    return linear(b, h, W(p + "down"))


# Slots of the in-place flavour made of checkpoint slots (concatenated on the output axis
# of the [out, in] weights): fused -> parts, "{i}" the layer.
FUSED_SLOTS = {"layers.{i}.qkv": ("layers.{i}.q", "layers.{i}.k", "layers.{i}.v"),
               "layers.{i}.qkv_bias": ("layers.{i}.q_bias", "layers.{i}.k_bias", "layers.{i}.v_bias")}


def fusing_get(get: Get) -> Get:
    """``get`` that also serves FUSED_SLOTS by concatenating their parts, and ``<slot>.T``
    as the [in, out] transpose of a 2-D slot (the in-place flavour's MatMul weights)."""
    import re

    def fused(slot: str) -> np.ndarray:
        if slot.endswith(".T"):
            return np.ascontiguousarray(np.asarray(fused(slot[:-2])).T)
        m = re.fullmatch(r"layers\.(\d+)\.(qkv|qkv_bias)", slot)
        if m is None:
            return get(slot)
        parts = FUSED_SLOTS["layers.{i}." + m.group(2)]
        return np.concatenate([np.asarray(get(t.format(i=m.group(1)))) for t in parts], axis=0)

    return fused


# ---- the in-place flavour (ONNX Runtime ops; module doc) ------------------------------


def ort_linear(b: GraphBuilder, x: str, w_t: str, bias: str | None = None) -> str:
    """x [1, S, in] @ w_t [in, out] (+ bias) -> [1, S, out]."""
    y = b.op("MatMul", x, w_t)
    return b.op("Add", y, bias) if bias else y


def ort_add_rmsnorm(b: GraphBuilder, h: str, y: str, w: str, eps: float) -> tuple[str, str]:
    """(rmsnorm(h + y), h + y): a residual add fused into the next norm."""
    b.domains.add("com.microsoft")
    normed, _, _, total = b.ops("SkipSimplifiedLayerNormalization", [h, y, w], 4,
                                outs=[b.fresh("skipnorm") + "/out", "", "", b.fresh("skipnorm") + "/sum"],
                                domain="com.microsoft", epsilon=float(eps))
    return normed, total


def ort_attention(b: GraphBuilder, cfg: DecoderConfig, x: str, ctx: InplaceContext, W: Callable[[str], str],
                  i: int, cache_k: str, cache_v: str, out_k: str, out_v: str) -> str:
    """Self-attention of layer i with ONNX Runtime's GroupQueryAttention on in-place KV
    buffers (contracts.py, "In-place KV"): RoPE (rotate_half, non-interleaved), the causal
    mask and the cache update happen inside the op. x [1, S, in] -> [1, S, H]."""
    NH, KVH, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = f"layers.{i}."
    # one MatMul over the fused [q; k; v] weight (FUSED_SLOTS)
    qkv = ort_linear(b, x, W(p + "qkv.T"), W(p + "qkv_bias") if cfg.qkv_bias else None)
    if cfg.qk_norm:  # Qwen3: RMSNorm over D of every head, before RoPE (which the op applies)
        q, k, v = b.ops("Split", [qkv, b.ints(NH * D, KVH * D, KVH * D)], 3, axis=-1)
        q = rmsnorm(b, b.reshape(q, 1, -1, NH, D), W(p + "q_norm"), cfg.rms_norm_eps)
        k = rmsnorm(b, b.reshape(k, 1, -1, KVH, D), W(p + "k_norm"), cfg.rms_norm_eps)
        q, k = b.reshape(q, 1, -1, NH * D), b.reshape(k, 1, -1, KVH * D)
    else:  # packed: the op reads q, k and v from the one [1, S, (NH + 2 KVH) D] tensor
        q, k, v = qkv, "", ""
    b.domains.add("com.microsoft")
    o, _, _ = b.ops("GroupQueryAttention", [q, k, v, cache_k, cache_v, ctx.seqlens_k, ctx.total,
                                            ctx.cos_cache, ctx.sin_cache, ctx.position_ids, ctx.bias], 3,
                    outs=[b.fresh("gqa") + "/out", out_k, out_v], domain="com.microsoft",
                    num_heads=NH, kv_num_heads=KVH, scale=float(D ** -0.5), do_rotary=1, rotary_interleaved=0)
    return ort_linear(b, o, W(p + "o.T"))


def ort_decoder_layer(b: GraphBuilder, cfg: DecoderConfig, h: str, x: str, ctx: InplaceContext,
                      W: Callable[[str], str], i: int, kv: tuple[str, str, str, str],
                      next_norm: str) -> tuple[str, str]:
    """Layer i on the residual h [1, S, H] whose normed value x the previous step made;
    returns (next_norm(h'), h') with h' the residual leaving the layer: the norm that
    follows (the next layer's, or the final one) is fused with the layer's last add."""
    eps = cfg.rms_norm_eps
    x, h = ort_add_rmsnorm(b, h, ort_attention(b, cfg, x, ctx, W, i, *kv), W(f"layers.{i}.mlp_norm"), eps)
    p = f"layers.{i}."
    gate, up = ort_linear(b, x, W(p + "gate.T")), ort_linear(b, x, W(p + "up.T"))
    y = ort_linear(b, b.op("Mul", silu(b, gate), up), W(p + "down.T"))
    return ort_add_rmsnorm(b, h, y, next_norm, eps)


def decoder_layer(b: GraphBuilder, cfg: DecoderConfig, h: str, ctx: AttnContext,
                  W: Callable[[str], str], i: int, kv: tuple[str, str, str, str], attn_in: str | None = None) -> str:
    """Pre-norm block: h += attn(norm(h)); h += mlp(norm(h)). h [S, H] is the residual.

    ``attn_in`` replaces norm(h) as the attention input (EAGLE-3 layer 0 reads
    concat(norm(embeds), norm(g)) of width 2H while its residual is g).
    """
    x = attn_in if attn_in is not None else rmsnorm(b, h, W(f"layers.{i}.attn_norm"), cfg.rms_norm_eps)
    h = b.op("Add", h, attention(b, cfg, x, ctx, W, i, *kv))
    x = rmsnorm(b, h, W(f"layers.{i}.mlp_norm"), cfg.rms_norm_eps)
    return b.op("Add", h, mlp(b, x, W, i))


def embed(b: GraphBuilder, input_ids: str, table: str, hidden: int) -> str:
    """input_ids [1, S] -> [S, H] rows of the embedding table."""
    return b.reshape(b.op("Gather", table, input_ids), -1, hidden)


def lm_head(b: GraphBuilder, h: str, w: str, vocab: int, out: str, scale: float = 1.0) -> str:
    """[S, H] -> logits [1, S, V], times ``scale`` where it is not 1 (vLLM's logit_scale)."""
    z = linear(b, h, w)
    if scale != 1.0:
        z = b.op("Mul", z, b.const(np.float32(scale), b.dtype))
    return b.reshape(z, 1, -1, vocab, out=out)
