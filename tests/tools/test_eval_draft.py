"""tools/eval_draft.py: the decode speed-up loop tau and a build's cost table predict."""

from __future__ import annotations

import json

import pytest

from tests.real_model import committed_draft, smollm2_folder, tool


def test_predicted_speedup_is_loop_tau_over_a_rounds_cost_in_decode_steps():
    pytest.importorskip("torch")
    ev = tool("eval_draft")
    loop = {"1": {"tau": 1.5}, "2": {"tau": 1.8}, "3": {"tau": 2.0}}
    costs = {"decode": 0.020, "draft": 0.002, "draft_by_depth": {"1": 0.001, "2": 0.0015},
             "verify": {"1": 0.021, "2": 0.0225}}
    # fixed:1: 1.5 tokens a round of 1 + 21 ms against 20 ms a token; fixed:3 has no verify.3
    assert ev.predicted_speedups(loop, costs) == {"1": round(1.5 * 20 / 22, 4), "2": round(1.8 * 20 / 24, 4)}
    # a table without draft_by_depth prices every depth at its draft pass
    assert ev.predicted_speedups({"2": {"tau": 1.8}}, {**costs, "draft_by_depth": None}) == {
        "2": round(1.8 * 20 / 24.5, 4)}
    # a depth without verify cost is left out, not the ones after it; a table without any draft
    # cost prices the draft pass at nothing
    assert ev.predicted_speedups(loop, {"decode": 0.020, "verify": {"1": 0.021, "3": 0.025}}) == {
        "1": round(1.5 * 20 / 21, 4), "3": round(2.0 * 20 / 25, 4)}


def test_costs_of_a_folder_that_is_not_a_build_are_refused_by_name(tmp_path):
    pytest.importorskip("torch")
    ev = tool("eval_draft")
    with pytest.raises(SystemExit, match=r"--costs .*: engines.json missing \(expected a folder `specrt build`"):
        ev.main(["fixtures/peagle-smollm2", "--costs", str(tmp_path)])
    for text in ("[1, 2]", '{"costs": '):  # not an object; cut short
        (tmp_path / "engines.json").write_text(text)
        with pytest.raises(SystemExit, match=r"engines.json is not a JSON object"):
            ev.read_costs(tmp_path)
    for costs in ({"decode": 0.02}, {"verify": {"1": 0.021}}, {"decode": 0.02, "verify": [0.021]}):
        (tmp_path / "engines.json").write_text(json.dumps({"costs": costs}))
        with pytest.raises(SystemExit, match=r"engines.json has no cost table \(costs.verify, costs.decode\)"):
            ev.read_costs(tmp_path)
    table = {"decode": 0.02, "verify": {"1": 0.021}}
    (tmp_path / "engines.json").write_text(json.dumps({"costs": table}))
    assert ev.read_costs(tmp_path) == table
    # every figure the prediction reads is seconds > 0, or it is refused by name
    for bad, name in (({"decode": "fast"}, "decode is 'fast'"), ({"decode": True}, "decode is True"),
                      ({"verify": {"1": 0.02, "2": -1}}, "verify.2 is -1"), ({"draft": None}, "draft is None"),
                      ({"verify": {"1": 0}}, "verify.1 is 0"), ({"decode": float("inf")}, "decode is inf"),
                      ({"draft_by_depth": {"3": [0.001]}}, r"draft_by_depth.3 is \[0.001\]"),
                      ({"draft_by_depth": 0.001}, r"draft_by_depth is 0.001, expected \{depth: seconds\}")):
        (tmp_path / "engines.json").write_text(json.dumps({"costs": {**table, **bad}}))
        with pytest.raises(SystemExit, match=rf"engines.json costs.{name}(, expected seconds > 0|$)"):
            ev.read_costs(tmp_path)
    (tmp_path / "engines.json").write_text(json.dumps({"costs": {**table, "draft_by_depth": None}}))
    assert ev.read_costs(tmp_path) == {**table, "draft_by_depth": None}  # as predicted_speedups reads it: none
    full = {**table, "draft": 0.001, "draft_by_depth": {"1": 0.001}, "chain": {"5": 0.03}}
    (tmp_path / "engines.json").write_text(json.dumps({"costs": full}))
    assert ev.read_costs(tmp_path) == full


