"""`specrt serve --tool-call-parser`: function calling (h75a). A request's ``tools`` reach
the chat template, the tool calls the model writes come back as OpenAI's ``tool_calls``
(whole and streamed), as vLLM's hermes and llama3_json parsers read them.

The end-to-end tests run real engines of the bigram target (fixtures_models: its greedy
next token a fixed function of the current one, the chain 3 -> 4 -> ... -> 15 -> 3) under a
word-level tokenizer whose words along the chain spell a tool call, and a chat template of
its own in Qwen3's hermes style: the last word of the prompt (the template's ``cue``)
picks where on the chain the answer starts, a stop string where it ends."""

from __future__ import annotations

import json
import threading

import pytest

from specrt.runtime.sampling import SamplingParams
from specrt.tool_calls import ForcedCalls, Streamed, forced_message, message, parse
from tests.cli.test_serve import _post

CALL = '{"name":"get_weather","arguments":{"city":"Paris"}}'  # hermes' call, one word
LLAMA_CALL = '{"name":"get_weather","parameters":{"city":"Paris"}}'
# the words by id: 3 .. 15 the bigram chain (after 15: 3 again); the answer after <|assistant|> (3)
# is "Sure. <tool_call> CALL </tool_call> done ...", after "done" (8) LLAMA_CALL, after "end" (10) text
WORDS = ["<unk>", "<|user|>", "<|tools|>", "<|assistant|>", "Sure.", "<tool_call>", CALL, "</tool_call>", "done",
         LLAMA_CALL, "end", "Hello", "world", "!", "bye", "<|end|>"]
