"""``specrt calibrate`` and the DSpark governor end to end on tiny engines: the stored
calibration, its refusal for other engines, ECE report fields, and lossless greedy output
whatever the governor."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specrt.errors import UserError
from specrt.paths import write_atomic
from specrt.runtime.calibrate import (calibrate, conditional_samples, evaluate, format_report, split_prompts,
                                      worse_fit_note)
from specrt.runtime.governor import Calibration, DSparkGovernor
from specrt.runtime.sampling import SamplingParams
from specrt.runtime.session import CALIBRATION_FILE, PRIOR_ROUNDS, Session, load_calibration

from tests.bad_paths import bad_paths
from tests.engines.conftest import REFERENCE, quiet


@pytest.mark.parametrize("bad, why", bad_paths("a folder"))
def test_a_bad_engines_path_is_refused_naming_the_argument(tmp_path, monkeypatch, bad, why):
    """Path('') is '.': the working folder was read as the engines (a message naming its
    engines.json); bytes were pathlib's TypeError, a traceback. Refused before any work, as the
    CLI refuses it."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=f"^engines_dir: {why}"):
        calibrate(bad, [[1, 2, 3]])
    assert not any(tmp_path.iterdir())

DEPTHS = (1, 2, 4)
GOVERNORS = ("off", "fixed:1", "fixed:4", "adaptive", "dspark")


def _build(export_dir: Path, out: Path) -> Path:
    from specrt.engines import build_engines

    build_engines(export_dir, "onnxruntime", DEPTHS, out, log=quiet, profile_repeats=2)
    return out


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> Path:
    """The tiny reference pair (vocab 1000, random draft: acceptance ~ 0), depths 1,2,4."""
    from specrt.export.export import export

    root = tmp_path_factory.mktemp("cal-tiny")
    export(REFERENCE / "verifier", REFERENCE / "draft", root / "export")
    return _build(root / "export", root / "engines")


@pytest.fixture(scope="module")
def small_vocab_engines(tmp_path_factory) -> Path:
    """A 16-token target and a P-EAGLE draft over the same 16 tokens: drafts get accepted
    (these seeds: ~5-20% at position 1 on random prompts; most seed pairs accept less)."""
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    root = tmp_path_factory.mktemp("cal-v16")
    write_tiny_target(root / "target", vocab_size=16, eos_token_id=None, bos_token_id=None, pad_token_id=None,
                      seed=1)
    write_tiny_draft(root / "draft", root / "target", kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15,
                     seed=4)
    export(root / "target", root / "draft", root / "export")
    return _build(root / "export", root / "engines")


def prompts(vocab: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab - 1, int(rng.integers(3, 9))).tolist() for _ in range(n)]


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- pure helpers -----------------------------------------------------------------------


def test_samples_and_evaluation_on_known_rounds():
    rounds = [(np.array([0.9, 0.8, 0.7, 0.6]), 4, 2),  # reached 1..3, accepted 1..2
              (np.array([0.5, 0.4, 0.3, 0.2]), 2, 2)]  # verified 2 (capped), all accepted
    conf, pos, acc = conditional_samples(rounds)
    np.testing.assert_allclose(conf, [0.9, 0.8, 0.7, 0.5, 0.4])
    assert pos.tolist() == [0, 1, 2, 0, 1] and acc.tolist() == [1, 1, 0, 1, 1]
    ev = evaluate(rounds, lambda c: c, 4)
    assert ev["conditional"]["n"] == [2, 2, 1, 0] and ev["conditional"]["ece"][3] is None
    assert ev["survival"]["n"] == [2, 2, 1, 1]
    assert ev["survival"]["observed"] == [1.0, 1.0, 0.0, 0.0]
    assert ev["survival"]["predicted"][1] == pytest.approx((0.9 * 0.8 + 0.5 * 0.4) / 2)
    assert ev["survival"]["ece"][2] == pytest.approx(0.9 * 0.8 * 0.7)  # one sample, observed 0
    # pooled over the positions' samples (0.1 + 0.2 + 0.7 + 0.5 + 0.6) / 5, not their ECEs' mean
    assert ev["conditional"]["ece_all"] == pytest.approx(0.42)
    from specrt.runtime.governor import ece

    assert ece([1.0, 0.95], [0.0, 1.0]) == pytest.approx(0.475)  # a confidence of 1 falls in the top bin
    perfect = evaluate([(np.ones(2), 2, 2)], lambda c: c, 2)
    assert perfect["conditional"]["ece_all"] == 0.0 and perfect["survival"]["ece_all"] == 0.0
    # the AUC of the map's values ranking the outcomes, and values past 1 clipped (mutants M67 c17, c18)
    three = [(np.array([0.9]), 1, 1), (np.array([0.6]), 1, 0), (np.array([0.8]), 1, 1)]
    assert evaluate(three, lambda c: c, 1)["conditional"]["auc"] == [1.0]
    assert evaluate(three, lambda c: 1 - c, 1)["conditional"]["auc"] == [0.0]
    assert evaluate(three, lambda c: 2 * c, 1)["survival"]["predicted"] == [1.0]


def test_chain_acceptance_counts_only_the_verified_positions_as_reached():
    """A round that accepted all d of its drafts reached positions 1..d: position d + 1 was
    never verified, so it is neither offered nor reached there (rounds of depths 2 and 4)."""
    from specrt.runtime.calibrate import chain_acceptance

    c = np.full(4, 0.5)
    r = chain_acceptance([(c, 2, 2), (c, 4, 1), (c, 4, 4)])
    assert r["tau"] == pytest.approx(1 + 7 / 3)
    # over all rounds (§6, as --stats): tau - 1 is their sum
    assert r["acceptance_by_position"] == pytest.approx([1.0, 2 / 3, 1 / 3, 1 / 3])
    assert sum(r["acceptance_by_position"]) == pytest.approx(r["tau"] - 1)
    assert r["acceptance_conditional"] == pytest.approx([1.0, 2 / 3, 1.0, 1.0])


def test_split_prompts():
    tr, ho = split_prompts(8, 0.25)
    assert len(ho) == 2 and sorted(tr + ho) == list(range(8)) and (tr, ho) == split_prompts(8, 0.25)
    assert split_prompts(3, 0.0) == ([0, 1, 2], [])
    assert len(split_prompts(2, 0.9)[0]) == 1  # at least one training prompt
    assert len(split_prompts(7, 0.25)[1]) == 2  # the nearest count to the fraction (1.75)
    assert len(split_prompts(4, 0.1)[1]) == 1  # a fraction > 0 holds out one at least (mutant M67 c36)
    with pytest.raises(UserError, match=r"--holdout 1.0: expected a fraction in \[0, 1\)"):
        split_prompts(4, 1.0)
    with pytest.raises(UserError, match="at least 2 prompts"):
        split_prompts(1, 0.5)


def test_write_atomic_keeps_old_file_on_failure(tmp_path):
    p = tmp_path / "calibration.json"
    write_atomic(p, {"a": 1})
    with pytest.raises(TypeError):
        write_atomic(p, {"a": object()})  # not JSON-serialisable half way through
    assert p.read_text() == '{\n "a": 1\n}'  # (indented a line a key, for a reader: mutation round, P39)
    assert [q.name for q in tmp_path.iterdir()] == ["calibration.json"]  # no temp file left


