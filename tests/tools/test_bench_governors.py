"""tools/bench_governors.py: issue 7's governor benchmark. Its replay helpers (cost table,
``price``, the oracles, ``bounds``, ``dspark_from_table``) on a recorded cost table shaped as
the build writes it (results/governors_s45, trimmed), its aggregation and governor wrappers
on real Telemetry and governors, the PNG, and the whole script end to end on tiny engines
with a word-level tokenizer (its report: per-kind and mixed ratios to the best fixed depth,
medians over repeats, the targets' verdicts, the summary table, calibration ECE)."""

from __future__ import annotations

import copy
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from specrt.runtime.governor import Calibration, DSparkGovernor, FixedGovernor, GovernorState
from specrt.runtime.telemetry import RoundResult, Telemetry
from tests.real_model import tool

ROOT = Path(__file__).resolve().parents[2]
# the cost table of results/governors_s45/bench_governors.json (at its reference past), trimmed
COSTS = {"verify": {"1": 0.03806557649659226, "2": 0.038536545500392094, "3": 0.0441243300010683,
                    "4": 0.04402617400046438},
         "decode": 0.03228818949719425, "draft": 0.0024983135008369572,
         "draft_by_depth": {"1": 0.0017353564981021918, "2": 0.0016789420042186975, "3": 0.0016673990030540153,
                            "4": 0.0024983135008369572},
         "chain": {"5": 0.028027514497807715, "16": 0.039085969496227335, "32": 0.05729580349725438}}
DEPTHS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def bg():
    return tool("bench_governors")


# ---- prompts -----------------------------------------------------------------------------


def test_prompts_interleave_the_kinds_and_an_offset_gives_disjoint_ones(bg, tmp_path):
    rows = [{"kind": k, "prompt": f"{k} {i}"} for k in ("code", "chat", "other") for i in range(3)]
    rows += [{"kind": "lists", "prompt": "lists 0"}]
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    got = bg.load_prompts(2, path=p)
    # kind order is KINDS', prompt by prompt; a kind without a prompt at index i is skipped;
    # kinds outside KINDS are not benchmarked
    assert [(g["kind"], g["prompt"]) for g in got] == [("chat", "chat 0"), ("code", "code 0"), ("lists", "lists 0"),
                                                       ("chat", "chat 1"), ("code", "code 1")]
    assert [g["prompt"] for g in bg.load_prompts(2, offset=1, path=p)] == ["chat 1", "code 1", "chat 2", "code 2"]
    # the calibration prompts (offset = --per-kind) and the run's share none, on the real file
    run, cal = bg.load_prompts(2), bg.load_prompts(3, offset=2)
    assert len(run) == 2 * len(bg.KINDS) and len(cal) == 3 * len(bg.KINDS)
    assert [g["kind"] for g in run[:5]] == list(bg.KINDS)
    assert not {g["prompt"] for g in run} & {g["prompt"] for g in cal}


def test_run_orders_put_each_governor_at_distinct_places_within_every_kind(bg):
    specs = [f"g{n}" for n in range(10)]  # e.g. off, off:ngram, six fixed depths, adaptive, dspark
    kinds = [k for _ in range(4) for k in bg.KINDS]  # 4 per kind, interleaved as load_prompts does
    orders = bg.run_orders(specs, kinds, 2)
    assert len(orders) == 20 and all(len(o) == 2 and sorted(o[0]) == specs for o in orders)
    for k in bg.KINDS:
        runs = [order for o, kind in zip(orders, kinds) if kind == k for order in o]
        for spec in specs:  # 8 runs of the kind: 8 distinct places for every governor
            assert len({order.index(spec) for order in runs}) == 8, (k, spec)
    # the kinds start apart; a prompt's repeats rotate by one place
    assert [o[0][0] for o in orders[:5]] == ["g0", "g1", "g2", "g3", "g4"]
    assert orders[0][1] == specs[1:] + specs[:1]
    # every place of every governor, once a kind has as many runs as governors
    runs = [order for o in bg.run_orders(specs[:5], ["chat"] * 3, 2) for order in o]
    assert all({order.index(s) for order in runs} == set(range(5)) for s in specs[:5])


# ---- the cost table ----------------------------------------------------------------------


