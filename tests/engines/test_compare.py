"""``specrt compare``: good engines pass against ONNX Runtime and torch, one changed weight is
caught with its role and output named (CLI exit 1), and the printed polygraphy command and its
saved inputs work with polygraphy itself."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specrt import contracts as C
from specrt.cmd_compare import compare, parse_tolerances
from specrt.engines.compare import (LAST_ROW, TARGET_WEIGHTS, TREE, TokenCompare, compare_engines,
                                    resolve_tolerances)
from specrt.errors import UserError

from .conftest import DEPTHS, quiet

pytest.importorskip("polygraphy")

TARGET_ROLES = {"prefill", "decode"} | {f"verify.{d}" for d in DEPTHS}


def cli():
    """The compare command under specrt's own group (user errors -> exit 1, no traceback)."""
    from specrt.cli import _Group

    group = _Group("specrt")
    group.add_command(compare)
    return group


def corrupt_engine(folder: Path, initializer: str = "lm_head", delta: float = 1.0) -> None:
    """ONE weight element of the target engine changed, recorded in engines.json's hashes as a
    build would record it (tools/corrupt_engine.py): only the comparison can catch it."""
    from tests.real_model import tool

    tool("corrupt_engine").corrupt(folder, initializer, delta)


def test_good_engines_pass_against_onnxruntime(tiny_engines, tmp_path):
    lines: list[str] = []
    r = compare_engines(tiny_engines, report=tmp_path / "r.json", log=lines.append)
    assert r["passed"] and not r["failures"]
    assert set(r["roles"]) == TARGET_ROLES | {"draft"}
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(json.dumps(r))
    v = r["roles"]["verify.4"]
    assert v["input_shapes"][0][C.INPUT_IDS] == [1, 5] and v["input_shapes"][0][C.past_key(0)] == [1, 32, 2, 16]
    assert {C.LOGITS, C.AUX_HIDDEN, C.new_key(3), C.new_value(0)} <= set(v["outputs"])
    assert v["outputs"][C.LOGITS]["max_abs"] <= 1e-4 and v["outputs"][C.LOGITS]["atol"] == 1e-4
    assert v["outputs"][C.LOGITS]["tol_ratio"] <= 1
    assert r["roles"]["prefill"]["iterations"] == 2  # from scratch, then a chunk over a real past
    tok = r["roles"]["draft"]["outputs"][C.DRAFT_TOKENS]
    assert tok["passed"] and tok["agreement"] == 1.0 and tok["rows"] == 2 * max(DEPTHS)
    text = "\n".join(lines)
    assert all(f"\n{role}" in text for role in TARGET_ROLES | {"draft"})
    assert "new_key.* (4, worst" in text and "PASSED" in text


def test_the_prefills_last_row_alone_is_compared(tiny_engines, tmp_path):
    """The runtime's prefill asks the in-place engine for its last row's logits only
    (logits_from = S - 1): that path is compared with the reference's last row."""
    r = compare_engines(tiny_engines, log=quiet, inputs_file=tmp_path / "in.json")
    last = r["roles"]["prefill"]["outputs"][LAST_ROW]
    assert last["passed"] and last["atol"] == r["roles"]["prefill"]["outputs"][C.LOGITS]["atol"]
    assert 0 <= last["max_abs"] <= last["atol"]


def test_good_engines_pass_against_torch(tiny_engines, tmp_path):
    pytest.importorskip("transformers")
    lines: list[str] = []
    r = compare_engines(tiny_engines, reference="torch", report=tmp_path / "t.json", log=lines.append)
    assert r["passed"], r["summary"]
    assert set(r["roles"]) == TARGET_ROLES
    assert "draft" in r["skipped"] and "target roles only" in r["skipped"]["draft"]
    assert any(line.startswith("draft: skipped") for line in lines)
    assert r["roles"]["prefill"]["outputs"][C.AUX_HIDDEN]["atol"] == 1e-3
    assert r["roles"]["verify.8"]["logits_argmax_agreement"] == 1.0
    # the token trees too, each chain run by transformers (they were ONNX Runtime's only)
    trees = {k: v["outputs"][TREE] for k, v in r["roles"].items() if TREE in v["outputs"]}
    assert set(trees) == {"verify.4", "verify.8"} and all(t["passed"] and t["tol_ratio"] < 0.5 for t in trees.values())
    assert not any("token trees" in line for line in lines)


