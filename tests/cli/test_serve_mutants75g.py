"""Tests from a mutation round on session 75's function calling, reasoning parser and
connection changes (specrt/tool_calls.py, specrt/reasoning.py, runtime/text.py's tool
calls, specrt/prompt_files.py, specrt/cmd_serve.py's linger / pipelining / settle; m75g):
each kills a mutant the feature tests let live, named in its docstring."""

from __future__ import annotations

import json

import pytest

from specrt.tool_calls import Streamed, parse, request_tools
from tests.runtime.test_text import worded  # noqa: F401


def test_empty_tools_are_none_and_auto_without_tools_parses_nothing():
    """mutants m75g-02, m75g-05, m75g-06: ``tools: []`` is no tools (None to the template, as
    OpenAI and vLLM take it; kept as [], a template testing ``tools is not none``, Llama 3.1's,
    rendered its tool-calling prompt with no tools); ``tool_choice: "auto"`` without tools is
    not refused for want of --tool-call-parser, and with the parser set the answer is not
    parsed for calls the request never offered."""
    assert request_tools({"tools": []}, "hermes") == (None, None)
    assert request_tools({"tools": [], "tool_choice": "auto"}, None) == (None, None)
    assert request_tools({"tool_choice": "auto"}, None) == (None, None)
    assert request_tools({"tool_choice": "auto"}, "hermes") == (None, None)
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert request_tools({"tools": tools}, "hermes") == (tools, "hermes")


@pytest.mark.parametrize("tools", [{}, "", 0, False])
def test_tools_that_are_no_list_are_refused_even_where_empty(tools):
    """mutant m75g-01: a ``tools`` that is not a list is refused naming the field whatever its
    value; checked only where truthy, ``{}`` or ``""`` passed as no tools at all."""
    from specrt.tool_calls import ToolsRefused

    with pytest.raises(ToolsRefused) as e:
        request_tools({"tools": tools}, "hermes")
    assert e.value.param == "tools" and "'tools' must be a list" in str(e.value)


def test_the_parsers_over_texts_the_feature_tests_leave_out():
    """mutants m75g-19 (whitespace after <|python_tag|>), m75g-20 (llama3_json's calls joined
    by anything but ";": the character after an object skipped unread, so "{..}, {..}" gave
    two calls), m75g-23 (a call with an empty name), m75g-26 (arguments given as a JSON string
    of an object, as some models write them: that object)."""
    def calls(text, parser):
        content, got = parse(text, parser)
        return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got]

    assert calls('<|python_tag|> {"name": "a", "parameters": {"x": 1}}', "llama3_json") == (None, [("a", {"x": 1})])
    for bad in ('{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}',
                '{"name": "a", "parameters": {}} x{"name": "b", "parameters": {}}'):
        assert parse(bad, "llama3_json") == (bad, []), bad
    for bad in ('<tool_call>{"name": "", "arguments": {}}</tool_call>', ):
        assert parse(bad, "hermes") == (bad, []), bad
    assert parse('{"name": "", "parameters": {}}', "llama3_json") == ('{"name": "", "parameters": {}}', [])
    assert calls('<tool_call>{"name": "a", "arguments": "{\\"x\\": [1]}"}</tool_call>', "hermes") == \
        (None, [("a", {"x": [1]})])
    assert calls('{"name": "a", "parameters": "{}"}', "llama3_json") == (None, [("a", {})])


def test_streamed_calls_are_indexed_in_order():
    """mutant m75g-35: a streamed answer's calls each carry their own ``index`` (0, 1, ...):
    all given index 0, OpenAI's clients (which accumulate a call's deltas by index) merged
    two calls into one."""
    s = Streamed("hermes")  # (each call's header as its name is read, its arguments after: h76f)
    pushed = s.push(0, '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}'
                       '</tool_call>')
    deltas, finish = s.end(0, "stop")
    assert finish == "tool_calls"
    items = [c for d in (pushed, *deltas) for c in d.get("tool_calls", ())]
    assert [(c["index"], c["function"]["name"]) for c in items if "name" in c["function"]] == [(0, "a"), (1, "b")]
    # (call a's "{}", made at the end, before b's header and arguments: the SDK takes an index's change
    # as a call's end, w78l; before, b's arguments went first and a's "{}" after them)
    assert [(c["index"], c["function"]["arguments"]) for c in items if c["function"]["arguments"]] == \
        [(0, "{}"), (1, '{"x": 1}')]


