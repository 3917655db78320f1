"""Benchmark: what an accurate FedWaD costs next to POT's exact solve, for every (S, K), with the network simplex
dense (as before pricing) and priced (``otfed.ot.pricing_plan``, the default for p = 2 where both sides have ≥ 400
atoms), side by side in one process.

Setting (issue #35): two clients of n = 2,000 points, N(0, I) against N(m₀, 1.5² I) with ‖m₀‖ = 2 (the clouds of
``studies/fedwad_support_rule.py``, data seed 100 + d + n), d = 5 and 50; approximate interpolation, solver "auto",
FedWaD seed 0; S ∈ {10, 100, n}; K = 1 … 20. The reference is POT's ``ot.emd2`` on the dense cost matrix (its
convergence flag checked), timed with the cost matrix; every FedWaD time is CPU time (``time.process_time``) of
the whole protocol up to K — all interpolations, the server's steps and the two final distances — divided by
POT's, so the ratio does not depend on how loaded the machine is (both slow down together).

One run per (d, S, solver) records the estimate after every K: the final distances W(μ, ξ^K), W(ξ^K, ν) draw no
random number, so computing them after iteration K leaves the stream — and every later iterate — unchanged; the
bench checks that its numbers equal ``federated_wasserstein`` at K = 3 and K = 20. Peak memory is measured apart
(``tracemalloc``, which sees NumPy's buffers) for POT's solve and for one FedWaD session at S = n, K = 3.

The accurate setting at small K over FedWaD seeds (ξ⁰ and the t draws; the data fixed): ``--seeds N`` runs S = n,
priced, K ≤ 5 for seeds 0 … N − 1 and writes the spread of the error and of the CPU ratio per K.

    python -m bench.fedwad_accuracy                  # d = 5 and 50 (about 10 minutes on 2 cores)
    python -m bench.fedwad_accuracy --dims 5 --k 5   # a quick look
    python -m bench.fedwad_accuracy --seeds 10       # the seeds table only (a few minutes)
Results: reports/bench/fedwad_accuracy.{csv,md,png}, fedwad_accuracy_memory.csv, fedwad_accuracy_seeds.{csv,md}.
"""
from __future__ import annotations

import argparse
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import ot
import pandas as pd

import otfed.ot.exact as exact
from otfed import io
from otfed.federation import FedWaDConfig, federated_wasserstein
from otfed.federation.fedwad import WassersteinClient, WassersteinServer
from otfed.ot import Measure

OUT = Path("reports/bench")
N = 2000
K_REPORTED = (1, 2, 3, 5, 10, 20)
SOLVERS = ("dense", "pricing")


