"""Experiment: does the target's own confidence sharpen DSpark's acceptance prediction?

    .venv/bin/python tools/exp_target_confidence.py ENGINES --prompts FILE [--chat]
        [--max-new-tokens 128] [-o OUT.json]

DSpark predicts each round's acceptance from the drafts' confidences alone. A feature it
does not use: how sure the target was of the token it emitted last (the maximum
probability, and the entropy, of the target's distribution at the row that produced the
round's last token; for the first round, the prompt's last row). It is known before
drafting, so it could also decide whether to draft at all.

This decodes the prompts with every round verifying the full block (as ``specrt
calibrate`` does), keeping per round the drafts' confidences, the accepted count and the
target's confidence, then on those rounds, with two-fold cross-fitting by prompt (fit on
one half of the prompts, predict the other):

* AUC of "position 1 accepted" for the draft's confidence, the target's confidence and
  entropy, and logistic models per position on the draft's logit alone vs draft + target;
* the same from a direct model of survival, S_k on every confidence up to k (is the
  product of per-position fits losing information?);
* DSpark's post-draft rule (E(d) / (t_draft + t_verify(d)), decode when no depth beats
  it; the build's cost table) on each model's conditional acceptances, priced as
  tools/bench_governors.py ``price`` does, against the best fixed depth and the
  post-draft oracle;
* the AUC of a pre-draft predictor of "position 1 accepted" from the target alone.

Measured 2026-11-30 on the 49 clean held-out prompts (out/device/heldout_clean49.jsonl,
chat, 128 new tokens): committed draft (3382 rounds, 54% accept nothing): AUC 0.792 draft,
0.634 target, cross-fitted S1 0.792 -> 0.798 with the target; the rule 1.004x -> 1.005x
the best fixed depth (oracle 1.049x). The GPU run-4 draft (2972 rounds): AUC 0.814 draft,
0.632 target, S1 0.813 -> 0.814; rule 1.034x -> 1.034x (oracle 1.118x). Pre-draft AUC from
the target alone 0.63. The target's confidence adds nothing the drafts' confidences do
not already carry, so DSpark does not take it. The direct survival model does no better
than the product either (rule 1.003x and 1.031x): results/governors_target_confidence.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_governors import dspark_from_table, oracle_choices, price  # noqa: E402
from governor_replay import decode_rounds, recorded_experiment  # noqa: E402


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, iters: int = 50) -> np.ndarray:
    """Weights (bias first) of an L2-regularised logistic regression, by Newton's method."""
    X = np.c_[np.ones(len(x)), x]
    w = np.zeros(X.shape[1])
    for _ in range(iters):
        p = 1 / (1 + np.exp(-X @ w))
        g = X.T @ (p - y) + l2 * w
        h = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(len(w))
        w -= np.linalg.solve(h, g)
    return w


def predict_logistic(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.c_[np.ones(len(x)), x] @ w))


def crossfit(features, accepted: np.ndarray, fold: np.ndarray, positions: int, l2: float = 1e-3,
             by_fold: bool = False) -> np.ndarray:
    """Conditional acceptance [rounds, positions]: at position k, P(draft k+1 accepted | drafts
    1..k accepted) from ``features(k)`` [rounds, f] (``by_fold``: ``features(k, f)``, features
    fitted without fold f, e.g. a projection), fitted on the rounds of the other fold that
    reached position k."""
    out = np.zeros((len(accepted), positions))
    for k in range(positions):
        reached, label = accepted >= k, (accepted >= k + 1).astype(np.float64)
        for f in np.unique(fold):
            x = features(k, f) if by_fold else features(k)
            train, test = reached & (fold != f), fold == f
            out[test, k] = predict_logistic(fit_logistic(x[train], label[train], l2), x[test])
    return out


def rule_choices(cond: np.ndarray, costs: dict, depths) -> list[int]:
    """DSpark's post-draft rule (DSparkGovernor.choose, the identity map: ``cond`` are
    conditional acceptances already) on each round, the full block drafted."""
    from specrt.runtime.governor import GovernorState

    gov = dspark_from_table(costs, depths, learn=False)
    return [gov.choose(GovernorState(confidences=c)) for c in cond]


