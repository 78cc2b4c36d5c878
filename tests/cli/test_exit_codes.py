"""Every bad input exits 1 without a traceback, click's own usage errors included."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cli import main


@pytest.mark.parametrize("args, message", [
    (["build", "{tmp}/missing", "-o", "{tmp}/out"], "Invalid value for 'EXPORT_DIR': {tmp}/missing is not a folder"),
    (["run", "{tmp}", "--prompts", "{tmp}/missing.jsonl", "--prompt", "x"], "does not exist"),  # click.Path
    (["run", "{tmp}", "--bogus"], "No such option"),  # an unknown option
    # --prompt and --prompts together: one of them was dropped without a word
    (["run", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--prompt", "x"], "give exactly one of --prompt TEXT or --prompts"),
    (["run", "{tmp}"], "give exactly one of --prompt TEXT or --prompts FILE.jsonl"),
    (["nosuchcommand"], "No such command"),
    (["build"], "Missing argument"),
    # ONNX Runtime takes a C int: a larger count was pybind11's TypeError, a traceback, at the first session
    (["build", "{tmp}", "--threads", "99999999999999999999", "-o", "{tmp}/out"], "is not in the range 1<=x<=2147483647"),
    # a cost table's passes (specrt.limits.MAX_PROFILE_REPEATS): 2**40 ran for ever
    (["build", "{tmp}", "--profile-repeats", "10001", "-o", "{tmp}/out"], "'--profile-repeats': 10001 is not in the "
                                                                          "range 1<=x<=10000"),
    (["profile", "{tmp}", "--repeats", str(2**40)], f"'--repeats': {2**40} is not in the range 1<=x<=10000"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--threads", "99999999999999999999", "-o", "{tmp}/out"],
     "--threads 99999999999999999999: expected at most 2147483647"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--threads", "2147483648", "-o", "{tmp}/out"],
     "--threads 2147483648: expected at most 2147483647"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "", "-o", "{tmp}/out"],
     "--peers '': expected a comma-separated list"),  # ran no peer (an empty --governors is refused)
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", " ", "-o", "{tmp}/out"],
     "expected a comma-separated list"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "ortgenai", "--ortgenai-cache", "{tmp}/p.jsonl/m",
      "-o", "{tmp}/out"], "--ortgenai-cache {tmp}/p.jsonl/m: {tmp}/p.jsonl is a file, not a folder"),  # skipped, exit 0
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "hf,ortgenai-int4", "--ortgenai-cache",
      "{tmp}/p.jsonl/m", "-o", "{tmp}/out"], "--ortgenai-cache {tmp}/p.jsonl/m: {tmp}/p.jsonl is a file"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "llamacpp", "--ortgenai-cache",
      "{tmp}/p.jsonl/m", "-o", "{tmp}/out"], "--ortgenai-cache {tmp}/p.jsonl/m: {tmp}/p.jsonl is a file"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "llamacpp", "--llamacpp-gguf", "{tmp}/p.jsonl",
      "-o", "{tmp}/out"], "--llamacpp-gguf {tmp}/p.jsonl: not a GGUF file"),
    # no peer that uses it: taken without a word (it was not checked either), now refused as --target and
    # --llamacpp-gguf are (h74b)
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "hf", "--ortgenai-cache", "{tmp}/p.jsonl/m",
      "-o", "{tmp}/out"], "--ortgenai-cache {tmp}/p.jsonl/m: where the onnxruntime-genai and llama.cpp peers' models "
                          "are made; --peers hf has none of them"),
    (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--peers", "none", "--ortgenai-cache", "{tmp}/c",
      "-o", "{tmp}/out"], "--ortgenai-cache {tmp}/c: where the onnxruntime-genai and llama.cpp peers' models are made; "
                          "no peer runs (--peers none)"),
    # Path('') is '.': the working folder, named nowhere ("config.json: not found")
    (["inspect", "{tmp}", "--draft", ""], "Invalid value for '--draft': an empty path; expected a folder"),
    (["calibrate", "", "--prompts", "{tmp}/p.jsonl"], "Invalid value for 'ENGINES_DIR': an empty path"),
    (["serve", "{tmp}", "--model-name", " "], "--model-name: expected a non-empty name"),  # served as the folder's
    # a byte that was not UTF-8 (Python's lone surrogate for it): served as 'm\udce9', and "mé" was a 404
    (["serve", "{tmp}", "--model-name", "m\udce9"], "--model-name is not valid UTF-8 text (byte 0xe9 after 'm'; "),
    # every other path argument and option (sampling_options.PathArg): '' was '.', refused as the working
    # folder (`-o ""`: "holds the input folder", "--stats .: is a folder") or served (`serve ""`)
    *(([*args[:-1], ""], f"Invalid value for '{name}': an empty path; expected a {kind}") for args, name, kind in (
        (["export", "{tmp}", "-o", ""], "-o' / '--out", "folder"),
        (["build", "{tmp}", "-o", ""], "-o' / '--out", "folder"),
        (["corpus", "{tmp}", ""], "ANSWERS...", "file"),
        (["run", "{tmp}", "--prompts", ""], "--prompts", "file"),
        (["run", "{tmp}", "--prompt", "x", "--stats", ""], "--stats", "file"),
        (["run", "{tmp}", "--prompt", "x", "--grow-file", ""], "--grow-file", "file"),
        (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "-o", ""], "-o' / '--out", "folder"),
        (["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "-o", "{tmp}/out", "--ortgenai-cache", ""],
         "--ortgenai-cache", "folder"),
        (["bench", "{tmp}", "-o", "{tmp}/out", "--prompts", ""], "--prompts", "file"),
        (["bench", "-o", "{tmp}/out", "--prompts", "{tmp}/p.jsonl", ""], "ENGINES_DIR", "folder"),
        (["calibrate", "{tmp}", "--prompts", ""], "--prompts", "file"),
        (["calibrate", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--holdout-prompts", ""], "--holdout-prompts", "file"),
        (["calibrate", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--report", ""], "--report", "file"),
        (["compare", ""], "ENGINES_DIR", "folder"),
        (["compare", "{tmp}", "--report", ""], "--report", "file"),
        (["compare", "{tmp}", "--save-inputs", ""], "--save-inputs", "file"),
        (["compare", "{tmp}", "--target", ""], "--target", "folder"),
        (["serve", ""], "ENGINES_DIR", "folder"))),
    # a folder where a file is named, a file where a folder is: click.Path's dir_okay / file_okay,
    # which PathArg keeps (each refused before any engine loads, not by a later read or write)
    *((args, f"Invalid value for '{name}': {what}") for args, name, what in (
        (["run", "{tmp}", "--prompt", "x", "--grow-file", "{tmp}"], "--grow-file", "File '{tmp}' is a directory"),
        (["run", "{tmp}", "--prompts", "{tmp}"], "--prompts", "File '{tmp}' is a directory"),
        (["corpus", "{tmp}", "{tmp}"], "ANSWERS...", "File '{tmp}' is a directory"),
        (["calibrate", "{tmp}", "--prompts", "{tmp}"], "--prompts", "File '{tmp}' is a directory"),  # (M67 m17)
        (["calibrate", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--report", "{tmp}"], "--report",
         "File '{tmp}' is a directory"),
        (["calibrate", "{tmp}", "--prompts", "{tmp}/p.jsonl", "--holdout-prompts", "{tmp}"], "--holdout-prompts",
         "File '{tmp}' is a directory"),
        (["compare", "{tmp}", "--report", "{tmp}"], "--report", "File '{tmp}' is a directory"),
        (["compare", "{tmp}", "--save-inputs", "{tmp}"], "--save-inputs", "File '{tmp}' is a directory"),
        # every folder that must exist (sampling_options.existing_folder), missing or a file, in one wording
        # (bench and compare said click's "Directory 'X' is a file." / "does not exist.")
        *((args, name, f"{{tmp}}/{missing} is not a folder") for missing in ("p.jsonl", "missing") for args, name in (
            (["compare", "{tmp}", "--target", f"{{tmp}}/{missing}"], "--target"),
            (["compare", f"{{tmp}}/{missing}"], "ENGINES_DIR"),
            (["bench", f"{{tmp}}/{missing}", "--prompts", "{tmp}/p.jsonl", "-o", "{tmp}/out"], "ENGINES_DIR"),
            (["calibrate", f"{{tmp}}/{missing}", "--prompts", "{tmp}/p.jsonl"], "ENGINES_DIR"),
            (["export", f"{{tmp}}/{missing}", "-o", "{tmp}/out"], "TARGET"),
            (["inspect", "{tmp}", "--draft", f"{{tmp}}/{missing}"], "--draft"),
            (["run", f"{{tmp}}/{missing}", "--prompt", "x"], "ENGINES_DIR"),
            (["serve", f"{{tmp}}/{missing}"], "ENGINES_DIR"))))),  # (serve said "no such engines folder")
])
def test_usage_errors_exit_1(tmp_path, args, message):
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    r = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 1, r.output
    assert message.format(tmp=tmp_path) in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["run", "{tmp}", "--prompt", "x", "--stats", "-"],
                                  ["run", "{tmp}", "--prompts", "-"],
                                  ["run", "{tmp}", "--prompt", "x", "--grow-file", "-"],
                                  ["bench", "{tmp}", "--prompts", "{tmp}/p.jsonl", "-o", "-"],
                                  ["compare", "{tmp}", "--report", "-"]])
def test_a_dash_path_is_refused_not_taken_for_a_file_named_dash(tmp_path, monkeypatch, args):
    """'-' where a path is expected: `--stats -` wrote a file named "-" in the working folder,
    `--prompts -` said "File '-' does not exist"; other tools read '-' as standard input or
    output, so it is refused, naming /dev/stdin and /dev/stdout (which work) and ./-."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    r = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "'-' is not standard input or output here: give /dev/stdin or /dev/stdout, or ./- for a file of that " \
        "name" in r.output, r.output
    assert not (tmp_path / "-").exists()


