"""Tests written for session 79's mutation round (m79g): each kills a mutant of serve's new code
(h79d's truncate_prompt_tokens and prompt_logprobs, h79b's Responses store) that the tests beside
it let live. Real engines and servers: test_serve_vllm_fields.py's (tests/runtime/test_grammar.py's
tiny Llama, context 256, served by the default of 8 new tokens); the store's own rules on
specrt.responses itself."""

from __future__ import annotations

import pytest

from specrt import responses
from tests.cli.test_serve import _in_process
from tests.runtime.test_text import worded  # noqa: F401  (fixture: word-level tiny pair)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """test_serve_vllm_fields.py's speculative server alone: {"spec": (url, app)}."""
    pytest.importorskip("llguidance")
    pytest.importorskip("torch")
    from tests.runtime.test_grammar import guided_engines

    engines = guided_engines(tmp_path_factory.mktemp("mutants79"))
    with _in_process(engines, "fixed:2:ngram") as (app, _, url, _):
        yield {"spec": (url, app)}, engines


def _answer(server, path: str, body: dict):
    from tests.cli.test_serve_vllm_fields import _answer

    return _answer(server, path, body)


def _ids(app, text: str) -> list[int]:
    return app.session.text.tokenizer.encode(text, add_special_tokens=False).ids


def test_truncate_minus_one_without_max_tokens_leaves_the_servers_default_room(servers):
    """truncate_prompt_tokens -1 without max_tokens: the prompt cut to the context less the
    server's default answer length (8 here: 248 tokens), not less one token; a default past the
    context leaves one prompt token (the answer is cut to the rest). k equal to the room
    max_tokens leaves is taken (k past it is the 400)."""
    s, _ = servers
    url, app = s["spec"]
    long = (_ids(app, "abc-123 xyz 7 yes no maybe ") * 40)[:300]
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": long, "truncate_prompt_tokens": -1})
    assert app.max_new_tokens == 8 and r["usage"]["prompt_tokens"] == 256 - 8, r["usage"]
    assert app.session.last_prompt_ids == long[-248:]
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": long, "max_tokens": 4, "truncate_prompt_tokens": 252})
    assert r["usage"]["prompt_tokens"] == 252 and app.session.last_prompt_ids == long[-252:]
    app.max_new_tokens = 300
    try:
        r, _ = _answer(s["spec"], "/v1/completions", {"prompt": long, "truncate_prompt_tokens": -1,
                                                      "temperature": 0})
        assert r["usage"]["prompt_tokens"] == 1 and app.session.last_prompt_ids == long[-1:], r["usage"]
    finally:
        app.max_new_tokens = 8


