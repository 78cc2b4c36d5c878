"""The ONNX Runtime path off Linux (macOS, Windows), simulated here on Linux where that is
honest: the command in a process that lacks what Windows lacks (the POSIX-only modules and
os functions, select.poll) and that refuses, as Windows does, to rename a file this process
holds open or mapped; Windows' branches of specrt's own code (sys.platform, uid None,
O_BINARY) with those values given; a stdout in Windows' ANSI code page (cp1252), as a
redirected one is there. What ONNX Runtime itself does on those systems is not checked here."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.runtime.test_text import bytewise, worded  # noqa: F401  (fixtures: tiny pairs with a tokenizer)

REPO = Path(__file__).resolve().parents[2]

# Loaded by every Python process started with its folder on PYTHONPATH (bench's workers too).
WINDOWS_LIKE = '''
import os, select, sys

ABSENT = ("fcntl", "resource", "termios", "pwd", "grp")  # POSIX-only modules: none on Windows


class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, _Absent())
for m in ABSENT:
    sys.modules.pop(m, None)
for name in ("sched_getaffinity", "getloadavg", "fchmod", "fchown"):  # (fchmod: Windows before 3.13)
    if hasattr(os, name):
        delattr(os, name)
if hasattr(select, "poll"):
    del select.poll


def _in_use(path):
    """The files under ``path`` this process holds open or mapped (/proc/self/fd, maps)."""
    p, held = os.path.realpath(path), []
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    with open("/proc/self/maps", encoding="utf-8") as f:
        held += [r.split(None, 5)[5].strip() for r in f if len(r.split(None, 5)) == 6]
    return [h for h in held if h == p or h.startswith(p + os.sep)]


def _as_windows(move):
    def moved(src, dst, *args, **kwargs):  # Windows renames no file open or mapped (WinError 32)
        used = _in_use(src)
        if used:
            raise PermissionError(13, f"[WinError 32] in use by this process: {used[0]}", os.fspath(src))
        return move(src, dst, *args, **kwargs)
    return moved


os.replace, os.rename = _as_windows(os.replace), _as_windows(os.rename)
'''


def _specrt(args: list, site: Path | None, **env) -> subprocess.CompletedProcess:
    """``python -m specrt ARGS``, with ``site`` (a folder holding a sitecustomize.py) first on
    PYTHONPATH; output as bytes."""
    e = {**os.environ, "SPECRT_THP": "0", **env}
    if site is not None:
        e["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "specrt", *map(str, args)], capture_output=True, env=e,
                          timeout=300)


def test_the_commands_run_without_what_windows_lacks(worded, tmp_path):  # noqa: F811
    """run (--stats), calibrate, bench --peers none and build in a process without fcntl,
    resource, os.getloadavg, os.sched_getaffinity, os.fchmod or select.poll, whose renames
    fail on files it holds open: each ended at its start (ImportError of fcntl, then of
    resource), bench's workers at theirs (os.getloadavg), and every JSON written whole (the
    --stats file, calibration.json) failed with WinError 32, renamed while still open."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WINDOWS_LIKE, encoding="utf-8")
    probe = subprocess.run([sys.executable, "-c", "import fcntl"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(site)})
    assert probe.returncode == 1 and "No module named 'fcntl'" in probe.stderr, probe.stderr  # (it applies)
    engines = tmp_path / "engines"
    shutil.copytree(worded, engines)  # (calibrate writes into it)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w4 w5"}\n{"prompt": "w3 w6"}\n', encoding="utf-8")

    r = _specrt(["run", engines, "--prompt", "w1 w2", "--max-new-tokens", "5", "--stats", tmp_path / "s.json"], site)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    assert len(json.loads((tmp_path / "s.json").read_text(encoding="utf-8"))["prompts"][0]["output_token_ids"]) == 5

    r = _specrt(["calibrate", engines, "--prompts", prompts, "--max-new-tokens", "8"], site)
    assert r.returncode == 0 and (engines / "calibration.json").is_file(), r.stderr.decode()

    r = _specrt(["bench", engines, "--prompts", prompts, "--peers", "none", "--governors", "off",
                 "--max-new-tokens", "4", "-o", tmp_path / "bench"], site)
    assert r.returncode == 0, r.stderr.decode()
    config = json.loads((tmp_path / "bench" / "bench.json").read_text(encoding="utf-8"))["configs"]["specrt:off"]
    assert config["tokens_per_s_median"] > 0 and config["load_average"] == {"start": None, "end": None}, config

    r = _specrt(["build", engines / "export", "-o", tmp_path / "built", "--depths", "1", "--max-context", "64",
                 "--profile-repeats", "1", "--no-canary"], site)
    assert r.returncode == 0 and (tmp_path / "built" / "engines.json").is_file(), r.stderr.decode()


