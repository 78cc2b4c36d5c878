"""OpenAI's Predicted Outputs (``prediction``, runtime/prediction.py) on `specrt serve`'s
/v1/chat/completions, through the real OpenAI SDK against real tiny engines (test_text.py's
``worded`` pair), and `specrt run --prediction FILE`: the answer is the target's whatever the
prediction (greedy token for token; sampled, the same text under --reproducible), the
prediction's tokens are counted in usage as OpenAI names them, and what OpenAI refuses beside
a prediction is refused."""

from __future__ import annotations

import contextlib
import re
import threading

import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.runtime.sampling import SamplingParams
from tests.runtime.test_text import worded  # noqa: F401  (fixture: word-level tiny pair)

openai = pytest.importorskip("openai")

CONVS = [[{"role": "user", "content": "w4 w6 w7"}], [{"role": "user", "content": "w5 w9 w11 w3"}],
         [{"role": "system", "content": "w12"}, {"role": "user", "content": "w13"}]]


@contextlib.contextmanager
def _serving(engines, governor: str, params: SamplingParams = SamplingParams()):
    """An OpenAI client of a Server on ENGINES behind make_server on a free port, in this process."""
    from specrt.cmd_serve import Server, make_server

    app = Server(engines, governor, params, 8, "tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{httpd.server_address[1]}/v1", api_key="none", max_retries=0)
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def _edited(text: str) -> str:
    """``text`` with its middle word replaced and a word dropped after it (an edit)."""
    words = text.split()
    k = len(words) // 2
    return " ".join(words[:k] + ["w0"] + words[k + 1 : k + 3] + words[k + 4 :])


@pytest.mark.parametrize("governor", ["fixed:3", "fixed:3:ngram:grow"])
def test_a_prediction_leaves_the_greedy_answer_as_it_was_and_is_counted(worded, governor):  # noqa: F811
    """Greedy answers with a prediction are the answers without it, token for token, whether
    the prediction is the answer itself, an edited answer or unrelated text; with the answer as
    its prediction, under a governor without lookup (fixed:3: the prediction has a policy of its
    own, made at the first such request, whose first round is priced from the cost table alone),
    most of it is accepted, none refused, in far fewer target calls (checked on that first
    request: later rounds are priced on measured times, which a busy host's slow round makes
    dear); with :ngram:grow it competes with prompt lookup and the session's earlier answers,
    which hold the same answer by then. The counts: accepted at most the
    answer, accepted + rejected at most what the prediction's rounds verified (32 a round at
    most, the longest chain the cost table prices), none without a prediction round."""
    with _serving(worded, governor) as client:
        seen = False  # a request with a prediction answered (the first: its policy made for it)
        for conv in CONVS:
            plain = client.chat.completions.create(model="tiny", messages=conv, max_tokens=48, temperature=0)
            answer = plain.choices[0].message.content
            assert len(answer.split()) == 48 and plain.usage.completion_tokens_details is None
            calls = plain.usage.completion_tokens / plain.model_extra["specrt"]["tokens_per_call"]
            for prediction, whole in ((answer, True), (_edited(answer), False), ("w1 w2 w1 w2", False),
                                      ([{"type": "text", "text": answer[:20]}, {"type": "text", "text": answer[20:]}],
                                       True)):
                r = client.chat.completions.create(model="tiny", messages=conv, max_tokens=48, temperature=0,
                                                   prediction={"type": "content", "content": prediction})
                first, seen = not seen, True
                assert r.choices[0].message.content == answer, (conv, prediction)
                assert r.usage.completion_tokens == plain.usage.completion_tokens
                d = r.usage.completion_tokens_details
                extra = r.model_extra["specrt"]["prediction"]
                assert d.accepted_prediction_tokens + d.rejected_prediction_tokens <= extra["rounds"] * 32
                assert d.accepted_prediction_tokens <= min(r.usage.completion_tokens, extra["tokens"])
                if extra["rounds"] == 0:  # (no round verified the prediction's tokens: none counted)
                    assert d.accepted_prediction_tokens == d.rejected_prediction_tokens == 0, d
                if whole and governor == "fixed:3" and conv is CONVS[0] and first:  # the answer itself: most of it accepted, nothing refused, in a few target calls (how
                    # long a chain each round verifies follows the measured costs: not a fixed count)
                    n = r.usage.completion_tokens
                    assert 2 * d.accepted_prediction_tokens >= n and d.rejected_prediction_tokens == 0, (d, extra)
                    assert 3 * extra["target_calls"] < calls, (extra, calls)


