"""Losslessness of verify.py on a toy target/draft pair, by exact enumeration and chi-square.

Target: V = 5, logits keyed on the last two tokens. Draft: keyed on the last token, either
over the full vocabulary or over a reduced one of 3 tokens mapped through d2t. A real
speculative loop (draft d tokens autoregressively, verify with the target's processed
probabilities) is compared with target-only decoding:

* greedy: token for token;
* sampling, exact: the distribution of the first L tokens, enumerated over the
  accept/reject tree with the same acceptance/residual functions verify_sampling uses,
  equals the target's to 1e-12;
* sampling, statistical: verify_sampling itself with a seeded rng, chi-square p > 0.01.

Two deliberately wrong rules go through the same enumeration and statistic and must fail.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest

from specrt.errors import InternalError
from specrt.runtime.sampling import SamplingParams, make_rng, probs, sample
from specrt.runtime.verify import (LazyRows, accept_probability, one_hot, residual, scatter_draft_probs,
                                   verify_greedy, verify_sampling)

V = 5
PROMPT = (0, 1)
_r = np.random.default_rng(7)
TARGET_LOGITS = _r.normal(0, 1.5, (V, V, V))  # [prev2, prev1, next]
DRAFT_LOGITS = _r.normal(0, 1.5, (V, V))  # [prev1, next]
REDUCED_IDS = np.array([0, 2, 3])  # draft id -> target id
D2T = REDUCED_IDS - np.arange(3)  # target_id = draft_id + d2t[draft_id]
DRAFT_LOGITS_REDUCED = _r.normal(0, 1.5, (V, 3))


class Toy:
    """Target and draft as functions of the context; ``kind``: full | reduced | greedy (one-hot q)."""

    def __init__(self, kind="full", params=SamplingParams(temperature=1.0)):
        self.kind, self.params = kind, params
        self._p = lru_cache(None)(lambda a, b: probs(TARGET_LOGITS[a, b][None], params)[0])
        self._q = lru_cache(None)(self._draft)

    def p(self, ctx):  # [V] processed target probabilities of the next token
        return self._p(ctx[-2], ctx[-1])

    def q(self, ctx):  # [V] draft probabilities in target ids
        return self._q(ctx[-1])

    def _draft(self, last):
        if self.kind == "reduced":
            return scatter_draft_probs(probs(DRAFT_LOGITS_REDUCED[last][None], SamplingParams(1.0)), D2T, V)[0]
        q = probs(DRAFT_LOGITS[last][None], SamplingParams(1.0))[0]
        return one_hot(np.array([q.argmax()]), V)[0] if self.kind == "greedy" else q


def speculative(toy, depth, length, rng, rule=verify_sampling):
    ctx, out = PROMPT, []
    while len(out) < length:
        c, drafts = ctx, []
        for _ in range(depth):  # draft autoregressively from the draft's own samples
            t = sample(toy.q(c), rng)
            drafts.append(t)
            c += (t,)
        q = np.stack([toy.q(ctx + tuple(drafts[:k])) for k in range(depth)])
        p = np.stack([toy.p(ctx + tuple(drafts[:k])) for k in range(depth + 1)])
        tokens = rule(p, q, np.array(drafts), rng)[1]  # (accepted, tokens, ...)
        out += tokens.tolist()
        ctx += tuple(tokens.tolist())
    return tuple(out[:length])


# ---- greedy --------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("reduced", [False, True])
def test_greedy_equals_target_greedy(depth, reduced):
    paths = {"accepted": 0, "rejected": 0}  # both outcomes occur over the seeds
    for seed in range(5):
        r = np.random.default_rng(seed)
        tl, dl = r.normal(0, 1.5, (V, V, V)), r.normal(0, 1.5, (V, 3 if reduced else V))
        ids = REDUCED_IDS if reduced else np.arange(V)
        ref, ctx = [], PROMPT
        for _ in range(30):
            ref.append(int(tl[ctx[-2], ctx[-1]].argmax()))
            ctx += (ref[-1],)
        out, ctx, accepted = [], PROMPT, 0
        while len(out) < 30:
            drafts = []
            for _ in range(depth):
                drafts.append(int(ids[dl[(ctx + tuple(drafts))[-1]].argmax()]))
            c = ctx + tuple(drafts)
            logits = np.stack([tl[c[len(ctx) + k - 2], c[len(ctx) + k - 1]] for k in range(depth + 1)])
            a, tokens, _ = verify_greedy(logits, np.array(drafts))
            assert len(tokens) == a + 1 and list(tokens[:a]) == drafts[:a]
            accepted += a
            paths["rejected"] += a < depth
            out += tokens.tolist()
            ctx += tuple(tokens.tolist())
        assert out[:30] == ref
        paths["accepted"] += accepted
    assert min(paths.values()) > 0, paths


def test_greedy_rule_cases():
    logits = np.eye(V)[[1, 2, 3]] * 5.0  # argmax 1, 2, 3
    assert verify_greedy(logits, np.array([1, 2])).accepted == 2
    assert verify_greedy(logits, np.array([1, 2])).tokens.tolist() == [1, 2, 3]  # bonus
    assert verify_greedy(logits, np.array([1, 4])).tokens.tolist() == [1, 2]  # correction
    assert verify_greedy(logits, np.array([0, 2])).tokens.tolist() == [1]
    assert verify_greedy(logits[:1], np.array([], np.int64)).tokens.tolist() == [1]  # d = 0: plain step
    with pytest.raises(InternalError, match="expected"):
        verify_greedy(logits, np.array([1]))
    bad = logits.copy()
    bad[1, 0] = np.nan
    with pytest.raises(InternalError, match="NaN logits in row 1 of"):
        verify_greedy(bad, np.array([1, 2]))
    # only the rows used are checked: a non-finite row past the first rejection is none of them
    # (it failed the round, whether an answer failed hanging on how deep the governor verified)
    assert verify_greedy(bad, np.array([0, 2])).tokens.tolist() == [1]
    over = logits.copy()
    over[2, 0] = np.inf
    assert verify_greedy(over, np.array([1, 4])).tokens.tolist() == [1, 2]  # rejected at row 1: row 2 unused
    with pytest.raises(InternalError, match=r"\+inf logits in row 2 of"):
        verify_greedy(over, np.array([1, 2]))  # both accepted: row 2 gives the bonus


# ---- exact enumeration ---------------------------------------------------------------


def wrong_accept_always(p, q):  # accepts when q > p without the ratio
    return 1.0 if p > 0 else 0.0


def wrong_residual_is_p(p, q):  # resamples from p, not from max(0, p - q)
    return p


def exact_speculative(toy, depth, length, accept=accept_probability, resid=residual):
    """P(first `length` tokens) of the speculative loop, by walking the accept/reject tree."""
    rounds = {}

    def round_dist(ctx):  # emitted tuple -> probability, for one round from ctx
        key = ctx[-2:]
        if key not in rounds:
            out = defaultdict(float)

            def walk(c, k, w, acc):
                p = toy.p(c)
                if k == depth:
                    for y in np.flatnonzero(p):
                        out[acc + (int(y),)] += w * p[y]
                    return
                q = toy.q(c)
                rejected = 0.0
                for x in np.flatnonzero(q):
                    al = accept(float(p[x]), float(q[x]))
                    rejected += q[x] * (1 - al)
                    if al > 0:
                        walk(c + (int(x),), k + 1, w * q[x] * al, acc + (int(x),))
                if rejected > 0:
                    r = resid(p, q)
                    for y in np.flatnonzero(r):
                        out[acc + (int(y),)] += w * rejected * r[y]

            walk(key, 0, 1.0, ())
            rounds[key] = dict(out)
        return rounds[key]

    @lru_cache(None)
    def seq(key, n):
        res = defaultdict(float)
        for e, w in round_dist(key).items():
            if len(e) >= n:
                res[e[:n]] += w
            else:
                for s, ws in seq((key + e)[-2:], n - len(e)).items():
                    res[e + s] += w * ws
        return dict(res)

    return seq(PROMPT, length)


def exact_target(toy, length):
    res = {(): 1.0}
    for _ in range(length):
        new = defaultdict(float)
        for s, w in res.items():
            p = toy.p(PROMPT + s)
            for y in np.flatnonzero(p):
                new[s + (int(y),)] += w * p[y]
        res = new
    return dict(res)


def tv(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


TOPKP = SamplingParams(temperature=0.8, top_k=3, top_p=0.85)
CASES = [("full", SamplingParams(1.0)), ("reduced", SamplingParams(1.0)), ("greedy", SamplingParams(1.0)),
         ("full", TOPKP), ("reduced", TOPKP)]
CASE_IDS = ["full", "reduced", "greedy-draft", "full-topk-topp", "reduced-topk-topp"]


@pytest.mark.parametrize("kind,params", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_exact_distribution_equals_target(kind, params, depth):
    toy = Toy(kind, params)
    want = exact_target(toy, 4)
    got = exact_speculative(toy, depth, 4)
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv(got, want) < 1e-12


@pytest.mark.parametrize("wrong", ["accept", "residual"])
@pytest.mark.parametrize("kind,params", CASES, ids=CASE_IDS)
def test_exact_detects_wrong_rules(wrong, kind, params):
    toy = Toy(kind, params)
    kw = {"accept": wrong_accept_always} if wrong == "accept" else {"resid": wrong_residual_is_p}
    assert tv(exact_speculative(toy, 2, 4, **kw), exact_target(toy, 4)) > 0.01


# ---- chi-square on verify_sampling itself ----------------------------------------------


def chi2_pvalue(counts, expected):
    """Pearson chi-square with cells of expected count < 5 pooled; p-value by the
    Wilson-Hilferty cube-root normal approximation (no scipy needed)."""
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    return chi2_sf(float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1)


def chi2_sf(x, k):
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def pvalue_of(toy, depth, rule, n=1500, length=3, seed=0):
    want = exact_target(toy, length)
    keys = sorted(want)
    index = {k: i for i, k in enumerate(keys)}
    rng, counts = make_rng(seed), np.zeros(len(keys))
    for _ in range(n):
        counts[index[speculative(toy, depth, length, rng, rule)]] += 1  # KeyError: impossible sequence
    return chi2_pvalue(counts, n * np.array([want[k] for k in keys]))


def test_sampling_matches_target_chi_square():
    """One chi-square per (draft kind, target processing, depth); each p > 1e-3 and their
    Fisher combination -2 sum(ln p) ~ chi2(2m) has p > 0.01. Under a correct rule these
    p-values are uniform (checked over 30 seeds while writing this test: KS p = 0.98), so
    the fixed seeds below are not tuned; the wrong rules below score p < 1e-30."""
    ps = {(kind, str(params), depth): pvalue_of(Toy(kind, params), depth, verify_sampling, seed=depth)
          for kind, params in CASES for depth in (1, 2, 4)}
    fisher = -2 * sum(math.log(max(p, 1e-300)) for p in ps.values())
    assert min(ps.values()) > 1e-3 and chi2_sf(fisher, 2 * len(ps)) > 0.01, ps


def wrong_rule(accept=accept_probability, resid=residual):
    def rule(p, q, draft, rng):  # verify_sampling's loop with a swapped ingredient
        for k, t in enumerate(draft):
            if not rng.random() < accept(float(p[k, t]), float(q[k, t])):
                return k, np.append(draft[:k], sample(resid(p[k], q[k]), rng))
        return len(draft), np.append(draft, sample(p[-1], rng))
    return rule


def test_chi_square_harness_accepts_the_reference_copy():
    assert pvalue_of(Toy("full"), 2, wrong_rule()) > 0.01  # the copy with the right ingredients passes


@pytest.mark.parametrize("rule", [wrong_rule(accept=wrong_accept_always), wrong_rule(resid=wrong_residual_is_p)],
                         ids=["accept-without-ratio", "residual-is-p"])
@pytest.mark.parametrize("kind", ["full", "reduced"])
def test_chi_square_detects_wrong_rules(rule, kind):
    assert pvalue_of(Toy(kind), 2, rule) < 1e-4


# ---- pieces --------------------------------------------------------------------------


def test_accept_probability_never_divides_by_zero():
    assert accept_probability(0.3, 0.0) == 1.0  # impossible for a sampled draft; documented limit
    assert accept_probability(0.0, 0.0) == 0.0
    assert accept_probability(0.0, 0.5) == 0.0
    assert accept_probability(0.2, 0.4) == pytest.approx(0.5)
    assert accept_probability(0.5, 0.4) == 1.0


def test_verify_sampling_with_zero_q_and_one_hot_q():
    p = np.array([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]])
    v = verify_sampling(p, np.zeros((1, 3)), np.array([1]), make_rng(0))  # q(d) = 0, p(d) = 1: accepted
    assert v.accepted == 1
    v = verify_sampling(p, one_hot(np.array([2]), 3), np.array([2]), make_rng(0))  # p(d) = 0: rejected
    assert v.accepted == 0 and v.tokens.tolist() == [1]


def test_lazy_rows_are_made_once_and_only_while_drafts_are_accepted():
    """verify_sampling on LazyRows gives the dense arrays' verdict from the same seed, and
    makes no row of p or q past the first rejection."""
    rng = np.random.default_rng(3)
    d, width = 4, 6
    p = rng.dirichlet(np.ones(width), d + 1)
    q = rng.dirichlet(np.ones(width), d + 2)  # rows past d are never read
    made = {"p": [], "q": []}

    def lazy(name, rows):
        return LazyRows(lambda k: made[name].append(k) or rows[k], len(rows), width)

    for seed in range(40):
        draft = rng.integers(0, width, d)
        made["p"].clear(), made["q"].clear()
        want = verify_sampling(p, q, draft, make_rng(seed))
        got = verify_sampling(lazy("p", p), lazy("q", q), draft, make_rng(seed))
        assert got.accepted == want.accepted and got.tokens.tolist() == want.tokens.tolist()
        a = want.accepted
        assert made["q"] == list(range(min(a + 1, d)))  # q rows of the tested drafts, once each
        assert made["p"] == (list(range(a + 1)) if a < d else list(range(d + 1)))
    rows = LazyRows(lambda k: p[k], d + 1, width)
    assert rows[-1] is rows[d] and np.array_equal(rows[d], p[d])  # made once, kept
    assert len(rows) == d + 1 and rows.shape == (d + 1, width)
    with pytest.raises(IndexError):
        rows[d + 1]


def test_residual_fallback_when_p_equals_q():
    p = np.array([0.2, 0.8])
    assert residual(p, p.copy()).tolist() == p.tolist()
    assert residual(np.array([0.5, 0.5]), np.array([1.0, 0.0])).tolist() == [0.0, 1.0]


def test_scatter_draft_probs_through_d2t():
    q = scatter_draft_probs(np.array([[0.2, 0.3, 0.5]]), D2T, V)
    assert q.tolist() == [[0.2, 0.0, 0.3, 0.5, 0.0]]
    with pytest.raises(InternalError, match="d2t"):
        scatter_draft_probs(np.array([[1.0, 0.0, 0.0]]), np.array([0, 1, 9]), V)
    with pytest.raises(InternalError, match="d2t"):  # one past the last target id
        scatter_draft_probs(np.array([[1.0, 0.0, 0.0]]), np.array([0, 1, V - 2]), V)
    with pytest.raises(InternalError, match="no d2t"):
        scatter_draft_probs(np.ones((1, 3)) / 3, None, V)


def test_token_tree_siblings_keep_the_first_tokens_law_and_take_their_own_bonus_row():
    """verify_sampling's runners-up, called directly (the engine-level chi-square in
    test_generate.py uses 1200 runs and did not see a residual left unrenormalised, a
    rejected sibling's mass left in it, or a bonus drawn from the wrong sibling's row).
    The draft proposes token 0 (q one-hot) and is usually rejected; runners-up 1 and 2 are
    tested in turn against the residual. The first token must follow p[0]; a sibling's
    bonus comes from its own row (one-hot rows here, so each draw is checked exactly)."""
    p = np.array([[0.05, 0.45, 0.40, 0.10], [0.0, 1.0, 0.0, 0.0]])  # row 1: after the draft
    rows = {0: np.array([0.0, 0.0, 0.0, 1.0]), 1: np.array([1.0, 0.0, 0.0, 0.0])}  # after sibling 1 / 2
    q, draft, siblings = one_hot(np.array([0]), 4), np.array([0]), (1, 2)
    rng, n = make_rng(5), 20000
    first, wins = np.zeros(4), np.zeros(2)
    for _ in range(n):
        v = verify_sampling(p, q, draft, rng, siblings, rows.__getitem__)
        first[v.tokens[0]] += 1
        if v.sibling >= 0:
            wins[v.sibling] += 1
            assert v.accepted == 1 and v.tokens[0] == siblings[v.sibling]
            assert v.tokens[1] == rows[v.sibling].argmax()  # the bonus from that sibling's row
        elif v.accepted == 1:
            assert v.tokens.tolist() == [0, 1]  # the draft, then row 1's bonus
        else:
            assert v.tokens.tolist() == [3]  # neither sibling: what is left of the residual
    assert wins.min() > 1000  # both ranks win rounds
    assert chi2_pvalue(first, n * p[0]) > 1e-3, first / n


# ---- mutation round 5 (each test names the mutant it kills) ----------------------------


def test_greedy_rule_with_a_screens_argmaxes():
    """``best`` given (a screened head): a -1 row (non-finite) fails the round only where it
    is used, naming its row; a row past the first rejection is not looked at."""
    best = np.array([1, 2, -1])
    assert verify_greedy(None, np.array([1, 4]), best=best).tokens.tolist() == [1, 2]  # rejected at row 1
    with pytest.raises(InternalError, match="in row 2 of its call"):
        verify_greedy(None, np.array([1, 2]), best=best)  # both accepted: row 2 is the bonus
    with pytest.raises(InternalError, match="in row 1 of its call"):
        verify_greedy(None, np.array([1, 2]), best=np.array([1, -1, 3]))  # row 1 used, rejected there
    assert verify_greedy(None, np.array([1, 2]), best=np.array([1, 2, 3])).tokens.tolist() == [1, 2, 3]
    with pytest.raises(InternalError, match="3 argmaxes for 1 drafts"):
        verify_greedy(None, np.array([1]), best=best)


def test_scatter_draft_probs_refuses_ids_below_zero_and_a_width_that_is_not_d2ts():
    with pytest.raises(InternalError, match="d2t"):  # draft id 0 -> target id -1 (numpy would take the last)
        scatter_draft_probs(np.array([[1.0, 0.0, 0.0]]), np.array([-1, 0, 0]), V)
    with pytest.raises(InternalError, match="d2t"):  # 1 column for 3 d2t entries (numpy would broadcast it)
        scatter_draft_probs(np.array([[1.0]]), D2T, V)


def test_lazy_rows_refuse_rows_past_either_end_even_where_make_would_give_one():
    rows = LazyRows(lambda k: np.full(2, float(k)), 3, 2)
    assert rows[2].tolist() == [2.0, 2.0] and rows[-3].tolist() == [0.0, 0.0]
    for k in (3, -4):
        with pytest.raises(IndexError):
            rows[k]


def test_residual_falls_back_to_p_itself_when_rounding_leaves_no_mass():
    p, q = np.array([0.5, 0.5]), np.array([0.5, np.nextafter(0.5, 1.0)])  # p <= q everywhere, p != q
    assert residual(p, q).tolist() == [0.5, 0.5]


def test_coupled_rule_emits_each_positions_own_draw():
    """verify_coupled, called directly: every emitted token is ``pick(row, position)`` of
    the target-only run, the draft accepted while it is that draw; a runner-up counts at the
    first position only, its bonus drawn from its own row at the next position."""
    from specrt.runtime.sampling import CoupledNoise
    from specrt.runtime.verify import verify_coupled
    width, d = 6, 3
    rng = np.random.default_rng(11)
    for seed in range(12):
        noise = CoupledNoise(seed, width)
        p = rng.dirichlet(np.ones(width), d + 1)
        base = int(rng.integers(0, 50))
        draws = [noise.pick(p[k], base + k) for k in range(d + 1)]
        v = verify_coupled(p, np.array(draws[:d]), noise.pick, base)  # every draft is the draw
        assert (v.accepted, v.tokens.tolist(), v.sibling) == (d, draws, -1)
        wrong = (draws[1] + 1) % width
        v = verify_coupled(p, np.array([draws[0], wrong, 0]), noise.pick, base)
        assert (v.accepted, v.tokens.tolist()) == (1, draws[:2])  # rejected at position 2: its draw
        # a runner-up that is position 2's draw is no candidate there (runners-up are for position 1)
        v = verify_coupled(p, np.array([draws[0], wrong, 0]), noise.pick, base, siblings=[draws[1]],
                           p_sibling=lambda j: p[3])
        assert (v.accepted, v.tokens.tolist(), v.sibling) == (1, draws[:2], -1)
        row = rng.dirichlet(np.ones(width))
        v = verify_coupled(p, np.array([(draws[0] + 1) % width]), noise.pick, base, siblings=[9, draws[0]],
                           p_sibling=lambda j: row if j == 1 else None)
        assert (v.accepted, v.tokens.tolist(), v.sibling) == (1, [draws[0], noise.pick(row, base + 1)], 1)


def test_verify_sampling_refuses_too_few_target_rows_and_a_draft_width_that_is_not_the_targets():
    p, q = np.full((2, 4), 0.25), np.full((2, 4), 0.25)
    with pytest.raises(InternalError, match="expected"):  # d = 2 drafts need d + 1 = 3 target rows
        verify_sampling(p, q, np.array([0, 1]), make_rng(0))
    with pytest.raises(InternalError, match="expected"):  # q over 3 tokens for a target of 4
        verify_sampling(p, q[:, :3], np.array([0]), make_rng(0))


def test_verify_sampling_never_writes_into_the_callers_rows():
    """Where rounding leaves the residual no mass it is p's own row (residual's fall back):
    the runners-up's renormalisation must work on a copy, not on the caller's p. (q = 2 p
    is no distribution; it reaches that fall back with the draft rejected half the time.)"""
    p = np.array([[0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    q, keep = 2 * p[:1], p.copy()
    rng, tried = make_rng(4), 0
    for _ in range(40):
        v = verify_sampling(p, q, np.array([2]), rng, siblings=(0,), p_sibling=lambda j: p[1])
        tried += v.accepted == 0  # draft and runner-up rejected: the runner-up's mass was taken out of r
        assert np.array_equal(p, keep)
    assert tried > 0


def test_runners_up_are_candidates_for_the_first_position_only():
    """The first draft accepted (p = 1 on it), the second rejected (p = 0 on it): the
    runner-up, a first-position candidate, is not tried against position 2's residual."""
    p = np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    q = one_hot(np.array([1, 0]), 4)
    rng = make_rng(2)
    for _ in range(30):
        v = verify_sampling(p, q, np.array([1, 0]), rng, siblings=(2,), p_sibling=lambda j: p[2])
        assert v.sibling == -1 and v.accepted == 1 and v.tokens[0] == 1 and v.tokens[1] in (1, 2)


