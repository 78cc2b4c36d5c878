"""Function calling for `specrt serve` (``--tool-call-parser``): a chat request's ``tools``
checked, and the tool calls a model writes in its answer parsed out of the text into
OpenAI's ``tool_calls``, as vLLM's parsers of the same names read them.

    hermes       <tool_call>{"name": ..., "arguments" (or "parameters"): {...}}</tool_call>
                 blocks (Qwen2.5, Qwen3, Hermes): the text before the first block is the
                 content (null when empty), the text after the last one is dropped; a last
                 block cut before its </tool_call> counts where its JSON is whole; a block
                 ends at the first </tool_call> after which its JSON is whole (one inside a
                 string is text; vLLM's regex ends it at the first, and the answer is all
                 content)
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
                 literal; a string that holds one, "{'k': 1}", read again, as vLLM's), "null"
                 null where the type is not a string or the schema admits null, a parameter the
                 schema does not name a string; a </parameter> ends a value only where the next
                 parameter, </function> or </tool_call> follows it and it closes no <parameter=
                 opened at the value's start or a line's (one in the value, code quoting the
                 format, is text; ``_value_end``); the text before the first block is the content
    mistral      [TOOL_CALLS] followed by a JSON array of {"name", "arguments"} (Mistral 7B v0.3,
                 Nemo, Small 3.1), or the newer [TOOL_CALLS]NAME[ARGS]{...} a call (tokenizer v11+:
                 Mistral Small 3.2, Magistral, Devstral; a [CALL_ID]ID after the name dropped);
                 the text before the first is the content; call ids of 9 letters and digits, as
                 Mistral's chat templates and mistral_common refuse any other when the calls come
                 back in the conversation. [TOOL_CALLS], [ARGS] and [CALL_ID] are special tokens,
                 which an answer's text leaves out: with this parser the answers to requests with
                 tools keep those three (Text.keep_special), as vLLM decodes special tokens for it
                 there (every other text, /detokenize's, echo's, an answer to a request without
                 tools, leaves them out)

A call that is malformed (bad JSON or Python, no name, arguments not an object, a call object's
own key twice: which name is meant is unclear, and streamed the first went) leaves the whole
answer as content: a client gets text, never a 500. An arguments' key (or a qwen3_coder
parameter) given twice stays twice in the arguments string, as written, which a client's JSON
reader (json.loads, JSON.parse) reads as the last value, as vLLM's (json.loads, then dumps
again: the key once, at its first place) gives it: so the pieces streamed before the second
join into the same string. An answer cut by max_tokens gives
its calls where each is whole (its JSON or Python list complete; qwen3_coder's values closed by
their </parameter>), with finish_reason "length" (vLLM gives the calls with "tool_calls", which hides the cut: an
agent then runs a call whose answer was cut after it); else it stays content. Streaming
(``Streamed``) sends text as it comes until a call may begin, then each call as vLLM does: its
header (index, id, type, name) once the name is whole, its arguments in pieces as they are read,
which join into the whole answer's arguments string exactly.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import re
import secrets
import string
import uuid

from specrt.errors import UserError
from specrt.runtime.text import tag_start_at_end

NO_PARAMETERS = {"type": "object", "properties": {}}  # a tool's that gives none (OpenAI's: it takes none)

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
BLANK = re.compile(r"\s*")
JSON_BLANK = re.compile(r"[ \t\n\r]*")  # (JSON's whitespace alone)


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
        empty = NO_PARAMETERS
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
    For mistral it makes a view of ``text`` that keeps [TOOL_CALLS], [ARGS] and [CALL_ID]
    (Text.keep_special: the answers to requests with tools decode through it)."""
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
            call = _call(_json(text[at + len(START):end if end >= 0 else len(text)]), "arguments", "parameters")
            # ("parameters" as llama3_json's: the call f with {} had dropped them unsaid, m76h-T7)
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
    calls, decoder = [], DECODER
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
            args = _arguments(_Pairs([(k.arg, _literal(k.value)) for k in node.keywords]))  # (a keyword twice: both)
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
    pairs, at = [], close + 1
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
        pairs.append((key, _typed(value, props.get(key))))  # (a parameter twice: both kept, _Pairs)
    args = _arguments(_Pairs(pairs))
    return None if args is None else (name, args, at)


def _value(text: str, at: int, cut: bool) -> tuple[str | None, int]:
    """A parameter's value starting at ``at`` and where the text after it resumes: it ends at
    ``_value_end``'s </parameter>; without one (not in a cut answer), at the next parameter,
    </function> or the end."""
    end = _value_end(text, at)
    if end is not None:
        resume = end + len(PARAMETER_END)
    elif cut:
        return None, at
    else:
        ends = [k for k in (text.find("\n" + PARAMETER, at), text.find(FUNCTION_END, at)) if k >= 0]
        end = resume = min(ends, default=len(text))
    value = text[at:end]
    value = value[1:] if value.startswith("\n") else value
    return (value[:-1] if value.endswith("\n") else value), resume


