"""A PEFT LoRA adapter merged into the target's weights at export (``specrt export --lora``).

The adapter folder is what PEFT's ``save_pretrained`` writes: ``adapter_config.json`` and
``adapter_model.safetensors`` (``adapter_model.bin``, a pickle, only with
``--allow-lora-pickle``). Each merged linear weight becomes

    W' = W + scale * B @ A        A: lora_A [r, in], B: lora_B [out, r], W: [out, in]
    scale = alpha / r, or alpha / sqrt(r) with use_rslora (PEFT's LoraLayer.update_layer)

with r and alpha per module from rank_pattern / alpha_pattern where one of their keys matches
the module's name (PEFT's get_pattern_key: the first key K, in the file's order, for which
``(.*\\.)?(K)$`` matches the module's full name, e.g. ``model.layers.3.mlp.down_proj``).

Binding is as the checkpoint's (binding.py): exact names only. The tensors of the module
whose weight the target binds as ``model.layers.3.self_attn.q_proj.weight`` must be named
``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight`` and ``.lora_B.weight``
(PEFT's names: its PeftModel's prefix, the adapter's name taken out); every tensor of the
adapter must bind so, or the export stops naming it. Only the decoder layers' linear weights
(q, k, v, o, gate, up, down) take an adapter. ``modules_to_save`` of ``embed_tokens`` and
``lm_head`` (the chat fine-tune's form: full copies trained beside the adapter) replace the
target's embeddings and LM head, bound as ``base_model.model.model.embed_tokens.weight`` and
``base_model.model.lm_head.weight`` (PEFT's names, ``modules_to_save.<adapter>`` taken out), of the
target's shapes; a target whose head is tied to its embeddings takes them only where they stay
tied. ``trainable_token_indices`` (PEFT's trainable tokens) replace those rows of the embeddings
(and so of a head tied to them). A tensor of a module that target_modules / exclude_modules /
layers_to_transform leaves out, as PEFT's loader reads them, is refused (PEFT drops it). What
changes the model any other way (DoRA, trained biases, other modules_to_save, other trainable
tokens, an embedding or LM-head LoRA, a resized vocabulary, an initialisation that
rewrote the base weights, PEFT's other LoRA variants) is refused, naming the field or the tensor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specrt.errors import UserError
from specrt.export.checkpoint import TensorReader, _scan_pickle, read_safetensors_index
from specrt.export.slots import FLOAT
from specrt.manifest import sha256_file
from specrt.paths import check_path_args, read_json_object

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_PICKLE = "adapter_model.bin"
PREFIX = "base_model.model."  # PeftModel's prefix before the base model's own module names
# the target slots an adapter may change: the decoder layers' linear weights (slots.py)
LINEAR_SLOTS = ("q", "k", "v", "o", "gate", "up", "down")
# modules_to_save it takes: PEFT's module name -> the target slot its full copy replaces
SAVED_SLOTS = {"embed_tokens": "embed", "lm_head": "lm_head"}

# init_lora_weights whose initialisation leaves the base weights as they were (PEFT's
# LoraLayer.update_layer): pissa*, corda*, astra*, olora, mica, loftq, lora_ga and nora rewrite
# (or read) them, so the adapter is trained against a residual base, not base_model_name_or_path's
UNTOUCHED_INITS = (True, False, "gaussian", "eva", "orthogonal")

# fields of adapter_config.json that change nothing merged here: dropout is off at inference; the
# others are bookkeeping or the settings of an initialisation (init_lora_weights is checked)
IGNORED = ("task_type", "inference_mode", "revision", "auto_mapping", "peft_version", "lora_dropout",
           "megatron_core", "qalora_group_size", "loftq_config", "eva_config",
           "corda_config", "astra_config", "lora_ga_config", "runtime_config", "ensure_weight_tying")

# fields that must hold their default (None, false, empty): what each one would change
OFF = {
    "use_dora": "DoRA (a magnitude vector rescales each merged weight's columns)",
    "lora_bias": "a bias on lora_B",
    "use_qalora": "QALoRA (the adapter reads pooled inputs)",
    "alora_invocation_tokens": "activated LoRA (applied only after its invocation tokens: no merge can run it)",
    "velora_config": "VeLoRA", "monteclora_config": "MonteCLoRA", "arrow_config": "Arrow routing",
    "kasa_config": "KaSA", "use_bdlora": "block-diagonal LoRA",
    "layer_replication": "layer replication (a model of other layers than the target's)",
    "target_parameters": "LoRA on parameters rather than linear modules",
    "megatron_config": "Megatron's parallel layers",
}
TAKEN = ("modules_to_save", "peft_type", "r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern",
         "fan_in_fan_out", "bias",
         "base_model_name_or_path", "layers_to_transform", "layers_pattern", "init_lora_weights",
         "target_modules", "exclude_modules", "trainable_token_indices")
# PEFT's target_modules where adapter_config.json has none (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
# of llama, mistral, qwen2 and qwen3, the families specrt takes); "all-linear" is every nn.Linear but the head
DEFAULT_TARGETS = ["q_proj", "v_proj"]


@dataclass(frozen=True)
class LoraModule:
    """One merged module: its A [rank, in] and B [out, rank] and scale (W' = W + scale * B @ A)."""

    slot: str
    a: Any  # BoundTensor
    b: Any
    rank: int
    alpha: float
    scale: float


@dataclass
class BoundLora:
    """An adapter bound to a target's slots; ``delta(slot)`` is scale * B @ A in float32."""

    folder: Path
    config: dict[str, Any]
    modules: dict[str, LoraModule]
    reader: TensorReader
    config_sha256: str = ""
    # modules_to_save: target slot -> the adapter's full copy that replaces its weight (BoundTensor)
    replaced: dict[str, Any] = field(default_factory=dict)
    # trainable_token_indices: target slot -> (its token ids, the adapter's rows for them: BoundTensor)
    tokens: dict[str, tuple[list[int], Any]] = field(default_factory=dict)
    # the slots of ``replaced`` whose copies save_pretrained's save_embedding_layers wrote, not modules_to_save (w78h)
    embedding_layers: frozenset = frozenset()

    def saved_by(self, slot: str) -> str:
        """What wrote ``slot``'s copy in ``replaced``: "modules_to_save" or "save_embedding_layers"."""
        return "save_embedding_layers" if slot in self.embedding_layers else "modules_to_save"

    def replaced_words(self) -> str:
        """Export's words for ``replaced``, by what wrote the copies (", its modules_to_save replacing embed")."""
        by: dict[str, list[str]] = {}
        for s in self.replaced:
            by.setdefault(self.saved_by(s), []).append(s)
        return "".join(f", its {'full copies saved by ' if b == 'save_embedding_layers' else ''}{b} replacing "
                       f"{', '.join(ss)}" for b, ss in by.items())

    def replacement(self, slot: str) -> np.ndarray:
        """The adapter's copy of ``slot`` (modules_to_save), float32, checked finite."""
        return self._finite(self.replaced[slot].entry)

    def _finite(self, e) -> np.ndarray:
        from specrt.export.binding import _scan_values

        x = self.reader.array(e)
        bad, nan, _ = _scan_values(x, False)
        if bad:
            raise UserError(f"{e.file}: tensor '{e.name}' holds {bad} non-finite value(s) "
                            f"({'NaN' if nan else 'inf'}); an adapter's weights must be finite")
        return x

    def token_rows(self, slot: str) -> tuple[list[int], np.ndarray]:
        """trainable_token_indices' ids and their trained rows (float32, checked finite), which
        replace the slot's rows at those ids, as PEFT's TrainableTokensLayer.merge (index_copy) does."""
        ids, t = self.tokens[slot]
        return ids, self._finite(t.entry)

    def delta(self, slot: str) -> np.ndarray:
        m = self.modules[slot]
        a, b = (self._finite(t.entry) for t in (m.a, m.b))
        d = b @ a  # [out, r] @ [r, in]; scaled after the product, as PEFT's get_delta_weight does
        d *= np.float32(m.scale)
        return d

    def to_json(self) -> dict[str, Any]:
        c = self.config
        # (receipts without them read as before; "saved_by" only on save_embedding_layers' copies, so a receipt
        # of modules_to_save's written before it was kept compares equal: compare, bench --variant)
        saved = ({"modules_to_save": {s: {**t.to_json(self.folder), **({"saved_by": by} if (
            by := self.saved_by(s)) != "modules_to_save" else {})} for s, t in self.replaced.items()}}
                 if self.replaced else {})
        if self.tokens:
            saved["trainable_tokens"] = {s: {"indices": i, **t.to_json(self.folder)} for s, (i, t) in self.tokens.items()}
        return {**saved,
            "folder": str(Path(self.folder).resolve()),
            "config": {"file": ADAPTER_CONFIG, "sha256": self.config_sha256},
            "base_model_name_or_path": c.get("base_model_name_or_path"),
            "r": c["r"], "lora_alpha": c["lora_alpha"], "use_rslora": bool(c.get("use_rslora")),
            "rank_pattern": c.get("rank_pattern") or {}, "alpha_pattern": c.get("alpha_pattern") or {},
            "modules": {s: {"rank": m.rank, "alpha": m.alpha, "scale": m.scale,
                            "lora_A": m.a.to_json(self.folder), "lora_B": m.b.to_json(self.folder)}
                        for s, m in self.modules.items()},
        }


def _number(v: Any, positive_int: bool = False) -> bool:
    if isinstance(v, bool):
        return False
    if positive_int:
        return isinstance(v, int) and v > 0
    return isinstance(v, (int, float)) and math.isfinite(v)


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """adapter_config.json, every field checked: what it takes, what it ignores, what it
    refuses (a UserError naming the file and the field)."""
    path = folder / ADAPTER_CONFIG
    if not path.is_file():
        # (PEFT's save_pretrained writes an adapter named other than "default" to a subfolder of that name)
        named = sorted(p.parent for p in folder.glob(f"*/{ADAPTER_CONFIG}") if p.is_file())
        raise UserError(f"{path}: not found (expected a PEFT LoRA adapter folder: {ADAPTER_CONFIG} and "
                        f"{ADAPTER_WEIGHTS}, as PEFT's save_pretrained writes them)"
                        + (f"; it saves an adapter not named 'default' in a subfolder: give --lora "
                           f"{' or '.join(map(str, named[:3]))}" if named else ""))
    c = read_json_object(path)
    where = lambda k: f"{path}: '{k}'"  # noqa: E731
    if c.get("peft_type") != "LORA":
        raise UserError(f"{where('peft_type')} is {c.get('peft_type')!r}; expected \"LORA\" (only LoRA adapters merge)")
    for k in ("r", "lora_alpha"):
        if k not in c:
            raise UserError(f"{where(k)} is missing; expected it as PEFT writes it")
    if not _number(c["r"], positive_int=True):
        raise UserError(f"{where('r')} is {c['r']!r}; expected a positive integer (the adapter's rank)")
    if not _number(c["lora_alpha"]):
        raise UserError(f"{where('lora_alpha')} is {c['lora_alpha']!r}; expected a number")
    for k, positive in (("rank_pattern", True), ("alpha_pattern", False)):
        p = c.get(k) or {}
        if not isinstance(p, dict):
            raise UserError(f"{where(k)} is {p!r:.60}; expected an object of module patterns to numbers")
        for key, v in p.items():
            if not _number(v, positive_int=positive):
                raise UserError(f"{where(k)}['{key}'] is {v!r}; expected "
                                f"{'a positive integer' if positive else 'a number'}")
            try:
                re.compile(key)
            except re.error as e:
                raise UserError(f"{where(k)}: key '{key}' is not a regular expression PEFT can match ({e})") from None
    for k in ("use_rslora", "fan_in_fan_out"):
        if c.get(k) not in (None, True, False):
            raise UserError(f"{where(k)} is {c[k]!r}; expected true or false")
    if c.get("bias", "none") != "none":
        raise UserError(f"{where('bias')} is {c['bias']!r}; expected \"none\" (an adapter that trained the biases "
                        "(\"all\", \"lora_only\") changes tensors a merge of B @ A does not carry)")
    init = c.get("init_lora_weights", True)
    if not any(init is u or (isinstance(u, str) and init == u) for u in UNTOUCHED_INITS):
        raise UserError(f"{where('init_lora_weights')} is {init!r}: such an initialisation rewrites the base weights "
                        "(PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA, ...), so the adapter was trained against a residual "
                        "model, not its base; save it with PEFT's save_pretrained(..., "
                        "path_initial_model_for_weight_conversion=...) to make a plain LoRA of the base (expected "
                        f"one of {', '.join(str(u).lower() if isinstance(u, bool) else u for u in UNTOUCHED_INITS)})")
    saved = c.get("modules_to_save")
    if saved not in (None, []) and not (isinstance(saved, list)
                                        and all(isinstance(m, str) and m.split(".")[-1] in SAVED_SLOTS for m in saved)):
        raise UserError(f"{where('modules_to_save')} is {saved!r:.60}: full copies of modules trained beside the "
                        "adapter, "
                        "of which `specrt export --lora` takes only \"embed_tokens\" and \"lm_head\" (the embeddings "
                        "and the LM head, PEFT's exact names); expected a list of those, or null")
    for k, what in OFF.items():
        if c.get(k) not in (None, False, [], {}):
            raise UserError(f"{where(k)} is {c[k]!r:.60}: {what}, which `specrt export --lora` does not merge; "
                            f"expected it unset (null or false), a plain LoRA of the decoder layers' linear weights")
    unknown = [k for k in c if k not in (*TAKEN, *IGNORED, *OFF) and c[k] not in (None, False, [], {})]
    if unknown:
        raise UserError(f"{where(unknown[0])} is {c[unknown[0]]!r:.60}: a field specrt does not know (from a newer "
                        "PEFT?), which may change what the adapter computes; expected it unset")
    for k in ("target_modules", "exclude_modules"):
        v = c.get(k)
        if v is not None and not (isinstance(v, str) or isinstance(v, list) and all(isinstance(m, str) for m in v)):
            raise UserError(f"{where(k)} is {v!r:.60}; expected a list of module names, a regular expression or null")
        try:
            re.compile(v) if isinstance(v, str) else None
        except re.error as e:
            raise UserError(f"{where(k)} is {v!r:.60}, not a regular expression PEFT can match ({e})") from None
    for k in ("layers_to_transform", "layers_pattern"):  # (PeftConfig's and LoraConfig's own checks)
        if isinstance(c.get("target_modules"), str) and c.get(k) is not None:
            raise UserError(f"{where(k)} is {c[k]!r:.60} with target_modules a string ({c['target_modules']!r:.60}), "
                            "which PEFT refuses to load; expected null, or target_modules a list of module names")
    tt = c.get("trainable_token_indices")
    ids = next(iter(tt.values()), None) if isinstance(tt, dict) and len(tt) == 1 else tt
    if tt is not None and not (isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool)
                                                                   and i >= 0 for i in ids)
                               and len(set(ids)) == len(ids)
                               and (not isinstance(tt, dict) or next(iter(tt)).split(".")[-1] == "embed_tokens")):
        raise UserError(f"{where('trainable_token_indices')} is {tt!r:.60}; expected a list of token ids, each once "
                        "(or {\"embed_tokens\": that list}): the embeddings' rows trained (`specrt export --lora` takes "
                        "no other module's)")
    if tt is not None and "embed_tokens" in [m.split(".")[-1] for m in saved or []]:  # (PEFT refuses it too)
        raise UserError(f"{where('trainable_token_indices')} is {tt!r:.60} beside modules_to_save {saved}, which trains "
                        "the whole embeddings; expected one of them")
    lt = c.get("layers_to_transform")
    index = lambda i: isinstance(i, int) and not isinstance(i, bool) and i >= 0  # noqa: E731
    if lt is not None and not (index(lt) or (isinstance(lt, list) and all(index(i) for i in lt))):
        raise UserError(f"{where('layers_to_transform')} is {lt!r:.60}; expected a layer index or a list of them")
    lp = c.get("layers_pattern")
    if lp not in (None, [], "layers") and not (isinstance(lp, list) and "layers" in lp):
        raise UserError(f"{where('layers_pattern')} is {lp!r:.60}: the target's decoder layers are "
                        "'model.layers.<i>', which it does not name; expected null or \"layers\"")
    return c


