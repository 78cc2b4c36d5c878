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


def read_draft_config(folder: Path) -> dict:
    """A draft folder's config.json, checked for what the evaluation reads: before the held-out
    answers, which take minutes to make (a wrong folder failed after them, with a traceback)."""
    path = folder / "config.json"
    try:
        cfg = json.loads(path.read_text())
        _ = cfg["eagle_aux_hidden_state_layer_ids"], cfg["speculators_config"]["proposal_methods"][0][
            "speculative_tokens"]  # (what main reads)
    except OSError as e:
        raise SystemExit(f"{folder}: cannot read {path.name} ({e.strerror}; expected a P-EAGLE draft folder)")
    except (ValueError, LookupError, TypeError) as e:
        raise SystemExit(f"{folder}: {path.name} is not a P-EAGLE draft's config ({type(e).__name__}: {e})")
    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"{folder}: model.safetensors missing (expected a P-EAGLE draft folder)")
    return cfg


def read_subset(spec: str, n: int) -> list[int]:
    """--subset FILE:KEY: the held-out prompt indices (of ``n``) listed under KEY in FILE's JSON object."""
    path, sep, key = spec.rpartition(":")
    if not sep or not path:
        raise SystemExit(f"--subset {spec}: expected FILE:KEY")
    try:
        keep = json.loads(Path(path).read_text())[key]
    except OSError as e:
        raise SystemExit(f"--subset {spec}: cannot read {path} ({e.strerror})")
    except ValueError as e:
        raise SystemExit(f"--subset {spec}: {path} is not JSON ({e})")
    except (LookupError, TypeError):
        raise SystemExit(f"--subset {spec}: {path} has no key {key!r} (expected a JSON object)")
    # (an empty list measured no prompt: tau 1.0 over 0 anchors, as --max-new <= K did)
    if not isinstance(keep, list) or not keep or not all(type(i) is int and 0 <= i < n for i in keep):
        raise SystemExit(f"--subset {spec}: expected a non-empty list of held-out prompt indices 0..{n - 1}, "
                         f"got {keep!r}")
    return keep


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
    configs = {folder: read_draft_config(folder) for folder in args.drafts}
    for folder, cfg in configs.items():  # anchors t <= N - 2 - K (evaluate): none in answers of K tokens or fewer
        K = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        if args.max_new <= K:  # (it printed tau 1.0 over 0 anchors and speed-ups from it)
            raise SystemExit(f"--max-new {args.max_new}: {folder} drafts {K} tokens a round, so answers of "
                             f"{args.max_new} tokens hold no anchor to measure it at: give more than {K}")
    n_held = sum(1 for line in tp.HELDOUT.read_text().splitlines() if line.strip())
    keep = read_subset(args.subset, n_held) if args.subset else list(range(n_held))
    if args.out and not args.out.parent.is_dir():
        raise SystemExit(f"-o {args.out}: {args.out.parent} is not a folder")
    torch.set_num_threads(args.threads)
    cache = default_cache()
    _, source, tok, target = tp.smollm2_target(cache)
    held = tp.heldout_answers(target, tok, cache, None, args.max_new, source["sha256"])
    held = [held[i] for i in keep]
    table = {"prompts": len(held), "subset": args.subset, "drafts": {},
             **({"costs": {"engines": str(args.costs), **costs}} if costs else {})}
    embed = target.model.embed_tokens.weight.detach().clone()
    feats = {}
    for folder in args.drafts:
        cfg = configs[folder]
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