def _value_end(text: str, at: int, sent: int = 0, whole: bool = True) -> int | None:
    """qwen3_coder: where the value starting at ``at`` ends, the one scanner of a whole answer
    (``_value``) and a streamed one (``whole`` False: ``Streamed._read_xml``), so that both end
    a value at the same </parameter>: the first followed by the next parameter, </function>,
    </tool_call> (or, ``whole``, the text's end) that closes no <parameter= opened in the value
    at its start or a line's (a call quoted in it, as vLLM's counts them; a file the call
    writes that quotes a call: its </parameter> is text, w76g); where they do not pair up, the
    first that may end it (``whole``: streamed, None until the end); None where there is none
    (streamed: or what follows it is yet to come). ``sent``: the value's first characters
    streamed (``_string_known``: no tag begins there)."""
    depth, pos, first, tags = int(text.startswith(PARAMETER, at)), at + sent, None, (PARAMETER, FUNCTION_END, END)
    close = text.find(PARAMETER_END, pos)
    while close >= 0:
        opened = text.find("\n" + PARAMETER, pos, close)
        if opened >= 0:
            depth, pos = depth + 1, opened + 1 + len(PARAMETER)
            continue
        after = _blank_end(text, close + len(PARAMETER_END))
        if text.startswith(tags, after) or whole and after == len(text):
            if not depth:
                return close
            first = close if first is None else first
        elif not whole and len(text) - after < len(END) and any(t.startswith(text[after:]) for t in tags):
            return None  # (what follows is yet to come)
        depth, pos = max(0, depth - 1), close + len(PARAMETER_END)
        close = text.find(PARAMETER_END, pos)
    return first if whole else None


STRINGS = ("string", "str", "text", "varchar", "char", "enum")  # vLLM's names of a string type


def _kinds(schema) -> tuple[str, list[str]]:
    """A qwen3_coder parameter's JSON schema's type (the first not null; "string" where it says
    none) and all of its types."""
    kinds = schema.get("type") if isinstance(schema, dict) else None
    if kinds is None and isinstance(schema, dict) and isinstance(schema.get("anyOf"), list):
        kinds = [o.get("type") for o in schema["anyOf"] if isinstance(o, dict)]
    kinds = [k.strip().lower() for k in (kinds if isinstance(kinds, list) else [kinds]) if isinstance(k, str)]
    return next((k for k in kinds if k != "null"), "null" if kinds else "string"), kinds


def _typed(value: str, schema):
    """A qwen3_coder parameter's value (text) as its JSON schema's type says, as vLLM's parser
    converts it; the text itself where the schema says no type or it does not convert."""
    kind, kinds = _kinds(schema)
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
            return _finite(_container(value), value)
        return _finite(ast.literal_eval(value), value)  # (a Python literal, never evaluated beyond)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return value


def _container(value: str, quoted: bool = True):
    """An object or array parameter's value: JSON, else a Python literal; where that is a string
    (``quoted``), the object or array it holds, read so: a model trained on a template that
    wrote json.dumps(str(d)) writes "{'k': 'v'}" (vLLM's reads that string again, with
    ``ast.literal_eval`` alone and whatever it holds; here JSON too, and only an object or array:
    "5" stays a string)."""
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        obj = ast.literal_eval(value)
    if quoted and isinstance(obj, str):
        try:
            inner = _container(obj, False)
            return inner if isinstance(inner, (dict, list)) else obj
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            pass
    return obj


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
    parts, decoder = text[at + len(TOOL_CALLS):].split(TOOL_CALLS), DECODER
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


class _Pairs(dict):
    """A JSON object read (``DECODER``) or a qwen3_coder call's parameters: its members by key,
    the last where a key comes twice (json.loads's), and written by json.dumps as they came
    (``items``: its members in order, a key twice written twice, so that the arguments string
    of a whole answer is what the streamed pieces join into, ``_Reader``'s; json's encoder
    writes a dict that is not exactly a dict through its ``items``)."""

    def __init__(self, pairs: list):
        super().__init__(pairs)
        self.pairs = pairs

    def items(self):
        return self.pairs

    def twice(self) -> bool:
        return len(self.pairs) > len(self)


DECODER = json.JSONDecoder(object_pairs_hook=_Pairs)


def _json(body: str):
    try:
        return DECODER.decode(body)
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
    if isinstance(obj, _Pairs) and obj.twice():  # (the call's own key twice: "name" twice, which is meant?)
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


class _Answer:
    """A streamed choice's state (Streamed's)."""

    def __init__(self):
        self.text, self.sent = "", 0  # the answer so far; its characters sent as content
        # text (content, until a call may begin) | call | close | after (between calls) | name (mistral's) | param
        # (qwen3_coder's) | held (nothing more sent before the end); where the calls' reading resumes
        self.phase, self.at = "text", 0
        self.reader: _Reader | None = None  # the JSON being read (hermes, llama3_json, mistral)
        self.calls: list[list] = []  # the calls whose headers went: [id, name, arguments sent (their pieces, none
        # empty: a string grown a piece at a time would be copied whole each piece), reader, its call, piece]
        self.name: str | None = None  # mistral's [TOOL_CALLS]NAME[ARGS]: the name before the arguments
        self.partial = 0  # qwen3_coder: the characters of a string value sent before its end
        # pythonic: the value being read (its keyword, where it starts, where its scan resumes, the brackets and
        # the string open there, how much of the string its characters went to, the JSON of it sent)
        self.value: list = [None, 0, 0, [], None, 0, ""]
        self.view: tuple[int, str] | None = None  # llama4_pythonic's text read (_py_view): how much, as read


