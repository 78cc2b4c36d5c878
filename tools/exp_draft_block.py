"""Experiment: how should DSpark size the draft block it commits to before drafting?

    .venv/bin/python tools/exp_draft_block.py ENGINES --prompts FILE [--chat]
        [--max-new-tokens 128] [--limit N] [--rows ROWS.npz] [-o OUT.json]

A P-EAGLE pass drafting K positions costs more with K (SmolLM2's draft: 2.0 ms for one,
+0.65 ms a position), and DSpark picks K before it sees any confidence: the depth its rule
would verify under optimistic conditional acceptances u_k (a maximum of recent calibrated
c_k decaying by ``ceiling_decay`` a round), with the full block every ``full_every``-th
round so that every position's u_k stays measured. Positions drafted and not verified are
paid for nothing. On the rounds tools/exp_tree_width.py records (same ``--rows`` files:
every round drafted and verified at full depth, with the rank of the target's first token
among the draft's first-position choices), this drives the runtime's DSparkGovernor with
``:tree=3`` as the generator drives it (tools/governor_replay.py ``simulate``: stored
calibration, learning online on its own copy, priced at the build's cost table) with

* a grid of ``ceiling_decay`` x ``full_every``, and the governor's defaults;
* a fixed block (``dspark:block=K``);
* "peek": the block set to what its post-draft rule then picks on the round's own
  confidences (not a governor: it knows the confidences before drafting) -- how much a
  perfect block choice would gain;

each on all prompts in file order ("mixed": the kinds follow one another, as a server's
requests might) and on each prompt kind alone (the prompts file's "kind" field), as
tokens per second relative to the pair the runtime used until 2026-12-01 (ceiling_decay
0.02, full_every 16).

Measured 2026-12-01 on out/ng/engines (stage-6 draft, int8, depths 1-4, 6, 8; greedy,
chat, 128 new tokens; results/draft_block). Chosen on the 60 calibration prompts (3561
rounds): ceiling_decay 0.05 with full_every 64 1.0067x mixed, 1.0066-1.0110x on every
kind (0.08 / 64: 1.0071x, arithmetic 1.0019x; fixed blocks 0.968-1.007x); peek 1.029x.
Checked on the 80 held-out prompts (4960 rounds): 1.0119x mixed, 1.0082-1.0159x per
kind; peek 1.028x. The runtime's defaults are now 0.05 / 64 (probe_every, the cadence of
drafting after plain steps, stays 16). Live (tools/exp_dspark_ab.py out/ng/engines
--options ceiling_decay=0.02,full_every=16 [--ngram], 20 held-out prompts x 2,
interleaved; results/draft_block/ab_tree.log, ab_ngram.log): the new pair 1.012x the old
one with :tree=3 (per kind 0.983-1.026x), 1.001x with :tree=3:ngram (0.996-1.016x).
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_governors import dspark_from_table  # noqa: E402
from exp_tree_width import CALIBRATION, load_stored_calibration, record  # noqa: E402
from governor_replay import recorded_experiment, simulate  # noqa: E402

WIDTH = 3
GRID = {"ceiling_decay": (0.02, 0.03, 0.05, 0.08), "full_every": (16, 32, 64, 128)}
BLOCKS = (1, 2, 3, 4)
KINDS: list[str] = []  # main(): the prompts' kinds, in file order


def _governor(costs, depths, rounds_conf=None, **options):
    """DSpark as the runtime builds it; with ``rounds_conf`` (the coming rounds' confidences,
    in order) its pre-draft block is what its post-draft rule picks on the round's own
    confidences, decided on a scratch copy (the "peek" bound)."""
    from specrt.runtime.governor import DSparkGovernor, GovernorState

    g = dspark_from_table(costs, depths, CALIBRATION.get("calibration"), **options)
    g.tree_width = WIDTH
    if rounds_conf is not None:
        coming = iter(rounds_conf)

        def choose(state):
            if state.confidences is None:
                probe = copy.deepcopy(g)
                del probe.choose  # the class's rule on the scratch copy
                d = DSparkGovernor.choose(probe, GovernorState(confidences=np.asarray(next(coming))))
                g.block = max(d, 1)  # what _draft_or_not then drafts (or 0: its no-draft rule)
            return DSparkGovernor.choose(g, state)

        g.choose = choose
    return g


def analyse(conf, accepted, rank, prompt, costs, depths) -> dict:
    conf, accepted, rank, prompt = map(np.asarray, (conf, accepted, rank, prompt))
    kinds = np.array([KINDS[p] if p < len(KINDS) else "?" for p in prompt])
    groups = {"mixed": np.ones(len(accepted), bool), **{k: kinds == k for k in dict.fromkeys(kinds.tolist())}}
    variants: dict[str, dict] = {"defaults": {}}
    for dcy in GRID["ceiling_decay"]:
        for fe in GRID["full_every"]:
            variants.setdefault(f"ceiling_decay={dcy} full_every={fe}", {"ceiling_decay": dcy, "full_every": fe})
    for k in BLOCKS:
        if k in depths:
            variants[f"block={k}"] = {"block": k}
    variants["peek"] = {"peek": True}

    def rate(opts: dict, mask) -> tuple[float, dict]:
        opts = dict(opts)
        peek = opts.pop("peek", False)
        g = _governor(costs, depths, conf[mask] if peek else None, **opts)
        return simulate(g, list(zip(conf[mask], accepted[mask])), costs, depths, ranks=rank[mask])

    before = {"ceiling_decay": 0.02, "full_every": 16}
    base = {name: rate(before, m) for name, m in groups.items()}
    report = {"rounds": {name: int(m.sum()) for name, m in groups.items()}, "width": WIDTH,
              "calibration": CALIBRATION.get("note"),
              "baseline": before, "baseline_tokens_per_s": {name: r for name, (r, _) in base.items()},
              "baseline_blocks": dict(sorted(base["mixed"][1].items(), key=lambda x: -x[1])[:8]),
              "vs_baseline": {}}
    print(f"{'variant':38s}" + "".join(f"{n:>11s}" for n in groups), file=sys.stderr)
    for name, opts in variants.items():
        row = {g: rate(opts, m)[0] / base[g][0] for g, m in groups.items()}
        report["vs_baseline"][name] = row
        print(f"{name:38s}" + "".join(f"{row[g]:11.4f}" for g in groups), file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    load_stored_calibration(args)
    if "--prompts" in args:
        f = Path(args[args.index("--prompts") + 1])
        if f.is_file():
            KINDS[:] = [json.loads(x).get("kind", "?") for x in f.read_text().splitlines() if x.strip()]
    return recorded_experiment(__doc__, argv, record, analyse, ("conf", "accepted", "rank", "prompt"))


if __name__ == "__main__":
    sys.exit(main())
