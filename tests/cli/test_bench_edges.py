"""specrt bench: edge cases a mutation round of specrt/cmd_bench.py found unpinned (session 56: each test
fails on its mutant, passes on the code)."""
from __future__ import annotations

import pytest

from tests.cli.test_bench import prompts_file, report, tiny_engines  # noqa: F401
from tests.runtime.test_text import overflowing  # noqa: F401  (a tiny pair whose engines fail mid-answer)


def test_each_configurations_ratios_are_its_median_over_the_references(report):  # noqa: F811
    """B05: ratio_vs_off is the configuration's median tokens/s over specrt:off's (a faster
    configuration above 1), not its inverse."""
    configs = report[0]["configs"]
    off = configs["specrt:off"]["tokens_per_s_median"]
    for name, c in configs.items():
        assert c["ratio_vs_off"] == pytest.approx(c["tokens_per_s_median"] / off), name


def test_identity_gives_the_shortest_identical_prefix():
    """B08: identical_prefix_min is the smallest per-prompt prefix (the worst prompt)."""
    from specrt.cmd_bench import REFERENCE, identity

    ident = identity({REFERENCE: [[1, 2, 3], [5, 6]], "hf": [[1, 9, 9], [5, 6]]}, REFERENCE)
    c = ident["configs"]["hf"]
    assert c["identical_prefix_per_prompt"] == [1, 2] and c["identical_prefix_min"] == 1


def test_a_peers_total_rate_is_its_tokens_over_its_seconds():
    """B19 / B26: tokens_per_s_total is all new tokens over all seconds (not the median of the
    per-prompt rates), and min / max the extreme per-prompt rates."""
    from specrt.cmd_bench import summarise_config

    pp = [{"new_tokens": 10, "seconds": 1.0, "output_ids": []}, {"new_tokens": 10, "seconds": 4.0, "output_ids": []}]
    s = summarise_config("hf", {"ok": True, "per_prompt": pp}, [[1], [2]], None)
    assert s["tokens_per_s_per_prompt"] == [10.0, 2.5] and s["tokens_per_s_median"] == pytest.approx(6.25)
    assert s["tokens_per_s_total"] == pytest.approx(20 / 5.0)
    assert (s["tokens_per_s_min"], s["tokens_per_s_max"]) == (2.5, 10.0)


def test_draft_passes_per_round_count_every_round_the_draft_ran():
    """B12: draft_passes_per_round divides by the rounds the draft ran (drafting_rounds), not by
    the rounds that verified a draft (draft_rounds): a DSpark round that drafts and verifies
    nothing still took its pass."""
    from specrt.cmd_bench import summarise_config
    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.record(RoundResult(depth=2, accepted=1, t_draft=0.01, t_verify=0.01))  # one round verified drafts
    t.record(RoundResult(depth=0, accepted=0, t_draft=0.01, t_verify=0.01))  # one drafted, verified none
    t.finish(new_tokens=4, seconds=0.1)
    rec = {**t.to_json(), "output_ids": [1, 2, 3, 4], "draft_passes": 2, "mask_slots": 0, "drafting_rounds": 2}

    class E:
        depths = (1, 2)

        def cost(self, role, past):
            return 0.01

    s = summarise_config("specrt:dspark", {"per_prompt": [rec]}, [[7, 8]], E())
    assert s["draft_rounds"] == 1 and s["drafting_rounds"] == 2 and s["drafted_but_unverified_rounds"] == 1
    assert s["draft_passes_per_round"] == pytest.approx(1.0)


def test_a_processes_merge_keeps_the_largest_peak_and_the_median_load_time():
    """B17 / B27: merge_process_results: peak RSS the largest process's, load time the median."""
    from specrt.cmd_bench import merge_process_results

    parts = [{"ok": True, "prompt_indices": [k], "per_prompt": [{"x": k}], "load_seconds": s, "peak_rss_bytes": rss,
              "ru_maxrss_bytes": rss, "rss_after_load_bytes": rss, "rss_end_bytes": rss}
             for k, (s, rss) in enumerate(((4.0, 300), (1.0, 100), (2.0, 200)))]
    got = merge_process_results(parts, 3)
    assert got["peak_rss_bytes"] == 300 and got["rss_end_bytes"] == 300 and got["load_seconds"] == 2.0
    assert [r["process"] for r in got["per_prompt"]] == [0, 1, 2] and got["processes"] == 3


