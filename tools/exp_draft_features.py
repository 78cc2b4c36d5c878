"""Experiment: does more of the draft's distribution than its top probability predict acceptance?

    .venv/bin/python tools/exp_draft_features.py ENGINES --prompts FILE [--chat]
        [--max-new-tokens 128] [--limit N] [--rows ROWS.npz] [-o OUT.json]

DSpark's confidence in draft k is the draft's probability of its own token (the maximum of
its softmax). A confidence head (DSpark's own design) would read more of the draft's state;
the cheapest such features are already in the logits the runtime has: the entropy of the
draft's distribution and the probability of its runner-up token; a head on hidden states
would read the target's auxiliary hidden states the draft reads (P-EAGLE's graph does not
return its own). This decodes the prompts with every round verifying the full block (as
``specrt calibrate`` does), keeping per round and position the draft's top probability,
entropy and second probability, the aux hidden states of the last accepted token and the
accepted count, then, with two-fold cross-fitting by prompt (tools/exp_target_confidence.py):

* AUC of the survival S_k (k = 1..4) from per-position logistic models on the top
  probability alone, on all three features, and on the top probability with the first 32
  principal components of the aux hidden states (fitted without the predicted fold; L2 30);
* DSpark's post-draft rule on each model's conditional acceptances, priced at the build's
  cost table against the best fixed depth and the post-draft oracle.

Measured 2026-12-01 on the 80 held-out prompts (tools/data/heldout_prompts.jsonl, chat,
128 new tokens, stage-6 draft, out/bench-v10 engines; 4965 rounds, 48% accept nothing):
AUC of "position 1 accepted" 0.815 top probability, 0.795 negative entropy, 0.804 margin
to the runner-up; cross-fitted S1 / S2 / S3 0.815 / 0.817 / 0.900 on the top probability
alone, 0.813 / 0.817 / 0.901 with entropy and runner-up; the rule 1.0219x vs 1.0217x the
best fixed depth (fixed:2; oracle 1.092x). The rest of the draft's distribution adds
nothing its top probability does not carry. The aux hidden states add a little: S1 / S2 /
S3 0.819 / 0.835 / 0.916, the rule 1.0257x (8 or 128 components, L2 1 or 30: 1.0226-1.0257x):
a linear confidence head on them would buy DSpark ~0.4%, not the 5% issue 7 asks.
results/governors_draft_features.

What the round before accepted (rounds start after a miss more often than not, and the
next round's drafts fare worse then: tools/exp_loop_fidelity.py) adds nothing either
(2026-12-02, the same 80 prompts on out/ng/engines, 4960 rounds, --rows kept in /tmp):
conditional acceptance at positions 1 / 2 is 0.475 / 0.253 after a round that accepted
nothing and 0.658 / 0.575 after one that accepted 3 or more, but the draft's top
probability moves with it (mean 0.421 vs 0.546); cross-fitted S1 / S2 / S3 0.812 / 0.822 /
0.902 with it against 0.813 / 0.821 / 0.900 without, the rule 1.0326x vs 1.0316x the best
fixed depth (oracle 1.155x).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exp_target_confidence import crossfit, logit, price_models  # noqa: E402
from governor_replay import decode_rounds, full_depth_recorder, recorded_experiment  # noqa: E402

FEATURES = ("top", "entropy", "second")
AUX_COMPONENTS, AUX_L2 = 32, 30.0  # of 8 / 32 / 128 components at L2 1 / 30, the best S1-S3 AUC


def row_features(logits: np.ndarray) -> np.ndarray:
    """Draft logits [K, V] -> [K, 3]: top probability, entropy (nats), second probability."""
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    two = np.partition(p, p.shape[-1] - 2, axis=-1)[:, -2:]  # [K, 2]: second, top
    ent = -(p * np.log(np.maximum(p, 1e-300))).sum(-1)
    return np.c_[two[:, 1], ent, two[:, 0]]


def principal_components(x: np.ndarray, train: np.ndarray, n: int) -> np.ndarray:
    """x [rounds, F] -> [rounds, n]: standardised and projected on the first n principal
    axes of the ``train`` rows, scaled to unit variance there."""
    mu, sd = x[train].mean(0), x[train].std(0) + 1e-6
    z = (x - mu) / sd
    _, s, vt = np.linalg.svd(z[train], full_matrices=False)
    return z @ vt[:n].T / (s[:n] / np.sqrt(train.sum()))


def analyse(feats: np.ndarray, accepted: np.ndarray, prompt: np.ndarray, costs: dict, depths,
            aux: np.ndarray | None = None) -> dict:
    """feats [rounds, K, 3], accepted [rounds], prompt [rounds] (the fold is the prompt's
    parity); aux [rounds, 3H]: the target's aux hidden states the draft read last."""
    from specrt.runtime.governor import auc

    K = feats.shape[1]
    fold = prompt % 2
    prev = np.r_[-1, np.where(prompt[1:] == prompt[:-1], accepted[:-1], -1)]
    top, ent, sec = feats[..., 0], feats[..., 1], feats[..., 2]
    models = {
        "top_only": crossfit(lambda k: logit(top[:, k])[:, None], accepted, fold, K),
        "top_entropy_second": crossfit(lambda k: np.c_[logit(top[:, k]), ent[:, k], logit(sec[:, k])],
                                       accepted, fold, K),
        # what the round before accepted (-1: the first round of a prompt; rows are in order)
        "top_and_previous_round": crossfit(lambda k: np.c_[logit(top[:, k]), np.minimum(prev, 3), prev < 0, prev == 0],
                                           accepted, fold, K),
    }
    if aux is not None and len(aux):  # + the target's aux hidden states, principal components per fold
        proj = {f: principal_components(aux.astype(np.float64), fold != f, AUX_COMPONENTS) for f in np.unique(fold)}
        models[f"top_and_aux{AUX_COMPONENTS}"] = crossfit(lambda k, f: np.c_[logit(top[:, k]), proj[f]], accepted,
                                                         fold, K, l2=AUX_L2, by_fold=True)
    y1 = (accepted >= 1).astype(np.float64)
    return {
        "rounds": len(accepted), "accept_nothing_share": float(np.mean(accepted == 0)),
        "auc_position1_raw": {"top": auc(top[:, 0], y1), "negative_entropy": auc(-ent[:, 0], y1),
                              "margin": auc(top[:, 0] - sec[:, 0], y1)},
        **price_models(models, accepted, costs, depths),
    }


