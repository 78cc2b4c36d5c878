"""The build plan as data (no TensorRT needed): roles, TensorRT profiles, flags, files."""

from __future__ import annotations

import json
import re

import pytest

from specrt import contracts as C
from specrt.engines.plan import DimRange, Role, make_roles, normalise_precision, parse_depths, trt_plan
from specrt.errors import UserError

L, KVH, D, V, H = 4, 2, 16, 1000, 64
CTX = 256
DEPTHS = (1, 2, 4, 8)
IO = {"target": C.target_io(L, KVH, D, V, H, "float32").to_json(),
      "draft": C.peagle_io(1, KVH, D, V, H, "float32").to_json()}
FILES = {"target": "export/target.onnx", "draft": "export/draft.onnx"}


def kv_names(n):
    return [x for i in range(n) for x in (C.past_key(i), C.past_value(i))]


@pytest.fixture
def plan():
    roles = make_roles(DEPTHS, CTX, "peagle", opt_past=128, draft_accepted=2)
    return trt_plan(roles, {g: v for g, v in IO.items()}, FILES, "fp16", "float32")


def test_profiles_pin_every_depth_and_cover_every_input(plan):
    target = next(e for e in plan.engines if e.graph == "target")
    assert target.file == "target.plan" and target.onnx == "export/target.onnx"
    assert [p.role for p in target.profiles] == ["prefill", "decode", "verify.1", "verify.2", "verify.4", "verify.8"]
    for p in target.profiles[1:]:
        s = 1 if p.role == "decode" else int(p.role.split(".")[1]) + 1
        assert set(p.shapes) == {C.INPUT_IDS, C.POSITION_IDS, *kv_names(L)}  # every input, nothing else
        for name in (C.INPUT_IDS, C.POSITION_IDS):
            assert p.shapes[name] == ((1, s), (1, s), (1, s))  # min = opt = max
        for name in kv_names(L):
            assert p.shapes[name] == ((1, 0, KVH, D), (1, 128, KVH, D), (1, CTX - s, KVH, D))
        assert plan.roles[p.role] == ("target.plan", target.profiles.index(p))


def test_prefill_and_draft_keep_dynamic_ranges(plan):
    target = next(e for e in plan.engines if e.graph == "target")
    pre = target.profiles[0]
    assert pre.shapes[C.INPUT_IDS] == ((1, 1), (1, 128), (1, CTX))
    assert pre.shapes[C.past_key(3)] == ((1, 0, KVH, D), (1, 0, KVH, D), (1, CTX - 1, KVH, D))
    draft = next(e for e in plan.engines if e.graph == "draft")
    assert draft.file == "draft.plan" and len(draft.profiles) == 1
    d = draft.profiles[0].shapes
    assert set(d) == {C.INPUT_IDS, C.POSITION_IDS, C.DRAFT_AUX_IN, *kv_names(1)}
    k = max(DEPTHS)
    assert d[C.INPUT_IDS] == ((1, 1), (1, 2 + k - 1), (1, CTX + k))  # A + M slots, A = 2 typical
    assert d[C.DRAFT_AUX_IN] == ((1, 1, 3 * H), (1, 2, 3 * H), (1, CTX, 3 * H))
    assert d[C.past_key(0)] == ((1, 0, KVH, D), (1, 128, KVH, D), (1, CTX + k - 1, KVH, D))
    assert plan.roles["draft"] == ("draft.plan", 0)


def test_flags_timing_cache_and_json(plan):
    assert plan.flags == {"tf32": False, "fp16": True, "bf16": False}
    assert plan.timing_cache == "timing.cache"
    j = json.loads(json.dumps(plan.to_json()))
    assert j["roles"]["verify.4"] == {"file": "target.plan", "profile": 4}
    assert j["engines"][0]["profiles"][4]["shapes"][C.INPUT_IDS] == [[1, 5], [1, 5], [1, 5]]


def test_engine_per_role_layout():
    roles = make_roles((2, 4), CTX, "peagle")
    p = trt_plan(roles, IO, FILES, "fp32", "float32", layout="engines")
    assert [e.file for e in p.engines] == ["target.prefill.plan", "target.decode.plan", "target.verify.2.plan",
                                           "target.verify.4.plan", "draft.plan"]
    assert all(len(e.profiles) == 1 for e in p.engines)
    assert p.roles["verify.4"] == ("target.verify.4.plan", 0)
    assert p.flags == {"tf32": False, "fp16": False, "bf16": False}  # fp32: TF32 off, to match ORT to 1e-5


