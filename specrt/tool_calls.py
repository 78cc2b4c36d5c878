"""Function calling for `specrt serve` (``--tool-call-parser``): a chat request's ``tools``
checked, and the tool calls a model writes in its answer parsed out of the text into
OpenAI's ``tool_calls``, as vLLM's parsers of the same names read them.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen2.5,
                 Qwen3, Hermes): the text before the first block is the content (null when
                 empty), the text after the last one is dropped; a last block cut before its
                 </tool_call> counts where its JSON is whole; a block ends at the first
                 </tool_call> after which its JSON is whole (one inside a string is text; vLLM's
                 regex ends it at the first, and the answer is all content)
    llama3_json  JSON objects {"name": ..., "parameters" (or "arguments"): {...}} joined by ";"
                 that end the answer, optionally after <|python_tag|> (Llama 3.1-3.3 with their
                 JSON tool-calling prompt); the text before them is the content (null where it is
                 blank; vLLM's drops it), where they are preceded by text (Llama 3.2 1B/3B preface
                 theirs) each must name its "parameters" or "arguments" (vLLM's needs them too)
    pythonic     an answer that is a Python list of calls with keyword arguments,
                 [get_weather(city="Paris"), f()] (Llama 3.2 with its pythonic prompt, Llama 4,
                 ToolACE), read with ``ast`` and literal nodes alone (never evaluated): strings,
                 numbers (negative ones too: vLLM's refuses them), True/False/None and JSON's
                 true/false/null, lists, dicts; a dotted name a.b(...) is the call's name; content
                 null; llama4_pythonic: the same, <|python_start|> ... <|python_end|> around it
                 dropped where they are text
    qwen3_coder  <tool_call><function=NAME><parameter=P>value</parameter>...</function></tool_call>
                 (Qwen3-Coder, Qwen3.5): a value's one leading and trailing newline dropped, and
                 typed by the tool's JSON schema for P, as vLLM's: string types kept, integer and
                 number parsed (kept a string where they do not parse), boolean true/false (other
                 text kept a string: vLLM's makes it false), object/array JSON (else a Python
                 literal), "null" null where the type is not a string or the schema admits null,
                 a parameter the schema does not name a string; a </parameter> ends a value only
                 where the next parameter, </function> or </tool_call> follows it and it closes
                 no <parameter= opened on a line of the value (one in the value, code quoting
                 the format, is text); the text before the first block is the content
    mistral      [TOOL_CALLS] followed by a JSON array of {"name", "arguments"} (Mistral 7B v0.3,
                 Nemo, Small 3.1), or the newer [TOOL_CALLS]NAME[ARGS]{...} a call (tokenizer v11+:
                 Mistral Small 3.2, Magistral, Devstral; a [CALL_ID]ID after the name dropped);
                 the text before the first is the content; call ids of 9 letters and digits, as
                 Mistral's chat templates and mistral_common refuse any other when the calls come
                 back in the conversation. [TOOL_CALLS], [ARGS] and [CALL_ID] are special tokens,
                 which an answer's text leaves out: with this parser the answers' text keeps
                 those three (Text.keep_special), as vLLM decodes special tokens for it

A call that is malformed (bad JSON or Python, no name, arguments not an object) leaves the
whole answer as content: a client gets text, never a 500. An answer cut by max_tokens gives
its calls where each is whole (its JSON or Python list complete; qwen3_coder's values closed by
their </parameter>), with finish_reason "length" (vLLM gives the calls with "tool_calls", which hides the cut: an
agent then runs a call whose answer was cut after it); else it stays content. Streaming
(``Streamed``) sends text as it comes until a call may begin, holds the rest (vLLM sends the
arguments piece by piece; here each call comes whole in one delta, which OpenAI's clients
accumulate all the same), and at the end sends the held text or the calls.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
import string
import uuid

from specrt.errors import UserError
from specrt.runtime.text import tag_start_at_end

PARSERS = ("hermes", "llama3_json", "llama4_pythonic", "mistral", "pythonic", "qwen3_coder")
START = "<tool_call>"  # hermes' block (qwen3_coder's too)
END = "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3's code-interpreter token, before a call (a special token: text only
# where the tokenizer keeps it)
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4's, around a call (special too)
FUNCTION, PARAMETER = "<function=", "<parameter="  # qwen3_coder's, inside a <tool_call> block
FUNCTION_END, PARAMETER_END = "</function>", "</parameter>"
TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"  # mistral's (special tokens: kept in its answers' text)
CALL_ID = "[CALL_ID]"  # v11+ tokenizers': NAME[CALL_ID]ID[ARGS]{...}, as templates that write the ids render a call
HELD = {"hermes": (START,), "qwen3_coder": (START, FUNCTION), "mistral": (TOOL_CALLS,)}  # where a call may begin
LEADING = {"pythonic": ("[",), "llama4_pythonic": ("[", PYTHON_START)}  # an answer that is a call starts so
NAME_START = re.compile(r'\{\s*"name"\s*:')  # llama3_json: where a call may begin after text
VALUE_END = re.compile(r"\s*(?:<parameter=|</function>|</tool_call>|$)")  # qwen3_coder: what follows a value's end
BLANK = re.compile(r"\s*")


class ToolsRefused(UserError):
    """A request's tools or tool_choice refused; ``param`` names the field (serve's 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def request_tools(body: dict, parser: str | None) -> tuple[list[dict] | None, str | None]:
    """A chat request's ``tools`` checked (None where it gives none) and the parser its answer
    goes through (None: the answer is not parsed): ``tool_choice`` "auto" (the default with
    tools) needs ``--tool-call-parser``; "none" renders the tools but parses nothing (vLLM's
    default); "required" and a named function render the tools and parse nothing: serve holds the
    answer to their JSON schema (guided decoding, cmd_serve.forced_tools) and reads its calls from it."""
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
    if isinstance(choice, dict) or choice == "required":  # (guided decoding: cmd_serve.forced_tools)
        if not tools:
            raise ToolsRefused(f"'tool_choice' {choice!r:.80} needs 'tools' to call", "tool_choice")
        return tools, None
    if choice not in ("auto", "none"):
        raise ToolsRefused(f"'tool_choice' must be \"none\", \"auto\", \"required\" or a named function; got "
                           f"{choice!r:.60}", "tool_choice")
    if choice == "auto" and tools and parser is None:  # (vLLM's words, with specrt's option)
        raise ToolsRefused('"auto" tool choice requires --tool-call-parser to be set (specrt serve '
                           f"--tool-call-parser {' or '.join(PARSERS)}, as the model writes its calls); "
                           '"tool_choice": "none" renders the tools without parsing calls', "tool_choice")
    return tools, parser if choice == "auto" and tools else None


