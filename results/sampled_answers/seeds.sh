#!/usr/bin/env bash
# A and B again with train_peagle --seed 1 (other batch draws): how far one seed moves held-out tau
set -u
cd /work/main
D=out/s48/data
arm() {  # name files...
    local name=$1; shift
    .venv/bin/python tools/train_peagle.py --init fixtures/peagle-smollm2 --chat "$@" --train-head --lr 4e-4 \
        --max-steps 450 --slots 1536 --threads 2 --budget-minutes 80 --eval-reserve-minutes 3 --seed 1 \
        --out out/s48/$name > out/s48/$name.log 2>&1
    echo "$name exited $? at $(date +%T)"
}
while ! grep -q "^real" /tmp/ci48.log; do sleep 15; done  # after .ci/run in /tmp/ci48
date +%T
arm A-s1 $D/greedy.jsonl
arm B-s1 $D/greedy.jsonl $D/sampled.jsonl
arm C-s1 $D/greedy.jsonl $D/greedy2.jsonl
.venv/bin/python tools/eval_draft.py out/s48/A-s1 out/s48/B-s1 out/s48/C-s1 -o out/s48/eval_seed1.json > out/s48/eval_seed1.txt 2>&1
.venv/bin/python tools/eval_draft.py out/s48/A-s1 out/s48/B-s1 out/s48/C-s1 \
    --subset results/device_draft/heldout_split.json:clean -o out/s48/eval_seed1_clean49.json > out/s48/eval_seed1_clean49.txt 2>&1
echo "all done at $(date +%T)"