def test_write_atomic_removes_the_temporaries_of_writes_killed_outright(tmp_path, capfd):
    """A write killed with SIGKILL inside its block left its ``.NAME.<hex>.tmp`` (as big as the
    file) for good: the next write to that file removes those no live write holds (their flock)
    once older than a minute (a temporary made a moment ago may not be locked yet), saying so;
    a live write's, and another file's, are left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    p = tmp_path / "calibration.json"
    code = ("import sys, time; from pathlib import Path; from specrt.paths import atomic_file\n"
            "with atomic_file(Path(sys.argv[1])) as f:\n    f.write(b'x' * 1000); f.flush(); print('in', flush=True)"
            "; time.sleep(60)\n")

    def writer(target: Path) -> subprocess.Popen:
        w = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline() == "in\n"
        return w

    def temps(name: str = "calibration.json") -> list[Path]:
        return sorted(tmp_path.glob(f".{name}.*.tmp"))

    dead, other = writer(p), writer(tmp_path / "other.json")
    for w in (dead, other):
        w.send_signal(signal.SIGKILL)
        w.wait()
    [t_dead] = temps()
    live = writer(p)
    try:
        [t_live] = set(temps()) - {t_dead}
        write_atomic(p, {"a": 1})  # both a moment old: left
        assert temps() == sorted([t_dead, t_live]) and "note: removed" not in capfd.readouterr().err
        old = time.time() - 120
        for t in (*temps(), *temps("other.json")):
            os.utime(t, (old, old))
        write_atomic(p, {"a": 2})
        assert temps() == [t_live] and len(temps("other.json")) == 1, temps()
        assert capfd.readouterr().err == f"note: removed {t_dead}, the temporary file of an interrupted write\n"
        assert json.loads(p.read_text()) == {"a": 2}
    finally:
        live.kill()
        live.wait()


def test_the_sweep_of_dead_temporaries_takes_only_this_files_plain_unheld_ones(tmp_path, capfd):
    """Mutation round (session 69, specrt/paths.py; P-ids in its report): the sweep of a file's
    dead temporaries (``.NAME.<12 hex>.tmp``, a minute old, no flock held) takes no other
    file's whose name the name's "." read as a pattern matches (P54), none whose name only
    begins so (P55), no FIFO (whose open waits for a writer; P56), goes on past those a live
    write holds (P59), and closes the descriptor of each it removed (P60)."""
    import fcntl
    import os
    import time

    p = tmp_path / "a.json"
    old = time.time() - 120

    def made(name: str, fifo: bool = False) -> Path:
        t = tmp_path / name
        os.mkfifo(t) if fifo else t.write_text("x")
        os.utime(t, (old, old))
        return t

    dead = made(".a.json.0123456789ab.tmp")
    others = [made(".aXjson.0123456789ab.tmp"), made(".a.json.0123456789ab.tmp.keep")]
    fifo = made(".a.json.00000000ffff.tmp", fifo=True)
    held = [made(f".a.json.{i:012x}.tmp") for i in range(1, 21)]
    fds = [os.open(fifo, os.O_RDWR)]  # (a writer: the FIFO's open would not wait, so a mutant took it, not hung)
    for t in held:
        fds.append(os.open(t, os.O_RDONLY))
        fcntl.flock(fds[-1], fcntl.LOCK_EX)  # (as a live write holds its temporary)
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
        write_atomic(p, {"a": 1})
        assert len(os.listdir("/proc/self/fd")) == open_fds
    finally:
        for fd in fds:
            os.close(fd)
    assert not dead.exists() and all(t.exists() for t in (*others, fifo, *held))
    assert capfd.readouterr().err == f"note: removed {dead}, the temporary file of an interrupted write\n"


# ---- calibrate on engines ---------------------------------------------------------------


def test_calibrate_writes_a_calibration_load_calibration_accepts(engines, tmp_path):
    eng = copy(engines, tmp_path / "engines")
    with Session(eng, governor="dspark") as s:
        assert s.calibration is None and "no calibration stored" in s.calibration_note
        assert isinstance(s.generator.governor, DSparkGovernor)
    logs = []
    rep = calibrate(eng, prompts(1000, 6), max_new_tokens=16, holdout=0.34, log=logs.append)
    assert rep["file"] == str(eng / CALIBRATION_FILE) and any("wrote" in m for m in logs)
    assert rep["prompts"] == {"train": 4, "holdout": 2, "holdout_source": "0.34 of the prompts"}
    assert rep["evaluated_on"] == "holdout"
    assert rep["rounds"]["train"] > 0 and rep["rounds"]["holdout"] > 0 and rep["depth"] == 4
    data = json.loads((eng / CALIBRATION_FILE).read_text())
    assert data["export_digest"] == json.loads((eng / "engines.json").read_text())["export"]["digest"]
    assert data["format"] == "specrt.calibration-file/2" and list(data["modes"]) == ["greedy"]
    assert data["modes"]["greedy"]["rounds"] == rep["rounds"]["train"] and rep["mode"] == "greedy"
    assert sorted(p.name for p in eng.iterdir() if p.name.startswith(".")) == []  # no temp file left

    with Session(eng, governor="dspark") as s:
        cal = s.calibration
        assert isinstance(cal, Calibration) and cal.positions == 4
        assert s.calibration_note == f"calibration from {CALIBRATION_FILE} ({rep['rounds']['train']} rounds, greedy)"
        gc = s.generator.governor.calibration  # its own copy of the stored map (it learns online)
        assert gc is not cal and gc.to_dict() == cal.to_dict()
        assert cal.n.sum() == rep["samples"]["train"] and cal.a.sum() <= cal.n.sum()
    assert "ECE" in format_report(rep)


def test_calibration_for_other_engines_is_refused_with_a_note(engines, small_vocab_engines, tmp_path):
    a = copy(engines, tmp_path / "a")
    calibrate(a, prompts(1000, 2), max_new_tokens=8, holdout=0.0)
    b = copy(small_vocab_engines, tmp_path / "b")
    shutil.copy(a / CALIBRATION_FILE, b / CALIBRATION_FILE)  # fitted for a, not b
    with Session(b, governor="dspark") as s:
        assert s.calibration is None
        assert s.calibration_note == f"{b / CALIBRATION_FILE} was fitted for other engines (export digest differs): using the identity map"
        ident = s.generator.governor.calibration  # the identity map
        x = np.array([0.0, 0.3, 0.77, 1.0])
        np.testing.assert_allclose(ident.predict(x, np.zeros(4, int)), x, atol=1e-12)
    # `specrt run` under dspark says it on the console, naming the governor, before the answer
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt_ids": [1, 2, 3]}\n')
    r = CliRunner().invoke(cli(), ["run", str(b), "--prompts", str(pf), "--max-new-tokens", "4", "--governor",
                                   "dspark", "--quiet"])
    assert r.exit_code == 0, r.output
    assert (f"dspark: {b / CALIBRATION_FILE} was fitted for other engines (export digest differs): using the "
            "identity map") in r.output, r.output
    r = CliRunner().invoke(cli(), ["run", str(b), "--prompts", str(pf), "--max-new-tokens", "4", "--governor",
                                   "fixed:1", "--quiet"])
    assert r.exit_code == 0 and "fitted for other" not in r.output, r.output  # (a governor that reads none)
    # a file for other engines in a format this version does not read is stale all the same
    (b / CALIBRATION_FILE).write_text(json.dumps({"format": "specrt.calibration-file/3", "export_digest": "0" * 64,
                                                  "modes": {"greedy": {"new": "fields"}}}))
    with Session(b, governor="dspark") as s:
        assert s.calibration is None and "fitted for other engines" in s.calibration_note
    (b / CALIBRATION_FILE).unlink()
    from specrt.engines import load_engines

    cal, note = load_calibration(load_engines(b, verify=False))
    assert cal is None and note.startswith("no calibration stored")


def test_one_calibration_per_decoding_mode(small_vocab_engines, tmp_path):
    """Sampled decoding accepts drafts at other rates than greedy: calibrate keeps one map per
    mode (temperature / top-k / top-p, not the seed), a run loads its own mode's, and a run
    in a mode with none takes the nearest temperature's as a weak prior, saying so."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    hot = SamplingParams(temperature=1.3, top_p=0.95, seed=3)
    g = calibrate(eng, prompts(16, 6, seed=2), max_new_tokens=40, holdout=0.0)
    h = calibrate(eng, prompts(16, 6, seed=2), max_new_tokens=40, holdout=0.0, sampling=hot)
    assert h["mode"] == "temperature=1.3,top_k=0,top_p=0.95" and h["sampling"]["temperature"] == 1.3
    # the report prices the calibration the sampled mode would otherwise start from
    assert g["other_mode"] is None and h["other_mode"]["mode"] == "greedy"
    # no held-out prompts: the table names the rounds the ECE was measured on (it said "0 rounds"), and says
    # they are the fit's own (it said "evaluated on train": a walk, h73a)
    assert f"evaluated on the training prompts, in-sample ({g['prompts']['train']} prompts, {g['rounds']['train']} " \
        "rounds)" in format_report(g)
    # the summary's tau is the chains', over every prompt (a user walk: beside the per-prompt
    # lines' telemetry tau, which counts a tree's runner-up wins, it read as a second tau)
    assert f"chain tau {g['tau']:.2f} over all {g['prompts']['train'] + g['prompts']['holdout']} prompts (a token " \
        "tree's runner-up wins not counted)" in format_report(g)
    said: list[str] = []
    few = calibrate(copy(small_vocab_engines, tmp_path / "few"), prompts(16, 3, seed=5), max_new_tokens=12,
                    holdout=0.34, log=said.append)
    sv = few["ece"]["survival"]  # the run says the note where its numbers call for it
    assert (worse_fit_note(sv, "holdout", few["rounds"]["train"]) in said) == \
        (round(sv["after_all"], 3) > round(sv["before_all"], 3))
    assert worse_fit_note({"before_all": 0.172, "after_all": 0.204}, "holdout", 9) == (
        "note: fitted on 9 rounds, the calibration's survival ECE on the holdout rounds (0.204) is worse than the "
        "draft's own confidences' (0.172): calibrate on more prompts or longer answers")
    assert worse_fit_note({"before_all": 0.2, "after_all": 0.1}, "holdout", 9) is None
    assert worse_fit_note({"before_all": None, "after_all": 0.1}, "train", 9) is None
    # (worse past the third place only: it said "(0.000) is worse than the draft's own confidences' (0.000)")
    assert worse_fit_note({"before_all": 1e-6, "after_all": 3e-4}, "train", 9) is None
    assert 0.0 <= h["other_mode"]["conditional"]["ece_all"] <= 1.0
    assert len(h["other_mode"]["survival"]["ece"]) == h["depth"]
    assert "starts from the greedy calibration (as a prior)" in format_report(h)
    data = json.loads((eng / CALIBRATION_FILE).read_text())
    assert sorted(data["modes"]) == ["greedy", h["mode"]]  # the sampled fit kept the greedy one
    assert data["modes"][h["mode"]]["rounds"] == h["rounds"]["train"]
    assert data["modes"]["greedy"]["rounds"] == g["rounds"]["train"]
    greedy_cal = Calibration.from_dict(data["modes"]["greedy"]["calibration"])
    hot_cal = Calibration.from_dict(data["modes"][h["mode"]]["calibration"])
    assert not np.array_equal(greedy_cal.n, hot_cal.n)  # two different sets of rounds

    with Session(eng, governor="dspark", sampling=SamplingParams(1.3, 0, 0.95, seed=9)) as s:  # another seed: same mode
        assert s.calibration_note.endswith(f"rounds, {h['mode']})")
        np.testing.assert_array_equal(s.calibration.n, hot_cal.n)
    # a mode with no calibration: the nearest temperature's map, its counts cut to a prior
    for params, near in [(SamplingParams(temperature=0.9, top_p=0.95), h["mode"]),
                         (SamplingParams(temperature=0.2), "greedy")]:
        with Session(eng, governor="dspark", sampling=params) as s:
            assert f"no calibration for {params.mode}: the {near} one serves as a prior of at most {PRIOR_ROUNDS}" \
                in s.calibration_note
            src = hot_cal if near != "greedy" else greedy_cal
            big = src.n.sum(1) > PRIOR_ROUNDS  # positions with more rounds than a prior holds
            assert big.any()
            np.testing.assert_allclose(s.calibration.n.sum(1)[big], PRIOR_ROUNDS)
            np.testing.assert_array_equal(s.calibration.n[~big], src.n[~big])
            seen = src.n > 0
            np.testing.assert_allclose(s.calibration.a[seen] / s.calibration.n[seen], src.a[seen] / src.n[seen])
    # greedy again: the greedy fit replaced, saying so (a fit of 8 rounds replaced one of 51 without a
    # word), the sampled one kept
    said: list[str] = []
    again = calibrate(eng, prompts(16, 3, seed=4), max_new_tokens=12, holdout=0.0, log=said.append)
    assert sorted(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]) == ["greedy", h["mode"]]
    wrote = [x for x in said if x.startswith("wrote")]
    assert len(wrote) == 1 and f"{again['rounds']['train']} rounds; kept {h['mode']}; it replaces the greedy " \
        f"calibration of {g['rounds']['train']} rounds made {data['modes']['greedy']['created']})" in wrote[0], wrote
    # (the kind in words: "(greedy: temperature, ...)" read as a sampling temperature; a walk, h73a)
    words = {"histogram": "histogram binning", "isotonic": "isotonic regression", "temperature": "temperature scaling"}
    assert f"(greedy: {words[again['kind']]}, {again['rounds']['train']} rounds;" in wrote[0], wrote


