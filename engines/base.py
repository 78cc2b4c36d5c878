"""The one interface the runtime calls, whatever the backend: a ``Runner`` per engine role.

Polygraphy's runner protocol (STYLE.md): ``activate()`` acquires the engine (an ONNX
Runtime session, a TensorRT execution context), ``infer(feeds)`` runs one call,
``deactivate()`` releases it; ``with runner:`` does both. The base class validates the
feeds against the role's input metadata (names, dtypes, ranks, fixed and ranged
dimensions, the context limit), so backends implement only ``*_impl``.

Buffers. ``infer`` reads its inputs in place: past KV comes in as contiguous views of the
runtime's preallocated cache (``buf[:, :n]``) and is never copied on the host. An array
fed again as the same input (the same object, shape and dtype: the in-place KV buffers
at every call) is not checked or bound again, which saved ~0.15 ms of a target call's
~0.2 ms host time (tools/bench_call_overhead.py); its contents are read afresh.
Outputs whose shape is fixed by the role (decode and verify: logits [1, d+1, V], new KV
[1, d+1, KVH, D], ...) are preallocated once per runner and overwritten by every call:
the arrays ``infer`` returns stay valid until the next ``infer`` of the same runner;
copy what must outlive it. Outputs with a dynamic dimension (prefill, draft) are
allocated per call, in proportion to the new tokens, never to the context.
"""

from __future__ import annotations

import abc
import time
from typing import Any, Mapping

import numpy as np

from specrt import contracts as C
from specrt.engines.plan import Role
from specrt.errors import InternalError, UserError


def np_dtype(name: str) -> np.dtype | None:
    """numpy dtype of a contract dtype name; None for bfloat16 without ml_dtypes installed."""
    if name == "bfloat16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:  # pragma: no cover - depends on the environment
            return None
    return np.dtype(name)


def specialise(t: C.TensorSpec, role: Role) -> C.TensorSpec:
    """Replace each symbolic dim that the role fixes (min == max) by its value."""
    shape = tuple(role.dims[d].min if isinstance(d, str) and d in role.dims and role.dims[d].fixed else d
                  for d in t.shape)
    return C.TensorSpec(t.name, t.dtype, shape, t.optional)


def specs_from_json(items: list[dict[str, Any]]) -> tuple[C.TensorSpec, ...]:
    return tuple(C.TensorSpec(t["name"], t["dtype"], tuple(t["shape"]), bool(t.get("optional", False)))
                 for t in items)


