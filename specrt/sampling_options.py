"""The sampling options shared by ``specrt run``, ``bench`` and ``calibrate``, the chat
template's variables (those and ``chat``, ``serve``), and the path arguments' checks
(``PathArg``: every path argument or option; ``existing_folder()``: those naming a folder that
must exist).

    @sampling_options("0 = greedy", seed=None)
    def run(..., temperature, top_p, top_k, seed): ...

Values are checked here, naming the option as typed (``--top-p 0: expected ...``), and again
where they are used, by ``runtime.sampling.SamplingParams`` (the API's and serve's names).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import click

from specrt.errors import UserError
from specrt.paths import path_problem


def _check_path(value, expected: str) -> None:
    """A value that is no usable path (paths.path_problem: empty, as Path('') is '.', or not a str
    or os.PathLike) refused as click's usage error."""
    if (why := path_problem(value, expected)) is not None:
        raise click.BadParameter(why)


class PathArg(click.Path):
    """click.Path giving a pathlib.Path, refusing an empty path as one (``expected``: what the
    path should name, "a folder" or "a file", for that message); click.Path's own checks
    (exists, dir_okay, ...) as given, except an existing folder's (``existing_folder``), said in
    specrt's words."""

    def __init__(self, expected: str, **kwargs):
        super().__init__(path_type=Path, **kwargs)
        self.expected = expected

    def convert(self, value, param, ctx):
        _check_path(value, self.expected)
        if isinstance(value, str) and value == "-":  # (`--stats -` wrote a file named "-" in the working folder,
            # `--prompts -` said "File '-' does not exist": other tools read it as standard input or output)
            self.fail("'-' is not standard input or output here: give /dev/stdin or /dev/stdout, or ./- for a "
                      "file of that name", param, ctx)
        if self.exists and not self.file_okay and not Path(value).is_dir():
            # one wording for every folder that must exist, missing or a file (click's: "Directory 'X'
            # does not exist." / "Directory 'X' is a file.")
            self.fail(f"{value} is not a folder", param, ctx)
        return super().convert(value, param, ctx)


def existing_folder() -> PathArg:
    """The type of an argument or option naming an existing folder (TARGET, --draft, EXPORT_DIR,
    ENGINES_DIR, compare's --target): a Path, or "X is not a folder"."""
    return PathArg("a folder", exists=True, file_okay=False)


class Checked(click.ParamType):
    """click's FLOAT or INT (``base``) whose value ``ok`` takes, refused naming the option and
    the value as the user typed it: `--temperature -1` was said as "-1.0", `1e999` as "inf",
    `--top-p 1.50` as "1.5" (the parsed value; session 70's CLI walk, L4)."""

    def __init__(self, base: click.ParamType, ok, expected: str):
        self.base, self.ok, self.expected, self.name = base, ok, expected, base.name

    def convert(self, value, param, ctx):
        v = self.base.convert(value, param, ctx)
        typed = value if not isinstance(value, str) or value == value.strip() else repr(value)
        if not self.ok(v):
            raise UserError(f"{param.opts[0]} {typed}: expected {self.expected}")
        if ctx is not None and isinstance(value, str):  # (for an error the command says later: typed_value)
            ctx.meta[f"{__name__}.typed.{param.name}"] = typed
        return v


def typed_value(name: str, value) -> str:
    """A Checked option's value as the user typed it (``value``, the parsed one, where it was
    not typed: its default), for a check the command makes later: calibrate's "--holdout 0.50
    needs at least 2 prompts" said 0.5 (h74e)."""
    ctx = click.get_current_context(silent=True)
    return str((ctx.meta if ctx is not None else {}).get(f"{__name__}.typed.{name}", value))


def temperature_option(help_text: str):
    """--temperature (0 = greedy), checked as SamplingParams checks it, named as typed."""
    return click.option("--temperature", default=0.0, show_default=True, help=help_text,
                        type=Checked(click.FLOAT, lambda v: math.isfinite(v) and v >= 0,
                                     "a finite number >= 0 (0 = greedy)"))


