import numpy as np
import pytest

from specrt.errors import InternalError, UserError
from specrt.runtime.sampling import SamplingParams, check_logits, make_rng, probs, sample


def test_softmax_is_stable_and_float64():
    p = probs(np.array([[1000.0, 1001.0, -1000.0]], np.float32), SamplingParams(temperature=1.0))
    assert p.dtype == np.float64
    np.testing.assert_allclose(p[0], [1 / (1 + np.e), np.e / (1 + np.e), 0.0], atol=1e-12)


def test_temperature_zero_is_one_hot_argmax():
    p = probs(np.array([[0.0, 3.0, 3.0, 1.0]]), SamplingParams())
    assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]  # first maximum


def test_temperature_scales_logits():
    x = np.array([[0.0, 1.0]])
    p = probs(x, SamplingParams(temperature=0.5))
    np.testing.assert_allclose(p[0, 1] / p[0, 0], np.exp(2.0))


def test_a_tiny_temperature_is_the_argmax_without_a_warning():
    """--temperature 1e-320 printed numpy's "overflow encountered in divide" (a walk, session 54);
    the row was right: the argmax alone."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = probs(np.array([[0.0, 3.0, 1.0]]), SamplingParams(temperature=1e-320))
        q = probs(np.array([[0.0, 3.0, 1.0]]), SamplingParams(temperature=1e-320, top_p=0.5))
    assert p.tolist() == q.tolist() == [[0.0, 1.0, 0.0]]


def test_top_k_keeps_k_and_ties():
    p = probs(np.array([[1.0, 4.0, 3.0, 2.0, 0.0]]), SamplingParams(temperature=1.0, top_k=2))
    assert np.flatnonzero(p[0]).tolist() == [1, 2]
    p = probs(np.array([[1.0, 4.0, 3.0, 3.0]]), SamplingParams(temperature=1.0, top_k=2))
    assert np.flatnonzero(p[0]).tolist() == [1, 2, 3]  # tie at the k-th logit kept (as transformers)
    assert probs(np.array([[1.0, 2.0]]), SamplingParams(temperature=1.0, top_k=5)).min() > 0  # k >= V: off
    # k = 1 is greedy among the top logits (not "off"), with a tie at the top kept
    assert np.flatnonzero(probs(np.array([[1.0, 4.0, 3.0]]), SamplingParams(temperature=1.0, top_k=1))[0]).tolist() == [1]
    assert np.flatnonzero(probs(np.array([[4.0, 1.0, 4.0]]), SamplingParams(temperature=1.0, top_k=1))[0]).tolist() == [0, 2]


def test_top_p_smallest_prefix_reaching_mass():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda top_p: np.flatnonzero(probs(logits, SamplingParams(temperature=1.0, top_p=top_p))[0]).tolist()
    assert kept(0.5) == [0]  # 0.5 reached by the first token
    assert kept(0.6) == [0, 1]
    assert kept(0.85) == [0, 1, 2]  # 0.8 < 0.85 needs the third token
    assert kept(1e-9) == [0]  # always at least one token
    p = probs(logits, SamplingParams(temperature=1.0, top_p=0.85))
    np.testing.assert_allclose(p[0, :3], np.array([0.5, 0.3, 0.15]) / 0.95)


def test_top_k_then_top_p_rows_independent():
    logits = np.log(np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]]))
    p = probs(logits, SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    # after top-k: [0.4, 0.3, 0.2]/0.9 = [.444, .333, .222]; top-p 0.7 keeps two
    assert [np.flatnonzero(r).tolist() for r in p] == [[0, 1], [2, 3]]
    np.testing.assert_allclose(p.sum(-1), 1.0)


def test_bad_options_are_user_errors():
    for kw, name in [({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
                     ({"top_k": -2}, "top_k"), ({"top_k": 1.5}, "top_k"), ({"top_p": 0.0}, "top_p"),
                     ({"top_p": 1.5}, "top_p"), ({"seed": -2}, "seed"), ({"seed": 1.5}, "seed")]:
        with pytest.raises(UserError, match=name):
            SamplingParams(**kw)


def test_a_temperature_past_a_floats_range_is_a_user_error():
    """An integer temperature past a float's range (10**400, as Python's JSON or a script
    gives it): np.isfinite raised TypeError, a traceback, not the option's error (walk w73c)."""
    with pytest.raises(UserError, match="temperature=1000.*expected a finite number"):
        SamplingParams(temperature=10**400)
    assert SamplingParams(temperature=10**300).mode == "temperature=1e+300,top_k=0,top_p=1"  # a float's range: taken


