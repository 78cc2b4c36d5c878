"""``specrt compare``: good engines pass against ONNX Runtime and torch, one changed weight is
caught with its role and output named (CLI exit 1), and the printed polygraphy command and its
saved inputs work with polygraphy itself."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shlex
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specrt import contracts as C
from specrt.cmd_compare import compare, parse_tolerances
from specrt.engines.compare import (ENGINE_CALL, LAST_ROW, TARGET_WEIGHTS, TREE, TokenCompare, compare_engines,
                                    resolve_tolerances)
from specrt.errors import UserError
from tests.runtime.test_text import failing_verify  # noqa: F401  (a tiny pair whose verify.3 fails in ONNX Runtime)
from tests.runtime.test_text import overflowing  # noqa: F401  (a tiny pair whose logits overflow to +inf)

from .conftest import DEPTHS, needs_mount_namespace, quiet, without_temp_folder

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
    assert r["summary"] == "all 6 roles match the torch reference"  # (those compared, the draft skipped: mutant E47)
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
    # graph constants (const_N, numbered per graph) are no weights: neither compared nor the engine's own
    # (mutant m70b-76: the engine's const_0 listed as a weight no export weight makes)
    graph(tmp_path / "x.onnx", {"embed": 1.0, "norm": 2.0, "const_0": 5.0})
    graph(tmp_path / "e.onnx", {"embed": 1.0, "norm": 2.0, "const_0": 3.0})
    r = check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")
    assert r["passed"] and r["engine_only"] == [] and r["weights"] == 2


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
    assert argv[-2:] == ["--check-error-stat", "elemwise"]  # (mutant E37: polygraphy's default stat)
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
    # the step: the first call's last token and hidden_out at position 8 (mutants E16, E17: its first row's)
    from specrt.engines import load_engines
    from specrt.engines.compare import RoleInputs

    with load_engines(tmp_path / "engines") as e:
        first, step = RoleInputs(e, 8).feeds("draft")
        out = {k: np.array(v, copy=True) for k, v in e.portable("draft").infer(first).items()}
    assert step[C.INPUT_IDS].tolist() == [[int(out[C.DRAFT_TOKENS][0, -1])]] and step[C.POSITION_IDS].tolist() == [[8]]
    assert np.array_equal(step[C.DRAFT_PREV_HIDDEN], out[C.DRAFT_HIDDEN_OUT][:, -1:])


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
    assert tolerance_ratio(np.zeros(0), np.zeros(0), 1e-4, 1e-4) == 0.0  # nothing off (mutant E85: 1)
    # each element within one of the two, neither bound met by the worst of each (mutant E18: polygraphy's
    # "max" statistic, which failed this)
    a, b = np.array([100.5, 0.051]), np.array([100.0, 0.001])
    assert tolerance_ratio(a, b, 0.1, 0.01) <= 1.0 and polygraphy_passes(a, b, 0.1, 0.01)
    rng = np.random.default_rng(0)
    b = rng.normal(0, 3, 2000)
    a = b + rng.normal(0, 1e-3, 2000) * rng.choice([0.01, 1.0, 30.0], 2000)
    for atol, rtol in ((1e-3, 1e-3), (1e-4, 1e-2), (1e-2, 0.0), (0.0, 1e-2)):
        for k in range(0, 2000, 100):
            assert (tolerance_ratio(a[k:k + 100], b[k:k + 100], atol, rtol) <= 1.0) == \
                polygraphy_passes(a[k:k + 100], b[k:k + 100], atol, rtol), (atol, rtol, k)


def _save_graph(path: Path, nodes, inputs, outputs, inits=()) -> Path:
    """A graph of ``nodes`` saved to ``path`` (opset 17, IR 8: the small graphs below)."""
    import onnx
    from onnx import helper

    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _graph(path: Path, shift_above: float | None) -> Path:
    """A one-op ONNX graph logits = x (+ relu(x - shift_above): off only for large inputs)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, [1, 4])
    if shift_above is None:
        nodes, inits = [helper.make_node("Identity", ["x"], [C.LOGITS])], []
    else:
        inits = [helper.make_tensor("c", TensorProto.FLOAT, [], [shift_above])]
        nodes = [helper.make_node("Sub", ["x", "c"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
                 helper.make_node("Add", ["x", "r"], [C.LOGITS])]
    return _save_graph(path, nodes, [x], [y], inits)


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
    # the first iteration failing alone fails too (mutant m70b-60: the last iteration's verdict)
    r = compare_role("decode", eng, ref, [{"x": large}, {"x": small}], tol, [C.LOGITS])
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
    # a user's tolerance covers an output by its name, its kind or "" (mutant m70b-48: the kind
    # dropped, so --atol new_key:X left an int8 draft's KV bound widened by its rows' spread)
    from specrt.engines.compare import user_covers

    assert user_covers({"new_key": 1.0}, "new_key.3") and user_covers({"": 1.0}, "new_key.3")
    assert user_covers({"new_key.3": 1.0}, "new_key.3") and user_covers(1.0, "new_key.3")
    assert not user_covers({"new_value": 1.0}, "new_key.3") and not user_covers(None, "new_key.3")


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
    # said as the option it was given to (mutant m71b-97: every bad value said as --atol's)
    with pytest.raises(UserError, match=f"^--rtol '{re.escape(value)}': expected a finite tolerance >= 0$"):
        parse_tolerances((value,), "--rtol")
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


def test_report_and_saved_inputs_named_two_ways_are_one_file(tiny_engines, tmp_path, monkeypatch):
    """mutant m71b-09 (the paths compared as given, not resolved): --report r.json beside
    --save-inputs DIR/r.json, or through DIR/sub/.., is one file, refused as one path is."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    for report, inputs in (("r.json", tmp_path / "r.json"), (tmp_path / "sub" / ".." / "r.outputs.json", "r.json")):
        res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--report", str(report),
                                         "--save-inputs", str(inputs)])
        assert res.exit_code == 1 and "name the same file" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


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


def _verify4_against_the_export(e):
    """verify.4's first feeds, its tolerances against ONNX Runtime, and the export's target
    graph as the reference runner (the tree checks' setting)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import RoleInputs, resolve_tolerances

    feeds = RoleInputs(e, 32).feeds("verify.4")[0]
    outputs = [o.name for o in e.portable("verify.4").get_output_metadata()]
    tol = resolve_tolerances(outputs, e.precision, "onnxruntime")
    ref = OnnxrtRunner(SessionFromOnnx(str(e.export_dir / "target.onnx"), providers=["cpu"])(), name="ref")
    return feeds, tol, ref


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

    from specrt.engines.compare import resolve_tolerances

    with load_engines(tiny_engines) as e:
        feeds, tol, ref = _verify4_against_the_export(e)
        outputs = [o.name for o in e.portable("verify.4").get_output_metadata()]
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


def test_a_zero_tolerance_is_accepted():
    """mutant k02 (`out[name] <= 0` refused a zero tolerance): 0 is a finite tolerance >= 0,
    what the error message itself asks for (an exact comparison)."""
    from specrt.cmd_compare import parse_tolerances

    assert parse_tolerances(("0", "logits:0"), "--rtol") == {"": 0.0, "logits": 0.0}


def test_each_tolerance_option_is_named_and_passed_as_itself(tiny_engines, tmp_path):
    """mutants k07 (a bad --rtol reported as --atol), k09 (--atol and --rtol swapped on their
    way to compare_engines), k10 (--prompt-tokens' default not the 32 the help shows)."""
    res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--rtol", "logits=1"])
    assert res.exit_code == 1 and "--rtol 'logits=1': expected VALUE or OUTPUT:VALUE" in res.output, res.output
    # (mutant m71b-10: a bad --atol reported as --rtol)
    res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--atol", "logits=1"])
    assert res.exit_code == 1 and "--atol 'logits=1': expected VALUE or OUTPUT:VALUE" in res.output, res.output
    res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), "--atol", "logits:0.5", "--rtol", "new_key:0.25",
                                     "--report", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["tolerances"]["decode"][C.LOGITS] == [0.5, 1e-4]
    assert r["tolerances"]["decode"][C.new_key(0)] == [1e-4, 0.25]
    assert r["inputs"]["prompt_tokens"] == 32


def test_the_error_line_names_the_report(engines_copy, tmp_path):
    """mutant k08 (the error line's "(report: FILE)" dropped): a failing compare names where
    its report went, once."""
    corrupt_engine(engines_copy)
    report = tmp_path / "r.json"
    res = CliRunner().invoke(cli(), ["compare", str(engines_copy), "--report", str(report)])
    assert res.exit_code == 1 and f" (report: {report})\n" in res.output, res.output
    assert res.output.count(f"(report: {report})") == 1


def test_the_tolerance_table_of_each_precision_and_reference():
    """mutants t05 (bf16 bounds 4x fp16's, not 8x), t06 (bf16 against torch given fp16's
    bounds), t10 (fp32 against torch: rtol 1e-2, not 1e-3): the bounds DESIGN and the
    comment above TOLERANCES state, pinned per precision and reference."""
    outs = [C.LOGITS, C.AUX_HIDDEN, C.new_key(0), C.DRAFT_CONFIDENCE]
    for ref in ("onnxruntime", "torch"):
        got = resolve_tolerances(outs, "bf16", ref)
        assert [got[o] for o in outs] == [pytest.approx(v) for v in ((0.4, 0.08), (0.4, 0.08), (0.16, 0.08),
                                                                     (0.08, 0.08))]
        assert resolve_tolerances(outs, "fp16", ref)[C.new_key(0)] == (2e-2, 1e-2)
    assert set(resolve_tolerances(outs, "fp32", "torch").values()) == {(1e-3, 1e-3)}
    assert set(resolve_tolerances(outs, "fp32", "onnxruntime").values()) == {(1e-4, 1e-4)}


def test_tolerance_keys_are_checked_for_both_options_and_a_bare_value_is_known(tiny_engines):
    """mutants t08 (a bare value, key "", refused as an unknown output) and t09 (--rtol's keys
    never checked: a misspelt output's rtol was silently unused)."""
    from specrt.engines.compare import KINDS, check_tolerance_keys

    check_tolerance_keys({"": 1e-3, C.LOGITS: 1.0, "new_key.3": 2.0}, set(KINDS) | {"new_key.3"})
    with pytest.raises(UserError, match=r"unknown output\(s\) \['logit'\]"):
        compare_engines(tiny_engines, rtol={"logit": 1.0}, log=quiet)


def test_a_token_tie_is_judged_by_the_references_logits():
    """TokenCompare: "close" is |a - b| <= atol + rtol |b| and the tie's gap is the
    reference's (b) logits at the two argmaxes. mutant r02 (close relative to the engine's
    |a|) passed a row whose reference logits differ by more than rtol |b|; mutant r03 (the
    gap from the engine's logits) passed a gap the reference puts beyond atol."""
    ref_tok = np.array([[0]])
    # r02: reference argmax 0 (2 vs 1), engine's token 1 at 3: |3 - 1| = 2 > 0.7 x 1, <= 0.7 x 3
    ref = {C.DRAFT_LOGITS: np.array([[[2.0, 1.0, 0.0]]], np.float32), C.DRAFT_TOKENS: ref_tok}
    eng = {C.DRAFT_LOGITS: np.array([[[2.0, 3.0, 0.0]]], np.float32), C.DRAFT_TOKENS: np.array([[1]])}
    m = TokenCompare((0.0, 0.7))(eng, ref)[C.DRAFT_TOKENS]
    assert not m and (m.agree, m.ties) == (0, 0)
    # r03: within atol 1 everywhere, the engine's two logits 0.1 apart, the reference's 1.5 apart
    ref = {C.DRAFT_LOGITS: np.array([[[0.0, 1.5]]], np.float32), C.DRAFT_TOKENS: np.array([[1]])}
    eng = {C.DRAFT_LOGITS: np.array([[[0.9, 0.8]]], np.float32), C.DRAFT_TOKENS: np.array([[0]])}
    m = TokenCompare((1.0, 0.0))(eng, ref)[C.DRAFT_TOKENS]
    assert not m and (m.agree, m.ties) == (0, 0)
    # the gap's bound is atol + rtol |top|: 0.5 apart at 10 is a tie within (0.1, 0.1), beyond atol alone
    # (mutant m70b-39: the gap bounded by atol only)
    ref = {C.DRAFT_LOGITS: np.array([[[10.0, 9.5]]], np.float32), C.DRAFT_TOKENS: np.array([[0]])}
    eng = {C.DRAFT_LOGITS: np.array([[[9.5, 10.0]]], np.float32), C.DRAFT_TOKENS: np.array([[1]])}
    m = TokenCompare((0.1, 0.1))(eng, ref)[C.DRAFT_TOKENS]
    assert m and (m.agree, m.ties) == (0, 1)


def _draft_graph(path: Path, shift: list[float]) -> Path:
    """draft_logits = x + shift (a constant [5]), draft_token_ids = its argmax per row."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5])
    outs = [helper.make_tensor_value_info(C.DRAFT_LOGITS, TensorProto.FLOAT, [1, 2, 5]),
            helper.make_tensor_value_info(C.DRAFT_TOKENS, TensorProto.INT64, [1, 2])]
    nodes = [helper.make_node("Add", ["x", "shift"], [C.DRAFT_LOGITS]),
             helper.make_node("ArgMax", [C.DRAFT_LOGITS], [C.DRAFT_TOKENS], axis=-1, keepdims=0)]
    return _save_graph(path, nodes, [x], outs, [helper.make_tensor("shift", TensorProto.FLOAT, [5], shift)])


def test_a_draft_token_tie_within_the_logits_tolerance_passes_compare_role(tmp_path):
    """mutant r07 (compare_role's TokenCompare given (0, 0), not the draft logits' tolerance):
    an engine that breaks a tie the other way by 2e-6 passes, counted as a tie; by 1.0 it fails."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    x = np.zeros((1, 2, 5), np.float32)
    x[0, 0, [1, 3]] = 2.0
    x[0, 1, 2] = 3.0
    ref = OnnxrtRunner(SessionFromOnnx(str(_draft_graph(tmp_path / "r.onnx", [0.0] * 5))), name="reference")
    outputs, tol = [C.DRAFT_LOGITS, C.DRAFT_TOKENS], {C.DRAFT_LOGITS: (1e-4, 1e-4)}
    for shift, passed in ((2e-6, True), (1.0, False)):
        eng = OnnxrtRunner(SessionFromOnnx(str(_draft_graph(tmp_path / "e.onnx", [0, 0, 0, shift, 0]))), name="engine")
        r = compare_role("draft", eng, ref, [{"x": x}], tol, outputs)
        tok = r["outputs"][C.DRAFT_TOKENS]
        assert (tok["passed"], tok["agree"], tok["ties"]) == (passed, 1, int(passed)) and r["passed"] == passed


def test_a_users_atol_turns_the_row_scale_off_and_the_default_scales_logits_and_hidden(tiny_engines, tmp_path):
    """row_scaled in compare_engines: logits and aux_hidden compared in units of their rows'
    scale unless the user's --atol covers them. mutant u08 (aux_hidden never scaled), u09
    (scaled whatever the user's atol), u01 (a bare atol taken as not covering), u02 (a dict's
    bare "" taken as not covering)."""
    def scaled(r):
        return {n for n in (C.LOGITS, C.AUX_HIDDEN) if r["roles"]["decode"]["outputs"][n].get("in_units_of_row_scale")}

    assert scaled(compare_engines(tiny_engines, log=quiet, prompt_tokens=8, inputs_file=tmp_path / "a.json")) == \
        {C.LOGITS, C.AUX_HIDDEN}
    for atol, left in ((1e-3, set()), ({"": 1e-3}, set()), ({C.LOGITS: 1e-3}, {C.AUX_HIDDEN})):
        r = compare_engines(tiny_engines, log=quiet, prompt_tokens=8, atol=atol, inputs_file=tmp_path / "b.json")
        assert scaled(r) == left, atol
        assert r["roles"]["decode"]["outputs"][C.LOGITS]["atol"] == 1e-3


def test_the_row_scale_is_the_references_robust_spread():
    """row_scale is max(1, 1.4826 x median |row|) (mutant u03: the 1.4826 dropped) and
    scale_rows divides both runners by the REFERENCE's rows (mutant u05: the engine's rows'
    scale, which let an engine of 3s against a reference of 0s pass atol 1)."""
    from polygraphy.comparator import Comparator
    from polygraphy.comparator.struct import IterationResult, RunResults

    from specrt.engines.compare import _simple_compare, row_scale, scale_rows

    assert row_scale(np.array([[3.0, -3.0, 3.0], [0.1, 0.2, 0.3]])).reshape(-1).tolist() == pytest.approx([1.4826 * 3, 1.0])
    # the median, not the mean: one huge value (a massive activation) does not loosen its row (mutant m70b-49)
    assert row_scale(np.array([[2.0, -2.0, 2.0, 2000.0]])).reshape(-1).tolist() == pytest.approx([1.4826 * 2])
    rr = RunResults([("eng", [IterationResult({C.LOGITS: np.full((1, 3), 3.0)}, runner_name="eng")]),
                     ("ref", [IterationResult({C.LOGITS: np.zeros((1, 3))}, runner_name="ref")])])
    rr = scale_rows(rr, "ref", {C.LOGITS: True})
    acc = Comparator.compare_accuracy(rr, compare_func=[_simple_compare({C.LOGITS: (1.0, 0.0)})])
    assert not bool(acc[0][("eng", "ref")][0][C.LOGITS])


def _scaled_graph(path: Path, factor: float) -> Path:
    """logits = x * factor."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, [2, 4])
    return _save_graph(path, [helper.make_node("Mul", ["x", "f"], [C.LOGITS])], [x], [y],
                       [helper.make_tensor("f", TensorProto.FLOAT, [], [factor])])


def test_compare_role_compares_scaled_rows_in_their_own_units(tmp_path):
    """compare_role with row_scaled over real ONNX Runtime runners: an engine 1e-6 relative off
    in a row of spread ~1500 fails atol 1e-4 (rtol 0) as it is and passes in units of that
    row's scale (mutant u06: the scaling skipped); the report's atol_widest_row is the atol in
    the widest row's units, 1e-4 x 1.4826 x 1000 (mutant u07: the narrowest row's, 1e-4)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    eng = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "e.onnx", 1.000001))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "r.onnx", 1.0))), name="reference")
    x = np.array([[1000.0, -1000.0, 1000.0, 0.5], [0.1, 0.2, 0.0, -0.1]], np.float32)
    tol = {C.LOGITS: (1e-4, 0.0)}
    assert not compare_role("decode", eng, ref, [{"x": x}], tol, [C.LOGITS])["passed"]
    r = compare_role("decode", eng, ref, [{"x": x}], tol, [C.LOGITS], row_scaled={C.LOGITS: True})
    o = r["outputs"][C.LOGITS]
    assert r["passed"] and o["in_units_of_row_scale"] and o["atol_widest_row"] == pytest.approx(1e-4 * 1482.6)


