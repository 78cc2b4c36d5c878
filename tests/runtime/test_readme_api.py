"""The README's Python API example runs as written (on a tiny pair's engines)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.runtime.test_text import worded  # noqa: F401  (the fixture: a word-level tiny pair)

README = Path(__file__).resolve().parents[2] / "README.md"


def _example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- python-api: [^>]*-->\n```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its python-api example"
    return m.group(1)


def test_the_readme_python_example_runs(worded, capsys):  # noqa: F811
    code = _example()
    assert code.count('"out/engines"') == 2  # the folder the Pipeline commands build
    exec(compile(code.replace('"out/engines"', repr(str(worded))), "README.md", "exec"), {})
    out = capsys.readouterr().out
    m = re.search(r"\n(\d+) tokens, [\d.]+ tok/s, tau ([\d.]+) \(the draft's rounds\), ([\d.]+) tokens a target "
                  r"call \(lookup's rounds too\)\n", out)
    assert m and int(m.group(1)) == 64 and float(m.group(2)) >= 1.0 and float(m.group(3)) >= 1.0, out
    # the sampled conversation printed its text after the greedy one's stats line
    assert out[m.end():].strip(), out


def test_the_files_later_commands_add_are_those_the_readme_names():
    # kills C39, C41 (mutation round 68: contracts.py's CALIBRATION_FILE or CORPUS_FILE renamed; every reader and
    # writer spells the constant, so the suite passed, while the README sends users to these files and an
    # engines folder calibrated or given a corpus before was read as having none)
    from specrt import contracts as C

    text = README.read_text()
    for name in (C.CALIBRATION_FILE, C.CORPUS_FILE):
        assert f"ENGINES/{name}" in text, name