def rendered(render, tools: list[dict] | None):
    """``render(tools)``; where that fails (a UserError) and a tool gives no "parameters" (OpenAI's
    way to say it takes none), ``render`` of the tools with an empty parameter list, as a template
    that reads each tool's parameters then renders: Qwen3-Coder's (``tool.parameters.properties``)
    refused such a request, a 400, which vLLM renders (its tools' parameters null, w76g); the
    first error stands if that fails too. The tools as given where they render (transformers')."""
    try:
        return render(tools)
    except UserError as e:
        empty = {"type": "object", "properties": {}}
        filled = [t if "parameters" in t["function"] else {**t, "function": {**t["function"], "parameters": empty}}
                  for t in tools or ()]
        if filled == (tools or []):
            raise
        try:
            return render(filled)
        except UserError:
            raise e from None


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
    or None: hermes' and qwen3_coder's tags made special tokens, which an answer's text leaves
    out (Text.decode; vLLM decodes them for these parsers, specrt's answers never hold special
    tokens); mistral's [TOOL_CALLS] not a token at all (vLLM's refuses such a tokenizer too).
    For mistral it makes ``text`` keep [TOOL_CALLS], [ARGS] and [CALL_ID] in answers (Text.keep_special)."""
    if parser == "mistral":
        if text.tokenizer.token_to_id(TOOL_CALLS) is None:
            return (f"--tool-call-parser mistral: the tokenizer has no {TOOL_CALLS} token, which Mistral's models "
                    "write before their calls (not a Mistral tokenizer?)")
        text.keep_special(TOOL_CALLS, ARGS, CALL_ID)
        return None
    if parser not in ("hermes", "qwen3_coder"):  # (llama3_json's <|python_tag|>, Llama 4's <|python_start|>: special,
        return None  # left out, the call read alone)
    special = text.special_among(START, END)
    if not special:
        return None
    return (f"--tool-call-parser {parser}: the tokenizer marks {' and '.join(special)} as special tokens, which "
            "an answer's text leaves out, so no call could be parsed (its <tool_call> blocks are read as text, as "
            "Qwen2.5's, Qwen3's and Qwen3-Coder's tokenizers keep them)")


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


def parse(text: str, parser: str, tools: list[dict] | None = None, cut: bool = False
          ) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a whole answer: (``text``, []) where it holds none, or a
    malformed one. ``tools``: the request's (qwen3_coder types values by their schemas);
    ``cut``: the answer was cut by max_tokens, and a call counts only where it is whole."""
    if parser == "hermes":
        found = _hermes(text)
    elif parser == "llama3_json":
        found = _llama3_json(text)
    elif parser == "qwen3_coder":
        found = _qwen3_coder(text, tools or (), cut)
    elif parser == "mistral":
        found = _mistral(text)
    else:
        found = _pythonic(text, parser)
    if found is None:
        return text, []
    content, calls = found
    ids = _mistral_id if parser == "mistral" else _call_id
    return content or None, [{"id": ids(), "type": "function",
                               "function": {"name": name, "arguments": args}} for name, args in calls]


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _mistral_id() -> str:  # (Mistral's templates refuse any id but 9 letters and digits: raise_exception)
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