def test_precision_rules():
    roles = make_roles((1,), CTX, None)
    assert trt_plan(roles, IO, FILES, "bf16", "float32").flags["bf16"]
    # a float16 export at fp16: strongly typed (the export's float32 norm statistics kept), no
    # precision flag (TensorRT refuses them there); a float32 export at fp16: the flag
    p16 = trt_plan(roles, IO, FILES, "fp16", "float16")
    assert p16.strongly_typed and not any(p16.flags.values()) and p16.to_json()["strongly_typed"]
    p32 = trt_plan(roles, IO, FILES, "fp16", "float32")
    assert p32.flags["fp16"] and not p32.strongly_typed
    with pytest.raises(UserError, match="cannot be built from a float16 export"):
        trt_plan(roles, IO, FILES, "fp32", "float16")
    for prec in ("bf16", "fp32"):  # bfloat16 I/O: polygraphy has no numpy type for it
        with pytest.raises(UserError, match="a bfloat16 export cannot be built for TensorRT here"):
            trt_plan(roles, IO, FILES, prec, "bfloat16")
    with pytest.raises(UserError, match="layout"):
        trt_plan(roles, IO, FILES, "fp32", "float32", layout="one")
    assert normalise_precision(None, "float16") == "fp16"
    assert normalise_precision("bfloat16", "float32") == "bf16"


def test_no_draft_no_draft_engine():
    roles = make_roles((1, 2), CTX, None)
    assert set(roles) == {"prefill", "decode", "verify.1", "verify.2"}
    assert [e.graph for e in trt_plan(roles, IO, FILES, "fp32", "float32").engines] == ["target"]


def test_eagle3_draft_ranges():
    roles = make_roles((1, 4), CTX, "eagle3")
    d = roles["draft"].dims
    assert d[C.DIM_AUX] == DimRange(0, 0, CTX) and d[C.DIM_PREV] == DimRange(0, 1, CTX + 4)
    assert d[C.DIM_NEW] == DimRange(1, 1, CTX + 4)


def test_depths_and_context_are_checked():
    assert parse_depths("8, 1,2") == (1, 2, 8)
    assert parse_depths([4]) == (4,)
    with pytest.raises(UserError, match="at least one"):
        parse_depths("")
    with pytest.raises(UserError, match="too small for depth 8: expected at least 10 "):
        make_roles((8,), 9, None)
    # (a user walk: "1,,2" was 1,2 without a word; said by its place, as bench's lists say theirs: r74)
    for typo, said in (("1,,2", "item 2 of 3"), ("1,2,", "item 3 of 3"), (",4", "item 1 of 2")):
        with pytest.raises(UserError, match=rf"^--depths '{typo}': {said} is empty; expected comma-separated "
                                            r"integers such as 1,2,4,8$"):
            parse_depths(typo)


def test_a_depth_out_of_range_is_said_before_one_named_twice():
    """Session 74's leftover (r74): `--depths 70,70` said "depth 70 is named twice", then, the
    repeat mended, "out of range": the range is said first, each bad depth once, as build and
    the tools that take --depths (bench_engines, bench_governors, bench_runtime) parse them."""
    for typo, bad in (("70,70", "[70]"), ("2,2,70", "[70]"), ("0,1-3,3", "[0]"), ("65-66,65", "[66, 65]")):
        with pytest.raises(UserError, match=rf"^--depths: {re.escape(bad)} out of range \(each depth must be in "
                                            r"1\.\.64\)$"):
            parse_depths(typo)
    with pytest.raises(UserError, match=r"^--depths '2,2,3': depth 2 is named twice \(items 1 and 2\)"):
        parse_depths("2,2,3")  # (in range: the repeat still said)


def test_depths_take_ranges_and_ascii_digits_only():
    """"1-4" (a range, as users type one: the README's own walks did) was refused; int() took a
    full-width "１" as 1; a depth of 5000 digits met int()'s digit limit, a ValueError."""
    assert parse_depths("1-4") == (1, 2, 3, 4) and parse_depths("1-3, 6,8 - 8") == (1, 2, 3, 6, 8)
    assert parse_depths("2-2,1") == (1, 2)
    with pytest.raises(UserError, match=r"^--depths '4-1': the range 4-1 runs backwards; expected LOW-HIGH such as "
                                        r"1-4$"):
        parse_depths("4-1")
    for typo in ("１", "-2", "2-", "1.0", "1-2-3", "a-4"):
        with pytest.raises(UserError, match=rf"^--depths '{typo}': expected comma-separated integers such as "
                                            r"1,2,4,8 \(or ranges such as 1-4\)$"):
            parse_depths(typo)
    with pytest.raises(UserError, match=r"^--depths: \[0\] out of range \(each depth must be in 1\.\.64\)$"):
        parse_depths("0-2")
    with pytest.raises(UserError, match=r"^--depths: \[65\] out of range"):
        parse_depths("1-65")  # (a range past the limit: its end named, not 65 values)
    with pytest.raises(UserError, match=r"^--depths: 1-9{5000} out of range \(each depth must be in 1\.\.64\)$"):
        parse_depths("1-" + "9" * 5000)
    # a depth named twice, by items or ranges ("1,2,2": 1,2 without a word, where 1,2,4 may have been meant; h74b,
    # as bench's --governors and --peers refuse a repeated item)
    for typo, said in (("8, 1,2,2", "depth 2 is named twice (items 3 and 4)"),
                       ("1-4,3", "depth 3 is named twice (items 1 and 2)"),
                       ("2, 1-2", "depth 2 is named twice (items 1 and 2)")):
        with pytest.raises(UserError, match=rf"^--depths '{typo}': {re.escape(said)}; each depth is built once$"):
            parse_depths(typo)


