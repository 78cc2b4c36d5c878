"""tools/exp_loop_fidelity.py: the replay of the runtime's fixed:K loop on a teacher-forced table."""

from __future__ import annotations

import numpy as np

from tests.real_model import tool


def table_from(hits: dict[int, list[bool]]) -> dict:
    """{anchor: [depth 1 ok, depth 2 ok, ...]} -> the tool's {(anchor, depth): ok}."""
    return {(t, d + 1): ok for t, row in hits.items() for d, ok in enumerate(row)}


def test_rounds_start_one_past_the_last_accepted_token():
    t = tool("exp_loop_fidelity")
    # prompt of 3 tokens: round one at anchor 2; 10 output tokens, K = 2
    table = table_from({2: [True, True], 3: [False, False], 4: [False, True], 5: [True, False],
                        6: [True, True], 7: [True, True], 8: [False, True], 9: [True, True],
                        10: [True, False], 11: [False, False]})
    rounds = t.replay(table, 3, 10, 2, 10)
    # emitted 1 after the prefill; 2: both (emitted 4, next 5); 5: one (6, next 7); 7: both
    # (9, next 10); 10: the budget leaves no draft (d = 10 - 9 - 1 = 0): a plain step
    assert rounds == [(2, 2, 2, True), (5, 2, 1, False), (7, 2, 2, True), (10, 0, 0, False)]
    # one more token of budget: the last round drafts one and it is accepted
    assert t.replay(table, 3, 11, 2, 11)[-1] == (10, 1, 1, False)


def test_a_miss_stops_the_round_and_depths_past_the_end_miss():
    t = tool("exp_loop_fidelity")
    assert t.run_of(table_from({0: [False, True, True]}), 0, 3) == 0
    assert t.run_of(table_from({0: [True, True]}), 0, 3) == 2  # depth 3 not in the table


def test_counts_and_summary_are_the_runtime_telemetry_s():
    t = tool("exp_loop_fidelity")
    c = t.counts([(2, 2), (2, 0), (2, 1), (1, 1)], 2)
    # position 1 offered 4, accepted 3, reached 4; position 2 offered 3, accepted 1, reached 2
    assert np.array_equal(c, [[3, 1], [4, 3], [4, 2]])
    s = t.summary(c)
    assert s["unconditional"] == [0.75, round(1 / 3, 4)] and s["conditional"] == [0.75, 0.5]
    assert s["tau"] == 2.0 and s["rounds"] == 4
