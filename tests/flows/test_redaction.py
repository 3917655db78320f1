"""A credential in ``MLFLOW_TRACKING_URI`` (or any URI) never reaches a console line, the stage's log file, ``otfed
doctor`` (issue #25: it was printed in the ``error:`` line, four times in the log and by the doctor), nor what
Prefect stores of a run (issue #32: a failed run's exception text was in its database and result storage; a
token as user name was shown). Every credential form has its case; tests/integration/test_secrets_at_rest.py
searches every byte real runs wrote."""
from __future__ import annotations

import logging
import pickle
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from flows import doctor
from flows.redaction import (CredentialsHidden, RedactingFilter, RedactingFormatter, exceptions_hidden, hidden,
                             hide_in_prefect_logs, redact, unhidden)
from tests.ceilings import completed
from tests.integration.support import REPO, clean_env
from tests.stages.conftest import tiny_params

SECRET = "s3cret-Pa55"


@pytest.mark.parametrize("text, shown", [
    # user:password@ (the user name stays: it says whose credential it is); an '@' inside the password
    ("http://alice:s3cret@mlflow.example:5000/api", "http://alice:***@mlflow.example:5000/api"),
    ("postgresql+psycopg2://u:p%40ss:w@db.local/mlflow", "postgresql+psycopg2://u:***@db.local/mlflow"),
    ("https://:tok@host/x and tcp://bob:pw@10.0.0.1:8786", "https://:***@host/x and tcp://bob:***@10.0.0.1:8786"),
    ("http://u:p@ss@host/x", "http://u:***@host/x"),
    # a user name alone is a token, whatever the scheme
    ("https://ghp_T0ken123@github.com/org/repo.git", "https://***@github.com/org/repo.git"),
    ("tcp://alice@host:8786", "tcp://***@host:8786"),
    ("API request to https://T0ken@127.0.0.1:9/api failed", "API request to https://***@127.0.0.1:9/api failed"),
    # query (and fragment) values named as credentials, each word
    ("https://host/path?token=abc123&run=7", "https://host/path?token=***&run=7"),
    ("https://host/path?run=7&password=pw9&x=1", "https://host/path?run=7&password=***&x=1"),
    ("https://host/?passwd=a&pwd=b", "https://host/?passwd=***&pwd=***"),
    ("https://host/?secret=a&client_secret=b", "https://host/?secret=***&client_secret=***"),
    ("https://host/path?run=7&API_KEY=zz", "https://host/path?run=7&API_KEY=***"),
    ("https://host/?key=a&apikey=b&sessionToken=c&access_token=d",
     "https://host/?key=***&apikey=***&sessionToken=***&access_token=***"),
    ("https://b.blob/x?sv=1&sig=abc%2F&X-Amz-Signature=f0&X-Amz-Credential=AK",
     "https://b.blob/x?sv=1&sig=***&X-Amz-Signature=***&X-Amz-Credential=***"),
    ("https://host/cb#access_token=abc&state=1", "https://host/cb#access_token=***&state=1"),
    ("https://host/?auth=a", "https://host/?auth=***"),
    ("http://127.0.0.1:9/?token=t1&password=p2/api/2.0/mlflow/experiments/search failed",
     "http://127.0.0.1:9/?token=***&password=*** failed"),
])
def test_credentials_are_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact(shown) == shown  # hiding twice changes nothing