def test_role_json_round_trip():
    r = make_roles((2,), CTX, "peagle")["verify.2"]
    assert Role.from_json(r.name, json.loads(json.dumps(r.to_json()))) == r


def test_polygraphy_loaders_compose_without_tensorrt(plan, tmp_path):
    """The lazy loader chain is built from the plan; nothing runs until it is called."""
    pytest.importorskip("polygraphy")
    from specrt.engines.tensorrt import activation_resize, engine_loader

    target = plan.engines[0]
    save = engine_loader(plan, target, tmp_path)
    assert save.path == str(tmp_path / "target.plan")
    build = save._engine  # EngineFromNetwork
    assert build.timing_cache_path == str(tmp_path / "timing.cache")
    post = build._config  # PostprocessConfig(CreateConfig(...), activation_resize)
    assert post._func is activation_resize
    cfg = post._config
    assert (cfg.fp16, cfg.bf16, cfg.tf32) == (True, False, False)
    assert cfg.timing_cache_path == str(tmp_path / "timing.cache")  # the same cache is loaded and saved
    assert len(cfg.profiles) == len(target.profiles)
    verify4 = cfg.profiles[4]
    assert tuple(verify4[C.INPUT_IDS].min) == tuple(verify4[C.INPUT_IDS].max) == (1, 5)
    # every input's (min, opt, max) is the plan's, opt included (what TensorRT tunes its tactics for:
    # the mutation round's opt = max survived, the check above reading fixed shapes only)
    for prof, want in zip(cfg.profiles, target.profiles):
        assert {n: (tuple(s.min), tuple(s.opt), tuple(s.max)) for n, s in prof.items()} == want.shapes, want.role
    assert any(opt != hi for p in target.profiles for _, opt, hi in p.shapes.values())  # (one whose opt is not its max)
    assert build._network.path == str(tmp_path / "export/target.onnx")
    assert build._network.strongly_typed is False  # a float32 export: TensorRT types the layers
    roles = make_roles(DEPTHS, CTX, "peagle", opt_past=128, draft_accepted=2)
    typed = trt_plan(roles, IO, FILES, "fp16", "float16")
    assert engine_loader(typed, typed.engines[0], tmp_path)._engine._network.strongly_typed is True


def test_build_sizes_activation_memory_per_call_where_tensorrt_can(monkeypatch):
    """polygraphy's "runtime" allocation asks the context, before every call, how much
    activation memory the bound shapes need; an engine reports that (not its profile's
    maximum, the whole context for the prefill and draft profiles) only when built with
    TensorRT 10.10's RUNTIME_ACTIVATION_RESIZE_10_10 preview feature, off unless set. The
    config step sets it where the installed TensorRT has it and leaves older ones alone.
    TensorRT is absent here, so a stand-in module names the enum (no TensorRT runs)."""
    import sys
    from types import SimpleNamespace

    from specrt.engines.tensorrt import RUNTIME_RESIZE, activation_resize

    class Config:  # a builder config's one call this step makes
        def __init__(self):
            self.features = {}

        def set_preview_feature(self, feature, on):
            self.features[feature] = on

    assert RUNTIME_RESIZE == "RUNTIME_ACTIVATION_RESIZE_10_10"  # (the enum's name in TensorRT 10.10)
    for have, want in ((True, {"resize": True}), (False, {})):  # TensorRT >= 10.10, then an older one
        features = SimpleNamespace(**({RUNTIME_RESIZE: "resize"} if have else {}), PROFILE_SHARING_0806="sharing")
        monkeypatch.setitem(sys.modules, "tensorrt", SimpleNamespace(PreviewFeature=features))
        config = Config()
        activation_resize(None, None, config)
        assert config.features == want


