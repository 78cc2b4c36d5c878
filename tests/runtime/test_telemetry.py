import json

import numpy as np
import pytest

from specrt.errors import InternalError
from specrt.runtime.telemetry import RoundResult, Telemetry


def test_fixed_depth_matches_speculators_definitions():
    t = Telemetry()
    for a in (0, 1, 3, 2):  # depth 3; the last round accepted all 3
        t.record(RoundResult(depth=3, accepted=min(a, 3), t_draft=0.01, t_verify=0.02))
    # accepted 0 + 1 + 3 + 2 = 6 over 4 draft rounds
    assert t.tau == pytest.approx(1 + 6 / 4)
    assert t.acceptance_by_position == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    # conditional = pos_i / pos_{i-1} at a fixed depth
    assert t.acceptance_conditional == pytest.approx([3 / 4, 2 / 3, 1 / 2])


def test_varying_depth_counts_only_rounds_that_verified_a_position():
    t = Telemetry()
    t.record(RoundResult(depth=1, accepted=1))
    t.record(RoundResult(depth=4, accepted=2))
    t.record(RoundResult(depth=0, accepted=0, t_verify=0.5))  # plain step: no drafts
    assert t.rounds == 3 and t.draft_rounds == 2 and t.drafted == 5
    assert t.tau == pytest.approx(1 + 3 / 2)
    # §6: over every draft round (a position a round did not verify counts as not accepted),
    # so tau = 1 + the sum; among the rounds verifying each position; conditional on reaching it
    assert t.acceptance_by_position == pytest.approx([1.0, 0.5, 0.0, 0.0])
    assert t.tau == pytest.approx(1 + sum(t.acceptance_by_position))
    assert t.acceptance_by_verified_position == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert t.acceptance_conditional[:3] == pytest.approx([1.0, 1.0, 0.0])
    assert t.acceptance_conditional[3] is None  # position 4 never reached: no rate, not a rate of 0
    assert json.loads(json.dumps(t.to_json()))["acceptance_conditional"][3] is None


def test_json_report():
    t = Telemetry()
    t.engine_time("prefill", 0.25)
    t.record(RoundResult(depth=2, accepted=1, t_draft=0.1, t_verify=0.3))
    t.finish(new_tokens=2, seconds=1.0)
    j = json.loads(json.dumps(t.to_json()))
    for key in ("new_tokens", "seconds", "tokens_per_s", "tau", "acceptance_by_position",
                "acceptance_conditional", "rounds", "time_split"):
        assert key in j
    assert j["tokens_per_s"] == 2.0 and j["tau"] == 2.0
    assert j["time_split"] == pytest.approx({"draft": 0.1, "verify": 0.3, "prefill": 0.25, "python": 0.35})
    assert j["depth_histogram"] == {"2": 1}
    assert j["draft_block_histogram"] == {} and j["drafted_unverified"] == 0  # no confidences recorded
    t.record(RoundResult(depth=0, accepted=0, confidences=np.full(3, 0.1)))  # drafted 3, verified none
    j = t.to_json()
    assert j["draft_block_histogram"] == {"3": 1} and j["drafted_unverified"] == 3
    assert Telemetry.from_json({k: v for k, v in j.items() if k not in ("draft_block_histogram",
                                                                         "drafted_unverified")}).unverified == 0


def test_tokens_per_call_counts_every_round():
    """Draft rounds (a + 1 each), decode steps (1), lookup rounds (their accepted + 1):
    tau stays the draft rounds' alone."""
    t = Telemetry()
    t.record(RoundResult(depth=3, accepted=2))  # 3 tokens
    t.record(RoundResult(depth=0, accepted=0))  # 1
    t.record(RoundResult(depth=5, accepted=4, lookup=3))  # 5
    t.record(RoundResult(depth=4, accepted=0, lookup=2))  # 1
    assert t.tau == pytest.approx(3.0)
    assert t.to_json()["tokens_per_call"] == pytest.approx(10 / 4)
    assert Telemetry.from_json(t.to_json()).tokens_per_call == pytest.approx(10 / 4)
    assert Telemetry().tokens_per_call == 0.0