def _pattern(patterns: dict, module: str) -> str | None:
    """The key of ``patterns`` PEFT's get_pattern_key takes for ``module`` (None: none matches)."""
    return next((k for k in patterns if re.match(rf"(.*\.)?({k})$", module)), None)


def _module_names(target) -> list[str]:
    """The target's module names as transformers' named_modules() gives them for the families specrt
    takes (Llama, Mistral, Qwen2, Qwen3; the root is ''). (A multimodal wrapper's other modules, a
    vision tower's, are not among them.)"""
    d = target.config.decoder
    m = target.slots["embed"].entry.name[: -len(".embed_tokens.weight")]  # model, model.llm, language_model.model
    stem = m.rpartition("model")[0]
    layer = ["", ".self_attn", *(f".self_attn.{k}_proj" for k in "qkvo"),
             *((".self_attn.q_norm", ".self_attn.k_norm") if d.qk_norm else ()), ".mlp",
             *(f".mlp.{k}_proj" for k in ("gate", "up", "down")), ".mlp.act_fn", ".input_layernorm",
             ".post_attention_layernorm"]
    return ["", *(m[:i] for i in range(1, len(m)) if m[i] == "."), m, f"{m}.embed_tokens",
            f"{m}.layers", *(f"{m}.layers.{i}{k}" for i in range(d.num_layers) for k in layer), f"{m}.norm",
            f"{m}.rotary_emb", f"{stem}lm_head"]


