"""Bind checkpoint tensors to canonical slots (export/slots.py) and write the receipt.

Binding is all-or-nothing: every required slot filled by exactly one exact name, every
tensor of the checkpoint either bound or declared ignorable, every shape and dtype as
the config says. Any failure is a ``UserError`` naming the slot, the candidates seen
and the file. The receipt records, for every slot, the key, shard, shape, dtype and
the sha256 of the raw bytes, and for a draft the target tensors it relies on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specrt.contracts import DRAFT_EMBEDDINGS
from specrt.errors import UserError
from specrt.export import slots as S
from specrt.export.checkpoint import PICKLE_SOURCES, TensorEntry, TensorReader, scan_folder
from specrt.export.config import (EAGLE_ARCHITECTURE, DecoderConfig, DraftConfig, TargetConfig, draft_length_note,
                                  load_draft_config, load_target_config)
from specrt.manifest import manifest_digest
from specrt.paths import check_path_args

RECEIPT_FORMAT = "specrt-binding-receipt/1"


@dataclass(frozen=True)
class BoundTensor:
    slot: str
    entry: TensorEntry
    sha256: str

    def to_json(self, folder: Path) -> dict[str, Any]:
        file = PICKLE_SOURCES.get(self.entry.file, self.entry.file)  # a pickle's, not its temporary conversion
        return {
            "key": self.entry.name,
            "file": str(file.relative_to(folder)) if file.is_relative_to(folder) else str(file),
            "shape": list(self.entry.shape),
            "dtype": self.entry.dtype,
            "sha256": self.sha256,
        }


def _scan_values(a: np.ndarray, want_max: bool, chunk: int = 1 << 22) -> tuple[int, bool, float]:
    """(non-finite values, whether any is NaN, the largest finite |value| when ``want_max``) of a
    float array, a chunk at a time: whole-array temporaries were a quarter (isfinite) to the
    whole (abs) of a weight's size again, 2 GB for a 128k x 4096 embedding."""
    flat = a.reshape(-1)
    bad, nan, big = 0, False, 0.0
    for k in range(0, flat.size, chunk):
        c = flat[k:k + chunk]
        fin = np.isfinite(c)
        n = c.size - int(np.count_nonzero(fin))
        if n:
            bad, nan = bad + n, nan or bool(np.isnan(c).any())
        if want_max and n < c.size:
            big = max(big, float(np.abs(c[fin] if n else c).max()))
    return bad, nan, big


@dataclass
class Bound:
    """Slots of one checkpoint. ``get(slot)`` returns float32 (floats) or the stored ints/bools."""

    folder: Path
    slots: dict[str, BoundTensor]
    reader: TensorReader
    aliases: dict[str, str] = field(default_factory=dict)  # slot -> slot it is served by (ties)
    # a tied slot's own tensor when the checkpoint stores one equal to what serves it (receipt only)
    tied_copies: dict[str, BoundTensor] = field(default_factory=dict)
    # the export's dtype where it narrows the weights ("float16": its range is checked as each is read)
    export_dtype: str | None = None

    def has(self, slot: str) -> bool:
        return slot in self.slots or slot in self.aliases

    def get(self, slot: str) -> np.ndarray:
        slot = self.aliases.get(slot, slot)
        if slot not in self.slots:
            raise KeyError(slot)
        e = self.slots[slot].entry
        a = self._array(slot, e)
        if a.dtype.kind == "f":
            bad, nan, big = _scan_values(a, self.export_dtype == "float16")
            if bad:  # (an export took them, and its engines made NaN logits)
                raise UserError(f"{e.file}: tensor '{e.name}' (slot '{slot}') holds {bad} non-finite value(s) "
                                f"({'NaN' if nan else 'inf'}); a checkpoint's weights must be finite")
            if big > float(np.finfo(np.float16).max):  # (onnx_ops.to_tensor refuses it too, naming the slot alone)
                raise UserError(f"{e.file}: tensor '{e.name}' (slot '{slot}') holds {big:.4g}, past float16's range "
                                "(65504); export it in float32 or bfloat16")
        return a

    def _array(self, slot: str, e: TensorEntry) -> np.ndarray:
        return self.reader.array(e)

    def sha(self, slot: str) -> str:
        return self.slots[self.aliases.get(slot, slot)].sha256

    def table(self) -> dict[str, Any]:
        out = {s: b.to_json(self.folder) for s, b in self.slots.items()}
        for s, served_by in self.aliases.items():
            out[s] = {"tied_to": served_by, "sha256": self.slots[served_by].sha256}
            if s in self.tied_copies:
                out[s]["stored_copy"] = self.tied_copies[s].to_json(self.folder)
        return out


