"""Tracking that loses nothing: a real MLflow tracking server (``make mlflow-server``) takes stage runs that
log at the same time — two ``python -m flows.stage partition`` processes at once, and a ``dvc exp run --queue``
sweep of three variants run by two DVC queue workers (``dvc queue start -j 2``) — and every run is there,
FINISHED, with every param, metric and artifact.

What each run must hold is not hard-coded: a first, sequential run of the stage (alone on the server) gives
the params, metric names and artifact files; that run itself is checked against the files the stage wrote
(its report folder and the partitions manifest) and its ``metrics.json``. Every concurrent run must then log
the same keys and files, its own param value, and the metric values of its own ``metrics.json`` (on disk
for the two processes, ``dvc exp show`` for the queued experiments).

The server runs in its own session (``make`` → ``mlflow server`` → its uvicorn worker) on a free 127.0.0.1
port, with its SQLite store and artifact destination in a temporary folder; teardown stops the whole session
and checks that no process is left, and that no DVC queue worker outlives the queue test.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import mlflow
import psutil
import pytest
import yaml

from stages.partition import PartitionParams, raw_files
from tests.ceilings import ceiling, completed, finished, hit, wait_until
from tests.integration.support import REPO, clean_env, free_port, git, stage_repository
from tests.stages.conftest import tiny_params

pytestmark = pytest.mark.integration

STAGE = "partition"
SWEPT = "partition.federations.bench.samples_per_client"
SWEEP = (40, 50, 60)
OTHER = 50                  # the second of the two concurrent processes runs with this value
# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine. Idle: a server answers
# within ~10 s, a DVC command takes seconds, a stage run ~10 s, the queued sweep ~50 s, the DVC queue workers exit
# ~10 s after the queue empties
SERVER_START_S = 300
COMMAND_S = 300
STAGE_S = 600
SWEEP_S = 900
QUEUE_WORKERS_EXIT_S = 240
MEETING = Path(__file__).with_name("meeting_stage.py")


# ------------------------------------------------------------------------------------------ processes
def _session(sid: int) -> list[psutil.Process]:
    """The live (not zombie) processes of session ``sid``."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def _stop_session(proc: subprocess.Popen) -> list[str]:
    """SIGTERM every process of ``proc``'s session, SIGKILL what is left after a grace period; returns the
    command lines of processes still alive afterwards (none, or the test fails)."""
    for sig, grace in ((signal.SIGTERM, ceiling(20)), (signal.SIGKILL, ceiling(5))):
        family = _session(proc.pid)
        for p in family:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=grace)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        if not _session(proc.pid):
            break
    return _command_lines(_session(proc.pid))


def _command_lines(processes: list[psutil.Process]) -> list[str]:
    """The command lines of those processes still alive."""
    lines = []
    for p in processes:
        try:
            lines.append(" ".join(p.cmdline()))
        except psutil.Error:
            continue
    return lines


def _under(root: Path) -> list[psutil.Process]:
    """The live processes whose working directory is ``root`` or below it (DVC queue workers, stage runs)."""
    root = root.resolve()
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = Path(p.cwd())
        except (psutil.Error, OSError):
            continue
        if cwd == root or root in cwd.parents:
            found.append(p)
    return found


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------------- fixtures
@dataclass
class Server:
    """A server process in its own session, the URL it answers on, its health URL and its log."""

    name: str
    proc: subprocess.Popen
    url: str
    health: str
    log: Path

    def wait_healthy(self) -> None:
        """Returns once the health URL answers 200; fails at once if the server exits, or at the ceiling."""
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(self.health, timeout=5) as answer:
                    if answer.status == 200:
                        return True
            except OSError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"the {self.name} server exited with {self.proc.returncode}:\n{_tail(self.log)}")
            return False

        wait_until(healthy, f"the {self.name} server to answer {self.health}", SERVER_START_S,
                   details=lambda: _tail(self.log))


