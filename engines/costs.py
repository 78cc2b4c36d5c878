"""The cost table: each engine's latency per call, profiled at build time for the governor.

DESIGN.md §5 picks the verify depth maximising expected tokens per unit time,
``(1 + sum_{k<=d} S_k) / (t_draft + t_verify(d))``; the t_* come from here.

Method: synthetic feeds of the exact shapes the runtime sends (past KV as prefix views of
a preallocated buffer, or the whole buffers of an in-place engine; random values),
``warmup`` untimed rounds, then the median of ``repeats`` timed ``Runner.infer`` calls
(validation and binding included: that is what the runtime pays), the roles timed
round-robin so that machine noise hits them alike, in the order the runtime calls them
(``loop_order``): decode after decode, and each ``verify.d`` right after the draft pass
for d, each draft pass right after a verify. A draft pass leaves the caches and thread
pools as the runtime's verify finds them: SmolLM2-135M, 2 threads, 2026-11-29, a draft
pass took 1.8-2.0 ms after another draft pass and 2.0-2.1 ms after a verify; the build's
table with the previous order (drafts after drafts, verify.1 after decode) gave draft
1.73 ms and verify.1 1.02x decode, the loop order 2.13 ms and 1.11x, and in a bench of
both builds in one run the decode phase of fixed:1 / fixed:2 measured 0.97x / 0.92x of
the loop-order table's prediction against 0.87x / 0.85x of the old one's (the runtime's
own rounds: draft 2.3-2.5 ms, verify.1 1.04-1.10x decode). Measured at every past length
in ``pasts`` that fits the context.

Table (``engines.json["costs"]``; JSON keys are strings, ``EngineSet.costs`` gives ints):

    unit "seconds", statistic "median", repeats, warmup
    pasts [128, 512]          past lengths profiled (those that fit max_context)
    reference_past 128        the past the flat entries below are measured at
    verify {d: s}             verify.{d} (S = d + 1 new tokens)
    decode s                  one target token (S = 1)
    draft s                   one draft call: P-EAGLE one pass for draft_depth tokens with
                              draft_accepted real slots; EAGLE-3 one step of one token
    draft_by_depth {k: s}     drafting a block of k (P-EAGLE: one pass of k tokens, profiled
                              at every built depth; EAGLE-3: k steps = k x draft)
    prefill s                 prefill_tokens new tokens over an empty cache
    chain {L: s}              a lookup chain of L tokens past the deepest verify depth D:
                              the prefill engine (dynamic S) at S = L + 1 over the past
                              (timed in a round-robin of their own, after the loop's roles),
                              at L = D + 1, 16 and 32 (chain_lengths); ngram.py (lookup
                              chains) and governor.py (DSpark's token-tree rows past D,
                              since session 58) price the lengths between and beyond by
                              straight lines through them
    by_past {p: {verify {d: s}, decode s, draft s, draft_by_depth {k: s}, chain {L: s}}}
    draft_accepted, draft_depth, draft_kind, prefill_tokens
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner, np_dtype
from specrt.engines.plan import DECODE, DRAFT, PREFILL, role_depth
from specrt.errors import InternalError


def synthetic_feeds(runner: Runner, sizes: dict[str, int], vocab: int,
                    rng: np.random.Generator, pool: dict | None = None) -> dict[str, np.ndarray]:
    """Feeds of the runner's inputs with symbolic dims set from ``sizes`` (dim name -> value).

    Past KV tensors are prefix views of a buffer one row longer, as the runtime sends them.
    ``pool`` (a dict the caller keeps): the float inputs (KV caches, hidden states) of each
    name, shape and dtype are drawn once and shared by every feed made with it, as the
    runtime's roles share one KV cache; without it each feed held its own (a profile of
    SmolLM2's engines held ~10 in-place caches of 47 MB at once: 1.38 GB peak RSS against
    the 0.83 GB the engines take to run).
    """
    pool = {} if pool is None else pool

    def draw(name: str, shape: list[int], dt) -> np.ndarray:
        key = (name, tuple(shape), np.dtype(dt).str)
        if key not in pool:
            pool[key] = (rng.standard_normal(shape, dtype=np.float32) * 0.5).astype(dt, copy=False)
        return pool[key]

    past = sizes.get(C.DIM_PAST, 0)
    feeds = {}
    for t in runner.inputs:
        shape = [d if isinstance(d, int) else sizes[d] for d in t.shape]
        if t.name == C.HEAD_EXACT:  # a screened head (specrt/head.py): the greedy path's cost
            feeds[t.name] = np.array(False)
        elif t.optional:  # its default, zeros (logits_from: every row's, a verify's or a chain's cost)
            feeds[t.name] = np.zeros(shape, np_dtype(t.dtype))
        elif t.name == C.INPUT_IDS:
            feeds[t.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif t.name == C.POSITION_IDS:
            feeds[t.name] = np.arange(past, past + shape[1], dtype=np.int64)[None, :]
        elif t.shape[1:2] == (C.DIM_PAST,):
            feeds[t.name] = draw(t.name, [shape[0], shape[1] + 1, *shape[2:]], np_dtype(t.dtype) or np.float32
                                 )[:, :shape[1]]
        else:
            feeds[t.name] = draw(t.name, shape, np_dtype(t.dtype) or np.float32)
    return feeds


def time_calls(runner: Runner, feeds: dict[str, np.ndarray], repeats: int, warmup: int) -> float:
    """Median seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    return time_round_robin([(None, runner, feeds)], repeats, warmup)[None]


