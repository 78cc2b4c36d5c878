"""Mutation round m77h over session 77's new serve code: specrt/responses.py (POST
/v1/responses, h77a), its hooks in specrt/cmd_serve.py and tool_calls.py's pythonic streaming
(h77c). Each test here kills a hand mutant that the suites of test_serve_responses.py and
test_serve_tools.py let live (its docstring names it: "m77h-N"), or guards a bug it showed.

Real engines: test_structured_dead_end.py's tiny Llama whose vocabulary spells only the
letters of "hello world" (no token writes "{"), test_serve_tools.py's bigram targets (hermes:
its tools engine, and its piece-by-piece writer of a call); the parsers' own tests call
tool_calls.Streamed and responses' functions on texts."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from tests.cli.test_serve import _in_process, _post  # noqa: E402
from tests.cli.test_serve_responses import _events, guided, hermes  # noqa: E402, F401  (fixtures)
from tests.cli.test_serve_tools import ASK  # noqa: E402


@pytest.fixture(scope="module")
def letters(tmp_path_factory):
    """The URL of a server of test_structured_dead_end.py's engines (no token writes "{")."""
    pytest.importorskip("llguidance")
    from tests.cli.test_structured_dead_end import _letters
    from tests.runtime.test_grammar import guided_engines

    with _in_process(guided_engines(tmp_path_factory.mktemp("letters"), _letters), "fixed:2") as (_, _, url, _):
        yield url


def test_a_dead_end_of_text_format_json_object_is_said_in_the_response_requests_names(letters):
    """m77h-1: text.format json_object whose grammar no token can continue (h77b's dead end):
    whole, a 400 whose param is "text" and whose message names text.format, not chat's
    response_format (its grammar's label, "response_format: ...", was left in chat's words);
    streamed (the dead end at the first token, before the stream's head) the same 400."""
    body = {"model": "tiny", "input": "hello", "max_output_tokens": 8, "text": {"format": {"type": "json_object"}}}
    code, r = _post(letters, "/v1/responses", body)
    assert code == 400 and r["error"]["param"] == "text", r
    assert r["error"]["message"].startswith("text.format: no token") and "response_format" not in r["error"]["message"]
    assert _post(letters, "/v1/responses", {**body, "stream": True}) == (code, r)


def test_a_response_requests_errors_name_its_fields_in_its_words(hermes):  # noqa: F811
    """m77h-2: the context overflow's counts in the response request's words ("N in the input",
    not chat's "in the messages": WORDS' entry dropped lived); m77h-5: a message with an empty
    content list is refused naming the item, as a string or a non-empty list of text parts is
    what it takes (the check dropped lived: an empty user turn rendered)."""
    code, r = _post(hermes, "/v1/responses", {"model": "tiny", "input": ASK, "max_output_tokens": 5000})
    assert code == 400 and r["error"]["param"] == "max_output_tokens", r
    assert " in the input, 5000 in the completion" in r["error"]["message"] and "messages" not in r["error"]["message"]
    code, r = _post(hermes, "/v1/responses", {"model": "tiny", "input": [{"role": "user", "content": []}]})
    assert code == 400 and r["error"]["param"] == "input" and "input[0].content: expected" in r["error"]["message"], r


def test_pythonic_streaming_sends_a_dotted_name_early_and_no_keyword_as_a_name():
    """A pythonic answer a character at a time (tool_calls.Streamed._read_py): m77h-p4: a dotted
    name cut at its dot ("[a.") waits for the rest, its header then sent before the end (the
    wait dropped, it was held to the end: the call came whole there); m77h-p5 / p9: a Python
    keyword as the call's name ("None(") or a keyword argument's ("None=") sends nothing of it
    (neither is a call ``message`` reads: the answer is text), where the checks dropped sent a
    header or an argument the end then took back as text."""
    from specrt.tool_calls import Streamed

    def streamed(text: str) -> tuple[list, list]:
        s = Streamed("pythonic")
        items = [c for k in range(len(text)) for c in s.push(0, text[k]).get("tool_calls", ())]
        return items, s.end(0, "stop")[0]

    items, end = streamed("[a.b(x=1)]")
    assert [c["function"] for c in items] == [{"name": "a.b", "arguments": ""}, {"arguments": '{"x": 1}'}] and end == []
    assert streamed("[None(x=1)]") == ([], [{"content": "[None(x=1)]"}])
    items, end = streamed("[f(None=1)]")
    assert [c["function"] for c in items] == [{"name": "f", "arguments": ""}] and end == [{"content": "[f(None=1)]"}]


