"""export/config.py: what transformers' classes read from a config, read the same way here."""

from __future__ import annotations

import json
import re

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
    # mutant m2-C79: use_sliding_window true by default (the case above has no layer past max_window_layers)
    ("qwen3", {"sliding_window": 64, "max_window_layers": 0}, None),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, None),  # max_window_layers 28 >= 4 layers
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 2}, 64),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 4}, None),  # = the layers
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 3}, 64),  # the last one
    ("qwen3", {"use_sliding_window": True, "max_window_layers": 0}, 4096),
    ("qwen3", {"use_sliding_window": True, "sliding_window": None, "max_window_layers": 0}, None),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "layer_types": ["full_attention"] * 4}, None),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 9,
               "layer_types": ["full_attention"] * 3 + ["sliding_attention"]}, 32),
    # mutant m69c-M065: only the last layer's kind read (here the first layer is the sliding one)
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64,
               "layer_types": ["sliding_attention"] + ["full_attention"] * 3}, 64),
    # mutant m69c-M067: max_window_layers' default 28 taken as 24 (26 layers: none from 28 on)
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64, "num_hidden_layers": 26}, None),
    # mutant m69c-M075: layer_types checked against the attention heads (8 here), not the 4 layers
    ("qwen3", {"use_sliding_window": True, "sliding_window": 32, "num_attention_heads": 8,
               "layer_types": ["full_attention", "sliding_attention"] * 2}, 32),
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


@pytest.mark.parametrize("types", [["foo"] * 4, ["full_attention"], ["sliding_attention"] * 5])
@pytest.mark.parametrize("window", [{"use_sliding_window": True, "sliding_window": 32}, {}, {"sliding_window": None}])
@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_layer_types_that_transformers_refuses_are_refused(types, window, model_type):
    """A user walk: layer_types of unknown kinds, or not one a layer, exported without a word
    (transformers' Qwen2Config and Qwen3Config refuse both, whether a window applies or not)."""
    import transformers

    fields = {**window, "layer_types": types}
    with pytest.raises(UserError, match=r"^config.json: field 'layer_types' is .*; expected one of full_attention, "
                                        "sliding_attention for each of its 4 layers$"):
        parse_decoder({**BASE, "model_type": model_type, **fields}, "config.json")
    cls = transformers.Qwen3Config if model_type == "qwen3" else transformers.Qwen2Config
    with pytest.raises(Exception, match="layer_types"):  # (huggingface_hub's validation error)
        cls(**{**BASE, **fields})


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
    logs = []
    with pytest.raises(UserError, match=r"--max-context 9 must be in 5\.\.8 \(the target's sliding window"):
        build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng2", log=logs.append,
                      profile_repeats=1, profile_pasts=(4,), max_context=9)
    assert not (tmp_path / "eng2").exists()
    # the window is not the limit a --max-context build uses: not noted as one (M109 of session 64's
    # mutation round 4: build.py:258's note said whatever the option)
    assert not any("context limit" in m for m in logs), logs
    # a window as long as the positions limits nothing: the positions are named (B27 of session 69's
    # mutation round, `window < limit` -> `<=`: the sliding window named as the limit)
    t = write_tiny_target(tmp_path / "t256", "mistral", sliding_window=256)
    export(t, None, tmp_path / "exp256", log=logs.append)
    with pytest.raises(UserError, match=r"^--max-context 257 must be in 5\.\.256 \(the target's "
                                        r"max_position_embeddings\)$"):
        build_engines(tmp_path / "exp256", "onnxruntime", (1, 2), tmp_path / "eng3", log=logs.append,
                      max_context=257)


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


YARN = [  # (model_type, config fields): Qwen3's own recipe at full size, and the variants transformers reads
    ("qwen3", {"head_dim": 128, "rope_theta": 1e6, "max_position_embeddings": 131072,
               "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
    ("llama", {"rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2}}),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                                "attention_factor": 1.25, "truncate": False}}),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": None}, "original_max_position_embeddings": 64}),
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 3.0}}),  # original: max_position_embeddings
    # mutant m2-C24: mscale without mscale_all_dim is transformers' plain mscale(factor), not their ratio
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                "mscale": 0.707}}),
    # mutant m2-C16: both a top-level original_max_position_embeddings and the block's: transformers takes
    # the top level's (it moves it into the block), which the mutant read second
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
               "original_max_position_embeddings": 64}),
    # mutant m2-C26: beta_fast equal to beta_slow is read (transformers widens the empty ramp by 0.001)
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                "beta_fast": 4, "beta_slow": 4}}),
    # mutant m69c-M017: that widening taken as 0.01; untruncated, the one correction dimension here is
    # 3.995, so frequency 4 lies 0.005 past it: all kept by transformers' ramp, half by the mutant's
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                "beta_fast": 0.1024472, "beta_slow": 0.1024472, "truncate": False}}),
]


@pytest.mark.parametrize("model_type, fields", YARN)
def test_yarn_frequencies_and_attention_factor_are_transformers(model_type, fields):
    """YaRN's inverse frequencies and cos/sin factor as transformers computes them for the
    same config (its own config class and rope function), and through export.json and back."""
    import numpy as np
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specrt.export.config import DecoderConfig

    data = {**BASE, "model_type": model_type, **fields}
    # (a copy: transformers writes into the rope_scaling dict it is given, moving a top-level
    # original_max_position_embeddings and rope_theta into it, which specrt then read there)
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    cfg = parse_decoder(data, "config.json")
    assert cfg.rope.rope_type == "yarn"
    np.testing.assert_allclose(cfg.rope.inv_freq(), inv.numpy(), rtol=2e-6)
    assert cfg.rope.attention_factor == pytest.approx(factor, rel=1e-12)
    assert cfg.rope.attention_factor != 1.0 or "attention_factor" in str(fields)
    back = DecoderConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert back == cfg


def test_rope_fields_of_other_types_export_as_before():
    """Only a YaRN config writes YaRN's fields into export.json."""
    for fields in ({}, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}):
        d = parse_decoder({**BASE, "model_type": "llama", **fields}, "config.json").to_json()
        assert sorted(d["rope"]) == ["factor", "head_dim", "high_freq_factor", "low_freq_factor",
                                     "original_max_position_embeddings", "rope_type", "theta"]


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "yarn", "factor": 0.5}, "field 'factor' must be >= 1 for YaRN, found 0.5"),
    # a factor of 0 was taken as a null one (max_position_embeddings over the original length: 4 here),
    # where transformers divides by it (NaN frequencies); refused as 0.5 is
    ({"rope_type": "yarn", "factor": 0, "original_max_position_embeddings": 64},
     "field 'factor' must be >= 1 for YaRN, found 0"),
    ({"rope_type": "yarn", "factor": 2.0, "beta_fast": 1, "beta_slow": 4}, "beta_fast 1 must not be below beta_slow 4"),
    ({"rope_type": "yarn", "factor": 2.0, "truncate": "yes"}, "field 'truncate' must be bool"),
    ({"rope_type": "longrope", "factor": 2.0}, "rope_type 'longrope' is not supported"),
])
def test_bad_yarn_fields_are_named(scaling, message):
    with pytest.raises(UserError, match=message):
        parse_decoder({**BASE, "model_type": "qwen3", "rope_scaling": scaling}, "config.json")


