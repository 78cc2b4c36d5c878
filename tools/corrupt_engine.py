"""Make a deliberately corrupted copy of an engines folder: ONE weight element of the target
engine's graph changed, recorded in engines.json's file hashes as a build would record it, so
that loading accepts it and only ``specrt compare`` can catch it (issue 8's check).

    python tools/corrupt_engine.py ENGINES OUT [--initializer embed] [--index 0] [--delta 1.0]
    specrt compare OUT            # exits 1 naming the roles and outputs that moved

OUT is a copy of ENGINES (its embedded export hard-linked); every target role of OUT points at
OUT/corrupt/target.onnx. Only ONNX Runtime engines (TensorRT plans hold no ONNX weights).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def corrupt(folder: Path, initializer: str, delta: float = 1.0, index: int = 0) -> tuple[float, float]:
    """Change element ``index`` of ``initializer`` in ``folder``'s target engine by ``delta``;
    returns (old, new) value."""
    import onnx
    from onnx import numpy_helper

    from specrt.errors import UserError
    from specrt.manifest import file_record

    m = json.loads((folder / "engines.json").read_text())
    if m["backend"] != "onnxruntime":
        raise UserError(f"{folder}: a {m['backend']} engine has no ONNX weights to change")
    model = onnx.load(str(folder / m["roles"]["decode"]["engine"]["onnx"]))  # the engine's own target graph
    init = next((t for t in model.graph.initializer if t.name == initializer), None)
    if init is None:
        raise UserError(f"{folder}: the target engine has no weight '{initializer}'")
    w = numpy_helper.to_array(init).copy()
    if not -w.size <= index < w.size:
        raise UserError(f"{folder}: --index {index} is outside the target engine's weight '{initializer}' "
                        f"({w.size} elements)")
    old = float(w.flat[index])
    w.flat[index] += delta
    init.CopyFrom(numpy_helper.from_array(w, initializer))
    out = folder / "corrupt" / "target.onnx"
    out.parent.mkdir()
    big = sum(t.ByteSize() for t in model.graph.initializer) > 100 * 2 ** 20
    if big:
        onnx.save_model(model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="target.onnx.data", size_threshold=1024)
    else:
        onnx.save(model, str(out))
    for role in m["roles"].values():
        if role["graph"] == "target":
            role["engine"]["onnx"] = "corrupt/target.onnx"
    m["files"].append(file_record(folder, "corrupt/target.onnx"))
    if big:
        m["files"].append(file_record(folder, "corrupt/target.onnx.data"))
    (folder / "engines.json").write_text(json.dumps(m, indent=1))
    return old, float(w.flat[index])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--initializer", default="embed", help="weight slot (default embed: SmolLM2's tied head)")
    ap.add_argument("--index", type=int, default=0, help="flat element index")
    ap.add_argument("--delta", type=float, default=1.0)
    args = ap.parse_args(argv)
    if args.out.exists() or args.out.is_symlink():  # (a dead link too: the removal of a failed copy is never its)
        raise SystemExit(f"error: {args.out} exists")
    # checked before the copy: a folder that is no build was copied whole (into itself when OUT
    # lies inside it) and failed with a traceback, the copy left behind
    try:
        backend = json.loads((args.engines / "engines.json").read_text())["backend"]
    except OSError as e:
        raise SystemExit(f"error: {args.engines}: cannot read engines.json ({e.strerror}): expected a folder "
                         "`specrt build` wrote")
    except (ValueError, LookupError, TypeError) as e:
        raise SystemExit(f"error: {args.engines}: engines.json is not a build's manifest ({type(e).__name__}: {e})")
    if backend != "onnxruntime":
        raise SystemExit(f"error: {args.engines}: a {backend} engine has no ONNX weights to change")
    if args.out.resolve().is_relative_to(args.engines.resolve()):
        raise SystemExit(f"error: {args.out} lies inside {args.engines}: give OUT outside the folder it copies")
    from specrt.errors import UserError

    # the embedded export is hard-linked (never modified); the engine files are copied: onnx
    # refuses to read external weights from a file with several hard links
    try:  # (the first copy inside too: a full disk or a dead link part way left OUT half made, a traceback)
        shutil.copytree(args.engines, args.out, ignore=shutil.ignore_patterns("export"))
        shutil.copytree(args.engines / "export", args.out / "export", copy_function=os.link)
        old, new = corrupt(args.out, args.initializer, args.delta, args.index)
    except (UserError, OSError) as e:  # (a wrong --initializer or --index): no half-made copy left
        shutil.rmtree(args.out, ignore_errors=True)
        # (shutil.Error: copytree's list of (source, copy, why), one for each file it could not copy)
        why = "; ".join(w for *_, w in e.args[0]) if isinstance(e, shutil.Error) and isinstance(e.args[0], list) \
            else str(e).removeprefix(f"{args.out}: ")
        raise SystemExit(f"error: {args.engines}: {why} ({args.out} not written)")
    print(f"{args.out}: {args.initializer}[{args.index}] {old:.6g} -> {new:.6g}; target roles point at "
          f"{args.out / 'corrupt' / 'target.onnx'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