def test_runners_up_without_their_rows_are_refused_before_any_draw():
    p, q = np.array([[0.0, 1.0], [0.5, 0.5]]), one_hot(np.array([0]), 2)
    with pytest.raises(InternalError, match="p_sibling"):  # (else: a rejected draft calls None for the bonus row)
        verify_sampling(p, q, np.array([1]), make_rng(0), siblings=(0,))


# ---- mutation round 6 (each test names the mutant it kills) ----------------------------


def generator_drawing_zeros():
    """A real numpy Generator (PCG64) whose next two uniforms are exactly 0.0, a draw it makes
    with probability 2**-53 each: its state is set one step before state 0, with increment 1
    (states 0 and 1 give the outputs 0 and 1, below the 11 bits ``random()`` drops)."""
    mult = 0x2360ED051FC65DA44385DF649FCCF645  # PCG64's 128-bit multiplier
    rng = np.random.Generator(np.random.PCG64())
    state = rng.bit_generator.state
    state["state"] = {"state": -pow(mult, -1, 2**128) % 2**128, "inc": 1}
    rng.bit_generator.state = state
    return rng


def test_a_uniform_of_exactly_zero_accepts_no_token_the_target_gives_no_mass():
    """V29 / V33: a draft is accepted iff u < min(1, p/q) and a runner-up iff u < r(b), strictly:
    u = 0.0 (which random() can return) with p(draft) = 0 or r(b) = 0 must reject, or the
    target's distribution gets a token it never emits."""
    rng = generator_drawing_zeros()
    assert [rng.random(), rng.random()] == [0.0, 0.0] and rng.random() > 0.0
    p = np.array([[0.0, 0.5, 0.5], [1 / 3] * 3])
    v = verify_sampling(p, one_hot(np.array([0]), 3), np.array([0]), generator_drawing_zeros())
    assert v.accepted == 0 and v.tokens[0] in (1, 2)
    p = np.array([[0.0, 0.0, 0.6, 0.4], [0.25] * 4])  # the draft (1) and the runner-up (0) have p = 0
    v = verify_sampling(p, one_hot(np.array([1]), 4), np.array([1]), generator_drawing_zeros(), siblings=(0,),
                        p_sibling=lambda j: p[1])
    assert (v.accepted, v.sibling) == (0, -1) and v.tokens[0] in (2, 3)


