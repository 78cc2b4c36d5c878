"""Prompt lookup beside the draft (``--governor SPEC:ngram``).

Small models decoding greedily repeat themselves, and answers repeat their prompts
(names, code, list items): the tokens that followed the last earlier occurrence of the
context's final n tokens are then a free proposal, with no draft pass. Measured on the
target's greedy answers to the draft's 12,554 TRAIN prompts, first 128 tokens of each
(``tools/lookup_priors.py``, results/lookup_priors/train.json; never the held-out prompts
the benchmarks use): the context's last 4 tokens occurred before at 19% of the positions,
and the 8 tokens that followed them there were accepted with conditional rates 0.80, 0.84,
0.87, 0.89, 0.90, 0.92, 0.93, 0.93 (the trained draft's first position: ~0.55); 3- and
2-token matches were weaker (first position 0.58 and 0.51). On the 80 held-out answers
the figures were close (4-gram 0.77, 0.82, 0.84, ..; 3-gram 0.61; 2-gram 0.52; 1-gram
0.20, too weak to use).

``NgramIndex`` keeps, for n = 2..4, the position after the last earlier occurrence of every
n-gram of the context (prompt and output), updated as tokens arrive: a lookup is one
dict access per n. ``NgramPolicy`` decides each round, before the draft would run,
whether to verify the lookup's tokens instead: the chain length L maximising

    (1 + sum_{k <= L} S_k) / (t_verify(L) + t_python)

over the built depths L and, past the deepest D, any L up to the longest chain (32 tokens,
or ``:ngram=L``), against the measured tokens per second of the rounds that drafted (the governor's own
route, which keeps every round the policy passes on). A chain past D costs no draft pass and
runs on the prefill engine (dynamic length) at the price the cost table profiled for it
(engines/costs.py chain_lengths: L = D + 1, 16 and 32, straight lines between and beyond;
tables profiled before 2026-12-02 have none, and their lookup stops at D unless
``:ngram=L`` asks for more, priced on the verify engines' last slope). Why: a lookup's
matches are often longer than D (on 16 prompts that quote their input, 85 of 151 lookup
rounds capped at 4 tokens were fully accepted; results/lookup_chains). S_k are products of per-position
conditional acceptance rates for the match length n, learnt online from priors (the
figures above, weighted as 16 rounds). Costs are the engines' table times a load factor
learnt from every round's measured target time.

The rates are learnt in hindsight (``note`` / ``settle``): every proposal a round was
offered, verified or not, is tallied against the tokens the stream then emitted, as far as
they go. A round verifies L positions at most, so learning from verified rounds alone left
positions past the lengths a key's rounds chose at their priors (a prompt asked a third
time in a session, grown key 42, verified 6.4 tokens a lookup round where the second time,
key 54, verified 8.5; with hindsight 8.3, results/lookup_hindsight), and a key whose priors
lose to the draft was never tried at all. Exact for
greedy decoding (position k is accepted iff the proposal's first k tokens are what the
target emits), unbiased under sampling (a one-hot proposal x is accepted with probability
p(x), which is the probability that the emitted token is x, and a rejected one is never
emitted).

Lossless either way: greedy verification emits the target's argmax whatever was
proposed; under sampling each looked-up token is a one-hot proposal (verify.py, DESIGN.md
§4), chosen before the round's randomness is drawn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specrt.engines.costs import interpolate

from .governor import depth_at_least

NMAX, NMIN = 4, 2
# conditional acceptance per position of a lookup of n tokens (module doc; positions past
# the list take its last value)
PRIORS = {4: (0.8, 0.84, 0.87, 0.89, 0.9, 0.92, 0.93, 0.93),
          3: (0.58, 0.64, 0.71, 0.75, 0.77, 0.79, 0.8, 0.85),
          2: (0.51, 0.58, 0.64, 0.71, 0.75, 0.77, 0.78, 0.8)}
PRIOR_ROUNDS = 16.0
EMA = 0.1


def tally(proposal: Sequence[int], truth: Sequence[int], tries: list, wins: list) -> None:
    """Count a proposal against what greedy decoding produced (``truth``, from the same
    position): position k is tried when 1..k-1 matched and the truth goes on that far, won
    when it matched too (tools/lookup_priors.py, corpus.Corpus.measure)."""
    for k, (p, t) in enumerate(zip(proposal, truth)):
        tries[k] += 1
        if p != t:
            break
        wins[k] += 1


class NgramIndex:
    """The context's tokens and, per n-gram (n = NMIN..NMAX), where its last earlier
    occurrence was followed: an n-gram is indexed once the token after it exists, so the
    context's own final n tokens are only found where they occurred before."""

    def __init__(self, nmax: int = NMAX, nmin: int = NMIN):
        self.ns = tuple(range(nmax, nmin - 1, -1))  # longest match first
        self.tokens: list[int] = []
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}

    def extend(self, tokens: Sequence[int]) -> None:
        x = self.tokens
        for t in tokens:
            i = len(x)  # the new token's index: the n-grams ending just before it are followed by it
            for n in self.ns:
                if i >= n:
                    self._after[n][tuple(x[i - n : i])] = i
            x.append(int(t))

    def propose(self, limit: int) -> tuple[list[int], int]:
        """(up to ``limit`` tokens that followed the longest matching n-gram, n), or ([], 0)."""
        x = self.tokens
        if limit < 1:
            return [], 0
        for n in self.ns:
            if len(x) < n:
                continue
            j = self._after[n].get(tuple(x[-n:]))
            if j is not None:
                # a match that runs into the context's end repeats: x[j:] is what followed the
                # n-gram and ends with that n-gram again, so x[j:] follows it again (a loop of
                # period len(x) - j, where a small model's greedy answer often sits: cut at
                # the end, the proposal was at most one period, [7] in 7 7 7 7 7)
                period = len(x) - j
                return [x[j + k % period] for k in range(limit)], n
        return [], 0


