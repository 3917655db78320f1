"""``otfed doctor``: is this environment able to run the pipeline? One :class:`Check` per line, ok / FAIL / info.

The checks, in order: the Python version (``requires-python``); the key packages importable at the versions
``requirements.lock`` pins (:data:`KEY_PACKAGES`); ``dvc`` and ``git`` on the PATH (or beside this Python,
in its virtual environment); ``params.yaml`` valid (and, when it is not, which stages can still run: each
validates only the groups it needs); the embedded files ``partition`` reads present in ``data/raw``; CUDA
(information only: every stage runs on the CPU); the MLflow store writable; what killed stages left behind
(information; ``--fix`` cleans it). Any FAIL → exit status 1.

The pipeline's own code (``stages``, ``otfed``, torch, MLflow) is imported inside the checks, and a check that
raises becomes a FAIL line: a broken environment is what the doctor is for, so it must not crash on it.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal

from flows.redaction import redact

PYTHON = (3, 11)  # pyproject.toml: requires-python = ">=3.11"
# distribution (as requirements.lock spells it) → the module it is imported as
KEY_PACKAGES: dict[str, str] = {
    "torch": "torch", "prefect": "prefect", "mlflow": "mlflow", "dvc": "dvc", "POT": "ot",
    "geomloss": "geomloss", "pandas": "pandas", "SQLAlchemy": "sqlalchemy", "pydantic": "pydantic",
    "fastapi": "fastapi",
}
TOOLS = ("dvc", "git")


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: ``status`` (ok, FAIL, info), what was checked, and what was found."""

    status: Literal["ok", "FAIL", "info"]
    what: str
    detail: str = ""

    def line(self) -> str:
        head = f"{self.status:<5} {self.what}"
        return f"{head}: {self.detail}" if self.detail else head


def python_version(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    """The interpreter is at least :data:`PYTHON`."""
    shown = ".".join(map(str, version))
    need = ".".join(map(str, PYTHON))
    ok = tuple(version[:2]) >= PYTHON
    return Check("ok" if ok else "FAIL", "python", shown + ("" if ok else f" (needs ≥ {need})"))


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503: case and runs of ``-_.`` do not matter)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(lock: Path) -> dict[str, str]:
    """``requirements.lock``'s pins: canonical distribution name → version (comments and options skipped)."""
    pins = {}
    for raw in lock.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[canonical(name.split("[")[0].strip())] = version.strip()
    return pins


def package(distribution: str, module: str, pins: dict[str, str]) -> Check:
    """``distribution`` is installed at the version the lock pins (``==`` as pip reads it: a local label such
    as ``+cpu`` matches a pin without one) and ``module`` imports."""
    pin = pins.get(canonical(distribution))
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return Check("FAIL", distribution, f"not installed (lock: {pin or 'not pinned'}); "
                                           "pip install -r requirements.lock")
    try:
        importlib.import_module(module)
    except Exception as exc:  # a broken install or an incompatible dependency
        return Check("FAIL", distribution, f"{installed} does not import: {type(exc).__name__}: {exc}")
    if pin is None:
        return Check("FAIL", distribution, f"{installed} (not pinned in requirements.lock)")
    if installed != pin and ("+" in pin or installed.split("+", 1)[0] != pin):
        return Check("FAIL", distribution, f"{installed} installed, requirements.lock pins {pin}; "
                                           "pip install -r requirements.lock")
    return Check("ok", distribution, f"{installed} (lock: {pin})")


def packages(lock: Path) -> list[Check]:
    """:func:`package` for every one of :data:`KEY_PACKAGES`; one FAIL if the lock file is missing."""
    if not lock.is_file():
        return [Check("FAIL", "requirements.lock", f"{lock} not found (run in the repository root)")]
    pins = locked_versions(lock)
    return [package(dist, module, pins) for dist, module in KEY_PACKAGES.items()]