def test_engine_per_role_plans_add_their_weights(tmp_path):
    """engines.json's weight_bytes is each graph's weights as the backend holds them: in the
    ``engines`` layout one copy per role's plan (the target's five plans here), not the
    last plan's size alone."""
    from specrt.engines.tensorrt import weight_bytes

    p = trt_plan(make_roles((2, 4), CTX, "peagle"), IO, FILES, "fp32", "float32", layout="engines")
    for i, e in enumerate(p.engines):
        (tmp_path / e.file).write_bytes(b"w" * (100 + i))
    assert weight_bytes(p, tmp_path) == {"target": 100 + 101 + 102 + 103, "draft": 104}
    one = trt_plan(make_roles((2, 4), CTX, "peagle"), IO, FILES, "fp32", "float32")  # profiles: one plan a graph
    (tmp_path / "target.plan").write_bytes(b"w" * 7)
    assert weight_bytes(one, tmp_path) == {"target": 7, "draft": 104}


def test_trt_runner_copies_the_outputs_polygraphy_resizes(tmp_path):
    """polygraphy returns views of host buffers it resizes in place (refcheck=False) when a
    call needs another size: an earlier prefill or draft result would point at freed
    memory. Those roles' outputs are copied; fixed-size roles keep the buffers (base.py's
    contract: valid until the runner's next call). The runner asks polygraphy for
    activation memory sized to the shapes it is called with, not its profile's maximum
    (prefill and draft profiles reach the whole context)."""
    import inspect

    import numpy as np

    from specrt.engines.tensorrt import TrtEngines, TrtRunner

    roles = make_roles(DEPTHS, CTX, "peagle", opt_past=128, draft_accepted=2)
    buf = np.arange(12, dtype=np.float32)

    class Buffers:  # what polygraphy's TrtRunner.infer hands back: its own host buffers
        def infer(self, feeds, check_inputs):
            return {"logits": buf[:6]}

    ios = {"target": C.target_io(L, KVH, D, V, H, "float32"), "draft": C.peagle_io(1, KVH, D, V, H, "float32")}
    copied = {}
    for name, role in roles.items():
        io = ios[role.graph]
        r = TrtRunner(role, io.inputs, io.outputs, TrtEngines(tmp_path), "x.plan", 0)
        r._runner = Buffers()
        out = r.infer_impl({})["logits"]
        copied[name] = not np.shares_memory(out, buf)
        assert np.array_equal(out, buf[:6])
    assert copied == {n: n in ("prefill", "draft") for n in roles}
    assert 'allocation_strategy="runtime"' in inspect.getsource(TrtRunner.activate_impl)


def test_a_rebuild_starts_from_the_timing_cache_of_this_environment(tmp_path):
    """`specrt build --backend tensorrt --force` builds into a new folder: the old one's
    timing cache is carried over when it was made by this TensorRT on this GPU, so the
    tactics are not timed again; one from elsewhere is left behind, and said."""
    from specrt.engines.build import carry_timing_cache

    env = {"backend": "tensorrt", "backend_version": "10.9.0", "device": {"kind": "gpu", "name": "NVIDIA H200"}}
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "timing.cache").write_bytes(b"tactics")
    (old / "engines.json").write_text(json.dumps({"environment": env}))
    said = []
    assert carry_timing_cache(old, new, "timing.cache", env, said.append)
    assert (new / "timing.cache").read_bytes() == b"tactics" and "tactic timings of" in said[-1]
    (new / "timing.cache").unlink()
    for other in ({**env, "backend_version": "10.10.0"}, {**env, "device": {"kind": "gpu", "name": "NVIDIA L4"}}):
        assert not carry_timing_cache(old, new, "timing.cache", other, said.append)
        assert not (new / "timing.cache").exists() and "not reused" in said[-1] and "another environment" in said[-1]
    (old / "engines.json").write_text("{broken")
    assert not carry_timing_cache(old, new, "timing.cache", env, said.append)
    # a manifest without its environment, a folder where the cache was (B18, B17 of session 69's mutation
    # round: a KeyError traceback, IsADirectoryError from the copy)
    (old / "engines.json").write_text("{}")
    assert not carry_timing_cache(old, new, "timing.cache", env, said.append) and "not reused" in said[-1]
    (old / "engines.json").write_text(json.dumps({"environment": env}))
    (old / "timing.cache").unlink()
    assert not carry_timing_cache(old, new, "timing.cache", env, said.append)
    (old / "timing.cache").mkdir()
    assert not carry_timing_cache(old, new, "timing.cache", env, said.append) and not (new / "timing.cache").exists()



