#!/usr/bin/env bash
# Every benchmark behind the README's results table, in one go, on SmolLM2-135M-Instruct
# and the committed P-EAGLE draft (ONNX Runtime, CPU). Run it on an otherwise idle machine:
# the figures are ratios measured in one run, but a busy machine still blurs them.
#
#   bash tools/bench_all.sh [OUT]        # default OUT=out/bench-all; reports under results/
#
# Steps (each prints what it measured):
#   1. export, and three engine sets from it: the default build (target re-lowered with
#      in-place KV), --ort-kv append (the export's portable graph, TensorRT's contract) and
#      --draft-weights int8 (the default build with an int8 draft, the form faster here);
#   2. DSpark calibration on tools/data/calibration_prompts.jsonl, evaluated on the
#      held-out prompts (results/calibration_report.json; every run, since step 1's build
#      --force drops the old one); SPECRT_CALIBRATION=FILE copies a calibration.json made
#      the same way on other engines of this export instead;
#   3. tools/bench_engines.py: verify latency per depth vs depth 1 at contexts 128 and 512,
#      allocation per step, RSS; in-place vs onnxruntime-genai vs sleeping threads vs append vs
#      a plain session, the variants run in turn three times (results/engines.txt); then
#      tools/bench_gemm_rows.py: MatMul time per row count, where depths step up on this CPU
#      (results/gemm_rows.txt); SPECRT_BENCH_ENGINES=0 skips this step (5 minutes; its figures
#      depend on the graphs' shapes, not on the draft's weights, so a new draft of the same
#      shape leaves them as they were);
#   4. specrt bench: every governor (with prompt lookup, `dspark:tree=3:ngram`, the demo's, and
#      `auto`, the default) vs onnxruntime-genai and transformers, peers' threads
#      matched to specrt's, and the same governors on the int8-draft engines (--variant int8),
#      every worker as 3 processes taking the prompts in turn (--processes 3), so that no
#      one process's memory placement decides a ratio between workers (results/bench/);
#   5. tools/bench_governors.py: DSpark vs every fixed depth vs adaptive, per prompt kind,
#      each prompt 3 times per governor, the median kept (results/governors/; one run each
#      let single slow runs decide kinds: 0.976x vs 1.032x mixed on the same engines);
#   6. tools/bench_runtime.py: best fixed depth vs no speculation, Python share, peak RSS of
#      `specrt run` vs weights + KV (results/runtime/);
#   7. specrt compare against the export graphs and against transformers, the int8 draft's
#      engines within its int8 bounds, and a copy with one weight changed
#      (tools/corrupt_engine.py), which must fail (results/compare/).
set -euo pipefail
# (without these `--help` ran every benchmark into a folder named --help)
usage="usage: bash tools/bench_all.sh [OUT]  (default out/bench-all, in the checkout; reports under results/)"
case "${1:-}" in
  -h|--help) echo "$usage"; exit 0 ;;
  -*) printf 'error: %s is no option of it\n%s\n' "$1" "$usage" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { printf 'error: one OUT folder: got %s arguments\n%s\n' $# "$usage" >&2; exit 2; }
# SPECRT_BENCH_ENGINES=0 skips the engine step; "off" or "false" ran it (as SPECRT_THP's
# spellings are taken): those taken too, anything else refused before the work
bench_engines=${SPECRT_BENCH_ENGINES:-1}
bench_engines=${bench_engines// /}
# (in any case: nocasematch, bash 3.1's; ${var,,} needs bash 4, and macOS's bash 3.2 failed here)
shopt -s nocasematch
case "$bench_engines" in
  0|false|no|off) bench_engines=0 ;;
  1|true|yes|on) bench_engines=1 ;;
  *) printf 'error: SPECRT_BENCH_ENGINES=%s: expected 0 (or false, no, off) to skip the engine step, or 1\n' \
       "$SPECRT_BENCH_ENGINES" >&2; exit 2 ;;
esac
shopt -u nocasematch
cd "$(dirname "$0")/.."
OUT=${1:-out/bench-all}
PY=.venv/bin/python
SPECRT=.venv/bin/specrt
[ -x $SPECRT ] || { echo "error: $SPECRT missing: run bash tools/test.sh once (it creates the venv)" >&2; exit 1; }
$PY -m pip install -q --disable-pip-version-check -e ".[export,demo,bench]"
TARGET=$($PY tools/smollm2.py)
mkdir -p "$OUT" results
stamp() { echo "[bench_all] $(date +%T) $*"; }
# wait (up to 3 minutes) for the 1-minute load to fall below 1: the previous step's
# spinning threads keep it near 2 for a while, and specrt bench warns on a busy machine
settle() { for _ in $(seq 60); do awk '{exit !($1 < 1.0)}' /proc/loadavg && return 0; sleep 3; done; }
# FILE CMD...: CMD's output shown and kept in FILE, which is replaced only when CMD succeeds
# (a tee straight into a tracked results file truncated it at the start of a failing step)
keep() { local f=$1; shift; "$@" 2>&1 | tee "$f.part"; mv "$f.part" "$f"; }

