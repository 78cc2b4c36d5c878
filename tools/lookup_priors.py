"""Prompt lookup's acceptance priors (runtime/ngram.py PRIORS) from the target's own answers.

    python tools/lookup_priors.py [fixtures/peagle-data/chat.jsonl.gz ...] [--positions 8]
                                  [--max-new 128] [-o results/lookup_priors/train.json]

For every position i of every answer (context = the prompt's ids + answer[:i], exactly as
the runtime's ``NgramIndex`` sees it), the lookup of the longest matching 2..4-gram
proposes the tokens that followed its last earlier occurrence; the answer's own next
tokens (its first ``--max-new``, the benchmarks' budget: longer answers repeat more) (the target's greedy output) say how many of them a greedy verify would accept.
Per match length n and position k: tries = lookups that reached position k (their
positions 1..k-1 all matched and the answer goes on that far), wins = those whose k-th
token matched too; the conditional rate is wins / tries. Positions past the proposal's
length or the answer's end are not counted.

The default input is the draft's TRAINING answers (the frozen TRAIN prompts'), so the
priors the runtime starts from are not measured on the held-out prompts its benchmarks
use. Prints the rates per n, the share of positions with a match, and the rates per kind.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from runtime.ngram import NMAX, NMIN, NgramIndex, tally  # noqa: E402
from specrt.paths import write_atomic  # noqa: E402

DATA = ROOT / "fixtures" / "peagle-data"
DEFAULT = [DATA / f for f in ("chat.jsonl.gz", "chat-more.jsonl.gz", "chat-extra.jsonl.gz", "chat-rest.jsonl.gz")]


def read(paths: list[Path]):
    for p in paths:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as f:
            for line in f:
                r = json.loads(line)
                yield r.get("kind", "?"), r["prompt_ids"], r["answer_ids"]


def count(prompt: list[int], answer: list[int], positions: int, stats) -> None:
    """Add one answer's lookups to stats[n] = [tries per position, wins per position]
    and stats['positions'] / stats['matched']."""
    index = NgramIndex(NMAX, NMIN)
    index.extend(prompt)
    for i, tok in enumerate(answer):
        proposal, n = index.propose(positions)
        stats["positions"] += 1
        if n:
            stats["matched"][n] += 1
            tally(proposal, answer[i:], *stats[n])
        index.extend([tok])


def new_stats(positions: int):
    s = {n: ([0] * positions, [0] * positions) for n in range(NMIN, NMAX + 1)}
    s["positions"] = 0
    s["matched"] = defaultdict(int)
    return s


def rates(stats, n: int) -> list[float | None]:
    tries, wins = stats[n]
    return [round(w / t, 3) if t else None for t, w in zip(tries, wins)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("answers", nargs="*", type=Path, default=DEFAULT,
                    help="JSON lines (optionally .gz) with prompt_ids, answer_ids and kind")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128,
                    help="count only each answer's first N tokens (the benchmarks' budget; 0 = all)")
    ap.add_argument("-o", "--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    total, by_kind, answers = new_stats(args.positions), {}, 0
    for kind, prompt, answer in read(args.answers):
        answers += 1
        answer = answer[: args.max_new] if args.max_new else answer
        count(prompt, answer, args.positions, total)
        count(prompt, answer, args.positions, by_kind.setdefault(kind, new_stats(args.positions)))
    out = {"answers": answers, "files": [str(p) for p in args.answers], "max_new": args.max_new,
           "positions": total["positions"],
           "rates": {}, "tries": {}, "match_share": {}, "by_kind": {}}
    print(f"{answers} answers, {total['positions']} positions")
    for n in range(NMAX, NMIN - 1, -1):
        share = total["matched"][n] / max(total["positions"], 1)
        out["rates"][n], out["tries"][n], out["match_share"][n] = rates(total, n), total[n][0], round(share, 4)
        print(f"{n}-gram: matched at {share:.1%} of positions; conditional rates by position "
              f"{rates(total, n)} (tries {total[n][0]})")
    for kind, s in sorted(by_kind.items()):
        out["by_kind"][kind] = {n: rates(s, n) for n in range(NMAX, NMIN - 1, -1)}
        print(f"  {kind:10s} " + "  ".join(f"{n}: {rates(s, n)[:4]}" for n in range(NMAX, NMIN - 1, -1)))
    if args.out:
        write_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