class PlanIO:
    """A deserialised plan's I/O as TensorRT's ICudaEngine reports it (no TensorRT here): its
    enums print as "DataType.FLOAT", "TensorIOMode.INPUT"."""

    TRT_NAME = {"float32": "FLOAT", "int64": "INT64", "float16": "HALF", "bfloat16": "BF16"}

    def __init__(self, tensors):
        self.tensors = tensors
        self.num_io_tensors = len(tensors)

    @classmethod
    def of(cls, io, skip=()) -> dict:
        """name -> (mode, TensorRT dtype) of a contract's tensors, its optional inputs left out."""
        ins = [t for t in io.inputs if not t.optional]
        return {**{t.name: ("INPUT", cls.TRT_NAME[t.dtype]) for t in ins if t.name not in skip},
                **{t.name: ("OUTPUT", cls.TRT_NAME[t.dtype]) for t in io.outputs if t.name not in skip}}

    def get_tensor_name(self, i):
        return list(self.tensors)[i]

    def get_tensor_mode(self, name):
        return f"TensorIOMode.{self.tensors[name][0]}"

    def get_tensor_dtype(self, name):
        return f"DataType.{self.tensors[name][1]}"


def test_a_plan_whose_io_is_not_the_contract_is_refused_at_activation():
    """With check_inputs off polygraphy copies a feed's raw bytes into the binding: an int64
    feed into an int32 one would decode garbage. A plan's tensors are checked against the
    contract (names, input or output, dtypes) before a runner starts; the engine is read
    through TensorRT's ICudaEngine interface (num_io_tensors, get_tensor_name / mode / dtype)."""
    from specrt.engines.tensorrt import check_plan_io

    io = C.target_io(L, KVH, D, V, H, "float32")
    good = PlanIO.of(io)
    check_plan_io(PlanIO(good), io.inputs, io.outputs, "target.plan", "decode")
    for change, words in (({C.INPUT_IDS: ("INPUT", "INT32")}, f"{C.INPUT_IDS}: int32 in the plan, the contract's is int64"),
                          ({C.LOGITS: ("INPUT", "FLOAT")}, f"{C.LOGITS}: an input of the plan, expected an output")):
        with pytest.raises(UserError, match=f"target.plan \\(role decode\\): .*{words}"):
            check_plan_io(PlanIO({**good, **change}), io.inputs, io.outputs, "target.plan", "decode")
    missing = {k: v for k, v in good.items() if k != C.POSITION_IDS}
    with pytest.raises(UserError, match=f"{C.POSITION_IDS}: missing.*rebuild it"):
        check_plan_io(PlanIO(missing), io.inputs, io.outputs, "target.plan", "decode")


def test_the_plan_io_check_reads_every_export_dtype_and_names_what_differs():
    """float16 and bfloat16 exports' plans (TensorRT's HALF, BF16) pass as the contract's, an
    optional input the plan lacks (the in-place layout's logits_from) is no problem, a dtype
    the table lacks is named in lower case, and the refusal names the first four problems, then
    "..." (mutants of tensorrt.py's dtype table and message survived)."""
    from specrt.engines.tensorrt import check_plan_io

    for dtype in ("float16", "bfloat16"):
        io = C.target_io(L, KVH, D, V, H, dtype)
        check_plan_io(PlanIO(PlanIO.of(io)), io.inputs, io.outputs, "target.plan", "decode")
    io = C.target_io(L, KVH, D, V, H, "float32", kv="inplace")
    assert any(t.optional for t in io.inputs)
    check_plan_io(PlanIO(PlanIO.of(io)), io.inputs, io.outputs, "target.plan", "decode")
    odd = {**PlanIO.of(io), C.INPUT_IDS: ("INPUT", "INT4")}
    with pytest.raises(UserError, match=f"{C.INPUT_IDS}: int4 in the plan, the contract's is int64"):
        check_plan_io(PlanIO(odd), io.inputs, io.outputs, "target.plan", "decode")
    renamed = {(k.upper() if k == C.INPUT_IDS else k): v for k, v in PlanIO.of(io).items()}  # (names are exact)
    with pytest.raises(UserError, match=f"{C.INPUT_IDS}: missing; {C.INPUT_IDS.upper()}: an input of the plan the "
                                        "contract lacks"):
        check_plan_io(PlanIO(renamed), io.inputs, io.outputs, "target.plan", "decode")
    # an output the contract lacks is computed and dropped; an input no feed sets is refused
    check_plan_io(PlanIO({**PlanIO.of(io), "spare": ("OUTPUT", "FLOAT")}), io.inputs, io.outputs, "t.plan", "decode")
    with pytest.raises(UserError, match="spare: an input of the plan the contract lacks\\); rebuild"):
        check_plan_io(PlanIO({**PlanIO.of(io), "spare": ("INPUT", "FLOAT")}), io.inputs, io.outputs, "t.plan", "d")
    names = [t.name for t in io.inputs if not t.optional]
    for n, tail in ((4, r"missing\); rebuild"), (5, r"missing; \.\.\.\); rebuild")):
        with pytest.raises(UserError, match=tail) as e:
            check_plan_io(PlanIO(PlanIO.of(io, skip=names[:n])), io.inputs, io.outputs, "target.plan", "decode")
        assert [w for w in names if f"{w}: missing" in str(e.value)] == names[:4]


