"""tools/lookup_priors.py: the per-position counts of prompt lookup on a constructed answer,
and the runtime's priors against the committed measurement on the training answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrt.runtime.ngram import PRIORS
from tests.real_model import tool

ROOT = Path(__file__).resolve().parents[2]


def test_counts_follow_the_runtime_index():
    t = tool("lookup_priors")
    s = t.new_stats(4)
    # prompt 5 6 7 8 9; answer 5 6 7 8 1 ...: at answer[2] the context ends "5 6" -> 4-gram
    # not yet, 2-gram "5 6" followed by 7 at prompt index 2: proposes 7 8 9 (prompt tail)
    t.count([5, 6, 7, 8, 9], [5, 6, 7, 8, 1, 5, 6], 4, s)
    assert s["positions"] == 7
    # answer[0]: context ends "9" (1-gram only): nothing; answer[1]: "9 5" never seen: nothing;
    # answer[2]: "5 6" -> 7 8 9 vs 7 8 1: two wins, a miss at 3;
    # answer[3]: "5 6 7" -> 8 9 vs 8 1: a win, a miss; answer[4]: "5 6 7 8" -> 9 vs 1: a miss;
    # answer[5]: "7 8 1" never seen, "8 1" never: nothing; answer[6]: "1 5" no, ... "5" only: nothing
    assert dict(s["matched"]) == {2: 1, 3: 1, 4: 1}
    assert s[2] == ([1, 1, 1, 0], [1, 1, 0, 0])
    assert s[3] == ([1, 1, 0, 0], [1, 0, 0, 0])
    assert s[4] == ([1, 0, 0, 0], [0, 0, 0, 0])
    # a proposal running past the answer's end is counted only as far as the answer goes
    s = t.new_stats(4)
    t.count([1, 2, 3, 4, 5], [1, 2, 3], 4, s)  # at answer[2]: "1 2" -> 3 4 5, answer ends after 3
    assert s[2] == ([1, 0, 0, 0], [1, 0, 0, 0])


def test_runtime_priors_are_the_committed_training_measurement():
    """PRIORS are results/lookup_priors/train.json's rates (training answers, first 128
    tokens) to two decimals: re-measuring and forgetting the runtime, or the reverse, fails."""
    measured = json.loads((ROOT / "results" / "lookup_priors" / "train.json").read_text())
    assert measured["max_new"] == 128 and measured["answers"] > 10000
    assert not any("heldout" in f for f in measured["files"])
    for n, rates in PRIORS.items():
        assert list(rates) == pytest.approx([round(r, 2) for r in measured["rates"][str(n)]], abs=1e-9)
