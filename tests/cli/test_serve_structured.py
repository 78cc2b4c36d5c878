"""`specrt serve`'s structured output (h76a): response_format json_object / json_schema, vLLM's
guided_json / guided_regex / guided_choice / guided_grammar and structured_outputs, and
tool_choice "required" or a named function held to their JSON schemas, as vLLM answers them,
on /v1/chat/completions and /v1/completions, whole and streamed, through the OpenAI SDK.

Real engines: tests/runtime/test_grammar.py's tiny Llama with a byte-level BPE tokenizer and a
random P-EAGLE draft, served with a speculative governor (fixed:2 with prompt lookup)."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from tests.cli.test_serve import _in_process, _post  # noqa: E402
from tests.cli.test_serve_tools import _streamed  # noqa: E402
from tests.runtime.test_grammar import REGEX, SCHEMA, guided_engines  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "paint", "description": "Paint it", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "stop"}}]
ASK = [{"role": "user", "content": "paint it"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(url, app) of a server of guided_engines, governor fixed:2:ngram."""
    with _in_process(guided_engines(tmp_path_factory.mktemp("structured")), "fixed:2:ngram") as (app, _, url, _):
        yield url, app


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _matches_schema(text: str) -> bool:
    obj = json.loads(text)
    assert set(obj) == {"color", "ok"} and obj["color"] in ("red", "green", "blue") and isinstance(obj["ok"], bool)
    return True


def test_a_json_schema_response_format_holds_the_answer_whole_and_streamed(server):
    """The SDK's response_format json_schema: the message is JSON of the schema, finish "stop";
    streamed, the deltas join to the same text. Fails without the feature (a 400)."""
    url, _ = server
    c = _client(url)
    fmt = {"type": "json_schema", "json_schema": {"name": "paint", "schema": SCHEMA, "strict": True}}
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, max_tokens=60)
    _matches_schema(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    chunks = c.chat.completions.create(model="tiny", messages=ASK, response_format=fmt, max_tokens=60, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
    r = c.chat.completions.create(model="tiny", messages=ASK, response_format={"type": "json_object"}, max_tokens=60)
    assert r.choices[0].message.content.startswith("{")  # (any object: a random model's is cut by max_tokens)


@pytest.mark.parametrize("extra, check", [
    ({"guided_regex": REGEX}, lambda s: re.fullmatch(REGEX, s)),
    ({"guided_choice": ["yes", "no", "maybe"]}, lambda s: s in ("yes", "no", "maybe")),
    ({"guided_json": SCHEMA}, _matches_schema), ({"guided_json": json.dumps(SCHEMA)}, _matches_schema),
    ({"guided_grammar": 'start: "[" item ("," item)? "]"\nitem: "a" | "b"'},
     lambda s: re.fullmatch(r"\[[ab](,[ab])?\]", s)),
    ({"guided_grammar": 'root ::= "yes" | "no"'}, lambda s: s in ("yes", "no")),  # (GBNF, llama.cpp's)
    ({"structured_outputs": {"regex": REGEX}}, lambda s: re.fullmatch(REGEX, s)),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda s: s in ("yes", "no"))])
def test_vllms_guided_fields_hold_completions_and_chats(server, extra, check):
    """vLLM's guided_* and structured_outputs, on completions and chats, whole and streamed:
    the text matches, finish "stop"."""
    url, _ = server
    c = _client(url)
    r = c.completions.create(model="tiny", prompt="hello", max_tokens=60, extra_body=extra)
    assert check(r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="hello", max_tokens=60, extra_body=extra, stream=True) if ch.choices)
    assert streamed == r.choices[0].text
    m = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, extra_body=extra).choices[0].message
    assert check(m.content), m.content


