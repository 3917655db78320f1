"""The generic stage runner (flows/stage.py): task runners, in-order fan-out, staged outputs, one MLflow run,
errors that lose nothing; and the pipeline flow's DVC command."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest

from flows.pipeline import dvc_command
from flows.stage import fan_out, main, run_stage
from otfed.errors import DataFileError
from stages.params import validate_params
from stages.stage import Job, Results, Stage
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
        return [Job(f"job {i}", lambda i: (dirs[f"{out}/data"] / f"{i}.txt").write_text(str(i)) and i, dict(i=i),
                    key=("job", i)) for i in range(3)]

    def report(p, results, rep, dirs):
        assert list(results) == [("job", 0), ("job", 1), ("job", 2)] and results[("job", 2)] == 2
        rep.table(pd.DataFrame({"i": results.of("job")}), "rows.csv")
        if fail:
            raise DataFileError("data/raw/x.npz: broken on purpose")
        with rep.variant("v/1", tags={"k": "v"}) as child:
            child.log_metrics({"score": 1.0})
        return {"n": len(results), "nested": {"total": float(sum(results.values()))}}

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
                  report=lambda p, results, rep, dirs: {"seen": sorted({n for r in results.values() for n in r})})
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


# ------------------------------------------------------------------------- the one entry point: the cli
def test_the_command_line_takes_a_stage_name_and_verbose(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """``python -m flows.stage <name> [--verbose]`` (every dvc.yaml cmd) hands the name to :func:`main`; no name,
    two names or another option → one ``error:`` line with the usage and the stages, exit 2, nothing run."""
    import flows.stage
    from stages.params import stages

    calls = []
    monkeypatch.setattr(flows.stage, "main", lambda stage, argv=None: calls.append((stage, argv)) or 0)
    assert flows.stage.cli(["distill"]) == 0 and flows.stage.cli(["--verbose", "partition"]) == 0
    assert calls == [("distill", ["distill"]), ("partition", ["--verbose", "partition"])]
    for argv in ([], ["distill", "partition"], ["distill", "--params", "x.yaml"]):
        assert flows.stage.cli(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: usage: python -m flows.stage <stage> [--verbose]")
        assert err[0].endswith(f"stages: {', '.join(sorted(stages()))}")
    assert len(calls) == 2


def test_the_command_line_names_an_unknown_stage(capsys: pytest.CaptureFixture) -> None:
    from flows.stage import cli

    assert cli(["nosuchstage"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown stage 'nosuchstage'; stages: ")


# ------------------------------------------------------------------------------------------ job keys
def test_results_find_each_job_by_key_in_job_order() -> None:
    jobs = [Job("gate sa", _number, dict(text="1"), key=("gate", "sa")),
            Job("sa/global", _number, dict(text="2"), key=("global", "sa")),
            Job("sa/Sinkhorn-E", _number, dict(text="3"), key=("student", "sa", "Sinkhorn-E")),
            Job("sa/Entropy-E", _number, dict(text="4"), key=("student", "sa", "Entropy-E")),
            Job("erc/Sinkhorn-E", _number, dict(text="5"), key=("student", "erc", "Sinkhorn-E")),
            Job("outlier", _number, dict(text="6"), key="outlier"),
            Job("plain", _number, dict(text="7"))]  # no key: its name
    results = Results.of_jobs(jobs, fan_out(jobs), "distill")
    assert list(results) == [job.key for job in jobs] and list(results.values()) == [1, 2, 3, 4, 5, 6, 7]
    assert results[("gate", "sa")] == 1 and results["outlier"] == 6 and results["plain"] == 7
    assert results.of("student") == [3, 4, 5] and results.of("student", "sa") == [3, 4]
    assert results.of("outlier") == [6] and results.of("student", "nli") == [] and len(results.of()) == 7
    assert results.by("student", "sa") == {"Sinkhorn-E": 3, "Entropy-E": 4}
    assert results.by("student") == {("sa", "Sinkhorn-E"): 3, ("sa", "Entropy-E"): 4, ("erc", "Sinkhorn-E"): 5}
    with pytest.raises(KeyError, match=r"stage distill: no job has the key \('gate', 'nli'\) \(kinds of key: 'gate', "
                                       r"'global', 'student', 'outlier', 'plain'\)"):
        results[("gate", "nli")]
    assert ("gate", "nli") not in results and results.get(("gate", "nli")) is None
    with pytest.raises(TypeError):
        results[("gate", "sa")] = 0  # read-only
    more = Results.of_jobs([Job("fl", _number, dict(text="8"), key=("fl", 0))], [8], "distill")
    assert list((results + more).values()) == [1, 2, 3, 4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match=r"stage distill: two results have the key 'outlier'"):
        results + Results([("outlier", 0)], "distill")
    with pytest.raises(TypeError):
        Job("unhashable", _number, key=["pair", "a"])


def _duplicate_stage(first: list[Job], more: list[Job] | None = None) -> Stage:
    return Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=("out/reports",),
                 jobs=lambda p, dirs: first, report=lambda p, results, rep, dirs: {"n": len(results)},
                 followups=None if more is None else (lambda p, results: more))


def test_two_jobs_with_one_key_stop_the_stage_before_any_runs(tmp_path: Path, mlflow_uri: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A key given twice — among the first jobs, or a follow-up repeating a first job's key — is a ValueError naming
    the stage, the key and both jobs; no job of that list runs and no output is swapped in."""
    monkeypatch.chdir(tmp_path)
    p = validate_params(PARAMS)
    ran: list[str] = []

    def job(name: str, key: Any) -> Job:
        return Job(name, lambda: ran.append(name), key=key)

    with pytest.raises(ValueError, match=r"^stage noisy_removal: two jobs have the key \('pair', 'c1', 'c3'\) "
                                         r"\('pair c1\|c3' and 'again c1\|c3'\)"):
        run_stage(_duplicate_stage([job("pair c1|c3", ("pair", "c1", "c3")), job("other", ("pair", "c1", "c2")),
                                    job("again c1|c3", ("pair", "c1", "c3"))]), p)
    assert ran == [] and not Path("out/reports").exists() and not list(Path("out").glob(".*"))
    with pytest.raises(ValueError, match=r"^stage noisy_removal: two jobs have the key 'outlier' \('outlier' and "
                                         r"'fl outlier'\)"):
        run_stage(_duplicate_stage([job("outlier", None)], [job("fl outlier", "outlier")]), p)
    assert ran == ["outlier"] and not Path("out/reports").exists()  # the first jobs ran; the follow-ups did not
    assert run_stage(_duplicate_stage([job("a", ("x", 1))], [job("b", ("x", 2))]), p) == {"n": 2}
