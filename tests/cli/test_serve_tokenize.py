"""`specrt serve`'s vLLM endpoints beside the OpenAI ones (h75j): POST /tokenize and
/detokenize (the tokenizer and the chat template alone, no engines' lock), GET /version and
/ping, over real HTTP against real tiny engines (the word-level pair: "w0" .. "w15", its chat
template "w3 system", "w1 user", "w2" the assistant's turn, a variable ``cue`` after it)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from specrt.runtime.sampling import SamplingParams
from tests.cli.test_serve import _get, _post, _request_counts
from tests.runtime.test_text import worded  # noqa: F401

ASK = [{"role": "user", "content": "w4 w5"}]


@contextlib.contextmanager
def _server(engines, api_key: str | None = None):
    """A server of ``engines`` (model "tiny") in a thread: (its Server, its URL)."""
    from specrt.cmd_serve import Server, make_server

    app = Server(engines, "fixed:3", SamplingParams(), 8, "tiny", log=lambda s: None)
    app.api_key = api_key
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield app, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


@pytest.fixture(scope="module")
def app_url(worded):  # noqa: F811
    with _server(worded) as served:
        yield served


def _call(url: str, method: str, path: str, body=None, key: str | None = None) -> tuple[int, bytes, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def test_tokenize_and_detokenize_answer_as_vllms_do(app_url, worded):  # noqa: F811
    """vLLM's /tokenize: a text prompt's ids as the tokenizer gives them, a conversation's as
    a chat request's prompt (the template, its variables, add_generation_prompt false leaving
    the assistant's turn out), the count, the context and on request each token's piece;
    /detokenize gives the text back (a chat's with its template's words). They were 404s: a
    client written for vLLM (token counting before a request, a prompt's ids to its text) had
    no way to ask."""
    from specrt.runtime.session import Session

    app, url = app_url
    assert _post(url, "/tokenize", {"prompt": "w4 w5 w6"}) == \
        (200, {"count": 3, "max_model_len": 128, "tokens": [4, 5, 6], "token_strs": None})
    code, r = _post(url, "/tokenize", {"prompt": "w4 w5 w6", "return_token_strs": True, "model": "tiny"})
    assert code == 200 and r["token_strs"] == ["w4", "w5", "w6"], r
    with Session(worded, governor="off") as s:
        want = s.encode(ASK, True)
        cued = s.encode(ASK, True, {"cue": "w7"})
    code, r = _post(url, "/tokenize", {"messages": ASK})
    assert code == 200 and r["tokens"] == want == [1, 4, 5, 2] and r["count"] == 4, r
    assert _post(url, "/tokenize", {"messages": ASK, "chat_template_kwargs": {"cue": "w7"}})[1]["tokens"] == cued
    assert _post(url, "/tokenize", {"messages": ASK, "add_generation_prompt": False})[1]["tokens"] == [1, 4, 5]
    assert _post(url, "/detokenize", {"tokens": want}) == (200, {"prompt": "w1 w4 w5 w2"})
    assert _post(url, "/detokenize", {"tokens": []}) == (200, {"prompt": ""})
    # another model's name (the server's --model-name): 404, as a completion's
    code, r = _post(url, "/tokenize", {"prompt": "w4", "model": "other"})
    assert code == 404 and r["error"]["code"] == "model_not_found" and r["error"]["param"] == "model", r


@pytest.mark.parametrize("path,body,param,words", [
    ("/detokenize", {"tokens": [3, 16]}, "tokens", "tokens[1]: 16 is not a token id of the tokenizer's vocabulary "
                                                   "(0 to 15)"),
    ("/detokenize", {"tokens": [-1]}, "tokens", "tokens[0]: -1"),
    ("/detokenize", {"tokens": [2 ** 64]}, "tokens", "tokens[0]"),
    ("/detokenize", {"tokens": [True]}, "tokens", "tokens[0]: True"),
    ("/detokenize", {"tokens": "w1"}, "tokens", "must be a list of token ids"),
    ("/detokenize", {"tokens": [1], "prompt": "w1"}, "prompt", "Unrecognized request argument"),
    ("/tokenize", {}, "prompt", "expected 'prompt' (a text) or 'messages'"),
    ("/tokenize", {"prompt": "w1", "messages": ASK}, "prompt", "one of them"),
    ("/tokenize", {"prompt": 5}, "prompt", "must be a string"),
    ("/tokenize", {"prompt": "w1", "add_generation_prompt": False}, "add_generation_prompt", "applies to 'messages'"),
    ("/tokenize", {"messages": []}, "messages", "non-empty list"),
    ("/tokenize", {"messages": ASK, "tools": [{"type": "function"}]}, "tools", "tools[0]"),
    ("/tokenize", {"messages": ASK, "chat_template_kwargs": {"messages": 1}}, "chat_template_kwargs", "messages"),
    ("/tokenize", {"prompt": "w1", "return_token_strs": "yes"}, "return_token_strs", "true or false"),
    ("/tokenize", {"prompt": "w1", "add_special_tokens": 1}, "add_special_tokens", "true or false"),
    ("/tokenize", {"messages": ASK, "continue_final_message": True}, "continue_final_message", "not supported"),
    ("/tokenize", {"prompt": "w1", "chat_template": "{{ x }}"}, "chat_template", "not supported"),
    ("/tokenize", {"prompt": "w1", "frob": 1}, "frob", "Unrecognized request argument supplied: frob"),
    ("/tokenize", [1], None, "must be a JSON object"),
])
def test_bad_tokenize_requests_get_400_naming_the_field(app_url, path, body, param, words):
    """Bad input to /tokenize and /detokenize: 400 with OpenAI's error object naming the field
    (an id outside the vocabulary named with its place, where the tokenizer raised or said
    nothing), as every other endpoint's; the server goes on."""
    _, url = app_url
    code, r = _post(url, path, body)
    assert code == 400 and r["error"]["param"] == param and words in r["error"]["message"], r
    assert r["error"]["type"] == "invalid_request_error"
    assert _post(url, "/tokenize", {"prompt": "w2"})[1]["tokens"] == [2]


def test_tokenizing_waits_for_no_answer_and_is_counted(app_url):
    """/tokenize and /detokenize take no engines' lock: while an answer holds the engines (the
    lock held here) they are answered at once; /metrics counts them by endpoint and status as
    the completions are counted."""
    app, url = app_url
    before = _request_counts(url)
    assert app.lock.acquire()
    try:
        assert _post(url, "/tokenize", {"prompt": "w1 w2"})[0] == 200  # (urlopen's timeout: 120 s)
        assert _post(url, "/detokenize", {"tokens": [1, 2]})[0] == 200
        assert _post(url, "/detokenize", {"tokens": [99]})[0] == 400
        assert app.metrics.waiting == 0
    finally:
        app.lock.release()
    after = _request_counts(url)
    for series in ('{endpoint="tokenize",status="200"}', '{endpoint="detokenize",status="200"}',
                   '{endpoint="detokenize",status="400"}'):
        k = "specrt_requests_total" + series
        assert after.get(k, 0) - before.get(k, 0) == 1, (k, after)


def test_version_and_ping_as_vllm_answers_them(app_url):
    """vLLM's GET /version ({"version": ...}, specrt's) and /ping (GET or POST, SageMaker's
    probe: /health's answer); each path's other methods a 405 naming what it takes (were 404s)."""
    import specrt

    _, url = app_url
    assert _get(url, "/version") == (200, {"version": specrt.__version__})
    assert _get(url, "/ping") == (200, {"status": "ok"})
    assert _post(url, "/ping", {}) == (200, {"status": "ok"})
    code, body, headers = _call(url, "HEAD", "/ping")
    assert code == 200 and body == b""
    for method, path, allow in (("PUT", "/ping", "GET, HEAD, POST"), ("GET", "/tokenize", "POST"),
                                ("DELETE", "/detokenize", "POST"), ("POST", "/version", "GET, HEAD")):
        code, body, headers = _call(url, method, path, {} if method != "GET" else None)
        assert code == 405 and headers["Allow"] == allow, (method, path, code, body)


def test_an_api_key_guards_tokenize_and_leaves_version_and_ping_open(worded):  # noqa: F811
    """With --api-key, /tokenize and /detokenize need the key as the /v1 paths do (vLLM's key
    guards /v1 only, leaving them open); /version and /ping stay open as /health does; once the
    server is stopping, a /tokenize is a 503 as a completion is."""
    with _server(worded, "s3cret") as (app, url):
        for path, body in (("/tokenize", {"prompt": "w1"}), ("/detokenize", {"tokens": [1]})):
            code, raw, _ = _call(url, "POST", path, body)
            assert code == 401 and json.loads(raw)["error"]["code"] == "invalid_api_key", (path, raw)
            assert _call(url, "POST", path, body, key="s3cret")[0] == 200
        for method, path in (("GET", "/version"), ("GET", "/ping"), ("POST", "/ping")):
            assert _call(url, method, path, {} if method == "POST" else None)[0] == 200, path
        app.stopping = True  # (as close sets it: what comes meanwhile is a 503, /ping says "stopping" as /health)
        code, raw, _ = _call(url, "POST", "/tokenize", {"prompt": "w1"}, key="s3cret")
        assert code == 503 and "shutting down" in json.loads(raw)["error"]["message"], raw
        assert _call(url, "GET", "/ping")[0] == 503


WORDS_4MB = " ".join(f"w{i % 16}" for i in range(1 << 20))  # (3.7 MB, a token a word)


def _stalled(call) -> tuple[tuple[int, dict], float, float]:
    """``call()``'s answer, its seconds, and the longest another thread (one that sleeps 1 ms
    at a time) waited meanwhile: how long the interpreter's lock was held."""
    gaps, done = [], threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=tick)
    t.start()
    t0 = time.perf_counter()
    try:
        answer = call()
    finally:
        took = time.perf_counter() - t0
        done.set()
        t.join()
    return answer, took, max(gaps)