def _hermes(text: str) -> tuple[str, list] | None:
    at, calls = text.find(START), []
    if at < 0:
        return None
    content = text[:at]
    while at >= 0:
        end, call = at, None
        while call is None:  # the block ends at the first </tool_call> after which it is a call (the tag may be
            # text inside one of its strings: "use </tool_call> to end"), or, last, at the text's end (its JSON
            # whole: in an answer cut by max_tokens too, the call is)
            end = text.find(END, end + 1) if end >= 0 else None
            if end is None:
                return None
            call = _call(_json(text[at + len(START):end if end >= 0 else len(text)]), "arguments")
        calls.append(call)
        at = text.find(START, end) if end >= 0 else -1
    return content, calls


def _llama3_json(text: str) -> tuple[str, list] | None:
    """The calls that end ``text``: from its start (after blank text and <|python_tag|>), or from
    its first ``{"name":`` where the rest is calls, each then naming its arguments (a text that
    holds a call-like object before them is no preface: '{..}, {..}' stays text)."""
    head = len(text) - len(text.lstrip())
    if text.startswith(PYTHON_TAG, head):
        head += len(PYTHON_TAG)
    calls = _json_calls(text, head, False)
    if calls is not None:
        return "", calls
    m = NAME_START.search(text, head)
    calls = _json_calls(text, m.start(), True) if m else None
    return None if calls is None else (text[:m.start()] if text[:m.start()].strip() else "", calls)


def _json_calls(text: str, at: int, named: bool) -> list | None:
    """The calls of ``text[at:]``: JSON call objects joined by ";", up to its end (blanks around
    them); ``named``: each names its "parameters" or "arguments"."""
    calls, decoder = [], json.JSONDecoder()
    at = len(text) - len(text[at:].lstrip())
    while at < len(text):
        try:
            obj, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):
            return None
        call = _call(obj, "parameters", "arguments")
        if call is None or (named and "parameters" not in obj and "arguments" not in obj):
            return None
        calls.append(call)
        rest = text[at:].lstrip()
        if rest and not rest.startswith(";"):  # (text after the object: an answer, not a call)
            return None
        at = len(text) - len(rest[1:].lstrip()) if rest else len(text)
    return calls or None


