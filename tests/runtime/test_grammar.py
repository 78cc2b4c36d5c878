"""Structured output (runtime/grammar.py, h76a): the answer held to a JSON schema, a regex, a
choice or a Lark grammar, losslessly relative to the target masked by the grammar.

Real engines: a tiny random Llama whose tokenizer is a byte-level BPE (as SmolLM2's) trained on
JSON-like text, with a random P-EAGLE draft; every speculative configuration's guided greedy
output equals guided target-only decoding token for token, and satisfies its grammar. The
masked rejection step's exactness is checked against the analytic masked distribution."""

from __future__ import annotations

import json
import re
from itertools import product

import numpy as np
import pytest

pytest.importorskip("llguidance")

from specrt.engines import build_engines  # noqa: E402
from specrt.engines.engine_set import load_engines  # noqa: E402
from specrt.errors import UserError  # noqa: E402
from specrt.export.export import export  # noqa: E402
from specrt.runtime import generate as G  # noqa: E402
from specrt.runtime.governor import DSparkGovernor, FixedGovernor, OffGovernor  # noqa: E402
from specrt.runtime.grammar import Constraint, compile_constraint  # noqa: E402
from specrt.runtime.sampling import SamplingParams, make_rng, probs  # noqa: E402
from specrt.runtime.session import read_d2t  # noqa: E402
from specrt.runtime.text import Text  # noqa: E402
from specrt.runtime.verify import LazyRows, verify_sampling  # noqa: E402
from tests.runtime.test_verify import chi2_pvalue  # noqa: E402

DEPTHS = (1, 2, 3, 4)
CORPUS = ['{"color": "red", "ok": true, "n": 12}', '{"name": "Paris", "age": 42}', "abc-123 xyz 7",
          '["a", "b", "c"]', "yes no maybe"]
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}
SCHEMA_NUM = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "name": {"type": "string", "maxLength": 6}},
              "required": ["n", "name"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2}"
CONSTRAINTS = [Constraint.json_schema(SCHEMA), Constraint.json_schema(SCHEMA_NUM), Constraint.regex(REGEX),
               Constraint.choice(["yes", "no", "maybe"]), Constraint.regex("(ab){6}"),
               Constraint.lark('start: "[" item ("," item)? ("," item)? "]"\nitem: "a" | "b"')]


