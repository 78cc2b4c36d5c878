"""Engine benchmark on SmolLM2-135M, CPU: verify latency per depth, allocation per step, RSS.

    .venv/bin/python tools/bench_engines.py [--variants shared,per-depth,plain] [--contexts 128,512]
                                            [--depths 1,2,4,8] [--repeats 15] [--rounds 3] [--steps 300]
                                            [--passes 1]

Steps: SmolLM2 folder (tools/smollm2.py) -> target-only export (cached under
$SPECRT_CACHE/bench-engines/) -> ``build_engines(..., "onnxruntime", depths)`` -> one
child process per variant, so that each variant's RSS is its own. A child:

* loads the engine set with the variant's ONNX Runtime settings and reports RSS before
  and after activation against the engine weight bytes;
* times verify at every depth (and decode, S = 1) at each context: past KV as prefix views
  of a preallocated cache filled with random values, one call per (context, depth) in
  turn, rounds x repeats times, so machine noise hits them alike; the median; prints each
  depth's latency relative to depth 1 measured in the same run;
* runs ``--steps`` decode steps with a growing past, tracking Python allocations per step
  (tracemalloc) and RSS growth from step 20 to the end.

Variants: ``shared`` (the build's settings: one prepacked session per graph; engines built
now spin within a run, engines/onnxruntime.py),
``per-depth`` (a session per depth with new_tokens fixed, weights shared, no prepacking),
``per-depth-prepack`` (a session per depth with its own prepacked weights: N x memory, to
isolate the effect of specialisation), ``basic``/``extended`` (graph optimisation level),
``1-thread``, ``sleeping`` (idle intra-op threads sleep: the default before), ``spin``
(threads spin within runs, for engine folders built with ``spin = False``),
``append`` (engines built with ``ort_kv="append"``: the export's portable target graph,
past KV as prefix views, new KV copied out; every other variant runs the default build,
whose target is re-lowered with in-place KV when ONNX Runtime allows it), ``ortgenai``
(onnxruntime-genai 0.18's decode of the same target, its builder's fp32 CPU model, the
engines' thread count and idle-thread policy (the manifest's ``spin``):
``generate_next_token`` timed after a prompt of each context's length, each call followed
by specrt's decode step and depth-1 verify in the same process; the reference for "depth
1 no slower than onnxruntime-genai's per-token time"), and
``plain`` (the export graph in a default InferenceSession called with
``session.run``: the baseline), and ``4k-pages`` (the default build in a process without
glibc's huge-page tunable; every other child runs with huge pages for the weights where
the kernel gives them on request, as the ``specrt`` command does: specrt/hugepages.py). Targets (issue 5): depth 4 <= 1.2x and depth 8 <= 1.35x
of depth 1; peak RSS <= 1.3x (weights + KV).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from specrt.hugepages import TUNABLE, has_tunable, with_thp  # noqa: E402

VARIANTS = {
    "shared": {},
    "per-depth": {"sessions": "per-depth"},
    "per-depth-prepack": {"sessions": "per-depth", "prepack": True},
    "basic": {"graph_optimization_level": "ORT_ENABLE_BASIC"},
    "extended": {"graph_optimization_level": "ORT_ENABLE_EXTENDED"},
    "1-thread": {"intra_op_num_threads": 1},
    "sleeping": {"spin": False},
    "spin": {"spin": True},
    "plain": None,  # a default InferenceSession on the export graph, session.run
    "append": {},  # the default settings on engines built with ort_kv="append" (the portable target graph)
    "ortgenai": None,  # onnxruntime-genai's own decode of the same target: per-token time at each context
    "4k-pages": {},  # the default settings in a process without huge pages for the weights (specrt/hugepages.py)
}


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    """VmHWM: this process image's high-water RSS. (ru_maxrss would do on its own, but Linux
    carries it across fork + exec, so a child would report the parent's peak.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---- child: one variant ----------------------------------------------------------------


class PlainRunner:
    """The baseline: the export graph in a default InferenceSession, called with run()."""

    def __init__(self, sess):
        self.sess = sess
        self.names = [o.name for o in sess.get_outputs()]

    def infer(self, feeds):
        return dict(zip(self.names, self.sess.run(None, feeds)))


