"""MLflow tracking: the one module that knows the tracking URI, the tags and how tables/figures are logged.

* Default store: ``sqlite:///<repo>/mlruns.db`` (MLflow ≥ 3.13 refuses the plain file store); the
  ``MLFLOW_TRACKING_URI`` environment variable overrides it (use ``http://…`` when several processes or
  hosts log at once — parallel writers on one SQLite file race).
* One run per stage execution, tagged ``stage``, ``git_commit`` and ``params_hash``; variants are nested
  child runs with identical metric names so the MLflow compare view lines them up.
* Every call goes through :class:`mlflow.MlflowClient` with explicit run ids: the fluent "active run" is
  thread-local, and stage work fans out over Prefect worker threads.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd

from otfed import io

REPO_ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = "otfed"


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the repository's SQLite store."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{REPO_ROOT / 'mlruns.db'}"


def git_commit() -> str:
    """The current git commit (``unknown`` outside a repository); ``-dirty`` if the tree has changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _client() -> Any:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    return mlflow.MlflowClient(tracking_uri=tracking_uri())


def _experiment_id(client: Any, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    artifact_location = None
    if tracking_uri().startswith("sqlite:"):
        artifact_location = (REPO_ROOT / "mlartifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


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

    # -- files
    def log_table(self, frame: pd.DataFrame, path: str | Path, markdown: bool = True) -> Path:
        """Write ``frame`` atomically as CSV (and a Markdown twin) and log both as artifacts."""
        path = Path(path)
        io.write_csv(frame, path)
        self.log_artifact(path)
        if markdown:
            md = path.with_suffix(".md")
            io.write_text(io.markdown_table(frame), md)
            self.log_artifact(md)
        return path

    def log_figure(self, fig: Any, path: str | Path) -> Path:
        """Save a matplotlib figure atomically as PNG and log it as an artifact."""
        path = io.save_figure(fig, path)
        self.log_artifact(path)
        return path

    def log_artifact(self, path: str | Path) -> None:
        """Log a file under its final path relative to the repository (e.g. ``reports/fed_distance``)."""
        final = io.final_location(Path(path).resolve())
        try:
            artifact_dir = str(final.relative_to(REPO_ROOT).parent)
        except ValueError:  # outside the repository (tests): keep the folder name
            artifact_dir = final.parent.name
        self.client.log_artifact(self.run_id, str(path), artifact_path=artifact_dir)

    # -- nesting
    @contextmanager
    def child(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator["TrackedRun"]:
        """A nested run (one per variant); same metric names across siblings for the compare view."""
        all_tags = {"mlflow.parentRunId": self.run_id, "variant": name, **(tags or {})}
        run = self.client.create_run(self.experiment_id, tags={k: str(v) for k, v in all_tags.items()},
                                     run_name=name)
        child = TrackedRun(self.client, run.info.run_id, self.experiment_id)
        status = "FAILED"
        try:
            yield child
            status = "FINISHED"
        finally:
            self.client.set_terminated(child.run_id, status)


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
def stage_run(stage: str, params: Any, params_hash: str, experiment: str = EXPERIMENT) -> Iterator[TrackedRun]:
    """Open the MLflow run of one stage execution, tagged stage / git_commit / params_hash, params logged.

    ``params`` is the flattened dict of the params groups the stage reads.
    """
    client = _client()
    exp_id = _experiment_id(client, experiment)
    tags = {"stage": stage, "git_commit": git_commit(), "params_hash": params_hash}
    run = client.create_run(exp_id, tags=tags, run_name=stage)
    tracked = TrackedRun(client, run.info.run_id, exp_id)
    status = "FAILED"
    try:
        tracked.log_params(params)
        yield tracked
        status = "FINISHED"
    finally:
        client.set_terminated(tracked.run_id, status)


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
