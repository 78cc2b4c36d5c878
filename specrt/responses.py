"""OpenAI's Responses API for `specrt serve` (POST /v1/responses): a request mapped onto a chat
completion's (``chat_body``: what ``Server.parse`` reads, so the template, sampling, stop, seed,
the limits, the tool-call and reasoning parsers and structured output are the chat path's), and
the chat answer made a response (``whole``) or its stream's chunks made the response's events
(``Events``), as OpenAI gives them and vLLM's serving_responses does.

    input               a string (one user message) or a list of items: messages {role
                        user | system | developer (rendered as system, as a chat template knows
                        no developer) | assistant, content a string or input_text / output_text
                        parts}, function_call items (an assistant message's tool_calls, those in a
                        row and an assistant message before them one message) and
                        function_call_output items (a tool message), reasoning items (the next
                        assistant message's reasoning_content, as a chat client sends it back; an
                        assistant message of its own, content "", where no message or call of its
                        answer follows it: an answer cut in its thinking)
    instructions        a system message before the input
    max_output_tokens   max_tokens; a response cut by it: status "incomplete",
                        incomplete_details.reason "max_output_tokens" (streamed: response.incomplete)
    tools               function tools in the flat form {type, name, description, parameters, strict};
                        tool_choice "none" | "auto" | "required" | {type: function, name}; the
                        answer's calls as function_call items {id, call_id, name, arguments}
    text.format         text | json_object | json_schema {name, schema, strict}: response_format's (a
                        structural tag not: OpenAI's types have none, nor does vLLM's text.format)
    structured_outputs  vLLM's (its ResponsesRequest's extra field; sent by extra_body) as chat's: json,
                        regex, choice, grammar, json_object or structural_tag, its whitespace options
                        (whitespace_pattern, disable_any_whitespace: text.format's JSON's where given
                        alone beside it); with a text.format of JSON too, a 400 naming both (vLLM's)
    reasoning           --reasoning-parser's thinking as a reasoning item before the message
    include             ["message.output_text.logprobs"]: chat's logprobs (``top_logprobs`` 0-20
                        alternatives), every output token's entry in the message's output_text
                        (streamed: each with the text delta it came with, or the next one), as vLLM
                        gives them only with this include (top_logprobs alone: none)
    store               kept (``Store``, serve's --responses-store N most recent, the oldest
                        dropped; OpenAI's default true) unless false; with N 0 nothing is kept
                        (store true taken, false in the response: vLLM's default); a stream ended
                        by an error event kept "failed" (its ``error``), one whose client left
                        "cancelled" (``Events.ended``)
    previous_response_id a kept response's input items and output items before the input (its
                        instructions not carried over: OpenAI's), rendered as if sent whole
                        (an empty answer, no output item: an assistant message, content "");
                        one not kept: 400 previous_response_not_found (OpenAI's; vLLM's a 404);
                        a failed or cancelled one: 400
    item_reference      an input item {"type": "item_reference", "id": ...} (type optional, as
                        the SDK's): the kept item of that id in its place (an output item of a
                        kept response or one of its input items, the latest response's first;
                        ``Store.items``); none: OpenAI's 404 "Item with id '...' not found", param
                        input (the message naming input[k].id)
    truncation          "disabled" (a prompt past the context: 400) or "auto": chat's truncate_prompt_tokens
                        -1, as vLLM maps it: the rendered prompt's last tokens, as many as the context
                        leaves beside max_output_tokens (the server's default where none is given), so
                        the oldest tokens go, the instructions' and the template's start with them
                        (OpenAI drops whole input items from the start; usage counts the tokens kept)
    temperature, top_p, parallel_tool_calls, user, metadata (echoed), stream; and as on the
                        chat path (outside OpenAI's API, sent by a client's extra_body) seed, top_k,
                        stop, chat_template_kwargs

A function_call_output item whose call_id no function_call before it has (the previous response's
included) is a 400 naming it, as OpenAI's, and so is a message after a function_call before its
output ("No tool output found for function call"; vLLM takes it), and an item sent again (its id
the previous response's conversation's, or twice in the input: "Duplicate item found"). ``stored``: GET
/v1/responses/{id} (the response as sent), DELETE /v1/responses/{id} and GET
/v1/responses/{id}/input_items (its input items, the previous responses' included, as OpenAI's list
with limit / order / after), 404 for an id not kept. Under serve's --isolate-clients a kept
response is the ``user``'s that made it (Store's owner; GET and DELETE, which have no body, give
theirs as ``?user=``): another user's request finds it, and its items, as one never made.
Usage's reasoning_tokens counts the generated tokens the reasoning parser put in the reasoning
(``reasoning_tokens``).

Refused (400 naming the field): built-in tools (web_search, file_search, code_interpreter,
mcp, ...: nothing here runs them), ``background`` true (nothing runs later: vLLM's refusal
without its store), ``conversation`` (no conversation objects: chain with previous_response_id,
or send the whole conversation as input, as a chat client does), ``include`` but
"message.output_text.logprobs", ``max_tool_calls``, ``prompt``,
``reasoning.effort`` / ``summary`` (as chat's reasoning_effort), ``text.verbosity`` and input
other than text.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict

# fields read (mapped onto chat's, or echoed); PASSED: passed on as they are, the chat path's extra
# fields (seed, top_k, stop, chat_template_kwargs, vLLM's structured_outputs) and those that change nothing here
# (cmd_serve's SHARED_FIELDS)
READ = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "stream_options",
        "tools", "tool_choice", "text", "parallel_tool_calls", "store", "metadata", "user", "reasoning", "background",
        "previous_response_id", "conversation", "include", "top_logprobs", "truncation", "max_tool_calls", "prompt")
PASSED = ("seed", "top_k", "stop", "chat_template_kwargs", "structured_outputs", "service_tier", "prompt_cache_key",
          "prompt_cache_retention", "safety_identifier", "request_id", "cache_salt", "kv_transfer_params")
LOGPROBS = "message.output_text.logprobs"  # the include that asks for the output's logprobs (the one taken)
TEXT_PARTS = ("input_text", "output_text", "text")  # a message's text parts (any role's: clients replay either)
# a chat request's names in parse's errors -> the response request's (Handler._error)
PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text"}
WORDS = (("response_format.json_schema.schema", "text.format.schema"), ("'response_format'", "'text.format'"),
         ("response_format:", "text.format:"),  # (json_object's grammar's label: its dead end, h77b; m77h)
         ("'max_tokens'", "'max_output_tokens'"), ("the messages and the tools", "the input and the tools"),
         ("in the messages", "in the input"), ("length of the messages", "length of the input"))


class Refused(ValueError):
    """A response request's field refused: the message, the field's name, OpenAI's code where it
    gives one and the HTTP status (serve's 400; 404 for a response not kept)."""

    def __init__(self, message: str, param: str | None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param, self.code, self.status = param, code, status


def renamed(message: str, param: str | None) -> tuple[str, str | None]:
    """A chat request's error (Server.parse's, the stream's) in the response request's names."""
    for chat, ours in WORDS:
        message = message.replace(chat, ours)
    return message, PARAMS.get(param, param)


def _text_of(content, where: str, kinds: tuple[str, ...]) -> str | list[dict]:
    """A message's content: a string, or its text parts (``kinds``) as chat's text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise Refused(f"{where}: expected a string or a non-empty list of text parts; got {content!r:.60}", "input")
    parts = []
    for k, p in enumerate(content):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind not in kinds or not isinstance(p.get("text"), str):
            raise Refused(f"{where}[{k}]: only text parts ({' or '.join(kinds)}, with a string 'text') are supported; "
                          f"got {p!r:.60}", "input")
        parts.append({"type": "text", "text": p["text"]})
    return parts


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text sent back: its reasoning_text content, else its summary."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in parts):
        raise Refused(f"{where}: a reasoning item's content and summary are lists of {{'type', 'text'}}; "
                      f"got {item!r:.60}", "input")
    return "\n".join(p["text"] for p in parts)


def messages(body: dict) -> list[dict]:
    """``instructions`` and ``input`` as chat messages (the module's docstring)."""
    out: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise Refused(f"'instructions' must be a string; got {instructions!r:.60}", "instructions")
        out.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise Refused("'input' must be a string or a non-empty list of input items (messages, function_call, "
                      f"function_call_output); got {items!r:.60}", "input")
    thought, end = None, object()  # a reasoning item's text, for the next assistant message; the input's end
    called: set[str] = set()  # the function_call items' call_ids so far (an output must answer one)
    unanswered: list[str] = []  # those no output has answered yet (a message must not come before them)
    for i, item in enumerate([*items, end]):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if thought is not None and kind not in ("function_call", "reasoning") and \
                not (kind == "message" and item.get("role") == "assistant"):
            # (a reasoning item no message or call of its answer follows, an answer cut in its thinking: that
            # answer, as a chat client sends it back, not dropped)
            out.append({"role": "assistant", "content": "", "reasoning_content": thought})
            thought = None
        if item is end:
            break
        if kind == "message" and isinstance(item, dict) and "role" in item:
            role = item["role"]
            if role not in ("user", "system", "developer", "assistant"):
                raise Refused(f"{where}.role must be user, system, developer or assistant; got {role!r:.40}", "input")
            if unanswered:  # (OpenAI's 400: a call left without its output, the conversation gone on; h78j)
                raise Refused(f"{where}: No tool output found for function call {unanswered[0]!r:.80} (a "
                              "function_call_output item with its call_id comes before the next message)", "input")
            msg = {"role": "system" if role == "developer" else role,
                   "content": _text_of(item.get("content"), f"{where}.content", TEXT_PARTS)}
            if role == "assistant" and thought is not None:
                msg["reasoning_content"], thought = thought, None
            out.append(msg)
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, args)):
                raise Refused(f"{where}: a function_call item has a string 'call_id', 'name' and 'arguments'; got "
                              f"{item!r:.80}", "input")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            called.add(call_id)
            unanswered.append(call_id)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and thought is None:  # (the same turn's)
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if thought is not None:
                    out[-1]["reasoning_content"], thought = thought, None
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise Refused(f"{where}: a function_call_output item has a string 'call_id'; got {item!r:.80}", "input")
            if call_id not in called:  # (OpenAI's 400: an output answering no call; h78a)
                raise Refused(f"{where}: No tool call found for function call output with call_id {call_id!r:.80} (no "
                              "function_call item before it has that call_id)", "input")
            unanswered = [c for c in unanswered if c != call_id]
            output = _text_of(output, f"{where}.output", TEXT_PARTS)
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": output if isinstance(output, str) else "\n".join(p["text"] for p in output)})
        elif kind == "reasoning":
            thought = _reasoning_text(item, where)
        else:
            raise Refused(f"{where}: expected a message ({{'role', 'content'}}), a function_call or a "
                          f"function_call_output item; got {item!r:.80}", "input")
    return out


def _tools(tools) -> list[dict] | None:
    """The flat function tools as chat's ({type, function: {name, description, parameters, strict}})."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise Refused(f"'tools' must be a list of function tools; got {tools!r:.60}", "tools")
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise Refused(f"tools[{i}]: only function tools are served here (nothing runs the built-in "
                          f"{kind!r:.40} tool); got {t!r:.60}", "tools")
        if not isinstance(t.get("name"), str) or not t["name"]:
            nested = (" (the Responses API's tools are flat: {'type': 'function', 'name': ..., 'parameters': ...}, "
                      "not chat's {'function': {...}})") if "function" in t else ""
            raise Refused(f"tools[{i}]: a function tool needs a non-empty string 'name'{nested}; got {t!r:.60}",
                          "tools")
        for k, kind in (("description", str), ("parameters", dict)):  # (chat's checks name them under 'function')
            if t.get(k) is not None and not isinstance(t[k], kind):
                raise Refused(f"tools[{i}].{k}: expected {'a string' if kind is str else 'a JSON Schema object'}; "
                              f"got {t[k]!r:.60}", "tools")
        out.append({"type": "function", "function": {k: v for k, v in t.items() if k != "type" and v is not None}})
    return out


def _tool_choice(choice):
    if choice is None or isinstance(choice, str):
        return choice  # (none, auto, required; another string is chat's 400)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise Refused("'tool_choice' must be \"none\", \"auto\", \"required\" or {'type': 'function', 'name': ...}; got "
                  f"{choice!r:.80}", "tool_choice")


def _format(text) -> dict | None:
    """``text.format`` as chat's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise Refused(f"'text' must be an object {{'format': {{...}}}}; got {text!r:.60}", "text")
    for k, v in text.items():
        if k != "format" and v is not None:
            raise Refused(f"'text.{k}' is not supported (got {v!r:.60})", "text")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt.get("schema"), dict):
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    raise Refused("'text.format' must be {'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', "
                  f"'name': ..., 'schema': {{...}}}}; got {fmt!r:.80}", "text")


