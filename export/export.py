"""``specrt export``: bound weights -> ONNX graphs + ``export.json``, written atomically.

Folder layout (every file hashed in the manifest):

    export.json                 manifest: I/O contracts, dims, receipt, vocab map, hashes
    target.onnx[.data]          target graph (prefill and verify)
    draft.onnx[.data]           P-EAGLE one-pass or EAGLE-3 one-step draft graph
    draft_vocab.safetensors     d2t (int64 [Vd]) when the draft vocabulary is reduced
    tokenizer.json, tokenizer_config.json, generation_config.json, ... (copied)
"""

from __future__ import annotations

import gc
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from specrt import contracts as C
from specrt.errors import UserError
from specrt.export.binding import (BoundDraft, BoundTarget, bind_draft, bind_target, config_notes, embed_note,
                                   length_note, receipt)
from specrt.export.config import default_aux_layer_ids, read_json
from specrt.manifest import (EXPORT_FORMAT, EXPORT_MANIFEST, TOKENIZER_FILES, atomic_folder, check_output, file_record,
                             tool_versions, write_json)
from specrt.paths import check_path_args, read_json_object

DTYPES = tuple(C.PRECISIONS.values())  # float32, float16, bfloat16
TRAINING_RECEIPT = "training_receipt.json"


def _graph_files(folder: Path, stem: str) -> list[dict[str, Any]]:
    return [file_record(folder, p.name) for p in sorted(folder.glob(f"{stem}.onnx*"))]


def _save(model, folder: Path, stem: str) -> list[dict[str, Any]]:
    from specrt.export.graphs import save_model

    save_model(model, folder / f"{stem}.onnx")
    return _graph_files(folder, stem)


def _check_tokenizer_files(target_dir: Path, vocab: int | None = None,
                           log: Callable[[str], None] = lambda s: None):
    """The tokenizer files export copies read as the runtime reads them (runtime/text.py), naming
    the target's file: a broken one was copied without a word, built, and raised only at
    `specrt run`, with a traceback. (generation_config.json: read with the target's config.)
    ``vocab``: the model's vocabulary size, which a tokenizer of more tokens passes (said).
    Returns the target's runtime.text.Text (None without a tokenizer.json), for eos_note."""
    for n in TOKENIZER_FILES:
        path = target_dir / n
        if n.endswith(".json") and n != "tokenizer.json" and path.is_file():
            read_json(path)
    tok = target_dir / "tokenizer.json"
    if tok.is_file():  # (read once: load_tokenizer says "not valid JSON" as read_json would)
        from specrt.runtime.text import Text

        text = Text(target_dir)
        if vocab is not None and text.vocab_size > vocab:
            log(f"warning: {tok} holds {text.vocab_size} tokens, the model's vocabulary {vocab} (config.json "
                f"vocab_size): a prompt that encodes to an id of {vocab} or more is refused when run")
        written = text.config.get("chat_template")
        if text.chat_template is None and written is not None:  # (a dict, a number, named templates with no
            # "default": read as no template, exported without a word, then "--chat: ... has no chat template")
            raise UserError(f"{target_dir / 'tokenizer_config.json'}: chat_template is not a template (a string, or "
                            f"transformers' list of named templates with a 'default' one) but "
                            f"{json.dumps(written)[:80]}: a chat template must render a conversation of one user "
                            "message; mend it, or remove it to take raw prompts only")
        if text.chat_template is not None:  # one that cannot render a user's message is refused now, not at
            # the build's canary (its engines written) or a first `run --chat`
            try:
                text.render_chat("Hello.")
            except UserError as e:
                raise UserError(f"{e}: a chat template must render a conversation of one user message; mend it, "
                                "or remove it to take raw prompts only") from None
        return text
    return None


