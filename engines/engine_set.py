"""``load_engines(folder) -> EngineSet``: the runtime's one entry point to engines.

    engines = load_engines("ENGINES")       # verifies hashes, export digest, version, device
    with engines:                           # activates every runner (sessions, contexts)
        out = engines.target(len(prompt)).infer(feeds)   # S = 1: decode, S = d+1: verify.d, else prefill
        out = engines.verify(4).infer(feeds)             # same runner as target(5)
        out = engines.draft().infer(feeds)               # None when the export has no draft
        t = engines.cost("verify.4", past=300)           # seconds, from the build's cost table

The runtime never branches on the backend: every role is a ``Runner`` (base.py).
"""

from __future__ import annotations

import os
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from specrt import contracts as C
from specrt.engines.base import Runner, specs_from_json
from specrt.engines.costs import interpolate, parse_costs
from specrt.engines.manifest import check_against_export, read_engines_manifest, verify_engines
from specrt.engines.plan import DECODE, DRAFT, PREFILL, Role, verify_role
from specrt.errors import InternalError, UserError
from specrt.paths import check_path_args


def _identity(folder: Path) -> tuple[int, int] | None:
    """(device, inode) of ``folder``, None where it cannot be read: gone, or a relative path
    while the working folder is gone (ENGINES "." rebuilt by `build --force`: stat(".") still
    reads the removed folder, so its files were said "missing", not the folder replaced)."""
    try:
        if not Path(folder).is_absolute():
            os.getcwd()  # (FileNotFoundError where the working folder was removed)
        st = os.stat(folder)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _pin(folder: Path) -> int | None:
    """An fd open on ``folder``, None where a folder cannot be opened (Windows): held as long as
    the EngineSet, it keeps the folder's inode number, which `build --force` (check_unchanged,
    check_still_here) is told by. Overlayfs over two file systems (xino off) numbers a directory
    anew each time it comes back into the cache: memory pressure dropping an unused one between
    a load and the check had the same folder taken for a rebuild (a bench's report refused)."""
    try:
        return os.open(folder, os.O_RDONLY)
    except OSError:
        return None


def _replaced(folder: Path, now: tuple[int, int] | None) -> UserError:
    """The error for ``folder`` no longer the one loaded: ``now`` its identity now (None: gone)."""
    if now is None:
        return UserError(f"{folder}: removed while its engines were being loaded (`specrt build --force` renaming "
                         "another folder into its place, or by hand), so what was read may be partial; nothing was "
                         "run: run the command again")
    return UserError(f"{folder}: replaced while its engines were being loaded (rebuilt: `specrt build --force` put "
                     "another folder in its place), so what was read may mix the two builds' files; nothing was run: "
                     "run the command again")


class PortableView(Runner):
    """The portable past/new contract (contracts.py) over an in-place KV runner, for tools
    that feed or compare engines tensor by tensor (``specrt compare``, tests): the past
    views are copied into scratch buffers of the engine's layout, the engine runs, and the
    S rows it wrote come back as ``new_key.{i}``/``new_value.{i}``. O(past) copies per call:
    for comparison, never for decoding (the runtime feeds the in-place buffers itself).
    With a screened head (specrt/head.py) the view asks for the engine's fp32 logits
    (``head_exact``), as the export's graph gives them; ``screened = True`` asks for the
    greedy path's instead (int8 logits, ``head_hidden`` and ``head_norms`` kept)."""

    backend = "portable-view"

    def __init__(self, inner: Runner, inputs, outputs, head=None):
        super().__init__(inner.role, inputs, outputs)
        self.inner, self.head = inner, head
        self.screened = False
        shapes = {t.name: t.shape for t in inner.inputs}
        layers = sum(1 for n in shapes if n.startswith(f"{C.CACHE_KEY}."))
        # per layer and kind: (past input, new output, in-place buffer input, its shape)
        self._kv = [(past, new, buf, shapes[buf]) for i in range(layers)
                    for past, new, buf in ((C.past_key(i), C.new_key(i), C.cache_key(i)),
                                           (C.past_value(i), C.new_value(i), C.cache_value(i)))]
        self._bufs: dict[str, np.ndarray] = {}

    def activate_impl(self) -> None:
        if not self.inner.is_active:
            raise UserError(f"engine '{self.name}': activate the engine set before using its portable view")

    def deactivate_impl(self) -> None:
        self._bufs = {}

    def infer_impl(self, feeds):
        past = feeds[C.past_key(0)].shape[1]
        s = feeds[C.INPUT_IDS].shape[1]
        inner_feeds = {n: a for n, a in feeds.items() if not n.startswith(C.PAST_KV_PREFIXES)}
        if self.head is not None:
            inner_feeds[C.HEAD_EXACT] = np.array(not self.screened)
        for src, _, name, shape in self._kv:
            buf = self._bufs.get(name)
            if buf is None:
                buf = self._bufs[name] = np.zeros(shape, feeds[src].dtype)
            buf[0, :, :past] = feeds[src][0].transpose(1, 0, 2)
            inner_feeds[name] = buf
        out = self.inner.infer(inner_feeds)
        res = {n: a for n, a in out.items() if not n.startswith("cache_")}
        if self.head is not None and not self.screened:
            res.pop(C.HEAD_HIDDEN, None)
            res.pop(C.HEAD_NORMS, None)
        for _, new, name, _ in self._kv:
            res[new] = np.ascontiguousarray(self._bufs[name][0, :, past:past + s].transpose(1, 0, 2)[None])
        return res


