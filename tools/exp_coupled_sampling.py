"""A/B, interleaved: coupled sampling (``--reproducible``) against rejection sampling.

    .venv/bin/python tools/exp_coupled_sampling.py ENGINES [--governors fixed:2,auto]
        [--prompts tools/data/heldout_prompts.jsonl] [--n 8] [--seeds 2] [--temperature 0.7]
        [--max-new-tokens 128]

For each governor, two Sessions on ENGINES, the same sampling settings but
``SamplingParams.coupled`` off / on, decode the first ``--n`` held-out prompts (through
the chat template) with ``--seeds`` seeds each, the two in alternating order prompt by
prompt. Prints per governor and variant the median tokens/s over the prompts, the median
tau, drafts accepted of those verified, and the median of the paired ratios coupled /
rejection. Then checks what coupled sampling promises: each prompt and seed decoded with
``--governor off`` gives the coupled runs' tokens (exit 1 when not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from specrt.errors import UserError
    from specrt.prompt_files import read_prompt_file
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--governors", default="fixed:2,auto")
    ap.add_argument("--prompts", type=Path, default=Path(__file__).parent / "data" / "heldout_prompts.jsonl")
    ap.add_argument("--n", type=int, default=8, help="the first N prompts")
    ap.add_argument("--seeds", type=int, default=2, help="seeds a prompt")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args(argv)
    try:
        prompts = [p["prompt"] for p in read_prompt_file(a.prompts, allow_ids=False)][: a.n]
        base = SamplingParams(temperature=a.temperature, seed=0)
        rows: dict[tuple[str, bool], list[tuple[float, float, int, int]]] = {}
        coupled_out: dict[tuple[int, int], list[int]] = {}
        for gov in a.governors.split(","):
            sessions = {c: Session(a.engines, governor=gov, sampling=replace(base, coupled=c)) for c in (False, True)}
            try:
                for s in sessions.values():  # warm-up, untimed
                    "".join(s.stream(prompts[0], chat=True, max_new_tokens=16))
                for seed in range(a.seeds):
                    for i, p in enumerate(prompts):
                        order = list(sessions.items())
                        for c, s in (order if (i + seed) % 2 == 0 else order[::-1]):
                            s.generator.params = replace(s.generator.params, seed=1000 * seed + i)
                            t0 = time.perf_counter()
                            "".join(s.stream(p, chat=True, max_new_tokens=a.max_new_tokens))
                            st = s.stats()
                            rows.setdefault((gov, c), []).append(
                                (st["new_tokens"] / (time.perf_counter() - t0), st["tau"], st["accepted"],
                                 st["drafted"]))
                            if c:
                                coupled_out.setdefault((seed, i), st["output_token_ids"])
                                if coupled_out[(seed, i)] != st["output_token_ids"]:
                                    print(f"FAIL: {gov} coupled, prompt {i} seed {seed}: another text than the "
                                          "other governors'", file=sys.stderr)
                                    return 1
            finally:
                for s in sessions.values():
                    s.close()
        for (gov, c), r in rows.items():
            acc = sum(x[2] for x in r) / max(1, sum(x[3] for x in r))
            print(f"{gov:10s} {'coupled' if c else 'rejection':9s} tok/s median {statistics.median(x[0] for x in r):6.1f}"
                  f"  tau median {statistics.median(x[1] for x in r):.3f}  accepted of verified {acc:.3f}"
                  f"  ({len(r)} runs)")
        for gov in a.governors.split(","):
            pairs = zip(rows[(gov, False)], rows[(gov, True)])
            print(f"{gov}: coupled / rejection tokens/s, median of paired ratios "
                  f"{statistics.median(y[0] / x[0] for x, y in pairs):.3f}")
        with Session(a.engines, governor="off", sampling=replace(base, coupled=True)) as s:
            for (seed, i), want in sorted(coupled_out.items()):
                s.generator.params = replace(s.generator.params, seed=1000 * seed + i)
                "".join(s.stream(prompts[i], chat=True, max_new_tokens=a.max_new_tokens))
                if s.stats()["output_token_ids"] != want:
                    print(f"FAIL: prompt {i} seed {seed}: coupled output is not target-only decoding's",
                          file=sys.stderr)
                    return 1
        print(f"coupled outputs = target-only decoding's with the same seed: {len(coupled_out)}/{len(coupled_out)}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
