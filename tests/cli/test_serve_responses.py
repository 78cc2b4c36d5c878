"""`specrt serve`'s POST /v1/responses (h77a): OpenAI's Responses API mapped onto the chat path
(specrt/responses.py), read through the real OpenAI SDK's ``client.responses.create`` and
``client.responses.stream``, which build the response objects and events from what is sent
(an event out of order, a delta for an item never added, is their RuntimeError).

Real engines: test_serve_tools.py's bigram target under its word-level tokenizer and tools
template (--tool-call-parser hermes, governor off), test_serve_structured.py's tiny Llama with a
byte-level BPE tokenizer and a P-EAGLE draft (fixed:2:ngram, llguidance), and
test_serve_reasoning.py's thinking model (--reasoning-parser qwen3). Every test here fails
without the route (a 404)."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from tests.cli.test_serve import _get, _in_process, _post  # noqa: E402
from tests.cli.test_serve_tools import ASK, TOOLS, _calling, _serving  # noqa: E402
from tests.runtime.test_text import overflowing, worded  # noqa: E402, F401  (fixtures: an engine failure mid-answer;
# word-level engines)

FLAT = [{"type": "function", **TOOLS[0]["function"]}]  # the Responses API's flat function tool


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    """The URL of a server of the tools engines with --tool-call-parser hermes (governor off)."""
    gen = _serving(_calling(tmp_path_factory.mktemp("calling")), ("hermes",))
    yield next(gen)["hermes"]
    next(gen, None)


@pytest.fixture(scope="module")
def guided(tmp_path_factory):
    """(url, app) of a server of the structured output engines, governor fixed:2:ngram."""
    pytest.importorskip("llguidance")
    from tests.runtime.test_grammar import guided_engines

    with _in_process(guided_engines(tmp_path_factory.mktemp("responses")), "fixed:2:ngram") as (app, _, url, _):
        yield url, app


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _events(url: str, body: dict) -> list[tuple[str, dict]]:
    """A streamed response's events as sent: (the ``event:`` line's name, the data)."""
    import urllib.request

    req = urllib.request.Request(url + "/v1/responses", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers.get("Content-Type") == "text/event-stream"
        text = r.read().decode()
    out = []
    for block in text.split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), block
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    assert text.endswith("\n\n") and "[DONE]" not in text  # (OpenAI's responses stream ends at its last event)
    return out


def _same_output(a: list, b: list) -> None:
    """Two responses' output items equal but for their ids (made anew each response; the SDK's
    parsed text and arguments, None, aside)."""
    def drop(item: dict) -> dict:
        return {k: [{n: w for n, w in p.items() if n != "parsed"} for p in v] if k == "content" else v
                for k, v in item.items() if k not in ("id", "call_id", "parsed_arguments")}

    assert [drop(x) for x in a] == [drop(x) for x in b]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_p": 0.9, "seed": 7}], ids=["greedy", "sampled"])
def test_a_response_is_the_chat_answer_whole_and_streamed(hermes, sampling):
    """``instructions`` and ``input`` are the chat's system and user messages: a response's text
    is the chat completion's for the same messages, sampling and seed (the SDK's output_text),
    its usage the chat's counts, status completed; streamed, the SDK's events (sequence numbers
    0, 1, ... with their ``event:`` lines, no [DONE]) join their deltas to the same text, and
    their response.completed carries the same output. Counted under its own endpoint in /metrics."""
    c = _client(hermes)
    counted = 3 if sampling else 0  # (the greedy case's requests, before)
    extra = {k: v for k, v in sampling.items() if k == "seed"}
    sampled = {k: v for k, v in sampling.items() if k != "seed"}
    chat = c.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"}, *ASK],
                                     max_tokens=8, extra_body=extra, **sampled)
    r = c.responses.create(model="tiny", instructions="be brief", input=ASK[0]["content"], max_output_tokens=8,
                           extra_body=extra, **sampled)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == chat.choices[0].message.content and r.output[0].role == "assistant"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    with c.responses.stream(model="tiny", instructions="be brief", input=[{"role": "user", "content": [
            {"type": "input_text", "text": ASK[0]["content"]}]}], max_output_tokens=8, extra_body=extra,
            **sampled) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
    assert "".join(deltas) == chat.choices[0].message.content and len(deltas) > 1
    events = _events(hermes, {"model": "tiny", "instructions": "be brief", "input": ASK, "max_output_tokens": 8,
                              **sampling})
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert all(name == d["type"] for name, d in events)
    assert [n for n, _ in events[:4]] == ["response.created", "response.in_progress", "response.output_item.added",
                                          "response.content_part.added"]
    _same_output(events[-1][1]["response"]["output"], r.model_dump(exclude_unset=True)["output"])
    import urllib.request

    with urllib.request.urlopen(hermes + "/metrics", timeout=30) as m:
        assert f'specrt_requests_total{{endpoint="responses",status="200"}} {counted + 3}' in m.read().decode()


def test_the_output_logprobs_are_the_chats(hermes):
    """include ["message.output_text.logprobs"] with top_logprobs: the message's output_text
    carries chat's logprobs entries for the same messages (each token's, its alternatives), whole;
    streamed, the text deltas' logprobs join to the same entries, each once, and the completed
    response holds them all. Without the include, none (vLLM's: top_logprobs alone gives none)."""
    c = _client(hermes)
    chat = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=6, logprobs=True, top_logprobs=2)
    want = [e.model_dump() for e in chat.choices[0].logprobs.content]
    body = {"model": "tiny", "input": ASK, "max_output_tokens": 6, "include": ["message.output_text.logprobs"],
            "top_logprobs": 2}
    code, r = _post(hermes, "/v1/responses", body)
    got = r["output"][0]["content"][0]["logprobs"]
    assert code == 200 and [{k: e[k] for k in ("token", "logprob", "bytes")} for e in got] == \
        [{k: e[k] for k in ("token", "logprob", "bytes")} for e in want] and len(got) == 6
    assert all(len(e["top_logprobs"]) == 2 for e in got)
    events = _events(hermes, body)
    streamed = [e for n, d in events if n == "response.output_text.delta" for e in d["logprobs"]]
    assert streamed == got and events[-1][1]["response"]["output"][0]["content"][0]["logprobs"] == got
    r = c.responses.create(model="tiny", input=ASK, max_output_tokens=6, top_logprobs=2)
    assert r.output[0].content[0].logprobs == []


def test_max_output_tokens_leaves_a_response_incomplete(guided):
    """An answer cut by max_output_tokens: status "incomplete", incomplete_details.reason
    "max_output_tokens", the message's status "incomplete", output_tokens the cap; streamed, the
    last event is response.incomplete (OpenAI's) with the same response, the message's item
    done "incomplete"."""
    url, _ = guided
    c = _client(url)
    r = c.responses.create(model="tiny", input="paint it", max_output_tokens=5)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.usage.total_tokens == r.usage.input_tokens + 5
    assert r.output[-1].status == "incomplete"
    events = _events(url, {"model": "tiny", "input": "paint it", "max_output_tokens": 5})
    name, last = events[-1]
    assert name == "response.incomplete" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    _same_output(last["response"]["output"], r.model_dump(exclude_unset=True)["output"])
    assert [d["item"]["status"] for n, d in events if n == "response.output_item.done"] == ["incomplete"]


