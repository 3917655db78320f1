"""Prefect and torch execution settings: the one place that knows how stage work is run.

* ``PREFECT_HOME`` defaults to ``<repo>/.prefect`` so every flow run of every stage lands in one local
  database; ``prefect server start`` with the same ``PREFECT_HOME`` shows them in the UI. Set
  ``PREFECT_API_URL`` to log to a running server instead (needed for schedules and workers).
* Task runners: ``thread`` (default, ThreadPoolTaskRunner with ``run.max_workers``), ``sequential``
  (one worker) or ``process`` (ProcessPoolTaskRunner). DVC decides staleness, so Prefect result caching
  is off (``cache_policy=NO_CACHE`` on every task).
* Torch device: ``auto`` → CUDA when present, else CPU; a GPU worker runs the same flow unchanged.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def configure_prefect_environment() -> None:
    """Project-local Prefect home, no analytics, quiet logs; call before importing prefect."""
    os.environ.setdefault("PREFECT_HOME", str(REPO_ROOT / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def task_runner(kind: str, max_workers: int) -> Any:
    """The Prefect task runner named in ``run.task_runner`` (thread | sequential | process)."""
    from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

    if kind == "thread":
        return ThreadPoolTaskRunner(max_workers=max_workers)
    if kind == "sequential":
        return ThreadPoolTaskRunner(max_workers=1)
    if kind == "process":
        return ProcessPoolTaskRunner(max_workers=max_workers)
    raise ValueError(f"run.task_runner must be one of thread, sequential, process (got {kind!r})")


def stage_flow(name: str, fn: Callable[..., Any], runner_kind: str, max_workers: int) -> Any:
    """Wrap a stage function as a Prefect flow with the configured task runner (params are validated by
    otfed.config before, so Prefect's own parameter validation is off)."""
    from prefect import flow

    return flow(name=name, validate_parameters=False, task_runner=task_runner(runner_kind, max_workers))(fn)


def fan_out(task: Any, jobs: Iterable[dict[str, Any]]) -> list[Any]:
    """Submit ``task`` once per kwargs dict to the flow's task runner; results in job order.

    Outside a flow run (unit tests, library use) the task's plain function runs in-process, in order —
    no Prefect server is started.
    """
    from prefect.context import FlowRunContext

    jobs = list(jobs)
    if FlowRunContext.get() is None:
        return [task.fn(**job) for job in jobs]
    futures = [task.submit(**job) for job in jobs]
    return [f.result() for f in futures]


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; explicit values pass through."""
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def stage_torch_device(device: str) -> str:
    """The device of a torch stage (:func:`resolve_device`). On CPU, torch is pinned to one intra-op thread:
    the stage's concurrent Prefect tasks then each use one core without oversubscription, and float sums
    are the same from run to run."""
    device = resolve_device(device)
    if device == "cpu":
        import torch

        torch.set_num_threads(1)
    return device


def call_in_order(fn: Callable[..., T], jobs: Iterable[dict[str, Any]]) -> list[T]:
    """The sequential twin of :func:`fan_out` for library callers outside Prefect."""
    return [fn(**job) for job in jobs]
