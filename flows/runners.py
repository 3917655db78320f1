"""Where a stage's tasks run: ``run.task_runner`` → a Prefect task runner.

* ``sequential`` — one worker thread, jobs in order;
* ``thread`` — ``run.max_workers`` threads of the stage's process (numpy / POT / torch release the GIL in
  their large kernels, so threads scale on one machine where those dominate; see "Kinds mixed on threads");
* ``dask`` — a Dask ``distributed`` cluster through ``prefect-dask``: with ``run.dask_address: null`` a
  local cluster of ``run.max_workers`` single-threaded worker *processes* is started for the stage and
  shut down after it; with an address (``tcp://host:8786``) the stage uses that running scheduler and its
  workers, on this machine or others.

**What a Dask task receives.** A job's arguments are pickled and sent to the worker that runs it. Large
arguments shared by several jobs — the clients of a federation that every client pair reads — are
scattered to the cluster *once* (:func:`scatter_shared`) and the jobs carry only a reference: the 190
pairs of a 20-client federation move each client's samples to a worker at most once, not 19 times.

**Batches.** A Dask task — a Prefect task run on a worker process — costs ~0.1–0.25 s of scheduling and
Prefect API calls, more than many jobs' own work (a client pair's FedWaD session: ~60 ms). On a Dask cluster
a stage's jobs therefore go as about :data:`TASKS_PER_WORKER` tasks per worker (:func:`batches`, jobs dealt
round-robin); on threads each job stays its own task. ``python -m bench.scale_out`` measures both.

**Kinds mixed on threads.** Threads share one interpreter lock: jobs made of many small numpy / POT / torch
calls (a client pair's FedWaD session, a coreset run, an FL run) hold it most of the time and cannot overlap
one another, while large network-simplex or BLAS calls (the toy study's n = 5,000 problems, the OTDD pairs at
S = 1,000) run without it. A stage lists its jobs kind by kind; on ``thread`` they are *submitted* with every
kind spread evenly over the queue (:func:`submission_order`), so that lock-bound jobs run beside lock-free
ones; results still come back in job order.

**Parties on workers.** :class:`DaskWorkers` is :class:`otfed.federation.parties.Workers` on a Dask
cluster, for one protocol run spread over workers (``fedbary(..., workers=DaskWorkers(client))``): the
clients become Dask actors, the server's per-client computations Dask tasks (``bench/fedbary_scale_out.py``).

**Remote workers** need the same code and data at the same paths as the machine that starts the stage
(run them from a checkout of the same commit, with ``data/`` in place — e.g. a shared file system), and a
Prefect API they can reach. A stage's tasks carry its Prefect settings to the workers, so workers on this
machine report to the project's Prefect server (:mod:`flows.prefect_server`) instead of starting one each;
that server listens on 127.0.0.1 only, so for workers on other hosts start a real server and export
``PREFECT_API_URL`` (README, "Scaling out").

**A lost worker.** A worker killed under a task (the out-of-memory killer, ``kill -9``, a crash) surfaces as
distributed's ``KilledWorker`` or a bare ``CommClosedError … Stream is closed``; :func:`lost_workers_named` turns
either into one :class:`DaskWorkerLost` line naming the worker (from the error, else the worker that left the
scheduler) and what to do: its log and memory, restarting it, or the ``thread`` runner.

**One BLAS thread per task.** Dask worker processes start with one BLAS / OpenMP thread each
(``distributed``'s default ``OMP_NUM_THREADS=1``), and a stage's own process runs its numpy BLAS with one
thread too (:func:`one_blas_thread`, around the whole stage), as its torch code on CPU does
(:func:`otfed.device.stage_device`): every task uses one core, and a stage gives the same numbers on every
runner. With BLAS's default (a thread per core) two task threads each called a threaded OpenBLAS on two
cores, and the ``fed_distance`` stage's jobs ran *slower* on two threads than on one (84 s vs 59 s for its
386 clustering, coreset and OTDD jobs); with one BLAS thread per task two threads took 46 s
(``python -m bench.blas_threads``, reports/bench/blas_threads.md).
"""
from __future__ import annotations