@pytest.mark.parametrize("fields, message", [
    ({"rope_theta": -1.0}, "field 'rope_theta' must be a positive number, found -1"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
     r"config.json.rope_parameters: field 'rope_theta' must be a positive number, found 0"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, "field 'factor' must be a positive number"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 0}}, "field 'factor' must be a positive number"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 0, "low_freq_factor": 1, "high_freq_factor": 4}},
     "field 'factor' must be a positive number"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 4}},
     "high_freq_factor 4 must be above low_freq_factor 4"),
    # mutant m2-C06: the finiteness check dropped (an infinite theta or factor gives NaN frequencies)
    ({"rope_theta": float("inf")}, "field 'rope_theta' must be a positive number, found inf"),
    ({"rope_scaling": {"rope_type": "linear", "factor": float("inf")}}, "field 'factor' must be a positive number"),
    ({"rms_norm_eps": float("nan")}, "field 'rms_norm_eps' must be a small number >= 0, found nan"),
    ({"rms_norm_eps": -1e-6}, "field 'rms_norm_eps' must be a small number >= 0"),
])
def test_rope_and_norm_numbers_that_make_nan_are_named(fields, message):
    """A theta or factor of 0 or below, a llama3 band of width 0, a negative or NaN epsilon:
    each exported without a word before, into a graph whose logits are NaN."""
    with pytest.raises(UserError, match=message):
        parse_decoder({**BASE, "model_type": "llama", **fields}, "config.json")


def test_a_yarn_pair_decodes_as_transformers(tmp_path):
    """A Qwen3 target with YaRN (and a P-EAGLE draft whose layer config carries it) exported
    and built: without speculation and at fixed depth 2 the engines decode what
    transformers' generate decodes."""
    import torch

    from specrt.engines import build_engines
    from specrt.engines.engine_set import load_engines
    from specrt.export.export import export
    from specrt.runtime.generate import Generator
    from specrt.runtime.governor import FixedGovernor, OffGovernor
    from tests.fixtures_models import load_hf, write_tiny_draft, write_tiny_target

    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    t = write_tiny_target(tmp_path / "t", "qwen3", rope_parameters=yarn)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle")
    assert json.loads((d / "config.json").read_text())["transformer_layer_config"]["rope_parameters"]["rope_type"] == "yarn"
    export(t, d, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(4,))
    engines = load_engines(tmp_path / "eng")
    prompt = [5, 9, 2, 700, 41]
    engines.activate()
    try:
        off = Generator(engines, OffGovernor((1, 2))).generate(prompt, 12)
        spec = Generator(engines, FixedGovernor((1, 2), 2)).generate(prompt, 12)
    finally:
        engines.deactivate()
    with torch.no_grad():
        want = load_hf(t).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(prompt):].tolist()
    assert off == want
    assert spec == want


def test_dynamic_rope_has_the_default_frequencies_within_the_model_positions():
    """Dynamic NTK rescales only past max_position_embeddings (the engines' context limit):
    within it transformers' frequencies are the plain ones, and so are specrt's."""
    import numpy as np
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    data = {**BASE, "model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))  # (a copy: it writes into rope_scaling)
    inv, factor = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=BASE["max_position_embeddings"])
    cfg = parse_decoder(data, "config.json")
    assert (cfg.rope.rope_type, cfg.rope.factor, factor) == ("dynamic", 4.0, 1.0)
    np.testing.assert_allclose(cfg.rope.inv_freq(), inv.numpy(), rtol=2e-6)
    beyond, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=2 * BASE["max_position_embeddings"])
    assert not np.allclose(cfg.rope.inv_freq(), beyond.numpy(), rtol=1e-3)  # past it they would differ


# Llama 3.1 8B's and Qwen3's long-context RoPE settings (head_dim 128), and the other types on Llama's
LONG_ROPE = {
    "default": ("llama", {}),
    "linear": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "dynamic": ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}),
    "llama3": ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    "yarn": ("qwen3", {"rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 8.0,
                                                           "original_max_position_embeddings": 32768}}),
}


