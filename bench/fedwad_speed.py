"""Benchmark: approximate FedWaD with otfed's default subproblem solver (``auto``: the semi-dual Newton
solver where one side is ≥ 100× the other, else the network simplex) vs the same algorithm
solving every OT subproblem with POT's network simplex (what the authors' code does), and vs the exact W2.

Setting (issue #2, part 10): S = 10, K = 20, d = 2, ratio 1:3 (ν has n/3 samples), n = 100 … 20,000 per
client. Both FedWaD variants use the same seed, hence the same ξ⁰ and the same random t draws: they differ
only in the subproblem solver. Times are measured side by side in one run and reported as ratios (the
machines are shared and noisy). Goal: ≥ 10× faster than the network-simplex version at n = 20,000 with a
relative error to the exact W2 no worse than it by more than 0.5 points.

    python -m bench.fedwad_speed                 # full sweep (several minutes: the exact W at n = 20,000)
    python -m bench.fedwad_speed --n 100 1000    # a quick look
Results: reports/bench/fedwad_speed.{csv,md,png}.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.gaussians import gaussian_pair
from otfed.federation import FedWaDConfig, federated_wasserstein
from otfed.ot import wasserstein

DEFAULT_N = [100, 300, 1000, 3000, 10000, 20000]
OUT = Path("reports/bench")


def measure(n: int, seed: int, support: int = 10, iterations: int = 20, ratio: int = 3, dim: int = 2) -> dict:
    rng = np.random.default_rng(np.random.SeedSequence([seed, n]))
    x_mu, x_nu = gaussian_pair(n, ratio, dim, rng)
    row: dict = dict(n=n, n_nu=len(x_nu), support=support, iterations=iterations, dim=dim)
    start = time.perf_counter()
    exact = wasserstein(x_mu, x_nu, p=2)
    row.update(exact=exact, seconds_exact=time.perf_counter() - start)
    for solver in ("auto", "network_simplex"):
        config = FedWaDConfig(support_size=support, iterations=iterations, interpolation="approx", solver=solver)
        start = time.perf_counter()
        estimate = federated_wasserstein(x_mu, x_nu, config, seed=seed).estimate
        row[f"seconds_{solver}"] = time.perf_counter() - start
        row[f"value_{solver}"] = estimate
        row[f"rel_error_{solver}"] = abs(estimate - exact) / exact
    row["speedup_vs_network_simplex"] = row["seconds_network_simplex"] / row["seconds_auto"]
    row["speedup_vs_exact"] = row["seconds_exact"] / row["seconds_auto"]
    row["error_gap_points"] = 100 * (row["rel_error_auto"] - row["rel_error_network_simplex"])
    return row


def figure(table: pd.DataFrame):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(table.n, table.seconds_auto, "o-", label="FedWaD, otfed (solver auto: semi-dual Newton for S ≪ n)")
    axes[0].plot(table.n, table.seconds_network_simplex, "s--", label="FedWaD, network simplex (authors')")
    axes[0].plot(table.n, table.seconds_exact, "k^-", label="exact W2 (POT emd)")
    axes[0].set(xscale="log", yscale="log", xlabel="n per client (ν: n/3)", ylabel="seconds",
                title="approximate FedWaD, S=10, K=20, d=2")
    axes[0].legend(fontsize=8)
    axes[1].plot(table.n, 100 * table.rel_error_auto, "o-", label="otfed (auto)")
    axes[1].plot(table.n, 100 * table.rel_error_network_simplex, "s--", label="network simplex")
    axes[1].set(xscale="log", xlabel="n per client", ylabel="relative error to exact W2 (%)",
                title="accuracy (same seed, same t draws)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=DEFAULT_N)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    measure(50, args.seed)  # warm-up (lazy imports, BLAS/thread-pool start-up), discarded
    rows = []
    for n in args.n:
        row = measure(n, args.seed)
        rows.append(row)
        print(f"n={n:>6}  exact {row['seconds_exact']:8.2f}s  otfed {row['seconds_auto']:7.2f}s  "
              f"simplex {row['seconds_network_simplex']:7.2f}s  speed-up {row['speedup_vs_network_simplex']:6.1f}x  "
              f"rel.err otfed {100 * row['rel_error_auto']:.3f}%  "
              f"simplex {100 * row['rel_error_network_simplex']:.3f}%", flush=True)
    table = pd.DataFrame(rows)
    io.write_csv(table, args.out / "fedwad_speed.csv")
    io.write_text(io.markdown_table(table[["n", "n_nu", "seconds_exact", "seconds_auto",
                                           "seconds_network_simplex", "speedup_vs_network_simplex",
                                           "rel_error_auto", "rel_error_network_simplex",
                                           "error_gap_points"]]), args.out / "fedwad_speed.md")
    io.save_figure(figure(table), args.out / "fedwad_speed.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
