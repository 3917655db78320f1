"""prefect.yaml's GPU deployment path, run for real on the CPU: ``bench/gpu_session.sh worker-start`` (what a GPU
node runs, there with the device kit) starts a Prefect server on a free port, creates work pool otfed-gpu,
deploys ``pipeline-gpu`` from ``prefect.yaml``, runs it for the partition stage through a process worker (the
flow runs ``dvc repro partition`` in a copy of the checkout without git history), and exits 0 only when the
flow run ends Completed; ``collect`` bundles the logs. With no CUDA device the torch code would take the CPU:
this checks the orchestration, not the GPU (bench/gpu_session.sh on a GPU node does that)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.integration.support import REPO, clean_env, free_port

pytestmark = pytest.mark.integration


def _session(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_gpu_deployment_runs_a_stage_through_a_process_worker(tmp_path: Path) -> None:
    if shutil.which("dvc", path=clean_env()["PATH"]) is None:
        pytest.skip("needs dvc")
    jobs, out = tmp_path / "jobs", tmp_path / "out"
    env = clean_env(OTFED_KIT="none", OTFED_JOBS=str(jobs), OUT=str(out), OTFED_WORKER_STAGES="partition",
                    OTFED_WORKER_PORT=str(free_port("Prefect server")))
    started = _session(env, "worker-start", timeout=120)
    assert started.returncode == 0, started.stderr
    work = jobs / "worker"
    try:
        waited = _session(env, "wait", "worker", "300", timeout=330)
        log = (work / "job.log").read_text()
        assert waited.returncode == 0, log[-3000:]
        assert "COMPLETED" in log and "DONE in" in log
        worker_log = (work / "worker.log").read_text()
        assert "running: dvc repro partition" in worker_log and "[partition] done" in worker_log
        assert (work / "reports" / "partition").is_dir()
        collected = _session(env, "collect", "worker", timeout=60)
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
        result = _session(env, *args, timeout=30)
        assert result.returncode == 2 and "no job paper" in result.stderr
