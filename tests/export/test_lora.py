"""`specrt export --lora`: a PEFT LoRA adapter merged into the target's weights.

The adapters are PEFT's own (get_peft_model on the tiny transformers targets, lora_B made
random and non-zero so that the merge matters, save_pretrained); the reference is PEFT's
merge_and_unload model in torch. Session 77's task (h77e): none of this existed before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specrt import contracts as C
from specrt.cli import main
from specrt.manifest import load_export
from tests.fixtures_models import load_hf, write_tiny_draft, write_tiny_target

from .test_graph_parity import KV, TOL, maxerr, run, session

pytest.importorskip("peft")

IDS = np.random.default_rng(7).integers(0, 1000, (1, 9))
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapter(target: Path, out: Path, seed: int = 3, **lora) -> tuple[Path, np.ndarray]:
    """PEFT's adapter of ``target`` (LoraConfig ``lora``, lora_B random) saved at ``out``, and the
    logits of its merge_and_unload model over IDS."""
    import torch
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_hf(target), LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": MODULES, **lora}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:  # lora_A/B (B starts at zeros: the merge would change nothing), modules_to_save
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    with torch.no_grad():
        logits = model.merge_and_unload()(torch.tensor(IDS)).logits.float().numpy()  # (a bfloat16 base: w78c)
    return out, logits


def onnx_logits(export_dir: Path) -> np.ndarray:
    """The exported target graph's logits over IDS (ONNX Runtime, one prefill)."""
    m = json.loads((export_dir / "export.json").read_text())["target"]
    kv = KV(m["num_layers"], m["num_kv_heads"], m["head_dim"])
    s = session(export_dir / "target.onnx")
    return run(s, {C.INPUT_IDS: IDS, C.POSITION_IDS: np.arange(IDS.shape[1])[None], **kv.feed()})[C.LOGITS]


def export_cli(*args) -> object:
    return CliRunner().invoke(main, ["export", *map(str, args)])


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora_targets")
    return {"llama": write_tiny_target(root / "llama", "llama", seed=1),
            "qwen3": write_tiny_target(root / "qwen3", "qwen3", seed=2)}


@pytest.fixture(scope="module")
def adapter(targets, tmp_path_factory) -> Path:
    """A plain adapter of the Llama target, copied by the refusal tests to be spoilt."""
    return write_adapter(targets["llama"], tmp_path_factory.mktemp("lora") / "a")[0]