# a tools-aware template written for these tests in the manner of Qwen3's (hermes): the tools' JSON
# after <|tools|>, an assistant's calls as <tool_call> blocks, a tool's result in the user's turn
TEMPLATE = (
    "{%- if tools %}<|tools|> {% for t in tools %}{{ t | tojson }} {% endfor %}{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls is defined %}<|assistant|> {{ m.content }} "
    "{%- for c in m.tool_calls %}<tool_call> "
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    " </tool_call> {% endfor %}"
    "{%- elif m.role == 'tool' %}<|user|> <tool_response> {{ m.content }} </tool_response> "
    "{%- else %}<|{{ m.role }}|> {{ m.content }} {% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ cue if cue is defined else '<|assistant|>' }}{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "weather in Paris?"}]


def _calling(root, special: tuple[str, ...] = (), template: str = TEMPLATE, words: list[str] = WORDS):
    """Engines in ``root``/"e" of the bigram target (no draft, depth 1, context 256) with ``words``'
    tokenizer (``special``: words it marks special tokens) and ``template``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import _bigram_target

    t, _, _ = _bigram_target(root / "t", "llama", 1e-3)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(special))
    tok.save(str(t / "tokenizer.json"))
    (t / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    export(t, None, root / "x")
    build_engines(root / "x", "onnxruntime", (1,), root / "e", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=256)
    return root / "e"


@pytest.fixture(scope="module")
def calling(tmp_path_factory):
    return _calling(tmp_path_factory.mktemp("calling"))


@pytest.fixture(scope="module")
def servers(calling):
    """Two servers of those engines: --tool-call-parser hermes and llama3_json ({name: url})."""
    yield from _serving(calling, ("hermes", "llama3_json"))


def _serving(engines, parsers):
    """Servers of ``engines``, one a parser, started as `serve` starts them (parser_problem, which
    for mistral keeps its [TOOL_CALLS] in answers), yielded as {parser: url}, then stopped."""
    from specrt.cmd_serve import Server, make_server
    from specrt.tool_calls import parser_problem

    out, stops = {}, []
    for parser in parsers:
        app = Server(engines, "off", SamplingParams(), 16, "tiny", log=lambda s: None)
        app.tool_call_parser = parser
        assert parser_problem(app.session.text, parser) is None
        httpd = make_server(app, "127.0.0.1", 0)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        out[parser] = f"http://127.0.0.1:{httpd.server_address[1]}"
        stops.append((httpd, app))
    yield out
    for httpd, app in stops:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def _chat(url: str, **body) -> tuple[int, dict | list]:
    return _post(url, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, **body})


def test_the_tools_reach_the_template_as_transformers_passes_them(calling):
    """A request's tools are the template's ``tools`` (serve rendered every template with
    none): the prompt holds their JSON, as transformers' apply_chat_template renders it; an
    assistant's tool calls, arguments a JSON string as OpenAI sends them (content null), reach
    the template as objects (vLLM's), and a tool's result with its tool_call_id."""
    import transformers

    from specrt.runtime.session import Session

    hf = transformers.AutoTokenizer.from_pretrained(calling.parent / "t")
    conv = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    as_objects = [*conv[:1], {**conv[1], "content": "", "tool_calls": [
        {**conv[1]["tool_calls"][0], "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, conv[2]]
    want = hf.apply_chat_template(as_objects, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<|tools|> {"type": "function", "function": {"name": "get_weather"' in want
    assert '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>' in want
    with Session(calling, governor="off") as s:
        assert s.text.prompt_text(conv, True, tools=TOOLS) == want
        assert s.text.prompt_text(conv, True) == hf.apply_chat_template(as_objects, tokenize=False,
                                                                        add_generation_prompt=True)
        ids = s.encode(conv, True, tools=TOOLS)
    assert ids == s.text.ids_of(want, False) and len(ids) > len(s.text.ids_of(s.text.prompt_text(conv, True), False))


# DeepSeek-R1's (its distills', V3's) template joins a call's arguments to its text as a string (an excerpt)
R1_CALLS = ("{% for m in messages %}{% if m.tool_calls %}{% for tool in m.tool_calls %}"
            "{{ '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n'"
            " + tool['function']['arguments'] + '\\n```<｜tool▁call▁end｜>' }}{% endfor %}"
            "{% else %}{{ m.role }}: {{ m.content }} {% endif %}{% endfor %}")


def test_a_template_that_joins_the_arguments_as_text_gets_them_as_sent(tmp_path):
    """w76c: a second turn with the assistant's tool call through DeepSeek-R1-Distill's real
    template was a 400 ("TypeError: can only concatenate str (not "dict") to str": it writes
    ``'...' + tool['function']['arguments']``, and serve gives templates the parsed object, as
    vLLM does). Such a template gets the arguments as the client sent them, as transformers
    passes them: the prompt transformers renders; one that reads the object (Qwen3's, Llama
    3.1's ``| tojson``) still gets the object, and a template's other type errors stay errors."""
    import transformers

    from specrt.errors import UserError
    from specrt.runtime.text import Text
    from tests.runtime.test_text import _chat_folder

    conv = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    f = _chat_folder(tmp_path / "r1", {"chat_template": R1_CALLS})
    want = transformers.AutoTokenizer.from_pretrained(f).apply_chat_template(
        [*conv[:1], {**conv[1], "content": ""}, conv[2]], tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert '<｜tool▁sep｜>get_weather\n```json\n{"city":"Paris"}\n```' in want
    assert Text(f).prompt_text(conv, True, tools=TOOLS) == want
    broken = _chat_folder(tmp_path / "broken", {"chat_template": R1_CALLS.replace("tool['type']", "1")})
    with pytest.raises(UserError, match="TypeError"):
        Text(broken).prompt_text(conv, True, tools=TOOLS)


def test_named_templates_render_the_tool_use_one_with_tools_as_transformers_does(tmp_path):
    """tokenizer_config.json's named templates (Hermes 2 Pro's "default" and "tool_use"):
    with tools the "tool_use" one renders, as transformers picks it; without, "default"."""
    import transformers

    from specrt.runtime.text import Text
    from tests.runtime.test_text import _chat_folder

    default = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}"
    f = _chat_folder(tmp_path / "named", {"chat_template": [{"name": "default", "template": default},
                                                             {"name": "tool_use", "template": TEMPLATE}]})
    hf, text = transformers.AutoTokenizer.from_pretrained(f), Text(f)
    for tools in (TOOLS, None):
        want = hf.apply_chat_template(ASK, tools=tools, tokenize=False, add_generation_prompt=True)
        assert text.render_chat(ASK, tools=tools) == want
    assert want == "user: weather in Paris? " and text.render_chat(ASK, tools=TOOLS).startswith("<|tools|> ")


def test_an_answer_that_calls_a_tool_comes_back_as_tool_calls(servers):
    """hermes: the model's <tool_call> block is a tool call (its arguments a JSON string),
    the text before it the content, finish_reason "tool_calls"; the tools reached the prompt
    (more prompt tokens than without them)."""
    code, r = _chat(servers["hermes"], stop="done")
    assert code == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    assert ch["message"]["content"] == " Sure. "  # (a word-level decoder: a space before each word)
    [call] = ch["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) > 10
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    code, plain = _post(servers["hermes"], "/v1/chat/completions", {"messages": ASK, "stop": "done"})
    assert code == 200 and r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 10
    # without tools nothing is parsed: the same words are the content
    assert plain["choices"][0]["message"] == {"role": "assistant",
                                              "content": f" Sure. <tool_call> {CALL} </tool_call> "}
    assert plain["choices"][0]["finish_reason"] == "stop"
    # tool_choice none: the tools rendered (the same prompt), the answer not parsed
    code, none = _chat(servers["hermes"], stop="done", tool_choice="none")
    assert none["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"]
    assert none["choices"][0] == {**plain["choices"][0], "index": 0}
    # cut by max_tokens before the block's end tag, its JSON whole, or just after the tag: the call is
    # whole, and comes back with finish "length" (it was text: h76b); cut inside the block: text
    for max_tokens in (3, 4):
        code, cut = _chat(servers["hermes"], max_tokens=max_tokens)
        assert cut["choices"][0]["finish_reason"] == "length", cut
        assert cut["choices"][0]["message"]["content"] == " Sure. "
        assert [c["function"]["name"] for c in cut["choices"][0]["message"]["tool_calls"]] == ["get_weather"]
    code, cut = _chat(servers["hermes"], max_tokens=2)
    assert cut["choices"][0]["message"] == {"role": "assistant", "content": " Sure. <tool_call>"}


def test_llama3_json_and_an_answer_without_a_call(servers):
    """llama3_json: an answer that is a JSON call ("parameters") is a tool call, content null;
    an answer of text keeps its content and finish_reason, no tool_calls."""
    code, r = _chat(servers["llama3_json"], stop="end", chat_template_kwargs={"cue": "done"})
    assert code == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    assert [c["function"] for c in ch["message"]["tool_calls"]] == [{"name": "get_weather",
                                                                     "arguments": '{"city": "Paris"}'}]
    for url in servers.values():
        code, r = _chat(url, stop="bye", chat_template_kwargs={"cue": "end"})
        assert r["choices"][0]["message"] == {"role": "assistant", "content": " Hello world ! "}
        assert r["choices"][0]["finish_reason"] == "stop"
    # hermes' answer is no llama3_json call: text
    code, r = _chat(servers["llama3_json"], stop="done")
    assert r["choices"][0]["message"]["content"].startswith(" Sure. <tool_call>") and \
        r["choices"][0]["finish_reason"] == "stop"


def _content(s: Streamed, i: int, piece: str) -> str:
    """The content that pushing ``piece`` to choice ``i`` of ``s`` sends (its calls' pieces apart)."""
    return s.push(i, piece).get("content", "")


def _through(s: Streamed, pieces, finish: str = "stop", i: int = 0) -> tuple[str, list, str, int]:
    """``pieces`` streamed through ``s`` as choice ``i``, then its end: the content, the calls
    [(index, id, name, arguments)] as OpenAI's clients join their deltas, the finish_reason,
    and how many tool_calls items came before the end."""
    deltas, early = [s.push(i, p) for p in pieces], 0
    early = sum(len(d.get("tool_calls", ())) for d in deltas)
    end, finish = s.end(i, finish)
    # w78l: an item of a call after a later call's (required's or mistral's [{..}, {..}] with the first's end and the
    # second's name in one piece) ended the first at OpenAI's SDK, its arguments.done ('' for the second: a pydantic
    # tool's ValidationError); and a call without parameters, its "{}" at the end, after a later call's header
    order = [c["index"] for d in deltas + end for c in d.get("tool_calls", ())]
    assert order == sorted(order), (pieces, order)
    content, calls = "", {}
    for d in deltas + end:
        content += d.get("content", "")
        for c in d.get("tool_calls", ()):
            have = calls.setdefault(c["index"], [c["index"], c.get("id"), c.get("function", {}).get("name"), ""])
            have[3] += c["function"].get("arguments", "")
    return content, [tuple(calls[k]) for k in sorted(calls)], finish, early


def _streamed(events: list[dict], n: int = 1) -> list[dict]:
    """Each choice's streamed content, tool calls (arguments joined by index, as OpenAI's
    clients accumulate them) and finish_reason."""
    out = [{"content": "", "tool_calls": {}, "finish_reason": None} for _ in range(n)]
    for e in events:
        for ch in e["choices"]:
            o, d = out[ch["index"]], ch["delta"]
            o["content"] += d.get("content") or ""
            for c in d.get("tool_calls") or ():
                have = o["tool_calls"].setdefault(c["index"], {"id": c.get("id"), "name": "", "arguments": ""})
                have["name"] += c.get("function", {}).get("name") or ""
                have["arguments"] += c.get("function", {}).get("arguments") or ""
            o["finish_reason"] = ch["finish_reason"] or o["finish_reason"]
    return out


def test_a_streamed_tool_call_comes_as_tool_calls_deltas(servers):
    """Streamed, n 2: the content until the block, never the block's text, then each choice's
    call in a delta.tool_calls with its index and id, finish_reason "tool_calls"; llama3_json
    sends no content at all for a call."""
    code, events = _chat(servers["hermes"], stop="done", stream=True, n=2)
    assert code == 200
    for o in _streamed(events, 2):
        assert o["content"] == " Sure. " and o["finish_reason"] == "tool_calls"
        assert [(c["name"], c["arguments"]) for c in o["tool_calls"].values()] == [("get_weather", '{"city": "Paris"}')]
        assert o["tool_calls"][0]["id"].startswith("call_")
    assert not any("<tool" in (ch["delta"].get("content") or "") for e in events for ch in e["choices"])
    code, events = _chat(servers["llama3_json"], stop="end", stream=True, chat_template_kwargs={"cue": "done"})
    [o] = _streamed(events)
    assert o["content"] == "" and o["finish_reason"] == "tool_calls" and len(o["tool_calls"]) == 1
    code, events = _chat(servers["llama3_json"], stop="bye", stream=True, chat_template_kwargs={"cue": "end"})
    assert _streamed(events) == [{"content": " Hello world ! ", "tool_calls": {}, "finish_reason": "stop"}]


def test_the_openai_client_reads_the_tool_calls(servers):
    """OpenAI's own client (where installed) parses the answer and accumulates the streamed
    call."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=servers["hermes"] + "/v1", api_key="x")
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, stop="done")
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    with client.chat.completions.stream(model="tiny", messages=ASK, tools=TOOLS, stop="done") as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments) == {"city": "Paris"}


@pytest.mark.parametrize("body, param, words", [
    ({"tools": TOOLS}, "tool_choice", '"auto" tool choice requires --tool-call-parser'),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice", '"auto" tool choice requires --tool-call-parser'),
    # (required and a named function are guided decoding: this word-level tokenizer is none llguidance reads)
    ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice", "llguidance cannot read this tokenizer.json"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice",
     "llguidance cannot read this tokenizer.json"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nowhere"}}}, "tool_choice",
     "names the function 'nowhere', which 'tools' has not"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools' to call"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "'tool_choice' must be"),
    ({"tools": {"type": "function"}}, "tools", "'tools' must be a list"),
    ({"tools": [TOOLS[0], {"type": "code"}]}, "tools", "tools[1]: expected a function tool"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools", "tools[0].function.name: expected a non"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools",
     "tools[0].function.parameters: expected a JSON Schema object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}], "tool_choice": "none"}, "tools",
     "tools[0].function.description: expected a string"),
    ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": "{nope"}}]}]}, "messages", "messages[1].tool_calls[0].function.arguments: not valid"),
])
def test_tools_a_server_cannot_honour_are_refused_naming_the_field(calling, body, param, words):
    """Without --tool-call-parser, tools with tool_choice auto (the default with tools) are a
    400 saying which option enables them (vLLM's answer); required / a named function are
    guided decoding (h76a: refused where llguidance cannot read the tokenizer, a function
    that is not among the tools named); a bad tool is named by its index; an assistant's call with arguments that
    are not JSON named too."""
    from specrt.cmd_serve import BadRequest, Server

    app = Server(calling, "off", SamplingParams(), 4, "tiny", log=lambda s: None)
    try:
        with pytest.raises(BadRequest) as e:
            app.parse({"messages": ASK, **body}, chat=True)
        assert e.value.param == param and words in str(e.value), str(e.value)
        app.parse({"messages": ASK, "tools": TOOLS, "tool_choice": "none"}, chat=True)  # (rendered, not parsed)
    finally:
        app.close()


def test_the_parsers_over_texts():
    """Both parsers over answers: several calls, text before, unicode, a last block cut
    before its end tag, malformed JSON (all the text stays content, as vLLM's), a cut call."""
    ids = set()

    def calls(text, parser):
        content, got = parse(text, parser)
        ids.update(c["id"] for c in got)
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in got)
        return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got]

    two = ('Let me look.\n<tool_call>\n{"name": "a", "arguments": {"q": "café ☕"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>')
    assert calls(two, "hermes") == ("Let me look.\n", [("a", {"q": "café ☕"}), ("b", {})])
    assert '"café ☕"' in parse(two, "hermes")[1][0]["function"]["arguments"]  # (not \\u escapes)
    assert calls('<tool_call>{"name": "a", "arguments": {"x": 1}}', "hermes") == (None, [("a", {"x": 1})])
    assert calls('<tool_call>{"name": "a"}</tool_call>', "hermes") == (None, [("a", {})])
    for bad in ('ok <tool_call>{"name": "a", "arguments": {"x": 1</tool_call>',  # malformed
                '<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call><tool_call>{"arguments": {}}</tool_call>',
                '<tool_call>{"name": "a", "arguments": {"x": ',  # cut
                '<tool_call>["a"]</tool_call>', "no call here"):
        assert parse(bad, "hermes") == (bad, []), bad
    assert calls('<|python_tag|>{"name": "a", "parameters": {"x": "é"}}; {"name": "b", "arguments": {"y": [1]}}',
                 "llama3_json") == (None, [("a", {"x": "é"}), ("b", {"y": [1]})])
    assert calls(' {"name": "a", "parameters": {}} ', "llama3_json") == (None, [("a", {})])
    for bad in ('{"name": "a", "parameters": {"x": 1}} and then text', 'Sure: {"name": "a"}',
                '{"name": "a", "parameters": {"x": 1}', '{"parameters": {}}', '{"name": "a", "parameters": 3}',
                '{"name": "a", "parameters": {}, "arguments": {}}', "plain text", ""):
        assert parse(bad, "llama3_json") == (bad, []), bad
    assert len(ids) == 7  # (each call an id of its own)


def test_streamed_text_is_held_only_where_a_call_may_begin():
    """Streaming: text goes out as it comes except what may begin a call (a piece of
    '<tool_call>' at the end; llama3_json: an answer starting with '{' or <|python_tag|>),
    and the end sends the held text back where there was no call (malformed, or cut)."""
    s = Streamed("hermes")
    assert [_content(s, 0, p) for p in ("Hi <", "b> <tool", "_call>{\"name\": ")] == ["Hi ", "<b> ", ""]
    content, calls, finish, _ = _through(s, ("\"f\"}</tool_call> x",))
    assert finish == "tool_calls" and content == "" and [c[2:] for c in calls] == [("f", "{}")] and calls[0][0] == 0
    s = Streamed("hermes")
    assert [_content(s, 1, p) for p in ("a", "<tool_call>{bad", "</tool_call>")] == ["a", "", ""]
    assert s.end(1, "stop") == ([{"content": "<tool_call>{bad</tool_call>"}], "stop")
    s = Streamed("hermes")  # cut by max_tokens inside its call: what was held is content
    assert _content(s, 0, 'x<tool_call>{"name": "f", "a') == "x" and s.end(0, "length") == (
        [{"content": '<tool_call>{"name": "f", "a'}], "length")
    s = Streamed("llama3_json")
    content, calls, finish, _ = _through(s, (" ", "<|python", "_tag|>", '{"name": "f", "parameters": {}}'))
    assert finish == "tool_calls" and content == "" and [c[2:] for c in calls] == [("f", "{}")]
    s = Streamed("llama3_json")
    assert [_content(s, 0, p) for p in (" ", "The", " {answer}")] == ["", " The", " {answer}"]
    assert s.end(0, "stop") == ([], "stop")
    s = Streamed(None)  # no parser: as it comes
    assert _content(s, 0, "<tool_call>") == "<tool_call>" and s.end(0, "length") == ([], "length")


def test_hermes_is_refused_at_the_start_where_its_tags_are_special_tokens(tmp_path, monkeypatch):
    """A tokenizer that marks <tool_call> special (an answer's text leaves special tokens out):
    `serve --tool-call-parser hermes` refuses at its start, saying why, rather than serving
    calls that would come back as bare JSON text; llama3_json is not concerned. A template
    that reads no ``tools`` (SmolLM2's) is said at the start: the model never sees them."""
    from click.testing import CliRunner

    from specrt import cmd_serve
    from specrt.cli import main
    from specrt.errors import UserError
    from specrt.runtime.text import Text

    eng = _calling(tmp_path, ("<tool_call>",), "{% for m in messages %}{{ m.content }} {% endfor %}<|assistant|>")
    assert Text(eng / "export").decode([3, 4, 5]) == "<|assistant|> Sure."  # (the tag left out)

    def make_server(*args):
        raise UserError("it served")

    monkeypatch.setattr(cmd_serve, "make_server", make_server)
    r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off", "--tool-call-parser",
                                  "hermes"])
    assert r.exit_code == 1 and "--tool-call-parser hermes: the tokenizer marks <tool_call> as special tokens" \
        in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off", "--tool-call-parser",
                                  "llama3_json"])
    assert r.exit_code == 1 and "it served" in r.output, r.output
    assert "note: --tool-call-parser: the chat template (" in r.output and "reads no 'tools'" in r.output
    r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off"])
    assert r.exit_code == 1 and "it served" in r.output and "note" not in r.output, r.output  # (no parser: no note)


