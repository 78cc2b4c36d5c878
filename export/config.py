"""Normalised model configurations: the one place HF and speculators configs are read.

Every field the rest of specrt uses is read here, explicitly. A missing field is a
``UserError`` naming the file and key; nothing is inferred from file or folder names
(STYLE.md conventions 2-3). Only ``config.json`` is read: a ``config.py`` beside it
(speculators writes one for ``auto_map``) is never imported.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specrt.contracts import DRAFT_AUX_IDS
from specrt.errors import UserError
from specrt.limits import MAX_DEPTH, whole
from specrt.paths import read_json_object

# Decoder families that share the Llama block (pre-norm, RMSNorm, RoPE, SwiGLU).
# Differences are declared here as data, not branched on elsewhere.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    # model_type: {qk_norm: per-head RMSNorm on q/k (Qwen3), qkv_bias: q/k/v projections carry a
    # bias, defaults: what transformers' config class (5.24) takes for a field config.json leaves
    # out (num_key_value_heads / head_dim None: num_attention_heads / hidden_size over it),
    # nullable: the fields of those two it takes an explicit null for, with the same meaning
    # (Mistral's config refuses a null num_key_value_heads, Qwen3's a null head_dim, and
    # Qwen2's model does not build with one)}
    "llama": {"qk_norm": False, "qkv_bias": False, "hf_class": "LlamaForCausalLM",
              "defaults": {"num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048},
              "nullable": ("num_key_value_heads", "head_dim")},
    "mistral": {"qk_norm": False, "qkv_bias": False, "hf_class": "MistralForCausalLM",
                "defaults": {"num_key_value_heads": 8, "head_dim": None, "max_position_embeddings": 131072},
                "nullable": ("head_dim",)},
    "qwen2": {"qk_norm": False, "qkv_bias": True, "hf_class": "Qwen2ForCausalLM",
              "defaults": {"num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768},
              "nullable": ("num_key_value_heads",)},
    "qwen3": {"qk_norm": True, "qkv_bias": False, "hf_class": "Qwen3ForCausalLM",
              "defaults": {"num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768},
              "nullable": ("num_key_value_heads",)},
}

# "dynamic" (NTK) rescales only past max_position_embeddings, where no target engine goes (the build's
# context limit): inside it its frequencies are the default ones. (The limit is the target's: a draft
# whose own is lower keeps them past it too, which export, inspect and build say: draft_length_note.)
ROPE_TYPES = ("default", "llama3", "linear", "yarn", "dynamic")
# what a draft's graph runs past its own max_position_embeddings, by RoPE type: every table is static
# (position times fixed frequencies), so each type goes on as it is; only transformers' "dynamic"
# would change (its NTK base grows with the sequence past that length: _compute_dynamic_ntk_parameters)
PAST_OWN_LENGTH = {
    "default": "its RoPE frequencies as they are",
    "linear": "its linearly scaled RoPE frequencies as they are",
    "llama3": "its llama3-scaled RoPE frequencies as they are",
    "yarn": "its YaRN frequencies and attention factor as they are",
    "dynamic": ("its default (unscaled) RoPE frequencies, where transformers, EAGLE and SpecForge would rescale "
                "the NTK base as the sequence grows past that length (vLLM and SGLang serve it on one fixed base)"),
}
# the fields only YaRN uses; to_json leaves them out for the other types (their exports read as before)
YARN_FIELDS = ("attention_factor", "beta_fast", "beta_slow", "truncate")


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters; ``inv_freq()`` gives the per-pair frequencies [head_dim/2] and
    ``attention_factor`` the factor on cos and sin (YaRN's; 1 for the other types)."""

    rope_type: str
    theta: float
    head_dim: int
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    attention_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    def inv_freq(self):
        """The frequencies as transformers' rope functions compute them, step for step in float32
        (a scalar over a tensor is its reciprocal times the scalar there, as torch computes it);
        theta to a power is a correctly rounded float32 one here (glibc's powf, torch's scalar
        path: its AVX-512 one is 1 ulp off it in some 1% of entries)."""
        import numpy as np

        f32, d = np.float32, self.head_dim
        exponent = np.arange(0, d, 2, dtype=np.float32) / f32(d)
        pos_freqs = (np.float64(f32(self.theta)) ** exponent.astype(np.float64)).astype(np.float32)
        inv = f32(1) / pos_freqs
        if self.rope_type == "linear":
            inv = inv / f32(self.factor)
        elif self.rope_type == "llama3":
            # Llama 3.1 frequency-dependent scaling (transformers' _compute_llama3_parameters).
            original = self.original_max_position_embeddings
            low_wavelen = f32(original / self.low_freq_factor)
            high_wavelen = f32(original / self.high_freq_factor)
            wavelen = (f32(1) / inv) * f32(2 * math.pi)
            scaled = np.where(wavelen > low_wavelen, inv / f32(self.factor), inv)
            smooth = ((f32(1) / wavelen) * f32(original) - f32(self.low_freq_factor)) / f32(
                self.high_freq_factor - self.low_freq_factor)
            smoothed = (f32(1) - smooth) * scaled / f32(self.factor) + smooth * scaled
            medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
            inv = np.where(medium, smoothed, scaled)
        elif self.rope_type == "yarn":
            # YaRN (transformers' _compute_yarn_parameters): the frequencies that turn fewer than
            # beta_slow times over the original context are interpolated (divided by factor),
            # those that turn more than beta_fast times kept, a linear ramp between the two.
            def correction_dim(rotations: float) -> float:
                return d * math.log(self.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
                    2 * math.log(self.theta))

            low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
            if self.truncate:
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2, dtype=np.float32) - f32(low)) / f32(high - low), f32(0), f32(1))
            keep = f32(1) - ramp  # the share of each frequency extrapolated (kept as it is)
            inv = f32(1) / (f32(self.factor) * pos_freqs) * (f32(1) - keep) + inv * keep
        return inv


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-family decoder stack as specrt needs it (target, or a draft's layer config)."""

    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    max_position_embeddings: int
    qk_norm: bool
    qkv_bias: bool
    # the attention window transformers gives some layer (sliding_window_of); None: every layer
    # attends to the whole context, as specrt's graphs do. Within it the two are the same.
    sliding_window: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if self.rope.rope_type != "yarn":
            for k in YARN_FIELDS:
                del d["rope"][k]
        if d["sliding_window"] is None:  # (exports of models without one read as before)
            del d["sliding_window"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DecoderConfig":
        """The inverse of to_json (export.json's ``target.decoder``, read by engines/build.py);
        a hand-edited or foreign one is a UserError (it was a KeyError traceback)."""
        try:
            d = dict(d)
            d["rope"] = RopeConfig(**d["rope"])
            return cls(**d)
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"export.json: target.decoder is malformed ({type(e).__name__}: {e}); make the export "
                            "again with `specrt export`") from None


@dataclass(frozen=True)
class TargetConfig:
    decoder: DecoderConfig
    architecture: str  # the HF class name in config.json's "architectures"
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "architecture": self.architecture,
            "eos_token_ids": list(self.eos_token_ids),
            "bos_token_id": self.bos_token_id,
            "decoder": self.decoder.to_json(),
        }