def _bpe(folder) -> None:
    """A byte-level BPE tokenizer.json (all 256 bytes, merges of CORPUS) with an EOS <|end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))


def guided_engines(root, tokenizer=_bpe):
    """Engines in ``root``/"eng" of a tiny random Llama with _bpe's tokenizer (EOS <|end|>), a
    chat template of role lines, and a random P-EAGLE draft, depths 1-4, context 256
    (``tokenizer``: another writer of a tokenizer.json with <|end|> into a folder)."""
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    (root / "tok").mkdir()
    tokenizer(root / "tok")
    text = Text(root / "tok")
    vocab, eos = text.vocab_size, text.tokenizer.token_to_id("<|end|>")
    t = write_tiny_target(root / "t", "llama", vocab_size=vocab, eos_token_id=eos, bos_token_id=None)
    (t / "tokenizer.json").write_bytes((root / "tok" / "tokenizer.json").read_bytes())
    (t / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>", "chat_template": (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}")}))
    d = write_tiny_draft(root / "d", t, kind="peagle", num_layers=1, draft_vocab=vocab, mask_token_id=vocab - 1)
    export(t, d, root / "exp")
    build_engines(root / "exp", "onnxruntime", DEPTHS, root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=256)
    return root / "eng"


@pytest.fixture(scope="module")
def guided(tmp_path_factory):
    """(engines, Text, eos ids) of guided_engines."""
    folder = guided_engines(tmp_path_factory.mktemp("guided"))
    engines = load_engines(folder)
    engines.activate()
    yield engines, Text(engines.export_dir), tuple(engines.export["target"]["eos_token_ids"])
    engines.deactivate()


@pytest.fixture(scope="module")
def engines_dir(guided):
    return guided[0].folder


def _gen(engines, governor, params=SamplingParams()):
    return G.Generator(engines, governor, params, read_d2t(engines.export_dir, engines.export))


def _governors(engines):
    costs = {d: 1e-3 * (1 + 0.05 * d) for d in (0, *DEPTHS)}
    out = [("fixed:2", FixedGovernor(DEPTHS, 2)), ("fixed:4", FixedGovernor(DEPTHS, 4)),
           ("dspark", DSparkGovernor(DEPTHS, 2e-4, costs))]
    if engines.verifies_trees():  # (token trees under the grammar, h76l; auto is dspark:tree=3:ngram:grow)
        tree = FixedGovernor(DEPTHS, 2)
        dtree, auto = (DSparkGovernor(DEPTHS, 2e-4, costs) for _ in range(2))
        tree.tree_width = dtree.tree_width = auto.tree_width = 3
        auto.lookup = auto.grow = True
        out += [("fixed:2:tree=3", tree), ("dspark:tree=3", dtree), ("auto", auto)]
    for name, gov in [("fixed:2:ngram", FixedGovernor(DEPTHS, 2)), ("off:ngram", OffGovernor(DEPTHS))]:
        gov.lookup = True
        out.append((name, gov))
    return out


def _satisfies(c: Constraint, s: str) -> None:
    if c.kind == "json_schema":
        obj = json.loads(s)
        assert set(obj) == set(c.value["required"]), s
        for k, v in obj.items():
            spec = c.value["properties"][k]
            if "enum" in spec:
                assert v in spec["enum"], s
            elif spec["type"] == "boolean":
                assert isinstance(v, bool), s
            elif spec["type"] == "integer":
                assert isinstance(v, int) and spec["minimum"] <= v <= spec["maximum"], s
            else:
                assert isinstance(v, str) and len(v) <= spec["maxLength"], s
    elif c.kind == "regex":
        assert re.fullmatch(c.value, s), s
    elif c.kind == "choice":
        assert s in c.value, s
    else:
        assert re.fullmatch(r"\[[ab](,[ab]){0,2}\]", s), s


PROMPTS = [[5, 9, 2, 6, 5, 3], [40, 41, 42, 43, 44, 45, 46, 47], [7, 7, 7, 7]]


def test_guided_speculation_equals_guided_target_only_decoding(guided, monkeypatch):
    """For each grammar and prompt, greedy output under every speculative configuration (fixed
    depths, DSpark, token trees, prompt lookup forced into every round it can take) equals the masked
    target-only output token for token, ends where the grammar is complete (finish "stop" or an
    EOS where it accepts) and its text matches the grammar. Guards the masks of the verify rows
    (after the accepted drafts) and the matcher's rollback: without them the output is the
    unconstrained one, which no grammar here matches; and a tree's runner-up's row, masked after
    it (h76l: the tree governors' runners-up win rounds; fails with trees off under a grammar, and
    with the runners-up's rows unmasked)."""
    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    accepted, wins = 0, {}
    for c, prompt in product(CONSTRAINTS, PROMPTS):
        g = compile_constraint(c, text, engines.export["target"]["vocab_size"], eos)
        ref_gen = _gen(engines, OffGovernor(DEPTHS))
        ref = ref_gen.generate(prompt, 60, eos, g)
        assert ref_gen.finished.reason in ("stop", "eos"), (c.kind, ref_gen.finished, text.decode(ref))
        body = ref[:-1] if ref[-1] in eos else ref
        _satisfies(c, text.decode(body))
        for name, gov in _governors(engines):
            gen = _gen(engines, gov)
            assert gen.generate(prompt, 60, eos, g) == ref, f"{name} {c.label} {prompt}: output differs"
            assert gen.finished.reason == ref_gen.finished.reason
            t = gen.telemetry.to_json()
            accepted += t["accepted"] + sum(m["accepted"] for m in t["lookup"]["by_match"].values())
            wins[name] = wins.get(name, 0) + t["tree"]["sibling_accepts"]
    assert accepted > 0  # drafts were accepted under the masks (the forced grammars' lookups)
    if engines.verifies_trees():  # each tree governor's runners-up won rounds (h76l: fails with trees off)
        assert all(wins[name] > 0 for name in ("fixed:2:tree=3", "dspark:tree=3", "auto")), wins


@pytest.fixture(scope="module")
def screened(guided, tmp_path_factory):
    """guided's export built with a screened head (`specrt build --target-head screened`), activated."""
    folder = tmp_path_factory.mktemp("screened") / "eng"
    build_engines(guided[0].export_dir, "onnxruntime", DEPTHS, folder, log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=256, target_head="screened")
    engines = load_engines(folder)
    assert engines.head is not None
    engines.activate()
    yield engines
    engines.deactivate()


def test_guided_greedy_on_screened_head_engines_is_the_full_heads(guided, screened):
    """h77b (session 76's gap: m76i's M61, h76a's "Left"; the fixtures built no screened head):
    engines with a screened head under a grammar give the full head's guided target-only output
    token for token, under off, fixed:3 and a tree (fixed:2:tree=3), 6 grammars x 3 prompts.
    Mutants: the fp32 rows not asked for under a grammar (the masked argmax of the int8 rows: 3
    answers differ), the screen kept on under a grammar (a tree's winning runner-up read through
    it: 16 answers differ or fail)."""
    engines, text, eos = guided
    for c, prompt in product(CONSTRAINTS, PROMPTS):
        g = compile_constraint(c, text, engines.export["target"]["vocab_size"], eos)
        ref = _gen(engines, OffGovernor(DEPTHS)).generate(prompt, 24, eos, g)
        tree = FixedGovernor(DEPTHS, 2)
        tree.tree_width = 3 if screened.verifies_trees() else 1
        for gov in (OffGovernor(DEPTHS), FixedGovernor(DEPTHS, 3), tree):
            assert _gen(screened, gov).generate(prompt, 24, eos, g) == ref, (c.kind, prompt, gov)


def test_guided_coupled_sampling_is_target_only_samplings_text(guided, monkeypatch):
    """Coupled sampling (each position's Gumbel draw a function of the seed and the position)
    under a grammar: every speculative configuration gives guided target-only sampling's tokens
    for the seed, and sampled answers (rejection sampling's too) match their grammar. Guards the sampled rows' masks after
    the accepted drafts (verify_coupled reads them through row_probs)."""
    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    vocab = engines.export["target"]["vocab_size"]
    for c, seed in product(CONSTRAINTS, (1, 2)):
        g = compile_constraint(c, text, vocab, eos)
        params = SamplingParams(temperature=0.8, seed=seed, coupled=True)
        ref_gen = _gen(engines, OffGovernor(DEPTHS), params)
        ref = ref_gen.generate(PROMPTS[0], 60, eos, g)
        if ref_gen.finished.reason != "length":
            _satisfies(c, text.decode(ref[:-1] if ref[-1] in eos else ref))
        for name, gov in _governors(engines):
            assert _gen(engines, gov, params).generate(PROMPTS[0], 60, eos, g) == ref, f"{name} {c.label} {seed}"
            # rejection sampling (its text follows the drafts): each answer matches the grammar too
            gen = _gen(engines, gov, SamplingParams(temperature=0.8, seed=seed))
            out = gen.generate(PROMPTS[0], 60, eos, g)
            if gen.finished.reason != "length":
                _satisfies(c, text.decode(out[:-1] if out[-1] in eos else out))


def test_a_guided_trees_runners_up_are_allowed_and_win_with_their_rows_masked(guided, monkeypatch):
    """Under a grammar a tree governor's runners-up are drawn among the tokens the grammar allows
    at the round's first position (the draft's masked row), and the row after a winning one is
    masked after it. Greedy and coupled sampling give target-only decoding's tokens, with the
    runners-up made the grammar's own tokens so that they win rounds (h76l: until then a guided
    stream verified a chain; fails with trees off under a grammar, with a runner-up's row read
    unmasked, and with runners-up the grammar refuses drawn)."""
    engines, text, eos = guided
    if not engines.verifies_trees():
        pytest.skip("these engines do not verify token trees")
    vocab = engines.export["target"]["vocab_size"]
    g = compile_constraint(Constraint.regex("(ab){6}"), text, vocab, eos)
    drawn, runners_up = [], G.Generator._runners_up

    def spy(self, row, first):  # the draft's own runners-up: each one allowed at its position
        out = runners_up(self, row, first)
        drawn.append(self._sib_allowed is not None and len(out) > 0 and bool(self._sib_allowed[out].all()))
        return out

    monkeypatch.setattr(G.Generator, "_runners_up", spy)
    gen = _gen(engines, FixedGovernor(DEPTHS, 2))
    gen.governor.tree_width = 3
    assert gen.generate(PROMPTS[0], 40, eos, g) == _gen(engines, OffGovernor(DEPTHS)).generate(PROMPTS[0], 40, eos, g)
    assert drawn and all(drawn)
    for params in (SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)):
        ref = _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[0], 40, eos, g)
        grammar_tokens = sorted({t for t in ref if t not in eos})
        monkeypatch.setattr(G.Generator, "_runners_up", lambda self, row, first: [t for t in grammar_tokens
                                                                                   if t != first])
        tree = FixedGovernor(DEPTHS, 2)
        tree.tree_width = 3
        gen = _gen(engines, tree, params)
        assert gen.generate(PROMPTS[0], 40, eos, g) == ref, params
        assert gen.telemetry.to_json()["tree"]["sibling_accepts"] > 0, params  # a runner-up won a round