def test_function_calls_go_out_and_their_outputs_come_back_in(hermes):
    """With flat function tools and --tool-call-parser hermes: the model's <tool_call> block is a
    function_call item (name, arguments, a call_id), after a message of the text before it, whole
    and streamed (the arguments' deltas join to them). Sent back as input, that output and a
    function_call_output reach the template as the chat's assistant tool_calls and tool message:
    the prompt is the equivalent chat conversation's (its token count) and the answer the same."""
    c = _client(hermes)
    r = c.responses.create(model="tiny", input=ASK[0]["content"], tools=FLAT, max_output_tokens=12,
                           extra_body={"stop": ["done"]})
    calls = [x for x in r.output if x.type == "function_call"]
    assert [(x.name, json.loads(x.arguments)) for x in calls] == [("get_weather", {"city": "Paris"})]
    assert r.output[0].type == "message" and r.output_text.strip() == "Sure." and r.status == "completed"
    with c.responses.stream(model="tiny", input=ASK[0]["content"], tools=FLAT, max_output_tokens=12,
                            extra_body={"stop": ["done"]}) as s:
        args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    assert args == calls[0].arguments
    _same_output([x.model_dump(exclude_unset=True) for x in final.output],
                 [x.model_dump(exclude_unset=True) for x in r.output])
    back = [{"role": "user", "content": ASK[0]["content"]}, *[x.model_dump(exclude_none=True) for x in r.output],
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"}]
    r2 = c.responses.create(model="tiny", input=back, tools=FLAT, max_output_tokens=4)
    conv = [*ASK, {"role": "assistant", "content": r.output_text, "tool_calls": [
        {"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny"}]
    chat = c.chat.completions.create(model="tiny", messages=conv, tools=TOOLS, max_tokens=4)
    code, tok = _post(hermes, "/tokenize", {"messages": conv, "tools": TOOLS})
    assert code == 200 and r2.usage.input_tokens == tok["count"] == chat.usage.prompt_tokens
    assert r2.output_text == chat.choices[0].message.content
    assert tok["count"] > r.usage.input_tokens + 3  # (the call and its output rendered: <tool_response> sunny ...)


def test_developer_messages_and_text_parts_render_as_the_chats(guided):
    """A developer message is rendered as a system one (OpenAI's meaning; a chat template knows
    no developer role), input_text / output_text parts as chat's text parts joined: the prompt is
    the chat conversation's, as /tokenize counts it."""
    url, _ = guided
    items = [{"role": "developer", "content": "be brief"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "paint"},
                                                             {"type": "input_text", "text": "it"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "red", "annotations": []}]},
             {"role": "user", "content": "again"}]
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "paint\nit"},
            {"role": "assistant", "content": "red"}, {"role": "user", "content": "again"}]
    code, tok = _post(url, "/tokenize", {"messages": conv})
    code, r = _post(url, "/v1/responses", {"input": items, "max_output_tokens": 2})
    assert code == 200 and r["usage"]["input_tokens"] == tok["count"], r


def test_text_format_json_schema_holds_the_answer(guided):
    """text.format json_schema (the Responses API's place for response_format): the answer is JSON
    of the schema, whole and streamed; json_object an object."""
    from tests.runtime.test_grammar import SCHEMA

    url, _ = guided
    c = _client(url)
    fmt = {"format": {"type": "json_schema", "name": "paint", "schema": SCHEMA, "strict": True}}
    r = c.responses.create(model="tiny", input="paint it", text=fmt, max_output_tokens=60)
    obj = json.loads(r.output_text)
    assert set(obj) == {"color", "ok"} and obj["color"] in ("red", "green", "blue") and r.status == "completed"
    with c.responses.stream(model="tiny", input="paint it", text=fmt, max_output_tokens=60) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
    assert text == r.output_text
    r = c.responses.create(model="tiny", input="paint it", text={"format": {"type": "json_object"}},
                           max_output_tokens=60)
    assert r.output_text.startswith("{")


def test_vllms_structured_outputs_hold_a_response_as_a_chats_answer(guided):
    """vLLM's structured_outputs (its Responses request's extra field; "Unrecognized request
    argument" before h79j) as chat's: a structural tag (its trigger two tokens the free answer
    writes), JSON under a whitespace pattern, and whitespace options beside text.format's schema
    give chat's answer for the same messages, the JSON compact; text.format and
    structured_outputs both asking for JSON: a 400 naming both, in the Responses API's names."""
    from tests.cli.test_serve_structured import _tag, _tokens
    from tests.runtime.test_grammar import SCHEMA

    url, _ = guided
    c = _client(url)
    free = _tokens(url, response_format={"type": "structural_tag", **_tag("\x01q")})  # (never triggered)
    at = next(k for k in range(len(free) - 1) if (free[k] + free[k + 1]).isascii()
              and (free[k] + free[k + 1]).strip() and "".join(free[:k + 2]).find(free[k] + free[k + 1]) == len(
                  "".join(free[:k])))
    trig = free[at] + free[at + 1]
    compact = lambda s: s == json.dumps(json.loads(s), separators=(",", ":"))  # noqa: E731
    fmt = {"type": "json_schema", "name": "paint", "schema": SCHEMA}
    for so, text, held in [({"structural_tag": json.dumps({"type": "structural_tag", **_tag(trig)})}, None,
                            lambda s: s.startswith("".join(free[:at + 2]) + "=paint>") and "</t>" in s),
                           ({"json": SCHEMA, "whitespace_pattern": ""}, None, compact),
                           ({"disable_any_whitespace": True}, {"format": fmt}, compact)]:
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "paint it"}],
                                         max_tokens=30, extra_body={"structured_outputs": so}, **({
                                             "response_format": {"type": "json_schema", "json_schema": fmt}}
                                             if text else {}))
        r = c.responses.create(model="tiny", input="paint it", max_output_tokens=30, extra_body={
            "structured_outputs": so}, **({"text": text} if text else {}))
        assert r.output_text == chat.choices[0].message.content and held(r.output_text), (so, r.output_text)
    code, body = _post(url, "/v1/responses", {"model": "tiny", "input": "paint it", "text": {"format": fmt},
                                              "structured_outputs": {"json": SCHEMA}})
    assert code == 400 and body["error"]["param"] == "structured_outputs" and \
        "'text.format' and 'structured_outputs': one structured output" in body["error"]["message"], body


def test_a_forced_tool_choice_gives_function_call_items(guided):
    """tool_choice "required" and {type: function, name} take chat's forced path (the answer held to
    the calls' JSON schema): function_call items, no message; the named one's arguments JSON of its
    parameters, whole and streamed alike (the arguments in many deltas, as they are written; h78d:
    one delta, the call whole at the end)."""
    from tests.runtime.test_grammar import SCHEMA

    url, _ = guided
    c = _client(url)
    tools = [{"type": "function", "name": "paint", "description": "Paint it", "parameters": SCHEMA},
             {"type": "function", "name": "stop"}]
    r = c.responses.create(model="tiny", input="paint it", tools=tools, tool_choice="required",
                           parallel_tool_calls=False, max_output_tokens=120)
    assert [x.type for x in r.output] == ["function_call"] and r.output[0].name in ("paint", "stop")
    assert r.status == "completed" and r.output[0].call_id.startswith("call_")
    named = {"type": "function", "name": "paint"}
    _streams_as_whole(c, r, tools=tools, tool_choice="required", parallel_tool_calls=False, max_output_tokens=120)
    r = c.responses.create(model="tiny", input="paint it", tools=tools, tool_choice=named, max_output_tokens=60)
    assert [(x.type, x.name) for x in r.output] == [("function_call", "paint")]
    obj = json.loads(r.output[0].arguments)
    assert set(obj) == {"color", "ok"} and r.tool_choice.name == "paint"
    _streams_as_whole(c, r, tools=tools, tool_choice=named, max_output_tokens=60)


