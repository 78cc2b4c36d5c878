#!/usr/bin/env bash
# The README's test command: set up .venv on a fresh machine, then run the whole suite.
# Extra arguments go to pytest (e.g. `bash tools/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first and pinned: 2.13.0 is the CPU build on this machine's disk; an unpinned
# torch (asked for by anything) would pull a CUDA build of several GB.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[export,dev]"
exec .venv/bin/python -m pytest "$@"