@dataclass
class BoundTarget(Bound):
    config: TargetConfig = None  # type: ignore[assignment]
    # a LoRA adapter merged into its linear weights as each is read (lora.BoundLora; export --lora)
    lora: Any = None

    def _array(self, slot: str, e: TensorEntry) -> np.ndarray:
        if self.lora is not None and slot in self.lora.replaced:
            return self.lora.replacement(slot)  # modules_to_save's full copy (lora.py)
        a = self.reader.array(e)
        if self.lora is not None and slot in self.lora.modules:
            a += self.lora.delta(slot)  # W' = W + scale * B @ A, in float32 (lora.py; the reader's copy is ours)
        if self.lora is not None and slot in self.lora.tokens:
            ids, rows = self.lora.token_rows(slot)
            a[ids] = rows  # trainable_token_indices: those rows replaced (lora.py)
        return a


@dataclass
class BoundDraft(Bound):
    config: DraftConfig = None  # type: ignore[assignment]
    target: BoundTarget | None = None
    aux_layer_ids: tuple[int, ...] = ()
    # checkpoint name -> the speculators name it was bound as (EAGLE's format: slots.eagle_rows)
    renamed: dict[str, str] = field(default_factory=dict)
    # its own embedding equals the target's (None: it has none of its own, or of another shape)
    embed_matches_target: bool | None = None
    # "target": its graph runs the target's embedding in place of its own (--draft-embeddings)
    embeddings: str = "own"

    @property
    def runs_target_embed(self) -> bool:
        """Its graph reads the target's embed_tokens: it stores none (DESIGN.md §1), or
        ``embeddings`` is "target" (SGLang's and TensorRT-LLM's choice for a draft as wide as
        its target)."""
        return "embed" not in self.slots or self.embeddings == "target"

    def get(self, slot: str) -> np.ndarray:
        if slot == "embed" and self.runs_target_embed:
            assert self.target is not None
            return self.target.get("embed")
        return super().get(slot)

    def has(self, slot: str) -> bool:
        return super().has(slot) or (slot == "embed" and self.target is not None)


def _candidates(missing_names: tuple[str, ...], leftovers: list[str]) -> list[str]:
    """Leftover keys that share the last two name components with a wanted name: shown in
    the error message only, never bound (no suffix matching)."""
    tails = {".".join(n.split(".")[-2:]) for n in missing_names}
    return sorted(k for k in leftovers if ".".join(k.split(".")[-2:]) in tails)


