"""Paired per-prompt ratios of two configurations in a `specrt bench` report.

    .venv/bin/python tools/bench_paired.py REPORT/bench.json A B [A2 B2 ...] [--prompts FROM:TO]

For each pair (A over B, names as in the report's table: `specrt:off:ngram`, or without
the `specrt:` prefix): every prompt's tokens/s under A divided by the same prompt's under
B, then the median of those ratios and how many prompts ran faster under A. In an
interleaved bench each prompt runs every configuration in turn, so a pair compares the
same prompt at nearly the same moment: on a noisy host the per-prompt ratio is steadier
than a ratio of the two configurations' medians over prompts (which may come from
different prompts). ``--prompts 10:20`` takes the 11th to 20th prompts only (prompts
asked a second time, say); the totals are over the same prompts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specrt.cmd_bench import paired_ratio  # noqa: E402


def paired(report: dict, a: str, b: str, lo: int | None = None, hi: int | None = None) -> dict:
    """{median, faster, prompts, median_a/b, total_a/b} of A over B (module doc); totals are
    tokens over seconds in the range, from each prompt's rate and its output's length."""
    configs, rates, totals = report["configs"], {}, {}
    for name in (a, b):
        key = name if name in configs else f"specrt:{name}"
        if key not in configs:
            raise SystemExit(f"no configuration '{name}' in the report (it has: {', '.join(configs)})")
        rates[name] = configs[key]["tokens_per_s_per_prompt"][lo:hi]
        tokens = [len(o) for o in report.get("outputs", {}).get(key, [])][lo:hi]
        totals[name] = (sum(tokens) / sum(n / t for n, t in zip(tokens, rates[name]))
                        if len(tokens) == len(rates[name]) and all(t > 0 for t in rates[name]) else None)
    ta, tb = rates[a], rates[b]
    if len(ta) != len(tb) or not ta:
        raise SystemExit(f"'{a}' and '{b}' have {len(ta)} and {len(tb)} prompts in the range")
    ratios = [x / y for x, y in zip(ta, tb) if y > 0]
    return {"median": paired_ratio(ta, tb), "faster": sum(r > 1 for r in ratios), "prompts": len(ratios),
            "median_a": statistics.median(ta), "median_b": statistics.median(tb),
            "total_a": totals[a], "total_b": totals[b]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("pairs", nargs="+", help="A B [A2 B2 ...]")
    ap.add_argument("--prompts", default=None, metavar="FROM:TO", help="a range of prompts (0-based, TO excluded)")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        raise SystemExit("configurations come in pairs: A B [A2 B2 ...]")
    lo = hi = None
    if args.prompts:
        a, _, b = args.prompts.partition(":")
        lo, hi = int(a) if a else None, int(b) if b else None
    report = json.loads(args.report.read_text())
    for a, b in zip(args.pairs[::2], args.pairs[1::2]):
        r = paired(report, a, b, lo, hi)
        line = (f"{a} / {b}: per-prompt ratio median {r['median']:.3f}, faster on {r['faster']}/{r['prompts']}; "
                f"medians {r['median_a']:.1f} / {r['median_b']:.1f} tok/s")
        if r["total_a"] is not None:
            line += f"; totals {r['total_a']:.1f} / {r['total_b']:.1f} tok/s"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