def test_the_last_row_and_tree_checks_compare_scaled_rows_in_their_own_units():
    """_against, the elementwise check of last_row_check and tree_check: with ``scaled`` the
    rows are in units of the reference row's scale, as compare_role's (the logits 1e-6 relative
    off in a row of spread ~1500 pass atol 1e-4), without it as they are (mutant m70b-65: the
    two swapped, every check of a row-scaled output failed on real models' logits)."""
    from specrt.engines.compare import _against

    want = np.array([[[1000.0, -1000.0, 1000.0, 0.5], [0.1, 0.2, 0.0, -0.1]]])
    got = want * 1.000001
    st = _against(got, want, 1e-4, 0.0, True)
    assert st["tol_ratio"] <= 1 and st["max_abs"] == pytest.approx(1e-3 / 1482.6) and st["finite"]
    st = _against(got, want, 1e-4, 0.0, False)
    assert st["tol_ratio"] > 1 and st["max_abs"] == pytest.approx(1e-3)


def _two_output_graph(path: Path, names: dict[str, list[int]]) -> Path:
    """Each named output = x reshaped to its shape (x is [1, 4])."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    nodes, outs, inits = [], [], []
    for i, (name, shape) in enumerate(names.items()):
        inits.append(helper.make_tensor(f"s{i}", TensorProto.INT64, [len(shape)], shape))
        nodes.append(helper.make_node("Reshape", ["x", f"s{i}"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    return _save_graph(path, nodes, [x], outs, inits)


def test_an_output_missing_or_of_another_shape_fails(tmp_path):
    """compare_role's two error rows: an output the engine never returns (mutant c03: passed)
    and one of another shape than the reference's (mutant c04: passed)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    def runner(name, outs):
        return OnnxrtRunner(SessionFromOnnx(str(_two_output_graph(tmp_path / f"{name}.onnx", outs))), name=name)

    ref = runner("reference", {C.AUX_HIDDEN: [1, 4], C.new_key(0): [1, 4]})
    tol = {C.AUX_HIDDEN: (1e-4, 1e-4), C.new_key(0): (1e-4, 1e-4)}
    x = [{"x": np.ones((1, 4), np.float32)}]
    outputs = [C.AUX_HIDDEN, C.new_key(0)]
    r = compare_role("decode", runner("missing", {C.new_key(0): [1, 4]}), ref, x, tol, outputs)
    assert not r["passed"] and r["outputs"][C.AUX_HIDDEN] == {
        "passed": False, "error": "missing from the engine's or the reference's outputs"}
    r = compare_role("decode", runner("shaped", {C.AUX_HIDDEN: [2, 2], C.new_key(0): [1, 4]}), ref, x, tol, outputs)
    assert not r["passed"] and r["outputs"][C.AUX_HIDDEN] == {"passed": False, "error": "shapes differ"}
    assert r["outputs"][C.new_key(0)]["passed"]


