"""Experiment: would choosing the token tree's width each round beat a fixed width?

    .venv/bin/python tools/exp_tree_width.py ENGINES --prompts FILE [--chat]
        [--max-new-tokens 128] [--limit N] [--rows ROWS.npz] [-o OUT.json]

A tree of width W (``--governor X:tree=W``) verifies the draft's next W - 1 first-position
choices beside the chain: W - 1 more verify rows a round, worth a token when the first
draft is rejected and the target's token is one of them. When the draft is confident the
rows are mostly wasted; when it is not they are worth more than the chain's later
positions. This decodes the prompts with every round verifying the full block (as
``specrt calibrate`` does), keeping per round the draft's top probabilities (its
confidences), the accepted count, the rank of the target's first token among the draft's
first-position choices and the draft's top-4 probabilities there, then prices on those
rounds and the build's cost table (a round of d drafts and W - 1 runners-up costs
draft(d) + verify(d + W - 1): the next built depth at or above, past the deepest the
prefill engine's call from the table's chains, as the runtime runs it (since session 59;
before, the deepest depth's verify); it yields min(a, d) + 1 tokens, or 2 when a = 0 and
the target's token is a runner-up it verified):

* every fixed (d, W) and the post-draft oracle over (d, W);
* DSpark's rule with a fixed width (the runners-up worth (1 - c_1) R_W, R_W the rate at
  which one of W - 1 runners-up wins when the first draft is rejected), as the runtime does;
* the rule choosing (d, W) each round from the same values (width per round);
* the same with R per round from the draft's runner-up probabilities (q_j / (1 - q_1),
  binned and fitted on the other half of the prompts);
* the runtime's DSparkGovernor with ``:tree=W`` (W = 3, 4) driven as the generator drives
  it (pre-draft block, post-draft depth and runners-up, online learning from the engines'
  stored calibration and the rank priors; tools/governor_replay.py ``simulate``).

Measured 2026-12-01 on the 80 held-out prompts (chat, 128 new tokens, stage-6 draft,
out/tree engines; 4965 rounds, the first draft rejected in 48%, then the 2nd / 3rd / 4th
choice wins 0.25 / 0.11 / 0.07): best fixed (d, W) = (3, 2), (2, 3) 0.997x, best chain
0.951x; the rule at W = 3 1.015x, choosing W in 1..4 each round 1.034x (1..3: 1.031x),
with per-round rates from q 1.038x; the runtime's governor simulated 1.027x (W = 3) /
1.029x (W = 4); post-draft oracle 1.147x. results/bench_tree/tree_width_replay80.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_governors import rate_optimal, rows_cost, table_costs  # noqa: E402
from governor_replay import decode_rounds, full_depth_recorder, recorded_experiment, simulate  # noqa: E402

TOP = 8  # ranks recorded (rank TOP: beyond the draft's top TOP)
WIDTHS = (1, 2, 3, 4)


def record(engines: Path, prompts: list[dict], chat: bool, max_new_tokens: int) -> dict:
    from specrt import contracts as C
    from specrt.runtime.session import Session

    rows: dict[str, list] = {"prompt": [], "conf": [], "accepted": [], "rank": [], "q": []}
    with Session(engines, governor="off") as s:
        g, depths = s.generator, s.engines.depths
        if (s.engines.export.get("draft") or {}).get("kind") != "peagle":
            raise SystemExit("error: this experiment reads a P-EAGLE draft's one-pass logits")
        last: dict = {}
        run = g._run

        def keep(runner, feeds, what):
            out, dt = run(runner, feeds, what)
            last[what] = out
            return out, dt

        g._run = keep

        def on_round(i, r):
            row = last["draft"][C.DRAFT_LOGITS][0, -depths[-1]].astype(np.float64)  # first position
            order = np.argsort(-row)[:TOP]
            ids = order + (g.d2t[order] if g.d2t is not None else 0)
            t = int(np.argmax(last["target"][C.LOGITS][0, 0]))
            hit = np.flatnonzero(ids == t)
            p = np.exp(row - row.max())
            p /= p.sum()
            rows["prompt"].append(i)
            rows["conf"].append(np.asarray(r.confidences, np.float32)[: depths[-1]])
            rows["accepted"].append(int(r.accepted))
            rows["rank"].append(int(hit[0]) if hit.size else TOP)
            rows["q"].append(p[order[:4]])

        return decode_rounds(s, prompts, chat, max_new_tokens, full_depth_recorder(depths, on_round), rows)


CALIBRATION: dict = {}  # main(): the engines' stored greedy calibration, for the governor's simulation


def load_stored_calibration(args: list[str]) -> None:
    """CALIBRATION from ENGINES/calibration.json's greedy mode, ENGINES the first argument
    (left empty when there is none: the governor then starts from the identity map)."""
    if args and Path(args[0], "calibration.json").is_file():
        from specrt.runtime.session import read_calibration_file

        digest = __import__("json").loads(Path(args[0], "engines.json").read_text())["export"]["digest"]
        modes = read_calibration_file(Path(args[0], "calibration.json"), digest) or {}
        if "greedy" in modes:
            CALIBRATION.update(calibration=modes["greedy"]["calibration"], note=f"{args[0]}/calibration.json (greedy)")


def analyse(conf, accepted, rank, q, prompt, costs, depths) -> dict:
    from specrt.runtime.governor import Calibration

    dec, ver, draft = table_costs(costs, depths)
    a, rank, n = np.asarray(accepted), np.asarray(rank), len(accepted)
    depths = list(depths)

    rows = rows_cost(costs, depths)

    def cost(d: int, w: int) -> float:
        return draft(max(d, 1)) + (rows(d + w - 1) if d else dec)

    def tokens(d: int, w: int) -> np.ndarray:
        sib = (a == 0) & (rank >= 1) & (rank < w) & (d >= 1)
        return np.minimum(a, d) + 1 + sib

    def rate(ds, ws) -> float:
        ds, ws = np.asarray(ds), np.asarray(ws)
        tok = sum(tokens(d, w)[(ds == d) & (ws == w)].sum() for d in set(ds.tolist()) for w in set(ws.tolist()))
        sec = sum(cost(int(d), int(w)) for d, w in zip(ds, ws))
        return float(tok) / sec

    fixed = {f"{d}:{w}": rate([d] * n, [w] * n) for d in depths for w in WIDTHS}
    best_chain = max((k for k in fixed if k.endswith(":1")), key=fixed.get)
    best = max(fixed, key=fixed.get)
    # post-draft oracle: per round the (d, W) that, knowing every round's outcome, gives the
    # best rate over the run (usually the cheapest one that gets the round's tokens)
    options = [(0, 1)] + [(d, w) for d in depths for w in WIDTHS]
    pick = rate_optimal(np.stack([tokens(d, w) for d, w in options], 1), [cost(d, w) for d, w in options])
    od, ow = [options[i][0] for i in pick], [options[i][1] for i in pick]

    # the engines' calibration, fitted here by two-fold cross-fitting on prompts (the stored
    # one was fitted on other rounds; this keeps the experiment self-contained)
    fold = np.asarray(prompt) % 2
    c = np.zeros_like(np.asarray(conf, np.float64))
    k = conf.shape[1]
    pos = np.tile(np.arange(k), (n, 1))
    acc_k = (a[:, None] > np.arange(k)[None]).astype(float)  # draft k accepted
    reached = (a[:, None] >= np.arange(k)[None])  # drafts 1..k-1 accepted: k tested
    for f in (0, 1):
        tr = (fold != f)[:, None] & reached
        cal = Calibration.fit(conf[tr], pos[tr], acc_k[tr])
        c[fold == f] = np.stack([cal(list(map(float, row))) for row in conf[fold == f]])
    # R_W: P(a runner-up of rank < W wins | first draft rejected), per fold from the other
    rej = a == 0
    R = np.zeros((n, len(WIDTHS)))
    for f in (0, 1):
        tr = (fold != f) & rej
        R[fold == f] = [np.mean((rank[tr] >= 1) & (rank[tr] < w)) for w in WIDTHS]
    # per round: P(rank j wins | rejected) from q_j / (1 - q_1), binned, fitted on the other fold
    ratio = np.asarray(q)[:, 1:] / np.maximum(1e-9, 1 - np.asarray(q)[:, :1])  # [n, 3]
    edges = np.quantile(ratio[rej].ravel(), np.linspace(0, 1, 11)[1:-1])
    Rq = np.zeros((n, len(WIDTHS)))
    for f in (0, 1):
        tr = (fold != f) & rej
        table = np.zeros((3, 10))
        for j in range(3):
            b = np.digitize(ratio[tr, j], edges)
            hits = rank[tr] == j + 1
            table[j] = [(hits[b == i].sum() + 1) / ((b == i).sum() + 8) for i in range(10)]
        te = fold == f
        win = np.stack([table[j][np.digitize(ratio[te, j], edges)] for j in range(3)], 1)
        Rq[te] = np.concatenate([np.zeros((te.sum(), 1)), np.cumsum(win, 1)], 1)

    def rule(R, widths) -> tuple[list[int], list[int]]:
        ds, ws = [], []
        for i in range(n):
            ci = c[i]
            best_rate, bd, bw = 1.0 / cost(0, 1), 0, 1
            for w in widths:
                e, s = 1.0, 1.0
                for kk in range(1, depths[-1] + 1):
                    s *= ci[kk - 1]
                    e += s + ((1 - ci[0]) * R[i, WIDTHS.index(w)] if kk == 1 else 0.0)
                    if kk in ver:
                        r_ = e / cost(kk, w)
                        if r_ > best_rate:
                            best_rate, bd, bw = r_, kk, w
            ds.append(bd)
            ws.append(bw)
        return ds, ws

    report = {"rounds": n, "first_rejected": float(rej.mean()),
              "runner_up_wins_given_rejected": {f"rank{j + 1}": float(np.mean(rank[rej] == j)) for j in range(1, 4)},
              "best_fixed": best, "best_chain": best_chain,
              "fixed_vs_best": {kk: v / fixed[best] for kk, v in sorted(fixed.items(), key=lambda x: -x[1])[:10]},
              "post_draft_oracle": rate(od, ow) / fixed[best]}
    for name, (R_, widths) in {"rule_chain": (R, (1,)), "rule_w2": (R, (2,)), "rule_w3": (R, (3,)),
                               "rule_w4": (R, (4,)), "rule_width_per_round": (R, WIDTHS), "rule_width_per_round_max3": (R, (1, 2, 3)),
                               "rule_width_per_round_q": (Rq, WIDTHS), "rule_w3_q": (Rq, (3,))}.items():
        ds, ws = rule(R_, widths)
        hist: dict[str, int] = {}
        for d, w in zip(ds, ws):
            hist[f"{d}:{w}"] = hist.get(f"{d}:{w}", 0) + 1
        report[name] = {"vs_best_fixed": rate(ds, ws) / fixed[best],
                        "choices": dict(sorted(hist.items(), key=lambda x: -x[1])[:8])}
        print(f"{name:26s} {report[name]['vs_best_fixed']:.4f}x {best}", file=sys.stderr)
    from bench_governors import dspark_from_table

    for w in (3, 4):
        gov = dspark_from_table(costs, depths, CALIBRATION.get("calibration"))
        gov.tree_width = w
        r_, taken = simulate(gov, list(zip(conf, a)), costs, depths, ranks=rank)
        taken = dict(sorted(taken.items(), key=lambda x: -x[1])[:8])
        report[f"dspark_tree{w}_simulated"] = {"vs_best_fixed": r_ / fixed[best], "block/depth/runners-up": taken,
                                               "calibration": CALIBRATION.get("note")}
        print(f"dspark:tree={w} simulated     {r_ / fixed[best]:.4f}x {best}", file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    load_stored_calibration(sys.argv[1:] if argv is None else argv)
    return recorded_experiment(__doc__, argv, record, analyse, ("conf", "accepted", "rank", "q", "prompt"))


if __name__ == "__main__":
    sys.exit(main())
