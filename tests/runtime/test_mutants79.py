"""Tests written for session 79's mutation round (m79g): each kills a mutant of session 79's
new runtime code that the tests beside it let live (runtime/prediction.py's resync, its key's
bound and its prompt rule; Generator.resolve_prediction's id range and the lookup policy a
prediction joins)."""

from __future__ import annotations

import pytest

from specrt.errors import UserError
from specrt.runtime.grammar import Constraint, compile_constraint
from specrt.runtime.prediction import IN_STEP, RESYNC_LONG, RESYNC_SHORT, Prediction
from specrt.runtime.sampling import SamplingParams
from tests.runtime.test_grammar import guided  # noqa: F401  (fixture: tiny Llama, byte-level BPE)
from tests.runtime.test_text import worded  # noqa: F401  (fixture: word-level tiny pair)

PROMPT = [90, 91, 92]


def test_a_resync_of_exactly_long_tokens_is_a_long_one():
    """The output's last LONG (4) tokens found in the prediction: RESYNC_LONG; 3: RESYNC_SHORT
    (kills LONG 4 -> 5 and n >= LONG -> n > LONG)."""
    pred = [1, 2, 3, 4, 5, 6, 7, 8]
    p = Prediction(pred, len(PROMPT))
    assert p.propose(PROMPT + [40, 3, 4, 5, 6], 2) == ([7, 8], RESYNC_LONG)  # (40 3 4 5 6 not in it: 4 tokens are)
    q = Prediction(pred, len(PROMPT))
    assert q.propose(PROMPT + [40, 4, 5, 6], 2) == ([7, 8], RESYNC_SHORT)


def test_a_resync_before_the_edit_takes_the_latest_occurrence():
    """No occurrence of the output's tail at or after where the alignment was lost: the latest one
    before it (the answer goes through the prediction in order), not the first."""
    pred = [1, 2, 3, 1, 2, 4, 7, 7, 7]
    p = Prediction(pred, len(PROMPT))
    x = PROMPT + [1, 2, 3, 1, 2, 4, 7]  # followed to index 7
    assert p.propose(x, 2) == ([7, 7], IN_STEP)
    x += [50, 1, 2]  # an edit at 7, then "1 2": its occurrences end at 2 and 5, both before 7
    assert p.propose(x, 3) == ([4, 7, 7], RESYNC_SHORT)


def test_a_tail_found_at_the_predictions_end_proposes_nothing():
    """The output's tail occurring at the prediction's very end (after the edit) is that
    occurrence: nothing follows it, so nothing is proposed, not what followed an earlier one."""
    pred = [1, 2, 3, 1, 2]
    p = Prediction(pred, len(PROMPT))
    assert p.propose(PROMPT + [1, 2, 3], 2) == ([1, 2], IN_STEP)
    assert p.propose(PROMPT + [1, 2, 3, 9, 1, 2], 3) == ([], 0)  # (lost at 3: "1 2" ends at 2 and 5; 5 the one)


def test_the_prompts_tokens_make_no_resync():
    """A resync reads the output's own tokens: one output token after a prompt whose last token
    with it spells an n-gram of the prediction is no match (the output has one token)."""
    p = Prediction([92, 50, 7, 8], len(PROMPT))
    assert p.propose(PROMPT + [50], 2) == ([], 0)
    assert p.propose(PROMPT + [50, 7], 2) == ([8], RESYNC_SHORT)  # (two output tokens: "50 7")


def test_a_prediction_id_at_or_past_the_vocabulary_or_negative_is_refused(worded):  # noqa: F811
    """The ids of a prediction are checked against the vocabulary's range at both ends."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        vocab = s.generator.vocab
        for bad in (vocab, -1):
            with pytest.raises(UserError, match=rf"prediction token id {bad} \(at 1\): expected an integer in "
                                                rf"\[0, {vocab}\)"):
                s.stream("w4", max_new_tokens=4, prediction=[1, bad])
        assert list(s.stream_ids([4, 5], 4, prediction=[0, vocab - 1]))


def test_a_prediction_is_proposed_under_a_lookup_governor(worded):  # noqa: F811
    """Under a governor with prompt lookup (:ngram) the prediction is a source of that lookup
    policy (its keys' priors added to it): the answer given as its own prediction has rounds of
    the prediction's, most of the answer accepted from it. A prediction priced by another policy
    than the one choosing the rounds was never chosen (no priors: 0 rounds)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3:ngram") as s:
        answer = "".join(s.stream("w5 w9 w11 w3", max_new_tokens=48))
        ids = s.stats()["output_token_ids"]
        assert "".join(s.stream("w5 w9 w11 w3", max_new_tokens=48, prediction=answer)) == answer
        st = s.stats()
        assert st["output_token_ids"] == ids
        c = st["prediction"]
        assert c["prediction_rounds"] >= 1 and c["accepted_prediction_tokens"] >= 1, (c, st["lookup"])


def test_a_deferred_grammars_allowed_tokens_before_its_tag_are_the_allowed_ids(guided):
    """A grammar held after a tag (serve's --reasoning-parser) with allowed token ids: before the
    tag, the tokens allowed next (what a tree's runners-up at a round's first position are drawn
    from) are those ids, not every token; after the tag, the grammar's among them."""
    from dataclasses import replace

    import numpy as np

    from specrt.runtime.grammar import Constraint, compile_constraint

    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    one = {c: text.tokenizer.encode(c, add_special_tokens=False).ids[0] for c in "ab7x"}
    ids = (one["a"], one["b"], one["7"], one["x"])
    guide = compile_constraint(replace(Constraint.regex("[ab]{6}"), after="7", only=ids), text, vocab, eos).guide()
    want = np.zeros(vocab, bool)
    want[list(ids)] = True
    assert np.array_equal(guide.allowed(), want)  # (before the tag: the ids alone)
    guide.take(one["7"])  # the tag: the grammar holds from here, among the ids
    assert set(np.flatnonzero(guide.allowed())) == {one["a"], one["b"]}


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=5, coupled=True),
                                    SamplingParams(temperature=1.0, seed=11)])
