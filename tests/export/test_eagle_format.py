"""EAGLE-3 drafts in EAGLE's own format (SafeAILab's EAGLE, SGLang's SpecForge, ModelOpt's export), read directly.

Each test writes a speculators-format draft with the fixtures, rewrites the same weights into
EAGLE's layout (config.json a Llama config with LlamaForCausalLMEagle3, the one layer named
midlayer.*) and checks that both export to drafts that compute the same thing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from specrt import contracts as C
from specrt.cli import main
from specrt.export.export import export
from tests.fixtures_models import write_tiny_draft, write_tiny_target

LAYER_FIELDS = ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "rms_norm_eps", "vocab_size", "max_position_embeddings", "rope_parameters",
                "num_hidden_layers", "hidden_act", "tie_word_embeddings")


def to_eagle(src: Path, dst: Path, ids: list[int] | None = None, pickle: bool = False, drop: tuple[str, ...] = (),
             extra: dict[str, str] | None = None, **config) -> Path:
    """The speculators draft at ``src`` in EAGLE's layout at ``dst``: layers.0.* as midlayer.*, the
    layer config at the top level beside architectures and draft_vocab_size, the aux ids (as
    written, if any) in SpecForge's eagle_config; a pytorch_model.bin with ``pickle``; ``extra``:
    new name -> the (EAGLE) name whose tensor it copies."""
    spec = json.loads((src / "config.json").read_text())
    cfg = {k: spec["transformer_layer_config"][k] for k in LAYER_FIELDS}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=spec["draft_vocab_size"])
    if spec["fc_norm"]:
        cfg["fc_norm"] = True
    if ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    cfg.update(config)
    w = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
         for k, v in load_file(str(src / "model.safetensors")).items()}
    w = {k: v for k, v in w.items() if k not in drop}
    w.update({k: w[v] for k, v in (extra or {}).items()})  # (a tensor also under a second name)
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if pickle:
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in w.items()}, dst / "pytorch_model.bin")
    else:
        save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def to_modelopt(src: Path, dst: Path, ids: list[int], **eagle_config) -> Path:
    """The speculators draft at ``src`` as ModelOpt's export writes an EAGLE-3 draft
    (modelopt/torch/export/plugins/hf_spec_export.py EagleExporter, its config from
    hf_spec_configs.py llama_eagle_template_config): layers.0.* kept, d2t without t2d, no
    embed_tokens, the layer config at the top level (some fields null), rope_scaling with its
    theta inside, ModelOpt's eagle_config with the aux ids as layer outputs."""
    spec = json.loads((src / "config.json").read_text())
    layer = spec["transformer_layer_config"]
    theta = layer["rope_parameters"]["rope_theta"]
    assert layer["rope_parameters"]["rope_type"] == "default"
    cfg = {k: layer[k] for k in LAYER_FIELDS if k != "rope_parameters"}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], bos_token_id=None, eos_token_id=None, initializer_range=0.01,
               pad_token_id=None, torch_dtype="float32", transformers_version="4.57.1", use_cache=True,
               draft_vocab_size=spec["draft_vocab_size"], rope_scaling={"rope_type": "default", "rope_theta": theta},
               attention_bias=False, attention_dropout=0.0, mlp_bias=False, pretraining_tp=None, rope_theta=theta,
               eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True,
                             "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                             "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                             "parallel_draft_heads_num_layers": 1, **eagle_config})
    w = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k not in ("t2d", "embed_tokens.weight")}
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=4))
    save_file(w, str(dst / "model.safetensors"))
    return dst


def _draft_outputs(exp: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """draft.onnx of an export run on fixed random inputs: 3 positions from aux states, 2 from
    earlier draft states, over 4 positions of draft KV."""
    import onnxruntime as ort

    m = json.loads((exp / "export.json").read_text())
    d = m["draft"]
    width = {t["name"]: t["shape"][-1] for t in m["graphs"]["draft"]["io"]["inputs"]}
    rng = np.random.default_rng(seed)
    H, past = d["hidden_size"], 4
    feed = {C.INPUT_IDS: rng.integers(0, m["target"]["vocab_size"], (1, 5)),
            C.POSITION_IDS: np.arange(past, past + 5)[None],
            C.DRAFT_AUX_IN: rng.standard_normal((1, 3, width[C.DRAFT_AUX_IN])).astype(np.float32),
            C.DRAFT_PREV_HIDDEN: rng.standard_normal((1, 2, H)).astype(np.float32)}
    for i in range(d["num_layers"]):
        for name in (C.past_key(i), C.past_value(i)):
            feed[name] = rng.standard_normal((1, past, d["num_kv_heads"], d["head_dim"])).astype(np.float32)
    s = ort.InferenceSession(str(exp / "draft.onnx"), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))