class Streamed:
    """A streamed chat answer's choices through ``parser`` (None: text passes as it comes):
    ``push`` a choice's piece, get the delta to send now (its content, its calls' headers and
    arguments' pieces; {}: nothing yet); ``end`` with its finish_reason, get the deltas still
    to send and the finish_reason to send. A call's header (index, id, type, name, arguments
    "") goes as soon as its name is whole, then its arguments as they are read, so that they
    join into the whole answer's arguments string (``message``; vLLM's sent the model's text,
    spaced as written, and its hermes parser's partial-JSON diffs went wrong: issues 9693,
    10395): hermes', llama3_json's and mistral's JSON through ``_Reader``, qwen3_coder's a
    parameter at a time (a string's characters as they come, other values once closed and
    typed), pythonic's a keyword argument at a time (``_read_py``). A
    call found malformed after its header went (or cut by max_tokens before its end) stops
    there: the rest of the answer comes as content at the end, which then equals the whole
    answer's, and finish_reason is stop (or length), not tool_calls; what was sent of the
    call stays with the client (vLLM's goes on, and ends with tool_calls)."""

    def __init__(self, parser: str | None, parallel: bool = True, tools: list[dict] | None = None):
        self.parser, self.parallel, self.tools = parser, parallel, tools  # (parallel, tools: message's)
        self.answers: dict[int, _Answer] = {}
        self.plain: set[int] = set()  # pythonic: choices known not to be calls (they start otherwise)
        self.keys = ("parameters", "arguments") if parser in ("llama3_json", "hermes") else ("arguments",)
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools or ()}

    def push(self, i: int, piece: str) -> dict:
        if self.parser is None:
            return {"content": piece} if piece else {}
        a = self.answers.get(i) or self.answers.setdefault(i, _Answer())  # (none made a piece: h78d)
        text = a.text = a.text + piece
        sent = a.sent
        if a.phase != "text":
            upto = sent
        elif self.parser in HELD:  # up to a block's start, or text that could begin one
            tags = HELD[self.parser]
            at = min((k for k in (text.find(t, max(0, sent - len(t))) for t in tags) if k >= 0), default=-1)
            upto = at if at >= 0 else len(text) - tag_start_at_end(text, *tags)
            if at >= 0:
                a.phase, a.at = "after", at
        elif self.parser == "llama3_json":  # up to where a call may begin: {"name": (or the start of one), or the
            upto = _json_call_start(text, sent)  # answer's start ({, <|python_tag|>); blank text held before it
            head = text.lstrip()
            if head.startswith(("{", PYTHON_TAG)):
                a.phase, a.at = "call", len(text) - len(head) + (len(PYTHON_TAG) if head[0] == "<" else 0)
            elif upto < len(text) and NAME_START.match(text, upto):
                a.phase, a.at = "call", upto
            upto = 0 if not text[:upto].strip() else upto
        else:  # all of it once it cannot be a call: it starts otherwise than [ (or <|python_start|>)
            head, starts = text.lstrip(), LEADING[self.parser]
            if i not in self.plain and (not head or head.startswith(starts) or any(t.startswith(head) for t in starts)):
                upto = 0
                view = _py_view(a, self.parser) if a.phase == "text" else ""
                if view.startswith("[", _blank_end(view, 0)):
                    a.phase, a.at = "call", _blank_end(view, 0) + 1  # (past the list's [)
            else:
                self.plain.add(i)
                upto = len(text)
        a.sent = max(sent, upto)
        delta = {"content": text[sent:a.sent]} if a.sent > sent else {}
        calls = self._read(a) if a.phase not in ("text", "held") else []
        return {**delta, "tool_calls": calls} if calls else delta

    def _read(self, a: _Answer) -> list[dict]:
        """Choice ``a``'s calls read on from where it stopped: the tool_calls items to send."""
        if self.parser == "qwen3_coder":
            return self._read_xml(a)
        if self.parser in LEADING:
            return self._read_py(a)
        text, items, tag = a.text, [], TOOL_CALLS if self.parser == "mistral" else START
        while a.phase != "held":
            if a.phase == "after":  # before a call (the text between calls dropped)
                at = text.find(tag, a.at)
                if at < 0:
                    a.at = max(a.at, len(text) - len(tag) + 1)
                    return items
                if a.calls and not self.parallel:
                    a.phase = "held"  # (the first call alone: the others are never sent)
                    return items
                a.phase, a.at, a.reader = "call", at, None
            if a.phase == "call" and a.reader is None and not self._begin(a):
                return items
            if a.phase == "call":
                a.at = a.reader.feed(text, a.at)
                items += self._sent(a)
                if a.reader.bad or a.reader.done and sum(c[3] is a.reader for c in a.calls) < len(a.reader.calls):
                    a.phase = "held"  # (malformed; or a call whose header never went: the calls after it come whole)
                if a.phase == "held" or not a.reader.done:
                    return items
                a.phase = "close"
            at = (JSON_BLANK if self.parser == "hermes" else BLANK).match(text, a.at).end()  # (what follows a JSON)
            if self.parser == "hermes" and text.startswith(END, at):
                a.phase, a.at = "after", at + len(END)
            elif self.parser == "llama3_json" and text.startswith(";", at):
                a.phase, a.at, a.reader = "call", at + 1, None
            elif self.parser == "mistral":  # (text after the JSON dropped; [TOOL_CALLS]NAME[ARGS]: the next call's)
                a.phase = "after" if a.reader.bare else "held"
            elif at == len(text) or self.parser == "hermes" and END.startswith(text[at:]):
                return items  # (what follows is yet to come)
            else:
                a.phase = "held"
        return items

    def _begin(self, a: _Answer) -> bool:
        """A call's JSON begins at ``a.at`` (hermes': <tool_call> there): its reader made, or False
        where more text must come first."""
        text = a.text
        if self.parser == "hermes":
            a.reader, a.at = _Reader(), a.at + len(START)
        elif self.parser == "llama3_json":
            a.reader = _Reader()
        else:  # mistral: [TOOL_CALLS] then [...] or {...}, or NAME[ARGS]{...}
            at = _blank_end(text, a.at + len(TOOL_CALLS))
            if at == len(text):
                return False
            if text[at] in "[{":
                a.reader, a.at = _Reader(base=int(text[at] == "[")), at
                return True
            brace, nxt = text.find("{", at), text.find(TOOL_CALLS, at)
            if brace < 0 or 0 <= nxt < brace:
                a.phase = "held" if nxt >= 0 else a.phase
                return False
            a.name = text[at:brace].split(CALL_ID)[0].replace(ARGS, "").strip()
            if not a.name or any(c.isspace() for c in a.name):
                a.phase = "held"
                return False
            a.reader, a.at = _Reader(bare=True), brace
        return True

    def _sent(self, a: _Answer) -> list[dict]:
        """The tool_calls items of ``a.reader``'s calls not yet sent: headers where a name is
        whole (llama3_json's with its arguments begun too), their arguments written since."""
        r, items = a.reader, []
        for k in range(sum(c[3] is r for c in a.calls), len(r.calls)):
            name = a.name if r.bare else r.name(k)
            if name is None or (a.calls and not self.parallel) or (self.parser == "llama3_json" and not r.done
                                                                  and not any(key in r.calls[k] for key in self.keys)):
                break
            if any(c[3] is not None and not c[3].streams(c[4], self.keys) for c in a.calls):
                break  # (a call before it whose arguments come at the end, {} where none or a JSON string: this one too)
            # the calls before it: their arguments ahead of its header (OpenAI's SDK takes an index's change as
            # the last call's end, its arguments.done: w78l)
            self._pieces(a, items)
            a.calls.append([(_mistral_id if self.parser == "mistral" else _call_id)(), name, [], r, k, 0])
            items.append({"index": len(a.calls) - 1, "id": a.calls[-1][0], "type": "function",
                          "function": {"name": name, "arguments": ""}})
        self._pieces(a, items)
        return items

    def _pieces(self, a: _Answer, items: list) -> None:
        """The arguments of ``a.reader``'s calls written since, joined to ``items``."""
        for index, c in enumerate(a.calls):
            if c[3] is a.reader:
                piece, c[5] = a.reader.arguments(c[4], self.keys, c[5])
                if piece:
                    c[2].append(piece)
                    if items and items[-1]["index"] == index:
                        items[-1]["function"]["arguments"] += piece
                    else:
                        items.append({"index": index, "function": {"arguments": piece}})

    def _read_xml(self, a: _Answer) -> list[dict]:
        """qwen3_coder's calls read on from ``a.at``: a header once <function=NAME> is whole, then
        a parameter at a time once its value is closed (typed by its schema; a string's
        characters as they come: ``_string_known``), } at </function>."""
        text, items = a.text, []
        while True:
            if a.phase == "after":  # (the first call's <function= after the first <tool_call>: one before it is text)
                if not a.calls:
                    a.at = max(a.at, text.find(START, a.at))
                    if not text.startswith(START, a.at):
                        return items  # (a <function= without <tool_call>: its call whole at the end)
                at = text.find(FUNCTION, a.at)
                if at < 0:
                    a.at = max(a.at, len(text) - len(FUNCTION) + 1) if a.calls else a.at
                    return items
                if a.calls and not self.parallel:
                    a.phase = "held"
                    return items
                a.phase, a.at = "call", at
            if a.phase == "call":
                close = text.find(">", a.at)
                if close < 0:
                    return items
                name = text[a.at + len(FUNCTION):close]
                if not name or any(c in name for c in "{}<>\"' \t\r\n"):
                    a.phase = "held"
                    return items
                _header(a, items, name)
                a.phase, a.at = "param", close + 1
            at, call = _blank_end(text, a.at), a.calls[-1]
            if text.startswith(FUNCTION_END, at):
                piece = "}" if call[2] else "{}"
                a.phase, a.at = "after", at + len(FUNCTION_END)
            elif text.startswith(PARAMETER, at):
                close = text.find(">", at)
                key = text[at + len(PARAMETER):close] if close >= 0 else ""
                if close >= 0 and (not key or "<" in key):
                    a.phase = "held"
                if close < 0 or a.phase == "held":
                    return items
                end = _value_end(text, close + 1, a.partial, False)
                schema = self.schemas.get(call[1])
                props = schema.get("properties") if isinstance(schema, dict) else None
                schema = (props if isinstance(props, dict) else {}).get(key)
                head = ("{" if not call[2] else ", ") + json.dumps(key, ensure_ascii=False) + ': "'
                if end is None:  # (a string's characters as they come: _string_known)
                    known = _string_known(text, close + 1, schema, a.partial)
                    if not known:
                        return items
                    piece = ("" if a.partial else head) + json.dumps(known, ensure_ascii=False)[1:-1]
                    a.partial += len(known)
                else:
                    value = text[close + 1:end]
                    value = value[1:] if value.startswith("\n") else value
                    typed = _typed(value[:-1] if value.endswith("\n") else value, schema)
                    try:  # (a string begun: the rest of its characters and its closing quote)
                        piece = json.dumps(typed[a.partial:], ensure_ascii=False)[1:] if a.partial else \
                            head[:-1] + json.dumps(typed, ensure_ascii=False, allow_nan=False)
                    except (ValueError, TypeError, RecursionError):
                        a.phase = "held"
                        return items
                    a.at, a.partial = end + len(PARAMETER_END), 0
            else:
                if not any(t.startswith(text[at:]) for t in (FUNCTION_END, PARAMETER)):
                    a.phase = "held"
                return items
            _piece(a, items, piece)

    def _read_py(self, a: _Answer) -> list[dict]:
        """pythonic's calls read on from ``a.at`` (in ``_py_view``): a header once NAME( is read,
        then a keyword argument at a time once its value is closed (read as ``_pythonic`` reads
        it, ``_literal``; a string's characters as they come: ``_py_value``), } at its ). What
        the usual form leaves out (a comment, a name not ASCII, a dotted name spaced ...) holds
        the rest to the end, which then sends it (``end``)."""
        text, items = _py_view(a, self.parser), []
        while True:
            at = _blank_end(text, a.at)
            if at == len(text) and a.phase != "value":
                return items
            piece, call = "", a.calls[-1] if a.calls else None
            if a.phase in ("call", "after") and text[at] == "]":
                a.phase = "held"  # (the list's end: what follows is checked at the end)
            elif a.phase == "after":
                a.phase, a.at = ("call", at + 1) if text[at] == "," else ("held", at)
                continue
            elif a.phase == "call":  # a call's NAME(
                m = PY_NAME.match(text, at)
                after = _blank_end(text, m.end()) if m else at
                if m and (after == len(text) or text[m.end():] == "."):
                    return items
                name = m.group() if m and text[after] == "(" else None
                if name is None or any(keyword.iskeyword(w) for w in name.split(".")) or (a.calls and not self.parallel):
                    a.phase = "held"
                    return items
                _header(a, items, name)
                a.phase, a.at = "param", after + 1
                continue
            elif a.phase == "param" and text[at] == ")":
                piece, a.phase, a.at = "}" if call[2] else "{}", "after", at + 1
            elif a.phase == "param":  # a keyword=
                m = PY_KEYWORD.match(text, at)
                if not m and re.fullmatch(r"[A-Za-z_]\w*\s*", text[at:], re.ASCII):
                    return items
                if not m or keyword.iskeyword(m.group(1)):
                    a.phase = "held"
                    return items
                a.phase, a.value = "value", [m.group(1), m.end(), m.end(), [], None, 0, ""]
                continue
            else:  # the value, as it comes (_py_value)
                found, end = _py_value(text, a.value)
                if end == -1:
                    a.phase = "held"
                    return items
                if found:  # (the keyword's head with the value's first piece)
                    piece = (("{" if not call[2] else ", ") + json.dumps(a.value[0], ensure_ascii=False) + ": "
                             if len(a.value[6]) == len(found) else "") + found
                if end is not None:
                    a.phase, a.at = ("param", end + 1) if text[end] == "," else ("after", end + 1)
                    piece += "}" if text[end] == ")" else ""
                elif not piece:
                    return items
                else:  # (the value still open: the text is read to its end, no second scan of it; h78d)
                    _piece(a, items, piece)
                    return items
            if not piece:
                return items
            _piece(a, items, piece)

    def _message(self, i: int, text: str, finish: str) -> tuple[dict, str]:
        """The whole answer's message and finish_reason, which the pieces sent join into."""
        return message(text, finish, None if i in self.plain else self.parser, self.parallel, self.tools)

    def end(self, i: int, finish: str) -> tuple[list[dict], str]:
        if self.parser is None:
            return [], finish
        a = self.answers.get(i) or _Answer()
        text, sent = a.text, a.sent
        msg, final = self._message(i, text, finish)
        calls = msg.get("tool_calls", [])
        if len(a.calls) > len(calls) or any(c[1] != f["function"]["name"] or not f["function"]["arguments"].startswith(
                "".join(c[2])) for c, f in zip(a.calls, calls)):  # (a call sent turned out malformed, or cut)
            return ([{"content": text[sent:]}] if text[sent:] else []), finish
        rest = (msg["content"] or "")[sent:]
        deltas = [{"content": rest}] if rest else []
        for k, call in enumerate(calls):
            if k >= len(a.calls):
                deltas.append({"tool_calls": [{"index": k, **call}]})
            elif len(call["function"]["arguments"]) > (n := sum(map(len, a.calls[k][2]))):
                deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call["function"]["arguments"][n:]}}]})
        return deltas, final


