"""Text in and out: the exported tokenizer, its chat template, incremental decoding.

Only the ``tokenizers`` library and a sandboxed Jinja environment are used: the chat
template is data from the checkpoint and is rendered in jinja2's immutable sandbox,
never executed as Python.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from specrt.errors import UserError, json_problem
from specrt.paths import json_object, read_json_object, read_utf8
from specrt.prompt_files import CONVERSATION, conversation_problem, joined


SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def load_tokenizer(path: Path):
    """``tokenizers.Tokenizer`` of a tokenizer.json, errors naming the file (export checks the
    target's with it; an export made before that may hold one it cannot read). The file is read
    once and parsed by tokenizers; only text it refuses is parsed as JSON too, to say what is
    wrong in read_json_object's words (not valid JSON, not an object) before tokenizers' own."""
    from tokenizers import Tokenizer

    text = read_utf8(path)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises a bare Exception for any text it cannot read
        why = e
    json_object(text, path)
    raise UserError(f"{path}: not a tokenizer the tokenizers library reads ({why})")


def not_text(text: str, subject: str) -> str | None:
    """The error for ``text`` (said as ``subject``) where it is no UTF-8 text, else None: bytes
    that were not UTF-8 reach Python as lone surrogates (a shell's, a pipe's), and a lone
    surrogate code point (JSON's "\\ud800" escapes one) encodes as no text."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        c, before = text[e.start], text[max(0, e.start - 20):e.start]
    # (one at the start was said "after ''": h73a's report, session 73)
    where = f"after {before!r}" if before else "at its start"
    if 0xDC80 <= ord(c) <= 0xDCFF:  # a byte that was not UTF-8, carried as Python carries it
        return (f"{subject} is not valid UTF-8 text (byte 0x{ord(c) - 0xDC00:02x} {where}; or a JSON "
                f"\\u{ord(c):04x} escape, a UTF-16 half)")
    return (f"{subject} holds a lone surrogate U+{ord(c):04X} ({where}), which is not text: a UTF-16 "
            f"half without its pair (a JSON \\u{ord(c):04x} escape?)")



KEEP_IDS = 1 << 17  # token ids Text.ids_of keeps of its last text (1 MB packed; past 131072: none)


class Text:
    def __init__(self, folder: Path):

        folder = Path(folder)
        tok = folder / "tokenizer.json"
        if not tok.is_file():
            raise UserError(f"{folder}: no tokenizer.json (export the target from a folder that has one)")
        self.tokenizer = load_tokenizer(tok)
        # as transformers encodes a prompt: a tokenizer.json saved with truncation or padding on
        # (saved after a call that asked for them) cut every prompt to its max_length, or padded
        # it, without a word (transformers turns both off unless a call asks)
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        cfg_path = folder / "tokenizer_config.json"
        self.config = read_json_object(cfg_path) if cfg_path.is_file() else {}
        # split_special_tokens: a special token's text in a prompt is text, as transformers encodes it
        self.tokenizer.encode_special_tokens = self.config.get("split_special_tokens") is True
        stm = folder / "special_tokens_map.json"
        if "added_tokens_decoder" not in self.config and stm.is_file():
            # a tokenizer saved before transformers 4.34: transformers lays special_tokens_map.json's
            # tokens over tokenizer_config.json's (both may name them; either alone may)
            named = read_json_object(stm)
            self.config = {**self.config, **{k: v for k, v in named.items()
                                             if k in SPECIAL_TOKENS or k == "additional_special_tokens"}}
        template = self.config.get("chat_template")
        named = template if isinstance(template, list) else []  # transformers' named templates: the "default"
        template = next((t.get("template") for t in named if isinstance(t, dict) and t.get("name") == "default"),
                        template)  # one, and "tool_use" where tools are passed (render_chat)
        tool_use = next((t.get("template") for t in named if isinstance(t, dict) and t.get("name") == "tool_use"), None)
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            try:
                template = jinja.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:  # (a template saved in Latin-1: a traceback in every command)
                raise UserError(f"{jinja}: not valid UTF-8 text ({e.reason} at byte {e.start}); a chat template "
                                "is read as UTF-8") from None
        self.chat_template = template if isinstance(template, str) else None
        self.tool_template = tool_use if isinstance(tool_use, str) and not jinja.is_file() else self.chat_template
        # the file it came from, named by its errors (a broken template said "chat template: ..." alone)
        self.template_file = jinja if jinja.is_file() else cfg_path
        self.vocab_size = self.tokenizer.get_vocab_size()
        self._bytes: tuple | None = None  # token_bytes' table, made on first use
        self._fallback: frozenset | None = None  # byte_fallback_ids, made on first use
        self._bound: tuple | None = None  # _token_bound's ((0, []): none known), found on first use
        self._last_ids: tuple | None = None  # ids_of's last (raw, text, ids)
        self._dropped: frozenset | None = None  # decode's special tokens left out, where keep_special keeps some
        self.kept: Text | None = None  # keep_special's view
        # the engines' context, where a Session sets it: a text of as many ids is refused, never streamed
        # after, so not kept (serve held the last prompt it refused, 13 MB of text: r74)
        self.context: int | None = None

    def _special(self, key: str) -> str:
        v = self.config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return v if isinstance(v, str) else ""

    def render_chat(self, user: str | list[dict], template_kwargs: dict | None = None,
                    chat_option: str = "chat=True", tools: list[dict] | None = None, generation: bool = True) -> str:
        """The chat template over one user message, or a conversation (``messages``:
        role/content objects, a system prompt and earlier turns included), then the
        assistant's turn. Rendered as transformers' ``apply_chat_template`` renders it
        (its Jinja environment: loop controls, ``{% generation %}`` blocks, its ``tojson``,
        ``strftime_now`` and ``raise_exception``; the tokenizer's special tokens, ``tools``
        (function definitions, OpenAI's {"type": "function", "function": {...}} objects, as
        transformers passes them; with them a named "tool_use" template where there is one,
        as transformers picks it) and ``documents`` none), ``template_kwargs`` passed to the
        template as variables (e.g. Qwen3's ``enable_thinking``); ``generation`` False leaves the
        assistant's turn out (add_generation_prompt, `specrt serve`'s /tokenize). Without a chat
        template, a UserError naming what
        asked for it: ``chat_option`` for a text (the API's ``chat=True``, the CLI's
        ``--chat``), or the conversation."""
        if self.chat_template is None:
            asked = chat_option if isinstance(user, str) else "a conversation (a list of messages)"
            raise UserError(f"{asked}: the exported tokenizer has no chat template (tokenizer_config.json "
                            "chat_template)")
        variables = {**self._special_tokens(), "tools": tools, "documents": None,
                     **template_kwargs_of(template_kwargs, "chat template variables")}
        import jinja2

        messages = [{"role": "user", "content": user}] if isinstance(user, str) else \
            [_message(m, i) for i, m in enumerate(user)]
        try:
            template = _template(self.chat_template if tools is None else self.tool_template)
            try:
                return template.render(messages=messages, add_generation_prompt=generation, **variables)
            except TypeError as e:  # a template that joins a call's arguments to text (DeepSeek-R1's and V3's
                # '...' + tool['function']['arguments']) failed on the parsed object, a second turn a 400: it gets
                # them as sent, as transformers passes them (w76c); its other type errors stay errors
                sent = None if isinstance(user, str) else [_message(m, i, False) for i, m in enumerate(user)]
                if sent is None or sent == messages:
                    raise
                try:
                    return template.render(messages=sent, add_generation_prompt=generation, **variables)
                except TypeError:
                    raise e from None
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, ArithmeticError, LookupError,
                RecursionError) as e:  # (a message of other types than the template expects fails in it; a
            # template's own sums, a macro calling itself and the sandbox's range limit were tracebacks)
            raise UserError(f"{self.template_file}: chat template: {type(e).__name__}: {e}") from None
        except UserError as e:  # not valid Jinja, or its raise_exception
            raise UserError(f"{self.template_file}: {e}") from None

    @property
    def eos_token(self) -> str | None:
        """tokenizer_config.json's eos_token (None: it names none)."""
        return self._special("eos_token") or None

    def template_reads(self, template: str) -> set[str]:
        """The names ``template`` (the chat template, or the "tool_use" one) reads without setting
        them itself (jinja2.meta's undeclared variables; its environment's functions are none of
        them): ``unread_note``'s and tool_calls.tools_unread's, which each asked jinja2 themselves
        (NOTES s75). UserError naming the file where it is not valid Jinja."""
        import jinja2.meta

        try:
            return jinja2.meta.find_undeclared_variables(_template(template).environment.parse(template))
        except UserError as e:  # (unread_note's said "chat template: not valid Jinja", no file)
            raise UserError(f"{self.template_file}: {e}") from None

    def unread_note(self, variables: dict) -> str | None:
        """Which of ``variables`` the chat template reads nowhere (a variable it does not name
        changes nothing: a misspelt one, or one of another model's template), and the ones of
        its own it does read; None when it reads them all, or there is no template."""
        if not variables or self.chat_template is None:
            return None
        read = self.template_reads(self.chat_template)
        unread = [k for k in variables if k not in read]
        if not unread:
            return None
        given = {"messages", "add_generation_prompt", "tools", "documents", "additional_special_tokens",
                 *SPECIAL_TOKENS}  # (its environment's functions: none of the names read, m73x-11)
        own = sorted(read - given - _set_untested(self.chat_template))
        return (f"{', '.join(map(repr, unread))}: the chat template ({self.template_file}) reads no such variable, so "
                f"{'it changes' if len(unread) == 1 else 'they change'} nothing (the variables of its own it reads: "
                f"{', '.join(own) if own else 'none'})")

    def _special_tokens(self) -> dict:
        """tokenizer_config.json's special tokens (special_tokens_map.json's over them for a
        tokenizer saved before transformers 4.34) as transformers' ``special_tokens_map``
        gives them to a chat template: those it names, each left undefined when absent (bos and
        eos too, in transformers 4.57 and 5: Qwen3 names no bos_token)."""
        out = {k: self._special(k) for k in SPECIAL_TOKENS if self._special(k)}
        extra = self.config.get("additional_special_tokens")
        if isinstance(extra, list):
            out["additional_special_tokens"] = [t.get("content") if isinstance(t, dict) else t for t in extra]
        return out

    def encode(self, prompt: str | list[dict], chat: bool, template_kwargs: dict | None = None,
               chat_option: str = "chat=True", check_length=None, tools: list[dict] | None = None) -> list[int]:
        """Token ids of a text prompt (through the chat template when ``chat``) or of a
        conversation (always through it, with ``template_kwargs``); ``chat_option``: how an
        error names what set ``chat`` (``render_chat``). ``check_length(n, True)``, where
        given, is called before the text is tokenized with ``least_tokens`` of it, to refuse a
        prompt surely past the context there (a 5 MB line took a minute and 1.5 GB to be
        tokenized, then refused). ``tools``: the template's (``render_chat``)."""
        text = self.prompt_text(prompt, chat, template_kwargs, chat_option, tools)
        if check_length is not None:
            check_length(self.least_tokens(text), True)
        return self.ids_of(text, isinstance(prompt, str) and not chat)

    def ids_of(self, text: str, raw: bool) -> list[int]:
        """Token ids of ``prompt_text``'s ``text``: a text prompt's where ``raw`` (the tokenizer's
        special tokens added), else a rendered template's, which already holds its special tokens.
        The last text's ids are kept: a caller that measures a prompt and then streams it tokenized
        the same text again (`specrt chat`'s turns did, a long paste seconds a turn: h74e; its
        stream now takes the ids it measured, r74). Kept packed, and only up to KEEP_IDS of them:
        a prompt of 2M tokens refused by serve held 79.5 MB of Python ints until the next request
        (r74); and none of a prompt that fills the ``context`` a Session sets: it is refused,
        never streamed after (serve held such a prompt's text, 13 MB: r74)."""
        import array

        last = self._last_ids
        if last is not None and last[0] == raw and last[1] == text:
            return last[2].tolist()
        # (encode_batch lets the interpreter's lock go, encode held it: serve's other threads, an answer
        # being made among them, stopped while a long prompt was tokenized; the same ids)
        ids = self.tokenizer.encode_batch([text], add_special_tokens=raw)[0].ids
        if not ids and not raw:  # (said "the prompt is empty" of a conversation that was not, naming no template)
            raise UserError(f"{self.template_file}: chat template: rendered the conversation as an empty prompt")
        # (a prompt of the whole context leaves no room for the answer's first token: refused too)
        keep = len(ids) <= KEEP_IDS and (self.context is None or len(ids) < self.context)
        self._last_ids = (raw, text, array.array("q", ids)) if keep else None
        return ids

    def prompt_text(self, prompt: str | list[dict], chat: bool, template_kwargs: dict | None = None,
                    chat_option: str = "chat=True", tools: list[dict] | None = None, generation: bool = True) -> str:
        """The text ``encode`` tokenizes: the prompt checked, and rendered through the chat
        template where it goes through it (``generation``: ``render_chat``'s)."""
        if not prompt and not (chat and isinstance(prompt, str)):  # ('' with --chat: a user turn with no text,
            # rendered as a conversation of one empty message is, and as transformers and vLLM render it)
            raise UserError("the prompt is empty")
        problem = None if isinstance(prompt, str) else conversation_problem(prompt)
        if problem == CONVERSATION:
            raise UserError(f"{problem}; got {prompt!r:.80}")
        if problem:  # (the message named: a long conversation's bad one was hard to find)
            raise UserError(f"a conversation's {problem}")
        if not isinstance(prompt, str):
            prompt = joined(prompt)
        chat = chat or not isinstance(prompt, str)
        text = self.render_chat(prompt, template_kwargs, chat_option, tools, generation) if chat else prompt
        if (problem := not_text(text, "the prompt")) is not None:
            raise UserError(problem)
        return text

    def least_tokens(self, text: str) -> int:
        """A lower bound on the tokens of ``text`` (the tokenizer's input, ``prompt_text``),
        found without tokenizing it: its UTF-8 bytes that some token holds over the most bytes one
        token stands for (``_token_bound``); 0 for a tokenizer where no such bound is known."""
        if self._bound is None:
            self._bound = _token_bound(json.loads(self.tokenizer.to_str())) or (0, [])
        most, unheld = self._bound
        if not most:
            return 0
        data = text.encode("utf-8")
        return -(-(len(data) - sum(data.count(b) for b in unheld)) // most)

    def decode(self, ids: list[int]) -> str:
        if self._dropped is None:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode([i for i in ids if i not in self._dropped], skip_special_tokens=False)

    def keep_special(self, *contents: str) -> Text:
        """A view of this text (also kept as ``kept``) whose ``decode`` keeps the special tokens
        ``contents`` in its text (every other special token still left out, as
        skip_special_tokens leaves them); this text's own is unchanged: serve's mistral tool-call
        parser reads Mistral's [TOOL_CALLS], a special token, in the answers to requests with
        tools, which vLLM decodes with special tokens for that parser, and those alone (every
        answer kept it, requests without tools, /detokenize and echo too: h76b's note, h76f)."""
        view = copy.copy(self)
        special = {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        view._dropped = frozenset(i for i, c in special.items() if c not in contents)
        view._fallback, view.kept = None, None  # (byte_fallback_ids: a kept one is text)
        self.kept = view
        return view

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

    @property
    def byte_fallback_ids(self) -> frozenset:
        """Ids of the ``<0xNN>`` byte tokens when the decoder has ByteFallback (SentencePiece
        style: Llama 2, Mistral), else none; with them the special tokens, which ``decode``
        leaves out. ByteFallback decodes a run of byte tokens together (special tokens
        between them left out): a run that is not UTF-8 decodes to one U+FFFD per token, so
        a byte token's text is final only once a token that is neither ends the run."""
        if self._fallback is None:
            kinds = _decoder_kinds(json.loads(self.tokenizer.to_str()))
            vocab = self.tokenizer.get_vocab(with_added_tokens=False) if "ByteFallback" in kinds else {}
            fallback = {i for p, i in vocab.items() if len(p) == 6 and p.startswith("<0x") and p.endswith(">")}
            special = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
            if self._dropped is not None:  # (keep_special's are text: they end a run)
                special &= self._dropped
            self._fallback = frozenset(fallback | special if fallback else ())
        return self._fallback

    def special_among(self, *contents: str) -> list[str]:
        """Which of ``contents`` the tokenizer marks as special tokens, sorted: an answer's text
        (``decode``) leaves them out, so a parser that looks for them there never sees them
        (serve's tool-call and reasoning parsers refuse such a tokenizer at the start)."""
        return sorted(t.content for t in self.tokenizer.get_added_tokens_decoder().values()
                      if t.special and t.content in contents)

    def token_text(self, i: int) -> str:
        """Token ``i`` as text, or OpenAI's ``bytes:\\xNN...`` when its bytes are not whole
        UTF-8 characters."""
        b = self.token_bytes(i)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


# the names a message's reasoning comes under, the first the one chat templates read (Qwen3's);
# gpt-oss's template reads "thinking", and vLLM's responses call it "reasoning"
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _message(m: dict, i: int = 0, parse: bool = True) -> dict:
    """A message as transformers' apply_chat_template gives it to the template: keys whose
    value is null left out (an OpenAI message's "tool_calls": null is no tool call to a
    template testing 'tool_calls' in it), and its reasoning, under any of REASONING_FIELDS,
    also as ``reasoning_content`` and (unless it has its own) ``thinking``: an assistant's
    "reasoning" that a client sends back reached no Qwen3 template. Its tool calls'
    ``arguments``, a JSON string as OpenAI sends them, as the object they hold (vLLM's, and
    what tool-use templates expect: Llama 3.1's writes ``arguments | tojson``; "" or null: {}),
    and an empty ``tool_calls`` left out (the template's plain assistant turn); ``i``: the
    message's index, for errors; ``parse`` False: the arguments as sent (``render_chat``)."""
    m = {k: v for k, v in m.items() if v is not None}
    if m.get("tool_calls") == []:
        del m["tool_calls"]
    if isinstance(m.get("tool_calls"), list) and parse:
        m["tool_calls"] = [_tool_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])]
    reasoning = next((m[k] for k in REASONING_FIELDS if k in m), None)
    return m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning}


