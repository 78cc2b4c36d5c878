"""Train a P-EAGLE draft for SmolLM2-135M-Instruct and save it in the speculators format.

Architecture and conventions follow DESIGN.md §1-3 (checked against the
speculators library's own one-pass reference before every run):

* one decoder layer of the target's width (``--layers N``: N, layers 1.. ordinary decoder
  layers on its output, DESIGN.md §1; with ``--init`` the added ones start as the identity,
  ``grow_layers``); ``g = fc(concat(aux))`` for real slots,
  ``g = fc(mask_hidden)`` for mask slots; ``x = concat(input_layernorm(embed(tok)),
  hidden_norm(g))`` feeds q/k/v (2H wide); residual ``g``; causal attention with
  RoPE; o_proj, residual add; post_attention_layernorm + SwiGLU MLP + residual;
  ``lm_head(norm(h))`` over the draft vocabulary;
* slot of target position t carries token t+1 and the target's aux hidden at t
  (``output_hidden_states`` entry i = residual entering layer i);
* embeddings frozen to the target's and not saved; ``lm_head`` initialised from the
  target's head rows of the draft vocabulary (``target_head``: SmolLM2's tied embedding),
  ``norm`` from the target's final norm; draft vocabulary = the most frequent target tokens of the training
  answers (``--vocab-answers FILE...``: of those files' answers instead),
  ``target_id = draft_id + d2t[draft_id]``. With ``--init`` the draft keeps its vocabulary;
  ``--grow-vocab N`` adds the next most frequent tokens (``grow_vocab``: their head rows
  start from the target's, through the map the kept rows follow) and ``--new-rows-only``
  trains their rows alone (``--head-only``: the head alone).

Training layout (P-EAGLE, all anchors of a sequence at once): the real slots
0..N-2 of a sequence, then for each depth d = 2..K and each sampled anchor t one
mask slot at position t+d-1 that sees the real slots <= t and the mask slots of
the same anchor with depth <= d -- exactly what the mask slot sees at inference
when t is the last accepted position. The depth-d output at anchor t is trained
with KL(p_target || q_draft), p_target = the target's distribution at position
t+d restricted (renormalised) to the draft vocabulary; loss only on answer
positions. Mask slots of depth >= 2 are sampled per anchor with probability
``--depth-keep`` (COD-style: fewer deep slots per step, more sequences per step).

The mask token is ``<empty_output>`` (id 16): a special token of SmolLM2's
StarCoder-heritage vocabulary that never occurs in chat or in the offline text, so
its frozen embedding marks mask slots unambiguously.

Data: the target's own greedy chat answers (tools/gen_chat_data.py), with the
features it recorded while generating (seven layers; any three of them can be
the aux layers), repeated ``--chat-weight`` times per epoch, plus optional
teacher-forced offline text from Python's pydoc topics (PSF licence), whose
features the target computes here. Features computed here (answers the generator's store
lacks, the text, the held-out answers) are kept in <cache>/peagle-data/train-feats-*
(``FeatureCache``, keyed by content), so the next run on the same answers reads them
(``--no-feature-cache``: neither read nor keep). Held-out estimate: teacher-forced on the
target's greedy answers to tools/data/heldout_prompts.jsonl (topics disjoint from
TRAIN); since P-EAGLE's depth-k draft does not depend on the draft's own earlier
tokens, per-anchor acceptance is exact: acc_k = P(draft depths 1..k all equal the
target's greedy tokens), tau = 1 + sum_k acc_k (DESIGN.md §6).
The receipt adds, under ``loop``, the runtime's fixed:k loop replayed on the same
table (each round one past the last accepted token: what a fixed:k run accepts on those
answers, below the all-anchor figure since rounds start more often just after a miss).
``--loop-weight W`` weighs the training outputs at the anchors that loop reaches (replayed
on the training answers with the draft being trained, at each epoch's start) W against 1.

Measured choices (800 chat answers, 162k answer tokens, 250 steps of 1024 real
slots, bf16, 40 held-out prompts x 128 tokens; held-out acceptance by depth, tau):
  aux [2, 15, 27] frozen head 0.291 / 0.018 / 0.001 / 0, tau 1.309
  aux [2, 15, 28]             0.281 / 0.019 / 0.001 / 0, tau 1.301
  aux [2, 15, 29]             0.288 / 0.021 / 0.001 / 0, tau 1.310
  aux [8, 20, 29]             0.281 / 0.023 / 0.001 / 0, tau 1.305
  aux [2, 15, 27] + --train-head 0.316 / 0.024 / 0.001 / 0, tau 1.340
so the aux layers barely matter at this scale (the speculators default stays) and
training the head helps. bf16 autocast made a step 1.8x faster than fp32 on the
AVX512_BF16 host these runs had; on a CPU without native bf16 PyTorch emulates it and a
step of the committed recipe took about 50 s against about 2.8 s in fp32 (AVX2-only
host, 2026-11-30), so ``--precision auto`` (the default) takes bf16 only where the CPU
has it (``native_bf16``) and records what it took in the receipt. The target's
distributions stay fp32. Longer training on all 2560 answers (512k tokens)
is what moved the committed draft (80 held-out prompts x 128 tokens, K = 4):
  2048 answers, 592 steps, frozen head (22 min)   0.362 / 0.031 / 0.002 / 0,     tau 1.395
  2560 answers, 2000 steps, --train-head (44 min) 0.472 / 0.108 / 0.017 / 0.003, tau 1.600
  that draft, --init, 4678 answers (900k), 2087 steps, --lr 5e-4 (60 min + 17 min of features, fp32, AVX2)
                                                  0.508 / 0.145 / 0.035 / 0.007, tau 1.694
  that draft, --init, all 7090 answers (1.36M), 1805 steps, --lr 5e-4 (50 min + 38 min of features)
                                                  0.524 / 0.173 / 0.056 / 0.016, tau 1.768
  that draft, --init, the same 7090 answers, 1864 steps, --lr 4e-4 (58 min + 38 min of features,
  which filled the feature cache)                 0.535 / 0.187 / 0.063 / 0.025, tau 1.811
  that draft, --init, all 8419 answers (1.62M), 2517 steps, --lr 4e-4 (76 min, every feature
  read from the store or the cache)               0.552 / 0.203 / 0.079 / 0.035, tau 1.869
  that draft, --init, 11,906 answers (2.32M, the second TRAIN batch's 3487 added), 1842 steps,
  --lr 4e-4 (56 min)                              0.560 / 0.217 / 0.090 / 0.040, tau 1.907
the seventh was stage 6 (the committed draft since session 58 is stage 10: results/draft_stage9;
the second's training accuracy at depth 1 reached
0.63 by epoch 5 against 0.47 held out: more epochs of the same data would mostly
memorise, so the third run adds 2118 answers it never saw, results/draft_warm, and the
fourth the 2412 left, results/draft_stage3; the fifth, 1.2 more epochs of those at a
lower rate, still gained 0.04 held out, results/draft_stage4; the sixth adds the 1329
answers of the last answerable TRAIN prompts and gained 0.06, results/draft_stage5; the
seventh adds 3487 answers to new prompts on the same topics and gained 0.04 in under an
epoch, results/draft_stage6).
On a GPU (``--device cuda``; tools/device_train_draft.sh on a lent H200, bf16 autocast,
``--slots 4096``, 0.10 s/step) three times the answers and 3.6x the slots did move it:
8444 answers, 2727 steps in 265 s reached tau 1.921 on the 49 held-out prompts whose
topics its data lacked, against the committed draft's 1.640 on the same 49
(results/device_draft; that run's data held 14 held-out prompts, so it is not committed).
On a GPU the features move there once computed (``Features.to``, unless
``--features-on-host`` or the GPU lacks room): each step gathers its rows on the device, and
the per-depth sums stay there until a log line reads them, so the host's part of a step is
building index arrays (1 ms a step of 4096 real slots on the 2-core EPYC of 2026-12-04,
against 15 ms gathering rows and segment masks on the host as before).

    python tools/gen_chat_data.py --limit 2560       # about an hour, resumable (see its docstring)
    python tools/train_peagle.py --train-head --max-steps 2000 --heldout-max-new 128 --out fixtures/peagle-smollm2
    python tools/train_peagle.py --init fixtures/peagle-smollm2 --train-head --lr 5e-4 ...   # go on from a draft
    python tools/train_peagle.py --small --out /tmp/peagle-small
    python tools/train_peagle.py --device cuda --train-head --slots 4096 --budget-minutes 6 ...   # a GPU
"""

from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_chat_data import FEATURE_LAYERS, FP16_MAX, exact_fp32, load_features, open_append, read_jsonl  # noqa: E402
from prompts import calibration_prompt_texts, heldout_prompts, train_prompts  # noqa: E402
from smollm2 import default_cache, ensure_smollm2, sha256_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Written by the speculators library itself (copied into the tests from the shared reference).
REFERENCE_IN_TESTS = ROOT / "tests" / "data" / "speculators-peagle-tiny"
REFERENCE = Path("/work/shared/reference/speculators-peagle-tiny")
HELDOUT = Path(__file__).resolve().parent / "data" / "heldout_prompts.jsonl"
MASK_TOKEN_ID = 16  # <empty_output>
EOS = 2


def native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 natively (x86 AVX512_BF16 or AMX-BF16, Arm BF16),
    from /proc/cpuinfo's flags; elsewhere PyTorch's bf16 matmuls are emulated."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    return bool(set(cpuinfo.split()) & {"avx512_bf16", "amx_bf16", "bf16"})


def _log(msg: str) -> None:
    print(f"[train] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


# --- the draft model -----------------------------------------------------------

def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * w, computed in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Default RoPE (rotate-half layout). pos: [S] -> cos, sin: [S, head_dim]."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=pos.device) / head_dim)
    f = pos.float()[..., None] * inv  # [S, hd/2]
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class DecoderLayer(nn.Module):
    """An ordinary decoder layer of the target's width (a draft's layers 1.. : DESIGN.md §1):
    pre-norm causal attention with RoPE and a SwiGLU MLP, each added to the residual."""

    def __init__(self, c: dict, attn_in: int | None = None):
        super().__init__()
        H, nh, nkv, hd, I = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                             c["head_dim"], c["intermediate_size"])
        eps, attn_in = c["rms_norm_eps"], attn_in or H
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(H, eps), RMSNorm(H, eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(attn_in, nh * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(attn_in, nkv * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(attn_in, nkv * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(H, I, bias=False)
        self.mlp.up_proj = nn.Linear(H, I, bias=False)
        self.mlp.down_proj = nn.Linear(I, H, bias=False)

    def attend_and_mlp(self, x, residual, cos, sin, segments):
        """Attention of ``x`` [S, in] (packed slots; segments: [(start, end, allowed)] with
        allowed [end-start, end-start] bool (query, key): attention never crosses a segment, so
        packed sequences cost no more attention than separate ones) added to ``residual``
        [S, H], then the MLP block. -> [S, H]."""
        S = x.shape[0]
        a = self.self_attn
        q = apply_rope(a.q_proj(x).view(S, self.nh, self.hd).transpose(0, 1), cos, sin)  # [nh, S, hd]
        k = apply_rope(a.k_proj(x).view(S, self.nkv, self.hd).transpose(0, 1), cos, sin)  # [nkv, S, hd]
        v = a.v_proj(x).view(S, self.nkv, self.hd).transpose(0, 1)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
        o = torch.cat([F.scaled_dot_product_attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], attn_mask=m)
                       for lo, hi, m in segments], 1)  # [nh, S, hd]
        h = residual + a.o_proj(o.transpose(0, 1).reshape(S, -1))
        m = self.mlp
        y = self.post_attention_layernorm(h)
        return h + m.down_proj(F.silu(m.gate_proj(y)) * m.up_proj(y))

    def forward(self, h, cos, sin, segments):
        """h: [S, H] -> [S, H]."""
        return self.attend_and_mlp(self.input_layernorm(h), h, cos, sin, segments)


class DraftLayer(DecoderLayer):
    """The first P-EAGLE layer: attention over concat(embeds, hidden), 2H wide."""

    def __init__(self, c: dict):
        super().__init__(c, attn_in=2 * c["hidden_size"])
        self.hidden_norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, emb, g, cos, sin, segments):
        """emb, g: [S, H] (packed slots); cos, sin: [S, hd]; segments as in
        DecoderLayer.attend_and_mlp. The residual is g. -> [S, H]."""
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(g)], -1)
        return self.attend_and_mlp(x, g, cos, sin, segments)


