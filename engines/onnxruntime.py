"""ONNX Runtime backend: the embedded default. An "engine" here is an export graph plus
the session settings recorded in ``engines.json``; nothing is compiled ahead of time.

Settings (``OrtSettings``), and why:

* execution providers: CUDA when ``onnxruntime.get_available_providers()`` offers it,
  else CPU. The TensorRT EP is not used by this backend: it would build one TensorRT
  engine per session (one device copy of the weights per depth); specialised TensorRT
  engines that share weights are what ``--backend tensorrt`` builds (plan.py).
* ``graph_optimization_level = ORT_ENABLE_ALL``: on CPU this adds the layout and fusion
  passes and, above all, MatMul/Gemm weight prepacking (MLAS packs B once at load
  instead of on every call; without it a verify step at S > 1 repacks every weight).
* ``intra_op_num_threads`` = physical cores (hyper-threads share the FMA units that a
  GEMM saturates), ``inter_op_num_threads = 1``, sequential execution: a decoder is one
  chain of ops, so parallel execution only adds scheduling overhead.
* no spinning (``session.intra_op.allow_spinning = 0``): the runtime alternates two
  sessions (draft, target) with Python work in between, and a spinning pool burns the
  cores the other session and the sampler need. Measured on SmolLM2-135M, 2 cores shared
  with other jobs (tools/bench_engines.py, same run, alternating): decode 67-71 ms
  spinning vs 36-41 ms not spinning (1 thread: 35 ms).

Sessions (``OrtSettings.sessions``):

* ``shared`` (default): one dynamic-shape session per graph; every role of that graph
  (prefill, decode, verify.{d}) is a runner over it with its own I/O binding. Weights
  are loaded and prepacked once.
* ``per-depth``: one session per role, with ``add_free_dimension_override_by_name``
  fixing ``new_tokens`` to d + 1. The weights are loaded once as OrtValues and given to
  every session with ``SessionOptions.add_initializer`` (no copy). ONNX Runtime's Python
  API cannot share *prepacked* weights between sessions (the PrepackedWeightsContainer
  is C/C++/C# only), and prepacking a shared initializer gives every session its own
  packed copy (measured: +520 MB per session for SmolLM2-135M's 538 MB), so this mode
  disables prepacking to keep one copy of the weights.

Measured (tools/bench_engines.py, SmolLM2-135M, 538 MB fp32 weights, 2 shared cores):
per-depth with shared unpacked weights is ~3x slower per step (176 vs 56 ms decode in
one run); per-depth with prepacking costs 7.2x the weights in RSS and its depth ratios
were no better than the shared session's (d8/d1 1.34-1.48x vs 1.24-1.34x). On CPU,
fixing S does not change the kernels that dominate (GEMMs over the weights), so the
default is ``shared``.

Buffers: inputs are bound in place (``IOBinding.bind_cpu_input`` wraps the numpy
memory, measured at ~1 us for any size, no copy); fixed-shape outputs are bound to
preallocated numpy arrays once per runner (base.py describes the lifetime).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner, np_dtype
from specrt.engines.plan import Role
from specrt.errors import UserError

SESSION_MODES = ("shared", "per-depth")
OPT_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def physical_cores() -> int:
    """Physical cores available to this process (distinct (package, core id) pairs in
    /proc/cpuinfo among the CPUs in our affinity mask); falls back to the CPU count."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - non-Linux
        allowed = set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "processor":
                cpu = int(v)
            elif k == "physical id":
                phys = v
            elif k == "core id" and cpu in allowed:
                cores.add((phys, v))
    except OSError:  # pragma: no cover
        pass
    return max(1, min(len(cores) or len(allowed), len(allowed)))


def select_providers(available: list[str] | None = None) -> list[str]:
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@dataclass(frozen=True)
class OrtSettings:
    sessions: str = "shared"
    graph_optimization_level: str = "ORT_ENABLE_ALL"
    intra_op_num_threads: int = 0  # 0: physical cores at build time (made explicit by resolved())
    inter_op_num_threads: int = 1
    execution_mode: str = "sequential"
    providers: tuple[str, ...] = ()  # (): select_providers()
    prepack: bool | None = None  # None: on for shared sessions, off for per-depth (see module doc)
    spin: bool = False  # intra-op threads busy-wait between ops (ONNX Runtime's default: True)
    extra: dict[str, str] = field(default_factory=dict)  # more session config entries

    def resolved(self) -> "OrtSettings":
        if self.sessions not in SESSION_MODES:
            raise UserError(f"onnxruntime sessions '{self.sessions}' is not one of {', '.join(SESSION_MODES)}")
        if self.graph_optimization_level not in OPT_LEVELS:
            raise UserError(f"graph_optimization_level '{self.graph_optimization_level}' is not one of "
                            f"{', '.join(OPT_LEVELS)}")
        if self.execution_mode not in ("sequential", "parallel"):
            raise UserError(f"execution_mode '{self.execution_mode}' is not sequential or parallel")
        return OrtSettings(
            sessions=self.sessions, graph_optimization_level=self.graph_optimization_level,
            intra_op_num_threads=self.intra_op_num_threads or physical_cores(),
            inter_op_num_threads=self.inter_op_num_threads, execution_mode=self.execution_mode,
            providers=tuple(self.providers) or tuple(select_providers()),
            prepack=(self.sessions == "shared") if self.prepack is None else bool(self.prepack),
            spin=bool(self.spin), extra=dict(self.extra))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["providers"] = list(self.providers)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "OrtSettings":
        d = dict(d)
        d["providers"] = tuple(d.get("providers", ()))
        return cls(**d)

    def session_options(self, free_dims: Mapping[str, int] | None = None):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.graph_optimization_level)
        so.intra_op_num_threads = self.intra_op_num_threads
        so.inter_op_num_threads = self.inter_op_num_threads
        so.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if self.execution_mode == "sequential"
                             else ort.ExecutionMode.ORT_PARALLEL)
        so.log_severity_level = 3
        if not self.prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.spin else "0")
        for k, v in self.extra.items():
            so.add_session_config_entry(k, str(v))
        for name, value in (free_dims or {}).items():
            so.add_free_dimension_override_by_name(name, int(value))
        return so


