"""specrt as a deployment installs it: its wheel in a virtual environment, no checkout beside it.

The wheel is built from a copy of the package's sources (pip builds in the tree it is given:
in the checkout it would write build/, whose stale modules a later wheel can carry) and
installed with pip into a fresh venv; the dependencies then come from this interpreter's
site-packages through a .pth written after the install (so pip sees no specrt installed and
touches this environment's editable one not at all)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import specrt

REPO = Path(__file__).resolve().parents[2]
# pyproject.toml's package-dir: the import name of each source folder
PACKAGES = {"specrt": "specrt", "export": "specrt/export", "engines": "specrt/engines", "runtime": "specrt/runtime"}
COMMANDS = ("bench", "build", "calibrate", "canary", "chat", "compare", "corpus", "export", "inspect", "profile",
            "run", "serve")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel and what its build printed (pip -v shows the backend's warnings)."""
    pytest.importorskip("setuptools", minversion="77", reason="builds the wheel without isolation (torch brings it)")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in PACKAGES:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--disable-pip-version-check", "--no-deps",
                        "--no-build-isolation", "-w", str(dist), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = dist.glob("specrt-*.whl")
    return whl, r.stdout + r.stderr


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


def test_the_build_is_not_deprecated(built):
    """`license = { text = ... }` warned at every build that setuptools refuses it from
    2027-02-18 (then no wheel, no `pip install -e .`)."""
    assert "SetuptoolsDeprecationWarning" not in built[1], built[1][-3000:]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--no-index", str(wheel)], check=True)
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "specrt_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root


def _run(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "SPECRT_THP": "0", "HOME": str(cwd)}
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=120)


def test_the_wheel_holds_every_module_and_nothing_of_the_checkout(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    info = f"specrt-{specrt.__version__}.dist-info"
    want = {f"{PACKAGES[p.parts[0]]}/{'/'.join(p.parts[1:])}"
            for folder in PACKAGES for p in (q.relative_to(REPO) for q in (REPO / folder).glob("*.py"))}
    assert want <= set(names), sorted(want - set(names))
    assert {n.split("/")[0] for n in names} == {"specrt", info}  # no tests/, tools/, fixtures/
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert f"\nVersion: {specrt.__version__}\n" in meta and "Description-Content-Type: text/markdown" in meta
    assert "\nLicense-Expression: Apache-2.0\n" in meta
    assert (REPO / "README.md").read_text().splitlines()[0] in meta.splitlines()  # the README is the description
    entry = zipfile.ZipFile(wheel).read(f"{info}/entry_points.txt").decode()
    assert "specrt = specrt.launch:entry" in entry


def test_the_installed_command_answers_outside_any_checkout(venv, tmp_path):
    r = _run(venv, "specrt", "--version", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == f"specrt, version {specrt.__version__}", r.stderr
    for command in COMMANDS:
        r = _run(venv, "specrt", command, "--help", cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith(f"Usage: specrt {command} "), (command, r.stderr)
    show = ("import json, specrt, specrt.cmd_bench as cb; print(json.dumps([specrt.__file__, "
            "cb.load_bench_lib() is None, cb.no_peers_reason()]))")
    r = _run(venv, "python", "-c", show, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    where, no_lib, why = json.loads(r.stdout)
    assert where.startswith(str(venv)), where  # the wheel's specrt, not this checkout's
    # bench's peers (the checkout's tools/bench_lib.py) are absent, and bench says so and what to do
    assert no_lib and "installed wheel" in why and "--peers none" in why and "bench_lib.py is missing" not in why
