"""A grammar that holds after a text (runtime/grammar.py's Constraint.after and Deferred, h76k):
serve's --reasoning-parser lets a thinking model think freely and holds the grammar from the
token after ``</think>``, as vLLM's structured output with a reasoning parser. Real engines
(tests/runtime/test_grammar.py's tiny Llama with a byte-level BPE and a random P-EAGLE draft):
greedy and coupled sampling under every speculative configuration give target-only decoding's
tokens, the target unmasked until the tag and masked from the next token on."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llguidance")

from specrt.runtime.governor import OffGovernor  # noqa: E402
from specrt.runtime.grammar import Constraint, Deferred, compile_constraint  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402
from specrt.runtime.verify import Verdict  # noqa: E402
from tests.runtime.test_grammar import (DEPTHS, PROMPTS, SCHEMA, _gen, _governors, _satisfies,  # noqa: E402,F401
                                        guided)


def _tag(out: list[int], at: int, n: int = 2) -> tuple[tuple[int, ...], int]:
    """``out``'s n tokens at ``at`` as a tag, and where its first appearance ends."""
    tag = tuple(out[at : at + n])
    return tag, next(k + n for k in range(len(out)) if tuple(out[k : k + n]) == tag)


def test_a_grammar_after_a_tag_holds_from_the_token_after_it_losslessly(guided, monkeypatch):
    """Greedy and coupled sampling: the answer is the target's own up to a two-token tag its
    unguided answer spells, then JSON of the schema (finish "stop"), and every speculative
    configuration (prompt lookup forced into every round, so rounds run across the tag) gives
    target-only decoding's tokens. Fails without Deferred (the grammar held from the first
    token: the tag is never written) and with a round's rows after the tag left unmasked."""
    from tests.runtime.test_generate import _always_look_up

    engines, text, eos = guided
    _always_look_up(monkeypatch)
    vocab = engines.export["target"]["vocab_size"]
    crossed = 0
    start = Deferred._start

    def spy(self, tokens):  # rounds whose rows after the tag were masked within them
        nonlocal crossed
        a = start(self, tokens)
        crossed += not self.active and a is not None and 0 < a < len(tokens)
        return a

    monkeypatch.setattr(Deferred, "_start", spy)
    # (greedy's answers repeat a token or two, which the lookup drafts across the tag; a tag of
    # one token, the first: a tokenizer that writes </think> as one token)
    for prompt, params, at, n in [(PROMPTS[2], SamplingParams(), 0, 4), (PROMPTS[1], SamplingParams(), 11, 2),
                                  (PROMPTS[0], SamplingParams(), 0, 1),
                                  (PROMPTS[0], SamplingParams(temperature=0.8, seed=3, coupled=True), 3, 2)]:
        free = _gen(engines, OffGovernor(DEPTHS), params).generate(prompt, 30, eos)
        tag, end = _tag(free, at, n)
        c = Constraint.json_schema(SCHEMA)
        g = compile_constraint(c, text, vocab, eos)
        g.tag = tag  # (a BPE writes two tokens' text in others: the tag's ids set, not its text's)
        ref_gen = _gen(engines, OffGovernor(DEPTHS), params)
        ref = ref_gen.generate(prompt, 80, eos, g)
        assert ref[:end] == free[:end], (params, text.decode(ref))  # the thinking the target's own
        body = ref[end:-1] if ref[-1] in eos else ref[end:]
        assert ref_gen.finished.reason in ("stop", "eos"), text.decode(ref)
        _satisfies(c, text.decode(body))
        for name, gov in _governors(engines):
            assert _gen(engines, gov, params).generate(prompt, 80, eos, g) == ref, f"{name} {params.mode}"
    assert crossed > 0


