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


# ------------------------------------------------------------------------------------- extras pinned to the lock


def _lock() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_every_extra_pins_what_the_lock_pins() -> None:
    """``pip install ".[text]"`` once took torch 2.14.1 and its CUDA stack where the lock has 2.13.0 (issue #34):
    every requirement of every extra is ``==`` the lock's version; the core's ranges contain the lock's."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lock = _lock()
    problems = []
    for extra, requirements in project["optional-dependencies"].items():
        for line in requirements:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            if name == "otfed":
                continue
            specs = list(requirement.specifier)
            if name not in lock:
                problems.append(f"[{extra}] {line}: not in requirements.lock")
            elif len(specs) != 1 or specs[0].operator != "==" or specs[0].version != lock[name]:
                problems.append(f"[{extra}] {line}: the lock pins {requirement.name}=={lock[name]}")
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if not requirement.specifier.contains(lock[canonicalize_name(requirement.name)]):
            problems.append(f"core {line}: excludes the locked {lock[canonicalize_name(requirement.name)]}")
    assert not problems, "\n".join(problems)



def test_the_conformance_side_install_pins_exact_versions_outside_the_lock() -> None:
    """requirements-conformance.txt (pyDVL and OpenDataVal for the adapter tests) goes in with ``pip install
    --no-deps --target .venv/conformance``: nothing resolves it, so every line is ``name==version``; no package of
    the lock is in it (the locked one would win on sys.path, so a copy there is dead weight or a second version);
    and ``make test`` builds it with exactly that command before the tests, which then require it."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lock = _lock()
    problems, names = [], set()
    for line in (REPO / "requirements-conformance.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        names.add(canonicalize_name(requirement.name))
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version or requirement.marker \
                or requirement.extras or requirement.url:
            problems.append(f"{line}: not an exact pin (name==version)")
        if canonicalize_name(requirement.name) in lock:
            problems.append(f"{line}: requirements.lock pins {requirement.name}=={lock[canonicalize_name(requirement.name)]}")
    assert not problems, "\n".join(problems)
    assert {"pydvl", "opendataval"} <= names
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -q --no-deps --target $(CONFORMANCE) -r requirements-conformance.txt" in makefile
    assert "test: setup conformance" in makefile and "test: export OTFED_REQUIRE_CONFORMANCE := 1" in makefile


def test_the_bias_estimate_needs_no_tqdm() -> None:
    """otfed.distill.bias imports tqdm only to show a bar: with tqdm unimportable (torch then goes without it too)
    the probability bias of a model that always answers label 1 is (0, 1, 0), its exact value."""
    script = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tqdm":
            raise ImportError("tqdm is blocked")
sys.meta_path.insert(0, Blocked())
import torch
from otfed.distill.bias import probability_bias
bias = probability_bias(lambda texts: torch.tensor([[0.2, 0.7, 0.1]] * len(texts)), ["a b", "c d", "e f"],
                        batch_size=2, progress=False)
print(bias.tolist(), "tqdm" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=ceiling(300))
    assert done.returncode == 0, tail(done.stdout, done.stderr)
    assert done.stdout.split() == ["[0.0,", "1.0,", "0.0]", "False"], done.stdout
