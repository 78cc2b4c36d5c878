"""Export benchmark: wall time and peak RSS of `specrt export` on SmolLM2-135M with a draft.

    .venv/bin/python tools/bench_export.py [--draft DIR]

The draft defaults to the committed fixtures/peagle-smollm2 when present, else a random
P-EAGLE draft of the target's width (tests/fixtures_models.write_tiny_draft). The export
runs in a child process, its peak RSS its own: ru_maxrss of the child where it exceeds this
process's high-water mark (Linux carries a spawning process's into the child across exec), else
the child's VmHWM polled while it runs. Targets (issue 3):
<= 90 s and peak RSS <= 2.5x the fp32 weight bytes of target + draft.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, default=None)
    args = ap.parse_args()
    from tests.real_model import committed_draft, smollm2_folder

    target = smollm2_folder()
    work = Path(tempfile.mkdtemp(prefix="specrt-bench-export-"))
    draft = args.draft
    if draft is None and (committed_draft() / "config.json").is_file():
        draft = committed_draft()
    if draft is None:
        from tests.fixtures_models import write_tiny_draft

        draft = write_tiny_draft(work / "draft", target, kind="peagle", num_layers=1, draft_vocab=8192,
                                 mask_token_id=0)
        print(f"draft: random P-EAGLE of the target's width at {draft}")
    else:
        print(f"draft: {draft}")
    from specrt.export.binding import bind_draft, bind_target

    t = bind_target(target)
    d = bind_draft(draft, t)
    weight_bytes = 4 * sum(int(__import__("numpy").prod(b.entry.shape)) for b in [*t.slots.values(), *d.slots.values()])
    t.reader.close(), d.reader.close()
    out = work / "export"
    from tools.bench_runtime import child_peak_rss

    t0 = time.perf_counter()
    peak, rc = child_peak_rss([sys.executable, "-m", "specrt.cli", "export", str(target), "--draft", str(draft),
                               "-o", str(out)])
    if rc != 0:
        raise SystemExit(f"specrt export failed (exit {rc})")
    wall = time.perf_counter() - t0
    print(f"export wall time: {wall:.1f} s (target <= 90 s)")
    print(f"fp32 weight bytes (target + draft): {weight_bytes / 2**20:.0f} MiB")
    print(f"peak RSS: {peak / 2**20:.0f} MiB = {peak / weight_bytes:.2f}x weights (target <= 2.5x)")


if __name__ == "__main__":
    main()