def test_a_guided_stream_ends_where_the_grammar_is_complete(guided):
    """A choice's answer is the choice alone, finish "stop" (no EOS after it), even with room for more."""
    engines, text, eos = guided
    g = compile_constraint(Constraint.choice(["yes", "no", "maybe"]), text, engines.export["target"]["vocab_size"], eos)
    gen = _gen(engines, FixedGovernor(DEPTHS, 3))
    out = gen.generate([1, 2, 3], 50, eos, g)
    assert text.decode(out) in ("yes", "no", "maybe") and gen.finished.reason == "stop"


@pytest.mark.parametrize("bad, said", [(Constraint.regex("[0-9]{3"), "regex: .*unclosed counted repetition"),
                                       (Constraint.json_schema({"type": "wat"}), "json_schema: .*wat"),
                                       (Constraint.json_schema([1]), "json_schema: expected a JSON schema"),
                                       (Constraint.choice([]), "choice: expected a non-empty list"),
                                       (Constraint.lark("start: nothere"), "grammar: .*nothere"),
                                       (Constraint.regex("", name="--regex"), "--regex: expected a non-empty"),
                                       # m76i-18: a blank grammar is named so, not by llguidance's parse error
                                       (Constraint.lark(" \n"), "grammar: expected a Lark or GBNF grammar"),
                                       # m76i-19: a GBNF grammar llguidance cannot convert (a ValueError there)
                                       (Constraint.lark("root ::= ("), "grammar: Failed to convert the grammar from "
                                                                       "GBNF to Lark: Expected '\\)'")])
