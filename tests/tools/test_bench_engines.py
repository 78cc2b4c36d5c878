"""tools/bench_engines.py: issue 5's latency targets read from the merged results."""

from __future__ import annotations

import pytest

from tests.real_model import tool

MAX_CONTEXT = 48


@pytest.fixture(scope="module")
def tiny_engines(tmp_path_factory):
    """A tiny llama target's engines at depths 1, 2, 4: the default build (in-place KV) and one
    with ort_kv="append", both holding MAX_CONTEXT positions."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    root = tmp_path_factory.mktemp("bench-engines")
    export(write_tiny_target(root / "t", "llama", vocab_size=16), None, root / "exp")
    for name, kv in (("eng", "auto"), ("app", "append")):
        build_engines(root / "exp", "onnxruntime", (1, 2, 4), root / name, log=lambda s: None, profile_repeats=1,
                      profile_pasts=(16,), max_context=MAX_CONTEXT, ort_kv=kv)
    return root / "eng", root / "app"


def merged(d4: float, d8: float, og: float) -> dict:
    lat = {"128/1": 20.0, "128/4": 20.0 * d4, "128/8": 20.0 * d8, "512/1": 22.0, "512/4": 22.0 * d4,
           "512/8": 22.0 * d8}
    return {"shared": {"latency": lat},
            "ortgenai": {"latency": {"128/ortgenai": 20.0 / og, "128/1": 20.0, "512/ortgenai": 22.0 / og,
                                     "512/1": 22.0}}}


def test_targets_pass_and_fail_on_the_ratios():
    t = tool("bench_engines")
    ok = t.verdicts(merged(1.05, 1.25, 0.98), [128, 512])
    assert len(ok) == 6 and all(p for _, p in ok)
    bad = dict(t.verdicts(merged(1.21, 1.36, 1.06), [128, 512]))
    assert not any(bad.values())
    assert "context 512: depth 8 1.36x depth 1 (target <= 1.35x)" in bad
    assert "context 128: depth 1 1.06x onnxruntime-genai's per-token time (target <= 1.00x)" in bad


def test_variants_that_did_not_run_give_no_lines():
    t = tool("bench_engines")
    assert t.verdicts({}, [128]) == []
    only = t.verdicts({"shared": merged(1.0, 1.0, 1.0)["shared"]}, [128])
    assert [line for line, _ in only] == ["context 128: depth 4 1.00x depth 1 (target <= 1.20x)",
                                          "context 128: depth 8 1.00x depth 1 (target <= 1.35x)"]


def test_a_ratio_at_its_target_passes_and_a_missing_depth_1_gives_no_line():
    t = tool("bench_engines")
    at = {"shared": {"latency": {"64/1": 10.0, "64/4": 12.0, "64/8": 13.5}},
          "ortgenai": {"latency": {"64/1": 5.0, "64/ortgenai": 5.0, "128/1": 5.0}}}
    assert t.verdicts(at, [64, 128]) == [("context 64: depth 4 1.20x depth 1 (target <= 1.20x)", True),
                                         ("context 64: depth 8 1.35x depth 1 (target <= 1.35x)", True),
                                         ("context 64: depth 1 1.00x onnxruntime-genai's per-token time "
                                          "(target <= 1.00x)", True)]
    # --depths 2,4 (no depth 1 to divide by) and onnxruntime-genai not run at a context: no line, no KeyError
    assert t.verdicts({"shared": {"latency": {"64/2": 1.0, "64/4": 1.0}}}, [64]) == []


def test_the_report_divides_by_depth_1_and_by_the_weights_and_kv(capsys):
    t = tool("bench_engines")
    mib = 2 ** 20
    res = {"variant": "plain", "settings": None, "kv_layout": "append", "weights": 100 * mib, "kv_bytes": 28 * mib,
           "rss_before": 50 * mib, "rss_loaded": 200 * mib, "peak_rss": 256 * mib, "load_s": 1.25,
           "latency": {"64/0": 0.004, "64/1": 0.005, "64/2": 0.006}, "steps": 30, "step_past": [64, 94],
           "alloc_per_step_max": 96, "alloc_per_step_median": 80.0, "rss_growth": 8192, "huge_pages": False}
    t.report(res, [64], [1, 2])
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == [
        "== plain (plain session.run), append KV",
        "malloc huge pages: off",
        "load 1.2 s; engine weights 100 MiB; RSS after activation 200 MiB (+150 MiB over the process before "
        "loading = 1.50x weights); peak RSS 256 MiB = 2.00x (weights + preallocated KV cache 28 MiB)",
        "context   64: decode 4.0 ms, d1 5.0 ms (1.00x), d2 6.0 ms (1.20x)",
        "per decode step over 30 steps (past 64->94): Python allocations max 96 B, median 80 B; "
        "RSS growth from step 20 to the end 8 KiB"]
    t.report({**res, "variant": "1-thread", "settings": {}}, [64], [2])
    assert capsys.readouterr().out.splitlines()[1] == "== 1-thread {}, append KV"
    og = {"variant": "ortgenai", "settings": {"threads": 2}, "model": "m", "huge_pages": True,
          "latency": {"64/ortgenai": 0.004, "64/decode": 0.002, "64/1": 0.005}}
    t.report(og, [64], [1])
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "malloc huge pages: on (glibc.malloc.hugetlb=1)", out
    assert out[-1] == ("context   64: onnxruntime-genai 4.0 ms per token; "
                                                        "specrt decode 2.0 ms (0.50x), depth 1 5.0 ms (1.25x)")


def test_passes_merge_to_median_latencies_and_the_highest_peak_rss():
    """Three passes of one variant: each latency the median of the three (not the first, the
    mean or an extreme), the peak RSS the highest; the rest is the first pass's."""
    t = tool("bench_engines")
    runs = [{"variant": "shared", "settings": {}, "latency": {"8/1": a, "8/2": b}, "peak_rss": rss}
            for a, b, rss in ((0.010, 0.030, 200), (0.050, 0.020, 300), (0.012, 0.090, 100))]
    res = t.merge_passes(runs)
    assert res["latency"] == {"8/1": 0.012, "8/2": 0.030} and res["peak_rss"] == 300, res
    assert res["variant"] == "shared" and runs[0]["latency"] == {"8/1": 0.010, "8/2": 0.030}  # the runs untouched


