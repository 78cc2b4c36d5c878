"""Structured output's guards found by a mutation round (m76i) over runtime/grammar.py and
generate.py's guide hooks: each test kills a mutant the tests of test_grammar.py let live.
Real engines: test_grammar.py's tiny Llama with a byte-level BPE tokenizer (``guided``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("llguidance")

from specrt import contracts as C  # noqa: E402
from specrt.errors import EngineFailure, UserError  # noqa: E402
from specrt.runtime import generate as G  # noqa: E402
from specrt.runtime.governor import FixedGovernor, OffGovernor  # noqa: E402
from specrt.runtime.grammar import Constraint, compile_constraint  # noqa: E402
from specrt.runtime.sampling import SamplingParams  # noqa: E402
from specrt.runtime.session import read_d2t  # noqa: E402
from specrt.runtime.verify import Verdict  # noqa: E402
from tests.runtime.test_generate import RejectedWithNanRows, _always_look_up, _Hooked  # noqa: E402
from tests.runtime.test_grammar import DEPTHS, PROMPTS, REGEX, guided  # noqa: E402,F401 (a fixture)


class _Hooked(_Hooked):
    """test_generate's _Hooked, the engines' other attributes (the cost table lookup reads) its inner's."""

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _gen(engines, governor, params=SamplingParams()):
    return G.Generator(engines, governor, params, read_d2t(engines.export_dir, engines.export))


def _compiled(guided, c, vocab=None):
    engines, text, eos = guided
    return compile_constraint(c, text, vocab or engines.export["target"]["vocab_size"], eos)


def test_guided_greedy_looks_at_no_row_past_the_first_rejection(guided):
    """m76i-1: argmaxes stops at the first row whose masked argmax differs from its draft (a
    verify call's later rows are none target-only decoding computes). Every draft here is a
    token the grammar refuses (rejected at row 0) and rows 1.. of every verify call are NaN: the
    output is guided `off`'s. Mutant: argmaxes going on past a mismatch (it checked row 1: an
    EngineFailure)."""
    engines, text, eos = guided
    g = _compiled(guided, Constraint.regex(REGEX))
    prompt = PROMPTS[0] * 3  # (18 rows: the prefill's calls are longer than every verify call)
    ref = _gen(engines, OffGovernor(DEPTHS)).generate(prompt, 20, eos, g)
    refused = text.tokenizer.token_to_id("Q")  # (no token of the grammar: [0-9]{3}-[a-z]{2})
    broken = RejectedWithNanRows(engines, refused, refused)
    broken.export_dir, broken.verifies_trees = engines.export_dir, engines.verifies_trees
    gen = _gen(broken, FixedGovernor(DEPTHS, 3))
    assert gen.generate(prompt, 20, eos, g) == ref
    assert gen.telemetry.drafted > 0 and gen.telemetry.accepted == 0


def test_a_guided_greedy_round_names_the_row_it_failed_at(guided, monkeypatch):
    """m76i-2: guided greedy checks each row it uses (argmaxes' ``check``) and names the call's
    row: lookup drafts the grammar's own tokens (accepted), the verify calls' rows 2.. NaN, the
    first round that accepts 2 drafts fails at row 2 of its call. Mutant: the check left out
    (NaN kept where the grammar allows: the masked argmax picks the first allowed token, and
    the answer goes on over NaN logits)."""
    engines, _, eos = guided
    _always_look_up(monkeypatch)
    g = _compiled(guided, Constraint.regex("(ab){6}"))

    def hook(feeds, out, is_draft):
        if not is_draft and feeds[C.POSITION_IDS][0, 0] > 0:  # the verify calls
            out[C.LOGITS][:, 2:] = np.nan
        return out

    gov = OffGovernor(DEPTHS)
    gov.lookup = True
    gen = _gen(_Hooked(engines, hook), gov)
    with pytest.raises(EngineFailure, match=r"^target engine produced NaN logits in row 2 of its call, \d+ token"):
        gen.generate(PROMPTS[0], 40, eos, g)  # (row 2 used: the round's 2 drafts accepted)