def _streams_as_whole(c, r, **body) -> None:
    """``body`` streamed (the SDK's ``c``): the output items are the whole response ``r``'s, its
    call's arguments in more than one response.function_call_arguments.delta."""
    with c.responses.stream(model="tiny", input="paint it", **body) as s:
        args = [e.delta for e in s if e.type == "response.function_call_arguments.delta"]
        final = s.get_final_response()
    assert "".join(args) == r.output[0].arguments and len(args) > 1, args
    _same_output([x.model_dump(exclude_unset=True) for x in final.output],
                 [x.model_dump(exclude_unset=True) for x in r.output])


@pytest.mark.parametrize("body, param, words", [
    ({"input": None}, "input", "'input' must be a string or a non-empty list"),
    ({"input": []}, "input", "'input' must be a string or a non-empty list"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input",
     "input[0].content[0]: only text parts"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role must be"),
    ({"input": [{"type": "item_reference", "id": 7}]}, "input", "input[0].id: an item_reference names a kept item"),
    ({"tools": [{"type": "web_search"}]}, "tools", "only function tools"),
    ({"tools": TOOLS}, "tools", "the Responses API's tools are flat"),
    ({"tools": [{**FLAT[0], "parameters": "city"}]}, "tools", "tools[0].parameters: expected a JSON Schema object"),
    ({"tools": FLAT, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "{'type': 'function', 'name': ...}"),
    ({"tools": FLAT, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "which 'tools' has not"),
    ({"max_output_tokens": 0}, "max_output_tokens", "'max_output_tokens' must be an integer >= 1"),
    ({"max_output_tokens": 5000}, "max_output_tokens", "length of the input or completion"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text", "'text.format' must be"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text",
     "text.format.schema"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "Previous response with id 'resp_1' not found"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}]}, "input",  # h78a: OpenAI's 400
     "input[0]: No tool call found for function call output with call_id 'call_9'"),
    ({"background": True}, "background", "not supported"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools", "'file_search'"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "--reasoning-parser"),
    ({"include": ["reasoning.encrypted_content"]}, "include", "'include' takes 'message.output_text.logprobs' alone"),
    ({"include": "message.output_text.logprobs"}, "include", "'include' must be a list, as ['message.output"),  # w77f
    ({"metadata": {"run": 1}}, "metadata", "'metadata' values must be strings"),  # w77f: echoed, the SDK's str -> str
    ({"top_logprobs": 21}, "top_logprobs", "an integer from 0 to 20"),
    ({"messages": ASK}, "messages", "Unrecognized request argument supplied: messages"),
    ({"temperature": -1}, "temperature", "'temperature' must be a number >= 0.0"),
])
def test_a_bad_response_request_is_a_400_naming_its_field(guided, body, param, words):
    """What the route does not do, or a malformed request, is a 400 naming the response request's
    own field (not the chat request's it maps onto: max_tokens, messages, response_format)."""
    url, _ = guided
    code, r = _post(url, "/v1/responses", {"model": "tiny", "input": "paint it", **body})
    assert code == 400 and r["error"]["param"] == param and words in r["error"]["message"], r


def test_the_api_key_guards_the_route(guided):
    """--api-key: /v1/responses needs it, as every /v1 path."""
    url, app = guided
    app.api_key = "k"
    try:
        code, r = _post(url, "/v1/responses", {"input": "paint it"})
        assert code == 401 and r["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0).responses.create(
            input="paint it", model="tiny", max_output_tokens=3)
        assert ok.usage.output_tokens == 3
    finally:
        app.api_key = None


def test_the_reasoning_parser_gives_a_reasoning_item(tmp_path):
    """--reasoning-parser qwen3: the thinking before </think> is a reasoning item (its
    reasoning_text the chat's ``reasoning``) before the message of the chat's content, whole and
    streamed (response.reasoning_text.delta joining to it); a reasoning item sent back is the next
    assistant message's reasoning_content, as the template renders a chat client's."""
    from tests.cli.test_serve_reasoning import think_server

    with think_server(tmp_path, {0: "</think>", 13: "<think>"}) as (url, app):
        app.reasoning = "qwen3"
        c = _client(url)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w8"}], max_tokens=12)
        m = chat.choices[0].message.model_dump()
        r = c.responses.create(model="tiny", input="w8", max_output_tokens=12)
        assert [x.type for x in r.output] == ["reasoning", "message"]
        assert r.output[0].content[0].text == m["reasoning"] and r.output_text == m["content"]
        assert r.usage.output_tokens_details.reasoning_tokens > 0
        events = _events(url, {"model": "tiny", "input": "w8", "max_output_tokens": 12})
        names = [n for n, _ in events]
        assert "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta") == m["reasoning"]
        assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
        _same_output(events[-1][1]["response"]["output"], r.model_dump(exclude_unset=True)["output"])
        back = [{"role": "user", "content": "w8"}, *[x.model_dump(exclude_none=True) for x in r.output],
                {"role": "user", "content": "w1"}]
        conv = [{"role": "user", "content": "w8"},
                {"role": "assistant", "content": m["content"], "reasoning_content": m["reasoning"]},
                {"role": "user", "content": "w1"}]
        code, tok = _post(url, "/tokenize", {"messages": conv})
        r2 = c.responses.create(model="tiny", input=back, max_output_tokens=2)
        assert r2.usage.input_tokens == tok["count"]


def test_an_engine_failure_mid_answer_ends_the_stream_with_an_error_event(overflowing):  # noqa: F811
    """An engine's +inf logits after some text (test_text.py's overflowing pair): whole, a 500
    server_error, as chat's; streamed, the events so far then OpenAI's ``error`` event (type,
    message, code, param, its sequence_number), the stream's end, not a chat error chunk or
    [DONE]; the server goes on. The failed response is kept (store true in its
    response.created; it was a 404, w78f / h78j): GET gives it as OpenAI keeps one, status
    "failed", its ``error`` {code, message}, the text so far incomplete; previous_response_id
    naming it is a 400 (no whole answer to continue from)."""
    eng, prompts = overflowing
    with _in_process(eng, "off") as (app, httpd, url, logs):
        body = {"model": "tiny", "input": prompts[True, True], "max_output_tokens": 20}
        code, r = _post(url, "/v1/responses", body)
        assert code == 500 and r["error"]["type"] == "server_error" and "+inf logits" in r["error"]["message"], r
        events = _events(url, body)
        name, last = events[-2]  # (then response.failed: test_a_failed_stream_ends_with_response_failed)
        assert name == "error" and last["type"] == "error" and "+inf logits" in last["message"], events[-2:]
        assert last["sequence_number"] == len(events) - 2 and last["code"] is None and last["param"] is None
        assert "response.output_text.delta" in [n for n, _ in events]  # (failed mid-answer)
        rid = events[0][1]["response"]["id"]
        code, r = _get(url, f"/v1/responses/{rid}")  # (a 404: w78f)
        assert code == 200 and r["status"] == "failed" and r["error"]["code"] == "server_error", r
        assert "+inf logits" in r["error"]["message"] and r["usage"] is None
        assert [(x["type"], x["status"]) for x in r["output"]] == [("message", "incomplete")], r["output"]
        assert r["output"][0]["content"][0]["text"] and _get(url, f"/v1/responses/{rid}/input_items")[0] == 200
        code, r = _post(url, "/v1/responses", {"input": "again", "previous_response_id": rid, "max_output_tokens": 1})
        assert code == 400 and r["error"]["param"] == "previous_response_id" and "is failed" in r["error"]["message"]
        code, r = _post(url, "/v1/responses", {"input": prompts[True, True], "max_output_tokens": 1})
        assert code == 200 and r["usage"]["output_tokens"] == 1


