"""Prompt lookup (runtime/ngram.py): the index, the per-round choice, the spec option and
its telemetry. The loop over real engines (greedy identity, sampling distribution) is in
test_generate.py."""

from __future__ import annotations

import json

import pytest

from specrt.errors import InternalError, UserError
from specrt.runtime.governor import GovernorState, from_spec, split_lookup
from specrt.runtime.ngram import PRIOR_ROUNDS, PRIORS, NgramIndex, NgramPolicy
from specrt.runtime.telemetry import RoundResult, Telemetry

DEPTHS = (1, 2, 4, 8)
COSTS = {0: 0.020, 1: 0.022, 2: 0.023, 4: 0.025, 8: 0.032}


def _index(tokens):
    ix = NgramIndex()
    ix.extend(tokens)
    return ix


def test_lookup_proposes_what_followed_the_last_earlier_occurrence():
    # "5 6 7" occurred twice before the end: the later occurrence's continuation wins
    ix = _index([5, 6, 7, 1, 2, 5, 6, 7, 3, 4, 9, 5, 6, 7])
    assert ix.propose(3) == ([3, 4, 9], 3)
    # up to the context's end, then again: x[j:] ends with the matched "5 6 7", so it repeats
    assert ix.propose(8) == ([3, 4, 9, 5, 6, 7, 3, 4], 3)
    assert ix.propose(0) == ([], 0)
    # the longest match first: "1 6 7" was never seen, "6 7" was (followed by 3)
    ix = _index([5, 6, 7, 3, 8, 1, 6, 7])
    assert ix.propose(2) == ([3, 8], 2)


def test_lookup_never_matches_the_context_end_with_itself_and_follows_new_tokens():
    ix = _index([1, 2, 3, 4])
    assert ix.propose(4) == ([], 0)  # no n-gram of length >= 2 repeats
    ix.extend([1, 2])
    assert ix.propose(4) == ([3, 4, 1, 2], 2)
    ix.extend([3])
    assert ix.propose(4) == ([4, 1, 2, 3], 3)
    ix.extend([4, 1])
    assert ix.propose(2) == ([2, 3], 4)  # "3 4 1" and "2 3 4 1": the 4-gram, latest occurrence
    # a periodic context proposes its period, repeated: "a b" "a b" ... "a"
    ix = _index([7, 8, 7, 8, 7])
    assert ix.propose(5) == ([8, 7, 8, 7, 8], 3)  # "7 8 7" was followed by 8 at index 3 ("8 7 8 7" never occurred)
    assert _index([7] * 10).propose(5) == ([7] * 5, 4)  # a loop of one token (it proposed [7] alone)
    assert _index([5, 6] * 3).propose(6) == ([5, 6] * 3, 4)
    # one-token matches are not used (first position accepted 0.20 on SmolLM2)
    assert _index([4, 9, 4]).propose(3) == ([], 0)


def test_policy_prefers_the_governors_route_when_it_is_faster():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    # no measured route yet: the guess is tau 1.5 over decode + draft (68 tok/s)
    assert p.route_guess == pytest.approx(1.5 / 0.022)
    # a 4-gram chain of 8 on these costs: E(8) / (t_verify(8) + python) well above it
    assert p.choose(8, 4, limit=100) == 8
    assert p.choose(8, 4, limit=3) == 2  # a budget of 3: the deepest built depth it allows
    assert p.choose(0, 0, limit=100) == 0
    # a route measured at 200 tok/s: no lookup chain pays
    p.route_rate = 200.0
    assert p.choose(8, 4, limit=100) == 0
    # unbuilt lengths cost as the next built depth: 5 costs verify.8
    assert p.cost(6) == pytest.approx(COSTS[8])
    assert p.cost(1) == pytest.approx(COSTS[0])