def _header(a: _Answer, items: list, name: str) -> None:
    """qwen3_coder, pythonic, a named forced call: a call's header sent (its id made), named ``name``."""
    a.calls.append([_call_id(), name, [], None, 0, 0])
    items.append({"index": len(a.calls) - 1, "id": a.calls[-1][0], "type": "function",
                  "function": {"name": name, "arguments": ""}})


def _piece(a: _Answer, items: list, piece: str) -> None:
    """qwen3_coder, pythonic: ``piece`` of the last call's arguments sent (joined to its item)."""
    if piece:
        a.calls[-1][2].append(piece)
    if items and items[-1]["index"] == len(a.calls) - 1:
        items[-1]["function"]["arguments"] += piece
    else:
        items.append({"index": len(a.calls) - 1, "function": {"arguments": piece}})


def _blank_end(text: str, at: int) -> int:
    return BLANK.match(text, at).end()


def _string_known(text: str, at: int, schema, sent: int) -> str | None:
    """qwen3_coder: the characters of the value starting at ``at`` known to be its first, past
    the ``sent`` of them (its schema a string's: ``_typed`` keeps the text; the text before any
    </parameter>, <parameter= on a new line or </function>, less a last character that may be
    the newline dropped before its end, and less what may be "null"), or None where its type is
    no string."""
    kind, kinds = _kinds(schema)
    if kind not in STRINGS or at == len(text):
        return None
    start = at + (text[at] == "\n")
    since = at + sent  # (no tag begins in what was sent)
    ends = [k for k in (text.find(PARAMETER_END, since), text.find("\n" + PARAMETER, since),
                        text.find(FUNCTION_END, since)) if k >= 0]
    end = min(ends) if ends else len(text) - tag_start_at_end(text[-len(END):], PARAMETER_END, "\n" + PARAMETER,
                                                              FUNCTION_END)
    if "null" in kinds and end - 1 - start < 5 and any(w.startswith(text[start:end - 1].lower()) for w in ("null", "none")):
        return None  # (the value "null" is null where the schema admits it)
    return text[start + sent:end - 1]


