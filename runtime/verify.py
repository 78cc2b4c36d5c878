"""Lossless verification of a block of d draft tokens (DESIGN.md §4).

The target scores ``d + 1`` positions in one pass: the last committed token followed by
the d drafts, so row k of its output is the target's distribution for the token after
draft k (row 0: for draft 1's slot; row d: the bonus slot). Both rules return a
``Verdict``: ``accepted`` drafts a (0 <= a <= d) and the ``tokens`` to emit, int64
[a + 1]: the a accepted drafts then one target token (the correction at the first
rejection, or the bonus when all d are accepted). Every round therefore emits >= 1 token.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from specrt.errors import InternalError
from specrt.head import nonfinite_row

from .sampling import check_logits, sample


class Verdict(NamedTuple):
    accepted: int  # a
    tokens: np.ndarray  # int64 [a + 1]
    sibling: int = -1  # a token tree's runner-up j that won position 1 (accepted = 1), else -1


def verify_greedy(logits: np.ndarray | None, draft: np.ndarray, best: np.ndarray | None = None) -> Verdict:
    """Greedy rule: emit argmax(logits[k]) for k = 0, 1, ... up to and including the first
    k where it differs from draft[k]; if all d drafts match, the last one is the bonus.

    logits [d+1, V]; draft int [d] in target ids. The output equals target-only greedy
    decoding token for token, since every emitted token is a target argmax given a
    prefix of target argmaxes. ``best`` [d+1]: the rows' argmaxes when the caller has them
    (a screened head, specrt/head.py; ``logits`` then unused).

    Rows 0..a, the ones used (those target-only decoding computes), must be finite: a NaN
    or +inf row raises. A row past the first rejection is not looked at: it failed the whole
    round, and whether an answer failed hung on how deep the governor verified (a model at
    the edge of overflowing float32 gave an answer more or fewer tokens before its error).
    """
    d = len(draft)
    given = best is not None
    if not given:
        if logits.ndim != 2 or logits.shape[0] != d + 1:
            raise InternalError(f"verify_greedy: logits {logits.shape} for {d} drafts, expected [{d + 1}, V]")
        best = logits.argmax(-1)  # [d+1]; a NaN row's argmax is its first NaN
    elif len(best) != d + 1:
        raise InternalError(f"verify_greedy: {len(best)} argmaxes for {d} drafts, expected {d + 1}")
    match = best[:d] == draft
    a = d if match.all() else int(match.argmin())
    if not given:  # (a non-finite row before a: its argmax "matched" or not, it is one of the rows used)
        check_logits(logits[: a + 1], "target", logits[np.arange(a + 1), best[: a + 1]])
    elif best[a] < 0:  # a screen's non-finite row (HeadScreen.argmax(nonfinite_ok=True): -1, never a draft)
        raise nonfinite_row(a)
    return Verdict(a, best[: a + 1].astype(np.int64))


def scatter_draft_probs(q_draft: np.ndarray, d2t: np.ndarray | None, vocab: int) -> np.ndarray:
    """Draft-vocab probabilities q_draft [d, Vd] -> target-vocab q [d, V] float64.

    ``target_id = draft_id + d2t[draft_id]``; target tokens outside the draft vocabulary
    get q = 0, so verification leaves all their p-mass in the residual (DESIGN.md §4).
    ``d2t`` None means the draft shares the target vocabulary.
    """
    if d2t is None:
        if q_draft.shape[-1] != vocab:
            raise InternalError(f"draft vocab {q_draft.shape[-1]} != target vocab {vocab} and no d2t given")
        return q_draft.astype(np.float64)
    ids = np.arange(len(d2t)) + d2t  # [Vd] target ids
    if q_draft.shape[-1] != len(d2t) or ids.min() < 0 or ids.max() >= vocab:
        raise InternalError(f"d2t of {len(d2t)} entries does not map draft vocab {q_draft.shape[-1]} into [0, {vocab})")
    q = np.zeros((q_draft.shape[0], vocab))
    q[:, ids] = q_draft
    return q


class LazyRows:
    """Rows [n, V] made on first use: ``rows[k]`` is ``make(k)`` (a float64 row [V]), kept.

    Verification reads row k of p and q only while drafts 1..k were accepted: after the
    first rejection no later row is looked at. With acceptance ~0.45 at the first position
    (SmolLM2 sampled at T 0.7), a depth-3 round reads 1.6 of its 4 target rows on average;
    each row costs ~0.2 ms of softmax / top-p over 49152 tokens, which was the larger part
    of a sampled round's Python time and grew with the depth."""

    def __init__(self, make, n: int, width: int):
        self._make, self.shape, self._rows = make, (int(n), int(width)), {}

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, k: int) -> np.ndarray:
        k = int(k)
        if k < 0:  # from the end, as a list counts
            k += self.shape[0]
        if not 0 <= k < self.shape[0]:
            raise IndexError(f"row {k} of {self.shape[0]}")
        row = self._rows.get(k)
        if row is None:
            row = self._rows[k] = self._make(k)
        return row


