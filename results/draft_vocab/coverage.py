"""Session 50: how many of the target's greedy answer tokens a draft vocabulary of each size can draft.

The draft vocabulary is the most frequent answer tokens of the training answers
(fixtures/peagle-data/chat*.jsonl.gz, all 32,965); the committed draft's 8192 were chosen on
its first stage's answers and kept since (``--init`` keeps them). A token outside it is never
drafted, so every round that reaches one ends there. Held out: the target's greedy answers
(128 new tokens) to the 80 held-out prompts, as train_peagle caches them.

    .venv/bin/python results/draft_vocab/coverage.py > results/draft_vocab/coverage.txt
"""
import collections
import gzip
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
from smollm2 import default_cache  # noqa: E402

V = 49152
counts = np.zeros(V, np.int64)
n = 0
for f in sorted((ROOT / "fixtures" / "peagle-data").glob("chat*.jsonl.gz")):
    with gzip.open(f, "rt") as fh:
        for line in fh:
            np.add.at(counts, np.asarray(json.loads(line)["answer_ids"]), 1)
            n += 1
held = sorted((default_cache() / "peagle-data").glob("heldout-*-128.jsonl"))
if not held:
    sys.exit("no held-out answers in the cache: run tools/eval_draft.py once (it makes them)")
by_kind = collections.defaultdict(list)
for line in held[0].read_text().splitlines():
    r = json.loads(line)
    by_kind[r["kind"]] += r["answer_ids"]
all_held = np.concatenate([np.asarray(v) for v in by_kind.values()])
w = load_file(ROOT / "fixtures" / "peagle-smollm2" / "model.safetensors")
committed = np.zeros(V, bool)
committed[np.arange(len(w["d2t"])) + w["d2t"]] = True
order = np.lexsort((np.arange(V), -counts))
print(f"training answers: {n}, {counts.sum()} tokens, {(counts > 0).sum()} distinct; held out: {len(all_held)} tokens")
print("share of answer tokens OUTSIDE the draft vocabulary (never draftable)")
sets = {"committed 8192": committed}
for size in (8192, 12288, 16384, 24576, 32768):
    s = np.zeros(V, bool)
    s[order[:size]] = True
    sets[f"top {size}"] = s
print(f"{'vocabulary':>16} {'train':>7} {'held':>7} " + " ".join(f"{k:>10}" for k in by_kind))
for name, s in sets.items():
    print(f"{name:>16} {1 - counts[s].sum() / counts.sum():7.4f} {1 - s[all_held].mean():7.4f} "
          + " ".join(f"{1 - s[np.asarray(v)].mean():10.4f}" for v in by_kind.values()))
# the held-out tokens the committed vocabulary lacks: already earlier in their sequence (where
# prompt lookup, `--governor ...:ngram`, can draft them)?
lacked = in_prompt = earlier = 0
for line in held[0].read_text().splitlines():
    r = json.loads(line)
    p, a = set(r["prompt_ids"]), r["answer_ids"]
    for i, t in enumerate(a):
        if not committed[t]:
            lacked += 1
            in_prompt += t in p
            earlier += t in p or t in a[:i]
print(f"held-out tokens outside the committed vocabulary: {lacked}; already in the prompt: {in_prompt / lacked:.3f}, "
      f"in the prompt or earlier in the answer: {earlier / lacked:.3f}")
