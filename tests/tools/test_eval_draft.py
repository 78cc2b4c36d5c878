"""tools/eval_draft.py: the decode speed-up loop tau and a build's cost table predict."""

from __future__ import annotations

import json

import pytest

from tests.real_model import tool


def test_predicted_speedup_is_loop_tau_over_a_rounds_cost_in_decode_steps():
    pytest.importorskip("torch")
    ev = tool("eval_draft")
    loop = {"1": {"tau": 1.5}, "2": {"tau": 1.8}, "3": {"tau": 2.0}}
    costs = {"decode": 0.020, "draft": 0.002, "draft_by_depth": {"1": 0.001, "2": 0.0015},
             "verify": {"1": 0.021, "2": 0.0225}}
    # fixed:1: 1.5 tokens a round of 1 + 21 ms against 20 ms a token; fixed:3 has no verify.3
    assert ev.predicted_speedups(loop, costs) == {"1": round(1.5 * 20 / 22, 4), "2": round(1.8 * 20 / 24, 4)}
    # a table without draft_by_depth prices every depth at its draft pass
    assert ev.predicted_speedups({"2": {"tau": 1.8}}, {**costs, "draft_by_depth": None}) == {
        "2": round(1.8 * 20 / 24.5, 4)}


def test_costs_of_a_folder_that_is_not_a_build_are_refused_by_name(tmp_path):
    pytest.importorskip("torch")
    ev = tool("eval_draft")
    with pytest.raises(SystemExit, match=r"--costs .*: engines.json missing \(expected a folder `specrt build`"):
        ev.main(["fixtures/peagle-smollm2", "--costs", str(tmp_path)])
    (tmp_path / "engines.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"engines.json is not a JSON object"):
        ev.read_costs(tmp_path)
    (tmp_path / "engines.json").write_text(json.dumps({"costs": {"decode": 0.02}}))
    with pytest.raises(SystemExit, match=r"engines.json has no cost table \(costs.verify, costs.decode\)"):
        ev.read_costs(tmp_path)
    table = {"decode": 0.02, "verify": {"1": 0.021}}
    (tmp_path / "engines.json").write_text(json.dumps({"costs": table}))
    assert ev.read_costs(tmp_path) == table
    # every figure the prediction reads is seconds > 0, or it is refused by name
    for bad, name in (({"decode": "fast"}, "decode is 'fast'"), ({"decode": True}, "decode is True"),
                      ({"verify": {"1": 0.02, "2": -1}}, "verify.2 is -1"), ({"draft": None}, "draft is None"),
                      ({"draft_by_depth": {"3": [0.001]}}, r"draft_by_depth.3 is \[0.001\]"),
                      ({"draft_by_depth": 0.001}, r"draft_by_depth is 0.001, expected \{depth: seconds\}")):
        (tmp_path / "engines.json").write_text(json.dumps({"costs": {**table, **bad}}))
        with pytest.raises(SystemExit, match=rf"engines.json costs.{name}(, expected seconds > 0|$)"):
            ev.read_costs(tmp_path)
    full = {**table, "draft": 0.001, "draft_by_depth": {"1": 0.001}, "chain": {"5": 0.03}}
    (tmp_path / "engines.json").write_text(json.dumps({"costs": full}))
    assert ev.read_costs(tmp_path) == full
