"""tools/bench_engines.py: issue 5's latency targets read from the merged results."""

from __future__ import annotations

from tests.real_model import tool


def merged(d4: float, d8: float, og: float) -> dict:
    lat = {"128/1": 20.0, "128/4": 20.0 * d4, "128/8": 20.0 * d8, "512/1": 22.0, "512/4": 22.0 * d4,
           "512/8": 22.0 * d8}
    return {"shared": {"latency": lat},
            "ortgenai": {"latency": {"128/ortgenai": 20.0 / og, "128/1": 20.0, "512/ortgenai": 22.0 / og,
                                     "512/1": 22.0}}}


def test_targets_pass_and_fail_on_the_ratios():
    t = tool("bench_engines")
    ok = t.verdicts(merged(1.05, 1.25, 0.98), [128, 512])
    assert len(ok) == 6 and all(p for _, p in ok)
    bad = dict(t.verdicts(merged(1.21, 1.36, 1.06), [128, 512]))
    assert not any(bad.values())
    assert "context 512: depth 8 1.36x depth 1 (target <= 1.35x)" in bad
    assert "context 128: depth 1 1.06x onnxruntime-genai's per-token time (target <= 1.00x)" in bad


def test_variants_that_did_not_run_give_no_lines():
    t = tool("bench_engines")
    assert t.verdicts({}, [128]) == []
    only = t.verdicts({"shared": merged(1.0, 1.0, 1.0)["shared"]}, [128])
    assert [line for line, _ in only] == ["context 128: depth 4 1.00x depth 1 (target <= 1.20x)",
                                          "context 128: depth 8 1.00x depth 1 (target <= 1.35x)"]
