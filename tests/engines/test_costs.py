"""The cost table's helpers: past interpolation and synthetic feeds of the exact shapes."""

from __future__ import annotations

import time

import numpy as np
import pytest

from specrt import contracts as C
from specrt.engines.costs import interpolate, parse_costs, role_sizes, synthetic_feeds
from specrt.engines import load_engines


def test_interpolate_is_linear_between_points_and_careful_outside():
    pts = {128: 1.0, 512: 2.0}
    assert interpolate(pts, 320) == 1.5
    assert interpolate(pts, 0) == 1.0  # below the first point: its value
    assert interpolate(pts, 896) == 3.0  # above: the last slope
    assert interpolate({128: 2.0, 512: 1.0}, 1000) == 1.0  # a noisy negative slope is not extrapolated
    assert interpolate({128: 2.0}, 999) == 2.0
    assert interpolate({512: 2.0, 128: 1.0}, 320) == 1.5  # a table of pasts profiled in another order
    assert interpolate({512: 2.0, 128: 1.0, 256: 1.0}, 896) == 3.5  # above: the last segment's slope


def test_parse_costs_gives_integer_keys():
    t = parse_costs({"verify": {"1": 0.1, "8": 0.2}, "by_past": {"128": {"verify": {"1": 0.1}, "decode": 0.05}}})
    assert t["verify"] == {1: 0.1, 8: 0.2} and t["by_past"][128]["verify"] == {1: 0.1}
    assert parse_costs(None) == {} and parse_costs({}) == {}
    kept = {"verify": {"1": 0.1}, "pasts": [128], "reference_past": 128, "cpu_share": 0.5, "draft_kind": "peagle"}
    # the rest of the table kept
    assert {k: v for k, v in parse_costs(kept).items() if k != "by_past"} == {**kept, "verify": {1: 0.1}}
    assert parse_costs({"chain": {"9": "0.25"}, "decode": "0.5"})["chain"] == {9: 0.25}
    # a chain's cost is checked as the others' are, flat and per past (DSpark and prompt lookup divide by it)
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(ValueError, match="expected seconds > 0"):
            parse_costs({"chain": {"9": bad}})
        with pytest.raises(ValueError, match="expected seconds > 0"):
            parse_costs({"by_past": {"128": {"verify": {"1": 0.1}, "chain": {"9": bad}}}})
        with pytest.raises(ValueError, match="expected seconds > 0"):
            parse_costs({"prefill": bad})
        with pytest.raises(ValueError, match=f"a cost of '{bad}': expected seconds > 0"):  # as typed
            parse_costs({"by_past": {"128": {"verify": {"1": 0.1}, "draft_by_depth": {"2": bad}}}})


