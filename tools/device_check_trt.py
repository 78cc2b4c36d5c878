"""Device check: build the tiny reference engines with TensorRT, run them, compare with ONNX Runtime.

    python tools/device_check_trt.py [--precision fp32] [--out DIR] [--layouts profiles,engines]

Needs an NVIDIA GPU with TensorRT, and specrt installed with its dependencies and
polygraphy (`pip install -e '.[export,tensorrt]'` in this repository: the tiny reference
pair is tests/data/speculators-peagle-tiny); it has NOT been run on the CPU-only machines
this project is developed on, where it exits 2 with the reason.

What it does, each step printed with PASS/FAIL:

1. export the tiny pair (random 4-layer Llama + P-EAGLE draft) with specrt;
2. ``build_engines(..., "tensorrt", depths 1,2,4,8)`` for each layout: ``profiles`` (one
   target plan, one profile per role) and ``engines`` (one plan per role), sharing one
   timing cache, and reports build time, plan bytes and the cost table;
   the ONNX Runtime reference is built with ``ort_kv="append"``: the export's portable
   inputs (past_key.* / past_value.*) that the TensorRT engines take, not in-place KV;
3. polygraphy comparison, per role: ``Comparator.run([TrtRunner(engine,
   optimization_profile=i), OnnxrtRunner(session)], data_loader=...)`` then
   ``Comparator.compare_accuracy(..., CompareFunc.simple(atol, rtol))`` on feeds of that
   role's exact shapes (past = 40, draft A = 2 real slots);
4. the specrt Runner path: ``load_engines`` + ``runner.infer`` against ONNX Runtime, then
   each runner's activation memory (what polygraphy's "runtime" allocation gave its
   context) beside its profile's maximum;
5. ``specrt compare`` (compare.compare_engines): every role against the export in ONNX
   Runtime on inputs from a real prefill, and the by-hand polygraphy commands it prints;
6. generation: greedy tokens of ``off`` and ``fixed:4`` on the TensorRT engines against
   ``off`` on the ONNX Runtime ones (lossless: identical at fp32);
7. tamper check: one flipped plan byte must make ``load_engines`` refuse;
8. latency per depth relative to depth 1 (median of 50) for each layout, the evidence
   for the profile-vs-engine decision (plan.py).

Each step of a layout runs even when an earlier one failed (its traceback printed); the
closing lines repeat every check's PASS/FAIL, and ``--report`` (default
``<work>/device_check_trt.json``; the work folder is kept when ``--out`` names it) holds
them with the versions, build times, plan bytes, cost tables, memory and latency.

Exit code 0 when every check passes, 1 otherwise, 2 when TensorRT or a GPU is absent.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "speculators-peagle-tiny"
DEPTHS = (1, 2, 4, 8)
TOL = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 1e-1}

PROMPTS = ([5, 6, 7, 8, 9, 10, 11, 12], [100, 200, 300, 400, 500, 600, 700, 800, 900, 17, 3, 42])
NEW_TOKENS = 24

failures: list[str] = []
checks: list[str] = []


def check(ok: bool, what: str) -> None:
    line = f"[{'PASS' if ok else 'FAIL'}] {what}"
    print(line, flush=True)
    checks.append(line)
    if not ok:
        failures.append(what)


def step(layout: str, name: str, fn) -> None:
    """Run one step of a layout; an exception fails that step only (the next still runs)."""
    try:
        fn()
    except Exception as e:
        traceback.print_exc()
        check(False, f"[{layout}] {name}: {type(e).__name__}: {str(e)[:300]}")


def activation_memory(engines) -> dict[str, dict[str, int | None]]:
    """role -> bytes of activation memory its context holds now (polygraphy's "runtime"
    allocation: sized by update_device_memory_size_for_shapes for the last call's shapes)
    and its profile's maximum (get_device_memory_size_for_profile_v2, TensorRT >= 10.1)."""
    out = {}
    for role, r in engines.runners.items():
        pg = getattr(r, "_runner", None)
        if pg is None:
            continue
        buf = getattr(pg, "context_memory_buffer", None)
        per_profile = getattr(pg.engine, "get_device_memory_size_for_profile_v2", None)
        out[role] = {"held": int(buf.allocated_nbytes) if buf is not None else None,
                     "profile_max": int(per_profile(r.profile)) if per_profile else None}
    return out


def generate(engines_dir: Path, governor: str) -> list[list[int]]:
    from specrt.runtime.session import Session

    with Session(engines_dir, governor=governor) as s:
        return [[t for chunk in s.stream_ids(list(p), NEW_TOKENS) for t in chunk] for p in PROMPTS]


def build_reference(exp: Path, out: Path) -> Path:
    """The ONNX Runtime engines the TensorRT ones are compared with: the export's portable
    target graph (past_key.* / past_value.* inputs, as TensorRT's), not in-place KV, whose
    cache_key.* inputs the TensorRT engines' feeds do not have."""
    from specrt.engines import build_engines

    build_engines(exp, "onnxruntime", DEPTHS, out, force=True, log=lambda s: None, profile_repeats=3,
                  ort_kv="append")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="fp32", choices=sorted(TOL))
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--layouts", default="profiles,engines")
    ap.add_argument("--report", type=Path, default=None,
                    help="the JSON report (default: device_check_trt.json in --out; none without --out)")
    args = ap.parse_args(argv)
    import numpy as np

    from specrt.engines import build_engines, load_engines
    from specrt.engines.costs import role_sizes, synthetic_feeds
    from specrt.engines.manifest import gpu_info
    from specrt.errors import UserError
    from specrt.export.export import export

    try:
        import tensorrt
    except ImportError as e:
        print(f"SKIP: TensorRT is not importable here ({e}); run this on a machine with an NVIDIA GPU")
        return 2
    if shutil.which("nvidia-smi") is None:
        print("SKIP: no nvidia-smi, so no NVIDIA GPU visible")
        return 2
    import onnxruntime
    import polygraphy
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator, CompareFunc

    from specrt.engines.compare import compare_engines
    from specrt.engines.tensorrt import RUNTIME_RESIZE

    versions = {"tensorrt": tensorrt.__version__, "polygraphy": polygraphy.__version__,
                "onnxruntime": onnxruntime.__version__, "numpy": np.__version__, "gpu": gpu_info()["name"],
                RUNTIME_RESIZE: hasattr(tensorrt.PreviewFeature, RUNTIME_RESIZE)}
    print(f"versions: {versions}; precision {args.precision}", flush=True)
    work = args.out or Path(tempfile.mkdtemp(prefix="specrt-device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    report_path = args.report or (args.out / "device_check_trt.json" if args.out is not None else None)
    report: dict = {"versions": versions, "precision": args.precision, "layouts": {}}
    exp = work / "export"
    export(REFERENCE / "verifier", REFERENCE / "draft", exp, force=True)
    check((exp / "export.json").is_file(), "export of the tiny reference pair")
    ort_dir = build_reference(exp, work / "engines-ort")
    try:
        reference_tokens = generate(ort_dir, "off")
    except Exception as e:  # the generation steps then fail saying so; the others still run
        traceback.print_exc()
        reference_tokens = f"the ONNX Runtime reference could not generate: {type(e).__name__}: {e}"
    tol = TOL[args.precision]
    rng = np.random.default_rng(0)
    for layout in args.layouts.split(","):
        out = work / f"engines-trt-{layout}"
        rep = report["layouts"][layout] = {}
        t0 = time.perf_counter()
        try:
            m = build_engines(exp, "tensorrt", DEPTHS, out, precision=args.precision, force=True, trt_layout=layout,
                              profile_repeats=10, log=lambda s: print("  " + s, flush=True))
        except Exception as e:  # report and carry on with the next layout
            traceback.print_exc()
            check(False, f"[{layout}] build: {type(e).__name__}: {str(e)[:300]}")
            continue
        plans = {f["file"]: f["bytes"] for f in m["files"]}
        rep.update(build_seconds=round(time.perf_counter() - t0, 1), files=plans, weight_bytes=m["weight_bytes"],
                   costs=m["costs"])
        check(True, f"[{layout}] build in {rep['build_seconds']} s; files {plans}")
        plan_bytes = sum(b for f, b in plans.items() if f.endswith(".plan"))
        check(sum(m["weight_bytes"].values()) == plan_bytes,  # (engines layout: each role's plan its own copy)
              f"[{layout}] weight bytes {m['weight_bytes']} add up to the plans' {plan_bytes}")
        c = m["costs"]
        print(f"  cost table: verify {c['verify']} decode {c['decode']} draft {c.get('draft')}")

        def polygraphy_comparison():
            # polygraphy Comparator, role by role, against ONNX Runtime on the export graph
            engines = load_engines(out)
            for role, spec in m["roles"].items():
                runner = engines.runner(role)
                sizes = role_sizes(runner, 40, draft_depth=max(DEPTHS), draft_accepted=2, prefill_tokens=16,
                                   draft_kind="peagle")
                feeds = synthetic_feeds(runner, sizes, 1000, rng)
                feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
                eng = EngineFromBytes(BytesFromPath(str(out / spec["engine"]["file"])))
                onnx_path = str(out / ("export/target.onnx" if spec["graph"] == "target" else "export/draft.onnx"))
                runners = [TrtRunner(eng, optimization_profile=spec["engine"]["profile"]),
                           OnnxrtRunner(SessionFromOnnx(onnx_path, providers=["CPUExecutionProvider"]))]
                results = Comparator.run(runners, data_loader=[feeds])
                ok = bool(Comparator.compare_accuracy(results, compare_func=CompareFunc.simple(atol=tol, rtol=tol)))
                check(ok, f"[{layout}] {role}: polygraphy TensorRT vs ONNX Runtime within {tol}")

        def runner_path():
            # the specrt Runner path, then each context's activation memory, then latency per depth
            with load_engines(out) as trt, load_engines(ort_dir) as ref:
                worst = {}
                for role in ["decode", *[f"verify.{d}" for d in DEPTHS], "prefill", "draft"]:
                    sizes = role_sizes(trt.runner(role), 40, draft_depth=max(DEPTHS), draft_accepted=2,
                                       prefill_tokens=16, draft_kind="peagle")
                    feeds = synthetic_feeds(trt.runner(role), sizes, 1000, rng)
                    got, want = trt.runner(role).infer(feeds), ref.runner(role).infer(feeds)
                    for k, v in want.items():
                        if v.dtype.kind == "f":
                            err = float(np.max(np.abs(got[k] - v) / (tol + tol * np.abs(v)))) if v.size else 0.0
                        else:
                            err = 0.0 if np.array_equal(got[k], v) else 2.0
                        worst[f"{role} {k}"] = err
                top = max(worst, key=worst.get)
                check(worst[top] <= 1.0, f"[{layout}] specrt runners match ONNX Runtime (worst error / tolerance "
                                         f"{worst[top]:.3f}, {top})")
                rep["activation_memory"] = mem = activation_memory(trt)
                print(f"  [{layout}] activation memory held / profile max (bytes): "
                      + ", ".join(f"{r} {v['held']}/{v['profile_max']}" for r, v in mem.items()), flush=True)
                lat = {}
                for d in DEPTHS:
                    r = trt.verify(d)
                    f = synthetic_feeds(r, {"new_tokens": d + 1, "past_tokens": 128}, 1000, rng)
                    for _ in range(5):
                        r.infer(f)
                    ts = []
                    for _ in range(50):
                        t1 = time.perf_counter()
                        r.infer(f)
                        ts.append(time.perf_counter() - t1)
                    lat[str(d)] = float(np.median(ts))
                rep["verify_latency_s"] = lat
                print(f"  [{layout}] verify latency at past 128: "
                      + ", ".join(f"d{d} {v * 1e3:.3f} ms ({v / lat['1']:.2f}x)" for d, v in lat.items()))

        def specrt_compare():
            # the product's own check (`specrt compare`), with the by-hand commands it prints
            r = compare_engines(out, report=work / f"compare-{layout}.json", log=lambda s: print("  " + s, flush=True))
            rep["compare"] = {k: r.get(k) for k in ("passed", "summary", "failures", "polygraphy_command",
                                                    "polygraphy_trt_command")}
            check(r["passed"], f"[{layout}] specrt compare: {r['summary']}")

        def generation():
            # lossless: every governor's greedy tokens are the target's own; fp32 engines give ONNX Runtime's
            if isinstance(reference_tokens, str):
                raise RuntimeError(reference_tokens)
            for governor in ("off", "fixed:4"):
                got = generate(out, governor)
                diff = [(i, next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w))))
                        for i, (g, w) in enumerate(zip(got, reference_tokens)) if g != w]
                rep[f"tokens_{governor}"] = got
                what = (f"[{layout}] generation --governor {governor}: {len(PROMPTS)} prompts x {NEW_TOKENS} greedy "
                        f"tokens " + ("equal ONNX Runtime's" if not diff else
                                      f"differ from ONNX Runtime's (prompt, first position): {diff}"))
                if args.precision == "fp32":
                    check(not diff, what)
                else:  # fp16/bf16 rounding may flip a near-tie: evidence, not a check
                    print(f"  (not checked at {args.precision}) {what}", flush=True)

        def tamper():
            # a flipped byte in a plan is refused
            bad = work / f"tampered-{layout}"
            shutil.rmtree(bad, ignore_errors=True)
            shutil.copytree(out, bad)
            plan_file = bad / next(f for f in plans if f.endswith(".plan"))
            data = bytearray(plan_file.read_bytes())
            data[len(data) // 2] ^= 1
            plan_file.unlink()
            plan_file.write_bytes(bytes(data))
            try:
                load_engines(bad)
                check(False, f"[{layout}] tampered plan refused")
            except UserError as e:
                check("content differs" in str(e), f"[{layout}] tampered plan refused: {e}")

        for name, fn in (("polygraphy comparison", polygraphy_comparison), ("runner path", runner_path),
                         ("specrt compare", specrt_compare), ("generation", generation), ("tamper", tamper)):
            step(layout, name, fn)
    report.update(checks=checks, failures=failures)
    if report_path is not None:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps(report, indent=2, default=str))
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    # the checks again at the end, where a long build log cannot push them out of a tail
    print("\n".join(["", "summary:", *checks, f"{len(checks) - len(failures)} passed, {len(failures)} failed"
                     + (f"; report {report_path}" if report_path is not None else "")]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
