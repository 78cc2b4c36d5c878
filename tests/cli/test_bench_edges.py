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
    import re

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
    # (naming the prompts file, as the vocabulary's check below does: a walk, session 70)
    said = re.escape(f"{p}:1: prompt 1 (3 tokens) + --max-new-tokens {e.max_context - 2} exceeds")  # (and its line)
    with pytest.raises(UserError, match="^" + said):
        cb.run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=e.max_context - 2, **args)
    vocab = int(e.export["target"]["vocab_size"])
    p.write_text(json.dumps({"prompt_ids": [5, vocab - 1]}) + "\n" + json.dumps({"prompt_ids": [5, vocab]}) + "\n")
    with pytest.raises(UserError, match=rf"prompt 2 has token id {vocab}, outside the vocabulary \[0, {vocab}\)"):
        cb.run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=2, **args)


@pytest.mark.parametrize("share, warned", [(0.75, True), (0.5, False), (0.25, False)])  # (M113: half is not past it)
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
    import specrt.engines.onnxruntime as ort

    monkeypatch.setattr(ort, "physical_cores", lambda: cores)
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
    # (and the machine's own count as its logical CPUs, not the affinity's)
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); from specrt.machine import "
            "machine_info; i = machine_info(1); print(i['cpus_in_affinity'], i['logical_cpus'] == os.cpu_count())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "1 True", (r.stdout, r.stderr)


