"""The committed draft-training answers (fixtures/peagle-data): every line answers its own frozen
TRAIN prompt, none answers a held-out or DSpark calibration prompt, no prompt twice; the
second, third and fourth TRAIN batches (tools/prompts.py ``_extra``, ``_third``, ``_fourth``)
keep the held-out topics out; together the files answer every answerable TRAIN prompt of
every batch (the third's: chat-third its first 3000 from prompts.FIRST_THIRD, chat-third-rest
the others up to prompts.FIRST_FOURTH; chat-fourth every one of the fourth); appending the
third and the fourth left the earlier batches, the held-out list and the calibration prompts as
they were."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sys
from functools import partial
from pathlib import Path

import pytest

from tests.real_model import tool as _tool

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "peagle-data"
FILES = ("chat.jsonl.gz", "chat-more.jsonl.gz", "chat-extra.jsonl.gz", "chat-rest.jsonl.gz", "chat-third.jsonl.gz",
         "chat-third-rest.jsonl.gz", "chat-fourth.jsonl.gz")
THIRD_ANSWERED = 3000  # chat-third: the first 3000 prompts of the third batch (2026-12-04, CPU);
# chat-third-rest: the others (2026-12-04, a lent H200); chat-fourth: the fourth batch (2026-12-04, the H200 again)


def _used(prompts, pool: str, kind: str, rows: list[dict]) -> set[str]:
    """The entries of tools/prompts.py's topic pool ``pool`` (its name, e.g. "CHARACTERS") that
    occur as whole words in the ``kind`` prompts of ``rows``."""
    return {x for x in prompts._pool(getattr(prompts, pool)) for d in rows
            if d["kind"] == kind and re.search(rf"\b{re.escape(x)}\b", d["prompt"])}


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
    # chat-rest every one of the second (prompts.FIRST_EXTRA up to FIRST_THIRD), each once;
    # chat-third the first THIRD_ANSWERED prompts of the third batch (from FIRST_THIRD),
    # chat-third-rest every other one of it (up to FIRST_FOURTH), chat-fourth every one of the fourth
    answerable = prompts.answerable_train_prompts()
    first = {d["prompt"] for i, d in answerable if i < prompts.FIRST_EXTRA}
    second = {d["prompt"] for i, d in answerable if prompts.FIRST_EXTRA <= i < prompts.FIRST_THIRD}
    assert {d["prompt"] for name in FILES[:2] for d in rows[name]} == first
    assert {d["prompt"] for name in FILES[2:4] for d in rows[name]} == second
    third = {d["prompt"] for i, d in answerable if prompts.FIRST_THIRD <= i < prompts.FIRST_THIRD + THIRD_ANSWERED}
    assert {d["prompt"] for d in rows["chat-third.jsonl.gz"]} == third and len(rows["chat-third.jsonl.gz"]) == 3000
    rest = {d["prompt"] for i, d in answerable if prompts.FIRST_THIRD + THIRD_ANSWERED <= i < prompts.FIRST_FOURTH}
    assert {d["prompt"] for d in rows["chat-third-rest.jsonl.gz"]} == rest and len(rest) == 7129
    fourth = {d["prompt"] for i, d in answerable if prompts.FIRST_FOURTH <= i}
    assert {d["prompt"] for d in rows["chat-fourth.jsonl.gz"]} == fourth and len(fourth) == FOURTH_SIZE
    assert len(rows["chat-extra.jsonl.gz"]) == 3487  # what stage 6 of the committed draft trained on


def test_second_batch_keeps_heldout_topics_out():
    """The second batch reuses TRAIN topics only: no held-out story character or arithmetic
    name occurs in it, and it repeats no prompt of the first batch or the held-out list."""
    prompts = _tool("prompts")
    train, held = prompts.train_prompts(), prompts.heldout_prompts()
    assert prompts.FIRST_EXTRA == 8479 and len(train) > prompts.FIRST_THIRD > prompts.FIRST_EXTRA
    first, second = train[:prompts.FIRST_EXTRA], train[prompts.FIRST_EXTRA:prompts.FIRST_THIRD]
    assert {d["kind"] for d in second} == set(prompts.KINDS)
    texts = [d["prompt"] for d in second]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & ({d["prompt"] for d in first} | {d["prompt"] for d in held})

    used = partial(_used, prompts)
    held_chars, held_names = used("CHARACTERS", "stories", held), used("NAMES", "arithmetic", held)
    assert len(held_chars) >= 4 and len(held_names) >= 4  # the test sees the held-out topics
    assert not held_chars & used("CHARACTERS", "stories", second)
    assert not held_names & used("NAMES", "arithmetic", second)
    # the calibration prompts are drawn from the first batch only, so the second left them as they were
    assert prompts.calibration_prompt_texts() <= {d["prompt"] for d in first[prompts.FIRST_UNTRAINED:]}


# The topics build() reserves for HELD-OUT (prompts.heldout_topics() on Python 3.11, written
# here so that the checks below hold on any Python).
HELD_TOPICS = {
    "subjects": ["the Great Wall of China", "teamwork", "glaciers", "public speaking", "microwaves", "mushrooms",
                 "bird watching", "water"],
    "howtos": ["train a puppy", "host a picnic", "give a presentation", "make lemonade"],
    "pairs": ["Python and JavaScript", "email and letters"],
    "code": ["counts the words in a file", "returns the median of a list", "counts the characters in a string",
             "returns the intersection of two lists", "implements insertion sort",
             "capitalizes every word in a sentence", "checks whether a string contains only digits",
             "converts a decimal number to binary", "implements binary search",
             "transposes a matrix given as a list of lists", "implements a stack class",
             "returns the day of the week for a date"],
    "modules": ["zlib", "itertools", "queue", "array"],
    "lists": ["ways to save water at home", "Python built-in functions", "tips for writing clearly",
              "questions to ask in a job interview", "benefits of walking", "rules of good email etiquette",
              "ideas for a science fair project", "ways to make a small room look bigger", "ways to celebrate a birthday",
              "qualities of a good friend", "tips for taking care of a dog", "spices used in Indian cooking",
              "animals that hibernate", "fun facts about the moon", "tips for studying effectively",
              "fruits that are high in vitamin C"],
    "chars": ["a taxi driver", "a snowman", "a clumsy wizard", "a brave mouse", "a painter who lost her colors",
              "a lost robot", "a young inventor", "a star that fell from the sky"],
    "names": ["Tara", "Rosa", "Ben", "Sam", "Yara", "Leo"],
    "items": ["shells", "toy cars", "marbles", "apples"],
}
# sha256 of json.dumps(rows, ensure_ascii=False, sort_keys=True) of the frozen lists before the
# third batch was appended (commit a38f715) and before the fourth was (commit 5e4d490), and of
# the calibration file's bytes
SHA_FIRST_TWO_BATCHES = "60ce0a272cd5f9a5366e875ed7d034b3c3fda980a3c1a02f38cd73ff94e0557f"  # train[:FIRST_THIRD]
SHA_FIRST_THREE_BATCHES = "27b2b961c12bdb0d76861c0bf2ab93f89cb5d806b9e61c64755613c4ef853df5"  # train[:FIRST_FOURTH]
SHA_HELDOUT = "36c5239ac3d0f26f73487668b6c86ac48ae3f8429f4b5d87e1f6e692a5282c05"
SHA_CALIBRATION = "96c5daf8d21e8e47f0a8d414d7411e5f57000093fdb7afbda526c85028d76ecd"


def _sha(rows: list[dict]) -> str:
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False, sort_keys=True).encode()).hexdigest()


FOURTH_SIZE = 10282  # the fourth batch's prompts (2026-12-04), the last batch of the frozen list


def test_appended_batches_left_the_earlier_lists_unchanged():
    """Appending the third and then the fourth batch changed no earlier TRAIN prompt, no
    held-out prompt and no calibration prompt (write_calibration draws from the first batch
    only)."""
    prompts = _tool("prompts")
    train = prompts.train_prompts()
    assert prompts.FIRST_THIRD == 12614 and prompts.FIRST_FOURTH == 22743
    assert len(train) == prompts.FIRST_FOURTH + FOURTH_SIZE
    assert _sha(train[:prompts.FIRST_THIRD]) == SHA_FIRST_TWO_BATCHES
    assert _sha(train[:prompts.FIRST_FOURTH]) == SHA_FIRST_THREE_BATCHES
    assert _sha(prompts.heldout_prompts()) == SHA_HELDOUT
    assert hashlib.sha256(prompts.CALIBRATION_PATH.read_bytes()).hexdigest() == SHA_CALIBRATION


def test_heldout_topics_are_the_ones_build_reserves():
    """HELD_TOPICS is what build() reserves; each one is seen in the frozen held-out prompts
    (the code tasks and modules: 16 held-out code prompts for 16 topics)."""
    prompts = _tool("prompts")
    if sys.version_info[:2] == prompts.BUILT_ON:
        assert prompts.heldout_topics() == HELD_TOPICS
    held = " ".join(d["prompt"] for d in prompts.heldout_prompts())
    for kind in ("subjects", "howtos", "code", "modules", "lists"):
        assert all(t in held for t in HELD_TOPICS[kind]), kind
    assert sum(t in held for t in HELD_TOPICS["chars"]) >= 7 and all(n in held for n in HELD_TOPICS["names"])


def _assert_no_heldout_topic(prompts, texts: list[str]) -> None:
    """No held-out chat subject, how-to, pair, code task or list subject occurs in ``texts``
    (case-insensitive substring), no held-out module, story character, arithmetic name or
    item (whole words), and no NEAR_HELDOUT word; prompts._mentions_heldout agrees."""
    lows = [t.lower() for t in texts]
    for kind in ("subjects", "howtos", "pairs", "code", "lists"):
        for topic in HELD_TOPICS[kind]:
            assert not [t for t in lows if topic.lower() in t], (kind, topic)
    for kind in ("modules", "chars", "names", "items"):
        for topic in HELD_TOPICS[kind]:
            pat = re.compile(rf"\b{re.escape(topic.lower())}\b")
            assert not [t for t in lows if pat.search(t)], (kind, topic)
    for pat in prompts.NEAR_HELDOUT:
        assert not [t for t in lows if re.search(pat, t)], pat
    assert all(not prompts._mentions_heldout(t, HELD_TOPICS) for t in texts)


def _batch_and_held_topics(prompts, start: int, end: int | None, kinds: dict[str, int]):
    """The TRAIN prompts [start, end) as a batch: its kind counts are ``kinds``, no prompt twice,
    none an earlier TRAIN or held-out prompt, no held-out topic (``_assert_no_heldout_topic``).
    Returns the batch, ``_used`` bound to prompts, and the held-out story characters,
    arithmetic names and items the frozen held-out prompts use (each seen)."""
    train, held = prompts.train_prompts(), prompts.heldout_prompts()
    earlier, batch = train[:start], train[start:end]
    assert {k: sum(d["kind"] == k for d in batch) for k in prompts.KINDS} == kinds
    texts = [d["prompt"] for d in batch]
    assert len(set(texts)) == len(texts)
    assert not set(texts) & ({d["prompt"] for d in earlier} | {d["prompt"] for d in held})
    _assert_no_heldout_topic(prompts, texts)
    used = partial(_used, prompts)
    held_chars, held_names = used("CHARACTERS", "stories", held), used("NAMES", "arithmetic", held)
    held_items = used("ITEMS", "arithmetic", held)
    assert len(held_chars) >= 4 and len(held_names) >= 4 and len(held_items) >= 3
    return batch, used, held_chars, held_names, held_items


def test_third_batch_keeps_heldout_topics_out():
    """The third batch (new topic pools): no held-out chat subject, how-to, pair, code task or
    list subject occurs in any of its prompts (case-insensitive substring), no held-out module,
    story character, arithmetic name or item (whole words), and no NEAR_HELDOUT word; it has
    every kind, no prompt twice, and repeats no earlier TRAIN or held-out prompt."""
    prompts = _tool("prompts")
    third, used, held_chars, held_names, held_items = _batch_and_held_topics(
        prompts, prompts.FIRST_THIRD, prompts.FIRST_FOURTH,
        {"chat": 3993, "code": 960, "lists": 684, "stories": 2200, "arithmetic": 2292})
    # the same check as the second batch's, from the frozen held-out stories and problems
    assert not held_chars & (used("CHARACTERS", "stories", third) | used("CHARACTERS3", "stories", third))
    assert not held_names & (used("NAMES", "arithmetic", third) | used("NAMES3", "arithmetic", third))
    assert not held_items & (used("ITEMS", "arithmetic", third) | used("ITEMS3", "arithmetic", third))
    # the new pools are new: no story character, name or item of the first two batches
    for old, new in (("CHARACTERS", "CHARACTERS3"), ("NAMES", "NAMES3"), ("ITEMS", "ITEMS3"),
                     ("SUBJECTS", "SUBJECTS3"), ("CODE_TASKS", "CODE_TASKS3"), ("LIST_SUBJECTS", "LIST_SUBJECTS3")):
        assert not set(prompts._pool(getattr(prompts, old))) & set(prompts._pool(getattr(prompts, new))), new


# The topic pools of the batches before the fourth, and the fourth's (tools/prompts.py).
EARLIER_POOLS = ("SUBJECTS", "HOWTO", "PAIRS", "CODE_TASKS", "MODULES", "LIST_SUBJECTS", "CHARACTERS", "SETTINGS",
                 "THEMES", "NAMES", "ITEMS", "SUBJECTS3", "HOWTO3", "PAIRS3", "CODE_TASKS3", "MODULES3",
                 "LIST_SUBJECTS3", "CHARACTERS3", "SETTINGS3", "THEMES3", "NAMES3", "ITEMS3", "WORDY3", "MISTAKES3",
                 "RECIPIENTS3", "PURPOSES3", "DECISIONS3")
FOURTH_POOLS = ("SUBJECTS4", "HOWTO4", "PAIRS4", "CODE_TASKS4", "MODULES4", "LIST_SUBJECTS4", "CHARACTERS4",
                "SETTINGS4", "THEMES4", "NAMES4", "ITEMS4", "WORDS4", "PROVERBS4", "EXAMPLES4", "YESNO4", "PASSAGES4")


def test_fourth_batch_keeps_heldout_topics_out():
    """The fourth batch (new topic pools, new chat forms and word problems): no held-out topic
    of any category and no NEAR_HELDOUT word occurs in any of its prompts (as for the third
    batch); it has every kind in the counts it was built with, no prompt twice, repeats no
    earlier TRAIN or held-out prompt, and its pools and templates share no entry with those
    of the earlier batches."""
    prompts = _tool("prompts")
    fourth, used, held_chars, held_names, held_items = _batch_and_held_topics(
        prompts, prompts.FIRST_FOURTH, None, {"chat": 4068, "code": 985, "lists": 729, "stories": 2200, "arithmetic": 2300})
    # from the frozen held-out stories and problems, as for the second and third batches
    assert not held_chars & used("CHARACTERS4", "stories", fourth)
    assert not held_names & used("NAMES4", "arithmetic", fourth)
    assert not held_items & used("ITEMS4", "arithmetic", fourth)
    # its story and arithmetic pools are used, and every pool of it is new: no entry of an earlier pool (in any case)
    for name in ("CHARACTERS4", "SETTINGS4", "THEMES4"):
        assert used(name, "stories", fourth), name
    for name in ("NAMES4", "ITEMS4"):
        assert used(name, "arithmetic", fourth), name
    old = {x.lower() for name in EARLIER_POOLS for x in prompts._pool(getattr(prompts, name))}
    for name in FOURTH_POOLS:
        pool = prompts._pool(getattr(prompts, name))
        assert pool and not {x.lower() for x in pool} & old, name
    old_templates = {t for name in dir(prompts) if re.fullmatch(r"T_[A-Z]+[23]?", name) for t in getattr(prompts, name)}
    new_templates = [t for name in dir(prompts) if re.fullmatch(r"T_[A-Z]+4", name) for t in getattr(prompts, name)]
    assert len(old_templates) > 100 and len(new_templates) > 60 and not old_templates & set(new_templates)


@pytest.mark.parametrize("batch", ["third", "fourth"])
def test_any_prefix_of_the_third_and_fourth_batches_is_balanced(batch):
    """The third and fourth batches are shuffled: the first 1000 prompts of each hold every
    kind near its share."""
    prompts = _tool("prompts")
    train = prompts.train_prompts()
    batch_rows = train[prompts.FIRST_THIRD:prompts.FIRST_FOURTH] if batch == "third" else train[prompts.FIRST_FOURTH:]
    head = batch_rows[:1000]
    for k in prompts.KINDS:
        share = sum(d["kind"] == k for d in batch_rows) / len(batch_rows)
        assert abs(sum(d["kind"] == k for d in head) / len(head) - share) < 0.05, k