def test_held_out_prompts_without_rounds_are_an_error(small_vocab_engines, tmp_path):
    """Held-out prompts that leave room for one new token run no draft round: the error
    says so (the training rounds' in-sample error was stored as the held-out one)."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    C = json.loads((eng / "engines.json").read_text())["max_context"]
    with pytest.raises(UserError, match="no draft rounds in the held-out prompts") as e:
        calibrate(eng, prompts(16, 3, seed=2), max_new_tokens=16, holdout_prompts=[[1, 2] * ((C - 1) // 2) + [3]])
    assert not (eng / CALIBRATION_FILE).exists()
    # why, and advice that fits: it said "use a smaller --holdout or longer generations", --holdout
    # being ignored beside held-out prompts and the answer ending at the context (a walk, session 71)
    assert "(its answer ended before a round could run, 1 at the engines' context): give prompts whose " \
           "answers go on (more --max-new-tokens does not change where these end)" in str(e.value)
    assert "--holdout " not in str(e.value)


def test_held_out_prompts_repeating_training_ones_and_answers_cut_at_the_context_are_said(small_vocab_engines,
                                                                                          tmp_path):
    """Two things a user walk (session 71) found unsaid: held-out prompts identical to training
    ones (greedy decoding repeats their rounds: a "held-out" ECE measured on training rounds),
    and an answer that stopped at the engines' context rather than at --max-new-tokens."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    C = json.loads((eng / "engines.json").read_text())["max_context"]
    train = prompts(16, 3, seed=2)
    said: list[str] = []
    calibrate(eng, train, max_new_tokens=16, holdout_prompts=[train[1], [1, 2, 3], train[0]], log=said.append,
              labels=["a:1", "a:2", "a:3", "b:1", "b:2", "b:3"], write=False)
    assert ("note: 2 of the 3 held-out prompts repeat a training prompt (b:1, b:3): greedy decoding repeats its "
            "rounds, so the held-out ECE is measured in part on the training rounds") in said, said
    # every held-out prompt a training one: not "in part" (a walk, h73a: "2 of the 2 ... in part")
    for held, who in (([train[0]], "the held-out prompt repeats"),
                      ([train[2], train[0]], "all 2 held-out prompts repeat")):
        said.clear()
        calibrate(eng, train, max_new_tokens=16, holdout_prompts=held, log=said.append, write=False)
        notes = [x for x in said if x.startswith("note: ")]
        assert len(notes) == 1 and notes[0].startswith(f"note: {who} a training prompt (held-out prompt 1") \
            and notes[0].endswith("so the held-out ECE is measured on the training rounds"), said
    said.clear()
    calibrate(eng, train, max_new_tokens=16, holdout_prompts=[[1, 2] * ((C - 8) // 2)], log=said.append, write=False)
    assert not any(x.startswith("note:") for x in said), said
    lines = [x for x in said if x.startswith("prompt ")]
    assert lines[-1].startswith("prompt 4/4 (held out): ") and lines[-1].endswith("; the answer reached the engines' "
                                                                               "context")
    assert not any("context" in x for x in lines[:-1]), lines


def test_answers_ending_at_eos_at_once_are_said_to(tmp_path):
    """Every answer ending at its first token (EOS): the error said "each ended before a round
    could run: give longer generations (--max-new-tokens)", which changes nothing (a user
    walk, session 71). Here every token is an EOS."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16, eos_token_id=list(range(16)))
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15)
    export(t, d, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng", log=quiet, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    said: list[str] = []
    with pytest.raises(UserError, match=re.escape(
            "no draft rounds in the training prompts (each of 3 answers ended before a round could run, 3 at the "
            "end-of-sequence token): give prompts whose answers go on (more --max-new-tokens does not change")):
        calibrate(tmp_path / "eng", prompts(16, 3), max_new_tokens=64, holdout=0.0, log=said.append)
    assert not (tmp_path / "eng" / CALIBRATION_FILE).exists()
    # each prompt's line says it ran no round ("1 tokens, 0 rounds, tau 1.00" read as a draft accepting nothing)
    assert [x for x in said if x.startswith("prompt ")] == [f"prompt {i}/3: 1 token, no draft rounds"
                                                            for i in (1, 2, 3)], said


def test_the_no_rounds_error_counts_the_endings_of_its_own_prompts():
    """no_rounds counts the endings of the prompts it names only (mutant m71c-04 counted every
    prompt's), and keeps the caller's advice unless every one of them ended at EOS or the
    context, where more --max-new-tokens changes nothing (m71c-05: one such was enough)."""
    from specrt.runtime.calibrate import no_rounds

    endings = ["eos", "length", "context", "eos"]
    e = no_rounds("training", endings, [0, 1], "give longer generations")
    assert str(e) == ("no draft rounds in the training prompts (each of 2 answers ended before a round could run, "
                      "1 at the end-of-sequence token): give longer generations")
    e = no_rounds("held-out", endings, [2, 3], "give longer generations")
    assert str(e) == ("no draft rounds in the held-out prompts (each of 2 answers ended before a round could run, "
                      "1 at the end-of-sequence token, 1 at the engines' context): give prompts whose answers go on "
                      "(more --max-new-tokens does not change where these end)")
    e = no_rounds("training", [None], [0], "give longer generations")
    assert str(e) == ("no draft rounds in the training prompts (its answer ended before a round could run): "
                      "give longer generations")


def test_a_prompt_line_says_one_round_as_one(small_vocab_engines, tmp_path):
    """Each prompt's line: "3 tokens, 1 round" (mutant m71c-03: "1 rounds")."""
    said: list[str] = []
    calibrate(copy(small_vocab_engines, tmp_path / "e"), prompts(16, 3, seed=2), max_new_tokens=3, holdout=0.0,
              write=False, log=said.append)
    assert [x for x in said if x.startswith("prompt ")] == [f"prompt {i}/3: 3 tokens, 1 round, tau 1.00"
                                                            for i in (1, 2, 3)], said


def test_a_prompt_line_names_the_prompt_s_file_line_and_whether_it_is_held_out(small_vocab_engines, tmp_path):
    """NOTES s72-73 (h73a): each prompt's progress line said "prompt 5/6" only, neither the
    FILE:LINE its errors name it by nor whether it was held out. `specrt calibrate` with a
    held-out file: every line names its file and line, the held-out ones said so."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    pf, hf = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    ps = prompts(16, 3, seed=1)
    pf.write_text("\n".join(json.dumps({"prompt_ids": p}) for p in ps[:2]) + "\n")
    hf.write_text(json.dumps({"prompt_ids": ps[2]}) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--holdout-prompts", str(hf),
                                   "--max-new-tokens", "16"])
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("prompt ")]
    assert [x.split(": ")[0] for x in lines] == [f"prompt 1/3 ({pf}:1)", f"prompt 2/3 ({pf}:2)",
                                                 f"prompt 3/3 ({hf}:1, held out)"], r.stderr
    # the Python API, without labels: "prompt N" is already its name; the held-out ones said
    said: list[str] = []
    calibrate(eng, prompts(16, 4, seed=1), max_new_tokens=16, holdout=0.25, write=False, log=said.append)
    lines = [x for x in said if x.startswith("prompt ")]
    assert len(lines) == 4 and sum(" (held out): " in x for x in lines) == 1, said


def test_coupled_sampling_is_a_mode_of_its_own(small_vocab_engines, tmp_path):
    """Coupled sampling (--reproducible) accepts drafts at another rate than rejection sampling
    at the same temperature: its calibration neither replaces the rejection sampler's nor is
    loaded for it (both were stored under one key, the later fit overwriting the other)."""
    assert SamplingParams(temperature=0.7, coupled=True).mode != SamplingParams(temperature=0.7).mode
    assert SamplingParams(coupled=True).mode == "greedy"  # greedy has no sampling to couple
    eng = copy(small_vocab_engines, tmp_path / "engines")
    rs, cp = SamplingParams(temperature=1.3, seed=3), SamplingParams(temperature=1.3, seed=3, coupled=True)
    a = calibrate(eng, prompts(16, 3, seed=2), max_new_tokens=16, holdout=0.0, sampling=rs)
    b = calibrate(eng, prompts(16, 3, seed=2), max_new_tokens=16, holdout=0.0, sampling=cp)
    assert sorted(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]) == sorted([a["mode"], b["mode"]])
    with Session(eng, governor="dspark", sampling=rs) as s:
        assert s.calibration_note.endswith(f"rounds, {a['mode']})")
    # that mode fitted again: said to replace its calibration, not greedy's (mutant M67 c93)
    said: list[str] = []
    calibrate(eng, prompts(16, 3, seed=4), max_new_tokens=16, holdout=0.0, sampling=rs, log=said.append)
    assert f"; kept {b['mode']}; it replaces the {rs.mode} calibration of {a['rounds']['train']} rounds made " \
        in said[-1], said


def test_calibrate_measures_the_runner_ups_where_the_engines_verify_trees(small_vocab_engines, tmp_path):
    """On engines that verify token trees calibrate's rounds also verify 3 runners-up: per
    rank, the rounds whose first draft was rejected and those the rank won, the same counts
    a fixed:4:tree=4 run reports; stored with the calibration, DSpark starts from them (at
    most SIBLING_PRIOR_MAX tries), and the chain's acceptance stays the samples' outcome."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    ps = prompts(16, 6, seed=2)
    rep = calibrate(eng, ps, max_new_tokens=40, holdout=0.0)
    ru = rep["runner_ups"]
    assert ru["ranks"] == [2, 3, 4] and ru["tries"][0] > 0 and ru["wins"][0] > 0
    assert all(0 <= w <= t for w, t in zip(ru["wins"], ru["tries"])) and ru["tries"] == sorted(ru["tries"], reverse=True)
    assert "token trees: when the first draft is rejected, the runner-up of rank 2 wins" in format_report(rep)
    wins = [0, 0, 0]
    with Session(eng, governor="fixed:4:tree=4") as s:
        for p in ps:
            for _ in s.stream_ids(p, 40):
                pass
            for j, w in enumerate(s.generator.telemetry.to_json()["tree"]["wins_by_rank"]):
                wins[j] += w
    assert [int(w) for w in ru["wins"]] == wins
    cal = Calibration.from_dict(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]["greedy"]["calibration"])
    assert cal.runner_ups == (ru["wins"], ru["tries"])
    # a runner-up's win is the first draft rejected: the position-1 samples count it so
    assert cal.n[0].sum() == rep["rounds"]["train"] and rep["acceptance_by_position"][0] < 1
    assert rep["tau"] == pytest.approx(1 + cal.a.sum() / rep["rounds"]["train"])  # accepted drafts a round
    with Session(eng, governor="dspark:tree=3") as s:
        g = s.generator.governor
        rates = g._win_rates()
        assert rates[1] == pytest.approx(ru["wins"][0] / ru["tries"][0])
        assert rates[2] == pytest.approx(ru["wins"][0] / ru["tries"][0] + ru["wins"][1] / ru["tries"][1])
        assert g.sib_tries == [min(t, DSparkGovernor.SIBLING_PRIOR_MAX) for t in ru["tries"][:2]]
    # held-out prompts' rounds are no part of what is fitted: their runner-ups neither
    held = calibrate(eng, ps[:4], max_new_tokens=40, holdout_prompts=ps[4:], write=False)
    assert held["runner_ups"] == calibrate(eng, ps[:4], max_new_tokens=40, holdout=0.0, write=False)["runner_ups"]


def test_runner_up_counts_round_trip_and_malformed_ones_are_refused():
    cal = Calibration(positions=2)
    assert "runner_ups" not in cal.to_dict()
    cal.runner_ups = ([3.0, 1.0], [10.0, 9.0])
    assert Calibration.from_dict(cal.to_dict()).runner_ups == ([3.0, 1.0], [10.0, 9.0])
    for bad in ({"wins": [3.0], "tries": [1.0]}, {"wins": [1.0], "tries": [1.0, 2.0]}, {"wins": "x"}):
        with pytest.raises(UserError, match="calibration JSON: runner_ups"):
            Calibration.from_dict({**cal.to_dict(), "runner_ups": bad})
    # no measured rank: DSpark's generic priors 1/4, 1/8, ...
    g = DSparkGovernor((1, 2, 4), 1e-3, {1: 1.0, 2: 1.1, 4: 1.2}, Calibration(positions=4))
    g.tree_width = 4
    assert g._win_rates() == pytest.approx([0.0, 0.25, 0.375, 0.4375])
    c = Calibration(positions=4)
    c.runner_ups = ([50.0], [200.0])  # measured rank 2 only: its rate at 64 tries, the rest generic
    g = DSparkGovernor((1, 2, 4), 1e-3, {1: 1.0, 2: 1.1, 4: 1.2}, c)
    g.tree_width = 3
    assert g._win_rates() == pytest.approx([0.0, 0.25, 0.375]) and g.sib_tries == [64.0, 8.0]


def test_calibration_file_format_1_and_malformed_files(engines, tmp_path):
    eng = copy(engines, tmp_path / "engines")
    calibrate(eng, prompts(1000, 2), max_new_tokens=8, holdout=0.0)
    data = json.loads((eng / CALIBRATION_FILE).read_text())
    entry = data["modes"]["greedy"]
    old = {"format": "specrt.calibration-file/1", "export_digest": data["export_digest"], **entry}
    (eng / CALIBRATION_FILE).write_text(json.dumps(old))  # written by specrt before sampled modes
    with Session(eng, governor="dspark") as s:
        assert s.calibration_note.endswith(f"({entry['rounds']} rounds, greedy)")
    for bad, message in [({"format": "specrt.calibration-file/9"}, "expected 'specrt.calibration-file/2'"),
                         ({"format": "specrt.calibration-file/2", "modes": {}}, "at least one calibration"),
                         ({"format": "specrt.calibration-file/2", "modes": {"greedy": {}}}, "mode 'greedy' has no"),
                         ({"format": "specrt.calibration-file/2", "modes": {"greedy": {**entry, "calibration": {
                             **entry["calibration"], "counts": [[1, 2]]}}}},
                          f"{CALIBRATION_FILE}: mode 'greedy': calibration JSON: counts"),
                         ({"format": "specrt.calibration-file/2", "modes": {"temperature=1,top_k=0,top_p=1": {
                             **entry, "sampling": "hot"}}}, "'sampling' 'hot': expected an object"),
                         # NaN counts passed every check and made the map say nan
                         ({"format": "specrt.calibration-file/2", "modes": {"greedy": {**entry, "calibration": {
                             **entry["calibration"], "counts": [[float("nan")] * len(r) for r in
                                                                entry["calibration"]["counts"]]}}}},
                          "calibration JSON: position 1, bin 1: counts nan")]:
        (eng / CALIBRATION_FILE).write_text(json.dumps(bad))
        with pytest.raises(UserError, match=message):
            Session(eng, governor="dspark")
    # a well-formed file that names no engines (no export digest) is used on none of them: it
    # was used on any engines, as if fitted for them (and then said as "fitted for other engines")
    (eng / CALIBRATION_FILE).write_text(json.dumps({k: v for k, v in old.items() if k != "export_digest"}))
    with Session(eng, governor="dspark") as s:
        assert s.calibration is None and "names no export digest" in s.calibration_note


def test_a_calibration_file_nested_too_deeply_is_named(tmp_path):
    """(a RecursionError traceback from `specrt run` before: found by the manifest mutation review)"""
    from specrt.runtime.session import read_calibration_file

    p = tmp_path / CALIBRATION_FILE
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError, match=f"{p}: not valid JSON \\(nested too deeply to read\\)"):
        read_calibration_file(p)
    p.write_text('{"format": ' + "9" * 5000 + "}")  # past Python's digit limit for int: a ValueError traceback
    with pytest.raises(UserError, match=f"{p}: not valid JSON \\(a number of 5000 digits, past the 4300 Python reads\\)$"):
        read_calibration_file(p)


def test_a_calibration_hand_edited_or_misplaced_is_said_as_it_is(small_vocab_engines, tmp_path):
    """What a user walk (session 71) found said untruly: "rounds": null shown as "(None rounds,
    greedy)" in every run's note; a file without an export digest said as fitted for other
    engines, "export digest differs"; a folder named calibration.json as "no calibration stored"."""
    from specrt.engines import load_engines
    from specrt.runtime.session import read_calibration_file

    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 8, seed=1), max_new_tokens=8, holdout=0.25)
    p = eng / CALIBRATION_FILE
    data = json.loads(p.read_text())
    for rounds in (None, "12", 1.5, -1):
        data["modes"]["greedy"]["rounds"] = rounds
        p.write_text(json.dumps(data))
        with pytest.raises(UserError, match=f"{p}: mode 'greedy': 'rounds' {re.escape(repr(rounds))}: expected a "
                                            "whole number >= 0$"):
            read_calibration_file(p)
    del data["modes"]["greedy"]["rounds"], data["export_digest"]
    p.write_text(json.dumps(data))
    cal, note = load_calibration(load_engines(eng, verify=False))
    assert cal is None and note == (f"{p} names no export digest (expected one written by `specrt calibrate`): "
                                    "using the identity map")  # (format /2 here; /1 above)
    p.unlink()
    p.mkdir()
    cal, note = load_calibration(load_engines(eng, verify=False))
    assert cal is None and note == (f"{p} is a folder, not a calibration: DSpark uses the identity map (remove it "
                                    "and run `specrt calibrate`)")


def test_a_calibration_fitted_on_engines_of_another_draft_precision_says_so(small_vocab_engines, tmp_path):
    """A calibration.json copied to engines rebuilt from the same export with another
    --draft-weights was taken as theirs without a word (a user walk, session 71): the draft's
    confidences move with its weights' precision."""
    from specrt.engines import build_engines, load_engines

    fp = copy(small_vocab_engines, tmp_path / "fp")
    calibrate(fp, prompts(16, 4, seed=1), max_new_tokens=12, holdout=0.0)
    assert json.loads((fp / CALIBRATION_FILE).read_text())["modes"]["greedy"]["draft_weights"] == "fp"
    cal, note = load_calibration(load_engines(fp, verify=False))
    assert cal is not None and note.endswith(" rounds, greedy)")
    q = tmp_path / "q"  # (the same export)
    build_engines(small_vocab_engines.parent / "export", "onnxruntime", DEPTHS, q, log=quiet, profile_repeats=1,
                  draft_weights="int8:blocks")
    shutil.copy(fp / CALIBRATION_FILE, q / CALIBRATION_FILE)
    cal, note = load_calibration(load_engines(q, verify=False))
    assert cal is not None and note.endswith(" rounds, greedy); fitted on engines of the fp draft, these run the int8 "
                                             "one: its confidences differ a little (`specrt calibrate` on these "
                                             "engines fits them)"), note