@pytest.mark.parametrize("head_dim", [128, 80])
@pytest.mark.parametrize("kind", LONG_ROPE)
def test_rope_tables_are_transformers_at_long_positions(kind, head_dim):
    """The in-place graph's cos/sin cache and the other graphs' in-graph tables against
    transformers' rotary embedding module at positions up to 131072: float32 frequencies
    (its own formula for each type), float32 angles, cos/sin times the attention factor. A
    float64 angle was 1e-4 off at 4096, 4e-3 at 131072. The frequencies: 0-2 ulps (theta to
    a power is 1 ulp apart on torch's AVX-512 path in some entries, 2e-6 at 131072 here); the
    tables from the same frequencies: float32 rounding. Head size 80 too: its exponents i/80
    are not exact in float32 (a float64 exponent was 4-16 ulps off there)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers

    from specrt.contracts import GraphIO, TensorSpec
    from specrt.export import onnx_ops as ops

    model_type, fields = LONG_ROPE[kind]
    data = {**BASE, "model_type": model_type, "num_attention_heads": 16, "hidden_size": 16 * head_dim,
            "head_dim": head_dim, "rope_theta": 500000.0, "max_position_embeddings": 262144, **fields}
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))  # (a copy: it writes into rope_scaling)
    module = {"llama": transformers.models.llama.modeling_llama.LlamaRotaryEmbedding,
              "qwen3": transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding}[model_type](hf)
    rope = parse_decoder(data, "config.json").rope
    assert rope.rope_type == kind
    inv = rope.inv_freq()
    assert inv.dtype == np.float32
    np.testing.assert_array_max_ulp(inv, module.inv_freq.numpy(), maxulp=2)

    positions = np.array([0, 1, 4095, 4096, 65536, 131071, 131072])
    half = rope.head_dim // 2

    def theirs(freqs=None):
        if freqs is not None:
            module.inv_freq = torch.from_numpy(freqs)
        with torch.no_grad():
            c, s = module(torch.zeros(1), torch.tensor(positions)[None])
        return c[0, :, :half].numpy(), s[0, :, :half].numpy()

    cos, sin = ops.rope_cache(rope, int(positions[-1]) + 1)
    b = ops.GraphBuilder("float32")
    c, s = ops.rope_tables(b, "position_ids", inv, rope.attention_factor)
    b.op("Identity", c, out="cos")
    b.op("Identity", s, out="sin")
    model = b.model(GraphIO((TensorSpec("position_ids", "int64", (1, "S")),),
                            (TensorSpec("cos", "float32", ("S", 1, 2 * half)),
                             TensorSpec("sin", "float32", ("S", 1, 2 * half)))), "rope")
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    g_cos, g_sin = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"position_ids": positions[None]})
    assert np.array_equal(g_cos[:, 0, :half], g_cos[:, 0, half:])
    assert np.array_equal(g_sin[:, 0, :half], -g_sin[:, 0, half:])  # (the graph's sin is [-sin, sin])
    ours = {"cache": (cos[positions], sin[positions]), "graph": (g_cos[:, 0, :half], g_sin[:, 0, half:])}
    hf_cos, hf_sin = theirs()
    for where, (oc, os_) in ours.items():
        np.testing.assert_allclose(oc, hf_cos, rtol=0, atol=1e-5, err_msg=where)
        np.testing.assert_allclose(os_, hf_sin, rtol=0, atol=1e-5, err_msg=where)
    hf_cos, hf_sin = theirs(inv)  # transformers' arithmetic on the same frequencies
    for where, (oc, os_) in ours.items():
        np.testing.assert_allclose(oc, hf_cos, rtol=0, atol=1.2e-7, err_msg=where)
        np.testing.assert_allclose(os_, hf_sin, rtol=0, atol=1.2e-7, err_msg=where)


@pytest.mark.parametrize("kind", LONG_ROPE)
def test_rope_cache_holds_no_whole_float64_table_and_keeps_its_values(kind):
    """The in-place graph's cos/sin cache is built a block of rows at a time: at 131072
    positions x 64 frequencies (two 34 MB float32 tables) the memory it takes beyond the
    tables stays under 16 MB (the whole-table float64 angle and its cos took 134 MB), and
    every value is the one of transformers' arithmetic on the same frequencies (float32
    position times frequency, as its matmul computes it), cos and sin correctly rounded, times
    the attention factor: bit for bit, at sizes on and off the block edges."""
    import tracemalloc

    import numpy as np
    import torch

    from specrt.export import onnx_ops as ops

    model_type, fields = LONG_ROPE[kind]
    data = {**BASE, "model_type": model_type, "num_attention_heads": 16, "hidden_size": 2048, "head_dim": 128,
            "rope_theta": 500000.0, "max_position_embeddings": 262144, **fields}
    rope = parse_decoder(data, "config.json").rope
    for n in (1, 4095, 4097, 131072):  # (ROPE_ROWS is 4096)
        tracemalloc.start()
        try:
            cos, sin = ops.rope_cache(rope, n)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert cos.shape == sin.shape == (n, 64) and cos.dtype == sin.dtype == np.float32
        assert peak - cos.nbytes - sin.nbytes < 16e6, (n, peak)
        with torch.no_grad():
            inv = torch.from_numpy(rope.inv_freq())[None, :, None]  # [1, D/2, 1] as transformers expands it
            angle = (inv @ torch.arange(n, dtype=torch.float32)[None, None, :]).transpose(1, 2)[0].double()
            scale = torch.tensor(rope.attention_factor, dtype=torch.float32)
            theirs = (angle.cos().float() * scale).numpy(), (angle.sin().float() * scale).numpy()
        assert np.array_equal(cos, theirs[0]) and np.array_equal(sin, theirs[1]), n


def test_llama3_frequencies_on_the_edge_of_the_band_are_transformers():
    """Llama 3.1 scaling where a wavelength is exactly original_max_position_embeddings /
    low_freq_factor in float32: transformers counts it in the smoothed band (neither shorter
    than the high edge nor longer than the low one), whose smoothing there divides it by
    the factor; a band of strict comparisons kept it unscaled."""
    import math

    import numpy as np
    import transformers

    base = {**BASE, "model_type": "llama", "num_attention_heads": 16, "hidden_size": 2048, "head_dim": 128,
            "rope_theta": 500000.0, "max_position_embeddings": 262144}
    inv = parse_decoder(base, "config.json").rope.inv_freq()
    wavelen = (np.float32(1) / inv) * np.float32(2 * math.pi)  # (as transformers computes it)
    edge = float(wavelen[np.flatnonzero((wavelen > 2048) & (wavelen < 8192))[0]])
    data = {**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 8192 / edge,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    assert np.float32(8192 / data["rope_scaling"]["low_freq_factor"]) in wavelen  # (on the edge)
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    theirs = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf).inv_freq.numpy()
    np.testing.assert_array_max_ulp(parse_decoder(data, "config.json").rope.inv_freq(), theirs, maxulp=2)


def test_an_eagle3_draft_with_norm_output_exports_and_decodes_as_the_target(tmp_path):
    """speculators' EAGLE-3 options norm_before_fc, norm_output (EAGLE 3.1, opt-in) and
    norm_before_residual: bound, exported, built, and the engines decode as transformers'
    generate at fixed depth 3 (the draft's steps feed each other its normed hidden state)."""
    import torch

    from specrt.engines import build_engines
    from specrt.engines.engine_set import load_engines
    from specrt.export.export import export
    from specrt.runtime.generate import Generator
    from specrt.runtime.governor import FixedGovernor
    from tests.fixtures_models import load_hf, write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="eagle3", norm_before_fc=True, norm_output=True,
                         norm_before_residual=True)
    m = export(t, d, tmp_path / "exp")
    assert m["draft"]["kind"] == "eagle3"
    build_engines(tmp_path / "exp", "onnxruntime", (1, 3), tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(4,))
    engines = load_engines(tmp_path / "eng")
    prompt = [5, 9, 2, 700]
    with engines:
        out = Generator(engines, FixedGovernor((1, 3), 3)).generate(prompt, 12)
    with torch.no_grad():
        want = load_hf(t).generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                                   pad_token_id=0)[0, len(prompt):].tolist()
    assert out == want


