"""Host time of one engine call outside the engine: ``Runner.infer`` with the session's
run replaced by a no-op, so what is left is specrt's own per-call work (checking the
feeds, binding inputs and outputs, assembling the result).

    .venv/bin/python tools/bench_call_overhead.py ENGINES [--calls 3000] [--past 128]

Feeds are laid out as the runtime's are: the target's KV cache buffers are the same
arrays at every call (in-place KV; views of one buffer per layer with ``--ort-kv
append``), input_ids and position_ids new arrays each call. Prints the median over five
batches of microseconds per call for the decode step and every verify depth.

ONNX Runtime engines only (it swaps the runner's session). Measured 2026-12-01 on the
2-core AVX-512 VM (out/bench-v10/engines, in-place KV, 62 inputs, past 128): decode /
verify 218 / 204-288 us a call before the runner kept the arrays it had checked and bound
(engines/base.py ``check_feeds``, engines/onnxruntime.py ``infer_impl``), 53 / 63-101 us
after; a decode step there takes ~20-25 ms, so ~0.15-0.2 ms (0.6-0.9%) a target call.
``--ort-kv append`` engines (new views every call) still take 206-261 us.
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engines", type=Path)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--past", type=int, default=128)
    a = ap.parse_args(argv)

    from bench_engines import synthetic_cache
    from specrt import contracts as C
    from specrt.engines import load_engines

    e = load_engines(a.engines, verify=False)
    inplace = e.kv_layout("target") == "inplace"
    e.activate()
    try:
        _, make_feeds = synthetic_cache(e, np.random.default_rng(0), inplace)
        print(f"{a.engines}: {'in-place' if inplace else 'append'} KV, past {a.past}, {a.calls} calls a batch")
        for s in (1, *(d + 1 for d in e.depths)):
            r = e.target(s)
            feeds = make_feeds(s, a.past)
            r.infer(feeds)  # the real engine once: outputs bound, shapes known
            sess, r._sess = r._sess, types.SimpleNamespace(run_with_iobinding=lambda b: None)
            try:
                per = []
                for _ in range(5):
                    t0 = time.perf_counter()
                    for _ in range(a.calls):
                        f = make_feeds(s, a.past) if not inplace else {
                            **feeds, C.INPUT_IDS: np.ones((1, s), np.int64),
                            C.POSITION_IDS: np.arange(a.past, a.past + s, dtype=np.int64)[None]}
                        r.infer(f)
                    per.append((time.perf_counter() - t0) / a.calls)
            finally:
                r._sess = sess
            print(f"  {'decode' if s == 1 else f'verify.{s - 1}'}: {1e6 * float(np.median(per)):.0f} us a call "
                  f"({len(feeds)} inputs)")
    finally:
        e.deactivate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
