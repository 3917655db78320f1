"""flows/runners.py: the task runner of each ``run.task_runner``, the scheduler-address check and which job
arguments go to a Dask cluster once (checked against a real in-process ``distributed`` cluster)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

from flows import runners
from otfed.errors import ConfigError
from stages.params import validate_params
from tests.integration.support import free_port


def test_each_kind_gives_its_prefect_task_runner() -> None:
    thread = runners.task_runner("thread", 3)
    assert isinstance(thread, ThreadPoolTaskRunner) and thread._max_workers == 3
    assert runners.task_runner("sequential", 3)._max_workers == 1
    local = runners.task_runner("dask", 4)
    assert isinstance(local, DaskTaskRunner) and local.address is None
    assert local.cluster_kwargs["n_workers"] == 4 and local.cluster_kwargs["threads_per_worker"] == 1
    assert local.cluster_kwargs["processes"] is True
    remote = runners.task_runner("dask", 4, "tcp://10.0.0.5:8786")
    assert remote.address == "tcp://10.0.0.5:8786" and not remote.cluster_kwargs
    with pytest.raises(ValueError, match="sequential, thread, dask"):
        runners.task_runner("process", 1)


def test_the_progress_line_names_the_runner() -> None:
    assert runners.describe("sequential", 8, None) == "sequential × 1"
    assert runners.describe("thread", 8, None) == "thread × 8"
    assert runners.describe("dask", 8, None) == "dask × 8 (local cluster)"
    assert runners.describe("dask", 8, "tcp://h:1") == "dask at tcp://h:1"


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:8786", "127.0.0.1:8786", "tls://sched.lab.org:8786",
                                     "tcp://[::1]:8786", None])
def test_scheduler_addresses_are_accepted(raw: dict, address) -> None:
    raw["run"].update(task_runner="dask", dask_address=address)
    p = validate_params(raw)
    assert p.run.dask_address == address


@pytest.mark.parametrize("address", ["tcp://127.0.0.1", "http://127.0.0.1:8786", "127.0.0.1:port", "", "a b:1"])
def test_a_malformed_address_names_the_key(config_error, address: str) -> None:
    message = config_error(lambda raw: raw["run"].update(task_runner="dask", dask_address=address))
    assert message.startswith("params.yaml: run.dask_address: ") and "must be a Dask scheduler address" in message


@pytest.mark.slow
def test_an_address_where_nothing_listens_is_a_config_error_naming_it() -> None:
    port = free_port("Dask scheduler")  # closed again: nothing listens there
    with pytest.raises(ConfigError, match=rf"run\.dask_address: no Dask scheduler answers at 'tcp://127.0.0.1:{port}'"):
        runners.check_dask_address(f"tcp://127.0.0.1:{port}", timeout=2)


class _RecordingClient:
    """Stands in for distributed.Client: records what is scattered, returns a token per value."""

    def __init__(self) -> None:
        self.scattered: list[object] = []

    def scatter(self, value: object, hash: bool = True) -> tuple[str, int]:
        assert hash is False  # random keys: no hashing of large arrays
        self.scattered.append(value)
        return ("future", len(self.scattered) - 1)


def test_shared_and_large_arguments_are_scattered_once_small_private_ones_travel_with_their_call() -> None:
    shared = np.zeros(runners.SHARED_BYTES // 8 + 16)  # just above the shared threshold, used twice
    big = np.zeros(runners.SCATTER_BYTES // 8 + 16)  # above the single-use threshold, used once
    small_shared = np.zeros(10)  # used by every call but small: travels with each
    small = np.ones(3)
    calls = [dict(a=shared, b=small_shared, seed=0), dict(a=shared, b=small_shared, c=big, seed=1),
             dict(a=small, b=small_shared, seed=2)]
    client = _RecordingClient()
    moved = runners.scatter_shared(client, calls)
    assert [id(v) for v in client.scattered] == [id(shared), id(big)]  # each once, in first-use order
    assert moved[0]["a"] == moved[1]["a"] == ("future", 0) and moved[1]["c"] == ("future", 1)
    assert all(m["b"] is small_shared for m in moved) and moved[2]["a"] is small
    assert [m["seed"] for m in moved] == [0, 1, 2]
    assert calls[0]["a"] is shared  # the callers' dicts are left as they were


def _sum_all(a: np.ndarray, b: np.ndarray, seed: int) -> float:
    return float(a.sum() + b.sum() + seed)


def test_scattered_arguments_arrive_as_their_values_on_a_real_cluster() -> None:
    """What Dask does with the futures inside the job's keyword arguments (a dict inside the task's
    parameters): the worker sees the arrays themselves, and the results equal the in-process ones."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(0)
    shared = rng.normal(size=runners.SHARED_BYTES // 8 + 16)
    calls = [dict(a=shared, b=rng.normal(size=5), seed=k) for k in range(3)]
    expected = [_sum_all(**c) for c in calls]
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        moved = runners.scatter_shared(client, calls)
        assert sum(1 for m in moved for v in m.values() if type(v).__name__ == "Future") == 3  # one object, 3 refs
        futures = [client.submit(lambda parameters: _sum_all(**parameters["kwargs"]),
                                 parameters={"kwargs": m}, pure=False) for m in moved]
        assert client.gather(futures) == expected


@pytest.mark.parametrize("jobs", [0, 1, 5, 8, 9, 190])
@pytest.mark.parametrize("workers", [1, 2, 16])
def test_batches_deal_every_job_to_exactly_one_task_round_robin(jobs: int, workers: int) -> None:
    groups = runners.batches(jobs, workers, per_worker=4)
    assert len(groups) == min(jobs, 4 * workers)
    assert sorted(k for g in groups for k in g) == list(range(jobs))  # each job once
    for g, group in enumerate(groups):  # job k in group k mod groups, in job order
        assert group == [k for k in range(jobs) if k % len(groups) == g]
    assert max(map(len, groups), default=0) - min(map(len, groups), default=0) <= 1


@pytest.mark.parametrize("counts", [(28, 20, 6, 380, 12), (1,), (3, 3), (1, 9, 2), (0, 5)])
def test_submission_order_spreads_every_kind_evenly_and_keeps_each_kinds_order(counts: tuple[int, ...]) -> None:
    """A permutation; each kind's jobs in their own order; every prefix of the order holds each kind in
    proportion to its share, to within (kinds + 1) / 2 jobs (the i-th of n at fraction (i + ½) / n)."""
    kinds = [kind for kind, n in enumerate(counts) for _ in range(n)]
    order = runners.submission_order(kinds)
    assert sorted(order) == list(range(len(kinds)))
    for kind in set(kinds):
        mine = [k for k in order if kinds[k] == kind]
        assert mine == sorted(mine)
        for length in range(1, len(order) + 1):
            in_prefix = sum(kinds[k] == kind for k in order[:length])
            assert abs(in_prefix - length * counts[kind] / len(kinds)) <= (len(counts) + 1) / 2


def _tag(kind: str, k: int, started: list) -> str:
    started.append(f"{kind}{k}")
    return f"{kind}{k}"


def _other(kind: str, k: int, started: list) -> str:
    return _tag(kind, k, started)


@pytest.mark.integration  # a Prefect flow: Prefect's temporary server starts
def test_fan_out_mixing_kinds_submits_them_interleaved_and_returns_results_in_job_order() -> None:
    """On one thread the tasks run in submission order: with mix_kinds two kinds listed one after the other
    run alternately; the results come back in job order all the same."""
    from prefect import flow

    from flows import stage
    from stages.stage import Job

    started: list[str] = []
    jobs = [Job(f"a {k}", _tag, dict(kind="a", k=k, started=started)) for k in range(3)] + \
           [Job(f"b {k}", _other, dict(kind="b", k=k, started=started)) for k in range(3)]
    results = flow(task_runner=runners.task_runner("thread", 1), validate_parameters=False)(
        lambda: stage.fan_out(jobs, "test", mix_kinds=True))()
    assert results == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert started == ["a0", "b0", "a1", "b1", "a2", "b2"]


def _square(k: int) -> int:
    return k * k


@pytest.mark.slow
def test_fan_out_on_dask_returns_every_result_in_job_order_from_batched_tasks() -> None:
    """11 jobs on a 2-worker cluster go as 8 Prefect tasks (batches of 1–2 jobs); the results come back in
    job order, each job's own, and the progress counts jobs."""
    from distributed import LocalCluster
    from prefect import flow

    from flows import stage
    from stages.stage import Job

    jobs = [Job(f"square {k}", _square, dict(k=k)) for k in range(11)]
    steps: list[str] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(stage.Progress, "step", lambda self, name: steps.append(name))
            results = flow(task_runner=runners.task_runner("dask", 2, cluster.scheduler_address),
                           validate_parameters=False)(lambda: stage.fan_out(jobs, "test"))()
    assert results == [k * k for k in range(11)]
    assert sorted(steps) == sorted(job.name for job in jobs)
    assert len(runners.batches(11, 2)) == 8


@pytest.mark.integration  # a Prefect flow: Prefect's temporary server starts
def test_a_dask_worker_off_the_portable_kernels_is_one_warning_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A ``dask worker`` started by hand without the portable CPU kernels' exports keeps OpenBLAS's own (injected
    here: every worker reports that gap): the stage says so once, on the console, naming the gap and the fix."""
    from distributed import LocalCluster
    from prefect import flow

    from flows import stage
    from stages.stage import Job

    jobs = [Job(f"square {k}", _square, dict(k=k)) for k in range(5)]
    gap = "OpenBLAS runs SkylakeX kernels, not Haswell"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(stage, "kernel_gaps", lambda: [gap])
            results = flow(task_runner=runners.task_runner("dask", 2, cluster.scheduler_address),
                           validate_parameters=False)(lambda: stage.fan_out(jobs, "test"))()
    assert results == [k * k for k in range(5)]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "off the portable CPU kernels" in line]
    assert len(warnings) == 1 and gap in warnings[0] and "python -m otfed.cpu_kernels" in warnings[0], warnings


@pytest.mark.integration
def test_local_cluster_workers_get_the_worker_environ() -> None:
    """A stage's local cluster: every worker process has WORKER_ENVIRON (the mmap threshold that keeps numpy
    arrays off per-call mmap) besides Dask's own MALLOC_TRIM_THRESHOLD_."""
    import os

    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({}):  # configure_worker_environ's change stays inside this test
        runners.configure_worker_environ()
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1") as cluster, Client(cluster, set_as_default=False) as client:
            seen = client.run(lambda: {k: os.environ.get(k) for k in (*runners.WORKER_ENVIRON,
                                                                       "MALLOC_TRIM_THRESHOLD_")})
    (environ,) = seen.values()
    assert environ == {**runners.WORKER_ENVIRON, "MALLOC_TRIM_THRESHOLD_": "65536"}