@pytest.mark.parametrize("parser", [None, "hermes"])
def test_tool_choice_required_and_named_come_back_as_tool_calls(server, parser):
    """tool_choice "required": the answer is held to vLLM's array of {name, parameters} and comes
    back as tool_calls (content "", finish "tool_calls"; with parallel_tool_calls false an
    array of one call; cut by max_tokens its whole calls, finish "length"); a named function: one call of it whose
    arguments are the answer, held to its parameters (finish "stop", as vLLM's); streamed, a
    call's header then its arguments piece by piece (h78d: one delta a call at the end), joined
    the whole answer's; cut inside a call, streamed or not, the text, finish "length". With
    --tool-call-parser on or off. Fails without the feature (a 400)."""
    url, app = server
    app.tool_call_parser = parser
    try:
        c = _client(url)
        r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
                                      parallel_tool_calls=False)  # (one call: this random model writes on)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content == "" and len(ch.message.tool_calls) == 1
        call = ch.message.tool_calls[0]
        assert call.id.startswith("call_") and call.function.name in ("paint", "stop")
        assert _matches_schema(call.function.arguments) if call.function.name == "paint" else \
            call.function.arguments == "{}"
        _streams_as_whole(url, r.choices[0], tool_choice="required", max_tokens=120, parallel_tool_calls=False)
        # an array cut by max_tokens inside a call (its whole calls where it is cut between them, finish "length", as
        # the parsers give them: unit tests): the text; streamed, the calls went before it (a second call's header)
        for cut in (60, 8):
            r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                          max_tokens=cut)
            assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith('[{"name": ')
            assert not r.choices[0].message.tool_calls
            calls = _streams_as_whole(url, r.choices[0], tool_choice="required", max_tokens=cut)
            assert [(c["name"], bool(c["arguments"])) for c in calls.values()] == \
                ([("paint", True), ("paint", False)] if cut == 60 else [])
        named = {"type": "function", "function": {"name": "paint"}}
        r = c.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60)
        ch = r.choices[0]
        assert ch.finish_reason == "stop" and ch.message.content == "" and len(ch.message.tool_calls) == 1
        assert ch.message.tool_calls[0].function.name == "paint"
        _matches_schema(ch.message.tool_calls[0].function.arguments)
        _streams_as_whole(url, ch, tool_choice=named, max_tokens=60)
    finally:
        app.tool_call_parser = None


def _streams_as_whole(url: str, whole, **body) -> dict:
    """``body`` streamed: content, calls (ids aside) and finish_reason joined are ``whole``'s (the
    choice of the same request, not streamed), each call's header first (arguments ""), then its
    arguments in pieces; the calls joined."""
    code, events = _post(url, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "stream": True, **body})
    [o] = _streamed(events)
    items = [t for e in events for ch in e["choices"] for t in ch["delta"].get("tool_calls") or ()]
    assert code == 200 and o["finish_reason"] == whole.finish_reason and o["content"] == whole.message.content
    assert [(c["name"], c["arguments"]) for c in o["tool_calls"].values()] == \
        [(t.function.name, t.function.arguments) for t in whole.message.tool_calls or ()] or not whole.message.tool_calls
    for k in o["tool_calls"]:
        mine = [t for t in items if t["index"] == k]
        assert mine[0]["function"]["arguments"] == "" and mine[0]["id"].startswith("call_")
        assert len(mine) > 2 or not o["tool_calls"][k]["arguments"]  # (a header alone: cut before its arguments)
    return o["tool_calls"]


