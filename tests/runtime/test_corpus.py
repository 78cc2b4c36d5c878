"""Corpus lookup (runtime/corpus.py): the n-gram tables, chained proposals, priors, the
file (atomic, never unpickled, refused for other engines) and the spec option. The loop
over real engines (greedy identity) is in test_generate.py, `specrt corpus` in tests/cli."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re

import numpy as np
import pytest

from specrt.errors import UserError
from specrt.runtime.corpus import (BINS, DEFAULT_PRIOR, FILE, FINE_BINS, GROW_OFFSET, GROW_PRIORS, GROW_TOKENS,
                                   PRIOR_HOLDOUT, Corpus, Growth, bin_of, build_with_priors, evidence, match_name,
                                   read_sequences)
from specrt.runtime.governor import from_spec, split_lookup, wants_corpus, wants_grow
from specrt.runtime.ngram import PRIOR_ROUNDS, NgramPolicy

from tests.bad_paths import bad_paths

SEQS = [[1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 6], [7, 2, 3, 4, 5, 8], [3, 4, 5, 9, 9, 9]]


def test_longest_match_and_counts():
    c = Corpus.build(SEQS, nmin=2, nmax=4, prune=False)
    # "2 3 4" is followed by 5 twice and 6 once; "1 2 3 4" only by 5 and 6 once each
    assert c.next([2, 3, 4]) == (5, evidence(2, 3), 3)
    assert c.next([0, 1, 2, 3, 4]) == (5, evidence(1, 2), 4)  # a tie: the smaller token id
    assert c.next([3, 4]) == (5, evidence(3, 4), 2)  # "3 4" -> 5 5 5 6
    assert c.next([4]) is None  # shorter than nmin
    assert c.next([8, 8]) is None  # never seen
    assert c.next([9, 7]) is None  # no n-gram crosses from one sequence into the next
    # pruned (the default): "1 2 3 4" (5 once of 2) says what "2 3 4" (5 twice of 3) and
    # "3 4" (5 three times of 4) do, share 0.5-0.95 seen < 5 all: the shortest answers
    p = Corpus.build(SEQS, nmin=2, nmax=4)
    assert p.next([0, 1, 2, 3, 4]) == (5, evidence(1, 2), 2) and len(p) < len(c)
    assert p.tokens.dtype == np.uint16 and p.ev.dtype == np.uint8
    assert (evidence(1, 1), evidence(4, 4), evidence(3, 4), evidence(2, 5), evidence(20, 20)) == (6, 0, 2, 5, 1)


def test_pruning_keeps_every_chain_and_bin():
    """A pruned corpus proposes exactly what the full table does (chain and first-step
    bin), in both binnings, at every context; on repetitive sequences it is much smaller."""
    rng = np.random.default_rng(5)
    seqs = [list(rng.integers(0, 5, size=int(rng.integers(5, 60)))) for _ in range(60)]
    for binning in ("fine", "share"):
        full = Corpus.build(seqs, nmin=3, nmax=8, binning=binning, prune=False)
        pruned = Corpus.build(seqs, nmin=3, nmax=8, binning=binning)
        assert len(pruned) < 0.8 * len(full)
        found = 0
        for i in range(1500):
            ctx = [int(t) for t in rng.integers(0, 5, size=int(rng.integers(2, 12)))]
            if i % 2:  # a window of a sequence, its first token changed: long matches, near misses
                q, m = seqs[i % len(seqs)], len(ctx)
                at = int(rng.integers(0, max(1, len(q) - m)))
                ctx = [ctx[0]] + [int(t) for t in q[at + 1: at + m]]
            got = full.propose(ctx, 6)
            assert pruned.propose(ctx, 6) == got, ctx
            a, b = full.next(ctx), pruned.next(ctx)
            assert (a is None) == (b is None) and (a is None or a[:2] == b[:2]), ctx
            found += bool(got[0]) and full.next(ctx)[2] >= 6
        assert found > 100  # long matches were exercised

def test_growth_counts_as_a_built_corpus():
    """Growth (':grow') holds exactly what Corpus.build would for the same sequences:
    the same token, count, total and n at every context, ties to the smaller id; its
    chains are a corpus's under keys GROW_OFFSET above."""
    rng = np.random.default_rng(3)
    seqs = [list(rng.integers(0, 6, size=int(rng.integers(4, 40)))) for _ in range(30)]
    built, grown = Corpus.build(seqs, nmin=2, nmax=5, prune=False), Growth(nmin=2, nmax=5)
    assert grown.next([1, 2, 3]) is None and grown.propose([1, 2, 3], 4) == ([], 0)
    for q in seqs:
        grown.add(q)
    found = 0
    for _ in range(400):
        ctx = [int(t) for t in rng.integers(0, 6, size=int(rng.integers(1, 8)))]
        assert grown.next(ctx) == built.next(ctx), ctx
        chain, key = built.propose(ctx, 5)
        assert grown.propose(ctx, 5) == (chain, key + GROW_OFFSET if chain else 0)
        found += built.next(ctx) is not None
    assert found > 200  # the contexts did hit
    assert match_name(FINE_BINS["seen once, n>=6"] + GROW_OFFSET) == "grown seen once, n>=6"
    assert set(Growth.source_priors()) == {b + GROW_OFFSET for b in FINE_BINS.values()}
    assert set(GROW_PRIORS) <= set(Growth.source_priors())


