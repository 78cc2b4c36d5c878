"""specrt serve's vLLM endpoints (/tokenize, /detokenize, /ping, /version) and the code changed
with them in session 75 (echo's offsets, a chat's tools' share): what a mutation round (m75k)
found unpinned. Each test fails on its mutant and passes on the code; real HTTP against real
tiny engines (the word-level pair: "w0" .. "w15", its chat template "w3 system", "w1 user",
"w2" the assistant's turn)."""
from __future__ import annotations

import contextlib
import http.client
import json

import pytest

from specrt.engines.plan import parse_depths
from specrt.errors import UserError
from tests.cli.test_serve import _in_process, _post
from tests.cli.test_serve_tokenize import ASK, app_url  # noqa: F401
from tests.runtime.test_calibrate import prompts, small_vocab_engines  # noqa: F401
from tests.runtime.test_text import worded  # noqa: F401


def test_a_null_field_is_a_field_left_out_on_tokenize_as_elsewhere(app_url):  # noqa: F811
    """Mutant m75k-02 (``_refuse_others`` refusing a null field): a null is a field left out,
    whatever its name (vLLM's and OpenAI's request models read it so, and serve's completions
    take it so): a client that sends ``"chat_template": null`` or an unknown field as null to
    /tokenize or /detokenize gets its answer, not a 400."""
    _, url = app_url
    assert _post(url, "/tokenize", {"prompt": "w4 w5", "chat_template": None, "frob": None})[1]["tokens"] == [4, 5]
    assert _post(url, "/detokenize", {"tokens": [4, 5], "prompt": None}) == (200, {"prompt": "w4 w5"})


def test_a_refused_field_s_value_is_cut_in_tokenize_s_400(app_url):  # noqa: F811
    """Mutant m75k-04 (``_refuse_others`` saying a refused field's value whole): a field specrt
    does not do, sent with a long value (a chat template of some KB as vLLM's ``chat_template``
    takes it) is named in the 400 with the start of its value, not the whole of it sent back."""
    _, url = app_url
    code, r = _post(url, "/tokenize", {"prompt": "w1", "chat_template": "{{ x }}" * 2000})
    assert code == 400 and r["error"]["param"] == "chat_template", r
    assert "'chat_template' is not supported (got '{{ x }}" in r["error"]["message"]
    assert len(r["error"]["message"]) < 200, len(r["error"]["message"])


def test_the_first_depth_named_twice_is_the_one_said():
    """Mutant m75k-p02 (each repeat overwriting the one said): `--depths 2,2,3,3` said the last
    repeat ("depth 3 ... items 3 and 4"); the first is said, as the list is read, which the
    user mends first."""
    with pytest.raises(UserError, match=r"^--depths '2,2,3,3': depth 2 is named twice \(items 1 and 2\)"):
        parse_depths("2,2,3,3")


def test_an_engines_folder_that_is_none_is_not_taken_for_the_default_depths(tmp_path):
    """Mutant m75k-b01 (bench_governors' refuse_standard going on where the --engines folder has
    no manifest): `--engines nowhere --extra-governors fixed:2` was refused as "fixed:2 is in the
    standard set already", the set made of --depths' default (1,2,3,4,6,8), where the engines,
    had they been there, might not have depth 2; the folder's error is said by its load."""
    from argparse import Namespace

    from tests.real_model import tool

    args = Namespace(engines=tmp_path / "nowhere", depths=(1, 2, 3, 4, 6, 8), extra_governors=["fixed:2"], tree=1,
                     ngram=False, corpus=False)
    tool("bench_governors").refuse_standard(args)  # (no error: the load says the folder's)


@contextlib.contextmanager
def _server(engines, bos: bool = False, special: tuple[str, ...] = (), strict: bool = True, governor: str = "fixed:3",
            template_kwargs: dict | None = None):
    """A server of ``engines`` (model "tiny") in a thread (test_serve's _in_process): (its
    Server, its URL); ``bos``: its tokenizer adds "w0" before a text as a BOS-adding one does
    (Llama's, Gemma's), where the word-level one adds nothing; ``special``: words its tokenizer
    marks special (as a real one its template's markers); ``strict``: another model's name
    refused (serve's --model-name); ``template_kwargs``: --chat-template-kwargs'."""
    from tokenizers import processors

    with _in_process(engines, governor) as (app, _, url, _):
        app.model_strict = strict
        if template_kwargs is not None:
            app.session.chat_template_kwargs = template_kwargs
        if bos:
            app.session.text.tokenizer.post_processor = processors.TemplateProcessing(
                single="w0 $A", special_tokens=[("w0", 0)])
        app.session.text.tokenizer.add_special_tokens(list(special))
        yield app, url


