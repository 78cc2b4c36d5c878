"""The engines side (engine_set, plan, quantize, manifest; specrt/manifest.py) under a mutation
round of session 78 (m78e): what each test pins, the mutant that passed every test before it.
Real engines and graphs, built as the other tests build them (conftest's fixtures), no mocks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.runtime.test_head import small_screened  # noqa: F401


def _checked(model, float_graph, path):
    """check_int8_weights of ``model`` (an int8 graph edited) saved at ``path``, against ``float_graph``."""
    import onnx

    from specrt.engines.quantize import check_int8_weights

    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    return check_int8_weights(float_graph, path)


def _gemm_graph(path, w):
    """A float graph of one Gemm (x times the initializer ``w``, [K, N]), saved at ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, n = w.shape
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
                          [numpy_helper.from_array(w.astype(np.float32), "w")])
    onnx.save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))


def test_a_clipped_code_more_than_a_step_off_its_weight_is_named(tmp_path):
    """m78e-1 (quantize.py: the clipped codes' bound 1 step widened to 2): the top code (255, +127
    steps) is the one rounding may clip to, and so may sit up to one step off its weight; given to
    a weight 1.6 steps below it (+125.4 steps, code 253 as built), the check passed it."""
    import onnx
    from onnx import numpy_helper

    from specrt.engines.quantize import check_int8_weights, quantize_draft

    w = np.linspace(-0.5, 0.5, 32).reshape(32, 1)
    w[0, 0], w[5, 0] = -1.0, 0.98  # step 1/128 (the largest, -1.0, is code 0); 0.98 is 125.44 steps
    _gemm_graph(tmp_path / "float.onnx", w)
    quantize_draft(tmp_path / "float.onnx", tmp_path / "q.onnx", "float32", "blocks")
    assert check_int8_weights(tmp_path / "float.onnx", tmp_path / "q.onnx")["passed"]
    model = onnx.load(str(tmp_path / "q.onnx"))
    (n,) = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    t = next(t for t in model.graph.initializer if t.name == n.input[1])
    codes = numpy_helper.to_array(t).copy()  # [N, blocks, 32]
    assert codes[0, 0, 5] == 253 and codes[0, 0, 0] == 0
    codes[0, 0, 5] = 255
    t.CopyFrom(numpy_helper.from_array(codes, t.name))
    onnx.save_model(model, str(tmp_path / "clipped.onnx"))
    r = check_int8_weights(tmp_path / "float.onnx", tmp_path / "clipped.onnx")
    assert not r["passed"] and 1.5 < r["max_clipped_error_steps"] < 1.6, r
    assert [b["problem"] for b in r["bad"]] == ["a weight dequantizes 1.56 steps from the float one (at most 0.5, "
                                                "1 where clipped)"]


