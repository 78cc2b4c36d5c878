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

``--alternate``: the conversations two at a time, their turns taking turns on each
session (two clients of one `specrt serve`), modes snapshots (``prefix_snapshots`` 4: the
other conversation's rows set aside and swapped back), answers (the live caches only:
each switch overwrites the other's rows) and off.

    python tools/exp_chat_turns.py out/demo/engines --conversations 6 --alternate --out results/chat_alternate
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
    ap.add_argument("--alternate", action="store_true",
                    help="two conversations at a time taking turns: modes snapshots (Generator.prefix_snapshots "
                         "4, as `specrt serve`), answers (the live caches only) and off")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    from specrt.runtime.session import Session

    modes = ("snapshots", "answers", "off") if a.alternate else MODES
    rows = [json.loads(line) for line in open(a.prompts)]
    firsts = [r["prompt"] for r in rows if r.get("kind") == "chat"][: a.conversations]
    sessions = {m: Session(a.engines, governor=a.governor, reuse_prefix=m != "off",
                           prefix_snapshots=4 if m == "snapshots" else 0) for m in modes}
    # --alternate: conversations two at a time, their turns taking turns on each session
    groups = [list(range(i, min(i + 2, len(firsts)))) for i in range(0, len(firsts), 2)] if a.alternate \
        else [[i] for i in range(len(firsts))]
    records, identical = [], True
    for group in groups:
        for s in sessions.values():  # every group starts from empty caches
            s.generator._prefix = None
            s.generator._snapshots.clear()
        messages = {c: [] for c in group}
        last_prompt = {c: {} for c in group}
        for t in range(1 + len(FOLLOW_UPS)):
            for c in group:
                messages[c].append({"role": "user", "content": firsts[c] if t == 0 else FOLLOW_UPS[t - 1]})
                answers = {}
                for m, s in sessions.items():
                    g = s.generator
                    if m == "prompts" and g._prefix is not None:
                        ids, chunks = g._prefix
                        g._prefix = (ids[: last_prompt[c][m]], chunks)
                    answers[m] = "".join(s.stream(list(messages[c]), max_new_tokens=a.max_new_tokens))
                    st = s.stats()
                    last_prompt[c][m] = len(st["prompt_ids"])
                    records.append({"conversation": c, "turn": t, "mode": m, "prompt_tokens": st["prompt_tokens"],
                                    "reused": st["prefix_reused"], "first_token_s": st["first_token_s"],
                                    "seconds": st["seconds"], "new_tokens": st["new_tokens"],
                                    "output_token_ids": st["output_token_ids"]})
                same = len({json.dumps(r["output_token_ids"]) for r in records[-len(modes):]}) == 1
                identical &= same
                print(f"conversation {c} turn {t}: " + "  ".join(
                    f"{r['mode']} {r['reused']}/{r['prompt_tokens']} first {r['first_token_s']:.3f} s "
                    f"total {r['seconds']:.2f} s" for r in records[-len(modes):]) +
                    ("" if same else "  OUTPUTS DIFFER"), flush=True)
                messages[c].append({"role": "assistant", "content": answers[modes[0]]})
    for s in sessions.values():
        s.close()

    lines = [f"engines {a.engines}, governor {a.governor}, {len(firsts)} conversations x {1 + len(FOLLOW_UPS)} "
             f"turns{', two at a time taking turns' if a.alternate else ''}, {a.max_new_tokens} new tokens at most; "
             "medians over the conversations"]
    for t in range(1 + len(FOLLOW_UPS)):
        by = {m: [r for r in records if r["turn"] == t and r["mode"] == m] for m in modes}
        med = {m: {k: statistics.median(r[k] for r in by[m]) for k in ("prompt_tokens", "reused", "first_token_s",
                                                                         "seconds")} for m in modes}
        lines.append(f"turn {t + 1}: prompt {med['off']['prompt_tokens']:.0f} tokens; " + "; ".join(
            f"{m}: reused {med[m]['reused']:.0f}, first token {med[m]['first_token_s']:.3f} s, "
            f"turn {med[m]['seconds']:.2f} s" for m in modes))
        if t:
            ratio = lambda m, k: statistics.median(x[k] / y[k] for x, y in zip(by[m], by["off"]))  # noqa: E731
            lines.append("        vs off (median of ratios): " + "; ".join(
                f"{m} first token {ratio(m, 'first_token_s'):.2f}x, turn {ratio(m, 'seconds'):.2f}x"
                for m in modes if m != "off"))
    lines.append(f"outputs identical across the {len(modes)}: {'yes' if identical else 'NO'}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "summary.txt").write_text("\n".join(lines) + "\n")
    (a.out / "turns.json").write_text(json.dumps(records))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
