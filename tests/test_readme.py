"""README.md against the checkout: the files it cites, the modules its Layout names, the options
(and their defaults) its command listing gives. The Python example runs in
tests/runtime/test_readme_api.py, the serve example in tests/cli/test_serve.py."""

from __future__ import annotations

import re

import click

from tests.real_model import ROOT

TEXT = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", TEXT, re.S | re.M)
    assert m, f"README.md lost its {title!r} section"
    return m.group(1)


def test_every_path_the_readme_cites_exists():
    """A path under results/, tools/, fixtures/, tests/ or the packages that the README sends a
    reader to is in the checkout (a glob: some file matches), and a section of results/README.md
    it names by title or links to is there. Guards moves and renames (r76e's audit found none
    missing; a README citing `results/corpus/grow_*` as `results/corpus/grow*x`,
    `tools/exp_grow.py` as `tools/exp_grow2.py` or the section "Session 35" as "Session 35b"
    fails it)."""
    cited = set(re.findall(r"(?<![\w./~-])((?:results|tools|fixtures|tests|specrt|runtime|export|engines)"
                           r"/[\w.*/-]*[\w*])", TEXT))
    assert len(cited) > 100, len(cited)
    missing = sorted(p for p in cited if not any(ROOT.glob(p)))
    assert not missing, missing
    # and the measurement log's sections it names: results/README.md "Session 35"
    headings = re.findall(r"^#+ (.*)$", (ROOT / "results" / "README.md").read_text(), re.M)
    named = re.findall(r'results/README\.md[)`]*,? \(?"([^"]+)"', " ".join(TEXT.split()))
    assert len(named) >= 5 and not [n for n in named if not any(h.startswith(n) for h in headings)], named
    slugs = {re.sub(r"[^\w -]", "", h.lower()).replace(" ", "-") for h in headings}  # GitHub's anchors
    anchors = re.findall(r"results/README\.md#([\w-]+)", TEXT)
    assert anchors and set(anchors) <= slugs, anchors


def test_the_layout_names_every_module_and_tool():
    """The Layout names each module of the four packages under its folder, and each of tools/'s
    scripts by name or by a glob it gives (bench_*.py). Before r76e's audit it gave most modules
    by topic only (no file of export/ or engines/, of runtime/ only session.py), had no word for
    specrt/'s tool_calls.py, reasoning.py, sampling_options.py, hugepages.py, machine.py or
    launch.py, and left out tools/'s check_min_versions.sh, compare_receipts.py,
    corrupt_engine.py, grow_draft.py, serve_stop_race.py and train_confidence_head.py."""
    layout = _section("Layout")
    entries = dict(re.findall(r"^    (\S+/)\s+(.*?)(?=^    \S|\Z)", layout, re.S | re.M))
    unnamed = []
    for folder in ("specrt/", "export/", "engines/", "runtime/"):
        words = set(re.findall(r"[\w.]+\.py", entries[folder]))
        unnamed += [f"{folder}{p.name}" for p in sorted((ROOT / folder).glob("*.py"))
                    if p.name != "__init__.py" and p.name not in words]
    globs = re.findall(r"[\w*.]+\.(?:py|sh)", entries["tools/"])
    unnamed += [f"tools/{p.name}" for p in sorted((ROOT / "tools").iterdir())
                if p.is_file() and not any(p.match(g) for g in globs)]
    assert not unnamed, unnamed


def test_the_command_listing_gives_real_options_and_their_defaults():
    """The README's command listing has every command; each `specrt COMMAND` line of it (and its
    continuation lines) names options that COMMAND takes, and where it writes `[--option NUMBER]`
    (`--host 127.0.0.1` too) that is the option's default (`specrt COMMAND --help`). Guards renamed
    options and moved defaults (r76e's audit found none; `[--port 8080]` or `[--prefix-snapshot 4]`
    fails it)."""
    from specrt.cli import main

    listing = [block for block in re.split(r"\n(?=    specrt \w)", _section("Pipeline"))
               if re.match(r"    specrt \w", block)]
    checked = defaults = 0
    for block in listing:
        name = re.match(r"    specrt (\w+)", block).group(1)
        block = re.split(r"\n(?!\s{10})", block)[0]  # the command and its indented continuation lines
        cmd = main.commands[name]
        params = {o: p for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        # export's notes name build's --precision, --draft-weights, --target-head; bench's a variant's
        prose = {"--precision", "--draft-weights", "--target-head", "--dtype"} if name in ("export", "bench") else set()
        for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", block):
            assert opt in params or opt in prose, (name, opt)
            checked += 1
        brackets = " ".join(re.findall(r"\[([^][]*)\]", block))  # [--port 8000], [--nmin 3 --nmax 8]
        for opt, value in re.findall(r"(--[a-z-]+) (\d[\d.]*)(?![\d.,])", brackets):
            default = params[opt].default
            assert isinstance(params[opt], click.Option) and str(default) in (value, f"{value}.0"), (name, opt, default)
            defaults += 1
    assert {re.match(r"    specrt (\w+)", b).group(1) for b in listing} == set(main.commands)  # every command listed
    assert checked > 60 and defaults >= 9, (checked, defaults)
