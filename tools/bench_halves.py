"""Per-prompt tokens/s of a `specrt bench` report, split into its prompts' first and second
half, and per-prompt ratios of configuration pairs: what session growth (``:grow``) does as
a run's history builds up (results/corpus/grow_*; on P20x2 the second half repeats the first).

    python tools/bench_halves.py REPORT/bench.json [A/B ...]

A and B are configuration names as the report has them (specrt:off:ngram:grow/specrt:off:ngram);
without pairs, every ':grow' configuration against the same one without it.
"""

from __future__ import annotations

import json
import statistics as st
import sys
from pathlib import Path


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(__doc__)
        return 1
    report = json.loads(Path(argv[0]).read_text())
    cfgs = report["configs"]
    for name, c in cfgs.items():
        x = c["tokens_per_s_per_prompt"]
        h = len(x) // 2
        print(f"{name:42s} median {c['tokens_per_s_median']:.1f} total {c['tokens_per_s_total']:.1f} "
              f"first-half median {st.median(x[:h]):.1f} second-half median {st.median(x[h:]):.1f} tau {c['tau']:.2f}")
    pairs = [p.split("/") for p in argv[1:]] or [[n, n[: -len(":grow")]] for n in cfgs
                                                  if n.endswith(":grow") and n[: -len(":grow")] in cfgs]
    for a, b in pairs:
        x = [u / v for u, v in zip(cfgs[a]["tokens_per_s_per_prompt"], cfgs[b]["tokens_per_s_per_prompt"])]
        h = len(x) // 2
        print(f"{a} / {b}: per-prompt ratio median {st.median(x):.3f} (first half {st.median(x[:h]):.3f}, "
              f"second {st.median(x[h:]):.3f}); totals {cfgs[a]['tokens_per_s_total'] / cfgs[b]['tokens_per_s_total']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
