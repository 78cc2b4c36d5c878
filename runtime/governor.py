"""Depth governors: how many drafts the target verifies each round (DESIGN.md §5).

The depths are those the engines were built for (verify graphs specialised per depth,
e.g. (1, 2, 4, 8)); 0 means no speculation (a plain decode step). Once per round:

    d = gov.choose(GovernorState())               # before drafting: 0 = plain decode step
    if d and gov.uses_confidences:                # DSpark: draft the full block (largest
        d = gov.choose(GovernorState(confidences=conf))   # built depth), then pick d <= K
    ... draft (if not done), verify d tokens ...
    gov.observe(RoundResult(...))                 # telemetry.RoundResult

``conf`` [K] is the largest probability of the draft's distribution at depths 1..K (the
max of its softmax, computed before the token at that depth is drawn: never the drawn
token's own probability, which would make the depth depend on the draft it verifies).
``GovernorState.limit`` caps the answer (tokens left, context room): a governor then
returns the largest built depth <= limit, or 0.

Lossless whatever is chosen, greedy or sampled, with one rule for sampling: whether the
draft at depth k is verified may depend on what was known before it was drawn, not on
it. P-EAGLE's confidences come from one pass before any draw; an EAGLE-3 step's comes
after the previous step's drawn token, so under rejection sampling its round asks with
``GovernorState(stopping=True)`` and DSpark decides the depth as a stopping rule (its
``_stopping_depth``): choosing the depth on every confidence of the block would verify a
sampled draft more often when it led to confident later steps, which biases the output
(a 3-token example: 0.600 / 0.240 / 0.160 against the target's 0.5 / 0.3 / 0.2).
"""

from __future__ import annotations

import abc
import inspect
import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specrt.engines.costs import interpolate
from specrt.errors import NonFiniteOutput, UserError
from specrt.limits import digits, whole

from .telemetry import RoundResult


# Context length at which the cost table is read for a governor's (and prompt lookup's)
# first rounds; online factors from the measured times take over from there.
COST_PAST = 256


@dataclass(frozen=True)
class GovernorState:
    confidences: np.ndarray | None = None  # [K] the max of the draft's distribution at depth 1..K
    limit: int | None = None  # largest depth the scheduler can take this round
    # confidence k + 1 depends on the draft drawn at depth k (EAGLE-3 under rejection
    # sampling): verify draft k only on what was known before it was drawn (module docstring)
    stopping: bool = False


def check_depths(depths: Sequence[int]) -> tuple[int, ...]:
    """The built depths as a sorted tuple of distinct positive integers."""
    try:
        ds = tuple(sorted(set(int(d) for d in depths)))
        ok = bool(ds) and ds[0] >= 1 and all(int(d) == d for d in depths)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"built depths {depths!r}: expected one or more positive integers")
    return ds


def depth_at_least(depths: Sequence[int], d: int) -> int:
    """The smallest of ``depths`` >= d, else the largest: what a round of d (a budget-cut
    depth, a token tree's extra rows, a draft block) is costed as from a table of built ones."""
    return next((b for b in sorted(depths) if b >= d), max(depths))


class Governor(abc.ABC):
    uses_confidences = False  # True: wants a second choose() with the drafted block's confidences
    tree_width = 1  # > 1: each round also verifies the draft's runners-up for position 1 (from_spec ':tree=W')
    lookup = False  # True: prompt lookup may take a round before this governor's (':ngram', ngram.py)
    lookup_policy = None  # its ngram.NgramPolicy, made by the generator at the first stream
    corpus = False  # True: the lookup also searches the engines' corpus (':corpus', corpus.py)
    grow = False  # True: ... and the session's own finished sequences (':grow', corpus.Growth)
    lookup_chain = None  # ':ngram=L': the longest lookup chain verified (None: ngram.NgramPolicy's default)
    # the lookup policy of predicted outputs (prediction.py) under a governor without lookup: made at
    # the first stream given one, its rates learnt across them
    prediction_policy = None

    def __init__(self, depths: Sequence[int]):
        self.depths = check_depths(depths)

    def round_siblings(self) -> int:
        """How many of the draft's runners-up for position 1 the round just chosen verifies
        beside its chain (a token tree; 0 <= n < tree_width): all of them, unless the
        governor sizes the tree each round (DSpark)."""
        return self.tree_width - 1

    @abc.abstractmethod
    def choose(self, state: GovernorState) -> int:
        """The verify depth for this round (0 = a plain decode step)."""

    def observe(self, result: RoundResult) -> None:
        pass

    def start_stream(self) -> None:
        """A stream (a prompt) starts on the generator: a governor whose state belongs to
        one stream forgets the last one's (what it learns across streams it keeps)."""

    def _cap(self, d: int, state: GovernorState) -> int:
        if state.limit is None or d <= state.limit:
            return d
        return self.depths[bisect_right(self.depths, state.limit) - 1] if state.limit >= self.depths[0] else 0


class OffGovernor(Governor):
    """Depth 0 every round: target-only decoding through the same scheduler."""

    def __init__(self, depths: Sequence[int] = (1,)):
        super().__init__(depths)

    def choose(self, state: GovernorState) -> int:
        return 0


class FixedGovernor(Governor):
    def __init__(self, depths: Sequence[int], k: int):
        super().__init__(depths)
        if k != 0 and k not in self.depths:
            raise UserError(f"depth {k!r} is not built; available depths: {', '.join(map(str, self.depths))} (or 0: no speculation)")
        self.k = int(k)

    def choose(self, state: GovernorState) -> int:
        return self._cap(self.k, state)


class AdaptiveGovernor(Governor):
    """onnxruntime-genai 0.18's adaptive K (AdaptiveKController), on the built depths.

    Per depth K an estimate of committed tokens, seconds and acceptance, each an EWMA
    where a new round weighs 25%. A round's acceptance is accepted / evaluated, evaluated
    = accepted + 1 at a rejection, K when all are accepted; its throughput is committed
    tokens (accepted + 1) / (t_draft + t_verify). Only rounds at the current K train it.

    * no probe running, cooldown over, K's estimate has >= 2 samples:
      acceptance < 50% and K above the floor -> probe K-1;
      acceptance >= 75%, K below the ceiling, >= 2 rounds since the last move -> probe K+1.
    * while probing: throughput < 80% of the origin's -> revert at once; after 2 rounds
      keep K' iff throughput >= 97% of the origin's (and, going up, acceptance >= 75%).
    * then wait 1 round after a kept probe, 6 after a reverted one.

    Interpretation: K-1 / K+1 are the adjacent *built* depths (1, 2, 4, 8 -> from 4 the
    probes are 2 and 8), since only those have engines. The floor and start is
    ``min_depth`` (onnxruntime-genai's min_adaptive_k), default the smallest built depth;
    the ceiling is the largest built depth (it has 16). Its cooldown (a plain step after
    three zero-accept rounds, off by default there) is not part of this rule.
    """

    ALPHA, HIGH, LOW, KEEP, SEVERE = 0.25, 0.75, 0.50, 0.97, 0.80
    MIN_SAMPLES, PROBE_SAMPLES, COOLDOWN_KEPT, COOLDOWN_REVERTED = 2, 2, 1, 6

    def __init__(self, depths: Sequence[int], min_depth: int | None = None):
        super().__init__(depths)
        self.min_depth = self.depths[0] if min_depth is None else min_depth
        if self.min_depth not in self.depths:
            raise UserError(f"adaptive min depth {min_depth!r} is not built; available depths: {', '.join(map(str, self.depths))}")
        self.increases = self.decreases = self.probes = self.observations = 0  # over the governor's life
        self.start_stream()

    def start_stream(self) -> None:
        """onnxruntime-genai's controller lives in its Generator, one per request: each
        stream starts at the floor with no estimates."""
        self.k = self.min_depth
        self.est = {d: [0.0, 0.0, 0.0, 0] for d in self.depths}  # d -> [tokens, seconds, acceptance, samples]
        self.origin = 0  # K the running probe started from; 0: none
        self.probe_rounds = self.stable_rounds = self.cooldown = 0

    def choose(self, state: GovernorState) -> int:
        return self._cap(self.k, state)

    def throughput(self, d: int) -> float:
        tok, sec, _, _ = self.est[d]
        return tok / sec if sec > 0 else 0.0

    def observe(self, r: RoundResult) -> None:
        total = r.t_draft + r.t_verify
        # a catch-up pass (a stream's prompt, or the rows of lookup rounds and plain steps) costs
        # what no choice of K changes; counted, it priced the K it landed on 2-10x too slow
        # (onnxruntime-genai's draft takes the prompt in at prefill, outside any round)
        if r.depth != self.k or r.depth == 0 or r.catch_up or not np.isfinite(total) or total <= 0:
            return
        e = self.est[self.k]
        # (a round the grammar ended at an accepted draft, cut_at_eos: that draft taken, none after judged)
        sample = (float(r.emitted), total, (r.accepted + r.cut_at_eos) / min(r.accepted + 1, r.depth))
        if e[3] == 0:
            e[:3] = sample
        else:
            for j in range(3):
                e[j] += self.ALPHA * (sample[j] - e[j])
        e[3] += 1
        self.observations += 1

        if self.origin:
            self.probe_rounds += 1
            base, now = self.throughput(self.origin), self.throughput(self.k)
            if base > 0 and now < base * self.SEVERE:
                self._finish_probe(keep=False)
            elif self.probe_rounds >= self.PROBE_SAMPLES:
                fast = base <= 0 or now >= base * self.KEEP
                accepting = self.k < self.origin or e[2] >= self.HIGH
                self._finish_probe(keep=fast and accepting)
            return

        self.stable_rounds += 1
        if self.cooldown > 0:
            self.cooldown -= 1
            return
        if e[3] < self.MIN_SAMPLES:
            return
        i = self.depths.index(self.k)
        if e[2] < self.LOW and self.k > self.min_depth:
            self._start_probe(self.depths[i - 1])
        elif e[2] >= self.HIGH and i + 1 < len(self.depths) and self.stable_rounds >= self.MIN_SAMPLES:
            self._start_probe(self.depths[i + 1])

    def _move(self, d: int) -> None:
        self.increases += d > self.k
        self.decreases += d < self.k
        self.k = d

    def _start_probe(self, d: int) -> None:
        self.origin, self.probe_rounds, self.stable_rounds = self.k, 0, 0
        self.probes += 1
        self._move(d)

    def _finish_probe(self, keep: bool) -> None:
        if not keep:
            self._move(self.origin)
        self.origin = self.probe_rounds = self.stable_rounds = 0
        self.cooldown = self.COOLDOWN_KEPT if keep else self.COOLDOWN_REVERTED


