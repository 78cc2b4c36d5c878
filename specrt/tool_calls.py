"""Function calling for `specrt serve` (``--tool-call-parser``): a chat request's ``tools``
checked, and the tool calls a model writes in its answer parsed out of the text into
OpenAI's ``tool_calls``, as vLLM's parsers of the same names read them.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen2.5,
                 Qwen3, Hermes): the text before the first block is the content (null when
                 empty), the text after the last one is dropped; a last block cut before its
                 </tool_call> counts where its JSON is whole; a block ends at the first
                 </tool_call> after which its JSON is whole (one inside a string is text; vLLM's
                 regex ends it at the first, and the answer is all content)
    llama3_json  an answer that is a JSON object {"name": ..., "parameters" (or "arguments"):
                 {...}}, or several joined by ";", optionally after <|python_tag|> (Llama 3.1-3.3
                 with their JSON tool-calling prompt): content null

A block that is not such an object (bad JSON, no name) leaves the whole answer as content
(vLLM's too): a client gets text, never a 500. An answer cut by max_tokens is not parsed (its
last call is unsure): it stays content with finish_reason "length". Streaming
(``Streamed``) sends text as it comes until a call may begin, holds the rest (vLLM sends the
arguments piece by piece; here each call comes whole in one delta, which OpenAI's clients
accumulate all the same), and at the end sends the held text or the calls.
"""

from __future__ import annotations

import json
import uuid

from specrt.errors import UserError
from specrt.runtime.text import tag_start_at_end

PARSERS = ("hermes", "llama3_json")
START = "<tool_call>"  # hermes' block
END = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3's code-interpreter token, before a call (a special token: text only
# where the tokenizer keeps it)


class ToolsRefused(UserError):
    """A request's tools or tool_choice refused; ``param`` names the field (serve's 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def request_tools(body: dict, parser: str | None) -> tuple[list[dict] | None, str | None]:
    """A chat request's ``tools`` checked (None where it gives none) and the parser its answer
    goes through (None: the answer is not parsed): ``tool_choice`` "auto" (the default with
    tools) needs ``--tool-call-parser``; "none" renders the tools but parses nothing (vLLM's
    default); "required" and a named function need guided decoding, which specrt does not do."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None:
        if not isinstance(tools, list):
            raise ToolsRefused(f"'tools' must be a list of function tools; got {tools!r:.60}", "tools")
        for i, t in enumerate(tools):
            problem = _tool_problem(t)
            if problem:
                raise ToolsRefused(f"tools[{i}]{problem}", "tools")
    tools = tools or None  # ([]: none, as OpenAI and vLLM take it)
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict) or choice == "required":
        named = isinstance(choice, dict)
        raise ToolsRefused(f"'tool_choice' {choice!r:.80} is not supported: "
                           f"{'a named function' if named else 'required'} needs guided decoding, which specrt does "
                           "not do (only \"auto\", with --tool-call-parser, or \"none\")", "tool_choice")
    if choice not in ("auto", "none"):
        raise ToolsRefused(f"'tool_choice' must be \"none\", \"auto\", \"required\" or a named function; got "
                           f"{choice!r:.60}", "tool_choice")
    if choice == "auto" and tools and parser is None:  # (vLLM's words, with specrt's option)
        raise ToolsRefused('"auto" tool choice requires --tool-call-parser to be set (specrt serve '
                           f"--tool-call-parser {' or '.join(PARSERS)}, as the model writes its calls); "
                           '"tool_choice": "none" renders the tools without parsing calls', "tool_choice")
    return tools, parser if choice == "auto" and tools else None


def _tool_problem(t) -> str | None:
    """What is wrong with one of ``tools`` (its index's suffix first), or None."""
    if not isinstance(t, dict) or t.get("type") != "function":
        return f": expected a function tool {{'type': 'function', 'function': {{...}}}}; got {t!r:.60}"
    f = t.get("function")
    if not isinstance(f, dict):
        return f".function: expected an object {{'name', 'description', 'parameters'}}; got {f!r:.60}"
    if not isinstance(f.get("name"), str) or not f["name"]:
        return f".function.name: expected a non-empty string; got {f.get('name')!r:.60}"
    if f.get("description") is not None and not isinstance(f["description"], str):
        return f".function.description: expected a string; got {f['description']!r:.60}"
    if f.get("parameters") is not None and not isinstance(f["parameters"], dict):
        return f".function.parameters: expected a JSON Schema object; got {f['parameters']!r:.60}"
    return None


def parser_problem(text, parser: str) -> str | None:
    """Why ``parser`` could never find a call in answers decoded by ``text`` (runtime.text.Text),
    or None: hermes' tags made special tokens, which an answer's text leaves out (Text.decode;
    vLLM decodes them for this parser, specrt's answers never hold special tokens)."""
    if parser != "hermes":  # (llama3_json's <|python_tag|> is special in Llama 3: left out, the JSON read alone)
        return None
    special = text.special_among(START, END)
    if not special:
        return None
    return (f"--tool-call-parser hermes: the tokenizer marks {' and '.join(special)} as special tokens, which "
            "an answer's text leaves out, so no call could be parsed (hermes reads <tool_call> blocks as text, as "
            "Qwen2.5's and Qwen3's tokenizers keep them)")