def test_a_failed_stream_ends_with_response_failed(overflowing):  # noqa: F811
    """A stream failing mid-answer ends as OpenAI's does: its ``error`` event, then
    ``response.failed`` carrying the response (status "failed", its ``error``, the text so far an
    incomplete message), both with their sequence numbers in order. It ended at the ``error``
    event (h78j's "left"): the openai SDK's raw iterator never saw the response fail, its
    ``responses.stream`` helper's snapshot no failed response. With the SDK: the raw events are
    its types (pydantic-validated); the helper yields ResponseFailedEvent with the same output,
    and get_final_response raises (the SDK's RuntimeError: no response.completed), not hangs."""
    from pydantic import TypeAdapter

    from openai.types.responses import ResponseStreamEvent

    eng, prompts = overflowing
    with _in_process(eng, "off") as (app, httpd, url, logs):
        c = _client(url)
        body = {"model": "tiny", "input": prompts[True, True], "max_output_tokens": 20}
        raw = list(c.responses.create(stream=True, **body))
        for e in raw:
            TypeAdapter(ResponseStreamEvent).validate_python(e.to_dict())
        assert [e.type for e in raw[-2:]] == ["error", "response.failed"], [e.type for e in raw[-3:]]
        assert [e.sequence_number for e in raw] == list(range(len(raw)))
        failed = raw[-1].response
        assert failed.id == raw[0].response.id and failed.status == "failed" and failed.usage is None
        assert failed.error.code == "server_error" and failed.error.message == raw[-2].message
        assert [(x.type, x.status) for x in failed.output] == [("message", "incomplete")]
        said = "".join(e.delta for e in raw if e.type == "response.output_text.delta")
        assert said and failed.output[0].content[0].text == said
        assert c.responses.retrieve(failed.id).model_dump() == failed.model_dump()  # (as kept)
        with c.responses.stream(**body) as stream:
            seen = list(stream)
            assert [e.type for e in seen[-2:]] == ["error", "response.failed"]
            assert seen[-1].response.status == "failed" and seen[-1].response.output[0].content[0].text
            with pytest.raises(RuntimeError, match="response.completed"):
                stream.get_final_response()


def test_the_response_and_its_events_are_the_sdks_types_validated(hermes):
    """Every field the openai SDK's types require, in the response and in each streamed event
    (pydantic's validation, which the SDK's own parse skips: a field missing there is None to
    the user): usage.input_tokens_details.cache_write_tokens was missing (w77f); completed_at a
    completed response's time, None for one cut by max_output_tokens (OpenAI's: "only present
    when the status is completed"; w77f: None for both)."""
    from pydantic import TypeAdapter

    from openai.types.responses import Response, ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    for cap, status in ((12, "completed"), (2, "incomplete")):
        body = {"model": "tiny", "input": ASK[0]["content"], "max_output_tokens": cap, "stop": ["done"],
                "include": ["message.output_text.logprobs"], "top_logprobs": 1}
        code, r = _post(hermes, "/v1/responses", body)
        assert code == 200 and Response.model_validate(r).status == status, r
        events = _events(hermes, body)
        for _, d in events:
            adapter.validate_python(d)
        for got in (r, events[-1][1]["response"]):
            assert (got["completed_at"] is None) == (status == "incomplete"), got
            assert status == "incomplete" or abs(got["completed_at"] - got["created_at"]) <= 60


def test_a_reasoning_item_cut_before_its_message_is_sent_back_as_its_turn(tmp_path):
    """An answer cut by max_output_tokens in its thinking is a reasoning item alone; sent back
    before the next user message (``input += response.output``), it is that assistant turn, as a
    chat client sends the cut answer back (content "", its reasoning_content): the prompt is that
    conversation's, as /tokenize counts it. It was dropped, the two user turns run together (w77f)."""
    from tests.cli.test_serve_reasoning import think_server

    with think_server(tmp_path, {0: "</think>", 13: "<think>"}) as (url, app):
        app.reasoning = "qwen3"
        c = _client(url)
        r = c.responses.create(model="tiny", input="w8", max_output_tokens=3)
        assert [x.type for x in r.output] == ["reasoning"] and r.status == "incomplete"
        thought = r.output[0].content[0].text
        back = [{"role": "user", "content": "w8"}, *r.output, {"role": "user", "content": "w1"}]
        conv = [{"role": "user", "content": "w8"}, {"role": "assistant", "content": "", "reasoning_content": thought},
                {"role": "user", "content": "w1"}]
        code, tok = _post(url, "/tokenize", {"messages": conv})
        r2 = c.responses.create(model="tiny", input=back, max_output_tokens=2)
        assert code == 200 and r2.usage.input_tokens == tok["count"]


def _sampled(**extra) -> dict:
    return {"max_output_tokens": 6, "temperature": 1.0, "top_p": 0.9, "extra_body": {"seed": 7},
            "include": ["message.output_text.logprobs"], **extra}


def _tokens(r) -> list[str]:
    return [e.token for x in r.output if x.type == "message" for e in x.content[0].logprobs]


def test_previous_response_id_continues_the_stored_conversation(guided):
    """h78a: previous_response_id puts the stored response's input items and output items before
    the request's input (its instructions not carried over: OpenAI's), rendered through the
    same chat template path: the chained turn's prompt is the one of the same conversation sent
    whole (its token count, as /tokenize counts the chat conversation without the first turn's
    system message), and the tokens sampled with the same seed are the same; a chain of three
    turns too, whole and streamed (a streamed response is kept as a whole one is). Refused
    before (400: nothing stored)."""
    url, _ = guided
    c = _client(url)
    r1 = c.responses.create(model="tiny", instructions="be brief", input="paint it", max_output_tokens=5)
    assert r1.store is True and r1.previous_response_id is None
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="again", **_sampled())
    assert r2.previous_response_id == r1.id and r2.store is True
    sent = [{"role": "user", "content": "paint it"}, *[x.model_dump(exclude_none=True) for x in r1.output],
            {"role": "user", "content": "again"}]
    whole = c.responses.create(model="tiny", input=sent, store=False, **_sampled())
    conv = [{"role": "user", "content": "paint it"}, {"role": "assistant", "content": r1.output_text},
            {"role": "user", "content": "again"}]
    code, tok = _post(url, "/tokenize", {"messages": conv})
    _, system = _post(url, "/tokenize", {"messages": [{"role": "system", "content": "be brief"}, *conv]})
    assert code == 200 and r2.usage.input_tokens == whole.usage.input_tokens == tok["count"] < system["count"]
    assert _tokens(r2) == _tokens(whole) and r2.output_text == whole.output_text and len(_tokens(r2)) == 6
    with c.responses.stream(model="tiny", previous_response_id=r2.id, input="more", **_sampled()) as s:
        r3 = [e.response for e in s if e.type in ("response.completed", "response.incomplete")][0]  # (cut: no final)
    sent += [*[x.model_dump(exclude_none=True) for x in r2.output], {"role": "user", "content": "more"}]
    whole = c.responses.create(model="tiny", input=sent, store=False, **_sampled())
    assert r3.usage.input_tokens == whole.usage.input_tokens > r2.usage.input_tokens
    assert _tokens(r3) == _tokens(whole) and r3.output_text == whole.output_text
    assert c.responses.retrieve(r3.id).output_text == r3.output_text  # (the stream's, kept)


