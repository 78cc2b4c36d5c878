"""tools/spike_onepass_gemm.py: the generated kernel compiles, and its products match float64."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.real_model import tool


def _tool():
    return tool("spike_onepass_gemm")


def test_every_accumulator_is_a_register_variable():
    t = _tool()
    src = t.tile_source(9, 1)
    assert src.count("_mm256_setzero_ps()") == 9 and src.count("_mm256_fmadd_ps") == 9
    assert "[" not in src.split("{", 1)[1].split("for (int k")[0]  # no accumulator array for GCC to spill


def test_compiles_and_agrees_with_float64(capfd):
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if shutil.which("g++") is None or " avx2" not in flags or " fma" not in flags:
        pytest.skip("needs g++ and an AVX2/FMA CPU")
    t = _tool()
    t.SHAPES = [(64, 256)]
    assert t.main(["--threads", "1"]) == 0
    out = capfd.readouterr().out
    assert "[64 x 256] M= 9" in out