def test_trt_runners_share_one_plan_and_the_last_one_frees_it(tmp_path, monkeypatch):
    """Runners of one plan's roles share the deserialised engine (TrtEngines): each asks
    polygraphy for its own profile, the plan stays loaded while any runner holds it and goes
    with the last; a plan whose I/O is not the contract is refused before a runner starts, and
    is not held. TensorRT is absent here: the engine is put in as loaded, and polygraphy's
    TrtRunner (which needs TensorRT to activate) is a stand-in that records its arguments."""
    import polygraphy.backend.trt as pg

    from specrt.engines.tensorrt import TrtEngines, TrtRunner

    made = []

    class PgRunner:
        def __init__(self, engine, name, optimization_profile, allocation_strategy):
            made.append(self)
            self.engine, self.profile, self.allocation = engine, optimization_profile, allocation_strategy
            self.calls = []

        def activate(self):
            pass

        def infer(self, feeds, check_inputs):
            self.calls.append(check_inputs)
            return {}

        def deactivate(self):
            pass

    monkeypatch.setattr(pg, "TrtRunner", PgRunner)
    roles = make_roles(DEPTHS, CTX, "peagle")
    io = C.target_io(L, KVH, D, V, H, "float32")
    engines, plan = TrtEngines(tmp_path), PlanIO(PlanIO.of(io))
    engines._engines["target.plan"] = plan  # (deserialised: EngineFromBytes, which needs TensorRT)
    runners = [TrtRunner(roles[r], io.inputs, io.outputs, engines, "target.plan", i)
               for i, r in ((1, "decode"), (3, "verify.2"))]
    for r in runners:
        r.activate()
    assert [(m.engine, m.profile, m.allocation) for m in made] == [(plan, 1, "runtime"), (plan, 3, "runtime")]
    runners[0].infer_impl({})
    assert made[0].calls == [False]  # (the feeds are checked by base.py's Runner, not again by polygraphy)
    runners[0].deactivate()
    assert engines._engines == {"target.plan": plan}
    runners[1].deactivate()
    assert engines._engines == {} and engines._users == {}
    engines._engines["target.plan"] = PlanIO(PlanIO.of(io, skip=[C.LOGITS]))
    r = TrtRunner(roles["decode"], io.inputs, io.outputs, engines, "target.plan", 1)
    with pytest.raises(UserError, match=f"{C.LOGITS}: missing"):
        r.activate()
    assert len(made) == 2 and engines._engines == {} and not r.is_active


def test_a_failed_tensorrt_call_is_an_engine_failure_in_one_line(tmp_path):
    """polygraphy's exception for a failed TensorRT call becomes an EngineFailure naming the
    engine, the plan and TensorRT, its words on one line and cut at 600 characters."""
    from polygraphy.exception import PolygraphyException

    from specrt.engines.tensorrt import TrtEngines, TrtRunner
    from specrt.errors import EngineFailure

    class Failing:
        def infer(self, feeds, check_inputs):
            raise PolygraphyException("execute_async_v3 failed:\n    out of memory " + "x" * 1000)

    io = C.target_io(L, KVH, D, V, H, "float32")
    r = TrtRunner(make_roles(DEPTHS, CTX, "peagle")["decode"], io.inputs, io.outputs, TrtEngines(tmp_path), "t.plan", 1)
    r._runner = Failing()
    with pytest.raises(EngineFailure, match=r"^engine 'decode' \(t\.plan\) failed in TensorRT: "
                                            r"execute_async_v3 failed: out of memory x+$") as e:
        r.infer_impl({})
    assert len(str(e.value).split(": ", 1)[1]) == 600


def test_a_broken_tensorrt_install_is_a_user_error(tmp_path, monkeypatch):
    """A tensorrt package that is there but cannot load its libraries (libnvinfer missing: an
    ImportError, not ModuleNotFoundError) is the same clear error as none, not a traceback,
    for a build and for a plan loaded to run."""
    import sys

    from specrt.engines.tensorrt import TrtEngines, require_tensorrt

    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.py").write_text(
        "raise ImportError('libnvinfer.so.10: cannot open shared object file: No such file or directory')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(UserError, match="needs TensorRT"):
        require_tensorrt()
    with pytest.raises(UserError, match="needs TensorRT"):  # loading a plan to run says the same
        TrtEngines(tmp_path).acquire("target.plan")