import pickle
import re
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from otfed.errors import ConfigError

RUNNERS = ("sequential", "thread", "dask")

# an argument is scattered once when it pickles to at least SHARED_BYTES and several jobs use it, or to at
# least SCATTER_BYTES (then even a single job's argument goes to the cluster ahead of the job)
SHARED_BYTES = 64 << 10
SCATTER_BYTES = 1 << 20
# a Dask task (a Prefect task run on a worker process) costs ~0.1–0.25 s of scheduling and API calls, more
# than one client pair's FedWaD session: a stage's jobs go to the cluster as about this many tasks per worker
TASKS_PER_WORKER = 4
# Environment of Dask worker processes: ``distributed`` sets MALLOC_TRIM_THRESHOLD_=65536 for them, and setting
# any malloc threshold turns off glibc's dynamic mmap threshold, so every array over 128 KiB is mmap'd and
# page-faulted afresh: a FedWaD pair session runs ~2× slower (`python -m bench.worker_environ`). A fixed
# 32 MiB mmap threshold gives back in-process speed and keeps Dask's memory trimming. Started by a stage
# (local cluster) it is set here; for `dask worker` see the README.
WORKER_ENVIRON = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
# Dask's configuration variables that give a stage's process (a Dask client) the cluster's CA and its own
# certificate and key for a ``tls://`` scheduler
TLS_VARIABLES = ("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
                 "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY")


def task_runner(kind: str, max_workers: int, dask_address: str | None = None) -> Any:
    """The Prefect task runner for ``run.task_runner`` (module docstring)."""
    from prefect.task_runners import ThreadPoolTaskRunner

    if kind == "thread":
        return ThreadPoolTaskRunner(max_workers=max_workers)
    if kind == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        configure_worker_environ()
        return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=dict(
            n_workers=max_workers, threads_per_worker=1, processes=True, dashboard_address=None,
            host="127.0.0.1", silence_logs=50))
    raise ValueError(f"run.task_runner must be one of {', '.join(RUNNERS)} (got {kind!r})")


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with numpy's BLAS (OpenBLAS / MKL, through ``threadpoolctl``) on one thread, then restore
    it (module docstring: one core per task, the same numbers on every runner). The limit is process-wide:
    it covers every task thread the block starts."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def configure_worker_environ() -> None:
    """Worker processes that this process's Dask ``LocalCluster`` starts from now on get
    :data:`WORKER_ENVIRON` (dask config ``distributed.nanny.pre-spawn-environ``)."""
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    dask.config.set({"distributed.nanny.pre-spawn-environ": {**environ, **WORKER_ENVIRON}})


def dask_client(runner: Any) -> Any:
    """The ``distributed.Client`` of a started Dask task runner; None for any other runner."""
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        return None
    return runner.client if isinstance(runner, DaskTaskRunner) else None


def dask_workers(client: Any) -> int:
    """How many tasks the cluster behind ``client`` runs at once (its workers' threads; at least 1)."""
    workers = client.scheduler_info(n_workers=-1).get("workers", {})
    return max(1, sum(int(w.get("nthreads", 1)) for w in workers.values()))


def submission_order(kinds: list[Any]) -> list[int]:
    """The order to submit jobs in, given each job's kind (e.g. its task function): every kind's jobs spread
    evenly over the sequence (the i-th of a kind's n jobs at fraction (i + ½) / n; ties: the kind listed
    first), each kind's jobs in their own order. A permutation of ``range(len(kinds))``."""
    count: dict[Any, int] = {}
    for kind in kinds:
        count[kind] = count.get(kind, 0) + 1
    first = {kind: k for k, kind in reversed(list(enumerate(kinds)))}
    seen: dict[Any, int] = {}
    keys = []
    for k, kind in enumerate(kinds):
        i = seen.get(kind, 0)
        seen[kind] = i + 1
        keys.append(((2 * i + 1) / (2 * count[kind]), first[kind], k))
    return [k for *_, k in sorted(keys)]