CASES = {
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {}),
    "qwen3_rslora": ("qwen3", {"use_rslora": True, "r": 8, "lora_alpha": 4}),
    # per-module ranks and alphas, their keys regular expressions matched on the module's full name
    "llama_patterns": ("llama", {"rank_pattern": {"down_proj": 2, r"layers\.[13]\.self_attn\.q_proj": 6},
                                 "alpha_pattern": {"layers.2.mlp.up_proj": 3, "v_proj": 32}}),
    "llama_rslora_patterns": ("llama", {"use_rslora": True, "rank_pattern": {"o_proj": 2}, "alpha_pattern": {"k_proj": 1}}),
    "llama_some_modules": ("llama", {"target_modules": ["q_proj", "v_proj"], "layers_to_transform": [1, 3]}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_merged_export_equals_peft_merge_and_unload(targets, tmp_path, case):
    """The exported target's logits (ONNX Runtime) equal PEFT's merge_and_unload model's (torch)
    within the export tests' tolerance, and differ from the base's: W + scale * B @ A with
    scale alpha / r (alpha / sqrt(r) with use_rslora), rank_pattern / alpha_pattern per module."""
    name, lora = CASES[case]
    a, ref = write_adapter(targets[name], tmp_path / "a", **lora)
    r = export_cli(targets[name], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert "merging a LoRA adapter into" in r.output
    got = onnx_logits(tmp_path / "e")
    assert maxerr(got, ref) <= TOL, (case, maxerr(got, ref))
    base = export_cli(targets[name], "-o", tmp_path / "b")
    assert base.exit_code == 0, base.output
    assert maxerr(onnx_logits(tmp_path / "b"), got) > 100 * TOL  # (the merge changed the model)


def test_fan_in_fan_out_is_false_for_linear_weights(targets, adapter, tmp_path):
    """fan_in_fan_out true (GPT-2's Conv1D layout) on a target of nn.Linear projections: PEFT sets
    it false and merges B @ A untransposed; export does the same, and says so."""
    import torch
    from peft import PeftModel

    a = shutil.copytree(adapter, tmp_path / "a")
    cfg = json.loads((a / "adapter_config.json").read_text())
    (a / "adapter_config.json").write_text(json.dumps({**cfg, "fan_in_fan_out": True}))
    with pytest.warns(UserWarning, match="fan_in_fan_out is set to True"):
        model = PeftModel.from_pretrained(load_hf(targets["llama"]), a)
    with torch.no_grad():
        ref = model.merge_and_unload()(torch.tensor(IDS)).logits.numpy()
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0 and "fan_in_fan_out is true" in r.output, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL


def test_receipt_records_the_adapter(targets, adapter, tmp_path):
    """The binding receipt's target.lora: the folder, adapter_config.json's hash, r, alpha, and
    each merged module's rank, alpha, scale and its A and B (key, file, shape, dtype, sha256 of
    the bytes, as the receipt records a slot); the target's slots stay the base's."""
    import hashlib

    from safetensors import safe_open

    r = export_cli(targets["llama"], "--lora", adapter, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    rec = load_export(tmp_path / "e")["binding_receipt"]
    lora = rec["target"]["lora"]
    assert lora["folder"] == str(adapter.resolve()) and lora["r"] == 4 and lora["lora_alpha"] == 8
    assert lora["config"]["sha256"] == hashlib.sha256((adapter / "adapter_config.json").read_bytes()).hexdigest()
    assert lora["base_model_name_or_path"] == str(targets["llama"])
    assert sorted(lora["modules"]) == sorted(f"layers.{i}.{s}" for i in range(4)
                                             for s in ("q", "k", "v", "o", "gate", "up", "down"))
    m = lora["modules"]["layers.2.down"]
    assert (m["rank"], m["alpha"], m["scale"]) == (4, 8, 2.0)
    key = "base_model.model.model.layers.2.mlp.down_proj.lora_B.weight"
    assert m["lora_B"]["key"] == key and m["lora_B"]["file"] == "adapter_model.safetensors"
    assert m["lora_B"]["shape"] == [64, 4] and m["lora_B"]["dtype"] == "F32"
    with safe_open(str(adapter / "adapter_model.safetensors"), "np") as f:
        assert m["lora_B"]["sha256"] == hashlib.sha256(f.get_tensor(key).tobytes()).hexdigest()
    # the base's slots as without an adapter; the receipt (and its id) is another
    assert export_cli(targets["llama"], "-o", tmp_path / "b").exit_code == 0
    base = load_export(tmp_path / "b")["binding_receipt"]
    assert base["target"]["slots"] == rec["target"]["slots"] and "lora" not in base["target"]
    assert base["receipt_id"] != rec["receipt_id"]


def _spoil_config(a: Path, **fields) -> None:
    cfg = json.loads((a / "adapter_config.json").read_text())
    (a / "adapter_config.json").write_text(json.dumps({**cfg, **fields}))


def _spoil_tensors(a: Path, rename=None, drop=(), add=()) -> None:
    from safetensors.numpy import load_file, save_file

    t = load_file(str(a / "adapter_model.safetensors"))
    t.update({k: np.ones(64, np.float32) for k in add})
    for k in drop:
        del t[k]
    for old, new in (rename or {}).items():
        t[new] = t.pop(old)
    save_file(t, str(a / "adapter_model.safetensors"), metadata={"format": "pt"})


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"
REFUSALS = {
    "peft_type": (dict(peft_type="LOHA"), None, r"adapter_config.json: 'peft_type' is 'LOHA'; expected \"LORA\""),
    "dora": (dict(use_dora=True), None, r"'use_dora' is True: DoRA"),
    "bias": (dict(bias="all"), None, r"'bias' is 'all'; expected \"none\""),
    "lora_bias": (dict(lora_bias=True), None, r"'lora_bias' is True: a bias on lora_B"),
    "modules_to_save": (dict(modules_to_save=["score"]), None, r"'modules_to_save' is \['score'\]: full copies"),
    "modules_to_save_missing": (dict(modules_to_save=["lm_head"]), None,
                                r"no tensor 'base_model.model.lm_head.weight', which .*modules_to_save \['lm_head'\]"),
    "trainable_tokens": (dict(trainable_token_indices=[1, 2]), None,  # (w78c: taken, its rows where PEFT saves them)
                         r"no tensor '.*embed_tokens.token_adapter.trainable_tokens_delta', which .*\[1, 2\] promises"),
    "layers_to_transform": (dict(layers_to_transform=[0, 1]), None,
                            r"adapts layer 2, which .*layers_to_transform \[0, 1\] leaves out"),
    "layers_pattern": (dict(layers_pattern="h"), None, r"'layers_pattern' is 'h'"),
    # w78c: PEFT refuses to load these (PeftConfig.__post_init__); a tensor of layer 2 was refused instead
    "layers_with_regex": (dict(target_modules=".*_proj", layers_to_transform=[0, 1, 2, 3]), None,
                          r"'layers_to_transform' is \[0, 1, 2, 3\] with target_modules a string \('\.\*_proj'\), "
                          "which PEFT refuses to load"),
    "target_modules_type": (dict(target_modules=5), None, r"'target_modules' is 5; expected a list of module names"),
    "pissa": (dict(init_lora_weights="pissa"), None, r"'init_lora_weights' is 'pissa': such an initialisation rewrites"),
    "alora": (dict(alora_invocation_tokens=[5]), None, r"'alora_invocation_tokens' is \[5\]: activated LoRA"),
    "unknown_field": (dict(future_variant={"on": True}), None, r"'future_variant' is .*a field specrt does not know"),
    "rank": (dict(rank_pattern={"q_proj": 2}), None,
             rf"'{Q0}.lora_A.weight' has shape \[4, 64\]; expected \[2, 64\] .*rank_pattern\['q_proj'\] 2"),
    "r_not_int": (dict(r="4"), None, r"'r' is '4'; expected a positive integer"),
    "half": ({}, dict(drop=(f"{Q0}.lora_B.weight",)), rf"'{Q0}.lora_A.weight' has no '{Q0}.lora_B.weight' beside it"),
    # PEFT's names with the adapter's name left in: no suffix matching takes them
    "adapter_name_in_key": ({}, dict(rename={f"{Q0}.lora_A.weight": f"{Q0}.lora_A.default.weight",
                                             f"{Q0}.lora_B.weight": f"{Q0}.lora_B.default.weight"}),
                            rf"adapter tensor '{Q0}.lora_A.default.weight' is not taken: it fills no target slot"),
    "magnitude": ({}, dict(add=(f"{Q0}.lora_magnitude_vector",)),
                  r"lora_magnitude_vector' is not taken: DoRA's magnitude vector"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_adapters(targets, adapter, tmp_path, case):
    """What export does not merge is refused: a UserError naming the file and the field or the
    tensor, exit 1, no traceback, nothing written."""
    fields, tensors, said = REFUSALS[case]
    a = shutil.copytree(adapter, tmp_path / "a")
    if fields:
        _spoil_config(a, **fields)
    if tensors:
        _spoil_tensors(a, **tensors)
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert str(a) in r.output, r.output  # (the file named)
    assert __import__("re").search(said, r.output), r.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("module", ["embed_tokens", "lm_head"])
def test_embedding_and_head_lora_refused(targets, tmp_path, module):
    """PEFT's LoRA on the embeddings (lora_embedding_A/B) or on the LM head is refused, naming
    the tensor (export merges the decoder layers' projections only)."""
    a, _ = write_adapter(targets["qwen3"], tmp_path / "a", target_modules=["q_proj", module])
    r = export_cli(targets["qwen3"], "--lora", a, "-o", tmp_path / "e")
    what = "the embeddings" if module == "embed_tokens" else "the LM head"
    assert r.exit_code == 1 and f"a LoRA on {what}, which export does not merge" in r.output, r.output
    assert f"base_model.model.{'model.' if module == 'embed_tokens' else ''}{module}." in r.output
    assert not (tmp_path / "e").exists()


def test_adapter_of_another_shape_refused(targets, tmp_path):
    """An adapter written for a model of other shapes (intermediate size 96): refused on the
    first tensor whose shape disagrees, naming both shapes."""
    other = write_tiny_target(tmp_path / "other", "llama", intermediate_size=96)
    a, _ = write_adapter(other, tmp_path / "a", target_modules=["gate_proj"])
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1, r.output
    assert ("lora_B.weight' has shape [96, 4]; expected [128, 4]" in r.output
            and "an adapter for another model?" in r.output), r.output
    assert not (tmp_path / "e").exists()


def test_pickle_adapter_only_with_its_flag(targets, adapter, tmp_path):
    """adapter_model.bin (a pickle) is read only with --allow-lora-pickle, then merged as the
    safetensors one (the receipt naming the .bin); the flag without --lora is refused."""
    import torch
    from safetensors.torch import load_file

    a = tmp_path / "a"
    a.mkdir()
    shutil.copyfile(adapter / "adapter_config.json", a / "adapter_config.json")
    torch.save(load_file(str(adapter / "adapter_model.safetensors")), a / "adapter_model.bin")
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "only pickle weights (adapter_model.bin) found" in r.output, r.output
    assert "--allow-lora-pickle" in r.output and not (tmp_path / "e").exists()
    r = export_cli(targets["llama"], "--lora", a, "--allow-lora-pickle", "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert export_cli(targets["llama"], "--lora", adapter, "-o", tmp_path / "s").exit_code == 0
    assert maxerr(onnx_logits(tmp_path / "e"), onnx_logits(tmp_path / "s")) == 0
    mod = load_export(tmp_path / "e")["binding_receipt"]["target"]["lora"]["modules"]["layers.0.q"]
    assert mod["lora_A"]["file"] == "adapter_model.bin"
    r = export_cli(targets["llama"], "--allow-lora-pickle", "-o", tmp_path / "x")
    assert r.exit_code == 1 and "--allow-lora-pickle: applies to a LoRA adapter, and no --lora" in r.output


def test_adapter_of_another_base_is_a_warning(targets, adapter, tmp_path):
    """base_model_name_or_path naming another model is a warning, not an error: the name cannot
    be checked against the weights (a copy, a hub snapshot named by its hash), and an adapter
    of other shapes is refused by them. A hub id whose name is a folder of the target's path,
    or its cache form, says nothing."""
    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, base_model_name_or_path="Qwen/Qwen3-8B")
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert "base_model_name_or_path is 'Qwen/Qwen3-8B', which does not name the target" in r.output, r.output
    snap = tmp_path / "models--org--tiny-llama" / "snapshots" / "0123abc"
    shutil.copytree(targets["llama"], snap)
    for base in ("org/tiny-llama", str(snap)):
        _spoil_config(a, base_model_name_or_path=base)
        r = export_cli(snap, "--lora", a, "-o", tmp_path / "e", "--force")
        assert r.exit_code == 0 and "base_model_name_or_path" not in r.output, (base, r.output)


def test_missing_config_refused(adapter, targets, tmp_path):
    """A folder without adapter_config.json (a checkpoint given as --lora, say) is refused."""
    r = export_cli(targets["llama"], "--lora", targets["qwen3"], "-o", tmp_path / "e")
    assert r.exit_code == 1 and "adapter_config.json: not found (expected a PEFT LoRA adapter folder" in r.output
    assert not (tmp_path / "e").exists()


@pytest.fixture(scope="module")
def merged_engines(targets, adapter, tmp_path_factory) -> tuple[Path, Path]:
    """ONNX Runtime engines (depths 1, 3) of the Llama target with the adapter merged and a draft
    written for the base, beside a training receipt that promises 0.99; and the adapter's copy."""
    from specrt.engines import build_engines

    root = tmp_path_factory.mktemp("merged")
    a = shutil.copytree(adapter, root / "a")
    d = write_tiny_draft(root / "d", targets["llama"], kind="eagle3", num_layers=1)
    (d / "training_receipt.json").write_text(json.dumps({"heldout": {"acceptance_at_pos": [0.99]}}))
    r = export_cli(targets["llama"], "--draft", d, "--lora", a, "-o", root / "e")
    assert r.exit_code == 0, r.output
    build_engines(root / "e", "onnxruntime", (1, 3), root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=128)
    return root / "eng", a


def test_greedy_run_of_a_merged_export_is_lossless(merged_engines, tmp_path):
    """Speculative decoding on the merged export (its draft trained on, here written for, the
    base) gives the tokens of --governor off: the merge changes the target, never the invariant.
    The acceptance canary, finding acceptance far below the draft's training receipt, names the
    adapter as a cause before a mis-bound weight (it blamed a mis-bound weight alone)."""
    eng, adapter = merged_engines
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"prompt_ids": [int(i) for i in row]}) + "\n"
                         for row in np.random.default_rng(5).integers(0, 1000, (3, 6))))
    outs = {}
    for gov in ("off", "fixed:3", "auto"):
        r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(p), "--max-new-tokens", "24",
                                      "--governor", gov])
        assert r.exit_code == 0, (gov, r.output)
        outs[gov] = r.stdout
    assert outs["fixed:3"] == outs["off"] and outs["auto"] == outs["off"] and outs["off"].strip()
    r = CliRunner().invoke(main, ["canary", str(eng)])
    assert r.exit_code == 0 and "UNTRUSTED" in r.output, r.output
    assert f"the target merges the LoRA adapter {adapter.resolve()} (export --lora)" in r.output, r.output
    assert "else a weight is bound to the wrong slot" in r.output
    r = CliRunner().invoke(main, ["run", str(eng), "--prompts", str(p), "--max-new-tokens", "2"])
    assert r.exit_code == 0 and "UNTRUSTED DRAFT" in r.output and "merges the LoRA adapter" in r.output, r.output