def test_nan_and_inf_logits_raise_naming_the_position():
    x = np.zeros((3, 4))
    x[2, 1] = np.nan
    with pytest.raises(InternalError, match="target engine produced NaN logits in row 2 of its call"):
        probs(x, SamplingParams(temperature=1.0))
    x[2, 1] = np.inf
    with pytest.raises(InternalError, match=r"\+inf logits in row 2 of"):
        check_logits(x, "target")
    x[2] = -np.inf
    with pytest.raises(InternalError, match="all -inf logits in row 2 of"):
        check_logits(x, "draft")
    x[2, 0] = 0.0  # -inf elsewhere is a legal mask
    assert probs(x, SamplingParams(temperature=1.0))[2].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_sampler_is_seeded_and_matches_p():
    p = np.array([0.1, 0.0, 0.6, 0.3])
    a = [sample(p, make_rng(3)) for _ in range(3)]
    assert a == [sample(p, make_rng(3))] * 3
    rng = make_rng(0)
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0.0  # zero mass never drawn
    np.testing.assert_allclose(draws, p, atol=0.015)
    assert sample(np.array([0.0, 0.0, 1.0, 0.0]), rng) == 2


def reference_probs(x, t, k, top_p):
    """The textbook definition, dense and slow: temperature, top-k (ties kept), top-p."""
    x = x.astype(np.float64) / t
    if 0 < k < x.shape[-1]:
        x = np.where(x >= np.sort(x, -1)[:, -k:-k + 1], x, -np.inf)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p < 1.0:  # 1 is off (a cumulative sum can round to 1.0 before the last tokens)
        order = np.argsort(-p, -1, kind="stable")
        sp = np.take_along_axis(p, order, -1)
        keep = np.zeros(p.shape, bool)
        np.put_along_axis(keep, order, np.cumsum(sp, -1) - sp < top_p, -1)
        p = np.where(keep, p, 0.0)
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("scale", [0.05, 0.3, 3.0, 8.0])  # flat (top-p needs the full sort) to peaked
def test_fast_paths_equal_the_reference_definition(scale):
    """The top-p fast path sorts only the tokens above a weight threshold: the kept set and
    the weights must be the full sort's, on rows shaped like SmolLM2's (49152 tokens) too."""
    rng = np.random.default_rng(int(scale * 100))
    x = (rng.normal(0, scale, (6, 5000))).astype(np.float32)
    x[1, :7] = x[1].max()  # a tie at the top
    x[2, 100] = x[2].max() + 12.0  # one dominant token: top-p keeps it alone
    x[3, 200:260] = np.float32(np.sort(x[3])[-40])  # a run of ties across the top-p edge
    x[4] = np.round(x[4] / scale * 4) * scale / 4  # ~30 tied levels (not all one value: then the
    # top-p edge falls exactly on a tie's cumulative mass, where rounding alone decides)
    wide = rng.normal(0, scale, (2, 49152)).astype(np.float32)
    for rows in (x, wide):
        for t, k, top_p in [(1.0, 0, 1.0), (0.7, 50, 1.0), (0.7, 0, 0.9), (1.3, 2000, 0.95), (0.5, 7, 0.5),
                            (1.0, 0, 0.95), (1.3, 0, 0.5), (0.7, 0, 0.999), (0.7, 50, 0.9)]:
            got, want = probs(rows, SamplingParams(t, k, top_p)), reference_probs(rows, t, k, top_p)
            np.testing.assert_array_equal(got > 0, want > 0, err_msg=f"kept set, t={t} k={k} top_p={top_p}")
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_vllms_off_values_are_taken():
    """vLLM takes top_k -1 as off (its old default) and seed -1 as none; its clients send
    them. Below those, still an error."""
    p = SamplingParams(temperature=0.7, top_k=-1, seed=-1)
    assert p.top_k == 0 and p.seed is None and p.mode == SamplingParams(temperature=0.7).mode
    with pytest.raises(UserError, match="top_k=-2"):
        SamplingParams(top_k=-2)
    with pytest.raises(UserError, match="seed=-2"):
        SamplingParams(seed=-2)


