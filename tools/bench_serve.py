"""What `specrt serve` adds on top of the Python API: the same prompts answered through
`Session.stream` directly and through the server over HTTP (streamed, server-sent events
read by a plain `urllib` client), in one process, taking turns prompt by prompt.

    python tools/bench_serve.py out/demo/engines --prompts tools/data/heldout_prompts.jsonl \
        --limit 10 --max-new-tokens 128 --governor fixed:2:tree=3 [--out results/serve]

Each path has a session of its own on the same engines folder, with prefix reuse as
shipped (every prompt is a different conversation; they share the chat template's system
prompt on both paths alike) and a governor whose choices do not depend on measured times
(a fixed depth by default), so that both paths run the same rounds and must give the
same text (checked). Printed: medians over the prompts of the time to the first text and of
tokens/s (the stream's wall time, client side, request and parsing included), and the
ratio server / direct. Growth (`auto`'s `:grow`) would make the second path faster on
prompts the first already answered: pass a governor without it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path


def _direct(session, prompt: str, max_new: int) -> tuple[str, float, float, int]:
    t0 = time.perf_counter()
    first, text = None, []
    for piece in session.stream(prompt, chat=True, max_new_tokens=max_new):
        first = first if first is not None else time.perf_counter() - t0
        text.append(piece)
    wall = time.perf_counter() - t0
    return "".join(text), first or wall, wall, len(session.stats()["output_token_ids"])


def _served(url: str, prompt: str, max_new: int) -> tuple[str, float, float, int]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_new, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first, text, usage = None, [], None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[len(b"data: "):])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                piece = c.get("delta", {}).get("content")
                if piece:
                    first = first if first is not None else time.perf_counter() - t0
                    text.append(piece)
    wall = time.perf_counter() - t0
    return "".join(text), first or wall, wall, usage["completion_tokens"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engines")
    ap.add_argument("--prompts", default="tools/data/heldout_prompts.jsonl")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--governor", default="fixed:2:tree=3")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    prompts = [json.loads(x)["prompt"] for x in Path(a.prompts).read_text().splitlines() if x.strip()][: a.limit]
    app = Server(Path(a.engines), a.governor, SamplingParams(), a.max_new_tokens, "bench", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    rows = []
    try:
        with Session(a.engines, governor=a.governor) as direct:
            _direct(direct, "Hello", 4), _served(url, "Hello", 4)  # warm both paths
            for i, p in enumerate(prompts):
                order = ("direct", "served") if i % 2 == 0 else ("served", "direct")
                got = {}
                for path in order:
                    got[path] = _direct(direct, p, a.max_new_tokens) if path == "direct" else \
                        _served(url, p, a.max_new_tokens)
                (dt, df, dw, dn), (st, sf, sw, sn) = got["direct"], got["served"]
                rows.append({"prompt": i, "same_text": dt == st, "tokens": [dn, sn], "first_s": [df, sf],
                             "wall_s": [dw, sw], "tokens_per_s": [dn / dw, sn / sw]})
                print(f"prompt {i}: direct {dn / dw:.1f} tok/s (first {df:.3f} s), served {sn / sw:.1f} tok/s "
                      f"(first {sf:.3f} s), same text: {dt == st}", flush=True)
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()
    med = {k: [statistics.median(r[k][j] for r in rows) for j in (0, 1)] for k in ("first_s", "tokens_per_s")}
    summary = {"governor": a.governor, "prompts": len(rows), "max_new_tokens": a.max_new_tokens,
               "same_text": sum(r["same_text"] for r in rows),
               "median_first_s": {"direct": med["first_s"][0], "served": med["first_s"][1]},
               "median_tokens_per_s": {"direct": med["tokens_per_s"][0], "served": med["tokens_per_s"][1]},
               "served_over_direct_tokens_per_s": statistics.median(r["tokens_per_s"][1] / r["tokens_per_s"][0]
                                                                    for r in rows),
               "served_minus_direct_first_s": statistics.median(r["first_s"][1] - r["first_s"][0] for r in rows)}
    print(json.dumps(summary, indent=1))
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "bench_serve.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
