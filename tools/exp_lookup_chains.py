"""How long prompt lookup's chains would run uncapped, from a run's greedy answers.

    specrt run ENGINES --prompts FILE.jsonl --chat --governor off --stats S.json
    .venv/bin/python tools/exp_lookup_chains.py S.json [--caps 4,8,16,32] [--nmin 3]

Replays each answer token by token with ngram.py's index (prompt and answer so far): at
every round where the context's last n tokens (n >= --nmin) occurred before, the tokens
that followed them are verified, capped at the chain length, and the round emits the
matched ones plus the target's next token; elsewhere a round emits one token (a plain
step, no draft). Prints, per cap, the rounds the answers need, the lookup rounds and their
tokens a round, and how many of them matched the whole cap (a longer chain would have
gone on). Greedy answers decide matches exactly; no engine runs, so it isolates what
the cap costs from what verifying more rows costs (`specrt bench` measures both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specrt.runtime.ngram import NgramIndex  # noqa: E402


def replay(prompt: list[int], answer: list[int], cap: int, nmin: int) -> dict[str, int]:
    """Rounds for one answer with lookup chains capped at ``cap`` (module doc)."""
    stream = prompt + answer
    idx = NgramIndex()
    idx.extend(stream[: len(prompt) + 1])  # the prefill gives the first answer token
    i = len(prompt) + 1
    out = {"rounds": 0, "lookup_rounds": 0, "lookup_tokens": 0, "full": 0}
    while i < len(stream):
        prop, n = idx.propose(cap)
        prop = prop[: len(stream) - i]
        a = 0
        if prop and n >= nmin:
            while a < len(prop) and prop[a] == stream[i + a]:
                a += 1
            out["lookup_rounds"] += 1
            out["lookup_tokens"] += min(a + 1, len(stream) - i)
            out["full"] += a == cap
        step = min(a + 1, len(stream) - i)
        idx.extend(stream[i : i + step])
        i += step
        out["rounds"] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stats", type=Path, help="a `specrt run --stats` file (per prompt: prompt_ids, output_token_ids)")
    ap.add_argument("--caps", default="4,8,16,32")
    ap.add_argument("--nmin", type=int, default=3, help="shortest match taken (ngram.py keeps 2..4)")
    args = ap.parse_args(argv)
    prompts = json.loads(args.stats.read_text())["prompts"]
    tokens = sum(len(p["output_token_ids"]) for p in prompts)
    print(f"{len(prompts)} answers, {tokens} tokens; lookup at matches of >= {args.nmin} tokens")
    for cap in (int(c) for c in args.caps.split(",")):
        tot = {"rounds": 0, "lookup_rounds": 0, "lookup_tokens": 0, "full": 0}
        for p in prompts:
            for k, v in replay(p["prompt_ids"], p["output_token_ids"], cap, args.nmin).items():
                tot[k] += v
        per = tot["lookup_tokens"] / max(tot["lookup_rounds"], 1)
        print(f"cap {cap:3d}: {tot['rounds']} rounds, {tot['lookup_rounds']} lookup rounds ({per:.2f} tokens each), "
              f"{tot['full']} matched the whole cap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