def test_compare_torch_reference_merges_the_adapter(merged_engines):
    """`specrt compare --reference torch` on a merged export: transformers' model gets the
    adapter the receipt records merged too (it ran the base model, and every target role
    failed), and an adapter changed since the export is refused, naming it."""
    from specrt.engines.compare import compare_engines
    from specrt.errors import UserError

    eng, adapter = merged_engines
    r = compare_engines(eng, reference="torch", log=lambda s: None, prompt_tokens=8)
    assert r["passed"], r["summary"]
    written = (adapter / "adapter_config.json").read_bytes()
    (adapter / "adapter_config.json").write_text(json.dumps({**json.loads(written), "lora_alpha": 9}))
    try:
        with pytest.raises(UserError, match=rf"{adapter.resolve()}: not the LoRA adapter the export merged"):
            compare_engines(eng, reference="torch", log=lambda s: None, prompt_tokens=8)
    finally:
        (adapter / "adapter_config.json").write_bytes(written)


def test_bench_skips_the_peers_that_decode_the_base(merged_engines, tmp_path):
    """`specrt bench` on a merged export: the peers that read the target checkpoint folder (hf,
    onnxruntime-genai, llama.cpp converting it) would decode the base model, not the merge, and
    are skipped saying so (hf's greedy tokens were counted against specrt's as a mismatch); two
    exports of one base with other adapters are other targets to --variant."""
    from types import SimpleNamespace

    from specrt.cmd_bench import _other_target, bench

    eng, adapter = merged_engines
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt_ids": [5, 6, 7, 8]}) + "\n")
    r = CliRunner().invoke(bench, [str(eng), "--prompts", str(p), "-o", str(tmp_path / "b"), "--max-new-tokens", "4",
                                   "--governors", "off", "--threads", "1", "--warmup-tokens", "2", "--no-profile",
                                   "--peers", "hf"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert rep["skipped"]["hf"].startswith(f"the export merges a LoRA adapter ({adapter.resolve()}, export --lora); "
                                           "this peer would decode the base model in "), rep["skipped"]
    slots = {"slots": {"embed": {"sha256": "x"}}}
    one = SimpleNamespace(export={"binding_receipt": {"target": {**slots, "lora": {"folder": "/a", "r": 4}}}})
    two = SimpleNamespace(export={"binding_receipt": {"target": {**slots, "lora": {"folder": "/a", "r": 8}}}})
    base = SimpleNamespace(export={"binding_receipt": {"target": slots}})
    assert _other_target(one, two) == _other_target(one, base) == "their binding receipts' target weights differ"
    assert _other_target(one, one) is None and _other_target(base, base) is None
    # r77i: the same adapter in another folder (copied, or another mount) is the same target: its hashes decide
    moved = SimpleNamespace(export={"binding_receipt": {"target": {**slots, "lora": {"folder": "/b", "r": 4}}}})
    assert _other_target(one, moved) is None


def test_compare_torch_reference_merges_pickled_weights(targets, tmp_path):
    """r77i (the review of h77e): an export of a pickled target (--allow-pickle) with a pickled
    adapter (--allow-lora-pickle) is compared with torch too: the reference merges the adapter
    read as the export read it (torch.load weights_only), giving PEFT's merge_and_unload logits.
    Without the mend compare refused it, telling the user to pass --allow-lora-pickle (or
    --allow-pickle), which compare does not take."""
    import torch
    from safetensors.torch import load_file

    from specrt.engines.compare import _merge_lora

    sa, ref = write_adapter(targets["llama"], tmp_path / "sa")
    a, t = tmp_path / "a", tmp_path / "t"
    a.mkdir()
    shutil.copyfile(sa / "adapter_config.json", a / "adapter_config.json")
    torch.save(load_file(str(sa / "adapter_model.safetensors")), a / "adapter_model.bin")
    shutil.copytree(targets["llama"], t, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save(load_file(str(targets["llama"] / "model.safetensors")), t / "pytorch_model.bin")
    r = export_cli(t, "--allow-pickle", "--lora", a, "--allow-lora-pickle", "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    model = load_hf(t)
    _merge_lora(model, t, load_export(tmp_path / "e"))
    with torch.no_grad():
        assert maxerr(model(torch.tensor(IDS)).logits.numpy(), ref) <= TOL


def test_an_adapter_saved_under_its_name_is_pointed_at(targets, tmp_path):
    """r77i (the review of h77e): PEFT's save_pretrained writes an adapter whose name is not
    "default" to OUT/<name>/; --lora OUT was refused as "adapter_config.json: not found" without
    a word of where it is. The refusal names the subfolder, which exports."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_hf(targets["llama"]), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
                           adapter_name="mine")
    model.save_pretrained(tmp_path / "a")
    r = export_cli(targets["llama"], "--lora", tmp_path / "a", "-o", tmp_path / "e")
    assert r.exit_code == 1 and "adapter_config.json: not found" in r.output, r.output
    assert f"not named 'default' in a subfolder: give --lora {tmp_path / 'a' / 'mine'}" in r.output, r.output
    assert export_cli(targets["llama"], "--lora", tmp_path / "a" / "mine", "-o", tmp_path / "e").exit_code == 0


SAVED = {
    "untied_both": ("llama", False, dict(modules_to_save=["embed_tokens", "lm_head"])),
    "untied_head": ("qwen3", False, dict(modules_to_save=["lm_head"])),
    "tied_kept_tied": ("llama", True, dict(modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True)),
}


@pytest.mark.parametrize("case", list(SAVED))
def test_modules_to_save_embeddings_and_head_taken(tmp_path, case):
    """The chat fine-tune's adapter: LoRA plus modules_to_save ["embed_tokens", "lm_head"] (full
    copies, trained): their copies replace the target's embeddings and head, as in PEFT's
    merge_and_unload model (ONNX Runtime's logits within TOL of it), recorded in the receipt, and
    the torch reference of compare takes them too. w77g's walk: refused, though common."""
    from specrt.engines.compare import _merge_lora
    from specrt.export.binding import bind_target
    import torch

    kind, tied, lora = SAVED[case]
    t = write_tiny_target(tmp_path / "t", kind, tied=tied, seed=4)
    a, ref = write_adapter(t, tmp_path / "a", **lora)
    r = export_cli(t, "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert "its modules_to_save replacing " in r.output, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL
    rec = load_export(tmp_path / "e")["binding_receipt"]["target"]["lora"]
    slots = {"embed_tokens": "embed", "lm_head": "lm_head"}
    want = {"embed"} if tied else {slots[m] for m in lora["modules_to_save"]}
    assert set(rec["modules_to_save"]) == want, rec["modules_to_save"]
    for s, e in rec["modules_to_save"].items():
        assert e["key"] == f"base_model.model.{'model.embed_tokens' if s == 'embed' else 'lm_head'}.weight", e
        # (no "saved_by", save_embedding_layers' alone: a receipt written before it compares equal in compare and
        # bench --variant; the final read of session 78)
        assert "saved_by" not in e, e
    model = load_hf(t)
    _merge_lora(model, t, {"binding_receipt": {"target": {"lora": rec}}})
    with torch.no_grad():
        assert maxerr(model(torch.tensor(IDS)).logits.numpy(), ref) <= TOL
    assert bind_target(t).slots["embed"].sha256 != rec["modules_to_save"].get("embed", {}).get("sha256")
    r = CliRunner().invoke(main, ["inspect", str(t), "--lora", str(a)])  # (what export would take, shown)
    assert r.exit_code == 0 and all(f"{e['key']} modules_to_save: replaced" in " ".join(r.output.split())
                                    for e in rec["modules_to_save"].values()), r.output
    if case == "untied_both":  # the same adapter as a pickle (--allow-lora-pickle): compare reads it as export did
        from safetensors.torch import load_file

        (tmp_path / "p").mkdir()
        shutil.copyfile(a / "adapter_config.json", tmp_path / "p" / "adapter_config.json")
        torch.save({k: v for k, v in load_file(str(a / "adapter_model.safetensors")).items() if "lora_" not in k},
                   tmp_path / "p" / "adapter_model.bin")
        _spoil_config(tmp_path / "p", target_modules=[])
        r = export_cli(t, "--lora", tmp_path / "p", "--allow-lora-pickle", "-o", tmp_path / "pe")
        assert r.exit_code == 0, r.output
        rec = load_export(tmp_path / "pe")["binding_receipt"]["target"]["lora"]
        assert rec["modules"] == {} and rec["modules_to_save"]["lm_head"]["file"] == "adapter_model.bin"
        _merge_lora(load_hf(t), t, {"binding_receipt": {"target": {"lora": rec}}})


@pytest.mark.parametrize("saved", [["embed_tokens", "lm_head"], ["embed_tokens"]])
def test_tied_head_trained_apart_refused(tmp_path, saved):
    """A tied target (SmolLM2's form) whose adapter's modules_to_save trains the embeddings and the
    head apart (PEFT's default, ensure_weight_tying false) or only one of them: PEFT's merged
    model unties them, which the tied export cannot hold; refused saying so (w77g's walk)."""
    t = write_tiny_target(tmp_path / "t", "llama", tied=True, seed=4)
    a, _ = write_adapter(t, tmp_path / "a", modules_to_save=saved)
    r = export_cli(t, "--lora", a, "-o", tmp_path / "e")
    said = "holds them apart" if len(saved) == 2 else "trains only one of them"
    assert r.exit_code == 1 and "the target's LM head is tied to its embeddings" in r.output, r.output
    assert said in r.output and str(a) in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "e").exists()


def test_resized_vocabulary_refused_naming_it(tmp_path):
    """An adapter of a model whose vocabulary was resized for added tokens (PEFT saves the resized
    embeddings and head, save_embedding_layers): refused naming the vocabulary sizes, not called
    a LoRA on the LM head (w77g's walk: it was)."""
    import torch
    from peft import LoraConfig, get_peft_model

    t = write_tiny_target(tmp_path / "t", "llama", seed=4)
    m = load_hf(t)
    m.resize_token_embeddings(m.config.vocab_size + 2)
    model = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=MODULES))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    with pytest.warns(UserWarning, match="resized"):
        model.save_pretrained(tmp_path / "a")
    r = export_cli(t, "--lora", tmp_path / "a", "-o", tmp_path / "e")
    assert r.exit_code == 1 and "a LoRA on the LM head" not in r.output, r.output
    assert "a full copy of the embeddings or the LM head" in r.output, r.output
    assert f"a vocabulary of {m.config.vocab_size} tokens, not the target's {m.config.vocab_size - 2}" in r.output
    assert not (tmp_path / "e").exists()


def _peft_merged(target: Path, a: Path) -> tuple[np.ndarray, list[str]]:
    """PEFT's own load of the adapter at ``a`` (PeftModel.from_pretrained): its merge_and_unload
    model's logits over IDS, and the warnings it gave."""
    import warnings

    import torch
    from peft import PeftModel

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(load_hf(target), a)
    with torch.no_grad():
        return model.merge_and_unload()(torch.tensor(IDS)).logits.numpy(), [str(w.message) for w in said]


LEFT_OUT = {  # adapter_config.json's fields (the tensors: all seven projections of every layer) -> what is refused
    "list": (dict(target_modules=MODULES[:6]), "model.layers.0.mlp.down_proj", r"target_modules \['q_proj', "),
    "regex": (dict(target_modules=r".*\.self_attn\.[qkvo]_proj"), "model.layers.0.mlp.gate_proj",
              r"target_modules '\.\*\\\\\.self_attn"),
    "null": (dict(target_modules=None), "model.layers.0.self_attn.k_proj",
             r"target_modules null \(PEFT's default \['q_proj', 'v_proj'\]\)"),
    "exclude_list": (dict(exclude_modules=["o_proj"]), "model.layers.0.self_attn.o_proj", r"exclude_modules \['o_proj'\]"),
    "exclude_regex": (dict(exclude_modules=r"model\.layers\.[23]\..*"), "model.layers.2.self_attn.q_proj",
                      r"exclude_modules 'model"),
}


@pytest.mark.parametrize("case", list(LEFT_OUT))
def test_tensor_of_a_module_not_targeted_refused(targets, adapter, tmp_path, case):
    """w78c: a tensor of a module that adapter_config.json's target_modules (a list, a regular
    expression, or null: PEFT's default for the family) or exclude_modules leaves out was merged;
    PEFT's loader gives that module no adapter and drops the tensor (its warning "unexpected
    adapter keys", checked here), so its merged model has none of it. Refused, naming the tensor,
    the module and the field (the adapter's file and its config disagree: the user decides)."""
    fields, module, said = LEFT_OUT[case]
    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, **fields)
    tensor = f"base_model.model.{module}.lora_A.weight"
    _, warned = _peft_merged(targets["llama"], a)
    assert any("unexpected adapter keys" in w and tensor in w for w in warned), warned
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"tensor '{tensor}' adapts '{module}', which {a / 'adapter_config.json'}'s " in r.output, r.output
    assert __import__("re").search(said + r".* leaves out: PEFT's loader drops such a tensor", r.output), r.output
    assert not (tmp_path / "e").exists()


def test_target_modules_as_peft_reads_them(targets, adapter, tmp_path):
    """w78c: target_modules as PEFT's check_target_module_exists reads it: "all-linear" (every
    projection), a regular expression matched whole, and an empty layers_to_transform restricting
    nothing (every tensor was refused: "adapts layer 0, which ... [] leaves out"). Each export's
    logits equal PEFT's own load's merge_and_unload."""
    for i, fields in enumerate([dict(target_modules="all-linear", exclude_modules=["lm_head"]),
                                dict(target_modules=r".*\.(self_attn|mlp)\.\w+_proj"),
                                dict(layers_to_transform=[])]):
        a = shutil.copytree(adapter, tmp_path / f"a{i}")
        _spoil_config(a, **fields)
        ref, _ = _peft_merged(targets["llama"], a)
        r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / f"e{i}")
        assert r.exit_code == 0 and "merging a LoRA adapter into 28 of them" in r.output, (fields, r.output)
        assert maxerr(onnx_logits(tmp_path / f"e{i}"), ref) <= TOL, fields