def test_missing_logits_fail_as_a_row_not_a_key_error(tmp_path):
    """Found by a mutation round (session 57): an engine that never returned its logits made
    compare_role raise KeyError('logits') from its logits_argmax_agreement line (a traceback
    out of `specrt compare`): it fails with the 'missing from the engine's or the reference's
    outputs' row, as any other output does."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    def runner(name, outs):
        return OnnxrtRunner(SessionFromOnnx(str(_two_output_graph(tmp_path / f"{name}.onnx", outs))), name=name)

    ref = runner("reference", {C.LOGITS: [1, 4], C.AUX_HIDDEN: [1, 4]})
    r = compare_role("decode", runner("missing", {C.AUX_HIDDEN: [1, 4]}), ref, [{"x": np.ones((1, 4), np.float32)}],
                     {C.LOGITS: (1e-4, 1e-4), C.AUX_HIDDEN: (1e-4, 1e-4)}, [C.LOGITS, C.AUX_HIDDEN])
    assert not r["passed"] and r["outputs"][C.LOGITS]["error"].startswith("missing")


def test_the_worst_ratio_is_relative_to_the_reference_in_compare_role(tmp_path):
    """mutant c05 (compare_role's tol_ratio taken relative to the engine's values, the
    runners' order swapped): at x = 20 the engine gives 30, the reference 20; rtol 0.4 fails
    relative to 20 (ratio 1.25), as polygraphy's verdict does, but passes relative to 30."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    eng = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "e.onnx", 10.0))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "r.onnx", None))), name="reference")
    r = compare_role("decode", eng, ref, [{"x": np.full((1, 4), 20.0, np.float32)}], {C.LOGITS: (1e-4, 0.4)},
                     [C.LOGITS])
    o = r["outputs"][C.LOGITS]
    assert not o["passed"] and o["tol_ratio"] == pytest.approx(1.25)


def test_the_row_std_bound_is_the_largest_rows(tmp_path):
    """compare_role's row_std_atol: the atol becomes m x the reference's LARGEST row std over
    the rows and iterations (mutant c08: the mean row std, a looser row's bound tighter)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    eng = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "e.onnx", 1.0))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "r.onnx", 1.0))), name="reference")
    x = np.array([[4.0, -4.0, 4.0, -4.0], [0.0, 0.0, 0.0, 0.0]], np.float32)  # row stds 4 and 0
    r = compare_role("draft", eng, ref, [{"x": x}], {C.LOGITS: (0.5, 0.0)}, [C.LOGITS], row_std_atol={C.LOGITS: 1.0})
    o = r["outputs"][C.LOGITS]
    assert o["reference_row_std"] == pytest.approx(4.0) and o["atol"] == pytest.approx(4.0)


def test_a_token_tree_fails_on_its_second_sibling_alone(tiny_engines):
    """tree_check runs both siblings (mutant l05: only the first) and fails when any output of
    any chain fails (mutant l06: the verdict of the last output compared, new_value.*, only):
    an engine off by 1 in the second sibling's logits row alone fails, the logits named."""
    from specrt.engines import load_engines
    from specrt.engines.compare import tree_check

    class OffInTheLastRow:  # the tree computed right, but the last row's (the second sibling's) logits off by 1
        def __init__(self, view):
            self.view = view

        def infer_impl(self, feeds):
            out = {k: np.array(v, copy=True) for k, v in self.view.infer_impl(feeds).items()}
            out[C.LOGITS][:, -1] += 1.0
            return out

    with load_engines(tiny_engines) as e:
        feeds, tol, ref = _verify4_against_the_export(e)
        assert tree_check(e.portable("verify.4"), ref, feeds, tol)["passed"]
        bad = tree_check(OffInTheLastRow(e.portable("verify.4")), ref, feeds, tol)
        assert not bad["passed"] and bad["worst_output"] == C.LOGITS and bad["tol_ratio"] > 1
        assert (bad["atol"], bad["rtol"]) == tol[C.LOGITS]  # the worst output's (mutant E64: 0, 0)


def test_a_token_tree_that_matches_exactly_names_its_output_and_tolerance(tmp_path):
    """tree_check's report on a tree whose every row is exactly its chain's (each row's logits
    its own token, over real ONNX Runtime runners): worst/tol 0, the worst output and its
    tolerance still named (mutant m70b-71: none named, and an atol and rtol of 0 reported)."""
    from onnx import TensorProto, helper
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import tree_check

    ids = helper.make_tensor_value_info(C.INPUT_IDS, TensorProto.INT64, [1, "S"])
    pos = helper.make_tensor_value_info(C.POSITION_IDS, TensorProto.INT64, [1, "S"])
    y = helper.make_tensor_value_info(C.LOGITS, TensorProto.FLOAT, [1, "S", 1])
    nodes = [helper.make_node("Cast", [C.INPUT_IDS], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["f", "axis"], [C.LOGITS])]
    axis = helper.make_tensor("axis", TensorProto.INT64, [1], [-1])
    g = _save_graph(tmp_path / "g.onnx", nodes, [ids, pos], [y], [axis])
    feeds = {C.INPUT_IDS: np.array([[5, 6, 7, 8, 9]]), C.POSITION_IDS: np.arange(10, 15)[None]}
    with OnnxrtRunner(SessionFromOnnx(str(g)), name="engine") as eng:
        r = tree_check(eng, OnnxrtRunner(SessionFromOnnx(str(g)), name="reference"), feeds, {C.LOGITS: (1e-4, 2e-4)})
    assert r["passed"] and r["tol_ratio"] == 0 and (r["rows"], r["drafts"]) == (5, 2)
    assert (r["worst_output"], r["atol"], r["rtol"]) == (C.LOGITS, 1e-4, 2e-4)


def test_a_depth_3_verify_runs_a_token_tree(tiny_export, tmp_path):
    """The smallest tree (x, a1 and two siblings of a1) fits a depth-3 verify: verify.3 is
    compared as a tree too (mutant l07: from depth 4 only; the fixture's depths 1, 2, 4, 8
    never had a 3)."""
    from specrt.engines import build_engines

    build_engines(tiny_export, "onnxruntime", (1, 3), tmp_path / "engines", log=quiet, profile_repeats=1)
    r = compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=8, inputs_file=tmp_path / "in.json")
    assert r["passed"], r["summary"]
    t = r["roles"]["verify.3"]["outputs"][TREE]
    assert t["passed"] and (t["rows"], t["drafts"], t["siblings"]) == (4, 1, 2)


def test_a_failed_check_fails_its_role(engines_copy, tmp_path):
    """mutant l10 (_add_check records the check but leaves its role passed): a target weight
    1e-3 off under --atol/--rtol logits:1 fails the weight check only, and the prefill role
    with it, in the report."""
    corrupt_engine(engines_copy, delta=1e-3)
    r = compare_engines(engines_copy, log=quiet, atol={C.LOGITS: 1.0}, rtol={C.LOGITS: 1.0},
                        inputs_file=tmp_path / "in.json")
    assert [(f["role"], f["output"]) for f in r["failures"]] == [("prefill", TARGET_WEIGHTS)]
    assert r["roles"]["prefill"]["passed"] is False and r["roles"]["decode"]["passed"] is True


def test_the_printed_command_carries_each_outputs_own_tolerances(tiny_engines, tmp_path):
    """polygraphy_command: --atol and --rtol each with their own values (mutant p03: swapped),
    an output's other value named output:value (mutant p09: only the common one); and with
    the torch reference the line runs ONNX Runtime at ONNX Runtime's bounds, 1e-4 (mutant
    p04: torch's 1e-3)."""
    import shlex

    def args(cmd, option):
        argv = shlex.split(cmd)
        i = argv.index(option) + 1
        return argv[i: next(j for j in range(i, len(argv)) if argv[j].startswith("--"))]

    r = compare_engines(tiny_engines, log=quiet, prompt_tokens=8, atol={C.LOGITS: 0.5}, rtol={"new_key": 0.25},
                        inputs_file=tmp_path / "in.json")
    assert args(r["polygraphy_command"], "--atol") == ["0.0001", "logits:0.5"]
    assert sorted(args(r["polygraphy_command"], "--rtol")) == sorted(
        ["0.0001", *(f"new_key.{i}:0.25" for i in range(4))])
    pytest.importorskip("transformers")
    r = compare_engines(tiny_engines, reference="torch", log=quiet, prompt_tokens=8, inputs_file=tmp_path / "t.json")
    assert args(r["polygraphy_command"], "--atol") == ["0.0001"] and args(r["polygraphy_command"], "--rtol") == ["0.0001"]


def test_the_only_a_check_failed_note_is_not_said_when_outputs_failed(engines_copy, tmp_path):
    """mutant p08 (the "failed only its ... check, which this line does not repeat" note said
    whenever the shown role failed): the corrupted lm_head fails prefill's logits too, which
    the line does repeat."""
    corrupt_engine(engines_copy)
    lines: list[str] = []
    r = compare_engines(engines_copy, log=lines.append, inputs_file=tmp_path / "in.json")
    assert r["polygraphy_role"] == "prefill" and not r["passed"]
    assert not any("failed only its" in line for line in lines), lines


def test_a_folder_others_can_write_or_that_is_not_ours_is_not_reused(tmp_path, monkeypatch):
    """_private_folder: a folder the group can write (mutant f01: only others' write bit
    checked) or owned by another uid (mutant f02: the owner never checked; here the caller's
    uid is another than the folder's) is passed over for a fresh mkdtemp folder, made in the
    temporary directory: this test's own (it left two empty specrt-compare-XXXXXXXX folders in
    the real /tmp a run, h74d)."""
    import os
    import tempfile

    from specrt.engines.compare import _private_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    p = tmp_path / "specrt-compare-x"
    p.mkdir()
    p.chmod(0o700)
    assert _private_folder(p, os.getuid()) == p
    assert _private_folder(p, os.getuid() + 1).parent == tmp_path / "tmp"
    p.chmod(0o770)
    assert _private_folder(p, os.getuid()).parent == tmp_path / "tmp"
    assert len(list((tmp_path / "tmp").glob("specrt-compare-*"))) == 2


def test_a_record_that_names_no_folder_is_left_alone(tmp_path):
    """_recorded_engines: compared.json whose "engines" is not a string (another tool's file,
    or edited) reads as no record (mutant f06: Path(5) raised TypeError out of compare)."""
    import os

    from specrt.engines.compare import _own_temp_folder

    odd = tmp_path / f"specrt-compare-{os.getuid()}-0123456789ab"
    odd.mkdir(mode=0o700)
    (odd / "compared.json").write_text(json.dumps({"engines": 5}))
    import tempfile

    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        mine = _own_temp_folder("fedcba987654", tmp_path / "engines")
    finally:
        tempfile.tempdir = old
    assert mine.parent == tmp_path and odd.is_dir()
    assert mine.is_dir()  # its own record (an engines folder with no engines.json) is no orphan (mutant m36)


def test_each_roles_inputs_have_the_documented_shapes(tiny_engines, tmp_path):
    """RoleInputs (its docstring): prefill = the prompt from scratch, then its second half
    over the first half's KV (mutant i01: h = 0, the same call twice; mutant i02: the whole
    prompt's KV as the past); the P-EAGLE draft's later round is A = 2 over the draft's KV of
    n - 2 slots (mutant i09: A = 1)."""
    r = compare_engines(tiny_engines, log=quiet, inputs_file=tmp_path / "in.json")  # n = 32, K = 8
    p = r["roles"]["prefill"]["input_shapes"]
    assert p[0][C.INPUT_IDS] == [1, 32] and p[0][C.past_key(0)] == [1, 0, 2, 16]
    assert p[1][C.INPUT_IDS] == [1, 16] and p[1][C.past_key(0)] == [1, 16, 2, 16]
    d = r["roles"]["draft"]["input_shapes"]
    assert d[0][C.INPUT_IDS] == [1, 32 + 7] and d[1][C.INPUT_IDS] == [1, 2 + 7]
    assert d[1][C.past_key(0)][1] == 30 and d[1][C.DRAFT_AUX_IN][1] == 2