def test_a_reasoning_item_sent_back_is_its_content_before_its_summary():
    """m77h-6 / 7: a reasoning item sent back with both its reasoning_text content and a summary
    (OpenAI's items carry both) is the next assistant message's reasoning_content from its
    content, its parts joined by newlines (content and summary swapped, or the parts joined
    without a newline, lived: the test server's items carry content alone, one part)."""
    from specrt.responses import messages

    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}],
            "content": [{"type": "reasoning_text", "text": "first"}, {"type": "reasoning_text", "text": "second"}]}
    got = messages({"input": [{"role": "user", "content": "w8"}, item, {"role": "assistant", "content": "ok"}]})
    assert got[1] == {"role": "assistant", "content": "ok", "reasoning_content": "first\nsecond"}


def test_input_items_map_onto_the_chats_turns():
    """How ``messages`` maps items the suites send none of: m77h-9: a reasoning item goes to the
    next assistant message alone (not every one after it); m77h-10: a reasoning item between an
    assistant message and a function_call starts the call's own turn, with that reasoning
    (glued to the message before, the reasoning was lost); m77h-11: a function_call after a
    reasoning item carries it; m77h-12: a function_call_output's text parts join by newlines,
    as a message's; m77h-13: ``instructions`` is a system message before the input (the
    suites' bigram answers and templates did not tell it from a user one)."""
    from specrt.responses import messages

    assert messages({"instructions": "be brief", "input": "x"}) == [{"role": "system", "content": "be brief"},
                                                                     {"role": "user", "content": "x"}]

    user, thought = {"role": "user", "content": "u"}, {"type": "reasoning", "content": [{"type": "x", "text": "t"}]}
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    tool = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    got = messages({"input": [user, thought, {"role": "assistant", "content": "a"}, user,
                              {"role": "assistant", "content": "b"}]})
    assert got[1]["reasoning_content"] == "t" and "reasoning_content" not in got[3]
    got = messages({"input": [user, {"role": "assistant", "content": "a"}, thought, call]})
    assert got[1:] == [{"role": "assistant", "content": "a"},
                       {"role": "assistant", "content": None, "tool_calls": [tool], "reasoning_content": "t"}]
    assert messages({"input": [user, thought, call]})[1] == {"role": "assistant", "content": None,
                                                              "tool_calls": [tool], "reasoning_content": "t"}
    out = {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "a"},
                                                                        {"type": "input_text", "text": "b"}]}
    assert messages({"input": [user, call, out]})[-1] == {"role": "tool", "tool_call_id": "c1", "content": "a\nb"}


def test_chat_body_takes_the_neutral_values_and_refuses_the_rest_naming_them():
    """``chat_body``'s checks at their edges: m77h-15: a function tool's null description or
    strict is left out (passed on, a template that writes the description wrote "None"); m77h-19: an unknown field sent
    null is taken (the SDK's); m77h-20: background false and m77h-22: truncation "disabled" are
    taken (what they ask is what is done); m77h-21: top_logprobs true is no integer; m77h-24:
    store must be a boolean; m77h-25: stream_options takes include_obfuscation."""
    from specrt.responses import Refused, chat_body

    chat = chat_body({"input": "x", "tools": [{"type": "function", "name": "f", "description": None, "strict": None}],
                      "foo": None, "background": False, "truncation": "disabled",
                      "stream_options": {"include_obfuscation": False}})
    assert chat["tools"] == [{"type": "function", "function": {"name": "f"}}] and "foo" not in chat
    for body, param in (({"top_logprobs": True}, "top_logprobs"), ({"store": "yes"}, "store"),
                        ({"reasoning": {"summary": ""}}, "reasoning")):
        with pytest.raises(Refused) as e:
            chat_body({"input": "x", **body})
        assert e.value.param == param, body