def test_a_module_named_whole_is_taken_in_any_layer(targets, tmp_path):
    """r78g: target_modules naming a module whole (its full path) beside layers_to_transform: PEFT's
    check_target_module_exists takes it whatever layer it is in (get_peft_model adapts it, its
    load keeps it), and export refused it ("adapts layer 1, which ... layers_to_transform [0]
    leaves out"). From 20 names on PEFT condenses the list into suffixes (every layer's 28
    projections: the 7 names), which the layers then restrict (its load drops the tensor, with
    "unexpected adapter keys"): still refused."""
    a, ref = write_adapter(targets["llama"], tmp_path / "a", target_modules=["model.layers.1.self_attn.q_proj", "k_proj"],
                           layers_to_transform=[0])
    assert not any("unexpected adapter keys" in w for w in _peft_merged(targets["llama"], a)[1])
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0 and "merging a LoRA adapter into 2 of them" in r.output, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL
    _spoil_config(a, target_modules=[f"model.layers.{i}.{'mlp' if m in MODULES[4:] else 'self_attn'}.{m}"
                                     for i in range(4) for m in MODULES])
    assert any("unexpected adapter keys" in w for w in _peft_merged(targets["llama"], a)[1])
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e2")
    assert r.exit_code == 1 and "adapts layer 1, which" in r.output and "layers_to_transform [0]" in r.output, r.output