def test_a_streamed_call_cut_is_kept_as_the_whole_responses_text(guided):
    """r78g: a forced call streamed (h78d) and cut by max_output_tokens goes out as a function_call
    item, then taken back (status incomplete, its text as the message: Streamed.end). It was kept
    too, so previous_response_id sent its cut arguments back as a call: a 400 ("not valid JSON").
    The stream's response is kept as the whole one is (its message alone): the next turn's
    prompt is the one after the same response made whole."""
    from tests.runtime.test_grammar import SCHEMA

    url, _ = guided
    c = _client(url)
    body = dict(model="tiny", input="paint it", max_output_tokens=4, tool_choice={"type": "function", "name": "paint"},
                tools=[{"type": "function", "name": "paint", "description": "Paint it", "parameters": SCHEMA}])
    with c.responses.stream(**body) as s:
        cut = [e.response for e in s if e.type == "response.incomplete"][0]
    whole = c.responses.create(**body)
    assert [x.type for x in whole.output] == ["message"] and "function_call" in [x.type for x in cut.output]
    after = [c.responses.create(model="tiny", previous_response_id=r.id, input="again", max_output_tokens=2)
             for r in (cut, whole)]
    assert after[0].usage.input_tokens == after[1].usage.input_tokens
    assert [x.type for x in c.responses.retrieve(cut.id).output] == ["message"]


def test_a_stored_response_is_retrieved_listed_and_deleted(guided):
    """h78a: GET /v1/responses/{id} (the SDK's retrieve) gives the response as it was sent;
    input_items.list its input items (ids made for those sent without: OpenAI's list, newest
    first by default, order asc, limit and after paging through them, has_more), a chained
    response's the whole conversation's; DELETE (the SDK's delete), then a 404 naming the id
    for retrieve and a 400 previous_response_not_found for previous_response_id; store false
    keeps nothing. Each was a 404 (no such path) or a 405 before."""
    url, _ = guided
    c = _client(url)
    items = [{"role": "developer", "content": "be brief"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "paint it"}]}]
    r = c.responses.create(model="tiny", input=items, max_output_tokens=3)
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.output_text == r.output_text
    listed = c.responses.input_items.list(r.id)
    assert [(x.type, x.role, x.content[0].text) for x in listed.data] == [
        ("message", "user", "paint it"), ("message", "developer", "be brief")]
    assert all(x.id.startswith("msg_") for x in listed.data) and not listed.has_more
    asc = [x.id for x in c.responses.input_items.list(r.id, order="asc", limit=1)]  # (the SDK pages with after)
    assert asc == [x.id for x in reversed(listed.data)]
    r2 = c.responses.create(model="tiny", previous_response_id=r.id, input="again", max_output_tokens=2)
    chained = c.responses.input_items.list(r2.id, order="asc").data
    assert [x.id for x in chained] == [*asc, r.output[0].id, chained[-1].id] and chained[-1].content[0].text == "again"
    assert c.responses.delete(r.id) is None
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.retrieve(r.id)
    assert f"Response with id '{r.id}' not found" in e.value.message and e.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", previous_response_id=r.id, input="again", max_output_tokens=2)
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    assert r.id in e.value.message
    assert c.responses.retrieve(r2.id).previous_response_id == r.id  # (kept: its items its own)
    unkept = c.responses.create(model="tiny", input="paint it", max_output_tokens=2, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unkept.id)
    for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=msg_x", "after"), ("x=1", "x")):
        code, body = _get(url, f"/v1/responses/{r2.id}/input_items?{query}")
        assert code == 400 and body["error"]["param"] == param, (query, body)
    code, body = _post(url, f"/v1/responses/{r2.id}", {})  # (405 naming the methods the path takes)
    assert code == 405 and "takes GET, HEAD, DELETE" in body["error"]["message"], body


def test_the_store_keeps_the_most_recent_and_none_with_0(guided):
    """h78a: --responses-store N keeps the N most recent responses, the oldest dropped first (a
    404 saying why); 0 keeps none: store true is taken (false in the response, vLLM's default)
    and previous_response_id is a 400 naming --responses-store 0."""
    url, app = guided
    c = _client(url)
    c.responses.create(model="tiny", input="paint it", max_output_tokens=1)  # (the store made)
    size = app.kept.size
    try:
        app.kept.size = 2
        made = [c.responses.create(model="tiny", input="paint it", max_output_tokens=1).id for _ in range(3)]
        assert len(app.kept.kept) == 2
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.retrieve(made[0])
        assert "the 2 most recent" in e.value.message
        assert [c.responses.retrieve(m).id for m in made[1:]] == made[1:]
        app.kept.size = 0
        r = c.responses.create(model="tiny", input="paint it", max_output_tokens=1, store=True)
        assert r.store is False and len(app.kept.kept) == 2
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="tiny", input="x", previous_response_id=r.id, max_output_tokens=1)
        assert "--responses-store 0" in e.value.message
    finally:
        app.kept.size = size


def test_a_function_call_output_answers_the_previous_responses_call(hermes):
    """h78a: a function_call_output sent with previous_response_id answers the stored response's
    call (its call_id found there, as OpenAI finds it): the answer is the whole conversation's;
    one whose call_id no call has is a 400 naming the call_id (it was taken, a tool message
    answering nothing rendered)."""
    c = _client(hermes)
    r = c.responses.create(model="tiny", input=ASK[0]["content"], tools=FLAT, max_output_tokens=12,
                           extra_body={"stop": ["done"]})
    call = [x for x in r.output if x.type == "function_call"][0]
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    r2 = c.responses.create(model="tiny", previous_response_id=r.id, input=[out], tools=FLAT, max_output_tokens=4)
    back = [{"role": "user", "content": ASK[0]["content"]}, *[x.model_dump(exclude_none=True) for x in r.output], out]
    whole = c.responses.create(model="tiny", input=back, tools=FLAT, max_output_tokens=4, store=False)
    assert r2.usage.input_tokens == whole.usage.input_tokens and r2.output_text == whole.output_text
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", previous_response_id=r.id, input=[{**out, "call_id": "call_nope"}],
                           tools=FLAT, max_output_tokens=4)
    assert "call_id 'call_nope'" in e.value.message and e.value.param == "input"


def test_reasoning_tokens_are_the_tokens_generated_in_the_thinking(tmp_path):
    """h78a: usage.output_tokens_details.reasoning_tokens counts the tokens the model generated
    before </think> (the chat answer's logprob entries before the </think> one), whole and
    streamed. Under a byte-level decoder the thinking "w7" x 7 is one word of text: encoded
    again (how it was counted) it was 1 token (the unknown word), not the 7 generated."""
    from tokenizers import decoders

    from tests.cli.test_serve_reasoning import think_server

    with think_server(tmp_path, {0: "</think>", 13: "<think>"}, decoders.ByteLevel()) as (url, app):
        app.reasoning = "qwen3"
        c = _client(url)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w8"}], max_tokens=12,
                                         logprobs=True)
        tokens = [e.token for e in chat.choices[0].logprobs.content]
        assert chat.choices[0].message.model_dump()["reasoning"] == "w7" * 7 and tokens.index("</think>") == 7
        r = c.responses.create(model="tiny", input="w8", max_output_tokens=12)
        assert r.output[0].content[0].text == "w7" * 7 and r.usage.output_tokens_details.reasoning_tokens == 7
        events = _events(url, {"model": "tiny", "input": "w8", "max_output_tokens": 12})
        assert events[-1][1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] == 7
        cut = c.responses.create(model="tiny", input="w8", max_output_tokens=3)  # (cut in its thinking)
        assert cut.usage.output_tokens_details.reasoning_tokens == 3


