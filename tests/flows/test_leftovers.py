"""What a killed stage leaves (flows/leftovers.py): cleaned at the start of *any* stage, by ``otfed doctor --fix``
and by ``otfed repro`` — never a live stage's, never another host's.

The leftovers are planted as a SIGKILLed stage leaves them: a staging folder and its owner record naming a process
that has exited (a real process, started and reaped here: its pid and start time are real), the previous outputs
stranded in ``.<name>.old`` by a kill between the two renames of the swap, an MLflow run left RUNNING. The owners
that must be respected are real too: a live ``sleep`` (its pid and start time), a record from another host.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import mlflow
import pandas as pd
import psutil
import pytest
import yaml
from typer.testing import CliRunner

from flows import leftovers, tracking
from flows.cli import app
from flows.stage import run_stage
from otfed import io
from stages.noisy_removal import NoisyRemovalParams
from stages.params import validate_params
from stages.stage import Job, Stage

REPO = Path(__file__).resolve().parents[2]
PARAMS = {"run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
          "partition": {"federations": {"c": {"scheme": "fedbary_case", "case": 1, "test_samples": 100}}},
          "noisy_removal": {"federations": ["c"], "validation_samples": 50}}


def _exited() -> tuple[int, float]:
    """The pid and start time of a process that has run and exited (reaped): a stage killed by SIGKILL."""
    proc = subprocess.Popen(["true"])
    started = psutil.Process(proc.pid).create_time()
    proc.wait()
    return proc.pid, started


@pytest.fixture
def live():
    """A live process (pid, start time), stopped after the test."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc.pid, psutil.Process(proc.pid).create_time()
    finally:
        proc.kill()
        proc.wait()


def _record(final: str, stage: str, pid: int, started: float, host: str | None = None) -> None:
    path = leftovers.owner_file(final)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": stage, "host": host or socket.gethostname(), "pid": pid,
                                "started": started}))


def _staging(final: str, content: str = "half-written") -> Path:
    staging = leftovers.staging_folder(final)
    staging.mkdir(parents=True)
    (staging / "model.bin").write_text(content)
    return staging


def _tiny_stage() -> Stage:
    """Stage Y: a stage shaped like the real ones (outputs of its own), cheap to run in-process."""
    def jobs(p, dirs):
        return [Job("job", lambda: 1, {}, key="job")]

    def report(p, results, rep, dirs):
        rep.table(pd.DataFrame({"x": [1]}), "rows.csv")
        return {"n": len(results)}

    return Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=("out/reports",), jobs=jobs,
                 report=report, reads=("partition.federations",))


