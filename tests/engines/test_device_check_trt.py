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


def test_generation_step_runs_the_session_it_will_run_on_tensorrt(tiny_engines_append):
    """Step 6 of the check (greedy tokens of `off` and `fixed:4` against ONNX Runtime's
    `off`), on the ONNX Runtime reference it compares with: the Session calls run here as on
    the GPU, and the governors agree (lossless), so a difference there is TensorRT's."""
    m = _module()
    off, fixed = m.generate(tiny_engines_append, "off"), m.generate(tiny_engines_append, "fixed:4")
    assert [len(t) for t in off] == [m.NEW_TOKENS] * len(m.PROMPTS)
    assert fixed == off


def test_a_failing_step_fails_alone_and_the_summary_keeps_it(capsys):
    """One run on a lent GPU: a step's exception is a FAIL of that step, with its traceback,
    and the layout's next steps still run (they all shared one try before, so a polygraphy
    error hid the runner, compare, generation and tamper results)."""
    m = _module()
    ran = []

    def broken():
        raise RuntimeError("profile 3 rejected")

    m.step("profiles", "polygraphy comparison", broken)
    m.step("profiles", "runner path", lambda: ran.append(1) or m.check(True, "[profiles] runners"))
    assert ran == [1]
    assert m.failures == ["[profiles] polygraphy comparison: RuntimeError: profile 3 rejected"]
    assert m.checks == ["[FAIL] [profiles] polygraphy comparison: RuntimeError: profile 3 rejected",
                        "[PASS] [profiles] runners"]
    assert "Traceback" in capsys.readouterr().err