CASES = {
    # no ids named: the states entering layers 2, L//2, L-3 (SafeAILab's and SGLang's default)
    "default-ids": dict(layers=8, aux=(2, 4, 5), ids=None, count=None, draft=dict(draft_vocab=300)),
    # SpecForge's eagle_config ids, counted as layer outputs (SGLang adds 1), with its fc_norm and own embeddings
    "layer-output": dict(layers=4, aux=(1, 2, 3), ids=[0, 1, 2], count="layer-output",
                         draft=dict(draft_vocab=300, fc_norm=True, own_embed=True)),
    "layer-input": dict(layers=4, aux=(1, 2, 3), ids=[1, 2, 3], count="layer-input", draft=dict(draft_vocab=1000)),
    # SafeAILab's training config (eagle/traineagle3/config.json) names the class LlamaForCausalLM
    "safeailab-architecture": dict(layers=8, aux=(2, 4, 5), ids=None, count=None, draft=dict(draft_vocab=300),
                                   config=dict(architectures=["LlamaForCausalLM"])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_eagle_format_exports_the_speculators_draft(tmp_path, name):
    """Both layouts of the same weights bind the same tensors to the same slots and export draft
    graphs with identical outputs; the receipt says which format and which renames were used."""
    c = CASES[name]
    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=c["layers"])
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=c["aux"], **c["draft"])
    eagle = to_eagle(spec, tmp_path / "eagle", c["ids"], **c.get("config", {}))
    a = export(t, spec, tmp_path / "exp-spec")
    b = export(t, eagle, tmp_path / "exp-eagle", draft_aux_ids=c["count"])
    assert b["target"]["aux_layer_ids"] == a["target"]["aux_layer_ids"] == list(c["aux"])
    assert b["draft"] == {**a["draft"], "speculative_tokens": 3}  # (what speculators convert writes; no field here)
    ra, rb = a["binding_receipt"]["draft"], b["binding_receipt"]["draft"]
    assert {s: v["sha256"] for s, v in rb["slots"].items()} == {s: v["sha256"] for s, v in ra["slots"].items()}
    assert "format" not in ra and "source_format" not in ra["config"]  # (speculators drafts' receipts as before)
    assert rb["config"]["source_format"] == "eagle"
    # the speculators draft names its verifier (the fixture: the target's path); EAGLE's format none
    assert ra["config"]["verifier_name"] == str(t) and "verifier_name" not in rb["config"]
    fmt = rb["format"]
    assert fmt["name"] == "eagle" and fmt["architecture"] == "LlamaForCausalLMEagle3"
    assert fmt["renamed"]["midlayer.self_attn.q_proj.weight"] == "layers.0.self_attn.q_proj.weight"
    assert fmt["renamed"] == {k: "layers.0." + k[len("midlayer."):] for k in fmt["renamed"]} and len(fmt["renamed"]) == 10
    assert rb["slots"]["layers.0.q"]["key"] == "midlayer.self_attn.q_proj.weight"
    if c["ids"] is not None:
        assert rb["config"]["extra"] == {"aux_layer_ids_written": c["ids"], "aux_layer_ids_count": c["count"]}
    if "config" in c:
        assert rb["config"]["extra"] == {"architectures_written": ["LlamaForCausalLM"]}
    oa, ob = _draft_outputs(tmp_path / "exp-spec"), _draft_outputs(tmp_path / "exp-eagle")
    assert oa.keys() == ob.keys()
    for k in oa:
        np.testing.assert_array_equal(ob[k], oa[k], err_msg=k)


# The config SafeAILab's EAGLE-3 training writes (SafeAILab/EAGLE eagle/traineagle3/config.json, commit
# cb7e084): the one yuhuili/EAGLE3-LLaMA3.1-Instruct-8B ships (NVIDIA/TensorRT-Model-Connect
# families/llama/edge_llm/dispatch.py checks that draft for architectures ["LlamaForCausalLM"],
# num_hidden_layers 1, draft_vocab_size 32000; SpecForge tests/test_modeling/test_draft/test_llama3.py
# copies it). No rope_theta (10000, LlamaConfig's default), no head_dim, its max_position_embeddings
# (2048) below its target's (131072).
SAFEAILAB_CONFIG = dict(architectures=["LlamaForCausalLM"], bos_token_id=1, eos_token_id=2, hidden_act="silu",
                        initializer_range=0.02, max_position_embeddings=64, model_type="llama", num_hidden_layers=1,
                        pad_token_id=0, tie_word_embeddings=False, torch_dtype="float16", transformers_version="4.28.1",
                        use_cache=True)


def to_safeailab(src: Path, dst: Path) -> Path:
    """The speculators draft at ``src`` as SafeAILab's EAGLE-3 training saves it: config.json with
    SAFEAILAB_CONFIG's keys, weights as deepspeed's ``save_16bit_model(..., exclude_frozen_parameters=True)``
    writes them (eagle/traineagle3/main.py): one float16 pytorch_model.bin, midlayer.*, d2t and
    t2d, no embed_tokens (frozen in training, taken from the target by EaModel, ea_model.py)."""
    import torch

    spec = json.loads((src / "config.json").read_text())
    layer = spec["transformer_layer_config"]
    assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    cfg = {**SAFEAILAB_CONFIG, **{k: layer[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                         "num_key_value_heads", "rms_norm_eps", "vocab_size")},
           "draft_vocab_size": spec["draft_vocab_size"]}
    w = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): torch.from_numpy(v)
         for k, v in load_file(str(src / "model.safetensors")).items() if k != "embed_tokens.weight"}
    dst.mkdir(parents=True)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in w.items()}, dst / "pytorch_model.bin")
    return dst