def test_an_edited_prediction_is_counted_streamed_too(worded):  # noqa: F811
    """An edited prediction has tokens refused at the edit (rejected > 0) and accepted around it;
    a streamed answer's usage chunk carries the counts too (its own: how long a chain each round
    verifies follows the measured costs and the rates learnt from the requests before)."""
    with _serving(worded, "fixed:3") as client:
        conv = CONVS[0]
        answer = client.chat.completions.create(model="tiny", messages=conv, max_tokens=48).choices[0].message.content
        body = dict(model="tiny", messages=conv, max_tokens=48,
                    prediction={"type": "content", "content": _edited(answer)})
        r = client.chat.completions.create(**body)
        d = r.usage.completion_tokens_details
        assert d.accepted_prediction_tokens > 0 and d.rejected_prediction_tokens > 0, d
        chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
        s = chunks[-1].usage.completion_tokens_details
        assert s.accepted_prediction_tokens > 0 and s.rejected_prediction_tokens >= 0, s
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_a_sampled_answer_under_reproducible_is_the_same_with_a_prediction(worded):  # noqa: F811
    """--reproducible (coupled sampling): a seeded sampled answer is a function of the seed alone,
    so a prediction (the answer itself, or an edited one) leaves its text as it was; with the
    answer as its prediction most of it is accepted and none refused."""
    with _serving(worded, "fixed:3", SamplingParams(temperature=0.4, coupled=True)) as client:
        for seed in (1, 2, 3):
            body = dict(model="tiny", messages=CONVS[0], max_tokens=40, seed=seed, temperature=0.4)
            answer = client.chat.completions.create(**body).choices[0].message.content
            for prediction in (answer, _edited(answer) if len(answer.split()) > 8 else "w3 w3"):
                r = client.chat.completions.create(**body, prediction={"type": "content", "content": prediction})
                assert r.choices[0].message.content == answer, (seed, prediction)
                d = r.usage.completion_tokens_details
                if seed == 1 and prediction == answer:  # (the coupled answer is its prediction: none refused; the
                    # first request with one, its first round priced from the cost table)
                    assert r.usage.completion_tokens >= 10 and d.rejected_prediction_tokens == 0, r.usage
                    assert 2 * d.accepted_prediction_tokens >= r.usage.completion_tokens, r.usage


