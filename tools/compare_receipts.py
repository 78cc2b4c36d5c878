"""Print two P-EAGLE training receipts' held-out figures side by side.

    python tools/compare_receipts.py fixtures/peagle-smollm2/training_receipt.json out/peagle-repro-warm9/training_receipt.json

Per position, acceptance (DESIGN.md §6) with a binomial standard error from the
held-out anchor count, tau, steps, data and wall time; exit 1 when tau differs by
more than three combined standard errors (the recipe did not reproduce), 2 when a
receipt cannot be read or lacks a figure (tools/reproduce_draft.sh tells the two apart).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _load(path: str) -> dict:
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        print(f"error: {p}: not a readable training receipt ({e})", file=sys.stderr)
        raise SystemExit(2) from None


def _tau_se(held: dict) -> float:
    # tau = 1 + sum_k a_k over the same anchors; a conservative bound adds the per-position
    # standard errors (they are positively correlated: a_{k+1} <= a_k on every anchor)
    n = max(held["anchors"], 1)
    return sum(math.sqrt(a * (1 - a) / n) for a in held["acceptance_at_pos"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    a, b = (_load(x) for x in args)
    for path, r in zip(args, (a, b)):  # (each read whole first: the error named neither file)
        try:
            _figures(r)
        except (KeyError, TypeError, IndexError, ValueError) as e:
            print(f"error: {path}: the receipt lacks a figure ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    return _compare(a, b)


FIGURES = (
    ("answers", lambda r: r["data"]["chat"]["answers"]),
    ("answer tokens", lambda r: r["data"]["chat"]["answer_tokens"]),
    ("steps", lambda r: r["steps"]),
    ("training min", lambda r: round(r["wall_seconds"]["training"] / 60, 1)),
    ("total min (training script)", lambda r: round(r["wall_seconds"]["total"] / 60, 1)),
    ("held-out anchors", lambda r: r["heldout"]["anchors"]),
)


def _figures(r: dict) -> list:
    """Every figure _compare reads of receipt ``r`` (a KeyError, TypeError... where one lacks)."""
    held = r["heldout"]
    return [get(r) for _, get in FIGURES] + [float(held["tau"]), _tau_se(held)]


def _compare(a: dict, b: dict) -> int:
    rows = [("", "committed", "reproduced")]
    for key, get in FIGURES:
        rows.append((key, str(get(a)), str(get(b))))
    ha, hb = a["heldout"], b["heldout"]
    for k, (x, y) in enumerate(zip(ha["acceptance_at_pos"], hb["acceptance_at_pos"])):
        rows.append((f"acceptance pos {k + 1}", f"{x:.4f}", f"{y:.4f}"))
    sa, sb = _tau_se(ha), _tau_se(hb)
    rows.append(("tau", f"{ha['tau']:.4f} +- {sa:.4f}", f"{hb['tau']:.4f} +- {sb:.4f}"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    diff = abs(ha["tau"] - hb["tau"])
    bound = 3 * math.hypot(sa, sb)
    ok = diff <= bound
    print(f"tau differs by {diff:.4f} ({'within' if ok else 'beyond'} 3 combined standard errors, {bound:.4f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
