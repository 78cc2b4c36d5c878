"""specrt serve: edge cases a mutation round of specrt/cmd_serve.py found unpinned (session 56: each test
fails on its mutant, passes on the code)."""
from __future__ import annotations

from tests.cli.test_serve import _post, served  # noqa: F401
from tests.runtime.test_text import worded  # noqa: F401


def test_max_completion_tokens_wins_over_max_tokens(served):  # noqa: F811
    """S05: OpenAI deprecates max_tokens for max_completion_tokens and vLLM reads
    ``max_completion_tokens or max_tokens``: with both given, max_completion_tokens counts."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w3 w1 w4 w1 w5"}],
                                                  "max_tokens": 2, "max_completion_tokens": 5})
    assert code == 200 and r["usage"]["completion_tokens"] == 5, r
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w3 w1 w4 w1 w5"}],
                                                  "max_tokens": 5, "max_completion_tokens": 2})
    assert code == 200 and r["usage"]["completion_tokens"] == 2, r


def test_a_fifth_stop_string_is_refused(served):  # noqa: F811
    """S06: OpenAI's and this server's docs: up to 4 stop sequences; 4 are taken, 5 a 400."""
    url, _ = served
    msg = [{"role": "user", "content": "w1"}]
    code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2, "stop": ["w9", "w10", "w11", "w12"]})
    assert code == 200, r
    code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2,
                                                  "stop": ["w9", "w10", "w11", "w12", "w13"]})
    assert code == 400 and r["error"]["param"] == "stop", r


def test_chat_logprobs_true_without_top_logprobs_gives_each_tokens_logprob(served):  # noqa: F811
    """S08: ``logprobs: true`` alone (OpenAI's top_logprobs defaults to none) answers each
    token's logprob with an empty top_logprobs list, not ``logprobs: null``."""
    url, _ = served
    msg = [{"role": "user", "content": "w1 w4"}]
    code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 3, "logprobs": True})
    assert code == 200, r
    lp = r["choices"][0]["logprobs"]
    assert lp is not None and lp["refusal"] is None, r
    assert len(lp["content"]) == r["usage"]["completion_tokens"] and lp["content"], lp
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in lp["content"]), lp
    code, ev = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 3, "logprobs": True,
                                                   "stream": True})
    got = [x for e in ev for c in e["choices"] if c.get("logprobs") for x in c["logprobs"]["content"]]
    assert [e["token"] for e in got] == [e["token"] for e in lp["content"]], ev


def test_a_histogram_bucket_holds_the_observations_equal_to_its_bound():
    """S15: Prometheus' ``le`` is "less than or equal": 0.5 s counts in le="0.5"."""
    from specrt.cmd_serve import Metrics

    m = Metrics()
    m.observe("request_seconds", 0.5)
    m.observe("request_seconds", 60.0)
    text = m.render()
    assert 'specrt_request_seconds_bucket{le="0.25"} 0\n' in text
    assert 'specrt_request_seconds_bucket{le="0.5"} 1\n' in text
    assert 'specrt_request_seconds_bucket{le="60.0"} 2\n' in text
    assert 'specrt_request_seconds_bucket{le="+Inf"} 2\n' in text and "specrt_request_seconds_count 2\n" in text


def test_a_body_past_max_body_is_a_413(served):  # noqa: F811
    """S25: a Content-Length past MAX_BODY: 413 Payload Too Large (its body unread), not 400;
    a zero Content-Length stays a 400."""
    from specrt.cmd_serve import MAX_BODY
    from tests.cli.test_serve import _raw

    url, _ = served
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    out = _raw(url, (head + f"Content-Length: {MAX_BODY + 1}\r\n\r\n").encode() + b"{")
    assert out.startswith(b"HTTP/1.0 413") and b"expected a JSON body of 1 to" in out, out[:200]
    out = _raw(url, (head + "Content-Length: 0\r\n\r\n").encode())
    assert out.startswith(b"HTTP/1.0 400"), out[:200]


def test_an_engine_failure_is_a_500_server_error(worded):  # noqa: F811
    """S26: a failure inside the engines answers 500 with OpenAI's type server_error (not
    invalid_request_error), and the server goes on."""
    import threading

    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams

    app = Server(worded, "fixed:3", SamplingParams(), 8, "tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    real = app.session.stream

    def broken(*a, **k):
        raise RuntimeError("engine on fire")

    try:
        app.session.stream = broken
        code, r = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 2})
        assert code == 500 and r["error"]["type"] == "server_error" and "engine on fire" in r["error"]["message"], r
        app.session.stream = real
        assert _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 2})[0] == 200
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def test_a_neutral_fields_value_of_another_type_is_refused(served):  # noqa: F811
    """S30: true is not best_of 1 and false is not a penalty of 0 (Python's True == 1):
    refused, as OpenAI's schema refuses a boolean for a number."""
    url, _ = served
    msg = [{"role": "user", "content": "w1"}]
    for field, value in (("best_of", True), ("frequency_penalty", False), ("min_tokens", False)):
        code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2, field: value})
        assert code == 400 and r["error"]["param"] == field, (field, r)
    assert _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2, "best_of": 1})[0] == 200


def test_an_empty_prompt_among_several_is_refused_before_anything_runs(served):  # noqa: F811
    """S31: prompt [[1, 2], []] is a 400 naming 'prompt' before any choice is decoded; streamed,
    no 200 whose first choice ran and whose second is an error event."""
    url, _ = served
    for stream in (False, True):
        code, r = _post(url, "/v1/completions", {"prompt": [[1, 2], []], "max_tokens": 2, "stream": stream})
        assert code == 400 and r["error"]["param"] == "prompt", (stream, code, r)


def test_every_streamed_chat_choice_starts_with_its_role(served):  # noqa: F811
    """S41: streamed chat with n 2: each choice's first chunk is its delta {role: assistant,
    content: ""} (OpenAI's), not choice 0's alone."""
    url, _ = served
    code, ev = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 3,
                                                   "n": 2, "stream": True, "temperature": 1.0, "seed": 1})
    assert code == 200, ev
    for i in (0, 1):
        mine = [e["choices"][0] for e in ev if e["choices"] and e["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}, (i, mine[0])
        assert all("role" not in c["delta"] for c in mine[1:]), (i, mine)