def test_one_changed_weight_is_caught_role_output_and_weight_named(engines_copy, tmp_path):
    """One element of the target engine's lm_head moved by 1.0 (tools/corrupt_engine.py):
    the outputs it moves fail in every target role, and the weight check names the weight
    and the element (the outputs alone named the roles and outputs only)."""
    corrupt_engine(engines_copy)
    # the hashes check out: only the numbers differ
    r = compare_engines(engines_copy, log=quiet, inputs_file=tmp_path / "in.json")
    assert not r["passed"]
    by_role: dict[str, set[str]] = {}
    for f in r["failures"]:
        by_role.setdefault(f["role"], set()).add(f["output"])
    # lm_head[0, 0] moves logit 0 only: logits fail in every target role, KV and aux do not,
    # and the draft (its own graph, fed the prefill's unchanged aux) passes
    # (the prefill's last row asked for alone, as the runtime does, fails too)
    # (and the token trees of verify.4 / verify.8, whose rows are those logits too)
    assert by_role == {role: {C.LOGITS, *([LAST_ROW, TARGET_WEIGHTS] if role == "prefill" else []),
                              *([TREE] if role in ("verify.4", "verify.8") else [])} for role in TARGET_ROLES}
    w = r["roles"]["prefill"]["outputs"][TARGET_WEIGHTS]
    assert [b["weight"] for b in w["bad"]] == ["lm_head"] and w["bad"][0]["problem"].startswith("element 0 is ")
    assert w["weights"] > 10 and "'lm_head' element 0 is " in r["summary"]
    assert r["roles"]["draft"]["passed"]
    assert all(f["max_abs"] > f["atol"] and f["tol_ratio"] > 1 for f in r["failures"] if f["output"] != TARGET_WEIGHTS)
    # the worst-element ratio agrees with polygraphy's elemwise verdict on every output
    for role in TARGET_ROLES:
        for o in r["roles"][role]["outputs"].values():
            assert o.get("kind") == TARGET_WEIGHTS or o["passed"] == (o["tol_ratio"] <= 1)

    res = CliRunner().invoke(cli(), ["compare", str(engines_copy), "--report", str(tmp_path / "bad.json")])
    assert res.exit_code == 1, res.output
    assert "error:" in res.output and "prefill logits (max abs" in res.output and "Traceback" not in res.output
    assert res.output.count("prefill logits (max abs") == 1  # the summary once (the error line repeated it)
    assert "error: the engines differ from the onnxruntime reference in " in res.output
    assert json.loads((tmp_path / "bad.json").read_text())["passed"] is False


def test_an_export_weight_no_engine_weight_reads_is_named(tmp_path):
    """check_target_weights' second half: a weight of the export's that no engine weight is made
    from (a layer's norm dropped by a build) fails, named; a mutant that skipped the loop
    survived every test (all corrupted an existing weight)."""
    import onnx
    from onnx import helper, numpy_helper

    from specrt.engines.compare import check_target_weights

    def graph(path, weights):
        inits = [numpy_helper.from_array(np.full((2, 2), v, np.float32), n) for n, v in weights.items()]
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2])
        nodes = [helper.make_node("Add", ["x", n], [f"y{i}"]) for i, n in enumerate(weights)]
        outs = [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, [2, 2]) for i in range(len(weights))]
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits)), path)

    graph(tmp_path / "x.onnx", {"embed": 1.0, "norm": 2.0})
    graph(tmp_path / "e.onnx", {"embed": 1.0})
    r = check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")
    assert not r["passed"] and r["weights"] == 1
    assert r["bad"] == [{"weight": "norm", "problem": "the export's weight is in no weight of e.onnx"}]
    graph(tmp_path / "e.onnx", {"embed": 1.0, "norm": 2.0})
    assert check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")["passed"]


def test_a_loose_enough_tolerance_passes_the_outputs_not_the_weights(engines_copy, tmp_path):
    """A tolerance loose enough passes the outputs a small weight change moved; the weight
    check, exact, still names the weight (it has no tolerance: an fp32 ONNX Runtime engine
    holds the export's weights, or is not the export's engine)."""
    corrupt_engine(engines_copy, delta=1e-3)
    r = compare_engines(engines_copy, log=quiet, inputs_file=tmp_path / "in.json")
    assert {f["output"] for f in r["failures"]} >= {C.LOGITS, TARGET_WEIGHTS}
    res = CliRunner().invoke(cli(), ["compare", str(engines_copy), "--atol", "logits:1", "--rtol", "logits:1",
                                     "--save-inputs", str(tmp_path / "in.json"), "--report", str(tmp_path / "r.json")])
    assert res.exit_code == 1 and "in 1 check(s)" in res.output, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert [(f["role"], f["output"]) for f in r["failures"]] == [("prefill", TARGET_WEIGHTS)]
    assert "'lm_head': element 0 is " in res.output


def _polygraphy(argv: list[str]) -> int:
    """polygraphy's own command line, in this process; its exit status."""
    from polygraphy.tools._main import main as polygraphy_main

    try:
        return polygraphy_main(argv) or 0
    except SystemExit as e:
        return int(e.code or 0)


