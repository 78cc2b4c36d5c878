"""Generate the target's own chat answers for the TRAIN prompts (greedy, with its features; or sampled).

Each TRAIN prompt of ``tools/prompts.py`` (but the DSpark calibration prompts, which
``prompts.answerable_train_prompts`` keeps out of training) is wrapped in SmolLM2's chat template
(add_generation_prompt) and answered greedily, at most 256 new tokens, stopping
at EOS (``<|im_end|>``, id 2; kept as the answer's last token). Under
``$SPECRT_CACHE/peagle-data/``:

    chat.jsonl         one line per prompt: {"idx", "kind", "prompt", "prompt_ids",
                       "answer_ids", "answer", "engine"}; readable while it grows
    chat-feats.jsonl   {"idx", "row", "n"}: the target's features of that sequence's
                       positions 0..n-1 (n = len(prompt_ids + answer_ids) - 1) are rows
                       row..row+n-1 of
    chat-feats.aux.f16    [rows, 7*576] fp16: hidden_states[i] for i in FEATURE_LAYERS
    chat-feats.final.f16  [rows, 576] fp16: hidden_states[-1] (after the final norm)

Capturing the features while generating saves the trainer a second pass of the
target over every sequence (the decode computes them anyway). Seven layers are
kept so the trainer can choose its three aux layers among them. The last
position of a sequence needs no features (no slot reads it). A restarted run
skips finished prompts, truncates torn feature rows, and first fills in features
for any answered prompt that lacks them (one teacher-forced prefill each).

Engines, measured here on one thread (batch 32, 128 new tokens, the same 32
prompts, identical outputs): onnxruntime-genai 0.18 fp32 190 tok/s, HF generate
105 tok/s. onnxruntime-genai mishandles left padding in a batch (its attention
mask comes from pad_token_id, and SmolLM2's pad is its EOS, which also occurs
inside every chat prompt; with another pad id the outputs still differ from
unpadded decoding), so prompts are grouped into batches of *equal token length*
and no padding is ever used. Its outputs then equal HF batch-1 greedy decoding
(checked on 3 prompts x 128 tokens), and its hidden states equal transformers'
``output_hidden_states`` to 4e-4 (values up to 2.5e4). The ORT model is built
once with the onnxruntime-genai model builder (which needs ``onnx-ir``, installed
into the cache if the venv lacks it) into ``$SPECRT_CACHE/smollm2-135m-instruct-ort-fp32-aux``.
``--engine hf`` (HF generate, left padding) writes answers without features (the
trainer computes them in one teacher-forced pass); with ``--device cuda`` it batches
prompts of similar length on the GPU (fp32, TF32 off), and ``--max-seconds`` bounds a
run on a machine lent for a fixed time (tools/device_train_draft.sh).

    nice -n 10 env OMP_NUM_THREADS=1 python tools/gen_chat_data.py [--engine ort|hf] [--batch 32]

A generator uses one core. On N cores run N shards, each into its own folder, then merge:

    python tools/gen_chat_data.py --shard 0/2 --out $SPECRT_CACHE/peagle-data-0/chat.jsonl &
    python tools/gen_chat_data.py --shard 1/2 --out $SPECRT_CACHE/peagle-data-1/chat.jsonl
    python tools/gen_chat_data.py --merge $SPECRT_CACHE/peagle-data-0 $SPECRT_CACHE/peagle-data-1

To add answers to a folder the trainer already uses (its features computed) without
refilling its features, generate into new folders with ``--skip-answered
FOLDER/chat.jsonl`` and ``--merge`` them into FOLDER.

Sampled answers (``--temperature T [--top-p P] [--seed S]``, ``--engine hf`` only): the
target's answers drawn from its own distribution, more text per prompt once every prompt
has its greedy answer (the draft's KL loss holds on any answer; what it gains is
measured in results/README.md, "Session 48"). They go to a folder of their own (a run refuses
an ``--out`` whose answers were made in another mode), each line with
``"sampling": {"temperature", "top_p", "seed"}``, and carry no recorded features (the
trainer computes them; its feature store is keyed by prompt index for greedy answers, so
train_peagle never reads a sampled answer's features from one). Each batch draws from
its own seed, made from ``--seed`` and the batch's prompt indices: the same batch on the
same device gives the same answers, and a resumed run, whose batches are formed anew,
other draws. top-k is off (the whole vocabulary); the model's generation_config sets no
other processor.

    python tools/gen_chat_data.py --engine hf --device cuda --temperature 1 --seed 1 \
        --out $SPECRT_CACHE/peagle-data-t1/chat.jsonl
    python tools/train_peagle.py --chat $SPECRT_CACHE/peagle-data/chat.jsonl \
        $SPECRT_CACHE/peagle-data-t1/chat.jsonl ...

Progress: ``wc -l $SPECRT_CACHE/peagle-data/chat.jsonl`` and the stderr log.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prompts import answerable_train_prompts  # noqa: E402
from smollm2 import default_cache, ensure_smollm2  # noqa: E402

MAX_NEW = 256
ONNX_IR = "onnx-ir==1.1.0"  # the onnxruntime-genai 0.18 model builder's one missing dependency
EOS = 2  # <|im_end|>
HIDDEN = 576
FEATURE_LAYERS = (2, 8, 15, 20, 27, 28, 29)  # output_hidden_states indices (residual entering layer i)
FP16_MAX = 65504.0


def exact_fp32(torch) -> None:
    """CUDA matmuls in the target's own fp32 arithmetic, not TF32 (its answers and features)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _log(msg: str) -> None:
    print(f"[gen] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def ensure_ort_model(hf_dir: Path, cache: Path) -> Path:
    """Build (once) the onnxruntime-genai fp32 CPU model with hidden-state outputs, 1 thread."""
    out = cache / "smollm2-135m-instruct-ort-fp32-aux"
    if (out / "genai_config.json").is_file():
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
                    "-o", str(tmp), "-p", "fp32", "-e", "cpu", "--extra_options", "include_hidden_states=1",
                    "aux_hidden_state_layers=" + ",".join(map(str, FEATURE_LAYERS))],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    c = json.loads((tmp / "genai_config.json").read_text())
    c["model"]["decoder"]["session_options"].update(intra_op_num_threads=1, inter_op_num_threads=1)
    (tmp / "genai_config.json").write_text(json.dumps(c, indent=2))
    os.replace(tmp, out)
    return out