def test_empty_run_and_bad_round():
    j = Telemetry().to_json()
    assert j["tau"] == 1.0 and j["tokens_per_s"] == 0.0 and j["acceptance_by_position"] == []
    with pytest.raises(InternalError):
        RoundResult(depth=2, accepted=3)
    assert RoundResult(depth=2, accepted=2).emitted == 3


def test_runs_merged_from_their_json_equal_runs_merged_live():
    """Bench workers report each prompt's to_json(); the parent merges them afterwards
    (Telemetry.from_json), which must give what merging the live objects gives."""
    runs = []
    for i, rounds in enumerate(([(3, 3), (3, 0), (1, 1)], [(0, 0), (4, 2)], [(2, 1)])):
        t = Telemetry()
        t.engine_time("prefill", 0.05)
        t.streams, t.first_token_s, t.prompt_tokens, t.prefix_reused = 1, 0.125 * (i + 1), 10, i
        for d, a in rounds:
            conf = np.full(4, 0.5) if d in (1, 2) else None  # a block of 4 drafted, d verified
            t.record(RoundResult(depth=d, accepted=a, t_draft=0.01 * d, t_verify=0.02 + 0.001 * d, confidences=conf))
        t.finish(new_tokens=sum(a + 1 for _, a in rounds), seconds=0.4)
        runs.append(t)
    live, after = Telemetry(), Telemetry()
    for t in runs:
        live.merge(t)
        after.merge(Telemetry.from_json(json.loads(json.dumps(t.to_json()))))
    a, b = after.to_json(), live.to_json()
    assert a.keys() == b.keys()
    for k in ("time_split", "counts"):
        assert a.pop(k) == b.pop(k), k  # the same float sums, added in the same order
    assert a == b
    assert a["acceptance_by_position"] == pytest.approx([4 / 5, 2 / 5, 1 / 5, 0.0])
    assert a["acceptance_by_verified_position"] == pytest.approx([4 / 5, 2 / 4, 1 / 3, 0.0])
    assert a["depth_histogram"] == {"0": 1, "1": 1, "2": 1, "3": 2, "4": 1}
    assert a["draft_block_histogram"] == {"4": 2} and a["drafted_unverified"] == (4 - 1) + (4 - 2)
    assert (a["prompt_count"], a["first_token_s"], a["prompt_tokens"], a["prefix_reused"]) == (3, 0.25, 30, 3)
    with pytest.raises(KeyError):
        Telemetry.from_json({k: v for k, v in runs[0].to_json().items() if k != "counts"})


def test_mean_seconds_per_depth_and_block():
    """What each verified depth and drafted block cost in this run, beside the cost table."""
    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1, t_draft=0.002, t_verify=0.020, t_round=0.025, confidences=np.ones(4)))
    t.record(RoundResult(depth=2, accepted=0, t_draft=0.004, t_verify=0.024, t_round=0.031, confidences=np.ones(4)))
    t.record(RoundResult(depth=1, accepted=1, t_draft=0.001, t_verify=0.019, confidences=np.ones(2)))  # no t_round
    t.record(RoundResult(depth=0, accepted=0, t_verify=0.018, t_round=0.019))  # a plain step, no draft
    # a catch-up pass (the rows of the plain step too): counted as a block drafted, not timed as one
    t.record(RoundResult(depth=2, accepted=2, t_draft=0.009, t_verify=0.021, t_round=0.032, confidences=np.ones(4),
                         catch_up=True))
    assert t.to_json()["draft_block_histogram"] == {"2": 1, "4": 3}
    m = t.mean_seconds()
    assert m["verify_by_depth"] == pytest.approx({"0": 0.018, "1": 0.019, "2": 0.065 / 3})
    assert m["round_by_depth"] == pytest.approx({"0": 0.019, "2": 0.088 / 3})
    assert m["draft_by_block"] == pytest.approx({"2": 0.001, "4": 0.003})
    again = Telemetry.from_json(json.loads(json.dumps(t.to_json())))
    assert again.mean_seconds() == m
    # a report written before these sums existed still loads, with none of them
    old = t.to_json()
    for k in ("verify_s_by_depth", "round_s_by_depth", "draft_s_by_block", "timed_rounds", "timed_blocks"):
        del old["counts"][k]
    assert Telemetry.from_json(old).mean_seconds() == {"verify_by_depth": {}, "round_by_depth": {}, "draft_by_block": {}}