def _condensed(tm, names: list[str]):
    """``tm`` as PEFT's inject_adapter matches it against the base model's module ``names``: a list of
    MIN_TARGET_MODULES_FOR_OPTIMIZATION (20) names or more condensed by its _find_minimal_target_modules
    into the shortest suffixes no other module has, where that makes it shorter (r78g, m78i)."""
    if isinstance(tm, str) or len(set(tm)) < 20 or "" in tm:
        return tm
    tm = set(tm)
    ends = tuple(f".{k}" for k in tm)
    others = {".".join(p[i:]) for n in names if n not in tm and not n.endswith(ends)
              for p in [n.split(".")] for i in range(len(p))}
    short = set()
    for item, suffixes in sorted(((t, [".".join(t.split(".")[i:]) for i in range(t.count("."), -1, -1)]) for t in tm),
                                 key=lambda t: t[1]):
        for suffix in suffixes:
            if suffix in short or suffix in others:
                continue
            if not any(item.endswith(f".{k}") for k in short):
                short.add(suffix)
                break
    return sorted(short) if short and len(short) < len(tm) else sorted(tm)


def _left_out(c: dict, module: str, layer: int) -> str | None:
    """The field of ``c`` for which PEFT's loader gives ``module`` (the base model's name, e.g.
    ``model.layers.3.mlp.down_proj``, of decoder layer ``layer``) no adapter, read as its
    check_target_module_exists reads them (target_modules as _condensed leaves it); None where it
    gives it one."""
    ex = c.get("exclude_modules")
    if ex and (re.fullmatch(ex, module) if isinstance(ex, str) else
               module in ex or module.endswith(tuple(f".{k}" for k in ex))):
        return "exclude_modules"
    tm = DEFAULT_TARGETS if c.get("target_modules") is None else c["target_modules"]
    if isinstance(tm, str):  # (no layers_to_transform beside it: read_adapter_config)
        return None if tm.lower() == "all-linear" or re.fullmatch(tm, module) else "target_modules"
    if not (module in tm or module.endswith(tuple(f".{k}" for k in tm))):
        return "target_modules"
    # (a module named whole in the list: PEFT's takes it in any layer, r78g)
    lt = c.get("layers_to_transform")
    if module not in tm and lt not in (None, []) and \
            layer not in ({lt} if isinstance(lt, int) else set(lt)):
        return "layers_to_transform"
    return None


