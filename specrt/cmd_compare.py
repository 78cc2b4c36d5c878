"""``specrt compare ENGINES``: every engine role against a reference (engines/compare.py).

Registered in cli.py with ``main.add_command(compare)``. A mismatch is a UserError
carrying the summary (role and output named), so the CLI exits 1 without a traceback.
"""

from __future__ import annotations

import math

from pathlib import Path

import click

from specrt.errors import UserError
from specrt.sampling_options import PathArg, existing_folder


def parse_tolerances(values: tuple[str, ...], option: str) -> float | dict[str, float] | None:
    """polygraphy's form: ``VALUE`` for every output, or ``OUTPUT:VALUE`` (an output kind such
    as ``logits``/``new_key``, or a name such as ``new_key.3``), repeatable."""
    if not values:
        return None
    out: dict[str, float] = {}
    for v in values:
        name, _, num = v.rpartition(":")
        try:
            out[name] = float(num)
        except ValueError:
            raise UserError(f"{option} '{v}': expected VALUE or OUTPUT:VALUE, e.g. 1e-4 or logits:1e-3") from None
        if not math.isfinite(out[name]) or out[name] < 0:  # NaN compares false: everything would pass
            raise UserError(f"{option} '{v}': expected a finite tolerance >= 0")
    return out


@click.command()
@click.argument("engines_dir", type=existing_folder())
@click.option("--reference", type=click.Choice(["onnxruntime", "torch"]), default="onnxruntime", show_default=True,
              help="onnxruntime: the export's graphs in ONNX Runtime (polygraphy OnnxrtRunner); torch: the target "
                   "checkpoint in transformers, eager fp32 (target roles only).")
@click.option("--report", type=PathArg("a file", dir_okay=False), help="Write the JSON report here.")
@click.option("--atol", multiple=True, metavar="[OUTPUT:]VALUE",
              help="Absolute tolerance, for every output or one output kind/name (repeatable).")
@click.option("--rtol", multiple=True, metavar="[OUTPUT:]VALUE",
              help="Relative tolerance, for every output or one output kind/name (repeatable).")
@click.option("--save-inputs", type=PathArg("a file", dir_okay=False),
              help="Where to save the inputs of the polygraphy command (default: beside --report, else a temp folder).")
@click.option("--target", "target_folder", type=existing_folder(),
              help="The target checkpoint for --reference torch (default: the one the export was bound from).")
@click.option("--prompt-tokens", type=int, default=None,
              help="Prompt length of the test inputs (default: 32, or the most the engines' context leaves).")
def compare(engines_dir: Path, reference: str, report: Path | None, atol, rtol, save_inputs: Path | None,
            target_folder: Path | None, prompt_tokens: int) -> None:
    """Run every engine of ENGINES_DIR (prefill, decode, verify.{d}, draft) and a reference on the
    same inputs through polygraphy's Comparator; print a table per role, exit 1 on a mismatch."""
    from specrt.engines.compare import compare_engines
    from specrt.engines.compare import outputs_file_for
    from specrt.paths import check_not_engines_file, check_output_file

    for path, option in ((report, "--report"), (save_inputs, "--save-inputs")):
        if path is not None:
            check_output_file(path, option)
            check_not_engines_file(path, engines_dir, option)
    if save_inputs is not None:  # (the engine's outputs are saved beside the inputs)
        check_not_engines_file(outputs_file_for(Path(save_inputs)), engines_dir, "--save-inputs")
    if report is not None and save_inputs is not None:  # one file for two: the report replaced the inputs
        if Path(report).resolve() in (Path(save_inputs).resolve(), outputs_file_for(Path(save_inputs)).resolve()):
            raise UserError(f"--report {report} and --save-inputs {save_inputs} (the engine's outputs go to "
                            f"{outputs_file_for(Path(save_inputs))}) name the same file; give each its own")
    result = compare_engines(engines_dir, reference=reference, report=report,
                             atol=parse_tolerances(atol, "--atol"), rtol=parse_tolerances(rtol, "--rtol"),
                             log=click.echo, target_folder=target_folder, inputs_file=save_inputs,
                             prompt_tokens=prompt_tokens)
    if not result["passed"]:  # (the FAILED line above names each output; said once)
        from specrt.engines.compare import what_failed

        raise UserError(what_failed(result['failures'], reference)
                        + (f" (report: {report})" if report else ""))
