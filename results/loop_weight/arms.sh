#!/usr/bin/env bash
# session 49: C of results/sampled_answers again with --loop-weight W (stage 8 continued, 450 steps)
set -u
cd /work/main
D=out/s48/data
arm() {  # name seed weight [loop depth]
    .venv/bin/python tools/train_peagle.py --init fixtures/peagle-smollm2 --chat $D/greedy.jsonl $D/greedy2.jsonl \
        --train-head --lr 4e-4 --max-steps 450 --slots 1536 --threads 2 --budget-minutes 80 --eval-reserve-minutes 3 \
        --seed "$2" --loop-weight "$3" ${4:+--loop-depth $4} --out out/s49/$1 > out/s49/$1.log 2>&1
    echo "$1 exited $? at $(date +%T)"
}
date +%T
for a in "$@"; do arm $a; done
echo "all done at $(date +%T)"
