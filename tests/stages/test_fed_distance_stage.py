"""Stage ``fed_distance`` on tiny params (the session's feature-track run): every table, figure and metric is
written and logged; wall times reach MLflow only."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import pytest

from stages import layout
from stages.fed_distance import STAGE
from stages.stage import headline_metrics


@pytest.mark.slow  # reads the feature track run (four stages)
def test_fed_distance_writes_reports_and_logs_them(feature_run: dict[str, Any], tmp_path: Path) -> None:
    metrics = feature_run["metrics"]["fed_distance"]
    mlflow_uri = feature_run["uri"]
    out = feature_run["root"] / layout.FED_DISTANCE_REPORTS
    expected = {"toy_gaussians.csv", "toy_gaussians.md", "toy_time_error.png", "convergence.csv",
                "convergence.png", "otdd_pairs.csv", "otdd_heatmaps.png", "clustering_pairs_distances.csv",
                "clustering_pairs.png", "clustering_ari.csv", "communication.csv", "metrics.json"}
    assert expected <= {p.name for p in out.iterdir()}
    toy = pd.read_csv(out / "toy_gaussians.csv")
    assert set(toy.method) == {"exact_ot", "fedwad_approx", "fedwad_exact_interp"}
    exact = toy[toy.method == "exact_ot"].set_index(["ratio", "n"]).value
    fed = toy[toy.method != "exact_ot"]
    for row in fed.itertuples():  # FedWaD is an upper bound of the exact W (triangle inequality)
        assert row.value >= exact[(row.ratio, row.n)] * (1 - 1e-6)
    # 40 samples leave USPS and FashionMNIST with a one-sample class: reported, not crashed on
    degenerate = pd.read_csv(out / "degenerate_clients.csv")
    assert degenerate.client.tolist() == ["usps", "fashionmnist"]
    assert all("has 1 sample" in reason for reason in degenerate.reason)
    otdd = pd.read_csv(out / "otdd_pairs.csv")
    assert set(otdd.a) | set(otdd.b) == {"mnist", "kmnist"} and len(otdd) == 3  # 1 pair + 2 self-pairs
    written = json.loads((out / "metrics.json").read_text())
    headline = headline_metrics(metrics, STAGE.headline)  # dvc metrics show: the headline numbers
    assert set(written) == set(headline) and written["otdd"]["mean_rel_error"] == headline["otdd"]["mean_rel_error"]
    assert metrics["degenerate_clients"] == 2
    assert written["otdd"]["order_preserved"] is None  # one distance: no order relation to compare
    assert set(metrics["clustering"]["pairs"]) == {"affinity", "knn3"}
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("otfed").experiment_id],
                              "tags.stage = 'fed_distance'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    logged = {a.path.split("/")[-1] for a in client.list_artifacts(runs[0].info.run_id, "reports/fed_distance")}
    assert {"toy_time_error.png", "otdd_heatmaps.png", "clustering_ari.csv"} <= logged
    # the wall times: in the committed tables no more, in MLflow (full tables, the running-time figure) instead
    assert "seconds" not in toy and not {"seconds_federated", "seconds_exact"} & set(otdd)
    timings = {a.path.split("/")[-1] for a in client.list_artifacts(runs[0].info.run_id, "timings")}
    assert {"toy_gaussians.csv", "otdd_pairs.csv", "toy_time.png"} <= timings
    assert "toy_time.png" not in {p.name for p in out.iterdir()}
    full = pd.read_csv(client.download_artifacts(runs[0].info.run_id, "timings/otdd_pairs.csv",
                                                 str(tmp_path)))
    assert list(full.columns) == list(otdd.columns[:5]) + ["seconds_federated", "seconds_exact", "bytes", "messages"]
    assert (full.seconds_federated > 0).all() and (full.seconds_exact > 0).all()
    assert np.allclose(full.federated, otdd.federated, rtol=1e-9, atol=0)  # the same table, all its digits
    assert metrics["toy"]["seconds_exact_ot_total"] > 0  # MLflow metrics keep the total times
    assert "seconds" not in (out / "metrics.json").read_text()


@pytest.mark.slow  # reads the feature track run (four stages)
def test_clustered_fl_trains_within_the_clusters_the_distances_give(feature_run: dict[str, Any]) -> None:
    """FL within clusters (tables 1–5): the clusters used are the ones the stage's own distance matrix gave,
    a cell recomputed with the library gives the same per-client counts, pooled accuracy = Σ correct / Σ
    total, and the uplift is paired by seed (global FedAvg's own uplift is not reported)."""
    from otfed.fl import PersonalizedConfig, per_cluster_accuracy
    from stages.fed_distance import roster

    root = feature_run["root"]
    out = root / layout.FED_DISTANCE_REPORTS
    rows = pd.read_csv(out / "clustered_fl_clients.csv")
    summary = pd.read_csv(out / "clustered_fl.csv")
    matrix = pd.read_csv(out / "clustering_pairs_distances.csv")
    assert set(rows.clustering) == {"global", "affinity", "planted"} and set(rows.seed) == {0, 1}
    aff = rows[(rows.clustering == "affinity") & (rows.algorithm == "fedavg") & (rows.seed == 0)]
    assert list(aff.cluster) == list(matrix.cluster_affinity)
    planted = rows[(rows.clustering == "planted") & (rows.seed == 0) & (rows.algorithm == "fedper")]
    assert list(planted.cluster) == list(matrix.group)
    assert (rows[rows.clustering == "global"].cluster == 0).all()
    # one cell again, straight from the library, on the same data
    import os
    cwd = os.getcwd()
    try:
        os.chdir(root)
        r = roster("pairs", True)
    finally:
        os.chdir(cwd)
    params = feature_run["params"]["fed_distance"]["clustered_fl"]["fl"]
    data = [((c.x, c.y), held) for c, held in zip(r.clients, r.held_out)]
    n_classes = int(max(c.y.max() for c in r.clients)) + 1
    again = per_cluster_accuracy(data, np.asarray(matrix.group), "fedrep", PersonalizedConfig(**params), n_classes,
                                 seed=1)
    cell = rows[(rows.clustering == "planted") & (rows.algorithm == "fedrep") & (rows.seed == 1)]
    assert list(cell.correct) == list(again.correct) and list(cell.total) == list(again.total)
    for r_ in summary.itertuples():
        sub = rows[(rows.clustering == r_.clustering) & (rows.algorithm == r_.algorithm)]
        pooled = sub.groupby("seed").correct.sum() / sub.groupby("seed").total.sum()
        assert r_.accuracy == pytest.approx(pooled.mean(), abs=1e-4)
    base = summary[(summary.clustering == "global") & (summary.algorithm == "fedavg")].iloc[0]
    assert base.uplift_vs_global_fedavg == pytest.approx(0.0, abs=1e-12)
    assert feature_run["metrics"]["fed_distance"]["clustered_fl"]["pairs"]["global_fedavg"] == pytest.approx(
        base.accuracy, abs=1e-4)


@pytest.mark.slow  # reads the feature track run (four stages)
def test_coresets_classify_with_every_clients_labelled_coreset(feature_run: dict[str, Any]) -> None:
    """Coresets + 1-NN (fig. 5 / 12): one row per client, method and seed; held-out counts are the clients'
    validation rows; the summary puts the coreset classifier next to global FedAvg / FedPer / FedRep."""
    from otfed.data.store import VAL, load_federation

    root = feature_run["root"]
    out = root / layout.FED_DISTANCE_REPORTS
    rows = pd.read_csv(out / "coresets_clients.csv")
    fed = load_federation("pairs", root / layout.PARTITIONS)
    sizes = {fed.client_names[k]: len(fed.rows(k, VAL)) for k in range(fed.n_clients)}
    assert set(rows.method) == {"fedwad_coreset", "exact_coreset"} and set(rows.seed) == {0, 1}
    assert all(sizes[c] == t for c, t in zip(rows.client, rows.total))
    assert rows.accuracy.between(0, 1).all() and (rows.w2 > 0).all()
    summary = pd.read_csv(out / "coresets.csv")
    assert {"fedwad_coreset K=3", "exact_coreset K=3", "global fedavg", "global fedper",
            "global fedrep"} == set(summary.method)
    assert (summary.accuracy.between(0, 1)).all()


def test_support_needed_is_the_smallest_support_under_five_percent() -> None:
    from stages.fed_distance import support_needed

    last = pd.DataFrame([dict(dim=d, support=s, interpolation=i, t=t, estimate_rel_error=e) for d, s, i, t, e in [
        (50, 10, "approx", "random", 0.59), (50, 200, "approx", "random", 0.30), (50, 295, "approx", "random", 0.032),
        (50, 300, "approx", "random", 0.019), (50, 300, "approx", 0.5, 0.001), (50, 300, "exact", "random", 0.0),
        (2, 10, "approx", "random", 0.04), (2, 30, "approx", "random", 0.016), (3, 10, "approx", "random", 0.2)]])
    out = support_needed(last)
    assert out["support_needed_d50_below_5pct"] == 295  # not 300 (larger), not the fixed-t or exact runs
    assert out["support_needed_d2_below_5pct"] == 10
    assert np.isnan(out["support_needed_d3_below_5pct"])


@pytest.mark.slow  # reads the feature track run (four stages)
def test_the_support_sweep_reaches_the_report(feature_run: dict[str, Any]) -> None:
    conv = pd.read_csv(feature_run["root"] / layout.FED_DISTANCE_REPORTS / "convergence.csv")
    assert {5, 10, 20} <= set(conv.support)  # sweep S = 5, S = 10, S = n = 20
    final = conv.sort_values("iteration").groupby("setting").tail(1)
    assert final.estimate_rel_error.between(0, 10).all()
    assert "support_needed_d2_below_5pct" in feature_run["metrics"]["fed_distance"]["toy"]


def test_coresets_are_off_unless_configured(tmp_path: Path) -> None:
    """A fed_distance group without ``coresets`` validates and runs no coreset job (its default federations
    need not exist in the user's partition group)."""
    from stages.fed_distance import FedDistanceParams
    from tests.stages.conftest import tiny_params

    group = tiny_params(tmp_path)["fed_distance"]
    group.pop("coresets")
    assert FedDistanceParams.model_validate(group).coresets is None


def test_otdd_without_self_pairs_fills_the_diagonal_with_zero(tmp_path: Path) -> None:
    """``otdd.self_pairs: false`` runs only the i < j sessions: the heatmap matrices get exact zeros on the
    diagonal (OTDD(D, D) = 0), the off-diagonal errors are those of the pairs, and no self-distance metric
    is claimed for sessions that did not run."""
    from contextlib import contextmanager

    from otfed.federation.otdd import client_pairs
    from stages.fed_distance import OTDDParams, Roster, otdd_metrics

    class Out:
        def __init__(self) -> None:
            self.tables: dict[str, pd.DataFrame] = {}
            self.logged: dict[str, float] = {}

        def table(self, frame: pd.DataFrame, name: str, markdown: bool = True) -> None:
            self.tables[name] = frame

        def figure(self, fig: Any, name: str) -> None:
            import matplotlib.pyplot as plt
            plt.close(fig)

        @contextmanager
        def variant(self, name: str, tags: Any = None):
            class Child:
                def log_metrics(inner, values: dict) -> None:
                    self.logged.update(values)
            yield Child()

    names = ["a", "b", "c"]
    pairs = client_pairs(3, include_diagonal=False)
    assert pairs == [(0, 1), (0, 2), (1, 2)]
    exact = {(0, 1): 1.0, (0, 2): 2.0, (1, 2): 4.0}
    fed = {(0, 1): 1.1, (0, 2): 2.0, (1, 2): 3.0}
    results = [dict(a=names[i], b=names[j], federated=fed[i, j], exact=exact[i, j], bytes=10, messages=2)
               for i, j in pairs]
    roster = Roster([type("C", (), {"name": n})() for n in names], np.zeros(3), [], [])
    out = Out()
    summary = otdd_metrics(OTDDParams(self_pairs=False), roster, results, out)
    assert summary["max_rel_error"] == pytest.approx(0.25) and summary["mean_rel_error"] == pytest.approx(0.35 / 3)
    assert not any(key.startswith("self_distance") for key in summary)
    assert summary["order_preserved"] == 1.0  # the order 1 < 2 < 4 is kept by 1.1 < 2.0 < 3.0
    assert len(out.tables["otdd_pairs.csv"]) == 3
