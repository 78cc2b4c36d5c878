"""Held-out acceptance of saved P-EAGLE drafts, side by side on the same answers.

Teacher-forced on the target's greedy answers to tools/data/heldout_prompts.jsonl
(128 new tokens, the answers train_peagle caches), exactly as train_peagle's receipt
measures it (acc_k = P(draft depths 1..k all equal the target's greedy tokens); and the
runtime's fixed:k loop replayed on the same table, ``evaluate``'s ``loop``), for
each draft folder given, optionally on a subset of the held-out prompts: ``--subset
FILE:KEY`` reads a JSON object and keeps the prompt indices listed under KEY (used to
leave out held-out prompts whose topics a draft's data contained).

    python tools/eval_draft.py fixtures/peagle-smollm2 out/other-draft [--subset split.json:clean]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_peagle as tp  # noqa: E402
from smollm2 import default_cache  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", type=Path)
    ap.add_argument("--subset", default=None, metavar="FILE:KEY")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None, help="write the table as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cache = default_cache()
    _, source, tok, target = tp.smollm2_target(cache)
    held = tp.heldout_answers(target, tok, cache, None, args.max_new, source["sha256"])
    keep = list(range(len(held)))
    if args.subset:
        path, key = args.subset.rsplit(":", 1)
        keep = json.loads(Path(path).read_text())[key]
    held = [held[i] for i in keep]
    table = {"prompts": len(held), "subset": args.subset, "drafts": {}}
    embed = target.model.embed_tokens.weight.detach().clone()
    feats = {}
    for folder in args.drafts:
        cfg = json.loads((folder / "config.json").read_text())
        aux = tuple(cfg["eagle_aux_hidden_state_layer_ids"])
        if aux not in feats:
            feats[aux] = tp.build_features(target, held, list(aux), None)
        K = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        r = tp.evaluate(tp.load_draft(folder, embed), held, feats[aux], K)
        table["drafts"][str(folder)] = r
        loop = ", ".join(f"fixed:{k} {v['tau']}" for k, v in r["loop"].items())
        print(f"{folder}: acceptance by position {r['acceptance_at_pos']}, tau {r['tau']} "
              f"({r['anchors']} anchors, {len(held)} prompts); the loop replayed: tau {loop}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