_ATTENTION_SLOTS = {"q", "k", "v", "o", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm"}  # sized by heads x head_dim


def _bind(
    folder: Path,
    entries: dict[str, TensorEntry],
    rows: list,
    cfg_decoder,
    extra_of,  # layer index -> extra dict for shape functions
    ignorable: tuple[str, ...],
    num_layers: int,
    what: str,
    reader: TensorReader,
) -> dict[str, BoundTensor]:
    bound: dict[str, BoundTensor] = {}
    used: set[str] = set()
    missing: list[tuple[str, tuple[str, ...], str]] = []  # (slot, names, why the config asks for it)
    for slot, names, spec, i in rows:
        extra = extra_of(i)
        present = [n for n in names if n in entries]
        if len(present) > 1:
            files = ", ".join(f"'{n}' in {entries[n].file.name}" for n in present)
            raise UserError(f"{folder}: {what} slot '{slot}' is filled by more than one tensor: {files}")
        if not present:
            if spec.required(cfg_decoder, extra):
                missing.append((slot, names, f"; {spec.needed(cfg_decoder, extra)}" if spec.needed else ""))
            continue
        e = entries[present[0]]
        if spec.unused is not None and not spec.required(cfg_decoder, extra):
            fix = ("remove the tensor" if extra.get("source_format") == "eagle"  # (no config says otherwise)
                   else "make the config match the weights, or remove the tensor")
            raise UserError(f"{e.file}: tensor '{e.name}' ({what} slot '{slot}') would go unused: "
                            f"{spec.unused(cfg_decoder, extra)}; the graph would run a model other than the one "
                            f"trained with it ({fix})")
        want = tuple(spec.shape(cfg_decoder, extra))
        if e.shape != want:
            # an attention slot's sizes and where they come from (a Qwen3 config naming no head_dim
            # takes transformers' 128: [512, 64] was implied for a q_proj of [64, 64] unexplained, w73d)
            heads = (f" ({cfg_decoder.num_heads} heads, {cfg_decoder.num_kv_heads} KV heads, head_dim "
                     f"{cfg_decoder.head_dim}: a config naming no head_dim takes its family's transformers default)"
                     if slot.split(".")[-1] in _ATTENTION_SLOTS else "")
            raise UserError(
                f"{e.file}: tensor '{e.name}' ({what} slot '{slot}') has shape {list(e.shape)}, the config implies "
                f"{list(want)}{heads}"
            )
        if e.dtype not in spec.dtypes:
            raise UserError(
                f"{e.file}: tensor '{e.name}' ({what} slot '{slot}') has dtype {e.dtype}, expected one of {', '.join(spec.dtypes)}"
            )
        bound[slot] = BoundTensor(slot, e, reader.sha256(e))
        used.add(e.name)
    ignore = {t.format(i=i) for t in ignorable for i in range(num_layers)}
    leftovers = sorted(set(entries) - used - ignore)
    if missing:
        slot, names, why = missing[0]
        seen = _candidates(names, leftovers)
        hint = f"; similar tensors present but not declared for it: {', '.join(seen)}" if seen else ""
        more = f" ({len(missing) - 1} more slots missing)" if len(missing) > 1 else ""
        raise UserError(f"{folder}: {what} slot '{slot}' is missing: expected one of "
                        f"{', '.join(repr(n) for n in names)}{hint}{more}{why}")
    if leftovers:
        shown = ", ".join(f"'{k}' ({entries[k].file.name})" for k in leftovers[:10])
        more = f" and {len(leftovers) - 10} more" if len(leftovers) > 10 else ""
        raise UserError(f"{folder}: {what} tensors that fill no slot and are not declared ignorable: {shown}{more}")
    return bound


def _check_layer_count(folder: Path, entries: dict[str, TensorEntry], num_layers: int, key: str) -> None:
    """A layer count no checkpoint of these tensors can hold (each layer has 9 or more) is
    refused before the slot table is expanded for it: a typo of 10**6 layers took minutes
    and all the memory before any message."""
    if num_layers > len(entries):
        raise UserError(f"{folder / 'config.json'}: {key} is {num_layers}, but {folder} holds only {len(entries)} "
                        "tensors (a decoder layer has at least 9)")


def bind_target(folder: str | Path, allow_pickle: bool = False) -> BoundTarget:
    check_path_args("a folder", folder=folder)  # Path('') is the working folder
    folder = Path(folder)
    cfg = load_target_config(folder)
    S.check_table(S.TARGET_SLOTS)
    entries = scan_folder(folder, allow_pickle)
    d = cfg.decoder
    _check_layer_count(folder, entries, d.num_layers, "num_hidden_layers")
    rows = S.expand(S.TARGET_SLOTS, d.num_layers)
    reader = TensorReader()
    slots = _bind(folder, entries, rows, d, lambda i: {"i": i}, S.TARGET_IGNORABLE, d.num_layers, "target", reader)
    aliases, copies = {}, {}
    if d.tie_word_embeddings:
        head = slots.pop("lm_head", None)
        if head is not None:  # tied checkpoints often store the head too: the same bytes, or a different head
            embed = slots["embed"]
            if head.sha256 != embed.sha256 or head.entry.dtype != embed.entry.dtype:
                raise UserError(
                    f"{head.entry.file}: config.json says tie_word_embeddings=true but '{head.entry.name}' differs from "
                    f"the embeddings '{embed.entry.name}' (transformers 4 ties them, using the embeddings; transformers "
                    f"5 unties them, using the stored head): set tie_word_embeddings in {folder / 'config.json'} to "
                    "false to use the stored head, or remove the tensor to use the embeddings")
            copies["lm_head"] = head
        aliases["lm_head"] = "embed"
    return BoundTarget(folder=folder, slots=slots, reader=reader, aliases=aliases, tied_copies=copies, config=cfg)


def _check_agreement(draft_folder: Path, dc: DraftConfig, target: BoundTarget) -> tuple[int, ...]:
    """Target/draft agreement; returns the resolved aux layer ids."""
    tc = target.config.decoder
    where = f"{draft_folder}/config.json"
    # the verifier the draft names (speculators' format), as inspect shows it: the first said of
    # a draft for another model (a Llama draft's vocabulary differs from a Qwen3 target's too: w73d)
    other = "a draft trained against another model" + (
        f" ({dc.verifier_name!r}, its speculators_config.verifier.name_or_path)" if dc.verifier_name else "")
    if dc.source_format == "speculators" and target.config.architecture not in dc.verifier_architectures:
        raise UserError(
            f"{where}: speculators_config.verifier.architectures is {list(dc.verifier_architectures)}, "
            f"the target is {target.config.architecture}: {other}"
        )
    layer = "transformer_layer_config." if dc.source_format == "speculators" else ""
    th = dc.target_hidden_size or dc.decoder.hidden_size
    if th != tc.hidden_size:
        field = "target_hidden_size" if dc.target_hidden_size else f"{layer}hidden_size"
        raise UserError(
            f"{where}: draft was built for a verifier of hidden size {th} ({field}), the target {target.folder} "
            f"has hidden size {tc.hidden_size}: {other}"
        )
    if dc.decoder.vocab_size != tc.vocab_size:
        raise UserError(
            f"{where}: draft was built for a verifier vocabulary of {dc.decoder.vocab_size} ({layer}vocab_size), "
            f"the target {target.folder} has {tc.vocab_size}: {other}"
        )
    aux = dc.resolved_aux_ids(tc.num_layers)
    bad = [i for i in aux if not 0 <= i < tc.num_layers]
    written, count = dc.extra.get("aux_layer_ids_written"), dc.extra.get("aux_layer_ids_count")
    if bad and written is not None and list(written) != list(aux):
        # (EAGLE's format counted as layer outputs: id i is the state entering layer i + 1; the
        # user wrote the ids, not the states they became)
        raise UserError(f"{where}: the aux layer ids {list(written)} it names, counted as layer outputs "
                        f"(--draft-aux-ids {count}), are the states entering layers {list(aux)}, which must lie in "
                        f"[0, {tc.num_layers - 1}] for a target of {tc.num_layers} layers (as layer outputs: ids 0 "
                        f"to {tc.num_layers - 2})")
    if bad:
        raise UserError(f"{where}: eagle_aux_hidden_state_layer_ids {list(aux)} must lie in [0, {tc.num_layers - 1}] "
                        f"for a target of {tc.num_layers} layers")
    if dc.aux_layer_ids is None and list(aux) != sorted(set(aux)):
        # speculators' / vLLM's default (2, L // 2, L - 3) is out of order or repeats for L < 6:
        # vLLM would hand the draft fewer states than its fc reads
        raise UserError(f"{where}: names no eagle_aux_hidden_state_layer_ids, and the default {list(aux)} for a "
                        f"target of {tc.num_layers} layers is not distinct and ascending; name them in the config")
    if dc.draft_vocab_size > tc.vocab_size:
        raise UserError(f"{where}: draft_vocab_size {dc.draft_vocab_size} exceeds the target vocabulary {tc.vocab_size}")
    if dc.kind == "peagle" and not (0 <= dc.mask_token_id < tc.vocab_size):
        raise UserError(f"{where}: mask_token_id {dc.mask_token_id} is outside the target vocabulary [0, {tc.vocab_size})")
    return aux


# the relative rounding a float dtype's copy of a float32 tensor may carry (an ulp: a converter
# may truncate rather than round), and the absolute step of float16's subnormals
_COPY_RTOL = {"F64": 0.0, "F32": 0.0, "F16": 2.0**-10, "BF16": 2.0**-7}
_COPY_ATOL = {"F16": 2.0**-24}
_EMBED_BLOCK = 4096  # rows compared at a time


def _embed_matches_target(draft: BoundDraft, target: BoundTarget) -> bool | None:
    """Whether a draft's own embedding is the target's, up to the rounding of the narrower
    dtype (EAGLE, SpecForge and speculators train it frozen from the target's). Servers differ
    when it is not: vLLM (which compares the two, torch.equal in the serving dtype, since its
    PR #28549, 2025-11; before, it took the target's whenever the shapes matched) and EAGLE run
    the draft's own, as specrt does, SGLang and TensorRT-LLM the target's (for a draft as wide as
    its target, the only one compared here: a narrower or wider one keeps its own there too);
    either way such a draft was trained against other embeddings than these."""
    if "embed" not in draft.slots or "embed" not in target.slots:
        return None
    d, t = draft.slots["embed"].entry, target.slots["embed"].entry
    if tuple(d.shape) != tuple(t.shape) or d.dtype not in _COPY_RTOL or t.dtype not in _COPY_RTOL:
        return None
    if d.dtype == t.dtype:
        return draft.slots["embed"].sha256 == target.slots["embed"].sha256
    rtol = max(_COPY_RTOL[d.dtype], _COPY_RTOL[t.dtype])
    atol = max(_COPY_ATOL.get(d.dtype, 0.0), _COPY_ATOL.get(t.dtype, 0.0))
    for start in range(0, d.shape[0], _EMBED_BLOCK):
        stop = min(start + _EMBED_BLOCK, d.shape[0])
        a, b = draft.reader.rows(d, start, stop), target.reader.rows(t, start, stop)
        if not np.all(np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b)) + atol):
            return False
    return True