def test_safeailabs_published_eagle3_layout_is_read_as_written(tmp_path):
    """A draft as yuhuili/EAGLE3-* ship it (SAFEAILAB_CONFIG, a float16 pickle without embed_tokens)
    exports, with --allow-draft-pickle, a draft graph computing what the same weights compute in
    speculators' layout; its 'LlamaForCausalLM' is recorded, its smaller max_position_embeddings is
    no limit (default RoPE), and without the option the pickle is refused."""
    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5), draft_vocab=300)
    # the speculators copy holds the float16 values the pickle stores (upcast exactly), so both graphs agree bit for bit
    w = load_file(str(spec / "model.safetensors"))
    save_file({k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v for k, v in w.items()},
              str(spec / "model.safetensors"), metadata={"format": "pt"})
    d = to_safeailab(spec, tmp_path / "yuhuili")
    r = _export_cli(tmp_path, t, d)
    assert r.exit_code == 1 and "--allow-draft-pickle" in r.output and not (tmp_path / "out").exists(), r.output
    a = export(t, spec, tmp_path / "exp-spec")
    b = export(t, d, tmp_path / "exp-eagle", allow_draft_pickle=True)
    assert b["target"]["aux_layer_ids"] == a["target"]["aux_layer_ids"] == [2, 4, 5]
    rb = b["binding_receipt"]["draft"]
    assert rb["config"]["source_format"] == "eagle"
    assert rb["config"]["extra"] == {"architectures_written": ["LlamaForCausalLM"]}
    assert rb["config"]["decoder"]["rope"]["theta"] == 10000.0 and rb["config"]["decoder"]["head_dim"] == 16
    assert rb["slots"]["layers.0.q"]["key"] == "midlayer.self_attn.q_proj.weight"
    oa, ob = _draft_outputs(tmp_path / "exp-spec"), _draft_outputs(tmp_path / "exp-eagle")
    assert oa.keys() == ob.keys()
    for k in oa:
        np.testing.assert_array_equal(ob[k], oa[k], err_msg=k)


def test_eagle_format_decodes_losslessly_as_the_speculators_draft(tmp_path):
    """A draft right most of the time (write_bigram_pair), in EAGLE's layout with SpecForge's
    aux ids: target-only output at every depth (as transformers' greedy generate), and the
    same drafts accepted round for round as the speculators layout of it."""
    import torch

    from specrt.engines import build_engines
    from specrt.engines.engine_set import load_engines
    from specrt.runtime import generate as G
    from specrt.runtime.governor import FixedGovernor, OffGovernor
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import read_d2t
    from tests.fixtures_models import load_hf, write_bigram_pair

    t, spec = write_bigram_pair(tmp_path, "llama")
    eagle = to_eagle(spec, tmp_path / "eagle", [0, 1, 2])  # the speculators draft reads (1, 2, 3)
    prompt, depths = [3, 4, 5, 6], (1, 2, 3, 4)
    want = load_hf(t).generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(prompt):].tolist()
    accepted = {}
    for name, draft, count in (("spec", spec, None), ("eagle", eagle, "layer-output")):
        m = export(t, draft, tmp_path / f"exp-{name}", draft_aux_ids=count)
        assert m["target"]["aux_layer_ids"] == [1, 2, 3]
        build_engines(tmp_path / f"exp-{name}", "onnxruntime", depths, tmp_path / f"eng-{name}", log=lambda s: None,
                      profile_repeats=1, profile_pasts=(16,), max_context=128)
        with load_engines(tmp_path / f"eng-{name}") as engines:
            d2t = read_d2t(engines.export_dir, engines.export)
            assert G.Generator(engines, OffGovernor(depths), SamplingParams(), d2t).generate(prompt, 30) == want
            accepted[name] = []
            for k in depths:
                g = G.Generator(engines, FixedGovernor(depths, k), SamplingParams(), d2t)
                assert g.generate(prompt, 30) == want, (name, k)
                accepted[name].append(g.telemetry.to_json()["accepted"])
    assert accepted["eagle"] == accepted["spec"] and sum(accepted["spec"]) > 30


