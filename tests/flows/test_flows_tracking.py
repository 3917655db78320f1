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


WRITER = """
import sys
from flows import tracking
with tracking.stage_run(sys.argv[1], {"k": sys.argv[1]}, "h") as run:
    run.log_metrics({"score": 1.0})
"""


def test_two_stages_starting_at_once_on_a_fresh_store_both_finish(tmp_path: Path, monkeypatch) -> None:
    """A fresh mlruns.db is created and migrated once, under a lock: two processes that start together both
    log their run, and the store works afterwards (without the lock MLflow's schema migration races)."""
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    db = tmp_path / "mlruns.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env.update(OTFED_HOME=str(tmp_path), PYTHONPATH=str(repo))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, f"stage{i}"], cwd=tmp_path, env=env,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(e[-2000:] for e in errors)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("otfed")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on the runs view
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags["stage"] for r in runs) == ["stage0", "stage1", "stage2"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert Path(exp.artifact_location.removeprefix("file://")) == tmp_path / "mlartifacts"


def test_git_commit_ignores_outputs_and_names_the_experiment_baseline(tmp_path: Path, monkeypatch) -> None:
    """``-dirty`` means the code differs from the commit; DVC's rewrites of outputs and dvc.lock do not
    count. Under ``dvc exp run`` the commit is the experiment's baseline."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    for name in ("dvc.lock", "otfed/x.py", "reports/a.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("1\n")
    git("add", "-A")
    git("-c", "user.email=t@e.org", "-c", "user.name=t", "commit", "-qm", "c")
    sha = git("rev-parse", "HEAD").strip()
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    (tmp_path / "dvc.lock").write_text("2\n")
    (tmp_path / "reports/a.csv").write_text("2\n")
    assert tracking.git_commit(tmp_path) == sha
    (tmp_path / "otfed/x.py").write_text("2\n")
    assert tracking.git_commit(tmp_path) == sha + "-dirty"
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "b" * 40)
    assert tracking.git_commit(tmp_path).startswith("b" * 40)
