"""runtime/prediction.py: a predicted output followed along the answer and re-found after an
edit, its usage counts, and `Session.stream(..., prediction=...)` on real tiny engines
(test_text.py's ``worded`` pair): the answer is the target's whatever the prediction."""

from __future__ import annotations

import pytest

from specrt.errors import UserError
from specrt.runtime.prediction import IN_STEP, RESYNC_LONG, RESYNC_SHORT, Prediction, usage
from specrt.runtime.sampling import SamplingParams
from tests.runtime.test_text import worded  # noqa: F401  (fixture: word-level tiny pair)

PROMPT = [90, 91, 92]


def test_the_prediction_is_followed_from_its_start():
    """Before any output, and while the output goes on matching, the proposal is what follows
    in the prediction (IN_STEP), cut to the limit; at the prediction's end, none."""
    p = Prediction([1, 2, 3, 4, 5], len(PROMPT))
    assert p.propose(PROMPT, 3) == ([1, 2, 3], IN_STEP)
    assert p.propose(PROMPT + [1, 2], 8) == ([3, 4, 5], IN_STEP)
    assert p.propose(PROMPT + [1, 2, 3, 4, 5], 8) == ([], 0)
    assert p.propose(PROMPT + [1], 0) == ([], 0)


def test_after_an_edit_the_prediction_is_found_again_by_the_outputs_last_tokens():
    """A token the prediction does not have there loses the alignment: nothing is proposed
    until the output's last tokens (2 or more, the output's own) occur in the prediction, then
    what follows the occurrence at or after the edit (not an earlier one), under RESYNC_LONG
    for 4 tokens or more, RESYNC_SHORT below; once a resync's token is emitted, IN_STEP again."""
    pred = [7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    p = Prediction(pred, len(PROMPT))
    x = PROMPT + [7, 8, 1, 2]
    assert p.propose(x, 2) == ([3, 4], IN_STEP)
    x += [30]  # an edit: 3 replaced
    assert p.propose(x, 2) == ([], 0)  # (the output's tail 2 30 is not in the prediction)
    x += [4, 5, 6, 7, 8]  # back on the prediction: its 5 last tokens found
    assert p.propose(x, 2) == ([9, 10], RESYNC_LONG)
    z = Prediction(pred, len(PROMPT))
    assert z.propose(PROMPT + [7, 8, 1, 2, 3, 4, 30, 31, 7, 8], 2) == ([9, 10], RESYNC_SHORT)  # (7 8 after the
    # edit, at 4 of the prediction: its occurrence at the start would propose 1 2)
    q = Prediction(pred, len(PROMPT))
    y = PROMPT + [40, 41, 5, 6]  # two tokens matching: a short match
    assert q.propose(y, 3) == ([7, 8, 9], RESYNC_SHORT)
    assert q.propose(y + [7], 3) == ([8, 9, 10], IN_STEP)
    # the prompt's tokens never make a match: one output token is no n-gram of the output's
    r = Prediction([91, 92, 5, 6], len(PROMPT))
    assert r.propose(PROMPT + [50], 2) == ([], 0)


def test_usage_counts_the_prediction_rounds_alone():
    """usage() sums the prediction's keys of a telemetry's lookup rounds: accepted, and the
    verified rest as rejected; prompt lookup's and a corpus's rounds are not the prediction's."""
    by_match = {"4": {"rounds": 3, "verified": 9, "accepted": 5},
                str(IN_STEP): {"rounds": 2, "verified": 40, "accepted": 37},
                str(RESYNC_SHORT): {"rounds": 1, "verified": 6, "accepted": 0}}
    assert usage(by_match) == {"accepted_prediction_tokens": 37, "rejected_prediction_tokens": 9,
                               "prediction_rounds": 3}
    assert usage({}) == {"accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0, "prediction_rounds": 0}


@pytest.mark.parametrize("governor", ["off", "fixed:3", "auto"])
def test_session_stream_takes_a_prediction_and_answers_as_without_it(worded, governor):  # noqa: F811
    """Session.stream(..., prediction=text) and stream_ids(..., prediction=ids): greedy answers
    are the same tokens as without a prediction (the answer itself, an edited one, a part of
    it); stats()['prediction'] counts them, none without a prediction. The first stream given the
    answer as its prediction, where the prediction is the only lookup source (off, fixed:3: a
    policy of its own, made then, its first round priced from the cost table alone), has most
    of the answer accepted, none refused, in fewer rounds; later rounds are priced on measured
    times (a busy host's slow round makes a chain look dear), and auto's session growth holds the
    answer from the first stream and may take the rounds, so only the counts are checked there."""
    from specrt.runtime.session import Session

    for prompt in ("w4 w6 w7", "w12 w13"):
        with Session(worded, governor=governor) as s:
            answer = "".join(s.stream(prompt, max_new_tokens=48))
            plain = s.stats()
            assert "prediction" not in plain
            ids = plain["output_token_ids"]
            words = answer.split()
            edited = " ".join(words[:10] + ["w0"] + words[11:])
            for k, prediction in enumerate((answer, edited)):
                assert "".join(s.stream(prompt, max_new_tokens=48, prediction=prediction)) == answer
                st = s.stats()
                assert st["output_token_ids"] == ids
                c = st["prediction"]
                verified = sum(m["verified"] for key, m in st["lookup"]["by_match"].items() if int(key) >= 60)
                assert c["accepted_prediction_tokens"] + c["rejected_prediction_tokens"] == verified, (c, st["lookup"])
                assert c["accepted_prediction_tokens"] <= len(ids) - 1 - c["prediction_rounds"]
                if k == 0 and governor != "auto":
                    assert 2 * c["accepted_prediction_tokens"] >= len(ids), c
                    assert c["rejected_prediction_tokens"] == 0 and st["rounds"] < plain["rounds"] / 3, (c, st)
            assert list(s.stream_ids(s.last_prompt_ids, 48, prediction=ids[:20])) and s.last_output_ids == ids
            assert set(s.stats()["prediction"]) == {"accepted_prediction_tokens", "rejected_prediction_tokens",
                                                    "prediction_rounds"}


def test_a_seeded_coupled_answer_is_the_same_with_a_prediction(worded):  # noqa: F811
    """Coupled sampling (serve's --reproducible, run's): a seed's answer is a function of the seed
    alone, a prediction leaves it as it was."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3", sampling=SamplingParams(temperature=0.4, seed=7, coupled=True)) as s:
        answer = "".join(s.stream("w4 w6 w7", max_new_tokens=40))
        assert len(answer.split()) == 40
        for prediction in (answer, "w3 w11 w3 w11", answer.replace("w11", "w3")):
            assert "".join(s.stream("w4 w6 w7", max_new_tokens=40, prediction=prediction)) == answer
        assert s.stats()["prediction"]["prediction_rounds"] >= 1


def test_a_bad_prediction_is_refused_before_anything_runs(worded):  # noqa: F811
    """A prediction of ids outside the vocabulary, or not integers, is a UserError naming it and
    where, before the stream runs (Session.stream checks it when called)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="fixed:3") as s:
        for bad, words in (([1, 2, 99], "prediction token id 99 (at 2): expected an integer in [0, 16)"),
                           ([1, "2"], "prediction token id '2' (at 1)"), ({"a": 1}, "expected a list of token ids")):
            with pytest.raises(UserError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
                s.stream("w4", max_new_tokens=4, prediction=bad)
            with pytest.raises(UserError):
                list(s.stream_ids([4, 5], 4, prediction=bad))