class NgramPolicy:
    """Per round: the lookup chain's length to verify (0: the governor's route instead)."""

    def __init__(self, depths: Sequence[int], t_verify: Mapping[int, float], t_draft: float | None,
                 chain: Mapping[int, float] | None = None, max_len: int | None = None):
        self.depths = tuple(sorted(depths))
        self.table = dict(t_verify)  # depth -> seconds (0: a plain decode step)
        # chains past the deepest depth run on the prefill engine: seconds per chain length
        # L as profiled (engines/costs.py chain_lengths), a straight line between and beyond
        self.chain = dict(chain or {})
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len={max_len}: expected >= 1")
        # the longest chain verified: the longest profiled, else the deepest depth; a given
        # max_len past both is priced on the verify engines' last slope
        self.max_len = max_len if max_len is not None else max([self.depths[-1], *self.chain])
        self.load = 1.0  # measured / table target time
        self.python = 0.5e-3  # seconds a lookup round spends outside the engine (learnt)
        # the governor's route: measured tokens per second of its rounds (None: none yet;
        # then the table's guess for a draft round of tau 1.5, or a plain step without draft)
        decode = self.table.get(0, min(self.table.values()))
        self.route_rate: float | None = None
        self.route_guess = 1.5 / (decode + t_draft) if t_draft else 1.0 / decode
        self.wins = {n: [p * PRIOR_ROUNDS for p in PRIORS[n]] for n in PRIORS}
        self.tries = {n: [PRIOR_ROUNDS] * len(PRIORS[n]) for n in PRIORS}
        self.hindsight = True  # learn rates from every offered proposal (note/settle); False: verified rounds only
        self._pending: list[tuple[int, int, list[int], list[int]]] = []  # (key, start, proposal, the stream's tokens)
        self.corpus = None  # corpus.Corpus when the governor has ':corpus' (the generator sets it)
        self.growth = None  # corpus.Growth when it has ':grow' (the generator sets it and adds to it)

    def sources(self) -> list:
        """The proposal sources beside prompt lookup: the corpus, the session's growth."""
        return [s for s in (self.corpus, self.growth) if s is not None]

    def cost(self, rows: int) -> float:
        """Seconds for a target call of ``rows`` tokens (a verify of rows - 1), now."""
        d = rows - 1
        if d > self.depths[-1]:  # a chain on the prefill engine
            t = interpolate(self.chain or {k: v for k, v in self.table.items() if k}, d)
        else:
            t = self.table[0] if d == 0 and 0 in self.table else self.table[depth_at_least(self.depths, d)]
        return self.load * t

    def rates(self, n: int) -> list[float]:
        return [w / t for w, t in zip(self.wins[n], self.tries[n])]

    @classmethod
    def from_engines(cls, engines, past: int, max_len: int | None = None) -> "NgramPolicy":
        """Costs from the engines' table at ``past`` committed tokens."""
        draft = engines.cost("draft", past) if engines.export.get("draft") else None
        return cls(engines.depths, engines.target_costs(past), draft, engines.chain_costs(past), max_len)

    def add_source(self, priors: Mapping[int, Sequence[float]]) -> None:
        """More proposal sources under their own keys (corpus.py's bins), each with its
        per-position prior rates, weighted as PRIOR_ROUNDS rounds as prompt lookup's."""
        for key, rates in priors.items():
            if key in PRIORS:
                raise ValueError(f"source key {key} is prompt lookup's")
            self.wins[key] = [float(p) * PRIOR_ROUNDS for p in rates]
            self.tries[key] = [PRIOR_ROUNDS] * len(rates)

    def choose(self, proposal_len: int, n: int, limit: int) -> int:
        return self.choose_rate(proposal_len, n, limit)[0]

    def choose_rate(self, proposal_len: int, n: int, limit: int) -> tuple[int, float]:
        """(the chain length to verify, 0: the governor's route; its expected tokens per second)."""
        top = min(proposal_len, limit, self.max_len)
        route = self.route_rate if self.route_rate is not None else self.route_guess
        if top < 1 or n not in self.wins:
            return 0, route
        c = self.rates(n)
        best, best_rate, e, s = 0, route, 1.0, 1.0
        for k in range(1, top + 1):
            s *= c[min(k, len(c)) - 1]
            e += s
            # built depths only (an unbuilt one runs on prefill), and past the deepest one any
            # length, on the prefill engine (as DSpark prices its token trees' rows there)
            if k in self.depths or k > self.depths[-1]:
                rate = e / (self.cost(k + 1) + self.python)
                if rate > best_rate:  # strict: a tie keeps the governor's route
                    best, best_rate = k, rate
        return best, best_rate

    def note(self, key: int, tokens: list[int], start: int, stream: list[int]) -> None:
        """A proposal offered this round under ``key``, chosen or not: ``tokens`` would follow
        ``stream[:start]``; ``settle`` tallies it once ``stream`` (appended to in place) shows
        how far it matched."""
        if self.hindsight and tokens and key in self.tries:
            self._pending.append((key, start, list(tokens), stream))

    def settle(self, stream: list[int], final: bool = False) -> None:
        """Tally the noted proposals of ``stream`` that its tokens now decide (a mismatch
        seen, or every position covered); ``final``: all of them, as far as the stream went
        (positions past its end untried). Proposals of another stream (one abandoned
        unfinished) are dropped untallied."""
        keep = []
        for item in self._pending:
            key, start, prop, xs = item
            if xs is not stream:
                continue
            truth = stream[start : start + len(prop)]
            if final or len(truth) == len(prop) or any(p != t for p, t in zip(prop, truth)):
                self._count(key, prop, truth)
            else:
                keep.append(item)
        self._pending = keep

    def _count(self, key: int, proposal: Sequence[int], truth: Sequence[int]) -> None:
        """tally() into ``key``'s counts."""
        for k, (p, q) in enumerate(zip(proposal, truth)):
            self._tried(key, k, p == q)
            if p != q:
                break

    def _tried(self, key: int, k: int, won: bool) -> None:
        """One try of position k + 1 of ``key``; positions past its priors' length start
        from the last one's rate at PRIOR_ROUNDS."""
        w, t = self.wins[key], self.tries[key]
        if k >= len(t):
            w.append(w[-1] / t[-1] * PRIOR_ROUNDS)
            t.append(PRIOR_ROUNDS)
        t[k] += 1.0
        w[k] += float(won)

    def observe(self, rows: int, t_verify: float, t_round: float | None, tokens: int,
                lookup: tuple[int, int] | None = None) -> None:
        """Any round: its target call (``rows`` tokens) and wall time; ``lookup`` = (n,
        accepted) for a lookup round (its accepted count teaches n's rates when they are not
        learnt in hindsight), else the round's ``tokens`` per second teach the governor
        route's rate."""
        if t_verify > 0:
            self.load += EMA * (t_verify / self.cost(rows) * self.load - self.load)
        if t_round is not None and lookup is not None:
            self.python += EMA * (max(t_round - t_verify, 0.0) - self.python)
        if lookup is None:
            if t_round:
                r = tokens / t_round
                self.route_rate = r if self.route_rate is None else self.route_rate + EMA * (r - self.route_rate)
            return
        if self.hindsight:
            return
        n, a = lookup
        for k in range(min(a + 1, rows - 1)):  # positions reached: 1..a accepted, a + 1 rejected (if verified)
            self._tried(n, k, k < a)
