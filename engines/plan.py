"""The build plan: which engines exist, for which shapes. Pure data, no backend imported.

An export folder holds two graphs (contracts.py): ``target`` (any S new tokens over any
P committed ones) and ``draft``. Engines specialise them into *roles*:

    role        graph   new_tokens S          past_tokens P       other dims
    prefill     target  1 .. C (opt 128)      0 .. C-1 (opt 0)
    decode      target  1 (fixed)             0 .. C-1
    verify.{d}  target  d + 1 (fixed)         0 .. C-d-1          one role per depth d
    draft       draft   P-EAGLE: A + M        0 .. C+K-1          aux_tokens A 1 .. C (opt: typical A)
                        EAGLE-3: A + B                            aux A 0 .. C, prev B 0 .. C+K

C is the context limit (``max_context``): a target call needs past + new <= C; the draft
runs up to K = max(depths) positions ahead of the committed tokens, so its limit is C + K.
Verify at depth d scores the last committed token plus d draft tokens, so S = d + 1 and
its logits give d + 1 target distributions.
The draft is specialised to nothing but its ranges: a P-EAGLE pass drafts K = M + 1
tokens for any M the caller feeds (the runtime always drafts the deepest block,
K = max(depths); only the verified length changes, DESIGN.md §5).

TensorRT layout decision (DESIGN.md §7, NVIDIA/TensorRT-LLM#2506): an engine built for a
range of S runs slower at small S than one built for a single S, so every verify depth
and decode get ``min = opt = max`` on S. Two ways to get that:

* ``profiles`` (default): ONE target engine holding one optimisation profile per role.
  TensorRT selects tactics per profile, so each depth runs kernels chosen for exactly its
  shape, while the weights are stored and loaded once. Separate engines would hold one
  device copy of the weights per depth (5 engines for depths 1,2,4,8 = 5x the weight
  memory), which the runtime's memory target (peak <= 1.3x weights + KV) forbids.
* ``engines``: one plan per role with a single profile each: independent rebuilds and
  no cross-profile constraints, at N x the weight memory. Kept for measuring on a GPU
  (tools/device_check_trt.py builds both).

The past length P is dynamic in every role (it grows every round); its ``opt`` is the
typical context the cost table is profiled at.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from specrt import contracts as C
from specrt.errors import InternalError, UserError
from specrt.limits import MAX_DEPTH, digits

PREFILL, DECODE, DRAFT = "prefill", "decode", "draft"
LAYOUTS = ("profiles", "engines")
# precision name -> graph dtypes it can be built from (a lower precision from float32 lets
# TensorRT pick fp16/bf16 kernels; ONNX Runtime runs the graph's own dtype only).
PRECISIONS = C.PRECISIONS


def verify_role(d: int) -> str:
    return f"verify.{d}"


def role_depth(role: str) -> int | None:
    """verify.{d} -> d; decode -> 0; other roles -> None."""
    if role == DECODE:
        return 0
    if role.startswith("verify."):
        return int(role.split(".", 1)[1])
    return None


def normalise_precision(precision: str | None, export_dtype: str) -> str:
    """``fp32``/``float32`` etc. -> ``fp32``; None -> the export's own dtype."""
    if precision is None:
        for k, v in PRECISIONS.items():
            if v == export_dtype:
                return k
        raise UserError(f"export dtype '{export_dtype}' is not one of {', '.join(PRECISIONS.values())}")
    p = precision.strip().lower()  # (as --governor and --dtype: " fp16", "FP16" taken)
    for k, v in PRECISIONS.items():
        if p in (k, v):
            return k
    raise UserError(f"--precision '{precision}' is not supported (choose one of {', '.join(PRECISIONS)})")


