"""``run.task_runner: dask`` on a real ``distributed`` cluster: the same outputs as ``sequential`` and
``thread``, bad addresses and dying workers fail cleanly.

A real ``dask scheduler`` and two ``dask worker`` processes are started on 127.0.0.1 (ephemeral ports,
scheduler file) in a throw-away project holding tiny params; every stage runs as the user runs it,
``python -m stages.<name>`` (its own Prefect flow and temporary server), once per runner. The outputs are
compared byte for byte — the reports (tables, figures, metrics.json) and, for the text stage, the saved
models and the teachers' messages.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.support import BIN, REPO, clean_env, free_port
from tests.stages.conftest import tiny_params
from tests.stages.test_text_stages import text_params

pytestmark = pytest.mark.integration


def _env(root: Path) -> dict[str, str]:
    # the test's own job modules (dying_stage.py) import on the workers too
    return clean_env(OTFED_HOME=str(root), PYTHONPATH=str(REPO))


def _params(root: Path) -> dict:
    """Tiny feature-track params plus the tiny SA text task of tests/stages/test_text_stages.py."""
    params = tiny_params(root)
    text = text_params(root)
    params["partition"]["text"] = text["partition"]["text"]
    for stage in ("train_teachers", "estimate_bias", "distill"):
        params[stage] = text[stage]
    return params


def _write_params(root: Path, runner: str, address: str | None = None, workers: int = 2) -> None:
    params = _params(root)
    params["run"].update(task_runner=runner, max_workers=workers, dask_address=address)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _stage(root: Path, name: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=root, env=_env(root), text=True,
                          capture_output=True, timeout=timeout)


def _files(root: Path, folders: list[str]) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for folder in folders
            for f in sorted((root / folder).rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A project with the partition stage run, and a Dask scheduler + 2 single-threaded workers started in
    it (the workers' working directory is the project root, as the README asks of remote workers)."""
    if shutil.which("dask", path=str(BIN)) is None:
        pytest.skip("needs the dask command (distributed)")
    root = tmp_path_factory.mktemp("dask_project")
    _write_params(root, "sequential")
    done = _stage(root, "partition")
    assert done.returncode == 0, done.stderr
    env = _env(root)
    env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "1"  # a task that kills 2 workers fails (default 3)
    scheduler_file = root / "scheduler.json"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                              cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scheduler_file.exists(), "the Dask scheduler did not start"
        address = yaml.safe_load(scheduler_file.read_text())["address"]
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", "--scheduler-file", str(scheduler_file),
                                       "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1",
                                       "--no-dashboard"],
                                      cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
        yield root, address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.parametrize("name, folders, runners", [
    ("fed_distance", ["reports/fed_distance"], ("sequential", "thread", "dask")),
    ("train_teachers", ["reports/teachers", "models/text", "data/text_messages"], ("sequential", "dask")),
])
def test_a_stage_gives_the_same_outputs_on_every_runner(cluster, name: str, folders: list[str],
                                                        runners: tuple[str, ...]) -> None:
    root, address = cluster
    outputs = {}
    for runner in runners:
        _write_params(root, runner, address if runner == "dask" else None)
        done = _stage(root, name)
        assert done.returncode == 0, done.stderr
        on = f"dask at {address}" if runner == "dask" else f"{runner} × {1 if runner == 'sequential' else 2}"
        assert f"tasks on {on}" in done.stderr
        outputs[runner] = _files(root, folders)
    assert outputs["sequential"], "the stage wrote nothing"
    for runner in runners[1:]:
        assert outputs[runner].keys() == outputs["sequential"].keys()
        differ = [f for f in outputs["sequential"] if outputs[runner][f] != outputs["sequential"][f]]
        assert not differ, f"{runner} differs from sequential in {differ}"


def test_an_address_that_does_not_answer_is_one_error_line_and_writes_nothing(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port('Dask scheduler')}"  # nothing listens there
    _write_params(tmp_path, "dask", address)
    done = _stage(tmp_path, "partition", timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: params.yaml: run.dask_address: no Dask scheduler "
                                                   f"answers at '{address}'"), done.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "data").exists()
    assert not (tmp_path / ".prefect").exists()  # no Prefect server was started either


def test_a_worker_that_dies_fails_the_stage_with_the_task_named_and_keeps_the_outputs(cluster) -> None:
    """The job ``doomed`` kills its worker process; Dask retries it once on a restarted worker, then gives
    up (``KilledWorker``): the stage exits non-zero naming the task, the previous reports stay as they were."""
    root, address = cluster
    _write_params(root, "dask", address)
    before = _files(root, ["reports/partition", "data/partitions"])
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("dying_stage.py"))], cwd=root,
                          env=_env(root), text=True, capture_output=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "error: KilledWorker" in done.stderr and "  in task 'doomed'" in done.stderr, done.stderr
    assert _files(root, ["reports/partition", "data/partitions"]) == before
    assert not list(root.glob("**/.*.staging")), "a staging folder was left behind"
