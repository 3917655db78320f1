"""Benchmark: the clustering stage's pairwise FedWaD fan-out on each task runner (issue #12, "Scaling out").

Setting: the ``fed_distance`` stage's clustering jobs for one federation, exactly as the stage builds them —
the 20 clients of ``pairs_strong`` (``data/partitions``, written by ``dvc repro partition``), 190 client
pairs, one federated-OTDD FedWaD session each (``fed_distance.clustering.fedwad`` of params.yaml: S = 10,
K = 10) — run through the stage runner's own ``fan_out`` inside a Prefect flow with

* ``sequential`` (one worker thread), ``thread`` × N and ``dask`` × N, twice: a local cluster of N
  single-threaded worker processes started by the task runner as a stage with ``run.dask_address: null``
  does (its start-up and the workers' first imports are part of the time), and a cluster of the same shape
  already running whose workers have run a Prefect task before (``run.dask_address``: what a sweep of
  stages shares) — and on that cluster once more with one Dask task per job instead of the runner's
  batches (``flows.runners.batches``: about ``TASKS_PER_WORKER`` tasks per worker), to show what batching
  saves; the Dask clusters' workers get ``flows.runners.WORKER_ENVIRON`` as a stage's do;
* ``bare``: the same jobs in a plain Python loop, no Prefect at all (what the Prefect task bookkeeping costs).

All runs happen side by side in one process, one after the other, each ``--repeats`` times (the fastest
counts); BLAS is limited to one thread in this process (as in the Dask workers), so every runner uses one
core per task. Reported: wall time, speed-up over ``sequential``, parallel efficiency (speed-up / N) and the
Prefect overhead per job ((sequential − bare) / jobs). Goal: ``dask`` on N cores ≥ 0.7·N × ``sequential``.
The machine is shared: its 1-minute load average before each run is recorded.

    python -m bench.scale_out                    # N = the machine's cores
    python -m bench.scale_out --workers 16       # e.g. on a 16-core worker
    python -m bench.scale_out --pairs 40         # a quick look (the first 40 pairs)
Results: reports/bench/<name>.{csv,md} (name: scale_out).

FedBary with 100 clients, its clients spread over workers: ``bench/fedbary_scale_out.py``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from otfed import io
from stages.stage import Job

OUT = Path("reports/bench")
ONE_TASK_PER_JOB = "dask, running cluster, one task per job (no batching)"
GOAL_EFFICIENCY = 0.7


def pair_jobs(federation: str, params_path: str, pairs: int | None) -> list[Job]:
    """The stage's clustering jobs for ``federation`` (stages.fed_distance.jobs builds them the same way)."""
    from otfed.federation.otdd import federated_otdd, pairwise_sessions
    from stages.fed_distance import roster
    from stages.params import load_params

    p = load_params(params_path, stage="fed_distance")
    cfg = p.fed_distance.clustering
    clients = roster(federation, cfg.diagonal).clients
    sessions = pairwise_sessions(clients, cfg.fedwad, p.run.seed, cfg.diagonal)[:pairs]
    return [Job(f"clustering {federation} {kw['a'].name}|{kw['b'].name}", federated_otdd, kw) for kw in sessions]


def timed_run(runner: str, workers: int, jobs: Callable[[], list[Job]], address: str | None = None
              ) -> tuple[float, list[float]]:
    """Wall time of building and running the jobs on ``runner`` (inside a Prefect flow, through
    flows.stage.fan_out; ``bare``: a loop) and their estimates; ``address``: a running Dask scheduler.

    The jobs are built inside the flow, as a stage builds them: Prefect sends the flow (its function and
    whatever that function closes over) to every Dask task in its serialized context, so a flow closing
    over the jobs themselves would ship all clients' data with every task (20 clients, ~20 MB per task)."""
    from prefect import flow

    from flows.runners import task_runner
    from flows.stage import fan_out

    start = time.perf_counter()
    if runner == "bare":
        results = [job() for job in jobs()]
    else:
        def body() -> list:
            return fan_out(jobs(), label=f"scale_out {runner}")

        results = flow(name=f"scale-out-{runner}", task_runner=task_runner(runner, workers, address),
                       validate_parameters=False)(body)()
    return time.perf_counter() - start, [float(r.estimate) for r in results]


def _warm_up() -> None:
    """Start Prefect's temporary server before any timing (every later flow of this process reuses it)."""
    from prefect import flow

    flow(name="scale-out-warm-up")(lambda: None)()


