"""Governor benchmark on SmolLM2-135M + a P-EAGLE draft, CPU: DSpark vs fixed depths vs adaptive.

    .venv/bin/python tools/bench_governors.py [--draft DIR | --random-draft | --engines ENG]
        [--depths 1,2,3,4,6,8] [--per-kind 4] [--max-new-tokens 64] [--repeats 1]
        [--calibrate-per-kind 0] [--no-chat] [--work DIR] [--out DIR]

Engines: ``--engines`` as given, else the draft (default fixtures/peagle-smollm2; or
``--random-draft``: a random P-EAGLE draft of the target's width, acceptance ~ 0) is
exported with the SmolLM2 target (tools/smollm2.py) and built for ``--depths`` under
``--work`` (reused when present). ``--calibrate-per-kind M`` first runs
``runtime.calibrate.calibrate`` on M further prompts per kind (disjoint from the
benchmark prompts) and stores ENG/calibration.json; otherwise DSpark uses whatever
calibration is stored there (or the identity map) and refines it online.

The run: ``--per-kind`` prompts of each kind from tools/data/heldout_prompts.jsonl
(chat, code, lists, stories, arithmetic), interleaved by kind, greedy, chat template,
``--max-new-tokens`` each. One engine set (one Session); one governor object per spec
(off, fixed:d for every built depth, adaptive, dspark) that lives for the whole run, as
in a long-running ``specrt run --prompts``. For each prompt every governor runs in turn
(order rotated from prompt to prompt of a kind and from repeat to repeat, ``run_orders``, so
machine noise spreads over all of them on every kind),
``--repeats`` times. Time per run is decode time: wall seconds minus prefill, for the
tokens after the first (the first comes from prefill, the same for every governor);
per prompt the median over repeats. tokens/s of a set = sum tokens / sum seconds.

Checks: greedy outputs identical across governors and repeats (lossless; exit 1 if
not); issue 7's targets: dspark >= 1.05x the best fixed depth on the mixed set, >= 0.98x
on every kind, above adaptive everywhere, and its decisions (``choose`` and ``observe``,
timed in the run: ``Timed``) <= 1% of its decode time. Bounds: what a governor that knew each
round's acceptance after drafting (the most DSpark can learn from confidences), or
before, would reach over the best fixed depth, estimated from the deepest fixed depth's
rounds and the cost table (``bounds``). Writes OUT/bench_governors.json and
OUT/bench_governors.png (per-position acceptance at the full depth, per kind; histogram
of the depths DSpark chose, per kind).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KINDS = ("chat", "code", "lists", "stories", "arithmetic")
PROMPTS = ROOT / "tools" / "data" / "heldout_prompts.jsonl"
DEFAULT_DRAFT = ROOT / "fixtures" / "peagle-smollm2"
DEFAULT_WORK = Path("/tmp/specrt-bench-governors")


def log(msg: str) -> None:
    print(f"[bench_governors] {msg}", file=sys.stderr, flush=True)


def ensure_engines(args) -> Path:
    """The engines folder: given, or exported + built from the SmolLM2 target and the draft."""
    if args.engines is not None:
        return args.engines
    from tests.real_model import smollm2_folder

    target = Path(smollm2_folder())
    if args.random_draft:
        from tests.fixtures_models import write_tiny_draft

        draft = args.work / "random-draft"
        if not (draft / "config.json").is_file():
            write_tiny_draft(draft, target, kind="peagle", num_layers=1, draft_vocab=8192, mask_token_id=0)
        tag = "random"
    else:
        draft = args.draft or DEFAULT_DRAFT
        if not (draft / "config.json").is_file():
            sys.exit(f"no draft at {draft}: pass --draft DIR, --engines ENG or --random-draft")
        tag = "draft"
    depths = ",".join(map(str, args.depths))
    exp, eng = args.work / f"{tag}-export", args.work / f"{tag}-engines-{depths.replace(',', '-')}"
    stamp = args.work / f"{tag}-source.json"
    source = {"target": str(target), "draft": str(draft.resolve()),
              "draft_mtime": max(p.stat().st_mtime for p in draft.iterdir())}
    if eng.is_dir() and stamp.is_file() and json.loads(stamp.read_text()) == source:
        log(f"reusing {eng}")
        return eng
    from specrt.engines import build_engines
    from specrt.export.export import export

    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    export(target, draft, exp, force=True, log=log)
    build_engines(exp, "onnxruntime", args.depths, eng, force=True, log=log)
    stamp.write_text(json.dumps(source))
    log(f"export + build: {time.perf_counter() - t0:.0f} s")
    return eng


def load_prompts(per_kind: int, offset: int = 0, path: Path = PROMPTS) -> list[dict]:
    """``per_kind`` prompts of each kind (from index ``offset`` within the kind), interleaved."""
    by_kind = defaultdict(list)
    for line in path.read_text().splitlines():
        if line.strip():
            o = json.loads(line)
            by_kind[o["kind"]].append(o["prompt"])
    out = []
    for i in range(offset, offset + per_kind):
        for k in KINDS:
            if i < len(by_kind[k]):
                out.append({"kind": k, "prompt": by_kind[k][i]})
    return out


def run_orders(specs: list[str], kinds: list[str], repeats: int) -> list[list[list[str]]]:
    """[prompt][repeat] -> the order its governors run in: ``specs`` rotated by
    (j * repeats + r + f) places for the j-th prompt of its kind (f: the kind's place among
    the run's kinds, so the kinds start apart). A kind's prompts x repeats runs thus put every
    governor at that many distinct places (all n of them once they number n or more) before
    repeating one. Rotating by the interleaved prompt index i, (i * repeats + r) mod n, gave
    every prompt of a kind the same orders whenever n was a multiple of the number of kinds
    (10 governors with --ngram or one extra governor, 5 kinds): each kind's tokens/s then came
    from one fixed order, what the rotation is there to spread."""
    first = {k: f for f, k in enumerate(dict.fromkeys(kinds))}
    seen: dict[str, int] = defaultdict(int)
    orders = []
    for k in kinds:
        j, n = seen[k], len(specs)
        seen[k] += 1
        shifts = [(j * repeats + r + first[k]) % n for r in range(repeats)]
        orders.append([specs[s:] + specs[:s] for s in shifts])
    return orders


def agg(runs: list[dict]) -> dict:
    """Sum of per-prompt medians: tokens, seconds, tokens/s; merged counters (acceptance,
    depths, token-tree and prompt-lookup rounds, engine / Python time)."""
    from specrt.runtime.telemetry import Telemetry

    tokens = sum(r["tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    tel = Telemetry()
    for r in runs:
        tel.merge(r["telemetry"])
    j = tel.to_json()
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "tau": j["tau"], "acceptance_by_position": j["acceptance_by_position"],
            "acceptance_conditional": j["acceptance_conditional"], "depth_histogram": j["depth_histogram"],
            "rounds": j["rounds"], "draft_rounds": j["draft_rounds"], "mean_seconds": j["mean_seconds"],
            "tree": j.get("tree"), "lookup": j.get("lookup"), "time_split": j.get("time_split"),
            "draft_block_histogram": j.get("draft_block_histogram"), "drafted_unverified": j.get("drafted_unverified")}


class Recording:
    """A governor that also keeps every round's accepted count (for ``bounds``); everything
    else is the wrapped governor's (it copied a few attributes, and the generator's
    getattr(gov, "corpus" / "grow" / "lookup_chain") then found none: the deepest fixed
    depth ran without corpus lookup under --corpus)."""

    def __init__(self, gov):
        self.gov, self.accepted = gov, []

    def __getattr__(self, name):  # tree_width, lookup, corpus, choose, round_siblings, ...
        return getattr(self.gov, name)

    def observe(self, r) -> None:
        if r.depth:
            self.accepted.append(int(r.accepted))
        self.gov.observe(r)


class Timed:
    """A governor whose decisions are timed: wall seconds inside ``choose`` (before and
    after drafting) and ``observe`` (its online learning), and how many calls of each.
    Issue 7 wants DSpark's decision to add <= 1% of a step's time: the summary divides
    these seconds by the same governor's decode seconds in the same run."""

    def __init__(self, gov):
        self.gov, self.seconds, self.choose_calls, self.observe_calls = gov, 0.0, 0, 0

    def choose(self, state):
        t = time.perf_counter()
        try:
            return self.gov.choose(state)
        finally:
            self.seconds += time.perf_counter() - t
            self.choose_calls += 1

    def observe(self, r) -> None:
        t = time.perf_counter()
        try:
            self.gov.observe(r)
        finally:
            self.seconds += time.perf_counter() - t
            self.observe_calls += 1

    def __getattr__(self, name):  # uses_confidences, tree_width, lookup, round_siblings, ...
        if name == "gov":  # not set yet (copy, pickle): no recursion through this method
            raise AttributeError(name)
        return getattr(self.gov, name)