def test_growth_file_round_trip_and_refusals(tmp_path):
    """Growth.save writes the sequences held (not the tables); Growth.load makes the same
    tables from them, keeping the newest within its own cap; a file for another export,
    with ids outside the vocabulary, inconsistent, or not a growth file is refused by name."""
    rng = np.random.default_rng(7)
    g = Growth(max_tokens=400)
    for _ in range(30):
        g.add([int(t) for t in rng.integers(0, 9, size=int(rng.integers(3, 30)))])
    path = tmp_path / "g.npz"
    g.save(path, export_digest="ab" * 32)
    assert [p.name for p in tmp_path.iterdir()] == ["g.npz"]  # written whole, no temporary left
    back = Growth.load(path, vocab_size=9, export_digest="ab" * 32, max_tokens=400)
    assert back.table == g.table and list(back.seqs) == list(g.seqs) and back.tokens == g.tokens
    small = Growth.load(path, vocab_size=9, max_tokens=50)  # a smaller cap: the newest only
    assert 1 <= len(small.seqs) < len(g.seqs) and list(small.seqs) == list(g.seqs)[-len(small.seqs):]
    assert small.tokens <= 50 or len(small.seqs) == 1
    assert small.table == _grown(list(small.seqs), 3, 8).table
    with pytest.raises(UserError, match="g.npz: written for another export"):
        Growth.load(path, vocab_size=9, export_digest="cd" * 32)
    with pytest.raises(UserError, match=r"g.npz: token ids outside the vocabulary \[0, 5\)"):
        Growth.load(path, vocab_size=5)
    Corpus.build([[1, 2, 3, 4]]).save(tmp_path / "c.npz")
    with pytest.raises(UserError, match="c.npz: not a growth file"):
        Growth.load(tmp_path / "c.npz", vocab_size=9)
    with open(tmp_path / "bad.npz", "wb") as f:
        np.savez(f, tokens=np.arange(5, dtype=np.int32), lengths=np.array([2, 2]),
                 meta=np.frombuffer(b'{"format": 1, "kind": "specrt growth"}', np.uint8))
    with pytest.raises(UserError, match="bad.npz: inconsistent growth arrays"):
        Growth.load(tmp_path / "bad.npz", vocab_size=9)
    # its n-gram lengths are the file's (the tables made again with them), checked like a corpus's
    other = Growth(nmin=2, nmax=5)
    for q in list(g.seqs):
        other.add(q)
    other.save(path)
    back = Growth.load(path, vocab_size=9)
    assert (back.nmin, back.nmax) == (2, 5) and back.table == other.table != g.table
    for bad in ('"nmin": 0', '"nmax": 65', '"nmin": 6', '"nmin": "3"'):
        meta = json.dumps({"format": 1, "kind": "specrt growth", "nmin": 3, "nmax": 5})
        meta = meta.replace('"nmin": 3', bad) if "nmin" in bad else meta.replace('"nmax": 5', bad)
        with open(tmp_path / "lengths.npz", "wb") as f:
            np.savez(f, tokens=np.arange(4, dtype=np.int32), lengths=np.array([4]),
                     meta=np.frombuffer(meta.encode(), np.uint8))
        with pytest.raises(UserError, match=r"lengths.npz: n-gram lengths nmin .* expected integers, 1 <= nmin"):
            Growth.load(tmp_path / "lengths.npz", vocab_size=9)
    empty = tmp_path / "empty.npz"
    Growth().save(empty)
    assert Growth.load(empty, vocab_size=9).table == {} and Growth.load(empty, vocab_size=9).rates == {}
    # the lookup policy's learnt rates of grown keys ride along, each position cut to RATE_TRIES tries
    g.save(path, rates={42: ([10.0, 5.0], [12.0, 10.0]), 54: ([600.0], [1024.0])})
    assert Growth.load(path, vocab_size=9).rates == {42: ([10.0, 5.0], [12.0, 10.0]), 54: ([150.0], [256.0])}
    for rates in ({3: ([1.0], [2.0])}, {42: ([3.0], [2.0])}, {42: ([], [])}):
        g.save(path, rates=rates)
        with pytest.raises(UserError, match="g.npz: learnt rates of key"):
            Growth.load(path, vocab_size=9)
    with open(tmp_path / "listed.npz", "wb") as f:
        np.savez(f, tokens=np.arange(4, dtype=np.int32), lengths=np.array([4]),
                 meta=np.frombuffer(b'{"format": 1, "kind": "specrt growth", "rates": [1, 2]}', np.uint8))
    with pytest.raises(UserError, match="listed.npz: learnt rates: expected an object"):
        Growth.load(tmp_path / "listed.npz", vocab_size=9)
    # a key of digits int() refuses ('²' is one to str.isdigit): refused by name, not a ValueError traceback
    meta = {"format": 1, "kind": "specrt growth", "rates": {"\u00b2": [[1.0], [2.0]]}}
    with open(tmp_path / "super.npz", "wb") as f:
        np.savez(f, tokens=np.arange(4, dtype=np.int32), lengths=np.array([4]),
                 meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    with pytest.raises(UserError, match="super.npz: learnt rates of key '²'"):
        Growth.load(tmp_path / "super.npz", vocab_size=9)


def _grown(seqs, nmin=2, nmax=3):
    g = Growth(nmin, nmax)
    for q in seqs:
        g.add(q)
    return g


def test_growth_forgets_the_oldest_sequences():
    g = Growth(nmin=2, nmax=3, max_tokens=8)
    g.add([1, 2, 3, 7])
    g.add([9, 2, 3, 5])
    assert g.next([1, 2, 3]) == (7, evidence(1, 1), 3) and g.next([8, 2, 3]) == (5, evidence(1, 2), 2)  # 5, 7 once
    g.add([4, 4, 4])  # 11 tokens > 8: [1, 2, 3, 7] goes
    assert g.next([1, 2, 3]) == (5, evidence(1, 1), 2) and g.table == _grown([[9, 2, 3, 5], [4, 4, 4]]).table
    g.add([4, 4, 5])
    g.add([6, 6, 6])  # [9, 2, 3, 5] and [4, 4, 4] gone: their keys and counts too
    assert g.table == _grown([[4, 4, 5], [6, 6, 6]]).table and g.next([8, 2, 3]) is None
    assert len(g.seqs) == 2 and g.tokens == 6
    g.add(list(range(10)))  # longer than the cap alone: the newest stays
    assert [len(q) for q in g.seqs] == [10] and g.table == _grown([list(range(10))]).table
    with pytest.raises(UserError, match="growth cap of 0 tokens"):
        Growth(max_tokens=0)


def test_propose_chains_and_bins():
    c = Corpus.build(SEQS, nmin=2, nmax=4, binning="share")
    assert c.propose([7, 2, 3], 3) == ([4, 5, 8], BINS["seen once"])  # "7 2 3" once, then "2 3 4 5" ...
    assert c.propose([2, 3], 1) == ([4], BINS["share>=0.95"])  # "2 3" -> 4 every time (3 of 3)
    assert c.propose([2, 3], 0) == ([], 0)
    assert c.propose([6, 6], 4) == ([], 0)
    assert bin_of(evidence(1, 1)) == BINS["seen once"] and bin_of(evidence(19, 20)) == BINS["share>=0.95"]
    assert bin_of(evidence(3, 5)) == BINS["share 0.5-0.95"] and bin_of(evidence(2, 5)) == BINS["share<0.5"]
    assert match_name(3) == "3-gram" and match_name(BINS["seen once"]) == "corpus seen once"
    # fine (the default): also by the match's length and, seen more than once, its count
    f = Corpus.build(SEQS, nmin=2, nmax=4)
    assert f.binning == "fine" and f.propose([2, 3], 1) == ([4], FINE_BINS["share>=0.95, n<6, seen<5"])
    assert bin_of(evidence(19, 20), 6, "fine") == FINE_BINS["share>=0.95, n>=6, seen>=5"]
    assert bin_of(evidence(3, 5), 3, "fine") == FINE_BINS["share 0.5-0.95, n<6, seen>=5"]
    assert bin_of(evidence(1, 1), 8, "fine") == FINE_BINS["seen once, n>=6"]
    assert len(set(FINE_BINS.values())) == len(FINE_BINS) == 14 and not set(FINE_BINS.values()) & set(BINS.values())
    assert match_name(FINE_BINS["seen once, n<6"]) == "corpus seen once, n<6"
    with pytest.raises(UserError, match="binning 'coarse'"):
        Corpus.build(SEQS, binning="coarse")


def test_chain_stops_where_the_corpus_does():
    c = Corpus.build([[1, 2, 3, 4]], nmin=2, nmax=3)
    assert c.propose([1, 2], 8) == ([3, 4], FINE_BINS["seen once, n<6"])


def test_short_sequences_and_large_vocabularies(tmp_path):
    """Sequences shorter than nmax (or than any n-gram) build a corpus, empty where nothing
    is followed; token ids past uint16 are kept as int32."""
    assert len(Corpus.build([])) == 0 and len(Corpus.build([[1, 2]])) == 0
    empty = Corpus.load(_saved(tmp_path, Corpus.build([[1, 2], [3]])), vocab_size=4)
    assert empty.propose([1, 2], 4) == ([], 0) and empty.next([1, 2, 3]) is None
    c = Corpus.build([[1, 2, 3, 4], [5]], nmin=2, nmax=8)
    assert c.propose([0, 1, 2], 8) == ([3, 4], FINE_BINS["seen once, n<6"])
    big = Corpus.build([[70000, 70001, 70002, 70003]], nmin=3, nmax=8)
    assert big.tokens.dtype == np.int32 and big.propose([70000, 70001, 70002], 2) == ([70003], FINE_BINS["seen once, n<6"])


def test_priors_are_measured_on_held_back_answers():
    # every PRIOR_HOLDOUT-th pair is held back: the corpus of the others proposes on it
    pairs = [([5, 6], [1, 2, 3, 4])] * (2 * PRIOR_HOLDOUT)
    c, tries = build_with_priors(pairs, nmin=2, nmax=3, binning="share")
    key = BINS["share>=0.95"]
    assert c.priors[key][:2] == [1.0, 1.0] and tries[key][0] == 2 * 4  # 2 held back x 4 positions (first: 1..4)
    stats = Corpus.measure(c, [([5, 6], [1, 2, 7, 4])])
    t, w = stats[key]
    assert (t[0], w[0], t[1], w[1], t[2], w[2]) == (3, 2, 2, 1, 1, 0)  # 7 is never proposed


def test_save_load_and_refusals(tmp_path):
    c = Corpus.build(SEQS, nmin=2, nmax=4, info={"export_digest": "ab" * 32}, binning="share")
    c.priors = {BINS["seen once"]: [0.5, 0.6]}
    c.save(tmp_path / FILE)
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # no temporary left
    d = Corpus.load(tmp_path / FILE, vocab_size=16, export_digest="ab" * 32)
    assert d.next([2, 3, 4]) == c.next([2, 3, 4]) and d.priors == c.priors and d.info["export_digest"] == "ab" * 32
    assert d.binning == "share" and Corpus.load(_saved(tmp_path, Corpus.build(SEQS))).binning == "fine"
    assert d.source_priors() == {**{b: list(DEFAULT_PRIOR) for b in BINS.values()}, BINS["seen once"]: [0.5, 0.6]}
    with pytest.raises(UserError, match="another export"):
        Corpus.load(tmp_path / FILE, export_digest="cd" * 32)
    with pytest.raises(UserError, match=r"outside the vocabulary \[0, 8\)"):
        Corpus.load(tmp_path / FILE, vocab_size=8)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="junk.npz: not a corpus file") as e:
        Corpus.load(tmp_path / "junk.npz")
    assert "allow_pickle" not in str(e.value)  # (numpy's message advised unpickling a text file)
    # an object array would need unpickling: refused, never loaded
    with open(tmp_path / "pickled.npz", "wb") as f:
        np.savez(f, keys=np.array([object()], dtype=object), tokens=c.tokens, ev=c.ev,
                 meta=np.frombuffer(b'{"format": 2}', np.uint8))
    with pytest.raises(UserError, match="pickled.npz: not a corpus file") as e:
        Corpus.load(tmp_path / "pickled.npz")
    assert "allow_pickle" not in str(e.value)
    # a format-1 file (counts, unpruned) is made again, not misread; bad arrays are named
    for name, meta, arrays in (("old.npz", b'{"format": 1}', {"top": c.ev, "total": c.ev}),
                               ("bad.npz", b'{"format": 2}', {"ev": c.ev + 7}),
                               ("list.npz", b'[2]', {"ev": c.ev})):
        with open(tmp_path / name, "wb") as f:
            np.savez(f, keys=c.keys, tokens=c.tokens, meta=np.frombuffer(meta, np.uint8), **arrays)
    with pytest.raises(UserError, match="old.npz: corpus format 1, expected 2; make it again"):
        Corpus.load(tmp_path / "old.npz")
    with pytest.raises(UserError, match="bad.npz: inconsistent corpus arrays"):
        Corpus.load(tmp_path / "bad.npz")
    with pytest.raises(UserError, match="list.npz: not a corpus file"):
        Corpus.load(tmp_path / "list.npz")


def _saved(folder, corpus):
    p = folder / "other" / FILE
    p.parent.mkdir(exist_ok=True)
    corpus.save(p)
    return p


def test_read_sequences(tmp_path):
    p = tmp_path / "a.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"prompt_ids": [1, 2], "answer_ids": [3]}) + "\n\n" + json.dumps({"text": "hi"}) + "\n")
    assert read_sequences([p], encode=lambda s: [len(s)]) == [([1, 2], [3]), ([], [2])]
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"answer_ids": [1]}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(UserError, match=r"b.jsonl:2: expected an object with answer_ids"):
        read_sequences([bad])
    bad.write_text("{oops\n")
    with pytest.raises(UserError, match=r"b.jsonl:1: not a JSON line"):
        read_sequences([bad])
    bad.write_text(json.dumps({"answer_ids": [1, "2"]}) + "\n")
    with pytest.raises(UserError, match="lists of token ids"):
        read_sequences([bad])


