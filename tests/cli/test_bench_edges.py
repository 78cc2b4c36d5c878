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


# ---- a second mutation round (mutants C01-C90 of specrt/cmd_bench.py) --------------------


def test_a_workers_peak_rss_is_its_high_water_mark_in_bytes(tiny_engines, tmp_path):  # noqa: F811
    """C18 / C19: peak_rss_bytes is the worker's VmHWM in bytes (kB in /proc), not its RSS as it
    ends: memory touched and freed before the runs still counts. The worker runs in this process,
    after 200 MiB were touched and freed."""
    import json

    from specrt.cmd_bench import worker_main

    big = 200 << 20
    held = b"\x01" * big  # every page written
    del held
    job = {"kind": "specrt", "engines": str(tiny_engines), "governor": "off", "threads": 1, "prompts": [[5, 6, 7]],
           "max_new_tokens": 2, "eos": [2], "warmup_tokens": 0}
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert worker_main(str(tmp_path / "job.json"), str(tmp_path / "result.json")) == 0
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["ok"] and res["peak_rss_bytes"] >= res["rss_after_load_bytes"] > 0, res
    assert res["peak_rss_bytes"] >= res["rss_end_bytes"] + big // 2, res


def test_prediction_prices_at_the_mean_past_and_depth_one_as_a_verify():
    """C28 / C31: the cost table is read at the prompt's mean past (prompt + half the new
    tokens), and only depth 0 is a decode call: a round verifying one draft is verify.1."""
    from specrt.cmd_bench import predict

    class E:
        depths = (1, 2, 4)
        per_token = {"decode": 1.0, "verify.1": 2.0, "draft": 0.5}

        def cost(self, role, past):
            return self.per_token[role] * past

        def chain_costs(self, past):
            return {}

    p = predict(E(), {"new_tokens": 10, "draft_passes": 3, "depth_histogram": {"0": 2, "1": 3}}, prompt_len=5)
    past = 5 + 10 // 2
    assert p["target"] == pytest.approx(2 * 1.0 * past + 3 * 2.0 * past)
    assert p["draft"] == pytest.approx(3 * 0.5 * past)


def _rounds_record(mask_slots: int) -> dict:
    """One prompt's run: a round verifying 2 drafts (1 accepted) and a drafting round that
    verified none (DSpark's), 2 draft passes, its telemetry's seconds 0.5 split four ways."""
    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.engine_time("prefill", 0.1)
    t.record(RoundResult(depth=2, accepted=1, t_draft=0.05, t_verify=0.05))
    t.record(RoundResult(depth=0, accepted=0, t_draft=0.05, t_verify=0.05))
    t.finish(new_tokens=4, seconds=0.5)
    return {**t.to_json(), "output_ids": [1, 2, 3, 4], "draft_passes": 2, "mask_slots": mask_slots,
            "drafting_rounds": 2}


class _FlatCosts:
    depths = (1, 2)

    def cost(self, role, past):
        return 0.01


def test_passes_avoided_are_a_parallel_drafters_and_per_drafting_round():
    """C37 / C40 / C43: sequential passes avoided are counted for a drafter of a block a pass
    only (P-EAGLE's mask slots): EAGLE-3 drafts one token a pass and avoids none; per round they
    are over the rounds the draft ran (2 here), not those that verified a draft (1); and
    measured_over_predicted is measured tokens/s over predicted (above 1: faster than the table)."""
    from specrt.cmd_bench import summarise_config

    eagle3 = summarise_config("specrt:dspark", {"per_prompt": [_rounds_record(0)]}, [[7, 8]], _FlatCosts())
    assert eagle3["drafted"] == 2 and eagle3["draft_rounds"] == 1 and eagle3["sequential_passes_avoided"] == 0
    assert eagle3["sequential_passes_avoided_per_round"] == 0.0
    peagle = summarise_config("specrt:dspark", {"per_prompt": [_rounds_record(5)]}, [[7, 8]], _FlatCosts())
    assert peagle["sequential_passes_avoided"] == 1 and peagle["drafting_rounds"] == 2
    assert peagle["sequential_passes_avoided_per_round"] == pytest.approx(0.5)
    pr = peagle["predicted"]
    assert pr["measured_over_predicted"] == pytest.approx(pr["measured_tokens_per_s"] / pr["predicted_tokens_per_s"])
    assert pr["predicted_tokens_per_s"] == pytest.approx(3 / (2 * 0.01 + 2 * 0.01))  # 2 passes, decode + verify.2