class PEagleDraft(nn.Module):
    """P-EAGLE draft with speculators tensor names (embed_tokens is external and frozen)."""

    def __init__(self, c: dict, draft_vocab: int, embed: torch.Tensor):
        super().__init__()
        H = c["hidden_size"]
        self.c = c
        self.register_buffer("embed", embed, persistent=False)  # [V_target, H], frozen
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.layers = nn.ModuleList([DraftLayer(c)] + [DecoderLayer(c) for _ in range(c["num_hidden_layers"] - 1)])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.lm_head = nn.Linear(H, draft_vocab, bias=False)
        self.mask_hidden = nn.Parameter(torch.zeros(1, 1, 3 * H))
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c["vocab_size"], dtype=torch.bool))

    def hidden(self, tokens, aux, is_mask, pos, segments):
        """Packed slots: tokens, pos, is_mask: [S]; aux: [S, 3H] (ignored where is_mask);
        segments as in DecoderLayer.attend_and_mlp. Returns norm(h): [S, H]; logits = lm_head of it."""
        g = torch.where(is_mask[:, None], self.fc(self.mask_hidden.view(1, -1)), self.fc(aux))
        cos, sin = rope_cos_sin(pos, self.c["head_dim"], self.c["rope_parameters"]["rope_theta"])
        h = self.layers[0](F.embedding(tokens, self.embed), g, cos, sin, segments)
        for layer in self.layers[1:]:
            h = layer(h, cos, sin, segments)
        return self.norm(h)

    def forward(self, tokens, aux, is_mask, pos, segments):
        return self.lm_head(self.hidden(tokens, aux, is_mask, pos, segments))

    @property
    def target_ids(self) -> torch.Tensor:
        """Each draft id's target id, draft_id + d2t[draft_id] (sorted: the draft vocabulary)."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def state_for_save(self, dtype) -> dict[str, torch.Tensor]:
        sd = {k: (v.detach().cpu().to(dtype) if v.is_floating_point() else v.detach().cpu()).contiguous()
              for k, v in self.state_dict().items()}
        return sd  # embed is a non-persistent buffer: embed_tokens.weight is omitted


def check_reference(ref_dir: Path | None = None, atol: float = 1e-4) -> float:
    """Run the speculators one-pass reference through PEagleDraft; returns max |dlogits|."""
    from safetensors.torch import load_file
    ref_dir = ref_dir or (REFERENCE_IN_TESTS if REFERENCE_IN_TESTS.is_dir() else REFERENCE)
    cfg = json.loads((ref_dir / "draft" / "config.json").read_text())
    w = load_file(ref_dir / "draft" / "model.safetensors")
    ref = load_file(ref_dir / "peagle_one_pass_reference.safetensors")
    c = cfg["transformer_layer_config"]
    m = PEagleDraft(c, cfg["draft_vocab_size"], w.pop("embed_tokens.weight"))
    missing, unexpected = m.load_state_dict(w, strict=False)
    if unexpected or set(missing) - {"d2t", "t2d"}:
        raise RuntimeError(f"reference draft tensors disagree: missing={missing} unexpected={unexpected}")
    ids, pos = ref["input_ids"][0], ref["position_ids"][0]  # batch 1
    S = len(ids)
    is_mask = ids == cfg["mask_token_id"]
    real = ref["aux_hidden_states"][0]
    aux = torch.cat([real, torch.zeros(S - len(real), real.shape[-1])])  # mask slots use mask_hidden
    causal = torch.ones(S, S, dtype=torch.bool).tril()
    with torch.no_grad():
        logits = m(ids, aux, is_mask, pos, [(0, S, causal)])
    err = (logits - ref["logits"][0]).abs().max().item()
    if err > atol:
        raise RuntimeError(f"draft forward disagrees with the speculators reference: max |dlogits| {err:.3g}")
    return err


def saved_draft_config(folder: Path, label: str) -> dict:
    """config.json of a P-EAGLE draft folder this script saved; SystemExit naming ``label``
    where a file is missing or the draft is not a P-EAGLE one."""
    for f in ("config.json", "model.safetensors"):
        if not (folder / f).is_file():
            raise SystemExit(f"{label}: {f} missing (expected a draft folder tools/train_peagle.py saved)")
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("speculators_model_type") != "peagle":
        raise SystemExit(f"{label}/config.json: speculators_model_type "
                         f"{cfg.get('speculators_model_type')!r}, expected 'peagle'")
    return cfg


def load_draft(folder: Path, embed: torch.Tensor) -> PEagleDraft:
    """A speculators P-EAGLE folder written by this script, in fp32, with the verifier's embeddings."""
    from safetensors.torch import load_file
    cfg = json.loads((folder / "config.json").read_text())
    m = PEagleDraft(cfg["transformer_layer_config"], cfg["draft_vocab_size"], embed)
    w = {k: v.float() if v.is_floating_point() else v for k, v in load_file(folder / "model.safetensors").items()}
    missing, unexpected = m.load_state_dict(w, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{folder / 'model.safetensors'}: missing {missing}, unexpected {unexpected}")
    return m.eval()


# --- data ------------------------------------------------------------------------

@dataclass
class Seq:
    ids: list[int]
    prompt_len: int  # supervised outputs predict positions >= prompt_len (anchors >= prompt_len - 1)
    source: str  # "chat" | "text" | "heldout"
    kind: str = ""
    idx: int = -1  # TRAIN prompt index (chat): the key of its recorded features
    sampled: bool = False  # a sampled answer (gen_chat_data --temperature), not the greedy one


def load_chat(path: Path, max_tokens: int | None, keyed: bool = True) -> list[Seq]:
    """Chat answers in file order, up to ``max_tokens`` answer tokens. Each greedy answer keeps
    its prompt index as its key into the recorded features beside ``path`` (``keyed``; a
    sampled answer, with a ``"sampling"`` field, never: that store holds greedy answers, keyed
    by prompt index alone, and one of the same length would pass for it). Left out: answers to a
    DSpark calibration prompt (tools/data/calibration_prompts.jsonl), which only a data file
    made before gen_chat_data skipped them could hold, so calibration keeps measuring the
    draft on text it never saw; and answers to any prompt that is not a frozen TRAIN prompt
    (tools/data/train_prompts.jsonl.gz) or is a held-out one, which a generator whose
    prompt list was built on another Python wrote (prompts.py says why)."""
    reserved = calibration_prompt_texts()
    train = {d["prompt"] for d in train_prompts()} - {d["prompt"] for d in heldout_prompts()}
    out, n, dropped, foreign = [], 0, 0, 0
    for d in read_jsonl(path):
        if d.get("prompt") in reserved:
            dropped += 1
            continue
        if d.get("prompt") not in train:
            foreign += 1
            continue
        key = d["idx"] if keyed and not d.get("sampling") else -1
        out.append(Seq(d["prompt_ids"] + d["answer_ids"], len(d["prompt_ids"]), "chat", d["kind"], key,
                       bool(d.get("sampling"))))
        n += len(d["answer_ids"])
        if max_tokens is not None and n >= max_tokens:
            break
    if dropped:
        _log(f"{path}: left out {dropped} answers to calibration prompts")
    if foreign:
        _log(f"{path}: left out {foreign} answers to prompts outside the frozen TRAIN list")
    return out


def load_answers(path: Path, keyed: bool = True) -> list[Seq]:
    """``load_chat`` of a .jsonl or .jsonl.gz file (load_chat reads plain text only), whole."""
    if path.suffix != ".gz":
        return load_chat(path, None, keyed)
    with tempfile.TemporaryDirectory() as d:
        plain = Path(d) / path.stem
        with gzip.open(path, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return load_chat(plain, None, keyed)


def require_answer_files(option: str, paths: list[Path]) -> None:
    """SystemExit naming ``option`` and the first of ``paths`` that is not a file."""
    for path in paths:
        if not path.is_file():
            raise SystemExit(f"{option} {path}: no such file (expected a generator's chat.jsonl)")


def load_chats(paths: list[Path], max_tokens: int | None) -> tuple[list[Seq], list[dict]]:
    """The answers of several files (``--chat A B``: greedy answers, then sampled ones), in
    order, up to ``max_tokens`` answer tokens in all; only the first file's answers are keyed
    into the recorded features beside it (``load_chat``). An answer whose prompt and tokens
    an earlier one has (a sampled answer that came out as the greedy one) is left out, so
    no sequence is trained twice as often as the rest. -> (answers, per file {"path",
    "answers", "sampled", "duplicates"} for the receipt)."""
    require_answer_files("--chat", paths[1:])  # (a missing first file is "no training data" where --text-tokens is 0)
    out, seen, files, n = [], set(), [], 0
    for i, path in enumerate(paths):
        left = None if max_tokens is None else max_tokens - n
        if left is not None and left <= 0:
            break
        rows = load_chat(path, left, keyed=i == 0)
        kept = []
        for q in rows:
            key = (q.prompt_len, tuple(q.ids))
            if key not in seen:
                seen.add(key)
                kept.append(q)
        if len(kept) < len(rows):
            _log(f"{path}: left out {len(rows) - len(kept)} answers an earlier one equals")
        out += kept
        n += sum(len(q.ids) - q.prompt_len for q in kept)
        files.append({"path": str(path), "answers": len(kept), "sampled": sum(q.sampled for q in kept),
                      "duplicates": len(rows) - len(kept)})
    return out, files


def offline_text(tok, max_tokens: int, chunk: int = 384) -> list[Seq]:
    """Python's pydoc topics (PSF licence) as plain text chunks, teacher-forced."""
    from pydoc_data.topics import topics
    out, n = [], 0
    for key in sorted(topics):
        ids = tok(topics[key], add_special_tokens=False)["input_ids"]
        for i in range(0, len(ids) - 32, chunk):
            part = ids[i:i + chunk]
            out.append(Seq(part, 1, "text", "text"))
            n += len(part)
            if n >= max_tokens:
                return out
    return out


def select_draft_vocab(seqs: list[Seq], vocab: int, size: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The ``size`` most frequent target tokens among the predicted positions; sorted ids.
    ``keep``: ids taken first whatever their counts (a draft's vocabulary that grows)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for s in seqs:
        np.add.at(counts, np.asarray(s.ids[s.prompt_len:]), 1)
    counts[EOS] += 1 << 40  # EOS must be draftable
    if keep is not None:
        counts[keep.numpy()] += 1 << 41
    # Ties (mostly zero counts) broken by token id for determinism.
    order = np.lexsort((np.arange(vocab), -counts))[:size]
    return torch.from_numpy(np.sort(order)).long()


@dataclass
class Features:
    """The target's features of positions 0..N-2 of each sequence (position N-1 feeds no
    slot), concatenated: sequence j owns rows offsets[j] .. offsets[j+1]-1. The arrays are
    numpy (host memory) or, after ``to(device)``, torch tensors on that device, where each
    step gathers its rows (``rows``)."""
    aux: np.ndarray  # [R, 3H] fp16  concat(hidden_states[i] for i in the aux ids)
    final: np.ndarray  # [R, H] fp16  hidden_states[-1] (after the final norm)
    argmax: np.ndarray  # [R] int32, the target's greedy next token (positions >= prompt_len - 1)
    offsets: np.ndarray  # [nseq + 1]

    def head(self, n: int) -> "Features":
        """The first ``n`` sequences' features (views, no copy)."""
        r = int(self.offsets[n])
        return Features(self.aux[:r], self.final[:r], self.argmax[:r], self.offsets[:n + 1])

    def to(self, device: torch.device) -> "Features":
        """The same features as torch tensors on ``device`` (on a GPU each step then gathers its
        rows there: no gather on the host, no copy of them per step; the offsets stay numpy)."""
        def t(a):
            return None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(device)
        return Features(t(self.aux), t(self.final), t(self.argmax), self.offsets)

    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.aux, self.final, self.argmax) if a is not None)

    def rows(self, name: str, idx: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` (CPU indices) of the array ``name`` as a torch tensor on the features'
        device, in their stored dtype."""
        a = getattr(self, name)
        if isinstance(a, torch.Tensor):
            idx = torch.as_tensor(idx)
            return a[idx.to(a.device, non_blocking=True)]
        return torch.from_numpy(a[np.asarray(idx)])


class FeatureCache:
    """The features this script computed, kept for its next run: a warm start on the same
    answers otherwise recomputes every answer the generator's store lacks (2026-11-30: 4531
    answers, 1.07M tokens, 35 minutes at ~505 tokens/s on 2 cores). One folder per target
    (its sha256) and aux layers; keyed by the sequence's content (prompt length and token
    ids), so no other answer's rows can be read for it. Append-only:

        meta.json     {"target_sha256", "aux_layer_ids", "hidden"}
        index.jsonl   {"key", "row", "n"}, written after the rows it names
        aux.f16       [rows, 3H]   final.f16 [rows, H]   argmax.i32 [rows]

    A run killed while appending leaves rows no index line names, which are ignored."""

    def __init__(self, root: Path, target_sha256: str, aux_ids, hidden: int):
        self.aux_ids, self.H = [int(i) for i in aux_ids], int(hidden)
        self.dir = root / f"train-feats-{target_sha256[:12]}-{'-'.join(map(str, self.aux_ids))}"
        self.meta = {"target_sha256": target_sha256, "aux_layer_ids": self.aux_ids, "hidden": self.H}
        self.paths = {k: self.dir / f for k, f in (("aux", "aux.f16"), ("final", "final.f16"), ("argmax", "argmax.i32"))}
        self.index = self.dir / "index.jsonl"
        self.width = {"aux": len(self.aux_ids) * self.H * 2, "final": self.H * 2, "argmax": 4}  # bytes a row

    @staticmethod
    def key(s: Seq) -> str:
        return hashlib.sha1(np.asarray([s.prompt_len, *s.ids], dtype=np.int64).tobytes()).hexdigest()

    def _rows(self) -> int:
        """Rows every array file holds in full."""
        return min(p.stat().st_size // self.width[k] if p.is_file() else 0 for k, p in self.paths.items())

    def _open(self):
        """(key -> entry, aux, final, argmax memmaps) of the rows every file holds; empty if none."""
        if not self.index.is_file():
            return {}, None, None, None
        meta = json.loads((self.dir / "meta.json").read_text())
        if meta != self.meta:
            raise SystemExit(f"{self.dir}/meta.json: {meta}, expected {self.meta}")
        rows = self._rows()
        entries = {}
        for line in self.index.read_text().splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a killed append
                continue
            if d["row"] + d["n"] <= rows:
                entries[d["key"]] = d
        if not rows:
            return entries, None, None, None
        return (entries, np.memmap(self.paths["aux"], np.float16, "r", shape=(rows, len(self.aux_ids) * self.H)),
                np.memmap(self.paths["final"], np.float16, "r", shape=(rows, self.H)),
                np.memmap(self.paths["argmax"], np.int32, "r", shape=(rows,)))

    def read(self, seqs: list[Seq], which: list[int], feats: Features) -> list[int]:
        """Fill ``feats`` rows of the sequences in ``which`` the cache holds; the others are returned."""
        entries, aux, fin, top = self._open()
        rest = []
        for j in which:
            e = entries.get(self.key(seqs[j]))
            if e is None or e["n"] != len(seqs[j].ids) - 1:
                rest.append(j)
                continue
            lo, hi, r = feats.offsets[j], feats.offsets[j + 1], e["row"]
            feats.aux[lo:hi], feats.final[lo:hi], feats.argmax[lo:hi] = aux[r:r + e["n"]], fin[r:r + e["n"]], top[r:r + e["n"]]
        return rest

    def write(self, seqs: list[Seq], which: list[int], feats: Features) -> None:
        """Append the rows of the sequences in ``which``: rows first, then their index lines."""
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "meta.json"
        if not meta.is_file():
            tmp = meta.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.meta))
            os.replace(tmp, meta)
        entries = self._open()[0]  # also checks meta
        base = self._rows()
        lines, row = [], base
        files = {k: open(p, "r+b" if p.is_file() else "wb") for k, p in self.paths.items()}
        try:
            for k, f in files.items():  # drop a killed append's partial rows
                f.truncate(base * self.width[k])
                f.seek(0, 2)
            for j in which:
                key = self.key(seqs[j])
                if key in entries:
                    continue
                lo, hi = feats.offsets[j], feats.offsets[j + 1]
                files["aux"].write(np.ascontiguousarray(feats.aux[lo:hi]).tobytes())
                files["final"].write(np.ascontiguousarray(feats.final[lo:hi]).tobytes())
                files["argmax"].write(np.ascontiguousarray(feats.argmax[lo:hi], dtype=np.int32).tobytes())
                lines.append(json.dumps({"key": key, "row": row, "n": int(hi - lo)}))
                entries[key] = {}
                row += int(hi - lo)
            for f in files.values():
                f.flush()
                os.fsync(f.fileno())
        finally:
            for f in files.values():
                f.close()
        if lines:
            with open_append(self.index) as f:  # after a line a killed append cut short
                f.write("\n".join(lines) + "\n")


def build_features(target, seqs: list[Seq], aux_ids, store_dir: Path | None, tokens_per_batch: int | None = None,
                   cache: FeatureCache | None = None, keep_every_s: float = 300.0) -> Features:
    """Features from the store that tools/gen_chat_data.py recorded while generating, else
    from one pass of the target (fp32, right-padded batches: attention is causal, so padding
    never reaches real positions). Computed features go to ``cache`` as they come, every
    ``keep_every_s`` seconds and at the end, so a run killed in this step keeps its progress."""
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s.ids) - 1 for s in seqs])
    R, H = int(offsets[-1]), target.config.hidden_size
    aux = np.zeros((R, len(aux_ids) * H), dtype=np.float16)
    final = np.zeros((R, H), dtype=np.float16)
    argmax = np.zeros(R, dtype=np.int32)
    entries, s_aux, s_fin = load_features(store_dir) if store_dir and (store_dir / "chat-feats.jsonl").is_file() \
        else ({}, None, None)
    if any(i not in FEATURE_LAYERS for i in aux_ids):
        entries = {}  # the store lacks a requested layer: recompute everything
    cols = np.concatenate([np.arange(FEATURE_LAYERS.index(i) * H, (FEATURE_LAYERS.index(i) + 1) * H)
                           for i in aux_ids]) if entries else None
    rest, stored = [], []
    for j, s in enumerate(seqs):
        e = entries.get(s.idx) if s.source == "chat" else None
        if e is None or e["n"] != len(s.ids) - 1:
            rest.append(j)
        else:
            stored.append(j)
    if stored:  # a store is keyed by prompt index only: check that its rows are these tokens'
        wrong = set(stale_features(target, [seqs[j] for j in stored], [entries[seqs[j].idx] for j in stored], s_fin))
        if wrong:
            _log(f"{store_dir}: the recorded features of {len(wrong)} of {len(stored)} answers belong to other "
                 f"tokens (the target's greedy token there differs); computing theirs")
            rest = sorted(rest + [stored[i] for i in wrong])
            stored = [j for i, j in enumerate(stored) if i not in wrong]
    for j in stored:
        s, e = seqs[j], entries[seqs[j].idx]
        lo, hi = offsets[j], offsets[j + 1]
        aux[lo:hi] = s_aux[e["row"]:e["row"] + e["n"]][:, cols]
        final[lo:hi] = s_fin[e["row"]:e["row"] + e["n"]]
        # recorded answers are the target's greedy tokens: argmax at p is token p+1
        argmax[lo:hi] = s.ids[1:]
    if len(seqs) > len(rest):
        _log(f"features of {len(seqs) - len(rest)} sequences read from {store_dir}")
    feats = Features(aux, final, argmax, offsets)
    if rest and cache is not None:
        n = len(rest)
        rest = cache.read(seqs, rest, feats)
        if n > len(rest):
            _log(f"features of {n - len(rest)} sequences read from {cache.dir}")
    if rest:
        _log(f"computing features of {len(rest)} sequences ({sum(len(seqs[j].ids) for j in rest)} tokens)")
        tpb = tokens_per_batch or (2048 if target.device.type == "cpu" else 32768)
        keep = None if cache is None else (lambda done: cache.write(seqs, done, feats))
        _extract(target, seqs, rest, aux_ids, offsets, aux, final, argmax, tpb, keep, keep_every_s)
        if cache is not None:
            _log(f"features of {len(rest)} sequences kept in {cache.dir}")
    return feats


def target_head(target):
    """The target's output head [V, H]: its embedding where the two are tied (SmolLM2), else its
    lm_head. p_target comes from these rows, and a new draft's head starts from them."""
    return target.model.embed_tokens.weight if target.config.tie_word_embeddings else target.lm_head.weight


def stale_features(target, seqs: list[Seq], entries: list[dict], s_fin: np.ndarray, rows: int = 8192) -> list[int]:
    """Indices i whose recorded final hidden rows are not ``seqs[i]``'s: the store's answers are
    the target's greedy tokens, so at an answer position p the head's argmax of the recorded
    row must be token p+1. Checked at two positions per answer (its last and its middle); one
    disagreement marks it (a near-tie between the recording engine and this one costs only
    a recomputation)."""
    W = target_head(target).detach()
    picks = []  # (i, store row, expected token)
    for i, (s, e) in enumerate(zip(seqs, entries)):
        lo, last = max(s.prompt_len - 1, 0), len(s.ids) - 2
        for p in sorted({last, (lo + last) // 2}):
            if p >= lo:
                picks.append((i, e["row"] + p, s.ids[p + 1]))
    bad = set()
    with torch.inference_mode():
        for k in range(0, len(picks), rows):
            part = picks[k:k + rows]
            x = torch.from_numpy(np.asarray(s_fin[[r for _, r, _ in part]], dtype=np.float32)).to(W.device)
            top = (x @ W.float().T).argmax(-1).cpu().tolist()
            bad.update(i for (i, _, tok), t in zip(part, top) if t != tok)
    return sorted(bad)


def _extract(target, seqs, which, aux_ids, offsets, aux, final, argmax, tokens_per_batch, keep=None,
             keep_every_s: float = 300.0):
    """Fill the rows of the sequences ``which``; ``keep(done)``, when given, receives the
    sequences finished since its last call, every ``keep_every_s`` seconds and at the end."""
    order = sorted(which, key=lambda j: len(seqs[j].ids))
    kept, last_keep = 0, time.time()
    W = target_head(target)
    t0, done, i, last = time.time(), 0, 0, time.time()
    with torch.inference_mode():
        while i < len(order):
            group = order[i:i + max(1, tokens_per_batch // len(seqs[order[i]].ids))]
            L = max(len(seqs[j].ids) for j in group)
            x = torch.full((len(group), L), EOS, dtype=torch.long)
            for r, j in enumerate(group):
                x[r, : len(seqs[j].ids)] = torch.tensor(seqs[j].ids)
            hs = target.model(input_ids=x.to(target.device), output_hidden_states=True).hidden_states
            a = torch.cat([hs[k] for k in aux_ids], -1).clamp(-FP16_MAX, FP16_MAX).half().cpu()
            fin = hs[-1]
            # the greedy token is only read at supervised positions (>= prompt_len - 1)
            top = [(fin[r, max(seqs[j].prompt_len - 1, 0):len(seqs[j].ids) - 1] @ W.T).argmax(-1).cpu()
                   for r, j in enumerate(group)]
            fin = fin.half().cpu()
            for r, j in enumerate(group):
                lo, n, p0 = offsets[j], len(seqs[j].ids) - 1, max(seqs[j].prompt_len - 1, 0)
                aux[lo:lo + n] = a[r, :n].numpy()
                final[lo:lo + n] = fin[r, :n].numpy()
                argmax[lo + p0:lo + n] = top[r].numpy()
                done += n + 1
            i += len(group)
            if keep is not None and (i == len(order) or time.time() - last_keep >= keep_every_s):
                keep(order[kept:i])
                kept, last_keep = i, time.time()
            if i == len(order) or time.time() - last > 60:
                last = time.time()
                _log(f"features {done} tokens, {done / (time.time() - t0):.0f} tok/s")


# --- P-EAGLE training layout -------------------------------------------------------

@dataclass
class Batch:
    tokens: torch.Tensor  # [S] packed slots of several sequences
    aux: torch.Tensor  # [S, 3H] float32 (fp16 from build_batch(aux_fp16=True) until .to())
    is_mask: torch.Tensor  # [S]
    pos: torch.Tensor  # [S]
    slot_anchor: torch.Tensor  # [S] the anchor t of each slot (a real slot's own position)
    slot_depth: torch.Tensor  # [S] 1 for real slots, d for a mask slot of depth d
    bounds: list  # [(start, end)] one per sequence
    loss_slot: torch.Tensor  # [M] slot index of each supervised output
    loss_depth: torch.Tensor  # [M] 1..K
    depth_index: list  # per depth 1..K: [M_d] the indices of its outputs among the M, ascending
    target_row: torch.Tensor  # [M] global feature row of the target position t+d (on the CPU)
    anchor_row: torch.Tensor  # [M] global feature row of the anchor t (on the CPU)

    @cached_property
    def segments(self) -> list:
        """[(start, end, allowed [n, n] bool)] one per sequence, built on the batch's device:
        a real key is visible up to the query's anchor; a mask key only to the same anchor's
        slots of equal or greater depth."""
        out = []
        for lo, hi in self.bounds:
            a, d, m = self.slot_anchor[lo:hi], self.slot_depth[lo:hi], self.is_mask[lo:hi]
            real_key = (~m)[None, :] & (a[None, :] <= a[:, None])
            mask_key = m[None, :] & (a[None, :] == a[:, None]) & (d[None, :] <= d[:, None])
            out.append((lo, hi, real_key | mask_key))
        return out

    def to(self, device: torch.device) -> "Batch":
        """The tensors the draft reads, on ``device``, aux in float32 (the feature-row indices
        stay on the CPU; the segment masks are built there, from the slots' anchors and depths,
        when first read)."""
        if self.aux.device == device and self.aux.dtype == torch.float32 and self.tokens.device == device:
            return self
        mv = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return Batch(mv(self.tokens), mv(self.aux).float(), mv(self.is_mask), mv(self.pos), mv(self.slot_anchor),
                     mv(self.slot_depth), self.bounds, mv(self.loss_slot), mv(self.loss_depth),
                     [mv(i) for i in self.depth_index], self.target_row, self.anchor_row)


def build_batch(seqs_idx: list[int], seqs: list[Seq], feats: Features, K: int, keep: list[float],
                rng: np.random.Generator, aux_fp16: bool = False) -> Batch:
    """Pack sequences into one run of real + mask slots, one attention segment each.

    Per sequence: its N-1 real slots (slot t: token t+1, the aux features of position t),
    then its mask slots depth by depth (depth d, anchor t: position t+d-1, ``keep[d-1]`` of
    the anchors drawn from ``rng``, one draw per sequence and depth in that order); the
    supervised outputs in the same order (depth 1 at the real slots). Built with numpy per
    sequence, the same batch and draws as the plain loops it replaced (a step of 4096 real
    slots took a median 58 ms in those on the 2-core Xeon of 2026-12-04, 41 ms so and 17 ms
    with ``aux_fp16``, one thread; the GPU trainer builds each step's batch on the CPU).
    ``aux_fp16``: keep the gathered aux features fp16 (``Batch.to`` widens them on the
    device: half the copy, no CPU conversion). With ``feats`` on a device (``Features.to``)
    the aux rows are gathered there; the index arrays are always built on the CPU."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("tok", "aux", "mask", "pos", "anc", "dep",
                                                           "ls", "ld", "lt", "la")}
    base, bounds = 0, []
    for j in seqs_idx:
        s, off = seqs[j], int(feats.offsets[j])
        N = len(s.ids)
        first = max(s.prompt_len - 1, 0)  # first anchor with a supervised output
        T = N - 1  # real slots t = 0..N-2: token t+1, aux of t
        real = np.arange(T, dtype=np.int64)
        anchors = [real[first:max(N - 2, first)]]  # depth 1 at anchor t predicts t+1 (<= N-2)
        for d in range(2, K + 1):
            a = np.arange(first, N - 1 - d, dtype=np.int64)  # t + d <= N - 2
            if keep[d - 1] < 1.0:
                a = a[rng.random(len(a)) < keep[d - 1]]
            anchors.append(a)
        deep = np.concatenate([*anchors[1:], real[:0]])  # (real[:0]: K = 1 has no depth past 1)
        deep_d = np.concatenate([*(np.full(len(a), d, np.int64) for d, a in enumerate(anchors[1:], 2)), real[:0]])
        n_slots = T + len(deep)
        parts["tok"] += [np.asarray(s.ids[1:], np.int64), np.full(len(deep), MASK_TOKEN_ID, np.int64)]
        parts["aux"] += [off + real, np.full(len(deep), off, np.int64)]
        parts["mask"] += [np.zeros(T, bool), np.ones(len(deep), bool)]
        parts["pos"] += [real, deep + deep_d - 1]
        parts["anc"] += [real, deep]
        parts["dep"] += [np.ones(T, np.int64), deep_d]
        out_t = np.concatenate([anchors[0], deep])
        out_d = np.concatenate([np.ones(len(anchors[0]), np.int64), deep_d])
        parts["ls"] += [base + anchors[0], base + T + np.arange(len(deep), dtype=np.int64)]
        parts["ld"].append(out_d)
        parts["lt"].append(off + out_t + out_d)
        parts["la"].append(off + out_t)
        bounds.append((base, base + n_slots))
        base += n_slots
    cat = {k: torch.from_numpy(np.concatenate(v)) for k, v in parts.items()}
    ld = cat["ld"].numpy()
    depth_index = [torch.from_numpy(np.flatnonzero(ld == d)) for d in range(1, K + 1)]
    aux = feats.rows("aux", cat["aux"])  # gathered in fp16
    return Batch(cat["tok"], aux if aux_fp16 else aux.float(), cat["mask"], cat["pos"], cat["anc"], cat["dep"],
                 bounds, cat["ls"], cat["ld"], depth_index, cat["lt"], cat["la"])


def draft_outputs(model: PEagleDraft, b: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities over the draft vocabulary at the supervised slots [M, Vd], and the
    greedy draft tokens as TARGET ids [M] (target_id = draft_id + d2t[draft_id])."""
    h = model.hidden(b.tokens, b.aux, b.is_mask, b.pos, b.segments)[b.loss_slot]  # [M, H]
    logq = F.log_softmax(model.lm_head(h).float(), -1)
    top = logq.argmax(-1)
    return logq, top + model.d2t[top]


def greedy_targets(b: Batch, feats: Features) -> torch.Tensor:
    """The target's greedy token at each supervised output's position t+d: [M], on the batch's device."""
    return feats.rows("argmax", b.target_row).to(b.tokens.device, non_blocking=True).long()


def depth_losses(model: PEagleDraft, b: Batch, feats: Features, head_w: torch.Tensor, K: int):
    """Per depth: (sum of KL(p_target || q_draft), correct greedy drafts, count): the two sums
    tensors on the batch's device (read them when needed: each read waits for the device),
    the count an int.

    p_target = softmax of the target's logits at t+d over the draft vocabulary, from its
    final normed hidden state and its head rows ``head_w`` [Vd, H]."""
    return depth_sums(*output_losses(model, b, feats, head_w), b, K)


def depth_sums(kl: torch.Tensor, correct: torch.Tensor, b: Batch, K: int) -> list:
    """``output_losses``' per-output [M] tensors summed per depth: [(kl sum, correct sum, count)]."""
    # each depth's outputs by index (known on the CPU): no wait for the device here
    return [(kl[i].sum(), correct[i].sum(), len(i)) for i in b.depth_index[:K]]


def training_loss(kl: torch.Tensor, b: Batch, K: int, weight: torch.Tensor | None = None,
                  depth_weights: list[float] | None = None) -> torch.Tensor:
    """Each depth's KL averaged over its own outputs (sampling out deep slots does not shrink
    that depth's weight), depths weighted equally; with ``weight`` [M] (``--loop-weight``) each
    depth's average is weighted by it; with ``depth_weights`` (``--depth-weights``) the depths'
    averages are weighted by them (the loss divided by their sum)."""
    if weight is None:
        means = [(d, kl[i].sum() / len(i)) for d, i in enumerate(b.depth_index[:K]) if len(i)]
    else:
        means = [(d, (kl[i] * weight[i]).sum() / weight[i].sum()) for d, i in enumerate(b.depth_index[:K]) if len(i)]
    if depth_weights is None:
        return sum(m for _, m in means) / K
    return sum(depth_weights[d] * m for d, m in means) / sum(depth_weights[:K])


def output_losses(model: PEagleDraft, b: Batch, feats: Features, head_w: torch.Tensor):
    """Per supervised output [M]: KL(p_target || q_draft) and whether the greedy draft is the
    target's greedy token (1.0 / 0.0), on the batch's device."""
    logq, draft_tok = draft_outputs(model, b)
    # A position is the target of up to K outputs (depth d of anchor p-d): compute each
    # position's distribution once, in fp32 even under bf16 autocast.
    rows, inv = torch.unique(b.target_row, return_inverse=True)
    with torch.no_grad(), torch.autocast(head_w.device.type, enabled=False):
        fin = feats.rows("final", rows).to(head_w.device, non_blocking=True).float()
        logp = F.log_softmax(fin @ head_w.T, -1)[inv.to(head_w.device, non_blocking=True)]  # [M, Vd]
    kl = (logp.exp() * (logp - logq)).sum(-1)  # [M]
    return kl, (draft_tok == greedy_targets(b, feats)).float()


# --- training ---------------------------------------------------------------------------

MAX_GRAD_NORM = 1.0


def train_step(v: "Variant", loss: torch.Tensor) -> torch.Tensor:
    """One optimizer step of ``v`` on ``loss``, its gradients clipped to a norm of
    MAX_GRAD_NORM; the norm before clipping, on the device (reading it would wait for the step)."""
    v.opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(v.params, MAX_GRAD_NORM)
    v.opt.step()
    return norm


@dataclass
class Variant:
    """One draft of a run: its layer count and peak learning rate (``lr_text`` as given), where
    it is saved, and once built its model, trainable parameters, optimizer and step sums."""
    layers: int
    lr: float
    lr_text: str
    out: Path
    model: PEagleDraft | None = None
    params: list | None = None
    opt: torch.optim.Optimizer | None = None
    sums: "StepSums | None" = None

    visited: np.ndarray | None = None  # --loop-weight: the anchors its loop reaches (loop_visits)

    @property
    def name(self) -> str:
        return f"lr{self.lr_text}-L{self.layers}"

    def n_params(self) -> int:
        return sum(p.numel() for p in self.params)


def parse_variants(layers: str | None, lrs: str, init_layers: int | None, init: Path | None,
                   out: Path) -> list[Variant]:
    """--layers x --lr: one draft per combination, saved to ``out`` when there is one, else
    to <out>-lr<LR>-L<N>. Layers are appended to an init's, never dropped."""
    def bad(opt, value, want):
        raise SystemExit(f"{opt} {value}: expected {want}")
    counts = []
    for x in (layers.split(",") if layers is not None else [str(init_layers or 1)]):
        if not x.strip().isdigit() or int(x) < 1:
            bad("--layers", layers, "layer counts of at least 1, comma-separated (1 or 1,2)")
        n = int(x)
        if init_layers is not None and n < init_layers:
            bad("--layers", n, f"at least --init's {init_layers} ({init}/config.json; layers are appended, "
                               f"never dropped)")
        counts.append(n)
    rates = []
    for x in lrs.split(","):
        try:
            r = float(x)
        except ValueError:
            r = float("nan")
        if not (math.isfinite(r) and r > 0):
            bad("--lr", lrs, "positive learning rates, comma-separated (1e-3 or 6e-4,1.2e-3)")
        rates.append((x.strip(), r))
    if len(set(counts)) < len(counts):
        bad("--layers", layers, "each count once (each combination with --lr is one draft)")
    if len({r for _, r in rates}) < len(rates):
        bad("--lr", lrs, "each rate once (each combination with --layers is one draft)")
    several = len(counts) * len(rates) > 1
    return [Variant(n, r, t, Path(f"{out}-lr{t}-L{n}") if several else out) for t, r in rates for n in counts]


class StepSums:
    """Per-depth sums of (KL, correct drafts, outputs) over training steps: the first two add
    up on the device the losses are on (reading them waits for it) and reach a [K, 3] numpy
    window only at ``flush``."""

    def __init__(self, K: int, device: torch.device):
        self.pending = torch.zeros(K, 2, dtype=torch.float64, device=device)
        self.counts = np.zeros(K)

    def add(self, per_depth) -> None:
        """``per_depth``: depth_losses' [(kl sum, correct sum, count)] of one step."""
        self.pending += torch.stack([torch.stack((kl.detach().float(), cor)) for kl, cor, _ in per_depth])
        self.counts += [c for _, _, c in per_depth]

    def flush(self, into: np.ndarray) -> None:
        into[:, :2] += self.pending.cpu().numpy()
        into[:, 2] += self.counts
        self.pending.zero_()
        self.counts[:] = 0

def make_batches(seqs: list[Seq], weights: dict[str, int], slots: int, rng: random.Random) -> list[list[int]]:
    """One epoch: each sequence repeated per its source weight, shuffled, packed to ~slots real slots."""
    idx = [j for j, s in enumerate(seqs) for _ in range(weights.get(s.source, 1))]
    rng.shuffle(idx)
    batches, cur, n = [], [], 0
    for j in idx:
        L = len(seqs[j].ids)
        if cur and n + L > slots:
            batches.append(cur)
            cur, n = [], 0
        cur.append(j)
        n += L
    if cur:
        batches.append(cur)
    return batches


def draft_layer_config(tc: dict, layers: int = 1) -> dict:
    keys = ("attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
            "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "mlp_bias",
            "model_type", "num_attention_heads", "num_key_value_heads", "pad_token_id", "pretraining_tp",
            "rms_norm_eps", "rope_parameters", "vocab_size")
    c = {k: tc[k] for k in keys}
    c.update(num_hidden_layers=layers, tie_word_embeddings=False, use_cache=True)
    return dict(sorted(c.items()))


def speculators_config(layer_cfg: dict, aux_ids, draft_vocab: int, K: int, verifier: str) -> dict:
    """config.json with exactly the keys of the speculators-written reference (DESIGN.md §1)."""
    return {
        "architectures": ["PEagleDraftModel"],
        "draft_vocab_size": draft_vocab,
        "dtype": "float16",
        "eagle_aux_hidden_state_layer_ids": list(aux_ids),
        "embed_requires_grad": False,
        "fc_norm": False,
        "mask_token_id": MASK_TOKEN_ID,
        "norm_before_fc": False,
        "norm_before_residual": False,
        "norm_output": False,
        "speculators_config": {
            "algorithm": "peagle",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy",
                                  "speculative_tokens": K, "verifier_accept_k": 1}],
            "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": verifier},
        },
        "speculators_model_type": "peagle",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": layer_cfg,
        "transformers_version": transformers_version(),
    }


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def save_draft(out: Path, model: PEagleDraft, config: dict, receipt: dict, dtype=torch.float16) -> None:
    """Write config.json, model.safetensors, training_receipt.json into ``out`` atomically."""
    from safetensors.torch import save_file
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file(model.state_for_save(dtype), tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (tmp / "training_receipt.json").write_text(json.dumps(receipt, indent=2) + "\n")
    swap_in(tmp, out)


def swap_in(tmp: Path, out: Path) -> None:
    """The finished folder ``tmp`` becomes ``out``, an older ``out`` replaced (renames:
    nothing half-written is ever at ``out``)."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)


def smollm2_target(cache: Path):
    """(folder, its source record, tokenizer, fp32 eval-mode model) of the SmolLM2 target
    converted into ``cache`` (tools/smollm2.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_dir = ensure_smollm2(cache)
    source = json.loads((hf_dir / "source.json").read_text())
    tok = AutoTokenizer.from_pretrained(hf_dir)
    return hf_dir, source, tok, AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def heldout_answers(target, tok, cache: Path | None, limit: int | None, max_new: int, source_sha: str) -> list[Seq]:
    """The target's greedy answers to the held-out prompts (cached: they depend only on the target)."""
    from gen_chat_data import HfEngine, chat_ids, cut_at_eos
    prompts = [json.loads(line) for line in HELDOUT.read_text().splitlines() if line.strip()][:limit]
    path = cache / "peagle-data" / f"heldout-{source_sha[:12]}-{max_new}.jsonl" if cache else None
    have = {d["prompt"]: d for d in read_jsonl(path)} if path is not None else {}
    todo = [p for p in prompts if p["prompt"] not in have]
    if todo:
        _log(f"generating target answers for {len(todo)} held-out prompts")
        engine = HfEngine(model=target, max_new=max_new)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        for i in range(0, len(todo), 16):  # appended per batch: a killed run keeps what it made
            group = todo[i:i + 16]
            ids = [chat_ids(tok, p["prompt"]) for p in group]
            new = [{"prompt": p["prompt"], "kind": p["kind"], "prompt_ids": x, "answer_ids": cut_at_eos(y)}
                   for p, x, y in zip(group, ids, engine.generate(ids))]
            have.update((d["prompt"], d) for d in new)
            if path is not None:
                with open_append(path) as f:
                    f.writelines(json.dumps(d) + "\n" for d in new)
    return [Seq(have[p["prompt"]]["prompt_ids"] + have[p["prompt"]]["answer_ids"],
                len(have[p["prompt"]]["prompt_ids"]), "heldout", p["kind"]) for p in prompts]


def run_of(table: dict, t: int, k: int) -> int:
    """Drafts accepted at anchor t out of k: depths 1.. up to the first miss (a depth the table
    lacks, past the sequence's end, counts as a miss)."""
    a = 0
    while a < k and table.get((t, a + 1), False):
        a += 1
    return a


def run_lengths(hits: np.ndarray, k: int) -> np.ndarray:
    """Per anchor row of ``anchor_hits``' table [rows, K]: drafts accepted out of k (depths 1..
    up to the first miss), ``run_of`` for every row at once."""
    return np.cumprod(hits[:, :k], axis=1).sum(1)


def loop_rounds(run, first: int, last: int) -> list[tuple[int, int]]:
    """The runtime's fixed-depth greedy loop replayed on a teacher-forced table: [(anchor,
    accepted)], ``run(t)`` the drafts accepted at anchor t (``run_of`` at the loop's depth).
    Round one at ``first`` (the last prompt position), each next one past the last accepted
    token (the target's own token after the first miss ends a round), while the anchor is <=
    ``last``."""
    rounds, t = [], first
    while t <= last:
        a = run(t)
        rounds.append((t, a))
        t += a + 1
    return rounds


@torch.no_grad()
def evaluate(model: PEagleDraft, seqs: list[Seq], feats: Features, K: int) -> dict:
    """Teacher-forced per-anchor acceptance on the target's greedy answers.

    Anchors t in [P-1, N-2-K] (every depth has a target token); acc_k = fraction of
    anchors whose depths 1..k all equal the target's greedy tokens. ``loop``: the same
    table at the anchors the runtime's fixed:k loop reaches (``loop_rounds``, anchors in the
    same range), for k = 1..K: per position the fraction of rounds accepting it, tau = 1 +
    their sum (what a fixed:k run accepts on these answers; rounds start more often just
    after a miss than anchors do, so it is below the all-anchor figure at k = K).
    """
    per_kind: dict[str, np.ndarray] = {}
    loop_kind: dict[str, np.ndarray] = {}
    tot, loop = np.zeros(K + 1), np.zeros((K, K + 1))  # loop[k-1]: rounds, accepted at 1..k
    hits = anchor_hits(model, seqs, feats, K, slots=1)  # one sequence a batch
    for j, s in enumerate(seqs):
        runs = run_lengths(hits[int(feats.offsets[j]):int(feats.offsets[j + 1])], K)
        anchors = range(max(s.prompt_len - 1, 0), len(s.ids) - 1 - K)  # build_batch's first anchor
        at = runs[anchors.start:max(anchors.stop, anchors.start)]
        c = np.array([len(at)] + [(at >= d).sum() for d in range(1, K + 1)], float)
        per_kind.setdefault(s.kind, np.zeros(K + 1))
        per_kind[s.kind] += c
        tot += c
        lc = np.zeros((K, K + 1))
        for k in range(1, K + 1):
            for _, a in loop_rounds(lambda t: min(int(runs[t]), k), anchors.start, anchors.stop - 1):
                lc[k - 1, 0] += 1
                lc[k - 1, 1:a + 1] += 1
        loop_kind.setdefault(s.kind, np.zeros((K, K + 1)))
        loop_kind[s.kind] += lc
        loop += lc

    def summary(c, lc):
        acc = [round(float(c[d] / max(c[0], 1)), 4) for d in range(1, K + 1)]
        return {"anchors": int(c[0]), "acceptance_at_pos": acc, "tau": round(1 + sum(acc), 4),
                "loop": {str(k): {"rounds": int(lc[k - 1, 0]),
                                  "acceptance_at_pos": [round(float(x / max(lc[k - 1, 0], 1)), 4)
                                                        for x in lc[k - 1, 1:k + 1]],
                                  "tau": round(1 + float(lc[k - 1, 1:].sum() / max(lc[k - 1, 0], 1)), 4)}
                         for k in range(1, K + 1)}}

    model.train()
    return {**summary(tot, loop), "by_kind": {k: summary(v, loop_kind[k]) for k, v in sorted(per_kind.items())}}


def anchor_hits(model: PEagleDraft, seqs: list[Seq], feats: Features, K: int, slots: int = 4096) -> np.ndarray:
    """[feature rows, K] bool: at anchor row r, whether the draft's depth-d output equals the
    target's greedy token (the table ``evaluate`` builds, for every sequence, in batches of
    about ``slots`` real slots; a depth past a sequence's end stays False)."""
    hits = np.zeros((int(feats.offsets[-1]), K), bool)
    was = model.training
    model.eval()
    for idx in make_batches(seqs, {}, slots, random.Random(0)):
        b = build_batch(idx, seqs, feats, K, [1.0] * K, np.random.default_rng(0)).to(model.embed.device)
        with torch.no_grad():
            ok = (draft_outputs(model, b)[1] == greedy_targets(b, feats)).cpu().numpy()
        hits[np.asarray(b.anchor_row), b.loss_depth.cpu().numpy() - 1] = ok
    model.train(was)
    return hits


def loop_visits(hits: np.ndarray, seqs: list[Seq], feats: Features, k: int) -> np.ndarray:
    """[feature rows] bool: the anchors a fixed:k greedy loop reaches on each sequence
    (``loop_rounds`` on ``anchor_hits``' table, from the last prompt position while depth 1
    has a target token)."""
    visited = np.zeros(len(hits), bool)
    for j, s in enumerate(seqs):
        off = int(feats.offsets[j])
        run = run_lengths(hits[off:int(feats.offsets[j + 1])], k)
        # depth 1 at anchor t predicts t + 1 <= N - 2
        for t, _ in loop_rounds(lambda t: int(run[t]), max(s.prompt_len - 1, 0), len(s.ids) - 3):
            visited[off + t] = True
    return visited


def init_draft(layer_cfg: dict, target, draft_ids: torch.Tensor, feats: Features) -> PEagleDraft:
    """Random decoder layer (std = initializer_range); head rows (``target_head``), final norm
    from the target."""
    embed = target.model.embed_tokens.weight.detach().cpu().clone()
    Vd = len(draft_ids)
    model = PEagleDraft(layer_cfg, Vd, embed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=layer_cfg["initializer_range"])
        model.lm_head.weight.copy_(target_head(target).detach().cpu()[draft_ids])
        model.norm.weight.copy_(target.model.norm.weight.cpu())
        model.d2t.copy_(draft_ids - torch.arange(Vd))
        model.t2d.zero_()
        model.t2d[draft_ids] = True
        # A typical hidden state is a better start for the learned mask vector than zeros.
        n = len(feats.aux)  # (numpy or, on a GPU, torch rows: Features.rows)
        sample = feats.rows("aux", np.arange(0, n, max(1, n // 4096))).cpu().numpy().astype(np.float32)
        model.mask_hidden.copy_(torch.from_numpy(sample.mean(0)).view(1, 1, -1))
    return model


def grow_layers(model: PEagleDraft, layers: int) -> PEagleDraft:
    """``model`` with decoder layers appended up to ``layers`` in all, each new one random
    (std = initializer_range) but with o_proj and down_proj zero: every new layer starts as
    the identity, so the grown draft's outputs are exactly ``model``'s and training moves on
    from them (the new layers' output projections get gradients at once)."""
    c = dict(model.c, num_hidden_layers=layers)
    grown = PEagleDraft(c, model.lm_head.out_features, model.embed)
    missing, unexpected = grown.load_state_dict(model.state_dict(), strict=False)
    new = {f"layers.{i}." for i in range(model.c["num_hidden_layers"], layers)}
    assert not unexpected and all(any(k.startswith(p) for p in new) for k in missing), (missing, unexpected)
    with torch.no_grad():
        for layer in grown.layers[model.c["num_hidden_layers"]:]:
            for p in layer.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=c["initializer_range"])
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return grown.train(model.training)


def grow_vocab(model: PEagleDraft, draft_ids: torch.Tensor) -> PEagleDraft:
    """``model`` with the draft vocabulary ``draft_ids`` (sorted target ids, a superset of
    its own): its head rows kept, each new token's row its target embedding row (the
    target's head row: SmolLM2 ties them) through the linear map that takes the kept
    tokens' embedding rows closest to their trained rows (least squares). The new rows'
    logits come out low, so the grown draft's greedy tokens are nearly ``model``'s (7
    of 9,178 held-out depth-1 outputs changed, stage 8 grown to 16,384) and training
    moves on from there."""
    old = model.target_ids
    at = torch.searchsorted(draft_ids, old)
    if len(draft_ids) <= len(old) or not bool((draft_ids[at.clamp(max=len(draft_ids) - 1)] == old).all()):
        raise ValueError("grow_vocab: draft_ids must hold the draft's own ids and more")
    grown = PEagleDraft(model.c, len(draft_ids), model.embed)
    state = {k: v for k, v in model.state_dict().items() if k not in ("lm_head.weight", "d2t", "t2d")}
    missing, unexpected = grown.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == {"lm_head.weight", "d2t", "t2d"}, (missing, unexpected)
    E = model.embed.float()
    W = model.lm_head.weight.detach().float()
    with torch.no_grad():
        A = torch.linalg.lstsq(E[old], W).solution  # [H, H]: E[old] @ A ~ W
        rows = E[draft_ids] @ A
        rows[at] = W
        grown.lm_head.weight.copy_(rows)
        grown.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        grown.t2d.zero_()
        grown.t2d[draft_ids] = True
    return grown.train(model.training)


def features_to_device(dev: torch.device, *feats: Features, spare: int = 8 << 30) -> tuple[Features, ...]:
    """``feats`` moved to ``dev`` when it has room for them and ``spare`` bytes besides (the
    steps' own memory), else as they are (host memory), saying which."""
    need = sum(f.nbytes() for f in feats)
    free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else None
    if free is not None and need + spare > free:
        _log(f"features ({need / 2**30:.1f} GiB) stay in host memory: {dev} has {free / 2**30:.1f} GiB free "
             f"({spare / 2**30:.0f} GiB kept for the steps)")
        return feats
    t0 = time.time()
    out = tuple(f.to(dev) for f in feats)
    _log(f"features ({need / 2**30:.1f} GiB) moved to {dev} in {time.time() - t0:.1f} s")
    return out


def _per_depth(stats: np.ndarray) -> dict:
    """(kl sum, correct, count) rows -> {"depth_k": {"kl", "accuracy"}}."""
    return {f"depth_{d + 1}": {"kl": round(float(r[0] / max(r[2], 1)), 4), "accuracy": round(float(r[1] / max(r[2], 1)), 4)}
            for d, r in enumerate(stats)}


def lr_factor(step: int, progress: float, warmup: int) -> float:
    """The learning rate's share of its peak at ``step``: a linear warm-up over ``warmup`` steps,
    times a cosine from 1 at ``progress`` 0 to a floor of 0.1 at 1 (of the steps or the time)."""
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the draft folder to write (the committed one is "
                    "fixtures/peagle-smollm2: name it to replace it; a default did so silently, even with --small)")
    ap.add_argument("--cache", default=None, help="default $SPECRT_CACHE or ~/.cache/specrt")
    ap.add_argument("--chat", nargs="+", default=None, metavar="CHAT_JSONL",
                    help="answer files (default <cache>/peagle-data/chat.jsonl): the first one's folder may hold "
                         "the generator's recorded features; later ones, e.g. sampled answers "
                         "(gen_chat_data --temperature), have theirs computed")
    ap.add_argument("--budget-minutes", type=float, default=100.0, help="wall-time bound for the whole run")
    ap.add_argument("--small", action="store_true", help="a few minutes: tiny data, a few hundred steps")
    ap.add_argument("--aux-layers", default="2,15,27")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--K", type=int, default=4)
    ap.add_argument("--layers", default=None,
                    help="draft decoder layers (default 1, or --init's); with --init, more than its count appends "
                         "layers that start as the identity (grow_layers). A list (1,2) and/or a list of --lr "
                         "trains one draft per combination in this one process, on the same features and batches, "
                         "each saved to <--out>-lr<LR>-L<N>")
    ap.add_argument("--chat-tokens", type=int, default=None, help="cap on chat answer tokens used")
    ap.add_argument("--chat-weight", type=int, default=1, help="repeats of each chat answer per epoch")
    ap.add_argument("--text-tokens", type=int, default=0, help="offline pydoc text tokens (teacher-forced)")
    ap.add_argument("--slots", type=int, default=1536, help="real slots per step (mask slots come on top)")
    ap.add_argument("--depth-keep", default="1,0.5,0.5,0.5", help="per-depth fraction of anchors trained")
    ap.add_argument("--loop-weight", type=float, default=1.0,
                    help="weight of the outputs at anchors the runtime's loop reaches (loop_visits: a fixed "
                         "--loop-depth greedy loop replayed with the draft being trained, again at each epoch's "
                         "start, and at --resume's) against 1 for the other anchors; 1: every anchor alike. The "
                         "replays' time counts in --budget-minutes and in the schedule's clock (on a GPU with all "
                         "the data, a forward pass over every answer each epoch)")
    ap.add_argument("--loop-depth", type=int, default=None, help="the replayed loop's depth (default --K)")
    ap.add_argument("--depth-weights", default=None,
                    help="K comma-separated weights of the depths' average KLs in the loss (default: equal)")
    ap.add_argument("--lr", default="1e-3", help="peak learning rate, or a list (6e-4,1.2e-3): see --layers")
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--train-head", action="store_true", help="train lm_head too (default: frozen)")
    ap.add_argument("--head-only", action="store_true",
                    help="train lm_head alone (implies --train-head; the layers, fc and mask vector stay as --init's)")
    ap.add_argument("--new-rows-only", action="store_true",
                    help="with --grow-vocab: train the new tokens' head rows alone (implies --head-only)")
    ap.add_argument("--grow-vocab", type=int, default=None, metavar="N",
                    help="with --init: grow its draft vocabulary to N tokens, its own and the most frequent others "
                         "(grow_vocab: the new head rows start from the target's, mapped as the kept rows were)")
    ap.add_argument("--vocab-answers", type=Path, nargs="+", default=None, metavar="FILE",
                    help="choose the draft vocabulary (--draft-vocab, --grow-vocab) by the answer tokens of these "
                         "generator files, .jsonl or .jsonl.gz (default: the training answers)")
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads; on a busy 2-core machine use 1 (a second OpenMP thread that loses its "
                         "core stalls every op: held-out generation took >11 min with 2, 3 min with 1)")
    ap.add_argument("--device", default="cpu",
                    help="torch device for the target's features and the training (cuda: features in fp32 with "
                         "TF32 off; --precision auto takes bf16 where the GPU has it)")
    ap.add_argument("--precision", choices=("auto", "bf16", "fp32"), default="auto",
                    help="autocast of the draft's matmuls (master weights and target distributions fp32); auto: "
                         "bf16 where the CPU multiplies bf16 natively, else fp32 (emulated bf16 is ~18x slower)")
    ap.add_argument("--heldout-limit", type=int, default=None)
    ap.add_argument("--heldout-max-new", type=int, default=128,
                    help="held-out answer length (128: every committed receipt's, eval_draft's and the device job's)")
    ap.add_argument("--eval-reserve-minutes", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="go on from the state a killed run saved")
    ap.add_argument("--init", type=Path, default=None, metavar="DRAFT_DIR",
                    help="start from a draft this script saved (its weights, draft vocabulary and aux layers; "
                         "--aux-layers and --draft-vocab are then ignored) instead of a random layer")
    ap.add_argument("--features-on-host", action="store_true",
                    help="with a GPU --device, keep the features in host memory and copy each step's rows over "
                         "(the default moves them to the GPU when it has room: no gather on the host, no copy a step)")
    ap.add_argument("--no-feature-cache", action="store_true",
                    help="neither read nor keep computed features in <cache>/peagle-data/train-feats-*")
    ap.add_argument("--save-every-minutes", type=float, default=10.0, help="how often that state is saved")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {args.device}: torch {torch.__version__} sees no CUDA device")
        exact_fp32(torch)  # the target's features in its own fp32 arithmetic
    if args.precision == "auto":
        if dev.type == "cuda":
            args.precision = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
            _log(f"--precision auto: {args.precision} on {torch.cuda.get_device_name(dev)}")
        else:
            args.precision = "bf16" if native_bf16() else "fp32"
            _log(f"--precision auto: {args.precision} (" + (
                "the CPU multiplies bf16 natively" if args.precision == "bf16"
                else "no native bf16 on this CPU: emulated bf16 is ~18x slower") + ")")

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    nrng = np.random.default_rng(args.seed)
    K = args.K
    keep = [float(x) for x in args.depth_keep.split(",")]
    aux_ids = [int(x) for x in args.aux_layers.split(",")]
    if len(keep) != K:
        raise SystemExit(f"--depth-keep needs {K} values")
    loop_depth = K if args.loop_depth is None else args.loop_depth
    depth_weights = None
    if args.depth_weights is not None:
        try:
            depth_weights = [float(x) for x in args.depth_weights.split(",")]
        except ValueError:
            depth_weights = []
        if len(depth_weights) != K or not all(w >= 0 and math.isfinite(w) for w in depth_weights) \
                or not sum(depth_weights) > 0:
            raise SystemExit(f"--depth-weights {args.depth_weights}: expected {K} comma-separated weights >= 0, "
                             "not all 0")
    if not (args.loop_weight > 0 and math.isfinite(args.loop_weight)):
        raise SystemExit(f"--loop-weight {args.loop_weight}: expected a positive number (1: every anchor alike)")
    if not 1 <= loop_depth <= K:
        raise SystemExit(f"--loop-depth {loop_depth}: expected a depth from 1 to --K {K}")
    require_answer_files("--vocab-answers", args.vocab_answers or [])
    if args.new_rows_only and args.grow_vocab is None:
        raise SystemExit("--new-rows-only needs --grow-vocab (the rows it trains are the grown vocabulary's)")
    args.head_only = args.head_only or args.new_rows_only
    args.train_head = args.train_head or args.head_only
    if args.small:
        args.chat_tokens = args.chat_tokens or 6000
        args.text_tokens = args.text_tokens or 6000
        args.max_steps = args.max_steps or 200
        args.slots = min(args.slots, 512)
        args.heldout_limit = args.heldout_limit or 10
        args.heldout_max_new = min(args.heldout_max_new, 48)
        args.draft_vocab = min(args.draft_vocab, 2048)
    reserve = args.eval_reserve_minutes if args.eval_reserve_minutes is not None else (0.5 if args.small else 2.0)

    init_cfg = None
    if args.init is not None:
        init_cfg = saved_draft_config(args.init, f"--init {args.init}")
        aux_ids = list(init_cfg["eagle_aux_hidden_state_layer_ids"])
        init_k = init_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        if init_k != K:
            raise SystemExit(f"--init {args.init}: drafts K = {init_k}, this run --K {K}")
    init_layers = init_cfg["transformer_layer_config"]["num_hidden_layers"] if init_cfg else None
    if args.grow_vocab is not None:
        if init_cfg is None:
            raise SystemExit("--grow-vocab needs --init (the draft whose vocabulary grows)")
        have, full = init_cfg["draft_vocab_size"], init_cfg["transformer_layer_config"]["vocab_size"]
        if not have < args.grow_vocab <= full:
            raise SystemExit(f"--grow-vocab {args.grow_vocab}: expected more than --init's draft vocabulary ({have}, "
                             f"{args.init / 'config.json'}) and at most the target's ({full})")
    variants = parse_variants(args.layers, args.lr, init_layers, args.init, Path(args.out))
    ref_err = check_reference()
    _log(f"draft forward matches the speculators reference (max |dlogits| {ref_err:.2e})")

    from transformers import AutoModelForCausalLM, AutoTokenizer
    cache = Path(args.cache) if args.cache else default_cache()
    hf_dir = ensure_smollm2(cache)
    source = json.loads((hf_dir / "source.json").read_text())
    tok = AutoTokenizer.from_pretrained(hf_dir)
    target = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval().to(dev)
    tc = json.loads((hf_dir / "config.json").read_text())
    if len(aux_ids) != 3 or not all(0 <= i < tc["num_hidden_layers"] for i in aux_ids):
        raise SystemExit(f"--aux-layers must be 3 ids in [0, {tc['num_hidden_layers']})")

    chat_paths = [Path(c) for c in args.chat] if args.chat else [cache / "peagle-data" / "chat.jsonl"]
    chat_path = chat_paths[0]
    chat, chat_files = load_chats(chat_paths, args.chat_tokens)
    text = offline_text(tok, args.text_tokens) if args.text_tokens else []
    seqs = chat + text
    if not seqs:
        raise SystemExit(f"no training data: {chat_path} is missing and --text-tokens is 0")
    n_chat = sum(len(s.ids) - s.prompt_len for s in chat)
    n_text = sum(len(s.ids) for s in text)
    _log(f"data: {len(chat)} chat answers ({n_chat} answer tokens), {len(text)} text chunks ({n_text} tokens)")
    counted = chat
    if args.vocab_answers:
        counted = [q for path in args.vocab_answers for q in load_answers(path, keyed=False)]
        _log(f"draft vocabulary counted on {len(counted)} answers of {len(args.vocab_answers)} --vocab-answers files")
    if args.init is not None:  # keep the draft's vocabulary: its head rows are trained for those ids
        init_model = load_draft(args.init, target.model.embed_tokens.weight.detach().cpu().clone())
        draft_ids = init_model.target_ids
        init_ids = draft_ids
        if args.grow_vocab is not None:
            draft_ids = select_draft_vocab(counted, tc["vocab_size"], args.grow_vocab, keep=draft_ids)
            init_model = grow_vocab(init_model, draft_ids)
    else:
        init_ids = None
        draft_ids = select_draft_vocab(counted, tc["vocab_size"], args.draft_vocab)
    covered = sum(int(np.isin(np.asarray(s.ids[s.prompt_len:]), draft_ids.numpy()).sum()) for s in chat)
    _log(f"draft vocabulary {len(draft_ids)}: covers {covered / max(n_chat, 1):.4f} of the chat answer tokens")

    fcache = None if args.no_feature_cache else FeatureCache(cache / "peagle-data", source["sha256"], aux_ids,
                                                            tc["hidden_size"])
    feats = build_features(target, seqs, aux_ids, chat_path.parent, cache=fcache)
    # Held-out answers and features before training, so the budget's tail is only evaluation.
    held = heldout_answers(target, tok, cache, args.heldout_limit, args.heldout_max_new, source["sha256"])
    hfeats = build_features(target, held, aux_ids, None, cache=fcache)
    probe = chat[:len(held)]  # the same estimate on training answers shows what is memorised
    if dev.type != "cpu" and not args.features_on_host:
        feats, hfeats = features_to_device(dev, feats, hfeats)
    pfeats = feats.head(len(probe)) if probe else None  # seqs = chat + text: its first rows
    t_prep = time.time() - t_start

    if args.init is not None and init_cfg["transformer_layer_config"] != draft_layer_config(tc, init_layers):
        raise SystemExit(f"--init {args.init}: its transformer_layer_config differs from this target's")
    # each draft starts from the random state a run training it alone would have
    rng_at_init = torch.get_rng_state()
    for v in variants:
        torch.set_rng_state(rng_at_init)
        if args.init is not None:
            model = copy.deepcopy(init_model) if len(variants) > 1 else init_model
            v.model = (grow_layers(model, v.layers) if v.layers > init_layers else model).train().to(dev)
        else:
            v.model = init_draft(draft_layer_config(tc, v.layers), target, draft_ids, feats).to(dev)
        v.model.lm_head.weight.requires_grad_(args.train_head)
        if args.head_only:
            for name, p in v.model.named_parameters():
                p.requires_grad_(name == "lm_head.weight")
        if args.new_rows_only:  # zero gradients (and no weight decay): AdamW leaves the kept rows as they are
            new_rows = (~torch.isin(draft_ids, init_ids)).float().to(dev)[:, None]
            v.model.lm_head.weight.register_hook(lambda g, new_rows=new_rows: g * new_rows)
        v.params = [p for p in v.model.parameters() if p.requires_grad]
        v.opt = torch.optim.AdamW(v.params, lr=v.lr, betas=(0.9, 0.95), weight_decay=0.0)
        v.sums = StepSums(K, dev)
    head_w = target_head(target).detach()[draft_ids.to(dev)]  # p_target over the draft vocabulary
    V = len(variants)

    weights = {"chat": args.chat_weight, "text": 1}
    warmup = 10 if args.small else 50
    # (kl sum, correct, count) per draft and depth: the current log window, all steps, the last full window
    st = {"step": 0, "epoch": 0, "batch": 0, "train_seconds": 0.0, "outputs_seen": 0, "budget_s": None,
          "window": np.zeros((V, K, 3)), "all_steps": np.zeros((V, K, 3)), "last_window": np.zeros((V, K, 3))}
    # A run killed part-way can go on with --resume from the state saved every 10 minutes.
    state_path = cache / "peagle-data" / "train-state.pt"
    signature = {"aux": aux_ids, "K": K, "vocab": draft_ids.tolist(), "seqs": len(seqs), "slots": args.slots,
                 "seed": args.seed, "lr": [v.lr for v in variants], "head": args.train_head,
                 "head_only": args.head_only, "new_rows_only": args.new_rows_only, "keep": keep,
                 "out": str(args.out), "init": str(args.init), "layers": [v.layers for v in variants],
                 "loop": [args.loop_weight, loop_depth], "depth_weights": depth_weights}
    resumed = False
    if args.resume and not state_path.is_file():
        _log(f"--resume: no saved state at {state_path}; starting fresh")
    if args.resume and state_path.is_file():
        resumed = True
        saved = torch.load(state_path, weights_only=False)
        if saved["signature"] != signature:
            raise SystemExit(f"{state_path} belongs to another configuration; drop --resume or delete it")
        for v, m, o in zip(variants, saved["model"], saved["opt"]):
            v.model.load_state_dict(m)
            v.opt.load_state_dict(o)
        st = saved["st"]
        nrng.bit_generator.state = saved["nrng"]
        torch.set_rng_state(saved["torch_rng"])
        _log(f"resumed at step {st['step']} ({st['train_seconds'] / 60:.1f} min trained)")
    t_train = last_log = time.time()
    if st["budget_s"] is None:
        st["budget_s"] = t_start + 60 * (args.budget_minutes - reserve) - t_train
    budget_s, last_save = st["budget_s"], time.time()
    if budget_s - st["train_seconds"] <= 0 and not args.resume:
        raise SystemExit(f"--budget-minutes {args.budget_minutes} is spent before training starts "
                         f"({t_prep / 60:.1f} min of preparation)")
    _log(f"training: {', '.join(f'{v.name} {v.n_params()}' for v in variants)} trainable parameters, K={K}, "
         f"aux {aux_ids}, {(budget_s - st['train_seconds']) / 60:.1f} min left")

    def trained() -> float:
        return st["train_seconds"] + time.time() - t_train

    def flush() -> None:  # the steps' sums into st["window"]
        for i, v in enumerate(variants):
            v.sums.flush(st["window"][i])

    if args.loop_weight != 1.0:  # the anchors the loop may reach (loop_visits' range): its share's base
        first_rows = np.concatenate([int(feats.offsets[j]) + np.arange(max(s.prompt_len - 1, 0), len(s.ids) - 2)
                                     for j, s in enumerate(seqs)])
    done = False
    while not done:
        if st["batch"] == 0:
            st["epoch"] += 1
        batches = make_batches(seqs, weights, args.slots, random.Random(args.seed * 1000 + st["epoch"]))
        if args.loop_weight != 1.0:  # each epoch (and a resumed one) weighs the anchors its drafts reach now
            for i, v in enumerate(variants):
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    hits = anchor_hits(v.model, seqs, feats, K)  # in the training's precision
                v.visited = loop_visits(hits, seqs, feats, loop_depth)
                share = round(float(v.visited[first_rows].mean()), 4)
                st.setdefault("loop_shares", [[] for _ in variants])[i].append(
                    {"epoch": st["epoch"], "step": st["step"], "share": share})
                _log(f"{v.name}: the fixed:{loop_depth} loop reaches {share:.3f} of the anchors (epoch "
                     f"{st['epoch']}, step {st['step']}); their outputs weigh {args.loop_weight:g}")
        for b_idx in batches[st["batch"]:]:
            # cosine schedule over whichever runs out first: steps or training time
            progress = max(st["step"] / args.max_steps if args.max_steps else 0.0, trained() / budget_s)
            if progress >= 1.0:
                done = True
                break
            factor = lr_factor(st["step"], progress, warmup)
            # one batch for every draft: they differ only in their layers and learning rates
            b = build_batch(b_idx, seqs, feats, K, keep, nrng, aux_fp16=dev.type != "cpu").to(dev)
            for v in variants:
                for g in v.opt.param_groups:
                    g["lr"] = v.lr * factor
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                    kl, correct = output_losses(v.model, b, feats, head_w)
                per_depth = depth_sums(kl, correct, b, K)
                w = None
                if v.visited is not None:
                    w = torch.from_numpy(np.where(v.visited[np.asarray(b.anchor_row)], args.loop_weight,
                                                  1.0).astype(np.float32)).to(kl.device)
                train_step(v, training_loss(kl, b, K, w, depth_weights))
                # the sums stay on the device until a log line or a save reads them (flush): the
                # CPU goes on to the next batch while the device works
                v.sums.add(per_depth)
            st["step"] += 1
            st["batch"] += 1
            st["outputs_seen"] += sum(c for _, _, c in per_depth)
            if time.time() - last_log > (10 if args.small else 60):
                last_log = time.time()
                flush()
                msg = " | ".join((f"{v.name} " if V > 1 else "") + f"lr {v.lr * factor:.2e} " + " ".join(
                    f"d{d + 1} kl {r[0] / max(r[2], 1):.3f} acc {r[1] / max(r[2], 1):.3f}" for d, r in enumerate(w))
                    for v, w in zip(variants, st["window"]))
                _log(f"step {st['step']} ep {st['epoch']} {trained() / st['step']:.2f}s/step | {msg}")
                st["all_steps"] += st["window"]
                st["last_window"], st["window"] = st["window"], np.zeros((V, K, 3))
            if time.time() - last_save > 60 * args.save_every_minutes:
                last_save = time.time()
                flush()
                tmp = state_path.with_suffix(".tmp")
                torch.save({"signature": signature, "model": [v.model.state_dict() for v in variants],
                            "opt": [v.opt.state_dict() for v in variants],
                            "st": {**st, "train_seconds": trained()}, "nrng": nrng.bit_generator.state,
                            "torch_rng": torch.get_rng_state()}, tmp)
                os.replace(tmp, state_path)
        else:
            st["batch"] = 0
    flush()
    st["all_steps"] += st["window"]
    if st["window"][..., 2].sum():
        st["last_window"] = st["window"]
    step, epoch, outputs_seen, t_train = st["step"], st["epoch"], st["outputs_seen"], trained()
    last_window, all_steps = st["last_window"], st["all_steps"]
    state_path.unlink(missing_ok=True)

    for i, v in enumerate(variants):
        # Evaluate the weights as they are saved (fp16).
        model = v.model
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.float16).float())
        result = evaluate(model, held, hfeats, K)
        _log(f"{v.name} held-out: acceptance by position {result['acceptance_at_pos']}, tau {result['tau']} at K={K}")
        probe_eval = evaluate(model, probe, pfeats, K) if probe else None
        receipt = {
            "target": {"name": "SmolLM2-135M-Instruct", "licence": "Apache-2.0", "source": source,
                       "made_by": "tools/smollm2.py"},
            "data": {
                "chat": {"path": str(chat_path), "answers": len(chat), "answer_tokens": n_chat,
                         "weight": args.chat_weight, **({"files": chat_files} if len(chat_paths) > 1 else {}),
                         "source": ("greedy and sampled" if any(q.sampled for q in chat) else "greedy")
                                   + " answers of the target itself (tools/gen_chat_data.py) to the TRAIN prompts "
                                   "of tools/prompts.py (written for this project); model outputs of an Apache-2.0 "
                                   "model"},
                "text": {"tokens": n_text, "chunks": len(text),
                         "source": "Python pydoc_data.topics (Python Software Foundation License)"} if text else None,
                "feature_rows": int(feats.offsets[-1]),
            },
            "draft_vocab_size": len(draft_ids),
            "draft_vocab_coverage_of_chat_answers": round(covered / max(n_chat, 1), 4),
            "mask_token_id": MASK_TOKEN_ID, "mask_token": "<empty_output>",
            "aux_layer_ids": aux_ids, "K": K, "depth_keep": keep, "trainable_parameters": v.n_params(),
            "layers": v.layers,
            "trained_beside": [w.name for w in variants if w is not v],  # in one process, on the same batches
            "init": None if args.init is None else {
                "path": str(args.init), "model_sha256": sha256_file(args.init / "model.safetensors"),
                "layers": init_layers,
                "its_heldout": (json.loads((args.init / "training_receipt.json").read_text()).get("heldout")
                                if (args.init / "training_receipt.json").is_file() else None)},
            "vocab_grown_from": len(init_ids) if args.grow_vocab is not None else None,
            "vocab_answers": [str(x) for x in args.vocab_answers] if args.vocab_answers else None,
            "lm_head_trained": args.train_head, "head_only": args.head_only,
            "new_rows_only": args.new_rows_only, "steps": step, "epochs_started": epoch,
            "loop_weight": None if args.loop_weight == 1.0 else {
                "weight": args.loop_weight, "depth": loop_depth, "reached": st["loop_shares"][i],
                "rule": "outputs at anchors a fixed:depth greedy loop reaches (replayed teacher-forced with the "
                        "draft being trained, at each epoch's start and at a resume) weigh this, the others 1; "
                        "reached: the share of anchors it reached each time"},
            "depth_weights": depth_weights,
            "real_slots_per_step": args.slots,
            "supervised_outputs_seen": outputs_seen, "lr": v.lr, "precision": args.precision, "seed": args.seed,
            "threads": args.threads,
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "training_last_window": _per_depth(last_window[i]), "training_all_steps": _per_depth(all_steps[i]),
            "heldout": {"prompts": str(HELDOUT.relative_to(ROOT)), "max_new_tokens": args.heldout_max_new,
                        "method": "teacher-forced on the target's greedy answers; per anchor, acceptance at depth k = "
                                  "draft depths 1..k all equal the target's greedy tokens", **result},
            "train_answers_same_estimate": probe_eval,
            "reference_check_max_abs_logit_diff": ref_err,
            "wall_seconds": {"preparation": round(t_prep, 1), "training": round(t_train, 1),
                             "total": round(time.time() - t_start, 1)},
            "budget_minutes": args.budget_minutes, "small": args.small, "resumed": resumed,
            "command": " ".join(["python", "tools/train_peagle.py"]
                                + (argv if argv is not None else sys.argv[1:])),
            "torch": torch.__version__,
        }
        config = speculators_config(draft_layer_config(tc, v.layers), aux_ids, len(draft_ids), K,
                                    "HuggingFaceTB/SmolLM2-135M-Instruct")
        save_draft(v.out, model, config, receipt)
        _log(f"saved {v.out} ({(time.time() - t_start) / 60:.1f} min total)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