def _pythonic(text: str, parser: str) -> tuple[str, list] | None:
    body = text.strip()
    if parser == "llama4_pythonic" and body.startswith(PYTHON_START):
        body = body[len(PYTHON_START):].replace(PYTHON_END, "").strip()
    if not body.startswith("["):
        return None
    try:  # (parsed, never evaluated: only literal nodes are read)
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        # keyword arguments alone (vLLM's drops positional ones unsaid: here the answer stays text)
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            return None
        name = _dotted(node.func)
        try:
            args = _arguments({k.arg: _literal(k.value) for k in node.keywords})
        except (ValueError, RecursionError):
            return None
        if name is None or args is None:
            return None
        calls.append((name, args))
    return "", calls


def _dotted(node) -> str | None:
    """A call's name: ``f`` or a dotted ``a.b.f`` (vLLM's keeps the dots), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


JSON_NAMES = {"true": True, "false": False, "null": None}  # (some models write JSON's literals in Python)


def _literal(node):
    """The value of a literal node (ValueError for anything else: a name, a call, an operation)."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool)):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        keys = [_literal(k) if k is not None else None for k in node.keys]
        if any(k is None or not isinstance(k, (str, int, float)) for k in keys):  # ({**x}'s key is None)
            raise ValueError("not a literal key")
        return {k: _literal(v) for k, v in zip(keys, node.values)}
    if isinstance(node, ast.Name) and node.id in JSON_NAMES:
        return JSON_NAMES[node.id]
    raise ValueError("not a literal")


def _qwen3_coder(text: str, tools, cut: bool) -> tuple[str, list] | None:
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    start = text.find(START)  # (the first block's <function=: one in the text before it is text, as vLLM's, w76g)
    at, calls, content = text.find(FUNCTION, start) if start >= 0 else -1, [], None
    at = at if at >= 0 else text.find(FUNCTION)
    while at >= 0:
        if content is None:  # (the text before the first call's <tool_call>, or its <function= where it has none)
            before = text[:at].rstrip()
            content = before[:-len(START)] if before.endswith(START) else text[:at]
        found = _function(text, at + len(FUNCTION), schemas, cut)
        if found is None:
            return None
        name, args, at = found
        calls.append((name, args))
        at = text.find(FUNCTION, at)
    return (content, calls) if calls else None


def _function(text: str, at: int, schemas: dict, cut: bool) -> tuple[str, str, int] | None:
    """(name, arguments, where it ends) of the function whose name starts at ``at``, or None."""
    close = text.find(">", at)
    name = text[at:close] if close >= 0 else ""
    if not name or any(c in name for c in "{}<>\"' \t\r\n"):  # (a template's unrendered {{ name }}: no call)
        return None
    schema = schemas.get(name)
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    args, at = {}, close + 1
    while True:
        at = BLANK.match(text, at).end()
        if text.startswith(FUNCTION_END, at):
            at += len(FUNCTION_END)
            break
        if at == len(text) and not cut:  # (the answer ended inside its function: vLLM's takes it)
            break
        if not text.startswith(PARAMETER, at):
            return None
        close = text.find(">", at)
        key = text[at + len(PARAMETER):close] if close >= 0 else ""
        if not key or "<" in key:
            return None
        value, at = _value(text, close + 1, cut)
        if value is None:
            return None
        args[key] = _typed(value, props.get(key))
    args = _arguments(args)
    return None if args is None else (name, args, at)


