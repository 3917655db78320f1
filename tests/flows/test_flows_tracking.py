"""MLflow tracking: tags, params, metrics, nested runs and logged tables/figures land in the store."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import pandas as pd

from flows import tracking


def test_stage_run_logs_everything(mlflow_uri: str, tmp_path: Path) -> None:
    assert tracking.tracking_uri() == mlflow_uri
    with tracking.stage_run("demo", {"a.b": "1", "c": "x"}, "abc123") as run:
        run.log_metrics({"score": 0.5, "bad": float("nan")})
        run.log_table(pd.DataFrame({"x": [1, 2]}), tmp_path / "t.csv")
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        run.log_figure(fig, tmp_path / "f.png")
        with run.child("variant-A", tags={"method": "A"}) as child:
            child.log_metrics({"score": 0.7}, step=3)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    parent = client.get_run(run.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["stage"] == "demo"
    assert parent.data.tags["params_hash"] == "abc123"
    assert parent.data.tags["git_commit"]
    assert parent.data.params == {"a.b": "1", "c": "x"}
    assert parent.data.metrics == {"score": 0.5}  # NaN is not logged
    artifacts = {a.path for a in client.list_artifacts(run.run_id, tmp_path.name)}
    assert {f"{tmp_path.name}/t.csv", f"{tmp_path.name}/t.md", f"{tmp_path.name}/f.png"} <= artifacts
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run.run_id}'")
    assert len(kids) == 1 and kids[0].data.metrics["score"] == 0.7 and kids[0].data.tags["variant"] == "variant-A"
    assert (tmp_path / "t.md").read_text().startswith("| x |")


def test_failed_stage_marks_run_failed(mlflow_uri: str) -> None:
    try:
        with tracking.stage_run("demo", {}, "h") as run:
            raise KeyError("boom")
    except KeyError:
        pass
    status = mlflow.MlflowClient(tracking_uri=mlflow_uri).get_run(run.run_id).info.status
    assert status == "FAILED"
