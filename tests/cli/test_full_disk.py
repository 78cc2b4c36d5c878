"""A disk that really fills while a command writes: its output file size limit (RLIMIT_FSIZE,
which CPython meets with an OSError, EFBIG "File too large", where a full disk's write raises
ENOSPC) lowered in the command's own process. Each command exits 1 with one `error:` line
naming what it could not write and why, no traceback, and leaves nothing half-written: its
earlier output is still there, byte for byte, and no temporary file or folder beside it."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "speculators-peagle-tiny"
KIB = 1024


def limited(args: list, limit_kib: int, stdout=subprocess.PIPE, **env) -> subprocess.CompletedProcess:
    """`specrt ARGS` in a process whose files cannot grow past ``limit_kib`` KiB (stderr a pipe;
    ``env``: variables set, or with None unset, in its environment)."""
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_kib * KIB, limit_kib * KIB))

    environ = {k: v for k, v in {**os.environ, "SPECRT_THP": "0", **env}.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "specrt", *map(str, args)], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, env=environ, preexec_fn=lower, timeout=300)


def snapshot(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder`` (hidden ones too, links not followed) -> its sha256 (or "dir")."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = "dir" if p.is_dir() and not p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def one_error(r: subprocess.CompletedProcess) -> str:
    """The run's one `error:` line, after checking exit 1 and no traceback."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr
    return errors[0]


def _answers(path: Path) -> Path:
    rng = random.Random(1)
    path.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(3, 1000) for _ in range(6)],
                                        "answer_ids": [rng.randrange(3, 1000) for _ in range(3)] * 4}) + "\n"
                            for _ in range(8)))
    return path


def _case(name: str, pair, tmp: Path) -> tuple[list, Path, str]:
    """(the command's arguments, the folder holding its earlier output, what its error names) for ``name``."""
    export, engines, prompts = pair
    eng = tmp / "engines"
    shutil.copytree(engines, eng)
    out = tmp / "out"
    out.mkdir()
    if name == "export":  # over an earlier export (--force)
        shutil.copytree(export, out / "exp")
        return ["export", REFERENCE / "verifier", "--draft", REFERENCE / "draft", "-o", out / "exp", "--force"], \
            out, f"{out / 'exp'} was not written (the earlier one is kept)"
    if name == "build":  # over earlier engines (--force)
        shutil.copytree(engines, out / "eng")
        return ["build", export, "--depths", "1,2", "--max-context", "64", "--profile-repeats", "1", "-o",
                out / "eng", "--force"], out, f"{out / 'eng'} was not written (the earlier one is kept)"
    if name == "calibrate":
        return ["calibrate", eng, "--prompts", prompts, "--max-new-tokens", "6"], eng, f"{eng / 'calibration.json'}"
    if name == "canary":
        return ["canary", eng], eng, f"{eng / 'acceptance_receipt.json'}"
    if name == "profile":
        return ["profile", eng, "--repeats", "1"], eng, f"{eng / 'engines.json'}"
    if name == "corpus":
        return ["corpus", eng, _answers(tmp / "answers.jsonl")], eng, f"{eng / 'corpus.npz'}"
    if name == "run --stats":
        (out / "stats.json").write_text('{"earlier": true}')
        return ["run", eng, "--prompts", prompts, "--max-new-tokens", "8", "--quiet", "--stats", out / "stats.json"], \
            out, f"{out / 'stats.json'}"
    if name == "compare --report":
        (out / "report.json").write_text('{"earlier": true}')
        return ["compare", eng, "--report", out / "report.json", "--prompt-tokens", "8"], out, f"{out}/report."
    assert name == "bench -o"  # over an earlier report (--force)
    (out / "r").mkdir()
    (out / "r" / "bench.json").write_text('{"earlier": true}')
    return ["bench", eng, "--prompts", prompts, "-o", out / "r", "--force", "--peers", "none", "--governors", "off",
            "--max-new-tokens", "4", "--warmup-tokens", "0", "--no-profile", "--threads", "1"], out, f"{out / 'r'}"


@pytest.mark.parametrize("name", ["export", "build", "calibrate", "canary", "profile", "corpus", "run --stats",
                                  "compare --report", "bench -o"])
