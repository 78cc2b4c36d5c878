"""`specrt export`: the folder, its manifest, atomic writing, and hash checks on load."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from specrt.errors import UserError
from specrt.export import export as export_mod
from specrt.manifest import load_export
from tests.bad_paths import bad_paths
from tests.fixtures_models import write_tiny_draft, write_tiny_target

from .conftest import REFERENCE


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("exp")
    m = export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", root / "out")
    return root / "out", m


def test_folder_and_manifest(exported):
    out, m = exported
    assert (out / "export.json").is_file() and (out / "target.onnx").is_file() and (out / "draft.onnx").is_file()
    assert m["draft"]["kind"] == "peagle" and m["draft"]["mask_token_id"] == 999
    # the draft's own proposal depth, speculators_config's 4 (mutant m69c-E18 wrote EAGLE's 3 for every draft)
    assert m["draft"]["speculative_tokens"] == 4
    assert m["target"]["aux_layer_ids"] == [1, 2, 3]
    assert m["binding_receipt"]["draft"]["aux_layer_ids"] == [1, 2, 3]
    names = [t["name"] for t in m["graphs"]["target"]["io"]["inputs"]]
    assert names[:4] == ["input_ids", "position_ids", "past_key.0", "past_value.0"]
    for g in ("target", "draft"):
        onnx.checker.check_model(str(out / f"{g}.onnx"), full_check=True)
        model = onnx.load(str(out / f"{g}.onnx"), load_external_data=False)
        io = m["graphs"][g]["io"]
        assert [i.name for i in model.graph.input] == [t["name"] for t in io["inputs"]]
        assert [o.name for o in model.graph.output] == [t["name"] for t in io["outputs"]]
    assert load_export(out)["format"] == "specrt-export/1"


def test_tampered_graph_refused(exported, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(exported[0], out)
    data = bytearray((out / "draft.onnx").read_bytes())
    data[-10] ^= 1
    (out / "draft.onnx").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"draft.onnx: content differs from the export manifest"):
        load_export(out)
    (out / "draft.onnx").unlink()
    with pytest.raises(UserError, match=r"export file 'draft.onnx' is missing"):
        load_export(out)


def test_interrupted_export_leaves_nothing(tmp_path, monkeypatch):
    from specrt.export import graphs

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(graphs, "build_peagle_graph", boom)
    with pytest.raises(KeyboardInterrupt):
        export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # no out, no partial folder
    with pytest.raises(UserError, match="not a complete export folder"):
        load_export(tmp_path / "out")


def test_existing_folder_needs_force(exported, monkeypatch):
    with pytest.raises(UserError, match="already exists"):
        export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", exported[0])

    def bind(*a, **k):  # refused before binding, which reads and hashes every weight (4 s on SmolLM2)
        raise AssertionError("bound before the output folder was checked")

    monkeypatch.setattr(export_mod, "bind_target", bind)
    with pytest.raises(UserError, match="already exists"):
        export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", exported[0])


def test_bad_dtype_names_the_option(tmp_path):
    with pytest.raises(UserError, match="--dtype 'int8' is not supported"):
        export_mod.export(REFERENCE / "verifier", None, tmp_path / "o", dtype="int8")
    assert not (tmp_path / "o").exists()


def test_cli_export_is_float32_unless_told_and_names_a_bad_dtype(tmp_path):
    """`specrt export` without --dtype writes float32 graphs (the precision build and run take
    by default); --dtype int8 exits 1 naming the option, writing nothing."""
    import json

    from click.testing import CliRunner

    from specrt.cli import main

    r = CliRunner().invoke(main, ["export", str(REFERENCE / "verifier"), "-o", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o" / "export.json").read_text())["dtype"] == "float32"
    r = CliRunner().invoke(main, ["export", str(REFERENCE / "verifier"), "-o", str(tmp_path / "b"), "--dtype", "int8"])
    assert r.exit_code == 1 and "error: --dtype 'int8' is not supported" in r.output, r.output
    assert not (tmp_path / "b").exists()


def test_a_dtype_is_named_as_build_names_a_precision():
    """--dtype took only "float32" as typed where build's --precision took FP32, float32 and
    fp32: "FLOAT32", "fp16" and "'float32 '" were refused (a walk of every option's spellings)."""
    assert export_mod.export_dtype("FLOAT32") == export_mod.export_dtype(" float32") == "float32"
    assert export_mod.export_dtype("fp16") == export_mod.export_dtype("Float16") == "float16"
    assert export_mod.export_dtype("BF16 ") == "bfloat16"
    for bad in ("int8", "fp 16", "float", " INT8"):  # (named as typed: mutant m71c-61 said 'int8')
        with pytest.raises(UserError, match=f"^--dtype '{bad}' is not supported \\(choose one of float32, float16, "
                                            "bfloat16\\)$"):
            export_mod.export_dtype(bad)


def test_export_takes_a_dtype_as_typed_and_records_its_name(tmp_path):
    """export() itself reads --dtype's spellings (mutant m71c-49 checked "FP32" and went on with it)."""
    m = export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", tmp_path / "o", dtype=" FP32")
    assert m["dtype"] == "float32"
    assert json.loads((tmp_path / "o" / "export.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_precision_exports_check(tmp_path, dtype):
    m = export_mod.export(REFERENCE / "verifier", REFERENCE / "draft", tmp_path / "o", dtype=dtype)
    assert m["dtype"] == dtype
    onnx.checker.check_model(str(tmp_path / "o" / "target.onnx"), full_check=True)
    # each graph's inputs and outputs are of the types export.json records, the export's dtype (mutant
    # m69c-E27 built a float32 target graph under a float16 record)
    types = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16,
             "bfloat16": onnx.TensorProto.BFLOAT16, "int64": onnx.TensorProto.INT64}
    for g in ("target", "draft"):
        model = onnx.load(str(tmp_path / "o" / f"{g}.onnx"), load_external_data=False)
        got = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
        io = m["graphs"][g]["io"]
        assert {t["name"]: types[t["dtype"]] for t in (*io["inputs"], *io["outputs"])} == got, g
        assert dtype in {t["dtype"] for t in io["outputs"]}


def test_eagle3_reduced_vocab_export(tmp_path):
    target = write_tiny_target(tmp_path / "t", "qwen3")
    draft = write_tiny_draft(tmp_path / "d", target, kind="eagle3", draft_vocab=300)
    m = export_mod.export(target, draft, tmp_path / "o")
    assert m["draft"]["kind"] == "eagle3" and m["draft"]["vocab_map"]["file"] == "draft_vocab.safetensors"
    load_export(tmp_path / "o")
    # kills S39 (manifest.py:420 the vocabulary map's file name unchecked: a record of another file
    # of the export, its hash and size right, was read as the map) and S26 (:241 without
    # UnicodeDecodeError: an export.json that is no UTF-8 text was a traceback)
    import json

    p = tmp_path / "o" / "export.json"
    data = json.loads(p.read_text())
    data["draft"]["vocab_map"] = dict(data["graphs"]["draft"]["files"][0])
    p.write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"field 'draft.vocab_map.file' names \['draft.onnx'\]; expected "
                                        r"\['draft_vocab.safetensors'\], the file `specrt export` wrote"):
        load_export(tmp_path / "o")
    p.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(UserError, match=f"{p}: not valid JSON \\('utf-8' codec can't decode byte 0xff"):
        load_export(tmp_path / "o")
    p.write_text("[1]")  # kills S27 (:244 without the object check: an AttributeError traceback)
    with pytest.raises(UserError, match=f"{p}: not an export manifest \\(expected format 'specrt-export/1'\\)"):
        load_export(tmp_path / "o")


@pytest.mark.parametrize("name, bad, why", [(name, bad, why) for name in ["target_dir", "draft_dir", "out"]
                                            for bad, why in bad_paths("a folder", optional=name == "draft_dir")])
def test_a_bad_path_is_refused_naming_the_argument(tmp_path, monkeypatch, name, bad, why):
    """Path('') is '.', the working folder: `out=""` was refused as "already exists" naming
    nothing the caller wrote (with force, an empty working folder became the export), an
    empty target or draft read the working folder's config.json; bytes were pathlib's
    TypeError, a traceback. Refused before any work, as the CLI refuses it."""
    monkeypatch.chdir(tmp_path)
    args = dict(target_dir=REFERENCE / "verifier", draft_dir=REFERENCE / "draft", out=tmp_path / "o")
    args[name] = bad
    with pytest.raises(UserError, match=f"^{name}: {why}"):
        export_mod.export(**args)
    assert not any(tmp_path.iterdir())


def test_export_reads_the_targets_tokenizer_once(tmp_path):
    """export checks the target's tokenizer.json as the runtime reads it: it read the file as
    JSON (for the 'not valid JSON' message) and then again with tokenizers, twice the bytes of
    a file of 2-17 MB for a real model. Counted by the kernel (/proc/self/io's rchar: bytes
    this process read), on a file made 4 MB with the whitespace JSON allows."""
    import re

    from tests.runtime.test_text import _words

    io = Path("/proc/self/io")
    if not io.is_file():
        pytest.skip("needs Linux's /proc/self/io")
    _words(tmp_path)
    tok = tmp_path / "tokenizer.json"
    tok.write_text(tok.read_text() + " " * 4_000_000)
    export_mod._check_tokenizer_files(tmp_path)  # (imports tokenizers and runtime/text.py first)
    before = int(re.search(r"rchar: (\d+)", io.read_text()).group(1))
    export_mod._check_tokenizer_files(tmp_path)
    read = int(re.search(r"rchar: (\d+)", io.read_text()).group(1)) - before
    assert tok.stat().st_size <= read < 1.5 * tok.stat().st_size, read


def test_cli_export_user_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "specrt.cli", "export", str(REFERENCE / "verifier"), "--draft",
                        str(REFERENCE / "verifier"), "-o", str(tmp_path / "o")], capture_output=True, text=True)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "a transformers model (model_type 'llama'), not a speculators draft" in p.stderr
    assert not (tmp_path / "o").exists()


