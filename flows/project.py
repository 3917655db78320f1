"""Where the user's project lives: the MLflow store, the Prefect home and the run logs belong to it.

:func:`project_root` is the repository the user runs in, not the folder this code was loaded from: under
``dvc exp run --queue`` / ``--temp`` DVC runs each stage in a throw-away copy of the repository
(``.dvc/tmp/exps/…``) that is deleted afterwards, and sets ``DVC_ROOT`` to the user's repository — so the
experiment's MLflow runs and Prefect flow runs land in the user's store, not in the copy's.

Resolution order: ``OTFED_HOME`` (explicit override) → ``DVC_ROOT`` (set by DVC for every stage command,
the parent repository for queued / temp experiments) → the git top level of the working directory → the
working directory. ``MLFLOW_TRACKING_URI`` and ``PREFECT_HOME`` still override the store and the Prefect
home individually.

:func:`exclusive` is a cross-process lock on a file beside a store: the first use of a fresh SQLite store
(MLflow's schema migration) and the creation of the experiment happen under it, so two stages starting at
once cannot leave a half-migrated database.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def project_root() -> Path:
    """The user's repository: ``OTFED_HOME``, else ``DVC_ROOT``, else the git top level of the cwd, else the cwd."""
    for var in ("OTFED_HOME", "DVC_ROOT"):
        if os.environ.get(var):
            return Path(os.environ[var]).resolve()
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             check=True).stdout.strip()
        if top:
            return Path(top).resolve()
    except (OSError, subprocess.CalledProcessError):
        pass
    return Path.cwd().resolve()


def prefect_home() -> Path:
    """``PREFECT_HOME`` if set, else ``<project>/.prefect`` (Prefect's database, settings and run logs)."""
    return Path(os.environ.get("PREFECT_HOME") or project_root() / ".prefect")


def log_dir() -> Path:
    """Where full logs (with tracebacks) of every stage run go: ``<project>/.prefect/logs``."""
    return prefect_home() / "logs"


@contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; waits for other holders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