@pytest.mark.parametrize("text", [
    "sqlite:////home/alice/otfed/mlruns.db", "http://127.0.0.1:5000", "http://host/a@b", "file:///tmp/a@b",
    "https://host/?keyboard=us&author=me&run=7", "tcp://127.0.0.1:8786",
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


def _failing(uri: str) -> Exception:
    """An exception as MLflow raises it for a store at ``uri``, raised from a connection error naming it too."""
    try:
        try:
            raise ConnectionError(f"connect to {uri}/api/2.0 refused")
        except ConnectionError as cause:
            raise RuntimeError(f"API request to {uri}/api/2.0/mlflow/runs/create failed") from cause
    except RuntimeError as exc:
        exc.add_note(f"in task 'store {uri}'")
        return exc


@pytest.mark.parametrize("uri", [f"http://alice:{SECRET}@127.0.0.1:9", f"https://{SECRET}@127.0.0.1:9",
                                 f"http://127.0.0.1:9/?a=1&password={SECRET}"])
def test_an_exception_leaves_a_prefect_run_without_the_credential(uri: str) -> None:
    """What Prefect stores of a failure — its message, its traceback (logged to the API), the pickled exception
    (result storage) — holds no credential; this process still has the exception itself."""
    original = _failing(uri)
    with pytest.raises(CredentialsHidden) as raised:
        with exceptions_hidden():
            raise original
    stand_in = raised.value
    stored = [str(stand_in), "".join(traceback.format_exception(stand_in)),
              pickle.dumps(stand_in).decode("latin-1")]
    assert all(SECRET not in text for text in stored), stored
    assert str(stand_in) == redact(f"RuntimeError: API request to {uri}/api/2.0/mlflow/runs/create failed")
    assert stand_in.__notes__ == [redact(f"in task 'store {uri}'")]
    restored = pickle.loads(pickle.dumps(stand_in))  # as a Dask worker or the result store gives it back
    assert (str(restored), restored.__notes__, unhidden(restored)) == (str(stand_in), stand_in.__notes__, restored)
    assert unhidden(stand_in) is original


def test_an_exception_with_the_credential_only_in_its_cause_is_hidden_and_a_clean_one_is_left_alone() -> None:
    try:
        raise KeyError("run") from ConnectionError(f"https://{SECRET}@host refused")
    except KeyError as exc:
        assert isinstance(hidden(exc), CredentialsHidden) and SECRET not in str(hidden(exc))
    clean = ValueError("params.yaml: run.seed: must be ≥ 0 (see http://127.0.0.1:5000)")
    assert hidden(clean) is clean and unhidden(clean) is clean
    with pytest.raises(ValueError) as raised:
        with exceptions_hidden():
            raise clean
    assert raised.value is clean


def test_a_stage_task_fails_with_its_name_and_without_the_credential() -> None:
    """A job's failure leaves the Prefect task (flows.stage._run_batch) redacted, still naming the job."""
    from flows.stage import _run_batch, failed_task

    def store() -> None:
        raise ConnectionError(f"http://alice:{SECRET}@127.0.0.1:9 refused")

    with pytest.raises(CredentialsHidden) as raised:
        _run_batch(["store job"], [store], [{}])
    assert SECRET not in "".join(traceback.format_exception(raised.value))
    assert failed_task(raised.value) == "'store job'"
    assert isinstance(unhidden(raised.value), ConnectionError)


def test_records_sent_to_the_prefect_api_are_redacted() -> None:
    """Prefect's API log handler (its records are rows of the Prefect database) formats a record after the
    filter :func:`hide_in_prefect_logs` puts on it: message, arguments and traceback carry no credential."""
    from prefect import flow  # noqa: F401  (configures Prefect's logging, as flows.stage does)
    from prefect.logging.handlers import APILogHandler

    hide_in_prefect_logs()
    hide_in_prefect_logs()  # once per handler
    handlers = {h for h in logging.getLogger("prefect.flow_runs").handlers if isinstance(h, APILogHandler)}
    assert handlers and all(sum(isinstance(f, RedactingFilter) for f in h.filters) == 1 for h in handlers)
    try:
        raise ConnectionError(f"https://{SECRET}@127.0.0.1:9/api refused")
    except ConnectionError:
        record = logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "store %s unreachable",
                                   (f"http://bob:{SECRET}@127.0.0.1:9/?token={SECRET}",), sys.exc_info())
    handler = handlers.pop()
    assert handler.filter(record)
    text = handler.format(record)
    assert SECRET not in text
    assert "store http://bob:***@127.0.0.1:9/?token=*** unreachable" in text and "https://***@127.0.0.1:9/api" in text


def test_an_announced_line_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.stage import announce

    announce("partition", f"store http://alice:{SECRET}@127.0.0.1:9")
    assert capsys.readouterr().err == "[partition] store http://alice:***@127.0.0.1:9\n"


@pytest.mark.parametrize("uri, shown", [(f"http://alice:{SECRET}@127.0.0.1:9", "http://alice:***@127.0.0.1:9"),
                                        (f"https://{SECRET}@mlflow.example", "https://***@mlflow.example"),
                                        (f"http://h:5000/?token={SECRET}", "http://h:5000/?token=***")])
def test_the_doctor_names_the_store_without_its_credential(uri: str, shown: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setattr(doctor, "checks", lambda *args, **kwargs: [doctor.mlflow_store()])
    lines: list[str] = []
    assert doctor.run(Path("params.yaml"), echo=lines.append) == 0
    assert lines == [doctor.Check("info", "mlflow", f"{shown} (a server: not checked)").line()]


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


def test_the_stand_in_pickles_without_the_original_even_under_tblib() -> None:
    """``distributed`` installs tblib's exception pickling, which pickles an exception's ``__context__`` (here the
    original, credential and all) and traceback: the stand-in still leaves alone. Fails without the copyreg entry
    that :func:`exceptions_hidden` restores before raising."""
    import copyreg

    import tblib.pickling_support

    uri = f"http://alice:{SECRET}@127.0.0.1:9"
    saved = dict(copyreg.dispatch_table)
    try:
        tblib.pickling_support.install()  # what importing distributed.utils does
        with pytest.raises(CredentialsHidden) as raised:
            with exceptions_hidden():
                raise _failing(uri)
        assert raised.value.__context__ is not None  # Python chains the original: the pickle must leave it out
        data = pickle.dumps(raised.value)
    finally:
        copyreg.dispatch_table.clear()
        copyreg.dispatch_table.update(saved)
    assert SECRET.encode() not in data
    assert str(pickle.loads(data)) == redact(f"RuntimeError: API request to {uri}/api/2.0/mlflow/runs/create failed")
