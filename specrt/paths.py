"""Output paths checked before any work starts, so a run never ends in an unwritable file;
JSON written whole or not at all."""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from specrt.contracts import ACCEPTANCE_FILE, CALIBRATION_FILE, CORPUS_FILE
from specrt.errors import UserError, json_problem

try:
    import fcntl
except ImportError:  # Windows: no flock (see _flock); every command imported this module and failed at start
    fcntl = None


PATH_TYPES = "a path (str or os.PathLike)"


def path_problem(value, expected: str) -> str | None:
    """What is wrong with ``value`` as a path naming ``expected`` ("a folder", "a file"), or
    None. Not a path: anything but a str or an os.PathLike giving one (bytes, an int) was
    pathlib's TypeError, a traceback. Bytes are refused rather than decoded (os.fsdecode):
    pathlib, which every entry point turns its paths into, takes none, the CLI gives str, and
    the paths are written as text into manifests, reports and messages; a caller holding bytes
    decodes them once with os.fsdecode, knowing their encoding, rather than specrt guessing it.
    Empty: Path('') is '.', the working folder, named nowhere in what then went wrong (an
    `-o ""` was refused as the folder the command ran in, `serve ""` loaded it as the engines,
    `build_engines(..., out="", force=True)` built into an empty working folder); a Path cannot
    be empty (Path('') is already '.'). The CLI says it as click's BadParameter
    (sampling_options.PathArg), the Python API through check_path_args."""
    try:
        text = os.fspath(value)
    except TypeError:
        text = None
    if not isinstance(text, str):  # (os.fspath passes bytes through, and a PathLike may give bytes)
        return f"{value!r:.80} is {type(value).__name__}; expected {PATH_TYPES}"
    return None if text else f"an empty path; expected {expected}"


def check_path_args(expected: str, *, optional: tuple[str, ...] = (), **named) -> None:
    """UserError "NAME: ..." (path_problem: not a str or os.PathLike, or empty; expected
    ``expected``) for the first of ``named`` (argument name -> the path given) that is not a
    usable path: the Python entry points' path arguments, checked before any work, as the CLI
    checks its own. None is refused too (``Session(None)`` was pathlib's TypeError) but for
    the names in ``optional`` (arguments whose None means "none")."""
    for name, value in named.items():
        if value is None and name in optional:
            continue
        why = f"None; expected {expected}" if value is None else path_problem(value, expected)
        if why is not None:
            raise UserError(f"{name}: {why}")


def read_json_object(path: Path) -> dict:
    """A JSON file holding an object, errors naming the file (export's configs, the tokenizer's)."""
    return json_object(read_utf8(path), path)


def read_utf8(path: Path, problem: str = "not valid JSON") -> str:
    """The text of a UTF-8 file: a JSON file's (UTF-8, as JSON must be), read_json_object's
    error naming it; ``problem`` says what else a file that is not UTF-8 fails to be (run's
    --grammar: "expected a Lark or GBNF grammar in UTF-8 text")."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: {problem} ({e})") from None


def json_object(text: str, path: Path) -> dict:
    """``text``, the file ``path``'s, parsed as a JSON object, errors naming the file."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # (not JSON; nested past Python's recursion limit, a number
        raise UserError(f"{path}: not valid JSON ({json_problem(e)})") from None  # past its digit limit: tracebacks)
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object at top level, found {type(data).__name__}")
    return data


def check_distinct(*named: tuple[str, str | Path | None]) -> None:
    """UserError when two of the (option, path) files given are one file (an output would
    replace an input, or another output); None paths are skipped."""
    files = [(o, Path(f)) for o, f in named if f is not None]
    for i, (o1, f1) in enumerate(files):
        for o2, f2 in files[i + 1:]:
            if f1.resolve() == f2.resolve():
                raise UserError(f"{o1} and {o2} name the same file {f1}; give each its own")


def check_not_engines_file(path: str | Path | None, engines_dir: str | Path, option: str, *,
                           users_files: bool = False) -> None:
    """UserError when ``path`` is a file the engines folder already holds (engines.json, a
    graph, the calibration, ...), or one that calibrate, canary or corpus write there later
    (the first calibration written, then a report over it): a report written there breaks
    the engines. ``users_files``: for an option that reads the file it names before writing
    it (run's --grow-file, which wrote session growth over calibration.json), a file of the
    user's own there (a growth file kept beside the engines) is taken; refused are the files
    the folder owns: its manifest, those it records, its export (through its link) and those
    written there later."""
    if path is None:
        return
    p, folder = Path(path).resolve(), Path(engines_dir).resolve()
    if not p.is_relative_to(folder):
        return
    later = {folder / n for n in (CALIBRATION_FILE, ACCEPTANCE_FILE, CORPUS_FILE)}
    if users_files:
        given = Path(path).absolute()  # (the export's link itself, or a path through it)
        refused = p in (later | _recorded(folder)) or p.is_relative_to((folder / "export").resolve()) \
            or Path(engines_dir).absolute() / "export" in (given, *given.parents)
    else:
        refused = p.is_file() or p in later
    if refused:
        raise UserError(f"{option} {path}: a file of the engines folder {engines_dir}; writing there would replace it "
                        "and break the engines: give another path")


