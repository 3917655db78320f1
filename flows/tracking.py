"""MLflow tracking: the one module that knows the tracking URI, the tags and how tables/figures are logged.

* Default store: ``sqlite:///<project>/mlruns.db`` (MLflow ≥ 3.13 refuses the plain file store), where
  ``<project>`` is the repository the user runs in (:func:`flows.project.project_root`: queued DVC
  experiments log into the user's store, not their temporary copy's); the ``MLFLOW_TRACKING_URI``
  environment variable overrides it (use ``http://…`` when several hosts log at once).
* A fresh SQLite store is created and migrated under a file lock (:func:`flows.project.exclusive`), once:
  two stages starting together on a new store cannot leave it half-migrated.
* One run per stage execution, tagged ``stage``, ``git_commit`` (``-dirty`` only when code differs from
  the commit; DVC's own rewrites of outputs and ``dvc.lock`` do not count), ``params_hash`` and, under
  ``dvc exp run``, ``dvc_experiment``; its description is the stage's. Variants are nested child runs with
  identical metric names so the MLflow compare view lines them up. The experiment opens on the runs view.
* Every call goes through :class:`mlflow.MlflowClient` with explicit run ids: the fluent "active run" is
  thread-local, and stage work fans out over Prefect worker threads.
* Every call waits out a locked SQLite store (:func:`retry_while_locked`): MLflow gives each SQLite
  transaction a 20 s busy timeout and turns a longer wait into ``database is locked``; the call is retried
  with backoff for up to ``OTFED_TRACKING_RETRY_S`` seconds (default :data:`RETRY_S`), so a stage never
  loses a param, a metric or its run's end because another process held the store's write lock. A
  transaction that fails so is rolled back, and a retried call is idempotent even where part of it had
  committed (``log_batch`` commits params, metrics and tags separately): an identical param is skipped,
  an identical metric point is not inserted twice, a tag or a run status is overwritten with the same
  value — a retry never duplicates anything. Several hosts, or many processes at once: log over HTTP to
  ``make mlflow-server`` (a server answers a locked write to its own SQLite store with HTTP 503, which
  MLflow's HTTP client retries with backoff, and so does this module).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import random
import socket
import sqlite3
import subprocess
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, TypeVar

from flows import project
from otfed import io

EXPERIMENT = "otfed"
# the files whose changes make a run's code differ from its commit (not DVC outputs, not dvc.lock)
CODE = ("otfed", "stages", "flows", "dvc.yaml", "pyproject.toml", "requirements.lock")
# MLflow 3's UI opens an experiment of this kind on its runs view (not the empty GenAI overview)
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# how long one tracking call keeps retrying a locked SQLite store (``OTFED_TRACKING_RETRY_S`` overrides; 0:
# no retry); each attempt itself waits up to MLflow's busy timeout (20 s) for the lock
RETRY_S = 300.0
RETRY_ENV = "OTFED_TRACKING_RETRY_S"
RETRY_FIRST_DELAY_S = 0.05
RETRY_MAX_DELAY_S = 2.0
LOCKED = "database is locked"

log = logging.getLogger("otfed.tracking")
T = TypeVar("T")


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the project's SQLite store ``<project>/mlruns.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project.project_root() / 'mlruns.db'}"


def git_commit(cwd: str | Path | None = None) -> str:
    """The commit of the code being run (``unknown`` outside a repository), ``-dirty`` when the code differs
    from it (:data:`CODE`; outputs and ``dvc.lock``, which DVC rewrites during a run, do not count). Under
    ``dvc exp run`` the commit is the experiment's baseline (``DVC_EXP_BASELINE_REV``)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha = os.environ.get("DVC_EXP_BASELINE_REV") or git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", *CODE)
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI; None for any other store (a server)."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def is_locked(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's ``database is locked`` — raised by sqlite3, wrapped by SQLAlchemy and by
    MLflow's store (``TEMPORARILY_UNAVAILABLE``), or returned by a tracking server on a SQLite store — as
    itself or as any exception it was raised from."""
    import sqlalchemy.exc
    from mlflow.exceptions import MlflowException

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (sqlite3.OperationalError, sqlalchemy.exc.OperationalError, MlflowException)) \
                and LOCKED in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_while_locked(call: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)``, retried while it fails with ``database is locked`` (:func:`is_locked`):
    exponential backoff with jitter (:data:`RETRY_FIRST_DELAY_S` doubling up to :data:`RETRY_MAX_DELAY_S`)
    for at most ``OTFED_TRACKING_RETRY_S`` seconds (default :data:`RETRY_S`; 0: one attempt). Any other
    error, or the lock still held when the time is up, is raised at once (the latter with a note saying so)."""
    budget = float(os.environ.get(RETRY_ENV) or RETRY_S)
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not is_locked(exc):
                raise
            attempt += 1
            waited = time.monotonic() - start
            delay = min(RETRY_MAX_DELAY_S, RETRY_FIRST_DELAY_S * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            name = getattr(call, "__name__", "call")
            if waited + delay > budget:
                exc.add_note(f"MLflow store still locked after {attempt} attempt(s) of {name} over {waited:.0f} s "
                             f"({RETRY_ENV}={budget:g}); for many concurrent writers log to a tracking server "
                             "(make mlflow-server)")
                raise
            if attempt == 1:
                log.warning("MLflow store locked during %s; retrying for up to %g s", name, budget)
            time.sleep(delay)


class _RetriedLocks(logging.Filter):
    """Drops MLflow's own traceback of a ``database is locked`` error (``mlflow.store.db.utils`` logs one per
    failed transaction): :func:`retry_while_locked` retries it, warns once, and raises it if it persists."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[1] is not None and is_locked(record.exc_info[1]))


class _RetryingClient:
    """An :class:`mlflow.MlflowClient` whose every method call goes through :func:`retry_while_locked`."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        return functools.partial(retry_while_locked, attr) if callable(attr) else attr


def _store_lock(uri: str) -> AbstractContextManager[None]:
    """The cross-process lock of a SQLite store (``<db>.lock`` beside it); nothing for a server."""
    db = sqlite_path(uri)
    return project.exclusive(db.with_name(db.name + ".lock")) if db is not None else nullcontext()


def _client() -> Any:
    """An MLflow client on :func:`tracking_uri` whose every call waits out a locked store
    (:class:`_RetryingClient`); a SQLite store is created / migrated under its lock."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    store_log = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _RetriedLocks) for f in store_log.filters):
        store_log.addFilter(_RetriedLocks())
    uri = tracking_uri()
    with _store_lock(uri):
        client = _RetryingClient(mlflow.MlflowClient(tracking_uri=uri))
        client.search_experiments(max_results=1)  # opens the store: creates and migrates its schema
    return client


def _experiment_id(client: Any, name: str) -> str:
    """The experiment ``name``, created once (under the store's lock) and set to open on the runs view."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        uri = tracking_uri()
        db = sqlite_path(uri)
        with _store_lock(uri):
            exp = client.get_experiment_by_name(name)
            if exp is None:
                client.create_experiment(name, tags=EXPERIMENT_KIND,
                                         artifact_location=(db.parent / "mlartifacts").as_uri() if db else None)
                exp = client.get_experiment_by_name(name)
    for key, value in EXPERIMENT_KIND.items():
        if exp.tags.get(key) != value:
            client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


@contextmanager
def _ending(client: Any, run_id: str) -> Iterator[None]:
    """End run ``run_id`` when the block ends: FINISHED, FAILED on an error, KILLED on Ctrl-C / SIGTERM
    (KeyboardInterrupt, Prefect's TerminationSignal) — never left RUNNING."""
    status = "FAILED"
    try:
        yield
        status = "FINISHED"
    except Exception:
        raise
    except BaseException:
        status = "KILLED"
        raise
    finally:
        client.set_terminated(run_id, status)


@dataclass
class TrackedRun:
    """A handle on one MLflow run; every logging call names the run id explicitly (thread-safe)."""

    client: Any
    run_id: str
    experiment_id: str
    _step: dict[str, int] = field(default_factory=dict)

    # -- values
    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(_metric_key(k), float(v), now, step or 0) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i:i + 500])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    # -- files (written by the caller: this module only logs, it never writes an output)
    def log_artifact(self, path: str | Path) -> None:
        """Log a file under its final path relative to the repository (e.g. ``reports/fed_distance``)."""
        final = io.final_location(Path(path).resolve())
        try:  # stages run from the repository root (DVC's working directory)
            artifact_dir = str(final.relative_to(Path.cwd().resolve()).parent)
        except ValueError:  # outside the working directory: keep the folder name
            artifact_dir = final.parent.name
        # a file in the working directory itself goes to the run's root (a server refuses the path ".")
        self.client.log_artifact(self.run_id, str(path),
                                 artifact_path=None if artifact_dir in ("", ".") else artifact_dir)

    # -- nesting
    @contextmanager
    def child(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator["TrackedRun"]:
        """A nested run (one per variant); same metric names across siblings for the compare view."""
        all_tags = {"mlflow.parentRunId": self.run_id, "variant": name, **owner_tags(), **(tags or {})}
        run = self.client.create_run(self.experiment_id, tags={k: str(v) for k, v in all_tags.items()},
                                     run_name=name)
        child = TrackedRun(self.client, run.info.run_id, self.experiment_id)
        with _ending(self.client, child.run_id):
            yield child


def flat_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested metrics dict → dotted numeric keys (``clustering.pairs_strong.affinity``); non-numbers dropped."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            flat.update(flat_metrics(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{prefix}{key}"] = float(value)
    return flat