def tools_unread(text) -> str | None:
    """A note where the chat template a request's tools go through (Text.tool_template) reads
    no ``tools`` (SmolLM2's, Llama 2's): the model is never shown them; None where it reads
    them, or there is no template."""
    if text.tool_template is None:
        return None
    try:
        read = text.template_reads(text.tool_template)
    except UserError as e:  # (a named "tool_use" one, which export never renders: it said no file, r75i)
        which = '"tool_use" chat template' if text.tool_template != text.chat_template else "chat template"
        raise UserError(f"--tool-call-parser: {text.template_file}: the {which}, which requests with tools go "
                        f"through: {str(e).removeprefix(f'{text.template_file}: chat template: ')}") from None
    if "tools" in read:
        return None
    return (f"--tool-call-parser: the chat template ({text.template_file}) reads no 'tools': a request's tools "
            "never reach the model, which then calls none")


def parse(text: str, parser: str) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a whole answer: (``text``, []) where it holds none, or a
    malformed one."""
    calls = _hermes(text) if parser == "hermes" else _llama3_json(text)
    if calls is None:
        return text, []
    content = text[:text.find(START)] if parser == "hermes" else ""
    return content or None, calls


def _hermes(text: str) -> list[dict] | None:
    at, calls = text.find(START), []
    if at < 0:
        return None
    while at >= 0:
        end, call = at, None
        while call is None:  # the block ends at the first </tool_call> after which it is a call (the tag may be
            # text inside one of its strings: "use </tool_call> to end"), or, last, at the text's end
            end = text.find(END, end + 1) if end >= 0 else None
            if end is None:
                return None
            call = _call(_json(text[at + len(START):end if end >= 0 else len(text)]), "arguments")
        calls.append(call)
        at = text.find(START, end) if end >= 0 else -1
    return calls


def _llama3_json(text: str) -> list[dict] | None:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    calls, at, decoder = [], 0, json.JSONDecoder()
    while at < len(body):
        try:
            obj, at = decoder.raw_decode(body, at)
        except (ValueError, RecursionError):
            return None
        call = _call(obj, "parameters", "arguments")
        if call is None:
            return None
        calls.append(call)
        rest = body[at:].lstrip()
        if rest and not rest.startswith(";"):  # (text after the object: an answer, not a call)
            return None
        at = len(body) - len(rest[1:].lstrip()) if rest else len(body)
    return calls or None


def _json(body: str):
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _call(obj, *keys: str) -> dict | None:
    """OpenAI's tool call of a parsed {"name", ``keys[0]`` (or another of ``keys``): {...}}
    object (arguments absent: {}; given as a JSON string of an object: that object); None
    where it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    given = [k for k in keys if k in obj]
    if len(given) > 1:  # (both parameters and arguments: which is meant is unclear)
        return None
    args = obj[given[0]] if given else {}
    if isinstance(args, str):
        args = _json(args)
    if not isinstance(args, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}


def message(content: str, finish: str, parser: str | None, parallel: bool = True) -> tuple[dict, str]:
    """A whole chat answer's message and finish_reason: with ``parser``, its tool calls
    parsed out ("tool_calls" where there are some and the answer ended, not cut by
    max_tokens; the first alone where not ``parallel``, the request's parallel_tool_calls
    false, as vLLM drops the others); else the text as content."""
    content_of, calls = parse(content, parser) if parser is not None and finish == "stop" else (content, [])
    calls = calls if parallel else calls[:1]
    if not calls:
        return {"role": "assistant", "content": content}, finish
    return {"role": "assistant", "content": content_of, "tool_calls": calls}, "tool_calls"


class Streamed:
    """A streamed chat answer's choices through ``parser`` (None: text passes as it comes):
    ``push`` a choice's piece, get the content to send now; ``end`` with its finish_reason,
    get the deltas still to send and the finish_reason to send."""

    def __init__(self, parser: str | None, parallel: bool = True):
        self.parser, self.parallel = parser, parallel  # (parallel: message's)
        self.text: dict[int, str] = {}  # choice -> its answer so far
        self.sent: dict[int, int] = {}  # choice -> characters of it sent as content
        self.plain: set[int] = set()  # llama3_json: choices known not to be calls (they start otherwise)

    def push(self, i: int, piece: str) -> str:
        if self.parser is None:
            return piece
        text = self.text[i] = self.text.get(i, "") + piece
        sent = self.sent.get(i, 0)
        if self.parser == "hermes":  # up to a block's start, or text that could begin one
            at = text.find(START, max(0, sent - len(START)))
            upto = at if at >= 0 else len(text) - tag_start_at_end(text, START)
        else:  # all of it once it cannot be a call: it starts otherwise than { or <|python_tag|>
            head = text.lstrip()
            if i not in self.plain and (not head or head.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(head)):
                upto = 0
            else:
                self.plain.add(i)
                upto = len(text)
        self.sent[i] = max(sent, upto)
        return text[sent:self.sent[i]]

    def end(self, i: int, finish: str) -> tuple[list[dict], str]:
        if self.parser is None:
            return [], finish
        text, sent = self.text.get(i, ""), self.sent.get(i, 0)
        msg, finish = message(text, finish, None if i in self.plain else self.parser, self.parallel)
        rest = (msg["content"] or "")[sent:]
        deltas = [{"content": rest}] if rest else []
        deltas += [{"tool_calls": [{"index": k, **call}]} for k, call in enumerate(msg.get("tool_calls", ()))]
        return deltas, finish