def time_round_robin(calls: list[tuple[Any, Runner, dict]], repeats: int, warmup: int) -> dict[Any, float]:
    """Median seconds per key of ``calls`` [(key, runner, feeds)], timed one call of each in
    turn per repeat after ``warmup`` untimed rounds."""
    for _ in range(warmup):
        for _, r, f in calls:
            r.infer(f)
    ts: dict[Any, list[float]] = {key: [] for key, _, _ in calls}
    for _ in range(repeats):
        for key, r, f in calls:
            t0 = time.perf_counter()
            r.infer(f)
            ts[key].append(time.perf_counter() - t0)
    return {key: float(np.median(v)) for key, v in ts.items()}


# The longest lookup chain (ngram.py, corpus.py) priced by default: prompt lookup's
# proposals are one-hot and cost no draft pass, so a long match is worth verifying past
# the deepest verify engine, on the prefill engine. On the target's greedy answers to 16
# prompts that quote their input (edits, code, lists; 981 tokens), a cap of 4 / 8 / 16 /
# 32 tokens left 567 / 528 / 509 / 501 rounds; on prompts asked again with ':grow', a cap
# of 4 / 16 / 32 ran 235 / 438 / 476 tok/s (results/lookup_chains).
CHAIN_TOKENS = 32


def chain_lengths(depths) -> list[int]:
    """The lookup chain lengths profiled on the prefill engine: D + 1, 16 and CHAIN_TOKENS
    (D the deepest built depth), those above D."""
    deepest = max(depths)
    return sorted({L for L in (deepest + 1, 16, CHAIN_TOKENS) if L > deepest})


def fits(runner: Runner, sizes: dict[str, int]) -> bool:
    """Whether a call of ``runner`` with these symbolic dim sizes is within its dims and context."""
    for d, v in sizes.items():
        r = runner.dims.get(d)
        if r is not None and not r.min <= v <= r.max:
            return False
    return sizes[C.DIM_NEW] + sizes.get(C.DIM_PAST, 0) <= runner.max_context


def role_sizes(runner: Runner, past: int, *, draft_depth: int, draft_accepted: int, prefill_tokens: int,
               draft_kind: str | None) -> dict[str, int] | None:
    """Symbolic dim sizes of one profiled call of ``runner`` at ``past``; None if it does not fit."""
    name = runner.name
    if name == PREFILL:
        s, past = min(prefill_tokens, runner.max_context), 0
        sizes = {C.DIM_NEW: s, C.DIM_PAST: past}
    elif name == DRAFT:
        if draft_kind == "peagle":
            a = draft_accepted
            sizes = {C.DIM_NEW: a + draft_depth - 1, C.DIM_AUX: a, C.DIM_PAST: past}
        else:  # EAGLE-3: one drafted token fed back with its hidden state
            sizes = {C.DIM_NEW: 1, C.DIM_AUX: 0, C.DIM_PREV: 1, C.DIM_PAST: past}
    else:
        sizes = {C.DIM_NEW: role_depth(name) + 1, C.DIM_PAST: past}
    return sizes if fits(runner, sizes) else None


