"""Does a verify depth the governor rarely picks run cold? (2026-11-30)

In results/governors (bench_all, stage-3 draft) DSpark verified depth 2 in only 16 of
1423 rounds, and those took 32 ms on average against 23.9 ms in fixed:2's rounds. This
times verify.2 on the build's own feeds (engines/costs.py loop order, past 128, each
verify right after a draft pass) in three settings: after other verify.2 calls, after
20-60 alternating verify.1 / verify.3 calls, and verify.1 / verify.3 alternating.

    python tools/exp_cold_depth.py ENGINES_DIR
"""
import time, sys
import numpy as np
from specrt.engines import load_engines
from specrt.engines.costs import loop_order
from specrt.engines.plan import DRAFT, verify_role
e = load_engines(sys.argv[1], verify=False)
e.activate()
runners = e.runners
depths = tuple(e.depths)
graph_of = {n: ("draft" if n == DRAFT else "target") for n in runners}
V = int(e.export["target"]["vocab_size"])
kw = dict(draft_depth=max(depths), draft_accepted=2, prefill_tokens=128, draft_kind="peagle")
calls = loop_order(runners, 128, depths, "peagle", {"target": V, "draft": V}, graph_of, kw, np.random.default_rng(0))
by = {k: (r, f) for k, r, f in calls}
print(sorted(map(str, by)))
def call(k):
    r, f = by[k]; t = time.perf_counter(); r.infer(f); return time.perf_counter() - t
v = {d: (verify_role(d), None) for d in (1, 2, 3)}
dr = (DRAFT, None)
for _ in range(5):
    for d in (1, 2, 3): call(dr); call(v[d])
warm, cold, mix13 = [], [], []
for rep in range(15):
    for _ in range(10):
        call(dr); warm.append(call(v[2]))
    for _ in range(10):
        call(dr); mix13.append(call(v[1])); call(dr); mix13.append(call(v[3]))
    call(dr); cold.append(call(v[2]))
    for _ in range(30):
        call(dr); call(v[1]); call(dr); call(v[3])
    call(dr); cold.append(call(v[2]))
ms = lambda x: f"{np.median(x)*1e3:.2f} ms (n={len(x)})"
print("verify.2 after verify.2 calls:", ms(warm))
print("verify.2 after 20-60 verify.1/3 calls:", ms(cold))
print("verify.1/3 alternating:", ms(mix13))