PY_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", re.ASCII)  # pythonic, streamed: a call's name (others wait)
PY_KEYWORD = re.compile(r"([A-Za-z_]\w*)\s*=", re.ASCII)  # and a keyword=


def _py_view(a, parser: str) -> str:
    """pythonic, streamed: the text ``_pythonic`` reads of answer ``a`` (an _Answer), as far as it
    is known: the answer itself; llama4_pythonic's after <|python_start|>, its <|python_end|>s
    dropped (a last one's start held back), made as the answer grows (``a.view``)."""
    head = _blank_end(a.text, 0)
    if parser != "llama4_pythonic" or not a.text.startswith(PYTHON_START, head):
        return a.text
    if not a.view:
        a.view = (head + len(PYTHON_START), "")
    raw, view = a.view
    chunk = a.text[raw:]
    if "<" in chunk:  # (a tag's start held back: without a <, none; h78d)
        chunk = chunk[:len(chunk) - tag_start_at_end(chunk, PYTHON_END)]  # (a tag is never cut in two: replace's as
    a.view = (raw + len(chunk), view + chunk.replace(PYTHON_END, ""))  # the whole text's)
    return a.view[1]


def _py_value(text: str, v: list) -> tuple[str, int | None]:
    r"""pythonic, streamed: the JSON of a keyword's value newly known (``v``: Streamed._read_py's
    ``a.value``, updated) and where the value ends (its , or the call's ), outside brackets and
    strings), None while it is open, -1 where it is no literal or not what was sent of it. A
    value that opens with a string on one line sends its characters as they come (a whole
    escape at a time: ``_escape_end``; the closing quote with the value's end: "a" "b" is one
    string); any other once whole, read as ``_pythonic`` reads it (``_literal``). Comments and
    \ line ends outside strings give -1 (the rest then goes at the end)."""
    n, sent = len(text), len(v[6])
    if v[2] == v[1]:  # (the value's first character, after blanks)
        v[1] = v[2] = _blank_end(text, v[1])
        if n - v[1] < 2:
            return "", None
        if text[v[1]] in "\"'" and text[v[1] + 1] != text[v[1]]:  # (a string, not "" nor """)
            v[2] = v[5] = v[1] + 1
            v[4] = (text[v[1]], False)
    at, stack, quote, end, closed = v[2], v[3], v[4], None, None
    while at < n and end is None:
        c = text[at]
        if quote:
            q = quote[0] * (3 if quote[1] else 1)
            if c == "\\" and at + 1 == n or quote[1] and n - at < 3 and q.startswith(text[at:]):
                break  # (an escape, or a closing triple quote, cut)
            if c == "\n" and not quote[1]:
                return "", -1
            if text.startswith(q, at):
                closed = at if v[5] > 0 and closed is None else closed
                at, quote = at + len(q), None
            else:
                at += 2 if c == "\\" else 1
            continue
        if c in "\"'":
            if n - at < 3 and text[at:] == c * (n - at):
                break  # ("" at the end: a triple quote may begin)
            quote = (c, text.startswith(c * 3, at))
            at += 3 if quote[1] else 1
        elif c in "([{":
            stack.append(c)
            at += 1
        elif c in ")]}" and stack:
            if stack.pop() != "([{"[")]}".index(c)]:
                return "", -1
            at += 1
        elif c == ")" or c == "," and not stack:
            end = at
        elif c in ")]}#\\":
            return "", -1
        else:
            at += 1
    v[2], v[4] = at, quote
    if v[5] > 0:  # the string's characters known
        raw = text[v[5]:closed if closed is not None else at]
        k = _escape_end(raw)
        try:
            # (ASCII without a CR: the decoder of Python's literals; a \ before a CR is a line's end there, r78g)
            chars = raw[:k] if "\\" not in raw[:k] else raw[:k].encode().decode("unicode_escape") \
                if raw[:k].isascii() and "\r" not in raw[:k] else ast.literal_eval(text[v[1]] + raw[:k] + text[v[1]])
        except (SyntaxError, ValueError, MemoryError):
            return "", -1
        v[6] += ("" if v[6] else '"') + json.dumps(chars, ensure_ascii=False)[1:-1]
        v[5] = -1 if closed is not None else v[5] + k
    if end is not None:
        try:
            if not text[v[1]:end].strip():
                raise ValueError("no value")
            full = json.dumps(_literal(ast.parse("(" + text[v[1]:end] + "\n)", mode="eval").body),
                              ensure_ascii=False, allow_nan=False)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return "", -1
        if not full.startswith(v[6]):
            return "", -1
        v[6] = full
    return v[6][sent:], end


