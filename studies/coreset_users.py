"""Study: does the federated-coreset 1-NN classifier catch up with FedPer / FedRep as clients grow?

FedWaD (Rakotomamonjy et al., ICLR 2024) §5 "Federated coreset classification model", fig. 5 / 12 and
app. D.2 claim that a global 1-nearest-neighbour classifier over the Wasserstein coresets learnt on every
client "is highly competitive with [FedRep / FedPer], and even outperforms them when the number of users
becomes large". Stage ``fed_distance`` tests this at 20 clients only (federations ``pairs_none`` /
``pairs_strong``), where the coreset 1-NN stays below FedPer / FedRep. This study repeats the stage's
comparison at 20, 50 and 100 clients on the same, fixed, pool of data.

Setting (read from ``params.yaml`` as the stage reads it): the federations named in
``fed_distance.coresets.federations`` (``partition.federations.pairs_none`` / ``pairs_strong``: scheme
``class_pairs``, MNIST, every client two classes, structure ``none`` = a random class pair per client,
``strong`` = the five pairs (0,1) … (8,9), two clients each, the rest drawn at random; val_fraction 0.1)
with only ``n_clients`` changed (``build_federation``, the partition stage's function and seed rule). The
training pool is FIXED: all 5,000 MNIST training rows of ``data/raw/images_mnist.npz`` are split over the
clients (each class evenly among the clients holding it; a class no client holds is dropped — the CSV
reports the rows used), so "more users" means fewer samples per client, as in the paper: on average
250 / 100 / 50 samples per client at 20 / 50 / 100 clients, of which 10% (≈ 25 / 10 / 5) form the
client's held-out split and ≈ 225 / 90 / 45 its training split (per-cell means, minima and maxima in the
CSV and the report). Clients the stage would call degenerate (a class with < 2 samples, …;
``usable_clients``) are left out of every method, as in the stage.

Per cell (structure × number of clients) and seed, exactly the stage's building blocks, re-assembled from
the library (studies import the library only):

* federated coreset 1-NN (stage ``coreset_classification``): features = PCA with
  ``fed_distance.coresets.pca_components`` components fitted on the server's 1,000 MNIST test rows, applied
  by every client; each client learns its K-point coreset through FedWaD sessions with the server
  (``client_coresets`` with ``fed_distance.coresets.coreset``, K ∈ ``fed_distance.coresets.points`` = 5,
  10), labels its points by its nearest own sample and shares them; the server's 1-NN classifier over all
  shared points scores every client's held-out split. Next to it, as the stage does, the *exact* coreset
  (``wasserstein_coreset`` on the client's own data, same start) — a non-federated reference that says how
  much the FedWaD approximation costs;
* global FedAvg, FedPer, FedRep (stage ``clustered_fl`` with clustering ``global``:
  ``per_cluster_accuracy`` over one cluster of all clients) with ``fed_distance.clustered_fl.fl`` (MLP
  784-64-10 on raw pixels, 10 rounds, FedAvg/FedPer 1 local epoch, FedRep 4 head + 1 body epochs,
  lr 0.05, batch 32); FedPer / FedRep score each client with the global body and its own head.

Metric (the stage's): held-out accuracy pooled over clients, Σ correct / Σ total. Seed s draws the
partition (``build_federation(name, spec, data_dir, s)``: at 20 clients and s = 0 exactly the stage's
``pairs_none`` / ``pairs_strong``), the PCA's randomized SVD, the coresets and the FL initialisation and
batches; all methods of one (cell, seed) see the same clients and held-out splits, so the differences
coreset − FedPer / FedRep are paired by seed. Reported: mean ± 95% CI (Student t) over the seeds. Nothing is
tuned: every setting is the stage's, none is chosen on held-out data. The stage itself varies only the
algorithms' seed on one partition (seed 0), this study the partition too, so its spread is wider.

The global 1-NN classifier holds K × (number of clients) labelled points: 100 / 250 / 500 at K = 5 and
200 / 500 / 1,000 at K = 10 for 20 / 50 / 100 clients — it grows with the federation, while FL's per-client
work (a fixed number of local epochs over fewer samples) shrinks.

Grid: clients ∈ {20, 50, 100} × structure ∈ {none, strong} × K ∈ {5, 10} × seeds 0, 1, 2 — nothing dropped.
The full run took 5.1–5.7 minutes on the 2-core machine (the two worker threads give only ≈ 1.05 cores: the
FedWaD sessions are small NumPy/POT calls that hold the GIL); ``--quick`` takes about 1 minute. The
``seconds`` column is the time of the job that produced the row (one job computes both the federated and
the exact coreset of a K).

    python -m studies.coreset_users            # full grid, seeds 0,1,2
    python -m studies.coreset_users --quick    # seed 0, 20 and 100 clients, largest K only: a timing check
Results: reports/studies/coreset_users.csv (one row per cell, method and seed), .md (summary), .png.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import yaml
from pydantic import TypeAdapter

from otfed import io
from otfed.data.federations import ClassPairsFederation, FederationSpec, build_federation
from otfed.data.features import fit_pca, reduce_features
from otfed.data.store import VAL, FederationData
from otfed.device import stage_device, threads_for
from otfed.federation.coresets import (CoresetClassifier, CoresetConfig, client_coresets, client_seed,
                                       coreset_classifier, nearest_sample_labels, wasserstein_coreset)
from otfed.federation.otdd import usable_clients
from otfed.fl import PersonalizedConfig, per_cluster_accuracy
from otfed.metrics import mean_confidence_interval
from otfed.ot import wasserstein
from otfed.ot.otdd import LabelledData

OUT = Path("reports/studies")
NAME = "coreset_users"
CLIENTS = (20, 50, 100)
QUICK_CLIENTS = (20, 100)
STRUCTURES = ("none", "strong")
FL_LABELS = {"fedavg": "FedAvg", "fedper": "FedPer", "fedrep": "FedRep"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Stage ``fed_distance``'s coreset and clustered-FL settings (params.yaml), as library types."""

    federations: dict[str, tuple[str, ClassPairsFederation]]  # structure → (federation name, its spec)
    data_dir: str
    points: tuple[int, ...]
    pca_components: int
    coreset: CoresetConfig
    diagonal: bool
    algorithms: tuple[str, ...]
    fl: PersonalizedConfig