def test_a_grammar_no_token_can_continue_mid_answer_counts_the_tokens_held(guided, tmp_path):
    """m76i-3: the error of a grammar the vocabulary cannot continue names how far into the
    answer it stopped: "h7" on a tokenizer that can spell "h" but no "7" fails 1 token in,
    whether that token came as the first token (take), a draft consumed for a row (advance:
    pending) or a round's settled token (settle). Mutants: the counts of take, advance or
    settle left out (0 token(s) in)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from specrt.runtime.text import Text

    engines, _, eos = guided
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=40))
    tok.save(str(tmp_path / "tokenizer.json"))
    text = Text(tmp_path)
    g = compile_constraint(Constraint.regex("h7", name="--regex"), text, engines.export["target"]["vocab_size"], eos)
    said = "--regex: no token of the vocabulary can continue the answer 1 token"
    with pytest.raises(UserError, match=said):  # (the first token "h", then nothing)
        _gen(engines, OffGovernor(DEPTHS)).generate(PROMPTS[0], 20, eos, g)
    h = text.tokenizer.token_to_id("h")
    for step in (lambda gd: gd.advance(np.array([h]), 1), lambda gd: gd.settle(Verdict(0, np.array([h])))):
        gd = g.guide()
        step(gd)
        with pytest.raises(UserError, match=said):
            gd.allowed()


def test_a_choice_with_quotes_and_backslashes_is_its_text(guided):
    """m76i-4: a choice's strings are written into the Lark grammar as string literals, quoted:
    one with a double quote or a backslash is taken as it is (vLLM's guided_choice holds any
    strings), and the answer is one of them. Mutant: the strings put between quotes unescaped
    (a UserError: the grammar llguidance reads is broken)."""
    engines, text, eos = guided
    choices = ['say "hi"', "a\\b", "x\\\"y"]
    gen = _gen(engines, FixedGovernor(DEPTHS, 2))
    out = gen.generate(PROMPTS[0], 30, eos, _compiled(guided, Constraint.choice(choices)))
    assert text.decode(out[:-1] if out[-1] in eos else out) in choices and gen.finished.reason in ("stop", "eos")


def test_engines_whose_vocabulary_is_padded_past_the_tokenizers_allow_none_of_the_pad(guided):
    """m76i-5: engines whose vocabulary is padded past the tokenizer's (as many models' are): the
    mask covers the engines' rows, the pad's ids never allowed. Mutant: llguidance's tokenizer
    made without n_vocab (its own vocabulary: the mask shorter than a row)."""
    engines, text, eos = guided
    vocab = engines.export["target"]["vocab_size"]
    g = _compiled(guided, Constraint.regex(REGEX), vocab + 13)
    allowed = g.guide().allowed()
    assert allowed.shape == (vocab + 13,) and allowed[:vocab].any() and not allowed[vocab:].any()


def _drafting(monkeypatch, answers, runner_up_in: int = 0) -> None:
    """The P-EAGLE draft's tokens replaced by ``answers[0]``'s next ones (its pass still run: its
    KV as it keeps it; past the list's end its last token). ``runner_up_in`` (the vocabulary): the
    right first token a runner-up instead, the chain's first draft the next id (wrong)."""
    real = G.Generator._draft_peagle

    def draft(self, *args):
        drafts, q, conf, t = real(self, *args)
        a, at = answers[0], self._draft_pos
        right = [a[min(at + k, len(a) - 1)] for k in range(len(drafts))]
        if runner_up_in:
            self._siblings = [int(right[0])]
            right[0] = (right[0] + 1) % runner_up_in
        return np.asarray(right, np.int64), q, conf, t

    monkeypatch.setattr(G.Generator, "_draft_peagle", draft)


def _ending_grammars(guided, monkeypatch, params, runner_up: bool = False):
    """m76i-6's answers (r77i's with ``runner_up``): for n = 2..6, (n, the grammar the literal text
    of the guided answer's first n tokens, the answer under it), the draft writing that answer
    and then the target's own unguided continuation (_drafting)."""
    engines, text, eos = guided
    long = _gen(engines, OffGovernor(DEPTHS), params).generate(
        PROMPTS[1], 12, eos, _compiled(guided, Constraint.regex("[a-z]{12}")))
    answers = [long]
    _drafting(monkeypatch, answers, engines.export["target"]["vocab_size"] if runner_up else 0)
    for n in range(2, 7):
        g = _compiled(guided, Constraint.choice([text.decode(long[:n])]))
        ref = _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[1], 12, eos, g)
        answers[0] = ref + _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[1] + ref, 8, eos)
        yield n, g, ref


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)],
                         ids=["greedy", "coupled"])