class OrtEngine:
    """Equal-length batches only (see module docstring); returns answers and features."""

    def __init__(self, path: Path):
        import onnxruntime_genai as og
        self.og, self.model = og, og.Model(str(path))

    def _generator(self, batch: list[list[int]], max_length: int):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, batch_size=len(batch), do_sample=False)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(np.asarray(batch, dtype=np.int32))  # runs the prefill
        return gen

    def _outputs(self, gen) -> tuple[np.ndarray, np.ndarray]:
        return gen.get_output("aux_hidden_states").copy(), gen.get_output("hidden_states").copy()

    def generate(self, batch: list[list[int]]):
        """-> [(answer_ids, aux [n, 7H], final [n, H])] with n = prompt + answer - 1 positions."""
        P = len(batch[0])
        assert all(len(p) == P for p in batch)
        gen = self._generator(batch, P + MAX_NEW)
        aux, fin = [], []
        a, f = self._outputs(gen)  # positions 0..P-1
        aux.append(a)
        fin.append(f)
        gen.generate_next_token()  # samples from the prefill logits; runs nothing new
        while not gen.is_done():
            # each further call first runs the model on the last sampled token (the
            # next position), then samples: its outputs are that position's
            gen.generate_next_token()
            a, f = self._outputs(gen)
            aux.append(a)
            fin.append(f)
        aux_all, fin_all = np.concatenate(aux, 1), np.concatenate(fin, 1)  # [B, positions, .]
        out = []
        for i in range(len(batch)):
            ans = with_final_eos(cut_at_eos([int(x) for x in gen.get_sequence(i)[P:]]), MAX_NEW)
            n = P + len(ans) - 1
            assert aux_all.shape[1] >= n, "features missing for a generated position"
            out.append((ans, aux_all[i, :n], fin_all[i, :n]))
        return out

    def features(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Teacher-forced features of positions 0..len(ids)-2 of one sequence."""
        gen = self._generator([ids[:-1]], len(ids) + 1)
        a, f = self._outputs(gen)
        return a[0], f[0]


class HfEngine:
    """HF generate with left padding (outputs equal batch-1 decoding; checked on 2 x 64 tokens).
    With ``sampling`` ({"temperature", "top_p", "seed"}, temperature > 0) it samples instead,
    each batch from the seed ``batch_seed`` makes of the run's seed and the batch's keys."""

    def __init__(self, path: Path | None = None, model=None, max_new: int = MAX_NEW, device: str = "cpu",
                 sampling: dict | None = None):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch, self.max_new, self.sampling = torch, max_new, sampling
        self.model = model if model is not None else AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32).eval().to(device)

    def generate(self, batch: list[list[int]], keys: list[int] | None = None) -> list[list[int]]:
        torch = self.torch
        L = max(len(p) for p in batch)
        ids = torch.tensor([[EOS] * (L - len(p)) + p for p in batch])  # left padding
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch])
        dev = self.model.device
        how: dict = {"do_sample": False}
        if self.sampling:
            s = self.sampling
            torch.manual_seed(batch_seed(s["seed"], keys if keys is not None else range(len(batch))))
            how = {"do_sample": True, "temperature": s["temperature"], "top_p": s["top_p"], "top_k": 0}
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                                      max_new_tokens=self.max_new, pad_token_id=EOS, **how)
        return out[:, L:].tolist()


def batch_seed(seed: int, keys) -> int:
    """A batch's torch seed: a hash of the run's ``--seed`` and the batch's prompt indices."""
    h = hashlib.sha256(json.dumps([int(seed), [int(k) for k in keys]]).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


def sampling_mode(temperature: float, top_p: float, seed: int) -> dict | None:
    """The ``"sampling"`` field of the answers ``--temperature`` / ``--top-p`` / ``--seed`` make
    (None: greedy, temperature 0); SystemExit naming the option for a value out of range."""
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise SystemExit(f"--temperature {temperature}: expected a number >= 0 (0: greedy)")
    if not (0 < top_p <= 1):
        raise SystemExit(f"--top-p {top_p}: expected 0 < P <= 1")
    if temperature == 0:
        if top_p != 1:
            raise SystemExit("--top-p applies to sampled answers only (--temperature above 0)")
        return None
    return {"temperature": float(temperature), "top_p": float(top_p), "seed": int(seed)}


def check_mode(out: Path, rows: list[dict], sampling: dict | None) -> None:
    """SystemExit when ``out``'s answers were made in another mode than this run's (greedy, or
    other sampling settings): a folder holds one mode, as its feature store (greedy) and the
    generator's finished-prompt check (by prompt text) assume."""
    other = {json.dumps(d.get("sampling"), sort_keys=True) for d in rows} - {json.dumps(sampling, sort_keys=True)}
    if other:
        said = ", ".join(sorted("greedy" if m == "null" else m for m in other))
        raise SystemExit(f"{out}: its answers were made {said}, this run's would be "
                         f"{'greedy' if sampling is None else json.dumps(sampling, sort_keys=True)}: "
                         "write them to a folder of their own (--out), and give the trainer both files")


def answer_line(idx: int, d: dict, prompt_ids: list[int], ans: list[int], tok, engine: str,
                sampling: dict | None) -> str:
    """One chat.jsonl line: TRAIN prompt ``idx`` (``d``: its "kind" and "prompt"), its answer,
    the engine that made it and, for a sampled answer, ``"sampling"``."""
    line = {"idx": idx, "kind": d["kind"], "prompt": d["prompt"], "prompt_ids": prompt_ids,
            "answer_ids": ans, "answer": tok.decode(ans), "engine": engine}
    if sampling:
        line["sampling"] = sampling
    return json.dumps(line, ensure_ascii=False) + "\n"


def chat_ids(tok, prompt: str) -> list[int]:
    """Token ids of one user turn with SmolLM2's chat template and the assistant header."""
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def cut_at_eos(seq: list[int]) -> list[int]:
    """Answer up to and including the first EOS."""
    return seq[:seq.index(EOS) + 1] if EOS in seq else seq


def with_final_eos(ans: list[int], max_new: int) -> list[int]:
    """onnxruntime-genai leaves the EOS it sampled out of the sequence when it ends the whole
    batch (HfEngine keeps it: 23 against 24 tokens for "Say hi."), so an answer that stopped
    short of ``max_new`` without one ended there: its EOS goes back (the last position's
    features, which predicted it, were computed). 143 committed answers lack it (README)."""
    return ans if len(ans) >= max_new or (ans and ans[-1] == EOS) else [*ans, EOS]


def read_jsonl(path: Path) -> list[dict]:
    """All complete lines (a torn last line after a kill is skipped)."""
    out = []
    if path.is_file():
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def open_append(path: Path):
    """``open(path, "a")`` for JSON lines, after ending a last line that a killed write cut
    short: otherwise the next line would be glued to it and lost with it."""
    if path.is_file() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        if cut:
            with open(path, "ab") as f:
                f.write(b"\n")
    return open(path, "a")


class FeatureStore:
    """Append-only fp16 row files plus an index line per sequence, written in that order."""

    def __init__(self, folder: Path):
        self.index = folder / "chat-feats.jsonl"
        self.aux_path, self.fin_path = folder / "chat-feats.aux.f16", folder / "chat-feats.final.f16"
        self.entries = {d["idx"]: d for d in read_jsonl(self.index)}
        self.rows = max((d["row"] + d["n"] for d in self.entries.values()), default=0)
        # drop rows written after the last index line (a kill between the two writes)
        for path, width in ((self.aux_path, len(FEATURE_LAYERS) * HIDDEN), (self.fin_path, HIDDEN)):
            with open(path, "ab") as f:
                f.truncate(self.rows * width * 2)

    def add(self, idx: int, aux: np.ndarray, fin: np.ndarray) -> None:
        n = len(aux)
        assert len(fin) == n
        for path, x in ((self.aux_path, aux), (self.fin_path, fin)):
            with open(path, "ab") as f:
                f.write(np.clip(x, -FP16_MAX, FP16_MAX).astype(np.float16).tobytes())
        entry = {"idx": idx, "row": self.rows, "n": n}
        with open_append(self.index) as f:
            f.write(json.dumps(entry) + "\n")
        self.entries[idx] = entry
        self.rows += n


def load_features(folder: Path) -> tuple[dict[int, dict], np.ndarray, np.ndarray]:
    """(index by prompt idx, aux memmap [rows, 7H], final memmap [rows, H]) for the trainer."""
    entries = {d["idx"]: d for d in read_jsonl(folder / "chat-feats.jsonl")}
    rows = max((d["row"] + d["n"] for d in entries.values()), default=0)
    aux = np.memmap(folder / "chat-feats.aux.f16", np.float16, "r", shape=(rows, len(FEATURE_LAYERS) * HIDDEN))
    fin = np.memmap(folder / "chat-feats.final.f16", np.float16, "r", shape=(rows, HIDDEN))
    return entries, aux, fin


def parse_shard(spec: str | None) -> tuple[int, int]:
    """``--shard I/N`` -> (I, N): this generator answers every N-th prompt from the I-th."""
    if spec is None:
        return 0, 1
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--shard {spec}: expected I/N, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise SystemExit(f"--shard {spec}: expected 0 <= I < N")
    return i, n


def shard_prompts(limit: int | None, shard: tuple[int, int]) -> list:
    """The TRAIN prompts generator ``shard`` (I, N) answers: every N-th answerable one from
    the I-th (calibration prompts are never answered)."""
    return answerable_train_prompts(limit)[shard[0]::shard[1]]


def answered_prompts(todo: list[tuple[int, dict]], rows: list[dict], skip: list[Path] = ()) -> set[int]:
    """The indices in ``todo`` whose prompt ``rows`` (the output file's answers) or one of the
    ``--skip-answered`` files ``skip`` answers: done by text, so an answer counts whatever index
    the list that made it gave its prompt. A ``skip`` file must exist: a mistyped path would
    silently answer its prompts again."""
    answered = {d["prompt"] for d in rows}
    for path in skip:
        if not path.is_file():
            raise SystemExit(f"--skip-answered: {path} is not a file (expected a generator's chat.jsonl)")
        answered.update(d["prompt"] for d in read_jsonl(path))
    return {idx for idx, d in todo if d["prompt"] in answered}


def merge(sources: list[Path], out: Path) -> tuple[int, int]:
    """Append the answers and features of generator folders (each a ``chat.jsonl`` with its
    feature store beside it, e.g. one per ``--shard``) to the folder of ``out``; a prompt
    already answered there or earlier in ``sources`` (the same text, as the generator
    recognises finished prompts; the index where a row has no text) is skipped, so merging
    again is harmless. An answer without recorded features (``--engine hf``) is merged
    too: the trainer computes its features in one teacher-forced pass. The feature store
    is keyed by prompt index, so a folder giving an index to another prompt text than
    ``out`` or an earlier source does (one made from another prompt list) is refused with
    SystemExit before anything is written. A sampled answer (``"sampling"``) is another answer
    than the greedy one or one sampled with other settings, so it is merged beside them; it
    never takes recorded features. Returns (answers added, answers skipped)."""
    def prompt(d: dict):
        return d["prompt"] if d.get("prompt") is not None else ("idx", d["idx"])

    def key(d: dict):
        return prompt(d), json.dumps(d.get("sampling"), sort_keys=True)

    old = read_jsonl(out)
    text_of = {d["idx"]: prompt(d) for d in old}
    have = {key(d) for d in old}
    plan, skipped = [], 0  # (source folder, row) to append, checked before writing
    for src in sources:
        src_dir = src.parent if src.suffix == ".jsonl" else src
        for d in read_jsonl(src_dir / "chat.jsonl"):
            if key(d) in have:
                skipped += 1
                continue
            if text_of.get(d["idx"], prompt(d)) != prompt(d):
                raise SystemExit(f"{src_dir / 'chat.jsonl'}: prompt index {d['idx']} is {prompt(d)!r} there but "
                                 f"{text_of[d['idx']]!r} in {out} or an earlier folder; they come from different "
                                 "prompt lists (tools/prompts.py --check)")
            have.add(key(d))
            text_of[d["idx"]] = prompt(d)
            plan.append((src_dir, d))
    out.parent.mkdir(parents=True, exist_ok=True)
    store = FeatureStore(out.parent)
    features: dict[Path, tuple] = {}
    with open_append(out) as f:
        for src_dir, d in plan:
            if src_dir not in features:
                features[src_dir] = (load_features(src_dir) if (src_dir / "chat-feats.jsonl").is_file()
                                     else ({}, None, None))
            entries, s_aux, s_fin = features[src_dir]
            e = None if d.get("sampling") else entries.get(d["idx"])  # the store holds greedy answers' rows
            if e is not None:  # features first, then the answer line: a kill leaves no answer without them
                store.add(d["idx"], np.asarray(s_aux[e["row"]:e["row"] + e["n"]]),
                          np.asarray(s_fin[e["row"]:e["row"] + e["n"]]))
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
            f.flush()
    return len(plan), skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None)
    ap.add_argument("--out", default=None, help="default $SPECRT_CACHE/peagle-data/chat.jsonl")
    ap.add_argument("--engine", choices=("ort", "hf"), default="ort")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--device", default="cpu",
                    help="torch device of --engine hf (cuda: fp32, TF32 off; prompts batched by length)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no new batch after this many seconds (what is written stays; rerun to go on)")
    ap.add_argument("--limit", type=int, default=None, help="the first N TRAIN prompts (the calibration prompts among them are skipped)")
    ap.add_argument("--shard", default=None, metavar="I/N",
                    help="answer every N-th of those prompts from the I-th (run N generators, one per core, each "
                         "with its own --out folder, then --merge them)")
    ap.add_argument("--merge", nargs="+", type=Path, default=None, metavar="DIR",
                    help="append these generator folders' answers and features to --out's folder, then exit")
    ap.add_argument("--skip-answered", nargs="+", type=Path, default=[], metavar="CHAT_JSONL",
                    help="leave out the prompts these files already answer (another folder's chat.jsonl, "
                         "whose answers this run's will be merged with), without reading their features")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sample the answers at this temperature (--engine hf; 0: greedy, the default)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus of the sampled answers (1: the whole vocabulary)")
    ap.add_argument("--seed", type=int, default=0, help="the sampled answers' seed (each batch's is made from it)")
    args = ap.parse_args(argv)
    shard = parse_shard(args.shard)
    if args.device != "cpu" and args.engine == "ort":  # before anything loads
        raise SystemExit("--device applies to --engine hf only (the ORT generator runs on the CPU)")
    sampling = sampling_mode(args.temperature, args.top_p, args.seed)
    if sampling and args.engine == "ort":
        raise SystemExit("--temperature applies to --engine hf only (the ORT generator records greedy answers' "
                         "features into a store keyed by prompt index)")
    cache = Path(args.cache) if args.cache else default_cache()
    out = Path(args.out) if args.out else cache / "peagle-data" / "chat.jsonl"
    if args.merge:
        added, skipped = merge(args.merge, out)
        _log(f"merged {added} answers into {out} ({skipped} already there)")
        return 0

    todo = shard_prompts(args.limit, shard)
    rows = read_jsonl(out)
    check_mode(out, rows, sampling)
    done = answered_prompts(todo, rows, args.skip_answered)  # before the model loads: a mistyped file fails fast
    _log(f"{len(done)} of {len(todo)} prompts already done -> {out}"
         + (f" or in {', '.join(map(str, args.skip_answered))}" if args.skip_answered else ""))

    import torch
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    hf_dir = ensure_smollm2(cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    ort = args.engine == "ort"
    exact_fp32(torch)  # (for any CUDA device, "cuda:1" too; nothing on the CPU)
    engine = OrtEngine(ensure_ort_model(hf_dir, cache)) if ort else HfEngine(hf_dir, device=args.device,
                                                                             sampling=sampling)
    store = FeatureStore(out.parent) if ort else None

    if ort:
        missing = [d for d in rows if d["idx"] not in store.entries]
        for k, d in enumerate(missing):
            store.add(d["idx"], *engine.features(d["prompt_ids"] + d["answer_ids"]))
            if k % 50 == 49 or k == len(missing) - 1:
                _log(f"features filled in for {k + 1}/{len(missing)} earlier answers")

    # ORT needs equal-length batches: fill one bucket per prompt length, run a
    # bucket when it holds --batch prompts, and flush the leftovers at the end.
    buckets: dict[int, list] = collections.defaultdict(list)
    t0, n_tok, n_rows = time.time(), 0, 0

    def run(group: list) -> None:
        nonlocal n_tok, n_rows
        results = engine.generate([ids for _, _, ids in group]) if ort else \
            engine.generate([ids for _, _, ids in group], [idx for idx, _, _ in group])
        for (idx, d, ids), res in zip(group, results):
            ans = res[0] if ort else cut_at_eos(res)
            if ort:
                store.add(idx, res[1], res[2])
            with open_append(out) as f:
                f.write(answer_line(idx, d, ids, ans, tok, engine_name, sampling))
            n_tok += len(ans)
        n_rows += len(group)
        dt = time.time() - t0
        _log(f"+{len(group)} rows (len {len(group[0][2])}), session {n_rows} rows {n_tok} tokens "
             f"{n_tok / dt:.1f} tok/s, total done {len(done) + n_rows}")

    engine_name = args.engine if args.device == "cpu" else f"{args.engine}-{args.device}"
    pending = [(idx, d, chat_ids(tok, d["prompt"])) for idx, d in todo if idx not in done]
    if not ort and args.device != "cpu":
        # a wide batch on an accelerator: similar prompt lengths waste the least padding
        pending.sort(key=lambda x: len(x[2]))

    def out_of_time() -> bool:
        if args.max_seconds is not None and time.time() - t0 > args.max_seconds:
            _log(f"--max-seconds {args.max_seconds:g} spent: stopping ({len(done) + n_rows} of {len(todo)} done; "
                 "rerun to go on)")
            return True
        return False

    for item in pending:
        key = len(item[2]) if ort else 0
        buckets[key].append(item)
        if len(buckets[key]) == args.batch:
            if out_of_time():
                return 0
            run(buckets.pop(key))
    for key in sorted(buckets):
        if out_of_time():
            return 0
        run(buckets[key])
    _log("all TRAIN prompts done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