def _classify(key: str) -> str:
    """Why an adapter tensor that binds to no slot is not taken (the error's words)."""
    if re.search(r"(^|\.)(embed_tokens|lm_head)\.weight$", key) and "modules_to_save" not in key:
        return ("a full copy of the embeddings or the LM head, which PEFT saves for modules_to_save or for a "
                "vocabulary resized for added tokens (save_embedding_layers); export takes such a copy only "
                "of the target's shape")
    if "lora_magnitude_vector" in key:
        return "DoRA's magnitude vector (use_dora)"
    if "lora_embedding_" in key or ".embed_tokens." in key:
        return "a LoRA on the embeddings, which export does not merge"
    if ".lm_head." in key:
        return "a LoRA on the LM head, which export does not merge"
    if "modules_to_save" in key or "trainable_tokens" in key or "token_adapter" in key:
        return "a module trained in full beside the adapter (modules_to_save, trainable tokens)"
    if key.endswith(".bias"):
        return "a trained bias (bias, lora_bias), which export does not merge"
    return ("it fills no target slot: expected 'base_model.model.<the target's tensor name without .weight>"
            ".lora_A.weight' or '.lora_B.weight' for a decoder layer's q/k/v/o/gate/up/down projection")


def _weights(folder: Path, allow_pickle: bool) -> dict:
    st, pk = folder / ADAPTER_WEIGHTS, folder / ADAPTER_PICKLE
    if st.is_file():
        return read_safetensors_index(st)
    if pk.is_file():
        if not allow_pickle:
            raise UserError(f"{folder}: only pickle weights ({ADAPTER_PICKLE}) found; they are not read unless you "
                            "pass --allow-lora-pickle (unpickling can execute code). Convert to safetensors if you can.")
        return _scan_pickle(folder, pk, "--allow-lora-pickle")
    raise UserError(f"{folder}: no {ADAPTER_WEIGHTS} (or {ADAPTER_PICKLE}) found beside {ADAPTER_CONFIG}")