def test_table_costs_reads_decode_verify_and_drafts_by_the_next_larger_block(bg):
    dec, ver, draft = bg.table_costs(COSTS, DEPTHS)
    assert dec == COSTS["decode"] and ver == {int(d): v for d, v in COSTS["verify"].items()}
    assert [draft(k) for k in (1, 2, 3, 4)] == [COSTS["draft_by_depth"][str(k)] for k in (1, 2, 3, 4)]
    sparse = {**COSTS, "draft_by_depth": {"2": 0.5, "4": 0.75}}
    _, _, draft = bg.table_costs(sparse, DEPTHS)
    assert [draft(k) for k in (1, 2, 3, 4, 6)] == [0.5, 0.5, 0.75, 0.75, 0.75]
    # a table that profiled the draft at one block: that is the deepest depth's
    old = {k: v for k, v in COSTS.items() if k != "draft_by_depth"}
    assert bg._draft_table(old, DEPTHS) == {4: COSTS["draft"]}
    assert bg.table_costs(old, DEPTHS)[2](1) == COSTS["draft"]
    assert bg._chain_table(COSTS) == {5: COSTS["chain"]["5"], 16: COSTS["chain"]["16"], 32: COSTS["chain"]["32"]}
    assert bg._chain_table({k: v for k, v in COSTS.items() if k != "chain"}) == {}


def test_rows_cost_built_depths_between_them_and_past_the_deepest(bg):
    from specrt.engines.costs import interpolate

    costs = {**COSTS, "verify": {"1": 0.01, "2": 0.02, "4": 0.04},
             "chain": {"3": 9.0, "4": 7.0, "6": 0.05, "10": 0.09}}
    cost = bg.rows_cost(costs, (1, 2, 4))
    assert [cost(m) for m in (1, 2, 3, 4)] == [0.01, 0.02, 0.04, 0.04]  # 3 rows: the next built depth
    # past the deepest, the chains longer than it, interpolated (those of 3 and 4 rows are not)
    assert cost(5) == 0.05 and cost(6) == 0.05 and cost(8) == pytest.approx(0.07) and cost(10) == 0.09
    assert cost(14) == pytest.approx(interpolate({6: 0.05, 10: 0.09}, 14)) == pytest.approx(0.13)
    # no chains (a table profiled before 2026-12-02): the deepest depth's verify
    flat = bg.rows_cost({k: v for k, v in costs.items() if k != "chain"}, (1, 2, 4))
    assert flat(9) == 0.04 and flat(3) == 0.04
    deeper = bg.rows_cost({**costs, "verify": {"1": 0.01, "2": 0.02, "4": 0.04, "8": 0.08}}, (1, 2, 4, 8))
    assert [deeper(m) for m in (3, 5, 8)] == [0.04, 0.08, 0.08]


def test_dspark_from_table_is_the_runtime_governor_on_the_table(bg):
    cal = Calibration(positions=4)
    g = bg.dspark_from_table(COSTS, DEPTHS, cal, probe_every=7)
    assert isinstance(g, DSparkGovernor) and g.probe_every == 7
    assert g.t_verify == {d: COSTS["verify"][str(d)] for d in DEPTHS} and g.t_decode == COSTS["decode"]
    assert g._p_draft_by == {k: COSTS["draft_by_depth"][str(k)] for k in DEPTHS}
    assert g._p_chain == {5: COSTS["chain"]["5"], 16: COSTS["chain"]["16"], 32: COSTS["chain"]["32"]}
    assert g.verify_cost(6) == pytest.approx(COSTS["chain"]["5"] + (COSTS["chain"]["16"] - COSTS["chain"]["5"]) / 11)
    # it learns on its own copy of the calibration
    assert g.calibration is not cal
    assert json.dumps(g.calibration.to_dict()) == json.dumps(cal.to_dict())
    assert isinstance(bg.dspark_from_table({k: v for k, v in COSTS.items() if k != "chain"}, DEPTHS).calibration,
                      Calibration)
    assert bg.dspark_from_table({k: v for k, v in COSTS.items() if k != "chain"}, DEPTHS)._p_chain == {}


# ---- pricing, the oracles and the bounds -------------------------------------------------


def test_price_counts_tokens_and_seconds_by_the_table(bg):
    dec, ver, draft = bg.table_costs(COSTS, DEPTHS)
    choices, accepted = [0, 1, 4, 2], [0, 3, 2, 2]
    tokens = 1 + 2 + 3 + 3  # min(a, d) + 1
    sec = (draft(1) + dec) + (draft(1) + ver[1]) + (draft(4) + ver[4]) + (draft(2) + ver[2])
    assert bg.price(choices, accepted, COSTS, DEPTHS) == pytest.approx(tokens / sec)
    # a decode without a draft paid first (a pre-draft decision)
    sec0 = sec - draft(1)
    assert bg.price(choices, accepted, COSTS, DEPTHS, drafted_zero=False) == pytest.approx(tokens / sec0)