def test_allowed_ids_hold_every_row_before_a_tag_that_never_comes(guided, params):  # noqa: F811
    """A grammar held after a tag the allowed ids cannot spell (its first tokens among them, as the
    stream's start asks): every row of the answer is a row
    before the tag, held to the ids alone, under greedy (argmaxes), coupled and plain sampling
    (row_probs: drafts' acceptance and each round's bonus token) and token trees' runners-up
    (sibling_row); speculative decoding gives target-only's masked tokens where it is lossless
    token for token (greedy, coupled)."""
    from dataclasses import replace

    from specrt.runtime.governor import OffGovernor
    from tests.runtime.test_grammar import DEPTHS, PROMPTS, _gen, _governors

    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    free = _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[1], 24, eos)
    ab = {i for c in "ab" for i in text.tokenizer.encode(c, add_special_tokens=False).ids}  # (the grammar's start)
    ids = sorted(set(range(3, 60)) - set(free[:2]) - set(eos) - set(text.tokenizer.encode("7").ids) | ab)
    g = compile_constraint(replace(Constraint.regex("[ab]{6}"), after="7", only=tuple(ids)), text, vocab, eos)
    ref = _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[1], 24, eos, g)
    assert len(ref) == 24 and set(ref) <= set(ids), ref
    for name, gov in _governors(engines):
        got = _gen(engines, gov, params).generate(PROMPTS[1], 24, eos, g)
        assert set(got) <= set(ids), (name, got)
        if params.greedy or params.coupled:
            assert got == ref, name


def test_allowed_ids_at_the_vocabularys_bounds(guided):  # noqa: F811
    """Constraint.tokens' ids are checked at both ends of the vocabulary: vocab and -1 refused
    (a UserError naming the id, not an IndexError from the mask), 0 and vocab - 1 taken."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    for bad in (vocab, -1):
        with pytest.raises(UserError, match=rf"allowed_token_ids: token id {bad} is not in the vocabulary "
                                            rf"\(0 to {vocab - 1}\)"):
            compile_constraint(Constraint.tokens([0, bad]), None, vocab, eos)
    assert compile_constraint(Constraint.tokens([0, vocab - 1]), None, vocab, eos).only.sum() == 2


def test_a_structures_trigger_is_the_first_that_begins_it_and_its_schema_keeps_its_own_layout():
    """structural_tag_lark: of two triggers that both begin a structure's begin, the first listed
    is its trigger (vLLM's pick), the rest of the begin after it; a schema's own "x-guidance"
    options are laid over the request's JSON layout, not under it."""
    import json

    from specrt.runtime.grammar import JSON_LAYOUT, structural_tag_lark

    schema = {"type": "object", "x-guidance": {"item_separator": ","}}
    lark = structural_tag_lark({"structures": [{"begin": "<fn=a>", "schema": schema, "end": "</fn>"}],
                                "triggers": ["<f", "<fn"]}, JSON_LAYOUT, {}, "st")
    assert 'tag_0_trigger[lazy]: TEXT "<f"' in lark and 'tag_0: tag_0_trigger "n=a>" %json' in lark, lark
    held = json.loads(lark.split("%json ", 1)[1].rsplit(' "</fn>"', 1)[0])["x-guidance"]
    assert held == {**JSON_LAYOUT, "item_separator": ","}, held


def test_a_prediction_alone_brings_no_prompt_lookup_and_its_rates_are_learnt(worded):  # noqa: F811
    """Under a governor without lookup (fixed:3) a prediction is the only lookup source: no round
    is prompt lookup's (its keys 2..4), and the prediction's policy learns from each stream (a
    prediction that leaves the answer after its first token lowers its key's rate: rates are
    learnt in hindsight)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        answer = "".join(s.stream("w5 w9 w11 w3", max_new_tokens=48)).split()
        wrong = " ".join(answer[:1] + [w for w in ("w1", "w2", "w3") if w != answer[1]] * 4)  # (right, then not)
        for _ in range(2):
            "".join(s.stream("w5 w9 w11 w3", max_new_tokens=48, prediction=wrong))
            assert all(int(k) in (IN_STEP, RESYNC_LONG, RESYNC_SHORT) for k in s.stats()["lookup"]["by_match"]), \
                s.stats()["lookup"]
        policy = s.generator.governor.prediction_policy
        assert policy.rates(IN_STEP)[0] < Prediction.source_priors()[IN_STEP][0], policy.rates(IN_STEP)
