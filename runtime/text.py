"""Text in and out: the exported tokenizer, its chat template, incremental decoding.

Only the ``tokenizers`` library and a sandboxed Jinja environment are used: the chat
template is data from the checkpoint and is rendered in jinja2's immutable sandbox,
never executed as Python.
"""

from __future__ import annotations

import json
from pathlib import Path

from specrt.errors import UserError


class Text:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        tok = folder / "tokenizer.json"
        if not tok.is_file():
            raise UserError(f"{folder}: no tokenizer.json (export the target from a folder that has one)")
        self.tokenizer = Tokenizer.from_file(str(tok))
        cfg_path = folder / "tokenizer_config.json"
        self.config = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
        template = self.config.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        self.chat_template = template if isinstance(template, str) else None
        self.vocab_size = self.tokenizer.get_vocab_size()
        self._bytes: tuple | None = None  # token_bytes' table, made on first use

    def _special(self, key: str) -> str:
        v = self.config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else ""

    def render_chat(self, user: str | list[dict]) -> str:
        """The chat template over one user message, or a conversation (``messages``:
        role/content objects, a system prompt and earlier turns included), then the
        assistant's turn."""
        if self.chat_template is None:
            raise UserError("--chat: the exported tokenizer has no chat template (tokenizer_config.json chat_template)")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg):
            raise UserError(f"chat template: {msg}")

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=[{"role": "user", "content": user}] if isinstance(user, str) else list(user),
            add_generation_prompt=True,
            bos_token=self._special("bos_token"), eos_token=self._special("eos_token"))

    def encode(self, prompt: str | list[dict], chat: bool) -> list[int]:
        """Token ids of a text prompt (through the chat template when ``chat``) or of a
        conversation (always through it)."""
        if not prompt:
            raise UserError("the prompt is empty")
        chat = chat or not isinstance(prompt, str)
        text = self.render_chat(prompt) if chat else prompt
        # A rendered template already holds its special tokens.
        return self.tokenizer.encode(text, add_special_tokens=not chat).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_bytes(self, i: int) -> bytes:
        """The bytes token ``i`` stands for (logprobs' ``bytes``): a byte-level BPE piece
        (SmolLM2, Llama 3, Qwen3) through GPT-2's byte-to-character table, so a piece that is
        half a UTF-8 character gives its own bytes; a SentencePiece byte token ``<0xNN>``
        its byte, its ``▁`` a space; an added token its content; anything else its own
        decoding."""
        if self._bytes is None:
            self._bytes = _byte_table(self.tokenizer)
        piece = self.tokenizer.id_to_token(int(i))
        if piece is None:
            raise UserError(f"token id {i} is not in the tokenizer's vocabulary")
        kind, table, added = self._bytes
        if piece in added:
            return piece.encode()
        if kind == "bytelevel" and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
        if kind == "metaspace":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            return piece.replace("\u2581", " ").encode()
        return self.tokenizer.decode([int(i)], skip_special_tokens=False).encode()

    def token_text(self, i: int) -> str:
        """Token ``i`` as text, or OpenAI's ``bytes:\\xNN...`` when its bytes are not whole
        UTF-8 characters."""
        b = self.token_bytes(i)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


def _byte_table(tokenizer) -> tuple[str, dict[str, int], set[str]]:
    """(kind, character -> byte of GPT-2's byte-level alphabet, added tokens' contents) of a
    tokenizer: kind "bytelevel" when its decoder is (or holds) ByteLevel, "metaspace" for
    SentencePiece-style decoders (Metaspace, ByteFallback), else "other"."""
    spec = json.loads(tokenizer.to_str())
    kinds, todo = set(), [spec.get("decoder") or {}]
    while todo:
        d = todo.pop()
        if isinstance(d, dict):
            kinds.add(d.get("type"))
            todo += d.get("decoders") or []
    kind = "bytelevel" if "ByteLevel" in kinds else "metaspace" if kinds & {"Metaspace", "ByteFallback"} else "other"
    # GPT-2's table: printable Latin-1 bytes stand for themselves, the other 68 bytes for
    # the characters from U+0100 on, in byte order
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
              *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table, extra = {chr(b): b for b in direct}, 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + extra)] = b
            extra += 1
    added = {t["content"] for t in spec.get("added_tokens") or [] if isinstance(t.get("content"), str)}
    return kind, table, added


def tokens_through(text: "Text", ids: list[int], end: int) -> int:
    """The fewest of ``ids`` whose text holds the first ``end`` characters of the whole
    text of ``ids``: how many tokens it took to write them (a bisection: a longer prefix
    of tokens writes a longer prefix of the text)."""
    whole = text.decode(ids)[:end]
    lo, hi = 0, len(ids)
    while lo < hi:
        k = (lo + hi) // 2
        if text.decode(ids[:k]).startswith(whole):
            hi = k
        else:
            lo = k + 1
    return lo


class Detokenizer:
    """Incremental decoding: ``push(ids)`` returns only the text that is now final.

    Decoding the whole generated list each time is O(n^2) over a run but handles every
    byte-level merge exactly; a trailing U+FFFD (half a UTF-8 character) is held back.
    """

    def __init__(self, text: Text):
        self.text = text
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, ids) -> str:
        self.ids.extend(int(i) for i in ids)
        s = self.text.decode(self.ids)
        if s.endswith("\ufffd"):
            return ""
        piece, self.emitted = s[self.emitted:], len(s)
        return piece

    @property
    def full(self) -> str:
        return self.text.decode(self.ids)


class StopScanner:
    """Stop strings over streamed text: ``push(piece)`` returns the text that is safe to
    emit now, ``hit`` turns True at the first stop string (which, and what follows it,
    is never emitted), ``flush()`` returns what was held back once the stream ends;
    ``stop_end`` is then where that stop string ends in the whole text.

    Up to ``max(len(stop)) - 1`` characters are held back, since they could begin a stop
    string. Where several stop strings occur, the one that is complete first in the text
    wins (the smallest end; at the same end the longer one): the result is then the same
    however the text arrives in pieces, one token at a time or a verify round's burst.
    """

    def __init__(self, stops=()):
        stops = tuple(stops)
        for s in stops:
            if not isinstance(s, str) or not s:
                raise UserError(f"stop string {s!r}: expected a non-empty string")
        self.stops = stops
        self.keep = max((len(s) for s in stops), default=1) - 1
        self.held = ""
        self.hit = False
        self.offset = 0  # characters of the whole text before ``held``
        self.stop_end: int | None = None

    def push(self, piece: str) -> str:
        if self.hit:
            return ""
        held = self.held + piece
        if not self.stops:
            self.held = ""
            return held
        best = None  # (end, start) of the stop string complete first
        for s in self.stops:
            i = held.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best):
                best = (i + len(s), i)
        if best is not None:
            self.hit, self.held, self.stop_end = True, "", self.offset + best[0]
            return held[: best[1]]
        cut = len(held) - self.keep
        if cut <= 0:
            self.held = held
            return ""
        self.held, self.offset = held[cut:], self.offset + cut
        return held[:cut]

    def flush(self) -> str:
        out, self.held = ("" if self.hit else self.held), ""
        return out