def test_a_bad_grammar_is_a_user_error_naming_it(guided, bad, said):
    engines, text, eos = guided
    with pytest.raises(UserError, match=said):
        compile_constraint(bad, text, engines.export["target"]["vocab_size"], eos)


def test_an_object_schema_without_additional_properties_takes_only_its_own_keys(guided):
    """w76j: a schema as pydantic's model_json_schema() writes it (no "additionalProperties")
    let the model write keys of its own after the schema's: SmolLM2 asked to "Describe Paris."
    under a five-key City model went on with "city", "language", ... until max_tokens, invalid
    JSON (vLLM's default backend, xgrammar, holds such an object to its keys, as OpenAI's strict
    schemas do). Now after the last key the object closes; nested objects too; a schema that
    says "additionalProperties": true keeps them open, and so do objects whose keys come from
    several schemas (allOf, properties beside anyOf)."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    inner = {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}
    loose = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "in": inner},
             "required": ["color", "in"]}
    ends = {t: text.decode([t]) for t in range(vocab)}
    comma = [t for t, s in ends.items() if s.startswith(",")]
    brace = [t for t, s in ends.items() if s.startswith("}")]

    def after(schema, prefix):
        guide = compile_constraint(Constraint.json_schema(schema), text, vocab, eos).guide()
        for t in text.tokenizer.encode(prefix, add_special_tokens=False).ids:
            assert guide.allowed()[t], (prefix, t)
            guide.consume(t)
        ok = guide.allowed()
        return ok[comma].any(), ok[brace].any()

    assert after(loose, '{"color": "red", "in": {"x": true') == (False, True)
    assert after(loose, '{"color": "red", "in": {"x": true}') == (False, True)
    assert after({**loose, "additionalProperties": True}, '{"color": "red", "in": {"x": true}') == (True, True)
    # keys from several schemas stay open (closing each part made these unsatisfiable, a 400)
    mixed = {"type": "object", "properties": {"kind": {"const": "x"}}, "required": ["kind"],
             "anyOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]}]}
    parts = {"type": "object", "allOf": [{"properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                                         {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]}
    assert after(mixed, '{"kind": "x", "a": true')[1] and after(parts, '{"a": true, "b": true')[1]


def test_digit_and_word_classes_are_ascii_as_vllm_and_json_schema_read_them(guided):
    """w76j: llguidance reads \\d and \\w as Unicode's classes: SmolLM2 asked for a date under
    guided_regex \\d{4}-\\d{2}-\\d{2} wrote "🯸🯸🯸🯸-🯸🯸-" (U+1FBF8), where vLLM's default backend
    (xgrammar) and JSON Schema's patterns (ECMA-262) allow 0-9 alone. Now no token that starts
    outside ASCII is allowed, in a regex, a class holding \\d or \\w, and a schema's pattern; an
    escaped backslash before a d stays a backslash and a d."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    starts_ascii = np.array([text.decode([t]).isascii() for t in range(vocab)])

    def first(c, prefix=""):
        guide = compile_constraint(c, text, vocab, eos).guide()
        for t in text.tokenizer.encode(prefix, add_special_tokens=False).ids:
            guide.consume(t)
        return guide.allowed()

    for c, prefix in [(Constraint.regex(r"\d{4}-\d{2}"), ""), (Constraint.regex(r"[\w.]+"), ""),
                      (Constraint.regex(r"a[^\W]"), "a"),
                      (Constraint.json_schema({"type": "string", "pattern": r"^\d+$"}), '"')]:
        ok = first(c, prefix)
        assert ok.any() and not ok[~starts_ascii].any(), c
    ok = first(Constraint.regex(r"\\d"))
    assert ok.any() and all(text.decode([t]).startswith("\\") for t in ok.nonzero()[0])