def test_a_folder_in_a_recorded_files_place_is_refused_not_read(engines_copy):
    """m78e-2 (specrt/manifest.py verify_files: ``is_file`` as ``exists``): a folder where a
    recorded file was, of the size recorded, was opened to be hashed: an IsADirectoryError
    traceback; it is said missing, naming the file."""
    import json

    from specrt.engines import load_engines
    from specrt.errors import UserError

    p = engines_copy / "target.onnx"
    p.unlink()
    p.mkdir()
    m = json.loads((engines_copy / "engines.json").read_text())
    next(r for r in m["files"] if r["file"] == "target.onnx")["bytes"] = p.stat().st_size
    (engines_copy / "engines.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=f"^{engines_copy}: engines file 'target.onnx' is missing$"):
        load_engines(engines_copy)


def test_a_dynamic_weights_zero_point_other_than_0_is_named(tiny_export, tmp_path):
    """m78e-3 (quantize.py _check_columns: the zero point's value unchecked, only its being an
    initializer): ONNX Runtime dequantizes (code - zero point) x step, so a zero point of 5 moves
    every weight of the head by 5 steps; with the codes and steps as built the check passed it."""
    import onnx
    from onnx import numpy_helper

    from specrt.engines.quantize import quantize_draft

    quantize_draft(tiny_export / "draft.onnx", tmp_path / "q.onnx", "float32", "dynamic")
    model = onnx.load(str(tmp_path / "q.onnx"))
    head = [n for n in model.graph.node if n.op_type == "MatMulInteger"][-1]
    zp = next(t for t in model.graph.initializer if t.name == head.input[3])
    value = numpy_helper.to_array(zp).copy()
    assert not value.any()
    value[...] = 5
    zp.CopyFrom(numpy_helper.from_array(value, zp.name))
    w = _checked(model, tiny_export / "draft.onnx", tmp_path / "bad.onnx")
    assert not w["passed"] and [(b["matmul"], b["problem"]) for b in w["bad"]] == \
        [(head.input[1], "the weight's zero point is not 0: expected symmetric codes")]


def test_an_exports_max_position_embeddings_edited_is_refused(tiny_export, tmp_path):
    """m78e-4 (specrt/manifest.py check_export: target.max_position_embeddings left out of the
    fields held to the binding receipt): export.json's positions raised by hand loaded, and a
    build takes its context limit from them (RoPE and the KV buffers past what the model has)."""
    import json
    import re
    import shutil

    from specrt.errors import UserError
    from specrt.manifest import load_export

    exp = tmp_path / "exp"
    shutil.copytree(tiny_export, exp)
    m = json.loads((exp / "export.json").read_text())
    assert m["target"]["max_position_embeddings"] == 256
    m["target"]["max_position_embeddings"] = 4096
    (exp / "export.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=f"^{re.escape(str(exp / 'export.json'))}: field 'target.max_position_embeddings'"
                                        " is 4096, the binding receipt's target config says 256; "):
        load_export(exp)


def _on_the_grid(tmp_path, form):
    """A one-Gemm float graph whose weights lie on the int8 codes exactly (every weight's
    rounding residual 0), its ``form`` quantization, and the latter's (model, node, step tensor)."""
    import onnx
    from onnx import numpy_helper

    from specrt.engines.quantize import check_int8_weights, quantize_draft

    # blocks: step = the block's signed largest / -128 = 1/128, codes k + 128; dynamic: step = 1/64
    top = 128 if form == "blocks" else 64
    k = np.arange(64, dtype=np.float64).reshape(32, 2) % (2 * top - 1) - (top - 1)
    k[0] = -top if form == "blocks" else top
    w = k / top
    path = tmp_path / "lm_head.onnx"  # (the dynamic form quantizes the head's slot name only)
    _gemm_graph(path, w)
    model = onnx.load(str(path))
    model.graph.initializer[0].name = "lm_head"
    model.graph.node[0].input[1] = "lm_head"
    onnx.save_model(model, str(path))
    quantize_draft(path, tmp_path / "q.onnx", "float32", form)
    r = check_int8_weights(path, tmp_path / "q.onnx")
    assert r["passed"] and r["max_error_steps"] < 1e-6, r
    q = onnx.load(str(tmp_path / "q.onnx"))
    (n,) = [n for n in q.graph.node if n.op_type in ("MatMulNBits", "MatMulInteger")]
    name = n.input[2] if form == "blocks" else "lm_head_scale"
    return q, n, next(t for t in q.graph.initializer if t.name == name), numpy_helper


@pytest.mark.parametrize("form, mutant", [("blocks", "m78e-5"), ("dynamic", "m78e-6")])
def test_a_step_a_thousandth_off_is_named_though_every_weight_is_within_bounds(tmp_path, form, mutant):
    """m78e-5 (quantize.py check_int8_weights: a block's step allowed 1% off, not 1e-5) and m78e-6
    (_check_columns: a column's likewise): with the weights on the codes' grid a step 0.1% large
    moves no weight past half a step (at most 0.13 steps), so only the step's own check tells a
    scale that is not the one the form gives (largest |weight| / 128, / 64)."""
    import onnx

    from specrt.engines.quantize import check_int8_weights

    q, n, t, numpy_helper = _on_the_grid(tmp_path, form)
    step = numpy_helper.to_array(t).copy()
    step.reshape(-1)[0] *= 1.001
    t.CopyFrom(numpy_helper.from_array(step, t.name))
    onnx.save_model(q, str(tmp_path / "bad.onnx"))
    r = check_int8_weights(tmp_path / "lm_head.onnx", tmp_path / "bad.onnx")
    assert not r["passed"] and r["max_error_steps"] < 0.2 and 9e-4 < r["max_step_error"] < 1.1e-3, r
    what = "block (0, 0): step 0.00782 x 128 = 1.001" if form == "blocks" else "column 0: step 0.01564 x 64 = 1.001"
    assert [b["problem"] for b in r["bad"]] == [f"{what}, its largest |weight| is 1"], r


def test_a_blocks_step_count_that_does_not_fit_its_codes_is_named(tmp_path):
    """m78e-7 (quantize.py check_int8_weights: the step count unchecked beside the codes' shape):
    a MatMulNBits with twice the steps its codes have blocks was a ValueError traceback (the
    steps reshaped per block); it is named as not fitting the weight."""
    import onnx

    from specrt.engines.quantize import check_int8_weights

    q, n, t, numpy_helper = _on_the_grid(tmp_path, "blocks")
    step = numpy_helper.to_array(t)
    t.CopyFrom(numpy_helper.from_array(np.concatenate([step, step]), t.name))
    onnx.save_model(q, str(tmp_path / "bad.onnx"))
    r = check_int8_weights(tmp_path / "lm_head.onnx", tmp_path / "bad.onnx")
    assert not r["passed"]
    assert [b["problem"] for b in r["bad"]] == ["codes [2, 1, 32] and 4 steps do not fit a [32, 2] weight in blocks of 32"]


def test_the_dynamic_form_leaves_the_root_loggers_level_as_it_was(tiny_export, tmp_path):
    """m78e-8 (quantize.py _quantize_dynamic: the root logger's level not put back): quantize_dynamic
    logs every tensor on the root logger, so it is quieted to ERROR for the call; left so, every
    warning the process logged after an int8 build (a library caller's, a later command's in the
    same process) was dropped."""
    import logging

    from specrt.engines.quantize import quantize_draft

    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        quantize_draft(tiny_export / "draft.onnx", tmp_path / "q.onnx", "float32", "dynamic")
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)


