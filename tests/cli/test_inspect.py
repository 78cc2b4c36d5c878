"""`specrt inspect`: the binding table, JSON receipt, and user errors as exit 1 without traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cli import main

REF = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"


def test_inspect_table():
    r = CliRunner().invoke(main, ["inspect", str(REF / "verifier"), "--draft", str(REF / "draft")])
    assert r.exit_code == 0, r.output
    assert "final_norm" in r.output and "model.norm.weight" in r.output and "mask_hidden" in r.output
    assert "bound 54 slots" in r.output
    # the model speculators recorded as the one the draft was trained against (not checked)
    verifier = json.loads((REF / "draft" / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert f"  trained against: {verifier} (speculators_config.verifier.name_or_path)" in r.output


def test_inspect_json():
    r = CliRunner().invoke(main, ["inspect", str(REF / "verifier"), "--draft", str(REF / "draft"), "--json"])
    data = json.loads(r.output)
    assert data["draft"]["aux_layer_ids"] == [1, 2, 3] and data["draft"]["config"]["verifier_name"]
    assert data["target"]["slots"]["final_norm"]["key"] == "model.norm.weight"


def test_user_error_exit_1_no_traceback(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    p = subprocess.run([sys.executable, "-m", "specrt.cli", "inspect", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.startswith("error: ") and "config.json: not valid JSON" in p.stderr
    assert "Traceback" not in p.stderr


def test_target_and_draft_given_the_wrong_way_round_are_named():
    r = CliRunner().invoke(main, ["inspect", str(REF / "draft")])
    assert r.exit_code == 1 and "a speculators draft (speculators_model_type 'peagle'), not a target model" in r.output
    r = CliRunner().invoke(main, ["inspect", str(REF / "verifier"), "--draft", str(REF / "verifier")])
    assert r.exit_code == 1 and "a transformers model (model_type 'llama'), not a speculators draft" in r.output


@pytest.mark.slow
def test_inspect_real_smollm2():
    from tests.real_model import smollm2_folder

    folder = smollm2_folder()
    r = CliRunner().invoke(main, ["inspect", str(folder), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    # 30 layers x 9 slots + embed + final norm (lm_head tied to the embeddings)
    assert len(data["target"]["slots"]) == 30 * 9 + 3
    assert data["target"]["slots"]["lm_head"] == {"tied_to": "embed", "sha256": data["target"]["slots"]["embed"]["sha256"]}


@pytest.mark.parametrize("cmd", ["inspect", "export"])
def test_draft_options_without_a_draft_are_refused(cmd, tmp_path):
    """--draft-aux-ids, --draft-embeddings and --allow-draft-pickle shape how a draft is read:
    given without --draft they would be ignored without a word, so they are refused, named."""
    out = ["-o", str(tmp_path / "exp")] if cmd == "export" else []
    for options, named in ((["--draft-embeddings", "own"], "--draft-embeddings: applies"),
                           (["--draft-aux-ids", "layer-input"], "--draft-aux-ids: applies"),
                           (["--allow-draft-pickle", "--draft-embeddings", "target"],
                            "--allow-draft-pickle, --draft-embeddings: apply")):
        r = CliRunner().invoke(main, [cmd, str(REF / "verifier"), *out, *options])
        assert r.exit_code == 1 and f"error: {named} to a draft, and no --draft was given" in r.output, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not (tmp_path / "exp").exists()
    r = CliRunner().invoke(main, [cmd, str(REF / "verifier"), *out])  # the defaults alone: no draft needed
    assert r.exit_code == 0, r.output


def test_a_draft_option_declared_once_is_refused_without_a_draft(monkeypatch):
    """The draft's options are held once (cli._DRAFT_OPTIONS), declared from there and refused
    from there without --draft: _check_draft_options named the three by hand, so a fourth would
    have been ignored without a word. Their choices are export's own (specrt.contracts, which
    the CLI imports at start-up where it does not import export)."""
    import click

    from specrt import cli, contracts
    from specrt.export import binding, config

    assert binding.DRAFT_EMBEDDINGS is contracts.DRAFT_EMBEDDINGS and config.DRAFT_AUX_IDS is contracts.DRAFT_AUX_IDS
    choices = {p.opts[0]: getattr(p.type, "choices", None) for p in cli.main.commands["export"].params}
    assert list(choices["--draft-embeddings"]) == list(contracts.DRAFT_EMBEDDINGS)
    assert list(choices["--draft-aux-ids"]) == list(contracts.DRAFT_AUX_IDS)
    monkeypatch.setitem(cli._DRAFT_OPTIONS, "--draft-fourth", dict(is_flag=True))

    @click.command()
    @click.option("--draft")
    @cli._draft_options
    def command(draft, **options):
        cli._check_draft_options(draft)

    r = CliRunner().invoke(command, ["--draft-fourth", "--allow-draft-pickle"])
    assert isinstance(r.exception, cli.UserError), r.output
    assert str(r.exception) == "--allow-draft-pickle, --draft-fourth: apply to a draft, and no --draft was given"
    assert CliRunner().invoke(command, ["--draft-fourth", "--draft", "d"]).exit_code == 0


@pytest.mark.parametrize("side", ["target", "draft"])
def test_a_weight_export_refuses_as_non_finite_is_refused_by_inspect_too(tmp_path, side):
    """A NaN in the draft's norm.weight (or an inf in the target's): inspect printed the table
    and exited 0, then `specrt export` refused the same pair (a user walk, session 72; the
    README has inspect give "every weight's slot, or the error"). Now the same error, exit 1;
    so is a training receipt beside the draft that the acceptance canary cannot read."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / side
    shutil.copytree(REF / ("verifier" if side == "target" else "draft"), folder)
    w = load_file(str(folder / "model.safetensors"))
    name = "model.norm.weight" if side == "target" else "norm.weight"
    w[name] = w[name].copy()
    w[name][1] = np.inf if side == "target" else np.nan
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})
    target, draft = (folder, REF / "draft") if side == "target" else (REF / "verifier", folder)
    for extra in ([], ["--json"]):
        r = CliRunner().invoke(main, ["inspect", str(target), "--draft", str(draft), *extra])
        assert r.exit_code == 1 and f"tensor '{name}' (slot 'final_norm') holds 1 non-finite value(s) " \
            f"({'inf' if side == 'target' else 'NaN'}); a checkpoint's weights must be finite" in r.output, r.output
        assert "bound" not in r.output and "Traceback" not in r.output
    if side == "draft":
        save_file(load_file(str(REF / "draft" / "model.safetensors")), str(folder / "model.safetensors"),
                  metadata={"format": "pt"})
        (folder / "training_receipt.json").write_text(json.dumps({"heldout": {"acceptance_at_pos": [1.7]}}))
        r = CliRunner().invoke(main, ["inspect", str(target), "--draft", str(draft)])
        assert r.exit_code == 1 and f"{folder / 'training_receipt.json'}: heldout.acceptance_at_pos[0] must be an " \
            "acceptance rate from 0 to 1" in r.output and "bound" not in r.output, r.output


