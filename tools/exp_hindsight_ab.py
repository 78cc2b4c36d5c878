"""A/B, interleaved: lookup rates learnt in hindsight (now) vs from verified rounds (before).

    .venv/bin/python tools/exp_hindsight_ab.py ENGINES --governor SPEC [--prompts FILE.jsonl]
        [--n N] [--passes 3] [--chat] [--max-new-tokens 128]

runtime/ngram.py's policy learns each lookup key's per-position acceptance. Before, only
the rounds that verified a key's tokens taught it, up to the length they verified; now
every proposal offered to a round (chosen or not) is tallied against the tokens the
stream then emitted (``NgramPolicy.hindsight``). This runs SPEC (a governor with
``:ngram``; with ``:grow`` a prompt asked again is proposed from its earlier answer) twice,
one governor object each for the whole run, B with ``hindsight`` off: every prompt of the
file (the first ``--n``) in turn, the two in alternating order, ``--passes`` times over the
whole list (a pass repeats the prompts: with ``:grow`` pass 2 and 3 ask them again).
Prints, per pass and variant, decode tokens/s (wall minus prefill), lookup rounds and
tokens a lookup round, and the ratio now / before; exits 1 if outputs differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from specrt.errors import UserError
    from specrt.prompt_files import read_prompt_file
    from specrt.runtime.session import Session, make_governor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--governor", required=True)
    ap.add_argument("--prompts", type=Path, required=True, help="JSON lines with a 'prompt' field")
    ap.add_argument("--n", type=int, default=0, help="the first N prompts (0: all)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    try:
        prompts = [p["prompt"] for p in read_prompt_file(a.prompts, allow_ids=False)]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    prompts = prompts[: a.n] if a.n else prompts
    names = ("now", "before")
    with Session(a.engines, a.governor) as s:
        govs = {}
        for name in names:
            govs[name] = g = make_governor(s.governor_spec, s.engines, s.calibration)
            s.generator.governor = g
            policy = s.generator.resolve_lookup()
            if policy is None:
                print(f"error: --governor {a.governor}: no prompt lookup (add :ngram)", file=sys.stderr)
                return 1
            policy.hindsight = name == "now"
        ids = [s.text.encode(p, a.chat) for p in prompts]
        ref: dict[int, list[int]] = {}
        print(f"{s.governor_spec}, {len(prompts)} prompts x {a.passes} passes, {a.max_new_tokens} new tokens")
        for pas in range(1, a.passes + 1):
            acc = {n: [0, 0.0, 0, 0.0] for n in names}  # tokens, decode s, lookup rounds, lookup tokens
            for i, x in enumerate(ids):
                for name in (names if (i + pas) % 2 else names[::-1]):
                    s.generator.governor = govs[name]
                    out = [t for chunk in s.stream_ids(x, a.max_new_tokens) for t in chunk]
                    if ref.setdefault(i, out) != out:
                        print(f"error: prompt {i + 1}, pass {pas}: '{name}' output differs", file=sys.stderr)
                        return 1
                    tel = s.generator.telemetry
                    rounds = sum(c[0] for c in tel.lookup_rounds.values())
                    c = acc[name]
                    c[0] += len(out) - 1  # the first token comes from prefill
                    c[1] += tel.seconds - tel.engine_s.get("prefill", 0.0)
                    c[2] += rounds
                    c[3] += tel.lookup_tokens_per_round * rounds
            rate = {n: acc[n][0] / acc[n][1] for n in names}
            for n in names:
                r = acc[n][2]
                print(f"pass {pas} {n:6s}: {rate[n]:6.1f} tok/s, lookup rounds {r}, "
                      f"{acc[n][3] / r if r else 0.0:.2f} tokens a lookup round", flush=True)
            print(f"pass {pas} now / before: {rate['now'] / rate['before']:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
