"""How often is the target's token the draft's 2nd, 3rd, ... choice? What a token tree would add.

    .venv/bin/python tools/exp_first_position_topk.py ENGINES [--prompts tools/data/heldout_prompts.jsonl]
        [--n 20] [--max-new-tokens 128] [--no-chat]

Greedy ``fixed:1`` decoding of the first N prompts on ENGINES (one draft per round, so
every round tests the draft's first position): for each round, the rank of the target's
greedy token among the draft's first-position logits (mapped to target ids). A tree
that verifies the draft's top w candidates beside each other at that position (one
extra verify row each: ``--governor fixed:K:tree=W``) gains P(rank 2) + ... + P(rank W)
tokens a round: the candidate the target chose is accepted and the target's row for it
gives one more token.

Measured 2026-12-01 (out/bench-v10 engines, stage-6 draft, 20 held-out chat prompts,
1445 rounds): ranks 1 / 2 / 3 0.509 / 0.128 / 0.064, so a width-2 tree adds ~0.13
tokens a round and width 3 ~0.19 (loop tau 1.5-1.6 with chains).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--prompts", type=Path, default=Path("tools/data/heldout_prompts.jsonl"))
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--no-chat", action="store_true")
    a = ap.parse_args(argv)

    from specrt.runtime import generate as G
    from specrt.runtime.session import Session

    top: dict[str, np.ndarray] = {}
    ranks = np.zeros(a.ranks + 1, np.int64)  # ranks[k-1]: rank k; ranks[-1]: beyond
    draft_tokens, verify_greedy = G.Generator._draft_tokens, G.verify_greedy

    def record_draft(self, logits, ids, rng):
        order = np.argsort(-logits[0])[: a.ranks]
        top["ids"] = order + (self.d2t[order] if self.d2t is not None else 0)
        return draft_tokens(self, logits, ids, rng)

    def record_verify(logits, draft):
        t = int(np.argmax(logits[0]))
        hit = np.flatnonzero(top["ids"] == t)
        ranks[int(hit[0]) if hit.size else -1] += 1
        return verify_greedy(logits, draft)

    G.Generator._draft_tokens, G.verify_greedy = record_draft, record_verify
    try:
        prompts = [json.loads(line)["prompt"] for line in a.prompts.read_text().splitlines() if line.strip()][: a.n]
        with Session(a.engines, governor="fixed:1") as s:
            for p in prompts:
                for _ in s.stream(p, chat=not a.no_chat, max_new_tokens=a.max_new_tokens):
                    pass
    finally:
        G.Generator._draft_tokens, G.verify_greedy = draft_tokens, verify_greedy
    n = int(ranks.sum())
    share = ranks / max(n, 1)
    print(f"{a.engines}: {len(prompts)} prompts, {n} rounds at fixed:1")
    print("  the target's token is the draft's first-position choice of rank "
          + ", ".join(f"{k + 1}: {share[k]:.3f}" for k in range(a.ranks)) + f", lower: {share[-1]:.3f}")
    for w in range(2, a.ranks + 1):
        print(f"  a tree of width {w} at the first position adds {share[1:w].sum():.3f} tokens a round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