def test_the_reports_machine_names_its_platform_and_cpu_limit(monkeypatch):
    """The rest of the report's machine (mutants of specrt/machine.py survived each): the
    physical cores and the cgroup's CPU limit each as specrt.engines.onnxruntime reads them
    (a limit here stands in for a container's), the OS, Python, the load at the start, every
    package's version (None for one not installed), and /proc's model name where Python's
    platform names only the architecture ("x86_64")."""
    import importlib.metadata
    import platform
    from pathlib import Path

    import specrt.engines.onnxruntime as ort
    from specrt.machine import dist_version, machine_info

    monkeypatch.setattr(ort, "cgroup_cpu_limit", lambda: 1.5)
    monkeypatch.setattr(platform, "processor", lambda: "x86_64")
    info = machine_info(1)
    assert info["physical_cores"] == ort.physical_cores() and info["cgroup_cpu_limit"] == 1.5
    assert (info["os"], info["python"]) == (platform.platform(), platform.python_version())
    load = info["load_average_at_start"]
    assert len(load) == 3 and all(isinstance(x, float) and x >= 0 for x in load)
    assert set(info["versions"]) == {"specrt", "numpy", "onnxruntime", "onnxruntime-genai", "llama-cpp-python",
                                     "torch", "transformers", "tokenizers"}
    assert info["versions"]["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert dist_version("specrt-no-such-package") is None
    names = [v.strip() for k, _, v in (ln.partition(":") for ln in Path("/proc/cpuinfo").read_text().splitlines())
             if k.strip() == "model name"]
    if names:
        assert info["cpu_model"] == names[0]


# ---- a second round (session 62): the summary's figures, identity rows, report folder ----


def _two_round_record() -> dict:
    """One prompt's run whose figures all differ: a round verifying 2 drafts (both accepted), one
    verifying 2 (none accepted), one plain decode step; 3 draft passes, 3 rounds."""
    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.engine_time("prefill", 0.05)
    t.record(RoundResult(depth=2, accepted=2, t_draft=0.01, t_verify=0.02))
    t.record(RoundResult(depth=2, accepted=0, t_draft=0.01, t_verify=0.02))
    t.record(RoundResult(depth=0, accepted=0, t_draft=0.01, t_verify=0.03))
    t.finish(new_tokens=6, seconds=0.4)
    return {**t.to_json(), "output_ids": [1] * 6, "draft_passes": 3, "mask_slots": 0, "drafting_rounds": 3,
            "finish_reason": "length", "new_tokens_by_repeat": [6, 5], "process": 1}


class _PastCosts:
    """A cost table whose every price grows with the past length, so that a prediction read at
    another past shows."""
    depths = (1, 2)

    def cost(self, role, past):
        return {"draft": 0.001, "decode": 0.002, "verify.1": 0.003, "verify.2": 0.004}[role] * past


def test_the_summary_takes_each_figure_from_its_own_field():
    """D03 / D05-D08 / D12-D15 / D17 / D18 / D21-D23 / D25 / D26: every figure of a
    configuration's summary is the worker's or the telemetry's own field (RSS after load not the
    end's, peak RSS VmHWM not ru_maxrss, load average start and end in order, conditional
    acceptance not the unconditional, every round not the drafting ones, drafted not accepted,
    the decode steps' depth-0 count kept), each prompt's record keeps its finish reason and
    repeat counts, and the prediction's seconds are the table's at the prompt's own mean past,
    draft included, beside the measured decode phase."""
    from specrt.cmd_bench import predict, summarise_config

    rec = _two_round_record()
    res = {"per_prompt": [rec], "peak_rss_bytes": 300, "ru_maxrss_bytes": 400, "rss_after_load_bytes": 100,
           "rss_end_bytes": 200, "load_seconds": 1.5, "load_average_start": [1.0, 2.0, 3.0],
           "load_average_end": [4.0, 5.0, 6.0], "ort_threads": 3, "priced_costs": {"0": 0.01}}
    s = summarise_config("specrt:fixed:2", res, [[7, 8, 9, 10]], _PastCosts())
    assert (s["peak_rss_bytes"], s["rss_after_load_bytes"], s["load_seconds"]) == (300, 100, 1.5)
    assert s["load_average"] == {"start": [1.0, 2.0, 3.0], "end": [4.0, 5.0, 6.0]}
    assert s["ort_threads"] == 3 and s["priced_costs"] == {"0": 0.01}
    pp = s["per_prompt"][0]
    assert pp["finish_reason"] == "length" and pp["new_tokens_by_repeat"] == [6, 5] and pp["process"] == 1
    assert s["acceptance_by_position"] == [0.5, 0.5] and s["acceptance_conditional"] == [0.5, 1.0]
    assert (s["rounds"], s["draft_rounds"], s["drafted"], s["accepted"]) == (3, 2, 4, 2)
    assert s["depth_histogram"] == {"0": 1, "2": 2}  # (the plain decode step counted at depth 0)
    pr = s["predicted"]
    p = predict(_PastCosts(), rec, 4)
    assert p["draft"] > 0 and pr["predicted_seconds"] == pytest.approx(p["draft"] + p["target"])
    assert pr["decode_tokens"] == 5 and pr["measured_seconds"] == pytest.approx(0.4 - 0.05)
    assert pr["engines_seconds"] == pytest.approx(0.03 + 0.07)


def test_efficiency_takes_offs_figures_and_each_configurations_own():
    """E01-E05: (a) holds specrt:off's python share and peak RSS and onnxruntime-genai's own
    rate and peak RSS (each from its own configuration), and is absent when onnxruntime-genai
    made no tokens (a ratio over 0 tok/s was a ZeroDivisionError after every run); (b) gives
    each specrt configuration its own tau, tokens a target call (w73e) and python share."""
    from specrt.cmd_bench import REFERENCE, efficiency

    pred = {"predicted_tokens_per_s": 10.0}
    off = {"tokens_per_s_median": 10.0, "python_share": 0.1, "peak_rss_bytes": 5, "peak_rss_of": [REFERENCE],
           "tau": 1.0, "predicted": pred, "time_split_fraction": {"verify": 0.7}}
    fx = {"tokens_per_s_median": 15.0, "python_share": 0.2, "peak_rss_bytes": 5, "tau": 2.5, "predicted": pred,
          "time_split_fraction": {"verify": 0.5}, "tokens_per_call": 3.0}
    og = {"tokens_per_s_median": 20.0, "python_share": 0.3, "peak_rss_bytes": 4}
    e = efficiency({REFERENCE: off, "specrt:fixed:2": fx, "ortgenai": og})
    a = e["a_off_vs_ortgenai"]
    assert (a["specrt_off_tokens_per_s"], a["ortgenai_tokens_per_s"], a["ratio"]) == (10.0, 20.0, 0.5)
    assert a["specrt_off_python_share"] == 0.1 and a["ortgenai_peak_rss_bytes"] == 4
    assert e["b_predicted_vs_measured"]["specrt:fixed:2"] == {**pred, "tau": 2.5, "tokens_per_call": 3.0,
                                                               "python_share": 0.2}
    assert e["b_predicted_vs_measured"][REFERENCE]["python_share"] == 0.1 and "ortgenai" not in e[
        "b_predicted_vs_measured"]
    assert efficiency({REFERENCE: off, "ortgenai": {**og, "tokens_per_s_median": 0.0}})["a_off_vs_ortgenai"] is None


def test_identity_rows_say_nothing_differs_where_nothing_does():
    """I01 / I02 / I05 / I06 / I07: a prompt whose tokens match has no first difference (None, not its
    length) and no tokens named; a differing row gives each side's own length; a variant's
    prompts that match its own off are no failures; the pairwise counts hold each configuration
    with itself (every prompt); and a variant whose own off failed (absent from the outputs) is
    compared with nothing rather than raising."""
    from specrt.cmd_bench import REFERENCE, identity

    outs = {REFERENCE: [[1, 2, 3], [4, 5]], "hf": [[1, 2, 3], [4, 5, 6, 7]],
            "specrt:off@q8": [[1, 2, 3], [4, 9]], "specrt:fixed:2@q8": [[1, 2, 3], [4, 8]]}
    own = {"specrt:off@q8": "specrt:off@q8", "specrt:fixed:2@q8": "specrt:off@q8"}
    ident = identity(outs, REFERENCE, own)
    same, longer = ident["configs"]["hf"]["per_prompt"]
    assert same == {"prompt": 0, "identical": True, "identical_prefix": 3, "first_diff": None, "len_reference": 3,
                    "len": 3}
    assert (longer["len_reference"], longer["len"], longer["first_diff"], longer["token"]) == (2, 4, 2, 6)
    assert [(f["config"], f["prompt"], f["reference"]) for f in ident["failures"]] == [
        ("specrt:fixed:2@q8", 1, "specrt:off@q8")]
    assert ident["pairwise_identical_prompts"][REFERENCE] == {REFERENCE: 2, "hf": 1, "specrt:off@q8": 1,
                                                              "specrt:fixed:2@q8": 1}
    del outs["specrt:off@q8"]  # its worker failed: its configurations' rows are not made
    assert identity(outs, REFERENCE, own)["failures"] == []


def test_a_prompt_differing_in_its_first_and_a_later_repeat_is_taken_off_once():
    """I10 / I11 / I12: identical_prompts already lacks a prompt whose first repeat differed (a
    specrt failure or a peer's mismatch); a later repeat differing too takes nothing more off;
    and a configuration whose later repeats all matched has no identical_prompts_first_repeat."""
    from specrt.cmd_bench import count_every_repeat

    def row(config, prompt, repeat=None):
        return {"config": config, "prompt": prompt, "identical": False,
                **({"reference": "repeat 1", "repeat": repeat} if repeat else {})}

    ident = {"configs": {"specrt:fixed:2": {"identical_prompts": 2, "prompts": 3},
                         "hf": {"identical_prompts": 2, "prompts": 3},
                         "specrt:adaptive": {"identical_prompts": 3, "prompts": 3}},
             "failures": [row("specrt:fixed:2", 1), row("specrt:fixed:2", 1, 2)],
             "peer_mismatches": [row("hf", 0)], "repeat_mismatches": [row("hf", 0, 2)]}
    count_every_repeat(ident)
    assert ident["configs"] == {"specrt:fixed:2": {"identical_prompts": 2, "prompts": 3},
                                "hf": {"identical_prompts": 2, "prompts": 3},
                                "specrt:adaptive": {"identical_prompts": 3, "prompts": 3}}


def test_a_repeat_without_a_first_token_time_leaves_the_firsts():
    """R01: first_token_s is the median over repeats only when every repeat has one (a peer's
    record has none): one missing keeps the first repeat's, rather than raising on None."""
    from specrt.cmd_bench import combine_repeats

    one = combine_repeats([{"new_tokens": 3, "seconds": 0.3, "first_token_s": 0.05},
                           {"new_tokens": 3, "seconds": 0.1, "first_token_s": None},
                           {"new_tokens": 3, "seconds": 0.2, "first_token_s": 0.01}])
    assert one["first_token_s"] == 0.05 and one["seconds"] == pytest.approx(0.2)


def test_a_processes_merge_ends_with_the_last_process_and_returns_a_skipped_one():
    """P01 / P02 / P03 / P06: the merged load average at the end is the last process's; an RSS figure
    one process lacks is left as the first's rather than a max over None; and a process whose
    peer was skipped makes the worker's result that skip (not per-prompt records it lacks); processes
    that ran fewer prompts than asked are said as such, naming those that ran."""
    from specrt.cmd_bench import merge_process_results

    parts = [{"ok": True, "prompt_indices": [k], "per_prompt": [{"x": k}], "load_seconds": 1.0,
              "load_average_end": [float(k)], "peak_rss_bytes": 100 * (k + 1)} for k in range(3)]
    parts[0]["rss_end_bytes"] = 7
    got = merge_process_results(parts, 3)
    assert got["load_average_end"] == [2.0] and got["peak_rss_bytes"] == 300 and got["rss_end_bytes"] == 7
    skipped = {"ok": False, "skipped": "onnxruntime-genai not installed"}
    assert merge_process_results([parts[0], skipped], 2) is skipped
    with pytest.raises(RuntimeError, match=r"the processes ran prompts \[0, 2\] of 3"):  # P03: one lost its prompt
        merge_process_results([parts[0], {**parts[2], "prompt_indices": [2]}], 3)


def test_the_stale_table_hint_starts_past_ten_percent():
    """X01: the summary's hint that the machine changed since the cost table was profiled is
    said when off's engine calls ran more than 10% off the table (15% off: said; 5%: not)."""
    import copy
    import json
    from pathlib import Path

    from specrt.cmd_bench import REFERENCE, print_summary

    rep = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                     .read_text())
    rep["settings"]["prediction_costs"] = "the engines' stored cost tables"
    for ratio, said in ((0.85, True), (0.95, False), (1.05, False), (1.15, True)):
        r = copy.deepcopy(rep)
        b = r["efficiency"]["b_predicted_vs_measured"][REFERENCE]
        b["engines_tokens_per_s"] = ratio * b["predicted_tokens_per_s"]
        lines: list[str] = []
        print_summary(r, Path("out"), echo=lambda s="", **kw: lines.append(s))
        assert any("specrt profile" in x for x in lines) == said, (ratio, lines)