# ---- DSpark-style choice --------------------------------------------------------------


def ece(pred: np.ndarray, observed: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error: sum_b (n_b / N) |mean(pred_b) - mean(observed_b)|,
    equal-width bins of pred over [0, 1]."""
    pred, observed = np.asarray(pred, float), np.asarray(observed, float)
    if pred.size == 0:
        return 0.0
    b = np.minimum((np.clip(pred, 0.0, 1.0) * bins).astype(int), bins - 1)
    gap = np.bincount(b, pred, bins) - np.bincount(b, observed, bins)
    return float(np.abs(gap).sum() / pred.size)


def auc(score: np.ndarray, label: np.ndarray) -> float | None:
    """Area under the ROC curve of ``score`` for the binary ``label``: the probability that a
    random positive scores above a random negative (ties count half; Mann-Whitney U from
    average ranks). None when either class is empty. Calibration (ECE) says whether a
    confidence means what it says on average; this says how well it tells rounds apart."""
    score, label = np.asarray(score, float), np.asarray(label, float) > 0.5
    n_pos, n_neg = int(label.sum()), int((~label).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(len(s))
    start = 0
    for end in np.append(np.flatnonzero(np.diff(s)) + 1, len(s)):  # runs of equal scores share their mean rank
        ranks[start:end] = (start + end + 1) / 2.0
        start = end
    r = np.empty(len(s))
    r[order] = ranks
    return float((r[label].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _pav(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted isotonic (non-decreasing) fit of y by pool-adjacent-violators."""
    vals, wts, sizes = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist()):
        vals.append(yi), wts.append(wi), sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v, wt, s = vals.pop(), wts.pop(), sizes.pop()
            vals[-1] = (vals[-1] * wts[-1] + v * wt) / (wts[-1] + wt)
            wts[-1] += wt
            sizes[-1] += s
    return np.repeat(vals, sizes)


def _numbers(x) -> bool:
    """``x`` (a stored calibration's counts) is a number or nested lists of numbers, no string,
    boolean or null among them (numpy reads "1" and true as 1.0)."""
    if isinstance(x, list):
        return all(_numbers(v) for v in x)
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _shape_error(n: np.ndarray, a: np.ndarray, bins: int) -> str:
    """A stored calibration's counts / accepted of the wrong shape: one row of ``bins`` a position."""
    return f"calibration JSON: counts {n.shape} / accepted {a.shape} inconsistent with {bins} bins"


