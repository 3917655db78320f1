"""The one shape every stage has, and the interfaces its report step writes through.

A stage module in ``stages/`` holds, in this order:

0. ``OUTPUTS`` — the folders it writes (constants of ``stages/layout.py``; the first holds its reports);
1. its **params type** — a :class:`~otfed.schema.Strict` model, validated from the ``params.yaml`` group
   named after the stage (built from the library's own config types: no mirrors, no adapters);
2. :func:`jobs` — the list of independent units of work (:class:`Job`: one pure task function + its
   arguments), built from the validated params;
3. one **pure task function per kind of job** — arrays / paths in, table rows and arrays out; no MLflow,
   no Prefect, no global state (files only under the staged output folders it is handed);
4. :func:`report` — turns the job results (in job order) into tables, figures, nested variant runs and
   the headline metrics (returned; the runner writes ``metrics.json``); ``check(p)`` beside them when the
   group names things in other groups (a federation, a task), raising ValueError naming the key;
5. ``STAGE`` — the :class:`Stage` record tying these together, and the ``__main__`` entry point that DVC
   calls (``python -m stages.<name>``), which hands the stage to the runner.

The runner (``flows/stage.py``) validates params once, stages every output folder atomically, fans the
jobs out with the configured task runner, opens the MLflow run and hands :func:`report` a
:class:`Report`. Stages never import Prefect or MLflow; the library (``otfed/``) never imports stages.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import pandas as pd

from otfed.schema import Strict


@dataclass(frozen=True)
class Job:
    """One unit of fan-out work: ``fn(**kwargs)``. ``name`` labels its task run and progress line."""

    name: str
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.fn(**self.kwargs)


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds (the ``seconds`` columns of stage tables)."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


class Variant(Protocol):
    """A nested run (one per variant: same metric names across siblings for the MLflow compare view)."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...


class Report(Variant, Protocol):
    """What a report step writes through: files in the staged reports folder, logged as they are written."""

    @property
    def out(self) -> Path: ...  # the (staged) reports folder of the stage

    def table(self, frame: pd.DataFrame, name: str, markdown: bool = True) -> Path: ...

    def figure(self, fig: Any, name: str) -> Path: ...

    def artifact(self, path: str | Path) -> None: ...

    def variant(self, name: str, tags: Mapping[str, Any] | None = None) -> AbstractContextManager[Variant]: ...


# (validated Params, {output folder → its staging folder}) → the jobs
JobsFn = Callable[[Any, Mapping[str, Path]], list[Job]]
# (validated Params, job results in job order, report, {output folder → staging folder}) → headline metrics
ReportFn = Callable[[Any, list[Any], Report, Mapping[str, Path]], dict[str, Any]]
# validated Params → None, or ValueError naming the key (cross-group references, checked before any work)
CheckFn = Callable[[Any], None]


@dataclass(frozen=True)
class Stage:
    """A DVC stage: its params group, its output folders (``stages.layout``), its jobs and its report.

    ``name`` is the DVC stage name and the ``params.yaml`` group. ``outputs[0]`` is the reports folder
    (``metrics.json`` goes there). ``reads`` are the other params keys its results depend on (its
    ``dvc.yaml`` params deps besides ``run`` and its own group; ``check`` may look at more, e.g. that a
    federation it names exists — its data arrive through the files it depends on).
    ``required`` groups must be present in every params file.
    """

    name: str
    params: type[Strict]
    outputs: tuple[str, ...]
    jobs: JobsFn
    report: ReportFn
    check: CheckFn | None = None
    reads: tuple[str, ...] = ()
    required: bool = False
