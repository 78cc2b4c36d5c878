"""The ``specrt`` command line: one command per capability.

User errors print ``error: <message>`` and exit 1 without a traceback; click's own errors
(a missing file, a bad option value, an unknown option) print click's usage lines and
``Error: <message>`` and exit 1 too (click exits 2 for these by default, the project's
rule is 1 for every bad input). Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import errno
import functools
import io
import json
import sys
from pathlib import Path

import click

from specrt import __version__
from specrt.contracts import ACCEPTANCE_FILE, CORPUS_FILE, DRAFT_AUX_IDS, DRAFT_EMBEDDINGS
from specrt.errors import EngineFailure, UserError, cli_named, describe_os_error, environment_error
from specrt.limits import MAX_PROFILE_REPEATS, MAX_THREADS
from specrt.paths import check_engines_writable
from specrt.sampling_options import PathArg, argv_text, existing_folder, sampling_options, template_kwargs_option


class _Group(click.Group):
    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        import os

        # no colour where the user or the terminal says so (click colours a terminal's output
        # whatever these say): NO_COLOR set and not empty (no-color.org), TERM=dumb (a terminal
        # that shows escape sequences as text: Emacs' shell, some CI logs)
        if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
            extra.setdefault("color", False)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:  # click's standalone handling, with exit 1 for its usage errors
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as e:
            # one line, as specrt's own errors ("error: ..."): click's printed its usage and a
            # blank line first, three lines with another wording ("Error: ...")
            hint = (f" (see `{e.ctx.command_path} --help`)"
                    if isinstance(e, click.UsageError) and e.ctx is not None else "")
            click.echo(f"error: {' '.join(e.format_message().split())}{hint}", err=True)
            sys.exit(1)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)  # --help, --version: click's exit code (0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.echo(f"error: {cli_named(e, '--governor')}", err=True)
            sys.exit(1)
        except MemoryError as e:  # (numpy's names the size it could not have)
            click.echo(f"error: out of memory{f': {e}' if str(e) else ''}", err=True)
            sys.exit(1)
        except OSError as e:  # an input this user cannot read, a full disk: not specrt's bug
            if e.errno == errno.EPIPE:
                _reader_left()
            if not environment_error(e):
                raise
            fd = _echoed_to(e)
            named = {1: "standard output", 2: "standard error"}.get(fd)
            click.echo(f"error: {f'{named}: {e.strerror or e}' if named else describe_os_error(e)}", err=True)
            if fd == 1:  # (what it still holds, flushed at exit, failed again: "Exception ignored", exit 120)
                _stdout_to_devnull()
            sys.exit(1)


def _echoed_to(e: OSError) -> int | None:
    """The file descriptor ``e`` was raised writing to in click.echo, where it names no file:
    1 (`specrt run > FILE` on a full disk said "File too large" alone, naming nothing) or 2 (a
    write to standard error that failed, then the error's own did not: "Input/output error"
    alone, m71b-56); else None."""
    tb, stream = e.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code is click.utils.echo.__code__:
            stream = tb.tb_frame.f_locals.get("file")
        tb = tb.tb_next
    try:
        return stream.fileno() if e.filename is None and stream is not None else None
    except (AttributeError, OSError, ValueError):  # (a stream without a file descriptor: click's test runner)
        return None


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="specrt")
def main() -> None:
    """Deploy speculative decoding (P-EAGLE, EAGLE-3) to ONNX Runtime and TensorRT."""


def _reader_left() -> None:
    """The reader of a pipe we write to left (`specrt run ... | head -1`; click said nothing
    and exited 1, specrt's code for bad input): end as the standard Unix tools end then,
    killed by SIGPIPE (a shell's status 141), nothing said. Python ignores SIGPIPE, so the
    write that found no reader raised BrokenPipeError instead, which stopped the decoding and
    ran the cleanup on its way here; what stdout still holds goes to /dev/null, not to a
    flush at exit that would fail again."""
    import os
    import signal

    _stdout_to_devnull()
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    sys.exit(1)  # (no SIGPIPE: Windows)


def _stdout_to_devnull() -> None:
    """Standard output's file descriptor pointed at /dev/null: what its buffer still holds
    goes there when Python flushes it at exit."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # (no stdout file descriptor)
        pass


class _Terminated(SystemExit):
    """SIGTERM's exit (128 + the signal), said by entry() once the command's cleanup has run."""


def _terminated(signum, frame) -> None:
    # "Terminated" is said by entry() on the way out, after the command's own closing lines,
    # on a line of its own as click says "Aborted!" for Ctrl-C: said here, in the middle of an
    # answer, it landed on the answer's line, before the run's summary
    raise _Terminated(128 + signum)


def _replace_unencodable() -> None:
    """Text stdout's encoding cannot hold is written as "?" (errors="replace"), not a
    UnicodeEncodeError's traceback in the middle of an answer: Windows writes a redirected
    stdout in its ANSI code page (cp1252: no CJK, no emoji, no U+FFFD), as a non-UTF-8 locale
    does elsewhere; PYTHONUTF8=1 (or PYTHONIOENCODING=utf-8) writes it all as UTF-8. A UTF-8
    stdout (Linux's and macOS's usual, a Windows console's) is left as it is."""
    import codecs

    try:
        if not codecs.lookup(sys.stdout.encoding).name.startswith("utf-"):
            sys.stdout.reconfigure(errors="replace")
    except (AttributeError, LookupError, TypeError, ValueError):  # (no stdout, or not a TextIOWrapper)
        pass


def _escape_undecodable() -> None:
    """Under an ASCII locale (LANG=C, Python's UTF-8 mode off) a path's bytes that are not ASCII
    reach Python as lone surrogates, and click wrote them to stderr as "??" (it rewraps an ASCII
    stream as UTF-8 with errors="replace"): an error naming /tmp/dé read "/tmp/d??" (the
    environment walk's 17, session 70). Standard error is made the UTF-8 click would write, with
    errors="backslashreplace" (Python's own for stderr), which click keeps: "/tmp/d\\udcc3\\udca9"."""
    import codecs

    try:
        if codecs.lookup(sys.stderr.encoding).name == "ascii":
            sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    except (AttributeError, LookupError, TypeError, ValueError):  # (no stderr, or not a TextIOWrapper)
        pass


def entry() -> None:
    """The ``specrt`` command: restarted once with huge pages for the weights where the
    kernel gives them on request (specrt/hugepages.py; SPECRT_THP=0 turns it off). SIGTERM
    (timeout, docker stop, systemd) ends it as Ctrl-C does, through its cleanup: a build or
    export stopped so leaves no partial folder."""
    import signal

    from specrt.hugepages import reexec_with_thp

    reexec_with_thp(sys.argv[1:])
    _replace_unencodable()
    _escape_undecodable()
    signal.signal(signal.SIGTERM, _terminated)
    _whole_stdout_writes()
    try:
        main()
    except _Terminated:
        click.echo(err=True)  # (as click before its "Aborted!")
        click.echo("Terminated", err=True)
        raise


def _whole_stdout_writes() -> None:
    """Under PYTHONUNBUFFERED (python -u; container images often set it) sys.stdout's text
    writes go straight to the file, and a write the kernel cuts short (a full disk) loses the
    rest without an error: `specrt inspect --json > FILE` exited 0, FILE cut at the limit.
    Written through _WholeWrites instead, unbuffered still (a Ctrl-C in a write leaves nothing
    to be flushed after "Aborted!")."""
    try:  # (a FileIO: not Windows' console, written as text by its own raw class)
        unbuffered = type(sys.stdout.buffer) is io.FileIO
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # (no stdout, or one that is no file)
        return
    if unbuffered:
        sys.stdout = io.TextIOWrapper(_WholeWrites(fd, "w", closefd=False), encoding=sys.stdout.encoding,
                                      errors=sys.stdout.errors, write_through=True)


class _WholeWrites(io.FileIO):
    """A file written whole: the rest of a write the kernel cut short is written again, where
    the OS says why it cannot be (FileIO.write returns the count written, which the text layer
    of an unbuffered stdout does not look at)."""

    def write(self, b) -> int:
        view, done = memoryview(b).cast("B"), 0
        while done < len(view):
            n = super().write(view[done:])
            if not n:  # (None: a non-blocking file that would block, said as FileIO says it)
                return done or n
            done += n
        return done


_DRAFT_HELP = ("A draft folder: speculators' format (P-EAGLE or EAGLE-3), or EAGLE-3 as EAGLE / SpecForge / ModelOpt "
               "save it.")
_AUX_IDS_HELP = ("How an EAGLE/SpecForge/ModelOpt draft's config counts the aux layer ids it names: layer-output "
                 "(id i is layer i's output, as SGLang reads them and SpecForge and ModelOpt train) or layer-input (the "
                 "state entering layer i, as vLLM).")


_EMBEDDINGS_HELP = ("Which embed_tokens the draft's graph runs: own (its stored embed_tokens.weight, as vLLM and EAGLE "
                    "run it) or target (the target's, as SGLang and TensorRT-LLM run a draft as wide as its target). "
                    "A no-op for a draft that stores none (it runs the target's either way); refused for a draft "
                    "whose own has another shape than the target's. The receipt records which one the graph runs.")


# the options of the draft (bind_draft's allow_pickle, aux_ids_count and embeddings), in --help's
# order: held once, for _draft_options to declare and _check_draft_options to refuse without --draft
_DRAFT_OPTIONS = {
    "--allow-draft-pickle": dict(is_flag=True, help="Read the draft's pytorch_model.bin pickle (unpickling can run "
                                                    "code)."),
    "--draft-aux-ids": dict(type=click.Choice(list(DRAFT_AUX_IDS)), default=None, help=_AUX_IDS_HELP),
    "--draft-embeddings": dict(type=click.Choice(DRAFT_EMBEDDINGS), default="own", show_default=True,
                               help=_EMBEDDINGS_HELP),
}


def _draft_options(f):
    """The draft's options (_DRAFT_OPTIONS) on a command that takes --draft."""
    for decl, kwargs in reversed(_DRAFT_OPTIONS.items()):  # (click lists the last decorator applied first)
        f = click.option(decl, **kwargs)(f)
    return f


def _check_draft_options(draft: Path | None) -> None:
    """A draft option given without --draft would be ignored: refuse it, naming it."""
    if draft is not None:
        return
    ctx = click.get_current_context()
    given = [p.opts[0] for p in ctx.command.params if p.opts[0] in _DRAFT_OPTIONS
             and ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT)]
    if given:
        raise UserError(f"{', '.join(given)}: {'applies' if len(given) == 1 else 'apply'} to a draft, and no "
                        "--draft was given")


def _lora_options(f):
    """--lora and --allow-lora-pickle (export's, and inspect's to show what it would merge)."""
    f = click.option("--allow-lora-pickle", is_flag=True, help="Read the adapter's adapter_model.bin pickle "
                                                                 "(unpickling can run code).")(f)
    return click.option("--lora", "lora", type=existing_folder(),
                        help="A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) to merge "
                             "into the target's weights (W + scale * B @ A); the receipt records it.")(f)


def _check_lora_options(lora: Path | None, allow_lora_pickle: bool) -> None:
    if allow_lora_pickle and lora is None:  # (ignored otherwise, as a draft option without --draft)
        raise UserError("--allow-lora-pickle: applies to a LoRA adapter, and no --lora was given")


@main.command()
@click.argument("target", type=existing_folder())
@click.option("--draft", type=existing_folder(), help=_DRAFT_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the binding receipt as JSON.")
@click.option("--allow-pickle", is_flag=True, help="Read the target's pytorch_model.bin pickle (unpickling can run code).")
@_draft_options
@_lora_options
def inspect(target: Path, draft: Path | None, as_json: bool, allow_pickle: bool, allow_draft_pickle: bool,
            draft_aux_ids: str | None, draft_embeddings: str, lora: Path | None, allow_lora_pickle: bool) -> None:
    """Bind TARGET (and --draft) to canonical slots and print the binding table (with --lora, what
    export --lora would merge)."""
    _check_draft_options(draft)
    _check_lora_options(lora, allow_lora_pickle)
    from specrt.export.binding import bind_draft, bind_target, config_notes, embed_note, length_note, receipt
    from specrt.export.export import check_training_receipt, eos_note
    from specrt.export.lora import LINEAR_SLOTS, base_note, bind_lora, fan_in_fan_out_note, others_note

    t = bind_target(target, allow_pickle=allow_pickle)
    # bound as export binds it (its refusals here too), and merged as each weight is read below
    t.lora = bind_lora(lora, t, allow_lora_pickle) if lora is not None else None
    d = bind_draft(draft, t, allow_draft_pickle, draft_aux_ids, draft_embeddings) if draft is not None else None
    # what export refuses of the checkpoints, refused here too (inspect bound them, exit 0, and
    # export then refused them): a weight's NaN or inf (each read as export reads it), a training
    # receipt the acceptance canary cannot read
    for bound in (t, d) if d is not None else (t,):
        for slot in bound.slots:
            bound.get(slot)
    if draft is not None:
        check_training_receipt(draft)
    r = receipt(t, d)
    notes = (*config_notes(d), embed_note(d), length_note(d)) if d is not None else ()
    if t.lora is not None:
        notes = (base_note(t.lora, target), fan_in_fan_out_note(t.lora), others_note(t.lora), *notes)
    for note in (eos_note(t.folder, t.config.eos_token_ids), *notes):
        if note is not None:
            click.secho(note, fg="yellow", err=True)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    for side in ("target", "draft"):
        if side not in r:
            continue
        part = r[side]
        click.echo(f"{side}: {part['folder']}")
        for slot, info in part["slots"].items():
            if "tied_to" in info:
                click.echo(f"  {slot:28s} <- tied to {info['tied_to']}")
            else:
                click.echo(f"  {slot:28s} <- {info['key']:52s} {info['dtype']:5s} {info['shape']}  {info['sha256'][:12]}")
        if side == "target" and "lora" in part:
            _echo_lora(part["lora"], sum(s.split(".")[-1] in LINEAR_SLOTS for s in t.slots))
        if side == "draft":
            if "format" in part:
                click.echo(f"  format: {part['format']['name']} ({part['format']['architecture']}), "
                           f"{len(part['format']['renamed'])} tensors bound through declared renames")
            same = {True: " (its own, equal to the target's)", False: " (its own, NOT the target's)"}.get(
                part.get("embed_matches_target"), "")
            if part.get("embeddings") == "target":  # in place of its own
                same = {True: " (--draft-embeddings target; its own equals the target's)",
                        False: " (--draft-embeddings target; its own is NOT the target's)"}.get(
                    part.get("embed_matches_target"), " (--draft-embeddings target)")
            extra = (part.get("config") or {}).get("extra") or {}
            written = extra.get("aux_layer_ids_written")
            counted = "" if written is None or written == part["aux_layer_ids"] else (
                f" (the states entering those layers: the config's {written} counted as layer outputs, "
                f"--draft-aux-ids {extra.get('aux_layer_ids_count')})")
            click.echo(f"  aux layer ids: {part['aux_layer_ids']}{counted}; embeddings from target: "
                       f"{part['embed_from_target']}{same}")
            click.echo(f"  relies on target: {', '.join(part['relies_on_target']) or 'none of its tensors'}")
            if part["config"].get("verifier_name"):
                click.echo(f"  trained against: {part['config']['verifier_name']} (speculators_config.verifier.name_or_path)")
    n = len(r["target"]["slots"]) + len(r.get("draft", {}).get("slots", {}))
    click.echo(f"bound {n} slots; receipt {r['receipt_id'][:16]}")


def _echo_lora(lora: dict, linear: int) -> None:
    """inspect's lines for the receipt's target.lora: what export --lora merges, by slot."""
    click.echo(f"lora: {lora['folder']} (r {lora['r']}, lora_alpha {lora['lora_alpha']}, use_rslora "
               f"{str(lora['use_rslora']).lower()}; base_model_name_or_path {lora['base_model_name_or_path']!r})")
    for slot, m in lora["modules"].items():
        click.echo(f"  {slot:28s} <- {m['lora_A']['key'][: -len('.lora_A.weight')] + '.lora_A/B':68s} "
                   f"rank {m['rank']:<4d} alpha {m['alpha']:<6g} scale {m['scale']:.6g}")
    for slot, t in lora.get("modules_to_save", {}).items():  # (w77g: its full copies, replacing the slot)
        click.echo(f"  {slot:28s} <- {t['key']:68s} {t.get('saved_by', 'modules_to_save')}: replaced")
    for slot, t in lora.get("trainable_tokens", {}).items():  # (w78c: trainable_token_indices' rows)
        click.echo(f"  {slot:28s} <- {t['key']:68s} trainable tokens: {len(t['indices'])} rows replaced")
    click.echo(f"  changes {len(lora['modules'])} of the target's {linear} linear weights (W + scale * B @ A)")


@main.command()
@click.argument("target", type=existing_folder())
@click.option("--draft", type=existing_folder(), help=_DRAFT_HELP)
@click.option("-o", "--out", type=PathArg("a folder"), required=True, help="Export folder to write.")
@click.option("--dtype", default="float32", show_default=True, help="float32, float16 or bfloat16 (or fp32, fp16, bf16).")
@click.option("--force", is_flag=True, help="Replace an existing export folder.")
@click.option("--allow-pickle", is_flag=True, help="Read the target's pytorch_model.bin pickle (unpickling can run code).")
@_draft_options
@_lora_options
def export(target: Path, draft: Path | None, out: Path, dtype: str, force: bool, allow_pickle: bool,
           allow_draft_pickle: bool, draft_aux_ids: str | None, draft_embeddings: str, lora: Path | None,
           allow_lora_pickle: bool) -> None:
    """Bind TARGET (and --draft) and lower them to ONNX in OUT, with export.json."""
    _check_draft_options(draft)
    _check_lora_options(lora, allow_lora_pickle)
    from specrt.export.export import export as run_export

    run_export(target, draft, out, dtype=dtype, force=force, allow_pickle=allow_pickle,
               log=lambda s: click.echo(s, err=True), allow_draft_pickle=allow_draft_pickle,
               draft_aux_ids=draft_aux_ids, draft_embeddings=draft_embeddings, lora_dir=lora,
               allow_lora_pickle=allow_lora_pickle)


def _depths(ctx, param, value):
    if value is None:  # build_engines' default: from the export's draft
        return None
    from specrt.engines.plan import parse_depths

    try:  # (its own parsing dropped empty entries: "1,,2" built 1,2 without a word, as the API no longer did)
        return parse_depths(value)
    except UserError as e:  # (click says "Invalid value for '--depths': " before it)
        said = str(e)
        raise click.BadParameter(f"'{value}': {said.removeprefix(f'--depths {value!r}: ')}"
                                 if said.startswith(f"--depths {value!r}: ") else said.removeprefix("--depths: ")) from None


@main.command()
@click.argument("export_dir", type=existing_folder())
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]), default="onnxruntime", show_default=True)
@click.option("--depths", default=None, callback=_depths,
              help="Verify depths to specialise, e.g. 1,2,4,8 or 1-4 (default: 1..K for a P-EAGLE draft trained to propose "
                   "K <= 8 tokens, 1,2,3,4 for K = 4; else 1,2,4,8).")
