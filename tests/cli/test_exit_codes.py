"""Every bad input exits 1 without a traceback, click's own usage errors included."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specrt.cli import main


@pytest.mark.parametrize("args, message", [
    (["build", "{tmp}/missing", "-o", "{tmp}/out"], "is not a folder"),  # a callback's BadParameter
    (["run", "{tmp}", "--prompts", "{tmp}/missing.jsonl", "--prompt", "x"], "does not exist"),  # click.Path
    (["run", "{tmp}", "--bogus"], "No such option"),  # an unknown option
    (["nosuchcommand"], "No such command"),
    (["build"], "Missing argument"),
])
def test_usage_errors_exit_1(tmp_path, args, message):
    r = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 1, r.output
    assert message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_user_errors_exit_1(tmp_path):
    r = CliRunner().invoke(main, ["compare", str(tmp_path)])
    assert r.exit_code == 1 and "no engines.json" in r.output, r.output


def test_help_and_version_exit_0():
    for args in (["--help"], ["build", "--help"], ["--version"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, (args, r.output)
        assert "Usage" in r.output or "specrt" in r.output
