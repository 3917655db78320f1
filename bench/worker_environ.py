"""Benchmark: one FedWaD client-pair session under the malloc settings of a Dask worker process.

``distributed`` starts its worker processes with ``MALLOC_TRIM_THRESHOLD_=65536``; setting any glibc malloc
threshold turns off the dynamic mmap threshold, so every array over 128 KiB is mmap'd and page-faulted
afresh. This times the same session (the first pair of ``pairs_strong``, S and K of params.yaml's
clustering FedWaD) ``--repeats`` times in three fresh processes, one BLAS thread each, side by side:

* ``default`` — this machine's malloc (a stage's process, the sequential and thread runners);
* ``dask worker`` — MALLOC_TRIM_THRESHOLD_=65536, as ``distributed`` sets it;
* ``dask worker + otfed`` — that plus :data:`flows.runners.WORKER_ENVIRON` (what otfed's local clusters
  get, and what the README tells ``dask worker`` to get).

    python -m bench.worker_environ
Results: reports/bench/worker_environ.{csv,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from bench.scale_out import invocation, write_report
CHILD = """
import json, sys, time
from threadpoolctl import threadpool_limits
from bench.scale_out import pair_jobs
job = pair_jobs(sys.argv[1], sys.argv[2], 1)[0]
job()  # imports and first-call costs out of the timing
with threadpool_limits(limits=1):
    times = []
    for _ in range(int(sys.argv[3])):
        start = time.perf_counter(); job(); times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def timed(environ: dict[str, str], federation: str, params: str, repeats: int) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-c", CHILD, federation, params, str(repeats)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from flows.runners import WORKER_ENVIRON

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--federation", default="pairs_strong")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if not (Path("data/partitions") / f"{args.federation}.npz").exists():
        raise SystemExit(f"error: data/partitions/{args.federation}.npz is missing: run `dvc repro partition`")
    dask_default = {"MALLOC_TRIM_THRESHOLD_": "65536"}
    settings = [("default", {}), ("dask worker", dask_default),
                ("dask worker + otfed", {**dask_default, **WORKER_ENVIRON})]
    rows = []
    for label, environ in settings:
        times = timed(environ, args.federation, args.params, args.repeats)
        rows.append(dict(process=label, environ=" ".join(f"{k}={v}" for k, v in environ.items()) or "-",
                         repeats=len(times), median_ms=1000 * float(pd.Series(times).median()),
                         min_ms=1000 * min(times)))
        print(f"[worker_environ] {label}: median {rows[-1]['median_ms']:.1f} ms", flush=True)
    table = pd.DataFrame(rows)
    table["vs_default"] = table.median_ms / table.median_ms.iloc[0]
    write_report(table, "worker_environ", f"One FedWaD pair session per malloc setting "
                 f"(`{invocation('bench.worker_environ', argv)}`), one BLAS thread.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
