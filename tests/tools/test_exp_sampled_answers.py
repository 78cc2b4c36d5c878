"""tools/exp_sampled_answers.py: the probe's answer sets (no model needed)."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.real_model import tool as _tool


def test_select_draws_two_disjoint_sets_the_same_way_each_time(tmp_path):
    e = _tool("exp_sampled_answers")
    src = tmp_path / "src.jsonl.gz"
    with gzip.open(src, "wt") as f:
        for i in range(30):
            f.write(json.dumps({"idx": i, "answer_ids": [i]}) + "\n")
    e.select(7, tmp_path / "a", src)
    e.select(7, tmp_path / "b", src)
    g1 = [json.loads(x)["idx"] for x in (tmp_path / "a" / "greedy.jsonl").read_text().splitlines()]
    g2 = [json.loads(x)["idx"] for x in (tmp_path / "a" / "greedy2.jsonl").read_text().splitlines()]
    assert len(g1) == len(g2) == 7 and not set(g1) & set(g2)
    assert (tmp_path / "a" / "greedy.jsonl").read_text() == (tmp_path / "b" / "greedy.jsonl").read_text()
    with pytest.raises(SystemExit, match="--n 16: .*src.jsonl.gz has 30 answers, fewer than 2N"):
        e.select(16, tmp_path / "c", src)
    assert e.FOURTH.is_file()
