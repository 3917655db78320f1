"""``run.task_runner: dask`` on a real ``distributed`` cluster: the same outputs as ``sequential`` and
``thread``, bad addresses and dying workers fail cleanly.

A real ``dask scheduler`` and two ``dask worker`` processes are started on 127.0.0.1 (ephemeral ports,
scheduler file) in a throw-away project holding tiny params; every stage runs as the user runs it,
``python -m flows.stage <name>`` (its own Prefect flow and temporary server), once per runner. The outputs are
compared byte for byte — the reports (tables, figures, metrics.json) and, for the text stage, the saved
models and the teachers' messages.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from tests.ceilings import ceiling, completed, hit, tail, wait_until
from tests.integration.support import stop_processes, BIN, REPO, clean_env, free_port
from tests.stages.conftest import tiny_params
from tests.stages.test_text_stages import text_params

pytestmark = pytest.mark.integration

# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine; idle, a stage run takes
# 10-30 s, the scheduler and the workers start in a few seconds
STAGE_S = 480
CLUSTER_START_S = 240


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


def _portable_exports() -> dict[str, str]:
    """What ``eval "$(python -m otfed.cpu_kernels)"`` exports: the README's way to start a ``dask worker`` by hand
    on the stages' portable CPU kernels (``distributed`` imports numpy before a task could set them)."""
    out = subprocess.run([sys.executable, "-m", "otfed.cpu_kernels"], cwd=REPO, env=clean_env(), capture_output=True,
                         text=True, check=True).stdout
    return dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())


def _stage(root: Path, name: str) -> subprocess.CompletedProcess:
    """``python -m flows.stage <name>`` in ``root``, once it has exited (a hang fails at ``ceiling(STAGE_S)``)."""
    return completed([sys.executable, "-m", "flows.stage", name], f"the stage {name} to exit", STAGE_S, cwd=root,
                     env=_env(root))


def _prefect_servers_under(pid: int) -> list[str]:
    """The Prefect API servers among the descendants of process ``pid`` (a worker that found no API to report
    to would start a temporary one and keep it until it exits)."""
    out = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "prefect.server.api.server:create_app" in " ".join(child.cmdline()):
                out.append(f"{child.pid} {' '.join(child.cmdline())}")
        except psutil.NoSuchProcess:
            continue
    return out


