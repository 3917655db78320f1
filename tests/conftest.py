"""Shared fixtures: a pre-migrated MLflow SQLite store copied per test (7 s → 0.1 s per test), and one torch
thread per test — on a shared 2-core machine torch's intra-op threads waiting on each other made small-tensor
tests 10–50× slower (one distillation test took 15 s instead of 0.3 s).

The tests run on the machine's own CPU kernels (``OTFED_CPU_KERNELS=native``, :mod:`otfed.cpu_kernels`): a
test must hold on any CPU, so none may depend on the kernels the pipeline holds its stages to. A test that
starts a stage process and wants those kernels removes the variable from the process's environment."""
from __future__ import annotations

import os

os.environ.setdefault("OTFED_CPU_KERNELS", "native")  # before anything imports stages/ or flows/

import copy
import shutil
from pathlib import Path
from typing import Callable

import pytest
import torch
import yaml

from otfed.errors import ConfigError
from stages.params import validate_params
from tests.ceilings import ceiling

REPO_ROOT = Path(__file__).resolve().parent.parent
# a stage flow run in this process starts a temporary Prefect server: its start-up ceiling scales like the tests'
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(round(ceiling(600))))
# a stage run in this process starts its project's Prefect server (flows/prefect_server.py) in a throw-away
# folder: let it stop 5 s after the test instead of the default minute (many tests, many throw-away projects)
os.environ.setdefault("OTFED_PREFECT_IDLE_S", "5")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """pytest-timeout's per-test ceiling (``timeout`` in pyproject.toml) scales with ``OTFED_TEST_TIME_FACTOR`` like
    every other ceiling (tests/ceilings.py); an explicit ``--timeout`` or ``PYTEST_TIMEOUT`` wins."""
    ini = config.getini("timeout")
    if ini and "PYTEST_TIMEOUT" not in os.environ:
        os.environ["PYTEST_TIMEOUT"] = str(ceiling(float(ini)))


@pytest.fixture(scope="session")
def migrated_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import mlflow

    path = tmp_path_factory.mktemp("mlflow") / "template.db"
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{path}")
    client.search_experiments()  # creates and migrates the schema once
    return path


@pytest.fixture
def mlflow_uri(migrated_mlflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    db = tmp_path / "mlruns.db"
    shutil.copy(migrated_mlflow_db, db)
    uri = f"sqlite:///{db}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need CUDA: skipped where torch sees no GPU (CPU CI); ``gpu/gpu_check.sh`` runs them."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def single_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def committed_params() -> dict:
    """The committed params.yaml, parsed (not validated)."""
    return yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


@pytest.fixture
def raw(committed_params: dict) -> dict:
    """A fresh copy of the committed params.yaml to mutate."""
    return copy.deepcopy(committed_params)


@pytest.fixture
def config_error(committed_params: dict) -> Callable[[Callable[[dict], object]], str]:
    """``config_error(mutate)``: the ConfigError message of the committed params after ``mutate``."""
    def error_of(mutate: Callable[[dict], object]) -> str:
        bad = copy.deepcopy(committed_params)
        mutate(bad)
        with pytest.raises(ConfigError) as info:
            validate_params(bad)
        return str(info.value)

    return error_of
