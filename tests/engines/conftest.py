"""The tiny reference pair (a random 4-layer Llama + its P-EAGLE draft, written by
transformers and speculators), exported once per session, and engines built from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"
DEPTHS = (1, 2, 4, 8)


def quiet(_msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory) -> Path:
    from specrt.export.export import export

    out = tmp_path_factory.mktemp("tiny") / "export"
    export(REFERENCE / "verifier", REFERENCE / "draft", out)
    return out


@pytest.fixture(scope="session")
def tiny_engines(tiny_export, tmp_path_factory) -> Path:
    """ONNX Runtime engines for depths 1,2,4,8 (never modified by tests: copy first)."""
    from specrt.engines import build_engines

    out = tmp_path_factory.mktemp("tiny") / "engines"
    build_engines(tiny_export, "onnxruntime", DEPTHS, out, log=quiet, profile_repeats=2)
    return out


@pytest.fixture(scope="session")
def tiny_engines_append(tiny_export, tmp_path_factory) -> Path:
    """The same engines with the export's portable target graph (ort_kv="append"): the
    contract TensorRT engines use, exercised here on ONNX Runtime."""
    from specrt.engines import build_engines

    out = tmp_path_factory.mktemp("tiny") / "engines-append"
    build_engines(tiny_export, "onnxruntime", DEPTHS, out, log=quiet, profile_repeats=2, ort_kv="append")
    return out


@pytest.fixture
def engines_copy(tiny_engines, tmp_path) -> Path:
    """A private copy of the engines folder (real copies, no hard links) to tamper with."""
    dst = tmp_path / "engines"
    shutil.copytree(tiny_engines, dst)
    return dst


def edit_manifest(folder: Path, fn) -> None:
    """Rewrite ``folder``'s engines.json with ``fn`` applied to its parsed contents."""
    p = folder / "engines.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))


def rewrite_byte(path: Path, offset: int | None = None) -> None:
    """Flip one byte of ``path`` (written as a new file, so hard links elsewhere keep the old bytes)."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.unlink()
    path.write_bytes(bytes(data))


def _mount_namespaces() -> bool:
    import subprocess

    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True).returncode == 0


needs_mount_namespace = pytest.mark.skipif(not _mount_namespaces(), reason="needs unshare(1) and mount namespaces")

# /tmp and /var/tmp read-only (as a read-only root filesystem without a /tmp of its own), $KEEP writable
_READ_ONLY_TMP = """set -e
mount --bind "$KEEP" "$KEEP"
for d in /tmp /var/tmp; do [ ! -d $d ] || { mount --bind $d $d; mount -o remount,bind,ro $d; }; done
mount --bind "$KEEP" "$KEEP"; mount -o remount,bind,rw "$KEEP"
cd /tmp
exec "$@"
"""


def without_temp_folder(args: list[str], keep: Path):
    """``python -m specrt ARGS`` where no temporary folder can be written: /tmp, /var/tmp and the
    working folder read-only (unshare(1)'s mount namespace), TMPDIR a folder that does not
    exist; ``keep`` (the test's own folder) stays writable. -> the CompletedProcess."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KEEP": str(keep), "TMPDIR": str(keep / "no-such-folder"), "SPECRT_THP": "0"}
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", _READ_ONLY_TMP, "sh",
                           sys.executable, "-m", "specrt", *args], env=env, capture_output=True, text=True, timeout=300)
