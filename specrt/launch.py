"""The ``specrt`` console script (pyproject.toml): ``specrt.cli.entry``, imported here so that
a Ctrl-C while Python still imports the command line (its first ~0.4 s: click, the commands'
modules) ends it as a Ctrl-C during a command does, "Aborted!" and exit 1, not a traceback of
the import it struck. Imports nothing of its own."""

import sys


def entry() -> None:
    try:
        from specrt.cli import entry as command

        command()
    except KeyboardInterrupt:  # (within a command click says it itself)
        sys.stderr.write("\nAborted!\n")
        sys.exit(1)
