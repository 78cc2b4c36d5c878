"""`specrt serve --reasoning-parser` (specrt/reasoning.py; h75b): a thinking model's chat answer
split into ``reasoning`` / ``reasoning_content`` and ``content`` as vLLM's qwen3 and deepseek_r1
parsers split it, whole and streamed, over texts and end to end through real (tiny) engines
whose word-level tokenizer spells two of its tokens ``<think>`` and ``</think>``."""

from __future__ import annotations

import json
import signal
import threading
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from specrt.reasoning import Splitter, begins_thinking, split
from specrt.runtime.sampling import SamplingParams
from tests.cli.test_serve import _post, _serving


def _pieces(text: str, cuts) -> tuple[str, str]:
    """The reasoning and the content a Splitter gives for ``text`` cut at ``cuts``, joined."""
    s, out = Splitter(True), []
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        out.append(s.push(text[a:b]))
    out.append(s.flush())
    return "".join(r for r, _ in out), "".join(c for _, c in out)


@pytest.mark.parametrize("text, thinking, want", [
    # Qwen3 (first release) writes <think> itself; nothing stripped, the newlines stay (vLLM's)
    ("<think>\nhm\n</think>\n\nok", True, ("\nhm\n", "\n\nok")),
    # the template opened the block in the prompt (Qwen3-2507 thinking, DeepSeek-R1): no start tag
    ("hm</think>\n\nok", True, ("hm", "\n\nok")),
    # cut by max_tokens inside the block: all reasoning, content null
    ("<think>hm, let me s", True, ("hm, let me s", None)),
    ("hm </th", True, ("hm </th", None)),  # (a tag's start at the cut is text)
    # the block closed in the prompt (enable_thinking false): all content, reasoning null, tags too
    ("ok </think> <think>", False, (None, "ok </think> <think>")),
    # after </think> everything is content, tags included; a second <think> inside is reasoning text
    ("a<think>b<think>c</think>d</think>", True, ("ab<think>c", "d</think>")),
    ("<think>\n\n</think>", True, ("\n\n", None)),  # nothing after the block: content null
    ("", True, ("", None)),
    ("h\u00e9 \u4e2d\u6587 \U0001f914</think>\u7b54\u6848 \u00e9", True,
     ("h\u00e9 \u4e2d\u6587 \U0001f914", "\u7b54\u6848 \u00e9")),
])
def test_a_whole_answer_splits_as_vllms_parsers_split_it(text, thinking, want):
    """The split of a whole answer (vLLM's extract_reasoning for qwen3 / deepseek_r1 with
    thinking on; prompt_is_reasoning_end's all-content with it closed). Fails without
    specrt/reasoning.py (h75b)."""
    assert split(text, thinking) == want


def test_a_tag_split_across_pieces_is_held_back_wherever_the_cut_falls():
    """Streamed, a tag cut between two decoded pieces (``</th`` + ``ink>``) is held back and
    never sent as text; at every cut (one and two cuts, unicode around the tags) the pieces
    join to the whole answer's split. Fails without specrt/reasoning.py (h75b)."""
    for text in ("<think>\nh\u00e9 <b> \u4e2d</think>\n\n\u7b54 </think>", "x</think>", "<<</thin</think><think>",
                 "<think>a<</think>b"):
        r, c = split(text, True)
        want = (r, c or "")
        for i in range(len(text) + 1):
            assert _pieces(text, [i]) == want, (text, i)
            for j in range(i, len(text) + 1):
                assert _pieces(text, [i, j]) == want, (text, i, j)
        assert _pieces(text, range(1, len(text))) == want, text  # a character a piece
    # nothing of a tag is sent until it is settled; a held "<" that was no tag comes out with the next piece;
    # after </think> nothing is held (no tag is read there)
    s = Splitter(True)
    assert s.push("a <") == ("a ", "") and s.push("b </th") == ("<b ", "") and s.push("ink> c <") == ("", " c <")


