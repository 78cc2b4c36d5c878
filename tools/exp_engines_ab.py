"""Two engine folders' target engines timed call for call, in turn, in one process.

    .venv/bin/python tools/exp_engines_ab.py ENGINES_A ENGINES_B [--past 128] [--repeats 30]
        [--exact]

For builds of the same export that differ in one option (e.g. ``--target-head screened``
against the full head): each target role (decode, verify.D) of A then B with the same
synthetic feeds (engines/costs.py), ``--repeats`` rounds, medians and B/A. Taking turns
call by call lets the machine's drift (10% or more over seconds on a shared VM) hit both
alike, which two cost tables profiled minutes apart do not. A screened head is timed on
its greedy path (``head_exact`` false) unless ``--exact``: the fp32 branch sampling uses.
Engine calls only: a screened head's numpy screen (specrt/head.py, ~0.2-0.5 ms a step
here) is not in these times; `tools/bench_engines.py --variants ortgenai` and `specrt
bench` include it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from specrt import contracts as C
    from specrt.engines.costs import role_sizes, synthetic_feeds, time_round_robin
    from specrt.engines.engine_set import load_engines

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--exact", action="store_true", help="a screened head's fp32 branch (head_exact true)")
    args = ap.parse_args(argv)
    sets = [load_engines(args.a), load_engines(args.b)]
    if sets[0].depths != sets[1].depths:
        raise SystemExit(f"depths differ: {sets[0].depths} vs {sets[1].depths}")
    for e in sets:
        e.activate()
    vocab = int(sets[0].export["target"]["vocab_size"])
    names = ["decode"] + [f"verify.{d}" for d in sets[0].depths]
    calls = []
    for name in names:
        for label, e in zip("AB", sets):
            r = e.runners[name]
            sizes = role_sizes(r, args.past, draft_depth=max(e.depths), draft_accepted=2, prefill_tokens=128,
                               draft_kind=None)
            if sizes is None:
                raise SystemExit(f"{name} does not fit past {args.past}")
            feeds = synthetic_feeds(r, sizes, vocab, np.random.default_rng(0))  # the same feeds for A and B
            if args.exact and C.HEAD_EXACT in feeds:
                feeds[C.HEAD_EXACT] = np.array(True)
            calls.append(((name, label), r, feeds))
    t = time_round_robin(calls, args.repeats, 3)
    print(f"A {args.a}\nB {args.b}\npast {args.past}, medians of {args.repeats}, calls in turn"
          + (", screened heads' fp32 branch" if args.exact else ""))
    for name in names:
        a, b = t[(name, "A")], t[(name, "B")]
        print(f"  {name:9s} A {a * 1e3:6.2f} ms  B {b * 1e3:6.2f} ms  B-A {(b - a) * 1e3:+6.2f} ms  B/A {b / a:.3f}")
    for e in sets:
        e.deactivate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