class Store:
    """The responses kept (``--responses-store``: the ``size`` most recent, the oldest dropped
    first; 0: none), each with its input items (``context``'s: the previous response's input and
    output items first) and its owner: for ``previous_response_id``, ``item_reference`` items and
    GET / DELETE /v1/responses/{id}, GET .../input_items. In memory, one server's; a process's
    threads share it (its lock).

    ``scoped`` (serve's --isolate-clients): a response is its owner's (the ``user`` of the request
    that made it, "" for none; Server.owner), and a request of another owner finds it as one never
    made, the same answer word for word, so that a client learns nothing of another's ids. Unscoped,
    every owner is None: one client's."""

    def __init__(self, size: int, scoped: bool = False):
        self.size, self.scoped, self.kept, self.lock = size, scoped, OrderedDict(), threading.Lock()

    def put(self, response: dict, items: list[dict], owner: str | None = None) -> None:
        with self.lock:
            self.kept[response["id"]] = (response, items, owner)
            while len(self.kept) > self.size:
                self.kept.popitem(last=False)

    def get(self, rid: str, owner: str | None = None) -> tuple[dict, list[dict]] | None:
        """Response ``rid`` and its input items, where ``owner``'s."""
        with self.lock:
            kept = self.kept.get(rid)
        return kept[:2] if kept is not None and kept[2] == owner else None

    def pop(self, rid: str, owner: str | None = None) -> tuple[dict, list[dict]] | None:
        with self.lock:
            kept = self.kept.get(rid)
            return self.kept.pop(rid)[:2] if kept is not None and kept[2] == owner else None

    def items(self, owner: str | None = None) -> dict[str, dict]:
        """The kept items by id, what an item_reference names: the output items of ``owner``'s
        responses and their input items, the most recent response's where two have an id (ids made
        here are random; one a client sent, "msg_1", may be in two responses). Made once a request:
        a lookup each reference scanned the store (64 responses of 200 items: 0.16 ms each, and a
        body may hold thousands of references)."""
        with self.lock:
            kept = [(r, items) for r, items, o in self.kept.values() if o == owner]
        found = {}
        for response, items in kept:  # (oldest first: a later response's item replaces an earlier one's)
            for x in (*items, *response["output"]):
                found[x.get("id")] = x
        return found

    def missing(self, rid: str) -> str:
        """Why ``rid`` is not here: the words after "... with id '...' not found" (the same
        whoever asks: another owner's response is not told apart from one never made)."""
        if not self.size:
            return " (this server keeps no responses: --responses-store 0)"
        scoped = ", or another user's: --isolate-clients, GET and DELETE name theirs as ?user=" if self.scoped else ""
        return (f" (never made here, made with store false, deleted, or dropped{scoped}; this server keeps the "
                f"{self.size} most recent, --responses-store)")


PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _reference(item) -> bool:
    """Whether an input item is an item_reference: ``{"type": "item_reference", "id": ...}``, or an
    id with neither type nor role (the SDK's ItemReference has its type optional)."""
    if not isinstance(item, dict):
        return False
    kind = item.get("type")
    return kind == "item_reference" or (kind is None and "id" in item and "role" not in item)


def _referenced(item: dict, i: int, found: dict[str, dict], store: Store | None) -> dict:
    """The kept item (``found``: ``Store.items``) input item ``i``, an item_reference, names:
    OpenAI's 404 "Item with id '...' not found" (param input) where none has its id."""
    iid = item.get("id")
    if not isinstance(iid, str):
        raise Refused(f"input[{i}].id: an item_reference names a kept item by its string id; got {iid!r:.60}",
                      "input")
    if iid not in found:
        raise Refused(f"input[{i}].id: Item with id {iid!r:.80} not found among the kept responses' output and "
                      f"input items{store.missing(iid) if store is not None else ''}.", "input", status=404)
    return dict(found[iid])


def context(body: dict, store: Store | None, owner: str | None = None) -> list | object:
    """The request's input as items, each with an ``id`` (made for those sent without one, as
    OpenAI gives them in input_items), an item_reference replaced by the kept item it names
    (``_referenced``), after its ``previous_response_id``'s stored input and output items: the
    conversation rendered, and kept with the response. ``owner``: whose responses the request
    may read (Store). (Input neither a string nor a list is given back as it is: ``messages``'
    400.)"""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    if isinstance(items, list):
        if any(map(_reference, items)):  # (``owner``'s kept items looked up)
            found = store.items(owner) if store is not None else {}
            items = [_referenced(x, i, found, store) if _reference(x) else x for i, x in enumerate(items)]
        items = [{**x, "id": _id(PREFIXES.get(x.get("type", "message"), "item"))}
                 if isinstance(x, dict) and not isinstance(x.get("id"), str) else x for x in items]
    prev = body.get("previous_response_id")
    if prev is None:
        return _once(items, [])
    if not isinstance(prev, str):
        raise Refused(f"'previous_response_id' must be a string; got {prev!r:.60}", "previous_response_id")
    kept = store.get(prev, owner) if store is not None else None
    if kept is None:  # (OpenAI's 400 and code; vLLM's is a 404)
        raise Refused(f"Previous response with id '{prev:.80}' not found" +
                      (store.missing(prev) if store is not None else "") + ".", "previous_response_id",
                      "previous_response_not_found")
    response, before = kept
    if response["status"] in ("failed", "cancelled"):  # (its answer cut short: Events.ended)
        raise Refused(f"Previous response with id '{prev:.80}' is {response['status']} (" + (
            "its stream ended by an error" if response["status"] == "failed" else "its client left mid-stream") +
            "): it has no whole answer to continue from; chain from an earlier response, or send the conversation "
            "as input", "previous_response_id")
    # (an empty answer, no output item, is its turn all the same: a chat client sends back its assistant
    # message, content "", where the two user turns ran together; w78f)
    answer = response["output"] or [{"type": "message", "role": "assistant", "content": "", "id": _id("msg")}]
    return _once(items, [*before, *answer])