def test_a_calibration_fitted_on_shallower_engines_says_so(small_vocab_engines, tmp_path):
    """A calibration fitted on depth-2 engines, used on deeper ones of the same export, was
    noted as any other ("calibration from calibration.json (23 rounds, greedy)") while DSpark
    mapped the deeper positions as the identity (a user walk, session 54)."""
    from specrt.runtime.session import shallower_note

    assert shallower_note(2, (1, 2)) == shallower_note(None, (1, 2, 4)) == shallower_note(True, (1, 4)) == ""
    assert shallower_note(2, (1, 2, 3)).startswith("; fitted on engines of depth 2: position 3 the identity map")
    assert shallower_note(1, (1, 2, 4)).startswith("; fitted on engines of depth 1: positions 2-4 the identity map")
    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 8, seed=1), max_new_tokens=8, holdout=0.25)
    data = json.loads((eng / CALIBRATION_FILE).read_text())
    deep = data["modes"]["greedy"]["depth"]
    assert deep >= 2
    with Session(eng, governor="dspark") as s:
        assert "fitted on engines of depth" not in s.calibration_note
    data["modes"]["greedy"]["depth"] = 1
    cal = data["modes"]["greedy"]["calibration"]  # as depth-1 engines' calibrate fits it: one position
    cal["counts"], cal["accepted"] = cal["counts"][:1], cal["accepted"][:1]
    (eng / CALIBRATION_FILE).write_text(json.dumps(data))
    with Session(eng, governor="dspark") as s:
        assert s.calibration_note.endswith(f"greedy); fitted on engines of depth 1: positions 2-{deep} the identity map "
                                           "until this run's rounds refine them (`specrt calibrate` on these engines "
                                           "fits them)"), s.calibration_note
        # and so it is (they shared position 1's map, and their rounds went into its counts: a
        # review, session 56): each later position its own, the identity until it has rounds
        c = s.generator.governor.calibration
        assert c.positions == deep and s.calibration.positions == 1  # (the governor's copy, extended)
        x = [0.3] * deep
        assert c(x)[1:] == pytest.approx([0.3] * (deep - 1)) and c(x)[0] != pytest.approx(0.3)
        before = c.n[0].sum()
        c.update(np.full(deep, 0.9), deep - 1)
        assert c.n[0].sum() == before + 1 and c.n[1:].sum() == deep - 1


@pytest.mark.parametrize("edit", ["a position less", "a position more", "depth", "depth not a number",
                                  "depth a float", "depth zero"])
def test_a_calibration_whose_positions_are_not_its_depth_is_refused(small_vocab_engines, tmp_path, edit):
    """calibrate stores a map for each position 1..depth: a hand-edited file with a position
    missing was taken without a word (DSpark mapping it as the identity, no note), as was one
    more or a 'depth' changed (a user walk, session 71). Refused by DSpark naming the file;
    a governor that reads no calibration goes on, saying so."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(16, 4, seed=1), max_new_tokens=8, holdout=0.0)
    data = json.loads((eng / CALIBRATION_FILE).read_text())
    entry = data["modes"]["greedy"]
    cal, deep = entry["calibration"], entry["depth"]
    assert len(cal["counts"]) == deep  # as calibrate writes it
    if edit == "a position less":
        cal["counts"], cal["accepted"] = cal["counts"][:-1], cal["accepted"][:-1]
        said = f"'depth' {deep} but {deep - 1} positions"
    elif edit == "a position more":
        cal["counts"], cal["accepted"] = cal["counts"] * 2, cal["accepted"] * 2
        said = f"'depth' {deep} but {2 * deep} positions"
    else:
        # (a float equal to the positions: not a depth calibrate writes; mutant m71c-18 took it)
        # (0: mutant m71c-59 read 'depth' by its truth and took it)
        entry["depth"] = {"depth": deep + 1, "depth a float": float(deep), "depth zero": 0}.get(edit, "four")
        said = f"'depth' {entry['depth']!r} but {deep} positions"
    (eng / CALIBRATION_FILE).write_text(json.dumps(data))
    with pytest.raises(UserError, match=re.escape(f"{eng / CALIBRATION_FILE}: mode 'greedy': {said} in its "
                                                  "calibration's 'counts': expected a row for each position 1..depth")):
        Session(eng, governor="dspark")
    with Session(eng, governor="fixed:1") as s:
        assert s.calibration is None and s.calibration_note.startswith("calibration ignored (fixed:1 does not read it)")


def test_a_calibration_file_not_in_utf8_is_named_and_calibrate_replaces_it(small_vocab_engines, tmp_path):
    """A calibration.json in another encoding (an editor's Latin-1, or a --grow-file written over
    it) was a UnicodeDecodeError traceback in every command that loads the engines, calibrate,
    which replaces an unusable file, too (a user walk, session 54)."""
    from specrt.runtime.session import read_calibration_file

    eng = copy(small_vocab_engines, tmp_path / "engines")
    p = eng / CALIBRATION_FILE
    p.write_bytes(b'{"format": "specrt.calibration-file/2", "note": "caf\xe9"}')
    with pytest.raises(UserError, match=f"{p}: not valid JSON \\('utf-8' codec"):
        read_calibration_file(p)
    with pytest.raises(UserError, match="writes it again"):
        Session(eng, governor="dspark")
    from specrt.engines import load_engines

    with pytest.raises(UserError, match="writes it again"):  # (no governor named: refused as for DSpark)
        load_calibration(load_engines(eng, verify=False))
    with Session(eng, governor="fixed:1") as s:
        assert s.calibration_note.startswith("calibration ignored")
    calibrate(eng, prompts(4, 8, seed=1), max_new_tokens=8, holdout=0.25)
    assert "greedy" in read_calibration_file(p)


def test_report_ece_fields_exist_and_lie_in_unit_interval(small_vocab_engines, tmp_path):
    eng = copy(small_vocab_engines, tmp_path / "engines")
    rep = calibrate(eng, prompts(16, 8, seed=1), max_new_tokens=24, holdout=0.25)
    assert rep["kind"] in Calibration.KINDS and rep["samples"]["holdout"] > 0
    # the held-out samples: every position a held-out round reached, as the ECE counts them
    assert rep["evaluated_on"] == "holdout" and rep["samples"]["holdout"] == sum(rep["ece"]["conditional"]["n"])
    for which in ("conditional", "survival"):
        e = rep["ece"][which]
        assert len(e["before"]) == len(e["after"]) == len(e["n"]) == rep["depth"] == 4
        for v in [e["before_all"], e["after_all"], *e["before"], *e["after"]]:
            assert v is None or 0.0 <= v <= 1.0
        assert e["before"][0] is not None and e["after"][0] is not None
        assert len(e["auc_before"]) == len(e["auc_after"]) == 4
        assert all(v is None or 0.0 <= v <= 1.0 for v in e["auc_before"] + e["auc_after"])
    assert rep["acceptance_by_position"][0] > 0  # this pair accepts drafts
    json.dumps(rep)  # the report is JSON


@pytest.mark.parametrize("which", ["engines", "small_vocab_engines"])
def test_greedy_output_is_the_same_whatever_the_governor(which, request, tmp_path):
    eng = copy(request.getfixturevalue(which), tmp_path / "engines")
    vocab = 1000 if which == "engines" else 16
    ps = prompts(vocab, 3, seed=2)
    if which == "small_vocab_engines":  # dspark with a stored calibration as well
        calibrate(eng, prompts(vocab, 4, seed=3), max_new_tokens=24, holdout=0.0)
    outs, accepted = {}, {}
    for gov in GOVERNORS:
        with Session(eng, governor=gov) as s:
            outs[gov], accepted[gov] = [], 0
            for p in ps:
                outs[gov].append([t for chunk in s.stream_ids(p, 24) for t in chunk])
                accepted[gov] += s.generator.telemetry.accepted
    for gov in GOVERNORS:
        assert outs[gov] == outs["off"], gov
    assert all(len(o) == 24 for o in outs["off"])
    if which == "small_vocab_engines":
        assert accepted["fixed:4"] > 0, accepted  # drafts do get accepted here, so identity is not trivial


# ---- command line -----------------------------------------------------------------------


def cli():
    from specrt.cli import main
    from specrt.cmd_calibrate import calibrate as cmd

    if "calibrate" not in main.commands:
        main.add_command(cmd)
    return main


def test_cli_calibrate(small_vocab_engines, tmp_path):
    eng = copy(small_vocab_engines, tmp_path / "engines")
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt_ids": p}) for p in prompts(16, 4)) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "12",
                                   "--holdout", "0.5", "--report", str(tmp_path / "rep.json")])
    assert r.exit_code == 0, r.output
    assert "ECE c before" in r.output and (eng / CALIBRATION_FILE).is_file()
    assert json.loads((tmp_path / "rep.json").read_text())["prompts"]["train"] == 2
    # a separate held-out file: every --prompts prompt trains, the other file is evaluated
    hf = tmp_path / "h.jsonl"
    hf.write_text("\n".join(json.dumps({"prompt_ids": p}) for p in prompts(16, 3, seed=5)) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "12",
                                   "--holdout-prompts", str(hf), "--report", str(tmp_path / "rep2.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep2.json").read_text())
    assert rep["prompts"] == {"train": 4, "holdout": 3, "holdout_source": "separate set"}
    assert rep["rounds"]["holdout"] > 0 and rep["evaluated_on"] == "holdout"
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "12",
                                   "--holdout", "0", "--temperature", "0.8", "--top-k", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["mode"] == "temperature=0.8,top_k=5,top_p=1"
    assert sorted(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]) == ["greedy", "temperature=0.8,top_k=5,top_p=1"]


def test_cli_calibrate_defaults_reach_the_report(small_vocab_engines, tmp_path):
    """calibrate's defaults as --help shows them: 128 new tokens a prompt, a quarter of the
    prompts held out, seed 0 for sampled decoding (the same calibration run again), no chat
    template unless --chat; the report (printed with --json, and --report's file) says each."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt_ids": p}) for p in prompts(16, 4)) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--temperature", "0.8", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output[r.output.index("{"):])
    assert rep["max_new_tokens"] == 128 and rep["chat"] is False and rep["sampling"]["seed"] == 0, rep
    assert rep["prompts"] == {"train": 3, "holdout": 1, "holdout_source": "0.25 of the prompts"}, rep["prompts"]
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "3", "--chat",
                                   "--holdout", "0", "--report", str(tmp_path / "rep.json")])
    assert r.exit_code == 0 and "ECE c before" in r.output, r.output  # (a table, not JSON, without --json)
    assert json.loads((tmp_path / "rep.json").read_text())["chat"] is True


@pytest.mark.parametrize("lines, args, message", [
    (['{"text": "x"}'], [], "expected an object with a string field 'prompt'"),
    (["not json"], [], "not a JSON line"),
    (['{"prompt_ids": [1, 2]}'], ["--holdout", "1.5"], "--holdout 1.5: expected a fraction"),
    (['{"prompt_ids": [1, 2]}'], ["--max-new-tokens", "2"], "--max-new-tokens 2: expected >= 3 (the prefill makes "
                                                            "the first token, and a draft round needs the next two)"),
    # (calibrate's hint: its prompts may be ids; mutant M67 c41)
    (['{"prompt": "hello"}'], ["--holdout", "0"], "no tokenizer.json; give token ids ('prompt_ids') instead of text"),
    (['{"prompt_ids": [1, 2]}'], ["--temperature", "-1"], "--temperature -1: expected a finite number"),
    (['{"prompt_ids": [1, 2]}'], ["--temperature", "1", "--top-p", "0"], "--top-p 0: expected a number in (0, 1]"),
    # ids that are not ids beside a good text prompt: named (they were used, and failed later)
    (['{"prompt": "hi", "prompt_ids": ["a", "b"]}'], [], ":1: 'prompt_ids' must be a non-empty list of integer"),
    (['{"prompt": "hi", "prompt_ids": []}'], [], ":1: 'prompt_ids' must be a non-empty list of integer"),
    # each prompt checked before any decodes, named by its line (a user walk: line 9 failed after 8 prompts'
    # work, as "prompt token id 99 ...", naming no file)
    (['{"prompt_ids": [1, 2]}', "", '{"prompt_ids": [1, 2, 3]}', '{"prompt_ids": [1, 10000000]}'], [],
     "p.jsonl:4: prompt token id 10000000 is outside the vocabulary"),
    (['{"prompt_ids": [1, 2]}', '{"prompt_ids": ' + str([1] * 5000) + '}'], [], "p.jsonl:2: the prompt has 5000 tokens"),
])
def test_cli_bad_input_is_a_user_error(lines, args, message, engines, tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(lines) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), *args])
    assert r.exit_code == 1 and message in r.output, r.output
    assert not (engines / CALIBRATION_FILE).exists() and "prompt 1/" not in r.output  # (nothing decoded)


def test_cli_names_a_bad_held_out_prompt_by_its_file_and_line(engines, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n')
    (tmp_path / "h.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n{"prompt_ids": [4, 10000000]}\n')
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(tmp_path / "p.jsonl"),
                                   "--holdout-prompts", str(tmp_path / "h.jsonl")])
    assert r.exit_code == 1 and f"error: {tmp_path / 'h.jsonl'}:2: prompt token id 10000000 is outside the " \
        "vocabulary" in r.output and "; no prompt was decoded" in r.output, r.output
    with pytest.raises(UserError, match=r"^held-out prompt 2: prompt token id 10000000 .*; no prompt was decoded$"):
        calibrate(engines, [[1, 2, 3]], holdout_prompts=[[1, 2, 3], [4, 10000000]], write=False)


def test_one_prompt_past_the_context_is_said_with_the_holdout_error(engines, tmp_path):
    """Session 71's calibrate walk, 7 (h73a): one prompt past the context under the default
    --holdout said "--holdout 0.25 needs at least 2 prompts (got 1)" alone, and only the next
    try, with --holdout 0, said the prompt's length. Both are said in one run now, nothing
    decoded; a good prompt alone still gets the --holdout error, before it is decoded."""
    pf = tmp_path / "p.jsonl"
    pf.write_text(json.dumps({"prompt_ids": [1] * 5000}) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf)])
    assert r.exit_code == 1 and f"error: {pf}:1: the prompt has 5000 tokens; the engines' context limit is " in r.output \
        and "; no prompt was decoded. Also: --holdout 0.25 needs at least 2 prompts (got 1); or pass --holdout 0" \
        in r.output, r.output
    pf.write_text(json.dumps({"prompt_ids": [1, 2, 3]}) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf)])
    assert r.exit_code == 1 and r.output == ("error: --holdout 0.25 needs at least 2 prompts (got 1); or pass "
                                             "--holdout 0\n"), r.output
    assert not (engines / CALIBRATION_FILE).exists()


