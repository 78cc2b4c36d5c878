"""serve's memory and prefix reuse when clients mix decoding modes: chat requests cycling six
temperatures (0, 0.3 .. 1.1, seed 1) over five prompts sharing the chat preamble, 24 tokens
each, against `specrt serve ENGINES` started on a free port; prints the server's resident
memory (end and peak, sampled after each answer), the median prompt tokens reused, the tokens
generated and the medians of the first-token time and tokens/s.

    .venv/bin/python tools/exp_serve_modes.py ENGINES [REQUESTS]

Until session 56 each mode had a generator and KV caches of its own (1137-1278 MB, 0 reused
on the demo's engines); since, one generator serves every mode (896-910 MB, 29 reused)."""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

engines, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 36
specrt = str(Path(sys.executable).with_name("specrt"))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
p = subprocess.Popen([specrt, "serve", engines, "--port", str(port)], stderr=subprocess.PIPE, text=True)
try:
    for line in p.stderr:
        if "serving" in line:
            break
    else:
        sys.exit(f"serve ended before serving (exit {p.wait()})")
    def drain() -> None:  # its log read on and dropped (a line a request: a full pipe would stop the
        for _ in p.stderr:  # server mid-request; a list of the lines would grow with them)
            pass

    threading.Thread(target=drain, daemon=True).start()

    def rss_mb() -> int:
        status = Path(f"/proc/{p.pid}/status").read_text().splitlines()
        return int(next(x for x in status if x.startswith("VmRSS")).split()[1]) // 1024

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    temperatures = [0, 0.3, 0.5, 0.7, 0.9, 1.1]
    peak, t0, reused, tokens, first, rates = 0, time.time(), [], 0, [], []
    for i in range(n):
        body = {"messages": [{"role": "user", "content": f"Tell me about topic {i % 5}"}], "max_tokens": 24,
                "temperature": temperatures[i % 6], "seed": 1}
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        r = json.loads(urllib.request.urlopen(req, timeout=300).read())
        reused.append(r["specrt"]["prefix_reused"])
        tokens += r["usage"]["completion_tokens"]
        first.append(r["specrt"]["first_token_s"])
        rates.append(r["specrt"]["tokens_per_s"])
        peak = max(peak, rss_mb())

    def median(x):
        return sorted(x)[len(x) // 2]

    print(f"{n} requests in {time.time() - t0:.1f} s: RSS {rss_mb()} MB at the end, peak {peak} MB; "
          f"{median(reused)} prompt tokens reused (median), {tokens} tokens, first token {median(first):.3f} s, "
          f"{median(rates):.1f} tok/s (medians)")
finally:
    p.terminate()
    p.wait()
