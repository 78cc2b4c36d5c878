"""``specrt build --draft-weights int8``: the draft graph rewritten with weight-only int8
MatMulNBits, recorded and hash-checked like any engine file, compared within the int8 bounds,
and lossless (the target verifies every token)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrt import contracts as C
from specrt.engines import build_engines, load_engines
from specrt.engines.compare import INT8_DRAFT, INT8_DRAFT_SCALE, compare_engines
from specrt.errors import UserError
from specrt.manifest import file_record

from .conftest import quiet

DEPTHS = (1, 2, 4)


@pytest.fixture(scope="module")
def int8_engines(tiny_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("int8") / "engines"
    build_engines(tiny_export, "onnxruntime", DEPTHS, out, log=quiet, profile_repeats=1, draft_weights="int8")
    return out


def _ops(path: Path) -> list[str]:
    import onnx

    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_build_rewrites_and_records_the_draft(int8_engines, tiny_engines):
    m = json.loads((int8_engines / "engines.json").read_text())
    q = m["graphs"]["draft"]["quantized"]
    assert (q["weights"], q["bits"], q["block_size"], q["accuracy_level"]) == ("int8", 8, 32, 4)
    assert m["roles"]["draft"]["engine"]["onnx"] == "draft.onnx"
    assert {"draft.onnx", "draft.onnx.data"} <= {f["file"] for f in m["files"]}  # hash-checked at load
    ops = _ops(int8_engines / "draft.onnx")
    # fc, q, k, v, o, gate, up, down, lm_head: every weight GEMM; the attention MatMuls stay
    assert ops.count("MatMulNBits") == q["matmuls_quantized"] == 9 and "Gemm" not in ops
    assert load_engines(int8_engines, verify=False).draft_weights == "int8"
    assert load_engines(tiny_engines, verify=False).draft_weights == "fp"


def test_int8_draft_is_lossless_and_still_drafts(int8_engines, tiny_engines):
    from specrt.runtime import generate as G
    from specrt.runtime.governor import FixedGovernor, OffGovernor
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import read_d2t

    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with load_engines(tiny_engines) as fp, load_engines(int8_engines) as q8:
        d2t = read_d2t(fp.export_dir, fp.export)
        ref = G.Generator(fp, OffGovernor(DEPTHS), SamplingParams(), d2t).generate(prompt, 40)
        for k in DEPTHS:
            g = G.Generator(q8, FixedGovernor(DEPTHS, k), SamplingParams(), d2t)
            assert g.generate(prompt, 40) == ref, f"depth {k}"
            assert g.telemetry.to_json()["drafted"] > 0


def test_compare_uses_the_int8_bounds_and_catches_a_wrong_scale(int8_engines, tmp_path):
    import shutil

    import onnx
    from onnx import numpy_helper

    lines: list[str] = []
    r = compare_engines(int8_engines, log=lines.append, inputs_file=tmp_path / "in.json")
    assert r["passed"], r["summary"]
    d = r["roles"]["draft"]["outputs"]
    # the logits bound: the int8 floor, or a fraction of the float draft's largest |logit|
    assert d[C.DRAFT_LOGITS]["atol_scale"] == INT8_DRAFT_SCALE[C.DRAFT_LOGITS]
    assert d[C.DRAFT_LOGITS]["atol"] >= INT8_DRAFT[C.DRAFT_LOGITS][0]
    assert d[C.DRAFT_LOGITS]["max_abs"] > 1e-4  # the weights really changed: the float bounds would fail
    assert r["roles"]["decode"]["outputs"][C.LOGITS]["atol"] == 1e-4  # the target keeps its own bounds
    assert any("int8 weights" in n for n in r["notes"])

    # one block scale of the draft's head doubled: outside the int8 bounds, named
    bad = tmp_path / "bad"
    shutil.copytree(int8_engines, bad)
    model = onnx.load(str(bad / "draft.onnx"))
    head = [n for n in model.graph.node if n.op_type == "MatMulNBits"][-1]
    scales = next(t for t in model.graph.initializer if t.name == head.input[2])
    s = numpy_helper.to_array(scales).copy()
    s[: s.size // 4] *= 2.0
    scales.CopyFrom(numpy_helper.from_array(s, scales.name))
    (bad / "draft.onnx").unlink()
    (bad / "draft.onnx.data").unlink()
    onnx.save_model(model, str(bad / "draft.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="draft.onnx.data", size_threshold=1024)
    m = json.loads((bad / "engines.json").read_text())
    m["files"] = [f for f in m["files"] if not f["file"].startswith("draft.onnx")]
    m["files"] += [file_record(bad, "draft.onnx"), file_record(bad, "draft.onnx.data")]
    (bad / "engines.json").write_text(json.dumps(m))
    r = compare_engines(bad, log=quiet, inputs_file=tmp_path / "in2.json")
    assert not r["passed"]
    assert {f["role"] for f in r["failures"]} == {"draft"}
    assert C.DRAFT_LOGITS in {f["output"] for f in r["failures"]}


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft_weights="int4"), "--draft-weights 'int4' is not one of fp, int8"),
    (dict(draft_weights="int8", backend="tensorrt"), "applies to the onnxruntime backend"),
])
def test_bad_draft_weights(tiny_export, tmp_path, kwargs, message):
    args = dict(backend="onnxruntime")
    args.update(kwargs)
    with pytest.raises(UserError, match=message):
        build_engines(tiny_export, args.pop("backend"), "1,2", tmp_path / "e", log=quiet, **args)
    assert not (tmp_path / "e").exists()


def test_float16_export_is_refused(tmp_path):
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", "llama")
    export(t, write_tiny_draft(tmp_path / "d", t, kind="peagle"), tmp_path / "exp", dtype="float16", log=quiet)
    with pytest.raises(UserError, match="needs a float32 export"):
        build_engines(tmp_path / "exp", "onnxruntime", "1", tmp_path / "e", log=quiet, draft_weights="int8")
    assert not (tmp_path / "e").exists()


def test_target_only_export_is_refused(tmp_path):
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    export(write_tiny_target(tmp_path / "t", "llama"), None, tmp_path / "exp", log=quiet)
    with pytest.raises(UserError, match="has no draft graph"):
        build_engines(tmp_path / "exp", "onnxruntime", "1", tmp_path / "e", log=quiet, draft_weights="int8")
