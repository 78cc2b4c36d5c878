"""``specrt calibrate ENGINES --prompts FILE.jsonl``: fit and store DSpark's calibration.

Registered in cli.py with ``main.add_command(calibrate)``. The logic is runtime/calibrate.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from specrt.contracts import CALIBRATION_FILE
from specrt.prompt_files import prompts_of, read_prompt_file, template_notes
from specrt.sampling_options import (Checked, PathArg, existing_folder, sampling_options, template_kwargs_option,
                                     typed_value)


def read_prompts(path: Path, lines: list[int] | None = None) -> list[str | list[int]]:
    """JSON lines, each with a string 'prompt' or a list of token ids 'prompt_ids' (``lines``
    filled with each prompt's line number)."""
    return prompts_of(read_prompt_file(path, lines=lines))


@click.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--prompts", "prompts_file", required=True,
              type=PathArg("a file", exists=True, dir_okay=False),
              help="JSON lines with a 'prompt' (text), a conversation 'messages' (role/content objects, "
                   "always through the chat template) or 'prompt_ids' (token ids).")
@click.option("--chat", is_flag=True, help="Wrap text prompts in the exported chat template.")
@template_kwargs_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True,
              help="Tokens generated per prompt (at least 3).")
@click.option("--holdout", default=0.25, show_default=True,
              type=Checked(click.FLOAT, lambda v: 0 <= v < 1, "a fraction in [0, 1)"),  # (as split_prompts checks it)
              help="Fraction of the prompts held out to measure calibration error (0: none).")
@click.option("--holdout-prompts", "holdout_file", type=PathArg("a file", exists=True, dir_okay=False),
              help="A separate held-out prompt file (same format) to measure calibration error on; "
                   "then every prompt of --prompts trains and --holdout is ignored.")
@click.option("--report", "report_file", type=PathArg("a file", dir_okay=False),
              help="Also write the full report as JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of a table.")
@sampling_options("Calibrate for sampled decoding at this temperature (0 = greedy), with --top-p / --top-k as "
                  "`specrt run` will use them. One calibration is kept per mode.", seed=0,
                  seed_help="Seed of the sampled decoding.")
def calibrate(engines_dir: Path, prompts_file: Path, chat: bool, chat_template_kwargs: dict, max_new_tokens: int, holdout: float,
              holdout_file: Path | None, report_file: Path | None, as_json: bool, temperature: float, top_p: float,
              top_k: int, seed: int, reproducible: bool) -> None:
    """Fit the DSpark governor's per-position confidence calibration on ENGINES_DIR.

    Decodes the prompts (greedily, or sampled with --temperature) verifying the full
    draft block every round, fits the map from draft confidence to acceptance on the
    training prompts, reports the expected calibration error before / after on the
    held-out prompts and stores it in ENGINES_DIR/calibration.json under its decoding
    mode (tied to the engines' export digest; other modes' calibrations are kept)."""
    from specrt.paths import check_distinct, check_engines_writable, check_not_engines_file, check_output_file, write_atomic
    from specrt.runtime.calibrate import calibrate as run_calibrate, format_report
    from specrt.runtime.sampling import SamplingParams

    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, coupled=reproducible)
    check_engines_writable(engines_dir, CALIBRATION_FILE)
    if report_file is not None:
        check_output_file(report_file, "--report")
        check_not_engines_file(report_file, engines_dir, "--report")
    check_distinct(("--prompts", prompts_file), ("--holdout-prompts", holdout_file), ("--report", report_file))
    source = click.get_current_context().get_parameter_source("holdout")
    holdout_text = typed_value("holdout", holdout)  # (as typed: h74e)
    if holdout_file is not None and source not in (None, click.core.ParameterSource.DEFAULT):  # (ignored unsaid: h73a)
        click.echo(f"note: --holdout {holdout_text} has no effect beside --holdout-prompts (every prompt of --prompts "
                   "trains)", err=True)

    lines: list[int] = []
    held_lines: list[int] = []
    prompts = read_prompts(prompts_file, lines)
    held = read_prompts(holdout_file, held_lines) if holdout_file is not None else None
    for note in template_notes(chat, prompts + (held or []), chat_template_kwargs):  # (as `specrt run` says them)
        click.echo(f"note: {note}", err=True)
    labels = [f"{prompts_file}:{n}" for n in lines] + [f"{holdout_file}:{n}" for n in held_lines]
    report = run_calibrate(engines_dir, prompts, chat=chat, max_new_tokens=max_new_tokens, holdout=holdout,
                           log=lambda s: click.echo(s, err=True), holdout_prompts=held, sampling=sampling,
                           chat_template_kwargs=chat_template_kwargs, labels=labels, holdout_text=holdout_text)
    if report_file is not None:
        write_atomic(report_file, report)
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))
