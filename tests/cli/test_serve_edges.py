"""specrt serve: edge cases a mutation round of specrt/cmd_serve.py found unpinned (session 56: each test
fails on its mutant, passes on the code)."""
from __future__ import annotations

import json

from tests.cli.test_serve import _get, _post, _until_queued, served  # noqa: F401
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
    assert out.startswith(b"HTTP/1.1 413") and b"expected a JSON body of 1 to" in out, out[:200]
    out = _raw(url, (head + "Content-Length: 0\r\n\r\n").encode())
    assert out.startswith(b"HTTP/1.1 400"), out[:200]


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


# Round 6 of the mutation testing of specrt/cmd_serve.py (M6.NN: the mutant each test kills).


def test_a_boolean_is_no_count_of_tokens_choices_or_seed(served):  # noqa: F811
    """M6.04: true is not n 1, max_tokens 1 or seed 1 (Python's True == 1; OpenAI's schema
    refuses a boolean for an integer): a 400 naming the field, as for the neutral fields."""
    url, _ = served
    msg = [{"role": "user", "content": "w1"}]
    for field in ("n", "max_tokens", "seed", "top_k"):
        code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2, field: True})
        assert code == 400 and r["error"]["param"] == field, (field, r)


def test_exactly_max_choices_are_answered(served):  # noqa: F811
    """M6.06: prompts x n = 64 choices, MAX_CHOICES, is the most a request may ask for, not
    one past it: 4 prompts with n 16 are answered, 64 choices."""
    from specrt.cmd_serve import MAX_CHOICES

    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": ["w1", "w2", "w3", "w4"], "n": 16, "max_tokens": 1})
    assert code == 200 and len(r["choices"]) == MAX_CHOICES == 64, r


def test_top_logprobs_with_logprobs_false_is_refused(served):  # noqa: F811
    """M6.15: OpenAI: top_logprobs needs logprobs true; with logprobs false (not only left
    out) it is a 400 naming top_logprobs, not an answer without the logprobs asked for."""
    url, _ = served
    for top in (2, 0):  # (0 too, OpenAI's default when logprobs is true, given without it: M65.54)
        code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}],
                                                      "max_tokens": 2, "logprobs": False, "top_logprobs": top})
        assert code == 400 and r["error"]["param"] == "top_logprobs", r


def test_completions_logprobs_past_20_is_refused(served):  # noqa: F811
    """M6.17: completions' logprobs is 0 to 20 (OpenAI's and the docstring's range): 20 is
    answered (the tiny vocabulary's 16 tokens all listed), 21 is a 400 naming logprobs."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 1, "logprobs": 21})
    assert code == 400 and r["error"]["param"] == "logprobs" and "<= 20" in r["error"]["message"], r
    code, r = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 1, "logprobs": 20})
    assert code == 200 and len(r["choices"][0]["logprobs"]["top_logprobs"][0]) == 16, r


def test_stream_null_is_a_whole_answer(served):  # noqa: F811
    """M6.19: "stream": null is the field left out (as every null is): a whole JSON answer,
    not a 400 saying null is not true or false."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
                                                  "stream": None})
    assert code == 200 and r["object"] == "chat.completion", r


def test_a_json_schema_response_format_is_refused(served):  # noqa: F811
    """M6.34: a JSON schema the server cannot hold the answer to (the structured output a client
    relies on) is a 400 naming response_format, never unconstrained text: since h76a specrt holds
    answers to one, but not through a word-level tokenizer, which llguidance does not read."""
    url, _ = served
    msg = [{"role": "user", "content": "w1"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2, "response_format": fmt})
    assert code == 400 and r["error"]["param"] == "response_format", r
    assert "llguidance cannot read this tokenizer.json" in r["error"]["message"], r
    code, r = _post(url, "/v1/chat/completions", {"messages": msg, "max_tokens": 2,
                                                  "response_format": {"type": "text"}})
    assert code == 200, r


def test_a_content_part_without_the_text_type_is_refused(served):  # noqa: F811
    """M6.36: a content part is read only when its type is "text": one carrying a "text" key
    under another type, or none, is a 400 naming messages, not read as text."""
    url, _ = served
    for part in ({"text": "w1"}, {"type": "image_url", "image_url": {"url": "x"}, "text": "w1"}):
        code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": [part]}],
                                                      "max_tokens": 2})
        assert code == 400 and r["error"]["param"] == "messages" and "only text parts" in r["error"]["message"], r


def test_a_counter_past_a_million_is_rendered_in_full():
    """M6.42: a busy server's counters are written whole (1234567, not 1.23457e+06 that
    seemed to stall in Prometheus), and a fraction of seconds keeps its digits."""
    from specrt.cmd_serve import Metrics

    m = Metrics()
    m.add(completion_tokens=1234567, generation_seconds=1234.5678901)
    text = m.render()
    assert "specrt_completion_tokens_total 1234567\n" in text
    assert "specrt_generation_seconds_total 1234.5678901\n" in text


def test_a_body_of_exactly_max_body_bytes_is_read(served):  # noqa: F811
    """M6.47: MAX_BODY is the most a body may hold, not one past it: a request of exactly
    MAX_BODY bytes (JSON padded with whitespace) is answered (one more: the 413 above)."""
    from specrt.cmd_serve import MAX_BODY

    url, _ = served
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 1}).encode()
    code, r = _post(url, "/v1/completions", None, raw=body + b" " * (MAX_BODY - len(body)))
    assert code == 200 and r["usage"]["completion_tokens"] == 1, r


def test_a_write_timeout_past_an_hour_is_refused(worded):  # noqa: F811
    """M6.72: --write-timeout takes seconds > 0 and at most 3600 (its help's range; 3600 itself
    is served, test_the_command_serves_until_interrupted): 3600.5 is a user error, exit 1. (The
    address is one no socket binds: a mutant taking the value fails there, not serving for ever.)"""
    from click.testing import CliRunner

    from specrt.cli import main

    r = CliRunner().invoke(main, ["serve", str(worded), "--write-timeout", "3600.5", "--host", "256.0.0.1"])
    assert r.exit_code == 1 and "--write-timeout 3600.5: expected seconds, > 0 and at most 3600" in r.output, r.output