def test_decode_and_verify_continue_the_prompt(tiny_engines):
    """RoleInputs (its docstring): decode is ids[n] at n, verify.d ids[n : n + d + 1] at n..,
    both over the prefill's KV of the n prompt tokens (mutant m70b-29: verify fed ids[n - 1 :
    n + d], the prompt's last token again, at n.., passed: both runners get the same feeds)."""
    from specrt.engines import load_engines
    from specrt.engines.compare import RoleInputs

    with load_engines(tiny_engines) as e:
        inputs = RoleInputs(e, 8)
        ids = inputs.ids
        for role, d in (("decode", 0), ("verify.2", 2), ("verify.8", 8)):
            (f,) = inputs.feeds(role)
            assert f[C.INPUT_IDS].tolist() == [ids[8 : 8 + d + 1].tolist()], role
            assert f[C.POSITION_IDS].tolist() == [list(range(8, 8 + d + 1))], role
            assert np.array_equal(f[C.past_key(0)], inputs.kv[C.new_key(0)][:, :8]), role


def test_a_one_token_prompt_is_refused(tiny_engines):
    """mutant i03 (--prompt-tokens from 1): the prefill's second half and the draft's earlier
    round need 2 tokens at least."""
    with pytest.raises(UserError, match=r"--prompt-tokens 1: expected 2\.\."):
        compare_engines(tiny_engines, log=quiet, prompt_tokens=1)


def test_the_torch_reference_refuses_positions_not_after_its_past(tiny_engines):
    """mutant i04 (TorchTargetRunner's consecutive-positions check dropped: transformers then
    placed the rows at p.. whatever the feed said, and a tree or a gap compared as a chain)."""
    pytest.importorskip("transformers")
    from specrt.engines import load_engines
    from specrt.engines.compare import RoleInputs, load_torch_target, torch_target_runner

    with load_engines(tiny_engines) as e:
        feeds = RoleInputs(e, 8).feeds("verify.2")[0]
        model = load_torch_target(Path(e.export["binding_receipt"]["target"]["folder"]), e.export)
        runner = torch_target_runner(model, e.portable("verify.2").get_input_metadata(),
                                     tuple(e.export["target"]["aux_layer_ids"]), "torch")
        with runner as ref:
            ref.infer(feeds)
            with pytest.raises(UserError, match=r"consecutive positions 8\.\.10 after 8 past tokens, got \[8, 9, 9\]"):
                ref.infer({**feeds, C.POSITION_IDS: np.array([[8, 9, 9]])})


def test_the_printed_command_takes_the_widest_rows_atol_for_scaled_outputs(tmp_path):
    """mutant u10 (the by-hand command given the row-scaled outputs' atol in row units, 1e-4,
    not in the outputs' own units for the widest row): a target whose lm_head is 1000x the
    fixture's has logits rows of spread ~1e3; polygraphy's one absolute atol for them must
    be the report's atol_widest_row, and the line still passes when run."""
    import shlex

    from safetensors.numpy import load_file, save_file

    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "target")
    (f,) = t.glob("*.safetensors")
    w = load_file(str(f))
    w["lm_head.weight"] = w["lm_head.weight"] * 1000.0
    save_file(w, str(f), metadata={"format": "pt"})
    d = write_tiny_draft(tmp_path / "draft", t, kind="eagle3")
    export(t, d, tmp_path / "export")
    build_engines(tmp_path / "export", "onnxruntime", (1, 3), tmp_path / "engines", log=quiet, profile_repeats=1)
    r = compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=8, inputs_file=tmp_path / "in.json")
    assert r["passed"], r["summary"]
    # verify.3's token tree compares its logits in units of the rows' scale too (mutant E45: as they are, and
    # rows of spread ~1e3 failed atol 1e-4 where the chain's own logits passed)
    assert r["roles"]["verify.3"]["outputs"][TREE]["passed"]
    widest = r["roles"][r["polygraphy_role"]]["outputs"][C.LOGITS]["atol_widest_row"]
    assert widest > 1e-2
    argv = shlex.split(r["polygraphy_command"])
    assert f"{C.LOGITS}:{widest:g}" in argv[argv.index("--atol"):argv.index("--rtol")]
    assert _polygraphy(argv[1:]) == 0


def test_a_weight_transposed_in_place_is_caught(tmp_path):
    """mutant l09 (check_target_weights comparing sums, not elements): a square weight
    transposed (a build that forgot a `.T`, or laid a fused weight out the other way) keeps its
    sum and every value; it must fail, the first element that differs named."""
    import onnx
    from onnx import helper, numpy_helper

    from specrt.engines.compare import check_target_weights

    def graph(path, w):
        x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2])
        y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])
        onnx.save(helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "q_proj"], ["y"])], "g", [x], [y],
                                                      [numpy_helper.from_array(w, "q_proj")])), path)

    w = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    graph(tmp_path / "x.onnx", w)
    graph(tmp_path / "e.onnx", np.ascontiguousarray(w.T))
    r = check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")
    assert not r["passed"] and r["bad"] == [{"weight": "q_proj", "problem": "element 1 is 3, the export's 2 (x.onnx)"}]



def test_the_summary_names_the_weight_first(engines_copy, tmp_path):
    """summary(): a weight check's failure is named first, the cause of the outputs it moved
    (mutant p02: in role order, after prefill's logits and last row)."""
    corrupt_engine(engines_copy)
    r = compare_engines(engines_copy, log=quiet, inputs_file=tmp_path / "in.json")
    assert re.match(r"the engines differ from the onnxruntime reference in \d+ output\(s\) and \d+ check\(s\): ",
                    r["summary"]), r["summary"]
    head = r["summary"].split(" check(s): ", 1)[1]
    assert head.startswith(f"prefill {TARGET_WEIGHTS} (1 of the target engine's weights differ from the export's: "
                           "'lm_head' element 0 is "), r["summary"]


def test_a_failed_call_is_counted_apart_from_the_outputs_that_differ():
    """The verdict (compare's error line and its report's summary) counts outputs beyond
    tolerance and checks, and says a role whose engine failed its call as such: nothing of
    that role's was compared, so it is no output that "differs" (it was counted as one)."""
    from specrt.engines.compare import what_failed

    out = {"role": "decode", "output": C.LOGITS, "max_abs": 1.0, "max_rel": 1.0, "atol": 0.1}
    check = {"role": "prefill", "output": LAST_ROW, "error": "x"}
    calls = [{"role": r, "output": ENGINE_CALL, "error": "x"} for r in ("verify.3", "verify.2")]
    assert what_failed([out, check], "torch") == "the engines differ from the torch reference in 1 output(s) and 1 check(s)"
    assert what_failed(calls[:1], "torch") == "engine 'verify.3' failed its call"
    assert what_failed([out, *calls], "onnxruntime") == (
        "the engines differ from the onnxruntime reference in 1 output(s); engines 'verify.3', 'verify.2' failed "
        "their calls")


def test_a_tolerance_for_an_output_no_graph_has_is_refused():
    """A mutation round's survivor t07 (kind_of(k) dropped from the check) was the documented
    behaviour, the clean code the bug: 'an output name such as new_key.3' names an output;
    new_key.99 (a 4-layer target) and logits.x name none, and their tolerance was accepted
    and never used (session 57)."""
    from specrt.engines.compare import KINDS, check_tolerance_keys

    known = set(KINDS) | {C.new_key(i) for i in range(4)}
    for k in ("new_key.99", "logits.x"):
        with pytest.raises(UserError, match="unknown output"):
            check_tolerance_keys({k: 1.0}, known)


def test_a_token_comparison_without_the_references_tokens_or_logits_is_no_key_error():
    """TokenCompare read the reference's draft_token_ids and both sides' draft_logits
    unguarded (a KeyError traceback out of `specrt compare`, found with compare_role's twin
    by a mutation round, session 57): without the reference's tokens no match is given (the
    role's tokens row fails), without logits the tokens are judged exactly, no ties."""
    tok = {C.DRAFT_TOKENS: np.array([[1, 2]])}
    assert TokenCompare((1.0, 1.0))(tok, {}) == {}
    same = TokenCompare((1.0, 1.0))(tok, {C.DRAFT_TOKENS: np.array([[1, 2]])})[C.DRAFT_TOKENS]
    other = TokenCompare((1.0, 1.0))(tok, {C.DRAFT_TOKENS: np.array([[1, 3]])})[C.DRAFT_TOKENS]
    assert same and (same.rows, same.agree, same.ties) == (2, 2, 0)
    assert not other and (other.rows, other.agree, other.ties) == (2, 1, 0)


def test_shared_nonfinite_is_the_same_nan_or_inf_on_both_sides():
    from specrt.engines.compare import shared_nonfinite

    inf, nan = np.inf, np.nan
    a = np.array([inf, -inf, nan, inf, nan, 1.0, inf, 2.0], np.float32)
    b = np.array([inf, -inf, nan, -inf, 1.0, nan, 3.0, 2.0], np.float32)
    assert shared_nonfinite(a, b).tolist() == [True, True, True, False, False, False, False, False]
    assert not shared_nonfinite(a, b[:4]).any() and not shared_nonfinite(np.array([1, 2]), np.array([1, 2])).any()


def test_the_same_overflow_in_engine_and_reference_is_set_aside_not_a_difference(overflowing, tmp_path):  # noqa: F811
    """A model whose weights overflow (w5's logit +inf wherever its normed hidden state sums
    above 0) gives the same +inf in its engines and in the export's graphs: compare passes,
    counting those elements per output, the prefill's last row and the token tree's check,
    and says the by-hand polygraphy line fails on them (inf - inf is NaN: every such element
    failed, and compare blamed the engines for the model's own overflow, which the runtime's
    error sends users to compare to tell apart)."""
    eng, _ = overflowing
    lines: list[str] = []
    r = compare_engines(eng, log=lines.append, inputs_file=tmp_path / "in.json")
    assert r["passed"], r["summary"]
    counts = {role: {n: o["shared_nonfinite"] for n, o in x["outputs"].items() if "shared_nonfinite" in o}
              for role, x in r["roles"].items()}
    # only the target's logits overflow (the draft has its own head), in every target role
    assert all(set(c) <= {C.LOGITS, LAST_ROW, TREE} and C.LOGITS in c for role, c in counts.items()
               if role != "draft") and counts["draft"] == {}, counts
    assert counts["prefill"][LAST_ROW] >= 1 and counts["verify.3"][TREE] >= 1, counts
    assert sum("NaN or inf in both, the same: set aside" in x for x in lines) == sum(map(len, counts.values()))
    assert any(x.startswith("  (polygraphy counts the ") for x in lines), lines
    # the count the by-hand line fails on is its role's outputs' (mutant m30: its checks' counted too)
    shown = r["polygraphy_role"]
    assert TREE in counts[shown] and any(x.startswith(f"  (polygraphy counts the {counts[shown][C.LOGITS]} element(s) ")
                                         for x in lines), (shown, counts, lines)