def test_the_printed_polygraphy_command_reproduces_the_comparison(tiny_engines, engines_copy, tmp_path):
    """The printed line runs here as printed (ONNX Runtime only: the export's graph on the saved
    inputs, checked against the engine's saved outputs with compare's tolerances) and passes;
    on a corrupted engine it fails as compare does (it needed TensorRT before, and ran a fresh
    build rather than the engine compared)."""
    from polygraphy.json import load_json

    r = compare_engines(tiny_engines, report=tmp_path / "r.json", log=quiet)
    argv = shlex.split(r["polygraphy_command"])
    assert argv[1:4] == ["run", str(tiny_engines / "export" / "target.onnx"), "--onnxrt"]
    # the polygraphy this Python has, where the shell would not find the bare name (a venv not activated)
    assert argv[0] == "polygraphy" if shutil.which("polygraphy") else Path(argv[0]).is_file()
    assert argv[argv.index("--load-inputs") + 1] == r["inputs_file"]
    assert argv[argv.index("--load-outputs") + 1] == r["outputs_file"]
    # the saved inputs load with polygraphy's load_json and are the verify.8 feeds
    feeds = load_json(r["inputs_file"])
    assert len(feeds) == 1 and feeds[0][C.INPUT_IDS].shape == (1, 9)
    assert np.array_equal(feeds[0][C.POSITION_IDS], np.arange(32, 41)[None])
    assert feeds[0][C.past_key(0)].shape == (1, 32, 2, 16) and feeds[0][C.past_key(0)].dtype == np.float32
    assert _polygraphy(argv[1:]) == 0

    assert r["polygraphy_role"] == "verify.8"  # all passed: the deepest verify

    corrupt_engine(engines_copy)
    bad = compare_engines(engines_copy, report=tmp_path / "bad.json", log=quiet)
    # the first role that failed (a user walk: it repeated verify.8 whatever failed, and passed when pasted)
    assert bad["polygraphy_role"] == bad["failures"][0]["role"] == "prefill"
    assert not bad["passed"] and _polygraphy(shlex.split(bad["polygraphy_command"])[1:]) != 0


def test_eagle3_draft_is_compared(tmp_path):
    pytest.importorskip("transformers")
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "target")
    d = write_tiny_draft(tmp_path / "draft", t, kind="eagle3")
    export(t, d, tmp_path / "export")
    build_engines(tmp_path / "export", "onnxruntime", (1, 2), tmp_path / "engines", log=quiet, profile_repeats=1)
    r = compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=8, inputs_file=tmp_path / "in.json")
    assert r["passed"], r["summary"]
    shapes = r["roles"]["draft"]["input_shapes"]
    assert shapes[0][C.INPUT_IDS] == [1, 8] and shapes[1][C.INPUT_IDS] == [1, 1]  # A = 8; then one step, B = 1
    assert shapes[1][C.past_key(0)][1] == 8
    assert r["roles"]["draft"]["outputs"][C.DRAFT_HIDDEN_OUT]["passed"]


def test_token_ids_pass_on_a_tie_only():
    logits = np.zeros((1, 2, 5), np.float32)
    logits[0, 0, [1, 3]] = 2.0  # row 0: tokens 1 and 3 tie
    logits[0, 1, 2] = 3.0  # row 1: token 2 clearly
    ref = {C.DRAFT_LOGITS: logits, C.DRAFT_TOKENS: np.array([[1, 2]])}
    flipped = logits.copy()
    flipped[0, 0, 3] += 1e-6  # the engine breaks the tie the other way
    tied = {C.DRAFT_LOGITS: flipped, C.DRAFT_TOKENS: np.array([[3, 2]])}
    wrong = {C.DRAFT_LOGITS: logits, C.DRAFT_TOKENS: np.array([[1, 4]])}
    m = TokenCompare((1e-4, 1e-4))(tied, ref)[C.DRAFT_TOKENS]
    assert m and (m.agree, m.ties) == (1, 1)
    m = TokenCompare((1e-4, 1e-4))(wrong, ref)[C.DRAFT_TOKENS]
    assert not m and (m.agree, m.ties) == (1, 0)  # same logits, other id: the id output is wrong
    far = flipped.copy()
    far[0, 0, 3] += 1.0
    m = TokenCompare((1e-4, 1e-4))({C.DRAFT_LOGITS: far, C.DRAFT_TOKENS: np.array([[3, 2]])}, ref)[C.DRAFT_TOKENS]
    assert not m  # the logits themselves differ: no tie


def test_token_ids_of_another_length_fail():
    """An engine that returns fewer draft tokens than the reference fails, every reference
    row counted as not agreeing (not an empty, vacuously passing comparison)."""
    ref = {C.DRAFT_LOGITS: np.zeros((1, 2, 5), np.float32), C.DRAFT_TOKENS: np.array([[1, 2]])}
    short = {C.DRAFT_LOGITS: np.zeros((1, 1, 5), np.float32), C.DRAFT_TOKENS: np.array([[1]])}
    m = TokenCompare((1e-4, 1e-4))(short, ref)[C.DRAFT_TOKENS]
    assert not m and (m.rows, m.agree, m.ties) == (2, 0, 0)


