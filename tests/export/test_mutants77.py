"""Mutation round m77d over the export side (config.py, binding.py, checkpoint.py): each test
kills a mutant that survived the export tests, on real checkpoints (transformers-written tiny
models, the speculators reference files, write_eagle3's EAGLE-3 drafts)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from specrt.errors import UserError
from specrt.export.binding import bind_draft, bind_target

from .conftest import REFERENCE, rewrite, write_eagle3


def _edit_json(path: Path, **changes) -> None:
    """Set config.json fields (``a__b`` reaches a nested one; None deletes)."""
    cfg = json.loads(path.read_text())
    for k, v in changes.items():
        node = cfg
        *inner, last = k.split("__")
        for part in inner:
            node = node[part]
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    path.write_text(json.dumps(cfg))


def test_a_draft_for_a_smaller_verifier_vocabulary_is_refused(tmp_path):
    """m77d-B17: binding._check_agreement's `dc.decoder.vocab_size != tc.vocab_size` as `>`:
    a draft built for a verifier vocabulary of 900 (t2d over 900 ids, no embeddings of its
    own) bound to a target of 1000, its ids meant for another tokenizer."""
    folder = write_eagle3(tmp_path / "e3", target_vocab=900)
    _edit_json(folder / "config.json", transformer_layer_config__vocab_size=900)
    with pytest.raises(UserError, match=r"verifier vocabulary of 900 \(transformer_layer_config.vocab_size\), the "
                                        r"target .* has 1000: a draft trained against another model"):
        bind_draft(folder, bind_target(REFERENCE / "verifier"))


def test_a_float16_draft_embedding_four_steps_off_the_target_s_differs(tmp_path):
    """m77d-B23: _embed_matches_target's tolerance the narrower of the two dtypes' (0 for a
    float32 target, then taken as bfloat16's 2**-7) in place of the wider: a float16 draft
    embedding whose largest weight lies four float16 steps (2**-8 of it) from the float32
    target's was said to be the target's."""
    from .conftest import copy_tree

    folder = copy_tree(REFERENCE, tmp_path / "ref")
    t = bind_target(folder / "verifier")
    assert t.slots["embed"].entry.dtype == "F32"
    w = load_file(str(folder / "draft" / "model.safetensors"))["embed_tokens.weight"].astype(np.float16)
    rewrite(folder / "draft", change={"embed_tokens.weight": w})
    assert bind_draft(folder / "draft", t).embed_matches_target is True  # float16's rounding of the target's
    k = int(np.argmax(np.abs(w).ravel()))
    w.view(np.int16).ravel()[k] += 4
    rewrite(folder / "draft", change={"embed_tokens.weight": w})
    d = bind_draft(folder / "draft", t)
    assert d.slots["embed"].entry.dtype == "F16" and d.embed_matches_target is False


def test_a_confidence_head_bias_that_is_nan_is_refused(tmp_path):
    """m77d-B43: binding._scan_values' chunks from `range(0, flat.size - 1, chunk)`, which
    scans nothing of a one-value tensor (and leaves out the last value of one a chunk past a
    whole number of chunks): a confidence head bias of NaN went into the export unread, its
    engines' confidence NaN at every position."""
    from specrt.export.export import export
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t", vocab_size=64)
    d = write_tiny_draft(tmp_path / "d", t, num_layers=1, draft_vocab=64, confidence_head=True)
    rewrite(d, change={"confidence_head.proj.bias": np.array([np.nan], np.float32)})
    with pytest.raises(UserError, match=r"tensor 'confidence_head.proj.bias' \(slot 'confidence_head_bias'\) holds "
                                        r"1 non-finite value\(s\) \(NaN\); a checkpoint's weights must be finite"):
        bind_draft(d, bind_target(t)).get("confidence_head_bias")
    with pytest.raises(UserError, match="confidence_head.proj.bias"):
        export(t, d, tmp_path / "exp")
    assert not (tmp_path / "exp").exists()


def _edit_header(path: Path, name: str, **fields) -> None:
    """Rewrite fields of one tensor's entry in a safetensors header (the data left as it is)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header[name].update(fields)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


@pytest.mark.parametrize("shape", [[64.0], [-8, -8], [True, 64]], ids=["float", "negative", "bool"])
def test_a_header_shape_of_other_than_whole_numbers_is_named(tmp_path, shape):
    """m77d-C03: checkpoint.read_safetensors_index's shape check cut to `isinstance(shape, list)`:
    a real checkpoint whose final norm's header says [64.0] bound (64.0 == 64) and its read
    was a TypeError traceback; [-8, -8] (64 values too) was named as a shape the config
    disagrees with, not as the malformed header it is."""
    from .conftest import copy_tree

    folder = copy_tree(REFERENCE / "verifier", tmp_path / "v")
    _edit_header(folder / "model.safetensors", "model.norm.weight", shape=shape)
    with pytest.raises(UserError, match=rf"model.safetensors: tensor 'model.norm.weight': malformed shape "
                                        rf"{re.escape(repr(shape))}$"):
        bind_target(folder)


def test_a_bfloat16_weight_holding_nan_is_refused(tmp_path):
    """m77d-B64: Bound.get's scan for non-finite values keyed on the stored dtype (F32, F16,
    F64) in place of the array read: a bfloat16 weight holding NaN (bfloat16 is read as
    float32, numpy having none) went unscanned into the export."""
    import torch
    from safetensors.torch import load_file as load_torch
    from safetensors.torch import save_file as save_torch

    from .conftest import copy_tree

    folder = copy_tree(REFERENCE / "verifier", tmp_path / "v")
    path = folder / "model.safetensors"
    state = load_torch(str(path))
    w = state["model.layers.0.mlp.down_proj.weight"].to(torch.bfloat16)
    w[3, 5] = float("nan")
    state["model.layers.0.mlp.down_proj.weight"] = w
    save_torch(state, str(path), metadata={"format": "pt"})
    t = bind_target(folder)
    assert t.slots["layers.0.down"].entry.dtype == "BF16"
    with pytest.raises(UserError, match=r"tensor 'model.layers.0.mlp.down_proj.weight' \(slot 'layers.0.down'\) holds "
                                        r"1 non-finite value\(s\) \(NaN\)"):
        t.get("layers.0.down")


def test_a_llama_draft_whose_layer_types_mark_fewer_layers_than_it_has_is_not_windowed(tmp_path):
    """m77d-K50: config.load_draft_config's `len(kinds) >= decoder.num_layers` dropped: a
    two-layer llama draft whose layer_types marks one layer sliding (transformers checks
    layer_types' length for Qwen only) had the window applied to both; what its second layer
    was trained with is not said, so the window is recorded, not applied (as for a mix)."""
    from specrt.export.config import load_draft_config
    from tests.fixtures_models import write_tiny_draft, write_tiny_target

    t = write_tiny_target(tmp_path / "t")
    d = write_tiny_draft(tmp_path / "d", t, kind="peagle", num_layers=2)
    _edit_json(d / "config.json", transformer_layer_config__sliding_window=16,
               transformer_layer_config__layer_types=["sliding_attention"])
    dc = load_draft_config(d)
    assert dc.decoder.num_layers == 2 and dc.decoder.sliding_window == 16 and dc.attention_window is None
    _edit_json(d / "config.json", transformer_layer_config__layer_types=["sliding_attention"] * 2)
    assert load_draft_config(d).attention_window == 16


def test_a_speculators_draft_naming_no_verifier_architectures_is_named_as_missing(tmp_path):
    """m77d-K85: speculators_config.verifier.architectures read as optional (an empty list when
    absent): the draft's config loaded, and the binding then said "verifier.architectures is
    [], the target is LlamaForCausalLM: a draft trained against another model" of a field
    that is simply missing."""
    from specrt.export.config import load_draft_config

    from .conftest import copy_tree

    folder = copy_tree(REFERENCE, tmp_path / "ref")
    _edit_json(folder / "draft" / "config.json", speculators_config__verifier__architectures=None)
    with pytest.raises(UserError, match=r"config.json.speculators_config.verifier: missing required field "
                                        r"'architectures'$"):
        load_draft_config(folder / "draft")
    with pytest.raises(UserError, match="missing required field 'architectures'"):
        bind_draft(folder / "draft", bind_target(folder / "verifier"))


def test_a_checkpoint_one_byte_short_is_named_truncated(tmp_path):
    """m77d-C08: read_safetensors_index's `start + e > size` as `> size + 1`: a real checkpoint
    missing its last byte was refused as having "-1 bytes after the last tensor" in place of
    the tensor whose data runs past the end of the file."""
    from .conftest import copy_tree

    folder = copy_tree(REFERENCE / "verifier", tmp_path / "v")
    f = folder / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-1])
    with pytest.raises(UserError, match=rf"model.safetensors: tensor '[^']+': data ends at byte {len(data)} but the "
                                        rf"file has {len(data) - 1} bytes \(truncated\?\)$"):
        bind_target(folder)