def test_an_engine_failing_its_call_fails_its_role_and_the_others_are_compared(failing_verify, tmp_path):  # noqa: F811
    """An engine whose backend fails its call (ONNX Runtime's own error: the target edited so
    that a call of 4 rows fails, verify.3's) fails that role, named with the backend's reason,
    and compare goes on to the other roles (it ended at that role, the other roles unchecked);
    exit 1, no traceback; the by-hand line repeats a role that ran. A failing prefill, where
    every role's inputs start, ends compare, saying so."""
    lines: list[str] = []
    r = compare_engines(failing_verify, log=lines.append, inputs_file=tmp_path / "in.json")
    assert not r["passed"] and [(f["role"], f["output"]) for f in r["failures"]] == [("verify.3", ENGINE_CALL)], r
    assert r["failures"][0]["error"].startswith("engine 'verify.3' (target.onnx) failed in ONNX Runtime: ")
    assert "Gather" in r["failures"][0]["error"], r["failures"]
    assert all(x["passed"] for role, x in r["roles"].items() if role != "verify.3") and len(r["roles"]) == 5, r
    row = lines[lines.index(next(x for x in lines if x.startswith("verify.3 "))) + 2]
    assert row.startswith(f"  {ENGINE_CALL:26s} engine 'verify.3' (target.onnx) failed in ONNX Runtime: ") and \
        row.endswith("  FAIL"), lines
    assert r["polygraphy_role"] == "draft" and (tmp_path / "in.json").is_file(), r
    res = CliRunner().invoke(cli(), ["compare", str(failing_verify), "--save-inputs", str(tmp_path / "c.json")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    # (no output of verify.3's was compared: its failed call is said as one, not as an output that differs)
    assert res.output.splitlines()[-1] == "error: engine 'verify.3' failed its call", res.output
    assert r["summary"].startswith("engine 'verify.3' failed its call: verify.3 the engine's call (engine "), \
        r["summary"]
    res = CliRunner().invoke(cli(), ["compare", str(failing_verify), "--prompt-tokens", "4", "--save-inputs",
                                     str(tmp_path / "c.json")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.splitlines()[-1].startswith(
        "error: the engines' prefill of 4 prompt tokens, where every role's inputs start, failed: engine 'prefill' "
        "(target.onnx) failed in ONNX Runtime: "), res.output
    # an EngineFailure still (the engines' fault, not the caller's input: mutant m70b-111, a plain UserError)
    from specrt.errors import EngineFailure

    with pytest.raises(EngineFailure, match="the engines' prefill of 4 prompt tokens, where every role's inputs start"):
        compare_engines(failing_verify, log=quiet, prompt_tokens=4, inputs_file=tmp_path / "d.json")


def test_an_engine_nonfinite_where_its_reference_is_finite_fails(engines_copy, tmp_path):
    """One weight of the target engine made +inf after its build (the export refuses non-finite
    weights, so only a changed engine has one): its NaN / inf logits where the reference's are
    finite fail, as any difference; only the same non-finite value on both sides is set aside."""
    corrupt_engine(engines_copy, delta=float("inf"))
    lines: list[str] = []
    with warnings.catch_warnings(record=True) as said:  # (mutant m42: numpy's RuntimeWarnings on them printed)
        warnings.simplefilter("always")
        r = compare_engines(engines_copy, log=lines.append, inputs_file=tmp_path / "in.json")
    assert not [w for w in said if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in said]
    assert not r["passed"]
    assert {f["output"] for f in r["failures"] if f["role"] == "decode"} == {C.LOGITS}, r["failures"]
    assert not any("shared_nonfinite" in o for x in r["roles"].values() for o in x["outputs"].values())
    # nor said (mutant m31: the by-hand line said to fail on 0 such elements)
    assert not any("NaN or inf in both" in x for x in lines), lines


def test_token_ids_without_the_references_logits_are_judged_exactly():
    """Mutant m03 (only the engine's draft_logits looked for): the engine gave its logits and
    the reference none, and the tie check read the reference's (a KeyError out of compare)."""
    eng = {C.DRAFT_TOKENS: np.array([[1, 2]]), C.DRAFT_LOGITS: np.zeros((1, 2, 4), np.float32)}
    got = TokenCompare((1.0, 1.0))(eng, {C.DRAFT_TOKENS: np.array([[1, 3]])})[C.DRAFT_TOKENS]
    assert (got.rows, got.agree, got.ties) == (2, 1, 0)


def test_the_same_nonfinite_values_are_counted_over_iterations_and_made_0_on_both_sides():
    """_set_aside_nonfinite on real polygraphy results of two iterations: the shared +inf /
    NaN of each iteration counted and summed (mutant m10: the last iteration's count alone),
    made 0 on both sides in the output's own dtype (mutant m11: made 1), a value non-finite
    on one side only left as it was, and outputs with none not counted."""
    from polygraphy.comparator.struct import IterationResult, RunResults

    from specrt.engines.compare import _set_aside_nonfinite

    inf, nan = np.inf, np.nan

    def run(name, rows):
        outs = [{C.LOGITS: np.array(r, np.float32), C.AUX_HIDDEN: np.ones(2, np.float32)} for r in rows]
        return (name, [IterationResult(outputs=o, runner_name=name) for o in outs])

    results = RunResults([run("e", [[inf, 1.0, nan], [inf, -inf, 2.0]]), run("r", [[inf, 1.0, nan], [inf, -inf, inf]])])
    out, counts = _set_aside_nonfinite(results, "e", "r", [C.LOGITS, C.AUX_HIDDEN])
    assert counts == {C.LOGITS: 4}
    for name in ("e", "r"):
        assert [it[C.LOGITS].dtype for it in out[name]] == [np.float32, np.float32]
    assert out["e"][0][C.LOGITS].tolist() == [0.0, 1.0, 0.0] and out["e"][1][C.LOGITS].tolist() == [0.0, 0.0, 2.0]
    assert out["r"][1][C.LOGITS].tolist() == [0.0, 0.0, inf]


def test_another_users_temporary_folder_is_not_removed(tmp_path, monkeypatch):
    """_remove_orphans removes this user's folders only (mutant m38: the owner never checked):
    a folder under this uid's name that another user owns (here: this run under another
    uid than the folder's owner) stays though the engines folder it records is gone."""
    import os
    import tempfile

    from specrt.engines.compare import _own_temp_folder

    uid = os.getuid() + 1
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(os, "getuid", lambda: uid)
    theirs = tmp_path / f"specrt-compare-{uid}-0123456789ab"
    theirs.mkdir(mode=0o700)
    (theirs / "compared.json").write_text(json.dumps({"engines": str(tmp_path / "gone")}))
    mine = _own_temp_folder("fedcba987654", tmp_path)
    assert mine != theirs and theirs.is_dir() and (theirs / "compared.json").is_file()



def test_a_user_error_inside_a_role_ends_compare_not_only_that_role(tiny_engines, tmp_path, monkeypatch):
    """Only an engine failing its call (EngineFailure) fails its role and lets compare go on
    (mutant m21: any UserError, EngineFailure's base, caught there): another user error in a
    role's checks (the torch reference refusing its positions is one) ends compare, said as
    itself. The real ones need a torch reference fed out of order: the tree check made to
    raise one here."""
    from specrt.engines import compare as compare_module

    def refused(*args, **kwargs):
        raise UserError("a user error inside a role")

    monkeypatch.setattr(compare_module, "tree_check", refused)
    with pytest.raises(UserError, match="^a user error inside a role$"):
        compare_engines(tiny_engines, log=quiet, inputs_file=tmp_path / "in.json")


def test_a_record_that_is_a_link_is_no_record(tmp_path, monkeypatch):
    """_recorded_engines reads a plain compared.json only (mutant m34: a link followed): a
    folder whose record is a link (to a file naming an engines folder that is gone) is left."""
    import os
    import tempfile

    from specrt.engines.compare import _own_temp_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    linked = tmp_path / f"specrt-compare-{os.getuid()}-0123456789ab"
    linked.mkdir(mode=0o700)
    (tmp_path / "elsewhere.json").write_text(json.dumps({"engines": str(tmp_path / "gone")}))
    (linked / "compared.json").symlink_to(tmp_path / "elsewhere.json")
    _own_temp_folder("fedcba987654", tmp_path)
    assert linked.is_dir() and (linked / "compared.json").is_symlink()


def test_an_output_the_reference_never_gives_fails_as_a_row(tmp_path):
    """compare_role sets aside shared NaN / inf only for outputs both sides gave (mutant m45:
    the engine's alone looked for, a KeyError out of compare where the reference lacks one):
    an output the engine gives and its reference does not fails its row."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    def runner(name, outs):
        return OnnxrtRunner(SessionFromOnnx(str(_two_output_graph(tmp_path / f"{name}.onnx", outs))), name=name)

    eng = runner("engine", {C.LOGITS: [1, 4], C.AUX_HIDDEN: [1, 4]})
    r = compare_role("decode", eng, runner("reference", {C.AUX_HIDDEN: [1, 4]}), [{"x": np.ones((1, 4), np.float32)}],
                     {C.LOGITS: (1e-4, 1e-4), C.AUX_HIDDEN: (1e-4, 1e-4)}, [C.LOGITS, C.AUX_HIDDEN])
    assert not r["passed"] and r["outputs"][C.LOGITS]["error"].startswith("missing")
    assert r["outputs"][C.AUX_HIDDEN]["passed"]


def test_our_temporary_folder_survives_a_record_it_cannot_write(tmp_path, monkeypatch):
    """_own_temp_folder: the record failing to be written (here compared.json a folder) leaves
    the by-hand files' folder to be used, as its comment says (write_atomic says the OSError
    as a UserError, which the tidying's `except OSError` let out: compare ended; found by a
    mutation round's m41, `except ValueError` there, which no test told from the clean code)."""
    import os
    import tempfile

    from specrt.engines.compare import _own_temp_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    p = tmp_path / f"specrt-compare-{os.getuid()}-0123456789ab"
    p.mkdir(mode=0o700)
    (p / "compared.json").mkdir()
    assert _own_temp_folder("0123456789ab", tmp_path / "engines") == p


def test_an_unwritable_report_or_inputs_path_is_refused_before_any_work(tiny_engines, tmp_path):
    """cmd_compare checks --report and --save-inputs as output files before the engines load
    (mutant C03: not checked, compare ran every role, then failed writing under a file)."""
    f = tmp_path / "afile"
    f.write_text("")
    for option in ("--report", "--save-inputs"):
        res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), option, str(f / "x" / "r.json")])
        assert res.exit_code == 1 and f"{option} {f}/x/r.json: {f} is a file, not a folder" in res.output, res.output
        assert "compare " not in res.output.split("error:")[0], res.output  # (nothing compared first)


def test_a_mismatch_against_torch_names_the_torch_reference(engines_copy, tmp_path):
    """The CLI's error line names the reference the run compared with (mutant C08: always
    "onnxruntime"); a run's own words for the by-hand line with the torch reference, and no
    row of the torch comparison in units of a row's scale (mutants E42, E73)."""
    pytest.importorskip("transformers")
    corrupt_engine(engines_copy)
    res = CliRunner().invoke(cli(), ["compare", str(engines_copy), "--reference", "torch", "--prompt-tokens", "8",
                                     "--save-inputs", str(tmp_path / "in.json")])
    assert res.exit_code == 1 and "error: the engines differ from the torch reference in " in res.output, res.output
    assert "(at ONNX Runtime's tolerances; this run compared with transformers at its own):" in res.output
    assert " /row " not in res.output and "logits /row" not in res.output, res.output


def test_a_tolerance_by_name_wins_over_its_kind_and_zero_is_a_tolerance():
    """resolve_tolerances looks for the output's name first, then its kind, then "" (mutant
    E01: the kind first, so new_key:1 overrode new_key.3:2); a tolerance of 0 is an exact
    comparison, not refused (mutant E02)."""
    tol = resolve_tolerances([C.new_key(3), C.new_key(0)], "fp32", "onnxruntime",
                             atol={"new_key": 1.0, "new_key.3": 2.0}, rtol=0.0)
    assert tol == {C.new_key(3): (2.0, 0.0), C.new_key(0): (1.0, 0.0)}


def test_token_ids_are_the_tokenizers_within_the_vocabulary_repeated_to_length(tmp_path):
    """token_ids on an export with tokenizer.json: SAMPLE_TEXT's ids, those at or past the
    target's vocabulary dropped (mutant E10: an id equal to it kept, out of the embedding),
    repeated to n (mutant E11: cut short); the file is tokenizer.json (mutant E12)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specrt.engines.compare import SAMPLE_TEXT, token_ids

    words = SAMPLE_TEXT.split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tok = Tokenizer(models.WordLevel({**vocab, "[UNK]": len(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    want = [vocab[w] for w in words]
    n = 2 * len(want) + 3
    ids, source = token_ids(tmp_path, len(vocab), n)
    assert ids.tolist() == (want * 3)[:n] and source == "tokenizer.json on a fixed English text"
    last = len(vocab) - 1  # the text's last new word ("faster."): at the vocabulary's size, dropped
    ids, _ = token_ids(tmp_path, last, n)
    kept = [i for i in want if i < last]
    assert ids.tolist() == (kept * 3)[:n]
    (tmp_path / "folder" / "tokenizer.json").mkdir(parents=True)  # no file: the pseudo-random ids (mutant m70b-116)
    assert token_ids(tmp_path / "folder", 50, 6, seed=3)[1] == "pseudo-random ids in [0, 50) (seed 3)"
    ids, source = token_ids(tmp_path / "nowhere", 50, 6, seed=3)
    assert source == "pseudo-random ids in [0, 50) (seed 3)" and ids.tolist() == \
        np.random.default_rng(3).integers(0, 50, 6).tolist()


def test_the_peagle_drafts_later_round_continues_its_earlier_one(tiny_engines):
    """RoleInputs' P-EAGLE later round: A = 2 real slots at positions n - 2.. (mutant E13: one
    further), over the draft's own KV of an earlier pass on slots 0..n-3, which carries tokens
    x[1..n-2] and the target's aux rows 0..n-3 (mutants E14, E15: shifted by one). The draft is
    causal: that KV is the first pass's KV of the same slots."""
    from specrt.engines import load_engines
    from specrt.engines.compare import RoleInputs

    with load_engines(tiny_engines) as e:
        first, later = RoleInputs(e, 32).feeds("draft")
        k = max(DEPTHS)
        assert later[C.POSITION_IDS].tolist() == [list(range(30, 30 + 2 + k - 1))]
        out = {n: np.array(v, copy=True) for n, v in e.portable("draft").infer(first).items()}
        for i in range(int(e.export["draft"]["num_layers"])):
            for past, new in ((C.past_key(i), C.new_key(i)), (C.past_value(i), C.new_value(i))):
                assert later[past].shape[1] == 30
                np.testing.assert_allclose(later[past], out[new][:, :30], atol=1e-5, err_msg=past)


