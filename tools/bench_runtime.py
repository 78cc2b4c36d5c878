"""Runtime benchmark (issue 6): speculation at the best fixed depth vs the same engines
without it, greedy, the same prompts and token budget, in one run.

    .venv/bin/python tools/bench_runtime.py ENGINES [--prompts tools/data/heldout_prompts.jsonl]
        [--n 10] [--max-new-tokens 128] [--threads N] [--depths 1,2,4] [-o REPORT_DIR]

1. ``specrt:off`` and ``specrt:fixed:D`` for every built depth D (or ``--depths``) in
   specrt/cmd_bench.py's workers (one warm-up, then every prompt timed, prefill
   included), interleaved as ``specrt bench`` does (one worker process serving every
   configuration, prompt by prompt each in turn; ``--schedule sequential`` runs each
   configuration in a process of its own, one after another, which on a drifting VM
   mixes the machine's drift into the ratio); the
   best fixed depth is the one with the highest median tokens/s. Outputs must be
   token-identical to ``off``.
2. Prints the tokens/s ratio best-fixed / off, the Python orchestration share of wall time
   (telemetry ``time_split["python"] / seconds``: wall minus time inside engines;
   target <= 10%), and the acceptance.
3. Runs ``specrt run ENGINES --prompts ... --governor fixed:BEST --quiet`` as a child
   process and reads its own peak RSS (``os.wait4``'s ru_maxrss when it exceeds this
   process's own high-water mark, which Linux carries into it across exec; else the
   child's polled VmHWM), compared with the engines' weight
   bytes (``engines.json`` weight_bytes) plus the KV caches at the context limit,
   ``2 * layers * max_context * kv_heads * head_dim * bytes`` for target and draft
   (target <= 1.3x).

Prompts are chat-wrapped (``--no-chat`` to send them raw). Writes ``runtime_bench.json``
into ``-o`` when given.

``--rss-governors auto,off,...`` measures step 3 alone, once per governor spec given (each
``specrt run`` over the same prompts in a process of its own): what ``auto`` costs with the
engines' corpus (``specrt corpus``) and session growth (``:grow``) beside the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PYTHON_SHARE_TARGET = 0.10
RSS_TARGET = 1.3


def _hwm(status: str) -> int:
    """VmHWM bytes from a /proc/PID/status file (0 when it cannot be read)."""
    try:
        for line in Path(status).read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def kv_bytes(engines) -> dict[str, int]:
    """KV cache bytes at the context limit, per graph (the formula of the module doc)."""
    from specrt.engines.build import kv_cache_bytes

    return kv_cache_bytes(engines.export, engines.max_context)


def budget_bytes(engines) -> tuple[int, dict[str, int], int]:
    """(engine weight bytes, KV bytes per graph, their sum): what RSS_TARGET is a multiple of."""
    weights, kv = engines.weight_bytes, kv_bytes(engines)
    return weights, kv, weights + sum(kv.values())


def run_cli_rss(engines_dir: Path, prompts: list[str], chat: bool, max_new: int, governor: str,
                threads: int | None) -> dict:
    """``specrt run`` in a child process: its own ru_maxrss and its stats JSON."""
    with tempfile.TemporaryDirectory(prefix="specrt-runtime-bench-") as tmp:
        pf, sf = Path(tmp) / "prompts.jsonl", Path(tmp) / "stats.json"
        pf.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        cmd = [sys.executable, "-m", "specrt.cli", "run", str(engines_dir), "--prompts", str(pf), "--quiet",
               "--max-new-tokens", str(max_new), "--governor", governor, "--stats", str(sf)]
        if chat:
            cmd.append("--chat")
        t0 = time.perf_counter()
        rss: dict = {}
        peak, rc = child_peak_rss(cmd, rss)
        err = rss["stderr"]
        wall = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"specrt run failed (exit {rc}):\n{err}")
        stats = json.loads(sf.read_text())
    return {"peak_rss_bytes": peak, "ru_maxrss_bytes": rss["ru_maxrss"], "polled_vmhwm_bytes": rss["polled"],
            "parent_vmhwm_bytes": rss["parent"], "wall_seconds": wall, "stats": stats, "command": cmd,
            "stderr_tail": err.strip().splitlines()[-1:] if err.strip() else []}


def child_peak_rss(cmd: list[str], detail: dict | None = None) -> tuple[int, int]:
    """Run ``cmd`` (stdout dropped, stderr captured) and return (its own peak RSS in bytes, its
    exit code). Linux carries ru_maxrss across exec, so a child's is max(its own peak, this
    process's at spawn): it is the child's own where it exceeds our high-water mark, else the
    child's VmHWM polled while it ran is. ``detail`` gets ru_maxrss, polled, parent, returncode
    and stderr."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ), text=True)
    polled = [0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            polled[0] = max(polled[0], _hwm(f"/proc/{p.pid}/status"))
            done.wait(0.02)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    done.set()
    th.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    maxrss, parent = ru.ru_maxrss * 1024, _hwm("/proc/self/status")
    peak = maxrss if maxrss > parent else polled[0]
    if detail is not None:
        detail.update(ru_maxrss=maxrss, polled=polled[0], parent=parent, returncode=p.returncode, stderr=err)
    return peak, p.returncode


def baseline_rss() -> int:
    """VmHWM of a child that only imports what ``specrt run`` imports (no engines)."""
    code = ("import numpy, onnxruntime, tokenizers, jinja2, click\n"
            "import specrt.cli, specrt.runtime.session, specrt.engines.engine_set\n"
            "print([l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1])")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout) * 1024