def test_policy_learns_rates_in_hindsight():
    """Every offered proposal, verified or not, is tallied against the tokens the stream
    then emitted, once they decide it: position k tried when 1..k-1 matched, won when k
    did too, past the length any round verified and past the priors' length."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    x = [9, 9, 9]
    p.note(2, [5, 6, 7, 8], len(x), x)  # offered, never chosen: no observe() for it
    p.note(4, [5, 6], len(x), x)
    p.note(3, [], len(x), x)  # nothing offered: nothing to learn
    p.note(77, [5], len(x), x)  # a key the policy has no rates for
    x += [5]
    p.settle(x)
    assert p.tries[2] == [PRIOR_ROUNDS] * 8 and p.tries[4] == [PRIOR_ROUNDS] * 8  # undecided yet
    x += [6, 1]
    p.settle(x)  # key 4's both positions matched; key 2's third missed
    assert p.tries[4][:3] == [PRIOR_ROUNDS + 1, PRIOR_ROUNDS + 1, PRIOR_ROUNDS]
    assert p.wins[4][:2] == [PRIORS[4][0] * PRIOR_ROUNDS + 1, PRIORS[4][1] * PRIOR_ROUNDS + 1]
    assert p.tries[2][:4] == [PRIOR_ROUNDS + 1] * 3 + [PRIOR_ROUNDS]
    assert p.wins[2][:3] == [PRIORS[2][0] * PRIOR_ROUNDS + 1, PRIORS[2][1] * PRIOR_ROUNDS + 1, PRIORS[2][2] * PRIOR_ROUNDS]
    assert p.tries[3] == [PRIOR_ROUNDS] * 8 and 77 not in p.tries and not p._pending
    # a verified lookup round's observe() teaches no rates then (its tokens are noted instead)
    p.observe(3, t_verify=0.023, t_round=0.024, tokens=2, lookup=(2, 1))
    assert p.tries[2][:4] == [PRIOR_ROUNDS + 1] * 3 + [PRIOR_ROUNDS]
    # the stream's end settles the rest as far as it went; positions past the priors' 8 extend them
    p.note(3, list(range(10)), len(x), x)
    x += list(range(9))
    p.settle(x)
    assert len(p._pending) == 1
    p.settle(x, final=True)
    w8 = PRIORS[3][7] * PRIOR_ROUNDS + 1  # position 8 won, then the 9th starts from its rate
    assert p.tries[3] == [PRIOR_ROUNDS + 1] * 9
    assert p.wins[3][8] == pytest.approx(w8 / (PRIOR_ROUNDS + 1) * PRIOR_ROUNDS + 1)
    # a proposal of another stream (one abandoned unfinished) is dropped, untallied
    y = [1, 2]
    p.note(2, [3], len(y), y)
    p.settle(x, final=True)
    assert not p._pending and p.tries[2][0] == PRIOR_ROUNDS + 1
    # hindsight off: offered proposals are not kept, the verified rounds teach (below)
    q = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    q.hindsight = False
    q.note(2, [5], 0, x)
    assert not q._pending


def test_policy_learns_rates_route_speed_and_load():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.hindsight = False  # the verified rounds' counts (learnt in hindsight: the test above)
    before = p.rates(2)[0]
    assert before == pytest.approx(PRIORS[2][0])
    for _ in range(50):  # 2-gram chains of 4, always rejected at once
        p.observe(5, t_verify=0.025, t_round=0.026, tokens=1, lookup=(2, 0))
    assert p.rates(2)[0] == pytest.approx(PRIOR_ROUNDS * PRIORS[2][0] / (PRIOR_ROUNDS + 50))
    assert p.rates(2)[1] == pytest.approx(PRIORS[2][1])  # never reached: unchanged
    assert p.choose(4, 2, limit=100) == 0  # no longer worth a round
    assert p.python == pytest.approx(0.001, rel=0.01)
    for _ in range(60):  # the target now runs 2x slower than its table
        p.observe(2, t_verify=2 * COSTS[1], t_round=0.05, tokens=2)
    assert p.load == pytest.approx(2.0, rel=0.01)
    assert p.route_rate == pytest.approx(2 / 0.05, rel=0.01)
    # chains of 8 fully accepted teach every position, past the priors' length too
    q = NgramPolicy((1, 2, 4, 8, 12), {**COSTS, 12: 0.04}, t_draft=None)
    q.hindsight = False
    assert q.route_guess == pytest.approx(1 / 0.020)
    q.observe(13, t_verify=0.04, t_round=0.041, tokens=13, lookup=(4, 12))
    assert len(q.tries[4]) == 12 and q.tries[4][11] == PRIOR_ROUNDS + 1


def test_spec_option():
    assert split_lookup("dspark:tree=3:ngram") == ("dspark:tree=3", True)
    assert split_lookup("Fixed:2:NGRAM:tree=2") == ("fixed:2:tree=2", True)
    assert split_lookup("off:ngram") == ("off", True)
    assert split_lookup("dspark") == ("dspark", False)
    for bad in ("ngram", "fixed:2:ngram:ngram"):
        with pytest.raises(UserError, match=":ngram"):
            split_lookup(bad)
    g = from_spec("fixed:2:ngram:tree=3", DEPTHS)
    assert g.lookup and g.tree_width == 3 and g.choose(GovernorState()) == 2
    assert not from_spec("fixed:2", DEPTHS).lookup and from_spec("off:ngram", DEPTHS).lookup
    with pytest.raises(UserError, match="expected one of"):
        from_spec("fixed:2:ngrams", DEPTHS)
    # ':ngram=L': the longest chain verified
    assert split_lookup("off:ngram=12:corpus") == ("off", True)
    g = from_spec("dspark:ngram=12", DEPTHS, t_draft=0.002, t_verify=COSTS)
    assert g.lookup and g.lookup_chain == 12 and from_spec("off:ngram", DEPTHS).lookup_chain is None
    for bad in ("off:ngram=0", "off:ngram=x", "off:ngram=4:ngram"):
        with pytest.raises(UserError, match=":ngram"):
            from_spec(bad, DEPTHS)


CHAIN = {9: 0.034, 16: 0.040}  # the prefill engine at 10 and 17 rows


def test_policy_verifies_long_chains_on_the_prefill_engine_when_they_pay():
    """Past the deepest depth (8) a chain of any length up to the longest priced (16 here)
    is a candidate, at the cost table's chain prices (a straight line between 9 and 16);
    without them the lookup stops at 8, unless a longest chain is given (then priced on
    the verify engines' last slope)."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002, chain=CHAIN)
    assert p.max_len == 16
    assert p.cost(13) == pytest.approx(0.034 + 0.006 * 3 / 7)  # 12 tokens
    assert p.cost(9) == pytest.approx(COSTS[8])  # a built depth: its own engine
    # the 4-gram's priors (0.93 past position 8): E(16) / t(16) beats E(8) / t(8)
    assert p.choose(20, 4, limit=100) == 16
    assert p.choose(12, 4, limit=100) == 12  # any length past 8: the proposal's
    assert p.choose(20, 4, limit=10) == 10  # the token budget
    # a 2-gram's rates fall off: a long chain does not pay for its rows
    for k in range(8, 16):
        p.wins[2].append(0.0), p.tries[2].append(PRIOR_ROUNDS)
    assert p.choose(20, 2, limit=100) <= 8
    # a chain priced far above (the prefill engine slow): the deepest built depth instead
    slow = NgramPolicy(DEPTHS, COSTS, t_draft=0.002, chain={9: 0.2, 16: 0.4})
    assert slow.choose(20, 4, limit=100) == 8
    # no chain prices (a table profiled before them): 8 at most ...
    old = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    assert old.max_len == 8 and old.choose(20, 4, limit=100) == 8
    # ... unless asked: the verify engines' last slope (8: 0.032, 4: 0.025) prices 12
    asked = NgramPolicy(DEPTHS, COSTS, t_draft=0.002, max_len=12)
    assert asked.cost(13) == pytest.approx(0.032 + 4 * 0.007 / 4)
    assert 8 < asked.choose(20, 4, limit=100) <= 12
    # a shorter longest chain than the deepest depth caps the built depths too
    short = NgramPolicy(DEPTHS, COSTS, t_draft=0.002, chain=CHAIN, max_len=4)
    assert short.choose(20, 4, limit=100) == 4
    with pytest.raises(ValueError, match="max_len"):
        NgramPolicy(DEPTHS, COSTS, t_draft=0.002, max_len=0)


def test_lookup_rounds_are_counted_apart_from_the_drafts():
    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1, t_draft=0.002, t_verify=0.02, t_round=0.023, confidences=[0.5, 0.5]))
    t.record(RoundResult(depth=4, accepted=3, t_verify=0.025, t_round=0.026, lookup=4))
    t.record(RoundResult(depth=4, accepted=0, t_verify=0.025, t_round=0.027, lookup=2))
    j = t.to_json()
    assert j["tau"] == 2.0 and j["draft_rounds"] == 1 and j["rounds"] == 3  # the draft's tau
    assert j["acceptance_by_position"] == [1.0, 0.0]
    assert j["lookup"]["rounds"] == 2 and j["lookup"]["tokens_per_round"] == pytest.approx(2.5)
    assert j["lookup"]["by_match"] == {"2": {"rounds": 1, "verified": 4, "accepted": 0},
                                       "4": {"rounds": 1, "verified": 4, "accepted": 3}}
    assert j["lookup"]["depth_histogram"] == {"4": 2} and j["lookup"]["seconds"] == pytest.approx(0.053)
    assert j["time_split"]["verify"] == pytest.approx(0.07)
    again = Telemetry.from_json(json.loads(json.dumps(j)))
    both = Telemetry()
    both.merge(again)
    both.merge(t)
    assert both.to_json()["lookup"]["by_match"]["4"] == {"rounds": 2, "verified": 8, "accepted": 6}
    with pytest.raises(InternalError, match="lookup round"):
        RoundResult(depth=2, accepted=0, siblings=1, lookup=3)
    with pytest.raises(InternalError, match="lookup round"):
        RoundResult(depth=0, accepted=0, lookup=3)


