"""ONNX Runtime backend: the embedded default. An "engine" here is an export graph plus
the session settings recorded in ``engines.json``; nothing is compiled ahead of time.

Settings (``OrtSettings``), and why:

* execution providers: CUDA when ``onnxruntime.get_available_providers()`` offers it
  and ``CUDA_VISIBLE_DEVICES`` (empty, or "-1") does not hide every device, else CPU
  (``select_providers``). The TensorRT EP is not used by this backend: it would build one TensorRT
  engine per session (one device copy of the weights per depth); specialised TensorRT
  engines that share weights are what ``--backend tensorrt`` builds (plan.py).
* ``graph_optimization_level = ORT_ENABLE_ALL``: on CPU this adds the layout and fusion
  passes and, above all, MatMul/Gemm weight prepacking (MLAS packs B once at load
  instead of on every call; without it a verify step at S > 1 repacks every weight).
* ``intra_op_num_threads`` = physical cores (hyper-threads share the FMA units that a
  GEMM saturates), ``inter_op_num_threads = 1``, sequential execution: a decoder is one
  chain of ops, so parallel execution only adds scheduling overhead.
* idle intra-op threads spin within a run and stop when it ends (``spin = True``, the
  default: ``session.intra_op.allow_spinning = 1`` and ``session.force_spinning_stop =
  1``). Between two ops of a run, a spinning worker picks up the next parallel section at
  once instead of being woken (a decode step is ~300 ops, and waking a sleeping thread
  costs microseconds each time). The runtime alternates two sessions (draft, target) with
  Python work in between: with ONNX Runtime's default, a session's workers keep spinning
  after its run and burn the cores the other session needs; ``force_spinning_stop``
  puts them to sleep when the run returns. Measured on SmolLM2-135M, 2 cores, target and
  draft alternating in one process (decode at 128 past tokens / a draft pass): spinning
  within runs 18.9-19.4 / 2.1 ms; sleeping pools 20.0-20.6 / 2.3 ms; spinning without
  the stop 39.4 / 3.4 ms; tools/bench_engines.py (calls alternating, 3 passes) decode
  19.6 vs 20.8 ms sleeping at 128 past tokens, 21.2 vs 22.7 ms at 512. (ONNX Runtime's
  process-wide pool measured the same as spinning within runs, but once it exists every
  session in the process must use it, which a library cannot impose on its caller.)
  ``spin = False``: sleeping pools, the setting of engine folders built before this one.

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
  disables prepacking to keep one copy of the weights. A graph with one role (the
  draft) has one session either way and stays prepacked.

Measured (tools/bench_engines.py, SmolLM2-135M, 538 MB fp32 weights, 2 shared cores):
per-depth with shared unpacked weights is ~3x slower per step (176 vs 56 ms decode in
one run); per-depth with prepacking costs 7.2x the weights in RSS and its depth ratios
were no better than the shared session's (d8/d1 1.34-1.48x vs 1.24-1.34x). On CPU,
fixing S does not change the kernels that dominate (GEMMs over the weights), so the
default is ``shared``.

In-place KV (``build_engines(ort_kv=...)``, contracts.py): the build re-lowers the
export's target with GroupQueryAttention over whole ``[1, KVH, C, D]`` buffers
(``write_inplace_target``) once ``probe_inplace_gqa`` has shown this ONNX Runtime and
its providers do what the graph needs; an ``OrtRunner`` binds each aliased output
(``cache_key_out.{i}``) to the memory of its input (``cache_key.{i}``), so the engine
writes the new rows into the runtime's cache. Measured on SmolLM2-135M, 2 idle cores
(results/engines.txt): decode 19.6 ms vs 20.3 ms (portable graph) at 128 past tokens,
21.2 vs 23.1 ms at 512.

Buffers: inputs are bound in place (``IOBinding.bind_cpu_input`` wraps the numpy
memory, measured at ~1 us for any size, no copy); fixed-shape outputs are bound to
preallocated numpy arrays once per runner (base.py describes the lifetime).
"""