def _draft_table(costs: dict, depths) -> dict[int, float]:
    """{block k: draft seconds} of a build's cost table (one entry, the deepest, when it
    profiled the draft at one block only)."""
    return {int(k): v for k, v in (costs.get("draft_by_depth") or {}).items()} or {depths[-1]: costs["draft"]}


def _chain_table(costs: dict) -> dict[int, float]:
    """{L: seconds} of a build's cost table's chains (the prefill engine verifying L rows;
    {} for a table profiled before 2026-12-02)."""
    return {int(L): float(v) for L, v in (costs.get("chain") or {}).items()}


def table_costs(costs: dict, depths):
    """(decode seconds, {depth: verify seconds}, draft(k) -> seconds of a k-block) from a
    build's cost table; a block without its own entry costs the next larger profiled one."""
    ver = {int(d): v for d, v in costs["verify"].items()}
    by = _draft_table(costs, depths)

    def draft(k: int) -> float:
        return by[min((j for j in by if j >= k), default=max(by))]

    return costs["decode"], ver, draft


def rows_cost(costs: dict, depths):
    """m -> seconds to verify m draft rows (a chain of d and n runners-up: m = d + n) as the
    runtime runs them: verify.m where built; past the deepest built depth the prefill engine's
    call, the table's chains interpolated (as DSparkGovernor.verify_cost and a fixed
    ``:tree=W`` round price it), or the deepest depth's verify for a table without chains
    (one profiled before 2026-12-02); between built depths, the next built depth at or above."""
    from specrt.engines.costs import interpolate
    from specrt.runtime.governor import depth_at_least

    _, ver, _ = table_costs(costs, depths)
    chain = {L: v for L, v in _chain_table(costs).items() if L > depths[-1]}

    def cost(m: int) -> float:
        if m in ver:
            return ver[m]
        if m > depths[-1]:
            return interpolate(chain, m) if chain else ver[depths[-1]]
        return ver[depth_at_least(depths, m)]

    return cost


