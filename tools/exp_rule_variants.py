"""Is DSpark's depth rule, or what it knows, what keeps it near 1.03x the best fixed depth? (2026-11-30)

Records full-depth rounds on the prompts (as tools/governor_replay.py does: each round's 8
draft confidences, accepted count and prompt), then prices on them, as governor_replay
does (a round of depth d: draft(d) + verify(d), min(a, d) + 1 tokens):

* the rule as the runtime has it (runtime.governor.DSparkGovernor.choose: per round, the
  depth with the best expected tokens per second, E(d) / t(d)), deciding at the build's
  cost table or at the costs measured live (``--live``: a tools/bench_governors.py report
  of the same engines; verify.d from fixed:d's rounds, decode from off's, draft blocks from
  the deepest fixed depth's), and priced at either;
* the rule that maximises the run's rate instead of each round's (Dinkelbach: per round
  argmax_d E(d) - lambda t(d), lambda the rate the policy reaches, iterated to its fixed
  point): a ratio of sums is not maximised by maximising each ratio;
* whether the previous round's accepted count tells more about this round's first draft
  than its calibrated confidence does (AUC of each, and of a logistic fit on both, fitted
  on alternate rounds and scored on the others).

    python tools/exp_rule_variants.py ENGINES --prompts FILE [--chat] [--max-new-tokens 128]
        --live BENCH_GOVERNORS.json [-o OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_governors import dspark_from_table, oracle_choices, price, table_costs  # noqa: E402
from governor_replay import record_rounds, recording_parser  # noqa: E402


def live_costs(report: dict, depths) -> dict:
    """A cost table (the manifest's form) from a bench_governors report's measured seconds."""
    m = report["results"]["mixed"]
    ver = {str(d): m[f"fixed:{d}"]["mean_seconds"]["verify_by_depth"][str(d)] for d in depths}
    draft = m[f"fixed:{depths[-1]}"]["mean_seconds"]["draft_by_block"]
    return {"verify": ver, "decode": m["off"]["mean_seconds"]["verify_by_depth"]["0"],
            "draft_by_depth": dict(draft), "draft": max(draft.values())}


def ratio_rule(costs: dict, depths, calibration, rounds) -> list[int]:
    from specrt.runtime.governor import GovernorState

    g = dspark_from_table(costs, depths, calibration, learn=False)
    return [g.choose(GovernorState(confidences=np.asarray(c))) for c, _, _ in rounds]


def dinkelbach_rule(costs: dict, depths, calibration, rounds, iterations: int = 8) -> tuple[list[int], float]:
    dec, ver, draft = table_costs(costs, depths)
    cs = [np.asarray(calibration(list(c))) for c, _, _ in rounds]

    def choose(c, lam: float) -> int:
        t0 = draft(len(c))
        best, value, s, e = 0, 1.0 - lam * (t0 + dec), 1.0, 1.0
        for k in range(1, len(c) + 1):
            s *= c[k - 1]
            e += s
            if k in ver and e - lam * (t0 + ver[k]) > value:
                best, value = k, e - lam * (t0 + ver[k])
        return best

    lam = 1.0 / (draft(1) + ver[min(ver)])
    for _ in range(iterations):
        ch = [choose(c, lam) for c in cs]
        tokens = sum(1.0 + (float(np.cumprod(c[:d]).sum()) if d else 0.0) for c, d in zip(cs, ch))
        lam = tokens / sum(draft(len(c)) + (ver[d] if d else dec) for c, d in zip(cs, ch))
    return ch, lam


def history_auc(calibration, rounds) -> dict:
    from specrt.runtime.governor import auc

    a = np.array([r[1] for r in rounds])
    pid = np.array([r[2] for r in rounds])
    prev = np.r_[-1, a[:-1]]
    prev[np.r_[True, pid[1:] != pid[:-1]]] = -1
    m = prev >= 0
    y = (a[m] >= 1).astype(float)
    c1 = np.array([calibration(list(r[0]))[0] for r in rounds])[m]
    p = np.clip(c1, 1e-4, 1 - 1e-4)
    x0 = np.c_[np.ones(m.sum()), np.log(p / (1 - p))]
    x1 = np.c_[x0, np.minimum(prev[m], 3) == 0, np.minimum(prev[m], 3) >= 2]
    fit_on = np.arange(m.sum()) % 2 == 0

    def scored(x):
        w = np.zeros(x.shape[1])
        for _ in range(50):  # Newton steps of a logistic fit
            q = 1 / (1 + np.exp(-x[fit_on] @ w))
            h = (x[fit_on] * (q * (1 - q))[:, None]).T @ x[fit_on] + 1e-6 * np.eye(len(w))
            w += np.linalg.solve(h, x[fit_on].T @ (y[fit_on] - q))
        return auc(1 / (1 + np.exp(-x[~fit_on] @ w)), y[~fit_on])

    return {"rounds": int(m.sum()), "auc_calibrated_c1": auc(c1, y),
            "auc_previous_accepted": auc(np.minimum(prev[m], 3).astype(float), y),
            "heldout_auc_logistic_confidence": scored(x0), "heldout_auc_logistic_confidence_and_previous": scored(x1),
            "p_first_accepted_by_previous": {str(k): float(y[np.minimum(prev[m], 3) == k].mean()) for k in range(4)}}


def main(argv: list[str] | None = None) -> int:
    ap = recording_parser(__doc__)
    ap.add_argument("--live", type=Path, required=True, help="tools/bench_governors.py's JSON report on these engines")
    args = ap.parse_args(argv)

    from specrt.runtime.session import Session, load_calibration

    prompts = [json.loads(x) for x in args.prompts.read_text().splitlines() if x.strip()]
    with Session(args.engines, governor="off") as s:
        depths = s.engines.depths
        rounds = record_rounds(s, prompts, args.chat, args.max_new_tokens)
        cal, note = load_calibration(s.engines)
        table = s.engines.manifest["costs"]
    acc = [a for _, a, _ in rounds]
    tables = {"table": table, "live": live_costs(json.loads(args.live.read_text()), depths)}
    report: dict = {"engines": str(args.engines), "prompts": len(prompts), "rounds": len(rounds), "calibration": note,
                    "live_costs_from": str(args.live), "priced_at": {}}
    decisions = {}
    for name, costs in tables.items():
        decisions[f"ratio_rule@{name}"] = ratio_rule(costs, depths, cal, rounds)
        decisions[f"dinkelbach@{name}"], lam = dinkelbach_rule(costs, depths, cal, rounds)
        report[f"dinkelbach_lambda@{name}"] = lam
    decisions["post_draft_oracle"] = oracle_choices(acc, table, depths)
    for pay_name, pay in tables.items():
        fixed = {d: price([d] * len(acc), acc, pay, depths) for d in depths}
        best = max(fixed, key=fixed.get)
        row = {"best_fixed": f"fixed:{best}", "fixed_vs_best": {str(d): v / fixed[best] for d, v in fixed.items()}}
        # the oracle knows the costs it is paid at ("choices" below: its picks at the table's)
        paid = {**decisions, "post_draft_oracle": oracle_choices(acc, pay, depths)}
        row.update({k: price(ch, acc, pay, depths) / fixed[best] for k, ch in paid.items()})
        report["priced_at"][pay_name] = row
        print(f"priced at the {pay_name} costs, vs the best fixed depth there ({row['best_fixed']}):")
        for k in decisions:
            print(f"  {k:24s} {row[k]:.3f}x")
    report["choices"] = {k: {str(d): int(n) for d, n in zip(*np.unique(ch, return_counts=True))}
                         for k, ch in decisions.items()}
    report["history"] = history_auc(cal, rounds)
    h = report["history"]
    print(f"first draft accepted, AUC: calibrated confidence {h['auc_calibrated_c1']:.3f}, previous round's "
          f"accepted count {h['auc_previous_accepted']:.3f}; logistic fits scored on held-out rounds: confidence "
          f"{h['heldout_auc_logistic_confidence']:.3f}, with the previous count "
          f"{h['heldout_auc_logistic_confidence_and_previous']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