def test_a_rounds_rows_after_the_tag_are_masked_within_it(guided):
    """Greedy over made-up logits: a round whose drafts spell the tag and go on; the rows up to
    the tag's end are the target's argmaxes (any token), the rows after it masked (the
    grammar's first token, though the target prefers another), and the verdict settles the
    matcher on the tokens after the tag alone; a tag never spelled leaves every row unmasked
    (the grammar never starts); a round past the grammar's end is cut after its last token, counted
    from the round's start. Fails with the rows after the tag read unmasked (h76k)."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    c = Constraint.choice(["yes", "no"])
    yes = text.tokenizer.encode("yes", add_special_tokens=False).ids
    assert len(yes) == 1  # (one token: the choice complete at it)
    tag = (40, 41)
    g = compile_constraint(c, text, vocab, eos)
    g.tag = tag
    d = g.guide()
    assert isinstance(d, Deferred) and not d.active
    bad = 50  # the target's favourite everywhere: refused by the grammar
    logits = np.zeros((5, vocab), np.float32)
    logits[:, bad] = 9.0
    logits[0, 40] = logits[1, 41] = 10.0  # rows 0, 1: the tag's tokens, the drafts
    logits[2, yes[0]] = 1.0  # the grammar's favourite after it
    drafts = np.array([40, 41, 7, 8], np.int64)
    best = d.argmaxes(logits, drafts, lambda k: None)
    assert best.tolist() == [40, 41, yes[0]]  # row 2 masked: not `bad`
    v = d.settle(Verdict(2, best))
    assert v.tokens.tolist() == [40, 41, yes[0]] and d.active and d.stopped
    d2 = g.guide()
    assert d2.argmaxes(logits[2:], drafts[2:], lambda k: None).tolist() == [bad]  # no tag: the target's own
    d2.settle(Verdict(0, np.array([bad], np.int64)))
    assert not d2.active and d2.masked(logits[2]).argmax() == bad
    # a sampled round accepted past the grammar's end (drafts after "yes"): cut after it, counted from the round's start
    v = g.guide().settle(Verdict(4, np.array([40, 41, yes[0], 7, 8], np.int64)))
    assert v.accepted == 2 and v.tokens.tolist() == [40, 41, yes[0]]


def test_a_tree_rounds_runner_up_row_is_masked_where_the_grammar_holds_after_it(guided):
    """A token tree's runner-up at a round's first position, over made-up logits: before the tag
    and where the runner-up does not end it, the row after it is the target's own (any token);
    where it ends the tag, the grammar's first row (masked); after the tag, masked after the
    runner-up, the matcher given it back; a verdict whose runner-up won settles the matcher on
    the tokens after the tag. Fails with the row after a runner-up that ends the tag read
    unmasked, and without Deferred's runner-up rows (h76l: trees were off under a grammar)."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    ids = {w: text.tokenizer.encode(w, add_special_tokens=False).ids for w in ("yes", "7")}
    assert all(len(t) == 1 for t in ids.values())  # (one token each)
    yes, seven = ids["yes"][0], ids["7"][0]
    g = compile_constraint(Constraint.regex("(yes|no)[0-9]"), text, vocab, eos)
    g.tag = (40, 41)
    bad = 50  # the target's favourite: refused by the grammar everywhere
    row = np.zeros(vocab, np.float32)
    row[bad], row[yes], row[seven] = 9.0, 1.0, 0.5
    d = g.guide()
    assert d.sibling_row(row, 41).argmax() == bad  # before the tag: 41 alone does not end it
    d.take(40)
    assert d.sibling_row(row, 41).argmax() == yes  # 41 ends the tag: the grammar's first row
    assert d.sibling_row(row, 7).argmax() == bad and not d.active  # another runner-up: the target's own
    v = d.settle(Verdict(1, np.array([41, yes], np.int64), 0))  # the runner-up 41 won, its bonus "yes"
    assert v.tokens.tolist() == [41, yes] and v.sibling == 0 and d.active and not d.stopped
    d2 = g.guide()
    d2.take(40)
    d2.settle(Verdict(0, np.array([41], np.int64)))  # the tag complete: a round after it
    assert d2.active and d2.sibling_row(row, yes).argmax() == seven  # masked after "yes": a digit
    assert d2.masked(row).argmax() == yes  # (the matcher given "yes" back)
    d2.settle(Verdict(1, np.array([yes, seven], np.int64), 0))
    assert d2.stopped
