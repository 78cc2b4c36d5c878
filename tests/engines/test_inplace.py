"""In-place KV engines (contracts.py "In-place KV"): the ONNX Runtime build's default target.

The target graph is re-lowered with ONNX Runtime's GroupQueryAttention over whole
[1, KVH, C, D] buffers that the engine updates in place. Checked here: every role gives
the export graph's outputs (through the portable view and natively, rows written where
the positions say), the outputs are the caller's buffers, a decode step allocates
nothing in proportion to the context, bad positions are refused before the engine could
write out of bounds, the cost table's feeds are valid, and the build falls back (or
refuses, when asked for in-place) with the reason when in-place KV is impossible.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from specrt import contracts as C
from specrt.engines import build_engines, load_engines
from specrt.engines.costs import role_sizes, synthetic_feeds
from specrt.engines.onnxruntime import OrtSettings, probe_inplace_gqa
from specrt.errors import UserError

from .conftest import DEPTHS, quiet
from .test_onnxruntime import State, alloc_peak, check_same

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def state(tiny_engines):
    return State(tiny_engines / "export", json.loads((tiny_engines / "export" / "export.json").read_text()))


def test_the_default_build_is_in_place_and_records_its_own_io(tiny_engines):
    m = json.loads((tiny_engines / "engines.json").read_text())
    assert m["graphs"]["target"]["kv"] == "inplace"
    io = m["graphs"]["target"]["io"]
    assert io["aliases"] == {C.cache_key_out(i) if k else C.cache_value_out(i): C.cache_key(i) if k else C.cache_value(i)
                             for i in range(4) for k in (0, 1)}
    assert m["roles"]["decode"]["dims"][C.DIM_CACHE] == [m["max_context"]] * 3
    assert m["roles"]["decode"]["engine"]["onnx"] == "target.onnx"
    e = load_engines(tiny_engines, verify=False)
    assert (e.kv_layout("target"), e.kv_layout("draft")) == ("inplace", "append")
    ins = {t.name: t.shape for t in e.verify(4).get_input_metadata()}
    assert ins[C.cache_key(0)] == (1, 2, m["max_context"], 16)
    assert C.past_key(0) not in ins


def test_the_graph_io_json_is_the_manifests_record():
    """engines.json records the target's I/O as GraphIO.to_json and a load compares it
    exactly (engines/manifest.py): "optional" appears on an optional input only
    (logits_from), so engines recorded before the field existed still load; "aliases" maps
    each output to the input whose buffer it is, and only in-place graphs have it (mutants
    of each survived every test)."""
    inplace, append = (C.target_io(2, 2, 16, 100, 64, "float32", kv=kv) for kv in ("inplace", "append"))
    j = inplace.to_json()
    assert [t for t in j["inputs"] if "optional" in t] == [
        {"name": C.LOGITS_FROM, "dtype": "int64", "shape": [], "optional": True}]
    assert all(set(t) == {"name", "dtype", "shape"} for t in j["outputs"] + append.to_json()["inputs"])
    assert j["aliases"][C.cache_value_out(1)] == C.cache_value(1) and "aliases" not in append.to_json()


def test_every_role_matches_the_export_graph_through_the_portable_view(tiny_engines, state):
    rng = np.random.default_rng(1)
    with load_engines(tiny_engines) as engines:
        for d in (0, *DEPTHS):
            check_same(engines.portable_target(d + 1), state.target,
                       state.target_feeds(rng.integers(0, state.vocab, d + 1), state.n))
        check_same(engines.portable("prefill"), state.target, state.target_feeds(rng.integers(0, 999, 11), 0))


def test_native_calls_write_the_new_rows_in_place(tiny_engines, state):
    """The runtime's own path: whole buffers in, the rows at position_ids written, the
    outputs ARE the buffers, rows past the committed length ignored (a rolled-back round)."""
    rng = np.random.default_rng(5)
    t = state.target
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        bufs = {}
        for i in range(4):
            for past, name in ((C.past_key(i), C.cache_key(i)), (C.past_value(i), C.cache_value(i))):
                b = rng.standard_normal((1, 2, C_, 16), dtype=np.float32)  # junk everywhere ...
                b[0, :, :state.n] = state.tkv[past][0, :state.n].transpose(1, 0, 2)  # ... but the committed rows
                bufs[name] = b
        toks = rng.integers(0, state.vocab, 5)
        out = engines.verify(4).infer({C.INPUT_IDS: toks[None], C.POSITION_IDS: np.arange(state.n, state.n + 5)[None],
                                       **bufs})
        ref = dict(zip([o.name for o in t.get_outputs()], t.run(None, state.target_feeds(toks, state.n))))
        np.testing.assert_allclose(out[C.LOGITS], ref[C.LOGITS], **TOL)
        np.testing.assert_allclose(out[C.AUX_HIDDEN], ref[C.AUX_HIDDEN], **TOL)
        for i in range(4):
            assert out[C.cache_key_out(i)] is bufs[C.cache_key(i)]
            written = bufs[C.cache_key(i)][0, :, state.n:state.n + 5].transpose(1, 0, 2)
            np.testing.assert_allclose(written, ref[C.new_key(i)][0], **TOL)
            np.testing.assert_allclose(bufs[C.cache_value(i)][0, :, state.n:state.n + 5].transpose(1, 0, 2),
                                       ref[C.new_value(i)][0], **TOL)


def test_a_decode_step_allocates_nothing_proportional_to_the_context(tiny_engines):
    rng = np.random.default_rng(3)
    peaks = {}
    with load_engines(tiny_engines) as engines:
        bufs = {n: rng.standard_normal((1, 2, engines.max_context, 16), dtype=np.float32)
                for i in range(4) for n in (C.cache_key(i), C.cache_value(i))}
        r = engines.verify(2)
        for past in (8, 240):
            feeds = {C.INPUT_IDS: np.ones((1, 3), np.int64),
                     C.POSITION_IDS: np.arange(past, past + 3, dtype=np.int64)[None], **bufs}
            peaks[past] = alloc_peak(r, feeds)
    assert max(peaks.values()) < 16 * 1024, peaks


def test_buffers_fed_again_stay_bound_and_are_read_afresh(tiny_engines):
    """The runner keeps the arrays it was fed bound and checked while the caller feeds
    the same ones (the runtime's cache buffers, every call): contents changed in place
    are what the next call reads, different arrays are bound anew (read, and written
    into), and a fed-again array reshaped in place is checked again and refused. Each
    result is checked against a freshly loaded runner's first call."""
    rng = np.random.default_rng(11)
    head = {C.INPUT_IDS: np.array([[3, 1, 4]]), C.POSITION_IDS: np.arange(20, 23)[None]}
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        names = [n for i in range(4) for n in (C.cache_key(i), C.cache_value(i))]
        bufs = {n: rng.standard_normal((1, 2, C_, 16), dtype=np.float32) for n in names}
        r = engines.verify(2)
        first = r.infer({**head, **bufs})[C.LOGITS].copy()
        for b in bufs.values():  # new committed rows, written into the same arrays
            b[0, :, :20] = rng.standard_normal((2, 20, 16), dtype=np.float32)
        again = r.infer({**head, **bufs})[C.LOGITS].copy()
        assert not np.allclose(again, first, **TOL)
        contents_b = {n: b.copy() for n, b in bufs.items()}
        others = {n: rng.standard_normal((1, 2, C_, 16), dtype=np.float32) for n in names}
        for b in others.values():
            b[0, :, 20:23] = 0.0
        contents_c = {n: b.copy() for n, b in others.items()}
        out = r.infer({**head, **others})
        other = out[C.LOGITS].copy()
        assert not np.allclose(other, again, **TOL)
        assert all(np.abs(others[C.cache_key(i)][0, :, 20:23]).min() > 0 for i in range(4))  # written into
        out = r.infer({**head, **bufs})
        np.testing.assert_allclose(out[C.LOGITS], again, **TOL)
        bufs[C.cache_key(1)].shape = (1, 2, 2 * C_, 8)
        with pytest.raises(UserError, match=r"cache_key.1' has shape \[1, 2, %d, 8\]" % (2 * C_)):
            r.infer({**head, **bufs})
    with load_engines(tiny_engines) as engines:
        np.testing.assert_allclose(engines.verify(2).infer({**head, **contents_b})[C.LOGITS], again, **TOL)
    with load_engines(tiny_engines) as engines:
        np.testing.assert_allclose(engines.verify(2).infer({**head, **contents_c})[C.LOGITS], other, **TOL)



def test_a_deactivated_runner_lets_go_of_the_callers_buffers(tiny_engines):
    """A runner keeps the arrays it was fed (checked and bound by identity) while it is active;
    deactivated, it drops them: the caller's cache buffers (the size of the context, GBs on a
    real model) are freed with the caller's last reference, not when the runner goes."""
    import gc
    import weakref

    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        bufs = {n: np.zeros((1, 2, C_, 16), np.float32) for i in range(4) for n in (C.cache_key(i), C.cache_value(i))}
        r = engines.verify(2)
        r.infer({C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.array([[0, 1, 2]]), **bufs})
        refs = [weakref.ref(b) for b in bufs.values()]
        del bufs
        gc.collect()
        assert all(ref() is not None for ref in refs)  # (held while active)
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_activation_allocates_no_buffer_for_an_output_written_in_place(tiny_engines):
    """Mutant N68 (aliased outputs preallocated at activation like any fixed-shape one): an
    in-place output (cache_key_out.{i}) is the caller's own cache buffer, bound at its call, so
    activating a runner allocates its fixed-shape outputs (logits) and no second cache of the
    context's size (SmolLM2-135M at 8192 tokens: 0.38 GB a runner)."""
    import tracemalloc

    engines = load_engines(tiny_engines, verify=False)
    r = engines.verify(2)
    cache = sum(np.prod(t.shape) * 4 for t in r.outputs if t.name in r.aliases)
    tracemalloc.start()
    try:
        r.activate()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        r.deactivate()
    assert peak < cache / 4, (peak, cache)


def test_positions_the_buffers_cannot_take_are_refused(tiny_engines):
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        bufs = {n: np.zeros((1, 2, C_, 16), np.float32) for i in range(4) for n in (C.cache_key(i), C.cache_value(i))}
        r = engines.verify(2)
        for pos in ([[C_ - 2, C_ - 1, C_]], [[C_ - 2, C_ - 1, C_ - 1]], [[5, 7, 8]], [[-1, 0, 1]], [[5, 5, 5]],
                    [[5, 6, 5]], [[5, 6, 8]]):
            with pytest.raises(UserError, match=r"position_ids .* must be consecutive \(or a chain then siblings "
                                                r"of its second token\) and the 3 new rows must fit"):
                r.infer({C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.array(pos), **bufs})
        with pytest.raises(UserError, match=r"'verify.2': position_ids \[5, 7, 8\] must be consecutive"):
            r.infer({C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.array([[5, 7, 8]]), **bufs})  # (B45)
        r.infer({C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.array([[5, 6, 6]]), **bufs})  # a tree
        short = {**bufs, C.cache_key(1): np.zeros((1, 2, C_ - 1, 16), np.float32)}
        with pytest.raises(UserError, match="cache_key.1"):
            r.infer({C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.array([[0, 1, 2]]), **short})


def test_cost_table_feeds_are_valid_whole_buffers(tiny_engines):
    e = load_engines(tiny_engines, verify=False)
    rng = np.random.default_rng(0)
    for name, r in e.runners.items():
        if name == "draft":
            continue
        sizes = role_sizes(r, 100, draft_depth=8, draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
        feeds = synthetic_feeds(r, sizes, 1000, rng)
        r.check_feeds(feeds)
        assert feeds[C.cache_key(0)].shape == (1, 2, e.max_context, 16)
        assert feeds[C.POSITION_IDS][0, 0] == (0 if name == "prefill" else 100)
    m = json.loads((e.folder / "engines.json").read_text())
    assert set(m["costs"]["verify"]) == {str(d) for d in DEPTHS}


def test_probe_names_what_the_kernel_cannot_do(capfd):
    s = OrtSettings().resolved()
    for dtype in ("float32", "float16"):
        for packed in (True, False):  # q/k/v packed in one input, or three (qk-norm models)
            assert probe_inplace_gqa(s, 4, 2, 16, dtype, packed=packed) is None, (dtype, packed)
    capfd.readouterr()
    assert "head_size" in probe_inplace_gqa(s, 4, 2, 8)  # the CPU kernel wants head_dim % 16 == 0
    assert "head_size" not in capfd.readouterr().err  # (mutant N112: said once, by the build, not logged besides)
    # (mutants N47, N105, N106, N110, N114) a dtype it has no reference for, and ONNX Runtime's refusal of the
    # graph as it loads (its own Fail, no RuntimeError) are said in words, not raised
    assert probe_inplace_gqa(s, 4, 2, 16, "bfloat16") == "GroupQueryAttention in place is not probed for bfloat16"
    # (onnxruntime 1.22 refuses it as the session starts: its RuntimeException)
    assert re.match(r"GroupQueryAttention in place or SkipSimplifiedLayerNormalization is unavailable "
                    r"\((Fail|RuntimeException): ", probe_inplace_gqa(s, 4, 0, 16))


def test_re_lowering_names_a_weight_it_cannot_use(tiny_export, tmp_path):
    """Mutants N116, N117: re-lowering the target with in-place KV reads the export's weights by
    slot; a graph without one (here all: 'embed', the first read), or with one stored outside it
    in a type other than float32/float16, is a user error naming the file and the weight."""
    import onnx
    from onnx import helper, numpy_helper

    from specrt.engines.onnxruntime import write_inplace_target

    t = json.loads((tiny_export / "export.json").read_text())["target"]
    src = tmp_path / "t.onnx"
    for inits, said in (([], "has no weight 'embed' to re-lower the target with in-place KV"),
                        ([numpy_helper.from_array(np.zeros((t["vocab_size"], t["hidden_size"]), np.int32), "embed")],
                         "weight 'embed' has ONNX type 6; in-place KV needs float32/float16")):
        onnx.save_model(helper.make_model(helper.make_graph([], "g", [], [], inits)), str(src),
                        save_as_external_data=True, location="t.onnx.data", size_threshold=0)
        with pytest.raises(UserError, match=f"^{src}: {said}$"):
            write_inplace_target(src, t["decoder"], t["aux_layer_ids"], "float32", 64, tmp_path / "out" / "target.onnx")


def test_the_head_calibration_runs_quietly_and_leaves_nothing_behind(tiny_export, tmp_path, capfd):
    """Mutants N121, N139: a screened build's calibration pass (the target's final hidden states
    over the canary's prompts, to choose the head's fp32 channels) prints nothing of ONNX
    Runtime's log and removes its scratch graph and the graph's data file."""
    from specrt.engines.base import initializer_reader
    from specrt.engines.onnxruntime import _head_states
    from specrt.export.config import DecoderConfig

    t = json.loads((tiny_export / "export.json").read_text())["target"]
    cfg = DecoderConfig.from_json(t["decoder"])
    capfd.readouterr()
    states = _head_states(cfg, initializer_reader(tiny_export / "target.onnx")[1], t["aux_layer_ids"], "float32",
                          tiny_export, tmp_path)
    assert states.ndim == 2 and states.shape[1] == cfg.hidden_size and np.isfinite(states).all()
    assert list(tmp_path.iterdir()) == [] and capfd.readouterr().err == ""


def test_in_place_falls_back_or_refuses_with_the_reason(tiny_export, tmp_path):
    import shutil

    exp = tmp_path / "export"
    shutil.copytree(tiny_export, exp)
    m = json.loads((exp / "export.json").read_text())
    del m["target"]["decoder"]  # an export written before the decoder config was recorded
    (exp / "export.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="--ort-kv inplace: the export predates target.decoder"):
        build_engines(exp, "onnxruntime", [1], tmp_path / "e1", log=quiet, ort_kv="inplace")
    # a screened head needs the in-place graph: refused, not built with the full head unsaid (mutation round)
    with pytest.raises(UserError, match="^--target-head screened needs in-place KV, which these settings cannot have$"):
        build_engines(exp, "onnxruntime", [1], tmp_path / "e1", log=quiet, target_head="screened")
    assert not (tmp_path / "e1").exists()
    notes = []
    build_engines(exp, "onnxruntime", [1], tmp_path / "e2", log=notes.append, profile_repeats=1)
    assert any("portable KV graph" in n and "re-export" in n for n in notes)
    assert load_engines(tmp_path / "e2").kv_layout("target") == "append"
    with pytest.raises(UserError, match="--ort-kv 'sideways'"):
        build_engines(exp, "onnxruntime", [1], tmp_path / "e3", log=quiet, ort_kv="sideways")
    with pytest.raises(UserError, match="--ort-kv inplace applies to the onnxruntime backend"):
        build_engines(exp, "tensorrt", [1], tmp_path / "e4", log=quiet, ort_kv="inplace")


def test_tensorrt_engines_take_the_portable_kv_graph_without_a_probe(tiny_export):
    """In-place KV is an ONNX Runtime graph (GroupQueryAttention): the default ``--ort-kv
    auto`` of a TensorRT build resolves to the export's portable graph at once, with no
    ONNX Runtime probe (its settings are None there) and nothing said. Pinned here because
    the TensorRT build itself skips on machines without TensorRT (mutation round)."""
    from specrt.engines.build import _resolve_kv
    from specrt.manifest import load_export

    exp = load_export(tiny_export)
    said: list[str] = []
    assert _resolve_kv("auto", "tensorrt", exp, None, said.append) == "append" and said == []
    assert _resolve_kv("auto", "onnxruntime", exp, OrtSettings().resolved(), said.append) == "inplace"


def test_the_probe_runs_the_qkv_form_the_graph_will_use(tiny_export, monkeypatch):
    """The in-place graph packs q/k/v into one GroupQueryAttention input unless the model has
    qk-norm (Qwen3): the probe runs that same form (B06 of session 69's mutation round probed
    the packed one for a qk-norm model, which this ONNX Runtime runs either way, so only the
    form asked for is seen here; the real probe still runs)."""
    import specrt.engines.onnxruntime as O
    from specrt.engines.build import _resolve_kv
    from specrt.manifest import load_export

    asked: list[bool] = []
    real = O.probe_inplace_gqa
    monkeypatch.setattr(O, "probe_inplace_gqa", lambda *a, **k: asked.append(k["packed"]) or real(*a, **k))
    exp = load_export(tiny_export)
    for qk_norm in (False, True):
        t = {**exp["target"], "decoder": {**exp["target"]["decoder"], "qk_norm": qk_norm}}
        assert _resolve_kv("auto", "onnxruntime", {**exp, "target": t}, OrtSettings().resolved(), quiet) == "inplace"
    assert asked == [True, False]


def test_float16_in_place_engines_match_the_portable_graph(tmp_path):
    """GroupQueryAttention's float16 CPU kernel: the in-place fp16 target gives the portable
    fp16 graph's logits within fp16 rounding, and the same greedy tokens."""
    from specrt.export.export import export
    from specrt.runtime.session import Session
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t")
    export(t, write_tiny_draft(tmp_path / "d", t, kind="peagle"), tmp_path / "exp", dtype="float16", log=quiet)
    out = {}
    for kv in ("inplace", "append"):
        build_engines(tmp_path / "exp", "onnxruntime", (1, 2), tmp_path / kv, profile_repeats=1, ort_kv=kv, log=quiet)
        with load_engines(tmp_path / kv) as e:
            assert e.kv_layout("target") == kv
            feeds = {C.INPUT_IDS: np.arange(3, 14)[None], C.POSITION_IDS: np.arange(11)[None],
                     **{n: np.zeros((1, 0, 2, 16), np.float16) for i in range(4) for n in (C.past_key(i), C.past_value(i))}}
            out[kv] = np.array(e.portable("prefill").infer(feeds)[C.LOGITS], np.float32)
        with Session(tmp_path / kv, governor="fixed:2") as s:
            out[kv + "-tokens"] = s.generator.generate([3, 1, 4, 1, 5], 20, s.eos)
    assert np.abs(out["inplace"] - out["append"]).max() <= 1e-2 * max(1.0, np.abs(out["append"]).max())
    assert out["inplace-tokens"] == out["append-tokens"]


def test_a_token_tree_verifies_as_its_chains(tiny_engines):
    """One call over x, a1, a2 and b1, c1 (siblings of a1, at a1's position) gives the rows
    of the chains x a1 a2, x b1 and x c1 run separately, and writes b1's and c1's K/V rows
    (at the slots after the chain's) as those chains write them at a1's slot."""
    rng = np.random.default_rng(12)
    with load_engines(tiny_engines) as engines:
        C_, n = engines.max_context, 30
        base = {nm: rng.standard_normal((1, 2, C_, 16), dtype=np.float32)
                for i in range(4) for nm in (C.cache_key(i), C.cache_value(i))}
        x, a1, a2, b1, c1 = 7, 11, 12, 13, 14

        def call(tokens, positions):
            bufs = {k: v.copy() for k, v in base.items()}
            out = engines.target(len(tokens)).infer({C.INPUT_IDS: np.array([tokens]),
                                                     C.POSITION_IDS: np.array([positions]), **bufs})
            return out[C.LOGITS][0].copy(), out[C.AUX_HIDDEN][0].copy(), bufs

        tree, tree_aux, tree_kv = call([x, a1, a2, b1, c1], [n, n + 1, n + 2, n + 1, n + 1])
        for rows, toks in (([0, 1, 2], [x, a1, a2]), ([0, 3], [x, b1]), ([0, 4], [x, c1])):
            ref, ref_aux, ref_kv = call(toks, list(range(n, n + len(toks))))
            np.testing.assert_allclose(tree[rows], ref, **TOL)
            np.testing.assert_allclose(tree_aux[rows], ref_aux, **TOL)
            for nm in base:
                np.testing.assert_allclose(tree_kv[nm][0, :, n + rows[-1]], ref_kv[nm][0, :, n + len(toks) - 1], **TOL)


def test_a_prefill_can_ask_for_its_last_rows_logits_only(tiny_engines):
    """``logits_from`` (contracts.py "Logits of the last rows only"): the prefill engine
    returns the logits of rows logits_from.. only, equal to those rows of a whole call, with
    the aux hidden states and the KV rows written whole; left out, it is 0 (every row); a
    role of fixed S refuses any value but 0, and a value past the last row is refused."""
    rng = np.random.default_rng(21)
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        base = {nm: rng.standard_normal((1, 2, C_, 16), dtype=np.float32)
                for i in range(4) for nm in (C.cache_key(i), C.cache_value(i))}
        s = 13  # past every built depth: the prefill engine
        r = engines.target(s)
        assert r is engines.runners["prefill"] and [t.name for t in r.inputs if t.optional] == [C.LOGITS_FROM]
        feeds = {C.INPUT_IDS: rng.integers(0, 999, (1, s)), C.POSITION_IDS: np.arange(s)[None]}
        whole_kv = {k: v.copy() for k, v in base.items()}
        whole = {k: v.copy() for k, v in r.infer({**feeds, **whole_kv}).items()}
        assert whole[C.LOGITS].shape[1] == s
        for first in (s - 1, 5, 0):
            kv = {k: v.copy() for k, v in base.items()}
            out = r.infer({**feeds, **kv, C.LOGITS_FROM: np.array(first)})
            assert out[C.LOGITS].shape == (1, s - first, whole[C.LOGITS].shape[-1])
            np.testing.assert_allclose(out[C.LOGITS], whole[C.LOGITS][:, first:], **TOL)
            np.testing.assert_allclose(out[C.AUX_HIDDEN], whole[C.AUX_HIDDEN], **TOL)
            for k in kv:
                np.testing.assert_allclose(kv[k][0, :, :s], whole_kv[k][0, :, :s], **TOL)
        r.infer({**feeds, **base, C.LOGITS_FROM: np.array(s - 1)})
        assert r.infer({**feeds, **base})[C.LOGITS].shape[1] == s  # left out again: every row
        for first in (s, -1):  # (-1 too: mutant B25 passed a negative row to the engine)
            with pytest.raises(UserError, match=rf"logits_from = {first} is not a row of the 13 new tokens"):
                r.infer({**feeds, **base, C.LOGITS_FROM: np.array(first)})
        three = {C.INPUT_IDS: np.ones((1, 3), np.int64), C.POSITION_IDS: np.arange(3)[None]}
        for first in (2, 1):  # (1 too: mutant B23 refused only values past 1)
            with pytest.raises(UserError, match=rf"verify.2'.*logits_from = {first}: this engine's new_tokens is "
                                                "fixed at 3"):
                engines.verify(2).infer({**three, **base, C.LOGITS_FROM: np.array(first)})


def test_prompt_rows_come_out_the_same_in_calls_of_any_length_from_two(tiny_engines):
    """What prefix reuse and the prefill's passes rely on (runtime/generate.py
    Generator._reusable, _passes): a prompt's rows computed in one call or in two (the
    second of >= 2 rows) are the same bits: logits, aux hidden states and KV rows."""
    rng = np.random.default_rng(31)
    toks = rng.integers(0, 999, 30)
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context

        def run(splits):
            bufs = {nm: np.zeros((1, 2, C_, 16), np.float32) for i in range(4) for nm in (C.cache_key(i), C.cache_value(i))}
            at, aux = 0, []
            for s in splits:
                out = engines.target(s).infer({C.INPUT_IDS: toks[None, at:at + s],
                                               C.POSITION_IDS: np.arange(at, at + s)[None], **bufs})
                aux.append(out[C.AUX_HIDDEN][0].copy())
                last, at = out[C.LOGITS][0, -1].copy(), at + s
            return np.concatenate(aux), last, {k: v[:, :, :30].copy() for k, v in bufs.items()}

        whole = run([30])
        for splits in ([28, 2], [25, 5], [13, 17]):
            got = run(splits)
            np.testing.assert_array_equal(got[0], whole[0], err_msg=str(splits))
            np.testing.assert_array_equal(got[1], whole[1], err_msg=str(splits))
            for k in whole[2]:
                np.testing.assert_array_equal(got[2][k], whole[2][k], err_msg=f"{splits} {k}")


def test_a_prefills_cache_outputs_are_the_callers_buffers_beside_its_dynamic_logits(tiny_engines):
    """Mutant O40 (the outputs ONNX Runtime allocated matched to every output, aliased ones
    included): the prefill's logits are sized per call, so its outputs are read back from the
    binding; its in-place cache outputs are still the caller's buffers (not copies of them,
    a context-sized allocation per prompt), and its logits and aux hidden states their own."""
    rng = np.random.default_rng(23)
    with load_engines(tiny_engines) as engines:
        C_ = engines.max_context
        bufs = {n: np.zeros((1, 2, C_, 16), np.float32) for i in range(4) for n in (C.cache_key(i), C.cache_value(i))}
        r = engines.target(13)
        assert r is engines.runners["prefill"]
        out = r.infer({C.INPUT_IDS: rng.integers(0, 999, (1, 13)), C.POSITION_IDS: np.arange(13)[None], **bufs})
        for i in range(4):
            assert out[C.cache_key_out(i)] is bufs[C.cache_key(i)]
            assert out[C.cache_value_out(i)] is bufs[C.cache_value(i)]
        assert np.abs(bufs[C.cache_key(0)][0, :, :13]).min() > 0  # (written)
        assert out[C.LOGITS].shape == (1, 13, 1000) and out[C.AUX_HIDDEN].shape[:2] == (1, 13)