def _escape_end(raw: str) -> int:
    r"""How much of a Python string's body ``raw`` ends at a whole escape: all of it, or up to
    its last escape, still cut (\x4, \u00e, \N{LATI, an octal \1 more digits may follow)."""
    at = raw.find("\\")
    while at >= 0:
        c = raw[at + 1:at + 2]
        if c and c in "xuU":
            need = {"x": 4, "u": 6, "U": 10}[c]
        elif c == "N":
            need = raw.find("}", at) + 1 - at if "}" in raw[at:] else len(raw) + 1 - at
        elif c and c in "01234567":
            digits = len(re.match("[0-7]{0,3}", raw[at + 1:at + 4]).group())
            need = 1 + digits if digits == 3 or at + 1 + digits < len(raw) else len(raw) + 1 - at
        else:
            need = 2
        if at + need > len(raw):
            return at
        at = raw.find("\\", at + need)
    return len(raw)


PLAIN = re.compile(r'[^"\\\x00-\x1f]+')  # a JSON string's characters that stand for themselves
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _Reader:
    """One JSON value read as its text comes (``feed``), written as it is known the way
    ``json.dumps(json.loads(text), ensure_ascii=False)`` writes it (``out``: its pieces), so
    that what is written of a call's arguments is a prefix of the arguments string the whole
    answer gives (``_arguments``): numbers and true/false/null once whole, a string's
    characters as they come (an escape once whole, a surrogate pair's half held), a member's
    key once whole (a key twice written twice, ``_Pairs``; in a call object malformed:
    ``_call``). ``base``: the calls
    are the value itself (0) or an array's items (1, mistral's); ``bare``: the value is one
    call's arguments (mistral's [ARGS]{...}). ``bad``: the text can be no JSON."""

    def __init__(self, base: int = 0, bare: bool = False):
        self.base, self.bare, self.out, self.stack, self.keys = base, bare, [], [], []
        self.state, self.token, self.key, self.high = "value", "", None, None
        self.bad = self.done = False
        # the calls read: their members (key -> [first piece, piece after it or None, its first character])
        self.calls: list[dict] = [{"arguments": [0, None, "{"]}] if bare else []
        self.member: str | None = None  # the call's member whose value is being read

    def feed(self, text: str, at: int = 0) -> int:
        """Read ``text[at:]`` up to the value's end; where it stopped."""
        n = len(text)
        while at < n and not (self.bad or self.done):
            c, state = text[at], self.state
            if state == "string":
                m = PLAIN.match(text, at)
                if m:
                    self._chars(m.group())
                    at = m.end()
                elif c == '"':
                    self._string_end()
                    at += 1
                elif c == "\\":
                    self.state, self.token = "escape", ""
                    at += 1
                else:  # (a control character: JSON's strings escape them, Python's json refuses them)
                    self.bad = True
                continue
            if state == "escape":
                self.token += c
                at += 1
                if self.token[0] in ESCAPES:
                    self._char(ESCAPES[self.token[0]])
                elif self.token[0] != "u" or (len(self.token) > 1 and c not in string.hexdigits):
                    self.bad = True
                elif len(self.token) == 5:
                    self._char(chr(int(self.token[1:], 16)))
                continue
            if state in ("number", "literal"):
                if c in ("0123456789+-.eE" if state == "number" else string.ascii_letters):
                    self.token += c
                    at += 1
                    if state == "literal" and self.token in JSON_NAMES:
                        self._put(self.token)
                        self._after()
                    elif state == "literal" and not any(w.startswith(self.token) for w in JSON_NAMES):
                        self.bad = True
                    continue
                if state == "literal":
                    self.bad = True
                    continue
                self._number()
                continue
            if c in " \t\r\n":
                at += 1
                continue
            at += 1
            if state in ("value", "item"):
                if state == "item" and c == "]":
                    self._close("]")
                else:
                    self._value(c)
            elif state in ("key", "first key"):
                if c == '"':
                    self.state, self.key = "string", ""
                elif state == "first key" and c == "}":
                    self._close("}")
                else:
                    self.bad = True
            elif state == "colon":
                self.bad = c != ":"
                self._put(": ")
                self.state = "value"
            elif state == "next" and c == ",":
                self._put(", ")
                self.state = "key" if self.stack[-1] == "{" else "value"
            elif state == "next" and c == "}]"[self.stack[-1] == "["]:
                self._close(c)
            else:
                self.bad = True
        return at

    def _value(self, c: str) -> None:
        depth = len(self.stack)
        if self.bare:
            pass
        elif depth == self.base and c == "{":
            self.calls.append({})  # (a call object starts)
        elif depth == self.base + 1 and self.stack[-1] == "{" and self.calls:  # (a call's member's value)
            self.calls[-1][self.member] = [len(self.out), None, c]
        if c in "{[":
            self.stack.append(c)
            self.keys.append(set()) if c == "{" else None
            self._put(c)
            self.state = "first key" if c == "{" else "item"
        elif c == '"':
            self._put('"')
            self.state = "string"
        elif c == "-" or c.isdigit():
            self.state, self.token = "number", c
        elif c in "tfn":
            self.state, self.token = "literal", c
        else:  # (NaN, Infinity: Python's json reads them, and no call's arguments hold them)
            self.bad = True

    def _close(self, c: str) -> None:
        if self.stack.pop() == "{":
            self.keys.pop()
        self._put(c)
        self._after()

    def _after(self) -> None:
        """A value ended."""
        depth = len(self.stack)
        if not self.bare and depth == self.base + 1 and self.stack[-1] == "{" and self.member in self.calls[-1]:
            self.calls[-1][self.member][1] = len(self.out)
        if not depth:
            self.done = True
            if self.bare:  # (the arguments are the value)
                self.calls[0]["arguments"][1] = len(self.out)
        self.state = "next"

    def _number(self) -> None:
        try:
            number = json.loads(self.token) if NUMBER.fullmatch(self.token) else None
        except ValueError:  # (an integer past Python's digits limit)
            number = None
        if number is None or not math.isfinite(number):
            self.bad = True
            return
        self._put(json.dumps(number))
        self._after()

    def _char(self, ch: str) -> None:
        """An escape's character: a surrogate pair's first half waits for its second."""
        self.state = "string"
        high, self.high = self.high, None
        if high is not None and "\udc00" <= ch <= "\udfff":
            ch = (high + ch).encode("utf-16", "surrogatepass").decode("utf-16")
        elif high is not None:
            self._chars(high)
        if "\ud800" <= ch <= "\udbff":
            self.high = ch
        else:
            self._chars(ch)

    def _chars(self, s: str) -> None:
        if self.high is not None:
            s, self.high = self.high + s, None
        if self.key is not None:
            self.key += s
        else:
            self._put(s if PLAIN.fullmatch(s) else json.dumps(s, ensure_ascii=False)[1:-1])

    def _string_end(self) -> None:
        if self.high is not None:
            self._chars("")
        if self.key is None:
            self._put('"')
            self._after()
            return
        key, self.key = self.key, None
        if key in self.keys[-1] and len(self.stack) == self.base + 1 and not self.bare:
            self.bad = True  # (a call object's own key twice: _call refuses it too)
            return
        self.keys[-1].add(key)
        if len(self.stack) == self.base + 1:
            self.member = key
        self._put(json.dumps(key, ensure_ascii=False))
        self.state = "colon"

    def _put(self, s: str) -> None:
        self.out.append(s)

    def name(self, k: int) -> str | None:
        """Call ``k``'s name where it is whole (a non-empty string), else None."""
        span = self.calls[k].get("name")
        if span is None or span[1] is None or span[2] != '"':
            return None
        return json.loads("".join(self.out[span[0]:span[1]])) or None

    def _spans(self, k: int, keys: tuple[str, ...]) -> list:
        return [self.calls[k][key] for key in keys if key in self.calls[k]]

    def streams(self, k: int, keys: tuple[str, ...]) -> bool:
        """Whether call ``k``'s arguments are read as they come: its one member of ``keys`` an object."""
        spans = self._spans(k, keys)
        return len(spans) == 1 and spans[0][2] == "{"

    def arguments(self, k: int, keys: tuple[str, ...], start: int) -> tuple[str, int]:
        """Call ``k``'s arguments (an object, its member one of ``keys``) written from piece
        ``start`` on, and the piece it reached ("" where they are no object, or not begun)."""
        if not self.streams(k, keys):
            return "", start
        first, end, _ = self._spans(k, keys)[0]
        end = len(self.out) if end is None else end
        start = max(start, first)
        return "".join(self.out[start:end]), end


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