def test_logprob_alternatives_tied_at_the_cut_go_by_id():
    from specrt.runtime.sampling import token_logprobs

    x = np.zeros(200, np.float32)
    tied = [3, 7, *range(100, 110)]
    x[tied] = 5.0
    x[50] = 6.0
    (e,) = token_logprobs(x[None], [3], top=5)
    assert [i for i, _ in e.top] == [50, 3, 7, 100, 101]


def test_top_k_of_the_vocabulary_less_one_drops_the_least_likely():
    """top_k = V - 1 is a cut (a bound of V - 1 would take it for off)."""
    p = probs(np.array([[0.0, 1.0, 2.0, 3.0]]), SamplingParams(temperature=1.0, top_k=3))[0]
    assert p[0] == 0.0 and np.allclose(p[1:], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum())


def test_top_p_keeps_a_token_below_the_candidate_threshold_when_its_mass_is_needed():
    """One heavy token and 1000 light ones below the fast path's candidate threshold, top_p
    just past the heavy one's mass: the smallest prefix reaching it holds one light token."""
    n = 1000
    x = np.concatenate([[0.0], np.full(n, np.log(5e-5))])
    top_p = (1 + 1e-7) / (1 + n * 5e-5)
    p = probs(x[None], SamplingParams(temperature=1.0, top_p=top_p))[0]
    assert np.flatnonzero(p).tolist() == [0, 1]


def test_seed_zero_is_a_seed():
    assert make_rng(0).random() == make_rng(0).random() == np.random.default_rng(0).random()


def test_coupled_noise_of_neighbouring_seeds_is_not_shifted():
    """Seeds s and s + 1 must not share their noise one position apart."""
    from specrt.runtime.sampling import CoupledNoise

    assert not np.array_equal(CoupledNoise(1, 50).exp(0), CoupledNoise(0, 50).exp(1))


def test_a_coupled_draw_over_a_draft_vocabulary_is_the_target_vocabularys_race():
    """CoupledNoise.pick over a reduced draft vocabulary (q over Vd, ``ids`` its target ids)
    is the race over the target's vocabulary of q laid out at those ids: the same noise per
    target id, so the draft proposes the target's own draw whenever the races agree; and it
    is a draw from q. (This was pinned by an acceptance count only: session 56's mutation
    round.)"""
    from specrt.runtime.sampling import CoupledNoise
    from tests.runtime.test_verify import chi2_pvalue

    rng = np.random.default_rng(7)
    ids = np.sort(rng.choice(50, size=12, replace=False))  # not a prefix of the target's ids
    noise = CoupledNoise(3, 50)
    q = rng.dirichlet(np.ones(12))
    q[[2, 9]] = 0.0
    q /= q.sum()
    whole = np.zeros(50)
    whole[ids] = q
    draws = [noise.pick(q, j, ids) for j in range(6000)]
    assert draws == [noise.pick(whole, j) for j in range(6000)]
    assert set(draws) <= set(ids[q > 0].tolist())
    seen = np.array([draws.count(int(t)) for t in ids[q > 0]])
    assert chi2_pvalue(seen, q[q > 0] * len(draws)) > 0.01


def test_coupled_must_be_a_boolean():
    """mutation round 5, S06: "no" (true to Python) would turn coupled sampling on."""
    for bad in ("no", 1, None):
        with pytest.raises(UserError, match="coupled="):
            SamplingParams(temperature=0.7, coupled=bad)
    assert SamplingParams(temperature=0.7, coupled=np.bool_(True)).coupled


def test_coupled_sampling_is_a_mode_of_its_own_and_said_in_as_dict():
    """mutation round 5, S07 / S08: a calibration fitted for rejection sampling is not coupled
    sampling's (it accepts fewer drafts), and the answer's parameters say coupled."""
    on, off = SamplingParams(0.7, coupled=True), SamplingParams(0.7)
    assert on.mode == off.mode + ",coupled" and on.as_dict()["coupled"] is True and "coupled" not in off.as_dict()


def test_non_finite_logits_name_the_calls_row_and_fail_greedy_rows_too():
    """mutation round 5, S09 / S11: ``first_row`` offsets the row named; greedy probs checks
    its rows as sampled probs does (a NaN row's argmax is its first NaN, no error without it)."""
    x = np.zeros((3, 4))
    x[2, 1] = np.nan
    with pytest.raises(InternalError, match="NaN logits in row 7 of its call"):
        check_logits(x, "target", first_row=5)
    with pytest.raises(InternalError, match="NaN logits in row 2 of its call"):
        probs(x, SamplingParams())
    x[2, 1] = np.inf
    with pytest.raises(InternalError, match=r"\+inf logits in row 2 of its call"):
        probs(x, SamplingParams())