def test_the_worst_element_ratio_is_polygraphys_elemwise_verdict():
    """tolerance_ratio (the report's worst/tol, and the verdict of the last-row and tree
    checks) passes exactly where polygraphy's elemwise check does: |a - b| <= atol or
    <= rtol x |b|, b the reference (polygraphy's second output); a NaN never passes."""
    from polygraphy.comparator import Comparator
    from polygraphy.comparator.struct import IterationResult, RunResults

    from specrt.engines.compare import _simple_compare, tolerance_ratio

    def polygraphy_passes(a, b, atol, rtol):
        rr = RunResults([("eng", [IterationResult({C.LOGITS: a}, runner_name="eng")]),
                         ("ref", [IterationResult({C.LOGITS: b}, runner_name="ref")])])
        acc = Comparator.compare_accuracy(rr, compare_func=[_simple_compare({C.LOGITS: (atol, rtol)})])
        return bool(acc[0][("eng", "ref")][0][C.LOGITS])

    one, two = np.array([1.0]), np.array([2.0])
    assert tolerance_ratio(two, one, 1e-4, 0.6) == pytest.approx(1 / 0.6)  # relative to the reference's 1
    assert tolerance_ratio(one, two, 1e-4, 0.6) == pytest.approx(1 / 1.2)  # ... to its 2
    assert not polygraphy_passes(two, one, 1e-4, 0.6) and polygraphy_passes(one, two, 1e-4, 0.6)
    assert tolerance_ratio(one + 5e-5, one, 1e-4, 0.0) == pytest.approx(0.5)  # within atol alone
    assert tolerance_ratio(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), 1e-4, 1e-4) == np.inf
    rng = np.random.default_rng(0)
    b = rng.normal(0, 3, 2000)
    a = b + rng.normal(0, 1e-3, 2000) * rng.choice([0.01, 1.0, 30.0], 2000)
    for atol, rtol in ((1e-3, 1e-3), (1e-4, 1e-2), (1e-2, 0.0), (0.0, 1e-2)):
        for k in range(0, 2000, 100):
            assert (tolerance_ratio(a[k:k + 100], b[k:k + 100], atol, rtol) <= 1.0) == \
                polygraphy_passes(a[k:k + 100], b[k:k + 100], atol, rtol), (atol, rtol, k)


def _graph(path: Path, shift_above: float | None) -> Path:
    """A one-op ONNX graph logits = x (+ relu(x - shift_above): off only for large inputs)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, [1, 4])
    if shift_above is None:
        nodes, inits = [helper.make_node("Identity", ["x"], [C.LOGITS])], []
    else:
        inits = [helper.make_tensor("c", TensorProto.FLOAT, [], [shift_above])]
        nodes = [helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
                 helper.make_node("Add", ["x", "r"], [C.LOGITS])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_role_fails_when_one_iteration_fails_and_when_an_output_never_comes(tmp_path):
    """compare_role over real ONNX Runtime runners: an engine that agrees on the first call
    and is off by 10 on the second fails (every iteration must pass, not any); draft token
    ids that neither side ever returns fail too (nothing compared is not a pass)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    eng = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "e.onnx", 10.0))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "r.onnx", None))), name="reference")
    small, large = np.zeros((1, 4), np.float32), np.full((1, 4), 20.0, np.float32)
    tol = {C.LOGITS: (1e-4, 1e-4)}
    r = compare_role("decode", eng, ref, [{"x": small}, {"x": small}], tol, [C.LOGITS])
    assert r["passed"] and r["outputs"][C.LOGITS]["tol_ratio"] == 0  # the graphs agree below 10
    r = compare_role("decode", eng, ref, [{"x": small}, {"x": large}], tol, [C.LOGITS])
    assert not r["passed"] and not r["outputs"][C.LOGITS]["passed"]
    r = compare_role("draft", eng, ref, [{"x": small}], tol, [C.LOGITS, C.DRAFT_TOKENS])
    assert r["outputs"][C.LOGITS]["passed"] and not r["outputs"][C.DRAFT_TOKENS]["passed"] and not r["passed"]


def test_tolerance_options():
    assert parse_tolerances(("1e-3", "logits:0.5", "new_key.3:2"), "--atol") == {"": 1e-3, "logits": 0.5,
                                                                                   "new_key.3": 2.0}
    with pytest.raises(UserError, match="OUTPUT:VALUE"):
        parse_tolerances(("logits=1",), "--atol")
    tol = resolve_tolerances([C.LOGITS, C.new_key(3), C.new_key(0), C.DRAFT_TOKENS], "fp32", "onnxruntime",
                             atol={"": 1e-3, "new_key.3": 2.0}, rtol=None)
    assert tol == {C.LOGITS: (1e-3, 1e-4), C.new_key(3): (2.0, 1e-4), C.new_key(0): (1e-3, 1e-4)}
    assert resolve_tolerances([C.LOGITS], "fp16", "torch")[C.LOGITS] == (5e-2, 1e-2)