def _recorded(folder: Path) -> set[Path]:
    """The engines folder's manifest and the files it records, resolved (none where it cannot
    be read: loading the engines names a broken manifest)."""
    owned = {folder / "engines.json"}
    try:
        files = json.loads((folder / "engines.json").read_text(encoding="utf-8")).get("files") or []
        owned |= {(folder / r["file"]).resolve() for r in files
                  if isinstance(r, dict) and isinstance(r.get("file"), str)}
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        pass
    return owned


def check_output_file(path: Path, option: str) -> None:
    """``path`` can be written (its missing folders made then): refuse a folder in its place,
    a file where a folder of it should be, or a folder this user cannot write, naming the
    option. Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; expected a file to write")
    check_output_folder(path.parent, option, of=path)


def check_output_folder(folder: Path, option: str, of: Path | None = None) -> None:
    """``folder`` exists as a writable folder or can be made: its nearest existing ancestor
    is a folder this user can write (asked of the OS, then tried with a file made and
    removed there: root passes os.access everywhere, /proc and read-only mounts refuse
    the file). Leaves nothing."""
    folder = Path(folder).absolute()
    named = f"{option} {of if of is not None else folder}"
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{named}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{named}: {probe} is not writable")
    tmp = None
    try:
        tmp, fd = make_temporary(probe, ".specrt-probe-")
        os.close(fd)
    except OSError as e:
        raise UserError(f"{named}: cannot write in {probe} ({e.strerror or e})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def check_temp_folder(what: str) -> None:
    """UserError where no temporary folder can be written, for ``what`` (the command and option
    that writes there): tempfile's choice, $TMPDIR, else /tmp, /var/tmp and the working folder,
    none writable in a container with a read-only root and no /tmp of its own, or with TMPDIR
    mistyped there. tempfile's FileNotFoundError was a traceback after the work before it (a
    build's graphs); checked before that work, and tempfile keeps the folder it found."""
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError as e:
        raise UserError(f"{what} writes temporary files, and no temporary folder can be written ({e.strerror}): "
                        "set TMPDIR to a writable folder") from None


def make_temporary(folder: Path, prefix: str, suffix: str = "", is_folder: bool = False) -> tuple[Path, int | None]:
    """A new file (and its fd, open for writing) or folder (fd None) named ``prefix`` + random +
    ``suffix`` in ``folder``, mode 0600 / 0700, made exclusively as tempfile's are. Unlike
    tempfile's mkstemp / mkdtemp, a Ctrl-C or SIGTERM landing as the file or folder is made
    removes it: theirs was made before its name was returned, so an interrupt as they returned
    left an empty one the caller never knew of (session 55's interruption walk)."""
    for _ in range(100):
        name = Path(folder) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            if is_folder:
                os.mkdir(name, 0o700)
                return name, None
            # O_BINARY, as tempfile's: Windows opens in text mode without it, every "\n" written became "\r\n"
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
            return name, os.open(name, flags, 0o600)
        except FileExistsError:
            continue
        except BaseException:  # (raised as the call returned: what it made is this call's, by O_EXCL)
            with contextlib.suppress(OSError):
                os.rmdir(name) if is_folder else os.unlink(name)
            raise
    raise FileExistsError(f"no free temporary name in {folder}")


def check_engines_writable(engines_dir: Path, writes: str | None = None) -> None:
    """The commands that write into an engines folder (canary, profile, corpus, calibrate)
    find one they cannot write before their work, not when they write its result; ``writes``:
    the file they write there, which must not be a folder (calibrate decoded every prompt, then
    could not write calibration.json: "Is a directory")."""
    check_output_folder(engines_dir, "ENGINES_DIR")
    if writes is not None and (Path(engines_dir) / writes).is_dir():  # (a link to a folder too: written through)
        raise UserError(f"{Path(engines_dir) / writes}: a folder where this command writes its file {writes}: "
                        "move it away")