def test_a_kept_grammar_starts_each_stream_without_building_its_parser_again(guided):
    """w76j: a kept grammar (Session.grammar_of: a server's clients send the same schema again)
    built llguidance's parser again for every stream (LLMatcher, as long as compiling: 2 s a
    request for a 730 KB schema); each guide now copies a matcher built once (under 10 ms), and
    each starts where the answer starts, whatever the guides before it took."""
    import time

    import llguidance

    engines, text, eos = guided
    props = {f"field_{i:05d}": {"enum": [f"value_{i}_a", f"value_{i}_b"]} for i in range(2000)}
    schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    g = compile_constraint(Constraint.json_schema(schema), text, engines.export["target"]["vocab_size"], eos)
    t = time.perf_counter()
    llguidance.LLMatcher(g.tokenizer, g.source, log_level=0)
    build = time.perf_counter() - t
    first = g.guide()
    start = first.allowed()
    first.consume(int(start.nonzero()[0][0]))
    took = []
    for _ in range(3):
        t = time.perf_counter()
        guide = g.guide()
        took.append(time.perf_counter() - t)
        assert guide.position == 0 and np.array_equal(guide.allowed(), start)
    assert min(took) < build / 10, (took, build)


def test_a_grammar_no_token_can_start_is_refused_not_a_hang(guided, tmp_path):
    """A tokenizer without the bytes a grammar needs (a byte-level BPE whose alphabet is the
    letters of "hello world": no token spells "7"): the stream is refused when asked for,
    naming the grammar, before any decoding; a tokenizer llguidance cannot read (a word-level
    one, which has no byte-level decoder) is a UserError saying so."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    engines, _, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=40))
    tok.save(str(tmp_path / "tokenizer.json"))
    g = compile_constraint(Constraint.regex("7+", name="--regex"), Text(tmp_path), vocab, eos)
    with pytest.raises(UserError, match="--regex: no token of the vocabulary can continue the answer 0 token"):
        _gen(engines, FixedGovernor(DEPTHS, 2)).stream([1, 2, 3], 20, eos, g)
    words = Tokenizer(models.WordLevel({"hello": 0, "world": 1}, unk_token="hello"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (tmp_path / "w").mkdir()
    words.save(str(tmp_path / "w" / "tokenizer.json"))
    with pytest.raises(UserError, match="structured output: llguidance cannot read this tokenizer.json"):
        compile_constraint(Constraint.regex("7+"), Text(tmp_path / "w"), vocab, eos)


def _masked_p(guide, logits_row, params):
    return probs(guide.masked(logits_row)[None], params)[0]


def test_masked_rejection_sampling_is_the_masked_targets_distribution(guided):
    """One verify round of two drafts drawn from an unmasked q, through the guide's rows (row k
    masked after drafts 1..k, as generate.py asks for them) and verify_sampling, then the
    grammar's second token drawn target-only where the round gave one: the first two tokens'
    joint distribution equals masked target-only sampling's, computed exactly (chi-square).
    Guards row_probs' advance: rows masked before the drafts (the first row's mask at every
    position) put mass on tokens the grammar refuses after the first."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    c = Constraint.regex("[abc][0-9xyz]")
    g = compile_constraint(c, text, vocab, eos)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0)
    base = rng.normal(0, 1.0, (3, vocab)).astype(np.float32)  # rows by position (the prefix only shifts them)

    def logits(prefix: tuple) -> np.ndarray:
        return base[len(prefix)] + 0.5 * np.float32(sum(prefix) % 3)

    # exact: P(t1) P(t2 | t1) under the masked rows
    ref = g.guide()
    p0 = _masked_p(ref, logits(()), params)
    exact = {}
    for t1 in np.flatnonzero(p0):
        gd = g.guide()
        gd.consume(t1)
        if gd.stopped:
            exact[(int(t1),)] = p0[t1]
            continue
        p1 = _masked_p(gd, logits((int(t1),)), params)
        for t2 in np.flatnonzero(p1):
            exact[(int(t1), int(t2))] = p0[t1] * p1[t2]
    q = np.abs(rng.normal(0, 1, (2, vocab))) ** 3
    q /= q.sum(-1, keepdims=True)  # unmasked: most of its mass on tokens the grammar refuses
    keys = sorted(exact)
    counts = np.zeros(len(keys))
    draws = make_rng(1)
    n = 20000
    for _ in range(n):
        drafts = np.array([draws.choice(vocab, p=q[0]), draws.choice(vocab, p=q[1])])
        gd = g.guide()
        p = LazyRows(lambda k: gd.row_probs(logits(tuple(int(t) for t in drafts[:k])), drafts, k, params), 3, vocab)
        v = gd.settle(verify_sampling(p, q, drafts, draws))
        seq = tuple(int(t) for t in v.tokens[:2])
        if len(seq) == 1 and not gd.stopped:  # the grammar's second token, target-only
            p1 = _masked_p(gd, logits(seq), params)
            seq += (int(draws.choice(vocab, p=p1)),)
        counts[keys.index(seq)] += 1
    assert chi2_pvalue(counts, n * np.array([exact[k] for k in keys])) > 1e-3



