"""Mutation round m78i over session 78's export --lora checks (export/lora.py: read_adapter_config's
target_modules / exclude_modules / trainable_token_indices checks, _left_out, _token_rows): each
test kills a hand mutant that tests/export/test_lora.py let live (its docstring names it:
"m78i-N"), on PEFT's own adapters of the tiny transformers targets (test_lora.py's fixtures)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from .test_lora import _spoil_config, adapter, export_cli, targets  # noqa: F401  (fixtures)

pytest.importorskip("peft")

DELTA = "base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"

CONFIGS = {  # adapter_config.json's fields -> the refusal's words
    # m78i-L1: a list holding a non-string (was refused as leaving the module out, naming no type)
    "target_modules_item": (dict(target_modules=["q_proj", 5]),
                            r"'target_modules' is \['q_proj', 5\]; expected a list of module names"),
    # m78i-L2: a pattern that is no regular expression (re.error's traceback from _left_out)
    "target_modules_regex": (dict(target_modules="(q_proj"),
                             r"'target_modules' is '\(q_proj', not a regular expression PEFT can match"),
    "exclude_modules_regex": (dict(exclude_modules="[o_proj"),
                              r"'exclude_modules' is '\[o_proj', not a regular expression PEFT can match"),
    # m78i-L3: an empty layers_to_transform beside a string target_modules (PEFT's PeftConfig refuses
    # it: "is not None"; the mutant's truthiness took it and exported what PEFT cannot load)
    "layers_empty_with_regex": (dict(target_modules=".*_proj", layers_to_transform=[]),
                                r"'layers_to_transform' is \[\] with target_modules a string"),
    # m78i-L19: layers_to_transform a single layer's index (PEFT's int form; set() of it: a TypeError)
    "layers_int": (dict(layers_to_transform=1), r"adapts layer 0, which .*layers_to_transform 1 leaves out"),
    # m78i-L4 / L7: a negative id (numpy's a[-1] replaced the last row) and no ids (max()'s traceback)
    "tokens_negative": (dict(trainable_token_indices=[-1]), r"'trainable_token_indices' is \[-1\]; expected a list"),
    "tokens_empty": (dict(trainable_token_indices=[]), r"'trainable_token_indices' is \[\]; expected a list"),
    # m78i-L8: trainable tokens beside the whole embeddings saved (PEFT refuses both)
    "tokens_beside_saved_embeddings": (dict(trainable_token_indices=[5], modules_to_save=["embed_tokens"]),
                                       r"'trainable_token_indices' is \[5\] beside modules_to_save \['embed_tokens'\]"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_an_adapter_config_peft_would_not_load_is_refused_naming_its_field(targets, adapter, tmp_path, case):  # noqa: F811
    """m78i-L1, L2, L3, L4, L7, L8: read_adapter_config's checks of session 78's new fields, each
    refusal naming the field and what was expected; m78i-L19: _left_out's reading of an int
    layers_to_transform. Exit 1, no traceback, nothing written."""
    fields, said = CONFIGS[case]
    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, **fields)
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.search(said, r.output), r.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("rows,said", [
    (np.ones((1, 64), np.int32), rf"tensor '{DELTA}' has dtype I32, expected one of F32"),
    (np.full((1, 64), np.nan, np.float32), rf"tensor '{DELTA}' holds 64 non-finite value\(s\) \(NaN\)"),
], ids=["int_rows", "nan_rows"])
def test_trainable_token_rows_of_no_float_or_not_finite_are_refused(targets, adapter, tmp_path, rows, said):  # noqa: F811
    """m78i-L21: _token_rows' dtype check dropped (int32 rows merged as numbers); m78i-L27: the
    rows read without BoundLora._finite (NaN rows merged into the embeddings: every later token
    NaN). Each refused naming the tensor."""
    from safetensors.numpy import load_file, save_file

    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, trainable_token_indices=[5])
    t = load_file(str(a / "adapter_model.safetensors"))
    t[DELTA] = rows
    save_file(t, str(a / "adapter_model.safetensors"), metadata={"format": "pt"})
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert re.search(said, r.output), r.output
    assert not (tmp_path / "e").exists()


READ = {  # adapter_config.json's fields -> None (every tensor taken) or the module refused, with the field's words
    # m78i-L9: exclude_modules a string is matched whole (re.search excluded o_proj)
    "exclude_regex_whole": (dict(exclude_modules="o_proj"), None, None),
    # m78i-L13: "all-linear" in any case (PEFT lowers it; the exact spelling alone was taken)
    "all_linear_upper": (dict(target_modules="ALL-LINEAR", exclude_modules=["lm_head"]), None, None),
    # m78i-L10: exclude_modules naming a module by its full path (suffixes alone were read)
    "exclude_full_path": (dict(exclude_modules=["model.layers.0.self_attn.o_proj"]), "model.layers.0.self_attn.o_proj",
                          r"exclude_modules \['model\.layers\.0\.self_attn\.o_proj'\]"),
    # m78i-L14: target_modules a string is matched whole (re.search took "self_attn..." inside the name)
    "target_regex_whole": (dict(target_modules=r"self_attn\.[qkvo]_proj"), "model.layers.0.self_attn.q_proj",
                           r"target_modules 'self_attn"),
    # m78i-L15: a listed name is a suffix after a dot ("proj" took every ..._proj)
    "target_suffix_after_a_dot": (dict(target_modules=["proj"]), "model.layers.0.self_attn.q_proj",
                                  r"target_modules \['proj'\]"),
}


@pytest.mark.parametrize("case", list(READ))
def test_target_and_exclude_modules_are_read_as_peft_reads_them(targets, adapter, tmp_path, case):  # noqa: F811
    """_left_out read as PEFT's check_target_module_exists (its load warns "unexpected adapter keys"
    exactly where a tensor is dropped, checked here; where no module matches, its load fails):
    each case above taken whole (28 modules merged) or refused naming the module and the field,
    as PEFT's own load of the adapter does."""
    from peft.utils.error import NoMatchingPeftModuleError

    from .test_lora import _peft_merged

    fields, module, said = READ[case]
    a = shutil.copytree(adapter, tmp_path / "a")
    _spoil_config(a, **fields)
    try:
        warned = _peft_merged(targets["llama"], a)[1]
    except NoMatchingPeftModuleError as e:  # (nothing matched: PEFT loads none of it)
        warned = [f"unexpected adapter keys (none loaded: {e}) base_model.model.{module}.lora_A.weight"]
    dropped = [w for w in warned if "unexpected adapter keys" in w]
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    if module is None:
        assert not dropped and r.exit_code == 0 and "merging a LoRA adapter into 28 of them" in r.output, (dropped,
                                                                                                         r.output)
        return
    tensor = f"base_model.model.{module}.lora_A.weight"
    assert any(tensor in w for w in dropped), warned
    assert r.exit_code == 1 and f"tensor '{tensor}' adapts '{module}'" in r.output, r.output
    assert re.search(said + r".* leaves out: PEFT's loader drops such a tensor", r.output), r.output