def test_with_a_reasoning_parser_the_calls_are_parsed_from_the_answer_after_its_thinking(tmp_path):
    """--reasoning-parser and --tool-call-parser together (session 75's two features, merged):
    the thinking is taken out first and the calls parsed from what follows ``</think>``, as
    vLLM orders its parsers; whole and streamed. The chain's "!" is ``</think>`` here: cued at
    "end", the answer is " Hello world </think> bye ... Sure. <tool_call> CALL </tool_call> ";
    without the reasoning parser its thinking was hermes' content before the call."""
    from specrt.cmd_serve import Server, make_server

    words = [("</think>" if w == "!" else w) for w in WORDS]
    eng = _calling(tmp_path, words=words)
    app = Server(eng, "off", SamplingParams(), 16, "tiny", log=lambda s: None)
    app.tool_call_parser, app.reasoning = "hermes", "qwen3"
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        code, r = _chat(url, stop="done", chat_template_kwargs={"cue": "end"})
        assert code == 200, r
        ch = r["choices"][0]
        assert ch["message"]["reasoning_content"] == " Hello world "
        assert ch["message"]["content"] == " bye <|end|> <|assistant|> Sure. "
        assert [c["function"]["name"] for c in ch["message"]["tool_calls"]] == ["get_weather"]
        assert ch["finish_reason"] == "tool_calls"
        code, events = _chat(url, stop="done", stream=True, chat_template_kwargs={"cue": "end"})
        [o] = _streamed(events)
        assert o["content"] == " bye <|end|> <|assistant|> Sure. " and o["finish_reason"] == "tool_calls"
        assert [c["name"] for c in o["tool_calls"].values()] == ["get_weather"]
        assert "".join(ch["delta"].get("reasoning_content") or "" for e in events for ch in e["choices"]) == \
            " Hello world "
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def test_parallel_tool_calls_false_keeps_the_first_call(servers):
    """``parallel_tool_calls: false`` (LangGraph's and OpenAI's agents send it): the answer's
    first call alone, whole and streamed, as vLLM drops the others (vllm-project/vllm#26233);
    specrt took the field and sent every call (a walk, w75f). True or left out: all of them."""
    from specrt.tool_calls import message

    two = f'a <tool_call>{CALL}</tool_call> <tool_call>{LLAMA_CALL.replace("parameters", "arguments")}</tool_call>'
    assert len(message(two, "stop", "hermes")[0]["tool_calls"]) == 2
    msg, finish = message(two, "stop", "hermes", parallel=False)
    assert finish == "tool_calls" and msg["content"] == "a " and len(msg["tool_calls"]) == 1
    for cut in range(len(two) + 1):  # (streamed: the second call's header never goes)
        content, calls, finish, _ = _through(Streamed("hermes", parallel=False), (two[:cut], two[cut:]))
        assert finish == "tool_calls" and content == "a " and [c[0] for c in calls] == [0], cut
    code, r = _chat(servers["hermes"], stop="done", parallel_tool_calls=False)  # (one call: the same answer)
    assert code == 200 and r["choices"][0]["finish_reason"] == "tool_calls", r
    assert len(r["choices"][0]["message"]["tool_calls"]) == 1


def test_a_refused_field_is_not_sent_back_whole(servers):
    """A refused field's value is shown cut, not whole: 1 MB of tools sent to /v1/completions
    (tools are chat's) or as chat's legacy ``functions`` came back as a 1 MB error message
    (a walk, w75f: 1,093,039 bytes)."""
    big = [{"type": "function", "function": {"name": f"f{i}", "description": "x " * 200}} for i in range(2000)]
    assert len(json.dumps(big)) > 800_000
    for path, body, said in (("/v1/completions", {"prompt": "hi", "tools": big}, "applies to /v1/chat/completions"),
                             ("/v1/chat/completions", {"messages": ASK, "functions": [t["function"] for t in big]},
                              "is not supported (got [{")):
        code, r = _post(servers["hermes"], path, body)
        assert code == 400 and said in r["error"]["message"], r
        assert len(r["error"]["message"]) < 300, len(r["error"]["message"])


def test_a_call_whose_arguments_hold_the_end_tag_is_a_call():
    """hermes: a call whose JSON holds "</tool_call>" inside a string (an agent writing about the
    format, code that parses it) ends at the first end tag after which its JSON is whole, whole
    and streamed, the next block read after it; the whole answer came back as text, no call (a
    walk, w75f). A block that no end tag makes whole stays malformed: all text."""
    body = '{"name": "write", "arguments": {"text": "end a call with </tool_call>, then stop"}}'
    text = f"ok <tool_call>\n{body}\n</tool_call>\n<tool_call>{CALL}</tool_call>"
    content, calls = parse(text, "hermes")
    assert content == "ok " and [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"text": "end a call with </tool_call>, then stop"}, {"city": "Paris"}]
    content, streamed, finish, _ = _through(Streamed("hermes"), (text[:20], text[20:]))
    assert finish == "tool_calls" and content == "ok " and [c[2] for c in streamed] == ["write", "get_weather"]
    bad = '<tool_call>{"name": "a", "arguments": {"x": "</tool_call> y</tool_call>'
    assert parse(bad, "hermes") == (bad, [])


def test_a_tool_use_template_that_is_not_jinja_is_said_at_the_start_naming_its_file(tmp_path, monkeypatch):
    """r75i: a named "tool_use" template (which export does not render: it renders the default
    one) that is not valid Jinja: `serve --tool-call-parser` refused at its start with "chat
    template: not valid Jinja (line 1: ...)" alone, naming neither the option, the file nor
    the template; now all three."""
    from click.testing import CliRunner

    from specrt.cli import main

    broken = "{% for m in messages %}{{ m.content }{% endfor %}"
    eng = _calling(tmp_path, (), [{"name": "default", "template": TEMPLATE}, {"name": "tool_use", "template": broken}])
    r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off", "--tool-call-parser",
                                  "hermes"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"error: --tool-call-parser: {eng / 'export' / 'tokenizer_config.json'}: the \"tool_use\" chat template, " \
        "which requests with tools go through: not valid Jinja (line 1: " in r.output, r.output


def _wordy(words: int) -> list[dict]:
    """TOOLS with a description of ``words`` words (a token each: the test tokenizer's <unk>)."""
    return [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "x " * words}}]