def test_hindsight_stops_at_the_first_mismatch_and_ties_keep_the_route():
    """A proposal's positions past its first mismatch were never reached (greedy acceptance
    stops there), even where the stream's later tokens happen to equal the proposal's; a
    chain whose expected rate only ties the governor's route is not taken, nor a key the
    policy has no rates for."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    x = [1]
    p.note(2, [5, 6, 7], len(x), x)
    x += [5, 9, 7]  # position 2 missed; position 3 matches, but after a miss
    p.settle(x)
    assert p.tries[2][:3] == [PRIOR_ROUNDS + 1, PRIOR_ROUNDS + 1, PRIOR_ROUNDS]
    assert p.wins[2][:3] == [PRIORS[2][0] * PRIOR_ROUNDS + 1, PRIORS[2][1] * PRIOR_ROUNDS,
                             PRIORS[2][2] * PRIOR_ROUNDS]
    q = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    d, rate = q.choose_rate(8, 4, limit=100)
    assert d == 8
    q.route_rate = rate  # exactly as fast as the chain: the route stays
    assert q.choose_rate(8, 4, limit=100) == (0, rate)
    assert q.choose(8, 99, limit=100) == 0  # a key without rates: the route


# ---- session 61's mutation round (runtime/ngram.py, engines/costs.py) ----------------------


def test_positions_past_a_keys_rates_take_its_last_rate():
    """Rates 1 at positions 1-7 and 1/2 at 8: a chain of 8 expects 1 + 7 + 1/2 tokens (the
    8th position's own rate), and a longer one 1/2 for each position past the list."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002, chain=CHAIN)
    p.route_rate = 0.0  # any chain pays
    p.wins[2], p.tries[2] = [PRIOR_ROUNDS] * 7 + [PRIOR_ROUNDS / 2], [PRIOR_ROUNDS] * 8
    assert p.choose_rate(8, 2, limit=8) == (8, pytest.approx(8.5 / (p.cost(9) + p.python)))
    _, rate = p.choose_rate(9, 2, limit=9)
    assert rate == pytest.approx(max(8.5 / (p.cost(9) + p.python), 8.75 / (p.cost(10) + p.python)))


def test_a_single_verify_depths_chains_are_priced_flat_without_chain_costs():
    """No chains profiled and one verify engine: a longer chain (':ngram=L') costs what the
    deepest verify does (no slope to extrapolate; the decode step is another engine)."""
    p = NgramPolicy((4,), {0: 0.010, 4: 0.012}, t_draft=0.002, max_len=8)
    assert p.cost(9) == pytest.approx(0.012) and p.cost(5) == pytest.approx(0.012)


def test_a_round_timed_below_its_target_call_teaches_no_negative_python_time():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.observe(5, t_verify=0.025, t_round=0.020, tokens=3, lookup=(4, 2))  # clocks read apart
    assert p.python == pytest.approx(0.9 * 0.5e-3)


def test_tally_counts_positions_up_to_the_first_mismatch():
    from specrt.runtime.ngram import tally

    tries, wins = [0] * 4, [0] * 4
    tally([1, 2, 3, 4], [1, 5, 3], tries, wins)  # position 2 tried and lost; 3 never tried
    assert tries == [1, 1, 0, 0] and wins == [1, 0, 0, 0]
    tally([1, 2], [1, 2, 9], tries, wins)  # all matched, as far as the proposal goes
    assert tries == [2, 2, 0, 0] and wins == [2, 1, 0, 0]


def test_a_source_cannot_take_prompt_lookups_keys():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    for n in PRIORS:
        with pytest.raises(ValueError, match=f"source key {n} is prompt lookup's"):
            p.add_source({n: [0.5]})
    assert p.wins[2] == [r * PRIOR_ROUNDS for r in PRIORS[2]]


def test_a_round_without_timings_teaches_neither_load_nor_python_time():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.observe(5, t_verify=0.0, t_round=None, tokens=3, lookup=(4, 2))  # the target not timed, the round not either
    assert p.load == 1.0 and p.python == 0.5e-3


# ---- session 68's mutation round (runtime/ngram.py) ------------------------------------------


def test_policy_takes_depths_in_any_order_and_prices_the_route_from_decode():
    """Depths given unsorted make the same policy (the deepest is the longest verify engine);
    the route's guess is priced on the decode step's cost even where a verify was timed
    cheaper (a noisy table), and on the cheapest call where the table has no decode step."""
    p = NgramPolicy((8, 2, 4, 1), COSTS, t_draft=0.002)
    assert p.max_len == 8 and p.cost(9) == pytest.approx(COSTS[8]) and p.choose(8, 4, limit=100) == 8
    assert NgramPolicy(DEPTHS, {**COSTS, 0: 0.024}, t_draft=None).route_guess == pytest.approx(1 / 0.024)
    no_decode = {d: v for d, v in COSTS.items() if d}
    assert NgramPolicy(DEPTHS, no_decode, t_draft=None).route_guess == pytest.approx(1 / COSTS[1])


def test_a_one_token_chain_is_verified_when_it_pays():
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.route_rate = 1.0  # a slow route: any chain pays
    assert p.choose(1, 4, limit=100) == 1 and p.choose(8, 4, limit=1) == 1


def test_the_route_rate_is_a_moving_average_from_the_first_drafted_round():
    """The governor's route: its first round's tokens per second, then an average moving by
    EMA (0.1) a round; a round timed at 0 s teaches no rate, and drafted rounds do not teach
    the lookup rounds' Python time."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.observe(3, t_verify=0.023, t_round=0.05, tokens=2)  # 40 tok/s
    assert p.route_rate == pytest.approx(40.0) and p.python == 0.5e-3
    p.observe(3, t_verify=0.023, t_round=0.02, tokens=2)  # 100 tok/s
    assert p.route_rate == pytest.approx(40.0 + 0.1 * 60.0)
    p.observe(3, t_verify=0.023, t_round=0.0, tokens=2)
    assert p.route_rate == pytest.approx(46.0) and p.python == 0.5e-3


def test_priors_weigh_as_sixteen_rounds_for_every_source():
    """Prompt lookup's priors and a source's (add_source) count as 16 rounds: 16 misses halve
    a first position's rate; a source's positions past its priors start from its last rate."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    p.hindsight = False  # the verified rounds' counts
    p.add_source({100: [0.5]})
    for _ in range(16):
        p.observe(5, t_verify=0.025, t_round=0.026, tokens=1, lookup=(4, 0))
        p.observe(5, t_verify=0.025, t_round=0.026, tokens=1, lookup=(100, 0))
    assert p.rates(4)[0] == pytest.approx(PRIORS[4][0] / 2) and p.rates(100) == pytest.approx([0.25])
    q = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    q.hindsight = False
    q.add_source({100: [0.5]})
    q.observe(3, t_verify=0.023, t_round=0.024, tokens=2, lookup=(100, 1))  # position 1 won, 2 lost
    assert q.rates(100) == pytest.approx([9 / 17, 9 / 17 * 16 / 17])


def test_a_proposal_is_tallied_as_offered_and_only_against_its_own_stream():
    """A noted proposal is kept as offered (the caller's list may change after), and settling
    a stream drops another stream's proposals even where that stream holds the same tokens."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    x = [1, 2]
    offered = [3]
    p.note(2, offered, len(x), x)
    offered[0] = 9
    x += [3]
    p.settle(x)
    assert p.tries[2][0] == PRIOR_ROUNDS + 1 and p.wins[2][0] == PRIORS[2][0] * PRIOR_ROUNDS + 1
    y = list(x)  # another stream, equal so far
    p.note(2, [4], len(y), y)
    x += [4]
    y += [4]
    p.settle(x, final=True)
    assert not p._pending and p.tries[2][0] == PRIOR_ROUNDS + 1


def test_sources_are_the_corpus_then_the_growth():
    """The generator asks the sources in this order, and a later one replaces an earlier
    proposal only when it promises strictly more: on a tie the corpus's is verified."""
    p = NgramPolicy(DEPTHS, COSTS, t_draft=0.002)
    assert p.sources() == []
    p.corpus, p.growth = "corpus", "growth"
    assert p.sources() == ["corpus", "growth"]
    p.corpus = None
    assert p.sources() == ["growth"]