def test_spec_option_and_policy_sources():
    assert split_lookup("dspark:tree=3:corpus") == ("dspark:tree=3", True)
    assert split_lookup("fixed:2:ngram:corpus") == ("fixed:2", True)
    assert wants_corpus("dspark:tree=3:ngram:corpus") and not wants_corpus("dspark:ngram")
    with pytest.raises(UserError, match=":corpus"):
        split_lookup("fixed:2:corpus:corpus")
    g = from_spec("fixed:2:corpus", (1, 2, 4))
    assert g.lookup and g.corpus and not from_spec("fixed:2:ngram", (1, 2, 4)).corpus
    q = NgramPolicy((1, 2, 4), {0: 0.02, 1: 0.022, 2: 0.023, 4: 0.025}, 0.002)
    q.add_source({11: [0.9, 0.9], 14: [0.1]})
    assert q.rates(11) == pytest.approx([0.9, 0.9]) and q.tries[14] == [PRIOR_ROUNDS]
    d, rate = q.choose_rate(4, 11, 8)
    assert d == 4 and rate == pytest.approx((1 + 0.9 + 0.81 + 0.729 + 0.6561) / (0.025 + q.python))
    assert q.choose_rate(4, 14, 8)[0] == 0  # worse than the draft route's guess
    with pytest.raises(ValueError, match="prompt lookup's"):
        q.add_source({4: [0.5]})
    g = from_spec("off:grow", (1, 2, 4))
    assert g.lookup and g.grow and not g.corpus and wants_grow("dspark:ngram:corpus:grow")
    assert split_lookup("dspark:tree=3:ngram:corpus:grow") == ("dspark:tree=3", True)
    with pytest.raises(UserError, match=":grow"):
        split_lookup("fixed:2:grow:grow")
    # ':grow=N' caps the growth at N tokens (GROW_TOKENS without)
    assert from_spec("off:grow", (1, 2, 4)).grow_tokens == GROW_TOKENS
    g = from_spec("dspark:tree=3:ngram:grow=500", (1, 2, 4), t_draft=0.01, t_verify={1: 0.02, 2: 0.02, 4: 0.03})
    assert g.grow and g.grow_tokens == 500 and g.tree_width == 3 and g.lookup and wants_grow("off:grow=7")
    assert from_spec("fixed:2", (1, 2, 4)).grow_tokens is None
    for bad in ("off:grow=0", "off:grow=x", "off:grow="):
        with pytest.raises(UserError, match="':grow=N' takes a number of tokens"):
            from_spec(bad, (1, 2, 4))
    with pytest.raises(UserError, match="':grow' goes once"):
        split_lookup("off:grow=5:grow")
    from specrt.cli import run

    assert f"latest N tokens of them, {GROW_TOKENS} without" in " ".join(
        next(p.help for p in run.params if p.name == "governor").split())  # the help says the cap
    assert all(b - GROW_OFFSET in FINE_BINS.values() and 0 < len(r) <= 6 for b, r in GROW_PRIORS.items())


@pytest.fixture(scope="module")
def tiny_engines(tmp_path_factory):
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    root = tmp_path_factory.mktemp("corpus")
    t = write_tiny_target(root / "t", "llama", vocab_size=16)
    d = write_tiny_draft(root / "d", t, kind="peagle", num_layers=1, draft_vocab=12, mask_token_id=15)
    export(t, d, root / "exp")
    build_engines(root / "exp", "onnxruntime", (1, 2, 4), root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=128)
    return root / "eng"


def test_a_bad_path_is_refused_naming_the_argument(tiny_engines, tmp_path, monkeypatch):
    """Path('') is '.', the working folder: Session("") loaded it as the engines (a message
    naming its engines.json), load_growth("") read it as a growth file and save_growth("")
    wrote over it. Session(b"out/engines") was pathlib's TypeError, a traceback. Refused before
    any work, as `specrt run --grow-file ""` is."""
    from specrt.runtime.session import Session

    monkeypatch.chdir(tmp_path)
    for (bad, folder), (_, file) in zip(bad_paths("a folder"), bad_paths("a file")):
        with pytest.raises(UserError, match=f"^engines_dir: {folder}"):
            Session(bad)
        with Session(tiny_engines, governor="off:grow") as s:
            for method in (s.load_growth, s.save_growth):
                with pytest.raises(UserError, match=f"^path: {file}"):
                    method(bad)
    assert not any(tmp_path.iterdir())


def test_cli_makes_the_corpus_and_sessions_use_it(tiny_engines, tmp_path):
    """`specrt corpus ENGINES ANSWERS`: the file beside the engines, its priors printed;
    a session with ':corpus' (and 'auto:corpus') decodes exactly as target-only; bad
    answers exit 1 naming the line, writing nothing."""
    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.runtime.session import Session

    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8], [9, 9, 8]]
    with Session(tiny_engines, governor="off") as s:
        answers = [s.generator.generate(p, 30) for p in prompts]
    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps({"prompt_ids": p, "answer_ids": a}) + "\n" for p, a in zip(prompts, answers))
                   * 10)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [1], "answer_ids": [99]}) + "\n")
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(bad)])
    assert r.exit_code == 1 and "token id 99 is outside the vocabulary [0, 16)" in r.output, r.output
    assert "Traceback" not in r.output and not (tiny_engines / FILE).exists()
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src), "--nmin", "5", "--nmax", "4"])
    assert r.exit_code == 1 and "--nmin 5 > --nmax 4: expected --nmin <= --nmax" in r.output
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src), "--nmin", "9"])  # (the default named)
    assert r.exit_code == 1 and "--nmin 9 > --nmax 8 (its default): expected --nmin <= --nmax" in r.output, r.output
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src), "--nmax", "65"])  # Corpus.load's limit
    assert r.exit_code == 1 and "--nmax 65: at most 64" in r.output and not (tiny_engines / FILE).exists()
    empty = tmp_path / "empty.jsonl"  # (a user walk: a corpus of no n-gram was written without a word)
    empty.write_text(json.dumps({"prompt_ids": [1], "answer_ids": []}) + "\n")
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(empty)])
    assert r.exit_code == 1 and f"{empty}: no n-grams of 3..8 tokens in the answers" in r.output, r.output
    assert not (tiny_engines / FILE).exists()
    with pytest.raises(UserError, match="specrt corpus"):  # at the start, not at the first prompt
        Session(tiny_engines, governor="fixed:1:corpus")
    with Session(tiny_engines) as s:
        assert ":corpus" not in s.governor_spec  # auto without a corpus
    # a corpus file auto finds that cannot serve (empty, truncated, another export's): auto
    # goes on without it and says so; asked for by name, an error at the start
    for junk in (b"", b"PK\x03\x04 truncated"):
        (tiny_engines / FILE).write_bytes(junk)
        try:
            with Session(tiny_engines) as s:
                assert ":corpus" not in s.governor_spec and "corpus lookup left out" in s.calibration_note
                assert s.generator.generate(prompts[0], 30) == answers[0]
            with pytest.raises(UserError, match="not a corpus file"):
                Session(tiny_engines, governor="auto:corpus")
        finally:
            (tiny_engines / FILE).unlink()
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src)])
    assert r.exit_code == 0, r.output
    assert f"{tiny_engines / FILE}: " in r.output and "prior acceptance by position" in r.output
    assert "replaces" not in r.output
    try:
        again = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src)])  # replaced: said
        assert again.exit_code == 0 and "(it replaces the corpus that was there)" in again.output, again.output
        for spec in ("fixed:1:corpus", "auto:corpus", "auto"):  # auto takes the corpus where there is one
            with Session(tiny_engines, governor=spec) as s:
                assert ":corpus" in s.governor_spec
                assert [s.generator.generate(p, 30) for p in prompts] == answers, spec
                loaded = s.generator.governor.lookup_policy.corpus
                s.new_governor()  # governors of one generator (a bench worker's) share the file's tables
                assert s.generator.generate(prompts[0], 30) == answers[0]
                assert s.generator.governor.lookup_policy.corpus is loaded
    finally:
        (tiny_engines / FILE).unlink()


def test_grow_learns_from_the_session_and_keeps_greedy_identity(tiny_engines, monkeypatch):
    """':grow': each finished stream (prompt + output) joins the governor's Growth; a
    prompt seen before in the session is then proposed from its own earlier answer
    (grown keys, >= 40), the output staying target-only greedy's. Lookup takes every round
    it can (whether the policy takes a round depends on measured times, which a loaded
    machine changes: this test once failed beside the slow suite)."""
    from specrt.runtime.session import Session
    from tests.runtime.test_generate import _always_look_up

    _always_look_up(monkeypatch)

    prompts = [[3, 1, 4, 1, 5], [2, 7, 1, 8], [3, 1, 4, 1, 5]]
    with Session(tiny_engines, governor="off") as s:
        ref = [s.generator.generate(p, 30) for p in prompts]
    for spec in ("off:grow", "fixed:1:ngram:grow", "auto:grow"):
        with Session(tiny_engines, governor=spec) as s:
            assert s.governor_spec.endswith(":grow")
            got, keys = [], []
            for p in prompts:
                got.append(s.generator.generate(p, 30))
                keys.append({int(k) for k in s.generator.telemetry.to_json()["lookup"]["by_match"]})
            assert got == ref, spec
            growth = s.generator.governor.lookup_policy.growth
            assert [q[: len(p)] for q, p in zip(growth.seqs, prompts)] == prompts
            assert [len(q) for q in growth.seqs] == [len(p) + len(a) for p, a in zip(prompts, ref)]
            assert not any(k >= 40 for k in keys[0]), spec  # nothing grown yet
            assert any(k >= 40 for k in keys[2]), (spec, keys)
    # ':grow=N': the newest sequences within N tokens (the newest always), auto keeping the cap
    with pytest.raises(UserError, match="'auto:grow=x'"):  # named as written, not as auto resolves
        Session(tiny_engines, governor="auto:grow=x")
    for spec in ("off:grow=40", "auto:grow=40"):
        with Session(tiny_engines, governor=spec) as s:
            assert s.governor_spec.endswith(":grow=40")
            assert [s.generator.generate(p, 30) for p in prompts] == ref, spec
            growth = s.generator.governor.lookup_policy.growth
            assert growth.max_tokens == 40 and [q[: len(p)] for q, p in zip(growth.seqs, prompts[2:])] == prompts[2:]


