"""Held-out acceptance of saved P-EAGLE drafts, side by side on the same answers.

Teacher-forced on the target's greedy answers to tools/data/heldout_prompts.jsonl
(128 new tokens, the answers train_peagle caches), exactly as train_peagle's receipt
measures it (acc_k = P(draft depths 1..k all equal the target's greedy tokens); and the
runtime's fixed:k loop replayed on the same table, ``evaluate``'s ``loop``), for
each draft folder given, optionally on a subset of the held-out prompts: ``--subset
FILE:KEY`` reads a JSON object and keeps the prompt indices listed under KEY (used to
leave out held-out prompts whose topics a draft's data contained).

    python tools/eval_draft.py fixtures/peagle-smollm2 out/other-draft [--subset split.json:clean]

``--costs ENGINES`` adds, per draft and fixed depth k the engines built, the decode speed-up
that loop tau and those engines' cost table predict (``predicted_speedups``: a round accepts
loop tau tokens on average and costs the draft's depth-k pass and verify.k, against one
decode step a token without speculation; prefill apart, at the table's reference past).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_peagle as tp  # noqa: E402
from smollm2 import default_cache  # noqa: E402


def read_costs(engines: Path) -> dict:
    """The cost table of a build (ENGINES/engines.json's ``costs``), checked for what
    ``predicted_speedups`` reads."""
    path = engines / "engines.json"
    if not path.is_file():
        raise SystemExit(f"--costs {engines}: {path.name} missing (expected a folder `specrt build` wrote)")
    try:
        costs = json.loads(path.read_text()).get("costs")
    except (json.JSONDecodeError, AttributeError) as e:
        raise SystemExit(f"--costs {engines}: {path} is not a JSON object ({e})")
    if not isinstance(costs, dict) or not isinstance(costs.get("verify"), dict) or not costs.get("decode"):
        raise SystemExit(f"--costs {engines}: {path} has no cost table (costs.verify, costs.decode); "
                         "`specrt build` profiles one")
    by_depth = costs.get("draft_by_depth") or {}
    if not isinstance(by_depth, dict):
        raise SystemExit(f"--costs {engines}: {path} costs.draft_by_depth is {by_depth!r}, expected "
                         "{depth: seconds}")
    for name, value in [("decode", costs["decode"]), *((f"verify.{k}", v) for k, v in costs["verify"].items()),
                        *([("draft", costs["draft"])] if "draft" in costs else []),
                        *((f"draft_by_depth.{k}", v) for k, v in by_depth.items())]:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise SystemExit(f"--costs {engines}: {path} costs.{name} is {value!r}, expected seconds > 0")
    return costs


def predicted_speedups(loop: dict, costs: dict) -> dict:
    """{k: loop tau at fixed:k x decode / (draft pass at depth k + verify.k)} for each k of
    ``loop`` (evaluate's) that the table has a verify cost for; the draft pass is the table's
    ``draft_by_depth`` entry where it has one, else its ``draft``."""
    out = {}
    for k, r in loop.items():
        verify = costs["verify"].get(str(k))
        if verify is None:
            continue
        draft = (costs.get("draft_by_depth") or {}).get(str(k), costs.get("draft", 0.0))
        out[str(k)] = round(r["tau"] * costs["decode"] / (draft + verify), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drafts", nargs="+", type=Path)
    ap.add_argument("--subset", default=None, metavar="FILE:KEY")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None, help="write the table as JSON here")
    ap.add_argument("--costs", type=Path, default=None, metavar="ENGINES",
                    help="a build's folder: predict each fixed depth's decode speed-up from its cost table")
    args = ap.parse_args(argv)
    costs = read_costs(args.costs) if args.costs else None
    torch.set_num_threads(args.threads)
    cache = default_cache()
    _, source, tok, target = tp.smollm2_target(cache)
    held = tp.heldout_answers(target, tok, cache, None, args.max_new, source["sha256"])
    keep = list(range(len(held)))
    if args.subset:
        path, key = args.subset.rsplit(":", 1)
        keep = json.loads(Path(path).read_text())[key]
    held = [held[i] for i in keep]
    table = {"prompts": len(held), "subset": args.subset, "drafts": {},
             **({"costs": {"engines": str(args.costs), **costs}} if costs else {})}
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
        if costs:
            r["predicted_speedup"] = predicted_speedups(r["loop"], costs)
            print(f"  predicted decode speed-up on {args.costs}'s costs: "
                  + ", ".join(f"fixed:{k} {v:.3f}x" for k, v in r["predicted_speedup"].items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