def test_user_errors(tiny_engines):
    with pytest.raises(UserError, match="unknown output"):
        compare_engines(tiny_engines, atol={"logit": 1.0}, log=quiet)
    with pytest.raises(UserError, match="--reference"):
        compare_engines(tiny_engines, reference="tensorrt", log=quiet)
    res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--reference", "torch", "--target",
                                     str(tiny_engines)])
    assert res.exit_code == 1 and "not a transformers checkpoint" in res.output


def test_a_torch_reference_from_another_checkpoint_is_refused(tiny_engines, tmp_path):
    """--reference torch --target DIR: a checkpoint other than the exported one (one weight
    changed, or another shape) is named before any comparison (a changed weight failed
    every comparison as if the engines were wrong; another width crashed with a traceback)."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from tests.engines.conftest import REFERENCE
    from tests.fixtures_models import write_tiny_target

    other = tmp_path / "other"
    shutil.copytree(REFERENCE / "verifier", other)
    (f,) = other.glob("*.safetensors")
    x = load_file(str(f))
    name = next(k for k in x if k.endswith("post_attention_layernorm.weight"))
    x[name] = x[name] * 1.5
    save_file(x, str(f), metadata={"format": "pt"})
    wide = write_tiny_target(tmp_path / "wide", "llama", vocab_size=500)
    # another family (a user walk: Qwen3's q_norm / k_norm slots made it "42 of 39 target slots")
    qwen = write_tiny_target(tmp_path / "qwen", "qwen3")
    n = len(json.loads((tiny_engines / "export" / "export.json").read_text())["binding_receipt"]["target"]["slots"])
    for folder, words in ((other, f"1 of the {n} target slots hold other tensors than the export's binding receipt "
                                  f"records (first: '{name.replace('model.', '').split('.post')[0]}"),
                          (wide, "not the checkpoint these engines were exported from"),
                          (qwen, f"of the {n} target slots hold other tensors than the export's binding receipt "
                                 "records (first: 'embed'); ")):
        res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--reference", "torch", "--target", str(folder)])
        assert res.exit_code == 1 and words in res.output and "Traceback" not in res.output, res.output
    res2 = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--target", str(other)])  # (ignored before)
    assert res2.exit_code == 1 and f"--target {other}: the checkpoint of the torch reference; give --reference " \
        "torch with it" in res2.output, res2.output
    changed = int(res.output.split(f" of the {n} target slots")[0].rsplit(" ", 1)[1])
    assert changed <= n and " slots are not the export's (first: 'layers.0." in res.output, res.output
    # a target the export read from pickles (--allow-pickle): not bound again here (that would
    # unpickle it unasked); transformers loads it for the reference as before
    from specrt.engines.compare import check_same_target

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((REFERENCE / "verifier" / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    check_same_target(pickled, json.loads((tiny_engines / "export" / "export.json").read_text())
                      if (tiny_engines / "export" / "export.json").is_file() else
                      {"binding_receipt": {"target": {"slots": {"embed": {"sha256": "0"}}}}})


@pytest.mark.parametrize("value", ["nan", "logits:nan", "-1", "inf"])
def test_a_tolerance_must_be_finite_and_not_negative(value):
    """A NaN tolerance made every comparison pass (polygraphy: absdiff > nan is false)."""
    from specrt.cmd_compare import parse_tolerances
    from specrt.engines.compare import resolve_tolerances

    with pytest.raises(UserError, match="expected a finite tolerance >= 0"):
        parse_tolerances((value,), "--atol")
    with pytest.raises(UserError, match="atol nan for logits: expected a finite tolerance >= 0"):
        resolve_tolerances(["logits"], "fp32", "onnxruntime", atol=float("nan"))
    with pytest.raises(UserError, match="rtol inf for logits"):
        resolve_tolerances(["logits"], "fp32", "onnxruntime", rtol={"logits": float("inf")})


def test_report_and_saved_inputs_need_files_of_their_own(tiny_engines, tmp_path):
    """--report and --save-inputs on one path: the report replaced the inputs the printed
    command loads (found by review); also where the engine's saved outputs would go."""
    for report, inputs in (("x.json", "x.json"), ("r.outputs.json", "r.inputs.json")):
        res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--report", str(tmp_path / report),
                                         "--save-inputs", str(tmp_path / inputs)])
        assert res.exit_code == 1 and "name the same file" in res.output and "Traceback" not in res.output, res.output
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_compared_in_units_of_their_rows_scale():
    """fp32 rounding grows with the values a row holds: SmolLM2's prefill at 400 prompt
    tokens (logits rows of RMS ~7, hidden states of 13-15 with one value past 22,000)
    differed from the reference by 1.2e-4 / 4e-4 in small elements and failed atol 1e-4
    (`specrt compare --prompt-tokens 400` on the demo's engines). Each row is divided by
    its scale first, max(1, 1.4826 x median |value|): rows of spread at most 1 are compared
    as they are, and one huge value (real hidden states have them) does not loosen its row."""
    from polygraphy.comparator import Comparator
    from polygraphy.comparator.struct import IterationResult, RunResults

    from specrt.engines.compare import _simple_compare, scale_rows

    ref = np.array([[[700.0, 0.5, -700.0], [0.5, 0.25, 0.1]]])
    eng = ref + np.array([[[0.0, 2e-4, 0.0], [0.0, 0.0, 0.0]]])
    small = ref + np.array([[[0.0, 0.0, 0.0], [0.0, 2e-4, 0.0]]])

    def verdict(a, scaled):
        rr = RunResults([("eng", [IterationResult({C.LOGITS: a}, runner_name="eng")]),
                         ("ref", [IterationResult({C.LOGITS: ref}, runner_name="ref")])])
        if scaled:
            rr = scale_rows(rr, "ref", {C.LOGITS: True})
        acc = Comparator.compare_accuracy(rr, compare_func=[_simple_compare({C.LOGITS: (1e-4, 1e-4)})])
        return bool(acc[0][("eng", "ref")][0][C.LOGITS])

    assert not verdict(eng, False) and verdict(eng, True)  # 2e-4 in a row of spread ~1000: within scale
    assert not verdict(small, True)  # 2e-4 in a row of spread < 1: still a failure
    # ... and not a scale below 1: 9e-5 in that row passes as it does unscaled (9e-5 / 0.37
    # of its median-based spread would not)
    assert verdict(ref + np.array([[[0.0, 0.0, 0.0], [0.0, 9e-5, 0.0]]]), True)
    ref = np.array([[[22000.0, 0.5, 0.3, 0.2, -0.4]]])  # one massive activation in a small row
    assert not verdict(ref + np.array([[[0.0, 2e-4, 0.0, 0.0, 0.0]]]), True)