def test_the_default_proposal_method_gives_the_speculative_tokens(tmp_path):
    """speculators_config.default_proposal_method picks its entry of proposal_methods (as
    vLLM reads it); without a match, the first."""
    import shutil

    from specrt.export.config import load_draft_config

    from .conftest import REFERENCE

    d = tmp_path / "d"
    shutil.copytree(REFERENCE / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    first = dict(cfg["speculators_config"]["proposal_methods"][0])
    cfg["speculators_config"]["proposal_methods"] = [{**first, "proposal_type": "other", "speculative_tokens": 7},
                                                     {**first, "proposal_type": "greedy", "speculative_tokens": 4}]
    for default, want in (("greedy", 4), ("other", 7), ("none-such", 7)):
        cfg["speculators_config"]["default_proposal_method"] = default
        (d / "config.json").write_text(json.dumps(cfg))
        dc = load_draft_config(d)
        assert dc.speculative_tokens == want, default
        # a default naming no method is said (it was read as the first without a word), not kept in the receipt
        assert dc.notes == (() if default != "none-such" else (
            f"warning: {d / 'config.json'}.speculators_config: default_proposal_method 'none-such' names none of "
            "proposal_methods' proposal_type ('other', 'greedy'): read the first, as vLLM does",)), dc.notes
        assert "notes" not in dc.to_json()
    # a user walk: 10**9 exported without a word (the deepest verify depth is 64)
    for k, ok in ((64, True), (65, False), (10 ** 9, False)):
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = k  # (the first: no default)
        (d / "config.json").write_text(json.dumps(cfg))
        if ok:
            assert load_draft_config(d).speculative_tokens == k
        else:
            with pytest.raises(UserError, match=rf"proposal_methods\[0\]: field 'speculative_tokens' is {k}; "
                                                "expected at most 64"):
                load_draft_config(d)


def test_architectures_naming_the_other_kind_are_said(tmp_path):
    """architectures naming an EAGLE-3 class on a P-EAGLE draft (speculators_model_type
    peagle) were read without a word: read by speculators_model_type, as vLLM picks the
    draft's model, and said by export and inspect."""
    import shutil

    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.export.config import load_draft_config
    from specrt.export.export import export

    from .conftest import REFERENCE

    d = tmp_path / "d"
    shutil.copytree(REFERENCE / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    for archs, said in ((["PEagleDraftModel"], False), (["Eagle3DraftModel"], True), (["Eagle3Speculator"], True),
                        (["LlamaForCausalLMEagle3"], True),  # (C63: EAGLE's own class, by its whole name)
                        (["LlamaForCausalLMEagle3X"], False), (["SomethingElse"], False), ("notalist", False)):
        (d / "config.json").write_text(json.dumps({**cfg, "architectures": archs}))
        dc = load_draft_config(d)
        assert dc.kind == "peagle" and bool(dc.notes) == said, (archs, dc.notes)
        if said:
            assert dc.notes == (f"warning: {d / 'config.json'}: architectures {archs!r} names the draft kind eagle3, "
                                "speculators_model_type 'peagle': read as peagle, as vLLM reads it",)
            r = CliRunner().invoke(main, ["inspect", str(REFERENCE / "verifier"), "--draft", str(d)])
            assert r.exit_code == 0 and dc.notes[0] in r.output, r.output
            said: list[str] = []
            export(REFERENCE / "verifier", d, tmp_path / archs[0], log=said.append)
            assert dc.notes[0] in said, said


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_drafts_sliding_window_is_recorded_and_said(tmp_path, model_type):
    """speculators (v0.7+) trains draft layers on the sliding window layer_types marks,
    llama or qwen3 alike: export.json records it and the build says when the context goes
    past it (the draft then sees more than it was trained on; output stays exact)."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", model_type)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"].update(sliding_window=16, layer_types=["sliding_attention"] * 2,
                                           use_sliding_window=True)
    (d / "config.json").write_text(json.dumps(cfg))
    m = export(t, d, tmp_path / "exp")
    assert m["draft"]["sliding_window"] == m["draft"]["attention_window"] == 16  # every layer: applied
    logs: list[str] = []
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng", log=logs.append, profile_repeats=1,
                  profile_pasts=(4,), max_context=64)
    assert any("the draft attends to the last 16 tokens, its sliding window" in s for s in logs), logs
    # a context within the window: nothing to say (B32 of session 69's mutation round said it whatever the context)
    logs.clear()
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng16", log=logs.append, profile_repeats=1,
                  profile_pasts=(4,), max_context=16)
    assert not any("sliding window" in s for s in logs), logs
    # a mix of sliding and full layers: recorded, not applied, and said
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention", "full_attention"])
    (d / "config.json").write_text(json.dumps(cfg))
    m = export(t, d, tmp_path / "exp-mixed")
    assert m["draft"]["sliding_window"] == 16 and "attention_window" not in m["draft"]
    logs = []
    build_engines(tmp_path / "exp-mixed", "onnxruntime", (1, 2), tmp_path / "eng-mixed", log=logs.append,
                  profile_repeats=1, profile_pasts=(4,), max_context=64)
    assert any("note: the draft was trained attending to the last 16 tokens on some" in s for s in logs), logs
    plain = export(t, write_tiny_draft(tmp_path / "d2", t, kind="peagle"), tmp_path / "exp2")
    assert "sliding_window" not in plain["draft"]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("left_out", [("tie_word_embeddings",), ("head_dim",), ("num_key_value_heads", "head_dim"),
                                      ("max_position_embeddings",), ("rope_theta",)])
def test_a_field_left_out_takes_its_familys_transformers_default(model_type, left_out):
    """Each against transformers' own config class built from the same fields (its defaults:
    no tie for any of the four, Qwen3's head_dim 128, Mistral's 8 / Qwen's 32 KV heads,
    each family's max_position_embeddings)."""
    import transformers

    fields = {k: v for k, v in {**BASE, "num_attention_heads": 32, "hidden_size": 2048}.items() if k not in left_out}
    cfg = parse_decoder({**fields, "model_type": model_type}, "config.json")
    cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
           "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[model_type]
    hf = cls(**fields)
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg.head_dim == (getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
    assert cfg.num_kv_heads == hf.num_key_value_heads
    assert cfg.max_position_embeddings == hf.max_position_embeddings
    assert cfg.rope.theta == hf.rope_parameters["rope_theta"]


def test_the_eos_ids_are_generation_configs_before_configs(tmp_path):
    """transformers' generate() stops at generation_config.json's eos_token_id; config.json's
    is the fallback when that file is absent or names none."""
    from specrt.export.config import load_target_config

    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "llama", "eos_token_id": 2,
                                                      "architectures": ["LlamaForCausalLM"]}))
    assert load_target_config(tmp_path).eos_token_ids == (2,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    assert load_target_config(tmp_path).eos_token_ids == (5, 6)
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False}))
    assert load_target_config(tmp_path).eos_token_ids == (2,)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_explicit_nulls_and_fields_transformers_fills_take_its_values(model_type):
    """num_key_value_heads null is as many as the attention heads (it was read as the class
    default, 32 for Qwen3, and refused); rms_norm_eps and llama3's original length absent
    take transformers' defaults (they were refused)."""
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[model_type]
    fields = {**{k: v for k, v in BASE.items() if k != "rms_norm_eps"}, "num_attention_heads": 4,
              "num_key_value_heads": None, "max_position_embeddings": 4096,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
              "rope_theta": 500000.0}
    cfg = parse_decoder({**fields, "model_type": model_type}, "config.json")
    hf = cls(**fields)
    assert cfg.num_kv_heads == hf.num_key_value_heads == 4
    assert cfg.rms_norm_eps == hf.rms_norm_eps
    assert cfg.rope.original_max_position_embeddings == hf.rope_parameters["original_max_position_embeddings"] == 4096