def clouds(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """n points of N(0, I) and n of N(m₀, 1.5² I), ‖m₀‖ = 2, data seed 100 + d + n (studies/fedwad_support_rule)."""
    rng = np.random.default_rng(100 + d + n)
    x = rng.standard_normal((n, d))
    shift = np.zeros(d)
    shift[0] = 2.0
    return x, rng.standard_normal((n, d)) * 1.5 + shift


@contextmanager
def network_simplex(solver: str):
    """``dense``: every subproblem on all arcs, as before pricing (PRICING_MIN_SIDE out of reach); ``pricing``: the
    default."""
    saved = exact.PRICING_MIN_SIDE
    if solver == "dense":
        exact.PRICING_MIN_SIDE = 1 << 62
    try:
        yield
    finally:
        exact.PRICING_MIN_SIDE = saved


def pot_exact(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """W2 by POT's dense network simplex and its CPU seconds (cost matrix included)."""
    start = time.process_time()
    a, b = np.full(len(x), 1 / len(x)), np.full(len(y), 1 / len(y))
    cost, log = ot.emd2(a, b, ot.dist(x, y), numItermax=10**8, log=True)
    seconds = time.process_time() - start
    if log.get("result_code", 1) != 1:
        raise RuntimeError(f"POT's network simplex did not converge: {log.get('warning')}")
    return float(np.sqrt(cost)), seconds


def session(x: np.ndarray, y: np.ndarray, config: FedWaDConfig, seed: int, k_max: int) -> list[dict]:
    """One FedWaD session of k_max iterations, built from the library's roles as ``fedwad`` builds it, with the
    estimate and the cumulative CPU after every iteration."""
    seeds = np.random.SeedSequence(seed).spawn(3)
    mu = WassersteinClient("client_mu", Measure.uniform(x), config, np.random.default_rng(seeds[0]))
    nu = WassersteinClient("client_nu", Measure.uniform(y), config, np.random.default_rng(seeds[1]))
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    rows, spent = [], 0.0
    start = time.process_time()
    server.initialise(mu.dim)
    for k in range(1, k_max + 1):
        msg_mu = mu.interpolate(server.broadcast(mu.name))
        msg_nu = nu.interpolate(server.broadcast(nu.name))
        server.combine(msg_mu, msg_nu)
        spent += time.process_time() - start
        start = time.process_time()
        d_mu = mu.distance(server.broadcast(mu.name))
        d_nu = nu.distance(server.broadcast(nu.name))
        final = time.process_time() - start
        rows.append(dict(K=k, estimate=server.estimate(d_mu, d_nu), cpu=spent + final))
        start = time.process_time()
    return rows


def peak_mib(function) -> float:
    """Peak traced memory (MiB) while ``function()`` runs."""
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def measure(d: int, k_max: int, seed: int) -> tuple[list[dict], dict]:
    x, y = clouds(N, d)
    pot_exact(x[:50], y[:50])  # warm-up (lazy imports), discarded
    exact_w2, exact_cpu = pot_exact(x, y)
    print(f"d={d}: POT exact W2 {exact_w2:.5f} in {exact_cpu:.2f} s CPU", flush=True)
    rows = []
    for support in (10, 100, N):
        for solver in SOLVERS if support == N else ("dense",):
            config = FedWaDConfig(support_size=support, iterations=k_max)
            with network_simplex(solver):
                run = session(x, y, config, seed, k_max)
                for check in {min(3, k_max), k_max}:
                    expected = federated_wasserstein(x, y, config.model_copy(update=dict(iterations=check)),
                                                     seed=seed).estimate
                    if expected != run[check - 1]["estimate"]:
                        raise AssertionError(f"bench session differs from federated_wasserstein at K={check}: "
                                             f"{run[check - 1]['estimate']!r} vs {expected!r}")
            for row in run:
                if row["K"] in K_REPORTED or row["K"] == k_max:
                    rows.append(dict(d=d, n=N, S=support, solver=solver, K=row["K"], estimate=row["estimate"],
                                     exact=exact_w2, rel_error=row["estimate"] / exact_w2 - 1,
                                     cpu_seconds=row["cpu"], exact_cpu_seconds=exact_cpu,
                                     cpu_ratio=row["cpu"] / exact_cpu))
            last = rows[-1]
            print(f"  S={support:>5} {solver:>7}: K={last['K']} {100 * last['rel_error']:+.2f}% at "
                  f"{last['cpu_ratio']:.1f}× POT", flush=True)
    config = FedWaDConfig(support_size=N, iterations=3)
    memory = dict(d=d, n=N, pot_exact_mib=peak_mib(lambda: pot_exact(x, y)))
    for solver in SOLVERS:
        with network_simplex(solver):
            memory[f"fedwad_{solver}_mib"] = peak_mib(lambda: federated_wasserstein(x, y, config, seed=seed))
    return rows, memory


def seed_spread(dims: list[int], seeds: int, k_max: int = 5) -> pd.DataFrame:
    """S = n, priced, K = 1 … k_max for FedWaD seeds 0 … seeds − 1: the error and the CPU ratio per (d, K) as
    min / median / max over the seeds."""
    rows = []
    for d in dims:
        x, y = clouds(N, d)
        pot_exact(x[:50], y[:50])
        exact_w2, exact_cpu = pot_exact(x, y)
        for seed in range(seeds):
            for row in session(x, y, FedWaDConfig(support_size=N, iterations=k_max), seed, k_max):
                rows.append(dict(d=d, seed=seed, K=row["K"], rel_error=row["estimate"] / exact_w2 - 1,
                                 cpu_ratio=row["cpu"] / exact_cpu))
            print(f"d={d} seed {seed}: K=1..{k_max} errors "
                  + " ".join(f"{100 * r['rel_error']:+.2f}%" for r in rows[-k_max:]), flush=True)
    table = pd.DataFrame(rows)
    spread = table.groupby(["d", "K"]).agg(seeds=("seed", "size"),
                                          error_min=("rel_error", "min"), error_median=("rel_error", "median"),
                                          error_max=("rel_error", "max"), cpu_ratio_min=("cpu_ratio", "min"),
                                          cpu_ratio_median=("cpu_ratio", "median"),
                                          cpu_ratio_max=("cpu_ratio", "max")).reset_index()
    return spread


def figure(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dims = sorted(table.d.unique())
    fig, axes = plt.subplots(1, len(dims), figsize=(5.5 * len(dims), 4.2), squeeze=False)
    for ax, d in zip(axes[0], dims, strict=True):
        part = table[table.d == d]
        for (support, solver), line in part.groupby(["S", "solver"]):
            label = f"S = {support}" + (f", {solver}" if support == N else "")
            ax.plot(line.cpu_ratio, 100 * line.rel_error, "o-" if solver == "pricing" else "s--", label=label)
            for _, row in line.iterrows():
                ax.annotate(f"K={row.K}", (row.cpu_ratio, 100 * row.rel_error), fontsize=6, alpha=0.7)
        ax.axvline(3, color="grey", lw=0.8, ls=":")
        ax.axhline(5, color="grey", lw=0.8, ls=":")
        ax.set(xscale="log", yscale="log", xlabel="CPU / POT exact (emd2)", ylabel="estimate / exact W2 − 1 (%)",
               title=f"FedWaD, d = {d}, n = {N} per client")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=int, nargs="+", default=[5, 50])
    parser.add_argument("--k", type=int, default=20, help="the largest K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--seeds", type=int, default=0, help="only the seeds table, over this many FedWaD seeds")
    args = parser.parse_args(argv)
    if args.seeds:
        spread = seed_spread(args.dims, args.seeds)
        io.write_csv(spread, args.out / "fedwad_accuracy_seeds.csv")
        shown = spread.copy()
        for column in ("error_min", "error_median", "error_max"):
            shown[column] = (100 * shown[column]).round(2)
        io.write_text(io.markdown_table(shown.round(2))
                      + "\n\nS = n = 2,000, priced; error_*: estimate / exact W2 − 1 in %, over FedWaD seeds (ξ⁰, t); "
                        "cpu_ratio_*: FedWaD CPU / POT emd2 CPU.\n", args.out / "fedwad_accuracy_seeds.md")
        return 0
    rows, memory = [], []
    for d in args.dims:
        part, mem = measure(d, args.k, args.seed)
        rows += part
        memory.append(mem)
    table = pd.DataFrame(rows)
    io.write_csv(table, args.out / "fedwad_accuracy.csv")
    io.write_csv(pd.DataFrame(memory), args.out / "fedwad_accuracy_memory.csv")
    shown = table.assign(rel_error=(100 * table.rel_error).round(2), cpu_ratio=table.cpu_ratio.round(2))
    io.write_text(io.markdown_table(shown[["d", "S", "solver", "K", "rel_error", "cpu_ratio", "cpu_seconds",
                                           "exact_cpu_seconds"]])
                  + "\n\nrel_error: estimate / exact W2 − 1, in %; cpu_ratio: FedWaD CPU / POT emd2 CPU.\n\n"
                  + io.markdown_table(pd.DataFrame(memory).round(1)) + "\n", args.out / "fedwad_accuracy.md")
    io.save_figure(figure(table), args.out / "fedwad_accuracy.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