def test_the_holdout_a_later_check_refuses_is_echoed_as_typed(engines, tmp_path):
    """h74e (h74b's leftover of L4): the number options are echoed as typed when refused, but
    the later "--holdout 0.50 needs at least 2 prompts" (one prompt; and its "Also:" beside a
    prompt past the context) said the parsed 0.5, and the note beside --holdout-prompts too."""
    pf, hf = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    hf.write_text('{"prompt_ids": [10000000]}\n')  # (refused: nothing decoded)
    for typed, said in (("0.50", "0.50"), (".5", ".5"), (" 0.5", "' 0.5'")):
        pf.write_text(json.dumps({"prompt_ids": [1, 2, 3]}) + "\n")
        r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), "--holdout", typed])
        assert r.exit_code == 1 and r.output == (f"error: --holdout {said} needs at least 2 prompts (got 1); or pass "
                                                 "--holdout 0\n"), r.output
        pf.write_text(json.dumps({"prompt_ids": [1] * 5000}) + "\n")
        r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), "--holdout", typed])
        assert r.exit_code == 1 and f". Also: --holdout {said} needs at least 2 prompts (got 1)" in r.output, r.output
        r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), "--holdout", typed,
                                       "--holdout-prompts", str(hf)])
        assert r.exit_code == 1 and r.output.startswith(f"note: --holdout {said} has no effect beside "), r.output
    assert not (engines / CALIBRATION_FILE).exists()


def test_holdout_given_beside_held_out_prompts_is_said_to_change_nothing(engines, tmp_path):
    """A walk (h73a): `--holdout 0.5 --holdout-prompts H` ignored --holdout without a word (the
    help says so, the run did not); a note says it, and only where --holdout was given."""
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n{"prompt_ids": [4, 5, 6]}\n')
    (tmp_path / "h.jsonl").write_text('{"prompt_ids": [10000000]}\n')  # (refused: nothing decoded)
    args = ["calibrate", str(engines), "--prompts", str(tmp_path / "p.jsonl"), "--holdout-prompts",
            str(tmp_path / "h.jsonl")]
    said = "note: --holdout 0.5 has no effect beside --holdout-prompts (every prompt of --prompts trains)\n"
    r = CliRunner().invoke(cli(), [*args, "--holdout", "0.5"])
    assert r.exit_code == 1 and r.output.startswith(said) and "h.jsonl:1: prompt token id" in r.output, r.output
    r = CliRunner().invoke(cli(), args)
    assert r.exit_code == 1 and "note:" not in r.output and "h.jsonl:1: prompt token id" in r.output, r.output


def test_the_report_may_not_replace_a_prompt_file(engines, tmp_path):
    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt_ids": [1, 2, 3]}\n')
    for args, other in ((["--report", str(pf)], "--prompts"),
                        (["--holdout-prompts", str(tmp_path / "h.jsonl"), "--report", str(tmp_path / "h.jsonl")],
                         "--holdout-prompts")):
        (tmp_path / "h.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n')
        r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), *args])
        assert r.exit_code == 1 and f"{other} and --report name the same file" in r.output, r.output
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), "--holdout-prompts", str(pf)])
    assert r.exit_code == 1 and "--prompts and --holdout-prompts name the same file" in r.output, r.output
    assert pf.read_text() == '{"prompt_ids": [1, 2, 3]}\n' and not (engines / CALIBRATION_FILE).exists()



# mutant M67 m05 (cmd_calibrate.py): --report's place found unwritable only after the work
def test_a_report_that_cannot_be_written_is_refused_before_any_work(engines, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2, 3]}\n')
    (tmp_path / "f").write_text("")
    rep = tmp_path / "f" / "rep.json"
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(tmp_path / "p.jsonl"), "--report",
                                   str(rep)])
    assert r.exit_code == 1 and f"--report {rep}: {tmp_path / 'f'} is a file, not a folder" in r.output, r.output
    assert "prompt 1/" not in r.output and not (engines / CALIBRATION_FILE).exists()

def test_governor_replay_prices_the_rule_against_fixed_depths_and_the_oracle(small_vocab_engines, tmp_path):
    """tools/governor_replay.py: DSpark's post-draft rule replayed on recorded full-depth rounds."""
    import importlib.util

    from tests.real_model import ROOT

    spec = importlib.util.spec_from_file_location("governor_replay", ROOT / "tools" / "governor_replay.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(16, 8, seed=1), max_new_tokens=24, holdout=0.25)
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts(16, 6, seed=2)))
    out = tmp_path / "replay.json"
    assert tool.main([str(eng), "--prompts", str(f), "--max-new-tokens", "24", "-o", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["rounds"] > 0 and rep["best_fixed"] in {f"fixed:{d}" for d in DEPTHS}
    assert max(rep["fixed_vs_best"].values()) == pytest.approx(1.0)
    assert set(rep["vs_best_fixed"]) == {"post_draft_oracle", "dspark_rule_calibrated", "dspark_rule_raw_confidence",
                                         "dspark_rule_mean_confidence", "dspark_simulated"}
    assert sum(rep["simulated_block_depth"].values()) == rep["rounds"]
    assert all(v > 0 for v in rep["vs_best_fixed"].values())
    assert sum(rep["choices"]["calibrated"].values()) == rep["rounds"]


def main_twice(exp, engines: Path, tmp_path: Path) -> dict:
    """An experiment tool's main on 4 prompts recording --rows, then again from the saved
    rounds: the two reports must be the same; returns it."""
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts(16, 4, seed=3)))
    out, rows = tmp_path / "exp.json", tmp_path / "rows.npz"
    args = [str(engines), "--prompts", str(f), "--max-new-tokens", "24", "--rows", str(rows)]
    assert exp.main([*args, "-o", str(out)]) == 0 and rows.is_file()
    assert exp.main([*args, "-o", str(tmp_path / "again.json")]) == 0
    rep = json.loads(out.read_text())
    assert json.loads((tmp_path / "again.json").read_text()) == rep
    return rep


def test_target_confidence_experiment_records_and_analyses(small_vocab_engines, tmp_path):
    """tools/exp_target_confidence.py on real engines: every full-depth round carries the
    drafts' confidences and the target's confidence in a probability's range."""
    from tests.real_model import tool

    exp = tool("exp_target_confidence")
    rec = exp.record(small_vocab_engines, [{"prompt_ids": p} for p in prompts(16, 4, seed=3)], False, 24)
    r, K = rec["rows"], DEPTHS[-1]
    assert len(r["accepted"]) > 0 and r["conf"].shape == (len(r["accepted"]), K)
    assert np.all((r["tconf"] >= 1 / 16 - 1e-6) & (r["tconf"] <= 1 + 1e-9))
    assert np.all((r["tent"] >= -1e-9) & (r["tent"] <= np.log(16) + 1e-6))
    assert set(r["prompt"].tolist()) <= {0, 1, 2, 3} and np.all((r["accepted"] >= 0) & (r["accepted"] <= K))
    rep = main_twice(exp, small_vocab_engines, tmp_path)
    assert rep["rounds"] == len(r["accepted"]) and rep["best_fixed"] in {f"fixed:{d}" for d in DEPTHS}
    assert set(rep["rule_vs_best_fixed"]) == {"draft_only", "draft_and_target", "draft_direct_survival"}


def test_draft_features_experiment_records_and_analyses(small_vocab_engines, tmp_path):
    """tools/exp_draft_features.py on real engines: per full-depth round and position, the
    draft's top probability (the runtime's confidence), entropy and runner-up probability."""
    from tests.real_model import tool

    exp = tool("exp_draft_features")
    rec = exp.record(small_vocab_engines, [{"prompt_ids": p} for p in prompts(16, 4, seed=3)], False, 24)
    r, K = rec["rows"], DEPTHS[-1]
    assert len(r["accepted"]) > 0 and r["feats"].shape == (len(r["accepted"]), K, 3)
    top, ent, sec = r["feats"][..., 0], r["feats"][..., 1], r["feats"][..., 2]
    assert np.all((top >= 1 / 16 - 1e-6) & (top <= 1 + 1e-9) & (sec <= top + 1e-12) & (sec >= 0))
    assert np.all((ent >= -1e-9) & (ent <= np.log(16) + 1e-6))
    assert r["aux"].shape[0] == len(r["accepted"]) and r["aux"].ndim == 2 and np.isfinite(r["aux"]).all()
    rep = main_twice(exp, small_vocab_engines, tmp_path)
    assert rep["rounds"] == len(r["accepted"])
    assert set(rep["rule_vs_best_fixed"]) == {"top_only", "top_entropy_second", "top_and_previous_round", "top_and_aux32"}


def test_tree_width_experiment_records_and_analyses(small_vocab_engines, tmp_path):
    """tools/exp_tree_width.py on real engines: per full-depth round the rank of the target's
    first token among the draft's first-position choices (0 exactly when the first draft is
    accepted, greedy) and the draft's top-4 probabilities there; the report prices fixed
    (depth, width) pairs, the rules and the runtime's governor simulated."""
    from tests.real_model import tool

    exp = tool("exp_tree_width")
    rec = exp.record(small_vocab_engines, [{"prompt_ids": p} for p in prompts(16, 4, seed=3)], False, 24)
    r = rec["rows"]
    assert len(r["accepted"]) > 0 and r["conf"].shape == (len(r["accepted"]), DEPTHS[-1])
    assert np.array_equal(r["rank"] == 0, r["accepted"] >= 1)
    assert np.all((r["rank"] >= 0) & (r["rank"] <= exp.TOP)) and (r["rank"] >= 1).any()
    q = r["q"]
    assert q.shape == (len(r["accepted"]), 4) and np.all(np.diff(q, axis=1) <= 1e-12) and np.all(q.sum(1) <= 1 + 1e-9)
    assert np.allclose(q[:, 0], r["conf"][:, 0], atol=1e-4)  # the top probability is the runtime's confidence
    rep = main_twice(exp, small_vocab_engines, tmp_path)
    assert rep["rounds"] == len(r["accepted"]) and max(rep["fixed_vs_best"].values()) == pytest.approx(1.0)
    for k in ("rule_w3", "rule_width_per_round", "dspark_tree3_simulated", "dspark_tree4_simulated"):
        assert rep[k]["vs_best_fixed"] > 0
    assert rep["post_draft_oracle"] >= max(rep[k]["vs_best_fixed"] for k in rep if k.startswith("rule_")) - 1e-9
    # at any table: a CI host once measured these engines' decode dearer than verify + draft,
    # where the oracle that always decoded a rejected round fell to 0.67x the best fixed pair
    costs = json.loads((small_vocab_engines / "engines.json").read_text())["costs"]
    dear = {**costs, "decode": 2 * max(costs["verify"].values())}
    rep = exp.analyse(r["conf"], r["accepted"], r["rank"], r["q"], r["prompt"], dear, list(DEPTHS))
    assert rep["post_draft_oracle"] >= max(1.0, *(rep[k]["vs_best_fixed"] for k in rep if k.startswith("rule_"))) - 1e-9


def test_draft_block_experiment_replays_the_tree_width_rounds(small_vocab_engines, tmp_path):
    """tools/exp_draft_block.py on exp_tree_width's recorded rounds: every variant priced
    on every kind and mixed against the old (0.02, 16) pair, which is 1 by construction."""
    from tests.real_model import tool

    tool("exp_tree_width")  # exp_draft_block imports it
    exp = tool("exp_draft_block")
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt_ids": p, "kind": k}) + "\n"
                         for p, k in zip(prompts(16, 4, seed=3), ("a", "b", "a", "b"))))
    rows, out = tmp_path / "rows.npz", tmp_path / "r.json"
    args = [str(small_vocab_engines), "--prompts", str(f), "--max-new-tokens", "24", "--rows", str(rows), "-o", str(out)]
    assert exp.main(args) == 0 and rows.is_file()
    rep = json.loads(out.read_text())
    assert set(rep["rounds"]) == {"mixed", "a", "b"} and rep["rounds"]["mixed"] == rep["rounds"]["a"] + rep["rounds"]["b"]
    v = rep["vs_baseline"]
    assert {"ceiling_decay=0.02 full_every=16",  # the baseline (its own ratio, 1 by construction)
            "defaults", "peek", "block=1", "ceiling_decay=0.05 full_every=64", "running-rates alpha=0.1"} <= set(v)
    assert v["defaults"] == v["ceiling_decay=0.05 full_every=64"]  # the runtime's defaults are that pair
    assert all(r > 0 for row in v.values() for r in row.values())


def test_draft_features_analysis_finds_a_signal_only_where_there_is_one():
    """Constructed rounds whose first draft is accepted exactly when the draft's runner-up
    is unlikely, whatever its top probability: only the three-feature model sees it."""
    from tests.real_model import tool

    exp = tool("exp_draft_features")
    rng = np.random.default_rng(1)
    n, K = 2000, DEPTHS[-1]
    top = rng.uniform(0.3, 0.9, (n, K))
    sec = (1 - top) * rng.uniform(0.0, 1.0, (n, K))
    ent = rng.uniform(0.1, 2.0, (n, K))
    accepted = np.where(sec[:, 0] < 0.5 * (1 - top[:, 0]), rng.integers(1, K + 1, n), 0)
    costs = {"decode": 0.020, "draft": 0.002, "verify": {"1": 0.021, "2": 0.022, "4": 0.024}}
    rep = exp.analyse(np.stack([top, ent, sec], -1), accepted, np.arange(n) % 40, costs, list(DEPTHS))
    assert rep["auc_crossfitted"]["top_entropy_second"]["S1"] > 0.8
    assert rep["auc_crossfitted"]["top_only"]["S1"] < rep["auc_crossfitted"]["top_entropy_second"]["S1"] - 0.1
    assert rep["rule_vs_best_fixed"]["top_entropy_second"] > rep["rule_vs_best_fixed"]["top_only"]


