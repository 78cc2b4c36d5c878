"""The two exception roots of specrt.

``UserError``: the input is wrong (a file, tensor, option). The CLI prints the
message and exits 1 without a traceback. ``InternalError``: specrt itself is
wrong (a bug); the CLI lets the traceback through.
"""


class SpecrtError(Exception):
    """Base of everything specrt raises on purpose."""


class UserError(SpecrtError):
    """Bad input: the message names the file, tensor or option and what was expected."""


class InternalError(SpecrtError):
    """A broken invariant inside specrt: a bug, never the user's fault."""
