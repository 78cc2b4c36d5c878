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


def test_the_python_names_the_readme_cites_inline_exist():
    """The API the README's prose shows outside its example (r76e's audit: no test read them):
    every keyword of a `Session(...)`, `Session.stream(..., k=...)` or `SamplingParams(...)` it
    writes is a parameter, every `Session.X` / `Generator.X` it names exists, and so do the
    module-level names it sends a reader to. A README keyword misspelt (`prompt_logprob=N`) or a
    name renamed in the code without the README (Generator.owner) fails it."""
    import inspect

    from specrt import cmd_serve, errors
    from specrt.export import config, slots
    from specrt.runtime import generate, text, verify
    from specrt.runtime.sampling import SamplingParams
    from specrt.runtime.session import Session

    readme = " ".join(README.read_text().split())  # a call may wrap across lines
    calls = {"Session": Session.__init__, "Session.stream": Session.stream, "SamplingParams": SamplingParams}
    seen = 0
    for m in re.finditer(r"`(Session|Session\.stream|SamplingParams)\(([^`)]*)\)", readme):
        for kw in re.findall(r"(\w+)=", m.group(2)):
            assert kw in inspect.signature(calls[m.group(1)]).parameters, m.group(0)
            seen += 1
    gen_source = inspect.getsource(generate.Generator)
    for cls, name in re.findall(r"`(Session|Generator)\.(\w+)`", readme):
        assert hasattr(Session if cls == "Session" else generate.Generator, name) or \
            re.search(rf"self\.{name}\b[^=\n]*=", gen_source), f"{cls}.{name}"  # an attribute __init__ sets
        seen += 1
    assert seen >= 12, seen
    for mod, name in ((generate, "PREFILL_CHUNK"), (generate, "DRAFT_CHUNK"), (text, "REASONING_FIELDS"),
                      (config, "load_eagle_config"), (slots, "eagle_rows"), (verify, "verify_coupled"),
                      (errors, "UserError"), (errors, "EngineFailure"), (cmd_serve, "MAX_MODES")):
        assert hasattr(mod, name) and re.search(rf"\b{name}\b", readme), name
