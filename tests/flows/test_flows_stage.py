"""The generic stage runner (flows/stage.py): task runners, in-order fan-out, staged outputs, one MLflow run,
errors that lose nothing; and the pipeline flow's DVC command."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pipeline import dvc_command
from flows.stage import fan_out, main, run_stage, task_runner
from otfed.errors import DataFileError
from stages.params import validate_params
from stages.stage import Job, Stage
from stages.noisy_removal import NoisyRemovalParams

PARAMS = {"run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
          "partition": {"federations": {"c": {"scheme": "fedbary_case", "case": 1, "test_samples": 100}}},
          "noisy_removal": {"federations": ["c"], "validation_samples": 50}}


def test_task_runner_kinds() -> None:
    assert isinstance(task_runner("thread", 3), ThreadPoolTaskRunner)
    assert isinstance(task_runner("sequential", 3), ThreadPoolTaskRunner)
    with pytest.raises(ValueError, match="thread, sequential"):
        task_runner("process", 1)


def test_fan_out_outside_a_flow_runs_in_order_without_a_server() -> None:
    def square(x: int) -> int:
        return x * x

    assert fan_out([Job(f"square {i}", square, dict(x=i)) for i in range(5)]) == [0, 1, 4, 9, 16]


def _stage(out: str, fail: bool) -> Stage:
    """A stage shaped like the real ones, writing one table and one file into two staged folders."""
    def jobs(p, dirs):
        return [Job(f"job {i}", lambda i: (dirs[f"{out}/data"] / f"{i}.txt").write_text(str(i)) and i, dict(i=i))
                for i in range(3)]

    def report(p, results, rep, dirs):
        rep.table(pd.DataFrame({"i": results}), "rows.csv")
        if fail:
            raise DataFileError("data/raw/x.npz: broken on purpose")
        with rep.variant("v/1", tags={"k": "v"}) as child:
            child.log_metrics({"score": 1.0})
        return {"n": len(results), "nested": {"total": float(sum(results))}}

    return Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=(f"{out}/reports", f"{out}/data"),
                 jobs=jobs, report=report, reads=("partition.federations",))


def test_run_stage_swaps_outputs_in_and_logs_one_run(tmp_path: Path, mlflow_uri: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = validate_params(PARAMS)
    metrics = run_stage(_stage("out", fail=False), p)
    assert metrics == {"n": 3, "nested": {"total": 3.0}}
    assert json.loads(Path("out/reports/metrics.json").read_text()) == metrics
    assert pd.read_csv("out/reports/rows.csv").i.tolist() == [0, 1, 2]
    assert sorted(f.name for f in Path("out/data").iterdir()) == ["0.txt", "1.txt", "2.txt"]
    assert not list(Path("out").glob(".*"))  # no staging folder left behind
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("otfed").experiment_id])
    parent = next(r for r in runs if r.data.tags.get("stage") == "noisy_removal")
    child = next(r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id)
    assert parent.info.status == child.info.status == "FINISHED"
    assert parent.data.metrics == {"n": 3.0, "nested.total": 3.0} and child.data.metrics == {"score": 1.0}
    assert parent.data.params["noisy_removal.federations"] == '["c"]'
    assert parent.data.params["partition.federations.c.case"] == "1"  # the keys it declares it reads


def test_a_failing_stage_leaves_the_previous_outputs_untouched(tmp_path: Path, mlflow_uri: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = validate_params(PARAMS)
    run_stage(_stage("out", fail=False), p)
    before = {f: f.read_bytes() for f in Path("out").rglob("*") if f.is_file()}
    with pytest.raises(DataFileError, match="broken on purpose"):
        run_stage(_stage("out", fail=True), p)
    assert {f: f.read_bytes() for f in Path("out").rglob("*") if f.is_file()} == before
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    statuses = sorted(r.info.status for r in client.search_runs(
        [client.get_experiment_by_name("otfed").experiment_id], "tags.stage = 'noisy_removal'"))
    assert statuses == ["FAILED", "FINISHED"]


def test_a_missing_group_and_bad_params_exit_2_naming_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text(json.dumps({**PARAMS, "run": {"sedd": 1}}))
    assert main("noisy_removal") == 2
    assert "params.yaml: run.sedd: unknown key; allowed keys here: device, max_workers, seed, task_runner" \
        in capsys.readouterr().err
    assert main("no_such_stage", params_path="missing.yaml") == 2
    assert "missing.yaml: file not found" in capsys.readouterr().err
    Path("params.yaml").write_text(json.dumps({k: v for k, v in PARAMS.items() if k != "noisy_removal"}))
    with pytest.raises(Exception, match="noisy_removal: required key is missing"):
        run_stage("noisy_removal", {k: v for k, v in PARAMS.items() if k != "noisy_removal"})
    assert list(Path(".").iterdir()) == [Path("params.yaml")]  # nothing written


def test_pipeline_dvc_command() -> None:
    assert dvc_command() == ["dvc", "repro"]
    assert dvc_command(["fed_distance"], force=True) == ["dvc", "repro", "--force", "fed_distance"]
    assert dvc_command(set_params={"run.seed": "1"}) == ["dvc", "exp", "run", "-S", "run.seed=1"]