@pytest.mark.parametrize("meta, keys, words", [
    ({"format": 2, "nmax": 8}, [1, 2], "corpus metadata malformed (KeyError"),  # no nmin
    ({"format": 2, "nmin": 3, "nmax": 8, "priors": {"x": [1]}}, [1, 2], "corpus metadata malformed (ValueError"),
    ({"format": 2, "nmin": 0, "nmax": 8}, [1, 2], "nmin 0 / nmax 8 or key order inconsistent"),
    ({"format": 2, "nmin": 3, "nmax": 8}, [5, 1], "nmin 3 / nmax 8 or key order inconsistent"),  # unsorted keys
    # a damaged nmax: each lookup step searched nmax - nmin + 1 keys (10**7: 7 s a proposal)
    ({"format": 2, "nmin": 3, "nmax": 10**7}, [1, 2], "nmin 3 / nmax 10000000 or key order inconsistent"),
    # a bin's priors empty (IndexError in the first lookup round), or not rates
    ({"format": 2, "nmin": 3, "nmax": 8, "priors": {"20": []}}, [1, 2], "corpus priors malformed"),
    ({"format": 2, "nmin": 3, "nmax": 8, "priors": {"20": [0.5, 7.0]}}, [1, 2], "corpus priors malformed"),
    ({"format": 2, "nmin": 3, "nmax": 8}, [[1], [2]], "inconsistent corpus arrays"),  # 2-D keys: ValueError at lookup
    # nmin > nmax: no n-gram length at all, every lookup silently found nothing (mutant C79 of session 68)
    ({"format": 2, "nmin": 5, "nmax": 4}, [1, 2], "nmin 5 / nmax 4 or key order inconsistent"),
])
def test_a_malformed_corpus_file_is_named(tmp_path, meta, keys, words):
    """Hand-made or damaged corpus files: a KeyError / ValueError traceback, or (unsorted keys:
    lookups binary-search them) silently finding nothing, before."""
    from specrt.runtime.corpus import Corpus

    p = tmp_path / "c.npz"
    np.savez(p, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), keys=np.array(keys, np.uint64),
             tokens=np.array([3, 4], np.uint16), ev=np.array([0, 1], np.uint8))
    with pytest.raises(UserError, match=words.replace("(", r"\(")):
        Corpus.load(p, 10)


def test_growth_skips_empty_sequences():
    """An empty sequence counted 0 tokens and was never evicted: a file of many grew memory
    without bound."""
    g = Growth(max_tokens=8)
    for _ in range(1000):
        g.add([])
    g.add([1, 2, 3, 4, 5])
    assert len(g.seqs) == 1 and g.tokens == 5


def test_the_corpus_command_reads_a_validated_manifest(tiny_engines, tmp_path):
    """`specrt corpus` read engines.json unchecked: a digest of 5 went into the corpus file."""
    import shutil

    from click.testing import CliRunner

    from specrt.cli import main

    eng = tmp_path / "eng"
    shutil.copytree(tiny_engines, eng)
    m = json.loads((eng / "engines.json").read_text())
    m["export"]["digest"] = 5
    (eng / "engines.json").write_text(json.dumps(m))
    src = tmp_path / "a.jsonl"
    src.write_text(json.dumps({"prompt_ids": [1, 2, 3], "answer_ids": [4, 5, 6, 7]}) + "\n")
    r = CliRunner().invoke(main, ["corpus", str(eng), str(src)])
    assert r.exit_code == 1 and "engines.json" in r.output and not (eng / FILE).exists(), r.output
    # a broken export.json was blamed on engines.json ("not an engines folder's manifest ('target')",
    # a user walk, session 54), and one edited (its digest another's) was read unchecked
    shutil.rmtree(eng)
    shutil.copytree(tiny_engines, eng, symlinks=False)
    exp = eng / json.loads((eng / "engines.json").read_text())["export"]["folder"] / "export.json"
    good = exp.read_text()
    for text, message in (('{"format": "x"}', "not an export manifest"),
                          (json.dumps({**json.loads(good), "dtype": "float16"}), "differs from the export these engines "
                                                                                 "were built from")):
        exp.write_text(text)
        r = CliRunner().invoke(main, ["corpus", str(eng), str(src)])
        assert r.exit_code == 1 and f"{exp}: {message}" in " ".join(r.output.split()), r.output
        assert not (eng / FILE).exists()


def test_priors_never_see_the_answers_they_are_measured_on():
    """The held-back pairs (every PRIOR_HOLDOUT-th: indices 19, 39, ..) are left out of the
    corpus that measures the priors: answers found nowhere else propose nothing there (a
    corpus holding them proposed each one to itself, accepted in full)."""
    held = {PRIOR_HOLDOUT - 1: ([8, 8], [11, 12, 13, 14]), 2 * PRIOR_HOLDOUT - 1: ([9, 9], [12, 13, 14, 15])}
    pairs = [held.get(i, ([5, 6], [1, 2, 3, 4])) for i in range(2 * PRIOR_HOLDOUT)]
    c, tries = build_with_priors(pairs, nmin=2, nmax=3, binning="share")
    assert c.priors == {} and tries == {}
    assert c.propose([8, 8], 4)[0] == [11, 12, 13, 14]  # the corpus itself holds every pair


def test_a_growth_measures_each_pair_against_the_ones_before_it():
    """Corpus.measure with a Growth proposes as ':grow' does: each pair joins it once
    measured, so the second of two equal pairs is proposed in full from the first."""
    g = Growth(nmin=2, nmax=3)
    stats = Corpus.measure(g, [([5, 6], [1, 2, 3, 4])] * 2)
    key = FINE_BINS["seen once, n<6"] + GROW_OFFSET
    assert stats == {key: ([4, 3, 2, 1, 0, 0, 0, 0], [4, 3, 2, 1, 0, 0, 0, 0])}
    assert list(g.seqs) == [[5, 6, 1, 2, 3, 4]] * 2


# mutant r11 (corpus.py Growth.load): a learnt rate with 0 tries accepted
def test_a_growth_file_rate_with_no_tries_is_refused(tmp_path):
    """Each learnt position needs tries > 0 (its rate is wins / tries): a file saying 0 is
    refused naming it, not loaded into a division by zero."""
    from specrt.errors import UserError
    from specrt.runtime.corpus import Growth

    g = Growth()
    g.add([1, 2, 3, 4, 5, 1, 2, 3, 4])
    path = tmp_path / "g.npz"
    g.save(path, rates={42: ([0.0, 0.0], [4.0, 0.0])})
    with pytest.raises(UserError, match="g.npz: learnt rates of key '42'"):
        Growth.load(path, vocab_size=9)


# mutant r13 (corpus.py build_with_priors): a rate kept from fewer than 8 tries
def test_a_bin_with_few_held_back_tries_keeps_the_default_prior():
    """A bin whose held-back answers gave it fewer than 8 first-step tries measures nothing:
    it keeps DEFAULT_PRIOR."""
    from specrt.runtime.corpus import BINS, DEFAULT_PRIOR, PRIOR_HOLDOUT, build_with_priors

    pairs = [([5, 6], [1, 2, 3, 4])] * PRIOR_HOLDOUT  # one held back: 4 first-step tries
    c, tries = build_with_priors(pairs, nmin=2, nmax=3, binning="share")
    assert c.priors == {} and tries == {}
    assert c.source_priors()[BINS["share>=0.95"]] == list(DEFAULT_PRIOR)


# mutant r19 (corpus.py Growth.source_priors): the grown keys' priors looked up under the fine bin's key
def test_grown_keys_start_from_their_measured_priors():
    """Each grown key with a measured prior (GROW_PRIORS) starts from it; the others from DEFAULT_PRIOR."""
    from specrt.runtime.corpus import DEFAULT_PRIOR, GROW_PRIORS, Growth

    priors = Growth.source_priors()
    for key, rates in priors.items():
        assert rates == list(GROW_PRIORS.get(key, DEFAULT_PRIOR)), key
    assert priors[42] == [0.961, 0.813, 0.818, 0.787, 0.758, 0.783]


def test_cli_corpus_bounds_are_inclusive(tiny_engines, tmp_path):
    """`specrt corpus`'s limits at their edges: --nmin equal to --nmax (one n-gram length) and
    --nmax at its limit (64) are taken; a token id equal to the vocabulary size is outside it."""
    from click.testing import CliRunner

    from specrt.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [1], "answer_ids": [16]}) + "\n")
    r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(bad)])
    assert r.exit_code == 1 and "token id 16 is outside the vocabulary [0, 16)" in r.output, r.output
    assert not (tiny_engines / FILE).exists()
    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps({"prompt_ids": [3, 1, 4], "answer_ids": [(7 * i + j) % 16 for j in range(40)]})
                           + "\n" for i in range(20)))
    try:
        for nmin, nmax in (("3", "3"), ("3", "64")):
            r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src), "--nmin", nmin, "--nmax", nmax])
            assert r.exit_code == 0 and f"(n = {nmin}..{nmax})" in r.output, r.output
    finally:
        (tiny_engines / FILE).unlink(missing_ok=True)