def test_each_child_reports_the_huge_pages_its_environment_gave_it(tiny_engines, capsys, monkeypatch):
    """A tunable already in the environment: kept for shared, taken out for 4k-pages, and each
    child says which it ran with (a 4k-pages child given huge pages measured nothing of them)."""
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    t, (eng, _) = tool("bench_engines"), tiny_engines
    assert t.main(["--engines", str(eng), "--variants", "shared,4k-pages", "--contexts", "8", "--depths", "1",
                   "--repeats", "1", "--rounds", "1", "--steps", "25"]) == 0
    out = capsys.readouterr().out
    shared, small = out.split("\n== shared {}, inplace KV\n")[1], out.split("\n== 4k-pages {}, inplace KV\n")[1]
    assert shared.startswith("malloc huge pages: on (glibc.malloc.hugetlb=1)\n"), out
    assert small.startswith("malloc huge pages: off\n"), out


def test_a_worker_fills_the_engines_context_exactly_and_refuses_one_position_more(tiny_engines):
    """contexts + depths + 1 + steps positions (here all MAX_CONTEXT) run; one step more is refused
    before any timing, naming both counts."""
    from specrt.engines import load_engines

    t, (eng, app) = tool("bench_engines"), tiny_engines
    e = load_engines(eng, verify=False)
    tg = e.export["target"]
    kv = tg["num_layers"] * 2 * MAX_CONTEXT * tg["num_kv_heads"] * tg["head_dim"] * 4  # fp32 K and V, every layer
    steps = MAX_CONTEXT - 8 - 2 - 1
    for folder, variant, layout, n in ((eng, "shared", "inplace", steps), (eng, "plain", "append", steps),
                                       (app, "shared", "append", 25)):
        r = t.worker(folder, variant, [8, 4], [1, 2], 1, 1, n)
        assert e.kv_layout("target") == "inplace" and r["kv_layout"] == layout, (variant, r)
        assert sorted(r["latency"]) == ["4/0", "4/1", "4/2", "8/0", "8/1", "8/2"]  # 0: decode (S = 1)
        assert all(v > 0 for v in r["latency"].values()) and 0 <= r["load_s"] < 60, r
        assert (r["cache_tokens"], r["steps"], r["step_past"], r["kv_bytes"]) == (8 + 2 + 1 + n, n, [8, 8 + n], kv)
        assert r["settings"] == t.VARIANTS[variant] and r["weights"] == e.manifest["weight_bytes"]["target"]
        assert isinstance(r["rss_growth"], int) and r["alloc_per_step_max"] >= 0
    for variant in ("sleeping", "per-depth", "basic"):  # the settings its sessions hold, as the variant asks
        assert t.worker(eng, variant, [8], [1], 1, 1, 21)["settings"] == t.VARIANTS[variant], variant
    with pytest.raises(SystemExit, match=f"contexts \\+ depths \\+ steps need {MAX_CONTEXT + 1} positions; "
                                         f"the engines hold {MAX_CONTEXT}"):
        t.worker(eng, "shared", [8, 4], [2, 1], 1, 1, steps + 1)


