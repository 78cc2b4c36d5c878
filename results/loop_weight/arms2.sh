#!/usr/bin/env bash
# session 49: C of results/sampled_answers again with other loss weights (stage 8 continued, 450 steps);
# each argument: "NAME SEED extra train_peagle options..."; waits for a running arm first
set -u
cd /work/main
D=out/s48/data
while pgrep -f "tools/train_peagle.py" > /dev/null; do sleep 15; done
for spec in "$@"; do
    set -- $spec
    name=$1 seed=$2; shift 2
    .venv/bin/python tools/train_peagle.py --init fixtures/peagle-smollm2 --chat $D/greedy.jsonl $D/greedy2.jsonl \
        --train-head --lr 4e-4 --max-steps 450 --slots 1536 --threads 2 --budget-minutes 80 --eval-reserve-minutes 3 \
        --seed "$seed" "$@" --out out/s49/$name > out/s49/$name.log 2>&1
    echo "$name exited $? at $(date +%T)"
done
echo "all done at $(date +%T)"