NULLS = [(model_type, fields) for model_type in ("llama", "mistral", "qwen2", "qwen3")
         for fields in ({"num_key_value_heads": None}, {"head_dim": None})]


@pytest.mark.parametrize("model_type, fields", NULLS)
def test_a_null_head_count_or_size_is_read_as_transformers_reads_it(model_type, fields):
    """A null num_key_value_heads or head_dim: where transformers' config class and model take
    it, the same heads and head size (as many KV heads as attention heads, hidden_size over
    them); where either refuses it (Mistral's KV heads, Qwen3's and Qwen2's head_dim), a
    UserError naming the field. Both were taken, Qwen3's null head_dim as 128."""
    import transformers
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    data = {**BASE, "model_type": model_type, **fields}
    try:
        hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
        attn = transformers.AutoModelForCausalLM.from_config(hf).model.layers[0].self_attn
    except (StrictDataclassFieldValidationError, TypeError):  # (the config class's, the model's)
        (key,) = fields
        with pytest.raises(UserError, match=rf"^config.json: field '{key}' must be int, found null \(transformers "
                                            rf"refuses a null one for {model_type}"):
            parse_decoder(data, "config.json")
        return
    cfg = parse_decoder(data, "config.json")
    assert (cfg.num_kv_heads, cfg.head_dim) == (attn.k_proj.out_features // attn.head_dim, attn.head_dim)


@pytest.mark.parametrize("model_type, fields, message", [
    ("mistral", {"num_key_value_heads": None}, ": field 'num_key_value_heads' must be int, found null"),
    ("qwen3", {"head_dim": None}, ": field 'head_dim' must be int, found null"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "original_max_position_embeddings": 32}},
     ".rope_parameters: missing required field 'factor'"),
])
def test_configs_transformers_refuses_are_refused_by_export(tmp_path, model_type, fields, message):
    """specrt export on a checkpoint whose config.json transformers does not load (it raises):
    exit 1, the file and field named, no traceback, no export folder. A YaRN block without
    factor is refused (a null factor is taken, as there: the ratio of the two lengths)."""
    import transformers
    from click.testing import CliRunner
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    from specrt.cli import main
    from tests.fixtures_models import write_tiny_target

    t = write_tiny_target(tmp_path / "t", model_type)
    cfg = {**json.loads((t / "config.json").read_text()), **fields}
    with pytest.raises((StrictDataclassFieldValidationError, KeyError)):
        transformers.AutoConfig.for_model(**json.loads(json.dumps(cfg)))
    (t / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(main, ["export", str(t), "-o", str(tmp_path / "exp")])
    assert r.exit_code == 1, r.output
    assert f"{t / 'config.json'}{message}" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "exp").exists()
    if "rope_parameters" in fields:
        cfg["rope_parameters"]["factor"] = None
        assert parse_decoder(cfg, "config.json").rope.factor == cfg["max_position_embeddings"] / 32


def test_rope_parameters_beside_rope_scaling_are_refused():
    """transformers 5 reads rope_scaling over rope_parameters (theta included) and 4.x knows
    rope_scaling only: specrt read rope_parameters, and a Qwen3 config given a YaRN block as
    its model card says gave logits 0.37 off transformers'. Refused, naming both."""
    fields = {**BASE, "model_type": "qwen3", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}
    with pytest.raises(UserError, match="rope_parameters and rope_scaling differ"):
        parse_decoder(fields, "config.json")
    parse_decoder({**fields, "rope_scaling": None}, "config.json")  # a null one is no second reading
    # the two saying the same (a model card's config kept readable by transformers 4 and 5)
    yarn = {"factor": 4.0, "original_max_position_embeddings": 128}
    cfg = parse_decoder({**fields, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, **yarn},
                         "rope_scaling": {"type": "yarn", **yarn}, "rope_theta": 1e6}, "config.json")
    assert cfg.rope.rope_type == "yarn" and cfg.rope.theta == 1e6
    with pytest.raises(UserError, match="differ"):  # same block, another theta
        parse_decoder({**fields, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, **yarn},
                       "rope_scaling": {"type": "yarn", **yarn}, "rope_theta": 1e4}, "config.json")
    with pytest.raises(UserError, match="differ"):  # a theta only rope_parameters names: transformers
        parse_decoder({k: v for k, v in {  # would run its class default
            **fields, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, **yarn},
            "rope_scaling": {"type": "yarn", **yarn}}.items() if k != "rope_theta"}, "config.json")


def test_attention_bias_is_refused_where_transformers_gives_o_proj_one():
    """Llama / Mistral / Qwen3 with attention_bias=true carry a bias on o_proj too (no graph
    here has one): refused by name, not by a list of leftover tensors. Qwen2's config class
    has no such field (its q/k/v biases are the architecture's)."""
    for model_type in ("llama", "mistral", "qwen3"):
        with pytest.raises(UserError, match="attention_bias=true .*o_proj.* is not supported"):
            parse_decoder({**BASE, "model_type": model_type, "attention_bias": True}, "config.json")
    assert parse_decoder({**BASE, "model_type": "qwen2", "attention_bias": True}, "config.json").qkv_bias


def test_a_float16_export_refuses_weights_past_its_range():
    """A bf16 / fp32 weight above 65504 would become inf in float16 without a word."""
    import numpy as np

    from specrt.export.onnx_ops import to_tensor

    with pytest.raises(UserError, match="weight 'layers.3.down' holds 7e\\+04, past float16's range"):
        to_tensor("layers.3.down", np.array([1.0, -7e4, np.inf], np.float32), "float16")
    assert to_tensor("w", np.array([1.0, -6e4], np.float32), "float16").data_type == 10  # FLOAT16
    assert to_tensor("w", np.array([-65504.0], np.float32), "float16").data_type == 10  # float16's largest


