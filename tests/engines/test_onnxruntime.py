"""ONNX Runtime engines give the export graph's outputs, per depth, on realistic inputs.

Reference: the export's own graph run by a plain ``onnxruntime.InferenceSession``
(default options). Inputs: a 24-token prompt prefilled by that plain session; its new
KV becomes the committed past (held in preallocated [1, MAX, KVH, D] buffers and fed as
prefix views, as the runtime does); then every depth's verify step and a draft round.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnxruntime as ort
import pytest

from specrt import contracts as C
from specrt.engines import load_engines
from specrt.errors import InternalError, UserError

from .conftest import DEPTHS

PROMPT = 24
MAX = 256
TOL = dict(rtol=1e-5, atol=1e-5)


def plain(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


class State:
    """Committed target and draft KV after a real prefill of a prompt."""

    def __init__(self, export_dir, manifest):
        rng = np.random.default_rng(0)
        t, d = manifest["target"], manifest["draft"]
        self.target = plain(export_dir / "target.onnx")
        self.draft = plain(export_dir / "draft.onnx")
        self.mask = d["mask_token_id"]
        self.vocab = t["vocab_size"]
        self.prompt = rng.integers(3, self.vocab - 2, PROMPT)
        self.tkv = {n: np.zeros((1, MAX, t["num_kv_heads"], t["head_dim"]), np.float32)
                    for i in range(t["num_layers"]) for n in (C.past_key(i), C.past_value(i))}
        self.dkv = {n: np.zeros((1, MAX, d["num_kv_heads"], d["head_dim"]), np.float32)
                    for i in range(d["num_layers"]) for n in (C.past_key(i), C.past_value(i))}
        out = self.run_target(self.prompt, 0, commit=True)
        self.aux = out[C.AUX_HIDDEN]  # [1, PROMPT, 3H]
        nxt = int(out[C.LOGITS][0, -1].argmax())
        # draft round 1 over the prompt: slot t carries token t+1 with the target's hidden at t
        real = np.append(self.prompt[1:], nxt)
        dout = self.draft.run(None, self.draft_feeds(real, self.aux, 0, 0))
        names = [o.name for o in self.draft.get_outputs()]
        for n, v in zip(names, dout):
            if n.startswith("new_"):
                self.dkv[n.replace("new_", "past_")][:, :PROMPT] = v[:, :PROMPT]
        self.n = PROMPT

    def past(self, kv, n):
        return {k: v[:, :n] for k, v in kv.items()}

    def target_feeds(self, tokens, start):
        return {C.INPUT_IDS: np.asarray(tokens, np.int64)[None],
                C.POSITION_IDS: np.arange(start, start + len(tokens), dtype=np.int64)[None],
                **self.past(self.tkv, start)}

    def run_target(self, tokens, start, commit=False):
        feeds = self.target_feeds(tokens, start)
        names = [o.name for o in self.target.get_outputs()]
        out = dict(zip(names, self.target.run(None, feeds)))
        if commit:
            for k, v in out.items():
                if k.startswith("new_"):
                    self.tkv[k.replace("new_", "past_")][:, start:start + len(tokens)] = v
        return out

    def draft_feeds(self, real, aux, start_pos, past_n, k=max(DEPTHS)):
        ids = np.concatenate([np.asarray(real, np.int64), np.full(k - 1, self.mask, np.int64)])
        pos = np.arange(start_pos, start_pos + len(ids), dtype=np.int64)[None]
        return {C.INPUT_IDS: ids[None], C.POSITION_IDS: pos,
                C.DRAFT_AUX_IN: np.ascontiguousarray(aux, np.float32), **self.past(self.dkv, past_n)}


@pytest.fixture(scope="module")
def state(tiny_engines_append):
    from specrt.manifest import load_export

    exp_dir = tiny_engines_append / "export"
    return State(exp_dir, load_export(exp_dir))


def alloc_peak(runner, feeds, calls: int = 20) -> int:
    """Peak Python-side bytes (tracemalloc: numpy's too) over ``calls`` warm calls."""
    runner.infer(feeds)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(calls):
        runner.infer(feeds)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def check_same(runner, session, feeds):
    got = runner.infer(feeds)
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feeds)))
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].shape == v.shape, k
        if v.dtype.kind == "i":
            np.testing.assert_array_equal(got[k], v, err_msg=k)
        else:
            np.testing.assert_allclose(got[k], v, err_msg=k, **TOL)
    return got


@pytest.mark.parametrize("sessions", ["shared", "per-depth"])
def test_every_role_matches_the_export_graph(tiny_engines_append, state, sessions):
    rng = np.random.default_rng(1)
    engines = load_engines(tiny_engines_append, ort_overrides={"sessions": sessions})
    with engines:
        # prefill over an empty cache (past views of length 0)
        check_same(engines.target(PROMPT), state.target, state.target_feeds(state.prompt, 0))
        for d in (0, *DEPTHS):
            tokens = rng.integers(0, state.vocab, d + 1)
            runner = engines.target(d + 1)
            assert runner.name == ("decode" if d == 0 else f"verify.{d}")
            check_same(runner, state.target, state.target_feeds(tokens, state.n))
        # a draft round: A = 2 real slots (the accepted token and the bonus) + K - 1 masks
        real = rng.integers(0, state.vocab, 2)
        aux = state.run_target(real, state.n)[C.AUX_HIDDEN]
        check_same(engines.draft(), state.draft, state.draft_feeds(real, aux, state.n, state.n))


def test_fixed_outputs_are_reused_buffers_and_stay_correct(tiny_engines_append, state):
    rng = np.random.default_rng(2)
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(4)
        first = check_same(r, state.target, state.target_feeds(rng.integers(0, 999, 5), state.n))
        logits = first[C.LOGITS]
        again = check_same(r, state.target, state.target_feeds(rng.integers(0, 999, 5), state.n - 3))
        assert again[C.LOGITS] is logits  # preallocated once, overwritten in place


def test_a_decode_step_allocates_nothing_proportional_to_the_context(tiny_engines_append, state):
    """Python-side allocations per step (tracemalloc sees numpy's) are small and the same at
    a short and a long past: past KV is bound in place, outputs are preallocated."""
    rng = np.random.default_rng(3)
    big = {k: rng.standard_normal(v.shape, dtype=np.float32) for k, v in state.tkv.items()}
    peaks = {}
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(2)
        for past in (8, 240):
            feeds = {C.INPUT_IDS: np.ones((1, 3), np.int64),
                     C.POSITION_IDS: np.arange(past, past + 3, dtype=np.int64)[None],
                     **{k: v[:, :past] for k, v in big.items()}}
            peaks[past] = alloc_peak(r, feeds)
    kv_bytes = sum(v[:, :240].nbytes for v in big.values())
    assert max(peaks.values()) < 16 * 1024, peaks
    assert max(peaks.values()) < kv_bytes / 20, (peaks, kv_bytes)