def test_an_output_over_an_input_is_refused_even_with_force(tmp_path, monkeypatch):
    """-o the target folder, a folder inside it, the folder holding it, or the draft's (and
    `-o .` there): refused before anything is written, the checkpoint left whole."""
    import shutil

    from specrt.engines import build_engines

    ckpt, draft = tmp_path / "ckpts" / "verifier", tmp_path / "draft"
    shutil.copytree(REFERENCE / "verifier", ckpt)
    shutil.copytree(REFERENCE / "draft", draft)
    before = sorted(p.name for p in ckpt.iterdir())
    replace, add = "replacing it would delete the input", "writing there would add to the folder being read"
    for out, how, why in ((ckpt, "is", replace), (ckpt / "onnx", "lies inside", add), (ckpt.parent, "holds", replace),
                          (draft, "is", replace)):
        with pytest.raises(UserError, match=f"-o {out}: {how} the input folder .*; {why} \\(write elsewhere\\)$"):
            export_mod.export(ckpt, draft, out, force=True)
    monkeypatch.chdir(ckpt)
    with pytest.raises(UserError, match=f"-o {ckpt}: is the input folder"):
        export_mod.export(ckpt, None, Path("."), force=True)
    assert sorted(p.name for p in ckpt.iterdir()) == before
    export_mod.export(ckpt, draft, tmp_path / "exp")
    with pytest.raises(UserError, match="holds the input folder"):
        build_engines(tmp_path / "exp", "onnxruntime", (1,), tmp_path, force=True, log=lambda s: None)
    assert (tmp_path / "exp" / "export.json").is_file()


