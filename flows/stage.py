"""The one generic stage flow: every DVC stage runs through :func:`main` / :func:`run_stage`.

``python -m stages.<name>`` (what ``dvc.yaml`` calls) → :func:`main`:

1. ``params.yaml`` is validated once (bad params → one line per problem, exit 2, nothing written);
2. the stage runs as a Prefect flow named after it, with the task runner of ``run.task_runner``;
3. :func:`run_stage`: every output folder of the stage is built in a staging folder and swapped in only
   when the whole stage succeeds; one MLflow run (tags ``stage``, ``git_commit``, ``params_hash``) holds
   the params it read, the report's tables and figures, its nested variant runs and ``metrics.json``;
   the stage's jobs fan out as Prefect tasks (one task run per job, results in job order);
4. an :class:`~otfed.errors.OtfedError` (missing data file, degenerate client …) → ``error: …``, exit 2.

Outside a Prefect flow (tests, notebooks) :func:`run_stage` runs the jobs in order in-process: no server.
"""
from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd

from flows import tracking
from otfed import io
from otfed.errors import ConfigError, OtfedError
from stages.params import load_params, stage as stage_named, validate_params
from stages.stage import Job, Stage

REPO_ROOT = Path(__file__).resolve().parent.parent


def configure_prefect_environment() -> None:
    """Project-local Prefect home, no analytics, quiet logs; call before importing prefect."""
    os.environ.setdefault("PREFECT_HOME", str(REPO_ROOT / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def task_runner(kind: str, max_workers: int) -> Any:
    """The Prefect task runner named in ``run.task_runner``: ``thread`` (``run.max_workers`` threads) or
    ``sequential`` (one worker thread)."""
    from prefect.task_runners import ThreadPoolTaskRunner

    if kind == "thread":
        return ThreadPoolTaskRunner(max_workers=max_workers)
    if kind == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    raise ValueError(f"run.task_runner must be one of thread, sequential (got {kind!r})")


def _run_job(job: Job) -> Any:
    return job()


def fan_out(jobs: list[Job]) -> list[Any]:
    """Run every job; results in job order. Inside a flow run each job is a Prefect task run (named after
    the job) submitted to the flow's task runner; outside one they run in-process, in order."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return [job() for job in jobs]
    futures = [task(_run_job, name=job.fn.__name__.replace("_", "-"), task_run_name=job.name,
                    cache_policy=NO_CACHE).submit(job) for job in jobs]
    return [f.result() for f in futures]


class TrackedReport:
    """:class:`stages.stage.Report` over an MLflow run: every file written is logged as an artifact."""

    def __init__(self, run: tracking.TrackedRun, out: Path) -> None:
        self._run = run
        self._out = out

    @property
    def out(self) -> Path:
        return self._out

    def table(self, frame: pd.DataFrame, name: str, markdown: bool = True) -> Path:
        return self._run.log_table(frame, self._out / name, markdown=markdown)

    def figure(self, fig: Any, name: str) -> Path:
        return self._run.log_figure(fig, self._out / name)

    def artifact(self, path: str | Path) -> None:
        self._run.log_artifact(path)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._run.log_params(params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self._run.log_metrics(metrics, step=step)

    @contextmanager
    def variant(self, name: str, tags: Mapping[str, Any] | None = None) -> Iterator[tracking.TrackedRun]:
        with self._run.child(name, tags=tags) as child:
            yield child


def params_read(p: Any, stage: Stage) -> dict[str, Any]:
    """The params a stage reads, as JSON-able values: ``run``, its own group, and its ``reads`` keys."""
    read: dict[str, Any] = {"run": _jsonable(p.run), stage.name: _jsonable(getattr(p, stage.name))}
    for key in stage.reads:
        value: Any = p
        for part in key.split("."):
            value = value[part] if isinstance(value, dict) else getattr(value, part)
        read[key] = _jsonable(value)
    return read


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def run_stage(stage: Stage | str, params: Any) -> dict[str, Any]:
    """Run one stage on validated ``Params`` (or a params dict, validated here): staged outputs, one MLflow
    run, jobs fanned out, the report step, ``metrics.json``. Returns the headline metrics."""
    stage = stage_named(stage) if isinstance(stage, str) else stage
    p = validate_params(params) if isinstance(params, dict) else params
    if getattr(p, stage.name) is None:
        raise ConfigError(f"params.yaml: {stage.name}: required key is missing")
    read = params_read(p, stage)
    with tracking.stage_run(stage.name, tracking.flatten(read), tracking.params_hash(read)) as run, \
            ExitStack() as staged:
        dirs = {folder: staged.enter_context(io.staged_directory(folder)) for folder in stage.outputs}
        results = fan_out(stage.jobs(p, dirs))
        reports = dirs[stage.outputs[0]]
        metrics = stage.report(p, results, TrackedReport(run, reports), dirs)
        io.write_json(metrics, reports / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(reports / "metrics.json")
    return metrics


def main(stage: Stage | str, params_path: str | Path = "params.yaml") -> int:
    """``python -m stages.<name>``: validate params, run the stage as a Prefect flow, map errors to exit 2."""
    try:
        p = load_params(params_path)
        the_stage = stage_named(stage) if isinstance(stage, str) else stage
    except OtfedError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    configure_prefect_environment()
    from prefect import flow

    def stage_flow(params: dict[str, Any]) -> dict[str, Any]:
        return run_stage(the_stage, p)  # ``params`` is what the Prefect UI shows; p is already validated

    runner = task_runner(p.run.task_runner, p.run.max_workers)
    try:
        flow(name=the_stage.name, validate_parameters=False, task_runner=runner)(stage_flow)(params_read(p, the_stage))
    except OtfedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # python -m flows.stage <name>
    raise SystemExit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
