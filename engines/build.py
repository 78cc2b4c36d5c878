"""``specrt build``: an export folder -> depth-specialised engines + ``engines.json``.

Steps, all inside ``atomic_folder(out)`` so an interrupted build leaves nothing that
loads (engines.json is written last, and the folder is renamed into place only after):

1. verify the export (hashes) and link or copy it into ``out/export/``;
2. plan the roles (plan.py): prefill, decode, verify.{d} for each depth, draft;
3. build: TensorRT plans (tensorrt.py); for ONNX Runtime, the graphs rewritten with
   external weights (``target.onnx`` + ``target.onnx.data``: lower load peak, see
   ``_external_weights``) and the session settings (onnxruntime.py). The target is
   re-lowered with in-place KV (``ort_kv``, contracts.py "In-place KV") when this ONNX
   Runtime passes the GroupQueryAttention probe; its I/O then lives in
   ``engines.json["graphs"]["target"]`` and its roles get the fixed ``cache_tokens`` dim.
   With ``draft_weights="int8"`` the draft graph is rewritten with int8 weights in the
   form whose draft pass is faster on this machine (``int8:blocks`` / ``int8:dynamic``
   force one; quantize.py; recorded in ``engines.json["graphs"]["draft"]``);
4. open the engines from the unfinished folder and profile the cost table (costs.py);
5. write engines.json.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from specrt import contracts as C
from specrt.engines import costs as _costs
from specrt.engines.engine_set import EngineSet
from specrt.engines.manifest import (BACKENDS, ENGINES_FORMAT, ENGINES_MANIFEST, EXPORT_SUBDIR, check_environment,
                                     environment, read_engines_manifest)
from specrt.engines.plan import (PRECISIONS, least_context, make_roles, normalise_precision, parse_depths, trt_plan,
                                 with_cache_rows)
from specrt.engines.quantize import DRAFT_WEIGHTS, choose_form, quantize_draft
from specrt.errors import UserError
from specrt.head import BOUNDS_FILE as HEAD_BOUNDS_FILE, WEIGHT_FILE as HEAD_WEIGHT_FILE, n_outliers
from specrt.limits import MAX_PROFILE_REPEATS, whole
from specrt.manifest import (EXPORT_MANIFEST, all_records, atomic_folder, check_output, file_record, load_export,
                             manifest_digest, write_json)
from specrt.paths import check_path_args, check_temp_folder

# Seam for tests: the profiling step (monkeypatched to interrupt a build midway).
profile_costs = _costs.profile_costs


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard link (same file system: no copy of multi-GB weights), else copy. The copy is
    hash-checked at load either way, so a later in-place edit of the source is caught."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _embed_export(export_dir: Path, exp: dict[str, Any], dst: Path) -> dict[str, str]:
    names = sorted({r["file"] for r in all_records(exp)})
    for n in names:
        _link_or_copy(export_dir / n, dst / n)
    shutil.copyfile(export_dir / EXPORT_MANIFEST, dst / EXPORT_MANIFEST)
    return {r["file"]: r["sha256"] for r in all_records(exp)}


def _external_weights(src: Path, dst: Path) -> bool:
    """Write ``src`` to ``dst`` with its weights in ``dst.data`` unless they already are
    external; returns whether it wrote. Why: ONNX Runtime maps external weights from the
    file and prepacks them, but it parses embedded ones as part of the protobuf and holds
    both copies while it prepacks. Measured on SmolLM2-135M (538 MB of weights): peak RSS
    of session creation 934 MB embedded vs 639 MB external (steady state 639 MB both)."""
    import onnx

    model = onnx.load(str(src), load_external_data=False)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return False
    onnx.save_model(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)
    return True


def _resolve_kv(ort_kv: str, backend: str, exp: dict[str, Any], settings, log: Callable[[str], None]) -> str:
    """"inplace" or "append" for the target graph (see build_engines' ``ort_kv``, checked
    by the caller)."""
    if ort_kv == "append" or backend != "onnxruntime":
        return "append"
    why = None
    if "decoder" not in exp["target"]:
        why = "the export predates target.decoder in export.json (re-export to get it)"
    elif exp["dtype"] not in ("float32", "float16"):
        why = f"GroupQueryAttention has no {exp['dtype']} CPU kernel"
    else:
        from specrt.engines.onnxruntime import probe_inplace_gqa

        dec = exp["target"]["decoder"]
        why = probe_inplace_gqa(settings, dec["num_heads"], dec["num_kv_heads"], dec["head_dim"], exp["dtype"],
                                packed=not dec.get("qk_norm", False))
    if why is None:
        return "inplace"
    if ort_kv == "inplace":
        raise UserError(f"--ort-kv inplace: {why}")
    log(f"note: portable KV graph (no in-place KV: {why})")
    return "append"


def kv_cache_bytes(exp: dict[str, Any], ctx: int) -> dict[str, int]:
    """Bytes of the KV caches the runtime preallocates for a context of ``ctx`` tokens, per
    graph (target, draft): keys and values of every layer, in the export's dtype."""
    item = 2 if exp["dtype"] == "float16" else 4
    return {side: 2 * g["num_layers"] * ctx * g["num_kv_heads"] * g["head_dim"] * item
            for side in ("target", "draft") if (g := exp.get(side))}