def test_feeds_are_checked_against_the_role(tiny_engines_append, state):
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(4)
        good = state.target_feeds(np.arange(5), state.n)
        with pytest.raises(UserError, match="input_ids"):
            r.infer(state.target_feeds(np.arange(3), state.n))
        with pytest.raises(UserError, match="dtype int32"):
            r.infer({**good, C.INPUT_IDS: good[C.INPUT_IDS].astype(np.int32)})
        with pytest.raises(UserError, match="C-contiguous"):
            r.infer({**good, C.past_key(0): state.tkv[C.past_key(0)][:, : 2 * state.n : 2]})
        with pytest.raises(UserError, match="missing"):
            r.infer({k: v for k, v in good.items() if k != C.past_value(3)})
        with pytest.raises(UserError, match="past_tokens = 30, but another input has 24"):
            r.infer({**good, C.past_key(2): state.tkv[C.past_key(2)][:, :30]})
        with pytest.raises(UserError, match="past_tokens = 252 is outside"):
            r.infer(state.target_feeds(np.arange(5), 252))
        # (mutation round 5) an input no graph has, a rank short, the range's last value (in it)
        with pytest.raises(UserError, match=r"inputs do not match: missing \[\], unknown \['bogus'\]"):
            r.infer({**good, "bogus": good[C.INPUT_IDS]})
        with pytest.raises(UserError, match=r"input 'input_ids' has shape \[5\], expected rank 2 \[1, 5\]"):
            r.infer({**good, C.INPUT_IDS: good[C.INPUT_IDS][0]})
        assert r.dims[C.DIM_PAST].max == 251
        r.check_feeds(state.target_feeds(np.arange(5), 251))
        p = engines.target(247)  # the prefill: past and new each in its range, their sum past the context
        assert p is engines.runners["prefill"] and p.max_context == 256
        with pytest.raises(UserError, match=r"'prefill': past 10 \+ new 247 tokens exceed the limit 256 it was built"):
            p.check_feeds(state.target_feeds(np.arange(247) % 100, 10))
        p.check_feeds(state.target_feeds(np.arange(246) % 100, 10))  # at the limit: taken
        with pytest.raises(UserError, match="no verify engine for depth 3"):
            engines.verify(3)
    with pytest.raises(InternalError, match="before activate"):
        r.infer(good)



def test_an_input_fed_again_still_meets_the_other_inputs_dims(tiny_engines_append, state):
    """An array fed again (the same object, as the runtime's cache views are) skips its own
    checks but still gives its symbolic dims for the others to meet: a new past of another
    length among pasts fed again is refused by the runner's own check, naming it (mutation
    round 5: without them it went to the backend)."""
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(2)
        feeds = state.target_feeds(np.arange(3), state.n)
        r.infer(feeds)
        r.infer(feeds)  # (fed again: each array checked by identity)
        last = [t.name for t in r.inputs if t.name in state.tkv][-1]  # every past before it fed again
        with pytest.raises(UserError, match=rf"input '{last}' has {C.DIM_PAST} = {state.n - 1}, but another input "
                                            rf"has {state.n}$"):
            r.infer({**feeds, last: state.tkv[last][:, :state.n - 1]})


def test_a_runner_refuses_a_second_activation_and_names_what_the_feeds_lack(tiny_engines_append, state):
    """A runner activated twice is a bug of its caller (mutant B03: the session acquired again
    over the first); feeds short of an input name every one missing (B07: only the first,
    found later); an array fed again whose dtype was reinterpreted in place (same object, same
    shape) is checked again (B10: passed by identity to the backend)."""
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(2)
        with pytest.raises(InternalError, match="^runner verify.2 is already active$"):
            r.activate()
        feeds = state.target_feeds(np.arange(3), state.n)
        short = {k: v for k, v in feeds.items() if k not in (C.past_key(1), C.past_value(3))}
        with pytest.raises(UserError, match=rf"^engine 'verify.2': inputs do not match: missing "
                                            rf"\['{C.past_key(1)}', '{C.past_value(3)}'\], unknown \[\]$"):
            r.infer(short)
        renamed = {("bogus" if k == C.past_value(3) else k): v for k, v in feeds.items()}
        with pytest.raises(UserError, match=rf"^engine 'verify.2': input '{C.past_value(3)}' is missing$"):
            r.infer(renamed)  # (as many feeds as inputs, one of another name: B39 named none)
        with pytest.raises(UserError, match=r"input 'input_ids' has shape \[1, 4\], expected \[1, 3\]$"):
            r.infer(state.target_feeds(np.arange(4), state.n))  # (B15: a fixed dim too large passed)
        r.infer(feeds)
        # another array of the shape and dtype of the one checked last: checked itself (B09: taken as
        # the same, a strided view went to the backend)
        strided = np.ascontiguousarray(np.repeat(feeds[C.past_key(0)], 2, axis=1))[:, ::2]
        with pytest.raises(UserError, match=f"input '{C.past_key(0)}' must be C-contiguous"):
            r.infer({**feeds, C.past_key(0): strided})
        feeds[C.INPUT_IDS].dtype = np.float64  # (the same bytes, read as another type)
        with pytest.raises(UserError, match="input 'input_ids' has dtype float64, expected int64"):
            r.infer(feeds)


def test_a_runner_deactivated_twice_releases_its_session_once(tiny_engines_append, state):
    """deactivate() on an inactive runner does nothing (mutant B05: it released the shared
    session again, and the engine set's own deactivation then failed with a KeyError). A
    call records its time (``last_inference_time``, polygraphy's inference time in
    `specrt compare`: None after every call with mutant B38)."""
    with load_engines(tiny_engines_append) as engines:
        r = engines.verify(2)
        r.deactivate()
        r.deactivate()
        r4 = engines.verify(4)
        assert r4.last_inference_time is None
        assert r4.infer(state.target_feeds(np.arange(5), state.n))[C.LOGITS].shape[1] == 5
        assert 0 < r4.last_inference_time < 60
    assert all(x.graph._sessions == {} and x.graph._users == {} for x in engines.runners.values())