def test_a_prompt_with_no_room_after_an_answered_one_is_the_clients_error(worded):  # noqa: F811
    """M6.54, M6.55: a prompt past the context that only the session finds (the second of
    two, no max_tokens asked: nothing checked it before) fails after the first was decoded:
    a whole answer is a 400 invalid_request_error (the client's prompt), a stream's error
    event says invalid_request_error too, and neither counts as an engine failure."""
    import re

    from tests.cli.test_serve import _in_process

    body = {"prompt": ["w1 w2", "w1 " * 200]}
    with _in_process(worded) as (app, httpd, url, logs):
        code, r = _post(url, "/v1/completions", body)
        assert code == 400 and r["error"]["type"] == "invalid_request_error", r
        code, ev = _post(url, "/v1/completions", {**body, "stream": True})
        assert code == 200 and ev[0]["choices"][0]["index"] == 0, ev
        assert ev[-1]["error"]["type"] == "invalid_request_error" and "context" in ev[-1]["error"]["message"], ev
        metrics = app.metrics.render()
    assert re.search(r"^specrt_engine_failures_total 0$", metrics, re.M), metrics


def test_a_stream_cut_by_a_second_ctrl_c_is_no_engine_failure(worded):  # noqa: F811
    """M6.56: a stream cut by a second Ctrl-C (Server.cutting) after its first piece ends
    with its server_error event, but /metrics' engine_failures (NaN logits, engine errors:
    what an operator alerts on) does not count it, as the whole answer's 503 is not counted."""
    import re

    from tests.cli.test_serve import _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        real = app.session.stream

        def cut(*a, **k):  # cut after its first piece
            for n, piece in enumerate(real(*a, **k)):
                app.cutting = app.cutting or n == 1
                yield piece

        app.session.stream = cut
        try:
            code, ev = _post(url, "/v1/completions", {"prompt": "w3 w5 w6", "max_tokens": 40, "stream": True})
        finally:
            app.session.stream, app.cutting = real, False
        metrics = app.metrics.render()
    assert code == 200 and ev[-1]["error"]["type"] == "server_error", ev[-1]
    assert re.search(r"^specrt_engine_failures_total 0$", metrics, re.M), metrics


def test_closing_an_idle_server_says_no_answer_is_ending(worded):  # noqa: F811
    """M6.76: close() tries the engines' lock without waiting: free (no request), it closes at
    once, without telling the operator that "the request being answered ends first"."""
    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs: list[str] = []
    app = Server(worded, "fixed:3", SamplingParams(), 8, "tiny", log=logs.append)
    app.close()
    assert app.closed and not app.lock.queue and not any("stopping" in line for line in logs), logs


def test_a_streamed_completions_chunk_is_a_text_completion(served):  # noqa: F811
    """M6.77: OpenAI's (and vLLM's) streamed /v1/completions chunks have object
    "text_completion" (chat's are "chat.completion.chunk"): clients dispatch on it."""
    url, _ = served
    code, ev = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 3, "stream": True,
                                              "stream_options": {"include_usage": True}})
    assert code == 200 and ev and all(e["object"] == "text_completion" for e in ev), ev


def test_a_request_queued_before_the_stop_is_answered_503(worded):  # noqa: F811
    """M6.80: a request already waiting for the engines when close() begins is answered 503
    once it gets them (Server.close: "requests still queued are then answered 503"), not run:
    it passed the check made on arrival, before the stop."""
    import threading
    import time

    from tests.cli.test_serve import _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        app.lock.acquire()  # an answer in flight
        got = {}
        asker = threading.Thread(target=lambda: got.update(r=_post(url, "/v1/completions", {"prompt": "w1"})))
        asker.start()
        _until_queued(app)  # queued behind the answer in flight
        closer = threading.Thread(target=app.close)
        closer.start()
        deadline = time.time() + 30
        while len(app.lock.queue) < 3:  # close() waits behind it
            assert time.time() < deadline
            time.sleep(0.01)
        app.lock.release()
        asker.join(timeout=60)
        closer.join(timeout=60)
    code, r = got["r"]
    assert code == 503 and r["error"]["message"] == "the server is shutting down", (code, r)


def test_each_choice_has_its_own_finish_reason(served):  # noqa: F811
    """M6.82: choices of several prompts finish each for its own reason: a stop string met in
    one prompt's answer ("stop") and not in the other's ("length"), as each prompt alone."""
    url, _ = served
    prompts = ["w1 w2", "w6 w7"]
    texts = [_post(url, "/v1/completions", {"prompt": p, "max_tokens": 4})[1]["choices"][0]["text"] for p in prompts]
    stop = next(w for w in texts[0].split()[1:] if w not in texts[1].split())  # (greedy: the same texts again)
    alone = [_post(url, "/v1/completions", {"prompt": p, "max_tokens": 4, "stop": stop})[1]["choices"][0]
             for p in prompts]
    assert [c["finish_reason"] for c in alone] == ["stop", "length"], (stop, texts, alone)
    code, r = _post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 4, "stop": stop})
    assert code == 200 and [c["finish_reason"] for c in r["choices"]] == ["stop", "length"], r


def test_a_served_name_with_a_slash_answers_to_itself(worded):  # noqa: F811
    """M6.88: --model-name SomeOrg/Tiny (a Hugging Face id, as vLLM serves by default) is
    matched exactly: a request naming it is answered, not a 404 "does not exist" for the very
    name /v1/models lists; another org's is still a 404."""
    import threading

    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams

    app = Server(worded, "fixed:3", SamplingParams(), 8, "SomeOrg/Tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 1, "model": "SomeOrg/Tiny"})
        assert code == 200 and r["model"] == "SomeOrg/Tiny", r
        assert _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 1, "model": "Other/Tiny"})[0] == 404
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def test_a_multi_prompt_request_counts_every_prompts_reused_rows(worded):  # noqa: F811
    """`specrt.prefix_reused` of a completions request of several prompts sums what each prompt
    reused (M85 of session 60's round: the last prompt's alone survived, since prompts shorter
    than SET_ASIDE_ROWS, 32, are never set aside and so reuse nothing when another ran between).
    Two prompts of 40 tokens, asked twice: each reuses all but its last two rows the second time,
    one from the live caches and one from its snapshot."""
    from tests.cli.test_serve import _in_process

    a = " ".join(f"w{1 + i % 7}" for i in range(40))
    b = " ".join(f"w{8 + i % 7}" for i in range(40))
    with _in_process(worded) as (app, httpd, url, logs):
        got = [_post(url, "/v1/completions", {"prompt": [a, b], "max_tokens": 2}) for _ in range(2)]
    assert [code for code, _ in got] == [200, 200], got
    assert [r["specrt"]["prefix_reused"] for _, r in got] == [0, 2 * 38], got
    assert all(r["usage"]["prompt_tokens"] == 80 for _, r in got), got


# A second mutation round of specrt/cmd_serve.py (R2.Nxx: each test fails on its mutant, passes on the code).