def test_the_command_reports_each_variant_on_its_own_engines_and_checks_the_targets(tiny_engines, capsys,
                                                                                     monkeypatch):
    """One child per variant (append on the append-built engines), the report of each, and issue 5's
    lines for the depths built (4 here, not 8), PASS exactly when the ratio is within its target."""
    import re

    monkeypatch.setenv("SPECRT_THP", "0")
    t, (eng, app) = tool("bench_engines"), tiny_engines
    with pytest.raises(SystemExit) as exc:
        t.main(["--variants", "shared,nope", "--engines", str(eng)])
    assert exc.value.code == 2 and "unknown variant nope (choose from shared, per-depth," in capsys.readouterr().err
    assert t.main(["--engines", str(eng), "--append-engines", str(app), "--variants", "shared,append",
                   "--contexts", "8", "--depths", "1,2,4", "--repeats", "1", "--rounds", "1", "--steps", "25"]) == 0
    out = capsys.readouterr().out
    assert "\n== shared {}, inplace KV\n" in out and "\n== append {}, append KV\n" in out, out
    assert out.count("context    8: decode ") == 2 and out.count(" ms (1.00x), d2 ") == 2, out
    assert out.count("per decode step over 25 steps (past 8->33)") == 2 and "passes over" not in out, out
    lines = re.findall(r"\[(PASS|FAIL)\] context 8: depth (\d) (\d+\.\d\d)x depth 1 \(target <= 1\.20x\)", out)
    assert len(lines) == 1 and lines[0][1] == "4" and "depth 8" not in out, out
    verdict, _, ratio = lines[0]
    assert verdict == "PASS" if float(ratio) < 1.2 else verdict == "FAIL" if float(ratio) > 1.2 else True, out


def test_a_variant_that_fails_in_every_pass_is_said_and_not_reported(tiny_engines, capsys, monkeypatch):
    monkeypatch.setenv("SPECRT_THP", "0")
    t, (eng, _) = tool("bench_engines"), tiny_engines
    assert t.main(["--engines", str(eng), "--variants", "shared", "--contexts", "8", "--depths", "1,4",
                   "--steps", "100", "--passes", "2"]) == 1  # (0 read as a bench that measured it)
    out, err = capsys.readouterr()
    assert "no measurement of shared: failed in every pass" in err, err
    for p in (1, 2):
        assert f"\n== shared (pass {p}): failed\n" in out, out
    assert "contexts + depths + steps need 113 positions; the engines hold 48" in out, out
    assert "2 passes over the variants in turn" in out and "latency targets" not in out and " KV\n" not in out, out


def test_steps_too_few_for_the_rss_growth_from_step_20_are_refused(tiny_engines, capsys):
    """--steps 20 or fewer: every child failed after its timing (RSS growth from step 20 subtracted
    None; 5 or fewer, the maximum over steps 5 on was of nothing); refused before any child."""
    t, (eng, _) = tool("bench_engines"), tiny_engines
    with pytest.raises(SystemExit) as exc:
        t.main(["--engines", str(eng), "--variants", "shared", "--contexts", "8", "--depths", "1", "--steps", "20"])
    assert exc.value.code == 2 and "--steps 20: at least 21" in capsys.readouterr().err


def test_the_synthetic_cache_feeds_new_tokens_after_the_past_in_either_layout(tiny_engines):
    """In place: the whole preallocated cache each call; append: its first ``past`` rows; positions
    past .. past + s - 1. The plain baseline's outputs are named as its session names them."""
    import numpy as np
    import onnxruntime as ort

    from specrt import contracts as C
    from specrt.engines import load_engines

    t, (eng, _) = tool("bench_engines"), tiny_engines
    e = load_engines(eng, verify=False)
    tg = e.export["target"]
    KVH, D = tg["num_kv_heads"], tg["head_dim"]
    cache, feeds = t.synthetic_cache(e, np.random.default_rng(0), True)
    f = feeds(3, 10)
    assert f[C.POSITION_IDS].tolist() == [[10, 11, 12]] and f[C.INPUT_IDS].shape == (1, 3)
    assert f[C.cache_key(0)] is cache[C.cache_key(0)] and cache[C.cache_key(0)].shape == (1, KVH, MAX_CONTEXT, D)
    cache, feeds = t.synthetic_cache(e, np.random.default_rng(0), False)
    f = feeds(2, 10)
    assert f[C.POSITION_IDS].tolist() == [[10, 11]] and C.HEAD_EXACT not in f
    assert f[C.past_value(0)].shape == (1, 10, KVH, D) and cache[C.past_value(0)].shape == (1, MAX_CONTEXT, KVH, D)
    sess = ort.InferenceSession(str(e.export_dir / "target.onnx"), providers=["CPUExecutionProvider"])
    out = t.PlainRunner(sess).infer(f)
    assert list(out) == [o.name for o in sess.get_outputs()] and out[C.LOGITS].shape[:2] == (1, 2)