def test_the_python_apis_schedule_and_governor_costs_are_named_when_wrong(tmp_path):
    """V08 / V09: run_bench's schedule and governor_costs (the CLI's choices check them there)
    are refused before anything loads, naming the option and what it takes."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_ids": [1]}\n')
    with pytest.raises(UserError, match=r"^--schedule both: expected one of interleaved, sequential$"):
        run_bench(tmp_path / "nothing", prompts, tmp_path / "r", schedule="both")
    with pytest.raises(UserError, match=r"^--governor-costs 'fresh': expected stored or profiled$"):
        run_bench(tmp_path / "nothing", prompts, tmp_path / "r", governor_costs="fresh")
    assert not (tmp_path / "r").exists()


def test_a_report_folder_with_many_foreign_files_names_five_then_dots(tiny_engines, prompts_file,  # noqa: F811
                                                                      tmp_path):
    """V01 / V02: a report folder holding files bench never writes is refused naming them: the
    first five (sorted) and ", ..." when there are more, all of them when five."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    out = tmp_path / "r"
    out.mkdir()
    (out / "bench.json").write_text("{}")
    for name in "abcde":
        (out / f"{name}.txt").write_text("mine")
    kw = dict(peers="none", governors="off", force=True, quiet=True, profile=False)
    with pytest.raises(UserError, match=r"holds a\.txt, b\.txt, c\.txt, d\.txt, e\.txt, which "):
        run_bench(tiny_engines, prompts_file, out, **kw)
    (out / "f.txt").write_text("mine")
    with pytest.raises(UserError, match=r"holds a\.txt, b\.txt, c\.txt, d\.txt, e\.txt, \.\.\., which "):
        run_bench(tiny_engines, prompts_file, out, **kw)
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt", "bench.json", "c.txt", "d.txt", "e.txt",
                                                      "f.txt"]


def test_a_prompts_report_text_is_its_ids_or_its_conversation():
    """S02 / S03: the report's text of a prompt_ids line is its first 60 ids; of a conversation,
    its messages as JSON (not the empty 'prompt' it lacks)."""
    from specrt.cmd_bench import _prompt_label

    assert _prompt_label({"prompt_ids": list(range(100))}) == "ids: " + " ".join(map(str, range(60)))[:195]
    msgs = [{"role": "user", "content": "héllo"}]
    assert _prompt_label({"messages": msgs}) == '[{"role": "user", "content": "héllo"}]'
    assert _prompt_label({"prompt": "x" * 300}) == "x" * 200


