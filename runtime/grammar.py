"""Structured output (guided decoding): the answer held to a JSON schema, any JSON object, a
regular expression, a list of choices or a Lark grammar, through llguidance (an optional
dependency: ``pip install 'specrt[structured]'``; imported when a constraint is first asked for).

The target's distribution at each position is its logits with the tokens the grammar refuses
there set to -inf (given the tokens before it), and decoding stays lossless relative to that
masked target (generate.py): greedy emits the masked rows' argmaxes; rejection sampling tests
each draft against the masked, renormalised p (the draft's q unmasked: a refused draft has
p = 0 and is rejected, its correction drawn from max(0, p - q)). Row k of a round is masked
after drafts 1..k, which the matcher consumes as the rows are asked for (a row past the first
refused draft is never asked for); after the round the matcher holds exactly the emitted
tokens. An EOS is allowed only where the grammar accepts (llguidance puts the EOS ids in the
mask there); once the grammar can take nothing more (the matcher stopped) the answer ends
there, finish "stop", without an EOS.

    Constraint.json_schema(schema) / .json() / .regex(re) / .choice([...]) / .lark(text)
    Constraint.structural_tag({"structures": [{"begin", "schema", "end"}], "triggers": [...]})
    grammar = compile_constraint(constraint, text, vocab, eos)   # a UserError naming a bad one
    guide = grammar.guide()                                      # one a stream

A constraint ``after`` a text (serve's --reasoning-parser: ``</think>``, as vLLM's structured
output with a reasoning parser) holds nothing until the answer has spelled that text's tokens,
and its grammar from the next token on (``Deferred``): a thinking model thinks freely, then
answers in the grammar; lossless relative to the target masked from there on.

A constraint's ``only`` (token ids: vLLM's ``allowed_token_ids``) holds every token of the
answer, from the first (a thinking one's too), to those ids besides the grammar: each row's
mask is the grammar's and theirs (an EOS only where it is among them). ``Constraint.tokens(ids)``
is that set alone, with no grammar (kind "any": llguidance is not needed); the masked verify is
the grammar's, so speculation stays lossless relative to the target masked by them.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

import numpy as np

from specrt.errors import InternalError, UserError

from .sampling import SamplingParams, probs
from .verify import Verdict

EXTRA = "pip install 'specrt[structured]'"  # (the llguidance package)
KINDS = ("json_schema", "json", "regex", "choice", "lark", "structural_tag", "any")  # (any: no grammar, ``only`` alone)
# JSON is written as json.dumps writes it (", " and ": ", no other whitespace): llguidance's
# default allows any run of whitespace between tokens, where a model may loop until its budget
# ends (a tiny model's answers did: 60 tokens of "\r\t"); a schema's own "x-guidance" options
# are laid over these (and over json_layout's)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# JSON's whitespace (RFC 8259: space, tab, line feed, carriage return): what \s is in a whitespace
# pattern (Rust's \s, llguidance's, is Unicode's: U+00A0 between two tokens is not JSON)
JSON_SPACE = r"[\x20\x09\x0A\x0D]"


def json_layout(whitespace: str | None) -> dict:
    """llguidance's JSON options: json.dumps's layout (``whitespace`` None), or "," and ":" with
    the text ``whitespace`` matches (a regex, Rust's syntax) allowed, at most once, around each of
    JSON's tokens, as outlines' whitespace_pattern (vLLM's guided_whitespace_pattern) is read:
    "" none at all ({"a":1}, vLLM's disable_any_whitespace), "[ ]?" one space or none. Its \\s is
    JSON_SPACE; other text the pattern matches is written as it is (not JSON: the pattern's)."""
    if whitespace is None:
        return JSON_LAYOUT
    pattern = ascii_classes(whitespace, {"s": JSON_SPACE, "S": "[^" + JSON_SPACE[1:]})
    return {"whitespace_pattern": pattern, "item_separator": ",", "key_separator": ":"}


def whitespace_problem(pattern) -> str:
    """Why ``pattern`` is no whitespace pattern json_layout takes ("" where it is one)."""
    if not isinstance(pattern, str):
        return f"expected a regular expression (text), got {pattern!r:.60}"
    if not pattern:
        return ""
    llg = _llguidance("whitespace pattern")
    return _first_lines(llg.LLMatcher.validate_grammar(llg.LLMatcher.grammar_from_regex(json_layout(pattern)[
        "whitespace_pattern"])) or "")


# keywords whose value maps names to schemas, and those whose value is data, not a schema
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
DATA = ("enum", "const", "default", "examples")
MIXED = ("allOf", "anyOf", "oneOf")  # (keywords whose schemas an object matches beside its own "properties")


def closed(schema, part: bool = False):
    """``schema`` with "additionalProperties": false in each object schema that lists its
    "properties" and says nothing of others, as vLLM's default backend (xgrammar, strict mode)
    and OpenAI's strict schemas hold them: a schema written without it (pydantic's
    model_json_schema()) let the model write keys of its own until max_tokens (w76j). Left
    open where keys come from several schemas (each would refuse the others'): allOf's parts
    (``part``), and an object with "properties" beside allOf / anyOf / oneOf, and their parts."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    mixed = "properties" in schema and any(k in schema for k in MIXED)
    out = {k: v if k in DATA else {n: closed(s) for n, s in v.items()} if k in SCHEMA_MAPS and isinstance(v, dict)
           else [closed(s, k == "allOf" or mixed) for s in v] if k in MIXED and isinstance(v, list)
           else ascii_classes(v) if k == "pattern" and isinstance(v, str) else closed(v)
           for k, v in schema.items()}
    if "properties" in out and not (part or mixed) and "additionalProperties" not in out \
            and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


# \d and \w as ECMA-262 (JSON Schema's patterns) and vLLM's default backend (xgrammar) read them:
# ASCII; llguidance's (Rust's regex syntax) are Unicode's, where SmolLM2 asked for a date under
# \d{4}-\d{2}-\d{2} wrote "🯸🯸🯸🯸-🯸🯸-" (U+1FBF8, a segmented digit eight; w76j)
ASCII_CLASSES = {"d": "[0-9]", "D": "[^0-9]", "w": "[0-9A-Za-z_]", "W": "[^0-9A-Za-z_]"}


def ascii_classes(pattern: str, classes: dict = ASCII_CLASSES) -> str:
    """``pattern`` with \\d \\D \\w \\W (``classes``' escapes) written as ASCII classes (nested in
    a class too, as Rust's regex syntax takes them); other escapes, an escaped backslash among them, kept."""
    out, i = [], 0
    while i < len(pattern):
        two = pattern[i: i + 2]
        out.append(classes.get(two[1:], two) if two[:1] == "\\" else pattern[i])
        i += 2 if two[:1] == "\\" else 1
    return "".join(out)


def _llguidance(what: str = ""):
    """llguidance, or a UserError naming ``what`` asked for it and the extra that installs it."""
    try:
        import llguidance
    except ImportError:
        raise UserError(f"{what}{': ' if what else ''}structured output needs the llguidance package: {EXTRA}") \
            from None
    return llguidance


@dataclass(frozen=True, eq=False)
class Constraint:
    """What the answer must match: ``kind`` one of KINDS, ``value`` the schema (a dict), the
    pattern (Rust's regex syntax, llguidance's), the choices (a list of strings) or the grammar
    (llguidance's Lark, or GBNF; None for ``json``: any JSON object). ``name`` is how errors name it (an option, a request field).
    ``after``: text whose tokens the answer spells before the grammar holds ("": from its first token).
    ``whitespace``: JSON's whitespace (json_layout's pattern; None: json.dumps's), for the JSON kinds
    and a structural tag's schemas. ``only``: token ids every token of the answer is one of, besides
    the grammar (() for any token). The value as it was when the Constraint was made is the
    constraint (a copy of it as text): one changed in place later is not seen (make a new Constraint)."""

    kind: str
    value: object = None
    name: str = ""
    after: str = ""
    whitespace: str | None = None
    only: tuple[int, ...] = ()

    @classmethod
    def json_schema(cls, schema: dict, name: str = "json_schema", whitespace: str | None = None) -> "Constraint":
        return cls("json_schema", schema, name, whitespace=whitespace)

    @classmethod
    def json(cls, name: str = "json_object", whitespace: str | None = None) -> "Constraint":
        return cls("json", None, name, whitespace=whitespace)

    @classmethod
    def regex(cls, pattern: str, name: str = "regex") -> "Constraint":
        return cls("regex", pattern, name)

    @classmethod
    def choice(cls, options: list[str], name: str = "choice") -> "Constraint":
        return cls("choice", options, name)

    @classmethod
    def lark(cls, grammar: str, name: str = "grammar") -> "Constraint":
        return cls("lark", grammar, name)

    @classmethod
    def structural_tag(cls, tag: dict, name: str = "structural_tag", whitespace: str | None = None) -> "Constraint":
        """vLLM's structural tag: free text, where each of ``tag``'s "triggers" starts the structure whose
        "begin" it begins: its begin, JSON of its "schema", its "end", then free text again."""
        return cls("structural_tag", tag, name, whitespace=whitespace)

    @classmethod
    def tokens(cls, ids, name: str = "allowed_token_ids") -> "Constraint":
        """Every token of the answer one of ``ids`` (no grammar; vLLM's allowed_token_ids)."""
        return cls("any", None, name, only=tuple(ids))

    @property
    def label(self) -> str:
        return self.name or self.kind

    def __post_init__(self):
        # the constraint as text, made once, here: the value as it is now is the constraint (what
        # key() and source() read), a schema changed in place later changes neither (it kept the key
        # of its first use while a Session's cache miss compiled the changed one: session 77)
        try:
            only = tuple(self.only)  # (a list or an array given: kept as a tuple of ints, the dataclass frozen)
            if any(isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in only):
                raise UserError(f"{self.label}: the allowed token ids must be integers; got {list(only)!r:.80}")
            only = tuple(int(t) for t in only)
            object.__setattr__(self, "only", only)
            key = json.dumps([self.kind, self.value] + ([self.after] if self.after else []) +
                             ([{"whitespace": self.whitespace}] if self.whitespace is not None else []) +
                             ([list(only)] if only else []))
        except (TypeError, ValueError) as e:  # (a set of choices, a schema holding a Python object)
            raise UserError(f"{self.label}: expected JSON data ({e})") from None
        object.__setattr__(self, "_key", key)  # (a frozen dataclass)

    def key(self) -> str:
        """The constraint as text, for a cache of compiled grammars (a schema's keys in their
        order: llguidance writes its properties in it, m76i). Made once, when the Constraint is
        made (serve asked for it at the request, then stream and stream_ids: three dumps of a
        1.7 MB schema, ~60 ms a request)."""
        return self._key

    def source(self, specials: dict[str, int] | None = None) -> str:
        """The llguidance grammar, its value (as it was when the Constraint was made) checked (a
        UserError naming ``label``); None for kind "any" (no grammar). ``specials``: the tokenizer's
        special tokens (text -> id), a structural tag's triggers among them written as that token
        (structural_tag_lark)."""
        if self.kind == "any":
            return None
        llg, v, what = _llguidance(self.label), json.loads(self._key)[1], self.label
        layout = json_layout(self.whitespace)
        if self.kind == "json_schema":
            if not isinstance(v, dict):
                raise UserError(f"{what}: expected a JSON schema (a JSON object), got {type(v).__name__}")
            try:
                return llg.LLMatcher.grammar_from_json_schema(json.dumps(closed(v)), layout)
            except (ValueError, TypeError) as e:
                raise UserError(f"{what}: not a JSON schema llguidance reads ({e})") from None
        if self.kind == "json":
            return llg.LLMatcher.grammar_from_json_schema('{"type": "object"}', layout)
        if self.kind == "structural_tag":
            return llg.LLMatcher.grammar_from_lark(structural_tag_lark(v, layout, specials or {}, what))
        if self.kind == "regex":
            if not isinstance(v, str) or not v:
                raise UserError(f"{what}: expected a non-empty regular expression, got {v!r:.60}")
            return llg.LLMatcher.grammar_from_regex(ascii_classes(v))
        if self.kind == "choice":
            if not isinstance(v, (list, tuple)) or not v or not all(isinstance(c, str) and c for c in v):
                raise UserError(f"{what}: expected a non-empty list of non-empty strings, got {v!r:.60}")
            # a Lark rule of string literals (JSON's escapes are Lark's)
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in v))
        if self.kind == "lark":
            if not isinstance(v, str) or not v.strip():
                raise UserError(f"{what}: expected a Lark or GBNF grammar (text), got {v!r:.60}")
            try:  # (llguidance's "grammar" format: its Lark, or llama.cpp's GBNF converted to it)
                return llg.grammar_from("grammar", v)
            except ValueError as e:
                raise UserError(f"{what}: {_first_lines(str(e))}") from None
        raise UserError(f"{what}: unknown kind of constraint {self.kind!r} (expected one of {', '.join(KINDS)})")


STRUCTURE_KEYS = ("begin", "schema", "end")


def structural_tag_lark(tag, layout: dict, specials: dict[str, int], what: str) -> str:
    """vLLM's structural tag {"structures": [{"begin", "schema", "end"}], "triggers": [...]} as
    llguidance's Lark, as vLLM's llguidance backend builds it (llguidance.StructTag.to_grammar):
    free text, in which a trigger (a lazy lexeme: the first place the text spells it) starts the
    structure whose begin starts with it (the first trigger that begins it, as vLLM picks it):
    the rest of its begin, JSON of its schema (``layout``'s, closed as a json_schema's), its end,
    then free text again; the answer may end in free text. A trigger that is a special token of
    the tokenizer (``specials``) is that token, not its text. vLLM's backend gives llguidance the
    schema's compiled grammar where a schema is read, which llguidance takes for a schema of one
    unknown keyword: any JSON there (llguidance 1.9.1); here it is the schema. A UserError
    naming ``what`` and the part for a shape it is not."""
    if not isinstance(tag, dict) or not isinstance(tag.get("structures"), list) or not tag["structures"] \
            or not isinstance(tag.get("triggers"), list) or not tag["triggers"]:
        raise UserError(f"{what}: expected {{'structures': [{{'begin', 'schema', 'end'}}, ...], 'triggers': "
                        f"[...]}}, both non-empty; got {tag!r:.80}")
    triggers = tag["triggers"]
    bad = [t for t in triggers if not isinstance(t, str) or not t]
    if bad:
        raise UserError(f"{what}.triggers: expected non-empty strings, got {bad[0]!r:.60}")
    rules = []
    for i, s in enumerate(tag["structures"]):
        at = f"{what}.structures[{i}]"
        if not isinstance(s, dict) or set(s) - set(STRUCTURE_KEYS) or not all(k in s for k in STRUCTURE_KEYS):
            raise UserError(f"{at}: expected {{'begin': text, 'schema': {{...}}, 'end': text}}, got {s!r:.80}")
        if not isinstance(s["begin"], str) or not isinstance(s["end"], str):
            raise UserError(f"{at}: 'begin' and 'end' must be text, got {s['begin']!r:.40} and {s['end']!r:.40}")
        if not isinstance(s["schema"], dict):
            raise UserError(f"{at}.schema: expected a JSON schema (a JSON object), got {s['schema']!r:.60}")
        trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
        if trigger is None:
            raise UserError(f"{at}.begin: {s['begin']!r:.60} starts with none of the triggers {triggers!r:.80}")
        schema = closed(s["schema"])
        schema["x-guidance"] = {**layout, **(schema.get("x-guidance") or {})}  # (the schema's own over them)
        rest, end = (json.dumps(x) if x else "" for x in (s["begin"][len(trigger):], s["end"]))  # (Lark's strings)
        body = f"{rest} %json {json.dumps(schema)} {end}"
        if trigger in specials:
            rules.append(f"tag_{i}: TEXT <[{specials[trigger]}]> {body}")
        else:
            rules += [f"tag_{i}_trigger[lazy]: TEXT {json.dumps(trigger)}", f"tag_{i}: tag_{i}_trigger {body}"]
    tags = " | ".join(f"tag_{i}" for i in range(len(tag["structures"])))
    return "\n".join(["%llguidance {}", f"start: ({tags})* TEXT", r"TEXT: /(.|\n)*/", *rules])


# llguidance's tokenizer of a Text (its tokenizer.json), by (vocabulary, EOS ids): built once
# (0.1-0.3 s on a 49152-token vocabulary), kept while the Text lives
_TOKENIZERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def tokenizer_of(text, vocab: int, eos: tuple[int, ...]):
    """llguidance's LLTokenizer of ``text``'s tokenizer.json (what runtime/text.py read), with
    the engines' vocabulary ``vocab`` (ids past the tokenizer's are never allowed) and their
    EOS ids (the tokens the mask allows where the grammar accepts)."""
    llg = _llguidance()
    kept = _TOKENIZERS.setdefault(text, {})
    key = (int(vocab), tuple(int(e) for e in eos))
    if key not in kept:
        try:
            kept[key] = llg.LLTokenizer(text.tokenizer.to_str(), n_vocab=key[0], eos_token=list(key[1]) or None)
        except Exception as e:  # (llguidance raises ValueError / RuntimeError for a tokenizer it cannot take)
            raise UserError(f"structured output: llguidance cannot read this tokenizer.json ({e})") from None
    return kept[key]


class Grammar:
    """A constraint compiled against one tokenizer (``compile_constraint``): ``guide()``
    makes each stream's matcher. ``source`` None: no grammar (kind "any", ``only`` alone)."""

    def __init__(self, constraint: Constraint, source: str | None, tokenizer, vocab: int, eos: tuple[int, ...],
                 tag: tuple[int, ...] = ()):
        self.constraint, self.source, self.tokenizer, self.vocab = constraint, source, tokenizer, vocab
        self.eos = frozenset(eos)
        self.tag = tag  # the tokens after which the grammar holds (Constraint.after's), or () from the start
        self.only: np.ndarray | None = None  # bool [V]: Constraint.only's ids (None: every token)
        if constraint.only:
            self.only = np.zeros(vocab, bool)
            self.only[list(constraint.only)] = True

    def guide(self) -> "Guide":
        guide = Guide(self, _Matcher(self, self._matcher()) if self.source is not None else _Free())
        return Deferred(guide, self.tag) if self.tag else guide

    _fresh = None  # a matcher at the answer's start, built once, which each stream's copies

    def _matcher(self):
        """A matcher at the answer's start: a copy of one built once (LLMatcher builds the grammar's
        parser: 0.2 s for a 180 KB schema, 2 s for 730 KB, each stream's until w76j; a copy < 10 ms)."""
        if self._fresh is None:
            self._fresh = _llguidance().LLMatcher(self.tokenizer, self.source, log_level=0)
        return self._fresh.deep_copy()


def compile_constraint(constraint: Constraint, text, vocab: int, eos: tuple[int, ...]) -> Grammar:
    """``constraint`` checked and compiled for ``text``'s tokenizer: a UserError naming it
    where llguidance refuses it (an invalid schema, regex or grammar)."""
    if not isinstance(constraint, Constraint):
        raise UserError(f"grammar={constraint!r:.80}: expected a specrt.runtime.grammar.Constraint "
                        "(Constraint.json_schema(...), .json(), .regex(...), .choice([...]), .lark(...))")
    bad = [t for t in constraint.only if not 0 <= t < vocab]
    if bad or (constraint.kind == "any" and not constraint.only):
        raise UserError(f"{constraint.label}: " + (f"token id {bad[0]} is not in the vocabulary (0 to {vocab - 1})"
                                                   if bad else "expected at least one allowed token id"))
    if constraint.kind == "any":  # (no grammar: no tokenizer, no llguidance)
        return Grammar(constraint, None, None, vocab, tuple(eos))
    if text is None:
        raise UserError(f"{constraint.label}: structured output needs the target's tokenizer (tokenizer.json)")
    specials = {t.content: i for i, t in text.tokenizer.get_added_tokens_decoder().items() if t.special} \
        if constraint.kind == "structural_tag" else {}
    source = constraint.source(specials)
    tok = tokenizer_of(text, vocab, eos)
    # the grammar's parser built once, checked and kept as its streams' fresh matcher (h76l: checked
    # by validate_grammar_with_warnings first, which built it too: 0.18 s of a 2000-field schema's 0.42)
    matcher = _llguidance().LLMatcher(tok, source, log_level=0)
    why = matcher.get_error() if matcher.is_error() else ""
    if why and "NoExtension" not in why:  # (one no token can start: refused where a stream starts, Guide)
        raise UserError(f"{constraint.label}: {_first_lines(why)}")
    # (the tag's tokens: the ids its text encodes to alone)
    tag = tuple(text.tokenizer.encode(constraint.after, add_special_tokens=False).ids) if constraint.after else ()
    grammar = Grammar(constraint, source, tok, vocab, tuple(eos), tag)
    grammar._fresh = None if why else matcher
    return grammar


def _first_lines(message: str) -> str:
    """llguidance's error: its first line and its "error:" lines, without the grammar's listing
    and the carets it draws under it."""
    lines = [s.strip() for s in str(message).strip().splitlines() if s.strip()]
    return "; ".join(lines[:1] + [s for s in lines[1:] if s.lower().startswith("error")])


class _Matcher:
    """A stream's LLMatcher, the tokens it holds and the mask made for them (``ok``, Guide.allowed's):
    each move (consume, rollback) goes through here and forgets the mask, so no move leaves it
    stale (Guide reset it by hand at each of its three moves until session 78). Only what Guide
    asks of the matcher."""

    def __init__(self, grammar: Grammar, matcher):
        self.grammar, self._m = grammar, matcher
        self.held: list[int] = []  # the tokens consumed
        self.ok: np.ndarray | None = None  # bool [V] for them (None: not made since they moved)

    def try_consume(self, token: int) -> bool:
        """``token`` consumed where the grammar takes it (one refused leaves the matcher as it was)."""
        self.ok = None
        took = bool(self._m.try_consume_tokens([token]))
        self.held += [token] * took
        return took

    def consume(self, token: int) -> None:
        """``token`` consumed whatever it is (a refused one: the matcher's error state, its words)."""
        self.ok = None
        self._m.consume_token(token)

    def rollback(self, n: int) -> None:
        self.ok = None
        if n:
            self._m.rollback(n)
            del self.held[-n:]

    def mask(self, bits: np.ndarray) -> np.ndarray:
        """bool [V]: the tokens the grammar allows after those held (``bits`` llguidance's bitmask,
        written over)."""
        self._m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        return np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.grammar.vocab].view(bool)

    def is_error(self) -> bool:
        return self._m.is_error()

    def get_error(self) -> str:
        return self._m.get_error()

    def is_stopped(self) -> bool:
        return self._m.is_stopped()

    def forced(self) -> bytes:
        """The text the grammar forces after the tokens held (llguidance's forced bytes; b"" where
        it forces none), read from a fresh matcher given them: a matcher at its dead end is in
        its error state, where it says none."""
        fresh = self.grammar._matcher()
        fresh.consume_tokens(self.held)
        return fresh.compute_ff_bytes() if not fresh.is_error() else b""


class _Free(_Matcher):
    """No grammar (kind "any"): every token taken, never stopped; the mask is Grammar.only's alone."""

    def __init__(self):
        self.held, self.ok = [], None

    def try_consume(self, token: int) -> bool:
        self.ok = None
        self.held.append(token)
        return True

    def rollback(self, n: int) -> None:
        self.ok = None
        if n:
            del self.held[-n:]

    def mask(self, bits: np.ndarray) -> None:
        return None

    def is_error(self) -> bool:
        return False

    def get_error(self) -> str:
        return ""

    def is_stopped(self) -> bool:
        return False

    def forced(self) -> bytes:
        return b""


class Guide:
    """One stream's matcher over ``grammar``: the masks of its rows and the tokens it holds.
    ``pending``: drafts consumed for a round's masks, given back by ``settle``; an EOS is
    never consumed (the rows after it are cut: ``ended``)."""

    def __init__(self, grammar: Grammar, matcher: _Matcher):
        self.grammar, self.m = grammar, matcher  # (a _Matcher, or _Free: no grammar)
        self.vocab, self.eos = grammar.vocab, grammar.eos
        self._bits = np.zeros((self.vocab + 31) // 32, np.int32)  # llguidance's bitmask, bit t of word t // 32
        self.pending, self.ended = 0, False
        self.position = 0  # output tokens held (for errors)
        self._fail()

    def _fail(self) -> None:
        if self.m.is_error():
            why = self.m.get_error()
            if "NoExtension" in why:  # (llguidance's word where no token can continue: made when it starts too)
                self._none_allowed()
            raise UserError(f"{self.grammar.constraint.label}: {_first_lines(why)}")

    def _none_allowed(self, only: bool = False):
        if only:  # (the grammar allows some, none of them among Constraint.only's)
            raise UserError(f"{self.grammar.constraint.label}: none of the {len(self.grammar.constraint.only)} allowed "
                            f"token ids can continue the answer {self.position + self.pending} token(s) in (the "
                            "grammar allows other tokens there)")
        forced = self.m.forced().decode("utf-8", "replace")  # (what llguidance says it needs next, if it knows)
        raise UserError(f"{self.grammar.constraint.label}: no token of the vocabulary can continue the answer "
                        f"{self.position + self.pending} token(s) in (the grammar needs text these engines' "
                        "tokenizer cannot write" + (f": {forced!r:.80}" if forced else "") + ")")

    @property
    def stopped(self) -> bool:
        """The grammar takes no more tokens (the answer ends here)."""
        return self.m.is_stopped()

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens the grammar allows next, among Grammar.only's where it has them
        (every token once it has stopped: rows after the stop are cut, never emitted). A grammar
        that allows none (it needs text the vocabulary cannot spell, or none of the ids) is a
        UserError, not a hang. Made once for the tokens the matcher
        holds (a tree round asked for its first position's twice: its runners-up, then row 0)."""
        if self.ended or self.m.is_stopped():
            return np.ones(self.vocab, bool)
        if self.m.ok is None:
            ok, only = self.m.mask(self._bits), self.grammar.only  # (ok None: no grammar)
            if ok is not None and not ok.any():  # (llguidance's matcher is then in its error state, "NoExtensionBias")
                self._none_allowed()
            self._fail()
            if only is not None:
                ok = only if ok is None else ok & only
                if not ok.any():
                    self._none_allowed(only=True)
            self.m.ok = ok
        return self.m.ok

    def masked(self, row: np.ndarray) -> np.ndarray:
        """row [V] with the refused tokens -inf (a copy)."""
        return np.where(self.allowed(), row, np.float32(-np.inf))

    def take(self, token: int) -> None:
        """The first token (the prefill's), held unless it is an EOS."""
        if int(token) not in self.eos:
            self.consume(token)
            self.position += 1

    def consume(self, token: int) -> None:
        if self.m.try_consume(int(token)):  # (one refused leaves the matcher as it was: 0.4 us a token more)
            return
        allowed = not self.m.is_error() and bool(self.allowed()[int(token)])
        if not self.m.is_error():
            self.m.consume(int(token))  # (for llguidance's words)
        why = self.m.get_error()
        if "doesn't satisfy the grammar" not in why:  # (a limit of llguidance's: the grammar's, w76j)
            raise UserError(f"{self.grammar.constraint.label}: too large or ambiguous for llguidance's parser "
                            f"{self.position + self.pending} token(s) in ({why.strip().splitlines()[0]})")
        if allowed and "forced bytes: got" in why:  # (text the grammar forces is tokenized for its mask with
            self._none_allowed()  # the bytes no token writes skipped: '"hello' allows "hello", which it refuses, h77j)
        raise InternalError(f"guided decoding: the matcher refused token {token} "
                            f"{'it allowed' if allowed else 'its mask refused'} ({why})")

    def advance(self, drafts, k: int) -> None:
        """A round's row k is asked for: drafts[:k] consumed (each accepted, so allowed)."""
        while self.pending < k and not self.ended and not self.m.is_stopped():  # (the rows past a stop: cut)
            if int(drafts[self.pending]) in self.eos:
                self.ended = True
                return
            self.consume(drafts[self.pending])
            self.pending += 1

    def row_probs(self, logits_row: np.ndarray, drafts, k: int, params: SamplingParams) -> np.ndarray:
        """Sampling: row k's processed p [V] float64 over the allowed tokens (asked for in order,
        k only while drafts[:k] were accepted: verify.LazyRows)."""
        self.advance(drafts, k)
        return probs(self.masked(logits_row)[None], params)[0]

    def argmaxes(self, logits: np.ndarray, drafts, check) -> np.ndarray:
        """Greedy: the masked argmaxes of rows 0.. of a round (logits [d+1, V]) up to the first
        that differs from its draft, or is an EOS, or stops the grammar (the rows after it are
        never used: the answer ends or the draft is rejected there) -> int64 [j+1], j <= d;
        ``check(k)`` checks row k's finiteness first."""
        best = []
        for k in range(len(drafts) + 1):
            self.advance(drafts, k)
            check(k)
            # the row's argmax where the grammar allows it (its first max is then the allowed tokens'
            # first): no masked copy of the row (0.03 of a row's 0.055 ms on SmolLM2's 49,152 tokens)
            top = int(logits[k].argmax())
            best.append(top if self.allowed()[top] else int(self.masked(logits[k]).argmax()))
            if k == len(drafts) or best[-1] != int(drafts[k]) or best[-1] in self.eos:
                break
            self.consume(best[-1])
            self.pending += 1
            if self.m.is_stopped():
                break
        return np.asarray(best, np.int64)

    def sibling_row(self, row: np.ndarray, token: int) -> np.ndarray:
        """A token tree's runner-up ``token`` for a round's first position (one it allows): the
        row after it [V] masked after it (consumed for the mask, then given back; an EOS's row,
        cut after it, as it is). Asked for before any draft is consumed (its draft rejected)."""
        if self.pending or self.ended:
            raise InternalError(f"guided decoding: a runner-up's row asked for {self.pending} draft(s) in")
        if int(token) in self.eos or self.m.is_stopped():
            return row
        self.consume(token)
        try:
            return self.masked(row)
        finally:
            self.m.rollback(1)

    def settle(self, v: Verdict) -> Verdict:
        """After a round: the matcher holds its emitted tokens (up to an EOS, which it does not
        take); a verdict whose token stopped the grammar before its last is cut after it."""
        self.m.rollback(self.pending)
        self.pending, self.ended = 0, False
        for j, t in enumerate(int(t) for t in v.tokens):
            if t in self.eos:
                break
            self.consume(t)
            self.position += 1
            if self.m.is_stopped():
                return v if j >= v.accepted else Verdict(j, v.tokens[: j + 1].copy())
        return v


class Deferred:
    """A Guide that holds nothing until the answer has spelled ``tag`` (token ids: a think
    block's end, Constraint.after's), then ``guide``'s grammar from the next token on, as
    vLLM's structured output with a reasoning parser (its rows before the tag unmasked, the
    tag's own included; an EOS before it ends the answer). A round's rows after the tag
    within it are masked (after the drafts from the tag's end on: ``guide`` sees those
    alone); before, the rows are the target's own. The first time the tag is spelled counts
    (a tag written again later is the grammar's text). Grammar.only's ids hold the rows
    before the tag too (vLLM's allowed_token_ids hold every token: ``_own``)."""

    def __init__(self, guide: Guide, tag: tuple[int, ...]):
        self.g, self.tag, self.eos = guide, tuple(int(t) for t in tag), guide.eos
        self.vocab, self.only = guide.vocab, guide.grammar.only
        self.tail: list[int] = []  # the answer's last tokens while the tag has not come
        self.active = False  # the tag came: the grammar holds

    @property
    def stopped(self) -> bool:
        return self.active and self.g.stopped

    def allowed(self) -> np.ndarray:
        """As Guide's (every token before the tag); the grammar's first mask made at once, so a
        grammar no token can start is refused before the answer starts."""
        ok = self.g.allowed()
        return ok if self.active else np.ones(self.vocab, bool) if self.only is None else self.only

    def masked(self, row: np.ndarray) -> np.ndarray:
        return self.g.masked(row) if self.active else self._own(row)

    def _own(self, row: np.ndarray) -> np.ndarray:
        """A row before the tag: the target's own, Grammar.only's ids alone where it has them."""
        return row if self.only is None else np.where(self.only, row, np.float32(-np.inf))

    def _start(self, tokens) -> int | None:
        """Where the grammar starts in a round of ``tokens`` (the first ones emitted or
        drafted): 0 once active, j where tokens[:j] complete the tag (no EOS before), else None."""
        if self.active:
            return 0
        seen = self.tail[-len(self.tag):]
        for j, t in enumerate(int(t) for t in tokens):
            if t in self.eos:
                return None
            seen = (seen + [t])[-len(self.tag):]
            if tuple(seen) == self.tag:
                return j + 1
        return None

    def take(self, token: int) -> None:
        """The first token (the prefill's): the grammar's, or one more toward the tag."""
        if self.active:
            return self.g.take(token)
        self.active = self._start([token]) == 1
        self.tail = (self.tail + [int(token)])[-len(self.tag):]

    def row_probs(self, logits_row: np.ndarray, drafts, k: int, params: SamplingParams) -> np.ndarray:
        a = self._start(drafts[:k])
        if a is None:
            return probs(self._own(logits_row)[None], params)[0]
        return self.g.row_probs(logits_row, drafts[a:], k - a, params)

    def sibling_row(self, row: np.ndarray, token: int) -> np.ndarray:
        """Guide's: the row after a runner-up at the round's first position masked when the
        grammar holds after it (active, or the runner-up ends the tag), else the target's own."""
        a = self._start([token])
        return self._own(row) if a is None else self.g.sibling_row(row, token) if a == 0 else self.g.masked(row)

    def argmaxes(self, logits: np.ndarray, drafts, check) -> np.ndarray:
        """Guide's, the rows up to the tag's end unmasked (a round's first row that differs from
        its draft, or is an EOS, ends it as there)."""
        a = self._start(drafts)
        best = []
        for k in range(len(drafts) + 1):
            if k == a:  # drafts[:k] end in the tag: the grammar holds from row k
                rest = self.g.argmaxes(logits[k:], drafts[k:], lambda i: check(k + i))
                return np.asarray(best + [int(t) for t in rest], np.int64)
            check(k)
            best.append(int(self._own(logits[k]).argmax()))
            if k == len(drafts) or best[-1] != int(drafts[k]) or best[-1] in self.eos:
                break
        return np.asarray(best, np.int64)

    def settle(self, v: Verdict) -> Verdict:
        """Guide's: the grammar's matcher holds the round's tokens after the tag (a verdict
        whose token stopped the grammar before its last cut after it)."""
        a = self._start(v.tokens)
        if a is None or a == len(v.tokens):  # (the tag not come, or its last token the round's last)
            self.g.settle(Verdict(0, v.tokens[:0]))  # (the matcher's drafts given back)
            self.active = a is not None
            self.tail = (self.tail + [int(t) for t in v.tokens])[-len(self.tag):]
            return v
        self.active = True
        rest = self.g.settle(Verdict(v.accepted - a, v.tokens[a:]))
        if len(rest.tokens) == len(v.tokens) - a:
            return v
        return Verdict(a + rest.accepted, v.tokens[: a + len(rest.tokens)])