def _once(items, chain: list[dict]) -> list | object:
    """``chain`` and the input ``items`` after it, each id once: an item of the chain sent again
    is OpenAI's 400 (a client chaining by id and sending the previous output too: its turns were
    rendered twice, and input_items' ``after`` paged through that id for ever; w78f)."""
    if not isinstance(items, list):
        return items
    seen = {x["id"] for x in chain}
    for i, x in enumerate(items):
        if not isinstance(x, dict):  # (messages' 400)
            continue
        if x["id"] in seen:
            raise Refused(f"input[{i}]: Duplicate item found with id {x['id']!r:.80}; remove duplicate items from "
                          "your input" + (" (its 'previous_response_id' conversation, input and output, comes before "
                                          "it: send the new items alone)" if chain else ""), "input")
        seen.add(x["id"])
    return [*chain, *items]


def chat_body(body, items: list | None = None) -> dict:
    """A response request as the chat completion request ``Server.parse`` reads; ``items``: its
    input as ``context`` gives it (the previous response's items first)."""
    from specrt.cmd_serve import NOT_DONE  # (refused as chat refuses them; cmd_serve imports this module when used)

    if not isinstance(body, dict):
        raise Refused("the request body must be a JSON object", None)
    for name, v in body.items():
        if v is None or name in READ or name in PASSED:
            continue
        if name in NOT_DONE:
            raise Refused(f"'{name}' is not supported (got {v!r:.80})", name)
        raise Refused(f"Unrecognized request argument supplied: {name}", name)
    if body.get("background"):  # (vLLM's 400 without its store)
        raise Refused("'background' is not supported: this server runs no response later", "background")
    if body.get("conversation") is not None:
        raise Refused("'conversation' is not supported: this server keeps no conversations (chain the turns with "
                      "'previous_response_id', or send the whole conversation as 'input')", "conversation")
    include, top = body.get("include"), body.get("top_logprobs")
    if include is not None and not isinstance(include, list):  # (a string, as the SDK lets through)
        raise Refused(f"'include' must be a list, as [{LOGPROBS!r}]; got {include!r:.80}", "include")
    if include is not None and set(map(str, include)) - {LOGPROBS}:
        raise Refused(f"'include' takes {LOGPROBS!r} alone here; got {include!r:.80}", "include")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and 0 <= top <= 20):
        raise Refused(f"'top_logprobs' must be an integer from 0 to 20; got {top!r:.40}", "top_logprobs")
    truncation = body.get("truncation")
    if truncation is not None and truncation not in ("auto", "disabled"):
        raise Refused(f"'truncation' must be 'auto' or 'disabled'; got {truncation!r:.40}", "truncation")
    for name in ("max_tool_calls", "prompt"):
        if body.get(name) is not None:
            raise Refused(f"'{name}' is not supported (got {body[name]!r:.80})", name)
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or any(v is not None for v in reasoning.values())):
        raise Refused(f"'reasoning' is not supported but as {{}} (got {reasoning!r:.80}): a thinking model's reasoning "
                      "comes with --reasoning-parser", "reasoning")
    for name, kind in (("metadata", dict), ("store", bool)):
        if body.get(name) is not None and not isinstance(body[name], kind):
            raise Refused(f"'{name}' must be {'an object' if kind is dict else 'true or false'}; got "
                          f"{body[name]!r:.60}", name)
    if not all(isinstance(v, str) for v in (body.get("metadata") or {}).values()):  # (echoed: the SDK's str -> str)
        raise Refused(f"'metadata' values must be strings; got {body['metadata']!r:.60}", "metadata")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_obfuscation"}):
        raise Refused(f"'stream_options' takes include_obfuscation alone; got {opts!r:.60}", "stream_options")
    chat = {k: body[k] for k in ("model", "temperature", "top_p", "stream", "parallel_tool_calls", "user", *PASSED)
            if body.get(k) is not None}
    chat["messages"] = messages({**body, "input": context(body, None) if items is None else items})
    for name, v in (("max_tokens", body.get("max_output_tokens")), ("tools", _tools(body.get("tools"))),
                    ("tool_choice", _tool_choice(body.get("tool_choice"))),
                    ("response_format", _format(body.get("text")))):
        if v is not None:
            chat[name] = v
    if truncation == "auto":  # (vLLM's: the rendered prompt's last tokens, as many as the context leaves beside
        chat["truncate_prompt_tokens"] = -1  # max_output_tokens; not OpenAI's whole oldest items)
    if include:  # (the output's logprobs: chat's)
        chat["logprobs"], chat["top_logprobs"] = True, top
    return chat


