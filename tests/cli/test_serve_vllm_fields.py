"""`specrt serve`'s vLLM sampling fields (h79d): allowed_token_ids (the answer's tokens held to a
set, through the grammar's masked verify: lossless against target-only decoding, a grammar's
mask and theirs both held), truncate_prompt_tokens / truncation_side (the tokenized prompt cut,
a chat's after its template) and prompt_logprobs (each prompt token's logprob, rank and most
likely alternatives, as vLLM gives them: on a completion's choices, beside a chat's).

Real engines: tests/runtime/test_grammar.py's tiny Llama with a byte-level BPE tokenizer and a
random P-EAGLE draft (context 256), served target-only ("off") and speculatively (fixed:2 with
prompt lookup); prompt logprobs checked against transformers' model on the same checkpoint."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llguidance")
torch = pytest.importorskip("torch")

from tests.cli.test_serve import _in_process, _post  # noqa: E402
from tests.runtime.test_grammar import REGEX, guided_engines  # noqa: E402

ASK = [{"role": "user", "content": "paint it"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{"off": (url, app), "spec": (url, app)} on guided_engines, and the engines' folder."""
    engines = guided_engines(tmp_path_factory.mktemp("vllm_fields"))
    with _in_process(engines, "off") as (off, _, off_url, _):
        with _in_process(engines, "fixed:2:ngram") as (spec, _, spec_url, _):
            yield {"off": (off_url, off), "spec": (spec_url, spec)}, engines


def _answer(server, path: str, body: dict) -> tuple[dict, list[int]]:
    """The answer (200 asserted) and its output token ids (the session's, in process)."""
    url, app = server
    status, r = _post(url, path, body)
    assert status == 200, r
    return r, list(app.session.last_output_ids)


def _ids(app, text: str) -> list[int]:
    return app.session.text.tokenizer.encode(text, add_special_tokens=False).ids


def test_allowed_token_ids_hold_the_answer_losslessly(servers):
    """allowed_token_ids: every output token is one of them (the EOS not among them: the answer runs
    to max_tokens), where the free answer starts with another; the speculative server's greedy
    output equals the target-only one token for token, on completions and chats. Fails without
    the feature (a 400: not supported)."""
    s, _ = servers
    app = s["off"][1]
    free = _answer(s["off"], "/v1/completions", {"prompt": "abc-123", "max_tokens": 12, "temperature": 0})[1]
    allowed = sorted({i for w in ("x", "y", "z", " xyz", "7", " 7", "abc") for i in _ids(app, w)} - {free[0]})
    assert free[0] not in allowed and len(allowed) >= 5
    for path, body in (("/v1/completions", {"prompt": "abc-123"}), ("/v1/chat/completions", {"messages": ASK})):
        body = {**body, "max_tokens": 24, "temperature": 0, "allowed_token_ids": allowed}
        r, got = _answer(s["off"], path, body)
        assert len(got) == 24 and set(got) <= set(allowed), got
        assert r["choices"][0]["finish_reason"] == "length"
        r2, spec = _answer(s["spec"], path, body)
        assert spec == got and r2["choices"][0] == r["choices"][0]
        # (drafts were verified against the masked rows: some refused; ngram's accepted on the completion)
        assert r2["specrt"]["rejections"]["rounds"] > 0 and r["specrt"]["governor"] == "off"
        assert r2["specrt"]["tokens_per_call"] > 1 or path != "/v1/completions"
    # the EOS among them: the answer may end (its text the allowed tokens' alone)
    eos = app.session.eos[0]
    r, got = _answer(s["spec"], "/v1/completions", {"prompt": "abc-123", "max_tokens": 24, "temperature": 0,
                                                    "allowed_token_ids": allowed + [eos]})
    assert set(got) <= set(allowed) | {eos}
    assert _answer(s["off"], "/v1/completions", {"prompt": "abc-123", "max_tokens": 24, "temperature": 0,
                                                 "allowed_token_ids": allowed + [eos]})[1] == got


def test_allowed_token_ids_and_a_grammar_hold_both(servers):
    """allowed_token_ids beside guided_regex (vLLM applies both): the text matches the regex and its
    tokens are among the ids, the same from both servers; ids the grammar can start none of: a 400
    naming the grammar's field, saying the allowed ids."""
    s, _ = servers
    app = s["off"][1]
    body = {"prompt": "hello", "max_tokens": 30, "temperature": 0, "guided_regex": REGEX}
    free = _answer(s["off"], "/v1/completions", body)[1]  # (the grammar alone)
    allowed = sorted({i for c in "0123456789-abcdefghijklmnopqrstuvwxyz" for i in _ids(app, c)} - {free[0]})
    body["allowed_token_ids"] = allowed
    r, got = _answer(s["off"], "/v1/completions", body)
    assert re.fullmatch(REGEX, r["choices"][0]["text"]) and set(got) <= set(allowed), (r, got)
    assert got[0] != free[0]
    assert _answer(s["spec"], "/v1/completions", body)[1] == got
    status, err = _post(s["spec"][0], "/v1/completions", {**body, "allowed_token_ids": _ids(app, "x")})
    assert status == 400 and err["error"]["param"] == "guided_regex", err
    assert "none of the 1 allowed token ids can continue the answer 0 token(s) in" in err["error"]["message"]