def test_a_reports_settings_prompts_and_repeats_are_the_runs_own(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """S01 / S04 / S07 / D07 / D09 / D10 / D11: the report's context limit is the engines', a greedy
    run's settings name no sampling, each prompt's token count is its ids'; each prompt's record
    says why it ended; and each repeat's entry under by_repeat holds its own accepted count,
    accepted_at at every position (their sum) and its prompt-lookup rounds (none under fixed:2),
    not its draft rounds."""
    import json

    from specrt.cmd_bench import run_bench
    from specrt.engines.engine_set import load_engines

    rep = run_bench(tiny_engines, prompts_file, tmp_path / "r", governors="fixed:2", peers="none", max_new_tokens=6,
                    repeats=2, profile=False, warmup_tokens=0, threads=1, quiet=True)
    assert rep == json.loads((tmp_path / "r" / "bench.json").read_text())
    assert rep["settings"]["max_context"] == load_engines(tiny_engines, verify=False).max_context
    assert rep["settings"]["greedy"] is True and rep["settings"]["sampling"] is None  # (sampling: a sampled run's)
    ids = [json.loads(line)["prompt_ids"] for line in prompts_file.read_text().splitlines()]
    assert [(p["index"], p["tokens"], p["kind"]) for p in rep["prompts"]] == [(i, len(x), "ids") for i, x in
                                                                               enumerate(ids)]
    c = rep["configs"]["specrt:fixed:2"]
    assert c["draft_rounds"] > 0
    for pp in c["per_prompt"]:
        assert pp["finish_reason"] in ("length", "eos"), pp
        assert len(pp["by_repeat"]) == 2
        for x in pp["by_repeat"]:
            assert x["lookup_rounds"] == 0 and sum(x["accepted_at"]) == x["accepted"], x
            assert len(x["accepted_at"]) == len(c["acceptance_by_position"]) == 2, x  # (every position, the first too)
    assert sum(x["accepted"] for pp in c["per_prompt"] for x in pp["by_repeat"]) == c["accepted"]


def test_a_variant_whose_context_the_prompts_fill_exactly_is_taken(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """V05: a --variant's own context limit is checked as ENGINES' is: a prompt + --max-new-tokens
    equal to it is taken (12 + 4 on a variant of 16), one more refused."""
    import specrt.cmd_bench as cb
    from specrt.engines.build import build_engines
    from specrt.errors import UserError

    build_engines(tiny_engines.parent / "export", "onnxruntime", (1, 2, 4), tmp_path / "short", profile_repeats=1,
                  max_context=16, log=lambda m: None)

    def checked(*a, **k):  # every check passed: the report folder would be made now
        raise _Checked

    monkeypatch.setattr(cb, "atomic_folder", checked)
    args = dict(peers="none", governors="off", profile=False, warmup_tokens=0, threads=1,
                variants={"short": tmp_path / "short"})
    with pytest.raises(_Checked):
        cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=4, **args)
    with pytest.raises(UserError, match=r"--variant short: prompt 1 \(12 tokens\) \+ --max-new-tokens 5 exceeds"):
        cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=5, **args)


def test_a_run_of_no_measurable_time_gives_rates_of_zero():
    """D01 / D02 / D16 / D19: a prompt timed at 0 seconds (a peer's clock, a run that made no
    token) has a rate of 0, as has the total, rather than a ZeroDivisionError after every run;
    a specrt configuration's python share is then 0, and a cost table of zeros predicts no rate
    (None, which the summary leaves out) rather than 0 tok/s."""
    from specrt.cmd_bench import summarise_config
    from specrt.runtime.telemetry import Telemetry

    s = summarise_config("hf", {"per_prompt": [{"new_tokens": 0, "seconds": 0.0, "output_ids": []}]}, [[1]], None)
    assert s["tokens_per_s_per_prompt"] == [0.0] and s["tokens_per_s_median"] == 0.0
    assert s["tokens_per_s_total"] == 0.0

    class Free:
        depths = (1,)

        def cost(self, role, past):
            return 0.0

    t = Telemetry()
    t.finish(new_tokens=1, seconds=0.0)
    rec = {**t.to_json(), "output_ids": [1], "draft_passes": 0, "mask_slots": 0}
    s = summarise_config("specrt:off", {"per_prompt": [rec]}, [[7]], Free())
    assert s["tokens_per_s_median"] == 0.0 and s["python_share"] == 0.0
    assert s["predicted"]["predicted_tokens_per_s"] is None and s["predicted"]["measured_over_predicted"] is None


# ---- a mutation round of session 69 (mutants M001-M180 of specrt/cmd_bench.py) ---------


def test_a_prompts_first_token_time_is_the_median_of_its_repeats():
    """M008: first_token_s over repeats is their median, not the last repeat's (the only test
    had the median last)."""
    from specrt.cmd_bench import combine_repeats

    one = combine_repeats([{"new_tokens": 3, "seconds": 0.3, "first_token_s": 0.04},
                           {"new_tokens": 3, "seconds": 0.1, "first_token_s": 0.02},
                           {"new_tokens": 3, "seconds": 0.2, "first_token_s": 0.09}])
    assert one["first_token_s"] == pytest.approx(0.04)


def test_a_variants_configuration_is_summarised_as_its_governor():
    """M027: a variant's configuration (specrt:GOVERNOR@LABEL) is summarised as its governor: a
    DSpark one reports the calibration it started from, and a token tree's is read as a tree
    (the label read as part of the spec lost the first and raised on the second)."""
    from specrt.cmd_bench import summarise_config

    res = {"per_prompt": [_rounds_record(0)], "calibration_note": "no calibration stored"}
    s = summarise_config("specrt:dspark@q8", res, [[7, 8]], _FlatCosts())
    assert s["calibration_note"] == "no calibration stored"
    tree = summarise_config("specrt:fixed:2:tree=2@q8", res, [[7, 8]], _FlatCosts())
    assert "calibration_note" not in tree and tree["predicted"]["predicted_seconds"] > 0