def test_the_responses_store_option_reaches_the_server(worded, monkeypatch):  # noqa: F811
    """h78a: `specrt serve --responses-store 3` sizes the server's store (the server stopped as
    it would listen); the default is RESPONSES_STORE; a negative size is refused naming it."""
    from click.testing import CliRunner

    from specrt import cmd_serve
    from specrt.cli import main
    from specrt.errors import UserError

    sizes = []

    def make_server(app, host, port, tls=None):
        sizes.append(app.responses_store)
        raise UserError("stopped before listening")

    monkeypatch.setattr(cmd_serve, "make_server", make_server)
    for extra in (["--responses-store", "3"], []):
        r = CliRunner().invoke(main, ["serve", str(worded), "--port", "0", "--governor", "off", *extra])
        assert r.exit_code == 1 and "stopped before listening" in r.output, r.output
    assert sizes == [3, cmd_serve.RESPONSES_STORE]
    r = CliRunner().invoke(main, ["serve", str(worded), "--responses-store", "-1"])
    assert r.exit_code == 1 and "--responses-store" in r.output and "Traceback" not in r.output, r.output


def test_a_fresh_servers_404_names_its_store_and_an_odd_limit_is_a_400(guided):
    """w78f: GET /v1/responses/{id} before any response was made here (a server just started:
    its store not made yet) said "this server keeps no responses: --responses-store 0" though it
    keeps 64; its 404 says why as a made store's does. ?limit=² (a digit to str.isdigit, not to
    int) dropped the connection on a traceback; a 400 naming limit."""
    url, app = guided
    c = _client(url)
    r = c.responses.create(model="tiny", input="paint it", max_output_tokens=1)
    kept = app.kept
    try:
        app.kept = None  # (as a server just started)
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.retrieve(r.id)
        assert f"keeps the {app.responses_store} most recent" in e.value.message and "store 0" not in e.value.message
    finally:
        app.kept = kept
    code, body = _get(url, f"/v1/responses/{r.id}/input_items?limit=%C2%B2")
    assert code == 400 and body["error"]["param"] == "limit", body


def test_an_item_sent_again_with_previous_response_id_is_a_400(guided):
    """w78f: a client mixing the two ways of keeping a conversation (previous_response_id and
    ``input = [*r1.output, new]``) had r1's answer rendered twice (its prompt 4 tokens longer
    than the chained one's) and input_items listing its id twice, which the SDK's auto-paging
    (``after`` that id) went through for ever; OpenAI's 400 "Duplicate item found with id",
    naming input and the id, as for an id twice in one input. Nothing is kept for it."""
    url, app = guided
    c = _client(url)
    r1 = c.responses.create(model="tiny", input="paint it", max_output_tokens=2)
    n = len(app.kept.kept)
    again = {"role": "user", "content": "again"}
    for extra, sent in (({"previous_response_id": r1.id}, [*r1.output, again]), ({}, [*r1.output, *r1.output, again])):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="tiny", input=sent, max_output_tokens=2, **extra)
        assert e.value.param == "input" and f"Duplicate item found with id '{r1.output[0].id}'" in e.value.message
    assert len(app.kept.kept) == n
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="again", max_output_tokens=2)
    assert [x.id for x in c.responses.input_items.list(r2.id, limit=1)][1] == r1.output[0].id  # (once: pages end)


def test_cancel_is_no_such_path_and_input_items_takes_get_alone(guided):
    """w78f: the SDK's ``client.responses.cancel(id)`` (POST .../cancel) was a 405 "this path
    takes GET, HEAD, DELETE" (README: a 404; a GET there a 404 too): no background response
    runs here, so no such path; POST or DELETE .../input_items named DELETE among its methods
    (a DELETE there a 404 for a response 'X/input_items'): a 405 allowing GET, HEAD."""
    url, _ = guided
    c = _client(url)
    r = c.responses.create(model="tiny", input="paint it", max_output_tokens=1)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.cancel(r.id)
    assert "no such path: POST" in e.value.message
    import urllib.error
    import urllib.request

    for method in ("POST", "DELETE"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(f"{url}/v1/responses/{r.id}/input_items", b"{}",
                                                          method=method), timeout=30)
        assert e.value.code == 405 and e.value.headers["Allow"] == "GET, HEAD", (method, e.value.read())
    assert c.responses.retrieve(r.id).id == r.id and c.responses.input_items.list(r.id).data


def test_an_empty_answer_chained_is_its_assistant_turn(guided):
    """w78f: an answer with no text (a stop string at its first character) has no output item;
    chained by previous_response_id its turn was dropped, the two user turns run together (35
    prompt tokens against the 46 of the chat conversation a chat client sends back, its
    assistant message content ""). Its turn is an assistant message, content "", as the chat's."""
    url, _ = guided
    c = _client(url)
    first = c.responses.create(model="tiny", input="paint it", max_output_tokens=3).output_text[0]
    r1 = c.responses.create(model="tiny", input="paint it", max_output_tokens=3, extra_body={"stop": [first]})
    assert r1.output == [] and r1.status == "completed"
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="again", max_output_tokens=1)
    conv = [{"role": "user", "content": "paint it"}, {"role": "assistant", "content": ""},
            {"role": "user", "content": "again"}]
    code, tok = _post(url, "/tokenize", {"messages": conv})
    assert code == 200 and r2.usage.input_tokens == tok["count"]
    items = c.responses.input_items.list(r2.id, order="asc").data
    assert [(x.role, x.content[0].text) for x in items] == [("user", "paint it"), ("assistant", ""), ("user", "again")]