def running_cluster(workers: int):
    """A local Dask cluster of ``workers`` single-threaded processes, started (and its workers' imports of
    the pipeline done) before the timing: a cluster that outlives stages, as with ``run.dask_address``."""
    from distributed import Client, LocalCluster

    from prefect import flow

    from flows.runners import configure_worker_environ, task_runner
    from flows.stage import fan_out

    configure_worker_environ()  # as a stage's local cluster, and as the README starts `dask worker`
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                           host="127.0.0.1", silence_logs=50)
    with Client(cluster, set_as_default=False) as client:
        client.run(lambda: __import__("flows.stage") and __import__("otfed.federation.otdd"))
    warm = [Job(f"warm-up {k}", _nothing) for k in range(4 * workers)]  # every worker runs a Prefect task
    flow(name="scale-out-warm-up-dask", task_runner=task_runner("dask", workers, cluster.scheduler_address),
         validate_parameters=False)(lambda: fan_out(warm, label="scale_out warm-up"))()
    return cluster


def _nothing() -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="N: threads / Dask workers")
    parser.add_argument("--federation", default="pairs_strong")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--pairs", type=int, default=None, help="only the first PAIRS pairs (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--name", default="scale_out")
    args = parser.parse_args(argv)

    from threadpoolctl import threadpool_limits

    from flows import runners

    from flows.stage import configure_prefect_environment

    configure_prefect_environment()
    if not (Path("data/partitions") / f"{args.federation}.npz").exists():
        raise SystemExit(f"error: data/partitions/{args.federation}.npz is missing: run `dvc repro partition`")
    jobs = partial(pair_jobs, args.federation, args.params, args.pairs)  # built inside each timed run
    tasks = len(jobs())
    rows, reference = [], None
    per_worker = runners.TASKS_PER_WORKER
    _warm_up()
    cluster = running_cluster(args.workers)
    settings = [("bare", "bare", 1, None), ("sequential", "sequential", 1, None),
                ("thread", "thread", args.workers, None),
                ("dask, local cluster started by the stage", "dask", args.workers, None),
                ("dask, running cluster (run.dask_address)", "dask", args.workers, cluster.scheduler_address),
                (ONE_TASK_PER_JOB, "dask", args.workers, cluster.scheduler_address)]
    try:
        with threadpool_limits(limits=1, user_api="blas"):
            for label, runner, n, address in settings:
                best = float("inf")
                runners.TASKS_PER_WORKER = len(jobs()) if label == ONE_TASK_PER_JOB else per_worker
                for _ in range(args.repeats):
                    load = os.getloadavg()[0]
                    seconds, estimates = timed_run(runner, n, jobs, address)
                    print(f"[scale_out] {label} × {n}: {seconds:.1f} s (load {load:.2f})", flush=True)
                    reference = estimates if reference is None else reference
                    if not np.array_equal(estimates, reference):
                        raise SystemExit(f"error: {label} gave other estimates than bare: runners must agree")
                    best = min(best, seconds)
                rows.append(dict(runner=label, workers=n, jobs=tasks, seconds=best, load_1min=load,
                                 dask_tasks=len(runners.batches(tasks, n)) if runner == "dask" else pd.NA))
    finally:
        runners.TASKS_PER_WORKER = per_worker
        cluster.close()
    table = with_speedups(pd.DataFrame(rows))
    seq = float(table.loc[table.runner == "sequential", "seconds"].iloc[0])
    bare = float(table.loc[table.runner == "bare", "seconds"].iloc[0])
    table["goal_met"] = np.where(table.runner.str.startswith("dask"), table.efficiency >= GOAL_EFFICIENCY, pd.NA)
    write_report(table, args.name, f"Pairwise FedWaD fan-out: {tasks} pairs of federation {args.federation!r} "
                 f"(`{invocation('bench.scale_out', argv)}`, {os.cpu_count()} cores). Prefect overhead "
                 f"per job (sequential − bare) / jobs: {(seq - bare) / tasks * 1000:.0f} ms. Goal: dask "
                 f"efficiency ≥ {GOAL_EFFICIENCY}.")
    return 0


def with_speedups(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per runner: runner, workers, seconds) with the speed-up over its ``sequential`` row
    and the parallel efficiency (speed-up / workers)."""
    seq = float(table.loc[table.runner == "sequential", "seconds"].iloc[0])
    speedup = seq / table.seconds
    return table.assign(speedup_vs_sequential=speedup, efficiency=speedup / table.workers)


def write_report(table: pd.DataFrame, name: str, header: str) -> None:
    """reports/bench/<name>.csv (the table) and <name>.md (``header`` and the table to 3 decimals); the
    markdown table also goes to stdout."""
    OUT.mkdir(parents=True, exist_ok=True)
    io.write_csv(table, OUT / f"{name}.csv")
    markdown = io.markdown_table(table.round(3))
    io.write_text(f"{header}\n\n{markdown}", OUT / f"{name}.md")
    print(markdown)


def invocation(module: str, argv: list[str] | None) -> str:
    """The command line that ran this benchmark, for its report."""
    return " ".join([f"python -m {module}", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