def skeleton(body: dict, rid: str, model: str, params, store: bool = False) -> dict:
    """The response object without its output, status and usage: what the request asked for
    (its sampling values as served: the server's defaults where it gave none); ``store``:
    whether it will be kept."""
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "background": False, "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None, "model": model, "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None}, "store": store, "temperature": params.temperature,
            "text": {"format": text.get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",  # (OpenAI's, tools or none; h78a)
            "tools": body.get("tools") or [], "top_p": params.top_p, "top_logprobs": body.get("top_logprobs") or 0,
            "truncation": body.get("truncation") or "disabled", "usage": None,
            "user": body.get("user"), "metadata": body.get("metadata") or {}}


def reasoning_tokens(decode, ids: list[int], reasoning: str) -> int:
    """The generated tokens (``ids``; ``decode(ids[:k])``: the first k's text) that the reasoning
    parser put in ``reasoning``: those whose text ends within it (its tags' tokens, and the
    answer's after them, not), counted on the ids the model wrote, not on the text encoded
    again (a byte-level tokenizer's words joined encoded as one: w77f's note). Where the text
    is not found in the ids' (a stop string's cut), the text encoded again is the fallback:
    ``None``."""
    if not reasoning:
        return 0
    at = decode(ids).find(reasoning)
    if at < 0:
        return None

    def within(end: int) -> int:  # the tokens whose text ends at or before ``end`` (binary search)
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if len(decode(ids[:mid])) <= end else (lo, mid - 1)
        return lo

    return within(at + len(reasoning)) - within(at)