def test_runs_without_a_report_keep_their_own_files_in_one_temporary_folder(tiny_engines, tmp_path, monkeypatch):
    """Without --report or --save-inputs the by-hand command's files go to one temporary
    folder per engines folder (each run made a new one: 3.6 MB on SmolLM2, piling up; found
    by review), each run's files under names of their own (two runs at once wrote one
    inputs.json: the command one printed ran the other's inputs; found by review), the
    oldest pairs past KEEP_RUNS removed."""
    import tempfile

    from polygraphy.json import load_json

    from specrt.engines import compare as compare_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(compare_module, "KEEP_RUNS", 2, raising=False)
    a = compare_engines(tiny_engines, log=quiet, prompt_tokens=8)
    b = compare_engines(tiny_engines, log=quiet, prompt_tokens=12)
    assert a["inputs_file"] != b["inputs_file"] and a["outputs_file"] != b["outputs_file"]
    assert Path(a["inputs_file"]).parent == Path(b["inputs_file"]).parent
    assert len(list(tmp_path.glob("specrt-compare-*"))) == 1
    for r, n in ((a, 8), (b, 12)):  # each printed command's files are its own run's
        assert f"--load-inputs {r['inputs_file']} " in r["polygraphy_command"]
        assert np.array_equal(load_json(r["inputs_file"])[0][C.POSITION_IDS], np.arange(n, n + 9)[None])
        assert Path(r["outputs_file"]).is_file()
    c = compare_engines(tiny_engines, log=quiet, prompt_tokens=8)
    assert not Path(a["inputs_file"]).exists() and not Path(a["outputs_file"]).exists()
    folder = Path(c["inputs_file"]).parent
    assert sorted(folder.iterdir()) == sorted(
        [folder / "compared.json"] + [Path(r[k]) for r in (b, c) for k in ("inputs_file", "outputs_file")])


