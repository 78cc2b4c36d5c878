"""The committed draft-training answers (fixtures/peagle-data): every line answers its own frozen
TRAIN prompt, none answers a held-out or DSpark calibration prompt, no prompt twice; the
second TRAIN batch (tools/prompts.py ``_extra``) keeps the held-out topics out; together the
files answer every answerable TRAIN prompt."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tests.real_model import tool as _tool

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "peagle-data"
FILES = ("chat.jsonl.gz", "chat-more.jsonl.gz", "chat-extra.jsonl.gz", "chat-rest.jsonl.gz")


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
    # the first two answer every answerable prompt of the first TRAIN batch; chat-extra and
    # chat-rest every one of the second (from prompts.FIRST_EXTRA), each once
    answerable = prompts.answerable_train_prompts()
    first = {d["prompt"] for i, d in answerable if i < prompts.FIRST_EXTRA}
    second = {d["prompt"] for i, d in answerable if i >= prompts.FIRST_EXTRA}
    assert {d["prompt"] for name in FILES[:2] for d in rows[name]} == first
    assert {d["prompt"] for name in FILES[2:] for d in rows[name]} == second
    assert len(rows["chat-extra.jsonl.gz"]) == 3487  # what stage 6 of the committed draft trained on


def test_second_batch_keeps_heldout_topics_out():
    """The second batch reuses TRAIN topics only: no held-out story character or arithmetic
    name occurs in it, and it repeats no prompt of the first batch or the held-out list."""
    prompts = _tool("prompts")
    train, held = prompts.train_prompts(), prompts.heldout_prompts()
    assert prompts.FIRST_EXTRA == 8479 and len(train) > prompts.FIRST_EXTRA
    first, second = train[:prompts.FIRST_EXTRA], train[prompts.FIRST_EXTRA:]
    assert {d["kind"] for d in second} == set(prompts.KINDS)
    texts = [d["prompt"] for d in second]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & ({d["prompt"] for d in first} | {d["prompt"] for d in held})

    def used(pool: str, kind: str, rows: list[dict]) -> set[str]:
        return {x for x in prompts._pool(getattr(prompts, pool)) for d in rows
                if d["kind"] == kind and re.search(rf"\b{re.escape(x)}\b", d["prompt"])}
    held_chars, held_names = used("CHARACTERS", "stories", held), used("NAMES", "arithmetic", held)
    assert len(held_chars) >= 4 and len(held_names) >= 4  # the test sees the held-out topics
    assert not held_chars & used("CHARACTERS", "stories", second)
    assert not held_names & used("NAMES", "arithmetic", second)
    # the calibration prompts are drawn from the first batch only, so the second left them as they were
    assert prompts.calibration_prompt_texts() <= {d["prompt"] for d in first[prompts.FIRST_UNTRAINED:]}
