"""Reading checkpoint folders: safetensors (single or sharded), pickles only on request.

The safetensors header is parsed here rather than trusted to a library so that every
malformed input becomes a ``UserError`` naming the file: a short or oversized header,
bad JSON, offsets outside the file, a dtype or shape that disagrees with the byte
count. Tensors are read lazily through ``mmap`` and hashed from their raw bytes.

Nothing is ever imported or executed from a checkpoint folder, and ``.bin`` pickles
are read only when the caller passes ``allow_pickle=True`` (and even then with
``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specrt.errors import UserError, json_problem
from specrt.limits import whole
from specrt.paths import check_temp_folder

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# A safetensors header larger than this is refused (the format's own reference limit is 100 MB).
MAX_HEADER = 100 * 1024 * 1024

# the temporary safetensors file of an opted-in pickle -> the pickle it was converted from:
# what a binding receipt names (the temporary file's random path made each receipt id new)
PICKLE_SOURCES: dict[Path, Path] = {}

# safetensors dtype -> (numpy dtype of the stored bytes, bytes per element)
_DTYPES = {
    "F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
    "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
    "U8": (np.uint8, 1), "BOOL": (np.bool_, 1),
}


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, byte range, dtype and shape as the header says."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def _header(path: Path) -> tuple[dict, int]:
    """Parse and validate a safetensors header; returns (header, data start offset)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise UserError(f"{path}: truncated safetensors file ({size} bytes, no header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise UserError(f"{path}: malformed safetensors header (declares {n} header bytes, file has {size})")
            text = fh.read(n)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # (ValueError: not UTF-8, not JSON, past the digit limit)
        raise UserError(f"{path}: malformed safetensors header (not JSON: {json_problem(e)})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: malformed safetensors header (expected a JSON object)")
    return header, 8 + n


def read_safetensors_index(path: Path) -> dict[str, TensorEntry]:
    """All tensor entries of one safetensors file, validated against the file size."""
    header, start = _header(path)
    size = path.stat().st_size
    out: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":  # text to text, as the safetensors library requires (it refuses others on load)
            bad = next(((k, v) for k, v in info.items() if not isinstance(v, str)), None) \
                if isinstance(info, dict) else None if info is None else ("", info)  # (null: none, as it reads it)
            if bad is not None:
                raise UserError(f"{path}: malformed safetensors header: __metadata__"
                                + (f" '{bad[0]}' is {bad[1]!r:.60}; expected text" if bad[0] else
                                   f" is {info!r:.60}; expected an object of text values") + ", as safetensors writes it")
            continue
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict):
            raise UserError(f"{where}: malformed header entry")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in _DTYPES:
            raise UserError(f"{where}: unsupported dtype {dtype!r} (supported: {', '.join(_DTYPES)})")
        if not (isinstance(shape, list) and all(whole(d, 0) for d in shape)):
            raise UserError(f"{where}: malformed shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(whole(o) for o in offs)):
            raise UserError(f"{where}: malformed data_offsets {offs!r}")
        b, e = offs
        expect = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype][1]
        if not 0 <= b <= e:  # (it said "hold 16 bytes ... needs 16" of [-16, 0]: a mutation round, session 57)
            raise UserError(f"{where}: malformed data_offsets {offs} (expected 0 <= begin <= end, offsets into "
                            "the data region)")
        if e - b != expect:
            raise UserError(f"{where}: data_offsets {offs} hold {e - b} bytes, shape {shape} x {dtype} needs {expect}")
        if start + e > size:
            raise UserError(f"{where}: data ends at byte {start + e} but the file has {size} bytes (truncated?)")
        out[name] = TensorEntry(name, path, dtype, tuple(shape), start + b, start + e)
    # the tensors tile the data region exactly, as the safetensors library requires: no two
    # share bytes (two slots would silently read the same weights), no bytes are unclaimed
    at = start
    for t in sorted(out.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != at:
            what = "overlaps the tensor before it" if t.begin < at else f"leaves bytes {at - start}..{t.begin - start} unclaimed"
            raise UserError(f"{path}: tensor '{t.name}' (data_offsets from {t.begin - start}) {what}; expected "
                            "tensors that tile the data region, as safetensors writes them")
        at = t.end
    if at != size:
        raise UserError(f"{path}: {size - at} bytes after the last tensor; expected tensors that tile the data "
                        "region, as safetensors writes them")
    return out


def _shard_path(folder: Path, index_path: Path, shard: object) -> Path:
    """A shard named by the index must be a plain file name inside the checkpoint folder."""
    if not isinstance(shard, str) or not shard or shard in (".", ".."):
        raise UserError(f"{index_path}: shard name {shard!r} is not a file name")
    if "/" in shard or "\\" in shard or "\x00" in shard or os.path.isabs(shard):
        raise UserError(f"{index_path}: shard '{shard}' points outside the checkpoint folder {folder}")
    p = folder / shard
    # (a plain name cannot leave the folder; a shard that is a symbolic link is followed, as
    # model.safetensors is: the Hugging Face hub cache links every file of a snapshot to
    # ../../blobs/<hash>, and refusing those refused every sharded model downloaded there)
    if not p.is_file():
        raise UserError(f"{index_path}: shard '{shard}' named in the index is missing from {folder}")
    return p


def scan_folder(folder: Path, allow_pickle: bool = False, flag: str = "--allow-pickle") -> dict[str, TensorEntry]:
    """Every tensor of a checkpoint folder: ``model.safetensors``, or an index plus shards;
    a pickle with ``allow_pickle`` (``flag``: the option that sets it for this folder)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a checkpoint folder (not a directory)")
    index = folder / INDEX_NAME
    single = folder / SINGLE_NAME
    for p in (index, single):  # there, but no file: said as such, not "no model.safetensors found"
        if os.path.lexists(p) and not p.is_file():
            what = ("a broken link" if not p.exists() else "a folder" if p.is_dir() else
                    "not a regular file (a device, a pipe)")
            raise UserError(f"{p}: {what}; expected the checkpoint's {'index' if p == index else 'weights'} file")
    if index.is_file() and single.is_file():  # transformers would take the single file; a stale one?
        raise UserError(f"{folder}: holds both {SINGLE_NAME} and {INDEX_NAME}; expected one of them (remove the "
                        "stale one: transformers reads the single file, which may not be the weights you mean)")
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as e:  # (ValueError: not UTF-8, not JSON, past the digit limit)
            raise UserError(f"{index}: not valid JSON ({json_problem(e)})") from None
        wmap = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(wmap, dict) or not wmap:
            raise UserError(f"{index}: expected a non-empty 'weight_map' object")
        entries: dict[str, TensorEntry] = {}
        by_shard: dict[str, dict[str, TensorEntry]] = {}
        for name, shard in wmap.items():
            if not isinstance(shard, str):
                raise UserError(f"{index}: weight_map['{name}'] is {shard!r}; expected a shard file name")
            if shard not in by_shard:
                by_shard[shard] = read_safetensors_index(_shard_path(folder, index, shard))
            if name not in by_shard[shard]:
                raise UserError(f"{index}: tensor '{name}' is mapped to '{shard}', which does not contain it")
            entries[name] = by_shard[shard][name]
        for shard, tensors in by_shard.items():
            extra = sorted(set(tensors) - set(wmap))
            if extra:
                raise UserError(f"{folder / shard}: tensors not listed in {INDEX_NAME}: {', '.join(extra[:8])}")
            elsewhere = sorted(n for n in tensors if n in wmap and wmap[n] != shard)
            if elsewhere:  # a second copy the index does not point at: which one is meant?
                raise UserError(f"{folder / shard}: holds '{elsewhere[0]}', which {INDEX_NAME} maps to "
                                f"'{wmap[elsewhere[0]]}'; expected each tensor in one shard")
        return entries
    if single.is_file():
        return read_safetensors_index(single)
    pickles = [folder / n for n in PICKLE_NAMES if (folder / n).is_file()]
    if pickles:
        if not allow_pickle:
            raise UserError(
                f"{folder}: only pickle weights ({pickles[0].name}) found; they are not read unless you pass "
                f"{flag} (unpickling can execute code). Convert to safetensors if you can."
            )
        return _scan_pickle(folder, pickles[0], flag)
    raise UserError(f"{folder}: no {SINGLE_NAME} or {INDEX_NAME} found")


def _pickle_refusal(text: str) -> str:
    """torch.load(weights_only=True)'s refusal said in a line: its reason (the global the file
    names, a bad load key), never its advice to load with weights_only=False, which runs the
    file's code (its wording differs between refusals: the reason is found, not placed)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    why = re.search(r"WeightsUnpickler error: (.*?\.)(?:\s|$)", text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not text.startswith("Weights only load failed"):
        return f"not a torch checkpoint that loads with weights_only ({lines[0]})" if lines else ""
    reason = why.group(1) if why else next(
        (ln for ln in lines if not ln.startswith(("Weights only load failed", "(1)", "(2)", "Check the documentation"))),
        "it holds more than tensors")
    return f"not a torch checkpoint that loads with weights_only, which runs none of its code ({reason})"


