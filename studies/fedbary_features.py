"""Study: which features let FedBary see the noise (issue #11, item 1) — PCA-32 vs raw pixels vs a
256-D Gaussian random projection, on the partitions `dvc repro` builds (``data/partitions``).

For each representation, seed 0, FedBary's settings of ``params.yaml`` (S = 50, K = 10, random t):

* client contributions (%) of CIFAR-10 cases 4 (label noise 0/5/10/15/20%) and 5 (feature noise on
  0/5/10/15/20% of the samples) with the server's 300 validation rows as the target, and Spearman's ρ of
  the shares with the planted quality −(share of noisy samples) — 1 = the order the paper expects;
* ROC AUC of the calibrated gradients (eq. 10) against the planted noise on FashionMNIST ``fmnist_clean``
  with 15% label noise and 15% feature noise (std 1 per pixel), every client at that rate;
* the wall time of each FedBary run (one process; the machine is shared, so compare the ratios).

The PCA is fitted on the server's test split (as the stages do), the random projection drawn from the
seed (no data). Run after ``dvc repro partition``:

    python -m studies.fedbary_features            # ≈ 3 minutes on 2 cores
Results: reports/studies/fedbary_features.{csv,md}.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from otfed import io
from otfed.data.corruption import corrupted_federation
from otfed.data.parties import client_sets, project_federation, server_split
from otfed.data.store import load_federation
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.valuation import detection_auc

OUT = Path("reports/studies")
PARTITIONS = Path("data/partitions")
REPRESENTATIONS = {"pca32": (32, 0), "raw": (0, 0), "random_projection256": (0, 256)}


def contributions(name: str, pca: int, random: int, seed: int) -> dict[str, object]:
    """One case: FedBary shares with the validation target, ρ with the planted quality, seconds."""
    fed = project_federation(load_federation(name, PARTITIONS, require_finite=True), pca, seed, random)
    validation, _ = server_split(fed, 300)
    planted = np.array([fed.corrupted[fed.rows(k)].mean() for k in range(fed.n_clients)])
    start = time.perf_counter()
    res = federated_valuation(client_sets(fed), FedBaryConfig(), validation=validation, seed=seed)
    seconds = time.perf_counter() - start
    return dict(experiment=f"contributions {name}", shares=" / ".join(f"{v:.1f}" for v in res.contributions),
                value=float(spearmanr(res.contributions, -planted).statistic), seconds=seconds)


def detection(kind: str, pca: int, random: int, seed: int) -> dict[str, object]:
    """15% noise of ``kind`` on every client of fmnist_clean: ROC AUC of FedBary's calibrated gradients."""
    clean = load_federation("fmnist_clean", PARTITIONS, require_finite=True)
    fed = project_federation(corrupted_federation(clean, kind, 0.15, 1.0, seed), pca, seed, random)
    validation, _ = server_split(fed, 300)
    noisy = np.concatenate([fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)])
    start = time.perf_counter()
    res = federated_valuation(client_sets(fed), FedBaryConfig(), validation=validation, seed=seed, datum_values=True,
                              potential="sinkhorn")
    seconds = time.perf_counter() - start
    g = np.concatenate([res.datum_values[c] for c in fed.client_names])
    return dict(experiment=f"detection {kind} 15%", shares="", value=detection_auc(g, noisy), seconds=seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.fedbary_features", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for label, (pca, random) in REPRESENTATIONS.items():
        for run in ([lambda n=n: contributions(n, pca, random, args.seed) for n in ("case4", "case5")]
                    + [lambda k=k: detection(k, pca, random, args.seed) for k in ("label", "feature")]):
            row = dict(features=label) | run()
            print(row, flush=True)
            rows.append(row)
    table = pd.DataFrame(rows)
    table["metric"] = np.where(table.experiment.str.startswith("contributions"), "spearman_vs_planted", "auc")
    table = table[["features", "experiment", "metric", "value", "shares", "seconds"]]
    OUT.mkdir(parents=True, exist_ok=True)
    io.write_csv(table, OUT / "fedbary_features.csv")
    header = ("# FedBary: which features show the noise\n\n"
              f"`{' '.join(['python -m studies.fedbary_features', *(argv if argv is not None else sys.argv[1:])])}`; "
              "value: Spearman ρ of the client shares with the planted quality (1 = less noise, more value) or "
              "ROC AUC of the calibrated gradients; seconds: one FedBary run (shared machine).")
    io.write_text(f"{header}\n\n{io.markdown_table(table.round(3))}", OUT / "fedbary_features.md")
    print(io.markdown_table(table.round(3)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