def _start(name: str, cmd: list[str], home: Path, url: str, health: str, **env: str) -> Server:
    log = home / f"{name}.log"
    with open(log, "wb") as out:  # its own session: teardown stops the server and every worker it started
        proc = subprocess.Popen(cmd, cwd=home, env=clean_env(**env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return Server(name, proc, url, health, log)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Started, not yet answering (they boot while the repository is built): ``make mlflow-server`` on a free
    port with its store and artifacts in a temporary folder, and a Prefect server the stages run their
    flows on (a stage otherwise starts a temporary one of its own, ~10 s each). Teardown stops both
    sessions and fails if any process of theirs is left."""
    if shutil.which("make") is None:
        pytest.skip("needs make (the documented command is `make mlflow-server`)")
    home = tmp_path_factory.mktemp("servers")
    venv = Path(sys.prefix)
    mlflow_port = free_port("MLflow server")
    prefect_port = next(port for port in iter(lambda: free_port("Prefect server"), None) if port != mlflow_port)
    started = {
        "mlflow": _start("mlflow", ["make", "--no-print-directory", "-C", str(REPO), "-o", f"{venv}/.installed",
                                    f"VENV={venv}", "mlflow-server", f"MLFLOW_PORT={mlflow_port}",
                                    f"MLFLOW_SERVER_DIR={home / 'mlflow'}", "MLFLOW_WORKERS=1"],
                         home, f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{mlflow_port}/health"),
        "prefect": _start("prefect", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                      "--port", str(prefect_port)],
                          home, f"http://127.0.0.1:{prefect_port}/api",
                          f"http://127.0.0.1:{prefect_port}/api/health",
                          PREFECT_HOME=str(home / "prefect"), PREFECT_SERVER_UI_ENABLED="false"),
    }
    try:
        yield started
    finally:
        left = {name: _stop_session(server.proc) for name, server in started.items()}
        assert not any(left.values()), f"server processes left behind: {left}"
    mlflow_home = home / "mlflow"
    assert (mlflow_home / "mlflow.db").is_file()
    assert any((mlflow_home / "artifacts").rglob("metrics.json")), "no artifact reached --artifacts-destination"


@pytest.fixture(scope="module")
def server(servers: dict[str, Server], project: Path) -> str:
    """The MLflow server's URI, as printed in the ``export MLFLOW_TRACKING_URI=…`` line of ``make
    mlflow-server``, once both servers answer (after the repository is built: they boot meanwhile)."""
    for started in servers.values():
        started.wait_healthy()
    mlflow_server = servers["mlflow"]
    exports = [line.strip() for line in mlflow_server.log.read_text().splitlines()
               if "export MLFLOW_TRACKING_URI=" in line]
    assert exports == [f"export MLFLOW_TRACKING_URI={mlflow_server.url}"]
    return mlflow_server.url


@pytest.fixture(scope="module")
def stage_env(servers: dict[str, Server], server: str) -> dict[str, str]:
    """The environment every stage (and DVC command) runs in: both servers."""
    return clean_env(MLFLOW_TRACKING_URI=server, PREFECT_API_URL=servers["prefect"].url)


def _run(repo: Path, *cmd: str, env: dict[str, str], seconds: float = COMMAND_S) -> subprocess.CompletedProcess:
    """``cmd`` run to its exit in ``repo`` (a hang fails at ``ceiling(seconds)``); it must succeed."""
    done = completed(cmd, f"`{' '.join(cmd)}` to exit", seconds, cwd=repo, env=env)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def project(servers: dict[str, Server], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC repository (committed, nothing run yet) holding a copy of this project's code, tiny
    params (the ``bench`` federation only) with the raw files they read, and the ``partition`` stage as
    ``dvc.yaml`` declares it (with its ``metrics:`` entry, so ``dvc exp show`` reports them), run through
    ``meeting_stage.py``: with ``MEETING_DIR`` set, two runs wait for each other once their MLflow runs are
    open, so that they log at the same time whatever the machine's load. Built while the ``servers`` boot."""
    repo = tmp_path_factory.mktemp("project")
    params = tiny_params(repo)
    params["partition"]["data_dir"] = "data/raw"
    # the swept federation only, and only the raw files it reads: less to copy, hash and run per experiment
    params["partition"]["federations"] = {"bench": params["partition"]["federations"]["bench"]}
    (repo / "data" / "raw").mkdir(parents=True)
    for path in raw_files(PartitionParams.model_validate(params["partition"])):
        shutil.copy2(REPO / path, repo / path)
    stage_repository(repo, STAGE, params, metrics=True)
    shutil.copy2(MEETING, repo / MEETING.name)  # the concurrent runs meet: see meeting_stage.py
    pipeline = yaml.safe_load((repo / "dvc.yaml").read_text())
    pipeline["stages"][STAGE]["cmd"] = f"python {MEETING.name} {STAGE}"
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "code, data, tiny params")
    return repo


def _copy(repo: Path, dest: Path, value: int | None = None) -> Path:
    """A copy of the repository (its git history included); ``value`` replaces the swept param."""
    shutil.copytree(repo, dest, symlinks=True)
    if value is not None:
        params = yaml.safe_load((dest / "params.yaml").read_text())
        params["partition"]["federations"]["bench"]["samples_per_client"] = value
        (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return dest


def _run_id(stage_output: str) -> str:
    """The MLflow run id the stage announced (``[partition] 3 tasks on … (MLflow run <id>)``)."""
    ids = [line.rsplit("MLflow run ", 1)[1].rstrip(")") for line in stage_output.splitlines()
           if "MLflow run " in line]
    assert len(ids) == 1, stage_output
    return ids[0]


def _artifacts(client: Any, run_id: str, path: str | None = None) -> dict[str, int]:
    """Every artifact file of a run, recursively: path → size in bytes."""
    files: dict[str, int] = {}
    for item in client.list_artifacts(run_id, path):
        if item.is_dir:
            files.update(_artifacts(client, run_id, item.path))
        else:
            files[item.path] = item.file_size
    return files


def _written(repo: Path) -> dict[str, float]:
    """The headline metrics the stage wrote to ``reports/partition/metrics.json``."""
    return {k: float(v) for k, v in json.loads((repo / "reports" / STAGE / "metrics.json").read_text()).items()}


def _files_written(repo: Path) -> dict[str, int]:
    """What the stage logs as artifacts, from disk: every file of its report folder and the partitions
    manifest, path → size in bytes."""
    files = {str(p.relative_to(repo)): p.stat().st_size for p in (repo / "reports" / STAGE).rglob("*")
             if p.is_file()}
    files["data/partitions/manifest.json"] = (repo / "data" / "partitions" / "manifest.json").stat().st_size
    return files


@pytest.fixture(scope="module")
def reference(project: Path, server: str, stage_env: dict[str, str],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One sequential run of the stage, alone on the server: what every run must hold — its param names,
    metric names and artifact files — each checked against what the stage wrote to disk."""
    repo = _copy(project, tmp_path_factory.mktemp("sequential") / "repo")
    run_id = _run_id(_run(repo, sys.executable, "-m", "flows.stage", STAGE, env=stage_env, seconds=STAGE_S).stderr)
    client = mlflow.MlflowClient(tracking_uri=server)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params[SWEPT] == str(SWEEP[0])
    written = _written(repo)
    assert written and {k: run.data.metrics[k] for k in written} == written
    files = _artifacts(client, run_id)
    assert files == _files_written(repo)  # every report file and the manifest, byte counts equal
    return {"params": set(run.data.params), "metrics": set(run.data.metrics), "artifacts": set(files)}


def _check_run(client: Any, run_id: str, reference: dict[str, Any], value: int, metrics: dict[str, float],
               files: dict[str, int] | None = None) -> None:
    """Run ``run_id`` is FINISHED and holds exactly the reference's params, metric names and artifact files
    (none empty; with ``files``, exactly those byte counts), the swept param ``value`` and the headline
    ``metrics`` its own stage wrote."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED", run_id
    assert run.data.tags["stage"] == STAGE
    assert set(run.data.params) == reference["params"]
    assert run.data.params[SWEPT] == str(value)
    assert set(run.data.metrics) == reference["metrics"]
    assert metrics and {k: run.data.metrics[k] for k in metrics} == metrics
    logged = _artifacts(client, run_id)
    assert set(logged) == reference["artifacts"]
    assert all(size > 0 for size in logged.values()), logged
    if files is not None:
        assert logged == files


@contextmanager
def _explained(servers: dict[str, Server], project: Path | None = None) -> Iterator[None]:
    """On a failure, add the tails of both servers' logs (and the DVC queue's state) to the error."""
    try:
        yield
    except BaseException as exc:
        for started in servers.values():
            exc.add_note(f"--- {started.name} server log (tail):\n{_tail(started.log, 30)}")
        if project is not None:
            try:
                state = subprocess.run(["dvc", "queue", "status"], cwd=project, env=clean_env(),
                                       capture_output=True, text=True, timeout=ceiling(COMMAND_S))
                exc.add_note(f"--- dvc queue status:\n{state.stdout}{state.stderr}")
            except subprocess.TimeoutExpired:
                exc.add_note(f"--- dvc queue status: no answer within {ceiling(COMMAND_S):g} s")
        raise


def _overlapping(runs: list) -> bool:
    """Whether at least two of the runs were open at the same time (their start-end intervals overlap)."""
    spans = sorted((r.info.start_time, r.info.end_time) for r in runs)
    return any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))


def _new_runs(client: Any, since_ms: int) -> list:
    exp = client.get_experiment_by_name("otfed")
    return client.search_runs([exp.experiment_id], f"attributes.start_time >= {since_ms}", max_results=1000)


# ------------------------------------------------------------------------------------------------ tests
def test_a_file_in_the_working_directory_lands_at_the_runs_root(server: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``log_artifact`` of a file in the working directory itself: the run's root (a server refuses the
    artifact path ``.`` that a local store accepts)."""
    from flows import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("root")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.txt").write_text("deeper")
    with tracking.stage_run("root-artifact", {}, "h") as run:
        run.log_artifact("notes.txt")
        run.log_artifact(tmp_path / "sub" / "deep.txt")
    client = mlflow.MlflowClient(tracking_uri=server)
    assert client.get_run(run.run_id).info.status == "FINISHED"
    assert _artifacts(client, run.run_id) == {"notes.txt": 4, "sub/deep.txt": 6}


def test_two_stage_processes_at_once_lose_nothing(servers: dict[str, Server], server: str,
                                                   stage_env: dict[str, str], project: Path,
                                                   reference: dict[str, Any], tmp_path: Path) -> None:
    """Two ``python -m flows.stage partition`` processes (two copies of the repository, two param values) log to
    the server at the same time (each waits for the other once its run is open): two runs, both complete."""
    with _explained(servers):
        since = int(time.time() * 1000)
        repos = {value: _copy(project, tmp_path / f"repo-{value}", value) for value in (SWEEP[0], OTHER)}
        meeting = dict(stage_env, MEETING_DIR=str(tmp_path / "meeting"), MEETING_SIZE="2",
                       MEETING_TIMEOUT_S=str(ceiling(STAGE_S)))
        (tmp_path / "meeting").mkdir()
        procs = {value: subprocess.Popen([sys.executable, MEETING.name, STAGE], cwd=repo, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=meeting)
                 for value, repo in repos.items()}
        try:
            outputs = {value: finished(p, f"the stage run with {SWEPT}={value} to exit", STAGE_S)
                       for value, p in procs.items()}
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        assert [p.returncode for p in procs.values()] == [0, 0], {v: o[1][-3000:] for v, o in outputs.items()}
        client = mlflow.MlflowClient(tracking_uri=server)
        ids = {value: _run_id(err) for value, (_, err) in outputs.items()}
        for value, run_id in ids.items():
            _check_run(client, run_id, reference, value, _written(repos[value]), _files_written(repos[value]))
        runs = _new_runs(client, since)
        assert sorted(r.info.run_id for r in runs) == sorted(ids.values())  # and no other run
        assert _overlapping(runs), "the two stage runs did not overlap: nothing was concurrent"


def _exp_show(repo: Path, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``dvc exp show --json``: experiment name → {"value": swept param, "metrics": its metrics.json}."""
    rows = json.loads(_run(repo, "dvc", "exp", "show", "--json", env=env).stdout)
    found: dict[str, dict[str, Any]] = {}

    def visit(rev: dict[str, Any]) -> None:
        data = rev.get("data") or {}
        params = ((data.get("params") or {}).get("params.yaml") or {}).get("data") or {}
        metrics = ((data.get("metrics") or {}).get(f"reports/{STAGE}/metrics.json") or {}).get("data") or {}
        if rev.get("name") and metrics:
            value = params["partition"]["federations"]["bench"]["samples_per_client"]
            found[rev["name"]] = {"value": value, "metrics": {k: float(v) for k, v in metrics.items()}}
        for exp in rev.get("experiments") or []:
            for child in exp.get("revs") or []:
                visit(child)

    for row in rows:
        visit(row)
    return found


@pytest.fixture
def queue_workers_stopped(project: Path) -> Iterator[None]:
    """Teardown: no DVC queue worker (or stage it ran) is left. The workers exit by themselves 10 s after
    the queue empties (quicker than ``dvc queue stop``); any still there at ``ceiling(QUEUE_WORKERS_EXIT_S)``
    fails the test and is stopped (``dvc queue stop --kill``, then SIGKILL)."""
    yield
    deadline = time.monotonic() + ceiling(QUEUE_WORKERS_EXIT_S)
    while _under(project) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _command_lines(_under(project))
    if left:
        subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=project, env=clean_env(), capture_output=True,
                       timeout=ceiling(COMMAND_S))
        psutil.wait_procs(_under(project), timeout=ceiling(10))
        for p in _under(project):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    assert not left, hit("the DVC queue processes to exit once the queue emptied", QUEUE_WORKERS_EXIT_S,
                         "\n".join(left))