def _text(root, template: str | None, added: tuple[str, ...] = (), special: tuple[str, ...] = ()):
    """A runtime Text of a word-level tokenizer in ``root`` with ``template``, ``added`` words
    added as tokens (not special) and ``special`` as special ones."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_tokens(list(added))
    tok.add_special_tokens(list(special))
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return Text(root)


def test_hermes_is_taken_where_its_tags_are_added_tokens_not_special_ones(tmp_path):
    """mutants m75g-11, m75g-13 and m75g-95: Qwen2.5's and Qwen3's tokenizers add <tool_call> and
    </tool_call> as tokens that are not special (an answer's text keeps them): hermes is not
    refused there (only special ones are left out of an answer); and a template that reads
    ``tools`` gets no note that it reads none, nor does a tokenizer without a template (it failed
    there: no template to read)."""
    from specrt.tool_calls import parser_problem, tools_unread

    reads = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    text = _text(tmp_path / "added", reads, added=("<tool_call>", "</tool_call>"))
    assert parser_problem(text, "hermes") is None and tools_unread(text) is None
    text = _text(tmp_path / "special", reads, special=("<tool_call>", "</tool_call>"))
    assert "marks </tool_call> and <tool_call> as special tokens" in parser_problem(text, "hermes")
    assert parser_problem(text, "llama3_json") is None
    assert tools_unread(_text(tmp_path / "none", None)) is None  # (no template: nothing to note; m75g-95)


def _apart(pieces, thinking=True):
    """What reasoning.Apart passes on for one choice's ``pieces`` ((text, logprob entries);
    text None: the choice's end), as (text or "end", entries), and its reasoning."""
    from specrt.reasoning import Apart

    def items():
        for n, (text, entries) in enumerate(pieces):
            if text is None:
                yield {"index": 0, "finish_reason": "stop", "logprobs": entries, "context": [], "tokens": n}
            else:
                yield {"index": 0, "text": text, "logprobs": entries, "context": [], "tokens": n + 1}

    a = Apart(items(), thinking)
    got = [(it.get("text", "end"), it["logprobs"]) for it in a]
    return got, a.reasoning[0]


def test_a_pieces_logprobs_held_with_its_text_go_with_the_next_item():
    """mutants m75g-49, m75g-50, m75g-51, m75g-52, m75g-59: a piece whose text is held back
    (``</th``, a tag's start) or is a tag alone passes nothing on; its logprob entries go with
    the choice's next item (the next piece's, the end's flush of what was held, or the finish),
    each once and in order. The feature's tokens each decode to a whole word, so no piece of
    theirs was held: dropped or misplaced, a held token's entry was missing from the stream."""
    assert _apart([("hm", [1]), ("</th", [2]), ("ink>ok", [3]), (None, [4])]) == \
        ([("", [1]), ("ok", [2, 3]), ("end", [4])], "hm")
    assert _apart([("hm", [1]), ("</think>", [2]), (None, [3])]) == ([("", [1]), ("end", [2, 3])], "hm")
    assert _apart([("hm", [1]), ("</th", [2]), (None, [3])]) == ([("", [1]), ("", [2]), ("end", [3])], "hm</th")


def test_a_prompt_closing_the_block_with_special_tokens_starts_the_answer_after_it(tmp_path):
    """mutant m75g-41: where the tokenizer makes <think> and </think> special tokens, the
    prompt's tail is read with them written (an answer's text, Text.decode, leaves them out):
    read without, the block the template closed (``<think> </think>``) was unseen and the whole
    answer taken as reasoning."""
    from specrt.reasoning import begins_thinking, prompt_tail

    text = _text(tmp_path, "{{ messages }}", special=("<think>", "</think>"))
    ids = text.tokenizer.encode("a <think> </think>").ids
    assert len(ids) == 3 and prompt_tail(text, ids).rstrip().endswith("</think>")
    assert not begins_thinking("qwen3", prompt_tail(text, ids), {})
    assert begins_thinking("qwen3", prompt_tail(text, ids[:2]), {})


def test_an_empty_answer_after_a_block_the_prompt_closed_keeps_its_empty_content():
    """mutant m75g-56: an answer that starts after the think block (the prompt closed it) has
    no reasoning (null) and its content as written, "" where it wrote nothing, as ``split``
    gives it; null content is for an answer that had a block and wrote nothing after it."""
    from specrt.reasoning import Apart, split

    for thinking, want in ((False, (None, "")), (True, ("", None))):
        a = Apart(iter(()), thinking)
        choices = [{"index": 0, "message": {"role": "assistant", "content": ""}}]
        a.fill(choices)
        m = choices[0]["message"]
        assert (m["reasoning"], m["content"]) == want == split("", thinking) and m["reasoning_content"] == want[0]


CALLS = ("{% for m in messages %}{{ m.role }}:{{ m.content }}{% if m.tool_calls is defined %} CALLS"
         "{% for c in m.tool_calls %} {{ c.function.name }}={{ c.function.arguments | tojson }}{% endfor %}"
         "{% endif %}|{% endfor %}")


def test_an_assistants_tool_calls_reach_the_template_as_tool_use_templates_expect(tmp_path):
    """mutants m75g-60, m75g-61, m75g-62: an empty ``tool_calls`` list is left out (the
    template's plain assistant turn, not a calling one with no calls); a call's arguments
    given as "" or null reach the template as {} (Llama 3.1's writes ``arguments | tojson``:
    "" or null there), as a JSON string the object it holds."""
    text = _text(tmp_path, CALLS)

    def call(args):
        return {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}

    ask = {"role": "user", "content": "q"}
    assert text.render_chat([ask, {"role": "assistant", "content": "x", "tool_calls": []}]) == "user:q|assistant:x|"
    got = text.render_chat([ask, {"role": "assistant", "content": None,
                                  "tool_calls": [call(""), call(None), call('{"a": 1}')]}])
    assert got == 'user:q|assistant: CALLS f={} f={} f={"a": 1}|', got


def test_a_chat_template_jinja_file_renders_tools_over_the_configs_named_tool_use_one(tmp_path):
    """mutant m75g-63: a tokenizer folder with chat_template.jinja (the template there, as
    transformers reads it over tokenizer_config.json's) renders a request with tools through
    that file too, not through the config's named "tool_use" template it overrides."""
    from specrt.runtime.text import Text

    _text(tmp_path, "")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": "config default"}, {"name": "tool_use", "template": "config tool_use"}]}))
    assert Text(tmp_path).render_chat("a", tools=[{"type": "function", "function": {"name": "f"}}]) == \
        "config tool_use"
    (tmp_path / "chat_template.jinja").write_text("file{% if tools %} with tools{% endif %}")
    text = Text(tmp_path)
    assert text.render_chat("a") == "file"
    assert text.render_chat("a", tools=[{"type": "function", "function": {"name": "f"}}]) == "file with tools"


def test_a_tool_calling_messages_missing_content_is_given_as_empty_text(tmp_path):
    """mutants m75g-67, m75g-68: an assistant message that calls tools with no content, or a
    null one, reaches the template with content "" (vLLM's; a template reading ``content``
    as a string, ``content | trim``, failed on a missing one); a null content with an empty
    ``tool_calls`` list is no tool-calling message, and refused naming it."""
    from specrt.errors import UserError

    text = _text(tmp_path, "{% for m in messages %}{{ m.role }}:{{ m.content is string }}|{% endfor %}")
    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    ask = {"role": "user", "content": "q"}
    for sent in ({"role": "assistant", "tool_calls": call}, {"role": "assistant", "content": None, "tool_calls": call}):
        assert text.prompt_text([ask, sent], chat=True) == "user:True|assistant:True|"
    with pytest.raises(UserError) as e:
        text.prompt_text([ask, {"role": "assistant", "content": None, "tool_calls": []}], chat=True)
    assert "messages[1]: expected an object with a string 'role' and a string" in str(e.value)


def test_a_refused_bodys_linger_ends_its_answer_at_once_and_stops_when_the_client_does(worded, monkeypatch):  # noqa: F811
    """mutants m75g-74, m75g-76, m75g-77: a refused 100-continue request's connection, lingered
    over (Handler._linger), says its end at once (shutdown(SHUT_WR)): a client reading to the
    close has it as soon as its answer, not after the linger's wait; the linger ends when the
    client closes (it spun on the closed socket to linger_most, its connection counted
    unanswered) or has been silent for linger_wait (not linger_most). linger_wait and
    linger_most are made long here so that each fault reads past the sockets' timeouts."""
    import socket
    import time

    from specrt.cmd_serve import Handler
    from tests.cli.test_serve import _in_process

    head = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 10\r\n\r\n")
    with _in_process(worded) as (app, httpd, url, logs):
        for wait, most, closes in ((30.0, 30.0, True), (0.3, 30.0, False)):
            monkeypatch.setattr(Handler, "linger_wait", wait)
            monkeypatch.setattr(Handler, "linger_most", most)
            c = socket.create_connection(httpd.server_address, timeout=5)
            c.sendall(head)
            out, t = b"", time.perf_counter()
            while chunk := c.recv(65536):  # (to the close: a TimeoutError past 5 s)
                out += chunk
            assert out.startswith(b"HTTP/1.1 404") and time.perf_counter() - t < 4, out[:200]
            if closes:
                c.close()
            t = time.perf_counter()
            assert app.settle(10), "the linger went on"  # (its connection's handler has ended)
            assert time.perf_counter() - t < 5
            app.settled = False
            c.close()


def test_the_settle_ends_as_the_last_answer_does_and_forgets_closed_kept_connections(worded):  # noqa: F811
    """mutants m75g-86 and m75g-87: a kept connection whose answer ends while the settle waits
    for it wakes the settle (it waited its whole timeout, then found nothing unanswered); and
    a kept connection that closed is no longer among the idle ones (each such connection's
    socket was held in Server.idle for the server's life)."""
    import socket
    import threading
    import time

    from tests.cli.test_serve import _answers, _in_process

    with _in_process(worded) as (app, httpd, url, logs):
        for _ in range(3):
            with socket.create_connection(httpd.server_address, timeout=5) as c:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                _answers(c, 1)
        deadline = time.time() + 10
        while (app.replying or app.idle) and time.time() < deadline:  # (each closed by its client)
            time.sleep(0.01)
        assert app.replying == 0 and not app.idle, app.idle
        real, written, go = app.session.stream, threading.Event(), threading.Event()

        def held(*a, **k):
            for n, piece in enumerate(real(*a, **k)):
                if n == 1:
                    written.set()
                    go.wait(30)
                yield piece

        app.session.stream = held
        req = json.dumps({"prompt": "w1 w2", "max_tokens": 4, "stream": True}).encode()
        with socket.create_connection(httpd.server_address, timeout=5) as c:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(req), req))
            assert written.wait(30)
            settled = []
            t = threading.Thread(target=lambda: settled.append((app.settle(20), time.perf_counter())))
            t.start()
            time.sleep(0.2)
            go.set()
            took = time.perf_counter()
            t.join(30)
            assert settled and settled[0][0] and settled[0][1] - took < 5, settled
        app.session.stream = real


