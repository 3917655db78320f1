"""Benchmark: FedBary evaluation time vs the number of clients (FedBary paper table 2; issue #3, "Scaling").

Setting: N = 5, 10, 50, 100 clients × barycenter support S = 100, 500; every client holds 500 real
FashionMNIST images (``data/raw``, pixels in [0, 1], PCA to 32-D fitted on the server's test split, as
stage ``barycenter_valuation`` does; label-augmented client-side to 96-D). The embedded file has 5,000
training rows, too few for 100 × 500 disjoint clients, so **every client draws its 500 rows without
replacement from all 5,000, independently of the other clients** (clients overlap; at N = 100 every row
sits in ≈ 10 clients). FedBary Algorithm 1 (otfed.federation.fedbary, the stage's settings: K = 10
iterations, t ~ U(0, 1), approximate interpolation, solver ``auto``) is timed end to end — augmentation,
K rounds and the closing round — with the server's validation set as Q (500 test rows) and against the
federated barycenter (no validation set). Clients run one after the other in one process (one core):
the protocol's clients are independent, so a deployment would run them in parallel.

Exact Shapley of the FedAvg utility (the stage's baseline: validation accuracy of FedAvg softmax
regression, 10 rounds × 5 local epochs, trained on every coalition) is timed for N ≤ ``--shapley-max``
(2^N coalitions); beyond, the table gives the extrapolation t(N) ≈ t(N₀) · 2^(N−N₀) · N/N₀ from the
largest measured N₀ (coalitions double with every client; the mean coalition size grows ∝ N), marked as
extrapolated, not measured.

Goal (issue #3): 100 clients × 500 samples with S = 500 in under 10 minutes on this 2-core machine, and
time linear in N: a least-squares line seconds = slope · N + intercept per (target, S), with R².
The machine is shared: the 1-minute load average at the start of each measurement is recorded.

    python -m bench.fedbary_scaling                       # full sweep (≈ 10 minutes)
    python -m bench.fedbary_scaling --clients 5 10 --supports 100 --shapley-max 5   # a quick look
    python -m bench.fedbary_scaling --blas-threads 1 --name fedbary_scaling_blas1   # BLAS limited to 1 thread
Results: reports/bench/<name>.{csv,md,png}, <name>_fit.csv, <name>_shapley.csv (name: fedbary_scaling).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.features import fit_pca, pixel_features, reduce_features
from otfed.data.images import load_images
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.federation.otdd import LabelledData
from otfed.fl import FedAvgConfig
from otfed.valuation import ExactShapley, ValuationData, fedavg_utility

DEFAULT_CLIENTS = [5, 10, 50, 100]
DEFAULT_SUPPORTS = [100, 500]
FEDAVG = FedAvgConfig(rounds=10, epochs=5, lr=0.1, batch_size=None, hidden=[])  # params.yaml contributions.fedavg
OUT = Path("reports/bench")
GOAL_SECONDS = 600.0


def load_features(dataset: str, pca_components: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Train and test features (PCA fitted on the test split, the server's public data) and labels."""
    train, test = load_images(dataset, "train"), load_images(dataset, "test")
    pca = fit_pca(pixel_features(test.images), pca_components, seed)
    return (reduce_features(pixel_features(train.images), pca), train.labels,
            reduce_features(pixel_features(test.images), pca), test.labels)


