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
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- names ---------------------------------------------------------------------------

INPUT_IDS = "input_ids"  # int64 [1, S]: token ids of the new positions
POSITION_IDS = "position_ids"  # int64 [1, S]: absolute positions of the new tokens
LOGITS = "logits"  # float [1, S, V]: target logits at every new position
AUX_HIDDEN = "aux_hidden"  # float [1, S, 3H]: concat of the residual streams named by the aux ids

# Draft graphs.
DRAFT_AUX_IN = "aux_hidden"  # float [1, A, 3H_target]: target aux hidden of the real slots
DRAFT_PREV_HIDDEN = "prev_hidden"  # float [1, B, H]: EAGLE-3: the draft's own pre-norm output as g
DRAFT_LOGITS = "draft_logits"  # float [1, K, Vd]: logits over the draft vocabulary
DRAFT_TOKENS = "draft_token_ids"  # int64 [1, K]: greedy draft tokens, in TARGET ids (through d2t)
DRAFT_HIDDEN_OUT = "hidden_out"  # float [1, S, H]: EAGLE-3: pre-norm output for the next step


def past_key(i: int) -> str:
    """float [1, P, KVH, D]: committed keys of layer i (after RoPE)."""
    return f"past_key.{i}"


def past_value(i: int) -> str:
    """float [1, P, KVH, D]: committed values of layer i."""
    return f"past_value.{i}"


def new_key(i: int) -> str:
    """float [1, S, KVH, D]: keys of the S new positions of layer i (after RoPE)."""
    return f"new_key.{i}"


def new_value(i: int) -> str:
    """float [1, S, KVH, D]: values of the S new positions of layer i."""
    return f"new_value.{i}"


# Symbolic dimension names used in the graphs' value infos.
DIM_NEW = "new_tokens"  # S
DIM_PAST = "past_tokens"  # P
DIM_AUX = "aux_tokens"  # A
DIM_PREV = "prev_tokens"  # B
DIM_DEPTH = "draft_depth"  # K


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: "int64", "float32", "float16", "bfloat16"
    shape: tuple[int | str, ...]

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_json(self) -> dict:
        return {"inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}


def kv_specs(num_layers: int, kv_heads: int, head_dim: int, dtype: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ins, outs = [], []
    for i in range(num_layers):
        ins += [TensorSpec(past_key(i), dtype, (1, DIM_PAST, kv_heads, head_dim)),
                TensorSpec(past_value(i), dtype, (1, DIM_PAST, kv_heads, head_dim))]
        outs += [TensorSpec(new_key(i), dtype, (1, DIM_NEW, kv_heads, head_dim)),
                 TensorSpec(new_value(i), dtype, (1, DIM_NEW, kv_heads, head_dim))]
    return ins, outs


def target_io(num_layers: int, kv_heads: int, head_dim: int, vocab: int, hidden: int, dtype: str) -> GraphIO:
    """The target graph: one graph serves prefill and verify (any S >= 1, any P >= 0)."""
    kv_in, kv_out = kv_specs(num_layers, kv_heads, head_dim, dtype)
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)), *kv_in),
        outputs=(TensorSpec(LOGITS, dtype, (1, DIM_NEW, vocab)), TensorSpec(AUX_HIDDEN, dtype, (1, DIM_NEW, 3 * hidden)), *kv_out),
    )


def peagle_io(num_layers: int, kv_heads: int, head_dim: int, draft_vocab: int, target_hidden: int,
              dtype: str) -> GraphIO:
    """One P-EAGLE drafting pass over S = A + M slots (A real, then M = K - 1 mask slots).

    ``aux_hidden`` holds the target's aux hidden states of the A real slots (A >= 1);
    ``input_ids`` carries mask_token_id in the mask slots. ``draft_logits`` and
    ``draft_token_ids`` cover K = M + 1 rows: the last real slot, then the M mask slots.
    The new KV covers all S slots; the runtime commits only the first A (mask slots are
    per-round scratch).
    """
    kv_in, kv_out = kv_specs(num_layers, kv_heads, head_dim, dtype)
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)),
                TensorSpec(DRAFT_AUX_IN, dtype, (1, DIM_AUX, 3 * target_hidden)), *kv_in),
        outputs=(TensorSpec(DRAFT_LOGITS, dtype, (1, DIM_DEPTH, draft_vocab)),
                 TensorSpec(DRAFT_TOKENS, "int64", (1, DIM_DEPTH)), *kv_out),
    )


def eagle3_io(num_layers: int, kv_heads: int, head_dim: int, draft_vocab: int, hidden: int, target_hidden: int,
              dtype: str) -> GraphIO:
    """One sequential EAGLE-3 step over S = A + B positions.

    The first A positions take g = fc(aux_hidden) (target hidden states, e.g. the tokens
    just verified), the next B take g = prev_hidden (the draft's own ``hidden_out`` of an
    earlier step); A or B may be 0. Outputs cover all S positions.
    """
    kv_in, kv_out = kv_specs(num_layers, kv_heads, head_dim, dtype)
    return GraphIO(
        inputs=(TensorSpec(INPUT_IDS, "int64", (1, DIM_NEW)), TensorSpec(POSITION_IDS, "int64", (1, DIM_NEW)),
                TensorSpec(DRAFT_AUX_IN, dtype, (1, DIM_AUX, 3 * target_hidden)),
                TensorSpec(DRAFT_PREV_HIDDEN, dtype, (1, DIM_PREV, hidden)), *kv_in),
        outputs=(TensorSpec(DRAFT_LOGITS, dtype, (1, DIM_NEW, draft_vocab)),
                 TensorSpec(DRAFT_TOKENS, "int64", (1, DIM_NEW)),
                 TensorSpec(DRAFT_HIDDEN_OUT, dtype, (1, DIM_NEW, hidden)), *kv_out),
    )
