"""Session 50: what the committed draft's vocabulary costs its loop tau, at most.

On the held-out table (tools/train_peagle.py's ``anchor_hits``: per anchor and depth, whether
the committed draft's output equals the target's greedy token; 80 prompts x 128 tokens), the
positions whose target token lies outside the draft vocabulary are misses by construction.
The runtime's fixed:k loop is replayed (``loop_rounds``) on that table as it is, and again
with those positions counted as hits for a larger vocabulary (the top-N answer tokens of
the training answers, the committed 8192 kept: what ``--grow-vocab N`` drafts from):
  * "ceiling": every such position a hit (a draft that never misses a token it lacked);
  * "as the rest": each a hit with the probability the draft hits in-vocabulary targets at
    that depth (mean of 20 draws) -- new tokens as predictable as the kept ones.
Both are bounds from above on what growing the vocabulary can buy (the new tokens are the
rarer ones; the bigger head also costs draft time).

    .venv/bin/python results/draft_vocab/ceiling.py > results/draft_vocab/ceiling.txt
"""
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import train_peagle as tp  # noqa: E402
from smollm2 import default_cache  # noqa: E402

K = 4
torch.set_num_threads(2)
cache = default_cache()
_, source, tok, target = tp.smollm2_target(cache)
held = tp.heldout_answers(target, tok, cache, None, 128, source["sha256"])
feats = tp.build_features(target, held, [2, 15, 27], None)
model = tp.load_draft(ROOT / "fixtures" / "peagle-smollm2", target.model.embed_tokens.weight.detach().clone())
hits = tp.anchor_hits(model, held, feats, K, slots=1)
V = len(model.t2d)
vocab = (model.d2t + torch.arange(len(model.d2t))).numpy()
counts = np.zeros(V, np.int64)
for f in sorted((ROOT / "fixtures" / "peagle-data").glob("chat*.jsonl.gz")):
    with gzip.open(f, "rt") as fh:
        for line in fh:
            np.add.at(counts, np.asarray(json.loads(line)["answer_ids"]), 1)
counts[vocab] += 1 << 41
order = np.lexsort((np.arange(V), -counts))
# the target token of (anchor row, depth d): position t + d of its sequence
tokens = np.zeros_like(hits, dtype=np.int64)
for j, s in enumerate(held):
    off, n = int(feats.offsets[j]), int(feats.offsets[j + 1] - feats.offsets[j])
    ids = np.asarray(s.ids + [0] * (K + 1))
    for d in range(1, K + 1):
        tokens[off:off + n, d - 1] = ids[np.arange(n) + d]
inside = np.zeros(V, bool)
inside[vocab] = True


def loop_tau(table: np.ndarray) -> list[float]:
    out = []
    for k in range(1, K + 1):
        rounds = accepted = 0
        for j, s in enumerate(held):
            runs = tp.run_lengths(table[int(feats.offsets[j]):int(feats.offsets[j + 1])], K)
            first, last = max(s.prompt_len - 1, 0), len(s.ids) - 2 - K
            for _, a in tp.loop_rounds(lambda t: min(int(runs[t]), k), first, last):
                rounds += 1
                accepted += a
        out.append(round(1 + accepted / rounds, 4))
    return out


valid = np.zeros(len(hits), bool)
for j, s in enumerate(held):
    off = int(feats.offsets[j])
    valid[off + max(s.prompt_len - 1, 0):off + len(s.ids) - 1 - K] = True
ins = inside[tokens]
rate = [hits[valid & ins[:, d], d].mean() for d in range(K)]
print(f"committed draft, held out: depth hit rates where the target token is in its vocabulary "
      f"{[round(float(r), 4) for r in rate]}; outside it: {round(float(1 - ins[valid].mean()), 4)} of (anchor, depth)")
print(f"{'vocabulary':>12}  loop tau at fixed:1-4")
print(f"{'8192':>12}  {loop_tau(hits)}  (as it is)")
rng = np.random.default_rng(0)
for size in (12288, 16384, 24576, 32768, V):
    now = np.zeros(V, bool)
    now[order[:size]] = True
    new = now[tokens] & ~ins
    print(f"{size:>12}  {loop_tau(hits | new)}  ceiling")
    draws = [loop_tau(hits | (new & (rng.random(hits.shape) < np.asarray(rate)))) for _ in range(20)]
    print(f"{'':>12}  {[round(float(x), 4) for x in np.mean(draws, 0)]}  as the rest")
