"""TensorRT engines built from the tiny export match ONNX Runtime (needs a GPU and TensorRT).

Skipped here: TensorRT cannot be installed on CPU-only machines. tools/device_check_trt.py
is the self-contained version of this check for a GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import quiet

pytestmark = pytest.mark.gpu

# fp32 engines (TF32 off) against ONNX Runtime on CPU: different kernels and reduction
# orders, so 1e-4 rather than the 1e-5 of ORT against itself.
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def trt_engines(tiny_export, tmp_path_factory):
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (it needs an NVIDIA GPU machine)")
    from specrt.engines import build_engines

    out = tmp_path_factory.mktemp("trt") / "engines"
    build_engines(tiny_export, "tensorrt", (1, 2, 4), out, precision="fp32", log=quiet, profile_repeats=3)
    return out


def test_tensorrt_matches_onnxruntime_per_depth(trt_engines, tiny_engines_append):
    """Against the append-layout ONNX Runtime engines: the export's portable inputs
    (past_key.*), which TensorRT engines take; in-place ones take cache_key.*."""
    from specrt.engines import load_engines
    from specrt.engines.costs import role_sizes, synthetic_feeds

    trt, ort = load_engines(trt_engines), load_engines(tiny_engines_append)
    rng = np.random.default_rng(0)
    with trt, ort:
        for role in ("prefill", "decode", "verify.1", "verify.2", "verify.4", "draft"):
            sizes = role_sizes(trt.runner(role), 40, draft_depth=4, draft_accepted=2, prefill_tokens=16,
                               draft_kind="peagle")
            feeds = synthetic_feeds(trt.runner(role), sizes, 1000, rng)
            got, want = trt.runner(role).infer(feeds), ort.runner(role).infer(feeds)
            for k, v in want.items():
                if v.dtype.kind == "i":
                    np.testing.assert_array_equal(got[k], v, err_msg=f"{role} {k}")
                else:
                    np.testing.assert_allclose(got[k], v, err_msg=f"{role} {k}", **TOL)


def test_tensorrt_manifest(trt_engines):
    import json

    m = json.loads((trt_engines / "engines.json").read_text())
    assert m["tensorrt"]["layout"] == "profiles"
    assert {f["file"] for f in m["files"]} >= {"target.plan", "draft.plan"}
    assert m["environment"]["device"]["kind"] == "gpu"
    assert set(m["costs"]["verify"]) == {"1", "2", "4"}


def test_tensorrt_plan_tamper_is_refused(trt_engines, tmp_path):
    import shutil

    from specrt.engines import load_engines
    from specrt.errors import UserError

    from .conftest import rewrite_byte

    dst = tmp_path / "e"
    shutil.copytree(trt_engines, dst)
    rewrite_byte(dst / "target.plan")
    with pytest.raises(UserError, match=r"target\.plan: content differs"):
        load_engines(dst)
