"""A ready-to-run speculative decoder over one engines folder: the Python API of ``specrt run``.

    with Session("ENGINES") as s:                # governor "auto": dspark:tree=3:ngram:grow where it can
        for piece in s.stream("Write a haiku", chat=True, max_new_tokens=64):
            print(piece, end="")
        print(s.stats())                         # telemetry of the last prompt

One stream at a time: a stream started while another is unfinished supersedes it (reading
the older one on raises UserError), from one thread or several (their rounds take turns);
a stream read after ``close()`` raises UserError.

Governors: ``off`` (no speculation, same engines), ``fixed:K``, ``adaptive``
(onnxruntime-genai's scalar rule) and ``dspark`` (calibrated confidence and the engines'
cost table), each with an optional token tree (``:tree=W``); ``auto`` (the default) is
``dspark:tree=3:ngram:grow`` on engines that verify token trees, ``dspark:ngram:grow`` on
others, ``off:ngram:grow`` without a draft. Any of them with ``:ngram`` adds prompt lookup (ngram.py): in rounds
where it pays, the tokens that followed an earlier occurrence of the context's last 2-4
tokens are verified instead of drafts (``off:ngram``: prompt lookup alone, no draft needed); with
``:corpus`` the engines' corpus (corpus.py, ``specrt corpus``) proposes too, and ``auto`` adds
it wherever ``ENGINES/corpus.npz`` exists; with ``:grow`` each finished stream (prompt and
output) joins the search for the session's later streams (corpus.Growth, with or without
the corpus; ``auto`` has it). The calibration comes from ``ENGINES/calibration.json`` (``specrt
calibrate``), fitted for the run's decoding mode (greedy, or the same temperature /
top-k / top-p); one fitted for another mode serves only as a weak prior; without one, or
with one made for other engines, the identity map is used. ``calibration_note`` says which.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterator

import numpy as np

from specrt.contracts import ACCEPTANCE_FILE, CALIBRATION_FILE, CORPUS_FILE  # (importable from here too)
from specrt.engines.costs import busy_note, busy_share
from specrt.errors import UserError, json_problem
from specrt.limits import whole
from specrt.paths import check_path_args, folder_lock

from .corpus import Growth
from .generate import Finished, Generator, Stream, as_whole
from .governor import (COST_PAST, Calibration, Governor, from_spec, grow_tokens, is_dspark, lookup_chain,
                       split_lookup, wants_corpus)
from .grammar import Constraint, Grammar, compile_constraint
from .prediction import usage as prediction_usage
from .sampling import SamplingParams
from .text import Detokenizer, StopScanner, Text, context_of, template_kwargs_of, tokens_through


def _file_stamp(path: Path) -> tuple | None:
    """(device, inode, mtime, size) of ``path``, None where there is none: a file replaced (an
    atomic write) has another."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def engine_files(manifest: dict) -> dict[str, str]:
    """The sha256 of each file an engines manifest records, by name: the engines an acceptance
    receipt was measured on (canary.py writes it, Session checks it)."""
    return {r["file"]: r["sha256"] for r in manifest["files"]}


def read_d2t(export_dir: Path, export: dict) -> np.ndarray | None:
    vm = (export.get("draft") or {}).get("vocab_map")
    if not vm:
        return None
    from safetensors.numpy import load_file

    path = export_dir / vm["file"]
    d2t = load_file(str(path))["d2t"]
    # each draft id must reach its own target id: verification adds the draft's q into the
    # target vocabulary through it (verify.scatter_draft_probs), and two ids on one target id
    # would make q other than the distribution the draft was drawn from
    tgt = np.arange(len(d2t)) + d2t
    if len(np.unique(tgt)) != len(tgt):
        raise UserError(f"{path}: d2t maps two draft ids to the same target id (re-export the draft)")
    return d2t


# A calibration fitted under another decoding mode (greedy vs sampled, or another
# temperature / top-k / top-p) is only a prior: its counts are scaled down to this many
# rounds per position, so that the online updates take over within a prompt or two.
# Acceptance differs between modes (SmolLM2 + the committed draft: position 2's
# conditional acceptance 0.32 greedy, 0.26 at temperature 0.7 / top-p 0.9; the greedy
# map over-predicts the sampled first position by 0.05), and a full calibration's counts
# (thousands of rounds) would outweigh a run's own rounds for good.
PRIOR_ROUNDS = 64
GRAMMARS_KEPT = 16  # compiled grammars a Session keeps (Session.grammar_of)


def shallower_note(fitted_depth, depths) -> str:
    """"; fitted on engines of depth 2: positions 3-4 ..." when the calibration was fitted on
    shallower engines than these (of the same export): DSpark maps the positions it never saw
    as the identity until a run's own rounds refine them; else ""."""
    deep = max(depths, default=0)
    if not whole(fitted_depth, 1, deep - 1):
        return ""
    span = f"position {deep}" if fitted_depth + 1 == deep else f"positions {fitted_depth + 1}-{deep}"
    return (f"; fitted on engines of depth {fitted_depth}: {span} the identity map until this run's rounds refine "
            "them (`specrt calibrate` on these engines fits them)")


def weights_note(fitted: object, these: str | None) -> str:
    """"; fitted on engines of the int8 draft, ..." when a calibration copied across (README:
    Build) was fitted on engines whose draft weights were of another precision than these
    (`build --draft-weights`): the draft's confidences move with its weights (a user walk,
    session 71, found it taken as theirs); else "" (the same, or a file from before
    2026-12-07, which does not say)."""
    if not isinstance(fitted, str) or these is None or fitted == these:
        return ""
    return (f"; fitted on engines of the {fitted} draft, these run the {these} one: its confidences differ a "
            "little (`specrt calibrate` on these engines fits them)")


class UnreadableFile(UserError):
    """A file there that cannot be read (an OSError: no permission, a disk's EIO): unlike a
    broken one, what it holds is unknown, so calibrate may not replace it unseen."""


