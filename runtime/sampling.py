"""Logits -> probabilities (temperature, top-k, top-p) and a seeded sampler.

The processing order is transformers': temperature, then top-k, then top-p. The same
processed distribution ``p`` is what target-only sampling draws from and what
speculative verification (verify.py) must reproduce, so both paths call ``probs``.

    p = softmax(logits / T)               float64, max subtracted first
    top-k:  keep tokens whose logit >= the k-th largest (ties at the edge are kept)
    top-p:  keep the smallest prefix of tokens sorted by p whose mass reaches top_p
            (always at least the most likely token), then renormalise

Temperature 0 is greedy: ``probs`` returns the one-hot of the argmax (first maximum).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from specrt.errors import NonFiniteOutput, UserError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off; seed None = fresh entropy
    (top_k -1 and seed -1 are taken as 0 and None, as vLLM takes them: its clients send them).

    ``coupled``: every token is the Gumbel-max draw of its position's noise (``CoupledNoise``,
    a function of the seed and the position alone), the draft's proposals drawn with the
    same noise and accepted when they equal it (verify.verify_coupled): the text is then
    the one target-only sampling gives with that seed, whatever the drafts, depths, token
    trees, lookup or reuse. Otherwise rejection sampling (verify.verify_sampling), which
    accepts more drafts but whose sample depends on them: the same seed gives the same
    distribution, not the same text."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    coupled: bool = False

    def __post_init__(self):
        if isinstance(self.top_k, (int, np.integer)) and not isinstance(self.top_k, bool) and self.top_k == -1:
            object.__setattr__(self, "top_k", 0)  # vLLM's "off" (its old default)
        if isinstance(self.seed, (int, np.integer)) and not isinstance(self.seed, bool) and self.seed == -1:
            object.__setattr__(self, "seed", None)  # vLLM's "no seed"
        real = lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)  # noqa: E731
        if not (real(self.temperature) and _finite(self.temperature) and self.temperature >= 0):
            raise UserError(f"temperature={self.temperature!r}: expected a finite number >= 0 (0 = greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise UserError(f"top_k={self.top_k!r}: expected an integer >= -1 (0 or -1: off)")
        if not (real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise UserError(f"top_p={self.top_p!r}: expected a number in (0, 1] (1 = off)")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0):
            raise UserError(f"seed={self.seed!r}: expected a non-negative integer or none (-1 = none)")
        if not isinstance(self.coupled, (bool, np.bool_)):  # ("no" is true to Python)
            raise UserError(f"coupled={self.coupled!r:.80}: expected True or False")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def mode(self) -> str:
        """The decoding mode a calibration is fitted for (acceptance depends on it, not on
        the seed): 'greedy', or e.g. 'temperature=0.7,top_k=0,top_p=0.9', with ',coupled'
        for coupled sampling, which accepts fewer drafts than rejection sampling (README:
        0.243 against 0.276 at fixed:2 on the demo's engines)."""
        if self.greedy:
            return "greedy"
        return (f"temperature={float(self.temperature):g},top_k={int(self.top_k)},top_p={float(self.top_p):g}"
                + (",coupled" if self.coupled else ""))

    def as_dict(self) -> dict:
        d = {"temperature": float(self.temperature), "top_k": int(self.top_k), "top_p": float(self.top_p),
             "seed": None if self.seed is None else int(self.seed)}
        if self.coupled:
            d["coupled"] = True
        return d


def _finite(v) -> bool:
    """Whether a real number is finite: an integer past a float's range (10**400) is not
    (np.isfinite raised TypeError on it, not the option's UserError: w73c)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def make_rng(seed: int | None) -> np.random.Generator:
    """The one random source of a run (PCG64): same seed, same tokens."""
    return np.random.default_rng(seed)


def check_logits(logits: np.ndarray, engine: str = "target", rowmax: np.ndarray | None = None,
                 first_row: int = 0) -> np.ndarray:
    """Raise if a row of an engine's logits [S, V] holds NaN or +inf or is all -inf (-inf
    alone is a legal mask). One pass: a row's max is NaN, +inf or -inf exactly then.
    ``rowmax`` [S]: the rows' maxima (or the values at their argmax) when already known;
    ``first_row``: the call's row that ``logits`` start at (the one the error names)."""
    m = logits.max(-1) if rowmax is None else rowmax
    if not np.isfinite(m).all():
        k = int(np.flatnonzero(~np.isfinite(m))[0])
        what = "NaN" if np.isnan(m[k]) else "+inf" if m[k] > 0 else "all -inf"
        raise NonFiniteOutput(f"{engine} engine produced {what} logits in row {first_row + k} of its call")
    return m