def test_missing_tokenizer_is_said_at_export(tmp_path):
    """A target folder without tokenizer.json exported silently; every text prompt then failed
    at run time. The export says so (and how to fix it), and says nothing when one is there."""
    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    said: list[str] = []
    export_mod.export(target, None, tmp_path / "o", log=said.append)
    note = [s for s in said if "no tokenizer.json" in s]
    assert len(note) == 1 and "save_pretrained" in note[0] and "export again" in note[0]
    from tests.runtime.test_text import _words

    _words(target)
    said.clear()
    export_mod.export(target, None, tmp_path / "o2", log=said.append)
    assert said and not [s for s in said if "no tokenizer.json" in s]


def test_a_chat_template_field_that_is_no_template_is_refused_at_export(tmp_path):
    """A user walk: a tokenizer_config.json chat_template that is neither a string nor named
    templates with a "default" one (an object, named templates without a default, which
    transformers will not render unnamed) was read as no template: exported without a word,
    then `run --chat` said the tokenizer "has no chat template". Export refuses it, naming the
    file, as a template that cannot render."""
    import json

    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    cfg = target / "tokenizer_config.json"
    good = json.loads(cfg.read_text())
    for bad in ({"x": 1}, 3, [{"name": "tool_use", "template": good["chat_template"]}]):
        cfg.write_text(json.dumps({**good, "chat_template": bad}))
        with pytest.raises(UserError, match=rf"^{cfg}: chat_template is not a template .*: a chat template must "
                                            "render a conversation of one user message; mend it, or remove it"):
            export_mod.export(target, None, tmp_path / "o")
        assert not (tmp_path / "o").exists()
    cfg.write_text(json.dumps({**good, "chat_template": None}))  # null: no template, raw prompts only
    export_mod.export(target, None, tmp_path / "o")


