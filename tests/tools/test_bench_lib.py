"""tools/bench_lib.py (the peers of ``specrt bench``) without running a peer: why a peer
cannot run, the target's cache key, the onnxruntime-genai EOS convention, the builder's
environment, the cached models it reuses, and the GGUF file type read from real GGUF
files written by gguf-py. (tests/cli/test_bench.py runs the peers themselves.)"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from specrt.cmd_bench import load_bench_lib

TINY = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny" / "verifier"


@pytest.fixture(scope="module")
def lib():
    return load_bench_lib()


@pytest.fixture
def target(tmp_path) -> Path:
    """A copy of the tiny verifier with a tokenizer.json (its content is not read here)."""
    t = tmp_path / "tiny-target"
    shutil.copytree(TINY, t)
    (t / "tokenizer.json").write_text("{}")
    return t


def test_peer_unavailable_names_what_is_missing(lib, tmp_path, target, monkeypatch):
    assert lib.peer_unavailable("vllm", target) == f"unknown peer 'vllm' (known: {', '.join(lib.PEERS)})"
    for peer in ("hf", "hf-lookup", "ortgenai", "ortgenai-int4"):
        assert "Hugging Face folder (None) is not on this machine" in lib.peer_unavailable(peer, None)
        assert f"({tmp_path}) is not on this machine" in lib.peer_unavailable(peer, tmp_path)  # no config.json
    bare = tmp_path / "bare"
    shutil.copytree(TINY, bare)
    assert "has no tokenizer.json" in lib.peer_unavailable("ortgenai-int8", bare)
    have = {"torch": True, "transformers": True, "onnxruntime_genai": True, "llama_cpp": True}
    monkeypatch.setattr(lib, "_has", lambda m: have[m])
    assert lib.peer_unavailable("ortgenai", target) is None and lib.peer_unavailable("hf", target) is None
    assert lib.peer_unavailable("llamacpp-gguf", None) is None  # a GGUF may be given: no folder needed
    have.update(torch=False, transformers=False)
    assert lib.peer_unavailable("hf-lookup", target) == ("torch and transformers not installed "
                                                         "(pip install -e '.[export]')")
    have.update(torch=True)
    assert lib.peer_unavailable("hf", target).startswith("transformers not installed")
    assert lib.peer_unavailable("ortgenai", target) is None
    have.update(onnxruntime_genai=False, llama_cpp=False)
    assert lib.peer_unavailable("ortgenai-int4", target).startswith("onnxruntime-genai not installed")
    assert lib.peer_unavailable("llamacpp-lookup", target).startswith("llama-cpp-python not installed")


def test_has_answers_without_importing(lib):
    assert lib._has("json") and not lib._has("no_such_module_here") and not lib._has("json.no_such")
    assert not lib._has("no_such_package_here.sub")  # find_spec raises for a missing parent: no module


def test_target_key_hashes_the_receipt_slots_else_the_folder(lib, target):
    slots = {"a": "1" * 64, "b": "2" * 64}
    key = lib.target_key({"slots": slots}, target)
    assert len(key) == 16 and int(key, 16) >= 0
    assert lib.target_key({"slots": dict(reversed(slots.items()))}, Path("/elsewhere")) == key  # order, folder
    assert lib.target_key({"slots": {**slots, "b": "3" * 64}}, target) != key
    plain = lib.target_key(None, target)
    assert lib.target_key({"slots": {}}, target) == plain != key
    # the folder's key follows config.json and the weight files' size and time
    st = (target / "model.safetensors").stat()
    os.utime(target / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = lib.target_key(None, target)
    assert touched != plain
    (target / "config.json").write_text((target / "config.json").read_text() + " ")
    assert lib.target_key(None, target) not in (plain, touched)


def test_ortgenai_tokens_end_at_the_first_eos(lib):
    f = lib.ortgenai_tokens
    assert f([5, 9, 6], [3], 10, [2, 9]) == [5, 9]  # any of the EOS ids
    assert f([5, 6], [9], 10, [2, 9]) == [5, 6, 9]  # stopped on one, not in the sequence
    assert f([5, 6], [2], 2, [2]) == [5, 6]  # the budget was reached first
    assert f([5, 6], [], 10, [2]) == [5, 6]
    assert f([], [2], 4, [2]) == [2]
    assert f([2, 2], [2], 4, [2]) == [2]


def test_specrt_cache_is_the_environments_or_home(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRT_CACHE", str(tmp_path / "c"))
    assert lib.specrt_cache() == tmp_path / "c"
    monkeypatch.delenv("SPECRT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lib.specrt_cache() == tmp_path / "home" / ".cache" / "specrt"
    # a ~ the shell did not expand (SPECRT_CACHE="~/c", an env file): the home folder's, not a folder named ~ here
    monkeypatch.setenv("SPECRT_CACHE", "~/c")
    assert lib.specrt_cache() == tmp_path / "home" / "c"


def test_builder_env_finds_onnx_ir_in_the_cache_or_says_how_to_install_it(lib, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    if lib._has("onnx_ir"):
        assert lib._builder_env(tmp_path) == dict(os.environ)
    monkeypatch.setattr(lib, "_has", lambda m: False)
    with pytest.raises(lib.PeerSkipped, match=r"needs onnx_ir.*pip install --no-deps --target "
                                               + str(tmp_path / lib.BUILDER_DEPS) + " onnx-ir==1.1.0"):
        lib._builder_env(tmp_path)
    (tmp_path / lib.BUILDER_DEPS / "onnx_ir").mkdir(parents=True)
    assert lib._builder_env(tmp_path)["PYTHONPATH"] == os.pathsep.join([str(tmp_path / lib.BUILDER_DEPS), "/somewhere"])
    monkeypatch.delenv("PYTHONPATH")
    assert lib._builder_env(tmp_path)["PYTHONPATH"] == str(tmp_path / lib.BUILDER_DEPS)


def test_ortgenai_model_is_reused_from_its_cache_folder(lib, tmp_path, target, monkeypatch):
    monkeypatch.setattr(lib, "_has", lambda m: True)  # (the builder is not run: the model is there)
    receipt = {"slots": {"w": "f" * 64}}
    for precision in ("fp32", "int4"):
        out = tmp_path / "cache" / "ortgenai" / f"{target.name}-{lib.target_key(receipt, target)}-{precision}"
        out.mkdir(parents=True)
        (out / "genai_config.json").write_text("{}")
        assert lib.ensure_ortgenai_model(target, tmp_path / "cache", receipt, precision=precision) == out
    with pytest.raises(lib.PeerSkipped, match="has no tokenizer.json"):
        lib.ensure_ortgenai_model(TINY, tmp_path / "cache")
    # a cache that is a file: skipped, saying where to point it
    (tmp_path / "file").write_text("")
    with pytest.raises(lib.PeerSkipped, match="cannot make .* set --ortgenai-cache or SPECRT_CACHE"):
        lib.ensure_ortgenai_model(target, tmp_path / "file", receipt)


def _gguf(path: Path, file_type: int | None) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tensor("t", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_type_and_the_llamacpp_model_a_peer_decodes(lib, tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    f32, q41, none = _gguf(tmp_path / "a.gguf", 0), _gguf(tmp_path / "b.gguf", 3), _gguf(tmp_path / "c.gguf", None)
    assert (lib.gguf_type(f32), lib.gguf_type(q41), lib.gguf_type(none)) == ("0", "3", None)
    monkeypatch.setattr(lib, "_has", lambda m: True)
    cache = tmp_path / "cache"
    assert lib.ensure_llamacpp_model(None, f32, cache) == f32  # already F32: as it is
    assert lib.ensure_llamacpp_model(None, q41, cache, kind="as-given") == q41
    # a Q4_1 one is converted once into the cache: an existing conversion is reused
    made = list((cache / "llamacpp").iterdir())
    assert made == []
    import hashlib

    st = q41.stat()
    digest = hashlib.sha256(f"{q41.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache / "llamacpp" / f"b-{digest}-f32.gguf"
    out.write_bytes(b"")
    assert lib.ensure_llamacpp_model(None, q41, cache) == out
    monkeypatch.setattr(lib, "_has", lambda m: False)
    assert lib.gguf_type(f32) is None
    with pytest.raises(lib.PeerSkipped, match="llama-cpp-python not installed"):
        lib.ensure_llamacpp_model(None, f32, cache)


def test_source_gguf_is_the_given_file_or_the_smollm2_wheels(lib, tmp_path):
    given = _gguf(tmp_path / "m.gguf", 0) if lib._has("gguf") else tmp_path / "m.gguf"
    given.touch()
    assert lib.source_gguf(None, given, tmp_path) == given
    for missing in (tmp_path / "none.gguf", tmp_path):  # a folder is no GGUF file either
        with pytest.raises(lib.PeerSkipped, match=f"--llamacpp-gguf {missing}: no such file"):
            lib.source_gguf(TINY, missing, tmp_path)
    with pytest.raises(lib.PeerSkipped, match="is not the SmolLM2 folder tools/smollm2.py made"):
        lib.source_gguf(TINY, None, tmp_path)


def test_make_peer_refuses_an_unknown_peer(lib):
    with pytest.raises(lib.PeerSkipped, match="unknown peer 'vllm'"):
        lib.make_peer("vllm", {})
    assert lib.PEERS == ("hf", "hf-lookup", "ortgenai", "ortgenai-int8", "ortgenai-int4", "llamacpp",
                         "llamacpp-lookup", "llamacpp-gguf")
    assert lib.PLAIN_SEARCH["do_sample"] is False and lib.PLAIN_SEARCH["num_beams"] == 1
    assert json.dumps(lib.machine_info(1)["threads"]) == "1"