def test_the_thread_limit_is_one_constant(tmp_path):
    """build's --threads, bench's pre-check (before any engine loads) and engines.json's
    OrtSettings all stop at specrt.limits.MAX_THREADS (ONNX Runtime's C int), each in its
    own words; the limit itself is accepted everywhere."""
    from specrt.engines.onnxruntime import OrtSettings
    from specrt.errors import UserError
    from specrt.limits import MAX_THREADS

    assert MAX_THREADS == 2**31 - 1
    assert OrtSettings(intra_op_num_threads=MAX_THREADS).resolved().intra_op_num_threads == MAX_THREADS
    with pytest.raises(UserError, match=f"intra_op_num_threads {MAX_THREADS + 1}: expected a thread count in "
                                        f"0..{MAX_THREADS}"):
        OrtSettings(intra_op_num_threads=MAX_THREADS + 1).resolved()
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    for command, over, at in (
            (["build", str(tmp_path / "missing"), "-o", str(tmp_path / "out")],
             f"is not in the range 1<=x<={MAX_THREADS}", "is not a folder"),
            (["bench", str(tmp_path), "--prompts", str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "out")],
             f"--threads {MAX_THREADS + 1}: expected at most {MAX_THREADS}", "not a complete engines folder")):
        for threads, want in ((MAX_THREADS + 1, over), (MAX_THREADS, at)):
            r = CliRunner().invoke(main, [*command, "--threads", str(threads)])
            assert r.exit_code == 1 and want in r.output and "Traceback" not in r.output, (command, threads, r.output)


def test_user_errors_exit_1(tmp_path):
    for command in ("compare", "canary", "profile"):  # canary named the export inside before
        r = CliRunner().invoke(main, [command, str(tmp_path)])
        assert r.exit_code == 1 and f"{tmp_path}: not a complete engines folder (no engines.json)" in r.output, r.output


def test_output_paths_are_checked_before_any_work(tmp_path, monkeypatch):
    """check_output_file / check_output_folder name the option and the part of the path
    in the way, and create nothing; export and build (atomic_folder) refuse an -o under a
    file the same way."""
    import os
    from pathlib import Path

    from specrt.errors import UserError
    from specrt.manifest import atomic_folder
    from specrt.paths import check_output_file, check_output_folder

    f = tmp_path / "afile"
    f.write_text("")
    check_output_file(tmp_path / "a" / "b" / "r.json", "--report")  # missing folders are fine
    check_output_folder(tmp_path / "a" / "b", "-o")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile"]
    with pytest.raises(UserError, match=f"--report {f}/x/r.json: {f} is a file, not a folder"):
        check_output_file(f / "x" / "r.json", "--report")
    with pytest.raises(UserError, match=f"--stats {tmp_path}: is a folder"):
        check_output_file(tmp_path, "--stats")
    with pytest.raises(UserError, match=f"-o {f}/e: {f} is a file, not a folder"):
        with atomic_folder(f / "e"):
            pass
    # a folder this user cannot write (as root every folder is writable: ask os.access as a user would)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    if os.geteuid() == 0:
        monkeypatch.setattr("specrt.paths.os.access", lambda p, mode: Path(p) != ro)
    with pytest.raises(UserError, match=f"--report {ro}/r.json: {ro} is not writable"):
        check_output_file(ro / "r.json", "--report")
    if Path("/proc/self").is_dir():  # a folder os.access calls writable for root where no file can be made
        with pytest.raises(UserError, match="--stats /proc/x.json: cannot write in /proc"):
            check_output_file(Path("/proc/x.json"), "--stats")
        from specrt.paths import write_atomic

        with pytest.raises(UserError, match="/proc/x.json: cannot write it"):  # found only when written
            write_atomic(Path("/proc/x.json"), {"a": 1})
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile", "ro"]  # the probes left nothing



def test_one_file_named_two_ways_is_one_file(tmp_path, monkeypatch):
    """check_distinct compares where the paths lead, not their text: a relative path, a path
    through '..' and a symbolic link to the file each name the file named plainly (an output
    given so would replace the input), a file of the same name elsewhere does not, and a None
    path (an option not given) is skipped."""
    from specrt.errors import UserError
    from specrt.paths import check_distinct

    f = tmp_path / "p.jsonl"
    f.write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.jsonl").symlink_to(f)
    monkeypatch.chdir(tmp_path)
    for other in ("p.jsonl", tmp_path / "sub" / ".." / "p.jsonl", tmp_path / "link.jsonl"):
        with pytest.raises(UserError, match=f"^--prompts and --report name the same file {f}; give each its own$"):
            check_distinct(("--prompts", f), ("--stats", None), ("--report", other))
    check_distinct(("--prompts", f), ("--stats", None), ("--report", tmp_path / "sub" / "p.jsonl"))