@pytest.mark.parametrize("flags, written", [
    (dict(norm_output=True), dict(norm_output=True)),
    (dict(norm_output=False), dict(norm_output=False)),
    # TensorRT-LLM's names for them, in eagle_config
    (dict(norm_output=True, norm_before_fc=True),
     dict(eagle_config={"return_hidden_post_norm": True, "norm_before_fc": True})),
    # vLLM's norm_before_residual (the residual after hidden_norm), read when a config says it
    (dict(norm_before_residual=True), dict(norm_before_residual=True)),
], ids=["norm-output", "no-norm-output", "tensorrt-llm-eagle-config", "norm-before-residual"])
def test_norm_output_is_eagle_3_1_as_the_servers_read_it(tmp_path, flags, written):
    """norm_output true: the head and the next step both read norm(h) (EAGLE 3.1: SGLang's,
    vLLM's and TensorRT-LLM's llama_eagle3 read it so, SpecForge since PR #879), speculators'
    norm_output; false: the head reads norm(h), the next step h (EAGLE-3), not refused."""
    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5),
                            draft_vocab=300, fc_norm=not flags.get("norm_before_fc"), **flags)
    export(t, spec, tmp_path / "exp-spec")
    export(t, to_eagle(spec, tmp_path / "eagle", **written), tmp_path / "exp-eagle")
    oa, ob = _draft_outputs(tmp_path / "exp-spec"), _draft_outputs(tmp_path / "exp-eagle")
    assert oa.keys() == ob.keys()
    for k in oa:
        np.testing.assert_array_equal(ob[k], oa[k], err_msg=k)


def test_a_modelopt_export_is_read(tmp_path):
    """A draft as ModelOpt's export writes it (layers.0.*, d2t without t2d, the target's
    embeddings, its eagle_config, ids counted as layer outputs) binds the speculators draft's
    tensors and exports the same draft graph."""
    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5), draft_vocab=300)
    mo = to_modelopt(spec, tmp_path / "modelopt", [1, 3, 4])  # (ModelOpt's default for 8 layers)
    a = export(t, spec, tmp_path / "exp-spec")
    b = export(t, mo, tmp_path / "exp-mo", draft_aux_ids="layer-output")
    assert b["target"]["aux_layer_ids"] == a["target"]["aux_layer_ids"] == [2, 4, 5]
    ra, rb = a["binding_receipt"]["draft"], b["binding_receipt"]["draft"]
    assert {s: v["sha256"] for s, v in rb["slots"].items()} == \
        {s: v["sha256"] for s, v in ra["slots"].items() if s != "t2d"}
    assert rb["slots"]["layers.0.q"]["key"] == "layers.0.self_attn.q_proj.weight" and rb["format"]["renamed"] == {}
    oa, ob = _draft_outputs(tmp_path / "exp-spec"), _draft_outputs(tmp_path / "exp-mo")
    assert oa.keys() == ob.keys()
    for k in oa:
        np.testing.assert_array_equal(ob[k], oa[k], err_msg=k)


@pytest.mark.parametrize("change, message", [
    (dict(use_last_layernorm=False), r"use_last_layernorm is false \(ModelOpt: no final norm before the head\)"),
    (dict(use_mtp_layernorm=True), r"use_mtp_layernorm is true"),
    (dict(parallel_draft_step=3), r"parallel_draft_step is 3 \(ModelOpt: parallel draft heads\)"),
    (dict(use_input_layernorm_in_first_layer=False), r"use_input_layernorm_in_first_layer is false"),
    (dict(eh_proj_before_attn=True), r"eh_proj_before_attn is true \(TensorRT-LLM"),
    (dict(use_aux_hidden_state=False), r"use_aux_hidden_state is false \(no fc over the target's states\)"),
], ids=["no-last-norm", "mtp-norms", "parallel-heads", "no-hidden-norm", "eh-proj", "no-aux-states"])
def test_modelopt_fields_that_change_the_layer_are_refused(tmp_path, change, message):
    import re

    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5), draft_vocab=300)
    d = to_modelopt(spec, tmp_path / "modelopt", [1, 3, 4], **change)
    r = _export_cli(tmp_path, t, d, "--draft-aux-ids", "layer-output")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.search(re.escape(f"{d}/config.json.eagle_config: ") + message, r.output), r.output
    assert not (tmp_path / "out").exists()


@pytest.fixture
def pair(tmp_path):
    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5), draft_vocab=300)
    return t, spec


def _export_cli(tmp_path, t, draft, *extra):
    return CliRunner().invoke(main, ["export", str(t), "--draft", str(draft), "-o", str(tmp_path / "out"), *extra])