def eos_note(target_dir: Path, eos: tuple[int, ...], text=...) -> str | None:
    """What export and inspect say of the target's EOS ids (generation_config.json's, else
    config.json's eos_token_id: where answers end): none at all, or none that is the tokenizer's
    eos_token, where vLLM would end an answer too and specrt, as transformers' generate, does not
    (a walk, w73d: an export with no EOS id decoded every answer to --max-new-tokens, unsaid).
    ``text``: the target's runtime.text.Text where the caller has loaded it (None: no tokenizer);
    else it is loaded here, and left out where it cannot be read."""
    where = "generation_config.json's or config.json's eos_token_id"
    if text is ... and (Path(target_dir) / "tokenizer.json").is_file():
        from specrt.runtime.text import Text

        try:
            text = Text(Path(target_dir))
        except UserError:  # (a note: the tokenizer's own errors are export's to say, inspect binds weights)
            text = None
    named = text.eos_token if text not in (None, ...) else None
    i = text.tokenizer.token_to_id(named) if named else None
    fix = "add it to generation_config.json's eos_token_id to end them there"
    if not eos:
        return (f"note: {target_dir}: no EOS id ({where}): answers end only at --max-new-tokens, a stop string "
                "or the context limit" + (f" (vLLM's also at the tokenizer's eos_token {named!r}, id {i}: {fix})"
                                          if i is not None else ""))
    if i is not None and i not in eos:
        return (f"note: {Path(target_dir) / 'tokenizer_config.json'}: eos_token {named!r} (id {i}) is not among the "
                f"EOS ids {list(eos)} ({where}): answers do not end at it, as transformers' generate's do not "
                f"(vLLM's do); {fix}")
    return None


def export_dtype(dtype: str) -> str:
    """--dtype as typed (float32, FLOAT32, fp32, " bf16") -> one of DTYPES, as build's
    --precision takes its names; UserError naming the option otherwise."""
    d = str(dtype).strip().lower()
    d = C.PRECISIONS.get(d, d)
    if d not in DTYPES:
        raise UserError(f"--dtype '{dtype}' is not supported (choose one of {', '.join(DTYPES)})")
    return d


def check_training_receipt(draft_dir: Path) -> None:
    """A training receipt beside the draft that the acceptance canary could not read: a
    UserError naming it, here (export, inspect), not after the build."""
    if (Path(draft_dir) / TRAINING_RECEIPT).is_file():
        from specrt.runtime.canary import expected_depth1

        expected_depth1(read_json_object(Path(draft_dir) / TRAINING_RECEIPT), str(Path(draft_dir) / TRAINING_RECEIPT))