def test_plain_int8_decides_on_the_times_it_records(tiny_export, tmp_path, monkeypatch):
    """m78e-9 (quantize.py choose_form: the times recorded unrounded): the record's times are rounded
    to 0.1 us and the choice made on those, so that the record explains it; at a near tie (dynamic
    0.96996 ms against blocks 1.0, the margin 0.97) the unrounded times kept the dynamic form while a
    record rounded to show 0.97 would say it was not under the margin. The two forms are quantized
    for real; the times are given (a real timing cannot be set at a boundary), as in test_quantize."""
    from specrt.engines import quantize

    monkeypatch.setattr(quantize, "time_passes", lambda paths, *a, **k: {"blocks": [1.0], "dynamic": [0.96996]})
    form, forms = quantize.choose_form(tiny_export / "draft.onnx", tmp_path, "draft.onnx", "float32", [{}], 1)
    assert (form, forms["dynamic"]["ms"], forms["blocks"]["ms"]) == ("blocks", [0.97], [1.0])


def test_a_screened_sets_portable_view_gives_the_exports_outputs(small_screened):  # noqa: F811
    """m78e-10 (engine_set.py PortableView: ``head_hidden`` kept on the fp32 branch): the portable
    view answers as the export's target graph does (its outputs, by name: what `specrt compare`
    holds the engines to); the screened graph's greedy-path outputs (head_hidden, head_norms) come
    only with ``screened = True``."""
    from specrt import contracts as C

    e = small_screened
    t = e.export["target"]
    feeds = {C.INPUT_IDS: np.array([[1, 2, 3]]), C.POSITION_IDS: np.array([[0, 1, 2]]),
             **{n: np.zeros((1, 0, t["num_kv_heads"], t["head_dim"]), np.float32) for i in range(t["num_layers"])
                for n in (C.past_key(i), C.past_value(i))}}
    view = e.portable("verify.2")
    want = [o["name"] for o in e.export["graphs"]["target"]["io"]["outputs"]]
    assert sorted(view.infer(feeds)) == sorted(want)
    view.screened = True
    try:
        assert sorted(view.infer(feeds)) == sorted([*want, C.HEAD_HIDDEN, C.HEAD_NORMS])
    finally:
        view.screened = False