TOKENS = [int(i) for i in dict.fromkeys(IDS[0, :4])] + [998]  # (rows read by the prompt, and one only the head has)


@pytest.mark.parametrize("tied,indices", [(False, TOKENS), (True, TOKENS), (True, {"embed_tokens": TOKENS})],
                         ids=["untied", "tied", "tied_dict"])
def test_trainable_tokens_taken(tmp_path, tied, indices):
    """w78c (session 77 refused it): trainable_token_indices beside the LoRA, PEFT's TrainableTokens
    (`...embed_tokens.token_adapter.trainable_tokens_delta`, whole rows despite its name): its
    merge replaces those rows of the embeddings (index_copy), and of a head tied to them; an
    untied head is kept. The export's logits (ONNX Runtime) equal PEFT's merge_and_unload's within
    TOL, the receipt records the rows, compare's torch reference takes them, inspect shows them."""
    import torch

    from specrt.engines.compare import _merge_lora

    t = write_tiny_target(tmp_path / "t", "llama", tied=tied, seed=4)
    a, ref = write_adapter(t, tmp_path / "a", target_modules=["q_proj", "down_proj"], trainable_token_indices=indices)
    r = export_cli(t, "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert f"its trainable tokens replacing {len(TOKENS)} rows of embed" in r.output, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL
    rec = load_export(tmp_path / "e")["binding_receipt"]["target"]["lora"]
    tt = rec["trainable_tokens"]["embed"]
    assert tt["indices"] == TOKENS and tt["key"].endswith("model.embed_tokens.token_adapter.trainable_tokens_delta")
    assert tt["shape"] == [len(TOKENS), 64], tt
    model = load_hf(t)
    _merge_lora(model, t, {"binding_receipt": {"target": {"lora": rec}}})
    with torch.no_grad():
        assert maxerr(model(torch.tensor(IDS)).logits.numpy(), ref) <= TOL
    r = CliRunner().invoke(main, ["inspect", str(t), "--lora", str(a)])
    assert r.exit_code == 0 and f"trainable tokens: {len(TOKENS)} rows replaced" in r.output, r.output


@pytest.mark.parametrize("indices,said", [
    ([5, 5], r"'trainable_token_indices' is \[5, 5\]; expected a list of token ids, each once"),
    ({"lm_head": [5]}, r"'trainable_token_indices' is \{'lm_head': \[5\]\}; expected"),
    ([5, 1000], r"trainable_token_indices holds the id 1000, past the target's vocabulary of 1000"),
    ([5, 6, 7], r"trainable_tokens_delta' has shape \[2, 64\]; expected \[3, 64\], a row for each of"),
], ids=["twice", "lm_head", "past_vocab", "rows"])
def test_trainable_tokens_refused(targets, adapter, tmp_path, indices, said):
    """w78c: trainable_token_indices that PEFT's merge would not make as export makes it (an id twice,
    another module's rows, an id past the vocabulary) refused, naming the field or the tensor."""
    from safetensors.numpy import load_file, save_file

    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, trainable_token_indices=indices)
    t = load_file(str(a / "adapter_model.safetensors"))
    t["base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"] = np.ones((2, 64), np.float32)
    save_file(t, str(a / "adapter_model.safetensors"), metadata={"format": "pt"})
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "Traceback" not in r.output and str(a) in r.output, r.output
    assert __import__("re").search(said, r.output), r.output
    assert not (tmp_path / "e").exists()