def test_a_grammar_that_stops_mid_round_ends_the_answer_there(guided, monkeypatch, params):
    """m76i-6: the grammar complete in the middle of a round whose drafts go on as the target
    would: the guided answer of [a-z]{12}, the grammar the literal text of its first n tokens
    (n 1..6: the stop at every offset of a round of 4; the target's picks under it the same),
    the draft writing those n tokens and then the target's own unguided continuation (each
    accepted but for the grammar's stop): the answer is the n tokens, finish "stop", as guided
    `off`'s. Mutants: argmaxes going on past the stop (the next draft, the target's pick there,
    consumed by a stopped matcher: an InternalError), settle not cutting the round there.
    h77b (m76i's observation): the round ended there is no rejection (it counted the draft that
    completed the grammar as refused), and the telemetry counts the tokens taken (1 + rounds +
    accepted, the draft ending the answer the round's + 1, as an EOS draft is)."""
    engines, text, eos = guided
    long = _gen(engines, OffGovernor(DEPTHS), params).generate(
        PROMPTS[1], 12, eos, _compiled(guided, Constraint.regex("[a-z]{12}")))
    answers = [long]
    _drafting(monkeypatch, answers)
    for n in range(1, 7):
        g = _compiled(guided, Constraint.choice([text.decode(long[:n])]))
        ref_gen = _gen(engines, OffGovernor(DEPTHS), params)
        ref = ref_gen.generate(PROMPTS[1], 12, eos, g)
        assert ref == long[:n] and ref_gen.finished.reason == "stop", (n, ref, long)
        answers[0] = ref + _gen(engines, OffGovernor(DEPTHS), params).generate(PROMPTS[1] + ref, 8, eos)
        gen = _gen(engines, FixedGovernor(DEPTHS, 4), params)
        assert gen.generate(PROMPTS[1], 12, eos, g) == ref and gen.finished.reason == "stop", n
        assert gen.telemetry.drafted > 0 or n == 1  # (one token: the prefill's)
        t = gen.telemetry  # (every draft the target's own pick: none refused)
        assert t.rejections == 0 and t.new_tokens == n == 1 + t.rounds + t.accepted, (n, t.to_json())


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)],
                         ids=["greedy", "coupled"])
def test_a_grammar_completed_at_a_winning_runner_up_is_no_rejection(guided, monkeypatch, params):
    """r77i (the review of h77b's m76i-6 mend, its tree case): a token tree whose runner-up wins
    every round (each chain draft wrong, the target's own pick the runner-up), the grammar the
    literal text of the answer's first n tokens: where it completes at a round's runner-up,
    settle cuts the round's bonus and the round was counted a rejection (n even: 1), though a
    runner-up's win is none and a chain's draft completing it is not counted one since h77b
    (nor a runner-up EOS). The tokens are the answer's either way; the telemetry counts the
    tokens taken (1 + rounds + accepted)."""
    engines, _, eos = guided
    assert engines.verifies_trees()
    for n, g, ref in _ending_grammars(guided, monkeypatch, params, runner_up=True):
        tree = FixedGovernor(DEPTHS, 2)
        tree.tree_width = 3
        gen = _gen(engines, tree, params)
        assert gen.generate(PROMPTS[1], 12, eos, g) == ref and gen.finished.reason == "stop", n
        t = gen.telemetry
        assert t.rounds > 0 and t.rejections == 0 and t.new_tokens == n == 1 + t.rounds + t.accepted, \
            (n, t.to_json())