def bind_lora(folder: str | Path, target, allow_pickle: bool = False) -> BoundLora:
    """The adapter at ``folder`` bound to ``target``'s (a BoundTarget) linear slots, checked whole:
    every tensor binds by its exact name, in pairs, of the shapes the rank and the weight imply."""
    from specrt.export.binding import BoundTensor

    check_path_args("a folder", lora=folder)
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a LoRA adapter folder (not a directory)")
    c = read_adapter_config(folder)
    entries = _weights(folder, allow_pickle)
    rank_p, alpha_p = c.get("rank_pattern") or {}, c.get("alpha_pattern") or {}
    reader, modules, used = TensorReader(), {}, set()
    read = {**c, "target_modules": _condensed(c["target_modules"], _module_names(target))} \
        if isinstance(c.get("target_modules"), list) else c
    for slot, bound in target.slots.items():
        if slot.split(".")[-1] not in LINEAR_SLOTS or not bound.entry.name.endswith(".weight"):
            continue
        module = bound.entry.name[: -len(".weight")]
        names = {ab: f"{PREFIX}{module}.lora_{ab}.weight" for ab in "AB"}
        have = {ab: entries[n] for ab, n in names.items() if n in entries}
        if not have:
            continue
        if len(have) == 1:
            (ab, e), = have.items()
            other = "B" if ab == "A" else "A"
            raise UserError(f"{e.file}: tensor '{e.name}' has no '{names[other]}' beside it; expected both halves of "
                            "each module's adapter")
        i = int(slot.split(".")[1])
        if (why := _left_out(read, module, i)) is not None:  # (w78c: merged, where PEFT's merged model has none of it)
            said = (f"layers_to_transform {c[why]}" if why == "layers_to_transform" else
                    f"{why} {c[why]!r:.80}" if c.get(why) is not None else f"{why} null (PEFT's default {DEFAULT_TARGETS})")
            raise UserError(f"{have['A'].file}: tensor '{have['A'].name}' adapts "
                            f"{f'layer {i}' if why == 'layers_to_transform' else repr(module)}, which "
                            f"{folder / ADAPTER_CONFIG}'s {said} leaves out: PEFT's loader drops such a tensor "
                            "(warning of \"unexpected adapter keys\"), and its merged model has none of it; expected "
                            f"the adapter's tensors and its {why} to agree (list the module, or remove the tensor)")
        rk, ak = _pattern(rank_p, module), _pattern(alpha_p, module)
        r = rank_p[rk] if rk is not None else c["r"]
        alpha = alpha_p[ak] if ak is not None else c["lora_alpha"]
        out, inp = bound.entry.shape
        said = f"rank_pattern['{rk}'] {r}" if rk is not None else f"r {r}"
        for ab, want in (("A", (r, inp)), ("B", (out, r))):
            e = have[ab]
            if e.dtype not in FLOAT:
                raise UserError(f"{e.file}: tensor '{e.name}' has dtype {e.dtype}, expected one of "
                                f"{', '.join(FLOAT)}")
            if tuple(e.shape) != want:
                raise UserError(f"{e.file}: tensor '{e.name}' has shape {list(e.shape)}; expected {list(want)} "
                                f"({folder / ADAPTER_CONFIG}'s {said}, and the target's '{bound.entry.name}' of "
                                f"shape {list(bound.entry.shape)}: an adapter for another model?)")
        scale = alpha / math.sqrt(r) if c.get("use_rslora") else alpha / r
        a, b = (BoundTensor(slot, have[ab], reader.sha256(have[ab])) for ab in "AB")
        modules[slot] = LoraModule(slot, a, b, r, alpha, scale)
        used.update(names.values())
    replaced, layers = _saved_modules(folder, c, entries, target, reader, used)
    tokens = _token_rows(folder, c, entries, target, reader, used)
    leftovers = sorted(set(entries) - used)
    if leftovers:
        k = leftovers[0]
        more = f" ({len(leftovers) - 1} more tensors bind to no slot)" if len(leftovers) > 1 else ""
        why, shape, want = _classify(k), entries[k].shape, target.slots["embed"].entry.shape
        if why.startswith("a full copy") and tuple(shape) != tuple(want):
            why += f"; it has shape {list(shape)}, {_resized(shape, want)}"
        raise UserError(f"{entries[k].file}: adapter tensor '{k}' is not taken: {why}{more}")
    if not modules and not replaced and not tokens:
        raise UserError(f"{folder}: the adapter holds no tensors")
    return BoundLora(folder, c, modules, reader, sha256_file(folder / ADAPTER_CONFIG), replaced, tokens, layers)