def synthetic_cache(e, rng, inplace: bool):
    """The preallocated target cache as the runtime holds it (max_context rows in the
    engine's layout, random values) and ``feeds(s, past)``: s new tokens after ``past``."""
    import numpy as np

    from specrt import contracts as C

    t = e.export["target"]
    L, KVH, D = t["num_layers"], t["num_kv_heads"], t["head_dim"]
    shape = (1, KVH, e.max_context, D) if inplace else (1, e.max_context, KVH, D)
    names = [n for i in range(L) for n in ((C.cache_key(i), C.cache_value(i)) if inplace
                                           else (C.past_key(i), C.past_value(i)))]
    cache = {n: rng.standard_normal(shape, dtype=np.float32) * 0.5 for n in names}

    def feeds(s: int, past: int) -> dict:
        return {**({C.HEAD_EXACT: np.array(False)} if e.head is not None else {}),
                C.INPUT_IDS: rng.integers(0, t["vocab_size"], (1, s), dtype=np.int64),
                C.POSITION_IDS: np.arange(past, past + s, dtype=np.int64)[None],
                **(cache if inplace else {k: v[:, :past] for k, v in cache.items()})}

    return cache, feeds


def ortgenai_worker(engines_dir: Path, contexts: list[int], repeats: int, rounds: int) -> dict:
    """Per-token seconds of onnxruntime-genai decoding after a prompt of each context, and
    in the same process, call for call in turn, specrt's decode step and depth-1 verify at
    that context: the two runtimes then see the same machine (a shared VM's speed drifts
    by 10% or more over seconds). Every session's idle threads spin within a run and sleep
    after it, as specrt's engines do, so neither runtime's pool spins through the other's.
    Each timed specrt call includes choosing its greedy tokens, as onnxruntime-genai's
    includes its search: argmax of the logits, or a screened head's exact argmax
    (specrt/head.py, the numpy screen the runtime runs)."""
    import numpy as np

    import bench_lib
    from specrt import contracts as C
    from specrt.engines import load_engines

    e = load_engines(engines_dir, verify=False)
    folder = Path(e.export["binding_receipt"]["target"]["folder"])
    model = bench_lib.ensure_ortgenai_model(folder, receipt_target=e.export["binding_receipt"]["target"])
    threads = int(e.manifest["onnxruntime"]["intra_op_num_threads"])
    spin = bool(e.manifest["onnxruntime"].get("spin", False))
    peer = bench_lib.OrtGenaiPeer(model, threads, spin=spin, stop_spinning=spin)
    e.activate()
    rng = np.random.default_rng(0)
    _, make_feeds = synthetic_cache(e, rng, e.kv_layout("target") == "inplace")
    og, lat = peer.og, {}

    def greedy(out: dict):
        if e.head is None:
            return out[C.LOGITS][0].argmax(-1)
        return e.head.argmax(out[C.LOGITS][0], out[C.HEAD_HIDDEN][0], out[C.HEAD_NORMS][0])

    for c in contexts:
        feeds = {s: make_feeds(s, c) for s in (1, 2)}
        ts: dict[str, list[float]] = {"ortgenai": [], "decode": [], "1": []}
        for _ in range(rounds):
            params = og.GeneratorParams(peer.model)
            params.set_search_options(max_length=c + repeats + 3, do_sample=False)
            gen = og.Generator(peer.model, params)
            gen.append_tokens(rng.integers(3, 40000, (1, c), dtype=np.int32))
            gen.generate_next_token()  # the first token comes from the prompt pass
            for s in (1, 2):
                e.target(s).infer(feeds[s])
            for _ in range(repeats):
                t0 = time.perf_counter()
                gen.generate_next_token()
                t1 = time.perf_counter()
                greedy(e.target(1).infer(feeds[1]))
                t2 = time.perf_counter()
                greedy(e.target(2).infer(feeds[2]))
                ts["ortgenai"].append(t1 - t0), ts["decode"].append(t2 - t1), ts["1"].append(time.perf_counter() - t2)
        for k, v in ts.items():
            lat[f"{c}/{k}"] = float(np.median(v))
    e.deactivate()
    return {"variant": "ortgenai", "settings": {"threads": threads, "spin": spin}, "kv_layout": "ortgenai",
            "latency": lat, "peak_rss": peak_rss_bytes(), "model": str(model), "huge_pages": has_tunable()}