def _whole_items(text: str) -> list:
    """The items of a JSON array cut short (``[`` and the items before the cut), where the cut is
    between them; [] where it is inside one (a call that may be cut: the answer is text)."""
    items, at = [], text.find("[") + 1
    while 0 < at < len(text):
        at += len(text[at:]) - len(text[at:].lstrip(" ,\n\t\r"))
        try:
            item, at = DECODER.raw_decode(text, at)
        except (ValueError, RecursionError):
            return items if at == len(text) or text.startswith("]", at) else []
        items.append(item)
    return items


def forced_message(content: str, finish: str, forced: str, parallel: bool = True) -> tuple[dict, str]:
    """A forced tool choice's answer (serve's forced_tools: the answer held to vLLM's JSON schema of
    the calls) as vLLM gives it: content "" and the calls (required: the
    array's, its items' parameters written as the parsers write a call's arguments, a key twice
    twice, ``_Pairs``; finish "tool_calls"; a named function: one call whose arguments are the
    answer, finish "stop"). Cut by max_tokens (finish "length"): required's whole calls where the
    cut is between them, as the parsers give them (tool_calls.message), else the text (a call that
    may be cut; streamed, what went of it stays sent: ForcedCalls)."""
    if forced != "required":
        if finish != "stop" or _json(content) is None:
            return {"role": "assistant", "content": content}, finish
        return {"role": "assistant", "content": "", "tool_calls": [_made(forced, content)]}, finish
    items = _json(content) if finish == "stop" else _whole_items(content)
    calls = [(c["name"], _arguments(c["parameters"])) for c in items or ()]
    if not calls or any(args is None for _, args in calls):  # (1e999: no JSON of it, Streamed's too)
        return {"role": "assistant", "content": content}, finish
    calls = [_made(name, args) for name, args in calls]
    return {"role": "assistant", "content": "", "tool_calls": calls if parallel else calls[:1]}, \
        "tool_calls" if finish == "stop" else finish


