"""Graph I/O contract: every input/output name, dtype and symbolic shape, in one place.

Export writes graphs with these names, engines bind them, the runtime feeds them.
Nothing else spells a tensor name.

KV cache decision (issue 3). Graphs take the committed past as ``[1, P, KVH, D]``
(sequence-major, "BSHD") and return only the keys/values of the ``S`` new positions
``[1, S, KVH, D]``; they never return a concatenated cache. The runtime owns one
preallocated buffer per layer and kind, ``[1, MAX, KVH, D]``, and a committed length
``n``:

* feed: ``buf[:, :n]`` is a contiguous prefix of that buffer, so it reaches ONNX
  Runtime as a view, with no copy and no allocation in Python;
* commit ``a`` accepted tokens: copy their ``a`` new rows into ``buf[:, n:n+a]`` and
  set ``n += a``: O(accepted);
* roll back rejected tokens: they were never written, so rollback is nothing: O(1).

Because the new rows come out separately, the graph computes attention to the past and
to the new tokens as two score blocks joined along the key axis (scores are tiny, the
KV is not), so no graph concatenates the cache either. Optimum's names
(``past_key_values.{i}.key``/``present.{i}.key``) are not reused for these tensors
because their layout (BHSD) and meaning (full cache) differ; ``input_ids``,
``position_ids`` and ``logits`` mean exactly what they mean in Optimum and keep its
names.

In-place KV (the ONNX Runtime engines' flavour, engines/build.py). ONNX Runtime's
GroupQueryAttention reads and writes one preallocated cache in place when its past and
present share a buffer, which removes every per-step transpose and copy of the cache
(measured on SmolLM2-135M at 256 past tokens, 1 thread: 40.6 ms per decode step with
the portable graph vs 33.7 ms for onnxruntime-genai's GQA graph, the gap being the
attention ops and their node count). Graphs of this flavour take the whole buffers
``cache_key.{i}``/``cache_value.{i}`` ``[1, KVH, C, D]`` ("BNSH", C = the engines'
context limit), write the S new rows at buffer slots n .. n + S - 1 (n = the first
position, the committed length; ``position_ids`` consecutive from n, or a token tree,
below), and return the same buffers as
``cache_key_out.{i}``/``cache_value_out.{i}`` (``GraphIO.aliases``: a runner binds each
such output to its input's memory). Commit is then ``n += a`` and rollback ``n = m``,
both O(1); rows past n are dead and are overwritten by the next call. TensorRT
engines keep the portable contract above.

Token trees (in-place graphs only). ``position_ids`` may also be a chain n, n + 1, ..,
n + d (d >= 1) followed by siblings of its second token, each at position n + 1: the
draft's runners-up for the first drafted position. The graph derives its attention mask
from the positions (new token i sees the past, itself and every new token at a smaller
position; GroupQueryAttention's ``attention_bias``, RoPE from ``position_ids``), so a
sibling sees x and the past but not the chain, and its logits and K/V row are those of
the chain x, sibling; its K/V row lands at slot n + d + 1 + j, and accepting it moves that
row to slot n + 1 (``KVCache.move_row``). For consecutive positions the mask is the
causal one: chains are unchanged.

Logits of the last rows only (in-place graphs only). ``logits_from`` (int64 []) is the
first new row whose ``logits`` (and a screened head's ``head_hidden``/``head_norms``) the
graph computes: it returns S - logits_from rows. A prefill feeds S - 1 (its first token
needs the last row; ``aux_hidden`` and the KV rows stay whole), which saves the head's
product over every other prompt row (S x H x V: 15% of a 1000-token prefill of
SmolLM2-135M) and its S x V output (197 MB there). Every other call feeds 0, the only
value a role with a fixed S may take (its runner binds the full [1, S, V] output). It
is optional: a runner feeds 0 when a caller leaves it out. Engines built before this
input lack it; the runtime then feeds nothing and reads the last row as before.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- names ---------------------------------------------------------------------------

INPUT_IDS = "input_ids"  # int64 [1, S]: token ids of the new positions
POSITION_IDS = "position_ids"  # int64 [1, S]: absolute positions of the new tokens
LOGITS = "logits"  # float [1, S, V]: target logits at every new position (rows logits_from.. in-place)
AUX_HIDDEN = "aux_hidden"  # float [1, S, 3H]: concat of the residual streams named by the aux ids
HEAD_HIDDEN = "head_hidden"  # float [1, S, H]: the head's input (screened heads only, specrt/head.py)
HEAD_NORMS = "head_norms"  # float [1, S, 2]: ||h_R||, ||h_R - h'_R|| (screened heads only)
HEAD_EXACT = "head_exact"  # bool []: a screened head's fp32 logits (true) or its screen (false)
LOGITS_FROM = "logits_from"  # int64 []: in-place targets: logits of new rows logits_from.. only (above)
HEADS = ("full", "screened")  # the target's head: exact logits, or int8 logits + head_hidden + head_norms

# Draft graphs.
DRAFT_AUX_IN = "aux_hidden"  # float [1, A, 3H_target]: target aux hidden of the real slots
DRAFT_PREV_HIDDEN = "prev_hidden"  # float [1, B, H]: EAGLE-3: the draft's own pre-norm output as g
DRAFT_LOGITS = "draft_logits"  # float [1, K, Vd]: logits over the draft vocabulary
DRAFT_TOKENS = "draft_token_ids"  # int64 [1, K]: greedy draft tokens, in TARGET ids (through d2t)
DRAFT_HIDDEN_OUT = "hidden_out"  # float [1, S, H]: EAGLE-3: pre-norm output for the next step
# float [1, K]: a DSpark confidence head's predicted acceptance of each draft position, sigmoid of
# a linear map of the head's input (drafts whose checkpoint has one: DeepSpec's confidence_head)
DRAFT_CONFIDENCE = "draft_confidence"


# the per-layer KV tensors' kinds: layer i's is KIND.i (the functions below); compare's tolerances
# are keyed by kind, and a name's kind is what comes before its dot
PAST_KEY, PAST_VALUE, NEW_KEY, NEW_VALUE, CACHE_KEY = "past_key", "past_value", "new_key", "new_value", "cache_key"
PAST_KV_PREFIXES = (f"{PAST_KEY}.", f"{PAST_VALUE}.")  # (str.startswith: any layer's past K or V)
NEW_KV_PREFIXES = (f"{NEW_KEY}.", f"{NEW_VALUE}.")


def past_key(i: int) -> str:
    """float [1, P, KVH, D]: committed keys of layer i (after RoPE)."""
    return f"{PAST_KEY}.{i}"


def past_value(i: int) -> str:
    """float [1, P, KVH, D]: committed values of layer i."""
    return f"{PAST_VALUE}.{i}"


def new_key(i: int) -> str:
    """float [1, S, KVH, D]: keys of the S new positions of layer i (after RoPE)."""
    return f"{NEW_KEY}.{i}"


def new_value(i: int) -> str:
    """float [1, S, KVH, D]: values of the S new positions of layer i."""
    return f"{NEW_VALUE}.{i}"


def cache_key(i: int) -> str:
    """float [1, KVH, C, D]: in-place flavour: layer i's whole key buffer (after RoPE), rows [0, n) valid."""
    return f"{CACHE_KEY}.{i}"