def test_a_dspark_like_run_keeps_acceptance_by_position_a_survival():
    """Deep rounds only where the governor is confident: among the rounds verifying a
    position the rate can rise with it, §6's unconditional figure cannot (found by review:
    [0.1, 1.0, 1.0] for [0.1, 0.1, 0.1])."""
    t = Telemetry()
    for _ in range(9):
        t.record(RoundResult(depth=1, accepted=0))
    t.record(RoundResult(depth=3, accepted=3))
    assert t.acceptance_by_position == pytest.approx([0.1, 0.1, 0.1])
    assert t.acceptance_by_verified_position == pytest.approx([0.1, 1.0, 1.0])


def test_a_runner_up_win_reaches_position_1_only():
    """A token tree's runner-up won position 1: the chain's draft at position 2 continued
    the rejected first draft and was never judged (it counted as a rejection at position 2)."""
    t = Telemetry()
    t.record(RoundResult(depth=3, accepted=1, siblings=2, sibling=0))
    t.record(RoundResult(depth=3, accepted=1))
    assert t.reached_at == [2, 1, 0] and t.accepted_at == [2, 0, 0]
    assert t.acceptance_conditional[:2] == pytest.approx([1.0, 0.0]) and t.acceptance_conditional[2] is None
    assert t.tau == pytest.approx(2.0)  # both rounds emitted 2 tokens


def test_merged_runs_keep_their_tree_lookup_and_first_token_counts_through_json():
    """Every count merge adds (token trees, lookup rounds, the first tokens' times) pinned
    by value, and a merged report read back (Telemetry.from_json) reports the same: runs
    merged by the bench's parent are themselves merged reports."""
    a, b = Telemetry(), Telemetry()
    a.streams, a.first_token_s, b.streams, b.first_token_s = 1, 0.5, 1, 0.25
    a.record(RoundResult(depth=2, accepted=1, siblings=2, sibling=1, t_verify=0.01, t_round=0.02))
    a.record(RoundResult(depth=3, accepted=0, siblings=1, t_verify=0.01, t_round=0.02))
    a.record(RoundResult(depth=1, accepted=1, siblings=1, sibling=0, t_verify=0.01, t_round=0.02))  # rank 2 after 3
    a.record(RoundResult(depth=4, accepted=2, t_verify=0.01, t_round=0.03, lookup=3))
    b.record(RoundResult(depth=5, accepted=5, t_verify=0.01, t_round=0.04, lookup=2))
    a.finish(4 + 1, seconds=0.001)  # less than the engines' seconds: no negative Python time
    assert a.time_split()["python"] == 0.0
    both = Telemetry()
    both.merge(a)
    both.merge(b)
    j = json.loads(json.dumps(both.to_json()))
    assert j["tree"] == {"rounds": 3, "sibling_accepts": 2, "runners_up": 4, "wins_by_rank": [1, 1],
                         "target_depth_histogram": {"2": 1, "4": 2}}
    lk = j["lookup"]
    assert (lk["rounds"], lk["tokens_per_round"], lk["depth_histogram"]) == (2, 4.5, {"4": 1, "5": 1})
    assert lk["seconds"] == pytest.approx(0.07)
    assert j["prompt_count"] == 2 and j["first_token_s"] == pytest.approx(0.375)
    again = Telemetry.from_json(j).to_json()
    assert again == both.to_json()


