#!/usr/bin/env bash
# the three continuations of tools/exp_sampled_answers.py (session 48), one after another
set -u
cd /work/main
D=out/s48/data
arm() {  # name threads files...
    local name=$1 threads=$2; shift 2
    .venv/bin/python tools/train_peagle.py --init fixtures/peagle-smollm2 --chat "$@" --train-head --lr 4e-4 \
        --max-steps 450 --slots 1536 --threads "$threads" --budget-minutes 80 --eval-reserve-minutes 3 \
        --out out/s48/$name > out/s48/$name.log 2>&1
    echo "$name exited $? at $(date +%T)"
}
date +%T
arm A 1 $D/greedy.jsonl
while [ "$(wc -l < $D/sampled.jsonl 2>/dev/null || echo 0)" -lt 600 ]; do sleep 20; done
arm B 2 $D/greedy.jsonl $D/sampled.jsonl
arm C 2 $D/greedy.jsonl $D/greedy2.jsonl
.venv/bin/python tools/eval_draft.py fixtures/peagle-smollm2 out/s48/A out/s48/B out/s48/C -o out/s48/eval_all.json > out/s48/eval_all.txt 2>&1
.venv/bin/python tools/eval_draft.py fixtures/peagle-smollm2 out/s48/A out/s48/B out/s48/C \
    --subset results/device_draft/heldout_split.json:clean -o out/s48/eval_clean49.json > out/s48/eval_clean49.txt 2>&1
echo "all done at $(date +%T)"