def test_runner_names_must_differ():
    """compare_role looks results up by runner name: one name for both is an internal error
    (mutant E20: compared the engine with itself, and passed)."""
    from specrt.engines.compare import compare_role
    from specrt.errors import InternalError

    class Named:
        name = "same"

    with pytest.raises(InternalError, match="runner names must differ"):
        compare_role("decode", Named(), Named(), [], {}, [])


def test_a_row_std_bound_by_output_name_and_its_floor(tmp_path):
    """compare_role's row_std_atol by an output's name (mutant E22: its kind only) and never
    below the output's own atol (mutant E23: a row std of 0 made the atol 0)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    def runner(name):
        return OnnxrtRunner(SessionFromOnnx(str(_two_output_graph(tmp_path / f"{name}.onnx", {C.new_key(0): [1, 4]}))),
                            name=name)

    x = [{"x": np.array([[4.0, -4.0, 4.0, -4.0]], np.float32)}]
    r = compare_role("draft", runner("e"), runner("r"), x, {C.new_key(0): (0.5, 0.0)}, [C.new_key(0)],
                     row_std_atol={C.new_key(0): 0.5})
    assert r["outputs"][C.new_key(0)]["atol"] == pytest.approx(2.0)  # 0.5 x std 4
    r = compare_role("draft", runner("e"), runner("r"), [{"x": np.zeros((1, 4), np.float32)}],
                     {C.new_key(0): (0.5, 0.0)}, [C.new_key(0)], row_std_atol={C.new_key(0): 0.5})
    assert r["outputs"][C.new_key(0)]["atol"] == 0.5 and r["outputs"][C.new_key(0)]["reference_row_std"] == 0.0


def test_the_reports_statistics_are_the_worst_iterations_and_argmax_agreement_all_of_them(tmp_path):
    """compare_role's max_abs / max_rel / mean_abs are the worst iteration's (mutants E24-E26:
    the best's), and the argmax agreement counts every iteration's rows (mutant E27: the
    first's only)."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from specrt.engines.compare import compare_role

    eng = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "e.onnx", 10.0))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_graph(tmp_path / "r.onnx", None))), name="reference")
    small, large = np.zeros((1, 4), np.float32), np.full((1, 4), 20.0, np.float32)
    o = compare_role("decode", eng, ref, [{"x": small}, {"x": large}], {C.LOGITS: (1e-4, 1e-4)}, [C.LOGITS])
    o = o["outputs"][C.LOGITS]
    assert (o["max_abs"], o["max_rel"], o["mean_abs"]) == pytest.approx((10.0, 0.5, 10.0))
    eng = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "n.onnx", -1.0))), name="engine")
    ref = OnnxrtRunner(SessionFromOnnx(str(_scaled_graph(tmp_path / "p.onnx", 1.0))), name="reference")
    x = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]], np.float32)
    r = compare_role("decode", eng, ref, [{"x": np.zeros_like(x)}, {"x": x}], {C.LOGITS: (1e-4, 1e-4)}, [C.LOGITS])
    assert r["logits_argmax_agreement"] == 0.5  # the zeros' two rows agree (both 0), x's two do not


def test_role_table_rows():
    """role_table: a decode role's title has no depth (mutant E28: "depth 0"); the KV layers
    fold into one row, failing when any layer fails (mutant E29), naming the worst layer
    (mutant E30: the first); a row-scaled output marked /row (mutant E31); a token row with its
    ties (mutant E33); the weight check's row says how many weights differ (mutant E32)."""
    from specrt.engines.compare import role_table

    def out(ratio, **kw):
        return {"max_abs": ratio, "max_rel": ratio, "atol": 1.0, "rtol": 0.0, "tol_ratio": ratio,
                "passed": ratio <= 1, **kw}

    r = {"iterations": 1, "seconds": 0.5, "outputs": {
        C.LOGITS: out(0.5, in_units_of_row_scale=True), C.new_key(0): out(0.5), C.new_key(1): out(2.0),
        C.new_key(2): out(0.1), C.DRAFT_TOKENS: {"kind": "tokens", "rows": 4, "agree": 3, "ties": 1, "passed": True},
        TARGET_WEIGHTS: {"kind": TARGET_WEIGHTS, "weights": 9, "passed": False,
                         "bad": [{"weight": "lm_head", "problem": "element 0 is 2, the export's 1 (target.onnx)"}]}}}
    lines = role_table("decode", r)
    assert lines[0] == "decode: 1 iteration(s), 0.50 s"
    row = {x.split()[0]: x for x in lines[2:]}
    assert row[f"{C.LOGITS}"].split()[1] == "/row" and row[f"{C.LOGITS}"].endswith("  pass")
    assert row["new_key.*"].startswith("  new_key.* (3, worst 1)") and row["new_key.*"].endswith("  FAIL")
    assert row[C.DRAFT_TOKENS].endswith("exact 3/4, 1 tie(s)  pass")
    assert row[TARGET_WEIGHTS].endswith("1 of 9 weights not the export's  FAIL")
    assert lines[-1] == "    'lm_head': element 0 is 2, the export's 1 (target.onnx)"
    assert role_table("verify.4", r)[0].startswith("verify.4 (depth 4): ")


def test_the_summary_of_token_rows_and_of_many_failures():
    """summary(): a token row says its ties (mutant E34); eight failures are all shown, a
    ninth said as "and 1 more" (mutants E35, E36)."""
    from specrt.engines.compare import summary

    tok = {"role": "draft", "output": C.DRAFT_TOKENS, "kind": "tokens", "rows": 8, "agree": 5, "ties": 1}
    assert summary([tok], "onnxruntime").endswith(": draft draft_token_ids (5/8 equal, 1 explained by ties)")
    fails = [{"role": f"verify.{i}", "output": C.LOGITS, "max_abs": 1.0, "max_rel": 1.0, "atol": 0.1}
             for i in range(9)]
    eight = summary(fails[:8], "onnxruntime")
    assert "verify.7 logits" in eight and "more" not in eight
    nine = summary(fails, "onnxruntime")
    assert "verify.7 logits" in nine and "verify.8 logits" not in nine and nine.endswith("; and 1 more")


def test_an_int8_weight_checks_row_and_summary_name_its_matmuls():
    """An int8 draft's weight check in the table lists the matmuls off their float weights
    (mutant E59: only counted) and the summary counts them out of the matmuls checked (mutant
    E60: out of the blocks)."""
    from specrt.engines.compare import INT8_WEIGHTS, role_table, summary

    bad = {"matmul": "/fc/MatMul_output_0", "weight": "fc.weight", "problem": "block 3's step is 2x its largest"}
    w = {"kind": "weights", "matmuls": 12, "blocks": 340, "max_error_steps": 3.0, "max_clipped_error_steps": 1.0,
         "max_step_error": 0.5, "passed": False, "bad": [bad]}
    lines = role_table("draft", {"iterations": 2, "seconds": 1.0, "outputs": {INT8_WEIGHTS: w}})
    assert lines[-1] == "    /fc/MatMul_output_0 (weight 'fc.weight'): block 3's step is 2x its largest", lines
    assert summary([{"role": "draft", "output": INT8_WEIGHTS, **w}], "onnxruntime").endswith(
        ": draft int8_weights (1 of 12 MatMulNBits off their float weights: /fc/MatMul_output_0 (weight "
        "'fc.weight'): block 3's step is 2x its largest)")