def test_a_prompt_a_configuration_made_nothing_of_counts_in_its_paired_ratio():
    """M038: a prompt the configuration ran at 0 tok/s is a ratio of 0 in its paired ratio (only
    a reference's 0 tok/s, which no ratio can be taken over, is left out)."""
    from specrt.cmd_bench import paired_ratio

    assert paired_ratio([0.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == pytest.approx(2.0)


def test_a_busy_tables_note_names_each_folders_own_pricing_configurations(tiny_engines, prompts_file,  # noqa: F811
                                                                         tmp_path, monkeypatch):
    """M123 / M124 / M166: with the stored tables (busy here: the threshold raised past any share), each
    engines folder's note names the configurations that price from its own table (ENGINES' not
    the variant's, and the variant's not ENGINES'); with --governor-costs profiled none prices
    from a stored table, and off alone prices nothing: no note then."""
    import shutil

    import specrt.engines.costs as costs
    from specrt.cmd_bench import run_bench

    monkeypatch.setattr(costs, "BUSY_CPU_SHARE", 2.0)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_engines, copy)
    kw = dict(max_new_tokens=2, governors="off,dspark", peers="none", threads=1, warmup_tokens=0, quiet=True)
    rep = run_bench(tiny_engines, prompts_file, tmp_path / "r", profile=False, variants={"c": copy}, **kw)
    notes = [w for w in rep["warnings"] if "profiled on a busy machine" in w]
    assert len(notes) == 2, rep["warnings"]
    for note, folder, name in ((notes[0], tiny_engines, "specrt:dspark"), (notes[1], copy, "specrt:dspark@c")):
        assert note.startswith(f"the cost table of {folder} ") and f"the configurations {name} price" in note, note
    rep = run_bench(tiny_engines, prompts_file, tmp_path / "p", governor_costs="profiled", profile_repeats=1, **kw)
    assert not [w for w in rep["warnings"] if "profiled on a busy machine" in w], rep["warnings"]
    # M166: no configuration that prices its rounds (off alone): no note naming none
    rep = run_bench(tiny_engines, prompts_file, tmp_path / "o", profile=False, **{**kw, "governors": "off"})
    assert not [w for w in rep["warnings"] if "profiled on a busy machine" in w], rep["warnings"]


def test_a_single_process_workers_records_name_no_process():
    """M066: a worker run as one process (no --processes) is its own result: its prompts' records
    name no process and the result no process count (the report's per-prompt "process" says
    which of several processes ran a prompt)."""
    from specrt.cmd_bench import merge_process_results

    part = {"ok": True, "prompt_indices": [0, 1], "per_prompt": [{"x": 0}, {"x": 1}], "load_seconds": 1.0}
    got = merge_process_results([part], 2)
    assert got["per_prompt"] == [{"x": 0}, {"x": 1}] and "processes" not in got


def test_each_peers_job_says_how_its_threads_wait_and_if_it_gets_huge_pages(tiny_engines, prompts_file,  # noqa: F811
                                                                             tmp_path, monkeypatch):
    """M115 / M117 / M118: the jobs handed to the peers' workers (captured, not run): under
    --peer-threading matched the peers get huge pages, and sequentially (nothing else running)
    spin as the engines do, told not to stop spinning between runs; under defaults they keep
    their own wait policy (spin None) and no huge pages."""
    import specrt.cmd_bench as cb
    from tests.cli.test_bench import REFERENCE_PAIR

    lib = cb.load_bench_lib()
    why = lib.peer_unavailable("hf", REFERENCE_PAIR.resolve() / "verifier")
    if why is not None:  # (torch and transformers are dev dependencies)
        pytest.fail(why)
    jobs: dict = {}

    def captured(job, log_path, on_progress):
        jobs[job.get("peer") or job["governor"]] = job
        return {"ok": False, "skipped": "captured, not run"}

    monkeypatch.setattr(cb, "run_config", captured)
    monkeypatch.setattr(cb, "_run_interleaved", lambda js, *a, **k: jobs.update((n, j) for n, j in js))
    kw = dict(max_new_tokens=2, governors="off", peers="hf", threads=1, warmup_tokens=0, quiet=True, profile=False)
    for schedule, threading in (("sequential", "matched"), ("interleaved", "defaults"), ("sequential", "defaults")):
        jobs.clear()
        rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / f"{schedule}-{threading}", schedule=schedule,
                           peer_threading=threading, **kw)
        hf = jobs["hf"]
        matched = threading == "matched"
        assert hf["spin"] == (rep["settings"]["engines_spin"] if matched else None) and hf["stop_spinning"] is False
        assert hf["hugepages"] is matched and rep["settings"]["peer_spin"] == hf["spin"], (schedule, threading, hf)