def _draft_with(tmp_path, **changes):
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="eagle3")
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("ids", [[3, 1, 2], [2, 2, 3]])
def test_aux_layer_ids_out_of_layer_order_or_repeated_are_refused(tmp_path, ids):
    """vLLM hands an EAGLE-3 draft its target's states in layer order (a repeated id once),
    and speculators trains on them as stored: [3, 1, 2] was concatenated in list order here,
    a draft's fc reading its inputs in the wrong slots (acceptance collapses, losslessly)."""
    from specrt.export.config import load_draft_config

    d = _draft_with(tmp_path, eagle_aux_hidden_state_layer_ids=ids)
    with pytest.raises(UserError, match="must be distinct and ascending"):
        load_draft_config(d)
    d = _draft_with(tmp_path / "ok", eagle_aux_hidden_state_layer_ids=[1, 2, 3])
    assert load_draft_config(d).aux_layer_ids == (1, 2, 3)


@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
def test_a_speculators_draft_with_both_fc_norms_is_refused(tmp_path, kind):
    """One norm over the concatenated aux states (norm_before_fc) or one per state (fc_norm):
    speculators added fc_norm in its PR #670 (v0.7.0) with a check refusing the pair, and no
    release before it had the field, so no speculators release wrote such a draft; vLLM would
    run both norms, SGLang neither. Refused as the EAGLE-format config is, naming the file."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind=kind, norm_before_fc=True, fc_norm=True)
    with pytest.raises(UserError, match=rf"^{d}/config.json: fc_norm and norm_before_fc are both true \(vLLM then "
                                        r"runs both norms before fc.*expected one of them"):
        load_draft_config(d)
    for one in ("fc_norm", "norm_before_fc"):  # each alone is read
        d = write_tiny_draft(tmp_path / one, t, kind=kind, **{one: True})
        assert getattr(load_draft_config(d), one)


def test_a_mistral_draft_layer_windows_every_layer(tmp_path):
    """transformers windows every layer of a Mistral layer config (no layer_types needed):
    the draft graph does too (it was recorded, not applied, and called a mix of kinds)."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "mistral", sliding_window=16)
    d = write_tiny_draft(tmp_path / "d", t, kind="eagle3")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"]["sliding_window"] = 16
    (d / "config.json").write_text(json.dumps(cfg))
    dc = load_draft_config(d)
    assert dc.decoder.sliding_window == dc.attention_window == 16
    # layer_types marking a mix of kinds is what the layers get, Mistral or not: recorded, not applied
    # (mutant m69c-M097 windowed every Mistral layer whatever layer_types said)
    cfg["transformer_layer_config"]["layer_types"] = ["sliding_attention", "full_attention"]
    (d / "config.json").write_text(json.dumps(cfg))
    dc = load_draft_config(d)
    assert dc.decoder.sliding_window == 16 and dc.attention_window is None