def test_an_open_bound_is_named_as_open_in_the_400(served):  # noqa: F811
    """R2.N04: top_p must be > 0 (0 would keep no token): the 400 says "> 0.0", not ">= 0.0",
    which would tell the client the very value it sent is allowed."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "top_p": 0})
    assert code == 400 and r["error"]["param"] == "top_p", r
    assert r["error"]["message"] == "'top_p' must be a number > 0.0, <= 1.0; got 0", r


def test_an_empty_list_of_prompts_is_refused(served):  # noqa: F811
    """R2.N09: ``prompt: []`` holds no prompt: a 400 naming 'prompt', not an answer of no choices."""
    url, _ = served
    for extra in ({}, {"max_tokens": 2}):
        code, r = _post(url, "/v1/completions", {"prompt": [], **extra})
        assert code == 400 and r["error"]["param"] == "prompt", r
        assert "non-empty" in r["error"]["message"], r


def test_an_empty_or_roleless_conversation_gets_the_messages_400(served):  # noqa: F811
    """R2.N10, N11: ``messages: []`` and a message without a string role are refused by the
    request's own check, which says what a message must be (not left to the template, whose
    error names no rule, or rendered with a role of None)."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": []})
    assert code == 400 and r["error"]["param"] == "messages", r
    assert r["error"]["message"] == "'messages' must be a non-empty list of {role, content} objects", r
    for m in ({"content": "w1"}, {"role": 3, "content": "w1"}, "w1"):  # ("w1": a list of no objects, M65.20)
        code, r = _post(url, "/v1/chat/completions", {"messages": [m], "max_tokens": 2})
        assert code == 400 and r["error"]["param"] == "messages", (m, r)
        assert r["error"]["message"].startswith("messages[0]: expected an object with a string 'role'"), (m, r)


def test_echo_takes_booleans_only(served):  # noqa: F811
    """R2.N12, N78: completions' echo "yes" (or 1) is a 400 naming 'echo', as stream "false" is:
    a string that reads true was taken as echo on."""
    url, _ = served
    for v in ("yes", 1, "false"):
        code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 2, "echo": v})
        assert code == 400 and r["error"]["param"] == "echo", (v, r)
        assert r["error"]["message"] == f"'echo' must be true or false; got {v!r}", r


def test_a_seed_below_minus_one_is_refused(served):  # noqa: F811
    """R2.N15: seed -1 is vLLM's "none" and taken; -2 is no seed and no "none": a 400 naming 'seed'."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 2, "seed": -2, "temperature": 1.0})
    assert code == 400 and r["error"]["param"] == "seed" and "'seed' must be an integer >= -1" in r["error"]["message"]


def test_a_prompt_past_the_context_is_the_prompts_error_even_with_max_tokens(served):  # noqa: F811
    """R2.N25: a prompt with no room at all is the prompt's fault (the session's context error,
    param 'messages'), whether or not max_tokens is given: not a 400 telling the client to
    lower max_tokens, which no value of it would cure."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1 " * 500}],
                                                  "max_tokens": 2})
    assert code == 400 and r["error"]["param"] == "messages" and "context limit" in r["error"]["message"], r