def test_a_token_id_outside_the_vocabulary_is_named_by_its_file_and_line(tiny_engines, tmp_path):
    """`specrt corpus A B` named an id outside the vocabulary as "answer 61 of A, B" (a user
    walk, session 72): neither the file nor its line (blank lines apart); now FILE:LINE as
    every other error of the answers, and a --stats file's prompts[i]."""
    from click.testing import CliRunner

    from specrt.cli import main

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt_ids": [1, 2], "answer_ids": [3, 4, 5, 6]}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n" + json.dumps({"prompt_ids": [1], "answer_ids": [2]}) + "\n"
                   + json.dumps({"prompt_ids": [1], "answer_ids": [2, 16]}) + "\n")
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"prompts": [{"prompt_ids": [1, 2], "output_token_ids": [3]},
                                             {"prompt_ids": [-1, 2], "output_token_ids": [3]}]}))
    for files, where, bad_id in (([good, bad], f"{bad}:3", 16), ([stats, good], f"{stats}: prompts[1]", -1)):
        r = CliRunner().invoke(main, ["corpus", str(tiny_engines), *map(str, files)])
        assert r.exit_code == 1 and f"error: {where}: token id {bad_id} is outside the vocabulary [0, 16)" \
            in r.output, r.output
        assert "Traceback" not in r.output and not (tiny_engines / FILE).exists()


def test_an_answers_file_given_twice_is_refused(tiny_engines, tmp_path):
    """`specrt corpus ENGINES A A` (a user walk, session 72: a file "appended twice") counted
    every answer twice, and each held-back answer's copy stayed in the corpus its priors were
    measured on: on SmolLM2's chat-rest answers "seen once, n>=6" went from 0.72 to 1.00 at
    position 1. Refused, through another spelling or a symlink too, writing nothing."""
    from click.testing import CliRunner

    from specrt.cli import main

    src = tmp_path / "answers.jsonl"
    src.write_text("".join(json.dumps({"prompt_ids": [3, 1, 4], "answer_ids": [(7 * i + j) % 16 for j in range(40)]})
                           + "\n" for i in range(20)))
    (tmp_path / "link.jsonl").symlink_to(src)
    for again in (src, tmp_path / "." / "answers.jsonl", tmp_path / "link.jsonl"):
        r = CliRunner().invoke(main, ["corpus", str(tiny_engines), str(src), str(again)])
        assert r.exit_code == 1 and f"given twice ({src} and {again})" in r.output, r.output
        assert "Traceback" not in r.output and not (tiny_engines / FILE).exists()


# ---- mutation round on runtime/corpus.py (mutants g01-g74; each test names those it kills) ----


# mutant g07 (_aggregate: a share of exactly 0.95 put in the lower class, unlike evidence())
def test_a_share_of_exactly_095_is_the_top_class_built_or_grown():
    """19 continuations of 20 the same token: share 0.95, SHARES' ">= 0.95" class, in the
    built table as in Growth and evidence() (the two tables' codes are made apart)."""
    seqs = [[1, 2, 3, 4]] * 19 + [[1, 2, 3, 5]]
    assert evidence(19, 20) == 1  # 2 * class 0 + seen >= 5 times
    assert Corpus.build(seqs, nmin=3, nmax=3).next([1, 2, 3]) == (4, 1, 3) == _grown(seqs, 3, 3).next([1, 2, 3])


# mutants g15 (n-grams across a sequence's separator kept), g16 (n-grams starting at a separator kept)
def test_the_table_holds_only_n_grams_inside_one_sequence():
    """Two sequences joined by a separator: only the 4 n-grams of 2..3 tokens followed
    inside one sequence are keys. One that spans or starts at the separator can never match
    a context (its hash holds the separator) but would cost memory in every corpus file."""
    c = Corpus.build([[1, 2, 3, 4], [5, 6, 7]], nmin=2, nmax=3, prune=False)
    assert len(c) == 4  # "1 2" -> 3, "2 3" -> 4, "1 2 3" -> 4, "5 6" -> 7
    assert c.next([1, 2, 3]) == (4, evidence(1, 1), 3) and c.next([5, 6]) == (7, evidence(1, 1), 2)


# mutant g22 (token 65536 stored as uint16: proposed as 0)
def test_the_first_token_id_past_uint16_is_kept_as_int32():
    """The next tokens are uint16 while the largest is 65535: 65536 needs int32 (as uint16, 0)."""
    c = Corpus.build([[65533, 65534, 65535, 65536]], nmin=2, nmax=3)
    assert c.tokens.dtype == np.int32 and c.propose([65533, 65534], 3)[0] == [65535, 65536]
    assert Corpus.build([[65533, 65534, 65535]], nmin=2, nmax=3).tokens.dtype == np.uint16  # 65535 fits


# mutant g29 (_chain's first step looks at nmax - 1 tokens: the longest match never found)
def test_a_proposal_starts_from_the_longest_match():
    """A context of nmax tokens matches the nmax-gram: the first step's bin is the long
    one (n >= LONG), as Corpus.next says, not a shorter match's."""
    c = Corpus.build([[1, 2, 3, 4, 5, 6, 7, 8]], nmin=3, nmax=6)
    assert c.next([1, 2, 3, 4, 5, 6]) == (7, evidence(1, 1), 6)
    assert c.propose([1, 2, 3, 4, 5, 6], 2) == ([7, 8], FINE_BINS["seen once, n>=6"])
    assert _grown([[1, 2, 3, 4, 5, 6, 7, 8]], 3, 6).propose([1, 2, 3, 4, 5, 6], 2) == \
        ([7, 8], FINE_BINS["seen once, n>=6"] + GROW_OFFSET)


def _growth_file(path, tokens, lengths, meta):
    with open(path, "wb") as f:
        np.savez(f, tokens=np.array(tokens, np.int32), lengths=np.array(lengths, np.int64),
                 meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
    return path


# mutants g47 (the format not checked), g48 (negative lengths accepted), g74 (the kind not checked)
def test_a_growth_file_of_another_format_kind_or_negative_lengths_is_refused(tmp_path):
    """Growth.load reads only what Growth.save writes: format 1, kind 'specrt growth', and
    lengths that split the tokens (lengths 5 and -1 add up to 4 tokens, yet split them into
    a sequence of 4 and an empty one)."""
    grown = {"format": 1, "kind": "specrt growth"}
    with pytest.raises(UserError, match="f2.npz: growth file format 2, expected 1"):
        Growth.load(_growth_file(tmp_path / "f2.npz", [1, 2, 3, 4], [4], {**grown, "format": 2}), vocab_size=9)
    with pytest.raises(UserError, match="neg.npz: inconsistent growth arrays"):
        Growth.load(_growth_file(tmp_path / "neg.npz", [1, 2, 3, 4], [5, -1], grown), vocab_size=9)
    with pytest.raises(UserError, match="kindless.npz: not a growth file"):
        Growth.load(_growth_file(tmp_path / "kindless.npz", [1, 2, 3, 4], [4], {"format": 1}), vocab_size=9)
    assert list(Growth.load(_growth_file(tmp_path / "ok.npz", [1, 2, 3, 4], [4], grown), vocab_size=9).seqs) == \
        [[1, 2, 3, 4]]


# mutant g49 (a learnt rate's negative wins accepted)
def test_a_growth_file_rate_with_negative_wins_is_refused(tmp_path):
    g = _grown([[1, 2, 3, 4, 5]], 3, 8)
    g.save(tmp_path / "g.npz", rates={42: ([-1.0], [2.0])})
    with pytest.raises(UserError, match="g.npz: learnt rates of key '42'"):
        Growth.load(tmp_path / "g.npz", vocab_size=9)


# mutants g50 (a negative token id accepted), g51 (an id equal to the vocabulary size accepted)
def test_token_ids_must_lie_in_zero_to_the_vocabulary_size(tmp_path):
    """A corpus or growth file's ids index the target's vocabulary: [0, vocab_size), its last
    id (vocab_size - 1) taken, vocab_size and -1 refused naming the file."""
    path = _saved(tmp_path, Corpus.build(SEQS, nmin=2, nmax=4))  # ids up to 9
    assert len(Corpus.load(path, vocab_size=10)) == len(Corpus.build(SEQS, nmin=2, nmax=4))
    with pytest.raises(UserError, match=r"outside the vocabulary \[0, 9\)"):
        Corpus.load(path, vocab_size=9)
    grown = {"format": 1, "kind": "specrt growth"}
    Growth.load(_growth_file(tmp_path / "top.npz", [1, 2, 8], [3], grown), vocab_size=9)
    with pytest.raises(UserError, match=r"minus.npz: token ids outside the vocabulary \[0, 9\)"):
        Growth.load(_growth_file(tmp_path / "minus.npz", [1, -1, 2], [3], grown), vocab_size=9)
    with open(tmp_path / "minus_c.npz", "wb") as f:
        np.savez(f, keys=np.array([1, 2], np.uint64), tokens=np.array([-1, 3], np.int32), ev=np.zeros(2, np.uint8),
                 meta=np.frombuffer(b'{"format": 2, "nmin": 3, "nmax": 8}', np.uint8))
    with pytest.raises(UserError, match=r"minus_c.npz: token ids outside the vocabulary \[0, 9\)"):
        Corpus.load(tmp_path / "minus_c.npz", vocab_size=9)


# mutants g52 (a file naming no export refused), g53 (the message's two digests swapped)
def test_another_exports_file_names_both_digests_and_a_file_naming_none_is_taken(tmp_path):
    """The refusal says the file's digest, then these engines'; a file that names no export
    (a growth file saved without one, a corpus built without info) is taken by any engines."""
    g = _grown([[1, 2, 3, 4, 5]], 3, 8)
    g.save(tmp_path / "g.npz", export_digest="ab" * 32)
    with pytest.raises(UserError, match=r"g.npz: written for another export \(digest abababababab, these engines' "
                                        r"cdcdcdcdcdcd\)"):
        Growth.load(tmp_path / "g.npz", vocab_size=9, export_digest="cd" * 32)
    g.save(tmp_path / "g.npz")
    assert Growth.load(tmp_path / "g.npz", vocab_size=9, export_digest="cd" * 32).table == g.table
    c = Corpus.load(_saved(tmp_path, Corpus.build(SEQS, nmin=2, nmax=4)), export_digest="cd" * 32)
    assert c.next([2, 3, 4]) == Corpus.build(SEQS, nmin=2, nmax=4).next([2, 3, 4])


# mutants g54 (evidence code 7 accepted: keys 33, 35, no bin), g55 (array lengths not compared)
@pytest.mark.parametrize("tokens, ev", [([3, 4], [0, 7]), ([3], [0, 1])])
def test_corpus_arrays_out_of_step_are_refused(tmp_path, tokens, ev):
    """An evidence code is 0..6 (2 * share class + many, 'seen once' never many): 7 would
    bin a first step under a key no policy has. And a token and a code per key."""
    p = tmp_path / "c.npz"
    np.savez(p, meta=np.frombuffer(b'{"format": 2, "nmin": 3, "nmax": 8}', np.uint8), keys=np.array([1, 2], np.uint64),
             tokens=np.array(tokens, np.uint16), ev=np.array(ev, np.uint8))
    with pytest.raises(UserError, match="c.npz: inconsistent corpus arrays"):
        Corpus.load(p, 10)


# mutant g56 (a negative prior rate accepted)
def test_a_negative_prior_rate_is_refused(tmp_path):
    p = tmp_path / "c.npz"
    meta = {"format": 2, "nmin": 3, "nmax": 8, "priors": {"20": [0.5, -0.1]}}
    np.savez(p, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), keys=np.array([1, 2], np.uint64),
             tokens=np.array([3, 4], np.uint16), ev=np.array([0, 1], np.uint8))
    with pytest.raises(UserError, match="c.npz: corpus priors malformed"):
        Corpus.load(p, 10)


