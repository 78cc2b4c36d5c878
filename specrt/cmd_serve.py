"""``specrt serve``: the engines behind an OpenAI-compatible HTTP endpoint.

    specrt serve ENGINES [--host 127.0.0.1] [--port 8000] [--governor auto] [--max-new-tokens 256]
                         [--tool-call-parser hermes|llama3_json|pythonic|qwen3_coder|mistral|...
                          [--enable-auto-tool-choice]]
                         [--reasoning-parser qwen3|deepseek_r1]
                         [--ssl-certfile CERT --ssl-keyfile KEY [--ssl-ca-certs CAS --ssl-cert-reqs 0|1|2]]

    POST /v1/chat/completions   messages -> an answer through the exported chat template
    POST /v1/completions        a text prompt, no template
    POST /v1/responses          OpenAI's Responses API: its request as a chat completion's (specrt/responses.py)
    GET, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items: a response kept (--responses-store)
    POST /tokenize, /detokenize vLLM's: a prompt's or a conversation's token ids; ids -> their text
    GET  /v1/models, /health, /metrics (Prometheus text: requests, tokens, acceptance, waits); HEAD too
    GET  /version, /ping        vLLM's: specrt's version; /health's answer (/ping: POST too)

Requests take ``max_tokens`` (or ``max_completion_tokens``; with the prompt past the
engines' context: 400, as vLLM answers, a chat's tools' share said), ``temperature``, ``top_p``,
``top_k``, ``seed``, ``stop`` (a string or a list), ``stream`` (server-sent events, as
OpenAI's, ending with ``data: [DONE]``; ``stream_options.include_usage`` adds the usage
chunk, and with vLLM's ``continuous_usage_stats`` every chunk carries its choice's counts
so far) and logprobs (chat: ``logprobs`` true with ``top_logprobs`` 0-20; completions:
``logprobs`` 0-20; each output token's log-probability under the target, the model's own
distribution before temperature / top-k / top-p, as vLLM reports by default) and ``n``
(up to 16 choices, decoded one after another, choice j of each prompt with seed + j; a seed repeats its
text whatever the server decoded before only with ``--reproducible``: rejection sampling's
draws follow the drafts, which follow the server's state); chat also takes
``chat_template_kwargs`` (the template's variables, e.g. ``{"enable_thinking": false}``, over
``--chat-template-kwargs``) and ``tools`` (function definitions, rendered by the template; with
``--tool-call-parser`` and ``tool_choice`` auto the answer's calls come back as ``tool_calls``,
whole or streamed: specrt/tool_calls.py; without it such a request is a 400, as vLLM's without
--enable-auto-tool-choice, a flag taken with --tool-call-parser and refused alone, as vLLM's) and OpenAI's
``prediction`` (Predicted Outputs: text the answer is expected to repeat, its tokens proposed beside the
draft, runtime/prediction.py; usage's ``completion_tokens_details`` counts them); completions also take
a prompt of token ids, a list of prompts (n choices each, prompt by prompt, 64 choices at
most) and ``echo`` (the prompt first, its tokens' logprobs with
``logprobs``, ``max_tokens`` 0 allowed: a prompt scored only, as lm-evaluation-harness asks
for log-likelihoods). Fields that would change the output and that specrt does not do
(penalties, min_p, logit_bias, echo on chat, best_of, suffix, vLLM's min_tokens / ignore_eos /
stop_token_ids, ...) are refused with 400 unless they hold their neutral value; fields that change nothing here (metadata,
store, service_tier, cache keys; ``user`` too but under ``--isolate-clients``) are
ignored; any other field is refused as OpenAI refuses it ("Unrecognized request argument
supplied"), so a misspelt one is not dropped; a null is a field left out, whatever its name. Each response carries a
``specrt`` object beside ``usage``: tau (the draft's), tokens a target call (every round's,
prompt lookup's included), tokens/s, the time to the first token and the prompt tokens
reused. With ``--reasoning-parser`` (specrt/reasoning.py) a thinking model's chat answer comes
with its ``<think>`` text apart from the answer, as ``reasoning`` and ``reasoning_content``
(message and stream deltas), as vLLM's parsers give it. Structured output (runtime/grammar.py,
with llguidance): ``response_format`` json_object, json_schema or structural_tag, vLLM's guided_json /
guided_regex / guided_choice / guided_grammar and structured_outputs hold the answer to a grammar
(``structured``; one a request; JSON's whitespace as guided_whitespace_pattern / whitespace_pattern /
disable_any_whitespace say), and tool_choice "required" or a named function hold a chat answer to vLLM's JSON
schema of the calls, which come back as ``tool_calls`` (``forced_tools``; tool_calls.forced_message).

One stream at a time (batch 1, as the engines are built): requests wait on a lock, in
the order they arrive (TurnLock); a client that reads nothing of its answer for
``--write-timeout`` seconds (5) is taken for gone and the next request goes on. One
generator (one pair of KV caches) serves every request; each decoding mode (greedy; each
temperature / top-k / top-p) gets a governor of its own, calibrated for that mode (the
8 most recent modes' are kept: what each learnt online and its lookup rates go with it;
the session growth, up to GROW_TOKENS tokens, is one for every mode), swapped in for its
requests. A conversation's next turn reuses the rows of its earlier turns and answers
(prefix reuse) as `specrt chat` does, whatever mode each turn asks for (KV rows depend on
the tokens only); SNAPSHOTS (``--prefix-snapshots``) other conversations' rows are kept set aside
(Generator.prefix_snapshots), so clients taking turns keep theirs. Those rows and session
growth are shared by every request unless ``--isolate-clients``: then rows are reused
only within one ``user``, growth is off and a kept response is its ``user``'s (Server.owner).
The standard library's HTTP server, speaking HTTP/1.1 (a connection kept KEEP_ALIVE seconds,
5, for its next request; a stream sent chunked, or to an HTTP/1.0 client ending its connection),
over TLS with vLLM's --ssl-* options (specrt/tls.py; the handshake in the connection's own thread,
Handler._handshake): for a local endpoint or behind a proxy, not for untrusted networks. Bad
requests get HTTP 400 with OpenAI's error object
naming the field; the server keeps serving. /tokenize and /detokenize (Server.tokenize) use the
tokenizer and the chat template alone, in the request's own thread: they wait for no answer.
/v1/responses (specrt/responses.py) maps its request onto a chat completion's, so all the above
holds for it (the template, sampling, stop, seed, limits, tools, reasoning, structured output,
the key, metrics and the log), and gives the answer as a response object or its stream's events;
the ``--responses-store`` most recent responses (RESPONSES_STORE; 0: none) are kept in memory for
previous_response_id and the GET / DELETE routes (responses.Store); what it does not do
(built-in tools, background, conversation) is a 400 naming the field.
"""

from __future__ import annotations

import errno
import json
import math
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import unquote

import click

from specrt.errors import EngineFailure, UserError, describe_os_error, json_problem
from specrt.prompt_files import CONVERSATION, conversation_problem, is_token_ids, joined
from specrt.sampling_options import (Checked, PathArg, argv_text, existing_folder, temperature_option,
                                     template_kwargs_option)
from specrt.reasoning import PARSERS as REASONING_PARSERS
from specrt.reasoning import tags_problem as reasoning_tags_problem
from specrt.tls import CERT_REQS, close_notify, plain_http_answer
from specrt.tool_calls import (NO_PARAMETERS, PARSERS, ForcedCalls, Streamed, ToolsRefused, forced_message,
                               parser_problem, rendered, request_tools, tools_unread)
from specrt.tool_calls import message as tool_message

MAX_MODES = 8  # governors kept, one per decoding mode (the generator and its KV caches are one)
SNAPSHOTS = 4  # other conversations' rows a generator keeps by default (Generator.prefix_snapshots)
MAX_BODY = 16 << 20  # bytes of request body accepted
MAX_N = 16  # choices a request may ask for (decoded one after another)
MAX_CHOICES = 64  # prompts x n, a request
WRITE_TIMEOUT = 5.0  # seconds an answer's write may wait for a client that reads nothing (--write-timeout)
WRITE_PIECE = 1 << 16  # bytes of a whole answer written at a time, each within WRITE_TIMEOUT
KEEP_ALIVE = 5.0  # seconds a kept-alive connection waits for its next request (vLLM's VLLM_HTTP_TIMEOUT_KEEP_ALIVE)
SETTLE_SECONDS = 5.0  # at the stop, how long the connections taken may take to get their answers (drain)
RESPONSES_STORE = 64  # /v1/responses kept for previous_response_id and GET (--responses-store; responses.Store)
LEFT = 499  # requests_total's status for a client that left before its answer (nginx's "client closed request")


class BadRequest(Exception):
    """An OpenAI error object's message, param and HTTP status; ``code`` its machine-readable
    code where OpenAI gives one ("model_not_found", "invalid_api_key"), else null."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code

    named = False  # its param is a response request's own field (Handler._named renames chat's)


def _number(body: dict, name: str, default, kind, lo=None, hi=None, lo_open=False):
    v = body.get(name)
    if v is None:
        return default
    # a whole float is an integer (1.0: pydantic's lax mode, vLLM's, takes it; it was a 400 here)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and not math.isfinite(v)) \
        and (kind is float or isinstance(v, int) or v.is_integer())  # (Infinity, which Python's JSON reads: refused)
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v <= hi
    if not ok:
        rng = ("" if lo is None else f" {'>' if lo_open else '>='} {lo}") + ("" if hi is None else f", <= {hi}")
        raise BadRequest(f"'{name}' must be {'an integer' if kind is int else 'a number'}{rng}; got {v!r}", name)
    try:
        return kind(v)
    except OverflowError:  # an integer past a float's range (JSON has no limit)
        raise BadRequest(f"'{name}' is out of range; got an integer of {len(str(abs(v)))} digits", name) from None


# Fields that would change what is generated and that specrt does not do: refused unless
# they hold their neutral value, so that no client gets output it did not ask for. (Others,
# e.g. user, metadata, service_tier, change nothing here and are ignored.)
NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
           "min_p": (0, 0.0), "logit_bias": ({},), "echo": (False,), "best_of": (1,), "suffix": ("",),
           "tools": ([],), "functions": ([],), "tool_choice": ("none", "auto"), "function_call": ("none", "auto"),
           # vLLM's extra sampling and template parameters, and OpenAI's newer ones
           "min_tokens": (0,), "ignore_eos": (False,), "stop_token_ids": ([],), "bad_words": ([],),
           "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
           "spaces_between_special_tokens": (True,), "add_generation_prompt": (True,),
           "continue_final_message": (False,), "use_beam_search": (False,), "length_penalty": (1, 1.0),
           "modalities": (["text"],), "parallel_tool_calls": (True, False), "priority": (0,),
           "return_token_ids": (False,), "return_tokens_as_token_ids": (False,)}
# vLLM's structured output fields (before its 0.12: structured_outputs' json, regex, choice, grammar since)
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
SO_TAKEN = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
# Fields with no neutral value that specrt does not do: refused whenever given (null aside)
NOT_DONE = ("chat_template", "logits_processors", "audio", "reasoning_effort", "web_search_options",
            "verbosity", "mm_processor_kwargs", "documents", "vllm_xargs")
# OpenAI's: include_usage, and include_obfuscation (padding against a side channel: nothing to pad
# here, taken and ignored); vLLM's continuous_usage_stats: with include_usage (as vLLM reads it),
# every chunk's usage is its choice's prompt and completion tokens so far, not null
STREAM_OPTIONS = ("include_usage", "include_obfuscation", "continuous_usage_stats")
# Fields read, or that change nothing here (who asks, what a hosted API would store): every
# other one is refused as OpenAI refuses it ("Unrecognized request argument supplied"), so
# that a misspelt max_tokens or a field of another server's is not silently dropped
SHARED_FIELDS = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
                 "seed", "logprobs", "user", "metadata", "store", "service_tier", "prompt_cache_key",
                 "prompt_cache_retention", "safety_identifier", "request_id", "cache_salt", "kv_transfer_params",
                 # structured output (Server.structured); vLLM's guided_decoding_backend names its backend, taken
                 # and ignored (llguidance here, whichever is named: the allowed tokens are the grammar's)
                 "response_format", *GUIDED, "structured_outputs", "guided_decoding_backend",
                 "guided_whitespace_pattern",
                 # vLLM's: the answer's tokens held to a set (Server._allowed_ids), the prompt's logprobs
                 # (Server._choices, vllm_prompt_logprobs), the prompt cut to its last (or first) tokens
                 # (Server._truncation)
                 "allowed_token_ids", "prompt_logprobs", "truncate_prompt_tokens", "truncation_side"}
FIELDS = {True: SHARED_FIELDS | {"messages", "max_completion_tokens", "top_logprobs", "chat_template_kwargs",
                                 "add_special_tokens", "include_reasoning", "prediction"},
          # (the latter two: their own 400)
          False: SHARED_FIELDS | {"prompt", "echo", "chat_template_kwargs", "add_special_tokens", "prediction"}}


# /tokenize's and /detokenize's fields (vLLM's; its chat_template and processor kwargs refused as NOT_DONE)
CHAT_ONLY = ("add_generation_prompt", "chat_template_kwargs", "tools")
TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "continue_final_message", "return_token_strs",
                   *CHAT_ONLY}
DETOKENIZE_FIELDS = {"model", "tokens"}


def _refuse_others(body, fields) -> None:
    """400 for a body that is not an object, and for a field not in ``fields``: one specrt does
    not do (NOT_DONE) or an unknown one, as OpenAI refuses it."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for name, v in body.items():
        if v is None or name in fields:  # null is the field left out, as vLLM's and OpenAI's request models read it
            continue
        if name in NOT_DONE:
            raise BadRequest(f"'{name}' is not supported (got {v!r:.80})", name)
        raise BadRequest(f"Unrecognized request argument supplied: {name}", name)


def _unsupported(body: dict, chat: bool, allowed=()) -> None:
    _refuse_others(body, FIELDS[chat] | NEUTRAL.keys())
    # vLLM's add_special_tokens: its defaults are what specrt does (chat: the template adds
    # them, completions: the tokenizer), anything else is refused
    special = body.get("add_special_tokens")
    if special is not None and not (isinstance(special, bool) and special == (not chat)):
        raise BadRequest(f"'add_special_tokens' is not supported (got {body['add_special_tokens']!r}; only "
                         f"{not chat!r} or leaving it out)", "add_special_tokens")
    for name, neutral in NEUTRAL.items():
        v = body.get(name) if name not in allowed else None
        if v is not None and not any(isinstance(v, bool) == isinstance(x, bool) and v == x for x in neutral):
            if not chat and name in ("tools", "tool_choice"):  # (said "not supported ... only []": chat takes them, w75f)
                raise BadRequest(f"'{name}' applies to /v1/chat/completions (function tools go through the chat "
                                 "template; a completion's prompt is not templated)", name)
            raise BadRequest(f"'{name}' is not supported (got {v!r:.80}; only {neutral[0]!r} or leaving it out)", name)


def _guided(field: str, kind: str, v):
    """One structured output field's Constraint (``kind`` as structured_outputs names it;
    a schema may come as JSON text, as vLLM takes guided_json); its value is checked when compiled."""
    from specrt.runtime.grammar import Constraint

    if kind == "json":
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError as e:
                raise BadRequest(f"'{field}': a JSON schema given as text must be JSON ({json_problem(e)})",
                                 field.split(".")[0]) from None
        return Constraint.json_schema(v, field)
    if kind == "json_object":
        if v is not True:
            raise BadRequest(f"'{field}' must be true; got {v!r:.60}", field.split(".")[0])
        return Constraint.json(field)
    return {"regex": Constraint.regex, "choice": Constraint.choice, "grammar": Constraint.lark}[kind](v, field)