def test_a_triple_quoted_value_holds_nothing_after_it():
    """m77h-p15: a keyword's value opening with a triple-quoted string (\"\"\" is no string's
    start of one character: _py_value scans it whole) is sent once closed and the calls after
    it stream; read as the empty string "" then text, its newline made it malformed and held
    the rest of the answer to its end."""
    from specrt.tool_calls import Streamed, message

    text = '[f(t="""a\nb""", x=1), g(y=2)]'
    s = Streamed("pythonic")
    items = [c for k in range(len(text)) for c in s.push(0, text[k]).get("tool_calls", ())]
    whole = message(text, "stop", "pythonic")[0]["tool_calls"]
    assert [c["function"].get("name") for c in items if "id" in c] == ["f", "g"]
    assert "".join(c["function"]["arguments"] for c in items if c["index"] == 0) == whole[0]["function"]["arguments"]
    assert s.end(0, "stop") == ([], "tool_calls")


FLAT = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}]


def test_a_response_echoes_what_was_asked_and_its_events_join_to_it(hermes):  # noqa: F811
    """The response object's echoes and the stream's events against the whole answer (hermes, a
    message then a function call, logprobs included): m77h-29 parallel_tool_calls true unless
    false; m77h-30 tool_choice "auto" with tools and without (OpenAI's;
    "none" without them, as m77h pinned it, was not: h78a); m77h-31 top_logprobs 0 unless
    given; m77h-32 the temperature served; m77h-60 user; m77h-33 response.created's status
    "in_progress"; m77h-35 cached_tokens the prefix reused; m77h-42 function_call_arguments.done
    the arguments joined; m77h-43 the items done "completed"; m77h-44 / 49 output_text.done's
    logprobs the deltas' joined; m77h-50 / 53 the completed response's logprobs the whole
    answer's (text held back while a call may begin carries entries too); m77h-52 its specrt;
    m77h-62 a chat request's errors keep chat's names; m77h-38 an answer cut by
    max_output_tokens after its whole call: the response incomplete, its call "completed"."""
    code, r = _post(hermes, "/v1/responses", {"model": "tiny", "input": ASK, "max_output_tokens": 3, "user": "u1"})
    assert code == 200 and (r["parallel_tool_calls"], r["tool_choice"], r["top_logprobs"], r["user"]) == \
        (True, "auto", 0, "u1") and isinstance(r["temperature"], float), r  # (OpenAI's "auto" without tools; h78a)
    body = {"model": "tiny", "input": ASK, "tools": FLAT, "max_output_tokens": 12, "stop": ["done"],
            "include": ["message.output_text.logprobs"]}
    _post(hermes, "/v1/responses", body)
    code, r = _post(hermes, "/v1/responses", body)  # (the same prompt again: its prefix reused)
    assert code == 200 and [x["type"] for x in r["output"]] == ["message", "function_call"] and r["tool_choice"] == "auto"
    assert r["usage"]["input_tokens_details"]["cached_tokens"] == r["specrt"]["prefix_reused"] > 0, r["specrt"]
    events = _events(hermes, body)
    assert events[0][1]["response"]["status"] == "in_progress"
    assert [n for n, _ in events if not n.endswith(".delta")] == [  # (OpenAI's order; m77h-45: content_part.done)
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    done = {n: d for n, d in events if n in ("response.function_call_arguments.done", "response.output_text.done")}
    args = "".join(d["delta"] for n, d in events if n == "response.function_call_arguments.delta")
    assert done["response.function_call_arguments.done"]["arguments"] == args == r["output"][1]["arguments"]
    deltas = [e for n, d in events if n == "response.output_text.delta" for e in d["logprobs"]]
    assert done["response.output_text.done"]["logprobs"] == deltas and deltas
    assert [d["item"]["status"] for n, d in events if n == "response.output_item.done"] == ["completed", "completed"]
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["logprobs"] == r["output"][0]["content"][0]["logprobs"]
    assert set(final["specrt"]) == set(r["specrt"]) and final["status"] == "completed"
    code, r = _post(hermes, "/v1/responses", {**body, "max_output_tokens": 3})  # (cut after its whole call)
    assert r["status"] == "incomplete" and [(x["type"], x["status"]) for x in r["output"]] == \
        [("message", "completed"), ("function_call", "completed")], r["output"]
    code, c = _post(hermes, "/v1/chat/completions", {"model": "tiny", "messages": ASK, "max_tokens": 0})
    assert code == 400 and c["error"]["param"] == "max_tokens" and "'max_tokens'" in c["error"]["message"], c


def test_a_bracketed_value_streams_the_calls_after_it_and_a_broken_string_sends_no_more():
    """m77h-p23: a comma inside a value's brackets does not end it ([1, 2] sent once closed, the
    next call's header before the end; ended at its comma, "[1" was malformed and held the rest
    to the end); m77h-p18: a single-quoted string broken by a newline (no Python string: the
    answer is text) sends none of its characters after the break."""
    from specrt.tool_calls import Streamed

    def streamed(text: str) -> list:
        s = Streamed("pythonic")
        return [c for k in range(len(text)) for c in s.push(0, text[k]).get("tool_calls", ())]

    items = streamed("[f(x=[1, 2]), g(y=(3, 4))]")
    assert [c["function"].get("name") for c in items if "id" in c] == ["f", "g"]
    assert "".join(c["function"]["arguments"] for c in items) == '{"x": [1, 2]}{"y": [3, 4]}'
    assert "cd" not in "".join(c["function"]["arguments"] for c in streamed('[f(s="ab\ncd")]'))


def test_a_streamed_call_taken_back_is_not_a_completed_function_call(tmp_path_factory):
    """A call whose header and some arguments went, then cut by max_output_tokens inside its
    arguments (test_serve_tools.py's piece-by-piece writer): the whole response has no call (the
    answer is text, status incomplete), and the chat stream takes the call back (its rest as
    content, finish length); the response's stream gave its function_call item, arguments
    '{"path": "é.txt", "text": ' (no JSON), status "completed" in response.incomplete, which an
    agent runs. Now "incomplete" (OpenAI's status of a cut item), the item done so, and the
    streamed text joins to the whole response's (m77h)."""
    from tests.cli.test_serve_tools import TOOLS_WRITE, WORDS_PIECES, _calling, _serving

    gen = _serving(_calling(tmp_path_factory.mktemp("pieces"), words=WORDS_PIECES), ("hermes",))
    url = next(gen)["hermes"]
    try:
        body = {"model": "tiny", "input": ASK, "tools": [{"type": "function", **TOOLS_WRITE[0]["function"]}],
                "max_output_tokens": 8}
        code, r = _post(url, "/v1/responses", body)
        assert code == 200 and r["status"] == "incomplete" and [x["type"] for x in r["output"]] == ["message"], r
        events = _events(url, body)
        final = events[-1][1]["response"]
        calls = [x for x in final["output"] if x["type"] == "function_call"]
        assert calls and all(x["status"] == "incomplete" for x in calls), final["output"]
        assert [d["item"]["status"] for n, d in events if n == "response.output_item.done"
                and d["item"]["type"] == "function_call"] == ["incomplete"]
        assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == \
            r["output"][0]["content"][0]["text"] and final["status"] == "incomplete"
    finally:
        next(gen, None)


def test_pythonic_values_json_cannot_hold_send_nothing_and_a_whole_escape_streams_on():
    """m77h-p29 / p31: a keyword with no value ("x=)") or one JSON cannot hold (1e999: inf) is
    no call ``message`` reads: nothing of its value is sent (dropped checks sent '{"x": []' and
    '{"x": Infinity', no JSON, before the end took the call back); m77h-p26: a whole \\x41
    escape is read at once and the call after it streams (read as \\x4 cut short, it held the
    rest to the end); m77h-p34: a qwen3_coder object parameter written as the string "5" stays
    the string (only an object or array is read out of a string)."""
    from tests.cli.test_serve_tools import SCHEMAS
    from specrt.tool_calls import Streamed, message

    def streamed(text: str) -> list:
        s = Streamed("pythonic")
        return [c["function"] for k in range(len(text)) for c in s.push(0, text[k]).get("tool_calls", ())]

    assert streamed("[f(x=)]") == streamed("[f(x=1e999)]") == [{"name": "f", "arguments": ""}]
    items = streamed('[f(s="\\x41b"), g()]')
    assert items[-2:] == [{"name": "g", "arguments": ""}, {"arguments": "{}"}]
    assert "".join(c["arguments"] for c in items) == '{"s": "Ab"}{}'
    xml = '<tool_call>\n<function=f>\n<parameter=o>\n"5"\n</parameter>\n</function>\n</tool_call>'
    assert message(xml, "stop", "qwen3_coder", tools=SCHEMAS)[0]["tool_calls"][0]["function"]["arguments"] == \
        '{"o": "5"}'


def test_a_comment_in_a_pythonic_call_holds_it_to_the_end_where_it_is_whole():
    """m77h-p24: a comment inside a call (Python reads it, ``_pythonic`` too) holding a ")":
    streamed, the call goes whole at the end, as the whole answer's call; the comment scanned
    as text ended the value and the call at its ")", sent '{"x": 1}', and the end, finding
    that no prefix of the whole call's arguments, took the call back as text (finish stop)."""
    from tests.cli.test_serve_tools import _through
    from specrt.tool_calls import Streamed, message

    text = "[f(x=1 # )\n, y=2)]"
    whole = message(text, "stop", "pythonic")[0]["tool_calls"][0]["function"]
    content, calls, finish, _ = _through(Streamed("pythonic"), list(text))
    assert (content, [c[2:] for c in calls], finish) == ("", [("f", whole["arguments"])], "tool_calls")


def test_qwen3_coder_streams_past_a_stray_end_tag_and_reads_a_string_again_once():
    """m77h-p42: a string value holding a </parameter> that ends nothing (text follows it) and
    then its own: the next parameter streams before the answer's end (the stray tag counted
    below zero, no </parameter> ended the value while streaming: the rest held to the end);
    m77h-p43: an object parameter written as a string holding a string holding an array is read
    again once, as vLLM's (the string inside stays a string; read again and again, [1])."""
    from tests.cli.test_serve_tools import SCHEMAS
    from specrt.tool_calls import Streamed, message

    xml = ("<tool_call>\n<function=f>\n<parameter=s>\nuse </parameter> to end\n</parameter>\n<parameter=n>\n2\n"
           "</parameter>\n</function>\n</tool_call>")
    s = Streamed("qwen3_coder", tools=SCHEMAS)
    sent = "".join(c["function"]["arguments"] for k in range(len(xml)) for c in s.push(0, xml[k]).get("tool_calls", ()))
    assert sent == '{"s": "use </parameter> to end", "n": 2}' and s.end(0, "stop") == ([], "tool_calls")
    xml = '<tool_call>\n<function=f>\n<parameter=o>\n"\\"[1]\\""\n</parameter>\n</function>\n</tool_call>'
    assert message(xml, "stop", "qwen3_coder", tools=SCHEMAS)[0]["tool_calls"][0]["function"]["arguments"] == \
        '{"o": "\\"[1]\\""}'


def test_a_response_echoes_its_text_format(guided):  # noqa: F811
    """m77h-58: the response's ``text.format`` is the request's (json_schema with its name and
    schema), whole and in the stream's response.created, not {"type": "text"} whatever was asked."""
    from tests.runtime.test_grammar import SCHEMA

    url, _ = guided
    fmt = {"type": "json_schema", "name": "paint", "schema": SCHEMA, "strict": True}
    body = {"model": "tiny", "input": "paint it", "text": {"format": fmt}, "max_output_tokens": 4}
    code, r = _post(url, "/v1/responses", body)
    assert code == 200 and r["text"] == {"format": fmt}, r
    assert _events(url, body)[0][1]["response"]["text"] == {"format": fmt}


def test_a_cut_answer_after_its_reasoning_leaves_its_message_incomplete(tmp_path):
    """--reasoning-parser qwen3, cut by max_output_tokens in the message after the thinking:
    m77h-65: the message is "incomplete", the reasoning item "completed" (the first item marked,
    the reasoning was the cut one); m77h-63: reasoning_tokens counts the reasoning's tokens, as
    /tokenize does (not its characters: the suites checked > 0)."""
    from tests.cli.test_serve_reasoning import think_server

    with think_server(tmp_path, {0: "</think>", 13: "<think>"}) as (url, app):
        app.reasoning = "qwen3"
        code, r = _post(url, "/v1/responses", {"model": "tiny", "input": "w8", "max_output_tokens": 12})
        assert code == 200 and r["status"] == "incomplete", r
        assert [(x["type"], x["status"]) for x in r["output"]] == [("reasoning", "completed"), ("message", "incomplete")]
        thought = r["output"][0]["content"][0]["text"]
        code, tok = _post(url, "/tokenize", {"prompt": thought, "add_special_tokens": False})
        assert r["usage"]["output_tokens_details"]["reasoning_tokens"] == tok["count"] < len(thought), (tok, thought)