def _made(name: str, args: str) -> dict:
    return {"id": _call_id(), "type": "function", "function": {"name": name, "arguments": args}}


class ForcedCalls(Streamed):
    """A streamed forced tool choice (Streamed's interface, and its pieces joining into the whole
    answer's calls, ``forced_message``): a named function's header with the answer's first text,
    then the text as its arguments as it comes; required's calls read from the array as the
    parsers' JSON is (``_Reader``), a header once an item's name is whole, then its parameters as
    they are read. No content before the end; ``end`` is Streamed's (an answer cut by max_tokens
    inside a call: what went of it stays sent, the text comes as content, finish "length", as the
    whole answer gives it). vLLM's sends the parameters' text as the model spaced it, its whole
    answer's json.dumps of them."""

    def __init__(self, forced: str, parallel: bool = True):
        super().__init__("forced", parallel)
        self.forced, self.keys = forced, ("parameters",)

    def push(self, i: int, piece: str) -> dict:
        a = self.answers.get(i) or self.answers.setdefault(i, _Answer())
        a.text, items = a.text + piece, []
        if self.forced != "required" and piece:  # (the header alone, its arguments "", then the first piece)
            if not a.calls:
                _header(a, items, self.forced)
            a.calls[0][2].append(piece)
            items.append({"index": 0, "function": {"arguments": piece}})
        elif self.forced == "required" and a.phase != "held":
            a.reader = a.reader or _Reader(base=1)
            a.at = a.reader.feed(a.text, a.at)
            items = self._sent(a)
            a.phase = "held" if a.reader.bad or a.reader.done else a.phase
        return {"tool_calls": items} if items else {}

    def _message(self, i: int, text: str, finish: str) -> tuple[dict, str]:
        return forced_message(text, finish, self.forced, self.parallel)