def test_a_stream_whose_client_left_is_kept_cancelled(worded):  # noqa: F811
    """h78j: a response streamed to a client that leaves mid-answer (a slow model, 0.2 s a
    piece; the client reads response.created and closes) was not kept: GET of the id its
    response.created gave was a 404. It is kept as far as it went, status "cancelled" (its
    text so far incomplete), and previous_response_id naming it is a 400, as for a failed one."""
    import socket
    import time

    with _in_process(worded, "off") as (app, httpd, url, logs):
        real = app.session.stream

        def slow(*a, **k):
            for piece in real(*a, **k):
                time.sleep(0.2)
                yield piece

        app.session.stream = slow
        body = json.dumps({"model": "tiny", "input": "w4 w2", "max_output_tokens": 40, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=30) as c:
            c.sendall(("POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            got = b""
            while b"response.output_text.delta" not in got:
                got += c.recv(4096)
        rid = got.split(b'"id": "', 1)[1].split(b'"', 1)[0].decode()
        deadline = time.time() + 30
        while not any("the client left" in line for line in logs) and time.time() < deadline:
            time.sleep(0.05)
        app.session.stream = real
        code, r = _get(url, f"/v1/responses/{rid}")
        assert code == 200 and r["status"] == "cancelled" and r["error"] is None, r
        assert [(x["type"], x["status"]) for x in r["output"]] == [("message", "incomplete")], r["output"]
        code, r = _post(url, "/v1/responses", {"input": "w1", "previous_response_id": rid, "max_output_tokens": 1})
        assert code == 400 and r["error"]["param"] == "previous_response_id" and "is cancelled" in r["error"]["message"]


def test_a_chain_past_the_context_says_its_earlier_turns_count(guided):
    """h78j (w78f's left): "again" chained after a long turn was a 400 "the prompt has 282
    tokens; the engines' context limit is 256 ...", and a chain that fits but for its
    max_output_tokens "This model's maximum context length is 256 ...": the user sent 2 tokens
    and read of a prompt it never wrote. Both name previous_response_id's conversation as in the
    prompt; the same input unchained does not."""
    url, _ = guided
    c = _client(url)
    r1 = c.responses.create(model="tiny", input="paint it " * 24, max_output_tokens=2)  # (232 prompt tokens)
    for extra in ({"input": "again " * 6}, {"input": "again", "max_output_tokens": 40}):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="tiny", previous_response_id=r1.id, **{"max_output_tokens": 2, **extra})
        assert "context l" in e.value.message and "'previous_response_id' conversation" in e.value.message, extra
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", input="paint it " * 30, max_output_tokens=2)
    assert "context l" in e.value.message and "previous_response_id" not in e.value.message


def test_truncation_auto_keeps_the_prompts_last_tokens_as_chats_truncate_prompt_tokens(guided):
    """truncation "auto" (it was a 400) is vLLM's mapping, chat's truncate_prompt_tokens -1: an input
    past the context is answered from the rendered prompt's last tokens, as many as the context
    (256) leaves beside max_output_tokens (the server's default, 8, where none is given): the
    answer and usage are chat's for the same messages cut so, whole and streamed, the response
    echoes "auto"; a chain past the context is answered too; "disabled" is the 400 it was, and
    another value a 400 naming 'truncation'."""
    url, _ = guided
    c = _client(url)
    long = "paint it " * 30
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="tiny", input=long, max_output_tokens=4, truncation="disabled")
    assert "context l" in e.value.message
    for asked, kept in (({"max_output_tokens": 4}, 252), ({}, 248)):
        r = c.responses.create(model="tiny", input=long, truncation="auto", **asked)
        chat = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": long}],
                                         extra_body={"truncate_prompt_tokens": -1},
                                         **({"max_tokens": asked["max_output_tokens"]} if asked else {}))
        assert r.truncation == "auto" and r.usage.input_tokens == chat.usage.prompt_tokens == kept, asked
        assert r.output_text == chat.choices[0].message.content and r.usage.output_tokens == \
            chat.usage.completion_tokens
        with c.responses.stream(model="tiny", input=long, truncation="auto", **asked) as s:
            events = list(s)
        done = events[-1].response  # (response.completed, or .incomplete: get_final_response raises on that)
        assert "".join(x.delta for x in events if x.type == "response.output_text.delta") == r.output_text
        assert (done.status, done.usage.input_tokens, done.truncation) == (r.status, kept, "auto")
    r1 = c.responses.create(model="tiny", input="paint it " * 24, max_output_tokens=2)
    r2 = c.responses.create(model="tiny", previous_response_id=r1.id, input="again " * 6, max_output_tokens=2,
                            truncation="auto")
    assert r2.usage.input_tokens == 254 and r2.truncation == "auto"
    assert c.responses.create(model="tiny", input="paint it", max_output_tokens=1).truncation == "disabled"
    code, body = _post(url, "/v1/responses", {"model": "tiny", "input": "paint it", "truncation": "middle"})
    assert code == 400 and body["error"]["param"] == "truncation" and "'auto' or 'disabled'" in \
        body["error"]["message"], body


def test_a_kept_responses_routes_are_counted_in_metrics(guided):
    """h78j (w78f's left): GET / DELETE /v1/responses/{id} and GET .../input_items were not in
    /metrics' specrt_requests_total (a POST's answer alone was counted), so a dashboard saw
    none of a chain's retrievals nor its 404s (a response dropped from the store). Each is
    counted as the SDK's call, by status."""
    url, _ = guided
    c = _client(url)
    r = c.responses.create(model="tiny", input="paint it", max_output_tokens=1)
    c.responses.retrieve(r.id)
    c.responses.input_items.list(r.id)
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as m:
        text = m.read().decode()
    counts = {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in text.splitlines() if ln.startswith("specrt_req"))}
    for series in ('endpoint="responses_retrieve",status="200"', 'endpoint="responses_input_items",status="200"',
                   'endpoint="responses_delete",status="200"', 'endpoint="responses_retrieve",status="404"'):
        assert counts.get(f"specrt_requests_total{{{series}}}", 0) >= 1, (series, counts)


def test_a_kept_responses_get_and_delete_are_logged(worded):  # noqa: F811
    """h79j (session 78's left): GET / DELETE /v1/responses/{id} and GET .../input_items each log
    a line with the method, the path and the status sent (a POST's answer alone was logged), a
    404 too."""
    with _in_process(worded) as (_, _, url, logs):
        c = _client(url)
        rid = c.responses.create(model="tiny", input="w1 w2", max_output_tokens=1).id
        c.responses.retrieve(rid)
        c.responses.input_items.list(rid)
        c.responses.delete(rid)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(rid)
        assert logs[-4:] == [f"[GET /v1/responses/{rid}: 200]", f"[GET /v1/responses/{rid}/input_items: 200]",
                             f"[DELETE /v1/responses/{rid}: 200]", f"[GET /v1/responses/{rid}: 404]"], logs


def test_a_call_left_without_its_output_before_a_message_is_a_400(hermes):
    """h78j (w78f's left): a response's function_call chained by previous_response_id with a
    user message instead of its function_call_output (a client whose loop forgot to run the
    tool) was taken: the model read a call answered by nothing. OpenAI's 400 "No tool output
    found for function call call_X" (param input; openai-agents-python#673), the same in one
    input; the call's output first, or an input that ends at the call, taken."""
    c = _client(hermes)
    r = c.responses.create(model="tiny", input=ASK[0]["content"], tools=FLAT, max_output_tokens=12,
                           extra_body={"stop": ["done"]})
    call = [x for x in r.output if x.type == "function_call"][0]
    user = {"role": "user", "content": "and now?"}
    back = [{"role": "user", "content": ASK[0]["content"]}, *[x.model_dump(exclude_none=True) for x in r.output]]
    for extra, sent in (({"previous_response_id": r.id}, [user]), ({"store": False}, [*back, user])):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model="tiny", input=sent, tools=FLAT, max_output_tokens=2, **extra)
        assert e.value.param == "input" and f"No tool output found for function call '{call.call_id}'" in \
            e.value.message, e.value.message
    out = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    assert c.responses.create(model="tiny", previous_response_id=r.id, input=[out, user], tools=FLAT,
                              max_output_tokens=2).status in ("completed", "incomplete")
    assert c.responses.create(model="tiny", input=back, tools=FLAT, max_output_tokens=2, store=False).id


def test_retrieve_takes_include_logprobs_and_stream_false(guided):
    """h78j (w78f's left): ``client.responses.retrieve(id, include=[...])`` and ``stream=False``
    were 400s ("query parameter 'include[]' is not supported here"), though OpenAI's GET takes
    both. include 'message.output_text.logprobs' gives the response as kept where it was made
    with that include (its logprobs there); made without it, a 400 saying the logprobs were not
    kept, not the same response without them. stream true (a background response's events
    replayed: none runs here) stays a 400 naming stream, saying why."""
    url, _ = guided
    c = _client(url)
    lp = "message.output_text.logprobs"
    r = c.responses.create(model="tiny", input="paint it", max_output_tokens=3, include=[lp], top_logprobs=2)
    assert r.output[0].content[0].logprobs
    got = c.responses.retrieve(r.id, include=[lp])
    assert got.model_dump() == c.responses.retrieve(r.id).model_dump() == c.responses.retrieve(r.id, stream=False) \
        .model_dump()
    plain = c.responses.create(model="tiny", input="paint it", max_output_tokens=3)
    for bad, param in (({"include": [lp]}, "include"), ({"include": ["reasoning.encrypted_content"]}, "include")):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.retrieve(plain.id, **bad)
        assert e.value.param == param, e.value.message
    code, body = _get(url, f"/v1/responses/{r.id}?stream=true")
    assert code == 400 and body["error"]["param"] == "stream" and "background" in body["error"]["message"], body