def cache_value(i: int) -> str:
    """float [1, KVH, C, D]: in-place flavour: layer i's whole value buffer."""
    return f"cache_value.{i}"


def cache_key_out(i: int) -> str:
    """The same buffer as cache_key(i), with the S new rows written (GraphIO.aliases)."""
    return f"cache_key_out.{i}"


def cache_value_out(i: int) -> str:
    return f"cache_value_out.{i}"


# a precision's short name -> the graph dtype of that name (build's --precision, export's --dtype take both)
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

KV_LAYOUTS = ("append", "inplace")  # portable past/new contract; in-place GQA buffers

# Symbolic dimension names used in the graphs' value infos.
DIM_NEW = "new_tokens"  # S
DIM_PAST = "past_tokens"  # P
DIM_AUX = "aux_tokens"  # A
DIM_PREV = "prev_tokens"  # B
DIM_DEPTH = "draft_depth"  # K
DIM_CACHE = "cache_tokens"  # C: rows of an in-place KV buffer (the context limit)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: "int64", "float32", "float16", "bfloat16"
    shape: tuple[int | str, ...]
    optional: bool = False  # an input a caller may leave out: the runner feeds zeros (engines/base.py)

    def to_json(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        return {**d, "optional": True} if self.optional else d


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    aliases: tuple[tuple[str, str], ...] = ()  # (output, input): the output is the input's buffer, updated

    def to_json(self) -> dict:
        d = {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}
        if self.aliases:
            d["aliases"] = {o: i for o, i in self.aliases}
        return d


def kv_specs(num_layers: int, kv_heads: int, head_dim: int, dtype: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ins, outs = [], []
    for i in range(num_layers):
        ins += [TensorSpec(past_key(i), dtype, (1, DIM_PAST, kv_heads, head_dim)),
                TensorSpec(past_value(i), dtype, (1, DIM_PAST, kv_heads, head_dim))]
        outs += [TensorSpec(new_key(i), dtype, (1, DIM_NEW, kv_heads, head_dim)),
                 TensorSpec(new_value(i), dtype, (1, DIM_NEW, kv_heads, head_dim))]
    return ins, outs


def inplace_kv_specs(num_layers: int, kv_heads: int, head_dim: int, dtype: str):
    """(inputs, outputs, aliases) of the in-place flavour: whole [1, KVH, C, D] buffers."""
    ins, outs, aliases = [], [], []
    for i in range(num_layers):
        for src, dst in ((cache_key(i), cache_key_out(i)), (cache_value(i), cache_value_out(i))):
            ins.append(TensorSpec(src, dtype, (1, kv_heads, DIM_CACHE, head_dim)))
            outs.append(TensorSpec(dst, dtype, (1, kv_heads, DIM_CACHE, head_dim)))
            aliases.append((dst, src))
    return ins, outs, tuple(aliases)


def target_io(num_layers: int, kv_heads: int, head_dim: int, vocab: int, hidden: int, dtype: str,
              kv: str = "append", head: str = "full", num_aux: int = 3) -> GraphIO:
    """The target graph: one graph serves prefill and verify (any S >= 1, any P >= 0).
    ``aux_hidden`` is the residual stream entering each of the draft's ``num_aux`` aux
    layers (3 by default, speculators' eagle_aux_hidden_state_layer_ids), side by side.
    ``kv``: "append" (portable past/new tensors) or "inplace" (whole buffers, see above).
    In-place graphs take ``logits_from`` (above).
    ``head``: "screened" adds the ``head_exact`` input and the ``head_hidden`` and
    ``head_norms`` outputs, ``logits`` approximate unless ``head_exact`` (specrt/head.py);
    "hidden" (the build's own calibration) adds ``head_hidden``."""
    if kv == "inplace":
        kv_in, kv_out, aliases = inplace_kv_specs(num_layers, kv_heads, head_dim, dtype)
    else:
        (kv_in, kv_out), aliases = kv_specs(num_layers, kv_heads, head_dim, dtype), ()
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)), *kv_in,
                *((TensorSpec(HEAD_EXACT, "bool", ()),) if head == "screened" else ()),
                *((TensorSpec(LOGITS_FROM, "int64", (), optional=True),) if kv == "inplace" else ())),
        outputs=(TensorSpec(LOGITS, dtype, (1, DIM_NEW, vocab)), TensorSpec(AUX_HIDDEN, dtype, (1, DIM_NEW, num_aux * hidden)),
                 *((TensorSpec(HEAD_HIDDEN, dtype, (1, DIM_NEW, hidden)),) if head != "full" else ()),
                 *((TensorSpec(HEAD_NORMS, dtype, (1, DIM_NEW, 2)),) if head == "screened" else ()), *kv_out),
        aliases=aliases,
    )