def test_max_new_tokens_0_is_refused(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """B15: --max-new-tokens 0 is a UserError before anything runs, nothing written."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    with pytest.raises(UserError, match=r"--max-new-tokens 0: expected >= 1"):
        run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=0, peers="none", governors="off")
    assert not (tmp_path / "r").exists()


def test_ratios_against_onnxruntime_genai_divide_by_its_median(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                               monkeypatch):
    """B06 / B11: ratio_vs_ortgenai is a configuration's median over onnxruntime-genai's, and
    efficiency (a) specrt:off's over it. onnxruntime-genai cannot run on the tokenizer-less tiny
    target: its result is specrt:off's with every prompt taking twice the seconds."""
    import json

    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    real = cb._run_interleaved

    def with_ortgenai(jobs, n, out, bar, results, *a, **k):
        real(jobs, n, out, bar, results, *a, **k)
        off = results["specrt:off"]
        results["ortgenai"] = {"ok": True, "peak_rss_bytes": 1, "per_prompt": [
            {"output_ids": r["output_ids"], "new_tokens": r["new_tokens"], "seconds": 2 * r["seconds"]}
            for r in off["per_prompt"]]}

    monkeypatch.setattr(cb, "_run_interleaved", with_ortgenai)
    r = CliRunner().invoke(cb.bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                      "--peers", "none", "--governors", "off,fixed:2", "--max-new-tokens", "4",
                                      "--threads", "1", "--no-profile", "--warmup-tokens", "0", "--quiet"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r" / "bench.json").read_text())
    cfg = rep["configs"]
    og = cfg["ortgenai"]["tokens_per_s_median"]
    assert og == pytest.approx(cfg["specrt:off"]["tokens_per_s_median"] / 2)
    for name, c in cfg.items():
        assert c["ratio_vs_ortgenai"] == pytest.approx(c["tokens_per_s_median"] / og), name
    assert rep["efficiency"]["a_off_vs_ortgenai"]["ratio"] == pytest.approx(2.0)


def test_engines_seconds_hold_the_draft_and_the_verify_calls():
    """B29: the prediction's engines_seconds is the draft's and the target's calls together
    (its engines_tokens_per_s is what the stale-table warning compares with the table)."""
    from specrt.cmd_bench import summarise_config
    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.engine_time("prefill", 0.1)
    t.record(RoundResult(depth=1, accepted=1, t_draft=0.1, t_verify=0.2))
    t.finish(new_tokens=3, seconds=0.5)
    rec = {**t.to_json(), "output_ids": [1, 2, 3], "draft_passes": 1, "mask_slots": 0}

    class E:
        depths = (1,)

        def cost(self, role, past):
            return 0.01

    s = summarise_config("specrt:fixed:1", {"per_prompt": [rec]}, [[7, 8, 9]], E())
    assert s["predicted"]["engines_seconds"] == pytest.approx(0.3)
    assert s["predicted"]["engines_tokens_per_s"] == pytest.approx(2 / 0.3)


class _Checked(Exception):
    pass


def test_a_prompt_that_fills_the_context_exactly_is_taken(tiny_engines, tmp_path, monkeypatch):  # noqa: F811
    """B30 / B31: prompt + --max-new-tokens equal to the engines' context is taken (one more is
    refused, naming it), and a token id equal to the vocabulary size is outside it."""
    import json

    import specrt.cmd_bench as cb
    from specrt.engines.engine_set import load_engines
    from specrt.errors import UserError

    e = load_engines(tiny_engines, verify=False)
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt_ids": [5, 6, 7]}) + "\n")

    def checked(*a, **k):  # every check passed: the report folder would be made now
        raise _Checked

    monkeypatch.setattr(cb, "atomic_folder", checked)
    args = dict(peers="none", governors="off", profile=False, warmup_tokens=0, threads=1)
    with pytest.raises(_Checked):
        cb.run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=e.max_context - 3, **args)
    with pytest.raises(UserError, match=rf"prompt 1 \(3 tokens\) \+ --max-new-tokens {e.max_context - 2} exceeds"):
        cb.run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=e.max_context - 2, **args)
    vocab = int(e.export["target"]["vocab_size"])
    p.write_text(json.dumps({"prompt_ids": [5, vocab - 1]}) + "\n" + json.dumps({"prompt_ids": [5, vocab]}) + "\n")
    with pytest.raises(UserError, match=rf"prompt 2 has token id {vocab}, outside the vocabulary \[0, {vocab}\)"):
        cb.run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=2, **args)


@pytest.mark.parametrize("share, warned", [(0.75, True), (0.25, False)])
def test_a_busy_machine_is_warned_of_past_half_its_cpus(tiny_engines, prompts_file, tmp_path, monkeypatch,  # noqa: F811
                                                        share, warned):
    """B34: a 1-minute load past half the CPUs at the start is warned of in the report."""
    import json
    import os

    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    cpus = os.cpu_count() or 1
    monkeypatch.setattr(cb.os, "getloadavg", lambda: (share * cpus, 0.0, 0.0))
    r = CliRunner().invoke(cb.bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                      "--peers", "none", "--governors", "off", "--max-new-tokens", "2", "--threads", "1",
                                      "--no-profile", "--warmup-tokens", "0", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r" / "bench.json").read_text())
    assert any(w.startswith("the machine was busy") for w in rep["warnings"]) == warned, rep["warnings"]


def test_an_engine_failure_is_named_in_the_report_without_a_traceback(overflowing, tmp_path):  # noqa: F811
    """An engine's +inf logits in a bench worker (a UserError: the engines are broken, not
    specrt) fail its configurations with the error and where it came (the warm-up, or the
    governor and prompt), in the FAILED line and the report's ``failed``, not "worker exited 1"
    and the last lines of a traceback; on every schedule. Exit 2: specrt's own configurations
    failed, as when they disagree."""
    import json

    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    eng, prompts = overflowing
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": prompts[False, True]}) + "\n")
    why = "EngineFailure: target engine produced +inf logits in row 0 of its call, "
    for extra, where in ((["--warmup-tokens", "4"], "the warm-up, on prompt 1"),
                         (["--warmup-tokens", "0"], "governor off, prompt 1"),
                         (["--warmup-tokens", "0", "--schedule", "sequential"], "prompt 1")):
        out = tmp_path / f"r{len(extra)}{where[0]}"
        r = CliRunner().invoke(cb.bench, [str(eng), "--prompts", str(p), "-o", str(out), "--peers", "none",
                                          "--governors", "off,fixed:1", "--max-new-tokens", "8", "--threads", "1",
                                          "--no-profile", "--quiet"] + extra)
        assert r.exit_code == 2 and "Traceback" not in r.output and "worker exited" not in r.output, r.output
        failed = json.loads((out / "bench.json").read_text())["failed"]
        assert set(failed) == {"specrt:off", "specrt:fixed:1"}, failed
        for e in failed.values():
            assert e.startswith(why) and e.endswith(f" ({where})") and "\n" not in e, (where, e)