def test_bf16_base_merges_as_peft_does(tmp_path):
    """w78c (session 77 never tried one): an adapter (float32, as PEFT keeps it) on a bfloat16 base
    checkpoint. The float32 export's logits equal PEFT's merge_and_unload of the base read in
    float32 within TOL (1.3e-5 measured), and PEFT's bfloat16 run within that run's own bfloat16
    error (its distance from the float32 one: 0.18 on logits up to 3.5 measured); a bfloat16
    export holds PEFT's bfloat16 merged weights bit for bit (both round W + scale * B @ A once:
    PEFT adds the float32 delta into the bfloat16 weight in place). Its graph is not run: ONNX
    Runtime's CPU provider has no bfloat16 Mul."""
    import onnx
    import torch
    import transformers
    from peft import PeftModel

    t = tmp_path / "t"
    load_hf(write_tiny_target(tmp_path / "t32", "llama", seed=4)).to(torch.bfloat16).save_pretrained(t)
    a, _ = write_adapter(t, tmp_path / "a")
    merged = {}
    for dtype in (torch.float32, torch.bfloat16):
        base = transformers.AutoModelForCausalLM.from_pretrained(t, attn_implementation="eager", dtype=dtype).eval()
        merged[dtype] = PeftModel.from_pretrained(base, a).merge_and_unload()
    with torch.no_grad():
        ref32, ref16 = (merged[d](torch.tensor(IDS)).logits.float().numpy() for d in (torch.float32, torch.bfloat16))
    r = export_cli(t, "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    got = onnx_logits(tmp_path / "e")
    assert maxerr(got, ref32) <= TOL and maxerr(got, ref16) <= 1.5 * maxerr(ref32, ref16), (maxerr(got, ref32),
                                                                                            maxerr(got, ref16))
    assert export_cli(t, "--lora", a, "-o", tmp_path / "b", "--dtype", "bfloat16").exit_code == 0
    init = {i.name: i for i in onnx.load(str(tmp_path / "b" / "target.onnx")).graph.initializer}
    sd = merged[torch.bfloat16].state_dict()
    for slot, name in [("q", "self_attn.q_proj"), ("down", "mlp.down_proj")]:
        for i in range(4):
            w = init[f"layers.{i}.{slot}"]
            assert w.data_type == onnx.TensorProto.BFLOAT16
            want = sd[f"model.layers.{i}.{name}.weight"].view(torch.int16).numpy().tobytes()
            assert w.raw_data == want, (slot, i)


def test_serve_names_the_adapter(tmp_path):
    """w78c: `specrt serve` of a LoRA export listed (and answered as) the base's folder name, the
    name vLLM serves the base model under, where `--lora-modules NAME=PATH` serves the fine-tune as
    NAME. Its default id is now the adapter's folder name (the receipt's target.lora.folder);
    --model-name still comes first."""
    from peft import LoraConfig, get_peft_model

    from specrt.engines import build_engines
    from tests.cli.test_serve import _get, _serving
    from tests.runtime.test_text import _words

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(t)  # (serve needs a tokenizer: a word-level one)
    a = tmp_path / "my-sql-lora"
    get_peft_model(load_hf(t), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(a)
    assert export_cli(t, "--lora", a, "-o", tmp_path / "x").exit_code == 0
    build_engines(tmp_path / "x", "onnxruntime", (1,), tmp_path / "e", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    for options, want in (((), "my-sql-lora"), (("--model-name", "chosen"), "chosen")):
        p, line = _serving(tmp_path / "e", "--governor", "off", *options)  # (no draft: the last --governor counts)
        try:
            url = line.split(" on ")[1].split(" ")[0].removesuffix("/v1")
            code, listed = _get(url, "/v1/models")
            assert code == 200 and [m["id"] for m in listed["data"]] == [want], listed
        finally:
            p.kill()
            p.wait(timeout=60)
            p.stderr.close()


def test_serve_names_a_hub_snapshot_by_its_repository():
    """r78g: an adapter (or a target) in the Hugging Face hub cache is a snapshot folder named by its
    commit hash, which serve listed as the model id (`specrt export --lora
    ~/.cache/huggingface/hub/models--me--sql-lora/snapshots/0123abc/` served "0123abc"); it is
    listed as the repository's id, as the hub names it. A trailing slash, and any other folder,
    its last folder's name (the receipt's folder is resolved)."""
    from specrt.cmd_serve import served_name

    hub = "/root/.cache/huggingface/hub"
    assert served_name(f"{hub}/models--me--sql-lora/snapshots/0123abc") == "me/sql-lora"
    assert served_name(f"{hub}/models--gpt2/snapshots/0123abc") == "gpt2"
    assert served_name(f"{hub}/models--me--sql-lora/snapshots/0123abc/") == "me/sql-lora"
    assert served_name("/data/my-sql-lora/") == served_name("/data/my-sql-lora") == "my-sql-lora"
    assert served_name("/data/snapshots/x") == "x"


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_saved_embedding_layers_taken(tmp_path, tied):
    """w78h's walk: save_pretrained(..., save_embedding_layers=True) (tutorials pass it; PEFT's "auto"
    does too where the embeddings are targeted) writes the full embeddings and LM head beside the
    adapter, modules_to_save listing neither; PEFT's load takes them into the model (load_state_dict,
    strict=False). Export refused them ("a full copy of the embeddings or the LM head ... is not
    taken") though of the target's shape; now they replace the slots as modules_to_save's copies do
    (here trained apart from the base's: PEFT's merged logits within TOL), a tied head where equal.
    Export's log, inspect and the receipt name them save_embedding_layers' (w78h: "modules_to_save")."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    t = write_tiny_target(tmp_path / "t", "llama", tied=tied, seed=4)
    model = get_peft_model(load_hf(t), LoraConfig(r=4, lora_alpha=8, target_modules=MODULES))
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
        model.base_model.model.model.embed_tokens.weight.mul_(1.5)  # (a base embedding trained too)
        if not tied:
            model.base_model.model.lm_head.weight.mul_(0.5)
    model.save_pretrained(tmp_path / "a", save_embedding_layers=True)
    with torch.no_grad():
        ref = PeftModel.from_pretrained(load_hf(t), tmp_path / "a").merge_and_unload()(torch.tensor(IDS)).logits.numpy()
    r = export_cli(t, "--lora", tmp_path / "a", "-o", tmp_path / "e")
    assert r.exit_code == 0, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL
    rec = load_export(tmp_path / "e")["binding_receipt"]["target"]["lora"]
    assert set(rec["modules_to_save"]) == ({"embed"} if tied else {"embed", "lm_head"}), rec["modules_to_save"]
    said = f"its full copies saved by save_embedding_layers replacing {'embed' if tied else 'embed, lm_head'}"
    assert said in r.output and "modules_to_save" not in r.output, r.output
    assert {e["saved_by"] for e in rec["modules_to_save"].values()} == {"save_embedding_layers"}, rec["modules_to_save"]
    r = CliRunner().invoke(main, ["inspect", str(t), "--lora", str(tmp_path / "a")])
    assert r.exit_code == 0 and "save_embedding_layers: replaced" in r.output and "modules_to_save" not in r.output, \
        r.output


def test_a_folder_of_several_adapters_says_which_is_merged(targets, tmp_path):
    """w78h's walk: PEFT's save_pretrained of a model with two adapters ("default" and "second")
    writes default's files at the top and second's in OUT/second/; --lora OUT merged default and
    said nothing of second (PEFT's from_pretrained(OUT) loads default too). Export and inspect now
    note the other adapter and how to merge it."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_hf(targets["llama"]), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    model.add_adapter("second", LoraConfig(r=2, lora_alpha=8, target_modules=["v_proj"]))
    model.save_pretrained(tmp_path / "a")
    said = "also holds the adapter(s) second in subfolders"
    r = export_cli(targets["llama"], "--lora", tmp_path / "a", "-o", tmp_path / "e")
    assert r.exit_code == 0 and said in r.output and f"give --lora {tmp_path / 'a' / 'second'}" in r.output, r.output
    r = CliRunner().invoke(main, ["inspect", str(targets["llama"]), "--lora", str(tmp_path / "a")])
    assert r.exit_code == 0 and said in r.output, r.output
    r = export_cli(targets["llama"], "--lora", tmp_path / "a" / "second", "-o", tmp_path / "e2")
    assert r.exit_code == 0 and "also holds" not in r.output, r.output
