"""Canonical weight slots and the checkpoint names that may fill them.

This module is the binding table (STYLE.md, llama.cpp's tensor_mapping taken as a
table). A slot is a canonical tensor such as ``layers.3.q``; each slot lists the exact
checkpoint names that may fill it: first the primary name, then declared aliases,
each alias with a comment naming where it comes from. Names are templates over the
layer index ``{i}`` and nothing else: there is no suffix, prefix or substring matching
anywhere (a speculators loader once bound ``norm.weight`` to a layer norm by suffix,
and acceptance collapsed). ``check_table()`` proves that no name can fill two slots.

Shapes are functions of the normalised config, so a tensor that disagrees with the
config is refused at binding time with both shapes named.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from specrt.export.config import EAGLE_ARCHITECTURE, MAX_AUX, DecoderConfig, DraftConfig

# Dtype classes a slot accepts (safetensors dtype strings).
FLOAT = ("F32", "F16", "BF16")
INT64 = ("I64",)
BOOL = ("BOOL",)


@dataclass(frozen=True)
class SlotSpec:
    """One canonical slot. ``names`` are exact checkpoint-name templates, primary first."""

    slot: str  # template, e.g. "layers.{i}.q"
    names: tuple[str, ...]
    shape: Callable[..., tuple[int, ...]]  # (cfg, extra) -> expected shape
    dtypes: tuple[str, ...] = FLOAT
    per_layer: bool = False
    required: Callable[..., bool] = lambda cfg, extra: True
    # a slot the config switches on: (cfg, extra) -> why a tensor present while ``required``
    # is false would go unused (binding refuses it: the graph would run a model other than the
    # one trained with it). None: a present tensor is used (or checked elsewhere).
    unused: Callable[..., str] | None = None
    # (cfg, extra) -> why the config asks for the slot, said when its tensor is missing (w73d:
    # a llama-layer draft whose layer config says qwen3 was told of a missing q_norm, not why)
    needed: Callable[..., str] | None = None


def _layer_type(c: DecoderConfig, e: dict) -> str:
    """Where a layer's model_type is read: a draft's (its ``extra`` has a kind) in its layer config,
    an EAGLE-format draft's nowhere (its one layer is llama's, whatever config.json says)."""
    if e.get("source_format") == "eagle":
        return f"EAGLE's draft format ({EAGLE_ARCHITECTURE}: one llama layer, no model_type to change)"
    return f"{'transformer_layer_config.' if 'kind' in e else ''}model_type '{c.model_type}'"


def _no_bias(c: DecoderConfig, e: dict) -> str:
    return f"{_layer_type(c, e)} gives its layers no q/k/v biases (a qwen2 layer has them)"


def _no_qk_norm(c: DecoderConfig, e: dict) -> str:
    return f"{_layer_type(c, e)} gives its layers no q/k norms (a qwen3 layer has them)"


def _bias(c: DecoderConfig, e: dict) -> str:
    return f"{_layer_type(c, e)} gives its layers q/k/v biases (a llama layer has none)"


def _qk_norm(c: DecoderConfig, e: dict) -> str:
    return f"{_layer_type(c, e)} gives its layers q/k norms (a llama layer has none)"


def _layer_specs(prefix: str, first_layer_in: Callable[[DecoderConfig], int] | None = None) -> list[SlotSpec]:
    """The decoder-layer slots shared by targets and drafts, under ``prefix``.

    ``first_layer_in`` gives layer 0's q/k/v input width where it differs from H
    (EAGLE-3/P-EAGLE layer 0 reads concat(embeds, hidden) of width 2H).
    """

    def qkv_in(c: DecoderConfig, extra: dict) -> int:
        if first_layer_in is not None and extra.get("i") == 0:
            return first_layer_in(c)
        return c.hidden_size

    p = prefix + "layers.{i}."
    H = lambda c: c.hidden_size  # noqa: E731
    return [
        SlotSpec("layers.{i}.attn_norm", (p + "input_layernorm.weight",), lambda c, e: (H(c),), per_layer=True),
        SlotSpec("layers.{i}.q", (p + "self_attn.q_proj.weight",), lambda c, e: (c.q_size, qkv_in(c, e)), per_layer=True),
        SlotSpec("layers.{i}.k", (p + "self_attn.k_proj.weight",), lambda c, e: (c.kv_size, qkv_in(c, e)), per_layer=True),
        SlotSpec("layers.{i}.v", (p + "self_attn.v_proj.weight",), lambda c, e: (c.kv_size, qkv_in(c, e)), per_layer=True),
        SlotSpec("layers.{i}.q_bias", (p + "self_attn.q_proj.bias",), lambda c, e: (c.q_size,), per_layer=True,
                 required=lambda c, e: c.qkv_bias, unused=_no_bias, needed=_bias),
        SlotSpec("layers.{i}.k_bias", (p + "self_attn.k_proj.bias",), lambda c, e: (c.kv_size,), per_layer=True,
                 required=lambda c, e: c.qkv_bias, unused=_no_bias, needed=_bias),
        SlotSpec("layers.{i}.v_bias", (p + "self_attn.v_proj.bias",), lambda c, e: (c.kv_size,), per_layer=True,
                 required=lambda c, e: c.qkv_bias, unused=_no_bias, needed=_bias),
        # Qwen3: per-head RMSNorm on q and k before RoPE.
        SlotSpec("layers.{i}.q_norm", (p + "self_attn.q_norm.weight",), lambda c, e: (c.head_dim,), per_layer=True,
                 required=lambda c, e: c.qk_norm, unused=_no_qk_norm, needed=_qk_norm),
        SlotSpec("layers.{i}.k_norm", (p + "self_attn.k_norm.weight",), lambda c, e: (c.head_dim,), per_layer=True,
                 required=lambda c, e: c.qk_norm, unused=_no_qk_norm, needed=_qk_norm),
        SlotSpec("layers.{i}.o", (p + "self_attn.o_proj.weight",), lambda c, e: (H(c), c.q_size), per_layer=True),
        SlotSpec("layers.{i}.mlp_norm", (p + "post_attention_layernorm.weight",), lambda c, e: (H(c),), per_layer=True),
        SlotSpec("layers.{i}.gate", (p + "mlp.gate_proj.weight",), lambda c, e: (c.intermediate_size, H(c)), per_layer=True),
        SlotSpec("layers.{i}.up", (p + "mlp.up_proj.weight",), lambda c, e: (c.intermediate_size, H(c)), per_layer=True),
        SlotSpec("layers.{i}.down", (p + "mlp.down_proj.weight",), lambda c, e: (H(c), c.intermediate_size), per_layer=True),
    ]


def _with_layer_aliases(specs: list[SlotSpec], alias_prefixes: tuple[str, ...], base_prefix: str) -> list[SlotSpec]:
    """Add whole-model prefix aliases (declared, exact) to every per-layer slot name."""
    out = []
    for s in specs:
        names = list(s.names)
        for ap in alias_prefixes:
            names += [ap + n[len(base_prefix):] for n in s.names if n.startswith(base_prefix)]
        out.append(replace(s, names=tuple(names)))
    return out


# Target checkpoints. Primary names are transformers' own (LlamaForCausalLM and the
# families in config.ARCHITECTURES all share them). Aliases, with their origin:
#   "model.llm." : multimodal wrappers that nest the language model under "llm"
#                  (InternVL-style exports); the historical drift case: its final norm is
#                  "model.llm.norm.weight", which must bind the final norm, never a layer norm.
#   "language_model.model." : LLaVA-style wrappers (transformers < 4.52 layout).
TARGET_ALIAS_PREFIXES = ("model.llm.", "language_model.model.")

TARGET_SLOTS: list[SlotSpec] = [
    SlotSpec("embed", ("model.embed_tokens.weight", "model.llm.embed_tokens.weight", "language_model.model.embed_tokens.weight"),
             lambda c, e: (c.vocab_size, c.hidden_size)),
    *_with_layer_aliases(_layer_specs("model."), TARGET_ALIAS_PREFIXES, "model."),
    SlotSpec("final_norm", ("model.norm.weight", "model.llm.norm.weight", "language_model.model.norm.weight"),
             lambda c, e: (c.hidden_size,)),
    # Tied embeddings: lm_head is absent and the embedding matrix serves (binding
    # records the tie). "language_model.lm_head.weight": LLaVA-style wrappers.
    SlotSpec("lm_head", ("lm_head.weight", "language_model.lm_head.weight"),
             lambda c, e: (c.vocab_size, c.hidden_size), required=lambda c, e: not c.tie_word_embeddings),
]

# Tensors a target checkpoint may carry that specrt does not need: exact templates.
TARGET_IGNORABLE = (
    "model.layers.{i}.self_attn.rotary_emb.inv_freq",  # older transformers saved the RoPE buffer
    "model.rotary_emb.inv_freq",
)


def _draft_first_in(c: DecoderConfig) -> int:
    return 2 * c.hidden_size


def _aux_width(c: DecoderConfig, e: dict) -> int:
    # fc reads concat of num_aux (3 by default) target hidden states; the target width may
    # differ from the draft's (target_hidden_size), binding passes both in ``extra``.
    return e["num_aux"] * e.get("target_hidden", c.hidden_size)


# speculators draft checkpoints (DESIGN.md §1): names are the library's own, no prefix.
DRAFT_SLOTS: list[SlotSpec] = [
    # Absent -> the verifier's embeddings are used (binding records that).
    SlotSpec("embed", ("embed_tokens.weight",), lambda c, e: (c.vocab_size, c.hidden_size),
             required=lambda c, e: False),
    SlotSpec("fc", ("fc.weight",), lambda c, e: (c.hidden_size, _aux_width(c, e))),
    SlotSpec("layers.0.hidden_norm", ("layers.0.hidden_norm.weight",), lambda c, e: (c.hidden_size,)),
    *_layer_specs("", _draft_first_in),
    SlotSpec("final_norm", ("norm.weight",), lambda c, e: (c.hidden_size,)),
    SlotSpec("lm_head", ("lm_head.weight",), lambda c, e: (e["draft_vocab"], c.hidden_size)),
    SlotSpec("mask_hidden", ("mask_hidden",), lambda c, e: (1, 1, _aux_width(c, e)),
             required=lambda c, e: e["kind"] == "peagle",
             unused=lambda c, e: "config.json describes an EAGLE-3 draft (a P-EAGLE draft's mask slots use it)"),
    SlotSpec("d2t", ("d2t",), lambda c, e: (e["draft_vocab"],), dtypes=INT64,
             required=lambda c, e: e["draft_vocab"] < c.vocab_size),
    SlotSpec("t2d", ("t2d",), lambda c, e: (c.vocab_size,), dtypes=BOOL,
             required=lambda c, e: e["draft_vocab"] < c.vocab_size),
    SlotSpec("input_norm", ("input_norm.weight",), lambda c, e: (_aux_width(c, e),),
             required=lambda c, e: e["norm_before_fc"],
             unused=lambda c, e: "config.json's norm_before_fc is not true (the aux states' norm runs only then)"),
    *[
        SlotSpec(f"fc_norm.{j}", (f"fc_norm.{j}.weight",), lambda c, e: (e.get("target_hidden", c.hidden_size),),
                 required=lambda c, e, j=j: e["fc_norm"] and j < e["num_aux"],
                 unused=lambda c, e: ("config.json's fc_norm is not true (the per-state norms run only then)"
                                      if not e["fc_norm"] else f"the draft reads {e['num_aux']} aux hidden states "
                                      f"(fc_norm.0-{e['num_aux'] - 1})"))
        for j in range(MAX_AUX)
    ],
    # a DSpark confidence head (DeepSpec's AcceptRatePredictor: one Linear(H, 1), bias on)
    SlotSpec("confidence_head", ("confidence_head.proj.weight",), lambda c, e: (1, c.hidden_size),
             required=lambda c, e: e.get("confidence_head", False)),
    SlotSpec("confidence_head_bias", ("confidence_head.proj.bias",), lambda c, e: (1,),
             required=lambda c, e: e.get("confidence_head", False)),
]

DRAFT_IGNORABLE = ("layers.{i}.self_attn.rotary_emb.inv_freq", "rotary_emb.inv_freq")

# EAGLE-3 drafts in EAGLE's own format (config.load_eagle_config): the speculators table for one
# layer with declared renames, nothing else. "midlayer." for "layers.0.": SafeAILab's
# eagle/model/cnets.py and SpecForge's llama3_eagle.py name their one layer ``midlayer``, which
# speculators' convert (src/speculators/convert/eagle/eagle3_converter.py) and vLLM
# (vllm/model_executor/models/llama_eagle3.py load_weights) rename to layers.0.; ModelOpt's export
# (modelopt/torch/export/plugins/hf_spec_export.py) writes layers.0. itself, so each layer slot
# takes either name (both present: refused, as any slot filled twice). Every other name
# (embed_tokens.weight, fc.weight, fc_norm.{j}.weight, norm.weight, lm_head.weight, d2t, t2d) is the
# same in both. The slots the format has no module for are left out, so such a tensor is refused.
EAGLE_RENAMES = (("layers.0.", "midlayer."),)
EAGLE_ABSENT = ("mask_hidden", "confidence_head", "confidence_head_bias")
# no server reads t2d (SGLang's and vLLM's load_weights skip it) and ModelOpt writes none: the
# binding derives it from d2t, and checks one that is there
EAGLE_OPTIONAL = ("t2d",)


def _renamed(name: str) -> str:
    for old, new in EAGLE_RENAMES:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def eagle_rows() -> tuple[list[tuple[str, tuple[str, ...], SlotSpec, int | None]], dict[str, str]]:
    """DRAFT_SLOTS' rows for a one-layer draft under EAGLE's names (checked as check_table checks),
    and checkpoint name -> the speculators name it stands for, for each renamed one."""
    rows, aliases = [], {}
    for slot, names, spec, i in expand(DRAFT_SLOTS, 1):
        if slot in EAGLE_ABSENT:
            continue
        if slot in EAGLE_OPTIONAL:
            spec = replace(spec, required=lambda c, e: False)
        renamed = tuple(r for n in names for r in dict.fromkeys((_renamed(n), n)))
        aliases.update({_renamed(n): n for n in names if _renamed(n) != n})
        rows.append((slot, renamed, spec, i))
    check_rows(rows)
    return rows, aliases


def draft_extra(cfg: DraftConfig, target_hidden: int | None = None) -> dict:
    """The non-decoder facts the draft slot shapes and requirements depend on."""
    return {
        "kind": cfg.kind,
        "source_format": cfg.source_format,
        "draft_vocab": cfg.draft_vocab_size,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "num_aux": cfg.num_aux,
        "confidence_head": cfg.confidence_head,
        "target_hidden": target_hidden or cfg.target_hidden_size or cfg.decoder.hidden_size,
    }


def expand(specs: list[SlotSpec], num_layers: int) -> list[tuple[str, tuple[str, ...], SlotSpec, int | None]]:
    """Concrete (slot, names, spec, layer index) rows for a model with ``num_layers`` layers."""
    rows = []
    for s in specs:
        if s.per_layer:
            for i in range(num_layers):
                rows.append((s.slot.format(i=i), tuple(n.format(i=i) for n in s.names), s, i))
        elif "{i}" in s.slot:
            raise AssertionError(f"slot {s.slot} has a layer index but is not per-layer")
        else:
            rows.append((s.slot, s.names, s, None))
    return rows


def check_table(specs: list[SlotSpec], num_layers: int = 4) -> dict[str, str]:
    """Return name -> slot for every concrete name; raise if a name fills two slots or
    two rows share a slot. Called by tests and at import by ``bind``."""
    return check_rows(expand(specs, num_layers))


def check_rows(rows: list[tuple[str, tuple[str, ...], SlotSpec, int | None]]) -> dict[str, str]:
    """check_table for expanded rows."""
    owner: dict[str, str] = {}
    seen_slots: set[str] = set()
    for slot, names, _spec, _i in rows:
        if slot in seen_slots:
            raise AssertionError(f"slot '{slot}' is declared twice")
        seen_slots.add(slot)
        for n in names:
            if n in owner and owner[n] != slot:
                raise AssertionError(f"name '{n}' is declared for two slots: '{owner[n]}' and '{slot}'")
            owner[n] = slot
    return owner
