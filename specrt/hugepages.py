"""Transparent huge pages for the engines' weights (Linux, glibc).

A decode step streams every weight once (~540 MB for SmolLM2-135M in fp32). ONNX Runtime
prepacks the weights into heap memory, which with 4 KiB pages costs a TLB miss every
page and stops the hardware prefetchers at every page boundary. Where the kernel gives
huge pages only on request (``/sys/kernel/mm/transparent_hugepage/enabled`` =
``madvise``, Debian's and many clouds' default), glibc (>= 2.35) asks for them on its
own large allocations when started with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``.
Measured on the 2-core development VM: decode 17.31 vs 17.78 ms (0.973x, 4 alternating
process pairs, every pair faster with it), ~300 MiB of the weights in huge pages.

A tunable is read when the process starts, so the ``specrt`` command re-executes itself
once with it set (``reexec_with_thp``), and ``specrt bench`` starts its workers with it.
``SPECRT_THP=0`` (or ``false``, ``no``, ``off``) turns this off; with ``always`` or ``never``
in the kernel setting there is nothing to do. Library users (``specrt.runtime.session.Session``)
set the variable in their own process environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_GUARD = "SPECRT_THP_REEXEC"
# what SPECRT_THP turns huge pages off with: 0 as documented, and the other ways users write "off"
# (``SPECRT_THP=false`` restarted with the tunable, without a word)
OFF = ("0", "false", "no", "off")


def thp_mode(setting: Path = SETTING) -> str | None:
    """The kernel's THP mode ("always", "madvise", "never"), None where unknown."""
    try:
        text = setting.read_text(encoding="utf-8")
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def glibc_version() -> tuple[int, int] | None:
    """This process's glibc (major, minor), None where it is not glibc or cannot be read."""
    try:
        name, _, version = os.confstr("CS_GNU_LIBC_VERSION").partition(" ")
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def honours_tunable(lib: tuple[int, int] | None) -> bool:
    """Whether a C library (glibc_version's answer) reads the tunable: glibc 2.35 and later;
    older glibc ignores it, and another libc (None: musl) has no such tunable."""
    return lib is not None and lib >= (2, 35)


def tunables(env: dict) -> list[str]:
    """The entries of ``env``'s GLIBC_TUNABLES, in order (glibc reads the last of a name)."""
    return [p for p in env.get("GLIBC_TUNABLES", "").split(":") if p]


def hugetlb_entries(env: dict) -> list[str]:
    """``env``'s GLIBC_TUNABLES entries of the tunable's name (``glibc.malloc.hugetlb=...``), in order."""
    return [p for p in tunables(env) if p.startswith(TUNABLE.split("=")[0] + "=")]


def has_tunable(env: dict | None = None) -> bool:
    """Whether a process started with ``env`` (default os.environ) gets huge pages from
    specrt's tunable: its entry the last of its name among the GLIBC_TUNABLES (glibc reads the
    last: ``glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0`` gets none, which bench reported as
    huge pages)."""
    return hugetlb_entries(os.environ if env is None else env)[-1:] == [TUNABLE]


def wanted(env: dict | None = None, setting: Path = SETTING, glibc: tuple[int, int] | None = None) -> bool:
    """Whether a process started with ``env`` should get the tunable added: not where glibc
    is older than 2.35 (``glibc``, default this process's), which ignores it (a benchmark
    report then claimed huge pages that no allocation got), nor where ``env`` sets the
    tunable itself (ours, or the user's 0 or 2, which ours after it would override)."""
    env = os.environ if env is None else env
    return (env.get("SPECRT_THP", "1").strip().lower() not in OFF and sys.platform.startswith("linux")
            and honours_tunable(glibc or glibc_version())
            and thp_mode(setting) == "madvise" and not hugetlb_entries(env))


def with_thp(env: dict | None = None, on: bool = True, setting: Path = SETTING) -> dict:
    """A copy of ``env`` (default os.environ) with the tunable added (``on``) when wanted,
    or removed (``on=False``: a peer run as shipped)."""
    env = dict(os.environ if env is None else env)
    parts = tunables(env)
    if on and wanted(env, setting):
        parts.append(TUNABLE)
    elif not on:
        parts = [p for p in parts if p != TUNABLE]
    if parts:
        env["GLIBC_TUNABLES"] = ":".join(parts)
    else:
        env.pop("GLIBC_TUNABLES", None)
    return env


# entry(), not main(): the restarted process installs the SIGTERM handler too (with main() a
# terminated build skipped its cleanup and left its partial folder wherever the kernel
# gives huge pages on request); its own reexec_with_thp returns at once (the guard is set).
# ``python -c`` puts the working folder first on sys.path, where the command had its own
# bin folder: a json.py, click/ or specrt/ there would shadow the real ones, so it goes.
_NO_CWD = "import sys\nif sys.path and sys.path[0] == '': del sys.path[0]\n"
CLI_CODE = _NO_CWD + "from specrt.launch import entry; sys.argv[0] = 'specrt'; entry()"


def script_code(path: str) -> str:
    """``reexec_with_thp``'s code for a script (tools/*.py) rather than the ``specrt`` command:
    its own folder first on sys.path, as when it was started, not the working folder."""
    folder = os.path.dirname(os.path.abspath(path))
    return (_NO_CWD + f"import runpy; sys.path.insert(0, {folder!r}); sys.argv[0] = {path!r}; "
            f"runpy.run_path({path!r}, run_name='__main__')")


def reexec_with_thp(argv: list[str], code: str = CLI_CODE) -> None:
    """Replace this process by ``python -c code argv...`` (the ``specrt`` command) with the
    tunable set, when wanted and not done yet; returns only when nothing was to be done."""
    if os.environ.get(_GUARD) or not wanted():
        return
    env = with_thp()
    env[_GUARD] = "1"
    # the interpreter's own options (-X utf8, -O, -B, -E, -I, -W ...), as multiprocessing's spawn
    # passes them: `python -X utf8 -m specrt` restarted without them (UTF-8 mode lost) where the
    # kernel gives huge pages on request, and kept them where it does not
    flags = subprocess._args_from_interpreter_flags()
    try:
        for f in (sys.stdout, sys.stderr):
            if f is not None:  # (closed, `>&-`: None, an AttributeError's traceback in every command)
                f.flush()
        os.execve(sys.executable, [sys.executable, *flags, "-c", code, *argv], env)
    except OSError:
        return  # run on without huge pages
