"""No secret at rest (issue #32): after stage runs with a credential in every place the project reads one, not
one byte of any of them is in anything the runs wrote — the Prefect database (flow-run states, API logs, events:
what the Prefect UI shows), Prefect's result storage, the MLflow store and artifacts, the stage logs, the outputs.

Three runs of ``python -m flows.stage partition`` on tiny params in a throw-away project, as a user runs them:

* ``MLFLOW_TRACKING_URI`` with ``user:password@``, a ``?token=`` and a ``&password=`` query value, at a port
  where nothing listens (the run fails; Prefect stores the failure: state, logs, events, persisted exception);
* ``MLFLOW_TRACKING_URI`` with a token as the user name (``https://TOKEN@host``), failing the same way;
* a successful run into the project's SQLite MLflow store, against the project's Prefect server named through
  ``PREFECT_API_URL`` with ``user:password@``, with MLflow's and Prefect's own credential variables set
  (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``, ``PREFECT_API_KEY``).

Every file under the project is then read as bytes and searched for each secret, as written and as base64 (the
form Prefect's result storage uses for pickled exceptions), after the Prefect server has stopped.
"""
from __future__ import annotations

import base64
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ceilings import completed
from tests.integration.support import REPO, clean_env
from tests.stages.conftest import tiny_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SECRETS = {  # where each one is placed → the secret (distinct, so a leak names its path)
    "userinfo password": "Pw0userinfo7Qx",
    "query token": "Tk0query3Zr8",
    "query password": "Pw0query5Lm2",
    "token as user name": "Tk0username9Hv",
    "PREFECT_API_URL password": "Pw0prefectapi4Ns",
    "MLFLOW_TRACKING_TOKEN": "Tk0mlflowenv6Jd",
    "MLFLOW_TRACKING_PASSWORD": "Pw0mlflowenv1Yb",
    "PREFECT_API_KEY": "Ky0prefectenv8Wc",
}
STAGE_S = 900  # a ceiling for one stage run in a child process (the first one starts the Prefect server)


def encodings(secret: str) -> list[bytes]:
    """``secret`` as bytes, and the part of its base64 that does not depend on the bytes around it, at each of
    the three offsets it can start at in an encoded stream."""
    raw = secret.encode()
    found = [raw]
    for pad in range(3):
        encoded = base64.b64encode(bytes(pad) + raw)
        found.append(encoded[-(-8 * pad // 6):8 * (pad + len(raw)) // 6])
    return found


def secrets_in(root: Path) -> dict[str, list[str]]:
    """Each secret of :data:`SECRETS` → the files under ``root`` holding it in any of its :func:`encodings`."""
    files = [path for path in sorted(root.rglob("*")) if path.is_file() and not path.is_symlink()]
    contents = {path: path.read_bytes() for path in files}
    return {place: [str(path.relative_to(root)) for path, data in contents.items()
                    if any(form in data for form in encodings(secret))]
            for place, secret in SECRETS.items()}


def _project(root: Path) -> Path:
    """A throw-away project: the code, the embedded data and tiny params for the partition stage."""
    shutil.copytree(REPO / "data" / "raw", root / "data" / "raw")
    for folder in ("otfed", "stages", "flows"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    params = tiny_params(root)
    params["partition"]["data_dir"] = "data/raw"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def _stage(project: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m flows.stage partition`` in ``project``; the project's Prefect server outlives it (it is
    stopped by the test), so the third run can name it in ``PREFECT_API_URL``."""
    environ = clean_env(OTFED_HOME=str(project), OTFED_PREFECT_IDLE_S="3600", MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
                        MLFLOW_HTTP_REQUEST_TIMEOUT="5", **env)
    return completed([sys.executable, "-m", "flows.stage", "partition"], "a partition run", STAGE_S, cwd=project,
                     env=environ)


def test_no_secret_is_written_anywhere(tmp_path: Path) -> None:
    project = _project(tmp_path / "project")
    s = SECRETS
    try:
        query = _stage(project, MLFLOW_TRACKING_URI=f"http://alice:{s['userinfo password']}@127.0.0.1:9/"
                                                    f"?token={s['query token']}&password={s['query password']}")
        token = _stage(project, MLFLOW_TRACKING_URI=f"https://{s['token as user name']}@127.0.0.1:9")
        record = json.loads((project / ".prefect" / "server.json").read_text())
        api = record["url"].replace("http://", f"http://carol:{s['PREFECT_API_URL password']}@", 1)
        tracked = _stage(project, PREFECT_API_URL=api, MLFLOW_TRACKING_TOKEN=s["MLFLOW_TRACKING_TOKEN"],
                         MLFLOW_TRACKING_PASSWORD=s["MLFLOW_TRACKING_PASSWORD"],
                         PREFECT_API_KEY=s["PREFECT_API_KEY"])
    finally:
        subprocess.run([sys.executable, "-m", "flows.prefect_server", "stop"], cwd=project,
                       env=clean_env(OTFED_HOME=str(project)), capture_output=True, timeout=120)

    for run, shown in ((query, "http://alice:***@127.0.0.1:9/?token=***&password=***"),
                       (token, "https://***@127.0.0.1:9")):
        # the MLflow error itself (not the stand-in Prefect stored), exit 1, credentials hidden
        assert run.returncode == 1 and f"error: MlflowException: API request to {shown}" in run.stderr, run.stderr
    assert tracked.returncode == 0, tracked.stderr
    for run in (query, token, tracked):
        assert not any(secret in run.stdout + run.stderr for secret in SECRETS.values()), run.stdout + run.stderr

    # the runs are in the stores searched below: two failures (their messages kept, redacted) and a success
    with sqlite3.connect(project / ".prefect" / "prefect.db") as db:
        states = sorted(db.execute("SELECT flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id"
                                   " WHERE flow.name = 'partition'").fetchall())
        messages = " ".join(m for (m,) in db.execute("SELECT message FROM flow_run_state WHERE type = 'FAILED'"))
    assert states == [("COMPLETED",), ("FAILED",), ("FAILED",)]
    assert "alice:***@127.0.0.1:9" in messages and "https://***@127.0.0.1:9" in messages
    with sqlite3.connect(project / "mlruns.db") as db:
        assert db.execute("SELECT status FROM runs WHERE name = 'partition'").fetchall() == [("FINISHED",)]

    leaks = {place: files for place, files in secrets_in(project).items() if files}
    assert not leaks, f"secrets written at rest: {leaks}"