def config_notes(draft: BoundDraft) -> tuple[str, ...]:
    """What export and inspect say of the draft's config.json as read (DraftConfig.notes)."""
    return draft.config.notes


def embed_note(draft: BoundDraft) -> str | None:
    """What export and inspect say of the draft's embedding: its own not the target's, or
    --draft-embeddings target on a draft that stores none (None: nothing to say)."""
    if "embed" not in draft.slots:
        return (f"note: {draft.folder}: the draft stores no embed_tokens.weight and runs the target's: "
                "--draft-embeddings target changes nothing") if draft.embeddings == "target" else None
    if draft.embed_matches_target is not False:
        return None
    why = (f"warning: {draft.slots['embed'].entry.file}: the draft's own embed_tokens.weight differs from the "
           "target's (EAGLE, SpecForge and speculators train it frozen from the target's: was this draft "
           "trained for another target or revision?); ")
    if draft.embeddings == "target":
        return why + "its graph runs the target's (--draft-embeddings target), as SGLang and TensorRT-LLM would"
    return why + ("specrt runs the draft's own, as vLLM does since it compares the two; SGLang and TensorRT-LLM "
                  "would run the target's, which --draft-embeddings target runs")


def default_context(tc: DecoderConfig) -> tuple[int, str]:
    """The context `specrt build` gives engines without --max-context, and what it is: the target's
    max_position_embeddings, or its sliding window where smaller (engines/build.py)."""
    if tc.sliding_window is not None and tc.sliding_window < tc.max_position_embeddings:
        return tc.sliding_window, "the context `specrt build` gives the engines by default (the target's sliding window)"
    return tc.max_position_embeddings, ("the context `specrt build` gives the engines by default (the target's "
                                        "max_position_embeddings)")