@pytest.mark.parametrize("change, extra, message", [
    (dict(drop=("midlayer.mlp.down_proj.weight",)), (),
     r"{d}: draft slot 'layers.0.down' is missing: expected one of 'midlayer.mlp.down_proj.weight'"),
    (dict(architectures=["LlamaForCausalLMEagle"]), (),  # an EAGLE-1/2 draft
     r"{d}/config.json: architectures \['LlamaForCausalLMEagle'\] is not a draft specrt reads \(expected "
     r"\[\"LlamaForCausalLMEagle3\"\]"),
    # mutant m2-C64: a config told by draft_vocab_size alone, naming no class, read as EAGLE-3
    (dict(architectures=None), (), r"{d}/config.json: architectures None is not a draft specrt reads"),
    (dict(pickle=True), (), r"{d}: only pickle weights \(pytorch_model.bin\) found; they are not read unless you "
                            r"pass --allow-draft-pickle"),
    (dict(ids=[1, 3, 4]), (), r"{d}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids is \[1, 3, 4\], and "
                              r"nothing in the config says how they count.*pass --draft-aux-ids layer-output or "
                              r"--draft-aux-ids layer-input"),
    (dict(), ("--draft-aux-ids", "layer-output"), r"--draft-aux-ids is given, but {d}/config.json names no aux "
                                                  r"layer ids"),
    (dict(bias=True), (), r"{d}/config.json: bias is true \(SGLang then gives fc a bias"),
    (dict(quantization_config={"quant_method": "modelopt"}), (), r"{d}/config.json: quantization_config is set"),
    (dict(norm_output=True, eagle_config={"return_hidden_post_norm": False}), (),
     r"{d}/config.json: norm_output true and eagle_config.return_hidden_post_norm false differ"),
    (dict(norm_output=False, eagle_config={"return_hidden_post_norm": True}), (),
     r"{d}/config.json: norm_output false and eagle_config.return_hidden_post_norm true differ"),
    # one norm over the aux states or one per state: vLLM runs both, TensorRT-LLM fc_norm only, SGLang neither
    (dict(fc_norm=True, norm_before_fc=True), (),
     r"{d}/config.json: fc_norm and norm_before_fc are both true \(vLLM then runs both norms before fc, "
     r"TensorRT-LLM fc_norm only, SGLang neither; speculators refuses the pair, and no release of it wrote one\)"),
    (dict(fc_norm=True, eagle_config={"norm_before_fc": True}), (),
     r"{d}/config.json: fc_norm and norm_before_fc are both true"),
    (dict(extra={"layers.0.mlp.down_proj.weight": "midlayer.mlp.down_proj.weight"}), (),
     r"{d}: draft slot 'layers.0.down' is filled by more than one tensor"),
    (dict(num_hidden_layers=2), (), r"{d}/config.json: model_type 'llama', num_hidden_layers 2: "
                                    r"LlamaForCausalLMEagle3 holds one Llama layer"),
    (dict(model_type="qwen3"), (), r"{d}/config.json: model_type 'qwen3', num_hidden_layers 1: "
                                   r"LlamaForCausalLMEagle3 holds one Llama layer \(midlayer\); expected 'llama'"),
    (dict(tie_word_embeddings=True), (), r"{d}/config.json: tie_word_embeddings is true; expected false"),
    (dict(ids=[0, 1, 2], eagle_aux_hidden_state_layer_ids=[1, 2, 3]), ("--draft-aux-ids", "layer-input"),
     r"{d}/config.json: eagle_aux_hidden_state_layer_ids \[1, 2, 3\] and eagle_config.eagle_aux_hidden_state_layer_ids "
     r"\[0, 1, 2\] differ; expected one"),
    (dict(ids=[1, 2, 3, 4]), ("--draft-aux-ids", "layer-input"), r"{d}/config.json: eagle_config."
     r"eagle_aux_hidden_state_layer_ids must be 3 distinct ascending layer ids \(fc reads 3 states\), "
     r"found \[1, 2, 3, 4\]"),
    (dict(ids=[3, 2, 1]), ("--draft-aux-ids", "layer-input"), r"distinct ascending layer ids .*found \[3, 2, 1\]"),
    (dict(ids=[True, 2, 3]), ("--draft-aux-ids", "layer-input"), r"distinct ascending layer ids .*found \[True, 2, 3\]"),
    (dict(ids=[-1, 2, 3]), ("--draft-aux-ids", "layer-input"), r"distinct ascending layer ids .*found \[-1, 2, 3\]"),
    (dict(ids=[1, 1, 2]), ("--draft-aux-ids", "layer-input"), r"distinct ascending layer ids .*found \[1, 1, 2\]"),
    # layer 7's output (a target of 8 layers) enters no layer: the error names the ids as written and how
    # they were counted, not the states [3, 6, 8] they became
    (dict(ids=[2, 5, 7]), ("--draft-aux-ids", "layer-output"), r"{d}/config.json: the aux layer ids \[2, 5, 7\] it "
     r"names, counted as layer outputs \(--draft-aux-ids layer-output\), are the states entering layers \[3, 6, 8\], "
     r"which must lie in \[0, 7\] for a target of 8 layers \(as layer outputs: ids 0 to 6\)"),
    # mutant m73b-29: ids counted as inputs (as written) past the last layer are named as such, not as
    # "counted as layer outputs"
    (dict(ids=[2, 5, 8]), ("--draft-aux-ids", "layer-input"), r"{d}/config.json: eagle_aux_hidden_state_layer_ids "
     r"\[2, 5, 8\] must lie in \[0, 7\] for a target of 8 layers\n"),
    # d2t left out (ModelOpt leaves t2d out, which the binding derives from d2t)
    (dict(drop=("d2t",)), (), r"{d}: draft slot 'd2t' is missing: expected one of 'd2t'"),
    # P-EAGLE's and DSpark's tensors: no module for them in the format
    # (and the rope buffer speculators drafts may hold, declared ignorable there only)
    (dict(extra={n: "norm.weight" for n in ("mask_hidden", "confidence_head.proj.weight", "confidence_head.proj.bias",
                                            "rotary_emb.inv_freq")}), (),
     r"{d}: draft tensors that fill no slot and are not declared ignorable: 'confidence_head.proj.bias' "
     r"\(model.safetensors\), 'confidence_head.proj.weight' \(model.safetensors\), 'mask_hidden' "
     r"\(model.safetensors\), 'rotary_emb.inv_freq' \(model.safetensors\)\n"),
    (dict(target_hidden_size=4096), (), r"{d}/config.json: draft was built for a verifier of hidden size 4096"),
    # vLLM multiplies the draft's logits by it; at or below zero their ranking goes
    (dict(logit_scale=0), (), r"{d}/config.json: logit_scale 0.0: expected a positive number"),
    (dict(logit_scale=-1.5), (), r"{d}/config.json: logit_scale -1.5: expected a positive number"),
    # vLLM then runs the draft's lm_head over the whole vocabulary, SGLang the target's
    (dict(draft_vocab_size=None), (), r"{d}/config.json: missing required field 'draft_vocab_size' \(without it "
                                      r"vLLM and TensorRT-LLM run the draft's lm_head.*SGLang the target's lm_head\)"),
    # a q/k norm or q/k/v bias the llama layer never runs: the advice names no config field (the
    # format has none that turns them on), only the tensor to remove
    (dict(extra={"midlayer.self_attn.q_norm.weight": "norm.weight"}), (),
     r"{d}/model.safetensors: tensor 'midlayer.self_attn.q_norm.weight' \(draft slot 'layers.0.q_norm'\) would go "
     r"unused: EAGLE's draft format \(LlamaForCausalLMEagle3: one llama layer, no model_type to change\) gives "
     r"its layers no q/k norms .*\(remove the tensor\)\n"),
    (dict(extra={"midlayer.self_attn.v_proj.bias": "norm.weight"}), (),
     r"would go unused: EAGLE's draft format \(LlamaForCausalLMEagle3: one llama layer, no model_type to change\) "
     r"gives its layers no q/k/v biases .*\(remove the tensor\)\n"),
], ids=["missing-tensor", "unknown-architecture", "no-architectures", "pickle", "ids-uncounted", "option-without-ids",
        "fc-bias", "quantized", "post-norm-twice", "post-norm-twice-nested-true", "both-fc-norms",
        "both-fc-norms-nested",
        "layer-named-twice", "two-layers",
        "qwen3-layer", "tied", "ids-named-twice", "four-ids", "ids-descending", "id-true", "id-negative",
        "ids-repeated", "output-ids-past-the-last-layer", "input-ids-past-the-last-layer",
        "t2d-without-d2t", "tensors-of-no-module", "target-width", "logit-scale-zero",
        "logit-scale-negative", "no-draft-vocab-size", "qk-norm", "v-bias"])