def test_serve_answers_without_select_poll(worded, monkeypatch):  # noqa: F811
    """Windows' select module has no poll: every request failed in the check whether its
    client had left (an AttributeError), its connection closed with no answer."""
    import select

    from specrt.cmd_serve import Server, make_server
    from specrt.runtime.sampling import SamplingParams

    monkeypatch.delattr(select, "poll")
    app = Server(worded, "fixed:3", SamplingParams(), 8, "tiny", log=lambda s: None)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "w6 w7"}], "max_tokens": 4}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{httpd.server_address[1]}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200 and json.loads(resp.read())["usage"]["completion_tokens"] == 4
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.close()


@pytest.mark.parametrize("unbuffered", ["", "1"])  # ("": unset, as Python reads it)
def test_an_answer_goes_to_a_stdout_that_cannot_hold_it(bytewise, tmp_path, unbuffered):  # noqa: F811
    """A redirected stdout on Windows writes its ANSI code page (cp1252, as PYTHONIOENCODING
    makes it here): the answer's first character it lacks (U+FFFD of a byte-level model's cut
    character, a CJK one) was a UnicodeEncodeError's traceback; it is "?" now, the rest as it is.
    Under PYTHONUNBUFFERED too, where stdout is written through cli._WholeWrites (mutant
    m71b-66: that wrapper's errors "strict", not stdout's "replace")."""
    args = ["run", bytewise, "--prompt", "héllo", "--max-new-tokens", "20"]
    full = _specrt(args, None, PYTHONIOENCODING="utf-8")
    assert full.returncode == 0, full.stderr.decode()
    text = full.stdout.decode("utf-8")
    assert any(ch not in "?" and ch.encode("cp1252", "replace") == b"?" for ch in text), text  # (a test)
    r = _specrt(args, None, PYTHONIOENCODING="cp1252", PYTHONUNBUFFERED=unbuffered)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr.decode()
    assert r.stdout == text.encode("cp1252", "replace"), (r.stdout, text)