def dspark_from_table(costs: dict, depths, calibration=None, **options):
    """runtime.governor.DSparkGovernor on a build's cost table alone (no engines loaded), as
    session.make_governor builds it from the engines (learning on its own copy of
    ``calibration``), the table's chains included: a token tree's rows past the deepest built
    depth are priced as the prefill engine's call (``rows_cost``; until session 59 the replays
    stopped them at the deepest depth, as the runtime's DSpark did before session 58);
    ``options`` go to the governor."""
    from specrt.runtime.governor import DSparkGovernor

    dec, ver, _ = table_costs(costs, depths)
    cal = calibration.copy() if calibration is not None else None
    return DSparkGovernor(depths, _draft_table(costs, depths), {**ver, 0: dec}, cal,
                          t_chain=_chain_table(costs) or None, **options)


def price(choices: list[int], accepted: list[int], costs: dict, depths, *, drafted_zero: bool = True) -> float:
    """Tokens per second, by the build's cost table (decode, verify.d, draft block k), of
    verifying ``choices[r]`` drafts on a round whose target takes ``accepted[r]``: min(a, d)
    + 1 tokens for draft(d) + verify(d); d = 0 is a plain decode for one token, after a
    draft(1) already paid (``drafted_zero``) or without one."""
    dec, ver, draft = table_costs(costs, depths)
    tokens = sum(min(a, d) + 1 for d, a in zip(choices, accepted))
    return tokens / sum(draft(d) + ver[d] if d else (draft(1) if drafted_zero else 0.0) + dec for d in choices)


