"""Scheduled runs fire: a real Prefect server's scheduler creates a run of a served deployment, and the
serving process executes it to Completed (issue #9: with SQLAlchemy 2.1 the scheduler service crashed every
loop with ``Can't evaluate bulk DML statement`` and no scheduled run was ever created).

Two subprocesses, each in its own session so teardown can kill the whole process group: ``prefect server
start`` on a free 127.0.0.1 port with a temporary PREFECT_HOME, and ``scheduled_flow.py`` (``flow.serve``
with an interval schedule anchored a few seconds ahead). Scheduler and runner loops are shortened through
settings so the test takes ~30 s rather than minutes.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration.support import clean_env, free_port

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
FLOW_SCRIPT = HERE / "scheduled_flow.py"
FLOW_NAME = "otfed-scheduled-smoke"
DEPLOYMENT_NAME = "smoke-schedule"
SCHEDULE_DELAY_S = 10       # first scheduled run this long after the deployment is served
SERVER_START_TIMEOUT_S = 60
RUN_TIMEOUT_S = 90          # from serving to the scheduled run Completed
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
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                out = _tail(log)
                if any(e in out.lower() for e in BIND_ERRORS):
                    pytest.skip(f"the Prefect server could not bind 127.0.0.1:{port}:\n{out}")
                pytest.fail(f"`{' '.join(cmd)}` exited with {proc.returncode}; server log tail:\n{out}")
            if time.monotonic() > deadline:
                pytest.fail(f"Prefect server not healthy after {SERVER_START_TIMEOUT_S} s; log tail:\n"
                            f"{_tail(log)}")
            time.sleep(0.5)
        yield api, log
    finally:
        _stop(proc)


@pytest.fixture
def served_flow(prefect_server: tuple[str, Path], tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """``scheduled_flow.py`` serving the deployment; yields (marker file, serve log)."""
    api, _ = prefect_server
    log, marker = tmp_path / "serve.log", tmp_path / "ran.txt"
    env = clean_env(PREFECT_HOME=str(tmp_path / "client-home"), PREFECT_API_URL=api,
                    PREFECT_RUNNER_POLL_FREQUENCY="1")  # default: poll for scheduled runs every 10 s
    cmd = [sys.executable, str(FLOW_SCRIPT), DEPLOYMENT_NAME, str(SCHEDULE_DELAY_S), str(marker)]
    proc = _start(cmd, env, tmp_path, log)
    try:
        yield marker, log
    finally:
        _stop(proc)


def test_scheduler_creates_a_run_that_the_served_flow_completes(prefect_server, served_flow):
    api, server_log = prefect_server
    marker, serve_log = served_flow
    http = httpx.Client(base_url=api, timeout=5)

    def diagnostics(why: str, runs: list[dict] | None = None) -> str:
        listed = "\n".join(f"  {r['name']} state={r['state_type']} auto_scheduled={r['auto_scheduled']} "
                           f"expected_start={r['expected_start_time']}" for r in runs or []) or "  (none)"
        return (f"{why}\nflow runs of the deployment:\n{listed}\n--- server log tail ---\n"
                f"{_tail(server_log)}\n--- serve log tail ---\n{_tail(serve_log, 20)}")

    deadline = time.monotonic() + RUN_TIMEOUT_S
    deployment_id, runs = None, []
    while True:
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
                break
            failed = [r for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
            if failed:
                pytest.fail(diagnostics("a scheduled run did not complete", runs))
        crash = SCHEDULER_CRASH.search(server_log.read_text(errors="replace"))
        if crash and not runs:
            pytest.fail(diagnostics(f"the server's scheduler service failed ({crash.group(0).strip()})"))
        if time.monotonic() > deadline:
            why = ("the deployment was never registered" if deployment_id is None else
                   "no scheduler-created run reached Completed")
            pytest.fail(diagnostics(f"{why} within {RUN_TIMEOUT_S} s", runs))
        time.sleep(1)

    run = done[0]
    # created by the server's scheduler for this deployment, and executed by the serving process
    assert run["deployment_id"] == deployment_id and run["auto_scheduled"] is True
    assert (run["created_by"] or {}).get("type") == "SCHEDULE", run["created_by"]
    assert marker.read_text() == run["id"]