def load_setting(path: str) -> Setting:
    """``fed_distance.coresets``, ``fed_distance.clustered_fl`` and the class_pairs federations they name."""
    p = yaml.safe_load(Path(path).read_text())
    fd = p["fed_distance"]
    cs, cfl = fd.get("coresets"), fd.get("clustered_fl")
    if cs is None or cfl is None:
        raise SystemExit(f"error: {path}: fed_distance.coresets and fed_distance.clustered_fl must be set")
    specs = p["partition"]["federations"]
    adapter = TypeAdapter(FederationSpec)
    federations: dict[str, tuple[str, ClassPairsFederation]] = {}
    for name in cs["federations"]:
        if name not in specs:
            raise SystemExit(f"error: {path}: fed_distance.coresets.federations names {name!r}, "
                             "which partition.federations does not define")
        spec = adapter.validate_python(specs[name])
        if not isinstance(spec, ClassPairsFederation):
            raise SystemExit(f"error: {path}: partition.federations.{name} must have scheme 'class_pairs'")
        federations.setdefault(spec.structure, (name, spec))
    missing = [s for s in STRUCTURES if s not in federations]
    if missing:
        raise SystemExit(f"error: {path}: fed_distance.coresets.federations has no class_pairs federation with "
                         f"structure {', '.join(missing)}")
    return Setting(federations=federations, data_dir=p["partition"].get("data_dir", "data/raw"),
                   points=tuple(sorted(cs["points"])), pca_components=int(cs["pca_components"]),
                   coreset=CoresetConfig(**cs["coreset"]), diagonal=bool(fd["clustering"].get("diagonal", True)),
                   algorithms=tuple(cfl.get("algorithms", ["fedavg", "fedper", "fedrep"])),
                   fl=PersonalizedConfig(**cfl["fl"]))