def _run(*args):
    from click.testing import CliRunner

    from specrt.cli import main

    return CliRunner().invoke(main, ["run", *map(str, args)])


def test_run_holds_each_answer_to_the_structured_output_option(engines_dir, tmp_path):
    """`specrt run --json-schema / --json / --regex / --choice / --grammar`: the answer matches
    (each but --json one of the grammars the identity test decodes), and --governor off gives the
    same text as the default governor (the draft, lookup and trees left to chains)."""
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.lark").write_text(CONSTRAINTS[-1].value)
    for opts, c in [(["--json-schema", tmp_path / "s.json"], CONSTRAINTS[0]), (["--regex", REGEX], CONSTRAINTS[2]),
                    (["--choice", "yes", "--choice", "no", "--choice", "maybe"], CONSTRAINTS[3]),
                    (["--grammar", tmp_path / "g.lark"], CONSTRAINTS[-1]), (["--json"], None)]:
        texts = set()
        for gov in ("off", "fixed:3:ngram"):
            r = _run(engines_dir, "--prompt", "hello", "--max-new-tokens", 60, "--governor", gov, *opts)
            assert r.exit_code == 0, r.output
            texts.add(r.stdout.split("\n")[0])
        assert len(texts) == 1, (opts, texts)
        answer = texts.pop()
        if c is None:  # (a random model's object is cut by the budget: its start)
            assert answer.startswith("{"), answer
        else:
            _satisfies(c, answer)


@pytest.mark.parametrize("opts, said", [
    (["--regex", "[0-9"], "--regex: "), (["--regex", ""], "--regex: expected a non-empty regular expression"),
    (["--choice", "a", "--choice", ""], "--choice: expected a non-empty list of non-empty strings"),
    (["--json", "--regex", "a"], "--json and --regex: give one structured output option at most"),
    (["--json-schema", "BAD"], "--json-schema BAD: not valid JSON"),
    (["--json-schema", "WAT"], "--json-schema WAT: .*wat"),
    (["--grammar", "LARK"], "--grammar LARK: .*nothere"),
    # m76i-14: a grammar file that is not UTF-8 is named (a traceback without the check); h77b: with
    # what it should hold (session 76's words were JSON's in paths.read_utf8, so run read it itself)
    (["--grammar", "BIN"], r"--grammar BIN: expected a Lark or GBNF grammar in UTF-8 text \('utf-8' codec can't "
                           r"decode byte 0xff in position 8")])
def test_run_refuses_a_bad_structured_output_option_naming_it(engines_dir, tmp_path, opts, said):
    files = {"BAD": ("bad.json", "{not json"), "WAT": ("wat.json", '{"type": "wat"}'),
             "LARK": ("g.lark", "start: nothere"), "BIN": ("bin.lark", b'start: "\xff"')}
    for k, (name, body) in files.items():
        (tmp_path / name).write_bytes(body if isinstance(body, bytes) else body.encode())
        opts = [str(tmp_path / name) if o == k else o for o in opts]
        said = said.replace(k, re.escape(str(tmp_path / name)))
    r = _run(engines_dir, "--prompt", "hello", "--max-new-tokens", 8, *opts)
    assert r.exit_code == 1 and re.search("error: " + said, r.output), r.output
    assert "Traceback" not in r.output


def test_a_constraints_key_is_made_once():
    """h77b (NOTES, session 76): Session.grammar_of asked Constraint.key() (json.dumps of the
    schema) at each call, and serve calls it at the request, then stream and stream_ids: three
    dumps of a 1.7 MB schema a request (~60 ms; ~20 ms kept). The key is made once, the
    schema's key order kept (m76i). Fails with the key dumped at each call (a new str each)."""
    c = Constraint.json_schema({"type": "object", "properties": {"b": {}, "a": {}}})
    assert c.key() is c.key() and c.key() == '["json_schema", {"type": "object", "properties": {"b": {}, "a": {}}}]'