def test_every_writing_command_on_a_full_disk_exits_1_and_keeps_its_earlier_output(pair, tmp_path, name):
    """Each command's first file past 1 KiB fails (the export's graph, the build's copy of
    export.json, calibration.json, the acceptance receipt, engines.json, corpus.npz, the stats,
    compare's saved outputs, a bench worker's result): said as the OS said it, naming the file
    or the output folder, and nothing of the run is left."""
    args, folder, named = _case(name, pair, tmp_path)
    before = snapshot(folder)
    line = one_error(limited(args, 1))
    assert named in line and "File too large" in line, line
    assert snapshot(folder) == before


def test_a_bench_worker_that_cannot_write_its_result_is_said_not_a_traceback(pair, tmp_path):
    """A worker's result.json cut short by the full disk was read as JSON by the bench: a
    JSONDecodeError's traceback. Now the worker writes it whole or not at all and exits with the
    OSError's errno, which the bench says naming the file; the earlier report is kept."""
    _, engines, prompts = pair
    out = tmp_path / "r"
    out.mkdir()
    (out / "bench.json").write_text('{"earlier": true}')
    before = snapshot(tmp_path)
    # 4 KiB: the job file and the logs fit, the worker's result (its per-prompt records) does not
    r = limited(["bench", engines, "--prompts", prompts, "-o", out, "--force", "--peers", "none", "--governors", "off",
                 "--max-new-tokens", "8", "--warmup-tokens", "0", "--no-profile", "--threads", "1"], 4)
    line = one_error(r)
    assert line.startswith(f"error: {out}/logs/.specrt-bench-") and "/result.json: File too large; " in line, line
    assert line.endswith(f"{out} was not written (the earlier one is kept)"), line
    assert snapshot(tmp_path) == before


def test_compare_keeps_its_saved_pair_whole_when_the_second_file_cannot_be_written(pair, tmp_path):
    """--save-inputs writes the outputs file, then the inputs: the outputs were renamed into
    place before the inputs failed, this run's outputs beside the last run's inputs (the
    polygraphy line the report prints compares the two). Now both or neither."""
    _, engines, _ = pair
    inputs, outputs = tmp_path / "inp.json", tmp_path / "inp.outputs.json"
    inputs.write_text('{"earlier": "inputs"}')
    outputs.write_text('{"earlier": "outputs"}')
    before = snapshot(tmp_path)
    # 36 KiB: this fixture's saved outputs (about 28 KiB) fit, its inputs (about 46 KiB) do not
    line = one_error(limited(["compare", engines, "--save-inputs", inputs], 36, stdout=subprocess.DEVNULL))
    assert line == f"error: {inputs}: cannot write it (File too large)", line
    assert snapshot(tmp_path) == before


def test_run_writes_its_growth_when_its_stats_cannot_be_written(pair, tmp_path):
    """The stats failing (a full disk) kept --grow-file from being written, unsaid: the run's
    growth lost. Each is written whole or left as it was, and the one that failed is said."""
    _, engines, prompts = pair
    stats, grow = tmp_path / "stats.json", tmp_path / "grow.npz"
    stats.write_text('{"earlier": true}')
    # 4 KiB: the growth of four short answers fits, the stats (per-prompt records) do not
    r = limited(["run", engines, "--prompts", prompts, "--max-new-tokens", "8", "--quiet", "--stats", stats,
                 "--grow-file", grow], 4)
    assert one_error(r) == f"error: {stats}: cannot write it (File too large)"
    assert stats.read_text() == '{"earlier": true}'
    assert grow.is_file() and sorted(p.name for p in tmp_path.iterdir()) == ["grow.npz", "stats.json"]