def test_clicks_usage_errors_are_one_line_as_specrts_own(tmp_path):
    """click's usage errors printed its usage line, a hint and a blank line before "Error:",
    three lines beside specrt's own one-line "error: ..." (session 56): one line now, the
    same word, with the command whose --help lists the options."""
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    for args, want, where in (
            (["run", str(tmp_path), "--max-new-tokens", "-5"], "Invalid value for '--max-new-tokens': -5 is not in "
                                                               "the range x>=1.", "specrt run"),
            (["nosuchcommand"], "No such command 'nosuchcommand'.", "specrt"),
            (["build"], "Missing argument 'EXPORT_DIR'.", "specrt build"),
            # (click before 8.4 words it "No such option: --bogus")
            (["bench", str(tmp_path), "--bogus"], ("No such option '--bogus'", "No such option: --bogus"),
             "specrt bench")):
        r = CliRunner().invoke(main, args, prog_name="specrt")
        assert r.exit_code == 1 and r.output.count("\n") == 1, (args, r.output)
        wants = (want,) if isinstance(want, str) else want
        assert r.output.startswith(tuple(f"error: {w}" for w in wants)), r.output
        assert r.output.endswith(f" (see `{where} --help`)\n"), r.output


def test_help_and_version_exit_0():
    from specrt import __version__

    for args, want in ((["--help"], "Usage: specrt [OPTIONS] COMMAND"), (["build", "--help"], "Usage: specrt build"),
                       (["--version"], __version__)):
        r = CliRunner().invoke(main, args, prog_name="specrt")
        assert r.exit_code == 0, (args, r.output)
        assert want in r.output, (args, r.output)


