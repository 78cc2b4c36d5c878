"""Manifests shared by every stage: file hashing, atomic folders, and the export manifest.

An export folder (``export.json``) and an engines folder (``engines.json``) are each
written into a temporary sibling folder and renamed into place only when complete, so
an interrupted run leaves nothing a later stage accepts. Every file a manifest names
carries its sha256; loading re-hashes and refuses any difference, naming the file.
export.json's own values are checked against its binding receipt and the graph contract
(check_export), so a hand edit is refused too, naming the field.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import Any, Iterator

from specrt.errors import UserError, describe_os_error, environment_error, json_problem
from specrt.limits import whole
from specrt.paths import check_output_folder, check_path_args, folder_lock, make_temporary, try_lock, umask

EXPORT_MANIFEST = "export.json"
EXPORT_FORMAT = "specrt-export/1"
# the target's tokenizer files an export copies, those of them the target's folder has, each
# listed in export.json's "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json")


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


def check_output(out: Path, force: bool = False, inputs: tuple = (), marker: str | None = None,
                 locked: bool = False) -> Path:
    """``atomic_folder``'s refusals of ``out`` (see there), made before it starts, so that
    export and build say them before their work (binding, hashing), not after. Returns
    ``out`` as atomic_folder names it. ``locked``: the caller holds folder_lock(out.parent)."""
    out = Path(out)
    if out.name in ("", ".", ".."):  # "-o ." : the folder by its own name
        out = out.resolve()
    if locked:
        _settle_moved_aside(out)
    else:  # (a live run replacing OUT holds this lock: its OUT moved aside is never taken for a killed run's)
        with folder_lock(out.parent):
            _settle_moved_aside(out)
    real = out.resolve()
    for folder in inputs:
        if folder is None:
            continue
        src = Path(folder).resolve()
        if real == src or src in real.parents or real in src.parents:
            how = "is" if real == src else "lies inside" if src in real.parents else "holds"
            why = ("writing there would add to the folder being read" if how == "lies inside" else
                   "replacing it would delete the input")  # (a new subfolder replaces nothing: a user walk)
            raise UserError(f"-o {out}: {how} the input folder {folder}; {why} (write elsewhere)")
    if out.is_symlink() and not out.exists():  # renaming the new folder onto it fails after all the work
        raise UserError(f"-o {out}: a symbolic link to {os.readlink(out)}, which does not exist; give a folder path")
    # (said before "pass --force": a file or a folder of other things was told to pass it, then refused with it)
    if out.exists() and marker is not None and not (
            out.is_dir() and not out.is_symlink() and ((out / marker).is_file() or not any(out.iterdir()))):
        what = "a symbolic link" if out.is_symlink() else "a file" if not out.is_dir() else f"a folder without {marker}"
        raise UserError(f"-o {out}: is {what}; --force replaces only an earlier output of this command "
                        "(or an empty folder): write elsewhere, or remove it yourself")
    if out.exists() and not force:
        raise UserError(f"{out}: already exists (pass --force to replace it)")
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
    other things (it deleted a project's sources). ``out`` is checked so again before the
    rename (something made there meanwhile is refused, not replaced). The partial folders
    that runs into ``out`` killed outright left beside it are removed (``paths.try_lock``).
    """
    out = check_output(out, force, inputs, marker)
    tmp = held = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with folder_lock(out.parent):  # (another run's sweep waits until this one's folder is locked)
            _remove_stale_partials(out)
            tmp, _ = make_temporary(out.parent, f".{out.name}.partial-", is_folder=True)
            held = try_lock(tmp)
        mask = umask()
        os.chmod(tmp, 0o777 & ~mask)  # as mkdir would make it (mkdtemp's are 0700: no other user could read it)
    except BaseException as e:  # (a Ctrl-C landing at the chmod left the empty folder)
        if held is not None:
            os.close(held)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise UserError(f"-o {out}: cannot write a folder here ({e.strerror}: {e.filename})") from None
        raise
    old = None
    # the check and the renames below under a lock on OUT's folder: two runs into one OUT each
    # checked, then renamed, in between the other's two renames (the second's rename onto the
    # first's new OUT: "Directory not empty", a traceback, and the earlier OUT left moved aside)
    swap = contextlib.ExitStack()
    try:
        yield tmp
        # files some writers make 0600 (onnx's external data, safetensors) get the umask's usual
        # permissions, as the folders do: a service account running `specrt serve` reads them
        for f in tmp.rglob("*"):
            st = f.lstat()
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o600:
                os.chmod(f, 0o666 & ~mask)
        swap.enter_context(folder_lock(out.parent))
        if out.exists() or out.is_symlink():
            try:  # refused as at the start: what was made at OUT while this ran was replaced, --force or not
                check_output(out, force, inputs, marker, locked=True)  # (and a folder of other things deleted)
            except UserError as e:
                raise UserError(f"{e} (it appeared while this ran; this run's output was not kept)") from None
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
        elif old is not None and not tmp.exists() and out.exists():
            # stopped after both (removing the earlier one): the new output is whole and in place,
            # so the removal is finished, and a Ctrl-C or SIGTERM says so (it said "Aborted!" alone,
            # leaving the earlier one half removed beside it)
            if not isinstance(e, Exception):  # (said first: a second Ctrl-C in the removal still has it said)
                sys.stderr.write(f"\n[interrupted after {out} was written whole, replacing the earlier one]\n")
            shutil.rmtree(old, ignore_errors=True)
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, UserError) and str(tmp) in str(e):  # (the temporary folder is gone: name the output)
            raise UserError(str(e).replace(str(tmp), str(out))) from None
        if environment_error(e):  # a full disk, an input this user cannot read: said, not a traceback
            raise UserError(f"{describe_os_error(e).replace(str(tmp), str(out))}; {out} was not written"
                            + (" (the earlier one is kept)" if out.exists() else "")) from None
        raise
    finally:
        swap.close()
        if held is not None:
            os.close(held)  # (releases the lock: the folder is ``out`` now, or gone)


