#!/usr/bin/env bash
# session 50: engines for the committed draft and its vocabulary grown (tools/grow_draft.py --vocab), then
# their cost tables measured again in turn, three rounds (specrt profile --repeats 20)
set -eu
cd /work/main
TARGET=$(.venv/bin/python tools/smollm2.py)
for n in 8192 16384 32768 49152; do
    d=out/s50/grown-$n; [ $n = 8192 ] && d=fixtures/peagle-smollm2
    .venv/bin/specrt export "$TARGET" --draft $d -o out/s50/b$n/export --force > out/s50/b$n.log 2>&1
    .venv/bin/specrt build out/s50/b$n/export --backend onnxruntime --depths 1,2,3,4 --max-context 1024 \
        -o out/s50/b$n/engines --force --draft-weights int8 >> out/s50/b$n.log 2>&1
    echo "built $n at $(date +%T)"
done
for round in 1 2 3; do
    for n in 8192 16384 32768 49152; do
        .venv/bin/specrt profile out/s50/b$n/engines --repeats 20 > /dev/null 2>&1
        .venv/bin/python -c "
import json,sys; c=json.load(open('out/s50/b$n/engines/engines.json'))['costs']
print('round $round', $n, 'decode %.2f ms' % (1e3*c['decode']), 'draft_by_depth', {k: round(1e3*v, 3) for k, v in c['draft_by_depth'].items()}, 'verify', {k: round(1e3*v, 2) for k, v in c['verify'].items()})"
    done
done
echo "done at $(date +%T)"
