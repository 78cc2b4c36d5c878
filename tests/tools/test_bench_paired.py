"""tools/bench_paired.py: per-prompt ratios of two configurations of a bench report."""

from __future__ import annotations

import json

import pytest

from tests.real_model import tool


REPORT = {"configs": {"specrt:off": {"tokens_per_s_per_prompt": [10.0, 20.0, 40.0, 50.0]},
                      "specrt:off:ngram": {"tokens_per_s_per_prompt": [12.0, 18.0, 80.0, 100.0]}},
          "outputs": {"specrt:off": [[1] * 10, [1] * 20, [1] * 40, [1] * 100],
                      "specrt:off:ngram": [[1] * 10, [1] * 20, [1] * 40, [1] * 100]}}


def test_ratios_are_per_prompt_and_totals_are_tokens_over_seconds(tmp_path, capsys):
    t = tool("bench_paired")
    r = t.paired(REPORT, "off:ngram", "off")
    # ratios 1.2, 0.9, 2.0, 2.0: median 1.6, faster on 3 of 4
    assert r["median"] == pytest.approx(1.6) and r["faster"] == 3 and r["prompts"] == 4
    assert r["median_a"] == pytest.approx(49.0) and r["median_b"] == pytest.approx(30.0)
    # off: 170 tokens in 1 + 1 + 1 + 2 = 5 s; ngram: 10/12 + 20/18 + 0.5 + 1 s
    assert r["total_b"] == pytest.approx(170 / 5)
    assert r["total_a"] == pytest.approx(170 / (10 / 12 + 20 / 18 + 0.5 + 1.0))
    r = t.paired(REPORT, "specrt:off:ngram", "off", 2, 4)  # the last two prompts: ratio 2 both
    assert r["median"] == pytest.approx(2.0) and r["prompts"] == 2 and r["total_b"] == pytest.approx(140 / 3)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(REPORT))
    assert t.main([str(path), "off:ngram", "off", "--prompts", "0:2"]) == 0
    assert "per-prompt ratio median 1.050, faster on 1/2" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no configuration 'fixed:2'"):
        t.paired(REPORT, "fixed:2", "off")
    with pytest.raises(SystemExit, match="in pairs"):
        t.main([str(path), "off"])
