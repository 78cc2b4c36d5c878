"""tools/device_check_trt.py, the prepared TensorRT check for a GPU machine: what of it
runs without TensorRT."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "device_check_trt.py"


def _module():
    spec = importlib.util.spec_from_file_location("device_check_trt", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_reference_engines_take_the_feeds_tensorrt_engines_take(tiny_export, tmp_path):
    """The ONNX Runtime reference had in-place KV (cache_key.* inputs) while TensorRT
    engines take the export graph's own inputs (past_key.*): step 4 of the check would
    have failed on the first GPU run with 'input cache_key.0 is missing'. Every reference
    runner now takes exactly the inputs of the export graph its role comes from."""
    from specrt.engines import load_engines

    ref = _module().build_reference(tiny_export, tmp_path / "ref")
    roles = json.loads((ref / "engines.json").read_text())["roles"]
    graph_inputs = {g: {i.name for i in onnx.load(str(tiny_export / f"{g}.onnx"), load_external_data=False).graph.input}
                    for g in ("target", "draft")}
    with load_engines(ref) as e:
        for role, spec in roles.items():
            assert {t.name for t in e.runner(role).inputs} == graph_inputs[spec["graph"]], role


def test_without_tensorrt_it_says_skip_after_its_imports_resolve(tmp_path):
    """Run from another folder, as a user would: specrt is imported as installed (the
    script put its checkout first on sys.path, which hid an installed specrt's engines
    package) before TensorRT is looked for; exit 2 with the reason."""
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "w")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert p.returncode == 2 and "SKIP: TensorRT is not importable here" in p.stdout, (p.stdout, p.stderr)
        assert not (tmp_path / "w").exists()  # nothing done
    else:
        assert p.returncode in (0, 1, 2), p.stderr