def _token_rows(folder: Path, c: dict, entries: dict, target, reader: TensorReader, used: set) -> dict:
    """trainable_token_indices (PEFT's TrainableTokens beside a LoRA) bound: {"embed": (its ids, the
    BoundTensor of their trained rows)}, its name added to ``used``. PEFT's merge replaces those rows
    of the embeddings (the rows saved are whole rows, not deltas, despite its name); a head tied to
    them follows, as here, where the tied head is the embeddings' slot; an untied head is kept."""
    from specrt.export.binding import BoundTensor

    tt = c.get("trainable_token_indices")
    if tt is None:
        return {}
    ids = next(iter(tt.values())) if isinstance(tt, dict) else tt
    embed = target.slots["embed"].entry
    name = f"{PREFIX}{embed.name[: -len('.weight')]}.token_adapter.trainable_tokens_delta"
    if name not in entries:
        raise UserError(f"{folder / ADAPTER_WEIGHTS}: no tensor '{name}', which {folder / ADAPTER_CONFIG}'s "
                        f"trainable_token_indices {ids!r:.60} promises (PEFT's name for the trained rows)")
    e, want = entries[name], [len(ids), embed.shape[1]]
    if e.dtype not in FLOAT:
        raise UserError(f"{e.file}: tensor '{e.name}' has dtype {e.dtype}, expected one of {', '.join(FLOAT)}")
    if max(ids) >= embed.shape[0]:
        raise UserError(f"{folder / ADAPTER_CONFIG}: trainable_token_indices holds the id {max(ids)}, past the target's "
                        f"vocabulary of {embed.shape[0]} ('{embed.name}'); expected ids of its tokens")
    if list(e.shape) != want:
        raise UserError(f"{e.file}: tensor '{e.name}' has shape {list(e.shape)}; expected {want}, a row for each of "
                        f"trainable_token_indices' {len(ids)} ids, as wide as the target's '{embed.name}'")
    used.add(name)
    return {"embed": (ids, BoundTensor("embed", e, reader.sha256(e)))}


