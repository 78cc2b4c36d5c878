"""Mutation round m76h over session 76's new code (the tool-call parsers' parse side, the chat
template's notes and second render, keep_special, serve's bare echo): each test kills the
mutants its docstring names, which no test killed before."""

from __future__ import annotations

import json

import pytest

from specrt.tool_calls import parse
from tests.runtime.test_text import worded  # noqa: F401


def _calls(text: str, parser: str, tools=None, cut: bool = False) -> tuple[str | None, list]:
    """parse's content and (name, arguments as sent: the JSON string) of each call."""
    content, got = parse(text, parser, tools, cut)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in got]


def _typed(values: dict, props: dict) -> dict:
    """qwen3_coder's arguments of one block of ``values`` through a tool of ``props``."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": props}}}]
    block = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    [(name, args)] = _calls(f"<tool_call>\n<function=f>\n{block}</function>\n</tool_call>", "qwen3_coder", tools)[1]
    return json.loads(args)


def test_a_hermes_call_that_names_its_arguments_parameters_keeps_them():
    """m76h-T7: a hermes block {"name": "f", "parameters": {...}} (llama3_json's key, which
    models trained on both write) was the call f with arguments {}: its parameters dropped
    unsaid, the agent running f without them. They are its arguments now; both keys given
    is still unclear, the answer text."""
    assert _calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>', "hermes") == \
        (None, [("f", '{"x": 1}')])
    both = '<tool_call>{"name": "f", "parameters": {"x": 1}, "arguments": {}}</tool_call>'
    assert parse(both, "hermes") == (both, [])


def test_llama3_json_at_the_answers_start_takes_a_call_without_arguments():
    """m76h-T9: at the answer's start (after <|python_tag|>) a call may name no arguments
    ({"name": "a"}: arguments {}); only after text must it name them."""
    assert _calls('<|python_tag|>{"name": "a"}; {"name": "b", "arguments": {"y": 1}}', "llama3_json") == \
        (None, [("a", "{}"), ("b", '{"y": 1}')])


def test_llama3_json_after_text_takes_a_call_naming_arguments_and_no_comma_list():
    """m76h-T11, T12: after text a call naming "arguments" (not "parameters") is a call; calls
    joined by "," rather than ";" are no calls (the docstring's '{..}, {..}' stays text)."""
    assert _calls('Sure: {"name": "a", "arguments": {"x": 1}}', "llama3_json") == ("Sure: ", [("a", '{"x": 1}')])
    listed = '{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}'
    assert parse(listed, "llama3_json") == (listed, [])


def test_pythonic_refuses_what_is_no_call_of_literal_keywords():
    """m76h-T18, T19, T25: a ** argument (even of a literal dict), a callee that is no name
    (f()(x=1)) and -True (a bool, no number) leave the answer text, as does a null byte
    after the list (ast.parse refuses it: a 500 were that not caught)."""
    for bad in ('[f(**{"a": 1})]', '[f()(x=1)]', '[(lambda: 1)()]', '[f(x=1)]\0', '[f(x=-True)]'):
        assert parse(bad, "pythonic") == (bad, []), bad


def test_pythonic_literals_in_their_json_form():
    """m76h-T21, T28, T29: a name of several dots keeps their order (a.b.c), a dict's number
    keys become JSON's string keys, JSON's false is false (and true true)."""
    assert _calls('[a.b.c(x={1: "a", 2.5: "b"}, y=false, z=true)]', "pythonic") == \
        (None, [("a.b.c", '{"x": {"1": "a", "2.5": "b"}, "y": false, "z": true}')])


def test_qwen3_coder_reads_names_keys_and_values_exactly():
    """m76h-T32, T35, T36, T38, T40: a function name with a space or a quote and a parameter
    name holding "<" are no call; a value holding two </parameter> of its own ends at the one
    the next tag follows; a value without its </parameter> ends at the next parameter's tag on
    its own line; only one leading and one trailing newline of a value are dropped (its
    indent kept)."""
    for bad in ("<tool_call>\n<function=a b>\n</function>\n</tool_call>",
                "<tool_call>\n<function=a\"b>\n</function>\n</tool_call>",
                "<tool_call>\n<function=f>\n<parameter=a<b>\n1\n</parameter>\n</function>\n</tool_call>"):
        assert parse(bad, "qwen3_coder") == (bad, []), bad
    two = "<tool_call>\n<function=f>\n<parameter=s>\nuse </parameter> or </parameter>!\n</parameter>\n</function>"
    assert _calls(two, "qwen3_coder") == (None, [("f", '{"s": "use </parameter> or </parameter>!"}')])
    unclosed = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function>"
    assert _calls(unclosed, "qwen3_coder") == (None, [("f", '{"a": "1", "b": "2"}')])
    assert _typed({"s": "  indented\n"}, {"s": {"type": "string"}}) == {"s": "  indented\n"}


def test_qwen3_coder_cut_before_its_function_ends_is_text():
    """m76h-T34, T37: an answer cut by max_tokens after a closed value but before </function>
    may have lost a parameter, and one whose value has no </parameter> is unsure (the docstring:
    a cut answer's values closed by their </parameter>): text (not cut, the answer ended there:
    the call, as vLLM's)."""
    for text in ("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n",
                 "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>"):
        assert parse(text, "qwen3_coder", cut=True) == (text, [])
        assert _calls(text, "qwen3_coder") == (None, [("f", '{"x": "1"}')])


def test_qwen3_coder_types_as_vllms_names_and_spells_them():
    """m76h-T33, T42, T43, T44, T45, T46, T47: a schema's properties that are no object are
    none (not an AttributeError, a 500); type names in any case and spacing; a "null" type
    alone reads literals; a nullable string's "null" is null, a plain string's "None" text;
    "None" and "NULL" null where the type is no string; int, uint32 and long integers
    (0x10 and 5.5 no int: text, not Python literals);
    a whole number 3.0 and 1e2 sent as JSON integers, as vLLM's."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": []}}}]
    assert _calls("<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>", "qwen3_coder",
                  tools) == (None, [("f", '{"x": "1"}')])
    assert _typed({"n": "5", "b": "true"}, {"n": {"type": "Integer"}, "b": {"type": " BOOLEAN"}}) == {"n": 5, "b": True}
    assert _typed({"n": "5"}, {"n": {"type": "null"}}) == {"n": 5}
    assert _typed({"s": "null", "t": "None"}, {"s": {"type": ["string", "null"]}, "t": {"type": "string"}}) == \
        {"s": None, "t": "None"}
    assert _typed({"n": "None", "m": "NULL"}, {"n": {"type": "integer"}, "m": {"type": "integer"}}) == \
        {"n": None, "m": None}
    assert _typed({"n": "5", "u": "6", "l": "7", "h": "0x10", "r": "5.5"},
                  {"n": {"type": "int"}, "u": {"type": "uint32"}, "l": {"type": "long"}, "h": {"type": "int"},
                   "r": {"type": "int"}}) == {"n": 5, "u": 6, "l": 7, "h": "0x10", "r": "5.5"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "float"}}}}}]
    block = "<tool_call>\n<function=f>\n<parameter=x>\n3.0\n</parameter>\n<parameter=y>\n1e2\n</parameter>\n</function>"
    assert _calls(block, "qwen3_coder", tools) == (None, [("f", '{"x": 3, "y": 100}')])


def test_qwen3_coder_objects_json_first_then_python_literals_and_no_nan():
    """m76h-T48, T50, T51, T52: an object in JSON (true, null) is read as JSON, one in Python
    ({'a': True}) and a tuple as a literal; an array holding NaN and a number "inf" stay text
    (JSON holds neither; int(inf) an OverflowError, a 500, where it were tried)."""
    assert _typed({"o": '{"a": true, "b": null}', "p": "{'a': True}", "t": "(1, 2)"},
                  {"o": {"type": "object"}, "p": {"type": "object"}, "t": {"type": "tuple"}}) == \
        {"o": {"a": True, "b": None}, "p": {"a": True}, "t": [1, 2]}
    assert _typed({"a": "[NaN, 1]", "x": "inf", "y": "-inf"}, {"a": {"type": "array"}, "x": {"type": "number"},
                                                            "y": {"type": "number"}}) == \
        {"a": "[NaN, 1]", "x": "inf", "y": "-inf"}


def test_mistral_one_object_and_mixed_forms():
    """m76h-T53, T58: [TOOL_CALLS] followed by one JSON object (not in a list) is its call;
    the old JSON form followed by a second [TOOL_CALLS] is text (not the first call alone)."""
    assert _calls('[TOOL_CALLS] {"name": "f", "arguments": {"a": 1}}', "mistral") == (None, [("f", '{"a": 1}')])
    mixed = '[TOOL_CALLS] [{"name": "f", "arguments": {}}][TOOL_CALLS]g{}'
    assert parse(mixed, "mistral") == (mixed, [])


def test_a_call_needs_a_name_and_reads_arguments_sent_as_a_json_string():
    """m76h-T61, T63: an empty "name" is no call; "arguments" given as a JSON string of an
    object (as OpenAI sends them) is that object."""
    empty = '<tool_call>{"name": "", "arguments": {}}</tool_call>'
    assert parse(empty, "hermes") == (empty, [])
    assert _calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>', "hermes") == \
        (None, [("f", '{"a": 1}')])


def test_a_bare_echo_counts_its_prompt_once_and_nothing_of_the_request_before(worded):  # noqa: F811
    """m76h-S4, S6, S7, S8, S11: an echo with max_tokens 0 and no logprobs runs nothing,
    so the session's telemetry is still the request before's: none of it (its reused prefix,
    its target calls, its tokens) is counted for the echo; a client that leaves right after
    a choice's end has its prompt counted once (not again as "left at its echo"), as one that
    leaves at a later choice of the same prompt (n 2); a request without echo scores no
    prompt (the second of two reuses the first's prefix, which a scored prompt does not)."""
    from specrt.cmd_serve import Server
    from specrt.runtime.sampling import SamplingParams

    logs: list[str] = []
    app = Server(worded, "fixed:1", SamplingParams(), 8, "tiny", log=logs.append)
    try:
        for _ in range(2):  # (the second reuses the first's prefix)
            list(app.complete(app.parse({"prompt": "w1 w2 w3", "max_tokens": 3}, False)))
        assert app.session.generator.telemetry.prefix_reused > 0
        counts = dict(app.metrics.counts)
        list(app.complete(app.parse({"prompt": "w1 w2 w3", "max_tokens": 0, "echo": True}, False)))
        assert logs[-1].startswith("[3 prompt tokens (0 reused), 0 new in "), logs[-1]
        assert {k: v - counts[k] for k, v in app.metrics.counts.items() if v != counts[k] and k != "generation_seconds"
                } == {"prompt_tokens": 3}
        for n, reads in ((1, 2), (2, 3)):  # the echo and its end; n 2: the second choice's echo too
            pieces = app.complete(app.parse({"prompt": "w4 w2 w5", "max_tokens": 0, "echo": True, "n": n}, False))
            [next(pieces) for _ in range(reads)]
            pieces.close()  # (the client left)
            assert logs[-1].startswith("[3 prompt tokens (0 reused), 0 new in ") and "the client left" in logs[-1], \
                (n, logs[-1])
    finally:
        app.close()


def test_the_unread_note_knows_every_way_a_template_sets_or_tests_its_own_variable(tmp_path):
    """m76h-X8, X9, X10, X11: a name the template sets is none of its own variables unless it
    tests it ``is defined`` or ``is undefined`` or gives it ``default`` or ``d``; a block set
    ({% set x %}..{% endset %}) and each name of a tuple set ({% set a, b = .. %}) are sets."""
    from specrt.runtime.text import Text
    from tests.runtime.test_text import _chat_folder

    template = ("{% if u is undefined %}{% set u = 1 %}{% endif %}{{ u }}{% set d = d | d(2) %}{{ d }}"
                "{% if messages %}{% set blk %}x{% endset %}{% set a, b = 1, 2 %}{% endif %}{{ blk }}{{ a }}{{ b }}")
    f = _chat_folder(tmp_path / "a", {"chat_template": template})
    assert Text(f).unread_note({"zz": 1}).endswith("(the variables of its own it reads: d, u)")


def test_a_second_render_that_fails_too_says_the_first_renders_error(tmp_path):
    """m76h-X2: a template whose render with the parsed arguments fails with a TypeError gets
    them as sent; where that fails with a TypeError too, the first render's error is said (the
    one of the arguments as every other template gets them)."""
    from specrt.errors import UserError
    from specrt.runtime.text import Text
    from tests.runtime.test_text import _chat_folder

    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}]
    template = ("{% for m in messages %}{% if m.tool_calls %}{{ 'x' + m.tool_calls[0].function.arguments }}"
                "{{ 1 + 'b' }}{% endif %}{% endfor %}")
    f = _chat_folder(tmp_path / "a", {"chat_template": template})
    with pytest.raises(UserError, match="TypeError: can only concatenate str"):
        Text(f).prompt_text(conv, True, tools=[{"type": "function", "function": {"name": "f"}}])


def test_keep_special_keeps_added_words_and_makes_byte_fallback_ids_anew(tmp_path):
    """m76h-X15, X16: keep_special leaves out only the other special tokens: an added token
    that is not special stays text, as decode has it without keep_special; and the byte
    fallback ids made before it (a stream decoded earlier) are made again for its view, the
    kept token no longer among them."""
    from specrt.runtime.text import Text
    from tests.runtime.test_text import _byte_fallback

    _byte_fallback(tmp_path)
    text = Text(tmp_path)
    text.tokenizer.add_tokens(["plainword"])
    word = text.tokenizer.token_to_id("plainword")
    plain = text.decode([3 + 0x41, word, 2])
    assert 1 in text.byte_fallback_ids and "plainword" in plain
    view = text.keep_special("<s>")  # (a view since h76f: the text's own decode unchanged)
    assert 1 not in view.byte_fallback_ids and 2 in view.byte_fallback_ids and 1 in text.byte_fallback_ids
    assert view.decode([3 + 0x41, word, 2]) == plain