def test_without_llguidance_structured_output_names_the_extra(guided, monkeypatch):
    """llguidance is optional: without it a constraint is a UserError naming the extra to install."""
    import sys

    engines, text, eos = guided
    monkeypatch.setitem(sys.modules, "llguidance", None)  # (import then raises ImportError)
    with pytest.raises(UserError, match=r"regex: structured output needs the llguidance package: "
                                        r"pip install 'specrt\[structured\]'"):
        compile_constraint(Constraint.regex("a"), text, engines.export["target"]["vocab_size"], eos)
    # allowed token ids alone need no grammar (h79d): held without it, and their ids checked
    g = compile_constraint(Constraint.tokens([5, 7]), None, engines.export["target"]["vocab_size"], eos)
    assert set(_gen(engines, FixedGovernor(DEPTHS, 2)).generate(PROMPTS[0], 6, eos, g)) <= {5, 7}
    for ids, said in (([], "expected at least one allowed token id"), ([5, 10**6], "token id 1000000 is not in the "
                                                                                  "vocabulary"),
                      ([True], "the allowed token ids must be integers")):
        with pytest.raises(UserError, match=f"allowed_token_ids: {said}"):
            compile_constraint(Constraint.tokens(ids), None, engines.export["target"]["vocab_size"], eos)


def test_a_new_grammars_first_stream_builds_its_parser_once(guided, monkeypatch):
    """h76l: the first request with a new schema built llguidance's parser twice (the check,
    validate_grammar_with_warnings, then the streams' matcher: 0.18 s and 0.24 s for a 2000-field
    schema); now the checked matcher is the one the streams copy, and a refused grammar is still a
    UserError naming it. Fails with the check and the matcher built apart."""
    import llguidance

    real, built = llguidance.LLMatcher, []

    class Counting:  # llguidance's LLMatcher, counting the parsers built
        def __call__(self, *args, **kwargs):
            built.append(args[1])
            return real(*args, **kwargs)

        def validate_grammar_with_warnings(self, *args):
            built.append(args[0])
            return real.validate_grammar_with_warnings(*args)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(llguidance, "LLMatcher", Counting())
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    g = compile_constraint(Constraint.json_schema(SCHEMA_NUM), text, vocab, eos)
    out = _gen(engines, FixedGovernor(DEPTHS, 2)).generate(PROMPTS[0], 60, eos, g)
    _satisfies(g.constraint, text.decode(out[:-1] if out[-1] in eos else out))
    assert len(built) == 1, len(built)
    with pytest.raises(UserError, match="regex: .*unclosed counted repetition"):
        compile_constraint(Constraint.regex("[0-9]{3"), text, vocab, eos)


def test_each_move_of_the_matcher_leaves_no_stale_mask(guided):
    """Session 77's final read: Guide keeps the mask made for the tokens its matcher holds, and
    reset it by hand at each of the matcher's moves (consume, settle's rollback, sibling_row's
    rollback); now every move goes through one wrapper (grammar._Matcher) that forgets it. Each
    path below makes the mask, moves, and must then give the mask a fresh guide gives for the
    tokens it holds: take, advance, argmaxes (consumes), sibling_row (consume and rollback),
    settle (rollback alone, and rollback and consume). Mutants: the wrapper's try_consume or
    rollback keeping the mask (and, before it, each of Guide's three resets left out) fail it."""
    from specrt.runtime.verify import Verdict

    engines, text, eos = guided
    g = compile_constraint(Constraint.regex(REGEX), text, engines.export["target"]["vocab_size"], eos)
    t = [text.tokenizer.token_to_id(c) for c in "123"]  # (a digit's mask allows every digit)

    def fresh(tokens):
        other = g.guide()
        for x in tokens:
            other.take(x)
        return other.allowed().copy()

    def same(guide, tokens, what):
        got = guide.allowed()
        assert np.array_equal(got, fresh(tokens)), f"{what}: a stale mask ({got.sum()} tokens allowed)"

    guide = g.guide()
    guide.allowed()
    guide.take(t[0])  # consumes
    same(guide, t[:1], "take")
    logits = np.zeros((3, guide.vocab), np.float32)
    sib = int(np.flatnonzero(guide.allowed() & (np.arange(guide.vocab) != t[1]))[0])
    guide.sibling_row(logits[0], sib)  # consumes the runner-up, rolls it back
    same(guide, t[:1], "sibling_row")
    guide.advance(t[1:], 1)  # consumes a draft
    same(guide, t[:2], "advance")
    guide.settle(Verdict(0, np.asarray(t[1:1], np.int64)))  # rolls the draft back, consumes nothing
    same(guide, t[:1], "settle (a rollback)")
    logits[0, t[1]] = logits[1, t[2]] = 1.0
    guide.argmaxes(logits, t[1:3], lambda k: None)  # consumes the drafts it accepts
    same(guide, t[:3], "argmaxes")
    guide.settle(Verdict(1, np.asarray(t[1:3], np.int64)))  # rolls back, consumes the round's tokens
    same(guide, t[:3], "settle")