def test_an_answer_nested_past_the_json_parser_is_content():
    """mutants m75g-90 and m75g-91: an answer whose call is JSON nested past the parser's depth
    (Python's raises RecursionError there, not ValueError) is content as any malformed call is,
    for either parser, not a 500."""
    for text, parser in (("[" * 100000, "llama3_json"), ('{"name": "a", "parameters": ' + "[" * 100000, "llama3_json"),
                         ("<tool_call>" + "[" * 100000 + "</tool_call>", "hermes"),
                         ('<tool_call>{"name": "a", "arguments": "' + "[" * 100000 + '"}</tool_call>', "hermes")):
        assert parse(text, parser) == (text, []), text[:40]


def test_each_choice_of_a_request_is_split_on_its_own():
    """mutant m75g-89: with n > 1, each choice's thinking is split by a splitter of its own:
    shared, the second choice began after the first one's </think>, its thinking taken as
    content."""
    from specrt.reasoning import Apart

    def items():
        for i in (0, 1):
            yield {"index": i, "text": "hm</think>ok", "logprobs": None, "context": [], "tokens": 1}
            yield {"index": i, "finish_reason": "stop", "logprobs": None, "context": [], "tokens": 1}

    a = Apart(items(), True)
    assert [(it["index"], it.get("text")) for it in a] == [(0, "ok"), (0, None), (1, "ok"), (1, None)]
    assert a.reasoning == {0: "hm", 1: "hm"}


def test_a_block_closed_earlier_in_the_prompt_does_not_close_the_answers():
    """mutant m75g-93: only a prompt that ends with ``</think>`` closes the answer's block; an
    earlier turn's block (a conversation's last tokens, the reasoning sent back) does not."""
    from specrt.reasoning import begins_thinking

    tail = "<think>\nhm\n</think>\n\nok<|im_end|>\n<|im_start|>user\nw<|im_end|>\n<|im_start|>assistant\n"
    for parser in ("qwen3", "deepseek_r1"):
        assert begins_thinking(parser, tail, {}) and begins_thinking(parser, tail + "<think>\n", {})
        assert not begins_thinking(parser, tail + "<think>\n\n</think>\n\n", {})