@click.option("-o", "--out", type=PathArg("a folder"), required=True, help="Engines folder to write.")
@click.option("--precision", default=None, help="fp32, fp16 or bf16 (default: the export's dtype).")
@click.option("--max-context", type=int, default=None,
              help="Context limit (default: the target's max positions, or its sliding window where shorter).")
@click.option("--threads", type=click.IntRange(min=1, max=MAX_THREADS), default=None,  # (ONNX Runtime takes a C int)
              help="ONNX Runtime intra-op threads (default: physical cores).")
@click.option("--sessions", type=click.Choice(["shared", "per-depth"]), default=None,
              help="ONNX Runtime: one prepacked session per graph (default), or one per depth (weights shared, "
                   "not prepacked; slower on CPU).")
@click.option("--trt-layout", type=click.Choice(["profiles", "engines"]), default="profiles", show_default=True,
              help="TensorRT: one engine with a profile per depth (weights once), or one engine per depth.")
@click.option("--ort-kv", type=click.Choice(["auto", "inplace", "append"]), default="auto", show_default=True,
              help="ONNX Runtime: re-lower the target with in-place KV (GroupQueryAttention updating preallocated "
                   "buffers; auto = when this ONNX Runtime supports it), or keep the export's portable graph.")
@click.option("--draft-weights", type=click.Choice(["fp", "int8", "int8:blocks", "int8:dynamic"]), default="fp",
              show_default=True,
              help="ONNX Runtime: keep the draft's weights as exported, or quantize them to int8 for a faster draft "
                   "pass (output still lossless: the target verifies every token). int8 times both int8 forms on "
                   "this machine and keeps dynamic (MatMulInteger, per-column codes, the MLP's gate/up and the "
                   "head) where its passes take under 97% of blocks' (MatMulNBits, blocks of 32, every weight), "
                   "else blocks.")