def _malloc_trim() -> None:
    """Give freed heap back to the OS. Building a session parses the whole model protobuf
    (weight-sized) and frees it; glibc keeps such memory mapped, so without this the RSS
    of a freshly loaded engine set stays ~2x the weights."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


class OrtGraph:
    """One export graph on ONNX Runtime: sessions created on first use, shared by runners,
    dropped when the last runner using them deactivates."""

    def __init__(self, path: Path, settings: OrtSettings):
        self.path = Path(path)
        self.settings = settings
        self._sessions: dict[str, Any] = {}
        self._users: dict[str, int] = {}
        self._weights: dict[str, Any] | None = None  # per-depth mode: name -> OrtValue

    def _key(self, role: Role) -> str:
        return "*" if self.settings.sessions == "shared" else role.name

    def _shared_weights(self) -> dict[str, Any]:
        """Every initializer, loaded once as an OrtValue over numpy memory."""
        if self._weights is None:
            import onnx
            import onnxruntime as ort
            from onnx import numpy_helper

            model = onnx.load(str(self.path), load_external_data=True)
            self._weights = {t.name: ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(t))
                             for t in model.graph.initializer}
            del model
        return self._weights

    def acquire(self, role: Role):
        import onnxruntime as ort

        key = self._key(role)
        if key not in self._sessions:
            if self.settings.sessions == "shared":
                so = self.settings.session_options()
            else:
                fixed = {d: r.min for d, r in role.dims.items() if r.fixed}
                so = self.settings.session_options(fixed)
                for name, value in self._shared_weights().items():
                    so.add_initializer(name, value)
            try:
                self._sessions[key] = ort.InferenceSession(str(self.path), so, providers=list(self.settings.providers))
            except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph classes
                raise UserError(f"{self.path}: ONNX Runtime could not load the graph ({e})") from None
            _malloc_trim()
        self._users[key] = self._users.get(key, 0) + 1
        return self._sessions[key]

    def release(self, role: Role) -> None:
        key = self._key(role)
        self._users[key] -= 1
        if self._users[key] == 0:
            del self._sessions[key], self._users[key]
            if not self._sessions:
                self._weights = None
            _malloc_trim()

    @property
    def output_device(self) -> str:
        return "cpu"


class OrtRunner(Runner):
    backend = "onnxruntime"

    def __init__(self, role: Role, inputs: tuple[C.TensorSpec, ...], outputs: tuple[C.TensorSpec, ...],
                 graph: OrtGraph):
        super().__init__(role, inputs, outputs)
        self.graph = graph
        self._sess = None
        self._binding = None
        self._fixed: dict[str, np.ndarray] = {}

    def activate_impl(self) -> None:
        self._sess = self.graph.acquire(self.role)
        b = self._sess.io_binding()
        self._fixed = {}
        # Bind every output once. Fixed shapes: into preallocated arrays the runner owns
        # (a decode/verify step then allocates nothing on the host). Dynamic ones: ONNX
        # Runtime allocates per call, in proportion to the new tokens.
        for t in self.outputs:
            dt = np_dtype(t.dtype)
            if dt is not None and all(isinstance(d, int) for d in t.shape):
                arr = np.empty(t.shape, dt)
                b.bind_output(t.name, "cpu", 0, dt, list(arr.shape), arr.ctypes.data)
                self._fixed[t.name] = arr
            else:
                b.bind_output(t.name, "cpu")
        self._binding = b

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        b = self._binding
        for name, a in feeds.items():
            b.bind_cpu_input(name, a)
        # A dynamic output bound to a device keeps the OrtValue of the previous call, whose
        # shape would be reused as a preallocated buffer: rebind so each call allocates anew.
        for t in self.outputs:
            if t.name not in self._fixed:
                b.bind_output(t.name, "cpu")
        self._sess.run_with_iobinding(b)
        if len(self._fixed) == len(self.outputs):
            return dict(self._fixed)
        values = b.get_outputs()  # in binding order = self.outputs order
        return {t.name: self._fixed[t.name] if t.name in self._fixed else v.numpy()
                for t, v in zip(self.outputs, values)}

    def deactivate_impl(self) -> None:
        self._binding = None
        self._sess = None
        self._fixed = {}
        self.graph.release(self.role)