def probs(logits: np.ndarray, params: SamplingParams, engine: str = "target",
          rowmax: np.ndarray | None = None) -> np.ndarray:
    """logits [S, V] (any float dtype) -> processed probabilities [S, V] float64, rows sum to 1.
    ``rowmax`` [S]: the rows' maxima when the caller already has them (check_logits)."""
    logits = np.atleast_2d(logits)
    S, V = logits.shape
    p = np.zeros((S, V))
    if params.greedy:
        best = logits.argmax(-1)  # [S]; a NaN row's argmax is its first NaN
        check_logits(logits, engine, logits[np.arange(S), best])
        p[np.arange(S), best] = 1.0
        return p
    m = check_logits(logits, engine, rowmax)  # [S]
    for s in range(S):
        idx, e = _kept(logits[s], float(m[s]), params)
        p[s, idx] = e / e.sum()
    return p


def _kept(x: np.ndarray, m: float, params: SamplingParams) -> tuple[np.ndarray | slice, np.ndarray]:
    """One row x [V] with max m -> (kept token ids, their weights exp((x - m) / T) float64).

    Only the kept tokens are exponentiated and sorted: top-k partitions in O(V); top-p
    sorts only the candidates at or above a weight threshold, starting at 1e-4 of the
    heaviest and lowered until they hold top_p of the mass (with a margin for rounding):
    every token below the threshold then has at least top_p before it in the heaviest-
    first order and is dropped, so the kept set is exactly the whole row's. A threshold
    and a masked sum cost two passes over the row; an argpartition of it cost 0.3 ms a
    row, 12% of a sampled decode's time on SmolLM2's 49152 tokens."""
    V, k, top_p = len(x), params.top_k, params.top_p
    if 0 < k < V:
        idx = np.flatnonzero(x >= np.partition(x, V - k)[V - k])  # ties at the k-th logit kept
    else:
        idx = slice(None)
    with np.errstate(over="ignore"):  # (a temperature of 1e-320: -inf, e 0 there, as intended; numpy's warning
        e = np.exp((x[idx].astype(np.float64) - m) / params.temperature)  # went to stderr, a walk of session 54)
    if top_p < 1.0:
        z = e.sum()
        need = top_p * z * (1.0 + 1e-9)  # the margin keeps the sorted cumulative sum past top_p * z
        t, cand = float(e.max()) * 1e-4, None
        while t > 1e-300:
            mask = e >= t
            if e[mask].sum() >= need:
                cand = np.flatnonzero(mask)  # ascending token ids
                break
            t *= 1e-8
        if cand is None:
            cand = np.arange(len(e))
        order = cand[np.argsort(-e[cand], kind="stable")]  # heaviest first, ties by token id
        se = e[order]
        # keep a token while the mass strictly before it is < top_p: the first always survives
        keep = order[np.cumsum(se) - se < top_p * z]
        idx, e = np.arange(V)[idx][keep], e[keep]
    return idx, e


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from p [V] by inverse CDF with a single uniform; a zero-mass token is never drawn."""
    c = np.cumsum(p)
    i = int(np.searchsorted(c, rng.random() * c[-1], side="right"))
    return i if i < len(c) else int(np.flatnonzero(p)[-1])  # u * c[-1] rounded up to c[-1]


class CoupledNoise:
    """Gumbel-max sampling whose noise is a function of (seed, position) alone.

    The token at output position j is argmin_t E_j[t] / p[t] over the tokens with p > 0,
    E_j [V] i.i.d. Exp(1) drawn for (seed, j): a draw from p exactly (the
    exponential race; argmax log p + Gumbel; E_j from SFC64 seeded through SeedSequence
    with (seed, j), 0.2 ms a position over 49152 tokens). A draft proposing argmin E_j[t] / q[t] with
    the same E_j proposes the target's own draw whenever the two races agree, which they do
    more often the closer q is to p; verification keeps a proposal only when it is that
    draw, so every emitted token is the one target-only sampling with this seed emits."""

    def __init__(self, seed: int | None, vocab: int):
        self.seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**63)
        self.vocab = int(vocab)
        self._e: dict[int, np.ndarray] = {}

    def exp(self, j: int) -> np.ndarray:
        """E_j [V] float64 (kept until ``forget_before`` passes j)."""
        e = self._e.get(j)
        if e is None:
            bits = np.random.SFC64(np.random.SeedSequence([self.seed, int(j)]))
            e = self._e[j] = np.random.Generator(bits).standard_exponential(self.vocab)
        return e

    def pick(self, p: np.ndarray, j: int, ids: np.ndarray | None = None) -> int:
        """The draw of position j from p [V] (target ids), or from p [Vd] over the target ids
        ``ids`` (a draft's own vocabulary; returns a target id)."""
        e = self.exp(j) if ids is None else self.exp(j)[ids]
        with np.errstate(divide="ignore", over="ignore"):
            i = int(np.argmin(e / p))  # p = 0: inf, never the minimum (e > 0, and p sums to 1)
        return int(ids[i]) if ids is not None else i

    def forget_before(self, j: int) -> None:
        for k in [k for k in self._e if k < j]:
            del self._e[k]


class TokenLogprob(NamedTuple):
    """An emitted token's log-probability under the target (``Generator.logprobs``): the
    model's own distribution, log_softmax of its logits before temperature, top-k or
    top-p (as vLLM's default raw logprobs), with the ``top`` most likely tokens' (id,
    logprob), most likely first (ties by id). ``rank``: where asked for (a prompt token's,
    vLLM's prompt_logprobs), how many tokens are at least as likely as it (1: the most likely)."""

    id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int | None = None


def token_logprobs(rows: np.ndarray, tokens, top: int = 0, ranks: bool = False) -> list[TokenLogprob]:
    """rows [n, V] (the target's logits for each token's position), tokens [n] -> one
    TokenLogprob each (with its rank where ``ranks``: vLLM's, the count of logits >= its own):
    exp in float32 on one temporary after the max is subtracted, summed in float64 (1e-10 from
    a float64 log-sum-exp on SmolLM2's rows). ~0.15 ms a row of 49152 on the AVX2 host, 0.25 ms
    with 5 alternatives (a partition), against ~19 ms a token."""
    out = []
    for row, t in zip(np.atleast_2d(rows), tokens):
        x = np.asarray(row, np.float32)
        m = float(x.max())
        if not np.isfinite(m):
            raise NonFiniteOutput("target engine produced non-finite logits (logprobs)")
        e = x - m
        np.exp(e, out=e)
        lse = m + math.log(float(e.sum(dtype=np.float64)))
        best: tuple[tuple[int, float], ...] = ()
        if top > 0:
            k = min(top, len(x))
            kth = x[np.argpartition(x, len(x) - k)[len(x) - k:]].min()
            idx = np.flatnonzero(x >= kth)  # every token tied at the cut too, so that ties go by id
            idx = idx[np.lexsort((idx, -x[idx]))][:k]
            best = tuple((int(i), float(x[i]) - lse) for i in idx)
        rank = int(np.count_nonzero(x >= x[int(t)])) if ranks else None
        out.append(TokenLogprob(int(t), float(x[int(t)]) - lse, best, rank))
    return out