def peagle_io(num_layers: int, kv_heads: int, head_dim: int, draft_vocab: int, target_hidden: int,
              dtype: str, confidence: bool = False, num_aux: int = 3) -> GraphIO:
    """One P-EAGLE drafting pass over S = A + M slots (A real, then M = K - 1 mask slots).

    ``aux_hidden`` holds the target's aux hidden states of the A real slots (A >= 1), the
    ``num_aux`` layers' states side by side (``target_io``'s ``aux_hidden``);
    ``input_ids`` carries mask_token_id in the mask slots. ``draft_logits`` and
    ``draft_token_ids`` cover K = M + 1 rows: the last real slot, then the M mask slots.
    The new KV covers all S slots; the runtime commits only the first A (mask slots are
    per-round scratch). ``confidence``: ``draft_confidence`` [1, K] too (a confidence head).
    """
    kv_in, kv_out = kv_specs(num_layers, kv_heads, head_dim, dtype)
    conf = (TensorSpec(DRAFT_CONFIDENCE, dtype, (1, DIM_DEPTH)),) if confidence else ()
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)),
                TensorSpec(DRAFT_AUX_IN, dtype, (1, DIM_AUX, num_aux * target_hidden)), *kv_in),
        outputs=(TensorSpec(DRAFT_LOGITS, dtype, (1, DIM_DEPTH, draft_vocab)),
                 TensorSpec(DRAFT_TOKENS, "int64", (1, DIM_DEPTH)), *conf, *kv_out),
    )