def rss_only(args) -> int:
    """``--rss-governors``: the peak RSS of ``specrt run`` per governor spec against the
    engines' weights + KV caches (RSS_TARGET)."""
    from specrt.cmd_bench import read_prompts
    from specrt.engines.engine_set import load_engines

    engines = load_engines(args.engines)
    texts = [it.get("prompt") for it in read_prompts(args.prompts)[: args.n]]
    if not all(isinstance(t, str) for t in texts):
        raise SystemExit(f"{args.prompts}: --rss-governors needs text prompts (`specrt run` takes them)")
    weights, kv, budget = budget_bytes(engines)
    corpus = Path(args.engines) / "corpus.npz"
    print(f"engines {args.engines}: weights {weights / 2**20:.0f} MiB + KV {sum(kv.values()) / 2**20:.0f} MiB "
          f"(context {engines.max_context}) = {budget / 2**20:.0f} MiB; corpus "
          + (f"{corpus.stat().st_size / 2**20:.1f} MiB on disk" if corpus.is_file() else "none"))
    print(f"{len(texts)} prompts x {args.max_new_tokens} tokens, chat={not args.no_chat}; interpreter + libraries "
          f"{baseline_rss() / 2**20:.0f} MiB")
    out = {}
    for gov in args.rss_governors.split(","):
        cli = run_cli_rss(args.engines, texts, not args.no_chat, args.max_new_tokens, gov, args.threads)
        x = cli["peak_rss_bytes"] / budget
        st = cli["stats"]
        print(f"{gov:34s} ({st.get('governor', gov)}) peak RSS {cli['peak_rss_bytes'] / 2**20:.0f} MiB = {x:.2f}x "
              f"weights + KV -> target <= {RSS_TARGET}x: {'PASS' if x <= RSS_TARGET else 'FAIL'}  "
              f"({st['new_tokens']} tokens, {st['tokens_per_s']:.1f} tok/s)")
        out[gov] = {"peak_rss_bytes": cli["peak_rss_bytes"], "ratio": x, "governor": st.get("governor", gov),
                    "tokens_per_s": st["tokens_per_s"], "new_tokens": st["new_tokens"]}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rss.json").write_text(json.dumps({"weight_bytes": weights, "kv_bytes": kv, "runs": out},
                                                      indent=1))
    return 0 if all(r["ratio"] <= RSS_TARGET for r in out.values()) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engines", type=Path)
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "data" / "heldout_prompts.jsonl")
    ap.add_argument("--n", type=int, default=10, help="first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--depths", default=None, help="fixed depths to try (default: every built depth)")
    ap.add_argument("--no-chat", action="store_true")
    ap.add_argument("--schedule", choices=("interleaved", "sequential"), default="interleaved")
    ap.add_argument("--rss-governors", default=None,
                    help="comma-separated governor specs: only the peak RSS of `specrt run` with each")
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.depths is not None:  # (as build's and bench_engines': "1,,2" was int('')'s traceback, after the load: r74)
        from specrt.engines.plan import parse_depths
        from specrt.errors import UserError

        try:
            args.depths = list(parse_depths(args.depths))
        except UserError as e:
            ap.error(str(e))
    if args.rss_governors:
        return rss_only(args)

    from specrt.cmd_bench import (REFERENCE, _run_interleaved, identity, load_bench_lib, read_prompts, run_config,
                                  summarise_config, tokenize_prompts)
    from specrt.engines.engine_set import load_engines
    from specrt.engines.onnxruntime import physical_cores

    chat = not args.no_chat
    engines = load_engines(args.engines)
    if engines.export.get("draft") is None:
        raise SystemExit(f"{args.engines}: the engines have no draft: nothing to speculate with")
    depths = args.depths or list(engines.depths)
    threads = args.threads or physical_cores()
    items = read_prompts(args.prompts)[: args.n]
    prompts = tokenize_prompts(items, engines, chat)
    eos = list(engines.export["target"]["eos_token_ids"])
    lib = load_bench_lib()
    machine = lib.machine_info(threads) if lib else {}
    print(f"machine: {machine.get('cpu_model')}, {machine.get('physical_cores')} cores, {threads} threads, "
          f"load {machine.get('load_average_at_start')}")
    print(f"engines: {args.engines} ({engines.backend} {engines.precision}, depths {list(engines.depths)}, "
          f"draft {engines.export['draft']['kind']}); {len(prompts)} prompts x {args.max_new_tokens} tokens, "
          f"greedy, chat={chat}")

    govs = ["off", *[f"fixed:{d}" for d in depths]]
    base = {"kind": "specrt", "engines": str(args.engines.resolve()), "prompts": prompts, "eos": eos,
            "max_new_tokens": args.max_new_tokens, "threads": threads, "warmup_tokens": 8}
    try:
        from tqdm import tqdm

        bar = tqdm(total=len(govs) * len(prompts), unit="prompt", file=sys.stderr)
    except ImportError:
        bar = None
    logs = Path(tempfile.mkdtemp(prefix="specrt-runtime-bench-logs-"))
    results = {}
    if args.schedule == "interleaved":
        skipped: dict[str, str] = {}
        failed: dict[str, str] = {}
        _run_interleaved([(f"specrt:{g}", {**base, "governor": g}) for g in govs], len(prompts), logs, bar, results,
                         skipped, failed, print)
        if failed or skipped:
            raise SystemExit(f"failed: {failed or skipped}")
        govs = []
    for g in govs:
        if bar is not None:
            bar.set_description(f"specrt:{g}")
        res = run_config({**base, "governor": g}, logs / f"{g.replace(':', '_')}.log",
                         lambda m: bar.update(1) if bar is not None and m != "warm" else None)
        if not res.get("ok"):
            raise SystemExit(f"specrt:{g} failed: {res.get('error') or res.get('skipped')}")
        results[f"specrt:{g}"] = res
    if bar is not None:
        bar.close()
    configs = {n: summarise_config(n, r, prompts, engines) for n, r in results.items()}
    ident = identity({n: [p["output_ids"] for p in r["per_prompt"]] for n, r in results.items()}, REFERENCE)
    off = configs[REFERENCE]
    best = max((n for n in configs if n != REFERENCE), key=lambda n: configs[n]["tokens_per_s_median"])
    b = configs[best]
    ratio = b["tokens_per_s_median"] / off["tokens_per_s_median"]

    print()
    print(f"{'configuration':16s} {'tok/s med':>9s} {'tok/s tot':>9s} {'tau':>5s} {'python':>7s} {'draft':>6s} "
          f"{'verify':>6s} {'prefill':>7s} {'identical':>9s}")
    for n, c in configs.items():
        fr = c["time_split_fraction"]
        idc = ident["configs"].get(n)
        same = f"{idc['identical_prompts']}/{idc['prompts']}" if idc else "ref"
        print(f"{n:16s} {c['tokens_per_s_median']:9.2f} {c['tokens_per_s_total']:9.2f} {c['tau']:5.2f} "
              f"{100 * c['python_share']:6.1f}% {100 * fr.get('draft', 0):5.1f}% {100 * fr.get('verify', 0):5.1f}% "
              f"{100 * fr.get('prefill', 0):6.1f}% {same:>9s}")
    print()
    print(f"best fixed depth: {best} (tau {b['tau']:.2f}, acceptance by position "
          f"{' '.join(f'{a:.2f}' for a in b['acceptance_by_position'])})")
    print(f"tokens/s ratio {best} / off: {b['tokens_per_s_median']:.2f} / {off['tokens_per_s_median']:.2f} = "
          f"{ratio:.2f}x (median over prompts; totals {b['tokens_per_s_total'] / off['tokens_per_s_total']:.2f}x)")
    ok_py = b["python_share"] <= PYTHON_SHARE_TARGET
    print(f"Python orchestration share of wall time, {best}: {100 * b['python_share']:.1f}% "
          f"(off: {100 * off['python_share']:.1f}%) -> target <= {100 * PYTHON_SHARE_TARGET:.0f}%: "
          f"{'PASS' if ok_py else 'FAIL'}")
    pr = b["predicted"]
    print(f"decode phase, {best}: predicted from tau and the cost table {pr['predicted_tokens_per_s']:.2f} tok/s, "
          f"engines-only {pr['engines_tokens_per_s']:.2f}, measured {pr['measured_tokens_per_s']:.2f} "
          f"({pr['measured_over_predicted']:.2f}x predicted)")

    gov = best.split(":", 1)[1]
    texts = [it.get("prompt") for it in items]
    rss = None
    if all(isinstance(t, str) for t in texts):
        cli = run_cli_rss(args.engines, texts, chat, args.max_new_tokens, gov, threads)
        weights, kv, budget = budget_bytes(engines)
        x = cli["peak_rss_bytes"] / budget
        rss = {"peak_rss_bytes": cli["peak_rss_bytes"], "weight_bytes": weights, "kv_bytes": kv,
               "ratio": x, "wall_seconds": cli["wall_seconds"], "tokens_per_s": cli["stats"]["tokens_per_s"]}
        print(f"`specrt run --governor {gov}` peak RSS {cli['peak_rss_bytes'] / 2**20:.0f} MiB vs weights "
              f"{weights / 2**20:.0f} MiB + KV {sum(kv.values()) / 2**20:.0f} MiB (target {kv.get('target', 0) / 2**20:.0f}"
              f" + draft {kv.get('draft', 0) / 2**20:.0f}, context {engines.max_context}) = {x:.2f}x -> target <= "
              f"{RSS_TARGET}x: {'PASS' if x <= RSS_TARGET else 'FAIL'}")
        print(f"  (that run: {cli['stats']['new_tokens']} tokens at {cli['stats']['tokens_per_s']:.2f} tok/s, "
              f"tau {cli['stats']['tau']:.2f})")
        base = baseline_rss()
        w = results[best]
        steady = max(w["rss_after_load_bytes"], w["rss_end_bytes"])
        rss.update(baseline_bytes=base, worker_rss_after_load_bytes=w["rss_after_load_bytes"],
                   worker_rss_end_bytes=w["rss_end_bytes"], worker_peak_rss_bytes=w["peak_rss_bytes"],
                   steady_ratio=steady / budget)
        print(f"  breakdown ({best} worker): interpreter + libraries {base / 2**20:.0f} MiB; RSS after loading the "
              f"engines {w['rss_after_load_bytes'] / 2**20:.0f} MiB, after the last prompt "
              f"{w['rss_end_bytes'] / 2**20:.0f} MiB ({steady / budget:.2f}x weights + KV), peak "
              f"{w['peak_rss_bytes'] / 2**20:.0f} MiB" + (" (the peak lies above every steady state: a transient, "
                                                         "e.g. while ONNX Runtime creates the sessions)"
                                                         if w["peak_rss_bytes"] > 1.05 * steady else ""))
    else:
        print("peak RSS of `specrt run`: skipped (the prompts file has token ids, not text)")
    print("worker peak RSS (one worker for every configuration when interleaved): " + ", ".join(
        f"{n} {c['peak_rss_bytes'] / 2**20:.0f} MiB" for n, c in configs.items()))
    bad = ident["failures"]
    for f in bad:
        print(f"FAILURE: {f['config']} differs from off on prompt {f['prompt']} at token {f['first_diff']}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runtime_bench.json").write_text(json.dumps(
            {"machine": machine, "engines": str(args.engines), "prompts": len(prompts),
             "max_new_tokens": args.max_new_tokens, "threads": threads, "schedule": args.schedule, "best": best, "ratio_vs_off": ratio,
             "python_share": b["python_share"], "rss": rss, "configs": configs, "identity": ident}, indent=2))
        print(f"report: {args.out / 'runtime_bench.json'}")
    return 1 if bad else 0


if __name__ == "__main__":
    from bench_lib import run_tool

    run_tool(main)  # (an engines folder that is not one: an error line, not a traceback)
