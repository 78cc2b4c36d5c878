"""Reprice the whole DSpark governor, simulated on run 4's recorded rounds, at the per-depth costs measured
live in summary.txt (verify at each fixed depth's own depth, decode of off, draft blocks of fixed:8) instead of
the build's cost table; decisions made with either. Needs out/device/engines-run4 (its cost table and
calibration). Run: .venv/bin/python results/device_draft/governors_costs/reprice.py"""
import json, sys
import numpy as np
ROOT = __import__("pathlib").Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools"))
from bench_governors import price, table_costs
import governor_replay as R
from specrt.runtime.governor import DSparkGovernor, Calibration
z = np.load(ROOT / "results/governors_target_confidence/gpu_run4_draft_rounds.npz")
rounds = list(zip(z["conf"], [int(a) for a in z["accepted"]]))
acc = [a for _, a in rounds]
eng = str(ROOT / "out/device/engines-run4")
table = json.load(open(f"{eng}/engines.json"))["costs"]; depths = json.load(open(f"{eng}/engines.json"))["depths"]
cal = json.load(open(f"{eng}/calibration.json"))["calibration"]
live = {"decode": 0.0203, "verify": {"1": 0.0225, "2": 0.0228, "3": 0.0235, "4": 0.0242, "6": 0.0294, "8": 0.0306},
        "draft_by_depth": {"1": 0.0018, "2": 0.0019, "3": 0.0020, "4": 0.0021, "6": 0.0023, "8": 0.0026}, "draft": 0.0026}
def gov(c):
    dec, ver, _ = table_costs(c, depths)
    return DSparkGovernor(depths, {int(k): v for k, v in c["draft_by_depth"].items()}, {**ver, 0: dec}, Calibration.from_dict(cal))
for name, decide, pay in (("table/table", table, table), ("table/live", table, live), ("live/live", live, live)):
    fixed = {d: price([d]*len(acc), acc, pay, depths) for d in depths}
    best = max(fixed, key=fixed.get)
    # decisions with `decide` costs, priced at `pay`: record choices then price
    g = gov(decide); blocks = []; ds = []
    from specrt.runtime.governor import GovernorState
    from specrt.runtime.telemetry import RoundResult
    dec_d, ver_d, draft_d = table_costs(decide, depths)
    dec_p, ver_p, draft_p = table_costs(pay, depths)
    tok = sec = 0.0
    for c, a in rounds:
        k = g.choose(GovernorState())
        if k == 0:
            tok += 1; sec += dec_p; g.observe(RoundResult(0, 0, 0.0, dec_d)); continue
        d = g.choose(GovernorState(confidences=np.asarray(c[:k])))
        got = min(a, d); tok += got + 1; sec += draft_p(k) + (ver_p[d] if d else dec_p)
        g.observe(RoundResult(d, got, draft_d(k), ver_d[d] if d else dec_d, None, np.asarray(c[:k])))
    print(f"decide with {name.split('/')[0]:5s} costs, pay {name.split('/')[1]:5s}: best fixed:{best}, dspark {tok/sec/fixed[best]:.3f}x, oracle {price(R.oracle_choices(acc, depths), acc, pay, depths)/fixed[best]:.3f}x")