def test_the_time_split_of_repeats_is_a_share_of_every_repeats_time():
    """C39: with --repeats the time split is summed over every repeat's run, so its fractions
    are of the summed wall time (they sum to 1), not of the prompt's median seconds (2x here)."""
    from specrt.cmd_bench import combine_repeats, summarise_config

    one = combine_repeats([_rounds_record(0), _rounds_record(0)])
    s = summarise_config("specrt:dspark", {"per_prompt": [one]}, [[7, 8]], _FlatCosts())
    assert s["seconds"] == pytest.approx(0.5) and s["time_split"]["prefill"] == pytest.approx(0.2)
    assert sum(s["time_split_fraction"].values()) == pytest.approx(1.0)
    assert s["time_split_fraction"]["prefill"] == pytest.approx(0.2)


def test_an_output_longer_than_the_references_has_no_reference_token_there():
    """C46: a configuration that goes on where the reference stopped (its EOS missed) differs at
    the reference's length: no reference token there, the configuration's own."""
    from specrt.cmd_bench import REFERENCE, identity

    row = identity({REFERENCE: [[1, 2]], "hf": [[1, 2, 3]]}, REFERENCE)["peer_mismatches"][0]
    assert (row["first_diff"], row["reference_token"], row["token"]) == (2, None, 3)


def test_interleaved_needs_a_fifth_of_the_memory_left():
    """C53 / C54: the workers fit when 1.5x the weights each is at most 80% of the available
    memory (exactly 80% fits), not when they would take all of it."""
    from specrt.cmd_bench import interleaved_fits

    gib = 2 ** 30
    need = 2 * 1.5 * gib
    assert 0.8 * (need / 0.8) == need  # (the boundary exact in floating point)
    assert interleaved_fits(2, gib, int(need / 0.8))
    assert not interleaved_fits(2, gib, int(need / 0.8) - 4096)
    assert not interleaved_fits(2, gib, int(need))  # all of it: nothing left to the machine


def test_the_memory_check_counts_every_process_of_every_worker(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                               monkeypatch):
    """C72 / C73: --processes 2 doubles the workers the interleaved schedule holds at once; when
    those do not fit, the run is sequential with one process a configuration (--processes
    ignored, said), and the report says so."""
    import json

    import specrt.cmd_bench as cb
    from specrt.engines.engine_set import load_engines

    w = load_engines(tiny_engines, verify=False).weight_bytes
    monkeypatch.setattr(cb, "mem_available", lambda: int(1.5 * w * 1.5 / 0.8))  # one worker fits, not two
    rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=2, governors="off", peers="none",
                       threads=1, warmup_tokens=0, quiet=True, profile=False, processes=2)
    assert rep["settings"]["schedule"] == "sequential" and rep["settings"]["processes"] == 1, rep["settings"]
    assert any("ran sequentially instead" in x and "(--processes 2 ignored)" in x for x in rep["warnings"])
    assert json.loads((tmp_path / "r" / "bench.json").read_text())["settings"]["processes"] == 1


def test_zero_threads_or_lookup_tokens_are_refused_and_the_largest_thread_count_taken(tiny_engines,  # noqa: F811
                                                                                      prompts_file, tmp_path,
                                                                                      monkeypatch):
    """C63 / C64 / C65 / C87: --threads 0 and --lookup-tokens 0 are refused (0 read as "not
    given" ran the default silently), --peers '' is refused (it ran no peer), and --threads at
    the limit passes the check (one more is refused)."""
    import re

    import specrt.cmd_bench as cb
    from specrt.errors import UserError
    from specrt.limits import MAX_THREADS

    args = dict(governors="off", profile=False, warmup_tokens=0)
    for kw, said in ((dict(threads=0), "--threads 0: expected >= 1"),
                     (dict(lookup_tokens=0), "--lookup-tokens 0: expected >= 1"),
                     (dict(threads=MAX_THREADS + 1), f"--threads {MAX_THREADS + 1}: expected at most {MAX_THREADS}"),
                     (dict(peers=""), "--peers '': expected a comma-separated list")):
        with pytest.raises(UserError, match=re.escape(said)):
            cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", **{"peers": "none", **args, **kw})

    def checked(*a, **k):  # every check passed: the report folder would be made now
        raise _Checked

    monkeypatch.setattr(cb, "atomic_folder", checked)
    with pytest.raises(_Checked):
        cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", peers="none", threads=MAX_THREADS, **args)
    assert not (tmp_path / "r").exists()


