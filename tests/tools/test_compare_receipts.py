"""tools/compare_receipts.py: a reproduced draft's training receipt beside the committed one."""

from __future__ import annotations

import json
from pathlib import Path

from tests.real_model import tool

COMMITTED = Path(__file__).resolve().parents[2] / "fixtures" / "peagle-smollm2" / "training_receipt.json"


def test_receipts_within_and_beyond_three_standard_errors(tmp_path, capsys):
    t = tool("compare_receipts")
    assert t.main([str(COMMITTED), str(COMMITTED)]) == 0
    assert "tau differs by 0.0000 (within 3 combined standard errors" in capsys.readouterr().out
    r = json.loads(COMMITTED.read_text())
    r["heldout"]["tau"] -= 0.5  # (a recipe that did not reproduce)
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(r))
    assert t.main([str(COMMITTED), str(worse)]) == 1
    assert "tau differs by 0.5000 (beyond 3 combined standard errors" in capsys.readouterr().out


def test_a_receipt_lacking_a_figure_is_named(tmp_path, capsys):
    """"error: a receipt lacks a figure (KeyError: 'steps')" named neither file (a walk of the
    tools, session 71): which one is what a user needs to know."""
    t = tool("compare_receipts")
    r = json.loads(COMMITTED.read_text())
    for drop in ("steps", "heldout"):
        short = tmp_path / f"no-{drop}.json"
        short.write_text(json.dumps({k: v for k, v in r.items() if k != drop}))
        for args in ([COMMITTED, short], [short, COMMITTED]):
            assert t.main([str(a) for a in args]) == 2
            out = capsys.readouterr()
            assert out.err == f"error: {short}: the receipt lacks a figure (KeyError: '{drop}')\n" and out.out == ""