def test_an_answer_ended_by_eos_finishes_stop(served):  # noqa: F811
    """R2.N31: OpenAI's finish_reason is "stop" for the model's own end (EOS), not only for a
    stop string: sampled choices that end before max_tokens (the tiny model samples its EOS
    often at temperature 2) say "stop", the one cut at max_tokens "length". The EOS (w2, a word
    its tokenizer does not mark special) ends the tokens listed but not the text (it ended it,
    " ... w2", as transformers' decode does: h74c)."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 60, "n": 8, "temperature": 2.0,
                                             "seed": 1, "logprobs": 0})
    assert code == 200, r
    ended = [len(c["logprobs"]["tokens"]) < 60 for c in r["choices"]]
    assert any(ended), r
    assert [c["finish_reason"] for c in r["choices"]] == ["stop" if e else "length" for e in ended], r
    for c, e in zip(r["choices"], ended):
        tokens = c["logprobs"]["tokens"]
        assert (tokens[-1] == "w2") == e and c["text"].split() == (tokens[:-1] if e else tokens), c


def test_the_text_offset_of_the_eos_that_ends_an_answer_is_the_texts_end(served):  # noqa: F811
    """h74e (h74c's leftover): the EOS that ends an answer writes no text, but a completions'
    text_offset gave one the tokenizer does not mark special (w2 here) where its text would
    start, one past the text's end (a special one got the end); the end now, streamed or not,
    with echo too, where the prompt's own w2 keeps its place in the echoed text."""
    url, _ = served
    for echo in (False, True):
        body = {"prompt": "w1 w2", "max_tokens": 60, "n": 8, "temperature": 2.0, "seed": 1, "logprobs": 0,
                "echo": echo}
        answers = []
        for stream in (False, True):
            code, r = _post(url, "/v1/completions", {**body, "stream": stream})
            assert code == 200, r
            got: dict[int, dict] = {}
            for chunk in r if stream else [r]:
                for c in chunk["choices"]:
                    a = got.setdefault(c["index"], {"text": "", "tokens": [], "offsets": []})
                    a["text"] += c["text"]
                    a["tokens"] += (c["logprobs"] or {}).get("tokens", [])
                    a["offsets"] += (c["logprobs"] or {}).get("text_offset", [])
            answers.append(got)
        assert answers[0] == answers[1], answers
        ended = [a for a in answers[0].values() if len(a["tokens"]) < 60 + 2 * echo]
        assert ended, answers
        for a in ended:
            text, tokens, offsets = a["text"], a["tokens"], a["offsets"]
            assert tokens[-1] == "w2" and offsets[-1] == len(text), a
            assert all(text[o:].startswith(t) for o, t in zip(offsets[:-1], tokens[:-1])), a
            assert not echo or (text.startswith("w1 w2") and offsets[:2] == [0, 3]), a


def test_each_choice_s_echoed_prompt_is_its_own_and_an_answer_s_eos_is_not_skipped_without_echo(served):  # noqa: F811
    """Mutants m74d-24 (every choice's echoed count taken from the first prompt's), m74d-27 (from
    the prompt of index % prompts, not index // n) and m74d-25 (a prompt's count of entries
    passed over without echo too): a batch's second prompt's own w2 (the EOS), echoed, was taken
    for the EOS that ends the answer (its offset the text before it, its text dropped from the
    next tokens' offsets); an EOS that ended an unechoed answer within its prompt's length of
    tokens got the offset past the text's end again (h74e's mend undone)."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": ["w1", "w1 w2 w1"], "max_tokens": 1, "n": 2, "echo": True,
                                             "logprobs": 0})
    assert code == 200 and len(r["choices"]) == 4, r
    for c in r["choices"]:  # (choices 2 and 3: the second prompt's, m74d-27 counted by index % prompts)
        if c["index"] >= 2:
            assert c["logprobs"]["tokens"][:3] == ["w1", "w2", "w1"] and c["text"].startswith("w1 w2 w1"), c
            assert c["logprobs"]["text_offset"][:3] == [0, 3, 6], c
    code, r = _post(url, "/v1/completions", {"prompt": " ".join(["w1"] * 30), "max_tokens": 30, "n": 8,
                                             "temperature": 2.0, "seed": 1, "logprobs": 0})
    assert code == 200, r
    ended = [c for c in r["choices"] if c["finish_reason"] == "stop"]
    assert ended, r
    for c in ended:
        assert c["logprobs"]["tokens"][-1] == "w2" and c["logprobs"]["text_offset"][-1] == len(c["text"]), c


def _metrics(url: str) -> tuple[dict[str, float], dict[str, str], bytes]:
    """GET /metrics: its samples by name, its headers and its body."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        body, headers = r.read(), dict(r.headers)
    samples = dict(line.rsplit(" ", 1) for line in body.decode().splitlines() if line and not line.startswith("#"))
    return {k: float(v) for k, v in samples.items()}, headers, body


def test_the_waiting_gauge_counts_a_request_queued_for_the_engines(worded):  # noqa: F811
    """R2.N57: specrt_requests_waiting renders the requests queued behind the answer in flight
    (what an autoscaler reads), 1 while one waits and 0 once it has been answered; with
    /metrics' Content-Length the size of its body (R2.N77: HEAD answers it without the body)."""
    import threading

    from tests.cli.test_serve import _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        app.lock.acquire()  # an answer in flight
        got = {}
        asker = threading.Thread(target=lambda: got.update(r=_post(url, "/v1/completions", {"prompt": "w1",
                                                                                           "max_tokens": 2})))
        asker.start()
        _until_queued(app)
        waiting, headers, body = _metrics(url)
        app.lock.release()
        asker.join(timeout=60)
        after, _, _ = _metrics(url)
    assert waiting["specrt_requests_waiting"] == 1 and after["specrt_requests_waiting"] == 0, (waiting, after)
    assert got["r"][0] == 200, got
    assert int(headers["Content-Length"]) == len(body), headers


def test_accepted_draft_tokens_are_fewer_than_verified_ones_where_drafts_were_rejected(worded):  # noqa: F811
    """R2.N76: specrt_draft_tokens_accepted_total counts the accepted draft tokens, not the
    verified ones: with rounds that ended at a rejected draft, fewer were accepted than put to
    the target (acceptance = accepted / verified < 1)."""
    from tests.cli.test_serve import _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        code, r = _post(url, "/v1/completions", {"prompt": "w3 w1 w4", "max_tokens": 8})
        m, _, _ = _metrics(url)
    assert code == 200 and m["specrt_draft_rejections_total"] > 0, m
    assert m["specrt_draft_tokens_accepted_total"] < m["specrt_draft_tokens_verified_total"], m


def test_a_stream_is_sent_uncached_as_server_sent_events(served):  # noqa: F811
    """R2.N47: a stream's headers say text/event-stream and Cache-Control: no-cache (what an
    SSE answer sends so that a proxy or browser neither caches nor holds it back), and its
    body is "data: ..." events ending with "data: [DONE]"."""
    import urllib.request

    url, _ = served
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps({"prompt": "w1", "max_tokens": 2,
                                                                            "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        headers, body = r.headers, r.read().decode()
    assert headers["Content-Type"] == "text/event-stream" and headers["Cache-Control"] == "no-cache", dict(headers)
    assert body.startswith("data: {") and body.endswith("\n\ndata: [DONE]\n\n"), body


def test_an_observation_past_the_last_bucket_counts_in_inf_and_the_count():
    """R2.N56: a request slower than the last bound (60 s) is in le="+Inf" alone and in
    _count (Prometheus: _count equals the +Inf bucket), its seconds in _sum."""
    from specrt.cmd_serve import Metrics

    m = Metrics()
    m.observe("request_seconds", 0.2)
    m.observe("request_seconds", 61.0)
    lines = m.render().splitlines()
    assert 'specrt_request_seconds_bucket{le="60.0"} 1' in lines and 'specrt_request_seconds_bucket{le="+Inf"} 2' \
        in lines, lines
    assert "specrt_request_seconds_count 2" in lines and "specrt_request_seconds_sum 61.2" in lines, lines


def test_top_logprobs_0_and_logprobs_0_are_taken(served):  # noqa: F811
    """R2.N69 (N70, its completions twin, was caught already): the ranges are 0-20 on both
    endpoints: chat's top_logprobs 0 (OpenAI's default) gives each token's logprob and no
    alternatives; completions' logprobs 0 the sampled token's alone."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
                                                  "logprobs": True, "top_logprobs": 0})
    assert code == 200 and all(e["top_logprobs"] == [] for e in r["choices"][0]["logprobs"]["content"]), r
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 2, "logprobs": 0})
    lp = r["choices"][0]["logprobs"]
    assert code == 200 and [list(t) for t in lp["top_logprobs"]] == [[t] for t in lp["tokens"]], r


def test_a_response_format_that_is_no_object_is_refused(served):  # noqa: F811
    """M65.15: response_format "text" (a string, not OpenAI's {"type": "text"}) is a 400 naming
    it: read as an object it raised in the request's parsing, and the client got no answer."""
    url, _ = served
    code, r = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
                                                  "response_format": "text"})
    assert code == 400 and r["error"]["param"] == "response_format", r


def test_a_text_offset_of_part_of_a_character_is_where_its_text_would_start(tmp_path):
    """M65.23: completions' text_offset of a token whose text does not end the text so far
    (part of a character, 'bytes:\\xNN') is the length of the text before it: the first
    token's is 0, not past the U+FFFD its half character decodes to."""
    from specrt.cmd_serve import _CompletionLogprobs
    from specrt.runtime.text import Text
    from tests.runtime.test_text import _byte_bpe

    tok = _byte_bpe(tmp_path)
    text = Text(tmp_path)
    ids = tok.encode("\u00e9 the").ids
    entries = [{"id": i, "token": text.token_text(i), "logprob": -1.0, "top_logprobs": None} for i in ids]
    assert [e["token"] for e in entries][:2] == ["bytes:\\xc3", "bytes:\\xa9"], entries
    got = _CompletionLogprobs(text)(entries)["text_offset"]
    whole = text.decode(ids)  # a whole token's offset: where its text starts
    assert got[0] == 0 and got[-1] == whole.rindex(entries[-1]["token"]) > 0 and got == sorted(got), got


def test_a_model_path_whose_last_part_is_the_served_name_is_taken(served):  # noqa: F811
    """M65.33: a model named by a path (vLLM serves a local folder under its path: a client written
    for it sends '/data/models/Tiny') is taken by its last part, as an 'org/name' id is, not after
    its first slash."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 1, "model": "/data/models/Tiny"})
    assert code == 200 and r["model"] == "tiny", r


def test_a_new_modes_governor_says_its_calibration_where_it_reads_one(worded):  # noqa: F811
    """M65.42: a decoding mode's first request makes its governor with that mode's calibration;
    the log line says which where the governor reads one (DSpark: here none is stored, the
    identity map; fixed:3's says none, test_completions_stop_strings_and_sampling)."""
    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs = []
    app = Server(worded, "dspark", SamplingParams(), 4, "tiny", log=logs.append)
    try:
        app._generator(SamplingParams(temperature=0.7, seed=1))
    finally:
        app.close()
    said = "a governor of its own; no calibration stored: DSpark uses the identity map"
    assert logs[-1].startswith(f"[{SamplingParams(temperature=0.7).mode}: {said}"), logs


def test_a_requests_log_line_counts_its_choices_and_says_the_last_ones_finish(served):  # noqa: F811
    """M65.68, M65.76: the log line of a request of several prompts says its choices (n is 1),
    and its finish is the last choice's, as the line has always said: sampled until two
    choices end differently (EOS is frequent at temperature 2, test_an_answer_ended_by_eos_finishes_stop)."""
    url, logs = served
    code, r = _post(url, "/v1/completions", {"prompt": ["w1", "w2"], "max_tokens": 2})
    assert code == 200 and " new in 2 choices in " in logs[-1], logs[-1]
    for seed in range(1, 40):
        code, r = _post(url, "/v1/completions", {"prompt": "w1 w2", "max_tokens": 8, "n": 2, "temperature": 2.0,
                                                 "seed": seed})
        finish = [c["finish_reason"] for c in r["choices"]]
        if finish[0] != finish[1]:
            break
    assert code == 200 and finish[0] != finish[1], finish
    assert logs[-1].endswith(f", finish {finish[1]}]"), (finish, logs[-1])


def test_the_paths_without_v1_and_with_a_trailing_slash_are_answered(served):  # noqa: F811
    """M65.78, M65.89: /chat/completions and /completions (a client whose base URL lacks /v1)
    and a path with a trailing slash are the /v1 endpoints, not a 405 or a 404."""
    url, _ = served
    chat, text = {"messages": [{"role": "user", "content": "w1"}]}, {"prompt": "w1"}
    for path, body, kind in (("/chat/completions", chat, "chat.completion"),
                             ("/v1/chat/completions/", chat, "chat.completion"),
                             ("/completions", text, "text_completion"), ("/v1/completions/", text, "text_completion")):
        code, r = _post(url, path, {**body, "max_tokens": 1})
        assert code == 200 and r["object"] == kind, (path, r)
    assert _get(url, "/v1/models/")[0] == 200 and _get(url, "/health/") == (200, {"status": "ok"})


def test_a_request_left_in_a_later_prompts_first_choice_counts_that_prompt(worded):  # noqa: F811
    """M65.73: a request of several prompts whose client leaves during the second prompt's first
    choice counts that prompt's tokens in its log line (and /metrics), as one left in the first
    prompt's does: each prompt's first choice prefills it, not only the request's first. M65.124:
    one left between two choices counts the ended one once (no choice was being decoded). (The
    second prompt's answer has text: "w3 w4 w5"'s is its EOS alone, whose text it no longer
    writes: h74c.)"""
    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs: list[str] = []
    app = Server(worded, "fixed:1", SamplingParams(), 8, "tiny", log=logs.append)
    try:
        body = {"prompt": ["w1 w2", "w3 w4 w6"], "max_tokens": 6}
        whole = list(app.complete(app.parse(body, False)))
        first = next(p["tokens"] for p in whole if "finish_reason" in p)  # choice 0's tokens
        for ended, said in ((lambda p: p.get("index") == 1 and "text" in p,
                             f"[{whole[-1]['usage']['prompt_tokens']} prompt tokens ("),
                            (lambda p: "finish_reason" in p, f" reused), {first} new in 2 choices in ")):
            pieces = app.complete(app.parse(body, False))
            for piece in pieces:
                if ended(piece):
                    break
            pieces.close()  # (the client left)
            assert "finish none: the client left" in logs[-1] and said in logs[-1], (said, logs)
    finally:
        app.close()


def test_a_model_that_is_no_string_is_answered_not_dropped(served):  # noqa: F811
    """M65.111: a request's model 5 (no name at all) names no served model: the 404 naming 'model';
    read as a string it raised in the request's parsing, and the client got no answer."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 1, "model": 5})
    assert code == 404 and r["error"]["param"] == "model" and r["error"]["code"] == "model_not_found", r


# Session 69's mutation round of specrt/cmd_serve.py (M69e.NN: the mutant each test kills).

def test_a_chunked_transfer_encoding_in_any_case_is_a_411(served):  # noqa: F811
    """M69e.M67: a header's value is case-insensitive here (RFC 9112 names "chunked" so, clients
    send "Chunked" too): read as no body it got a 400 "expected a JSON body", not the 411 saying
    to send a Content-Length."""
    from tests.cli.test_serve import _raw

    url, _ = served
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
    out = _raw(url, (head + "Transfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode())
    assert out.startswith(b"HTTP/1.1 411") and b"a chunked body is not read here" in out, out[:300]


def test_a_completions_id_is_a_cmpl_one(served):  # noqa: F811
    """M69e.M72: a completion's id starts "cmpl-" (OpenAI's and vLLM's), a chat answer's
    "chatcmpl-", whole or streamed."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 2})
    assert code == 200 and r["id"].startswith("cmpl-"), r
    code, ev = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 2, "stream": True})
    assert code == 200 and all(e["id"].startswith("cmpl-") and e["id"] == ev[0]["id"] for e in ev), ev
    code, ev = _post(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2,
                                                   "stream": True})
    assert code == 200 and all(e["id"].startswith("chatcmpl-") for e in ev), ev


