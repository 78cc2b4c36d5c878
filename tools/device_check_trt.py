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
4. the specrt Runner path: ``load_engines`` + ``runner.infer`` against ONNX Runtime;
5. tamper check: one flipped plan byte must make ``load_engines`` refuse;
6. latency per depth relative to depth 1 (median of 50) for each layout, the evidence
   for the profile-vs-engine decision (plan.py).

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

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"[{'PASS' if ok else 'FAIL'}] {what}", flush=True)
    if not ok:
        failures.append(what)


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
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner
    from polygraphy.comparator import Comparator, CompareFunc

    print(f"TensorRT {tensorrt.__version__}, GPU {gpu_info()['name']}, precision {args.precision}")
    work = args.out or Path(tempfile.mkdtemp(prefix="specrt-device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    exp = work / "export"
    export(REFERENCE / "verifier", REFERENCE / "draft", exp, force=True)
    check((exp / "export.json").is_file(), "export of the tiny reference pair")
    ort_dir = build_reference(exp, work / "engines-ort")
    tol = TOL[args.precision]
    rng = np.random.default_rng(0)
    latency: dict[str, dict[str, float]] = {}
    for layout in args.layouts.split(","):
        out = work / f"engines-trt-{layout}"
        t0 = time.perf_counter()
        try:
            m = build_engines(exp, "tensorrt", DEPTHS, out, precision=args.precision, force=True, trt_layout=layout,
                              profile_repeats=10, log=lambda s: print("  " + s, flush=True))
        except Exception as e:  # report and carry on with the next layout
            check(False, f"[{layout}] build: {type(e).__name__}: {e}")
            continue
        plans = {f["file"]: f["bytes"] for f in m["files"]}
        check(True, f"[{layout}] build in {time.perf_counter() - t0:.1f} s; plans {plans}")
        c = m["costs"]
        print(f"  cost table: verify {c['verify']} decode {c['decode']} draft {c.get('draft')}")

        try:  # a failing step is reported and the next layout still runs
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

            # the specrt Runner path, and latency per depth
            with load_engines(out) as trt, load_engines(ort_dir) as ref:
                worst = 0.0
                for role in ["decode", *[f"verify.{d}" for d in DEPTHS], "prefill", "draft"]:
                    sizes = role_sizes(trt.runner(role), 40, draft_depth=max(DEPTHS), draft_accepted=2, prefill_tokens=16,
                                       draft_kind="peagle")
                    feeds = synthetic_feeds(trt.runner(role), sizes, 1000, rng)
                    got, want = trt.runner(role).infer(feeds), ref.runner(role).infer(feeds)
                    for k, v in want.items():
                        if v.dtype.kind == "f":
                            worst = max(worst, float(np.max(np.abs(got[k] - v) / (tol + tol * np.abs(v)))))
                        else:
                            worst = max(worst, 0.0 if np.array_equal(got[k], v) else 2.0)
                check(worst <= 1.0, f"[{layout}] specrt runners match ONNX Runtime (worst error / tolerance {worst:.3f})")
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
                latency[layout] = lat
                print(f"  [{layout}] verify latency at past 128: "
                      + ", ".join(f"d{d} {v * 1e3:.3f} ms ({v / lat['1']:.2f}x)" for d, v in lat.items()))

            # a flipped byte in a plan is refused
            bad = work / f"tampered-{layout}"
            shutil.rmtree(bad, ignore_errors=True)
            shutil.copytree(out, bad)
            plan_file = bad / next(iter(plans))
            data = bytearray(plan_file.read_bytes())
            data[len(data) // 2] ^= 1
            plan_file.unlink()
            plan_file.write_bytes(bytes(data))
            try:
                load_engines(bad)
                check(False, f"[{layout}] tampered plan refused")
            except UserError as e:
                check("content differs" in str(e), f"[{layout}] tampered plan refused: {e}")
        except Exception as e:
            traceback.print_exc()
            check(False, f"[{layout}] {type(e).__name__}: {e}")
    print(json.dumps({"latency": latency, "failures": failures}, indent=2))
    if args.out is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