def test_a_long_prompt_tokenized_stops_no_other_thread(app_url):
    """A long /tokenize (a 4 MB prompt) lets the interpreter's lock go while the tokenizer works
    (encode_batch; encode held it: on the demo's engines a 4 MB prompt stopped every other
    thread, an answer being made among them, for 4.8 s of the request's 5.6 s; 0.21 s now): another
    thread here waits for a small part of the request's time, not the whole of it."""
    _, url = app_url
    (code, r), took, gap = _stalled(lambda: _post(url, "/tokenize", {"prompt": WORDS_4MB}))
    assert code == 200 and r["count"] == 1 << 20 and r["tokens"][:3] == [0, 1, 2]
    print(f"[/tokenize of {len(WORDS_4MB)} bytes: {took:.2f} s, the longest another thread waited {gap:.3f} s]")
    assert gap < took / 2, (gap, took)


def test_a_long_completion_prompt_tokenized_stops_no_other_thread(app_url):
    """h75j's leftover: a completion's or chat's prompt was tokenized with ``encode``
    (Text.ids_of), which holds the interpreter's lock: a long prompt (one the context then
    refuses, where the tokenizer gives no bound to refuse it before) stopped every other
    thread, an answer being made among them, while it was tokenized. ``encode_batch`` lets
    it go, as /tokenize's (the same ids)."""
    _, url = app_url
    (code, r), took, gap = _stalled(lambda: _post(url, "/v1/completions", {"prompt": WORDS_4MB, "max_tokens": 1}))
    assert code == 400 and "context" in r["error"]["message"], r  # (tokenized, then refused)
    print(f"[a completion of {len(WORDS_4MB)} bytes refused in {took:.2f} s, the longest another thread waited "
          f"{gap:.3f} s]")
    assert gap < took / 2, (gap, took)
