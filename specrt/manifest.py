"""Manifests shared by every stage: file hashing, atomic folders, and the export manifest.

An export folder (``export.json``) and an engines folder (``engines.json``) are each
written into a temporary sibling folder and renamed into place only when complete, so
an interrupted run leaves nothing a later stage accepts. Every file a manifest names
carries its sha256; loading re-hashes and refuses any difference, naming the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from specrt.errors import UserError, describe_os_error, environment_error
from specrt.paths import check_output_folder, umask

EXPORT_MANIFEST = "export.json"
EXPORT_FORMAT = "specrt-export/1"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def tool_versions() -> dict[str, str]:
    import numpy
    import onnx
    import onnxruntime

    import specrt

    return {"specrt": specrt.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": numpy.__version__}


def check_output(out: Path, force: bool = False, inputs: tuple = (), marker: str | None = None) -> Path:
    """``atomic_folder``'s refusals of ``out`` (see there), made before it starts, so that
    export and build say them before their work (binding, hashing), not after. Returns
    ``out`` as atomic_folder names it."""
    out = Path(out)
    if out.name in ("", ".", ".."):  # "-o ." : the folder by its own name
        out = out.resolve()
    real = out.resolve()
    for folder in inputs:
        if folder is None:
            continue
        src = Path(folder).resolve()
        if real == src or src in real.parents or real in src.parents:
            how = "is" if real == src else "lies inside" if src in real.parents else "holds"
            raise UserError(f"-o {out}: {how} the input folder {folder}; replacing it would delete the input "
                            "(write elsewhere)")
    if out.is_symlink() and not out.exists():  # renaming the new folder onto it fails after all the work
        raise UserError(f"-o {out}: a symbolic link to {os.readlink(out)}, which does not exist; give a folder path")
    if out.exists() and not force:
        raise UserError(f"{out}: already exists (pass --force to replace it)")
    if out.exists() and marker is not None and not (
            out.is_dir() and not out.is_symlink() and ((out / marker).is_file() or not any(out.iterdir()))):
        what = "a file" if not out.is_dir() else f"a folder without {marker}"
        raise UserError(f"-o {out}: is {what}; --force replaces only an earlier output of this command "
                        "(or an empty folder): write elsewhere, or remove it yourself")
    check_output_folder(out.parent, "-o", of=out)
    return out


@contextlib.contextmanager
def atomic_folder(out: Path, force: bool = False, inputs: tuple = (), marker: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside ``out``; on success rename it to ``out``.

    On any exception the temporary folder is removed and ``out`` is untouched. An
    existing ``out`` is refused unless ``force``, then replaced only after the new
    folder is complete. An ``out`` that is one of the ``inputs`` folders, lies inside one
    or holds one is refused, ``force`` or not: replacing it would delete the input. With
    ``marker`` (the manifest this kind of output holds, e.g. engines.json), ``force``
    replaces only an empty folder or one holding that manifest: not a file, not a folder of
    other things (it deleted a project's sources).
    """
    out = check_output(out, force, inputs, marker)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        mask = umask()
        os.chmod(tmp, 0o777 & ~mask)  # as mkdir would make it (mkdtemp's are 0700: no other user could read it)
    except OSError as e:
        raise UserError(f"-o {out}: cannot write a folder here ({e.strerror}: {e.filename})") from None
    old = None
    try:
        yield tmp
        # files some writers make 0600 (onnx's external data, safetensors) get the umask's usual
        # permissions, as the folders do: a service account running `specrt serve` reads them
        for f in tmp.rglob("*"):
            st = f.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o600:
                os.chmod(f, 0o666 & ~mask)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException as e:
        if old is not None and old.exists() and not out.exists():  # stopped between the two renames
            old.rename(out)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, UserError) and str(tmp) in str(e):  # (the temporary folder is gone: name the output)
            raise UserError(str(e).replace(str(tmp), str(out))) from None
        if environment_error(e):  # a full disk, an input this user cannot read: said, not a traceback
            raise UserError(f"{describe_os_error(e).replace(str(tmp), str(out))}; {out} was not written"
                            + (" (the earlier one is kept)" if out.exists() else "")) from None
        raise


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def file_record(folder: Path, name: str) -> dict[str, Any]:
    p = folder / name
    return {"file": name, "sha256": sha256_file(p), "bytes": p.stat().st_size}


def verify_files(folder: Path, records: list[dict[str, Any]], what: str) -> None:
    """Re-hash every recorded file; a missing or changed file is a UserError naming it."""
    for r in records:
        p = folder / r["file"]
        if not p.is_file():
            raise UserError(f"{folder}: {what} file '{r['file']}' is missing")
        if p.stat().st_size != r["bytes"] or sha256_file(p) != r["sha256"]:
            raise UserError(f"{p}: content differs from the {what} manifest (sha256 mismatch); "
                            "it was modified after it was written: re-run the stage that made it")


def read_manifest(folder: Path, name: str, fmt: str, what: str) -> dict[str, Any]:
    folder = Path(folder)
    p = folder / name
    if not p.is_file():
        raise UserError(f"{folder}: not a complete {what} folder (no {name})")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise UserError(f"{p}: not {'an' if what[0] in 'aeiou' else 'a'} {what} manifest (expected format '{fmt}')")
    return data


def require_fields(data: dict[str, Any], path: Path, fields: dict[str, Any]) -> None:
    """Each dotted field of ``fields`` ("target.vocab_size": int, or a tuple of types; a
    list spec [T]: a list of T) present with that type in ``data``, else a UserError
    naming ``path`` and the field: a manifest edited by hand, or cut short, is said so
    rather than failing somewhere deep in whoever reads it."""
    for key, want in fields.items():
        node: Any = data
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise UserError(f"{path}: field '{key}' is missing; re-run the stage that wrote it")
            node = node[part]
        item = want[0] if isinstance(want, list) else None
        types = list if item is not None else want
        ok = isinstance(node, types) and not (isinstance(node, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)))
        if ok and item is not None:
            ok = all(isinstance(x, item) and not isinstance(x, bool) for x in node)
        if not ok:
            kind = (f"a list of {item.__name__}" if item is not None else
                    "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,))))
            raise UserError(f"{path}: field '{key}' must be {kind}, found {node!r:.80}; re-run the stage that "
                            "wrote it")


def all_records(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ``{"file", "sha256", "bytes"}`` record anywhere in a manifest."""
    out: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if {"file", "sha256", "bytes"} <= set(node):
                out.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(manifest)
    return out


def load_export(folder: Path, verify: bool = True) -> dict[str, Any]:
    """The export manifest, with every file's hash checked (``verify=False`` skips re-hashing)."""
    m = read_manifest(folder, EXPORT_MANIFEST, EXPORT_FORMAT, "export")
    require_fields(m, Path(folder) / EXPORT_MANIFEST, {
        "dtype": str, "graphs": dict, "graphs.target.io": dict, "graphs.target.files": [dict], "target": dict,
        "target.vocab_size": int, "target.max_position_embeddings": int, "target.eos_token_ids": [int],
        "target.num_layers": int, "draft": (dict, type(None))})
    if verify:
        verify_files(Path(folder), all_records(m), "export")
    return m


def manifest_digest(manifest: dict[str, Any]) -> str:
    """A hash of a manifest's content, which later stages record to tie themselves to it."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