def test_every_neutral_value_and_ignored_field_is_taken_and_every_field_not_done_refused(served):  # noqa: F811
    """M69e.M84-M91: each neutral value of a field specrt does not do (tool_choice none and
    auto, parallel_tool_calls either, function_call none and auto, ...) is answered as without
    it, the fields that change nothing here are ignored, and each field specrt does not do is
    refused as such ("is not supported"), not as an unknown argument."""
    url, _ = served
    msg = {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 2}
    neutral = [("tool_choice", "none"), ("tool_choice", "auto"), ("function_call", "none"),
               ("function_call", "auto"), ("parallel_tool_calls", True), ("parallel_tool_calls", False),
               ("functions", []), ("tools", []), ("spaces_between_special_tokens", True),
               ("return_tokens_as_token_ids", False), ("safety_identifier", "s"), ("request_id", "r"),
               ("prompt_cache_key", "k"), ("metadata", {"a": "b"}), ("store", True), ("service_tier", "auto"),
               ("guided_decoding_backend", "x")]  # (vLLM's backend named: llguidance here, h76a)
    for field, value in neutral:
        code, r = _post(url, "/v1/chat/completions", {**msg, field: value})
        assert code == 200 and r["usage"]["completion_tokens"] >= 1, (field, value, r)
    for field in ("reasoning_effort", "verbosity", "web_search_options", "audio", "logits_processors",
                  "mm_processor_kwargs", "documents", "vllm_xargs"):
        code, r = _post(url, "/v1/chat/completions", {**msg, field: "x"})
        assert code == 400 and r["error"]["param"] == field, (field, r)
        assert r["error"]["message"].startswith(f"'{field}' is not supported (got 'x')"), r