def length_note(draft: BoundDraft) -> str | None:
    """What export and inspect say of a draft whose own max_position_embeddings is below the
    context the engines get by default (None: nothing to say)."""
    assert draft.target is not None
    ctx, what = default_context(draft.target.config.decoder)
    dc = draft.config
    return draft_length_note(str(Path(draft.folder) / "config.json"), dc.source_format,
                             dc.decoder.max_position_embeddings, dc.decoder.rope.rope_type, ctx, what)


def _check_vocab_map(draft: BoundDraft) -> None:
    """d2t maps draft ids into distinct target ids, and t2d marks exactly those (EAGLE's format:
    t2d may be left out, slots.EAGLE_OPTIONAL). Over the whole vocabulary the draft's ids are
    the target's, whatever maps it carries (_check_full_vocab_map)."""
    has = [k for k in ("d2t", "t2d") if k in draft.slots]
    if not has:
        return
    V = draft.config.decoder.vocab_size
    if draft.config.draft_vocab_size == V:
        _check_full_vocab_map(draft, V)
        return
    # (a reduced vocabulary's d2t is a required slot, and so is its t2d but in EAGLE's format)
    d2t = draft.get("d2t")
    t2d = draft.get("t2d") if "t2d" in draft.slots else None
    tgt = np.arange(d2t.shape[0], dtype=np.int64) + d2t
    f = draft.slots["d2t"].entry.file
    if tgt.min() < 0 or tgt.max() >= V:
        k = int(np.argmax((tgt < 0) | (tgt >= V)))
        raise UserError(f"{f}: d2t maps draft id {k} to target id {int(tgt[k])}, outside [0, {V})")
    if len(np.unique(tgt)) != len(tgt):
        order = np.argsort(tgt, kind="stable")
        at = int(np.argmax(tgt[order][1:] == tgt[order][:-1]))  # the first target id reached twice
        a, b = sorted((int(order[at]), int(order[at + 1])))
        raise UserError(f"{f}: d2t maps draft ids {a} and {b} to the same target id {int(tgt[a])}")
    mark = np.zeros(V, dtype=bool)
    mark[tgt] = True
    if t2d is not None and not np.array_equal(mark, t2d.astype(bool)):
        k = int(np.argmax(mark != t2d.astype(bool)))
        which = ("marks target id {k}, which no draft id maps to" if t2d[k] else
                 "leaves out target id {k}, which d2t reaches")
        raise UserError(f"{f}: t2d disagrees with d2t: it {which.format(k=k)} ({int(t2d.sum())} target ids marked, "
                        f"d2t reaches {len(tgt)})")