def draw_clients(x: np.ndarray, y: np.ndarray, n_clients: int, samples: int, seed: int) -> list[LabelledData]:
    """``n_clients`` clients of ``samples`` rows each, every client drawn without replacement from all rows,
    independently of the others (clients overlap when n_clients · samples > len(x))."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, n_clients, samples]))
    return [LabelledData(f"client_{i:03d}", x[idx], y[idx])
            for i in range(n_clients) for idx in [np.sort(rng.choice(len(y), samples, replace=False))]]


def time_fedbary(clients: list[LabelledData], validation: LabelledData | None, config: FedBaryConfig,
                 seed: int) -> tuple[float, float, float]:
    """Wall seconds and process CPU seconds (all threads; less sensitive than wall time to other processes
    on a shared machine) of one FedBary evaluation, and the client contribution spread (max − min, %)."""
    start, cpu = time.perf_counter(), time.process_time()
    result = federated_valuation(clients, config, validation=validation, seed=seed)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return seconds, cpu_seconds, float(result.contributions.max() - result.contributions.min())


def time_exact_shapley(clients: list[LabelledData], validation: LabelledData, seed: int) -> float:
    """Wall seconds of exact Shapley values of the FedAvg utility over all 2^N coalitions."""
    players = ValuationData(np.arange(len(clients), dtype=np.float64)[:, None], np.zeros(len(clients), dtype=np.int64))
    start = time.perf_counter()
    ExactShapley(fedavg_utility(clients, validation, FEDAVG, seed)).fit(players)
    return time.perf_counter() - start


def linear_fit(n: np.ndarray, seconds: np.ndarray) -> dict[str, float]:
    """Least squares seconds = slope · n + intercept, and R² = 1 − SS_res / SS_tot."""
    slope, intercept = np.polyfit(n, seconds, 1)
    pred = slope * n + intercept
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    r2 = 1.0 - float(((seconds - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else float("nan")
    return dict(slope_s_per_client=float(slope), intercept_s=float(intercept), r2=r2)


def figure(table: pd.DataFrame, fits: pd.DataFrame, shapley: pd.DataFrame, samples: int = 500):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    top = 1e5  # log panel: extrapolated Shapley times are printed, not drawn
    colors = {100: "tab:blue", 500: "tab:red"}
    for ax, log in zip(axes, (False, True)):
        for (target, support), sub in table.groupby(["target", "support"], sort=False):
            fit = fits[(fits.target == target) & (fits.support == support) & (fits.clock == "wall")].iloc[0]
            ls = "-" if target == "validation" else "--"
            ax.plot(sub.clients, sub.seconds, marker="o", ls=ls, color=colors.get(support),
                    label=f"FedBary S={support}, Q={target}: {fit.slope_s_per_client:.2f} s/client (R²={fit.r2:.3f})")
        measured = shapley[shapley.measured.astype(bool)] if len(shapley) else shapley
        if len(measured):
            ax.plot(measured.clients, measured.shapley_seconds, "k^-", label="exact Shapley (FedAvg utility), measured")
        if log and len(measured):
            extra = shapley[~shapley.measured]
            joined = pd.concat([measured.tail(1), extra])
            ax.plot(joined.clients, joined.shapley_seconds, "k^:", alpha=0.5, label="exact Shapley, extrapolated")
            for r in extra.itertuples():  # off the chart: print the extrapolated time instead
                ax.annotate(f"Shapley N={r.clients}:\n~{r.shapley_seconds:.0e} s", (r.clients, top), fontsize=6,
                            ha="center", va="top")
        if log:
            ax.axhline(GOAL_SECONDS, color="gray", lw=0.8, ls=":")
            ax.set(xscale="log", yscale="log", title="log–log (Shapley: 2^N coalitions)")
            ax.set_ylim(max(float(table.seconds.min()) / 2, 1e-2), top)
        else:
            ax.axhline(GOAL_SECONDS, color="gray", lw=0.8, ls=":", label="goal: 10 min at N = 100, S = 500")
            ax.set_ylim(0, max(float(table.seconds.max()), GOAL_SECONDS) * 1.1)
            ax.set(title="linear axes: time grows linearly in N")
        ax.set(xlabel=f"clients N ({samples} samples each)", ylabel="seconds")
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=DEFAULT_CLIENTS)
    parser.add_argument("--supports", type=int, nargs="+", default=DEFAULT_SUPPORTS)
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--targets", nargs="+", choices=["validation", "barycenter"],
                        default=["validation", "barycenter"])
    parser.add_argument("--dataset", default="fashionmnist")
    parser.add_argument("--pca", type=int, default=32)
    parser.add_argument("--validation-samples", type=int, default=500)
    parser.add_argument("--shapley-max", type=int, default=10, help="time exact Shapley for N ≤ this (2^N coalitions)")
    parser.add_argument("--blas-threads", type=int, default=None,
                        help="limit BLAS (OpenBLAS/MKL) threads for the whole run (threadpoolctl); default: as is")
    parser.add_argument("--name", default="fedbary_scaling", help="output file stem")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    limit = contextlib.nullcontext()
    if args.blas_threads is not None:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(limits=args.blas_threads, user_api="blas")
    with limit:
        return run(args)


def run(args: argparse.Namespace) -> int:

    x, y, x_test, y_test = load_features(args.dataset, args.pca, args.seed)
    validation = LabelledData("server_validation", x_test[:args.validation_samples], y_test[:args.validation_samples])
    warm = draw_clients(x, y, 2, 200, args.seed)  # warm-up (lazy imports, BLAS start-up), discarded
    time_fedbary(warm, validation, FedBaryConfig(support_size=10, iterations=2), args.seed)
    load_start = os.getloadavg()

    rows = []
    for support in args.supports:
        config = FedBaryConfig(support_size=support, iterations=args.iterations)
        for n in args.clients:
            clients = draw_clients(x, y, n, args.samples, args.seed)
            for target in args.targets:
                load = os.getloadavg()[0]
                seconds, cpu_seconds, spread = time_fedbary(clients, validation if target == "validation" else None, config,
                                               args.seed)
                rows.append(dict(target=target, support=support, clients=n, samples=args.samples,
                                 iterations=args.iterations, seconds=seconds, cpu_seconds=cpu_seconds,
                                 seconds_per_client=seconds / n,
                                 contribution_spread_pct=spread, load_1min=load))
                print(f"S={support:>4} N={n:>4} Q={target:<10} {seconds:8.1f}s  cpu {cpu_seconds:8.1f}s  "
                      f"({seconds / n:.2f} s/client, "
                      f"load {load:.2f})", flush=True)
    table = pd.DataFrame(rows)

    shapley_rows = []
    for n in sorted(c for c in args.clients if c <= args.shapley_max):
        clients = draw_clients(x, y, n, args.samples, args.seed)
        load = os.getloadavg()[0]
        seconds = time_exact_shapley(clients, validation, args.seed)
        shapley_rows.append(dict(clients=n, coalitions=2 ** n, shapley_seconds=seconds, measured=True, load_1min=load))
        print(f"exact Shapley N={n:>3}: {seconds:8.1f}s ({2 ** n} coalitions)", flush=True)
    if shapley_rows:
        n0, t0 = shapley_rows[-1]["clients"], shapley_rows[-1]["shapley_seconds"]
        for n in sorted(c for c in args.clients if c > args.shapley_max):
            shapley_rows.append(dict(clients=n, coalitions=float(2.0 ** n),
                                     shapley_seconds=t0 * 2.0 ** (n - n0) * n / n0, measured=False,
                                     load_1min=float("nan")))
    shapley = pd.DataFrame(shapley_rows)

    fits = pd.DataFrame([dict(target=target, support=support, clock=clock,
                              **linear_fit(sub.clients.to_numpy(float), sub[column].to_numpy()))
                         for clock, column in (("wall", "seconds"), ("cpu", "cpu_seconds"))
                         for (target, support), sub in table.groupby(["target", "support"], sort=False)])
    goal = table[(table.clients == 100) & (table.support == 500) & (table.samples == 500)]
    io.write_csv(table, args.out / f"{args.name}.csv")
    io.write_csv(fits, args.out / f"{args.name}_fit.csv")
    if len(shapley):
        io.write_csv(shapley, args.out / f"{args.name}_shapley.csv")
    wide = table.pivot_table(index="clients", columns=["target", "support"], values="seconds")
    wide.columns = [f"seconds Q={t}, S={s}" for t, s in wide.columns]
    wide = wide.reset_index()
    if len(shapley):
        wide = wide.merge(shapley[["clients", "shapley_seconds", "measured"]].rename(
            columns={"shapley_seconds": "exact Shapley s", "measured": "Shapley measured"}), on="clients", how="left")
    notes = [
        "# FedBary evaluation time vs number of clients",
        "",
        f"{args.dataset} (data/raw), {args.samples} samples per client drawn without replacement from the "
        f"{len(y)} training rows independently per client (clients overlap), PCA-{args.pca} fitted on the test split, "
        f"label-augmented to {3 * args.pca}-D; FedBary K = {args.iterations}, t ~ U(0,1), approx interpolation, "
        f"solver auto; Q = {args.validation_samples} test rows (validation) or the federated barycenter. One "
        f"process, clients sequential; BLAS threads: {args.blas_threads or 'library default'}; shared 2-core "
        f"machine (load average recorded in the CSV). "
        + (f"Exact Shapley: FedAvg-utility over 2^N coalitions, measured for N ≤ {args.shapley_max}, beyond that "
           f"extrapolated as t(N₀)·2^(N−N₀)·N/N₀ (not measured)." if len(shapley) else "Exact Shapley: not run."),
        "",
        io.markdown_table(wide),
        f"1/5/15-min load averages at the start: {', '.join(f'{v:.2f}' for v in load_start)} (2 cores).",
        "",
        "## Least-squares line seconds = slope · N + intercept (wall clock and process CPU time)",
        "",
        io.markdown_table(fits),
    ]
    if len(goal):
        verdict = ", ".join(f"Q={r.target}: {r.seconds:.0f} s ({'met' if r.seconds < GOAL_SECONDS else 'NOT met'})"
                            for r in goal.itertuples())
        notes += ["", f"Goal (100 clients × 500 samples, S = 500, < 10 min): {verdict}."]
    io.write_text("\n".join(notes) + "\n", args.out / f"{args.name}.md")
    io.save_figure(figure(table, fits, shapley, args.samples),
                   args.out / f"{args.name}.png")
    print(io.markdown_table(fits))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