def parse_depths(depths: Any) -> tuple[int, ...]:
    """``"1,2,4,8"`` (or with ranges, ``"1-4,8"``) or an iterable of ints -> sorted unique
    positive depths."""
    twice = None  # a depth named twice, said after an out-of-range one ("70,70" was "named twice": r74)
    if isinstance(depths, str):
        parts = [p.strip() for p in depths.split(",")]
        if "" in parts and any(parts):  # ("1,,2" was 1,2 without a word: a depth lost in typing?)
            # (by its place, as specrt bench's lists say theirs: bench_engines' --contexts beside it, r74)
            raise UserError(f"--depths '{depths}': item {parts.index('') + 1} of {len(parts)} is empty; expected "
                            "comma-separated integers such as 1,2,4,8")
        vals, first = [], {}  # first: depth -> the item that named it (each once: "1,2,2" a slip, as bench's lists)
        for i, p in enumerate(filter(None, parts), 1):
            lo, dash, hi = (x.strip() for x in p.partition("-"))
            # ("1-4" was refused: a range, as a user types one; int() took "１" (a full-width digit) as 1)
            if not digits(lo) or dash and not digits(hi):
                raise UserError(f"--depths '{depths}': expected comma-separated integers such as 1,2,4,8 (or "
                                "ranges such as 1-4)")
            if len(lo.lstrip("0")) > 9 or len(hi.lstrip("0")) > 9:  # (past 4300 digits int() raises)
                raise UserError(f"--depths: {p} out of range (each depth must be in 1..{MAX_DEPTH})")
            a = int(lo)
            b = int(hi) if dash else a
            if b < a:
                raise UserError(f"--depths '{depths}': the range {p} runs backwards; expected LOW-HIGH such as 1-4")
            named = range(a, b + 1) if b <= MAX_DEPTH else [b]  # (past MAX_DEPTH: said below)
            if twice is None and (again := next((d for d in named if d in first), None)) is not None:
                twice = f"--depths '{depths}': depth {again} is named twice (items {first[again]} and {i}); each " \
                    "depth is built once"
            first.update(dict.fromkeys(named, i))
            vals += named
    else:
        vals = [int(d) for d in depths]
    if not vals:
        raise UserError("--depths: at least one verify depth is needed")
    bad = list(dict.fromkeys(d for d in vals if not 1 <= d <= MAX_DEPTH))  # ("70,70": [70] once)
    if bad:
        raise UserError(f"--depths: {bad} out of range (each depth must be in 1..{MAX_DEPTH})")
    if twice is not None:
        raise UserError(twice)
    return tuple(sorted(set(vals)))


@dataclass(frozen=True)
class DimRange:
    """A dimension's range in one role: ``min <= opt <= max`` (equal when specialised)."""

    min: int
    opt: int
    max: int

    def __post_init__(self):
        if not 0 <= self.min <= self.opt <= self.max:
            raise InternalError(f"bad dimension range {self}")

    @property
    def fixed(self) -> bool:
        return self.min == self.max

    def to_json(self) -> list[int]:
        return [self.min, self.opt, self.max]

    @classmethod
    def of(cls, v: int) -> "DimRange":
        return cls(v, v, v)


ShapeTriple = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Role:
    """One engine role: a graph and the range of every symbolic dimension of its inputs."""

    name: str
    graph: str  # "target" | "draft"
    dims: dict[str, DimRange]
    limit: int  # most positions one call may reach: past + new <= limit

    def shapes(self, inputs: list[dict[str, Any]]) -> dict[str, ShapeTriple]:
        """Exact (min, opt, max) shapes for every input of the graph's I/O (JSON form)."""
        out: dict[str, ShapeTriple] = {}
        for t in inputs:
            lo, op, hi = [], [], []
            for d in t["shape"]:
                r = DimRange.of(d) if isinstance(d, int) else self.dims.get(d)
                if r is None:
                    raise InternalError(f"role {self.name}: input {t['name']} has dim '{d}' with no range")
                lo.append(r.min)
                op.append(r.opt)
                hi.append(r.max)
            out[t["name"]] = (tuple(lo), tuple(op), tuple(hi))
        return out

    def to_json(self) -> dict[str, Any]:
        return {"graph": self.graph, "dims": {k: v.to_json() for k, v in self.dims.items()}, "limit": self.limit}

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> "Role":
        return cls(name, data["graph"], {k: DimRange(*v) for k, v in data["dims"].items()}, int(data["limit"]))