def _check_full_vocab_map(draft: BoundDraft, V: int) -> None:
    """A draft over the whole vocabulary (draft_vocab_size = V) may carry the maps its trainer
    registered anyway: d2t all zeros, and t2d all true (SpecForge's frequency map, which pads
    the count to draft_vocab_size, and EAGLE's when every token occurs in its data; SpecForge's
    llama3_eagle.py registers ones since its PR #298, 2025-11) or all false (a buffer never
    filled: EAGLE's cnets.py, and SpecForge's before that PR, register zeros; `speculators
    convert` copies either), either one alone. Every server runs its ids as target ids then:
    SafeAILab's ea_model.py deletes both buffers, SGLang's llama_eagle3 skips t2d and adds d2t
    (zeros: the identity), vLLM's did so until its PR #53458 (2026-08, "only create
    draft_id_to_target_id when draft vocab differs": no map over the whole vocabulary since),
    speculators registers neither (model.py _init_vocab). A d2t other than zeros is refused:
    SGLang applies it, SafeAILab and TensorRT-LLM drop it, vLLM applied it before that PR; a t2d
    marking some ids only cannot have trained this head."""
    if "d2t" in draft.slots and draft.get("d2t").any():
        raise UserError(f"{draft.slots['d2t'].entry.file}: d2t of a draft over the full vocabulary ({V}) is not all "
                        "zeros (the identity): SGLang applies it there, EAGLE and TensorRT-LLM drop it, vLLM applied "
                        "it before its PR #53458 (2026-08: no map for such a draft since); expected zeros, or "
                        "draft_vocab_size below the target vocabulary for a vocabulary map")
    if "t2d" in draft.slots:
        marked = int(np.count_nonzero(draft.get("t2d")))
        if marked not in (0, V):
            raise UserError(f"{draft.slots['t2d'].entry.file}: t2d of a draft over the full vocabulary ({V}) marks "
                            f"{marked} target ids; expected all of them (a map keeping every token) or none (a "
                            "buffer never filled)")


