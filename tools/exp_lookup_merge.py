"""Experiment: should prompt lookup be decided after the draft pass, using the draft's agreement?

    python tools/exp_lookup_merge.py ENGINES --prompts FILE [--chat] [--max-new-tokens 128]
                                     [--rows rows.npz] [-o OUT.json]

runtime/ngram.py decides before the draft pass, from the match length's learnt rates
alone, whether a round verifies the lookup's tokens instead of drafting. After a draft pass
there is more to go on: whether the draft's first token equals the lookup's first token.
This decodes the prompts with every round drafting and verifying the full block (greedy,
so the output is the target's whatever the governor), records per round the position, the
draft's tokens and confidences, and afterwards, knowing the target's tokens, what the
lookup would have proposed there and how many of its and the draft's tokens a greedy
verify accepts. It then prices policies on those anchors at the build's cost table
(a round costs draft(block) + verify(d) + PY, tokens min(accepted, d) + 1):

* ``route d``: the draft's chain at fixed depth d (no lookup);
* ``pre``: ngram.py's rule with fixed rates (the priors): lookup at its best length when
  that beats the route's rate, else the route;
* ``post``: always draft; the lookup at length L when the draft's first token agrees with
  the lookup's, else the route (L fixed, per match length, best of 1..max);
* ``pre+post``: ``pre``, and on rounds it passes to the route, ``post``'s switch;
* the oracle of lookup vs route per round.

Also prints the lookup's conditional acceptance by position when the draft agrees and
when it does not, and prices verifying both chains side by side in one call (draft chain
of Dd plus lookup chain of L, the rows of depth Dd + L; would need an attention-mask input
the graphs do not have). No timing of the live loop: decisions priced at the table.

Measured 2026-12-01 on the 60 calibration prompts (never benchmarked; 3733 rounds, 1293
with a match; out/ng/engines' table, AVX2 host; results/lookup_merge/calibration60.json):
the draft's agreement is informative (first lookup token accepted 0.96 / 0.88 / 0.91 for
4- / 3- / 2-gram matches when the draft's first token agrees, 0.69 / 0.40 / 0.36 when not),
but paying the draft pass to learn it does not: ngram.py's pre-draft rule prices at 65.5
tok/s (the draft chain alone at depth 2: 50.5; oracle 72.8), lookup at length 4 on every
match 62.7, taking 2-3-gram matches only after an agreeing draft 61.5, both branches in one
verify at most 62.3. A disagreeing weak match still pays about as well as the draft's
chain (1.7 tokens for verify.4 against 1.75 for draft + verify.2), so the draft pass that
would tell them apart costs more than it saves. Nothing of it went into the runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from governor_replay import recorded_experiment  # noqa: E402

from runtime.ngram import NgramIndex, NgramPolicy  # noqa: E402

PY = 1.0e-3  # seconds of Python per round (bench: ~1 ms)
KEYS = ("pos", "drafts", "conf", "prompt", "seq", "seqlen")


def record(engines: Path, prompts: list[dict], chat: bool, max_new_tokens: int) -> dict:
    from specrt.runtime.session import Session

    rows: dict[str, list] = {k: [] for k in ("pos", "drafts", "conf", "prompt")}
    seqs: list[list[int]] = []
    with Session(engines, "off") as s:
        depths = s.engines.depths
        from specrt.runtime.governor import FixedGovernor

        g = s.generator
        inner = g._draft_peagle
        current = {"i": 0}

        def spy(pending_tok, pending_aux, start, k, rng):
            out = inner(pending_tok, pending_aux, start, k, rng)
            rows["pos"].append(g.tkv.length)
            # a block capped near the token budget is padded (-1 never matches a token)
            rows["drafts"].append(np.pad(np.asarray(out[0], np.int64), (0, depths[-1] - len(out[0])),
                                         constant_values=-1))
            rows["conf"].append(np.pad(np.asarray(out[2], np.float32), (0, depths[-1] - len(out[2]))))
            rows["prompt"].append(current["i"])
            return out

        g._draft_peagle = spy
        for i, p in enumerate(prompts):
            current["i"] = i
            g.governor = FixedGovernor(depths, depths[-1])
            ids = list(p["prompt_ids"]) if "prompt_ids" in p else s.text.encode(p["prompt"], chat)
            x = list(ids)
            for chunk in s.stream_ids(ids, max_new_tokens):
                x += chunk
            seqs.append(x)
            print(f"prompt {i + 1}/{len(prompts)}: {len(rows['pos'])} rounds", file=sys.stderr, flush=True)
        costs = s.engines.manifest["costs"]
    width = max(map(len, seqs))
    seq = np.full((len(seqs), width), -1, np.int64)
    for i, x in enumerate(seqs):
        seq[i, : len(x)] = x
    return {"rows": {"pos": np.asarray(rows["pos"]), "drafts": np.stack(rows["drafts"]),
                     "conf": np.stack(rows["conf"]), "prompt": np.asarray(rows["prompt"]), "seq": seq,
                     "seqlen": np.asarray([len(x) for x in seqs])},
            "costs": costs, "depths": list(depths)}


def _accepted(proposal, truth) -> int:
    a = 0
    for p, t in zip(proposal, truth):
        if p != t:
            break
        a += 1
    return a


def analyse(pos, drafts, conf, prompt, seq, seqlen, costs, depths) -> dict:
    ver = {int(k): float(v) for k, v in costs["verify"].items()}
    draft_by = {int(k): float(v) for k, v in costs["draft_by_depth"].items()}
    K = drafts.shape[1]
    rounds = []  # (draft chain accepted, lookup tokens, match n, lookup accepted, tokens left, draft's first)
    for r in range(len(pos)):
        x = seq[prompt[r], : seqlen[prompt[r]]].tolist()
        n = int(pos[r])  # x[:n + 1] is the context; drafts propose x[n + 1:]
        truth = x[n + 1 : n + 1 + K]
        if not truth:
            continue
        idx = NgramIndex()
        idx.extend(x[: n + 1])
        found, m = idx.propose(K)
        found = found[: len(truth)]
        rounds.append((_accepted(drafts[r][: len(truth)], truth), found, m, _accepted(found, truth),
                       len(truth), int(drafts[r][0])))

    def rows_cost(rows: int) -> float:  # an unbuilt row count takes the next built depth
        return ver[min(k for k in ver if k >= rows)] if rows <= max(ver) else float("inf")

    def price(strategy, D: int) -> float:
        """strategy(found, n, draft's first) -> ("route",) | ("lookup", L, drafted) |
        ("both", Dd, L): tokens per second over the anchors at the table's costs."""
        tok = sec = 0.0
        for a_d, f, m, a_l, T, d0 in rounds:
            c = strategy(f, m, d0)
            if c[0] == "lookup":
                L = min(c[1], len(f), T)
                tok += min(a_l, L) + 1
                sec += rows_cost(L) + PY + (draft_by[D] if c[2] else 0.0)
            elif c[0] == "both":  # one verify of the draft chain and the lookup chain side by side
                dd, L = min(c[1], T), min(c[2], len(f), T)
                tok += max(min(a_d, dd), min(a_l, L)) + 1
                sec += draft_by[max(c[1], 1)] + rows_cost(dd + L) + PY
            else:
                dd = min(D, T)
                tok += min(a_d, dd) + 1
                sec += draft_by[D] + rows_cost(dd) + PY
        return tok / sec

    out: dict = {"rounds": len(rounds), "with_match": sum(1 for r in rounds if r[2]),
                 "agree": sum(1 for r in rounds if r[2] and r[1] and r[1][0] == r[5]), "python_s": PY}
    cond = {}  # the lookup's conditional acceptance by position, draft agreeing or not, per n
    for agree in (True, False):
        for m in (2, 3, 4):
            tries, wins = [0] * K, [0] * K
            for a_d, found, mm, a_l, T, d0 in rounds:
                if mm != m or not found or (found[0] == d0) != agree:
                    continue
                for k in range(min(len(found), T)):
                    tries[k] += 1
                    if k >= a_l:
                        break
                    wins[k] += 1
            cond[f"{'agree' if agree else 'disagree'} n={m}"] = {
                "rounds": tries[0], "rates": [round(w / t, 3) if t else None for w, t in zip(wins, tries)]}
    out["lookup_rates"] = cond
    route = {d: price(lambda f, m, d0: ("route",), d) for d in depths if d <= 4}
    out["route"] = {d: round(r, 2) for d, r in route.items()}
    D = max(route, key=route.get)
    R = route[D]
    out["best_route_depth"] = D

    # ngram.py's own rule at its priors (no online learning), the table's costs, this
    # Python time, against the best route's rate
    policy = NgramPolicy(sorted(ver), ver, None)
    policy.route_rate, policy.python = R, PY

    def pre(f, m, d0):
        L = policy.choose(len(f), m, len(f)) if m else 0
        return ("lookup", L, False) if L else ("route",)

    out["pre (ngram.py's rule)"] = round(price(pre, D), 2)
    table = {}
    for L in (2, 3, 4):
        table[f"L={L}: lookup on every match"] = price(lambda f, m, d0: ("lookup", L, False) if m else ("route",), D)
        table[f"L={L}: 4-gram direct, 2-3-gram after drafting if the draft agrees"] = price(
            lambda f, m, d0: ("lookup", L, False) if m == 4 else (("lookup", L, True) if m and f[0] == d0 else ("route",)), D)
        table[f"L={L}: after drafting if the draft agrees"] = price(
            lambda f, m, d0: ("lookup", L, True) if m and f[0] == d0 else ("route",), D)
    for Dd in (1, 2):
        for L in (2, 3, 4):
            table[f"both branches, draft {Dd} + lookup {L}"] = price(
                lambda f, m, d0: ("both", Dd, L) if m else ("route",), D)
            table[f"4-gram direct, else both branches, draft {Dd} + lookup {L}"] = price(
                lambda f, m, d0: ("lookup", 4, False) if m == 4 else (("both", Dd, L) if m else ("route",)), D)
    out["policies"] = {k: round(v, 2) for k, v in table.items()}
    tok = sec = 0.0  # oracle: per round the better of the route and each lookup length
    for a_d, f, m, a_l, T, d0 in rounds:
        options = [(min(a_d, D, T) + 1, draft_by[D] + rows_cost(min(D, T)) + PY)]
        options += [(min(a_l, L) + 1, ver[L] + PY) for L in ver if f and L <= min(len(f), T)]
        t, s = max(options, key=lambda o: o[0] / o[1])
        tok, sec = tok + t, sec + s
    out["oracle"] = round(tok / sec, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    return recorded_experiment(__doc__, argv, record, analyse, KEYS)


if __name__ == "__main__":
    sys.exit(main())