def least_context(depths) -> int:
    """The least context `specrt build` takes for ``depths``: a prompt token, the first new
    token, the deepest verify's drafts and its bonus, as the prompt and the answer together
    hold at most the context (generate.py's room). make_roles' shapes need one less: at
    max(depths) + 2, which build took, the deepest verify never ran and compare refused the
    engines (h74d); such engines, built before, still load."""
    return max(depths) + 3


def make_roles(depths: tuple[int, ...], max_context: int, draft_kind: str | None, *, opt_past: int = 512,
               opt_prompt: int = 128, draft_accepted: int = 2) -> dict[str, Role]:
    """Every role of an engine set, with its dimension ranges (see the module docstring).

    ``draft_kind``: "peagle", "eagle3" or None (no draft). ``opt_past``/``opt_prompt``/
    ``draft_accepted`` are the typical sizes TensorRT tunes ``opt`` for (clipped to range).
    """
    Cx = int(max_context)
    if Cx < max(depths) + 2:
        raise UserError(f"--max-context {Cx} is too small for depth {max(depths)}: expected at least "
                        f"{max(depths) + 2} (a token, the depth's drafts and its bonus token)")
    clip = lambda v, lo, hi: max(lo, min(v, hi))  # noqa: E731
    roles: dict[str, Role] = {
        PREFILL: Role(PREFILL, "target", {C.DIM_NEW: DimRange(1, clip(opt_prompt, 1, Cx), Cx),
                                          C.DIM_PAST: DimRange(0, 0, Cx - 1)}, Cx),
        DECODE: Role(DECODE, "target", {C.DIM_NEW: DimRange.of(1),
                                        C.DIM_PAST: DimRange(0, clip(opt_past, 0, Cx - 1), Cx - 1)}, Cx),
    }
    for d in depths:
        s = d + 1
        roles[verify_role(d)] = Role(verify_role(d), "target", {
            C.DIM_NEW: DimRange.of(s), C.DIM_PAST: DimRange(0, clip(opt_past, 0, Cx - s), Cx - s)}, Cx)
    # The draft runs ahead of the committed tokens: its pass covers positions up to
    # last committed + K - 1 (P-EAGLE mask slots, EAGLE-3 drafted tokens), so its limit is
    # C + K where K = max(depths).
    Dx = Cx + max(depths)
    past = DimRange(0, clip(opt_past, 0, Dx - 1), Dx - 1)
    if draft_kind == "peagle":
        m = max(depths) - 1  # mask slots of the deepest block
        a = clip(draft_accepted, 1, Cx)
        roles[DRAFT] = Role(DRAFT, "draft", {C.DIM_NEW: DimRange(1, a + m, Dx), C.DIM_AUX: DimRange(1, a, Cx),
                                             C.DIM_PAST: past}, Dx)
    elif draft_kind == "eagle3":
        # typical step: one drafted token fed back with its own hidden state (A = 0, B = 1)
        roles[DRAFT] = Role(DRAFT, "draft", {C.DIM_NEW: DimRange(1, 1, Dx), C.DIM_AUX: DimRange(0, 0, Cx),
                                             C.DIM_PREV: DimRange(0, 1, Dx), C.DIM_PAST: past}, Dx)
    elif draft_kind is not None:
        raise UserError(f"draft kind '{draft_kind}' has no engine (expected peagle or eagle3)")
    return roles


def with_cache_rows(roles: dict[str, Role], max_context: int) -> dict[str, Role]:
    """``roles`` for in-place KV engines: each target role also ranges over the rows of the
    KV buffers it writes into, fixed at the context limit (contracts.DIM_CACHE)."""
    return {name: replace(role, dims={**role.dims, C.DIM_CACHE: DimRange.of(int(max_context))})
            if role.graph == "target" else role for name, role in roles.items()}


# ---- TensorRT ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TrtProfile:
    role: str
    shapes: dict[str, ShapeTriple]  # every input of the graph: (min, opt, max)

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "shapes": {k: [list(s) for s in v] for k, v in self.shapes.items()}}


@dataclass(frozen=True)
class TrtEngine:
    file: str  # plan file name inside the engines folder
    graph: str  # "target" | "draft"
    onnx: str  # the graph file it is built from, relative to the engines folder
    profiles: tuple[TrtProfile, ...]

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "graph": self.graph, "onnx": self.onnx,
                "profiles": [p.to_json() for p in self.profiles]}


