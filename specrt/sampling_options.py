"""The sampling options shared by ``specrt run``, ``bench`` and ``calibrate``, and the
chat template's variables (those and ``chat``, ``serve``).

    @sampling_options("0 = greedy", seed=None)
    def run(..., temperature, top_p, top_k, seed): ...

Values are checked where they are used, by ``runtime.sampling.SamplingParams``.
"""

from __future__ import annotations

import click


def sampling_options(temperature_help: str, seed: int | None, seed_help: str | None = None):
    """--temperature, --top-p, --top-k, --seed (default ``seed``; None = fresh entropy) and
    --reproducible (SamplingParams.coupled)."""
    opts = [
        click.option("--temperature", type=float, default=0.0, show_default=True, help=temperature_help),
        click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off."),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 = off."),
        click.option("--seed", type=int, default=seed, show_default=seed is not None, help=seed_help),
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