def test_a_negative_token_id_is_outside_the_vocabulary(tiny_engines, tmp_path):  # noqa: F811
    """C70: a prompt id below 0 is refused before anything runs, as one past the vocabulary is."""
    import json

    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt_ids": [5, 6]}) + "\n" + json.dumps({"prompt_ids": [5, -1]}) + "\n")
    with pytest.raises(UserError, match=r"prompt 2 has token id -1, outside the vocabulary \[0, "):
        run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=2, peers="none", governors="off", profile=False)
    assert not (tmp_path / "r").exists()


def test_lookup_tokens_default_to_the_largest_depth(report):  # noqa: F811
    """C69: without --lookup-tokens the peers' prompt lookup proposes the engines' largest depth."""
    assert report[0]["settings"]["lookup_tokens"] == max(report[0]["settings"]["depths"]) == 4


@pytest.mark.parametrize("threads, cores, warned", [(1, 1, False), (2, 1, True)])
def test_threads_are_warned_of_past_the_physical_cores_only(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                            monkeypatch, threads, cores, warned):
    """C71: --threads equal to the physical cores is no warning; one more is."""
    import specrt.cmd_bench as cb

    real = cb.machine_info
    monkeypatch.setattr(cb, "machine_info", lambda t: {**real(t), "physical_cores": cores})
    rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=2, governors="off", peers="none",
                       threads=threads, warmup_tokens=0, quiet=True, profile=False)
    said = [w for w in rep["warnings"] if w.startswith("--threads")]
    assert said == ([f"--threads {threads} exceeds the {cores} physical cores"] if warned else []), rep["warnings"]


