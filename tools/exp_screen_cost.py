"""What a screened head's numpy screen costs a step (specrt/head.py).

    .venv/bin/python tools/exp_screen_cost.py ENGINES [--tokens 64] [--depths 0,2,4]

ENGINES: a build with ``--target-head screened``. Decodes the acceptance canary's prompts
greedily with ``off`` (depth 0) and ``fixed:D``, timing every ``HeadScreen.argmax`` call
inside the generator (the engine calls are not included): median microseconds a call, rows
a call and candidates a row.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from specrt.engines.engine_set import load_engines
    from specrt.runtime.canary import prompt_ids
    from specrt.runtime.generate import Generator
    from specrt.runtime.governor import FixedGovernor, OffGovernor
    from specrt.runtime.session import read_d2t

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--depths", default="0,2,4")
    a = ap.parse_args(argv)
    e = load_engines(a.engines)
    if e.head is None:
        raise SystemExit(f"{a.engines}: not built with --target-head screened")
    e.activate()
    head, screen = e.head, e.head.argmax
    times: list[float] = []
    rows: list[int] = []

    def timed(*args, **kw):
        t = time.perf_counter()
        out = screen(*args, **kw)
        times.append(time.perf_counter() - t)
        rows.append(len(out))
        return out

    head.argmax = timed
    prompts = prompt_ids(e.export_dir, int(e.export["target"]["vocab_size"]))
    for d in (int(x) for x in a.depths.split(",")):
        times.clear()
        rows.clear()
        head.rows = head.candidates = 0
        gov = OffGovernor(e.depths) if d == 0 else FixedGovernor(e.depths, d)
        g = Generator(e, gov, d2t=read_d2t(e.export_dir, e.export))
        for p in prompts:
            g.generate(p, a.tokens)
        print(f"{'off' if d == 0 else f'fixed:{d}':8s} {len(times)} screens, median {np.median(times) * 1e6:.0f} us, "
              f"{np.mean(rows):.1f} rows a screen, {head.candidates / max(head.rows, 1):.1f} candidates a row")
    e.deactivate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