def _value(text: str, at: int, cut: bool) -> tuple[str | None, int]:
    """A parameter's value starting at ``at`` and where the text after it resumes: it ends at the
    first </parameter> followed by the next parameter, </function>, </tool_call> or the text's
    end, past those that close a <parameter= opened on a line of the value (a call quoted in it,
    as vLLM's counts them; where they do not pair up, the first); without one (not in a cut
    answer), at the next parameter, </function> or the end."""
    end, first, depth, pos = -1, -1, 0, at
    close = text.find(PARAMETER_END, pos)
    while close >= 0:
        opened = text.find("\n" + PARAMETER, pos, close)
        if opened >= 0:  # (a file the call writes that quotes a call: its </parameter> is text, w76g)
            depth, pos = depth + 1, opened + 1 + len(PARAMETER)
            continue
        if VALUE_END.match(text, close + len(PARAMETER_END)):
            if not depth:
                end = close
                break
            first = close if first < 0 else first
        depth, pos = max(0, depth - 1), close + len(PARAMETER_END)
        close = text.find(PARAMETER_END, pos)
    end = end if end >= 0 else first
    if end >= 0:
        resume = end + len(PARAMETER_END)
    elif cut:
        return None, at
    else:
        ends = [k for k in (text.find("\n" + PARAMETER, at), text.find(FUNCTION_END, at)) if k >= 0]
        end = resume = min(ends, default=len(text))
    value = text[at:end]
    value = value[1:] if value.startswith("\n") else value
    return (value[:-1] if value.endswith("\n") else value), resume


STRINGS = ("string", "str", "text", "varchar", "char", "enum")  # vLLM's names of a string type


def _typed(value: str, schema):
    """A qwen3_coder parameter's value (text) as its JSON schema's type says, as vLLM's parser
    converts it; the text itself where the schema says no type or it does not convert."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    if kinds is None and isinstance(schema, dict) and isinstance(schema.get("anyOf"), list):
        kinds = [o.get("type") for o in schema["anyOf"] if isinstance(o, dict)]
    kinds = [k.strip().lower() for k in (kinds if isinstance(kinds, list) else [kinds]) if isinstance(k, str)]
    kind = next((k for k in kinds if k != "null"), "null" if kinds else "string")
    if value.lower() in ("null", "none") and ("null" in kinds or kind not in STRINGS):
        return None
    if kind in STRINGS:
        return value
    try:
        if kind.startswith(("int", "uint", "long", "short", "unsigned")):
            return int(value)
        if kind.startswith(("num", "float")):
            number = float(value)
            return value if not math.isfinite(number) else int(number) if number == int(number) else number
        if kind in ("boolean", "bool", "binary"):
            return {"true": True, "false": False}.get(value.strip().lower(), value)
        if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
            try:
                return _finite(json.loads(value), value)
            except (ValueError, RecursionError):
                pass
        return _finite(ast.literal_eval(value), value)  # (a Python literal, never evaluated beyond)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return value


def _finite(obj, value: str):
    """``obj`` where JSON can hold it (no NaN, no set or bytes), else the text ``value``."""
    try:
        json.dumps(obj, allow_nan=False)
        return obj
    except (ValueError, TypeError, RecursionError):
        return value


def _mistral(text: str) -> tuple[str, list] | None:
    at = text.find(TOOL_CALLS)
    if at < 0:
        return None
    parts, decoder = text[at + len(TOOL_CALLS):].split(TOOL_CALLS), json.JSONDecoder()
    body = parts[0].strip()
    if body.startswith(("[", "{")):  # ([TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]: tokenizers before v11)
        try:
            obj = decoder.raw_decode(body)[0] if len(parts) == 1 else None  # (text after the JSON dropped)
        except (ValueError, RecursionError):
            return None
        objs = obj if isinstance(obj, list) else [obj]
        calls = [_call(o, "arguments") for o in objs]
        return (text[:at], calls) if objs and None not in calls else None
    calls = []
    for part in parts:  # [TOOL_CALLS]NAME[ARGS]{...}: v11 and later, a call each
        brace = part.find("{")
        # (a [CALL_ID]ID after the name dropped: left out of the text, the id was glued to the name, w76g)
        name = part[:brace].split(CALL_ID)[0].replace(ARGS, "").strip() if brace >= 0 else ""
        try:
            args = decoder.raw_decode(part, brace)[0] if name and not any(c.isspace() for c in name) else None
        except (ValueError, RecursionError):
            return None
        args = _arguments(args) if isinstance(args, dict) else None
        if args is None:
            return None
        calls.append((name, args))
    return text[:at], calls


def _json(body: str):
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _arguments(args: dict) -> str | None:
    """A call's arguments as OpenAI sends them, a JSON string (unicode as it is); None where JSON
    cannot hold them (NaN, Infinity: Python's json reads them, and no client's JSON does)."""
    try:
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return None


def _call(obj, *keys: str) -> tuple[str, str] | None:
    """(name, arguments) of a parsed {"name", ``keys[0]`` (or another of ``keys``): {...}}
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
    args = _arguments(args) if isinstance(args, dict) else None
    return None if args is None else (obj["name"], args)


