"""The ``specrt`` command line: one command per capability.

User errors print ``error: <message>`` and exit 1 without a traceback; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specrt import __version__
from specrt.errors import UserError


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="specrt")
def main() -> None:
    """Deploy speculative decoding (P-EAGLE, EAGLE-3) to ONNX Runtime and TensorRT."""


def _existing_dir(ctx, param, value):
    if value is None:
        return None
    p = Path(value)
    if not p.is_dir():
        raise click.BadParameter(f"{p} is not a folder")
    return p


@main.command()
@click.argument("target", callback=_existing_dir)
@click.option("--draft", callback=_existing_dir, help="A speculators draft folder (P-EAGLE or EAGLE-3).")
@click.option("--json", "as_json", is_flag=True, help="Print the binding receipt as JSON.")
@click.option("--allow-pickle", is_flag=True, help="Read pytorch_model.bin pickles (unpickling can run code).")
def inspect(target: Path, draft: Path | None, as_json: bool, allow_pickle: bool) -> None:
    """Bind TARGET (and --draft) to canonical slots and print the binding table."""
    from specrt.export.binding import bind_draft, bind_target, receipt

    t = bind_target(target, allow_pickle=allow_pickle)
    d = bind_draft(draft, t) if draft is not None else None
    r = receipt(t, d)
    if as_json:
        click.echo(json.dumps(r, indent=2))
        return
    for side in ("target", "draft"):
        if side not in r:
            continue
        part = r[side]
        click.echo(f"{side}: {part['folder']}")
        for slot, info in part["slots"].items():
            if "tied_to" in info:
                click.echo(f"  {slot:28s} <- tied to {info['tied_to']}")
            else:
                click.echo(f"  {slot:28s} <- {info['key']:52s} {info['dtype']:5s} {info['shape']}  {info['sha256'][:12]}")
        if side == "draft":
            click.echo(f"  aux layer ids: {part['aux_layer_ids']}; embeddings from target: {part['embed_from_target']}")
            click.echo(f"  relies on target: {', '.join(part['relies_on_target'])}")
    n = len(r["target"]["slots"]) + len(r.get("draft", {}).get("slots", {}))
    click.echo(f"bound {n} slots; receipt {r['receipt_id'][:16]}")


@main.command()
@click.argument("target", callback=_existing_dir)
@click.option("--draft", callback=_existing_dir, help="A speculators draft folder (P-EAGLE or EAGLE-3).")
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Export folder to write.")
@click.option("--dtype", default="float32", show_default=True, help="float32, float16 or bfloat16.")
@click.option("--force", is_flag=True, help="Replace an existing export folder.")
@click.option("--allow-pickle", is_flag=True, help="Read pytorch_model.bin pickles (unpickling can run code).")
def export(target: Path, draft: Path | None, out: Path, dtype: str, force: bool, allow_pickle: bool) -> None:
    """Bind TARGET (and --draft) and lower them to ONNX in OUT, with export.json."""
    from specrt.export.export import export as run_export

    run_export(target, draft, out, dtype=dtype, force=force, allow_pickle=allow_pickle,
               log=lambda s: click.echo(s, err=True))


if __name__ == "__main__":  # pragma: no cover
    main()