# mutant g60 (a file that names no binning read as "fine")
def test_a_corpus_file_naming_no_binning_is_the_share_binning(tmp_path):
    """Files written before the "fine" binning hold no "binning": their priors are keyed by
    the share bins (11-14), so they load as "share", and source_priors gives those keys."""
    p = tmp_path / "c.npz"
    meta = {"format": 2, "nmin": 3, "nmax": 8, "priors": {str(BINS["seen once"]): [0.4]}}
    np.savez(p, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8), keys=np.array([1, 2], np.uint64),
             tokens=np.array([3, 4], np.uint16), ev=np.array([0, 1], np.uint8))
    c = Corpus.load(p, 10)
    assert c.binning == "share" and c.source_priors()[BINS["seen once"]] == [0.4]


# mutant g65 (measure's max_new ignored: every position of a long answer measured)
def test_measure_takes_the_first_max_new_tokens_of_each_answer():
    c = Corpus.build([[5, 6, 1, 2, 3, 4]], nmin=2, nmax=3, binning="share")
    stats = Corpus.measure(c, [([5, 6], [1, 2, 3, 4])], positions=4, max_new=2)
    t, w = stats[BINS["seen once"]]  # answer positions 1 and 2 only: chains of 2, then 1
    assert (t, w) == ([2, 1, 0, 0], [2, 1, 0, 0])


# mutant g72 (a stats prompt's output_token_ids not checked)
def test_run_stats_with_bad_output_ids_are_refused_naming_the_prompt(tmp_path):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"prompts": [{"prompt_ids": [1, 2], "output_token_ids": [3, 4]},
                                             {"prompt_ids": [1, 2], "output_token_ids": [3, "4"]}]}))
    with pytest.raises(UserError, match=r"stats.json: prompts\[1\]: expected prompt_ids and output_token_ids"):
        read_sequences([stats])


# mutant g58 (Corpus.load refused nmax == NMAX_LIMIT, which `specrt corpus --nmax 64` writes)
def test_a_corpus_of_the_longest_n_grams_allowed_loads(tmp_path):
    """`specrt corpus --nmax 64` is taken (test_cli_corpus_bounds_are_inclusive), so a file of
    nmax 64 must load: the limit is inclusive in both places."""
    c = Corpus.build([list(range(70))], nmin=3, nmax=64)
    d = Corpus.load(_saved(tmp_path, c), vocab_size=70)
    assert d.nmax == 64 and d.next(list(range(64))) == c.next(list(range(64))) == (64, evidence(1, 1), 6)  # pruned


def test_an_answers_file_that_cannot_be_read_is_named_as_the_answers(tmp_path):
    # kills P07 (session 67: json_lines saying "the prompts" of every file it reads)
    bad = tmp_path / "a.jsonl"
    bad.write_bytes(json.dumps({"text": "caf\u00e9"}, ensure_ascii=False).encode("latin-1") + b"\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(bad))}:1: cannot read the answers \("):
        read_sequences([bad], encode=lambda s: [len(s)])


def test_answers_whose_prompt_ids_are_no_list_are_refused(tmp_path):
    # kills P14 (session 67: is_token_ids taking anything iterable: "" and {} as no ids)
    bad = tmp_path / "a.jsonl"
    for ids in ("", {}):
        bad.write_text(json.dumps({"prompt_ids": ids, "answer_ids": [1]}) + "\n")
        with pytest.raises(UserError, match=r"a.jsonl:1: prompt_ids / answer_ids must be lists of token ids"):
            read_sequences([bad])


# ---- mutation round of session 68 on runtime/corpus.py (mutants C01-C140; each test names those it kills) ----


# mutant C55 (a growth file's tokens saved as int16: ids past 32,767 wrapped negative, the file then refused)
def test_a_growth_file_keeps_the_token_ids_of_a_large_vocabulary(tmp_path):
    """SmolLM2's vocabulary has 49,152 ids: a growth file holds its largest ones as they were."""
    g = _grown([[40000, 49151, 3, 40000, 49151, 3, 40000]], 3, 8)
    g.save(tmp_path / "g.npz")
    back = Growth.load(tmp_path / "g.npz", vocab_size=49152)
    assert list(back.seqs) == list(g.seqs) and back.table == g.table and back.next([40000, 49151, 3])[0] == 40000


# mutants C58 (a growth file's float tokens taken: 1.5 read as 1), C76 (a corpus file's int64 keys taken:
# searched against uint64 hashes as float64), C77 (a corpus file's float tokens taken: 3.5 proposed as 3)
def test_files_whose_arrays_have_other_types_are_refused(tmp_path):
    """What save writes: a growth file's tokens are integers, a corpus file's keys uint64 and
    its tokens uint16 or int32; other types are refused naming the file, not read loosely."""
    with open(tmp_path / "float.npz", "wb") as f:
        np.savez(f, tokens=np.array([1.5, 2, 3, 4], np.float32), lengths=np.array([4]),
                 meta=np.frombuffer(b'{"format": 1, "kind": "specrt growth"}', np.uint8))
    with pytest.raises(UserError, match="float.npz: inconsistent growth arrays"):
        Growth.load(tmp_path / "float.npz", vocab_size=9)
    meta = np.frombuffer(b'{"format": 2, "nmin": 3, "nmax": 8}', np.uint8)
    for name, keys, tokens in (("int_keys.npz", np.array([1, 2], np.int64), np.array([3, 4], np.uint16)),
                               ("float_tokens.npz", np.array([1, 2], np.uint64), np.array([3.5, 4], np.float32))):
        np.savez(tmp_path / name, meta=meta, keys=keys, tokens=tokens, ev=np.array([0, 1], np.uint8))
        with pytest.raises(UserError, match=f"{name}: inconsistent corpus arrays"):
            Corpus.load(tmp_path / name, 10)


# mutants C59 (a growth file naming no n-gram lengths read with another nmin), C60 (a growth file of nmax 64,
# the limit `specrt corpus --nmax` and Corpus.load take, refused)
def test_a_growth_files_n_gram_lengths_default_to_nmin_nmax_and_reach_the_limit(tmp_path):
    from specrt.runtime.corpus import NMAX, NMAX_LIMIT, NMIN

    grown = {"format": 1, "kind": "specrt growth"}
    g = Growth.load(_growth_file(tmp_path / "plain.npz", [1, 2, 3, 4, 5], [5], grown), vocab_size=9)
    assert (g.nmin, g.nmax) == (NMIN, NMAX) and g.table == _grown([[1, 2, 3, 4, 5]], NMIN, NMAX).table
    meta = {**grown, "nmin": 3, "nmax": NMAX_LIMIT}
    g = Growth.load(_growth_file(tmp_path / "long.npz", list(range(70)), [70], meta), vocab_size=70)
    assert g.nmax == 64 and g.next(list(range(64))) == (64, evidence(1, 1), 64)


# mutants C62 (a learnt rate's parts not lists: len() of a number), C63 (its values not numbers: 0 <= "a")
@pytest.mark.parametrize("wt", [[1, 2], [["a"], [2.0]], [[1.0], [None]]])
def test_a_growth_file_rate_of_other_types_is_refused(tmp_path, wt):
    """A TypeError traceback before: each learnt rate is [wins, tries], two lists of numbers."""
    meta = {"format": 1, "kind": "specrt growth", "rates": {"42": wt}}
    with pytest.raises(UserError, match="r.npz: learnt rates of key '42': expected"):
        Growth.load(_growth_file(tmp_path / "r.npz", [1, 2, 3, 4], [4], meta), vocab_size=9)


# mutant C81 (a JSON file without a 'prompts' list: a KeyError traceback, or a dict's keys read as prompts)
@pytest.mark.parametrize("text", ['{"answers": []}', '{"prompts": {"a": 1}}', "[1]"])
def test_a_json_file_that_is_no_run_stats_is_refused_naming_it(tmp_path, text):
    p = tmp_path / "s.json"
    p.write_text(text)
    with pytest.raises(UserError, match=r"s.json: expected `specrt run --stats` JSON \(an object with a 'prompts' "):
        read_sequences([p])


def test_a_stats_file_json_cannot_read_is_refused_naming_it(tmp_path):
    """A number past Python's digit limit for int, or arrays nested past its recursion limit:
    json's ValueError / RecursionError were tracebacks."""
    p = tmp_path / "s.json"
    for text in ('{"prompts": [' + "9" * 5000 + "]}", "[" * 100000 + "]" * 100000):
        p.write_text(text)
        with pytest.raises(UserError, match=r"s.json: cannot read `specrt run --stats` JSON \("):
            read_sequences([p])


