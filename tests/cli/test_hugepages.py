"""specrt/hugepages.py: the glibc huge-page tunable is added where the kernel gives huge pages
on request, kept out where the user or the kernel setting says no, and the ``specrt`` command
restarts itself with it exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specrt.cmd_bench import worker_env
from specrt.hugepages import TUNABLE, thp_mode, wanted, with_thp

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages via glibc tunables: Linux only")


def _setting(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "enabled"
    p.write_text(text)
    return p


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
    assert thp_mode(_setting(tmp_path, "always [madvise] never\n")) == "madvise"
    assert thp_mode(_setting(tmp_path, "[always] madvise never\n")) == "always"
    assert thp_mode(tmp_path / "missing") is None

    assert thp_mode(_setting(tmp_path, "madvise\n")) is None  # (no bracketed choice: unknown, nothing asked)
    if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():  # the kernel's own, read by default
        assert thp_mode() in ("always", "madvise", "never")


def test_glibc_version_and_the_first_one_that_reads_the_tunable():
    """The tunable is read from glibc 2.35: 2.34 gets none (it would claim huge pages no
    allocation got), and this process's version reads as (major, minor), the C library's own
    (a swapped pair, (36, 2), passed every check above as "new enough")."""
    import platform

    from specrt.hugepages import glibc_version, honours_tunable

    assert honours_tunable((2, 35)) and honours_tunable((3, 0))
    assert not honours_tunable((2, 34)) and not honours_tunable(None)
    lib, version = platform.libc_ver()
    if lib == "glibc":
        assert glibc_version() == tuple(int(x) for x in version.split(".")[:2])


@linux
def test_tunable_added_only_where_it_helps(tmp_path):
    # glibc's value 1 is transparent huge pages by madvise; 2 would map from the reserved hugetlbfs pool instead
    assert TUNABLE == "glibc.malloc.hugetlb=1"
    madvise, always = _setting(tmp_path, "always [madvise] never"), tmp_path / "a"
    always.write_text("[always] madvise never")
    assert with_thp({}, setting=madvise)["GLIBC_TUNABLES"] == TUNABLE
    # other tunables kept, ours appended once
    env = with_thp({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, setting=madvise)
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}"
    assert with_thp(env, setting=madvise)["GLIBC_TUNABLES"] == env["GLIBC_TUNABLES"]
    # the user's own choice (0: none, 2: the hugetlbfs pool) is kept, not overridden by ours after it (glibc reads
    # the tunables in order, the last one set wins)
    for own in ("glibc.malloc.hugetlb=0", "a=1:glibc.malloc.hugetlb=2"):
        assert with_thp({"GLIBC_TUNABLES": own}, setting=madvise)["GLIBC_TUNABLES"] == own
    assert "GLIBC_TUNABLES" not in with_thp({}, setting=always)  # the kernel does it anyway
    assert "GLIBC_TUNABLES" not in with_thp({"SPECRT_THP": "0"}, setting=madvise)  # the user said no
    assert not wanted({"SPECRT_THP": "0"}, setting=madvise)
    assert wanted({"SPECRT_THP": "yes"}, setting=madvise)  # (only 0 turns it off)
    # glibc before 2.35 ignores the tunable: not added (a report claimed huge pages there)
    assert wanted({}, setting=madvise, glibc=(2, 35)) and not wanted({}, setting=madvise, glibc=(2, 31))


def test_a_libc_that_is_not_glibc_gets_no_tunable(tmp_path, monkeypatch):
    """musl (no glibc version to read) has no such tunable: not added, and specrt bench's
    report does not claim huge pages from it."""
    import specrt.hugepages as h
    from specrt.cmd_bench import hugepages_settings

    madvise = _setting(tmp_path, "always [madvise] never")
    monkeypatch.setattr(h, "glibc_version", lambda: None)
    assert not h.wanted({}, setting=madvise)
    monkeypatch.setattr(h, "thp_mode", lambda setting=None: "madvise")
    monkeypatch.setenv("GLIBC_TUNABLES", TUNABLE)
    got = hugepages_settings("matched")
    assert got["glibc"] is None and not got["specrt"] and not got["peers"]
    # a peer run as shipped loses ours and keeps the rest
    assert with_thp({"GLIBC_TUNABLES": f"a=1:{TUNABLE}"}, on=False)["GLIBC_TUNABLES"] == "a=1"
    assert "GLIBC_TUNABLES" not in with_thp({"GLIBC_TUNABLES": TUNABLE}, on=False)


@linux
def test_bench_workers_environment(monkeypatch):
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SPECRT_THP", raising=False)
    expect = thp_mode() == "madvise"
    assert (TUNABLE in worker_env({"kind": "specrt"}).get("GLIBC_TUNABLES", "")) == expect
    assert (TUNABLE in worker_env({"kind": "peer", "hugepages": True}).get("GLIBC_TUNABLES", "")) == expect
    assert TUNABLE not in worker_env({"kind": "peer", "hugepages": False}).get("GLIBC_TUNABLES", "")


def _reexec(env: dict) -> str:
    """Run reexec_with_thp in a fresh interpreter whose re-executed code prints what it got."""
    show = "import os, sys; print('child', os.environ.get('GLIBC_TUNABLES', ''), os.environ.get('SPECRT_THP_REEXEC'), sys.argv[1:])"
    r = subprocess.run([sys.executable, "-c", "from specrt.hugepages import reexec_with_thp; "
                        f"reexec_with_thp(['run', '--x'], code={show!r}); print('parent')"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@linux
def test_specrt_command_restarts_once_with_the_tunable():
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC")}
    if thp_mode() == "madvise":
        assert _reexec(env) == f"child {TUNABLE} 1 ['run', '--x']"
    else:
        assert _reexec(env) == "parent"  # always / never: nothing to ask for
    assert _reexec({**env, "SPECRT_THP": "0"}) == "parent"
    assert _reexec({**env, "SPECRT_THP_REEXEC": "1"}) == "parent"  # never twice


def test_console_entry_is_the_restarting_one():
    """The ``specrt`` script is launch.entry, which runs cli.entry, and entry asks
    reexec_with_thp with the command's arguments before the CLI runs (the restart itself:
    the test above); the restarted process starts at launch.entry too."""
    from specrt.hugepages import CLI_CODE

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'specrt = "specrt.launch:entry"' in text and "from specrt.launch import entry;" in CLI_CODE
    code = ("import sys, specrt.hugepages as h, specrt.cli as c, specrt.launch as l; "
            "h.reexec_with_thp = lambda argv: print('asked', argv); "
            "c.main = lambda: print('cli'); sys.argv = ['specrt', 'run', '--x']; l.entry()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split("\n")[:2] == ["asked ['run', '--x']", "cli"], (r.stdout, r.stderr)


def test_ctrl_c_while_the_command_line_is_imported_is_aborted_not_a_traceback():
    """A user walk: Ctrl-C in the first ~0.4 s of any command struck the import of the
    command line (click, http.server, ...) and printed its traceback. The console script
    says "Aborted!" and exits 1 then, as a Ctrl-C during a command does. (The Ctrl-C is
    raised where the import starts: a signal's timing cannot place it there.)"""
    code = ("import sys\n"
            "class Strike:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'specrt.cli':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Strike())\n"
            "from specrt.launch import entry\n"
            "sys.argv = ['specrt', '--version']\n"
            "entry()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr == "\nAborted!\n" and not r.stdout, (r.stdout, r.stderr)


@linux
def test_a_script_restarts_as_itself(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text("import os, sys\nfrom specrt.hugepages import reexec_with_thp, script_code\n"
                      "reexec_with_thp(sys.argv[1:], script_code(__file__))\n"
                      "print(os.environ.get('SPECRT_THP_REEXEC'), sys.argv[1:])\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC")}
    r = subprocess.run([sys.executable, str(script), "--a", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    want = "1" if thp_mode() == "madvise" else "None"
    assert r.stdout.strip() == f"{want} ['--a', '1']"


def test_the_restarted_process_does_not_import_from_the_working_folder(tmp_path):
    """``python -c CODE`` puts the working folder first on sys.path, where the ``specrt``
    command had its bin folder: a specrt/ or json.py there shadowed the real ones in the
    restarted process (every call, where the kernel gives huge pages on request). The
    restart's code drops it; a script's restart gets the script's own folder, as before."""
    from specrt.hugepages import CLI_CODE, script_code

    here = tmp_path / "cwd"
    (here / "specrt").mkdir(parents=True)
    (here / "specrt" / "__init__.py").write_text("raise SystemExit('shadowed: specrt from the working folder')\n")
    (here / "json.py").write_text("raise SystemExit('shadowed: json from the working folder')\n")
    r = subprocess.run([sys.executable, "-c", CLI_CODE, "--version"], cwd=here, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "SPECRT_THP_REEXEC": "1"})
    assert r.returncode == 0 and "specrt, version" in r.stdout, (r.stdout, r.stderr)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "helper_mod.py").write_text("X = 42\n")
    script = tools / "tool.py"
    script.write_text("import json, helper_mod\nprint(helper_mod.X, json.dumps([1]))\n")
    r = subprocess.run([sys.executable, "-c", script_code(str(script))], cwd=here, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "42 [1]", (r.stdout, r.stderr)


@linux
def test_the_environment_given_is_copied_not_changed(tmp_path, monkeypatch):
    """with_thp returns a copy: with the caller's dict changed in place, specrt bench's
    worker_env (no dict: os.environ) put the tunable into the bench's own environment, which
    every later process it starts then inherits."""
    madvise = _setting(tmp_path, "always [madvise] never")
    given = {"GLIBC_TUNABLES": "a=1"}
    assert with_thp(given, setting=madvise)["GLIBC_TUNABLES"] == f"a=1:{TUNABLE}" and given == {"GLIBC_TUNABLES": "a=1"}
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("SPECRT_THP", raising=False)
    assert TUNABLE in with_thp(setting=madvise)["GLIBC_TUNABLES"] and "GLIBC_TUNABLES" not in os.environ
    # an empty environment given is the one judged, not this process's (here off: SPECRT_THP=0)
    monkeypatch.setenv("SPECRT_THP", "0")
    assert with_thp({}, setting=madvise) == {"GLIBC_TUNABLES": TUNABLE}



@linux
def test_what_was_printed_before_the_restart_is_not_lost():
    """The restart replaces the process: what it had printed but not yet written (stdout to a
    pipe or file is block-buffered, unless PYTHONUNBUFFERED) went with it unless flushed."""
    drop = ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    code = ("import sys; from specrt.hugepages import reexec_with_thp; print('before'); sys.stderr.write('note: '); "
            "reexec_with_thp([], code=\"import sys; print('child'); sys.stderr.write('said')\"); print('parent')")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    want = "child" if thp_mode() == "madvise" else "parent"
    assert r.returncode == 0 and r.stdout.split() == ["before", want], (r.stdout, r.stderr)
    # (m71a-73: stderr too, a line not yet ended: stderr is line-buffered)
    assert r.stderr == ("note: said" if want == "child" else "note: "), r.stderr


@linux
@pytest.mark.parametrize("case", ["no interpreter", "stdout closed"])
def test_a_restart_that_cannot_happen_as_planned_runs_on(case):
    """Where the restart's exec fails (no interpreter at sys.executable any more: a removed
    virtual environment; a sandbox refusing execve) the command runs on without huge pages,
    not with an OSError; with stdout closed (``specrt ... >&-``: sys.stdout is None) it
    restarts as ever, not with an AttributeError's traceback before every command."""
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC")}
    code = ("import sys; from specrt.hugepages import reexec_with_thp; "
            + ("sys.executable = '/nonexistent/python'; " if case == "no interpreter" else "")
            + "reexec_with_thp([], code=\"import sys; sys.stderr.write('child')\"); sys.stderr.write('parent')")
    closed = ["sh", "-c", '"$0" -c "$1" >&-', sys.executable, code]  # (the shell closes the child's stdout)
    argv = [sys.executable, "-c", code] if case == "no interpreter" else closed
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    want = "child" if thp_mode() == "madvise" and case == "stdout closed" else "parent"
    assert r.returncode == 0 and r.stderr == want, (r.stdout, r.stderr)

def test_a_restarted_script_runs_as_it_was_started(tmp_path):
    """A script's restart (script_code) runs it as ``python tools/x.py`` did: as __main__
    (its ``if __name__ == "__main__"`` block runs), with its path as sys.argv[0] (argparse's
    program name) and its own folder ahead of the installed packages (a module there of an
    installed one's name is its own)."""
    from specrt.hugepages import script_code

    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "click.py").write_text("OWN = True\n")
    script = tools / "tool.py"
    script.write_text("import sys, click\nif __name__ == '__main__':\n"
                      "    print(sys.argv, getattr(click, 'OWN', False))\n")
    env = {**os.environ, "SPECRT_THP_REEXEC": "1"}
    direct = subprocess.run([sys.executable, str(script), "--a"], env=env, capture_output=True, text=True, timeout=60)
    again = subprocess.run([sys.executable, "-c", script_code(str(script)), "--a"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert direct.stdout.strip() == f"{[str(script), '--a']} True", (direct.stdout, direct.stderr)
    assert again.stdout == direct.stdout and again.returncode == 0, (again.stdout, again.stderr)


def test_the_restarted_command_names_itself_specrt(tmp_path):
    """The restarted ``specrt`` command (CLI_CODE, ``python -c``) says ``specrt`` in its
    usage lines and errors, not ``-c`` (click names a program after sys.argv[0])."""
    from specrt.hugepages import CLI_CODE

    r = subprocess.run([sys.executable, "-c", CLI_CODE, "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "SPECRT_THP_REEXEC": "1"})
    assert r.returncode == 0 and r.stdout.startswith("Usage: specrt "), (r.stdout, r.stderr)


@linux
def test_the_restart_keeps_the_interpreters_options(tmp_path):
    """An environment walk: ``python -X utf8 -O -B -m specrt ...`` was restarted as a bare
    ``python -c``, without them (UTF-8 mode, which a user of a non-UTF-8 locale asks for so, a
    prompt given on the command line then refused as "not valid UTF-8"), where the kernel gives
    huge pages on request; kept where it does not. The restart passes them on."""
    drop = ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC", "PYTHONUTF8", "PYTHONOPTIMIZE",
            "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if not wanted(env):
        pytest.skip("no restart here: the kernel gives huge pages always or never, or glibc ignores the tunable")
    show = ("import os, sys; print(os.environ.get('SPECRT_THP_REEXEC'), sys.flags.utf8_mode, sys.flags.optimize, "
            "sys.flags.dont_write_bytecode)")
    r = subprocess.run([sys.executable, "-X", "utf8", "-O", "-B", "-c",
                        f"from specrt.hugepages import reexec_with_thp; reexec_with_thp([], code={show!r})"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["1", "1", "1", "1"], (r.stdout, r.stderr)


@linux
def test_specrt_thp_is_turned_off_as_users_write_off(tmp_path):
    """``SPECRT_THP=false`` (or no, off, any case) restarted the command with the tunable, as
    anything but 0 did, without a word; "yes" and "1" still leave it on."""
    madvise = _setting(tmp_path, "always [madvise] never")
    for v in ("0", "false", "False", "no", "OFF", " 0 "):
        assert not wanted({"SPECRT_THP": v}, setting=madvise), v
        assert "GLIBC_TUNABLES" not in with_thp({"SPECRT_THP": v}, setting=madvise), v
    for v in ("1", "yes", "on", ""):
        assert wanted({"SPECRT_THP": v}, setting=madvise, glibc=(2, 36)), v
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPECRT_THP", "SPECRT_THP_REEXEC")}
    assert _reexec({**env, "SPECRT_THP": "false"}) == "parent"


def test_a_later_hugetlb_entry_of_the_users_is_the_one_read(monkeypatch):
    """glibc reads the last ``glibc.malloc.hugetlb`` of GLIBC_TUNABLES: a user's
    ``glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0`` gets no huge pages (0 kB AnonHugePages
    in a `specrt run`), which specrt bench's report said its workers and peers had."""
    from specrt.cmd_bench import hugepages_settings
    from specrt.hugepages import has_tunable

    assert not has_tunable({"GLIBC_TUNABLES": f"{TUNABLE}:glibc.malloc.hugetlb=0"})
    assert has_tunable({"GLIBC_TUNABLES": f"glibc.malloc.hugetlb=0:a=1:{TUNABLE}"})
    assert not has_tunable({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"}) and not has_tunable({})
    monkeypatch.delenv("SPECRT_THP", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", f"{TUNABLE}:glibc.malloc.hugetlb=0")
    got = hugepages_settings("matched")
    assert got["specrt"] is (got["kernel_thp"] == "always") and got["peers"] is (got["kernel_thp"] == "always"), got


def test_a_peer_run_as_shipped_keeps_the_users_own_hugetlb_choice():
    """m71a-25: a peer run as shipped (``on=False``) loses specrt's tunable alone: the user's own
    ``glibc.malloc.hugetlb`` (0: none, 2: the hugetlbfs pool) is the user's setting, which the
    peers then run with as any program the user starts would."""
    for own in ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=2:a=1"):
        assert with_thp({"GLIBC_TUNABLES": f"{own}:{TUNABLE}"}, on=False)["GLIBC_TUNABLES"] == own, own


def test_a_c_library_version_that_cannot_be_read_is_none(monkeypatch):
    """m71a-29: where ``os.confstr`` does not know CS_GNU_LIBC_VERSION (macOS and other
    platforms without glibc: Python's ValueError "unrecognized configuration name") or glibc's
    answer holds no minor number, glibc_version is None (no tunable; bench reports no glibc),
    not a ValueError's traceback."""
    import specrt.hugepages as h

    def unknown(name):
        raise ValueError("unrecognized configuration name")

    monkeypatch.setattr(h.os, "confstr", unknown)
    assert h.glibc_version() is None
    monkeypatch.setattr(h.os, "confstr", lambda name: "glibc 2")
    assert h.glibc_version() is None
    monkeypatch.setattr(h.os, "confstr", lambda name: "glibc 2.36")
    assert h.glibc_version() == (2, 36)


def test_a_kernel_setting_that_cannot_be_read_is_unknown(tmp_path):
    """m71a-55: a setting that is there but cannot be read as a file (a folder here; a /sys
    file a sandbox refuses) is an unknown mode, nothing asked, as a missing one is: not an
    OSError's traceback in every command."""
    assert thp_mode(tmp_path) is None


def test_an_empty_environment_given_is_the_one_judged_for_huge_pages(monkeypatch):
    """m71a-57: has_tunable judges the environment it is given, an empty one too (a worker
    started with no GLIBC_TUNABLES gets no huge pages from specrt), not this process's."""
    from specrt.hugepages import has_tunable

    monkeypatch.setenv("GLIBC_TUNABLES", TUNABLE)
    assert has_tunable() and not has_tunable({})