def umask() -> int:
    """The process's umask (read by setting it and back: the OS has no plain getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` when the block ends without an exception: written
    to a temp file in the same folder, synced, then os.replace; whole or absent (on an
    exception the temp file goes and ``path`` is untouched; missing folders above it are made).
    A file replaced keeps its mode (as ``sed -i`` and editors keep it: a stats file made
    private stays private), and its owner and group where this process may give them (root;
    a group of this user's), as GNU sed does; a new one gets the umask's mode."""
    path = Path(path)
    # /dev/stdout, /dev/null, a FIFO: written in place (replacing one put a file where the device was),
    # before a link is resolved (/dev/stdout on a pipe resolved to /proc/PID/fd/pipe:[N], no such file)
    if path.exists() and not path.is_file() and not path.is_dir():
        try:
            with open(path, "wb") as f:
                yield f
        except OSError as e:
            raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
        return
    if path.is_symlink():  # write where it points, keeping the link (os.replace put a file in its place)
        path = path.resolve()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temporaries(path)
        tmp, fd = make_temporary(path.parent, f".{path.name}.", ".tmp")
        with contextlib.suppress(OSError):  # held until the file is closed, after its rename: a live write
            _flock(fd)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            mode = 0o666 & ~umask()  # as open() would make it; mkstemp's are 0600
        else:
            _keep_owner(fd, st)  # (before the mode: a chown may clear set-id bits)
            mode = stat.S_IMODE(st.st_mode)
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)
        else:  # Windows before Python 3.13 (an AttributeError's traceback): its read-only flag alone
            os.chmod(tmp, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            if fcntl is not None:
                os.replace(tmp, path)  # (still open, so still locked: no sweep takes it in between)
        if fcntl is None:  # Windows: a file open here cannot be renamed (WinError 32), and with no flock
            os.replace(tmp, path)  # no sweep takes it meanwhile: closed first
    except BaseException as e:  # (the temporary made inside: a Ctrl-C just after mkstemp left an empty one)
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(e, OSError):  # disk full, a folder gone: said, not a traceback
            raise UserError(f"{path}: cannot write it ({e.strerror or e})") from None
        raise


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (a folder or file, not followed through a
    link; released when closed or when this process ends); None where a live process holds it
    or it cannot be locked (a file system without flock, gone): what tells a killed run's
    leftovers (a partial folder, a temporary file) from a live run's."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        _flock(fd)
    except OSError:  # (held by a live run: EWOULDBLOCK; no flock here: ENOLCK, EINVAL)
        os.close(fd)
        return None
    return fd


def _flock(fd: int, wait: bool = False) -> None:
    """An exclusive flock on ``fd`` (``wait``: until it is free); OSError ENOLCK where the OS
    has no flock (Windows: no fcntl), which every caller takes as "cannot be locked": there a
    killed run's partial folders and temporary files are left, not swept."""
    if fcntl is None:
        raise OSError(errno.ENOLCK, "no flock on this system")
    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))


TEMPORARY_AGE_S = 60.0  # a temporary this old that no write holds is a dead one's


def _remove_dead_temporaries(path: Path) -> None:
    """Remove the temporaries of ``atomic_file`` writes to ``path`` that were killed outright
    (kill -9, a power cut: ``.NAME.<12 hex>.tmp``, as big as the file, were left for good): those
    no live write holds (its flock) and older than TEMPORARY_AGE_S (one made a moment ago may
    not be locked yet), saying so on stderr. Where files cannot be locked, none is removed."""
    shape = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{12}}\.tmp")
    try:
        names = [n for n in os.listdir(path.parent) if shape.fullmatch(n)]
    except OSError:
        return
    for name in names:
        p = path.parent / name
        try:
            if not stat.S_ISREG(os.lstat(p).st_mode) or time.time() - os.lstat(p).st_mtime < TEMPORARY_AGE_S:
                continue
        except OSError:
            continue
        fd = try_lock(p)
        if fd is None:  # held by a live write, no flock here, or gone meanwhile
            continue
        try:
            os.unlink(p)
        except OSError:
            continue
        finally:
            os.close(fd)
        sys.stderr.write(f"note: removed {p}, the temporary file of an interrupted write\n")


def _keep_owner(fd: int, st: os.stat_result) -> None:
    """The file ``fd`` given the owner and group of ``st``, or its group alone, where this
    process may; left as it is otherwise (another user's file replaced by one who may not
    chown: the file is theirs now, as with GNU sed)."""
    own = os.fstat(fd)
    for uid in ((st.st_uid, -1) if st.st_uid != own.st_uid else (-1,)):
        if uid == -1 and st.st_gid == own.st_gid:
            return
        try:
            os.fchown(fd, uid, st.st_gid)
            return
        except OSError:  # EPERM: not root, or not in that group
            continue


def write_atomic(path: Path, data: dict, indent: int = 1) -> None:
    """JSON to ``path``, whole or absent (``atomic_file``), written as it is encoded: json.dumps
    with an indent holds every piece of the text in a list first (74 MB at its peak for the 10 MB
    --stats of 5000 prompts)."""
    with atomic_file(path) as f:
        text = io.TextIOWrapper(f, encoding="utf-8", newline="\n")  # ("\n" on Windows too, as before)
        json.dump(data, text, indent=indent)
        text.flush()
        text.detach()  # (f stays open: atomic_file syncs and renames it)


@contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive flock on ``folder`` itself (no lock file left in it), held for the block:
    calibrate's read and replacement of calibration.json, an output folder's sweep of dead
    runs' partial folders (manifest.atomic_folder); where the folder cannot be locked, none.
    Another process's lock is waited for, said on stderr (it may be held for long: a run
    stopped with Ctrl-Z, a large earlier output being removed)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            try:
                _flock(fd)
            except BlockingIOError:  # (waited for without a word: behind a run stopped with Ctrl-Z, it hung)
                # (stderr closed, `2>&-`: None; a broken pipe's OSError was taken as "cannot be locked": unlocked)
                with contextlib.suppress(AttributeError, OSError, ValueError):
                    sys.stderr.write(f"note: waiting for {folder}: another process holds its lock (a specrt run "
                                     "writing into it); this one goes on when that one ends\n")
                _flock(fd, wait=True)
        yield
    finally:
        os.close(fd)  # (releases the lock)