@pytest.mark.integration
def test_a_stages_local_cluster_listens_on_loopback_only() -> None:
    """The local cluster a stage starts (``run.dask_address: null``, the task runner's own cluster settings):
    every listening socket of the scheduler (this process) and of its worker processes and nannies is on
    127.0.0.1 — read from the sockets (psutil), not from Dask's own report of its addresses."""
    import psutil
    from distributed import LocalCluster

    from tests.flows.test_documented_commands import LOOPBACK, listening

    before = {(ip, port) for ip, port, _, _ in listening(os.getpid())}
    kwargs = runners.task_runner("dask", 2).cluster_kwargs
    with LocalCluster(**kwargs) as cluster:
        assert len(cluster.workers) == 2
        sockets = [s for s in listening(os.getpid()) if (s[0], s[1]) not in before]
        workers = {proc.pid for proc in psutil.Process().children(recursive=True)}
        assert {pid for _, _, pid, _ in sockets} & workers, "no worker process listens: nothing was checked"
    assert sockets and all(ip in LOOPBACK for ip, _, _, _ in sockets), sockets


@pytest.mark.integration
def test_fedbary_on_dask_workers_equals_the_in_process_run() -> None:
    """FedBary with its clients as Dask actors on two worker processes and the server's per-client work as
    Dask tasks: bit-for-bit the in-process result (distances, history, barycenter, every message)."""
    from distributed import Client, LocalCluster

    from otfed.federation.fedbary import FedBaryConfig, federated_valuation
    from otfed.federation.otdd import LabelledData

    rng = np.random.default_rng(0)
    clients = [LabelledData(f"c{i}", rng.normal(i, 1.0, (30 + 4 * i, 3)), np.arange(30 + 4 * i) % 2)
               for i in range(5)]
    config = FedBaryConfig(support_size=8, iterations=3)
    expected = federated_valuation(clients, config, seed=1)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      host="127.0.0.1") as cluster, Client(cluster, set_as_default=False) as client:
        workers = runners.DaskWorkers(client)
        got = federated_valuation(clients, config, seed=1, workers=workers)
        addresses = sorted(cluster.scheduler_info["workers"])
    assert workers.hosted_on == [addresses[i % 2] for i in range(5)]  # the five clients live on both workers
    assert np.array_equal(got.distances, expected.distances) and got.history == expected.history
    assert np.array_equal(got.target.support, expected.target.support)
    assert got.ledger.to_frame().equals(expected.ledger.to_frame())
