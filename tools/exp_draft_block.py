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
* "running-rates": the block whose running rate is best, EWMAs of the tokens and seconds
  each block K would have got on recent rounds' calibrated confidences
  (``running_rates_class``), instead of the ceilings' optimistic pick;
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

Running rates (2026-12-01 evening, same rows): EWMA weight 0.05 / 0.1 / 0.2 gave 1.0076 /
1.0084 / 1.0103x the old pair mixed on the calibration prompts (defaults 1.0067x) and
1.0049 / 1.0080 / 1.0113x on the held-out ones (defaults 1.0119x), per kind 0.995-1.018x
against the defaults' 1.007-1.016x: no better than the ceilings, not adopted. The
averaged rates cannot tell this round's drafts from the last ones'; what peek has and
no rule gets is the round's own confidences.
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
RUNNING_RATES = (0.05, 0.1, 0.2)  # EWMA weights of the running-rates block rule
KINDS: list[str] = []  # main(): the prompts' kinds, in file order


def running_rates_class():
    """DSparkGovernor whose pre-draft block is the K with the best running rate: after
    each drafted round, for every built K, the tokens and seconds its post-draft rule
    would have got with a block of K on that round's calibrated confidences (positions
    past the drafted block at the ceilings u_k) update EWMAs (weight ``rr_alpha``); the
    next block is the K whose EWMA tokens / EWMA seconds is highest. The ceiling rule
    until the first drafted round. A replay variant only (row "running-rates ...")."""
    from specrt.runtime.governor import DSparkGovernor

    class RunningRates(DSparkGovernor):
        rr_alpha = 0.1

        def choose(self, state):
            d = DSparkGovernor.choose(self, state)
            if state.confidences is None:
                return d
            sibs = self._sibs
            c = self.calibration(np.asarray(state.confidences[: self.depths[-1]], float).tolist())
            cap = self.calibration.upper
            up = [min(u, cap[k] if k < len(cap) else cap[-1]) for k, u in enumerate(self.ceiling)]
            full = c + up[len(c):]
            rates = self._win_rates() if self.tree_width > 1 else None
            stats = self.__dict__.setdefault("_rr", {})
            for blk in self.depths:
                t_draft, e, s = self.draft_cost(blk), 1.0, 1.0
                best = (1.0, t_draft + self.t_decode) if self.t_decode is not None else (0.0, 1.0)
                for k in range(1, blk + 1):
                    s *= full[k - 1]
                    e += s
                    if k in self.t_verify:
                        rate, n = self._best_tree(e, full[0], t_draft, k, rates) if rates \
                            else (e / (t_draft + self.t_verify[k]), 0)
                        if rate > best[0] / best[1]:
                            t = t_draft + self.verify_cost(k + n)  # past the deepest depth: the chains
                            best = (rate * t, t)
                tok, sec = stats.get(blk, best)
                stats[blk] = (tok + self.rr_alpha * (best[0] - tok), sec + self.rr_alpha * (best[1] - sec))
            self._sibs = sibs
            return d

        def draft_depth(self, limit=None):
            stats = self.__dict__.get("_rr")
            if not stats:
                return DSparkGovernor.draft_depth(self, limit)
            top = self.depths[-1] if limit is None else min(self.depths[-1], limit)
            ok = [k for k in self.depths if k <= top]
            return max(ok, key=lambda k: (stats[k][0] / stats[k][1], -k)) if ok else 0

    return RunningRates


def _governor(costs, depths, rounds_conf=None, running_rates=None, **options):
    """DSpark as the runtime builds it; with ``rounds_conf`` (the coming rounds' confidences,
    in order) its pre-draft block is what its post-draft rule picks on the round's own
    confidences, decided on a scratch copy (the "peek" bound)."""
    from specrt.runtime.governor import DSparkGovernor, GovernorState

    g = dspark_from_table(costs, depths, CALIBRATION.get("calibration"), **options)
    g.tree_width = WIDTH
    if running_rates is not None:
        g.__class__ = running_rates_class()
        g.rr_alpha = running_rates
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
    for alpha in RUNNING_RATES:
        variants[f"running-rates alpha={alpha}"] = {"running_rates": alpha}
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