def record(engines: Path, prompts: list[dict], chat: bool, max_new_tokens: int) -> dict:
    """Full-depth rounds: per position the draft's features, and the accepted count."""
    from specrt import contracts as C
    from specrt.runtime.session import Session

    rows: dict[str, list] = {"prompt": [], "feats": [], "accepted": [], "aux": []}
    with Session(engines, governor="off") as s:
        g, depths = s.generator, s.engines.depths
        if (s.engines.export.get("draft") or {}).get("kind") != "peagle":
            raise SystemExit("error: this experiment reads a P-EAGLE draft's one-pass logits")
        last: dict = {}
        run = g._run  # an experiment's hook: keep the draft's logits of every pass

        def keep(runner, feeds, what):
            out, dt = run(runner, feeds, what)
            last[what], last[f"{what}_feeds"] = out, feeds
            return out, dt

        g._run = keep

        def on_round(i, r):
            f = row_features(last["draft"][C.DRAFT_LOGITS][0, -depths[-1]:])
            # the recorded top probability is the runtime's confidence (float32 there)
            assert np.allclose(f[:, 0], np.asarray(r.confidences)[: depths[-1]], atol=1e-4)
            rows["prompt"].append(i)
            rows["feats"].append(f)
            rows["accepted"].append(int(r.accepted))
            # the target's auxiliary hidden states at the last accepted token: what the draft read last
            rows["aux"].append(last["draft_feeds"][C.DRAFT_AUX_IN][0, -1].astype(np.float16))

        return decode_rounds(s, prompts, chat, max_new_tokens, full_depth_recorder(depths, on_round), rows)


def main(argv: list[str] | None = None) -> int:
    return recorded_experiment(__doc__, argv, record, analyse, ("feats", "accepted", "prompt"), optional=("aux",))


if __name__ == "__main__":
    sys.exit(main())