def test_a_reader_that_leaves_ends_run_with_exit_1_where_there_is_no_sigpipe(worded, tmp_path):  # noqa: F811
    """Windows has no SIGPIPE: `specrt run ... | head -1` there ends with exit 1 once the
    reader has gone, saying nothing, and what stdout still held goes to the null device, not
    to a flush at exit that fails again (mutant m71b-59: Python's "Exception ignored ...
    BrokenPipeError", exit 120). Buffered stdout, as a pipe's is without PYTHONUNBUFFERED."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import signal\n\ndel signal.SIGPIPE\n", encoding="utf-8")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w3 w1"}\n' * 5000, encoding="utf-8")
    env = {**os.environ, "SPECRT_THP": "0", "PYTHONUNBUFFERED": "", "PYTHONPATH": os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    p = subprocess.Popen([sys.executable, "-m", "specrt", "run", str(worded), "--prompts", str(f), "--max-new-tokens",
                          "100", "--governor", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().strip()  # an answer
        p.stdout.close()  # the reader leaves
        code = p.wait(timeout=120)  # (what it wrote to stderr by then fits the pipe)
    finally:
        p.kill()
    err = p.stderr.read().decode()
    assert code == 1, (code, err)
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err, err


def _text_opens(tree: ast.AST) -> list[tuple[int, str]]:
    """The calls in ``tree`` that read or write text in the locale's encoding: read_text() and
    write_text(X) without encoding=, open() / os.fdopen() in a text mode without encoding= (a
    mode given as a name is taken as text). A zip archive's open (a name bound by ``with
    zipfile.ZipFile(...) as NAME``) is binary whatever its mode, "r" or "w"."""
    found, archives = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name) and isinstance(
                node.context_expr, ast.Call) and ast.unparse(node.context_expr.func) in ("zipfile.ZipFile", "ZipFile"):
            archives.add(node.optional_vars.id)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f, kw = node.func, {k.arg for k in node.keywords}
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if "encoding" in kw or name not in ("read_text", "write_text", "open", "fdopen"):
            continue
        if name == "open" and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in (
                "os", "gzip", "tarfile", "zipfile", *archives):
            continue  # (os.open: a descriptor; the archives' open: binary, or said by its mode)
        if name in ("open", "fdopen"):
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), ast.Constant("r"))
            if isinstance(mode, ast.Constant) and "b" in str(mode.value):
                continue
        elif name == "read_text" and node.args or name == "write_text" and len(node.args) > 1:
            continue  # (the encoding given by position)
        found.append((node.lineno, name))
    return found


def test_text_files_are_read_and_written_as_utf8():
    """Every text file the package reads or writes says its encoding: without encoding=
    Python takes the locale's, cp1252 on Windows (a JSON file with a non-ASCII prompt or
    path read back garbled, or not written at all: UnicodeEncodeError)."""
    bare = [f"{p.relative_to(REPO)}:{line}: {name}()" for folder in ("specrt", "engines", "runtime", "export")
            for p in sorted((REPO / folder).rglob("*.py"))
            for line, name in _text_opens(ast.parse(p.read_text(encoding="utf-8")))]
    assert not bare, "text read or written in the locale's encoding (give encoding=\"utf-8\"):\n" + "\n".join(bare)


def test_a_killed_runs_moved_aside_output_is_left_on_windows(tmp_path, monkeypatch):
    """On Windows signal 0 is CTRL_C_EVENT: os.kill(pid, 0), the check whether the run that
    moved OUT aside still lives, sent a Ctrl-C through the console. There the folder is left
    (as a live run's) and os.kill is not called."""
    from specrt import manifest

    calls = []
    monkeypatch.setattr(manifest.os, "kill", lambda pid, sig: calls.append((pid, sig)))
    aside = tmp_path / ".out.old-4194304"  # (past Linux's PIDs: a dead run's)
    aside.mkdir()
    monkeypatch.setattr(sys, "platform", "win32")
    manifest._settle_moved_aside(tmp_path / "out")
    monkeypatch.undo()
    assert calls == [] and aside.is_dir() and not (tmp_path / "out").exists()


def test_without_flock_nothing_is_swept_and_files_are_still_written(tmp_path, monkeypatch, capsys):
    """Windows has no flock (no fcntl): no lock tells a killed run's temporary files and
    partial folders from a live run's, so none is removed, and the writes themselves go on
    (mutation round of session 69, P45: a _flock that returned as if it had locked swept a
    live run's temporary file and partial folder alike)."""
    import time

    from specrt import paths
    from specrt.manifest import atomic_folder

    temporary, partial = tmp_path / ".s.json.0123456789ab.tmp", tmp_path / ".o.partial-0123456789ab"
    temporary.write_text("x")
    old = time.time() - 120
    os.utime(temporary, (old, old))
    partial.mkdir()
    monkeypatch.setattr(paths, "fcntl", None)
    assert paths.try_lock(temporary) is None
    paths.write_atomic(tmp_path / "s.json", {"a": 1})
    with atomic_folder(tmp_path / "o") as tmp:
        (tmp / "f").write_text("x")
    monkeypatch.undo()
    assert json.loads((tmp_path / "s.json").read_text(encoding="utf-8")) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([temporary.name, partial.name, "o", "s.json"])
    assert "note:" not in capsys.readouterr().err


def test_temporary_files_open_in_binary_mode(tmp_path, monkeypatch):
    """os.open opens in text mode on Windows unless given O_BINARY (tempfile's mkstemp gives it):
    atomic_file's temporary wrote every "\\n" as "\\r\\n" there (a corpus file, compare's saved
    inputs: binary data changed). Here the flag is given a value, as Windows' os has one."""
    from specrt import paths

    flags, real_open = [], os.open
    monkeypatch.setattr(os, "O_BINARY", 0x8000, raising=False)

    def recording_open(path, flag, mode=0o777, **kw):
        flags.append(flag)
        return real_open(path, flag & ~0x8000, mode, **kw)

    monkeypatch.setattr(paths.os, "open", recording_open)
    name, fd = paths.make_temporary(tmp_path, ".x.")
    os.close(fd)
    assert flags and all(f & 0x8000 for f in flags), flags


def test_compares_folder_is_kept_where_there_is_no_uid(tmp_path):
    """Windows has no os.getuid, and every folder's mode reads 0o777 there: compare's
    by-hand folder was refused as one others can write and a fresh one made in %TEMP% each
    run (3.6 MB a run on SmolLM2, never removed)."""
    from specrt.engines.compare import _private_folder

    p = tmp_path / "specrt-compare-0-key"
    p.mkdir()
    p.chmod(0o777)
    assert _private_folder(p, None) == p


def test_a_workers_ru_maxrss_is_in_bytes_on_macos(worded, tmp_path, monkeypatch):  # noqa: F811
    """macOS's getrusage counts ru_maxrss in bytes, Linux's in KiB: a macOS worker reported
    1024 times its peak."""
    import resource
    from types import SimpleNamespace

    from specrt import cmd_bench

    job = {"kind": "specrt", "engines": str(worded), "governor": "off", "threads": 1, "prompts": [[5, 6, 7]],
           "max_new_tokens": 2, "eos": [2], "warmup_tokens": 0}
    (tmp_path / "job.json").write_text(json.dumps(job), encoding="utf-8")
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=300 << 20))
    monkeypatch.setattr(cmd_bench.sys, "platform", "darwin")
    assert cmd_bench.worker_main(str(tmp_path / "job.json"), str(tmp_path / "result.json")) == 0
    monkeypatch.undo()
    res = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert res["ok"] and res["ru_maxrss_bytes"] == 300 << 20, res


