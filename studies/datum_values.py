"""Study: how converged are FedBary's datum values, and how often does a flagging rule flag clean data?

Part ``convergence`` (issue #34.3). The datum values (calibrated gradients, FedBary eq. 10) are those of the
entropic dual potential f (ε = 0.1 · mean cost) of each client's label-augmented measure P_i against its last
η_{Q_i}. Per client, three computations of the same f:

* ``old`` — the rule before issue #34: POT's ``ot.bregman.sinkhorn_log``, stopping once its column-marginal error
  ||Pᵀ1 − b||₂ < 1e-6 (at most 20,000 iterations);
* ``new`` — :func:`otfed.valuation.calibrated.datum_values` as it is now (Newton on the semi-dual, stopping on the
  potential's remaining change ≤ 1e-9 · mean cost);
* ``reference`` — POT's ``sinkhorn_log`` run to a column-marginal error < 1e-12 (independent of ``new``).

Reported: max |values − reference| / max |reference| for old and new, and the seconds each took. Two settings:
the 3-client × 60-point federation of :func:`~otfed.federation.fedbary.federated_valuation`'s docstring (2-D,
2 classes, S = 30, 10 iterations, no validation set) and one seed of stage ``noisy_removal``'s federation
``fmnist_label_noise`` (5 clients × 400, 256-D random projection, S = 50, 10 iterations, the server's 500
validation rows as Q — params.yaml's settings) — the stage-sized case, where only the first ``--stage-clients``
clients get the (slow) reference.

Part ``detection`` (issue #34.4). Gaussian classes in 8-D (3 classes, class means 3 apart on random axes, unit
noise), 6 clients × 150 rows, the server's clean validation set of 300 rows; clients 4–6 have 40% of their labels
flipped to another class, clients 1–3 are clean. Per seed, FedBary with the server's validation set: per client the
datum values g; the rules

* ``g > 0`` — FedBary's (:func:`~otfed.valuation.calibrated.flag_noisy`);
* ``calibrated α`` — :func:`~otfed.federation.fedbary.calibrated_detection`: the server splits its validation
  set (stratified) into a reference half (Q) and a calibration half, runs the calibration half through the same
  session as one more (clean) client, and flags a client's datum when its value exceeds the conformal (1 − α)
  quantile of the calibration half's values (α = 0.05, 0.10; one session, both thresholds) — ``score="raw"``;
* ``calibrated α, standardised`` — the same on each party's values standardised, (g − mean) / std: the default
  ``score`` of :func:`~otfed.federation.fedbary.calibrated_detection`.

Reported per rule over the seeds: the false-positive rate on the clean clients' rows (flagged / rows) and on the
worst clean client of each seed, the
true-positive rate on the noisy clients' flipped rows and the false-positive rate on their unflipped rows, as
mean ± 95% CI (Student t over seeds), and the ROC AUC of g on the noisy clients.

    python -m studies.datum_values                  # both parts (≈ 3–5 minutes on 2 shared cores)
    python -m studies.datum_values --part convergence --stage-clients 1
    python -m studies.datum_values --part detection --seeds 10
    python -m studies.datum_values --part detection --seeds 6 --separation 1.5     # overlapping classes
    python -m studies.datum_values --part detection --seeds 6 --calibration-fraction 0.25   # 75 calibration rows
    python -m studies.datum_values --part regime --seeds 5

Part ``regime``: the same rules on small parties (6 × 60 rows, 4-D, 3 classes 4 apart, the server's 90 rows), with
every party's class proportions the same (``balanced``) or drawn row by row (``random``), at S = 20 and S = 60; and
every calibrated rule also on per-party standardised values ((g − mean) / std).
Results: reports/studies/datum_values_convergence.csv, datum_values_detection.csv, datum_values_regime.csv,
datum_values.md (a variant's
detection table: datum_values_detection_sep…_val…_cal….csv, and printed).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ot
import pandas as pd
import yaml

from otfed.data.parties import client_sets, project_federation, server_split
from otfed.data.store import load_federation
from otfed.federation import LabelledData
from otfed.federation.fedbary import (BaryClient, BaryServer, FedBaryConfig, calibrated_detection, fedbary,
                                      validation_target)
from otfed.metrics import mean_confidence_interval
from otfed.ot import Measure, cost_matrix
from otfed.valuation.calibrated import calibrated_gradient, calibrated_threshold, datum_values, flag_noisy
from otfed.valuation.detection import detection_auc

OUT = Path("reports/studies")
NAME = "datum_values"


# ------------------------------------------------------------------------------------------- convergence
def pot_values(private: Measure, reference: Measure, stop: float, max_iter: int) -> tuple[np.ndarray, int]:
    """Calibrated gradients from POT's log-domain Sinkhorn potential f = ε log u (ε = 0.1 · mean cost), stopped at
    a column-marginal error < ``stop``; also the iterations run (POT checks every 10th)."""
    M = cost_matrix(private.support, reference.support, 2)
    eps = 0.1 * float(M.mean())
    with np.errstate(over="ignore"):
        _, log = ot.bregman.sinkhorn_log(private.weights, reference.weights, M, eps, numItermax=max_iter,
                                         stopThr=stop, log=True, warn=False)
    return calibrated_gradient(eps * np.asarray(log["log_u"])), 10 * len(log["err"])


def session_parties(datasets: list[LabelledData], config: FedBaryConfig, validation: LabelledData | None,
                    seed: int) -> list[BaryClient]:
    """The clients of ``federated_valuation(datasets, config, validation, seed)`` (seeded alike) after the session."""
    seeds = np.random.SeedSequence(seed).spawn(len(datasets) + 1)
    clients = [BaryClient.from_data(d, config, np.random.default_rng(s)) for d, s in zip(datasets, seeds[:-1])]
    target = validation_target(validation, datasets[0], clients[0].dim, config)
    fedbary(clients, BaryServer(config, np.random.default_rng(seeds[-1]), target=target))
    return clients


def convergence_rows(setting: str, clients: list[BaryClient], with_reference: int) -> list[dict[str, Any]]:
    rows = []
    for k, client in enumerate(clients):
        P, Q = client._measure, client.eta_q  # the study reads the client's own state (no message involved)
        start = time.perf_counter()
        new, report = datum_values(P, Q, with_convergence=True)
        new_s = time.perf_counter() - start
        start = time.perf_counter()
        old, old_iter = pot_values(P, Q, 1e-6, 20_000)
        old_s = time.perf_counter() - start
        row = dict(setting=setting, client=client.name, n=P.n, atoms=Q.n, dim=P.dim, old_seconds=old_s,
                   old_iterations=old_iter, new_seconds=new_s, new_newton_steps=report.iterations,
                   new_criterion=report.criterion, new_converged=report.converged,
                   old_error=float("nan"), new_error=float("nan"), reference_iterations=0)
        if k < with_reference:
            ref, ref_iter = pot_values(P, Q, 1e-12, 2_000_000)
            scale = float(np.abs(ref).max())
            row.update(old_error=float(np.abs(old - ref).max()) / scale, new_error=float(np.abs(new - ref).max()) / scale,
                       reference_iterations=ref_iter)
        rows.append(row)
        print(row, file=sys.stderr, flush=True)
    return rows


def docstring_federation() -> list[LabelledData]:
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 30)
    return [LabelledData(f"client_{i}", rng.normal(size=(60, 2)) + 3.0 * y[:, None] + shift, y)
            for i, shift in enumerate([0.0, 0.0, 2.0])]


def stage_federation(params: str, seed: int) -> tuple[list[LabelledData], LabelledData, FedBaryConfig]:
    """Stage ``noisy_removal``'s first federation, projected and split as the stage does (its params.yaml group)."""
    nr = yaml.safe_load(Path(params).read_text())["noisy_removal"]
    fed = load_federation(nr["federations"][0], "data/partitions", require_finite=True)
    fed = project_federation(fed, int(nr.get("pca_components", 0)), seed, int(nr.get("random_projection", 0)))
    validation, _ = server_split(fed, int(nr["validation_samples"]))
    return client_sets(fed), validation, FedBaryConfig(**nr["fedbary"])