class EngineSet:
    """Every role's runner plus what the runtime reads beside them.

    Attributes: ``folder``, ``manifest`` (engines.json), ``export`` (the embedded
    export.json), ``export_dir`` (tokenizer, vocab map), ``backend``, ``precision``,
    ``depths``, ``draft_depth``, ``max_context``, ``roles``, ``runners`` (role -> Runner),
    ``costs`` (cost table with int keys, costs.py).
    """

    def __init__(self, folder: Path, manifest: dict[str, Any], export: dict[str, Any],
                 ort_overrides: dict[str, Any] | None = None, costs: bool = True, identity: tuple | None = None):
        self.folder = Path(folder)
        # the folder itself: `build --force` renames a new one into its place (check_still_here,
        # check_unchanged); ``identity``: load_engines' own, taken before it read the manifest
        self.identity = identity if identity is not None else _identity(self.folder)
        self.manifest = manifest
        self.export = export
        self.export_dir = self.folder / manifest["export"]["folder"]
        self.backend: str = manifest["backend"]
        self.precision: str = manifest["precision"]
        self.depths: tuple[int, ...] = tuple(manifest["depths"])
        self.draft_depth: int = int(manifest["draft_depth"])
        self.max_context: int = int(manifest["max_context"])
        where = self.folder / "engines.json"
        check_against_export(where, manifest, export)
        try:
            self.roles = {}
            for name, d in manifest["roles"].items():
                self.roles[name] = Role.from_json(name, d)
                if not isinstance(d.get("engine"), dict):
                    raise TypeError(f"role '{name}' has no 'engine' object")
        except (KeyError, TypeError, ValueError, AttributeError, InternalError) as e:
            raise UserError(f"{where}: field 'roles' is malformed ({type(e).__name__}: {e}); rebuild with "
                            "`specrt build`") from None
        try:
            self.costs = parse_costs(manifest.get("costs")) if costs else {}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise UserError(f"{where}: field 'costs' is malformed ({type(e).__name__}: {e}); measure it again "
                            f"with `specrt profile {self.folder}`") from None
        if ort_overrides is not None and not isinstance(ort_overrides, dict):
            raise UserError(f"ort_overrides={ort_overrides!r:.80}: expected a dict of ONNX Runtime settings (the "
                            f"fields of engines.json's 'onnxruntime')")
        self.runners: dict[str, Runner] = self._make_runners(ort_overrides or {})
        self._views: dict[str, Runner] = {}
        self.is_active = False
        # a screened target head (specrt/head.py): its exact weights beside the engines
        self.head = None
        if (manifest.get("graphs", {}).get("target") or {}).get("head") == "screened":
            from specrt.head import HeadScreen

            self.head = HeadScreen.load(self.folder)
            # the graph is read at every activate, the head's bounds and rows were read now:
            # a rebuilt folder would pair another graph's int8 logits with these bounds
            self._head_files = self._target_files()
            self._head_ids = _file_ids(self.folder, self._head_files)

    def _graph_io(self, graph: str) -> dict[str, Any]:
        """The engines' own I/O of ``graph`` when the build re-lowered it (in-place KV),
        else the export's."""
        own = self.manifest.get("graphs", {}).get(graph) or {}
        return own["io"] if "io" in own else self.export["graphs"][graph]["io"]

    @property
    def draft_weights(self) -> str:
        """"int8" when the build quantized the draft's weights (quantize.py), else "fp"."""
        q = (self.manifest.get("graphs", {}).get("draft") or {}).get("quantized")
        return q["weights"] if q else "fp"

    def _io(self, graph: str):
        io = self._graph_io(graph)
        return specs_from_json(io["inputs"]), specs_from_json(io["outputs"])

    def verifies_trees(self) -> bool:
        """Whether the target engine verifies token trees (contracts.py "Token trees"):
        in-place engines built since the graph's mask follows the positions."""
        return bool(self.manifest.get("graphs", {}).get("target", {}).get("tree"))

    def kv_layout(self, graph: str) -> str:
        """"inplace" when ``graph``'s engine updates whole KV buffers in place (contracts.py),
        else "append"."""
        return "inplace" if self._graph_io(graph).get("aliases") else "append"

    def _make_runners(self, ort_overrides: dict[str, Any]) -> dict[str, Runner]:
        runners: dict[str, Runner] = {}
        if self.backend == "onnxruntime":
            from dataclasses import fields

            from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings

            def settings_of(d: dict[str, Any]):
                try:
                    return OrtSettings.from_json(d).resolved(), None
                except (TypeError, ValueError, UserError) as e:
                    return None, e if isinstance(e, UserError) else f"{type(e).__name__}: {e}"

            merged = {**self.manifest["onnxruntime"], **ort_overrides}
            if "sessions" in ort_overrides and "prepack" not in ort_overrides:
                merged["prepack"] = None  # re-derive from the new session mode
            settings, why = settings_of(merged)
            if why is not None and ort_overrides and settings_of(self.manifest["onnxruntime"])[1] is None:
                # the caller's settings, refused as theirs: the engines' own are sound
                known = ", ".join(f.name for f in fields(OrtSettings))  # (named where a name was unknown)
                raise UserError(f"ort_overrides={ort_overrides!r:.80}: {why}"
                                + (f"; expected some of {known}" if str(why).startswith("TypeError") else ""))
            if why is not None:
                raise UserError(f"{self.folder / 'engines.json'}: field 'onnxruntime' is malformed ({why}); rebuild "
                                "with `specrt build`")
            built = ((self.manifest.get("environment") or {}).get("device") or {}).get("physical_cores")
            default = self.manifest.get("onnxruntime_threads_default")  # (engines built before it: by the count)
            if "intra_op_num_threads" not in ort_overrides and (
                    default if isinstance(default, bool) else settings.intra_op_num_threads == built):
                # the build's default (its physical cores): never more threads than this
                # process has cores (a container or taskset with fewer: 8 spinning threads on
                # 2 cores made a decode step 3-4x slower on SmolLM2)
                from dataclasses import replace

                from specrt.engines.onnxruntime import physical_cores

                settings = replace(settings, intra_op_num_threads=min(settings.intra_op_num_threads, physical_cores()))
            self.ort_settings = settings
            graphs: dict[str, OrtGraph] = {}
            count = Counter(r.graph for r in self.roles.values())  # roles per graph
            for name, role in self.roles.items():
                if role.graph not in graphs:
                    path = self.folder / self.manifest["roles"][name]["engine"]["onnx"]
                    graphs[role.graph] = OrtGraph(path, settings, roles=count[role.graph])
                runners[name] = OrtRunner(role, *self._io(role.graph), graphs[role.graph],
                                          self._graph_io(role.graph).get("aliases"))
        else:
            from specrt.engines.tensorrt import TrtEngines, TrtRunner

            plans = TrtEngines(self.folder)
            for name, role in self.roles.items():
                e = self.manifest["roles"][name]["engine"]
                runners[name] = TrtRunner(role, *self._io(role.graph), plans, e["file"], e["profile"])
        return runners

    # ---- roles (runtime/generate.py's Engines protocol) ----------------------------

    def target(self, new_tokens: int) -> Runner:
        """The target runner for S = ``new_tokens``: decode (S = 1), verify.{S-1} when that
        depth was built, else prefill (dynamic S)."""
        s = int(new_tokens)
        role = DECODE if s == 1 else verify_role(s - 1)
        return self.runners.get(role) or self.runners[PREFILL]

    def draft(self) -> Runner | None:
        return self.runners.get(DRAFT)

    def verify(self, depth: int) -> Runner:
        r = self.runners.get(verify_role(int(depth)))
        if r is None:
            raise UserError(f"{self.folder}: no verify engine for depth {depth} (built depths: "
                            f"{', '.join(map(str, self.depths))})")
        return r

    def portable(self, role: str, activate: bool = True) -> Runner:
        """``role``'s runner under the portable past/new KV contract: itself, or a
        PortableView when its graph is in-place (activated unless ``activate`` is false;
        the engine set must be active then)."""
        r = self.runner(role)
        if not r.aliases:
            return r
        view = self._views.get(role)
        if view is None:
            io = self.export["graphs"][r.role.graph]["io"]
            view = PortableView(r, specs_from_json(io["inputs"]), specs_from_json(io["outputs"]),
                                head=self.head if r.role.graph == "target" else None)
            self._views[role] = view
        if activate and not view.is_active:
            view.activate()
        return view

    def portable_target(self, new_tokens: int) -> Runner:
        """target(new_tokens) under the portable contract (see portable)."""
        return self.portable(self.target(new_tokens).name)

    def runner(self, role: str) -> Runner:
        if role not in self.runners:
            raise UserError(f"{self.folder}: no engine for role '{role}' (built: {', '.join(self.runners)})")
        return self.runners[role]

    # ---- lifecycle -----------------------------------------------------------------

    def _target_files(self) -> list[str]:
        """The files a screened head must stay consistent with: its own two and the target graph's."""
        from specrt.head import BOUNDS_FILE, WEIGHT_FILE

        onnx = {r["engine"]["onnx"] for r in self.manifest["roles"].values()
                if r.get("graph") == "target" and "onnx" in r.get("engine", {})}
        return sorted({WEIGHT_FILE, BOUNDS_FILE, *onnx, *(f + ".data" for f in onnx)})

    def check_still_here(self, writes: str) -> None:
        """Refuses to write ``writes`` (what a command measured on these engines: a calibration,
        an acceptance receipt) into ``folder`` once it is no longer the folder loaded: rebuilt
        meanwhile (`build --force` renames a new one into its place), the file would describe
        engines it never ran (session 55's walk: a calibration and a receipt of the old engines
        credited to the new ones)."""
        if (state := self.folder_state()) == "removed":
            raise UserError(f"{self.folder}: removed while this ran; {writes} not written")
        if state == "replaced":
            raise UserError(f"{self.folder}: replaced while this ran (rebuilt: another folder is in its place now); "
                            f"{writes} not written, as it measured the engines loaded before: run the command again")

    def folder_state(self) -> str:
        """"loaded" while ``folder`` is the folder these engines were loaded from, "removed" where
        it is gone, "replaced" where another folder is in its place (rebuilt). Gone is said first:
        a folder that could be stat'd neither at load (its stat in a rename's window) nor now
        was "loaded", its identity None as the load's (h74d)."""
        now = _identity(self.folder)
        return "removed" if now is None else "loaded" if now == self.identity else "replaced"

    def check_unchanged(self) -> None:
        """UserError where ``folder`` is no longer the folder these engines were loaded from:
        `build --force` renamed a new one into its place while they were read (a `specrt run`
        then ran the earlier engines.json with the new build's draft graph, without a word);
        what was read may mix the two builds' files."""
        if (now := _identity(self.folder)) is None or now != self.identity:  # (gone: as folder_state)
            raise _replaced(self.folder, now)

    def activate(self) -> None:
        if self.head is not None and _file_ids(self.folder, self._head_files) != self._head_ids:
            raise UserError(f"{self.folder}: its target graph or screened head files changed since these engines "
                            "were loaded (rebuilt?): load them again")
        done = []
        try:
            try:
                for r in self.runners.values():
                    r.activate()
                    done.append(r)
            except UserError:  # (a graph of the new build against this manifest: said as the rebuild it is)
                self.check_unchanged()
                raise
            self.check_unchanged()  # (the graphs are read now: those of the folder the manifest came from)
        except BaseException:
            for r in reversed(done):
                r.deactivate()
            raise
        self.is_active = True

    def deactivate(self) -> None:
        for v in self._views.values():
            v.deactivate()
        for r in reversed(list(self.runners.values())):
            r.deactivate()
        if self.head is not None:
            self.head.close()  # its fp32 rows' file (reopened by the next screen)
        self.is_active = False

    def __enter__(self) -> "EngineSet":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # ---- costs ---------------------------------------------------------------------

    def cost(self, role: str, past: int) -> float:
        """Seconds per call of ``role`` ("decode", "verify.{d}", "draft", "draft.{k}": a
        block of k drafts, or "chain.{L}": a lookup chain of L on the prefill engine) at
        ``past`` committed tokens, interpolated through the profiled pasts."""
        pts = {}
        for p, row in self.costs.get("by_past", {}).items():
            if role.startswith("verify."):
                v = row["verify"].get(int(role.split(".", 1)[1]))
            elif role.startswith("draft."):
                v = row.get("draft_by_depth", {}).get(int(role.split(".", 1)[1]))
            elif role.startswith("chain."):
                v = row.get("chain", {}).get(int(role.split(".", 1)[1]))
            else:
                v = row.get(role)
            if v is not None:
                pts[p] = v
        if not pts:
            raise UserError(f"{self.folder / 'engines.json'}: the cost table ('costs') has no entry for '{role}'; "
                            f"measure it again with `specrt profile {self.folder}`")
        return interpolate(pts, past)

    def target_costs(self, past: int) -> dict[int, float]:
        """Seconds per target call at ``past``: {0: decode, d: verify.d for each built depth}."""
        return {0: self.cost("decode", past), **{d: self.cost(f"verify.{d}", past) for d in self.depths}}

    def chain_costs(self, past: int) -> dict[int, float]:
        """Seconds per lookup chain of L tokens verified on the prefill engine (L past the
        deepest depth, costs.chain_lengths), per profiled L, at ``past``; {} for tables
        profiled before chains were (2026-12-02: `specrt profile` adds them)."""
        Ls = sorted({L for row in self.costs.get("by_past", {}).values() for L in row.get("chain", {})})
        return {L: self.cost(f"chain.{L}", past) for L in Ls}

    def draft_costs(self, past: int) -> dict[int, float]:
        """Seconds to draft a block of k, per profiled k (``draft_by_depth``), at ``past``;
        builds that predate it give {draft_depth: cost("draft")}."""
        ks = sorted({k for row in self.costs.get("by_past", {}).values() for k in row.get("draft_by_depth", {})})
        if not ks:
            return {self.draft_depth: self.cost("draft", past)}
        return {k: self.cost(f"draft.{k}", past) for k in ks}

    @property
    def weight_bytes(self) -> int:
        wb = self.manifest.get("weight_bytes", {})
        if not (isinstance(wb, dict) and all(isinstance(v, int) and v >= 0 for v in wb.values())):
            raise UserError(f"{self.folder / 'engines.json'}: field 'weight_bytes' is {wb!r:.80}; expected graph -> "
                            "bytes: rebuild with `specrt build`")
        return int(sum(wb.values()))

    def __repr__(self) -> str:
        return f"<EngineSet {self.backend} {self.precision} depths {list(self.depths)} at {self.folder}>"