def test_the_cache_named_with_a_tilde_the_shell_left_is_the_home_folders(tmp_path, monkeypatch):
    """r70: ``SPECRT_CACHE='~/c'`` (quoted, an env file) is the home folder's, as smollm2.default_cache
    and bench_lib.specrt_cache read it since the environment walk: prepare() built into a folder named
    ``~`` in the working folder (and an empty SPECRT_CACHE into the working folder itself)."""
    import specrt.engines
    import specrt.manifest

    t = tool("bench_engines")
    built = []
    monkeypatch.setattr(specrt.manifest, "load_export", lambda folder: {})  # (an export there: not exported again)
    monkeypatch.setattr(specrt.engines, "build_engines", lambda exp, backend, depths, out, **kw: built.append(out))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    for env in ("~/c", ""):
        monkeypatch.setenv("SPECRT_CACHE", env)
        t.prepare("1,2", False, None)
    assert built == [tmp_path / "home" / "c" / "bench-engines" / "engines",
                     tmp_path / "home" / ".cache" / "specrt" / "bench-engines" / "engines"]


def test_an_engines_folder_that_is_no_build_is_refused_by_its_option(tiny_engines, tmp_path, capsys, monkeypatch):
    """Before: a FileNotFoundError traceback reading its engines.json (--engines), or every append
    child failing (--append-engines). (A cache of the test's own: a build without --engines goes there.)"""
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECRT_SMOLLM2_WHEEL", str(tmp_path / "nowhere.whl"))
    t, (eng, _) = tool("bench_engines"), tiny_engines
    for args, flag, folder in ((["--engines", str(tmp_path), "--variants", "shared"], "--engines", tmp_path),
                               (["--engines", str(eng), "--append-engines", str(tmp_path / "a"), "--variants",
                                 "shared,append"], "--append-engines", tmp_path / "a")):
        with pytest.raises(SystemExit) as exc:
            t.main([*args, "--contexts", "8", "--depths", "1", "--steps", "21"])
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: {flag} {folder}: no engines.json (expected a folder `specrt build` wrote)")


def test_an_empty_or_repeated_item_of_contexts_or_depths_is_refused_by_its_option(tiny_engines, capsys):
    """h74e (h74b's leftover): `--contexts 1,,2` or `--depths 1,,2` was an int('') traceback;
    refused now as specrt bench's lists and build's --depths are (the same checks), before any
    child; so is a context that is no integer or is named twice. Both say an empty item by its
    place (--depths' was "an empty entry", worded apart from --contexts' beside it: r74)."""
    t, (eng, _) = tool("bench_engines"), tiny_engines
    for contexts, depths, error in (
            ("8,,16", "1", "--contexts '8,,16': item 2 of 3 is empty; expected a comma-separated list without "
                           "empty items"),
            ("8", "1,,2", "--depths '1,,2': item 2 of 3 is empty; expected comma-separated integers such as 1,2,4,8"),
            ("8", "1,2,2", "--depths '1,2,2': depth 2 is named twice (items 2 and 3); each depth is built once"),
            ("8, 8", "1", "--contexts '8, 8': item 2 (8) repeats item 1; each context is timed once a round"),
            ("8,x", "1", "--contexts '8,x': expected comma-separated integers such as 128,512")):
        with pytest.raises(SystemExit) as exc:
            t.main(["--engines", str(eng), "--variants", "shared", "--contexts", contexts, "--depths", depths,
                    "--steps", "21"])
        assert exc.value.code == 2
        assert capsys.readouterr().err.splitlines()[-1].endswith("error: " + error)


def test_contexts_typed_with_spaces_are_taken(capsys):
    """Mutant m74d-41 (each context checked as digits before its spaces are stripped): `--contexts
    '128, 512'`, as a list is typed and as int() reads it, was refused "expected comma-separated
    integers"; it is taken (here the unknown variant is what is said next, before anything runs)."""
    t = tool("bench_engines")
    with pytest.raises(SystemExit) as exc:
        t.main(["--variants", "nosuch", "--contexts", "128, 512", "--depths", "1, 2", "--steps", "21"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: unknown variant nosuch (choose from "
                                                             f"{', '.join(t.VARIANTS)})")