@pytest.mark.parametrize("value, words", [
    (lambda v: [], "a non-empty list of token ids"), (lambda v: "1 2", "a non-empty list"),
    (lambda v: [3, True], "a non-empty list"), (lambda v: [5, 1.5], "a non-empty list"),
    (lambda v: [5, v], "{v} is not a token id of the model's vocabulary (0 to {last})"),
    (lambda v: [-1], "-1 is not a token id")])
def test_a_bad_allowed_token_ids_is_a_400_naming_it(servers, value, words):
    """Ids past the model's vocabulary (its logits' width), none, or not ids: a 400 naming the field."""
    s, _ = servers
    vocab = s["off"][1].session.generator.vocab
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": ASK})):
        status, err = _post(s["off"][0], path, {**body, "allowed_token_ids": value(vocab)})
        assert status == 400 and err["error"]["param"] == "allowed_token_ids", err
        assert words.format(v=vocab, last=vocab - 1) in err["error"]["message"]


def test_truncate_prompt_tokens_keeps_the_tokenized_prompts_last_tokens(servers):
    """truncate_prompt_tokens k: the answer is the one to the prompt's last k tokens (usage counts
    k; echo gives their text), a chat's templated prompt cut after its template; -1 serves a prompt
    past the context (else a 400) with max_tokens' room left; truncation_side "right" keeps the
    first k. Fails without the feature (a 400: not supported)."""
    s, _ = servers
    url, app = s["spec"]
    ids = _ids(app, "abc-123 xyz 7 yes no maybe " * 2)
    assert len(ids) > 12
    r, got = _answer(s["spec"], "/v1/completions", {"prompt": ids, "max_tokens": 6, "temperature": 0,
                                                    "truncate_prompt_tokens": 9})
    assert r["usage"]["prompt_tokens"] == 9 and app.session.last_prompt_ids == ids[-9:]
    assert _answer(s["off"], "/v1/completions", {"prompt": ids[-9:], "max_tokens": 6, "temperature": 0})[1] == got
    text = "abc-123 xyz 7 yes no maybe"
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0, "echo": True,
                                                  "truncate_prompt_tokens": 4})
    assert r["choices"][0]["text"].startswith(app.session.text.decode(_ids(app, text)[-4:]))
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0,
                                                  "truncate_prompt_tokens": 5, "truncation_side": "right"})
    assert app.session.last_prompt_ids == ids[:5]
    # a chat: the template's text, then cut (its role line's start gone)
    chat = [{"role": "user", "content": text}]
    r, got = _answer(s["spec"], "/v1/chat/completions", {"messages": chat, "max_tokens": 5, "temperature": 0,
                                                         "truncate_prompt_tokens": 6})
    whole = _post(url, "/tokenize", {"messages": chat})[1]["tokens"]
    assert len(whole) > 6 and app.session.last_prompt_ids == whole[-6:] and r["usage"]["prompt_tokens"] == 6
    # past the context: refused, or cut to what max_tokens leaves (-1)
    long = (ids * 30)[:300]
    status, err = _post(url, "/v1/completions", {"prompt": long, "max_tokens": 4})
    assert status == 400 and "context" in err["error"]["message"]
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": long, "max_tokens": 4, "truncate_prompt_tokens": -1})
    assert r["usage"]["prompt_tokens"] == 256 - 4 and app.session.last_prompt_ids == long[-252:]