def test_a_chat_template_that_cannot_render_is_refused_at_export_naming_its_file(tmp_path):
    """A user walk: a chat template that is not valid Jinja (or raises) exported without a
    word; the build then wrote its engines and failed at the canary with "chat template: not
    valid Jinja", naming no file. Export renders one user message through it and refuses,
    naming the file; a template that fails only on some conversations is named at run time
    (the export's copy)."""
    import json

    from specrt.runtime.session import Session
    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    cfg = target / "tokenizer_config.json"
    good = json.loads(cfg.read_text())
    for where, template, why in ((cfg, "{% for m in messages %}{{ m.content ", "not valid Jinja"),
                                 (target / "chat_template.jinja", "{{ raise_exception('nope') }}", "nope"),
                                 (cfg, "{{ messages[0].content.nothing.more }}", "UndefinedError")):
        if where == cfg:
            cfg.write_text(json.dumps({**good, "chat_template": template}))
        else:
            where.write_text(template)
        with pytest.raises(UserError, match=rf"^{where}: .*{why}.*: a chat template must render a conversation of "
                                            "one user message; mend it, or remove it"):
            export_mod.export(target, None, tmp_path / "o")
        assert not (tmp_path / "o").exists()
        if where != cfg:
            where.unlink()
    cfg.write_text(json.dumps({**good, "chat_template": "{% if messages[0].role == 'system' %}{{ raise_exception("
                                                        "'no system prompt') }}{% endif %}"
                                                        + good["chat_template"]}))
    export_mod.export(target, None, tmp_path / "o")
    from specrt.engines import build_engines

    build_engines(tmp_path / "o", "onnxruntime", (1,), tmp_path / "e", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    with Session(tmp_path / "e", governor="off") as s, pytest.raises(UserError) as e:
        "".join(s.stream([{"role": "system", "content": "w3"}, {"role": "user", "content": "w4"}], max_new_tokens=2))
    assert str(e.value) == f"{tmp_path / 'e' / 'export' / 'tokenizer_config.json'}: chat template: no system prompt"


@pytest.mark.parametrize("side", ["target", "draft"])
def test_a_non_finite_weight_is_refused_naming_its_file_tensor_and_slot(tmp_path, side):
    """A user walk: a NaN in model.norm.weight exported and built; the build's canary then
    failed on NaN logits, suggesting reduced precision for float32 engines, and left them
    written. Export refuses it, naming the file, the tensor and its slot."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folders = {"target": tmp_path / "t", "draft": tmp_path / "d"}
    shutil.copytree(REFERENCE / "verifier", folders["target"])
    shutil.copytree(REFERENCE / "draft", folders["draft"])
    f = folders[side] / "model.safetensors"
    tensors = load_file(f)
    name = "model.norm.weight" if side == "target" else next(k for k in tensors if k.endswith("norm.weight"))
    w = tensors[name].copy()
    w.reshape(-1)[3] = np.nan if side == "target" else np.inf
    tensors[name] = w
    save_file(tensors, f)
    with pytest.raises(UserError, match=rf"^{f}: tensor '{name}' \(slot '[\w.]+'\) holds 1 non-finite value\(s\) "
                                        rf"\({'NaN' if side == 'target' else 'inf'}\); a checkpoint's weights must be "
                                        "finite$"):
        export_mod.export(folders["target"], folders["draft"], tmp_path / "o")
    assert not (tmp_path / "o").exists()
    w.reshape(-1)[3] = -7e4  # finite, past float16's range: named as well in a float16 export
    tensors[name] = w
    save_file(tensors, f)
    with pytest.raises(UserError, match=rf"^{f}: tensor '{name}' \(slot '[\w.]+'\) holds 7e\+04, past float16's "
                                        r"range \(65504\); export it in float32 or bfloat16$"):
        export_mod.export(folders["target"], folders["draft"], tmp_path / "o", dtype="float16")
    assert not (tmp_path / "o").exists()


def test_token_ids_outside_the_vocabulary_are_refused_and_a_wider_tokenizer_said(tmp_path):
    """A user walk: an eos_token_id of 5000 (config.json or generation_config.json) or a
    bos_token_id past a vocabulary of 1000 exported, built and ran (an EOS the model cannot
    produce never ends an answer); a tokenizer of more tokens than the model exported without
    a word. The ids are refused, naming the file; the tokenizer is said."""
    import json

    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    cfg = json.loads((target / "config.json").read_text())
    gen = target / "generation_config.json"
    for where, key, value in (("config.json", "eos_token_id", 16), ("config.json", "bos_token_id", 99),
                              ("generation_config.json", "eos_token_id", [2, 16])):
        c = {**cfg, key: value} if where == "config.json" else cfg
        (target / "config.json").write_text(json.dumps(c))
        gen.unlink(missing_ok=True)
        if where == "generation_config.json":
            gen.write_text(json.dumps({key: value}))
        with pytest.raises(UserError, match=rf"^{target / where}: field '{key}' is {re.escape(repr(value))}: a token "
                                            r"id must lie in the model's vocabulary \[0, 16\)"):
            export_mod.export(target, None, tmp_path / "o")
        assert not (tmp_path / "o").exists()
    gen.unlink()
    small = write_tiny_target(tmp_path / "s", "llama", vocab_size=12)
    _words(small)  # 16 words
    said: list[str] = []
    export_mod.export(small, None, tmp_path / "o", log=said.append)
    assert f"warning: {small / 'tokenizer.json'} holds 16 tokens, the model's vocabulary 12" in "\n".join(said), said


def test_the_weight_scan_counts_a_chunk_at_a_time():
    """binding._scan_values: the non-finite count, NaN or not, and the largest finite |value|,
    the same whichever chunks the array falls in (chunks keep its temporaries small)."""
    from specrt.export.binding import _scan_values

    a = np.arange(-50, 50, dtype=np.float32).reshape(10, 10) / 7
    a[3, 3], a[5, 1], a[9, 9] = np.inf, -np.inf, -1e5
    for chunk in (1, 7, 16, 100, 1 << 22):
        assert _scan_values(a, True, chunk) == (2, False, 1e5)
        assert _scan_values(a, False, chunk) == (2, False, 0.0)
    a[0, 0] = np.nan
    assert _scan_values(a, True, 7) == (3, True, 1e5)
    assert _scan_values(np.full(5, np.nan, np.float32), True, 2) == (5, True, 0.0)


def test_the_weight_scan_keeps_the_largest_value_of_every_chunk():
    """mutant m73b-116: binding._scan_values kept the largest |value| of the last chunk alone (a
    weight past float16's range anywhere but in a tensor's last 4M values exported in float16
    without a word): the largest is the same wherever it lies."""
    from specrt.export.binding import _scan_values

    a = np.ones(100, np.float32)
    a[3] = -7e4
    for chunk in (1, 7, 50, 100):
        assert _scan_values(a, True, chunk) == (0, False, 7e4)


def test_every_tokenizer_file_of_the_target_is_copied_and_listed(tmp_path):
    """A target folder with each tokenizer file a Hugging Face tokenizer may save (the chat
    template in a file of its own, .jinja or .json, as newer transformers write it; the
    special tokens' map): the export copies each, byte for byte, and lists it in
    export.json's "tokenizer", which the load check then finds whole."""
    import json

    from specrt.manifest import sha256_file
    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    _words(target)
    (target / "special_tokens_map.json").write_text(json.dumps({"unk_token": "w0"}))
    (target / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    (target / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[0].content }}"}))
    if not (target / "generation_config.json").is_file():
        (target / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    names = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
             "chat_template.jinja", "chat_template.json"]
    m = export_mod.export(target, None, tmp_path / "o", log=lambda s: None)
    assert sorted(r["file"] for r in m["tokenizer"]) == sorted(names), m["tokenizer"]
    assert m["tokenizer_files"] == [r["file"] for r in m["tokenizer"]]  # (check_export's record of them)
    for r in m["tokenizer"]:
        assert (tmp_path / "o" / r["file"]).read_bytes() == (target / r["file"]).read_bytes(), r
        assert r["sha256"] == sha256_file(target / r["file"]), r
    assert load_export(tmp_path / "o")["tokenizer"] == m["tokenizer"]


# mutant B28: binding.py:91  `big > float16 max` -> `>=` (65504, float16's largest, refused)
# mutant B31: binding.py:87  the range scanned for every export dtype, not float16 alone
@pytest.mark.parametrize("dtype, value, refused", [
    ("float16", 65504.0, False),   # float16's largest finite value (B28)
    ("float16", 65536.0, True),
    ("float32", 1.0e6, False),     # float32 and bfloat16 hold it (B31)
    ("bfloat16", 1.0e6, False),
])
def test_only_a_float16_export_refuses_weights_past_float16_s_range(hf_models, tmp_path, dtype, value, refused):
    import numpy as np

    from specrt.errors import UserError
    from specrt.export.binding import bind_target
    from tests.export.conftest import copy_tree, rewrite

    folder = copy_tree(hf_models["llama"], tmp_path / "m")
    w = np.ones(64, np.float32)
    w[7] = value
    rewrite(folder, change={"model.norm.weight": w})
    t = bind_target(folder)
    t.export_dtype = dtype  # what export sets before the graphs read the weights
    if refused:
        with pytest.raises(UserError, match=r"tensor 'model.norm.weight' \(slot 'final_norm'\) holds 6.554e\+04, "
                                            r"past float16's range"):
            t.get("final_norm")
    else:
        assert float(t.get("final_norm").max()) == value


def test_a_target_only_export_records_the_targets_own_numbers(tmp_path):
    """export.json of a target without a draft: the aux layers a later draft reads are
    speculators' default (2, L//2, L-3) and the target graph's aux output is sized by them;
    the EOS ids are generation_config.json's (every one), the context its config's. Mutants
    no test noticed: m2-E06 (L-2 for L-3), m2-E16 (the first EOS id only)."""
    import json

    target = write_tiny_target(tmp_path / "t", "llama", num_hidden_layers=8, max_position_embeddings=300)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    m = export_mod.export(target, None, tmp_path / "o")
    assert m["draft"] is None and "draft" not in m["graphs"]
    assert m["target"]["aux_layer_ids"] == [2, 4, 5]
    assert m["target"]["eos_token_ids"] == [5, 6]
    assert m["target"]["max_position_embeddings"] == m["target"]["decoder"]["max_position_embeddings"] == 300
    model = onnx.load(str(tmp_path / "o" / "target.onnx"), load_external_data=False)
    aux = [o for o in model.graph.output if o.name == "aux_hidden"]
    assert [d.dim_value for d in aux[0].type.tensor_type.shape.dim][-1] == 3 * 64
    assert load_export(tmp_path / "o")["target"]["aux_layer_ids"] == [2, 4, 5]


def test_a_peagle_draft_of_two_aux_layers_has_io_of_two(tmp_path):
    """A P-EAGLE draft whose fc reads two target layers: the draft graph's aux input and the
    manifest's record of it are both two target widths wide (mutant m2-E19 recorded three in
    export.json, a width the graph does not take, which the engines then bind by)."""
    target = write_tiny_target(tmp_path / "t", "llama")
    draft = write_tiny_draft(tmp_path / "d", target, kind="peagle", aux_layer_ids=(1, 3))
    m = export_mod.export(target, draft, tmp_path / "o")
    assert m["target"]["aux_layer_ids"] == [1, 3]
    for g in ("target", "draft"):
        model = onnx.load(str(tmp_path / "o" / f"{g}.onnx"), load_external_data=False)
        io = m["graphs"][g]["io"]
        got = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
               for v in (*model.graph.input, *model.graph.output)}
        for t in (*io["inputs"], *io["outputs"]):  # (the fixed sizes; the symbolic ones are None in both)
            assert got[t["name"]] == [n if isinstance(n, int) else None for n in t["shape"]], (g, t)
    assert [t["shape"][-1] for t in m["graphs"]["draft"]["io"]["inputs"] if t["name"] == "aux_hidden"] == [2 * 64]


def test_a_broken_tokenizer_file_beside_no_tokenizer_json_is_refused_naming_it(tmp_path):
    """Without tokenizer.json (an export of token ids only) the other tokenizer files are
    still copied, so each JSON one is read first: a broken tokenizer_config.json is refused
    naming it, and no folder is written (mutant m2-E04 read none of them, and copied it)."""
    target = write_tiny_target(tmp_path / "t", "llama", vocab_size=16)
    (target / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(UserError, match=rf"^{re.escape(str(target / 'tokenizer_config.json'))}: "):
        export_mod.export(target, None, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_tokenizer_of_one_token_past_the_vocabulary_is_said(tmp_path):
    """The wider-tokenizer warning at its edge: 16 tokens over a vocabulary of 15 (the id 15
    it can encode is refused at run time) is said; 16 over 16 is not (mutant m2-E03 said it
    only from two tokens past)."""
    from tests.runtime.test_text import _words

    for vocab, warned in ((15, True), (16, False)):
        target = write_tiny_target(tmp_path / f"t{vocab}", "llama", vocab_size=vocab)
        _words(target)  # 16 words
        said: list[str] = []
        export_mod.export(target, None, tmp_path / f"o{vocab}", log=said.append)
        assert any(f"holds 16 tokens, the model's vocabulary {vocab}" in s for s in said) == warned, said


def test_a_graph_with_external_data_lists_and_checks_its_data_file(tmp_path, monkeypatch):
    """A graph over save_model's size threshold keeps its weights in <stem>.onnx.data: the
    manifest lists that file too, so a changed weight is refused on load (mutant m69c-E01
    listed target.onnx alone: the weights went unchecked)."""
    from specrt.export import graphs

    monkeypatch.setattr(graphs, "EXTERNAL_DATA_THRESHOLD", 0)
    t = write_tiny_target(tmp_path / "t", "llama")
    m = export_mod.export(t, None, tmp_path / "exp")
    assert [f["file"] for f in m["graphs"]["target"]["files"]] == ["target.onnx", "target.onnx.data"]
    data = bytearray((tmp_path / "exp" / "target.onnx.data").read_bytes())
    data[-3] ^= 1
    (tmp_path / "exp" / "target.onnx.data").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"target.onnx.data: content differs from the export manifest"):
        load_export(tmp_path / "exp")


@pytest.mark.parametrize("kind", ["peagle", "eagle3"])
def test_a_draft_narrower_than_its_target_has_io_of_both_widths(tmp_path, kind):
    """A draft 32 wide on a 64-wide target (speculators' target_hidden_size): export.json's draft
    I/O is the graph's, the aux input in the target's width and an EAGLE-3 draft's own hidden
    state in the draft's (mutants m69c-E12 / E14 recorded the draft's width for the aux input,
    widths the engines then bind by; every other export test's draft is as wide as its target)."""
    target = write_tiny_target(tmp_path / "t", "llama")
    draft = write_tiny_draft(tmp_path / "d", target, kind=kind, hidden_size=32)
    m = export_mod.export(target, draft, tmp_path / "o")
    model = onnx.load(str(tmp_path / "o" / "draft.onnx"), load_external_data=False)
    got = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
           for v in (*model.graph.input, *model.graph.output)}
    io = m["graphs"]["draft"]["io"]
    for t in (*io["inputs"], *io["outputs"]):
        assert got[t["name"]] == [n if isinstance(n, int) else None for n in t["shape"]], t
    widths = {t["name"]: t["shape"][-1] for t in (*io["inputs"], *io["outputs"])}
    assert widths["aux_hidden"] == 3 * 64 and m["draft"]["hidden_size"] == 32
    if kind == "eagle3":
        assert widths["prev_hidden"] == widths["hidden_out"] == 32


def test_eos_ids_that_miss_the_tokenizers_eos_token_or_are_none_are_said(tmp_path):
    """A Qwen3 target whose generation_config.json names EOS ids without the tokenizer's
    eos_token (vLLM ends answers there too, transformers' generate and specrt do not), or no EOS
    id at all (every answer then runs to --max-new-tokens), exported and inspected without a word
    (a walk, w73d); its several EOS ids, the tokenizer's among them, say nothing."""
    from click.testing import CliRunner

    from specrt.cli import main
    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "qwen3", vocab_size=16)
    _words(target, special=("w15",))
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "w15"}))
    gen = json.loads((target / "generation_config.json").read_text())
    for n, (ids, said) in enumerate((([15, 14], None), ([14, 13], r"tokenizer_config.json: eos_token 'w15' \(id 15\) "
                                                       r"is not among the EOS ids \[14, 13\] \(generation_config"),
                                     (None, r"t: no EOS id \(generation_config.json's or config.json's eos_token_id\): "
                                            r"answers end only at --max-new-tokens, a stop string or the context limit "
                                            r"\(vLLM's also at the tokenizer's eos_token 'w15', id 15: add it to "))):
        (target / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": ids}))
        logs: list[str] = []
        export_mod.export(target, None, tmp_path / f"o{n}", log=logs.append)
        r = CliRunner().invoke(main, ["inspect", str(target)])
        assert r.exit_code == 0, r.output
        for out in ("\n".join(logs), r.output):
            assert (re.search(said, out) is not None if said else "EOS id" not in out), (ids, out)


def test_a_tokenizer_naming_no_eos_token_gets_no_eos_token_note(tmp_path):
    """eos_note where tokenizer_config.json names no eos_token: EOS ids say nothing (there is no
    token to miss), none say only that answers end at --max-new-tokens (mutant m73y-58 said
    "eos_token None (id -1) is not among the EOS ids")."""
    from tests.runtime.test_text import _words

    target = write_tiny_target(tmp_path / "t", "qwen3", vocab_size=16)
    _words(target)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "eos_token"}))
    assert export_mod.eos_note(target, (14,)) is None
    assert export_mod.eos_note(target, ()) == (f"note: {target}: no EOS id (generation_config.json's or config.json's "
                                               "eos_token_id): answers end only at --max-new-tokens, a stop string "
                                               "or the context limit")