# mutant C121 (a growth file's learnt rates taken only for the grown keys with a measured prior, GROW_PRIORS)
def test_a_growth_file_keeps_the_rates_of_every_grown_key(tmp_path):
    """Every grown key (a fine bin + GROW_OFFSET) is learnt, measured prior or not: key 41
    (share>=0.95, n<6, seen>=5, grown) has none in GROW_PRIORS, yet its rates come back."""
    key = FINE_BINS["share>=0.95, n<6, seen>=5"] + GROW_OFFSET
    assert key not in GROW_PRIORS
    g = _grown([[1, 2, 3, 4, 5]], 3, 8)
    g.save(tmp_path / "g.npz", rates={key: ([3.0, 1.0], [4.0, 3.0])})
    assert Growth.load(tmp_path / "g.npz", vocab_size=9).rates == {key: ([3.0, 1.0], [4.0, 3.0])}


# mutant C83 (a stats prompt's ids and output swapped: the output read as the context, the priors measured
# on the prompts)
def test_run_stats_give_each_prompts_ids_then_its_output(tmp_path):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"export_digest": "ab" * 32,
                                 "prompts": [{"prompt_ids": [1, 2], "output_token_ids": [3, 4, 5]}]}))
    assert read_sequences([stats], export_digest="ab" * 32) == [([1, 2], [3, 4, 5])]


# mutant C86 (a text line read without a tokenizer: None called, a TypeError)
def test_text_answers_without_a_tokenizer_are_refused_naming_the_line(tmp_path):
    """read_sequences tokenizes text only with an ``encode`` (`specrt corpus` passes the
    export's tokenizer); without one a text line is no answer it can read."""
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"answer_ids": [1, 2]}) + "\n" + json.dumps({"text": "hi"}) + "\n")
    with pytest.raises(UserError, match=r"t.jsonl:2: expected an object with answer_ids \(and prompt_ids\) or text"):
        read_sequences([p])


# mutants C90 (the tries returned were the wins), C91 (a bin's tries and wins swapped: rates above 1)
def test_priors_are_wins_over_tries_and_the_tries_are_returned():
    """Held-back answers that leave the corpus at their third token: per answer the chains
    from its first three positions try 3, 2, 1 tokens at positions 1-3 and win 2, 1, 0. Four
    held back: tries 12, 8, 4; the rates 8/12 and 4/8, later positions (< 8 tries) the last."""
    pairs = [([5, 6], [1, 2, 7, 4]) if i % PRIOR_HOLDOUT == PRIOR_HOLDOUT - 1 else ([5, 6], [1, 2, 3, 4])
             for i in range(4 * PRIOR_HOLDOUT)]
    c, tries = build_with_priors(pairs, nmin=2, nmax=3, binning="share")
    key = BINS["share>=0.95"]
    assert tries == {key: [12, 8, 4, 0, 0, 0, 0, 0]}
    assert c.priors == {key: [0.6667] + [0.5] * 7}


# a bug found in this round (mutants C118, C140 of its fix): a .npy file given as a corpus or growth file
def test_a_npy_array_in_place_of_the_archive_is_refused_naming_the_file(tmp_path):
    """np.load gives a .npy file's array, not an archive (no context manager: a TypeError
    traceback before the fix): a corpus or growth path holding one is not ours, named."""
    p = tmp_path / "a.npz"
    with open(p, "wb") as f:
        np.save(f, np.arange(4))
    with pytest.raises(UserError, match=r"a.npz: not a corpus file \(a .npy array, not an .npz archive\)"):
        Corpus.load(p)
    with pytest.raises(UserError, match=r"a.npz: not a growth file \(a .npy array, not an .npz archive\)"):
        Growth.load(p, vocab_size=9)


def test_a_stream_finishing_while_the_growth_is_merged_keeps_its_answer(tiny_engines, tmp_path, monkeypatch):
    """save_growth merges a growth file another run wrote meanwhile, then puts the merged Growth in
    the policy's place: a stream of another thread (Streams may be driven from several threads)
    finishing in between added its answer to the Growth being replaced, lost from the file and
    from the session. The merge takes the streams' lock, as close() does."""
    import threading

    from specrt.runtime import corpus, session as session_mod

    grow = tmp_path / "grow.npz"
    with session_mod.Session(tiny_engines, governor="off:grow") as s:
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)
        Growth(max_tokens=10**6).save(grow, s.engines.manifest["export"]["digest"])  # another run's, meanwhile
        other = threading.Thread(target=s.generator.generate, args=([2, 7, 1, 8], 6))
        mine, add = s.generator.governor.lookup_policy.growth, corpus.Growth.add

        def add_while_a_stream_ends(self, seq):  # (the merge's adds: the other thread's stream ends now)
            if self is not mine and not other.is_alive() and other.ident is None:
                other.start()
                other.join(2)  # (with the lock held by the merge: it waits for it)
            return add(self, seq)

        monkeypatch.setattr(corpus.Growth, "add", add_while_a_stream_ends)
        s.save_growth(grow)
        other.join()
        assert [q[:4] for q in s.generator.governor.lookup_policy.growth.seqs] == [[3, 1, 4, 1], [2, 7, 1, 8]]


def test_a_growth_file_named_through_a_symlink_is_locked_in_its_own_folder(tiny_engines, tmp_path):
    """Two runs sharing a grow file, one naming it through a symlink in another folder: each locked
    the folder of the name it was given, so both could merge and write at once, the last writer
    losing the other's answers. The lock is on the folder the file is in."""
    import fcntl
    import threading

    from specrt.runtime.session import Session

    (tmp_path / "real").mkdir(), (tmp_path / "links").mkdir()
    grow = tmp_path / "links" / "grow.npz"
    grow.symlink_to(tmp_path / "real" / "grow.npz")
    with Session(tiny_engines, governor="off:grow") as s:
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)
        fd = os.open(tmp_path / "real", os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)  # (another run's save, under way in the file's own folder)
        t = threading.Thread(target=s.save_growth, args=(grow,), daemon=True)
        t.start()
        try:
            t.join(1.0)
            assert t.is_alive() and not (tmp_path / "real" / "grow.npz").exists()
        finally:
            os.close(fd)  # (released)
        t.join(60)
    assert grow.is_symlink()
    with np.load(tmp_path / "real" / "grow.npz") as z:
        assert len(z["lengths"]) == 1


@contextlib.contextmanager
def _a_failed_growth_save(engines, grow, monkeypatch, fail, error):
    """A session of ``engines`` growing ``grow``, one answer given, whose save_growth(grow)
    raised ``error``: Growth.save was ``fail(save, self, ...)`` once (``save`` the real one,
    put back before ``fail`` is called)."""
    from specrt.runtime import corpus
    from specrt.runtime.session import Session

    save = corpus.Growth.save

    def once(*a, **k):
        monkeypatch.setattr(corpus.Growth, "save", save)
        fail(save, *a, **k)

    with Session(engines, governor="off:grow") as s:
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)
        monkeypatch.setattr(corpus.Growth, "save", once)
        with pytest.raises(error):
            s.save_growth(grow)
        yield s


def test_a_growth_save_interrupted_after_its_write_is_not_merged_into_itself(tiny_engines, tmp_path, monkeypatch):
    """A Ctrl-C landing in save_growth just after the file was replaced (`specrt run` then writes
    it again, once: cli._write_run_files): the file, changed since it was loaded, was taken for
    another run's, and this session's sequences were merged into their own copy, each twice."""
    grow = tmp_path / "grow.npz"

    def save_then_interrupted(save, *a, **k):
        save(*a, **k)
        raise KeyboardInterrupt

    with _a_failed_growth_save(tiny_engines, grow, monkeypatch, save_then_interrupted, KeyboardInterrupt) as s:
        s.save_growth(grow)  # (written again, as run does)
        assert len(s.generator.governor.lookup_policy.growth.seqs) == 1
    with np.load(grow) as z:
        assert len(z["lengths"]) == 1


# mutation round m70a: Growth.own and save_growth's merge of a file another run wrote since it was loaded
def test_own_is_what_was_added_since_made_or_loaded_that_it_still_holds(tmp_path):
    """own() is the newest ``added`` sequences still held (mutant m70a-62: past an eviction
    `len(seqs) - added` went negative, and only the newest came back; m70a-63: the oldest). A
    loaded Growth owns none of the file's (m70a-64), and the file's evicted ones leave ``added``
    as it was (m70a-70)."""
    g = Growth(max_tokens=10)
    for q in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]):
        g.add(q)
    assert list(g.seqs) == [[5, 6, 7, 8], [9, 10, 11, 12]] and g.added == 3
    assert g.own() == [[5, 6, 7, 8], [9, 10, 11, 12]]
    g.save(tmp_path / "g.npz")
    h = Growth.load(tmp_path / "g.npz", vocab_size=16, max_tokens=10)
    assert h.own() == [] and h.added == 0
    h.add([1, 2])
    assert h.own() == [[1, 2]]
    h.add([3, 4, 5])  # (13 tokens: the file's older one goes)
    assert list(h.seqs) == [[9, 10, 11, 12], [1, 2], [3, 4, 5]] and h.own() == [[1, 2], [3, 4, 5]]


def _other_run_writes(grow, digest, *seqs, vocab=16):
    """Another run's save of ``grow``: what the file holds, then ``seqs``."""
    g = Growth.load(grow, vocab, digest) if grow.exists() else Growth()
    for q in seqs:
        g.add(q)
    g.save(grow, digest)


def _file_seqs(grow) -> list[list[int]]:
    with np.load(grow) as z:
        return [q.tolist() for q in np.split(z["tokens"], np.cumsum(z["lengths"])[:-1])]