def test_a_run_that_raised_in_a_later_repeat_is_named_with_its_repeat(tiny_engines, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """M087: a worker's run that raised in repeat 2 (counted from 1, as the report counts them) is
    named so, in either schedule's worker."""
    import io
    import json
    import sys

    from specrt.cmd_bench import _SpecrtWorker, worker_main
    from specrt.errors import UserError

    calls = []
    run = _SpecrtWorker.run

    def third_raises(self, *a, **k):  # repeat 2's first prompt (two prompts a repeat)
        calls.append(1)
        if len(calls) == 3:
            raise UserError("injected")
        return run(self, *a, **k)

    monkeypatch.setattr(_SpecrtWorker, "run", third_raises)
    job = {"kind": "specrt", "engines": str(tiny_engines), "threads": 1, "prompts": [[5, 6, 7], [9, 10, 11]],
           "max_new_tokens": 2, "eos": [2], "warmup_tokens": 0, "repeats": 2}
    for extra, where in (({"governor": "off"}, "prompt 1, repeat 2"),
                         ({"governors": ["off"], "interleaved": True}, "governor off, prompt 1, repeat 2")):
        calls.clear()
        (tmp_path / "job.json").write_text(json.dumps({**job, **extra}))
        monkeypatch.setattr(sys, "stdin", io.StringIO("run 0 off\nrun 1 off\nrepeat 1\nrun 0 off\nrun 1 off\nend\n"))
        assert worker_main(str(tmp_path / "job.json"), str(tmp_path / "result.json")) == 1
        res = json.loads((tmp_path / "result.json").read_text())
        assert res["error"] == f"UserError: injected ({where})", res


def test_a_llamacpp_gguf_that_is_a_folder_is_refused_as_a_user_error(tiny_engines, prompts_file,  # noqa: F811
                                                                     tmp_path):
    """M096: run_bench's llamacpp_gguf naming a folder is refused as no such file (opened, it was
    an IsADirectoryError's traceback)."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError

    with pytest.raises(UserError, match=r": no such file \(expected a GGUF of the target\)"):
        run_bench(tiny_engines, prompts_file, tmp_path / "r", peers="llamacpp", llamacpp_gguf=tmp_path, quiet=True)
    assert not (tmp_path / "r").exists()


def test_target_is_refused_where_only_a_given_gguf_is_read(tiny_engines, prompts_file, tmp_path):  # noqa: F811
    """M104: --target names the checkpoint the peers read; llamacpp-gguf decodes the GGUF as given,
    and llamacpp one given by --llamacpp-gguf, so with those alone --target is refused."""
    from specrt.cmd_bench import run_bench
    from specrt.errors import UserError
    from tests.cli.test_bench import REFERENCE_PAIR

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(28))
    target = REFERENCE_PAIR.resolve() / "verifier"
    for peers, given in (("llamacpp-gguf", None), ("llamacpp,llamacpp-lookup", gguf)):
        with pytest.raises(UserError, match=f"^--target {target}: the target checkpoint the peers read; --peers "
                                            f"{peers} reads none$"):
            run_bench(tiny_engines, prompts_file, tmp_path / "r", peers=peers, llamacpp_gguf=given,
                      target_folder=target, quiet=True)
    assert not (tmp_path / "r").exists()


def test_governors_sharing_a_worker_count_once_in_the_memory_check(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                                   monkeypatch):
    """M120 / M135: the memory check counts worker processes: specrt's governors on one engines
    folder share one, so off and fixed:2 with --processes 3 are three, which fit where six would
    not; the report's processes are those that ran (two for two prompts), not those asked for."""
    import specrt.cmd_bench as cb
    from specrt.engines.engine_set import load_engines

    w = load_engines(tiny_engines, verify=False).weight_bytes
    monkeypatch.setattr(cb, "mem_available", lambda: int(3 * 1.5 * w / 0.8) + 4096)  # three workers fit, not six
    rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=2, governors="off,fixed:2",
                       peers="none", threads=1, warmup_tokens=0, quiet=True, profile=False, processes=3)
    assert (rep["settings"]["schedule"], rep["settings"]["processes"]) == ("interleaved", 2), rep["warnings"]

def test_the_memory_check_counts_the_processes_the_prompts_start(tiny_engines, prompts_file, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    """--processes past the prompts (the processes a worker starts: one a prompt at most) is
    checked as the processes that run: --processes 3 over two prompts holds two, which fit (it was
    counted three, and the run went sequential, "--processes 3 ignored")."""
    import specrt.cmd_bench as cb
    from specrt.engines.engine_set import load_engines

    w = load_engines(tiny_engines, verify=False).weight_bytes
    monkeypatch.setattr(cb, "mem_available", lambda: int(2 * 1.5 * w / 0.8) + 4096)  # two processes fit, not three
    rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", max_new_tokens=2, governors="off", peers="none",
                       threads=1, warmup_tokens=0, quiet=True, profile=False, processes=3)
    assert (rep["settings"]["schedule"], rep["settings"]["processes"]) == ("interleaved", 2), rep["warnings"]
    assert not any("ran sequentially instead" in x for x in rep["warnings"]), rep["warnings"]


def test_the_prediction_prices_from_each_folders_table_profiled_in_the_run(tiny_engines, prompts_file,  # noqa: F811
                                                                           tmp_path, monkeypatch):
    """M125 / M129: (b) predicts from the tables profiled at the start of the run (here each
    folder's stored table scaled: 2x for ENGINES, 3x for the variant), each configuration from its
    own folder's: the predicted seconds are 2x and 3x those the stored tables give."""
    import json
    import shutil
    from pathlib import Path

    import specrt.engines.build as build
    from specrt.cmd_bench import run_bench

    copy = tmp_path / "copy"
    shutil.copytree(tiny_engines, copy)
    factor = {tiny_engines.resolve(): 2.0, copy.resolve(): 3.0}

    def scaled(x, f):
        if isinstance(x, dict):
            return {k: v if k == "cpu_share" else scaled(v, f) for k, v in x.items()}
        return x * f if isinstance(x, float) else x

    def measured(e, repeats, log=None):
        stored = json.loads((Path(e.folder) / "engines.json").read_text())["costs"]
        return scaled(stored, factor[Path(e.folder).resolve()])

    monkeypatch.setattr(build, "measure_costs", measured)
    kw = dict(max_new_tokens=4, governors="off,fixed:2", peers="none", threads=1, warmup_tokens=0, quiet=True,
              variants={"c": copy})
    stored = run_bench(tiny_engines, prompts_file, tmp_path / "s", profile=False, **kw)["configs"]
    fresh = run_bench(tiny_engines, prompts_file, tmp_path / "p", **kw)["configs"]
    for name, f in (("specrt:fixed:2", 2.0), ("specrt:fixed:2@c", 3.0)):
        assert fresh[name]["predicted"]["predicted_seconds"] == pytest.approx(
            f * stored[name]["predicted"]["predicted_seconds"]), name