def test_target_confidence_analysis_finds_a_signal_only_where_there_is_one():
    """Constructed rounds whose first draft is accepted exactly when the target was sure:
    the draft's confidence is noise, the target's confidence separates the rounds."""
    from tests.real_model import tool

    exp = tool("exp_target_confidence")
    rng = np.random.default_rng(0)
    n, K = 2000, DEPTHS[-1]
    tconf = rng.uniform(0.05, 0.95, n)
    accepted = np.where(tconf > 0.5, rng.integers(1, K + 1, n), 0)
    conf = rng.uniform(0.05, 0.95, (n, K))
    costs = {"decode": 0.020, "draft": 0.002, "verify": {"1": 0.021, "2": 0.022, "4": 0.024}}
    rep = exp.analyse(conf, accepted, tconf, -np.log(tconf), np.arange(n) % 40, costs, list(DEPTHS))
    assert rep["auc_position1"]["target_confidence"] == pytest.approx(1.0)
    assert abs(rep["auc_position1"]["draft_confidence"] - 0.5) < 0.05
    assert rep["auc_crossfitted"]["draft_and_target"]["S1"] > 0.99
    assert abs(rep["auc_crossfitted"]["draft_only"]["S1"] - 0.5) < 0.05
    assert rep["auc_pre_draft_target_only"] > 0.99
    # with the signal, the rule decodes the hopeless rounds and gains on the best fixed depth
    assert rep["rule_vs_best_fixed"]["draft_and_target"] > rep["rule_vs_best_fixed"]["draft_only"]
    assert rep["rule_vs_best_fixed"]["draft_and_target"] <= rep["post_draft_oracle_vs_best_fixed"] + 1e-9


def test_direct_survival_sees_what_a_product_of_positions_misses():
    """Constructed rounds where whether the second draft is accepted depends on the FIRST
    draft's confidence: per-position fits cannot see it, a direct survival model can."""
    from tests.real_model import tool

    exp = tool("exp_target_confidence")
    rng = np.random.default_rng(1)
    n = 4000
    conf = rng.uniform(0.05, 0.95, (n, 3))
    first = rng.uniform(size=n) < 0.5  # the first draft: a coin, whatever its confidence
    second = first & (conf[:, 0] > 0.5)  # the second: taken when the FIRST draft was sure
    accepted = first.astype(int) + second + (second & (rng.uniform(size=n) < 0.5))
    fold = np.arange(n) % 2
    from specrt.runtime.governor import auc

    label = (accepted >= 2).astype(float)
    product = np.prod(exp.crossfit(lambda k: exp.logit(conf[:, k])[:, None], accepted, fold, 3)[:, :2], axis=1)
    direct = np.prod(exp.direct_survival(conf, accepted, fold)[:, :2], axis=1)
    assert auc(direct, label) > 0.8 and abs(auc(product, label) - 0.5) < 0.05
    assert np.all(np.diff(np.cumprod(exp.direct_survival(conf, accepted, fold), axis=1), axis=1) <= 1e-12)


def test_simulating_a_fixed_governor_prices_like_the_fixed_depth():
    """tools/governor_replay.simulate drives a governor as the generator does; a fixed depth
    driven that way costs exactly what bench_governors.price says it costs, and `off`
    decodes every round."""
    from specrt.runtime.governor import FixedGovernor, OffGovernor
    from tests.real_model import tool

    replay, bench = tool("governor_replay"), tool("bench_governors")
    rng = np.random.default_rng(0)
    rounds = [(rng.uniform(size=4), int(a)) for a in rng.integers(0, 5, 300)]
    costs = {"decode": 0.020, "draft": 0.003, "draft_by_depth": {"2": 0.002, "4": 0.003},
             "verify": {"1": 0.021, "2": 0.022, "4": 0.025}}
    accepted = [a for _, a in rounds]
    for k in DEPTHS:
        rate, taken = replay.simulate(FixedGovernor(DEPTHS, k), rounds, costs, DEPTHS)
        assert rate == pytest.approx(bench.price([k] * len(rounds), accepted, costs, DEPTHS))
        assert taken == {f"{k}/{k}": len(rounds)}
    rate, taken = replay.simulate(OffGovernor(), rounds, costs, DEPTHS)
    assert rate == pytest.approx(1 / 0.020) and taken == {"0/0": len(rounds)}
    # seen at one table, paid at another: the choices stay, the price is the other table's
    dear = {**costs, "verify": {d: 2 * v for d, v in costs["verify"].items()}}
    rate, taken = replay.simulate(FixedGovernor(DEPTHS, 2), rounds, costs, DEPTHS, pay=dear)
    assert rate == pytest.approx(bench.price([2] * len(rounds), accepted, dear, DEPTHS)) and taken == {"2/2": len(rounds)}


def test_replays_price_a_tree_past_the_deepest_depth_with_the_tables_chains():
    """A token tree's d + n rows past the deepest built depth run on the prefill engine (the
    cost table's chains), as the runtime prices and runs them: governor_replay.simulate pays
    a fixed ``:tree=3`` round at depth 4 the interpolated chain of 6 (not verify.4), and the
    replays' DSpark (bench_governors.dspark_from_table) verifies runners-up past depth 4
    when the chains make them cheap. A table without chains keeps the deepest verify."""
    from specrt.runtime.governor import FixedGovernor, GovernorState
    from tests.real_model import tool

    replay, bench = tool("governor_replay"), tool("bench_governors")
    costs = {"decode": 0.020, "draft": 0.003, "draft_by_depth": {"2": 0.002, "4": 0.003},
             "verify": {"1": 0.021, "2": 0.022, "4": 0.025}, "chain": {"5": 0.027, "9": 0.031}}
    rows = bench.rows_cost(costs, DEPTHS)
    assert [rows(m) for m in (1, 3, 4, 5, 6, 9, 13)] == pytest.approx([0.021, 0.025, 0.025, 0.027, 0.028, 0.031, 0.035])
    assert bench.rows_cost({k: v for k, v in costs.items() if k != "chain"}, DEPTHS)(6) == 0.025
    rounds = [(np.full(4, 0.5), a) for a in (0, 1, 4, 0)]
    ranks = np.array([1, 0, 0, 3])  # the first round's runner-up of rank 1 wins; the last's rank 3 is unverified
    tree = FixedGovernor(DEPTHS, 4)
    tree.tree_width = 3
    rate, taken = replay.simulate(tree, rounds, costs, DEPTHS, ranks=ranks)
    assert taken == {"4/4/2": 4}
    assert rate == pytest.approx((2 + 2 + 5 + 1) / (4 * (0.003 + 0.028)))
    # DSpark on the replays' table: an unsure first draft takes runners-up, rows past depth 4
    g = bench.dspark_from_table(costs, DEPTHS, learn=False)
    g.tree_width = 3
    d = g.choose(GovernorState(confidences=np.array([0.3, 0.9, 0.9, 0.9])))
    assert d == 4 and g.round_siblings() == 2 and g.verify_cost(6) == pytest.approx(0.028)


@pytest.mark.parametrize("table", ["usual", "decode_dear", "deep_cheap"])
def test_the_post_draft_oracle_is_the_best_rate_any_per_round_choice_gets(table):
    """bench_governors.oracle_choices against every choice of depths for 7 rounds (4^7),
    priced by bench_governors.price: none beats it. On the usual table it is the smallest
    depth >= a_r (decode for a_r = 0); where a verify costs less than a decode (the small
    test engines' table on a CI host once), or a deeper profile less than a shallower one,
    the old rule lost to a fixed depth while this one cannot."""
    import itertools

    from tests.real_model import tool

    bench = tool("bench_governors")
    costs = {"decode": 0.020, "draft": 0.003, "draft_by_depth": {"2": 0.002, "4": 0.003},
             "verify": {"1": 0.021, "2": 0.022, "4": 0.025}}
    if table == "decode_dear":
        costs["decode"] = 0.040
    elif table == "deep_cheap":
        costs["verify"]["4"] = 0.020
    accepted = [0, 2, 1, 4, 0, 3, 2]
    for drafted_zero in (True, False):
        best = max(bench.price(list(ch), accepted, costs, DEPTHS, drafted_zero=drafted_zero)
                   for ch in itertools.product((0, *DEPTHS), repeat=len(accepted)))
        oracle = bench.oracle_choices(accepted, costs, DEPTHS, drafted_zero=drafted_zero)
        assert bench.price(oracle, accepted, costs, DEPTHS, drafted_zero=drafted_zero) == pytest.approx(best, rel=1e-12)
    oracle = bench.oracle_choices(accepted, costs, DEPTHS)
    if table == "usual":
        assert oracle == [0, 2, 1, 4, 0, 4, 2]
    elif table == "decode_dear":
        assert 0 not in oracle
    else:
        assert oracle == [0, 4, 1, 4, 0, 4, 4]


def test_draft_block_running_rates_variant_follows_the_rounds_it_saw():
    """exp_draft_block's running-rates rule: after rounds whose drafts are sure for two
    positions and hopeless beyond, it drafts a block of 2; after rounds sure all the way,
    the full block (the ceilings, decaying 5% a round, still draft deeper after 20 of the first kind)."""
    from specrt.runtime.governor import GovernorState
    from tests.real_model import tool

    tool("exp_tree_width")
    exp = tool("exp_draft_block")
    dspark_from_table = exp.dspark_from_table  # tools/bench_governors.py's

    costs = {"decode": 0.020, "draft": 0.004, "draft_by_depth": {"1": 0.0025, "2": 0.003, "3": 0.0035, "4": 0.004},
             "verify": {"1": 0.021, "2": 0.022, "3": 0.023, "4": 0.024}}
    depths = [1, 2, 3, 4]

    def after(conf):
        g = dspark_from_table(costs, depths)
        ceilings = dspark_from_table(costs, depths)
        g.__class__ = exp.running_rates_class()
        for _ in range(20):
            for gov in (g, ceilings):
                gov.choose(GovernorState(confidences=np.asarray(conf)))
        return g.draft_depth(), ceilings.draft_depth()

    rr, ceil = after([0.99, 0.99, 0.01, 0.01])
    assert rr == 2 and ceil > 2
    assert after([0.99, 0.99, 0.99, 0.99])[0] == 4


def test_dspark_ab_refuses_options_dspark_does_not_take(small_vocab_engines, capsys):
    """tools/exp_dspark_ab.py builds variant B through DSparkGovernor's constructor: an
    option it does not take, or a value that is not a number, is an error naming it."""
    from tests.real_model import tool

    tool("exp_draft_load_ab")  # exp_dspark_ab imports it
    exp = tool("exp_dspark_ab")
    assert exp.parse_options("ceiling_decay=0.02,full_every=16") == {"ceiling_decay": 0.02, "full_every": 16}
    assert exp.main([str(small_vocab_engines), "--options", "ceiling=0.1"]) == 1
    assert "DSpark option(s) ['ceiling']" in capsys.readouterr().err
    assert exp.main([str(small_vocab_engines), "--options", "full_every=x"]) == 1
    assert "expected k=v,... with numbers" in capsys.readouterr().err


def test_ab_tools_take_the_kinds_in_turns():
    """exp_draft_load_ab.pick_prompts (and exp_dspark_ab, which shares it): per_kind
    held-out prompts of each kind, kinds alternating, each kind's in file order."""
    from tests.real_model import tool

    exp = tool("exp_draft_load_ab")
    held = [json.loads(x) for x in (Path(exp.__file__).parent / "data" / "heldout_prompts.jsonl").read_text().splitlines()
            if x]
    kinds = list(dict.fromkeys(d["kind"] for d in held))
    got = exp.pick_prompts(2)
    assert [d["kind"] for d in got] == kinds * 2
    for k in kinds:
        assert [d for d in got if d["kind"] == k] == [d for d in held if d["kind"] == k][:2]


@pytest.mark.parametrize("prior", [float("nan"), float("inf")])
def test_a_calibration_prior_that_is_not_a_number_is_refused(prior):
    """A NaN prior passed `prior <= 0`, made every calibrated value NaN and turned speculation
    off without a word (tau 1.00)."""
    from specrt.runtime.governor import Calibration

    d = Calibration().to_dict()
    d["prior"] = prior
    with pytest.raises(UserError, match="prior="):
        Calibration.from_dict(d)


def test_a_report_may_not_replace_a_file_of_the_engines(engines, tmp_path):
    """`calibrate --report ENG/engines.json` and `run --stats ENG/engines.json` replaced the
    manifest and broke the engines; refused before anything runs."""
    from specrt.cli import main

    pf = tmp_path / "p.jsonl"
    pf.write_text('{"prompt_ids": [1, 2, 3]}\n')
    before = (engines / "engines.json").read_bytes()
    r = CliRunner().invoke(cli(), ["calibrate", str(engines), "--prompts", str(pf), "--report",
                                   str(engines / "engines.json")])
    assert r.exit_code == 1 and "a file of the engines folder" in r.output, r.output
    r = CliRunner().invoke(main, ["run", str(engines), "--prompt", "hello", "--stats", str(engines / "engines.json")])
    assert r.exit_code == 1 and "--stats" in r.output and "a file of the engines folder" in r.output, r.output
    assert (engines / "engines.json").read_bytes() == before and not (engines / CALIBRATION_FILE).exists()