def export(target_dir: Path, draft_dir: Path | None, out: Path, dtype: str = "float32", force: bool = False,
           allow_pickle: bool = False, log: Callable[[str], None] = lambda s: None, allow_draft_pickle: bool = False,
           draft_aux_ids: str | None = None, draft_embeddings: str = "own", lora_dir: Path | None = None,
           allow_lora_pickle: bool = False) -> dict[str, Any]:
    """Export target (and draft) to ``out``; returns the manifest. ``allow_draft_pickle``,
    ``draft_aux_ids`` and ``draft_embeddings``: bind_draft's ``allow_pickle``, ``aux_ids_count``
    and ``embeddings`` (the receipt records which embedding the draft graph runs). ``lora_dir``:
    a PEFT LoRA adapter merged into the target's weights (lora.py; ``allow_lora_pickle``: its
    adapter_model.bin), recorded in the receipt's target.lora."""
    from specrt.export import graphs

    # (Path('') is the working folder)
    check_path_args("a folder", target_dir=target_dir, draft_dir=draft_dir, out=out, lora_dir=lora_dir,
                    optional=("draft_dir", "lora_dir"))
    dtype = export_dtype(dtype)
    t0 = time.perf_counter()
    inputs = (target_dir, draft_dir, lora_dir)
    check_output(Path(out), force=force, inputs=inputs, marker="export.json")  # before binding
    target: BoundTarget = bind_target(target_dir, allow_pickle=allow_pickle)
    if lora_dir is not None:  # (bound whole, before anything is written: a refusal leaves no folder)
        from specrt.export.lora import base_note, bind_lora, fan_in_fan_out_note, others_note

        target.lora = bind_lora(lora_dir, target, allow_lora_pickle)
        for note in (base_note(target.lora, Path(target_dir)), fan_in_fan_out_note(target.lora),
                     others_note(target.lora)):
            if note is not None:
                log(note)
    text = _check_tokenizer_files(Path(target_dir), target.config.decoder.vocab_size, log)
    draft: BoundDraft | None = bind_draft(draft_dir, target, allow_draft_pickle, draft_aux_ids, draft_embeddings) \
        if draft_dir is not None else None
    tc = target.config.decoder
    aux = draft.aux_layer_ids if draft is not None else default_aux_layer_ids(tc.num_layers)
    rec = receipt(target, draft)
    log(f"bound {len(rec['target']['slots'])} target slots" + (f", {len(rec['draft']['slots'])} draft slots" if draft else "")
        + (f"; merging a LoRA adapter into {len(target.lora.modules)} of them" if target.lora is not None else "")
        + (target.lora.replaced_words() if target.lora else "")
        + "".join(f", its trainable tokens replacing {len(ids)} rows of {s}" for s, (ids, _) in
                  (target.lora.tokens.items() if target.lora else ())))
    if (note := eos_note(Path(target_dir), target.config.eos_token_ids, text)) is not None:  # (its Text read once)
        log(note)
    for note in config_notes(draft) if draft is not None else ():
        log(note)
    if draft is not None and (note := embed_note(draft)) is not None:
        log(note)
    short = draft is not None and (note := length_note(draft)) is not None
    if short:
        log(note)
    if draft_dir is not None:
        check_training_receipt(Path(draft_dir))

    for bound in (target, draft):
        if bound is not None:
            bound.export_dtype = dtype
    with atomic_folder(Path(out), force=force, inputs=inputs, marker="export.json") as tmp:
        model = graphs.build_target_graph(tc, target.get, aux, dtype=dtype)
        # The graph now owns copies of the weights: drop the checkpoint's mappings before
        # serialising (peak RSS 2.1x instead of 2.55x the fp32 weights on SmolLM2; since the
        # reader unmaps each tensor's pages once read, TensorReader.release, 1.49x with the draft).
        target.reader.close()
        if target.lora is not None:
            target.lora.reader.close()
        io = C.target_io(tc.num_layers, tc.num_kv_heads, tc.head_dim, tc.vocab_size, tc.hidden_size, dtype,
                         num_aux=len(aux))
        target_files = _save(model, tmp, "target")
        del model
        gc.collect()
        log(f"wrote target graph ({time.perf_counter() - t0:.1f} s)")
        graphs_json: dict[str, Any] = {"target": {"io": io.to_json(), "files": target_files}}
        draft_json = None
        if draft is not None:
            dc = draft.config
            if dc.kind == "peagle":
                model = graphs.build_peagle_graph(dc, draft.get, dtype=dtype)
                dio = C.peagle_io(dc.decoder.num_layers, dc.decoder.num_kv_heads, dc.decoder.head_dim,
                                  dc.draft_vocab_size, tc.hidden_size, dtype, confidence=dc.confidence_head,
                                  num_aux=dc.num_aux)
            else:
                model = graphs.build_eagle3_graph(dc, draft.get, dtype=dtype)
                dio = C.eagle3_io(dc.decoder.num_layers, dc.decoder.num_kv_heads, dc.decoder.head_dim,
                                  dc.draft_vocab_size, dc.decoder.hidden_size, tc.hidden_size, dtype,
                                  confidence=dc.confidence_head, num_aux=dc.num_aux)
            draft.reader.close()
            target.reader.close()
            graphs_json["draft"] = {"io": dio.to_json(), "files": _save(model, tmp, "draft")}
            del model
            vocab_file = None
            if "d2t" in draft.slots:
                from safetensors.numpy import save_file

                save_file({"d2t": np.ascontiguousarray(draft.get("d2t"))}, str(tmp / "draft_vocab.safetensors"))
                vocab_file = file_record(tmp, "draft_vocab.safetensors")
            # The training receipt (tools/train_peagle.py writes one beside the draft) travels
            # with the export: the acceptance canary compares measured acceptance with it.
            receipt_file = None
            if (Path(draft_dir) / TRAINING_RECEIPT).is_file():
                shutil.copyfile(Path(draft_dir) / TRAINING_RECEIPT, tmp / TRAINING_RECEIPT)
                receipt_file = file_record(tmp, TRAINING_RECEIPT)
            draft_json = {
                "kind": dc.kind,
                "num_layers": dc.decoder.num_layers,
                "hidden_size": dc.decoder.hidden_size,
                "num_kv_heads": dc.decoder.num_kv_heads,
                "head_dim": dc.decoder.head_dim,
                "draft_vocab_size": dc.draft_vocab_size,
                "speculative_tokens": dc.speculative_tokens,
                "mask_token_id": dc.mask_token_id,
                "vocab_map": vocab_file,
                "training_receipt": receipt_file,
            }
            if dc.decoder.sliding_window is not None:  # (drafts without one export as before)
                draft_json["sliding_window"] = dc.decoder.sliding_window
            if dc.attention_window is not None:  # applied in the draft graph (every layer sliding)
                draft_json["attention_window"] = dc.attention_window
            if dc.confidence_head:  # draft_confidence: DSpark reads it instead of the draft's own probabilities
                draft_json["confidence_head"] = True
            if short:  # its own length, below the default context (length_note; other drafts export as before)
                draft_json["max_position_embeddings"] = dc.decoder.max_position_embeddings
            log(f"wrote {dc.kind} draft graph ({time.perf_counter() - t0:.1f} s)")
        tok = []
        for n in TOKENIZER_FILES:
            if (Path(target_dir) / n).is_file():
                shutil.copyfile(Path(target_dir) / n, tmp / n)
                tok.append(file_record(tmp, n))
        if not (Path(target_dir) / "tokenizer.json").is_file():
            log(f"note: {target_dir} has no tokenizer.json: the engines will take token ids only ('prompt_ids' "
                "in calibrate, run and bench); text prompts, --chat, specrt chat and specrt serve (its answers are "
                "text) need it. Save the target's fast tokenizer there (transformers: "
                "AutoTokenizer.from_pretrained(...).save_pretrained(TARGET)) and export again")
        manifest = {
            "format": EXPORT_FORMAT,
            "dtype": dtype,
            "target": {
                "num_layers": tc.num_layers,
                "hidden_size": tc.hidden_size,
                "num_kv_heads": tc.num_kv_heads,
                "head_dim": tc.head_dim,
                "vocab_size": tc.vocab_size,
                "max_position_embeddings": tc.max_position_embeddings,
                "aux_layer_ids": list(aux),
                "eos_token_ids": list(target.config.eos_token_ids),
                "bos_token_id": target.config.bos_token_id,
                # everything a backend needs to re-lower the graph (the ONNX Runtime
                # engines' in-place KV flavour, engines/build.py)
                "decoder": tc.to_json(),
            },
            "draft": draft_json,
            "graphs": graphs_json,
            "tokenizer": tok,
            # the names again: a record removed with its file still differs from them
            # (check_export), where an export of a target without that file has neither
            "tokenizer_files": [r["file"] for r in tok],
            "binding_receipt": rec,
            "tool_versions": tool_versions(),
        }
        write_json(tmp / EXPORT_MANIFEST, manifest)
    log(f"export complete: {out} ({time.perf_counter() - t0:.1f} s)")
    return manifest