def test_the_printed_command_names_polygraphy_bare_where_the_shell_finds_it(tmp_path, monkeypatch):
    """_polygraphy_exe: the bare name where PATH finds polygraphy (the line then runs on any
    machine), the one beside this Python only where it does not (mutant m70b-89: that full path
    printed whenever it exists)."""
    import os
    import sys

    from specrt.engines.compare import _polygraphy_exe

    beside = Path(sys.executable).parent / "polygraphy"
    if not beside.is_file():
        pytest.skip("no polygraphy script beside this Python")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _polygraphy_exe() == str(beside)
    monkeypatch.setenv("PATH", f"{beside.parent}{os.pathsep}{tmp_path}")
    assert _polygraphy_exe() == "polygraphy"


def test_the_tensorrt_plans_command_saves_its_outputs():
    """polygraphy_trt_command runs the plan at its profile on the saved inputs and saves the
    outputs the ONNX Runtime line then loads (mutant E38: loaded them)."""
    from specrt.engines.compare import polygraphy_trt_command

    argv = shlex.split(polygraphy_trt_command(Path("e/verify.4.plan"), 3, Path("in.json"), Path("in.outputs.json")))
    assert argv[1:] == ["run", "e/verify.4.plan", "--model-type", "engine", "--trt", "--optimization-profile", "3",
                        "--load-inputs", "in.json", "--save-outputs", "in.outputs.json"]


def test_the_notes_of_in_place_onnxruntime_engines(tiny_engines, tmp_path):
    """The in-place ONNX Runtime engines' note: the target re-lowered, compared through the
    portable contract, and the (float) draft the export's graph, its weights moved to a file of
    their own by the build (mutants E40, E41; until w72b "the same graph file as this reference",
    which it is not), said (mutant F06: in the report only) after what is compared and on what
    inputs; a tolerance for one output by its name (mutant F03: refused, the outputs' names
    unknown); the report written in folders of its own and named last (mutant F14)."""
    lines: list[str] = []
    report = tmp_path / "a" / "b" / "r.json"
    r = compare_engines(tiny_engines, log=lines.append, prompt_tokens=8, atol={C.new_key(3): 0.5}, report=report,
                        inputs_file=tmp_path / "in.json")
    assert len(r["notes"]) == 1 and r["notes"][0].startswith("the target engine is the export's target re-lowered "
                                                             "with in-place KV") and \
        r["notes"][0].endswith("; the draft runs the export's draft graph, its weights moved to a file of their own "
                               "(checked against the export's, weight by weight)"), r["notes"]
    assert r["roles"]["draft"]["outputs"]["draft_weights"]["passed"]
    assert f"note: {r['notes'][0]}" in lines and lines[-1] == f"report: {report}", lines
    # what was compared, on what inputs, and the line that repeats it (mutants G02, G01, G03: not said)
    assert lines[0].startswith("compare ") and " (onnxruntime, fp32) against onnxruntime: polygraphy OnnxrtRunner" \
        in lines[0] and lines[1] == "inputs: 8 prompt tokens, pseudo-random ids in [0, 1000) (seed 0); past KV " \
        "from the engines' prefill", lines
    assert f"  {r['polygraphy_command']}" in lines
    assert r["tolerances"]["decode"][C.new_key(3)] == [0.5, 1e-4] and r["tolerances"]["decode"][C.new_key(2)] == \
        [1e-4, 1e-4]
    assert json.loads(report.read_text())["passed"]


def test_the_last_row_check_refuses_an_engine_that_gives_every_row(tiny_engines):
    """last_row_check: an engine that ignores logits_from (every row back) fails with its
    shape named (mutant E66: compared each row with the last, as broadcasting allows)."""
    from specrt.engines import load_engines
    from specrt.engines.compare import RoleInputs, last_row_check

    class EveryRow:
        def __init__(self, view):
            self.view = view

        def infer_impl(self, feeds):
            return self.view.infer_impl({k: v for k, v in feeds.items() if k != C.LOGITS_FROM})

    with load_engines(tiny_engines) as e:
        from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

        feeds = RoleInputs(e, 8).feeds("prefill")[0]
        ref = OnnxrtRunner(SessionFromOnnx(str(e.export_dir / "target.onnx"), providers=["cpu"])(), name="ref")
        assert last_row_check(e.portable("prefill"), ref, feeds, (1e-4, 1e-4))["passed"]
        r = last_row_check(EveryRow(e.portable("prefill")), ref, feeds, (1e-4, 1e-4))
        assert r == {"passed": False, "error": "shape [1, 8, 1000], expected [1, 1, 1000]"}


def test_target_weights_of_another_shape_dtype_or_the_engines_own(tmp_path):
    """check_target_weights: a weight of another shape is named so (mutant E50: by its size, a
    [3, 2] for a [2, 3] went on to its elements); an fp16 engine's weights are the export's
    cast to fp16, equal (mutant E51: compared uncast, every one off); an initializer no export
    weight makes is listed, not failed (mutant E52); an element's value is given to 9
    significant digits (mutant E53: 6, which said 1.00000012 as 1)."""
    import onnx
    from onnx import helper, numpy_helper

    from specrt.engines.compare import check_target_weights

    def graph(path, weights):
        inits = [numpy_helper.from_array(w, n) for n, w in weights.items()]
        ins = [helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, None) for i in range(len(weights))]
        nodes = [helper.make_node("Identity", [n], [f"y{i}"]) for i, n in enumerate(weights)]
        outs = [helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.UNDEFINED, None) for i in range(len(weights))]
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", ins[:0], outs, inits)), path)

    w = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    graph(tmp_path / "x.onnx", {"q_proj": w, "norm": np.ones(3, np.float32)})
    graph(tmp_path / "e.onnx", {"q_proj": w.astype(np.float16), "norm": np.ones(3, np.float16),
                                "rope_cache": np.zeros(2, np.float32)})
    r = check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")
    assert r["passed"] and r["weights"] == 2 and r["engine_only"] == ["rope_cache"], r
    graph(tmp_path / "e.onnx", {"q_proj": np.ascontiguousarray(w.reshape(3, 2)),
                                "norm": np.array([1.0000001, 1, 1], np.float32)})
    r = check_target_weights(tmp_path / "x.onnx", tmp_path / "e.onnx")
    assert r["bad"] == [{"weight": "q_proj", "problem": "shape [3, 2], the export's makes [2, 3]"},
                        {"weight": "norm", "problem": "element 0 is 1.00000012, the export's 1 (x.onnx)"}], r


