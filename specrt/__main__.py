"""``python -m specrt``: the ``specrt`` command (its console script's entry), for an environment
whose bin folder is not on PATH."""

from specrt.launch import entry

entry()
