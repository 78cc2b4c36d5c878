"""A/B, interleaved: DSpark with other constructor options against DSpark as it is, live.

    .venv/bin/python tools/exp_dspark_ab.py ENGINES --options ceiling_decay=0.02,full_every=16
        [--per-kind 4] [--repeats 2] [--ngram] [--tree 3]

Runs ``fixed:2:tree=W``, ``dspark:tree=W`` and the same DSpark built with ``--options``
(keyword arguments of runtime.governor.DSparkGovernor, numbers) on ``--per-kind``
held-out prompts of each kind, greedy, chat template, 128 new tokens, in rotated order
prompt by prompt, ``--repeats`` times (tools/exp_draft_load_ab.py ``interleaved``: one
governor object per configuration for the whole run, the median of the repeats). Prints
tokens/s per kind and mixed and the ratios; exits 1 if outputs differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from exp_draft_load_ab import ab_parser, interleaved, pick_prompts  # noqa: E402


def parse_options(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = float(value) if "." in value else int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    from specrt.errors import UserError
    from specrt.runtime.session import Session, make_governor

    ap = ab_parser(__doc__)
    ap.add_argument("--options", required=True, help="k=v,... DSparkGovernor keyword arguments of variant B")
    ap.add_argument("--tree", type=int, default=3)
    a = ap.parse_args(argv)
    try:
        options = parse_options(a.options)
    except ValueError:
        print(f"error: --options {a.options}: expected k=v,... with numbers as values", file=sys.stderr)
        return 1
    sfx = (f":tree={a.tree}" if a.tree > 1 else "") + (":ngram" if a.ngram else "")
    specs = [f"fixed:2{sfx}", f"dspark{sfx}", f"dspark{sfx}@{a.options}"]
    with Session(a.engines, specs[0]) as s:
        try:  # B through DSparkGovernor's constructor, which checks and converts its arguments
            govs = {sp: make_governor(sp.split("@")[0], s.engines, s.calibration, **(options if "@" in sp else {}))
                    for sp in specs}
        except (UserError, ValueError, TypeError) as e:
            print(f"error: --options {a.options}: {e}", file=sys.stderr)
            return 1
        rate = interleaved(s, govs, pick_prompts(a.per_kind), a.repeats, a.max_new_tokens)
    if rate is None:
        return 1
    print("B vs A (dspark as it is): " + " ".join(f"{k} {rate[specs[2]][k] / rate[specs[1]][k]:.3f}" for k in rate[specs[1]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