def rate_optimal(tokens, cost):
    """Per round r the option o maximising the whole run's rate sum_r tokens[r, o_r] /
    sum_r cost[o_r] (tokens [rounds, options], cost [options]): Dinkelbach's iteration,
    each round maximising tokens - rate * cost at the current rate, until the rate stops
    rising (finitely many choices, so it ends at the optimum)."""
    import numpy as np

    tokens, cost = np.asarray(tokens, np.float64), np.asarray(cost, np.float64)
    rows, rate = np.arange(len(tokens)), 0.0
    while True:
        pick = np.argmax(tokens - rate * cost[None], axis=1)
        new = tokens[rows, pick].sum() / cost[pick].sum()
        if new <= rate * (1 + 1e-12):
            return pick
        rate = new


def oracle_choices(accepted: list[int], costs: dict, depths, *, drafted_zero: bool = True) -> list[int]:
    """What a governor that knew each round's outcome verifies, priced as ``price`` does: the
    per-round depths (0: decode) that maximise the run's tokens per second. Usually the
    smallest built depth >= a_r and 0 for a_r = 0, but not on every table: where a
    verify costs less than a decode, or a deeper profile less than a shallower one, the
    cheaper one gets the same tokens."""
    import numpy as np

    dec, ver, draft = table_costs(costs, depths)
    options = [0, *depths]
    cost = [(draft(1) if drafted_zero else 0.0) + dec] + [draft(d) + ver[d] for d in depths]
    tokens = np.minimum(np.asarray(accepted)[:, None], np.asarray(options)[None]) + 1
    return [options[i] for i in rate_optimal(tokens, cost)]


def bounds(accepted: list[int], costs: dict, depths) -> dict:
    """What depth choice could gain with this draft, on the anchors of a full-depth run
    (every round verifying the deepest block; a_r drafts accepted) and the build's cost
    table (``price``): tokens per second of

    * fixed:d  -- min(a_r, d) + 1 tokens for draft(d) + verify(d) a round;
    * a post-draft oracle -- a governor that learns after drafting how many drafts the
      target will take, as DSpark tries to from the drafts' confidences, and picks each
      round's depth for the best rate (``oracle_choices``; on the usual table a_r > 0
      verifies the smallest built depth >= a_r for a_r + 1 tokens, a_r = 0 decodes:
      draft(1) + decode for 1 token);
    * a pre-draft oracle -- knows before drafting, so a decode costs a decode alone.

    An estimate: other policies would visit other anchors. Both oracles are upper bounds
    for their kind of governor; divided by the best fixed depth, they bound what any
    governor could gain over it."""
    if not accepted:
        return {}
    fixed = {d: price([d] * len(accepted), accepted, costs, depths) for d in depths}
    post = price(oracle_choices(accepted, costs, depths), accepted, costs, depths)
    pre = price(oracle_choices(accepted, costs, depths, drafted_zero=False), accepted, costs, depths, drafted_zero=False)
    best = max(fixed, key=fixed.get)
    return {"rounds": len(accepted), "fixed_tokens_per_s": {str(d): v for d, v in fixed.items()},
            "off_tokens_per_s": 1.0 / costs["decode"], "best_fixed": f"fixed:{best}",
            "post_draft_oracle_vs_best_fixed": post / fixed[best], "pre_draft_oracle_vs_best_fixed": pre / fixed[best]}


def judge(results: dict, fixed: list[str], adaptive: str, dspark: str) -> tuple[dict, dict]:
    """(summary, verdicts) of issue 7's targets from ``results`` ({set: {spec: agg(...)}}, the
    kinds and "mixed"): per set the best fixed depth (and the best of them and off) by that
    set's own tokens/s, dspark's ratios to them, to adaptive and to off; the verdicts
    dspark >= 1.05x the best fixed depth on the mixed set, >= 0.98x the kind's best fixed
    depth on every kind (at least as strict as the mixed set's best depth there), and
    strictly above adaptive on every set."""
    summary, ok = {}, {}
    for g, res in results.items():
        best_fixed = max(fixed, key=lambda f: res[f]["tokens_per_s"])
        best_static = max([*fixed, "off"], key=lambda f: res[f]["tokens_per_s"])
        ds = res[dspark]["tokens_per_s"]
        summary[g] = {"best_fixed": best_fixed, "best_static": best_static,
                      "dspark_vs_best_fixed": ds / res[best_fixed]["tokens_per_s"],
                      "dspark_vs_best_static": ds / res[best_static]["tokens_per_s"],
                      "dspark_vs_adaptive": ds / res[adaptive]["tokens_per_s"],
                      "dspark_vs_off": ds / res["off"]["tokens_per_s"]}
        need = 1.05 if g == "mixed" else 0.98
        ok[f"{g}: dspark >= {need}x best fixed"] = summary[g]["dspark_vs_best_fixed"] >= need
        ok[f"{g}: dspark > adaptive"] = summary[g]["dspark_vs_adaptive"] > 1.0
    return summary, ok


