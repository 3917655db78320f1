"""Prefect flow of stage ``barycenter_valuation``: per-case / per-setting tasks; writes reports/valuation.

FedBary §5 (SPEC §3): client contributions for cases 1–5 by FedBary (with and without a server
validation set) next to FedAvg-utility exact Shapley, leave-one-out and Monte-Carlo Shapley (fig. 4), the
barycenter-distance histogram for 4 clean clients + 1 noisy client, datum-level detection of planted
label / feature noise with point-removal curves (fig. 5), and duplication robustness (table 3: a client's
whole dataset or one datum duplicated; exact W next to FedBary's estimate).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import Params, flatten, groups, params_hash
from otfed.data.corruption import add_feature_noise
from otfed.data.store import TRAIN, FederationData, load_federation
from otfed.errors import ConfigError
from otfed.experiments import valuation as exp
from otfed.figures import valuation as figs
from otfed.orchestration import fan_out, stage_flow

contribution_task = task(name="client-contributions", cache_policy=NO_CACHE)(exp.client_contributions)
outlier_task = task(name="outlier-distances", cache_policy=NO_CACHE)(exp.outlier_distances)
detection_task = task(name="detection-setting", cache_policy=NO_CACHE)(exp.detection_setting)
duplication_task = task(name="duplication-robustness", cache_policy=NO_CACHE)(exp.duplication_robustness)


def barycenter_valuation_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("barycenter_valuation", barycenter_valuation, params.run.task_runner, params.run.max_workers)


def barycenter_valuation(params: dict) -> dict:
    """Stage ``barycenter_valuation``: contributions (fig. 4), outlier histogram, detection (fig. 5),
    duplication robustness (table 3)."""
    p = Params.model_validate(params)
    if p.barycenter_valuation is None:
        raise ConfigError("params.yaml: barycenter_valuation: required key is missing")
    check_duplication(p)
    read = groups(p, "run", "barycenter_valuation")
    # FedAvg's torch_threads(1) toggles a process-wide setting; concurrent Prefect tasks would race on it and
    # occasionally train with 2 threads (different float reductions → different accuracies). Pin it once.
    torch.set_num_threads(1)
    bv, seed = p.barycenter_valuation, p.run.seed
    with tracking.stage_run("barycenter_valuation", flatten(read), params_hash(read)) as run, \
            io.staged_directory(bv.out_dir) as out:
        metrics: dict[str, Any] = {}
        metrics["contributions"] = _contributions(p, seed, run, out)
        metrics["outlier"] = _outlier(p, seed, run, out)
        metrics["detection"] = _detection(p, seed, run, out)
        metrics["duplication"] = _duplication(p, seed, run, out)
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics


def _load(name: str, p: Params) -> FederationData:
    return load_federation(name, p.partition.out_dir)


# -------------------------------------------------------------------------------------- contributions
def _contributions(p: Params, seed: int, run: tracking.TrackedRun, out: Path) -> dict:
    bv = p.barycenter_valuation
    assert bv is not None
    cfg = bv.contributions
    config = exp.fedbary_config(bv.fedbary)
    jobs = []
    for name in cfg.federations:
        fed = exp.project_federation(_load(name, p), bv.pca_components, seed)
        validation, _ = exp.server_split(fed, cfg.validation_samples)
        jobs.append(dict(name=name, clients=exp.client_sets(fed), validation=validation, config=config,
                         fedavg_params=cfg.fedavg.model_dump(), permutations=cfg.monte_carlo_permutations, seed=seed))
    rows = [row for rows in fan_out(contribution_task, jobs) for row in rows]
    table = pd.DataFrame(rows)
    run.log_table(table, out / "contributions.csv")
    wide = table.pivot_table(index=["federation", "client"], columns="method", values="percent", sort=False)
    run.log_table(wide[list(exp.CONTRIBUTION_METHODS)].reset_index(), out / "contributions_wide.csv")
    run.log_figure(figs.contributions_figure(table), out / "contributions.png")
    agreement = pd.DataFrame(exp.rank_agreement(rows))
    overall = agreement.groupby("method", sort=False).agg(spearman_vs_exact_shapley=("spearman_vs_exact_shapley", "mean"),
                                                          seconds=("seconds", "sum")).reset_index()
    overall.insert(0, "federation", "all (mean ρ, total s)")
    run.log_table(pd.concat([agreement, overall], ignore_index=True), out / "method_agreement.csv")
    summary: dict[str, Any] = {}
    for name in cfg.federations:
        per = {m: {r["client"]: round(r["percent"], 3) for r in rows if r["federation"] == name and r["method"] == m}
               for m in exp.CONTRIBUTION_METHODS}
        rho = {r.method: r.spearman_vs_exact_shapley for r in agreement[agreement.federation == name].itertuples()}
        summary[name] = {"percent": per, "spearman": rho}
        with run.child(f"contributions/{name}", tags={"federation": name}) as child:
            child.log_metrics({f"{m}.{c}": v for m, d in per.items() for c, v in d.items()} |
                              {f"spearman.{m}": v for m, v in rho.items() if np.isfinite(v)})
    summary["mean_spearman"] = {r.method: r.spearman_vs_exact_shapley for r in overall.itertuples()}
    summary["seconds"] = {r.method: round(r.seconds, 3) for r in overall.itertuples()}
    return summary


# -------------------------------------------------------------------------------------------- outlier
def _outlier(p: Params, seed: int, run: tracking.TrackedRun, out: Path) -> dict:
    bv = p.barycenter_valuation
    assert bv is not None
    cfg = bv.contributions.outlier
    fed = _load(cfg.federation, p)
    rows_k = np.flatnonzero((fed.client == cfg.client) & (fed.split == TRAIN))
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    chosen = np.sort(rng.choice(rows_k, int(np.floor(cfg.fraction * len(rows_k) + 0.5)), replace=False))
    noisy_x = add_feature_noise(fed.x, chosen, cfg.noise_std, rng)  # stored (pixel) space, before PCA
    fed = dataclasses.replace(fed, x=noisy_x.astype(np.float32))
    fed = exp.project_federation(fed, bv.pca_components, seed)
    validation, _ = exp.server_split(fed, bv.contributions.validation_samples)
    rows = fan_out(outlier_task, [dict(clients=exp.client_sets(fed), noisy_client=cfg.client, validation=validation,
                                       config=exp.fedbary_config(bv.fedbary), seed=seed)])[0]
    table = pd.DataFrame(rows)
    run.log_table(table, out / "outlier_distances.csv")
    run.log_figure(figs.outlier_figure(table), out / "outlier_histogram.png")
    summary = {"noisy_client": fed.client_names[cfg.client], "noisy_samples": int(len(chosen))}
    for target, sub in table.groupby("target", sort=False):
        noisy = sub[sub.noisy]
        summary[f"{target}_noisy_is_farthest"] = bool(noisy.farthest.iloc[0])
        summary[f"{target}_noisy_distance"] = float(noisy.distance.iloc[0])
        summary[f"{target}_clean_distance_max"] = float(sub[~sub.noisy].distance.max())
    with run.child("outlier", tags={"federation": cfg.federation}) as child:
        child.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (bool, int, float))})
    return summary


# ------------------------------------------------------------------------------------------ detection
def corrupted_federation(fed: FederationData, kind: str, rate: float, noise_std: float, seed: int) -> FederationData:
    """``fed`` with round(rate · n_k) training rows of every client corrupted (labels flipped or feature
    noise, in the stored feature space), ``corrupted`` set to the ground truth; seeded by (seed, kind, rate)."""
    train = np.flatnonzero(fed.split == TRAIN)
    rng = np.random.default_rng(np.random.SeedSequence([seed, ("label", "feature").index(kind), int(round(rate * 1e4))]))
    n_classes = exp.n_classes_of(fed.y, fed.y_test)
    x, y, mask = exp.plant_noise(fed.x[train], fed.y[train], fed.client[train], kind, rate, noise_std, n_classes, rng)
    new_x, new_y, corrupted = fed.x.astype(np.float64).copy(), fed.y.copy(), np.zeros(len(fed.y), dtype=bool)
    new_x[train], new_y[train], corrupted[train] = x, y, mask
    return dataclasses.replace(fed, x=new_x.astype(np.float32), y=new_y, corrupted=corrupted)


def _detection(p: Params, seed: int, run: tracking.TrackedRun, out: Path) -> dict:
    bv = p.barycenter_valuation
    assert bv is not None
    cfg = bv.detection
    clean = _load(cfg.federation, p)
    config = exp.fedbary_config(bv.fedbary)
    jobs = []
    for kind in cfg.kinds:
        for rate in cfg.rates:
            fed = exp.project_federation(corrupted_federation(clean, kind, rate, cfg.noise_std, seed),
                                         bv.pca_components, seed)
            validation, holdout = exp.server_split(fed, cfg.validation_samples)
            noisy = np.concatenate([fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)])
            jobs.append(dict(kind=kind, rate=rate, clients=exp.client_sets(fed), noisy=noisy, validation=validation,
                             holdout=holdout, config=config, potential=bv.fedbary.potential, knn_k=cfg.knn_k,
                             removal_step=cfg.removal_step, removal_max_fraction=cfg.removal_max_fraction, seed=seed))
    results = fan_out(detection_task, jobs)
    scores = pd.DataFrame([r for s, _ in results for r in s])
    curves = pd.DataFrame([r for _, c in results for r in c])
    run.log_table(scores, out / "detection.csv")
    run.log_table(curves, out / "removal_curves.csv")
    run.log_figure(figs.detection_figure(scores), out / "detection.png")
    run.log_figure(figs.removal_curves_figure(curves), out / "removal_curves.png")
    summary: dict[str, Any] = {}
    for (kind, rate), sub in scores.groupby(["kind", "rate"], sort=False):
        key = f"{kind}_{round(100 * rate)}pct"
        summary[key] = {r.method: {"precision": round(r.precision, 4), "recall": round(r.recall, 4),
                                   "f1": round(r.f1, 4), "flagged": int(r.flagged), "noisy": int(r.noisy)}
                        for r in sub.itertuples()}
        with run.child(f"detection/{key}", tags={"kind": kind, "rate": rate}) as child:
            child.log_metrics({f"{r.method}.{m}": float(getattr(r, m)) for r in sub.itertuples()
                               for m in ("precision", "recall", "f1", "flagged")})
            for method, line in curves[(curves.kind == kind) & (curves.rate == rate)].groupby("method"):
                for r in line.itertuples():
                    child.log_metrics({f"removal_accuracy.{method}": r.accuracy}, step=int(r.removed))
    return summary


# ---------------------------------------------------------------------------------------- duplication
def check_duplication(p: Params) -> None:
    """``barycenter_valuation.duplication`` names a federation with a server test split larger than its
    validation set and a client it has; ConfigError naming the key otherwise (before any work starts)."""
    assert p.barycenter_valuation is not None
    cfg = p.barycenter_valuation.duplication
    key = "barycenter_valuation.duplication"
    known = p.partition.federations
    if cfg.federation not in known:
        raise ConfigError(f"{key}.federation: unknown federation {cfg.federation!r}; defined: {sorted(known)}")
    spec = known[cfg.federation]
    if spec.scheme == "by_dataset":
        raise ConfigError(f"{key}.federation: {cfg.federation!r} has scheme 'by_dataset' (no server test split)")
    if cfg.validation_samples >= spec.test_samples:
        raise ConfigError(f"{key}.validation_samples ({cfg.validation_samples}) must be smaller than "
                          f"partition.federations.{cfg.federation}.test_samples ({spec.test_samples})")
    if cfg.client >= getattr(spec, "n_clients", 0):
        raise ConfigError(f"{key}.client: {cfg.client} ≥ n_clients of {cfg.federation!r} "
                          f"({getattr(spec, 'n_clients', 0)})")


def _duplication(p: Params, seed: int, run: tracking.TrackedRun, out: Path) -> dict:
    bv = p.barycenter_valuation
    assert bv is not None
    cfg = bv.duplication
    fed = exp.project_federation(_load(cfg.federation, p), bv.pca_components, seed)
    validation, _ = exp.server_split(fed, cfg.validation_samples)
    rows, spread = fan_out(duplication_task, [dict(
        clients=exp.client_sets(fed), validation=validation, client=cfg.client, copies=cfg.copies,
        datum_copies=cfg.datum_copies, config=exp.fedbary_config(bv.fedbary), potential=bv.fedbary.potential,
        seed=seed, seed_repeats=cfg.seed_repeats)])[0]
    table = pd.DataFrame(rows)
    run.log_table(table, out / "duplication.csv")
    run.log_figure(figs.duplication_figure(table, spread), out / "duplication.png")
    dataset = table[table.experiment == "dataset"]
    summary: dict[str, Any] = {"federation": cfg.federation, "client": fed.client_names[cfg.client],
                               "exact_w": float(table.exact_w.iloc[0])}
    for stats, sub in dataset.groupby("stats", sort=False):
        for col in ("exact_w", "fedbary_validation", "fedbary_barycenter"):
            summary[f"dataset_{stats}_max_abs_rel_change_{col}"] = float(sub[f"{col}_rel_change"].abs().max())
    for r in table[table.experiment == "datum"].itertuples():
        for col in ("exact_w", "fedbary_validation", "fedbary_barycenter"):
            summary[f"datum_{r.datum}_rel_change_{col}"] = float(getattr(r, f"{col}_rel_change"))
        summary[f"datum_{r.datum}_calibrated_gradient"] = float(r.datum_value)
    for mode, values in spread.items():
        if len(values) > 1:
            summary[f"seed_cv_{mode}"] = float(np.std(values, ddof=1) / np.mean(values))
    with run.child("duplication", tags={"federation": cfg.federation}) as child:
        child.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)})
    return summary