from __future__ import annotations

import ctypes
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner, np_dtype
from specrt.engines.plan import Role
from specrt.errors import EngineFailure, UserError
from specrt.limits import MAX_THREADS, whole
from specrt.machine import cgroup_levels, read_or_none

SESSION_MODES = ("shared", "per-depth")
OPT_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")


def cgroup_cpu_limit(proc_cgroup: str | None = None, root: Path = Path("/sys/fs/cgroup"),
                     mountinfo: str | None = None) -> float | None:
    """The CPU bandwidth this process's cgroups allow, in CPUs (quota / period), or None when
    unlimited or unknown. cgroup v2 (cpu.max) and v1 (cpu.cfs_quota_us / cpu.cfs_period_us);
    every level from the process's own cgroup up to the mount's root is read and the smallest
    limit kept (a container sees its own cgroup as the root, or a path absent from its mount).
    The mounts are /proc/self/mountinfo's (``mountinfo``; without it, the usual places under
    ``root``): a v1 cpu controller co-mounted with others or mounted elsewhere is found there.
    A container given 2 CPUs on a 64-core host has 64 CPUs in its affinity mask: ONNX Runtime
    sized by those runs 32 spinning threads on 2 CPUs' time."""
    if proc_cgroup is None:
        proc_cgroup, mountinfo = read_or_none(Path("/proc/self/cgroup")), read_or_none(Path("/proc/self/mountinfo"))
        if proc_cgroup is None:  # pragma: no cover - non-Linux
            return None
    limits = []
    for levels, v2 in cgroup_levels(proc_cgroup, "cpu", mountinfo, root, ("cpu", "cpu,cpuacct", "cpuacct,cpu")):
        for folder in levels:
            try:
                if v2:
                    quota, period = (folder / "cpu.max").read_text(encoding="utf-8").split()[:2]
                else:
                    quota = (folder / "cpu.cfs_quota_us").read_text(encoding="utf-8").strip()
                    period = (folder / "cpu.cfs_period_us").read_text(encoding="utf-8").strip()
                if quota not in ("max", "-1") and int(period) > 0 and int(quota) > 0:
                    limits.append(int(quota) / int(period))
            except (OSError, ValueError):
                continue
    return min(limits) if limits else None


def physical_cores() -> int:
    """Physical cores available to this process (distinct (package, core id) pairs in
    /proc/cpuinfo among the CPUs in our affinity mask); falls back to the CPU count. No more
    than its cgroups' CPU limit, rounded up (cgroup_cpu_limit)."""
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - non-Linux
        allowed = set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
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
    limit = cgroup_cpu_limit()
    count = min(len(cores) or len(allowed), len(allowed))
    return max(1, min(count, math.ceil(limit)) if limit else count)


