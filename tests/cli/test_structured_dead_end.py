"""A grammar no token can continue in the middle of an answer (h77b; session 76 left its stream's
finish null): the tokens before the dead end are given, then a UserError naming the grammar and
how far in it stopped, and the stream's finish is "error" (vLLM V1's FinishReason.ERROR). Through
the Python API (stats()), `specrt run` (exit 1; its --stats keep what was decoded, as an engine
failure's do) and `specrt serve` (a 400 naming the field; streamed, the pieces, then an error
event naming it). vLLM's llguidance backend ends such an answer with the EOS that llguidance's
error-state mask allows (finish "stop", a warning in its log): its answer then breaks the grammar
unsaid.

Real engines: tests/runtime/test_grammar.py's tiny Llama, its byte-level BPE tokenizer's
alphabet the letters of "hello world" (no token spells "7")."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from specrt.errors import UserError  # noqa: E402
from specrt.runtime.grammar import Constraint, compile_constraint  # noqa: E402
from specrt.runtime.session import Session  # noqa: E402
from tests.cli.test_serve import _in_process  # noqa: E402
from tests.runtime.test_grammar import _run, guided_engines  # noqa: E402

DEAD_END = "hello world 7"  # (the answer "hello world " in 3 tokens, then no token writes "7")
SAID = "no token of the vocabulary can continue the answer 3 token(s) in"


def _letters(folder) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=40, special_tokens=["<|end|>"]))
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    return guided_engines(tmp_path_factory.mktemp("dead_end"), _letters)


def test_the_python_api_gives_the_answer_so_far_then_the_error_finish_error(engines):
    """Session.stream: "hello", " world", " ", then the UserError; stats() say finish "error"
    (null before) with the 3 tokens given; the next stream is whole (finish "stop")."""
    with Session(engines, "fixed:2") as s:
        pieces = []
        with pytest.raises(UserError, match=r"^--regex: " + SAID.replace("(", r"\(").replace(")", r"\)")):
            for p in s.stream("hello", max_new_tokens=20, grammar=Constraint.regex(DEAD_END, "--regex")):
                pieces.append(p)
        st = s.stats()
        assert "".join(pieces) == "hello world " and st["finish_reason"] == "error"
        assert s.text.decode(st["output_token_ids"]) == "hello world " and st["new_tokens"] == 3
        assert "".join(s.stream("hello", max_new_tokens=20, grammar=Constraint.regex("hello"))) == "hello"
        assert s.stats()["finish_reason"] == "stop"


def test_run_keeps_what_was_decoded_and_says_the_error(engines, tmp_path):
    """`specrt run --regex`: the answer so far printed, exit 1 with the error; --stats written
    as an engine failure's (the prompt's finish "error", "failed" the error). Without the mend
    the run ended without its stats."""
    stats = tmp_path / "s.json"
    r = _run(engines, "--prompt", "hello", "--max-new-tokens", 20, "--governor", "fixed:2", "--regex", DEAD_END,
             "--stats", stats)
    assert r.exit_code == 1 and r.stdout.startswith("hello world \n") and f"error: --regex: {SAID}" in r.output
    assert "Traceback" not in r.output
    st = json.loads(stats.read_text())
    assert SAID in st["failed"] and st["prompts"][0]["finish_reason"] == "error"
    assert len(st["prompts"][0]["output_token_ids"]) == 3


def test_serve_answers_a_400_naming_the_field_and_streams_the_pieces_then_the_error(engines):
    """serve: a 400 invalid_request_error naming guided_regex (param null before); streamed, the
    pieces "hello world " and then an error event naming it (the OpenAI SDK raises APIError)."""
    with _in_process(engines, "fixed:2") as (_, _, url, _):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        ask = dict(model="tiny", prompt="hello", max_tokens=20, extra_body={"guided_regex": DEAD_END})
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(**ask)
        assert e.value.body["param"] == "guided_regex" and SAID in e.value.body["message"]
        texts = []
        with pytest.raises(openai.APIError) as e:
            for ch in c.completions.create(**ask, stream=True):
                texts.append(ch.choices[0].text)
        assert "".join(texts) == "hello world " and e.value.body["param"] == "guided_regex"
        assert e.value.body["type"] == "invalid_request_error" and SAID in e.value.body["message"]


FORCED = "no token of the vocabulary can continue the answer {} token(s) in"  # (the dead end's words)


def test_forced_text_the_vocabulary_cannot_spell_is_the_dead_end_error(engines):
    """r77i/h77j: a grammar that forces text with a byte no token writes ('"hello': no token holds
    the quote) made llguidance's mask its forced text tokenized without that byte ("hello"), which its
    parser then refused: an InternalError ("the matcher refused token 16 it allowed"), at the start
    and 3 tokens in. Now the dead end's UserError, finish "error"; a token its mask refused (a
    specrt bug) stays an InternalError."""
    from specrt.errors import InternalError

    with Session(engines, "fixed:2") as s:
        for regex, said, n in (('"hello', "", 0), ('hello world "hello', "hello world ", 3)):
            pieces = []
            with pytest.raises(UserError, match=rf"^--regex: {re.escape(FORCED.format(n))}"):
                for p in s.stream("hello", max_new_tokens=20, grammar=Constraint.regex(regex, "--regex")):
                    pieces.append(p)
            assert "".join(pieces) == said and s.stats()["finish_reason"] == "error"
        tok = s.text.tokenizer
        guide = compile_constraint(Constraint.regex('"hello'), s.text, s.text.vocab_size, (0,)).guide()
    assert guide.allowed().nonzero()[0].tolist() == [tok.token_to_id("hello")]
    with pytest.raises(InternalError, match=f"refused token {tok.token_to_id('h')} its mask refused"):
        guide.consume(tok.token_to_id("h"))


def test_forced_text_the_vocabulary_cannot_spell_is_a_400_in_serve_and_exit_1_in_run(engines):
    """r77i/h77j: a JSON schema whose const no token spells (its quote) was a 500 "InternalError:
    guided decoding: the matcher refused token 16 it allowed" on /v1/chat/completions and
    /v1/responses, counted an engine failure; `specrt run --regex '"hello'` exited 1 with it. Now
    a 400 naming the field, no failure counted; run's error the dead end's, without a traceback."""
    from tests.cli.test_serve import _post

    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"const": "hello"}}}
    with _in_process(engines, "fixed:2") as (app, _, url, _):
        failures = app.metrics.counts["engine_failures"]
        for path, body, param in (
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}],
                                          "response_format": fmt}, "response_format"),
                ("/v1/responses", {"input": "hello", "text": {"format": {"type": "json_schema", "name": "c",
                                                                         "schema": {"const": "hello"}}}}, "text")):
            code, r = _post(url, path, {"model": "tiny", "max_tokens" if "messages" in body else
                                        "max_output_tokens": 8, **body})
            assert code == 400 and r["error"]["param"] == param and FORCED.format(0) in r["error"]["message"], r
        assert app.metrics.counts["engine_failures"] == failures
    r = _run(engines, "--prompt", "hello", "--max-new-tokens", 8, "--regex", '"hello')
    assert r.exit_code == 1 and f"error: --regex: {FORCED.format(0)}" in r.output and "Traceback" not in r.output


def test_the_dead_end_names_the_text_the_grammar_forces(engines):
    """Session 77's leftover (NOTES): the dead end's error said the grammar needs text the tokenizer
    cannot write, not which: now llguidance's forced bytes after the tokens held (read from a fresh
    matcher given them: the matcher at its dead end is in its error state, where it says none), in
    the Python API's error and run's; none where the grammar forces nothing (a choice of two)."""
    with Session(engines, "fixed:2") as s:
        for regex, forced in ((DEAD_END, "'7'"), ('"hello', "'\"hello'"), ("hello world (7|8)", "")):
            with pytest.raises(UserError) as e:
                for _ in s.stream("hello", max_new_tokens=20, grammar=Constraint.regex(regex, "--regex")):
                    pass
            assert str(e.value).endswith("cannot write" + (": " + forced if forced else "") + ")"), str(e.value)
    r = _run(engines, "--prompt", "hello", "--max-new-tokens", 20, "--regex", DEAD_END)
    assert r.exit_code == 1 and f"error: --regex: {SAID} (the grammar needs text these engines' tokenizer cannot " \
        "write: '7')" in r.output
