"""Reprice the whole DSpark governor, simulated on run 4's recorded rounds, at the per-depth costs measured
live in summary.txt (verify at each fixed depth's own depth, decode of off, draft blocks of fixed:8) instead of
the build's cost table; decisions made with either (tools/governor_replay.py ``simulate``). Needs
out/device/engines-run4 (its cost table and calibration).

    .venv/bin/python results/device_draft/governors_costs/reprice.py
"""
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
from bench_governors import dspark_from_table, oracle_choices, price  # noqa: E402
from governor_replay import simulate  # noqa: E402

from specrt.runtime.governor import Calibration  # noqa: E402

z = np.load(ROOT / "results/governors_target_confidence/gpu_run4_draft_rounds.npz")
rounds = list(zip(z["conf"], [int(a) for a in z["accepted"]]))
acc = [a for _, a in rounds]
eng = ROOT / "out/device/engines-run4"
manifest = json.loads((eng / "engines.json").read_text())
table, depths = manifest["costs"], manifest["depths"]
cal = json.loads((eng / "calibration.json").read_text())["calibration"]
live = {"decode": 0.0203, "verify": {"1": 0.0225, "2": 0.0228, "3": 0.0235, "4": 0.0242, "6": 0.0294, "8": 0.0306},
        "draft_by_depth": {"1": 0.0018, "2": 0.0019, "3": 0.0020, "4": 0.0021, "6": 0.0023, "8": 0.0026}, "draft": 0.0026}
for decide, pay in (("table", "table"), ("table", "live"), ("live", "live")):
    c_decide, c_pay = (table if x == "table" else live for x in (decide, pay))
    fixed = {d: price([d] * len(acc), acc, c_pay, depths) for d in depths}
    best = max(fixed, key=fixed.get)
    rate, _ = simulate(dspark_from_table(c_decide, depths, Calibration.from_dict(cal)), rounds, c_decide, depths, c_pay)
    oracle = price(oracle_choices(acc, depths), acc, c_pay, depths)
    print(f"decide with {decide:5s} costs, pay {pay:5s}: best fixed:{best}, dspark {rate / fixed[best]:.3f}x, "
          f"oracle {oracle / fixed[best]:.3f}x")