def test_echo_logprobs_past_prompt_logprobs_keep_their_own_count(servers):
    """echo with logprobs 3 beside prompt_logprobs 1: the prompt scored for the larger (the echo's
    3 alternatives a token, the token itself beside them), prompt_logprobs cut to its own 1 (the
    token's own entry and its most likely one)."""
    s, _ = servers
    text = "abc-123 xyz 7 yes no"
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 3,
                                                  "prompt_logprobs": 1})
    tops = r["choices"][0]["logprobs"]["top_logprobs"]
    assert tops[0] is None and all(3 <= len(t) <= 4 for t in tops[1:]), tops  # (the token itself added)
    scored = r["choices"][0]["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(tops)
    assert all(1 <= len(d) <= 2 and sorted(v["rank"] for v in d.values())[0] == 1 for d in scored[1:]), scored


def _kept(rid: str, items: list[dict]) -> dict:
    """A kept response of ``items`` as input and no output (what Store.put is given)."""
    return {"id": rid, "output": []}, items


def test_an_item_id_two_kept_responses_hold_is_the_latest_ones():
    """Store.items: an id in two of an owner's kept responses (a client's own "msg_1" sent twice)
    names the most recent response's item, and another owner's items are not among them."""
    store = responses.Store(8, scoped=True)
    for rid, text, owner in (("resp_1", "old", "a"), ("resp_2", "new", "a"), ("resp_3", "theirs", "b")):
        store.put(*_kept(rid, [{"type": "message", "role": "user", "content": text, "id": "msg_1"}]), owner)
    assert store.items("a")["msg_1"]["content"] == "new"
    assert store.items("b")["msg_1"]["content"] == "theirs"


def test_a_store_pops_its_owners_response_alone():
    """Store.pop under --isolate-clients: another owner's pop finds nothing and leaves it kept."""
    store = responses.Store(8, scoped=True)
    store.put(*_kept("resp_1", []), "a")
    assert store.pop("resp_1", "b") is None and store.get("resp_1", "a") is not None
    assert store.pop("resp_1", "a") is not None and store.get("resp_1", "a") is None


def test_a_message_with_an_id_and_a_role_is_no_item_reference():
    """An input item with a role (an easy input message, which may carry an id) is a message,
    not an item_reference, though it has no type: it is not looked up (none is kept here)."""
    body = {"input": [{"role": "user", "content": "w4 w6", "id": "msg_mine"}]}
    items = responses.context(body, responses.Store(8))
    assert items[0]["content"] == "w4 w6" and items[0]["id"] == "msg_mine"


def test_runs_closing_line_says_lookup_and_prediction_rounds_apart(worded, tmp_path):  # noqa: F811
    """`specrt run --prediction` under a governor with prompt lookup: the closing line says prompt
    lookup's rounds and tokens a round without the prediction's rounds (their own words, their
    counts --stats' 'prediction')."""
    import json
    import re

    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.runtime.prediction import KEYS

    args = ["run", str(worded), "--prompt", "w4 w6 w7", "--max-new-tokens", "60", "--governor", "fixed:3:ngram"]
    plain = CliRunner().invoke(main, args)
    assert plain.exit_code == 0, plain.output
    words = plain.stdout.split()
    (tmp_path / "p.txt").write_text(" ".join(words[:20]))
    r = CliRunner().invoke(main, args + ["--prediction", str(tmp_path / "p.txt"), "--stats", str(tmp_path / "s.json")])
    assert r.exit_code == 0 and r.stdout.split() == words, r.output
    st = json.loads((tmp_path / "s.json").read_text())["prompts"][0]
    lk, pred = st["lookup"], st["prediction"]
    looked = [c for k, c in lk["by_match"].items() if int(k) not in KEYS]
    rounds = sum(c["rounds"] for c in looked)
    assert pred["prediction_rounds"] >= 1 and rounds >= 1 and rounds + pred["prediction_rounds"] == lk["rounds"], lk
    said = re.search(r"prompt lookup in (\d+) rounds?, ([0-9.]+) tokens a round, the prediction in (\d+) rounds?: "
                     r"(\d+) of its tokens accepted, (\d+) rejected", r.stderr)
    assert said, r.stderr
    assert int(said[1]) == rounds and said[2] == f"{1 + sum(c['accepted'] for c in looked) / rounds:.2f}", r.stderr
    assert [int(said[k]) for k in (3, 4, 5)] == [pred["prediction_rounds"], pred["accepted_prediction_tokens"],
                                                 pred["rejected_prediction_tokens"]]


def test_prompt_logprobs_zero_are_given_on_a_chat_too(servers):
    """prompt_logprobs 0 on a chat: its prompt's entries beside its choices (each token's own
    logprob and rank, no alternatives), as on a completion's choices; none asked, none given."""
    s, _ = servers
    r, _ = _answer(s["spec"], "/v1/chat/completions", {"messages": [{"role": "user", "content": "paint it"}],
                                                       "max_tokens": 2, "prompt_logprobs": 0})
    url, app = s["spec"]
    ids = list(app.session.last_prompt_ids)
    scored = r["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(ids) > 2, r
    assert all(list(d) == [str(t)] and d[str(t)]["rank"] >= 1 for d, t in zip(scored[1:], ids[1:])), scored
    r, _ = _answer(s["spec"], "/v1/chat/completions", {"messages": [{"role": "user", "content": "paint it"}],
                                                       "max_tokens": 2})
    assert "prompt_logprobs" not in r


def test_an_empty_prediction_is_answered_and_counted_as_none_accepted(worded):  # noqa: F811
    """A prediction of empty text (no tokens to propose): the answer as without one, its usage
    counting no prediction token accepted or rejected (details given: the request had one)."""
    pytest.importorskip("openai")
    from tests.cli.test_serve_prediction import CONVS, _serving

    with _serving(worded, "fixed:3") as client:
        plain = client.chat.completions.create(model="tiny", messages=CONVS[0], max_tokens=12, temperature=0)
        r = client.chat.completions.create(model="tiny", messages=CONVS[0], max_tokens=12, temperature=0,
                                           prediction={"type": "content", "content": ""})
        assert r.choices[0].message.content == plain.choices[0].message.content
        d = r.usage.completion_tokens_details
        assert d.accepted_prediction_tokens == d.rejected_prediction_tokens == 0, r.usage
        extra = r.model_extra["specrt"]["prediction"]
        assert extra["tokens"] == 0 and extra["rounds"] == 0, extra



def test_a_text_prompt_past_the_context_is_cut_not_refused(servers):
    """truncate_prompt_tokens on a text prompt (and a chat's) longer than the context: the tokenized
    prompt cut to its last k tokens, not refused for its length before the cut."""
    s, _ = servers
    url, app = s["spec"]
    text = "abc-123 xyz 7 yes no maybe " * 400  # (past the context before it is tokenized: Text.least_tokens)
    assert len(_ids(app, text)) > 256
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 3, "truncate_prompt_tokens": 20})
    assert r["usage"]["prompt_tokens"] == 20 and app.session.last_prompt_ids == _ids(app, text)[-20:]
    r, _ = _answer(s["spec"], "/v1/chat/completions", {"messages": [{"role": "user", "content": text}],
                                                       "max_tokens": 3, "truncate_prompt_tokens": 20})
    assert r["usage"]["prompt_tokens"] == 20


def test_structured_outputs_options_alone_are_a_400(servers):
    """structured_outputs holding options alone (disable_fallback), with no structured output
    asked for anywhere in the request: a 400 naming structured_outputs, not a request answered free."""
    from tests.cli.test_serve import _post

    s, _ = servers
    status, err = _post(s["spec"][0], "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                          "structured_outputs": {"disable_fallback": True}})
    assert status == 400 and err["error"]["param"] == "structured_outputs", err
    assert "must be an object of one of" in err["error"]["message"], err


def test_disable_any_whitespace_beside_a_regex_is_taken(servers):
    """structured_outputs' disable_any_whitespace (vLLM's server option: its JSON's) beside a
    guided_regex: the regex holds the answer, the option changes nothing there (no 400)."""
    import re

    from tests.runtime.test_grammar import REGEX

    s, _ = servers
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": "hello", "max_tokens": 30, "temperature": 0,
                                                  "guided_regex": REGEX,
                                                  "structured_outputs": {"disable_any_whitespace": True}})
    assert re.fullmatch(REGEX, r["choices"][0]["text"]), r