def test_inspect_binds_a_target_whose_tokenizer_files_it_cannot_read(tmp_path):
    """The EOS note (w73d) reads the tokenizer: a chat_template.jinja that is not UTF-8 (export's
    to refuse) made `specrt inspect`, which binds weights, fail with the template's error; the note
    is left out there, and a target with an EOS id its tokenizer names is bound without one."""
    from tests.fixtures_models import write_tiny_target
    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    (target / "chat_template.jinja").write_bytes(b"caf\xe9 {{ messages[0].content }}")
    r = CliRunner().invoke(main, ["inspect", str(target)])
    assert r.exit_code == 0 and "bound" in r.output and "not valid UTF-8" not in r.output, r.output
    r = CliRunner().invoke(main, ["export", str(target), "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "chat_template.jinja: not valid UTF-8 text" in r.output, r.output


@pytest.fixture(scope="module")
def lora_pair(tmp_path_factory):
    """A tiny Llama target and PEFT's adapter of it on q, v and down of layers 1 and 3, down's rank 2
    (rank_pattern), v's alpha 32 (alpha_pattern): tests/export/test_lora.py's write_adapter."""
    pytest.importorskip("peft")
    from tests.export.test_lora import write_adapter
    from tests.fixtures_models import write_tiny_target

    root = tmp_path_factory.mktemp("inspect_lora")
    target = write_tiny_target(root / "t", "llama", seed=1)
    adapter, _ = write_adapter(target, root / "a", target_modules=["q_proj", "v_proj", "down_proj"],
                               layers_to_transform=[1, 3], rank_pattern={"down_proj": 2}, alpha_pattern={"v_proj": 32})
    return target, adapter


def test_inspect_lora_shows_what_export_would_merge(lora_pair, tmp_path):
    """h77e left it undone (h77j): `inspect --lora` shows the adapter export --lora merges (its folder,
    r, alpha, rslora, base_model_name_or_path; each module by slot with its rank, alpha and scale; how
    many of the target's linear weights it changes); --json the receipt export writes (its target.lora
    and receipt_id the export's)."""
    from specrt.manifest import load_export

    target, adapter = lora_pair
    r = CliRunner().invoke(main, ["inspect", str(target), "--lora", str(adapter)])
    assert r.exit_code == 0, r.output
    assert (f"lora: {adapter.resolve()} (r 4, lora_alpha 8, use_rslora false; base_model_name_or_path "
            f"'{target}')") in r.output
    rows = [s.split() for s in r.output.splitlines() if ".lora_A/B" in s]
    assert [(w[0], w[2].split(".")[5], w[4], w[6], w[8]) for w in rows] == [
        ("layers.1.q", "self_attn", "4", "8", "2"), ("layers.3.q", "self_attn", "4", "8", "2"),
        ("layers.1.v", "self_attn", "4", "32", "8"), ("layers.3.v", "self_attn", "4", "32", "8"),
        ("layers.1.down", "mlp", "2", "8", "4"), ("layers.3.down", "mlp", "2", "8", "4")]
    assert "  changes 6 of the target's 28 linear weights" in r.output and "warning" not in r.output
    r = CliRunner().invoke(main, ["inspect", str(target), "--lora", str(adapter), "--json"])
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    e = CliRunner().invoke(main, ["export", str(target), "--lora", str(adapter), "-o", str(tmp_path / "e")])
    assert e.exit_code == 0, e.output
    written = load_export(tmp_path / "e")["binding_receipt"]
    assert shown["target"]["lora"] == written["target"]["lora"] and shown["receipt_id"] == written["receipt_id"]
    assert shown["target"]["lora"]["modules"]["layers.3.down"]["scale"] == 4.0


def test_inspect_lora_refuses_as_export_refuses(lora_pair, tmp_path):
    """h77j: what export --lora refuses, inspect --lora refuses with the same UserError, exit 1, no
    traceback: a DoRA config, a tensor of another rank, a NaN in a lora_B (read as export reads it),
    a pickle without --allow-lora-pickle, that flag without --lora; base_model_name_or_path naming
    another model is export's warning."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    target, adapter = lora_pair
    q = "base_model.model.model.layers.1.self_attn.q_proj"

    def config(a, **fields):
        (a / "adapter_config.json").write_text(json.dumps({**json.loads((a / "adapter_config.json").read_text()),
                                                           **fields}))

    def nan(a):
        w = load_file(str(a / "adapter_model.safetensors"))
        w[f"{q}.lora_B.weight"][2, 1] = np.nan
        save_file(w, str(a / "adapter_model.safetensors"), metadata={"format": "pt"})

    def pickle(a):
        import torch
        from safetensors.torch import load_file as load_torch

        torch.save(load_torch(str(a / "adapter_model.safetensors")), a / "adapter_model.bin")
        (a / "adapter_model.safetensors").unlink()

    for spoil, said in ((lambda a: config(a, use_dora=True), "'use_dora' is True: DoRA"),
                        (lambda a: config(a, rank_pattern={"q_proj": 2}), f"'{q}.lora_A.weight' has shape [4, 64]; "
                                                                          "expected [2, 64]"),
                        (nan, f"tensor '{q}.lora_B.weight' holds 1 non-finite value(s) (NaN)"),
                        (pickle, "only pickle weights (adapter_model.bin) found")):
        a = shutil.copytree(adapter, tmp_path / "a", dirs_exist_ok=True)
        spoil(a)
        errors = []
        for cmd in (["inspect", str(target)], ["export", str(target), "-o", str(tmp_path / "e")]):
            r = CliRunner().invoke(main, [*cmd, "--lora", str(a)])
            assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, (cmd, r.output)
            errors.append([s for s in r.output.splitlines() if s.startswith("error: ")])
        assert errors[0] == errors[1] and len(errors[0]) == 1 and not (tmp_path / "e").exists()
        shutil.rmtree(a)
    r = CliRunner().invoke(main, ["inspect", str(target), "--allow-lora-pickle"])
    assert r.exit_code == 1 and "--allow-lora-pickle: applies to a LoRA adapter, and no --lora" in r.output
    a = shutil.copytree(adapter, tmp_path / "a")
    config(a, base_model_name_or_path="Qwen/Qwen3-8B")
    r = CliRunner().invoke(main, ["inspect", str(target), "--lora", str(a)])
    assert r.exit_code == 0 and "base_model_name_or_path is 'Qwen/Qwen3-8B', which does not name the target" in r.output