def _file_ids(folder: Path, names) -> list:
    """Each file's identity (device, inode, size, mtime), None where missing."""
    import os

    out = []
    for n in names:
        try:
            st = os.stat(Path(folder) / n)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            out.append(None)
    return out


def load_engines(engines_dir: Path, verify: bool = True, ort_overrides: dict[str, Any] | None = None,
                 costs: bool = True) -> EngineSet:
    """Open an engines folder after checking it (UserError naming what differs).

    ``verify=False`` skips re-hashing the files (environment and export digest are still
    checked). ``ort_overrides``: ONNX Runtime settings to change at load (benchmarks);
    the cost table was profiled with the recorded ones. ``costs=False``: the cost table is
    not read (`specrt profile`, which measures it again, mends a malformed one).
    """
    check_path_args("a folder", engines_dir=engines_dir)  # Path('') is the working folder
    folder = Path(engines_dir)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such engines folder (run `specrt build` first)")
    pin = _pin(folder)
    identity = _identity(folder)  # (before any file is read: EngineSet.check_unchanged)
    try:
        manifest = read_engines_manifest(folder)
        export = verify_engines(folder, manifest, verify=verify)
        engines = EngineSet(folder, manifest, export, ort_overrides, costs, identity)
    except BaseException as e:  # (a file of the new build against the earlier manifest: "modified after ...")
        now = _identity(folder)
        replaced = isinstance(e, UserError) and identity is not None and now != identity
        if pin is not None:
            os.close(pin)
        if replaced:
            raise _replaced(folder, now) from None
        raise
    if pin is not None:
        weakref.finalize(engines, os.close, pin)
    return engines