def test_rejections_and_those_to_tokens_outside_the_draft_vocabulary():
    """Rounds ended by a rejected draft are counted, and those whose correction the draft's
    reduced vocabulary lacks; full rounds, a runner-up's win, prompt lookup's rounds, a round
    cut at an EOS and plain decode steps are no rejections. The counts merge and survive the
    JSON report."""
    t = Telemetry()
    for r in (RoundResult(3, 1, outside_vocab=True), RoundResult(3, 0), RoundResult(3, 3),
              RoundResult(2, 1, siblings=1, sibling=0), RoundResult(4, 2, lookup=3),
              RoundResult(3, 1, cut_at_eos=True), RoundResult(0, 0), RoundResult(1, 0, outside_vocab=True)):
        t.record(r)
    assert t.to_json()["rejections"] == {"rounds": 3, "outside_draft_vocab": 2, "outside_share": 2 / 3}
    both = Telemetry()
    both.merge(t)
    both.merge(Telemetry.from_json(json.loads(json.dumps(t.to_json()))))
    assert both.to_json()["rejections"] == {"rounds": 6, "outside_draft_vocab": 4, "outside_share": 2 / 3}
    assert Telemetry().to_json()["rejections"] == {"rounds": 0, "outside_draft_vocab": 0, "outside_share": 0.0}
    for bad in (dict(depth=2, accepted=2), dict(depth=2, accepted=1, lookup=2),
                dict(depth=2, accepted=1, cut_at_eos=True),
                dict(depth=2, accepted=1, siblings=1, sibling=0), dict(depth=0, accepted=0)):
        with pytest.raises(InternalError, match="with no draft rejected marked outside the draft vocabulary"):
            RoundResult(**bad, outside_vocab=True)


def test_merged_runs_keep_the_mean_draft_seconds_per_block():
    """Mutant l13 (merge leaving timed_blocks out): runs merged (the bench's several prompts)
    give the mean draft seconds per drafted block over all their timed rounds."""
    import numpy as np
    import pytest

    from specrt.runtime.telemetry import RoundResult, Telemetry

    runs = []
    for t_draft in (0.002, 0.004):
        t = Telemetry()
        t.record(RoundResult(depth=2, accepted=1, t_draft=t_draft, t_verify=0.02, confidences=np.ones(4)))
        runs.append(t)
    both = Telemetry()
    for t in runs:
        both.merge(t)
    assert both.mean_seconds()["draft_by_block"] == pytest.approx({"4": 0.003})
    assert both.to_json()["counts"]["timed_blocks"] == {"4": 2}


def test_a_report_from_before_catch_up_passes_were_left_out_times_every_drafting_round():
    """Mutant l17 (from_json reading no timed_blocks as none): a report written before
    timed_blocks existed timed every drafting round (its draft_block_histogram)."""
    import json

    import numpy as np
    import pytest

    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    for t_draft in (0.002, 0.004):
        t.record(RoundResult(depth=2, accepted=1, t_draft=t_draft, t_verify=0.02, confidences=np.ones(4)))
    old = json.loads(json.dumps(t.to_json()))
    del old["counts"]["timed_blocks"]
    assert Telemetry.from_json(old).mean_seconds()["draft_by_block"] == pytest.approx({"4": 0.003})


def test_mean_verify_seconds_count_every_round_of_a_depth_timed_or_not():
    """Mutant l21 (verify seconds per depth divided by the rounds carrying a wall time): the
    target engine's seconds are summed over every round of a depth, so they are divided by
    all of them, also where some rounds carried no t_round."""
    import pytest

    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1, t_verify=0.020, t_round=0.025))
    t.record(RoundResult(depth=2, accepted=0, t_verify=0.030))  # no wall time
    m = t.mean_seconds()
    assert m["verify_by_depth"] == pytest.approx({"2": 0.025})
    assert m["round_by_depth"] == pytest.approx({"2": 0.025})


def test_drafted_counts_the_chains_drafts_not_the_runners_up():
    """Mutant l26 (drafted summing the target depth, runners-up included): "drafted" is
    sum d_r, the chain's drafts verified; runners-up are counted apart (tree.runners_up)."""
    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.record(RoundResult(depth=3, accepted=1, siblings=2, sibling=1))
    t.record(RoundResult(depth=2, accepted=0, siblings=1))
    j = t.to_json()
    assert (j["drafted"], j["tree"]["runners_up"]) == (5, 3)
    assert j["tree"]["target_depth_histogram"] == {"3": 1, "5": 1}