def test_temporary_folders_of_engines_folders_gone_are_removed(engines_copy, tiny_engines, tmp_path, monkeypatch):
    """Each compared engines folder kept a temporary folder of its by-hand files, and those of
    engines folders since removed piled up (46 folders in /tmp on a host of session 56): a
    run removes this user's folders whose recorded engines folder is gone, and keeps the
    others, those without a record (older runs') and those not its own (a link, a file)."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    gone = Path(compare_engines(engines_copy, log=quiet, prompt_tokens=8)["inputs_file"]).parent
    assert json.loads((gone / "compared.json").read_text()) == {"engines": str(engines_copy.resolve())}
    kept = Path(compare_engines(tiny_engines, log=quiet, prompt_tokens=8)["inputs_file"]).parent
    assert gone.is_dir() and kept != gone  # its engines still there: kept
    uid = os.getuid()
    old = tmp_path / "t" / f"specrt-compare-{uid}-0123456789ab"  # a folder of an older run: no record
    old.mkdir()
    (tmp_path / "t" / f"specrt-compare-{uid}-link").symlink_to(gone)  # not a real folder: left
    other = tmp_path / "t" / f"specrt-compare-{uid}1-0123456789ab"  # another uid's name
    other.mkdir()
    (other / "compared.json").write_text(json.dumps({"engines": str(tmp_path / "nowhere")}))
    shutil.rmtree(engines_copy)
    again = Path(compare_engines(tiny_engines, log=quiet, prompt_tokens=8)["inputs_file"]).parent
    assert again == kept and not gone.exists() and old.is_dir() and other.is_dir()
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(
        [kept.name, old.name, other.name, f"specrt-compare-{uid}-link"])


def test_a_runs_own_file_keeps_the_newest_pairs_and_skips_vanished_ones(tmp_path):
    """_own_inputs_file: the newest KEEP_RUNS - 1 earlier pairs (by modification time) stay,
    older ones go with their outputs; a name that vanishes while listed (another run
    removing it: here a dangling link) is passed over; no descriptor is left open."""
    import os

    from specrt.engines.compare import KEEP_RUNS, _own_inputs_file, outputs_file_for

    assert KEEP_RUNS == 4
    (tmp_path / "inputs.gone.json").symlink_to(tmp_path / "nowhere")
    fds = len(os.listdir("/proc/self/fd"))
    made = []
    for i in range(KEEP_RUNS):  # 0 to 3 earlier pairs: every one kept
        f = _own_inputs_file(tmp_path)
        assert all(g.is_file() and outputs_file_for(g).is_file() for g in made), i
        assert f.name.startswith("inputs.") and f.name.endswith(".json") and f.is_file() and f not in made
        outputs_file_for(f).write_text("{}")
        os.utime(f, (1000 + i, 1000 + i))
        made.append(f)
    assert len(os.listdir("/proc/self/fd")) == fds
    (tmp_path / "inputs.gone.json").unlink()
    newest = _own_inputs_file(tmp_path)  # 4 earlier: the oldest goes, with its outputs
    assert sorted(tmp_path.iterdir()) == sorted([newest] + [g for f in made[1:] for g in (f, outputs_file_for(f))])


def test_a_token_tree_is_compared_against_its_chains(tiny_engines, tmp_path):
    """`auto` verifies a token tree every round (dspark:tree=3): `specrt compare` never fed
    one, so an engine whose tree mask went wrong on a user's machine passed while its
    greedy output changed. Verify roles of depth 3+ now run a chain and two siblings of its
    first draft in one call against each chain run by the reference; an engine that lays the
    siblings out as the chain's continuation (ignoring the tree) fails it."""
    from specrt.engines import load_engines
    from specrt.engines.compare import tree_check

    r = compare_engines(tiny_engines, log=quiet, inputs_file=tmp_path / "in.json")
    assert r["passed"] and {k for k, v in r["roles"].items() if TREE in v["outputs"]} == {"verify.4", "verify.8"}
    t = r["roles"]["verify.4"]["outputs"][TREE]
    assert t["passed"] and (t["rows"], t["drafts"], t["siblings"]) == (5, 2, 2) and t["tol_ratio"] < 0.1

    class Chain:  # the tree's rows laid out as one chain: what an engine ignoring the tree computes
        def __init__(self, view):
            self.view = view

        def infer_impl(self, feeds):
            pos = feeds[C.POSITION_IDS]
            return self.view.infer_impl({**feeds, C.POSITION_IDS: pos[:, :1] + np.arange(pos.shape[1])[None]})

    from specrt.engines.compare import RoleInputs, resolve_tolerances
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    with load_engines(tiny_engines) as e:
        feeds = RoleInputs(e, 32).feeds("verify.4")[0]
        outputs = [o.name for o in e.portable("verify.4").get_output_metadata()]
        tol = resolve_tolerances(outputs, e.precision, "onnxruntime")
        ref = OnnxrtRunner(SessionFromOnnx(str(e.export_dir / "target.onnx"), providers=["cpu"])(), name="ref")
        assert tree_check(e.portable("verify.4"), ref, feeds, tol)["passed"]
        bad = tree_check(Chain(e.portable("verify.4")), ref, feeds, tol)
        assert not bad["passed"] and bad["tol_ratio"] > 1
        if importlib.util.find_spec("transformers"):  # and against transformers, chain by chain
            from specrt.engines.compare import load_torch_target, torch_target_runner

            model = load_torch_target(Path(e.export["binding_receipt"]["target"]["folder"]), e.export)
            meta = e.portable("verify.4").get_input_metadata()
            tol_t = resolve_tolerances(outputs, e.precision, "torch")
            ref_t = torch_target_runner(model, meta, tuple(e.export["target"]["aux_layer_ids"]), "torch")
            assert tree_check(e.portable("verify.4"), ref_t, feeds, tol_t)["passed"]
            assert not tree_check(Chain(e.portable("verify.4")), ref_t, feeds, tol_t)["passed"]