def loop_order(runners: dict[str, Runner], past: int, depths: tuple[int, ...], draft_kind: str | None,
               vocab: dict[str, int], graph_of: dict[str, str], kw: dict, rng,
               pool: dict | None = None) -> list[tuple[tuple, Runner, dict]]:
    """One repeat's calls at ``past``, (key, runner, feeds), in the order the runtime makes
    them: ``decode`` (plain steps follow plain steps), then per depth d the draft's pass
    for d and right after it ``verify.d``, so each verify is timed after a draft pass and
    each draft pass after a verify, as in the draft/verify loop. Keys: (role, None), and
    for P-EAGLE's passes of a block other than ``draft_depth``, (draft, k); an EAGLE-3
    step is timed before every verify under its one key. Roles whose shapes do not fit
    at ``past`` are left out. ``pool``: synthetic_feeds'."""
    draft_depth = kw["draft_depth"]
    feeds: dict[tuple, tuple[Runner, dict]] = {}
    for name, r in runners.items():
        if name == PREFILL:
            continue
        sizes = role_sizes(r, past, **kw)
        if sizes is None:
            continue
        feeds[(name, None)] = (r, synthetic_feeds(r, sizes, vocab[graph_of[name]], rng, pool))
        if name == DRAFT and draft_kind == "peagle":
            for k in depths:
                if k != draft_depth:
                    sz = role_sizes(r, past, **{**kw, "draft_depth": k})
                    feeds[(name, k)] = (r, synthetic_feeds(r, sz, vocab["draft"], rng, pool))
    calls = [((DECODE, None), *feeds[(DECODE, None)])] if (DECODE, None) in feeds else []
    drafting = (DRAFT, None) in feeds
    for name in runners:
        if name in (PREFILL, DECODE, DRAFT) or (name, None) not in feeds:
            continue
        d = role_depth(name)
        if drafting:
            key = (DRAFT, None) if draft_kind != "peagle" or d == draft_depth else (DRAFT, d)
            if key in feeds:
                calls.append((key, *feeds[key]))
        calls.append(((name, None), *feeds[(name, None)]))
    seen = {key for key, _, _ in calls}
    calls += [(key, *rf) for key, rf in feeds.items() if key not in seen]  # a draft depth with no verify
    return calls


def chain_calls(runners: dict[str, Runner], past: int, depths: tuple[int, ...], vocab: dict[str, int],
                rng, pool: dict | None = None) -> list[tuple[tuple, Runner, dict]]:
    """The prefill engine's calls for lookup chains of L tokens past the deepest depth
    (chain_lengths), over ``past``: ((prefill, L), runner, feeds), those that fit. Timed in a
    round-robin of their own after the loop's (profile_costs), so that the loop's roles
    keep the neighbours they have in the runtime (a 33-row call before a decode step would
    leave it other caches than a verify does)."""
    r = runners.get(PREFILL)
    out = []
    for L in chain_lengths(depths) if r is not None else []:
        sizes = {C.DIM_NEW: L + 1, C.DIM_PAST: past}
        if fits(r, sizes):
            out.append(((PREFILL, L), r, synthetic_feeds(r, sizes, vocab["target"], rng, pool)))
    return out