@pytest.mark.parametrize("body, param, words", [
    ({"guided_regex": "[0-9"}, "guided_regex", "guided_regex: "),
    ({"guided_json": "{nope"}, "guided_json", "a JSON schema given as text must be JSON"),
    ({"guided_json": {"type": "wat"}}, "guided_json", "guided_json: "),
    ({"guided_choice": []}, "guided_choice", "expected a non-empty list"),
    ({"guided_grammar": "start: nothere"}, "guided_grammar", "guided_grammar: "),
    ({"response_format": {"type": "json_schema"}}, "response_format", "expected {'type': 'json_schema'"),
    ({"response_format": {"type": "yaml"}}, "response_format", "'response_format' must be"),
    # m76i-13: a response_format without its type (or not an object) is refused, not taken as text
    ({"response_format": {"json_schema": {"name": "x", "schema": SCHEMA}}}, "response_format",
     "'response_format' must be"),
    ({"response_format": "json_object"}, "response_format", "'response_format' must be"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex",
     "'response_format' and 'guided_regex': one structured output a request"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "an object of one of"),
    # m76i-11: a named function 'tools' has not is a 400 naming tool_choice (an IndexError, a 500, without the check)
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "'tool_choice' names the function 'nope', which 'tools' has not"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice", "one structured output"),
    # m76i-8: structured_outputs' json_object is true or left out (false held the answer to JSON)
    ({"structured_outputs": {"json_object": False}}, "structured_outputs",
     "'structured_outputs.json_object' must be true; got False"),
    # h79e: structural tags and JSON whitespace options of shapes specrt does not take
    ({"response_format": {"type": "structural_tag", "structures": [{"begin": "<g>", "schema": {}, "end": "</g>"}],
                          "triggers": ["<f"]}}, "response_format",
     "response_format.structures[0].begin: '<g>' starts with none of the triggers"),
    ({"response_format": {"type": "structural_tag", "triggers": ["<f"]}}, "response_format",
     "response_format: expected {'structures'"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                               "content": {"type": "any_text"}}}},
     "response_format", "'response_format.format': only xgrammar's {'type': 'triggered_tags', ...}"),
    ({"response_format": {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f"],
                                                               "tags": [], "stop_after_first": True}}},
     "response_format", "'response_format.format.stop_after_first' is not supported"),
    ({"structured_outputs": {"structural_tag": "{nope"}}, "structured_outputs",
     "'structured_outputs.structural_tag': a structural tag given as text must be JSON"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " "}}, "structured_outputs",
     "'structured_outputs.whitespace_pattern' applies to JSON (a JSON schema, json_object, a structural tag's "
     "schemas); the answer is held to a regex"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "no structured output is asked for"),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": "["}, "guided_whitespace_pattern",
     "'guided_whitespace_pattern': "),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": "", "structured_outputs": {"disable_any_whitespace": True}},
     "structured_outputs", "'guided_whitespace_pattern' and 'structured_outputs.disable_any_whitespace': one JSON "
                           "whitespace option a request"),
    ({"guided_json": SCHEMA, "structured_outputs": {"disable_any_whitespace": "yes"}}, "structured_outputs",
     "'structured_outputs.disable_any_whitespace' must be true or false"),
])
def test_a_bad_structured_output_is_a_400_naming_its_field(server, body, param, words):
    url, _ = server
    code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **body})
    assert code == 400 and r["error"]["param"] == param and words in r["error"]["message"], r
    code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2})  # (the server goes on)
    assert code == 200


def test_a_schema_past_llguidances_parser_limits_is_a_400_not_a_500(server):
    """w76j: an object of 600 optional properties (a pydantic model's Optional fields) compiles,
    then its first token passes llguidance's 2000 items a row: the answer was a 500 "InternalError:
    guided decoding: the matcher refused token 261 it allowed", carrying llguidance's parser state,
    and counted as an engine failure. It is the request's schema: a 400 naming it and the limit
    (its param the field, not "messages")."""
    url, app = server
    props = {f"f{i}": {"enum": ["a", "b"]} for i in range(600)}
    fmt = {"type": "json_schema", "json_schema": {"name": "wide", "schema": {"type": "object", "properties": props}}}
    failures = app.metrics.counts["engine_failures"]
    for stream in (False, True):
        code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "response_format": fmt,
                                                      "stream": stream})
        assert code == 400 and r["error"]["param"] == "response_format", r
        said = r["error"]["message"]
        assert said.startswith("response_format.json_schema.schema: too large or ambiguous for llguidance's parser")
        assert said.count("max is 2000") == 1 and "<state>" not in said and "InternalError" not in said
    assert app.metrics.counts["engine_failures"] == failures