def _scan_pickle(folder: Path, path: Path, flag: str = "--allow-pickle") -> dict[str, TensorEntry]:
    """Opt-in only: convert a torch pickle (a flat dict of names to tensors, read with
    ``weights_only``) to a temporary safetensors file, removed when the process ends, and
    scan that."""
    import atexit
    import shutil
    import tempfile

    try:
        import torch
        from safetensors.torch import save_file
    except ImportError:  # pragma: no cover - the export extra brings torch
        raise UserError(f"{flag} needs torch: pip install 'specrt[export]'") from None
    if path.name.endswith(".index.json"):
        raise UserError(f"{path}: sharded pickle checkpoints are not supported; convert to safetensors")
    check_temp_folder(flag)  # (its conversion goes to one: tempfile's FileNotFoundError was a traceback)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises UnpicklingError, RuntimeError, EOFError, ... for a bad file
        raise UserError(f"{path}: {_pickle_refusal(str(e)) or type(e).__name__}") from None
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        found = type(state).__name__ if not isinstance(state, dict) else next(
            (f"key {k!r}" if not isinstance(k, str) else f"'{k}': {type(v).__name__}" for k, v in state.items()
             if not isinstance(k, str) or not isinstance(v, torch.Tensor)), "no tensors")  # ("no tensors": {})
        raise UserError(f"{path}: expected a state dict of tensor names to tensors, found {found}")
    folder_tmp = Path(tempfile.mkdtemp(prefix="specrt-pickle-"))
    atexit.register(shutil.rmtree, folder_tmp, True)  # the reader maps it until then
    tmp = folder_tmp / SINGLE_NAME
    # tied weights pickle as one storage under two names (lm_head and the embeddings), which
    # safetensors refuses to write: each later name sharing a storage gets its own copy
    seen, flat = set(), {}
    for k, v in state.items():
        v = v.contiguous()
        ptr = v.untyped_storage().data_ptr()
        flat[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    try:
        save_file(flat, str(tmp))
    except Exception as e:  # safetensors' own refusals (dtypes it cannot write, ...)
        raise UserError(f"{path}: cannot convert to safetensors ({type(e).__name__}: {e})") from None
    PICKLE_SOURCES[tmp] = path
    return read_safetensors_index(tmp)


def _bf16_as_float32(a: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) as float32: bfloat16 is the high half of a float32."""
    return (a.astype(np.uint32) << 16).view(np.float32)


class TensorReader:
    """Reads tensors lazily from their files through one ``mmap`` per file."""

    def __init__(self) -> None:
        self._maps: dict[Path, mmap.mmap] = {}

    def _map(self, path: Path) -> mmap.mmap:
        m = self._maps.get(path)
        if m is None:
            with open(path, "rb") as fh:
                m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._maps[path] = m
        return m

    def raw(self, e: TensorEntry) -> memoryview:
        return memoryview(self._map(e.file))[e.begin : e.end]

    def release(self, e: TensorEntry, begin: int | None = None, end: int | None = None) -> None:
        """Unmap the pages of ``e``'s bytes (``begin:end`` of the file, by default the whole
        tensor's) from this process once read: the page cache keeps them, a later read maps
        them again. Without it every page read stayed in the process's RSS until close() (the
        whole checkpoint: SmolLM2's export peaked at 2.1x its weights, the mapped file beside
        the graph's copies; an 8B model's at 2.1x its 32 GB in fp32)."""
        m = self._maps.get(e.file)
        if m is None or not hasattr(m, "madvise"):  # (Python < 3.8, or a system without madvise)
            return
        begin, end = e.begin if begin is None else begin, e.end if end is None else end
        start = begin - begin % mmap.PAGESIZE
        if end > start:
            try:
                m.madvise(mmap.MADV_DONTNEED, start, end - start)
            except (OSError, ValueError):  # only memory, never the data
                pass

    def sha256(self, e: TensorEntry) -> str:
        digest = hashlib.sha256(self.raw(e)).hexdigest()
        self.release(e)
        return digest

    def array(self, e: TensorEntry, as_float32: bool = True) -> np.ndarray:
        """The tensor as numpy; float dtypes widen to float32 unless ``as_float32=False``."""
        np_dtype, _ = _DTYPES[e.dtype]
        a = np.frombuffer(self.raw(e), dtype=np_dtype).reshape(e.shape)
        if e.dtype == "BF16":
            out = _bf16_as_float32(a)  # float32 whatever as_float32 says: numpy has no bfloat16
        elif as_float32 and e.dtype in ("F16", "F64"):
            out = a.astype(np.float32)
        else:
            out = np.array(a)  # own the memory: the mmap may close
        del a
        self.release(e)
        return out

    def rows(self, e: TensorEntry, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a floating tensor as float32, read without the rest of it."""
        np_dtype, size = _DTYPES[e.dtype]
        width = int(np.prod(e.shape[1:], dtype=np.int64))
        a = np.frombuffer(self.raw(e)[start * width * size : stop * width * size], dtype=np_dtype)
        a = a.reshape(-1, *e.shape[1:])
        out = _bf16_as_float32(a) if e.dtype == "BF16" else a.astype(np.float32)
        del a
        self.release(e, e.begin + start * width * size, e.begin + stop * width * size)
        return out

    def close(self) -> None:
        for m in self._maps.values():
            try:
                m.close()
            except BufferError:  # a view is still alive; the OS reclaims it at exit
                pass
        self._maps.clear()