def _structural_tag(field: str, v):
    """vLLM's structural tag as a Constraint: {"structures": [{"begin", "schema", "end"}],
    "triggers": [...]} (response_format's, with its "type"; structured_outputs.structural_tag's,
    as JSON text or an object), or xgrammar's {"format": {"type": "triggered_tags", "triggers",
    "tags": [{"begin", "content": {"type": "json_schema", "json_schema"}, "end"}]}} read as those;
    its other formats, and at_least_one or stop_after_first, are a 400 naming the part."""
    from specrt.runtime.grammar import Constraint

    param = field.split(".")[0]
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError as e:
            raise BadRequest(f"'{field}': a structural tag given as text must be JSON ({json_problem(e)})",
                             param) from None
    if not isinstance(v, dict):
        raise BadRequest(f"'{field}' must be a structural tag {{'structures': [...], 'triggers': [...]}}; got "
                         f"{v!r:.80}", param)
    tag = {k: x for k, x in v.items() if k != "type" and x is not None}
    if "format" in tag:
        fmt = tag.pop("format")
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if tag or kind != "triggered_tags":
            raise BadRequest(f"'{field}.format': only xgrammar's {{'type': 'triggered_tags', ...}} of JSON schema tags "
                             f"is supported (or 'structures' and 'triggers'); got {v!r:.80}", param)
        for k in ("at_least_one", "stop_after_first"):
            if fmt.get(k) not in (None, False):
                raise BadRequest(f"'{field}.format.{k}' is not supported (got {fmt[k]!r:.40}; only false)", param)
        other = sorted(set(fmt) - {"type", "triggers", "tags", "at_least_one", "stop_after_first"})
        tags = fmt.get("tags")
        if other or not isinstance(tags, list):
            raise BadRequest(f"'{field}.format': expected {{'type': 'triggered_tags', 'triggers': [...], 'tags': "
                             f"[...]}}; got {fmt!r:.80}", param)
        structures = []
        for i, t in enumerate(tags):
            content = t.get("content") if isinstance(t, dict) else None
            schema_tag = isinstance(content, dict) and content.get("type") == "json_schema" \
                and set(content) == {"type", "json_schema"} and t.get("type", "tag") == "tag" \
                and not set(t) - {"type", "begin", "content", "end"}
            if not schema_tag:
                raise BadRequest(f"'{field}.format.tags[{i}]': only {{'begin', 'content': {{'type': 'json_schema', "
                                 f"'json_schema': {{...}}}}, 'end'}} is supported; got {t!r:.80}", param)
            structures.append({"begin": t.get("begin"), "schema": content["json_schema"], "end": t.get("end")})
        tag = {"structures": structures, "triggers": fmt.get("triggers")}
    return Constraint.structural_tag(tag, field)


def _whitespace(body: dict, so) -> tuple[str, str] | None:
    """The request's JSON whitespace as (the field that asked for it, json_layout's pattern):
    guided_whitespace_pattern, structured_outputs.whitespace_pattern, or its disable_any_whitespace
    true (none: "", as vLLM's llguidance backend writes JSON under its --structured-outputs-config
    option); None without one; two are a 400 naming both."""
    from specrt.runtime.grammar import whitespace_problem

    so = so if isinstance(so, dict) else {}
    asked = (("guided_whitespace_pattern", body.get("guided_whitespace_pattern")),
             ("structured_outputs.whitespace_pattern", so.get("whitespace_pattern")))
    given = [(f, v) for f, v in asked if v is not None]
    flag = so.get("disable_any_whitespace")
    if flag is not None and not isinstance(flag, bool):
        raise BadRequest(f"'structured_outputs.disable_any_whitespace' must be true or false; got {flag!r:.40}",
                         "structured_outputs")
    given += [("structured_outputs.disable_any_whitespace", "")] if flag else []
    if len(given) > 1:
        raise BadRequest(f"{' and '.join(repr(f) for f, _ in given)}: one JSON whitespace option a request",
                         given[1][0].split(".")[0])
    for field, pattern in given:
        why = whitespace_problem(pattern)
        if why:
            raise BadRequest(f"'{field}': {why}", field.split(".")[0])
    return given[0] if given else None


def structured(body: dict) -> tuple[str, Any] | None:
    """A request's structured output as (the field that asked for it, its grammar.Constraint):
    ``response_format`` json_object (any JSON object), json_schema ({"name", "schema", "strict"}:
    the schema) or structural_tag (_structural_tag), vLLM's guided_json / guided_regex / guided_choice /
    guided_grammar (a Lark grammar, llguidance's) or its structured_outputs {json | regex | choice |
    grammar | json_object | structural_tag}; its JSON's whitespace (_whitespace: a JSON kind's, or a
    structural tag's schemas'); None without one; two are a 400 naming both."""
    given = []
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind not in ("text", "json_object", "json_schema", "structural_tag"):
            raise BadRequest("'response_format' must be {'type': 'text' | 'json_object' | 'json_schema' | "
                             f"'structural_tag', ...}}; got {fmt!r:.80}", "response_format")
        if kind == "json_object":
            given.append(("response_format", _guided("response_format", "json_object", True)))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise BadRequest("'response_format' json_schema: expected {'type': 'json_schema', 'json_schema': "
                                 f"{{'name': ..., 'schema': {{...}}}}}}; got {fmt!r:.80}", "response_format")
            given.append(("response_format", _guided("response_format.json_schema.schema", "json", spec["schema"])))
        elif kind == "structural_tag":
            given.append(("response_format", _structural_tag("response_format", fmt)))
    for field, kind in GUIDED.items():
        if body.get(field) is not None:
            given.append((field, _guided(field, kind, body[field])))
    so = body.get("structured_outputs")
    if so is not None:
        kinds = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
        asked = [k for k in kinds if isinstance(so, dict) and so.get(k) is not None]
        # (vLLM's options that leave the answer valid JSON: specrt's objects are closed, w76j)
        other = [k for k, v in so.items() if k not in kinds + SO_TAKEN and v is not None] if isinstance(so, dict) else []
        if other:
            raise BadRequest(f"'structured_outputs.{other[0]}' is not supported (got {so[other[0]]!r:.60})",
                             "structured_outputs")
        # (options alone, beside another field's structured output, are that one's: vLLM lays response_format
        # over structured_outputs)
        if not isinstance(so, dict) or len(asked) > 1 or not asked and not given:
            raise BadRequest(f"'structured_outputs' must be an object of one of {', '.join(kinds)}; got {so!r:.80}",
                             "structured_outputs")
        if asked:
            field = f"structured_outputs.{asked[0]}"
            given.append(("structured_outputs", _structural_tag(field, so[asked[0]]) if asked[0] == "structural_tag"
                          else _guided(field, asked[0], so[asked[0]])))
    if len(given) > 1:
        raise BadRequest(f"{' and '.join(repr(f) for f, _ in given)}: one structured output a request",
                         given[1][0])
    space = _whitespace(body, so)
    if space is None:
        return given[0] if given else None
    if not given or given[0][1].kind not in ("json_schema", "json", "structural_tag"):
        asked = f"the answer is held to a {given[0][1].kind}" if given else "no structured output is asked for"
        if space[0] == "structured_outputs.disable_any_whitespace" and given:
            return given[0]  # (vLLM's server option: its JSON's, nothing to a regex's or a grammar's whitespace)
        raise BadRequest(f"'{space[0]}' applies to JSON (a JSON schema, json_object, a structural tag's schemas); "
                         f"{asked}", space[0].split(".")[0])
    from dataclasses import replace

    return given[0][0], replace(given[0][1], whitespace=space[1])


def forced_tools(choice, tools: list[dict], parallel: bool = True) -> tuple[str, Any]:
    """tool_choice "required" or a named function as vLLM makes them: the answer held to a JSON
    array of at least one {"name", "parameters"} of ``tools`` (required; of one alone where not
    ``parallel``, parallel_tool_calls false, whose other calls would be dropped), or to the named
    function's parameters schema (its answer: that call's arguments) -> (its name, or
    "required"; the Constraint)."""
    from specrt.runtime.grammar import Constraint

    def params(f: dict) -> dict:  # (a function without parameters takes an object)
        return f.get("parameters") or NO_PARAMETERS

    if choice == "required":
        # (no other key beside the two: vLLM's schema allows any, where a model may write on until max_tokens)
        anyof = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                                   "parameters": params(t["function"])},
                  "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": anyof}, **({} if parallel else {"maxItems": 1})}
        return "required", Constraint.json_schema(calls, "tool_choice")
    f = choice.get("function") if choice.get("type") == "function" else None
    name = f.get("name") if isinstance(f, dict) else None
    if not isinstance(name, str):
        raise BadRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or {'type': 'function', 'function': "
                         f"{{'name': ...}}}}; got {choice!r:.80}", "tool_choice")
    named = [t["function"] for t in tools if t["function"]["name"] == name]
    if not named:
        raise BadRequest(f"'tool_choice' names the function {name!r:.60}, which 'tools' has not", "tool_choice")
    return name, Constraint.json_schema(params(named[0]), "tool_choice")


def _prompts(v) -> list[str | list[int]]:
    """Completions' ``prompt``: a string, token ids, or a list of either (several prompts,
    answered in turn: choices n x prompts, prompt by prompt)."""
    def one(p) -> bool:
        # (a negative id is refused as one past the vocabulary is, naming it: it got the shape's message)
        return (isinstance(p, str) and bool(p)) or (is_token_ids(p) and bool(p))

    if one(v):
        return [v]
    if isinstance(v, list) and v and all(one(p) for p in v):
        return list(v)
    raise BadRequest("'prompt' must be a non-empty string, a list of token ids, or a non-empty list of those",
                     "prompt")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects", "messages")
    problem = conversation_problem(msgs)
    if problem == CONVERSATION:  # (a list of no objects: its first is named)
        problem = ("messages[0]: expected an object with a string 'role' and a string (or text parts) 'content'; "
                   f"got {msgs[0]!r:.60}")
    if problem:
        raise BadRequest(problem, "messages")
    # every field of a message, text parts joined, as Session.stream and `specrt run --prompts` pass
    # them to the template (OpenAI's name, an assistant's reasoning_content that Qwen3's reads):
    # role and content alone made another prompt of the same conversation
    return joined(msgs)


def _tops(entries: list[dict], n: int) -> list[dict]:
    """Logprob entries with their ``n`` most likely tokens alone (a prompt scored for more than asked:
    echo's logprobs beside prompt_logprobs)."""
    return [e if e["top_logprobs"] is None or len(e["top_logprobs"]) <= n else
            {**e, "top_logprobs": e["top_logprobs"][:n]} for e in entries]


