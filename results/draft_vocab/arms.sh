#!/usr/bin/env bash
# session 50: stage 8 with a grown draft vocabulary (--grow-vocab) and/or its head alone trained
# each argument: "NAME SEED LR extra train_peagle options..."; waits for a running arm first
set -u
cd /work/main
D=out/s48/data
while pgrep -f "tools/train_peagle.py" > /dev/null; do sleep 15; done
for spec in "$@"; do
    set -- $spec
    name=$1 seed=$2 lr=$3; shift 3
    .venv/bin/python tools/train_peagle.py --init fixtures/peagle-smollm2 --chat $D/greedy.jsonl $D/greedy2.jsonl \
        --vocab-answers fixtures/peagle-data/chat*.jsonl.gz \
        --train-head --lr "$lr" --max-steps 450 --slots 1536 --threads 2 --budget-minutes 80 --eval-reserve-minutes 3 \
        --seed "$seed" "$@" --out out/s50/$name > out/s50/$name.log 2>&1
    echo "$name exited $? at $(date +%T)"
done
echo "all done at $(date +%T)"