def _on_a_terminal(args: list, **env) -> bytes:
    """``python -m specrt ARGS`` with stdout and stderr on a terminal (a pty), ``env`` over this
    process's environment less NO_COLOR and TERM; what the terminal got."""
    import pty

    e = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "specrt", *map(str, args)], stdout=slave, stderr=slave,
                         env={**e, "SPECRT_THP": "0", **env})
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # (EIO: the process closed the terminal's last descriptor)
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=300) == 0, out
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pty")
def test_no_colour_where_the_user_or_the_terminal_says_so(pair):
    """An environment walk: on a terminal the canary's warning came in yellow with NO_COLOR set
    (no-color.org) and with TERM=dumb (a terminal that shows the escape sequences as text);
    both now get it plain. An empty NO_COLOR is no request (no-color.org), and another terminal
    keeps the colour."""
    _, engines, _ = pair
    assert b"\x1b[33m" in _on_a_terminal(["canary", engines], TERM="xterm")
    assert b"\x1b[33m" in _on_a_terminal(["canary", engines], TERM="xterm", NO_COLOR="")
    for env in ({"NO_COLOR": "1", "TERM": "xterm"}, {"TERM": "dumb"}):
        out = _on_a_terminal(["canary", engines], **env)
        assert b"WARNING: depth-1 acceptance" in out and b"\x1b[" not in out, (env, out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the C locale's ASCII arguments")
def test_text_given_on_the_command_line_under_an_ascii_locale_is_read_as_utf8(bytewise):  # noqa: F811
    """An environment walk: with PYTHONUTF8=0 in the C locale Python decodes the arguments as
    ASCII, and `run --prompt "héllo"` (a terminal's UTF-8) was refused as "not valid UTF-8 text
    (byte 0xc3 ...)" (a --stop never matched; chat's --system the same), where chat read the
    same text from its input. They are read as UTF-8 now and answered as under a UTF-8 locale;
    bytes that are not UTF-8 are still said so."""
    ascii_locale = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    run = ["run", bytewise, "--prompt", "héllo", "--max-new-tokens", "12", "--governor", "fixed:3", "--stop", "ü"]
    want = _specrt(run, None, PYTHONIOENCODING="utf-8")
    got = _specrt(run, None, **ascii_locale)
    assert want.returncode == 0 and got.returncode == 0, got.stderr.decode()
    assert got.stdout == want.stdout, (got.stdout, want.stdout)
    bad = subprocess.run([sys.executable, "-m", "specrt", "run", str(bytewise), "--prompt", b"h\xffllo"],
                         capture_output=True, env={**os.environ, "SPECRT_THP": "0", **ascii_locale}, timeout=300)
    last = bad.stderr.splitlines()[-1]
    assert bad.returncode == 1 and last.startswith(b"error: the prompt is not valid UTF-8 text (byte 0xff"), bad.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("localedef") is None
                    or not Path("/usr/share/i18n/locales/ja_JP").is_file(), reason="glibc's localedef and ja_JP")