def eagle3_io(num_layers: int, kv_heads: int, head_dim: int, draft_vocab: int, hidden: int, target_hidden: int,
              dtype: str, confidence: bool = False, num_aux: int = 3) -> GraphIO:
    """One sequential EAGLE-3 step over S = A + B positions.

    The first A positions take g = fc(aux_hidden) (target hidden states, e.g. the tokens
    just verified), the next B take g = prev_hidden (the draft's own ``hidden_out`` of an
    earlier step); A or B may be 0. Outputs cover all S positions (``draft_confidence``
    too with ``confidence``).
    """
    kv_in, kv_out = kv_specs(num_layers, kv_heads, head_dim, dtype)
    conf = (TensorSpec(DRAFT_CONFIDENCE, dtype, (1, DIM_NEW)),) if confidence else ()
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)),
                TensorSpec(DRAFT_AUX_IN, dtype, (1, DIM_AUX, num_aux * target_hidden)),
                TensorSpec(DRAFT_PREV_HIDDEN, dtype, (1, DIM_PREV, hidden)), *kv_in),
        outputs=(TensorSpec(DRAFT_LOGITS, dtype, (1, DIM_NEW, draft_vocab)),
                 TensorSpec(DRAFT_TOKENS, "int64", (1, DIM_NEW)),
                 TensorSpec(DRAFT_HIDDEN_OUT, dtype, (1, DIM_NEW, hidden)), *conf, *kv_out),
    )


# The files later commands add to an engines folder (`specrt calibrate`'s map, the acceptance
# canary's receipt, `specrt corpus`'s n-grams): named here, in a module that imports nothing
# heavy, so that specrt/paths.py keeps a report off them without importing the runtime that
# reads them (runtime/session.py, runtime/corpus.py).
CALIBRATION_FILE = "calibration.json"
ACCEPTANCE_FILE = "acceptance_receipt.json"
CORPUS_FILE = "corpus.npz"

# The draft options' choices, spelled once for the CLI (cli.py's --draft-embeddings and
# --draft-aux-ids) and for export, which the CLI does not import at start-up.
# --draft-embeddings: which embed_tokens a draft's graph runs, its own stored one or the target's
# (export/binding.py's bind_draft)
DRAFT_EMBEDDINGS = ("own", "target")
# --draft-aux-ids: how an EAGLE-format config's aux layer ids count, as what to add for specrt's
# count (the residual stream entering layer i, DESIGN.md §2; export/config.py's load_eagle_config)
DRAFT_AUX_IDS = {"layer-output": 1, "layer-input": 0}