def direct_survival(conf: np.ndarray, accepted: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Conditional acceptances from a direct model of survival: S_k = P(a >= k) fitted on the
    logits of every confidence up to k (not a product of per-position fits), cross-fitted,
    made non-increasing in k, then c_k = S_k / S_{k-1}."""
    K, x = conf.shape[1], logit(conf)
    surv = np.zeros((len(accepted), K))
    for k in range(K):
        label = (accepted >= k + 1).astype(np.float64)
        for f in np.unique(fold):
            train, test = fold != f, fold == f
            surv[test, k] = predict_logistic(fit_logistic(x[train, : k + 1], label[train]), x[test, : k + 1])
    surv = np.minimum.accumulate(surv, axis=1)
    cond = surv.copy()
    cond[:, 1:] = surv[:, 1:] / np.maximum(surv[:, :-1], 1e-12)
    return cond


def price_models(models: dict[str, np.ndarray], accepted: np.ndarray, costs: dict, depths) -> dict:
    """Per model (conditional acceptances [rounds, K]): cross-fitted AUC of S_1..S_4, and
    DSpark's rule on it priced at the cost table against the best fixed depth; the oracle."""
    from specrt.runtime.governor import auc

    K = next(iter(models.values())).shape[1]
    acc = [int(a) for a in accepted]
    fixed = {d: price([d] * len(acc), acc, costs, depths) for d in depths}
    best = max(fixed, key=fixed.get)
    return {
        "auc_crossfitted": {name: {f"S{k + 1}": auc(np.prod(m[:, : k + 1], axis=1), (accepted >= k + 1).astype(float))
                                   for k in range(min(K, 4))} for name, m in models.items()},
        "best_fixed": f"fixed:{best}",
        "post_draft_oracle_vs_best_fixed": price(oracle_choices(acc, costs, depths), acc, costs, depths) / fixed[best],
        "rule_vs_best_fixed": {name: price(rule_choices(m, costs, depths), acc, costs, depths) / fixed[best]
                               for name, m in models.items()},
    }


def analyse(conf: np.ndarray, accepted: np.ndarray, tconf: np.ndarray, tent: np.ndarray, prompt: np.ndarray,
            costs: dict, depths) -> dict:
    from specrt.runtime.governor import auc

    K = conf.shape[1]
    y1 = (accepted >= 1).astype(np.float64)
    fold = prompt % 2
    draft_only = crossfit(lambda k: logit(conf[:, k])[:, None], accepted, fold, K)
    with_target = crossfit(lambda k: np.c_[logit(conf[:, k]), logit(tconf), tent], accepted, fold, K)
    pre = np.zeros(len(accepted))
    for f in np.unique(fold):
        x = np.c_[logit(tconf), tent]
        pre[fold == f] = predict_logistic(fit_logistic(x[fold != f], y1[fold != f]), x[fold == f])
    models = {"draft_only": draft_only, "draft_and_target": with_target,
              "draft_direct_survival": direct_survival(conf, accepted, fold)}
    return {
        "rounds": len(accepted), "accept_nothing_share": float(np.mean(accepted == 0)),
        "auc_position1": {"draft_confidence": auc(conf[:, 0], y1), "target_confidence": auc(tconf, y1),
                          "target_negative_entropy": auc(-tent, y1)},
        **price_models(models, accepted, costs, depths),
        "auc_pre_draft_target_only": auc(pre, y1),
    }


def record(engines: Path, prompts: list[dict], chat: bool, max_new_tokens: int) -> dict:
    """Full-depth rounds: the drafts' confidences, the accepted count, the target's confidence
    (max probability, entropy) at the row that produced the token before the round."""
    from specrt import contracts as C
    from specrt.runtime.calibrate import RecordingGovernor
    from specrt.runtime.session import Session

    rows: dict[str, list] = {"prompt": [], "conf": [], "accepted": [], "tconf": [], "tent": []}
    with Session(engines, governor="off") as s:
        g, depths = s.generator, s.engines.depths
        last: dict = {}
        target = g._target  # an experiment's hook: keep the target's logits of every call

        def keep_logits(tokens, start, *siblings, **kw):
            out, dt = target(tokens, start, *siblings, **kw)
            last["logits"] = out[C.LOGITS][0]
            return out, dt

        g._target = keep_logits

        class Recorder(RecordingGovernor):
            def __init__(self, prompt_index: int):
                super().__init__(depths, depths[-1])
                self.i, self.prev = prompt_index, None

            def choose(self, state):
                if self.prev is None:  # the first round: the prefill's last row
                    self.prev = last["logits"][-1]
                return super().choose(state)

            def observe(self, r):
                if r.depth == depths[-1] and r.confidences is not None:
                    x = self.prev.astype(np.float64)
                    p = np.exp(x - x.max())
                    p /= p.sum()
                    rows["prompt"].append(self.i)
                    rows["conf"].append(np.asarray(r.confidences, np.float64)[: depths[-1]])
                    rows["accepted"].append(int(r.accepted))
                    rows["tconf"].append(float(p.max()))
                    rows["tent"].append(float(-(p * np.log(np.maximum(p, 1e-30))).sum()))
                self.prev = last["logits"][r.accepted]

        return decode_rounds(s, prompts, chat, max_new_tokens, Recorder, rows)


def main(argv: list[str] | None = None) -> int:
    return recorded_experiment(__doc__, argv, record, analyse, ("conf", "accepted", "tconf", "tent", "prompt"))


if __name__ == "__main__":
    sys.exit(main())