@click.option("--target-head", type=click.Choice(["full", "screened"]), default="full", show_default=True,
              help="ONNX Runtime, float32, in-place KV: 'screened' gives greedy decoding int8 logits (48 outlier "
                   "channels in fp32) and finds each token exactly from the fp32 head's rows that an error bound "
                   "leaves (specrt/head.py: ~10% off a decode step on SmolLM2); sampling and the prefill switch the "
                   "graph to the fp32 head.")
@click.option("--profile-repeats", type=click.IntRange(min=1, max=MAX_PROFILE_REPEATS), default=10,
              show_default=True,
              help="Timed passes per engine for the cost table (the median is kept): more passes, a steadier "
                   "table on a noisy machine, at about 0.5 s a pass on SmolLM2 with 2 cores.")
@click.option("--force", is_flag=True, help="Replace an existing engines folder.")
@click.option("--no-canary", is_flag=True, help="Skip the acceptance canary after building.")
def build(export_dir: Path, backend: str, depths, out: Path, precision, max_context, threads, sessions, trt_layout,
          ort_kv: str, draft_weights: str, target_head: str, profile_repeats: int, force: bool,
          no_canary: bool) -> None:
    """Build depth-specialised engines from EXPORT_DIR into OUT, with engines.json and a cost table.

    Then, when the export has a draft, the acceptance canary decodes a few prompts at depth 1
    and writes OUT/acceptance_receipt.json (see `specrt canary`)."""
    from specrt.engines import build_engines

    ort = {k: v for k, v in (("intra_op_num_threads", threads), ("sessions", sessions)) if v is not None}
    m = build_engines(export_dir, backend, depths, out, precision=precision, force=force, max_context=max_context,
                      ort_settings=ort or None, trt_layout=trt_layout, ort_kv=ort_kv,
                      draft_weights=draft_weights, target_head=target_head, profile_repeats=profile_repeats,
                      log=lambda s: click.echo(s, err=True))
    if not no_canary and m.get("draft_depth") and _has_draft(out):
        try:
            _canary(out, verify=False)
        except UserError as e:  # (after "engines complete": an unwritable receipt read as a failed build, s68)
            raise UserError(f"{e}; the engines in {out} are complete, without an acceptance receipt: "
                            f"`specrt canary {out}` runs the canary again") from None


def _has_draft(engines_dir: Path) -> bool:
    from specrt.manifest import load_export

    return load_export(engines_dir / "export", verify=False).get("draft") is not None


def _canary(engines_dir: Path, verify: bool = True) -> None:
    """The acceptance canary on ``engines_dir``; ``verify=False`` (the build that hashed the
    files just now) skips re-hashing them: `specrt canary` vouched for a graph swapped in
    from another build, which run then refused."""
    from specrt.engines.engine_set import load_engines
    from specrt.runtime.canary import draft_verifier, lora_cause, low_note, run_canary

    with load_engines(engines_dir, verify=verify) as engines:
        r = run_canary(engines)
        verifier = draft_verifier(engines.export)  # (its callers run it on engines with a draft: _has_draft)
        lora = lora_cause(engines.export)  # (a fine-tuned target lowers acceptance: said before a mis-bound weight)
    line = (f"acceptance canary: depth-1 acceptance {r['measured_depth1']:.2f} over {r['drafts']} drafts"
            + (f", training receipt {r['training_depth1']:.2f} ({r['training_source']})" if r["training_depth1"] is not None
               else " (no training receipt to compare with)"))
    if r.get("inconclusive"):
        click.secho(f"acceptance canary: {r['note']}", fg="yellow", err=True)
    elif r["trusted"] and r.get("low_without_receipt"):
        click.secho(f"{line}\nWARNING: {low_note(r['measured_depth1'], verifier)}" + (f"; or {lora}" if lora else ""),
                    fg="yellow", err=True)
    elif r["trusted"]:
        click.echo(line, err=True)
    else:
        why = f"{lora}; else a weight is bound" if lora else "a weight is probably bound"
        click.secho(f"{line}\nUNTRUSTED: measured acceptance is far below the training receipt; {why} to the wrong "
                    f"slot (binding receipt {r['binding_receipt_id'][:12]}). "
                    f"{engines_dir}/acceptance_receipt.json records it and `specrt run` will warn.", fg="red", err=True)