def test_twenty_modules_named_whole_are_condensed_as_peft_condenses_them(targets, tmp_path):  # noqa: F811
    """m78i-L17: _left_out's `len(tm) >= 20` as `> 20`: PEFT's inject_adapter condenses a list of
    MIN_TARGET_MODULES_FOR_OPTIMIZATION (20) names or more into suffixes, which layers_to_transform
    then restricts (its load drops the layer-1 tensor, warning "unexpected adapter keys"); at
    exactly 20 the mutant took the tensor of layer 1 as named whole, merging what PEFT's merged
    model has none of. Refused, naming the layer (test_lora.py's case has 28 names). (PEFT keeps
    the list as it is where condensing would not shorten it: the "kept" case below.)"""
    from .test_lora import MODULES, _peft_merged, write_adapter

    a, _ = write_adapter(targets["llama"], tmp_path / "a", target_modules=["model.layers.1.self_attn.q_proj", "k_proj"],
                         layers_to_transform=[0])
    names = [f"model.layers.{i}.{'mlp' if m in MODULES[4:] else 'self_attn'}.{m}" for i in range(4) for m in MODULES[:5]]
    _spoil_config(a, target_modules=names)  # (20: five projections of every layer, condensed into their five names)
    assert any("unexpected adapter keys" in w for w in _peft_merged(targets["llama"], a)[1])
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    assert r.exit_code == 1 and "adapts layer 1, which" in r.output and "layers_to_transform [0]" in r.output, r.output


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_module_names_are_the_base_models_and_condensed_as_peft_condenses(targets, family):  # noqa: F811
    """m78i's finding: _left_out condenses target_modules as PEFT's inject_adapter does, against the
    base model's module names: _module_names equals transformers' named_modules() of the tiny
    target, and _condensed equals PEFT's own _find_minimal_target_modules where it shortens the list."""
    from peft.tuners.tuners_utils import _find_minimal_target_modules
    from transformers import AutoConfig, AutoModelForCausalLM

    from specrt.export.binding import bind_target
    from specrt.export.lora import _condensed, _module_names

    from .test_lora import MODULES

    names = _module_names(bind_target(targets[family]))
    assert names == [n for n, _ in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(targets[family]))
                     .named_modules()]
    full = [f"model.layers.{i}.{'mlp' if m in MODULES[4:] else 'self_attn'}.{m}" for i in range(4) for m in MODULES]
    for tm in (full[:20], [n for n in full if n.split(".")[-1] in MODULES[:5]] + full[5:6], full):  # (kept, condensed)
        others = [n for n in names if n not in tm and not n.endswith(tuple(f".{k}" for k in tm))]
        peft = _find_minimal_target_modules(tm, others)
        assert _condensed(tm, names) == sorted(peft if len(peft) < len(tm) else tm), tm