stamp "export + build"
# exported again whenever the committed draft changed (an old export benchmarked the old draft)
DRAFT_SHA=$(cat fixtures/peagle-smollm2/config.json fixtures/peagle-smollm2/model.safetensors | sha256sum | cut -c1-64)
if [ ! -f "$OUT/export/export.json" ] || [ "$(cat "$OUT/export.draft-sha256" 2>/dev/null)" != "$DRAFT_SHA" ]; then
  $SPECRT export "$TARGET" --draft fixtures/peagle-smollm2 -o "$OUT/export" --force
  echo "$DRAFT_SHA" > "$OUT/export.draft-sha256"
fi
$SPECRT build "$OUT/export" --depths 1,2,3,4,6,8 --max-context 1024 -o "$OUT/engines" --force
$SPECRT build "$OUT/export" --depths 1,2,3,4,6,8 --max-context 1024 -o "$OUT/engines-append" --force \
  --ort-kv append --no-canary
$SPECRT build "$OUT/export" --depths 1,2,3,4,6,8 --max-context 1024 -o "$OUT/engines-int8" --force \
  --draft-weights int8 --no-canary

if [ -n "${SPECRT_CALIBRATION:-}" ]; then
  # a calibration.json made by `specrt calibrate` on other engines of the same export (the
  # runtime checks the export digest); its report is the one to keep in results/
  stamp "calibration copied from $SPECRT_CALIBRATION"
  cp "$SPECRT_CALIBRATION" "$OUT/engines/calibration.json"
else
  stamp "calibrate"
  $SPECRT calibrate "$OUT/engines" --prompts tools/data/calibration_prompts.jsonl \
    --holdout-prompts tools/data/heldout_prompts.jsonl --chat --max-new-tokens 128 \
    --report results/calibration_report.json
fi
# the int8 draft's engines use the same calibration (same export; the runtime checks its digest)
cp "$OUT/engines/calibration.json" "$OUT/engines-int8/calibration.json"

if [ "$bench_engines" = 0 ]; then
  stamp "engines and MatMul rows skipped (SPECRT_BENCH_ENGINES=0): results/engines.txt and gemm_rows.txt kept"
else
settle
stamp "engines: latency per depth, in-place vs append vs plain"
keep results/engines.txt $PY tools/bench_engines.py --engines "$OUT/engines" --append-engines "$OUT/engines-append" \
  --variants shared,4k-pages,ortgenai,sleeping,append,plain --contexts 128,512 --depths 1,2,4,8 --rounds 3 --repeats 10 \
  --steps 200 --passes 3

stamp "MatMul time per row count (where verify depths step up on this CPU)"
keep results/gemm_rows.txt $PY tools/bench_gemm_rows.py --export "$OUT/export"
fi

settle
stamp "specrt bench against the peers"
# results/bench/summary.txt is this step's printed table; specrt bench replaces its -o folder
# whole and refuses one holding files it does not write, so the table is kept aside while it
# runs and written back (the new one, or on a failure the old one beside the old report)
[ ! -f results/bench/summary.txt ] || mv results/bench/summary.txt "$OUT/bench-summary.before"
if $SPECRT bench "$OUT/engines" --prompts tools/data/heldout_prompts.jsonl --chat --limit 10 --max-new-tokens 128 \
  --governors off,fixed:1,fixed:2,fixed:3,fixed:2:tree=3,adaptive,dspark,dspark:tree=3,dspark:tree=3:ngram,auto \
  --variant int8="$OUT/engines-int8" --processes 3 --force -o results/bench | tee "$OUT/bench-summary.txt"; then
  mv "$OUT/bench-summary.txt" results/bench/summary.txt
else
  [ ! -f "$OUT/bench-summary.before" ] || mv "$OUT/bench-summary.before" results/bench/summary.txt
  echo "[bench_all] specrt bench failed: results/bench left as it was" >&2
  exit 1
fi

settle
stamp "governors per prompt kind"
$PY tools/bench_governors.py --engines "$OUT/engines" --per-kind 4 --max-new-tokens 128 --repeats 3 --out results/governors
settle
stamp "runtime: speculation vs none, Python share, peak RSS"
$PY tools/bench_runtime.py "$OUT/engines" --depths 1,2 -o results/runtime
stamp "compare"
mkdir -p results/compare
keep results/compare/smollm2_vs_onnxruntime.txt \
  $SPECRT compare "$OUT/engines" --report results/compare/smollm2_vs_onnxruntime.json
keep results/compare/smollm2_vs_torch.txt \
  $SPECRT compare "$OUT/engines" --reference torch --report results/compare/smollm2_vs_torch.json
keep results/compare/smollm2_int8_draft_vs_onnxruntime.txt \
  $SPECRT compare "$OUT/engines-int8" --report results/compare/smollm2_int8_draft_vs_onnxruntime.json
rm -rf "$OUT/engines-corrupted"
$PY tools/corrupt_engine.py "$OUT/engines" "$OUT/engines-corrupted" | tee results/compare/smollm2_corrupted.txt
if $SPECRT compare "$OUT/engines-corrupted" --report results/compare/smollm2_corrupted.json \
    >> results/compare/smollm2_corrupted.txt 2>&1; then
  echo "error: the corrupted engine passed the comparison" >&2; exit 1
fi
tail -1 results/compare/smollm2_corrupted.txt
stamp "done"
