"""A DSpark confidence head (DeepSpec's ``enable_confidence_head``: confidence_head.proj, a
Linear(H, 1) on the hidden state the draft's LM head reads, sigmoid = the position's predicted
acceptance): bound by exact name, lowered as ``draft_confidence``, and read by the runtime as
each draft position's confidence instead of the draft's probability of its own token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from specrt import contracts as C
from specrt.engines import build_engines
from specrt.engines.engine_set import load_engines
from specrt.errors import UserError
from specrt.export.binding import bind_draft, bind_target
from specrt.export.export import export
from specrt.runtime import generate as G
from specrt.runtime.governor import DSparkGovernor, OffGovernor
from specrt.runtime.session import read_d2t
from tests.fixtures_models import write_tiny_draft, write_tiny_target

DEPTHS = (1, 2, 4)


def _head_on_logit(draft, j: int, bias: float) -> None:
    """The head's weight made the LM head's row j: its logit is that row's logit + bias."""
    x = load_file(str(draft / "model.safetensors"))
    x["confidence_head.proj.weight"] = x["lm_head.weight"][j : j + 1].copy()
    x["confidence_head.proj.bias"] = np.array([bias], np.float32)
    save_file(x, str(draft / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module", params=[("llama", "peagle"), ("qwen3", "eagle3")], ids=lambda p: p[1])
def built(request, tmp_path_factory):
    model_type, kind = request.param
    root = tmp_path_factory.mktemp("conf")
    t = write_tiny_target(root / "t", model_type, vocab_size=64)
    d = write_tiny_draft(root / "d", t, kind=kind, num_layers=1, draft_vocab=64, mask_token_id=63,
                         confidence_head=True)
    _head_on_logit(d, 5, 0.25)
    export(t, d, root / "exp")
    build_engines(root / "exp", "onnxruntime", DEPTHS, root / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    engines = load_engines(root / "eng")
    engines.activate()
    yield root, kind, engines
    engines.deactivate()


def test_the_head_reads_what_the_lm_head_reads(built):
    """draft_confidence = sigmoid(w . normed h + b): with w the LM head's row 5, the
    sigmoid of logit 5 + b at every position, in both draft kinds."""
    root, kind, engines = built
    m = json.loads((root / "exp" / "export.json").read_text())
    assert m["draft"]["confidence_head"] is True
    names = [o["name"] for o in m["graphs"]["draft"]["io"]["outputs"]]
    assert C.DRAFT_CONFIDENCE in names
    d = m["draft"]
    empty = G.KVCache(d["num_layers"], d["num_kv_heads"], d["head_dim"], 8).past_feeds()
    aux = np.random.default_rng(0).standard_normal((1, 5, 3 * m["target"]["hidden_size"])).astype(np.float32)
    feeds = {C.INPUT_IDS: np.array([[3, 1, 4, 1, 5, 63, 63]]), C.POSITION_IDS: np.arange(7)[None],
             C.DRAFT_AUX_IN: aux, **empty}
    if kind == "eagle3":
        feeds[C.INPUT_IDS], feeds[C.POSITION_IDS] = feeds[C.INPUT_IDS][:, :5], feeds[C.POSITION_IDS][:, :5]
        feeds[C.DRAFT_PREV_HIDDEN] = np.zeros((1, 0, d["hidden_size"]), np.float32)
    out = engines.draft().infer(feeds)
    want = 1 / (1 + np.exp(-(out[C.DRAFT_LOGITS][0, :, 5].astype(np.float64) + 0.25)))
    assert out[C.DRAFT_CONFIDENCE].shape == out[C.DRAFT_LOGITS].shape[:2]
    np.testing.assert_allclose(out[C.DRAFT_CONFIDENCE][0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_type,kind", [("llama", "peagle"), ("qwen3", "eagle3")])
def test_the_runtime_reads_the_heads_confidences_and_output_stays_the_targets(tmp_path, model_type, kind):
    """A head with weight 0 and bias -0.5 says sigmoid(-0.5) at every position: every
    round's confidences are that (the draft's own probabilities would vary), and greedy
    output under DSpark is target-only decoding's."""
    t = write_tiny_target(tmp_path / "t", model_type, vocab_size=64)
    d = write_tiny_draft(tmp_path / "d", t, kind=kind, num_layers=1, draft_vocab=64, mask_token_id=63,
                         confidence_head=True)
    x = load_file(str(d / "model.safetensors"))
    x["confidence_head.proj.weight"][:] = 0.0
    x["confidence_head.proj.bias"][:] = -0.5
    save_file(x, str(d / "model.safetensors"), metadata={"format": "pt"})
    export(t, d, tmp_path / "exp")
    build_engines(tmp_path / "exp", "onnxruntime", DEPTHS, tmp_path / "eng", log=lambda s: None, profile_repeats=1,
                  profile_pasts=(16,), max_context=64)
    engines = load_engines(tmp_path / "eng")
    engines.activate()
    d2t = read_d2t(engines.export_dir, engines.export)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = G.Generator(engines, OffGovernor(DEPTHS), d2t=d2t).generate(prompt, 20)
    seen = []

    class Watch(DSparkGovernor):
        def observe(self, r):
            if r.confidences is not None:
                seen.append(np.array(r.confidences))
            super().observe(r)

    costs = {k: 1e-3 * (1 + 0.05 * k) for k in (0, *DEPTHS)}
    g = G.Generator(engines, Watch(DEPTHS, 2e-4, costs), d2t=d2t)
    assert g.confidence_head
    assert g.generate(prompt, 20) == ref
    engines.deactivate()
    assert seen
    np.testing.assert_allclose(np.concatenate(seen), 1 / (1 + np.exp(0.5)), rtol=1e-6)


def test_a_head_error_comes_before_the_embedding_comparison(tmp_path):
    """bind_draft compares a draft's own embedding with the target's (a pass over both, in
    blocks, when their dtypes differ) only after every check that can refuse the draft: with
    the target's file gone once bound (its reader closed), a comparison would fail to read it,
    so the confidence head's error shows that none ran (it was made before that check)."""
    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=64)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=64, mask_token_id=63,
                         confidence_head=True, own_embed=True)
    x = load_file(str(d / "model.safetensors"))
    x["embed_tokens.weight"] = x["embed_tokens.weight"].astype(np.float16)  # (float32 target: compared row by row)
    save_file(x, str(d / "model.safetensors"))
    target = bind_target(t)
    assert bind_draft(d, target).embed_matches_target is False  # compared (its own random rows)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "enable_confidence_head": False}))
    target.reader.close()
    (t / "model.safetensors").rename(tmp_path / "moved.safetensors")
    with pytest.raises(UserError, match="is a confidence head, but config.json does not enable one"):
        bind_draft(d, target)


def test_a_head_needs_its_config_flag_and_no_markov_head(tmp_path):
    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=64)
    target = bind_target(t)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=64, mask_token_id=63,
                         confidence_head=True)
    assert bind_draft(d, target).config.confidence_head
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "enable_confidence_head": False}))
    with pytest.raises(UserError, match="'confidence_head.proj.(weight|bias)' is a confidence head, but config.json "
                                        "does not enable one"):
        bind_draft(d, target)
    (d / "config.json").write_text(json.dumps({**cfg, "confidence_head_with_markov": True}))
    with pytest.raises(UserError, match="confidence_head_with_markov is true"):
        bind_draft(d, target)
    x = load_file(str(d / "model.safetensors"))
    del x["confidence_head.proj.bias"]
    save_file(x, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="draft slot 'confidence_head_bias' is missing: expected one of "
                                        "'confidence_head.proj.bias'"):
        bind_draft(d, target)


def test_a_markov_flag_without_a_head_is_read(tmp_path):
    """confidence_head_with_markov true where enable_confidence_head is false names no head:
    the draft is read as one without (mutant m69c-M105 refused it as a Markov confidence head)."""
    from specrt.export.config import load_draft_config

    t = write_tiny_target(tmp_path / "t", "llama", vocab_size=64)
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=1, draft_vocab=64, mask_token_id=63)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "enable_confidence_head": False,
                                               "confidence_head_with_markov": True}))
    dc = load_draft_config(d)
    # (mutant m69c-M023: the receipt's config then said confidence_head false, where drafts without a
    # head have no such key, as before heads were read)
    assert not dc.confidence_head and "confidence_head" not in dc.to_json()
    assert not bind_draft(d, bind_target(t)).config.confidence_head
