"""Benchmark: BLAS threads × task threads on the ``fed_distance`` stage's own jobs (why a stage runs BLAS on one
thread: ``flows.runners.one_blas_thread``).

Setting: jobs built exactly as the stage builds them (``stages.fed_distance.jobs`` on params.yaml and
``data/partitions``) — by default all of its client-pair clustering sessions, its first 4 coreset runs and its
first 2 federated-OTDD pairs (``--kinds`` / ``--limit`` change the selection) — run in a plain thread pool (no
Prefect: ``bench.scale_out`` measures that) with

* 1 task thread and BLAS at its default (a thread per core) — what ``run.task_runner: sequential`` did;
* N task threads and BLAS at its default — what ``run.task_runner: thread`` did before;
* 1 task thread and BLAS on one thread;
* N task threads and BLAS on one thread — what every runner does now.

All four run side by side in one process, one after the other, each ``--repeats`` times (the fastest counts);
the results of every setting must equal those of the first (to 1e-9 relative: BLAS threads change the
summation order) or the bench fails. The machine is shared: its 1-minute load average before each run is
recorded. Reported: wall time and the speed-up over the first setting.

    python -m bench.blas_threads               # N = the machine's cores
    python -m bench.blas_threads --kinds clustering --limit 0
Results: reports/bench/blas_threads.{csv,md}.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.scale_out import invocation, write_report


def stage_jobs(params: str, kinds: list[str], limits: dict[str, int], out: Path) -> list[Any]:
    """The fed_distance stage's jobs of the given kinds (its first word of the job name), the first
    ``limits[kind]`` of each (0 or absent: all), in the stage's order."""
    from stages import fed_distance
    from stages.params import load_params

    p = load_params(params, stage="fed_distance")
    dirs = {folder: out / folder for folder in fed_distance.OUTPUTS}
    for folder in dirs.values():
        folder.mkdir(parents=True, exist_ok=True)
    jobs = fed_distance.jobs(p, dirs)
    chosen = []
    for kind in kinds:
        of_kind = [job for job in jobs if job.name.split(" ")[0] == kind]
        chosen += of_kind[:limits.get(kind) or None]
    return chosen


def numbers(result: Any) -> list[float]:
    """Every float of a job's result (rows, arrays, dataclasses), flattened: what two settings must agree on."""
    if isinstance(result, (float, np.floating)):
        return [float(result)]
    if isinstance(result, np.ndarray) and result.dtype.kind == "f":
        return result.ravel().tolist()
    if isinstance(result, pd.DataFrame):
        return numbers(result.select_dtypes("number").to_numpy(dtype=float))
    if isinstance(result, dict):
        return [x for key in sorted(result, key=str) if "seconds" not in str(key) for x in numbers(result[key])]
    if isinstance(result, (list, tuple)):
        return [x for item in result for x in numbers(item)]
    if hasattr(result, "__dict__"):
        return numbers({k: v for k, v in vars(result).items() if not k.startswith("_")})
    return []


def timed(jobs: list[Any], threads: int, blas_one: bool) -> tuple[float, list[float]]:
    from threadpoolctl import threadpool_limits

    start = time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas") if blas_one else nullcontext():
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(lambda job: job(), jobs))
    return time.perf_counter() - start, numbers(results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="N: task threads")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--kinds", nargs="+", default=["clustering", "coresets", "otdd"])
    parser.add_argument("--limit", nargs="+", default=["coresets=4", "otdd=2"],
                        help="KIND=COUNT: only the first COUNT jobs of KIND (0: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--name", default="blas_threads")
    args = parser.parse_args(argv)
    limits = {kind: int(count) for kind, count in (item.split("=") for item in args.limit if "=" in item)}
    if not Path("data/partitions").is_dir():
        raise SystemExit("error: data/partitions is missing: run `dvc repro partition`")

    from threadpoolctl import threadpool_info

    blas_default = max((pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"), default=1)
    with tempfile.TemporaryDirectory() as scratch:
        jobs = stage_jobs(args.params, args.kinds, limits, Path(scratch))
        settings = [(1, False), (args.workers, False), (1, True), (args.workers, True)]
        rows, reference = [], None
        for threads, blas_one in settings:
            best = float("inf")
            for _ in range(args.repeats):
                load = os.getloadavg()[0]
                seconds, values = timed(jobs, threads, blas_one)
                blas = 1 if blas_one else blas_default
                print(f"[blas_threads] {threads} task thread(s), BLAS × {blas}: {seconds:.1f} s (load {load:.2f})",
                      flush=True)
                reference = values if reference is None else reference
                if len(values) != len(reference) or not np.allclose(values, reference, rtol=1e-9, atol=1e-12,
                                                                    equal_nan=True):
                    raise SystemExit(f"error: {threads} threads with BLAS × {blas} gave other numbers")
                best = min(best, seconds)
            rows.append(dict(task_threads=threads, blas_threads=1 if blas_one else blas_default, jobs=len(jobs),
                             seconds=best, load_1min=load))
    table = pd.DataFrame(rows)
    table["speedup"] = float(table.seconds.iloc[0]) / table.seconds
    kinds = ", ".join(f"{kind} (first {limits[kind]})" if limits.get(kind) else f"{kind} (all)" for kind in args.kinds)
    write_report(table, args.name, f"fed_distance jobs ({kinds}: {len(jobs)} jobs) on task threads × BLAS threads "
                 f"(`{invocation('bench.blas_threads', argv)}`, {os.cpu_count()} cores). Speed-up over 1 task "
                 "thread with BLAS at its default.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
