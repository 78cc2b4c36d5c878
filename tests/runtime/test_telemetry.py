import json

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
    assert t.acceptance_by_position == pytest.approx([1.0, 1.0, 0.0, 0.0])
    assert t.acceptance_conditional == pytest.approx([1.0, 1.0, 0.0, 0.0])  # position 4 never reached -> 0


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


def test_empty_run_and_bad_round():
    j = Telemetry().to_json()
    assert j["tau"] == 1.0 and j["tokens_per_s"] == 0.0 and j["acceptance_by_position"] == []
    with pytest.raises(InternalError):
        RoundResult(depth=2, accepted=3)
    assert RoundResult(depth=2, accepted=2).emitted == 3