# A run killed outright (SIGKILL, the OOM killer, a power cut) cannot remove its partial folder,
# as big as the output (an export of a real model: GBs), and no later run did: it stayed hidden
# beside OUT for good (a walk of session 63). Each run holds an flock on its partial folder, which
# the kernel releases when the process dies however it dies: the next run into the same OUT
# removes the partial folders it can lock (paths.try_lock), and leaves those a live run holds.


def _pid_alive(pid: int) -> bool:
    if sys.platform == "win32":  # signal 0 is CTRL_C_EVENT there: os.kill(pid, 0) sends a Ctrl-C through the
        return True  # console (GenerateConsoleCtrlEvent), no test of whether PID lives: left, as a live run's
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # (EPERM: another user's live process; past any PID: no run's, left)
        pass
    return True


def _settle_moved_aside(out: Path) -> None:
    """A run killed outright between a --force replacement's two renames left the earlier output
    moved aside as ``.OUT.old-PID`` and no OUT (its own complete output in its partial folder,
    swept as any), and one killed while removing it after them a half-removed ``.OUT.old-PID``
    beside the new OUT; both stayed for good. Where PID is no live process (or this one's: a
    killed run's, as a container's PID 1 is each run's), the first is put back as OUT (the
    replacement undone, as an interrupted run leaves OUT as it was) and the second removed,
    each said on stderr. Called under folder_lock(out.parent), which a live replacement holds
    from its first rename to the removal: a run in another PID namespace (a container's PID 1
    is each run's) took a live one's .OUT.old-PID for a killed run's and put it back as OUT."""
    for p in out.parent.glob(f".{glob.escape(out.name)}.old-*"):
        pid = p.name[len(f".{out.name}.old-"):]  # (not the last "-"'s: OUT.old-x's own ".OUT.old-x.old-PID")
        if not (pid.isascii() and pid.isdigit()) or p.is_symlink() or not p.is_dir():
            continue
        # (this process moves nothing aside before it settles these: its own PID on one is a killed
        # run's, and its own rename onto that one failed, "Directory not empty")
        if int(pid) != os.getpid() and _pid_alive(int(pid)):
            continue
        if out.is_symlink() and not out.exists():  # (a dangling link a user put at OUT: p may be the only output)
            continue
        try:
            if out.exists() or out.is_symlink():
                shutil.rmtree(p)
                said = f"removed {p}, the earlier output a run killed while replacing {out} was removing"
            else:
                p.rename(out)
                said = f"restored {out} from {p}, where a run killed while replacing it had moved it"
        except OSError:  # (another run settled it first, or it cannot be touched: left)
            continue
        sys.stderr.write(f"note: {said}\n")


