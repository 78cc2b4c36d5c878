"""Session 50: the decode speed-up each vocabulary would give at fixed:k, from the loop taus of
ceiling.txt and the draft and verify costs of costs.txt (three rounds of `specrt profile
--repeats 20` on four builds, in turn: the committed draft and tools/grow_draft.py --vocab N of
it; medians over the rounds of tau x decode / (draft pass at depth k + verify.k), eval_draft's
``predicted_speedups``).

    .venv/bin/python results/draft_vocab/predict.py > results/draft_vocab/predict.txt
"""
import ast
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
rounds = {}
for line in (HERE / "costs.txt").read_text().splitlines():
    m = re.match(r"round (\d) (\d+) decode ([\d.]+) ms draft_by_depth (\{.*\}) verify (\{.*\})", line)
    if m:
        rounds.setdefault(int(m[2]), []).append((float(m[3]), ast.literal_eval(m[4]), ast.literal_eval(m[5])))
taus, size = {}, None
for line in (HERE / "ceiling.txt").read_text().splitlines():
    m = re.match(r"\s*(\d+)?\s+(\[[\d., ]+\])\s+(.*)", line)
    if m:
        size = int(m[1]) if m[1] else size
        taus[(size, m[3].strip(" ()"))] = ast.literal_eval(m[2])
print(f"{'vocabulary':>10} {'loop tau':>11}  draft pass ms at depth 1-4 (median)   predicted speed-up at fixed:1-4")
for (n, how), tau in taus.items():
    r = rounds.get(n)
    if not r:
        continue
    draft = [statistics.median(x[1][str(k)] for x in r) for k in range(1, 5)]
    speed = [statistics.median(tau[k - 1] * d / (dr[str(k)] + v[str(k)]) for d, dr, v in r) for k in range(1, 5)]
    print(f"{n:>10} {how:>11}  {[round(x, 3) for x in draft]}   {[round(x, 3) for x in speed]}")
