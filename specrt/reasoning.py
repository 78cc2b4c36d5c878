"""``specrt serve --reasoning-parser``: a chat answer's thinking split from its answer, as vLLM's
``qwen3`` and ``deepseek_r1`` reasoning parsers split it (vllm/reasoning/qwen3_reasoning_parser.py,
basic_parsers.py and docs/features/reasoning_outputs.md, as of 2026).

A thinking model (Qwen3, DeepSeek-R1 and its distills, QwQ) writes ``<think>`` reasoning
``</think>`` and then its answer. The parser gives the reasoning as the message's (or a
stream delta's) ``reasoning`` (vLLM's field now) and ``reasoning_content`` (its name until
vLLM renamed it, late 2025, and removed it, early 2026; DeepSeek's API, SGLang, llama.cpp and
most clients read it), the same text under both, and the text after ``</think>`` as
``content``; the tags themselves are sent in neither. As vLLM's:

* the answer starts inside the think block (a template that opens it in the prompt, Qwen3's
  2507 thinking models' and DeepSeek-R1's, leaves no ``<think>`` in the output; one the
  model writes, Qwen3's first release, is dropped), so an answer cut by max_tokens before
  ``</think>`` is all reasoning and its content null;
* it starts after the block where the template closed it in the prompt (Qwen3's
  ``enable_thinking: false`` renders ``<think>\n\n</think>\n\n``; vLLM's streaming path
  reads the prompt so, prompt_is_reasoning_end) or, for qwen3 alone, where the template
  variables say ``enable_thinking: false``: the whole answer is content and reasoning null;
* after ``</think>`` everything is content, tags included; nothing is stripped (the
  newlines after ``</think>`` stay at content's start, as vLLM sends them).

Where this differs from vLLM: a whole answer is split as a stream is (vLLM's non-streamed
qwen3 ignores a block the prompt closed unless ``enable_thinking`` false was given, and
gives the whole answer as reasoning: vllm-project/vllm#53284), and text before a ``<think>``
the model writes is kept as reasoning, streamed or not (vLLM's non-streamed parsers drop it;
its streamed ones send it as reasoning where it came in an earlier delta than the ``<think>``,
and qwen3's drops it from the ``<think>``'s own delta: here what is sent never depends on
where the pieces were cut, and no text the model wrote is lost).

Streamed, a piece that ends in what may be the start of a tag (``</th``) holds that back
until the next piece settles it, so a tag split across decoded pieces is never sent as
text; the held text is sent at the answer's end if no tag came. A whole answer goes through
the same pieces (``Apart``), and joins to what ``split`` gives its whole text at once.
"""

from __future__ import annotations

from typing import Generator, Iterator

from specrt.runtime.text import tag_start_at_end

PARSERS = ("qwen3", "deepseek_r1")
START, END = "<think>", "</think>"


def begins_thinking(parser: str, prompt_tail: str, template_kwargs: dict) -> bool:
    """Whether an answer starts inside its think block: not where the prompt's text
    (``prompt_tail``: its last tokens, special ones written) ends with the block closed,
    nor, for qwen3, with the template variable ``enable_thinking`` false."""
    if prompt_tail.rstrip().endswith(END):
        return False
    return not (parser == "qwen3" and template_kwargs.get("enable_thinking") is False)


def tags_problem(text, parser: str) -> str | None:
    """Why ``parser`` could never find where the thinking ends in answers decoded by ``text``
    (runtime.text.Text), or None: ``</think>`` made a special token, which an answer's text
    leaves out (Text.decode), so every answer would be all reasoning, its content null (a
    ``<think>`` special alone is harmless: the answer starts inside the block)."""
    if not text.special_among(END):
        return None
    return (f"--reasoning-parser {parser}: the tokenizer marks {END} as a special token, which an answer's text "
            "leaves out, so the thinking's end could never be found and every answer would be all reasoning, "
            "its content null (Qwen3's, DeepSeek-R1's and QwQ's tokenizers keep it as text)")


def prompt_tail(text, ids: list[int]) -> str:
    """The text of a prompt's last tokens with its special ones (a template's ``<think>`` may
    be one; ``Text.decode`` leaves them out): enough for ``<think>\\n\\n</think>\\n\\n``."""
    return text.tokenizer.decode([int(i) for i in ids[-32:]], skip_special_tokens=False)