class Runner(abc.ABC):
    """One engine role (``prefill``, ``decode``, ``verify.{d}``, ``draft``) on one backend.

    ``inputs``/``outputs``: the graph's contract specs, specialised to the role (a
    verify.4 runner's input_ids is ``(1, 5)``; past KV keeps ``past_tokens``).
    ``dims``: every symbolic input dim -> its allowed range; ``max_context``: the most
    positions one call may reach (past + new).
    """

    backend = "abstract"

    def __init__(self, role: Role, inputs: tuple[C.TensorSpec, ...], outputs: tuple[C.TensorSpec, ...],
                 aliases: Mapping[str, str] | None = None):
        self.role = role
        # output -> input whose buffer it is (in-place KV, contracts.py): the engine
        # writes into the caller's array and that array is what infer returns for it
        self.aliases = dict(aliases or {})
        self.name = role.name
        self.dims = dict(role.dims)
        self.max_context = role.limit  # past + new <= max_context
        self.inputs = tuple(specialise(t, role) for t in inputs)
        self.outputs = tuple(specialise(t, role) for t in outputs)
        self._dtypes = {t.name: np_dtype(t.dtype) for t in self.inputs}
        # optional inputs (contracts.TensorSpec.optional): zeros when a caller leaves them out
        self._defaults = {t.name: np.zeros(t.shape, self._dtypes[t.name]) for t in self.inputs if t.optional}
        # input -> (array, shape, dtype, its symbolic dims) of the last feed that passed the
        # per-input checks: the runtime feeds the same cache buffers every call (in-place
        # KV), which then skip them (check_feeds)
        self._checked: dict[str, tuple[np.ndarray, tuple[int, ...], np.dtype, tuple[tuple[str, int], ...]]] = {}
        self.is_active = False
        self.last_inference_time: float | None = None  # seconds of the last infer_impl

    # ---- metadata ------------------------------------------------------------------

    def get_input_metadata(self) -> tuple[C.TensorSpec, ...]:
        return self.inputs

    def get_output_metadata(self) -> tuple[C.TensorSpec, ...]:
        return self.outputs

    # ---- lifecycle -----------------------------------------------------------------

    def activate(self) -> None:
        if self.is_active:
            raise InternalError(f"runner {self.name} is already active")
        self.activate_impl()
        self.is_active = True

    def deactivate(self) -> None:
        if not self.is_active:
            return
        try:
            self.deactivate_impl()
        finally:
            self.is_active = False
            self._checked = {}  # drop the references to the caller's buffers

    def __enter__(self) -> "Runner":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # ---- inference -----------------------------------------------------------------

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One call. feeds: every input by name (numpy, C-contiguous). Returns outputs by name."""
        if not self.is_active:
            raise InternalError(f"runner {self.name}: infer() before activate()")
        if self._defaults and not self._defaults.keys() <= feeds.keys():
            feeds = {**{k: v for k, v in self._defaults.items() if k not in feeds}, **feeds}
        self.check_feeds(feeds)
        t0 = time.perf_counter()
        out = self.infer_impl(feeds)
        self.last_inference_time = time.perf_counter() - t0
        return out

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Validate feeds; returns the value of every symbolic dim. Raises UserError naming the tensor."""
        where = f"engine '{self.name}'"
        if len(feeds) != len(self.inputs):
            known = {t.name for t in self.inputs}
            extra = sorted(set(feeds) - known)
            missing = sorted(known - set(feeds))
            raise UserError(f"{where}: inputs do not match: missing {missing}, unknown {extra}")
        seen: dict[str, int] = {}
        checked = self._checked
        for t in self.inputs:
            a = feeds.get(t.name)
            if a is None:
                raise UserError(f"{where}: input '{t.name}' is missing")
            prev = checked.get(t.name)
            if prev is not None and prev[0] is a and prev[1] == a.shape and prev[2] is a.dtype:
                # the very array that passed last time (an in-place KV buffer): its type,
                # dtype, rank, contiguity and fixed dims cannot have changed; its symbolic
                # dims still meet the other inputs' below
                for d, got in prev[3]:
                    if seen.setdefault(d, got) != got:
                        raise UserError(f"{where}: input '{t.name}' has {d} = {got}, but another input has "
                                        f"{seen[d]}")
                continue
            want = self._dtypes[t.name]
            if not isinstance(a, np.ndarray):
                raise UserError(f"{where}: input '{t.name}' must be a numpy array, got {type(a).__name__}")
            if want is not None and a.dtype != want:
                raise UserError(f"{where}: input '{t.name}' has dtype {a.dtype}, expected {want}")
            if a.ndim != len(t.shape):
                raise UserError(f"{where}: input '{t.name}' has shape {list(a.shape)}, expected rank {len(t.shape)} "
                                f"{list(t.shape)}")
            if not a.flags.c_contiguous:
                raise UserError(f"{where}: input '{t.name}' must be C-contiguous (a prefix view [:, :n] of the "
                                "cache buffer is; a strided view would be copied on every call)")
            for want_d, got in zip(t.shape, a.shape):
                if isinstance(want_d, int):
                    if got != want_d:
                        raise UserError(f"{where}: input '{t.name}' has shape {list(a.shape)}, "
                                        f"expected {list(t.shape)}")
                elif seen.setdefault(want_d, got) != got:
                    raise UserError(f"{where}: input '{t.name}' has {want_d} = {got}, but another input has "
                                    f"{seen[want_d]}")
            checked[t.name] = (a, a.shape, a.dtype,
                               tuple((d, got) for d, got in zip(t.shape, a.shape) if not isinstance(d, int)))
        for d, v in seen.items():
            r = self.dims.get(d)
            if r is not None and not r.min <= v <= r.max:
                raise UserError(f"{where}: {d} = {v} is outside the engine's range [{r.min}, {r.max}]")
        if self.aliases and C.POSITION_IDS in feeds:
            self._check_inplace_positions(feeds, where)
        if C.LOGITS_FROM in feeds and C.INPUT_IDS in feeds:
            self._check_logits_from(int(feeds[C.LOGITS_FROM]), feeds[C.INPUT_IDS].shape[-1], where)
        if C.DIM_PAST in seen and C.DIM_NEW in seen and seen[C.DIM_PAST] + seen[C.DIM_NEW] > self.max_context:
            raise UserError(f"{where}: past {seen[C.DIM_PAST]} + new {seen[C.DIM_NEW]} tokens exceed the limit "
                            f"{self.max_context} it was built for (see --max-context)")
        return seen

    def _check_logits_from(self, first: int, s: int, where: str) -> None:
        """``logits_from`` (contracts.py "Logits of the last rows only"): a row of the call;
        0 on a role of fixed S, whose runner binds the whole [1, S, V] logits."""
        r = self.dims.get(C.DIM_NEW)
        if r is not None and r.fixed and first != 0:
            raise UserError(f"{where}: {C.LOGITS_FROM} = {first}: this engine's {C.DIM_NEW} is fixed at {r.min}, "
                            "so it computes every row's logits (0); ask the prefill engine for fewer rows")
        if not 0 <= first < s:
            raise UserError(f"{where}: {C.LOGITS_FROM} = {first} is not a row of the {s} new tokens")

    def _check_inplace_positions(self, feeds: Mapping[str, np.ndarray], where: str) -> None:
        """In-place KV writes the S new rows at buffer slots p .. p + S - 1 (p = the first
        position): they must end inside every cache buffer (else the engine would write
        out of bounds), and the positions must be a chain p, p + 1, .. or a token tree (a
        chain p .. p + d, d >= 1, then siblings of its second token, each at p + 1:
        contracts.py "Token trees"), the two forms the graph's mask is right for."""
        pos = feeds[C.POSITION_IDS].reshape(-1)
        if pos.size == 0:
            return
        cap = min(feeds[src].shape[2] for src in self.aliases.values())
        p, s = int(pos[0]), int(pos.size)
        if s > 1:
            step = np.diff(pos)
            chain = int(np.argmin(step == 1)) if not (step == 1).all() else s - 1  # consecutive steps from p
            ok = chain == s - 1 or (chain >= 1 and (pos[chain + 1:] == p + 1).all())
        else:
            ok = True
        if p < 0 or p + s > cap or not ok:
            raise UserError(f"{where}: position_ids {pos.tolist() if s <= 16 else f'{p}..{int(pos[-1])}'} must be "
                            f"consecutive (or a chain then siblings of its second token) and the {s} new rows "
                            f"must fit the in-place KV buffers ({cap} rows)")

    # ---- backend hooks -------------------------------------------------------------

    @abc.abstractmethod
    def activate_impl(self) -> None: ...

    @abc.abstractmethod
    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def deactivate_impl(self) -> None: ...

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({'active' if self.is_active else 'inactive'})>"