def _saved_modules(folder: Path, c: dict, entries: dict, target, reader: TensorReader, used: set) -> tuple:
    """modules_to_save's embed_tokens / lm_head bound to the slots they replace (slot -> BoundTensor),
    and the slots of them save_embedding_layers wrote; their names added to ``used``: each of the
    target's [vocab, hidden] shape; a tied head takes them only where it stays tied (both given,
    equal), as PEFT's merged model has it."""
    from specrt.export.binding import BoundTensor

    saved = c.get("modules_to_save") or []
    embed = target.slots["embed"].entry
    stem = embed.name[: -len("model.embed_tokens.weight")] if embed.name.endswith("model.embed_tokens.weight") else ""
    names = {"embed": f"{PREFIX}{embed.name}", "lm_head": f"{PREFIX}{stem}lm_head.weight"}
    bound, layers = {}, frozenset()
    # save_embedding_layers (true, or PEFT's "auto" where the embeddings are targeted) writes the full
    # embeddings and head beside the adapter, modules_to_save naming neither; PEFT's load takes them into
    # the model (load_state_dict, strict=False), so they replace the slots as its copies do (w78h); of
    # another shape (a resized vocabulary) they stay unbound, refused below naming it
    listed = {SAVED_SLOTS[m.split(".")[-1]] for m in saved}
    unlisted = [m for m, s in SAVED_SLOTS.items() if s not in listed and names[s] in entries
                and tuple(entries[names[s]].shape) == tuple(embed.shape)]
    for module in [*saved, *unlisted]:
        slot = SAVED_SLOTS[module.split(".")[-1]]
        name = names[slot]
        if "." in module and f"{PREFIX}{module}.weight" != name:  # (a full name, as PEFT writes one for a tie)
            raise UserError(f"{folder / ADAPTER_CONFIG}: 'modules_to_save' names '{module}', which is not the target's "
                            f"module '{name[len(PREFIX):-len('.weight')]}'; expected PEFT's exact names")
        if slot in bound:
            continue
        if name not in entries:
            raise UserError(f"{folder / ADAPTER_WEIGHTS}: no tensor '{name}', which {folder / ADAPTER_CONFIG}'s "
                            f"modules_to_save {saved} promises (PEFT's name for its full copy of {module})")
        e = entries[name]
        if e.dtype not in FLOAT:
            raise UserError(f"{e.file}: tensor '{e.name}' has dtype {e.dtype}, expected one of {', '.join(FLOAT)}")
        if tuple(e.shape) != tuple(embed.shape):
            raise UserError(f"{e.file}: tensor '{e.name}' has shape {list(e.shape)}; expected {list(embed.shape)}, the "
                            f"target's '{embed.name}' ({_resized(e.shape, embed.shape)})")
        bound[slot] = BoundTensor(slot, e, reader.sha256(e))
        used.add(name)
        layers |= {slot} if module in unlisted else set()
    if bound and "lm_head" in target.aliases:  # (tied: one matrix serves both, the embeddings' slot)
        if "lm_head" not in bound and names["lm_head"] in entries:  # (ensure_weight_tying lists one, saves both)
            e = entries[names["lm_head"]]
            bound["lm_head"] = BoundTensor("lm_head", e, reader.sha256(e))
            used.add(names["lm_head"])
        if len(bound) == 1 or bound["embed"].sha256 != bound["lm_head"].sha256:
            e = next(iter(bound.values())).entry
            raise UserError(
                f"{e.file}: the target's LM head is tied to its embeddings (tie_word_embeddings), and the adapter's "
                f"modules_to_save {saved} {'trains only one of them' if len(bound) == 1 else 'holds them apart'} "
                "(PEFT unties them without ensure_weight_tying): expected both, equal; or export the merged model "
                "(PEFT's merge_and_unload, then save_pretrained, with tie_word_embeddings false in its config.json)")
        bound.pop("lm_head")
    return bound, layers