@main.command()
@click.argument("engines_dir", type=existing_folder())
def canary(engines_dir: Path) -> None:
    """Re-run the acceptance canary on ENGINES_DIR and rewrite its acceptance receipt."""
    from specrt.engines.manifest import read_engines_manifest

    read_engines_manifest(engines_dir)  # an engines folder, before its export is looked at
    if not _has_draft(engines_dir):
        raise UserError(f"{engines_dir}: the engines have no draft; nothing to check")
    check_engines_writable(engines_dir, ACCEPTANCE_FILE)
    _canary(engines_dir)


@main.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--repeats", type=click.IntRange(min=1, max=MAX_PROFILE_REPEATS), default=10, show_default=True,
              help="Timed calls per engine and past length (the median is kept).")
def profile(engines_dir: Path, repeats: int) -> None:
    """Measure ENGINES_DIR's cost table again on this machine now and rewrite it in
    engines.json (the build's table is kept as costs_build). DSpark's prices start from
    this table each session and `specrt bench` predicts from it: refresh it when the
    machine's speed has changed since the build."""
    from specrt.engines.build import reprofile_engines

    check_engines_writable(engines_dir, "engines.json")
    old, new = reprofile_engines(engines_dir, repeats, log=lambda m: click.echo(m, err=True))
    ref = str(new["reference_past"])
    before = (old.get("by_past") or {}).get(ref) or old
    after = new["by_past"][ref]
    rows = [("decode", before.get("decode"), after.get("decode")),
            *((f"verify.{d}", before.get("verify", {}).get(d), t) for d, t in after["verify"].items()),
            *((f"draft.{k}", (before.get("draft_by_depth") or {}).get(k), t)
              for k, t in (after.get("draft_by_depth") or {}).items()),
            *((f"chain.{L}", (before.get("chain") or {}).get(L), t) for L, t in (after.get("chain") or {}).items())]
    click.echo(f"{engines_dir}/engines.json: cost table at past {ref} (ms), before -> now")
    for name, b, a in rows:
        if a is not None:
            click.echo(f"  {name:10s} " + (f"{b * 1e3:8.2f} -> {a * 1e3:8.2f}  ({a / b:.2f}x)" if b else
                                           f"{'-':>8s} -> {a * 1e3:8.2f}"))


@main.command()
@click.argument("engines_dir", type=existing_folder())
@click.argument("answers", nargs=-1, required=True, type=PathArg("a file", exists=True, dir_okay=False))
@click.option("--nmin", type=click.IntRange(min=1), default=3, show_default=True, help="Shortest n-gram matched.")
@click.option("--nmax", type=click.IntRange(min=1), default=8, show_default=True, help="Longest n-gram matched.")
def corpus(engines_dir: Path, answers: tuple[Path, ...], nmin: int, nmax: int) -> None:
    """Make ENGINES_DIR/corpus.npz for corpus lookup (`--governor ...:corpus`) from
    ANSWERS: JSON lines (.gz too) with prompt_ids and answer_ids (the target's answers,
    e.g. the draft's training data) or text, or `specrt run --stats` JSON files (each
    prompt's prompt_ids and output_token_ids: your own traffic). Its per-position acceptance
    priors are measured on every 20th answer against a corpus of the others."""
    from specrt.runtime.corpus import FILE, NMAX_LIMIT, build_with_priors, match_name, read_sequences

    if nmin > nmax:  # (the default named: --nmin 9 alone said "> --nmax 8", an option not given)
        ctx = click.get_current_context(silent=True)
        default = ctx is not None and ctx.get_parameter_source("nmax") == click.core.ParameterSource.DEFAULT
        raise UserError(f"--nmin {nmin} > --nmax {nmax}" + (" (its default)" if default else "")
                        + ": expected --nmin <= --nmax")
    if nmax > NMAX_LIMIT:  # each lookup step searches nmax - nmin + 1 keys (Corpus.load refuses more)
        raise UserError(f"--nmax {nmax}: at most {NMAX_LIMIT}")
    first = {}
    for p in answers:  # (one file twice: each answer counted twice, the priors measured on copies the corpus holds)
        if (q := first.setdefault(p.resolve(), p)) is not p:
            raise UserError(f"{p}: given twice ({q} and {p}): its answers would count twice and their priors be "
                            "measured on answers the corpus holds; give each answers file once")
    from specrt.engines.manifest import read_engines_manifest
    from specrt.manifest import load_export

    manifest = read_engines_manifest(engines_dir)  # validated, as canary and profile read it
    export_dir = engines_dir / manifest["export"]["folder"]
    digest = manifest["export"]["digest"]
    # the export checked as loading the engines checks it (a broken export.json was blamed on
    # engines.json: "not an engines folder's manifest ('target')")
    vocab = int(load_export(export_dir, verify=False, digest=digest)["target"]["vocab_size"])
    check_engines_writable(engines_dir, CORPUS_FILE)

    @functools.cache
    def tokenizer():  # loaded once, and only when an answers file has text
        from specrt.runtime.text import Text

        return Text(export_dir)

    def encode(text: str) -> list[int]:
        return tokenizer().encode(text, chat=False)

    pairs = read_sequences(list(answers), encode, digest, vocab)  # (a token id outside it: named by file and line)
    if not pairs:
        raise UserError(f"{', '.join(map(str, answers))}: no answers")
    tokens = sum(len(c) + len(a) for c, a in pairs)
    click.echo(f"{_count(len(pairs), 'answer')}, {_count(tokens, 'token')}; measuring priors, then the corpus ...",
               err=True)
    c, tries = build_with_priors(pairs, nmin, nmax, info={"export_digest": digest, "answers": len(pairs),
                                                          "tokens": tokens, "files": [p.name for p in answers]})
    if not len(c):  # (a corpus of none was written without a word)
        raise UserError(f"{', '.join(map(str, answers))}: no n-grams of {nmin}..{nmax} tokens in the answers (empty "
                        "or too short): no corpus written")
    replaced = (engines_dir / FILE).is_file()
    c.save(engines_dir / FILE)
    click.echo(f"{engines_dir / FILE}: {len(c)} n-grams (n = {nmin}..{nmax}) from {_count(len(pairs), 'answer')}"
               + (" (it replaces the corpus that was there)" if replaced else ""))
    for key, rates in sorted(c.priors.items()):
        click.echo(f"  {match_name(key):38s} prior acceptance by position "
                   + " ".join(f"{r:.2f}" for r in rates[:6]) + f"  ({tries[key][0]} tries)")


def session_warnings(s) -> None:
    """What run, chat and serve say about the engines before they decode: the canary's
    loud warning for a draft far below its training accuracy, a note for one never checked;
    a note for a cost table profiled on a busy machine that the governor prices from; a note
    for a --chat-template-kwargs variable the chat template never reads."""
    if s.untrusted:
        click.secho(f"WARNING: {s.untrusted}", fg="red", err=True)
    elif s.unchecked:
        click.echo(f"note: {s.unchecked}", err=True)
    elif s.low_acceptance:
        click.echo(f"note: {s.low_acceptance}", err=True)
    if s.busy_costs:
        click.echo(f"note: {s.busy_costs}", err=True)
    if s.unread_template_kwargs:
        click.echo(f"note: --chat-template-kwargs {s.unread_template_kwargs}", err=True)


def run_notes(governor: str, params, seed: int | None, chat: bool, prompts: list,
              template_kwargs: dict | None = None) -> list[str]:
    """What `specrt run` says of options that will not do what they may seem to (a user walk):
    --seed under a governor whose rounds follow measured times (`specrt chat` too), --reproducible
    without a seed, --chat beside token ids, --chat-template-kwargs where no prompt goes through
    the template."""
    from specrt.prompt_files import template_notes
    from specrt.runtime.governor import split_lookup, split_tree

    notes = []
    base, lookup = split_lookup(governor)
    base = split_tree(base)[0]
    fixed = base == "off" or base.startswith("fixed:") or base.isdigit()  # ("3" is fixed:3)
    if seed is not None and params.seed is not None and not params.greedy and not params.coupled and (
            lookup or not fixed):  # (--seed -1 is none)
        notes.append(f"--seed {seed}: under {governor} the rounds follow measured times, so the same seed may sample "
                     "another text (of the same distribution); off and fixed:K repeat it, and --reproducible "
                     "gives off's text under every governor")
    if params.coupled and not params.greedy and params.seed is None:  # (a fresh seed each run: another text each
        # run, unsaid, a walk, w73c)
        notes.append("--reproducible without --seed draws a fresh seed each run, so the text is not repeated run "
                     "after run; give --seed S to repeat it")
    return notes + template_notes(chat, prompts, template_kwargs)