def test_two_schemas_differing_in_property_order_keep_their_own_orders(guided):
    """m76i-7: a Session keeps its compiled grammars by the constraint's text (grammar_of): a
    schema's properties come in its own order (llguidance writes them so, as OpenAI's strict
    schemas promise), so two schemas that differ only in that order are two grammars. It keyed
    them with sorted keys: a server's second client got the first one's order (a bug)."""
    from specrt.runtime.session import Session

    engines, _, _ = guided
    props = {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}}
    with Session(engines.folder, "off") as s:
        for order in (["color", "ok"], ["ok", "color"], ["color", "ok"]):
            schema = {"type": "object", "properties": {k: props[k] for k in order}, "required": ["color", "ok"],
                      "additionalProperties": False}
            answer = "".join(s.stream("hello", max_new_tokens=30, grammar=Constraint.json_schema(schema)))
            assert list(json.loads(answer)) == order, answer


def test_a_constraint_of_an_unknown_kind_is_a_user_error_naming_it(guided):
    """m76i-15: the Python API's Constraint made directly with a kind it does not have (a typo)
    is a UserError naming it and the kinds there are, and a grammar= that is no Constraint (a
    schema given as it is) a UserError saying what is expected. Mutants: either check left out
    (llguidance's TypeError, an AttributeError: tracebacks)."""
    with pytest.raises(UserError, match=r"fmt: unknown kind of constraint 'jsonschema' \(expected one of json_schema, "):
        _compiled(guided, Constraint("jsonschema", {"type": "object"}, "fmt"))
    with pytest.raises(UserError, match=r"grammar=\{'type': 'object'\}: expected a specrt.runtime.grammar.Constraint"):
        _compiled(guided, {"type": "object"})


def test_the_end_of_an_answer_is_the_engines_eos_ids(guided):
    """m76i-16: where the grammar accepts, the mask allows the engines' EOS ids (what the
    Generator stops at: a model's generation_config may name several, or others than the
    tokenizer's), not llguidance's guess from the tokenizer. After "ab" of (ab)+: with EOS ids
    (7,) 7 is allowed and <|end|> (0) is not; with (7, 0) both. Mutant: the LLTokenizer made
    without the engines' EOS ids."""
    engines, text, _ = guided
    vocab = engines.export["target"]["vocab_size"]
    ab = text.tokenizer.encode("ab").ids
    assert text.decode([7]) not in ("a", "ab")
    for eos, refused in (((7,), (0,)), ((7, 0), ())):
        gd = compile_constraint(Constraint.regex("(ab)+"), text, vocab, eos).guide()
        for t in ab:
            gd.consume(t)
        allowed = gd.allowed()
        assert all(allowed[e] for e in eos) and not any(allowed[e] for e in refused), eos


def test_structured_output_without_a_tokenizer_is_a_user_error(guided):
    """m76i-17: engines without tokenizer.json (ids in, ids out) cannot hold an answer to a
    grammar over text: a UserError naming the constraint. Mutant: the check left out (an
    AttributeError on None)."""
    engines, _, eos = guided
    with pytest.raises(UserError, match=r"--json: structured output needs the target's tokenizer"):
        compile_constraint(Constraint.json("--json"), None, engines.export["target"]["vocab_size"], eos)


def test_session_stream_refuses_a_bad_grammar_when_called(guided):
    """m76i-20: Session.stream checks its arguments when called, the grammar too (a UserError
    before anything is read, as its docstring says; serve and run compile first anyway).
    Mutant: the check left to the first piece."""
    from specrt.runtime.session import Session

    engines, _, _ = guided
    with Session(engines.folder, "off") as s:
        with pytest.raises(UserError, match=r"regex: .*unclosed"):
            s.stream("hello", max_new_tokens=4, grammar=Constraint.regex("[0-9"))


def _dspark(tree_width: int = 1):
    """A DSpark whose deeper verify calls cost next to nothing (it verifies deep and, with a tree,
    its runners-up: rounds a grammar can end mid-way)."""
    from specrt.runtime.governor import Calibration, DSparkGovernor

    conf = np.tile(np.linspace(0.0, 1.0, 100), len(DEPTHS))  # (a calibration where every draft is taken)
    cal = Calibration.fit(conf, np.repeat(np.arange(len(DEPTHS)), 100), np.ones(conf.size), kinds=("histogram",),
                          positions=len(DEPTHS))
    gov = DSparkGovernor(DEPTHS, 1e-6, {d: 1e-3 * (1 + 1e-3 * d) for d in (0, *DEPTHS)}, cal)
    gov.tree_width = tree_width
    return gov


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)],
                         ids=["greedy", "coupled"])