@pytest.mark.parametrize("unbuffered", ["1", None])
@pytest.mark.parametrize("command", ["inspect", "run"])
def test_standard_output_on_a_full_disk_is_named(pair, tmp_path, command, unbuffered):
    """`specrt ... > FILE` on a full disk said "error: File too large", naming nothing, then
    Python's "Exception ignored ... File too large" as it flushed stdout at exit, exit 120; under
    PYTHONUNBUFFERED (container images often set it) `inspect --json` said nothing and exited
    0, FILE cut at the limit: the text layer over an unbuffered file drops what a short write
    left. Now exit 1 and the one error line, and the output whole where there is room."""
    _, engines, _ = pair
    rng = random.Random(2)
    prompts = tmp_path / "ten.jsonl"  # (ten answers of 40 token ids: past 1 KiB of text)
    prompts.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(3, 1000) for _ in range(4)]}) + "\n"
                               for _ in range(10)))
    args = {"inspect": ["inspect", REFERENCE / "verifier", "--draft", REFERENCE / "draft", "--json"],
            "run": ["run", engines, "--prompts", prompts, "--max-new-tokens", "40", "--governor", "off"]}[command]
    with open(tmp_path / "out.txt", "w") as f:
        r = limited(args, 1, stdout=f, PYTHONUNBUFFERED=unbuffered)
    assert one_error(r) == "error: standard output: File too large"
    assert "Exception ignored" not in r.stderr, r.stderr
    r = limited(args, 1024, PYTHONUNBUFFERED=unbuffered)
    assert r.returncode == 0 and len(r.stdout) > 1024, r.stderr  # (a pipe: whole)
    if command == "inspect":
        assert json.loads(r.stdout)["target"]["slots"]


def _failing_long_stderr_writes(least: int) -> None:
    """A seccomp filter on this process (a preexec_fn: the command's child, inherited by its
    re-exec): write(2) to file descriptor 2 of ``least`` bytes or more fails with EIO, shorter
    ones succeed; every other call as before. (x86_64 Linux: its audit arch and write's number.)"""
    import ctypes
    import errno
    import struct

    def op(code: int, jt: int, jf: int, k: int) -> bytes:  # a classic BPF instruction
        return struct.pack("HBBI", code, jt, jf, k)

    load, eq, ge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    code = b"".join([op(load, 0, 0, 4), op(eq, 0, 7, 0xC000003E),  # seccomp_data.arch: x86_64, else allow
                     op(load, 0, 0, 0), op(eq, 0, 5, 1),  # nr: write
                     op(load, 0, 0, 16), op(eq, 0, 3, 2),  # args[0]: fd 2
                     op(load, 0, 0, 32), op(ge, 0, 1, least),  # args[2]: the byte count
                     op(ret, 0, 0, 0x00050000 | errno.EIO), op(ret, 0, 0, 0x7FFF0000)])  # ERRNO(EIO), ALLOW
    buf = ctypes.create_string_buffer(code, len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    # PR_SET_NO_NEW_PRIVS (38), then PR_SET_SECCOMP (22) with SECCOMP_MODE_FILTER (2)
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(Program(len(code) // 8, ctypes.addressof(buf))),
                                                0, 0):
        raise OSError(ctypes.get_errno(), "prctl")


@pytest.mark.skipif(sys.platform != "linux" or os.uname().machine != "x86_64", reason="x86_64 Linux's seccomp")
def test_a_failed_write_to_standard_error_is_named_as_standard_error(pair, tmp_path):
    """Mutant m71b-56 (session 71, left in 71-74: "no test without a transient condition"): a
    write to standard error that failed (EIO) was said as standard output's, and stdout sent to
    /dev/null; the code itself said "error: Input/output error", naming nothing. Shown where a
    stderr write fails and the error's own then succeeds: the kernel fails every write of 60
    bytes or more to fd 2 (the run's closing line, after its answers), the error line is shorter,
    and the answers are whole on stdout. (Unbuffered, as
    containers often run: a buffered stderr keeps the failed note and writes it again with the
    error line, which fails too.)"""
    _, engines, prompts = pair
    r = subprocess.run([sys.executable, "-m", "specrt", "run", engines, "--prompts", prompts, "--max-new-tokens", "4",
                        "--governor", "off"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "SPECRT_THP": "0", "PYTHONUNBUFFERED": "1"},
                       preexec_fn=lambda: _failing_long_stderr_writes(60))
    assert one_error(r) == "error: standard error: Input/output error"
    assert r.stderr == "error: standard error: Input/output error\n", r.stderr
    assert [len(a.split()) for a in r.stdout.split("\n\n")] == [4] * 4, r.stdout  # (4 answers of 4 token ids)