def test_tools_that_push_the_prompt_past_the_context_are_said_with_the_messages(servers, calling):
    """A chat request whose tools take the prompt past the context (w75f): its 400 blamed the
    messages alone ("the prompt has 300 tokens", "240 in the messages"), where the client's
    messages were a few words and its tools' definitions the rest; now the tools are named, with
    their share where the prompt was counted (param as before: messages, OpenAI's for the
    prompt; max_tokens for the room asked)."""
    from specrt.runtime.session import Session

    url = servers["hermes"]
    code, r = _chat(url, tools=_wordy(300))
    assert code == 400 and r["error"]["param"] == "messages", r
    assert "the prompt (the messages and the tools' definitions) has" in r["error"]["message"], r
    tools = _wordy(150)
    with Session(calling, governor="off") as s:
        whole, alone = len(s.encode(ASK, True, tools=tools)), len(s.encode(ASK, True))
    assert alone < 20 < whole - alone and whole < 256 - 16
    code, r = _chat(url, tools=tools, max_tokens=256 - whole + 1)
    assert code == 400 and r["error"]["param"] == "max_tokens", r
    assert f"({whole} in the messages and tools, {whole - alone} of them the tools' definitions, " \
           f"{256 - whole + 1} in the completion). Please reduce the length of the messages, tools or completion." \
        in r["error"]["message"], r
    # /tokenize counts what the request would (the tools rendered), for a client to fit it first
    code, r = _post(url, "/tokenize", {"messages": ASK, "tools": tools})
    assert code == 200 and r["count"] == whole and r["max_model_len"] == 256, r


def test_vllms_enable_auto_tool_choice_is_taken_with_a_parser_and_refused_alone(calling):
    """`--enable-auto-tool-choice`, copied from a vLLM command line with --tool-call-parser: was
    "No such option" (exit 1); now it changes nothing there (the run goes on to the listen, which
    fails on an address no socket takes), and alone it is refused naming --tool-call-parser, as
    vLLM refuses it."""
    from click.testing import CliRunner

    from specrt.cli import main

    # (an address no socket takes: were the flag taken alone, the run fails at the listen, not serves on: m75k)
    r = CliRunner().invoke(main, ["serve", str(calling), "--enable-auto-tool-choice", "--host", "256.0.0.1"])
    assert r.exit_code == 1 and "--enable-auto-tool-choice needs --tool-call-parser (hermes or llama3_json" \
        in r.output, r.output
    r = CliRunner().invoke(main, ["serve", str(calling), "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                                  "--host", "256.0.0.1"])
    assert r.exit_code == 1 and "--host '256.0.0.1'" in r.output and "cannot listen there" in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert "--enable-auto-tool-choice" in r.output and "without --tool-call-parser it is refused" in \
        " ".join(r.output.split()), r.output


def _calls(text: str, parser: str, tools=None, cut: bool = False) -> tuple[str | None, list]:
    """parse's content and (name, arguments as objects) of each call."""
    content, got = parse(text, parser, tools, cut)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got]


def test_pythonic_reads_a_list_of_calls_with_literal_arguments_never_evaluated():
    """pythonic (Llama 3.2 / 4): a Python list of calls, keyword arguments of literals, read with
    ``ast`` alone (h76b: the parser is new; vLLM's refuses negative numbers, which it takes);
    anything but literals (a call, a name, an operation), positional arguments or text after
    the list leave the answer as content."""
    assert _calls('[get_weather(city="Paris", days=-3), a.b(x=[1, (2, 3)], y={"k": null}, z=None, w=True)]',
                  "pythonic") == (None, [("get_weather", {"city": "Paris", "days": -3}),
                                         ("a.b", {"x": [1, [2, 3]], "y": {"k": None}, "z": None, "w": True})])
    assert _calls(' \n[f(q="café ☕")]\n', "pythonic") == (None, [("f", {"q": "café ☕"})])
    assert '"café ☕"' in parse('[f(q="café ☕")]', "pythonic")[1][0]["function"]["arguments"]
    assert _calls('<|python_start|>[f()]<|python_end|>', "llama4_pythonic") == (None, [("f", {})])
    for bad in ('[f(1)]', '[f(x=g())]', '[f(x=__import__("os").system("true"))]', '[f(x=y)]', '[f(x=1+1)]',
                '[f(**kw)]', '[]', '[f(x=1e999)]', '[f(x=1)] done', '[f(x=1)', 'Sure: [f(x=1)]', '[1, 2]',
                '[f(x={1, 2})]', '[f(x=b"a")]', "plain text", "", '<|python_start|>[f()]'):
        assert parse(bad, "pythonic") == (bad, []), bad


def test_qwen3_coder_types_each_value_by_its_tools_schema():
    """qwen3_coder (Qwen3-Coder's XML): the values are text, typed by the request's tool's
    JSON schema as vLLM's parser types them (h76b: the parser is new): integer, number,
    boolean, object and nullable types parsed, strings kept, a parameter the schema does not
    name a string; a </parameter> inside a value (code quoting the format) is text; a value
    that does not convert stays text; malformed blocks leave all the answer as content."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"}, "o": {"type": "object"},
        "s": {"type": "string"}, "a": {"type": ["array", "null"]}, "m": {"anyOf": [{"type": "integer"},
                                                                                   {"type": "null"}]}}}}}]
    params = {"n": "5", "x": "2.5", "b": "True", "o": '{"k": [1, "é"]}', "s": "null", "a": "null", "m": "7",
              "zz": "7", "code": "end it with </parameter> then"}
    block = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    text = f"Let me look.\n<tool_call>\n<function=f>\n{block}</function>\n</tool_call>\n<tool_call>\n" \
           "<function=g>\n</function>\n</tool_call>"
    assert _calls(text, "qwen3_coder", tools) == ("Let me look.\n", [
        ("f", {"n": 5, "x": 2.5, "b": True, "o": {"k": [1, "é"]}, "s": "null", "a": None, "m": 7, "zz": "7",
               "code": "end it with </parameter> then"}), ("g", {})])
    assert _calls(text, "qwen3_coder")[1][0][1]["n"] == "5"  # (no tools given: every value a string)
    odd = "<tool_call>\n<function=f>\n<parameter=n>\nfive\n</parameter>\n<parameter=b>\nyes\n</parameter>\n" \
          "<parameter=x>\nnan\n</parameter>\n</function>\n</tool_call>"
    assert _calls(odd, "qwen3_coder", tools) == (None, [("f", {"n": "five", "b": "yes", "x": "nan"})])
    # ended inside its function (no cut): taken, as vLLM's; cut by max_tokens there: text
    open_ = "<tool_call>\n<function=f>\n<parameter=s>\nab"
    assert _calls(open_, "qwen3_coder", tools) == (None, [("f", {"s": "ab"})])
    assert parse(open_, "qwen3_coder", tools, cut=True) == (open_, [])
    for bad in ("<tool_call>\n<function={{ name }}>\n</function>\n</tool_call>", "<tool_call>\n<function=f",
                "<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>", "no call", ""):
        assert parse(bad, "qwen3_coder", tools) == (bad, []), bad


def test_a_qwen3_coder_value_that_quotes_a_call_is_the_whole_value():
    """w76g: a coding agent's Qwen3-Coder call writing a file that quotes a call in its own
    format (docs, a test of a parser): the quoted <parameter=>...</parameter> then </function>
    ended the value at the quoted </parameter>, the file cut and the call's other parameters
    lost, silently; the </parameter>s that close a <parameter= opened on a line of the value
    are text (vLLM's counts them so). Where the value's opens do not pair up, the first
    </parameter> that may end it still does. The text before a call that names <function=
    (the call explained first) left the whole answer text: it is content, as vLLM's reads it."""
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "content": {"type": "string"}, "path": {"type": "string"}}}}}]
    quoted = "Call it so:\n<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
    text = f"<tool_call>\n<function=write_file>\n<parameter=content>\n{quoted}\n</parameter>\n" \
           "<parameter=path>\na.md\n</parameter>\n</function>\n</tool_call>"
    assert _calls(text, "qwen3_coder", tools) == (None, [("write_file", {"content": quoted, "path": "a.md"})])
    assert _calls(text, "qwen3_coder", tools, cut=True)[1] == [("write_file", {"content": quoted, "path": "a.md"})]
    odd = "<tool_call>\n<function=write_file>\n<parameter=content>\nsee\n<parameter=\n</parameter>\n" \
          "<parameter=path>\na.md\n</parameter>\n</function>\n</tool_call>"
    assert _calls(odd, "qwen3_coder", tools) == (None, [("write_file", {"content": "see\n<parameter=", "path": "a.md"})])
    # the text before the call names the format: it is content, and the call is the <tool_call> block's
    said = "I will write <function=write_file> with the path.\n<tool_call>\n<function=write_file>\n<parameter=path>\n" \
           "a.md\n</parameter>\n</function>\n</tool_call>"
    assert _calls(said, "qwen3_coder", tools) == ("I will write <function=write_file> with the path.\n",
                                                  [("write_file", {"path": "a.md"})])