@pytest.mark.parametrize("thp", ["0", "1"])
def test_python_dash_m_specrt_is_the_command(tmp_path, thp):
    """``python -m specrt`` (a venv whose bin is not on PATH) runs the command as ``specrt``
    does: its version, and a bad folder's one-line error with exit 1; with huge pages wanted
    (SPECRT_THP=1), through the restart that names the command ``specrt``."""
    import os
    import subprocess
    import sys

    from specrt import __version__

    env = {**os.environ, "SPECRT_THP": thp}
    r = subprocess.run([sys.executable, "-m", "specrt", "--version"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.endswith(f", version {__version__}\n"), (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "specrt", "run", str(tmp_path / "none"), "--prompt", "hi"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.startswith("error: "), r.stderr
    assert str(tmp_path / "none") in r.stderr, r.stderr


def test_output_files_keep_symlinks_and_devices(tmp_path):
    """--stats / --report / --grow-file through a symlink write where it points (os.replace
    put a file in the link's place); a device or FIFO is written in place (as root,
    --stats /dev/stdout replaced the device node with a JSON file)."""
    import json
    import os

    from specrt.paths import write_atomic

    real = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, {"a": 1})
    assert link.is_symlink() and json.loads(real.read_text()) == {"a": 1}
    import stat

    fifo = tmp_path / "pipe"  # a FIFO stands in for a device (never the machine's own /dev/null)
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the write does not wait
    try:
        write_atomic(fifo, {"a": 1})
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and json.loads(data) == {"a": 1}
    r, w = os.pipe()  # a link to a pipe, as /dev/stdout is under `| jq`: resolved, it named no file
    (tmp_path / "stdout").symlink_to(f"/proc/self/fd/{w}")
    try:
        write_atomic(tmp_path / "stdout", {"a": 2})
        data = os.read(r, 4096)
    finally:
        os.close(r)
        os.close(w)
    assert json.loads(data) == {"a": 2}


REFERENCE = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"


def test_a_full_disk_or_an_unreadable_input_exits_1_without_traceback(tmp_path, monkeypatch):
    """OSErrors of the machine, not of specrt (a full disk while the graphs are written, a
    config.json this user cannot read) were tracebacks; the partial folder goes, an earlier
    export stays."""
    import errno

    import specrt.export.graphs as graphs

    out = tmp_path / "o"
    r = CliRunner().invoke(main, ["export", str(REFERENCE / "verifier"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    before = sorted(p.name for p in out.iterdir())

    def full(model, path, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(graphs, "save_model", full)
    r = CliRunner().invoke(main, ["export", str(REFERENCE / "verifier"), "-o", str(out), "--force"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)  # not the OSError
    assert f"error: No space left on device; {out} was not written (the earlier one is kept)" in r.output, r.output
    assert sorted(p.name for p in out.iterdir()) == before and sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    monkeypatch.undo()

    _config_json_raises(monkeypatch, PermissionError(errno.EACCES, "Permission denied"))
    r = CliRunner().invoke(main, ["inspect", str(REFERENCE / "verifier")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (r.output, r.exception)
    assert f"error: {REFERENCE / 'verifier' / 'config.json'}: Permission denied" in r.output, r.output


def test_export_refuses_its_output_before_binding(tmp_path, monkeypatch):
    """-o that exists, lies in the input or is a dangling link: said before the weights are
    bound and hashed (minutes on a large model), and the dangling link was a traceback after
    the whole export. A file there is refused as one, not with advice to pass --force, which
    then refused it (a walk of session 63)."""
    import specrt.export.export as export_mod

    def no_binding(*a, **k):
        raise AssertionError("bound before the output was checked")

    monkeypatch.setattr(export_mod, "bind_target", no_binding)
    (tmp_path / "afile").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    for out, message in ((tmp_path / "afile", "is a file; --force replaces only an earlier output"),
                         (REFERENCE / "verifier" / "x", "lies inside the input"),
                         (tmp_path / "dangling", "a symbolic link to")):
        r = CliRunner().invoke(main, ["export", str(REFERENCE / "verifier"), "-o", str(out)])
        assert r.exit_code == 1 and message in r.output and isinstance(r.exception, SystemExit), (out, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dangling"]


def test_an_interrupt_between_the_two_renames_keeps_the_earlier_output(tmp_path, monkeypatch):
    """--force moves the earlier folder aside, then renames the new one into place: Ctrl-C
    (or any failure) between the two left neither at ``out``, the earlier one hidden as
    .NAME.old-PID."""
    import pathlib

    from specrt.manifest import atomic_folder

    out = tmp_path / "o"
    out.mkdir()
    (out / "engines.json").write_text("{}")
    rename = pathlib.Path.rename

    def interrupted(self, target):
        if self.name.startswith(".o.partial-"):
            raise KeyboardInterrupt
        return rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with atomic_folder(out, force=True, marker="engines.json") as tmp:
            (tmp / "engines.json").write_text('{"new": 1}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"] and (out / "engines.json").read_text() == "{}"


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupt_while_the_earlier_output_is_removed_finishes_and_says_so(tmp_path, monkeypatch, capsys,
                                                                              interrupts):
    """Ctrl-C or SIGTERM while the earlier folder was being removed, the new one already in
    place: "Aborted!" alone, and the earlier one left half removed as .NAME.old-PID for good
    (660 MB of SmolLM2 engines in session 55's interruption walk). The removal is finished and
    the interrupt says the output was written whole (before finishing: a second Ctrl-C there
    still has it said, the earlier folder then left)."""
    import shutil

    from specrt.manifest import atomic_folder

    out = tmp_path / "o"
    out.mkdir()
    (out / "engines.json").write_text("{}")
    (out / "draft.onnx.data").write_text("x")
    remove, removing = shutil.rmtree, []

    def interrupted(path, ignore_errors=False):
        removing.append(Path(path).name)
        if len(removing) <= interrupts:
            (Path(path) / "draft.onnx.data").unlink(missing_ok=True)  # half removed
            raise KeyboardInterrupt
        remove(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with atomic_folder(out, force=True, marker="engines.json") as tmp:
            (tmp / "engines.json").write_text('{"new": 1}')
    monkeypatch.undo()
    assert removing[0].startswith(".o.old-") and removing[1] == removing[0]
    left = ["o"] if interrupts == 1 else sorted(["o", removing[0]])
    assert sorted(p.name for p in tmp_path.iterdir()) == left and (out / "engines.json").read_text() == '{"new": 1}'
    assert f"[interrupted after {out} was written whole, replacing the earlier one]" in capsys.readouterr().err


def test_temporaries_made_just_before_an_interrupt_go_with_it(tmp_path, monkeypatch):
    """A Ctrl-C landing as tempfile's mkdtemp / mkstemp returned left an empty .NAME.partial-*
    folder, .NAME.*.tmp file or .specrt-probe-* the caller never knew of (session 55's
    interruption walk): paths.make_temporary removes what it made when interrupted there."""
    import os

    from specrt.manifest import atomic_folder
    from specrt.paths import atomic_file, check_output_folder

    made = {"mkdir": os.mkdir, "open": os.open}

    def then_interrupted(name):
        def make(path, *args, **kwargs):
            made[name](path, *args, **kwargs)  # (made, its fd lost with the call)
            if Path(path).parent == tmp_path:
                raise KeyboardInterrupt
        return make

    made["chmod"] = os.chmod  # (atomic_folder's own step after its mkdir)
    for name, write in (("mkdir", lambda: atomic_folder(tmp_path / "o").__enter__()),
                        ("chmod", lambda: atomic_folder(tmp_path / "o").__enter__()),
                        ("open", lambda: atomic_file(tmp_path / "f.json").__enter__()),
                        ("open", lambda: check_output_folder(tmp_path / "sub", "-o"))):
        monkeypatch.setattr(os, name, then_interrupted(name))
        with pytest.raises(KeyboardInterrupt):
            write()
        monkeypatch.undo()
        assert list(tmp_path.iterdir()) == [], (name, list(tmp_path.iterdir()))


def test_the_sweep_of_dead_partial_folders_takes_only_outs_own_and_leaves_no_lock_held(tmp_path, capsys):
    """Mutation round (session 64): the sweep read OUT's name as a glob pattern (``-o 'e[1]'``
    removed the dead partial folders of an OUT named e1, and left its own), and an fd left
    open held the flock on the new output (a calibrate into it in the same process then
    waited for ever) or on the folder swept."""
    import fcntl
    import os

    from specrt.manifest import atomic_folder

    out = tmp_path / "e[1]"
    own, other = tmp_path / ".e[1].partial-dead", tmp_path / ".e1.partial-dead"
    for dead in (own, other):
        (dead / "sub").mkdir(parents=True)
    fds = len(os.listdir("/proc/self/fd"))
    with atomic_folder(out, marker="engines.json") as tmp:
        (tmp / "engines.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".e1.partial-dead", "e[1]"]
    assert f"note: removed {own}, the partial folder of an interrupted run" in capsys.readouterr().err
    assert len(os.listdir("/proc/self/fd")) == fds
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (BlockingIOError while a lock on it is held)
    finally:
        os.close(fd)


def test_a_dead_partial_folder_left_in_place_is_not_said_removed(tmp_path, monkeypatch, capsys):
    """Mutation round (session 64): the sweep says "removed" only of a folder gone; one its
    removal could not take (files another user owns, where this user is not root: rmtree's
    errors ignored, as here) is left unsaid."""
    import shutil

    from specrt.manifest import atomic_folder

    dead, rmtree = tmp_path / ".o.partial-dead", shutil.rmtree
    dead.mkdir()

    def not_dead(path, ignore_errors=False):  # (root removes anything: the failure made here)
        if Path(path) != dead:
            rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", not_dead)
    with atomic_folder(tmp_path / "o") as tmp:
        (tmp / "f").write_text("x")
    assert dead.is_dir() and "note: removed" not in capsys.readouterr().err


def test_an_error_naming_the_partial_folder_names_the_output(tmp_path):
    """Mutation round (session 64; its S15 too, whose test of the same name shadowed this one):
    a UserError raised while the output is written names a file of the partial folder, gone when
    it is said: it names the output's file instead."""
    from specrt.errors import UserError
    from specrt.manifest import atomic_folder

    out = tmp_path / "o"
    with pytest.raises(UserError) as e:
        with atomic_folder(out) as tmp:
            raise UserError(f"{tmp / 'engines.json'}: not a manifest")
    assert str(e.value) == f"{out / 'engines.json'}: not a manifest" and list(tmp_path.iterdir()) == []


def test_an_output_named_by_dot_dot_is_the_folder_it_names(tmp_path):
    """Mutation round (session 64): ``-o ENGINES/sub/..`` (``-o ..`` from inside an earlier
    output) replaces ENGINES whole, as ``-o ENGINES`` does: its partial folder is made beside
    ENGINES, not inside the folder it replaces, and ``..`` is never renamed."""
    from specrt.manifest import atomic_folder

    out = tmp_path / "o"
    (out / "sub").mkdir(parents=True)
    (out / "engines.json").write_text("{}")
    with atomic_folder(out / "sub" / "..", force=True, marker="engines.json") as tmp:
        (tmp / "engines.json").write_text('{"new": 1}')
    assert [p.name for p in tmp_path.iterdir()] == ["o"] and [p.name for p in out.iterdir()] == ["engines.json"]
    assert (out / "engines.json").read_text() == '{"new": 1}'


def test_force_takes_a_folder_holding_the_manifest_not_a_folder_of_its_name(tmp_path):
    """Mutation round (session 64): --force replaces an earlier output, one holding the
    manifest as a file; a folder holding a folder of that name is a folder of other things."""
    from specrt.errors import UserError
    from specrt.manifest import check_output

    out = tmp_path / "o"
    (out / "engines.json").mkdir(parents=True)
    with pytest.raises(UserError, match=r"is a folder without engines.json; --force replaces only an earlier"):
        check_output(out, force=True, marker="engines.json")


def test_umask_reads_the_umask_and_leaves_it_as_it_was(tmp_path):
    """Mutation round (session 64): paths.umask reads the umask by setting it; left at 0, every
    file made after (engines, reports) was writable by everyone."""
    import os

    from specrt.paths import umask

    was = os.umask(0o027)
    try:
        assert umask() == 0o027 and umask() == 0o027
    finally:
        os.umask(was)


def test_reports_never_replace_a_file_of_the_engines_folder(tmp_path):
    """calibrate --report ENGINES/calibration.json before the first calibration wrote the
    calibration, then the report over it (DSpark then refused the engines); compare's
    --save-inputs / --report ENGINES/engines.json replaced the manifest. Refused before any
    work, the folder as it was."""
    from specrt.paths import check_not_engines_file

    engines = tmp_path / "e"
    engines.mkdir()
    (engines / "engines.json").write_text("{}")
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    for args, option, path in (
            (["calibrate", str(engines), "--prompts", str(tmp_path / "p.jsonl")], "--report", "calibration.json"),
            (["calibrate", str(engines), "--prompts", str(tmp_path / "p.jsonl")], "--report", "acceptance_receipt.json"),
            (["run", str(engines), "--prompt", "x"], "--stats", "corpus.npz"),
            (["compare", str(engines)], "--save-inputs", "engines.json"),
            (["compare", str(engines)], "--save-inputs", "in.json"),  # (its outputs go to in.outputs.json)
            (["compare", str(engines)], "--report", "engines.json")):
        if path == "in.json":
            (engines / "in.outputs.json").write_text("{}")
        r = CliRunner().invoke(main, [*args, option, str(engines / path)])
        named = engines / ("in.outputs.json" if path == "in.json" else path)
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (args, option, r.output)
        assert f"{option} {named}: a file of the engines folder {engines}" in r.output, (args, option, r.output)
        (engines / "in.outputs.json").unlink(missing_ok=True)
        assert sorted(p.name for p in engines.iterdir()) == ["engines.json"], (args, option)
        assert (engines / "engines.json").read_text() == "{}"
    # a file outside the folder is an ordinary output, replaced as any report is
    check_not_engines_file(tmp_path / "p.jsonl", engines, "--report")


def test_run_grow_file_never_replaces_a_file_the_engines_folder_owns(tmp_path):
    """`run --grow-file ENGINES/calibration.json` wrote session growth (an .npz) over the
    calibration, and every later command failed on it (a user walk, session 54); corpus.npz,
    the manifest, a recorded graph or the export's files likewise. A growth file of the user's
    own kept in the folder is still read and written."""
    from specrt.errors import UserError
    from specrt.paths import check_not_engines_file

    engines = tmp_path / "e"
    (engines / "export").mkdir(parents=True)
    (engines / "export" / "export.json").write_text("{}")
    (engines / "engines.json").write_text('{"files": [{"file": "draft.onnx"}, {"file": "draft.onnx.data"}]}')
    for name in ("calibration.json", "corpus.npz", "acceptance_receipt.json", "engines.json", "draft.onnx.data",
                 "export/export.json", "export/new.json"):
        r = CliRunner().invoke(main, ["run", str(engines), "--prompt", "x", "--grow-file", str(engines / name)])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (name, r.output)
        assert f"--grow-file {engines / name}: a file of the engines folder {engines}" in r.output, (name, r.output)
    assert sorted(p.name for p in engines.iterdir()) == ["engines.json", "export"]
    (engines / "mine.npz").write_bytes(b"x")
    check_not_engines_file(engines / "mine.npz", engines, "--grow-file", users_files=True)  # the user's own: taken
    check_not_engines_file(tmp_path / "g.npz", engines, "--grow-file", users_files=True)
    alias = tmp_path / "alias"  # the export's files reached through another name of the folder (mutation round, P14)
    alias.symlink_to(engines, target_is_directory=True)
    with pytest.raises(UserError, match=f"^--grow-file {alias}/export/new.json: a file of the engines folder "):
        check_not_engines_file(alias / "export" / "new.json", engines, "--grow-file", users_files=True)
    (engines / "engines.json").write_text('{"files": 5}')  # (a TypeError traceback; loading names the manifest)
    r = CliRunner().invoke(main, ["run", str(engines), "--prompt", "x", "--grow-file", str(engines / "g.npz")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit) and "engines.json" in r.output, r.output


def test_run_names_each_output_option_whose_path_cannot_be_written(tmp_path):
    """run's --stats and --grow-file under a file: refused before the engines load, each
    error naming its own option (mutant m71b-82: a --grow-file said as --stats)."""
    engines = tmp_path / "e"
    engines.mkdir()
    f = tmp_path / "afile"
    f.write_text("")
    for option in ("--stats", "--grow-file"):
        r = CliRunner().invoke(main, ["run", str(engines), "--prompt", "x", option, str(f / "x" / "g.npz")])
        assert r.exit_code == 1 and isinstance(r.exception, SystemExit), (option, r.output)
        assert r.output == f"error: {option} {f}/x/g.npz: {f} is a file, not a folder\n", (option, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "e"]


def test_the_engines_files_check_needs_no_runtime(tmp_path):
    """check_not_engines_file reads the names of the files later commands write (calibrate's,
    the canary's, corpus's) from specrt.contracts: it imported runtime.session (and with it
    most of the runtime) for three strings. The names stay importable from there."""
    import subprocess
    import sys

    from specrt import contracts
    from specrt.runtime import corpus, session

    assert (session.CALIBRATION_FILE, session.ACCEPTANCE_FILE, session.CORPUS_FILE, corpus.FILE) == \
        (contracts.CALIBRATION_FILE, contracts.ACCEPTANCE_FILE, contracts.CORPUS_FILE, contracts.CORPUS_FILE)
    (tmp_path / "e").mkdir()
    code = ("import sys; from specrt.errors import UserError; from specrt.paths import check_not_engines_file\n"
            "try: check_not_engines_file(sys.argv[1] + '/e/calibration.json', sys.argv[1] + '/e', '--report')\n"
            "except UserError as e: print(e)\n"
            "print(sorted(m for m in sys.modules if m.startswith('specrt.runtime')))")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "[]", p.stdout + p.stderr
    assert "--report " in p.stdout and "a file of the engines folder" in p.stdout, p.stdout

@pytest.mark.parametrize("name, text, message", [
    ("tokenizer.json", "{", "tokenizer.json: not valid JSON"),
    ("tokenizer.json", "{}", "tokenizer.json: not a tokenizer the tokenizers library reads"),
    ("tokenizer_config.json", "{", "tokenizer_config.json: not valid JSON"),
    ("special_tokens_map.json", "[]", "special_tokens_map.json: expected a JSON object at top level, found list"),
    ("tokenizer_config.json", '{"a": "\xe9"}', "tokenizer_config.json: not valid JSON ('utf-8' codec can't decode"),
    ("tokenizer.json", '{"a": "\xe9"}', "tokenizer.json: not valid JSON ('utf-8' codec can't decode"),
    ("tokenizer.json", "[]", "tokenizer.json: expected a JSON object at top level, found list"),
    # nested past Python's recursion limit: json's RecursionError was a traceback
    ("tokenizer.json", "[" * 100_000 + "]" * 100_000, "tokenizer.json: not valid JSON (nested too deeply to read)"),
    ("tokenizer_config.json", "[" * 100_000 + "]" * 100_000,
     "tokenizer_config.json: not valid JSON (nested too deeply to read)"),
    # a number past Python's digit limit for int (4300): json's ValueError was a traceback
    ("tokenizer_config.json", '{"model_max_length": ' + "9" * 5000 + "}",
     "tokenizer_config.json: not valid JSON (a number of 5000 digits, past the 4300 Python reads)"),
])
def test_export_refuses_tokenizer_files_the_runtime_cannot_read(tmp_path, name, text, message):
    """A broken tokenizer file was copied without a word and built; `specrt run` then ended in
    the tokenizers library's (or json's) traceback."""
    import shutil

    target = tmp_path / "t"
    shutil.copytree(REFERENCE / "verifier", target)
    (target / name).write_text(text, encoding="latin-1")  # (é: not UTF-8)
    r = CliRunner().invoke(main, ["export", str(target), "-o", str(tmp_path / "o")])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert f"error: {target / name}" in r.output and message in r.output, r.output
    assert not (tmp_path / "o").exists()


def test_a_usage_error_naming_a_path_with_a_line_break_stays_one_line(tmp_path):
    """click's message is printed on one line whatever it quotes: a folder name holding a line
    break (a paste gone wrong) split "error: ..." over two lines, the second without the word
    "error"."""
    missing = tmp_path / "a\nb"
    r = CliRunner().invoke(main, ["build", str(missing), "-o", str(tmp_path / "out")], prog_name="specrt")
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: Invalid value for 'EXPORT_DIR': {tmp_path}/a b is not a folder"), r.output


def _config_json_raises(monkeypatch, err: OSError) -> None:
    """Reading any config.json raises ``err`` (its errno and text) naming that file."""
    import pathlib

    read_text = pathlib.Path.read_text

    def failing(self, *a, **k):
        if self.name == "config.json":
            raise type(err)(err.errno, err.strerror, str(self))
        return read_text(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "read_text", failing)


def test_an_os_error_that_is_specrts_own_keeps_its_traceback(tmp_path, monkeypatch):
    """Only the OSErrors of the machine or the user's files (a full disk, a permission) are said
    as "error: ..." and exit 1; any other (EBADF, EINVAL: specrt misusing a file) is a bug and
    keeps its traceback, as every exception that is not a user error."""
    import errno

    _config_json_raises(monkeypatch, OSError(errno.EBADF, "Bad file descriptor"))
    r = CliRunner().invoke(main, ["inspect", str(REFERENCE / "verifier")])
    assert isinstance(r.exception, OSError) and r.exception.errno == errno.EBADF, (r.output, r.exception)
    assert "error: " not in r.output, r.output


@pytest.mark.parametrize("text, message", [
    ("\n  \n\n", " no prompts"),  # blank lines only
    # JSON's true is Python's 1: no token id (as bools are refused wherever a count is read)
    ('{"prompt_ids": [true, 2]}\n', "1: 'prompt_ids' must be a non-empty list of integer token ids; got [True, 2]"),
])
def test_a_prompts_file_without_a_usable_prompt_is_refused_before_the_engines_load(tmp_path, text, message):
    """`specrt run --prompts` with a file that holds no prompt, or token ids that are not
    integers: said naming the file (and line), exit 1, before the engines folder is looked at
    (it is none here)."""
    f = tmp_path / "p.jsonl"
    f.write_text(text)
    r = CliRunner().invoke(main, ["run", str(tmp_path), "--prompts", str(f)])
    assert r.exit_code == 1 and r.output == f"error: {f}:{message}\n", r.output  # (the file, then its line)


# ---- mutation round 4 of session 64 (specrt/manifest.py; S-ids in its report) ----


def test_only_this_outputs_stale_partial_folders_are_removed_whatever_its_name(tmp_path, capsys):
    # kills S17 (manifest.py:186 the output's name not escaped in the glob: for -o 'e[1]' the stale
    # partial folder of 'e1' was removed, and e[1]'s own left)
    from specrt.manifest import atomic_folder

    mine, other = tmp_path / ".e[1].partial-old", tmp_path / ".e1.partial-old"  # (no live run holds them)
    mine.mkdir()
    other.mkdir()
    with atomic_folder(tmp_path / "e[1]") as tmp:
        (tmp / "f").write_text("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".e1.partial-old", "e[1]"]
    assert capsys.readouterr().err == f"note: removed {mine}, the partial folder of an interrupted run\n"


# ---- mutation round of session 67 (specrt/sampling_options.py; S-ids in its report) ----


def test_a_path_argument_gives_a_pathlib_path(tmp_path):
    # kills S07 (PathArg without path_type=Path: a str, where the commands join and test paths)
    import click

    from specrt.sampling_options import PathArg, existing_folder

    @click.command()
    @click.argument("folder", type=existing_folder())
    @click.option("--out", type=PathArg("a file"))
    def show(folder, out):
        click.echo(f"{type(folder).__name__} {type(out).__name__}")

    r = CliRunner().invoke(show, [str(tmp_path), "--out", str(tmp_path / "o.json")])
    assert r.exit_code == 0 and r.output == f"{type(tmp_path).__name__} {type(tmp_path).__name__}\n", r.output


# ---- mutation round of session 69 (specrt/paths.py, specrt/manifest.py; P- and S-ids in its report) ----


def test_try_lock_takes_no_link_and_leaves_no_descriptor_open(tmp_path):
    # kills P40 (a link followed: O_NOFOLLOW dropped, the sweeps' "not through a link" lost), P41 (an OSError
    # other than FileNotFoundError raised from try_lock: a link's ELOOP) and P42 (the descriptor of a file a
    # live run holds left open by each sweep that passed it)
    import fcntl

    from specrt.paths import try_lock

    f = tmp_path / "f"
    f.write_text("x")
    (tmp_path / "link").symlink_to(f)
    fds = len(os.listdir("/proc/self/fd"))
    assert try_lock(tmp_path / "link") is None and try_lock(tmp_path / "absent") is None
    held = os.open(f, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # (as a live run holds it: another open file's flock conflicts)
    try:
        assert try_lock(f) is None and len(os.listdir("/proc/self/fd")) == fds + 1
    finally:
        os.close(held)
    fd = try_lock(f)
    assert fd is not None
    os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_temporaries_are_made_for_this_user_alone(tmp_path):
    # kills P06 / P07 (make_temporary's folder made 0777, its file 0644, less the umask: another user could
    # read a partial output or a temporary file, or write in the folder, before its mode was given)
    import stat

    from specrt.paths import make_temporary

    was = os.umask(0)
    try:
        name, fd = make_temporary(tmp_path, ".f.", ".tmp")
        os.close(fd)
        folder, none = make_temporary(tmp_path, ".d.", is_folder=True)
    finally:
        os.umask(was)
    assert none is None and name.name.startswith(".f.") and name.name.endswith(".tmp")
    assert stat.S_IMODE(name.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_temporary_name_taken_is_passed_over_not_reused(tmp_path, monkeypatch):
    # kills P08 (O_EXCL dropped: a file of the name drawn was opened and emptied), P11 (one draw only) and
    # P12 (a name taken raised FileExistsError): the random part drawn twice the same here, as it may be
    from specrt import paths

    taken = tmp_path / ".x.000000000000"
    taken.write_text("another's")
    draws = iter(["000000000000", "000000000000", "111111111111"])
    monkeypatch.setattr(paths.secrets, "token_hex", lambda n: next(draws))
    name, fd = paths.make_temporary(tmp_path, ".x.")
    os.close(fd)
    assert name == tmp_path / ".x.111111111111" and taken.read_text() == "another's"


def test_only_this_outputs_dead_moved_aside_folders_are_settled(tmp_path, capsys):
    # kills S01 (OUT's name read as a glob pattern: OUT e[1] took .e1.old-00PID, an output e1's, as its own, from
    # PID's tail), S02 (non-ASCII digits read as a PID: int() takes them), S03 (a link followed: OUT made a link
    # to where it pointed) and S04 (a file of the name restored as OUT); PIDs past Linux's last: dead runs'
    from specrt.manifest import check_output

    target = tmp_path / "elsewhere"
    target.mkdir()
    cases = {"e[1]": lambda p: p.with_name(".e1.old-004194305").mkdir(),
             "arabic": lambda p: p.with_name(".arabic.old-\u0664\u0661\u0669\u0664\u0663\u0660\u0665").mkdir(),
             "link": lambda p: p.with_name(".link.old-4194305").symlink_to(target),
             "file": lambda p: p.with_name(".file.old-4194305").write_text("x")}
    for name, make in cases.items():
        make(tmp_path / name)
        before = sorted(p.name for p in tmp_path.iterdir())
        check_output(tmp_path / name)
        assert sorted(p.name for p in tmp_path.iterdir()) == before and not (tmp_path / name).exists(), name
    assert capsys.readouterr().err == ""


def test_a_dead_runs_moved_aside_output_beside_a_dangling_link_at_out_is_kept(tmp_path, capsys):
    # session 69's S07: a dangling link a user put at OUT, beside a killed run's complete earlier output moved aside,
    # had that output removed ("the earlier output a run killed while replacing ... was removing"), the only copy
    from specrt.errors import UserError
    from specrt.manifest import check_output

    out, aside = tmp_path / "engines", tmp_path / ".engines.old-4194305"
    aside.mkdir()
    (aside / "engines.json").write_text("{}")
    out.symlink_to(tmp_path / "gone")
    with pytest.raises(UserError, match="which does not exist"):
        check_output(out, force=True)
    assert (aside / "engines.json").read_text() == "{}" and out.is_symlink()
    assert "removed" not in capsys.readouterr().err


def test_the_folder_lock_waits_for_another_holder(tmp_path, capsys):
    # kills P49 (folder_lock tried once, not waiting: a second sweep or calibrate ran beside the first unlocked);
    # the wait is said (it was silent: a run behind one stopped with Ctrl-Z seemed to hang), a free lock is not
    import fcntl
    import threading

    from specrt.paths import folder_lock

    fd, entered, leave = os.open(tmp_path, os.O_RDONLY), threading.Event(), threading.Event()

    def second() -> None:
        with folder_lock(tmp_path):
            entered.set()
            leave.wait(60)

    with folder_lock(tmp_path):
        pass
    assert capsys.readouterr().err == ""
    fcntl.flock(fd, fcntl.LOCK_EX)  # (another run's hold)
    t = threading.Thread(target=second, daemon=True)
    t.start()
    try:
        assert not entered.wait(1.0)
        assert capsys.readouterr().err == f"note: waiting for {tmp_path}: another process holds its lock (a specrt " \
            "run writing into it); this one goes on when that one ends\n"
    finally:
        os.close(fd)  # (released)
    assert entered.wait(60)
    leave.set()
    t.join(60)


@pytest.mark.parametrize("stderr", ["closed", "broken"])
def test_the_folder_lock_waits_with_stderr_closed_or_broken(tmp_path, monkeypatch, stderr):
    # r70: the note of the wait written to sys.stderr as it came: closed (`2>&-`, None) an AttributeError out of
    # the lock, a broken one (EPIPE) an OSError that the lock's own "cannot be locked" took: run on unlocked
    import fcntl
    import threading

    from specrt.paths import folder_lock

    class Broken:
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stderr", None if stderr == "closed" else Broken())
    fd, entered = os.open(tmp_path, os.O_RDONLY), threading.Event()
    fcntl.flock(fd, fcntl.LOCK_EX)  # (another run's hold)
    errors = []

    def second() -> None:
        try:
            with folder_lock(tmp_path):
                entered.set()
        except BaseException as e:  # (the thread's error, for the test to see)
            errors.append(e)
            entered.set()

    t = threading.Thread(target=second, daemon=True)
    t.start()
    try:
        assert not entered.wait(1.0), errors or "entered a folder another process holds locked"
    finally:
        os.close(fd)  # (released)
    assert entered.wait(60)
    t.join(60)
    assert errors == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="making a device node needs root")
def test_a_device_that_cannot_take_the_file_is_said_not_a_traceback(tmp_path):
    # kills P17 (the OSError of a device written in place raised as it came: --stats /dev/full a traceback);
    # a device node of this test's own, as /dev/full (never the machine's: a mutant may replace what it writes)
    import stat

    from specrt.errors import UserError
    from specrt.paths import write_atomic

    full = tmp_path / "full"
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        os.close(os.open(full, os.O_WRONLY))
    except PermissionError:  # (no CAP_MKNOD, or a file system mounted nodev)
        pytest.skip("no device node can be made and opened here")
    with pytest.raises(UserError, match=f"^{full}: cannot write it \\(No space left on device\\)$"):
        write_atomic(full, {"a": 1})
    assert stat.S_ISCHR(os.lstat(full).st_mode) and [p.name for p in tmp_path.iterdir()] == ["full"]


def test_a_file_written_whole_makes_the_folders_above_it(tmp_path):
    # kills P21 (only the last missing folder made: a --stats a/b/s.json, passed by check_output_file as
    # "missing folders are fine", then failed with "No such file or directory" after the run)
    import json

    from specrt.paths import write_atomic

    write_atomic(tmp_path / "a" / "b" / "s.json", {"a": 1})
    assert json.loads((tmp_path / "a" / "b" / "s.json").read_text()) == {"a": 1}


def test_a_large_json_file_is_written_without_its_text_held_in_memory(tmp_path):
    """`specrt run --prompts` of 5000 prompts writes a 10 MB --stats; json.dumps with an indent
    built the text's pieces in a list first, 74 MB of peak RSS beside the stats (run's peak went
    from 125 to 206 MB). Written as it is encoded, the file is the same JSON and the peak no
    more than a buffer's."""
    import json
    import tracemalloc

    from specrt.paths import write_atomic

    stats = {"prompts": [{"prompt_ids": list(range(i, i + 8)), "output_token_ids": [i, i + 1], "seconds": 0.25,
                          "depth_histogram": {"0": 1, "2": i % 7}, "finish_reason": "length"} for i in range(20000)]}
    out = tmp_path / "stats.json"
    tracemalloc.start()
    try:
        write_atomic(out, stats)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.read_text(encoding="utf-8") == json.dumps(stats, indent=1)
    assert peak < out.stat().st_size / 10, (peak, out.stat().st_size)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="running as another user needs root")
def test_a_folder_that_cannot_be_entered_is_named_not_writable(tmp_path):
    # kills P02 (os.access asked of W_OK alone: a folder its user may write but not enter, mode 0600, was
    # refused by the probe's "Permission denied", not named as not writable); as nobody (root passes os.access)
    import subprocess
    import sys
    import tempfile

    code = ("import os, sys; from pathlib import Path; from specrt.paths import check_output_folder; "
            "os.setgroups([]); os.setgid(65534); os.setuid(65534); check_output_folder(Path(sys.argv[1]), '-o')")
    with tempfile.TemporaryDirectory() as d:  # (tmp_path's folders are root's alone)
        os.chmod(d, 0o755)
        folder = Path(d) / "w"
        folder.mkdir()
        os.chown(folder, 65534, 65534)
        folder.chmod(0o600)
        r = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and f"UserError: -o {folder}: {folder} is not writable\n" in r.stderr, r.stderr
        assert os.listdir(folder) == []


def test_a_file_written_whole_is_synced_whole_before_its_rename(tmp_path, monkeypatch):
    # kills P30 (the write buffer flushed only at close, after the fsync: its tail synced by nothing) and P31 (no
    # fsync: a power cut after the rename could leave the file renamed but empty); fsync itself is run, watched
    from specrt import paths

    out, synced, fsync = tmp_path / "s.json", [], os.fsync

    def watched(fd: int) -> None:
        synced.append((os.fstat(fd).st_size, out.exists()))
        fsync(fd)

    monkeypatch.setattr(paths.os, "fsync", watched)
    paths.write_atomic(out, {"a": 1})
    monkeypatch.undo()
    assert synced == [(out.stat().st_size, False)] and out.stat().st_size > 0, synced


def test_template_variables_given_under_an_ascii_locale_are_read_as_utf8():
    # r70: the environment walk read --prompt, --system, --stop and --model-name as UTF-8 where Python decoded the
    # arguments as ASCII (`LC_ALL=C PYTHONUTF8=0`: a byte above 127 a surrogate escape); --chat-template-kwargs,
    # the same command line's text, kept the escapes: '{"name": "José"}' gave the template 'Jos\udcc3\udca9'
    import click

    from specrt.sampling_options import template_kwargs_option

    @click.command()
    @template_kwargs_option
    def show(chat_template_kwargs):
        click.echo(ascii(chat_template_kwargs))

    escaped = '{"name": "Jos\udcc3\udca9"}'  # (what sys.argv holds for the UTF-8 bytes of 'José' then)
    res = CliRunner().invoke(show, ["--chat-template-kwargs", escaped])
    assert res.exit_code == 0 and res.output == ascii({"name": "José"}) + "\n", res.output


def test_a_number_out_of_range_is_echoed_as_typed(tmp_path):
    """Session 70's CLI walk, L4: a float option out of range was echoed as parsed (`--temperature
    -1` as "-1.0", `1e999` as "inf", `--top-p 1.50` as "1.5", `--holdout 1.50` as "1.5"), not as
    the user typed it (h74b). Refused before the folder is read (tmp_path holds no engines)."""
    folder, prompts = str(tmp_path), str(tmp_path / "p.jsonl")
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    for args, said in ((["run", folder, "--prompt", "x", "--temperature", "-1"], "--temperature -1: expected a finite"),
                       (["run", folder, "--prompt", "x", "--temperature", "1e999"], "--temperature 1e999: expected"),
                       (["run", folder, "--prompt", "x", "--top-p", "1.50"], "--top-p 1.50: expected a number in"),
                       (["run", folder, "--prompt", "x", "--top-p", " 2"], "--top-p ' 2': expected a number in"),
                       (["run", folder, "--prompt", "x", "--top-k", "-02"], "--top-k -02: expected an integer >= -1"),
                       (["bench", folder, "--prompts", prompts, "-o", str(tmp_path / "r"), "--temperature", "-0.50"],
                        "--temperature -0.50: expected"),
                       (["calibrate", folder, "--prompts", prompts, "--holdout", "1.50"],
                        "--holdout 1.50: expected a fraction in [0, 1)"),
                       (["serve", folder, "--write-timeout", "-1."], "--write-timeout -1.: expected seconds, > 0")):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and r.output.startswith(f"error: {said}"), (args, r.output)


def test_a_checked_number_at_its_bounds_is_taken_or_refused_as_its_help_says(tmp_path):
    """Mutants m74b-21 (`--holdout 1` taken: "[0, 1)") and m74b-22 (`--write-timeout 3600` refused:
    "at most 3600"); m74b-23 (`--write-timeout 0` taken) here too, in a second, not only in
    test_the_command_serves_until_interrupted's served commands: each bound of a Checked option
    (h74b) as its help and its error say. A value taken goes on to the folder, which holds no
    engines here; one refused is said first, as typed."""
    folder, prompts = str(tmp_path), str(tmp_path / "p.jsonl")
    (tmp_path / "p.jsonl").write_text('{"prompt_ids": [1, 2]}\n')
    no_engines = f"error: {folder}: not a complete engines folder (no engines.json)"
    for args, said in ((["calibrate", folder, "--prompts", prompts, "--holdout", "0"], no_engines),
                       (["calibrate", folder, "--prompts", prompts, "--holdout", "1"],
                        "error: --holdout 1: expected a fraction in [0, 1)"),
                       (["serve", folder, "--write-timeout", "3600"], no_engines),
                       (["serve", folder, "--write-timeout", "0"], "error: --write-timeout 0: expected seconds, > 0"),
                       (["serve", folder, "--write-timeout", "3600.5"], "error: --write-timeout 3600.5: expected"),
                       (["run", folder, "--prompt", "x", "--temperature", "1", "--top-p", "1", "--top-k", "-1",
                         "--seed", "-1"], no_engines)):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1 and r.output.startswith(said), (args, r.output)


def test_a_checked_number_is_shown_by_its_kind_in_the_help():
    """Mutant m74b-19 (Checked's name not its base's): the help shows each checked option by the
    kind of value it takes, "--top-p FLOAT", "--top-k INTEGER", as click shows a plain float or int
    option (h74b made them Checked types, whose metavar is their name)."""
    r = CliRunner().invoke(main, ["run", "--help"])
    assert r.exit_code == 0, r.output
    for option, kind in (("--temperature", "FLOAT"), ("--top-p", "FLOAT"), ("--top-k", "INTEGER"),
                         ("--seed", "INTEGER")):
        assert f"{option} {kind}" in r.output, (option, r.output)


def test_a_number_typed_with_a_space_at_either_end_is_echoed_quoted():
    """Mutant m74b-69 (only a leading space quoted): a value typed with a space at its end, as at
    its start, is echoed quoted (h74b's Checked), so the space the user typed shows."""
    for typed in (" 2", "2 ", " 2 "):
        r = CliRunner().invoke(main, ["run", ".", "--prompt", "x", "--top-p", typed])
        assert r.exit_code == 1 and r.output.startswith(f"error: --top-p {typed!r}: expected a number in"), \
            (typed, r.output)


def test_the_command_runs_with_standard_error_closed():
    """Mutant m74b-62 (no AttributeError taken where standard error is closed): `specrt ... 2>&-`
    leaves Python's sys.stderr None, whose encoding h74c's _escape_undecodable reads first; the
    command runs as before (`--version` exit 0, printed), not ended by that AttributeError
    (exit 1, its traceback written nowhere)."""
    import subprocess

    r = subprocess.run(["sh", "-c", 'exec "$0" -m specrt --version 2>&-', sys.executable], capture_output=True,
                       text=True, env={**os.environ, "SPECRT_THP": "0"}, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("specrt, version "), (r.returncode, r.stdout)