def test_dsparks_calibration_learns_a_draft_that_completed_the_grammar_as_taken(guided, monkeypatch, params):
    """Session 77's leftover (NOTES; h77b mended the telemetry alone): DSpark's online calibration
    (Calibration.update from observe) read a round the grammar ended at an accepted draft as that
    draft refused. m76i-6's answers (every draft the target's own pick, the grammar the text of
    the first n tokens): every position the calibration learnt is accepted; the ending draft's is
    learnt taken and the positions after it not at all (it learnt the first as refused).
    h78b."""
    engines, _, eos = guided
    for n, g, ref in _ending_grammars(guided, monkeypatch, params):
        gov = _dspark()
        gen = _gen(engines, gov, params)
        assert gen.generate(PROMPTS[1], 12, eos, g) == ref and gen.telemetry.rejections == 0, n
        assert gen.telemetry.depths == {4: 1}, n  # (one round: the prefill's token, then n - 1 drafts taken)
        cal = gov.calibration  # (its 400 fitted samples, then the round's: a draft the grammar ended at taken)
        assert cal.n.sum() == 400 + min(n - 1, 4) and (cal.a == cal.n).all(), (n, cal.n.sum(), cal.a.sum())


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)],
                         ids=["greedy", "coupled"])
def test_dspark_learns_a_runner_up_that_completed_the_grammar_as_its_win(guided, monkeypatch, params):
    """r77i's answers (each chain draft wrong, the target's own pick the runner-up), DSpark sizing
    its tree: where the grammar completes at a round's winning runner-up (its bonus cut), DSpark
    learns the round as the target judged it, the runner-up's win (it learnt a chain draft of
    rank 1 lost with no runner-up winning; a round cut_at_eos alone would read as the chain's
    draft taken, h78b): no chain draft learnt taken, every runner-up of rank 2 a win."""
    engines, _, eos = guided
    for n, g, ref in _ending_grammars(guided, monkeypatch, params, runner_up=True):
        gov = _dspark(3)
        w0, t0 = gov.SIBLING_PRIOR_TRIES / 4, gov.SIBLING_PRIOR_TRIES  # (rank 2's starting counts)
        gen = _gen(engines, gov, params)
        assert gen.generate(PROMPTS[1], 12, eos, g) == ref, n
        rounds = gen.telemetry.to_json()["tree"]["rounds"]  # (each with one runner-up, the round's winner)
        assert rounds == gen.telemetry.draft_rounds > 0 and gov.sib_wins[0] - w0 == gov.sib_tries[0] - t0 == rounds, n
        cal = gov.calibration  # (its 400 fitted samples, then each round's chain draft refused)
        assert cal.n.sum() == 400 + rounds and cal.a.sum() == 400, (n, cal.n.sum(), cal.a.sum())


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.8, seed=1, coupled=True)],
                         ids=["greedy", "coupled"])
def test_adaptive_learns_a_draft_that_completed_the_grammar_as_taken(guided, monkeypatch, params):
    """h78b (beside DSpark's calibration): the adaptive governor's acceptance estimate read a round
    the grammar ended at an accepted draft as that draft refused (0 of 1 at its first depth, where
    every draft of m76i-6's answers is the target's own pick): it is 1."""
    from specrt.runtime.governor import AdaptiveGovernor

    engines, _, eos = guided
    learnt = 0
    for n, g, ref in _ending_grammars(guided, monkeypatch, params):
        gov = AdaptiveGovernor(DEPTHS)
        gen = _gen(engines, gov, params)
        assert gen.generate(PROMPTS[1], 12, eos, g) == ref and gen.telemetry.rejections == 0, n
        seen = [e for e in gov.est.values() if e[3]]  # (a stream's first round, a catch-up pass, is not learnt)
        assert all(e[2] == 1.0 for e in seen), (n, gov.est)
        learnt += len(seen)
    assert learnt  # (n 4 and 6: the round after the first, the grammar ending at its draft)