def test_a_user_that_is_no_string_gets_the_400_naming_user(served):  # noqa: F811
    """M69e.M82: OpenAI's user is a string; another value is a 400 whose param names 'user'
    (whether or not --isolate-clients reads it)."""
    url, _ = served
    code, r = _post(url, "/v1/completions", {"prompt": "w1", "max_tokens": 1, "user": 7})
    assert code == 400 and r["error"]["param"] == "user" and "'user' must be a string; got 7" in r["error"]["message"]


def _closes_at_once(url: str, data: bytes) -> tuple[bytes, float]:
    """The answer to ``data`` sent on one connection, read to the connection's end, and how
    long that end took (10 s at most: the socket's timeout)."""
    import time

    from tests.cli.test_serve import _raw

    t = time.perf_counter()
    return _raw(url, data, timeout=10), time.perf_counter() - t


def test_each_answer_that_ends_its_connection_says_so_and_ends_it_at_once(worded, monkeypatch):  # noqa: F811
    """Mutants m74c-04 (the kept-alive loop waited for a next request after an answer that
    ends its connection), m74c-15, m74c-16 and m74c-52 ("Connection: Close", "keep-alive,
    close", "TE,close" kept the connection), m74c-18, m74c-20 and m74c-55 (a body not read, a
    GET's or a refused POST's, one with an empty Content-Length or a Transfer-Encoding other
    than chunked, read as the next request), m74c-22 and m74c-46 (an answer while stopping
    without "Connection: close"), m74c-24 and m74c-27 (an HTTP/1.0 client's POST kept),
    m74c-45 (a request line too long, 414, on a kept connection: its rest read as the next
    request): each of these gets its answer saying "Connection: close" and nothing after it,
    and its connection ends at once, not after KEEP_ALIVE (30 s here, longer than the
    socket's 10 s)."""
    import re

    from specrt import cmd_serve
    from tests.cli.test_serve import _in_process

    monkeypatch.setattr(cmd_serve, "KEEP_ALIVE", 30.0)
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    junk = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"  # (a body that reads as a request)

    def post(path: bytes, version: bytes, data: bytes, extra: bytes = b"") -> bytes:
        return (b"POST %s %s\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
                % (path, version, extra, len(data), data))

    with _in_process(worded) as (app, httpd, url, logs):
        for data, status in (
                (b"GET /health HTTP/1.0\r\n\r\n", 200),
                (post(b"/v1/completions", b"HTTP/1.0", body), 200),
                (post(b"/v1/embeddings", b"HTTP/1.0", body), 404),  # (its body read by _discard_body)
                (post(b"/v1/completions", b"HTTP/1.1", body, b"Connection: close\r\n"), 200),
                (post(b"/v1/embeddings", b"HTTP/1.1", body, b"Connection: close\r\n"), 404),
                (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n", 200),  # (a token's case: RFC 9110)
                (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n", 200),
                (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: TE,close\r\nTE: trailers\r\n\r\n", 200),
                (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(junk), junk), 200),
                (post(b"/v1/completions", b"HTTP/1.1", junk).replace(b"Length: %d" % len(junk), b"Length: x"), 400),
                (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n" + junk, 400),
                (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n" + junk, 400),
                (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /%s HTTP/1.1\r\nHost: x\r\n\r\n" % (b"a" * 70000),
                 (200, 414)),  # (the standard library's limit: 65536 bytes)
                (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 503)):  # (while stopping, below)
            app.stopping = status == 503
            try:
                out, took = _closes_at_once(url, data)
            finally:
                app.stopping = False
            got = [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", out)]  # (the status lines)
            head = out[out.rfind(b"HTTP/1.1 "):].partition(b"\r\n\r\n")[0]
            assert got == list(status if isinstance(status, tuple) else (status,)), (data[:300], out[:1000])
            assert b"\r\nConnection: close" in head and took < 5, (data[:300], head, took)


def test_a_kept_connections_next_request_reads_with_the_read_timeout(worded, monkeypatch):  # noqa: F811
    """Mutant m74c-11: the wait for a kept connection's next request (KEEP_ALIVE) is not the
    timeout its reads then have: a client whose body comes a while after its head (longer
    than KEEP_ALIVE, 0.3 s here; within the read timeout, 60 s) gets its answer, not a
    connection closed unanswered."""
    import socket
    import time

    from specrt import cmd_serve
    from tests.cli.test_serve import _answers, _in_process

    monkeypatch.setattr(cmd_serve, "KEEP_ALIVE", 0.3)
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    with _in_process(worded) as (app, httpd, url, logs):
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=30) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _answers(c, 1)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body))
            time.sleep(1)
            c.sendall(body)
            (head, got), = _answers(c, 1)
            assert head.startswith(b"HTTP/1.1 200") and json.loads(got)["usage"]["completion_tokens"] == 2, head


def test_a_kept_connections_answers_are_not_held_back_for_the_clients_ack(served):  # noqa: F811
    """Mutant m74c-33 (TCP_NODELAY off): on a kept connection an answer's headers and its body
    are two writes, and with Nagle's algorithm the body waited for the client's delayed ACK,
    40 ms or more a request (h74a measured 47 ms; 0.14 ms with TCP_NODELAY). The median of
    15 requests on one connection stays well under that."""
    import http.client
    import statistics
    import time

    url, _ = served
    c = http.client.HTTPConnection(url.split("//")[1], timeout=30)
    took = []
    for _ in range(15):
        t = time.perf_counter()
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        took.append(time.perf_counter() - t)
    c.close()
    assert statistics.median(took) < 0.035, took  # (a delayed ACK: 40 ms a request)


def test_an_ipv6_only_name_listens_on_its_first_address_whatever_its_labels(monkeypatch):
    """Mutants m74c-37 (a name with an all-digit label, "7.v6only.test", taken for an IPv4
    address, so not resolved: socketserver's IPv4 socket could not bind it) and m74c-40 (the
    last of a name's IPv6 addresses bound, not the first the resolver gives)."""
    import socket

    from specrt.cmd_serve import _listen_family

    def resolve(host, port, family=0, type=0, proto=0, flags=0):  # (no such name in this machine's /etc/hosts)
        assert host == "7.v6only.test", host
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0)) for a in ("::1", "fe80::1")]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert _listen_family("7.v6only.test", 8000) == (socket.AF_INET6, "::1")