class Calibration:
    """Per-position map from draft confidence to conditional acceptance c_k.

    Sufficient statistics: per position k and confidence bin b (B equal bins of [0, 1]),
    n[k, b] rounds that reached position k with a confidence in b and a[k, b] of them
    accepted. The map is piecewise linear through the knots

        x = (0, centre_1 .. centre_B, 1)
        y = (a_1 / (n_1 + m), (a_b + m centre_b) / (n_b + m) for each b, (a_B + m) / (n_B + m))

    i.e. the bin acceptance rate shrunk towards the identity with m pseudo-rounds, so an
    empty calibration *is* the identity (the documented default when none is stored) and
    it moves to the data as rounds arrive. "isotonic" additionally makes y non-decreasing
    (weighted PAV, weights n + m). "temperature" is DSpark's per-position temperature
    scaling: y = sigmoid(logit(x) / T_k) at the same knots, T_k found by a grid search
    (TEMPERATURES) for the highest likelihood of those shrunk bins (no data gives T_k = 1,
    the identity; DSpark searches for the lowest ECE instead, which recovered a known T
    less closely here: 1.76-2.18 for 2, against 1.92-2.18 by likelihood, 5000 rounds a
    position); one parameter a position, it cannot follow a
    draft whose miscalibration changes sign along the confidence axis, and it pays no
    variance for bins with few rounds. ``fit`` picks the kind with the lowest 2-fold held-out
    ECE; ``update`` adds one round's observations online and refits every ``refit_every``
    rounds; a position holding more than ``window`` rounds halves its counts (forgetting).
    Positions past the last one share its map (DSpark extends a calibration fitted on
    shallower engines to its depth with identity positions: extend_to). Stored as JSON
    (to_dict / from_dict).

    ``runner_ups`` (optional, ``specrt calibrate`` on engines that verify token trees): per
    runner-up rank j = 2, 3, ... the rounds whose first draft was rejected with that rank
    verified beside it (tries) and those it won (wins), in this decoding mode: DSpark's
    starting rates for token trees.
    """

    KINDS = ("histogram", "isotonic", "temperature")
    # T grid of the "temperature" kind: 1/8 .. 8, 1 included, geometric (step ~ 4.4%)
    TEMPERATURES = np.exp(np.linspace(-math.log(8.0), math.log(8.0), 97))

    def __init__(self, kind: str = "histogram", positions: int = 8, bins: int = 20, prior: float = 4.0,
                 window: int = 4096, refit_every: int = 32):
        if kind not in self.KINDS:
            raise UserError(f"calibration kind {kind!r}: expected one of {', '.join(self.KINDS)}")
        if positions < 1 or bins < 1 or not prior > 0 or not math.isfinite(prior) or window < 1 or refit_every < 1:
            raise UserError(f"calibration positions={positions}, bins={bins}, prior={prior}, window={window}, "
                            f"refit_every={refit_every}: expected positive values")
        self.kind, self.bins, self.prior, self.window, self.refit_every = kind, int(bins), float(prior), int(window), int(refit_every)
        self.n = np.zeros((positions, bins))  # [P, B]
        self.a = np.zeros((positions, bins))  # [P, B]
        self.centres = (np.arange(bins) + 0.5) / bins  # [B]
        self.xs = np.concatenate(([0.0], self.centres, [1.0]))  # [B+2]
        self._xs = self.xs.tolist()
        self._pending = 0
        self.runner_ups: tuple[list[float], list[float]] | None = None  # (wins, tries) per rank
        self.temperatures: list[float] | None = None  # per position, kind "temperature" (refit)
        self.refit()

    @property
    def positions(self) -> int:
        return self.n.shape[0]

    def _temperature_knots(self, n: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Per position, the T of TEMPERATURES whose map sigmoid(logit(centre_b) / T) gives the
        (shrunk) bins n [P, B] / a [P, B] the highest likelihood; the map's knots [P, B+2]."""
        T = self.TEMPERATURES  # [G]
        z = np.log(self.centres) - np.log1p(-self.centres)  # logit of the bin centres [B]
        pred = 1.0 / (1.0 + np.exp(-z[None, :] / T[:, None]))  # [G, B]
        err = -(a[:, None, :] * np.log(pred)[None] + (n - a)[:, None, :] * np.log1p(-pred)[None]).sum(2)  # [P, G]
        # the lowest error; among Ts within float rounding of it, the one nearest 1
        best = err <= err.min(1, keepdims=True) * (1 + 1e-9) + 1e-12
        g = np.where(best, np.abs(np.log(T))[None, :], np.inf).argmin(1)  # [P]
        self.temperatures = T[g].tolist()
        return np.concatenate((np.zeros((n.shape[0], 1)), pred[g], np.ones((n.shape[0], 1))), 1)

    def refit(self) -> None:
        m, n, a = self.prior, self.n, self.a
        y = np.concatenate((a[:, :1] / (n[:, :1] + m), (a + m * self.centres) / (n + m), (a[:, -1:] + m) / (n[:, -1:] + m)), 1)
        if self.kind == "isotonic":
            w = np.concatenate((n[:, :1], n, n[:, -1:]), 1) + m
            y = np.stack([_pav(yk, wk) for yk, wk in zip(y, w)])
        elif self.kind == "temperature":
            y = self._temperature_knots(n + m, a + m * self.centres)
        self.ys = y  # [P, B+2]
        self._rows = y.tolist()  # the same knots as Python lists: the per-round path avoids numpy overhead
        # per position, the largest c_k among the confidence bins it has data for (>= 3
        # rounds; the empty bins' identity prior would say 1.0); a position with no such bin
        # takes the previous position's bound (later drafts are not easier), the first 1.0
        seen = n >= 3
        upper, prev = [], 1.0
        for k in range(n.shape[0]):
            prev = float(y[k, 1:-1][seen[k]].max()) if seen[k].any() else prev
            upper.append(prev)
        self.upper = upper
        self._pending = 0

    def predict(self, confidence: np.ndarray, position: np.ndarray) -> np.ndarray:
        """c = map_k(confidence) elementwise, position k (0-based) per element."""
        x = np.clip(np.asarray(confidence, float), 0.0, 1.0)
        j = np.minimum(np.searchsorted(self.xs, x, side="right") - 1, self.bins)  # knot left of x
        k = np.minimum(position, self.positions - 1)
        x0, x1 = self.xs[j], self.xs[j + 1]
        y0, y1 = self.ys[k, j], self.ys[k, j + 1]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def __call__(self, confidences: Sequence[float]) -> list[float]:
        """confidences [K] at depths 1..K -> c [K]; ``predict`` for one round, in plain Python
        (a few microseconds for K <= 8, where numpy's per-call overhead would dominate)."""
        out, xs, rows, B = [], self._xs, self._rows, self.bins
        for k, x in enumerate(confidences):
            x = 0.0 if x < 0.0 else 1.0 if x > 1.0 else x
            j = min(int(x * B + 0.5), B)  # knot left of x: knots are 0, (i - 0.5) / B, 1
            y = rows[k] if k < len(rows) else rows[-1]
            out.append(y[j] + (y[j + 1] - y[j]) * (x - xs[j]) / (xs[j + 1] - xs[j]))
        return out

    def _add(self, confidence: np.ndarray, position: np.ndarray, accepted: np.ndarray) -> None:
        b = np.minimum((np.clip(confidence, 0.0, 1.0) * self.bins).astype(int), self.bins - 1)
        k = np.minimum(position, self.positions - 1)
        np.add.at(self.n, (k, b), 1.0)
        np.add.at(self.a, (k, b), np.asarray(accepted, float))

    def update(self, confidences: np.ndarray, accepted: int) -> None:
        """One verified round: confidences [d] of the verified drafts, ``accepted`` of them taken.
        Positions 1..min(accepted+1, d) were reached; the first ``accepted`` were accepted."""
        n, a, B, P = self.n, self.a, self.bins, self.positions
        for k in range(min(accepted + 1, len(confidences))):
            x = float(confidences[k])
            if not math.isfinite(x):
                raise NonFiniteOutput(f"draft engine produced a non-finite confidence {x} at position {k + 1}")
            b = min(max(int(x * B), 0), B - 1)
            n[min(k, P - 1), b] += 1.0
            a[min(k, P - 1), b] += k < accepted
        self._pending += 1
        if self._pending >= self.refit_every:
            full = self.n.sum(1) > self.window
            self.n[full] *= 0.5
            self.a[full] *= 0.5
            self.refit()

    @classmethod
    def fit(cls, confidence, position, accepted, kinds: Sequence[str] = KINDS, groups=None, **kw) -> Calibration:
        """Fit from (confidence, position, accepted) triples, choosing the kind by held-out ECE
        (per position, weighted by its samples).

        2-fold cross-validation; ``groups`` (e.g. the prompt each sample came from) keeps a
        group's samples in one fold: rounds of one prompt are alike, so folds that split a
        prompt reward a map for having learnt that prompt. ``cv_by_position`` records, per
        position, the chosen kind's fold-held-out ECE next to the raw confidence's."""
        conf, pos, acc = (np.asarray(v) for v in (confidence, position, accepted))
        if not (conf.shape == pos.shape == acc.shape) or conf.ndim != 1:
            raise UserError("calibration fit: confidence, position and accepted must be 1-D of equal length")
        kw.setdefault("positions", int(pos.max()) + 1 if pos.size else 8)
        if groups is not None and np.shape(groups) != conf.shape:
            raise UserError("calibration fit: groups must have one entry per sample")
        first = (np.asarray(groups) % 2 == 0) if groups is not None else None
        if first is None or first.all() or not first.any():  # no groups, or all in one fold
            # alternate whole rounds (a round's samples come in a run of rising positions),
            # not samples: alternating samples put positions 1 and 2 of one round in both folds
            starts = np.r_[True, pos[1:] <= pos[:-1]] if pos.size else np.zeros(0, bool)
            first = (np.cumsum(starts) - 1) % 2 == 0
        folds = (first, ~first)
        scores, held = {}, {}
        k_held = np.minimum(pos, kw["positions"] - 1)
        for kind in kinds:
            pred = np.zeros(conf.size)
            for train, test in (folds, folds[::-1]):
                cal = cls(kind, **kw)
                cal._add(conf[train], pos[train], acc[train])
                cal.refit()
                pred[test] = cal.predict(conf[test], pos[test])
            # per position, weighted by its samples (the maps are per position, and so is the
            # target: ECE <= 0.05 at each; a pooled ECE let errors of two positions cancel)
            scores[kind] = sum(ece(pred[m], acc[m]) * m.sum() for m in (k_held == k for k in np.unique(k_held))) \
                / max(conf.size, 1)
            held[kind] = pred
        best = min(scores, key=scores.get)  # ties: first listed
        cal = cls(best, **kw)
        cal._add(conf, pos, acc)
        by_position = {}
        for k in range(cal.positions):
            m = k_held == k
            if m.any():
                by_position[k + 1] = {"fitted": ece(held[best][m], acc[m]),
                                      "identity": ece(np.clip(conf[m], 0.0, 1.0), acc[m]), "n": int(m.sum())}
        cal.refit()
        cal.cv_ece = scores
        cal.cv_by_position = by_position
        return cal

    def softened(self, rounds: float) -> Calibration:
        """A copy whose counts are scaled down to at most ``rounds`` per position (the same
        map, less weight): a prior that online updates soon outweigh. The runner-up rates
        go along as they are (DSpark already weighs them as at most 64 rounds)."""
        cal = Calibration(self.kind, positions=self.positions, bins=self.bins, prior=self.prior,
                          window=self.window, refit_every=self.refit_every)
        total = self.n.sum(1, keepdims=True)  # [P, 1]
        f = np.where(total > rounds, rounds / np.maximum(total, 1e-300), 1.0)
        cal.n, cal.a = self.n * f, self.a * f
        if self.runner_ups is not None:
            cal.runner_ups = (list(self.runner_ups[0]), list(self.runner_ups[1]))
        cal.refit()
        return cal

    def extend_to(self, positions: int) -> None:
        """Adds empty positions (the identity map, no rounds) up to ``positions``; in place
        (DSpark's own copy: make_governor copies the session's)."""
        more = positions - self.positions
        if more > 0:
            self.n = np.concatenate((self.n, np.zeros((more, self.bins))))
            self.a = np.concatenate((self.a, np.zeros((more, self.bins))))
            self.refit()

    def copy(self) -> Calibration:
        """An independent copy (counts, runner-up rates): what one governor learns online
        stays its own."""
        return Calibration.from_dict(self.to_dict())

    def to_dict(self) -> dict:
        d = {"format": "specrt.calibration/1", "kind": self.kind, "bins": self.bins, "prior": self.prior,
             "window": self.window, "refit_every": self.refit_every,
             "counts": self.n.tolist(), "accepted": self.a.tolist()}
        if self.runner_ups is not None:
            d["runner_ups"] = {"wins": list(self.runner_ups[0]), "tries": list(self.runner_ups[1])}
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> Calibration:
        try:
            if d["format"] != "specrt.calibration/1":
                raise UserError(f"calibration format {d['format']!r}: expected 'specrt.calibration/1'")
            # (hand edits were read loosely: "1" and true as counts, "bins" 20.7 as 20, "prior" "4" as 4)
            for key in ("counts", "accepted"):
                if not _numbers(d[key]):
                    raise UserError(f"calibration JSON: {key!r} holds a value that is not a number (a string, "
                                    "boolean or null): expected nested lists of numbers")
            for key in ("bins", "window", "refit_every"):  # (0 or less: said by the constructor)
                if not whole(d[key]):
                    raise UserError(f"calibration JSON: {key!r} {d[key]!r}: expected a whole number")
            if isinstance(d["prior"], bool) or not isinstance(d["prior"], (int, float)):
                raise UserError(f"calibration JSON: 'prior' {d['prior']!r}: expected a number")
            n, a = np.asarray(d["counts"], float), np.asarray(d["accepted"], float)
            bins = d["bins"]
            # (before the map's [P, bins] arrays are made: a hand-edited bins of 10**9 was an out-of-memory
            # error naming no file, beside counts of one row or three levels too; none, or a scalar: said below)
            if n.ndim and n.size and 0 < bins and n.shape[1:] != (bins,):
                raise UserError(_shape_error(n, a, bins))
            cal = cls(d["kind"], positions=n.shape[0], bins=bins, prior=float(d["prior"]),
                      window=d["window"], refit_every=d["refit_every"])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise UserError(f"calibration JSON is malformed ({type(e).__name__}: {e}); expected Calibration.to_dict() output") from None
        if n.shape != cal.n.shape or a.shape != n.shape:
            raise UserError(_shape_error(n, a, cal.bins))
        # (NaN passes every comparison: the map would say nan; said as "inconsistent with 20 bins"
        # where the shapes were right and a count was not)
        bad = ~(np.isfinite(n) & np.isfinite(a) & (a >= 0) & (a <= n))
        if bad.any():
            k, b = np.argwhere(bad)[0]
            raise UserError(f"calibration JSON: position {k + 1}, bin {b + 1}: counts {n[k, b]:g} / accepted "
                            f"{a[k, b]:g}: expected finite numbers with 0 <= accepted <= counts")
        cal.n, cal.a = n, a
        if d.get("runner_ups") is not None:
            try:
                w, t = (list(map(float, d["runner_ups"][k])) for k in ("wins", "tries"))
            except (KeyError, TypeError, ValueError) as e:
                raise UserError(f"calibration JSON: runner_ups malformed ({type(e).__name__}: {e}); expected "
                                "{'wins': [...], 'tries': [...]}") from None
            if len(w) != len(t) or any(not 0 <= wi <= ti for wi, ti in zip(w, t)):
                raise UserError(f"calibration JSON: runner_ups wins {w} / tries {t}: expected 0 <= wins <= tries, "
                                "one of each per rank")
            cal.runner_ups = (w, t)
        cal.refit()
        return cal


SHAPE_WINDOW = 200  # rounds: a depth measured within them is one of the shapes kept at mean 1
# A round's measured time moves DSpark's cost factors as if it were at most this many times
# its current price (or at least its 1 / OUTLIER): one stalled call (a preempted thread, a
# page fault: 40x on a shared 2-core host) priced its depth 14% above the others for 100+
# rounds and every target call 10x for ~10; a lasting change still takes over, 1.5x a round
# (the shape factors learn from the rounds within those bounds only).
OUTLIER = 3.0


def _clip_outlier(t: float, price: float) -> float:
    return min(max(t, price / OUTLIER), price * OUTLIER)


class DSparkGovernor(Governor):
    """Verify the length with the best expected tokens per second (vLLM's rule, DSpark's survival).

        c_k = calibration_k(confidence_k)        conditional acceptance of draft k
        S_k = prod_{j<=k} c_j                    P(first k drafts all accepted)
        E(d) = 1 + sum_{k<=d} S_k                expected tokens of a round verifying d
        d*  = argmax_d E(d) / (t_draft + t_verify(d)),   d over the built depths <= K

    Ties go to the smaller depth (strict improvement needed). d = 0 (E = 1) is a candidate
    once the plain decode step's cost t_verify(0) is known (given, or measured on the
    first depth-0 round); after drafting its cost is t_draft + t_verify(0), since the draft
    is already paid.

    Before drafting there are no confidences, so the pre-draft call decides whether to
    draft and how deep: the block K is the depth the rule would pick under optimistic
    conditional acceptances u_k (lower ones only shrink the later S_k, so they never
    favour a deeper block), with the draft's cost for K blocks (``t_draft`` may map K ->
    seconds: a P-EAGLE pass grows with its mask slots, EAGLE-3 takes K steps). u_k is a
    decaying maximum of the calibrated c_k of recent rounds (``ceiling_decay`` per round,
    starting at 1, capped by ``Calibration.upper``); every ``full_every``-th pre-draft
    call drafts the full block so that every position's u_k stays measured. Drafting a block no
    round can verify is waste: measured on SmolLM2-135M with the committed draft, the
    full 8-deep block cost DSpark 2-7% against fixed depths. ``ceiling_decay`` 0.05 and
    ``full_every`` 64 (were 0.02 and 16) replayed 1.007x / 1.012x the old pair on the 60
    calibration / 80 held-out prompts' recorded rounds with ``:tree=3``, better on every
    prompt kind; a block that knew the round's confidences would reach 1.029x / 1.028x
    (tools/exp_draft_block.py, results/draft_block). Live, interleaved on 20 held-out
    prompts: 1.012x the old pair with ``:tree=3``, 1.001x with ``:tree=3:ngram``, where
    lookup takes many of the rounds (tools/exp_dspark_ab.py). No draft at all when the
    rate drafting is expected to give, an EWMA (weight ``RATE_EMA``) of each decided round's
    best predicted rate max_d E(d) / (t_draft + t_verify(d)) on its calibrated confidences
    (predicted, not measured tokens: those follow from the calibration, refined online), is
    <= 1 / t_verify(0). A per-position EWMA of acceptance in the formula
    instead proved too noisy (0/1 samples) and switched speculation off for long spells.
    After ``probe_every`` consecutive pre-draft 0s one round drafts anyway, so the rate
    cannot freeze. Costs are the profiled table times load factors, EWMAs (weight ``ema``)
    of measured / profiled time (see ``observe``); the calibration is updated online from
    every verified round when ``learn``.

    Token trees (``:tree=W``): the round may also verify the draft's first n <= W - 1
    runners-up for position 1, worth (1 - c_1) x R_n tokens (R_n: the summed per-rank
    rates at which they win a round whose first draft is rejected, learnt online) for the
    rows of depth d + n; the rule maximises over (d, n), so a confident first draft is
    verified alone and an unsure one with the runners-up that pay. d + n is priced as the
    built depth's verify where one is built, and past the deepest one as the prefill engine's
    call of that length (``t_chain``, the cost table's chains: the engine such a round runs
    on, as a fixed ``:tree=W`` round does); other unbuilt lengths are not chosen. Until
    2026-12-05 (session 58) d + n stopped at the deepest built depth: with depths 1-4, the
    demo's build, d = 3 took one runner-up and d = 4 none; on a build-time table profiled
    under load `dspark:tree=3:ngram` ran at 0.91x `fixed:3:tree=3:ngram` on 10 held-out
    prompts, 0.98x with the chains priced (results/draft_stage9; re-profiled idle, 1.00x).
    On 80 held-out SmolLM2 prompts' recorded rounds (tools/exp_tree_width.py) sizing the tree
    per round replayed at 1.034x the best fixed (d, W) against 1.015x for a fixed W = 3
    (rows priced at the next built depth).
    """

    uses_confidences = True
    RATE_EMA = 0.1  # weight of a round in the pre-draft rate (costs use ``ema``)
    # (wins, tries) of the runner-up of rank j + 2 before any tree round: the calibration's
    # measured rate (Calibration.runner_ups) weighted as at most SIBLING_PRIOR_MAX tries,
    # else rates 1/4, 1/8, 1/16, ... of SIBLING_PRIOR_TRIES (measured on SmolLM2-135M + the
    # committed draft, 4965 rounds: 0.25, 0.11, 0.07 of the rounds whose first draft was
    # rejected); learnt online from there
    SIBLING_PRIOR_TRIES = 8.0
    SIBLING_PRIOR_MAX = 64.0

    def __init__(self, depths: Sequence[int], t_draft: float | Mapping[int, float], t_verify: Mapping[int, float],
                 calibration: Calibration | None = None, *, ema: float = 0.25, probe_every: int = 16,
                 full_every: int = 64, learn: bool = True,
                 ceiling_decay: float = 0.05, shape_ema: float = 0.05, block: int | None = None,
                 shape_window: int = SHAPE_WINDOW, t_chain: Mapping[int, float] | None = None):
        super().__init__(depths)
        if block is not None and int(block) not in self.depths:
            raise UserError(f"dspark block {block}: expected one of the built depths {list(self.depths)}")
        # a fixed pre-draft block (None: sized each round from the ceilings u_k below)
        self.block = None if block is None else int(block)
        missing = [d for d in self.depths if d not in t_verify]
        if missing:
            raise UserError(f"cost table lacks depth(s) {missing}; it has {sorted(t_verify)}, built depths {list(self.depths)}")
        by_k = {int(k): v for k, v in t_draft.items()} if isinstance(t_draft, Mapping) else {self.depths[-1]: t_draft}
        chain = {int(k): v for k, v in (t_chain or {}).items()}
        for d, t in [*((f"draft.{k}", v) for k, v in by_k.items()), *t_verify.items(),
                     *((f"chain.{L}", v) for L, v in chain.items())]:
            if not (np.isfinite(t) and t > 0):
                raise UserError(f"cost of {d!r} = {t!r} s: expected a positive number of seconds")
        # a verify of L > the deepest built depth on the prefill engine (the cost table's chains,
        # profiled, interpolated between their lengths; chains at or below the deepest depth
        # run on that depth's engine, so they are left out)
        self._p_chain = {L: float(t) for L, t in chain.items() if L > self.depths[-1]}
        # draft cost per block depth K: profiled K's, others from the nearest profiled K at or
        # above (a deeper block costs at least as much), else the deepest
        ks = sorted(by_k)
        self._p_draft_by = {k: float(by_k[depth_at_least(ks, k)]) for k in range(1, self.depths[-1] + 1)}
        self.ceiling = [1.0] * self.depths[-1]  # u_k: decaying max of recent calibrated c_k
        self.ceiling_decay = float(ceiling_decay)
        self._since_full = 0  # drafted rounds since the last full block
        self.t_verify = {d: float(t_verify[d]) for d in self.depths}  # seconds, EWMA-refreshed
        self.t_decode = float(t_verify[0]) if 0 in t_verify else None  # plain decode step
        self.calibration = calibration if calibration is not None else Calibration(positions=self.depths[-1])
        # a calibration fitted on shallower engines: the positions it never saw start as the
        # identity, each learning its own map online (as session.shallower_note says), rather
        # than sharing the last fitted position's map and pooling their rounds into its counts
        self.calibration.extend_to(self.depths[-1])
        self.ema, self.probe_every, self.learn = ema, probe_every, learn
        self.full_every = int(full_every)
        self.rate: float | None = None  # EWMA of max_d E(d) / (t_draft + t_verify(d)) over drafted rounds
        self._zeros = 0
        # profiled costs (the cost table) and the load factors observe() keeps
        self._p_verify, self._p_decode = dict(self.t_verify), self.t_decode
        self.load_target = self.load_draft = 1.0
        # per-depth shape factors (0: the plain decode step): measured / (load x profiled) of
        # the depths actually verified, a slow EWMA (``shape_ema``), so that a depth whose
        # cost relative to the others differs from the build's table (another machine state,
        # a longer context) is costed as measured
        self.shape = {d: 1.0 for d in (0, *self.depths)}
        self.shape_ema = float(shape_ema)
        # the round each depth's shape was last measured: the shapes of those measured within
        # SHAPE_WINDOW rounds keep a geometric mean of 1 (observe), the common factor in
        # load_target, so that depths not measured lately follow it
        self._shaped: dict[int, int] = {}
        self._rounds = 0
        self.shape_window = int(shape_window)  # 0: no pinning (the drifting behaviour, for A/B runs)
        # token trees (tree_width W > 1, set by from_spec after construction): per runner-up
        # rank j, how often it wins position 1 when the first draft is rejected (counts with
        # a prior, observe); j runners-up are worth (1 - c_1) x (the sum of their rates) in
        # E(d), and each round verifies the number 0..W-1 with the best rate (choose)
        self.sib_wins: list[float] = []
        self.sib_tries: list[float] = []
        self._sibs = 0  # runners-up the last choose() picked

    def _grow_ranks(self) -> None:
        measured = self.calibration.runner_ups or ([], [])
        while len(self.sib_wins) < self.tree_width - 1:
            j = len(self.sib_wins)
            if j < len(measured[1]) and measured[1][j] > 0:
                tries = min(measured[1][j], self.SIBLING_PRIOR_MAX)
                self.sib_wins.append(tries * measured[0][j] / measured[1][j])
                self.sib_tries.append(tries)
            else:
                self.sib_wins.append(self.SIBLING_PRIOR_TRIES / 2 ** (j + 2))
                self.sib_tries.append(self.SIBLING_PRIOR_TRIES)

    def _win_rates(self) -> list[float]:
        """[n]: P(one of the first n runners-up wins | the first draft is rejected), n = 0..W-1;
        n runners-up add (1 - c_1) x [n] expected tokens to a round (``_best_tree``)."""
        self._grow_ranks()
        out = [0.0]
        for w, t in zip(self.sib_wins, self.sib_tries):
            out.append(out[-1] + w / t)
        return out

    def round_siblings(self) -> int:
        return self._sibs

    def verify_cost(self, m: int) -> float | None:
        """Seconds to verify m tokens now: verify.m where built, past the deepest built depth
        the prefill engine's call (the profiled chains, interpolated, times the target's load
        factor); None where neither prices it (an unbuilt length between built depths, or no
        chains profiled)."""
        if m in self.t_verify:
            return self.t_verify[m]
        if m > self.depths[-1] and self._p_chain:
            return self.load_target * interpolate(self._p_chain, m)
        return None

    def _best_tree(self, e: float, c1: float, t_draft: float, d: int, rates: list[float] | None = None
                   ) -> tuple[float, int]:
        """(best rate, runners-up) of a round verifying d drafts whose chain expects e tokens:
        each number n of runners-up 0..W-1 adds its value and costs the rows of depth d + n
        (``verify_cost``: built depths, and past the deepest one the prefill engine's chains)."""
        best, sibs = e / (t_draft + self.t_verify[d]), 0
        rates = self._win_rates() if rates is None else rates
        for n in range(1, self.tree_width):
            t = self.verify_cost(d + n)
            if t is not None:
                rate = (e + (1.0 - c1) * rates[n]) / (t_draft + t)
                if rate > best:  # strict: ties keep the smaller tree
                    best, sibs = rate, n
        return best, sibs

    @property
    def t_draft(self) -> float:
        """Seconds to draft the full block (the deepest built depth), as draft_cost gives it."""
        return self.draft_cost(self.depths[-1])

    def _profiled_draft(self, k: int) -> float:
        """The cost table's seconds to draft a block of k (k clamped to 1..deepest)."""
        return self._p_draft_by[min(max(int(k), 1), self.depths[-1])]

    def draft_cost(self, k: int) -> float:
        """Seconds to draft a block of k (profiled, times the draft's load factor)."""
        return self.load_draft * self._profiled_draft(k)

    def _ceilings(self) -> list[float]:
        """u_k: the decaying ceilings of recent calibrated c_k, capped by ``Calibration.upper``."""
        cap = self.calibration.upper
        return [min(u, cap[k] if k < len(cap) else cap[-1]) for k, u in enumerate(self.ceiling)]

    def draft_depth(self, limit: int | None = None) -> int:
        """The block worth drafting: the rule's pick under the optimistic u_k (the decaying
        ceiling of recent calibrated c_k, capped by ``Calibration.upper``), each block
        depth K costing ``draft_cost(K) + t_verify(K)``."""
        up = self._ceilings()
        top = self.depths[-1] if limit is None else min(self.depths[-1], limit)
        best, best_rate, e, s, rates = 0, -1.0, 1.0, 1.0, self._win_rates()
        for k in range(1, top + 1):
            s *= up[k - 1] if k <= len(up) else up[-1]
            e += s
            if k in self.t_verify:
                rate = self._best_tree(e, up[0], self.draft_cost(k), k, rates)[0]
                if rate > best_rate:
                    best, best_rate = k, rate
        return best

    def choose(self, state: GovernorState) -> int:
        if state.confidences is None:
            return self._draft_or_not(state)
        # Plain Python on K <= 16 floats: a few microseconds, no per-round numpy arrays.
        conf = state.confidences[: self.depths[-1]]
        conf = conf.tolist() if isinstance(conf, np.ndarray) else list(conf)
        if not all(map(math.isfinite, conf)):
            raise NonFiniteOutput(f"draft engine produced non-finite confidences {conf}")
        c = self.calibration(conf)
        t_draft = self.draft_cost(len(c))  # paid already: common to every choice below
        if state.stopping:  # the ceilings as they stood before this round's confidences
            up = self._ceilings()
        keep = 1.0 - self.ceiling_decay
        for k, ck in enumerate(c[: len(self.ceiling)]):
            u = self.ceiling[k] * keep
            self.ceiling[k] = ck if ck > u else u
        limit = len(c) if state.limit is None else min(len(c), state.limit)
        tree = self.tree_width > 1
        rates = self._win_rates() if tree else None
        if state.stopping:
            return self._stopping_depth(c, up, limit, t_draft, rates)
        best, best_rate, sibs, e, s, i, depths = 0, -1.0, 0, 1.0, 1.0, 0, self.depths
        for k in range(1, limit + 1):
            s *= c[k - 1]  # S_k
            e += s  # E(k)
            if k == depths[i]:
                # a tree: the best number of runners-up for this depth, their value and rows
                rate, n = self._best_tree(e, c[0], t_draft, k, rates) if tree else (e / (t_draft + self.t_verify[k]), 0)
                if rate > best_rate:  # strict: ties keep the smaller depth
                    best, best_rate, sibs = k, rate, n
                i += 1
                if i == len(depths):
                    break
        if best:  # the rate the pre-draft call expects from drafting: a smoothed prediction
            self.rate = best_rate if self.rate is None else self.rate + self.RATE_EMA * (best_rate - self.rate)
        self._sibs = sibs
        if self.t_decode is not None and best_rate <= 1.0 / (t_draft + self.t_decode):
            self._sibs = 0
            return 0
        return best

    def _stopping_depth(self, c: list[float], up: list[float], limit: int, t_draft: float,
                        rates: list[float] | None) -> int:
        """The verify length as a stopping rule (``GovernorState.stopping``). From built depth
        d_i (0 at first) the round goes on to the next built depth only when the rule, knowing
        c_1 .. c_{d_i + 1} (the confidences drawn before the draft at d_i + 1) and taking the
        pre-round ceilings u for the positions past them, strictly prefers a depth beyond d_i
        to stopping at d_i (at 0: a plain decode step after drafting, when its cost is known).
        So whether draft k is verified depends on drafts before k only, and rejection
        sampling stays exact. The runners-up (a tree) are sized for the depth reached; they
        are tested against the residual after the first draft's rejection, exact for any
        list of them."""
        tree = rates is not None
        built = [k for k in self.depths if k <= limit]
        top = built[-1] if built else 0
        surv, exp = [1.0], [1.0]  # S_k and E(k) on this round's confidences, k = 0..top
        for k in range(top):
            surv.append(surv[-1] * c[k])
            exp.append(exp[-1] + surv[-1])

        def rate(k: int, e: float) -> tuple[float, int]:  # built depth k whose chain expects e
            return self._best_tree(e, c[0], t_draft, k, rates) if tree else (e / (t_draft + self.t_verify[k]), 0)

        cur, cur_rate, sibs = 0, (-1.0 if self.t_decode is None else 1.0 / (t_draft + self.t_decode)), 0
        for nxt in built:
            known = min(cur + 1, top)  # c_1 .. c_known were known before the draft at depth cur + 1 was drawn
            best_rate, s, e = cur_rate, surv[known], exp[known]
            for k in range(known, top + 1):  # past `known`, the ceilings u_k stand in for c_k
                if k > known:
                    s *= up[k - 1]
                    e += s
                if k > cur and k in built:
                    best_rate = max(best_rate, rate(k, e)[0])
            if best_rate <= cur_rate:  # strict: ties stop at the smaller depth
                break
            cur = nxt
            cur_rate, sibs = rate(cur, exp[cur])  # E(cur) on the confidences known from here on
        # the rate the pre-draft call expects from drafting, as the full rule prices it (on every
        # confidence, known now: this round is decided), also when the round stopped at 0; left
        # unset then, the pre-draft call never learnt that drafting does not pay
        full = max((rate(k, exp[k])[0] for k in built), default=-1.0)
        if full > 0:
            self.rate = full if self.rate is None else self.rate + self.RATE_EMA * (full - self.rate)
        self._sibs = sibs if cur else 0
        return cur

    def _draft_or_not(self, state: GovernorState) -> int:
        self._since_full += 1
        if self.block is not None:
            full = self._cap(self.block, state)
        elif self._since_full >= self.full_every:  # refresh every position's ceiling
            self._since_full = 0
            full = self._cap(self.depths[-1], state)
        else:
            full = self.draft_depth(state.limit)
        if full and self.t_decode is not None and self.rate is not None \
                and self.rate <= 1.0 / self.t_decode and self._zeros < self.probe_every:
            self._zeros += 1
            return 0
        self._zeros = 0
        return full

    def observe(self, r: RoundResult) -> None:
        """Refresh costs through two load factors (measured / profiled): one for the target,
        one for the draft. A single factor moves every target cost together, so depths not
        verified lately still follow the machine's current speed (per-depth EWMAs left the
        unvisited depths at their build-time figures while load changed, and DSpark then
        verified drafts that could not pay off). On top of it, each verified depth's shape
        factor (a slower EWMA of measured / (load x profiled)) corrects the table's ratios
        between depths: measured on SmolLM2, a build-time table gave verify.2 / verify.1 =
        1.01 where the same engines later took 1.06, and a shared factor alone kept that
        error, so DSpark verified 2-3 deep too often."""
        a = self.ema
        if r.t_draft > 0 and not r.catch_up:  # a drafted round (DSpark may verify 0 after drafting)
            # A catch-up pass (the prompt's, or after lookup rounds / plain steps) also took in
            # the rows of steps it did not draft for, and costs more with each. What those rows
            # cost is paid whatever the governor decides, so it has no place in its prices:
            # counted, they left the load at 1.8-2.1 after 10 prompts with prompt lookup
            # (1.08 without), and DSpark priced every draft at about twice its cost.
            k = len(r.confidences) if r.confidences is not None else self.depths[-1]
            t = _clip_outlier(r.t_draft, self.load_draft * self._profiled_draft(k))
            self.load_draft += a * (t / self._profiled_draft(k) - self.load_draft)
        # the rows it ran: verify.m where built; a tree cut to fit the context's end (generate.py
        # trims its runners-up) may have run a length between the built depths on the prefill
        # engine, which no depth's price is: it teaches nothing (it trained the next deeper depth)
        d = m = r.depth + r.siblings
        if r.t_verify <= 0:  # no timing (a round that did not run the target): nothing to learn
            pass
        elif m > self.depths[-1] and self._p_chain:
            # a tree past the deepest depth ran on the prefill engine: the load factor learns
            # from it (against the chain's profiled cost); no depth's shape does, and the
            # shapes' pinning is left as it stood
            p = interpolate(self._p_chain, m)
            t = _clip_outlier(r.t_verify, self.load_target * p)
            self.load_target += a * (t / p - self.load_target)
        elif d == 0 and self._p_decode is None:
            self._p_decode = r.t_verify / self.load_target
        elif d == 0 or d in self._p_verify:
            p = self._p_decode if d == 0 else self._p_verify[d]
            t = _clip_outlier(r.t_verify, self.load_target * p * self.shape[d])
            self.load_target += a * (t / (p * self.shape[d]) - self.load_target)
            if t == r.t_verify:  # (a stall says nothing about the ratios between depths)
                self.shape[d] += self.shape_ema * (t / (p * self.load_target) - self.shape[d])
            # Only load x shape is measured: noise walked the two apart along that free
            # direction (load up, the measured shapes down; after 20,000 rounds of 20% noise
            # load 10x, so unvisited depths and the decode step priced 2-10x their cost).
            # Pinning the measured shapes' geometric mean at 1 moves the common part to load.
            self._rounds += 1
            self._shaped[d] = self._rounds
            live = [k for k, at in self._shaped.items() if self._rounds - at < self.shape_window]
            g = math.exp(sum(math.log(self.shape[k]) for k in live) / len(live)) if live else 1.0
            for k in live:
                self.shape[k] /= g
            self.load_target *= g
        self.t_verify = {k: self.load_target * p * self.shape[k] for k, p in self._p_verify.items()}
        if self._p_decode is not None:
            self.t_decode = self.load_target * self._p_decode * self.shape[0]
        if r.siblings and (r.sibling >= 0 or r.accepted == 0) and not r.cut_at_eos:  # the first draft was rejected
            self._grow_ranks()
            for j in range(min(r.siblings, len(self.sib_tries))):  # every rank verified: won or not
                self.sib_tries[j] += 1.0
                self.sib_wins[j] += float(r.sibling == j)
        if r.depth and self.learn and r.confidences is not None:
            # a runner-up's win is the chain's first draft rejected: the calibration maps the
            # draft's confidence in its own first choice. A round the grammar ended at an accepted
            # draft (cut_at_eos: no other round a governor sees has it, generate.py) took that draft;
            # the positions after it were never judged
            if r.cut_at_eos:
                self.calibration.update(r.confidences[: r.accepted + 1], r.accepted + 1)
            else:
                self.calibration.update(r.confidences[: r.depth], 0 if r.sibling >= 0 else r.accepted)


SPECS = ("auto | off | fixed:K | adaptive | dspark[:block=K][:profiled], each but auto and off [:tree=W], "
         "each [:ngram[=L]] [:corpus] [:grow[=TOKENS]]")


def is_dspark(spec: str | int) -> bool:
    """Whether a governor spec names DSpark (``dspark`` or ``dspark:<options>``): it needs the cost table."""
    s = str(spec).strip().lower()
    return s == "dspark" or s.startswith("dspark:")


def split_lookup(spec: str | int) -> tuple[str, bool]:
    """(governor spec, prompt lookup): an ``:ngram`` option after any governor (``off:ngram``:
    prompt lookup alone) lets ngram.py's lookup take rounds before the governor's;
    ``:corpus`` (corpus.py) does too, with the engines' corpus beside the context, and
    ``:grow`` with the session's own finished sequences (with or without the corpus; ``:grow=N``
    keeps the latest N tokens of them, corpus.GROW_TOKENS without). ``:ngram=L`` verifies
    lookup chains of L tokens at most (default: the longest the cost table prices, ngram.py)."""
    parts = [_option(p) for p in str(spec).strip().lower().split(":")]
    for opt in LOOKUP_OPTIONS:
        if parts[1:].count(opt) > 1 or parts[0] == opt:
            raise UserError(f"governor '{spec}': ':{opt}' goes once, after a governor ({SPECS})")
    n = sum(parts[1:].count(opt) for opt in LOOKUP_OPTIONS)
    return ":".join(p for i, p in enumerate(parts) if i == 0 or p not in LOOKUP_OPTIONS), n > 0


LOOKUP_OPTIONS = ("ngram", "corpus", "grow")


def _option(part: str) -> str:
    """A spec part's option name: ``grow=N`` is ``grow``, ``ngram=L`` is ``ngram``; any other part is itself."""
    for opt in ("grow", "ngram"):
        if part.startswith(opt + "="):
            return opt
    return part


def has_lookup_option(spec: str | int, opt: str) -> bool:
    """Whether a governor spec has the option ``:opt`` after its governor (LOOKUP_OPTIONS)."""
    return opt in [_option(p) for p in str(spec).strip().lower().split(":")[1:]]


def _option_value(spec: str | int, opt: str, var: str, what: str) -> int | None:
    """The number of a spec's ``:opt=<var>`` (>= 1), None for a bare ``:opt`` or none."""
    for p in str(spec).strip().lower().split(":")[1:]:
        if p.startswith(opt + "="):
            n = p[len(opt) + 1:]
            if not digits(n) or int(n) < 1:
                raise UserError(f"governor '{spec}': ':{opt}={var}' takes {what} {var} >= 1 ({SPECS})")
            return int(n)
    return None


def without_growth(spec: str) -> str:
    """``spec`` less its ``:grow`` / ``:grow=N`` (`specrt serve --isolate-clients`)."""
    return ":".join(p for p in str(spec).split(":") if _option(p.lower()) != "grow")


def grow_tokens(spec: str | int) -> int | None:
    """The token cap of a spec's ``:grow=N`` (N >= 1), corpus.GROW_TOKENS for a bare
    ``:grow``, None without it."""
    from .corpus import GROW_TOKENS

    n = _option_value(spec, "grow", "N", "a number of tokens")
    return n if n is not None else (GROW_TOKENS if has_lookup_option(spec, "grow") else None)


def lookup_chain(spec: str | int) -> int | None:
    """The longest lookup chain of a spec's ``:ngram=L`` (L >= 1); None for a bare
    ``:ngram`` or none (ngram.NgramPolicy's default)."""
    return _option_value(spec, "ngram", "L", "a chain length in tokens")


def wants_corpus(spec: str | int) -> bool:
    """Whether a governor spec has ``:corpus`` (corpus lookup, corpus.py)."""
    return has_lookup_option(spec, "corpus")


def wants_grow(spec: str | int) -> bool:
    """Whether a governor spec has ``:grow`` (session growth, corpus.Growth)."""
    return has_lookup_option(spec, "grow")


def learnt_across_streams(spec: str | int) -> list[str]:
    """What a governor of ``spec`` (``auto`` resolved) learns from a stream and keeps for the
    next, named for a user (``specrt bench --processes N`` warns of it): [] where every
    stream decodes as the first would (off, fixed:K, adaptive: its controller starts each
    stream afresh; the corpus is read-only)."""
    base, lookup = split_lookup(spec)
    out = []
    if is_dspark(base):  # (':profiled' keeps the cost table's costs: no online factors)
        out.append("DSpark's online calibration" + ("" if "profiled" in base.split(":") else " and cost factors"))
    if lookup:  # (':corpus' and ':grow' are prompt lookup too)
        out.append("prompt lookup's rates")
    if wants_grow(spec):
        out.append(":grow's sequences")
    return out


def split_tree(spec: str | int, asked: str | int | None = None) -> tuple[str, int]:
    """(governor spec, token tree width): a trailing ``:tree=W`` (W >= 1) is the width of
    the token tree each round verifies (generate.py; 1, the default, is a chain). ``asked``:
    the spec as the user wrote it (``spec`` less its lookup options), for the errors."""
    s = str(spec).strip().lower()
    spec = spec if asked is None else asked
    head, sep, tail = s.rpartition(":tree=")
    if not sep:
        return s, 1
    base = head.split(":")[0]
    if base in ("off", "auto"):
        raise UserError(f"governor '{spec}': '{base}' takes no ':tree=W' ("
                        + ("auto picks its tree itself" if base == "auto" else "nothing is drafted")
                        + f"; a tree goes after a speculative governor: {SPECS})")
    if ":tree=" in head:
        raise UserError(f"governor '{spec}': ':tree=W' is given twice")
    if ":" in tail:
        after = tail.split(":")[1:]
        unknown = [p for p in after if not (p == "profiled" or p.startswith("block="))]
        if unknown:  # (it said the tree was misplaced, of 'dspark:tree=3:ngram:bogus', and never named 'bogus')
            raise UserError(f"governor '{spec}': unknown option '{unknown[0]}' (expected {SPECS})")
        raise UserError(f"governor '{spec}': ':tree=W' goes after the governor's own options, e.g. "
                        "dspark:block=4:tree=3 (lookup options after it: dspark:tree=3:ngram)")
    if not digits(tail) or int(tail) < 1 or not head:
        raise UserError(f"governor '{spec}': ':tree=W' takes a width W >= 1 after a speculative governor "
                        f"({SPECS})")
    return head, int(tail)


def canonical_spec(spec: str | int) -> str:
    """One spelling per governor, for labels and duplicates (``specrt bench --governors``):
    lower case, ``fixed:0`` as ``off``, numbers without leading zeros, DSpark's options as
    ``:block=K`` then ``:profiled``, then ``:tree=W`` (W > 1), then the lookup options as
    ``:ngram[=L]:corpus:grow[=N]`` (``:grow=N`` of the default cap is a bare ``:grow``). What
    the parser would refuse is refused here in its words; a spec it reads otherwise (an
    unknown name, a depth not built) is only lower-cased, left to ``from_spec``."""
    from .corpus import GROW_TOKENS

    base, lookup = split_lookup(spec)
    head, width = split_tree(base, spec)
    parts = head.split(":")
    if parts[0] == "fixed" and len(parts) == 2 and digits(parts[1]) or len(parts) == 1 and digits(parts[0]):
        k = int(parts[-1])
        head = "off" if k == 0 and width == 1 else f"fixed:{k}"
    elif parts[0] == "dspark":
        opts = parts[1:]
        blocks = [o for o in opts if o.startswith("block=") and digits(o[6:])]
        if len(blocks) + opts.count("profiled") == len(opts) and len(blocks) <= 1 and opts.count("profiled") <= 1:
            head = ":".join(["dspark", *(f"block={int(b[6:])}" for b in blocks), *(["profiled"] if "profiled" in opts
                                                                                   else [])])
    out = head + (f":tree={width}" if width > 1 else "")
    if lookup:
        chain = lookup_chain(spec)
        if has_lookup_option(spec, "ngram"):
            out += ":ngram" + (f"={chain}" if chain is not None else "")
        if wants_corpus(spec):
            out += ":corpus"
        if wants_grow(spec):
            cap = grow_tokens(spec)
            out += ":grow" + (f"={cap}" if cap != GROW_TOKENS else "")
    return out


def from_spec(spec: str | int, depths: Sequence[int], *, t_draft: float | Mapping[int, float] | None = None,
              t_verify: Mapping[int, float] | None = None, calibration: Calibration | None = None,
              options: Mapping[str, object] | None = None, t_chain: Mapping[int, float] | None = None) -> Governor:
    """'off' | 'fixed:K' (or K) | 'adaptive' | 'dspark', each but 'off' with an optional
    ':tree=W' -> a Governor over the built depths (its ``tree_width`` W, 1 without); any
    with ':ngram' -> its ``lookup`` set (prompt lookup, ngram.py).
    DSpark needs the cost table: ``t_draft`` (seconds, or block depth -> seconds) and
    ``t_verify`` (depth -> seconds; 0: a plain decode step), and prices a token tree past
    the deepest depth with ``t_chain`` (verified length L -> seconds on the prefill engine,
    the cost table's chains; ignored by the other governors); ``options`` are more of
    DSparkGovernor's keyword arguments (ceiling_decay=..., ...), for DSpark only."""
    s, lookup = split_lookup(spec)
    s, width = split_tree(s, spec)
    options = dict(options or {})
    if t_chain and is_dspark(s):
        options.setdefault("t_chain", t_chain)
    gov = _from_spec(s, spec, depths, t_draft, t_verify, calibration, options)
    gov.tree_width = width
    gov.lookup = lookup
    gov.corpus = wants_corpus(spec)
    gov.grow = wants_grow(spec)
    gov.grow_tokens = grow_tokens(spec)
    gov.lookup_chain = lookup_chain(spec)
    return gov


def _from_spec(s: str, spec, depths, t_draft, t_verify, calibration, options: dict) -> Governor:
    k = s[6:] if s.startswith("fixed:") else s
    if options and not is_dspark(s):
        raise UserError(f"governor '{spec}': options {sorted(options)} are DSpark's; this governor takes none")
    if s == "off":
        return OffGovernor(depths)
    if s == "adaptive":
        return AdaptiveGovernor(depths)
    if is_dspark(s):
        if t_draft is None or t_verify is None:
            raise UserError("governor 'dspark' needs the profiled cost table (t_draft, t_verify per depth)")
        kw: dict = {}
        for opt in s.split(":")[1:]:  # dspark[:block=K][:profiled]
            if opt.startswith("block=") and digits(opt[6:]) and "block" not in kw:
                kw["block"] = int(opt[6:])
            elif opt == "profiled" and "ema" not in kw:  # costs stay the cost table's: no online factors
                kw.update(ema=0.0, shape_ema=0.0)
            elif opt.startswith("block=") or opt == "profiled":
                raise UserError(f"governor '{spec}': expected dspark[:block=K][:profiled], each once, K a built depth; "
                                f"got ':{opt}'")
            else:  # (an unknown option named, and the whole grammar: it said dspark[:block=K][:profiled] alone)
                raise UserError(f"governor '{spec}': unknown option '{opt}' (expected {SPECS})")
        known = set(inspect.signature(DSparkGovernor.__init__).parameters) - {"self", "depths", "t_draft", "t_verify",
                                                                                "calibration"}
        bad = sorted(set(options) - known)
        if bad:
            raise UserError(f"DSpark option(s) {bad}: expected some of {sorted(known)}")
        try:
            return DSparkGovernor(depths, t_draft, t_verify, calibration, **{**kw, **options})
        except UserError as e:  # (a block not built: named as the other spec errors are)
            if "block" not in kw or str(e).startswith("governor '"):
                raise
            raise UserError(f"governor '{spec}': {e}") from None
    if digits(k):
        try:
            return FixedGovernor(depths, int(k))
        except UserError as e:  # named as the other spec errors are
            raise UserError(f"governor '{spec}': {e}") from None
    raise UserError(f"governor '{spec}': expected one of {SPECS} "
                    f"(built depths: {', '.join(map(str, check_depths(depths)))})")