def test_text_given_on_the_command_line_under_an_euc_jp_locale(bytewise, tmp_path):  # noqa: F811
    """Under a multi-byte locale that is not UTF-8 (EUC-JP, made here with localedef) Python
    decodes the arguments in it: `run --prompt 中` (UTF-8 E4 B8 AD: an EUC-JP character, then
    a byte that is not one) is read as typed, as under a UTF-8 locale (m71a-81: the bytes taken
    back as UTF-8, not as os.fsencode gives them, which no ASCII or UTF-8 locale tells apart).
    `--prompt "café €"` was a traceback (h74d): glibc reads its 0x82 as U+0082, which Python's
    euc_jp codec cannot encode back; said now, with what to do."""
    subprocess.run(["localedef", "-i", "ja_JP", "-f", "EUC-JP", str(tmp_path / "ja_JP.eucjp")], capture_output=True,
                   timeout=120)
    if not (tmp_path / "ja_JP.eucjp").is_dir():
        pytest.skip("localedef made no ja_JP.eucjp")
    euc = {"LOCPATH": str(tmp_path), "LC_ALL": "ja_JP.eucjp", "PYTHONUTF8": "0", "PYTHONIOENCODING": "utf-8"}
    run = ["run", bytewise, "--prompt", "中", "--max-new-tokens", "12", "--governor", "fixed:3"]
    want = _specrt(run, None, PYTHONIOENCODING="utf-8")
    got = _specrt(run, None, **euc)
    assert want.returncode == 0 and got.returncode == 0, got.stderr.decode()
    assert got.stdout == want.stdout, (got.stdout, want.stdout)
    bad = _specrt(["run", bytewise, "--prompt", "café €"], None, **euc)
    assert bad.returncode == 1 and b"Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.rstrip().endswith(b"under this locale's encoding (euc_jp): run under a UTF-8 locale "
                                        b"(LC_ALL=C.UTF-8) or with PYTHONUTF8=1"), bad.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the C locale's ASCII arguments")
def test_an_error_under_an_ascii_locale_shows_a_non_ascii_path_escaped(tmp_path):
    """The environment walk's 17 (session 70; h74c): under the ASCII locale (PYTHONIOENCODING
    unset) an error naming /tmp/dé said "/tmp/d??" (the path's bytes are lone surrogates there,
    which click wrote with errors="replace"), so the path could not be read back. They are
    escaped now, as Python's own stderr escapes them: specrt's errors and click's alike."""
    (tmp_path / "dé").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONIOENCODING"}
    env.update(SPECRT_THP="0", LC_ALL="C", PYTHONUTF8="0")
    for name, said in (("dé", "not a complete engines folder (no engines.json)"), ("nodé", None)):
        r = subprocess.run([sys.executable, "-m", "specrt", "run", str(tmp_path / name), "--prompt", "hi"],
                           capture_output=True, env=env, timeout=120)
        path = f"{tmp_path}/{name[:-1]}\\udcc3\\udca9".encode()
        want = (b"error: " + path + b": " + said.encode() if said else
                b"error: Invalid value for 'ENGINES_DIR': " + path + b" is not a folder (see")
        assert r.returncode == 1 and r.stderr.startswith(want) and b"?" not in r.stderr, r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the C locale's ASCII arguments")
def test_a_model_name_given_under_an_ascii_locale_is_served_as_typed(bytewise):  # noqa: F811
    """The same walk: `serve --model-name modèle` under the ASCII locale served the id
    "mod\\udcc3\\udca8le" (lone surrogates in its JSON), and a request naming "modèle" got 404."""
    import signal

    env = {**os.environ, "SPECRT_THP": "0", "LC_ALL": "C", "PYTHONUTF8": "0"}
    p = subprocess.Popen([sys.executable, "-m", "specrt", "serve", str(bytewise), "--port", "0", "--governor",
                          "fixed:1", "--model-name", "modèle"], stderr=subprocess.PIPE, env=env)
    try:
        line = b""
        while b"serving" not in line:
            line = p.stderr.readline()
            assert line, "the server exited before serving"
        url = line.split(b" on ")[1].split(b" ")[0].decode()
        with urllib.request.urlopen(url + "/models", timeout=60) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["modèle"]
    finally:
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=120)