def sampling_options(temperature_help: str, seed: int | None, seed_help: str | None = None):
    """--temperature, --top-p, --top-k, --seed (default ``seed``; None = fresh entropy) and
    --reproducible (SamplingParams.coupled)."""
    opts = [
        temperature_option(temperature_help),
        click.option("--top-p", default=1.0, show_default=True, help="1 = off.",
                     type=Checked(click.FLOAT, lambda v: 0 < v <= 1, "a number in (0, 1] (1 = off)")),
        click.option("--top-k", default=0, show_default=True, help="0 (or -1) = off.",
                     type=Checked(click.INT, lambda v: v >= -1, "an integer >= -1 (0 or -1: off)")),
        click.option("--seed", default=seed, show_default=seed is not None, help=seed_help,
                     type=Checked(click.INT, lambda v: v >= -1, "a non-negative integer (-1: none)")),
        click.option("--reproducible", is_flag=True,
                     help="Coupled sampling: each token the Gumbel-max draw of its position's noise, a function of "
                          "--seed alone, so the text is the one target-only decoding samples with that seed, whatever "
                          "the governor, drafts, lookup or reuse (by default rejection sampling: more drafts "
                          "accepted, the same distribution, but the text depends on the drafts)."),
    ]

    def decorate(f):
        @functools.wraps(f)
        def command(*args, **kwargs):
            if (note := greedy_note(kwargs)) is not None:
                click.echo(f"note: {note}", err=True)
            return f(*args, **kwargs)

        for opt in reversed(opts):
            command = opt(command)
        return command

    return decorate


SAMPLING_ONLY = ("top_p", "top_k", "seed", "reproducible")


def greedy_note(params: dict) -> str | None:
    """What to say when sampling options were given on the command line (or from the
    environment) with --temperature 0, where they change nothing: greedy decoding ignored
    `--top-p 0.5` without a word. None when sampling, or when none was given."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or params.get("temperature") != 0:
        return None
    given = [f"--{name.replace('_', '-')}" for name in SAMPLING_ONLY
             if name in params and ctx.get_parameter_source(name) in (click.core.ParameterSource.COMMANDLINE,
                                                                      click.core.ParameterSource.ENVIRONMENT)]
    if not given:
        return None
    return (f"{', '.join(given)} {'has' if len(given) == 1 else 'have'} no effect at --temperature 0 (greedy "
            "decoding); give --temperature T > 0 to sample")


def template_kwargs_option(f):
    """--chat-template-kwargs JSON -> the parameter ``chat_template_kwargs`` (a dict)."""
    def parse(ctx, param, value):
        from specrt.runtime.text import template_kwargs_of

        return template_kwargs_of(argv_text(value), "--chat-template-kwargs")  # (text of the command line)

    return click.option("--chat-template-kwargs", "chat_template_kwargs", callback=parse, metavar="JSON",
                        help="Variables for the chat template, a JSON object, as transformers' apply_chat_template "
                             "takes them: e.g. '{\"enable_thinking\": false}' for Qwen3 without its thinking "
                             "block.")(f)


def argv_text(value: str | None) -> str | None:
    """Text given on the command line as typed in UTF-8: where Python decodes arguments as
    ASCII (the C or POSIX locale with PYTHONUTF8=0) every other byte arrives as a surrogate
    escape, and `--prompt "Café"` was refused as "not valid UTF-8 text" (a --stop never
    matched, `serve --model-name` served an id no client could name), though chat read the
    same words from its input (as UTF-8 bytes). Its bytes are read as UTF-8 then; bytes that
    are not UTF-8 stay escaped, and are said as before."""
    import os

    if value is None or not any("\udc80" <= c <= "\udcff" for c in value):
        return value
    try:
        return os.fsencode(value).decode("utf-8")
    except UnicodeDecodeError:
        return value
    except UnicodeEncodeError:  # (the C library decoded a byte Python's codec cannot give back: glibc's
        # EUC-JP reads 0x82 as U+0082, which Python's euc_jp does not encode; `--prompt "café €"` was a traceback)
        import sys

        raise UserError(f"the argument {value!r} cannot be read back as the bytes typed under this locale's "
                        f"encoding ({sys.getfilesystemencoding()}): run under a UTF-8 locale (LC_ALL=C.UTF-8) "
                        "or with PYTHONUTF8=1") from None
