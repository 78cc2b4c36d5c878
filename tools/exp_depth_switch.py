"""Does a verify call cost more when the previous call had another depth? (session 65)

In session 58's governors bench (results/governors/summary.txt) DSpark's verify calls at
depths 1 and 2 took 21.2 / 21.1 ms against 19.2 / 19.5 ms for ``fixed:1`` / ``fixed:2`` on the
same engines: DSpark changes depth from round to round, a fixed governor never does. This
times the target's verify engine at each depth in two regimes, in alternating blocks so that
the machine's slow spells hit both alike:

* ``same``: every depth's calls in a row (a fixed governor);
* ``switch``: the same calls in a shuffled order of depths (DSpark).

    .venv/bin/python tools/exp_depth_switch.py [--engines DIR] [--past 256] [--depths 1,2,3,4]
                                               [--blocks 20] [--calls 12] [--out FILE.json]

``--engines``: an engines folder (default: tools/bench_engines.py's target-only build in
$SPECRT_CACHE/bench-engines/engines). Past KV: random values in the preallocated cache
(tools/bench_engines.py ``synthetic_cache``), ``--past`` rows before the new tokens.
Prints each depth's median in both regimes and their ratio.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    import bench_lib

    default = bench_lib.specrt_cache() / "bench-engines" / "engines"  # (a ~ the shell left is the home folder)
    ap.add_argument("--engines", type=Path, default=default)
    ap.add_argument("--past", type=int, default=256)
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import numpy as np

    from bench_engines import synthetic_cache
    from specrt.engines import load_engines

    depths = [int(d) for d in args.depths.split(",")]
    e = load_engines(args.engines, verify=False)
    e.activate()
    runners = {d: e.target(d + 1) for d in depths}
    shared = len({id(r) for r in runners.values()}) == 1
    cache, feeds = synthetic_cache(e, np.random.default_rng(0), e.kv_layout("target") == "inplace")
    fixed_feeds = {d: feeds(d + 1, args.past) for d in depths}
    times: dict[str, dict[int, list[float]]] = {"same": {d: [] for d in depths}, "switch": {d: [] for d in depths}}
    rng = random.Random(0)

    def call(d: int) -> float:
        t0 = time.perf_counter()
        runners[d].infer(fixed_feeds[d])
        return time.perf_counter() - t0

    for d in depths:  # warm-up: every shape once
        call(d)
        call(d)
    for block in range(args.blocks):
        regimes = ["same", "switch"] if block % 2 == 0 else ["switch", "same"]
        for regime in regimes:
            if regime == "same":
                for d in depths:
                    call(d)  # the first call after another depth is not a fixed governor's
                    times["same"][d] += [call(d) for _ in range(args.calls)]
            else:
                order = [d for d in depths for _ in range(args.calls)]
                rng.shuffle(order)
                prev = None
                for d in order:
                    t = call(d)
                    if prev is not None and prev != d:
                        times["switch"][d].append(t)
                    prev = d
    e.deactivate()

    res = {"engines": str(args.engines), "past": args.past, "blocks": args.blocks, "calls": args.calls,
           "one_session_for_every_depth": shared, "kv_layout": e.kv_layout("target"),
           "median_ms": {r: {d: statistics.median(v) * 1e3 for d, v in t.items()} for r, t in times.items()},
           "counts": {r: {d: len(v) for d, v in t.items()} for r, t in times.items()}}
    print(f"engines {args.engines} ({'one target session for every depth' if shared else 'a session per depth'}, "
          f"KV {res['kv_layout']}), {args.past} past tokens, {args.blocks} blocks")
    print(f"{'depth':>6s} {'same ms':>9s} {'switch ms':>10s} {'switch/same':>12s}")
    for d in depths:
        s, w = res["median_ms"]["same"][d], res["median_ms"]["switch"][d]
        print(f"{d:6d} {s:9.2f} {w:10.2f} {w / s:12.3f}")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
