"""Does llama.cpp give a token's row the same logits whether it is decoded alone or in a call
of several rows (a verify call)? Speculative decoding equals plain one-token decoding token for
token only where it does (README "Quantized targets": ONNX Runtime's int8 kernels do not).

    python tools/exp_llamacpp_rows.py GGUF [GGUF ...]

Each GGUF decodes the same 23 token ids three ways from an empty cache, keeping every row's
logits: the whole prompt in one call; 10 tokens, then one token a call; 10 tokens, then calls
of 5, 5 and 3 rows. It prints the largest logit difference of rows 10.. between the ways and
whether their argmaxes agree. specrt bench's llama.cpp peers make the F32 GGUF of the SmolLM2
target (in $SPECRT_CACHE/llamacpp/) and keep the wheel's Q4_1 (in $SPECRT_CACHE/smollm2-gguf/).
"""

from __future__ import annotations

import sys

import numpy as np

IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3717, 30, 2, 198, 1, 520, 9531, 198, 22503, 314,
       253, 1398, 282]


def logits(path: str, calls: list[int], threads: int = 2) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=256, n_threads=threads, n_threads_batch=threads, n_batch=64,
                logits_all=True, verbose=False)
    i = 0
    for n in calls:
        llm.eval(IDS[i:i + n])
        i += n
    return np.array(llm.scores[:len(IDS)])


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/exp_llamacpp_rows.py GGUF [GGUF ...]", file=sys.stderr)
        return 2
    for path in argv:
        one = logits(path, [len(IDS)])
        rows1 = logits(path, [10] + [1] * (len(IDS) - 10))
        rows5 = logits(path, [10, 5, 5, 3])
        print(path)
        for name, x in (("one token a call", rows1), ("calls of 5 rows", rows5)):
            d = float(np.abs(x[10:] - one[10:]).max())
            same = bool(np.array_equal(x[10:].argmax(1), one[10:].argmax(1)))
            print(f"  {name:17s} vs the whole prompt in one call: max |dlogit| {d:.3g}, argmax equal {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