def vllm_prompt_logprobs(entries: list[dict] | None) -> list[dict | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, None for the first, else {token id: {logprob,
    rank, decoded_token}} of the token itself (its rank among the vocabulary's) and then its most
    likely alternatives (ranks 1..n; the token itself among them takes its place there)."""
    if entries is None:
        return None
    out: list[dict | None] = [None]
    for e in entries[1:]:
        d = {str(e["id"]): {"logprob": e["logprob"], "rank": e["rank"], "decoded_token": e.get("token")}}
        for r, t in enumerate(e["top_logprobs"] or (), 1):
            d[str(t["id"])] = {"logprob": t["logprob"], "rank": r, "decoded_token": t.get("token")}
        out.append(d)
    return out


def _prediction(body: dict, chat: bool) -> str | None:
    """OpenAI's Predicted Outputs: ``prediction`` {"type": "content", "content": text or text
    parts} -> its text (parts joined, as a message's), None without one. Refused where OpenAI
    refuses it: on /v1/completions (chat completions' only), and beside n > 1, logprobs,
    max_completion_tokens and tools, in its guide's words (presence / frequency penalties,
    audio and modalities other than text are refused here whatever the prediction)."""
    v = body.get("prediction")
    if v is None:
        return None
    if not chat:
        raise BadRequest("'prediction' applies to /v1/chat/completions (Predicted Outputs are a chat completion's)",
                         "prediction")
    content = v.get("content") if isinstance(v, dict) and v.get("type") == "content" and set(v) == {"type", "content"} \
        else None
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and set(p) == {"type", "text"}
                                         and isinstance(p["text"], str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise BadRequest("'prediction' must be {'type': 'content', 'content': a string or a list of "
                         f"{{'type': 'text', 'text': ...}} parts}}; got {v!r:.80}", "prediction")
    for name, refused, why in (("n", isinstance(body.get("n"), (int, float)) and body["n"] > 1,
                                "values higher than 1 are not supported"),
                               ("logprobs", body.get("logprobs") is True, "not supported"),
                               ("max_completion_tokens", body.get("max_completion_tokens") is not None,
                                "not supported (max_tokens is)"),
                               ("tools", bool(body.get("tools")),
                                "Function calling is not currently supported with Predicted Outputs")):
        if refused:
            raise BadRequest(f"'{name}' with 'prediction': {why} (OpenAI's Predicted Outputs)", name)
    return content


def _chat_logprobs(entries: list[dict] | None) -> dict | None:
    """OpenAI's chat ``logprobs``: {content: [{token, logprob, bytes, top_logprobs}], refusal}
    (each entry also keeps its token ``id``)."""
    return None if entries is None else {"content": entries, "refusal": None}


class _CompletionLogprobs:
    """OpenAI's (legacy) completions ``logprobs``: {tokens, token_logprobs, top_logprobs
    (a token -> logprob object a token: the ``logprobs`` most likely and the sampled one, so
    with ``logprobs`` 0 the sampled one alone), text_offset (where
    each token's text starts in the completion)}, chunk by chunk; ``context``: the prompt's
    tokens the completion's text is decoded after (Session.last_context; none with echo, whose
    entries start with the prompt's: ``echoed`` of them); ``eos``: the ids an answer ends at;
    ``echo_text``: an echoed text prompt as the request gave it, which the answer's text starts
    with (its tokens' offsets are the tokenizer's into it, and the completion's count from its
    end: they counted through the prompt's tokens' decoding, which differs from the text given
    where it had two spaces, or a leading one: m75e's F2)."""

    def __init__(self, text, context: list[int] = (), eos: Sequence[int] = (), echoed: int = 0,
                 echo_text: str | None = None):
        self.text, self.ids, self.decoded = text, [], ""  # decoded: the text of ids
        self.context = list(context)
        self.before = text.decode(self.context) if self.context else ""  # the context's text, decoded once
        self.eos, self.echoed, self.seen = set(eos), echoed, 0  # seen: the entries taken so far
        self.echo_text, self.shift, self.starts = echo_text, 0, None  # shift: the completion's offsets' (echo_text)
        if echo_text is not None:  # (the ids serve made of it: Text.ids_of, a raw prompt's)
            # (encode_batch: the interpreter's lock let go, as Text.ids_of's)
            enc = text.tokenizer.encode_batch([echo_text], add_special_tokens=True)[0]
            self.starts = [a for a, _ in enc.offsets] if len(enc.ids) == echoed else None

    def __call__(self, entries: list[dict] | None) -> dict | None:
        from specrt.runtime.text import completion_text

        if entries is None:
            return None
        offsets = []
        for e in entries:
            before = self.decoded
            self.seen += 1
            if self.seen > self.echoed and e["id"] in self.eos:
                # the EOS that ends the answer writes no text (Session.stream), special or not: the
                # text's end, as a special one's (one the tokenizer does not mark special was where
                # its text would start, past the end: h74e); an echoed prompt's EOS is the prompt's text
                offsets.append(len(before))
                continue
            self.ids.append(e["id"])
            # where the token's own text ends, when it does (a word-level decoder puts a space
            # between tokens; half a character has no text)
            upto = self.decoded = completion_text(self.text, self.ids, self.context, self.before)
            offsets.append(len(upto) - len(e["token"]) if upto.endswith(e["token"]) else len(before))
            if self.echo_text is not None and self.seen <= self.echoed:
                if self.starts is not None:
                    offsets[-1] = self.starts[self.seen - 1]
                if self.seen == self.echoed:
                    self.shift = len(self.echo_text) - len(upto)
            else:
                offsets[-1] += self.shift
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                # logprobs 0 too: the sampled token's alone ("up to logprobs+1 elements", as vLLM's;
                # it was null); a prompt token without a logprob (echo's first) null
                "top_logprobs": [None if e["top_logprobs"] is None and e["logprob"] is None else self._top(e)
                                 for e in entries], "text_offset": offsets}

    @staticmethod
    def _top(e: dict) -> dict:
        """The most likely tokens, and the sampled one beside them where it is not among them
        (OpenAI: "the API will always return the logprob of the sampled token, so there may
        be up to logprobs+1 elements"; vLLM does so)."""
        top = {t["token"]: t["logprob"] for t in e["top_logprobs"] or ()}
        if e["logprob"] is not None:
            top.setdefault(e["token"], e["logprob"])
        return top


class Metrics:
    """The server's counters in Prometheus' text format (GET /metrics): requests by endpoint
    and status (LEFT, 499, for a non-streaming request whose client left before its answer;
    a stream is counted 200 when it starts), tokens, the speculation's rounds (acceptance =
    accepted / verified draft tokens; tokens a target call = (completion tokens - prompts) /
    target calls), requests waiting for the engines, and histograms of the wait, the time to
    the first text and the whole request, each from the request's arrival."""

    BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    COUNTERS = {  # name -> help; all *_total counters
        "prompt_tokens": "Prompt tokens, each prompt once as usage counts it (prefilled plus reused rows).",
        "prompt_tokens_reused": "Prompt tokens whose KV rows an earlier request left (prefix reuse).",
        "completion_tokens": "Tokens generated into answers.",
        "target_calls": "Target engine calls after the prefills (decode steps, verify rounds, lookup rounds).",
        "draft_rounds": "Rounds that verified draft tokens.",
        "draft_tokens_verified": "Draft tokens put to the target.",
        "draft_tokens_accepted": "Draft tokens the target accepted.",
        "lookup_rounds": "Rounds that verified prompt lookup's tokens instead of drafts.",
        "prediction_tokens_accepted": "Tokens of a request's predicted output (Predicted Outputs) verified and "
                                      "accepted (usage's accepted_prediction_tokens).",
        "prediction_tokens_rejected": "Tokens of a request's predicted output verified and rejected (usage's "
                                      "rejected_prediction_tokens).",
        "draft_rejections": "Draft rounds that ended at a rejected draft.",
        "draft_rejections_outside_vocab": "Of those, the rounds whose correction the draft's vocabulary lacks (a "
                                          "token it can never propose: many say the traffic is not the draft's text).",
        "generation_seconds": "Seconds spent generating (prefill included, queueing not).",
        "engine_failures": "Answers the engines failed (NaN or +inf logits, an error running them): a 500, or an "
                           "error event ending a stream already begun (counted 200 by its status).",
    }
    HISTOGRAMS = {
        "queue_wait_seconds": "Seconds a request waited for the engines (one stream at a time).",
        "time_to_first_token_seconds": "Seconds from a request's arrival to its first text.",
        "request_seconds": "Seconds from a request's arrival to the end of its response.",
    }

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.counts = dict.fromkeys(self.COUNTERS, 0.0)
        self.hists = {h: [0] * (len(self.BUCKETS) + 1) + [0.0] for h in self.HISTOGRAMS}  # buckets, +Inf, sum
        self.waiting = 0

    def request(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def observe(self, name: str, seconds: float) -> None:
        with self.lock:
            h = self.hists[name]
            h[next((i for i, b in enumerate(self.BUCKETS) if seconds <= b), len(self.BUCKETS))] += 1
            h[-1] += seconds

    def add(self, **counts: float) -> None:
        with self.lock:
            for k, v in counts.items():
                self.counts[k] += v

    def render(self) -> str:
        with self.lock:
            out = ["# HELP specrt_requests_total Requests answered, by endpoint and HTTP status (499: the client "
                   "left before its answer; 503: refused or cut as the server stopped).",
                   "# TYPE specrt_requests_total counter"]
            out += [f'specrt_requests_total{{endpoint="{e}",status="{c}"}} {n}'
                    for (e, c), n in sorted(self.requests.items())]
            for k, text in self.COUNTERS.items():
                out += [f"# HELP specrt_{k}_total {text}", f"# TYPE specrt_{k}_total counter",
                        f"specrt_{k}_total {_number_text(self.counts[k])}"]
            out += ["# HELP specrt_requests_waiting Requests waiting for the engines.",
                    "# TYPE specrt_requests_waiting gauge", f"specrt_requests_waiting {self.waiting}"]
            for k, text in self.HISTOGRAMS.items():
                h, cum = self.hists[k], 0
                out += [f"# HELP specrt_{k} {text}", f"# TYPE specrt_{k} histogram"]
                for b, n in zip((*map(str, self.BUCKETS), "+Inf"), h[:-1]):
                    cum += n
                    out.append(f'specrt_{k}_bucket{{le="{b}"}} {cum}')
                out += [f"specrt_{k}_sum {_number_text(h[-1])}", f"specrt_{k}_count {cum}"]
        return "\n".join(out) + "\n"


def _number_text(v: float) -> str:
    """A counter's value in full (``:g`` kept 6 digits: 1234567 read 1.23457e+06 and a busy
    server's counters seemed to stall)."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _names(model, served: str) -> bool:
    """Whether a request's ``model`` names the served one: exactly, or as the Hugging Face id
    whose last part it is, in any case ("HuggingFaceTB/SmolLM2-135M-Instruct" for the default
    name smollm2-135m-instruct, the target folder's: what a client written for vLLM sends)."""
    return isinstance(model, str) and (model == served or model.rsplit("/", 1)[-1].lower() == served.lower())


class TurnLock:
    """A lock taken in the order it was asked for: requests waiting for the engines get them
    in arrival order (threading.Lock promises no order: a request that came as the lock was
    released could take it before one that had been waiting). ``acquire`` interrupted (Ctrl-C)
    gives up its place."""

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.queue: deque[object] = deque()  # tickets in order of asking; the holder's first

    def acquire(self, blocking: bool = True) -> bool:
        with self.cond:
            if self.queue and not blocking:
                return False
            ticket = object()
            self.queue.append(ticket)
            try:
                while self.queue[0] is not ticket:
                    self.cond.wait()
            except BaseException:
                self.queue.remove(ticket)
                self.cond.notify_all()  # (it may have been the holder-to-be)
                raise
            return True

    def release(self) -> None:
        with self.cond:
            self.queue.popleft()
            self.cond.notify_all()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class Server:
    """The session, its generator and a governor per decoding mode; ``complete`` runs one
    request (under the lock)."""

    def __init__(self, engines_dir: Path, governor: str, defaults, max_new_tokens: int, model: str,
                 log=lambda s: click.echo(s, err=True), isolate: bool = False, snapshots: int = SNAPSHOTS,
                 chat_template_kwargs: dict | None = None):
        from specrt.runtime.session import Session

        self.snapshots = snapshots
        self.responses_store, self.kept = RESPONSES_STORE, None  # --responses-store; its Store (respond_to)
        self.kept_made = threading.Lock()  # (two first requests at once made one Store each, one's response lost)
        # chat_template_kwargs: --chat-template-kwargs, every chat request's template variables
        # unless its own chat_template_kwargs set them
        self.session = Session(engines_dir, governor=governor, sampling=defaults, prefix_snapshots=snapshots,
                               chat_template_kwargs=chat_template_kwargs)
        # --isolate-clients: rows reused only between requests of one ``user`` (Generator.owner)
        # and no session growth (its table would propose one client's text to another)
        self.isolate = isolate
        if isolate:
            from specrt.runtime.governor import without_growth

            spec = self.session.governor_spec
            kept = without_growth(spec)
            if kept != spec:
                self.session.governor_spec = kept
                self.session.new_governor()
        self.defaults, self.max_new_tokens, self.model, self.log = defaults, max_new_tokens, model, log
        self.governors = {defaults.mode: self.session.generator.governor}  # by decoding mode, least recent first
        self.growth = None  # the session growth every mode's governor searches and adds to (_generator)
        self.lock = TurnLock()  # one request on the engines at a time, in the order they asked
        self.metrics = Metrics()
        self.api_key: str | None = None  # --api-key: /v1 requests must carry it (Handler._authorised)
        self.tool_call_parser: str | None = None  # --tool-call-parser: chat answers' tool calls parsed (tool_calls.py)
        self.write_timeout = WRITE_TIMEOUT  # --write-timeout: a stalled answer's client is let go after it
        self.model_strict = True  # another model's name is a 404 (serve: with --model-name only)
        self.created = int(time.time())  # /v1/models' "created": when this server loaded its model
        self.reasoning: str | None = None  # --reasoning-parser: chat answers' thinking apart (specrt.reasoning)
        self.stopping = False  # closing: requests not yet begun are answered 503
        self.closed = False  # close() has begun
        self.cutting = False  # closing at once: the request being answered ends at its next round
        # whole answers being written after the engines' lock was let go (Handler.do_POST):
        # close waits for them, as it waits for the lock (the process ended under them)
        self.sending = 0
        self.sent = threading.Condition()
        # connections taken whose answer is not yet written (_HTTPServer.process_request):
        # drain waits for them after the socket stops accepting (the process ended under a /health
        # probe's answer: its headers sent, its body cut, seen by a user walk in session 53)
        self.replying = 0
        # kept connections waiting for their next request (Handler._next_request): closed once the
        # stop has settled, after which no request is begun (settle)
        self.idle: set = set()
        self.settled = False

    def close(self) -> None:
        """Closes the session once the request being answered has ended (Ctrl-C mid-answer
        closed its engines under it: the client got 'infer() before activate()'); requests
        still queued are then answered 503. Returns once the whole answers being sent after the
        lock (Handler.do_POST) are sent, or at a further Ctrl-C. Once closed, a no-op."""
        if self.closed:
            return
        self.closed = self.stopping = True
        if not self.lock.acquire(blocking=False):
            self.log("[stopping: the request being answered ends first (Ctrl-C or SIGTERM again: at its next "
                     "round)]")
            try:
                self.lock.acquire()
            except KeyboardInterrupt:  # (leaving then aborted the process inside an engine call)
                self.cutting = True
                self.lock.acquire()
        try:
            self.session.close()
        finally:
            self.lock.release()
        with self.sent:
            if self.sending:
                self.log("[stopping: an answer is being sent (Ctrl-C or SIGTERM again: now)]")
            try:
                while self.sending:
                    self.sent.wait()
            except KeyboardInterrupt:
                pass

    def sending_whole(self, n: int) -> None:
        """``n`` (1 or -1) more whole answers being sent after the lock (close waits for them)."""
        with self.sent:
            self.sending += n
            self.sent.notify_all()

    def replying_to(self, n: int) -> None:
        """``n`` (1 or -1) more connections taken and not yet answered (``settle`` waits for them)."""
        with self.sent:
            self.replying += n
            self.sent.notify_all()

    def settle(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds for the connections taken to be answered; False if some
        were not (a client sending nothing, or its body slowly, is not waited for past it). Then,
        at once, no further request is begun and the kept connections waiting for one are closed:
        a request sent on one between the settle and the process's end was read by no one and
        reset with the process (w75c: 90 of 450 probes under SIGTERM, sent in the 75-130 ms
        before the end), where its client now sees the close before it sends (urllib3 and httpx
        look before reusing a connection, and take a new one)."""
        with self.sent:
            done = self.sent.wait_for(lambda: self.replying == 0, timeout)
            self.settled = True
            for c in self.idle:
                try:
                    c.shutdown(socket.SHUT_RDWR)  # (its handler's wait ends: closed)
                except OSError:
                    pass
            return done

    def _generator(self, params):
        """The session's one generator with ``params``' decoding mode's governor swapped in
        (made on first use, with that mode's calibration; Generator.resolve_lookup keeps a
        governor's lookup state with it) and this request's params (its seed). The KV caches
        and kept snapshots are shared by the modes: a turn asking another temperature reuses
        its conversation's rows, and a new mode costs no caches of its own (a generator a
        mode kept 47 MB on SmolLM2 at a 1024-token context, and its snapshots, session 55)."""
        from specrt.runtime.governor import is_dspark
        from specrt.runtime.session import load_calibration, make_governor

        s = self.session
        gov = self.governors.pop(params.mode, None)
        if gov is None:
            cal, note = load_calibration(s.engines, params, s.governor_spec)
            gov = make_governor(s.governor_spec, s.engines, cal)
            # the calibration's note where the governor reads one (fixed:2's said "DSpark uses the identity map")
            said = f"; {note}" if is_dspark(s.governor_spec) else ""
            self.log(f"[{params.mode}: a governor of its own{said}]")
            while len(self.governors) >= MAX_MODES:
                self.governors.pop(next(iter(self.governors)))  # the least recently used
        self.governors[params.mode] = gov  # most recently used last
        g = s.generator
        g.governor = gov
        g.params = params  # the request's own values (the mode's key rounds them to 6 digits)
        # one session growth (:grow) for every mode: the text served under one temperature is
        # there to look up under another, and each mode's governor kept a table of its own (up
        # to GROW_TOKENS tokens, 8 of them); each mode still learns its own rates for it
        policy = g.resolve_lookup()
        if policy is not None and policy.growth is not None:
            if self.growth is None:
                self.growth = policy.growth
            policy.growth = self.growth
        return g

    def parse(self, body: Any, chat: bool) -> dict:
        from specrt.runtime.sampling import SamplingParams
        from specrt.runtime.text import StopScanner, template_kwargs_of

        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if chat:
            prompts = [_messages(body)]
        else:
            prompts = _prompts(body.get("prompt"))
        echo = False if chat else body.get("echo", False)
        echo = False if echo is None else echo  # (nullable in OpenAI's schema)
        if not isinstance(echo, bool):
            raise BadRequest(f"'echo' must be true or false; got {echo!r}", "echo")
        _unsupported(body, chat, allowed=("echo",) if not chat else ("tools", "tool_choice"))
        predicted = _prediction(body, chat)
        reasoned = body.get("include_reasoning")  # (vLLM's, default true: false drops --reasoning-parser's reasoning)
        if reasoned is not None and not isinstance(reasoned, bool):
            raise BadRequest(f"'include_reasoning' must be true or false; got {reasoned!r:.60}", "include_reasoning")
        try:  # (chat: function tools rendered by the template, calls parsed with --tool-call-parser)
            tools, tool_parser = request_tools(body, self.tool_call_parser) if chat else (None, None)
        except ToolsRefused as e:
            raise BadRequest(str(e), e.param) from None
        guided, forced = structured(body), None
        choice = body.get("tool_choice") if chat and tools else None
        if choice == "required" or isinstance(choice, dict):  # (a JSON schema of the calls: vLLM's)
            if guided is not None:
                raise BadRequest(f"'tool_choice' {choice!r:.60} and {guided[0]!r}: one structured output a request",
                                 "tool_choice")
            forced, constraint = forced_tools(choice, tools, body.get("parallel_tool_calls") is not False)
            guided = ("tool_choice", constraint)
        allowed = self._allowed_ids(body)
        if allowed is not None:  # each token one of them, and the grammar's where one is asked for (vLLM applies both)
            from dataclasses import replace

            from specrt.runtime.grammar import Constraint

            guided = ("allowed_token_ids", Constraint.tokens(allowed)) if guided is None else \
                (guided[0], replace(guided[1], only=allowed))
        try:  # compiled now (kept by the session for the stream): a bad one is a 400 naming its field
            self.session.grammar_of(guided[1] if guided else None)
        except UserError as e:
            raise BadRequest(str(e), guided[0]) from None
        self._check_model(body)
        n = _number(body, "n", 1, int, 1, MAX_N)
        if len(prompts) * n > MAX_CHOICES:
            raise BadRequest(f"{len(prompts)} prompts x n {n} = {len(prompts) * n} choices; at most {MAX_CHOICES} a "
                             "request", "prompt" if len(prompts) > 1 else "n")
        name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_new = _number(body, name, self.max_new_tokens, int, 0 if echo else 1)
        d = self.defaults
        params = SamplingParams(temperature=_number(body, "temperature", d.temperature, float, 0.0),
                                top_p=_number(body, "top_p", d.top_p, float, 0.0, 1.0, lo_open=True),
                                top_k=_number(body, "top_k", d.top_k, int, -1),  # -1: off, as vLLM takes it
                                seed=_number(body, "seed", d.seed, int, -1), coupled=d.coupled)  # -1: none
        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop) or len(stop) > 4:
            raise BadRequest("'stop' must be a non-empty string or a list of at most 4 of them", "stop")
        try:
            StopScanner(tuple(stop))
        except UserError as e:
            raise BadRequest(str(e), "stop") from None
        if chat:
            want = body.get("logprobs")
            if want is not None and not isinstance(want, bool):
                raise BadRequest(f"'logprobs' must be true or false; got {want!r}", "logprobs")
            top = _number(body, "top_logprobs", None, int, 0, 20)
            if top is not None and not want:
                raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            logprobs = (top or 0) if want else None
        else:
            logprobs = _number(body, "logprobs", None, int, 0, 20)
        if body.get("prompt_logprobs") == -1:  # (vLLM's "the whole vocabulary", past its default max_logprobs 20 too)
            raise BadRequest("'prompt_logprobs' -1 (every token of the vocabulary) is not supported: at most 20",
                             "prompt_logprobs")
        prompt_logprobs = _number(body, "prompt_logprobs", None, int, 0, 20)
        owner = self.owner(body.get("user"))
        opts = body.get("stream_options")
        stream = body.get("stream", False)
        if stream is None:
            stream = False
        if not isinstance(stream, bool):  # "false" (a string) streamed
            raise BadRequest(f"'stream' must be true or false; got {stream!r}", "stream")
        if opts is not None and not isinstance(opts, dict):
            raise BadRequest(f"'stream_options' must be an object; got {opts!r}", "stream_options")
        if opts is not None and not stream:  # OpenAI: only with stream true; vLLM answers 400
            raise BadRequest("'stream_options' can only be given with 'stream': true", "stream_options")
        if stream and prompt_logprobs:  # (vLLM's 400: a stream's chunks have no place for them)
            raise BadRequest("'prompt_logprobs' are not available when 'stream' is true", "prompt_logprobs")
        opts = {k: v for k, v in (opts or {}).items() if v is not None}  # (a null is a field left out)
        for k, v in opts.items():  # ("yes" was taken as true, an unknown key dropped without a word)
            if k not in STREAM_OPTIONS:
                raise BadRequest(f"'stream_options.{k}' is not a stream option (expected {', '.join(STREAM_OPTIONS)})",
                                 "stream_options")
            if not isinstance(v, bool):
                raise BadRequest(f"'stream_options.{k}' must be true or false; got {v!r}", "stream_options")
        template = body.get("chat_template_kwargs")
        if template is not None and not chat:
            raise BadRequest("'chat_template_kwargs' applies to /v1/chat/completions (a completion's prompt is "
                             "not templated)", "chat_template_kwargs")
        try:
            template = template_kwargs_of(template, "chat_template_kwargs")
        except UserError as e:
            raise BadRequest(str(e), "chat_template_kwargs") from None
        limit = self.session.engines.max_context
        # (the prompt's scoring as complete() asks for it; echo with max_tokens 0 and no logprobs, which complete()
        # answers with nothing run, is checked as scored: None here said "max_new_tokens=0: expected >= 1" of a
        # prompt of the whole context or past it: r75l)
        scored = (logprobs if logprobs is not None or max_new > 0 else 0) if echo else None

        # vLLM's truncate_prompt_tokens: the prompt is cut to fit once tokenized (nothing refused for its length before)
        keep, side = self._truncation(body, max_new, body.get(name) is not None, name)

        # a prompt surely past the context: the stream's error, before the tokenizer's work, which took 32 s and
        # 0.5 GB for a 4 MB request (none where it is to be cut)
        def check_length(n: int, least: bool) -> None:
            if keep is None and n >= limit:
                try:
                    self.session.generator.check_length(n, max_new, scored, least)
                except UserError as e:  # (tools that pushed it past: "the prompt" blamed the messages alone)
                    if not tools:
                        raise
                    raise UserError(str(e).replace("the prompt has", "the prompt (the messages and the tools' "
                                                   "definitions) has", 1)) from None

        messages = prompts[0]
        if chat:  # rendered once, now: a template that refuses the conversation answers 400 before
            try:  # anything runs, and the choices decode these token ids
                prompts = [rendered(lambda t: self.session.encode(messages, True, template, check_length, t), tools)]
                if tools:  # (its count, past the bound: said with the tools, not left to the stream)
                    check_length(len(prompts[0]), False)
            except UserError as e:
                raise self._template_refusal(e) from None
        ids = self._token_ids(prompts, check_length)  # (encoded once: the choices decode these)
        if keep is not None:  # vLLM's truncate_prompt_tokens: the tokenized prompt's last (or first) tokens, a
            # chat's after its template; a prompt cut is echoed as its tokens' text
            cut = [x[len(x) - keep:] if side == "left" else x[:keep] for x in ids]
            prompts = [p if len(x) == len(y) else y for p, x, y in zip(prompts, ids, cut)]
            ids = cut
        if predicted is not None:  # (tokenized here, not under the engines' lock; the answer is never longer
            # than the context, so the prediction's tokens past it would never be proposed)
            predicted = self.session.prediction_ids(predicted)[:limit]
        lengths = [len(x) for x in ids]
        if body.get(name) is not None:  # asked for: prompt + completion must fit, as vLLM answers
            # (with tools: their share, found only for the refusal)
            share = (lambda: lengths[0] - len(self.session.encode(messages, True, template))) if tools else None
            self._check_room(max(lengths), max_new, chat, name, share)
            caps = [max_new] * len(prompts)
        else:  # the server's default, cut for each prompt where an asked-for one would be refused (it gave one
            caps = [min(max_new, limit - n) if n < limit else max_new for n in lengths]  # more)
        return {"owner": owner, "n": n, "choices": len(prompts) * n, "echo": echo,
                "logprobs": logprobs, "prompts": prompts,
                "prompt_logprobs": None if stream else prompt_logprobs,  # (0 on a stream: nowhere to give them)
                "ids": ids, "chat": chat,
                "max_new_tokens": caps,  # (one a prompt)
                "params": params, "stop": tuple(stop), "tool_parser": tool_parser, "template": template,
                "grammar": guided[1] if guided else None, "forced": forced,
                "parallel": body.get("parallel_tool_calls") is not False,  # (false: the first call alone)
                "tools": tools,  # (qwen3_coder types a call's values by its tool's schema)
                "include_reasoning": reasoned is not False,
                "prediction": predicted,  # (token ids; None: none)
                "stream": stream, "usage_chunk": bool(opts.get("include_usage")),
                "usage_every": bool(opts.get("include_usage") and opts.get("continuous_usage_stats"))}

    def _allowed_ids(self, body: dict) -> tuple[int, ...] | None:
        """vLLM's allowed_token_ids: ids of the model's vocabulary (its logits' width), at least one."""
        v, vocab = body.get("allowed_token_ids"), self.session.generator.vocab
        if v is None:
            return None
        if not is_token_ids(v) or not v:
            raise BadRequest(f"'allowed_token_ids' must be a non-empty list of token ids; got {v!r:.60}",
                             "allowed_token_ids")
        bad = [t for t in v if not 0 <= t < vocab]
        if bad:
            raise BadRequest(f"'allowed_token_ids': {bad[0]} is not a token id of the model's vocabulary (0 to "
                             f"{vocab - 1})", "allowed_token_ids")
        return tuple(v)

    def _truncation(self, body: dict, max_new: int, asked: bool, name: str) -> tuple[int | None, str]:
        """vLLM's truncate_prompt_tokens k and truncation_side: the prompt's tokens kept (its last k, or
        its first with "right"), -1 as many as the context leaves beside max_tokens (the server's
        default where none is asked for) -> (k, side); (None, side) where it is not given."""
        side = body.get("truncation_side") or "left"
        if side not in ("left", "right"):
            raise BadRequest(f"'truncation_side' must be 'left' or 'right'; got {side!r:.40}", "truncation_side")
        k = _number(body, "truncate_prompt_tokens", None, int, -1)
        if k is None:
            return None, side
        if k == 0:  # (vLLM cuts to an empty prompt, which its engine then refuses)
            raise BadRequest("'truncate_prompt_tokens' must be -1 (as many as the context leaves) or >= 1; got 0",
                             "truncate_prompt_tokens")
        limit = self.session.engines.max_context
        room = limit - max_new if asked else limit - 1  # (no max_tokens: the default is cut to what is left)
        if room < 1:
            raise BadRequest(f"'{name}' {max_new} leaves no room in the model's context of {limit} tokens for a "
                             "prompt", name)
        if k == -1:
            return (room if asked else limit - min(max_new, limit - 1)), side
        if k > room:  # (vLLM's words)
            less = f"{name} = {limit} - {max_new}" if asked else f"1 (a token of answer) = {limit} - 1"
            raise BadRequest(f"truncate_prompt_tokens={k} cannot be greater than max_model_len - {less} = {room}. "
                             "Please request a smaller truncation size.", "truncate_prompt_tokens")
        return k, side

    def _token_ids(self, prompts: list, check_length) -> list[list[int]]:
        """Each prompt's token ids (as given, or text encoded without a template; ``check_length``
        as ``Session.encode``'s)."""
        try:
            return [p if is_token_ids(p) else self.session.encode(p, False, check_length=check_length) for p in prompts]
        except UserError as e:
            raise BadRequest(str(e), "prompt") from None

    def _check_room(self, longest: int, max_new: int, chat: bool, name: str, tools_share=None) -> None:
        """400 when the longest prompt and the asked-for tokens exceed the engines' context
        (vLLM's and OpenAI's answer; a request that leaves max_tokens out gets the server's
        default, cut to the context with finish 'length'). A prompt with no room at all is
        left to the session's own error. ``tools_share``: a chat request's tools' tokens, found
        when called (the messages alone were blamed, where its tools took most of it)."""
        limit = self.session.engines.max_context
        if longest < limit and longest + max_new > limit:
            where = "messages" if chat else "prompt"
            counts = f"{longest} in the {where}"
            if tools_share is not None:
                try:
                    share = tools_share()
                except UserError:  # (the template refused the messages without their tools)
                    share = 0
                counts = f"{longest} in the messages and tools" + (
                    f", {share} of them the tools' definitions" if share > 0 else "")
                where = "messages, tools"
            raise BadRequest(f"This model's maximum context length is {limit} tokens. However, you requested "
                             f"{longest + max_new} tokens ({counts}, {max_new} in the completion). Please reduce the "
                             f"length of the {where} or completion.", name)

    def thinking(self, req: dict) -> bool | None:
        """With --reasoning-parser, whether a chat request's answers start inside their think
        block (reasoning.begins_thinking: the prompt's end; the template variables, the
        request's, as ``parse`` read them, over the server's); else None (no parser, or a completion)."""
        from specrt import reasoning

        if self.reasoning is None or not req["chat"]:
            return None
        s = self.session
        variables = {**s.chat_template_kwargs, **req["template"]}
        return reasoning.begins_thinking(self.reasoning, reasoning.prompt_tail(s.text, req["ids"][0]), variables)

    def tokenize(self, body: Any) -> dict:
        """POST /tokenize, vLLM's: a text ``prompt`` (the tokenizer's special tokens added unless
        ``add_special_tokens`` false) or a conversation's ``messages`` through the chat template
        (``add_generation_prompt``, ``chat_template_kwargs``, ``tools`` as a chat request's; no
        special tokens added unless asked) -> its token ids, their count, the engines' context
        and, with ``return_token_strs``, each token's piece. The tokenizer alone: no engines' lock."""
        from specrt.runtime.text import not_text, template_kwargs_of

        _refuse_others(body, TOKENIZE_FIELDS)
        chat = body.get("messages") is not None
        if chat == (body.get("prompt") is not None):
            raise BadRequest("expected 'prompt' (a text) or 'messages' (a conversation), one of them", "prompt")
        for k in CHAT_ONLY if not chat else ():
            if body.get(k) is not None:
                raise BadRequest(f"'{k}' applies to 'messages' (a 'prompt' goes through no chat template)", k)
        self._check_model(body)
        flags = {k: body.get(k) for k in ("add_special_tokens", "add_generation_prompt", "continue_final_message",
                                          "return_token_strs")}
        for k, v in flags.items():
            if v is not None and not isinstance(v, bool):
                raise BadRequest(f"'{k}' must be true or false; got {v!r:.60}", k)
        if flags["continue_final_message"]:
            raise BadRequest("'continue_final_message' is not supported (got True; only False or leaving it out)",
                             "continue_final_message")
        s, special = self.session, flags["add_special_tokens"]
        special = (not chat) if special is None else special
        if chat:
            try:  # (checked as a chat request's, rendered as with tool_choice none)
                tools = request_tools({"tools": body.get("tools"), "tool_choice": "none"}, None)[0]
            except ToolsRefused as e:
                raise BadRequest(str(e), e.param) from None
            messages = _messages(body)
            try:
                variables = {**s.chat_template_kwargs,
                             **template_kwargs_of(body.get("chat_template_kwargs"), "chat_template_kwargs")}
            except UserError as e:
                raise BadRequest(str(e), "chat_template_kwargs") from None
            try:
                text = rendered(lambda t: s.text.prompt_text(messages, True, variables, tools=t, generation=flags[
                    "add_generation_prompt"] is not False), tools)
            except UserError as e:
                raise self._template_refusal(e) from None
        else:
            text = body["prompt"]
            if not isinstance(text, str):
                raise BadRequest(f"'prompt' must be a string; got {text!r:.60}", "prompt")
            if (problem := not_text(text, "'prompt'")) is not None:
                raise BadRequest(problem, "prompt")
        # (encode_batch lets the GIL go, encode held it: a 4 MB prompt stopped every other thread, an
        # answer being made among them, for 4 s; the same ids)
        ids = s.text.tokenizer.encode_batch([text], add_special_tokens=special)[0].ids
        pieces = [s.text.tokenizer.id_to_token(i) for i in ids] if flags["return_token_strs"] else None
        return {"count": len(ids), "max_model_len": s.engines.max_context, "tokens": ids, "token_strs": pieces}

    def detokenize(self, body: Any) -> dict:
        """POST /detokenize, vLLM's: ``tokens`` (ids of the tokenizer's vocabulary) -> their text
        as ``prompt``, special tokens kept (as vLLM decodes it: /tokenize's ids of a conversation
        give its template's text back)."""
        _refuse_others(body, DETOKENIZE_FIELDS)
        self._check_model(body)
        ids, tok = body.get("tokens"), self.session.text.tokenizer
        if not isinstance(ids, list):
            raise BadRequest(f"'tokens' must be a list of token ids; got {ids!r:.60}", "tokens")
        for i, t in enumerate(ids):
            if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 32 and tok.id_to_token(t)):
                raise BadRequest(f"tokens[{i}]: {t!r:.40} is not a token id of the tokenizer's vocabulary (0 to "
                                 f"{tok.get_vocab_size() - 1})", "tokens")
        return {"prompt": tok.decode_batch([ids], skip_special_tokens=False)[0]}  # (the GIL let go, as tokenize's)

    def _check_model(self, body: dict) -> None:
        """A request's ``model`` where it names another than the served one (with --model-name): 404,
        as vLLM and OpenAI answer (left out or null: this server's one, as vLLM takes it)."""
        model = body.get("model")
        if model is not None and self.model_strict and not _names(model, self.model):
            # a client pointed at the wrong server or model learns it, rather than getting another model's answer
            raise BadRequest(f"The model `{model}` does not exist (this server serves '{self.model}').", "model",
                             status=404, code="model_not_found")

    def _template_refusal(self, e: UserError) -> BadRequest:
        """A chat template's refusal of a conversation, as the client's 400 on ``messages`` (the
        template's file is the server's, not the client's to read)."""
        msg, file = str(e), f"{getattr(self.session.text, 'template_file', '')}: "
        return BadRequest(msg[len(file):] if msg.startswith(file) else msg, "messages")

    def owner(self, user) -> str | None:
        """Whose a request is under --isolate-clients: its ``user`` ("" for none, one anonymous
        client), whose KV rows it may reuse (Generator.owner) and whose kept responses it may read,
        chain, reference, list and delete (responses.Store); None without the flag (one client)."""
        if user is not None and not isinstance(user, str):
            raise BadRequest(f"'user' must be a string; got {user!r}", "user")
        return (user or "") if self.isolate else None

    def store(self):
        """The responses kept (responses.Store, --responses-store; each its owner's under
        --isolate-clients), made at its first use, once: by one request's thread (two first requests
        at once made a Store each, one's response lost)."""
        from specrt import responses

        with self.kept_made:
            if self.kept is None:
                self.kept = responses.Store(self.responses_store, scoped=self.isolate)
        return self.kept

    def respond_to(self, body: Any) -> dict:
        """POST /v1/responses: the request as a chat completion's (responses.chat_body, after its
        previous_response_id's items), parsed as one, with its response's skeleton (``responses``),
        its reasoning's token count and ``keep``, which stores the response made (responses.Store)."""
        from specrt import responses

        self.store()
        owner = self.owner(body.get("user")) if isinstance(body, dict) else None
        try:  # (its previous response and referenced items looked up among its owner's)
            items = responses.context(body, self.kept, owner) if isinstance(body, dict) else None
            chat = responses.chat_body(body, items)
        except responses.Refused as e:  # (an item_reference not found: OpenAI's 404)
            refused = BadRequest(str(e), e.param, e.status, e.code)
            refused.named = True
            raise refused from None
        try:
            req = self.parse(chat, True)
        except BadRequest as e:  # (a chain past the context: its earlier turns named, responses.chained)
            raise BadRequest(responses.chained(str(e), body), e.param, e.status, e.code) from None
        keep = bool(self.kept.size) and body.get("store") is not False  # (OpenAI's default: kept)
        req["responses"] = responses.skeleton(body, "resp_" + uuid.uuid4().hex, self.model, req["params"], keep)
        req["keep"] = (lambda response: self.kept.put(response, items, owner)) if keep else (lambda response: None)
        tok = self.session.text.tokenizer

        def count(text: str) -> int:  # (the reasoning's tokens, called as the answer ends: its ids are the session's)
            decode = lambda ids: tok.decode(ids, skip_special_tokens=False)  # noqa: E731
            n = responses.reasoning_tokens(decode, list(self.session.last_output_ids), text)
            return len(tok.encode(text, add_special_tokens=False).ids) if n is None else n

        req["count"] = count
        return req

    def complete(self, req: dict) -> Iterator[dict]:
        """The request's n choices in turn (batch 1): for choice i, {'index': i, 'text': piece,
        'logprobs': the entries of the tokens since its last piece, or None} as tokens are
        accepted, then {'index': i, 'finish_reason': ..., 'logprobs': the entries no piece
        carried (an EOS token writes no text)}; last {'usage', 'specrt'} of the whole request.
        Choice j of each prompt samples with seed + j where a seed is given; after the first, each prefills
        almost nothing (prefix reuse). With ``echo`` (completions) each choice's first piece is
        the prompt, with its tokens' logprobs when asked for (the first token's null). The
        caller holds the lock for the whole of it."""
        from specrt.cli import tau_words
        from specrt.runtime.prediction import usage as prediction_usage
        from specrt.runtime.telemetry import Telemetry

        s, params = self.session, req["params"]
        t0, total = time.perf_counter(), Telemetry()
        done = {"completion": 0, "prompt_tokens": 0, "reused": 0, "partial": False, "bare": 0, "reason": None}
        try:
            yield from self._choices(req, total, done)
        except (GeneratorExit, BadRequest) as e:  # the caller stopped reading (the client left), or
            # a second Ctrl-C cut the answer (its 503, Server.cutting): counted as far as it went
            done["reason"] = "none: " + ("the client left" if isinstance(e, GeneratorExit) else
                                         "cut, the server is stopping")
            done["prompt_tokens"] += done["bare"]  # (an echo that ran nothing, left at its echo)
            if done["partial"]:  # what the choice being decoded had made by then
                total.merge(s.generator.telemetry)
                done["completion"] += len(getattr(s, "last_output_ids", None) or [])
                if done["first"]:  # its prompt, not yet counted (the log said "0 prompt tokens (33 reused)")
                    done["prompt_tokens"] += s.generator.telemetry.prompt_tokens
                    done["reused"] += s.generator.telemetry.prefix_reused
            raise
        finally:  # counted and logged whenever the request ran to its end, lost its client or was cut
            if done["reason"] is not None:
                completion, prompt_tokens, t = done["completion"], done["prompt_tokens"], total.to_json()
                reused = done["reused"]  # (each prompt once, as usage counts it)
                counts = prediction_usage(t["lookup"]["by_match"])  # (zeros without a prediction)
                self.metrics.add(prompt_tokens=prompt_tokens, prompt_tokens_reused=reused,
                                 completion_tokens=completion, target_calls=t["rounds"],
                                 draft_rounds=t["draft_rounds"], draft_tokens_verified=t["drafted"],
                                 draft_tokens_accepted=t["accepted"], lookup_rounds=t["lookup"]["rounds"],
                                 prediction_tokens_accepted=counts["accepted_prediction_tokens"],
                                 prediction_tokens_rejected=counts["rejected_prediction_tokens"],
                                 draft_rejections=t["rejections"]["rounds"],
                                 draft_rejections_outside_vocab=t["rejections"]["outside_draft_vocab"],
                                 generation_seconds=time.perf_counter() - t0)
                choices = "" if req["choices"] == 1 else f"in {req['choices']} choices "
                self.log(f"[{prompt_tokens} prompt tokens ({reused} reused), {completion} new "
                         f"{choices}in {time.perf_counter() - t0:.2f} s, "
                         f"{t['tokens_per_s']:.1f} tok/s, {tau_words(t)}, {t['tokens_per_call']:.2f} tokens a "
                         f"target call, {params.mode}, " + ("" if req.get("prediction") is None else
                                                            f"prediction {counts['accepted_prediction_tokens']} "
                                                            f"accepted {counts['rejected_prediction_tokens']} "
                                                            "rejected, ") + f"finish {done['reason']}]")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                 "total_tokens": prompt_tokens + completion}
        if req.get("prediction") is not None:  # (OpenAI's counts: runtime/prediction.py's usage says which tokens)
            usage["completion_tokens_details"] = {k: counts[k] for k in ("accepted_prediction_tokens",
                                                                         "rejected_prediction_tokens")}
        extra = {"prediction": {"tokens": len(req["prediction"]), "rounds": counts["prediction_rounds"],
                                "target_calls": t["rounds"]}} if req.get("prediction") is not None else {}
        yield {"usage": usage,
               "specrt": {"tau": t["tau"], "tokens_per_call": t["tokens_per_call"], "tokens_per_s": t["tokens_per_s"],
                          "first_token_s": t["first_token_s"], "prefix_reused": reused,
                          "rejections": t["rejections"], "governor": s.governor_spec, "mode": params.mode, **extra}}

    def _choices(self, req: dict, total, done: dict) -> Iterator[dict]:
        """complete's choices, one after another; ``done`` gets the counts and the last
        finish reason as they settle."""
        from dataclasses import replace

        from specrt import reasoning

        s, lp, params = self.session, req["logprobs"], req["params"]
        completion, prompt_tokens, reused = 0, 0, 0
        grammar = req.get("grammar")
        # --reasoning-parser: held after </think> (vLLM's); allowed_token_ids hold the thinking too (Deferred)
        if grammar is not None and req.get("thinking"):
            grammar = replace(grammar, after=reasoning.END)
        scored = None  # the prompt's logprob entries (prompt_logprobs), its first choice's for the others
        for i in range(req["choices"]):  # prompt i // n, its choice i % n
            k = i // req["n"]
            prompt = req["prompts"][k]
            # choice j of every prompt samples with seed + j: each prompt's first choice is the text
            # the seed gives it alone, or in `specrt run --prompts` (prompt k took seed + k * n)
            self._generator(replace(params, seed=None if params.seed is None else params.seed + i % req["n"]))
            s.generator.owner = req["owner"]
            pl = lp if req["echo"] else None  # echo with logprobs: the prompt's too
            asked = req.get("prompt_logprobs") if i % req["n"] == 0 else None  # (vLLM's: each prompt scored once)
            if asked is not None:
                pl = asked if pl is None else max(pl, asked)
            # max_tokens 0 with echo, no logprobs: the prompt's own text is the answer, sent with nothing run
            # (it was scored, its entries not sent: a prefill for nothing, NOTES s75; checked at the request)
            bare = req["echo"] and pl is None and req["max_new_tokens"][k] == 0
            done["partial"], done["first"] = not bare, i % req["n"] == 0
            done["bare"] = len(req["ids"][k]) if bare and done["first"] else 0  # (its prompt, if its client leaves)
            # (keep_special: mistral's [TOOL_CALLS] kept in answers to requests with tools, Text.keep_special)
            gen = s.stream(req["ids"][k], chat=req["chat"], max_new_tokens=req["max_new_tokens"][k], stop=req["stop"],
                           logprobs=lp, prompt_logprobs=pl, grammar=grammar,
                           keep_special=req.get("tool_parser") is not None,
                           prediction=req.get("prediction")) if not bare else (p for p in ())
            sent, echoed = 0, not req["echo"]
            context = lambda: [] if req["echo"] else s.last_context  # noqa: E731 (text offsets count from there)

            def echo() -> dict:  # the prompt as the completion's first piece (its rows are in by now)
                text = prompt if isinstance(prompt, str) else s.text.decode(req["ids"][k])
                return {"index": i, "text": text, "tokens": 0,
                        "logprobs": _tops(s.prompt_logprob_entries(), lp) if lp is not None else None}

            try:
                for piece in gen:
                    if self.cutting:
                        raise BadRequest("the server is shutting down", status=503)
                    if not echoed:
                        echoed = True
                        yield echo()
                    entries, n = None, len(s.last_output_ids)  # the tokens written so far (trimmed at a stop
                    if lp is not None:  # string before its piece)
                        entries, sent = s.logprob_entries(sent, n), n
                    yield {"index": i, "text": piece, "logprobs": entries, "context": context(), "tokens": n}
            finally:
                gen.close()
            if not echoed:  # nothing generated (max_tokens 0, or an answer without text)
                yield echo()
            st = ({"prompt_tokens": len(req["ids"][k]), "output_token_ids": [], "finish_reason": "length"} if bare
                  else s.stats())
            if not bare:
                total.merge(s.generator.telemetry)
            n_out = len(st["output_token_ids"])
            if i % req["n"] == 0:  # each prompt counted once, and what an earlier request left it (the
                prompt_tokens += st["prompt_tokens"]  # other choices reuse its rows: 9 "reused" of 5)
                reused += 0 if bare else s.generator.telemetry.prefix_reused
            completion += n_out
            reason = {"eos": "stop", "stop": "stop"}.get(st["finish_reason"], "length")
            done.update(completion=completion, prompt_tokens=prompt_tokens, reused=reused, partial=False, bare=0)
            if i == req["choices"] - 1:
                done["reason"] = reason  # (the last choice's, as the log has always said)
            if asked is not None:  # (stats() made them: the stream was asked for pl >= asked, never bare)
                scored = _tops(st["prompt_logprobs"], asked)
            yield {"index": i, "finish_reason": reason, "prompt_logprobs": scored,
                   "logprobs": s.logprob_entries(sent, n_out) if lp is not None else None, "context": context(),
                   "tokens": n_out}


GET_PATHS = ("/v1/models", "/models", "/health", "/metrics", "/version", "/ping")
POST_PATHS = ("/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/responses",
              "/responses", "/tokenize", "/detokenize", "/ping")
OPEN_PATHS = ("/health", "/ping", "/version", "/metrics")  # answered without --api-key's key


def kept_path(route: str) -> str | None:
    """What a kept response's path names (Handler._stored): "response" (/v1/responses/{id}: GET,
    DELETE), "items" (its /input_items: GET), None for any other (.../cancel: no such path)."""
    rest = route.split("/responses/", 1)[1] if route.startswith(("/v1/responses/", "/responses/")) else ""
    rid, _, tail = rest.partition("/")
    return None if not rid else "response" if not tail else "items" if tail == "input_items" else None


class Handler(BaseHTTPRequestHandler):
    server_version = "specrt"
    # persistent connections, as vLLM's and llama.cpp's servers keep them (keep-alive clients:
    # httpx, so the OpenAI SDK, nginx's upstream keepalive): every answer carries its
    # Content-Length, or is a stream sent chunked (_respond), an HTTP/1.0 client's connection
    # closes after its answer. It spoke HTTP/1.0, one request a connection: a second
    # request pipelined on one went unanswered (session 71's N1).
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: on a kept connection an answer's headers and body, two writes, waited for the
    # client's delayed ACK (Nagle): 47 ms a request, where a fresh connection took 0.6 ms
    disable_nagle_algorithm = True
    app: Server  # set on the subclass serve() makes
    # seconds a socket read or write may wait: a client that sends less than its
    # Content-Length, or stalls, frees its thread (the lock is not held while reading)
    timeout = 60
    # a refused body left unread (_linger): seconds its next bytes are waited for, and all told
    linger_wait, linger_most = 0.3, 2.0

    def handle(self) -> None:
        """The connection's requests, one after another while it is kept alive."""
        self.close_connection = True
        self.pipelined = False  # the client sent a request before the answer to the one before it (_sent_ahead)
        self.unread = False  # a refused body left unread, perhaps coming all the same (_linger)
        if self._handshake():
            self.handle_one_request()
            while not self.close_connection and self._next_request():
                self.handle_one_request()
        if self.unread:
            self._linger()

    def _handshake(self) -> bool:
        """The TLS handshake of a connection taken over TLS (--ssl-certfile), here in its own
        thread under the read timeout (_HTTPServer.get_request wraps the socket without it: done
        there, a client that connected and sent nothing held every other one's accept); False
        where it failed (a client refusing the certificate, or without the one asked for) or
        timed out: the connection closes unanswered. A plain HTTP request on the port is
        answered 400 in plain text, saying to use https:// (plain_http_answer)."""
        if not isinstance(self.connection, ssl.SSLSocket):
            return True
        try:
            self.connection.do_handshake()
            return True
        except ssl.SSLError as e:
            if e.reason == "HTTP_REQUEST":  # (OpenSSL read the request's first bytes: "GET ", "POST ", ...)
                try:  # (the socket's own sendall: the TLS one would encrypt it)
                    socket.socket.sendall(self.connection, plain_http_answer())
                    self.unread = True  # (the rest of the request unread: _linger, or the client met a reset)
                except OSError:
                    pass
        except (OSError, ValueError):  # timed out, reset, closed
            pass
        return False

    def _linger(self) -> None:
        """Once the answer is sent, its end said (shutdown(SHUT_WR)), reads and drops what the
        client still sends (up to MAX_BODY bytes) until it closes, is silent for linger_wait
        seconds, or for linger_most in all: a socket closed on unread data is reset, and a
        refused client that sent its body without waiting for "100 Continue" (as RFC 9110 10.1.1
        lets it) met a broken pipe while still sending it, not its 404 (w75c, http.client on
        loopback: 20 of 20 for a body of 4 MB or 16 MB, none for 1 MB, which the sockets'
        buffers took whole; nginx's lingering_close, Apache's lingering close)."""
        try:
            close_notify(self.connection)  # (over TLS its end said first; shutdown drops the TLS layer:
            self.connection.shutdown(socket.SHUT_WR)  # what still comes is read and dropped as raw bytes)
            end, got = time.monotonic() + self.linger_most, 0
            while got < MAX_BODY and (left := end - time.monotonic()) > 0:
                self.connection.settimeout(min(left, self.linger_wait))
                piece = self.rfile.read1(1 << 16)
                if not piece:  # (the client closed)
                    break
                got += len(piece)
        except (OSError, ValueError):  # silent past the wait, reset
            pass

    def _next_request(self) -> bool:
        """Waits up to KEEP_ALIVE seconds for a kept-alive connection's next request (one
        pipelined is in the read buffer already); False, to close it, at its close or past the
        wait. Meanwhile the connection is idle: not counted in Server.replying, so the stop
        (drain) does not wait for it. A request that comes while stopping is answered as on a
        new connection (/health and POSTs 503, end_headers' "Connection: close"): closed
        unanswered, a load balancer's probe on a kept connection read no "stopping" (w74f). Once
        the stop has settled (Server.settle) the wait ends and no request is begun."""
        app = self.app
        with app.sent:
            if app.settled:  # (the stop no longer waits for an answer: none is begun)
                return False
            app.idle.add(self.connection)
            app.replying -= 1  # (as replying_to(-1): settle may be waiting for it)
            app.sent.notify_all()
        try:
            self.connection.settimeout(KEEP_ALIVE)
            came = self.rfile.peek(1)
        except (OSError, ValueError):  # timed out, reset
            came = b""
        finally:
            with app.sent:  # (closing, shutdown_request takes it off)
                app.idle.discard(self.connection)
                app.replying += 1
                late = app.settled
        if not came or late:
            return False
        self.connection.settimeout(self.timeout)  # (an answer's writes set write_timeout)
        # a POST's endpoint (do_POST) is not the next request's: reset here, not in parse_request, which
        # a request line past 64 KiB never reaches (its 414 was counted as the completion's before it: r74)
        self._endpoint = None
        return True

    def parse_request(self) -> bool:
        """The standard library's, and whether the connection is kept after the answer: for an
        HTTP/1.1 client that did not ask to close it, and for a request with a body only once
        that body has been read whole (do_POST, _discard_body): a body left unread would be
        read as the next request."""
        if not super().parse_request():
            return False
        asked = {t.strip().lower() for t in self.headers.get("Connection", "").split(",")}
        self.keep = self.request_version >= "HTTP/1.1" and "close" not in asked
        self.close_connection = not self.keep or bool(self.headers.get("Transfer-Encoding")) or \
            self.headers.get("Content-Length", "0").strip() != "0"
        return True

    def handle_expect_100(self) -> bool:
        return True  # (do_POST sends the 100 once the head is taken: a refusal by Content-Length gets none)

    def end_headers(self) -> None:
        """Says "Connection: close" where the connection closes after this answer (a client
        of HTTP/1.1 would otherwise send its next request on it), and elsewhere for how long it
        is kept ("Keep-Alive: timeout=5", as uvicorn and nginx say it): Node's http.Agent, whose
        idle sockets time out at 5 s as well, sent its next request as the server closed (h74g);
        it closes its own a second before the hint, undici (Node's fetch) too."""
        if self.app.stopping:  # (the stop closes connections after their answer)
            self.close_connection = True
        self._sent_ahead()  # (the next request here before this answer is: pipelined)
        if self.close_connection:
            self.send_header("Connection", "close")
        else:
            self.send_header("Keep-Alive", f"timeout={KEEP_ALIVE:.0f}")
        super().end_headers()

    @property
    def route(self) -> str:
        """The path without its query string or trailing slash."""
        return self.path.split("?", 1)[0].rstrip("/")

    def log_message(self, fmt, *args):  # requests are logged by Server.complete
        pass

    def _send_json(self, status: int, obj: dict, headers: dict | None = None) -> None:
        if getattr(self, "_endpoint", None):  # a POST's answer
            self.app.metrics.request(self._endpoint, status)
        data = json.dumps(obj).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":  # (HEAD: GET's status and headers, no body)
                # in pieces: a socket's timeout bounds a whole sendall since Python 3.5, and a
                # client reading some MB slowly is not one that stopped (write_timeout)
                for at in range(0, len(data), WRITE_PIECE):
                    self.wfile.write(data[at:at + WRITE_PIECE])
        except OSError:  # the client left (or timed out) before its answer: nothing to tell it
            self.close_connection = True

    def _error(self, e: BadRequest) -> None:
        kind = "invalid_request_error" if e.status < 500 else "server_error"
        kind = "authentication_error" if e.status == 401 else kind
        message, param = self._named(e)
        self._send_json(e.status, {"error": {"message": message, "type": kind, "param": param, "code": e.code}})

    def _named(self, e: BadRequest) -> tuple[str, str | None]:
        """An error's message and field, in a response request's names where it is one (the chat's
        names that Server.parse and the stream gave: max_tokens, messages, response_format)."""
        if getattr(self, "_endpoint", None) != "responses" or e.named:
            return str(e), e.param
        from specrt.responses import renamed

        return renamed(str(e), e.param)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a request line or header it cannot parse or
        that is too long, a method no handler takes: 400, 414, 431, 501, 505) as OpenAI's
        error object, as every other answer (it sent an HTML page; one for a request line it
        could not read went out without a status line, as to an HTTP/0.9 client)."""
        from http import HTTPStatus

        self.close_connection, self.request_version = True, "HTTP/1.0"
        self._error(BadRequest(message or HTTPStatus(code).phrase, status=code))

    def _authorised(self) -> bool:
        """With ``--api-key`` (Server.api_key), the /v1 paths need ``Authorization: Bearer KEY``
        (as OpenAI's clients send it), /tokenize and /detokenize too (vLLM's key guards only /v1:
        they were open there); OPEN_PATHS stay open."""
        key = self.app.api_key
        if not key or self.route in OPEN_PATHS:
            return True
        import hmac

        scheme, _, got = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(got.encode(), key.encode()):  # (a scheme's name
            return True  # is case-insensitive, RFC 9110: "bearer KEY" was refused)
        self.app.metrics.request("unauthorised", 401)
        self._discard_body()
        self._error(BadRequest("missing or wrong API key (expected the header 'Authorization: Bearer KEY')",
                               status=401, code="invalid_api_key"))
        return False

    def _expects_continue(self) -> bool:
        """Whether the client waits for "100 Continue" before sending its body (an HTTP/1.1
        client's "Expect: 100-continue"; an HTTP/1.0 one sends it anyway)."""
        return self.headers.get("Expect", "").lower() == "100-continue" and self.request_version != "HTTP/1.0"

    def _discard_body(self) -> None:
        """Reads the body of a request refused before it (up to MAX_BODY bytes): a socket closed
        on unread data is reset, and a client still sending a body of some MB got a broken pipe,
        not its 401 / 404 / 405. A client waiting for "100 Continue" before its body (curl's for
        a body past 1 MB) is answered at once and its connection closed, the body unsent: the body
        was waited for, the client waited 1 s for the interim (curl's wait) and then sent it (w74f)."""
        if self._expects_continue():
            self.close_connection = self.unread = True  # (a client may send it all the same: _linger)
            return
        try:
            size = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return
        if 0 < size <= MAX_BODY and "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            try:
                if len(self.rfile.read(size)) == size:
                    self.close_connection = not self.keep  # (its body read: parse_request)
            except OSError:
                self.close_connection = True

    def _not_allowed(self) -> None:
        """A method a path does not take: 405 naming the ones it does (404 for no such path)."""
        self._discard_body()
        route = self.route
        kept = kept_path(route)  # (a kept response's: Handler._stored)
        got = ("GET, HEAD" if route in GET_PATHS or kept or route.startswith(("/v1/models/", "/models/")) else "",
               "DELETE" if kept == "response" else "", "POST" if route in POST_PATHS else "")
        allow = ", ".join(m for m in got if m)
        if not allow:
            return self._error(BadRequest(f"no such path: {self.command} {self.path}", status=404))
        method = "GET" if self.command == "HEAD" else self.command  # (HEAD: GET's answer, Content-Length too)
        self._send_json(405, {"error": {"message": f"{method} {route}: this path takes {allow}",
                                        "type": "invalid_request_error", "param": None, "code": None}},
                        {"Allow": allow})

    do_PUT = do_PATCH = do_OPTIONS = _not_allowed

    def do_DELETE(self):
        if kept_path(self.route) != "response":
            return self._not_allowed()
        if self._authorised():
            self._stored()

    def _stored(self) -> None:
        """GET, DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items (responses.stored)."""
        from specrt import responses

        self._discard_body()
        # (counted in requests_total as the SDK's calls, as a POST's answer is: they were not, w78f / h78j)
        self._endpoint = "responses_" + ("input_items" if kept_path(self.route) == "items" else
                                         "delete" if self.command == "DELETE" else "retrieve")
        try:  # (no body: the client's ``user`` is the query's, ?user=, under --isolate-clients; Server.owner)
            query = self._query()
            owner = self.app.owner(query.get("user", [None])[-1])
            answer = responses.stored(self.app.store(), self.command.replace("HEAD", "GET"), unquote(self.route),
                                      query, owner)
        except responses.Refused as e:
            status = e.status
            self._error(BadRequest(str(e), e.param, status=e.status, code=e.code))
        else:
            status = 200
            self._send_json(200, answer)
        # (logged as a POST's answer is, Server.complete's line: a chain's retrievals and their 404s were not; the
        # path as sent, still quoted: a %0A unquoted would start a line of the client's in the log)
        self.app.log(f"[{self.command} {self.route[:200]}: {status}]")

    def _query(self) -> dict:
        """The path's query string, each name's values in a list (urllib.parse.parse_qs)."""
        from urllib.parse import parse_qs

        return parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "", keep_blank_values=True)

    def _query_user(self, body: dict) -> None:
        """A POST's ?user= (an SDK client's default_query, which GET and DELETE need under
        --isolate-clients) is its body's ``user`` where the body gives none: taken for the body's
        alone, a client that set it once for all its calls made its responses the anonymous
        user's, which its own GETs could not read and any client without a user could. A body's
        ``user`` that differs from it is a 400."""
        users = self._query().get("user")
        if not users:
            return
        if body.get("user") is None:
            body["user"] = users[-1]
        elif body["user"] != users[-1]:
            raise BadRequest(f"'user' {body['user']!r:.60} differs from the query's ?user={users[-1]!r:.60}: "
                             "give one, or the same in both", "user")

    def do_HEAD(self):
        """What GET answers, without its body (_send_json)."""
        self.do_GET()

    def do_GET(self):
        if not self._authorised():
            return
        route = self.route
        # (counted in requests_total as a POST's answer is: a client's model listing and the probes, /health's
        # 503s while stopping among them; /metrics' own scrape not, as vLLM leaves it out)
        listing = route in ("/v1/models", "/models") or route.startswith(("/v1/models/", "/models/"))
        self._endpoint = "models" if listing else route[1:] if route in ("/health", "/ping", "/version") else None
        model = {"id": self.app.model, "object": "model", "owned_by": "specrt", "created": self.app.created}
        if route in ("/v1/models", "/models"):
            self._send_json(200, {"object": "list", "data": [model]})
        elif route.startswith(("/v1/models/", "/models/")):  # the OpenAI client's models.retrieve
            # the names a request's model may give (an org/name id, any case, a path; a client
            # may send its slash as %2F): retrieve refused "HuggingFaceTB/SmolLM2-135M-Instruct",
            # which chat completions took; without --model-name any name, as a request's model
            name = unquote(route.split("/models/", 1)[1])
            if self.app.model_strict and not _names(name, self.app.model):
                return self._error(BadRequest(f"no model '{name}' here (this server serves '{self.app.model}')",
                                              "model", status=404, code="model_not_found"))
            self._send_json(200, model)
        elif kept_path(route):  # (a response kept: responses.stored)
            self._stored()
        elif route in ("/health", "/ping"):  # (vLLM's /ping, SageMaker's probe: /health's answer)
            self._health()
        elif route == "/version":  # (vLLM's: which server this is)
            from specrt import __version__

            self._send_json(200, {"version": __version__})
        elif route in POST_PATHS:
            self._not_allowed()
        elif route == "/metrics":
            data = self.app.metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        else:
            self._error(BadRequest(f"no such path: GET {self.path}", status=404))

    def _health(self) -> None:
        """/health's answer (503 while stopping: a load balancer sends no more requests here)."""
        self._send_json(*((503, {"status": "stopping"}) if self.app.stopping else (200, {"status": "ok"})))

    def do_POST(self):
        self._arrived = time.perf_counter()
        if not self._authorised():
            return
        path = self.route
        if path == "/ping":  # (vLLM takes a POST too)
            self._discard_body()
            return self._health()
        responses = path in ("/v1/responses", "/responses")  # (a chat completion, its answer a response)
        chat = responses or path in ("/v1/chat/completions", "/chat/completions")
        tokens = path in ("/tokenize", "/detokenize")  # (vLLM's, at the root as there)
        if not chat and not tokens and path not in ("/v1/completions", "/completions"):
            return self._not_allowed()
        self._endpoint = path[1:] if tokens else "responses" if responses else "chat" if chat else "completions"
        try:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                raise BadRequest("a chunked body is not read here: send the JSON body with a Content-Length",
                                 status=411)
            length = self.headers.get("Content-Length") or "0"
            try:
                size = int(length)
            except ValueError:
                raise BadRequest(f"Content-Length {length!r} is not a number of bytes") from None
            if not 0 < size <= MAX_BODY:
                raise BadRequest(f"expected a JSON body of 1 to {MAX_BODY} bytes (Content-Length {size})",
                                 status=413 if size > MAX_BODY else 400)
            # an HTTP/1.1 client's "Expect: 100-continue" (curl's for a body past 1 MB, .NET Framework's
            # for every POST) waits for the interim 100 before its body: the standard library sends it
            # from an HTTP/1.1 server only, and each such request waited for nothing (curl: 1 s)
            if self._expects_continue():
                try:
                    self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                except OSError:
                    self.close_connection = True
                    return
            try:
                raw = self.rfile.read(size)
            except OSError:  # timed out or reset before the whole body came: no one to answer
                self.close_connection = True
                return
            if len(raw) < size:  # the client closed early: nothing is run for it
                self.close_connection = True
                return
            self.close_connection = not self.keep  # (its body read: parse_request)
            try:
                body = json.loads(raw)
            except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (ValueError: a JSONDecodeError, or
                # an integer past Python's digit limit for str -> int)
                raise BadRequest(f"the request body is not valid JSON ({json_problem(e)})") from None
            if tokens:  # the tokenizer alone, in this request's thread: no wait behind an answer being made
                if self.app.stopping:
                    raise BadRequest("the server is shutting down", status=503)
                return self._send_json(200, self.app.tokenize(body) if path == "/tokenize" else
                                       self.app.detokenize(body))
            if isinstance(body, dict):
                self._query_user(body)
            req = self.app.respond_to(body) if responses else self.app.parse(body, chat)
            req["thinking"] = self.app.thinking(req)  # (--reasoning-parser)
        except BadRequest as e:
            if e.status in (411, 413):  # its body is not read, and may come all the same (_linger: a client
                # sending a body past MAX_BODY met a reset, not its 413, as a refused 100-continue's: w75c)
                self.close_connection = self.unread = True
            return self._error(e)
        except UserError as e:
            return self._error(BadRequest(str(e)))
        if self.app.stopping:  # at once: it queued behind the answer in flight for its 503
            return self._error(BadRequest("the server is shutting down", status=503))
        m = self.app.metrics
        with m.lock:
            m.waiting += 1
        try:
            with self.app.lock:
                with m.lock:
                    m.waiting -= 1
                m.observe("queue_wait_seconds", time.perf_counter() - self._arrived)
                if self.app.stopping:
                    return self._error(BadRequest("the server is shutting down", status=503))
                send = self._respond(req, chat)
                if send is not None:  # (counted before the lock goes: close takes it next)
                    self.app.sending_whole(1)
            # a whole answer is written after the lock is let go: a client that reads nothing
            # (several MB of logprobs fill the socket's buffers) holds its own thread, not the
            # engines, for the read timeout
            if send is not None:
                try:
                    send()
                finally:
                    self.app.sending_whole(-1)
        finally:
            m.observe("request_seconds", time.perf_counter() - self._arrived)

    def _sent_ahead(self) -> bool:
        """Whether the client has pipelined: sent a request (part of one) before the answer to
        the one before it, found read already behind the request being answered or waiting
        before an answer's head or a stream's last chunk is written (a look that does not wait;
        looked for as the answer had ended, in _next_request, a request its client sent on
        having the answer, before the thread got there, was taken for pipelined: r75i). Once
        seen, kept for the connection."""
        if not self.pipelined:
            timeout = self.connection.gettimeout()
            try:
                self.connection.settimeout(0)  # (peek: what is buffered, else one read that does not wait)
                self.pipelined = bool(self.rfile.peek(1))
            except (OSError, ValueError):  # closed, reset
                pass
            try:
                self.connection.settimeout(timeout)
            except OSError:
                pass
        return self.pipelined

    def _client_gone(self) -> bool:
        """Whether the client has closed its connection: readable with nothing to read (a
        client's next request, sent early on the same connection, is data, not a close).
        A non-streaming answer learns only so that its client left; streaming ones find out
        when a write fails. A client that pipelined its requests and then closed its sending
        side (shutdown(SHUT_WR), as `printf ... | nc -N` does) has not left: its requests are
        all sent and it reads their answers (RFC 9112 9.6: a half-close "does not imply that
        the client is no longer interested in a response"; Python's http.server and Hypercorn
        answer it). Its half-close reads, at the socket, as any close: a lone request's client
        closing is still taken as leaving (a client's timeout, Ctrl-C; Go's and hyper's servers
        take any close so), but a pipelined request's is not (w75c: of three requests pipelined
        and half-closed, none was answered in 19 tries of 20). Over TLS the socket's bytes are
        records, not the request: its end is read through the TLS layer (_ended)."""
        import select

        if self.connection.fileno() < 0:  # closed on this side
            return True
        try:  # poll, not select: select refuses descriptors past 1024 (a server with many clients queued)
            if hasattr(select, "poll"):
                p = select.poll()
                p.register(self.connection, select.POLLIN)
                readable = p.poll(0)
            else:  # Windows: no poll (every request failed, closed unanswered), and its select counts
                readable = select.select([self.connection], [], [], 0)[0]  # sockets, not descriptor numbers
            if not readable:  # (over TLS, data the TLS layer holds already read (pending()) is not
                return False  # seen here: data, so not gone either way)
            return self._ended() and not self._sent_ahead()
        except (ConnectionError, ssl.SSLError):  # reset under us; a TLS stream broken (no answer could be read)
            return True
        except (OSError, ValueError):  # cannot tell: go on as if it were there
            return False

    def _ended(self) -> bool:
        """Whether the client's side has ended (closed or half-closed), looked at without
        waiting and without taking what it sent. A TLS socket takes no MSG_PEEK (a ValueError:
        _client_gone took every client for there): the look is the read buffer's peek, its record
        read through the TLS layer, where a record not yet whole is SSLWantReadError, not the
        empty read of a plain socket that has nothing yet."""
        if not isinstance(self.connection, ssl.SSLSocket):
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        timeout = self.connection.gettimeout()
        try:
            self.connection.settimeout(0)
            return self.rfile.peek(1) == b""  # (b"": its close_notify, or its close without one)
        except ssl.SSLWantReadError:  # (a record begun, or one that held no data: a TLS 1.3 key update)
            return False
        finally:
            self.connection.settimeout(timeout)

    def _respond(self, req: dict, chat: bool) -> Callable[[], None] | None:
        """Runs ``req`` under the engines' lock: a stream is written as it comes; a whole
        answer is returned as the call that sends it (after the lock, do_POST)."""
        app = self.app
        if self._client_gone():  # left while it waited for the lock: nothing to run for it
            app.metrics.request(self._endpoint, LEFT)
            self.close_connection = True
            return
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        shaped = req.get("responses")  # (/v1/responses: the chat answer made a response, responses.py)
        if shaped is not None:
            from specrt.responses import chained
        created = int(time.time())
        head = {"id": rid, "created": created, "model": app.model}
        pieces = app.complete(req)
        if req.get("thinking") is not None:  # (--reasoning-parser: each piece's thinking apart, reasoning.Apart)
            from specrt import reasoning

            pieces = reasoning.Apart(pieces, req["thinking"], req["include_reasoning"])
        formats: dict[int, Any] = {}  # choice -> its logprobs format (completions count text offsets a choice)

        def lp(i: int, entries: list[dict] | None, context: list[int] = ()):
            if req["logprobs"] is None:
                return None
            if i not in formats:
                prompt = req["prompts"][i // req["n"]]
                formats[i] = _chat_logprobs if chat else _CompletionLogprobs(
                    app.session.text, context, app.session.eos, len(req["ids"][i // req["n"]]) if req["echo"] else 0,
                    prompt if req["echo"] and isinstance(prompt, str) else None)
            return formats[i](entries or [])

        try:
            first = next(pieces)  # bad input (a prompt past the context, a template error) fails here
        except EngineFailure as e:  # the prompt was fine, the engines' logits were not: no 400 naming it
            app.log(f"[error: {type(e).__name__}: {e}]")  # (as every engine failure is logged)
            app.metrics.add(engine_failures=1)
            return self._error(BadRequest(str(e), status=500))
        except UserError as e:  # (the grammar's, named by its field: a limit of llguidance's met at its start, w76j)
            message = str(e) if shaped is None else chained(str(e), shaped)  # (a response's chain past the context)
            return self._error(BadRequest(message, _grammar_field(req, e) or ("messages" if chat else "prompt")))
        except StopIteration:  # pragma: no cover - complete always ends with its dict
            return self._error(BadRequest("no output", status=500))
        except BadRequest as e:  # cut by a second Ctrl-C (Server.cutting): its 503, not an engine failure
            return self._error(e)
        except Exception as e:  # an engine failure: an error response, the server goes on
            app.log(f"[error: {type(e).__name__}: {e}]")
            app.metrics.add(engine_failures=1)
            return self._error(BadRequest(f"{type(e).__name__}: {e}", status=500))
        app.metrics.observe("time_to_first_token_seconds", time.perf_counter() - self._arrived)
        if not req["stream"]:
            text: dict[int, list[str]] = {}
            entries: dict[int, list[dict]] = {}
            finish: dict[int, str] = {}
            contexts: dict[int, list[int]] = {}  # the prompt tokens each choice's text follows
            scored: dict[int, list[dict] | None] = {}  # each choice's prompt's logprob entries (prompt_logprobs)
            last = first
            try:
                while "usage" not in last:
                    if self._client_gone():  # it timed out or gave up: stop, free the lock for the next
                        pieces.close()
                        app.metrics.request(self._endpoint, LEFT)
                        self.close_connection = True
                        return
                    i = last["index"]
                    if "text" in last:
                        text.setdefault(i, []).append(last["text"])
                    else:
                        finish[i], scored[i] = last["finish_reason"], last["prompt_logprobs"]
                    entries.setdefault(i, []).extend(last["logprobs"] or [])
                    contexts.setdefault(i, last.get("context", ()))
                    last = next(pieces)
            except BadRequest as e:  # (cut: Server.cutting)
                return self._error(e)
            except Exception as e:  # mid-answer (NaN logits from an engine, ...): nothing sent yet
                app.log(f"[error: {type(e).__name__}: {e}]")
                bad = _clients_fault(e)
                app.metrics.add(engine_failures=0 if bad else 1)
                return self._error(BadRequest(str(e), _grammar_field(req, e), status=400 if bad else 500))
            choices = []
            for i in range(req["choices"]):
                content, logprobs = "".join(text.get(i, [])), lp(i, entries.get(i, []), contexts.get(i, ()))
                # (its tool calls)
                parallel = req.get("parallel", True)
                msg, finish[i] = forced_message(content, finish[i], req["forced"], parallel) if req.get("forced") \
                    else tool_message(content, finish[i], req.get("tool_parser"), parallel, req.get("tools"))
                choice = ({"index": i, "message": msg, "logprobs": logprobs}
                          if chat else {"index": i, "text": content, "logprobs": logprobs})
                if req["prompt_logprobs"] is not None and not chat:  # (vLLM's: a completion's on each choice)
                    choice["prompt_logprobs"] = vllm_prompt_logprobs(scored.get(i))
                choices.append({**choice, "finish_reason": finish[i]})
            answer = {**head, "object": "chat.completion" if chat else "text_completion", "choices": choices,
                      "usage": last["usage"], "specrt": last["specrt"]}
            if req["prompt_logprobs"] is not None and chat:  # (vLLM's: a chat's beside its choices, its one prompt's)
                answer["prompt_logprobs"] = vllm_prompt_logprobs(scored.get(0))
            if req.get("thinking") is not None:  # (each message's thinking, kept apart from its content)
                pieces.fill(choices)
            if shaped is not None:
                from specrt.responses import whole

                answer = whole(shaped, answer, req["count"])
                req["keep"](answer)

            def send() -> None:  # sent once the engines are free (do_POST)
                # a client that reads nothing holds this thread, and close (Ctrl-C), for
                # write_timeout a write, as a stream's does, not the read timeout (60 s)
                self.connection.settimeout(app.write_timeout)
                self._send_json(200, answer)

            return send
        app.metrics.request(self._endpoint, 200)
        # a client that stops reading fills the socket's buffers and a write waits: for the
        # read timeout (60 s), then as long again for the error event, while every other
        # request waited for the engines. Past write_timeout it is taken for gone.
        self.connection.settimeout(app.write_timeout)
        # no Content-Length: to an HTTP/1.1 client each write is a chunk, the zero-length one its end,
        # and the connection is kept (it was closed after every stream: httpx, requests, AsyncOpenAI
        # opened 20 connections for 20 streams and 20 whole answers, 1 now; OpenAI's sync client
        # closes its own after [DONE] unread to the end all the same; h74g); an HTTP/1.0 one's ends it
        chunked = self.request_version >= "HTTP/1.1"
        self.close_connection = self.close_connection or not chunked

        def write(data: bytes, end: bool = False) -> None:
            if end:  # (a request sent while the stream went on, before its end: pipelined)
                self._sent_ahead()
            self.wfile.write(b"%x\r\n%s\r\n%s" % (len(data), data, b"0\r\n\r\n" if end else b"") if chunked else data)
            self.wfile.flush()

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        # nginx buffers a proxied answer by default (proxy_buffering on), unless it says not to: the
        # events came in 4-8 KB batches (a 100-token stream in 4 reads, the first 87 ms on; w74f)
        self.send_header("X-Accel-Buffering", "no")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"
        events = None  # (a response's events, not chunks: /v1/responses)
        if shaped is not None:
            from specrt.responses import Events

            events = Events(shaped, req["count"], req["keep"])
            write(events.begin())

        def send(payload: dict, end: bool = False) -> None:  # a chunk: its data line, or its response events
            data = b"data: " + json.dumps(payload).encode() + b"\n\n" if events is None else events.feed(payload)
            if data:  # (none for the role's chunk of a response)
                write(data, end)

        def event(i: int, delta: dict | None, finish=None, entries=None, context=(), tokens=0, **extra) -> None:
            if req.get("thinking") is not None:  # (--reasoning-parser: the choice's thinking since its last chunk)
                delta = pieces.delta(i, delta)
            choice = ({"index": i, "delta": delta or {}} if chat else {"index": i, "text": (delta or {}).get("content", "")})
            if req["logprobs"] is not None:
                choice["logprobs"] = lp(i, entries, context)
            usage = None  # (OpenAI: null until the last chunk)
            if req["usage_every"]:  # (vLLM's continuous_usage_stats: choice i's counts so far)
                p = len(req["ids"][i // req["n"]])
                usage = {"prompt_tokens": p, "completion_tokens": tokens, "total_tokens": p + tokens}
            send({**head, "object": obj, "choices": [{**choice, "finish_reason": finish}],
                  **({"usage": usage} if req["usage_chunk"] else {}), **extra})

        # (text that may begin a tool call held; a call's header sent once its name is whole, then its arguments;
        # a forced call's too: ForcedCalls)
        calls = ForcedCalls(req["forced"], req.get("parallel", True)) if req.get("forced") else \
            Streamed(req.get("tool_parser"), req.get("parallel", True), req.get("tools"))
        try:
            item, started, held = first, set(), None  # held: the last choice's finish, sent with specrt
            while "usage" not in item:
                i = item["index"]
                if chat and i not in started:
                    started.add(i)
                    event(i, {"role": "assistant", "content": ""})
                if "text" in item:
                    delta = calls.push(i, item["text"])
                    # (no empty chunk for text held back, unless it carries logprobs or reasoning: reasoning.Apart)
                    if delta or item["logprobs"] or (req.get("thinking") is not None and pieces.unsent.get(i)):
                        event(i, delta or {"content": ""}, entries=item["logprobs"], context=item.get("context", ()),
                              tokens=item["tokens"])
                    item = next(pieces)
                    continue
                deltas, finish = calls.end(i, item["finish_reason"])
                for delta in deltas:
                    event(i, delta, tokens=item["tokens"])
                item = {**item, "finish_reason": finish}
                if i < req["choices"] - 1:
                    event(i, None, item["finish_reason"], entries=item["logprobs"], context=item["context"],
                          tokens=item["tokens"])
                else:
                    held = item
                item = next(pieces)
            event(held["index"], None, held["finish_reason"], entries=held["logprobs"], context=held["context"],
                  tokens=held["tokens"], specrt=item["specrt"])
            if events is not None:  # (its last event, response.completed, carries the usage; no [DONE])
                send({"choices": [], "usage": item["usage"]}, end=True)
            else:
                if req["usage_chunk"]:
                    send({**head, "object": obj, "choices": [], "usage": item["usage"]})
                write(b"data: [DONE]\n\n", end=True)
        # the client left (or read nothing for write_timeout; over TLS, a record cut): stop generating; logged
        except (BrokenPipeError, ConnectionResetError, TimeoutError, ssl.SSLError):  # as a client that left
            pieces.close()
            self.close_connection = True
            if events is not None:  # (a response's: kept cancelled, responses.Events.ended)
                events.ended("cancelled")
        except Exception as e:  # mid-answer, after the headers: an error event ends the stream
            if not isinstance(e, BadRequest):  # (cut by a second Ctrl-C: said in the event only)
                app.log(f"[error: {type(e).__name__}: {e}]")
            bad = _clients_fault(e)
            kind = "invalid_request_error" if bad else "server_error"
            app.metrics.add(engine_failures=0 if bad or isinstance(e, BadRequest) else 1)
            try:
                event = {"error": {"message": str(e), "type": kind,
                                   "param": getattr(e, "param", _grammar_field(req, e)),
                                   "code": e.code if isinstance(e, BadRequest) else None}}
                write(events.error(event["error"]) if events is not None else  # (a response's: responses.Events)
                      b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n", end=True)
            except OSError:
                self.close_connection = True
        if app.stopping:  # (the stop closes connections after their answer: end_headers)
            self.close_connection = True


def _grammar_field(req: dict, e: BaseException) -> str | None:
    """The request's field whose grammar ``e`` is the error of (its message starts with the
    constraint's label: "response_format.json_schema: ..."; a grammar no token can continue
    mid-answer, h77b), else None."""
    g = req.get("grammar")
    return g.label.split(".")[0] if g is not None and str(e).startswith(g.label + ":") else None


def _clients_fault(e: BaseException) -> bool:
    """Whether an error raised while answering is the request's (400 invalid_request_error): a
    UserError, but not an engine's failure (NaN or +inf logits: the server's, 500)."""
    return isinstance(e, UserError) and not isinstance(e, EngineFailure)


def _interrupt(signum, frame) -> None:
    """SIGTERM (what service managers and containers stop with) stops the server as Ctrl-C does;
    so does SIGINT sent to a server that a script started in the background (its shell starts
    background jobs with SIGINT ignored, and Python then installs no handler of its own: `kill
    -INT` left it serving)."""
    raise KeyboardInterrupt


def drain(app: Server, httpd: ThreadingHTTPServer, serving: threading.Thread | None = None) -> None:
    """Stop serving once the request being answered has ended (``app.close``), ``httpd``
    listening meanwhile in a thread of its own, so that /health answers 503 "stopping" (what a
    load balancer's probe reads) and new requests 503; then close its socket. The socket used
    to close first: the probe's connection was refused until the process ended."""
    app.stopping = True
    began = getattr(httpd, "began", None)  # (_HTTPServer's: set as its serve_forever starts)
    if serving is not None and began is not None:  # serve's thread, unless the signal came before it ran
        while not began.is_set() and serving.is_alive():
            began.wait(0.05)
        began.wait(1.0)  # (started, not yet marked alive: a moment)
    if serving is None or not (began is None or began.is_set()):
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        app.close()
    finally:
        httpd.shutdown()  # no more connections taken; those begun get their answer (503 by now)
        try:
            if not app.settle(SETTLE_SECONDS):
                app.log(f"[stopping: {app.replying} connection(s) taken still unanswered after {SETTLE_SECONDS:g} "
                        "s (a client that sent nothing, or its body slowly): they close]")
        except KeyboardInterrupt:
            pass
        httpd.server_close()


WSAEMFILE = 10024  # Windows' "too many open sockets" (accept's EMFILE there; errno has no name for it off Windows)


def _listen_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The socket family --host listens with, and the address it binds: an IPv6 address
    (``::1``) on IPv6; a name with an IPv4 address on IPv4, as before (localhost: 127.0.0.1
    whatever order the resolver gives ::1 in); a name with IPv6 addresses only on the first
    of them (socketserver's IPv4 socket refused one: "Name or service not known"). "" (every
    interface) and IPv4 addresses stay IPv4, unresolved."""
    if ":" in host:
        return socket.AF_INET6, host
    if not host or all(part.isdigit() for part in host.split(".")):
        return socket.AF_INET, host
    found = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)  # (none: its gaierror, said by serve)
    six = [info[4][0] for info in found if info[0] == socket.AF_INET6]
    if six and not any(info[0] == socket.AF_INET for info in found):
        return socket.AF_INET6, six[0]
    return socket.AF_INET, host


class _HTTPServer(ThreadingHTTPServer):
    # connections waiting to be accepted: socketserver's 5 reset the 6th of a burst of clients
    # (20 of 64 at once), where the README promises they queue; the kernel caps it (somaxconn)
    request_queue_size = socket.SOMAXCONN

    def __init__(self, app: Server, address: tuple[str, int], *args, **kwargs):
        # an IPv6 address (--host ::1) on an IPv6 socket: socketserver's is IPv4 alone ("Address
        # family for hostname not supported"); a name as it resolves (_listen_family)
        self.address_family, host = _listen_family(address[0], address[1])
        super().__init__((host, address[1]), *args, **kwargs)
        self.app = app
        self.tls: ssl.SSLContext | None = None  # --ssl-certfile's context: connections taken over TLS (make_server)
        self.began = threading.Event()  # serve_forever has started (drain: no second loop)
        self.starved_said = -math.inf  # when running out of descriptors was last said (get_request)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self.began.set()
        super().serve_forever(poll_interval)

    def get_request(self):
        """accept(), said where it fails for want of descriptors (EMFILE, ENFILE: as many
        connections open as ``ulimit -n`` allows), at most once a minute, with a pause: the
        connections past the limit wait in the backlog until some close. socketserver drops the
        error without a word, and its loop, the listening socket still readable, spun a core."""
        try:
            request, address = super().get_request()
        except OSError as e:
            # (Windows: WSAEMFILE, 10024, its winerror; errno 24 where Python maps it, PC/errmap.h, else 10024)
            if e.errno in (errno.EMFILE, errno.ENFILE, WSAEMFILE) or getattr(e, "winerror", None) == WSAEMFILE:
                if time.monotonic() - self.starved_said > 60:
                    self.starved_said = time.monotonic()
                    self.app.log(f"[out of file descriptors ({describe_os_error(e)}) with {self.app.replying} "
                                 "connection(s) open: new ones wait until some close (`ulimit -n` raises the limit)]")
                time.sleep(0.05)
            raise
        if self.tls is not None:  # (no handshake here: the connection's thread does it, Handler._handshake)
            request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        return request, address

    # Every connection taken counts in Server.replying (drain waits for them) from the moment
    # it is accepted, on the serving thread, until it is closed after its answer: one counted
    # only when its handler thread began could be missed by a stop right after the accept. A
    # kept-alive connection waiting for its next request does not count (Handler._next_request).
    # socketserver closes each connection it hands to process_request with one shutdown_request
    # (after its handler, or after process_request failed); verify_request, which would close one
    # unprocessed, is not overridden.
    def process_request(self, request, client_address) -> None:
        self.app.replying_to(1)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        try:
            close_notify(request)  # (over TLS: the end said before the socket's own)
            super().shutdown_request(request)
        finally:
            self.app.replying_to(-1)


def make_server(app: Server, host: str, port: int, tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    """The server on ``host``:``port``; with ``tls`` (specrt.tls.context) it speaks HTTPS."""
    handler = type("BoundHandler", (Handler,), {"app": app})
    httpd = _HTTPServer(app, (host, port), handler)
    httpd.tls = tls
    return httpd


API_KEY_ENV = "SPECRT_API_KEY"


def served_name(folder: str) -> str:
    """A checkpoint folder's name as serve lists it by default: its last folder's; a snapshot in the
    Hugging Face hub cache (models--ORG--NAME/snapshots/HASH), the repository's id ORG/NAME, as the
    hub names it (its commit hash named nothing; r78g)."""
    p = Path(folder)
    repo = p.parent.parent.name
    if p.parent.name == "snapshots" and repo.startswith("models--") and len(repo) > len("models--"):
        return repo[len("models--"):].replace("--", "/", 1)
    return p.name


def _check_api_key(key: str | None) -> None:
    """Refuses a key no request could carry, naming where it came from (the option or the
    variable): an empty SPECRT_API_KEY (click takes it as unset: the server ran open, without a
    word, where a secret meant for it had not been filled in), a blank one, and one an HTTP
    header cannot hold as written (a character outside printable ASCII: a UTF-8 one arrives as
    its bytes read as Latin-1; spaces at its ends, a newline from a secret's file): every
    request got 401."""
    import os

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source("api_key") if ctx is not None else None
    named = API_KEY_ENV if source == click.core.ParameterSource.ENVIRONMENT else "--api-key"
    if key is None:
        if os.environ.get(API_KEY_ENV) == "":
            raise UserError(f"{API_KEY_ENV} is set but empty: expected a key (unset it to serve without one)")
        return
    if not key.strip():
        raise UserError(f"{named}: expected a non-empty key")
    if not (key.isascii() and key.isprintable()) or key != key.strip():
        raise UserError(f"{named}: expected a key of printable ASCII characters without spaces at either end, as an "
                        "HTTP header carries it (clients send 'Authorization: Bearer KEY'); this one has "
                        + ("spaces at an end" if key.isascii() and key.isprintable() else
                           "a character outside printable ASCII"))


@click.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="0: any free port.")
@click.option("--governor", default="auto", show_default=True, help="As for `specrt run`.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="A request's max_tokens when it gives none.")
@temperature_option("A request's temperature when it gives none (0 = greedy).")
@click.option("--model-name", callback=lambda ctx, param, v: argv_text(v),
              help="The model id /v1/models lists and responses carry (default: the name of the "
                   "target's folder the export was made from, e.g. smollm2-135m-instruct; of an export with "
                   "--lora, the adapter's folder, as vLLM's --lora-modules NAME=PATH serves it as NAME).")
@click.option("--reasoning-parser", type=click.Choice(REASONING_PARSERS),
              help="Split a thinking model's chat answers as vLLM's parser of that name does: the text in "
                   "<think>...</think> as the message's 'reasoning' and 'reasoning_content', the rest as its "
                   "'content' (qwen3: Qwen3; deepseek_r1: DeepSeek-R1 and its distills, QwQ). Default: none, the "
                   "answer as the model wrote it.")
@click.option("--prefix-snapshots", type=click.IntRange(min=0), default=SNAPSHOTS, show_default=True,
              help="Other conversations whose KV rows are kept aside for their next turn (a copy of their rows "
                   "each: on SmolLM2-135M ~46 KB a token); the oldest goes first.")
@click.option("--responses-store", type=click.IntRange(min=0), default=RESPONSES_STORE, show_default=True,
              help="/v1/responses kept in memory (the oldest dropped first) for previous_response_id and GET / "
                   "DELETE /v1/responses/{id}, .../input_items; 0: none kept (store true is then taken and "
                   "nothing kept, as vLLM's default). A response with store false is never kept.")
@click.option("--isolate-clients", is_flag=True,
              help="Reuse KV rows only between requests with the same OpenAI 'user' field (none: one anonymous "
                   "user), and keep no session growth (:grow): clients then cannot learn of each other's text "
                   "from what reuse or lookup saves. A kept /v1/responses response is then its user's too (GET and "
                   "DELETE give theirs as ?user=). By default all requests share these, as one client's.")
@click.option("--reproducible", is_flag=True,
              help="Coupled sampling for every sampled request: the text a function of the request's seed alone "
                   "(the one target-only decoding samples with it), whatever this server decoded before; by default "
                   "rejection sampling, which accepts more drafts but whose text depends on them.")
@click.option("--write-timeout", default=WRITE_TIMEOUT, show_default=True,  # (nan and inf too: a socket takes neither)
              type=Checked(click.FLOAT, lambda v: 0 < v <= 3600, "seconds, > 0 and at most 3600"),
              help="Seconds an answer's write waits for a client that has stopped reading (> 0, at most 3600); then a "
                   "stream ends, logged as a client that left, and the next request gets the engines (a whole "
                   "answer, written once they are free, is dropped).")
@template_kwargs_option
@click.option("--tool-call-parser", type=click.Choice(PARSERS),
              help="Parse the tool calls in chat answers to requests with 'tools' into OpenAI's tool_calls, as "
                   "the model writes them (hermes: <tool_call> blocks, Qwen2.5 / Qwen3; llama3_json: a JSON call, "
                   "Llama 3.1-3.3; pythonic, llama4_pythonic: [f(x=1)], Llama 3.2 / 4; qwen3_coder: <function=...> "
                   "XML, Qwen3-Coder; mistral: [TOOL_CALLS]), as vLLM's --enable-auto-tool-choice "
                   "--tool-call-parser. Default: none (such a "
                   "request with tool_choice auto is a 400; tools are still rendered with tool_choice none).")
@click.option("--enable-auto-tool-choice", is_flag=True,
              help="vLLM's flag, taken so that its command lines serve: --tool-call-parser alone turns auto tool "
                   "choice on here, and with it this flag changes nothing; without --tool-call-parser it is refused, "
                   "as vLLM refuses it.")
@click.option("--api-key", envvar=API_KEY_ENV, help="Require 'Authorization: Bearer KEY' on /v1 requests "
              "and /tokenize, /detokenize (default: $SPECRT_API_KEY; none: open). /health, /ping, /version "
              "and /metrics stay open.")
@click.option("--ssl-certfile", type=PathArg("a file"),
              help="Serve HTTPS with this certificate (PEM, its chain after it), as vLLM's option of that name; its "
                   "key in --ssl-keyfile, or in this file after it. Default: plain HTTP.")
@click.option("--ssl-keyfile", type=PathArg("a file"), help="The certificate's private key (PEM, unencrypted).")
@click.option("--ssl-ca-certs", type=PathArg("a file"),
              help="The CAs (PEM) a client's certificate is checked against, with --ssl-cert-reqs 1 or 2.")
@click.option("--ssl-cert-reqs", default=0, show_default=True,
              type=Checked(click.INT, lambda v: v in CERT_REQS, "0, 1 or 2 (ssl.CERT_NONE, CERT_OPTIONAL, "
                                                                "CERT_REQUIRED)"),
              help="Client certificates, as Python's ssl.VerifyMode and vLLM's option: 0 none asked for, 1 checked "
                   "against --ssl-ca-certs where sent, 2 required.")
def serve(engines_dir: Path, host, port, governor, max_new_tokens, temperature, model_name, prefix_snapshots,
          responses_store, isolate_clients, reproducible, write_timeout, chat_template_kwargs, tool_call_parser,
          enable_auto_tool_choice, reasoning_parser, api_key, ssl_certfile, ssl_keyfile, ssl_ca_certs,
          ssl_cert_reqs) -> None:
    """ENGINES_DIR behind an OpenAI-compatible HTTP endpoint (/v1/chat/completions,
    /v1/completions, /v1/responses, /v1/models; /metrics for Prometheus; vLLM's /tokenize,
    /detokenize, /version, /ping), one stream at a time, each conversation's next turn
    reusing the KV rows of the turns before it. Ctrl-C (or SIGTERM) stops it once the answer being
    sent has ended; a second Ctrl-C cuts that answer at its next round."""
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.text import not_text
    from specrt.tls import context

    _check_api_key(api_key)
    # before the engines load: a wrong file is said at once (and the context is whole before the port listens)
    tls = context(ssl_keyfile, ssl_certfile, ssl_ca_certs, ssl_cert_reqs)
    if ssl_ca_certs is not None and not ssl_cert_reqs:  # (as vLLM and uvicorn take it: loaded, asked for by none)
        click.echo("note: --ssl-ca-certs without --ssl-cert-reqs 1 or 2: clients are not asked for a certificate",
                   err=True)
    if enable_auto_tool_choice and not tool_call_parser:  # (as vLLM answers; the flag was "no such option")
        raise UserError(f"--enable-auto-tool-choice needs --tool-call-parser ({' or '.join(PARSERS)}, as the "
                        "model writes its calls), as vLLM's does")
    if model_name is not None and not model_name.strip():  # (it served as the folder's name, unchecked)
        raise UserError("--model-name: expected a non-empty name")
    # a byte that was not UTF-8 (`$'m\xe9'` from a Latin-1 terminal) was served as 'm\udce9', listed so in
    # /v1/models, and a request for "mé" was a 404
    if model_name is not None and (problem := not_text(model_name, "--model-name")) is not None:
        raise UserError(problem)
    app = Server(engines_dir, governor, SamplingParams(temperature=temperature, coupled=reproducible), max_new_tokens,
                 model_name or "",
                 isolate=isolate_clients, snapshots=prefix_snapshots, chat_template_kwargs=chat_template_kwargs)
    app.api_key, app.write_timeout, app.tool_call_parser = api_key, write_timeout, tool_call_parser
    app.responses_store = responses_store
    # a request's model is checked against a name given with --model-name only: the default
    # (the target folder's name; in the Hugging Face hub cache its ORG/NAME: served_name) is a guess
    app.model_strict = bool(model_name)
    app.reasoning = reasoning_parser
    if not app.model:  # the target checkpoint's folder name, as the binding receipt has it; a LoRA export's, the
        # adapter's (w78c: it served the fine-tune under the base's name, which vLLM serves the base as)
        target = (app.session.engines.export.get("binding_receipt") or {}).get("target") or {}
        folder = (target.get("lora") or {}).get("folder") or target.get("folder")
        app.model = served_name(folder) if folder else engines_dir.resolve().name
    try:
        from specrt.cli import session_warnings

        # (it served, and answered every request 400 "text prompts need the target's tokenizer", a
        # completion of token ids too: an answer is text, its logprobs' tokens too)
        app.session.need_text("specrt serve answers in text and needs the target's tokenizer")
        if tool_call_parser and (problem := parser_problem(app.session.text, tool_call_parser)):
            raise UserError(problem)
        if reasoning_parser and (problem := reasoning_tags_problem(app.session.text, reasoning_parser)):
            raise UserError(problem)  # (it served, and every answer came as reasoning, content null: w75f)
        if tool_call_parser and (note := tools_unread(app.session.text)):
            click.echo(f"note: {note}", err=True)
        if chat_template_kwargs and app.session.text.chat_template is not None:
            # (variables the template refuses: it served, and answered every chat request 400 blaming the
            # client's 'messages', a walk, w72c; export renders a user's message so, without them)
            try:
                app.session.encode("Hello.", True)
            except UserError as e:
                raise UserError(f"--chat-template-kwargs: the chat template refuses a conversation of one user "
                                f"message with these variables ({e})") from None
        session_warnings(app.session)
        try:
            httpd = make_server(app, host, port, tls)
        except OSError as e:
            raise UserError(f"--host {host!r} --port {port}: cannot listen there ({e.strerror or e})") from None
        h, p = httpd.server_address[:2]
        h = f"[{h}]" if ":" in h else h  # (an IPv6 address in a URL)
        scheme = "https" if tls is not None else "http"
        # before the line that says it serves: a signal sent on reading it was ignored (SIGTERM
        # ended the process mid-answer, a stream cut without a word)
        old = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            serving, crashed = None, []

            def serve_loop() -> None:  # (an error in the loop ends serve with it after the stop, exit 1)
                try:
                    httpd.serve_forever()
                except BaseException as e:
                    crashed.append(e)

            try:
                # in a thread of its own: Ctrl-C or SIGTERM raised in serve_forever could land
                # between its accept and its handing the connection on (the client got no answer)
                serving = threading.Thread(target=serve_loop, daemon=True)
                serving.start()
                click.echo(f"serving {engines_dir} as '{app.model}' on {scheme}://{h}:{p}/v1 (governor "
                           f"{app.session.governor_spec}; OpenAI-compatible: /v1/chat/completions, /v1/completions, "
                           f"/v1/responses, /v1/models{'; an API key required' if api_key else ''}); Ctrl-C stops",
                           err=True)
                sys.stderr.flush()
                while serving.is_alive():
                    serving.join(0.5)
            except KeyboardInterrupt:
                pass
            finally:
                drain(app, httpd, serving)
            if crashed:  # (an OSError there, e.g. out of file descriptors, said without a traceback)
                if isinstance(crashed[0], OSError):
                    raise UserError(f"serving stopped: {describe_os_error(crashed[0])}") from None
                raise crashed[0]
            click.echo(f"stopped serving on {scheme}://{h}:{p}/v1", err=True)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
    finally:
        app.close()