def test_external_weights_are_read_whole_and_from_the_graphs_own_folder(tmp_path):
    """load_onnx and initializer_reader read a weight's external data by offset from the file
    beside the graph: a data file cut short is named with the weight (its bytes came out
    short, an onnx traceback or a wrong tensor), and a location outside the graph's folder is
    refused (it was read from wherever it led)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from specrt.engines.base import initializer_reader, load_onnx

    w = np.arange(64, dtype=np.float32).reshape(8, 8)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(w, "w")])
    (tmp_path / "g").mkdir()
    path = tmp_path / "g" / "m.onnx"
    onnx.save_model(helper.make_model(graph), str(path), save_as_external_data=True, location="m.onnx.data",
                    size_threshold=0)
    np.testing.assert_array_equal(numpy_helper.to_array(load_onnx(path).graph.initializer[0]), w)
    np.testing.assert_array_equal(initializer_reader(path)[1]("w"), w)
    data = tmp_path / "g" / "m.onnx.data"
    data.write_bytes(data.read_bytes()[:100])
    for read in (load_onnx, lambda p: initializer_reader(p)[1]("w")):
        with pytest.raises(UserError, match=f"^{data}: too short for weight 'w' of m.onnx$"):
            read(path)
    m = onnx.load(str(path), load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../m.onnx.data"
    onnx.save_model(m, str(path))
    (tmp_path / "m.onnx.data").write_bytes(w.tobytes())  # (there, and whole)
    for read in (load_onnx, lambda p: initializer_reader(p)[1]("w")):
        with pytest.raises(UserError, match=rf"^{path}: weight 'w' points outside its folder \('../m.onnx.data'\)$"):
            read(path)
    # offset and length left out (ONNX makes both optional): the weight's whole size from the file's start
    # (mutants B35, B44: 0 bytes read, or from byte 1)
    (tmp_path / "g" / "m.onnx.data").write_bytes(w.tobytes())
    t = m.graph.initializer[0]
    del t.external_data[:]
    t.external_data.add(key="location", value="m.onnx.data")
    onnx.save_model(m, str(path))
    np.testing.assert_array_equal(initializer_reader(path)[1]("w"), w)
    np.testing.assert_array_equal(numpy_helper.to_array(load_onnx(path).graph.initializer[0]), w)


def test_a_runner_whose_engine_fails_to_load_stays_inactive(engines_copy):
    """activate() acquires the engine, then marks the runner active: an engine that cannot be
    loaded (its graph files cut short after the set was loaded) leaves the runner inactive, so
    infer says it was never activated and a retry loads again, not "already active"."""
    engines = load_engines(engines_copy, verify=False)
    r = engines.verify(1)
    for f in engines_copy.glob("*.onnx"):
        f.write_bytes(f.read_bytes()[:64])
    for _ in range(2):
        with pytest.raises(Exception) as e:
            r.activate()
        assert not isinstance(e.value, InternalError) and not r.is_active, e.value
    with pytest.raises(InternalError, match="infer\\(\\) before activate\\(\\)"):
        r.infer({})

def test_metadata_is_specialised_per_depth(tiny_engines_append):
    engines = load_engines(tiny_engines_append, verify=False)
    for d in DEPTHS:
        ins = {t.name: t.shape for t in engines.verify(d).get_input_metadata()}
        outs = {t.name: t.shape for t in engines.verify(d).get_output_metadata()}
        assert ins[C.INPUT_IDS] == (1, d + 1)
        assert ins[C.past_key(0)] == (1, C.DIM_PAST, 2, 16)
        assert outs[C.LOGITS] == (1, d + 1, 1000)
    ins = {t.name: t.shape for t in engines.target(100).get_input_metadata()}
    assert ins[C.INPUT_IDS] == (1, C.DIM_NEW)  # prefill stays dynamic
    assert {t.name: t.shape for t in engines.draft().get_input_metadata()}[C.DRAFT_AUX_IN] == (1, C.DIM_AUX, 192)


def test_sessions_are_shared_by_default(tiny_engines_append):
    with load_engines(tiny_engines_append) as engines:
        target = {engines.runner(r)._sess for r in engines.runners if r != "draft"}
        assert len(target) == 1
        assert engines.ort_settings.prepack is True  # the shared session prepacks its weights once
    with load_engines(tiny_engines_append, ort_overrides={"sessions": "per-depth"}) as engines:
        target = {engines.runner(r)._sess for r in engines.runners if r != "draft"}
        assert len(target) == len(DEPTHS) + 2  # prefill, decode, verify.d
        assert engines.ort_settings.prepack is False  # one copy of the weights
        # each depth's session has new_tokens fixed to d + 1 (free dimension override)
        for d in DEPTHS:
            shape = {i.name: i.shape for i in engines.verify(d)._sess.get_inputs()}[C.INPUT_IDS]
            assert shape == [1, d + 1], (d, shape)


def test_sessions_and_shared_weights_go_with_the_last_runner(tiny_engines_append):
    """Per-depth sessions (mutation round): the target's sessions (one a role) and the weights
    they share are held while the engines are active and dropped, every one, with the draft's
    session, when they are released (a long-lived server reloading engines kept each earlier
    set's sessions and weights otherwise)."""
    engines = load_engines(tiny_engines_append, verify=False, ort_overrides={"sessions": "per-depth"})
    target, draft = engines.runner("decode").graph, engines.draft().graph
    with engines:
        assert len(target._sessions) == len(DEPTHS) + 2 and target._weights and len(draft._sessions) == 1
    assert (target._sessions, target._users, target._weights, draft._sessions, draft._users) == ({}, {}, None, {}, {})


def test_a_role_input_the_runner_could_not_bind_is_refused_at_activation(tmp_path):
    """An input the role names that the graph lacks (optional or not) or has only as an
    overridable initializer (found by mutation round 7, O31): IOBinding cannot bind it, so
    the runner activated and every call raised ONNX Runtime's "Failed to find NodeArg" with a
    traceback; the I/O check refuses it at activation, naming it, and gives the session back."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role

    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])], "g",
        [vi("x", T.FLOAT, [1, "n", 4]), vi("bias", T.FLOAT, [4])], [vi("y", T.FLOAT, [1, "n", 4])],
        [numpy_helper.from_array(np.full(4, 2.0, np.float32), "bias")]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "g.onnx")
    graph = OrtGraph(tmp_path / "g.onnx", OrtSettings(intra_op_num_threads=1).resolved())
    role = Role("decode", "target", {"n": DimRange(1, 1, 8)}, 8)
    x, y = (C.TensorSpec(n, "float32", (1, "n", 4)) for n in "xy")
    for extra in (C.TensorSpec("bias", "float32", (4,)), C.TensorSpec("bias", "float32", (4,), True),
                  C.TensorSpec(C.LOGITS_FROM, "int64", (), True)):
        with pytest.raises(UserError, match=rf"role 'decode' \({extra.name}\); the manifest or the graph was edited: "
                                            r"rebuild with `specrt build`$"):  # (mutant N148: and what to do)
            OrtRunner(role, (x, extra), (y,), graph).activate()
        assert graph._sessions == {} and graph._users == {}


def test_providers_are_cuda_with_the_cpu_behind_it_where_cuda_is_offered(monkeypatch):
    """The default providers (module doc): CUDA when ONNX Runtime offers it, with the CPU
    provider behind it for the ops CUDA has no kernel for (mutation round: CUDA alone
    survived), else the CPU; the TensorRT provider is never chosen."""
    from specrt.engines.onnxruntime import select_providers

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # (one hiding every device: the CPU's, below)

    assert select_providers(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]) == \
        ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert select_providers(["TensorrtExecutionProvider", "CPUExecutionProvider"]) == ["CPUExecutionProvider"]


def test_providers_are_the_cpus_where_cuda_visible_devices_hides_every_device(monkeypatch):
    """The environment walk's 16 (session 70, by reading; h74c): ONNX Runtime lists the providers
    compiled in, not the devices visible, so with onnxruntime-gpu and CUDA_VISIBLE_DEVICES=''
    (or -1) a build picked and recorded CUDA. Those values (CUDA's "no device": its list ends at
    the first invalid entry) choose the CPU; a device named, or the variable unset, CUDA."""
    from specrt.engines.onnxruntime import select_providers

    offered = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    for hidden in ("", " ", "-1", "-1,0"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        assert select_providers(offered) == ["CPUExecutionProvider"], hidden
    for shown in ("0", "1,0", "GPU-8f2c6a52"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", shown)
        assert select_providers(offered) == offered, shown
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert select_providers(offered) == offered


def test_session_options_carry_the_settings():
    """What each OrtSettings field sets on ONNX Runtime's SessionOptions (module doc): the
    thread counts, prepacking off only when asked, threads that spin within a run and stop
    after it (or never spin), extra config entries."""
    from specrt.engines.onnxruntime import OrtSettings

    def entry(so, key):
        try:
            return so.get_session_config_entry(key)
        except RuntimeError:  # not set
            return None

    so = OrtSettings(intra_op_num_threads=3).resolved().session_options()
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (3, 1)
    assert so.log_severity_level == 3  # errors only (mutant N40: ONNX Runtime's warnings at every load)
    assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert entry(so, "session.disable_prepacking") is None  # shared: prepacked
    assert entry(so, "session.intra_op.allow_spinning") == "1" and entry(so, "session.force_spinning_stop") == "1"
    so = OrtSettings(sessions="per-depth", spin=False, intra_op_num_threads=2, extra={"a.b": 7}).resolved() \
        .session_options()
    assert entry(so, "session.disable_prepacking") == "1"
    assert entry(so, "session.intra_op.allow_spinning") == "0" and entry(so, "session.force_spinning_stop") is None
    assert entry(so, "a.b") == "7"
    # a JSON true / false is the switch's "1" / "0" (str() gave "True", which ONNX Runtime reads as off)
    so = OrtSettings(extra={"session.x": True, "session.y": False, "session.z": "on"}).resolved().session_options()
    assert [entry(so, k) for k in ("session.x", "session.y", "session.z")] == ["1", "0", "on"]
    for bad, words in (({"prepack": 1}, "onnxruntime prepack 1: expected true, false or null"),
                       ({"extra": {"session.x": [1]}}, "onnxruntime extra 'session.x': [1]: expected a config "),
                       ({"extra": {"session.x": None}}, "onnxruntime extra 'session.x': None: expected"),
                       ({"extra": {1: "1"}}, "onnxruntime extra 1: '1': expected")):
        with pytest.raises(UserError) as exc:
            OrtSettings(**bad).resolved()
        assert str(exc.value).startswith(words), exc.value
    # settings given explicitly are kept: parallel execution, a second inter-op thread, prepacking
    # asked for per-depth sessions (their default is off; mutation round)
    so = OrtSettings(sessions="per-depth", execution_mode="parallel", inter_op_num_threads=2, prepack=True,
                     intra_op_num_threads=1).resolved().session_options()
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL and so.inter_op_num_threads == 2
    assert entry(so, "session.disable_prepacking") is None
    # SessionOptions takes a C int: a larger count (engines.json, `specrt bench --threads`) was
    # pybind11's TypeError when the first session was made
    so = OrtSettings(intra_op_num_threads=2**31 - 1).resolved().session_options()
    assert so.intra_op_num_threads == 2**31 - 1
    # (and a negative count, a bool or a float, each key on its own: engines.json is JSON)
    for key in ("intra_op_num_threads", "inter_op_num_threads"):
        for bad in (2**31, -1, True, 2.0):
            with pytest.raises(UserError, match=rf"onnxruntime {key} {bad!r}: expected a thread count in "
                                                rf"0\.\.2147483647$"):
                OrtSettings(**{key: bad}).resolved()


def test_dynamic_outputs_follow_each_calls_shape(tiny_engines_append, state):
    """Prefill and draft outputs are sized per call: a shorter call after a longer one
    (and the reverse) returns outputs of its own shape, equal to the plain session's."""
    rng = np.random.default_rng(4)
    with load_engines(tiny_engines_append) as engines:
        for s in (24, 7, 13):
            got = check_same(engines.runner("prefill"), state.target,
                             state.target_feeds(rng.integers(0, 999, s), state.n))
            assert got[C.LOGITS].shape == (1, s, 1000)
        for a in (5, 1, 3):
            real = rng.integers(0, state.vocab, a)
            aux = state.run_target(real, state.n)[C.AUX_HIDDEN]
            got = check_same(engines.draft(), state.draft, state.draft_feeds(real, aux, state.n, state.n))
            assert got[C.new_key(0)].shape[1] == a + max(DEPTHS) - 1


def test_eagle3_draft_engine_matches_its_graph(tmp_path):
    """EAGLE-3 (reduced draft vocabulary): one step with target hidden states (A = 3, B = 0),
    then a step on the draft's own hidden state (A = 0, B = 1)."""
    from specrt.engines import build_engines
    from specrt.export.export import export
    from tests.export.conftest import write_eagle3

    from .conftest import REFERENCE, quiet

    draft = write_eagle3(tmp_path / "eagle3")
    export(REFERENCE / "verifier", draft, tmp_path / "export")
    build_engines(tmp_path / "export", "onnxruntime", (1, 2), tmp_path / "engines", log=quiet, profile_repeats=1)
    rng = np.random.default_rng(5)
    session = plain(tmp_path / "engines" / "export" / "draft.onnx")
    with load_engines(tmp_path / "engines") as engines:
        r = engines.draft()
        assert r.dims[C.DIM_PREV].max == 256 + 2
        kv = {n: rng.standard_normal((1, 64, 2, 16), dtype=np.float32) for n in (C.past_key(0), C.past_value(0))}
        for a, b, past in ((3, 0, 10), (0, 1, 13)):
            feeds = {C.INPUT_IDS: rng.integers(0, 1000, (1, a + b)),
                     C.POSITION_IDS: np.arange(past, past + a + b)[None],
                     C.DRAFT_AUX_IN: rng.standard_normal((1, a, 192), dtype=np.float32),
                     C.DRAFT_PREV_HIDDEN: rng.standard_normal((1, b, 64), dtype=np.float32),
                     **{k: v[:, :past] for k, v in kv.items()}}
            got = check_same(r, session, feeds)
            assert got[C.DRAFT_LOGITS].shape == (1, a + b, 500)
        # its cost table: a step is one drafted token fed back with its hidden state, a block
        # of k is k steps
        from specrt.engines.costs import role_sizes

        assert role_sizes(r, 13, draft_depth=2, draft_accepted=2, prefill_tokens=128, draft_kind="eagle3") == {
            C.DIM_NEW: 1, C.DIM_AUX: 0, C.DIM_PREV: 1, C.DIM_PAST: 13}
        for row in engines.costs["by_past"].values():
            assert row["draft_by_depth"] == {1: row["draft"], 2: pytest.approx(2 * row["draft"])}
        # and its loop order: the one step's key before every verify, no pass per block depth
        from specrt.engines.costs import loop_order

        kw = dict(draft_depth=2, draft_accepted=2, prefill_tokens=128, draft_kind="eagle3")
        calls = loop_order(engines.runners, 13, (1, 2), "eagle3", {"target": 1000, "draft": 1000},
                           {n: ("draft" if n == "draft" else "target") for n in engines.runners}, kw, rng)
        assert [k for k, _, _ in calls] == [("decode", None), ("draft", None), ("verify.1", None), ("draft", None),
                                            ("verify.2", None)]


def test_the_builds_default_threads_never_exceed_this_machines_cores(engines_copy):
    """Engines record the build machine's physical cores as their thread count; loaded
    where fewer cores are available (a container, taskset) with the same CPU, they use no
    more threads than there are cores (oversubscribed spinning threads made a decode step
    3-4x slower). An explicit thread count (``--threads``, ``ort_overrides``) is kept."""
    import json

    from specrt.engines.onnxruntime import physical_cores

    many = physical_cores() + 62
    for recorded, want in ((many, physical_cores()), (many + 1, many + 1)):  # the build's default / --threads
        p = engines_copy / "engines.json"
        m = json.loads(p.read_text())
        m["onnxruntime"]["intra_op_num_threads"], m["environment"]["device"]["physical_cores"] = recorded, many
        m.pop("onnxruntime_threads_default", None)  # engines built before the build recorded it: by the count
        p.write_text(json.dumps(m))
        assert load_engines(engines_copy, verify=False).ort_settings.intra_op_num_threads == want
    e = load_engines(engines_copy, verify=False, ort_overrides={"intra_op_num_threads": 5})
    assert e.ort_settings.intra_op_num_threads == 5
    # engines record whether the count was the default: `--threads N` on an N-core host is
    # kept too (by the count alone it was taken for the default and capped; found by review)
    for flag, want in ((False, many), (True, physical_cores())):
        m = json.loads(p.read_text())
        m["onnxruntime"]["intra_op_num_threads"], m["onnxruntime_threads_default"] = many, flag
        p.write_text(json.dumps(m))
        assert load_engines(engines_copy, verify=False).ort_settings.intra_op_num_threads == want


def test_the_build_records_whether_its_thread_count_was_the_default(tiny_export, tmp_path):
    import json

    from specrt.engines import build_engines

    for threads, default in ((None, True), (1, False)):
        out = tmp_path / f"e{threads}"
        build_engines(tiny_export, "onnxruntime", "1", out, log=lambda s: None, profile_repeats=1,
                      ort_settings={"intra_op_num_threads": threads} if threads else None)
        assert json.loads((out / "engines.json").read_text())["onnxruntime_threads_default"] is default


def test_cgroup_cpu_limits_are_read_from_v1_and_v2_files(tmp_path):
    """A container given 2 CPUs on a big host has every CPU in its affinity mask; the build's
    default thread count must follow its cgroup's CPU quota instead (cpu.max in cgroup v2,
    cpu.cfs_quota_us / cpu.cfs_period_us in v1), the smallest on the way up to the mount's root,
    a path the container's mount lacks skipped, "max" / -1 unlimited."""
    from specrt.engines.onnxruntime import cgroup_cpu_limit

    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", v2) is None
    (v2 / "kubepods" / "cpu.max").write_text("400000 100000\n")
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", v2) == 1.5
    (v2 / "kubepods" / "cpu.max").write_text("100000 100000\n")  # (mutant N156) a parent's smaller limit holds
    assert cgroup_cpu_limit("0::/kubepods/pod1\n", v2) == 1.0
    (v2 / "kubepods" / "cpu.max").write_text("400000 100000\n")
    assert cgroup_cpu_limit("0::/kubepods\n", v2) == 4.0
    assert cgroup_cpu_limit("0::/docker/abc\n", v2) is None  # not in this mount: its root, unlimited
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    lines = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    assert cgroup_cpu_limit(lines, v1) == 2.0
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(lines, v1) is None
    assert cgroup_cpu_limit("garbage\n\n", tmp_path / "none") is None


def test_the_cpu_cgroup_is_found_where_the_mount_table_puts_it(tmp_path):
    """cgroup v1's cpu controller co-mounted with cpuset (``cpuset,cpu,cpuacct``), or cgroup v2
    at /sys/fs/cgroup/unified beside v1 (a hybrid host): /proc/self/mountinfo says where the
    folders are; the three usual names alone missed those limits (the build's default threads
    then followed every CPU of the host)."""
    from specrt.engines.onnxruntime import cgroup_cpu_limit

    mounts = (f"32 31 0:29 / {tmp_path}/v1/cpuset,cpu,cpuacct rw - cgroup cgroup rw,cpuset,cpu,cpuacct\n"
              f"41 31 0:38 /pod {tmp_path}/unified rw - cgroup2 cgroup2 rw,nsdelegate\n")
    (tmp_path / "v1/cpuset,cpu,cpuacct/box").mkdir(parents=True)
    (tmp_path / "v1/cpuset,cpu,cpuacct/box/cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "v1/cpuset,cpu,cpuacct/box/cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit("3:cpuset,cpu,cpuacct:/box\n", tmp_path / "none", mounts) == 2.5
    assert cgroup_cpu_limit("3:cpuset,cpu,cpuacct:/box\n", tmp_path / "none") is None  # (the usual names)
    (tmp_path / "unified/c1").mkdir(parents=True)
    (tmp_path / "unified/c1/cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_limit("0::/pod/c1\n", tmp_path / "none", mounts) == 0.5  # (the mount shows /pod as its root)
    assert cgroup_cpu_limit("3:cpuset,cpu,cpuacct:/box\n0::/pod/c1\n", tmp_path / "none", mounts) == 0.5
    # only the mounts of the group's own hierarchy are read (decoy files no real hierarchy has show which)
    mounts += f"36 31 0:33 / {tmp_path}/v1/devices rw - cgroup cgroup rw,devices\n"
    (tmp_path / "v1/devices/box").mkdir(parents=True)
    (tmp_path / "v1/devices/box/cpu.cfs_quota_us").write_text("10000\n")
    (tmp_path / "v1/devices/box/cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "v1/cpuset,cpu,cpuacct/pod/c1").mkdir(parents=True)
    (tmp_path / "v1/cpuset,cpu,cpuacct/pod/c1/cpu.max").write_text("10000 100000\n")
    assert cgroup_cpu_limit("3:cpuset,cpu,cpuacct:/box\n", tmp_path / "none", mounts) == 2.5
    assert cgroup_cpu_limit("0::/pod/c1\n", tmp_path / "none", mounts) == 0.5


def test_the_cpu_limit_read_by_default_is_this_processs_own(tmp_path, monkeypatch):
    """Mutation round (session 69, C01 / C02): called with no arguments (the build's default
    threads, bench's machine report), cgroup_cpu_limit reads /proc/self/cgroup as the groups
    and /proc/self/mountinfo as the mounts (a limit co-mounted with cpuset is found only
    there). This machine may have no limit: its reads are taken from files here instead."""
    import specrt.engines.onnxruntime as O

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("3:cpuset,cpu,cpuacct:/box\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        f"32 31 0:29 / {tmp_path}/v1/cpuset,cpu,cpuacct rw - cgroup cgroup rw,cpuset,cpu,cpuacct\n")
    (tmp_path / "v1/cpuset,cpu,cpuacct/box").mkdir(parents=True)
    (tmp_path / "v1/cpuset,cpu,cpuacct/box/cpu.cfs_quota_us").write_text("250000\n")
    (tmp_path / "v1/cpuset,cpu,cpuacct/box/cpu.cfs_period_us").write_text("100000\n")
    read = O.read_or_none
    monkeypatch.setattr(O, "read_or_none", lambda path: read(tmp_path / str(path).lstrip("/")))
    assert O.cgroup_cpu_limit() == 2.5


def test_physical_cores_follow_the_cgroup_limit_rounded_up(monkeypatch):
    """The build's default threads: no more than the cgroup's CPU quota, rounded up (1.5 CPUs
    of quota: 2 threads), at least 1, never more than the cores."""
    import specrt.engines.onnxruntime as O

    monkeypatch.setattr(O, "cgroup_cpu_limit", lambda: None)
    n = O.physical_cores()
    for limit, want in ((0.5, 1), (n + 10.0, n), (n - 0.5, n), (max(1.0, n - 1.0), max(1, n - 1))):
        monkeypatch.setattr(O, "cgroup_cpu_limit", lambda limit=limit: limit)
        assert O.physical_cores() == want, (limit, n)


def test_cgroup_files_that_give_no_usable_limit_are_passed_over(tmp_path):
    """Mutants N02, N06, N07, N09: a cpuset controller's line is not the cpu controller's ("cpu"
    begins "cpuset"), and a level whose file gives no usable limit (a zero period or quota, text
    that is no pair of numbers) is passed over for the other levels: no crash, no limit of 0."""
    from specrt.engines.onnxruntime import cgroup_cpu_limit

    v1 = tmp_path / "v1" / "cpu,cpuacct"
    for path, quota in (("docker/abc", "200000"), ("elsewhere", "50000")):
        (v1 / path).mkdir(parents=True)
        (v1 / path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (v1 / path / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit("5:cpuset:/elsewhere\n3:cpu,cpuacct:/docker/abc\n", tmp_path / "v1") == 2.0
    v2 = tmp_path / "v2"
    (v2 / "box").mkdir(parents=True)
    (v2 / "cpu.max").write_text("150000 100000\n")
    for bad in ("100000 0\n", "0 100000\n", "garbage\n", "max\n"):
        (v2 / "box" / "cpu.max").write_text(bad)
        assert cgroup_cpu_limit("0::/box\n", v2) == 1.5, bad
    # (mutants N145, N146) cgroup v1 mounts the cpu controller under any of its three names
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        (tmp_path / name / "box").mkdir(parents=True)
        (tmp_path / name / "box" / "cpu.cfs_quota_us").write_text("300000\n")
        (tmp_path / name / "box" / "cpu.cfs_period_us").write_text("100000\n")
        assert cgroup_cpu_limit(f"3:{name}:/box\n", tmp_path) == 3.0, name
        (tmp_path / name / "box" / "cpu.cfs_quota_us").unlink()


def test_physical_cores_are_the_distinct_cores_of_the_cpus_this_process_may_use(monkeypatch, tmp_path):
    """Mutants N15, N17, N19 (the earlier round's O53, O54): the build's default threads are the
    distinct (package, core id) pairs of the CPUs in the affinity mask, read from /proc/cpuinfo
    (hyper-threads share a core; core ids repeat in each package), and a cgroup limit of 1.2 or
    2.5 CPUs rounds up. Here a faked 2-package host with 2 cores of 2 hyper-threads each."""
    import specrt.engines.onnxruntime as O

    # CPU n: package n // 4, core (n // 2) % 2 (CPUs 2k and 2k + 1 are one core's hyper-threads)
    (tmp_path / "cpuinfo").write_text("".join(f"processor\t: {n}\nphysical id\t: {n // 4}\ncore id\t: {n // 2 % 2}\n\n"
                                              for n in range(8)))
    real = O.Path
    monkeypatch.setattr(O, "Path", lambda p: real(tmp_path / "cpuinfo") if str(p) == "/proc/cpuinfo" else real(p))
    monkeypatch.setattr(O, "cgroup_cpu_limit", lambda: None)
    for cpus, want in ((range(8), 4), ({0, 1}, 1), ({0, 2}, 2), ({0, 4}, 2), ({1, 3, 5, 7}, 4)):
        monkeypatch.setattr(O.os, "sched_getaffinity", lambda pid, cpus=cpus: set(cpus))
        assert O.physical_cores() == want, cpus
    monkeypatch.setattr(O.os, "sched_getaffinity", lambda pid: set(range(8)))
    for limit, want in ((1.2, 2), (2.5, 3), (3.0, 3)):
        monkeypatch.setattr(O, "cgroup_cpu_limit", lambda limit=limit: limit)
        assert O.physical_cores() == want, limit


def test_a_graph_whose_io_is_not_the_roles_is_refused_naming_each_difference(tmp_path):
    """A runner checks its graph file's inputs and outputs against those engines.json gives
    its role before a step runs (mutation round: each part of the check could go unnoticed):
    an output the role does not know, an element type, a rank and a fixed size of the graph's
    other than the role's, each named with the graph's own, and the session given back."""
    import re

    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role

    vi = helper.make_tensor_value_info
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["z"])], "g",
        [vi("x", T.FLOAT, [1, "n", 4])], [vi("y", T.FLOAT, [1, "n", 4]), vi("z", T.FLOAT, [1, "n", 4])]),
        opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "g.onnx")
    graph = OrtGraph(tmp_path / "g.onnx", OrtSettings(intra_op_num_threads=1).resolved())
    role = Role("decode", "target", {"n": DimRange(1, 1, 8)}, 8)
    x, y, z = (C.TensorSpec(n, "float32", (1, "n", 4)) for n in "xyz")
    with OrtRunner(role, (x,), (y, z), graph) as r:  # as the graph is: runs
        assert r.infer({"x": np.ones((1, 2, 4), np.float32)})["z"].shape == (1, 2, 4)
    theirs = "; the graph's tensor(float) [1, 'n', 4])"
    for ins, outs, said in (((x,), (y,), "z)"),
                            ((C.TensorSpec("x", "float16", (1, "n", 4)),), (y, z), "x (float16 [1, 'n', 4]" + theirs),
                            ((C.TensorSpec("x", "float32", (1, "n")),), (y, z), "x (float32 [1, 'n']" + theirs),
                            ((C.TensorSpec("x", "float32", (1, "n", 5)),), (y, z), "x (float32 [1, 'n', 5]" + theirs),
                            # (mutant N153) an output the role names that the graph has not
                            ((x,), (y, z, C.TensorSpec("w", "float32", (1, "n", 4))), "w)"),
                            # (mutant N82) more than one difference: each named
                            ((C.TensorSpec("x", "float16", (1, "n", 4)),), (y,), "z, x (float16 [1, 'n', 4]" + theirs)):
        with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'g.onnx'}: its inputs and outputs differ from "
                                                      f"those engines.json gives role 'decode' ({said}")):
            OrtRunner(role, ins, outs, graph).activate()
        assert graph._sessions == {} and graph._users == {}


