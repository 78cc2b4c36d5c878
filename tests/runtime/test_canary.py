"""The acceptance canary: measured depth-1 acceptance against the training receipt."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specrt.engines import build_engines
from specrt.engines.engine_set import load_engines
from specrt.errors import UserError
from specrt.export.export import export
from specrt.runtime.canary import run_canary
from specrt.runtime.session import Session
from tests.fixtures_models import write_tiny_draft, write_tiny_target

ROOT = Path(__file__).resolve().parents[2]


def _engines(root: Path, receipt: dict | None, max_context: int = 128, **target) -> Path:
    t = write_tiny_target(root / "t", "llama", vocab_size=16, **target)
    d = write_tiny_draft(root / "d", t, kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15)
    if receipt is not None:
        (d / "training_receipt.json").write_text(json.dumps(receipt))
    export(t, d, root / "exp")
    build_engines(root / "exp", "onnxruntime", (1, 2), root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=max_context)
    return root / "eng"


@pytest.mark.parametrize("receipt", [None, {"heldout": {"acceptance_at_pos": [0.9, 0.8]}}])
def test_a_context_too_small_to_draft_in_is_inconclusive(tmp_path, receipt):
    """A context too small for the canary's prompts (12 tokens here) to draft in gave
    "0.00 over 0 drafts", trusted without a receipt and UNTRUSTED beside one (a false alarm
    of a mis-bound weight), or failed the build with the context error of a prompt the user
    never wrote (a user walk): the verdict is inconclusive, said by build and by run."""
    from click.testing import CliRunner

    from specrt.cli import main

    eng = _engines(tmp_path / "x", receipt, max_context=13)
    r = _measure(eng)
    assert r["inconclusive"] is True and r["trusted"] is True and r["drafts"] == 0, r
    assert r["note"].startswith("inconclusive: 0 drafts (at least 10 decide), the engines' context of 13 tokens")
    r = CliRunner().invoke(main, ["canary", str(eng)])
    assert r.exit_code == 0 and "acceptance canary: inconclusive: 0 drafts" in r.output, r.output
    assert "UNTRUSTED" not in r.output and "0.00" not in r.output
    with Session(eng, governor="fixed:1") as s:
        assert s.untrusted is None and "was inconclusive (0 drafts" in s.unchecked
    r = CliRunner().invoke(main, ["build", str(tmp_path / "x" / "exp"), "-o", str(tmp_path / "e2"), "--depths", "1",
                                  "--max-context", "13"])
    assert r.exit_code == 0 and "acceptance canary: inconclusive" in r.output, r.output


def test_answers_ending_at_once_are_inconclusive_without_blaming_the_context(tmp_path):
    """Every token an EOS: each answer ends at its first token, no draft runs, in ample
    context; the note said the context was too small (a review)."""
    r = _measure(_engines(tmp_path / "x", None, eos_token_id=list(range(16))))
    assert r["inconclusive"] and r["drafts"] == 0
    assert r["note"].startswith("inconclusive: 0 drafts (at least 10 decide), the target's answers ending (EOS)"), r


def test_the_canarys_verdict_at_the_edges_of_its_rules(tmp_path):
    """Three rules no test pinned (a mutation round, session 54): a few drafts (1-9) are
    inconclusive too, not only none; a prompt with no room for a round is left out (a context
    of 12 for the 12-token prompts: the context error of a prompt the user never wrote, else);
    answers cut at the context make the note blame the context, not EOS."""
    from specrt.runtime.canary import PROMPTS

    receipt = {"heldout": {"acceptance_at_pos": [0.9, 0.8]}}
    eng = _engines(tmp_path / "a", receipt)
    with load_engines(eng) as e:
        r = run_canary(e, max_new_tokens=4, prompts=PROMPTS[:1])
    assert 0 < r["drafts"] < 10 and r["inconclusive"] is True and r["trusted"] is True, r
    with load_engines(_engines(tmp_path / "b", receipt, max_context=12)) as e:
        r = run_canary(e, max_new_tokens=24)
    assert r["inconclusive"] and r["drafts"] == 0 and "the engines' context of 12 tokens" in r["note"], r
    with load_engines(_engines(tmp_path / "c", receipt, max_context=14)) as e:
        r = run_canary(e, max_new_tokens=24, prompts=PROMPTS[:3])
    assert r["inconclusive"] and "the engines' context of 14 tokens" in r["note"], r


def _measure(eng: Path) -> dict:
    with load_engines(eng) as e:
        return run_canary(e, max_new_tokens=24)


def test_trusted_when_acceptance_matches(tmp_path):
    """Trusted while the measured acceptance is at least half the receipt's, untrusted below:
    the same draft built again with receipts on either side of what it measures (the same
    seeded decode each time)."""
    low = _engines(tmp_path / "m", {"training_last_window": {"depth_1": {"accuracy": 0.0}}})
    m = _measure(low)["measured_depth1"]
    assert 0 < m < 1
    # (m / 0.5: measured exactly half the receipt's, which is still trusted: "at least")
    for name, expected, trusted in (("b", m / 0.4, False), ("h", m / 0.5, True), ("a", m / 0.6, True)):
        eng = _engines(tmp_path / name, {"training_last_window": {"depth_1": {"accuracy": expected}}})
        r = _measure(eng)
        assert (r["measured_depth1"], r["training_depth1"], r["trusted"]) == (m, expected, trusted)
    assert r["drafts"] > 50 and r["training_source"] == "training_last_window.depth_1.accuracy"
    assert json.loads((eng / "acceptance_receipt.json").read_text())["binding_receipt_id"] == r["binding_receipt_id"]
    # (mutants C12-C14, session 65) tied to exactly these weights: the draft's slots' hashes and the target
    # tensors it relies on, as the binding receipt names them; and the answers' length it measured over
    with load_engines(eng) as e:
        rec = e.export["binding_receipt"]["draft"]
    assert r["draft_slot_hashes"] == {s: v["sha256"] for s, v in rec["slots"].items()} != {}
    assert r["draft_relies_on_target"] == rec["relies_on_target"] != [] and r["max_new_tokens"] == 24
    with Session(eng, governor="fixed:1") as s:
        assert s.untrusted is None
    # `specrt canary` says a trusted verdict in one line, with the receipt it compared with
    # (a receipt of 0.0: trusted whatever its default prompts measure)
    from click.testing import CliRunner

    from specrt.cli import main

    r = CliRunner().invoke(main, ["canary", str(low)])
    rec = json.loads((low / "acceptance_receipt.json").read_text())
    assert r.exit_code == 0 and r.output == (
        f"acceptance canary: depth-1 acceptance {rec['measured_depth1']:.2f} over {rec['drafts']} drafts, training "
        "receipt 0.00 (training_last_window.depth_1.accuracy)\n"), r.output


def test_untrusted_far_below_receipt_and_run_warns(tmp_path):
    eng = _engines(tmp_path / "b", {"heldout": {"acceptance_at_pos": [0.95, 0.5]},
                                   "training_last_window": {"depth_1": {"accuracy": 0.97}}})
    r = _measure(eng)
    assert r["training_depth1"] == 0.95 and r["training_source"] == "heldout.acceptance_at_pos[0]"
    assert r["measured_depth1"] < 0.5 * 0.95 and not r["trusted"]
    assert r["note"] is None  # (mutant C04, session 65: a receipt compared with is no "no training receipt")
    with Session(eng, governor="fixed:1") as s:
        assert "UNTRUSTED DRAFT" in s.untrusted
    ids = tmp_path / "p.jsonl"
    ids.write_text(json.dumps({"prompt": "x"}) + "\n")
    # the CLI repeats the warning loudly on every run (this tiny model has no tokenizer, so
    # the run itself then fails with a clear error after the warning)
    p = subprocess.run([sys.executable, "-m", "specrt.cli", "run", str(eng), "--prompts", str(ids),
                        "--governor", "fixed:1"], capture_output=True, text=True)
    assert "WARNING: UNTRUSTED DRAFT" in p.stderr and "no tokenizer.json" in p.stderr and p.returncode == 1
    # and so does chat (it said nothing)
    from click.testing import CliRunner

    from specrt.cli import main

    r = CliRunner().invoke(main, ["canary", str(eng)])  # said loudly, naming the receipt that keeps it
    assert r.exit_code == 0 and "UNTRUSTED: measured acceptance is far below the training receipt" in r.output \
        and f"{eng}/acceptance_receipt.json records it and `specrt run` will warn" in " ".join(r.output.split()), \
        r.output
    r = CliRunner().invoke(main, ["chat", str(eng), "--governor", "fixed:1"], input="\n")
    # (then refused, this model having no tokenizer: before its first prompt since session 53)
    assert r.exit_code == 1 and "WARNING: UNTRUSTED DRAFT" in r.output and "no tokenizer.json" in r.output, r.output
    # a receipt copied from other weights, or edited by hand: named, never read as trusted
    # (another export's trusted receipt silenced the warning; a missing number crashed)
    rec = json.loads((eng / "acceptance_receipt.json").read_text())
    for edit, words in (({"binding_receipt_id": "0" * 64}, "measured for other weights"),
                        ({"trusted": "false"}, "'trusted' must be true or false"),
                        ({"measured_depth1": None}, "needs numbers")):
        (eng / "acceptance_receipt.json").write_text(json.dumps({**rec, **edit}))
        with pytest.raises(UserError, match=words):
            Session(eng, governor="fixed:1")
    (eng / "acceptance_receipt.json").write_text("[" * 100000 + "]" * 100000)  # (a RecursionError traceback)
    with pytest.raises(UserError, match="cannot read the acceptance receipt"):
        Session(eng, governor="fixed:1")
    (eng / "acceptance_receipt.json").write_text(json.dumps(rec))


def test_engines_never_checked_get_a_note(tmp_path):
    """Engines built with --no-canary (no acceptance receipt) ran with no word that nothing
    had checked the draft's binding on them: run, chat and serve now say so, until `specrt
    canary` has measured; with speculation off there is nothing to say."""
    from click.testing import CliRunner

    from specrt.cli import main

    eng = _engines(tmp_path / "n", None)
    ids = tmp_path / "p.jsonl"
    ids.write_text(json.dumps({"prompt": "x"}) + "\n")  # no tokenizer: run fails after its notes
    with Session(eng, governor="fixed:1") as s:
        assert f"no acceptance receipt in {eng}" in s.unchecked and s.untrusted is None
    with Session(eng, governor="off") as s:
        assert s.unchecked is None
    for args in (["run", str(eng), "--prompts", str(ids), "--max-new-tokens", "4", "--governor", "fixed:1"],
                 ["chat", str(eng), "--governor", "fixed:1"]):
        r = CliRunner().invoke(main, args, input="\n")
        assert f"note: no acceptance receipt in {eng}" in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(main, ["canary", str(eng)])
    assert r.exit_code == 0, r.output
    with Session(eng, governor="fixed:1") as s:
        assert s.unchecked is None
    r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(ids), "--max-new-tokens", "4", "--governor", "fixed:1"])
    assert "no tokenizer.json" in r.output and "acceptance receipt" not in r.output, r.output


def test_the_canary_command_refuses_a_graph_swapped_in_from_another_build(tmp_path):
    """`specrt canary` loaded the folder without re-hashing its files and wrote a trusted
    receipt for a draft graph copied in from another build, which run then refused (a user
    walk, session 54): it checks the hashes as run does, and writes nothing."""
    import shutil

    from click.testing import CliRunner

    from specrt.cli import main

    eng = _engines(tmp_path / "a", None)
    # another draft of the same shapes (its own random weights), from another export: it loads and
    # runs, and only its hash tells (a graph of another context is refused by its cache rows too)
    t = write_tiny_target(tmp_path / "b" / "t", "llama", vocab_size=16)
    d = write_tiny_draft(tmp_path / "b" / "d", t, kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15,
                         seed=7)
    export(t, d, tmp_path / "b" / "exp")
    (eng / "acceptance_receipt.json").unlink(missing_ok=True)
    for f in ("draft.onnx", "draft.onnx.data"):
        if (tmp_path / "b" / "exp" / f).exists():
            shutil.copy(tmp_path / "b" / "exp" / f, eng / f)
    r = CliRunner().invoke(main, ["canary", str(eng)])
    assert r.exit_code == 1 and "draft.onnx" in r.output and "Traceback" not in r.output, r.output
    assert "differs" in r.output or "sha256" in r.output, r.output
    assert not (eng / "acceptance_receipt.json").exists()


def test_no_receipt_is_trusted_with_a_note(tmp_path):
    r = _measure(_engines(tmp_path / "c", None))
    assert r["trusted"] and r["training_depth1"] is None and "no training receipt" in r["note"]
    eng = tmp_path / "c" / "eng"
    for text, what in (("{not json", "cannot read the acceptance receipt"), ("[1, 2]", "expected a JSON object"),
                       # (a number past Python's digit limit for int: a ValueError traceback)
                       ('{"a": ' + "9" * 5000 + "}", "cannot read the acceptance receipt")):
        (eng / "acceptance_receipt.json").write_text(text)
        with pytest.raises(UserError, match=f"acceptance_receipt.json: {what}.*specrt canary"):
            Session(eng, governor="fixed:1")


@pytest.mark.slow
def test_mis_bound_real_pair_is_caught(tmp_path):
    """The historical failure: the target's final norm replaced by a layer norm (what a suffix
    match on 'norm.weight' binds). Binding cannot see it (names and shapes are right), the
    canary does: acceptance collapses against the trained draft's receipt."""
    from safetensors.numpy import load_file, save_file

    from tests.real_model import committed_draft, smollm2_folder

    draft = committed_draft()
    assert (draft / "model.safetensors").is_file(), "the committed trained draft is missing from this checkout"
    good = smollm2_folder()
    bad = tmp_path / "misbound"
    shutil.copytree(good, bad)
    w = load_file(str(bad / "model.safetensors"))
    w["model.norm.weight"] = w["model.layers.29.post_attention_layernorm.weight"].copy()
    save_file(w, str(bad / "model.safetensors"), metadata={"format": "pt"})
    results = {}
    for name, target in (("good", good), ("bad", bad)):
        export(target, draft, tmp_path / f"exp-{name}")
        build_engines(tmp_path / f"exp-{name}", "onnxruntime", (1,), tmp_path / f"eng-{name}", log=lambda s: None,
                      profile_repeats=1, profile_pasts=(64,), max_context=512)
        results[name] = _measure(tmp_path / f"eng-{name}")
    assert results["good"]["trusted"], results["good"]
    assert not results["bad"]["trusted"], results["bad"]
    assert results["bad"]["binding_receipt_id"] != results["good"]["binding_receipt_id"]


def test_low_acceptance_without_receipt_is_said(tmp_path, monkeypatch):
    """speculators writes no training receipt, so a mis-bound pair had nothing to be compared
    with: the canary said 'trusted' at 0.09 for the committed SmolLM2 draft with its aux layer
    ids changed (0.39 as trained). Below LOW_WITHOUT_RECEIPT it now says so and what to check,
    and run / chat / serve note it; the receipt stays trusted (no error is proven)."""
    from click.testing import CliRunner

    import specrt.runtime.canary as canary
    from specrt.cli import main

    eng = _engines(tmp_path / "c", None)
    m = _measure(eng)["measured_depth1"]
    assert 0 < m < 1
    monkeypatch.setattr(canary, "LOW_WITHOUT_RECEIPT", m / 2)
    r = _measure(eng)
    assert r["trusted"] and not r["low_without_receipt"] and r["note"] == "no training receipt: nothing to compare with"
    with Session(eng, governor="fixed:1") as s:
        assert s.low_acceptance is None
    monkeypatch.setattr(canary, "LOW_WITHOUT_RECEIPT", min(1.0, m + 0.05))
    out = CliRunner().invoke(main, ["canary", str(eng)])
    assert out.exit_code == 0 and "WARNING: depth-1 acceptance" in out.output, out.output
    assert "training_receipt.json" in out.output and "eagle_aux_hidden_state_layer_ids" in out.output
    # the verifier the draft names (speculators_config.verifier.name_or_path; the fixture's is its target's path)
    assert f"speculators_config.verifier, which names '{tmp_path / 'c' / 't'}')" in out.output, out.output
    assert f"which names '{tmp_path / 'c' / 't'}'" in json.loads((eng / "acceptance_receipt.json").read_text())["note"]
    r = json.loads((eng / "acceptance_receipt.json").read_text())
    assert r["trusted"] and r["low_without_receipt"] and r["note"].startswith("no training receipt")
    with Session(eng, governor="fixed:1") as s:
        assert s.untrusted is None and f"measured depth-1 acceptance {r['measured_depth1']:.2f}" in s.low_acceptance
        low = s.low_acceptance
    ids = tmp_path / "p.jsonl"
    ids.write_text(json.dumps({"prompt": "x"}) + "\n")  # no tokenizer: run fails after its notes
    out = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(ids), "--max-new-tokens", "2", "--governor",
                                    "fixed:1"])
    assert f"note: {low}" in out.output and "Traceback" not in out.output, out.output
    with Session(eng, governor="off") as s:
        assert s.low_acceptance is None
    # (the drafts of _measure's shorter run: the CLI's 48 tokens a prompt drafted more, so the
    # line placed by r["drafts"] lay past _measure's count whatever the comparison)
    drafts = _measure(eng)["drafts"]
    monkeypatch.setattr(canary, "LOW_MIN_DRAFTS", drafts)  # just enough drafts to say
    assert _measure(eng)["low_without_receipt"]
    monkeypatch.setattr(canary, "LOW_MIN_DRAFTS", drafts + 1)  # too few drafts to say
    assert not _measure(eng)["low_without_receipt"]
    monkeypatch.setattr(canary, "LOW_MIN_DRAFTS", 1)
    monkeypatch.setattr(canary, "LOW_WITHOUT_RECEIPT", m)  # exactly at the line: not below it
    assert not _measure(eng)["low_without_receipt"]


def test_the_receipt_figure_the_canary_compares_with():
    """The canary runs a fixed:1 loop, so a receipt's fixed:1 loop figure (train_peagle since
    session 49) is preferred to its every-anchor one, which is preferred to training accuracy;
    a field present with what the canary cannot compare with is named, never read as another."""
    from specrt.runtime.canary import expected_depth1

    loop = {"1": {"acceptance_at_pos": [0.585]}, "2": {"acceptance_at_pos": [0.6, 0.3]}}
    full = {"heldout": {"loop": loop, "acceptance_at_pos": [0.614, 0.28]},
            "training_last_window": {"depth_1": {"accuracy": 0.7}}}
    assert expected_depth1(full) == (0.585, "heldout.loop.1.acceptance_at_pos[0]")
    assert expected_depth1({**full, "heldout": {"acceptance_at_pos": [0.614]}}) == (0.614, "heldout.acceptance_at_pos[0]")
    assert expected_depth1({**full, "heldout": {"loop": {"2": loop["2"]}, "acceptance_at_pos": [0.614]}}) == (
        0.614, "heldout.acceptance_at_pos[0]")  # no fixed:1 loop: the next figure
    assert expected_depth1({"training_last_window": {"depth_1": {"accuracy": 1}}}) == (
        1.0, "training_last_window.depth_1.accuracy")
    assert expected_depth1({"heldout": None, "other": 1}) == (None, "none")
    for receipt, words in (({"heldout": {"acceptance_at_pos": ["x"]}}, r"F: heldout.acceptance_at_pos\[0\] must be an "
                                                                        r"acceptance rate from 0 to 1.*found \"x\""),
                           ({"heldout": {"acceptance_at_pos": []}}, r"heldout.acceptance_at_pos must be a list.*found \[\]"),
                           ({"heldout": {"acceptance_at_pos": {"0": 1}}}, "heldout.acceptance_at_pos must be a list"),
                           ({"heldout": "x"}, "F: heldout must be a JSON object; found \"x\""),
                           ({"heldout": {"loop": {"1": {"acceptance_at_pos": [1.5]}}}}, r"loop.1.acceptance_at_pos\[0\] "
                                                                                        "must be .*found 1.5"),
                           ({"training_last_window": {"depth_1": {"accuracy": True}}}, "found true"),
                           ({"training_last_window": {"depth_1": {"accuracy": float("nan")}}}, "found NaN")):
        with pytest.raises(UserError, match=words):
            expected_depth1(receipt, "F")


def test_export_refuses_a_training_receipt_the_canary_cannot_read(tmp_path):
    """A draft's training_receipt.json travels with the export for the canary: one it could
    not read (not JSON, not an object, a figure that is no rate) crashed the build's canary
    with a traceback after the engines were written. `specrt export` refuses it, naming the
    file and the field, exit 1, nothing written."""
    from click.testing import CliRunner

    from specrt.cli import main

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15)
    for text, words in (("{not json", "not valid JSON"), ("[1]", "expected a JSON object"),
                        (json.dumps({"heldout": {"acceptance_at_pos": [61.4]}}),
                         "heldout.acceptance_at_pos[0] must be an acceptance rate from 0 to 1")):
        (d / "training_receipt.json").write_text(text)
        r = CliRunner().invoke(main, ["export", str(t), "--draft", str(d), "-o", str(tmp_path / "out")])
        assert r.exit_code == 1 and f"{d / 'training_receipt.json'}: {words}" in r.output, r.output
        assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_a_folder_rebuilt_while_the_canary_ran_gets_no_receipt(tmp_path):
    """`build --force` renames a new folder into the engines' place: a canary (or calibrate)
    that loaded the old one wrote its measurement into the new one, credited to engines it
    never ran (session 55's interruption walk). It refuses, naming the folder; the folder is
    left as the rebuild made it."""
    eng = _engines(tmp_path / "c", None)
    with load_engines(eng) as e:
        e.check_still_here("x")  # (the folder loaded: nothing to refuse)
        eng.rename(tmp_path / "old")
        shutil.copytree(tmp_path / "old", eng)  # (a rebuilt folder in its place)
        (eng / "acceptance_receipt.json").unlink(missing_ok=True)
        with pytest.raises(UserError, match=f"{eng}: replaced while this ran .*acceptance_receipt.json not written"):
            run_canary(e, max_new_tokens=24)
    assert not (eng / "acceptance_receipt.json").exists()
    with load_engines(eng) as e:  # removed, not replaced: said so (it told to run again)
        eng.rename(tmp_path / "gone")
        with pytest.raises(UserError, match=f"{eng}: removed while this ran; acceptance_receipt.json not written$"):
            run_canary(e, max_new_tokens=24)
    assert not eng.exists()


def test_drafts_exactly_at_min_drafts_decide(tmp_path, monkeypatch):
    """Mutant c04 (inconclusive at MIN_DRAFTS drafts too): MIN_DRAFTS drafts decide, one fewer
    do not."""
    import specrt.runtime.canary as canary

    eng = _engines(tmp_path / "x", {"heldout": {"acceptance_at_pos": [0.9, 0.8]}})
    drafts = _measure(eng)["drafts"]
    monkeypatch.setattr(canary, "MIN_DRAFTS", drafts)
    assert _measure(eng)["inconclusive"] is False
    monkeypatch.setattr(canary, "MIN_DRAFTS", drafts + 1)
    assert _measure(eng)["inconclusive"] is True


def test_the_receipt_counts_only_the_prompts_with_room_for_a_round(tmp_path):
    """Mutant c07 (a prompt kept with room for its first token only): the 12-token prompts
    in a context of 13 leave no room for a round after the first token, so none is run and
    the receipt says 0 prompts. Nor in a context of 14 (h74d: kept by `len + 2`, the receipt
    said 6 prompts over 0 drafts, as the prompt and its answer, 12 + 1 + a draft and its bonus,
    need 15); 15 drafts in each."""
    r = _measure(_engines(tmp_path / "x", None, max_context=13))
    assert (r["prompts"], r["drafts"], r["inconclusive"]) == (0, 0, True), r
    r = _measure(_engines(tmp_path / "y", None, max_context=14))
    assert (r["prompts"], r["drafts"], r["inconclusive"]) == (0, 0, True), r
    r = _measure(_engines(tmp_path / "z", None, max_context=15))
    assert (r["prompts"], r["drafts"]) == (6, 6), r


def test_the_canary_measures_at_depth_1_whatever_depths_are_built(tmp_path):
    """Mutant c09 (the canary run at the deepest depth built): the figure compared with the
    receipt's depth-1 acceptance is a fixed:1 run's, so engines built for depths 1 and 2
    measure what the same pair built for depth 1 alone measures."""
    from specrt.engines import build_engines

    eng = _engines(tmp_path / "x", None)  # depths (1, 2)
    build_engines(tmp_path / "x" / "exp", "onnxruntime", (1,), tmp_path / "x" / "eng1", log=lambda s: None,
                  profile_repeats=1, profile_pasts=(16,), max_context=128)
    both, one = _measure(eng), _measure(tmp_path / "x" / "eng1")
    assert (both["measured_depth1"], both["drafts"]) == (one["measured_depth1"], one["drafts"]), (both, one)


def test_engines_without_depth_1_measure_at_their_shallowest_depth(tmp_path):
    """Mutant m74b-15 (the canary run at the deepest depth where depth 1 is not built): engines
    built for depths 2 and 4 measure position 1 at depth 2, whose round after a 12-token prompt's
    first token fits a context of 16 (12 + 1 + 2 drafts and their bonus, h74d's room): one round,
    one draft at position 1, each; at depth 4 no prompt had room, and the receipt said 0 prompts."""
    _engines(tmp_path / "x", None)  # (for its export)
    build_engines(tmp_path / "x" / "exp", "onnxruntime", (2, 4), tmp_path / "x" / "eng24", log=lambda s: None,
                  profile_repeats=1, profile_pasts=(4,), max_context=16)
    r = _measure(tmp_path / "x" / "eng24")
    assert (r["prompts"], r["drafts"]) == (6, 6), r


def test_canary_prompts_go_through_the_exports_chat_template(tmp_path):
    """Mutant c16 (the canary's prompts encoded as plain text): an export whose tokenizer has a
    chat template gets the canary's prompts through it, as chat prompts, the way `specrt
    chat` sends them; one without gets them as text."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.canary import PROMPTS, prompt_ids
    from specrt.runtime.text import Text

    vocab = {"<unk>": 0, "<|user|>": 1, "<|assistant|>": 2, "What": 3, "is": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": (
        "{% for m in messages %}<|user|> {{ m.content }} {% endfor %}{% if add_generation_prompt %}<|assistant|>"
        "{% endif %}")}))
    ids = prompt_ids(tmp_path, 5)
    text = Text(tmp_path)
    assert ids == [text.encode(p, True) for p in PROMPTS]
    assert ids[0] == [1, 3, 4, 0, 0, 0, 0, 2]
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert prompt_ids(tmp_path, 5)[0] == [3, 4, 0, 0, 0, 0]


def test_canary_refuses_engines_without_a_draft(tmp_path):
    """`specrt canary` on engines built from an export with no draft: nothing to measure,
    said as a user error naming the folder (exit 1), and no acceptance receipt written."""
    from click.testing import CliRunner

    from specrt.cli import main

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    export(t, None, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1,), tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    with load_engines(tmp_path / "eng") as e:  # (mutant C05, session 65: run_canary itself measures nothing)
        assert run_canary(e) == {}
    r = CliRunner().invoke(main, ["canary", str(tmp_path / "eng")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert r.output == f"error: {tmp_path / 'eng'}: the engines have no draft; nothing to check\n", r.output
    assert not (tmp_path / "eng" / "acceptance_receipt.json").exists()


def test_a_receipt_figure_of_zero_is_a_rate_and_short_values_are_quoted_whole():
    """mutation round 5, K10 / K13: 0 is an acceptance rate from 0 to 1 (a draft that never
    matched in training, compared with as such); a value of 60 characters is quoted whole."""
    from specrt.runtime.canary import _short, expected_depth1

    assert expected_depth1({"heldout": {"acceptance_at_pos": [0]}}) == (0.0, "heldout.acceptance_at_pos[0]")
    assert _short("x" * 58) == '"' + "x" * 58 + '"' and _short("x" * 59) == '"' + "x" * 56 + "..."


def test_measured_exactly_at_the_ratio_is_trusted(tmp_path, monkeypatch):
    """mutation round 5, K04: trusted is measured >= UNTRUSTED_RATIO * expected, the edge
    included (a receipt promising exactly what the canary measures, at a ratio of 1)."""
    import specrt.runtime.canary as canary

    m = _measure(_engines(tmp_path / "x", {"heldout": {"acceptance_at_pos": [0.9, 0.8]}}))["measured_depth1"]
    monkeypatch.setattr(canary, "UNTRUSTED_RATIO", 1.0)
    r = _measure(_engines(tmp_path / "y", {"heldout": {"acceptance_at_pos": [m, 0.0]}}))
    assert r["measured_depth1"] == r["training_depth1"] == m and not r["inconclusive"] and r["trusted"] is True, r
    assert r["untrusted_ratio"] == 1.0  # (mutant C15, session 65: the ratio the verdict used, not the default)


def test_the_low_acceptance_note_names_a_verifier_only_where_the_draft_names_one():
    """Mutants C06, B57 (session 65: a draft naming no verifier said "which names 'None'"; the
    figure unrounded): the note points to the draft's speculators_config.verifier, naming it
    only where there is one, and gives the acceptance to two places."""
    from specrt.runtime.canary import low_note

    assert "check that the draft was trained for this target (its speculators_config.verifier) and" in low_note(0.1)
    assert low_note(0.1234).startswith("depth-1 acceptance 0.12 is below 0.2 that a trained draft reaches")
    assert "(its speculators_config.verifier, which names 'T') and" in low_note(0.1, "T")


def test_engines_without_depth_1_measure_position_1_of_their_shallowest_depth(tmp_path):
    """Mutant C02 (session 65: the canary counting every draft of its rounds): engines built
    without depth 1 are measured at their shallowest depth, and what is compared with the
    receipt's depth-1 figure is position 1's acceptance there, over position 1's drafts."""
    from specrt.runtime.canary import prompt_ids
    from specrt.runtime.generate import Generator
    from specrt.runtime.governor import FixedGovernor
    from specrt.runtime.session import read_d2t

    _engines(tmp_path / "x", None)
    build_engines(tmp_path / "x" / "exp", "onnxruntime", (2,), tmp_path / "x" / "eng2", log=lambda s: None,
                  profile_repeats=1, profile_pasts=(16,), max_context=128)
    r = _measure(tmp_path / "x" / "eng2")
    with load_engines(tmp_path / "x" / "eng2") as e:
        exp = e.export
        gen = Generator(e, FixedGovernor(e.depths, 2), d2t=read_d2t(e.export_dir, exp))
        offered = accepted = drafted = 0
        for ids in prompt_ids(e.export_dir, exp["target"]["vocab_size"]):
            gen.generate(ids, 24, exp["target"]["eos_token_ids"])
            t = gen.telemetry
            offered, accepted, drafted = offered + t.offered_at[0], accepted + t.accepted_at[0], drafted + t.drafted
    assert drafted > offered >= 10 and (r["drafts"], r["measured_depth1"]) == (offered, accepted / offered), r


def test_a_training_receipt_the_canary_cannot_compare_with_is_named_by_its_file(tmp_path):
    """Mutant B54 (session 65: the canary's receipt error naming "the training receipt"): export
    refuses such a receipt and load_engines a changed one, but an export made before export
    checked it can carry one: the canary names the file it read (here reached as the build's
    canary is, its files not hashed again)."""
    eng = _engines(tmp_path / "x", {"heldout": {"acceptance_at_pos": [0.9]}})
    (eng / "export" / "training_receipt.json").write_text(json.dumps({"heldout": {"acceptance_at_pos": [61.4]}}))
    with load_engines(eng, verify=False) as e:
        with pytest.raises(UserError, match=f"^{eng / 'export' / 'training_receipt.json'}: heldout.acceptance_at_pos"
                                            r"\[0\] must be an acceptance rate"):
            run_canary(e, max_new_tokens=4)


def test_one_prompt_left_out_for_the_context_is_blamed_on_the_context(tmp_path):
    """Mutant B66 (session 65: the context blamed only where two prompts were left out): with a
    word-level tokenizer the canary's first four prompts take 6 or 7 tokens; a context of 9
    (a prompt, its first token, a draft and its bonus) leaves out the one of 7 alone, and the
    answers end at once (every token an EOS): the note names the context."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.runtime.canary import PROMPTS

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16, eos_token_id=list(range(16)))
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(16)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(t / "tokenizer.json"))
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=16, mask_token_id=15)
    export(t, d, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1,), tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(4,), max_context=9)
    assert [len(p.split()) for p in PROMPTS[:4]] == [6, 7, 6, 6]
    with load_engines(tmp_path / "eng") as e:
        r = run_canary(e, max_new_tokens=24, prompts=PROMPTS[:4])
    assert (r["prompts"], r["drafts"]) == (3, 0) and "the engines' context of 9 tokens" in r["note"], r


def test_a_receipt_copied_beside_another_build_of_the_export_is_refused(tmp_path):
    """A trusted receipt copied into engines built again from the same export with other
    --draft-weights (a user walk, session 72: as a rebuild's calibration.json is copied across)
    was taken, vouching for a draft graph the canary never ran (a broken one too: a draft
    engine's fc rows shuffled measured 0.01 against 0.61, its copied receipt silenced that):
    the receipt names the engine files it measured, and Session refuses it on others. A
    receipt naming none (written before) is taken as before."""
    from click.testing import CliRunner

    from specrt.cli import main

    eng = _engines(tmp_path / "a", {"heldout": {"acceptance_at_pos": [0.0]}})
    _measure(eng)  # (what build's canary writes)
    other = tmp_path / "int8"
    build_engines(tmp_path / "a" / "exp", "onnxruntime", (1, 2), other, log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=128, draft_weights="int8:dynamic")
    rec = json.loads((eng / "acceptance_receipt.json").read_text())
    (other / "acceptance_receipt.json").write_text(json.dumps(rec))
    with pytest.raises(UserError, match=r"acceptance_receipt.json: measured on other engines of this export .*"
                                        r"`specrt canary .*int8` writes it again"):
        Session(other, governor="fixed:1")
    with Session(eng, governor="fixed:1") as s:  # (where it was measured: taken)
        assert s.acceptance["engine_files"] == {r["file"]: r["sha256"] for r in s.engines.manifest["files"]}
    (other / "acceptance_receipt.json").write_text(json.dumps({k: v for k, v in rec.items() if k != "engine_files"}))
    with Session(other, governor="fixed:1") as s:
        assert s.acceptance is not None and s.untrusted is None
    r = CliRunner().invoke(main, ["canary", str(other)])  # measured there: its own receipt
    assert r.exit_code == 0, r.output
    with Session(other, governor="fixed:1") as s:
        assert s.acceptance["engine_files"] != rec["engine_files"]