class Splitter:
    """One answer's text, piece by piece, into (reasoning, content) pieces. ``thinking``:
    whether it starts inside the think block (``begins_thinking``)."""

    def __init__(self, thinking: bool):
        self.thinking = thinking  # inside the think block
        self.reasoned = thinking  # the answer had a think block: its reasoning is a text, not null
        self.opened = False  # a <think> was dropped (a second one is reasoning text)
        self.held = ""  # the end of the text so far that may begin a tag

    def push(self, piece: str) -> tuple[str, str]:
        """The reasoning and the content of ``piece`` (either may be empty: a tag, or
        text held back)."""
        text, self.held = self.held + piece, ""
        reasoning = ""
        while self.thinking:
            tags = (END,) if self.opened else (START, END)
            found = [(text.find(t), t) for t in tags if t in text]
            if not found:  # hold back the longest end that a tag begins with
                k = tag_start_at_end(text, *tags)
                self.held = text[len(text) - k:]
                return reasoning + text[:len(text) - k], ""
            at, tag = min(found)
            reasoning, text = reasoning + text[:at], text[at + len(tag):]
            self.opened = True
            self.thinking = tag == START
        return reasoning, text

    def flush(self) -> tuple[str, str]:
        """What was held back at the answer's end (no tag came): text of the part it was in."""
        held, self.held = self.held, ""
        return (held, "") if self.thinking else ("", held)


def split(text: str, thinking: bool) -> tuple[str | None, str | None]:
    """A whole answer's (reasoning, content), null as vLLM gives them: reasoning null where
    the answer had no think block (content then the whole text), content null where
    nothing followed ``</think>`` (or it never came)."""
    s = Splitter(thinking)
    r1, c1 = s.push(text)
    r2, c2 = s.flush()
    if not s.reasoned:
        return None, c1 + c2
    return r1 + r2, (c1 + c2) or None


class Apart:
    """``Server.complete``'s items for chat answers with a parser (``thinking``: where they
    start, ``begins_thinking``), each text piece's text its content part alone: its reasoning
    part is kept per choice, for the next stream chunk of the choice (``delta``) and for the
    whole answer's message (``fill``). A piece with nothing in either part (a tag, text held
    back) is not passed on; its logprob entries go with the choice's next item, so each
    token's entry is passed on once, in order. A choice's end passes on what was held back
    first (text that began a tag none finished). ``include`` false (a request's
    include_reasoning false, vLLM's): the reasoning is taken out and sent in neither. An
    iterator of items; ``close`` closes ``items``."""

    def __init__(self, items: Generator[dict, None, None], thinking: bool, include: bool = True):
        self.items, self.thinking, self.include = items, thinking, include
        self.splitters: dict[int, Splitter] = {}
        self.unsent: dict[int, str] = {}  # choice -> reasoning not yet in a stream chunk
        self.reasoning: dict[int, str] = {}  # choice -> its reasoning so far
        self._apart = self._pieces()

    def __iter__(self) -> Apart:
        return self

    def __next__(self) -> dict:
        return next(self._apart)

    def close(self) -> None:
        self._apart.close()
        self.items.close()  # (closed already where the loop began)

    def _pieces(self) -> Iterator[dict]:
        carried: dict[int, list] = {}  # choice -> logprob entries not yet passed on

        def entries(i: int, more: list | None) -> list | None:
            kept = carried.pop(i, None)
            return more if kept is None else kept + (more or [])

        try:
            for item in self.items:
                if "index" not in item:  # the usage and specrt at the end
                    yield item
                    continue
                i = item["index"]
                s = self.splitters.setdefault(i, Splitter(self.thinking))
                reasoning, content = s.push(item["text"]) if "text" in item else s.flush()
                self.reasoning[i] = self.reasoning.get(i, "") + reasoning
                self.unsent[i] = self.unsent.get(i, "") + (reasoning if self.include else "")
                if "text" in item:
                    if reasoning or content:
                        yield {**item, "text": content, "logprobs": entries(i, item["logprobs"])}
                    elif item["logprobs"] is not None:
                        carried[i] = entries(i, item["logprobs"])
                    continue
                if reasoning or content:  # the choice's end: what was held back, then its finish
                    yield {"index": i, "text": content, "logprobs": carried.pop(i, None), "context": item["context"],
                           "tokens": item["tokens"]}
                yield {**item, "logprobs": entries(i, item["logprobs"])}
        finally:
            self.items.close()

    def delta(self, i: int, delta: dict | None) -> dict | None:
        """A stream chunk's ``delta`` for choice ``i`` (its content, or None at its finish) with
        the choice's reasoning not yet sent: ``reasoning`` and ``reasoning_content`` beside
        ``content``, neither empty; the role's first chunk as it is."""
        if delta is not None and "role" in delta:
            return delta
        reasoning, content = self.unsent.pop(i, ""), (delta or {}).get("content")
        d = {"reasoning": reasoning, "reasoning_content": reasoning} if reasoning else {}
        d.update((k, v) for k, v in (delta or {}).items() if k != "content")  # (tool_calls: tool_calls.Streamed)
        return {**d, "content": content} if content else d or delta

    def fill(self, choices: list[dict]) -> None:
        """The whole answers' messages (``choices``, their content the content parts joined)
        with their reasoning, null as vLLM gives it: reasoning null where the answer had no
        think block, content null where nothing followed ``</think>`` (or it never came)."""
        for c in choices:
            m = c["message"]
            m["reasoning"] = m["reasoning_content"] = (self.reasoning.get(c["index"], "") if self.thinking
                                                       and self.include else None)
            if self.thinking and m.get("content") == "":
                m["content"] = None