def batches(jobs: int, workers: int, per_worker: int | None = None) -> list[list[int]]:
    """The job indices of each Dask task: ``min(jobs, per_worker · workers)`` groups (``per_worker``:
    :data:`TASKS_PER_WORKER`), dealt round-robin (job k goes to group k mod groups), so that groups mixing
    cheap and costly jobs — a stage lists them kind by kind — take about equally long. Every job is in
    exactly one group; each group is in job order."""
    if jobs == 0:
        return []
    per_worker = TASKS_PER_WORKER if per_worker is None else per_worker
    count = min(jobs, max(1, per_worker * workers))
    return [list(range(g, jobs, count)) for g in range(count)]


def describe(kind: str, max_workers: int, dask_address: str | None) -> str:
    """``sequential × 1``, ``thread × 4``, ``dask × 4 (local cluster)``, ``dask at tcp://host:8786``."""
    if kind == "sequential":
        return "sequential × 1"
    if kind == "dask":
        return f"dask at {dask_address}" if dask_address else f"dask × {max_workers} (local cluster)"
    return f"{kind} × {max_workers}"


def check_dask_address(address: str, timeout: float = 10.0) -> int:
    """Connect to the Dask scheduler at ``address``; the number of workers it has.

    Raises ConfigError (naming ``run.dask_address``) when nothing answers there within ``timeout`` seconds,
    when a ``tls://`` scheduler cannot be reached with this machine's TLS settings (naming the variables that
    give Dask the CA and the client certificate), or when the scheduler has no worker (the stage's tasks would
    wait forever)."""
    from distributed import Client

    key = "params.yaml: run.dask_address"
    tls_hint = (f"give this machine the cluster's CA and a client certificate: {', '.join(TLS_VARIABLES)} "
                "(README, \"Scaling out\")")
    if address.startswith("tls://"):
        from distributed.security import Security

        if Security().get_connection_args("client").get("ssl_context") is None:  # nothing to connect with
            raise ConfigError(f"{key}: cannot connect to {address!r} over TLS: Dask has no TLS settings here; "
                              + tls_hint)
    try:
        with Client(address, timeout=timeout, set_as_default=False) as client:
            workers = len(client.scheduler_info(n_workers=-1).get("workers", {}))
    except (OSError, TimeoutError, TypeError, ValueError) as exc:
        if address.startswith("tls://"):  # e.g. a certificate the scheduler refuses
            raise ConfigError(f"{key}: cannot connect to {address!r} over TLS ({type(exc).__name__}: {exc}); "
                              + tls_hint) from None
        if not isinstance(exc, (OSError, TimeoutError)):
            raise
        raise ConfigError(f"{key}: no Dask scheduler answers at {address!r} within {timeout:g} s "
                          f"({type(exc).__name__}: {exc}); start one (`dask scheduler`) or set "
                          "run.dask_address: null for a local cluster") from None
    if workers == 0:
        raise ConfigError(f"{key}: the Dask scheduler at {address!r} has no workers; start some "
                          f"(`dask worker {address}`)")
    return workers


class DaskWorkerLost(RuntimeError):
    """A Dask worker died (killed, out of memory, crashed) or dropped its connection while it ran the stage's
    tasks; the message names the worker and what to do (:func:`worker_lost`)."""


# what distributed raises when a worker dies under a task or its connection closes (by class name: tornado's
# StreamClosedError need not be importable, and a KilledWorker may come back from the scheduler re-created)
WORKER_FAILURES = frozenset({"KilledWorker", "CommClosedError", "FatalCommClosedError", "StreamClosedError"})