def tool_path(name: str) -> str | None:
    """Where command ``name`` is: on the PATH, else beside this Python (its virtual environment's bin)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def tools() -> list[Check]:
    """``dvc`` and ``git`` can be run."""
    return [Check("ok", f"{name} command", found) if (found := tool_path(name)) else
            Check("FAIL", f"{name} command", "not found on the PATH (activate the environment: "
                                             "source .venv/bin/activate)")
            for name in TOOLS]


def params(path: Path) -> tuple[list[Check], object | None]:
    """``path`` validates (every group); when it does not, each error line, and which stages still run (a
    stage validates only its own groups). Returns the checks and the partition stage's view of the params
    (None if even that is invalid)."""
    from otfed.errors import ConfigError
    from stages.params import load_params, stages

    try:
        load_params(path)
    except ConfigError as exc:
        checks = [Check("FAIL", "params", line) for line in str(exc).splitlines()]
    else:
        return [Check("ok", "params", f"{path} valid")], load_params(path, stage="partition")
    runnable = []
    for name in sorted(stages()):
        try:
            load_params(path, stage=name)
            runnable.append(name)
        except ConfigError:
            pass
    checks.append(Check("info", "params", f"stages whose groups are valid: {', '.join(runnable) or 'none'}"))
    try:
        return checks, load_params(path, stage="partition")
    except ConfigError:
        return checks, None


def raw_data(partition_view: object | None, default_dir: Path = Path("data/raw")) -> Check:
    """The embedded files stage ``partition`` reads for the configured federations and text tasks (every
    embedded file when the partition group is invalid) are present."""
    from otfed.data.images import IMAGE_DATASETS
    from otfed.data.text import RAW_FILES
    from stages.partition import raw_files

    if partition_view is not None:
        files = raw_files(partition_view.partition)  # type: ignore[attr-defined]
    else:
        files = [default_dir / name for name in [*IMAGE_DATASETS.values(), *RAW_FILES.values()]]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        return Check("FAIL", "data", f"missing {', '.join(missing)} (the embedded data: data/README.md)")
    folders = sorted({str(f.parent) for f in files})
    return Check("ok", "data", f"{len(files)} files partition reads, in {', '.join(folders) or '-'}")


def cuda() -> Check:
    """Information only: whether torch sees a CUDA device (``run.device: auto`` uses it when present)."""
    import torch

    if torch.cuda.is_available():
        return Check("info", "cuda", f"{torch.cuda.device_count()} device(s), {torch.cuda.get_device_name(0)}")
    return Check("info", "cuda", "not available: torch code runs on the CPU")


def mlflow_store() -> Check:
    """The MLflow store (:func:`flows.tracking.tracking_uri`) is writable: a SQLite file whose folder takes a
    new file (and the file itself, if it exists); a server URI is only named."""
    from flows.tracking import sqlite_path, tracking_uri

    uri = tracking_uri()
    db = sqlite_path(uri)
    if db is None:
        return Check("info", "mlflow", f"{uri} (a server: not checked)")
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=db.parent, prefix=".otfed-doctor-"):
            pass
    except OSError as exc:
        return Check("FAIL", "mlflow", f"{db.parent} not writable ({exc.strerror or exc})")
    if db.exists() and not os.access(db, os.W_OK):
        return Check("FAIL", "mlflow", f"{db} not writable")
    return Check("ok", "mlflow", f"{uri} writable")


def leftovers(fix: bool = False) -> Check:
    """What killed stages left in this project (:mod:`flows.leftovers`): staging folders, a previous-outputs folder
    stranded mid-swap and owner records whose process is gone, beside every stage's output folders (relative to
    the current folder), and MLflow runs such a process left RUNNING (:func:`flows.tracking.abandoned_runs`; in a
    SQLite store that exists — a tracking server is not asked). Information only: the next stage cleans them
    too. With ``fix`` they are cleaned now — folders removed (or put back), runs marked KILLED with a note."""
    from flows import leftovers as left
    from stages.params import stages

    folders = [folder for stage in stages().values() for folder in stage.outputs]
    found = [f.describe() for f in left.stale(folders) if not f.quiet]
    done = [f.line() for f in left.clean_stale(folders) if not f.quiet] if fix else []
    runs, closed = _abandoned_runs(fix)
    if fix:
        done += [f"MLflow run {run_id} marked KILLED" for run_id in closed]
        return Check("ok", "leftovers", "; ".join(done) if done else "none")
    found += [f"MLflow run {run_id} left RUNNING by a process that is gone" for run_id in runs]
    if not found:
        return Check("ok", "leftovers", "none")
    return Check("info", "leftovers", f"{'; '.join(found)} — the next stage cleans them, or now: otfed doctor --fix")


def _abandoned_runs(fix: bool) -> tuple[list[str], list[str]]:
    """The ids of the MLflow runs a dead stage process left RUNNING, and of those marked KILLED (with ``fix``);
    nothing where the store is not an existing SQLite file (the doctor creates no store and waits on no
    server)."""
    from flows import tracking

    db = tracking.sqlite_path(tracking.tracking_uri())
    if db is None or not db.is_file():
        return [], []
    client = tracking._client()
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT)
    if experiment is None:
        return [], []
    if fix:
        return [], tracking.close_abandoned_runs(client, experiment.experiment_id, by="otfed doctor --fix")
    return [run.info.run_id for run in tracking.abandoned_runs(client, experiment.experiment_id)], []


def _failed(what: str, exc: Exception) -> Check:
    return Check("FAIL", what, f"check failed: {type(exc).__name__}: {exc}")


def _guarded(what: str, check: Callable[[], Check]) -> Check:
    """``check()``, or a FAIL line naming ``what`` and the exception it raised."""
    try:
        return check()
    except Exception as exc:
        return _failed(what, exc)


def checks(params_path: Path, lock: Path = Path("requirements.lock"), fix: bool = False) -> Iterable[Check]:
    """Every check, in report order (lazily: each line can be printed as soon as it is known); ``fix``: clean the
    leftovers of killed stages (:func:`leftovers`)."""
    yield python_version()
    yield from packages(lock)
    yield from tools()
    try:
        param_checks, view = params(params_path)
    except Exception as exc:  # the pipeline code does not import
        param_checks, view = [_failed("params", exc)], None
    yield from param_checks
    yield _guarded("data", lambda: raw_data(view))
    yield _guarded("cuda", cuda)
    yield _guarded("mlflow", mlflow_store)
    yield _guarded("leftovers", lambda: leftovers(fix))


def run(params_path: Path, echo: Callable[[str], None] = print, fix: bool = False) -> int:
    """Print every check, one line each (credentials in URIs hidden: :func:`flows.redaction.redact`); 1 if any
    FAILed, else 0. ``fix``: clean the leftovers of killed stages first (:func:`leftovers`)."""
    failed = False
    for check in checks(params_path, fix=fix):
        echo(redact(check.line()))
        failed |= check.status == "FAIL"
    return 1 if failed else 0
