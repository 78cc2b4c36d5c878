"""The draft / verify loop (batch 1). Rules in DESIGN.md §3-§4; KV contract in contracts.py.

Invariants between rounds, with x the token sequence so far (prompt + emitted):

    target KV holds positions [0, n)      n = len(x) - 1: x[-1] is emitted but not yet fed
    draft KV holds real slots  [0, m)     m = n after every draft pass
    pending real slots         [m, n)     slot t carries token x[t+1] and the target's aux h_t

A round: (1) the draft consumes the pending real slots and proposes K tokens (P-EAGLE:
one pass with K-1 mask slots; EAGLE-3: K sequential steps whose speculative rows are
rolled back); (2) the governor picks the verify depth d <= K; (3) the target scores
[x[-1], d_1 .. d_d] at positions n .. n+d; (4) the verify rule accepts a drafts and
emits a + 1 tokens; the target commits a + 1 KV rows and those rows become the next
pending slots. Rejected rows are never committed, so rollback costs nothing. With prompt
lookup (``:ngram``, ngram.py) a round may instead verify the tokens that followed an
earlier occurrence of x's last n-gram: no draft pass, one-hot proposals; the draft
consumes those rows as pending slots at its next pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from specrt import contracts as C
from specrt.errors import EngineFailure, InternalError, NonFiniteOutput, UserError
from specrt.prompt_files import common_prefix

from .governor import COST_PAST, GovernorState
from .kvcache import KVCache
from .corpus import FILE as CORPUS_FILE
from .corpus import GROW_TOKENS, Corpus, Growth
from .ngram import NgramIndex, NgramPolicy
from .prediction import Prediction
from .sampling import CoupledNoise, SamplingParams, TokenLogprob, check_logits, make_rng, probs, sample, token_logprobs
from .telemetry import RoundResult, Telemetry
from .verify import LazyRows, Verdict, one_hot, scatter_draft_probs, verify_coupled, verify_greedy, verify_sampling

# The most pending rows one draft pass takes in (Generator._catch_up): a prompt's are
# taken in passes of this many, which bounds the draft attention's temporaries.
DRAFT_CHUNK = 256
# The most prompt rows one target call takes in (the prefill runs in passes of this many).
PREFILL_CHUNK = 256


def _passes(start: int, end: int, most: int) -> list[tuple[int, int]]:
    """[start, end) as consecutive (a, b) passes of at most ``most`` rows, none of one row
    unless the whole is one row."""
    out, at = [], start
    while at < end:
        b = min(at + most, end)
        if end - b == 1 and b - at > 2:  # keep a one-row remainder from the last pass
            b -= 1
        out.append((at, b))
        at = b
    return out


class Runner(Protocol):
    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class Engines(Protocol):
    """What the loop needs of an engine set (engines/ provides it; tests may adapt sessions)."""

    export: dict  # the export manifest (export.json)
    max_context: int  # positions the KV caches hold

    def target(self, new_tokens: int) -> Runner: ...  # a runner specialised for S = new_tokens if built

    def draft(self) -> Runner | None: ...

    # optional: def kv_layout(self, graph: str) -> str  ("append" when absent)


SET_ASIDE_ROWS = 32  # prefix snapshots: live rows a prompt would overwrite before they are kept


def _reusable_rows(common: int, cached: int, prompt_len: int) -> int:
    """The target rows a prompt may reuse of a token list it shares ``common`` leading
    tokens with and whose first ``cached`` rows are in a cache: at most those, and at
    least two of the prompt's rows left to compute (Generator._reusable)."""
    return max(0, min(common, prompt_len - 2, cached))


def _first_rows(chunks: list[np.ndarray], n: int) -> np.ndarray:
    """The first ``n`` rows of aux chunks that cover a token list in order (a view when
    one chunk holds them)."""
    rows, got = [], 0
    for a in chunks:
        rows.append(a[: n - got])
        got += len(rows[-1])
        if got == n:
            break
    if got != n:
        raise InternalError(f"prefix reuse: aux rows for {got} of {n} reused rows")
    return rows[0] if len(rows) == 1 else np.concatenate(rows)


@dataclass
class Snapshot:
    """A conversation's rows set aside (Generator.prefix_snapshots): the tokens of its
    committed target rows, their aux hidden rows, and copies of the target's and the
    draft's KV rows (KVCache.save_rows)."""

    ids: list[int]
    aux: np.ndarray
    target_rows: tuple
    draft_rows: tuple | None
    owner: str | None = None  # the stream's Generator.owner


@dataclass
class Finished:
    # "eos" | "length" | "context" | "stop" | "interrupted" (closed by its caller first) | "error" (ended
    # by an error it raised: a grammar no token can continue, an engine failure; vLLM's FinishReason.ERROR)
    reason: str


def as_whole(value) -> int | None:
    """``value`` as a Python int where it is an integer, a Python or a numpy one (not a
    bool), else None: what the Python API takes where it asks for an integer (ids that came
    through numpy)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def _alternatives(name: str, v) -> int | None:
    """A logprobs setting (Generator.logprobs / prompt_logprobs): None (off) or the
    alternatives a token, an integer >= 0."""
    n = as_whole(v)
    if v is not None and (n is None or n < 0):
        raise UserError(f"{name}={v!r}: expected None or an integer >= 0 (alternatives a token)")
    return n


def _softmax_max(logits: np.ndarray) -> np.ndarray:
    """Per row, the probability of the most likely token: the draft's confidence [K].
    (~40 us a row of 49152 here, nearly all of it exp; one temporary, exp in place.) Rows
    with NaN or +inf raise, as the target's do (greedy decoding under a fixed depth went on
    with garbage drafts, tau 1, and numpy's RuntimeWarning, where DSpark and sampling raised)."""
    x = np.asarray(logits, np.float32)
    e = x - check_logits(x, "draft")[..., None]
    np.exp(e, out=e)
    return 1.0 / e.sum(-1)


class Held:
    """The seconds a stream's consumer held it between chunks (a terminal printing, a
    client's socket): left out of the stream's telemetry ``seconds``, which are the
    runtime's. The outermost layer times its own consumer: a layer that wraps a stream
    (Session.stream_ids, Session.stream) claims the clock, and the yields of the layers
    inside it (whose consumer is that layer, its time the runtime's) stop counting."""

    def __init__(self):
        self.seconds = 0.0
        self._owner: object = None

    def claim(self) -> object:
        self._owner = me = object()
        return me

    def at(self, me: object) -> "_Hold":
        """``with clock.at(me): yield chunk``: the yield's time counts if ``me`` holds the clock."""
        return _Hold(self, me)


class _Hold:
    __slots__ = ("clock", "me", "t")

    def __init__(self, clock: Held, me: object):
        self.clock, self.me = clock, me

    def __enter__(self):
        self.t = time.perf_counter()

    def __exit__(self, *exc):  # a consumer closing the stream at the yield held it until then
        if self.clock._owner is self.me:
            self.clock.seconds += time.perf_counter() - self.t
        return False