def chained(message: str, body: dict) -> str:
    """An error's ``message`` for a request (or its response) with ``previous_response_id``: the
    context's limit said to count the chain's earlier turns (a user sending "again" read of a
    prompt of 282 tokens it never wrote; h78j). Other errors, and requests not chained, as they are."""
    if body.get("previous_response_id") is None or not any(w in message for w in ("context limit", "context length")):
        return message
    return (f"{message} (the prompt holds the 'previous_response_id' conversation before this input: its earlier "
            "turns, input and output items, count; chain from an earlier response or start a new conversation)")


def _listed(item: dict) -> dict:
    """An input item as input_items lists it (OpenAI's: a message's content as parts, a status)."""
    item = {"status": "completed", **item}
    if item.get("type", "message") == "message":
        kind = "output_text" if item.get("role") == "assistant" else "input_text"
        text = item.get("content")
        item = {**item, "type": "message", "content": [{"type": kind, "text": text, **(
            {"annotations": []} if kind == "output_text" else {})}] if isinstance(text, str) else text}
    return item


def stored(store: Store, method: str, route: str, query: dict[str, list[str]], owner: str | None = None) -> dict:
    """GET /v1/responses/{id} (the response as it was sent; ``include`` LOGPROBS where it has them,
    ``stream`` false), DELETE /v1/responses/{id}, GET
    /v1/responses/{id}/input_items (OpenAI's list: ``data``, first_id, last_id, has_more; ``limit``
    1-100, 20; ``order`` desc (the last item first) or asc; ``after`` an item's id): the answer's
    body, or Refused (404 for an id not kept, or not ``owner``'s: Store, 400 for a bad query).
    ``user`` in the query is the client's (Server.owner's; read by the caller)."""
    rest = route.split("/responses/", 1)[1]
    items = rest.endswith("/input_items") and method == "GET"
    rid = rest[:-len("/input_items")] if items else rest
    kept = store.get(rid, owner) if "/" not in rid else None
    if kept is None:
        raise Refused(f"Response with id '{rid:.80}' not found{store.missing(rid)}.", "response_id", status=404)
    take = ("limit", "order", "after") if items else ("include", "include[]", "stream") if method == "GET" else ()
    for name in query:
        if name not in (*take, "user"):
            raise Refused(f"query parameter {name!r:.40} is not supported here (takes {', '.join((*take, 'user'))})",
                          name)
    if method == "DELETE":
        store.pop(rid, owner)
        return {"id": rid, "object": "response", "deleted": True}
    response, listed = kept
    if not items:  # (OpenAI's GET takes include and stream too; h78j)
        for name in ("include", "include[]"):
            for v in query.get(name, ()):
                if v != LOGPROBS:
                    raise Refused(f"'include' takes {LOGPROBS!r} alone here; got {v!r:.80}", "include")
                if any(x["type"] == "message" and x["content"][0]["text"] and not x["content"][0]["logprobs"]
                       for x in response["output"]):  # (kept as made: asked for at its POST, or not there)
                    raise Refused(f"Response '{rid:.80}' was made without include {LOGPROBS!r}: its logprobs were "
                                  "not kept (ask for them when creating it)", "include")
        stream = query.get("stream", ["false"])[-1]
        if stream != "false":  # (a background response's events replayed, OpenAI's and vLLM's: none runs here)
            raise Refused("'stream' true replays a background response's events, and this server runs none in the "
                          f"background (GET without it gives the whole response); got {stream!r:.40}", "stream")
        return response
    limit, order, after = (query.get(k, [d])[-1] for k, d in (("limit", "20"), ("order", "desc"), ("after", None)))
    if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= 100):  # ("²".isdigit(), int's ValueError: w78f)
        raise Refused(f"'limit' must be an integer from 1 to 100; got {limit!r:.40}", "limit")
    if order not in ("asc", "desc"):
        raise Refused(f"'order' must be 'asc' or 'desc'; got {order!r:.40}", "order")
    data = [_listed(x) for x in (listed if order == "asc" else reversed(listed))]
    if after is not None:
        at = [k for k, x in enumerate(data) if x.get("id") == after]
        if not at:
            raise Refused(f"'after': no input item with id {after!r:.80} in response '{rid:.80}'", "after")
        data = data[at[0] + 1:]
    page = data[:int(limit)]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(data) > len(page)}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _message(text: str, status: str) -> dict:
    return {"type": "message", "id": _id("msg"), "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call(call: dict) -> dict:
    """A chat tool call (tool_calls.message's) as a function_call item."""
    f = call["function"]
    return {"type": "function_call", "id": _id("fc"), "call_id": call["id"], "name": f["name"],
            "arguments": f["arguments"], "status": "completed"}


def _reasoning(text: str, status: str) -> dict:
    return {"type": "reasoning", "id": _id("rs"), "summary": [], "status": status,
            "content": [{"type": "reasoning_text", "text": text}]}


def finished(response: dict, finish: str, usage: dict, specrt: dict, reasoning_tokens: int) -> dict:
    """``response`` ended with chat's ``finish`` reason and ``usage`` (its specrt beside it)."""
    cut = finish == "length"
    return {**response, "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "completed_at": None if cut else int(time.time()),  # (OpenAI's: only a completed response's)
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"],  # (cache_write_tokens: the SDK's type requires it)
                      "input_tokens_details": {"cached_tokens": specrt.get("prefix_reused", 0),
                                               "cache_write_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": reasoning_tokens}},
            "specrt": specrt}


