"""JSON's whitespace (Constraint.whitespace: vLLM's guided_whitespace_pattern, structured_outputs'
whitespace_pattern and disable_any_whitespace) and vLLM's structural tags (Constraint.structural_tag:
free text, a trigger, then its structure's begin, JSON of its schema and its end), h79e.

llguidance-level checks of the grammars built (what text each takes and refuses), and real
engines (tests/runtime/test_grammar.py's tiny Llama with a byte-level BPE and a random P-EAGLE
draft): the answer satisfies the constraint, and every speculative configuration gives
target-only decoding's tokens under it."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")

from specrt.errors import UserError  # noqa: E402
from specrt.runtime.governor import OffGovernor  # noqa: E402
from specrt.runtime.grammar import Constraint, compile_constraint  # noqa: E402
from tests.runtime.test_grammar import (CORPUS, DEPTHS, PROMPTS, SCHEMA, SCHEMA_NUM, _gen,  # noqa: E402,F401
                                        _governors, _satisfies, guided)

NUMS = {"type": "object", "required": ["n", "xs"],
        "properties": {"n": {"type": "integer"}, "xs": {"type": "array", "items": {"type": "integer"}}}}


def _takes(guided, constraint: Constraint, s: str) -> bool:
    """Whether ``constraint``'s grammar takes the whole of ``s`` (its tokens, then the end)."""
    engines, text, eos = guided
    g = compile_constraint(constraint, text, engines.export["target"]["vocab_size"], eos)
    m = g._matcher()
    ids = text.tokenizer.encode(s, add_special_tokens=False).ids
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