def test_where_an_answer_starts():
    """Inside the think block unless the prompt closed it (Qwen3's enable_thinking false
    renders ``<think>\\n\\n</think>\\n\\n``), or, for qwen3 alone, the template variables say
    enable_thinking false (vLLM's Qwen3ReasoningParser reads it; its DeepSeek-R1 one reads
    none). Fails without specrt/reasoning.py (h75b)."""
    opened, closed = "<|im_start|>assistant\n<think>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    for parser in ("qwen3", "deepseek_r1"):
        assert begins_thinking(parser, opened, {}) and begins_thinking(parser, "assistant\n", {})
        assert not begins_thinking(parser, closed, {})
        assert not begins_thinking(parser, closed, {"enable_thinking": True})
    assert not begins_thinking("qwen3", opened, {"enable_thinking": False})
    assert begins_thinking("deepseek_r1", opened, {"enable_thinking": False})


# ---- end to end: real engines whose tokenizer has <think> and </think> as words ----

THINK_TEMPLATE = (  # user w1, assistant w2, an assistant's reasoning in <think> ... </think> before its content;
    # the variable ``closed`` closes the generation's block in the prompt, as Qwen3's enable_thinking false does
    # (enable_thinking itself is read by no line here, as by Qwen3-2507 thinking models' templates)
    "{% for m in messages %}{{ {'system': 'w3', 'user': 'w1', 'assistant': 'w2'}[m.role] }} "
    "{% if m.reasoning_content is defined %}<think> {{ m.reasoning_content }} </think> {% endif %}{{ m.content }} "
    "{% endfor %}{% if add_generation_prompt %}w2{% if closed is defined %} <think> </think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def thinking(tmp_path_factory):
    """Engines of a tiny random Llama (16 tokens, depth 1, no draft) whose word-level
    tokenizer spells token 0 ``</think>`` and token 13 ``<think>`` (the others w1 .. w15 by number), with
    THINK_TEMPLATE; served (one Server, its parser set by each test), as a URL and the app.
    Greedy, "w8" answers 7 x w7, then </think>, then w5 ... and, 10 tokens on, <think>."""
    with think_server(tmp_path_factory.mktemp("thinking"), {0: "</think>", 13: "<think>"}) as served:
        yield served


@contextmanager
def think_server(root, words: dict, decoder=None, governor: str = "off"):
    """``thinking``'s engines and server in ``root``, the tokenizer's words ``words`` by id (the
    others w1 .. w15) and its ``decoder`` (tokenizers.decoders'; None: none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.cmd_serve import Server, make_server
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    target = write_tiny_target(root / "t", "llama", vocab_size=16)
    tok = Tokenizer(models.WordLevel({words.get(i, f"w{i}"): i for i in range(16)}, unk_token="w15"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if decoder is not None:
        tok.decoder = decoder
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({"chat_template": THINK_TEMPLATE}))
    export(target, None, root / "x")
    build_engines(root / "x", "onnxruntime", (1,), root / "e", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    app = Server(root / "e", governor, SamplingParams(), 8, "tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", app
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


ASK = [{"role": "user", "content": "w8"}]


def _chat(url: str, **body) -> dict:
    code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 20, **body})
    assert code == 200, r
    return r


def _streamed(url: str, **body) -> tuple[list[dict], dict]:
    """A streamed answer's deltas (the role chunk's aside) and its last chunk."""
    code, events = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 20, "stream": True, **body})
    assert code == 200, events
    return [e["choices"][0]["delta"] for e in events[1:] if e["choices"][0]["delta"]], events[-1]


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_serve_splits_the_thinking_from_the_answer_whole_and_streamed(thinking, parser):
    """Through serve and real engines: the answer without a parser holds the tags (the
    template opened the block in the prompt, so no <think> starts it); with one, reasoning
    (both field names, equal) is the text before </think> and content the rest, a later
    <think> included; streamed, the deltas carry reasoning until </think> and content after,
    never a tag, and join to the whole answer's fields; logprobs keep every token, each
    streamed entry once. Fails without the feature (no reasoning fields; h75b)."""
    url, app = thinking
    app.reasoning = None
    raw = _chat(url)["choices"][0]["message"]
    assert raw == {"role": "assistant", "content": raw["content"]}  # off: the answer as written (unchanged)
    assert raw["content"].startswith(" w7 w7") and " </think> w5" in raw["content"] and "<think>" in raw["content"]
    before, after = raw["content"].split("</think>", 1)
    app.reasoning = parser
    try:
        r = _chat(url, logprobs=True)
        m = r["choices"][0]["message"]
        assert m == {"role": "assistant", "reasoning": before, "reasoning_content": before, "content": after}
        ids = [e["id"] for e in r["choices"][0]["logprobs"]["content"]]
        assert len(ids) == r["usage"]["completion_tokens"] == 20 and 0 in ids  # (</think>'s entry kept)
        deltas, last = _streamed(url, logprobs=True)
        parts = [set(d) - {"logprobs"} for d in deltas]
        k = parts.index({"content"})  # reasoning until </think>, content after, in that order
        assert all(p == {"reasoning", "reasoning_content"} for p in parts[:k])
        assert all(p == {"content"} for p in parts[k:])
        assert "".join(d["reasoning"] for d in deltas[:k]) == before
        assert all(d["reasoning"] == d["reasoning_content"] for d in deltas[:k])
        assert "".join(d["content"] for d in deltas[k:]) == after and "</think>" not in json.dumps(deltas[:k])
        code, events = _post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 20, "stream": True,
                                                           "logprobs": True})
        sent = [e["id"] for ev in events for e in (ev["choices"][0].get("logprobs") or {}).get("content") or []]
        assert sent == ids  # each token's entry once, in order
        # </think>'s with the delta of its text's reasoning part (the space a word-level decoder puts before it)
        last_reasoning = [ev for ev in events if ev["choices"][0]["delta"].get("reasoning")][-1]["choices"][0]
        assert last_reasoning["delta"]["reasoning"] == " " and last_reasoning["logprobs"]["content"][-1]["id"] == 0
        assert last["choices"][0]["finish_reason"] == "length"
        # the completions endpoint parses nothing (vLLM's parsers are chat's)
        code, c = _post(url, "/v1/completions", {"prompt": "w1 w8 w2", "max_tokens": 20})
        assert code == 200 and c["choices"][0]["text"] == raw["content"] and "reasoning" not in c["choices"][0]
    finally:
        app.reasoning = None


def test_serve_an_answer_cut_in_its_thinking_and_one_whose_block_the_prompt_closed(thinking):
    """max_tokens before </think>: all reasoning, content null (vLLM's), streamed as reasoning
    deltas alone, one as each token comes. The template closing the block in the prompt (as Qwen3's does for
    enable_thinking false; here another variable, the case vLLM's non-streamed qwen3 gets
    wrong, vllm-project/vllm#53284): all content, reasoning null, for either parser, whole
    and streamed. Fails without the feature (h75b)."""
    url, app = thinking
    try:
        for parser in ("qwen3", "deepseek_r1"):
            app.reasoning = parser
            m = _chat(url, max_tokens=4)["choices"][0]["message"]
            assert m["content"] is None and m["reasoning"] == m["reasoning_content"] == " w7 w7 w7 w7", m
            deltas, _ = _streamed(url, max_tokens=4)
            # a delta a token as they come (not held back to the answer's end), without logprobs too
            assert [d["reasoning"] for d in deltas] == [" w7"] * 4
            assert all(set(d) == {"reasoning", "reasoning_content"} for d in deltas)
            app.reasoning = None
            raw = _chat(url, chat_template_kwargs={"closed": True})["choices"][0]["message"]["content"]
            assert raw and raw != _chat(url)["choices"][0]["message"]["content"]  # (another prompt)
            app.reasoning = parser
            m = _chat(url, chat_template_kwargs={"closed": True})["choices"][0]["message"]
            assert m == {"role": "assistant", "content": raw, "reasoning": None, "reasoning_content": None}
            deltas, _ = _streamed(url, chat_template_kwargs={"closed": True})
            assert all(set(d) == {"content"} for d in deltas) and "".join(d["content"] for d in deltas) == raw
    finally:
        app.reasoning = None


def test_serve_qwen3_reads_enable_thinking_false_where_the_template_ignores_it(thinking):
    """A template that reads no enable_thinking (the prompt's block left open, the variable
    given): qwen3 takes the whole answer as content, deepseek_r1 splits it, as vLLM's two
    parsers do (its Qwen3ReasoningParser reads the variable, its DeepSeekR1 one none). Fails
    without the feature (h75b)."""
    url, app = thinking
    try:
        app.reasoning = None
        raw = _chat(url, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]["content"]
        assert "</think>" in raw
        app.reasoning = "qwen3"
        m = _chat(url, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
        assert m["content"] == raw and m["reasoning"] is None
        app.reasoning = "deepseek_r1"
        m = _chat(url, chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
        assert m["reasoning"] + "</think>" + m["content"] == raw
    finally:
        app.reasoning = None


def test_the_reasoning_a_client_sends_back_reaches_the_template(thinking):
    """A conversation's round trip: the assistant message a client sends back with the
    reasoning it got (reasoning_content, or vLLM's ``reasoning``) renders it in the
    template's think block (runtime/text.py's REASONING_FIELDS), so the next turn's prompt
    holds it: two more prompt tokens for two words of reasoning than without. Fails without
    the feature (no reasoning to send back; h75b)."""
    url, app = thinking
    app.reasoning = "qwen3"
    try:
        m = _chat(url, max_tokens=10)["choices"][0]["message"]
        assert m["reasoning"] and m["content"]
        counts = {}
        for field in ("reasoning_content", "reasoning", None):
            sent = {"role": "assistant", "content": m["content"]}
            if field:
                sent[field] = m[field]
            conv = [*ASK, sent, {"role": "user", "content": "w9"}]
            code, r = _post(url, "/v1/chat/completions", {"messages": conv, "max_tokens": 2})
            assert code == 200, r
            counts[field] = r["usage"]["prompt_tokens"]
        words = len(m["reasoning"].split())
        assert counts["reasoning_content"] == counts["reasoning"] == counts[None] + words + 2  # <think> ... </think>
    finally:
        app.reasoning = None


def test_the_openai_client_reads_the_reasoning(thinking):
    """The openai SDK (skipped where it is not installed) reads ``reasoning_content`` and
    ``reasoning`` off the message and off each streamed delta (fields it does not declare: its
    models keep them), as its users of vLLM and DeepSeek's API read them. Fails without the
    feature (h75b)."""
    openai = pytest.importorskip("openai")
    url, app = thinking
    app.reasoning = "deepseek_r1"
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        m = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=20).choices[0].message
        assert m.reasoning_content == m.reasoning and m.reasoning.startswith(" w7 w7") and m.content.startswith(" w5")
        deltas = [c.choices[0].delta for c in client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=20, stream=True) if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == m.reasoning_content
        assert "".join(d.content or "" for d in deltas) == m.content
    finally:
        app.reasoning = None


def test_the_command_takes_the_option(thinking):
    """``specrt serve --reasoning-parser deepseek_r1`` serves split answers (the option reaches
    the server), without it the answer as written; any other name is refused before loading
    anything (exit 1, naming the choices). Fails without the option (h75b)."""
    from specrt.cli import main
    from specrt.reasoning import PARSERS

    r = CliRunner().invoke(main, ["serve", "--help"])
    assert "--reasoning-parser [qwen3|deepseek_r1]" in r.output and PARSERS == ("qwen3", "deepseek_r1")
    r = CliRunner().invoke(main, ["serve", ".", "--reasoning-parser", "granite"])
    assert r.exit_code == 1 and "'granite' is not one of 'qwen3', 'deepseek_r1'" in r.output, r.output
    _, app = thinking
    # (the last --governor counts: these engines have no draft)
    p, line = _serving(app.session.engines.folder, "--governor", "off", "--reasoning-parser", "deepseek_r1")
    try:
        url = line.split(" on ")[1].split(" ")[0].removesuffix("/v1")
        m = _chat(url, max_tokens=10)["choices"][0]["message"]
        assert m["reasoning"] == m["reasoning_content"] == " w7 w7 w7 w7 w7 w7 w7 " and m["content"] == " w5 w5"
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
        p.stderr.close()


def test_include_reasoning_false_drops_the_reasoning(thinking):
    """vLLM's ``include_reasoning`` (default true; OpenRouter's and Groq's clients send it):
    false takes the thinking out and sends it in neither field, whole (both null) nor streamed
    (no reasoning delta, no empty chunk for its tokens), the content as with it; true or null
    as left out; not a boolean: a 400 naming it. specrt refused the field as unrecognized (a
    walk, w75f)."""
    url, app = thinking
    app.reasoning = "qwen3"
    try:
        want = _chat(url)["choices"][0]["message"]
        assert want["reasoning"] and want["content"]
        assert _chat(url, include_reasoning=True)["choices"][0]["message"] == want
        m = _chat(url, include_reasoning=False)["choices"][0]["message"]
        assert m == {**want, "reasoning": None, "reasoning_content": None}
        deltas, last = _streamed(url, include_reasoning=False)
        assert all(set(d) == {"content"} for d in deltas) and "".join(d["content"] for d in deltas) == want["content"]
        assert last["choices"][0]["finish_reason"] == "length"
        code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "include_reasoning": "no"})
        assert code == 400 and r["error"]["param"] == "include_reasoning", r
        app.reasoning = None  # (no parser: taken, nothing to drop)
        assert _chat(url, include_reasoning=False)["choices"][0]["message"]["content"].startswith(" w7")
    finally:
        app.reasoning = None


def test_a_tokenizer_whose_end_tag_is_special_is_refused_at_the_start(tmp_path, monkeypatch):
    """A tokenizer that marks ``</think>`` special (an answer's text leaves special tokens out):
    `serve --reasoning-parser` refuses at its start, saying why; it served, and every answer
    came back all reasoning, its content null (a walk, w75f: " Hello world bye <|end|> " as
    reasoning). Without the option it serves (the answer as written)."""
    from specrt import cmd_serve
    from specrt.cli import main
    from specrt.errors import UserError
    from tests.cli.test_serve_tools import WORDS, _calling

    eng = _calling(tmp_path, ("</think>",), words=[("</think>" if w == "!" else w) for w in WORDS])

    def make_server(*args):
        raise UserError("it served")

    monkeypatch.setattr(cmd_serve, "make_server", make_server)
    for parser in ("qwen3", "deepseek_r1"):
        r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off", "--reasoning-parser",
                                      parser])
        assert r.exit_code == 1 and f"--reasoning-parser {parser}: the tokenizer marks </think> as a special" \
            in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(main, ["serve", str(eng), "--port", "0", "--governor", "off"])
    assert r.exit_code == 1 and "it served" in r.output, r.output


@pytest.fixture(scope="module")
def thinking_json(tmp_path_factory):
    """``thinking``'s engines (the same random model, the same ids) with words a grammar can
    hold: token 6 ``true``, 9 ``false``, decoded byte-level (llguidance reads the tokenizer),
    so the answer's text is its words joined: greedy, "w8" answers w7 x 7, </think>, w5 ..."""
    from tokenizers import decoders

    pytest.importorskip("llguidance")
    with think_server(tmp_path_factory.mktemp("thinking_json"), {0: "</think>", 13: "<think>", 6: "true", 9: "false"},
                      decoders.ByteLevel()) as served:
        yield served


BOOLEAN = {"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}}


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_a_grammar_holds_after_the_thinking(thinking_json, parser):
    """With --reasoning-parser, a request's structured output holds from the token after
    </think> (vLLM's, its reasoner's is_reasoning_end): the thinking is the target's own (the
    unguided answer's), the content JSON of the schema, finish "stop"; streamed, the deltas
    join to the whole answer's fields. Without a parser, or where the prompt closed the block,
    the grammar holds from the first token (no thinking: reasoning null). Fails without the
    mend (h76k): the grammar held from the first token, so the answer never thought (reasoning
    "", content "true")."""
    url, app = thinking_json
    try:
        app.reasoning = parser
        free = _chat(url)["choices"][0]["message"]
        assert free["reasoning"] == "w7" * 7 and free["content"].startswith("w5"), free
        r = _chat(url, **BOOLEAN)
        m = r["choices"][0]["message"]
        assert m == {"role": "assistant", "reasoning": free["reasoning"], "reasoning_content": free["reasoning"],
                     "content": "true"}, m
        assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 7 + 1 + 1
        deltas, last = _streamed(url, **BOOLEAN)
        assert "".join(d.get("reasoning", "") for d in deltas) == m["reasoning"]
        assert "".join(d.get("content") or "" for d in deltas) == "true"
        assert last["choices"][0]["finish_reason"] == "stop"
        # the block closed in the prompt: the grammar from the first token, the answer all content
        m = _chat(url, chat_template_kwargs={"closed": True}, **BOOLEAN)["choices"][0]["message"]
        assert m == {"role": "assistant", "content": "true", "reasoning": None, "reasoning_content": None}, m
        app.reasoning = None
        m = _chat(url, **BOOLEAN)["choices"][0]["message"]
        assert m == {"role": "assistant", "content": "true"}, m
    finally:
        app.reasoning = None


def test_a_thinking_that_never_ends_never_starts_the_grammar(thinking_json):
    """max_tokens before </think>: the grammar never starts, the answer all reasoning (the
    target's own tokens), content null, finish "length", whole and streamed; qwen3 with
    enable_thinking false (the template ignoring it) starts outside the block: the grammar
    holds from the first token, deepseek_r1 (which reads no such variable) thinks first. Fails
    without the mend (h76k: content "true", reasoning "")."""
    url, app = thinking_json
    try:
        app.reasoning = "qwen3"
        r = _chat(url, max_tokens=5, **BOOLEAN)
        m = r["choices"][0]["message"]
        assert m["content"] is None and m["reasoning"] == "w7" * 5 and r["choices"][0]["finish_reason"] == "length"
        deltas, last = _streamed(url, max_tokens=5, **BOOLEAN)
        assert [d["reasoning"] for d in deltas] == ["w7"] * 5 and last["choices"][0]["finish_reason"] == "length"
        off = {"chat_template_kwargs": {"enable_thinking": False}}
        m = _chat(url, **off, **BOOLEAN)["choices"][0]["message"]
        assert m == {"role": "assistant", "content": "true", "reasoning": None, "reasoning_content": None}, m
        app.reasoning = "deepseek_r1"
        m = _chat(url, **off, **BOOLEAN)["choices"][0]["message"]
        assert m["reasoning"] == "w7" * 7 and m["content"] == "true", m
    finally:
        app.reasoning = None


def test_a_grammar_after_the_thinking_is_lossless_under_prompt_lookup(thinking_json, monkeypatch):
    """Speculative (prompt lookup taking every round it can, drafts accepted) gives the
    target-only answer token for token: the thinking unmasked, the grammar's from the token
    after </think> (guided greedy under a reasoning parser; h76k). Fails without the mend (the
    grammar held from the first token: no thinking)."""
    from tests.cli.test_serve import _in_process
    from tests.runtime.test_generate import _always_look_up

    url, app = thinking_json
    _always_look_up(monkeypatch, whole=True)
    body = {**BOOLEAN, "logprobs": True}
    app.reasoning = "deepseek_r1"
    try:
        want = _chat(url, **body)["choices"][0]
        with _in_process(app.session.engines.folder, "off:ngram") as (fast, _, fast_url, _):
            fast.reasoning = "deepseek_r1"
            r = _chat(fast_url, **body)
        got = r["choices"][0]
        assert [e["id"] for e in got["logprobs"]["content"]] == [e["id"] for e in want["logprobs"]["content"]]
        assert got["message"] == want["message"] and want["message"]["reasoning"] == "w7" * 7
        assert r["specrt"]["tokens_per_call"] > 1, r["specrt"]  # (lookup drafts were accepted)
    finally:
        app.reasoning = None


def test_allowed_token_ids_hold_the_thinking_too(thinking_json):
    """allowed_token_ids under --reasoning-parser hold every token of the answer, its thinking's too
    (vLLM's are a logits mask, not a structured output held after </think>; h79d): without w7, the
    free answer's thinking word, the thinking is other words; beside a grammar, the grammar holds
    after </think> and the ids throughout. Fails with the rows before </think> left free
    (grammar.Deferred's: the thinking "w7" x 7)."""
    url, app = thinking_json
    try:
        app.reasoning = "qwen3"
        vocab, w7 = app.session.generator.vocab, app.session.text.tokenizer.token_to_id("w7")
        others = [i for i in range(vocab) if i != w7]
        free = _chat(url)["choices"][0]["message"]
        assert free["reasoning"] == "w7" * 7, free
        m = _chat(url, allowed_token_ids=others)["choices"][0]["message"]
        assert w7 not in app.session.last_output_ids and m["reasoning"] and "w7" not in m["reasoning"], m
        m = _chat(url, allowed_token_ids=others, **BOOLEAN)["choices"][0]["message"]
        assert w7 not in app.session.last_output_ids and m["content"] in ("true", "false", None), m
    finally:
        app.reasoning = None