def test_the_start_of_any_stage_cleans_what_killed_stages_left_and_keeps_what_live_ones_own(
        tmp_path: Path, mlflow_uri: str, monkeypatch: pytest.MonkeyPatch, live,
        capsys: pytest.CaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    dead_pid, dead_started = _exited()
    # distill was SIGKILLed while building its reports
    dead_staging = _staging("reports/distill")
    _record("reports/distill", "distill", dead_pid, dead_started)
    # train_teachers was SIGKILLed between its swap's two renames: models/text is gone, its last outputs in .old
    old = leftovers.old_folder("models/text")
    old.mkdir(parents=True)
    (old / "teacher.bin").write_text("the previous, committed teacher")
    _staging("models/text", "the new teacher, never recorded")
    _record("models/text", "train_teachers", dead_pid, dead_started)
    # a staging folder left by the code before owner records
    orphan = _staging("reports/valuation")
    # partition's record names a live pid that is now another process (recycled: another start time)
    recycled = _staging("reports/partition")
    _record("reports/partition", "partition", live[0], live[1] - 1000.0)
    # fed_distance is running right now in another process; estimate_bias on another host of a shared disk
    running = _staging("reports/fed_distance")
    _record("reports/fed_distance", "fed_distance", *live)
    remote = _staging("reports/bias")
    _record("reports/bias", "estimate_bias", dead_pid, dead_started, host="another-host")
    # the MLflow runs: one of the dead distill process (RUNNING for ever), one of the live process
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    exp = client.create_experiment("otfed")
    host = socket.gethostname()
    dead_run = client.create_run(exp, tags={**dict(zip(tracking.OWNER, (host, str(dead_pid), repr(dead_started)))),
                                            "mlflow.note.content": "Students for KNOT."}).info.run_id
    live_run = client.create_run(exp, tags=dict(zip(tracking.OWNER, (host, str(live[0]), repr(live[1]))))
                                 ).info.run_id

    run_stage(_tiny_stage(), validate_params(PARAMS))  # stage Y starts: noisy_removal, none of the above

    assert not dead_staging.exists() and not leftovers.owner_file("reports/distill").exists()
    assert (tmp_path / "models/text/teacher.bin").read_text() == "the previous, committed teacher"
    assert not old.exists() and not leftovers.staging_folder("models/text").exists()
    assert not leftovers.owner_file("models/text").exists()
    assert not orphan.exists() and not recycled.exists()
    assert (running / "model.bin").exists() and leftovers.read_owner("reports/fed_distance").pid == live[0]
    assert (remote / "model.bin").exists() and leftovers.owner_file("reports/bias").exists()
    assert (tmp_path / "out/reports/rows.csv").exists()  # stage Y itself ran and swapped its outputs in
    assert not leftovers.owner_file("out/reports").exists()  # and removed its own record
    said = capsys.readouterr().err.splitlines()
    assert f"[noisy_removal] removed reports/.distill.staging (left by stage distill, pid {dead_pid}, gone)" in said
    assert (f"[noisy_removal] restored models/text from models/.text.old (left by stage train_teachers, pid "
            f"{dead_pid}, gone; killed mid-swap)") in said
    assert "[noisy_removal] removed reports/.valuation.staging (no owner recorded)" in said
    assert not [line for line in said if ".owner" in line or "fed_distance" in line or "bias" in line]
    closed, kept = client.get_run(dead_run), client.get_run(live_run)
    assert (closed.info.status, kept.info.status) == ("KILLED", "RUNNING")
    note = closed.data.tags["mlflow.note.content"]
    assert note.startswith("Students for KNOT.\n\nMarked KILLED by the start of stage noisy_removal")
    assert f"pid {dead_pid} on {host}" in note and note.endswith("before it could end the run.")


def test_a_stage_refuses_to_build_an_output_a_live_process_is_building(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       live) -> None:
    monkeypatch.chdir(tmp_path)
    staging = _staging("reports/distill")
    _record("reports/distill", "distill", *live)
    with pytest.raises(leftovers.OutputBusy) as caught:
        with leftovers.owning("distill", ["reports/distill"]):
            pytest.fail("a second owner was admitted")
    assert str(caught.value) == (f"reports/distill: stage distill (pid {live[0]}) is building it now; wait for it "
                                 f"to finish, or stop it (kill {live[0]}) and run this stage again")
    assert (staging / "model.bin").exists() and leftovers.read_owner("reports/distill").pid == live[0]


def test_owning_records_this_process_for_the_block_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    me = psutil.Process()
    with leftovers.owning("distill", ["reports/distill", "data/x"]) as owner:
        for final in ("reports/distill", "data/x"):
            assert leftovers.read_owner(final) == owner
        assert (owner.pid, owner.started, owner.host) == (os.getpid(), me.create_time(), socket.gethostname())
        assert leftovers.stale(["reports/distill", "data/x"]) == []  # this live process's own: not stale
    assert not leftovers.owner_file("reports/distill").exists() and not leftovers.owner_file("data/x").exists()


def test_the_leftovers_are_named_as_staged_directory_names_them(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The staging and previous-outputs folders the cleaner looks for are the ones ``otfed.io.staged_directory``
    makes (read from its renames, not from a copy of its naming)."""
    final = tmp_path / "reports" / "distill"
    final.mkdir(parents=True)
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(io.os, "replace", lambda src, dst: renames.append((Path(src), Path(dst))) or
                        real_replace(src, dst))
    with io.staged_directory(final) as staging:
        (staging / "a").write_text("new")
    assert renames == [(final, leftovers.old_folder(final)), (leftovers.staging_folder(final), final)]


def _plant_dead_distill(client) -> tuple[Path, str, int]:
    pid, started = _exited()
    staging = _staging("reports/distill")
    _record("reports/distill", "distill", pid, started)
    exp = client.create_experiment("otfed")
    run_id = client.create_run(exp, tags=dict(zip(tracking.OWNER, (socket.gethostname(), str(pid),
                                                                     repr(started))))).info.run_id
    return staging, run_id, pid


def test_doctor_names_the_leftovers_and_fix_cleans_them(tmp_path: Path, mlflow_uri: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An up-to-date ``dvc repro`` runs no stage: ``otfed doctor`` says what is left, ``--fix`` cleans it."""
    monkeypatch.chdir(tmp_path)
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    staging, run_id, pid = _plant_dead_distill(client)
    report = CliRunner().invoke(app, ["doctor"])
    line = next(out for out in report.output.splitlines() if out.split(":")[0].endswith(" leftovers"))
    assert line == (f"info  leftovers: reports/.distill.staging (left by stage distill, pid {pid}, gone); MLflow "
                    f"run {run_id} left RUNNING by a process that is gone — the next stage cleans them, or now: "
                    "otfed doctor --fix")
    assert staging.exists() and client.get_run(run_id).info.status == "RUNNING"  # only reported

    fixed = CliRunner().invoke(app, ["doctor", "--fix"])
    line = next(out for out in fixed.output.splitlines() if out.split(":")[0].endswith(" leftovers"))
    assert line == (f"ok    leftovers: removed reports/.distill.staging (left by stage distill, pid {pid}, gone); "
                    f"MLflow run {run_id} marked KILLED")
    assert not staging.exists() and not leftovers.owner_file("reports/distill").exists()
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["otfed.end_note"].startswith("Marked KILLED by otfed "
                                                                                      "doctor --fix")
    again = CliRunner().invoke(app, ["doctor"])
    assert "ok    leftovers: none" in again.output.splitlines()


def test_repro_cleans_the_leftovers_even_when_dvc_runs_no_stage(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import flows.cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(yaml.safe_load((REPO / "params.yaml").read_text())))
    pid, started = _exited()
    staging = _staging("data/text_bias")
    _record("data/text_bias", "estimate_bias", pid, started)
    calls = []
    monkeypatch.setattr(flows.cli.subprocess, "call", lambda cmd: calls.append(cmd) or 0)  # dvc: all up to date
    result = CliRunner().invoke(app, ["repro"])
    assert result.exit_code == 0 and calls and calls[0][1:] == ["repro"]
    assert not staging.exists() and not leftovers.owner_file("data/text_bias").exists()
    assert f"removed data/.text_bias.staging (left by stage estimate_bias, pid {pid}, gone)" in result.output