def test_bad_eagle_format_drafts_exit_1_naming_the_file(tmp_path, pair, change, extra, message):
    import re

    t, spec = pair
    d = to_eagle(spec, tmp_path / "eagle", **change)
    r = _export_cli(tmp_path, t, d, *extra)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.search(message.format(d=re.escape(str(d))), r.output), r.output
    assert not (tmp_path / "out").exists()


def test_a_config_is_told_by_its_architecture_and_may_name_its_ids_in_both_places(tmp_path, pair):
    """A config naming an EAGLE architecture is read as EAGLE's format without draft_vocab_size
    too (vLLM's EAGLE-1 class here: refused, naming it, not as a transformers model); aux ids
    named at the top level and in eagle_config alike are one naming, read once."""
    import re

    from specrt.errors import UserError
    from specrt.export.config import load_draft_config

    t, spec = pair
    d = to_eagle(spec, tmp_path / "eagle", [0, 1, 2], eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    assert load_draft_config(d, "layer-output").aux_layer_ids == (1, 2, 3)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["draft_vocab_size"]
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["EagleLlamaForCausalLM"]}))
    with pytest.raises(UserError, match=re.escape(f"{d}/config.json: architectures ['EagleLlamaForCausalLM'] is not "
                                                  "a draft specrt reads")):
        load_draft_config(d)


def _decode(tmp_path, t, draft, name, count=None, prompt=(3, 4, 5, 6), depths=(1, 3)):
    """An export of ``draft`` built for ONNX Runtime: its greedy tokens (30) at the deepest depth,
    and the drafts accepted doing so."""
    from specrt.engines import build_engines
    from specrt.engines.engine_set import load_engines
    from specrt.runtime import generate as G
    from specrt.runtime.governor import FixedGovernor
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import read_d2t

    export(t, draft, tmp_path / f"exp-{name}", draft_aux_ids=count)
    build_engines(tmp_path / f"exp-{name}", "onnxruntime", depths, tmp_path / f"eng-{name}", log=lambda s: None,
                  profile_repeats=1, profile_pasts=(16,), max_context=128)
    with load_engines(tmp_path / f"eng-{name}") as engines:
        g = G.Generator(engines, FixedGovernor(depths, depths[-1]), SamplingParams(),
                        read_d2t(engines.export_dir, engines.export))
        return g.generate(list(prompt), 30), g.telemetry.to_json()["accepted"]