def test_layer_types_past_the_draft_layers_leave_every_layer_windowed(tmp_path):
    """layer_types listing more kinds than the draft has layers (a verifier's list): the draft's
    own layers' kinds decide, here both sliding, so the window is applied (mutant m69c-M096
    read the kinds of layers the draft does not have and applied none)."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="eagle3")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2 + ["full_attention"] * 2,
                                           sliding_window=16)
    (d / "config.json").write_text(json.dumps(cfg))
    dc = load_draft_config(d)
    assert dc.decoder.sliding_window == dc.attention_window == 16


@pytest.mark.parametrize("scaling", [{"rope_type": "default", "rope_theta": 5e5},
                                     {"type": "linear", "factor": 2.0, "rope_theta": 1e6}])
@pytest.mark.parametrize("top_theta", [None, 1e4])
def test_a_theta_inside_rope_scaling_is_the_one_transformers_runs(scaling, top_theta):
    """A rope_scaling block naming its own rope_theta (no rope_parameters): transformers moves
    the block to rope_parameters and runs its theta, the top level's only filling a missing
    one. specrt read the top level's (or 10000): logits about 4 off transformers' on a tiny model."""
    import numpy as np
    import transformers

    fields = {**{k: v for k, v in BASE.items() if k != "rope_theta"}, "rope_scaling": dict(scaling)}
    if top_theta is not None:
        fields["rope_theta"] = top_theta
    cfg = parse_decoder({**fields, "model_type": "llama"}, "config.json")
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**json.loads(json.dumps(fields))))
    assert cfg.rope.theta == scaling["rope_theta"]
    np.testing.assert_allclose(cfg.rope.inv_freq(), hf.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)


@pytest.mark.parametrize("fields, message", [
    # mutant c01: the odd-head_dim check dropped (RoPE rotates pairs of dimensions)
    ({"head_dim": 15}, "head_dim 15 must be even for RoPE"),
    # mutant c02: hidden_act 'gelu' let through (every graph here runs SwiGLU with silu)
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (expected 'silu')"),
    # mutant c08: heads % kv_heads replaced by kv_heads > heads (4 heads cannot share 3 KV heads)
    ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    # mutant c09: hidden % heads dropped (head_dim from hidden_size: 66 over 4 heads)
    ({"hidden_size": 66, "head_dim": None}, "hidden_size 66 is not divisible by num_attention_heads 4"),
    # mutant c04: a JSON true taken as the int 1 (bool is an int subclass)
    ({"num_hidden_layers": True}, "field 'num_hidden_layers' must be int, found True"),
    ({"num_key_value_heads": False}, "field 'num_key_value_heads' must be int, found False"),
    # mutant c10: the mlp_bias check dropped (transformers then adds biases to gate/up/down_proj)
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    # mutant c14: rms_norm_eps' finiteness check dropped (an infinite eps zeroes every normed state)
    ({"rms_norm_eps": float("inf")}, "field 'rms_norm_eps' must be a small number >= 0, found inf"),
    # mutant m69c-M032: counts' lower bound taken as 0 (a decoder of no layers, heads or vocabulary)
    ({"num_hidden_layers": 0}, "field 'num_hidden_layers' must be >= 1, found 0"),
    ({"vocab_size": 0}, "field 'vocab_size' must be >= 1, found 0"),
])
def test_decoder_shapes_the_graphs_cannot_run_are_refused_naming_the_field(fields, message):
    """A head shape or activation the Llama-family graphs do not compute is refused, naming
    the file and the field, never exported into a graph that differs from transformers."""
    with pytest.raises(UserError, match="^" + re.escape("config.json: " + message)):
        parse_decoder({**BASE, "model_type": "llama", **fields}, "config.json")


@pytest.mark.parametrize("fields", [
    # mutant r06: YaRN's ramp top clipped to head_dim instead of head_dim - 1 (a low theta puts
    # beta_slow's correction dimension, 15.07 here, past the 16-wide head's last index, while
    # beta_fast's, 6.9, leaves part of the ramp inside the head's 8 frequencies)
    {"rope_theta": 30.0, "max_position_embeddings": 15200,
     "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 3800}},
    # mutant r15: llama3 without original_max_position_embeddings takes 8192, where transformers 5
    # fills max_position_embeddings (4096 here)
    {"rope_theta": 500000.0, "max_position_embeddings": 4096,
     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
])
def test_rope_frequencies_where_transformers_fills_or_clips_are_its_own(fields):
    """The frequencies of a RoPE block transformers completes (llama3's original length) or
    clips (YaRN's correction range at the head's last dimension) are the ones its rotary
    embedding computes."""
    import json

    import numpy as np
    import transformers

    from specrt.export.config import parse_decoder

    data = {**BASE, "model_type": "llama", **fields}
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    theirs = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(hf).inv_freq.numpy()
    np.testing.assert_array_max_ulp(parse_decoder(data, "config.json").rope.inv_freq(), theirs, maxulp=2)


def test_a_llama3_block_without_low_freq_factor_is_refused_as_transformers_refuses_it():
    """mutant r18: low_freq_factor made optional (default 1.0) for llama3: transformers raises
    on the missing key; specrt names the block and the field."""
    import json

    import transformers

    from specrt.errors import UserError
    from specrt.export.config import parse_decoder

    data = {**BASE, "model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64}}
    with pytest.raises(KeyError, match="low_freq_factor"):
        transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    with pytest.raises(UserError, match=r"^config\.json\.rope_scaling: missing required field 'low_freq_factor'$"):
        parse_decoder(data, "config.json")


@pytest.mark.parametrize("scaling, key", [
    # mutant m69c-M048: llama3's high_freq_factor made optional (4.0 taken)
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 64},
     "high_freq_factor"),
    # mutant m69c-M050: linear's factor made optional (1.0 taken: no scaling at all)
    ({"rope_type": "linear"}, "factor"),
    ({"type": "dynamic"}, "factor"),
])
def test_a_rope_block_without_a_key_transformers_requires_is_refused(scaling, key):
    """transformers raises on a RoPE block of a scaled type without its factor (or llama3's
    band edges): specrt refuses it naming the block and the field, never taking a default."""
    import transformers

    data = {**BASE, "model_type": "llama", "rope_scaling": scaling}
    with pytest.raises(KeyError, match=key):
        transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    with pytest.raises(UserError, match=rf"^config\.json\.rope_scaling: missing required field '{key}'$"):
        parse_decoder(data, "config.json")


def test_rope_parameters_and_rope_scaling_saying_the_same_default_are_read():
    """mutant r23: the comparison's normalisation dropped (a block without rope_type is the
    default type; 'type' is 'rope_type'): two blocks that say the same were refused as differing."""
    from specrt.export.config import parse_decoder

    cfg = parse_decoder({**BASE, "model_type": "llama", "rope_parameters": {"rope_theta": 1e4},
                         "rope_scaling": {"type": "default", "rope_theta": 1e4}}, "config.json")
    assert cfg.rope.rope_type == "default" and cfg.rope.theta == 1e4


@pytest.mark.parametrize("change, message", [
    # mutant d05: mask_token_id made optional for P-EAGLE (its parallel slots are that token's embedding)
    (lambda c: c.pop("mask_token_id"), r"config\.json: missing required field 'mask_token_id'$"),
    # mutant d08: an algorithm naming the other kind taken (only checked against the supported kinds)
    (lambda c: c["speculators_config"].update(algorithm="eagle3"),
     r"config\.json\.speculators_config: algorithm 'eagle3' disagrees with speculators_model_type 'peagle'$"),
    # mutant m69c-M098: an empty proposal_methods let through (an IndexError traceback)
    (lambda c: c["speculators_config"].update(proposal_methods=[]),
     r"config\.json\.speculators_config: proposal_methods must be a non-empty list of objects$"),
])
def test_a_peagle_config_missing_its_mask_or_naming_another_algorithm_is_refused(tmp_path, change, message):
    """A P-EAGLE config without mask_token_id, or whose speculators_config.algorithm names the
    other kind, is refused naming the file and field (specrt export: exit 1, no folder)."""
    import json

    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.errors import UserError
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle")
    cfg = json.loads((d / "config.json").read_text())
    assert load_draft_config(d).kind == "peagle"
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=message):
        load_draft_config(d)
    r = CliRunner().invoke(main, ["export", str(t), "--draft", str(d), "-o", str(tmp_path / "exp")])
    assert r.exit_code == 1 and "Traceback" not in r.output and not (tmp_path / "exp").exists(), r.output
    assert str(d / "config.json") in r.output, r.output


def test_a_yarn_factor_of_one_and_an_epsilon_of_zero_are_read_as_transformers_reads_them():
    """The edges of two range checks: YaRN's factor 1 (no interpolation: attention factor 1,
    the default frequencies) and rms_norm_eps 0 are configs transformers runs, read the same
    (mutant m2-C22 refused factor 1 as "must be >= 1", m2-C41 an epsilon of 0 as negative)."""
    import numpy as np
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    data = {**BASE, "model_type": "llama", "rms_norm_eps": 0.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 256}}
    hf = transformers.AutoConfig.for_model(**json.loads(json.dumps(data)))
    inv, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    cfg = parse_decoder(data, "config.json")
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.attention_factor, factor) == ("yarn", 1.0, 1.0, 1.0)
    np.testing.assert_allclose(cfg.rope.inv_freq(), inv.numpy(), rtol=2e-6)
    assert cfg.rms_norm_eps == hf.rms_norm_eps == 0.0


@pytest.mark.parametrize("fields, message", [
    # mutant m2-C43: the ids' lower bound dropped (a negative id indexes the logits from the end)
    ({"eos_token_id": -1}, r"field 'eos_token_id' must be a token id or a list of them, found -1$"),
    ({"bos_token_id": [3, -2]}, r"field 'bos_token_id' must be a token id or a list of them, found \[3, -2\]$"),
    # mutant m2-C47: a class of another family than model_type taken (the weights are read by model_type)
    ({"architectures": ["MistralForCausalLM"]},
     r"architectures\[0\] is 'MistralForCausalLM', expected 'LlamaForCausalLM' for model_type 'llama'$"),
    # mutant m69c-M083: model_type's class taken anywhere in the list (the first is the one recorded)
    ({"architectures": ["MistralForCausalLM", "LlamaForCausalLM"]},
     r"architectures\[0\] is 'MistralForCausalLM', expected 'LlamaForCausalLM' for model_type 'llama'$"),
    # mutants m69c-M081 / M082: an empty list (an IndexError traceback), a name that is no string
    ({"architectures": []}, r"field 'architectures' must be a non-empty list of class names$"),
    ({"architectures": ["LlamaForCausalLM", 7]}, r"field 'architectures' must be a non-empty list of class names$"),
])
def test_a_target_config_naming_a_bad_token_id_or_another_class_is_refused_naming_the_file(tmp_path, fields, message):
    """load_target_config refuses a negative EOS/BOS id and an architectures[0] that is not
    model_type's class, naming config.json and the field; 0 is a token id like any other."""
    from specrt.export.config import load_target_config

    base = {**BASE, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps({**base, **fields}))
    with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path / 'config.json'}: ") + message):
        load_target_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**base, "eos_token_id": 0, "bos_token_id": [0]}))
    cfg = load_target_config(tmp_path)
    assert (cfg.eos_token_ids, cfg.bos_token_id) == ((0,), 0)
    # a list of BOS ids: the first is the one recorded (mutant m69c-M086 took the last)
    (tmp_path / "config.json").write_text(json.dumps({**base, "bos_token_id": [1, 5]}))
    assert load_target_config(tmp_path).bos_token_id == 1