def bind_draft(folder: str | Path, target: BoundTarget, allow_pickle: bool = False,
               aux_ids_count: str | None = None, embeddings: str = "own") -> BoundDraft:
    """A speculators draft, or an EAGLE-3 draft in EAGLE's own format (its names through
    slots.eagle_rows' declared renames; ``aux_ids_count``: config.load_eagle_config).
    ``embeddings``: which embed_tokens its graph runs, "own" or "target" (DRAFT_EMBEDDINGS;
    "target" changes nothing for a draft that stores none, and is refused for one whose own
    is of another shape than the target's)."""
    check_path_args("a folder", folder=folder)  # Path('') is the working folder
    if embeddings not in DRAFT_EMBEDDINGS:
        raise UserError(f"--draft-embeddings '{embeddings}' is not supported (choose one of "
                        f"{', '.join(DRAFT_EMBEDDINGS)})")
    folder = Path(folder)
    dc = load_draft_config(folder, aux_ids_count)
    aux = _check_agreement(folder, dc, target)
    S.check_table(S.DRAFT_SLOTS)
    entries = scan_folder(folder, allow_pickle, flag="--allow-draft-pickle")
    extra = S.draft_extra(dc, target.config.decoder.hidden_size)
    if dc.source_format == "eagle":  # one layer (load_eagle_config)
        rows, aliases = S.eagle_rows()
        ignorable: tuple[str, ...] = ()
    else:
        _check_layer_count(folder, entries, dc.decoder.num_layers, "transformer_layer_config.num_hidden_layers")
        rows, aliases, ignorable = S.expand(S.DRAFT_SLOTS, dc.decoder.num_layers), {}, S.DRAFT_IGNORABLE
    reader = TensorReader()
    slots = _bind(folder, entries, rows, dc.decoder, lambda i: {**extra, "i": i}, ignorable,
                  dc.decoder.num_layers, "draft", reader)
    renamed = {b.entry.name: aliases[b.entry.name] for b in slots.values() if b.entry.name in aliases}
    draft = BoundDraft(folder=folder, slots=slots, reader=reader, config=dc, target=target, aux_layer_ids=aux,
                       renamed=renamed, embeddings=embeddings)
    if "embed" not in slots and target.config.decoder.hidden_size != dc.decoder.hidden_size:
        raise UserError(f"{folder}: draft has no embed_tokens.weight and its width {dc.decoder.hidden_size} differs "
                        f"from the target's {target.config.decoder.hidden_size}, so the target's cannot serve")
    own, theirs = (slots["embed"].entry, target.slots["embed"].entry) if "embed" in slots else (None, None)
    if embeddings == "target" and own is not None and tuple(own.shape) != tuple(theirs.shape):
        # (a draft narrower or wider than its target: its layers read rows of its own width;
        # every server runs its own then)
        raise UserError(f"{own.file}: --draft-embeddings target: the draft's own '{own.name}' has shape "
                        f"{list(own.shape)}, the target's '{theirs.name}' ({theirs.file}) {list(theirs.shape)}, so "
                        "the target's cannot serve this draft; export it with --draft-embeddings own")
    _check_vocab_map(draft)
    if not dc.confidence_head and ("confidence_head" in slots or "confidence_head_bias" in slots):
        name = (slots.get("confidence_head") or slots["confidence_head_bias"]).entry.name
        raise UserError(f"{folder}: draft tensor '{name}' is a confidence head, but config.json does not enable one "
                        f"(expected \"enable_confidence_head\": true beside it, or no such tensor)")
    # last, after every check that can refuse the draft: it reads both embeddings, a pass over
    # V x H weights of each (in blocks) when their dtypes differ
    draft.embed_matches_target = _embed_matches_target(draft, target)
    return draft


def receipt(target: BoundTarget, draft: BoundDraft | None = None) -> dict[str, Any]:
    """The binding receipt: JSON-ready; ``receipt_id`` hashes everything else in it."""
    r: dict[str, Any] = {
        "format": RECEIPT_FORMAT,
        "target": {"folder": str(Path(target.folder).resolve()), "config": target.config.to_json(), "slots": target.table()},
    }
    if target.lora is not None:  # the adapter merged into the slots' weights (receipts without one read as before)
        r["target"]["lora"] = target.lora.to_json()
    if draft is not None:
        # the target tensors the draft's graph reads: its embedding where it has none of its own
        # or runs the target's (its final norm and LM head are its own: norm.weight, lm_head.weight)
        relies = {"embed": target.sha("embed")} if draft.runs_target_embed else {}
        r["draft"] = {
            "folder": str(Path(draft.folder).resolve()),
            "config": draft.config.to_json(),
            "aux_layer_ids": list(draft.aux_layer_ids),
            "embed_from_target": draft.runs_target_embed,
            "slots": draft.table(),
            "relies_on_target": relies,
        }
        if draft.embed_matches_target is not None:  # (receipts without their own embedding read as before)
            r["draft"]["embed_matches_target"] = draft.embed_matches_target
        if "embed" in draft.slots and draft.embeddings == "target":  # (--draft-embeddings own reads as before)
            r["draft"]["embeddings"] = "target"  # its own stored one (in slots) unused by its graph
        if draft.config.source_format != "speculators":  # (receipts of speculators drafts read as before)
            r["draft"]["format"] = {"name": draft.config.source_format, "architecture": EAGLE_ARCHITECTURE,
                                    "renamed": dict(sorted(draft.renamed.items()))}
    r["receipt_id"] = manifest_digest(r)  # (what check_export recomputes on every load)
    return r