def _best_rate(tokens, cost) -> float:
    tokens, cost = np.asarray(tokens, float), np.asarray(cost, float)
    return max(sum(tokens[r, o] for r, o in enumerate(p)) / sum(cost[o] for o in p)
               for p in itertools.product(range(tokens.shape[1]), repeat=tokens.shape[0]))


def test_rate_optimal_finds_the_best_rate_of_the_run(bg):
    rng = np.random.default_rng(0)
    for _ in range(30):
        rounds, options = int(rng.integers(1, 6)), int(rng.integers(2, 5))
        tokens = rng.integers(1, 6, size=(rounds, options)).astype(float)
        cost = rng.uniform(0.1, 2.0, size=options)
        pick = bg.rate_optimal(tokens, cost)
        got = tokens[np.arange(rounds), pick].sum() / cost[pick].sum()
        assert got == pytest.approx(_best_rate(tokens, cost), rel=1e-9)
    # a greedy per-round choice (best tokens per second of each round alone) is not optimal here:
    # option 1 gives 3 tokens for 2 s (1.5/s) against 1 token for 1 s, yet the run's best picks it
    # only where it gains 2 tokens for 1 more second at a run rate below 2
    tokens, cost = [[1, 3], [1, 1]], [1.0, 2.0]
    assert list(bg.rate_optimal(tokens, cost)) == [1, 0]


def test_oracle_choices_verify_the_smallest_depth_that_takes_every_accepted_draft(bg):
    accepted = [0, 1, 2, 3, 4, 0, 2]
    assert bg.oracle_choices(accepted, COSTS, DEPTHS) == [0, 1, 2, 3, 4, 0, 2]
    # where verify.4 costs less than verify.3, a round taking 3 drafts verifies 4 (same tokens)
    cheap4 = {**COSTS, "verify": {**COSTS["verify"], "4": 0.042}}
    assert bg.oracle_choices([3, 0], cheap4, DEPTHS) == [4, 0]
    # where a verify of 1 costs less than a decode without a draft ... but not with one
    cheap1 = {**COSTS, "verify": {**COSTS["verify"], "1": 0.031}}
    assert bg.oracle_choices([0, 1], cheap1, DEPTHS, drafted_zero=False) == [0, 1]
    assert bg.oracle_choices([0, 1], cheap1, DEPTHS) == [1, 1]
    # the bonus token counts: where every verify costs more than two decodes, one accepted
    # draft (2 tokens) is not worth a verify
    dear = {**COSTS, "verify": {d: 0.1 for d in COSTS["verify"]}}
    assert bg.oracle_choices([1, 1, 0], dear, DEPTHS) == [0, 0, 0]
    assert bg.oracle_choices([4, 1, 0], dear, DEPTHS) == [4, 0, 0]


def test_bounds_compare_the_oracles_with_the_best_fixed_depth(bg):
    assert bg.bounds([], COSTS, DEPTHS) == {}
    acc = [0, 1, 2, 0, 4, 3, 1, 0, 2, 2]
    b = bg.bounds(acc, COSTS, DEPTHS)
    fixed = {d: bg.price([d] * len(acc), acc, COSTS, DEPTHS) for d in DEPTHS}
    best = max(fixed, key=fixed.get)
    assert b["rounds"] == len(acc) and b["fixed_tokens_per_s"] == pytest.approx({str(d): v for d, v in fixed.items()})
    assert b["best_fixed"] == f"fixed:{best}" and b["off_tokens_per_s"] == pytest.approx(1 / COSTS["decode"])
    post = bg.price(bg.oracle_choices(acc, COSTS, DEPTHS), acc, COSTS, DEPTHS)
    pre = bg.price(bg.oracle_choices(acc, COSTS, DEPTHS, drafted_zero=False), acc, COSTS, DEPTHS,
                   drafted_zero=False)
    assert b["post_draft_oracle_vs_best_fixed"] == pytest.approx(post / fixed[best])
    assert b["pre_draft_oracle_vs_best_fixed"] == pytest.approx(pre / fixed[best])
    assert 1.0 < b["post_draft_oracle_vs_best_fixed"] < b["pre_draft_oracle_vs_best_fixed"]
    # every round taking the whole block: fixed:4 is best and no oracle beats it
    full = bg.bounds([4] * 6, COSTS, DEPTHS)
    assert full["best_fixed"] == "fixed:4" and full["post_draft_oracle_vs_best_fixed"] == pytest.approx(1.0)


