"""Stage ``fed_distance`` on tiny params (the session's feature-track run): every table, figure and metric is
written and logged; wall times reach MLflow only."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from stages import layout
from stages.fed_distance import STAGE
from stages.stage import headline_metrics


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
    assert list(full.columns) == list(otdd.columns[:4]) + ["seconds_federated", "seconds_exact", "bytes", "messages"]
    assert (full.seconds_federated > 0).all() and (full.seconds_exact > 0).all()
    assert np.allclose(full.federated, otdd.federated, rtol=1e-9, atol=0)  # the same table, all its digits
    assert metrics["toy"]["seconds_exact_ot_total"] > 0  # MLflow metrics keep the total times
    assert "seconds" not in (out / "metrics.json").read_text()
