"""Scheduled runs fire: a real Prefect server's scheduler creates a run of a served deployment, and the
serving process executes it to Completed (issue #9: with SQLAlchemy 2.1 the scheduler service crashed every
loop with ``Can't evaluate bulk DML statement`` and no scheduled run was ever created).

Two subprocesses, each in its own session so teardown can kill the whole process group: ``prefect server
start`` on a free 127.0.0.1 port with a temporary PREFECT_HOME, and ``scheduled_flow.py`` (``flow.serve``
with a short interval schedule anchored a few seconds ahead). Scheduler and runner loops are shortened through
settings so the test takes ~15 s rather than minutes. It waits on events (the server answering, a run
Completed) under ceilings that only catch a hang (tests/ceilings.py).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.ceilings import ceiling, wait_until
from tests.integration.support import clean_env, free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
FLOW_SCRIPT = HERE / "scheduled_flow.py"
FLOW_NAME = "otfed-scheduled-smoke"
DEPLOYMENT_NAME = "smoke-schedule"
SCHEDULE_DELAY_S = 10       # first scheduled run this long after the deployment is served
SCHEDULE_INTERVAL_S = 15    # then one every 15 s: a deployment registered late (load) gets the next slot
# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine (idle: the server answers
# within ~5 s, the scheduled run completes ~12 s after serving)
SERVER_START_S = 300
RUN_S = 300                 # from serving to the scheduled run Completed
SCHEDULER_CRASH = re.compile(r"ERROR.*(schedule_deployments|schedule_recent_deployments|Error scheduling)")
BIND_ERRORS = ("address already in use", "error while attempting to bind", "permission denied",
               "operation not permitted")


def _start(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process, its process group and every descendant (even one that left the group), then
    SIGKILL whatever is still alive after a grace period."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in family:
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(family, timeout=10)
        try:
            proc.wait(timeout=0 if alive else 10)
        except subprocess.TimeoutExpired:
            pass
        if not alive and proc.poll() is not None:
            return


def _tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real ``prefect server start`` with a fast scheduler; yields (api_url, server log)."""
    port = free_port("Prefect server")
    log = tmp_path / "server.log"
    env = clean_env(
        PREFECT_HOME=str(tmp_path / "server-home"),
        PREFECT_SERVER_UI_ENABLED="false",
        # main loop + the loop that schedules just-created deployments (defaults 60 s and 5 s)
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2",
        PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS="1",
        # only the next run or two of the hourly schedule (defaults: at least 3, at most 100 runs ahead)
        PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS="1",
        PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS="2",
    )
    cmd = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    proc = _start(cmd, env, tmp_path, log)
    api = f"http://127.0.0.1:{port}/api"

    def healthy() -> bool:
        try:
            if httpx.get(f"{api}/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            out = _tail(log)
            if any(e in out.lower() for e in BIND_ERRORS):
                pytest.skip(f"the Prefect server could not bind 127.0.0.1:{port}:\n{out}")
            pytest.fail(f"`{' '.join(cmd)}` exited with {proc.returncode}; server log tail:\n{out}")
        return False

    try:
        wait_until(healthy, f"the Prefect server to answer {api}/health", SERVER_START_S, details=lambda: _tail(log))
        yield api, log
    finally:
        _stop(proc)


@pytest.fixture
def served_flow(prefect_server: tuple[str, Path], tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``scheduled_flow.py`` serving the deployment; yields (marker folder: a file per run it executed, serve
    log)."""
    api, _ = prefect_server
    log, marker = tmp_path / "serve.log", tmp_path / "ran"
    env = clean_env(PREFECT_HOME=str(tmp_path / "client-home"), PREFECT_API_URL=api,
                    PREFECT_RUNNER_POLL_FREQUENCY="1")  # default: poll for scheduled runs every 10 s
    cmd = [sys.executable, str(FLOW_SCRIPT), DEPLOYMENT_NAME, str(SCHEDULE_DELAY_S), str(SCHEDULE_INTERVAL_S),
           str(marker)]
    proc = _start(cmd, env, tmp_path, log)
    try:
        yield marker, log
    finally:
        _stop(proc)


def test_scheduler_creates_a_run_that_the_served_flow_completes(prefect_server, served_flow):
    api, server_log = prefect_server
    marker, serve_log = served_flow
    http = httpx.Client(base_url=api, timeout=ceiling(60))  # a request that never answers: a hang

    def diagnostics(why: str, runs: list[dict] | None = None) -> str:
        listed = "\n".join(f"  {r['name']} state={r['state_type']} auto_scheduled={r['auto_scheduled']} "
                           f"expected_start={r['expected_start_time']}" for r in runs or []) or "  (none)"
        return (f"{why}\nflow runs of the deployment:\n{listed}\n--- server log tail ---\n"
                f"{_tail(server_log)}\n--- serve log tail ---\n{_tail(serve_log, 20)}")

    deployment_id, runs = None, []

    def completed_run() -> dict | None:
        """The first scheduler-created run that reached Completed, if any yet; fails at once on a failed run or a
        crashed scheduler service."""
        nonlocal deployment_id, runs
        if deployment_id is None:
            resp = http.get(f"/deployments/name/{FLOW_NAME}/{DEPLOYMENT_NAME}")
            if resp.status_code == 200:
                deployment_id = resp.json()["id"]
        if deployment_id is not None:
            resp = http.post("/flow_runs/filter", json={
                "flow_runs": {"deployment_id": {"any_": [deployment_id]}}, "sort": "EXPECTED_START_TIME_ASC"})
            resp.raise_for_status()
            runs = resp.json()
            done = [r for r in runs if r["auto_scheduled"] and r["state_type"] == "COMPLETED"]
            if done:
                return done[0]
            if any(r["state_type"] in ("FAILED", "CRASHED") for r in runs):
                pytest.fail(diagnostics("a scheduled run did not complete", runs))
        crash = SCHEDULER_CRASH.search(server_log.read_text(errors="replace"))
        if crash and not runs:
            pytest.fail(diagnostics(f"the server's scheduler service failed ({crash.group(0).strip()})"))
        return None

    awaited = "the deployment to be registered and a scheduler-created run of it to reach Completed"
    run = wait_until(completed_run, awaited, RUN_S, poll=1, details=lambda: diagnostics(
        "the deployment was never registered" if deployment_id is None else
        "no scheduler-created run reached Completed", runs))
    # created by the server's scheduler for this deployment, and executed by the serving process
    assert run["deployment_id"] == deployment_id and run["auto_scheduled"] is True
    assert (run["created_by"] or {}).get("type") == "SCHEDULE", run["created_by"]
    assert (marker / run["id"]).read_text() == run["id"]