def test_vllms_structured_outputs_options_are_taken_and_its_whitespace_options_held(server):
    """w76j: vLLM's structured_outputs options disable_any_whitespace, disable_additional_properties
    and disable_fallback were a 400 "'structured_outputs' must be an object of one of json, ..."
    that named none of them; taken since. h79e: the JSON's whitespace is theirs:
    disable_any_whitespace true writes it compact ({"color":"red","ok":true}, as vLLM's llguidance
    backend under its server option; it was json.dumps's ", " and ": "), and so does a whitespace
    pattern "" (guided_whitespace_pattern, structured_outputs.whitespace_pattern: a 400 "not
    supported" until h79e); options alone in structured_outputs go with response_format's
    constraint (vLLM lays response_format over them); json.dumps's layout without them."""
    url, _ = server
    so = {"json": SCHEMA, "disable_any_whitespace": True, "disable_additional_properties": True,
          "disable_fallback": False}
    compact = lambda s: s == json.dumps(json.loads(s), separators=(",", ":"))  # noqa: E731
    fmt = {"type": "json_schema", "json_schema": {"name": "paint", "schema": SCHEMA}}
    for body, layout in [({"structured_outputs": so}, compact),
                         ({"guided_json": SCHEMA, "guided_whitespace_pattern": ""}, compact),
                         ({"response_format": fmt, "structured_outputs": {"whitespace_pattern": ""}}, compact),
                         ({"response_format": fmt, "structured_outputs": {"disable_any_whitespace": True}}, compact),
                         ({"structured_outputs": {"json": SCHEMA, "whitespace_pattern": "[ ]?"}},
                          lambda s: not re.search(r"\s\s|[\n\r\t]", s)),
                         ({"response_format": fmt}, lambda s: s == json.dumps(json.loads(s))),
                         ({"response_format": {"type": "json_object"},
                           "structured_outputs": {"whitespace_pattern": ""}},
                          lambda s: s.startswith("{") and not re.search(r"[\n\r\t]|[,:] ", s))]:
        for path, ask in (("/v1/chat/completions", {"messages": ASK}), ("/v1/completions", {"prompt": "hello"})):
            code, r = _post(url, path, {**ask, "max_tokens": 60, **body})
            assert code == 200, r
            said = r["choices"][0]["message"]["content"] if "messages" in ask else r["choices"][0]["text"]
            if "response_format" not in body or body["response_format"]["type"] != "json_object":
                assert _matches_schema(said), said
            assert layout(said), (body, said)


def _tokens(url, **body) -> list[str]:
    """The greedy chat answer's tokens (their text, from logprobs) under ``body``."""
    r = _client(url).chat.completions.create(model="tiny", messages=ASK, max_tokens=30, temperature=0, logprobs=True,
                                             **body)
    return [t.token for t in r.choices[0].logprobs.content]


def _tag(trigger: str) -> dict:
    return {"structures": [{"begin": trigger + "=paint>", "schema": SCHEMA, "end": "</t>"}], "triggers": [trigger]}