def test_a_whitespace_pattern_governs_the_whitespace_between_jsons_tokens(guided):
    """None: json.dumps's layout alone; "": no whitespace (vLLM's disable_any_whitespace under its
    llguidance backend); "[ ]?": one space or none around each token (outlines' default, as
    vLLM's guided_whitespace_pattern was read); \\s is JSON's four whitespace characters (Rust's
    is Unicode's: U+00A0 is not JSON). json_object's too. Fails without Constraint.whitespace."""
    texts = ['{"n":1,"xs":[1,2]}', '{"n": 1, "xs": [1, 2]}', '{ "n" : 1 , "xs" : [ 1 , 2 ] }',
             '{\n  "n": 1,\n  "xs": [1, 2]\n}', '{"n":  1,"xs":[1,2]}', '{"n":\u00a01,"xs":[1,2]}']
    for ws, taken in [(None, [False, True, False, False, False, False]),
                      ("", [True, False, False, False, False, False]),
                      ("[ ]?", [True, True, True, False, False, False]),
                      (r"\s*", [True, True, True, True, True, False]),
                      (r"[\s]{0,3}", [True, True, True, True, True, False])]:
        assert [_takes(guided, Constraint.json_schema(NUMS, whitespace=ws), s) for s in texts] == taken, ws
        assert [_takes(guided, Constraint.json(whitespace=ws), s) for s in texts] == taken, ws
    # a schema's own x-guidance is laid over the request's (as over json.dumps's layout)
    own = {**NUMS, "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
    assert _takes(guided, Constraint.json_schema(own, whitespace=""), texts[1])
    # the whitespace is the constraint's: two constraints apart
    assert Constraint.json(whitespace="").key() != Constraint.json().key() != Constraint.json(whitespace=" ").key()


def test_guided_json_under_a_whitespace_pattern_is_lossless_and_keeps_to_it(guided, monkeypatch):
    """Greedy under a schema with each layout: every speculative configuration gives target-only
    decoding's tokens; the answer is the schema's JSON, written compact under "" (json.dumps with
    "," and ":"), as json.dumps under None, and its whitespace one space at most under "[ ]?"."""
    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    vocab = engines.export["target"]["vocab_size"]
    seen = {}
    for schema, prompt in [(SCHEMA, PROMPTS[0]), (SCHEMA_NUM, PROMPTS[1])]:
        for ws in (None, "", "[ ]?"):
            c = Constraint.json_schema(schema, whitespace=ws)
            g = compile_constraint(c, text, vocab, eos)
            ref = _gen(engines, OffGovernor(DEPTHS)).generate(prompt, 60, eos, g)
            answer = text.decode(ref[:-1] if ref[-1] in eos else ref)
            _satisfies(c, answer)
            obj = json.loads(answer)
            if ws is None:
                assert answer == json.dumps(obj, ensure_ascii=False), answer
            elif ws == "":
                assert answer == json.dumps(obj, ensure_ascii=False, separators=(",", ":")), answer
            else:
                assert not re.search(r"\s\s|[\n\r\t]", answer), answer
            seen[schema is SCHEMA, ws] = answer
            for name, gov in _governors(engines):
                assert _gen(engines, gov).generate(prompt, 60, eos, g) == ref, f"{name} {ws!r}: output differs"
    assert seen[True, None] != seen[True, ""]  # (the layout is the grammar's, not the model's)


def _tag(trigger: str, schema: dict = SCHEMA, begin: str = "=paint>", end: str = "</t>") -> dict:
    return {"structures": [{"begin": trigger + begin, "schema": schema, "end": end}], "triggers": [trigger]}


def test_a_structural_tags_grammar_is_free_text_then_each_triggered_structure(guided):
    """Free text (none, or ending anywhere); a trigger starts the structure whose begin starts
    with it: the rest of its begin, JSON of its schema (closed, json.dumps's layout or the
    request's whitespace), its end, then free text again, more structures after; a begin that
    goes on otherwise, JSON of another shape and a structure left open are refused. vLLM's
    llguidance backend hands the schema's compiled grammar where a schema is read: any JSON
    (its shape, as llguidance builds it, takes '{"b": "z"}'). Two structures may share a
    trigger (each begin's rest decides). Fails without Constraint.structural_tag."""
    tag = _tag("<f", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "=x>", "</f>")
    texts = ['hi there <f=x>{"a": 1}</f> bye', 'no tags at all', '', '<f=x>{"a": 1}</f><f=x>{"a": 2}</f>',
             'hi <f=x>{"b": "z"}</f>', 'hi <f=y>{"a": 1}</f>', 'hi <f=x>{"a": 1}', 'hi <f=x>{"a":1}</f>',
             'hi <f=x>{"a": 1, "b": 2}</f>']
    assert [_takes(guided, Constraint.structural_tag(tag), s) for s in texts] == \
        [True, True, True, True, False, False, False, False, False]
    assert [_takes(guided, Constraint.structural_tag(tag, whitespace=""), s) for s in texts[:4] + texts[7:8]] == \
        [False, True, True, False, True]
    two = {"structures": [{"begin": "<fn=a>", "schema": {"type": "integer"}, "end": "</fn>"},
                          {"begin": "<fn=b>", "schema": {"type": "boolean"}, "end": "</fn>"}], "triggers": ["<fn="]}
    assert [_takes(guided, Constraint.structural_tag(two), s) for s in
            ["q <fn=a>1</fn> r <fn=b>true</fn>", "q <fn=b>1</fn>", "q <fn=c>1</fn>"]] == [True, False, False]


def test_a_trigger_that_is_a_special_token_is_that_token(tmp_path):
    """A trigger the tokenizer holds as a special token (Hermes' <tool_call>) is that token, not
    its text spelt in bytes (free text there), as llguidance.StructTag's assume_special reads
    "<...>" triggers; one that is not (here "<f>") is its text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from specrt.runtime.text import Text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=320, special_tokens=["<|end|>", "<tool_call>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    call, eos = text.tokenizer.token_to_id("<tool_call>"), text.tokenizer.token_to_id("<|end|>")
    tag = {"structures": [{"begin": "<tool_call>\n", "schema": {"type": "integer"}, "end": "\n</tool_call>"},
                          {"begin": "<f>", "schema": {"type": "boolean"}, "end": "</f>"}],
           "triggers": ["<tool_call>", "<f>"]}
    g = compile_constraint(Constraint.structural_tag(tag), text, text.vocab_size, (eos,))

    def takes(ids):
        m = g._matcher()
        return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()

    enc = lambda s: text.tokenizer.encode(s, add_special_tokens=False).ids  # noqa: E731
    assert takes(enc("hi ") + [call] + enc("\n7\n</tool_call> ok"))
    assert not takes(enc("hi ") + [call] + enc("\ntrue\n</tool_call>"))
    assert takes(enc("hi <tool_") + enc("call>\ntrue"))  # (its text in bytes: free text)
    assert takes(enc("a <f>true</f> b")) and not takes(enc("a <f>7</f>"))


@pytest.mark.parametrize("tag, said", [
    ({"structures": [], "triggers": ["<f"]}, r"st: expected \{'structures'.*both non-empty"),
    ({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}]}, r"st: expected \{'structures'"),
    ({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": [""]},
     r"st.triggers: expected non-empty strings"),
    ({"structures": [{"begin": "<g>", "schema": {}, "end": "</g>"}], "triggers": ["<f"]},
     r"st.structures\[0\].begin: '<g>' starts with none of the triggers \['<f'\]"),
    ({"structures": [{"begin": "<f>", "end": "</f>"}], "triggers": ["<f"]},
     r"st.structures\[0\]: expected \{'begin': text, 'schema'"),
    ({"structures": [{"begin": "<f>", "schema": {}, "end": "</f>", "x": 1}], "triggers": ["<f"]},
     r"st.structures\[0\]: expected"),
    ({"structures": [{"begin": "<f>", "schema": "{}", "end": "</f>"}], "triggers": ["<f"]},
     r"st.structures\[0\].schema: expected a JSON schema"),
    ({"structures": [{"begin": "<f>", "schema": {"type": "wat"}, "end": "</f>"}], "triggers": ["<f"]}, r"st: .*wat"),
    ([1], r"st: expected \{'structures'")])
def test_a_bad_structural_tag_is_a_user_error_naming_its_part(guided, tag, said):
    engines, text, eos = guided
    with pytest.raises(UserError, match=said):
        compile_constraint(Constraint.structural_tag(tag, "st"), text, engines.export["target"]["vocab_size"], eos)


def _trigger(text, free: list[int]) -> tuple[str, int]:
    """Two tokens of ``free`` whose text is printable ASCII and first spelt where they end, as a
    trigger, and the number of tokens up to its end."""
    for at in range(len(free) - 2):
        before, trig = text.decode(free[:at]), text.decode(free[at: at + 2])
        whole = text.decode(free[: at + 2])
        if whole == before + trig and trig.isascii() and trig.isprintable() and trig.strip() \
                and whole.find(trig) == len(before):
            return trig, at + 2
    raise AssertionError(f"no trigger in {text.decode(free)!r}")


def test_a_structural_tag_holds_the_structure_after_the_models_trigger_losslessly(guided, monkeypatch):
    """The trigger is two tokens the greedy answer writes in free text (a structural tag's whose
    trigger it never writes: valid UTF-8, which this random model's own answer is not): the
    answer is that one up to the trigger, then the rest of the begin, JSON of the schema and
    the end, then free text; every speculative configuration (prompt lookup forced into every
    round) gives target-only decoding's tokens. Fails without structural tags."""
    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    vocab = engines.export["target"]["vocab_size"]
    for prompt, ws in [(PROMPTS[0], None), (PROMPTS[1], ""), (PROMPTS[2], None)]:
        never = compile_constraint(Constraint.structural_tag(_tag("\x01q")), text, vocab, eos)
        free = _gen(engines, OffGovernor(DEPTHS)).generate(prompt, 30, eos, never)
        trig, n = _trigger(text, free)
        g = compile_constraint(Constraint.structural_tag(_tag(trig), whitespace=ws), text, vocab, eos)
        ref = _gen(engines, OffGovernor(DEPTHS)).generate(prompt, 80, eos, g)
        assert ref[:n] == free[:n]
        said = text.decode(ref)
        head = text.decode(free[:n]) + "=paint>"
        assert said.startswith(head) and "</t>" in said[len(head):], said
        body = said[len(head): said.index("</t>", len(head))]
        _satisfies(Constraint.json_schema(SCHEMA), body)
        obj = json.loads(body)
        assert body == json.dumps(obj, ensure_ascii=False, separators=(", ", ": ") if ws is None else (",", ":"))
        for name, gov in _governors(engines):
            assert _gen(engines, gov).generate(prompt, 80, eos, g) == ref, f"{name} {trig!r}: output differs"


def test_run_takes_a_structural_tag_file_and_a_json_whitespace_pattern(guided, tmp_path):
    """h79j: `specrt run --structural-tag FILE` (vLLM's form, as serve's response_format) holds the
    answer to free text up to the trigger (two tokens the free answer writes), then the begin,
    JSON of the schema and the end, and --json-whitespace is that JSON's whitespace ("" compact;
    with --json-schema "[ ]?": never two spaces); governor off and fixed:3:ngram give the same
    text. Both options were "No such option" before."""
    from tests.runtime.test_grammar import _run

    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    never = compile_constraint(Constraint.structural_tag(_tag("\x01q")), text, vocab, eos)
    free = _gen(engines, OffGovernor(DEPTHS)).generate(text.encode("hello", False), 30, eos, never)
    trig, n = _trigger(text, free)
    (tmp_path / "tag.json").write_text(json.dumps({"type": "structural_tag", **_tag(trig)}))
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    head = text.decode(free[:n]) + "=paint>"
    for opts, held in [(["--structural-tag", tmp_path / "tag.json"], (", ", ": ")),
                       (["--structural-tag", tmp_path / "tag.json", "--json-whitespace", ""], (",", ":")),
                       (["--json-schema", tmp_path / "s.json", "--json-whitespace", "[ ]?"], None)]:
        said = set()
        for gov in ("off", "fixed:3:ngram"):
            r = _run(engines.folder, "--prompt", "hello", "--max-new-tokens", 80, "--governor", gov, *opts)
            assert r.exit_code == 0, r.output
            said.add(r.stdout.rsplit("\n", 1)[0] if r.stdout.endswith("\n") else r.stdout)
        assert len(said) == 1, (opts, said)
        answer = said.pop()
        if held is None:
            _satisfies(Constraint.json_schema(SCHEMA), answer)
            assert "  " not in answer and not re.search(r"[\n\r\t]", answer), answer
            continue
        assert answer.startswith(head) and "</t>" in answer[len(head):], answer
        body = answer[len(head): answer.index("</t>", len(head))]
        assert body == json.dumps(json.loads(body), separators=held), body


@pytest.mark.parametrize("opts, said", [
    (["--json-whitespace", ""], "--json-whitespace applies to JSON .*; give one of them"),
    (["--regex", "a+", "--json-whitespace", ""], "--json-whitespace applies to JSON .*; the answer is held to --regex"),
    (["--json", "--json-whitespace", "[ "], "--json-whitespace: "),
    (["--json", "--structural-tag", "TAG"], "--json and --structural-tag: give one structured output option"),
    (["--structural-tag", "BAD"], "--structural-tag BAD: not valid JSON"),
    (["--structural-tag", "ARR"], "--structural-tag ARR: expected a JSON object"),
    (["--structural-tag", "XGR"], "'--structural-tag XGR.format.tags\\[0\\]': only"),
    (["--structural-tag", "TAG"], "--structural-tag TAG: .*triggers"),
])
def test_run_refuses_a_bad_structural_tag_or_whitespace_naming_it(guided, tmp_path, opts, said):
    from tests.runtime.test_grammar import _run

    files = {"BAD": "{nope", "ARR": "[1]", "TAG": json.dumps({"structures": [], "triggers": ["<f"]}),
             "XGR": json.dumps({"format": {"type": "triggered_tags", "triggers": ["<f"], "tags": [
                 {"begin": "<f>", "content": {"type": "regex", "pattern": "a"}, "end": "</f>"}]}})}
    for k, body in files.items():
        (tmp_path / f"{k}.json").write_text(body)
        opts = [str(tmp_path / f"{k}.json") if o == k else o for o in opts]
        said = said.replace(k, re.escape(str(tmp_path / f"{k}.json")))
    r = _run(guided[0].folder, "--prompt", "hello", "--max-new-tokens", 8, *opts)
    assert r.exit_code == 1 and re.search("error: " + said, r.output), r.output
    assert "Traceback" not in r.output
