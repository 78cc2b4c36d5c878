"""tools/bench_gqa.py: one GroupQueryAttention node timed in place, and its bad options."""

from __future__ import annotations

import numpy as np

from tests.real_model import tool


def test_times_every_past_and_row_count(capsys):
    t = tool("bench_gqa")
    assert t.main(["--pasts", "0,30", "--rows", "1,2", "--cache-len", "32", "--repeats", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "past     0: S=1" in out and "past    30: S=1" in out and "S=2" in out and "(1.00x)" in out


def test_the_node_updates_the_bound_cache_in_place():
    import onnxruntime as ort

    t = tool("bench_gqa")
    s = ort.InferenceSession(t.gqa_model(2, 1, 16, 16), providers=["CPUExecutionProvider"])
    ck, cv = (ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1, 16, 16), np.float32)) for _ in range(2))
    io = s.io_binding()
    io.bind_cpu_input("qkv", np.ones((1, 2, 64), np.float32))
    for n, v in (("ck", ck), ("cv", cv)):
        io.bind_ortvalue_input(n, v)
    io.bind_cpu_input("seqlens_k", np.array([5], np.int32))
    io.bind_cpu_input("total", np.array(6, np.int32))
    io.bind_output("o")
    io.bind_ortvalue_output("ok", ck)
    io.bind_ortvalue_output("ov", cv)
    s.run_with_iobinding(io)
    v = cv.numpy()[0, 0]
    assert np.all(v[4:6] == 1) and np.all(v[:4] == 0) and np.all(v[6:] == 0)  # rows 4-5 written where bound


def test_rows_past_the_cache_are_an_error(capsys):
    t = tool("bench_gqa")
    assert t.main(["--pasts", "30", "--rows", "1,4", "--cache-len", "32", "--repeats", "1"]) == 1
    assert "exceed --cache-len 32" in capsys.readouterr().err
    assert t.main(["--rows", "2,3"]) == 1
    assert "--rows must include 1" in capsys.readouterr().err