def test_a_folder_named_like_a_plot_is_the_users(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """C68: --force replaces an earlier report's PNG files, but a folder named x.png is not one
    bench writes: refused, kept."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    out = tmp_path / "r"
    (out / "old.png").mkdir(parents=True)
    (out / "old.png" / "mine.txt").write_text("mine")
    (out / "bench.json").write_text("{}")
    with pytest.raises(UserError, match=r"holds old\.png/, which `specrt bench` does not write"):
        run_bench(tiny_engines, prompts_file, out, max_new_tokens=2, peers="none", governors="off", profile=False,
                  force=True)
    assert (out / "old.png" / "mine.txt").read_text() == "mine"


def test_a_failed_peer_is_reported_and_exits_0(tiny_engines, prompts_file, tmp_path, monkeypatch):  # noqa: F811
    """C78: only specrt's own configurations failing fail the bench (exit 2); a peer that failed
    is listed under failed and the run exits 0."""
    import json

    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    real = cb._run_interleaved

    def peer_failed(jobs, n, out, bar, results, skipped, failed, *a, **k):
        real(jobs, n, out, bar, results, skipped, failed, *a, **k)
        failed["hf"] = "RuntimeError: boom"

    monkeypatch.setattr(cb, "_run_interleaved", peer_failed)
    r = CliRunner().invoke(cb.bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                      "--peers", "none", "--governors", "off", "--max-new-tokens", "2", "--threads",
                                      "1", "--no-profile", "--warmup-tokens", "0", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0 and "FAIL:" not in r.output, r.output
    assert json.loads((tmp_path / "r" / "bench.json").read_text())["failed"] == {"hf": "RuntimeError: boom"}


def test_an_interrupted_bench_says_the_earlier_report_is_kept(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                              monkeypatch):
    """C80: interrupted with --force over an earlier report, before the new one was written: the
    earlier one is kept and said to be (not "after the report was written")."""
    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    out = tmp_path / "r"
    out.mkdir()
    (out / "bench.json").write_text('{"earlier": true}')

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cb, "_run_interleaved", stop)
    r = CliRunner().invoke(cb.bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers",
                                      "none", "--governors", "off", "--max-new-tokens", "2", "--no-profile", "--force"])
    assert r.exit_code != 0 and f"[interrupted: no report written; the earlier one in {out} is kept]" in r.output
    assert (out / "bench.json").read_text() == '{"earlier": true}'


def test_a_merged_worker_loaded_a_module_if_any_process_did():
    """C56: merge_process_results: a module (torch) that one process imported is reported loaded."""
    from specrt.cmd_bench import merge_process_results

    parts = [{"ok": True, "prompt_indices": [k], "per_prompt": [{"x": k}], "load_seconds": 1.0,
              "modules_loaded": {"torch": k == 1, "transformers": False}} for k in range(2)]
    assert merge_process_results(parts, 2)["modules_loaded"] == {"torch": True, "transformers": False}


def test_no_more_processes_than_prompts_are_started(tiny_engines, tmp_path):  # noqa: F811
    """C57: --processes 3 over 2 prompts starts two processes a worker (a third would load and
    warm the engines for no prompt)."""
    from specrt.cmd_bench import _run_interleaved

    job = {"kind": "specrt", "engines": str(tiny_engines), "threads": 1, "prompts": [[5, 6, 7], [9, 10, 11]],
           "max_new_tokens": 2, "eos": [2], "warmup_tokens": 0, "governor": "off"}
    results: dict = {}
    _run_interleaved([("specrt:off", job)], 2, tmp_path, None, results, {}, {}, lambda *a, **k: None, processes=3,
                     quiet=True)
    assert results["specrt:off"]["processes"] == 2
    assert sorted(f.name for f in (tmp_path / "logs").iterdir()) == ["specrt_1.log", "specrt_2.log"]


def test_mask_slots_count_the_positions_a_pass_drafts_beyond_its_first(tiny_engines):  # noqa: F811
    """C05: a P-EAGLE pass drafting a block of b fills b - 1 mask slots beside the hidden
    states it is given (the draft's input ids past its aux rows), not every input id."""
    from specrt.cmd_bench import _SpecrtWorker

    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["fixed:4"], "threads": 1})
    try:
        rec = w.run([5, 6, 7, 8, 9, 10], 12, [2])
    finally:
        w.close()
    blocks = {int(b): n for b, n in rec["draft_block_histogram"].items()}
    assert max(blocks) == 4 and rec["draft_passes"] == sum(blocks.values()), rec
    assert rec["mask_slots"] == sum((b - 1) * n for b, n in blocks.items()) > 0, rec


def test_governors_in_one_worker_prefill_every_prompt_afresh(tiny_engines):  # noqa: F811
    """C06: governors taking turns on a prompt in a shared worker each prefill it from an empty
    cache, as the peers do: the second reuses none of the first's prefix (it would otherwise
    skip most of its prefill, and its time)."""
    from specrt.cmd_bench import _SpecrtWorker

    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["off", "fixed:2"], "threads": 1})
    try:
        prompt = list(range(5, 40))
        first, second = w.run(prompt, 4, [2], "off"), w.run(prompt, 4, [2], "fixed:2")
    finally:
        w.close()
    assert first["output_ids"] == second["output_ids"]
    assert first["prefix_reused"] == second["prefix_reused"] == 0, (first["prefix_reused"], second["prefix_reused"])


@pytest.mark.parametrize("schedule, failing_run, warmup", [
    ("sequential", 2, 0), ("interleaved", 2, 0), ("sequential", 1, 1), ("interleaved", 1, 1)],
    ids=["sequential-run", "interleaved-run", "sequential-warm-up", "interleaved-warm-up"])