DRAFT_TYPES = ("peagle", "eagle3")
# the most target hidden states a draft's fc may read (speculators' fc takes len(ids) of
# them, 3 by default; the bound keeps the fc_norm.{j} slot table finite)
MAX_AUX = 16


@dataclass(frozen=True)
class DraftConfig:
    """A speculators draft (P-EAGLE or EAGLE-3); field meanings in DESIGN.md §1/§3."""

    kind: str  # "peagle" | "eagle3"
    decoder: DecoderConfig  # transformer_layer_config; vocab_size is the target vocabulary
    draft_vocab_size: int
    aux_layer_ids: tuple[int, ...] | None  # None: the target's default [2, L//2, L-3]
    mask_token_id: int | None  # P-EAGLE only
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    speculative_tokens: int
    verifier_architectures: tuple[str, ...]
    target_hidden_size: int | None
    extra: dict[str, Any] = field(default_factory=dict)
    # a DSpark confidence head (DeepSpec's ``enable_confidence_head``: confidence_head.proj,
    # a linear map of the head's normed hidden state to each position's acceptance logit)
    confidence_head: bool = False
    # the attention window the draft graph applies to every layer: speculators' (v0.7+)
    # drafts mark every layer sliding_attention (window 2048 by default); None: full
    attention_window: int | None = None
    # the checkpoint layout read: "speculators", or "eagle" (EAGLE-3 as SafeAILab's EAGLE and
    # SGLang's SpecForge save it: LlamaForCausalLMEagle3, midlayer.*; load_eagle_config)
    source_format: str = "speculators"
    # vLLM's logit_scale: the draft-vocabulary logits times it (_logit_scale)
    logit_scale: float = 1.0
    # speculators_config.verifier.name_or_path: the model the draft was trained against, as its
    # trainer named it (a hub id or a path on the training machine: recorded and shown, not checked)
    verifier_name: str | None = None
    # what export and inspect say of the config as read (a default_proposal_method naming no
    # method, architectures naming the other kind): warnings, not part of the receipt
    notes: tuple[str, ...] = ()

    @property
    def num_aux(self) -> int:
        """How many target hidden states fc reads (speculators: len(eagle_aux_hidden_state_layer_ids), 3 when none)."""
        return len(self.aux_layer_ids) if self.aux_layer_ids is not None else 3

    def resolved_aux_ids(self, target_layers: int) -> tuple[int, ...]:
        if self.aux_layer_ids is not None:
            return self.aux_layer_ids
        return default_aux_layer_ids(target_layers)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["decoder"] = self.decoder.to_json()
        if not self.confidence_head:  # (receipts of drafts without one read as before it existed)
            del d["confidence_head"]
        if self.attention_window is None:  # (likewise)
            del d["attention_window"]
        if self.source_format == "speculators":  # (likewise)
            del d["source_format"]
        if self.logit_scale == 1.0:  # (likewise)
            del d["logit_scale"]
        if self.verifier_name is None:  # (likewise)
            del d["verifier_name"]
        del d["notes"]
        return d


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """speculators' default when the config names none (DESIGN.md §2)."""
    return (2, num_layers // 2, num_layers - 3)


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        from specrt.manifest import specrt_folder_note

        raise UserError(f"{path}: not found (expected a JSON config file){specrt_folder_note(Path(path).parent)}")
    return read_json_object(path)


class _Fields:
    """Typed access to one JSON object, with errors naming the file and key path."""

    def __init__(self, data: dict[str, Any], where: str):
        self.data = data
        self.where = where

    def _get(self, key: str, types: tuple[type, ...], required: bool, default: Any = None):
        if key not in self.data or self.data[key] is None:
            if required:
                raise UserError(f"{self.where}: missing required field '{key}'")
            return default
        v = self.data[key]
        # bool is an int subclass: reject it where a number is expected, and vice versa.
        ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in types)
        if not ok:
            names = "/".join(t.__name__ for t in types)
            raise UserError(f"{self.where}: field '{key}' must be {names}, found {v!r}")
        return v

    def int(self, key: str, required: bool = True, default: Any = None, minimum: int | None = 1):
        v = self._get(key, (int,), required, default)
        if v is not None and minimum is not None and v < minimum:
            raise UserError(f"{self.where}: field '{key}' must be >= {minimum}, found {v}")
        return v

    def float(self, key: str, required: bool = True, default: Any = None, positive: bool = False):
        v = self._get(key, (int, float), required, default)
        if v is not None and positive and not (math.isfinite(v) and v > 0):
            # (a theta or factor of 0 or below gives NaN or infinite RoPE frequencies: NaN logits)
            raise UserError(f"{self.where}: field '{key}' must be a positive number, found {v!r}")
        return None if v is None else float(v)

    def bool(self, key: str, required: bool = True, default: Any = None):
        return self._get(key, (bool,), required, default)

    def str(self, key: str, required: bool = True, default: Any = None):
        return self._get(key, (str,), required, default)

    def dict(self, key: str, required: bool = True) -> "_Fields | None":
        v = self._get(key, (dict,), required)
        return None if v is None else _Fields(v, f"{self.where}.{key}")

    def list(self, key: str, required: bool = True):
        return self._get(key, (list,), required)