def test_explicit_settings_are_kept_by_resolved_and_applied_to_the_session():
    """Mutants O02, O47 (prepacking off asked for a shared session taken as the default, or
    prepacking keyed by the session mode), O05 (providers given explicitly replaced by the
    default choice), O13 (the optimisation level not applied): an explicit setting
    (engines.json, ``ort_overrides``) is what the session gets."""
    from specrt.engines.onnxruntime import OrtSettings, physical_cores

    s = OrtSettings(prepack=False, intra_op_num_threads=1).resolved()
    assert (s.sessions, s.prepack) == ("shared", False)
    assert s.session_options().get_session_config_entry("session.disable_prepacking") == "1"
    both = ("CUDAExecutionProvider", "CPUExecutionProvider")  # (kept as given: availability is the load's)
    assert OrtSettings(providers=both, intra_op_num_threads=1).resolved().providers == both
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED"):  # (N126: the third refused)
        so = OrtSettings(graph_optimization_level=level, intra_op_num_threads=1).resolved().session_options()
        assert so.graph_optimization_level == getattr(ort.GraphOptimizationLevel, level)
    # (mutant N32) no thread count given: this machine's physical cores, made explicit
    assert OrtSettings().resolved().intra_op_num_threads == physical_cores()
    # (mutants N23, N24) a session mode is one of the two, as written, and the error names the one given
    for bad in ("", "Shared"):
        with pytest.raises(UserError, match=rf"^onnxruntime sessions '{bad}' is not one of shared, per-depth$"):
            OrtSettings(sessions=bad, intra_op_num_threads=1).resolved()
    # (mutant N27) every provider named must be one ONNX Runtime knows, not only one of them
    with pytest.raises(UserError, match=r"^onnxruntime providers \('CPUExecutionProvider', 'CPU'\): expected ONNX "
                                        r"Runtime provider names$"):
        OrtSettings(providers=("CPUExecutionProvider", "CPU"), intra_op_num_threads=1).resolved()