def test_the_progress_bar_ends_at_its_total_when_a_configuration_fails(tiny_engines, prompts_file,  # noqa: F811
                                                                       tmp_path, monkeypatch, schedule, failing_run,
                                                                       warmup):
    """C75: the bar counts every run of every prompt; a configuration that fails counts its runs
    not made, once: the bar ends at its total. Sequentially a failure part-way went past it (by
    the runs made before), and interleaved a worker failing its warm-up left the bar short by
    all its configurations' runs (both found by this test; C75 left it short by the repeats)."""
    import json

    from click.testing import CliRunner

    import specrt.cmd_bench as cb

    pytest.importorskip("tqdm")
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(  # fixed:2's failing_run-th stream raises (the warm-up's is the first)
        "import specrt.runtime.session as S\n"
        "_stream, _runs = S.Session.stream_ids, []\n"
        "def stream_ids(self, ids, *a, **k):\n"
        "    if getattr(self.generator.governor, 'k', None) == 2:\n"
        "        _runs.append(1)\n"
        f"        if len(_runs) == {failing_run}:\n"
        "            raise RuntimeError('injected')\n"
        "    return _stream(self, ids, *a, **k)\n"
        "S.Session.stream_ids = stream_ids\n")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    bars = []
    progress = cb._progress
    monkeypatch.setattr(cb, "_progress", lambda total, quiet: bars.append(progress(total, quiet)) or bars[-1])
    out = tmp_path / "r"
    r = CliRunner().invoke(cb.bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers",
                                      "none", "--governors", "off,fixed:2", "--max-new-tokens", "2", "--threads", "1",
                                      "--no-profile", "--warmup-tokens", str(warmup), "--repeats", "2", "--schedule",
                                      schedule])
    assert r.exit_code == 2, r.output
    assert "fixed:2" in " ".join(json.loads((out / "bench.json").read_text())["failed"])
    assert bars[-1].total == 2 * 2 * 2 and bars[-1].n == bars[-1].total, (bars[-1].n, bars[-1].total)


def test_a_tree_round_without_target_depths_is_costed_at_its_drafts_and_runners_up():
    """C30: a report written before the target depths were recorded: a tree round verifying d
    drafts with W - 1 runners-up calls the target on d + W - 1 + 1 rows, verify.{d + W - 1}
    (depth 1, width 2: verify.2, not verify.3 costed as verify.4)."""
    from specrt.cmd_bench import predict

    class E:
        depths = (1, 2, 4)
        costs = {"draft": 0.01, "decode": 0.02, "verify.1": 0.03, "verify.2": 0.04, "verify.4": 0.05}

        def cost(self, role, past):
            return self.costs[role]

        def chain_costs(self, past):
            return {}

    rec = {"new_tokens": 12, "draft_passes": 5, "depth_histogram": {"1": 5}, "tree": {"rounds": 5}}
    assert predict(E(), rec, prompt_len=5, tree_width=2)["target"] == pytest.approx(5 * 0.04)


def test_a_first_repeat_without_tokens_keeps_the_median_seconds():
    """C24: repeats of different lengths are timed at their own rates, scaled to the first's
    count; a first repeat that made no token has no count to scale to: the prompt's seconds
    stay the median of the repeats' (not 0 s, which left it out of the total rate's time)."""
    from specrt.cmd_bench import combine_repeats

    one = combine_repeats([{"new_tokens": 0, "seconds": 0.5}, {"new_tokens": 10, "seconds": 1.0},
                           {"new_tokens": 20, "seconds": 2.0}])
    assert one["seconds"] == pytest.approx(1.0) and one["tokens_per_s"] == 0.0
    assert one["new_tokens_by_repeat"] == [0, 10, 20]


def test_every_prompt_a_later_repeat_changed_is_taken_off_the_identical_count():
    """C52: identical_prompts counts the prompts every repeat of which matched: two prompts
    differing in later repeats (one of them in two) take two off, not one."""
    from specrt.cmd_bench import count_every_repeat

    def row(prompt, repeat):
        return {"config": "specrt:fixed:2", "reference": "repeat 1", "repeat": repeat, "prompt": prompt,
                "identical": False}

    ident = {"configs": {"specrt:fixed:2": {"identical_prompts": 3, "prompts": 3}},
             "failures": [row(0, 2), row(2, 2), row(2, 3)], "peer_mismatches": [], "repeat_mismatches": []}
    count_every_repeat(ident)
    assert ident["configs"]["specrt:fixed:2"] == {"identical_prompts": 1, "identical_prompts_first_repeat": 3,
                                                  "prompts": 3}