def test_a_coupled_calibration_stored_before_its_own_mode_is_read_as_coupled(tmp_path):
    """Before coupled sampling was a mode of its own, `specrt calibrate --reproducible` stored
    its fit under the rejection sampler's key (the entry's sampling saying coupled): it is the
    coupled mode's calibration, not the rejection sampler's, and the hint names --reproducible."""
    import types

    from specrt.runtime.governor import Calibration
    from specrt.runtime.session import load_calibration

    cp, rs = SamplingParams(temperature=0.7, top_p=0.9, coupled=True), SamplingParams(temperature=0.7, top_p=0.9)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({
        "format": "specrt.calibration-file/2", "export_digest": "D",
        "modes": {rs.mode: {"sampling": cp.as_dict(), "rounds": 3000,
                            "calibration": Calibration(positions=4).to_dict()}}}))
    eng = types.SimpleNamespace(folder=tmp_path, manifest={"export": {"digest": "D"}})
    assert load_calibration(eng, cp, "dspark")[1].endswith(f"(3000 rounds, {cp.mode})")
    note = load_calibration(eng, rs, "dspark")[1]
    assert "holds no calibration for" in note and "--reproducible" not in note
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({
        "format": "specrt.calibration-file/2", "export_digest": "D",
        "modes": {"greedy": {"sampling": None, "rounds": 5, "calibration": Calibration(positions=4).to_dict()}}}))
    assert "--reproducible" in load_calibration(eng, cp, "dspark")[1]


def test_the_prior_of_a_coupled_run_is_a_coupled_calibration_at_the_same_distance(tmp_path):
    import types

    from specrt.runtime.session import load_calibration

    rs, cp = SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, coupled=True)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({
        "format": "specrt.calibration-file/2", "export_digest": "D",
        "modes": {m.mode: {"sampling": m.as_dict(), "rounds": 10, "calibration": Calibration(positions=4).to_dict()}
                  for m in (rs, cp)}}))
    eng = types.SimpleNamespace(folder=tmp_path, manifest={"export": {"digest": "D"}})
    assert f"the {cp.mode} one serves" in load_calibration(eng, SamplingParams(temperature=0.8, coupled=True))[1]
    assert f"the {rs.mode} one serves" in load_calibration(eng, SamplingParams(temperature=0.8))[1]


def test_a_folder_rebuilt_while_calibrating_gets_no_calibration(small_vocab_engines, tmp_path, monkeypatch):
    """A calibration fitted on engines that `build --force` replaced meanwhile was written into
    the new folder, credited to engines it never ran (session 55's interruption walk): refused,
    naming the folder; nothing written there."""
    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    fit = C.evaluate

    def rebuilt_then_evaluate(*args, **kwargs):  # (after the decoding: the folder swapped by a rebuild)
        if not (tmp_path / "old").exists():
            eng.rename(tmp_path / "old")
            shutil.copytree(tmp_path / "old", eng)
            (eng / CALIBRATION_FILE).unlink(missing_ok=True)
        return fit(*args, **kwargs)

    monkeypatch.setattr(C, "evaluate", rebuilt_then_evaluate)
    with pytest.raises(UserError, match=f"{eng}: replaced while this ran .*{CALIBRATION_FILE} not written"):
        calibrate(eng, prompts(16, 4, seed=2), max_new_tokens=20, holdout=0.0)
    assert not (eng / CALIBRATION_FILE).exists()


def test_a_calibrate_finishing_meanwhile_keeps_its_mode(small_vocab_engines, tmp_path, monkeypatch):
    """Two calibrates of different modes on one engines folder: each read calibration.json,
    fitted, then wrote what it had read beside its own mode, so the one finishing second
    dropped the first's (read, then write). The file is read again under a lock on the
    folder when written."""
    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 6, seed=1), max_new_tokens=8, holdout=0.25)  # greedy
    hot = SamplingParams(0.9, 0, 1.0, seed=1)
    real_note = C.worse_fit_note

    def another_calibrate_finishes(*a, **k):  # after this run read the file, before it writes
        monkeypatch.setattr(C, "worse_fit_note", real_note)
        calibrate(eng, prompts(4, 6, seed=3), max_new_tokens=8, holdout=0.25, sampling=hot)
        return real_note(*a, **k)

    monkeypatch.setattr(C, "worse_fit_note", another_calibrate_finishes)
    said: list[str] = []
    calibrate(eng, prompts(4, 6, seed=2), max_new_tokens=8, holdout=0.25, sampling=SamplingParams(0.5, 0, 1.0, seed=1),
              log=said.append)
    modes = json.loads((eng / CALIBRATION_FILE).read_text())["modes"]
    assert sorted(modes) == sorted(["greedy", hot.mode, SamplingParams(0.5, 0, 1.0).mode]), sorted(modes)
    assert any(f"kept {', '.join(sorted(['greedy', hot.mode]))}" in x for x in said), said


def test_calibrate_writes_under_the_folders_lock(small_vocab_engines, tmp_path, monkeypatch):
    """The read-again-and-write of calibration.json waits for another holder of the engines
    folder's lock (another calibrate writing), and writes once it is released."""
    import fcntl
    import os
    import threading

    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    fitted, real_note = threading.Event(), C.worse_fit_note

    def noted(*a, **k):  # past the fit, just before the write
        fitted.set()
        return real_note(*a, **k)

    monkeypatch.setattr(C, "worse_fit_note", noted)
    fd = os.open(eng, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held as another calibrate would while it writes
    errors: list[BaseException] = []

    def run():
        try:
            calibrate(eng, prompts(4, 6, seed=1), max_new_tokens=8, holdout=0.25)
        except BaseException as e:  # (reported below)
            errors.append(e)

    t = threading.Thread(target=run)
    try:
        t.start()
        assert fitted.wait(120)
        t.join(1.0)
        assert t.is_alive() and not (eng / CALIBRATION_FILE).exists()  # waiting on the lock
    finally:
        os.close(fd)  # released
    t.join(120)
    assert not t.is_alive() and not errors and (eng / CALIBRATION_FILE).is_file(), errors


# mutant k02 (calibrate.py RecordingGovernor.observe): runner-up tries counted on every round
def test_runner_up_tries_are_the_rounds_whose_first_draft_was_rejected(small_vocab_engines, tmp_path):
    """A runner-up is tried only where the chain's first draft was rejected: rank 2's tries
    are the training rounds that accepted nothing (a runner-up's win counts so too)."""
    from specrt.runtime.calibrate import calibrate

    eng = copy(small_vocab_engines, tmp_path / "engines")
    rep = calibrate(eng, prompts(16, 6, seed=2), max_new_tokens=40, holdout=0.0, write=False)
    rounds = rep["rounds"]["train"]
    rejected_first = round(rounds * (1.0 - rep["acceptance_by_position"][0]))
    assert 0 < rejected_first < rounds
    assert rep["runner_ups"]["tries"] == [float(rejected_first)] * 3


# mutant k09 (calibrate.py calibrate): Calibration.fit called without groups (folds split a prompt)
def test_calibrate_folds_keep_each_prompts_rounds_together(small_vocab_engines, tmp_path, monkeypatch):
    """The kind is chosen by 2-fold ECE with each training prompt's samples in one fold:
    calibrate passes the prompt of every sample as its group."""
    from specrt.runtime.calibrate import calibrate
    from specrt.runtime.governor import Calibration

    real = Calibration.fit.__func__
    seen: dict = {}

    def fit(cls, confidence, position, accepted, **kw):  # the real fit, its groups kept
        seen["groups"], seen["position"] = kw.get("groups"), np.asarray(position)
        return real(cls, confidence, position, accepted, **kw)

    monkeypatch.setattr(Calibration, "fit", classmethod(fit))
    eng = copy(small_vocab_engines, tmp_path / "engines")
    rep = calibrate(eng, prompts(16, 6, seed=2), max_new_tokens=24, holdout=0.0, write=False)
    groups = seen["groups"]
    assert groups is not None and len(groups) == rep["samples"]["train"] == len(seen["position"])
    assert (np.diff(groups) >= 0).all() and len(np.unique(groups)) > 1  # one run of samples a prompt


# mutant k14 (calibrate.py calibrate): the worse-fit note judged on conditional ECE, not survival
def test_the_worse_fit_note_follows_the_survival_ece(small_vocab_engines, tmp_path):
    """The note is said where the fit's survival ECE is worse than the raw confidences', and
    only there: here the conditional ECE got worse while the survival ECE improved."""
    from specrt.runtime.calibrate import calibrate

    said: list[str] = []
    rep = calibrate(copy(small_vocab_engines, tmp_path / "e"), prompts(16, 2, seed=20), max_new_tokens=10,
                    holdout=0.5, write=False, log=said.append)
    s, c = rep["ece"]["survival"], rep["ece"]["conditional"]
    assert c["after_all"] > c["before_all"] and s["after_all"] < s["before_all"]  # (the case tells them apart)
    assert not any(x.startswith("note:") for x in said), said


# mutation round 5, C16 / C17 (calibrate.py _folder_lock): a shared lock, or none
def test_the_folder_lock_is_exclusive(tmp_path):
    """While calibrate holds the engines folder's lock no other holder, shared or exclusive,
    gets it (tried without blocking: no timing), and it is free again after."""
    import fcntl
    import os

    from specrt.runtime.calibrate import _folder_lock

    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with _folder_lock(tmp_path):
            for kind in (fcntl.LOCK_SH, fcntl.LOCK_EX):
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, kind | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on leaving
    finally:
        os.close(fd)


# mutation round 5, C19 (calibrate.py calibrate): a calibration.json removed meanwhile written back
def test_a_calibration_file_removed_meanwhile_is_not_written_back(small_vocab_engines, tmp_path, monkeypatch):
    """calibration.json removed after this calibrate read it (the user clearing the engines'
    calibrations) and before it writes: only its own mode is written, nothing it had read."""
    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 6, seed=1), max_new_tokens=8, holdout=0.25)  # greedy
    real_note = C.worse_fit_note

    def removed(*a, **k):  # after this run read the file, before it writes
        (eng / CALIBRATION_FILE).unlink()
        return real_note(*a, **k)

    monkeypatch.setattr(C, "worse_fit_note", removed)
    said: list[str] = []
    hot = SamplingParams(0.9, 0, 1.0, seed=1)
    calibrate(eng, prompts(4, 6, seed=3), max_new_tokens=8, holdout=0.25, sampling=hot, log=said.append)
    assert list(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]) == [hot.mode]
    assert not any("kept" in x for x in said), said



# mutant M67 c86 (calibrate.py calibrate): a calibration.json broken since the first read written back as read then
def test_a_calibration_file_broken_meanwhile_is_replaced_not_restored(small_vocab_engines, tmp_path, monkeypatch):
    """calibration.json broken (not JSON) after this calibrate read it and before it writes:
    replaced by this mode's calibration alone, not by what the first read had seen."""
    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 6, seed=1), max_new_tokens=8, holdout=0.25)  # greedy
    real_note = C.worse_fit_note

    def broken(*a, **k):  # after this run read the file, before it writes
        (eng / CALIBRATION_FILE).write_text("{not json")
        return real_note(*a, **k)

    monkeypatch.setattr(C, "worse_fit_note", broken)
    hot = SamplingParams(0.9, 0, 1.0, seed=1)
    calibrate(eng, prompts(4, 6, seed=3), max_new_tokens=8, holdout=0.25, sampling=hot)
    assert list(json.loads((eng / CALIBRATION_FILE).read_text())["modes"]) == [hot.mode]

# mutation round 5, C22 (calibrate.py worse_fit_note): a fit exactly as good said to be worse
def test_no_worse_fit_note_for_a_fit_as_good_as_the_raw_confidences():
    from specrt.runtime.calibrate import worse_fit_note

    assert worse_fit_note({"before_all": 0.125, "after_all": 0.125}, "holdout", 9) is None
    assert "(0.126) is worse than" in worse_fit_note({"before_all": 0.125, "after_all": 0.126}, "holdout", 9)
    # worse, but not as said to 3 places: no "(0.000) is worse than ... (0.000)" (mutant m71c-09)
    assert worse_fit_note({"before_all": 0.0001, "after_all": 0.0004}, "holdout", 9) is None


# mutation round 5, C29 (calibrate.py _folder_lock): a folder that cannot be opened
def test_a_folder_that_cannot_be_locked_is_written_without_a_lock(tmp_path):
    from specrt.runtime.calibrate import _folder_lock

    with _folder_lock(tmp_path / "absent"):  # (os.open fails: no lock, no error of its own)
        pass


# mutation round 5, C32 (calibrate.py calibrate): engines without a draft decoded before a word
def test_calibrate_refuses_engines_without_a_draft(tmp_path):
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    export(t, None, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1,), tmp_path / "eng", log=quiet, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    with pytest.raises(UserError, match="the engines have no draft; there is nothing to calibrate"):
        calibrate(tmp_path / "eng", prompts(16, 2), max_new_tokens=8, holdout=0.0)
    assert not (tmp_path / "eng" / CALIBRATION_FILE).exists()



