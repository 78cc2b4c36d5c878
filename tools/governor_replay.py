"""Replay DSpark's depth rule on recorded rounds: how much of the oracle's room does it take?

Decodes prompts with every round verifying the full block (as ``specrt calibrate`` does),
keeping each round's draft confidences and accepted count, then prices, on those same
anchors and the build's cost table (tools/bench_governors.py ``bounds``: a round of depth
d costs draft(d) + verify(d) and yields min(a, d) + 1 tokens; depth 0 costs draft(1) +
decode for one token):

* every fixed depth, the post-draft oracle (verifies exactly what will be accepted);
* DSpark's post-draft rule (runtime.governor.DSparkGovernor.choose, the engines' stored
  calibration, profiled costs, no online learning) on each round's confidences;
* the same rule with the raw confidences (identity map) and with the confidences'
  ranking information removed (every round given the mean calibrated survival):
  separates what calibration and what per-round resolution contribute.

* the whole governor as ``specrt run`` drives it, simulated on the same rounds: its
  pre-draft call sizes the block (or decodes without drafting), the post-draft call picks
  the depth from the block's confidences (the first k of the recorded 8: a draft's
  position i does not depend on later positions), ``observe`` gets each round's outcome
  at the table's costs (so the calibration learns online as it does live; load factors
  stay 1), and the round is priced at draft(block) + verify(depth), or decode alone when
  it did not draft. Unlike the rule's replay, which charges draft(d) for the chosen d,
  this charges the block actually drafted.

No timing of the live loop: this is the decisions' quality alone, apart from the
runtime's own costs (bench_governors measures those).

    python tools/governor_replay.py ENGINES --prompts FILE [--chat] [--max-new-tokens 128] [-o OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_governors import bounds, oracle_choices, price, rows_cost, table_costs  # noqa: E402


def simulate(gov, rounds, costs: dict, depths, pay: dict | None = None, ranks=None) -> tuple[float, dict]:
    """Tokens per second of governor ``gov`` driven as the generator drives it over recorded
    full-depth rounds (confidences, accepted): it observes each round at the cost table
    ``costs``' prices, and the run is priced at ``pay``'s (another table, e.g. costs measured
    live; default ``costs``); and how often it took each (block, depth) ("0/0": decoded
    without drafting). A token tree (``gov.tree_width`` > 1) needs ``ranks``: per round the
    rank of the target's first token among the draft's first-position choices (0: the
    first draft; tools/exp_tree_width.py); a round with n runners-up costs d + n rows
    (``bench_governors.rows_cost``: past the deepest built depth the table's chains) and wins
    position 1 when a = 0 and 1 <= rank <= n (keys "block/depth/runners-up")."""
    from specrt.runtime.governor import GovernorState
    from specrt.runtime.telemetry import RoundResult

    dec, _, draft = table_costs(costs, depths)
    p_dec, _, p_draft = table_costs(pay, depths) if pay is not None else (dec, None, draft)
    ver = rows_cost(costs, depths)
    p_ver = rows_cost(pay, depths) if pay is not None else ver
    tokens = seconds = 0.0
    taken: dict[str, int] = {}
    tree = gov.tree_width > 1
    for i, (conf, a) in enumerate(rounds):
        k = gov.choose(GovernorState())
        if k == 0:
            tokens, seconds = tokens + 1, seconds + p_dec
            gov.observe(RoundResult(0, 0, 0.0, dec))
            key = "0/0/0" if tree else "0/0"
            taken[key] = taken.get(key, 0) + 1
            continue
        block = np.asarray(conf[:k])
        d = gov.choose(GovernorState(confidences=block))
        n = gov.round_siblings() if d and tree else 0
        sib = int(ranks[i]) - 1 if n and a == 0 and 1 <= ranks[i] <= n else -1
        got = 1 if sib >= 0 else min(int(a), d)
        tokens, seconds = tokens + got + 1, seconds + p_draft(k) + (p_ver(d + n) if d else p_dec)
        gov.observe(RoundResult(d, got, draft(k), ver(d + n) if d else dec, None, block, siblings=n, sibling=sib))
        key = f"{k}/{d}/{n}" if tree else f"{k}/{d}"
        taken[key] = taken.get(key, 0) + 1
    return tokens / seconds, taken


def record_rounds(s, prompts: list[dict], chat: bool, max_new_tokens: int) -> list[tuple]:
    """Decode ``prompts`` (dicts with 'prompt' text or 'prompt_ids') on the open Session ``s``
    with every round verifying the full block; returns the full-depth rounds as
    (confidences, accepted, prompt index)."""
    from specrt.runtime.calibrate import RecordingGovernor

    depths = s.engines.depths
    rec = RecordingGovernor(depths, depths[-1])
    pid: list[int] = []
    for i, p in enumerate(prompts):
        s.generator.governor = rec
        before = len(rec.rounds)
        ids = list(p["prompt_ids"]) if "prompt_ids" in p else s.text.encode(p["prompt"], chat)
        for _ in s.stream_ids(ids, max_new_tokens):
            pass
        pid += [i] * (len(rec.rounds) - before)
        print(f"prompt {i + 1}/{len(prompts)}: {len(rec.rounds)} rounds so far", file=sys.stderr, flush=True)
    return [(c, a, pid[j]) for j, (c, d, a) in enumerate(rec.rounds) if d == depths[-1]]


def recording_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of a tool that records full-depth rounds: ENGINES --prompts [--chat]
    [--max-new-tokens] [-o OUT.json]."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--prompts", type=Path, required=True, help="JSON lines with a 'prompt' (text) or 'prompt_ids' field")
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-o", "--out", type=Path, default=None)
    return ap


def full_depth_recorder(depths, on_round):
    """prompt index -> a governor verifying the full block every round that calls
    ``on_round(prompt_index, result)`` on each full-depth round with confidences."""
    from specrt.runtime.governor import FixedGovernor

    class Recorder(FixedGovernor):
        def __init__(self, i: int):
            super().__init__(depths, depths[-1])
            self.i = i

        def observe(self, r):
            if r.depth == depths[-1] and r.confidences is not None:
                on_round(self.i, r)

    return Recorder


def decode_rounds(session, prompts: list[dict], chat: bool, max_new_tokens: int, recorder, rows: dict) -> dict:
    """Decode each prompt with ``recorder(i)`` as the governor (it appends to ``rows``) ->
    {"rows": {key: array}, "costs": the build's cost table, "depths"}."""
    for i, p in enumerate(prompts):
        session.generator.governor = recorder(i)
        ids = list(p["prompt_ids"]) if "prompt_ids" in p else session.text.encode(p["prompt"], chat)
        for _ in session.stream_ids(ids, max_new_tokens):
            pass
        print(f"prompt {i + 1}/{len(prompts)}: {len(rows['accepted'])} rounds", file=sys.stderr, flush=True)
    return {"rows": {k: np.asarray(v) for k, v in rows.items()}, "costs": session.engines.manifest["costs"],
            "depths": list(session.engines.depths)}


def recorded_experiment(doc: str, argv: list[str] | None, record, analyse, keys: tuple[str, ...],
                        optional: tuple[str, ...] = ()) -> int:
    """main() of an experiment on recorded full-depth rounds: ``record(engines, prompts, chat,
    max_new_tokens)`` -> {"rows": {key: array}, "costs", "depths"}, saved to / read from
    ``--rows`` (.npz), then ``analyse(*rows[keys], costs, depths, **rows[optional keys
    present])`` -> the JSON report."""
    ap = recording_parser(doc)
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--rows", type=Path, help="an .npz of the recorded rounds: written after recording, "
                                              "or read instead of recording when it exists")
    a = ap.parse_args(argv)
    try:
        prompts = [json.loads(x) for x in a.prompts.read_text().splitlines() if x.strip()][: a.limit]
    except (OSError, ValueError) as e:
        print(f"error: {a.prompts}: expected JSON lines with a 'prompt' field ({e})", file=sys.stderr)
        return 1
    if a.rows is not None and a.rows.is_file():  # analyse recorded rounds again
        saved = np.load(a.rows)
        rec = {"rows": {k: saved[k] for k in (*keys, *optional) if k in saved}, "costs": json.loads(str(saved["costs"])),
               "depths": saved["depths"].tolist()}
        print(f"rounds from {a.rows}", file=sys.stderr)
    else:
        rec = record(a.engines, prompts, a.chat, a.max_new_tokens)
        if a.rows is not None:
            np.savez(a.rows, **rec["rows"], costs=json.dumps(rec["costs"]), depths=np.asarray(rec["depths"]))
    report = {"engines": str(a.engines), "prompts": len(prompts),
              **analyse(*(rec["rows"][k] for k in keys), rec["costs"], rec["depths"],
                        **{k: rec["rows"][k] for k in optional if k in rec["rows"]})}
    print(json.dumps(report, indent=2))
    if a.out:
        a.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = recording_parser(__doc__).parse_args(argv)

    from specrt.runtime.governor import Calibration, GovernorState
    from specrt.runtime.session import Session, load_calibration, make_governor

    prompts = [json.loads(x) for x in args.prompts.read_text().splitlines() if x.strip()]
    with Session(args.engines, governor="off") as s:
        depths = s.engines.depths
        rounds = [(c, a) for c, a, _ in record_rounds(s, prompts, args.chat, args.max_new_tokens)]
        if not rounds:  # (bounds() then had no fixed rates to pick the best of: a KeyError)
            raise SystemExit(f"{args.prompts}: no round verified the full draft block (prompts too short, or "
                             "--max-new-tokens too small); nothing to replay")
        cal, note = load_calibration(s.engines)
        costs = s.engines.manifest["costs"]

        def replay(calibration) -> list[int]:
            gov = make_governor("dspark", s.engines, calibration)
            return [gov.choose(GovernorState(confidences=c)) for c, _ in rounds]

        accepted = [a for _, a in rounds]
        b = bounds(accepted, costs, depths)
        best = b["fixed_tokens_per_s"][b["best_fixed"].split(":")[1]]
        calibrated = replay(cal)
        identity = replay(None)  # no calibration: DSpark's identity map
        # no resolution: every round gets the same confidences (their mean per position)
        mean_conf = np.mean([c for c, _ in rounds], axis=0)
        gov = make_governor("dspark", s.engines, cal)
        flat = [gov.choose(GovernorState(confidences=mean_conf))] * len(rounds)
        # the whole governor, learning online from a copy of the stored calibration
        live = make_governor("dspark", s.engines, Calibration.from_dict(cal.to_dict()) if cal else None)
        simulated, taken = simulate(live, rounds, costs, depths)
    oracle = oracle_choices(accepted, costs, depths)
    table = {name: price(ch, accepted, costs, depths) / best
             for name, ch in (("post_draft_oracle", oracle), ("dspark_rule_calibrated", calibrated),
                              ("dspark_rule_raw_confidence", identity), ("dspark_rule_mean_confidence", flat))}
    table["dspark_simulated"] = simulated / best
    hist = {name: {str(d): int(n) for d, n in zip(*np.unique(ch, return_counts=True))}
            for name, ch in (("calibrated", calibrated), ("raw", identity), ("oracle", oracle))}
    report = {"engines": str(args.engines), "prompts": len(prompts), "rounds": len(rounds), "calibration": note,
              "best_fixed": b["best_fixed"], "vs_best_fixed": table, "choices": hist,
              "simulated_block_depth": dict(sorted(taken.items(), key=lambda x: -x[1])),
              "fixed_vs_best": {d: v / best for d, v in b["fixed_tokens_per_s"].items()}}
    for name, v in table.items():
        print(f"{name:30s} {v:.3f}x the best fixed depth ({b['best_fixed']})")
    print("choices:", json.dumps(hist))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