def test_full_vocabulary_drafts_decode_losslessly_whatever_maps_they_carry(tmp_path):
    """A draft over the whole vocabulary (draft_vocab_size = the target's) with the maps its
    trainer wrote anyway: both buffers unfilled (d2t zeros, t2d all false: EAGLE's cnets.py and
    SpecForge's llama3_eagle.py register them so, `speculators convert` copies them into a
    speculators draft), or t2d alone marking every token. Every server takes its ids as target
    ids; each binds, decodes as transformers' greedy generate, and accepts what the same draft
    without them does. A logit_scale (vLLM's) leaves the greedy drafts as they were."""
    import shutil

    import torch

    from tests.fixtures_models import load_hf, write_bigram_pair

    t, spec = write_bigram_pair(tmp_path, "llama")
    V = json.loads((t / "config.json").read_text())["vocab_size"]
    assert json.loads((spec / "config.json").read_text())["draft_vocab_size"] == V
    unfilled = {"d2t": np.zeros(V, np.int64), "t2d": np.zeros(V, bool)}
    spec_unfilled = tmp_path / "spec-unfilled"
    shutil.copytree(spec, spec_unfilled)
    drafts = {"eagle-unfilled": to_eagle(spec, tmp_path / "eagle-unfilled", [0, 1, 2]),
              "eagle-t2d-only": to_eagle(spec, tmp_path / "eagle-t2d-only", [0, 1, 2]),
              "spec-unfilled": spec_unfilled,
              "eagle-logit-scale": to_eagle(spec, tmp_path / "eagle-logit-scale", [0, 1, 2], logit_scale=2.5)}
    for name, maps in (("eagle-unfilled", unfilled), ("eagle-t2d-only", {"t2d": np.ones(V, bool)}),
                       ("spec-unfilled", unfilled)):
        f = drafts[name] / "model.safetensors"
        save_file({**load_file(str(f)), **maps}, str(f))
    prompt = [3, 4, 5, 6]
    want = load_hf(t).generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(prompt):].tolist()
    tokens, accepted = _decode(tmp_path, t, spec, "spec")
    assert tokens == want and accepted > 10
    for name, draft in drafts.items():
        assert _decode(tmp_path, t, draft, name, None if name.startswith("spec") else "layer-output") == \
            (want, accepted), name


def test_logit_scale_multiplies_the_draft_logits_as_vllm(tmp_path):
    """vLLM's logit_scale (llama_eagle3.py: LogitsProcessor(scale=logit_scale) multiplies the
    draft-vocabulary logits): the draft graph's logits are scale * lm_head(norm(h)), computed
    here in numpy from the checkpoint's tensors and the graph's pre-norm h, and the sampling
    path's draft probabilities their softmax; the greedy drafts (argmax, then d2t) unchanged."""
    from specrt.runtime.sampling import SamplingParams, probs

    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5),
                            draft_vocab=300)
    d = to_eagle(spec, tmp_path / "eagle", logit_scale=0.37)
    m = export(t, d, tmp_path / "exp")
    out = _draft_outputs(tmp_path / "exp")
    cfg, w = json.loads((d / "config.json").read_text()), load_file(str(d / "model.safetensors"))
    h = out[C.DRAFT_HIDDEN_OUT][0].astype(np.float64)  # [S, H] pre-norm (norm_output false)
    normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * w["norm.weight"]
    z = cfg["logit_scale"] * normed @ w["lm_head.weight"].astype(np.float64).T  # [S, Vd]
    want = np.exp(z - z.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    got = probs(out[C.DRAFT_LOGITS][0], SamplingParams(temperature=1.0), engine="draft")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(out[C.DRAFT_TOKENS][0], z.argmax(-1) + w["d2t"][z.argmax(-1)])
    assert m["binding_receipt"]["draft"]["config"]["logit_scale"] == 0.37


@pytest.mark.parametrize("maps, message", [
    # the servers disagree on it: SGLang applies it over the full vocabulary, EAGLE and TensorRT-LLM drop it,
    # vLLM applied it until its PR #53458 (2026-08) left such a draft without a map
    (dict(d2t=np.array([1, -1] + [0] * 14, np.int64)), r"{d}/model.safetensors: d2t of a draft over the full "
     r"vocabulary \(16\) is not all zeros \(the identity\): SGLang applies it there, EAGLE and TensorRT-LLM drop "
     r"it, vLLM applied it before its PR #53458 \(2026-08: no map for such a draft since\)"),
    # a head over every token cannot have been trained against a map keeping some of them
    (dict(d2t=np.zeros(16, np.int64), t2d=np.arange(16) < 8), r"{d}/model.safetensors: t2d of a draft over the "
     r"full vocabulary \(16\) marks 8 target ids; expected all of them .* or none"),
], ids=["d2t-not-identity", "t2d-partial"])
def test_a_full_vocabulary_map_the_servers_read_apart_is_refused(tmp_path, maps, message):
    import re

    t = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8, vocab_size=16)
    spec = write_tiny_draft(tmp_path / "spec", t, kind="eagle3", num_layers=1, aux_layer_ids=(2, 4, 5), draft_vocab=16)
    d = to_eagle(spec, tmp_path / "eagle")
    save_file({**load_file(str(d / "model.safetensors")), **maps}, str(d / "model.safetensors"))
    r = _export_cli(tmp_path, t, d)
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.search(message.format(d=re.escape(str(d))), r.output), r.output
    assert not (tmp_path / "out").exists()