def read_calibration_file(path: Path, digest: str | None = None) -> dict[str, dict] | None:
    """The calibrations stored in ``path`` by decoding mode (``SamplingParams.mode``):
    {mode: entry with 'calibration' (a Calibration), 'rounds', 'sampling', ...}. None when the file was
    fitted for other engines (``digest`` given and different). Format /1 (one greedy
    calibration at the top level) reads as {'greedy': ...}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # (not UTF-8: a traceback in every command, calibrate's
        raise UserError(f"{path}: not valid JSON ({json_problem(e)})") from None  # replacement of it too)
    except OSError as e:
        raise UnreadableFile(f"{path}: cannot read ({e.strerror or e})") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if digest is not None and isinstance(data, dict) and isinstance(data.get("export_digest"), str) \
            and data["export_digest"] != digest:
        return None  # fitted for other engines: stale whatever its contents (a newer format, say)
    if fmt == "specrt.calibration-file/1":
        modes = {"greedy": {k: v for k, v in data.items() if k not in ("format", "export_digest")}}
    elif fmt == "specrt.calibration-file/2" and isinstance(data.get("modes"), dict) and data["modes"]:
        modes = data["modes"]
    else:
        raise UserError(f"{path}: format {fmt!r}: expected 'specrt.calibration-file/2' (or /1) with "
                        "at least one calibration; written by `specrt calibrate`")
    # a calibration fitted with --reproducible before coupled sampling was a mode of its own
    # was stored under the rejection sampler's key, its entry's sampling saying coupled: its key now
    modes = {(m + ",coupled" if isinstance(e, dict) and isinstance(e.get("sampling"), dict)
              and e["sampling"].get("coupled") is True and not m.endswith(",coupled") else m): e
             for m, e in modes.items()}
    for m, e in modes.items():
        if not isinstance(e, dict) or "calibration" not in e:
            raise UserError(f"{path}: mode {m!r} has no 'calibration'")
        s = e.get("sampling")
        if m != "greedy" and not (isinstance(s, dict) and isinstance(s.get("temperature"), (int, float))
                                  and s["temperature"] > 0):
            raise UserError(f"{path}: mode {m!r}: 'sampling' {e.get('sampling')!r}: expected an object with a "
                            "temperature > 0")
        try:
            e["calibration"] = Calibration.from_dict(e["calibration"])
        except UserError as err:
            raise UserError(f"{path}: mode {m!r}: {err}") from None
        # calibrate fits a map for each position 1..K of the deepest verify depth K: a position missing
        # (or one more) was taken without a word, the missing ones the identity map (no shallower_note)
        positions = e["calibration"].positions
        if "rounds" in e and not whole(e["rounds"], 0):  # (shown in every run's note: "None rounds")
            raise UserError(f"{path}: mode {m!r}: 'rounds' {e['rounds']!r}: expected a whole number >= 0")
        if "depth" in e and not (whole(e["depth"]) and e["depth"] == positions):
            raise UserError(f"{path}: mode {m!r}: 'depth' {e['depth']!r} but {positions} positions in its "
                            "calibration's 'counts': expected a row for each position 1..depth")
    if digest is not None and data.get("export_digest") != digest:  # well formed, but says for no engines
        return None
    return modes


def _temperature_of(mode: str, entry: dict) -> float:
    return 0.0 if mode == "greedy" else float(entry["sampling"]["temperature"])  # checked when read


def prior_from(modes: dict[str, dict], sampling: SamplingParams) -> tuple[str, Calibration]:
    """(mode, calibration): the stored calibration of the temperature nearest ``sampling``'s
    (greedy counts as 0; ties by name), softened to a prior of PRIOR_ROUNDS rounds a position."""
    t = 0.0 if sampling.greedy else sampling.temperature
    # at the same distance, one of the same sampler (coupled or rejection: acceptance differs)
    near = min(modes, key=lambda m: (abs(_temperature_of(m, modes[m]) - t),
                                     m.endswith(",coupled") != bool(sampling.coupled and not sampling.greedy), m))
    return near, modes[near]["calibration"].softened(PRIOR_ROUNDS)


def load_calibration(engines, sampling: SamplingParams = SamplingParams(),
                     governor: str | None = None) -> tuple[Calibration | None, str]:
    """(calibration, note) for decoding with ``sampling``. A calibration is tied to the
    engines' export digest and to a decoding mode: the mode's own when stored; otherwise
    the stored one of the nearest temperature, as a prior of PRIOR_ROUNDS rounds a
    position that the run's own rounds soon outweigh. A file that cannot be read is an
    error for DSpark (or when ``governor`` is None); a ``governor`` that reads no
    calibration (off, fixed, adaptive) goes on without it, the note saying why."""
    p = Path(engines.folder) / CALIBRATION_FILE
    if not p.is_file():
        if p.is_dir():  # (said as "no calibration stored"; calibrate refuses to write over it)
            return None, f"{p} is a folder, not a calibration: DSpark uses the identity map (remove it and run `specrt calibrate`)"
        return None, "no calibration stored: DSpark uses the identity map (run `specrt calibrate`)"
    try:
        modes = read_calibration_file(p, engines.manifest["export"]["digest"])
    except UserError as e:
        if governor is None or is_dspark(governor):
            raise UserError(f"{e}; `specrt calibrate {engines.folder}` writes it again (or delete it: DSpark "
                            "then starts from the identity map)") from None
        return None, f"calibration ignored ({governor} does not read it): {e}"
    if modes is None:
        try:  # (a file without one was said as fitted for other engines, "export digest differs")
            named = isinstance(json.loads(p.read_text(encoding="utf-8")).get("export_digest"), str)
        except (OSError, ValueError, AttributeError, RecursionError):  # (changed since it was read)
            named = True
        if not named:
            return None, f"{p} names no export digest (expected one written by `specrt calibrate`): using the identity map"
        return None, f"{p} was fitted for other engines (export digest differs): using the identity map"
    want = sampling.mode
    if want in modes:
        e = modes[want]
        return e["calibration"], (f"calibration from {p.name} ({e.get('rounds', '?')} rounds, {want})"
                                  + shallower_note(e.get("depth"), getattr(engines, "depths", ()))
                                  + weights_note(e.get("draft_weights"), getattr(engines, "draft_weights", None)))
    near, cal = prior_from(modes, sampling)
    how = "" if sampling.greedy else (f" --temperature {sampling.temperature:g} --top-p {sampling.top_p:g} "
                                      f"--top-k {sampling.top_k}" + (" --reproducible" if sampling.coupled else ""))
    return cal, (f"{p.name} holds no calibration for {want}: the {near} one serves as a prior of "
                 f"at most {PRIOR_ROUNDS} rounds a position, refined online (fit one with `specrt calibrate "
                 f"{engines.folder} --prompts FILE{how}`)")


AUTO_TREE = "dspark:tree=3:ngram"  # what ``auto`` is where the engines verify token trees


def resolve_spec(spec: str, engines) -> str:
    """``auto`` -> the governor it stands for on ``engines`` (module doc); others unchanged.
    dspark:tree=3 (sizing its tree each round) measured 1.44x ``off`` and 1.42x
    onnxruntime-genai greedy, 1.32x ``off`` sampled, on SmolLM2 + the committed draft,
    against 1.35x, 1.33x and 1.23x for dspark's chains (README, token trees); with prompt
    lookup (``:ngram``) 1.43x against 1.32x ``off`` on 40 held-out prompts on a slower
    host, 1.28x against 1.22x sampled on 20 (README, prompt lookup); with corpus lookup
    (``:corpus``) 1.52x against 1.44x ``off`` on those 40 (README, corpus lookup); with
    session growth (``:grow``) +0.5-2% on 40 distinct prompts, 2.2x on prompts repeated
    (README, session growth)."""
    if split_lookup(spec)[0] != "auto":
        return spec
    # prompt lookup and session growth are part of auto (``auto:ngram``, ``auto:grow`` say
    # no more than ``auto``), and so is corpus lookup where the engines have a corpus
    # (``specrt corpus``; ``auto:corpus`` asks for it, an error without one)
    folder = getattr(engines, "folder", None)
    has_corpus = folder is not None and (Path(folder) / CORPUS_FILE).is_file()
    cap = grow_tokens(spec)  # auto:grow=N keeps its cap (a bad N named as the user wrote it)
    grow = f":grow={cap}" if cap is not None and "grow=" in str(spec).lower() else ":grow"
    chain = lookup_chain(spec)  # auto:ngram=L keeps its chain length (it ran as a bare :ngram)
    ngram = f":ngram={chain}" if chain is not None else ":ngram"
    extra = (":corpus" if wants_corpus(spec) or has_corpus else "") + grow
    if engines.export.get("draft") is None:
        return "off" + ngram + extra
    trees = getattr(engines, "verifies_trees", lambda: False)()
    return (AUTO_TREE.removesuffix(":ngram") if trees else "dspark") + ngram + extra


def make_governor(spec: str, engines, calibration: Calibration | None = None, **options) -> Governor:
    """``governor.from_spec`` (``auto`` resolved first) with DSpark's costs read from the
    engines' cost table. With a token tree (``:tree=W``) DSpark verifies 0..W-1 runners-up
    a round, costing d drafts and n runners-up as verify.{d + n} where that depth is built,
    and past the deepest one as the prefill engine's chain of d + n (the table's chains).
    DSpark refines its calibration online on a copy of ``calibration``: governors made
    from one session's calibration (``specrt bench``'s configurations in one worker,
    ``Session.new_governor``) each start from the stored one and learn apart.
    ``options``: more DSparkGovernor keyword arguments (DSpark only; tools/exp_dspark_ab.py)."""
    spec = resolve_spec(spec, engines)
    if not is_dspark(spec):
        return from_spec(spec, engines.depths, options=options)
    draft = engines.draft_costs(COST_PAST) if hasattr(engines, "draft_costs") else engines.cost("draft", COST_PAST)
    chain = engines.chain_costs(COST_PAST) if hasattr(engines, "chain_costs") else None
    return from_spec(spec, engines.depths, t_draft=draft, t_verify=engines.target_costs(COST_PAST),
                     calibration=calibration.copy() if calibration is not None else None, options=options,
                     t_chain=chain)


def check_flag(name: str, value) -> None:
    """UserError unless ``value`` is a bool (a caller's "no" or "false" is true to Python)."""
    if not isinstance(value, (bool, np.bool_)):
        raise UserError(f"{name}={value!r:.80}: expected True or False")


class Session:
    """The speculative decoder over the engines folder ``engines_dir`` (what ``specrt build``
    wrote; an export folder is refused, naming the build that makes engines from it).

    ``governor``: ``auto`` (the default), ``off``, ``fixed:K``, ``adaptive`` or ``dspark``,
    with ``:tree=W``, ``:ngram``, ``:corpus``, ``:grow`` (module doc); ``governor_spec`` holds
    the one that runs. ``sampling``: a SamplingParams (default greedy). ``ort_overrides``:
    ONNX Runtime settings laid over the engines.json ones (its 'onnxruntime' fields).
    ``reuse_prefix``: a prompt starting as the last stream's did reuses its KV rows.
    ``prefix_snapshots``: how many other conversations' rows are kept aside (0: none).
    ``chat_template_kwargs``: variables every chat prompt's template gets (a dict, or a JSON
    object as text), a stream's own laid over them.

    Close it (``close()``, or ``with Session(...) as s``) to release the engines' sessions;
    it holds them, so it is not pickled or copied: open one in each process."""

    def __init__(self, engines_dir: str | Path, governor: str = "auto", sampling: SamplingParams = SamplingParams(),
                 ort_overrides: dict | None = None, reuse_prefix: bool = True, prefix_snapshots: int = 0,
                 chat_template_kwargs: dict | None = None):
        from specrt.engines.engine_set import load_engines

        check_path_args("a folder", engines_dir=engines_dir)  # Path('') is the working folder
        if not isinstance(sampling, SamplingParams):
            raise UserError(f"sampling={sampling!r:.80}: expected a SamplingParams "
                            "(specrt.runtime.sampling.SamplingParams(temperature=..., top_p=..., ...))")
        if isinstance(prefix_snapshots, bool) or not isinstance(prefix_snapshots, (int, np.integer)) \
                or prefix_snapshots < 0:
            raise UserError(f"prefix_snapshots={prefix_snapshots!r:.80}: expected an integer >= 0 (0: none)")
        check_flag("reuse_prefix", reuse_prefix)
        self.engines = load_engines(Path(engines_dir), ort_overrides=ort_overrides)
        asked = governor
        governor = resolve_spec(governor, self.engines)  # the governor that runs: ``governor_spec``
        if self.engines.export.get("draft") is None and split_lookup(governor)[0] != "off":
            raise UserError(f"{engines_dir}: the engines have no draft; only the governor off can run (alone or "
                            f"with prompt lookup: off:ngram, :corpus, :grow; `auto` picks them), not '{asked}'")
        # Token-id callers (tests, benchmarks) need no tokenizer; text prompts do.
        self.text = Text(self.engines.export_dir) if (self.engines.export_dir / "tokenizer.json").is_file() else None
        if self.text is not None:
            self.text.context = self.engines.max_context  # (a prompt past it is not kept by ids_of)
        # variables every chat prompt's template gets (e.g. {"enable_thinking": False}); a
        # stream's own are laid over them
        self.chat_template_kwargs = template_kwargs_of(chat_template_kwargs, "chat_template_kwargs")
        self.closed = False
        self._grammars: dict[str, Grammar] = {}  # grammar_of's, by Constraint.key, the newest last
        self._grammar_lock = threading.Lock()
        self._growth_read = None  # (path, _file_stamp) of the growth file as load_growth read it
        # how errors name the switch that asks for the chat template: the API's argument; a
        # front end sets its own (`specrt run`: --chat)
        self.chat_option = "chat=True"
        self.calibration, self.calibration_note = load_calibration(self.engines, sampling, governor)
        self.sampling = sampling
        self.d2t = read_d2t(self.engines.export_dir, self.engines.export)
        self.eos = tuple(self.engines.export["target"]["eos_token_ids"])
        self.acceptance = self._acceptance_receipt()
        self.engines.activate()
        try:
            self.generator = Generator(self.engines, make_governor(governor, self.engines, self.calibration), sampling,
                                       self.d2t)
            self.generator.reuse_prefix = reuse_prefix  # a prompt starting as the last did reuses its KV rows
            # other conversations' rows kept aside (Generator.prefix_snapshots): interleaved
            # conversations each keep their prefix, at a copy of its rows apiece
            self.generator.prefix_snapshots = int(prefix_snapshots)
            self.generator.resolve_tree_width()  # a token tree these engines or this mode cannot run: now
            if wants_corpus(governor):  # the corpus file read now, not at the first prompt
                try:
                    self.generator._load_corpus()
                except UserError as e:
                    if wants_corpus(asked):  # asked for by name: an error
                        raise
                    # the corpus ``auto`` found in the folder is stale or broken: left out, as a
                    # calibration for other engines is, and said
                    governor = governor.replace(":corpus", "")
                    self.generator.governor = make_governor(governor, self.engines, self.calibration)
                    self.calibration_note += f"; corpus lookup left out: {e}"
            self.engines.check_unchanged()  # (every file read now: the tokenizer, calibration, corpus)
        except BaseException:  # (a MemoryError making the caches, Ctrl-C: the engines released all the same)
            self.engines.deactivate()
            raise
        self.governor_spec = governor  # the governor that runs (``auto`` resolved; a broken corpus left out)

    def _acceptance_receipt(self) -> dict | None:
        p = Path(self.engines.folder) / ACCEPTANCE_FILE
        if not p.is_file():
            return None
        try:
            a = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as e:  # (ValueError: not UTF-8, not JSON, past the digit limit)
            raise UserError(f"{p}: cannot read the acceptance receipt ({json_problem(e)}); `specrt canary {self.engines.folder}` "
                            "writes it again") from None
        again = f"`specrt canary {self.engines.folder}` writes it again"
        if not isinstance(a, dict):
            raise UserError(f"{p}: expected a JSON object (the acceptance receipt); {again}")
        if a.get("binding_receipt_id") != self.engines.export.get("binding_receipt", {}).get("receipt_id"):
            raise UserError(f"{p}: measured for other weights (binding receipt {str(a.get('binding_receipt_id'))[:12]}, "
                            f"not these engines' export's); {again}")
        # (receipts written before session 72 name no engine files: taken as before)
        if "engine_files" in a and a["engine_files"] != engine_files(self.engines.manifest):
            raise UserError(f"{p}: measured on other engines of this export (their files' hashes are not those "
                            f"{self.engines.folder}/engines.json records: another build, e.g. other --draft-weights, "
                            f"or the receipt copied across); {again}")
        if not isinstance(a.get("trusted"), bool) or (not a["trusted"] and not all(
                isinstance(a.get(k), (int, float)) and not isinstance(a.get(k), bool)
                for k in ("measured_depth1", "training_depth1"))):
            raise UserError(f"{p}: 'trusted' must be true or false, and an untrusted receipt needs numbers "
                            f"'measured_depth1' and 'training_depth1'; {again}")
        return a

    @property
    def _speculates(self) -> bool:
        """Whether the governor drafts (not ``off``, with or without lookup)."""
        return split_lookup(self.governor_spec)[0] != "off"

    @property
    def untrusted(self) -> str | None:
        """A loud warning when the acceptance canary found the draft far below its training accuracy."""
        a = self.acceptance
        if a is not None and not a.get("trusted", True):
            from specrt.runtime.canary import lora_cause

            lora = lora_cause(self.engines.export)
            return (f"UNTRUSTED DRAFT: measured depth-1 acceptance {a['measured_depth1']:.2f} is far below the "
                    f"training receipt's {a['training_depth1']:.2f} (binding receipt {a['binding_receipt_id'][:12]}): "
                    + (f"{lora}; else a weight is bound to the wrong slot" if lora else
                       "a weight is probably bound to the wrong slot"))
        return None

    @property
    def low_acceptance(self) -> str | None:
        """A note when the canary, with no training receipt to compare with, measured a depth-1
        acceptance below what a trained draft reaches (runtime/canary.py LOW_WITHOUT_RECEIPT)."""
        a = self.acceptance
        if a is not None and a.get("trusted", True) and a.get("low_without_receipt") \
                and isinstance(a.get("measured_depth1"), (int, float)) and self._speculates:
            return (f"the acceptance canary measured depth-1 acceptance {a['measured_depth1']:.2f} on "
                    f"{self.engines.folder} with no training receipt to compare with: "
                    "see its acceptance_receipt.json note")
        return None

    @property
    def unread_template_kwargs(self) -> str | None:
        """A note when the session's chat template variables name one its chat template never
        reads (a misspelt enable_thinking changed nothing, unsaid: a walk, w73d)."""
        return self.text.unread_note(self.chat_template_kwargs) if self.text is not None else None

    @property
    def busy_costs(self) -> str | None:
        """A note when the governor prices its rounds from a cost table profiled on a busy
        machine (its ``cpu_share`` below BUSY_CPU_SHARE: every cost inflated, which misled
        DSpark for longer than a bench runs; the build said so once, and nothing re-profiles
        by itself)."""
        base, lookup = split_lookup(self.governor_spec)
        share = busy_share(self.engines.manifest.get("costs"))
        if share is None or not (lookup or is_dspark(base)):
            return None
        return busy_note(self.engines.folder, share, f"governor '{self.governor_spec}' prices its rounds")

    @property
    def unchecked(self) -> str | None:
        """A note when the draft speculates on engines with no acceptance receipt (built with
        --no-canary, or the receipt removed): nothing has checked its binding on them."""
        if self.engines.export.get("draft") is None or not self._speculates:
            return None
        if self.acceptance is None:
            return (f"no acceptance receipt in {self.engines.folder}: nothing has checked the draft's binding "
                    f"on these engines (built with --no-canary, or the build's canary failed?); "
                    f"`specrt canary {self.engines.folder}` checks it")
        if self.acceptance.get("inconclusive") is True:
            return (f"the acceptance canary of {self.engines.folder} was inconclusive ({self.acceptance.get('drafts')} "
                    "drafts; its acceptance_receipt.json note says why): nothing has checked the draft's binding on "
                    "these engines")
        return None

    def close(self) -> None:
        """Release the engines' sessions; a stream read after it raises UserError (stats()
        still describes the last stream). Closing twice does nothing more."""
        # said at once: a stream in another thread stops before its next round (set under the
        # lock, a stream taking its next round first could run on to its end)
        self.closed = True
        with self.generator.lock:  # a round in progress in another thread finishes first
            self.engines.deactivate()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce_ex__(self, protocol):
        # (pickle's own refusal named an ONNX Runtime InferenceSession; copy.copy made a second
        # Session over the same engines and caches, closed with the first)
        raise UserError("a Session cannot be pickled or copied (it holds the engines' ONNX Runtime sessions and "
                        "KV caches): open Session(ENGINES) in each process")

    def new_governor(self) -> None:
        """A fresh governor state (e.g. between benchmark runs)."""
        self._open()  # (after close() it made a governor no stream could use)
        self.generator.governor = make_governor(self.governor_spec, self.engines, self.calibration)

    def _growth_policy(self, path: Path):
        policy = self.generator.resolve_lookup()
        if policy is None or policy.growth is None:
            raise UserError(f"{path}: governor '{self.governor_spec}' has no session growth (add :grow, "
                            "or use auto)")
        return policy

    def load_growth(self, path: str | Path) -> int:
        """Session growth (``:grow``) from a file that save_growth wrote (``specrt run
        --grow-file``): the governor's grown table starts from its sequences (the newest
        within the governor's cap). Returns how many it holds: 0 when there is no such file
        yet (an error, as for save_growth, when the governor has no ``:grow``)."""
        check_path_args("a file", path=path)
        self._open()  # (after close() it loaded sequences no stream could use)
        policy = self._growth_policy(Path(path))
        self._growth_read = Path(path).resolve(), _file_stamp(Path(path))
        if not Path(path).exists():
            return 0
        try:
            policy.growth = Growth.load(Path(path), self.generator.vocab, self.engines.manifest["export"]["digest"],
                                        max_tokens=policy.growth.max_tokens)
        except UserError:  # none of its sequences held: save_growth reads it again, refused as here (a caller
            # going on after this refusal had its save write over the file: session 70's growth API note)
            self._growth_read = Path(path).resolve(), None
            raise
        for key, (w, t) in policy.growth.rates.items():  # where the last run's rounds left them
            policy.wins[key], policy.tries[key] = list(w), list(t)
        return len(policy.growth.seqs)

    def save_growth(self, path: str | Path) -> None:
        """The governor's grown sequences to ``path`` (atomically; corpus.Growth.save)."""
        check_path_args("a file", path=path)
        self._open()  # (after close(): a closed Session saves nothing, as it streams nothing)
        policy = self._growth_policy(Path(path))
        grown, digest = policy.growth.source_priors(), self.engines.manifest["export"]["digest"]
        # read again and written under a lock on its folder: another run with the same file
        # (cron jobs, CI runners) wrote it since this one loaded it, and the last to write lost the
        # other's answers without a word; now its sequences stay, this session's added after them
        # (the learnt rates are this session's: it started from the same file's); under the streams'
        # lock too: a stream of another thread ending meanwhile added its answer to the Growth
        # replaced, or after the write, as if saved (added = 0): lost from the file and the session
        real = Path(path).resolve()  # (the folder the file is in is locked: through a symlink, another was)
        with folder_lock(real.parent), self.generator.lock:
            now = _file_stamp(Path(path))
            if self._growth_read is not None and self._growth_read[0] == real \
                    and now not in (None, self._growth_read[1]):
                merged = Growth.load(Path(path), self.generator.vocab, digest, max_tokens=policy.growth.max_tokens)
                for seq in policy.growth.own():
                    merged.add(seq)
                policy.growth = merged
            try:
                policy.growth.save(Path(path), digest, {k: (policy.wins[k], policy.tries[k]) for k in grown
                                                        if k in policy.wins})
            finally:  # replaced (by this write alone: the lock) is saved, though a Ctrl-C landed just after; unsaid,
                # the write again (run's, once) took the file for another run's: each sequence merged in twice
                if _file_stamp(Path(path)) != now:
                    policy.growth.added = 0
                    self._growth_read = real, _file_stamp(Path(path))

    def need_text(self, what: str = "text prompts need the target's tokenizer") -> None:
        """UserError saying ``what`` needs the tokenizer where the export has none, and how to add it."""
        if self.text is None:
            raise UserError(f"{self.engines.export_dir}: no tokenizer.json; {what}: put its tokenizer.json in the "
                            "target's folder, then `specrt export` and `specrt build` again")

    def encode(self, prompt: str | list[dict], chat: bool = False, chat_template_kwargs: dict | None = None,
               check_length=None, tools: list[dict] | None = None) -> list[int]:
        """A text prompt's or a conversation's token ids as ``stream`` makes them;
        ``check_length`` as ``Text.encode``'s (a refusal before tokenizing); ``tools``: function
        definitions for the chat template (``Text.render_chat``; `specrt serve` passes a request's)."""
        variables = self._template_kwargs(prompt, chat, chat_template_kwargs)  # (first: no tokenizer said)
        return self.text.encode(prompt, chat, variables, self.chat_option, check_length, tools)

    def prompt_text(self, prompt: str | list[dict], chat: bool = False) -> str:
        """The text ``encode`` tokenizes (``Text.prompt_text``: the chat template rendered, with
        the session's variables, where the prompt goes through it): ``Text.least_tokens`` and
        ``Text.ids_of`` take it, one render for both."""
        variables = self._template_kwargs(prompt, chat, None)
        return self.text.prompt_text(prompt, chat, variables, self.chat_option)

    def _template_kwargs(self, prompt, chat: bool, chat_template_kwargs: dict | None) -> dict:
        self.need_text()
        own = template_kwargs_of(chat_template_kwargs, "chat_template_kwargs")
        if isinstance(prompt, str) and not chat:
            self._untemplated(own, "a text prompt without chat=True")
        return {**self.chat_template_kwargs, **own}

    @staticmethod
    def _untemplated(own: dict, prompt: str) -> None:
        """UserError where a call's own template variables were given for ``prompt``, which no
        template renders (they were dropped without a word; the session's own go to every chat
        prompt, and a raw one leaves them out)."""
        if own:
            raise UserError(f"chat_template_kwargs={own!r:.80}: {prompt} goes through no chat template (chat=True "
                            "renders text through it; a conversation always goes through it)")

    def check_prompt(self, prompt: str | list[dict] | list[int], chat: bool = False, max_new_tokens: int = 128,
                     chat_template_kwargs: dict | None = None) -> list[int]:
        """``prompt``'s token ids, refused (UserError) where ``stream`` would refuse it before
        decoding: empty, past the engines' context limit, an id outside the vocabulary, a bad
        ``max_new_tokens``. Nothing runs: `specrt run --prompts` checks every line first (a
        prompt too long on line 40 cost the 39 answers before it, and their --stats)."""
        check_flag("chat", chat)
        ids = self._prompt_ids(prompt, chat, chat_template_kwargs, max_new_tokens, None)
        self.generator.check_args(ids, max_new_tokens, self.eos, None, None)
        return ids

    def _prompt_ids(self, prompt, chat: bool, chat_template_kwargs: dict | None, max_new_tokens,
                    prompt_logprobs) -> list[int]:
        """Token ids as given (a list, tuple or numpy array of ints, Python's or numpy's),
        checked against the vocabulary, or a text prompt's or a conversation's through ``encode``;
        refused first where surely past the context with ``max_new_tokens`` (ids by their count,
        text by ``Text.least_tokens``: 1.2M ids took 46 s of checks to be refused, a 5 MB text a
        minute of tokenizing)."""
        def check_length(n: int, least: bool = False) -> None:
            self.generator.check_length(n, max_new_tokens, prompt_logprobs, least)

        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        if isinstance(prompt, tuple):  # (a conversation as a tuple of messages too, as before session 52)
            prompt = list(prompt)
        self.generator.check_count(prompt, max_new_tokens, prompt_logprobs)  # (ids: before each is read)
        if isinstance(prompt, list):  # ([]: "the prompt is empty")
            ids = [as_whole(t) for t in prompt]
            if None not in ids:  # (before anything decodes them: the tokenizer overflows on -2)
                own = template_kwargs_of(chat_template_kwargs, "chat_template_kwargs")
                self._untemplated(own, "a prompt of token ids")
                return self.generator.check_ids(ids)
        elif not isinstance(prompt, str):  # (None said "the prompt is empty"; a number, a dict a TypeError)
            raise UserError(f"prompt {prompt!r:.60}: expected text, a conversation (a list of messages) or token "
                            "ids (a list of integers)")
        return self.encode(prompt, chat, chat_template_kwargs, check_length)

    def _open(self) -> None:
        if self.closed:
            raise UserError("this Session is closed (its engines' sessions are released): open a new one")

    def grammar_of(self, constraint: Constraint | None) -> Grammar | None:
        """``constraint`` compiled for these engines' tokenizer (grammar.py), the last few kept
        (a server's clients send the same schema again: compiling one costs milliseconds)."""
        if constraint is None:
            return None
        if not isinstance(constraint, Constraint):
            return compile_constraint(constraint, self.text, self.generator.vocab, self.eos)  # (refused there)
        key = constraint.key()
        with self._grammar_lock:  # (serve's request threads compile before they wait for the engines)
            got = self._grammars.pop(key, None) or compile_constraint(constraint, self.text, self.generator.vocab,
                                                                      self.eos)
            self._grammars[key] = got  # the newest last; the oldest past GRAMMARS_KEPT go
            while len(self._grammars) > GRAMMARS_KEPT:
                del self._grammars[next(iter(self._grammars))]
        return got

    def prediction_ids(self, prediction: str | list[int] | None) -> list[int] | None:
        """A predicted output (``stream``'s ``prediction``) as token ids: text tokenized as an
        answer's text is (no special tokens added), ids as given (the generator checks them)."""
        if not isinstance(prediction, str):
            return prediction
        self.need_text("a prediction given as text needs the target's tokenizer (give token ids)")
        # (encode_batch lets the interpreter's lock go, as Text.ids_of's; the same ids)
        return self.text.tokenizer.encode_batch([prediction], add_special_tokens=False)[0].ids

    def stream_ids(self, ids: list[int], max_new_tokens: int, logprobs: int | None = None,
                   prompt_logprobs: int | None = None, grammar: Constraint | None = None,
                   prediction: str | list[int] | None = None) -> Stream:
        """``stream`` in token ids: ``ids`` a list, tuple or numpy array of ints (no template,
        no tokenizer needed), each chunk yielded a list of the ids a round accepted; no stop
        strings (``max_new_tokens``, the engines' EOS or their context end it). ``logprobs`` and
        ``prompt_logprobs`` as ``stream``'s, read from ``stats()``. The arguments are checked
        when called, and the call supersedes an unfinished stream at once (``stream`` does at
        its first piece); the decoding starts when the first chunk is asked for. ``grammar``:
        structured output, as ``stream``'s; ``prediction`` as ``stream``'s."""
        self._open()
        compiled = self.grammar_of(grammar)
        predicted = self.prediction_ids(prediction)
        out: list[int] = []
        # under the lock: another thread's stream would set these between, and stats() there
        # would read this stream's telemetry (Generator.stream resets it) with the older ids
        with self.generator.lock:
            before = self.generator.logprobs, self.generator.prompt_logprobs
            self.generator.logprobs, self.generator.prompt_logprobs = logprobs, prompt_logprobs
            try:
                gen = self.generator.stream(ids, max_new_tokens, self.eos, compiled, predicted)
            except UserError:  # refused: a running stream's stats() stay its own
                self.generator.logprobs, self.generator.prompt_logprobs = before
                if not self.generator.streaming:  # else none: the generator showed no earlier stream's
                    self.last_prompt_ids, self.last_output_ids = [], []
                raise
            # stats() describes this stream (its ids as checked: Python ints)
            self.last_prompt_ids, self.last_output_ids = self.generator.check_ids(ids), out
            self.last_predicted = predicted is not None
        me = gen.clock.claim()  # this layer's caller's holds are left out of the telemetry's seconds
        lock = self.generator.lock

        def chunks():
            try:
                while True:
                    with lock:  # (close() from another thread waits for the round in progress)
                        self._open()  # closed before this chunk: no engines to run it
                        chunk = next(gen, None)
                        out.extend(chunk or ())  # (with the round's telemetry, for stats())
                    if chunk is None:
                        return
                    with gen.clock.at(me):
                        yield chunk
            finally:
                gen.close()  # a caller closing this closes the stream (its telemetry settles)

        return Stream(chunks(), gen.clock)

    def stream(self, prompt: str | list[dict] | list[int], chat: bool = False, max_new_tokens: int = 128,
               stop: tuple[str, ...] = (), logprobs: int | None = None,
               prompt_logprobs: int | None = None, chat_template_kwargs: dict | None = None,
               grammar: Constraint | None = None, keep_special: bool = False,
               prediction: str | list[int] | None = None) -> Iterator[str]:
        """Yield text as tokens are accepted; ``stop`` strings end generation (not included).
        ``keep_special``: decoded with the special tokens ``Text.keep_special`` keeps (serve's
        answers to requests with tools under its mistral tool-call parser).
        ``logprobs`` N: ``stats()['output_logprobs']`` then holds each output token's
        log-probability under the target with its N most likely alternatives
        (``logprob_entries``; the model's own distribution, before temperature, top-k and
        top-p). ``prompt_logprobs`` N: the prompt's tokens' too (``stats()['prompt_logprobs']``,
        the first token's None; the whole prompt is prefilled, and ``max_new_tokens`` may be
        0). ``prompt`` may also be token ids (a list, tuple or numpy array of ints; no template);
        ``stop`` a string, strings, or None (none).
        ``prompt``: text (through the chat template when ``chat``), or a conversation of
        role/content objects (always through it: runtime/text.py), the template given
        ``chat_template_kwargs`` over the session's.
        ``grammar``: a grammar.Constraint (``Constraint.json_schema(schema)``, ``.json()``,
        ``.regex(pattern)``, ``.choice([...])``, ``.lark(text)``) the answer is held to, losslessly
        relative to the target masked by it; it ends where the grammar is complete (finish
        "stop"). Needs llguidance (``pip install 'specrt[structured]'``).
        ``prediction``: a predicted output (OpenAI's Predicted Outputs), text or token ids the
        answer is expected to largely repeat (a file being edited): its tokens are proposed
        beside the draft (runtime/prediction.py), the answer the target's all the same (greedy:
        the same tokens as without it); ``stats()['prediction']`` then counts its
        accepted_prediction_tokens and rejected_prediction_tokens (prediction.usage).
        ``stats()['output_token_ids']`` then end with the token that completed the stop
        string, as transformers' ``stop_strings`` do, and its ``new_tokens`` counts those (a
        verify round may have accepted more: its acceptance counts what the round accepted).
        The EOS that ends an answer is in its ``output_token_ids`` but not in its text, special
        in the tokenizer or not (as vLLM's).
        The arguments are checked here, when
        called (a UserError before anything is read); the decoding starts when the first piece
        is asked for."""
        self._open()
        # (a prompt of token ids too: what it yields is text; it said "text prompts need" to one)
        self.need_text("Session.stream yields text, which needs the target's tokenizer (Session.stream_ids "
                        "takes and yields token ids)")
        check_flag("chat", chat)
        scan = StopScanner(stop)  # checks the stop strings before anything runs
        ids = self._prompt_ids(prompt, chat, chat_template_kwargs, max_new_tokens, prompt_logprobs)
        self.generator.check_args(ids, max_new_tokens, self.eos, logprobs, prompt_logprobs)
        self.grammar_of(grammar)  # (refused now, not at the first piece; kept compiled for it)
        predicted = self.prediction_ids(prediction)
        self.generator.resolve_prediction(predicted)  # (refused now, as the prompt is)
        decoding = self.text.kept if keep_special and self.text.kept is not None else self.text
        return self._texts(ids, scan, max_new_tokens, logprobs, prompt_logprobs, decoding, grammar, predicted)

    def _texts(self, ids: list[int], scan: StopScanner, max_new_tokens: int, logprobs: int | None,
               prompt_logprobs: int | None, decoding, grammar: Constraint | None = None,
               predicted: list[int] | None = None) -> Iterator[str]:
        """``stream``'s pieces of text (its arguments checked), decoded by ``decoding`` (a Text)."""
        detok = Detokenizer(decoding, context_of(decoding, ids))  # the text the answer adds after the prompt's
        lock = self.generator.lock
        with lock:  # (another thread's stream starts before these are set or after them, not between)
            gen = self.stream_ids(ids, max_new_tokens, logprobs, prompt_logprobs, grammar, predicted)
            # stream_ids' list, each round's tokens added with its telemetry (the detokenizer's
            # gets them after the lock is let go); the same tokens as the detokenizer's between pieces
            out = self.last_output_ids
            self.last_context = detok.context  # (the prompt's tokens its text is decoded after)
        held, me = gen.clock, gen.clock.claim()  # detokenizing and stop strings are the runtime's time

        eos = set(self.eos)

        def texts():  # each round's final text, then what an unfinished character held back
            for chunk in gen:
                # the EOS that ended the answer (its chunk's last token) writes no text: an EOS the
                # tokenizer does not mark special decoded into the answer's end (transformers prints it,
                # vLLM does not); stats' output_token_ids and serve's logprobs still list it
                yield detok.push(chunk[:-1] if chunk and chunk[-1] in eos else chunk)
            yield detok.flush()

        try:
            for text in texts():
                piece = scan.push(text)
                if scan.hit:  # settled before the last piece goes out: a caller may stop at it
                    with lock:  # (a stream another thread started since keeps its own finish)
                        gen.close()
                        k = tokens_through(decoding, detok.ids, scan.stop_end, detok.context)
                        del detok.ids[k:], out[k:]
                        if self.last_output_ids is out:
                            self.generator.finished = Finished("stop")
                            # the tokens given, through the stop (a round accepting past it counted them:
                            # new_tokens and tokens/s then grew with the governor's reach)
                            self.generator.telemetry.new_tokens = len(out)
                    if piece:
                        yield piece
                    return
                if piece:
                    with held.at(me):
                        yield piece
        finally:
            gen.close()  # (a caller that stops reading closes the decoding with it)
        rest = scan.flush()
        if rest:
            yield rest

    def stats(self) -> dict:
        """The telemetry, ids and finish of the latest stream started, one stream's whole (a
        stream starting in another thread waits for this, or this for its start)."""
        with self.generator.lock:
            s = self.generator.telemetry.to_json()
            s["prompt_ids"] = list(getattr(self, "last_prompt_ids", []))  # what `specrt corpus` reads back
            s["output_token_ids"] = list(getattr(self, "last_output_ids", []))
            s["finish_reason"] = self.generator.finished.reason if self.generator.finished else None
            if getattr(self, "last_predicted", False):  # (a stream given a predicted output)
                s["prediction"] = prediction_usage(s["lookup"]["by_match"])
            if self.generator.logprobs is not None:
                s["output_logprobs"] = self.logprob_entries(0, len(s["output_token_ids"]))
            if self.generator.prompt_logprobs is not None:
                s["prompt_logprobs"] = self.prompt_logprob_entries()
        return s

    def prompt_logprob_entries(self) -> list[dict]:
        """The last stream's prompt tokens as ``logprob_entries`` gives output tokens
        (``stream(..., prompt_logprobs=N)``), each with its ``rank`` (how many tokens are at least
        as likely: vLLM's); the first token's logprob, top_logprobs and rank None."""
        ids = list(getattr(self, "last_prompt_ids", []))
        out = self.generator.prompt_logprobs_out
        return [{**self._entry(ids[0], None, None), "rank": None}] + [
            {**self._entry(t.id, t.logprob, t.top), "rank": t.rank} for t in out[1:]] if out else []

    def logprob_entries(self, start: int, end: int) -> list[dict]:
        """The last stream's output tokens start..end-1 with their logprobs (``stream(...,
        logprobs=N)``), each {id, token, bytes, logprob, top_logprobs: [{id, token, bytes,
        logprob}]}: token as text (``bytes:\\xNN`` for part of a character), bytes its UTF-8
        bytes as a list (as OpenAI's). Without a tokenizer, ids only."""
        return [self._entry(t.id, t.logprob, t.top) for t in self.generator.output_logprobs[start:end]]

    def _entry(self, i: int, lp: float | None, top) -> dict:
        """{id, token, bytes, logprob, top_logprobs} (top None: no top_logprobs field value)."""
        def one(i: int, lp: float | None) -> dict:
            e: dict = {"id": i}
            if self.text is not None:
                e["token"], e["bytes"] = self.text.token_text(i), list(self.text.token_bytes(i))
            e["logprob"] = lp
            return e

        return {**one(i, lp), "top_logprobs": None if top is None else [one(j, x) for j, x in top]}