def whole(response: dict, answer: dict, count) -> dict:
    """A whole chat answer (its one choice) as the response: a reasoning item (--reasoning-parser),
    a message where there is text, a function_call item a call. ``count(text)``: its tokens."""
    choice = answer["choices"][0]
    msg = choice["message"]
    output = [_reasoning(msg["reasoning"], "completed")] if msg.get("reasoning") else []
    if msg.get("content"):
        output.append(_message(msg["content"], "completed"))
        output[-1]["content"][0]["logprobs"] = (choice.get("logprobs") or {}).get("content") or []
    output += [_call(c) for c in msg.get("tool_calls") or ()]
    if choice["finish_reason"] == "length" and output and output[-1]["type"] != "function_call":
        output[-1]["status"] = "incomplete"  # (the text cut; a call given is whole: tool_calls.message)
    return {**finished(response, choice["finish_reason"], answer["usage"], answer["specrt"],
                       count(msg.get("reasoning") or "")), "output": output}


class Events:
    """A streamed chat answer's chunks (``feed``: each payload serve would send as ``data:``)
    as the response's server-sent events, OpenAI's: response.created and response.in_progress
    first; each output item opened (response.output_item.added, with its content part's
    response.content_part.added) when its first text comes, written to in deltas
    (response.reasoning_text.delta, response.output_text.delta,
    response.function_call_arguments.delta), closed (its .done events, response.output_item.done)
    when the next one opens or the answer ends; last response.completed, or response.incomplete
    for an answer cut by max_output_tokens, carrying the whole response and its usage. Every
    event with its sequence_number, from 0, and an ``event:`` line naming its type.
    ``count(text)``: the reasoning's tokens; ``keep(response)``: the response completed (or
    incomplete), kept (``Store``), as a whole one is."""

    def __init__(self, response: dict, count, keep=lambda response: None):
        self.response, self.count, self.keep = response, count, keep
        self.seq = 0
        self.output: list[dict] = []  # the items opened so far
        self.open: dict | None = None  # the item being written
        self.calls: dict[int, int] = {}  # a tool call's index -> its item's place in output
        self.finish, self.specrt = "stop", {}  # (the last chunk's)
        self.reasoned = ""  # the reasoning streamed
        self.entries: list[dict] = []  # logprob entries, all; the first ``sent`` went with a text delta
        self.sent = 0
        self.kept = False  # (its response kept, at its last event or ``ended``: once)

    def _event(self, kind: str, **data) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps(data).encode())

    def begin(self) -> bytes:
        return self._event("response.created", response=self.response) + \
            self._event("response.in_progress", response=self.response)

    def _place(self, item: dict) -> dict:
        return {"item_id": item["id"], "output_index": self.output.index(item)}

    def _close(self, status: str = "completed") -> bytes:
        item, self.open = self.open, None
        if item is None:
            return b""
        out = b""
        if item["type"] == "function_call":
            out += self._event("response.function_call_arguments.done", **self._place(item), name=item["name"],
                               arguments=item["arguments"])
        else:
            item["status"] = status
            part = item["content"][0]
            kind = "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            extra = {"logprobs": part["logprobs"]} if item["type"] == "message" else {}
            out += self._event(kind, **self._place(item), content_index=0, text=part["text"], **extra)
            out += self._event("response.content_part.done", **self._place(item), content_index=0, part=part)
        return out + self._event("response.output_item.done", output_index=self.output.index(item), item=item)

    def _opening(self, item: dict) -> bytes:
        out = self._close()
        self.output.append(item)
        self.open = item
        added = {**item, "status": "in_progress"}
        if item["type"] == "function_call":
            return out + self._event("response.output_item.added", output_index=len(self.output) - 1,
                                     item={**added, "arguments": ""})
        part = {**item["content"][0], "text": ""}
        out += self._event("response.output_item.added", output_index=len(self.output) - 1,
                           item={**added, "content": []})
        return out + self._event("response.content_part.added", **self._place(item), content_index=0, part=part)

    def _text(self, kind: str, text: str) -> bytes:
        """``text`` added to the open item of ``kind`` (message or reasoning), opened if need be."""
        out = b""
        for item in self.output if kind == "message" else ():  # (text after a call's header: the calls taken
            if item["type"] == "function_call":  # back as the answer's text, malformed or cut: Streamed.end; m77h)
                item["status"] = "incomplete"
        if self.open is None or self.open["type"] != kind:
            out += self._opening(_message("", "in_progress") if kind == "message" else _reasoning("", "in_progress"))
        self.open["content"][0]["text"] += text
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {}
        if kind == "message":  # (the entries not sent yet: a reasoning's or a held text's too)
            extra["logprobs"], self.sent = self.entries[self.sent:], len(self.entries)
            self.open["content"][0]["logprobs"] += extra["logprobs"]
        return out + self._event(name, **self._place(self.open), content_index=0, delta=text, **extra)

    def feed(self, payload: dict) -> bytes:
        """A chat chunk's events (b"" where it has none: the role's chunk, text held back)."""
        out = b""
        if "usage" in payload and not payload.get("choices"):  # (the last: the usage chunk)
            return out + self._end(payload["usage"])
        choice = payload["choices"][0]
        delta = choice.get("delta") or {}
        self.entries += (choice.get("logprobs") or {}).get("content") or []
        if delta.get("reasoning"):
            self.reasoned += delta["reasoning"]
            out += self._text("reasoning", delta["reasoning"])
        if delta.get("content"):
            out += self._text("message", delta["content"])
        for call in delta.get("tool_calls") or ():
            if "id" in call:  # its header: a new item
                item = _call({**call, "function": {**call["function"], "arguments": ""}})
                out += self._opening(item)
                self.calls[call["index"]] = len(self.output) - 1
            args = (call.get("function") or {}).get("arguments")
            if args:
                item = self.output[self.calls[call["index"]]]
                item["arguments"] += args
                out += self._event("response.function_call_arguments.delta", **self._place(item), delta=args)
        if choice.get("finish_reason") is not None:
            self.finish, self.specrt = choice["finish_reason"], payload.get("specrt", {})
        return out

    def _end(self, usage: dict) -> bytes:
        cut = self.finish == "length"
        for item in self.output:  # (every entry in the message, as the whole answer's: those after its text too)
            if item["type"] == "message":
                item["content"][0]["logprobs"] = self.entries
        out = self._close("incomplete" if cut else "completed")
        done = {**finished(self.response, self.finish, usage, self.specrt, self.count(self.reasoned)),
                "output": self.output}
        # (kept as the whole answer's response is: a call taken back, its text the message's, left out; sent back
        # by previous_response_id, its cut arguments were a 400, r78g)
        self.kept = True
        self.keep({**done, "output": [i for i in self.output if i["type"] != "function_call"
                                      or i.get("status") != "incomplete"]})
        return out + self._event("response.incomplete" if cut else "response.completed", response=done)

    def error(self, error: dict) -> bytes:
        """An error mid-answer (serve's error object, in chat's names) as the stream's error event
        then response.failed (OpenAI's order) carrying the response ``failed`` with it, as kept
        (``ended``)."""
        message, param = renamed(error["message"], error.get("param"))
        failed = self.ended("failed", {"code": error.get("code") or (
            "server_error" if error.get("type") == "server_error" else "invalid_prompt"), "message": message})
        return self._event("error", code=error.get("code"), message=message, param=param) + \
            self._event("response.failed", response=failed)

    def ended(self, status: str, error: dict | None = None) -> dict:
        """A stream that ended before its last event: by an error event (``failed``, OpenAI's
        status, with its ``error`` {code, message}) or by its client leaving (``cancelled``),
        kept as far as it went (an item being written: incomplete), so that GET finds it, as
        OpenAI keeps a failed response, and previous_response_id refuses it (``context``); the
        response so ended returned (response.failed's)."""
        if self.open is not None:
            self.open["status"] = "incomplete"
        ended = {**self.response, "status": status, "error": error, "output": list(self.output)}
        if not self.kept:
            self.kept = True
            self.keep(ended)
        return ended