def test_a_bfloat16_weight_is_said_as_its_value():
    """_num: a bfloat16 element (ml_dtypes', a numpy kind "V") said as a float (mutant E54:
    taken for an integer, 1.5 said as 1)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from specrt.engines.compare import _num

    assert _num(np.asarray(1.5, ml_dtypes.bfloat16)) == "1.5" and _num(np.int8(-3)) == "-3"


def test_a_folder_whose_engines_folder_lost_its_manifest_is_removed(tmp_path, monkeypatch):
    """_remove_orphans: a record naming a folder that is still there but holds no engines.json
    (rebuilt elsewhere, emptied) is an orphan too (mutant E67: only a folder gone); a record
    that is not JSON reads as no record, its folder left (mutant E79: a ValueError out of compare)."""
    import os
    import tempfile

    from specrt.engines.compare import _own_temp_folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "emptied").mkdir()
    orphan = tmp_path / f"specrt-compare-{os.getuid()}-0123456789ab"
    orphan.mkdir(mode=0o700)
    (orphan / "compared.json").write_text(json.dumps({"engines": str(tmp_path / "emptied")}))
    garbled = tmp_path / f"specrt-compare-{os.getuid()}-aaaaaaaaaaaa"
    garbled.mkdir(mode=0o700)
    (garbled / "compared.json").write_text("{not json")
    mine = _own_temp_folder("fedcba987654", tmp_path)
    assert mine.is_dir() and not orphan.exists() and garbled.is_dir()


def test_the_torch_target_must_have_the_exports_layers(tmp_path):
    """load_torch_target: a checkpoint the binding receipt cannot vouch for (no receipt) is
    still refused when its layer count is not the export's (mutant E76), and transformers'
    logging verbosity is left as it was (mutant E77: left at errors only)."""
    transformers = pytest.importorskip("transformers")
    from specrt.engines.compare import load_torch_target
    from tests.engines.conftest import REFERENCE

    before = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_info()
    try:
        model = load_torch_target(REFERENCE / "verifier", {"target": {"num_layers": 4}})
        assert model.config.num_hidden_layers == 4
        assert transformers.logging.get_verbosity() == transformers.logging.INFO
        with pytest.raises(UserError, match="4 layers, but the export has 3: not the checkpoint"):
            load_torch_target(REFERENCE / "verifier", {"target": {"num_layers": 3}})
        # fewer layers than the export's too (mutant m70b-21: only more were refused)
        with pytest.raises(UserError, match="4 layers, but the export has 5: not the checkpoint"):
            load_torch_target(REFERENCE / "verifier", {"target": {"num_layers": 5}})
    finally:
        transformers.logging.set_verbosity(before)


def test_the_longest_prompt_that_fits_the_context_is_compared(tiny_export, tmp_path, monkeypatch):
    """--prompt-tokens up to C - K - 1 (C the context limit, K the deepest verify): verify.K
    then scores K + 1 tokens over n of past, C in all, its plan's largest past (C - K - 1).
    compare refused that n (2..C - K - 2: engines built at --max-context K + 3 could not be
    compared at all; a mutation round's E39)."""
    from specrt.engines import build_engines

    build_engines(tiny_export, "onnxruntime", (1, 2), tmp_path / "engines", log=quiet, profile_repeats=1,
                  max_context=24)
    r = compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=21, inputs_file=tmp_path / "in.json")
    assert r["passed"] and r["roles"]["verify.2"]["input_shapes"][0][C.past_key(0)][1] == 21, r["summary"]
    with pytest.raises(UserError, match=r"--prompt-tokens 22: expected 2\.\.21 for a context limit of 24"):
        compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=22)
    # without --prompt-tokens: the most that fits, where 32 does not (it said "--prompt-tokens 32: expected
    # 2..21", an option not given)
    res = CliRunner().invoke(cli(), ["compare", str(tmp_path / "engines"), "--report", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "r.json").read_text())["inputs"]["prompt_tokens"] == 21
    # a context with no room for a prompt of 2 tokens is said as the engines' (it said "expected 2..1"): engines
    # built before build's least context was the deepest depth + 3 (h74d)
    from specrt.engines import build as build_module

    monkeypatch.setattr(build_module, "least_context", lambda depths: max(depths) + 2)
    build_engines(tiny_export, "onnxruntime", (1, 2), tmp_path / "small", log=quiet, profile_repeats=1,
                  max_context=4)
    res = CliRunner().invoke(cli(), ["compare", str(tmp_path / "small")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert (f"{tmp_path / 'small'}: its context limit of 4 tokens leaves verify.2 no room for a prompt of 2 tokens: "
            "compare needs engines built with --max-context 5 or more") in res.output, res.output



def test_engines_on_the_exports_own_target_graph_skip_the_weight_check(tmp_path, monkeypatch):
    """Engines whose target runs the export's own graph file (an export with external weights,
    which the build keeps, the KV appended) hold its weights by construction: no weight check
    is made (mutant E43: the graph checked against itself, a row that checks nothing)."""
    from specrt.engines import build_engines
    from specrt.export import graphs
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    monkeypatch.setattr(graphs, "EXTERNAL_DATA_THRESHOLD", 0)
    t = write_tiny_target(tmp_path / "target")
    export(t, write_tiny_draft(tmp_path / "draft", t, kind="eagle3"), tmp_path / "export")
    build_engines(tmp_path / "export", "onnxruntime", (1,), tmp_path / "engines", log=quiet, profile_repeats=1,
                  ort_kv="append")
    manifest = json.loads((tmp_path / "engines" / "engines.json").read_text())
    assert manifest["roles"]["decode"]["engine"]["onnx"] == "export/target.onnx"
    r = compare_engines(tmp_path / "engines", log=quiet, prompt_tokens=8, inputs_file=tmp_path / "in.json")
    assert r["passed"] and not any(TARGET_WEIGHTS in x["outputs"] for x in r["roles"].values()), r["summary"]
    # (nor the draft's, which runs the export's own file too: w72b)
    assert "draft_weights" not in r["roles"]["draft"]["outputs"], r["roles"]["draft"]["outputs"]


def test_a_torch_target_missing_a_slot_of_the_export_is_refused():
    """check_same_target: a checkpoint with every tensor the same but one slot of the export's
    binding receipt missing (mutant E09: passed) is refused, the missing slot named (mutant
    E08: the count of changed slots only, 0)."""
    from specrt.engines.compare import check_same_target
    from specrt.export.binding import bind_target
    from tests.engines.conftest import REFERENCE

    folder = REFERENCE / "verifier"
    slots = dict(bind_target(folder).table())
    check_same_target(folder, {"binding_receipt": {"target": {"slots": slots}}})
    n = len(slots) + 1
    with pytest.raises(UserError, match=rf"not the checkpoint these engines were exported from: 0 of the {n} target "
                                        r"slots hold other tensors than the export's binding receipt records; 1 of "
                                        r"them are missing \(first: 'layers\.9\.extra'\); pass the exported target"):
        more = {**slots, "layers.9.extra": {"sha256": "0"}}
        check_same_target(folder, {"binding_receipt": {"target": {"slots": more}}})
    # every slot of the receipt the same, but the checkpoint binds one more (mutant m70b-17: passed)
    first = sorted(slots)[0]
    fewer = {k: v for k, v in slots.items() if k != first}
    with pytest.raises(UserError, match=rf"0 of the {n - 2} target slots hold other tensors than the export's "
                                        rf"binding receipt records; 1 slots are not the export's "
                                        rf"\(first: '{re.escape(first)}'\)"):
        check_same_target(folder, {"binding_receipt": {"target": {"slots": fewer}}})


def test_a_torch_target_whose_config_json_is_no_file_is_refused(tmp_path):
    """load_torch_target: a folder whose config.json is a folder is no checkpoint (mutant
    m70b-20: it passed the check and transformers failed with a traceback)."""
    pytest.importorskip("transformers")
    from specrt.engines.compare import load_torch_target

    (tmp_path / "config.json").mkdir()
    with pytest.raises(UserError, match="no config.json, not a transformers checkpoint"):
        load_torch_target(tmp_path, {"target": {"num_layers": 4}})


def test_each_report_keeps_its_own_inputs_beside_it(tiny_engines, tmp_path):
    """With --report and no --save-inputs, the by-hand files are named after the report (r.json:
    r.inputs.json, r.outputs.json): two reports in one folder keep their own (mutant H05: one
    inputs.json beside both, the first report's command then ran the second run's inputs)."""
    from polygraphy.json import load_json

    a = compare_engines(tiny_engines, log=quiet, prompt_tokens=8, report=tmp_path / "a.json")
    b = compare_engines(tiny_engines, log=quiet, prompt_tokens=12, report=tmp_path / "b.json")
    assert (a["inputs_file"], a["outputs_file"]) == (str(tmp_path / "a.inputs.json"), str(tmp_path / "a.outputs.json"))
    assert b["inputs_file"] == str(tmp_path / "b.inputs.json")
    assert np.array_equal(load_json(a["inputs_file"])[0][C.POSITION_IDS], np.arange(8, 17)[None])


@needs_mount_namespace
def test_compare_where_no_temporary_folder_can_be_written_is_refused_first(tiny_engines, tmp_path):
    """An environment walk: `specrt compare ENGINES` without --report keeps the by-hand
    command's files in a temporary folder; with none writable (TMPDIR mistyped, /tmp read-only)
    it compared every role and then ended in tempfile's traceback. Refused before any work,
    naming TMPDIR; with --report (its files beside it) it runs."""
    r = without_temp_folder(["compare", str(tiny_engines)], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr and not r.stdout, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: compare without --report or --save-inputs writes temporary files, and no "
                               "temporary folder can be written (No usable temporary directory found in ["), r.stderr
    assert r.stderr.rstrip().endswith("]): set TMPDIR to a writable folder"), r.stderr
    r = without_temp_folder(["compare", str(tiny_engines), "--report", str(tmp_path / "r.json")], tmp_path)
    assert r.returncode == 0 and json.loads((tmp_path / "r.json").read_text())["passed"], (r.stdout, r.stderr)


def corrupt_draft_engine(folder: Path, initializer: str = "embed", index: int = 0, delta: float = 1.0) -> None:
    """ONE weight element of the float draft engine changed (the build's copy of the export's
    draft, its weights moved to draft.onnx.data), recorded in engines.json as a build would."""
    import onnx
    from onnx import numpy_helper

    from specrt.manifest import file_record

    m = json.loads((folder / "engines.json").read_text())
    name = m["roles"]["draft"]["engine"]["onnx"]
    model = onnx.load(str(folder / name))
    t = next(t for t in model.graph.initializer if t.name == initializer)
    w = numpy_helper.to_array(t).copy()
    w.flat[index] += delta
    t.CopyFrom(numpy_helper.from_array(w, initializer))
    for f in (name, name + ".data"):
        (folder / f).unlink()
    onnx.save_model(model, str(folder / name), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=name + ".data", size_threshold=1024)
    m["files"] = [r for r in m["files"] if r["file"] not in (name, name + ".data")] + [
        file_record(folder, name), file_record(folder, name + ".data")]
    (folder / "engines.json").write_text(json.dumps(m))


def test_a_changed_weight_of_the_float_draft_engine_is_caught_even_where_no_input_reads_it(engines_copy, tmp_path):
    """A walk of compare (w72b): the float draft engine is the build's copy of the export's draft
    (its weights moved to draft.onnx.data), not the export's file, yet only its outputs were
    compared and the note said it "runs the same graph file as this reference": one element of
    its embedding row 0, a token the test prompt does not hold, changed, and compare passed
    every role. The draft's weights are now checked against the export's as the target's are,
    the weight named, and the note says what the draft runs."""
    DRAFT_WEIGHTS = "draft_weights"  # (the check's report entry)
    corrupt_draft_engine(engines_copy)
    r = compare_engines(engines_copy, log=quiet, prompt_tokens=8, inputs_file=tmp_path / "in.json")
    assert [(f["role"], f["output"]) for f in r["failures"]] == [("draft", DRAFT_WEIGHTS)], r["summary"]
    assert [b["weight"] for b in r["failures"][0]["bad"]] == ["embed"]
    assert r["summary"].startswith("the engines differ from the onnxruntime reference in 1 check(s): draft "
                                   f"{DRAFT_WEIGHTS} (1 of the draft engine's weights differ from the export's: "
                                   "'embed' element 0 is "), r["summary"]
    assert r["notes"][0].endswith("; the draft runs the export's draft graph, its weights moved to a file of their "
                                  "own (checked against the export's, weight by weight)"), r["notes"]
    res = CliRunner().invoke(cli(), ["compare", str(engines_copy), "--prompt-tokens", "8",
                                     "--save-inputs", str(tmp_path / "in.json")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "'embed': element 0 is " in res.output and "error: the engines differ from the onnxruntime reference " \
        "in 1 check(s)" in res.output, res.output


def test_a_tolerance_for_the_draft_token_ids_is_refused(tiny_engines):
    """A walk of compare (w72b): `--atol draft_token_ids:1` (or --rtol) was taken without a word
    and never used (token ids are exact, or a tie within draft_logits' tolerance)."""
    for option in ("--atol", "--rtol"):
        res = CliRunner().invoke(cli(), ["compare", str(tiny_engines), option, f"{C.DRAFT_TOKENS}:1"])
        assert res.exit_code == 1 and "Traceback" not in res.output, res.output
        assert res.output.startswith(f"error: {option} {C.DRAFT_TOKENS}:1: token ids take no tolerance (they must be "
                                     f"equal, or a tie within {C.DRAFT_LOGITS}' tolerance): give {C.DRAFT_LOGITS}'s"), \
            res.output


def test_a_torch_target_folder_that_is_gone_is_said_so(tmp_path):
    """A walk of compare (w72b): the target folder the export was bound from, moved or removed,
    was said as "no config.json, not a transformers checkpoint"."""
    pytest.importorskip("transformers")
    from specrt.engines.compare import load_torch_target

    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'gone'}: no such folder (the target folder recorded "
                                                  "in the export's binding receipt, moved or removed since? --target "
                                                  "DIR gives the checkpoint)")):
        load_torch_target(tmp_path / "gone", {"target": {"num_layers": 4}})


def test_the_summary_names_the_draft_weights_first():
    """summary(): a failed float-draft weight check (draft_weights) is named before the outputs
    it moved, as the target's is (mutant m73y-42: after the draft's logits)."""
    from specrt.engines.compare import summary

    out = {"role": "draft", "output": C.DRAFT_LOGITS, "max_abs": 1.0, "max_rel": 1.0, "atol": 0.1}
    weight = {"role": "draft", "output": "draft_weights", "kind": "draft_weights",
              "bad": [{"weight": "embed", "problem": "element 0 is 1, not 0"}]}
    head = summary([out, weight], "onnxruntime").split(" check(s): ", 1)[1]
    assert head.startswith("draft draft_weights (1 of the draft engine's weights differ from the export's: 'embed' "
                           "element 0 is 1, not 0); draft draft_logits (max abs 1 > atol 0.1"), head


def test_target_only_engines_are_compared(tmp_path):
    """Engines of an export without a draft: compare checks the target roles, the notes saying
    nothing of a draft (mutant m73y-46 looked up the draft's engine whatever the roles, a
    KeyError on these)."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_target

    export(write_tiny_target(tmp_path / "t", "llama", vocab_size=16), None, tmp_path / "exp", log=quiet)
    build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / "eng", log=quiet, profile_repeats=1)
    r = compare_engines(tmp_path / "eng", log=quiet, prompt_tokens=4, inputs_file=tmp_path / "in.json")
    assert r["passed"] and "draft" not in r["roles"], r["summary"]
    assert not any("the draft runs" in n for n in r["notes"]), r["notes"]
