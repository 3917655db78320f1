"""A password in ``MLFLOW_TRACKING_URI`` never reaches a console line, the stage's log file or ``otfed doctor``
(issue #25: it was printed in the ``error:`` line, four times in the log and by the doctor)."""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flows.redaction import RedactingFormatter, redact
from tests.ceilings import completed
from tests.integration.support import REPO, clean_env
from tests.stages.conftest import tiny_params

SECRET = "s3cret-Pa55"


@pytest.mark.parametrize("text, shown", [
    ("http://alice:s3cret@mlflow.example:5000/api", "http://alice:***@mlflow.example:5000/api"),
    ("postgresql+psycopg2://u:p%40ss:w@db.local/mlflow", "postgresql+psycopg2://u:***@db.local/mlflow"),
    ("https://:tok@host/x and tcp://bob:pw@10.0.0.1:8786", "https://:***@host/x and tcp://bob:***@10.0.0.1:8786"),
    ("https://host/path?token=abc123&run=7", "https://host/path?token=***&run=7"),
    ("https://host/path?run=7&API_KEY=zz", "https://host/path?run=7&API_KEY=***"),
])
def test_credentials_are_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.mark.parametrize("text", [
    "sqlite:////home/alice/otfed/mlruns.db", "http://127.0.0.1:5000", "tcp://alice@host:8786",
    "error: params.yaml: run.seed: Input should be a valid integer (got 'a:b@c')", "a time 12:30@noon",
])
def test_text_without_credentials_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_the_log_formatter_hides_credentials_in_messages_and_tracebacks() -> None:
    formatter = RedactingFormatter("%(message)s")
    try:
        raise ConnectionError(f"API request to http://alice:{SECRET}@127.0.0.1:9/api failed")
    except ConnectionError:
        record = logging.LogRecord("mlflow", logging.ERROR, __file__, 1, "store %s unreachable",
                                   (f"http://alice:{SECRET}@127.0.0.1:9",), sys.exc_info())
    text = formatter.format(record)
    assert SECRET not in text
    assert "http://alice:***@127.0.0.1:9 unreachable" in text and "http://alice:***@127.0.0.1:9/api" in text


@pytest.mark.integration
def test_a_failing_stage_and_the_doctor_never_print_the_password(tmp_path: Path) -> None:
    """The partition stage against an MLflow server that does not answer (port 9, no retries): it fails —
    and neither its ``error:`` lines, nor its log file, nor ``otfed doctor`` show the password."""
    shutil.copytree(REPO / "data" / "raw", tmp_path / "data" / "raw")
    for folder in ("otfed", "stages", "flows"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    params = tiny_params(tmp_path)
    params["partition"]["data_dir"] = "data/raw"
    import yaml

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = clean_env(MLFLOW_TRACKING_URI=f"http://alice:{SECRET}@127.0.0.1:9", OTFED_HOME=str(tmp_path),
                    MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    stage = completed([sys.executable, "-m", "flows.stage", "partition"], "the stage to fail", 600, cwd=tmp_path,
                      env=env)
    assert stage.returncode != 0
    assert "error:" in stage.stderr
    assert "127.0.0.1:9" in stage.stderr + stage.stdout or "mlflow" in (stage.stderr + stage.stdout).lower()
    assert SECRET not in stage.stdout + stage.stderr
    logs = list((tmp_path / ".prefect" / "logs").glob("*.log"))
    assert logs, "the stage wrote no log file"
    assert all(SECRET not in log.read_text() for log in logs)
    assert any("alice:***@" in log.read_text() for log in logs)  # the URI is still named, without its password
    doctor = subprocess.run([sys.executable, "-m", "flows.cli", "doctor"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert "http://alice:***@127.0.0.1:9" in doctor.stdout
    assert SECRET not in doctor.stdout + doctor.stderr
