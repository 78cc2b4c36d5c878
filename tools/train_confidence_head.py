"""Train a DSpark confidence head for a P-EAGLE draft and write a copy of the draft with it.

The head is DeepSpec's ``confidence_head.proj`` (config ``"enable_confidence_head": true,
"confidence_head_with_markov": false``; tensors ``confidence_head.proj.weight`` [1, H] and
``confidence_head.proj.bias`` [1], float32): the confidence of draft position k is
``sigmoid(w . n_k + b)``, n_k the draft's final-RMSNorm output there (what its lm_head reads).
One head shared by all positions, trained as DSpark's conditional acceptance
c_k = P(position k correct | positions 1..k-1 correct): logistic regression (full-batch
LBFGS, L2 weight decay picked on a split of the training answers) on the examples whose
earlier positions were all correct.

Examples are teacher-forced exactly as tools/train_peagle.py's ``evaluate``: per answer one
``build_batch`` with every mask slot kept, each anchor t in [P-1, N-2-K], K draft positions
from the one parallel pass; "correct" = the draft's greedy token equals the target's greedy
token there. Besides n_k the draft's softmax max probability p_k is kept: that is what DSpark
reads today, and the baseline the head is measured against on the held-out answers
(tools/data/heldout_prompts.jsonl, the target's greedy answers train_peagle caches; never
trained on): per position, on the conditional examples, AUC, log-loss and 10-bin ECE of each
raw score as a probability (and after a per-position Platt calibration fitted on the training
examples, as the runtime calibrates), and the AUC of the running products prod_{j<=k} at the
unconditional event "positions 1..k all correct".

Training answers: by default ``fixtures/peagle-data/chat-third.jsonl.gz``, answers stage 7 never
trained on (fixtures/peagle-data/README.md; stages 8-10, the committed draft since session 58,
trained on every answer file, so none is unseen by it now), sampled evenly across kinds.
(Session 35's report, results/confidence_head, used ``chat-rest.jsonl.gz`` with stage 6, which had
not trained on those; stage 7 has.) On answers
the draft saw in training its acceptance is higher than on new text, so a head fitted there
learns the memorised rate.

    python tools/train_confidence_head.py --out /tmp/peagle-conf --report /tmp/peagle-conf-report.json
    specrt inspect ~/.cache/specrt/smollm2-135m-instruct --draft /tmp/peagle-conf
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_peagle as tp  # noqa: E402
from smollm2 import default_cache  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WEIGHT, BIAS = "confidence_head.proj.weight", "confidence_head.proj.bias"


def _log(msg: str) -> None:
    print(f"[conf] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# --- data -------------------------------------------------------------------------

def sample_by_kind(seqs: list[tp.Seq], n: int, seed: int) -> list[tp.Seq]:
    """Up to ``n`` answers, round-robin over the kinds (each kind's answers shuffled)."""
    rng = random.Random(seed)
    by_kind: dict[str, list[tp.Seq]] = {}
    for s in seqs:
        by_kind.setdefault(s.kind, []).append(s)
    for v in by_kind.values():
        rng.shuffle(v)
    out, kinds = [], sorted(by_kind)
    while len(out) < n and any(by_kind.values()):
        for k in kinds:
            if by_kind[k] and len(out) < n:
                out.append(by_kind[k].pop())
    return out


@torch.no_grad()
def collect(model: tp.PEagleDraft, seqs: list[tp.Seq], feats: tp.Features, K: int) -> dict[str, np.ndarray]:
    """Per anchor (as tp.evaluate: t in [P-1, N-2-K]) and draft position k = 1..K: the normed
    hidden n_k [A, K, H], the softmax max probability p_k [A, K], whether the draft's greedy
    token equals the target's [A, K], and the answer's index [A]."""
    model.eval()
    captured = {}
    hook = model.norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("n", out))
    hs, ps, oks, sid = [], [], [], []
    try:
        for j, s in enumerate(seqs):
            b = tp.build_batch([j], seqs, feats, K, [1.0] * K, np.random.default_rng(0))
            logq, draft_tok = tp.draft_outputs(model, b)
            n = captured["n"][b.loss_slot].float()  # [M, H]: exactly the rows lm_head read
            ok = (draft_tok == tp.greedy_targets(b, feats)).numpy()
            pmax = logq.max(-1).values.exp().numpy()
            # (anchor, depth) -> output row, as tp.evaluate's table
            t_rel = (b.anchor_row - int(feats.offsets[j])).numpy()
            d = b.loss_depth.numpy()
            anchors = np.arange(s.prompt_len - 1, len(s.ids) - 1 - K)
            if not len(anchors):
                continue
            rows = np.full((int(t_rel.max()) + 1, K + 1), -1, dtype=np.int64)
            rows[t_rel, d] = np.arange(len(d))
            idx = rows[anchors][:, 1:]  # [A, K]
            assert (idx >= 0).all()
            hs.append(n[torch.from_numpy(idx)].numpy())
            ps.append(pmax[idx])
            oks.append(ok[idx])
            sid.append(np.full(len(anchors), j))
    finally:
        hook.remove()
    return {"h": np.concatenate(hs), "p": np.concatenate(ps).astype(np.float64),
            "ok": np.concatenate(oks).astype(bool), "seq": np.concatenate(sid)}


