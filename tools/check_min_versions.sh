#!/usr/bin/env bash
# Are pyproject.toml's floors true? Two venvs with the lowest version each runtime dependency
# admits, parsed from [project].dependencies ("name>=X" installs name==X):
# 1. .venv-min-runtime: those alone, no torch or transformers, on the lowest Python 3 found that
#    requires-python admits (python3.10 where it is installed), running tests that need neither;
# 2. .venv-min: those, then what the tests need (dev's and export's floors: torch, transformers,
#    pytest, hypothesis, jinja2, polygraphy), where pip raises what transformers needs (tokenizers, safetensors,
#    jinja2): a fast subset of the suite. The versions run are printed before each.
# Usage: bash tools/check_min_versions.sh [PYTEST ARGS for venv 2]  (on 2 busy cores: 5 min 16 s with
# new venvs, 1 min 15 s again). Not in CI: run it by hand after raising or adding a floor.
set -euo pipefail
cd "$(dirname "$0")/.."
# pyproject.toml is read with tomllib, Python 3.11 or later: python3 where it is, else python3.11-3.13
# (a python3 of 3.10, the floor, failed here with a traceback)
toml_py=
for c in python3 python3.13 python3.12 python3.11; do
  if "$c" -c 'import tomllib' > /dev/null 2>&1; then toml_py=$c; break; fi
done
[ -n "$toml_py" ] || { echo "error: reading pyproject.toml needs Python 3.11 or later (tomllib); python3 here is" \
  "$(python3 --version 2>&1): put python3.11 or later on PATH" >&2; exit 1; }
pins() {  # pins() EXTRA...: "name==floor" per requirement of [project] (and the extras named)
  "$toml_py" - "$@" <<'EOF'
import re, sys, tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = list(p["dependencies"]) + [r for x in sys.argv[1:] for r in p["optional-dependencies"][x]]
floors = {}
for r in reqs:
    m = re.fullmatch(r"([A-Za-z0-9._-]+)\s*(?:(>=|==)\s*([0-9][^,;\s]*))?\s*(?:,.*)?", r.strip())
    if not m or not m[2]:
        sys.exit(f"{r!r}: no floor (>= or ==) to install")
    name = m[1].lower().replace("_", "-")
    key = lambda v: tuple(int(x) for x in re.findall(r"\d+", v))  # noqa: E731
    floors[name] = max(floors.get(name, m[3]), m[3], key=key)
print(" ".join(f"{n}=={v}" for n, v in floors.items()))
EOF
}
install() {  # install VENV PACKAGE...
  local venv=$1
  shift
  "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: "$@"
}
versions() {
  "$1/bin/pip" freeze | grep -iE '^(click|numpy|onnx|onnxruntime|onnx.ir|safetensors|tokenizers|jinja2)==|'\
'^(torch|transformers|polygraphy|pytest|hypothesis)==' | tr '\n' ' '
}
floor_py=$("$toml_py" -c 'import re, tomllib
print(re.sub(r"[^0-9.]", "", tomllib.load(open("pyproject.toml", "rb"))["project"]["requires-python"]))')
py=python3  # else python3.10 or pyenv's 3.10.x, where either runs
for c in "python$floor_py" "$HOME"/.pyenv/versions/"$floor_py".*/bin/python; do
  if "$c" --version > /dev/null 2>&1; then py=$c; break; fi
done
runtime_pins=$(pins)
test_pins=$(pins export dev | tr ' ' '\n' | grep -E '^(torch|transformers|pytest|hypothesis|jinja2|polygraphy)==' \
  | tr '\n' ' ')
tests_pytest=$(echo "$test_pins" | tr ' ' '\n' | grep -E '^(pytest|hypothesis)==' | tr '\n' ' ')

rt=${SPECRT_MIN_VENV:-.venv-min}-runtime
[ -x "$rt/bin/python" ] || "$py" -m venv "$rt"
# shellcheck disable=SC2086
install "$rt" $runtime_pins $tests_pytest  # pip says here if the floors contradict each other
"$rt/bin/pip" install -q --disable-pip-version-check --no-deps -e .
echo "1. runtime floors, $("$rt/bin/python" --version): $(versions "$rt")"
SPECRT_THP=0 "$rt/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/runtime/test_no_torch.py tests/runtime/test_kvcache.py tests/runtime/test_sampling.py \
  tests/runtime/test_governor.py tests/runtime/test_verify.py

venv=${SPECRT_MIN_VENV:-.venv-min}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# shellcheck disable=SC2086
install "$venv" $runtime_pins
# shellcheck disable=SC2086
install "$venv" $test_pins  # torch's pin is the CPU build on this machine's disk
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e .
"$venv/bin/pip" check
echo "2. floors with the tests' packages: $(versions "$venv")"
[ $# -gt 0 ] || set -- \
  tests/runtime/test_calibrate.py::test_calibrate_measures_the_runner_ups_where_the_engines_verify_trees \
  tests/engines/test_inplace.py tests/engines/test_quantize.py tests/cli/test_full_disk.py \
  tests/export/test_config.py tests/export/test_graph_parity.py::test_target_kv_is_transformers_cache
SPECRT_THP=0 exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" "$@"
