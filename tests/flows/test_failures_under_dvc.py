"""Nothing is lost under DVC: a bad param, a bad ``dvc exp run -S`` value, Ctrl-C and SIGTERM leave the
committed outputs byte-identical, no staging folder, no orphan process; queued experiments log into the
user's MLflow store.

Each test runs real ``dvc`` commands in a throw-away git + DVC repository holding a copy of this project's
code, its ``data/raw`` and the ``partition`` stage exactly as ``dvc.yaml`` declares it (``persist: true``
outs), on tiny params. Each waits on events (a command's exit, the stage's "tasks on" line, its processes gone)
under ceilings that only catch a hang (tests/ceilings.py).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import psutil
import pytest

from flows import prefect_server
from tests.ceilings import ceiling, completed, finished, wait_until
from tests.integration.support import REPO, clean_env, git, stage_repository
from tests.stages.conftest import tiny_params

pytestmark = pytest.mark.integration

# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine: idle, a DVC command that
# runs the stage takes ~10-30 s, a stopped stage exits within seconds
DVC_S = 600
STOP_S = 300
MEETING = REPO / "tests" / "integration" / "meeting_stage.py"  # holds a stage still once its MLflow run is open


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """``dvc ARGS`` run to its exit in ``repo`` (a hang fails at ``ceiling(DVC_S)``)."""
    return completed(["dvc", *args], f"`dvc {' '.join(args)}` to exit", DVC_S, cwd=repo, env=clean_env())


def _snapshot(repo: Path) -> dict[str, bytes]:
    """Every file of the stage's outputs, by path, with its bytes."""
    files = {}
    for folder in ("reports/partition", "data/partitions"):
        for path in sorted((repo / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(repo))] = path.read_bytes()
    return files


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC repository with the partition stage run once and committed."""
    repo = tmp_path_factory.mktemp("project")
    shutil.copytree(REPO / "data" / "raw", repo / "data" / "raw")
    params = tiny_params(repo)
    params["partition"]["data_dir"] = "data/raw"
    stage_repository(repo, "partition", params)
    done = _dvc(repo, "repro")
    assert done.returncode == 0, done.stderr
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "partition run")
    return repo


def _runs(repo: Path) -> list:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlruns.db'}")
    exp = client.get_experiment_by_name("otfed")
    return client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])


def test_a_bad_param_through_dvc_repro_loses_nothing(project: Path) -> None:
    before = _snapshot(project)
    params = project / "params.yaml"
    good = params.read_text()
    params.write_text(good.replace("samples_per_client: 40", "samples_per_client: -4", 1))
    try:
        run = _dvc(project, "repro")
    finally:
        params.write_text(good)
    assert run.returncode != 0
    assert "error: params.yaml: partition.federations.bench.samples_per_client: Input should be greater than " \
           "or equal to 10 (got -4)" in run.stdout + run.stderr
    assert _snapshot(project) == before  # DVC did not delete the outputs (persist: true)


def test_a_bad_exp_run_value_leaves_params_yaml_as_it_was(project: Path) -> None:
    before, params = _snapshot(project), (project / "params.yaml").read_bytes()
    run = _dvc(project, "exp", "run", "-S", "partition.federations.bench.samples_per_client=-3")
    assert run.returncode != 0
    assert "restored as it was before this experiment's -S values" in run.stdout + run.stderr
    assert (project / "params.yaml").read_bytes() == params  # bytes, not git status (DVC keeps the stat)
    assert _snapshot(project) == before


def _start_repro(repo: Path) -> tuple[subprocess.Popen, list[str]]:
    """``dvc repro --force`` in its own session; returns once the stage has started its tasks."""
    proc = subprocess.Popen(["dvc", "repro", "--force"], cwd=repo, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=clean_env(), start_new_session=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "tasks on" in line:
            return proc, lines
    pytest.fail("the stage never started its tasks:\n" + "".join(lines))


def _session_processes(sid: int) -> list[str]:
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(p.pid) == sid:
                left.append(" ".join(p.info["cmdline"] or []))
        except (ProcessLookupError, PermissionError):
            continue
    return left


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_a_stage_killed_mid_run_loses_nothing_and_leaves_no_process(project: Path, how: str) -> None:
    before = _snapshot(project)
    proc, lines = _start_repro(project)
    if how == "ctrl-c":  # the terminal sends SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
    else:  # SIGTERM to the stage process alone (a scheduler / OOM-killer style stop)
        # the Python process itself: without $SHELL, DVC runs the command through /bin/sh (dash), which
        # stays as its parent with the same command line
        stage = next(c for c in psutil.Process(proc.pid).children(recursive=True)
                     if "flows.stage partition" in " ".join(c.cmdline()) and c.name().startswith("python"))
        stage.send_signal(signal.SIGTERM)
    out, _ = finished(proc, f"`dvc repro` to exit after the {how}", STOP_S)
    text = "".join(lines) + out
    assert proc.returncode != 0
    assert f"error: partition interrupted ({'SIGINT' if how == 'ctrl-c' else 'SIGTERM'}); previous outputs kept" \
        in text
    assert _snapshot(project) == before
    assert not list(project.glob("**/.*.staging")), "a staging folder was left behind"
    wait_until(lambda: not _session_processes(proc.pid), "the stage's processes to exit (one left is an orphan, "
               "e.g. a Dask worker)", STOP_S, poll=0.2,
               details=lambda: "\n".join(_session_processes(proc.pid)))
    assert _runs(project)[0].info.status == "KILLED"  # the MLflow run does not stay RUNNING


def test_a_stage_whose_dvc_is_killed_stops_and_swaps_nothing_in(project: Path) -> None:
    """SIGTERM to ``dvc`` alone (``kill <pid>``, a CI cancel): DVC exits at once and reports failure; the stage
    it started must stop too — as interrupted, naming its caller — and must not swap in outputs of the new
    params afterwards (they would not match ``dvc.lock``). Nothing is left running."""
    before = _snapshot(project)
    params = project / "params.yaml"
    good = params.read_text()
    params.write_text(good.replace("seed: 0", "seed: 5", 1))  # outputs that would differ from the committed ones
    try:
        proc = subprocess.Popen(["dvc", "repro"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=clean_env(), start_new_session=True)
        assert proc.stdout is not None
        lines: list[str] = []
        for line in proc.stdout:
            lines.append(line)
            if "tasks on" in line:
                break
        else:
            pytest.fail("the stage never started its tasks:\n" + "".join(lines))
        proc.send_signal(signal.SIGTERM)  # dvc alone, not its group
        out, _ = finished(proc, "`dvc repro`'s output to close (the stage still writing to it)", STOP_S)
        wait_until(lambda: not _session_processes(proc.pid), "the stage's processes to exit after dvc died",
                   STOP_S, poll=0.2, details=lambda: "\n".join(_session_processes(proc.pid)))
    finally:
        params.write_text(good)
    text = "".join(lines) + out
    assert proc.returncode != 0
    assert "error: partition interrupted (its caller dvc (pid" in text, text[-3000:]
    assert _snapshot(project) == before, "outputs were swapped in after dvc had reported failure"
    assert not list(project.glob("**/.*.staging")), "a staging folder was left behind"
    assert _runs(project)[0].info.status == "KILLED"


def test_a_stage_killed_by_sigkill_leaves_no_server_and_the_next_run_cleans_up(project: Path,
                                                                               tmp_path: Path) -> None:
    """SIGKILL (the OOM killer) runs no handler: the project's Prefect server must still not outlive the stage
    by more than its idle time (its keeper sees its only user gone), and the next run marks the killed run
    KILLED in MLflow and removes a staging folder left behind; the committed outputs stay byte-identical
    throughout. The stage is held still once its MLflow run is open (tests/integration/meeting_stage.py waiting
    for a second run that never comes), so the kill always lands mid-run."""
    before = _snapshot(project)
    shutil.copy2(MEETING, project / MEETING.name)
    (tmp_path / "meeting").mkdir()
    env = clean_env(MEETING_DIR=str(tmp_path / "meeting"), MEETING_SIZE="2", MEETING_TIMEOUT_S=str(ceiling(STOP_S)),
                    OTFED_PREFECT_IDLE_S="1")
    proc = subprocess.Popen([sys.executable, MEETING.name, "partition"], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: any((tmp_path / "meeting").iterdir()) or proc.poll() is not None,
                   "the stage's MLflow run to open", STOP_S)
        assert proc.poll() is None, "the stage exited before it was killed"
        proc.kill()
        proc.wait()
        wait_until(lambda: not _session_processes(proc.pid), "the stage's processes to exit after it was "
                   "SIGKILLed", STOP_S, poll=0.2, details=lambda: "\n".join(_session_processes(proc.pid)))
        wait_until(lambda: prefect_server.read_record(project / ".prefect") is None, "the project's Prefect server "
                   "to stop once its only user was SIGKILLed", STOP_S, poll=0.2)
    finally:
        (project / MEETING.name).unlink()
    assert _snapshot(project) == before
    killed = _runs(project)[0]
    assert killed.info.status == "RUNNING"  # nobody ended it: the next run must
    (project / "reports" / ".partition.staging").mkdir()  # what a kill during the jobs leaves (not reached here)
    again = _dvc(project, "repro", "--force")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r.info.run_id: r.info.status for r in _runs(project)}[killed.info.run_id] == "KILLED"
    assert not list(project.glob("**/.*.staging")), "a staging folder was left behind"
    assert _snapshot(project) == before  # same params, same bytes


def test_a_queued_experiment_logs_into_the_users_store(project: Path) -> None:
    """``dvc exp run --queue`` runs the stage in a temporary copy under .dvc/tmp/exps; its MLflow run must
    land in the user's ``mlruns.db`` (DVC_ROOT), tagged with the experiment and its baseline commit."""
    head = git(project, "rev-parse", "HEAD").strip()
    n_before = len(_runs(project))
    queued = _dvc(project, "exp", "run", "--queue", "-S", "run.seed=7", "-n", "seed-seven")
    assert queued.returncode == 0, queued.stderr
    ran = _dvc(project, "exp", "run", "--run-all")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    runs = _runs(project)
    assert len(runs) == n_before + 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["run.seed"] == "7"
    assert run.data.tags["dvc_experiment"] == "seed-seven"
    assert run.data.tags["git_commit"] == head
    assert not list((project / ".dvc" / "tmp").rglob("mlruns.db")), "a store inside the temporary copy"