def load_onnx(path) -> Any:
    """An ONNX model with its external weights read in, by offset, from data files beside it.
    onnx.load refuses external data held by a file with more than one hard link (its
    "hardlink attack" check), and engines folders hard-link the export's files (build.py):
    it failed with a traceback on per-depth sessions, int8 drafts and ``cp -al`` copies."""
    from pathlib import Path

    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        t.raw_data = _external_bytes(path, t)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
    return model


def initializer_reader(path) -> tuple[dict[str, Any], Any]:
    """(initializers, read) of an ONNX file: its TensorProtos by name, external data not read,
    and ``read(name)``, one as a numpy array, its external data read by offset as load_onnx
    reads it: one tensor in memory at a time (load_onnx holds every weight at once; a KeyError
    for a name the file has not)."""
    from pathlib import Path

    import onnx
    from onnx import numpy_helper

    path = Path(path)
    inits = {t.name: t for t in onnx.load(str(path), load_external_data=False).graph.initializer}

    def read(name: str) -> np.ndarray:
        t = inits[name]
        if t.data_location != onnx.TensorProto.EXTERNAL:
            return numpy_helper.to_array(t)
        return numpy_helper.to_array(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=list(t.dims),
                                                      raw_data=_external_bytes(path, t)))

    return inits, read


def _external_bytes(path, t) -> bytes:
    """The bytes of initializer ``t`` of the ONNX file ``path``, read by offset from its data file."""
    data, offset, length = external_location(path, t)
    with open(data, "rb") as fh:
        fh.seek(offset)
        raw = fh.read(length)
    if len(raw) != length:
        raise UserError(f"{data}: too short for weight '{t.name}' of {path.name}")
    return raw


def external_location(path, t) -> tuple[Any, int, int]:
    """(data file, offset, bytes) of initializer ``t`` of the ONNX file ``path``, whose weights
    are external: the file must lie in ``path``'s folder (a location elsewhere is refused)."""
    from pathlib import Path

    import onnx

    path = Path(path)
    info = {e.key: e.value for e in t.external_data}
    data = path.parent / info.get("location", "")
    if not info.get("location") or data.resolve().parent != path.parent.resolve():
        raise UserError(f"{path}: weight '{t.name}' points outside its folder ({info.get('location')!r})")
    size = int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return data, int(info.get("offset", 0)), int(info.get("length", size))
