"""Tiny checkpoints written by transformers itself, for the binding tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"


def write_hf(path: Path, model_type: str = "llama", tie: bool = False, shard: bool = False) -> Path:
    """Save a tiny random GQA model with transformers' own save_pretrained."""
    import torch
    import transformers

    torch.manual_seed(0)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=1000, max_position_embeddings=256,
                  tie_word_embeddings=tie, rms_norm_eps=1e-6)
    if model_type == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    else:
        cfg, cls = transformers.Qwen3Config(**common), transformers.Qwen3ForCausalLM
    model = cls(cfg)
    model.save_pretrained(path, safe_serialization=True, max_shard_size="100KB" if shard else "5GB")
    return path


@pytest.fixture(scope="session")
def hf_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "llama": write_hf(root / "llama"),
        "llama_tied": write_hf(root / "llama_tied", tie=True),
        "llama_sharded": write_hf(root / "llama_sharded", shard=True),
        "qwen3": write_hf(root / "qwen3", "qwen3"),
        "qwen3_tied": write_hf(root / "qwen3_tied", "qwen3", tie=True),
    }


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def write_eagle3(path: Path, draft_vocab: int = 500, hidden: int = 64, target_vocab: int = 1000,
                 rng_seed: int = 0) -> Path:
    """An EAGLE-3 draft in the speculators format (config keys and tensor names of DESIGN.md §1),
    with a reduced draft vocabulary and its d2t/t2d maps."""
    rng = np.random.default_rng(rng_seed)
    cfg = json.loads((REFERENCE / "draft" / "config.json").read_text())
    cfg.pop("mask_token_id")
    cfg.pop("auto_map")
    cfg["architectures"] = ["Eagle3DraftModel"]
    cfg["speculators_model_type"] = "eagle3"
    cfg["speculators_config"]["algorithm"] = "eagle3"
    cfg["draft_vocab_size"] = draft_vocab
    cfg["transformer_layer_config"]["hidden_size"] = hidden
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    H, f = hidden, lambda *s: rng.standard_normal(s).astype(np.float32) * 0.05
    chosen = np.sort(rng.choice(target_vocab, draft_vocab, replace=False))
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[chosen] = True
    tensors = {
        "fc.weight": f(H, 3 * H), "layers.0.hidden_norm.weight": np.ones(H, np.float32),
        "layers.0.input_layernorm.weight": np.ones(H, np.float32),
        "layers.0.self_attn.q_proj.weight": f(64, 2 * H), "layers.0.self_attn.k_proj.weight": f(32, 2 * H),
        "layers.0.self_attn.v_proj.weight": f(32, 2 * H), "layers.0.self_attn.o_proj.weight": f(H, 64),
        "layers.0.post_attention_layernorm.weight": np.ones(H, np.float32),
        "layers.0.mlp.gate_proj.weight": f(128, H), "layers.0.mlp.up_proj.weight": f(128, H),
        "layers.0.mlp.down_proj.weight": f(H, 128), "norm.weight": np.ones(H, np.float32),
        "lm_head.weight": f(draft_vocab, H),
        "d2t": (chosen - np.arange(draft_vocab)).astype(np.int64), "t2d": t2d,
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def rewrite(folder: Path, rename: dict[str, str] | None = None, drop: tuple[str, ...] = (),
            add: dict[str, np.ndarray] | None = None, change: dict[str, np.ndarray] | None = None) -> None:
    """Rewrite a single-file checkpoint's tensors (rename, drop, add, replace)."""
    import ml_dtypes  # noqa: F401  (safetensors.numpy names bf16 by its dtype; onnx 1.16 does not import it)
    from safetensors.numpy import load_file

    path = folder / "model.safetensors"
    t = load_file(str(path))
    for k in drop:
        del t[k]
    for old, new in (rename or {}).items():
        t[new] = t.pop(old)
    t.update(add or {})
    t.update(change or {})
    save_file(t, str(path), metadata={"format": "pt"})
