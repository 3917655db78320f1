"""Stages ``barycenter_valuation`` and ``noisy_removal`` on tiny params, checked against independent truths:
contributions sum to 100 %, exact Shapley is efficient (Σ φ = u(N) − u(∅), recomputed here), a client
whose every sample carries heavy feature noise is the farthest from the barycenter, feature-noise recall
is high, removal never drops more than was flagged, duplicating a client's dataset leaves POT's exact W
unchanged, and every table / figure reaches MLflow (the stages' outputs: the session's feature-track run)."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import ot
import pandas as pd
from scipy import stats
import pytest

from flows.stage import run_stage
from otfed.data.corruption import corrupted_federation, noisy_client_federation
from otfed.data.parties import client_sets, project_federation, server_split
from otfed.data.store import load_federation
from otfed.errors import ConfigError
from otfed.federation.otdd import augmented_measure
from otfed.fl import FedAvgConfig, fedavg_accuracy
from stages import layout
from stages.barycenter_valuation import CONTRIBUTION_METHODS, DETECTION_METHODS
from stages.params import validate_params
from tests.stages.conftest import FEDAVG, feature_params

def valuation_params(root: Path) -> dict:
    return feature_params(root)


def _timings(uri: str, stage: str, name: str, into: Path) -> pd.DataFrame:
    """The full table ``name`` (wall times included) the stage logged to MLflow under ``timings/``."""
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("otfed").experiment_id], f"tags.stage = '{stage}'")[0]
    return pd.read_csv(client.download_artifacts(run.info.run_id, f"timings/{name}", str(into)))


def _logged(uri: str, stage: str) -> set[str]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("otfed").experiment_id], f"tags.stage = '{stage}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    folders = {a.path for a in client.list_artifacts(run_id, "reports") if a.is_dir}
    return {a.path.split("/")[-1] for d in folders for a in client.list_artifacts(run_id, d)}


@pytest.mark.slow  # reads the feature track run (four stages)
def test_barycenter_valuation_stage(feature_run: dict[str, Any], tmp_path: Path) -> None:
    metrics = feature_run["metrics"]["barycenter_valuation"]
    mlflow_uri, root = feature_run["uri"], feature_run["root"]
    out = root / layout.VALUATION_REPORTS
    expected = {"contributions.csv", "contributions.md", "contributions_wide.csv", "contributions.png",
                "method_agreement.csv", "outlier_distances.csv", "outlier_histogram.png", "detection.csv",
                "detection.png", "removal_curves.csv", "removal_curves.png", "duplication.csv", "duplication.md",
                "duplication.png", "metrics.json"}
    assert expected <= {p.name for p in out.iterdir()}
    assert {"contributions.png", "detection.csv", "removal_curves.png", "duplication.csv", "duplication.png",
            "metrics.json"} <= _logged(mlflow_uri, "barycenter_valuation")

    contrib = pd.read_csv(out / "contributions.csv")
    assert set(contrib.method) == set(CONTRIBUTION_METHODS) and set(contrib.federation) == {"c1", "c5"}
    shares = contrib[contrib.method != "leave_one_out"]  # LOO values can sum to ≈ 0: shares undefined (NaN)
    assert np.allclose(shares.groupby(["federation", "seed", "method"]).percent.sum(), 100.0)
    case1 = contrib[(contrib.federation == "c1") & contrib.method.str.startswith("fedbary")]
    assert case1.percent.between(15, 25).all()  # same distribution, same size → ≈ 20 % each
    # exact Shapley is efficient: Σ φ_i = u(all) − u(∅), recomputed here with the same FedAvg utility
    fed = project_federation(load_federation("c5", root / layout.PARTITIONS), 8, 0)
    validation, _ = server_split(fed, 60)
    clients = client_sets(fed)
    full = fedavg_accuracy([(c.x, c.y) for c in clients], (validation.x, validation.y), 10,
                           FedAvgConfig(**FEDAVG, hidden=[]), 0)
    empty = fedavg_accuracy([], (validation.x, validation.y), 10, FedAvgConfig(**FEDAVG, hidden=[]), 0)
    phi = contrib[(contrib.federation == "c5") & (contrib.method == "exact_shapley") & (contrib.seed == 0)].value
    assert phi.sum() == pytest.approx(full - empty, abs=1e-9)
    agreement = pd.read_csv(out / "method_agreement.csv")
    exact_rows = agreement[(agreement.method == "exact_shapley") & (agreement.federation == "c5")]
    assert exact_rows.spearman_vs_exact_shapley.iloc[0] == pytest.approx(1.0)
    # ρ with the planted noise (case 5: 0/5/10/15/20 % noisy), recomputed with SciPy from the table, per seed;
    # the reported mean ± CI is Student t over the seeds (SciPy's t.interval)
    per_seed = pd.read_csv(out / "method_agreement_seeds.csv")
    assert set(contrib.seed) == set(per_seed.seed) == {0, 1}
    for seed in (0, 1):
        sub = contrib[(contrib.federation == "c5") & (contrib.method == "fedbary_validation") & (contrib.seed == seed)]
        rho = stats.spearmanr(sub.percent, -sub.planted_noise).statistic
        mine = per_seed[(per_seed.federation == "c5") & (per_seed.method == "fedbary_validation")
                        & (per_seed.seed == seed)].spearman_vs_planted.iloc[0]
        assert mine == pytest.approx(rho, abs=1e-9)
    rhos = per_seed[(per_seed.federation == "c5") & (per_seed.method == "fedbary_validation")].spearman_vs_planted
    row = agreement[(agreement.federation == "c5") & (agreement.method == "fedbary_validation")].iloc[0]
    low, high = stats.t.interval(0.95, len(rhos) - 1, loc=rhos.mean(), scale=stats.sem(rhos))
    assert row.spearman_vs_planted == pytest.approx(rhos.mean(), abs=1e-4)
    if np.isfinite(high):
        assert row.spearman_vs_planted_ci95 == pytest.approx((high - low) / 2, rel=1e-3, abs=1e-6)
    assert agreement[agreement.federation == "c1"].spearman_vs_planted.isna().all()  # case 1: nothing planted
    # wall times: not in the committed tables, in the MLflow run's full tables
    assert "seconds" not in contrib and "seconds" not in agreement
    full = _timings(mlflow_uri, "barycenter_valuation", "contributions.csv", tmp_path)
    assert list(full.columns) == list(contrib.columns) + ["seconds"] and (full.seconds >= 0).all()
    assert full.groupby(["federation", "seed", "method"]).seconds.nunique().eq(1).all()  # one time per method run

    outlier = pd.read_csv(out / "outlier_distances.csv")
    bary = outlier[outlier.target == "barycenter"]
    assert bary.loc[bary.distance.idxmax(), "client"] == "client_04"  # every sample of client 4 has heavy noise
    assert metrics["outlier"]["barycenter_noisy_is_farthest"] is True

    detection = pd.read_csv(out / "detection.csv")
    assert set(detection.method) == set(DETECTION_METHODS)
    assert (detection.noisy == 5 * round(0.3 * 60)).all()  # every client corrupted at 30 %
    assert (detection.true_positives <= np.minimum(detection.flagged, detection.noisy)).all()
    random_ = detection[detection.method == "random"]
    assert (random_.flagged == random_.noisy).all()
    feature = detection[(detection.kind == "feature") & (detection.method == "fedbary")].iloc[0]
    assert feature.recall >= 0.8  # N(0, 3²) pixel noise: far from the clean images
    assert feature.auc >= 0.9 and detection.auc.between(0, 1).all()
    assert detection[detection.method == "random"].auc.between(0.25, 0.75).all()
    # DP FedBary (same setting as the feature-noise detection cell): its plain run is that cell's FedBary run
    dp = pd.read_csv(out / "privacy_dp_detection.csv")
    plain = dp[dp.epsilon.isna()].iloc[0]
    assert plain.auc == pytest.approx(feature.auc, abs=1e-12)
    noisy_rows = dp[dp.epsilon.notna()]
    assert sorted(noisy_rows.epsilon) == [1.0, np.inf]
    assert (noisy_rows.releases == 2 * 3 + 1).all()  # 2K + 1 releases per client, K = 3 (FEDBARY)
    one = noisy_rows[noisy_rows.epsilon == 1.0].iloc[0]
    assert 0.9 <= one.epsilon_spent <= 1.0 and one.distance_rel_error > 0
    assert (out / "privacy_dp_detection.png").exists()
    assert {"privacy_dp_detection.csv", "privacy_dp_detection.png"} <= _logged(mlflow_uri, "barycenter_valuation")
    assert metrics["privacy"]["feature_auc_no_dp"] == pytest.approx(round(feature.auc, 4))
    curves = pd.read_csv(out / "removal_curves.csv")
    first = curves[curves.fraction == 0].groupby(["kind", "rate"]).accuracy.nunique()
    assert (first == 1).all()  # nothing removed yet: every method refits the same model
    written = json.loads((out / "metrics.json").read_text())
    assert written["detection"]["feature_30pct"]["fedbary"]["auc"] == pytest.approx(feature.auc, abs=1e-4)

    dup = pd.read_csv(out / "duplication.csv")
    same = dup[(dup.experiment == "dataset") & (dup.stats == "original")]
    assert list(same.copies) == [1, 2, 3] and list(same.atoms) == [50, 100, 150]
    # independent truth: POT's exact W between client 1's augmented data (×1) and the validation set
    fed = project_federation(load_federation("c1", root / layout.PARTITIONS), 8, 0)
    validation, _ = server_split(fed, 60)
    P, Q = augmented_measure(client_sets(fed)[1]), augmented_measure(validation)
    w2 = ot.emd2(P.weights, Q.weights, ot.dist(P.support, Q.support), numItermax=10**8)
    assert np.allclose(same.exact_w, np.sqrt(w2), rtol=1e-9)
    assert (same.fedbary_validation_rel_change.abs() < 1e-8).all()
    assert (same.fedbary_barycenter_rel_change.abs() < 1e-8).all()
    datum = dup[dup.experiment == "datum"]
    assert list(datum.datum) == ["most_valuable", "most_harmful"] and (datum.atoms == 54).all()
    assert (datum.exact_w_rel_change.abs() > 1e-6).all()
    assert (datum.exact_wp_change >= datum.wp_change_first_order_bound - 1e-9).all()
    assert metrics["duplication"]["dataset_original_max_abs_rel_change_exact_w"] < 1e-9


@pytest.mark.slow  # reads the feature track run (four stages)
def test_corruption_is_seeded_and_counted(feature_run: dict[str, Any]) -> None:
    fed = load_federation("fclean", feature_run["root"] / layout.PARTITIONS)
    a = corrupted_federation(fed, "label", 0.3, 1.0, seed=0)
    b = corrupted_federation(fed, "label", 0.3, 1.0, seed=0)
    assert np.array_equal(a.y, b.y) and np.array_equal(a.corrupted, b.corrupted)
    assert np.array_equal(a.corrupted, a.y != fed.y)  # flips always change the label, nothing else changes
    assert np.array_equal(a.x, fed.x)
    for k in range(fed.n_clients):
        assert a.corrupted[fed.rows(k)].sum() == round(0.3 * len(fed.rows(k)))
    f = corrupted_federation(fed, "feature", 0.3, 3.0, seed=0)
    assert np.array_equal(f.y, fed.y)
    assert np.array_equal(np.any(f.x != fed.x, axis=1), f.corrupted)
    one = noisy_client_federation(fed, 2, 0.5, 3.0, seed=0)  # the outlier histogram's one noisy client
    assert np.array_equal(one.y, fed.y)
    assert np.array_equal(np.any(one.x != fed.x, axis=1), one.corrupted)
    assert one.corrupted.sum() == one.corrupted[fed.rows(2)].sum() == round(0.5 * len(fed.rows(2)))


@pytest.mark.slow  # reads the feature track run (four stages)
def test_noisy_removal_stage(feature_run: dict[str, Any], tmp_path: Path) -> None:
    metrics = feature_run["metrics"]["noisy_removal"]
    mlflow_uri, root = feature_run["uri"], feature_run["root"]
    out = root / layout.REMOVAL_REPORTS
    assert {"removal.csv", "removal.md", "removal_clients.csv", "removal_budgets.csv", "removal_summary.csv",
            "removal.png", "metrics.json"} <= {p.name for p in out.iterdir()}
    assert {"removal.csv", "removal.png"} <= _logged(mlflow_uri, "noisy_removal")
    table = pd.read_csv(out / "removal.csv")
    clients = pd.read_csv(out / "removal_clients.csv")
    budgets = pd.read_csv(out / "removal_budgets.csv")
    truth = load_federation("fnoisy", root / layout.PARTITIONS)
    assert list(table.seed) == [0, 1]
    for seed, row in table.set_index("seed").iterrows():
        mine = clients[clients.seed == seed]
        assert row.noisy == int(truth.corrupted.sum()) == mine.noisy.sum()
        assert (mine.removed_flagged <= mine.flagged).all()
        assert (mine.removed_flagged <= np.floor(0.4 * mine.n)).all()  # max_remove_fraction caps the g > 0 rule
        assert (mine.removed_flagged_noisy <= np.minimum(mine.removed_flagged, mine.noisy)).all()
        assert row.removed_flagged == mine.removed_flagged.sum()
        # the budget rule: every client drops ⌊b·n⌋, b the budget with the best *validation* accuracy
        cand = budgets[budgets.seed == seed]
        best = cand.sort_values(["validation_accuracy", "budget"], ascending=[False, True]).iloc[0]
        assert row.budget == best.budget and row.accuracy_budget == best.test_accuracy
        assert (mine.removed_budget == np.floor(row.budget * mine.n).astype(int)).all()
        assert row.removed_budget == mine.removed_budget.sum() == best.removed
        # FedAvg is trained once per kept set: nothing removed (budget 0) is the "before" model
        assert cand[cand.budget == 0.0].test_accuracy.iloc[0] == row.accuracy_before
        assert 0.0 <= row.auc <= 1.0
        # the calibrated rule: flags above the threshold, capped like g > 0; its false-positive rates recomputed
        assert row.alpha == 0.05 and np.isfinite(row.threshold_calibrated)
        assert (mine.removed_calibrated == np.minimum(mine.flagged_calibrated, np.floor(0.4 * mine.n))).all()
        assert row.removed_calibrated == mine.removed_calibrated.sum()
        clean = mine.n - mine.noisy
        assert row.fpr_calibrated == pytest.approx(
            (mine.flagged_calibrated - mine.flagged_calibrated_noisy).sum() / clean.sum())
        assert row.fpr_flagged == pytest.approx((mine.flagged - mine.flagged_noisy).sum() / clean.sum())
        untouched = mine[mine.noisy == 0]
        assert len(untouched) >= 1 and row.fpr_calibrated_clean_clients == pytest.approx(
            untouched.flagged_calibrated.sum() / untouched.n.sum())
        assert 0.0 <= row.accuracy_calibrated <= 1.0
    # mean ± 95% CI over the seeds, and paired gains, recomputed with SciPy
    summary = pd.read_csv(out / "removal_summary.csv").iloc[0]
    gains = table.accuracy_budget - table.accuracy_before
    low, high = stats.t.interval(0.95, 1, loc=gains.mean(), scale=stats.sem(gains))
    assert summary.gain_budget == pytest.approx(gains.mean(), abs=1e-4)
    if np.isfinite(high) and high > low:
        assert summary.gain_budget_ci95 == pytest.approx((high - low) / 2, rel=1e-3)
    assert "fedbary_seconds" not in table  # a wall time: MLflow only
    full = _timings(mlflow_uri, "noisy_removal", "removal.csv", tmp_path)
    assert list(full.columns) == list(table.columns) + ["fedbary_seconds", "calibrated_seconds"]
    assert (full.fedbary_seconds > 0).all() and (full.calibrated_seconds > 0).all()
    assert metrics["fnoisy"]["accuracy_before"] == pytest.approx(table.accuracy_before.mean(), abs=1e-4)


def test_valuation_groups_are_checked(tmp_path: Path) -> None:
    params = valuation_params(tmp_path)
    validate_params(params)
    bad = copy.deepcopy(params)
    bad["noisy_removal"]["federations"] = ["nope"]
    with pytest.raises(ConfigError, match=r"noisy_removal.federations\[0\]: unknown federation 'nope'"):
        validate_params(bad)
    bad = copy.deepcopy(params)
    bad["barycenter_valuation"]["detection"]["validation_samples"] = 500
    with pytest.raises(ConfigError, match="barycenter_valuation.detection.federation: validation_samples"):
        validate_params(bad)
    bad = copy.deepcopy(params)
    bad["barycenter_valuation"]["duplication"]["copies"] = [1, 0]
    with pytest.raises(ConfigError, match=r"barycenter_valuation.duplication.copies\[1\]"):
        validate_params(bad)
    for key, value, message in (("federation", "nope", "duplication.federation: unknown federation 'nope'"),
                                ("client", 5, "duplication.client: 5 ≥ n_clients"),
                                ("validation_samples", 150, "duplication.validation_samples")):
        bad = copy.deepcopy(params)
        bad["barycenter_valuation"]["duplication"][key] = value
        with pytest.raises(ConfigError, match=message):
            run_stage("barycenter_valuation", bad)  # checked before any work (no partition files exist here)
    del params["noisy_removal"]
    with pytest.raises(ConfigError, match="noisy_removal: required key is missing"):
        run_stage("noisy_removal", params)