def _resized(shape, want) -> str:
    if len(shape) == 2 and shape[1] == want[1] and shape[0] != want[0]:
        return (f"a vocabulary of {shape[0]} tokens, not the target's {want[0]}: one resized for added tokens, which "
                "export cannot take with the base's config and tokenizer; export the merged model (PEFT's "
                "merge_and_unload, then save_pretrained with the fine-tune's tokenizer) instead")
    return "an adapter for another model?"


def fan_in_fan_out_note(lora: BoundLora) -> str | None:
    """fan_in_fan_out true is for weights stored [in, out] (GPT-2's Conv1D); the targets specrt
    takes are transformers' nn.Linear, for which PEFT sets it false (with a warning) and merges
    B @ A untransposed, as here."""
    if lora.config.get("fan_in_fan_out"):
        return (f"note: {lora.folder / ADAPTER_CONFIG}: fan_in_fan_out is true, which is for weights stored "
                "[in, out] (GPT-2's Conv1D); the target's projections are nn.Linear [out, in], for which PEFT sets "
                "it false and merges B @ A as it is, as export does")
    return None


def base_note(lora: BoundLora, target_folder: Path) -> str | None:
    """A warning where base_model_name_or_path does not name the target: a hub id's model name
    (or a path's last folder) that is no folder name of the target's path nor of its Hugging Face
    cache form (models--ORG--NAME). A warning, not an error: the name cannot be checked against
    the weights (a local copy, a snapshot folder named by its hash, a renamed folder all name the
    same base), and an adapter for a model of another shape is refused by its tensors' shapes."""
    base = lora.config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        return None
    parts = [p.lower() for p in Path(target_folder).resolve().parts]
    b = base.strip().rstrip("/")
    name = b.split("/")[-1].lower()
    hub = "models--" + b.replace("/", "--").lower()
    if name in parts or hub in parts or Path(b).expanduser().resolve() == Path(target_folder).resolve():
        return None
    return (f"warning: {lora.folder / ADAPTER_CONFIG}: base_model_name_or_path is {base!r}, which does not name the "
            f"target {target_folder}: an adapter trained on another base model (of the same shapes) merges into a "
            "model it was not trained for; export it against its own base if this is not a copy of it")


def others_note(lora: BoundLora) -> str | None:
    """A note where the adapter's folder holds other adapters in subfolders (PEFT's save_pretrained of a
    model with several adapters: "default" at the top, each other name in OUT/<name>/): the one at the
    top is merged, as PeftModel.from_pretrained(OUT) loads it, and the others are not (w78h: said nowhere)."""
    others = sorted(p.parent.name for p in Path(lora.folder).glob(f"*/{ADAPTER_CONFIG}") if p.is_file())
    if not others:
        return None
    return (f"note: {lora.folder} also holds the adapter(s) {', '.join(others[:5])} in subfolders (PEFT's save of "
            "several adapters); merging only the one at its top ('default'), as PEFT's from_pretrained loads it: "
            f"give --lora {Path(lora.folder) / others[0]} to merge another")