def test_what_openai_refuses_beside_a_prediction_is_a_400_naming_the_field(worded):  # noqa: F811
    """OpenAI's Predicted Outputs refuse n > 1, logprobs, max_completion_tokens and tools beside a
    prediction, and the prediction on /v1/completions; a prediction that is not {type: content,
    content: text or text parts} is a 400 naming 'prediction'."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    pred = {"type": "content", "content": "w3 w3"}
    with _serving(worded, "fixed:3") as client:
        for extra, param, words in ((dict(n=2), "n", "values higher than 1 are not supported"),
                                    (dict(logprobs=True), "logprobs", "not supported"),
                                    (dict(max_completion_tokens=4), "max_completion_tokens", "not supported"),
                                    (dict(tools=[tool], tool_choice="none"), "tools", "Function calling is not currently supported")):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="tiny", messages=CONVS[0], prediction=pred, **extra)
            err = e.value.body
            assert err["param"] == param and words in err["message"] and "'prediction'" in err["message"], err
            # the same request without the prediction is answered
            client.chat.completions.create(model="tiny", messages=CONVS[0], **({"max_tokens": 4} | extra))
        for bad in ({"type": "text", "content": "w3"}, {"content": "w3"}, {"type": "content", "content": 3},
                    {"type": "content", "content": [{"type": "image_url", "image_url": "x"}]},
                    {"type": "content", "content": "w3", "other": 1}, "w3 w3"):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="tiny", messages=CONVS[0], prediction=bad)
            assert e.value.body["param"] == "prediction" and "'type': 'content'" in e.value.body["message"], bad
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt="w4 w6", max_tokens=4, extra_body={"prediction": pred})
        assert e.value.body["param"] == "prediction" and "/v1/chat/completions" in e.value.body["message"]
        # logprobs false and n 1 are no refusal
        r = client.chat.completions.create(model="tiny", messages=CONVS[0], prediction=pred, logprobs=False, n=1,
                                           max_tokens=4)
        assert r.usage.completion_tokens_details.accepted_prediction_tokens >= 0


def test_run_takes_a_prediction_file(worded, tmp_path):  # noqa: F811
    """`specrt run --prediction FILE`: the same text as without it, --stats' 'prediction' and the
    closing line counting its accepted and rejected tokens (the answer as its prediction: every
    token but the first and each round's last one accepted from it, none rejected, where every
    round but plain decode steps is the prediction's); with --prompts it is refused (one answer's)."""
    import json

    args = ["run", str(worded), "--prompt", "w4 w6 w7", "--max-new-tokens", "40", "--governor", "fixed:3"]
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0, plain.output
    answer = plain.stdout.strip("\n")
    (tmp_path / "p.txt").write_text(answer)
    r = CliRunner().invoke(main, args + ["--prediction", str(tmp_path / "p.txt"), "--stats", str(tmp_path / "s.json")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip("\n") == answer
    st = json.loads((tmp_path / "s.json").read_text())["prompts"][0]
    said = re.search(r"the prediction in (\d+) rounds?: (\d+) of its tokens accepted, (\d+) rejected", r.stderr)
    assert said, r.stderr
    rounds, accepted, rejected = map(int, said.groups())
    assert st["prediction"] == {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected,
                                "prediction_rounds": rounds}
    assert rejected == 0 and accepted == 40 - 1 - st["rounds"] + st["accepted"], (st["rounds"], r.stderr)
    assert 1 <= rounds <= st["rounds"] <= 6 and "prompt lookup" not in r.stderr, r.stderr
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"prompt": "w4"}\n')
    r = CliRunner().invoke(main, ["run", str(worded), "--prompts", str(prompts), "--prediction",
                                  str(tmp_path / "p.txt")])
    assert r.exit_code == 1 and "--prediction predicts one answer: give it with --prompt" in r.output, r.output


def test_prediction_tokens_are_counted_in_metrics_and_the_log(worded):  # noqa: F811
    """h79j (h79c's left): /metrics' specrt_prediction_tokens_accepted_total and
    ..._rejected_total add up the usage counts of every answer with a prediction (whole and
    streamed), and its log line says them; an answer without one adds nothing and says none."""
    import urllib.request

    from tests.cli.test_serve import _in_process

    def counted(url: str) -> dict[str, float]:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
            lines = m.read().decode().splitlines()
        return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in lines if ln.startswith("specrt_prediction_"))}

    with _in_process(worded, "fixed:3") as (app, _, url, logs):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        conv = CONVS[0]
        answer = client.chat.completions.create(model="tiny", messages=conv, max_tokens=48).choices[0].message.content
        assert counted(url) == {"specrt_prediction_tokens_accepted_total": 0,
                                "specrt_prediction_tokens_rejected_total": 0}
        assert "prediction" not in logs[-1], logs[-1]
        body = dict(model="tiny", messages=conv, max_tokens=48, prediction={"type": "content", "content": _edited(
            answer)})
        d = client.chat.completions.create(**body).usage.completion_tokens_details
        assert f"prediction {d.accepted_prediction_tokens} accepted {d.rejected_prediction_tokens} rejected" in \
            logs[-1], logs[-1]
        chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
        s = chunks[-1].usage.completion_tokens_details
        assert d.accepted_prediction_tokens > 0 and d.rejected_prediction_tokens > 0, d
        assert counted(url) == {
            "specrt_prediction_tokens_accepted_total": d.accepted_prediction_tokens + s.accepted_prediction_tokens,
            "specrt_prediction_tokens_rejected_total": d.rejected_prediction_tokens + s.rejected_prediction_tokens}