def _remove_stale_partials(out: Path) -> None:
    """Remove the ``.OUT.partial-*`` folders beside ``out`` that no live run holds (see above),
    saying so on stderr."""
    for p in out.parent.glob(f".{glob.escape(out.name)}.partial-*"):
        if p.is_symlink() or not p.is_dir():
            continue
        fd = try_lock(p)
        if fd is None:
            continue
        try:
            shutil.rmtree(p, ignore_errors=True)
        finally:
            os.close(fd)
        if not p.exists():
            sys.stderr.write(f"note: removed {p}, the partial folder of an interrupted run\n")


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


def specrt_folder_note(folder: Path) -> str:
    """What ``folder`` is when specrt made it, as a hint for an error about another kind of
    folder: an export's or an engines folder's, and the command that takes it; "" otherwise."""
    folder = Path(folder)
    if (folder / "export.json").is_file():
        return (f" ({folder} is an export folder: `specrt build {folder} -o ENGINES` builds engines from it; run, "
                "calibrate, compare, bench, chat and serve take the engines)")
    if (folder / "engines.json").is_file():
        return (f" ({folder} is an engines folder, made by `specrt build`: run, chat, serve, calibrate, compare and "
                f"bench take it; its export is {folder / 'export'})")
    return ""


def read_manifest(folder: Path, name: str, fmt: str, what: str) -> dict[str, Any]:
    folder = Path(folder)
    p = folder / name
    if not p.is_file():
        raise UserError(f"{folder}: not a complete {what} folder (no {name}){specrt_folder_note(folder)}")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # (not UTF-8, not JSON; arrays or objects nested past Python's
        # recursion limit, a number past its digit limit for int: tracebacks)
        raise UserError(f"{p}: not valid JSON ({json_problem(e)})") from None
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


def load_export(folder: Path, verify: bool = True, digest: str | None = None) -> dict[str, Any]:
    """The export manifest, with every file's hash checked (``verify=False`` skips re-hashing);
    with ``digest`` (an engines folder's copy), refused first when its manifest_digest differs."""
    check_path_args("a folder", folder=folder)  # Path('') is the working folder
    m = read_manifest(folder, EXPORT_MANIFEST, EXPORT_FORMAT, "export")
    if digest is not None and manifest_digest(m) != digest:
        raise UserError(f"{Path(folder) / EXPORT_MANIFEST}: differs from the export these engines were built from "
                        "(manifest digest mismatch); rebuild with `specrt build`")
    check_export(m, Path(folder) / EXPORT_MANIFEST)
    if verify:
        verify_files(Path(folder), all_records(m), "export")
    return m


_DRAFT_FIELDS = ("num_layers", "hidden_size", "num_kv_heads", "head_dim")


