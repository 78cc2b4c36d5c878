"""The sampling options shared by ``specrt run``, ``bench`` and ``calibrate``, the chat
template's variables (those and ``chat``, ``serve``), and the path arguments' checks
(``existing_dir``: cli.py's commands' folders and ``calibrate``'s; ``PathArg``: every other path
argument or option, ``serve``'s, ``bench``'s and ``compare``'s included).

    @sampling_options("0 = greedy", seed=None)
    def run(..., temperature, top_p, top_k, seed): ...

Values are checked here, naming the option as typed (``--top-p 0: expected ...``), and again
where they are used, by ``runtime.sampling.SamplingParams`` (the API's and serve's names).
"""

from __future__ import annotations

import math
from pathlib import Path

import click

from specrt.errors import UserError
from specrt.paths import empty_path


def _refuse_empty(value, expected: str) -> None:
    """An empty path refused as click's usage error (paths.empty_path: Path('') is '.')."""
    if (why := empty_path(value, expected)) is not None:
        raise click.BadParameter(why)


class PathArg(click.Path):
    """click.Path giving a pathlib.Path, refusing an empty path as one (``expected``: what the
    path should name, "a folder" or "a file", for that message); click.Path's own checks
    (exists, dir_okay, ...) as given."""

    def __init__(self, expected: str, **kwargs):
        super().__init__(path_type=Path, **kwargs)
        self.expected = expected

    def convert(self, value, param, ctx):
        _refuse_empty(value, self.expected)
        return super().convert(value, param, ctx)


def existing_dir(ctx, param, value):
    """click callback: an existing folder as a Path (None when the option is left out)."""
    if value is None:
        return None
    _refuse_empty(value, "a folder")
    p = Path(value)
    if not p.is_dir():
        raise click.BadParameter(f"{p} is not a folder")
    return p


def _checked(ok, expected: str):
    def check(ctx, param, value):
        if value is not None and not ok(value):
            raise UserError(f"{param.opts[0]} {value}: expected {expected}")
        return value

    return check


def temperature_option(help_text: str):
    """--temperature (0 = greedy), checked as SamplingParams checks it, named as typed."""
    return click.option("--temperature", type=float, default=0.0, show_default=True, help=help_text,
                        callback=_checked(lambda v: math.isfinite(v) and v >= 0, "a finite number >= 0 (0 = greedy)"))


def sampling_options(temperature_help: str, seed: int | None, seed_help: str | None = None):
    """--temperature, --top-p, --top-k, --seed (default ``seed``; None = fresh entropy) and
    --reproducible (SamplingParams.coupled)."""
    opts = [
        temperature_option(temperature_help),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off.",
                     callback=_checked(lambda v: 0 < v <= 1, "a number in (0, 1] (1 = off)")),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 (or -1) = off.",
                     callback=_checked(lambda v: v >= -1, "an integer >= 0 (0 or -1 = off)")),
        click.option("--seed", type=int, default=seed, show_default=seed is not None, help=seed_help,
                     callback=_checked(lambda v: v >= -1, "a non-negative integer (-1: none)")),
        click.option("--reproducible", is_flag=True,
                     help="Coupled sampling: each token the Gumbel-max draw of its position's noise, a function of "
                          "--seed alone, so the text is the one target-only decoding samples with that seed, whatever "
                          "the governor, drafts, lookup or reuse (by default rejection sampling: more drafts "
                          "accepted, the same distribution, but the text depends on the drafts)."),
    ]

    def decorate(f):
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


def template_kwargs_option(f):
    """--chat-template-kwargs JSON -> the parameter ``chat_template_kwargs`` (a dict)."""
    def parse(ctx, param, value):
        from specrt.runtime.text import template_kwargs_of

        return template_kwargs_of(value, "--chat-template-kwargs")

    return click.option("--chat-template-kwargs", "chat_template_kwargs", callback=parse, metavar="JSON",
                        help="Variables for the chat template, a JSON object, as transformers' apply_chat_template "
                             "takes them: e.g. '{\"enable_thinking\": false}' for Qwen3 without its thinking "
                             "block.")(f)