def test_a_conversation_is_tokenized_without_the_tokenizer_s_special_tokens_unless_asked(worded):  # noqa: F811
    """Mutants m75k-12 (a conversation's ids with the tokenizer's special tokens added by
    default) and m75k-13 (``add_special_tokens`` not heard): with a tokenizer that adds a BOS,
    /tokenize gives a text prompt's ids with it and a conversation's without it (its template
    writes its own: a chat request's prompt has no second BOS, and /tokenize counts what the
    request would), each as asked where ``add_special_tokens`` is given (vLLM's defaults)."""
    with _server(worded, bos=True) as (_, url):
        assert _post(url, "/tokenize", {"prompt": "w4 w5"})[1]["tokens"] == [0, 4, 5]
        assert _post(url, "/tokenize", {"prompt": "w4 w5", "add_special_tokens": False})[1]["tokens"] == [4, 5]
        assert _post(url, "/tokenize", {"messages": ASK})[1]["tokens"] == [1, 4, 5, 2]
        assert _post(url, "/tokenize", {"messages": ASK, "add_special_tokens": True})[1]["tokens"] == [0, 1, 4, 5, 2]


def test_tokenize_renders_with_the_server_s_template_variables(worded):  # noqa: F811
    """Mutant m75k-15 (a conversation rendered with the request's template variables alone):
    `--chat-template-kwargs '{"cue": "w7"}'` renders every chat request's prompt with it;
    /tokenize's ids of the same conversation left it out, counting another prompt than the
    request's (the request's own chat_template_kwargs still over the server's)."""
    from specrt.runtime.session import Session

    with Session(worded, governor="off") as s:
        cued, other = s.encode(ASK, True, {"cue": "w7"}), s.encode(ASK, True, {"cue": "w8"})
    assert cued != other
    with _server(worded, template_kwargs={"cue": "w7"}) as (_, url):
        assert _post(url, "/tokenize", {"messages": ASK})[1]["tokens"] == cued
        assert _post(url, "/tokenize", {"messages": ASK, "chat_template_kwargs": {"cue": "w8"}})[1]["tokens"] == other


def test_return_token_strs_false_gives_no_pieces(app_url):  # noqa: F811
    """Mutant m75k-21 (the pieces given unless the field was left out): ``return_token_strs``
    false is as leaving it out, ``token_strs`` null (vLLM's)."""
    _, url = app_url
    assert _post(url, "/tokenize", {"prompt": "w4", "return_token_strs": False}) == \
        (200, {"count": 1, "max_model_len": 128, "tokens": [4], "token_strs": None})


def test_detokenize_refuses_another_model_s_name_as_tokenize_does(app_url):  # noqa: F811
    """Mutant m75k-23 (/detokenize not checking ``model``): a client pointed at another model
    (the server's --model-name another) learns it from /detokenize too: 404 model_not_found,
    not another tokenizer's text."""
    _, url = app_url
    code, r = _post(url, "/detokenize", {"tokens": [4], "model": "other"})
    assert code == 404 and r["error"]["code"] == "model_not_found" and r["error"]["param"] == "model", r
    assert _post(url, "/detokenize", {"tokens": [4], "model": "tiny"}) == (200, {"prompt": "w4"})


