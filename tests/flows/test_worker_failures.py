"""A Dask worker lost under a stage — killed, out of memory, crashed — is named, with what to do
(flows/runners.py: ``lost_workers_named``, ``worker_lost``), instead of a bare ``CommClosedError … Stream is closed``.

The closed connection is injected as distributed raises it (its class, its ``in <TCP (closed) …>: Stream is
closed`` text, wrapped the way a task runner re-raises it); a killed worker is real: a LocalCluster worker process
that exits under its task, whose address the scheduler listed beforehand.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from distributed.comm.core import CommClosedError

from flows.runners import DaskWorkerLost, lost_workers_named, worker_lost
from flows.stage import failure_lines

SCHEDULER = "tcp://127.0.0.1:8786"
DEAD, ALIVE = "tcp://127.0.0.1:41234", "tcp://127.0.0.1:41240"


class _Scheduler:
    """A Dask client's view of a scheduler whose worker list changes from one call to the next."""

    def __init__(self, *workers: set[str]) -> None:
        self._workers = list(workers)

    def scheduler_info(self, n_workers: int = 5) -> dict:
        return {"workers": {address: {} for address in self._workers.pop(0)}}


def _closed(remote: str | None) -> Exception:
    """What a task's result raises when its worker is killed mid-task: a CommClosedError, re-raised by the task
    runner inside its own exception, with the task's name noted (flows.stage.fan_out)."""
    peer = f" remote={remote}" if remote else ""
    try:
        try:
            raise CommClosedError(f"in <TCP (closed) ConnectionPool.gather local=tcp://127.0.0.1:50000{peer}>: "
                                  "Stream is closed")
        except CommClosedError as comm:
            raise RuntimeError("task run failed") from comm
    except RuntimeError as exc:
        exc.add_note("in task 'pair 3-7'")
        return exc


def _lost(exc: Exception, client: object, scheduler: str | None = SCHEDULER) -> DaskWorkerLost:
    with pytest.raises(DaskWorkerLost) as caught:
        with lost_workers_named(client, scheduler):
            raise exc
    assert caught.value.__cause__ is exc  # the original failure stays in the log's traceback
    return caught.value


def test_a_closed_connection_names_the_worker_and_what_to_do(tmp_path: Path) -> None:
    lost = _lost(_closed(DEAD), _Scheduler({DEAD, ALIVE}, {ALIVE}))
    lines = failure_lines(lost, tmp_path / "fed_distance.log")
    assert lines[0] == (
        f"error: DaskWorkerLost: Dask worker {DEAD} of the scheduler at {SCHEDULER} was lost while running this "
        "stage's tasks (CommClosedError: in <TCP (closed) ConnectionPool.gather local=tcp://127.0.0.1:50000 "
        f"remote={DEAD}>: Stream is closed); see that worker's log and memory (an out-of-memory kill: `dmesg | grep "
        f"-i oom` on its host), restart it (`dask worker {SCHEDULER} …`, docs/scaling.md) and run the stage again, "
        "or set run.task_runner: thread to run on this machine alone")
    assert lines[1:] == ["  in task 'pair 3-7'",
                         f"  full log: {tmp_path / 'fed_distance.log'} (or rerun with --verbose)"]


def test_without_an_address_in_the_error_the_worker_that_left_the_scheduler_is_named() -> None:
    lost = _lost(_closed(None), _Scheduler({DEAD, ALIVE}, {ALIVE}))
    assert str(lost).startswith(f"Dask worker {DEAD} of the scheduler at {SCHEDULER} was lost")
    unknown = _lost(_closed(None), _Scheduler({DEAD, ALIVE}, {DEAD, ALIVE}))
    assert str(unknown).startswith(f"a Dask worker of the scheduler at {SCHEDULER} was lost")


def test_a_local_cluster_says_to_lower_the_workers() -> None:
    lost = _lost(_closed(DEAD), _Scheduler({DEAD}, set()), scheduler=None)
    assert str(lost).startswith(f"Dask worker {DEAD} of the stage's local Dask cluster was lost while running its "
                                "tasks (CommClosedError: ")
    assert str(lost).endswith("the usual cause is memory (an out-of-memory kill: `dmesg | grep -i oom`): lower "
                              "run.max_workers, or set run.task_runner: thread")


def test_other_failures_pass_unchanged() -> None:
    error = ValueError("client 3: NaN features")
    with pytest.raises(ValueError) as caught:
        with lost_workers_named(_Scheduler(set(), set()), SCHEDULER):
            raise error
    assert caught.value is error
    assert worker_lost(error, SCHEDULER, set(), set()) is None
    with pytest.raises(ValueError):  # no Dask client: nothing is asked, nothing is changed
        with lost_workers_named(None, None):
            raise error


def _die() -> None:
    os._exit(17)  # as the out-of-memory killer ends a worker process


@pytest.mark.integration
def test_a_worker_killed_under_its_task_is_named() -> None:
    """A real LocalCluster worker process exits under its task: the scheduler gives up on the task
    (``KilledWorker``; no retry allowed here), and the error names the worker the scheduler had listed."""
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                         host="127.0.0.1", silence_logs=50) as cluster, \
            Client(cluster, set_as_default=False) as client:
        before = set(client.scheduler_info(n_workers=-1)["workers"])
        lost = _lost_from(client)
    assert len(before) == 1
    (worker,) = before
    assert str(lost).startswith(f"Dask worker {worker} of the stage's local Dask cluster was lost while running its "
                                "tasks (KilledWorker: the task died with each of the 1 workers that ran it); ")


def _lost_from(client) -> DaskWorkerLost:
    with pytest.raises(DaskWorkerLost) as caught:
        with lost_workers_named(client, None):
            client.submit(_die, pure=False).result()
    assert type(caught.value.__cause__).__name__ == "KilledWorker"
    return caught.value