def test_a_queued_sweep_on_two_workers_loses_nothing(servers: dict[str, Server], server: str,
                                                    stage_env: dict[str, str], project: Path,
                                                    reference: dict[str, Any], queue_workers_stopped: None,
                                                    tmp_path: Path) -> None:
    """``dvc exp run --queue -S <param>=40,50,60`` then ``dvc queue start -j 2``: the three experiments run
    two at a time in DVC's temporary copies (the first two wait for each other once their runs are open: they
    must overlap), each logging to the server; afterwards each experiment has
    exactly one run (tagged with its name), complete, holding the metrics DVC recorded for it. No queue
    worker is left running (teardown)."""
    with _explained(servers, project):
        since = int(time.time() * 1000)
        client = mlflow.MlflowClient(tracking_uri=server)
        _run(project, "dvc", "exp", "run", "--queue", "-S", f"{SWEPT}={','.join(map(str, SWEEP))}", env=stage_env)
        (tmp_path / "meeting").mkdir()  # the first two experiments' runs wait for each other (meeting_stage.py)
        _run(project, "dvc", "queue", "start", "-j", "2",
             env=dict(stage_env, MEETING_DIR=str(tmp_path / "meeting"), MEETING_SIZE="2",
                      MEETING_TIMEOUT_S=str(ceiling(STAGE_S))))
        polls, status = 0, "(not asked yet)"

        def queue_done() -> bool:
            """Cheap HTTP polls while the experiments run; DVC is asked once they have all logged (and every ~15 s,
            so that a stage that fails before it opens its run fails the test at once): done when one failed or
            none is queued or running."""
            nonlocal polls, status
            polls += 1
            ended = sum(r.info.status != "RUNNING" for r in _new_runs(client, since))
            if ended >= len(SWEEP) or polls % 8 == 0:
                status = _run(project, "dvc", "queue", "status", env=stage_env).stdout
                return "Failed" in status or not any(word in status for word in ("Queued", "Running"))
            return False

        wait_until(queue_done, "the queued experiments to end", SWEEP_S, poll=2, details=lambda: status)
        failed = [line.split()[1] for line in status.splitlines() if "Failed" in line.split()[-1:]]
        assert not failed, status + "".join(
            _run(project, "dvc", "queue", "logs", name, env=stage_env).stdout[-3000:] for name in failed)
        experiments = _exp_show(project, stage_env)
        assert sorted(e["value"] for e in experiments.values()) == sorted(SWEEP), experiments
        runs = _new_runs(client, since)
        assert sorted(r.data.tags.get("dvc_experiment", "") for r in runs) == sorted(experiments)  # one each
        for run in runs:
            exp = experiments[run.data.tags["dvc_experiment"]]
            _check_run(client, run.info.run_id, reference, exp["value"], exp["metrics"])
        assert _overlapping(runs), "no two queued experiments logged at the same time (-j 2)"