def _tool_call(c, where: str):
    """An assistant's tool call with its function's JSON ``arguments`` parsed (``_message``)."""
    f = c.get("function") if isinstance(c, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("arguments"), (str, type(None))):
        return c
    try:
        args = json.loads(f["arguments"]) if f.get("arguments") else {}
    except (ValueError, RecursionError) as e:
        raise UserError(f"{where}.function.arguments: not valid JSON ({json_problem(e)}); expected the call's "
                        "arguments as a JSON string") from None
    return {**c, "function": {**f, "arguments": args}}


def _set_untested(source: str) -> set[str]:
    """The names a chat template sets itself and never tests ``is defined`` nor gives a
    ``default``: jinja2.meta finds one set in a branch "undeclared", so ``unread_note`` named
    Llama 3.1's system_message and tool_call, Qwen3's content, as variables of its own (w76c);
    Llama's date_string, tested before it is set, is one."""
    from jinja2 import nodes

    tree = _template(source).environment.parse(source)
    tested = {n.node.name for n in tree.find_all((nodes.Test, nodes.Filter)) if isinstance(n.node, nodes.Name)
              and n.name in (("defined", "undefined") if isinstance(n, nodes.Test) else ("default", "d"))}
    return {n.name for a in tree.find_all((nodes.Assign, nodes.AssignBlock))
            for n in (a.target, *a.target.find_all(nodes.Name)) if isinstance(n, nodes.Name)} - tested