def convergence(params: str, stage_clients: int) -> pd.DataFrame:
    rows = convergence_rows("3 clients × 60, 2-D", session_parties(
        docstring_federation(), FedBaryConfig(support_size=30, iterations=10), None, 0), with_reference=3)
    clients, validation, config = stage_federation(params, 0)
    rows += convergence_rows("noisy_removal fmnist_label_noise seed 0", session_parties(clients, config, validation, 0),
                             with_reference=stage_clients)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------- detection
def gaussian_classes(rng: np.random.Generator, means: np.ndarray, n: int,
                     proportions: str = "balanced") -> tuple[np.ndarray, np.ndarray]:
    """n rows of unit-variance Gaussian classes; ``balanced``: classes in turn (every party the same proportions),
    ``random``: each row's class drawn uniformly (proportions vary from party to party)."""
    y = np.arange(n) % len(means) if proportions == "balanced" else rng.integers(0, len(means), n)
    return means[y] + rng.standard_normal((n, means.shape[1])), y


def detection_seed(seed: int, alphas: tuple[float, ...], flip: float = 0.4, n_clients: int = 6, n: int = 150,
                   d: int = 8, classes: int = 3, validation_rows: int = 300, separation: float = 3.0,
                   calibration_fraction: float = 0.5, support: int = 50, proportions: str = "balanced",
                   standardised: bool = False) -> list[dict[str, Any]]:
    """One seed of the detection setting (module docstring): a row per (rule, client kind). ``separation``: the
    class means' distance from the origin (orthogonal directions); ``support``: FedBary's S; ``proportions``: as
    :func:`gaussian_classes`; ``standardised``: also the calibrated rules on each party's values standardised
    ((g − mean) / std within the party)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 34]))
    means = separation * np.linalg.qr(rng.standard_normal((d, classes)))[0].T
    datasets, flipped = [], []
    for k in range(n_clients):
        x, y = gaussian_classes(rng, means, n, proportions)
        bad = np.zeros(n, dtype=bool)
        if k >= n_clients // 2:
            bad[rng.choice(n, int(round(flip * n)), replace=False)] = True
            y = y.copy()
            y[bad] = (y[bad] + rng.integers(1, classes, bad.sum())) % classes
        datasets.append(LabelledData(f"client_{k}", x, y))
        flipped.append(bad)
    validation = LabelledData("validation", *gaussian_classes(rng, means, validation_rows, proportions))
    # the library's rule (calibrated_detection): the same session gives g > 0's values and every α's threshold
    det = calibrated_detection(datasets, FedBaryConfig(support_size=support, iterations=10), validation,
                               alpha=alphas[0], calibration_fraction=calibration_fraction, seed=seed)
    g = [det.values[d.name] for d in datasets]
    rules: dict[str, list[np.ndarray]] = {"g > 0": [flag_noisy(v) for v in g]}
    for alpha in alphas:
        tau = calibrated_threshold(det.calibration_values, alpha)
        rules[f"calibrated α = {alpha:g}"] = [v > tau for v in g]
        if standardised:  # the library's default score, as calibrated_detection computed it
            tau = calibrated_threshold(det.calibration_scores, alpha)
            rules[f"calibrated α = {alpha:g}, standardised"] = [det.scores[d.name] > tau for d in datasets]
    noisy_g = np.concatenate(g[n_clients // 2:])
    noisy_mask = np.concatenate(flipped[n_clients // 2:])
    auc = detection_auc(noisy_g, noisy_mask)
    rows = []
    for rule, flags in rules.items():
        clean = np.concatenate(flags[:n_clients // 2])
        noisy_flags = np.concatenate(flags[n_clients // 2:])
        rows.append(dict(seed=seed, rule=rule, fpr_clean_clients=float(clean.mean()),
                         fpr_worst_clean_client=float(max(f.mean() for f in flags[:n_clients // 2])),
                         tpr_noisy_rows=float(noisy_flags[noisy_mask].mean()),
                         fpr_noisy_clients_clean_rows=float(noisy_flags[~noisy_mask].mean()),
                         flagged_clean_client_0=int(flags[0].sum()), auc_noisy_clients=auc))
    return rows


REGIME = dict(d=4, n=60, validation_rows=90, separation=2.0 * np.sqrt(2.0), n_clients=6)


def regime(seeds: int) -> pd.DataFrame:
    """The calibrated rule outside the detection setting's comfort: small parties (6 × 60 rows, 4-D, 3 classes, the
    server's 90 rows, 45 of them for calibration), class proportions the same for every party or drawn per row,
    S = 20 (a third of a client) or 60 (a client's size); each with the per-party standardised variant."""
    rows = []
    for proportions in ("balanced", "random"):
        for support in (20, 60):
            for seed in range(seeds):
                for r in detection_seed(seed, (0.05, 0.10), support=support, proportions=proportions,
                                        standardised=True, **REGIME):
                    rows.append(dict(proportions=proportions, support=support) | r)
    return pd.DataFrame(rows)


def summary(table: pd.DataFrame) -> pd.DataFrame:
    out = []
    keys = [k for k in ("proportions", "support") if k in table] + ["rule"]
    for key, sub in table.groupby(keys, sort=False):
        row: dict[str, Any] = dict(zip(keys, key if isinstance(key, tuple) else (key,))) | dict(seeds=len(sub))
        for c in ("fpr_clean_clients", "fpr_worst_clean_client", "tpr_noisy_rows", "fpr_noisy_clients_clean_rows", "auc_noisy_clients"):
            row[c], row[f"{c}_ci95"] = mean_confidence_interval(sub[c].to_numpy(dtype=np.float64))
        out.append(row)
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "convergence", "detection", "regime"), default="all")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--stage-clients", type=int, default=1, help="stage-sized clients that get the slow reference")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--separation", type=float, default=3.0, help="detection: class means' distance from the origin")
    ap.add_argument("--validation-rows", type=int, default=300, help="detection: the server's validation rows")
    ap.add_argument("--calibration-fraction", type=float, default=0.5, help="detection: their share for calibration")
    args = ap.parse_args(argv)
    setting = dict(separation=args.separation, validation_rows=args.validation_rows,
                   calibration_fraction=args.calibration_fraction)
    variant = setting != dict(separation=3.0, validation_rows=300, calibration_fraction=0.5)
    tag = f"_sep{args.separation:g}_val{args.validation_rows}_cal{args.calibration_fraction:g}" if variant else ""
    OUT.mkdir(parents=True, exist_ok=True)
    lines = [f"# {NAME}", "", "Generated by `python -m studies.datum_values` (see the module docstring).", ""]
    if args.part in ("all", "convergence"):
        conv = convergence(args.params, args.stage_clients)
        conv.to_csv(OUT / f"{NAME}_convergence.csv", index=False)
        lines += ["## Convergence of the datum values", "", conv.to_markdown(index=False, floatfmt=".3g"), ""]
    if args.part in ("all", "detection"):
        table = pd.DataFrame([r for s in range(args.seeds)
                              for r in detection_seed(s, (0.05, 0.10), standardised=True, **setting)])
        table.to_csv(OUT / f"{NAME}_detection{tag}.csv", index=False)
        lines += ["## False- and true-positive rates of the flagging rules", "", f"Setting: {setting}", "",
                  summary(table).to_markdown(index=False, floatfmt=".3f"), ""]
    if args.part in ("all", "regime"):
        table = regime(min(args.seeds, 5))
        table.to_csv(OUT / f"{NAME}_regime.csv", index=False)
        lines += ["## The calibrated rule's regime: class proportions and support size", "",
                  f"Setting: {REGIME}, FedBary K = 10, {min(args.seeds, 5)} seeds", "",
                  summary(table).to_markdown(index=False, floatfmt=".3f"), ""]
    if args.part == "all":
        (OUT / f"{NAME}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