def check_export(m: dict[str, Any], path: Path) -> None:
    """export.json as `specrt export` wrote it, else a UserError naming ``path`` and the field.

    Every field is typed, then checked against what fixes it: the target's and the draft's
    numbers against the configs in the binding receipt (whose ``receipt_id`` hashes the
    rest of it), each graph's I/O against the contract those numbers give (contracts.py),
    each file record's form. A hand edit of any of them (a vocabulary size, an RoPE theta,
    an eos id, a graph's dtype) was built into engines that decoded something other than
    the model, or failed deep in the build with a traceback."""
    from specrt import contracts as C

    draft = isinstance(m.get("draft"), dict)
    graphs = ("target", "draft") if draft else ("target",)
    fields: dict[str, Any] = {
        "dtype": str, "graphs": dict, "target": dict, "target.vocab_size": int, "target.max_position_embeddings": int,
        "target.eos_token_ids": [int], "target.num_layers": int, "target.hidden_size": int,
        "target.num_kv_heads": int, "target.head_dim": int, "target.aux_layer_ids": [int],
        "target.bos_token_id": (int, type(None)), "draft": (dict, type(None)), "tokenizer": [dict],
        "binding_receipt": dict, "binding_receipt.receipt_id": str, "binding_receipt.target.config": dict,
        "binding_receipt.target.config.decoder": dict}
    for g in graphs:
        fields.update({f"graphs.{g}.io": dict, f"graphs.{g}.io.inputs": [dict], f"graphs.{g}.io.outputs": [dict],
                       f"graphs.{g}.files": [dict]})
    if draft:
        fields.update({"draft.kind": str, "draft.draft_vocab_size": int, "draft.speculative_tokens": int,
                       "draft.mask_token_id": (int, type(None)), "draft.vocab_map": (dict, type(None)),
                       "draft.training_receipt": (dict, type(None)), "binding_receipt.draft.config": dict,
                       "binding_receipt.draft.config.decoder": dict, "binding_receipt.draft.aux_layer_ids": [int],
                       "binding_receipt.draft.slots": dict, **{f"draft.{k}": int for k in _DRAFT_FIELDS}})
    if isinstance(m.get("target"), dict) and "decoder" in m["target"]:
        fields["target.decoder"] = dict  # (exports before it have none: built with the portable graph)
    if "tokenizer_files" in m:
        fields["tokenizer_files"] = [str]  # (exports before session 41 have none: their list is taken as written)
    require_fields(m, path, fields)

    def differs(key: str, found: Any, want: Any, what: str) -> UserError:
        while isinstance(found, dict) and isinstance(want, dict) and found != want:  # the innermost field
            k = next(k for k in (*found, *want) if found.get(k, ...) != want.get(k, ...))
            key, found, want = f"{key}.{k}", found.get(k), want.get(k)
        return UserError(f"{path}: field '{key}' is {found!r:.80}, {what} {want!r:.80}; export.json was edited after "
                         "`specrt export` wrote it: make the export again")

    rec = m["binding_receipt"]
    if manifest_digest({k: v for k, v in rec.items() if k != "receipt_id"}) != rec["receipt_id"]:
        raise UserError(f"{path}: field 'binding_receipt' differs from its receipt_id (the hash `specrt export` "
                        "gave it): export.json was edited after it was written; make the export again")
    t, rt = m["target"], rec["target"]["config"]
    dec = rt["decoder"]
    want = {**{k: dec.get(k) for k in ("num_layers", "hidden_size", "num_kv_heads", "head_dim", "vocab_size",
                                        "max_position_embeddings")},
            "eos_token_ids": rt.get("eos_token_ids"), "bos_token_id": rt.get("bos_token_id")}
    if draft:
        want["aux_layer_ids"] = rec["draft"]["aux_layer_ids"]
    if "decoder" in t:
        want["decoder"] = dec
    for k, v in want.items():
        if t[k] != v:
            raise differs(f"target.{k}", t[k], v, "the binding receipt's target config says")
    if draft != isinstance(rec.get("draft"), dict):
        raise UserError(f"{path}: field 'draft' is {m['draft']!r:.80}, but the binding receipt has "
                        f"{'no' if draft else 'a'} draft; export.json was edited after `specrt export` wrote it: make "
                        "the export again")
    if draft:
        d, rd = m["draft"], rec["draft"]["config"]
        want = {**{k: rd["decoder"].get(k) for k in _DRAFT_FIELDS},
                **{k: rd.get(k) for k in ("kind", "draft_vocab_size", "speculative_tokens", "mask_token_id",
                                          "attention_window")},
                "sliding_window": rd["decoder"].get("sliding_window"),
                "confidence_head": rd.get("confidence_head", False)}
        for k, v in want.items():
            found = d.get(k, False if k == "confidence_head" else None)
            if found != v:
                raise differs(f"draft.{k}", found, v, "the binding receipt's draft config says")
        if (d["vocab_map"] is None) != ("d2t" not in rec["draft"]["slots"]):
            raise UserError(f"{path}: field 'draft.vocab_map' is {d['vocab_map']!r:.80}, but the draft "
                            f"{'has' if d['vocab_map'] is None else 'has no'} vocabulary map (d2t) in the binding "
                            "receipt; export.json was edited after `specrt export` wrote it: make the export again")
    # each graph's I/O is the contract's for these numbers (dtype included)
    if m["dtype"] not in ("float32", "float16", "bfloat16"):
        raise UserError(f"{path}: field 'dtype' is {m['dtype']!r:.80}; expected float32, float16 or bfloat16")
    if set(m["graphs"]) != set(graphs):
        raise UserError(f"{path}: field 'graphs' holds {sorted(m['graphs'])}; expected {list(graphs)} "
                        f"({'a draft' if draft else 'no draft'} in field 'draft')")
    io = {"target": C.target_io(t["num_layers"], t["num_kv_heads"], t["head_dim"], t["vocab_size"], t["hidden_size"],
                                m["dtype"], num_aux=len(t["aux_layer_ids"]))}
    if draft:
        shape = (*(d[k] for k in ("num_layers", "num_kv_heads", "head_dim")), d["draft_vocab_size"])
        opts = {"confidence": bool(d.get("confidence_head")), "num_aux": len(t["aux_layer_ids"])}
        io["draft"] = (C.peagle_io(*shape, t["hidden_size"], m["dtype"], **opts) if d["kind"] == "peagle" else
                       C.eagle3_io(*shape, d["hidden_size"], t["hidden_size"], m["dtype"], **opts))
    for g in graphs:
        for side in ("inputs", "outputs"):
            found, want = m["graphs"][g]["io"][side], io[g].to_json()[side]
            if found != want:
                i = next((i for i, (a, b) in enumerate(zip(found, want)) if a != b), min(len(found), len(want)))
                raise differs(f"graphs.{g}.io.{side}[{i}]", found[i] if i < len(found) else None,
                              want[i] if i < len(want) else None, "the contract of the target and draft fields says")
    # the file records: each a relative file name with its hash and size; a graph's .onnx the one export wrote
    records = [(f"graphs.{g}.files[{i}]", r) for g in graphs for i, r in enumerate(m["graphs"][g]["files"])]
    records += [(f"tokenizer[{i}]", r) for i, r in enumerate(m["tokenizer"])]
    records += [(f"draft.{k}", m["draft"][k]) for k in ("vocab_map", "training_receipt")
                if draft and m["draft"][k] is not None]
    for key, r in records:
        f = r.get("file")
        if not (isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts
                and isinstance(r.get("sha256"), str) and whole(r.get("bytes"), 0)):
            raise UserError(f"{path}: field '{key}' is {r!r:.80}; expected {{'file': a name inside the folder, "
                            "'sha256', 'bytes'}}: make the export again")
    names = {f"graphs.{g}.files": ([r["file"] for r in m["graphs"][g]["files"] if r["file"].endswith(".onnx")],
                                   [f"{g}.onnx"]) for g in graphs}
    names.update({f"draft.{k}.file": ([m["draft"][k]["file"]], [f]) for k, f in (
        ("vocab_map", "draft_vocab.safetensors"), ("training_receipt", "training_receipt.json"))
        if draft and m["draft"][k] is not None})
    for key, (found, want) in names.items():  # (another file's record: hash-checked, then read as this one)
        if found != want:
            raise UserError(f"{path}: field '{key}' names {found}; expected {want}, the file `specrt export` wrote: "
                            "make the export again")
    # the tokenizer files: those the folder has, each listed once (the runtime reads them by
    # name from the folder, and a build copies the listed ones: an unlisted tokenizer.json
    # was left out of the engines, which then refused text prompts)
    listed = [r["file"] for r in m["tokenizer"]]
    for i, f in enumerate(listed):
        if f not in TOKENIZER_FILES or f in listed[:i]:
            raise UserError(f"{path}: field 'tokenizer[{i}].file' is {f!r:.80}; expected one of "
                            f"{', '.join(TOKENIZER_FILES)}, each once (the files `specrt export` copies): export.json "
                            "was edited after it was written; make the export again")
        if not (path.parent / f).is_file():
            raise UserError(f"{path}: field 'tokenizer[{i}].file' names {f}, which is not in {path.parent}: make the "
                            "export again")
    for f in TOKENIZER_FILES:
        if f not in listed and (path.parent / f).is_file():
            if f in (m.get("tokenizer_files") or ()):  # (export copied it: its record was removed, not a file added)
                raise UserError(f"{path}: field 'tokenizer' does not name {f}, which is in {path.parent} and which "
                                "field 'tokenizer_files' says `specrt export` copied: export.json was edited after "
                                "it was written; make the export again")
            raise UserError(f"{path}: field 'tokenizer' does not name {f}, which is in {path.parent} (`specrt export` "
                            f"lists every tokenizer file it copies): {f} was added to the folder, or export.json "
                            f"edited, since it was written; remove {f}, or make the export again")
    # a record removed with its file leaves the list of a target without that file (a chat
    # template gone, or tokenizer.json: text refused); the names export wrote beside it differ
    copied = m.get("tokenizer_files", listed)
    gone = [f for f in copied if f not in listed]
    if gone:
        raise UserError(f"{path}: field 'tokenizer' does not name {gone[0]}, which field 'tokenizer_files' says "
                        f"`specrt export` copied: its record was removed, {gone[0]} with it; make the export again")
    added = [(i, f) for i, f in enumerate(listed) if f not in copied]
    if added:
        raise UserError(f"{path}: field 'tokenizer[{added[0][0]}].file' names {added[0][1]}, which field "
                        "'tokenizer_files' does not (the files `specrt export` copied): export.json was edited after "
                        "it was written; make the export again")


def manifest_digest(manifest: dict[str, Any]) -> str:
    """A hash of a manifest's content, which later stages record to tie themselves to it."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