def test_a_target_hidden_size_that_is_the_targets_is_read(tmp_path, pair):
    """target_hidden_size written out (SpecForge, TensorRT-LLM) and equal to the target's:
    the same binding as without it (another width is refused, above)."""
    t, spec = pair
    width = json.loads((t / "config.json").read_text())["hidden_size"]
    a = export(t, to_eagle(spec, tmp_path / "eagle"), tmp_path / "a")
    b = export(t, to_eagle(spec, tmp_path / "eagle-w", target_hidden_size=width), tmp_path / "b")
    assert b["binding_receipt"]["draft"]["slots"] == a["binding_receipt"]["draft"]["slots"]


def test_aux_id_counting_is_refused_for_a_speculators_draft(tmp_path, pair):
    """--draft-aux-ids says how an EAGLE-format config counts its ids; a speculators draft's
    ids count one way only (speculators' own), so the option is refused, naming the config."""
    t, spec = pair
    for command in ("export", "inspect"):
        r = CliRunner().invoke(main, [command, str(t), "--draft", str(spec), "--draft-aux-ids", "layer-output",
                                      *(("-o", str(tmp_path / "out")) if command == "export" else ())])
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        assert f"--draft-aux-ids is for an EAGLE-3 draft in EAGLE's own format (LlamaForCausalLMEagle3) whose " \
               f"config names its aux layer ids; {spec}/config.json is not one" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_inspect_reads_an_eagle_draft_with_its_options(tmp_path, pair):
    """specrt inspect takes --draft-aux-ids and --allow-draft-pickle as export does, and says
    the format and how many tensors were bound through the declared renames."""
    t, spec = pair
    d = to_eagle(spec, tmp_path / "eagle", [1, 3, 4], pickle=True)
    r = CliRunner().invoke(main, ["inspect", str(t), "--draft", str(d), "--draft-aux-ids", "layer-output",
                                  "--allow-draft-pickle"])
    assert r.exit_code == 0, r.output
    assert "  format: eagle (LlamaForCausalLMEagle3), 10 tensors bound through declared renames\n" in r.output
    # the states read, and the ids the config wrote that they came from (a user checks the one against the other)
    assert "  aux layer ids: [2, 4, 5] (the states entering those layers: the config's [1, 3, 4] counted as layer " \
           "outputs, --draft-aux-ids layer-output);" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", str(t), "--draft", str(d), "--draft-aux-ids", "layer-input",
                                  "--allow-draft-pickle", "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["draft"]["aux_layer_ids"] == [1, 3, 4], r.output


def test_a_pickled_eagle_draft_is_read_with_its_option(tmp_path, pair):
    """SafeAILab publishes pytorch_model.bin: read with --allow-draft-pickle (torch.load
    weights_only), the same tensors as the safetensors layout; the target's --allow-pickle
    does not open the draft's."""
    t, spec = pair
    d = to_eagle(spec, tmp_path / "eagle", pickle=True)
    r = _export_cli(tmp_path, t, d, "--allow-pickle")
    assert r.exit_code == 1 and "--allow-draft-pickle" in r.output and not (tmp_path / "out").exists(), r.output
    r = _export_cli(tmp_path, t, d, "--allow-draft-pickle")
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "out" / "export.json").read_text())["binding_receipt"]["draft"]["slots"]
    ref = export(t, to_eagle(spec, tmp_path / "eagle-st"), tmp_path / "ref")["binding_receipt"]["draft"]["slots"]
    assert {s: v["sha256"] for s, v in got.items()} == {s: v["sha256"] for s, v in ref.items()}
    assert got["layers.0.q"]["file"] == "pytorch_model.bin"


def test_the_eagle_table_is_the_speculators_table_renamed():
    """No name fills two slots; every EAGLE name is a speculators name or its declared rename."""
    from specrt.export import slots as S

    rows, aliases = S.eagle_rows()
    spec = {slot: names for slot, names, _s, _i in S.expand(S.DRAFT_SLOTS, 1)}
    for slot, names, _s, _i in rows:
        # each speculators name, preceded by its EAGLE rename where it has one (ModelOpt keeps layers.0.)
        assert tuple(dict.fromkeys(aliases.get(n, n) for n in names)) == spec[slot]
        assert set(names) == set(spec[slot]) | {a for a in aliases if aliases[a] in spec[slot]}
    assert {a for a in aliases} == {n for _s, names, _x, _i in rows for n in names if n.startswith("midlayer.")}
    assert set(spec) - {r[0] for r in rows} == set(S.EAGLE_ABSENT)