def _sets(**tps) -> dict:
    specs = ("off", "fixed:1", "fixed:3", "adaptive", "dspark")
    return {g: {s: {"tokens_per_s": float(v)} for s, v in zip(specs, row)} for g, row in tps.items()}


def test_judge_takes_each_sets_own_best_fixed_depth_and_issue_7s_thresholds(bg):
    #                 off  fixed:1 fixed:3 adaptive dspark
    res = _sets(chat=(10, 20, 50, 25, 49), code=(5, 40, 10, 41, 41), lists=(60, 20, 30, 10, 40),
                mixed=(20, 30, 100, 90, 105))
    summary, ok = bg.judge(res, ["fixed:1", "fixed:3"], "adaptive", "dspark")
    assert summary["chat"] == {"best_fixed": "fixed:3", "best_static": "fixed:3", "dspark_vs_best_fixed": 0.98,
                               "dspark_vs_best_static": 0.98, "dspark_vs_adaptive": 49 / 25, "dspark_vs_off": 4.9}
    # on code fixed:1 is best, though fixed:3 is on the mixed set; on lists off beats every depth
    assert summary["code"]["best_fixed"] == "fixed:1" and summary["code"]["dspark_vs_best_fixed"] == 41 / 40
    assert summary["lists"]["best_static"] == "off" and summary["lists"]["dspark_vs_best_static"] == 40 / 60
    assert summary["mixed"]["dspark_vs_best_fixed"] == 1.05 and summary["mixed"]["dspark_vs_adaptive"] == 105 / 90
    assert ok == {"chat: dspark >= 0.98x best fixed": True, "chat: dspark > adaptive": True,
                  "code: dspark >= 0.98x best fixed": True, "code: dspark > adaptive": False,  # a tie is not above
                  "lists: dspark >= 0.98x best fixed": True, "lists: dspark > adaptive": True,
                  "mixed: dspark >= 1.05x best fixed": True, "mixed: dspark > adaptive": True}
    _, ok = bg.judge(_sets(chat=(10, 20, 50, 25, 48.9), mixed=(20, 30, 100, 90, 104.9)),
                     ["fixed:1", "fixed:3"], "adaptive", "dspark")
    assert not ok["chat: dspark >= 0.98x best fixed"] and not ok["mixed: dspark >= 1.05x best fixed"]


# ---- aggregation and the governor wrappers -----------------------------------------------


def _tel(rounds: list[tuple[int, int]], seconds: float) -> Telemetry:
    t = Telemetry()
    for d, a in rounds:
        t.record(RoundResult(depth=d, accepted=a, t_draft=0.001 if d else 0.0, t_verify=0.01, t_round=0.012))
    t.seconds = seconds
    return t


def test_agg_sums_tokens_and_seconds_and_merges_the_counters(bg):
    runs = [{"tokens": 10, "seconds": 1.0, "telemetry": _tel([(2, 2), (2, 0)], 1.0)},
            {"tokens": 30, "seconds": 0.5, "telemetry": _tel([(2, 1), (0, 0)], 0.5)}]
    a = bg.agg(runs)
    # tokens/s of a set: sum tokens / sum seconds (not the mean of the prompts' rates: 25)
    assert (a["tokens"], a["seconds"], a["tokens_per_s"]) == (40, 1.5, pytest.approx(40 / 1.5))
    assert a["rounds"] == 4 and a["draft_rounds"] == 3 and a["depth_histogram"] == {"0": 1, "2": 3}
    assert a["acceptance_by_position"] == pytest.approx([2 / 3, 1 / 3])
    assert a["tau"] == pytest.approx(1 + 3 / 3)
    assert bg.agg([{"tokens": 0, "seconds": 0.0, "telemetry": Telemetry()}])["tokens_per_s"] == 0.0
    # agg does not change the runs' telemetry (merged into a fresh one)
    assert runs[0]["telemetry"].rounds == 2


def test_recording_keeps_drafted_rounds_and_passes_the_rest_through(bg):
    inner = _Counting()
    rec = bg.Recording(inner)
    for d, a in [(2, 1), (0, 0), (2, 2), (1, 0)]:
        rec.observe(RoundResult(depth=d, accepted=a))
    assert rec.accepted == [1, 2, 0] and inner.seen == [1, 0, 2, 0]
    assert rec.depths == inner.depths and rec.tree_width == inner.tree_width
    assert rec.choose is not None and rec.gov is inner