def test_settings_read_back_take_one_provider_name_as_one_provider():
    """Mutant O17 (from_json taking a string's letters as providers): engines.json edited to
    ``"providers": "CPUExecutionProvider"`` names one provider, and loads as that one."""
    import json

    from specrt.engines.onnxruntime import OrtSettings

    s = OrtSettings.from_json({"providers": "CPUExecutionProvider", "intra_op_num_threads": 1})
    assert s.providers == ("CPUExecutionProvider",)
    assert s.resolved().providers == ("CPUExecutionProvider",)
    assert OrtSettings.from_json(s.to_json()) == s
    # (mutants N37, N38) a tuple (ort_overrides given in Python) is its names, and the caller's dict (the
    # manifest's) is left as it was
    d = {"providers": ["CPUExecutionProvider"], "intra_op_num_threads": 1}
    assert OrtSettings.from_json({**d, "providers": ("CPUExecutionProvider",)}).providers == ("CPUExecutionProvider",)
    assert OrtSettings.from_json(d).providers == ("CPUExecutionProvider",)
    assert d == {"providers": ["CPUExecutionProvider"], "intra_op_num_threads": 1}
    # (mutant N149) every setting goes to engines.json and comes back, extra session config entries too
    s = OrtSettings(sessions="per-depth", spin=False, prepack=True, extra={"session.x": "1"}, intra_op_num_threads=1)
    assert OrtSettings.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_the_draft_keeps_a_prepacked_shared_session_in_per_depth_mode(tiny_engines_append):
    """Mutants O21, O22 (a graph with one role given per-depth settings, or shared without its
    prepacking): per-depth sessions share the target's weights unpacked; the draft has one role,
    no weights to share, and keeps the shared mode's prepacking (module doc: an int8 draft ran
    30x slower without it)."""
    with load_engines(tiny_engines_append, ort_overrides={"sessions": "per-depth"}) as engines:
        draft, target = engines.draft().graph.settings, engines.runner("decode").graph.settings
        assert (draft.sessions, draft.prepack) == ("shared", True)
        assert (target.sessions, target.prepack) == ("per-depth", False)
    # (mutant N162) shared sessions keep the settings as given, the draft's too: prepacking off when asked
    with load_engines(tiny_engines_append, ort_overrides={"prepack": False}) as engines:
        assert engines.draft().graph.settings.prepack is False
        assert engines.runner("decode").graph.settings.prepack is False