def _metric_key(key: str) -> str:
    """MLflow keys allow alphanumerics, _ - . / and space; replace anything else."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in key)


@contextmanager
def stage_run(stage: str, params: Any, params_hash: str, experiment: str = EXPERIMENT,
              description: str = "") -> Iterator[TrackedRun]:
    """Open the MLflow run of one stage execution, tagged stage / git_commit / params_hash, params logged.

    ``params`` is the flattened dict of the params groups the stage reads; ``description`` shows on the run's
    page. The run ends FINISHED, FAILED on an error, KILLED on Ctrl-C / SIGTERM (:func:`_ending`).
    """
    client = _client()
    exp_id = _experiment_id(client, experiment)
    for run_id in close_abandoned_runs(client, exp_id, by=f"the start of stage {stage} (pid {os.getpid()})"):
        log.warning("MLflow run %s was left RUNNING by a process that no longer exists: marked KILLED", run_id)
    tags = {"stage": stage, "git_commit": git_commit(), "params_hash": params_hash, **owner_tags()}
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc_experiment"] = os.environ["DVC_EXP_NAME"]
    if description:
        tags["mlflow.note.content"] = description
    run = client.create_run(exp_id, tags=tags, run_name=stage)
    tracked = TrackedRun(client, run.info.run_id, exp_id)
    with _ending(client, tracked.run_id):
        tracked.log_params(params)
        yield tracked


OWNER = ("otfed.host", "otfed.pid", "otfed.pid_started")


def owner_tags() -> dict[str, str]:
    """Which process owns a run: host, pid and the pid's start time (a recycled pid is another process)."""
    import psutil

    return dict(zip(OWNER, (socket.gethostname(), str(os.getpid()), repr(psutil.Process().create_time()))))