def test_synthetic_feeds_pass_validation_and_are_prefix_views(tiny_engines_append):
    e = load_engines(tiny_engines_append, verify=False)
    rng = np.random.default_rng(0)
    for name, r in e.runners.items():
        sizes = role_sizes(r, 100, draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
        feeds = synthetic_feeds(r, sizes, 1000, rng)
        seen = r.check_feeds(feeds)
        assert seen[C.DIM_PAST] == (0 if name == "prefill" else 100)
        kv = feeds[C.past_key(0)]
        assert kv.base is not None and kv.base.shape[1] == kv.shape[1] + 1  # a view of a longer buffer
    kw = dict(draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
    assert role_sizes(e.verify(8), 250, **kw) is None


def _with_a_second_past(e, scale: float = 2.0) -> tuple[int, int]:
    """The tiny engines profile one past (512 does not fit their context of 256): add a
    second row 256 tokens on, every cost of the first times ``scale``, so that what reads
    the table between two pasts has two to interpolate. Returns (lo, hi)."""
    import copy

    (lo, row), = e.costs["by_past"].items()

    def scaled(v):
        return {k: scaled(x) for k, x in v.items()} if isinstance(v, dict) else v * scale

    e.costs["by_past"][lo + 256] = scaled(copy.deepcopy(row))
    return lo, lo + 256


def test_cost_table_has_the_draft_per_block_depth(tiny_engines):
    """P-EAGLE: one pass per block depth, profiled at every built depth; EngineSet.draft_costs
    interpolates them at a past and the DSpark governor is built from them."""
    e = load_engines(tiny_engines, verify=False)
    for p, row in e.costs["by_past"].items():
        assert sorted(row["draft_by_depth"]) == list(e.depths)
        assert row["draft_by_depth"][max(e.depths)] == row["draft"]
        assert all(v > 0 for v in row["draft_by_depth"].values())
    by = e.draft_costs(100)
    assert sorted(by) == list(e.depths) and all(v > 0 for v in by.values())
    lo, hi = _with_a_second_past(e)
    mid = e.draft_costs((lo + 3 * hi) // 4)  # three quarters of the way from lo's costs to twice them
    assert mid == pytest.approx({k: 1.75 * v for k, v in e.costs["by_past"][lo]["draft_by_depth"].items()})
    del e.costs["by_past"][hi]
    from specrt.runtime.session import COST_PAST, make_governor

    g = make_governor("dspark", e)
    assert g.draft_cost(1) == pytest.approx(by[1]) and g.draft_cost(8) == pytest.approx(by[8])
    # a token tree: DSpark reads every built depth's own cost and adds a round's runners-up
    # itself (d drafts and n runners-up cost verify.{d + n} where built: 1, 2, 4, 8 here)
    g = make_governor("dspark:tree=2", e)
    assert g.tree_width == 2
    for d in e.depths:
        assert g.t_verify[d] == pytest.approx(e.cost(f"verify.{d}", COST_PAST)), d
    g.sib_wins, g.sib_tries = [1.0], [1.0]  # a runner-up always wins a rejected round: worth it where built
    # (prices set here: on a loaded host the measured verify.2 took over twice verify.1, and a
    # runner-up was rightly not worth it; this checks the built-depths rule, not the timings)
    g.t_verify = {d: 1e-3 * (1 + 0.1 * d) for d in e.depths}
    assert g._best_tree(1.0, 0.0, 0.0, 1)[1] == 1  # 1 + 1 = 2 built
    assert g._best_tree(1.0, 0.0, 0.0, 2)[1] == 0  # 2 + 1 = 3 not built: no runner-up
    # past the deepest depth a tree runs on the prefill engine, priced from the table's chains
    chains = e.chain_costs(COST_PAST)
    assert chains and g.verify_cost(max(chains)) == pytest.approx(g.load_target * chains[max(chains)])
    assert g.verify_cost(9) is not None and g.verify_cost(3) is None


def test_profile_times_each_verify_right_after_its_draft_pass(tiny_engines):
    """The cost profile calls the roles in the runtime's order: decode, then per depth the
    draft pass for that block and the verify right after it (the loop's neighbours: what a
    draft pass leaves in the caches and thread pools is what the verify meets)."""
    from specrt.engines.costs import chain_calls, loop_order

    e = load_engines(tiny_engines, verify=False)
    kw = dict(draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
    graph_of = {n: ("draft" if n == "draft" else "target") for n in e.runners}
    with e:
        calls = loop_order(e.runners, 100, (1, 2, 4, 8), "peagle", {"target": 1000, "draft": 1000}, graph_of, kw,
                           np.random.default_rng(0))
        keys = [k for k, _, _ in calls]
        assert keys == [("decode", None), ("draft", 1), ("verify.1", None), ("draft", 2), ("verify.2", None),
                        ("draft", 4), ("verify.4", None), ("draft", None), ("verify.8", None)]
        # lookup chains past depth 8: the prefill engine over the same past, timed apart
        chains = chain_calls(e.runners, 100, (1, 2, 4, 8), {"target": 1000, "draft": 1000}, np.random.default_rng(0))
        assert [k for k, _, _ in chains] == [("prefill", 9), ("prefill", 16), ("prefill", 32)]
        for (name, k), r, feeds in calls + chains:
            r.check_feeds(feeds)
            want = (1 if name == "decode" else 2 + (k or 8) - 1 if name == "draft" else k + 1 if name == "prefill"
                    else int(name.split(".")[1]) + 1)
            assert feeds[C.INPUT_IDS].shape[1] == want, (name, k)
            assert feeds[C.POSITION_IDS][0, 0] == 100 or name == "draft", (name, k)  # at the past
        # a past where verify.8 no longer fits: its draft pass is still profiled, after the rest
        tight = loop_order(e.runners, e.max_context - 5, (1, 2, 4, 8), "peagle", {"target": 1000, "draft": 1000},
                           graph_of, kw, np.random.default_rng(0))
        assert [k for k, _, _ in tight][-2:] == [("verify.4", None), ("draft", None)]
        # nor do the chains (10, 17 and 33 rows)
        assert chain_calls(e.runners, e.max_context - 5, (1, 2, 4, 8), {"target": 1000, "draft": 1000},
                           np.random.default_rng(0)) == []


def test_profiled_calls_share_one_kv_cache(tiny_engines):
    """The profile's calls at one past share their KV cache (and hidden-state) inputs, one
    buffer per input name, shape and dtype, as the runtime's roles share one cache: each call
    held its own, so a profile of SmolLM2's engines peaked at 1.38 GB against the 0.92 GB the
    engines take to run. Feeds made without a pool hold their own, as before."""
    from specrt.engines.costs import chain_calls, loop_order, synthetic_feeds

    e = load_engines(tiny_engines, verify=False)
    kw = dict(draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
    graph_of = {n: ("draft" if n == "draft" else "target") for n in e.runners}
    vocab = {"target": 1000, "draft": 1000}
    with e:
        pool: dict = {}
        calls = loop_order(e.runners, 100, (1, 2, 4, 8), "peagle", vocab, graph_of, kw, np.random.default_rng(0), pool)
        calls += chain_calls(e.runners, 100, (1, 2, 4, 8), vocab, np.random.default_rng(0), pool)
        target = [f for (name, _), _, f in calls if name != "draft"]
        big = [n for n, a in target[0].items() if a.dtype == np.float32 and a.size >= 1000]
        assert big and len(target) == 8  # decode, verify.1/2/4/8, three chains
        for n in big:
            assert all(np.shares_memory(f[n], target[0][n]) for f in target), n
        r = e.runners["verify.2"]
        sizes = role_sizes(r, 100, **kw)
        own = [synthetic_feeds(r, sizes, 1000, np.random.default_rng(i)) for i in range(2)]
        assert not any(np.shares_memory(own[0][n], own[1][n]) for n in big)


def test_cost_table_prices_lookup_chains_past_the_deepest_depth(tiny_engines):
    """The prefill engine timed at L = D + 1, 16 and CHAIN_TOKENS (32) rows over each past (what a
    lookup chain past the deepest verify depth runs on), read back per past by chain_costs
    and priced in between and beyond by the lookup policy; tables without them leave the
    lookup at the deepest depth."""
    from specrt.engines.costs import CHAIN_TOKENS, chain_lengths
    from specrt.runtime.ngram import NgramPolicy

    assert CHAIN_TOKENS == 32
    assert chain_lengths((1, 2, 4, 8)) == [9, 16, 32] and chain_lengths((1, 2, 4)) == [5, 16, 32]
    assert chain_lengths((1, 16)) == [17, 32] and chain_lengths((4, 24)) == [25, 32] and chain_lengths((40,)) == [41]
    e = load_engines(tiny_engines, verify=False)
    for p, row in e.costs["by_past"].items():
        assert sorted(row["chain"]) == [9, 16, 32] and all(v > 0 for v in row["chain"].values()), p
    lo, hi = _with_a_second_past(e)
    assert e.chain_costs(lo) == e.costs["by_past"][lo]["chain"]
    mid = e.chain_costs((lo + hi) // 2)  # linear in the past between the profiled ones
    assert mid == pytest.approx({L: 1.5 * v for L, v in e.costs["by_past"][lo]["chain"].items()})
    m = (lo + hi) // 2  # the lookup's prices are the table's at the past it is given, the draft's too
    pol = NgramPolicy.from_engines(e, m, max_len=12)
    assert pol.chain == pytest.approx(mid) and pol.table == pytest.approx(e.target_costs(m)) and pol.max_len == 12
    assert pol.route_guess == pytest.approx(1.5 / (e.cost("decode", m) + e.cost("draft", m)))
    del e.costs["by_past"][hi]
    pol = NgramPolicy.from_engines(e, lo)
    assert pol.max_len == CHAIN_TOKENS and pol.chain == e.chain_costs(lo)
    c9, c16, c32 = pol.chain[9], pol.chain[16], pol.chain[32]
    assert pol.cost(10) == pytest.approx(c9) and pol.cost(17) == pytest.approx(c16) and pol.cost(33) == pytest.approx(c32)
    assert pol.cost(13) == pytest.approx(c9 + (c16 - c9) * 3 / 7)  # 12 tokens: between
    assert pol.cost(25) == pytest.approx(c16 + (c32 - c16) * 8 / 16)
    assert pol.cost(9) == pytest.approx(e.cost("verify.8", lo))  # built depths: their own engine
    old = NgramPolicy(e.depths, e.target_costs(lo), None)  # a table profiled before chains
    assert old.max_len == 8 and old.choose(16, 4, 100) <= 8


def test_profile_keeps_the_pasts_where_every_depth_fits_and_the_first_as_reference(tiny_engines):
    """A past where some verify depth no longer fits the context gives no row (a governor
    reading it would miss that depth's cost); the flat entries are the first kept past's."""
    from specrt.engines.costs import profile_costs

    e = load_engines(tiny_engines, verify=False)
    with e:
        t = profile_costs(e.runners, vocab={"target": 1000, "draft": 1000}, depths=e.depths, draft_kind="peagle",
                          pasts=(16, 64, e.max_context - 5), repeats=1, warmup=0)
    assert t["pasts"] == [16, 64] and sorted(t["by_past"]) == ["16", "64"]
    assert all(sorted(map(int, row["chain"])) == [9, 16, 32] for row in t["by_past"].values())  # chains at each past
    assert t["reference_past"] == 16
    for k in ("verify", "decode", "draft", "draft_by_depth", "chain"):
        assert t[k] == t["by_past"]["16"][k], k
    assert sorted(t["verify"]) == [str(d) for d in e.depths]


def test_calls_fit_the_context_to_the_last_row(tiny_engines):
    """fits(): past + new <= the context, no more (a lookup chain of L tokens is L + 1 rows on
    the prefill engine, whose own dims allow it past the context)."""
    from specrt.engines.costs import chain_calls, fits

    e = load_engines(tiny_engines, verify=False)
    r, C_ = e.runner("prefill"), e.max_context
    assert fits(r, {C.DIM_NEW: 10, C.DIM_PAST: C_ - 10}) and not fits(r, {C.DIM_NEW: 10, C.DIM_PAST: C_ - 9})
    with e:
        vocab = {"target": 1000, "draft": 1000}
        rng = np.random.default_rng(0)
        assert [k for k, _, _ in chain_calls(e.runners, C_ - 10, (1, 2, 4, 8), vocab, rng)] == [("prefill", 9)]
        assert chain_calls(e.runners, C_ - 9, (1, 2, 4, 8), vocab, rng) == []
        # a profile of some roles without the prefill engine: no chains (they run on it)
        assert chain_calls({n: r for n, r in e.runners.items() if n != "prefill"}, 16, (1, 2, 4, 8), vocab, rng) == []


def test_an_infinite_cost_is_refused(engines_copy):
    # kills C11 (costs.py:290 `math.isfinite(t) and` dropped: a cost of Infinity, JSON's
    # `Infinity` included, loaded, and the governor priced every depth at 0 tokens/s)
    import json

    from specrt.errors import UserError

    for table in ({"decode": float("inf")}, {"verify": {"1": float("inf")}},
                  {"by_past": {"128": {"verify": {"1": 0.1}, "draft": float("inf")}}}):
        with pytest.raises(ValueError, match="a cost of inf: expected seconds > 0"):
            parse_costs(table)
    p = engines_copy / "engines.json"
    m = json.loads(p.read_text())
    next(iter(m["costs"]["by_past"].values()))["verify"]["1"] = float("inf")
    p.write_text(json.dumps(m))  # written as Infinity, which json reads back as inf
    with pytest.raises(UserError, match=r"engines.json: field 'costs' is malformed \(ValueError: a cost of inf"):
        load_engines(engines_copy, verify=False)


def test_the_prefill_call_profiled_fits_the_context(tiny_engines_append):
    """prefill_tokens past the engine's context is cut to it (a call of more would not run)."""
    e = load_engines(tiny_engines_append, verify=False)
    r = e.runners["prefill"]
    sizes = role_sizes(r, 0, draft_depth=8, draft_accepted=2, prefill_tokens=r.max_context + 100, draft_kind="peagle")
    assert sizes == {C.DIM_NEW: r.max_context, C.DIM_PAST: 0}


def test_a_call_below_an_engines_smallest_length_does_not_fit(tiny_engines_append):
    """fits() checks both ends of each dim's range: verify.1 takes 2 new tokens, never 1."""
    from specrt.engines.costs import fits

    e = load_engines(tiny_engines_append, verify=False)
    r = e.runners["verify.1"]
    assert fits(r, {C.DIM_NEW: 2, C.DIM_PAST: 10}) and not fits(r, {C.DIM_NEW: 1, C.DIM_PAST: 10})


# ---- session 68's mutation round (engines/costs.py) -----------------------------------------


def test_profiled_feeds_keep_one_buffer_per_input_and_each_graphs_vocabulary(tiny_engines):
    """The pool shares a buffer per input name (every role's past_key.0 is one cache), no
    further: a key's and a value's caches, or two layers', are distinct tensors in the runtime
    (mutation round: one buffer for every input of a shape timed the calls over a cache 2L
    times smaller). Token ids are drawn below each graph's own input vocabulary, the loop's
    draft passes of every depth (the draft's) and the chains (the target's) included."""
    from specrt.engines.costs import chain_calls, loop_order

    e = load_engines(tiny_engines, verify=False)
    kw = dict(draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
    graph_of = {n: ("draft" if n == "draft" else "target") for n in e.runners}
    with e:
        for vocab in ({"target": 1000, "draft": 7}, {"target": 7, "draft": 1000}):
            pool: dict = {}
            calls = loop_order(e.runners, 100, e.depths, "peagle", vocab, graph_of, kw, np.random.default_rng(0), pool)
            calls += chain_calls(e.runners, 100, e.depths, vocab, np.random.default_rng(0), pool)
            f = calls[0][2]  # decode's: its caches, every layer's keys and values of one shape
            big = [n for n, a in f.items() if a.dtype == np.float32 and a.size >= 1000]
            assert len(big) == 8 and not any(np.shares_memory(f[a], f[b]) for a in big for b in big if a != b), big
            for (name, k), _, feeds in calls:
                assert feeds[C.INPUT_IDS].max() < vocab[graph_of[name]], (vocab, name, k)


class _Counted:
    """A real runner whose calls are noted, (role, largest token id fed, feeds): what the
    profile's timing loops make of ``repeats`` and ``warmup``, which vocabulary each graph's
    ids come from, and which buffers the roles share."""

    def __init__(self, runner, seen: list):
        self.runner, self.seen = runner, seen

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def infer(self, feeds):
        self.seen.append((self.runner.name, int(feeds[C.INPUT_IDS].max()), feeds))
        return self.runner.infer(feeds)


def test_profile_calls_each_role_warmup_plus_repeats_times(tiny_engines):
    """Each call of the loop and of the chains ``warmup`` untimed and ``repeats`` timed times;
    the prefill, a slower call, a third of the repeats (at least one) after one warmup. The
    draft's token ids are drawn below its own vocabulary, the target's below the target's; the
    chains share the loop's KV cache (a cache of their own: more memory, other caches warm)."""
    from collections import Counter

    from specrt.engines.costs import profile_costs

    e = load_engines(tiny_engines, verify=False)
    seen: list[tuple[str, int, dict]] = []
    with e:
        profile_costs({n: _Counted(r, seen) for n, r in e.runners.items()}, vocab={"target": 1000, "draft": 7},
                      depths=e.depths, draft_kind="peagle", pasts=(16,), repeats=2, warmup=1)
    n = Counter(name for name, _, _ in seen)
    assert n["decode"] == 3 and all(n[f"verify.{d}"] == 3 for d in e.depths), n
    assert n["draft"] == 3 * len(e.depths), n  # a pass per built depth
    assert n["prefill"] == 3 * 3 + (1 + 1), n  # three chains; the prefill: max(1, 2 // 3) after 1
    top = {name: max(i for m, i, _ in seen if m == name) for name in n}
    assert top["draft"] < 7 and 7 <= top["decode"] < 1000, top
    first: dict[str, dict] = {}
    for name, _, feeds in seen:
        first.setdefault(name, feeds)  # the prefill's first: a chain's (timed before the prefill's own)
    big = [k for k, a in first["decode"].items() if a.dtype == np.float32 and a.size >= 1000]
    assert big and all(np.shares_memory(first["prefill"][k], first["decode"][k]) for k in big)


class _Sleeper:
    """A call that takes the given seconds in turn (the statistic over a role's repeats)."""

    def __init__(self, seconds):
        self.seconds = list(seconds)

    def infer(self, feeds):
        time.sleep(self.seconds.pop(0))


def test_a_roles_time_is_the_median_of_its_repeats():
    """One slow outlier (a burst of machine load) moves neither the median nor a fast one
    the mean would (0.21 s here) or the minimum (0 s)."""
    from specrt.engines.costs import time_round_robin

    t = time_round_robin([("a", _Sleeper([0.0, 0.02, 0.02, 0.02, 1.0]), {})], repeats=5, warmup=0)
    assert 0.02 <= t["a"] < 0.2, t


def test_profile_records_its_settings_a_prefill_cut_to_the_context_and_logs_ms(tiny_engines):
    """The table records the draft's depth and accepted slots it profiled with, the prefill's
    time and its tokens as called (cut to the context); the log line gives milliseconds; no
    past that fits is an InternalError naming the pasts asked for."""
    from specrt.engines.costs import profile_costs
    from specrt.errors import InternalError

    e = load_engines(tiny_engines, verify=False)
    said: list[str] = []
    kw = dict(vocab={"target": 1000, "draft": 1000}, depths=e.depths, draft_kind="peagle", repeats=1, warmup=0)
    with e:
        t = profile_costs(e.runners, pasts=(16,), draft_accepted=3, prefill_tokens=e.max_context + 50, log=said.append,
                          **kw)
        with pytest.raises(InternalError, match=rf"no profiled past length in \[{e.max_context}\] fits the context"):
            profile_costs(e.runners, pasts=(e.max_context,), **kw)
    assert t["draft_depth"] == 8 and t["draft_accepted"] == 3
    assert t["prefill_tokens"] == e.max_context and t["prefill"] > 0
    (line,) = said
    assert line.startswith(f"costs at past 16: decode {t['decode'] * 1e3:.2f} ms, verify.1 "), line
    assert f", draft {t['draft'] * 1e3:.2f} ms, chain.9 {t['chain']['9'] * 1e3:.2f} ms" in line, line


class _Inputs:
    """What synthetic_feeds reads of a runner: its inputs' specs."""

    def __init__(self, *inputs: C.TensorSpec):
        self.inputs = inputs


def test_synthetic_feeds_keep_each_inputs_dtype():
    """A half-precision engine's hidden states (TensorRT fp16) are fed as float16, its KV cache too."""
    r = _Inputs(C.TensorSpec(C.DRAFT_PREV_HIDDEN, "float16", (1, C.DIM_PREV, 4)),
                C.TensorSpec(C.past_key(0), "float16", (1, C.DIM_PAST, 2, 4)))
    f = synthetic_feeds(r, {C.DIM_PREV: 2, C.DIM_PAST: 3}, 10, np.random.default_rng(0))
    assert f[C.DRAFT_PREV_HIDDEN].dtype == np.float16 and f[C.DRAFT_PREV_HIDDEN].shape == (1, 2, 4)
    assert f[C.past_key(0)].dtype == np.float16 and f[C.past_key(0)].shape == (1, 3, 2, 4)


def test_a_draft_pass_is_sized_by_its_accepted_slots_and_depth(tiny_engines_append):
    """P-EAGLE's profiled pass: draft_accepted real slots (the aux rows) and draft_depth - 1
    mask slots after them."""
    e = load_engines(tiny_engines_append, verify=False)
    sizes = role_sizes(e.draft(), 100, draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
    assert sizes == {C.DIM_NEW: 9, C.DIM_AUX: 2, C.DIM_PAST: 100}


def test_busy_share_is_a_recorded_share_below_the_threshold():
    """busy_share: the table's cpu_share where it is a number in [0, BUSY_CPU_SHARE) (0.75: the
    2-core host gave 0.92 idle, 0.51 beside one busy loop), else None: idle, not recorded, or
    not a share (a bool, a text, a negative number)."""
    from specrt.engines.costs import busy_share

    for share, want in ((0.51, 0.51), (0.7, 0.7), (0, 0.0), (0.75, None), (0.92, None), (-0.5, None), (False, None),
                        (True, None), ("0.5", None), (float("nan"), None)):
        assert busy_share({"cpu_share": share}) == want, share
    assert busy_share(None) is None and busy_share({}) is None


class _RowPriced(_Counted):
    """A real runner that also sleeps ``per_row`` seconds a row of its input ids: calls of
    known, different costs (the tiny engines' own take ~0.1 ms)."""

    def __init__(self, runner, per_row: float):
        super().__init__(runner, [])
        self.per_row = per_row

    def infer(self, feeds):
        time.sleep(self.per_row * feeds[C.INPUT_IDS].shape[1])
        return self.runner.infer(feeds)


def test_a_peagle_blocks_draft_cost_is_its_own_pass(tiny_engines):
    """P-EAGLE's draft_by_depth gives each block depth k the time of its own pass (2 + k - 1
    rows here), profiled at every built depth, not the full block's: with a draft that takes
    10 ms a row, the block of 1 costs ~20 ms, that of 8 ~90 ms (mutant m74a-122: every block
    priced as the full one, so DSpark saw no saving in drafting shallower)."""
    from specrt.engines.costs import profile_costs

    e = load_engines(tiny_engines, verify=False)
    with e:
        runners = {n: (_RowPriced(r, 0.010) if n == "draft" else r) for n, r in e.runners.items()}
        table = profile_costs(runners, vocab={"target": 1000, "draft": 1000}, depths=e.depths, draft_kind="peagle",
                              pasts=(16,), repeats=3, warmup=1)
    by = {int(k): v for k, v in table["by_past"]["16"]["draft_by_depth"].items()}
    assert e.depths == (1, 2, 4, 8) and by[8] == table["draft"]
    assert by[1] < 0.5 * by[8] and by[4] < 0.8 * by[8], by  # 20 / 50 / 90 ms of sleep
    assert all(by[k] >= 0.010 * (k + 1) for k in e.depths), by
