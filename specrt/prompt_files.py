"""Prompt files: JSON lines, each an object with a string ``prompt``, a conversation
``messages`` (a non-empty list of ``{"role": ..., "content": ...}`` objects, rendered with
the exported chat template: a system prompt, earlier turns; a content may be OpenAI's text
parts) and/or a non-empty list of
token ids ``prompt_ids`` (other fields, such as ``kind``, are kept). Token ids come
first, then messages, then the text. Read by ``specrt run --prompts``, ``specrt
calibrate`` and ``specrt bench``."""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specrt.errors import UserError, json_problem
from specrt.limits import whole


def json_lines(path: Path, what: str = "the prompts") -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank JSON line of ``path`` (gzip-compressed when it
    ends in .gz); UserError naming the file (and line) when it cannot be read or parsed."""
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:  # zlib.error: a corrupt .gz
        raise UserError(f"{path}: cannot read {what} ({e})") from None
    data = data.removeprefix(codecs.BOM_UTF8)  # (a BOM, as Windows tools write, read past)
    if b"\r" in data:  # line ends read as read_text and gzip's text mode read them (universal newlines): a
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")  # file of "\r" alone was one line, "Extra data"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:  # named by its line, as a JSON error is (a byte offset into 5000 lines said little)
        start = data.rfind(b"\n", 0, e.start) + 1
        n = data.count(b"\n", 0, start) + 1
        raise UserError(f"{path}:{n}: cannot read {what} (not UTF-8 text: {e.reason} at byte {e.start - start + 1} of "
                        "the line)") from None  # (counted from 1, as JSON's columns are: it said 0 for the first)
    # lines end at "\n" alone (JSON Lines): str.splitlines() also splits at U+2028, U+0085
    # and other characters a JSON string may hold unescaped
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as e:  # (not JSON; nested past Python's recursion limit, a number
            raise UserError(f"{path}:{n}: not a JSON line ({json_problem(e)})") from None  # past its digit limit)
        yield n, value


def is_token_ids(v: Any) -> bool:
    """Whether ``v`` is a list of ints (bools refused; empty allowed)."""
    return isinstance(v, list) and all(whole(t) for t in v)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two id lists share (bench's identity check; the runtime's
    prefix reuse)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


CONVERSATION = ("a conversation must be a non-empty list of messages, objects with a string 'role' and a string "
                "(or text parts) 'content'")


def conversation_problem(v: Any) -> str | None:
    """None where ``v`` is a conversation: a non-empty list of objects with a string ``role``
    and a ``content`` that is a string or a list of text parts (OpenAI's ``{"type": "text",
    "text": ...}``, joined by ``joined``); else what is wrong, naming the message by its
    index (``messages[i]``), or CONVERSATION where ``v`` holds no object at all. An assistant
    message that calls tools (a non-empty ``tool_calls`` list) may have no content, or a null
    one, as OpenAI's clients send it (the template gets "", as vLLM gives it)."""
    if not isinstance(v, list) or not any(isinstance(m, dict) for m in v):
        return CONVERSATION
    for i, m in enumerate(v):
        content = m.get("content") if isinstance(m, dict) else None
        if content is None and isinstance(m, dict) and isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
            content = ""
        if isinstance(content, list):
            for p in content:
                if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                    return (f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) are "
                            f"supported; got {p!r:.60}")
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(content, (str, list))):
            return (f"messages[{i}]: expected an object with a string 'role' and a string (or text parts) "
                    f"'content'; got {m!r:.60}")
    return None


def is_messages(v: Any) -> bool:
    """Whether ``v`` is a conversation (``conversation_problem``)."""
    return conversation_problem(v) is None


def joined(messages: list[dict]) -> list[dict]:
    """A conversation with each message's text parts joined into one string content, a newline
    between two parts as vLLM joins them for a template that reads its content as a string (a
    tool calling message's missing or null content: "")."""
    return [{**m, "content": "\n".join(p["text"] for p in m["content"])} if isinstance(m.get("content"), list) else
            {**m, "content": ""} if m.get("content") is None else m for m in messages]


def read_prompt_file(path: Path, allow_ids: bool = True, lines: list[int] | None = None) -> list[dict[str, Any]]:
    """The objects of ``path``; UserError naming the file and line for anything else.
    ``allow_ids=False``: every line needs text, ``prompt`` or ``messages``. ``lines``: a list
    the objects' line numbers are appended to (blank lines are passed over, so a prompt's
    index is not its line)."""
    items = []
    for n, obj in json_lines(path):
        problem = conversation_problem(obj["messages"]) if isinstance(obj, dict) and "messages" in obj else None
        if problem:
            raise UserError(f"{path}:{n}: 'messages': {problem}")
        ok_text = isinstance(obj, dict) and (isinstance(obj.get("prompt"), str) or "messages" in obj)
        ids = obj.get("prompt_ids") if isinstance(obj, dict) else None
        if allow_ids and ids is not None and not (ids and is_token_ids(ids)):  # (its ids come first: never passed over)
            raise UserError(f"{path}:{n}: 'prompt_ids' must be a non-empty list of integer token ids; got {ids!r:.60}")
        ok_ids = allow_ids and bool(ids) and is_token_ids(ids)
        if not (ok_text or ok_ids):
            raise UserError(f"{path}:{n}: expected an object with a string field 'prompt' or a conversation "
                            "'messages'" + (" (or a non-empty list of token ids 'prompt_ids')" if allow_ids else ""))
        items.append(obj)
        if lines is not None:
            lines.append(n)
    if not items:
        raise UserError(f"{path}: no prompts")
    return items


def check_each(prompts: list, check, names: list[str]) -> list:
    """``check(p)`` of each prompt, every one checked before a UserError is raised: the first
    refused prompt's error, named by its ``names`` entry, then which others were refused too
    (a file's bad lines were said one run at a time), and that no prompt was decoded."""
    out, bad = [], []
    for name, p in zip(names, prompts):
        try:
            out.append(check(p))
        except UserError as e:
            bad.append((name, e))
    if not bad:
        return out
    more = [name for name, _ in bad[1:]]
    also = (f"; {len(more)} more {'is' if len(more) == 1 else 'are'} refused too ({', '.join(more[:3])}"
            f"{', ...' if len(more) > 3 else ''})" if more else "")
    raise UserError(f"{bad[0][0]}: {bad[0][1]}{also}; no prompt was decoded")


def template_notes(chat: bool, prompts: list, template_kwargs: dict | None) -> list[str]:
    """What run, calibrate and bench say of --chat beside token ids and of
    --chat-template-kwargs where no prompt goes through the template (``prompts`` as
    ``prompts_of`` gives them)."""
    notes = []
    ids = sum(is_token_ids(p) for p in prompts)
    if chat and ids:
        notes.append(f"--chat: {ids} of the {len(prompts)} prompts are token ids ('prompt_ids'), used as given, "
                     "without the chat template")
    if template_kwargs and not any(is_messages(p) or (chat and isinstance(p, str)) for p in prompts):
        notes.append("--chat-template-kwargs: no prompt goes through the chat template (text without --chat, token "
                     "ids), so its variables are not used")
    return notes


def prompts_of(items: list[dict[str, Any]]) -> list[str | list[int] | list[dict]]:
    """Each item's token ids when it has them, else its conversation, else its text."""
    return [obj["prompt_ids"] if isinstance(obj.get("prompt_ids"), list) else text_of(obj) for obj in items]


def text_of(obj: dict[str, Any]) -> str | list[dict]:
    """An item's conversation when it has one, else its text (``Text.encode`` takes either)."""
    return obj["messages"] if "messages" in obj else obj["prompt"]