def test_a_schema_changed_in_place_after_its_constraint_is_made_is_not_seen(guided):
    """Session 77's leftover (NOTES): Constraint.key was made at its first use, source() read the
    schema when compiled: a schema dict changed in place after the key was asked for (serve asks
    at the request) was compiled as changed under the first key, so a Session's next constraint
    of the first schema got the changed grammar ('{"color": "green"}' for an enum of "red"). Now
    the value as it was when the Constraint was made is the constraint (its text, made then)."""
    from specrt.runtime.session import Session

    engines, _, _ = guided
    text = '{"type": "object", "properties": {"color": {"enum": ["red"]}}, "required": ["color"]}'
    schema = json.loads(text)
    c = Constraint.json_schema(schema)
    c.key()
    schema["properties"]["color"]["enum"] = ["green"]
    with Session(engines.folder, "off") as s:
        first = "".join(s.stream("hello", max_new_tokens=20, grammar=c))
        again = "".join(s.stream("hello", max_new_tokens=20, grammar=Constraint.json_schema(json.loads(text))))
    assert first == again == '{"color": "red"}', (first, again)


def test_a_constraint_of_what_json_cannot_write_is_refused_naming_it():
    """A value json cannot write (a set of choices) is refused when the Constraint is made, naming
    it (its text is made then: it was a TypeError from Session.grammar_of's key)."""
    with pytest.raises(UserError, match=r"^--choice: expected JSON data \(Object of type set is not JSON"):
        Constraint.choice({"yes", "no"}, "--choice")


def test_allowed_token_ids_alone_and_beside_a_grammar_hold_every_token_losslessly(guided, monkeypatch):
    """h79d: Constraint.tokens(ids) (vLLM's allowed_token_ids: no grammar, no llguidance matcher),
    a regex with ``only`` ids (both masks held) and one deferred after a tag (the ids hold the rows
    before it too): under every speculative configuration (trees, lookup forced into every round)
    greedy and coupled sampling give the masked target-only tokens, every token among the ids (an
    EOS not among them: the answer runs to its length). Fails with ``only`` dropped from the masks
    (the free answer's first token is not among them), and with the rows before a tag left free."""
    from dataclasses import replace

    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    vocab = engines.export["target"]["vocab_size"]
    single = {c: text.tokenizer.encode(c, add_special_tokens=False).ids for c in "ab7x "}
    assert all(len(v) == 1 for v in single.values())
    free = _gen(engines, OffGovernor(DEPTHS)).generate(PROMPTS[0], 30, eos)
    some = sorted(set(range(3, 80)) - {free[0]} - set(eos))
    letters = tuple(single["a"] + single["b"])
    cases = [(Constraint.tokens(some), set(some)),
             (replace(Constraint.regex("[ab]{8}"), only=letters), set(letters)),
             (replace(Constraint.regex("[ab]{6}"), after="7", only=letters + tuple(single["7"] + single["x"])),
              set(letters) | {single["7"][0], single["x"][0]})]
    tagged = 0
    for (c, ids), params in product(cases, (SamplingParams(), SamplingParams(temperature=0.8, seed=3, coupled=True))):
        g = compile_constraint(c, text, vocab, eos)
        ref_gen = _gen(engines, OffGovernor(DEPTHS), params)
        ref = ref_gen.generate(PROMPTS[0], 30, eos, g)
        assert set(ref) <= ids, (c, ref)
        if c.kind == "any":
            assert len(ref) == 30 and ref_gen.finished.reason == "length" and ref[0] != free[0]
        elif not c.after:  # (single letters: the grammar's own "ab" refused)
            assert re.fullmatch("[ab]{8}", text.decode(ref)) and len(ref) == 8
        else:  # (the tag spelled from the ids: the grammar after it)
            tagged += "7" in text.decode(ref) and bool(re.fullmatch("[ab7x ]*7[ab]{6}", text.decode(ref)))
        for name, gov in _governors(engines):
            assert _gen(engines, gov, params).generate(PROMPTS[0], 30, eos, g) == ref, f"{name} {c} {params}"
    assert tagged  # (a sampled answer spelled the tag)