def test_a_connection_idle_for_a_second_is_still_kept(served):  # noqa: F811
    """Mutant m74c-35 (KEEP_ALIVE 0.2 s): a kept connection waits KEEP_ALIVE, 5 s as vLLM's,
    for its next request; one idle for a second (a client between two requests) is answered
    on the same connection, not closed under it (http.client: RemoteDisconnected)."""
    import http.client
    import time

    url, _ = served
    c = http.client.HTTPConnection(url.split("//")[1], timeout=30)
    sockets = []
    for _ in range(2):
        c.request("GET", "/health")
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"status": "ok"}
        sockets.append(c.sock)
        time.sleep(1)
    c.close()
    assert sockets[0] is sockets[1]  # (one connection)


def test_an_idle_kept_connection_is_closed_without_a_traceback(worded, monkeypatch, capfd):  # noqa: F811
    """Mutant m74c-49 (the wait's end not taken as the close): past KEEP_ALIVE (0.3 s here)
    the idle connection is closed as such; a read of the next request on the timed-out socket
    failed ("cannot read from timed out object") with a traceback on stderr for each idle
    connection."""
    import socket

    from specrt import cmd_serve
    from tests.cli.test_serve import _answers, _in_process

    monkeypatch.setattr(cmd_serve, "KEEP_ALIVE", 0.3)
    with _in_process(worded) as (app, httpd, url, logs):
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=30) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _answers(c, 1)
            assert c.recv(1) == b""  # (closed past the wait)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "timed out" not in err, err


def test_a_malformed_request_after_a_post_on_a_kept_connection_is_not_counted_as_the_posts(served):  # noqa: F811
    """Mutant m74c-51 (parse_request's reset of the POST's endpoint after the standard
    library's parse, not before): a request the standard library refuses (400, here a request
    line with a word too many) after a completion on the same kept connection was counted in
    /metrics as a completion answered 400."""
    import socket
    import urllib.request

    from tests.cli.test_serve import _answers

    def counts() -> dict[str, float]:
        with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
            return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in r.read().decode().splitlines()
                                             if ln.startswith("specrt_requests_total{"))}

    url, _ = served
    before = counts()
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as c:
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        (head, _), = _answers(c, 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        c.sendall(b"GET /v1/models HTTP/1.1 extra\r\nHost: x\r\n\r\n")
        (head, _), = _answers(c, 1)
        assert head.startswith(b"HTTP/1.1 400"), head
    after = counts()
    assert {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)} == {
        'specrt_requests_total{endpoint="completions",status="200"}': 1}, (before, after)


def test_a_kept_connections_next_request_stalled_mid_head_is_let_go(worded):  # noqa: F811
    """Mutant m74c-53 (no read timeout once the wait for a kept connection's next request
    ends): a client that sent part of its next request's head, then nothing, held its thread,
    and its place among the connections the stop waits for, without end; it is let go after
    the read timeout (1 s here, 60 by default), as on a fresh connection."""
    import socket
    import time

    from tests.cli.test_serve import _answers, _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        httpd.RequestHandlerClass.timeout = 1
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=10) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _answers(c, 1)
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # (the rest never comes)
            t = time.perf_counter()
            assert c.recv(1) == b"" and time.perf_counter() - t < 5


def test_another_windows_accept_failure_is_not_said_as_running_out_of_descriptors(worded, monkeypatch):  # noqa: F811
    """Mutant m74c-54 (any winerror taken for WSAEMFILE): Windows' accept failing otherwise
    (WSAECONNRESET, 10054: a client that reset before it was accepted) is dropped as
    socketserver drops it, not said as running out of file descriptors (10024 only)."""
    import socketserver

    import pytest

    from tests.cli.test_serve import _in_process

    def reset(self):
        e = OSError(10054, "An existing connection was forcibly closed by the remote host")
        e.winerror = 10054  # (OSError sets it on Windows only)
        raise e

    with _in_process(worded) as (app, httpd, url, logs):
        monkeypatch.setattr(socketserver.TCPServer, "get_request", reset)
        with pytest.raises(OSError):
            httpd.get_request()
        assert not any("out of file descriptors" in x for x in logs), logs


def test_pipelined_requests_whose_client_then_half_closes_are_all_answered(worded, monkeypatch):  # noqa: F811
    """w75c: a client that pipelines its requests and then closes its sending side
    (shutdown(SHUT_WR), as `printf ... | nc -N` does) has sent them all and reads their
    answers (RFC 9112 9.6: a half-close "does not imply that the client is no longer
    interested in a response"): each is answered in order, the stream's too, and the
    connection then ends at once (not after KEEP_ALIVE, 30 s here). The half-close read as the
    client leaving: neither of two completions was answered."""
    import re
    import socket
    import time

    from specrt import cmd_serve
    from tests.cli.test_serve import _in_process

    monkeypatch.setattr(cmd_serve, "KEEP_ALIVE", 30.0)

    def post(body: dict) -> bytes:
        data = json.dumps(body).encode()
        return b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)

    with _in_process(worded) as (app, httpd, url, logs):
        for sent, tokens in (
                (post({"prompt": "w1 w2", "max_tokens": 3}) + post({"prompt": "w4", "max_tokens": 2})
                 + post({"prompt": "w4 w6", "max_tokens": 2, "stream": True}), [3, 2]),
                # (pipelining seen as the GET's answer ends, the completion's own look finding nothing behind it)
                (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post({"prompt": "w1 w2", "max_tokens": 3}), [3])):
            with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=10) as c:
                c.sendall(sent)
                c.shutdown(socket.SHUT_WR)
                t, out = time.perf_counter(), b""
                while chunk := c.recv(65536):
                    out += chunk
                took = time.perf_counter() - t
            assert re.findall(rb"HTTP/1\.1 (\d{3}) ", out) == [b"200"] * sent.count(b" HTTP/1.1\r\n"), out[:600]
            usage = [json.loads(u) for u in re.findall(rb'"usage": (\{[^}]*\})', out)]
            assert [u["completion_tokens"] for u in usage] == tokens and took < 5, (out[:1200], took)
        assert len(logs) == 4, logs  # (each completion run once, to its end)


