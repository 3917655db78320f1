"""prefect.yaml's GPU deployment path, run for real on the CPU: ``gpu/gpu_session.sh worker-start`` (what a GPU
node runs, there with the device kit) starts a Prefect server on a free port, creates work pool otfed-gpu,
deploys ``pipeline-gpu`` from ``prefect.yaml``, runs it for the partition stage through a process worker (the
flow runs ``dvc repro partition`` in a copy of the checkout without git history), and exits 0 only when the
flow run ends Completed; ``collect`` bundles the logs. With no CUDA device the torch code would take the CPU:
this checks the orchestration, not the GPU (gpu/gpu_session.sh on a GPU node does that). The test waits on the
job's end (``wait``) under a ceiling that only catches a hang (tests/ceilings.py)."""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.ceilings import ceiling, completed, hit
from tests.integration.support import REPO, clean_env, free_port

pytestmark = pytest.mark.integration

# ceilings (tests/ceilings.py), several times the durations on a loaded 2-core machine: idle, worker-start takes
# seconds (a copy of the checkout), the job (server, deployment, worker, partition stage) ~50 s
START_S = 300
JOB_S = 600
COLLECT_S = 300
STILL_RUNNING = 75  # `gpu_session.sh wait`'s exit status while the job runs


def _session(env: dict[str, str], *args: str, seconds: float) -> subprocess.CompletedProcess:
    """``bash gpu/gpu_session.sh ARGS`` run to its exit (a hang fails at ``ceiling(seconds)``)."""
    return completed(["bash", str(REPO / "gpu" / "gpu_session.sh"), *args], f"gpu_session.sh {' '.join(args)}",
                     seconds, env=env)


def test_the_gpu_deployment_runs_a_stage_through_a_process_worker(tmp_path: Path) -> None:
    if shutil.which("dvc", path=clean_env()["PATH"]) is None:
        pytest.skip("needs dvc")
    jobs, out = tmp_path / "jobs", tmp_path / "out"
    env = clean_env(OTFED_KIT="none", OTFED_JOBS=str(jobs), OUT=str(out), OTFED_WORKER_STAGES="partition",
                    OTFED_WORKER_PORT=str(free_port("Prefect server")))
    started = _session(env, "worker-start", seconds=START_S)
    assert started.returncode == 0, started.stderr
    work = jobs / "worker"
    try:  # `wait` returns when the job ends; its own limit is the ceiling, the command's a minute above it
        waited = _session(env, "wait", "worker", str(math.ceil(ceiling(JOB_S))), seconds=JOB_S + 60)
        log = (work / "job.log").read_text()
        assert waited.returncode != STILL_RUNNING, hit("the worker job to end", JOB_S, log[-3000:])
        assert waited.returncode == 0, log[-3000:]
        assert "COMPLETED" in log and "DONE in" in log
        worker_log = (work / "worker.log").read_text()
        assert "running: dvc repro partition" in worker_log and "[partition] done" in worker_log
        assert (work / "reports" / "partition").is_dir()
        collected = _session(env, "collect", "worker", seconds=COLLECT_S)
        assert collected.returncode == 0, collected.stderr
        with tarfile.open(out / "worker.tar.gz") as tar:
            assert {"job.log", "server.log", "worker.log"} <= set(tar.getnames())
    finally:
        pid = int((work / "job.pid").read_text())
        try:
            os.killpg(pid, signal.SIGTERM)  # a job still running after a failure: its whole process group
        except ProcessLookupError:
            pass


def test_wait_and_collect_name_a_job_that_was_never_started(tmp_path: Path) -> None:
    env = clean_env(OTFED_KIT="none", OTFED_JOBS=str(tmp_path / "jobs"), OUT=str(tmp_path / "out"))
    for args in (("wait", "paper", "1"), ("collect", "paper")):
        result = _session(env, *args, seconds=COLLECT_S)
        assert result.returncode == 2 and "no job paper" in result.stderr