def test_a_qwen3_coder_value_opening_with_a_quoted_call_and_a_quoted_dict_are_read_as_vllm_reads_them():
    """Session 76's notes (h77c): a value whose first line quotes a parameter (no newline after
    its <parameter=NAME>) ended at that quoted </parameter>, the value cut and the call's other
    parameters misread (vLLM's counts a <parameter= at the value's start as at a line's:
    vllm/tool_parsers/qwen3coder_tool_parser.py, ``_next_structural_param_start``); an object
    or array value written as a quoted Python dict (a model trained on json.dumps(str(d)))
    stayed a string (vLLM's reads the string again). Streamed, a value past a quoted call that
    pairs up was held to the answer's end (the streamed scanner waited where the whole one
    went on): it goes once the next parameter begins."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "content": {"type": "string"}, "path": {"type": "string"}, "o": {"type": "object"},
        "a": {"type": "array"}}}}}]
    quoted = "<parameter=city>Paris</parameter>\n<parameter=n>2</parameter>"
    text = f"<tool_call>\n<function=f>\n<parameter=content>{quoted}</parameter>\n<parameter=path>\na.md\n" \
           "</parameter>\n</function>\n</tool_call>"
    assert _calls(text, "qwen3_coder", tools) == (None, [("f", {"content": quoted, "path": "a.md"})])
    dicts = "<tool_call>\n<function=f>\n<parameter=o>\n\"{'k': [1, 'é']}\"\n</parameter>\n<parameter=a>\n" \
            "'[{\"x\": true}]'\n</parameter>\n<parameter=path>\n\"5\"\n</parameter>\n</function>\n</tool_call>"
    assert _calls(dicts, "qwen3_coder", tools) == (None, [("f", {"o": {"k": [1, "é"]}, "a": [{"x": True}],
                                                                 "path": '"5"'})])
    assert _calls(dicts.replace("'[{", "'[{{"), "qwen3_coder", tools)[1][0][1]["a"] == '[{{"x": true}]'
    # streamed: the value past the quoted call goes whole once the next parameter begins
    said = ANSWERS["qwen3_coder"][3]
    s = Streamed("qwen3_coder", tools=SCHEMAS)
    items = [c for k in range(said.index("\n2\n")) for c in s.push(0, said[k]).get("tool_calls", ())]
    assert "".join(c["function"]["arguments"] for c in items) == \
        json.dumps({"s": said[said.index("<tool_call>\n<function=g"):said.index("\n</parameter>\n<parameter=n")]})[:-1]


# Qwen3-Coder's template reads every tool's parameters.properties (an excerpt, in the test engines' words)
READS_PARAMETERS = ("{% for t in tools %}{% set t = t.function %}<|tools|> {{ t.name }} "
                    "{% for p, f in t.parameters.properties|items %}{{ p }} {% endfor %}{% endfor %}"
                    "{% for m in messages %}<|{{ m.role }}|> {{ m.content }} {% endfor %}<|assistant|>")


def test_a_tool_without_parameters_renders_where_the_template_reads_them(calling, monkeypatch):
    """w76g: an agent's tool that takes no arguments (OpenAI lets "parameters" be left out) through
    Qwen3-Coder's real template was a 400 ("UndefinedError: 'dict object' has no attribute
    'parameters'"; transformers fails so too), which vLLM renders (its tools' parameters null):
    now rendered with an empty parameter list (its name, no parameters; get_weather's "city"
    after it), chat and /tokenize alike."""
    from specrt.runtime.text import Text

    init = Text.__init__

    def reads_parameters(self, folder):
        init(self, folder)
        self.chat_template = self.tool_template = READS_PARAMETERS

    monkeypatch.setattr(Text, "__init__", reads_parameters)
    bare = [{"type": "function", "function": {"name": "now", "description": "The time"}}, *TOOLS]
    servers = _serving(calling, ("hermes",))
    url = next(servers)["hermes"]
    try:
        code, r = _chat(url, tools=bare, max_tokens=2)
        assert code == 200 and r["choices"][0]["message"]["content"], r
        code, r = _post(url, "/tokenize", {"messages": ASK, "tools": bare, "return_token_strs": True})
        assert code == 200 and r["token_strs"][:6] == ["<|tools|>", "<unk>", "<|tools|>", "<unk>", "<unk>", "<|user|>"]
    finally:
        next(servers, None)


def test_mistral_reads_both_forms_with_nine_character_ids():
    """mistral: [TOOL_CALLS] then a JSON array (tokenizers before v11) or NAME[ARGS]{...} a call
    (v11+), the text before the content; each id 9 letters and digits, as Mistral's templates
    demand when the calls come back (h76b: the parser is new); malformed: content."""
    old = 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"é": "☕"}}]'
    assert _calls(old, "mistral") == ("Sure. ", [("f", {"a": 1}), ("g", {"é": "☕"})])
    new = '[TOOL_CALLS]f[ARGS]{"a": "é"}[TOOL_CALLS]g{"b": [2]}'
    assert _calls(new, "mistral") == (None, [("f", {"a": "é"}), ("g", {"b": [2]})])
    for text in (old, new):
        ids = [c["id"] for c in parse(text, "mistral")[1]]
        assert all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids) and len(set(ids)) == 2, ids
    for bad in ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}', '[TOOL_CALLS] [{"arguments": {}}]',
                '[TOOL_CALLS]f[ARGS]', '[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g', '[TOOL_CALLS] []',
                '[TOOL_CALLS]two words{"a": 1}', '[{"name": "f", "arguments": {}}]', "text"):
        assert parse(bad, "mistral") == (bad, []), bad


def test_llama3_json_takes_a_call_after_text_as_vllm_does():
    """llama3_json: Llama 3.2 1B/3B preface their JSON call with text ("Here is the call: {...}");
    the call was left as text, where vLLM's non-streamed parser finds it (NOTES.md, session 75):
    now it is a call, the text before it the content, whole and streamed (the text sent as it
    comes, held from the {"name": on). After text, an object that names no arguments (an
    answer about a city called "Paris") stays text, as in vLLM's."""
    text = 'Here is the call: {"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert _calls(text, "llama3_json") == ("Here is the call: ", [("get_weather", {"city": "Paris"})])
    for bad in ('It is {"name": "Paris", "population": 2}', 'Use {"name": "f", "parameters": {}} like this',
                'See {"a": 1} and {"name": "f"}'):
        assert parse(bad, "llama3_json") == (bad, []), bad
    s, spaced = Streamed("llama3_json"), text.replace('{"name"', '{ "name"')
    assert [_content(s, 0, p) for p in (spaced[:7], spaced[7:19], spaced[19:23])] == ["Here is", " the call: ", ""]
    content, calls, finish, _ = _through(s, (spaced[23:],))
    assert finish == "tool_calls" and content == "" and [c[2:] for c in calls] == [("get_weather",
                                                                                    '{"city": "Paris"}')]
    s = Streamed("llama3_json")
    assert [_content(s, 0, p) for p in ("a {", '"x": 1}', " b")] == ["a ", '{"x": 1}', " b"]
    assert s.end(0, "stop") == ([], "stop")


def test_an_answer_cut_after_its_whole_calls_gives_them_with_finish_length():
    """An answer cut by max_tokens just after a whole call was all text (NOTES.md, session 75);
    vLLM gives the call with finish "tool_calls", hiding the cut. Now the whole calls come back
    with finish "length", whole and streamed; a call that may be cut (JSON not closed, a
    qwen3_coder value without its </parameter>) leaves the answer text."""
    from specrt.tool_calls import message

    for text, parser in ((f'ok <tool_call>{CALL}</tool_call>', "hermes"), ('[f(x=1)]', "pythonic"),
                         ('{"name": "f", "parameters": {}}', "llama3_json"), ('[TOOL_CALLS]f[ARGS]{}', "mistral"),
                         ("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>", "qwen3_coder")):
        msg, finish = message(text, "length", parser)
        assert finish == "length" and len(msg["tool_calls"]) == 1, (parser, msg)
        content, calls, finish, _ = _through(Streamed(parser), (text,), "length")
        assert finish == "length" and len(calls) == 1, parser
    for text, parser in (('ok <tool_call>{"name": "f", "argu', "hermes"), ('[f(x=1), g(', "pythonic"),
                         ("<tool_call>\n<function=f>\n<parameter=x>\n1", "qwen3_coder")):
        assert message(text, "length", parser) == ({"role": "assistant", "content": text}, "length")


def test_the_new_parsers_stream_text_until_a_call_may_begin():
    """Streamed, the new parsers (h76b) send text as it comes until a call may begin, never a
    piece of the call's tags: qwen3_coder from <tool_call> or <function=, mistral from
    [TOOL_CALLS], pythonic holds an answer starting with [ (else sends it all); malformed
    held text comes back at the end as content, parallel_tool_calls false keeps the first."""
    s = Streamed("qwen3_coder")
    assert _through(s, ("Sure <tool", "_call>\n<function=f>\n", "</function></tool_call>"))[:3] == (
        "Sure ", [(0, s.answers[0].calls[0][0], "f", "{}")], "tool_calls")
    s = Streamed("mistral", parallel=False)
    content, calls, finish, _ = _through(s, ("Hi [TOOL", "_CALLS] [{", '"name": "f"}, {"name": "g"}]'))
    assert (content, finish) == ("Hi ", "tool_calls") and [c[2] for c in calls] == ["f"]
    s = Streamed("mistral")
    assert _content(s, 0, "a [TOOL_CALLS] oops") == "a " and s.end(0, "stop") == ([{"content": "[TOOL_CALLS] oops"}],
                                                                                "stop")
    s = Streamed("pythonic")  # (pythonic's header once its name is whole, then its arguments: h77c)
    deltas = [s.push(0, p) for p in (" ", "[f(x=", "'é')]")]
    assert deltas[0] == {} and deltas[1]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert deltas[2]["tool_calls"][0]["function"]["arguments"] == '{"x": "é"}' and s.end(0, "stop") == ([], "tool_calls")
    s = Streamed("pythonic")
    assert [_content(s, 0, p) for p in (" [", "1, 2]")] == ["", ""] and s.end(0, "stop") == ([{"content": " [1, 2]"}],
                                                                                       "stop")
    s = Streamed("llama4_pythonic")
    assert [_content(s, 0, p) for p in ("<|python", "_start|>[f()]")] == ["", ""]
    assert s.end(0, "stop")[1] == "tool_calls"
    s = Streamed("pythonic")
    assert [_content(s, 0, p) for p in ("The", " [list]")] == ["The", " [list]"] and s.end(0, "stop") == ([], "stop")


PY_CALL = '[get_weather(city="Paris",days=3)]'
MISTRAL_CALLS = '[{"name":"get_weather","arguments":{"city":"Paris"}}]'
# the words of the new parsers' engines (h76b), by id; 3 .. 15 the chain: after <|assistant|> a pythonic
# call, after "done" a qwen3_coder block, after </tool_call> mistral's (its [TOOL_CALLS] a special token)
WORDS_NEW = ["<unk>", "<|user|>", "<|tools|>", "<|assistant|>", PY_CALL, "done", "Sure.", "<tool_call>",
             "<function=get_weather>", "<parameter=days>", "3", "</parameter>", "</function>", "</tool_call>",
             "[TOOL_CALLS]", MISTRAL_CALLS]
TOOLS_DAYS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def new_servers(tmp_path_factory):
    """Servers of engines that spell the new parsers' calls, one a parser ({name: url})."""
    eng = _calling(tmp_path_factory.mktemp("new"), ("[TOOL_CALLS]",), words=WORDS_NEW)
    yield from _serving(eng, ("pythonic", "qwen3_coder", "mistral"))


@pytest.mark.parametrize("parser, cue, stop, content, args", [
    ("pythonic", "<|assistant|>", "done", None, {"city": "Paris", "days": 3}),
    ("qwen3_coder", "done", "[{", " Sure. ", {"days": 3}),
    ("mistral", "</tool_call>", "<|assistant|>", " ", {"city": "Paris"}),  # (a word-level decoder's space)
])
def test_each_new_parser_serves_the_call_its_model_writes(new_servers, parser, cue, stop, content, args):
    """End to end, whole and streamed (h76b): a pythonic list, Qwen3-Coder's XML (its "days"
    typed an integer by the tool's schema) and Mistral's [TOOL_CALLS] (a special token, which
    an answer's text left out: kept for this parser) come back as tool_calls, finish
    "tool_calls"; mistral's id 9 letters and digits."""
    url = new_servers[parser]
    code, r = _chat(url, tools=TOOLS_DAYS, stop=stop, chat_template_kwargs={"cue": cue})
    assert code == 200, r
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] == content, ch
    [call] = ch["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == args
    assert (len(call["id"]) == 9 and call["id"].isalnum()) if parser == "mistral" else call["id"].startswith("call_")
    code, events = _chat(url, tools=TOOLS_DAYS, stop=stop, stream=True, chat_template_kwargs={"cue": cue})
    [o] = _streamed(events)
    assert o["content"] == (content or "") and o["finish_reason"] == "tool_calls", o
    assert [(c["name"], json.loads(c["arguments"])) for c in o["tool_calls"].values()] == [("get_weather", args)]
    # without tools nothing is parsed: the text, mistral's [TOOL_CALLS] (a special token) left out of it, as
    # of every answer but those to requests with tools (vLLM's keeps it there alone; it was in all: h76f)
    for extra in ({}, {"tools": TOOLS_DAYS, "tool_choice": "none"}):
        code, plain = _post(url, "/v1/chat/completions", {"messages": ASK, "stop": stop,
                                                          "chat_template_kwargs": {"cue": cue}, **extra})
        assert plain["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in plain["choices"][0]["message"]
        assert (MISTRAL_CALLS in plain["choices"][0]["message"]["content"]) == (parser == "mistral")
        assert "[TOOL_CALLS]" not in plain["choices"][0]["message"]["content"]


def test_mistral_is_refused_at_the_start_without_its_token(calling):
    """--tool-call-parser mistral on a tokenizer with no [TOOL_CALLS] (h76b): refused at the
    start naming the token, as vLLM's parser refuses it, rather than serving answers no call
    could come from; with one, decode keeps it and [ARGS] (special tokens) and no other."""
    from specrt.runtime.text import Text
    from specrt.tool_calls import parser_problem

    assert "the tokenizer has no [TOOL_CALLS] token" in parser_problem(Text(calling / "export"), "mistral")
    text = Text(calling / "export")
    text.tokenizer.add_special_tokens(["[TOOL_CALLS]", "[ARGS]", "</s>"])
    ids = text.tokenizer.encode("Sure. [TOOL_CALLS] Hello [ARGS] </s>").ids
    assert text.decode(ids) == "Sure. Hello"
    assert parser_problem(text, "mistral") is None
    assert text.kept.decode(ids) == "Sure. [TOOL_CALLS] Hello [ARGS]" and text.decode(ids) == "Sure. Hello"


def test_a_mistral_call_with_its_call_id_keeps_its_name(calling):
    """w76g: v11+ Mistral tokenizers (Mistral Small 3.2's has [CALL_ID], id 33) and the templates
    that write ids render a call [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}; a model that writes one so
    had its [CALL_ID], a special token, left out of the text and the id glued to the name
    ("get_weathera1B2c3D4e", a call to no tool). [CALL_ID] is kept, and the name ends at it."""
    from specrt.runtime.text import Text
    from specrt.tool_calls import parser_problem

    text = Text(calling / "export")
    text.tokenizer.add_special_tokens(["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"])
    assert parser_problem(text, "mistral") is None
    said = text.kept.decode(  # (the answers to requests with tools decode so: h76f)
        text.tokenizer.encode('[TOOL_CALLS] get_weather [CALL_ID] a1B2c3D4e [ARGS] {"city":"Paris"}').ids)
    assert "[CALL_ID]" in said
    assert _calls('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}[TOOL_CALLS]f[ARGS]{}', "mistral") == \
        (None, [("get_weather", {"city": "Paris"}), ("f", {})])


def test_a_kept_special_token_ends_a_run_of_byte_tokens(tmp_path):
    """Text.keep_special (mistral's [TOOL_CALLS], h76b) on a ByteFallback tokenizer (Mistral's
    are): the kept token is text, which ends a run of byte tokens, so the text before it is
    final and streams at once (were it still counted among the left-out special tokens, the
    detokenizer held it back); what streams joins to what the whole decode gives."""
    from specrt.runtime.text import Detokenizer, Text
    from tests.runtime.test_text import _byte_fallback

    _byte_fallback(tmp_path)
    text = Text(tmp_path).keep_special("<s>")
    ids = [3 + 0x41, 1, 3 + 0x80]  # "A", <s> (kept), a byte that is no UTF-8
    assert text.decode(ids) == "A<s>\ufffd" and 1 not in text.byte_fallback_ids
    d = Detokenizer(text)
    assert d.push(ids[:2]) == "A<s>"
    assert "A<s>" + d.push(ids[2:]) + d.flush() == text.decode(ids)


# answers each parser's streaming reads (h76f): unicode, escapes (a surrogate pair's), strings holding the end
# tag or braces, nested values, numbers Python's json rewrites (2.50, 1E2, -0), several calls, a call after
# text, the name after the arguments, a key twice (h77c), and malformed ones (a call's own key twice, text after
# the JSON, a control character in a string, NaN, a cut)
ANSWERS = {
    "hermes": [
        'Sure. <tool_call>\n{"name": "write", "arguments": {"path": "a é.py", "text": "x = \\"}\\"\\n</tool_call>'
        ' \\u00e9\\ud83d\\ude00\\/", "n": [1, 2.50, 1E2, -0, {"deep": [true, null, {}]}], "e": []}}\n</tool_call>',
        '<tool_call>{"arguments":{"q":"Paris"},"name":"get_weather"}</tool_call>\n<tool_call>\n'
        '{"name": "now", "arguments": "{\\"tz\\": \\"UTC\\"}"}\n</tool_call> after',
        '<tool_call>{"name": "f", "arguments": {"a": 1, "a": 2}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": {"b": 1, "b": [2]}}, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": 1}} x</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"s": "a\nb"}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": "\\ud83d"}}</tool_call><tool_call>{"name": "g"',
    ],
    "llama3_json": [
        '<|python_tag|>{"name": "f", "parameters": {"a": [1, {"b": "}"}]}}; {"name": "g", "arguments": {}}',
        'Here is the call: { "name": "get_weather", "parameters": {"city": "Par\\u00eds"}}',
        '{"name": "f", "x": 1}; {"name": "g", "parameters": {"a": 1}}',
        '{"name": "f", "parameters": {"a": 1}} and text',
    ],
    "mistral": [
        'Hi [TOOL_CALLS] [{"name": "f", "arguments": {"a": "é\\n"}}, {"arguments": {"b": [2]}, "name": "g"}]',
        '[TOOL_CALLS]f[ARGS]{"a": {"b": "[TOOL_CALLS]"}}[TOOL_CALLS]g[ARGS]{}',
        '[TOOL_CALLS]f x[ARGS]{"a": 1}',
        '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}',
        # w78l: a call's arguments left out ({}) or a JSON string, its arguments at the end: the next call after them
        '[TOOL_CALLS] [{"name": "f"}, {"name": "g", "arguments": "{\\"a\\": 1}"}, {"name": "h", "arguments": {}}]',
    ],
    "qwen3_coder": [
        'ok <tool_call>\n<function=f>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nuse </parameter> to end\n'
        '</parameter>\n<parameter=o>\n{"k": [1, "é"]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n'
        '<function=g>\n</function>\n</tool_call>',
        '<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>',
        '<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=s>\nab',
        'write <function=x> so: <tool_call>\n<function=f>\n<parameter=s>\n<tool_call>\n<function=g>\n<parameter=p>'
        '\n1\n</parameter>\n</function>\n</tool_call>\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>',
        '<tool_call>\n<function=f>\n<parameter=s>\n<parameter=p>\n1\n</parameter>\n</function>\n',
        '<tool_call>\n<function=f>\n<parameter=s><parameter=p>1</parameter>\n<parameter=q>2</parameter></parameter>\n'
        '<parameter=o>\n"{\'k\': 1}"\n</parameter>\n</function>',
        '<tool_call>\n<function=f>\n<parameter=t>\nNone\n</parameter>\n<parameter=s>\n\nnull\n\n</parameter>\n'
        '</function><tool_call>\n<function=f>\n<parameter=t>\nnullable\n</parameter>\n</function>',
    ],
}
ANSWERS["pythonic"] = [  # (h77c: streamed piece by piece now) escapes of every kind, a string in parts, a keyword twice
    '[get_weather(city="Paris", days=3), a.b(x=[1, (2, 3)], y={"k": null, 1: "z"}, z=None, w=True)]',
    " \n[f(q='caf\\u00e9 \\N{HOT BEVERAGE} \\x41\\101\\1 \"x\"', r=r\"\\d\", t=\"\"\"tri\npple\"\"\", e=\"\","
    " c=\"a\" \"b\", n=-1.5e3)]\n",
    '[f(x=1,), g()]', '[f(x=1, x=2)]', '[f(x=g())]', '[f(x=1)] done', '[f(s="abc"[1:])]', '[f(s="line\nbreak")]',
    '[f(x=1, # c\n y=2)]', '[f (x=1)]', '[f(s="\\ud83d\\ude00", t="\\\\")]', '[f(x=)]', '[f(None=1)]', '[f(x=1e999)]',
    '[f(s="é\\t\\x41\\N{BULLET}", t=\'a\\tb\\\'\\"\')]',  # (h78d: escapes after a character not ASCII, and without)
    '[f(s="a\\\rb", t="\\t\\\r\nc")]',  # (r78g: a \ before a CR or CRLF, a line's end in Python's literal)
]
ANSWERS["llama4_pythonic"] = ['<|python_start|>[f(s="a<|python_end|>b"), g(n=[1])]<|python_end|>', '[f(x=1)]',
                              '<|python_start|>[f(x="<|python_e")]']
SCHEMAS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "n": {"type": "integer"}, "s": {"type": "string"}, "o": {"type": "object"}, "t": {"type": ["string", "null"]}}}}}]


