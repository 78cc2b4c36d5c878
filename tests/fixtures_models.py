"""Tiny checkpoints for tests, written by the real libraries' own savers.

``write_tiny_target`` saves a random transformers model (Llama / Qwen3 / Qwen2, GQA:
hidden 64, 4 heads, 2 KV heads, head_dim 16, 4 layers, vocab 1000) with
``save_pretrained``. ``write_tiny_draft`` writes a speculators-format EAGLE-3 or
P-EAGLE draft (config keys and tensor names of DESIGN.md §1) against such a target.
``write_bigram_pair`` (EAGLE-3) and ``write_lag_pair`` (P-EAGLE) build pairs whose
drafts are right most of the time.

Weights are random with a scale large enough that attention is far from uniform and
every norm weight differs from 1, so a mask, RoPE or slot mix-up shows in the outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1000, max_position_embeddings=256, rms_norm_eps=1e-6)

# rope_parameters of a Llama-3.1-style scaled RoPE, scaled down so that it matters at head_dim 16.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _randomise(model, seed: int, scale: float = 0.1) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(scale * r)


def write_tiny_target(path: Path, model_type: str = "llama", tied: bool = False, seed: int = 0, **overrides) -> Path:
    """Save a tiny random ``{Llama,Qwen3,Qwen2,Mistral}ForCausalLM`` to ``path``; returns ``path``."""
    import transformers

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
               "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM)}
    cfg_cls, model_cls = classes[model_type]
    cfg = cfg_cls(**{**TINY, "tie_word_embeddings": tied, **overrides})
    model = model_cls(cfg)
    _randomise(model, seed)
    model.save_pretrained(path)
    return Path(path)


def load_hf(path: Path):
    """The saved model back in transformers, eager attention, fp32, eval mode."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def write_tiny_draft(path: Path, target: Path, kind: str = "eagle3", num_layers: int = 2, draft_vocab: int = 500,
                     norm_before_fc: bool = False, fc_norm: bool = False, norm_before_residual: bool = False,
                     own_embed: bool = False, mask_token_id: int = 999, seed: int = 1,
                     norm_output: bool = False, confidence_head: bool = False,
                     aux_layer_ids: tuple[int, ...] = (1, 2, 3), hidden_size: int | None = None) -> Path:
    """A speculators draft for the target saved at ``target`` (same width and family);
    ``confidence_head``: with a DSpark confidence head (DeepSpec's names); ``aux_layer_ids``:
    the target layers fc reads (speculators sizes fc, mask_hidden and the norms by their count);
    ``hidden_size``: a draft of another width than its target's (speculators' target_hidden_size:
    fc, mask_hidden and the pre-fc norms keep the target's width; an embedding of its own)."""
    t = json.loads((Path(target) / "config.json").read_text())
    rng = np.random.default_rng(seed)
    Ht, V, D = t["hidden_size"], t["vocab_size"], t["head_dim"]
    H = hidden_size or Ht
    NH, KVH, I = t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"]
    layer_cfg = {k: t[k] for k in ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                   "head_dim", "intermediate_size", "rms_norm_eps", "vocab_size",
                                   "max_position_embeddings", "rope_parameters")}
    # a Qwen2 target's draft has a llama layer: a qwen2 layer has q/k/v biases, which speculators' drafts have not
    layer_cfg.update(num_hidden_layers=num_layers, hidden_act="silu", tie_word_embeddings=False, hidden_size=H,
                     model_type="llama" if t["model_type"] == "qwen2" else t["model_type"])
    cfg = {
        "architectures": ["PEagleDraftModel" if kind == "peagle" else "Eagle3DraftModel"],
        "speculators_model_type": kind, "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        "norm_before_residual": norm_before_residual, "norm_before_fc": norm_before_fc,
        "fc_norm": fc_norm, "norm_output": norm_output, "embed_requires_grad": False,
        "target_hidden_size": Ht if H != Ht else None,
        "transformer_layer_config": layer_cfg,
        "speculators_config": {"algorithm": kind, "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4}],
                               "verifier": {"architectures": t["architectures"], "name_or_path": str(target)}},
    }
    if kind == "peagle":
        cfg["mask_token_id"] = mask_token_id

    def w(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    n = len(aux_layer_ids)
    x: dict[str, np.ndarray] = {"fc.weight": w(H, n * Ht), "layers.0.hidden_norm.weight": norm(H),
                                "norm.weight": norm(H), "lm_head.weight": w(draft_vocab, H)}
    for i in range(num_layers):
        p, fan_in = f"layers.{i}.", 2 * H if i == 0 else H
        x.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "self_attn.q_proj.weight": w(NH * D, fan_in), p + "self_attn.k_proj.weight": w(KVH * D, fan_in),
                  p + "self_attn.v_proj.weight": w(KVH * D, fan_in), p + "self_attn.o_proj.weight": w(H, NH * D),
                  p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
                  p + "mlp.down_proj.weight": w(H, I)})
        if t["model_type"] == "qwen3":
            x.update({p + "self_attn.q_norm.weight": norm(D), p + "self_attn.k_norm.weight": norm(D)})
    if draft_vocab < V:
        chosen = np.sort(rng.choice(V, draft_vocab, replace=False))
        x["d2t"] = (chosen - np.arange(draft_vocab)).astype(np.int64)
        x["t2d"] = np.zeros(V, dtype=bool)
        x["t2d"][chosen] = True
    if kind == "peagle":
        x["mask_hidden"] = w(1, 1, n * Ht) * 10
    if norm_before_fc:
        x["input_norm.weight"] = norm(n * Ht)
    if fc_norm:
        x.update({f"fc_norm.{j}.weight": norm(Ht) for j in range(n)})
    if own_embed or H != Ht:
        x["embed_tokens.weight"] = w(V, H)
    if confidence_head:
        cfg.update(enable_confidence_head=True, confidence_head_with_markov=False)
        x.update({"confidence_head.proj.weight": w(1, H), "confidence_head.proj.bias": w(1)})
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(x, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


BIGRAM_PERIOD = 13  # the bigram target's greedy chain cycles through 3..15


def _bigram_target(path: Path, model_type: str, noise: float) -> tuple[Path, dict[int, int], np.ndarray]:
    """The target of ``write_bigram_pair`` (its docstring): (folder, nxt, lm_head)."""
    from safetensors.numpy import load_file

    V, H = 16, TINY["hidden_size"]
    nxt = {x: (x - 3 + 1) % BIGRAM_PERIOD + 3 if x >= 3 else 3 for x in range(V)}
    eye = np.eye(H, dtype=np.float32)
    head = np.zeros((V, H), np.float32)
    for x, v in nxt.items():
        head[v] += 0.35 * eye[x]  # logits 2.8 apart: the top token p = 0.52 at temperature 1
    t = write_tiny_target(path, model_type, vocab_size=V)
    f = t / "model.safetensors"
    w = load_file(str(f))
    w["model.embed_tokens.weight"] = eye[:V].copy()
    w["model.norm.weight"] = np.ones(H, np.float32)
    w["lm_head.weight"] = head
    for name in w:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[name] = (w[name] * (noise / 0.1)).astype(np.float32)
    save_file(w, str(f), metadata={"format": "pt"})
    return t, nxt, head


def write_bigram_pair(root: Path, model_type: str = "qwen3", wrong: tuple[int, ...] = (7, 12),
                      noise: float = 1e-3) -> tuple[Path, Path]:
    """A tiny target (vocabulary 16) whose greedy next token is a fixed function of the
    current one, and an EAGLE-3 draft that knows that function except at the tokens in
    ``wrong``: random tiny drafts almost never accept (1 draft in 118 on the 16-token
    models), so multi-token acceptance, partial rounds and the draft's fed-back hidden
    state after them got no exercise. Returns (target, draft) folders.

    Target: one-hot embeddings e_x (hidden 64 >= 16), every layer's o_proj and down_proj
    scaled to ``noise`` (the residual stream stays ~e_x, still a little context- and
    KV-dependent), final norm 1 and lm_head rows 0.35 sum_{x: nxt(x) = v} e_x, so the logits
    are 2.8 [nxt(x) = v] (sampling at temperature 1 leaves the chain 48% of the time). nxt cycles through 3..15 (the ids the tiny configs use for BOS/EOS,
    0-2, lead into it and never come out).
    Draft: fc passes aux layer 1 (~e_x of the last verified position) through; its MLP is
    a lookup table adding e_step(x) - e_x, step = nxt except at ``wrong``, so each draft step
    advances the hidden state one token and the target's lm_head names the next: its k-th
    draft is right while the chain has not passed a wrong entry, where the right token is
    its runner-up (token trees win rounds there)."""
    from safetensors.numpy import load_file

    V, H = 16, TINY["hidden_size"]
    t, nxt, head = _bigram_target(Path(root) / "t", model_type, noise)
    step = {x: (nxt[nxt[x]] if x in wrong else nxt[x]) for x in range(V)}
    eye = np.eye(H, dtype=np.float32)
    d = write_tiny_draft(Path(root) / "d", t, kind="eagle3", num_layers=1, draft_vocab=V, mask_token_id=V - 1)
    f = d / "model.safetensors"
    w = load_file(str(f))
    I = w["layers.0.mlp.gate_proj.weight"].shape[0]
    gate, up, down = np.zeros((I, H), np.float32), np.zeros((I, H), np.float32), np.zeros((H, I), np.float32)
    n = np.sqrt(H)  # RMSNorm of e_x with weight 1 is sqrt(H) e_x
    act = n / (1.0 + np.exp(-n)) * n  # silu(gate) * up for the token's own row
    for x in range(V):
        gate[x, x] = up[x, x] = 1.0
        right = 0.5 * eye[nxt[x]] if x in wrong else 0.0  # a wrong draft's runner-up is the right one
        down[:, x] = (eye[step[x]] + right - eye[x]) / act
    w.update({"fc.weight": np.concatenate([eye, 0 * eye, 0 * eye], 1), "norm.weight": np.ones(H, np.float32),
              "layers.0.post_attention_layernorm.weight": np.ones(H, np.float32),
              "layers.0.mlp.gate_proj.weight": gate, "layers.0.mlp.up_proj.weight": up,
              "layers.0.mlp.down_proj.weight": down, "lm_head.weight": head.copy(),
              "layers.0.self_attn.o_proj.weight": (w["layers.0.self_attn.o_proj.weight"] * (noise / 0.1)
                                                   ).astype(np.float32)})
    save_file(w, str(f), metadata={"format": "pt"})
    return t, d


def write_lag_pair(root: Path, model_type: str = "llama", wrong: tuple[int, ...] = (7, 12),
                   noise: float = 1e-3) -> tuple[Path, Path]:
    """The target of ``write_bigram_pair`` (its greedy chain cycles with period 13) and a
    P-EAGLE draft that reads the chain 13 tokens back, except at the tokens in ``wrong``:
    random tiny P-EAGLE drafts rarely accept, and a P-EAGLE draft's mask slots learn
    nothing of the last token but through attention. Returns (target, draft) folders.

    Every slot at position p predicts the token at p + 2 (the real slot of target position
    t carries token t + 1 and the target's aux hidden state at t, ~e_{x_t}; mask slot i
    sits at last_pos + i). fc passes aux layer 1 through and adds its sum (~1, whatever x)
    in a dim r of its own, as mask_hidden's g does, so the hidden half of every slot is
    sqrt(H/2) (e_r + e_x). Attention head 0 reads the slot 11 positions back: its query
    and key come from e_r only, rotated by RoPE so that the score (after the 1 / sqrt(D)) is
    25 sum_j cos(w_j (dp - 11)) over the 8 frequencies w_j, one sharp peak at dp = 11 (every
    other dp up to 127 scores at least 12.9 less); its value is that slot's aux token,
    x_{p-11}, which on the chain is the token at p + 2 - 13. Head 2 reads the token the slot
    12 positions back carries, x_{p-11} again, with the same weight (heads 1 and 3 add
    nothing): fed another position's token or aux row, the two differ and the draft goes
    wrong. The draft's lm_head reads their sum back (for a wrong entry it names the chain's
    next token, the right one its runner-up; ``lag_pair_draft``). So the k-th draft is right
    while the 13 tokens before its position followed the chain and no wrong entry came
    first: rounds accept in full, in part (at a wrong entry) and not at all (in the first
    13 positions past a prompt off the chain, and where sampling leaves it)."""
    from safetensors.numpy import load_file

    V, H, lag = 16, TINY["hidden_size"], BIGRAM_PERIOD - 2
    t, nxt, _ = _bigram_target(Path(root) / "t", model_type, noise)
    d = write_tiny_draft(Path(root) / "d", t, kind="peagle", num_layers=1, draft_vocab=V, mask_token_id=V - 1)
    cfg = json.loads((t / "config.json").read_text())
    rope = cfg["rope_parameters"]
    assert rope["rope_type"] == "default", rope
    D, NH, KVH = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    f = d / "model.safetensors"
    w = load_file(str(f))
    r, out = H - 1, 2 * V  # the constant dim; the copied token goes to dims out..out+V-1
    fc = np.zeros((H, 3 * H), np.float32)
    fc[:V, :V] = np.eye(V)  # g = e_x + (sum of aux layer 1's token dims ~1) e_r
    fc[r, :V] = 1.0
    mask_hidden = np.zeros((1, 1, 3 * H), np.float32)
    mask_hidden[0, 0, V - 1] = 1.0  # g = e_r + e_{V-1}: the same norm as a real slot's
    n = np.sqrt(H / 2)  # RMSNorm (weight 1) of e_r + e_x: n (e_r + e_x)
    # RoPE (rotate_half): dims (j, j + D/2) turn by w_j * position; q = A e^{-i w_j lag}, k = 1
    # per pair: q.k = A sum_j cos(w_j (p_q - p_k - lag)), divided by sqrt(D) in attention
    inv = rope["rope_theta"] ** (-np.arange(0, D, 2) / D)
    A = 25.0 * np.sqrt(D)
    q, k = np.zeros((NH * D, 2 * H), np.float32), np.zeros((KVH * D, 2 * H), np.float32)
    v, o = np.zeros((KVH * D, 2 * H), np.float32), np.zeros((H, NH * D), np.float32)
    for qh, kv, back in ((0, 0, lag), (2, 1, lag + 1)):  # (heads 0, 1 share KV head 0; 2, 3 KV head 1)
        q[qh * D: qh * D + D // 2, H + r] = A * np.cos(inv * back) / n
        q[qh * D + D // 2: qh * D + D, H + r] = -A * np.sin(inv * back) / n
        k[kv * D: kv * D + D // 2, H + r] = 1.0 / n
        o[out: out + V, qh * D: qh * D + V] = 2.0 * np.eye(V)
    v[:V, H: H + V] = np.eye(V) / n  # head 0's value: the slot's aux token, one-hot (head_dim 16 = V)
    v[D: D + V, :V] = np.eye(V) / np.sqrt(H)  # head 2's: the slot's token (input_layernorm(e_x) = sqrt(H) e_x)
    head = np.zeros((V, H), np.float32)
    for x in range(V):
        if x in wrong:
            head[nxt[x], out + x], head[x, out + x] = 3.0, 2.0  # a wrong draft, the right one its runner-up
        else:
            head[x, out + x] = 3.0
    w.update({"fc.weight": fc, "mask_hidden": mask_hidden, "layers.0.self_attn.q_proj.weight": q,
              "layers.0.self_attn.k_proj.weight": k, "layers.0.self_attn.v_proj.weight": v,
              "layers.0.self_attn.o_proj.weight": o, "layers.0.mlp.down_proj.weight": np.zeros_like(
                  w["layers.0.mlp.down_proj.weight"]), "lm_head.weight": head})
    for name in ("layers.0.input_layernorm.weight", "layers.0.hidden_norm.weight",
                 "layers.0.post_attention_layernorm.weight", "norm.weight"):
        w[name] = np.ones(H, np.float32)
    save_file(w, str(f), metadata={"format": "pt"})
    return t, d


def lag_pair_draft(tokens: list[int], j: int, wrong: tuple[int, ...] = (7, 12)) -> int:
    """The token the draft of ``write_lag_pair`` proposes for position ``j >= 13`` of
    ``tokens`` (prompt + output): the token 13 back, or for a wrong entry the chain's next."""
    y = tokens[j - BIGRAM_PERIOD]
    return (y - 3 + 1) % BIGRAM_PERIOD + 3 if y in wrong else y
