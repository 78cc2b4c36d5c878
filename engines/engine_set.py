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

from pathlib import Path
from typing import Any

from specrt.engines.base import Runner, specs_from_json
from specrt.engines.costs import interpolate, parse_costs
from specrt.engines.manifest import read_engines_manifest, verify_engines
from specrt.engines.plan import DECODE, DRAFT, PREFILL, Role, verify_role
from specrt.errors import UserError


class EngineSet:
    """Every role's runner plus what the runtime reads beside them.

    Attributes: ``folder``, ``manifest`` (engines.json), ``export`` (the embedded
    export.json), ``export_dir`` (tokenizer, vocab map), ``backend``, ``precision``,
    ``depths``, ``draft_depth``, ``max_context``, ``roles``, ``runners`` (role -> Runner),
    ``costs`` (cost table with int keys, costs.py).
    """

    def __init__(self, folder: Path, manifest: dict[str, Any], export: dict[str, Any],
                 ort_overrides: dict[str, Any] | None = None):
        self.folder = Path(folder)
        self.manifest = manifest
        self.export = export
        self.export_dir = self.folder / manifest["export"]["folder"]
        self.backend: str = manifest["backend"]
        self.precision: str = manifest["precision"]
        self.depths: tuple[int, ...] = tuple(manifest["depths"])
        self.draft_depth: int = int(manifest["draft_depth"])
        self.max_context: int = int(manifest["max_context"])
        self.roles = {name: Role.from_json(name, d) for name, d in manifest["roles"].items()}
        self.costs = parse_costs(manifest.get("costs"))
        self.runners: dict[str, Runner] = self._make_runners(ort_overrides or {})
        self.is_active = False

    def _io(self, graph: str):
        io = self.export["graphs"][graph]["io"]
        return specs_from_json(io["inputs"]), specs_from_json(io["outputs"])

    def _make_runners(self, ort_overrides: dict[str, Any]) -> dict[str, Runner]:
        runners: dict[str, Runner] = {}
        if self.backend == "onnxruntime":
            from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings

            merged = {**self.manifest["onnxruntime"], **ort_overrides}
            if "sessions" in ort_overrides and "prepack" not in ort_overrides:
                merged["prepack"] = None  # re-derive from the new session mode
            settings = OrtSettings.from_json(merged).resolved()
            self.ort_settings = settings
            graphs: dict[str, OrtGraph] = {}
            for name, role in self.roles.items():
                if role.graph not in graphs:
                    path = self.folder / self.manifest["roles"][name]["engine"]["onnx"]
                    graphs[role.graph] = OrtGraph(path, settings)
                runners[name] = OrtRunner(role, *self._io(role.graph), graphs[role.graph])
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

    def runner(self, role: str) -> Runner:
        if role not in self.runners:
            raise UserError(f"{self.folder}: no engine for role '{role}' (built: {', '.join(self.runners)})")
        return self.runners[role]

    # ---- lifecycle -----------------------------------------------------------------

    def activate(self) -> None:
        done = []
        try:
            for r in self.runners.values():
                r.activate()
                done.append(r)
        except BaseException:
            for r in reversed(done):
                r.deactivate()
            raise
        self.is_active = True

    def deactivate(self) -> None:
        for r in reversed(list(self.runners.values())):
            r.deactivate()
        self.is_active = False

    def __enter__(self) -> "EngineSet":
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    # ---- costs ---------------------------------------------------------------------

    def cost(self, role: str, past: int) -> float:
        """Seconds per call of ``role`` ("decode", "verify.{d}", "draft") at ``past`` committed
        tokens, interpolated through the profiled pasts."""
        pts = {}
        for p, row in self.costs.get("by_past", {}).items():
            if role.startswith("verify."):
                v = row["verify"].get(int(role.split(".", 1)[1]))
            else:
                v = row.get(role)
            if v is not None:
                pts[p] = v
        if not pts:
            raise UserError(f"{self.folder}: the cost table has no entry for '{role}'")
        return interpolate(pts, past)

    @property
    def weight_bytes(self) -> int:
        return int(sum(self.manifest.get("weight_bytes", {}).values()))

    def __repr__(self) -> str:
        return f"<EngineSet {self.backend} {self.precision} depths {list(self.depths)} at {self.folder}>"


def load_engines(engines_dir: Path, verify: bool = True, ort_overrides: dict[str, Any] | None = None) -> EngineSet:
    """Open an engines folder after checking it (UserError naming what differs).

    ``verify=False`` skips re-hashing the files (environment and export digest are still
    checked). ``ort_overrides``: ONNX Runtime settings to change at load (benchmarks);
    the cost table was profiled with the recorded ones.
    """
    folder = Path(engines_dir)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such engines folder (run `specrt build` first)")
    manifest = read_engines_manifest(folder)
    export = verify_engines(folder, manifest, verify=verify)
    return EngineSet(folder, manifest, export, ort_overrides)