def test_the_temporary_folder_is_never_one_planted_by_another_user(tiny_engines, tmp_path, monkeypatch):
    """The reused folder's name is predictable (engines path, uid): a link or a folder of
    another user's planted there must not receive the by-hand command's files."""
    import hashlib
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    where = hashlib.sha256(str(Path(tiny_engines).resolve()).encode()).hexdigest()[:12]
    name = tmp_path / f"specrt-compare-{os.getuid()}-{where}"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    name.symlink_to(theirs)
    r = compare_engines(tiny_engines, log=quiet)
    assert Path(r["inputs_file"]).is_file() and not any(theirs.iterdir())
    name.unlink()
    name.mkdir()
    name.chmod(0o777)  # a folder anyone can write
    r = compare_engines(tiny_engines, log=quiet)
    assert Path(r["inputs_file"]).parent != name and not any(name.iterdir())
    name.chmod(0o700)  # our own: reused, as before
    assert Path(compare_engines(tiny_engines, log=quiet)["inputs_file"]).parent == name


@pytest.mark.parametrize("raised, printed", [("KeyboardInterrupt", "INTERRUPTED"),
                                             ("OSError('libcudnn.so.9: cannot open shared object file')", "COMPLETED")])
def test_an_interrupt_in_the_torch_import_stops_compare(tiny_engines, tmp_path, raised, printed):
    """polygraphy's first array check imports torch inside a bare ``except:``; a Ctrl-C or
    SIGTERM landing in that import (seconds long) was swallowed, the comparison went on and
    crashed with SIGSEGV on the half-imported torch (session 55's interruption walk).
    compare imports torch itself first: here the import is made to raise KeyboardInterrupt,
    which must stop compare, not be taken for "torch is not importable". A torch installed but
    broken (a CUDA wheel missing its libraries) is still not needed by the onnxruntime
    reference: compare goes on, as polygraphy took it (a review of session 55's first mend)."""
    import subprocess
    import sys

    code = f"""
import importlib.abc, sys
class Interrupting(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise {raised}
sys.modules.pop("torch", None)
sys.meta_path.insert(0, Interrupting())
from specrt.engines.compare import compare_engines
try:
    compare_engines({str(tiny_engines)!r}, report={str(tmp_path / 'r.json')!r}, log=lambda s: None)
    print("COMPLETED")
except KeyboardInterrupt:
    print("INTERRUPTED")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.stdout.strip() == printed and (tmp_path / "r.json").exists() == (printed == "COMPLETED"), (
        r.stdout, r.stderr[-2000:])


def test_the_by_hand_files_are_whole_or_as_before(tiny_engines, tmp_path, monkeypatch):
    """compare's inputs and outputs for the printed polygraphy command were written in place:
    an interrupt mid-write left a 0-byte outputs file, or new inputs beside old outputs, that
    the report named (session 55's interruption walk). Each is written whole or not at all
    (paths.atomic_file), which keeps a --save-inputs link a link and a file's mode."""
    import specrt.engines.compare as compare_module

    report = tmp_path / "r.json"
    first = compare_engines(tiny_engines, report=report, log=quiet)
    files = [Path(first["inputs_file"]), Path(first["outputs_file"])]
    before = [f.read_bytes() for f in files]
    assert all(before)
    from specrt.paths import umask

    assert [f.stat().st_mode & 0o777 for f in files] == [0o666 & ~umask()] * 2  # (as an open() would make them)
    whole = compare_module.atomic_file

    @contextlib.contextmanager
    def cut(path):  # half written, then Ctrl-C
        with whole(path) as f:
            f.write(b"{")
            raise KeyboardInterrupt
            yield f

    monkeypatch.setattr(compare_module, "atomic_file", cut)
    with pytest.raises(KeyboardInterrupt):
        compare_engines(tiny_engines, report=report, log=quiet)
    monkeypatch.undo()
    assert [f.read_bytes() for f in files] == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", *(f.name for f in files)])
    # --save-inputs through a link: the file it names is written, the link stays; its mode kept
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("{}")
    real.chmod(0o640)
    link.symlink_to(real)
    compare_engines(tiny_engines, inputs_file=link, log=quiet)
    assert link.is_symlink() and real.stat().st_size > 2 and (real.stat().st_mode & 0o777) == 0o640