class _Counting(FixedGovernor):
    """fixed:2 that keeps what it observed and takes ``wait`` seconds to observe."""

    def __init__(self, wait: float = 0.0):
        super().__init__((1, 2), 2)
        self.seen, self.wait = [], wait
        self.extra = "x"

    def observe(self, r):
        self.seen.append(r.accepted)
        time.sleep(self.wait)


def test_timed_counts_and_times_every_decision(bg):
    inner = _Counting(wait=0.02)
    t = bg.Timed(inner)
    assert t.seconds == 0.0 and t.extra == "x"
    t.observe(RoundResult(depth=2, accepted=1))
    t.observe(RoundResult(depth=2, accepted=2))
    assert inner.seen == [1, 2] and (t.choose_calls, t.observe_calls) == (0, 2) and t.seconds >= 0.04
    s = t.seconds
    assert t.choose(GovernorState(limit=1)) == 1 and t.choose(GovernorState()) == 2
    assert t.choose_calls == 2 and t.seconds > s
    c = copy.copy(t)  # no recursion through __getattr__ while ``gov`` is unset
    assert c.gov is inner
    with pytest.raises(AttributeError):
        bg.Timed.__new__(bg.Timed).gov


# ---- the plot --------------------------------------------------------------------------


def test_plot_draws_acceptance_per_kind_and_dspark_depth_shares(bg, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", lambda f=None: figs.append(f))
    res = {g: {"fixed:4": {"acceptance_by_position": acc},
               "dspark": {"depth_histogram": hist}}
           for g, acc, hist in [("chat", [0.5, 0.25, 0.1, 0.05], {"0": 1, "2": 3}),
                                ("code", [0.8, 0.6, 0.4, 0.2], {"4": 2}),
                                ("mixed", [0.6, 0.4, 0.2, 0.1], {"0": 1, "2": 3, "4": 2})]}
    png = tmp_path / "g.png"
    bg.plot(res, ["off", "fixed:4", "dspark"], DEPTHS, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    a1, a2 = figs[0].axes
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in a1.get_lines()}
    assert lines == {g: res[g]["fixed:4"]["acceptance_by_position"] for g in ("chat", "code", "mixed")}
    assert list(a1.get_lines()[0].get_xdata()) == [1, 2, 3, 4]
    # one bar per kind and chosen depth (0 = decode, then the built depths): the share of rounds
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in a2.containers}
    assert bars == {"chat": [0.25, 0, 0.75, 0, 0], "code": [0, 0, 0, 0, 1.0],
                    "mixed": pytest.approx([1 / 6, 0, 0.5, 0, 2 / 6])}
    assert [t.get_text() for t in a2.get_xticklabels()] == ["0", "1", "2", "3", "4"]


# ---- the script end to end ---------------------------------------------------------------