def select_providers(available: list[str] | None = None) -> list[str]:
    """CUDA with the CPU behind it where ONNX Runtime offers CUDA (``available``: its
    providers) and ``CUDA_VISIBLE_DEVICES`` does not hide every device, else the CPU."""
    if available is None:
        import onnxruntime as ort

        available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available and not _no_cuda_device_visible():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def _no_cuda_device_visible() -> bool:
    """Whether ``CUDA_VISIBLE_DEVICES`` hides every CUDA device: empty, or its first entry a
    negative index ("-1"; CUDA takes the devices before the first invalid entry). ONNX Runtime
    lists the providers compiled in (onnxruntime-gpu lists CUDA without a GPU), not the devices
    visible, so a build told to see none picked and recorded CUDA (the environment walk's 16,
    session 70, by reading). Other invalid entries (an index past the devices, a mistyped UUID)
    are left to CUDA, which fails the session; onnxruntime-gpu has not run here."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return False
    first = value.split(",")[0].strip()
    return not first or first.startswith("-") and first[1:].isdigit()


def entry_value(v: str | int | float | bool) -> str:
    """A session config entry's value as ONNX Runtime reads it: true / false as "1" / "0"
    (its switches' spelling; str() gave "True", which no switch reads as on), a number as
    written, a string as is."""
    return ("1" if v else "0") if isinstance(v, bool) else str(v)


@dataclass(frozen=True)
class OrtSettings:
    sessions: str = "shared"
    graph_optimization_level: str = "ORT_ENABLE_ALL"
    intra_op_num_threads: int = 0  # 0: physical cores at build time (made explicit by resolved(); no more
    # than the loading process has, engine_set.py)
    inter_op_num_threads: int = 1
    execution_mode: str = "sequential"
    providers: tuple[str, ...] = ()  # (): select_providers()
    prepack: bool | None = None  # None: on for shared sessions, off for per-depth (see module doc)
    spin: bool = True  # idle intra-op threads spin within a run, sleep after it (module doc)
    extra: dict[str, str] = field(default_factory=dict)  # more session config entries

    def resolved(self) -> "OrtSettings":
        if self.sessions not in SESSION_MODES:
            raise UserError(f"onnxruntime sessions '{self.sessions}' is not one of {', '.join(SESSION_MODES)}")
        if self.graph_optimization_level not in OPT_LEVELS:
            raise UserError(f"graph_optimization_level '{self.graph_optimization_level}' is not one of "
                            f"{', '.join(OPT_LEVELS)}")
        if self.execution_mode not in ("sequential", "parallel"):
            raise UserError(f"execution_mode '{self.execution_mode}' is not sequential or parallel")
        # SessionOptions takes a C int: a larger count raised pybind11's TypeError at session creation
        count = lambda v: whole(v, 0, MAX_THREADS)  # noqa: E731
        for key, ok, want in (
                ("intra_op_num_threads", count(self.intra_op_num_threads), f"a thread count in 0..{MAX_THREADS}"),
                ("inter_op_num_threads", count(self.inter_op_num_threads), f"a thread count in 0..{MAX_THREADS}"),
                ("providers", all(p in _known_providers() for p in self.providers), "ONNX Runtime provider names"),
                ("prepack", self.prepack is None or isinstance(self.prepack, bool), "true, false or null"),
                ("spin", isinstance(self.spin, bool), "true or false"),
                ("extra", isinstance(self.extra, dict), "an object of session config entries")):
            if not ok:
                raise UserError(f"onnxruntime {key} {getattr(self, key)!r:.80}: expected {want}")
        for k, v in self.extra.items():  # ONNX Runtime reads strings: a JSON true went in as "True", not on
            if not isinstance(k, str) or not isinstance(v, (str, int, float)):
                raise UserError(f"onnxruntime extra {k!r:.80}: {v!r:.80}: expected a config entry's name and a "
                                "string, number or true / false")
        return OrtSettings(
            sessions=self.sessions, graph_optimization_level=self.graph_optimization_level,
            intra_op_num_threads=self.intra_op_num_threads or physical_cores(),
            inter_op_num_threads=self.inter_op_num_threads, execution_mode=self.execution_mode,
            providers=tuple(self.providers) or tuple(select_providers()),
            prepack=(self.sessions == "shared") if self.prepack is None else bool(self.prepack),
            spin=bool(self.spin), extra={k: entry_value(v) for k, v in self.extra.items()})

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["providers"] = list(self.providers)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "OrtSettings":
        d = dict(d)
        p = d.get("providers", ())
        d["providers"] = tuple(p) if isinstance(p, (list, tuple)) else (p,)  # ("x": one name, not its letters)
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
        if self.spin:  # ... within a run only: another session runs next (module doc)
            so.add_session_config_entry("session.force_spinning_stop", "1")
        for k, v in self.extra.items():
            so.add_session_config_entry(k, str(v))
        for name, value in (free_dims or {}).items():
            so.add_free_dimension_override_by_name(name, int(value))
        return so


def _known_providers() -> list[str]:
    import onnxruntime as ort

    return ort.get_all_providers()


def ort_errors() -> tuple[type[BaseException], ...]:
    """What ONNX Runtime raises for a failure of its own (a missing op or kernel, a shape a
    node refuses, memory it could not allocate): its own classes, which do not derive from
    RuntimeError, and RuntimeError from inside a kernel. Anything else is a bug here."""
    import onnxruntime.capi.onnxruntime_pybind11_state as ort_state

    return (RuntimeError, *(getattr(ort_state, n) for n in (
        "Fail", "InvalidArgument", "NotImplemented", "InvalidGraph", "RuntimeException", "EPFail")
        if hasattr(ort_state, n)))


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

    def __init__(self, path: Path, settings: OrtSettings, roles: int = 2):
        self.path = Path(path)
        if settings.sessions == "per-depth" and roles <= 1:
            # one role (the draft): one session either way, with no weights to share, so
            # it keeps the shared mode's prepacking (without it an int8 MatMulNBits draft
            # pass ran 30x slower on SmolLM2's draft, and computed other logits)
            from dataclasses import replace

            settings = replace(settings, sessions="shared", prepack=True)
        self.settings = settings
        self._sessions: dict[str, Any] = {}
        self._users: dict[str, int] = {}
        self._weights: dict[str, Any] | None = None  # per-depth mode: name -> OrtValue

    def _key(self, role: Role) -> str:
        return "*" if self.settings.sessions == "shared" else role.name

    def _shared_weights(self) -> dict[str, Any]:
        """Every initializer, loaded once as an OrtValue over numpy memory."""
        if self._weights is None:
            import onnxruntime as ort
            from onnx import numpy_helper

            from specrt.engines.base import load_onnx

            model = load_onnx(self.path)
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
                 graph: OrtGraph, aliases: Mapping[str, str] | None = None):
        super().__init__(role, inputs, outputs, aliases)
        self.graph = graph
        self._sess = None
        self._binding = None
        self._fixed: dict[str, np.ndarray] = {}
        # aliased output -> (array, address, shape) it is bound to
        self._bound: dict[str, tuple[np.ndarray, int, tuple[int, ...]]] = {}
        self._fed: dict[str, tuple[np.ndarray, tuple[int, ...]]] = {}  # input -> array (and shape) bound to it
        self._dynamic: list[str] = []  # outputs ONNX Runtime allocates per call
        self._run_options = None

    def activate_impl(self) -> None:
        self._sess = self.graph.acquire(self.role)
        try:
            self._check_io()
        except UserError:
            self._sess = None
            self.graph.release(self.role)
            raise
        b = self._sess.io_binding()
        self._fixed = {}
        # Bind every output once. Fixed shapes: into preallocated arrays the runner owns
        # (a decode/verify step then allocates nothing on the host). Dynamic ones: ONNX
        # Runtime allocates per call, in proportion to the new tokens.
        self._bound = {}
        for t in self.outputs:
            dt = np_dtype(t.dtype)
            if t.name in self.aliases:
                continue  # bound to its input's buffer at every call (infer_impl)
            if dt is not None and all(isinstance(d, int) for d in t.shape):
                arr = np.empty(t.shape, dt)
                b.bind_output(t.name, "cpu", 0, dt, list(arr.shape), arr.ctypes.data)
                self._fixed[t.name] = arr
            else:
                b.bind_output(t.name, "cpu")
        self._binding = b
        self._fed = {}
        import onnxruntime as ort

        self._run_options = ort.RunOptions()
        self._run_options.log_severity_level = 4  # a failed call is said once, as an EngineFailure (infer_impl)
        self._dynamic = [t.name for t in self.outputs if t.name not in self._fixed and t.name not in self.aliases]

    def _check_io(self) -> None:
        """The graph file's inputs and outputs are those engines.json gives the role (names,
        element types, fixed sizes): a hand edit of its I/O, or of the role's engine file,
        met ONNX Runtime's own errors mid-decoding."""
        sess = self._sess
        have = {v.name: v for v in (*sess.get_inputs(), *sess.get_outputs())}
        want = [*((t, True) for t in self.inputs), *((t, False) for t in self.outputs)]
        # every one, optional inputs too: infer binds each input by name (an optional one's
        # default when the caller leaves it out), and IOBinding cannot bind a name the graph
        # lacks or has as an overridable initializer only (ONNX Runtime's RuntimeError
        # "Failed to find NodeArg" at every call, outside the EngineFailure wrapping)
        bad = [t.name for t, _ in want if t.name not in have]
        bad += [n for n in have if n not in {t.name for t, _ in want}]
        for t, _ in want:
            v = have.get(t.name)
            if v is not None and (v.type != f"tensor({'float' if t.dtype == 'float32' else t.dtype})"
                                  or len(v.shape) != len(t.shape)
                                  or any(isinstance(a, int) and isinstance(b, int) and a != b
                                         for a, b in zip(v.shape, t.shape))):
                bad.append(f"{t.name} ({t.dtype} {list(t.shape)}; the graph's {v.type} {v.shape})")
        rows = sess.get_modelmeta().custom_metadata_map.get(CACHE_ROWS_KEY)
        want = self.role.dims.get(C.DIM_CACHE)
        if rows is not None and want is not None and (want.min, want.max) != (int(rows), int(rows)):
            raise UserError(f"{self.graph.path}: built for a context of {rows} tokens (its cache rows and RoPE table), "
                            f"engines.json gives role '{self.name}' {want.max}; engines.json or the graph was changed "
                            "since the build: rebuild with `specrt build`")
        if bad:
            raise UserError(f"{self.graph.path}: its inputs and outputs differ from those engines.json gives role "
                            f"'{self.name}' ({', '.join(bad[:4])}); the manifest or the graph was edited: rebuild "
                            "with `specrt build`")

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        b = self._binding
        fed = self._fed
        for name, a in feeds.items():
            # The binding holds the array itself (no copy: check_feeds made it contiguous
            # and of the graph's dtype) and a reference to it, so the same array, as the
            # in-place KV buffers are at every call, stays bound with its current contents;
            # rebinding 60 of them cost ~0.08 ms a call.
            prev = fed.get(name)
            if prev is None or prev[0] is not a or prev[1] != a.shape:
                b.bind_cpu_input(name, a)
                fed[name] = (a, a.shape)
        # A dynamic output bound to a device keeps the OrtValue of the previous call, whose
        # shape would be reused as a preallocated buffer: rebind so each call allocates anew.
        # An in-place output is bound to the memory of its input (the runtime's cache
        # buffer), rebound only when the caller hands a different buffer.
        for out, src in self.aliases.items():
            a = feeds[src]
            prev = self._bound.get(out)
            if prev is None or prev[0] is not a or prev[2] != a.shape:  # (a.ctypes.data costs ~1 us)
                addr = a.ctypes.data
                if prev is None or prev[1] != addr or prev[2] != a.shape:
                    b.bind_output(out, "cpu", 0, a.dtype, list(a.shape), addr)
                self._bound[out] = (a, addr, a.shape)
        for name in self._dynamic:
            b.bind_output(name, "cpu")
        try:
            self._sess.run_with_iobinding(b, self._run_options)
        except ort_errors() as e:  # the request was fine: the engine (or the machine) failed it
            reason = " ".join(str(e).split())
            raise EngineFailure(f"engine '{self.name}' ({self.graph.path.name}) failed in ONNX Runtime: "
                                f"{reason[:600]}") from None
        res = {out: feeds[src] for out, src in self.aliases.items()}
        if len(self._fixed) + len(self.aliases) == len(self.outputs):
            return {**self._fixed, **res}
        # binding order: the non-aliased outputs first (bound at activation, in order),
        # then the aliased ones (bound at the first call)
        values = b.get_outputs()
        plain = [t for t in self.outputs if t.name not in self.aliases]
        for t, v in zip(plain, values):
            res[t.name] = self._fixed[t.name] if t.name in self._fixed else v.numpy()
        return res

    def deactivate_impl(self) -> None:
        self._binding = None
        self._sess = None
        self._fixed = {}
        self._bound = {}
        self._fed = {}
        self.graph.release(self.role)