def _rope(f: _Fields, head_dim: int, max_position_embeddings: int) -> RopeConfig:
    # transformers >= 5 writes "rope_parameters" (theta inside); older configs write
    # "rope_theta" plus an optional "rope_scaling" dict.
    params = f.dict("rope_parameters", required=False)
    scaling = f.dict("rope_scaling", required=False)
    if params is not None and scaling is not None:
        # transformers 5 takes rope_scaling over rope_parameters (theta included), 4.x knows
        # rope_scaling only: a config re-saved by one and edited for the other (a YaRN block
        # added as a model card says) has no one reading, unless the two say the same
        def same(d: dict) -> dict:
            d = {("rope_type" if k == "type" else k): v for k, v in d.items() if k != "rope_theta"}
            return {**d, "rope_type": d.get("rope_type", "default")}

        # the theta transformers runs: rope_scaling's, else the top level's (else its class default);
        # specrt's: rope_parameters', else the top level's. Both must name it, and the same one.
        theirs = scaling.data.get("rope_theta", f.data.get("rope_theta"))
        ours = params.data.get("rope_theta", f.data.get("rope_theta"))
        if same(params.data) != same(scaling.data) or theirs is None or ours != theirs:
            raise UserError(f"{f.where}: rope_parameters and rope_scaling differ; keep one (transformers 5 reads "
                            "rope_scaling over rope_parameters, theta included, transformers 4 only rope_scaling)")
    if params is None:
        params = f.dict("rope_scaling", required=False)
        # transformers runs rope_scaling's own theta over the top level's (it moves the block to
        # rope_parameters and only fills a missing theta there)
        theta = params.float("rope_theta", required=False, positive=True) if params is not None else None
        if theta is None:
            theta = f.float("rope_theta", required=False, default=10000.0, positive=True)
    else:
        theta = params.float("rope_theta", required=False, positive=True)
        if theta is None:
            theta = f.float("rope_theta", positive=True)
    # transformers rotates only this share of each head's dimensions (for every rope type;
    # it moves a top-level one into rope_parameters); specrt's graphs rotate all of them
    for where in (f, params):
        prf = where.float("partial_rotary_factor", required=False) if where is not None else None
        if prf is not None and prf != 1.0:
            raise UserError(f"{where.where}: partial_rotary_factor {prf:g} is not supported (RoPE on the whole "
                            "head only, 1.0)")
    if params is None:
        return RopeConfig("default", theta, head_dim)
    rope_type = params.str("rope_type", required=False) or params.str("type", required=False) or "default"
    if rope_type not in ROPE_TYPES:
        raise UserError(
            f"{params.where}: rope_type '{rope_type}' is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    if rope_type == "default":
        return RopeConfig("default", theta, head_dim)
    if rope_type == "dynamic":
        return RopeConfig("dynamic", theta, head_dim, factor=params.float("factor", positive=True))
    # transformers takes a top-level original_max_position_embeddings first (Phi-3 writes it
    # there), then rope_parameters', then (YaRN) max_position_embeddings
    original = f.int("original_max_position_embeddings", required=False) or params.int(
        "original_max_position_embeddings", required=False,
        default=max_position_embeddings if rope_type in ("yarn", "llama3") else 8192)  # (transformers 5's)
    if rope_type != "yarn":
        low = params.float("low_freq_factor", required=rope_type == "llama3", default=1.0, positive=True)
        high = params.float("high_freq_factor", required=rope_type == "llama3", default=4.0, positive=True)
        if rope_type == "llama3" and not high > low:  # (llama3 divides by their difference)
            raise UserError(f"{params.where}: high_freq_factor {high:g} must be above low_freq_factor {low:g}")
        return RopeConfig(
            rope_type,
            theta,
            head_dim,
            factor=params.float("factor", positive=True),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=original,
        )
    # transformers requires the key; a null one is the ratio of the two lengths
    if "factor" not in params.data:
        raise UserError(f"{params.where}: missing required field 'factor' (YaRN's scaling factor; null for "
                        "max_position_embeddings over original_max_position_embeddings)")
    factor = params.float("factor", required=False)
    if factor is None:  # (not `or`: a factor of 0 is refused below, not taken as the ratio)
        factor = max_position_embeddings / original
    if factor < 1:
        raise UserError(f"{params.where}: field 'factor' must be >= 1 for YaRN, found {factor:g}")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.float("attention_factor", required=False)
    if attention is None:
        m, m_all = params.float("mscale", required=False), params.float("mscale_all_dim", required=False)
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = params.float("beta_fast", required=False) or 32.0
    beta_slow = params.float("beta_slow", required=False) or 1.0
    if beta_fast < beta_slow:
        raise UserError(f"{params.where}: beta_fast {beta_fast:g} must not be below beta_slow {beta_slow:g}")
    truncate = params.bool("truncate", required=False, default=True)
    return RopeConfig("yarn", theta, head_dim, factor=factor, original_max_position_embeddings=original,
                      attention_factor=float(attention), beta_fast=beta_fast, beta_slow=beta_slow,
                      truncate=bool(truncate))


def draft_length_note(config_file: str, source_format: str, max_positions: int, rope_type: str, context: int,
                      context_what: str) -> str | None:
    """The warning for a draft whose own ``max_position_embeddings`` is below ``context`` (the
    positions the engines run; ``context_what`` says whose), None when it is not. Not refused:
    the target verifies every draft token, so only acceptance can suffer there."""
    if max_positions >= context:
        return None
    key = "max_position_embeddings" if source_format == "eagle" else "transformer_layer_config.max_position_embeddings"
    past = PAST_OWN_LENGTH.get(rope_type, "its RoPE as it is")
    return (f"warning: {config_file}: the draft's {key} is {max_positions}, and {context_what} is {context}: from "
            f"position {max_positions} on it runs positions it was never trained on, with {past} (rope_type "
            f"'{rope_type}'); its acceptance may fall there, the output stays exact (the target verifies every "
            f"token). `specrt build --max-context {max_positions}` keeps every position within its length (the "
            "target's context too)")


def sliding_window_of(f: "_Fields", model_type: str, num_layers: int) -> int | None:
    """The attention window transformers applies to some layer of this config, as its
    classes read it: Mistral to every layer, ``sliding_window`` (4096 when the key is
    absent, none when null); Qwen2 / Qwen3 only with ``use_sliding_window`` true, to the
    layers ``layer_types`` marks "sliding_attention" (without it, those from
    ``max_window_layers``, 28 by default, on); Llama never."""
    if model_type == "llama":
        return None
    qwen = model_type in ("qwen2", "qwen3")
    types = f.list("layer_types", required=False) if qwen else None
    if types is not None:  # (checked as transformers' config classes check it, whether a window applies or not)
        kinds = ("full_attention", "sliding_attention")
        if len(types) != num_layers or not all(t in kinds for t in types):
            raise UserError(f"{f.where}: field 'layer_types' is {types!r:.80}; expected one of {', '.join(kinds)} "
                            f"for each of its {num_layers} layers")
    if qwen and not f.bool("use_sliding_window", required=False, default=False):
        return None
    window = f.int("sliding_window", required=False) if "sliding_window" in f.data else 4096
    if window is None:
        return None
    if qwen:
        if types is not None:
            sliding = "sliding_attention" in types
        else:
            sliding = f.int("max_window_layers", required=False, default=28, minimum=0) < num_layers
        if not sliding:
            return None
    return window


def parse_decoder(data: dict[str, Any], where: str) -> DecoderConfig:
    """A decoder's config; a field it leaves out takes its family's transformers default
    (ARCHITECTURES), tie_word_embeddings false as every supported config class has it."""
    f = _Fields(data, where)
    model_type = f.str("model_type")
    if model_type not in ARCHITECTURES:
        raise UserError(
            f"{where}: model_type '{model_type}' is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    arch = ARCHITECTURES[model_type]
    dflt = arch["defaults"]
    hidden = f.int("hidden_size")
    heads = f.int("num_attention_heads")
    for key in ("num_key_value_heads", "head_dim"):
        if key in f.data and f.data[key] is None and key not in arch["nullable"]:
            raise UserError(f"{where}: field '{key}' must be int, found null (transformers refuses a null one "
                            f"for {model_type}; leave the field out for its default)")
    # transformers: an explicit null means as many as the attention heads (hidden_size over
    # them for head_dim); absent, the class default
    kv_heads = heads if "num_key_value_heads" in f.data and f.data["num_key_value_heads"] is None else \
        f.int("num_key_value_heads", required=False, default=dflt["num_key_value_heads"] or heads)
    if heads % kv_heads:
        raise UserError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    head_dim = None if "head_dim" in f.data and f.data["head_dim"] is None else \
        f.int("head_dim", required=False, default=dflt["head_dim"])
    if head_dim is None:
        if hidden % heads:
            raise UserError(f"{where}: hidden_size {hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    if head_dim % 2:
        raise UserError(f"{where}: head_dim {head_dim} must be even for RoPE")
    act = f.str("hidden_act", required=False, default="silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act '{act}' is not supported (expected 'silu')")
    if f.bool("mlp_bias", required=False, default=False):
        raise UserError(f"{where}: mlp_bias=true is not supported")
    if model_type != "qwen2" and f.bool("attention_bias", required=False, default=False):
        # transformers then puts a bias on o_proj too, which no graph here has
        raise UserError(f"{where}: attention_bias=true (biases on q/k/v and o_proj) is not supported")
    qkv_bias = arch["qkv_bias"]
    tie = f.bool("tie_word_embeddings", required=False, default=False)
    layers = f.int("num_hidden_layers")
    max_positions = f.int("max_position_embeddings", required=False, default=dflt["max_position_embeddings"])
    return DecoderConfig(
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=f.int("intermediate_size"),
        vocab_size=f.int("vocab_size"),
        rms_norm_eps=_eps(f),
        rope=_rope(f, head_dim, max_positions),
        tie_word_embeddings=bool(tie),
        max_position_embeddings=max_positions,
        qk_norm=arch["qk_norm"],
        qkv_bias=bool(qkv_bias),
        sliding_window=sliding_window_of(f, model_type, layers),
    )


def _eps(f: _Fields) -> float:
    """rms_norm_eps (transformers' default 1e-6 when absent): finite and not negative, else
    the norms take the root of a negative or NaN number."""
    eps = f.float("rms_norm_eps", required=False, default=1e-6)
    if not (math.isfinite(eps) and eps >= 0):
        raise UserError(f"{f.where}: field 'rms_norm_eps' must be a small number >= 0, found {eps!r}")
    return eps


def _token_ids(v: Any, where: str, key: str, vocab: int) -> tuple[int, ...]:
    if v is None:
        return ()
    vals = v if isinstance(v, list) else [v]
    if not all(whole(x, 0) for x in vals):
        raise UserError(f"{where}: field '{key}' must be a token id or a list of them, found {v!r}")
    if any(x >= vocab for x in vals):  # (an EOS the model cannot produce never ends an answer)
        raise UserError(f"{where}: field '{key}' is {v!r}: a token id must lie in the model's vocabulary "
                        f"[0, {vocab}) (config.json vocab_size)")
    return tuple(vals)


def _refuse_both_fc_norms(where: str, fc_norm: bool, norm_before_fc: bool) -> None:
    """One norm over the concatenated aux states (norm_before_fc) or one per state (fc_norm),
    never both. The servers differ on the pair: vLLM's llama_eagle3 combine_hidden_states runs
    input_norm, then fc_norm (a speculators config reaches it through SpeculatorsConfig's
    update_eagle3, which copies both flags); TensorRT-LLM's Eagle3DraftModel fc_norm only (an
    elif); SGLang's LlamaForCausalLMEagle3 neither (plain fc; load_weights skips the norms'
    weights). And no trainer writes it: speculators added fc_norm in its PR #670 (d1b7542,
    2026-07-02, first released in v0.7.0) with Eagle3SpeculatorConfig._check_norm_flags refusing
    the pair (PEagleSpeculatorConfig inherits it), and no release before had the field;
    SpecForge writes fc_norm only, EAGLE neither. So the config cannot say which the draft was
    trained with, in either format (results/README.md, "Session 43")."""
    if fc_norm and norm_before_fc:
        raise UserError(f"{where}: fc_norm and norm_before_fc are both true (vLLM then runs both norms before fc, "
                        "TensorRT-LLM fc_norm only, SGLang neither; speculators refuses the pair, and no release "
                        "of it wrote one); expected one of them, the one the draft was trained with")


def _logit_scale(f: _Fields) -> float:
    """A draft's ``logit_scale``, as vLLM reads it (vllm/model_executor/models/llama_eagle3.py
    Eagle3LlamaForCausalLM: ``getattr(config, "logit_scale", 1.0)`` into
    LogitsProcessor(scale=...), whose forward multiplies the draft-vocabulary logits by it before
    the d2t scatter): 1 when absent. SGLang's llama_eagle3 gives its LogitsProcessor none (the
    same greedy drafts; sampled drafts differ, both lossless). Zero or below flattens or reverses
    the logits' ranking, which vLLM's own vocab-parallel argmax refuses (get_top_tokens)."""
    v = f.float("logit_scale", required=False, default=1.0)
    if not (math.isfinite(v) and v > 0):
        raise UserError(f"{f.where}: logit_scale {v!r}: expected a positive number (vLLM multiplies the draft's "
                        "logits by it; zero or below flattens or reverses their ranking)")
    return v


def load_target_config(folder: Path) -> TargetConfig:
    """Read ``folder/config.json`` (and ``generation_config.json`` for EOS ids when present)."""
    path = Path(folder) / "config.json"
    data = read_json(path)
    if "speculators_model_type" in data:
        raise UserError(f"{path}: a speculators draft (speculators_model_type {data['speculators_model_type']!r}), "
                        "not a target model: give the target's folder first and this one with --draft")
    f = _Fields(data, str(path))
    archs = f.list("architectures")
    if not archs or not all(isinstance(a, str) for a in archs):
        raise UserError(f"{path}: field 'architectures' must be a non-empty list of class names")
    decoder = parse_decoder(data, str(path))
    expected = ARCHITECTURES[decoder.model_type]["hf_class"]
    if archs[0] != expected:
        raise UserError(f"{path}: architectures[0] is '{archs[0]}', expected '{expected}' for model_type '{decoder.model_type}'")
    vocab = decoder.vocab_size
    eos = _token_ids(data.get("eos_token_id"), str(path), "eos_token_id", vocab)
    gen_path = Path(folder) / "generation_config.json"
    if gen_path.is_file():
        gen = read_json(gen_path)
        eos = _token_ids(gen.get("eos_token_id"), str(gen_path), "eos_token_id", vocab) or eos
    bos = _token_ids(data.get("bos_token_id"), str(path), "bos_token_id", vocab)
    return TargetConfig(decoder=decoder, architecture=archs[0], eos_token_ids=eos, bos_token_id=bos[0] if bos else None)


def load_draft_config(folder: Path, aux_ids_count: str | None = None) -> DraftConfig:
    """Read a draft's ``config.json`` (never its ``config.py``): a speculators draft, or an
    EAGLE-3 draft in EAGLE's own format (load_eagle_config; ``aux_ids_count`` is for those)."""
    path = Path(folder) / "config.json"
    data = read_json(path)
    f = _Fields(data, str(path))
    if "speculators_model_type" not in data and (
            "draft_vocab_size" in data or any("eagle" in str(a).lower() for a in data.get("architectures") or [])):
        return load_eagle_config(data, path, aux_ids_count)
    if aux_ids_count is not None:
        raise UserError(f"--draft-aux-ids is for an EAGLE-3 draft in EAGLE's own format ({EAGLE_ARCHITECTURE}) "
                        f"whose config names its aux layer ids; {path} is not one (expected the option left out)")
    if "speculators_model_type" not in data and "model_type" in data:
        raise UserError(f"{path}: a transformers model (model_type {data['model_type']!r}), not a speculators draft "
                        "(no speculators_model_type): --draft takes the draft's folder, the target comes first")
    kind = f.str("speculators_model_type")
    if kind not in DRAFT_TYPES:
        raise UserError(f"{path}: speculators_model_type '{kind}' is not supported (supported: {', '.join(DRAFT_TYPES)})")
    layer = f.dict("transformer_layer_config")
    decoder = parse_decoder(layer.data, layer.where)
    # vLLM builds the draft's config from transformer_layer_config (SpeculatorsConfig
    # extract_transformers_pre_trained_config) and never sees a top-level one
    logit_scale = _logit_scale(layer)
    if "logit_scale" in data and data["logit_scale"] != layer.data.get("logit_scale"):
        raise UserError(f"{path}: logit_scale {data['logit_scale']!r} is at the top level, where vLLM does not read "
                        "it (it reads transformer_layer_config.logit_scale); expected it there, or left out")
    # speculators trains a draft layer on sliding-window attention wherever layer_types marks
    # it, whatever the layer's model type (v0.7+ drafts: every layer, window 2048)
    kinds, window = layer.data.get("layer_types"), layer.data.get("sliding_window")
    if decoder.sliding_window is None and isinstance(kinds, list) and "sliding_attention" in kinds \
            and whole(window, 1):
        from dataclasses import replace

        decoder = replace(decoder, sliding_window=window)
    # applied in the graph only where every draft layer is windowed: marked sliding (what
    # speculators writes), or a Mistral layer config (transformers windows each of its layers);
    # a mix of kinds is recorded and said, not applied
    every = (isinstance(kinds, list) and len(kinds) >= decoder.num_layers and
             all(k == "sliding_attention" for k in kinds[:decoder.num_layers])) or \
        (kinds is None and decoder.model_type == "mistral")
    attention_window = decoder.sliding_window if every else None
    spec = f.dict("speculators_config")
    algorithm = spec.str("algorithm")
    if algorithm != kind:
        raise UserError(f"{spec.where}: algorithm '{algorithm}' disagrees with speculators_model_type '{kind}'")
    methods = spec.list("proposal_methods")
    if not methods or not isinstance(methods[0], dict):
        raise UserError(f"{spec.where}: proposal_methods must be a non-empty list of objects")
    # the method speculators names as its default (vLLM reads that one), else the first (said:
    # a default naming none of them is a config edited by hand, or for another reader)
    default = spec.str("default_proposal_method", required=False)
    at = next((i for i, m in enumerate(methods) if isinstance(m, dict) and default is not None
               and m.get("proposal_type") == default), 0)
    notes = []
    if default is not None and (methods[at] if isinstance(methods[at], dict) else {}).get("proposal_type") != default:
        notes.append(f"warning: {spec.where}: default_proposal_method '{default}' names none of proposal_methods' "
                     f"proposal_type ({', '.join(repr(m.get('proposal_type')) for m in methods if isinstance(m, dict))})"
                     ": read the first, as vLLM does")
    archs = data.get("architectures")
    named = {k for a in (archs if isinstance(archs, list) else []) for k in DRAFT_TYPES
             if _names_kind(str(a), k)}
    if named and kind not in named:  # (vLLM picks the draft's model by speculators_model_type)
        notes.append(f"warning: {path}: architectures {archs!r} names the draft kind {'/'.join(sorted(named))}, "
                     f"speculators_model_type '{kind}': read as {kind}, as vLLM reads it")
    if not isinstance(methods[at], dict):
        raise UserError(f"{spec.where}: proposal_methods[{at}] must be an object")
    k = _Fields(methods[at], f"{spec.where}.proposal_methods[{at}]").int("speculative_tokens")
    if k > MAX_DEPTH:
        raise UserError(f"{spec.where}.proposal_methods[{at}]: field 'speculative_tokens' is {k}; expected at most "
                        f"{MAX_DEPTH} (the deepest verify depth specrt builds)")
    verifier = spec.dict("verifier")
    v_arch = verifier.list("architectures")
    aux = f.list("eagle_aux_hidden_state_layer_ids", required=False)
    if aux is not None:
        if not 1 <= len(aux) <= MAX_AUX or not all(whole(i) for i in aux):
            raise UserError(f"{path}: eagle_aux_hidden_state_layer_ids must be a list of 1 to {MAX_AUX} layer ids "
                            f"(speculators' default is 3), found {aux!r}")
        if len(set(aux)) != len(aux) or list(aux) != sorted(aux):
            # vLLM collects the aux states in layer order (a repeated id once) and speculators
            # trains on them as stored: a draft's fc reads them ascending, whatever the list says
            raise UserError(f"{path}: eagle_aux_hidden_state_layer_ids {aux!r} must be distinct and ascending (vLLM "
                            "hands the draft its target's states in layer order, which its training data kept)")
        aux = tuple(aux)
    mask = f.int("mask_token_id", required=kind == "peagle", minimum=0)
    confidence = f.bool("enable_confidence_head", required=False, default=False)
    if confidence and f.bool("confidence_head_with_markov", required=False, default=False):
        raise UserError(f"{path}: confidence_head_with_markov is true: that confidence head reads a Markov head's "
                        f"embeddings, which {kind} drafts do not have (expected false or absent)")
    norm_before_fc = f.bool("norm_before_fc", required=False, default=False)
    fc_norm = f.bool("fc_norm", required=False, default=False)
    _refuse_both_fc_norms(str(path), fc_norm, norm_before_fc)
    return DraftConfig(
        kind=kind,
        decoder=decoder,
        draft_vocab_size=f.int("draft_vocab_size"),
        aux_layer_ids=aux,
        mask_token_id=mask,
        norm_before_residual=f.bool("norm_before_residual", required=False, default=False),
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=f.bool("norm_output", required=False, default=False),
        speculative_tokens=k,
        verifier_architectures=tuple(str(a) for a in v_arch),
        verifier_name=verifier.str("name_or_path", required=False) or None,
        target_hidden_size=f.int("target_hidden_size", required=False),
        confidence_head=confidence,
        attention_window=attention_window,
        logit_scale=logit_scale,
        notes=tuple(notes),
    )


def _names_kind(architecture: str, kind: str) -> bool:
    """Whether a class name in a draft's ``architectures`` names the draft kind ``kind``
    (PEagleDraftModel: peagle; Eagle3DraftModel, Eagle3Speculator, and EAGLE's own
    LlamaForCausalLMEagle3, by its whole name: eagle3)."""
    a = architecture.lower()
    if kind == "eagle3" and a == EAGLE_ARCHITECTURE.lower():
        return True
    return a.startswith("peagle") if kind == "peagle" else a.startswith(kind)


# EAGLE-3 drafts in EAGLE's own format, as SafeAILab/EAGLE (eagle/model/cnets.py, Model) and
# SGLang's SpecForge (specforge/modeling/draft/llama3_eagle.py, LlamaForCausalLMEagle3) save them:
# config.json is a Llama config of the one draft layer (vocab_size the target's) plus
# draft_vocab_size, maybe target_hidden_size, SpecForge's fc_norm / norm_output / eagle_config.
EAGLE_ARCHITECTURE = "LlamaForCausalLMEagle3"
# the format has no field for it; `speculators convert` writes 3 for these drafts (speculators
# src/speculators/convert/eagle/eagle3_converter.py) and an EAGLE-3 export uses it only in export.json
EAGLE_SPECULATIVE_TOKENS = 3
# eagle_config fields with the one value the EAGLE-3 layer has: (key, that value, what another means)
EAGLE_CONFIG_FIXED = (
    ("use_aux_hidden_state", True, "no fc over the target's states"),
    ("use_last_layernorm", True, "ModelOpt: no final norm before the head"),
    ("use_input_layernorm_in_first_layer", True, "ModelOpt's Megatron flow: no hidden_norm"),
    ("use_mtp_layernorm", False, "ModelOpt: MTP-style enorm/hnorm instead"),
    ("parallel_draft_step", 1, "ModelOpt: parallel draft heads"),
    ("eh_proj_before_attn", False, "TensorRT-LLM: an MTP-style eh_proj before the attention"),
)
# flags a config may set at the top level or in eagle_config: (top-level key, eagle_config key).
# TensorRT-LLM reads norm_before_fc from eagle_config only and norm_output as
# eagle_config.return_hidden_post_norm or the top-level norm_output
# (tensorrt_llm/_torch/models/modeling_speculative.py Eagle3DraftModel), vLLM
# norm_before_fc from either (eagle_config first, llama_eagle3.py LlamaModel), SGLang from
# neither (its llama_eagle3.py has no pre-fc norm; results/README.md "Session 43")
EAGLE_FLAG_PLACES = (("norm_before_fc", "norm_before_fc"), ("norm_output", "return_hidden_post_norm"))


def load_eagle_config(data: dict[str, Any], path: Path, aux_ids_count: str | None) -> DraftConfig:
    """An EAGLE-3 config in EAGLE's own format as the DraftConfig `speculators convert` gives
    for it. From the trainers' and servers' code:

    - one draft layer, ``midlayer`` (cnets.py Model; llama3_eagle.py): num_hidden_layers 1, a
      Llama layer, fc of 3 target widths (both build ``Linear(3 * target_hidden_size, H)``).
    - residual around the first attention: fc's output before hidden_norm (cnets.py
      LlamaDecoderLayeremb.forward, llama3_eagle.py LlamaDecoderLayer.forward, SGLang
      python/sglang/srt/models/llama_eagle3.py: ``residual = hidden_states`` first):
      norm_before_residual false unless the config says true, as vLLM reads it
      (vllm/model_executor/models/llama_eagle3.py, ``getattr(config, "norm_before_residual", False)``).
    - SpecForge's fc_norm is speculators' (RMSNorm of each aux state, fc_norm.{j}.weight; with
      norm_before_fc also true refused: the servers run different norms then), and so is
      norm_output (EAGLE 3.1: lm_head and the next step both read norm(h); absent or false: lm_head
      reads norm(h), the next step the pre-norm h, as cnets.py ``topK_genrate``). SGLang, vLLM,
      TensorRT-LLM and SpecForge since its PR #879 (2026-09) read it so, default false; SpecForge
      before that defaulted to true and meant only the head's norm (an EAGLE-3 draft), so a draft
      it trained then with norm_output written out is read as those servers read it.
    - ModelOpt's export (modelopt/torch/export/plugins/hf_spec_export.py EagleExporter) names the
      layer layers.0.* (slots.eagle_rows takes either), writes d2t without t2d, no embed_tokens,
      and its eagle_config fields (EAGLE_CONFIG_FIXED); its aux ids are layer outputs (a forward
      hook on each named layer, plugins/hf_eagle.py), as SGLang counts them.
    - aux layers named nowhere: SafeAILab's target keeps the states entering layers 2, L//2, L-3
      (eagle/model/modeling_llama_kv.py), SGLang's default is the same (python/sglang/srt/models/
      llama.py set_eagle3_layers_to_capture), SpecForge's default [1, L//2-1, L-4] counts outputs
      (specforge/algorithms/model_providers.py, SGLang adds 1): specrt's default (2, L//2, L-3).
      Named (eagle_config.eagle_aux_hidden_state_layer_ids), SGLang adds 1 (layer outputs, what
      SpecForge trains on) and vLLM adds nothing (vllm/v1/worker/gpu_model_runner.py
      _get_eagle3_aux_layers_from_config): the config does not say which, ``aux_ids_count`` must.
    - vocabulary: d2t/t2d as speculators' (cnets.py: ``topk_index + self.d2t[topk_index]``); over
      the whole vocabulary the draft's ids are the target's (binding._check_vocab_map).
    - logit_scale as vLLM reads it (_logit_scale).
    """
    where = str(path)
    f = _Fields(data, where)
    archs = f.list("architectures", required=False)
    # SafeAILab's training config (eagle/traineagle3/config.json; the yuhuili/EAGLE3-* drafts ship it as
    # written) says LlamaForCausalLM, which its
    # code never reads; draft_vocab_size (what sent the config here) and the midlayer's 2H-wide
    # q/k/v and 3H-wide fc the binding checks tell it from a Llama model or an EAGLE-1/2 draft
    if archs not in ([EAGLE_ARCHITECTURE], ["LlamaForCausalLM"]):
        raise UserError(f"{where}: architectures {archs!r} is not a draft specrt reads (expected "
                        f"[\"{EAGLE_ARCHITECTURE}\"], an EAGLE-3 draft as EAGLE and SpecForge save it, or a "
                        "speculators draft with speculators_model_type)")
    decoder = parse_decoder(data, where)
    if decoder.model_type != "llama" or decoder.num_layers != 1:
        raise UserError(f"{where}: model_type '{decoder.model_type}', num_hidden_layers {decoder.num_layers}: "
                        f"{EAGLE_ARCHITECTURE} holds one Llama layer (midlayer); expected 'llama' and 1")
    if decoder.tie_word_embeddings:
        raise UserError(f"{where}: tie_word_embeddings is true; expected false (the draft's lm_head is over its own "
                        "draft vocabulary)")
    if f.bool("bias", required=False, default=False):
        raise UserError(f"{where}: bias is true (SGLang then gives fc a bias, vLLM the attention projections), which "
                        "specrt does not build; expected false or absent")
    if "quantization_config" in data:
        raise UserError(f"{where}: quantization_config is set (a quantized draft, as ModelOpt exports one with its "
                        "scales), which specrt does not read; expected an unquantized draft")
    eagle = f.dict("eagle_config", required=False)
    if eagle is not None:
        # SGLang's and vLLM's use_aux_hidden_state, and ModelOpt's own fields (export_spec_ckpt_config's
        # template, modelopt/torch/export/plugins/hf_spec_configs.py), each at the value the EAGLE-3
        # layer specrt builds has; any other changes the forward pass
        for key, want, what in EAGLE_CONFIG_FIXED:
            v = eagle.data.get(key)
            if v is not None and v != want:
                raise UserError(f"{eagle.where}: {key} is {json.dumps(v)} ({what}), which specrt does not build; "
                                f"expected {json.dumps(want)} or absent")
    named = {k: v for k, v in (("eagle_aux_hidden_state_layer_ids", data.get("eagle_aux_hidden_state_layer_ids")),
                               ("eagle_config.eagle_aux_hidden_state_layer_ids",
                                eagle.data.get("eagle_aux_hidden_state_layer_ids") if eagle else None)) if v is not None}
    if len(named) == 2 and len({json.dumps(v) for v in named.values()}) == 2:
        raise UserError(f"{where}: {' and '.join(f'{k} {v!r}' for k, v in named.items())} differ; expected one")
    aux, extra = None, {}
    if named:
        key, ids = next(iter(named.items()))
        if not (isinstance(ids, list) and len(ids) == 3 and all(whole(i, 0) for i in ids) and ids == sorted(set(ids))):
            raise UserError(f"{where}: {key} must be 3 distinct ascending layer ids (fc reads 3 states), found {ids!r}")
        if aux_ids_count not in DRAFT_AUX_IDS:
            raise UserError(f"{where}: {key} is {ids}, and nothing in the config says how they count: SGLang (what "
                            "SpecForge trains with) reads id i as layer i's output, vLLM as the state entering layer "
                            "i; pass --draft-aux-ids layer-output or --draft-aux-ids layer-input")
        aux = tuple(i + DRAFT_AUX_IDS[aux_ids_count] for i in ids)
        extra = {"aux_layer_ids_written": ids, "aux_layer_ids_count": aux_ids_count}
    elif aux_ids_count is not None:
        raise UserError(f"--draft-aux-ids is given, but {where} names no aux layer ids (the default, the states "
                        "entering layers 2, L//2 and L-3, needs no option); expected the option left out")
    if archs != [EAGLE_ARCHITECTURE]:
        extra["architectures_written"] = archs
    if data.get("draft_vocab_size") is None:
        # vLLM (llama_eagle3.py) and TensorRT-LLM (_ensure_draft_vocab_size, its PR #10124) take
        # vocab_size and the draft's lm_head (TensorRT-LLM runs the target's only for a checkpoint
        # without lm_head.*, whatever draft_vocab_size says); SGLang (llama_eagle3.py,
        # load_lm_head_from_target) runs the target's for a null one and fails on a missing one
        # (config.draft_vocab_size). No trainer writes such a config
        # (EAGLE's cnets.py and SpecForge's llama3_eagle.py size lm_head from it), so no reading is right
        raise UserError(f"{where}: missing required field 'draft_vocab_size' (without it vLLM and TensorRT-LLM run "
                        "the draft's lm_head over the whole vocabulary, SGLang the target's lm_head); expected it "
                        f"written ({decoder.vocab_size} for a draft over the whole vocabulary)")
    flags = {}
    for key, inner in EAGLE_FLAG_PLACES:
        top = f.bool(key, required=False)
        nested = eagle.bool(inner, required=False) if eagle is not None else None
        if top is not None and nested is not None and top != nested:
            raise UserError(f"{where}: {key} {json.dumps(top)} and eagle_config.{inner} {json.dumps(nested)} differ; "
                            "expected one, or both the same")
        flags[key] = bool(top or nested)
    fc_norm = f.bool("fc_norm", required=False, default=False)
    _refuse_both_fc_norms(where, fc_norm, flags["norm_before_fc"])
    return DraftConfig(
        kind="eagle3",
        decoder=decoder,
        draft_vocab_size=f.int("draft_vocab_size"),
        aux_layer_ids=aux,
        mask_token_id=None,
        norm_before_residual=f.bool("norm_before_residual", required=False, default=False),
        norm_before_fc=flags["norm_before_fc"],
        fc_norm=fc_norm,
        norm_output=flags["norm_output"],
        speculative_tokens=EAGLE_SPECULATIVE_TOKENS,
        verifier_architectures=(),  # (the format names no verifier)
        target_hidden_size=f.int("target_hidden_size", required=False),
        extra=extra,
        source_format="eagle",
        logit_scale=_logit_scale(f),
    )