# M67 bug (calibrate.py calibrate): a calibration.json that cannot be read again under the lock was replaced
def test_a_calibration_file_unreadable_when_read_again_is_not_replaced(small_vocab_engines, tmp_path, monkeypatch):
    """calibration.json read when calibrate started, then unreadable when read again under the
    folder's lock to write it (mode 000, or a disk's EIO): it was taken for a broken one and
    replaced without a word, its other modes lost. An error naming it through the CLI (exit 1);
    nothing written."""
    import os
    import pathlib

    import specrt.runtime.calibrate as C

    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(4, 6, seed=1), max_new_tokens=8, holdout=0.25)  # greedy
    p, real_note, real_read = eng / CALIBRATION_FILE, C.worse_fit_note, pathlib.Path.read_text
    before = p.read_bytes()

    def denied(self, *a, **k):  # what a read of a mode-000 file gets where the tests run as root
        if self == p:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *a, **k)

    def unreadable(*a, **k):  # after this run read the file, before it writes
        p.chmod(0)
        if os.geteuid() == 0:  # (root reads any file whatever its mode)
            monkeypatch.setattr(pathlib.Path, "read_text", denied)
        return real_note(*a, **k)

    monkeypatch.setattr(C, "worse_fit_note", unreadable)
    pf = tmp_path / "p.jsonl"
    pf.write_text("".join(json.dumps({"prompt_ids": x}) + "\n" for x in prompts(4, 6, seed=3)))
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "8",
                                   "--temperature", "0.9"])
    assert r.exit_code == 1 and f"error: {p}: cannot read (Permission denied) when read again" in r.output, r.output
    p.chmod(0o644)
    assert p.read_bytes() == before and "wrote" not in r.output
    # unreadable from the start: said so when first read, and replaced, as a broken file is
    monkeypatch.setattr(C, "worse_fit_note", real_note)
    p.chmod(0)
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "8"])
    assert r.exit_code == 0 and f"{CALIBRATION_FILE} is not usable ({p}: cannot read (Permission denied)); it will " \
        "be replaced" in r.output and f"wrote {p}" in r.output, r.output
    assert list(json.loads(p.read_bytes())["modes"]) == ["greedy"]


# mutants c45, c47, c49, c50 (calibrate.py calibrate): a check of the arguments dropped or loosened
def test_calibrate_refuses_arguments_it_cannot_use_before_any_work(tmp_path):
    """No prompts, an empty held-out set, or labels that are not one per prompt: each refused
    in its own words before the engines are opened (here there are none)."""
    eng = tmp_path / "absent"
    for ps, kw, message in [([], {}, "^no prompts to calibrate on$"),
                            ([[1, 2, 3]], {"holdout_prompts": []}, "^the held-out prompt set is empty$"),
                            ([[1, 2, 3]] * 2, {"labels": ["a", "b", "c"]}, "^labels: 3 given for 2 prompts$"),
                            ([[1, 2, 3]] * 2, {"labels": []}, "^labels: 0 given for 2 prompts$")]:
        with pytest.raises(UserError, match=message):
            calibrate(eng, ps, **kw)
    assert not any(tmp_path.iterdir())


# mutants c97-c106 (calibrate.py format_report): columns swapped, a row or a line dropped, None as a number
def test_the_report_table_puts_each_number_in_its_column():
    c = {"n": [7, 3], "observed": [0.5, None], "before": [0.1, 0.2], "after": [0.05, None], "auc_before": [0.6, None],
         "before_all": 0.12, "after_all": 0.07}
    s = {"n": [7, 7], "observed": [0.4, 0.1], "before": [0.3, 0.25], "after": [0.2, 0.15], "auc_after": [0.7, 0.55],
         "before_all": 0.3, "after_all": 0.2}
    r = {"kind": "histogram", "mode": "greedy", "prompts": {"train": 3, "holdout": 1},
         "rounds": {"train": 20, "holdout": 7}, "evaluated_on": "holdout", "depth": 2, "tau": 1.5,
         "ece": {"conditional": c, "survival": s}, "cv_ece": {"histogram": 0.05, "isotonic": 0.06},
         "temperatures": None, "other_mode": None,
         "runner_ups": {"ranks": [2, 3], "rates": [0.25, None], "tries": [8.0, 0.0], "wins": [2.0, 0.0]}}
    lines = format_report(r).splitlines()
    assert lines[0].startswith("calibration by histogram binning for greedy decoding, fitted on 3 prompts / 20 rounds; "
                               "evaluated on the held-out prompts (1 prompt, 7 rounds); depth 2, chain tau 1.50 over all "
                               "4 prompts"), lines[0]
    assert [x.replace("|", " ").split() for x in lines[2:5]] == [
        ["1", "7", "0.500", "0.100", "0.050", "0.600", "7", "0.400", "0.300", "0.200", "0.700"],
        ["2", "3", "-", "0.200", "-", "-", "7", "0.100", "0.250", "0.150", "0.550"],
        ["all", "0.120", "0.070", "0.300", "0.200"]], lines
    assert lines[5] == "  kind chosen by 2-fold held-out ECE: histogram 0.0500, isotonic 0.0600"
    # (a walk, h73a: "calibration (temperature, temperature=0.8,...)", the kind read as the sampling temperature;
    # "1 prompts"; "evaluated on train" said nothing of the fit's own rounds measuring it)
    one = {**r, "kind": "temperature", "mode": "temperature=0.8,top_k=0,top_p=1", "prompts": {"train": 1, "holdout": 0},
           "rounds": {"train": 1, "holdout": 0}, "evaluated_on": "train"}
    assert format_report(one).startswith(
        "calibration by temperature scaling for temperature=0.8,top_k=0,top_p=1 decoding, fitted on 1 prompt / 1 round; "
        "evaluated on the training prompts, in-sample (1 prompt, 1 round); depth 2, chain tau 1.50 over 1 prompt ("), \
        format_report(one)
    assert lines[6] == ("  token trees: when the first draft is rejected, the runner-up of rank 2 wins 0.250 "
                        "(8 rounds), 3 wins - (0 rounds)")
    assert len(lines) == 8


# mutants c57, c59, c64, c69, c73, c75, c82, c83 (calibrate.py calibrate): numbers taken from the wrong rounds
def test_the_held_out_numbers_are_the_held_out_rounds_and_the_fit_the_training_ones(small_vocab_engines, tmp_path):
    """With a separate held-out set X the report's numbers before the fit, and the stored other
    mode's as a prior, are X's rounds' (a calibrate of X alone, measured on its training
    rounds, gives the same); tau, acceptance and new tokens are every prompt's (the same
    whatever is held out); the fit and its stored entry are the training prompts'."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    calibrate(eng, prompts(16, 4, seed=7), max_new_tokens=16, holdout=0.0, sampling=SamplingParams(0.9, seed=1))
    P, X = prompts(16, 4, seed=2), prompts(16, 3, seed=5)
    a = calibrate(eng, P, max_new_tokens=16, holdout_prompts=X)
    b = calibrate(eng, X, max_new_tokens=16, holdout=0.0, write=False)
    assert a["other_mode"]["mode"] == b["other_mode"]["mode"] == SamplingParams(0.9).mode  # (not greedy's own)
    for w in ("conditional", "survival"):
        assert (a["ece"][w]["before"], a["ece"][w]["n"]) == (b["ece"][w]["before"], b["ece"][w]["n"])
        assert a["other_mode"][w] == b["other_mode"][w]
    c = calibrate(eng, P + X, max_new_tokens=16, holdout=0.0, write=False)
    assert (a["tau"], a["acceptance_by_position"]) == (c["tau"], c["acceptance_by_position"])
    assert a["new_tokens"] == c["new_tokens"] == 16 * 7
    entry = json.loads((eng / CALIBRATION_FILE).read_text())["modes"]["greedy"]
    assert entry["prompts"] == 4 and entry["rounds"] == a["rounds"]["train"] and entry["sampling"] is None
    assert entry["heldout_ece"] == {w: {"before_all": a["ece"][w]["before_all"], "after_all": a["ece"][w]["after_all"]}
                                    for w in ("conditional", "survival")}
    assert Calibration.from_dict(entry["calibration"]).n[0].sum() == a["rounds"]["train"]  # every round reached 1


# mutants m10, m11, m15 (cmd_calibrate.py): --reproducible or --top-p not passed on; the log on stdout
def test_cli_json_is_stdout_alone_and_the_mode_asked_for(small_vocab_engines, tmp_path):
    """`--json > FILE` is the report alone (the progress lines go to stderr), for the mode of
    every sampling option given."""
    eng = copy(small_vocab_engines, tmp_path / "engines")
    pf = tmp_path / "p.jsonl"
    pf.write_text("\n".join(json.dumps({"prompt_ids": p}) for p in prompts(16, 2)) + "\n")
    r = CliRunner().invoke(cli(), ["calibrate", str(eng), "--prompts", str(pf), "--max-new-tokens", "8", "--holdout",
                                   "0", "--temperature", "0.8", "--top-p", "0.9", "--reproducible", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["mode"] == SamplingParams(temperature=0.8, top_p=0.9, coupled=True).mode and rep["mode"].endswith(
        ",coupled") and "top_p=0.9" in rep["mode"], rep["mode"]
    assert "prompt 1/2" in r.stderr and f"wrote {eng / CALIBRATION_FILE}" in r.stderr, r.stderr


# M67 bug (calibrate.py _encode): token ids taken by int(), a stream refusing them
def test_calibrate_refuses_token_ids_that_are_not_integers(engines):
    """A prompt's ids are checked as a stream checks them: int() took 1.7 as 1, "12" as 12 and
    True as 1, and calibrate decoded the ids it made up without a word."""
    for bad, said in (([1.7, 2, 3], "1.7 (at 0)"), ([1, "12", 3], "'12' (at 1)"), ([1, True, 3], "True (at 1)"),
                      (["a", "b"], "'a' (at 0)")):
        with pytest.raises(UserError, match=rf"^prompt 2: prompt token id {re.escape(said)}: expected an integer; "
                                            "no prompt was decoded$"):
            calibrate(engines, [[1, 2, 3], bad], holdout=0.0, write=False)



# mutant M67 c62 (calibrate.py calibrate): runner-up counts made up for engines that verify no token trees
def test_engines_without_token_trees_get_no_runner_up_counts(small_vocab_engines, tmp_path):
    from specrt.engines import build_engines

    eng = tmp_path / "eng"
    build_engines(small_vocab_engines.parent / "export", "onnxruntime", (1, 2), eng, log=quiet, profile_repeats=1,
                  profile_pasts=(16,), max_context=64, ort_kv="append")  # (append KV: no token trees)
    rep = calibrate(eng, prompts(16, 3, seed=2), max_new_tokens=12, holdout=0.0)
    assert rep["runner_ups"] is None and "token trees" not in format_report(rep)
    assert "runner_ups" not in json.loads((eng / CALIBRATION_FILE).read_text())["modes"]["greedy"]["calibration"]



# mutants M67 c70, c71 (calibrate.py calibrate): the report's per-position numbers after the fit taken from before it
def test_the_report_gives_the_fits_own_numbers_by_position(small_vocab_engines, tmp_path, monkeypatch):
    """Per position, the report's ECE, AUC and mean prediction after the fit are the fitted map's
    on the held-out rounds (evaluate's, kept as it runs), not the raw confidences'."""
    import specrt.runtime.calibrate as C

    seen, real = [], C.evaluate

    def kept(rounds, cmap, depth):
        seen.append((cmap, real(rounds, cmap, depth)))
        return seen[-1][1]

    monkeypatch.setattr(C, "evaluate", kept)
    rep = calibrate(copy(small_vocab_engines, tmp_path / "e"), prompts(16, 6, seed=2), max_new_tokens=24, holdout=0.5,
                    write=False)
    assert rep["file"] is None and not (tmp_path / "e" / CALIBRATION_FILE).exists()  # (write=False; mutant M67 c79)
    [fit] = [e for cmap, e in seen if isinstance(cmap, Calibration)]
    for w in ("conditional", "survival"):
        e = rep["ece"][w]
        assert (e["after"], e["auc_after"], e["predicted_after"]) == (fit[w]["ece"], fit[w]["auc"], fit[w]["predicted"])
        assert e["after"] != e["before"]


def test_the_draft_weights_note_needs_both_precisions_named_and_different():
    """weights_note says a calibration's draft precision differs only where the file names one
    (a string: files from before 2026-12-07 name none, hand edits a number) and the engines
    theirs (None: not said): mutants m73y-14 (a fitted precision of 5 said as "the 5 draft")
    and m73y-15 (engines naming none said as "these run the None one")."""
    from specrt.runtime.session import weights_note

    assert weights_note("fp", "fp") == weights_note(None, "int8") == weights_note(5, "int8") == ""
    assert weights_note("fp", None) == weights_note(True, "fp") == ""
    assert weights_note("fp", "int8").startswith("; fitted on engines of the fp draft, these run the int8 one")


def test_a_calibration_of_zero_rounds_is_read(tmp_path):
    """'rounds' must be a whole number >= 0: 0 (a mode stored with no rounds of its own) is
    one, taken as written; -1 is not (mutant m73y-17 refused 0)."""
    from specrt.runtime.session import read_calibration_file

    entry = {"calibration": Calibration(positions=2).to_dict(), "depth": 2, "rounds": 0}
    p = tmp_path / CALIBRATION_FILE
    p.write_text(json.dumps({"format": "specrt.calibration-file/2", "modes": {"greedy": entry}}))
    assert read_calibration_file(p)["greedy"]["rounds"] == 0
    entry["rounds"] = -1
    p.write_text(json.dumps({"format": "specrt.calibration-file/2", "modes": {"greedy": entry}}))
    with pytest.raises(UserError, match="'rounds' -1: expected a whole number >= 0$"):
        read_calibration_file(p)
