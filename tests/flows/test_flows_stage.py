"""The generic stage runner (flows/stage.py): task runners, in-order fan-out, staged outputs, one MLflow run,
errors that lose nothing; and the pipeline flow's DVC command."""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from flows.pipeline import dvc_command
from flows.stage import fan_out, main, run_stage
from otfed.errors import DataFileError
from stages.params import validate_params
from stages.stage import Job, Stage
from stages.noisy_removal import NoisyRemovalParams

PARAMS = {"run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
          "partition": {"federations": {"c": {"scheme": "fedbary_case", "case": 1, "test_samples": 100}}},
          "noisy_removal": {"federations": ["c"], "validation_samples": 50}}


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


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


@pytest.mark.integration
def test_a_stage_runs_blas_on_one_thread_in_every_task_thread(tmp_path: Path, mlflow_uri: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two task threads each calling a BLAS that runs a thread per core oversubscribe the cores (fed_distance's
    jobs ran slower on two threads than on one: bench/blas_threads). Every task thread of a stage sees BLAS
    on one thread — as the Dask workers do — and the process gets its setting back afterwards."""
    from prefect import flow
    from threadpoolctl import threadpool_limits

    from flows import runners

    monkeypatch.chdir(tmp_path)
    p = validate_params(PARAMS)
    stage = Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=("out/reports",),
                  jobs=lambda p, dirs: [Job(f"job {i}", _blas_threads) for i in range(4)],
                  report=lambda p, results, rep, dirs: {"seen": sorted({n for r in results for n in r})})
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(_blas_threads()) == {2}
        metrics = flow(task_runner=runners.task_runner("thread", 2), validate_parameters=False)(
            lambda: run_stage(stage, p))()
        assert metrics == {"seen": [1]}
        assert set(_blas_threads()) == {2}


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
    assert "params.yaml: run.sedd: unknown key; allowed keys here: dask_address, device, max_workers, seed, task_runner" \
        in capsys.readouterr().err
    assert main("noisy_removal", params_path="missing.yaml") == 2
    assert "error: missing.yaml: file not found" in capsys.readouterr().err
    assert main("no_such_stage") == 2
    assert "error: unknown stage 'no_such_stage'; stages: barycenter_valuation, distill" in capsys.readouterr().err
    Path("params.yaml").write_text(json.dumps({k: v for k, v in PARAMS.items() if k != "noisy_removal"}))
    with pytest.raises(Exception, match="noisy_removal: required key is missing"):
        run_stage("noisy_removal", {k: v for k, v in PARAMS.items() if k != "noisy_removal"})
    assert list(Path(".").iterdir()) == [Path("params.yaml")]  # nothing written


def test_pipeline_dvc_command() -> None:
    assert dvc_command() == ["dvc", "repro"]
    assert dvc_command(["fed_distance"], force=True) == ["dvc", "repro", "--force", "fed_distance"]
    assert dvc_command(set_params={"run.seed": "1"}) == ["dvc", "exp", "run", "-S", "run.seed=1"]


def _number(text: str) -> int:
    return int(text)


def test_fan_out_reports_progress_per_finished_task(capsys: pytest.CaptureFixture) -> None:
    fan_out([Job(f"job {i}", _number, dict(text=str(i))) for i in range(3)], label="demo")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[demo] 1/3 tasks · job 0 done · 0:00 elapsed · ETA ")
    assert lines[-1].startswith("[demo] 3/3 tasks · job 2 done")  # the last one always, no ETA
    assert "ETA" not in lines[-1]


def test_a_bad_data_file_is_reported_before_any_server_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.setenv("OTFED_HOME", str(tmp_path))
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "images_mnist.npz").write_bytes(b"PK\x03\x04 truncated")
    Path("params.yaml").write_text(json.dumps({
        "run": PARAMS["run"],
        "partition": {"data_dir": "raw", "federations": {"c": {"scheme": "iid", "dataset": "mnist", "n_clients": 2,
                                                                "samples": 100}}}}))
    assert main("partition") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: raw/images_mnist.npz: not a readable .npz file")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "raw"]  # no .prefect, no outputs


@pytest.mark.integration
def test_a_failing_task_ends_in_one_error_line_naming_it(tmp_path: Path, mlflow_uri: str,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """Through the real Prefect flow (temporary server): the console gets progress lines and one error line
    with the task; the traceback goes to the log file only; previous outputs stay."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OTFED_HOME", str(tmp_path))
    for var in ("PREFECT_HOME", "PREFECT_API_URL", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "PREFECT_LOGGING_LEVEL"):
        monkeypatch.delenv(var, raising=False)
    Path("params.yaml").write_text(json.dumps(PARAMS))
    Path("out/reports").mkdir(parents=True)
    Path("out/reports/old.csv").write_text("kept\n")

    def jobs(p, dirs):
        return [Job("fine", _number, dict(text="1")), Job("client 7", _number, dict(text="seven"))]

    stage = Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=("out/reports",), jobs=jobs,
                  report=lambda p, results, rep, dirs: {})
    assert main(stage, argv=[]) == 1
    err = capsys.readouterr().err
    assert "[noisy_removal] 2 tasks on sequential × 1" in err
    error = [line for line in err.splitlines() if not line.startswith("[noisy_removal]")]
    assert error[0] == "error: ValueError: invalid literal for int() with base 10: 'seven'"
    assert error[1] == "  in task 'client 7'"
    assert error[2].startswith(f"  full log: {tmp_path / '.prefect' / 'logs' / 'noisy_removal.log'}")
    assert "Traceback" not in err
    assert "Traceback" in (tmp_path / ".prefect" / "logs" / "noisy_removal.log").read_text()
    assert Path("out/reports/old.csv").read_text() == "kept\n" and not list(Path("out").glob(".*"))
