"""Conversations turn by turn: what prefix reuse saves when a turn reuses the rows of the
answers before it, not only of the prompts.

Three sessions on the same engines in one process, taking turns on each conversation's
turns (interleaved, so the host's drift hits all three alike):
  answers  prefix reuse as shipped (the last stream's prompt and output rows),
  prompts  reuse limited to the last prompt's rows (the behaviour before 2026-12-02,
           emulated here by cutting the kept token list back to the last prompt),
  off      no reuse (every turn prefills the whole conversation).
Each conversation is a held-out chat prompt and FOLLOW_UPS; the next turn's messages carry
the `answers` session's answer, and every session must give the same answers (checked).

    python tools/exp_chat_turns.py out/demo/engines --conversations 6 --out results/chat_turns
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

FOLLOW_UPS = ["Tell me more about that.", "Sum it up in one sentence."]
MODES = ("answers", "prompts", "off")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines")
    ap.add_argument("--prompts", default="tools/data/heldout_prompts.jsonl")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--governor", default="auto")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    from specrt.runtime.session import Session

    rows = [json.loads(line) for line in open(a.prompts)]
    firsts = [r["prompt"] for r in rows if r.get("kind") == "chat"][: a.conversations]
    sessions = {m: Session(a.engines, governor=a.governor, reuse_prefix=m != "off") for m in MODES}
    records, identical = [], True
    for c, first in enumerate(firsts):
        for s in sessions.values():  # every conversation starts from empty caches
            s.generator._prefix = None
        messages, last_prompt = [], {}
        for t, user in enumerate([first, *FOLLOW_UPS]):
            messages.append({"role": "user", "content": user})
            answers = {}
            for m, s in sessions.items():
                g = s.generator
                if m == "prompts" and g._prefix is not None:
                    ids, chunks = g._prefix
                    g._prefix = (ids[: last_prompt[m]], chunks)
                answers[m] = "".join(s.stream(list(messages), max_new_tokens=a.max_new_tokens))
                st = s.stats()
                last_prompt[m] = len(st["prompt_ids"])
                records.append({"conversation": c, "turn": t, "mode": m, "prompt_tokens": st["prompt_tokens"],
                                "reused": st["prefix_reused"], "first_token_s": st["first_token_s"],
                                "seconds": st["seconds"], "new_tokens": st["new_tokens"],
                                "output_token_ids": st["output_token_ids"]})
            same = len({json.dumps(r["output_token_ids"]) for r in records[-len(MODES):]}) == 1
            identical &= same
            print(f"conversation {c} turn {t}: " + "  ".join(
                f"{r['mode']} {r['reused']}/{r['prompt_tokens']} first {r['first_token_s']:.3f} s "
                f"total {r['seconds']:.2f} s" for r in records[-len(MODES):]) + ("" if same else "  OUTPUTS DIFFER"),
                flush=True)
            messages.append({"role": "assistant", "content": answers["answers"]})
    for s in sessions.values():
        s.close()

    lines = [f"engines {a.engines}, governor {a.governor}, {len(firsts)} conversations x {1 + len(FOLLOW_UPS)} "
             f"turns, {a.max_new_tokens} new tokens at most; medians over the conversations"]
    for t in range(1 + len(FOLLOW_UPS)):
        by = {m: [r for r in records if r["turn"] == t and r["mode"] == m] for m in MODES}
        med = {m: {k: statistics.median(r[k] for r in by[m]) for k in ("prompt_tokens", "reused", "first_token_s",
                                                                         "seconds")} for m in MODES}
        lines.append(f"turn {t + 1}: prompt {med['off']['prompt_tokens']:.0f} tokens; " + "; ".join(
            f"{m}: reused {med[m]['reused']:.0f}, first token {med[m]['first_token_s']:.3f} s, "
            f"turn {med[m]['seconds']:.2f} s" for m in MODES))
        if t:
            ratio = lambda m, k: statistics.median(x[k] / y[k] for x, y in zip(by[m], by["off"]))  # noqa: E731
            lines.append(f"        first token vs off (median of ratios): answers {ratio('answers', 'first_token_s'):.2f}x, "
                         f"prompts {ratio('prompts', 'first_token_s'):.2f}x; turn time: answers "
                         f"{ratio('answers', 'seconds'):.2f}x, prompts {ratio('prompts', 'seconds'):.2f}x")
    lines.append(f"outputs identical across the three: {'yes' if identical else 'NO'}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.txt").write_text("\n".join(lines) + "\n")
    (a.out / "turns.json").write_text(json.dumps(records))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