# --------------------------------------------------------------------------------------------- cells
@dataclasses.dataclass(frozen=True)
class Cell:
    """One (structure, number of clients, seed): the usable clients' training and held-out splits in raw
    pixels (FL) and on the server-fitted PCA (coresets), and the partition's sizes."""

    structure: str
    n_clients: int
    seed: int
    raw: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]]
    train: list[LabelledData]
    held_out: list[LabelledData]
    info: dict[str, Any]


def federation(setting: Setting, structure: str, n_clients: int, seed: int) -> FederationData:
    """The stage's class_pairs federation of ``structure`` with ``n_clients`` clients, partitioned from ``seed``
    (its name and spec otherwise unchanged; at 20 clients and seed 0 the stage's own federation)."""
    name, spec = setting.federations[structure]
    return build_federation(name, spec.model_copy(update={"n_clients": n_clients}), setting.data_dir, seed)[0]


def build_cell(setting: Setting, structure: str, n_clients: int, seed: int) -> Cell:
    """The usable clients (the stage's ``roster_of``: ``usable_clients`` with ``clustering.diagonal``), their
    splits and their PCA projection (the stage's ``coreset_runs``: PCA fitted on the server's test rows)."""
    fed = federation(setting, structure, n_clients, seed)
    clients = [LabelledData(fed.client_names[k], *fed.client_data(k)) for k in range(fed.n_clients)]
    keep, problems = usable_clients(clients, setting.diagonal)
    if not keep:
        raise SystemExit(f"error: {structure} × {n_clients} clients, seed {seed}: no usable client; "
                         + "; ".join(r for _, r in problems))
    held = [fed.client_data(k, VAL) for k in keep]
    pca = fit_pca(fed.x_test.astype(np.float64), setting.pca_components, seed)
    train = [LabelledData(clients[k].name, reduce_features(clients[k].x, pca), clients[k].y) for k in keep]
    held_out = [LabelledData(clients[k].name, reduce_features(x, pca), y) for k, (x, y) in zip(keep, held)]
    n_train = np.array([len(clients[k].y) for k in keep])
    n_held = np.array([len(y) for _, y in held])
    sizes = n_train + n_held
    info = dict(rows_used=int(len(fed.y)), clients_used=len(keep), degenerate=len(problems),
                classes_held=int(len(np.unique(fed.y))), samples_mean=float(sizes.mean()),
                samples_min=int(sizes.min()), samples_max=int(sizes.max()), train_mean=float(n_train.mean()),
                train_min=int(n_train.min()), held_out_mean=float(n_held.mean()), held_out_min=int(n_held.min()))
    return Cell(structure, n_clients, seed, [((clients[k].x, clients[k].y), h) for k, h in zip(keep, held)],
                train, held_out, info)


def coreset_accuracy(cell: Cell, config: CoresetConfig) -> list[dict[str, Any]]:
    """The stage's ``coreset_classification`` on one cell: federated coresets (``client_coresets``) and the
    exact reference (``wasserstein_coreset``, same start per client), each pooled into the server's 1-NN
    classifier; pooled held-out correct / total and the clients' mean exact W_2(coreset, data)."""
    federated = client_coresets(cell.train, config, cell.seed)
    exact = []
    for i, c in enumerate(cell.train):
        res = wasserstein_coreset(c.x, config.points, epochs=config.epochs, lr=config.lr,
                                  seed=client_seed(cell.seed, i), init_scale=config.init_scale)
        exact.append((res.coreset, nearest_sample_labels(res.coreset, c.x, c.y)))
    runs = {"coreset": (coreset_classifier(federated), [fc.message.points for fc in federated]),
            "exact coreset": (CoresetClassifier(np.concatenate([p for p, _ in exact]),
                                                np.concatenate([lab for _, lab in exact])), [p for p, _ in exact])}
    rows = []
    for method, (classifier, supports) in runs.items():
        correct = sum(int(np.sum(classifier.predict(t.x) == t.y)) for t in cell.held_out)
        total = sum(len(t.y) for t in cell.held_out)
        w2 = float(np.mean([wasserstein(p, c.x, p=2) for p, c in zip(supports, cell.train)]))
        rows.append(dict(method=f"{method} K={config.points}", correct=correct, total=total, mean_client_w2=w2))
    return rows


