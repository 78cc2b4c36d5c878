"""Generate the target's own greedy chat answers for the TRAIN prompts (resumable).

Each TRAIN prompt of ``tools/prompts.py`` is wrapped in SmolLM2's chat template
(add_generation_prompt) and answered greedily, at most 256 new tokens, stopping
at EOS (``<|im_end|>``, id 2; kept as the answer's last token). One JSON line per
prompt is appended to ``$SPECRT_CACHE/peagle-data/chat.jsonl``::

    {"idx", "kind", "prompt", "prompt_ids", "answer_ids", "answer", "engine"}

so the file can be read while it grows and a restarted run skips what is done.

Engines, measured here on one thread (batch 32, 128 new tokens, the same 32
prompts, identical outputs): onnxruntime-genai 0.18 fp32 190 tok/s, HF generate
105 tok/s. onnxruntime-genai mishandles left padding in a batch (its attention
mask comes from pad_token_id, and SmolLM2's pad is its EOS, which also occurs
inside every chat prompt; with another pad id the outputs still differ from
unpadded decoding), so prompts are grouped into batches of *equal token length*
and no padding is ever used. Its outputs then equal HF batch-1 greedy decoding
(checked on 3 prompts x 128 tokens). The ORT model is built once with the
onnxruntime-genai model builder (needs the ``onnx-ir`` package) into
``$SPECRT_CACHE/smollm2-135m-instruct-ort-fp32``.

    nice -n 10 env OMP_NUM_THREADS=1 python tools/gen_chat_data.py [--engine ort|hf] [--batch 32]

Progress: ``wc -l $SPECRT_CACHE/peagle-data/chat.jsonl`` and the stderr log.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import train_prompts  # noqa: E402
from smollm2 import default_cache, ensure_smollm2  # noqa: E402

MAX_NEW = 256
ONNX_IR = "onnx-ir==1.1.0"  # the onnxruntime-genai 0.18 model builder's one missing dependency
EOS = 2  # <|im_end|>


def _log(msg: str) -> None:
    print(f"[gen] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def ensure_ort_model(hf_dir: Path, cache: Path) -> Path:
    """Build (once) the onnxruntime-genai fp32 CPU model of the HF folder, 1 thread."""
    out = cache / "smollm2-135m-instruct-ort-fp32"
    cfg = out / "genai_config.json"
    if cfg.is_file():
        return out
    tmp = cache / ".smollm2-ort-tmp"
    env = dict(os.environ)
    try:
        import onnx_ir  # noqa: F401
    except ImportError:
        # The builder imports onnx_ir, which the project's venv lacks: install it
        # into a private folder of the cache rather than into the venv.
        deps = cache / "ort-builder-deps"
        if not (deps / "onnx_ir").is_dir():
            _log(f"pip install --no-deps --target {deps} {ONNX_IR}")
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--target", str(deps), ONNX_IR], check=True, stdout=sys.stderr)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(deps), env.get("PYTHONPATH")]))
    _log(f"building onnxruntime-genai model into {out}")
    subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
                    "-o", str(tmp), "-p", "fp32", "-e", "cpu"], check=True,
                   stdout=subprocess.DEVNULL, env=env)
    c = json.loads((tmp / "genai_config.json").read_text())
    c["model"]["decoder"]["session_options"].update(intra_op_num_threads=1, inter_op_num_threads=1)
    (tmp / "genai_config.json").write_text(json.dumps(c, indent=2))
    os.replace(tmp, out)
    return out


class OrtEngine:
    """Equal-length batches only (see module docstring)."""

    def __init__(self, path: Path):
        import onnxruntime_genai as og
        self.og, self.model = og, og.Model(str(path))

    def generate(self, batch: list[list[int]]) -> list[list[int]]:
        import numpy as np
        L = len(batch[0])
        assert all(len(p) == L for p in batch)
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=L + MAX_NEW, batch_size=len(batch), do_sample=False)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(np.asarray(batch, dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        return [list(map(int, gen.get_sequence(i)[L:])) for i in range(len(batch))]


class HfEngine:
    def __init__(self, path: Path):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def generate(self, batch: list[list[int]]) -> list[list[int]]:
        torch = self.torch
        L = max(len(p) for p in batch)
        ids = torch.tensor([[EOS] * (L - len(p)) + p for p in batch])  # left padding
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW,
                                      do_sample=False, pad_token_id=EOS)
        return out[:, L:].tolist()


def _cut(seq: list[int]) -> list[int]:
    """Answer up to and including the first EOS."""
    return seq[:seq.index(EOS) + 1] if EOS in seq else seq


def done_indices(path: Path) -> set[int]:
    done = set()
    if path.is_file():
        with open(path) as f:
            for line in f:
                try:
                    done.add(json.loads(line)["idx"])
                except (json.JSONDecodeError, KeyError):  # a torn last line after a kill
                    pass
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", default=None, help="default $SPECRT_CACHE/peagle-data/chat.jsonl")
    ap.add_argument("--engine", choices=("ort", "hf"), default="ort")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--limit", type=int, default=None, help="stop after this many TRAIN prompts")
    args = ap.parse_args(argv)

    import torch
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    cache = Path(args.cache) if args.cache else default_cache()
    hf_dir = ensure_smollm2(cache)
    out = Path(args.out) if args.out else cache / "peagle-data" / "chat.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    engine = OrtEngine(ensure_ort_model(hf_dir, cache)) if args.engine == "ort" else HfEngine(hf_dir)

    todo = train_prompts()[:args.limit]
    done = done_indices(out)
    _log(f"{len(done)} of {len(todo)} prompts already done -> {out}")

    # ORT needs equal-length batches: fill one bucket per prompt length, run a
    # bucket when it holds --batch prompts, and flush the leftovers at the end.
    buckets: dict[int, list] = collections.defaultdict(list)
    t0, n_tok, n_rows = time.time(), 0, 0

    def run(group: list) -> None:
        nonlocal n_tok, n_rows
        answers = [_cut(a) for a in engine.generate([ids for _, _, ids in group])]
        with open(out, "a") as f:
            for (idx, d, ids), ans in zip(group, answers):
                f.write(json.dumps({"idx": idx, "kind": d["kind"], "prompt": d["prompt"], "prompt_ids": ids,
                                    "answer_ids": ans, "answer": tok.decode(ans), "engine": args.engine},
                                   ensure_ascii=False) + "\n")
        n_tok += sum(map(len, answers))
        n_rows += len(group)
        dt = time.time() - t0
        _log(f"+{len(group)} rows (len {len(group[0][2])}), session {n_rows} rows {n_tok} tokens "
             f"{n_tok / dt:.1f} tok/s, total done {len(done) + n_rows}")

    for idx, d in enumerate(todo):
        if idx in done:
            continue
        ids = tok.apply_chat_template([{"role": "user", "content": d["prompt"]}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        key = len(ids) if args.engine == "ort" else 0
        buckets[key].append((idx, d, ids))
        if len(buckets[key]) == args.batch:
            run(buckets.pop(key))
    for key in sorted(buckets):
        run(buckets[key])
    _log("all TRAIN prompts done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