def test_a_post_to_ping_with_a_body_leaves_the_connection_to_its_next_request(app_url):  # noqa: F811
    """Mutant m75k-47 (POST /ping's body left unread): a probe that POSTs a body on a kept
    connection (SageMaker's, a client's keep-alive) had its connection closed after the answer
    (its body unread, it could not be kept: a new connection for each probe). Its body is read
    and the connection kept for its next requests, as /health's GET keeps it."""
    _, url = app_url
    host, port = url.rsplit("/", 1)[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        c.connect()
        sock = c.sock
        for _ in range(2):
            c.request("POST", "/ping", body=json.dumps({"probe": "x" * 100}),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            assert (r.status, json.loads(r.read())) == (200, {"status": "ok"})
            assert r.getheader("Connection") != "close" and c.sock is sock  # (kept: the same connection)
        c.request("GET", "/version")
        r = c.getresponse()
        assert r.status == 200 and "version" in json.loads(r.read()) and c.sock is sock
    finally:
        c.close()


def test_the_standard_set_with_corpus_alone_has_off_with_the_corpus(tmp_path):
    """Mutant m75k-b05 (bench_governors' standard_set giving off's lookup only with --ngram):
    with --corpus alone every speculative governor looks up in the corpus and "off:ngram:corpus"
    (lookup without a draft) is compared beside "off", as before standard_set was factored out;
    --extra-governors off:ngram:corpus is then of the set (refused), not run twice."""
    from argparse import Namespace

    from tests.real_model import tool

    bg = tool("bench_governors")
    args = Namespace(engines=None, depths=(1, 2), extra_governors=["OFF:ngram:corpus"], tree=1, ngram=False,
                     corpus=True)
    assert bg.standard_set((1, 2), args) == (":corpus", ["off", "off:ngram:corpus", "fixed:1:corpus", "fixed:2:corpus",
                                                          "adaptive:corpus", "dspark:corpus"])
    with pytest.raises(UserError, match=r"^--extra-governors: OFF:ngram:corpus is in the standard set already"):
        bg.refuse_standard(args)


def test_every_held_out_prompt_s_line_says_so(small_vocab_engines):  # noqa: F811
    """Mutants m75k-c01 (calibrate's progress line marking only the first held-out prompt) and
    m75k-c03 (an empty "()" where nothing is to be said): with half of 4 prompts held out (the
    1st and 3rd here: split_prompts), each of their lines says "(held out)", the training ones'
    nothing (the Python API without labels: "prompt N" is its name)."""
    from specrt.runtime.calibrate import calibrate, split_prompts

    said: list[str] = []
    calibrate(small_vocab_engines, prompts(16, 4, seed=1), max_new_tokens=4, holdout=0.5, write=False,
              log=said.append)
    held = split_prompts(4, 0.5)[1]
    assert len(held) == 2, held
    lines = [x for x in said if x.startswith("prompt ")]
    assert [i for i, x in enumerate(lines) if x.startswith(f"prompt {i + 1}/4 (held out): ")] == held, said
    assert [i for i, x in enumerate(lines) if x.startswith(f"prompt {i + 1}/4: ")] == [1, 3], said


def test_a_template_s_refusal_on_tokenize_names_no_server_path(tmp_path):
    """Mutant m75k-18 (/tokenize saying a template's refusal as raised): a conversation the chat
    template refuses (its raise_exception) is a 400 on 'messages' in the template's words, as a
    chat request's, without the server's path of the template file in it."""
    from tests.runtime.test_text import templated_engines

    templated_engines(tmp_path, "{% if messages[0].role == 'system' %}{{ raise_exception('no system prompt') }}"
                                "{% endif %}")
    with _server(tmp_path / "e", governor="off") as (_, url):
        code, r = _post(url, "/tokenize", {"messages": [{"role": "system", "content": "w3"}, *ASK]})
        assert code == 400 and r["error"] == {"message": "chat template: no system prompt", "param": "messages",
                                              "type": "invalid_request_error", "code": None}, r
        assert str(tmp_path) not in json.dumps(r)


def test_a_prompt_that_is_no_text_is_a_400_on_tokenize(app_url):  # noqa: F811
    """Mutant m75k-20 (/tokenize's prompt not checked as text): a lone surrogate (JSON's "\\ud800",
    a UTF-16 half) is no text the tokenizer takes: a 400 naming 'prompt' and the character, as
    a completion's prompt gets, not the tokenizer's exception."""
    _, url = app_url
    code, r = _post(url, "/tokenize", {"prompt": "w4 \ud800"})
    assert code == 400 and r["error"]["param"] == "prompt" and "lone surrogate U+D800" in r["error"]["message"], r


def test_detokenize_keeps_the_special_tokens_as_vllm_does(worded):  # noqa: F811
    """Mutant m75k-28 (/detokenize skipping special tokens): a conversation's ids from /tokenize
    give its template's text back, its markers too, where the tokenizer marks them special (as
    real ones mark <|im_start|>), as vLLM's /detokenize decodes them."""
    with _server(worded, special=("w1", "w2")) as (_, url):
        ids = _post(url, "/tokenize", {"messages": ASK})[1]["tokens"]
        assert ids == [1, 4, 5, 2]
        assert _post(url, "/detokenize", {"tokens": ids}) == (200, {"prompt": "w1 w4 w5 w2"})


def test_without_model_name_any_model_is_this_server_s(worded):  # noqa: F811
    """Mutant m75k-29 (``_check_model`` refusing another name without --model-name): serve's
    default name is a guess (the target folder's name), so without --model-name a request's
    model is taken whatever it says (a client's "gpt-4o" or the Hub id), on /tokenize,
    /detokenize and the completions alike; with it, another name is a 404."""
    with _server(worded, strict=False) as (_, url):
        for model in ("gpt-4o", "HuggingFaceTB/SmolLM2-135M-Instruct"):
            assert _post(url, "/tokenize", {"prompt": "w4", "model": model})[0] == 200, model
            assert _post(url, "/detokenize", {"tokens": [4], "model": model})[0] == 200, model
            code, r = _post(url, "/v1/completions", {"prompt": "w4", "model": model, "max_tokens": 1})
            assert code == 200, r


def test_tools_a_template_does_not_render_are_given_no_share(app_url):  # noqa: F811
    """Mutants m75k-33 (a share said where it is 0) and m75k-37 (the share measured against the
    messages rendered without the request's template variables, which it then took for the
    tools'): a chat request past the context with tools its template does not render
    (tool_choice none, no parser) says the messages and tools, without "N of them the tools'
    definitions", its chat_template_kwargs' tokens (the cue "w7") not counted as the tools'."""
    _, url = app_url
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "tools": tools, "tool_choice": "none",
                                                  "max_tokens": 125})
    assert code == 400 and r["error"]["param"] == "max_tokens", r
    assert "(4 in the messages and tools, 125 in the completion)" in r["error"]["message"], r
    code, r = _post(url, "/v1/chat/completions", {"messages": ASK, "tools": tools, "tool_choice": "none",
                                                  "chat_template_kwargs": {"cue": "w7"}, "max_tokens": 124})
    assert code == 400 and "(5 in the messages and tools, 124 in the completion)" in r["error"]["message"], r