def test_a_variant_differing_from_its_own_off_names_its_offs_token_as_the_reference():
    """C50: a variant at another precision is compared with its own off: the failure's
    reference_token is that off's token, token the variant configuration's."""
    from specrt.cmd_bench import REFERENCE, identity

    outs = {REFERENCE: [[1, 2, 3]], "specrt:off@q8": [[1, 2, 4]], "specrt:fixed:2@q8": [[1, 2, 9]]}
    ident = identity(outs, REFERENCE, {"specrt:off@q8": "specrt:off@q8", "specrt:fixed:2@q8": "specrt:off@q8"})
    (f,) = ident["failures"]
    assert (f["config"], f["reference"], f["first_diff"], f["reference_token"], f["token"]) == (
        "specrt:fixed:2@q8", "specrt:off@q8", 2, 4, 9)


def test_one_configurations_failure_is_said_as_its_own(capsys):
    """C61: a worker of one configuration (a peer's) that fails is said as that configuration's,
    "FAILED hf: ...", not as a shared worker's "(one worker process ran them)"."""
    from specrt.cmd_bench import _record_group

    failed: dict = {}
    _record_group({"ok": False, "error": "RuntimeError: boom"}, {"hf": ""}, {}, {}, failed, print)
    assert failed == {"hf": "RuntimeError: boom"}
    err = capsys.readouterr().err
    assert "FAILED hf: RuntimeError: boom" in err and "one worker process" not in err, err


def test_off_is_run_as_the_reference_when_the_governors_leave_it_out(tiny_engines, prompts_file,  # noqa: F811
                                                                      tmp_path):
    """C66: --governors without off still runs specrt:off first, the reference every other
    configuration's tokens are checked against (without it nothing was compared)."""
    from specrt.cmd_bench import REFERENCE, run_bench

    rep = run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=3, governors="fixed:2", peers="none",
                    threads=1, warmup_tokens=0, quiet=True, profile=False)
    assert rep["settings"]["governors"] == ["off", "fixed:2"] and list(rep["configs"]) == [REFERENCE, "specrt:fixed:2"]
    assert rep["identity"]["reference"] == REFERENCE
    assert rep["identity"]["configs"]["specrt:fixed:2"]["identical_prompts"] == 2


def test_a_variant_at_the_engines_precision_answers_to_specrt_off(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """C67 / C77: a variant built at the same precision on the same backend must give
    specrt:off's tokens (a difference fails the bench); the report names specrt:off as its
    identity reference (only another precision or backend answers to its own off)."""
    import shutil

    from specrt.cmd_bench import REFERENCE, run_bench

    copy = tmp_path / "copy"
    shutil.copytree(tiny_engines, copy)
    rep = run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=2, governors="off", peers="none",
                    threads=1, warmup_tokens=0, quiet=True, profile=False, variants={"c": copy})
    assert rep["settings"]["variants"]["c"]["identity_reference"] == REFERENCE
    assert rep["identity"]["configs"]["specrt:off@c"]["identical_prompts"] == 2 and rep["identity"]["failures"] == []