def fl_accuracy(cell: Cell, algorithm: str, config: PersonalizedConfig, device: str) -> list[dict[str, Any]]:
    """The stage's ``clustered_fl`` with clustering ``global``: ``algorithm`` over all clients (one cluster),
    every client scored on its own held-out split; pooled correct / total."""
    n_classes = int(max(np.max(y) for (_, y), _ in cell.raw)) + 1
    acc = per_cluster_accuracy(cell.raw, np.zeros(len(cell.raw), dtype=np.int64), algorithm, config, n_classes,
                               seed=cell.seed, device=device, num_threads=threads_for(device))
    return [dict(method=f"global {FL_LABELS[algorithm]}", correct=int(acc.correct.sum()), total=int(acc.total.sum()),
                 mean_client_w2=float("nan"))]


def run(setting: Setting, clients: tuple[int, ...], points: tuple[int, ...], seeds: list[int], device: str,
        workers: int) -> pd.DataFrame:
    """One row per (structure, clients, seed, method); the jobs (one per coreset K, one per FL algorithm) of
    every cell run on a pool of ``workers`` threads."""
    jobs: list[tuple[Cell, str, Callable[[], list[dict[str, Any]]]]] = []
    for seed in seeds:
        for structure in STRUCTURES:
            for n in clients:
                cell = build_cell(setting, structure, n, seed)
                for k in points:
                    config = setting.coreset.model_copy(update={"points": k})
                    jobs.append((cell, f"coresets K={k}", lambda c=cell, cf=config: coreset_accuracy(c, cf)))
                for algorithm in setting.algorithms:
                    jobs.append((cell, algorithm, lambda c=cell, a=algorithm: fl_accuracy(c, a, setting.fl, device)))

    def timed(job: tuple[Cell, str, Callable[[], list[dict[str, Any]]]]) -> tuple[list[dict[str, Any]], float]:
        start = time.perf_counter()
        out = job[2]()
        return out, time.perf_counter() - start

    rows = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(timed, job): job for job in jobs}
        for done, future in enumerate(as_completed(futures), 1):
            cell, what, _ = futures[future]
            results, seconds = future.result()
            for r in results:
                rows.append(dict(structure=cell.structure, n_clients=cell.n_clients, seed=cell.seed, **r,
                                 accuracy=r["correct"] / r["total"], seconds=seconds, **cell.info))
            print(f"[{NAME}] {done}/{len(jobs)} {cell.structure} n={cell.n_clients} seed {cell.seed} {what}: "
                  + " ".join(f"{r['method']} {r['correct'] / r['total']:.3f}" for r in results)
                  + f" ({seconds:.1f} s)", flush=True)
    order = {m: i for i, m in enumerate(method_order(setting, points))}
    return pd.DataFrame(rows).sort_values(["structure", "n_clients", "seed", "method"], kind="stable",
                                          key=lambda c: c.map(order) if c.name == "method" else c
                                          ).reset_index(drop=True)


def method_order(setting: Setting, points: tuple[int, ...]) -> list[str]:
    return ([f"coreset K={k}" for k in points] + [f"exact coreset K={k}" for k in points]
            + [f"global {FL_LABELS[a]}" for a in setting.algorithms])