@pytest.mark.parametrize("body, param, words", [
    ({"truncate_prompt_tokens": 253, "max_tokens": 4}, "truncate_prompt_tokens",
     "truncate_prompt_tokens=253 cannot be greater than max_model_len - max_tokens = 256 - 4 = 252"),
    ({"truncate_prompt_tokens": 256}, "truncate_prompt_tokens", "max_model_len - 1 (a token of answer) = 256 - 1"),
    ({"truncate_prompt_tokens": 5, "max_tokens": 256}, "max_tokens", "'max_tokens' 256 leaves no room in the "
                                                                      "model's context of 256 tokens for a prompt"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1 (as many as the context leaves) or >= 1; got 0"),
    ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "an integer >= -1"),
    ({"truncate_prompt_tokens": "5"}, "truncate_prompt_tokens", "an integer"),
    ({"truncate_prompt_tokens": 5, "truncation_side": "middle"}, "truncation_side", "'left' or 'right'"),
    ({"prompt_logprobs": -1}, "prompt_logprobs", "-1 (every token of the vocabulary) is not supported"),
    ({"prompt_logprobs": 21}, "prompt_logprobs", "<= 20"),
    ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available when 'stream' is true")])
def test_bad_truncation_and_prompt_logprobs_are_400s_naming_them(servers, body, param, words):
    s, _ = servers
    for path, base in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": ASK})):
        status, err = _post(s["off"][0], path, {**base, **body})
        assert status == 400 and err["error"]["param"] == param, err
        assert words in err["error"]["message"], err


def _hf_rows(engines, ids: list[int]) -> np.ndarray:
    """transformers' log_softmax of the checkpoint's logits over ``ids`` [len(ids), V] (float64)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engines.parent / "t", torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def _check_scored(plps: list, ids: list[int], rows: np.ndarray, n: int, decode) -> None:
    """vLLM's prompt_logprobs of ``ids``: None first, then each token's own entry first (its logprob
    and rank as transformers' rows give them) and the n most likely (ranks 1..n)."""
    assert plps[0] is None and len(plps) == len(ids)
    for j in range(1, len(ids)):
        row, t, d = rows[j - 1], ids[j], plps[j]
        keys = [int(k) for k in d]
        assert keys[0] == t, (j, keys)
        assert abs(d[str(t)]["logprob"] - row[t]) < 2e-4
        top = [int(i) for i in np.argsort(-row, kind="stable")[:n]]
        assert set(keys) == {t, *top}, (j, keys, top)
        for r, k in enumerate(top, 1):
            assert d[str(k)]["rank"] == r and abs(d[str(k)]["logprob"] - row[k]) < 2e-4
            assert d[str(k)]["decoded_token"] == decode(k)
        assert d[str(t)]["rank"] == int((row >= row[t] - 1e-6).sum())
        assert len(d) == n + (t not in top)


def test_prompt_logprobs_are_the_targets_own_on_completions_and_chats(servers):
    """prompt_logprobs n: a completion's choices each carry the prompt's (the same for its n choices,
    the prompt scored once), a chat's are beside its choices over the templated prompt; each token's
    logprob and rank and the n most likely are transformers' on the checkpoint; the same prompt
    again (its rows reusable) is scored whole again; the answer is the one without them. Fails
    without the feature (a 400: not supported)."""
    s, engines = servers
    url, app = s["spec"]
    token = app.session.text.token_text
    text = "abc-123 xyz 7 yes no"
    ids = _ids(app, text)
    rows = _hf_rows(engines, ids)
    plain = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 5, "temperature": 0})[0]
    for _ in range(2):  # (the second: its rows are there to reuse, and are scored again)
        r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 5, "temperature": 0, "n": 2,
                                                      "prompt_logprobs": 2})
        assert [c["text"] for c in r["choices"]] == [plain["choices"][0]["text"]] * 2
        assert r["choices"][0]["prompt_logprobs"] == r["choices"][1]["prompt_logprobs"]
        _check_scored(r["choices"][0]["prompt_logprobs"], ids, rows, 2, token)
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 2, "prompt_logprobs": 0})
    _check_scored(r["choices"][0]["prompt_logprobs"], ids, rows, 0, token)
    assert "prompt_logprobs" not in plain["choices"][0]
    # echo with logprobs 1 beside prompt_logprobs 3: the echo's alternatives are its own 1
    r, _ = _answer(s["spec"], "/v1/completions", {"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 1,
                                                  "prompt_logprobs": 3})
    _check_scored(r["choices"][0]["prompt_logprobs"], ids, rows, 3, token)
    assert all(t is None or len(t) <= 2 for t in r["choices"][0]["logprobs"]["top_logprobs"])
    # a chat: beside its choices, over the template's tokens
    r, _ = _answer(s["spec"], "/v1/chat/completions", {"messages": ASK, "max_tokens": 3, "prompt_logprobs": 1,
                                                       "logprobs": True})
    chat_ids = list(app.session.last_prompt_ids)
    assert "prompt_logprobs" not in r["choices"][0] and r["choices"][0]["logprobs"]["content"]
    _check_scored(r["prompt_logprobs"], chat_ids, _hf_rows(engines, chat_ids), 1, token)
    # streamed: 0 asks for nothing to give (vLLM's), the stream as without it
    status, chunks = _post(url, "/v1/completions", {"prompt": text, "max_tokens": 5, "stream": True,
                                                    "prompt_logprobs": 0, "temperature": 0})
    assert status == 200 and "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == \
        plain["choices"][0]["text"]