def one_hot(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """q [d, V] of deterministic (greedy) drafts: all mass on the drafted token."""
    q = np.zeros((len(tokens), vocab))
    q[np.arange(len(tokens)), tokens] = 1.0
    return q


def accept_probability(p: float, q: float) -> float:
    """min(1, p/q) for the drafted token; verify_sampling accepts iff u < it, u ~ U[0, 1).

    q = 0 cannot happen for a token drawn from q (greedy drafts have q = 1 on their
    token); if a caller passes it anyway, any p > 0 accepts (the limit of p/q) and the
    division is never reached: p >= q returns first, and p < q implies q > 0.
    """
    if p <= 0.0:
        return 0.0
    return 1.0 if p >= q else p / q


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalise(max(0, p - q)) [V]: the correction distribution after a rejection.

    A rejection needs p(t) < q(t) for the drafted t, so sum(max(0, p - q)) =
    sum(max(0, q - p)) > 0 in exact arithmetic; if rounding leaves no mass (p ~= q) we fall
    back to p, the distribution the residual would then equal.
    """
    r = np.maximum(p - q, 0.0)
    z = r.sum()
    return r / z if z > 0.0 else p


def verify_coupled(p: np.ndarray | LazyRows, draft: np.ndarray, pick, base: int, siblings=(),
                   p_sibling=None) -> Verdict:
    """Coupled sampling (sampling.CoupledNoise): the token at output position base + k is
    ``pick(p[k], base + k)``, the position's own Gumbel-max draw; draft[k] is accepted when
    it is that token, and the first that is not ends the round with the draw in its place
    (the bonus after d accepted). A runner-up for the first position is accepted when it is
    position base's draw, with the bonus ``pick(p_sibling(j), base + 1)``. Every emitted
    token is thus the draw target-only coupled sampling makes at its position, given the
    same tokens before it: the same text, whatever the drafts."""
    d, sibs = len(draft), [int(b) for b in siblings]
    for k in range(d):
        t = pick(p[k], base + k)
        if t != int(draft[k]):
            if k == 0 and t in sibs:
                j = sibs.index(t)
                return Verdict(1, np.array([t, pick(p_sibling(j), base + 1)], np.int64), j)
            return Verdict(k, np.array([*(int(x) for x in draft[:k]), t], np.int64))
    return Verdict(d, np.array([*(int(x) for x in draft), pick(p[d], base + d)], np.int64))


def verify_sampling(p: np.ndarray | LazyRows, q: np.ndarray | LazyRows, draft: np.ndarray,
                    rng: np.random.Generator, siblings=(), p_sibling=None) -> Verdict:
    """Speculative sampling rule (Leviathan et al. 2023; Chen et al. 2023).

    For k = 0 .. d-1: accept draft[k] with probability min(1, p[k, t] / q[k, t]); at the
    first rejection emit a token ~ normalise(max(0, p[k] - q[k])) and stop. If all d are
    accepted emit the bonus ~ p[d]. The emitted sequence is then distributed exactly as
    sampling from p alone.

    p [d+1, V]: processed target probabilities (sampling.probs); q [>= d, V]: draft
    probabilities in target ids (scatter_draft_probs; one_hot for greedy drafts; rows
    past d are not read); either may be LazyRows, whose rows past the first rejection are
    never made. draft int [d] in target ids; rng: the run's generator (one uniform per
    tested draft, one inverse-CDF uniform for the final token).

    Token trees: ``siblings`` (target ids, distinct from draft[0]) are further candidates
    for the first position, each a deterministic proposal (q = all mass on it). After
    draft[0] is rejected they are tested in turn against the residual r: accepted with
    probability min(1, r(b) / 1) = r(b), else r loses b and is renormalised (the residual
    of a one-hot proposal). The first accepted one is emitted with a bonus token ~
    ``p_sibling(j)``, the target's processed row after it; if none is, the token is drawn
    from what is left of r. Each step is the rule above with a valid proposal, so the
    emitted tokens stay distributed as the target's; without siblings no extra uniform is
    drawn.
    """
    d = len(draft)
    if len(siblings) and p_sibling is None:
        raise InternalError("verify_sampling: siblings without their target rows (p_sibling)")
    if p.shape[0] < d + 1 or q.shape[0] < d or q.shape[1] != p.shape[1]:
        raise InternalError(f"verify_sampling: p {p.shape}, q {q.shape} for {d} drafts, expected [{d + 1}, V] "
                            f"and [>= {d}, V]")
    for k in range(d):
        t = draft[k]
        pk, qk = p[k], q[k]
        if not rng.random() < accept_probability(float(pk[t]), float(qk[t])):
            r = residual(pk, qk)
            if k == 0:
                for j, b in enumerate(siblings):
                    b = int(b)
                    if rng.random() < r[b]:
                        return Verdict(1, np.array([b, sample(p_sibling(j), rng)], np.int64), j)
                    left = 1.0 - r[b]
                    if left <= 0.0:  # r was all on b: the test above accepted (u < 1)
                        break
                    r = r.copy() if j == 0 else r
                    r[b] = 0.0
                    r /= left
            tokens = np.empty(k + 1, np.int64)
            tokens[:k] = draft[:k]
            tokens[k] = sample(r, rng)
            return Verdict(k, tokens)
    tokens = np.empty(d + 1, np.int64)
    tokens[:d] = draft
    tokens[d] = sample(p[d], rng)
    return Verdict(d, tokens)