def test_a_peagle_mask_token_of_id_zero_and_an_empty_verifier_name_are_read(tmp_path):
    """mask_token_id 0 is a token id (mutant m2-C60 refused it as below 1; -1 stays refused);
    an empty verifier name_or_path is no name (mutant m2-C62 recorded "" in the receipt)."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", mask_token_id=0)
    cfg = json.loads((d / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = ""
    (d / "config.json").write_text(json.dumps(cfg))
    dc = load_draft_config(d)
    assert dc.mask_token_id == 0 and dc.verifier_name is None and "verifier_name" not in dc.to_json()
    (d / "config.json").write_text(json.dumps({**cfg, "mask_token_id": -1}))
    with pytest.raises(UserError, match=rf"^{d}/config.json: field 'mask_token_id' must be >= 0, found -1$"):
        load_draft_config(d)


@pytest.mark.parametrize("window", [0, None, True])
def test_a_draft_layer_marked_sliding_without_a_window_attends_to_everything(tmp_path, window):
    """layer_types marking a draft's layers sliding with a sliding_window that is no window
    (0, null, a bool): no window is recorded or applied (mutant m2-C81 took any value: a
    window of 0 tokens, or of True)."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    d = write_tiny_draft(tmp_path / "d", t, kind="eagle3")
    cfg = json.loads((d / "config.json").read_text())
    cfg["transformer_layer_config"].update(layer_types=["sliding_attention"] * 2, sliding_window=window)
    (d / "config.json").write_text(json.dumps(cfg))
    dc = load_draft_config(d)
    assert dc.decoder.sliding_window is None and dc.attention_window is None


def test_a_hand_edited_decoder_record_is_a_user_error():
    """export.json's target.decoder read back (engines/build.py): an unknown or missing
    field is a UserError naming the record and the remedy, not a traceback (mutant m2-C78
    caught a missing key only: an unknown one raised TypeError out of the dataclass)."""
    from specrt.export.config import DecoderConfig

    d = parse_decoder({**BASE, "model_type": "llama"}, "config.json").to_json()
    assert DecoderConfig.from_json(d).to_json() == d
    for bad, error in (({**d, "colour": 1}, "TypeError"), ({**d, "rope": {**d["rope"], "kind": 2}}, "TypeError"),
                       ({k: v for k, v in d.items() if k != "rope"}, "KeyError")):
        with pytest.raises(UserError, match=rf"^export\.json: target\.decoder is malformed \({error}: .*make the "
                                            r"export again with `specrt export`$"):
            DecoderConfig.from_json(bad)


def test_a_draft_reads_up_to_sixteen_aux_layers(tmp_path):
    """eagle_aux_hidden_state_layer_ids of 1 to MAX_AUX (16) ids: 16 is read, 17 and none are
    refused naming the file and the bound (mutant m2-C58 refused 16, the fc_norm slot table's size)."""
    from specrt.export.config import MAX_AUX, load_draft_config

    assert MAX_AUX == 16
    d = _draft_with(tmp_path, eagle_aux_hidden_state_layer_ids=list(range(16)))
    assert load_draft_config(d).aux_layer_ids == tuple(range(16))
    # (mutant m69c-M103: a JSON true taken as layer 1, a bool being an int)
    for n, ids in enumerate(([], list(range(17)), [True, 2, 3])):
        d = _draft_with(tmp_path / str(n), eagle_aux_hidden_state_layer_ids=ids)
        with pytest.raises(UserError, match=rf"^{d}/config.json: eagle_aux_hidden_state_layer_ids must be a list of 1 "
                                            r"to 16 layer ids \(speculators' default is 3\), found \["):
            load_draft_config(d)


def test_a_config_json_that_is_no_file_is_refused_naming_it(tmp_path):
    """A folder whose config.json is a directory: refused as a missing config, naming it, for the
    target and the draft alike (mutant m69c-M028 checked only that the path exists: an
    IsADirectoryError traceback)."""
    from specrt.export.config import load_draft_config, load_target_config

    (tmp_path / "config.json").mkdir()
    for load in (load_target_config, load_draft_config):
        with pytest.raises(UserError, match=rf"^{tmp_path}/config.json: not found \(expected a JSON config file\)"):
            load(tmp_path)


def test_the_target_and_draft_folders_given_the_wrong_way_round_are_refused_saying_so(tmp_path):
    """A speculators draft's folder read as the target, a transformers model's as the draft:
    each refused saying which it is and where it goes (mutant m69c-M080 read the draft's config
    as a target's: "missing required field 'model_type'", no word of the order)."""
    from specrt.export.config import load_draft_config, load_target_config

    from .conftest import REFERENCE

    draft, target = REFERENCE / "draft" / "config.json", REFERENCE / "verifier" / "config.json"
    with pytest.raises(UserError, match=rf"^{draft}: a speculators draft \(speculators_model_type 'peagle'\), not a "
                                        r"target model: give the target's folder first and this one with --draft$"):
        load_target_config(REFERENCE / "draft")
    with pytest.raises(UserError, match=rf"^{target}: a transformers model \(model_type 'llama'\), not a speculators "
                                        r"draft \(no speculators_model_type\): --draft takes the draft's folder"):
        load_draft_config(REFERENCE / "verifier")


def test_a_speculators_draft_leaving_out_its_norm_flags_reads_speculators_defaults(tmp_path):
    """norm_before_residual, norm_output, norm_before_fc and fc_norm absent: each false, as
    speculators' config classes default them and vLLM reads them (mutants m69c-M106 / M107
    took a missing norm_before_residual / norm_output as true: another draft graph)."""
    import shutil

    from specrt.export.config import load_draft_config

    from .conftest import REFERENCE

    d = tmp_path / "d"
    shutil.copytree(REFERENCE / "draft", d)
    cfg = json.loads((d / "config.json").read_text())
    flags = ("norm_before_residual", "norm_output", "norm_before_fc", "fc_norm")
    assert all(cfg[k] is False for k in flags)
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k not in flags}))
    dc = load_draft_config(d)
    assert [getattr(dc, k) for k in flags] == [False] * 4
