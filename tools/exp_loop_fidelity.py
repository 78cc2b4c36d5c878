"""Does the runtime's loop accept what the draft, teacher-forced, would? Draft quality apart from the runtime.

    .venv/bin/specrt run ENGINES --prompts P.jsonl --chat --quiet --governor fixed:K --stats S.json
    .venv/bin/python tools/exp_loop_fidelity.py S.json [--draft fixtures/peagle-smollm2] [-o OUT.json]

The held-out acceptance train_peagle reports (tools/eval_draft.py) is teacher-forced over
*every* position of the target's answers; the runtime's rounds start only where the last
round ended, which is more often just after the draft failed. This takes the greedy
sequences a fixed:K run produced (--stats keeps each prompt's prompt_ids and
output_token_ids; greedy outputs are the target's own), scores the PyTorch draft
teacher-forced at every anchor of them (the table eval_draft builds), and replays the
runtime's loop on that table: round one at the last prompt position, each round accepting
the drafts up to the first miss (at most K, and no more than the token budget leaves),
the next starting one past the last accepted token. Per position:

- ``all anchors``: teacher-forced over every position (what eval_draft reports);
- ``replayed loop``: the same table, only at the anchors the loop reaches;
- ``runtime``: what the engines accepted in the run (its stats).

``replayed loop`` ~ ``runtime`` says the engines and the scheduler draft what the PyTorch
draft drafts at those positions (the gap to ``all anchors`` is where rounds start, a
property of the draft); a ``runtime`` below ``replayed loop`` is accuracy the toolchain
loses (inputs, draft KV, numerics). The replayed rounds are also split by whether the
round before them missed (or was the prefill) or accepted all it drafted. Greedy chains only (no token tree, lookup or DSpark block: run fixed:K).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_peagle as tp  # noqa: E402
from smollm2 import default_cache, ensure_smollm2  # noqa: E402
from train_peagle import run_of  # noqa: E402  (shared with train_peagle.evaluate)


def anchor_table(model, seqs, feats, K: int) -> list[dict]:
    """Per sequence {(anchor t, depth d): draft == target's greedy token at t + d}."""
    tables = []
    for j in range(len(seqs)):
        b = tp.build_batch([j], seqs, feats, K, [1.0] * K, np.random.default_rng(0))
        with torch.no_grad():
            ok = (tp.draft_outputs(model, b)[1] == tp.greedy_targets(b, feats)).cpu()
        off = int(feats.offsets[j])
        tables.append({(int(a), int(d)): bool(o) for a, d, o in zip(b.anchor_row - off, b.loss_depth, ok)})
    return tables


def replay(table: dict, prompt_len: int, n_out: int, K: int, max_new: int):
    """The loop's rounds on this sequence: [(anchor, depth, accepted, the round before missed)]."""
    rounds, t, emitted, missed = [], prompt_len - 1, 1, True  # the first round follows the prefill
    while emitted < min(max_new, n_out):
        d = min(K, max_new - emitted - 1)
        a = run_of(table, t, d) if d > 0 else 0
        rounds.append((t, d, a, missed))
        missed = a < d
        t += a + 1
        emitted += a + 1
    return rounds


def counts(runs, K: int) -> np.ndarray:
    """[3, K] accepted / offered / reached at positions 1..K from (depth, accepted) pairs."""
    c = np.zeros((3, K))
    for d, a in runs:
        for i in range(d):
            c[0, i] += i < a
            c[1, i] += 1
            c[2, i] += i <= a
    return c


def summary(c: np.ndarray) -> dict:
    acc, off, reach = c
    return {"rounds": int(off[0]), "unconditional": [round(float(x), 4) for x in acc / np.maximum(off, 1)],
            "conditional": [round(float(x), 4) for x in acc / np.maximum(reach, 1)],
            "tau": round(1 + float(acc.sum() / max(off[0], 1)), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stats", type=Path, help="specrt run --stats JSON of a fixed:K greedy run")
    ap.add_argument("--draft", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures" / "peagle-smollm2")
    ap.add_argument("--max-new", type=int, default=128, help="the run's --max-new-tokens")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)
    st = json.loads(args.stats.read_text())
    gov = st.get("governor", "")
    if not gov.startswith("fixed:") or any(x in gov for x in ("tree", "ngram", "corpus", "grow")):
        raise SystemExit(f"{args.stats}: governor {gov!r}; expected a plain fixed:K run")
    K = int(gov.split(":")[1])
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    hf_dir = ensure_smollm2(default_cache())
    target = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    prompts = st["prompts"]
    seqs = [tp.Seq(list(p["prompt_ids"]) + list(p["output_token_ids"]), len(p["prompt_ids"]), "heldout")
            for p in prompts]
    cfg = json.loads((args.draft / "config.json").read_text())
    Kd = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    if K > Kd:
        raise SystemExit(f"fixed:{K} exceeds the draft's {Kd} positions")
    feats = tp.build_features(target, seqs, list(cfg["eagle_aux_hidden_state_layer_ids"]), None)
    model = tp.load_draft(args.draft, target.model.embed_tokens.weight.detach().clone())
    tables = anchor_table(model, seqs, feats, Kd)
    every, loop, total_rounds = np.zeros((3, K)), np.zeros((3, K)), 0
    split = {True: np.zeros((3, K)), False: np.zeros((3, K))}  # by whether the round before missed
    for s, table in zip(seqs, tables):
        n_out = len(s.ids) - s.prompt_len
        anchors = range(s.prompt_len - 1, len(s.ids) - 1 - K)  # every depth has a target token
        every += counts([(K, run_of(table, t, K)) for t in anchors], K)
        rounds = replay(table, s.prompt_len, n_out, K, args.max_new)
        loop += counts([(d, a) for _, d, a, _ in rounds if d > 0], K)
        for m in (True, False):
            split[m] += counts([(d, a) for _, d, a, mm in rounds if d > 0 and mm == m], K)
        total_rounds += len(rounds)
    rt = st["counts"]
    runtime = np.array([rt["accepted_at"][:K], rt["offered_at"][:K], rt["reached_at"][:K]], float)
    report = {"stats": str(args.stats), "governor": gov, "prompts": len(seqs), "draft": str(args.draft),
              "all_anchors": summary(every), "replayed_loop": {**summary(loop), "rounds_all": total_rounds},
              "replayed_after_a_miss": summary(split[True]), "replayed_after_a_full_round": summary(split[False]),
              "runtime": {**summary(runtime), "rounds_all": st["rounds"]}}
    for name in ("all_anchors", "replayed_loop", "runtime", "replayed_after_a_miss", "replayed_after_a_full_round"):
        r = report[name]
        print(f"{name:>27}: rounds {r.get('rounds_all', r['rounds']):5d}  unconditional {r['unconditional']}  "
              f"conditional {r['conditional']}  tau {r['tau']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