# run's and chat's --seed
SEED_HELP = ("Seed of the sampling (default: fresh entropy). The same seed repeats its text run after run under off "
             "and under a fixed:K (fixed:K's for the same --max-new-tokens: the budget shortens its last rounds), "
             "but not off's text under fixed:K: rejection sampling's text depends on the drafts; "
             "governors that choose from measured times (adaptive, dspark, :ngram, auto) may draft differently and "
             "give another sample of the same distribution. --reproducible gives off's text under every governor.")


def _count(n: int, noun: str) -> str:
    """"1 round", "2 rounds"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _read_prompts(path: Path, lines: list[int] | None = None) -> list[str | list[int] | list[dict]]:
    from specrt.prompt_files import prompts_of, read_prompt_file

    return prompts_of(read_prompt_file(path, lines=lines))


@main.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--prompt", callback=lambda ctx, param, v: argv_text(v), help="One prompt.")
@click.option("--prompts", "prompts_file", type=PathArg("a file", exists=True, dir_okay=False),
              help="JSON lines with a 'prompt' field or a conversation 'messages' (role/content objects: a "
                   "system prompt, earlier turns; rendered with the chat template), or token ids 'prompt_ids' "
                   "(as given, no template; printed as ids where the export has no tokenizer), decoded in turn.")
@click.option("--chat", is_flag=True, help="Wrap prompts in the exported chat template.")
@template_kwargs_option
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--governor", default="auto", show_default=True,
              help="auto | off | fixed:K | adaptive | dspark[:block=K][:profiled], each but auto and off with an "
                   "optional "
                   ":tree=W (block: DSpark drafts a fixed block of K; profiled: its costs stay the build's cost "
                   "table; tree=W: each round also verifies the draft's next W-1 choices for the first "
                   "position, dspark as many of them as pay that round; auto: dspark:tree=3:ngram:grow on engines that verify token trees, else dspark:ngram:grow; off:ngram:grow without a draft); "
                   "any of them with :ngram: prompt lookup, the tokens that followed an earlier occurrence of the "
                   "context's last 2-4 tokens, verified instead of drafts in the rounds where that pays "
                   "(off:ngram: prompt lookup alone; :ngram=L: chains of L tokens at most, by default 32 where "
                   "the cost table prices chains past the deepest verify depth, which run on the prefill "
                   "engine); any with :corpus: also the corpus `specrt corpus` "
                   "stored with the engines; any with :grow: also the run's own earlier answers (each prompt "
                   "of --prompts, with its answer, joins the search for the next ones; :grow=N keeps the "
                   "latest N tokens of them, 32768 without)")
@sampling_options("0 = greedy", seed=None, seed_help=SEED_HELP)
@click.option("--stop", "stops", multiple=True, callback=lambda ctx, param, v: tuple(map(argv_text, v)),
              help="A stop string (repeatable).")
@click.option("--stats", "stats_file", type=PathArg("a file"), help="Write telemetry JSON here.")
@click.option("--logprobs", type=click.IntRange(0, 20), default=None,
              help="Record each generated token's log-probability under the target (the model's own, before "
                   "temperature / top-k / top-p) and its N most likely alternatives in --stats (per prompt "
                   "'output_logprobs').")
@click.option("--grow-file", type=PathArg("a file", dir_okay=False),
              help="Session growth (:grow, part of auto) across runs: start from this file's sequences when it "
                   "exists, and write the run's latest ones back to it at the end.")
@click.option("--no-prefix-reuse", is_flag=True,
              help="Prefill every prompt of --prompts from an empty cache. By default a prompt that begins with "
                   "the previous one's tokens (a chat's growing history, a document asked about again, the chat "
                   "template's system prompt) reuses their KV cache rows, computed the same way, and prefills "
                   "only the rest.")
@click.option("--json-schema", "json_schema", type=PathArg("a file", exists=True, dir_okay=False),
              help="Structured output: each answer is JSON matching this JSON schema file (needs llguidance: "
                   "pip install 'specrt[structured]'). --json-schema, --json, --regex, --choice and --grammar "
                   "exclude each other.")
@click.option("--json", "json_any", is_flag=True, help="Structured output: each answer is a JSON object.")
@click.option("--regex", callback=lambda ctx, param, v: argv_text(v),
              help="Structured output: each answer matches this regular expression (Rust regex syntax).")
@click.option("--choice", "choices", multiple=True, callback=lambda ctx, param, v: tuple(map(argv_text, v)),
              help="Structured output: each answer is one of these strings (repeatable).")
@click.option("--grammar", "grammar_file", type=PathArg("a file", exists=True, dir_okay=False),
              help="Structured output: each answer is a sentence of this Lark grammar file (llguidance's Lark).")
@click.option("--structural-tag", "tag_file", type=PathArg("a file", exists=True, dir_okay=False),
              help="Structured output: vLLM's structural tag in this JSON file, {\"structures\": [{\"begin\", "
                   "\"schema\", \"end\"}], \"triggers\": [...]} (or xgrammar's triggered_tags format): free "
                   "text, where each trigger starts the structure whose begin it begins (its begin, JSON of its "
                   "schema, its end).")
@click.option("--json-whitespace", "json_whitespace", callback=lambda ctx, param, v: argv_text(v),
              help="The whitespace JSON may have around its tokens under --json-schema, --json or "
                   "--structural-tag (vLLM's whitespace_pattern, a regular expression: \"\" none, compact "
                   "JSON; \"[ ]?\" a space or none). By default JSON is written as json.dumps writes it.")
@click.option("--prediction", "prediction_file", type=PathArg("a file", exists=True, dir_okay=False),
              help="A predicted output (OpenAI's Predicted Outputs): a UTF-8 text file the answer to --prompt is "
                   "expected to largely repeat (a file being edited). Its tokens are proposed beside the draft; "
                   "the answer stays the target's own. The closing line and --stats ('prediction') count its "
                   "accepted and rejected tokens.")
@click.option("--quiet", is_flag=True, help="Do not print the generated text.")
def run(engines_dir: Path, prompt, prompts_file, chat, chat_template_kwargs, max_new_tokens, governor, temperature, top_p, top_k, seed,
        reproducible, stops, stats_file, logprobs, grow_file, no_prefix_reuse, json_schema, json_any, regex, choices,
        grammar_file, tag_file, json_whitespace, prediction_file, quiet) -> None:
    """Speculative decoding on ENGINES_DIR, streaming text as it is accepted. Ctrl-C or
    SIGTERM stops it with --stats and --grow-file written for what was decoded (the stats
    say "interrupted": true); so does an engine failure (NaN or +inf logits, the backend's own
    error at a call) or a grammar no token can continue, once anything was decoded (the stats'
    "failed" holds the error).
    With --json-schema, --json, --regex, --choice, --grammar or --structural-tag each answer is held to it
    (structured output: lossless relative to the target with the tokens the grammar refuses
    masked; an answer ends where the grammar is complete)."""
    import copy

    from specrt.paths import check_distinct, check_not_engines_file, check_output_file
    from specrt.runtime.governor import is_dspark
    from specrt.prompt_files import check_each, is_token_ids
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session
    from specrt.runtime.telemetry import Telemetry
    from specrt.runtime.text import StopScanner

    if (prompt is None) == (prompts_file is None):
        raise UserError("give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    lines: list[int] = []  # each prompt's line in --prompts (blank lines passed over)
    prompts = [prompt] if prompt is not None else _read_prompts(prompts_file, lines)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, coupled=reproducible)
    if no_prefix_reuse and len(prompts) == 1:  # (taken without a word: session 70's CLI walk, L5)
        click.echo("note: --no-prefix-reuse has no effect on one prompt: only a later prompt of --prompts reuses "
                   "an earlier one's KV rows", err=True)
    StopScanner(stops)  # a bad stop string is refused before the engines load
    constraint = _constraint(json_schema, json_any, regex, choices, grammar_file, tag_file,  # (a bad file:
                             json_whitespace)  # before loading)
    prediction = None
    if prediction_file is not None:  # (read before the engines load)
        if prompts_file is not None:
            raise UserError("--prediction predicts one answer: give it with --prompt, not --prompts")
        from specrt.paths import read_utf8

        prediction = read_utf8(prediction_file, "expected a predicted output in UTF-8 text")
    if stats_file is not None:
        check_output_file(stats_file, "--stats")
        check_not_engines_file(stats_file, engines_dir, "--stats")
    elif logprobs is not None:
        raise UserError("--logprobs N: the logprobs go into the --stats file; give --stats FILE too")
    if grow_file is not None:
        check_output_file(grow_file, "--grow-file")
        check_not_engines_file(grow_file, engines_dir, "--grow-file", users_files=True)
    # one file for two: the stats replaced the prompts file
    check_distinct(("--prompts", prompts_file), ("--stats", stats_file), ("--grow-file", grow_file))
    with Session(engines_dir, governor=governor, sampling=params, reuse_prefix=not no_prefix_reuse,
                 chat_template_kwargs=chat_template_kwargs) as s:
        session_warnings(s)
        s.chat_option = "--chat"
        governor = s.governor_spec  # ``auto`` resolved
        if grow_file is not None:
            try:
                existed, n = grow_file.exists(), s.load_growth(grow_file)  # refused before any decoding
            except UserError as e:
                raise UserError(f"--grow-file {e}") from None
            if existed:
                click.echo(f"{governor}: session growth from {grow_file} ({n} sequences)", err=True)
        if s.text is None and stops:
            raise UserError(f"--stop: stop strings need text, and {s.engines.export_dir} has no tokenizer.json")
        s.grammar_of(constraint)  # compiled once (kept by the session), a bad one refused before any decoding
        inputs = prompts  # what is streamed: --prompts' lines as the ids checked here, encoded once
        if prompts_file is not None:  # every line before the first is decoded (a bad one cost the answers before it)
            inputs = check_each(prompts, lambda p: s.check_prompt(p, chat=chat, max_new_tokens=max_new_tokens),
                                [f"{prompts_file}:{n}" for n in lines])
        if is_dspark(governor):  # (said once the prompts are known good: it came before a bad prompt's error)
            click.echo(f"{governor}: {s.calibration_note}", err=True)
        for note in run_notes(governor, params, seed, chat, prompts, s.chat_template_kwargs):
            click.echo(f"note: {note}", err=True)
        total, per_prompt = Telemetry(), []
        finishes: dict = {}  # without --stats, one shared record a finish reason

        def record(p, st: dict) -> dict:
            """A prompt's record in ``per_prompt``: its whole stats for --stats; without it, its
            finish alone, which the closing line counts (100k prompts kept 0.5-0.9 GB of stats that
            nothing wrote)."""
            if stats_file is not None:
                return {"prompt": p, **st}
            return finishes.setdefault(st["finish_reason"], {"finish_reason": st["finish_reason"]})

        # the prompt in flight: its index, its stream, whether it gave a piece (only then do
        # s.stats() describe it: s.stream starts when first read) and whether its telemetry
        # was merged, so that a stop at any point records it once
        current, stream, printed, merged = -1, None, False, -1
        summarised = False  # (an engine failure's summary: a stop landing in it does not write another)

        def cut_short(reason: str) -> None:
            """The prompt in flight, stopped (``reason``: its finish_reason unless it had just
            ended) after a piece and not yet recorded: recorded, its telemetry merged once."""
            if printed and len(per_prompt) <= current:
                st = s.stats()
                st["finish_reason"] = st["finish_reason"] or reason
                if merged != current:
                    total.merge(s.generator.telemetry)
                per_prompt.append(record(prompts[current], st))

        try:
            for i, (p, q) in enumerate(zip(prompts, inputs)):
                current, stream, printed = i, None, False
                if i and not quiet:  # a blank line between answers (several lines each ran together)
                    click.echo()
                try:
                    if s.text is None and is_token_ids(q):  # no tokenizer: ids in, ids out
                        sep = ""
                        stream = s.stream_ids(q, max_new_tokens, logprobs, grammar=constraint,
                                              prediction=_prediction_ids(prediction, prediction_file))
                        for chunk in stream:
                            printed = True
                            if not quiet and chunk:
                                click.echo(sep + " ".join(map(str, chunk)), nl=False)
                                sep = " "
                    else:
                        stream = s.stream(q, chat=chat, max_new_tokens=max_new_tokens, stop=tuple(stops),
                                          logprobs=logprobs, grammar=constraint, prediction=prediction)
                        for piece in stream:
                            printed = True
                            if not quiet:  # color=True: click.echo strips escape sequences from output that is not a terminal
                                click.echo(piece, nl=False, color=True)
                except UserError as e:
                    if printed and not quiet:  # the answer's line ends before the error (it ran on after the text)
                        click.echo()
                    said = str(e) if prompts_file is None else f"{prompts_file}:{lines[i]}: {e}"
                    ended = s.generator.finished  # ("error": the stream failed mid-answer, a grammar's dead end too)
                    if (isinstance(e, EngineFailure) or ended is not None and ended.reason == "error") \
                            and (per_prompt or printed):
                        # what was decoded is kept, as a stop keeps it (a failure at prompt 60 of 80 lost 59
                        # answers' stats), the prompt cut short with finish_reason "error"
                        cut_short("error")
                        summarised = True
                        _run_summary(s, engines_dir, governor, total, per_prompt, stats_file, grow_file, len(prompts),
                                     failed=said)
                    if prompts_file is None:
                        raise
                    raise UserError(said) from None
                if not quiet:
                    click.echo()
                st = s.stats()
                if st.get("finish_reason") == "context":
                    where = f"prompt {i + 1}: " if prompts_file is not None else ""
                    click.echo(f"[{where}stopped at the engines' context limit of {s.engines.max_context} tokens "
                               f"after {_count(len(st['output_token_ids']), 'new token')} "
                               f"({st['prompt_tokens']} in the prompt); `specrt build --max-context` sets the limit]",
                               err=True)
                # merged and marked so in one step: a stop landing between the two counted the answer's
                # tokens twice (cut_short merged it again)
                both = copy.deepcopy(total)
                both.merge(s.generator.telemetry)
                total, merged = both, i
                per_prompt.append(record(p, st))
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM (cli._terminated): what was decoded is
            # kept, then "Aborted!" (exit 1) or "Terminated" (exit 143) as before
            if summarised:  # (in an engine failure's summary, which wrote the files)
                raise
            if stream is not None:
                stream.close()
            cut_short("interrupted")
            click.echo(err=True)
            _run_summary(s, engines_dir, governor, total, per_prompt, stats_file, grow_file, len(prompts))
            raise
        _run_summary(s, engines_dir, governor, total, per_prompt, stats_file, grow_file)


def _prediction_ids(prediction: str | None, path: Path | None) -> list[int] | None:
    """--prediction's text as token ids where the engines have no tokenizer: the file must hold
    token ids then (whitespace-separated integers), as such a run prints its answers."""
    if prediction is None:
        return None
    try:
        return [int(t) for t in prediction.split()]
    except ValueError:
        raise UserError(f"--prediction {path}: these engines have no tokenizer, so the prediction must be token ids "
                        "(whitespace-separated integers)") from None


def _constraint(json_schema: Path | None, json_any: bool, regex: str | None, choices: tuple, grammar_file: Path | None,
                tag_file: Path | None = None, whitespace: str | None = None):
    """run's structured output option as a grammar.Constraint (None without one), each named
    as given: one at most, a file read (a bad one named) before the engines load; ``whitespace``
    (--json-whitespace) its JSON's, for the JSON kinds and a structural tag's schemas."""
    from dataclasses import replace

    from specrt.runtime.grammar import whitespace_problem

    c = _structured(json_schema, json_any, regex, choices, grammar_file, tag_file)
    if whitespace is None:
        return c
    if c is None or c.kind not in ("json_schema", "json", "structural_tag"):
        raise UserError("--json-whitespace applies to JSON (--json-schema, --json, --structural-tag's schemas); " + (
            f"the answer is held to {c.label}" if c is not None else "give one of them"))
    why = whitespace_problem(whitespace)
    if why:
        raise UserError(f"--json-whitespace: {why}")
    return replace(c, whitespace=whitespace)


def _structured(json_schema, json_any, regex, choices, grammar_file, tag_file):
    """The one structured output option given, as a Constraint (None without one)."""
    from specrt.paths import read_json_object, read_utf8
    from specrt.runtime.grammar import Constraint

    given = [o for o, v in (("--json-schema", json_schema), ("--json", json_any or None), ("--regex", regex),
                            ("--choice", choices or None), ("--grammar", grammar_file),
                            ("--structural-tag", tag_file)) if v is not None]
    if len(given) > 1:
        raise UserError(f"{' and '.join(given)}: give one structured output option at most")
    if tag_file is not None:  # (read as serve reads response_format's: vLLM's form or xgrammar's triggered_tags)
        from specrt.cmd_serve import BadRequest, _structural_tag

        try:
            return _structural_tag(f"--structural-tag {tag_file}", read_json_object(tag_file))
        except UserError as e:
            raise UserError(f"--structural-tag {e}") from None
        except BadRequest as e:
            raise UserError(str(e)) from None
    if json_schema is not None:
        try:
            return Constraint.json_schema(read_json_object(json_schema), f"--json-schema {json_schema}")
        except UserError as e:
            raise UserError(f"--json-schema {e}") from None
    if grammar_file is not None:
        try:
            return Constraint.lark(read_utf8(grammar_file, "expected a Lark or GBNF grammar in UTF-8 text"),
                                   f"--grammar {grammar_file}")
        except UserError as e:
            raise UserError(f"--grammar {e}") from None
    return (Constraint.json("--json") if json_any else Constraint.regex(regex, "--regex") if regex is not None
            else Constraint.choice(list(choices), "--choice") if choices else None)


def _run_summary(s, engines_dir: Path, governor: str, total, per_prompt: list[dict], stats_file: Path | None,
                 grow_file: Path | None, interrupted_of: int | None = None, failed: str | None = None) -> None:
    """run's closing line, its --stats and its --grow-file; ``interrupted_of``: the run was
    stopped (Ctrl-C, SIGTERM) with that many prompts given, and these describe what it
    decoded (the stats' ``interrupted`` is true, the prompt cut short has finish_reason
    "interrupted"), or, with ``failed`` (the error, said by the caller after), it ended at an
    engine failure (the stats' ``failed`` holds the error, the prompt cut short has
    finish_reason "error")."""
    stats = {**total.to_json(), "governor": governor, "engines": str(engines_dir),
             "export_digest": s.engines.manifest["export"]["digest"],
             "interrupted": interrupted_of is not None and failed is None, "failed": failed, "prompts": per_prompt}
    saved = " and ".join(f"{o} {f}" for o, f in (("--stats", stats_file), ("--grow-file", grow_file)) if f)
    stopped = None
    try:
        _run_closing_lines(stats, governor, per_prompt, saved, interrupted_of, failed is not None)
    except (KeyboardInterrupt, SystemExit) as e:  # (after every prompt was answered: the files still hold them)
        stopped = e
    stopped = _write_run_files(s, stats, stats_file, grow_file) or stopped
    if stopped is not None:
        if interrupted_of is None:  # ("Aborted!" alone said nothing of the files, nor that the run had ended)
            click.echo(f"\n[interrupted after all {len(per_prompt)} prompts were answered"
                       + (f"; {saved} {_hold(saved)} them" if saved else "") + "]", err=True)
        raise stopped


def _hold(saved: str) -> str:
    """The verb after ``saved`` ("--stats F", or "--stats F and --grow-file G")."""
    return "hold" if " and --grow-file " in saved else "holds"


def _write_run_files(s, stats: dict, stats_file: Path | None, grow_file: Path | None) -> BaseException | None:
    """run's --stats and --grow-file, each whole or as before. A Ctrl-C or SIGTERM landing in
    one of them lets that one be written again, once (another in the same write stops it), and
    is returned once both are written: one landing just after the run's last answer left
    neither written. One that cannot be written (a full disk) does not keep the other from
    being written (the stats' error lost the run's growth, unsaid); its error is raised after."""
    from specrt.paths import write_atomic

    pending, failed = None, []
    writes = ([lambda: write_atomic(stats_file, stats)] if stats_file else []) + (
        [lambda: s.save_growth(grow_file)] if grow_file is not None else [])
    for write in writes:
        try:
            try:
                write()
            except (KeyboardInterrupt, SystemExit) as e:
                pending = e
                write()
        except UserError as e:
            failed.append(str(e))
    if failed:
        raise UserError("; ".join(failed))
    return pending


def _run_closing_lines(stats: dict, governor: str, per_prompt: list[dict], saved: str,
                       interrupted_of: int | None, failed: bool = False) -> None:
    from specrt.runtime.prediction import KEYS as PREDICTION_KEYS
    from specrt.runtime.prediction import usage as prediction_usage

    if interrupted_of is not None:
        done = sum(st["finish_reason"] not in ("interrupted", "error") for st in per_prompt)  # (answered in full)
        click.echo(f"[{'failed' if failed else 'interrupted'}: {done} of {interrupted_of} prompts answered"
                   + (", one cut short" if len(per_prompt) > done else "")
                   + (f"; {saved} {_hold(saved)} what was decoded" if saved else "") + "]", err=True)
    tree = stats["tree"]
    trees = (f", runners-up in {_count(tree['rounds'], 'round')}, {tree['sibling_accepts']} won" if tree["rounds"]
             else "")
    lk = stats["lookup"]
    # (a predicted output's rounds are lookup rounds under keys of their own: said apart)
    pred = prediction_usage(lk["by_match"])
    rounds, per_round = lk["rounds"] - pred["prediction_rounds"], lk["tokens_per_round"]
    if pred["prediction_rounds"] and rounds:
        looked = [c for k, c in lk["by_match"].items() if int(k) not in PREDICTION_KEYS]
        per_round = 1 + sum(c["accepted"] for c in looked) / rounds
    if rounds:
        trees += f", {_lookup_words(governor)} in {_count(rounds, 'round')}, {per_round:.2f} tokens a round"
    if pred["prediction_rounds"]:
        trees += (f", the prediction in {_count(pred['prediction_rounds'], 'round')}: "
                  f"{pred['accepted_prediction_tokens']} of its tokens accepted, "
                  f"{pred['rejected_prediction_tokens']} rejected")
    if stats["prefix_reused"]:
        trees += f", {stats['prefix_reused']} of {stats['prompt_tokens']} prompt tokens reused from the one before"
    rej = stats["rejections"]
    if rej["outside_draft_vocab"]:  # a draft trained on other text than these prompts' shows it here
        trees += (f", {rej['outside_draft_vocab']} of {rej['rounds']} rejected drafts to tokens outside the "
                  "draft's vocabulary")
    click.echo(f"[{_count(stats['new_tokens'], 'token')} in {stats['seconds']:.2f} s: "
               f"{stats['tokens_per_s']:.1f} tok/s, first token after {stats['first_token_s']:.2f} s, "
               f"{tau_words(stats)}, governor {governor}{trees}]", err=True)


def tau_words(stats: dict) -> str:
    """tau (the draft's: its rounds' tokens) for a closing line (run's, chat's, serve's log
    line), or "no draft rounds" where none ran (`off`, a prompt lookup answered whole: "tau
    1.00" read as a draft accepting nothing)."""
    return f"tau {stats['tau']:.2f}" if stats["draft_rounds"] else "no draft rounds"


def _lookup_words(governor: str) -> str:
    """A governor's lookup rounds in words: prompt lookup searches the context alone;
    ``:corpus`` and ``:grow`` search the corpus and the run's earlier answers beside it."""
    from specrt.runtime.governor import wants_corpus, wants_grow

    more = [w for w, on in (("the corpus", wants_corpus(governor)), ("earlier answers", wants_grow(governor))) if on]
    if not more:
        return "prompt lookup"
    # (a list: "lookup in the context, earlier answers in 7 rounds" read as two items of the closing line's)
    where = ["the context", *more]
    return f"lookup in {', '.join(where[:-1])} and {where[-1]}"


def _prompting() -> bool:
    """Whether chat shows its "> " marker: to someone typing (stdin a terminal), not before
    each line of a file or pipe (as python's and sqlite3's prompts)."""
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError):  # (a closed or odd stdin: no marker)
        return False


