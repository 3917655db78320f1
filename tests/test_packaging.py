"""What ``pip install otfed`` puts into site-packages: the library ``otfed`` and nothing else.

The pipeline (``stages/``, ``flows/``), the benchmarks, studies and GPU tooling live in the repository and are run
from a checkout (``make setup`` puts the checkout on its venv's path and writes the ``otfed`` command there); a wheel
that installed top-level packages named ``stages`` or ``flows`` would collide with anyone's own. The check builds
the real wheel, offline, from a copy of the project's files (the wheel build writes ``build/`` next to them).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.ceilings import ceiling, tail

REPO = Path(__file__).resolve().parent.parent
COPIED = ("pyproject.toml", "README.md", "LICENSE", "otfed", "stages", "flows", "bench", "studies", "gpu")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in COPIED:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif path.is_file():
            shutil.copy2(path, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
               "-w", str(out), str(source)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=ceiling(300))
    assert done.returncode == 0, f"building the wheel failed:\n{tail(done.stdout, done.stderr)}"
    (built,) = out.glob("otfed-*.whl")
    return zipfile.ZipFile(built)


@pytest.mark.slow  # builds the wheel
def test_the_wheel_holds_the_library_only(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/", 1)[0] for name in wheel.namelist()}
    dist_info = {name for name in top if name.endswith(".dist-info")}
    assert top - dist_info == {"otfed"}, f"the wheel installs {sorted(top - dist_info)}; only otfed belongs there"
    modules = {name for name in wheel.namelist() if name.endswith(".py")}
    for module in ("otfed/__init__.py", "otfed/federation/fedwad.py", "otfed/federation/fedbary.py",
                   "otfed/distill/__init__.py", "otfed/ot/__init__.py"):
        assert module in modules, f"the wheel lacks {module}"


@pytest.mark.slow  # builds the wheel
def test_the_wheel_declares_no_command_it_cannot_run(wheel: zipfile.ZipFile) -> None:
    """A console script pointing into ``flows`` would install an ``otfed`` command that fails on import."""
    entry_points = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    for name in entry_points:
        text = wheel.read(name).decode()
        assert "flows" not in text and "stages" not in text, f"{name} points outside the library:\n{text}"


def test_the_checkout_venv_runs_the_otfed_command() -> None:
    """What ``make setup`` writes: the ``otfed`` command beside the interpreter, answering ``--help``."""
    command = Path(sys.executable).parent / "otfed"
    if not command.is_file():
        pytest.skip(f"{command} not found: this interpreter's venv was not made by `make setup`")
    done = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=ceiling(120),
                          cwd=REPO)
    assert done.returncode == 0 and "run" in done.stdout and "doctor" in done.stdout, tail(done.stdout, done.stderr)
