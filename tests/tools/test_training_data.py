"""The committed draft-training answers (fixtures/peagle-data): every line answers its own frozen
TRAIN prompt, none answers a held-out or DSpark calibration prompt, no prompt twice."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.real_model import tool as _tool

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "peagle-data"
FILES = ("chat.jsonl.gz", "chat-more.jsonl.gz")


def _rows(name: str) -> list[dict]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def rows() -> dict[str, list[dict]]:
    return {name: _rows(name) for name in FILES}


def test_each_answer_is_to_its_own_frozen_train_prompt(rows):
    train = _tool("prompts").train_prompts()
    for name, lines in rows.items():
        for d in lines:
            assert 0 <= d["idx"] < len(train), (name, d["idx"])
            assert d["prompt"] == train[d["idx"]]["prompt"] and d["kind"] == train[d["idx"]]["kind"], (name, d["idx"])
            ans = d["answer_ids"]
            assert 0 < len(ans) <= 256 and 2 not in ans[:-1], (name, d["idx"])  # EOS (2) only as the last token
    # SmolLM2's chat template: one system header for all, the assistant header last
    heads = {tuple(d["prompt_ids"][:20]) for lines in rows.values() for d in lines}
    tails = {tuple(d["prompt_ids"][-3:]) for lines in rows.values() for d in lines}
    assert len(heads) == 1 and tails == {(520, 9531, 198)}  # "ass", "istant", "\n": the end of "<|im_start|>assistant\n"


def test_no_heldout_or_calibration_prompt_and_no_prompt_twice(rows):
    prompts = _tool("prompts")
    reserved = {d["prompt"] for d in prompts.heldout_prompts()} | prompts.calibration_prompt_texts()
    assert len(prompts.calibration_prompt_texts()) == 60
    seen: set[str] = set()
    for name, lines in rows.items():
        texts = [d["prompt"] for d in lines]
        assert not set(texts) & reserved, name
        assert len(set(texts)) == len(texts) and not set(texts) & seen, name
        seen |= set(texts)
    # together they answer every answerable TRAIN prompt
    assert seen == {d["prompt"] for _, d in prompts.answerable_train_prompts()}
