"""export/config.py: what transformers' classes read from a config, read the same way here."""

from __future__ import annotations

import json

import pytest

from specrt.errors import UserError
from specrt.export.config import parse_decoder

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=1000, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
            tie_word_embeddings=False)


@pytest.mark.parametrize("model_type, fields, window", [
    ("llama", {"sliding_window": 16}, None),  # Llama has no window
    ("mistral", {}, 4096),  # MistralConfig's default when the key is absent
    ("mistral", {"sliding_window": None}, None),
    ("mistral", {"sliding_window": 64}, 64),
    ("qwen2", {"sliding_window": 64}, None),  # use_sliding_window false by default
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, None),  # max_window_layers 28 >= 4 layers
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}, 64),
    ("qwen3", {"use_sliding_window": True, "max_window_layers": 0}, 4096),
    ("qwen3", {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0}, None),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "layer_types": ["full_attention"] * 4}, None),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 9,
               "layer_types": ["full_attention"] * 3 + ["sliding_attention"]}, 32),
])
def test_the_sliding_window_is_the_one_transformers_applies(model_type, fields, window):
    """Each case against transformers' own config class: the window one of its layers gets."""
    import transformers

    cfg = parse_decoder({**BASE, "model_type": model_type, **fields}, "config.json")
    assert cfg.sliding_window == window
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[model_type]
    hf = cls(**{**BASE, **fields})
    types = getattr(hf, "layer_types", None) or ["full_attention"] * 4
    if model_type == "mistral":
        types = ["sliding_attention" if hf.sliding_window is not None else "full_attention"] * 4
    want = hf.sliding_window if "sliding_attention" in types else None
    assert window == want
    if window is None:
        assert "sliding_window" not in cfg.to_json()  # exports without a window read as before
    else:
        assert cfg.to_json()["sliding_window"] == window


def test_the_context_limit_stops_at_a_sliding_window(tmp_path):
    """A Mistral whose window (8) is shorter than its positions (256): the engines' context
    limit is the window by default (their full attention is the model's within it, checked
    against transformers' logits on 8 tokens), and --max-context past it is refused naming
    the sliding window."""
    import torch

    from specrt.engines import build_engines
    from specrt.engines.engine_set import load_engines
    from specrt.export.export import export
    from tests.fixtures_models import load_hf, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "mistral", sliding_window=8)
    assert json.loads((t / "config.json").read_text())["sliding_window"] == 8
    export(t, None, tmp_path / "exp")
    logs = []
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng", log=logs.append, profile_repeats=1,
                  profile_pasts=(4,))
    assert any("context limit 8, the target's sliding window" in m for m in logs), logs
    engines = load_engines(tmp_path / "eng")
    assert engines.max_context == 8
    from specrt.runtime.generate import Generator
    from specrt.runtime.governor import OffGovernor

    engines.activate()
    try:
        out = Generator(engines, OffGovernor((1, 2))).generate([5, 9, 2], 5)
    finally:
        engines.deactivate()
    hf = load_hf(t)
    with torch.no_grad():
        want = hf.generate(torch.tensor([[5, 9, 2]]), max_new_tokens=5, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, 3:].tolist()
    assert out == want
    with pytest.raises(UserError, match=r"--max-context 9 must be in 1\.\.8 \(the target's sliding window"):
        build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng2", log=lambda s: None,
                      profile_repeats=1, profile_pasts=(4,), max_context=9)
    assert not (tmp_path / "eng2").exists()


@pytest.mark.parametrize("fields", [{"partial_rotary_factor": 0.5},
                                    {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                         "partial_rotary_factor": 0.25}}])
def test_partial_rotary_embeddings_are_refused(fields):
    """transformers would rotate only part of each head (any rope type): refused, naming it;
    1.0 reads as the default."""
    with pytest.raises(UserError, match="partial_rotary_factor 0.25|partial_rotary_factor 0.5"):
        parse_decoder({**BASE, "model_type": "llama", **fields}, "config.json")
    cfg = parse_decoder({**BASE, "model_type": "llama", "partial_rotary_factor": 1.0}, "config.json")
    assert cfg.rope.rope_type == "default"