def test_the_summary_marks_the_reference_and_says_why_ortgenai_is_missing():
    """M143 / M144 / M147 / M150: the table's identical column says "ref" on the reference's row,
    and its passes/rd "-" where the draft never ran (off: not 0.00); line (a), when
    onnxruntime-genai failed, says its error (not "no ortgenai run"); passes avoided are said
    where some were."""
    import json
    from pathlib import Path

    from specrt.cmd_bench import REFERENCE, print_summary

    rep = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                     .read_text())
    lines: list[str] = []
    print_summary(rep, Path("out"), echo=lambda s="", **kw: lines.append(s))
    header = next(x for x in lines if x.startswith("configuration"))
    off = next(x for x in lines if x.startswith(f"{REFERENCE} "))
    end = header.index("passes/rd") + len("passes/rd")
    assert off.endswith(" ref") and off[end - 9:end].strip() == "-", (header, off)
    del rep["configs"]["ortgenai"]
    rep["failed"]["ortgenai"] = "RuntimeError: boom"
    rep["efficiency"]["a_off_vs_ortgenai"] = None
    lines.clear()
    print_summary(rep, Path("out"), echo=lambda s="", **kw: lines.append(s))
    assert "(a) decode without speculation vs onnxruntime-genai: not measured (RuntimeError: boom)" in lines, lines
    # M150: mask slots drafted (5) but no pass avoided (every round verified one draft): none said
    rep["configs"]["specrt:fixed:1"].update(mask_slots_drafted=5, sequential_passes_avoided=0)
    lines.clear()
    print_summary(rep, Path("out"), echo=lambda s="", **kw: lines.append(s))
    said = next(x for x in lines if x.startswith("  specrt:fixed:1: acceptance by position"))
    assert "sequential passes avoided" not in said, said


def test_a_variants_target_and_label_are_checked_as_said():
    """M154 / M157: two engine sets whose binding receipts record no target weights are not taken
    as one target (nothing says they are); a variant label may hold '-' and '_' beside letters and
    digits (the check goes on to the folder), and nothing else."""
    from pathlib import Path
    from types import SimpleNamespace

    from specrt.cmd_bench import _other_target, check_variant
    from specrt.errors import UserError

    bare = SimpleNamespace(export={})
    assert _other_target(bare, bare) == "their binding receipts' target weights differ"
    with pytest.raises(UserError, match=r"^--variant int-8_a: missing is not an engines folder$"):
        check_variant("int-8_a", Path("missing"), None, [])
    with pytest.raises(UserError, match=r"the label must be letters, digits, - or _"):
        check_variant("int.8", Path("missing"), None, [])


def test_a_prompt_must_leave_the_engines_room_for_a_token():
    """M167: a prompt as long as the engines' context leaves no room for a new token: refused
    naming it as the prompts file's (one token shorter is taken)."""
    from types import SimpleNamespace

    from specrt.cmd_bench import tokenize_prompts
    from specrt.errors import UserError

    e = SimpleNamespace(max_context=4, export_dir=None)
    assert tokenize_prompts([{"prompt_ids": [5, 6, 7]}], e, False) == [[5, 6, 7]]
    with pytest.raises(UserError, match=r"^p\.jsonl: prompt 1 has 4 tokens; the engines hold 4$"):
        tokenize_prompts([{"prompt_ids": [5, 6, 7, 8]}], e, False, source="p.jsonl")


def test_a_peer_its_worker_cannot_make_is_skipped_not_failed(tmp_path):
    """M083: a peer the worker finds it cannot run (bench_lib's PeerSkipped, here a peer it does
    not know) is a skip with the reason, exit 0, not an error raised."""
    import json

    from specrt.cmd_bench import worker_main

    (tmp_path / "job.json").write_text(json.dumps({"kind": "peer", "peer": "nonesuch", "threads": 1}))
    assert worker_main(str(tmp_path / "job.json"), str(tmp_path / "result.json")) == 0
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["skipped"] == "unknown peer 'nonesuch'" and not res["ok"] and "error" not in res, res


def test_every_known_peer_passes_the_peers_check(tiny_engines, prompts_file, tmp_path, monkeypatch):  # noqa: F811
    """M102: --peers takes every peer bench knows, those outside the default list too (the
    quantized onnxruntime-genai and the llama.cpp ones), up to the point where the run starts."""
    import specrt.cmd_bench as cb

    def checked(*a, **k):  # every check passed: the report folder would be made now
        raise _Checked

    monkeypatch.setattr(cb, "atomic_folder", checked)
    with pytest.raises(_Checked):
        cb.run_bench(tiny_engines, prompts_file, tmp_path / "r", peers=",".join(cb.KNOWN_PEERS), governors="off",
                     profile=False, quiet=True)


def test_each_run_counts_its_own_mask_slots(tiny_engines):  # noqa: F811
    """M174: a worker's counters start again at each run: the same prompt run twice drafts the
    same mask slots each time (the second counted the first's too)."""
    from specrt.cmd_bench import _SpecrtWorker

    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["fixed:4"], "threads": 1})
    try:
        first, second = (w.run([5, 6, 7, 8, 9, 10], 12, [2]) for _ in range(2))
    finally:
        w.close()
    assert first["mask_slots"] == second["mask_slots"] > 0 and first["draft_passes"] == second["draft_passes"]