def test_two_first_responses_at_once_make_one_store(guided, monkeypatch):
    """The final read of session 78: the store is made at the first /v1/responses request, in that
    request's own thread (parsed before the engines' lock); two first requests at once each saw none,
    made a Store each, and the one made first was replaced, with the response kept in it lost (a 404
    for an id the server had answered with). One Store is made, under its lock. The Store's making is
    slowed here so that the two threads meet there, as they can on a loaded server."""
    import threading
    import time

    from specrt import responses

    url, app = guided
    made = []

    class Slow(responses.Store):
        def __init__(self, size, **kw):
            made.append(size)
            time.sleep(0.3)
            super().__init__(size, **kw)

    monkeypatch.setattr(responses, "Store", Slow)
    monkeypatch.setattr(app, "kept", None)
    body = {"model": "tiny", "input": "paint it", "max_output_tokens": 2}
    threads = [threading.Thread(target=app.respond_to, args=(dict(body),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [app.responses_store] and isinstance(app.kept, Slow)


def test_an_item_reference_is_the_kept_item_it_names(guided):
    """h79b: an item_reference input item ({"type": "item_reference", "id": ...}, or the id alone:
    the SDK's ItemReference has its type optional) is the kept item of that id, an output item of
    a kept response or one of its input items: the response is the one to the same conversation
    sent whole (its prompt's tokens, the tokens sampled with the same seed), and input_items lists
    the items named, under their ids. An id no kept response has is OpenAI's 404 "Item with id
    '...' not found" (param input), naming input[k].id; with --responses-store 0 it says so. Each
    was a 400 "this server finds none by id" before."""
    from specrt import responses

    url, app = guided
    c = _client(url)
    r1 = c.responses.create(model="tiny", input="paint it", max_output_tokens=3)
    asked = c.responses.input_items.list(r1.id).data[0].id
    again = {"role": "user", "content": "again"}
    r2 = c.responses.create(model="tiny", input=[{"type": "item_reference", "id": asked}, {"id": r1.output[0].id},
                                                 again], **_sampled())
    whole = c.responses.create(model="tiny", input=[{"role": "user", "content": "paint it"},
                                                    *[x.model_dump(exclude_none=True) for x in r1.output], again],
                               store=False, **_sampled())
    assert r2.usage.input_tokens == whole.usage.input_tokens and len(_tokens(r2)) == 6
    assert _tokens(r2) == _tokens(whole) and r2.output_text == whole.output_text
    listed = c.responses.input_items.list(r2.id, order="asc").data
    assert [x.id for x in listed[:2]] == [asked, r1.output[0].id] and listed[1].content[0].text == r1.output_text
    assert c.responses.retrieve(r1.id, extra_query={"user": "bob"}).id == r1.id  # (one client: ?user= ignored)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="tiny", input=[again, {"type": "item_reference", "id": "msg_nope"}],
                           max_output_tokens=1)
    assert e.value.param == "input" and e.value.body["message"].startswith(
        "input[1].id: Item with id 'msg_nope' not found")
    kept = app.kept
    try:
        app.kept = responses.Store(0)  # (as --responses-store 0 keeps them: none)
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.create(model="tiny", input=[{"type": "item_reference", "id": asked}], max_output_tokens=1)
        assert "input[0].id" in e.value.message and "--responses-store 0" in e.value.message
    finally:
        app.kept = kept


@pytest.fixture(scope="module")
def isolated(worded):  # noqa: F811
    """The URL of a server of the word-level engines with --isolate-clients."""
    import threading

    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams

    app = Server(worded, "fixed:3", SamplingParams(), 8, "tiny", log=lambda s: None, isolate=True)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    app.close()


def test_isolated_clients_keep_their_own_responses(isolated):
    """h79b: under --isolate-clients a kept response is the ``user``'s that made it (as the KV rows
    are): another user (or none) can neither retrieve it, list its input items, delete it, chain
    from it nor reference its items, and each is answered word for word as for an id never made
    (the same status, param, code and message, the id aside), so that ids do not leak. GET and
    DELETE, which have no body, name their user as ?user= (the SDK's extra_query). Its own user
    does all of these. Bob read, chained from and deleted Alice's response before."""
    c = _client(isolated)
    mine = {"extra_query": {"user": "alice"}}
    ra = c.responses.create(model="tiny", input="w3 w1", max_output_tokens=3, user="alice")
    never = "resp_" + "0" * 32

    def refused(call, rid: str, *args, **kw) -> tuple:
        with pytest.raises(openai.APIStatusError) as e:
            call(rid, *args, **kw)
        return e.value.status_code, e.value.body["param"], e.value.body["code"], e.value.message.replace(rid, "ID")

    for who in ({"extra_query": {"user": "bob"}}, {}):  # (bob; a client giving no user, the anonymous one)
        for call in (c.responses.retrieve, c.responses.input_items.list, c.responses.delete):
            assert refused(call, ra.id, **who) == refused(call, never, **who), call
        user = who.get("extra_query", {}).get("user")
        chain = lambda rid: c.responses.create(model="tiny", input="w4", previous_response_id=rid,  # noqa: E731
                                               max_output_tokens=1, user=user)
        assert refused(chain, ra.id)[:3] == (400, "previous_response_id", "previous_response_not_found")
        assert refused(chain, ra.id) == refused(chain, never)
        ref = lambda iid: c.responses.create(model="tiny", input=[{"type": "item_reference", "id": iid}],  # noqa: E731
                                             max_output_tokens=1, user=user)
        assert refused(ref, ra.output[0].id)[:2] == (404, "input")
        assert refused(ref, ra.output[0].id) == refused(ref, "msg_" + "0" * 32)
    assert c.responses.retrieve(ra.id, **mine).output_text == ra.output_text  # (not deleted by bob)
    assert [x.content[0].text for x in c.responses.input_items.list(ra.id, **mine)] == ["w3 w1"]
    r2 = c.responses.create(model="tiny", input="w4", previous_response_id=ra.id, max_output_tokens=1, user="alice")
    r3 = c.responses.create(model="tiny", input=[{"type": "item_reference", "id": ra.output[0].id}],
                            max_output_tokens=1, user="alice")
    assert r2.usage.input_tokens > r3.usage.input_tokens > 0
    assert c.responses.delete(ra.id, **mine) is None
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ra.id, **mine)
    anon = c.responses.create(model="tiny", input="w3 w1", max_output_tokens=1)  # (no user: the anonymous one's)
    assert c.responses.retrieve(anon.id).id == c.responses.retrieve(anon.id, extra_query={"user": ""}).id == anon.id


def test_a_clients_default_query_user_is_its_posts_user_too(isolated):
    """w79h: a client that names its user once, as the query's ?user= on every call (the SDK's
    default_query, which GET and DELETE need), makes its responses its user's: its POST's query
    was ignored, so the response was the anonymous user's, a 404 to the client's own GET and read
    by any client giving no user. A body's ``user`` other than the query's is a 400 naming it."""
    alice = openai.OpenAI(base_url=isolated + "/v1", api_key="x", default_query={"user": "alice"})
    r = alice.responses.create(model="tiny", input="w3 w1", max_output_tokens=2)
    assert alice.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        _client(isolated).responses.retrieve(r.id)
    assert alice.responses.create(model="tiny", input="w4", previous_response_id=r.id, max_output_tokens=1,
                                  user="alice").status in ("completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as e:
        alice.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "w3"}], max_tokens=1,
                                      user="bob")
    assert e.value.body["param"] == "user" and "?user='alice'" in e.value.body["message"]
