"""Experiment: a corpus of the target's own answers as a proposal source (runtime/corpus.py, REST-style).

    python tools/exp_corpus.py --heldout STATS.json [--nmin 3 --nmax 8] [-o OUT.json]

The draft's later positions are weak (teacher-forced conditional acceptance ~0.39 / 0.41 at
positions 2 / 3), and prompt lookup (runtime/ngram.py) only sees the running context. This
measures, before any runtime change, what the target's greedy answers to the draft's TRAIN
prompts (fixtures/peagle-data, the draft's own training data) would propose on the held-out
prompts: an n-gram table (n = nmin..nmax, the context's last n tokens -> the most frequent
next token, its count and share), chained greedily from the longest match.

Held-out answers come from ``specrt run --governor off --stats`` (per prompt
``output_token_ids``; prompt ids re-made with the engines' chat template). For each
position i of each answer (its first 128 tokens) it proposes a chain and counts, per chain
position k and per confidence bin (share of the top next token, count), tries and wins
(greedy acceptance given positions 1..k-1 were right), as tools/lookup_priors.py does.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "fixtures" / "peagle-data"
FILES = ("chat.jsonl.gz", "chat-more.jsonl.gz", "chat-extra.jsonl.gz", "chat-rest.jsonl.gz")


def read_train():
    for f in FILES:
        with gzip.open(DATA / f, "rt") as fh:
            for line in fh:
                r = json.loads(line)
                yield r["prompt_ids"], r["answer_ids"]


def add_heldout_args(ap: argparse.ArgumentParser, heldout_default: Path | None = None) -> None:
    """The held-out answers' options (``--heldout`` required without a default) and the
    measurement's (--positions, --max-new), as this tool and tools/exp_grow.py take them."""
    ap.add_argument("--heldout", type=Path, default=heldout_default, required=heldout_default is None,
                    help="specrt run --stats JSON (greedy, off)")
    ap.add_argument("--engines", type=Path, default=ROOT / "out" / "ng" / "engines")
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "data" / "heldout_prompts.jsonl")
    ap.add_argument("--positions", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=128)


def heldout_pairs(engines: Path, heldout: Path, prompts: Path) -> list[tuple[list[int], list[int]]]:
    """(chat prompt ids, greedy answer ids) of the held-out prompts, from ``specrt run --stats``."""
    from runtime.text import Text  # noqa: E402

    export_dir = engines / json.loads((engines / "engines.json").read_text())["export"]["folder"]
    text = Text(export_dir)
    stats = json.loads(heldout.read_text())
    items = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    return [(text.encode(pr["prompt"], chat=True), rec["output_token_ids"]) for rec, pr in zip(stats["prompts"], items)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_heldout_args(ap)
    ap.add_argument("--nmin", type=int, default=3)
    ap.add_argument("--nmax", type=int, default=8)
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from runtime.corpus import BINS, Corpus  # noqa: E402
    from specrt.paths import write_atomic  # noqa: E402

    seqs = [p + a for p, a in read_train()]
    corpus = Corpus.build(seqs, args.nmin, args.nmax, binning="share")  # the four bins it reports (BINS)
    print(f"corpus: {len(seqs)} sequences, {sum(map(len, seqs))} tokens, {len(corpus)} n-grams (n = "
          f"{args.nmin}..{args.nmax})")
    pairs = heldout_pairs(args.engines, args.heldout, args.prompts)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    positions = sum(min(len(a), args.max_new) for _, a in pairs)
    tw = Corpus.measure(corpus, pairs, args.positions, args.max_new)
    tw = {name: tw[key] for name, key in BINS.items() if key in tw}
    tw["all"] = tuple([sum(v[j][k] for v in tw.values()) for k in range(args.positions)] for j in (0, 1))
    per_kind = {}
    for kind in sorted({pr.get("kind", "?") for pr in prompts}):
        got = Corpus.measure(corpus, [p for p, pr in zip(pairs, prompts) if pr.get("kind", "?") == kind],
                             args.positions, args.max_new)
        per_kind[kind] = tuple([sum(v[j][k] for v in got.values()) for k in range(args.positions)] for j in (0, 1))

    def rates(t):
        return [round(w / n, 3) if n else None for n, w in zip(*t)]

    out = {"positions": positions, "matched_share": round(tw["all"][0][0] / positions, 4),
           "rates": {k: rates(v) for k, v in tw.items()}, "tries": {k: v[0] for k, v in tw.items()},
           "per_kind": {k: rates(v) for k, v in per_kind.items()}}
    print(f"{positions} held-out positions; a proposal at {out['matched_share']:.1%}")
    for k, v in tw.items():
        print(f"  first step {k:15s} tries {v[0][0]:6d}  conditional rates {rates(v)}")
    for k, v in per_kind.items():
        print(f"  {k:10s} {rates(v)}")
    if args.out:
        write_atomic(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