def test_an_export_json_rewritten_with_its_keys_in_another_order_still_loads(engines_copy):
    """m78e-11 (specrt/manifest.py manifest_digest: keys hashed in their written order): the digest
    that ties engines to their export, and the binding receipt's id, are of export.json's content;
    the file re-saved by a JSON tool that orders keys (``jq -S``, an editor's formatter) is the
    same export, and loads (it was refused as "differs from the export these engines were built
    from")."""
    import json

    from specrt.engines import load_engines

    p = engines_copy / "export" / "export.json"
    m = json.loads(p.read_text())
    assert list(m) != sorted(m)
    p.unlink()  # (a new file: the export beside the engines may be hard-linked)
    p.write_text(json.dumps(m, sort_keys=True, indent=1))
    assert load_engines(engines_copy).depths == (1, 2, 4, 8)


def test_a_malformed_onnxruntime_field_is_the_manifests_fault_with_overrides_given_too(engines_copy):
    """m78e-12 (engine_set.py _make_runners: an override's refusal said as the caller's without
    asking whether the engines' own settings are sound): engines.json's 'onnxruntime' edited bad
    and a sound override given at load (a bench's ``sessions``) was said as
    "ort_overrides={'sessions': ...}: ...", sending the user to their argument; it names the
    manifest's field, as without the override."""
    import re

    from specrt.engines import load_engines
    from specrt.errors import UserError

    from .conftest import edit_manifest

    edit_manifest(engines_copy, lambda m: m["onnxruntime"].update(extra=[["a", "b"]]))
    for overrides in (None, {"sessions": "per-depth"}):
        with pytest.raises(UserError, match=f"^{re.escape(str(engines_copy / 'engines.json'))}: field 'onnxruntime' "
                                            r"is malformed \(onnxruntime extra \[\['a', 'b'\]\]: expected an object"):
            load_engines(engines_copy, verify=False, ort_overrides=overrides)


def test_edited_kv_aliases_are_named_as_the_field_that_differs(engines_copy):
    """m78e-13 (engines/manifest.py check_against_export: 'aliases' left out of the parts of the
    target's I/O compared one by one): engines.json's in-place KV aliases edited were said as the
    whole 'graphs.target.io', not the part that differs."""
    import re

    from specrt.engines import load_engines
    from specrt.errors import UserError

    from .conftest import edit_manifest

    edit_manifest(engines_copy, lambda m: m["graphs"]["target"]["io"].update(aliases={}))
    with pytest.raises(UserError, match=f"^{re.escape(str(engines_copy / 'engines.json'))}: field "
                                        "'graphs.target.io.aliases' is not the in-place target graph's I/O"):
        load_engines(engines_copy, verify=False)


def test_a_drafts_attention_window_edited_is_refused(tiny_export, tmp_path):
    """m78e's sm26, left at its stop (specrt/manifest.py check_export: draft.attention_window left
    out of the fields held to the binding receipt): export.json's draft window changed by hand loaded,
    and a build would size the draft's attention from it."""
    import json
    import re
    import shutil

    from specrt.errors import UserError
    from specrt.manifest import load_export

    exp = tmp_path / "exp"
    shutil.copytree(tiny_export, exp)
    m = json.loads((exp / "export.json").read_text())
    was = m["draft"].get("attention_window")
    m["draft"]["attention_window"] = 7 if was != 7 else 9
    (exp / "export.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=f"^{re.escape(str(exp / 'export.json'))}: field 'draft.attention_window'"):
        load_export(exp)


def test_a_folder_in_place_of_the_manifest_is_said_as_an_incomplete_folder(tiny_export, tmp_path):
    """m78e's sm29, left at its stop (specrt/manifest.py read_manifest: `is_file` -> `exists`): a folder
    named export.json (a copy gone wrong) is not the manifest; said as a folder without it, not read
    (an IsADirectoryError traceback on the mutant)."""
    import re
    import shutil

    from specrt.errors import UserError
    from specrt.manifest import load_export

    exp = tmp_path / "exp"
    shutil.copytree(tiny_export, exp)
    (exp / "export.json").unlink()
    (exp / "export.json").mkdir()
    with pytest.raises(UserError, match=f"^{re.escape(str(exp))}: not a complete .* folder \\(no export.json\\)"):
        load_export(exp)