def rope_table_bytes(exp: dict[str, Any], ctx: int) -> int:
    """About the bytes a build computes for the RoPE tables of ``ctx`` positions (target and
    draft graphs: cos and sin [ctx, D/2] in float32, made from float64 angles)."""
    return sum(ctx * (g["head_dim"] // 2) * 32 for side in ("target", "draft") if (g := exp.get(side)))


def check_memory_fits(exp: dict[str, Any], ctx: int, source: str, available: int | None = None,
                      log: Callable[[str], None] = lambda s: None) -> None:
    """Before anything is built, the memory of a context of ``ctx`` tokens (``source``: where
    that limit came from) against what this machine has available (``available``, MemAvailable
    or the memory cgroup's room by default, machine.mem_available; unknown: no check). What a
    build allocates and writes, the weights and the RoPE tables, must fit: a UserError saying
    what context would (a max_position_embeddings of 10**12 crashed allocating 3.64 TiB of RoPE
    table). The KV caches are allocated zeroed and take
    memory only as a conversation fills them (profiling writes a few hundred rows): past the
    memory available at the full context, a note (a model's max_position_embeddings, 131072 for
    Llama 3.1, is the default limit)."""
    from specrt.machine import mem_available

    available = mem_available() if available is None else available
    if available is None:
        return
    weights = sum(int(f.get("bytes") or 0) for g in exp["graphs"].values() for f in g["files"])
    kv, rope = kv_cache_bytes(exp, ctx), rope_table_bytes(exp, ctx)
    per_token = (sum(kv.values()) + rope) / ctx
    fits = int((0.9 * available - weights) // per_token) if per_token else 0
    gib = lambda b: f"{b / 2 ** 30:.3g} GiB"  # noqa: E731
    hint = (f"--max-context N bounds it (at most about {fits} here)" if fits >= 1
            else "its weights alone do not fit" if weights > available
            else "its weights leave no room for a context here")
    if weights + rope > available:
        raise UserError(f"a context of {ctx} tokens ({source}) needs {gib(rope)} of RoPE tables beside "
                        f"{gib(weights)} of weights, and this machine has {gib(available)} available: {hint}")
    if weights + rope + sum(kv.values()) > available:
        log(f"note: at its full context of {ctx} tokens ({source}) the KV caches take {gib(sum(kv.values()))} ("
            + " + ".join(f"{side} {gib(b)}" for side, b in kv.items())
            + f", {exp['dtype']}) beside {gib(weights)} of weights, past the {gib(available)} this machine has "
            f"available: a conversation that long would run out of memory; {hint}")


def _graph_file(exp: dict[str, Any], graph: str) -> str:
    files = [r["file"] for r in exp["graphs"][graph]["files"] if r["file"].endswith(".onnx")]
    if len(files) != 1:
        raise UserError(f"export.json: graph '{graph}' should have exactly one .onnx file, found {files}")
    return files[0]


def carry_timing_cache(old: Path, tmp: Path, name: str, current: dict[str, Any], log: Callable[[str], None]) -> bool:
    """A TensorRT rebuild (--force) over engines built in this environment (``current``:
    the same TensorRT version and GPU) starts from their timing cache, so the tactics are
    not timed again (the new folder is made empty, beside the old one); a cache from
    another TensorRT or GPU is left behind (TensorRT refuses a mismatched one)."""
    src = Path(old) / name
    if not src.is_file():
        return False
    try:
        manifest = json.loads((Path(old) / "engines.json").read_text(encoding="utf-8"))
        check_environment(Path(old), manifest["environment"], current)
    except (OSError, ValueError, KeyError, TypeError, UserError) as e:
        log(f"tensorrt: {src} not reused ({str(e).splitlines()[0][:200]})")
        return False
    shutil.copyfile(src, Path(tmp) / name)
    log(f"tensorrt: starting from the tactic timings of {src}")
    return True


DEFAULT_DEPTHS = (1, 2, 4, 8)


def default_depths(exp: dict) -> tuple[int, ...]:
    """The verify depths built when none are given: 1..K for a P-EAGLE draft trained to
    propose K <= 8 tokens (a depth past K verifies positions it never trained on: 1,2,4,8,
    the default for every export before, gave the committed K = 4 draft a depth 8 and a note
    saying so), else DEFAULT_DEPTHS."""
    d = exp.get("draft") or {}
    k = d.get("speculative_tokens")
    if d.get("kind") == "peagle" and isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= 8:
        return tuple(range(1, k + 1))
    return DEFAULT_DEPTHS


PROFILE_PASTS = (128, 512)  # the committed lengths the build profiles at (those that fit the context)
DRAFT_ACCEPTED = 2  # the accepted tokens a profiled draft pass catches up on


def _runs_bfloat16(settings) -> bool:
    """Whether ONNX Runtime with these (resolved) settings has bfloat16 kernels: CUDA's, not the CPU provider's."""
    return "CUDAExecutionProvider" in settings.providers


def build_engines(export_dir: Path, backend: str, depths, out: Path, precision: str | None = None,
                  force: bool = False, log: Callable[[str], None] = print, *, max_context: int | None = None,
                  ort_settings: dict[str, Any] | None = None, trt_layout: str = "profiles",
                  profile_pasts: tuple[int, ...] = PROFILE_PASTS, profile_repeats: int = 10,
                  draft_accepted: int = DRAFT_ACCEPTED, ort_kv: str = "auto", draft_weights: str = "fp",
                  target_head: str = "full") -> dict[str, Any]:
    """Build engines for ``depths`` from ``export_dir`` into ``out``; returns engines.json.
    ``depths`` None: default_depths of the export.

    backend: "onnxruntime" | "tensorrt". precision: fp32/fp16/bf16 (default: the export's
    dtype; ONNX Runtime runs only the export's dtype). max_context: the context limit C
    (default: the target's max_position_embeddings). ort_settings: OrtSettings fields
    (onnxruntime.py), e.g. {"sessions": "per-depth"}. trt_layout: "profiles" | "engines"
    (plan.py). profile_*: the cost table's past lengths and repeats (costs.py).
    ort_kv: "auto" (in-place when possible), "inplace" (error if not possible) or "append"
    (the export's portable target graph). draft_weights: "fp" (as exported) or "int8"
    (ONNX Runtime: weight-only int8 draft, quantize.py). target_head: "full" (exact fp32
    logits) or "screened" (int8 logits and an exact greedy argmax, specrt/head.py; ONNX
    Runtime, float32, in-place KV).
    """
    from specrt.engines.onnxruntime import OrtSettings

    t0 = time.perf_counter()
    check_path_args("a folder", export_dir=export_dir, out=out)  # Path('') is the working folder
    export_dir, out = Path(export_dir), Path(out)
    if backend not in BACKENDS:
        raise UserError(f"--backend '{backend}' is not one of {', '.join(BACKENDS)}")
    if not export_dir.is_dir():
        raise UserError(f"{export_dir}: no such export folder (run `specrt export` first)")
    if (export_dir / "engines.json").is_file() and not (export_dir / "export.json").is_file():
        raise UserError(f"{export_dir}: is an engines folder, not an export; build from an export folder (this "
                        f"one's copy is {export_dir / EXPORT_SUBDIR})")
    check_output(out, force=force, inputs=(export_dir,), marker="engines.json")  # before the export is hashed
    exp = load_export(export_dir)
    dtype = exp["dtype"]
    if depths is None:
        depths = default_depths(exp)
        log(f"depths {','.join(map(str, depths))} (the default for this export; --depths sets others)")
    depth_list = parse_depths(depths)
    prec = normalise_precision(precision, dtype)
    if backend == "onnxruntime" and PRECISIONS[prec] != dtype:
        advice = f"re-export with --dtype {PRECISIONS[prec]}"
        if PRECISIONS[prec] == "bfloat16" and not _runs_bfloat16(OrtSettings.from_json(ort_settings or {}).resolved()):
            # (a bfloat16 export is refused below on this provider: re-exporting led there)
            advice = ("a bfloat16 graph does not run on ONNX Runtime's CPU provider (no bfloat16 kernels for its "
                      "ops); build this export as it is, leaving --precision out")
        raise UserError(f"--precision {prec}: ONNX Runtime runs the graph in its exported dtype ({dtype}); {advice}")
    limit = int(exp["target"]["max_position_embeddings"])
    window = exp["target"].get("decoder", {}).get("sliding_window")
    why = source = "the target's max_position_embeddings"
    if window is not None and window < limit:  # specrt's graphs attend to the whole context
        source = "the target's sliding window"
        limit, why = int(window), (f"the target's sliding window: past {window} tokens the model attends to the "
                                   f"last {window} only, which specrt's full-attention graphs do not do")
        if max_context is None:
            log(f"note: context limit {limit}, the target's sliding window")
    ctx = limit if max_context is None else int(max_context)
    low = least_context(depth_list)  # a prompt token, the first new token, the deepest verify's drafts and its bonus
    if not low <= ctx <= limit:  # (it said "must be in 1..256" of 0, and 1 was refused after)
        raise UserError(f"--max-context {ctx} must be in {low}..{limit} (" + (
            f"at least the deepest verify depth {max(depth_list)} + 3: a prompt token, the first new token, "
            "the drafts and their bonus" if ctx < low else why) + ")")
    check_memory_fits(exp, ctx, source if max_context is None else "--max-context", log=log)
    draft_kind = (exp.get("draft") or {}).get("kind")
    draft_window = (exp.get("draft") or {}).get("sliding_window")
    applied = (exp.get("draft") or {}).get("attention_window")
    if isinstance(draft_window, int) and draft_window < ctx and applied is None:
        log(f"note: the draft was trained attending to the last {draft_window} tokens on some of its layers "
            f"(a mix of sliding and full attention, which the draft graph does not apply); the engines "
            f"give it the whole context up to {ctx}: the output stays exact, but past {draft_window} tokens its "
            "acceptance may drop")
    elif isinstance(applied, int) and applied < ctx:
        log(f"the draft attends to the last {applied} tokens, its sliding window, as it was trained")
    draft_length = _draft_length(exp, ctx, source if max_context is None else "--max-context", log)
    if draft_kind == "peagle" and max(depth_list) > exp["draft"]["speculative_tokens"]:
        log(f"note: depth {max(depth_list)} is deeper than the {exp['draft']['speculative_tokens']} tokens the "
            "P-EAGLE draft was trained to propose; its later positions may rarely be accepted")
    roles = make_roles(depth_list, ctx, draft_kind, opt_past=max(profile_pasts), draft_accepted=draft_accepted)
    graph_files = {g: f"{EXPORT_SUBDIR}/{_graph_file(exp, g)}" for g in exp["graphs"]}

    # Fail before any work if the backend is missing or settings are invalid.
    check_repeats(profile_repeats, "--profile-repeats")
    if ort_kv not in ("auto", *C.KV_LAYOUTS):
        raise UserError(f"--ort-kv '{ort_kv}' is not one of auto, {', '.join(C.KV_LAYOUTS)}")
    if draft_weights not in DRAFT_WEIGHTS:
        raise UserError(f"--draft-weights '{draft_weights}' is not one of {', '.join(DRAFT_WEIGHTS)}")
    if draft_weights != "fp":
        if backend != "onnxruntime":
            raise UserError(f"--draft-weights {draft_weights} applies to the onnxruntime backend, not {backend}")
        if "draft" not in exp["graphs"]:
            raise UserError(f"--draft-weights {draft_weights}: {export_dir} has no draft graph")
        if dtype != "float32":
            raise UserError(f"--draft-weights {draft_weights} needs a float32 export (this one is {dtype}): "
                            "ONNX Runtime's int8 CPU kernels take float32 activations")
        if draft_weights != "int8:blocks":  # (ONNX Runtime's dynamic quantizer works in temporary files)
            check_temp_folder(f"--draft-weights {draft_weights}")
    if target_head not in C.HEADS:
        raise UserError(f"--target-head '{target_head}' is not one of {', '.join(C.HEADS)}")
    if target_head != "full" and (backend != "onnxruntime" or dtype != "float32" or ort_kv == "append"):
        raise UserError(f"--target-head {target_head} needs the onnxruntime backend, a float32 export and in-place "
                        f"KV (here: {backend}, {dtype}, --ort-kv {ort_kv})")
    if ort_kv == "inplace" and backend != "onnxruntime":
        raise UserError(f"--ort-kv inplace applies to the onnxruntime backend, not {backend} "
                        "(TensorRT engines use the export's portable graphs)")
    # (each was taken and ignored: a user asking for one engine per depth got one session per graph)
    if trt_layout != "profiles" and backend != "tensorrt":
        raise UserError(f"--trt-layout {trt_layout} applies to the tensorrt backend, not {backend}")
    if ort_settings and backend != "onnxruntime":
        named = {"intra_op_num_threads": "--threads", "sessions": "--sessions"}  # (the CLI's; else the API's keys)
        given = ", ".join(named.get(k, f"ort_settings['{k}']") for k in ort_settings)
        raise UserError(f"{given} (ONNX Runtime's settings) apply to the onnxruntime backend, not {backend}")
    if backend == "tensorrt":
        from specrt.engines.tensorrt import require_tensorrt

        require_tensorrt()
        plan = trt_plan(roles, {g: v["io"] for g, v in exp["graphs"].items()}, graph_files, prec, dtype, trt_layout)
        settings = None
    else:
        plan = None
        settings = OrtSettings.from_json(ort_settings or {}).resolved()
        if dtype == "bfloat16" and not _runs_bfloat16(settings):
            raise UserError(f"{export_dir}: a bfloat16 export does not run on ONNX Runtime's CPU provider (no "
                            "bfloat16 kernels for its ops); re-export with --dtype float32 or float16")
    kv = _resolve_kv(ort_kv, backend, exp, settings, log)
    if target_head != "full" and kv != "inplace":
        raise UserError(f"--target-head {target_head} needs in-place KV, which these settings cannot have")
    if kv == "inplace":
        roles = with_cache_rows(roles, ctx)

    made_after = (C.CALIBRATION_FILE, C.CORPUS_FILE)  # (files made on an engines folder after its build)
    dropped = [n for n in made_after if force and (Path(out) / n).is_file()]
    if dropped:  # (files made after a build, minutes of work each: the new folder starts without them)
        log(f"note: {out} is replaced with its {' and '.join(dropped)}: run `specrt calibrate` / `specrt corpus` "
            "on the new engines")
    with atomic_folder(out, force=force, inputs=(export_dir,), marker="engines.json") as tmp:
        hashes = _embed_export(export_dir, exp, tmp / EXPORT_SUBDIR)
        log(f"linked export {export_dir} ({len(hashes)} files) into {out / EXPORT_SUBDIR}")
        role_json = {}
        if plan is not None:
            from specrt.engines import tensorrt

            if force:
                carry_timing_cache(Path(out), tmp, plan.timing_cache, environment("tensorrt"), log)
            tensorrt.build(plan, tmp, log)
            (tmp / (plan.timing_cache + ".lock")).unlink(missing_ok=True)  # polygraphy's LockFile leaves it
            files = [file_record(tmp, e.file) for e in plan.engines]
            if (tmp / plan.timing_cache).is_file():
                files.append(file_record(tmp, plan.timing_cache))
            for name, role in roles.items():
                f, i = plan.roles[name]
                role_json[name] = {**role.to_json(), "engine": {"file": f, "profile": i}}
            weight_bytes = tensorrt.weight_bytes(plan, tmp)
            backend_json = {"tensorrt": plan.to_json()}
            env = environment(backend)
        else:
            files, onnx_files, graphs_json = [], dict(graph_files), {}
            for g in exp["graphs"]:
                name = f"{g}.onnx"
                if g == "target" and kv == "inplace":
                    from specrt.engines.onnxruntime import write_inplace_target

                    t = exp["target"]
                    io = write_inplace_target(tmp / graph_files[g], t["decoder"], t["aux_layer_ids"], dtype, ctx,
                                              tmp / name, head=target_head)
                    files += [file_record(tmp, name), file_record(tmp, name + ".data")]
                    onnx_files[g] = name
                    # "tree": the graph's mask follows the positions (contracts.py "Token trees")
                    graphs_json[g] = {"io": io.to_json(), "kv": "inplace", "tree": True}
                    if target_head == "screened":
                        files += [file_record(tmp, HEAD_WEIGHT_FILE), file_record(tmp, HEAD_BOUNDS_FILE)]
                        graphs_json[g]["head"] = target_head
                        log(f"target head screened: int8 logits beside {n_outliers(int(t['hidden_size']))} fp32 outlier "
                            f"channels for greedy steps, the exact argmax from {HEAD_WEIGHT_FILE}")
                    log(f"target re-lowered with in-place KV ({ctx} rows, GroupQueryAttention): {out / name}")
                elif g == "draft" and draft_weights != "fp":
                    q = _int8_draft(tmp, graph_files[g], name, dtype, draft_weights, exp, depth_list, ctx,
                                    draft_accepted, profile_pasts, settings, log)
                    files += [file_record(tmp, name), file_record(tmp, name + ".data")]
                    onnx_files[g] = name
                    graphs_json[g] = {"quantized": q}
                    log(f"draft weights quantized to int8, {q['form']} form ({q['matmuls_quantized']} {q['op']}"
                        f"{', blocks of %d' % q['block_size'] if q['form'] == 'blocks' else ''}): {out / name}")
                elif _external_weights(tmp / graph_files[g], tmp / name):
                    files += [file_record(tmp, name), file_record(tmp, name + ".data")]
                    onnx_files[g] = name
            for name, role in roles.items():
                role_json[name] = {**role.to_json(), "engine": {"onnx": onnx_files[role.graph]}}
            weight_bytes = {g: sum(r["bytes"] for r in exp["graphs"][g]["files"]) for g in exp["graphs"]}
            # (whether the thread count is the build's default, its physical cores: capped at load
            # where fewer are available; a --threads count is kept as given)
            backend_json = {"onnxruntime": settings.to_json(), "graphs": graphs_json,
                            "onnxruntime_threads_default": not (ort_settings or {}).get("intra_op_num_threads")}
            env = environment(backend, settings.providers)
        manifest: dict[str, Any] = {
            "format": ENGINES_FORMAT,
            "backend": backend,
            "precision": prec,
            "depths": list(depth_list),
            "draft_depth": max(depth_list),
            "max_context": ctx,
            "roles": role_json,
            "files": files,
            "export": {"folder": EXPORT_SUBDIR, "digest": manifest_digest(exp), "dtype": dtype, "files": hashes},
            "environment": env,
            **backend_json,
            "weight_bytes": weight_bytes,
        }
        if draft_length is not None:  # (engines whose context its draft covers read as before)
            manifest["draft_max_position_embeddings"] = draft_length
        manifest["costs"] = _profile(EngineSet(tmp, manifest, exp), profile_pasts, draft_accepted, profile_repeats,
                                     log, folder=Path(out))
        manifest["built_seconds"] = round(time.perf_counter() - t0, 2)
        write_json(tmp / ENGINES_MANIFEST, manifest)
        # files a calibrate / corpus run beside this build wrote into the old folder
        # meanwhile: replaced with it, which went without a word (session 55's interruption walk)
        late = [n for n in made_after if force and n not in dropped and (Path(out) / n).is_file()]
        if late:
            log(f"note: {' and '.join(late)} written into {out} during this build "
                f"{'goes' if len(late) == 1 else 'go'} with the old engines: run "
                "`specrt calibrate` / `specrt corpus` on the new ones")
    log(f"engines complete: {out} ({backend}, {prec}, depths {','.join(map(str, depth_list))}, "
        f"{manifest['built_seconds']:.1f} s)")
    return manifest


def _draft_length(exp: dict[str, Any], ctx: int, source: str, log: Callable[[str], None]) -> int | None:
    """Warns (config.draft_length_note) when the engines' context ``ctx`` passes the draft's own
    max_position_embeddings, read from the export's receipt (every export records its draft's
    config there); returns that length then, else None."""
    from specrt.export.config import draft_length_note

    d = exp["binding_receipt"].get("draft") or {}
    dec = d.get("config", {}).get("decoder", {})
    length, rope = dec.get("max_position_embeddings"), (dec.get("rope") or {}).get("rope_type")
    if not (whole(length) and isinstance(rope, str)):
        return None
    note = draft_length_note(str(Path(d.get("folder", "DRAFT")) / "config.json"),
                             d["config"].get("source_format", "speculators"), length, rope, ctx,
                             f"the engines' context ({source})")
    if note is None:
        return None
    log(note)
    return int(length)


def _int8_draft(tmp: Path, src: str, name: str, dtype: str, draft_weights: str, exp: dict, depths, ctx: int,
                draft_accepted: int, pasts, settings, log: Callable[[str], None]) -> dict[str, Any]:
    """Write ``tmp/name`` (+ .data), the export's draft ``tmp/src`` with int8 weights: in the
    form ``draft_weights`` names, or for plain "int8" the faster of both on this machine
    (quantize.choose_form, timed at the loop's shapes: ``draft_accepted`` pending slots and
    each verify depth up to 4 as the block, after min(pasts) rows, with the engines'
    threads and providers, ``settings``). Returns the record."""
    form = draft_weights.partition(":")[2]
    if form:
        return {**quantize_draft(tmp / src, tmp / name, dtype, form), "chosen_by": f"--draft-weights {draft_weights}"}
    blocks = [d for d in depths if d <= 4] or [min(depths)]
    a = draft_accepted
    past = max(0, min(min(pasts), ctx - max(depths) - a - 1))
    if (exp.get("draft") or {}).get("kind") == "peagle":
        sizes = [{C.DIM_NEW: a + b - 1, C.DIM_AUX: a, C.DIM_PAST: past} for b in blocks]
    else:  # EAGLE-3: a step feeds one drafted token and its hidden state
        sizes = [{C.DIM_NEW: 1, C.DIM_AUX: 0, C.DIM_PREV: 1, C.DIM_PAST: past}]
    from types import SimpleNamespace

    import numpy as np

    from specrt.engines.base import specs_from_json

    draft_in = SimpleNamespace(inputs=specs_from_json(exp["graphs"]["draft"]["io"]["inputs"]))
    rng = np.random.default_rng(0)
    feeds = [_costs.synthetic_feeds(draft_in, sz, int(exp["target"]["vocab_size"]), rng) for sz in sizes]
    scratch = tmp / ".int8-forms"
    scratch.mkdir()
    try:
        kept, forms = choose_form(tmp / src, scratch, name, dtype, feeds, settings.intra_op_num_threads,
                                  providers=settings.providers)
        path = forms[kept]["path"]  # quantized once: the kept form moves into place with its data file
        os.replace(path, tmp / name)
        os.replace(path.with_name(name + ".data"), tmp / (name + ".data"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log("int8 draft forms timed (ms a pass at " + ", ".join(f"{s[C.DIM_NEW]} new" for s in sizes) + "): "
        + "; ".join(f"{f} {' / '.join(f'{t:.3g}' for t in v['ms'])}" for f, v in forms.items()) + f": keeping {kept}")
    return {**forms[kept]["record"], "chosen_by": "timing", "timed_ms": {f: v["ms"] for f, v in forms.items()},
            "timed_sizes": sizes}


def _profile(engines: EngineSet, pasts, draft_accepted: int, repeats: int, log: Callable[[str], None],
             where: str = "", folder: Path | None = None) -> dict[str, Any]:
    """``profile_costs`` on ``engines`` (activated for it, released after) at the ``pasts``
    that fit their context (else half of it), for the build and ``measure_costs`` alike.
    ONNX Runtime engines: the table's ``cpu_share`` is the CPU time this process had over
    what its threads asked for while profiling (spinning threads: ~1 on an idle machine);
    below costs.BUSY_CPU_SHARE the log says the machine was busy and names `specrt profile
    FOLDER` (``folder``: the engines' final folder, by default theirs)."""
    depth_list = tuple(engines.depths)
    ctx = engines.max_context
    # else the half of the context, or less where the deepest verify would not fit after it
    # (make_roles keeps ctx >= max depth + 2: past >= 1)
    pasts = tuple(int(p) for p in pasts if int(p) + max(depth_list) + 1 <= ctx) or \
        (min(ctx // 2, ctx - max(depth_list) - 1),)
    vocab = {"target": int(engines.export["target"]["vocab_size"]), "draft": int(engines.export["target"]["vocab_size"])}
    draft_kind = (engines.export.get("draft") or {}).get("kind")
    log(f"profiling {len(engines.runners)} engines{where} at past {', '.join(map(str, pasts))} (median of {repeats})")
    with engines:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        table = profile_costs(engines.runners, vocab=vocab, depths=depth_list, draft_kind=draft_kind, pasts=pasts,
                              draft_accepted=draft_accepted, repeats=repeats, log=log)
        threads = getattr(getattr(engines, "ort_settings", None), "intra_op_num_threads", None)
        if engines.backend == "onnxruntime" and threads:
            # (the note says the share recorded: the unrounded one's percent could differ by one, a flaky test)
            share = round((time.process_time() - cpu0) / (max(time.perf_counter() - wall0, 1e-9) * threads), 3)
            table["cpu_share"] = share
            if share < _costs.BUSY_CPU_SHARE:  # other processes took the cores: every time is inflated
                log(f"note: this process had {share:.0%} of the CPU time its {threads} ONNX Runtime threads asked "
                    f"for while profiling: the machine was busy and these costs are inflated (DSpark and prompt "
                    f"lookup price their rounds from them): measure them again with `specrt profile "
                    f"{folder or engines.folder}` when the machine is idle")
        return table


def check_repeats(repeats, option: str) -> None:
    """A cost table's timed passes (``option`` as the CLI names it, or the Python argument:
    run_bench's ``profile_repeats``): 1..MAX_PROFILE_REPEATS, as the CLI's IntRange declares
    it, for Python callers."""
    if not whole(repeats, 1, MAX_PROFILE_REPEATS):
        raise UserError(f"{option} {repeats!r}: expected a whole number in 1..{MAX_PROFILE_REPEATS}")


def malformed_costs(table) -> bool:
    """Whether a stored cost table is one the engines cannot read, or whose pasts and draft
    shape (which parse_costs does not read, and measure_costs reuses) are not whole numbers."""
    from specrt.engines.costs import parse_costs

    try:
        parse_costs(table)
    except (KeyError, TypeError, ValueError, AttributeError):
        return True
    pasts, accepted = (table or {}).get("pasts", PROFILE_PASTS), (table or {}).get("draft_accepted", DRAFT_ACCEPTED)
    return not (isinstance(pasts, (list, tuple)) and pasts and all(whole(p, 1) for p in pasts) and whole(accepted, 1))


def measure_costs(engines: EngineSet, repeats: int = 10, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The cost table of ``engines`` (an EngineSet, not yet active) measured now on this
    machine: the pasts and draft shape of its stored table, the build's round-robin timing
    (``profile_costs``), ``repeats`` calls per role. Activates the engines for the
    measurement and releases them after."""
    old = engines.manifest.get("costs") or {}
    # what this mends: measured at the build's defaults. A table missing (or without 'verify') is
    # what the engines' cost lookup sends here too ("measure it again with `specrt profile`");
    # until session 59 it was refused here with advice to rebuild
    what = "malformed" if malformed_costs(old) else None if old.get("verify") else "missing"
    if what:
        log(f"note: {engines.folder / ENGINES_MANIFEST}: the stored cost table is {what}; measuring one at the "
            f"build's default pasts ({', '.join(map(str, PROFILE_PASTS))}, those that fit)")
        old = {"verify": True}
    return _profile(engines, old.get("pasts", PROFILE_PASTS), int(old.get("draft_accepted", DRAFT_ACCEPTED)), repeats,
                    log, where=f" of {engines.folder}")


def reprofile_engines(folder: Path, repeats: int = 10, log: Callable[[str], None] = print
                      ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure ``folder``'s cost table again on this machine, now (``measure_costs``), and
    rewrite it in engines.json (atomically; the engine files and their hashes are
    untouched). The first rewrite keeps the build's table as ``costs_build``. Returns
    (previous table, new table).

    The table is where DSpark's prices start each session and what ``specrt bench``
    predicts from unless it profiles itself; DSpark's online load factors correct a
    uniform drift of the machine's speed, but only slowly a change in the ratios between
    depths, and a table profiled when the machine was faster or quieter misleads both
    (measured on SmolLM2: decode phases at 0.84-0.92x of a build-time table's prediction
    hours later; a profile on a slowed host: decode 38-43 ms against the table's 26.4)."""
    from specrt.engines.engine_set import load_engines
    from specrt.paths import write_atomic

    check_path_args("a folder", folder=folder)
    check_repeats(repeats, "--repeats")  # (`specrt profile`'s option)
    folder = Path(folder)
    engines = load_engines(folder, costs=False)  # refuses stale or tampered engines, another machine's (a malformed
    # cost table is what this replaces: its error told the user to run this)
    manifest = folder / ENGINES_MANIFEST
    before = manifest.read_bytes()
    raw = read_engines_manifest(folder)  # as on disk, to write back with only the costs changed
    old = raw.get("costs") or {}
    if malformed_costs(old):  # (the one this mends: neither kept as the build's nor compared with)
        old = {}
    new = measure_costs(engines, repeats, log)
    if manifest.read_bytes() != before:  # (a `build --force` replaced the folder meanwhile: this manifest is gone)
        raise UserError(f"{manifest} changed while it was being profiled (rebuilt, or profiled by another run); "
                        "nothing written: run `specrt profile` again")
    if old:
        raw.setdefault("costs_build", old)
    raw["costs"] = new
    raw["costs_profiled"] = {"by": "specrt profile", "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                             "repeats": repeats}
    write_atomic(folder / ENGINES_MANIFEST, raw, indent=2)
    return old, new