@pytest.mark.parametrize("parser", sorted(ANSWERS))
def test_streamed_calls_join_into_the_whole_answers_calls_cut_anywhere(parser):
    """Streamed, a call's header goes once its name is whole and its arguments as they are
    read (h76f; each call came whole at the answer's end): cut at every place, and a
    character at a time, with finish stop and length, parallel_tool_calls true and false, the
    content, the calls' names and arguments joined (as OpenAI's clients join them) and the
    finish_reason are exactly the whole answer's (``message``); where it has none, the content
    is the whole text. vLLM's hermes sent the model's own text (spaced as written, not as the
    whole answer's arguments) and its partial-JSON diffs broke arguments (vllm#10395)."""
    from specrt.tool_calls import message

    for text in ANSWERS[parser]:
        for finish in ("stop", "length"):
            for parallel in (True, False):
                _joins_cut_anywhere(lambda: Streamed(parser, parallel, SCHEMAS), text, finish,
                                    *message(text, finish, parser, parallel, SCHEMAS))


def _joins_cut_anywhere(make, text: str, finish: str, msg: dict, want: str,
                        cuts_all: bool = True) -> int:
    """``text`` streamed through ``make()`` (a Streamed) cut at every place (``cuts_all``), and a
    character at a time, ended with ``finish``: its content, finish_reason and (where it has
    some) calls' names and arguments joined are the whole answer's, ``msg`` and ``want``; the
    fewest tool_calls items sent before the end."""
    calls = [(k, c["function"]["name"], c["function"]["arguments"]) for k, c in enumerate(msg.get("tool_calls", ()))]
    early = []
    for cuts in [[k] for k in range(len(text) + 1) if cuts_all] + [list(range(1, len(text)))]:
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        content, got, finish_got, n = _through(make(), pieces, finish)
        assert finish_got == want and content == (msg["content"] or ""), (text, cuts)
        if calls:
            assert [(k, name, args) for k, _, name, args in got] == calls, (text, cuts)
        early.append(n)
    return min(early)