# ---- in-place KV (contracts.py "In-place KV") -------------------------------------------


def probe_inplace_gqa(settings: OrtSettings, num_heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                      dtype: str = "float32", packed: bool = True) -> str | None:
    """None when this ONNX Runtime (with ``settings``' providers) runs GroupQueryAttention
    in place the way the in-place target graph needs it: a shared past/present buffer
    longer than the sequence, S > 1 new tokens over a non-empty past, causal among them,
    RoPE from the positions (the op's position_ids) and a token tree's mask (its
    attention_bias: the last of 3 new tokens a sibling of the second, contracts.py
    "Token trees"), for the target's head counts, head size (the CPU kernel
    wants head_dim % 16 == 0) and dtype, q/k/v packed in one input when ``packed`` (the
    graph packs them unless the model has qk-norm); and SkipSimplifiedLayerNormalization
    in that dtype. Otherwise the reason, in words. A 1-layer graph checked against numpy;
    versions before the op supported S > 1 over a past fail here."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    try:
        nh, kvh, d, cap, past, s = int(num_heads), int(kv_heads), int(head_dim), 12, 5, 3
        if dtype not in ("float32", "float16"):
            return f"GroupQueryAttention in place is not probed for {dtype}"
        ft, npt = (T.FLOAT, np.float32) if dtype == "float32" else (T.FLOAT16, np.float16)
        inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
        ang = np.arange(cap)[:, None] * inv[None]
        cos, sin = np.cos(ang).astype(npt), np.sin(ang).astype(npt)
        vi = helper.make_tensor_value_info
        qkv_in = ["qkv", "", ""] if packed else ["q", "k", "v"]
        gamma = np.linspace(0.5, 1.5, nh * d).astype(npt)
        pack = [helper.make_node("Concat", ["q", "k", "v"], ["qkv"], axis=-1)] if packed else []
        graph = helper.make_graph(
            [*pack,
             helper.make_node("GroupQueryAttention", [*qkv_in, "ck", "cv", "sl", "tot", "cos", "sin", "pos", "bias"],
                              ["o", "ck_out", "cv_out"], domain="com.microsoft", num_heads=nh, kv_num_heads=kvh,
                              scale=d ** -0.5, do_rotary=1, rotary_interleaved=0),
             helper.make_node("SkipSimplifiedLayerNormalization", ["q", "q", "gamma"], ["norm", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-6)],
            "probe",
            [vi("q", ft, [1, s, nh * d]), vi("k", ft, [1, s, kvh * d]), vi("v", ft, [1, s, kvh * d]),
             vi("ck", ft, [1, kvh, cap, d]), vi("cv", ft, [1, kvh, cap, d]), vi("sl", T.INT32, [1]),
             vi("tot", T.INT32, []), vi("pos", T.INT64, [1, s]), vi("bias", ft, [1, 1, s, past + s])],
            [vi("o", ft, [1, s, nh * d]), vi("ck_out", ft, [1, kvh, cap, d]), vi("cv_out", ft, [1, kvh, cap, d]),
             vi("norm", ft, [1, s, nh * d]), vi("sum", ft, [1, s, nh * d])],
            [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin"),
             numpy_helper.from_array(gamma, "gamma")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        so = ort.SessionOptions()
        so.log_severity_level = 4  # the failure is reported in words by the caller
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=list(settings.providers))
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((1, s, n * d)).astype(npt) for n in (nh, kvh, kvh))
        ck, cv = (rng.standard_normal((1, kvh, cap, d)).astype(npt) for _ in range(2))
        k0, v0 = ck.copy(), cv.copy()
        pos = np.array([past, past + 1, past + 1])  # x, a1 and b1, a sibling of a1
        seen = np.concatenate([np.ones((s, past), bool),
                               (pos[None] < pos[:, None]) | np.eye(s, dtype=bool)], 1)  # [S, past + S]
        bias = np.where(seen, 0.0, np.finfo(npt).min).astype(npt)[None, None]
        b = sess.io_binding()
        for name, a in (("q", q), ("k", k), ("v", v), ("ck", ck), ("cv", cv),
                        ("sl", np.array([past + s - 1], np.int32)), ("tot", np.array(past + s, np.int32)),
                        ("pos", pos[None]), ("bias", bias)):
            b.bind_cpu_input(name, a)
        for name, a in (("ck_out", ck), ("cv_out", cv)):
            b.bind_output(name, "cpu", 0, npt, list(a.shape), a.ctypes.data)
        for name in ("o", "norm", "sum"):
            b.bind_output(name, "cpu")
        sess.run_with_iobinding(b)
        outs = b.get_outputs()  # bound in order: ck_out, cv_out, o, norm, sum
        o = outs[2].numpy().astype(np.float64).reshape(s, nh, d)
        norm, total = (x.numpy().astype(np.float64) for x in outs[3:5])
        q, k, v, ck, cv, k0, v0 = (x.astype(np.float64) for x in (q, k, v, ck, cv, k0, v0))
        cos, sin = cos.astype(np.float64), sin.astype(np.float64)

        def rope(x, pos):  # [S, h, d], rotate_half
            c = np.concatenate([cos[pos]] * 2, -1)[:, None]
            sn = np.concatenate([sin[pos]] * 2, -1)[:, None]
            return x * c + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sn

        qh, kh = rope(q.reshape(s, nh, d), pos), rope(k.reshape(s, kvh, d), pos)
        keys = np.concatenate([k0[0, :, :past].transpose(1, 0, 2), kh])
        vals = np.concatenate([v0[0, :, :past].transpose(1, 0, 2), v.reshape(s, kvh, d)])
        err = float(np.abs(ck[0, :, past:past + s].transpose(1, 0, 2) - kh).max())
        for h in range(nh):
            sc = qh[:, h] @ keys[:, h // (nh // kvh)].T * d ** -0.5
            sc[~seen] = -np.inf
            p = np.exp(sc - sc.max(-1, keepdims=True))
            ref = (p / p.sum(-1, keepdims=True)) @ vals[:, h // (nh // kvh)]
            err = max(err, float(np.abs(o[:, h] - ref).max()))
        tol = 1e-4 if dtype == "float32" else 2e-2
        if not err < tol:
            return f"GroupQueryAttention in place differs from the reference by {err:.2e} ({dtype})"
        x2 = 2 * q
        ref = x2 / np.sqrt((x2 ** 2).mean(-1, keepdims=True) + 1e-6) * gamma.astype(np.float64)
        err = max(float(np.abs(norm - ref).max()), float(np.abs(total - x2).max()))
        if not err < 4 * tol:
            return f"SkipSimplifiedLayerNormalization differs from the reference by {err:.2e} ({dtype})"
        return None
    except ort_errors() as e:  # an older ONNX Runtime without the op or without S > 1 over a past
        return (f"GroupQueryAttention in place or SkipSimplifiedLayerNormalization is unavailable "
                f"({type(e).__name__}: {str(e).splitlines()[0][:200]})")


CACHE_ROWS_KEY = "specrt.cache_tokens"  # the in-place target graph's metadata: its cache rows


def write_inplace_target(src: Path, decoder: dict[str, Any], aux_layer_ids, dtype: str, cache_len: int,
                         dst: Path, head: str = "full") -> Any:
    """Re-lower the export's target graph with in-place KV (export/graphs.py, kv="inplace")
    from the weights in ``src`` (read one tensor at a time, external data by offset), into
    ``dst`` + ``dst.data``; returns its GraphIO."""
    import onnx

    from specrt.engines.base import initializer_reader
    from specrt.export.config import DecoderConfig
    from specrt.export.graphs import build_target_graph, save_model
    from specrt.export.onnx_ops import check_dtype

    check_dtype(dtype)
    inits, read = initializer_reader(src)
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)

    def get(slot: str) -> np.ndarray:
        t = inits.get(slot)
        if t is None:
            raise UserError(f"{src}: has no weight '{slot}' to re-lower the target with in-place KV")
        if t.data_location == onnx.TensorProto.EXTERNAL and t.data_type not in floats:
            raise UserError(f"{src}: weight '{slot}' has ONNX type {t.data_type}; in-place KV needs float32/float16")
        return read(slot)

    cfg = DecoderConfig.from_json(decoder)
    outliers = None
    if head == "screened":  # the exact head and its bounds beside the graph (specrt/head.py)
        from specrt.head import BOUNDS_FILE, WEIGHT_FILE, choose_outliers, n_outliers, quantize_head

        states = _head_states(cfg, get, aux_layer_ids, dtype, src.parent, dst.parent)
        outliers = choose_outliers(states, n_outliers(cfg.hidden_size))
        w = np.asarray(get("embed" if cfg.tie_word_embeddings else "lm_head"), np.float32)
        np.save(dst.parent / WEIGHT_FILE, w, allow_pickle=False)
        np.save(dst.parent / BOUNDS_FILE, quantize_head(w, outliers)[2], allow_pickle=False)
    out = build_target_graph(cfg, get, aux_layer_ids, dtype, kv="inplace", cache_len=int(cache_len), head=head,
                             outliers=outliers)
    del get, read, inits  # (the export's graph, whole for a single-file export, before the new one is saved)
    io = C.target_io(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, cfg.hidden_size, dtype,
                     kv="inplace", head=head, num_aux=len(aux_layer_ids))
    # the rows its RoPE table and cache were made for, in the graph (hashed) where loading reads
    # them: engines.json (not hashed) edited to a larger context crashed in the RoPE table mid-run
    out.metadata_props.add(key=CACHE_ROWS_KEY, value=str(int(cache_len)))
    save_model(out, dst, external_data=True)
    return io


def _head_states(cfg, get, aux_layer_ids, dtype: str, export_dir: Path, scratch: Path) -> np.ndarray:
    """The target's final hidden states (the head's input) [N, H] over the canary's prompts
    (runtime/canary.py), to choose a screened head's fp32 channels: the portable graph with
    ``head_hidden`` out, written to ``scratch`` (external data: no 2 GB protobuf limit) and
    removed after one prefill a prompt."""
    import onnxruntime as ort

    from specrt.export.graphs import build_target_graph, save_model
    from specrt.runtime.canary import prompt_ids

    path = scratch / "head_calibration.onnx"
    save_model(build_target_graph(cfg, get, aux_layer_ids, dtype, head="hidden"), path, external_data=True)
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        empty = np.zeros((1, 0, cfg.num_kv_heads, cfg.head_dim), np.float32)
        kv = {i.name: empty for i in sess.get_inputs() if i.name not in (C.INPUT_IDS, C.POSITION_IDS)}
        states = []
        for ids in prompt_ids(export_dir, cfg.vocab_size):
            feeds = {C.INPUT_IDS: np.array([ids], np.int64),
                     C.POSITION_IDS: np.arange(len(ids), dtype=np.int64)[None]}
            states.append(sess.run([C.HEAD_HIDDEN], {**feeds, **kv})[0][0])
        del sess
    finally:
        for p in (path, path.with_name(path.name + ".data")):
            p.unlink(missing_ok=True)
    return np.concatenate(states)