# ------------------------------------------------------------------------------------------- report
def summary(table: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per (structure, clients, method): pooled accuracy mean ± 95% CI over seeds, and for the coreset methods
    the paired difference to global FedPer / FedRep (same seed), mean ± 95% CI."""
    out = []
    for (structure, n), cell in table.groupby(["structure", "n_clients"], sort=True):
        ref = {m: sub.set_index("seed").accuracy for m, sub in cell.groupby("method")}
        for method in [m for m in order if m in ref]:
            acc = ref[method]
            row: dict[str, Any] = dict(structure=structure, n_clients=int(n), method=method, seeds=len(acc))
            row["accuracy"], row["accuracy_ci95"] = mean_confidence_interval(acc.to_numpy())
            for base in ("FedPer", "FedRep"):
                b = ref.get(f"global {base}")
                if "coreset" in method and b is not None:
                    diff = (acc - b.reindex(acc.index)).dropna()
                    row[f"minus_{base.lower()}"], row[f"minus_{base.lower()}_ci95"] = (
                        mean_confidence_interval(diff.to_numpy()) if len(diff) else (np.nan, np.nan))
            out.append(row)
    return pd.DataFrame(out)


def _pm(mean: float, ci: float, digits: int = 3, sign: bool = False) -> str:
    if not np.isfinite(mean):
        return ""
    m = f"{mean:+.{digits}f}" if sign else f"{mean:.{digits}f}"
    return m if not np.isfinite(ci) else f"{m} ± {ci:.{digits}f}"


def _sign(mean: float, ci: float) -> str:
    """Whether a paired difference's 95% CI lies above 0, below 0 or around it."""
    if not np.isfinite(ci):
        return "one seed"
    return "> 0" if mean - ci > 0 else "< 0" if mean + ci < 0 else "includes 0"


def sizes_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per (structure, clients): rows used, clients used, samples per client (mean, min–max over seeds),
    training and held-out split sizes."""
    first = table.groupby(["structure", "n_clients", "seed"]).first().reset_index()
    out = []
    for (structure, n), sub in first.groupby(["structure", "n_clients"]):
        out.append({"structure": structure, "clients": int(n),
                    "rows used": "/".join(str(int(v)) for v in sub.rows_used),
                    "clients used": "/".join(str(int(v)) for v in sub.clients_used),
                    "samples per client: mean (min–max)": f"{sub.samples_mean.mean():.0f} "
                                                          f"({sub.samples_min.min()}–{sub.samples_max.max()})",
                    "training split: mean (min)": f"{sub.train_mean.mean():.0f} ({sub.train_min.min()})",
                    "held-out split: mean (min)": f"{sub.held_out_mean.mean():.1f} ({sub.held_out_min.min()})",
                    "held-out rows pooled": int(round(sub.held_out_mean.mean() * sub.clients_used.mean()))})
    return pd.DataFrame(out)


def findings(s: pd.DataFrame, points: tuple[int, ...]) -> list[str]:
    """Plain sentences from the numbers: per structure, the paired gap coreset (largest K) − FedPer / FedRep at
    every number of clients, and whether the coreset catches up or wins at the largest one."""
    k = max(points)
    lines = []
    for structure, sub in s.groupby("structure", sort=False):
        cs = sub[sub.method == f"coreset K={k}"].sort_values("n_clients")
        parts = []
        for r in cs.itertuples():
            parts.append(f"{r.n_clients} clients: coreset {_pm(r.accuracy, r.accuracy_ci95)}, − FedPer "
                         f"{_pm(r.minus_fedper, r.minus_fedper_ci95, sign=True)} (CI {_sign(r.minus_fedper, r.minus_fedper_ci95)}), "
                         f"− FedRep {_pm(r.minus_fedrep, r.minus_fedrep_ci95, sign=True)} "
                         f"(CI {_sign(r.minus_fedrep, r.minus_fedrep_ci95)})")
        lines.append(f"- structure {structure}, K = {k}: " + "; ".join(parts) + ".")
        first, last = cs.iloc[0], cs.iloc[-1]
        words = {"> 0": "beats", "< 0": "is below", "includes 0": "ties with (CI includes 0)",
                 "one seed": "differs by (one seed, no CI) from"}
        verdict = [f"{words[_sign(last[f'minus_{b}'], last[f'minus_{b}_ci95'])]} {FL_LABELS[b]}"
                   for b in ("fedper", "fedrep")]
        best_first = min(first.minus_fedper, first.minus_fedrep)
        best_last = min(last.minus_fedper, last.minus_fedrep)
        trend = "narrows" if best_last > best_first else "does not narrow"
        lines.append(f"  At {int(last.n_clients)} clients the coreset 1-NN {' and '.join(verdict)} (paired 95% CI "
                     f"over seeds); the gap to the better of the two {trend} from {best_first:+.3f} at "
                     f"{int(first.n_clients)} clients to {best_last:+.3f} at {int(last.n_clients)}.")
        moves = []
        for method in (f"coreset K={k}", "global FedPer", "global FedRep"):
            m = sub[sub.method == method].sort_values("n_clients")
            moves.append(f"{method} {' → '.join(f'{a:.3f}' for a in m.accuracy)}")
        lines.append(f"  Accuracy over {' / '.join(str(int(n)) for n in cs.n_clients)} clients: " + "; ".join(moves) + ".")
    return lines


def markdown(s: pd.DataFrame, table: pd.DataFrame, points: tuple[int, ...], header: str) -> str:
    """The report: header, sizes, accuracy per method × clients × structure, paired gaps, findings."""
    wide = pd.DataFrame([{"structure": structure, "method": method,
                          **{f"{r.n_clients} clients": _pm(r.accuracy, r.accuracy_ci95) for r in sub.itertuples()}}
                         for (structure, method), sub in s.groupby(["structure", "method"], sort=False)])
    cs = s[s.method.str.contains("coreset")]
    gaps = pd.DataFrame({"structure": cs.structure, "clients": cs.n_clients, "method": cs.method,
                         "− global FedPer": [_pm(m, c, sign=True) for m, c in zip(cs.minus_fedper, cs.minus_fedper_ci95)],
                         "− global FedRep": [_pm(m, c, sign=True) for m, c in zip(cs.minus_fedrep, cs.minus_fedrep_ci95)]})
    return (f"{header}\n\n## Partition (per seed: rows used / clients used; sizes over all seeds)\n\n"
            f"{io.markdown_table(sizes_table(table))}\n"
            "## Pooled held-out accuracy, mean ± 95% CI over seeds\n\n"
            "coreset K = federated coreset (FedWaD sessions) 1-NN; exact coreset K = the same with each client's "
            "exact Wasserstein coreset (a non-federated reference); global FedAvg / FedPer / FedRep = one federation "
            f"of all clients (stage ``clustered_fl``, clustering ``global``).\n\n{io.markdown_table(wide)}\n"
            "## Paired differences coreset − FedPer / FedRep (accuracy, same seed: same partition and held-out rows)\n\n"
            f"{io.markdown_table(gaps)}\n## Findings (generated from the numbers above)\n\n"
            + "\n".join(findings(s, points)) + "\n")


def figure(s: pd.DataFrame, order: list[str]):
    """Pooled held-out accuracy vs number of clients, one line per method, 95% CI error bars; one panel per
    structure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"global FedAvg": ("tab:gray", "s", "-"), "global FedPer": ("tab:blue", "D", "-"),
              "global FedRep": ("tab:green", "^", "-")}
    shades = {"coreset": ("tab:red", "-"), "exact coreset": ("tab:orange", ":")}
    fig, axes = plt.subplots(1, len(STRUCTURES), figsize=(11, 4.2), sharey=True)
    for ax, structure in zip(np.atleast_1d(axes), STRUCTURES):
        sub = s[s.structure == structure]
        for method in [m for m in order if m in set(sub.method)]:
            m = sub[sub.method == method].sort_values("n_clients")
            if method in styles:
                color, marker, ls = styles[method]
            else:
                kind, k = method.rsplit(" K=", 1)
                color, ls = shades[kind]
                marker = "o" if int(k) == max(int(x.rsplit("=", 1)[1]) for x in sub.method if "K=" in x) else "v"
            dodge = 1 + 0.015 * (order.index(method) - (len(order) - 1) / 2)  # keep the error bars apart
            ax.errorbar(m.n_clients * dodge, m.accuracy, yerr=m.accuracy_ci95.fillna(0), color=color, marker=marker, ls=ls,
                        capsize=3, label=method, mfc="none" if ls == ":" else color)
        ax.set_xscale("log")
        ax.set(title=f"structure {structure}", xlabel="number of clients (fixed pool of 5,000 MNIST rows; log scale)",
               xticks=sorted(sub.n_clients.unique()), xticklabels=[str(n) for n in sorted(sub.n_clients.unique())])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("pooled held-out accuracy, mean ± 95% CI")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m studies.{NAME}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="first seed (seeds seed … seed+seeds−1)")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS))
    parser.add_argument("--quick", action="store_true", help="1 seed, 20 and 100 clients, the largest K only")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--device", default="cpu", help="FL device (cpu: one torch thread)")
    parser.add_argument("--workers", type=int, default=2, help="threads of the job pool")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the report files")
    args = parser.parse_args(argv)
    from threadpoolctl import threadpool_limits

    setting = load_setting(args.params)
    device = stage_device(args.device)  # on CPU: torch pinned to one thread
    seeds = list(range(args.seed, args.seed + (1 if args.quick else args.seeds)))
    clients = QUICK_CLIENTS if args.quick else tuple(sorted(set(args.clients)))
    points = (max(setting.points),) if args.quick else setting.points
    load_start, start = os.getloadavg(), time.perf_counter()
    with threadpool_limits(limits=1, user_api="blas"):
        table = run(setting, clients, points, seeds, device, args.workers)
    wall, load_end = time.perf_counter() - start, os.getloadavg()
    order = method_order(setting, points)
    s = summary(table, order)
    cs, fl = setting.coreset, setting.fl
    command = " ".join([f"python -m studies.{NAME}", *(argv if argv is not None else sys.argv[1:])])
    names = ", ".join(f"{st}: {n}" for st, (n, _) in setting.federations.items())
    header = (f"# Federated-coreset 1-NN vs FedPer / FedRep as the number of clients grows (FedWaD fig. 5 / 12)\n\n"
              f"`{command}` — {wall / 60:.1f} min on {os.cpu_count()} cores ({args.workers} worker threads, torch and "
              f"BLAS 1 thread, device {device}); load average (1/5/15 min) "
              f"{'/'.join(f'{v:.2f}' for v in load_start)} at the start, {'/'.join(f'{v:.2f}' for v in load_end)} at "
              f"the end. Seeds {seeds[0]}…{seeds[-1]}.\n\n"
              f"Setting (params.yaml, stage `fed_distance`): class_pairs federations ({names}) with n_clients "
              f"changed, all 5,000 MNIST training rows split over the clients (a fixed pool: more clients = fewer "
              f"samples each), val_fraction {setting.federations['none'][1].val_fraction} held out per client. "
              f"Coresets: PCA-{setting.pca_components} fitted on the server's 1,000 test rows, K ∈ {list(points)}, "
              f"{cs.epochs} epochs, lr {cs.lr:g}, step {cs.step}, FedWaD S = {cs.fedwad.support_size}, "
              f"{cs.fedwad.iterations} iterations. FL: MLP 784-{'-'.join(map(str, fl.hidden))}-10, {fl.rounds} rounds, "
              f"{fl.epochs} local epoch(s) (FedRep {fl.head_epochs} head + {fl.body_epochs} body), lr {fl.lr:g}, batch "
              f"{fl.batch_size}. Metric: held-out accuracy pooled over clients (Σ correct / Σ total). The seed draws "
              f"the partition too (at 20 clients, seed 0 is the stage's own federation). Per-seed rows: {NAME}.csv; "
              f"figure: {NAME}.png.")
    args.out.mkdir(parents=True, exist_ok=True)
    io.write_csv(table, args.out / f"{NAME}.csv")
    report = markdown(s, table, points, header)
    io.write_text(report, args.out / f"{NAME}.md")
    io.save_figure(figure(s, order), args.out / f"{NAME}.png")
    print(report)
    print(f"[{NAME}] {wall:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