def test_a_merge_adds_this_sessions_own_sequences_once_after_the_other_runs(tiny_engines, tmp_path, monkeypatch):
    """A growth file with a sequence when loaded, given as a relative path; another run adds one
    to it meanwhile: the save keeps the file's, then the other run's, then this session's two
    answers, each once (m70a-11: every sequence held merged, the loaded one twice; m70a-26: an
    answer left out; m70a-06: the relative path taken for another file, the other run's lost)."""
    from specrt.runtime.session import Session

    monkeypatch.chdir(tmp_path)
    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow") as s:
        digest = s.engines.manifest["export"]["digest"]
        _other_run_writes(grow, digest, [9, 9, 9, 9])
        assert s.load_growth("grow.npz") == 1
        s.generator.generate([3, 1, 4, 1, 5], 6)
        s.generator.generate([2, 7, 1, 8], 6)
        _other_run_writes(grow, digest, [6, 6, 6])
        s.save_growth("grow.npz")
        held = [q[:4] for q in s.generator.governor.lookup_policy.growth.seqs]
    want = [[9, 9, 9, 9], [6, 6, 6], [3, 1, 4, 1], [2, 7, 1, 8]]
    assert held == want and [q[:4] for q in _file_seqs(grow)] == want


def test_a_merge_keeps_the_sessions_growth_cap(tiny_engines, tmp_path):
    """The merged Growth is read with the governor's own cap (``:grow=N``), and keeps it for the
    rest of the session (m70a-13: read with the default cap, the other run's older sequence kept
    past N tokens, and the session's later answers held past it too)."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow=12") as s:
        digest = s.engines.manifest["export"]["digest"]
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)  # (11 tokens)
        _other_run_writes(grow, digest, [6, 6, 6, 6])
        s.save_growth(grow)
        growth = s.generator.governor.lookup_policy.growth
        assert growth.max_tokens == 12 and [q[:5] for q in growth.seqs] == [[3, 1, 4, 1, 5]]
    assert [q[:5] for q in _file_seqs(grow)] == [[3, 1, 4, 1, 5]]



def test_a_loaded_growth_file_keeps_the_sessions_growth_cap(tiny_engines, tmp_path):
    """load_growth keeps the newest of the file's sequences within the governor's ``:grow=N``,
    and the cap for the session (mutant m70a-71: the file read with the default cap, every
    sequence held, and the session's cap lost)."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow=12") as s:
        _other_run_writes(grow, s.engines.manifest["export"]["digest"], [9, 9, 9, 9], [6, 6, 6, 6], [5, 5, 5, 5, 5])
        assert s.load_growth(grow) == 2
        growth = s.generator.governor.lookup_policy.growth
        assert growth.max_tokens == 12 and list(growth.seqs) == [[6, 6, 6, 6], [5, 5, 5, 5, 5]]

def test_a_growth_file_removed_since_it_was_loaded_is_written_with_the_sessions_growth(tiny_engines, tmp_path):
    """The file removed between load and save (a cleanup) is no other run's to merge: written
    again with what the session holds (m70a-04 / m70a-08: a missing file taken for a changed
    one, its read an error naming it, the session's growth unsaved)."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow") as s:
        _other_run_writes(grow, s.engines.manifest["export"]["digest"], [9, 9, 9, 9])
        assert s.load_growth(grow) == 1
        s.generator.generate([3, 1, 4, 1, 5], 6)
        grow.unlink()
        s.save_growth(grow)
    assert [q[:4] for q in _file_seqs(grow)] == [[9, 9, 9, 9], [3, 1, 4, 1]]


@pytest.mark.parametrize("how", ["cp", "rsync -t", "cp -p"])
def test_a_growth_file_rewritten_by_a_copy_is_merged(tiny_engines, tmp_path, how):
    """Another run's file copied over the one loaded, of the same size: `cp` rewrites it in place
    (the same inode; m70a-02, the time stamp dropped from the stamp: taken for unchanged, the
    other run's sequence lost), `rsync -t` renames a copy with the loaded file's time stamp into
    place (m70a-01: the inode dropped), `cp -p` rewrites it in place with that time stamp
    (m70a-03: the size dropped; here the copy is a sequence longer)."""
    import shutil

    from specrt.runtime.session import Session

    grow, theirs = tmp_path / "grow.npz", tmp_path / "theirs.npz"
    with Session(tiny_engines, governor="off:grow") as s:
        digest = s.engines.manifest["export"]["digest"]
        _other_run_writes(grow, digest, [9, 9, 9, 9])
        _other_run_writes(theirs, digest, *([[6, 6, 6, 6], [5, 5, 5, 5]] if how == "cp -p" else [[6, 6, 6, 6]]))
        assert s.load_growth(grow) == 1
        s.generator.generate([3, 1, 4, 1, 5], 6)
        loaded = os.stat(grow)
        if how == "cp":
            assert theirs.stat().st_size == loaded.st_size
            shutil.copyfile(theirs, grow)
            assert os.stat(grow).st_ino == loaded.st_ino
        else:
            os.utime(theirs, ns=(loaded.st_atime_ns, loaded.st_mtime_ns))
            if how == "rsync -t":
                os.replace(theirs, grow)
            else:
                shutil.copyfile(theirs, grow)
                os.utime(grow, ns=(loaded.st_atime_ns, loaded.st_mtime_ns))
        s.save_growth(grow)
    theirs_seqs = [[6, 6, 6, 6], [5, 5, 5, 5]] if how == "cp -p" else [[6, 6, 6, 6]]
    assert [q[:4] for q in _file_seqs(grow)] == [*theirs_seqs, [3, 1, 4, 1]]


@pytest.mark.parametrize("theirs, why", [({"digest": "0" * 64}, "written for another export"),
                                         ({"seq": [3, 99]}, r"token ids outside the vocabulary \[0, 16\)")])
def test_a_growth_file_another_run_made_unreadable_meanwhile_is_refused_at_the_save(tiny_engines, tmp_path, theirs,
                                                                                     why):
    """What another run wrote meanwhile is checked as a loaded file is: one of other engines
    (another export digest: m70a-21, merged unchecked) or with ids past this vocabulary (m70a-22)
    is refused naming the file, and kept as it is."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow") as s:
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)
        g = Growth()
        g.add(theirs.get("seq", [6, 6, 6]))
        g.save(grow, theirs.get("digest", s.engines.manifest["export"]["digest"]))
        before = grow.read_bytes()
        with pytest.raises(UserError, match=f"^{re.escape(str(grow))}: {why}"):
            s.save_growth(grow)
    assert grow.read_bytes() == before


def test_a_growth_file_whose_load_was_refused_is_not_written_over_at_the_save(tiny_engines, tmp_path):
    """A Python caller that goes on after load_growth refused a file (another export's) and then
    saves to it: the save wrote over that file without a word, its sequences lost (the read
    stamp was set before the refused read; session 70's note on m70a, NOTES s70's growth API
    notes; h78k). Refused at the save as at the load, the file kept."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    g = Growth()
    g.add([6, 6, 6])
    g.save(grow, "0" * 64)
    before = grow.read_bytes()
    with Session(tiny_engines, governor="off:grow") as s:
        with pytest.raises(UserError, match="written for another export"):
            s.load_growth(grow)
        s.generator.generate([3, 1, 4, 1, 5], 6)
        with pytest.raises(UserError, match=f"^{re.escape(str(grow))}: written for another export"):
            s.save_growth(grow)
    assert grow.read_bytes() == before


def test_a_growth_save_that_failed_keeps_the_sessions_sequences_its_own(tiny_engines, tmp_path, monkeypatch):
    """A save that fails (a full disk) wrote nothing: the session's answers are still its own to
    add to what another run writes before the save is tried again (m70a-14: taken for saved,
    the next merge left them out of the file)."""
    import errno

    grow = tmp_path / "grow.npz"

    def full_disk(save, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with _a_failed_growth_save(tiny_engines, grow, monkeypatch, full_disk, OSError) as s:
        assert not grow.exists()
        _other_run_writes(grow, s.engines.manifest["export"]["digest"], [6, 6, 6])
        s.save_growth(grow)
    assert [q[:4] for q in _file_seqs(grow)] == [[6, 6, 6], [3, 1, 4, 1]]



def test_a_session_saving_again_after_another_runs_save_adds_only_what_is_new(tiny_engines, tmp_path):
    """Saved, then another run adds to the file, then saved again (an API caller saving after
    each batch): the second save adds to the other run's file only the answers since the first
    (mutant m70a-16: what the first save wrote still counted as this session's own, merged in
    again after the other run's)."""
    from specrt.runtime.session import Session

    grow = tmp_path / "grow.npz"
    with Session(tiny_engines, governor="off:grow") as s:
        assert s.load_growth(grow) == 0
        s.generator.generate([3, 1, 4, 1, 5], 6)
        s.save_growth(grow)
        _other_run_writes(grow, s.engines.manifest["export"]["digest"], [6, 6, 6])
        s.generator.generate([2, 7, 1, 8], 6)
        s.save_growth(grow)
    assert [q[:4] for q in _file_seqs(grow)] == [[3, 1, 4, 1], [6, 6, 6], [2, 7, 1, 8]]


def test_token_ids_zero_and_the_last_of_the_vocabulary_are_read(tmp_path):
    """read_sequences refuses ids outside [0, vocab_size): 0 and vocab_size - 1 lie inside it,
    in answers and --stats files alike (mutant m73y-31 refused id 0)."""
    answers = tmp_path / "a.jsonl"
    answers.write_text(json.dumps({"prompt_ids": [0, 15], "answer_ids": [15, 0]}) + "\n")
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"prompts": [{"prompt_ids": [0], "output_token_ids": [0, 15]}]}))
    assert read_sequences([answers, stats], vocab_size=16) == [([0, 15], [15, 0]), ([0], [0, 15])]
    with pytest.raises(UserError, match=re.escape(f"{answers}:1: token id 15 is outside the vocabulary [0, 15)")):
        read_sequences([answers], vocab_size=15)
