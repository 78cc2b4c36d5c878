"""The two exception roots of specrt.

``UserError``: the input is wrong (a file, tensor, option). The CLI prints the
message and exits 1 without a traceback. ``InternalError``: specrt itself is
wrong (a bug); the CLI lets the traceback through.
"""

import errno
import re

# OSErrors that say the machine or the user's files are in the way (a full disk, a file
# this user cannot read or write, a read-only mount), not that specrt is wrong: said as
# a user error, naming the file, never a traceback
_ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS,
                                 errno.EIO, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})


def environment_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in _ENVIRONMENT_ERRNOS


def describe_os_error(e: OSError) -> str:
    """``file: reason`` (both files of a rename), or the reason alone where the OS names none."""
    reason = e.strerror or str(e)
    if e.filename is None:
        return reason
    return f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 else "") + f": {reason}"


class SpecrtError(Exception):
    """Base of everything specrt raises on purpose."""


class UserError(SpecrtError):
    """Bad input: the message names the file, tensor or option and what was expected."""


class EngineFailure(UserError):
    """An engine's output cannot be used (NaN or +inf logits): the request was fine, the
    engines (or the checkpoint they were built from) are not. Said as any UserError by the
    CLI (exit 1, no traceback); `specrt serve` answers it as a server error (500), not as
    the client's bad request."""


class InternalError(SpecrtError):
    """A broken invariant inside specrt: a bug, never the user's fault."""


class NonFiniteOutput(InternalError):
    """An engine's output held NaN or +inf where a number was needed ("... engine produced ...").
    Where it is raised nothing says why; the generator, which knows the answer and the
    engines, says it as an EngineFailure."""


# how the runtime names a governor it refuses (governor.py, session.py): the Python API's
# ``governor=`` as given; a command says it as its own option (``cli_named``)
GOVERNOR_NAMED = "governor '"


def json_problem(e: BaseException) -> str:
    """What json.loads' error says of a file or text that cannot be read: its own message, or
    for arrays nested past Python's recursion limit and a number past its digit limit for int
    (tracebacks where only json.JSONDecodeError was caught) words a user can act on, not
    Python's advice to call sys.set_int_max_str_digits()."""
    if isinstance(e, RecursionError):
        return "nested too deeply to read"
    # Python 3.10 says "the limit (4300)", 3.11 on "the limit (4300 digits)"
    m = re.match(r"Exceeds the limit \((\d+)(?: digits)?\) for integer string conversion: value has (\d+) digits",
                 str(e))
    return f"a number of {m[2]} digits, past the {m[1]} Python reads" if m else str(e)


def cli_named(e: BaseException, option: str) -> str:
    """``e``'s message as a command says it: one that names a governor spec (``governor
    'x': ...``, the Python API's words) names the command's ``option`` instead
    (``--governor 'x': ...``; bench's ``--governors``)."""
    msg = str(e)
    return option + msg[len("governor"):] if msg.startswith(GOVERNOR_NAMED) else msg