def template_kwargs_of(value, where: str) -> dict:
    """Chat template variables given as a JSON object (text, as on the command line, or
    already parsed, as in a request): a dict of names to JSON values, or UserError naming
    ``where``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg}); expected an object such as "
                            '\'{"enable_thinking": false}\'') from None
        except (ValueError, RecursionError) as e:  # (a number past Python's digit limit for int, or arrays
            # nested past the recursion limit: tracebacks)
            raise UserError(f"{where}: not valid JSON ({json_problem(e)})") from None
        if value is None:  # (typed "null": a request's null is "not given", a command line's a slip, as "[]" is)
            raise UserError(f"{where}: expected a JSON object of template variable names to values, found null")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isidentifier() for k in value):
        raise UserError(f"{where}: expected a JSON object of template variable names to values, found {value!r}")
    for k in ("messages", "add_generation_prompt"):
        if k in value:
            raise UserError(f"{where}: '{k}' is set by specrt, not a template variable to pass")
    return dict(value)


_TEMPLATES: dict = {}  # chat template text -> its compiled template


def _template(source: str):
    """A chat template compiled in jinja2's immutable sandbox with what transformers'
    environment adds (chat_template_utils._compile_jinja_template): trim_blocks and
    lstrip_blocks, the ``loopcontrols`` extension ({% break %}, {% continue %}), a
    ``{% generation %}`` block that renders its body (transformers tracks it for assistant
    masks), ``tojson`` without HTML escaping, ``strftime_now(format)`` (today's date:
    Llama 3.1's system prompt states it) and ``raise_exception`` (a UserError here)."""
    if source in _TEMPLATES:
        return _TEMPLATES[source]
    import datetime

    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    def raise_exception(msg):
        raise UserError(f"chat template: {msg}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise UserError(f"chat template: not valid Jinja (line {e.lineno}: {e.message})") from None
    _TEMPLATES[source] = compiled
    return compiled


def _decoder_kinds(spec: dict) -> set:
    """The types of a tokenizer's decoder and of the decoders a Sequence holds (``spec``: its
    tokenizer.json, parsed)."""
    kinds, todo = set(), [spec.get("decoder") or {}]
    while todo:
        d = todo.pop()
        if isinstance(d, dict):
            kinds.add(d.get("type"))
            todo += d.get("decoders") or []
    return kinds


def _token_bound(spec: dict) -> tuple[int, list[bytes]] | None:
    """(the most UTF-8 bytes of a text that one token of the tokenizer ``spec``, its
    tokenizer.json parsed, stands for; the bytes no token holds, which BPE drops or makes
    unknown), from which a text of B bytes, D of them such bytes, has at least (B - D) / that
    many tokens. Known only for byte-level BPE (SmolLM2, Llama 3) with nothing that can shorten
    the text otherwise: no normalizer (NFC, say, makes 3 bytes of "e" and a combining accent 2),
    pre-tokenizers that only split (a Split that removes what it matches drops text), no added
    token that takes the spaces beside it (lstrip, rstrip), a post-processor that only adds
    tokens. There each byte is one character of the byte-level alphabet and a vocabulary token
    covers its length of them; an added token its content's bytes. Else None."""
    model, pre, post = spec.get("model") or {}, spec.get("pre_tokenizer") or {}, spec.get("post_processor")
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    splits_only = all(isinstance(p, dict) and (p.get("type") == "ByteLevel" or p.get("type") == "Split"
                                               and p.get("behavior") != "Removed") for p in steps or [None])
    posts = (post.get("processors") if post.get("type") == "Sequence" else [post]) if isinstance(post, dict) else []
    adds_only = all(isinstance(p, dict) and (p.get("type") == "ByteLevel" or p.get("type") == "TemplateProcessing"
                                             and {"Sequence": {"id": "A", "type_id": 0}} in (p.get("single") or []))
                    for p in posts or [])
    vocab, added = model.get("vocab"), spec.get("added_tokens") or []
    if (spec.get("normalizer") is not None or not splits_only or not any(p.get("type") == "ByteLevel" for p in steps)
            or not adds_only or model.get("type") != "BPE" or not isinstance(vocab, dict) or not vocab
            or any(t.get("lstrip") or t.get("rstrip") or not isinstance(t.get("content"), str) for t in added)):
        return None
    # (SmolLM2 holds no 0xc0, 0xc1, 0xf5-0xff, never in UTF-8, nor the control characters 0x04, 0x06, ...)
    unheld = [bytes([b]) for b, c in enumerate(_byte_table_chars()) if c not in vocab]
    return max([len(p) for p in vocab] + [len(t["content"].encode("utf-8")) for t in added]), unheld


def _byte_table_chars() -> list[str]:
    """GPT-2's byte-level alphabet in byte order: printable Latin-1 bytes stand for
    themselves, the other 68 bytes for the characters from U+0100 on."""
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
              *range(ord("\u00ae"), ord("\u00ff") + 1)]
    out, extra = [], 0
    for b in range(256):
        if b in direct:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def _byte_table(tokenizer) -> tuple[str, dict[str, int], set[str]]:
    """(kind, character -> byte of GPT-2's byte-level alphabet, added tokens' contents) of a
    tokenizer: kind "bytelevel" when its decoder is (or holds) ByteLevel, "metaspace" for
    SentencePiece-style decoders (Metaspace, ByteFallback), else "other"."""
    spec = json.loads(tokenizer.to_str())
    kinds = _decoder_kinds(spec)
    kind = "bytelevel" if "ByteLevel" in kinds else "metaspace" if kinds & {"Metaspace", "ByteFallback"} else "other"
    table = {c: b for b, c in enumerate(_byte_table_chars())}
    added = {t["content"] for t in spec.get("added_tokens") or [] if isinstance(t.get("content"), str)}
    return kind, table, added


def context_of(text: "Text", prompt_ids) -> list[int]:
    """The prompt's last tokens that a completion is decoded after (``Detokenizer``), so that
    its text is the text it adds after the prompt's: a SentencePiece (Metaspace) decoder
    drops the space before a text's first word, and a word-level one puts a space between
    words, so a completion decoded alone (transformers' ``decode(out[len(prompt):])``) lost
    the space before its first word ("Hello" + " world" read "world"; vLLM decodes after
    the prompt's last tokens too). The fewest of the last 4 to 24 that decode without
    U+FFFD (none begins or ends inside a character: byte-level BPE's text is then the
    completion's own decoding, unchanged), after a trailing run of ByteFallback byte tokens
    is left out (a completion's byte tokens would decode in one run with them); none when
    no such tail is found."""
    ids = [int(i) for i in prompt_ids]
    fallback = text.byte_fallback_ids
    while ids and ids[-1] in fallback:
        ids.pop()
    for n in range(min(4, len(ids)), min(24, len(ids)) + 1):
        if "\ufffd" not in text.decode(ids[len(ids) - n:]):
            return ids[len(ids) - n:]
    return []


def completion_text(text: "Text", ids: list[int], context: list[int] = (), before: str | None = None) -> str:
    """The text ``ids`` add after the text of ``context`` (``context_of``); ``before``: that
    text, when the caller has it (the same decoding, kept: Detokenizer, tokens_through)."""
    if not context:
        return text.decode(ids)
    before = text.decode(list(context)) if before is None else before
    whole = text.decode(list(context) + list(ids))
    # (a decoder that rewrote the context's text where the two meet: the completion alone)
    return whole[len(before):] if whole.startswith(before) else text.decode(ids)


def tokens_through(text: "Text", ids: list[int], end: int, context: list[int] = ()) -> int:
    """The fewest of ``ids`` whose text (after ``context``'s, ``completion_text``) holds the
    first ``end`` characters of the whole text of ``ids``: how many tokens it took to write
    them. A bisection over the cuts
    outside runs of ByteFallback byte tokens (there a longer prefix of tokens writes a
    longer prefix of the text), then a look at each cut inside the run before the one it
    found: a cut inside a run can decode to U+FFFDs (``Text.byte_fallback_ids``) though a
    shorter cut in it wrote the text."""
    before = text.decode(list(context)) if context else ""
    whole = completion_text(text, ids, context, before)[:end]
    holds = lambda k: completion_text(text, ids[:k], context, before).startswith(whole)  # noqa: E731
    fallback = text.byte_fallback_ids
    cuts = [k for k in range(len(ids) + 1) if not (0 < k < len(ids) and ids[k - 1] in fallback and ids[k] in fallback)]
    lo, hi = 0, len(cuts) - 1
    while lo < hi:
        m = (lo + hi) // 2
        if holds(cuts[m]):
            hi = m
        else:
            lo = m + 1
    if lo == 0:
        return cuts[0]
    return next((k for k in range(cuts[lo - 1] + 1, cuts[lo]) if holds(k)), cuts[lo])


class Detokenizer:
    """Incremental decoding: ``push(ids)`` returns only the text that is now final;
    ``flush()`` what is left once the stream ends.

    Decoding the whole generated list each time is O(n^2) over a run but handles every
    byte-level merge exactly; trailing U+FFFDs (a UTF-8 character whose bytes have not all
    come yet) are held back, the text before them is not (a round can end inside a
    character); flush gives them as the full decoding has them when none follow. With
    ByteFallback, a trailing run of byte tokens is held back whole (``Text.byte_fallback_ids``:
    a later byte can turn the run's text into U+FFFDs). The text is that of the tokens after
    ``context``'s (``context_of`` the prompt: ``completion_text``).
    """

    def __init__(self, text: Text, context: list[int] = ()):
        self.text = text
        self.context = list(context)
        self.before = text.decode(self.context) if self.context else ""  # the context's text, decoded once
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, ids) -> str:
        self.ids.extend(int(i) for i in ids)
        s = completion_text(self.text, self.ids, self.context, self.before)
        end = len(s.rstrip("\ufffd"))
        fallback, run = self.text.byte_fallback_ids, 0
        while run < len(self.ids) and self.ids[-1 - run] in fallback:
            run += 1
        if run:  # (its text is a prefix of s)
            end = min(end, len(completion_text(self.text, self.ids[:-run], self.context, self.before)))
        if end <= self.emitted:
            return ""
        piece, self.emitted = s[self.emitted:end], end
        return piece

    def flush(self) -> str:
        s = self.full
        piece, self.emitted = s[self.emitted:], max(self.emitted, len(s))
        return piece

    @property
    def full(self) -> str:
        return completion_text(self.text, self.ids, self.context, self.before)