def test_depths_reach_max_depth_inclusive():
    # kills P1 (plan.py:96 `1 <= d <= MAX_DEPTH` -> `< MAX_DEPTH`: the documented deepest depth refused)
    from specrt.engines.plan import parse_depths
    from specrt.errors import UserError
    from specrt.limits import MAX_DEPTH

    assert parse_depths(f"1,{MAX_DEPTH}") == (1, MAX_DEPTH)
    with pytest.raises(UserError, match=rf"--depths: \[{MAX_DEPTH + 1}\] out of range \(each depth must be in "
                                        rf"1..{MAX_DEPTH}\)"):
        parse_depths(str(MAX_DEPTH + 1))
    with pytest.raises(UserError, match=r"--depths: \[0\] out of range"):
        parse_depths([0, 2])


def test_cache_rows_are_a_target_dimension_only():
    # kills P17 (plan.py:206 with_cache_rows without `if role.graph == "target"`: the draft role,
    # whose graph has no KV buffers, recorded a cache_tokens range in engines.json)
    from specrt import contracts as C
    from specrt.engines.plan import DimRange, make_roles, with_cache_rows

    roles = make_roles((1, 4), 64, "peagle")
    rows = with_cache_rows(roles, 64)
    assert rows["draft"] == roles["draft"] and C.DIM_CACHE not in rows["draft"].dims
    assert all(rows[n].dims[C.DIM_CACHE] == DimRange.of(64) for n in roles if n != "draft")


# ---- mutation round of engines/build, plan and manifest (M-ids in the round's report) ----


def test_a_precision_is_named_in_any_case():
    # kills M05 (plan.py:74 without .lower(): "FP16" and "Float32", as a user types them, refused)
    assert normalise_precision("FP16", "float32") == "fp16"
    assert normalise_precision("Float32", "float32") == "fp32"
    # (a space around it, as --governor and --dtype take: "'fp32 '" was refused where "FP32" ran)
    assert normalise_precision(" bf16 ", "float32") == normalise_precision("bfloat16\t", "float32") == "bf16"
    with pytest.raises(UserError, match=r"--precision 'FP8' is not supported \(choose one of fp32, fp16, bf16\)"):
        normalise_precision("FP8", "float32")
    with pytest.raises(UserError, match="export dtype 'int8' is not one of float32, float16, bfloat16"):
        normalise_precision(None, "int8")


def test_a_range_whose_opt_is_outside_it_is_an_internal_error():
    # kills M11 (plan.py:111 checking min <= max only: an opt past max, what TensorRT tunes for, passed)
    from specrt.errors import InternalError

    for lo, opt, hi in ((0, 5, 3), (3, 1, 5), (-1, 0, 0)):
        with pytest.raises(InternalError, match="bad dimension range"):
            DimRange(lo, opt, hi)
    assert DimRange(2, 2, 2).fixed and not DimRange(1, 2, 2).fixed
    # kills M12 (plan.py:116 `fixed` as min == opt: prefill's past range [0, 0, C - 1], whose opt is
    # its min, taken as fixed, so ONNX Runtime pinned the dimension at 0)
    assert not DimRange(0, 0, 5).fixed and not DimRange(0, 5, 5).fixed


def test_an_unknown_draft_kind_has_no_engine():
    # kills M25 (plan.py:197's error dropped: a draft kind specrt has no graph for built a target-only set)
    with pytest.raises(UserError, match="draft kind 'medusa' has no engine \\(expected peagle or eagle3\\)"):
        make_roles((1, 2), CTX, "medusa")


# ---- mutation round 68 of contracts, head and plan (P-ids in the round's report) ----


def test_every_role_round_trips_through_json_in_min_opt_max_order():
    # kills P12 (plan.py:119 DimRange.to_json as [min, max, opt]: verify.2's ranges, whose opt is their
    # max, read back the same; the prefill's new tokens [1, 128, C] did not)
    roles = make_roles(DEPTHS, CTX, "peagle", opt_past=128, draft_accepted=2)
    assert roles["prefill"].to_json()["dims"][C.DIM_NEW] == [1, 128, CTX]
    for name, r in roles.items():
        assert Role.from_json(name, json.loads(json.dumps(r.to_json()))) == r, name