def _tiny_graph(path, nodes, inputs, outputs, inits=()):
    import onnx
    from onnx import helper

    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_graph_onnx_runtime_cannot_load_is_a_user_error_naming_it(tmp_path):
    """Mutant O25 (ONNX Runtime's own exception let through): a graph file ONNX Runtime refuses
    (cut short, hand-edited) is a user error naming the file, not onnxruntime's Fail or
    InvalidProtobuf with its traceback."""
    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role

    path = tmp_path / "g.onnx"
    path.write_bytes(b"not a graph")
    graph = OrtGraph(path, OrtSettings(intra_op_num_threads=1).resolved())
    x = C.TensorSpec("x", "float32", (1, "n", 4))
    r = OrtRunner(Role("decode", "target", {"n": DimRange(1, 1, 8)}, 8), (x,), (x,), graph)
    with pytest.raises(UserError, match=f"^{path}: ONNX Runtime could not load the graph "):
        r.activate()
    assert not r.is_active and graph._sessions == {}


def test_an_engine_failing_in_onnx_runtime_is_an_engine_failure_naming_the_role(tmp_path, capfd):
    """Mutants O38, O39 (the failure named by another field than the role, or raised as a plain
    user error): a request the runner accepted that ONNX Runtime fails mid-run (here a Reshape
    the new tokens' count cannot take) is an EngineFailure naming the role and its graph file
    with ONNX Runtime's reason on one line; the runner stays usable for a call it can run.
    Mutants N71, N95, N97: ONNX Runtime's own log line is not printed besides, the reason's
    trailing newline is gone, and no chained traceback of ONNX Runtime's comes with it."""
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role
    from specrt.errors import EngineFailure

    vi = helper.make_tensor_value_info
    path = _tiny_graph(tmp_path / "g.onnx", [helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       [vi("x", T.FLOAT, [1, "n", 4])], [vi("y", T.FLOAT, ["a", "b"])],
                       [numpy_helper.from_array(np.array([3, -1], np.int64), "shape")])
    graph = OrtGraph(path, OrtSettings(intra_op_num_threads=1).resolved())
    role = Role("verify.2", "target", {"n": DimRange(1, 1, 8)}, 8)
    with OrtRunner(role, (C.TensorSpec("x", "float32", (1, "n", 4)),), (C.TensorSpec("y", "float32", ("a", "b")),),
                   graph) as r:
        capfd.readouterr()
        with pytest.raises(EngineFailure, match=r"^engine 'verify\.2' \(g\.onnx\) failed in ONNX Runtime: "
                                                r"[^\n]*cannot be reshaped[^\n]*$") as e:
            r.infer({"x": np.ones((1, 2, 4), np.float32)})
        assert "\n" not in str(e.value) and e.value.__cause__ is None
        assert "cannot be reshaped" not in capfd.readouterr().err
        assert r.infer({"x": np.ones((1, 3, 4), np.float32)})["y"].shape == (3, 4)


def test_sessions_run_on_the_providers_the_settings_name(tmp_path):
    """Mutant N65 (the session made without the settings' providers: ONNX Runtime's default, the
    CPU alone): a graph's session runs on the providers its settings name, in their order. Here
    another provider this ONNX Runtime offers (CUDA on a GPU build) before the CPU's."""
    from onnx import TensorProto as T
    from onnx import helper

    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role

    other = [p for p in ort.get_available_providers() if p != "CPUExecutionProvider"]
    if not other:
        pytest.skip("this ONNX Runtime offers no provider but the CPU's")
    vi = helper.make_tensor_value_info
    path = _tiny_graph(tmp_path / "g.onnx", [helper.make_node("Identity", ["x"], ["y"])],
                       [vi("x", T.FLOAT, [1, "n", 4])], [vi("y", T.FLOAT, [1, "n", 4])])
    providers = (other[0], "CPUExecutionProvider")
    graph = OrtGraph(path, OrtSettings(providers=providers, intra_op_num_threads=1).resolved())
    x, y = (C.TensorSpec(n, "float32", (1, "n", 4)) for n in "xy")
    with OrtRunner(Role("decode", "target", {"n": DimRange(1, 1, 8)}, 8), (x,), (y,), graph) as r:
        assert r._sess.get_providers() == list(providers)


def test_outputs_of_fixed_shape_are_the_runners_buffers_beside_dynamic_ones(tmp_path):
    """Mutant N99 (every output of a call with a dynamic one copied out of ONNX Runtime): a
    role with outputs of fixed shape and others sized per call returns the fixed ones in the
    buffers preallocated at activation, the same arrays at every call, overwritten with the
    call's values, and the dynamic ones in the call's own shape."""
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    from specrt.engines.onnxruntime import OrtGraph, OrtRunner, OrtSettings
    from specrt.engines.plan import DimRange, Role

    vi = helper.make_tensor_value_info
    path = _tiny_graph(tmp_path / "g.onnx", [helper.make_node("Identity", ["x"], ["y"]),
                                             helper.make_node("ReduceSum", ["x", "axes"], ["z"], keepdims=1)],
                       [vi("x", T.FLOAT, [1, "n", 4])], [vi("y", T.FLOAT, [1, "n", 4]), vi("z", T.FLOAT, [1, 1, 4])],
                       [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    graph = OrtGraph(path, OrtSettings(intra_op_num_threads=1).resolved())
    outs = (C.TensorSpec("y", "float32", (1, "n", 4)), C.TensorSpec("z", "float32", (1, 1, 4)))
    with OrtRunner(Role("decode", "target", {"n": DimRange(1, 1, 8)}, 8), (C.TensorSpec("x", "float32", (1, "n", 4)),),
                   outs, graph) as r:
        first = r.infer({"x": np.ones((1, 3, 4), np.float32)})
        z = first["z"]
        np.testing.assert_array_equal(z, np.full((1, 1, 4), 3.0, np.float32))
        again = r.infer({"x": np.full((1, 2, 4), 2.0, np.float32)})
        assert again["z"] is z and again["y"].shape == (1, 2, 4)
        np.testing.assert_array_equal(z, np.full((1, 1, 4), 4.0, np.float32))


def test_a_deactivated_runner_lets_go_of_its_output_buffers(tiny_engines_append, state):
    """Mutant N104 (deactivation keeping the preallocated outputs): the buffers a runner returns
    its fixed-shape outputs in (logits [1, d + 1, vocab]: 1.8 MB for verify.8 on SmolLM2) are
    freed with the caller's last reference once the engines are released, as their sessions
    are, while the released engine set itself lives on."""
    import gc
    import weakref

    with load_engines(tiny_engines_append) as engines:
        ref = weakref.ref(engines.verify(4).infer(state.target_feeds(np.arange(5), state.n))[C.LOGITS])
        gc.collect()
        assert ref() is not None  # (the runner's own, while it is active)
    gc.collect()
    assert ref() is None