def test_corpus_lookup_on_engines_without_a_corpus_is_refused_before_anything_runs(tiny_engines,  # noqa: F811
                                                                                    prompts_file, tmp_path):
    """M180: a governor asking for ':corpus' on engines without one is refused naming the file and
    `specrt corpus` (it was a worker's traceback, failing off's runs with it), nothing written."""
    from specrt.cmd_bench import run_bench
    from specrt.contracts import CORPUS_FILE
    from specrt.errors import UserError

    with pytest.raises(UserError, match=rf"^--governors fixed:2:corpus: ':corpus' needs {tiny_engines / CORPUS_FILE}: "
                                        r"make it with `specrt corpus "):
        run_bench(tiny_engines, prompts_file, tmp_path / "r", governors="off,fixed:2:corpus", peers="none",
                  quiet=True)
    assert not (tmp_path / "r").exists()


def test_a_prompts_file_read_from_a_pipe_is_not_recorded_with_the_empty_streams_sha256():
    # r70: '-' is refused naming /dev/stdin; `--prompts /dev/stdin` from a pipe was read, then read again for
    # the report's sha256, which recorded the sha256 of nothing (e3b0c442...) as the prompts measured
    import hashlib
    import os
    import time
    from pathlib import Path
    from types import SimpleNamespace

    from specrt.cmd_bench import read_prompts, run_record

    engines = SimpleNamespace(folder=".", manifest={"export": {"digest": "x"}})
    r, w = os.pipe()
    try:
        os.write(w, b'{"prompt": "hi"}\n')
        os.close(w)
        path = Path(f"/dev/fd/{r}")
        assert [x["prompt"] for x in read_prompts(path)] == ["hi"]
        assert run_record(time.time(), engines, path)["prompts_sha256"] != hashlib.sha256(b"").hexdigest()
    finally:
        os.close(r)


def test_an_empty_or_repeated_item_of_governors_or_peers_is_refused_naming_its_place(tmp_path):
    """`--governors 'off,,fixed:1'` ran off and fixed:1, an empty item dropped without a word (a
    governor lost in typing?), and `--peers none,none` or `hf,HF` were taken, the repeat run
    once (walk w73e, NOTES sessions 72-73; h74b): each is refused before anything loads,
    naming the option, the item's place and the item as typed; nothing written."""
    from click.testing import CliRunner

    from specrt.cmd_bench import bench
    from specrt.errors import UserError

    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    for extra, said in ((["--governors", "off,,fixed:1"], "--governors 'off,,fixed:1': item 2 of 3 is empty"),
                        (["--governors", "off,fixed:1,"], "--governors 'off,fixed:1,': item 3 of 3 is empty"),
                        # (mutant m74d-72: the repeat's hint lost from _check_items' default)
                        (["--governors", "off, fixed:1,OFF"], "--governors 'off, fixed:1,OFF': item 3 (OFF) repeats "
                                                              "item 1; each runs once (--repeats times every prompt "
                                                              "again)"),
                        (["--peers", "none,none"], "--peers 'none,none': item 2 (none) repeats item 1"),
                        (["--peers", "hf,HF"], "--peers 'hf,HF': item 2 (HF) repeats item 1"),
                        (["--peers", ",hf"], "--peers ',hf': item 1 of 2 is empty"),
                        # (mutant m74b-30, the items compared as typed: a repeat after a space, as a user types a
                        # list, taken)
                        (["--governors", "off, off"], "--governors 'off, off': item 2 (off) repeats item 1"),
                        (["--peers", "hf, HF"], "--peers 'hf, HF': item 2 (HF) repeats item 1")):
        # (tmp_path holds no engines: the option is refused before they load)
        r = CliRunner().invoke(bench, [str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"), "-o",
                                       str(tmp_path / "r"), *extra])
        assert isinstance(r.exception, UserError) and said in str(r.exception), (extra, r.output)
    assert not (tmp_path / "r").exists()


def test_threads_past_the_cores_are_warned_of_before_anything_runs(tmp_path):
    """`bench --threads 100000` on 2 cores ran on (unfinished after 120 s) and would have said
    "exceeds the physical cores" only under its closing table (walk w73e; h74b): the warning
    comes before the engines load (here none are there to load, and it is said before that
    error)."""
    from click.testing import CliRunner

    from specrt.cmd_bench import bench
    from specrt.engines.onnxruntime import physical_cores

    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    r = CliRunner().invoke(bench, [str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "r"),
                                   "--peers", "none", "--threads", "100000"])
    # (on standard error, as bench's other notes: mutant m74b-66 wrote it to standard output, the report's)
    assert r.exit_code != 0 and r.stderr.startswith(f"warning: --threads 100000 exceeds the {physical_cores()} "
                                                    "physical cores\n") and r.stdout == "", (r.stdout, r.stderr)


@pytest.mark.parametrize("module", ["specrt.cli", "specrt.cmd_bench"])
def test_python_dash_m_of_a_commands_module_terminated_leaves_no_partial_folder(tiny_engines,  # noqa: F811
                                                                                prompts_file, tmp_path, module):
    """`python -m specrt.cli` (not the documented entry, but a module one runs) called main(),
    and `python -m specrt.cmd_bench` bench(), without the `specrt` command's SIGTERM handler:
    `timeout` ended bench at once, its .r.partial-* folder left beside -o (walk w73e;
    h74b). Each is the command now: exit 143, "Terminated", what became of the report
    said, no partial folder."""
    import os
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen([sys.executable, "-m", module, *(["bench"] if module == "specrt.cli" else []),
                          str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"), "--peers",
                          "none", "--governors", "off",
                          "--max-new-tokens", "64", "--repeats", "1000", "--no-profile", "--quiet"],
                         env={**os.environ, "SPECRT_THP": "0"}, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.time() + 120
        while not list(tmp_path.glob(".r.partial-*/logs")) and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        time.sleep(1.0)  # into the worker's decoding
        assert p.poll() is None and list(tmp_path.glob(".r.partial-*")), "the bench ended before it ran"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 143 and err.endswith("[interrupted: no report written]\n\nTerminated\n"), (p.returncode, err)
    assert list(tmp_path.iterdir()) == []  # neither the report nor a partial folder