def test_typical_sizes_outside_a_range_are_clipped_into_it():
    # kills P26 (plan.py:190 the accepted count clipped to C - 1) and P46 (plan.py:187 the draft's past
    # opt clipped to C - 1, not its own C + K - 1): TensorRT tuned below the size the build asked for
    roles = make_roles((1, 4), 16, "peagle", opt_past=999, opt_prompt=999, draft_accepted=999)
    d = roles["draft"].dims
    assert d[C.DIM_PAST] == DimRange(0, 19, 19) and d[C.DIM_AUX] == DimRange(1, 16, 16)
    assert d[C.DIM_NEW] == DimRange(1, 16 + 3, 20)  # A + M slots, M = K - 1
    assert roles["decode"].dims[C.DIM_PAST] == DimRange(0, 15, 15)
    assert roles["verify.4"].dims[C.DIM_PAST] == DimRange(0, 11, 11)
    assert roles["prefill"].dims[C.DIM_NEW] == DimRange(1, 16, 16)
    # ... and below it to its minimum (P18: clip without its lower bound made opt < min, an InternalError)
    low = make_roles((1, 4), 16, "peagle", opt_past=-1, opt_prompt=0, draft_accepted=0)
    assert low["draft"].dims[C.DIM_AUX] == DimRange(1, 1, 16) and low["prefill"].dims[C.DIM_NEW] == DimRange(1, 1, 16)
    assert low["decode"].dims[C.DIM_PAST] == DimRange(0, 0, 15)


def test_a_drafts_limit_reaches_its_depth_past_the_context():
    # kills P30 (plan.py:196 the EAGLE-3 draft's limit C, not C + K: its runner refused the passes of
    # the last rounds before the context limit, which its own ranges allow)
    for kind in ("peagle", "eagle3"):
        roles = make_roles((1, 4), CTX, kind)
        assert roles["draft"].limit == CTX + 4, kind
        assert all(r.limit == CTX for n, r in roles.items() if n != "draft"), kind


def test_an_input_dimension_without_a_range_is_an_internal_error():
    # kills P15 (plan.py:145's check dropped: an AttributeError on None, naming neither role nor input)
    from specrt.errors import InternalError

    decode = make_roles((1,), CTX, None)["decode"]  # (no with_cache_rows: no cache_tokens range)
    with pytest.raises(InternalError, match="role decode: input x has dim 'cache_tokens' with no range"):
        decode.shapes([{"name": "x", "dtype": "float32", "shape": [1, 2, C.DIM_CACHE, 16]}])


def test_a_depth_that_is_not_a_number_is_a_user_error():
    # kills P39 (plan.py:90 catching the wrong exception: "1,two" ended in int()'s ValueError, a traceback)
    with pytest.raises(UserError, match="--depths '1,two': expected comma-separated integers such as 1,2,4,8"):
        parse_depths("1,two")


def test_depths_given_as_numpy_integers_are_python_ints():
    # kills P40 (plan.py:93 the depths kept as given: numpy's integers reached engines.json, which json cannot
    # write, and a role name through str())
    import numpy as np

    depths = parse_depths(np.array([4, 1]))
    assert depths == (1, 4) and all(type(d) is int for d in depths) and json.dumps(depths) == "[1, 4]"


def test_the_symbolic_dimensions_are_distinct_names():
    # kills C44 (contracts.py DIM_DEPTH spelled "new_tokens": a P-EAGLE pass's K output rows declared equal
    # to its S = A + M input slots, true for A = 1 only; a role's ranges, keyed by these names, merge too)
    dims = (C.DIM_NEW, C.DIM_PAST, C.DIM_AUX, C.DIM_PREV, C.DIM_DEPTH, C.DIM_CACHE)
    assert len(set(dims)) == len(dims), dims
    pe = {t.name: t.shape for t in C.peagle_io(1, KVH, D, V, H, "float32").outputs}
    assert pe[C.DRAFT_TOKENS] == (1, C.DIM_DEPTH) and C.DIM_DEPTH != C.DIM_NEW


def test_a_roles_depth_is_its_whole_number():
    # kills P51 (plan.py:63 a verify role's depth read from its last character: verify.16 (MAX_DEPTH is 64)
    # was depth 6 in the cost table and compare's rows)
    from specrt.engines.plan import role_depth, verify_role

    assert [role_depth(verify_role(d)) for d in (1, 8, 16, 64)] == [1, 8, 16, 64]
    assert role_depth("decode") == 0 and role_depth("prefill") is None and role_depth("draft") is None


def test_the_context_is_checked_against_the_deepest_depth_of_several():
    # kills P52 (plan.py:169 the shallowest depth checked: depths 1,8 at context 9 passed, one token short)
    with pytest.raises(UserError, match="--max-context 9 is too small for depth 8: expected at least 10"):
        make_roles((1, 8), 9, None)
    assert set(make_roles((1, 8), 10, None)) == {"prefill", "decode", "verify.1", "verify.8"}