def test_echoed_offsets_point_into_the_prompt_with_a_bos_adding_tokenizer(worded):  # noqa: F811
    """Mutant m75k-39 (echo's offsets from the prompt tokenized without the special tokens):
    with a tokenizer that adds a BOS, the prompt's ids (Text.ids_of's) hold it; tokenized
    without it, the count differed and every offset fell back to the prompt's decoding, one
    character out after the two spaces of "w4  w2" (m75e's F2 again). Each token's text starts
    at its offset in the answer's text (the BOS, which writes none, at 0)."""
    with _server(worded, bos=True) as (_, url):
        code, r = _post(url, "/v1/completions", {"prompt": "w4  w2", "max_tokens": 2, "echo": True, "logprobs": 0})
        assert code == 200, r
        ch = r["choices"][0]
        lp = ch["logprobs"]
        assert ch["text"].startswith("w4  w2") and lp["tokens"][:3] == ["w0", "w4", "w2"], (ch["text"], lp)
        assert lp["text_offset"][0] == 0
        for tok, at in zip(lp["tokens"][1:], lp["text_offset"][1:]):
            assert ch["text"][at:at + len(tok)] == tok, (tok, at, ch["text"], lp["text_offset"])


def test_each_prompt_s_echoed_offsets_point_into_its_own_text(app_url):  # noqa: F811
    """Mutant m75k-44 (every choice's echoed offsets counted in the first prompt's text): with a
    list of prompts, echo and logprobs, the second prompt's tokens' offsets were those of the
    first prompt's (as many tokens, other spacing): each choice's offsets point into its own
    text."""
    _, url = app_url
    prompts = ["w4  w2", " w5 w6"]
    code, r = _post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 1, "echo": True, "logprobs": 0})
    assert code == 200 and len(r["choices"]) == 2, r
    for ch, prompt in zip(r["choices"], prompts):
        assert ch["text"].startswith(prompt), (prompt, ch["text"])
        lp = ch["logprobs"]
        for tok, at in zip(lp["tokens"], lp["text_offset"]):
            assert ch["text"][at:at + len(tok)] == tok, (prompt, tok, at, ch["text"], lp["text_offset"])