@main.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--system", callback=lambda ctx, param, v: argv_text(v),
              help="A system prompt for the conversation.")
@template_kwargs_option
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="The longest answer, a turn.")
@click.option("--governor", default="auto", show_default=True, help="As for `specrt run`.")
@sampling_options("0 = greedy", seed=None, seed_help=SEED_HELP)
def chat(engines_dir: Path, system, chat_template_kwargs, max_new_tokens, governor, temperature, top_p, top_k, seed,
         reproducible) -> None:
    """A conversation on ENGINES_DIR through the exported chat template: each line read is
    a user turn, the answer streams as it is accepted, and every turn reuses the KV rows of
    the conversation so far (prefix reuse). When the conversation and room for an answer
    (--max-new-tokens, at most a quarter of the context) outgrow the engines' context,
    its oldest turns are dropped (the system prompt stays) until a quarter of the context is
    free besides, so that the next turns reuse the rows left, and it says so; a turn that
    does not fit alone, or is not UTF-8 text, is said and skipped (the conversation goes
    on); a system prompt that leaves no room for a turn is refused before the first. Ctrl-C
    during an answer stops it (what was printed stays in the conversation; before its first
    token, the turn is dropped); an engine failing an answer (NaN logits, ONNX Runtime's own
    error) is said and the turn dropped, the conversation going on, and the chat exits 1 at
    its end; an empty line (or one of spaces) or the end of input ends the conversation.
    With --seed S the conversation's turn k (from 0) samples with seed S + k."""
    from dataclasses import replace

    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session
    from specrt.runtime.text import not_text

    # (bytes that were not UTF-8 were said as "the prompt is not valid UTF-8 text ... after '<|im_start|>system")
    if system is not None and (problem := not_text(system, "--system")) is not None:
        raise UserError(problem)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, coupled=reproducible)
    with Session(engines_dir, governor=governor, sampling=params, chat_template_kwargs=chat_template_kwargs) as s:
        session_warnings(s)
        # run's note on --seed under a governor whose rounds follow measured times (the same seed gave each
        # chat other answers, unsaid: a walk, w72c)
        for note in run_notes(s.governor_spec, params, seed, True, []):
            click.echo(f"note: {note}", err=True)
        # --system "" is an empty system prompt (the template's default one was used: a walk, session 56)
        messages = [{"role": "system", "content": system}] if system is not None else []
        # before the first prompt is shown: no tokenizer (it showed "> " and failed on the first line), and a
        # system prompt leaving no room for a turn and a token of answer (every turn was skipped, one by one;
        # a turn that fits is answered, cut at the context, as the loop below takes it)
        if s.text is None:
            s.encode("", True)  # (its error: no tokenizer.json, and what to do)
        ctx = s.engines.max_context
        n = len(s.encode(messages + [{"role": "user", "content": ""}], True)) if messages else 0
        if n + 2 > ctx:
            raise UserError(f"--system: with an empty turn the system prompt makes a prompt of {n} tokens; the "
                            f"engines' context of {ctx} tokens leaves no room for a turn and its answer")
        failed = answered = asked = 0  # turns an engine failed; turns answered (in whole or stopped); streams begun

        def tokens(conversation: list[dict]) -> tuple[int, bool, list[int] | None]:
            """(the conversation's tokens, False, its ids), or (a lower bound on them, True, None)
            where that is already past the context: its tokenizing spared (a 1 MB line was tokenized
            once for each turn dropped for it, then skipped). Either way the drops below go as the
            count has them. The template is rendered once for both (it was rendered for the bound,
            again to be tokenized, and both again for the same turn once the drops were done: h74c),
            and the stream takes the ids (it rendered the turn once more: r74)."""
            text = s.prompt_text(conversation, True)
            least = s.text.least_tokens(text)
            if least + 1 > s.engines.max_context:
                return least, True, None
            ids = s.text.ids_of(text, False)
            return len(ids), False, ids

        while True:
            if _prompting():
                click.echo("> ", nl=False, err=True)
            if sys.stdin is None:  # (closed, `<&-`: the end of input, not an AttributeError's traceback)
                break
            raw = sys.stdin.buffer.readline() if hasattr(sys.stdin, "buffer") else sys.stdin.readline()
            try:  # bytes decoded a line at a time: a bad line is skipped, the next ones still read
                line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            except UnicodeDecodeError as e:
                click.echo(f"[a turn that is not UTF-8 text ({e.reason} at byte {e.start}): skipped]", err=True)
                continue
            if not line.strip():
                break
            # the line's end, "\n" or a CRLF file's "\r\n", is not part of the turn
            turn = messages + [{"role": "user", "content": line.rstrip("\r\n")}]
            room = min(max_new_tokens, s.engines.max_context // 4)
            first = 1 if system is not None else 0
            dropped, limit = 0, s.engines.max_context
            before, answer, stream = messages, [], None
            # Ctrl-C while the turn is tokenized (each drop encodes the conversation again; a long
            # paste takes seconds) drops the turn as before its first token: it ended the chat
            try:
                n, least, ids = tokens(turn)
                while n + room > limit and len(turn) > first + 1:
                    del turn[first:first + 2]  # the oldest user turn and its answer
                    dropped += 1
                    # once dropping, a quarter of the context freed besides: one exchange at a time
                    # moved the conversation's start every turn, so no later turn reused more than the
                    # template's preamble (7-10 s a turn against 2.5-4.4 s: session 55's soak)
                    limit = s.engines.max_context - s.engines.max_context // 4
                    n, least, ids = tokens(turn)
                if n + 1 > s.engines.max_context:  # this turn alone (and the system prompt) cannot fit
                    click.echo(f"[this turn makes a prompt of {'at least ' if least else ''}{n} tokens; the engines' "
                               f"context limit is {s.engines.max_context}: skipped, the conversation goes on]",
                               err=True)
                    continue  # (with every earlier turn: nothing was dropped for a turn that is not taken)
                messages = turn
                if dropped:
                    click.echo(f"[dropped the oldest {dropped} turn(s) to fit the context of "
                               f"{s.engines.max_context} tokens]", err=True)
                if params.seed is not None:  # turn k (from 0) samples with --seed + k, as serve's choice j with
                    # seed + j: every turn drew the seed's same numbers (under --reproducible its same noise), so a
                    # second turn's first token was the first's 164 times in 300, against 23 drawn apart (w73c)
                    s.generator.params = replace(params, seed=params.seed + asked)
                asked += 1
                stream = s.stream(ids, max_new_tokens=max_new_tokens)  # (the turn measured: its ids)
                for piece in stream:
                    click.echo(piece, nl=False, color=True)  # escape sequences too, as in run
                    answer.append(piece)
            except EngineFailure as e:  # (NaN logits, ONNX Runtime's own error): said on a line of its own,
                # as in run, and the turn dropped: the next may fare better (it ended the chat, the conversation lost)
                if answer:
                    click.echo()
                messages = before
                failed += 1
                click.echo(f"error: {e}", err=True)
                click.echo(f"[the turn is dropped{_back(dropped)}; the conversation goes on, and the chat exits 1 "
                           "at its end]", err=True)
                continue
            except UserError:
                if answer:
                    click.echo()
                raise
            except KeyboardInterrupt:  # Ctrl-C stops this answer, not the conversation
                if stream is not None:
                    stream.close()
                # the answer's line ended; none printed: the terminal's line ended on stderr, no empty
                # line in the answers' stdout
                click.echo(err=not answer)
                if not answer:  # (its stats were a line of zeros, and an empty answer stayed in the conversation)
                    messages = before
                    click.echo(f"[stopped before the answer began: the turn is dropped{_back(dropped)}; an empty line "
                               "or the end of input ends the conversation]", err=True)
                    continue
                click.echo("[stopped: the answer so far stays in the conversation; an empty line or the end of "
                           "input ends it]", err=True)
            else:
                click.echo()
            answered += 1
            messages.append({"role": "assistant", "content": "".join(answer)})
            if s.generator.finished is not None and s.generator.finished.reason == "context":
                # (with run's hint: chat's line said the limit only, session 70's context walk)
                click.echo(f"[the answer stopped at the engines' context limit of {s.engines.max_context} tokens; "
                           "`specrt build --max-context` sets the limit]", err=True)
            st = s.stats()
            click.echo(f"[{_count(st['new_tokens'], 'token')}, {st['tokens_per_s']:.1f} tok/s, {tau_words(st)}; "
                       f"{st['prefix_reused']} of {st['prompt_tokens']} prompt tokens reused]", err=True)
        if failed:
            raise EngineFailure(f"the engines failed {failed} of {failed + answered} turn(s) (each one's error above)")


def _back(dropped: int) -> str:
    """chat: what a dropped turn's message says of the older turns dropped to fit it."""
    return f" (the {dropped} older turn(s) dropped to fit it are back)" if dropped else ""


def _register() -> None:
    """Commands that live in their own modules (each imports its heavy parts lazily)."""
    from specrt.cmd_bench import bench
    from specrt.cmd_calibrate import calibrate
    from specrt.cmd_compare import compare
    from specrt.cmd_serve import serve

    main.add_command(bench)
    main.add_command(calibrate)
    main.add_command(compare)
    main.add_command(serve)


_register()

if __name__ == "__main__":  # pragma: no cover
    # `python -m specrt.cli` runs as the `specrt` command does (its SIGTERM handler, the huge-pages
    # restart): main() alone had no handler, so `timeout` left bench's and build's partial folders (h74b)
    from specrt.launch import entry as _entry

    _entry()