# forced tool choices' answers (h78d), as the grammar lets a model write them: required's array (unicode, escapes, a
# surrogate pair, numbers Python's json rewrites, the name after the parameters, spaced as a model may space it, a key
# twice, a number no JSON holds) and a named function's parameters
FORCED = {
    "required": [
        ' [{"name": "paint", "parameters": {"color": "r\\u00e9d \\ud83d\\ude00 \\"q\\"", "ok": true, "n": [1, 2.50, '
        '1E2, -0, {"deep": [null, {}]}]}}, {"name": "stop", "parameters": {}}]',
        '[\n  {"parameters": {"x": "é}]"},\n   "name": "f"},{"name":"g","parameters":{"a":1,"a":[2]}}\n]',
        '[{"name": "f", "parameters": {"x": 1e999}}]'],
    "paint": ['{"color": "red", "ok": true}', ' {"s": "a\\n\\u00e9}", "n": [1.50]} ']}


@pytest.mark.parametrize("forced", sorted(FORCED))
def test_forced_calls_stream_and_join_into_the_whole_answers_cut_anywhere(forced):
    """tool_choice "required" or a named function, streamed: their calls came whole at the
    answer's end (README "Not done", h78d); vLLM's stream them as they are written
    (serving_chat: a named call's header with the first text, then the text; required's
    parsed again at each piece, the parameters' text sent as the model spaced it, where its
    whole answer json.dumps them). Now a call's header goes once its name is known (a named
    one's before any text, arguments ""), then its arguments as they are read: cut at every
    place and a character at a time, parallel or not, finish stop, and length for every
    prefix (max_tokens anywhere), the content, calls and finish_reason joined are exactly
    the whole answer's (``forced_message``; one cut inside a call: its text, finish length;
    cut between whole calls: those, finish length), and the calls went before the end."""
    for text in FORCED[forced]:
        for parallel in (True, False):
            for finish in ("stop", "length"):
                msg, want = forced_message(text, finish, forced, parallel)
                early = _joins_cut_anywhere(lambda: ForcedCalls(forced, parallel), text, finish, msg, want)
                assert early if "tool_calls" in msg else True, text
            for k in range(len(text)):  # (cut by max_tokens at k)
                _joins_cut_anywhere(lambda: ForcedCalls(forced, parallel), text[:k], "length",
                                    *forced_message(text[:k], "length", forced, parallel), cuts_all=False)
    text = FORCED["required"][1]
    for cut in (text.index("},{") + 1, text.index("},{") + 2):  # (between whole calls: those, finish length)
        assert [c["function"]["name"] for c in forced_message(text[:cut], "length", "required")[0]["tool_calls"]] == ["f"]
    first = ForcedCalls("paint").push(0, '{"')["tool_calls"]
    assert first[0]["function"] == {"name": "paint", "arguments": ""} and first[0]["id"].startswith("call_")
    assert first[1:] == [{"index": 0, "function": {"arguments": '{"'}}]


def test_a_long_call_streams_its_arguments_as_they_come():
    """A long call (a file's content as an argument, an agent's write) streams: its header
    once the name is whole, then its arguments a token at a time, a prefix of the whole
    answer's each time, not all at the end (h76f); qwen3_coder's a parameter at a time, a
    string's characters as they come (the last held: it may be the newline dropped before
    </parameter>)."""
    from specrt.tool_calls import message

    body = "".join(f"line {i}: \\u00e9 \\\"q\\\"\\n" for i in range(40))
    text = f'<tool_call>\n{{"name": "write", "arguments": {{"path": "a.txt", "content": "{body}"}}}}\n</tool_call>'
    [whole] = message(text, "stop", "hermes")[0]["tool_calls"]
    s, pieces, sent = Streamed("hermes"), [text[k:k + 4] for k in range(0, len(text), 4)], ""
    items = [c for p in pieces for c in s.push(0, p).get("tool_calls", ())]
    assert items[0]["function"]["name"] == "write" and items[0]["id"].startswith("call_")
    for c in items:
        sent += c["function"]["arguments"]
        assert whole["function"]["arguments"].startswith(sent)
    assert len(items) > 100 and len(sent) > len(whole["function"]["arguments"]) - 3
    xml = "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=s>\nab\n</parameter>\n</function>"
    s = Streamed("qwen3_coder", tools=SCHEMAS)
    items = [c["function"] for k in range(len(xml)) for c in s.push(0, xml[k]).get("tool_calls", ())]
    assert items == [{"name": "f", "arguments": ""}, {"arguments": '{"n": 1'}, {"arguments": ', "s": "a'},
                     {"arguments": "b"}, {"arguments": '"}'}]
    xml = "<tool_call>\n<function=f>\n<parameter=s>\n" + "".join(f'line {i}: "é"\n' for i in range(40))
    xml += "</parameter>\n</function>\n</tool_call>"
    [whole] = message(xml, "stop", "qwen3_coder", tools=SCHEMAS)[0]["tool_calls"]
    s, sent = Streamed("qwen3_coder", tools=SCHEMAS), ""
    items = [c["function"] for k in range(0, len(xml), 4) for c in s.push(0, xml[k:k + 4]).get("tool_calls", ())]
    for c in items:
        sent += c["arguments"]
        assert whole["function"]["arguments"].startswith(sent)
    assert len(items) > 100 and sent == whole["function"]["arguments"]