def worker(engines_dir: Path, variant: str, contexts: list[int], depths: list[int], repeats: int, rounds: int,
           steps: int) -> dict:
    import numpy as np

    from specrt.engines import load_engines
    from specrt.engines.costs import time_round_robin

    rss0 = rss_bytes()
    e = load_engines(engines_dir, verify=False, ort_overrides=VARIANTS[variant] or {})
    weights = e.manifest["weight_bytes"]["target"]
    t0 = time.perf_counter()
    if VARIANTS[variant] is None:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(e.export_dir / "target.onnx"), providers=["CPUExecutionProvider"])
        runner = PlainRunner(sess)
        target = lambda s: runner  # noqa: E731
    else:
        e.activate()
        target = e.target
    load_s = time.perf_counter() - t0
    rss_loaded = rss_bytes()
    max_ctx = max(contexts) + max(depths) + 1 + steps
    if max_ctx > e.max_context:
        raise SystemExit(f"contexts + depths + steps need {max_ctx} positions; the engines hold {e.max_context}")
    rng = np.random.default_rng(0)
    inplace = VARIANTS[variant] is not None and e.kv_layout("target") == "inplace"
    cache, feeds = synthetic_cache(e, rng, inplace)
    kv_bytes = sum(v.nbytes for v in cache.values())

    all_depths = [0, *depths]  # 0 = decode (S = 1)
    # one call per case in turn: a slow spell of the machine (seconds long on a shared VM)
    # then hits every depth alike instead of the few whose calls it happened to cover
    cases = [((c, d), target(d + 1), feeds(d + 1, c)) for c in contexts for d in all_depths]
    lat = {f"{c}/{d}": t for (c, d), t in time_round_robin(cases, rounds * repeats, warmup=2).items()}

    # allocation per step: decode with a growing past, as generation does
    r = target(1)
    per_step, rss_20 = [], None
    tracemalloc.start()
    for i in range(steps):
        past = max(contexts) + i
        f = feeds(1, past)
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        r.infer(f)
        per_step.append(tracemalloc.get_traced_memory()[1] - base)
        if i == 20:
            rss_20 = rss_bytes()
    tracemalloc.stop()
    rss_end = rss_bytes()
    if VARIANTS[variant] is not None:
        e.deactivate()
    # the variant's settings as its sessions hold them (not as asked: one dropped on the way
    # would have measured the defaults under the variant's name)
    used = None if VARIANTS[variant] is None else {k: getattr(e.ort_settings, k) for k in VARIANTS[variant]}
    return {"variant": variant, "settings": used, "kv_layout": "inplace" if inplace else "append",
            "weights": weights, "kv_bytes": kv_bytes,
            "rss_before": rss0, "rss_loaded": rss_loaded, "peak_rss": peak_rss_bytes(), "load_s": load_s,
            "latency": lat, "cache_tokens": max_ctx, "huge_pages": has_tunable(),
            "alloc_per_step_max": max(per_step[5:]), "alloc_per_step_median": float(np.median(per_step)),
            "rss_growth": rss_end - rss_20, "steps": steps, "step_past": [max(contexts), max(contexts) + steps]}


# ---- parent ------------------------------------------------------------------------------

def merge_passes(runs: list[dict]) -> dict:
    """One variant's passes as one result: each latency the median over the passes' medians,
    the peak RSS the highest of any pass, the rest (settings, sizes) the first pass's."""
    res = dict(runs[0])
    res["latency"] = {k: float(statistics.median(r["latency"][k] for r in runs)) for k in runs[0]["latency"]}
    res["peak_rss"] = max(r["peak_rss"] for r in runs)
    return res



def prepare(depths: str, rebuild: bool, draft: Path | None, kv: str = "auto") -> Path:
    from specrt.engines import build_engines
    from specrt.export.export import export
    from specrt.manifest import load_export
    from tests.real_model import smollm2_folder

    import bench_lib

    root = bench_lib.specrt_cache() / "bench-engines"  # (a ~ the shell left is the home folder)
    exp = root / "export"
    try:
        load_export(exp)
    except Exception:
        print(f"exporting SmolLM2-135M to {exp} ...", flush=True)
        export(smollm2_folder(), draft, exp, force=True, log=lambda s: print("  " + s, flush=True))
    out = root / ("engines" if kv == "auto" else f"engines-{kv}")
    print(f"building onnxruntime engines (depths {depths}, KV {kv}) into {out} ...", flush=True)
    build_engines(exp, "onnxruntime", depths, out, force=True, max_context=2048, profile_repeats=10,
                  log=lambda s: print("  " + s, flush=True), ort_kv=kv)
    return out