def test_logprobs_of_a_non_finite_row_raise():
    """mutation round 5, S29: a NaN row's logprobs would be NaN, sent to the client as such."""
    from specrt.runtime.sampling import token_logprobs

    for bad in (np.nan, np.inf):
        x = np.zeros((1, 4), np.float32)
        x[0, 2] = bad
        with pytest.raises(InternalError, match="non-finite logits"):
            token_logprobs(x, [0], top=2)


def test_logprob_alternatives_past_the_vocabulary_are_all_of_it():
    """mutation round 5, S30: top larger than the vocabulary gives every token, most likely first."""
    from specrt.runtime.sampling import token_logprobs

    (e,) = token_logprobs(np.log(np.array([[0.1, 0.4, 0.2, 0.3]], np.float32)), [0], top=6)
    assert [i for i, _ in e.top] == [1, 3, 2, 0]


# ---- mutation round 6 (each test names the mutant it kills) ----------------------------


def test_top_p_of_one_keeps_a_tail_that_rounding_hides_from_the_running_sum():
    """S26: top_p 1.0 is off. Applied, token 1 here (p = 4e-18) would be dropped: the mass
    before it, 1.0, is not < 1.0 * z once z = 1 + 4e-18 rounds to 1."""
    p = probs(np.array([[0.0, -40.0]]), SamplingParams(temperature=1.0, top_p=1.0))[0]
    assert p[1] == np.exp(-40.0) / (1 + np.exp(-40.0)) and p[0] > 0


def test_top_p_just_below_one_falls_back_to_sorting_the_whole_row():
    """S30: with top_p > 1 - 1e-9 no candidate threshold reaches top_p * z with the rounding
    margin (need > z), so every token is a candidate; the rule is then the full sort's."""
    for x in (np.array([[0.0, -40.0]]), np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))):
        top_p = 1 - 1e-12
        np.testing.assert_array_equal(probs(x, SamplingParams(1.0, 0, top_p)), reference_probs(x, 1.0, 0, top_p))
    assert np.count_nonzero(probs(np.array([[0.0, -40.0]]), SamplingParams(1.0, 0, 1 - 1e-12))) == 1


def test_top_p_candidates_summing_to_top_p_only_out_of_order_take_the_next_token():
    """S27: the candidates above the first threshold (1e-4 of the heaviest) sum, in id order, to
    at least top_p * z, but their heaviest-first running sum, the one the rule reads, stays
    below it: the heaviest token below the threshold is then in the smallest prefix reaching
    top_p, and only the margin on ``need`` lowers the threshold to reach it. (Rows and top_p
    are searched for: which rows round so depends on numpy's summation order.)"""
    for seed in range(100):
        rng = np.random.default_rng(seed)
        x = np.concatenate([[0.0], rng.uniform(np.log(2e-4), 0.0, 70), rng.uniform(np.log(1e-7), np.log(5e-5), 50)])
        rng.shuffle(x)
        e = np.exp(x - x.max())
        above = e >= 1e-4
        in_order, running = e[above].sum(), np.cumsum(np.sort(e[above])[::-1])[-1]
        top_p = in_order / e.sum()
        for _ in range(8):  # top_p * z between the two sums, if rounding lets it
            top_p = np.nextafter(top_p, 0.0 if top_p * e.sum() > in_order else 1.0)
            if running < top_p * e.sum() <= in_order:
                break
        if running < top_p * e.sum() <= in_order:
            break
    assert running < top_p * e.sum() <= in_order, "no row at the edge"
    got = probs(x[None], SamplingParams(1.0, 0, float(top_p)))[0]
    assert np.count_nonzero(got) == above.sum() + 1 and got[np.flatnonzero(~above)[e[~above].argmax()]] > 0
    order = np.argsort(-e, kind="stable")  # the rule over the whole row, sorted in full
    whole = order[np.cumsum(e[order]) - e[order] < top_p * e.sum()]
    assert np.flatnonzero(got).tolist() == sorted(whole.tolist())


def test_a_draw_of_exactly_zero_takes_no_token_of_zero_mass():
    """S38: u = 0.0 (which random() can return) must not take a zero-mass first token: the
    first token whose cumulative mass exceeds u (searchsorted side='right')."""
    from tests.runtime.test_verify import generator_drawing_zeros

    assert sample(np.array([0.0, 0.0, 0.5, 0.5]), generator_drawing_zeros()) == 2