def worker_addresses(client: Any) -> set[str] | None:
    """The addresses of the workers the scheduler behind ``client`` has now; None when it cannot be asked (its
    connection may be what failed)."""
    try:
        return set(client.scheduler_info(n_workers=-1).get("workers", {}))
    except Exception:  # a closed comm, a timeout: nothing to learn from the scheduler
        return None


def worker_failure(exc: BaseException) -> BaseException | None:
    """The worker failure behind ``exc`` — itself or an exception it was raised from (``__cause__`` /
    ``__context__``) of a :data:`WORKER_FAILURES` class, or the ``OSError`` of an actor whose worker is gone —
    else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in WORKER_FAILURES or (
                isinstance(current, OSError) and "Actor's worker" in str(current)):
            return current
        current = current.__cause__ or current.__context__
    return None


def worker_lost(exc: BaseException, scheduler: str | None, before: set[str] | None,
                after: set[str] | None) -> DaskWorkerLost | None:
    """The one-line error of a stage whose Dask worker was lost, or None when ``exc`` is no worker failure
    (:func:`worker_failure`). The worker is named by the failure itself (a KilledWorker's last worker, the
    ``remote=`` end of a closed connection), else by the workers the scheduler had when the stage's tasks went
    out (``before``) and has no more (``after``; either None: the scheduler could not be asked).
    ``scheduler``: ``run.dask_address`` (None: the stage's own local cluster), for what to do."""
    failure = worker_failure(exc)
    if failure is None:
        return None
    killed = type(failure).__name__ == "KilledWorker"
    # "The last worker that attempt to run the task was tcp://…" / "<TCP (closed) … remote=tcp://…>"
    named = re.findall(r"(?:remote=|task was )([a-z]+://[\w.\-\[\]:]*:\d+)", str(failure))
    gone = sorted(before - after) if before is not None and after is not None else []
    named = [a for a in dict.fromkeys(named) if a != scheduler] or gone
    who = (f"Dask worker {named[0]}" if len(named) == 1 else f"Dask workers {', '.join(named)}" if named
           else "a Dask worker")
    if killed and isinstance(getattr(failure, "allowed_failures", None), int):
        what = f"KilledWorker: the task died with each of the {failure.allowed_failures + 1} workers that ran it"
    elif killed:
        what = "KilledWorker: the task died with every worker that ran it"
    else:
        what = f"{type(failure).__name__}: {' '.join(str(failure).split())[:160]}"
    if scheduler:
        return DaskWorkerLost(f"{who} of the scheduler at {scheduler} was lost while running this stage's tasks "
                              f"({what}); see that worker's log and memory (an out-of-memory kill: `dmesg | grep -i "
                              f"oom` on its host), restart it (`dask worker {scheduler} …`, docs/scaling.md) and run "
                              "the stage again, or set run.task_runner: thread to run on this machine alone")
    return DaskWorkerLost(f"{who} of the stage's local Dask cluster was lost while running its tasks ({what}); "
                          "the usual cause is memory (an out-of-memory kill: `dmesg | grep -i oom`): lower "
                          "run.max_workers, or set run.task_runner: thread")


@contextmanager
def lost_workers_named(client: Any, scheduler: str | None) -> Iterator[None]:
    """Run the block; a worker failure raised in it (:func:`worker_failure`) becomes :func:`worker_lost`'s
    :class:`DaskWorkerLost`, raised from it and keeping its notes (the task it came from). Nothing to do without
    a Dask ``client``."""
    if client is None:
        yield
        return
    before = worker_addresses(client)
    try:
        yield
    except Exception as exc:
        lost = worker_lost(exc, scheduler, before, worker_addresses(client))
        if lost is None:
            raise
        for note in getattr(exc, "__notes__", []):
            lost.add_note(note)
        raise lost from exc


def scatter_shared(client: Any, calls: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The keyword arguments of each call with every large or shared value replaced by a Dask future.

    A value (by identity) used by two or more calls and pickling to at least :data:`SHARED_BYTES`, or any
    value pickling to at least :data:`SCATTER_BYTES`, is sent to the cluster once (``client.scatter``); Dask resolves the futures back into the values on the
    worker before the call runs. Small values private to one call travel with it as before."""
    uses: dict[int, int] = {}
    for kwargs in calls:
        for value in kwargs.values():
            uses[id(value)] = uses.get(id(value), 0) + 1
    shipped: dict[int, Any] = {}  # id → its future, or None: travels with its call
    out = []
    for kwargs in calls:
        moved = {}
        for key, value in kwargs.items():
            if id(value) not in shipped:
                shipped[id(value)] = client.scatter(value, hash=False) \
                    if _worth_scattering(value, uses[id(value)]) else None
            moved[key] = value if shipped[id(value)] is None else shipped[id(value)]
        out.append(moved)
    return out


def _worth_scattering(value: Any, uses: int) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return False
    try:
        size = len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # not picklable with pickle (cloudpickle may still manage): leave it in the call
        return False
    return size >= (SHARED_BYTES if uses >= 2 else SCATTER_BYTES)


class DaskWorkers:
    """:class:`otfed.federation.parties.Workers` on a Dask cluster: each hosted party is a Dask *actor*
    on a worker (parties dealt round-robin over the workers; its data and state stay there, and only the
    return values of its methods — the messages — come back), and the server's per-client computations
    are Dask tasks, with a value shared by many calls (the server's target Q) scattered once per map.
    Results come back in call order. The workers must import the same ``otfed`` (same checkout)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.hosted_on: list[str] = []  # after host(): the address of the worker each party lives on

    def map(self, fn: Any, calls: list[Mapping[str, Any]]) -> list[Any]:
        moved = scatter_shared(self.client, calls)
        return self.client.gather([self.client.submit(_apply, fn, kwargs, pure=False) for kwargs in moved])

    def host(self, parties: list[Any]) -> "_DaskHosted":
        workers = sorted(self.client.scheduler_info(n_workers=-1)["workers"])
        if not workers:
            raise RuntimeError("the Dask cluster has no workers to host the parties")
        futures = [self.client.submit(_Hosted, party, actor=True, workers=[workers[i % len(workers)]], pure=False)
                   for i, party in enumerate(parties)]
        hosted = _DaskHosted(self.client, futures, window=2 * len(workers))
        where = self.client.who_has(futures)
        self.hosted_on = [where[future.key][0] for future in futures]  # the worker of each party, as placed
        return hosted


def _apply(fn: Any, kwargs: Mapping[str, Any]) -> Any:
    return fn(**kwargs)


class _Hosted:
    """The Dask actor around one party object."""

    def __init__(self, party: Any) -> None:
        self.party = party

    def call(self, method: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        return getattr(self.party, method)(*args, **kwargs)


class _DaskHosted:
    def __init__(self, client: Any, futures: list[Any], window: int) -> None:
        # the futures that created the actors are kept: an actor lives as long as its key is referenced, and
        # an actor handle made without a default client holds no reference of its own
        self._client, self._futures, self._window = client, futures, max(1, window)
        self._actors = [future.result() for future in futures]

    def call(self, method: str, args: Any = None, **kwargs: Any) -> list[Any]:
        args = [()] * len(self._actors) if args is None else list(args)
        if len(args) != len(self._actors):
            raise ValueError(f"{method}: {len(args)} argument tuples for {len(self._actors)} parties")
        calls = list(zip(self._actors, args))
        results: list[Any] = []
        # at most `window` calls in flight: a worker runs its actors' calls one at a time anyway
        with self._client.as_current():  # an actor handle reaches its worker through the current client
            pending = [actor.call(method, tuple(a), kwargs) for actor, a in calls[:self._window]]
            for k in range(len(calls)):
                results.append(pending[k].result())
                if k + self._window < len(calls):
                    actor, a = calls[k + self._window]
                    pending.append(actor.call(method, tuple(a), kwargs))
        return results