def pages_line(res: dict) -> str:
    """The child's huge pages as its environment had them (4k-pages without; the others with,
    where specrt/hugepages.py adds the tunable: not with SPECRT_THP=0, glibc < 2.35 or THP never)."""
    return f"malloc huge pages: {'on (' + TUNABLE + ')' if res['huge_pages'] else 'off'}"


def report(res: dict, contexts: list[int], depths: list[int]) -> None:
    mib = 2 ** 20
    if res["variant"] == "ortgenai":
        print(f"\n== ortgenai {json.dumps(res['settings'])} ({res['model']}); specrt's default engines "
              "called in turn with it in the same process")
        print(pages_line(res))
        for c in contexts:
            t, d, v1 = (res["latency"][f"{c}/{k}"] for k in ("ortgenai", "decode", "1"))
            print(f"context {c:4d}: onnxruntime-genai {t * 1e3:.1f} ms per token; specrt decode {d * 1e3:.1f} ms "
                  f"({d / t:.2f}x), depth 1 {v1 * 1e3:.1f} ms ({v1 / t:.2f}x)")
        return
    w, kv = res["weights"], res["kv_bytes"]
    how = json.dumps(res["settings"]) if res["settings"] is not None else "(plain session.run)"
    print(f"\n== {res['variant']} {how}, {res['kv_layout']} KV")
    print(pages_line(res))
    grown = res["rss_loaded"] - res["rss_before"]
    print(f"load {res['load_s']:.1f} s; engine weights {w / mib:.0f} MiB; RSS after activation "
          f"{res['rss_loaded'] / mib:.0f} MiB (+{grown / mib:.0f} MiB over the process before loading = "
          f"{grown / w:.2f}x weights); peak RSS {res['peak_rss'] / mib:.0f} MiB = {res['peak_rss'] / (w + kv):.2f}x "
          f"(weights + preallocated KV cache {kv / mib:.0f} MiB)")
    for c in contexts:
        base = res["latency"][f"{c}/1"]
        cells = [f"decode {res['latency'][f'{c}/0'] * 1e3:.1f} ms"]
        cells += [f"d{d} {res['latency'][f'{c}/{d}'] * 1e3:.1f} ms ({res['latency'][f'{c}/{d}'] / base:.2f}x)"
                  for d in depths]
        print(f"context {c:4d}: " + ", ".join(cells))
    print(f"per decode step over {res['steps']} steps (past {res['step_past'][0]}->{res['step_past'][1]}): "
          f"Python allocations max {res['alloc_per_step_max']} B, median {res['alloc_per_step_median']:.0f} B; "
          f"RSS growth from step 20 to the end {res['rss_growth'] / 1024:.0f} KiB")


# issue 5's targets for the default engines (the ``shared`` variant): verify latency relative
# to depth 1 at every context, and depth 1 against onnxruntime-genai's per-token time
DEPTH_TARGETS = {4: 1.20, 8: 1.35}