@pytest.mark.parametrize("case", ["kept", "condensed"])
def test_twenty_names_restricted_by_layer_only_where_peft_condenses_them(targets, tmp_path, case):  # noqa: F811
    """m78i's finding (bug20): `len(tm) >= 20` restricted 20 full names by layers_to_transform [0]
    though PEFT keeps such a list whole (condensing would not shorten it: layers 0 and 1 whole, 6 of
    layer 2's) and loads layer 1's tensors; export refused the adapter. Now it merges them as PEFT
    does (its load warns of no "unexpected adapter keys"; logits equal its merge_and_unload's), and
    still refuses where PEFT condenses the list (q, k, v, o, gate of every layer -> five suffixes)."""
    from .test_graph_parity import TOL, maxerr
    from .test_lora import MODULES, _peft_merged, onnx_logits, write_adapter

    full = [f"model.layers.{i}.{'mlp' if m in MODULES[4:] else 'self_attn'}.{m}" for i in range(4) for m in MODULES]
    names = full[:20] if case == "kept" else [n for n in full if n.split(".")[-1] in MODULES[:5]]
    a, _ = write_adapter(targets["llama"], tmp_path / "a", target_modules=names)
    _spoil_config(a, target_modules=names, layers_to_transform=[0])
    ref, warned = _peft_merged(targets["llama"], a)
    r = export_cli(targets["llama"], "--lora", a, "-o", tmp_path / "e")
    if case == "condensed":
        assert any("unexpected adapter keys" in w for w in warned), warned
        assert r.exit_code == 1 and "adapts layer 1, which" in r.output, r.output
        return
    assert not any("unexpected adapter keys" in w for w in warned), warned
    assert r.exit_code == 0 and "merging a LoRA adapter into 20 of them" in r.output, r.output
    assert maxerr(onnx_logits(tmp_path / "e"), ref) <= TOL
