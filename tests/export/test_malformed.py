"""Random, truncated and hostile bytes through the reader: only UserErrors come out."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specrt.errors import UserError
from specrt.export.binding import bind_draft, bind_target

from .conftest import REFERENCE

VERIFIER_BYTES = (REFERENCE / "verifier" / "model.safetensors").read_bytes()
CONFIG = (REFERENCE / "verifier" / "config.json").read_text()


def _try(folder: Path, draft: Path | None = None) -> None:
    try:
        t = bind_target(folder)
        if draft is not None:
            bind_draft(draft, t)
    except UserError:
        pass  # the only acceptable failure


def _folder(weights: bytes, config: str = CONFIG) -> Path:
    d = Path(tempfile.mkdtemp(prefix="specrt-fuzz-"))
    (d / "config.json").write_text(config)
    (d / "model.safetensors").write_bytes(weights)
    return d


settings.register_profile("specrt", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("specrt")


@given(st.binary(max_size=4096))
def test_random_bytes(data):
    d = _folder(data)
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


@given(st.integers(min_value=0, max_value=len(VERIFIER_BYTES) - 1))
def test_truncated(cut):
    d = _folder(VERIFIER_BYTES[:cut])
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


@given(st.integers(min_value=8, max_value=2000), st.binary(min_size=1, max_size=8))
def test_corrupted_header(pos, junk):
    b = bytearray(VERIFIER_BYTES)
    b[pos:pos + len(junk)] = junk
    d = _folder(bytes(b))
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


@given(st.text(max_size=300))
def test_bad_config_json(text):
    d = _folder(VERIFIER_BYTES, config=text)
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=8)


@given(st.sampled_from(sorted(json.loads(CONFIG))), json_values)
def test_config_field_replaced(key, value):
    cfg = json.loads(CONFIG)
    cfg[key] = value
    d = _folder(VERIFIER_BYTES, config=json.dumps(cfg))
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


@given(st.text(min_size=1, max_size=40))
def test_hostile_shard_names(name):
    d = _folder(VERIFIER_BYTES)
    (d / "model.safetensors").rename(d / "shard.safetensors")
    header_len = struct.unpack("<Q", VERIFIER_BYTES[:8])[0]
    names = list(json.loads(VERIFIER_BYTES[8:8 + header_len]))
    wmap = {n: "shard.safetensors" for n in names if n != "__metadata__"}
    wmap[next(iter(wmap))] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    try:
        _try(d)
    finally:
        shutil.rmtree(d)


@given(st.binary(max_size=2048))
def test_random_draft_weights(data):
    d = Path(tempfile.mkdtemp(prefix="specrt-fuzz-"))
    try:
        (d / "config.json").write_text((REFERENCE / "draft" / "config.json").read_text())
        (d / "model.safetensors").write_bytes(data)
        _try(REFERENCE / "verifier", draft=d)
    finally:
        shutil.rmtree(d)