def verdicts(merged: dict[str, dict], contexts: list[int]) -> list[tuple[str, bool]]:
    """Issue 5's latency targets checked on the merged results (variant -> its result with
    median latencies): each depth in DEPTH_TARGETS within its ratio to depth 1 on the
    ``shared`` engines, and their depth 1 no slower than onnxruntime-genai's token, called
    in turn in one process (the ``ortgenai`` variant). Returns (line, passed) pairs; a
    variant that did not run gives no lines."""
    out: list[tuple[str, bool]] = []
    lat = merged.get("shared", {}).get("latency", {})
    for c in contexts:
        for d, limit in DEPTH_TARGETS.items():
            if f"{c}/{d}" in lat and f"{c}/1" in lat:
                r = lat[f"{c}/{d}"] / lat[f"{c}/1"]
                out.append((f"context {c}: depth {d} {r:.2f}x depth 1 (target <= {limit:.2f}x)", r <= limit))
    og = merged.get("ortgenai", {}).get("latency", {})
    for c in contexts:
        if f"{c}/ortgenai" in og:
            r = og[f"{c}/1"] / og[f"{c}/ortgenai"]
            out.append((f"context {c}: depth 1 {r:.2f}x onnxruntime-genai's per-token time (target <= 1.00x)",
                        r <= 1.0))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="shared,per-depth,plain")
    ap.add_argument("--contexts", default="128,512")
    ap.add_argument("--depths", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--passes", type=int, default=1, help="run the variants in turn this many times")
    ap.add_argument("--draft", type=Path, default=None, help="optional draft folder to export with the target")
    ap.add_argument("--engines", type=Path, default=None, help="use this engines folder instead of building")
    ap.add_argument("--append-engines", type=Path, default=None,
                    help="for the append variant: engines built with ort_kv=append (default: built)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps <= 20:  # RSS growth is measured from step 20 to the end
        ap.error(f"--steps {args.steps}: at least 21 (RSS growth is measured from decode step 20 to the end)")
    from specrt.cmd_bench import _check_items
    from specrt.engines.plan import parse_depths
    from specrt.errors import UserError
    from specrt.limits import digits

    try:  # ("1,,2" was an int('') traceback: refused as specrt bench's lists and build's --depths are, h74e)
        _check_items("--contexts", args.contexts, "each context is timed once a round")
        if not all(digits(x.strip()) for x in args.contexts.split(",")):
            raise UserError(f"--contexts {args.contexts!r}: expected comma-separated integers such as 128,512")
        depths = list(parse_depths(args.depths))
    except UserError as e:
        ap.error(str(e))
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.worker == "ortgenai":
        sys.path.insert(0, str(ROOT / "tools"))
        res = ortgenai_worker(args.engines, contexts, args.repeats, args.rounds)
        print("RESULT " + json.dumps(res))
        return 0
    if args.worker:
        res = worker(args.engines, args.worker, contexts, depths, args.repeats, args.rounds, args.steps)
        print("RESULT " + json.dumps(res))
        return 0
    for v in args.variants.split(","):
        if v not in VARIANTS:
            ap.error(f"unknown variant {v} (choose from {', '.join(VARIANTS)})")
    for flag, folder in (("--engines", args.engines), ("--append-engines", args.append_engines)):
        if folder is not None and not (folder / "engines.json").is_file():  # (a traceback at its read)
            ap.error(f"{flag} {folder}: no engines.json (expected a folder `specrt build` wrote)")
    engines = args.engines or prepare(args.depths, True, args.draft)
    append_engines = None
    if "append" in args.variants.split(","):
        append_engines = args.append_engines or prepare(args.depths, True, args.draft, kv="append")
    m = json.loads((engines / "engines.json").read_text())
    c = m["costs"]
    print(f"cost table of the build (median of {c['repeats']}, seconds): verify "
          f"{ {d: round(v, 5) for d, v in c['verify'].items()} } decode {c['decode']:.5f} "
          f"at past {c['reference_past']}; "
          f"by past: { {p: {d: round(v, 5) for d, v in row['verify'].items()} for p, row in c['by_past'].items()} }")
    print(f"machine: {m['environment']['device']}, load average {os.getloadavg()}")
    results: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    for p in range(args.passes):  # variants alternate, so slow spells of the machine hit them alike
        for v in results:
            folder = append_engines if v == "append" else engines
            cmd = [sys.executable, __file__, "--worker", v, "--engines", str(folder), "--contexts", args.contexts,
                   "--depths", args.depths, "--repeats", str(args.repeats), "--rounds", str(args.rounds),
                   "--steps", str(args.steps)]
            # every child gets huge pages as the specrt command would, except 4k-pages
            out = subprocess.run(cmd, capture_output=True, text=True, env=with_thp(on=v != "4k-pages"))
            line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
            if out.returncode != 0 or line is None:
                print(f"\n== {v} (pass {p + 1}): failed\n{out.stderr[-3000:]}")
                continue
            results[v].append(json.loads(line[7:]))
    if args.passes > 1:
        print(f"\n{args.passes} passes over the variants in turn; latencies are medians over the passes' medians")
    merged: dict[str, dict] = {}
    for v, runs in results.items():
        if not runs:
            continue
        res = merge_passes(runs)
        report(res, contexts, depths)
        merged[v] = res
    checks = verdicts(merged, contexts)
    if checks:
        print("\nissue 5's latency targets, default engines (shared):")
        for line, ok in checks:
            print(f"  [{'PASS' if ok else 'FAIL'}] {line}")
    print(f"\nload average at the end {os.getloadavg()}")
    failed = [v for v, runs in results.items() if not runs]
    if failed:  # (exit 0 read as a bench that measured every variant)
        print(f"no measurement of {', '.join(failed)}: failed in every pass", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