def _files(root: Path, folders: list[str]) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for folder in folders
            for f in sorted((root / folder).rglob("*")) if f.is_file()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A project with the partition stage run, and a Dask scheduler + 2 single-threaded workers started in
    it as the README asks of remote workers: from the project root, with the portable CPU kernels exported."""
    if shutil.which("dask", path=str(BIN)) is None:
        pytest.skip("needs the dask command (distributed)")
    root = tmp_path_factory.mktemp("dask_project")
    _write_params(root, "sequential")
    done = _stage(root, "partition")
    assert done.returncode == 0, done.stderr
    env = _env(root)
    env["DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES"] = "1"  # a task that kills 2 workers fails (default 3)
    scheduler_file = root / "scheduler.json"
    logs = {name: root / f"{name}.log" for name in ("scheduler", "workers")}
    with open(logs["scheduler"], "wb") as log:
        procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                                   "--no-dashboard", "--scheduler-file", str(scheduler_file)],
                                  cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)]
    try:
        def scheduler_file_written() -> bool:
            if procs[0].poll() is not None:
                pytest.fail(f"the Dask scheduler exited with {procs[0].returncode}:\n"
                            f"{tail(logs['scheduler'].read_text())}")
            return scheduler_file.exists()

        wait_until(scheduler_file_written, "the Dask scheduler to write its scheduler file", CLUSTER_START_S,
                   poll=0.2, details=lambda: tail(logs["scheduler"].read_text()))
        address = yaml.safe_load(scheduler_file.read_text())["address"]
        with open(logs["workers"], "wb") as log:
            procs.append(subprocess.Popen([str(BIN / "dask"), "worker", "--scheduler-file", str(scheduler_file),
                                           "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1",
                                           "--no-dashboard"],
                                          cwd=root, env={**env, **_portable_exports()}, stdout=log,
                                          stderr=subprocess.STDOUT))
        from distributed import Client

        with Client(address, timeout=ceiling(CLUSTER_START_S), set_as_default=False) as client:
            try:
                client.wait_for_workers(2, timeout=ceiling(CLUSTER_START_S))
            except TimeoutError:
                pytest.fail(hit("2 Dask workers to join the scheduler", CLUSTER_START_S,
                                tail(logs["workers"].read_text())))
        yield root, address, procs[1]
    finally:
        stop_processes(procs)


@pytest.mark.parametrize("name, folders, runners", [
    ("fed_distance", ["reports/fed_distance"], ("sequential", "thread", "dask")),
    ("train_teachers", ["reports/teachers", "models/text", "data/text_messages"], ("sequential", "dask")),
])
def test_a_stage_gives_the_same_outputs_on_every_runner(cluster, name: str, folders: list[str],
                                                        runners: tuple[str, ...]) -> None:
    root, address, workers = cluster
    outputs = {}
    for runner in runners:
        _write_params(root, runner, address if runner == "dask" else None)
        done = _stage(root, name)
        assert done.returncode == 0, done.stderr
        on = f"dask at {address}" if runner == "dask" else f"{runner} × {1 if runner == 'sequential' else 2}"
        assert f"tasks on {on}" in done.stderr
        assert "off the portable CPU kernels" not in done.stderr, done.stderr  # workers hold them too
        outputs[runner] = _files(root, folders)
        if runner == "dask":  # the workers reported to the stage's Prefect server instead of starting their own
            assert not _prefect_servers_under(workers.pid)
    assert outputs["sequential"], "the stage wrote nothing"
    for runner in runners[1:]:
        assert outputs[runner].keys() == outputs["sequential"].keys()
        differ = [f for f in outputs["sequential"] if outputs[runner][f] != outputs["sequential"][f]]
        assert not differ, f"{runner} differs from sequential in {differ}"


def test_an_address_that_does_not_answer_is_one_error_line_and_writes_nothing(tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{free_port('Dask scheduler')}"  # nothing listens there
    _write_params(tmp_path, "dask", address)
    done = _stage(tmp_path, "partition")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: params.yaml: run.dask_address: no Dask scheduler "
                                                   f"answers at '{address}'"), done.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "data").exists()
    assert not (tmp_path / ".prefect").exists()  # no Prefect server was started either


def test_a_worker_that_dies_fails_the_stage_with_the_task_named_and_keeps_the_outputs(cluster) -> None:
    """The job ``doomed`` kills its worker process; Dask retries it once on a restarted worker, then gives
    up (``KilledWorker``): the stage exits non-zero naming the task and the last worker it killed — one the
    workers' log shows starting —, the previous reports stay as they were."""
    root, address, _ = cluster
    _write_params(root, "dask", address)
    before = _files(root, ["reports/partition", "data/partitions"])
    done = completed([sys.executable, str(Path(__file__).with_name("dying_stage.py"))], "the dying stage to exit",
                     STAGE_S, cwd=root, env=_env(root))
    assert done.returncode == 1, done.stderr
    assert "  in task 'doomed'" in done.stderr, done.stderr
    named = re.search(r"^error: DaskWorkerLost: Dask worker (tcp://127\.0\.0\.1:\d+) of the scheduler at "
                      rf"{re.escape(address)} was lost while running this stage's tasks \(KilledWorker: ", done.stderr,
                      re.MULTILINE)
    assert named, done.stderr
    assert re.search(rf"Start worker at:\s+{re.escape(named.group(1))}\n", (root / "workers.log").read_text())
    assert _files(root, ["reports/partition", "data/partitions"]) == before
    assert not list(root.glob("**/.*.staging")), "a staging folder was left behind"
