"""Experiment: session growth (``:grow``, runtime/corpus.py Growth) on the held-out answers.

    python tools/exp_grow.py [--heldout STATS.json] [-o OUT.json]

The 80 held-out prompts' greedy answers (``specrt run --governor off --stats``, as
tools/exp_corpus.py reads them) are taken in order, as a session would decode them: each
answer is measured (per first-step key, tries and wins per chain position, greedy
acceptance as tools/lookup_priors.py counts) against a Growth holding the answers before
it (prompt + answer), then added. The per-key rates are ``:grow``'s priors
(corpus.GROW_PRIORS: keys with >= 40 first-step tries, positions with >= 20).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    from exp_corpus import add_heldout_args, heldout_pairs  # this folder's: no heavy imports

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_heldout_args(ap, ROOT / "results" / "corpus" / "heldout_off.json")
    ap.add_argument("--min-tries", type=int, default=40)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from runtime.corpus import Corpus, Growth, match_name  # noqa: E402
    from specrt.paths import write_atomic  # noqa: E402

    pairs = heldout_pairs(args.engines, args.heldout, args.prompts)
    positions = sum(min(len(a), args.max_new) for _, a in pairs)

    def rates(t, w):
        return [round(b / a, 3) if a else None for a, b in zip(t, w)]

    got = Corpus.measure(Growth(), pairs, args.positions, args.max_new)
    t = [sum(v[0][k] for v in got.values()) for k in range(args.positions)]
    w = [sum(v[1][k] for v in got.values()) for k in range(args.positions)]
    out = {"positions": positions, "proposes_at": round(t[0] / positions, 4), "rates": rates(t, w),
           "accepted_per_position": round(sum(w) / positions, 4),
           "keys": {match_name(b): {"key": b, "tries": v[0][0], "tries_by_position": v[0], "rates": rates(*v)}
                    for b, v in sorted(got.items())}}
    print(f"growth: a proposal at {out['proposes_at']:.1%} of {positions} positions, conditional rates "
          f"{out['rates']}, {out['accepted_per_position']:.3f} accepted tokens a position")
    for name, b in out["keys"].items():
        print(f"  {name:40s} key {b['key']}  tries {b['tries']:5d}  {b['rates']}")
    # positions while they had >= min_tries / 2 tries (later ones take the last rate)
    out["grow_priors"] = {str(b["key"]): [r for r, n in zip(b["rates"], b["tries_by_position"])
                                          if n >= args.min_tries // 2][: args.positions]
                          for b in out["keys"].values() if b["tries"] >= args.min_tries}
    print("grow priors (keys with >= %d first-step tries, positions with >= %d): %s"
          % (args.min_tries, args.min_tries // 2, json.dumps(out["grow_priors"])))
    if args.out:
        write_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