def test_verify_seconds_are_kept_per_verified_depth_not_the_trees_target_depth():
    """Mutant T11 (verify seconds keyed by the target call's depth, runners-up included): the
    mean verify seconds per depth sit beside depth_histogram, which counts the chain's verified
    depth d; a token tree's round of d = 2 with 2 runners-up is a depth-2 round."""
    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1, siblings=2, sibling=1, t_verify=0.030, t_round=0.040))
    t.record(RoundResult(depth=2, accepted=0, t_verify=0.010, t_round=0.020))
    m = t.mean_seconds()
    assert m["verify_by_depth"] == pytest.approx({"2": 0.020})
    assert m["round_by_depth"] == pytest.approx({"2": 0.030})


def test_engine_time_outside_rounds_adds_up_per_engine():
    """Mutant T24 (engine_time keeping the last call's seconds): a run that prefills more than
    once (a prompt in passes, a prefix reused then extended) reports the sum of its prefills."""
    t = Telemetry()
    t.engine_time("prefill", 0.25)
    t.engine_time("prefill", 0.5)
    t.engine_time("draft", 0.125)  # (the draft's catch-up over the prompt, beside its rounds)
    t.record(RoundResult(depth=1, accepted=1, t_draft=0.125, t_verify=0.25))
    t.finish(new_tokens=2, seconds=2.0)
    assert t.time_split() == pytest.approx({"draft": 0.25, "verify": 0.25, "prefill": 0.75, "python": 0.75})


def test_merged_runs_add_their_lookup_counts_per_match_length_and_their_walls():
    """Mutants T28, T32, T33 (merge taking the other run's lookup counts for a match length both
    runs have, leaving out the wall seconds per depth, or the runs' seconds): the bench's several
    prompts report every lookup round, each depth's mean wall time and tokens per second over all."""
    runs = []
    for i in range(2):
        t = Telemetry()
        t.record(RoundResult(depth=4, accepted=2 + i, t_verify=0.01, t_round=0.02, lookup=3))
        t.record(RoundResult(depth=2, accepted=1, t_verify=0.01, t_round=0.01 + 0.02 * i))
        t.finish(new_tokens=5 + i, seconds=1.0 + i)
        runs.append(t)
    both = Telemetry()
    for t in runs:
        both.merge(t)
    j = json.loads(json.dumps(both.to_json()))
    assert j["lookup"]["by_match"] == {"3": {"rounds": 2, "verified": 8, "accepted": 5}}
    assert j["lookup"]["tokens_per_round"] == pytest.approx(3.5)
    assert j["mean_seconds"]["round_by_depth"] == pytest.approx({"2": 0.02})
    assert (j["new_tokens"], j["seconds"], j["tokens_per_s"]) == (11, 3.0, pytest.approx(11 / 3))


def test_a_run_without_lookup_rounds_reports_no_lookup_tokens_per_round():
    """Mutant T38 (1.0 tokens per lookup round where there were none): a run with no lookup
    round reports 0.0, not the 1.0 of lookup rounds that all failed at their first token."""
    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1))
    assert t.to_json()["lookup"] == {"rounds": 0, "tokens_per_round": 0.0, "seconds": 0.0, "depth_histogram": {},
                                     "by_match": {}}
    t.record(RoundResult(depth=3, accepted=0, lookup=2))
    assert t.to_json()["lookup"]["tokens_per_round"] == 1.0


def test_rounds_the_counters_cannot_hold_are_refused():
    """Mutants T55, T56 (RoundResult without its check that a runner-up's win accepted exactly
    position 1, or that a lookup round carries no draft confidences): such a round is a
    scheduler bug; counted, it would put a runner-up's round in acceptance past position 1, or a
    lookup round's block in the draft's block histogram."""
    for bad in (dict(depth=3, accepted=2, siblings=1, sibling=0), dict(depth=3, accepted=0, siblings=2, sibling=1),
                dict(depth=2, accepted=1, lookup=2, confidences=np.ones(2))):
        with pytest.raises(InternalError):
            RoundResult(**bad)
    RoundResult(depth=3, accepted=1, siblings=2, sibling=1)
    RoundResult(depth=2, accepted=1, lookup=2)