def test_one_hot_puts_each_rows_mass_on_its_own_token():
    """V13: greedy drafts' q, one row per draft (not every drafted token in every row)."""
    assert one_hot(np.array([1, 3, 1]), 4).tolist() == [[0, 1, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0]]


def test_verify_sampling_refuses_fewer_draft_rows_than_drafts():
    """V47: q needs a row per draft; one short is an InternalError, not an IndexError midway
    (or no error at all when the round ends before it)."""
    p, q = np.full((3, 4), 0.25), np.full((1, 4), 0.25)
    for seed in range(4):
        with pytest.raises(InternalError, match="expected"):
            verify_sampling(p, q, np.array([0, 1]), make_rng(seed))


def test_a_screens_argmax_of_token_zero_is_a_token():
    """V04: only -1 marks a screen's non-finite row; token 0 is a real argmax, as draft and bonus."""
    v = verify_greedy(None, np.array([0, 2]), best=np.array([0, 2, 0]))
    assert (v.accepted, v.tokens.tolist()) == (2, [0, 2, 0])
    assert verify_greedy(None, np.array([1]), best=np.array([0, 3])).tokens.tolist() == [0]


def test_the_random_stream_is_one_uniform_per_tested_draft_and_one_for_the_last_token():
    """V58: without runners-up verify_sampling draws u for each draft it tests and one inverse-CDF
    uniform for the token it ends with, nothing more (its docstring; a chain draws as before
    token trees came): replayed by hand from the same seed, the same verdict and the generator
    left at the same place."""
    rng, d, width = np.random.default_rng(8), 3, 5
    seen = set()
    for seed in range(40):
        p, q = rng.dirichlet(np.ones(width), d + 1), rng.dirichlet(np.ones(width), d)
        draft = rng.integers(0, width, d)
        replay, k = make_rng(seed), 0
        while k < d and replay.random() < accept_probability(float(p[k, draft[k]]), float(q[k, draft[k]])):
            k += 1
        last = sample(residual(p[k], q[k]) if k < d else p[d], replay)
        used = make_rng(seed)
        v = verify_sampling(p, q, draft, used)
        assert (v.accepted, v.tokens.tolist()) == (k, [*draft[:k].tolist(), last])
        assert used.random() == replay.random()
        seen.add(k)
    assert {0, d} <= seen


def test_a_lone_runner_up_is_tried_too():
    """V63: a tree of width 2 has one runner-up; holding all the residual's mass, it wins every
    round the draft loses, with its own bonus row (not drawn from r as a plain correction)."""
    p = np.array([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]])
    q = one_hot(np.array([0]), 3)  # r = max(p - q, 0): all on token 1
    rng, wins = make_rng(1), 0
    for _ in range(20):
        v = verify_sampling(p, q, np.array([0]), rng, siblings=(1,), p_sibling=lambda j: np.array([1.0, 0.0, 0.0]))
        if v.tokens[0] != 0:
            assert (v.accepted, v.tokens.tolist(), v.sibling) == (1, [1, 0], 0)
            wins += 1
    assert 0 < wins < 20