def test_a_pythonic_call_streams_its_arguments_as_they_come():
    """Session 76's notes (h77c): pythonic and llama4_pythonic calls came whole at the
    answer's end; vLLM's streams them as they parse (vllm/tool_parsers/pythonic_tool_parser.py:
    its partial list closed and parsed again at each piece). Streamed, a call's header goes
    once NAME( is read, then its keyword arguments, each once its value is closed, a string's
    characters as they come: every piece a prefix of the whole answer's arguments."""
    from specrt.tool_calls import message

    body = "".join(f"line {i}: \\u00e9 \\\"q\\\"\\n" for i in range(40))
    text = f'[write(path="a.txt", content="{body}", n=2), done()]'
    whole = message(text, "stop", "pythonic")[0]["tool_calls"]
    s, sent = Streamed("pythonic"), ""
    items = [c for k in range(0, len(text), 4) for c in s.push(0, text[k:k + 4]).get("tool_calls", ())]
    assert items[0]["function"] == {"name": "write", "arguments": ""}
    for c in items:
        if c["index"] == 0:
            sent += c["function"]["arguments"]
            assert whole[0]["function"]["arguments"].startswith(sent)
    assert len(items) > 100 and sent == whole[0]["function"]["arguments"] and items[-1]["index"] == 1
    assert s.end(0, "stop") == ([], "tool_calls")


def test_a_pythonic_strings_pieces_are_read_once(monkeypatch):
    """Session 77's notes: the pythonic stream's CPU cost (a 99 KB call 0.09 -> 0.53 s, 0.97 s
    llama4_pythonic). Profiled (h78d), each piece of an open string value was scanned twice
    (``_py_value`` again after its piece, finding nothing new) and a piece's escapes decoded
    by compiling it (``ast.literal_eval``, 12,000 compiles for the 99 KB call); now once, and an
    ASCII piece's escapes through unicode_escape, the decoder of Python's literals (the cuts
    above check the values)."""
    import ast

    import specrt.tool_calls as tc

    body = "".join(f"line {i}: \\u00e9 \\\"q\\\"\\n" for i in range(50))
    text = f'[write(path="a.txt", content="{body}", n=2)]'
    pieces, scans, compiles = [text[k:k + 4] for k in range(0, len(text), 4)], [], []
    scan, literal = tc._py_value, ast.literal_eval
    monkeypatch.setattr(tc, "_py_value", lambda *a: scans.append(1) or scan(*a))
    monkeypatch.setattr(ast, "literal_eval", lambda *a: compiles.append(1) or literal(*a))
    _, [call], _, _ = _through(Streamed("pythonic"), pieces)
    assert call[3] == message(text, "stop", "pythonic")[0]["tool_calls"][0]["function"]["arguments"]
    assert len(scans) < len(pieces) + 5 and not compiles, (len(scans), len(pieces), len(compiles))


def test_a_call_found_malformed_after_its_header_went_ends_as_text():
    """A call whose header went and which then turns out malformed (its own key twice, text after its
    JSON) or is cut by max_tokens inside its arguments: nothing more of it is sent, the rest
    of the answer comes as content at the end (the content then equals the whole answer's:
    all of it) and finish_reason is stop or length, never tool_calls (vLLM's goes on and ends
    with tool_calls, an agent then runs a broken call); h76f."""
    for text, finish, sent in (('a <tool_call>{"name": "f", "arguments": {"x": 1}, "name": "g"}</tool_call>', "stop",
                                '{"x": 1}'),
                               ('a <tool_call>{"name": "f", "arguments": {"x": 1}} oops</tool_call>', "stop",
                                '{"x": 1}'),
                               ('a <tool_call>{"name": "f", "arguments": {"x": "long', "length", '{"x": "long')):
        content, calls, got, early = _through(Streamed("hermes"), (text[:30], text[30:]), finish)
        assert early and calls[0][2:] == ("f", sent)
        assert content == text and got == finish


def test_a_key_given_twice_keeps_both_and_reads_as_the_last_whole_and_streamed():
    """Session 76's notes (h77c): a JSON key given twice in a call's arguments (or a qwen3_coder
    parameter twice) made the call malformed, the answer text; vLLM's keeps the last, as
    json.loads reads it (vllm/tool_parsers/hermes_tool_parser.py: json.loads then json.dumps).
    The arguments string keeps both as written, so a client's json.loads reads the last, and
    the pieces streamed before the second join into the same string; a call object's own key
    twice ("name" twice: which tool?) stays malformed."""
    from specrt.tool_calls import message

    for text, parser, want in (
            ('<tool_call>{"name": "f", "arguments": {"a": 1, "b": {"c": 1, "c": [2]}, "a": 2}}</tool_call>', "hermes",
             '{"a": 1, "b": {"c": 1, "c": [2]}, "a": 2}'),
            ('{"name": "f", "parameters": {"a": 1, "a": "x"}}', "llama3_json", '{"a": 1, "a": "x"}'),
            ('[TOOL_CALLS]f[ARGS]{"a": 1, "a": 2}', "mistral", '{"a": 1, "a": 2}'),
            ('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1, "a": 2}}]', "mistral", '{"a": 1, "a": 2}'),
            ("<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>"
             "\n</tool_call>", "qwen3_coder", '{"n": 1, "n": 2}')):
        msg, finish = message(text, "stop", parser, tools=SCHEMAS)
        assert finish == "tool_calls" and msg["tool_calls"][0]["function"]["arguments"] == want, text
        assert json.loads(want) == json.loads(want.replace('"a": 1, ', "").replace('"n": 1, ', "").replace(
            '"c": 1, ', ""))
        _, calls, got, early = _through(Streamed(parser, tools=SCHEMAS), [text[k:k + 3] for k in range(0, len(text), 3)])
        assert got == "tool_calls" and calls[0][2:] == ("f", want) and early, text
    for own in ('<tool_call>{"name": "f", "arguments": {}, "name": "g"}</tool_call>',
                '<tool_call>{"name": "f", "arguments": {}, "arguments": {"a": 1}}</tool_call>'):
        assert message(own, "stop", "hermes")[0] == {"role": "assistant", "content": own}

# the words of engines whose answer spells a hermes call a piece at a time (h76f), by id; 3 .. 15 the chain:
# after <|assistant|> " Sure. <tool_call> {"name": "write", "arguments": {"path": "é.txt", "text": "a</tool_call>}
# \n \"b\""}} </tool_call> done" (a word-level decoder's spaces between the words)
WORDS_PIECES = ["<unk>", "<|user|>", "<|tools|>", "<|assistant|>", "Sure.", "<tool_call>", '{"name":', '"write",',
                '"arguments":', '{"path":', '"é.txt",', '"text":', '"a</tool_call>}', '\\n', '\\"b\\""}}',
                "</tool_call>"]
TOOLS_WRITE = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "text": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def pieces_server(tmp_path_factory):
    eng = _calling(tmp_path_factory.mktemp("pieces"), words=WORDS_PIECES)
    yield from _serving(eng, ("hermes",))


def test_the_openai_client_joins_a_call_streamed_piece_by_piece(pieces_server):
    """End to end (h76f): a call the model writes over many tokens streams as a header then
    its arguments a token at a time, several tool_calls deltas (it came whole in one at the
    end); OpenAI's client's stream helper joins them into the whole answer's tool_calls (ids
    aside), n 2 each choice on its own, parallel_tool_calls false the same; the usage chunk
    as without tools; cut by max_tokens inside the call: the answer's text as content, finish
    length, as the whole answer gives it."""
    openai = pytest.importorskip("openai")
    url = pieces_server["hermes"]
    client = openai.OpenAI(base_url=url + "/v1", api_key="x")
    whole = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS_WRITE, stop="<|assistant|>")
    want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert whole.choices[0].finish_reason == "tool_calls" and want[0][0] == "write", whole
    assert json.loads(want[0][1]) == {"path": "é.txt", "text": 'a</tool_call>} \n "b"'}
    for extra in ({}, {"n": 2}, {"parallel_tool_calls": False}):
        with client.chat.completions.stream(model="tiny", messages=ASK, tools=TOOLS_WRITE, stop="<|assistant|>",
                                            stream_options={"include_usage": True}, **extra) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        assert len(final.choices) == extra.get("n", 1) and final.usage.total_tokens == whole.usage.total_tokens * \
            extra.get("n", 1) - whole.usage.prompt_tokens * (extra.get("n", 1) - 1)
        for ch in final.choices:
            assert ch.finish_reason == "tool_calls" and ch.message.content == whole.choices[0].message.content
            assert [(c.function.name, c.function.arguments) for c in ch.message.tool_calls] == want
            assert ch.message.tool_calls[0].id.startswith("call_")
    code, events = _chat(url, tools=TOOLS_WRITE, stop="<|assistant|>", stream=True)
    items = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls") or ()]
    assert len(items) > 5 and items[0]["function"] == {"name": "write", "arguments": ""}, items
    assert all(c["index"] == 0 for c in items) and "id" not in items[1]
    code, events = _chat(url, tools=TOOLS_WRITE, max_tokens=8, stream=True)
    code, cut = _chat(url, tools=TOOLS_WRITE, max_tokens=8)
    [o] = _streamed(events)
    assert o["finish_reason"] == cut["choices"][0]["finish_reason"] == "length"
    assert o["content"] == cut["choices"][0]["message"]["content"] and "tool_calls" not in cut["choices"][0]["message"]


def test_a_streamed_calls_piece_keeps_the_reasoning_sent_with_it():
    """--reasoning-parser: a stream chunk's delta carries the choice's reasoning not yet sent
    beside its content; a delta of tool_calls (a call streamed piece by piece, h76f: it came
    only at the end before) lost its tool_calls where reasoning was still unsent."""
    from specrt.reasoning import Apart

    pieces = Apart(iter(()), True)
    pieces.unsent[0] = "so"
    call = [{"index": 0, "function": {"arguments": '{"a'}}]
    assert pieces.delta(0, {"tool_calls": call}) == {"reasoning": "so", "reasoning_content": "so", "tool_calls": call}
    pieces.unsent[0] = "x"
    assert pieces.delta(0, {"content": "c", "tool_calls": call})["tool_calls"] == call
    assert pieces.delta(0, {"content": "c"}) == {"content": "c"} and pieces.delta(0, None) is None
