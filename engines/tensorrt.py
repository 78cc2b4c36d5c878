"""TensorRT backend, through polygraphy's lazy loaders (DESIGN.md §7).

Build (per ``plan.TrtPlan`` engine):

    SaveEngine(EngineFromNetwork(NetworkFromOnnxPath(graph.onnx),
                                 config=PostprocessConfig(CreateConfig(tf32=, fp16=, bf16=, profiles=[...],
                                                                       load_timing_cache=timing.cache),
                                                          activation_resize),
                                 save_timing_cache=timing.cache),
               path=<plan file>)

(DESIGN.md §7's chain; it deserialises each plan once to save it, where
EngineBytesFromNetwork + SaveBytes would write the bytes as built: a build-time cost)

Every input of every profile has explicit (min, opt, max) shapes from the plan; decode
and the verify depths are ``min = opt = max`` on ``new_tokens``. One timing cache file
is loaded and re-saved by every build, so later builds (the draft, per-role plans in the
``engines`` layout) reuse the tactic timings of earlier ones, and a rebuild (--force) in
the same environment starts from the old folder's (build.carry_timing_cache).

Run: each plan is deserialised once (``EngineFromBytes``) and shared by the runners of
its roles; a runner is ``polygraphy TrtRunner(engine, optimization_profile=i,
allocation_strategy="runtime")``: each execution context holds activation memory for the
shapes it has been called with (grown when a call needs more), not for its profile's
maximum (where the plan was built by TensorRT 10.10 or later: activation_resize; an older
one may size it for the profile's maximum whatever the shapes): the prefill and draft
profiles reach the whole context (S up to C), while the runtime feeds them at most 256
rows a pass (runtime/generate.py's chunks), and their attention scores at S = C would
take gigabytes apiece. Outputs of the roles whose row count varies (prefill, draft) are
copied out of polygraphy's host buffers, which it resizes in place for the next call of
another size (base.py's contract).

Nothing here imports tensorrt at module import: polygraphy loads it on first call, and
this module is importable (and its loader composition testable) on machines without it.
Known limit: TrtRunner takes host numpy feeds, so the past KV is copied to the device on
every call (O(context) per step); a device-resident KV cache (DeviceView feeds) is the
next step for this backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner
from specrt.engines.plan import Role, TrtEngine, TrtPlan
from specrt.errors import EngineFailure, UserError


def _polygraphy_exception() -> type[BaseException]:
    """polygraphy's own exception (what its TensorRT runner raises for a failed call), imported
    only when one is being handled."""
    from polygraphy.exception import PolygraphyException

    return PolygraphyException


def require_tensorrt() -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        raise UserError("the tensorrt backend needs TensorRT, which is not installed here (pip install "
                        "'specrt[tensorrt]' on a machine with an NVIDIA GPU), or build --backend onnxruntime") from None


# TensorRT >= 10.10's preview feature that makes update_device_memory_size_for_shapes (what
# polygraphy's "runtime" allocation calls before every execute) size a context's activation
# memory for the shapes just bound; without it an engine may report its profile's maximum,
# whatever the call's shapes (it is off unless set at build time)
RUNTIME_RESIZE = "RUNTIME_ACTIVATION_RESIZE_10_10"


def activation_resize(builder, network, config) -> None:
    """polygraphy PostprocessConfig step: turn RUNTIME_RESIZE on where this TensorRT has it."""
    import tensorrt as trt

    feature = getattr(trt.PreviewFeature, RUNTIME_RESIZE, None)
    if feature is not None:
        config.set_preview_feature(feature, True)


def engine_loader(plan: TrtPlan, engine: TrtEngine, folder: Path):
    """The lazy polygraphy loader that builds ``engine`` and saves its plan into ``folder``.
    Constructing it needs no TensorRT; calling it builds."""
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, NetworkFromOnnxPath, PostprocessConfig,
                                        Profile, SaveEngine)

    folder = Path(folder)
    profiles = []
    for p in engine.profiles:
        prof = Profile()
        for name, (lo, opt, hi) in p.shapes.items():
            prof.add(name, min=list(lo), opt=list(opt), max=list(hi))
        profiles.append(prof)
    cache = str(folder / plan.timing_cache)
    config = PostprocessConfig(CreateConfig(profiles=profiles, load_timing_cache=cache, **plan.flags),
                               activation_resize)
    network = NetworkFromOnnxPath(str(folder / engine.onnx), strongly_typed=plan.strongly_typed or None)
    build = EngineFromNetwork(network, config=config, save_timing_cache=cache)
    return SaveEngine(build, path=str(folder / engine.file))


def build(plan: TrtPlan, folder: Path, log: Callable[[str], None] = print) -> None:
    """Build and save every plan of ``plan`` into ``folder`` (which holds export/)."""
    import time

    require_tensorrt()
    import tensorrt as trt

    if not hasattr(trt.PreviewFeature, RUNTIME_RESIZE):
        log(f"tensorrt: note: TensorRT {trt.__version__} has no {RUNTIME_RESIZE} (10.10 and later): each execution "
            "context may hold activation memory for its profile's largest shapes (the prefill's and the draft's "
            "reach the whole context), not for the shapes it is called with")
    if plan.precision == "fp16" and not plan.strongly_typed:
        log(f"tensorrt: note: a float32 export built at {plan.precision}: TensorRT chooses each layer's precision, "
            "RMSNorm's x^2 and mean included, which can overflow in fp16 on large activations, and RoPE's "
            "position x frequency angles, which fp16 rounds by up to a radian past position 2048 (unverified: no "
            "TensorRT has run this build); a float16 export (`specrt export --dtype float16`) builds strongly "
            "typed, its norms and RoPE angles in float32")
    for e in plan.engines:
        t0 = time.perf_counter()
        log(f"tensorrt: building {e.file} from {e.onnx} ({len(e.profiles)} profile(s): "
            f"{', '.join(p.role for p in e.profiles)}; flags {plan.flags})")
        try:
            engine_loader(plan, e, folder)()
        except UserError:
            raise
        except Exception as ex:  # polygraphy raises PolygraphyException on parser/builder failure
            raise UserError(f"TensorRT could not build {e.file} from {e.onnx}: {ex}") from None
        log(f"tensorrt: {e.file} built in {time.perf_counter() - t0:.1f} s")


def weight_bytes(plan: TrtPlan, folder: Path) -> dict[str, int]:
    """graph -> bytes of its plan files in ``folder``: in the ``engines`` layout each role's
    plan holds its own copy of the graph's weights, so they add up."""
    out: dict[str, int] = {}
    for e in plan.engines:
        out[e.graph] = out.get(e.graph, 0) + (Path(folder) / e.file).stat().st_size
    return out