def conditional(ok: np.ndarray) -> np.ndarray:
    """[A, K] bool: position k's example is conditional (positions 1..k-1 all correct)."""
    prev = np.cumprod(ok, 1).astype(bool)
    return np.concatenate([np.ones((len(ok), 1), bool), prev[:, :-1]], 1)


# --- the head ---------------------------------------------------------------------

def fit_logistic(x: torch.Tensor, y: torch.Tensor, wd: float, max_iter: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """min mean BCE(sigmoid(x w + b), y) + wd/2 |w|^2 by full-batch LBFGS; x [n, d], y [n]."""
    w = torch.zeros(x.shape[1], dtype=x.dtype, requires_grad=True)
    p0 = float(y.mean().clamp(1e-4, 1 - 1e-4))
    b = torch.tensor([np.log(p0 / (1 - p0))], dtype=x.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(x @ w + b, y) + 0.5 * wd * w.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def train_head(h: np.ndarray, y: np.ndarray, seq: np.ndarray, wds: list[float], seed: int) -> dict:
    """Standardise n_k, pick the weight decay by held-aside log-loss (a fifth of the training
    answers), refit on all, fold the standardisation into (w, b) in float32."""
    mu, sd = h.mean(0), h.std(0) + 1e-6
    x = torch.from_numpy(((h - mu) / sd).astype(np.float32))
    yt = torch.from_numpy(y.astype(np.float32))
    ids = np.unique(seq)
    val_ids = np.random.default_rng(seed).choice(ids, max(1, len(ids) // 5), replace=False)
    val = torch.from_numpy(np.isin(seq, val_ids))
    scores = {}
    for wd in wds:
        w, b = fit_logistic(x[~val], yt[~val], wd)
        scores[wd] = float(F.binary_cross_entropy_with_logits(x[val] @ w + b, yt[val]))
        _log(f"weight decay {wd:g}: log-loss {scores[wd]:.4f} on {int(val.sum())} examples of "
             f"{len(val_ids)} set-aside answers")
    best = min(scores, key=scores.get)
    w, b = fit_logistic(x, yt, best)
    w_raw = w.double().numpy() / sd
    b_raw = float(b.double()) - float((w.double().numpy() * mu / sd).sum())
    return {"weight": w_raw.astype(np.float32).reshape(1, -1), "bias": np.asarray([b_raw], np.float32),
            "weight_decay": best, "set_aside_log_loss": {str(k): round(v, 5) for k, v in scores.items()}}


def head_logit(h: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return h.astype(np.float64) @ weight[0].astype(np.float64) + float(bias[0])


def head_logit_fp16(h: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """As the exported fp16 graph computes it: ReduceMean(h * w) * H + b, each op in fp16."""
    h16, w16 = torch.from_numpy(h).half(), torch.from_numpy(weight[0]).half()
    H = h.shape[-1]
    return ((h16 * w16).mean(-1) * torch.tensor(H, dtype=torch.float16)
            + torch.from_numpy(bias).half()).float().numpy().astype(np.float64)


# --- metrics ----------------------------------------------------------------------

def auc(score: np.ndarray, y: np.ndarray) -> float | None:
    """Mann-Whitney AUC with tied scores at their average rank."""
    y = y.astype(bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if not n1 or not n0:
        return None
    _, inv, cnt = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(cnt) - (cnt - 1) / 2.0)[inv]
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p))))


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    b = np.minimum((p * bins).astype(int), bins - 1)
    tot = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            tot += m.sum() * abs(y[m].mean() - p[m].mean())
    return float(tot / len(p))


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """a, b of sigmoid(a z + b) fitted to y (no decay): a per-position calibration."""
    w, b = fit_logistic(torch.from_numpy(z[:, None]), torch.from_numpy(y.astype(np.float64)), 0.0, 100)
    return float(w[0]), float(b[0])


def rnd(x, n=4):
    return None if x is None else round(float(x), n)


def measure(tr: dict, te: dict, head: dict, K: int) -> dict:
    """Per position: conditional-example counts, rates, AUC / log-loss / ECE of the head and of
    p_k (raw, and after a per-position Platt fit on the training examples); unconditional AUC."""
    W, B = head["weight"], head["bias"]
    z_tr, z_te = head_logit(tr["h"], W, B), head_logit(te["h"], W, B)  # [A, K]
    c_tr, c_te = conditional(tr["ok"]), conditional(te["ok"])
    rows = []
    for k in range(K):
        mtr, mte = c_tr[:, k], c_te[:, k]
        ytr, yte = tr["ok"][mtr, k], te["ok"][mte, k]
        zh, zp = z_te[mte, k], te["p"][mte, k]
        ah, bh = platt(z_tr[mtr, k], ytr)
        ap, bp = platt(logit(tr["p"][mtr, k]), ytr)
        ph, pp = sigmoid(zh), zp
        ph_cal, pp_cal = sigmoid(ah * zh + bh), sigmoid(ap * logit(zp) + bp)
        # unconditional: positions 1..k all correct, scored by the running products
        y_unc = np.cumprod(te["ok"], 1)[:, k].astype(bool)
        head_prod = np.exp(-np.logaddexp(0.0, -z_te[:, :k + 1]).sum(1))  # prod of sigmoids
        p_prod = np.exp(np.log(np.clip(te["p"][:, :k + 1], 1e-30, 1)).sum(1))
        rows.append({
            "k": k + 1,
            "train_examples": int(mtr.sum()), "train_rate": rnd(ytr.mean()),
            "heldout_examples": int(mte.sum()), "heldout_rate": rnd(yte.mean()),
            "auc_head": rnd(auc(zh, yte)), "auc_pmax": rnd(auc(zp, yte)),
            "logloss_head": rnd(log_loss(ph, yte)), "logloss_pmax": rnd(log_loss(pp, yte)),
            "ece_head": rnd(ece(ph, yte)), "ece_pmax": rnd(ece(pp, yte)),
            "mean_head": rnd(ph.mean()), "mean_pmax": rnd(pp.mean()),
            "calibrated_logloss_head": rnd(log_loss(ph_cal, yte)), "calibrated_logloss_pmax": rnd(log_loss(pp_cal, yte)),
            "calibrated_ece_head": rnd(ece(ph_cal, yte)), "calibrated_ece_pmax": rnd(ece(pp_cal, yte)),
            "unconditional_rate": rnd(y_unc.mean()),
            "unconditional_auc_head_product": rnd(auc(head_prod, y_unc)),
            "unconditional_auc_pmax_product": rnd(auc(p_prod, y_unc)),
        })
    return {"per_position": rows}


# --- output -----------------------------------------------------------------------

def write_draft(src: Path, out: Path, weight: np.ndarray, bias: np.ndarray) -> None:
    """``src`` plus the head: config keys, the two float32 tensors, the receipt copied."""
    from safetensors.torch import load_file, save_file
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(enable_confidence_head=True, confidence_head_with_markov=False)
    tensors = load_file(src / "model.safetensors")
    if WEIGHT in tensors or BIAS in tensors:
        raise SystemExit(f"{src}: already has a confidence head")
    tensors[WEIGHT] = torch.from_numpy(np.ascontiguousarray(weight, np.float32))
    tensors[BIAS] = torch.from_numpy(np.ascontiguousarray(bias, np.float32))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if (src / "training_receipt.json").is_file():
        shutil.copyfile(src / "training_receipt.json", tmp / "training_receipt.json")
    tp.swap_in(tmp, out)
    # the original tensors byte for byte, the new ones as given
    new = load_file(out / "model.safetensors")
    orig = load_file(src / "model.safetensors")
    for k, v in orig.items():
        if new[k].dtype != v.dtype or new[k].shape != v.shape or \
                new[k].contiguous().view(torch.uint8).numpy().tobytes() != v.contiguous().view(torch.uint8).numpy().tobytes():
            raise SystemExit(f"{out}: tensor {k} differs from {src}'s")
    assert set(new) == set(orig) | {WEIGHT, BIAS}
    assert new[WEIGHT].dtype == new[BIAS].dtype == torch.float32


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", type=Path, default=ROOT / "fixtures" / "peagle-smollm2")
    ap.add_argument("--out", type=Path, default=Path("/tmp/peagle-conf"))
    ap.add_argument("--chat", type=Path, default=ROOT / "fixtures" / "peagle-data" / "chat-third.jsonl.gz",
                    help="training answers (.jsonl or .jsonl.gz, gen_chat_data's format); default: answers "
                         "stage 7 never trained on (the committed draft has trained on every answer file)")
    ap.add_argument("--answers", type=int, default=300, help="training answers, sampled evenly across kinds")
    ap.add_argument("--heldout-limit", type=int, default=None)
    ap.add_argument("--heldout-max-new", type=int, default=128, help="as tools/eval_draft.py")
    ap.add_argument("--weight-decay", default="1e-4,1e-3,1e-2,3e-2,1e-1",
                    help="candidates (on standardised features), picked by a set-aside fifth of the answers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-feature-cache", action="store_true",
                    help="neither read nor keep the target's features in <cache>/peagle-data/train-feats-*")
    ap.add_argument("--report", type=Path, default=None, help="write the measurements as JSON here")
    ap.add_argument("--no-inspect", action="store_true", help="skip `specrt inspect` of the written draft")
    args = ap.parse_args(argv)
    t0 = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cache = default_cache()
    hf_dir, source, tok, target = tp.smollm2_target(cache)
    cfg = json.loads((args.draft / "config.json").read_text())
    aux_ids = list(cfg["eagle_aux_hidden_state_layer_ids"])
    K = cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    model = tp.load_draft(args.draft, target.model.embed_tokens.weight.detach().clone())
    H = cfg["transformer_layer_config"]["hidden_size"]

    fcache = None if args.no_feature_cache else tp.FeatureCache(cache / "peagle-data", source["sha256"], aux_ids, H)
    train = sample_by_kind(tp.load_answers(args.chat), args.answers, args.seed)
    kinds = {k: sum(s.kind == k for s in train) for k in sorted({s.kind for s in train})}
    _log(f"training answers: {len(train)} of {args.chat} ({kinds}), "
         f"{sum(len(s.ids) - s.prompt_len for s in train)} answer tokens")
    held = tp.heldout_answers(target, tok, cache, args.heldout_limit, args.heldout_max_new, source["sha256"])
    train_texts = {tuple(s.ids[:s.prompt_len]) for s in train}
    if any(tuple(s.ids[:s.prompt_len]) in train_texts for s in held):
        raise SystemExit("a held-out prompt is among the training answers")
    f_train = tp.build_features(target, train, aux_ids, None, cache=fcache)
    f_held = tp.build_features(target, held, aux_ids, None, cache=fcache)
    t_feat = time.time() - t0
    _log(f"features ready ({t_feat:.0f} s)")

    tr = collect(model, train, f_train, K)
    te = collect(model, held, f_held, K)
    _log(f"draft outputs: {len(tr['ok'])} training anchors, {len(te['ok'])} held-out anchors; "
         f"held-out acceptance by position {np.cumprod(te['ok'], 1).mean(0).round(4).tolist()}")

    cond = conditional(tr["ok"])
    head = train_head(tr["h"][cond], tr["ok"][cond], np.broadcast_to(tr["seq"][:, None], cond.shape)[cond],
                      [float(x) for x in args.weight_decay.split(",")], args.seed)
    _log(f"head: weight decay {head['weight_decay']:g}, |w| {np.linalg.norm(head['weight']):.3f}, "
         f"max |w_i| {np.abs(head['weight']).max():.4f}, b {head['bias'][0]:.4f}")
    result = measure(tr, te, head, K)
    z32 = head_logit(te["h"], head["weight"], head["bias"])
    z16 = head_logit_fp16(te["h"], head["weight"], head["bias"])
    fp16_gap = float(np.abs(sigmoid(z32) - sigmoid(z16)).max())

    write_draft(args.draft, args.out, head["weight"], head["bias"])
    _log(f"wrote {args.out}")
    inspect = None
    if not args.no_inspect:
        exe = Path(sys.executable).parent / "specrt"
        r = subprocess.run([str(exe), "inspect", str(hf_dir), "--draft", str(args.out)], capture_output=True, text=True)
        inspect = {"rc": r.returncode, "head_lines": [ln.strip() for ln in r.stdout.splitlines() if "confidence" in ln]}
        if r.returncode:
            print(r.stdout + r.stderr, file=sys.stderr)
            raise SystemExit(f"specrt inspect of {args.out} failed (rc {r.returncode})")
        _log(f"specrt inspect {args.out}: ok; " + "; ".join(inspect["head_lines"]))

    report = {
        "draft": str(args.draft), "out": str(args.out), "K": K,
        "train": {"path": str(args.chat), "answers": len(train), "kinds": kinds, "anchors": int(len(tr["ok"]))},
        "heldout": {"prompts": len(held), "max_new_tokens": args.heldout_max_new, "anchors": int(len(te["ok"])),
                    "acceptance_at_pos": np.cumprod(te["ok"], 1).mean(0).round(4).tolist()},
        "head": {"weight_decay": head["weight_decay"], "set_aside_log_loss": head["set_aside_log_loss"],
                 "weight_norm": rnd(np.linalg.norm(head["weight"])), "bias": rnd(head["bias"][0]),
                 "max_abs_conf_diff_fp16_graph": rnd(fp16_gap, 6)},
        **result,
        "inspect": inspect,
        "wall_seconds": {"features": round(t_feat, 1), "total": round(time.time() - t0, 1)},
        "command": " ".join(["python", "tools/train_confidence_head.py"] + (argv if argv is not None else sys.argv[1:])),
    }
    if args.report:  # before the table: the report is the result, the table only shows it
        tmp = args.report.with_name(args.report.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(args.report)

    def f(x, spec: str) -> str:  # a figure, or "-" where it is undefined (an AUC over one class)
        return format(x, spec) if x is not None else format("-", spec.split(".")[0].rstrip("f"))

    hdr = f"{'k':>2} {'n_tr':>6} {'n_te':>6} {'rate':>6} | {'AUC head':>8} {'AUC p':>7} | " \
          f"{'LL head':>7} {'LL p':>7} | {'ECE head':>8} {'ECE p':>7} | {'cal LL h':>8} {'cal LL p':>8} | " \
          f"{'uncAUC h':>8} {'uncAUC p':>8}"
    print(hdr)
    for r in result["per_position"]:
        print(f"{r['k']:>2} {r['train_examples']:>6} {r['heldout_examples']:>6} {f(r['heldout_rate'], '>6.3f')} | "
              f"{f(r['auc_head'], '>8.4f')} {f(r['auc_pmax'], '>7.4f')} | {f(r['logloss_head'], '>7.4f')} "
              f"{f(r['logloss_pmax'], '>7.4f')} | {f(r['ece_head'], '>8.4f')} {f(r['ece_pmax'], '>7.4f')} | "
              f"{f(r['calibrated_logloss_head'], '>8.4f')} {f(r['calibrated_logloss_pmax'], '>8.4f')} | "
              f"{f(r['unconditional_auc_head_product'], '>8.4f')} {f(r['unconditional_auc_pmax_product'], '>8.4f')}")
    print(f"fp16-graph vs float32 confidence: max |diff| {fp16_gap:.2e}; wall {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
