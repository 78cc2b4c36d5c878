"""Every bad input exits 1 without a traceback, click's own usage errors included."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from specrt.cli import main


@pytest.mark.parametrize("args, message", [
    (["build", "{tmp}/missing", "-o", "{tmp}/out"], "is not a folder"),  # a callback's BadParameter
    (["run", "{tmp}", "--prompts", "{tmp}/missing.jsonl", "--prompt", "x"], "does not exist"),  # click.Path
    (["run", "{tmp}", "--bogus"], "No such option"),  # an unknown option
    (["nosuchcommand"], "No such command"),
    (["build"], "Missing argument"),
])
def test_usage_errors_exit_1(tmp_path, args, message):
    r = CliRunner().invoke(main, [a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 1, r.output
    assert message in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


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


def test_help_and_version_exit_0():
    from specrt import __version__

    for args, want in ((["--help"], "Usage: specrt [OPTIONS] COMMAND"), (["build", "--help"], "Usage: specrt build"),
                       (["--version"], __version__)):
        r = CliRunner().invoke(main, args, prog_name="specrt")
        assert r.exit_code == 0, (args, r.output)
        assert want in r.output, (args, r.output)


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