@pytest.fixture(scope="module")
def run_report(tmp_path_factory):
    """bench_governors.py on tiny engines (depths 1 and 3, a random draft, word tokens): two
    prompts per kind, three repeats, calibration fitted on one more prompt per kind first."""
    from tests.runtime.test_text import _tiny_text_pair, _words

    root = tmp_path_factory.mktemp("bench_governors")
    eng = _tiny_text_pair(root, 16, 12, _words)
    prompts = root / "prompts.jsonl"
    kinds = ("chat", "code", "lists", "stories", "arithmetic")
    words = [f"w{4 + (i * 7 + j * 3) % 12}" for i in range(15) for j in range(6)]
    rows = [{"kind": k, "prompt": " ".join(words[(i * 5 + n) * 6 % 84:][:6])} for n, k in enumerate(kinds)
            for i in range(3)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = root / "out"
    env = {**os.environ, "SPECRT_THP": "0", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_governors.py"), "--engines", str(eng),
                        "--prompts", str(prompts), "--per-kind", "2", "--repeats", "3", "--max-new-tokens", "8",
                        "--calibrate-per-kind", "1", "--work", str(root / "work"), "--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((out / "bench_governors.json").read_text()), out, r.stdout


def test_report_ratios_are_to_the_best_fixed_depth_of_each_set(run_report):
    rep, _, _ = run_report
    groups = ["chat", "code", "lists", "stories", "arithmetic", "mixed"]
    assert list(rep["results"]) == groups and list(rep["summary"]) == groups
    assert rep["governors"] == ["off", "fixed:1", "fixed:3", "adaptive", "dspark"] and rep["depths"] == [1, 3]
    for g in groups:
        res, s = rep["results"][g], rep["summary"][g]
        tps = {spec: res[spec]["tokens_per_s"] for spec in rep["governors"]}
        best = max(["fixed:1", "fixed:3"], key=tps.get)
        static = max(["fixed:1", "fixed:3", "off"], key=tps.get)
        assert (s["best_fixed"], s["best_static"]) == (best, static), g
        assert s["dspark_vs_best_fixed"] == pytest.approx(tps["dspark"] / tps[best])
        assert s["dspark_vs_best_static"] == pytest.approx(tps["dspark"] / tps[static])
        assert s["dspark_vs_adaptive"] == pytest.approx(tps["dspark"] / tps["adaptive"])
        assert s["dspark_vs_off"] == pytest.approx(tps["dspark"] / tps["off"])


def test_report_sets_sum_their_own_prompts_medians(run_report):
    rep, _, _ = run_report
    for spec, runs in rep["per_prompt"].items():
        assert len(runs) == 10 and [r["prompt"] for r in runs] == list(range(10))
        assert [r["kind"] for r in runs[:5]] == list(rep["results"])[:5]
        for r in runs:  # per prompt the median over the repeats
            assert len(r["all_seconds"]) == 3 and r["seconds"] == statistics.median(r["all_seconds"])
        for k in list(rep["results"])[:5]:  # 2 prompts x 3 repeats of a kind: each governor at 5 places of 5
            assert {p for r in runs if r["kind"] == k for p in r["places"]} == set(range(5)), (spec, k)
            assert r["tokens"] == 7  # the first of 8 comes from prefill
        for g, res in rep["results"].items():
            mine = [r for r in runs if g == "mixed" or r["kind"] == g]
            assert res[spec]["tokens"] == sum(r["tokens"] for r in mine)
            assert res[spec]["seconds"] == pytest.approx(sum(r["seconds"] for r in mine))
            assert res[spec]["tokens_per_s"] == pytest.approx(res[spec]["tokens"] / res[spec]["seconds"])
            # a run's seconds are its decode time: the first repeat's wall time (its telemetry's
            # engines + Python) less the prefill
            split = res[spec]["time_split"]
            assert split["prefill"] > 0
            assert sum(split.values()) - split["prefill"] == pytest.approx(sum(r["all_seconds"][0] for r in mine))
    for g, res in rep["results"].items():  # each governor verified its own depths (0: the budget's last token)
        assert set(res["off"]["depth_histogram"]) == {"0"} and set(res["fixed:1"]["depth_histogram"]) <= {"0", "1"}
        assert "3" in res["fixed:3"]["depth_histogram"] and set(res["fixed:3"]["depth_histogram"]) <= {"0", "1", "3"}
    assert rep["mismatches"] == [] and rep["repeats"] == 3 and rep["per_kind"] == 2


def test_report_verdicts_are_issue_7s_targets(run_report):
    rep, out, stdout = run_report
    s, ok = rep["summary"], rep["targets"]
    want = {"lossless": True}
    for g in rep["results"]:
        need = 1.05 if g == "mixed" else 0.98
        want[f"{g}: dspark >= {need}x best fixed"] = s[g]["dspark_vs_best_fixed"] >= need
        want[f"{g}: dspark > adaptive"] = s[g]["dspark_vs_adaptive"] > 1.0
    d = rep["dspark_decision"]
    want["dspark decision <= 1% of its decode time"] = d["share_of_decode"] <= 0.01
    assert ok == want
    # its decisions are timed over every repeat of every prompt, against all their decode seconds
    assert d["decode_seconds"] == pytest.approx(sum(sum(r["all_seconds"]) for r in rep["per_prompt"]["dspark"]))
    assert d["share_of_decode"] == pytest.approx(d["seconds"] / d["decode_seconds"])
    # (dspark learns online: a repeat may take other rounds than the first, the one reported)
    mixed = rep["results"]["mixed"]["dspark"]
    assert mixed["rounds"] + 2 * len(rep["per_prompt"]["dspark"]) <= d["observe_calls"] <= 3 * mixed["tokens"]
    assert d["choose_calls"] >= d["observe_calls"]
    text = (out / "summary.txt").read_text()
    for name, passed in ok.items():
        assert f"  [{'PASS' if passed else 'FAIL'}] {name}" in text.splitlines()
    assert text in stdout.replace("\n\n", "\n") or text.splitlines()[0] in stdout
    assert "lossless: yes" in text


def test_report_bounds_split_the_full_depth_rounds_by_kind(run_report, bg):
    rep, out, _ = run_report
    b = rep["bounds"]
    assert list(b) == list(rep["results"])
    kinds = [g for g in b if g != "mixed"]
    # every full-depth round (of every repeat) belongs to one kind
    assert sum(b[g]["rounds"] for g in kinds) == b["mixed"]["rounds"] >= rep["results"]["mixed"]["fixed:3"]["rounds"]
    for g in b:  # greedy: the three repeats draft the same rounds
        assert b[g]["rounds"] == 3 * rep["results"][g]["fixed:3"]["draft_rounds"], g
        assert set(b[g]["fixed_tokens_per_s"]) == {"1", "3"}
        assert b[g]["post_draft_oracle_vs_best_fixed"] >= 1.0 - 1e-9
    assert b["mixed"]["off_tokens_per_s"] == pytest.approx(1 / rep["costs"]["decode"])
    assert (out / "bench_governors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_carries_calibration_ece_per_position_before_and_after(run_report):
    rep, _, stdout = run_report
    ece = rep["calibration"]["ece"]
    for which in ("conditional", "survival"):
        assert len(ece[which]["before"]) == len(ece[which]["after"]) == 3  # positions of the deepest depth
        assert all(v is None or 0.0 <= v <= 1.0 for v in ece[which]["before"] + ece[which]["after"])
    assert "ECE" in stdout


def test_differences_name_each_run_whose_output_is_not_offs(bg):
    """G63: the lossless check names every governor's repeat whose greedy output differs from
    `off`'s first run, and the first token where it does (where one ends early, its end); runs
    equal to it are no difference (the check had no test: a bench with the comparison gone
    reported every run lossless)."""
    same, ref = {"out": [5, 6, 7, 8]}, {"out": [5, 6, 7, 8]}
    reps = {"off": [ref, same], "fixed:3": [same, {"out": [5, 6, 9, 8]}], "dspark": [{"out": [5, 6]}, same],
            "fixed:2": [{"out": [5, 6, 7, 8, 1]}]}
    assert bg.differences(reps, 4, "code") == [
        {"prompt": 4, "kind": "code", "governor": "fixed:3", "repeat": 1, "first_difference": 2},
        {"prompt": 4, "kind": "code", "governor": "dspark", "repeat": 0, "first_difference": 2},
        {"prompt": 4, "kind": "code", "governor": "fixed:2", "repeat": 0, "first_difference": 4}]
    assert bg.differences({"off": [ref, same], "fixed:3": [same]}, 0, "chat") == []
    assert bg.differences({"off": [ref, {"out": [5]}]}, 1, "chat")[0]["repeat"] == 1  # off's own repeats too


def test_a_wrong_engines_folder_prompts_file_or_governor_is_one_error_line(tmp_path):
    """Before: specrt's own UserError (no such engines folder, a governor spec it does not know) a
    traceback, a missing --prompts file a FileNotFoundError traceback; now an error line naming
    it, exit 1 (2 for the option argparse checks), nothing written; an extra governor of the
    standard set is refused (it ran twice)."""
    from tests.runtime.test_text import _tiny_text_pair, _words

    eng = _tiny_text_pair(tmp_path / "pair", 16, 12, _words)
    env = {**os.environ, "SPECRT_THP": "0", "OMP_NUM_THREADS": "1"}
    for args, code, error in (
            (["--engines", str(tmp_path / "nowhere")], 1, f"error: {tmp_path / 'nowhere'}: no such engines folder"),
            (["--engines", str(eng), "--prompts", str(tmp_path / "none.jsonl")], 2,
             f"error: --prompts {tmp_path / 'none.jsonl'}: no such file"),
            (["--engines", str(eng), "--extra-governors", "fixed:9x"], 1, "error: governor 'fixed:9x': expected"),
            # (m74d's finding: one of the standard set ran twice in every order)
            (["--engines", str(eng), "--extra-governors", "DSpark"], 1,
             "error: --extra-governors: DSpark is in the standard set already (off, fixed:")):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_governors.py"), *args, "--per-kind", "1",
                            "--max-new-tokens", "2", "--no-chat", "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
        assert error in r.stderr.splitlines()[-1], r.stderr
        assert not (tmp_path / "out").exists()


def test_an_empty_or_repeated_extra_governor_is_refused_by_its_place(tmp_path):
    """h74e (h74b's leftover): `--extra-governors 'dspark:block=4,,fixed:1'` ran both without a
    word (the empty item dropped); refused now as specrt bench's --governors is (the same check),
    before any engines load, and a spec given twice too (any case)."""
    env = {**os.environ, "SPECRT_THP": "0", "OMP_NUM_THREADS": "1"}
    for extra, error in (
            ("dspark:block=4,,fixed:1", "item 2 of 3 is empty; expected a comma-separated list without empty items"),
            ("fixed:1, FIXED:1", "item 2 (FIXED:1) repeats item 1; each runs once beside the standard set")):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_governors.py"), "--engines",
                            str(tmp_path / "nowhere"), "--extra-governors", extra, "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.splitlines()[-1] == f"error: --extra-governors {extra!r}: {error}", r.stderr
        assert not (tmp_path / "out").exists()


def test_depths_are_parsed_as_build_parses_them(tmp_path, bg):
    """r74 (h74e's leftover: bench_engines' --depths went through parse_depths, this tool's did
    not): `--depths 1,,2` was argparse's "invalid <lambda> value", `--depths 2,2` taken (built
    1 depth into a folder named for 2,2), `--depths 1-4` refused; now as `specrt build --depths`
    (the same parse_depths), said before any engines load."""
    env = {**os.environ, "SPECRT_THP": "0", "OMP_NUM_THREADS": "1"}
    for depths, error in (("1,,2", "--depths '1,,2': item 2 of 3 is empty; expected comma-separated integers"),
                          ("2,2", "--depths '2,2': depth 2 is named twice (items 1 and 2); each depth is built once")):
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_governors.py"), "--engines",
                            str(tmp_path / "nowhere"), "--depths", depths, "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.splitlines()[-1].startswith(f"error: {error}"), r.stderr
        assert not (tmp_path / "out").exists()
    assert bg.depths_arg("1-4,8") == (1, 2, 3, 4, 8)  # (a range, as build takes it)


def test_extra_governors_typed_with_spaces_are_the_specs_themselves(bg):
    """Mutants m74d-44 (the items kept as typed): `--extra-governors 'dspark:block=4, fixed:1'`
    ran a governor named " fixed:1" (the report's and the plot's label), where the repeat check
    beside it had compared the stripped spec; m74d-73 (no item dropped): `--extra-governors ''`
    (an unset shell variable), no extra governor as the default, was a governor spec "" refused
    only once the engines had loaded."""
    assert bg.extra_governors("dspark:block=4, fixed:1 ") == ["dspark:block=4", "fixed:1"]
    assert bg.extra_governors("") == bg.extra_governors(" ") == []


def test_an_extra_governor_of_the_standard_set_is_refused_before_the_engines_load(tmp_path, bg):
    """Session 74's leftover (r74): `--extra-governors DSpark` was refused only once the engines
    had loaded, and after `--calibrate-per-kind` had calibrated them (ENG/calibration.json
    written, then the error); the standard set's depths are read from the engines folder's
    manifest (or are --depths, where the engines are built here), so it is refused first."""
    from argparse import Namespace

    from specrt.errors import UserError
    from tests.runtime.test_text import _tiny_text_pair, _words

    eng = _tiny_text_pair(tmp_path / "pair", 16, 12, _words)
    env = {**os.environ, "SPECRT_THP": "0", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_governors.py"), "--engines", str(eng),
                        "--extra-governors", "fixed:2,DSpark", "--calibrate-per-kind", "1", "--per-kind", "1",
                        "--max-new-tokens", "3", "--no-chat", "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    # (fixed:2 is not of it: the engines' depths are 1 and 3, not --depths' default)
    assert r.stderr.splitlines() == ["error: --extra-governors: DSpark is in the standard set already (off, "
                                     "fixed:1, fixed:3, adaptive, dspark)"], r.stderr
    assert not (eng / "calibration.json").exists() and not (tmp_path / "out").exists()
    # engines to be built here: the set is --depths' (here with --tree's suffix)
    args = Namespace(engines=None, depths=(1, 2), extra_governors=["fixed:1", "Fixed:2:tree=2"], tree=2,
                     ngram=False, corpus=False)
    with pytest.raises(UserError, match=r"^--extra-governors: Fixed:2:tree=2 is in the standard set already \(off, "
                                        r"fixed:1:tree=2, fixed:2:tree=2, adaptive:tree=2, dspark:tree=2\)$"):
        bg.refuse_standard(args)
    bg.refuse_standard(Namespace(**{**vars(args), "extra_governors": ["fixed:1"]}))  # (without the tree: taken)