class TrtEngines:
    """Deserialised plans shared by runners: each plan loaded once, freed with its last user."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._engines: dict[str, Any] = {}
        self._users: dict[str, int] = {}

    def acquire(self, file: str):
        if file not in self._engines:
            require_tensorrt()
            from polygraphy.backend.common import BytesFromPath
            from polygraphy.backend.trt import EngineFromBytes

            self._engines[file] = EngineFromBytes(BytesFromPath(str(self.folder / file)))()
        self._users[file] = self._users.get(file, 0) + 1
        return self._engines[file]

    def release(self, file: str) -> None:
        self._users[file] -= 1
        if self._users[file] == 0:
            del self._engines[file], self._users[file]


# TensorRT's DataType names -> the contract's dtype names (tensorrt.DataType.<NAME>)
TRT_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64", "INT32": "int32",
              "INT8": "int8", "BOOL": "bool", "UINT8": "uint8", "FP8": "float8"}


def check_plan_io(engine: Any, inputs: tuple[C.TensorSpec, ...], outputs: tuple[C.TensorSpec, ...],
                  file: str, role: str) -> None:
    """The plan's I/O tensors (names, input or output, dtypes) are the contract's: with
    check_inputs off, polygraphy copies a feed's raw bytes into its binding, so an int64
    feed into an int32 binding (or a name the plan lacks) would run on garbage, not fail.
    ``engine``: a deserialised tensorrt.ICudaEngine (num_io_tensors, get_tensor_name,
    get_tensor_mode, get_tensor_dtype)."""
    io = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        mode = str(engine.get_tensor_mode(name)).rsplit(".", 1)[-1]  # TensorIOMode.INPUT / OUTPUT
        dtype = str(engine.get_tensor_dtype(name)).rsplit(".", 1)[-1]
        io[name] = (mode, TRT_DTYPES.get(dtype, dtype.lower()))
    problems = []
    for kind, specs in (("INPUT", inputs), ("OUTPUT", outputs)):
        for t in specs:
            got = io.get(t.name)
            if got is None:
                if not t.optional:
                    problems.append(f"{t.name}: missing")
            elif got[0] != kind:
                problems.append(f"{t.name}: an {got[0].lower()} of the plan, expected an {kind.lower()}")
            elif got[1] != t.dtype:
                problems.append(f"{t.name}: {got[1]} in the plan, the contract's is {t.dtype}")
    known = {t.name for t in inputs}  # (an input no feed sets fails at the first call, not here)
    problems += [f"{n}: an input of the plan the contract lacks" for n, (m, _) in io.items()
                 if m == "INPUT" and n not in known]
    if problems:
        raise UserError(f"{file} (role {role}): its I/O is not the engines' contract ({'; '.join(problems[:4])}"
                        f"{'; ...' if len(problems) > 4 else ''}); rebuild it with `specrt build --backend tensorrt`")


class TrtRunner(Runner):
    backend = "tensorrt"

    def __init__(self, role: Role, inputs: tuple[C.TensorSpec, ...], outputs: tuple[C.TensorSpec, ...],
                 engines: TrtEngines, file: str, profile: int):
        super().__init__(role, inputs, outputs)
        self.engines, self.file, self.profile = engines, file, int(profile)
        self._runner = None

    def activate_impl(self) -> None:
        from polygraphy.backend.trt import TrtRunner as PgTrtRunner

        engine = self.engines.acquire(self.file)
        try:
            check_plan_io(engine, self.inputs, self.outputs, self.file, self.name)
            self._runner = PgTrtRunner(engine, name=self.name, optimization_profile=self.profile,
                                       allocation_strategy="runtime")
            self._runner.activate()
        except BaseException:  # the engine is not held by a runner that never started
            self._runner = None
            self.engines.release(self.file)
            raise

    def infer_impl(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            out = self._runner.infer(feeds, check_inputs=False)
        except _polygraphy_exception() as e:  # its words for TensorRT's failed call (execute_async_v3, a shape):
            # an EngineFailure as ONNX Runtime's (onnxruntime.py; not run here: no TensorRT on these machines)
            raise EngineFailure(f"engine '{self.name}' ({self.file}) failed in TensorRT: "
                                f"{' '.join(str(e).split())[:600]}") from None
        if self.copies_outputs:
            return {k: np.array(v) for k, v in out.items()}
        return dict(out)

    @property
    def copies_outputs(self) -> bool:
        """A role whose new rows vary: its outputs are copied, since polygraphy resizes its host
        buffers in place (``obj.resize(..., refcheck=False)``) for a call of another size,
        which would leave an earlier result pointing at freed memory."""
        d = self.dims.get(C.DIM_NEW)
        return d is not None and not d.fixed

    def deactivate_impl(self) -> None:
        try:
            self._runner.deactivate()
        finally:
            self._runner = None
            self.engines.release(self.file)
