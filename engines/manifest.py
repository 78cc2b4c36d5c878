"""``engines.json``: the contract between ``specrt build`` and the runtime.

An engines folder is self-contained:

    engines.json        this manifest (written last, inside an atomic folder)
    export/             the export folder it was built from (hard links or copies),
                        with its own export.json and hashes
    target.plan ...     TensorRT plans and timing.cache (TensorRT backend)
    target.onnx(.data)  ONNX Runtime: the graphs with external weights (when the export
                        embeds them), the files its sessions load

Manifest keys:

    format              "specrt-engines/1"
    backend             "onnxruntime" | "tensorrt"
    precision           "fp32" | "fp16" | "bf16"
    depths              verify depths [1, 2, 4, 8]; draft_depth = max(depths)
    max_context         context limit C the engines accept (past + new <= C)
    roles               role -> {graph, dims {name: [min, opt, max]}, engine {...}}
    files               [{file, sha256, bytes}] of every engine file (plans, timing cache)
    export              {folder, digest (manifest_digest of export.json), dtype, files {name: sha256}}
    environment         {backend, backend_version, device, tool_versions}
    onnxruntime|tensorrt  backend settings (session options | build plan)
    weight_bytes        {graph: bytes of its weights as the backend holds them}
    costs               the cost table (costs.py)

Loading refuses, with a UserError naming what differs: an engine file or export file
whose bytes changed, an export.json whose digest differs from the recorded one, a
backend version or device other than the build's (TensorRT plans are tied to both; ONNX
Runtime costs and kernel choices are tied to the CPU's ISA), a field missing, of another
type, or at odds with the rest or with the export (roles, the build's own I/O; the graph
files' own inputs and outputs are checked when the engines activate).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from specrt.errors import UserError
from specrt.limits import digits, whole
from specrt.manifest import load_export, read_manifest, require_fields, tool_versions, verify_files

ENGINES_MANIFEST = "engines.json"
ENGINES_FORMAT = "specrt-engines/1"
EXPORT_SUBDIR = "export"
BACKENDS = ("onnxruntime", "tensorrt")

# CPU features that change which kernels MLAS (ONNX Runtime) picks, hence the costs.
_ISA = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "asimddp", "sve", "sve2", "bf16",
        "i8mm")


def cpu_info() -> dict[str, Any]:
    name, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "Model name") and name is None:
                name = v.strip()
            elif k in ("flags", "Features") and not flags:
                flags = set(v.split())
    except OSError:  # pragma: no cover - non-Linux
        pass
    from specrt.engines.onnxruntime import physical_cores

    return {"kind": "cpu", "name": name or platform.processor() or platform.machine(),
            "isa": [f for f in _ISA if f in flags], "physical_cores": physical_cores()}


def gpu_info() -> dict[str, Any]:
    """The first visible NVIDIA GPU's name (nvidia-smi), without importing CUDA bindings."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise UserError("no NVIDIA GPU found (nvidia-smi is not on PATH)")
    r = subprocess.run([exe, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                       timeout=30)
    names = [n.strip() for n in r.stdout.splitlines() if n.strip()]
    if r.returncode != 0 or not names:
        raise UserError(f"nvidia-smi found no GPU ({r.stderr.strip() or r.stdout.strip()})")
    return {"kind": "gpu", "name": names[0]}


def backend_version(backend: str) -> str:
    if backend == "onnxruntime":
        import onnxruntime

        return onnxruntime.__version__
    if backend == "tensorrt":
        try:
            import tensorrt
        except ImportError:
            raise UserError("the tensorrt backend needs TensorRT (pip install 'specrt[tensorrt]' on a machine "
                            "with an NVIDIA GPU)") from None
        return tensorrt.__version__
    raise UserError(f"--backend '{backend}' is not one of {', '.join(BACKENDS)}")


def environment(backend: str, providers: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """What an engines folder is tied to: backend version and device (plus informational versions)."""
    gpu = backend == "tensorrt" or "CUDAExecutionProvider" in providers
    versions = tool_versions()
    if backend == "tensorrt":
        import polygraphy

        versions["polygraphy"] = polygraphy.__version__
    return {"backend": backend, "backend_version": backend_version(backend),
            "device": gpu_info() if gpu else cpu_info(), "tool_versions": versions}


def _device_id(d: dict[str, Any]) -> str:
    isa = f" [{' '.join(d['isa'])}]" if d.get("isa") else ""
    return f"{d.get('kind')} '{d.get('name')}'{isa}"


def check_environment(folder: Path, recorded: dict[str, Any], current: dict[str, Any]) -> None:
    diffs = []
    recorded = recorded if isinstance(recorded, dict) else {}  # (a hand edit: said as an environment that differs)
    if recorded.get("backend_version") != current["backend_version"]:
        diffs.append(f"{current['backend']} version: built with {recorded.get('backend_version')}, "
                     f"this machine has {current['backend_version']}")
    rd, cd = recorded.get("device") if isinstance(recorded.get("device"), dict) else {}, current["device"]
    if any(rd.get(k) != cd.get(k) for k in ("kind", "name", "isa")):
        diffs.append(f"device: built on {_device_id(rd)}, this machine is {_device_id(cd)}")
    if diffs:
        raise UserError(f"{folder}: engines were built for another environment ({'; '.join(diffs)}); "
                        "rebuild them here with `specrt build`")


def read_engines_manifest(folder: Path) -> dict[str, Any]:
    m = read_manifest(Path(folder), ENGINES_MANIFEST, ENGINES_FORMAT, "engines")
    if m.get("backend") not in BACKENDS:
        raise UserError(f"{Path(folder) / ENGINES_MANIFEST}: unknown backend '{m.get('backend')}'")
    where = Path(folder) / ENGINES_MANIFEST
    require_fields(m, where, {
        "precision": str, "depths": [int], "draft_depth": int, "max_context": int, "roles": dict, "files": [dict],
        "export.folder": str, "export.digest": str})
    exp = Path(m["export"]["folder"])  # (build writes "export": the export it was built from, inside)
    if exp.is_absolute() or ".." in exp.parts or exp.parts in ((), (".",)) or \
            not (Path(folder) / exp).resolve().is_relative_to(Path(folder).resolve()):  # (a link out of it too)
        link = Path(folder) / exp
        if not exp.is_absolute() and ".." not in exp.parts and link.is_symlink():  # (the field is fine: the folder)
            raise UserError(f"{link}: a link to {link.resolve()}, outside the engines folder; the engines hold their "
                            f"export inside: put the export's files there in place of the link, or re-run `specrt "
                            "build`")
        raise UserError(f"{where}: export.folder {m['export']['folder']!r:.80}; expected a folder inside the engines "
                        "folder: re-run `specrt build`")
    if m["max_context"] < 1 or min(m["depths"], default=1) < 1:  # (a hand edit: the KV cache's error named no file)
        raise UserError(f"{where}: max_context {m['max_context']} and depths {m['depths']}; expected positive "
                        "token counts: re-run `specrt build`")
    if m["precision"] not in ("fp32", "fp16", "bf16") or m["depths"] != sorted(set(m["depths"])):
        raise UserError(f"{where}: precision {m['precision']!r:.40} and depths {m['depths']}; expected fp32, fp16 "
                        "or bf16 and increasing depths: re-run `specrt build`")
    if m["backend"] == "onnxruntime":
        require_fields(m, where, {"onnxruntime": dict})
    for i, r in enumerate(m["files"]):
        if not (isinstance(r.get("file"), str) and isinstance(r.get("sha256"), str)
                and whole(r.get("bytes"), 0)):
            raise UserError(f"{where}: files[{i}] is {r!r:.80}; expected {{'file', 'sha256', 'bytes'}}: re-run "
                            "`specrt build`")
    # what the runtime takes from the roles must agree with the rest: a verify role per depth,
    # the draft block the deepest depth, and each role's engine file among the recorded ones
    verify = sorted(int(k[7:]) for k in m["roles"] if k.startswith("verify.") and digits(k[7:]))
    if verify != sorted(set(m["depths"])) or not m["depths"]:
        raise UserError(f"{where}: depths {m['depths']} but verify roles for {verify}; re-run `specrt build`")
    if "draft" in m["roles"] and m["draft_depth"] != max(m["depths"]):
        raise UserError(f"{where}: draft_depth {m['draft_depth']}, the deepest depth is {max(m['depths'])}; "
                        "re-run `specrt build`")
    for name, role in m["roles"].items():
        check_role(where, name, role)
    if "prefill" not in m["roles"]:  # (the engine every other target role falls back to)
        raise UserError(f"{where}: roles has no 'prefill'; re-run `specrt build`")
    graphs = m.get("graphs", {})
    if not (isinstance(graphs, dict) and all(isinstance(v, dict) for v in graphs.values())):
        raise UserError(f"{where}: field 'graphs' is {graphs!r:.80}; expected an object of graph name -> object: "
                        "re-run `specrt build`")
    recorded = {r["file"] for r in m["files"]}
    key = "onnx" if m["backend"] == "onnxruntime" else "file"
    by_graph: dict[str, str] = {}
    for name, role in m["roles"].items():
        engine = role.get("engine") if isinstance(role, dict) else None
        f = engine.get(key) if isinstance(engine, dict) else None
        if not isinstance(f, str):
            raise UserError(f"{where}: roles.{name}.engine.{key} is {f!r:.80}; expected an engine file name")
        parts = Path(f).parts
        inside = not Path(f).is_absolute() and ".." not in parts
        if not inside or (f not in recorded and parts[:1] != (m["export"]["folder"],)):
            raise UserError(f"{where}: roles.{name} runs '{f}', which is not among the recorded files; re-run "
                            "`specrt build`")
        if f in recorded and (Path(folder) / f"{f}.data").exists() and f"{f}.data" not in recorded:
            # (its weights then went unhashed: another build's, swapped in, decoded wrong tokens)
            raise UserError(f"{where}: roles.{name} runs '{f}', whose weights '{f}.data' are not among the recorded "
                            "files; re-run `specrt build`")
        graph = role.get("graph")
        if key == "onnx" and by_graph.setdefault(graph, f) != f:
            raise UserError(f"{where}: roles of graph '{graph}' run both '{by_graph[graph]}' and '{f}'")
    if graphs.get("target", {}).get("head") == "screened":  # (its files decide the greedy argmax: hashed too)
        from specrt.head import BOUNDS_FILE, WEIGHT_FILE

        missing = [f for f in (WEIGHT_FILE, BOUNDS_FILE) if f not in recorded]
        if missing:
            raise UserError(f"{where}: graphs.target.head is 'screened' but {', '.join(missing)} "
                            f"{'is' if len(missing) == 1 else 'are'} not among the recorded files; re-run `specrt build`")
    return m


def check_role(where: Path, name: str, role: Any) -> None:
    """roles.{name}: its graph the one its name gives, its dims [min, opt, max] ranges, its limit a token count."""
    from specrt.engines.plan import DRAFT, verify_role

    graph = "draft" if name == DRAFT else "target"
    if not (name in ("prefill", "decode", DRAFT) or (name.startswith("verify.") and digits(name[7:])
                                                      and verify_role(int(name[7:])) == name)):
        raise UserError(f"{where}: roles.{name}: not a role specrt builds (prefill, decode, verify.D, draft); re-run "
                        "`specrt build`")
    if not isinstance(role, dict) or role.get("graph") != graph:
        got = role.get("graph") if isinstance(role, dict) else role
        raise UserError(f"{where}: roles.{name}.graph is {got!r:.80}; expected '{graph}': re-run `specrt build`")
    dims, limit = role.get("dims"), role.get("limit")
    if not (isinstance(dims, dict) and all(
            isinstance(r, list) and len(r) == 3 and all(whole(x) for x in r)
            and 0 <= r[0] <= r[1] <= r[2] for r in dims.values())):
        raise UserError(f"{where}: roles.{name}.dims is {dims!r:.80}; expected dimension name -> [min, opt, max] "
                        "with 0 <= min <= opt <= max: re-run `specrt build`")
    if not whole(limit, max((r[2] for r in dims.values()), default=1)):
        raise UserError(f"{where}: roles.{name}.limit is {limit!r:.80}; expected a token count no less than its dims' "
                        "largest: re-run `specrt build`")


def check_against_export(where: Path, m: dict[str, Any], export: dict[str, Any]) -> None:
    """What engines.json says of its export agrees with the export: the context limit within
    the target's positions and each role's limit the build's for it, the precision the
    export's dtype (ONNX Runtime), a draft role when the export has a draft graph, each
    role's dims naming every symbolic dimension of its graph's inputs, the build's own target
    I/O (in-place KV) the contract's for the export's numbers."""
    from specrt import contracts as C
    from specrt.engines.plan import PRECISIONS

    graphs = m.get("graphs", {})
    # the context limit: the target's positions at most, every role's limit what the build gave it
    # (a larger one ran the in-place graph past its KV rows and RoPE table)
    ctx, t = m["max_context"], export["target"]
    if ctx > t["max_position_embeddings"]:
        raise UserError(f"{where}: max_context {ctx} is past the target's max_position_embeddings "
                        f"{t['max_position_embeddings']}; re-run `specrt build`")
    for name, role in m["roles"].items():
        want = ctx + max(m["depths"]) if role["graph"] == "draft" else ctx
        if role["limit"] != want:
            raise UserError(f"{where}: roles.{name}.limit is {role['limit']}, expected {want} for max_context {ctx}; "
                            "re-run `specrt build`")
    if m["export"].get("dtype", export["dtype"]) != export["dtype"] or (
            m["backend"] == "onnxruntime" and PRECISIONS.get(m["precision"]) != export["dtype"]):
        raise UserError(f"{where}: precision {m['precision']} and export.dtype {m['export'].get('dtype')}, the export "
                        f"is {export['dtype']}; re-run `specrt build`")
    run = sorted({r.get("graph") for r in m["roles"].values()})
    if run != sorted(export["graphs"]):
        raise UserError(f"{where}: field 'roles' runs the graphs {run}, the export has {sorted(export['graphs'])}; "
                        "re-run `specrt build`")
    own = graphs.get("target") or {}
    if "io" in own:
        head = own.get("head", "full")
        want = C.target_io(t["num_layers"], t["num_kv_heads"], t["head_dim"], t["vocab_size"], t["hidden_size"],
                           export["dtype"], kv="inplace", head=head if head in C.HEADS else "full",
                           num_aux=len(t["aux_layer_ids"])).to_json()
        if own.get("kv") != "inplace" or head not in C.HEADS or own["io"] != want:
            io = own["io"]
            key = ("graphs.target.kv" if own.get("kv") != "inplace" else "graphs.target.head" if head not in C.HEADS
                   else "graphs.target.io" if not isinstance(io, dict)
                   else next((f"graphs.target.io.{k}" for k in ("inputs", "outputs", "aliases")
                              if io.get(k) != want.get(k)), "graphs.target.io"))
            part = key[len("graphs.target.io."):] if key.startswith("graphs.target.io.") else None
            got, need = (io.get(part), want.get(part)) if part else (None, None)
            if isinstance(got, list) and isinstance(need, list) and len(got) < len(need) and \
                    got == [x for x in need if x.get("name") in {g.get("name") for g in got if isinstance(g, dict)}]:
                # (the contract's I/O as an earlier specrt built it, less what came since: logits_from
                # came on 2026-12-02; the folder is whole, a rebuild here gives the new graph)
                lacks = ", ".join(f"'{x['name']}'" for x in need if x not in got)
                exp = where.parent / m["export"]["folder"]
                raise UserError(f"{where}: field '{key}' lacks {lacks}, which this specrt's in-place target graph "
                                "takes: the engines were built by an older specrt; rebuild them with this one "
                                f"(`specrt build EXPORT -o NEW_ENGINES`: their export, {exp}, will do)")
            raise UserError(f"{where}: field '{key}' is not the in-place target graph's I/O for this export "
                            "(contracts.py); re-run `specrt build`")
    if own.get("tree", False) not in (True, False) or (own.get("tree") and "io" not in own):
        # (a token tree on a graph whose mask does not follow the positions: wrong tokens)
        raise UserError(f"{where}: field 'graphs.target.tree' is {own.get('tree')!r:.80}; expected true only for the "
                        "in-place target graph (with its io): re-run `specrt build`")
    q = (graphs.get("draft") or {}).get("quantized")
    if q is not None and not (isinstance(q, dict) and isinstance(q.get("weights"), str)):
        raise UserError(f"{where}: field 'graphs.draft.quantized' is {q!r:.80}; expected the build's record of "
                        "the int8 draft: re-run `specrt build`")
    for name, role in m["roles"].items():
        io = own["io"] if role["graph"] == "target" and "io" in own else export["graphs"][role["graph"]]["io"]
        need = {d for spec in io["inputs"] for d in spec["shape"] if isinstance(d, str)}
        if need - set(role["dims"]):
            raise UserError(f"{where}: roles.{name}.dims has no range for {sorted(need - set(role['dims']))}; re-run "
                            "`specrt build`")
    check_role_ranges(where, m, (export.get("draft") or {}).get("kind"))


def check_role_ranges(where: Path, m: dict[str, Any], draft_kind: str | None) -> None:
    """Each role's dimension ranges (min and max; opt is a tuning choice) are those the build
    plan gives its depths and max_context, and the in-place cache's rows are max_context: an
    edited range (verify.4 taking 4 new tokens, a larger context) met the graph's own error
    mid-decode, blamed on the prompt, or a crash in its RoPE table past the rows it was built with."""
    from specrt import contracts as C
    from specrt.engines.plan import make_roles, with_cache_rows

    ctx = m["max_context"]
    if ctx < max(m["depths"]) + 2:  # (make_roles' own error names --max-context, an option never given here)
        raise UserError(f"{where}: max_context {ctx} is below the deepest depth {max(m['depths'])} + 2 (a token, "
                        "the depth's drafts and its bonus token); re-run `specrt build`")
    plan = make_roles(tuple(m["depths"]), ctx, draft_kind)  # as `specrt build` plans them
    if any(C.DIM_CACHE in role["dims"] for role in m["roles"].values()):  # (in-place KV engines)
        plan = with_cache_rows(plan, ctx)
    for name, role in m["roles"].items():
        for dim, r in (plan[name].dims.items() if name in plan else ()):
            got = role["dims"].get(dim)
            if got is not None and [got[0], got[2]] != [r.min, r.max]:
                raise UserError(f"{where}: roles.{name}.dims.{dim} is {got}; expected min {r.min} and max {r.max} "
                                f"for depths {m['depths']} and max_context {ctx}: re-run `specrt build`")


def verify_engines(folder: Path, manifest: dict[str, Any], verify: bool = True) -> dict[str, Any]:
    """Check environment, engine-file hashes, and the embedded export; returns the export manifest."""
    folder = Path(folder)
    providers = (manifest.get("onnxruntime") or {}).get("providers", ())
    providers = providers if isinstance(providers, list) else ()  # (malformed: refused with the other settings)
    try:
        current = environment(manifest["backend"], providers)
    except UserError as e:  # (a GPU asked for on a machine without one: the error named neither file nor field)
        asked = ("backend tensorrt" if manifest["backend"] == "tensorrt"
                 else f"onnxruntime.providers {list(providers)}")
        raise UserError(f"{folder / ENGINES_MANIFEST}: {asked} runs on an NVIDIA GPU: {e}") from None
    check_environment(folder, manifest.get("environment", {}), current)
    if verify:
        verify_files(folder, manifest.get("files", []), "engines")
    exp_dir = folder / manifest["export"]["folder"]
    return load_export(exp_dir, verify=verify, digest=manifest["export"]["digest"])