def test_a_report_from_before_prompt_counts_has_no_first_token_time():
    """Mutant T59 (a report without prompt_count read as one prompt): a report written before
    the prompts were counted had no first-token time either; merged into others it adds no
    prompt and no time, so their mean first-token time stays theirs."""
    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1))
    old = json.loads(json.dumps(t.to_json()))
    for k in ("prompt_count", "first_token_s"):
        del old[k]
    new = Telemetry()
    new.streams, new.first_token_s = 1, 0.5
    new.merge(Telemetry.from_json(old))
    assert (new.to_json()["prompt_count"], new.to_json()["first_token_s"]) == (1, 0.5)


def test_rounds_of_shapes_no_scheduler_makes_are_refused():
    """Mutants T01-T04 (session 65: RoundResult taking runners-up on a plain decode step, a
    runner-up's rank at its count, a lookup round of depth 0 or with runners-up): each is a
    scheduler bug the counters would take in silence (a decode step counted as a tree round, a
    win by a runner-up never verified, a lookup round beside the tree's or the decode steps')."""
    for bad in (dict(depth=0, accepted=0, siblings=1), dict(depth=2, accepted=1, siblings=1, sibling=1),
                dict(depth=0, accepted=0, lookup=2), dict(depth=2, accepted=1, lookup=2, siblings=1)):
        with pytest.raises(InternalError):
            RoundResult(**bad)
    # (the edges next to them are rounds)
    RoundResult(depth=1, accepted=0, siblings=1)
    RoundResult(depth=2, accepted=1, siblings=2, sibling=1)
    RoundResult(depth=1, accepted=0, lookup=2)


def test_a_lookup_rounds_target_seconds_are_the_verify_engines_and_its_wall_counts_where_timed():
    """Mutants T07, T08, T13, B68, F13 (session 65: a lookup round's target seconds left out of
    the time split, its wall seconds taken from the target's where it carried none, a wall time
    of 0.0 read as none, lookup rounds of one depth counted once, lookup rounds counted by match
    length): the time split puts every target call under "verify", a lookup round without a
    wall time adds none, a round timed at 0.0 is a timed round, and the lookup counts count
    every round."""
    t = Telemetry()
    t.record(RoundResult(depth=4, accepted=2, t_verify=0.25, t_round=0.5, lookup=3))
    t.record(RoundResult(depth=3, accepted=0, t_verify=0.25, lookup=2))  # no wall time
    t.record(RoundResult(depth=2, accepted=1, t_verify=0.125, t_round=0.0))
    t.record(RoundResult(depth=4, accepted=0, lookup=2))  # (untimed)
    t.finish(new_tokens=7, seconds=1.0)
    assert t.time_split() == {"draft": 0.0, "verify": 0.625, "python": 0.375}
    j = t.to_json()
    assert j["lookup"]["seconds"] == 0.5 and j["mean_seconds"]["round_by_depth"] == {"2": 0.0}
    assert j["lookup"]["depth_histogram"] == {"3": 1, "4": 2} and j["lookup"]["rounds"] == 3  # (of 2 match lengths)


def test_merged_runs_add_their_engine_and_verify_seconds_and_the_positions_reached():
    """Mutants T20, T21, T23 (session 65: merge leaving out the engines' seconds, the verify
    seconds per depth, or the positions each round reached): the bench's several prompts give
    the time split, the mean verify seconds per depth and the conditional acceptance of them all."""
    both = Telemetry()
    for a in (0, 2):
        t = Telemetry()
        t.engine_time("prefill", 0.125)
        t.record(RoundResult(depth=2, accepted=a, t_draft=0.125, t_verify=0.25))
        t.finish(new_tokens=a + 1, seconds=1.0)
        both.merge(t)
    assert both.time_split() == {"draft": 0.25, "verify": 0.5, "prefill": 0.25, "python": 1.0}
    assert both.mean_seconds()["verify_by_depth"] == {"2": 0.25}
    assert both.acceptance_conditional == [0.5, 1.0]