def test_the_table_is_evaluate_on_the_subset_for_each_draft_with_its_predicted_speedups(tmp_path, monkeypatch):
    """main on the real target (the held-out list cut to 4 prompts, answered at --max-new 8 into
    a cache of the test's own): each draft folder's row is train_peagle's evaluate on the
    --subset prompts with the draft's K and aux layers, with the speed-ups --costs predicts;
    the table names the subset (its file name may hold a colon), the prompt count and the cost table."""
    torch = pytest.importorskip("torch")
    real = smollm2_folder()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / real.name).symlink_to(real)
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    ev, tp = tool("eval_draft"), tool("train_peagle")
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(tp.HELDOUT.read_text().splitlines(keepends=True)[:4]))
    monkeypatch.setattr(tp, "HELDOUT", heldout)
    draft, other = committed_draft(), tmp_path / "other"
    other.symlink_to(draft)
    (tmp_path / "split:1.json").write_text(json.dumps({"few": [3, 0, 2], "rest": [1]}))
    costs = {"decode": 0.02, "draft": 0.002, "verify": {"1": 0.021, "3": 0.023, "4": 0.03}}
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "engines.json").write_text(json.dumps({"costs": costs}))
    threads = torch.get_num_threads()
    try:
        assert ev.main([str(draft), str(other), "--subset", f"{tmp_path / 'split:1.json'}:few", "--max-new", "8",
                        "--threads", "1", "--costs", str(tmp_path / "engines"), "-o", str(tmp_path / "t.json")]) == 0
        _, source, tok, target = tp.smollm2_target(tp.default_cache())
        held = tp.heldout_answers(target, tok, tp.default_cache(), None, 8, source["sha256"])  # cached by main
        held = [held[i] for i in (3, 0, 2)]
        want = tp.evaluate(tp.load_draft(draft, target.model.embed_tokens.weight.detach().clone()), held,
                           tp.build_features(target, held, [2, 15, 27], None), 4)
    finally:
        torch.set_num_threads(threads)
    table = json.loads((tmp_path / "t.json").read_text())
    assert (table["prompts"], table["subset"]) == (3, f"{tmp_path / 'split:1.json'}:few")
    assert table["costs"] == {"engines": str(tmp_path / "engines"), **costs}
    assert list(table["drafts"]) == [str(draft), str(other)]
    assert want["anchors"] == 3 * 4 and list(want["loop"]) == ["1", "2", "3", "4"]
    for r in table["drafts"].values():
        assert r == {**want, "predicted_speedup": ev.predicted_speedups(want["loop"], costs)}
        assert list(r["predicted_speedup"]) == ["1", "3", "4"]


def test_wrong_drafts_subsets_and_outputs_are_refused_before_the_target_is_loaded(tmp_path, monkeypatch):
    """What main reads after the held-out answers (minutes of the target's decoding) is checked
    before them, each refused by name: here the target cannot even be made (an empty cache and
    a wheel that is not there), so an input found wrong only after it would fail otherwise."""
    pytest.importorskip("torch")
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECRT_SMOLLM2_WHEEL", str(tmp_path / "no-wheel.whl"))
    ev = tool("eval_draft")
    draft = str(committed_draft())
    (tmp_path / "split.json").write_text(json.dumps({"clean": [0, 2], "far": [80], "bad": "0,2"}))
    (tmp_path / "not-json").write_text("{")
    (tmp_path / "empty").mkdir()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_text("{")
    for args, match in (([str(tmp_path / "nowhere")], r"nowhere: cannot read config.json \(No such file"),
                        ([draft, str(tmp_path / "empty")], r"empty: cannot read config.json"),
                        ([str(tmp_path / "cut")], r"cut: config.json is not a P-EAGLE draft's config \(JSONDecode"),
                        ([draft, "--subset", str(tmp_path / "split.json")], r"--subset .*json: expected FILE:KEY"),
                        ([draft, "--subset", f"{tmp_path}/none.json:clean"], r"--subset .*: cannot read .*none.json"),
                        ([draft, "--subset", f"{tmp_path}/not-json:clean"], r"--subset .*: .*not-json is not JSON"),
                        ([draft, "--subset", f"{tmp_path}/split.json:other"], r"split.json has no key 'other'"),
                        ([draft, "--subset", f"{tmp_path}/split.json:far"], r"indices 0..79, got \[80\]"),
                        ([draft, "--subset", f"{tmp_path}/split.json:bad"], r"indices 0..79, got '0,2'"),
                        ([draft, "-o", str(tmp_path / "no" / "t.json")], r"-o .*t.json: .*no is not a folder"),
                        ([draft, "--max-new", "4"], r"--max-new 4: .*peagle-smollm2 drafts 4 tokens a round, so "
                                                    r"answers of 4 tokens hold no anchor")):
        with pytest.raises(SystemExit, match=match):
            ev.main(args)
    assert not (tmp_path / "cache").exists()  # the target was never asked for
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text((committed_draft() / "config.json").read_text())
    with pytest.raises(SystemExit, match=r"draft: model.safetensors missing"):
        ev.main([str(tmp_path / "draft")])
    (tmp_path / "draft" / "config.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [2]}))
    with pytest.raises(SystemExit, match=r"draft: config.json is not a P-EAGLE draft's config \(KeyError"):
        ev.main([str(tmp_path / "draft")])


def test_an_empty_subset_is_refused_before_the_target_is_loaded(tmp_path, monkeypatch):
    """--subset FILE:KEY naming an empty list passed the subset's check: the table measured no
    prompt, tau 1.0 over 0 anchors and speed-ups from it (what --max-new <= K is refused for),
    after the held-out answers' minutes. Refused by name first, as a list out of range is."""
    pytest.importorskip("torch")
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECRT_SMOLLM2_WHEEL", str(tmp_path / "no-wheel.whl"))
    ev = tool("eval_draft")
    (tmp_path / "split.json").write_text(json.dumps({"none": [], "one": [0]}))
    with pytest.raises(SystemExit, match=r"^--subset .*split.json:none: expected a non-empty list of held-out prompt "
                                         r"indices 0..79, got \[\]$"):
        ev.main([str(committed_draft()), "--subset", f"{tmp_path}/split.json:none"])
    assert not (tmp_path / "cache").exists()  # the target was never asked for
    assert ev.read_subset(f"{tmp_path}/split.json:one", 80) == [0]