def test_a_sequential_runs_worker_logs_are_in_its_report_folder(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """C79: the sequential schedule's workers log into the temporary folder renamed to -o at the
    end, as the interleaved ones do: each configuration's log is in the report folder."""
    from specrt.cmd_bench import run_bench

    out = tmp_path / "r"
    run_bench(tiny_engines, prompts_file, out, max_new_tokens=2, governors="off,fixed:2", peers="none", threads=1,
              warmup_tokens=0, quiet=True, profile=False, schedule="sequential")
    assert sorted(p.name for p in (out / "logs").iterdir()) == ["specrt_fixed_2.log", "specrt_off.log"]
    assert [p.name for p in tmp_path.iterdir()] == ["r"]


def test_interleaved_transformers_peers_keep_openmps_idle_wait(report):  # noqa: F811
    """C82: interleaved, the transformers peers (OpenMP threads) are not told to spin with the
    engines: an idle worker's spinning threads would take the cores from the one running."""
    st = report[0]["settings"]
    ran = [p for p in ("hf", "hf-lookup") if p in report[0]["configs"]]
    if not ran:
        pytest.skip(f"no transformers peer ran: {report[0]['skipped']}")
    assert st["schedule"] == "interleaved" and st["peer_spin"] is True
    assert {p: st["peer_spin_by_peer"][p] for p in ran} == dict.fromkeys(ran, None)


def test_a_variant_needs_a_label_and_a_folder_and_each_label_once():
    """C84 / C85: --variant LABEL=DIR with either side empty is refused as such, and a label given
    twice is refused (the second folder silently replaced the first)."""
    from pathlib import Path

    from specrt.cmd_bench import _parse_variants
    from specrt.errors import UserError

    assert _parse_variants(["a=x", "b=y"]) == {"a": Path("x"), "b": Path("y")}
    for bad in ("=x", "a=", "a"):
        with pytest.raises(UserError, match=f"--variant '{bad}': expected LABEL=DIR"):
            _parse_variants([bad])
    with pytest.raises(UserError, match="--variant a: given twice"):
        _parse_variants(["a=x", "a=y"])


def test_the_reference_comes_first_in_the_report(report):  # noqa: F811
    """C86: configurations are ordered the reference first (specrt:off: its worker loads first,
    its row heads the table), then the peer baselines, then the speculative ones."""
    rep, _, text = report
    names = list(rep["configs"])
    assert names[0] == "specrt:off", names
    lines = text.splitlines()
    table = lines[next(i for i, x in enumerate(lines) if x.startswith("configuration")) + 1:]
    assert table[0].split()[0] == "specrt:off", table


def test_an_interleaved_worker_left_short_in_a_later_repeat_says_which(tiny_engines, tmp_path):  # noqa: F811
    """C89: the interleaved worker checks every repeat's prompts before combining them: one
    ended with a prompt of repeat 2 unrun is an error naming that repeat (a KeyError before)."""
    from specrt.cmd_bench import InterleavedWorker

    job = {"kind": "specrt", "engines": str(tiny_engines), "governor": "off", "threads": 1,
           "prompts": [[5, 6, 7], [9, 10, 11]], "max_new_tokens": 2, "eos": [2], "warmup_tokens": 0, "repeats": 2}
    w = InterleavedWorker(job, tmp_path / "w.log")
    assert w.warm() and w.run(0) and w.run(1)
    w.repeat(1)
    assert w.run(1)
    res = w.finish()
    assert not res["ok"] and "ended after prompts [1] of 2 in repeat 2 of 2" in res["error"], res


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc, sets the affinity")
def test_the_reports_machine_is_read_from_proc():
    """specrt bench's report names the machine its numbers came from (specrt/machine.py): the
    CPU's model name where Python's platform gives none ("unknown" on Linux), the memory in
    bytes (/proc/meminfo counts kB), the ISA flags the CPU has, the packages' versions and the
    CPUs the process may run on. Only the keys were checked, so a report of "unknown", of kB,
    or of missing flags passed."""
    import importlib.metadata
    import platform
    import subprocess
    import sys
    from pathlib import Path

    from specrt.machine import machine_info

    info = machine_info(3)
    cpuinfo = [ln.partition(":") for ln in Path("/proc/cpuinfo").read_text().splitlines()]
    names = [v.strip() for k, _, v in cpuinfo if k.strip() == "model name"]
    flags = next((set(v.split()) for k, _, v in cpuinfo if k.strip() == "flags"), set())
    if names and platform.processor() in ("", "unknown", "x86_64"):
        assert info["cpu_model"] == names[0]
    kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal:"))
    assert info["memory_bytes"] == kb * 1024 and info["threads"] == 3
    assert info["isa"] == [f for f in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                                       "avx512_bf16", "amx_tile") if f in flags]
    assert info["versions"]["numpy"] == importlib.metadata.version("numpy")
    # a process held to one CPU (taskset, a batch job's cpuset) reports 1 in its affinity, not the machine's count
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from specrt.machine import machine_info; print(machine_info(1)['cpus_in_affinity'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "1", (r.stdout, r.stderr)
