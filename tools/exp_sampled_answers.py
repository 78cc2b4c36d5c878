"""Experiment: do the target's sampled answers teach a draft more than its greedy ones alone?

Every answerable TRAIN prompt has its greedy answer (NOTES.md, "Found in session 46"), and
stage 8's draft fits its training answers at tau 2.39 against 2.12 held out: more text per
prompt is the data a GPU session can still make (``gen_chat_data --temperature``). This
probe asks, on this CPU and at small scale, whether such answers help at all:

    python tools/exp_sampled_answers.py select --n 600 -o DIR    # DIR/greedy.jsonl, DIR/greedy2.jsonl
    python tools/exp_sampled_answers.py sample DIR --temperature 0.7 --seed 1   # DIR/sampled.jsonl

``select`` draws 2N answers of the fourth TRAIN batch (fixtures/peagle-data/chat-fourth.jsonl.gz,
answers stage 8 never trained on) with ``random.Random(0)``: the first N are ``greedy.jsonl``
(prompts G), the other N ``greedy2.jsonl`` (prompts G', as many new prompts). ``sample``
answers G's prompts again, sampled from the target (gen_chat_data.HfEngine, the same code
as the device job's generator; batches of prompts of similar length). Then three
continuations of stage 8 on the same steps and rate (train_peagle ``--chat``):

    A: greedy.jsonl                 (the greedy answers alone)
    B: greedy.jsonl sampled.jsonl   (plus sampled answers of the same prompts)
    C: greedy.jsonl greedy2.jsonl   (plus greedy answers of as many other prompts)

and tools/eval_draft.py scores them on the held-out answers. B against A is what sampled
answers add; C against A what new prompts add, the scale to read B's gain on.
"""

from __future__ import annotations

import argparse
import gzip
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_chat_data as g  # noqa: E402

FOURTH = Path(__file__).resolve().parents[1] / "fixtures" / "peagle-data" / "chat-fourth.jsonl.gz"


def select(n: int, out: Path, source: Path = FOURTH) -> None:
    with gzip.open(source, "rt") as f:
        lines = [x for x in f if x.strip()]
    if 2 * n > len(lines):
        raise SystemExit(f"--n {n}: {source} has {len(lines)} answers, fewer than 2N")
    pick = random.Random(0).sample(lines, 2 * n)
    out.mkdir(parents=True, exist_ok=True)
    (out / "greedy.jsonl").write_text("".join(pick[:n]))
    (out / "greedy2.jsonl").write_text("".join(pick[n:]))
    print(f"{out}/greedy.jsonl, greedy2.jsonl: {n} answers each", file=sys.stderr)


def sample(folder: Path, temperature: float, top_p: float, seed: int, batch: int, threads: int) -> None:
    import torch
    torch.set_num_threads(threads)
    from smollm2 import default_cache, ensure_smollm2
    from transformers import AutoTokenizer

    mode = g.sampling_mode(temperature, top_p, seed)
    if mode is None:
        raise SystemExit("--temperature 0 is the greedy answers greedy.jsonl already holds")
    rows = g.read_jsonl(folder / "greedy.jsonl")
    out = folder / "sampled.jsonl"
    have = g.read_jsonl(out)
    g.check_mode(out, have, mode)
    done = {d["idx"] for d in have}
    hf_dir = ensure_smollm2(default_cache())
    tok = AutoTokenizer.from_pretrained(hf_dir)
    engine = g.HfEngine(hf_dir, sampling=mode)
    todo = sorted((d for d in rows if d["idx"] not in done), key=lambda d: len(d["prompt_ids"]))
    t0, n_tok = time.time(), 0
    for i in range(0, len(todo), batch):
        group = todo[i:i + batch]
        res = engine.generate([d["prompt_ids"] for d in group], [d["idx"] for d in group])
        with g.open_append(out) as f:
            for d, r in zip(group, res):
                ans = g.cut_at_eos(r)
                n_tok += len(ans)
                f.write(g.answer_line(d["idx"], d, d["prompt_ids"], ans, tok, "hf", mode))
        print(f"{len(done) + i + len(group)}/{len(rows)} answered, {n_tok / (time.time() - t0):.0f} tok/s",
              file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select")
    s.add_argument("--n", type=int, default=600)
    s.add_argument("-o", "--out", type=Path, required=True)
    s = sub.add_parser("sample")
    s.add_argument("folder", type=Path)
    s.add_argument("--temperature", type=float, default=0.7)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    if a.cmd == "select":
        select(a.n, a.out)
    else:
        sample(a.folder, a.temperature, a.top_p, a.seed, a.batch, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
