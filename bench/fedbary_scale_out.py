"""Benchmark: one FedBary run with 100 clients on each way of running its parties (issue #12, "Scaling out").

Setting (issue #12's bench): N = 100 clients × 500 samples, barycenter support S = 500, K = 10 iterations,
Q = the federated barycenter (no validation set: the server also computes N barycentric maps per round);
clients drawn as in ``bench/fedbary_scaling.py`` (500 rows each, without replacement, from the 5,000
embedded FashionMNIST training rows, independently per client; PCA-32 fitted on the test split,
label-augmented client-side to 96-D). FedBary (``otfed.federation.fedbary.fedbary``) runs with

* ``sequential`` — :class:`otfed.federation.parties.InProcess` (clients and the server's per-client work in
  order, one process);
* ``thread`` — ``InProcess(max_workers=N)``;
* ``dask`` — :class:`flows.runners.DaskWorkers` on a local cluster of N single-threaded worker processes
  started beforehand (its start-up is reported apart): the clients are Dask actors spread over the
  workers, the server's per-client computations Dask tasks.

BLAS is limited to one thread everywhere. Every runner must give bit-for-bit the same distances (checked).
Goal of the 190-pair bench applies here too as a yardstick: dask on N cores ≥ 0.7·N × sequential.

    python -m bench.fedbary_scale_out                       # the issue's setting (~5 minutes on 2 cores)
    python -m bench.fedbary_scale_out --clients 20 --iterations 3   # a quick look
Results: reports/bench/<name>.{csv,md} (name: fedbary_scale_out).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd

from bench.scale_out import GOAL_EFFICIENCY, invocation, with_speedups, write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="N: threads / Dask workers")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--support", type=int, default=500, help="S")
    parser.add_argument("--iterations", type=int, default=10, help="K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="fedbary_scale_out")
    args = parser.parse_args(argv)

    from distributed import Client, LocalCluster
    from threadpoolctl import threadpool_limits

    from bench.fedbary_scaling import draw_clients, load_features
    from flows.runners import DaskWorkers, configure_worker_environ
    from otfed.federation.fedbary import FedBaryConfig, federated_valuation
    from otfed.federation.parties import InProcess

    x, y, _, _ = load_features("fashionmnist", 32, args.seed)
    clients = draw_clients(x, y, args.clients, args.samples, args.seed)
    config = FedBaryConfig(support_size=args.support, iterations=args.iterations)
    rows, reference = [], None

    def timed(label: str, workers, n: int) -> None:
        nonlocal reference
        load = os.getloadavg()[0]
        start = time.perf_counter()
        result = federated_valuation(clients, config, seed=args.seed, workers=workers)
        seconds = time.perf_counter() - start
        print(f"[fedbary_scale_out] {label} × {n}: {seconds:.1f} s (load {load:.2f})", flush=True)
        reference = result.distances if reference is None else reference
        if not np.array_equal(result.distances, reference):
            raise SystemExit(f"error: {label} gave other distances than sequential: runners must agree")
        rows.append(dict(runner=label, workers=n, seconds=seconds, load_1min=load))

    with threadpool_limits(limits=1, user_api="blas"):
        timed("sequential", InProcess(), 1)
        timed("thread", InProcess(args.workers), args.workers)
        configure_worker_environ()
        start = time.perf_counter()
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                          host="127.0.0.1", silence_logs=50) as cluster, \
                Client(cluster, set_as_default=False) as client:
            client.run(lambda: __import__("otfed.federation.fedbary"))
            startup = time.perf_counter() - start
            print(f"[fedbary_scale_out] cluster of {args.workers} workers up in {startup:.1f} s", flush=True)
            timed("dask (running cluster; clients as actors)", DaskWorkers(client), args.workers)
    table = with_speedups(pd.DataFrame(rows))
    write_report(table, args.name, f"One FedBary run, {args.clients} clients × {args.samples} samples, "
                 f"S = {args.support}, K = {args.iterations}, Q = federated barycenter "
                 f"(`{invocation('bench.fedbary_scale_out', argv)}`, {os.cpu_count()} cores, BLAS 1 thread). "
                 f"Dask cluster start-up (not in the table): {startup:.1f} s. Every runner gave the same "
                 f"distances. Yardstick: efficiency ≥ {GOAL_EFFICIENCY}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
