"""A/B, interleaved: DSpark's draft load factor without catch-up passes (now) vs with them (before).

    .venv/bin/python tools/exp_draft_load_ab.py ENGINES [--per-kind 4] [--repeats 2] [--ngram]

DSpark prices a draft pass at the cost table's figure times a load factor, an EWMA of
measured / profiled draft time. A pass also takes in the rows of steps the draft did not
run in (the prompt after prefill; lookup rounds and plain decode steps), and costs more
with each (``RoundResult.catch_up``); since 2026-12-01 those passes no longer move the
factor. This runs, on ``--per-kind`` held-out prompts of each kind (greedy, chat template,
128 new tokens), ``fixed:2:tree=3``, DSpark as it is and DSpark with catch-up passes
counted as before (the same class, its ``observe`` given every round with ``catch_up``
cleared), each with ``:ngram`` if asked: one governor object per configuration for the
whole run, configurations in rotated order prompt by prompt, ``--repeats`` times, decode
seconds (wall minus prefill) per prompt the median. Prints tokens/s per kind and mixed,
the ratios, and each DSpark's final draft load factor; exits 1 if outputs differ.

Measured 2026-12-01 13:37-13:51 on out/ng/engines (AVX2 host, results/governors_catchup/
ab_ngram.log, ab_tree.log): DSpark now / before 1.003x with ``--ngram`` (per kind
0.996-1.019x) and 0.996x without (0.987-1.014x); now 1.009x / 1.023x and before 1.006x /
1.027x ``fixed:2:tree=3(:ngram)``; final load factors 1.17 / 1.16 and 1.06 / 1.09. No
measurable speed change: the catch-up cost is paid whichever depth is chosen.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("chat", "code", "lists", "stories", "arithmetic")


def ab_parser(doc: str) -> argparse.ArgumentParser:
    """ENGINES [--per-kind 4] [--repeats 2] [--ngram] [--max-new-tokens 128]."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ngram", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    return ap


def pick_prompts(per_kind: int) -> list[dict]:
    """The first ``per_kind`` held-out prompts of each kind, the kinds taking turns (as
    tools/bench_governors.py's load_prompts orders them), so that a drift of the host's
    speed during the run falls on every kind alike. Runs before 2026-12-01 evening took
    them grouped by kind, in file order."""
    held = [json.loads(x) for x in (ROOT / "tools" / "data" / "heldout_prompts.jsonl").read_text().splitlines() if x]
    by_kind: dict[str, list[dict]] = {}
    for d in held:
        by_kind.setdefault(d["kind"], []).append(d)
    return [ps[i] for i in range(per_kind) for ps in by_kind.values() if i < len(ps)]


def interleaved(s, govs: dict, prompts: list[dict], repeats: int, max_new_tokens: int) -> dict | None:
    """Each governor of ``govs`` (spec -> object, kept for the whole run) on each prompt in
    rotated order, ``repeats`` times, on the open Session ``s``; decode seconds (wall minus
    prefill) per prompt the median. Returns {spec: {kind and "mixed": tokens/s}}, None
    (after printing which) when an output differs."""
    specs = list(govs)
    tok = {sp: collections.Counter() for sp in specs}
    sec = {sp: collections.Counter() for sp in specs}
    for i, p in enumerate(prompts):
        ids = s.text.encode(p["prompt"], True)
        order = specs[i % len(specs):] + specs[: i % len(specs)]
        runs = collections.defaultdict(list)
        ref = None
        for _ in range(repeats):
            for sp in order:
                s.generator.governor = govs[sp]
                out = [t for chunk in s.stream_ids(ids, max_new_tokens) for t in chunk]
                ref = out if ref is None else ref
                if out != ref:
                    print(f"error: prompt {i}: {sp} output differs", file=sys.stderr)
                    return None
                tel = s.generator.telemetry
                runs[sp].append(tel.seconds - tel.engine_s.get("prefill", 0.0))
        for sp in specs:
            t = float(np.median(runs[sp]))
            for k in (p["kind"], "mixed"):
                tok[sp][k] += len(ref) - 1  # the first token comes from prefill
                sec[sp][k] += t
        print(f"prompt {i + 1}/{len(prompts)} ({p['kind']}): "
              + "  ".join(f"{sp}={(len(ref) - 1) / np.median(runs[sp]):.1f}" for sp in specs), flush=True)
    kinds = [k for k in (*KINDS, "mixed") if tok[specs[0]][k]]
    rate = {sp: {k: tok[sp][k] / sec[sp][k] for k in kinds} for sp in specs}
    for sp in specs:
        print(f"{sp:30s} " + " ".join(f"{k} {v:.2f}" for k, v in rate[sp].items()))
    for sp in specs[1:]:
        print(f"{sp:30s} vs {specs[0]}: " + " ".join(f"{k} {rate[sp][k] / rate[specs[0]][k]:.3f}" for k in rate[sp]))
    return rate


def main(argv: list[str] | None = None) -> int:
    from specrt.runtime.governor import DSparkGovernor
    from specrt.runtime.session import Session, make_governor

    class Before(DSparkGovernor):
        def observe(self, r):
            super().observe(dataclasses.replace(r, catch_up=False))

    a = ab_parser(__doc__).parse_args(argv)
    prompts = pick_prompts(a.per_kind)
    sfx = ":ngram" if a.ngram else ""
    specs = [f"fixed:2:tree=3{sfx}", f"dspark:tree=3{sfx}", f"before:dspark:tree=3{sfx}"]
    with Session(a.engines, specs[0]) as s:
        govs = {}
        for sp in specs:
            g = make_governor(sp.removeprefix("before:"), s.engines, s.calibration)
            if sp.startswith("before:"):
                g.__class__ = Before
            govs[sp] = g
        rate = interleaved(s, govs, prompts, a.repeats, a.max_new_tokens)
    if rate is None:
        return 1
    print("now vs before: " + " ".join(f"{k} {rate[specs[1]][k] / rate[specs[2]][k]:.3f}" for k in rate[specs[1]]))
    print("final draft load factor: " + ", ".join(f"{sp} {govs[sp].load_draft:.3f}" for sp in specs[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