def test_a_structural_tag_holds_the_structure_its_trigger_starts(server):
    """vLLM's response_format structural_tag (through the SDK), structured_outputs.structural_tag
    (its JSON text) and xgrammar's triggered_tags format: free text up to a trigger (two tokens
    the answer writes in free text), then the rest of the begin, JSON of the schema (compact
    with disable_any_whitespace) and the end; the three give the same answer, finish "length"
    or "stop", streamed as whole. Fails without structural tags (a 400)."""
    url, _ = server
    c = _client(url)
    free = _tokens(url, response_format={"type": "structural_tag", **_tag("\x01q")})  # (never triggered)
    at = next(k for k in range(len(free) - 1) if (free[k] + free[k + 1]).isascii()
              and (free[k] + free[k + 1]).strip() and "".join(free[:k + 2]).find(free[k] + free[k + 1]) == len(
                  "".join(free[:k])))
    trig, head = free[at] + free[at + 1], "".join(free[:at + 2]) + "=paint>"
    fmt = {"type": "structural_tag", **_tag(trig)}
    xgr = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [trig], "tags": [
        {"begin": trig + "=paint>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</t>"}]}}
    answers = []
    for extra, sep in [({"response_format": fmt}, (", ", ": ")),
                       ({"extra_body": {"structured_outputs": {"structural_tag": json.dumps(fmt)}}}, (", ", ": ")),
                       ({"response_format": xgr}, (", ", ": ")),
                       ({"response_format": fmt,
                         "extra_body": {"structured_outputs": {"disable_any_whitespace": True}}}, (",", ":"))]:
        r = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0, **extra)
        said = r.choices[0].message.content
        assert said.startswith(head) and "</t>" in said[len(head):], said
        body = said[len(head): said.index("</t>", len(head))]
        assert _matches_schema(body) and body == json.dumps(json.loads(body), separators=sep), body
        chunks = c.chat.completions.create(model="tiny", messages=ASK, max_tokens=60, temperature=0, stream=True,
                                           **extra)
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == said
        answers.append(said)
    assert answers[0] == answers[1] == answers[2] != answers[3]


def test_tool_choice_required_holds_the_answer_to_one_call_at_least(server):
    """m76i-9: tool_choice "required" calls a function: its array is never empty (vLLM's schema,
    minItems 1): after "[" only an object may come, "]" never. Mutant: minItems left out (an
    empty array allowed: an answer of no call, finish "tool_calls")."""
    from specrt.cmd_serve import forced_tools

    _, app = server
    text = app.session.text
    guide = app.session.grammar_of(forced_tools("required", TOOLS)[1]).guide()
    for t in text.tokenizer.encode("[").ids:
        guide.consume(t)
    starts = {text.decode([int(t)])[:1] for t in guide.allowed().nonzero()[0]}
    assert starts == {"{"}, starts


def test_a_forced_answer_streamed_is_the_whole_ones_calls_and_text(server):
    """m76i-12: streamed forced tool choices give what the whole answer gives: "required" with
    parallel calls, its calls' deltas joined by index 0, 1, ... (the whole answer's calls, in
    order; in pieces since h78d); cut by max_tokens inside a call, its text as content, finish "length"; a
    named function without parameters, an object of arguments. Mutants: every streamed call
    indexed 0, a cut answer's text dropped from the stream, a parameterless function's schema
    left empty (any JSON value: this model's answer is then no object)."""
    url, _ = server
    for extra in ({"tool_choice": "required", "max_tokens": 120}, {"tool_choice": "required", "max_tokens": 8},
                  {"tool_choice": {"type": "function", "function": {"name": "stop"}}, "max_tokens": 30}):
        body = {"messages": ASK, "tools": TOOLS, **extra}
        code, whole = _post(url, "/v1/chat/completions", body)
        assert code == 200, whole
        msg, finish = whole["choices"][0]["message"], whole["choices"][0]["finish_reason"]
        code, events = _post(url, "/v1/chat/completions", {**body, "stream": True})
        [o] = _streamed(events)
        assert code == 200 and events[-1]["choices"][0]["finish_reason"] == finish and o["content"] == msg["content"]
        if msg.get("tool_calls"):  # (a call cut after its header went stays with the client: tool_calls.Streamed)
            assert list(o["tool_calls"]) == list(range(len(msg["tool_calls"])))
            assert [(c["name"], c["arguments"]) for c in o["tool_calls"].values()] == \
                [(t["function"]["name"], t["function"]["arguments"]) for t in msg["tool_calls"]]
        if extra["tool_choice"] != "required":  # (its object's keys run on to max_tokens: left as text)
            assert (msg["content"] or msg["tool_calls"][0]["function"]["arguments"]).startswith("{"), msg
        elif extra["max_tokens"] == 8:
            assert finish == "length" and msg["content"].startswith('[{"name": ') and not msg.get("tool_calls")