def abandoned_runs(client: Any, experiment_id: str) -> list[Any]:
    """Every run of the experiment still RUNNING whose owner (:func:`owner_tags`) is a process of this host that no
    longer exists (pid *and* start time) — a stage killed by SIGKILL or the OOM killer never ends its run. Runs
    owned by a live process, by another host, or without owner tags are not among them."""
    import psutil

    host = socket.gethostname()
    found = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'",
                                  max_results=1000):
        tags = run.data.tags
        if tags.get(OWNER[0]) != host or OWNER[1] not in tags or OWNER[2] not in tags:
            continue
        try:
            alive = repr(psutil.Process(int(tags[OWNER[1]])).create_time()) == tags[OWNER[2]]
        except (psutil.NoSuchProcess, ValueError):
            alive = False
        if not alive:
            found.append(run)
    return found


def close_abandoned_runs(client: Any, experiment_id: str, by: str = "the next stage") -> list[str]:
    """Mark KILLED every :func:`abandoned_runs` run, with a note on its page (``mlflow.note.content``, after its
    description; also tag ``otfed.end_note``) saying which process left it and who closed it (``by``). Returns
    the run ids marked."""
    marked = []
    for run in abandoned_runs(client, experiment_id):
        tags = run.data.tags
        note = (f"Marked KILLED by {by}: the process that ran it (pid {tags[OWNER[1]]} on {tags[OWNER[0]]}) "
                "no longer exists — killed by SIGKILL, the out-of-memory killer or a reboot before it could end "
                "the run.")
        described = tags.get("mlflow.note.content", "")
        client.set_tag(run.info.run_id, "otfed.end_note", note)
        client.set_tag(run.info.run_id, "mlflow.note.content", f"{described}\n\n{note}" if described else note)
        client.set_terminated(run.info.run_id, "KILLED")
        marked.append(run.info.run_id)
    return marked


def params_hash(params: Mapping[str, Any]) -> str:
    """A short, stable hash of the params a stage read (tagged on every MLflow run)."""
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten params to dotted keys (MLflow params; the compare view lines them up)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, prefix=f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, list) else str(value)
    return out