class Stream:
    """An iterator of chunks with the clock of its consumer's holds (``Held``); with a
    ``lock`` (its Generator's) each chunk is made, and the stream closed, holding it."""

    def __init__(self, chunks: Iterator, clock: Held, lock=None, unstarted_close=None):
        self._chunks, self.clock = chunks, clock
        self._lock = lock if lock is not None else contextlib.nullcontext()
        # called when the stream is closed before its first chunk was asked for (closing a
        # generator that never started runs none of its body: its finish was never said)
        self._unstarted_close = unstarted_close

    def __iter__(self) -> "Stream":
        return self

    def __next__(self):
        with self._lock:
            return next(self._chunks)

    def close(self) -> None:
        with self._lock:
            unstarted = inspect.isgenerator(self._chunks) and \
                inspect.getgeneratorstate(self._chunks) == inspect.GEN_CREATED
            self._chunks.close()
            if unstarted and self._unstarted_close is not None:
                self._unstarted_close()


class Generator:
    """Speculative generation over one engine set. ``stream`` yields lists of new token ids."""

    def __init__(self, engines: Engines, governor, params: SamplingParams = SamplingParams(),
                 d2t: np.ndarray | None = None):
        self.e = engines
        self.governor = governor
        self.params = params
        m = engines.export
        t, d = m["target"], m.get("draft")
        dtype = np.float16 if m["dtype"] == "float16" else np.float32
        self.vocab = t["vocab_size"]
        layout = engines.kv_layout("target") if hasattr(engines, "kv_layout") else "append"
        self.tkv = KVCache(t["num_layers"], t["num_kv_heads"], t["head_dim"], engines.max_context, dtype, layout)
        self.draft_kind = d["kind"] if d else None
        self.dkv = KVCache(d["num_layers"], d["num_kv_heads"], d["head_dim"], engines.max_context + 16, dtype) if d else None
        self.mask_id = d["mask_token_id"] if d else None
        # a DSpark confidence head: each draft position's confidence is its predicted acceptance
        # (draft_confidence) instead of the draft's probability of its own token
        self.confidence_head = bool(d and d.get("confidence_head"))
        # Prefix reuse (stream, _reusable): the tokens of the target's committed KV rows
        # (the last stream's prompt, then its rounds') and their aux hidden rows [*, 3H] in
        # chunks, kept from the end of its prefill; the rows stay in the caches until
        # overwritten
        self.reuse_prefix = True
        self._prefix: tuple[list[int], list[np.ndarray]] | None = None
        # Up to this many other conversations' rows kept as snapshots (0: none; `specrt
        # serve` keeps 4): a prompt that shares more with one of them than with the live
        # caches swaps it in (the live rows set aside in its place), so clients taking
        # turns keep their prefixes. Each costs a copy of its rows (~46 KB a row on
        # SmolLM2) when set aside.
        self.prefix_snapshots = 0
        self._snapshots: list[Snapshot] = []
        # Whose rows these are: a stream reuses (and swaps in) only rows its own owner's
        # streams left, so that clients of one server who must not learn of each other's
        # text cannot, from what or how fast reuse saves (`specrt serve --isolate-clients`:
        # the request's ``user``). None: everyone's, as one client's.
        self.owner: str | None = None
        self._noise: CoupledNoise | None = None  # a stream's, under coupled sampling
        self._draft_pos = 0  # the output position a stream's next draft pass proposes first
        self._prefix_owner: str | None = None
        self.hidden = d["hidden_size"] if d else 0
        self.aux_width = len(t["aux_layer_ids"]) * t["hidden_size"]
        self.dtype = dtype
        self.d2t = d2t
        # each draft id's target id (d2t: target = draft + d2t[draft]); None: the same vocabulary
        self._draft_to_target = None if d2t is None else np.arange(len(d2t)) + d2t
        self._outside_vocab = None  # [V] bool: target ids the draft cannot propose (a reduced vocabulary)
        if self._draft_to_target is not None:
            self._outside_vocab = np.ones(self.vocab, bool)
            self._outside_vocab[self._draft_to_target] = False
        self.telemetry = Telemetry()
        self.finished: Finished | None = None
        self._epoch = 0  # streams started: a stream goes on only while it is the latest (stream)
        # held while a stream makes a chunk and while one starts: streams of one Generator driven
        # from two threads take turns, a round at a time, and the older is superseded between its
        # rounds (its round's rows committed into the newer's caches before: a wrong answer)
        self.lock = threading.RLock()
        self._live: int | None = None  # the latest stream's epoch until it finishes (made, not yet finished)
        # logprobs (None: off): each emitted token's log-probability under the target with
        # this many alternatives (sampling.token_logprobs), in ``output_logprobs`` as the
        # stream yields (its tokens, trimmed as they are). A screened head then gives its
        # fp32 rows (head_exact) at every call; its argmax stays the screen's.
        self.logprobs: int | None = None
        self.output_logprobs: list[TokenLogprob] = []
        # prompt_logprobs (None: off): the prompt's tokens' too, from its prefill's rows, in
        # ``prompt_logprobs_out`` (the first token has none); such a stream prefills the whole
        # prompt (no prefix reuse: reused rows have no logits) and may ask for 0 new tokens
        # (a prompt scored only, as `echo` with `max_tokens` 0 does)
        self.prompt_logprobs: int | None = None
        self.prompt_logprobs_out: list[TokenLogprob | None] = []
        self.tree_width = 1  # the governor's (``tree_width``), read at every stream
        self._siblings: list[int] = []  # the last draft's runners-up for its first position
        self._sib_allowed: np.ndarray | None = None  # a guided round's: the tokens its first position allows
        self._corpus: tuple[tuple, Corpus] | None = None  # the loaded corpus file, by (path, mtime, size)
        # a screened target head (specrt/head.py): greedy decoding screens its int8 logits for
        # the exact argmax; sampling and the prefill (its many rows' int8 temporaries would
        # cost more memory than they save time) ask for the fp32 head's logits (head_exact)
        self._head = getattr(engines, "head", None)
        self._screen_for(params)
        # engines whose target takes logits_from (contracts.py "Logits of the last rows only"):
        # 0 at every call but a prefill on the dynamic-length runner, which asks for its last row
        self._from0 = ({C.LOGITS_FROM: np.array(0, np.int64)}
                       if any(t.name == C.LOGITS_FROM for t in getattr(engines.target(1), "inputs", ())) else {})

    def _screen_for(self, params: SamplingParams, guided: bool = False) -> None:
        """The screen and the head_exact feeds for these params: set at every stream, since
        callers change ``params`` between streams (a seed, or greedy to sampled, which must
        not go on screening int8 logits it would sample from). A guided stream (grammar.py)
        takes the fp32 rows: the screen finds the argmax of the whole row, not of the
        grammar's allowed tokens."""
        head = self._head
        self.screen = head if head is not None and params.greedy and not guided else None
        exact = not params.greedy or guided
        self._head_feeds = ({C.HEAD_EXACT: np.array(exact)}, {C.HEAD_EXACT: np.array(True)}) \
            if head is not None else ({}, {})

    def resolve_tree_width(self) -> int:
        """Token trees (contracts.py "Token trees"): a governor with ``tree_width`` W > 1
        (``--governor fixed:2:tree=3``) has the draft's next W - 1 choices for the first
        position verified beside the chain as siblings of a1; when the target picks one of
        them, it and the target's token after it are emitted."""
        w = getattr(self.governor, "tree_width", 1)
        if w > 1:
            if self.dkv is None:
                raise UserError("a token tree needs a draft; these engines have none")
            if not (hasattr(self.e, "verifies_trees") and self.e.verifies_trees()):
                if getattr(self.e, "backend", None) == "onnxruntime" and self.e.kv_layout("target") == "append":
                    # (the build picks the portable layout by itself where in-place KV cannot run: a bfloat16
                    # export on the CPU; its log said why, so "built with --ort-kv append" was not always true)
                    raise UserError("these engines do not verify token trees: their target graph has the portable KV "
                                    "(built with `--ort-kv append`, or where in-place KV cannot run: `specrt build` "
                                    "said why); trees need the in-place KV (`specrt build --ort-kv inplace`)")
                raise UserError("these engines do not verify token trees: rebuild them with `specrt build` "
                                "(ONNX Runtime engines with in-place KV, built since trees were added)")
            vd = int((self.e.export.get("draft") or {}).get("draft_vocab_size") or self.vocab)
            if w > vd:  # (tree=9000 ran, every round's rows on the prefill engine, at 0.7 tok/s)
                raise UserError(f"a token tree of width {w}: the draft chooses among {vd} tokens, so a tree is at "
                                f"most {vd} wide (a few pay: fixed:2:tree=3 is the measured best on SmolLM2)")
        return w

    def resolve_lookup(self) -> NgramPolicy | None:
        """Prompt lookup (ngram.py) when the governor asks for it (``:ngram``). Its policy
        lives with the governor, across streams, as the governor's own learnt state does
        (a caller may swap governors between streams)."""
        if not getattr(self.governor, "lookup", False):
            return None
        if getattr(self.governor, "lookup_policy", None) is None:
            policy = NgramPolicy.from_engines(self.e, COST_PAST, getattr(self.governor, "lookup_chain", None))
            policy.corpus = self._load_corpus() if getattr(self.governor, "corpus", False) else None
            if policy.corpus is not None:
                policy.add_source(policy.corpus.source_priors())
            if getattr(self.governor, "grow", False):  # the session's own sequences (this governor's)
                policy.growth = Growth(max_tokens=getattr(self.governor, "grow_tokens", None) or GROW_TOKENS)
                policy.add_source(policy.growth.source_priors())
            self.governor.lookup_policy = policy
        return self.governor.lookup_policy

    def resolve_prediction(self, prediction) -> tuple[list[int] | None, NgramPolicy | None]:
        """A stream's predicted output (prediction.py) as token ids, checked as a prompt's (None:
        none), and the lookup policy that sizes its rounds: the governor's (``:ngram``), else
        one for predictions alone, made once per governor (no prompt lookup: the governor was
        not asked for it; the prediction was)."""
        if prediction is None:
            return None, None
        if isinstance(prediction, np.ndarray):
            prediction = prediction.tolist()
        if not isinstance(prediction, (list, tuple)):
            raise UserError(f"prediction {prediction!r:.80}: expected a list of token ids")
        ids = [as_whole(i) for i in prediction]
        bad = next((k for k, i in enumerate(ids) if i is None or not 0 <= i < self.vocab), None)
        if bad is not None:
            raise UserError(f"prediction token id {prediction[bad]!r:.40} (at {bad}): expected an integer in "
                            f"[0, {self.vocab})")
        policy = self.resolve_lookup()
        if policy is None:
            if getattr(self.governor, "prediction_policy", None) is None:
                self.governor.prediction_policy = NgramPolicy.from_engines(self.e, COST_PAST)
            policy = self.governor.prediction_policy
        if not all(k in policy.wins for k in Prediction.source_priors()):
            policy.add_source(Prediction.source_priors())
        return ids, policy

    def _load_corpus(self) -> Corpus:
        """``ENGINES/corpus.npz`` (corpus.py), made by ``specrt corpus`` for these engines."""
        folder = getattr(self.e, "folder", None)
        path = Path(folder) / CORPUS_FILE if folder is not None else None
        if path is None or not path.is_file():
            raise UserError(f"':corpus' needs {path or 'a corpus file in the engines folder'}: make it with "
                            f"`specrt corpus {folder or 'ENGINES'} ANSWERS.jsonl ...`")
        st = path.stat()
        key = (str(path), st.st_mtime_ns, st.st_size)
        if self._corpus is None or self._corpus[0] != key:  # governors of one generator share it (read-only)
            digest = getattr(self.e, "manifest", {}).get("export", {}).get("digest")
            self._corpus = (key, Corpus.load(path, self.vocab, digest))
        return self._corpus[1]

    # ---- engines --------------------------------------------------------------------

    def _run(self, runner: Runner, feeds: dict, what: str) -> tuple[dict, float]:
        t0 = time.perf_counter()
        out = runner.infer(feeds)
        return out, time.perf_counter() - t0

    def _target(self, tokens, start: int, siblings: int = 0, exact: bool = False,
                last: bool = False) -> tuple[dict, float]:
        """Score ``tokens`` at positions start.. on top of the committed target KV; the last
        ``siblings`` of them are siblings of tokens[1], at its position (a token tree).
        ``exact``: a screened head's fp32 logits even when greedy. ``last``: only the last
        row's logits are read (a prefill): engines that take ``logits_from`` may compute
        just that row (the other outputs stay whole)."""
        s = len(tokens)
        pos = np.arange(start, start + s, dtype=np.int64)
        if siblings:
            pos[s - siblings:] = start + 1
        runner = self.e.target(s)
        rows = self._from0
        if last and rows and s > 1 and not runner.role.dims[C.DIM_NEW].fixed:
            rows = {C.LOGITS_FROM: np.array(s - 1, np.int64)}
        feeds = {C.INPUT_IDS: np.asarray(tokens, np.int64)[None], C.POSITION_IDS: pos[None],
                 **self.tkv.past_feeds(), **self._head_feeds[exact], **rows}
        return self._run(runner, feeds, "target")

    def _runners_up(self, row: np.ndarray, first: int) -> list[int]:
        """The draft's next tree_width - 1 choices after ``first`` for one position, in
        target ids, most likely first (row: the draft's logits there [Vd])."""
        w, ok = self.tree_width, self._sib_allowed
        if ok is not None:  # a guided round's: among the tokens the grammar allows there (the masked row)
            ok = ok[np.arange(len(row)) + self.d2t] if self.d2t is not None else ok[: len(row)]
            row = np.where(ok, row, -np.inf)
        top = np.argpartition(-row, w)[: w + 1] if len(row) > w + 1 else np.arange(len(row))
        top = top[np.argsort(-row[top], kind="stable")]
        ids = top + (self.d2t[top] if self.d2t is not None else 0)
        return [int(t) for t, i in zip(ids, top) if t != first and (ok is None or ok[i])][: w - 1]

    def _first_token(self, out: dict, rng, guide=None) -> int:
        """The token after the prompt, from the prefill's last row (a screened head's fp32 row:
        zero norms, so the screen only rescores the tokens within float rounding of the top,
        and the tie rule stays the one every later step follows; a guide's mask laid over it)."""
        logits = out[C.LOGITS][0]
        # (a NaN or +inf row gave argmax's first such index: a wrong first token emitted before the
        # error the next step raised, session 59)
        check_logits(logits[-1:], first_row=len(logits) - 1)  # (the call's row: its last, or its only one)
        if guide is not None:
            return self._pick(guide.masked(logits[-1]), rng)
        if self.screen is not None:
            return int(self.screen.argmax(logits, out[C.HEAD_HIDDEN][0], out[C.HEAD_NORMS][0],
                                          range(len(logits) - 1, len(logits)))[0])
        return self._pick(logits[-1], rng)

    def _pick(self, logits: np.ndarray, rng) -> int:
        """The first token (output position 0)."""
        if self.params.greedy:
            return int(np.argmax(logits))
        if self._noise is not None:
            return self._noise.pick(probs(logits[None], self.params)[0], 0)
        return sample(probs(logits[None], self.params)[0], rng)

    def _reusable(self, prompt: list[int]) -> tuple[int, int, np.ndarray | None]:
        """Prefix reuse: (s0, d0, aux rows 0..s0-1). The target's KV rows 0..s0-1 and the
        draft's rows 0..d0-1 are the last stream's, left in the caches by its prefill, its
        rounds and the draft's passes: the prefill computes rows s0.. only, and the draft
        takes in rows d0.. with the kept aux rows for d0..s0-1. A row depends only on the
        tokens up to it; the prompt's rows come out bit for bit the same in passes of any
        lengths >= 2 on the in-place engines' ONNX Runtime CPU kernels (tested), within float
        rounding (~1e-6) on ``--ort-kv append`` engines, the output's rows are the ones
        its verify calls computed (as speculation itself uses them; a one-row call's differ
        from a prefill's in float rounding, ~1e-5). s0 <= the common prefix and leaves >= 2
        rows to compute; a draft row i holds token i + 1, so d0 < the common prefix.
        (0, 0, None) when off, or nothing is shared."""
        if not self.reuse_prefix:
            return 0, 0, None
        self._swap_in(prompt)
        if self._prefix is None or self._prefix_owner != self.owner:
            return 0, 0, None
        ids, chunks = self._prefix
        c = common_prefix(ids, prompt)
        s0 = _reusable_rows(c, self.tkv.length, len(prompt))
        if s0 == 0:
            return 0, 0, None
        d0 = max(0, min(self.dkv.length, s0, c - 1)) if self.dkv is not None else 0
        return s0, d0, _first_rows(chunks, s0)

    def _not_reused(self) -> tuple[int, int, None]:
        """A stream that reuses nothing (prompt_logprobs): the live rows, when a conversation
        that snapshots would keep, are set aside first, as another conversation's would be."""
        if self.reuse_prefix and self.prefix_snapshots > 0 and self._prefix is not None:
            n = min(self.tkv.length, len(self._prefix[0]))
            if n >= SET_ASIDE_ROWS:
                self._set_aside(n)
        return 0, 0, None

    def _swap_in(self, prompt: list[int]) -> None:
        """Prefix snapshots (``prefix_snapshots`` > 0): when a kept snapshot shares more rows
        with ``prompt`` than the live caches do, load the snapshot's rows into the caches;
        when the prompt would overwrite at least SET_ASIDE_ROWS live rows it does not share
        (another conversation, not the next turn of this one), set them aside first. The
        snapshot swapped in stays kept when the prompt would overwrite as many of its rows
        (another conversation that shares its start, a system prompt). The oldest snapshots
        go past the limit."""
        if self.prefix_snapshots <= 0:
            self._snapshots.clear()
            return
        live_n = min(self.tkv.length, len(self._prefix[0])) if self._prefix is not None else 0
        mine = self._prefix_owner == self.owner  # another owner's rows share nothing with this prompt
        live = _reusable_rows(common_prefix(self._prefix[0], prompt), live_n, len(prompt)) if live_n and mine else 0
        scored = [(_reusable_rows(common_prefix(sn.ids, prompt), len(sn.aux), len(prompt)), i)
                  for i, sn in enumerate(self._snapshots) if sn.owner == self.owner]
        shared, i = max(scored, key=lambda t: t[0], default=(0, -1))  # the first of the best
        if shared > live:
            best = self._snapshots.pop(i)
            if len(best.ids) - shared >= SET_ASIDE_ROWS:  # not its next turn: kept, the newest
                self._snapshots.append(best)
            if live_n - live >= SET_ASIDE_ROWS:  # (fewer: not worth a snapshot, as below)
                self._set_aside(live_n)
            self._prefix = None  # the caches hold neither's rows until the swap completes (an interrupt)
            self.tkv.load_rows(best.target_rows)
            if self.dkv is not None:
                self.dkv.load_rows(best.draft_rows)
            self._prefix, self._prefix_owner = (best.ids, [best.aux]), best.owner
        elif live_n - live >= SET_ASIDE_ROWS:  # rows the prompt does not share would be overwritten
            self._set_aside(live_n)

    def _set_aside(self, n: int) -> None:
        """The live caches' first ``n`` rows (with their tokens and aux rows) as the newest
        snapshot; the oldest past ``prefix_snapshots`` dropped."""
        if self._prefix is None or n < 2:
            return
        ids, chunks = self._prefix
        # a row depends only on the tokens up to it: one kept snapshot of this owner that starts
        # with these n tokens holds these rows already (it becomes the newest), and those these
        # rows start with are superseded (a prompt scored twice set the same rows aside twice,
        # pushing other conversations out). The kept one takes the live draft rows where it has
        # fewer (kept from a prompt only scored, it has none); rows 0..n-2 only: draft row i
        # holds token i + 1, and the live token n need not be the snapshot's
        same = lambda sn: sn.owner == self._prefix_owner  # noqa: E731
        for j, sn in enumerate(self._snapshots):
            if same(sn) and len(sn.ids) >= n and sn.ids[:n] == ids[:n]:
                m = min(self.dkv.length, n - 1) if self.dkv is not None else 0
                if m > (self.dkv.saved_length(sn.draft_rows) if sn.draft_rows is not None else 0):
                    sn.draft_rows = self.dkv.save_rows(m)
                self._snapshots.append(self._snapshots.pop(j))
                return
        self._snapshots = [sn for sn in self._snapshots if not (same(sn) and sn.ids == ids[: len(sn.ids)])]
        self._snapshots.append(Snapshot(list(ids[:n]), _first_rows(chunks, n).copy(), self.tkv.save_rows(n),
                                        self.dkv.save_rows(min(self.dkv.length, n)) if self.dkv is not None else None,
                                        self._prefix_owner))
        del self._snapshots[: max(0, len(self._snapshots) - self.prefix_snapshots)]

    # ---- drafting -------------------------------------------------------------------

    def _draft_tokens(self, logits: np.ndarray, ids: np.ndarray, rng, offset: int = 0
                      ) -> tuple[np.ndarray, np.ndarray | None]:
        """Draft tokens (target ids) and, when sampling, their distributions q [K, V]
        (coupled sampling: row k is drawn with the noise of output position
        ``self._draft_pos + offset + k`` and no q is needed)."""
        if self.params.greedy:
            if self.confidence_head:  # (else _softmax_max checks them, with the maxima it takes anyway)
                check_logits(logits, "draft")
            return ids.astype(np.int64), None
        qd = probs(logits, self.params, engine="draft")  # [K, Vd]
        if self._noise is not None:
            base = self._draft_pos + offset
            return np.array([self._noise.pick(row, base + k, self._draft_to_target) for k, row in enumerate(qd)],
                            np.int64), None
        picks = np.array([sample(row, rng) for row in qd], np.int64)
        # in target ids, a row only when verification reaches it
        q = LazyRows(lambda k: scatter_draft_probs(qd[k : k + 1], self.d2t, self.vocab)[0], len(qd), self.vocab)
        tgt = picks + (self.d2t[picks] if self.d2t is not None else 0)
        return tgt, q

    def _catch_up(self, pending_tok, pending_aux, start: int, eagle3: bool = False):
        """The draft takes in a long run of pending rows (the prompt, after the prefill) in
        passes of DRAFT_CHUNK rows, each committing its rows' draft KV, so that its
        attention's temporaries ([heads, rows, past + rows] floats: 150 MB for the whole of
        a 850-token prompt in one pass) stay bounded; returns the rows left for the round's
        own pass (at most DRAFT_CHUNK) and the seconds spent. The same rows in fewer
        passes: the draft's KV and logits equal within float rounding (the attention sums
        over the past and the new rows in two blocks)."""
        total = 0.0
        while len(pending_tok) > DRAFT_CHUNK:
            c = DRAFT_CHUNK
            feeds = {C.INPUT_IDS: np.asarray(pending_tok[:c], np.int64)[None],
                     C.POSITION_IDS: np.arange(start, start + c, dtype=np.int64)[None],
                     C.DRAFT_AUX_IN: np.ascontiguousarray(pending_aux[None, :c], dtype=self.dtype),
                     **({C.DRAFT_PREV_HIDDEN: np.zeros((1, 0, self.hidden), self.dtype)} if eagle3 else {}),
                     **self.dkv.past_feeds()}
            out, dt = self._run(self.e.draft(), feeds, "draft")
            self.dkv.commit(out, c)
            total += dt
            pending_tok, pending_aux, start = pending_tok[c:], pending_aux[c:], start + c
        return pending_tok, pending_aux, start, total

    def _draft_peagle(self, pending_tok, pending_aux, start: int, k: int, rng):
        pending_tok, pending_aux, start, t_catch = self._catch_up(pending_tok, pending_aux, start)
        a, m = len(pending_tok), k - 1
        feeds = {C.INPUT_IDS: np.asarray(list(pending_tok) + [self.mask_id] * m, np.int64)[None],
                 C.POSITION_IDS: np.arange(start, start + a + m, dtype=np.int64)[None],
                 C.DRAFT_AUX_IN: np.ascontiguousarray(pending_aux[None], dtype=self.dtype),
                 **self.dkv.past_feeds()}
        out, dt = self._run(self.e.draft(), feeds, "draft")
        self.dkv.commit(out, a)  # real slots persist; mask slots are per-round scratch
        logits = out[C.DRAFT_LOGITS][0]  # [K, Vd]
        drafts, q = self._draft_tokens(logits, out[C.DRAFT_TOKENS][0], rng)
        if self.tree_width > 1:
            self._siblings = self._runners_up(logits[0], int(drafts[0]))
        # (a copy: an engine may reuse its output buffers, and rounds keep their confidences)
        conf = np.array(out[C.DRAFT_CONFIDENCE][0], np.float32) if self.confidence_head else _softmax_max(logits)
        return drafts, q, conf, dt + t_catch

    def _draft_eagle3(self, pending_tok, pending_aux, start: int, k: int, rng):
        """k sequential steps; step j+1 feeds step j's token (sampled when sampling) and its
        pre-norm hidden as g. Speculative draft-KV rows are rolled back afterwards."""
        pending_tok, pending_aux, start, total = self._catch_up(pending_tok, pending_aux, start, eagle3=True)
        runner = self.e.draft()
        feeds = {C.INPUT_IDS: np.asarray(pending_tok, np.int64)[None],
                 C.POSITION_IDS: np.arange(start, start + len(pending_tok), dtype=np.int64)[None],
                 C.DRAFT_AUX_IN: np.ascontiguousarray(pending_aux[None], dtype=self.dtype),
                 C.DRAFT_PREV_HIDDEN: np.zeros((1, 0, self.hidden), self.dtype)}
        real = self.dkv.length + len(pending_tok)
        drafts, qs, confs = np.zeros(k, np.int64), [], np.zeros(k, np.float32)
        for j in range(k):
            out, dt = self._run(runner, {**feeds, **self.dkv.past_feeds()}, "draft")
            total += dt
            self.dkv.commit(out, feeds[C.INPUT_IDS].shape[1])
            logits = out[C.DRAFT_LOGITS][0, -1:]  # [1, Vd]
            tok, q = self._draft_tokens(logits, out[C.DRAFT_TOKENS][0, -1:], rng, offset=j)
            drafts[j] = tok[0]
            confs[j] = out[C.DRAFT_CONFIDENCE][0, -1] if self.confidence_head else _softmax_max(logits)[0]
            if j == 0 and self.tree_width > 1:
                self._siblings = self._runners_up(logits[0], int(tok[0]))
            if q is not None:  # (a row built only when verification reaches it)
                qs.append(q)
            pos = int(feeds[C.POSITION_IDS][0, -1]) + 1
            # the next step's token is this draft, in draft-graph (target) ids
            feeds = {C.INPUT_IDS: drafts[j : j + 1][None], C.POSITION_IDS: np.array([[pos]], np.int64),
                     C.DRAFT_AUX_IN: np.zeros((1, 0, self.aux_width), self.dtype),
                     C.DRAFT_PREV_HIDDEN: np.ascontiguousarray(out[C.DRAFT_HIDDEN_OUT][:, -1:])}
        self.dkv.rollback(real)  # speculative rows go; the real slots stay
        q = LazyRows(lambda j: qs[j][0], len(qs), self.vocab) if qs else None
        return drafts, q, confs, total

    # ---- the loop -------------------------------------------------------------------

    def stream(self, prompt_ids, max_new_tokens: int, eos_ids=(), grammar=None, prediction=None) -> Stream:
        """The new tokens of each round, as lists of token ids. One stream at a time: the
        caches are the Generator's, so a stream started while an earlier one is unfinished
        supersedes it (resuming the earlier one raises UserError instead of going on over
        rows that are no longer its own). The arguments are checked here, before the first
        chunk is asked for (a refused call leaves a running stream running); the telemetry's
        ``seconds`` leave out the time the consumer holds the stream between chunks
        (``Stream.clock``). Streams may be driven from several threads: they take turns
        (``lock``), a round at a time. ``grammar``: a grammar.Grammar the answer is held to
        (structured output; its first mask is made here: a grammar no token can start is refused).
        ``prediction``: token ids the answer is expected to largely repeat (OpenAI's predicted
        output, prediction.py), proposed beside the draft; the answer is the target's all the same."""
        with self.lock:
            try:
                checked = self._check(prompt_ids, max_new_tokens, eos_ids)
                predicted, policy = self.resolve_prediction(prediction)
                guide = grammar.guide() if grammar is not None else None
                if guide is not None:
                    guide.allowed()
            except UserError:
                if self._live is None:  # a refused stream shows no earlier stream's finish or telemetry
                    self.finished, self.telemetry = None, Telemetry()
                raise
            prompt, eos, scored, top, tree_width, lookup = checked
            lookup = lookup if lookup is not None else policy
            self._epoch = mine = self._live = self._epoch + 1
            self._screen_for(self.params, guide is not None)
            # this stream's, from its start: a stream closed early leaves no other's
            self.finished, self.telemetry = None, Telemetry()
            self.tree_width = tree_width
            self.governor.start_stream()
            clock = Held()
            return Stream(self._decode(prompt, max_new_tokens, eos, lookup, scored, top, mine, self.telemetry, clock,
                                       clock.claim(), guide, predicted), clock, self.lock,
                          lambda: self._closed_unstarted(mine))

    def _full(self) -> str | None:
        """"context" where the next round would find no room (the stream's loop ends there)."""
        return "context" if self.e.max_context - self.tkv.length - 2 < 0 else None

    def _closed_unstarted(self, mine: int) -> None:
        """Stream ``mine`` was closed before it started: it ends "interrupted" and is no longer
        live (unless a newer stream has started since: its finish is its own)."""
        if self._epoch == mine and self.finished is None:
            self.finished = Finished("interrupted")
        if self._live == mine:
            self._live = None

    def check_ids(self, prompt_ids) -> list[int]:
        """A prompt's token ids as Python ints, refused when not integers (``int()`` took 1.7 as
        1, "12" as 12 and True as 1, and stats() showed them as given), empty or outside the
        vocabulary."""
        if isinstance(prompt_ids, np.ndarray):
            prompt_ids = prompt_ids.tolist()  # (numpy ints as Python's; a 2-D array's rows refused below)
        if not isinstance(prompt_ids, (list, tuple)):
            raise UserError(f"prompt token ids {prompt_ids!r:.80}: expected a list of integers")
        prompt = [as_whole(i) for i in prompt_ids]
        if None in prompt:
            k = prompt.index(None)
            raise UserError(f"prompt token id {prompt_ids[k]!r:.40} (at {k}): expected an integer")
        if not prompt:
            raise UserError("the prompt is empty")
        bad = [i for i in prompt if not 0 <= i < self.vocab]
        if bad:
            raise UserError(f"prompt token id {bad[0]} is outside the vocabulary [0, {self.vocab})")
        return prompt

    @property
    def streaming(self) -> bool:
        """Whether a stream is live (made and not finished)."""
        return self._live is not None

    def _check(self, prompt_ids, max_new_tokens, eos_ids) -> tuple:
        """A stream's arguments, checked and resolved without touching any state a running
        stream reads: (prompt, eos ids, prompt logprobs' alternatives, logprobs' alternatives,
        tree width, lookup policy)."""
        return self.check_args(prompt_ids, max_new_tokens, eos_ids, self.logprobs, self.prompt_logprobs)

    def check_args(self, prompt_ids, max_new_tokens, eos_ids, logprobs, prompt_logprobs) -> tuple:
        """``_check`` with the logprobs settings given (Session.stream and check_prompt: before a
        stream sets them)."""
        self.check_count(prompt_ids, max_new_tokens, prompt_logprobs)
        prompt = self.check_ids(prompt_ids)
        scored = self.check_length(len(prompt), max_new_tokens, prompt_logprobs)
        eos = set(int(e) for e in eos_ids)
        return (prompt, eos, scored, _alternatives("logprobs", logprobs), self.resolve_tree_width(),
                self.resolve_lookup())

    def check_count(self, prompt, max_new_tokens, prompt_logprobs) -> None:
        """``check_length`` by the count of token ids (a list, tuple or array whose first item is
        an id; a conversation's is a message, a 2-D array's a row) where they are at least the
        context: before a pass over each id (1.2M ids took 46 s of checks to be refused)."""
        if isinstance(prompt, (list, tuple, np.ndarray)) and len(prompt) >= self.e.max_context \
                and as_whole(prompt[0]) is not None:
            self.check_length(len(prompt), max_new_tokens, prompt_logprobs)

    def check_length(self, n: int, max_new_tokens, prompt_logprobs, least: bool = False) -> int | None:
        """UserError where a prompt of ``n`` tokens (``least``: of at least ``n``, a bound found
        before tokenizing, ``Text.least_tokens``) leaves no room in the context for
        ``max_new_tokens``, or those are not a count; else prompt_logprobs' alternatives."""
        scored = _alternatives("prompt_logprobs", prompt_logprobs)
        if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool):
            raise UserError(f"max_new_tokens={max_new_tokens!r}: expected an integer")
        if max_new_tokens < (0 if scored is not None else 1):
            raise UserError(f"max_new_tokens={max_new_tokens}: expected >= 1 (0 only with prompt_logprobs, scoring "
                            "the prompt)")
        has = f"the prompt has {'at least ' if least else ''}{n} tokens"
        if max_new_tokens == 0 and n > self.e.max_context:  # scored only: no new token's row
            raise UserError(f"{has}; the engines' context limit is {self.e.max_context}")
        if max_new_tokens > 0 and n + 1 > self.e.max_context:
            raise UserError(f"{has}; the engines' context limit is {self.e.max_context} "
                            f"(a prompt of at most {self.e.max_context - 1}, leaving room for a new token)")
        return scored

    def _decode(self, prompt: list[int], max_new_tokens: int, eos: set[int], lookup, scored, top, mine: int,
                tel: Telemetry, clock: Held, me: object, guide=None, predicted=None) -> Iterator[list[int]]:
        self._still_mine(mine)  # (a stream asked for its first chunk after a newer one started)
        rng = make_rng(self.params.seed)
        # coupled sampling: each position's draw a function of the seed and the position
        self._noise = CoupledNoise(self.params.seed, self.vocab) \
            if self.params.coupled and not self.params.greedy else None
        self._draft_pos = 0
        lps = self.output_logprobs = []
        plps = self.prompt_logprobs_out = [] if scored is None else [None]
        s0, d0, saved = self._reusable(prompt) if scored is None else self._not_reused()
        self.tkv.rollback(s0)
        if self.dkv is not None:
            self.dkv.rollback(d0)
        # until this prompt's prefill completes, the rows it reused (a prefill cut by Ctrl-C or
        # an error writes past them only: the next turn reused nothing, 0 of 78 in `specrt
        # chat`, a walk, session 56)
        self._prefix = (prompt[:s0], [saved]) if s0 else None
        tel.prompt_tokens, tel.prefix_reused = len(prompt), s0
        t_start = time.perf_counter()
        emitted, ending = 0, None
        x: list[int] = []
        try:
            # the prompt's rows s0.. in passes of at most PREFILL_CHUNK rows (bounded
            # temporaries; never a last pass of one row, which the decode engine's kernels
            # would compute differently), the last one's last row giving the first token
            new_aux = []
            for at, end in _passes(s0, len(prompt), PREFILL_CHUNK):
                out, dt = self._target(prompt[at:end], at, exact=True, last=scored is None)
                tel.engine_time("prefill", dt)
                if scored is not None:  # row j's logits score token j + 1
                    nxt = prompt[at + 1 : end + 1]
                    plps += token_logprobs(out[C.LOGITS][0][: len(nxt)], nxt, scored, ranks=True)
                self.tkv.commit(out, end - at)
                new_aux.append(out[C.AUX_HIDDEN][0].copy())
            aux = new_aux[0] if len(new_aux) == 1 and not s0 else np.concatenate(([saved] if s0 else []) + new_aux)
            # the committed rows' tokens and aux, grown with every round's, for the next stream
            kv_ids, kv_aux = list(prompt), [aux]
            self._prefix, self._prefix_owner = (kv_ids, kv_aux), self.owner
            if max_new_tokens == 0:  # the prompt scored only
                tel.streams = 1
                self.finished = Finished("length")
                return
            first = self._first_token(out, rng, guide)
            if guide is not None:
                guide.take(first)
            # the grammar complete: the answer ends at this token (finish "stop")
            done = guide is not None and guide.stopped and first not in eos
            tel.streams, tel.first_token_s = 1, time.perf_counter() - t_start
            x = prompt + [first]
            if top is not None:
                lps += token_logprobs(out[C.LOGITS][0][-1:], [first], top)
            # pending real slots for the draft (rows d0.. : its KV holds those before):
            # tokens, aux hidden chunks [*, 3H], first position
            pend_tok, pend_aux, pend_start = x[d0 + 1:], [aux[d0:]], d0
            emitted = 1
            behind = True  # pending rows come from steps the draft did not run in (here: the prompt)
            index = None
            if lookup is not None and getattr(self.governor, "lookup", False):  # (else a prediction's alone)
                index = NgramIndex()
                index.extend(x)
            # the request's predicted output: a source of this stream's only (its rates the policy's)
            sources = ([] if lookup is None else lookup.sources()) + \
                ([Prediction(predicted, len(prompt))] if predicted else [])
            tel.finish(emitted, time.perf_counter() - t_start - clock.seconds)  # (stats() in mid-stream: so far)
            # how the stream ends if this is its last chunk: a caller closing it once it has them all
            # (after the EOS, or max_new_tokens) ends it so, not "interrupted"
            ending = "eos" if first in eos else "stop" if done else "length" if emitted >= max_new_tokens \
                else self._full()
            with clock.at(me):
                yield [first]
            self._still_mine(mine)
            if first in eos or done:
                self.finished = Finished(ending)
                return
            while emitted < max_new_tokens:
                n = self.tkv.length
                # drafts that still fit: the prompt and the answer together hold at most max_context
                # tokens (as the prompt check, serve and bench count them; the last one is not fed),
                # and a round of d drafts adds up to d + 1 to x's n + 1
                room = self.e.max_context - n - 2
                if room < 0:
                    self.finished = Finished("context")
                    return
                t_round = time.perf_counter()
                drafts, q, conf, t_draft = np.zeros(0, np.int64), None, None, 0.0
                catch_up = False
                # never verify more than fits the context or the token budget (d drafts + 1)
                limit = min(room, max_new_tokens - emitted - 1)
                found, n_match, d = [], 0, 0
                if lookup is not None:  # prompt lookup: its tokens instead of the governor's route?
                    found, n_match = index.propose(min(limit, lookup.max_len)) if index is not None else ([], 0)
                    d, rate = lookup.choose_rate(len(found), n_match, limit) if found else (0, 0.0)
                    lookup.note(n_match, found, len(x), x)  # learnt in hindsight, chosen or not
                    for source in sources:  # the corpus's, the grown one's, a prediction's, where they promise more
                        c_found, c_key = source.propose(x, min(limit, lookup.max_len))
                        c_d, c_rate = lookup.choose_rate(len(c_found), c_key, limit) if c_found else (0, 0.0)
                        lookup.note(c_key, c_found, len(x), x)
                        if c_d > 0 and (d == 0 or c_rate > rate):
                            found, n_match, d, rate = c_found, c_key, c_d, c_rate
                if d > 0:  # one-hot proposals (q None), no draft pass, no runners-up
                    drafts = np.asarray(found[:d], np.int64)
                else:
                    n_match = 0
                    d = self.governor.choose(GovernorState(limit=limit)) if self.dkv is not None else 0
                if d > 0 and not n_match:
                    if self.dkv.length != pend_start:
                        raise InternalError(f"draft KV at {self.dkv.length}, pending slots start at {pend_start}")
                    # d is the block to draft: DSpark then picks the verified length <= d from
                    # the drafts' confidences; the others verify exactly what they draft.
                    fn = self._draft_peagle if self.draft_kind == "peagle" else self._draft_eagle3
                    aux = pend_aux[0] if len(pend_aux) == 1 else np.concatenate(pend_aux)
                    self._draft_pos = emitted  # draft k proposes output position emitted + k
                    # (a guided tree's runners-up: tokens the grammar allows at the first position)
                    self._sib_allowed = guide.allowed() if guide is not None and self.tree_width > 1 else None
                    drafts, q, conf, t_draft = fn(pend_tok, aux, pend_start, d, rng)
                    pend_tok, pend_aux, pend_start = [], [], n
                    catch_up, behind = behind, False
                    if self.governor.uses_confidences:  # EAGLE-3's later confidences follow its
                        # sampled drafts: rejection sampling then needs a stopping rule (governor.py)
                        stopping = self.draft_kind == "eagle3" and not self.params.greedy and self._noise is None
                        d = self.governor.choose(GovernorState(confidences=conf, limit=limit, stopping=stopping))
                # a token tree: the draft's runners-up for the first position, where they fit (in the
                # room + 1 rows left after x[-1]'s, past the chain's d; as many as the governor takes
                # this round: DSpark sizes the tree from c_1)
                sib = self._siblings[: max(0, min(room + 1 - d, self.governor.round_siblings()))] \
                    if self.tree_width > 1 and d >= 1 and not n_match else []
                out, t_verify = self._target([x[-1], *drafts[:d], *sib], n, len(sib), exact=top is not None)
                logits = out[C.LOGITS][0]  # [d+1 (+ siblings), V]
                screen = self.screen  # a screened head: greedy logits approximate (specrt/head.py)
                if self.params.greedy:
                    if guide is not None:
                        # the masked rows' argmaxes up to the first that ends the round (grammar.py): the
                        # drafts after it are never accepted, so they are not verified
                        best = guide.argmaxes(logits, drafts[:d],
                                              lambda k: check_logits(logits[k : k + 1], first_row=k))
                        v = verify_greedy(None, drafts[: len(best) - 1], best=best)
                    else:
                        hid, nrm = (out[C.HEAD_HIDDEN][0], out[C.HEAD_NORMS][0]) if screen is not None else (None, None)
                        # (a screen's non-finite rows come back -1: verify_greedy fails only the rows it uses)
                        best = screen.argmax(logits, hid, nrm, range(d + 1), nonfinite_ok=True) \
                            if screen is not None else None
                        v = verify_greedy(logits[: d + 1], drafts[:d], best=best)
                    if sib and v.accepted == 0 and int(v.tokens[0]) in sib:  # a runner-up won position 1
                        j = sib.index(int(v.tokens[0]))
                        row = d + 1 + j  # its row's argmax (a guide's: masked after the runner-up)
                        if screen is not None:
                            bonus = screen.argmax(logits, hid, nrm, range(row, row + 1))[0]
                        else:  # (the error names the call's row: verify_greedy on the slice named row 0)
                            check_logits(logits[row : row + 1], first_row=row)
                            bonus = int((guide.sibling_row(logits[row], sib[j]) if guide is not None
                                         else logits[row]).argmax())
                        v = Verdict(1, np.array([v.tokens[0], bonus], np.int64), j)
                else:
                    m = logits.max(-1)

                    def row(k: int) -> np.ndarray:
                        # each row checked as it is used: rows past the first rejection are not looked at,
                        # as greedy's are not (one failed the round, and the answer's failure hung on the depth)
                        check_logits(logits[k : k + 1], rowmax=m[k : k + 1], first_row=k)
                        if guide is not None and k > d:  # a runner-up's: masked after it (grammar.py)
                            return probs(guide.sibling_row(logits[k], sib[k - d - 1])[None], self.params)[0]
                        if guide is not None:  # masked after drafts 1..k (asked for in order: LazyRows)
                            return guide.row_probs(logits[k], drafts, k, self.params)
                        return probs(logits[k : k + 1], self.params, rowmax=m[k : k + 1])[0]

                    p = LazyRows(row, d + 1 + len(sib), self.vocab)  # the siblings' rows after the chain's
                    if self._noise is not None:
                        v = verify_coupled(p, drafts[:d], self._noise.pick, emitted, sib, lambda j: p[d + 1 + j])
                        self._noise.forget_before(emitted)
                    else:
                        v = verify_sampling(p, q if q is not None else one_hot(drafts[:d], self.vocab), drafts[:d],
                                            rng, sib, lambda j: p[d + 1 + j])
                if guide is not None:  # the matcher holds the round's tokens; a round past the grammar's end cut
                    v = guide.settle(v)
                rows = [0, d + 1 + v.sibling] if v.sibling >= 0 else slice(0, v.accepted + 1)  # x's, then the accepted
                if v.sibling >= 0:
                    self.tkv.move_row(n + rows[1], n + 1)  # the runner-up's K/V row to the slot after x's
                self.tkv.commit(out, v.accepted + 1)
                # a copy: the engine's output buffer is rewritten by its next call, which
                # comes before the next draft when this round or the next drafts nothing
                kv_aux.append(np.array(out[C.AUX_HIDDEN][0, rows]))  # (first: the chunks cover kv_ids)
                kv_ids += [x[-1], *(int(t) for t in v.tokens[: v.accepted])]  # the rows just committed
                if self.dkv is not None:  # rows n .. n+a become pending slots (appended if no draft ran)
                    pend_tok += [int(t) for t in v.tokens]
                    pend_aux.append(kv_aux[-1])
                r = RoundResult(d, v.accepted, t_draft, t_verify, time.perf_counter() - t_round,
                                conf if conf is not None else None, siblings=len(sib), sibling=v.sibling,
                                lookup=n_match, catch_up=catch_up)
                if r.rejected and self._outside_vocab is not None and self._outside_vocab[int(v.tokens[v.accepted])]:
                    r = dataclasses.replace(r, outside_vocab=True)  # the target's correction: never draftable
                behind = behind or t_draft == 0.0  # this step's rows wait for a later pass
                new = [int(t) for t in v.tokens][: max_new_tokens - emitted]
                stop = next((j for j, t in enumerate(new) if t in eos), None)
                if stop is not None:
                    new = new[: stop + 1]
                # the grammar complete at the round's last token (settle cut it there)
                done = guide is not None and guide.stopped and stop is None and len(new) == len(v.tokens)
                # at an accepted draft, or at a tree's winning runner-up (settle cut its bonus: r77i): the
                # answer's end, as an EOS's, no rejection (m76i). Governors learn the round as the target
                # judged it: the draft taken, the positions after it not judged (cut_at_eos: DSpark's
                # calibration read the draft as refused, h78b); the runner-up's win, its bonus cut
                learnt = r
                if done and r.rejected and int(v.tokens[-1]) == int(drafts[v.accepted]):
                    r = learnt = dataclasses.replace(r, cut_at_eos=True)
                elif done and r.rejected and v.accepted == 0 and int(v.tokens[0]) in sib:
                    learnt = dataclasses.replace(r, accepted=1, sibling=sib.index(int(v.tokens[0])),
                                                 outside_vocab=False)
                    r = dataclasses.replace(r, cut_at_eos=True)
                # the telemetry counts what was emitted: drafts accepted past an EOS are not
                # (governors and the lookup policy still learn the round as the target judged it)
                tel.record(r if stop is None or stop >= r.accepted else  # (ended by the EOS, not a rejection)
                           dataclasses.replace(r, accepted=stop, sibling=r.sibling if stop else -1,
                                               outside_vocab=False, cut_at_eos=True))
                if not n_match:  # governors learn from their own rounds
                    self.governor.observe(learnt)
                if lookup is not None:
                    lookup.observe(d + 1 + len(sib), t_verify, r.t_round, v.accepted + 1,
                                   (n_match, v.accepted) if n_match else None)
                if top is not None:  # each token's row: x's, the accepted drafts', a winning runner-up's
                    lps += token_logprobs(logits[rows][: len(new)], new, top)
                x += new
                if index is not None:
                    index.extend(new)
                if lookup is not None:
                    lookup.settle(x)
                emitted += len(new)
                tel.finish(emitted, time.perf_counter() - t_start - clock.seconds)
                ending = "eos" if stop is not None else "stop" if done else "length" if emitted >= max_new_tokens \
                    else self._full()
                with clock.at(me):
                    yield new
                self._still_mine(mine)
                if stop is not None or done:
                    self.finished = Finished(ending)
                    return
            self.finished = Finished("length")
        except GeneratorExit:  # closed by its caller before it ended (a stream since started keeps its finish)
            if self._epoch == mine and self.finished is None:
                self.finished = Finished(ending or "interrupted")
            raise
        except (NonFiniteOutput, EngineFailure) as e:  # NaN/inf logits, or the backend failing a call
            self._failed(mine)
            # (ONNX Runtime's own error): the user's engines are broken. (`specrt export` refuses
            # non-finite weights: in float32 the rest are finite weights whose sums overflow, or engines
            # changed since their build, which compare names)
            folder = getattr(self.e, "folder", None) or "ENGINES"
            why = (f"short of memory, or engines changed since their build? `specrt compare {folder}` runs each "
                   "of them" if isinstance(e, EngineFailure) else
                   "an overflow in reduced precision? try float32 engines" if self.e.precision != "fp32" else
                   "float32 engines: weights whose sums overflow float32, or engines changed since their build? "
                   f"`specrt compare {folder}` checks them against the export")
            # (where in the answer: "row 0" of a decode call is any token's)
            raise EngineFailure(f"{e}, {emitted} token(s) into the answer ({why})") from None
        except UserError:  # (a grammar no token can continue: the tokens before it were given, stats() say so)
            self._failed(mine)
            raise
        finally:
            tel.finish(emitted, time.perf_counter() - t_start - clock.seconds)
            superseded = self._epoch != mine
            if self._live == mine:
                self._live = None
            if lookup is not None and not superseded:  # (its final settling drops the newer stream's tallies)
                lookup.settle(x, final=True)
                if lookup.growth is not None and emitted:
                    lookup.growth.add(x)  # ':grow': later streams of this governor search it

    def _failed(self, mine: int) -> None:
        """The stream ``mine`` ended by an error: finish "error" (it had none: stats() said null),
        unless a newer stream has started since (a superseded one's error is its own)."""
        if self._epoch == mine and self.finished is None:
            self.finished = Finished("error")

    def _still_mine(self, epoch: int) -> None:
        if self._epoch != epoch:
            raise UserError("this stream was superseded: a newer stream started on the same Session (its caches "
                            "hold one stream at a time; finish or close a stream before starting the next)")

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=(), grammar=None, prediction=None) -> list[int]:
        out: list[int] = []
        for chunk in self.stream(prompt_ids, max_new_tokens, eos_ids, grammar, prediction):
            out += chunk
        return out