def test_a_refused_body_sent_without_waiting_for_100_continue_is_read_until_its_404_is_had(served):  # noqa: F811
    """w75c: a request refused before its body (404 here) whose client said "Expect:
    100-continue" but sent its body at once (RFC 9110 10.1.1 lets it) is answered at once and
    its connection closed; closed on the body's unread bytes, the socket was reset while the
    client still sent them, and a client that stops at a failed send (as `_raw`, http.client)
    met a broken pipe, not its 404: on loopback 20 of 20 for a body of 4 MB or 16 MB, none
    for 1 MB (the sockets' buffers took it whole). What comes after the answer is read and
    dropped for a moment (Handler._linger)."""
    from specrt.cmd_serve import MAX_BODY
    from tests.cli.test_serve import _raw

    url, _ = served
    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % MAX_BODY)
    for _ in range(3):
        try:
            out = _raw(url, head + b" " * MAX_BODY)
        except OSError as e:  # (a broken pipe or a reset while sending)
            out = repr(e).encode()
        assert out.startswith(b"HTTP/1.1 404") and b"\r\nConnection: close\r\n" in out, out[:200]


def test_a_streams_error_event_that_cannot_be_written_ends_its_connection_quietly(worded, capfd):  # noqa: F811
    """w75c: a stream ending in an error event (here cut by a second Ctrl-C, Server.cutting,
    mid-answer) whose client has reset its connection meanwhile: the event's own write fails,
    and the connection is closed as a client's that left, without a traceback on stderr
    (socketserver's "Exception occurred during processing of request"); the server goes on.
    The generator is held after its second piece until the client has reset (a stream of the
    tiny engines ends before a client could fill the sockets' buffers)."""
    import socket
    import struct
    import threading
    import time

    from tests.cli.test_serve import _get, _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        real, written, gone = app.session.stream, threading.Event(), threading.Event()

        def held(*a, **k):
            for n, piece in enumerate(real(*a, **k)):
                if n == 2:  # (the events of pieces 0 and 1 are written by now)
                    written.set()
                    gone.wait(30)
                yield piece

        app.session.stream = held
        req = json.dumps({"prompt": "w1 w2", "max_tokens": 20, "stream": True}).encode()
        c = socket.create_connection(httpd.server_address, timeout=30)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(req), req))
        assert written.wait(30) and c.recv(65536).startswith(b"HTTP/1.1 200")
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()  # (a reset)
        time.sleep(0.2)
        app.cutting = True
        gone.set()
        deadline = time.time() + 30
        while not any("finish none: cut" in x for x in logs) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        app.cutting = False
        app.session.stream = real
        assert _get(url, "/health") == (200, {"status": "ok"})
    err = capfd.readouterr().err
    assert any("finish none: cut" in x for x in logs) and "Traceback" not in err, (logs, err)


def test_once_the_stop_has_settled_a_kept_connection_is_closed_before_its_next_one(worded, monkeypatch):  # noqa: F811
    """w75c: a kept connection waiting for its next request is not among those the stop waits
    for; it stayed open until the process ended, so a request sent on it in the 75-130 ms
    between the settle and the end was read by no one and reset (a load balancer's probe, a
    client's POST: 90 of 450 probes on `serve` under SIGTERM; 1 of 450 now, the rest seeing
    the close before sending). Once the stop has settled (Server.settle, as drain calls it)
    the connection is closed at once (not after KEEP_ALIVE, 30 s here), so its client sees
    the close before it sends (urllib3 and httpx look before reusing a connection); no
    request is begun after it."""
    import socket
    import time

    from specrt import cmd_serve
    from tests.cli.test_serve import _answers, _in_process

    monkeypatch.setattr(cmd_serve, "KEEP_ALIVE", 30.0)
    with _in_process(worded) as (app, httpd, url, logs):
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=5) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _answers(c, 1)
            time.sleep(0.2)  # (its handler waiting for the next request)
            app.stopping = True
            assert app.settle(5)
            assert c.recv(1) == b""  # (closed, not kept for 30 s: the socket's 5 s timeout)


def test_a_body_refused_as_too_large_or_chunked_is_read_until_its_answer_is_had(served):  # noqa: F811
    """h75c's leftover: a POST refused before its body is read, as too large (413: Content-Length
    past MAX_BODY) or chunked (411), had its connection closed on the body's unread bytes, as the
    refused 100-continue's above: a client sending the body whole met a reset or a broken pipe,
    not its answer. It is lingered over too (Handler._linger)."""
    from specrt.cmd_serve import MAX_BODY
    from tests.cli.test_serve import _raw

    url, _ = served
    big = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    chunk = b"%x\r\n%s\r\n" % (MAX_BODY // 2, b" " * (MAX_BODY // 2))
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + chunk + b"0\r\n\r\n")
    for head, body, status in ((big, b" " * (MAX_BODY // 2), b"413"), (chunked, b"", b"411")):
        for _ in range(2):
            try:
                out = _raw(url, head + body)
            except OSError as e:  # (a broken pipe or a reset while sending)
                out = repr(e).encode()
            assert out.startswith(b"HTTP/1.1 " + status) and b"\r\nConnection: close\r\n" in out, out[:200]


def test_a_request_sent_after_its_answer_is_not_taken_for_pipelined(worded, monkeypatch):  # noqa: F811
    """r75i: a client that sends its next request only once it has its answer has not
    pipelined, however soon it sends it: pipelining was looked for as the answer ended, in
    _next_request, and a request that came before the server's thread got there (descheduled
    after its write: with one other client on the engines, a kept connection's requests were
    all taken for pipelined from its 3rd on, 200 of 200) marked the connection pipelined for
    good, so a client closing it was no longer seen to leave (_client_gone): its request, left
    while it waited for the engines, was run to its end. Looked for before the answer is
    written now (end_headers; a stream's last chunk). The thread is held here after its answer
    for 0.3 s, as a busy machine holds it."""
    import socket
    import time

    from specrt import cmd_serve
    from tests.cli.test_serve import _answers, _in_process

    real = cmd_serve.Handler._next_request

    def late(self):  # (the handler's thread descheduled as its answer ends)
        time.sleep(0.3)
        return real(self)

    monkeypatch.setattr(cmd_serve.Handler, "_next_request", late)
    body = json.dumps({"prompt": "w4 w2", "max_tokens": 40}).encode()
    with _in_process(worded) as (app, httpd, url, logs):
        with socket.create_connection(httpd.server_address, timeout=10) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            _answers(c, 1)
            with app.lock:  # an answer in flight: the POST waits for the engines, and its client leaves
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                          % (len(body), body))
                deadline = time.time() + 30
                while app.metrics.waiting < 1 and time.time() < deadline:
                    time.sleep(0.01)
                c.close()
        while len(app.metrics.requests) < 2 and time.time() < deadline + 30:  # (/health's counted too, h79j)
            time.sleep(0.01)
        assert app.metrics.requests == {("health", 200): 1, ("completions", 499): 1} and not logs, \
            (app.metrics.requests, logs)