def test_a_row_is_drawn_from_in_proportion_to_its_weights_whatever_their_total():
    """S39 / S40: ``sample`` scales its uniform by the row's total: weights halved draw the
    same tokens from the same seed, and a row whose total is the smallest subnormal, where
    u * total rounds up to the total, still never draws a zero-mass token."""
    p = np.array([0.1, 0.0, 0.6, 0.3])
    assert [sample(p / 2, make_rng(s)) for s in range(50)] == [sample(p, make_rng(s)) for s in range(50)]
    tiny, rng = np.array([0.0, 5e-324, 0.0]), make_rng(0)
    assert {sample(tiny, rng) for _ in range(20)} == {1}


def test_temperature_zero_alone_is_greedy():
    """S11: a tiny but non-zero temperature samples (a tie is split, logits 1e-8 apart are
    weighed by e); only 0 is the argmax."""
    assert not SamplingParams(temperature=1e-8).greedy
    p = probs(np.array([[0.0, 1e-8, 1e-8]]), SamplingParams(temperature=1e-8))[0]
    np.testing.assert_allclose(p, np.array([1, np.e, np.e]) / (1 + 2 * np.e))


def test_the_first_non_finite_row_is_the_one_named():
    """S17 / S73: with several bad rows the error names the first (where the answer failed)."""
    x = np.zeros((4, 3))
    x[1, 0], x[3, 2] = np.nan, np.inf
    with pytest.raises(InternalError, match="NaN logits in row 1 of its call"):
        check_logits(x, "target")
    y = np.zeros((4, 3))
    y[1, 0], y[3, 2] = np.inf, np.nan  # S73: the first bad row, whatever its kind
    with pytest.raises(InternalError, match=r"\+inf logits in row 1 of its call"):
        check_logits(y, "target")
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):  # S18 / S19: the engine given is named
        with pytest.raises(InternalError, match="^draft engine produced NaN logits in row 1 of"):
            probs(x, params, engine="draft")


def test_coupled_noise_seed_zero_is_a_seed():
    """S41: seed 0 is a seed for coupled sampling too (not fresh entropy): the same noise twice."""
    from specrt.runtime.sampling import CoupledNoise

    assert CoupledNoise(0, 8).seed == 0
    assert np.array_equal(CoupledNoise(0, 8).exp(3), CoupledNoise(0, 8).exp(3))


def test_booleans_and_an_infinite_temperature_are_refused():
    """S04 / S05 / S08 / S09: True is 1 to Python, but no temperature, top_p, top_k or seed; an
    infinite temperature would make every row uniform (and a -inf logit NaN). The CLI and serve
    check these themselves; the Python API has only SamplingParams."""
    for kw, name in [({"temperature": float("inf")}, "temperature"), ({"temperature": True}, "temperature"),
                     ({"top_p": True}, "top_p"), ({"top_k": True}, "top_k"), ({"top_k": False}, "top_k"),
                     ({"seed": True}, "seed"), ({"seed": False}, "seed")]:
        with pytest.raises(UserError, match=f"^{name}="):
            SamplingParams(**kw)


def test_numpy_integers_are_integers_to_the_sampling_options():
    """S58: top_k and seed as numpy integers (a value read from an array) are taken as ints are."""
    p = SamplingParams(0.7, np.int64(5), seed=np.int64(3))
    assert p.mode == SamplingParams(0.7, 5).mode and p.as_dict()["seed"] == 3
    assert SamplingParams(0.7, np.int64(-1)).top_k == 0


def test_greedy_rows_are_each_their_own_argmax():
    """S59: greedy probs over several rows puts each row's mass on its own argmax."""
    p = probs(np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]]), SamplingParams())
    assert p.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_the_mode_and_the_parameters_keep_what_was_asked():
    """S64 / S65: no seed is said as none (not seed 0), and a temperature's mode is not rounded
    to one decimal (0.75 and 0.8 are two calibrations)."""
    assert SamplingParams(0.75).as_dict() == {"temperature": 0.75, "top_k": 0, "top_p": 1.0, "seed": None}
    assert SamplingParams(0.75, seed=0).as_dict()["seed"] == 0
    assert SamplingParams(0.75, 40, 0.9).mode == "temperature=0.75,top_k=40,top_p=0.9" != SamplingParams(0.8).mode
