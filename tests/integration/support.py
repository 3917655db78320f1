"""What the tests that start real processes share: a free port, the environment of a child process, git, and a
throw-away git + DVC repository holding this project's code and one stage as ``dvc.yaml`` declares it."""
from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ceilings import ceiling, completed

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # this virtual environment's commands: dvc, mlflow, prefect, dask
# how long a stage run in a child process may wait for its temporary Prefect server to start (~10 s when idle;
# flows/stage.py's default, 120 s, can kill a stage on a saturated machine): a ceiling, scaled like the tests' own
PREFECT_STARTUP_S = 600
# the project's Prefect server of a throw-away project stops this long after its last stage (the default, a
# minute, would keep one per test module alive long after its tests)
PREFECT_IDLE_S = "15"


def free_port(server: str) -> int:
    """A TCP port free on 127.0.0.1 now; skips the test where none can be bound (``server`` names what
    could then not start)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    except OSError as exc:
        pytest.skip(f"cannot bind a TCP port on 127.0.0.1, so no {server} can start here: {exc}")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: no PREFECT_ / MLFLOW_ / OTFED_ / DVC_ setting of the caller (tests
    may have set some), this virtual environment first on PATH, no analytics, no bytecode files, a temporary
    Prefect server's start-up ceiling of ``ceiling(PREFECT_STARTUP_S)`` (a stage it runs must not die of a slow
    start under load), the project server's idle time :data:`PREFECT_IDLE_S`; plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "OTFED_", "DVC_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONDONTWRITEBYTECODE="1",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=str(math.ceil(ceiling(PREFECT_STARTUP_S))),
               OTFED_PREFECT_IDLE_S=PREFECT_IDLE_S)
    env.update(extra)
    return env


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate ``procs`` (started in order: a scheduler before its workers) last first, then wait for each,
    killing one that has not exited 30 s after."""
    for proc in reversed(procs):
        proc.terminate()
    for proc in reversed(procs):
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def stage_repository(repo: Path, stage: str, params: dict[str, Any], metrics: bool = False) -> Path:
    """``repo`` as a git + DVC repository (nothing committed) with a copy of ``otfed``, ``stages`` and
    ``flows``, ``params`` as its params.yaml and ``stage`` exactly as this project's ``dvc.yaml`` declares it
    (``metrics``: with the stage's ``metrics:`` entries, for ``dvc exp show``). Skips without git or dvc."""
    if shutil.which("git") is None or shutil.which("dvc", path=clean_env()["PATH"]) is None:
        pytest.skip("needs git and dvc")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("otfed", "stages", "flows"):
        shutil.copytree(REPO / folder, repo / folder, ignore=ignore)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    declared = yaml.safe_load((REPO / "dvc.yaml").read_text())
    pipeline: dict[str, Any] = {"stages": {stage: declared["stages"][stage]}}
    if metrics:
        pipeline["metrics"] = [m for m in declared["metrics"] if m.startswith(f"reports/{stage}/")]
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (repo / ".gitignore").write_text("mlruns.db*\nmlartifacts/\n.prefect/\n/data/partitions\n/data/text_partitions\n")
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "test@example.org")
    git(repo, "config", "user.name", "test")
    done = completed(["dvc", "init", "-q"], "dvc init", 120, cwd=repo, env=clean_env())
    assert done.returncode == 0, done.stderr
    return repo