def message(content: str, finish: str, parser: str | None, parallel: bool = True, tools: list[dict] | None = None
            ) -> tuple[dict, str]:
    """A whole chat answer's message and finish_reason: with ``parser``, its tool calls
    parsed out ("tool_calls" where there are some and the answer ended; one cut by max_tokens
    gives its whole calls with "length"; the first alone where not ``parallel``, the request's
    parallel_tool_calls false, as vLLM drops the others); else the text as content."""
    parsed = parser is not None and finish in ("stop", "length")
    content_of, calls = parse(content, parser, tools, finish == "length") if parsed else (content, [])
    calls = calls if parallel else calls[:1]
    if not calls:
        return {"role": "assistant", "content": content}, finish
    return {"role": "assistant", "content": content_of, "tool_calls": calls}, \
        "tool_calls" if finish == "stop" else finish


class Streamed:
    """A streamed chat answer's choices through ``parser`` (None: text passes as it comes):
    ``push`` a choice's piece, get the content to send now; ``end`` with its finish_reason,
    get the deltas still to send and the finish_reason to send."""

    def __init__(self, parser: str | None, parallel: bool = True, tools: list[dict] | None = None):
        self.parser, self.parallel, self.tools = parser, parallel, tools  # (parallel, tools: message's)
        self.text: dict[int, str] = {}  # choice -> its answer so far
        self.sent: dict[int, int] = {}  # choice -> characters of it sent as content
        self.plain: set[int] = set()  # pythonic: choices known not to be calls (they start otherwise)

    def push(self, i: int, piece: str) -> str:
        if self.parser is None:
            return piece
        text = self.text[i] = self.text.get(i, "") + piece
        sent = self.sent.get(i, 0)
        if self.parser in HELD:  # up to a block's start, or text that could begin one
            tags = HELD[self.parser]
            at = min((k for k in (text.find(t, max(0, sent - len(t))) for t in tags) if k >= 0), default=-1)
            upto = at if at >= 0 else len(text) - tag_start_at_end(text, *tags)
        elif self.parser == "llama3_json":  # up to where a call may begin: {"name": (or the start of one), or the
            upto = _json_call_start(text, sent)  # answer's start ({, <|python_tag|>); blank text held before it
            upto = 0 if not text[:upto].strip() else upto
        else:  # all of it once it cannot be a call: it starts otherwise than [ (or <|python_start|>)
            head, starts = text.lstrip(), LEADING[self.parser]
            if i not in self.plain and (not head or head.startswith(starts) or any(t.startswith(head) for t in starts)):
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
        msg, finish = message(text, finish, None if i in self.plain else self.parser, self.parallel, self.tools)
        rest = (msg["content"] or "")[sent:]
        deltas = [{"content": rest}] if rest else []
        deltas += [{"tool_calls": [{"index": k, **call}]} for k, call in enumerate(msg.get("tool_calls", ()))]
        return deltas, finish


def _json_call_start(text: str, sent: int) -> int:
    """llama3_json: how much of ``text`` is before any call could begin (``sent`` of it sent):
    its start where it begins { or <|python_tag|> (after blanks), else the first {"name": or
    the { that may begin one at its end."""
    head = text.lstrip()
    if not head or head.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(head):
        return 0
    m = NAME_START.search(text, max(0, sent))
    if m:
        return m.start()
    brace = text.rfind("{", max(0, sent))  # ({ "na at the end: it may be one)
    if brace >= 0 and re.fullmatch(r'\{\s*("(n(a(m(e("\s*)?)?)?)?)?)?', text[brace:]):
        return brace
    return len(text)