def tag_start_at_end(text: str, *tags: str) -> int:
    """How many characters at the end of ``text`` could begin one of ``tags`` (a tag cut
    across two decoded pieces): what a parser of tags in a stream holds back until the next
    piece settles it (serve's tool-call and reasoning parsers)."""
    return max((next((n for n in range(min(len(t) - 1, len(text)), 0, -1) if t.startswith(text[-n:])), 0)
                for t in tags), default=0)


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
        if stops is None:  # (OpenAI's "no stop strings")
            stops = ()
        elif isinstance(stops, str):  # one string is one stop, not its letters
            stops = (stops,)
        elif isinstance(stops, (bytes, bytearray, dict)):  # (its bytes as numbers, or its keys)
            raise UserError(f"stop={stops!r:.80}: expected a string or a list of strings")
        else:
            try:
                stops = tuple(stops)
            except TypeError:
                raise UserError(f"stop={stops!r:.80}: expected a string or a list of strings") from None
        for s in stops:
            if not isinstance(s, str) or not s:
                raise UserError(f"stop string {s!r}: expected a non-empty string")
            # bytes that were not UTF-8 (`--stop $'\xe9'` from a Latin-1 terminal) reach Python as lone
            # surrogates, which no decoded answer holds: the stop never matched, unsaid
            if (problem := not_text(s, f"stop string {s!r}")) is not None:
                raise UserError(f"{problem}; no answer holds it")
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
