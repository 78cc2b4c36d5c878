"""How much does a build's cost table move between profiling processes? (2026-11-30)

Profiles ENGINES' cost table (engines/costs.py ``profile_costs``, the build's own
routine, at one past length) in ``--processes`` fresh processes one after another, for
each ``--repeats`` value, and prints each table's verify latencies, its ratios to
verify.1, and whether it puts a deeper depth below a shallower one. DSpark starts from
the build's one table and corrects it online; this measures how steady that prior is.

    python tools/exp_profile_spread.py ENGINES [--processes 4] [--repeats 10,40] [--past 128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def profile_once(engines: str, repeats: int, past: int) -> dict:
    from specrt.engines import load_engines
    from specrt.engines.costs import profile_costs

    e = load_engines(engines, verify=False)
    with e:
        vocab = int(e.export["target"]["vocab_size"])
        c = profile_costs(e.runners, vocab={"target": vocab, "draft": vocab}, depths=tuple(e.depths),
                          draft_kind=e.export.get("draft", {}).get("kind"), pasts=(past,), repeats=repeats)
    return {"verify": {int(k): v for k, v in c["verify"].items()}, "decode": c["decode"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--repeats", default="10,40")
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(profile_once(args.engines, args.child, args.past)))
        return 0
    for repeats in (int(r) for r in args.repeats.split(",")):
        ratios = []
        for i in range(args.processes):
            out = subprocess.run([sys.executable, __file__, args.engines, "--child", str(repeats), "--past",
                                  str(args.past)], check=True, capture_output=True, text=True).stdout
            t = json.loads(out.strip().splitlines()[-1])
            ver = {int(k): v for k, v in t["verify"].items()}
            depths = sorted(ver)
            inverted = [f"{a}>{b}" for a, b in zip(depths, depths[1:]) if ver[a] > ver[b]]
            ratios.append(ver[depths[1]] / ver[depths[0]])
            print(f"{repeats:3d} passes, process {i + 1}: decode {t['decode'] * 1e3:.2f} ms; verify "
                  + " ".join(f"{d}:{ver[d] * 1e3:.2f}" for d in depths)
                  + "; / verify.1 " + " ".join(f"{ver[d] / ver[depths[0]]:.3f}" for d in depths[1:])
                  + (f"; inverted {', '.join(inverted)}" if inverted else ""), flush=True)
        print(f"{repeats:3d} passes: verify.{sorted(ver)[1]} / verify.1 {min(ratios):.3f}-{max(ratios):.3f} "
              f"over {len(ratios)} processes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