@dataclass(frozen=True)
class TrtPlan:
    """Everything a TensorRT build does, decided without TensorRT."""

    precision: str
    flags: dict[str, bool]  # CreateConfig keyword flags: tf32, fp16, bf16
    layout: str
    timing_cache: str  # file name inside the engines folder, shared by every build
    engines: tuple[TrtEngine, ...]
    roles: dict[str, tuple[str, int]] = field(default_factory=dict)  # role -> (plan file, profile index)
    # a float16 export built at fp16: the network is strongly typed (TensorRT keeps every
    # tensor's ONNX type, so RMSNorm's statistics stay in the float32 the export casts them
    # to; with the fp16 flag on a float32 graph TensorRT may square activations in fp16,
    # which overflows past |x| = 256) and no precision flag is set (TensorRT refuses them
    # on strongly typed networks)
    strongly_typed: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"precision": self.precision, "flags": dict(self.flags), "strongly_typed": self.strongly_typed,
                "layout": self.layout,
                "timing_cache": self.timing_cache, "engines": [e.to_json() for e in self.engines],
                "roles": {r: {"file": f, "profile": i} for r, (f, i) in self.roles.items()}}


def trt_flags(precision: str, export_dtype: str) -> dict[str, bool]:
    """CreateConfig flags. fp32 disables TF32 so that fp32 engines match ONNX Runtime to 1e-5."""
    want = PRECISIONS[precision]
    if export_dtype == "bfloat16":  # its engines' I/O would be bfloat16, which polygraphy's numpy path lacks
        raise UserError("a bfloat16 export cannot be built for TensorRT here: its engines take and return "
                        "bfloat16 arrays, which polygraphy cannot hand to numpy; export float32 and build "
                        "--precision bf16 (bf16 compute, float32 I/O)")
    if want != export_dtype and export_dtype != "float32":
        raise UserError(f"precision {precision} cannot be built from a {export_dtype} export "
                        f"(export with --dtype {want} or float32)")
    if strongly_typed(precision, export_dtype):
        return {"tf32": False, "fp16": False, "bf16": False}
    return {"tf32": False, "fp16": precision == "fp16", "bf16": precision == "bf16"}


def strongly_typed(precision: str, export_dtype: str) -> bool:
    """Whether the plan's network is strongly typed: a float16 export built at fp16 (TrtPlan)."""
    return precision == "fp16" and export_dtype == "float16"


def trt_plan(roles: dict[str, Role], graph_io: dict[str, dict[str, Any]], graph_files: dict[str, str],
             precision: str, export_dtype: str, layout: str = "profiles") -> TrtPlan:
    """The TensorRT build plan. ``graph_io``: graph -> its I/O JSON (export.json's
    ``graphs[g]["io"]``); ``graph_files``: graph -> ONNX path relative to the engines folder."""
    if layout not in LAYOUTS:
        raise UserError(f"TensorRT layout '{layout}' is not one of {', '.join(LAYOUTS)}")
    flags = trt_flags(precision, export_dtype)
    engines: list[TrtEngine] = []
    where: dict[str, tuple[str, int]] = {}
    for graph in ("target", "draft"):
        mine = [r for r in roles.values() if r.graph == graph]
        if not mine:
            continue
        inputs = graph_io[graph]["inputs"]
        profiles = [TrtProfile(r.name, r.shapes(inputs)) for r in mine]
        if layout == "profiles" or len(profiles) == 1:
            file = f"{graph}.plan"
            engines.append(TrtEngine(file, graph, graph_files[graph], tuple(profiles)))
            where.update({p.role: (file, i) for i, p in enumerate(profiles)})
        else:
            for p in profiles:
                file = f"{graph}.{p.role}.plan"
                engines.append(TrtEngine(file, graph, graph_files[graph], (p,)))
                where[p.role] = (file, 0)
    return TrtPlan(precision, flags, layout, "timing.cache", tuple(engines), where,
                   strongly_typed=strongly_typed(precision, export_dtype))