def plot(results: dict, specs: list[str], depths, path: Path, tree: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    groups = [*KINDS, "mixed"]
    groups = [g for g in groups if g in results]
    full, dspark = f"fixed:{depths[-1]}{tree}", f"dspark{tree}"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for g in groups:
        acc = results[g][full]["acceptance_by_position"]
        a1.plot(range(1, len(acc) + 1), acc, marker="o", label=g, lw=2.5 if g == "mixed" else 1.2,
                color="black" if g == "mixed" else None)
    a1.set_xlabel("draft position k")
    a1.set_ylabel("acceptance at position k (first k all accepted)")
    a1.set_title(f"per-position acceptance, {full} (full block verified)")
    a1.set_ylim(0, 1)
    a1.grid(alpha=0.3)
    a1.legend()
    ds = [0, *depths]
    w = 0.8 / len(groups)
    for i, g in enumerate(groups):
        h = results[g][dspark]["depth_histogram"]
        n = sum(h.values()) or 1
        a2.bar(np.arange(len(ds)) + (i - (len(groups) - 1) / 2) * w, [h.get(str(d), 0) / n for d in ds], w, label=g)
    a2.set_xticks(range(len(ds)), [str(d) for d in ds])
    a2.set_xlabel(f"verified depth chosen by {dspark} (0 = plain decode step)")
    a2.set_ylabel("fraction of rounds")
    a2.set_title("DSpark's depth choices")
    a2.legend()
    a2.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def extra_governors(value: str) -> list[str]:
    """--extra-governors' specs: an empty item or one given twice refused by its place, as specrt
    bench's --governors (`a,,b` ran a and b without a word: h74e)."""
    from specrt.cmd_bench import _check_items

    _check_items("--extra-governors", value, "each runs once beside the standard set")
    return [g.strip() for g in value.split(",") if g.strip()]


def depths_arg(value: str) -> tuple[int, ...]:
    """--depths as `specrt build --depths` (and bench_engines') take it: ranges, an empty item or a
    depth named twice refused (`1,,2` was argparse's "invalid <lambda> value", `2,2` taken: r74)."""
    from specrt.engines.plan import parse_depths

    return parse_depths(value)


def standard_set(depths, args) -> tuple[str, list[str]]:
    """The governors every run compares on ``depths``: off, fixed:d for each depth, adaptive and
    dspark, each speculative one with the suffix --tree, --ngram and --corpus give it (and
    off:ngram beside off with either lookup): (that suffix, the specs)."""
    # with --tree W every speculative governor verifies a token tree (``:tree=W``)
    # and with --ngram prompt lookup (``:ngram``): the suffix names every speculative one
    corpus = ":corpus" if args.corpus else ""
    tree = (f":tree={args.tree}" if args.tree > 1 else "") + (":ngram" if args.ngram else "") + corpus
    return tree, ["off", *([f"off:ngram{corpus}"] if args.ngram or corpus else []),
                  *(f"fixed:{d}{tree}" for d in depths), f"adaptive{tree}", f"dspark{tree}"]


def refuse_standard(args) -> None:
    """UserError for an --extra-governors spec of the standard set (it ran twice in every order:
    m74d), before any engines load or --calibrate-per-kind calibrates (it was said after both:
    r74): the set's depths are the engines folder's manifest's, or --depths where the engines
    are built here. An --engines that is no engines folder is said by its load, as before."""
    from specrt.engines.manifest import read_engines_manifest
    from specrt.errors import UserError

    depths = args.depths
    if args.engines is not None and args.extra_governors:
        try:
            depths = read_engines_manifest(args.engines)["depths"]
        except UserError:
            return
    specs = standard_set(depths, args)[1]
    for g in args.extra_governors:
        if g.lower() in specs:
            raise UserError(f"--extra-governors: {g} is in the standard set already ({', '.join(specs)})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--draft", type=Path, help=f"P-EAGLE draft folder (default {DEFAULT_DRAFT})")
    src.add_argument("--random-draft", action="store_true", help="a random P-EAGLE draft (acceptance ~ 0)")
    src.add_argument("--engines", type=Path, help="an engines folder already built")
    ap.add_argument("--depths", default="1,2,3,4,6,8", type=depths_arg)
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help="export / engines cache")
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--tree", type=int, default=1,
                    help="W > 1: every speculative governor verifies a token tree of width W (fixed:d:tree=W, "
                         "adaptive:tree=W, dspark:tree=W; DSpark sizes it per round), compared as the chains are")
    ap.add_argument("--ngram", action="store_true",
                    help="every speculative governor with prompt lookup (:ngram), off:ngram beside off")
    ap.add_argument("--corpus", action="store_true",
                    help="every speculative governor (and off:ngram) with corpus lookup too (:corpus; the engines need "
                         "a corpus.npz from `specrt corpus`)")
    ap.add_argument("--extra-governors", default=[], type=extra_governors,
                    help="more governor specs to run beside the standard set (e.g. dspark:block=4)")
    ap.add_argument("--prompts", type=Path, default=PROMPTS,
                    help="JSON lines with 'prompt' and 'kind' (default: the held-out prompts)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--calibrate-per-kind", type=int, default=0,
                    help="first fit ENG/calibration.json on this many other prompts per kind")
    ap.add_argument("--no-chat", action="store_true", help="raw prompts instead of the chat template")
    ap.add_argument("--out", type=Path, default=None, help="where the JSON and PNG go (default: --work)")
    args = ap.parse_args()
    if not args.prompts.is_file():
        ap.error(f"--prompts {args.prompts}: no such file")
    refuse_standard(args)
    from specrt.hugepages import reexec_with_thp, script_code

    reexec_with_thp(sys.argv[1:], script_code(__file__))  # huge pages for the weights, as the specrt command
    chat = not args.no_chat
    args.out = args.out or args.work

    from specrt.runtime.session import Session, make_governor

    eng = ensure_engines(args)
    report: dict = {"engines": str(eng), "chat": chat, "max_new_tokens": args.max_new_tokens,
                    "per_kind": args.per_kind, "repeats": args.repeats}
    if args.calibrate_per_kind > 0:
        from specrt.runtime.calibrate import calibrate, format_report

        cal_prompts = load_prompts(args.calibrate_per_kind, offset=args.per_kind, path=args.prompts)
        log(f"calibrating on {len(cal_prompts)} prompts ({args.calibrate_per_kind} per kind, disjoint from the run)")
        rep = calibrate(eng, [p["prompt"] for p in cal_prompts], chat=chat, max_new_tokens=args.max_new_tokens,
                        holdout=0.25 if len(cal_prompts) >= 2 else 0.0, log=log)
        print(format_report(rep))
        report["calibration"] = rep

    prompts = load_prompts(args.per_kind, path=args.prompts)
    with Session(eng, governor="off") as s:
        depths = s.engines.depths
        tree, specs = standard_set(depths, args)  # (an extra governor of it refused before the load)
        fixed = [f"fixed:{d}{tree}" for d in depths]
        dspark, adaptive, full = f"dspark{tree}", f"adaptive{tree}", fixed[-1]
        specs += args.extra_governors
        report.update(depths=list(depths), governors=specs, calibration_note=s.calibration_note,
                      costs=s.engines.manifest.get("costs"))
        log(f"dspark: {s.calibration_note}")
        govs = {spec: make_governor(spec, s.engines, s.calibration) for spec in specs}
        govs[full] = Recording(govs[full])
        govs[dspark] = Timed(govs[dspark])
        kinds_of_rounds: list[str] = []  # the prompt kind of each recorded full-depth round
        ids = [s.text.encode(p["prompt"], chat) for p in prompts]

        def once(spec: str, p: list[int], kind: str = "") -> dict:
            s.generator.governor = govs[spec]
            before = len(govs[full].accepted)
            out = [t for chunk in s.stream_ids(p, args.max_new_tokens) for t in chunk]
            tel = s.generator.telemetry
            kinds_of_rounds.extend([kind] * (len(govs[full].accepted) - before))
            return {"out": out, "seconds": tel.seconds - tel.engine_s.get("prefill", 0.0),
                    "tokens": len(out) - 1, "telemetry": tel}

        for spec in (full, "off"):  # warm-up: first ORT runs allocate
            s.generator.governor = make_governor(spec, s.engines, s.calibration)
            for _ in s.stream_ids(ids[0][:16], 8):
                pass

        runs: dict[str, list[dict]] = {spec: [] for spec in specs}
        mismatches = []
        t0 = time.perf_counter()
        orders = run_orders(specs, [m["kind"] for m in prompts], args.repeats)
        for i, (p, meta) in enumerate(zip(ids, prompts)):
            reps: dict[str, list[dict]] = defaultdict(list)
            for order in orders[i]:
                for spec in order:
                    reps[spec].append(once(spec, p, meta["kind"]))
            mismatches += differences(reps, i, meta["kind"])
            for spec in specs:
                secs = statistics.median(x["seconds"] for x in reps[spec])
                runs[spec].append({"kind": meta["kind"], "prompt": i, "tokens": reps[spec][0]["tokens"],
                                   "seconds": secs, "telemetry": reps[spec][0]["telemetry"],
                                   "all_seconds": [x["seconds"] for x in reps[spec]],
                                   "places": [order.index(spec) for order in orders[i]]})
            line = "  ".join(f"{spec}={runs[spec][-1]['tokens'] / max(runs[spec][-1]['seconds'], 1e-9):.1f}"
                             for spec in specs)
            log(f"prompt {i + 1}/{len(ids)} ({meta['kind']}, {len(p)} tokens): tok/s {line}")
        report["run_seconds"] = time.perf_counter() - t0

    groups = [k for k in KINDS if any(m["kind"] == k for m in prompts)] + ["mixed"]
    results = {g: {spec: agg([r for r in runs[spec] if g == "mixed" or r["kind"] == g]) for spec in specs}
               for g in groups}
    summary, verdicts = judge(results, fixed, adaptive, dspark)
    ok = {"lossless": not mismatches, **verdicts}
    timed = govs[dspark]
    spent = sum(sum(r["all_seconds"]) for r in runs[dspark])  # every repeat's decode seconds
    share = timed.seconds / spent if spent > 0 else 0.0
    report["dspark_decision"] = {"seconds": timed.seconds, "choose_calls": timed.choose_calls,
                                 "observe_calls": timed.observe_calls, "decode_seconds": spent,
                                 "share_of_decode": share}
    ok["dspark decision <= 1% of its decode time"] = share <= 0.01
    costs = report["costs"] or {}
    acc = govs[full].accepted
    # (chains only: tools/exp_tree_width.py bounds trees)
    report["bounds"] = {g: bounds([a for a, k in zip(acc, kinds_of_rounds) if g == "mixed" or k == g], costs, depths)
                        for g in groups} if costs.get("verify") and not tree else {}
    report.update(results=results, summary=summary, targets=ok, mismatches=mismatches,
                  per_prompt={spec: [{k: v for k, v in r.items() if k != "telemetry"} for r in runs[spec]]
                              for spec in specs})

    # ---- table (printed, and kept as summary.txt beside the JSON) ------------------------
    lines: list[str] = []

    def out(line: str) -> None:
        print(line)
        lines.append(line.lstrip("\n"))

    w = max(len("dspark_vs_best_static"), *map(len, specs)) + 1
    c = 11 + len(tree)  # column width: "fixed:6:tree=3" fits
    out(f"\ndecode tokens/s (greedy, {args.max_new_tokens} new tokens, {args.per_kind} prompts per kind, "
        f"median of {args.repeats}); engines {eng}")
    out(f"{'governor':{w}s}" + "".join(f"{g:>{c}s}" for g in groups))
    for spec in specs:
        out(f"{spec:{w}s}" + "".join(f"{results[g][spec]['tokens_per_s']:{c}.2f}" for g in groups))
    out(f"{'tau(full)':{w}s}" + "".join(f"{results[g][full]['tau']:{c}.2f}" for g in groups))
    out(f"{'tau(dspark)':{w}s}" + "".join(f"{results[g][dspark]['tau']:{c}.2f}" for g in groups))
    for key in ("dspark_vs_best_fixed", "dspark_vs_best_static", "dspark_vs_adaptive", "dspark_vs_off"):
        out(f"{key:{w}s}" + "".join(f"{summary[g][key]:{c}.3f}" for g in groups))
    out(f"{'best fixed':{w}s}" + "".join(f"{summary[g]['best_fixed']:>{c}s}" for g in groups))
    out("dspark depth histogram: " + "; ".join(f"{g} {results[g][dspark]['depth_histogram']}" for g in groups))
    out("acceptance by position (full depth, mixed): "
        + " ".join(f"{a:.2f}" for a in results["mixed"][full]["acceptance_by_position"]))
    out("measured ms per round on the mixed set (verify by depth d; round = engines + Python; draft by block):")
    for spec in specs:
        m = results["mixed"][spec]["mean_seconds"]
        out(f"  {spec:{w - 2}s} " + "  ".join(f"{part} " + " ".join(f"{k}:{v * 1e3:.1f}" for k, v in m[key].items())
                                             for part, key in (("verify", "verify_by_depth"), ("round", "round_by_depth"),
                                                               ("draft", "draft_by_block")) if m[key]))
    dd = report["dspark_decision"]
    out(f"{dspark} decisions: {dd['choose_calls']} choose + {dd['observe_calls']} observe calls, "
        f"{dd['seconds'] * 1e6 / max(dd['observe_calls'], 1):.1f} us a round, {dd['share_of_decode']:.3%} of its "
        f"decode time ({dd['seconds']:.3f} of {dd['decode_seconds']:.1f} s)")
    out("rounds on the mixed set (drafted rounds, token trees: rounds / runners-up verified / won; "
        "prompt lookup: rounds / tokens a round; drafted positions never verified):")
    for spec in specs:
        r = results["mixed"][spec]
        t, lk = r.get("tree") or {}, r.get("lookup") or {}
        out(f"  {spec:{w - 2}s} {r['rounds']} rounds, drafted {r['draft_rounds']}; tree {t.get('rounds', 0)} / "
            f"{t.get('runners_up', 0)} / {t.get('sibling_accepts', 0)}; lookup {lk.get('rounds', 0)} / "
            f"{lk.get('tokens_per_round', 0.0):.2f}; unverified {r.get('drafted_unverified') or 0}")
    if report["bounds"]:
        b = report["bounds"]
        out(f"upper bounds from the {full} rounds and the cost table (``bounds``), vs the best fixed depth there:")
        for key in ("post_draft_oracle_vs_best_fixed", "pre_draft_oracle_vs_best_fixed"):
            out(f"  {key:{w - 2}s}" + "".join(f"{b[g].get(key, float('nan')):{c}.3f}" for g in groups))
    out(f"lossless: {'yes' if not mismatches else f'NO, {len(mismatches)} mismatching runs: {mismatches[:3]}'}")
    for name, passed in ok.items():
        out(f"  [{'PASS' if passed else 'FAIL'}] {name}")

    args.out.mkdir(parents=True, exist_ok=True)
    jpath, ppath, tpath = (args.out / f for f in ("bench_governors.json", "bench_governors.png", "summary.txt"))
    jpath.write_text(json.dumps(report, indent=1, default=float))
    tpath.write_text("\n".join(lines) + "\n")
    plot(results, specs, depths, ppath, tree)
    print(f"wrote {jpath}, {tpath} and {ppath}")
    return 0 if ok["lossless"] else 1


def differences(reps: dict[str, list[dict]], prompt: int, kind: str) -> list[dict]:
    """The runs of one prompt (governor -> its repeats' {"out": token ids}) whose greedy output
    is not ``off``'s first: governor, repeat and the first token that differs (a shorter
    output differs where it ends). Lossless decoding has none."""
    from specrt.prompt_files import common_prefix

    ref = reps["off"][0]["out"]
    return [{"prompt": prompt, "kind": kind, "governor": spec, "repeat": r,
             "first_difference": common_prefix(x["out"], ref)}
            for spec, runs in reps.items() for r, x in enumerate(runs) if x["out"] != ref]


if __name__ == "__main__":
    from bench_lib import run_tool

    run_tool(main)  # (a wrong --engines or governor spec: an error line, not a traceback)