def profile_costs(runners: dict[str, Runner], *, vocab: dict[str, int], depths: tuple[int, ...],
                  draft_kind: str | None, pasts: tuple[int, ...] = (128, 512), draft_accepted: int = 2,
                  prefill_tokens: int = 128, repeats: int = 10, warmup: int = 2, seed: int = 0,
                  log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Profile every role. ``runners`` must be active; ``vocab``: graph -> input vocabulary size."""
    rng = np.random.default_rng(seed)
    draft_depth = max(depths)
    kw = dict(draft_depth=draft_depth, draft_accepted=draft_accepted, prefill_tokens=prefill_tokens,
              draft_kind=draft_kind)
    graph_of = {name: ("draft" if name == DRAFT else "target") for name in runners}
    by_past: dict[str, dict[str, Any]] = {}
    for p in pasts:
        # every call to profile at this past: (key, runner, feeds); timed round-robin, one call
        # of each per repeat, so a burst of machine load hits every role alike instead of
        # inflating whichever role it happened to fall on (measured: blocked timing on a
        # shared 2-core machine ranked verify.2 below verify.1)
        pool: dict = {}  # one KV cache (and hidden states) for every call, as the runtime's roles share one
        calls = loop_order(runners, p, depths, draft_kind, vocab, graph_of, kw, rng, pool)
        times = time_round_robin(calls, repeats, warmup)
        chains = chain_calls(runners, p, depths, vocab, rng, pool)
        if chains:
            times.update(time_round_robin(chains, repeats, warmup))
        del calls, chains, pool
        row: dict[str, Any] = {"verify": {}}
        for (name, k), t in times.items():
            if name == PREFILL:
                row.setdefault("chain", {})[str(k)] = t
                continue
            if k is not None:
                continue
            d = role_depth(name)
            if name == DRAFT:
                row["draft"] = t
                if draft_kind == "peagle":  # one pass per block, profiled at every depth
                    row["draft_by_depth"] = {str(j): t if j == draft_depth else times[(name, j)] for j in depths}
                else:  # EAGLE-3: a block of j is j steps
                    row["draft_by_depth"] = {str(j): j * t for j in depths}
            elif name == DECODE:
                row["decode"] = t
            else:
                row["verify"][str(d)] = t
        if row["verify"] and len(row["verify"]) == len(depths):
            by_past[str(p)] = row
            log(f"costs at past {p}: decode {row.get('decode', 0) * 1e3:.2f} ms, "
                + ", ".join(f"verify.{d} {v * 1e3:.2f} ms" for d, v in row["verify"].items())
                + (f", draft {row['draft'] * 1e3:.2f} ms" if "draft" in row else "")
                + "".join(f", chain.{L} {v * 1e3:.2f} ms" for L, v in row.get("chain", {}).items()))
    if not by_past:
        raise InternalError(f"no profiled past length in {list(pasts)} fits the context limit")
    ref = next(iter(by_past))
    table: dict[str, Any] = {
        "unit": "seconds", "statistic": "median", "repeats": repeats, "warmup": warmup,
        "pasts": [int(p) for p in by_past], "reference_past": int(ref),
        **{k: v for k, v in by_past[ref].items()},
        "by_past": by_past,
        "draft_kind": draft_kind, "draft_accepted": draft_accepted, "draft_depth": draft_depth,
        "prefill_tokens": prefill_tokens,
    }
    if PREFILL in runners:
        sizes = role_sizes(runners[PREFILL], 0, **kw)
        table["prefill"] = time_calls(runners[PREFILL], synthetic_feeds(runners[PREFILL], sizes, vocab["target"], rng),
                                      max(1, repeats // 3), 1)
        table["prefill_tokens"] = sizes[C.DIM_NEW]
    return table


# A profile whose process had less of the CPU than this (its threads' CPU time over what they
# asked for: spinning ONNX Runtime threads ask for all of it; the table's ``cpu_share``) was
# measured on a busy machine. `specrt profile` of SmolLM2's engines on the 2-core host of
# 2026-12-05: 0.92 idle, 0.51 beside one busy loop (decode 62 against 18 ms), 0.48 beside two.
BUSY_CPU_SHARE = 0.75


def busy_share(table: dict[str, Any] | None) -> float | None:
    """A cost table's ``cpu_share`` where it says the profile ran on a busy machine (below
    BUSY_CPU_SHARE: every cost inflated), else None (idle, or not recorded)."""
    share = (table or {}).get("cpu_share")
    ok = isinstance(share, (int, float)) and not isinstance(share, bool) and math.isfinite(share)
    return float(share) if ok and 0 <= share < BUSY_CPU_SHARE else None


def busy_note(folder, share: float, who: str) -> str:
    """The note that ``who`` (governors) price their rounds from the cost table of ``folder``,
    profiled on a busy machine (``busy_share``): run's, chat's, serve's and bench's words."""
    return (f"the cost table of {folder} was profiled on a busy machine ({share:.0%} of the CPU time its threads "
            f"asked for): its costs are inflated, and {who} from them; `specrt profile {folder}` measures them "
            "again (when idle)")


def parse_costs(table: dict[str, Any] | None) -> dict[str, Any]:
    """engines.json's table with integer depth and past keys; a cost that is not a positive
    finite number of seconds is a ValueError (typed by hand: a TypeError, or a governor
    that divides by it, later)."""
    if not table:
        return {}

    def sec(v: Any) -> float:
        t = float(v)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"a cost of {v!r}: expected seconds > 0")
        return t

    out = dict(table)
    flat = ("decode", "draft", "prefill")  # the flat figures too (a text value typed by hand: a TypeError later)
    out.update({k: sec(table[k]) for k in flat if k in table})
    out["verify"] = {int(d): sec(v) for d, v in table.get("verify", {}).items()}
    if "chain" in table:
        out["chain"] = {int(L): sec(v) for L, v in table["chain"].items()}
    out["by_past"] = {int(p): {**row, **{k: sec(row[k]) for k in flat if k in row},
                               "verify": {int(d): sec(v) for d, v in row.get("verify", {}).items()},
                               "draft_by_depth": {int(k): sec(v) for k, v in row.get("draft_by_depth", {}).items()},
                               "chain": {int(k): sec(v) for k, v in row.get("chain", {}).items()}}
                      for p, row in table.get("by_past", {}).items()}
    return out


def interpolate(points: dict[int, float], past: int) -> float:
    """Latency at ``past`` from the profiled points: linear between them (attention is
    linear in P); below the first, its value; above the last, the last segment's slope
    when it is positive (a noisy negative slope is not extrapolated)."""
    xs = sorted(points)
    if past <= xs[0] or len(xs) == 1:
        return points[xs[0]]
    if past >= xs[-1]:
        a, b = xs[-2], xs[-1]
        slope = (points[b] - points[a]) / (b - a)
        return points[b] + max(slope, 0.0) * (past - b)
    a, b = next((a, b) for a, b in zip(xs, xs[1:]) if a <= past <= b)
    return points[a] + (points[b] - points[a]) * (past - a) / (b - a)
