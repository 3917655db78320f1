"""The one generic stage flow: every DVC stage runs through :func:`main` / :func:`run_stage`.

``python -m flows.stage <name> [--verbose]`` (what every ``dvc.yaml`` cmd calls; ``otfed run <name>`` too) →
:func:`cli` → :func:`main`, which finds the stage by name (:func:`stages.params.stage`). This runner is the one
entry point: the stage modules in ``stages/`` never import ``flows``.

1. ``params.yaml`` is validated and the preflight (:func:`stages.stage.preflight`) runs before any server
   starts: the stage's inputs exist and are readable, its output folders can be replaced, their disk has room,
   and its own ``Stage.preflight`` reads its data through the validating loaders; bad params, a bad data
   file, a missing checkpoint, a read-only folder, a full disk → one ``error:`` line, exit 2, nothing written;
2. the stage runs as a Prefect flow named after it, with the task runner of ``run.task_runner``; a progress
   line per finished task (done / total, elapsed, ETA) goes to stderr and, as an INFO log, to the flow run
   in the Prefect UI;
3. :func:`run_stage`: first what killed stages left beside any stage's outputs is cleaned where its owner
   process is gone (:mod:`flows.leftovers`); every output folder of the stage is built in a staging folder,
   owned by this process (pid and start time, recorded beside it), and swapped in only
   when the whole stage succeeds; one MLflow run (tags ``stage``, ``git_commit``, ``params_hash``) holds
   the params it read, the report's tables and figures, its nested variant runs and ``metrics.json``;
   the stage's jobs fan out as Prefect tasks (one task run per job) and their results reach the report by job
   key (:class:`stages.stage.Results`, in job order; two jobs with one key: a ValueError before any runs);
4. a failure ends in one ``error:`` line naming the task that failed (exit 2 for an
   :class:`~otfed.errors.OtfedError` — bad data, degenerate client —, 1 for anything else); the full
   traceback goes to the stage's log file (``.prefect/logs/<stage>.log``) and, with ``--verbose``, to the
   console with Prefect's own logs;
5. Ctrl-C / SIGTERM end the MLflow run as KILLED and the Prefect flow run as crashed and keep the previous
   outputs (exit 130 / 143). The outputs are ``persist: true`` in
   ``dvc.yaml``, so DVC does not delete them before the command runs either. Tasks still running in threads
   are not waited for: the process exits as soon as it has cleaned up;
6. the stage answers to its caller (:mod:`flows.caller`): when the process that started it (``dvc``) exits,
   the stage stops as if it had received SIGTERM, and it never swaps its outputs in after its caller is gone;
7. the flow runs against the project's one Prefect server (:mod:`flows.prefect_server`), started by the first
   stage that needs it, found again by the next, used by the stage's Dask workers too, and stopped once no
   stage has used it for a minute — also when the last one was SIGKILLed (or the user's ``PREFECT_API_URL``).

Outside a Prefect flow (tests, notebooks) :func:`run_stage` runs the jobs in order in-process: no server.
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd
import yaml

from flows import leftovers, prefect_server, project, runners, tracking
from flows.caller import CallerGone, Lifeline, arm, armed, disarm
from flows.redaction import RedactingFormatter, exceptions_hidden, hide_in_prefect_logs, redact, unhidden
from otfed import io
from otfed.cpu_kernels import hold_torch_kernels, kernels_in_use, portability_gaps
from otfed.errors import ConfigError, OtfedError
from stages.params import load_params, stage as stage_named, stages as all_stages, validate_params
from stages.stage import (Job, Results, Stage, check_keys, committed_table, headline_metrics, preflight,
                          unmatched_patterns, wall_time_columns)

log = logging.getLogger("otfed.stage")


# a temporary Prefect server's start-up ceiling when the user has set none (stages use the project's server,
# flows/prefect_server.py, which has no start-up timeout; this covers code that falls back on Prefect's own
# temporary server): generous, so that a slow or loaded machine never fails a run on a timer
PREFECT_STARTUP_TIMEOUT_S = 600


def configure_prefect_environment(verbose: bool = False) -> None:
    """Prefect home in the user's project, no analytics, INFO logs to the Prefect UI, and a console that
    shows Prefect's own logs only with ``verbose`` (the runner prints progress and errors itself).
    Call before importing prefect.

    No start-up timeout decides a run: a stage waits for the project's Prefect server as long as it lives
    (:mod:`flows.prefect_server`), and a temporary server of Prefect's own, should one be started, may take up
    to :data:`PREFECT_STARTUP_TIMEOUT_S` (600 s; ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``). What
    used to make servers time out — a full disk, a read-only output folder, a missing input or checkpoint — is
    reported by the preflight first (:func:`stages.stage.preflight`), before any server starts. Every variable
    set here keeps a value the user has set."""
    os.environ.setdefault("PREFECT_HOME", str(project.prefect_home()))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_STARTUP_TIMEOUT_S))


# ---------------------------------------------------------------------------------------- progress
def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """``[stage] 3/12 tasks · <task> done · 0:21 elapsed · ETA 1:04`` for each finished task (at most one
    line per ``every`` seconds, and always the last), through :func:`announce`."""

    def __init__(self, label: str, total: int, every: float = 2.0) -> None:
        self.label, self.total, self.every = label, total, every
        self.done = 0
        self.start = time.monotonic()
        self._last = float("-inf")
        self._lock = threading.Lock()

    def step(self, name: str) -> None:
        with self._lock:
            self.done += 1
            now = time.monotonic()
            if self.done < self.total and now - self._last < self.every:
                return
            self._last = now
            elapsed = now - self.start
            eta = elapsed / self.done * (self.total - self.done)
            tail = f" · ETA {_clock(eta)}" if self.done < self.total else ""
            announce(self.label, f"{self.done}/{self.total} tasks · {name} done · {_clock(elapsed)} elapsed{tail}")


def announce(label: str, message: str) -> None:
    """``[label] message`` on stderr, and as an INFO log of the current Prefect flow run (its UI page) when
    there is one."""
    from prefect.context import FlowRunContext
    from prefect.logging import get_run_logger

    line = redact(f"[{label}] {message}")
    print(line, file=sys.stderr, flush=True)
    if FlowRunContext.get() is not None:
        get_run_logger().info(line)


def _run_job(job: Job) -> Any:
    """Run one job, on the portable CPU kernels where the process holds them (:mod:`otfed.cpu_kernels`; a
    Dask worker is a process of its own); a failure carries the job's name (``in task <name>``) for the
    runner's error line."""
    hold_torch_kernels()
    try:
        return job()
    except Exception as exc:
        exc.add_note(f"in task {job.name!r}")
        raise


def _run_batch(names: list[str], fns: list[Any], calls: list[Mapping[str, Any]]) -> tuple[list[Any], list[str]]:
    """:func:`_run_job` of each ``Job(name, fn, kwargs)`` in turn: one task's parameters (a Dask task runner
    resolves the futures of scattered arguments inside ``calls`` before the call). Returns their results and
    the process's :func:`kernel_gaps` (a ``dask worker`` started by hand may run other CPU kernels than the
    stage's process: the stage says so). A failure whose text holds a credential leaves as its redacted stand-in
    (:func:`flows.redaction.exceptions_hidden`): Prefect stores a failed task's exception."""
    with exceptions_hidden():
        return [_run_job(Job(name, fn, kwargs)) for name, fn, kwargs in zip(names, fns, calls)], kernel_gaps()


@functools.cache
def kernel_gaps() -> list[str]:
    """This process's :func:`otfed.cpu_kernels.portability_gaps` where it should run the portable kernels
    (``OTFED_CPU_KERNELS=portable``), else none; once per process (the kernels are set for its lifetime)."""
    return portability_gaps(kernels_in_use()) if os.environ.get("OTFED_CPU_KERNELS") == "portable" else []


def failed_task(exc: BaseException) -> str | None:
    """The name of the task an exception came from (see :func:`_run_job`), if any."""
    for note in getattr(exc, "__notes__", []):
        if note.startswith("in task "):
            return note[len("in task "):]
    return None


def fan_out(jobs: list[Job], label: str = "stage", mix_kinds: bool = False) -> list[Any]:
    """Run every job; results in job order, a progress line per finished job. Inside a flow run the jobs are
    Prefect task runs submitted to the flow's task runner — one per job, or on a Dask cluster one per
    :func:`flows.runners.batches` group of jobs (a Dask task costs far more than a thread's); with
    ``mix_kinds`` (the ``thread`` runner) submitted in :func:`flows.runners.submission_order` of their task
    functions. Outside a flow run they run in-process, in order."""
    from prefect.context import FlowRunContext

    progress = Progress(label, len(jobs))
    if FlowRunContext.get() is None:
        results = []
        for job in jobs:
            results.append(_run_job(job))
            progress.step(job.name)
        return results
    task_runner = FlowRunContext.get().task_runner
    client = runners.dask_client(task_runner)
    # a worker lost on the way — killed, out of memory — is named, with what to do (not a bare CommClosedError)
    with runners.lost_workers_named(client, getattr(task_runner, "address", None)):
        return _fan_out_as_tasks(jobs, label, mix_kinds, client, progress)


def _fan_out_as_tasks(jobs: list[Job], label: str, mix_kinds: bool, client: Any, progress: Progress) -> list[Any]:
    """:func:`fan_out` inside a flow run: the jobs as Prefect task runs of the flow's task runner (``client``: its
    Dask client, if any); results in job order."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE
    from prefect.futures import as_completed

    calls = [dict(job.kwargs) for job in jobs]
    order = runners.submission_order([job.fn for job in jobs]) if mix_kinds else range(len(jobs))
    groups = [[k] for k in order]
    if client is not None:  # large / shared arguments go to the cluster once, the jobs carry references
        calls = runners.scatter_shared(client, calls)
        groups = runners.batches(len(jobs), runners.dask_workers(client))
    futures, members = [], {}
    for group in groups:
        first = jobs[group[0]]
        name = first.name if len(group) == 1 else f"{first.name} and {len(group) - 1} more"
        future = task(_run_batch, name=first.fn.__name__.replace("_", "-"), task_run_name=name,
                      cache_policy=NO_CACHE).submit([jobs[k].name for k in group], [jobs[k].fn for k in group],
                                                    [calls[k] for k in group])
        futures.append(future)
        members[id(future)] = (name, group)
    results: list[Any] = [None] * len(jobs)
    warned = False
    try:
        for future in as_completed(futures):
            name, group = members[id(future)]
            try:
                done, gaps = future.result()  # raises the first failure (with its task name) at once
            except Exception as exc:  # e.g. a Dask worker died: the job never added its name
                if failed_task(exc) is None:
                    exc.add_note(f"in task {name!r}")
                raise
            for k, result in zip(group, done):
                results[k] = result
                progress.step(jobs[k].name)
            if client is not None and gaps and not warned:
                warned = True
                announce(label, f"warning: a Dask worker runs off the portable CPU kernels ({'; '.join(gaps)}): "
                                "outputs may differ in the last bits from another machine's; start `dask worker` "
                                "after `eval \"$(python -m otfed.cpu_kernels)\"`")
    except BaseException:  # a failure or an interrupt: tasks not started yet never start
        for future in futures:
            wrapped = getattr(future, "wrapped_future", None)
            if wrapped is not None:
                wrapped.cancel()
        raise
    return results


# MLflow artifact folder of what a stage measures about its own run (never a committed output): the full tables,
# wall-time columns included, and the figures of wall times
TIMINGS = "timings"


class TrackedReport:
    """:class:`stages.stage.Report` over an MLflow run: every file written is logged as an artifact.

    The reports folder is committed (git, ``dvc.lock``), so what lands there is byte-reproducible: a table is
    written as :func:`~stages.stage.committed_table` has it (no wall-time column, floats to
    :data:`~stages.stage.COMMITTED_DIGITS` digits). A table with wall times is also logged whole to the run,
    as artifact ``timings/<name>`` (written in a temporary folder, never in the reports folder), and so is a
    figure of wall times (:meth:`timing_figure`)."""

    def __init__(self, run: tracking.TrackedRun, out: Path) -> None:
        self._run = run
        self._out = out

    @property
    def out(self) -> Path:
        return self._out

    def table(self, frame: pd.DataFrame, name: str, markdown: bool = True) -> Path:
        if wall_time_columns(frame.columns):
            with tempfile.TemporaryDirectory(prefix="otfed-timings-") as tmp:
                path = io.write_csv(frame, Path(tmp) / Path(name).name)
                self._log_timing(path, name)
                if markdown:
                    self._log_timing(io.write_text(io.markdown_table(frame), path.with_suffix(".md")), name)
        committed = committed_table(frame)
        path = io.write_csv(committed, self._out / name)
        self._run.log_artifact(path)
        if markdown:
            self._run.log_artifact(io.write_text(io.markdown_table(committed), path.with_suffix(".md")))
        return path

    def figure(self, fig: Any, name: str) -> Path:
        path = io.save_figure(fig, self._out / name)
        self._run.log_artifact(path)
        return path

    def timing_figure(self, fig: Any, name: str) -> None:
        with tempfile.TemporaryDirectory(prefix="otfed-timings-") as tmp:
            self._log_timing(io.save_figure(fig, Path(tmp) / Path(name).name), name)

    def _log_timing(self, path: Path, name: str) -> None:
        """Log ``path`` to the run under ``timings/`` (and ``name``'s own subfolder, if any)."""
        folder = (Path(TIMINGS) / Path(name).parent).as_posix()
        self._run.client.log_artifact(self._run.run_id, str(path), artifact_path=folder)

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


def description(stage: Stage) -> str:
    """The first paragraph of the stage module's docstring (the MLflow run's description)."""
    doc = sys.modules[stage.jobs.__module__].__doc__ or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def run_stage(stage: Stage | str, params: Any, lifeline: Lifeline | None = None) -> dict[str, Any]:
    """Run one stage on validated ``Params`` (or a params dict, validated here): staged outputs, one MLflow
    run, jobs fanned out, the report step, ``metrics.json`` (the headline metrics). Returns all metrics.
    With a ``lifeline``, the outputs are swapped in only if the stage's caller is still there
    (:class:`~flows.caller.CallerGone` otherwise: the run ends KILLED, the previous outputs stay)."""
    stage = stage_named(stage) if isinstance(stage, str) else stage
    p = validate_params(params, stage=stage) if isinstance(params, dict) else params
    if getattr(p, stage.name, None) is None:
        raise ConfigError(f"params.yaml: {stage.name}: required key is missing")
    read = params_read(p, stage)
    start = time.monotonic()
    clear_leftovers(stage)
    with runners.one_blas_thread(), leftovers.owning(stage.name, stage.outputs), \
            tracking.stage_run(stage.name, tracking.flatten(read), tracking.params_hash(read),
                               description=description(stage)) as run, ExitStack() as staged:
        dirs = {folder: staged.enter_context(io.staged_directory(folder)) for folder in stage.outputs}
        hold_torch_kernels()
        jobs = stage.jobs(p, dirs)
        check_keys(stage.name, jobs)  # before any work: the report finds each result by its job's key
        record_kernels(stage.name, run)
        announce(stage.name, f"{len(jobs)} tasks on "
                             f"{runners.describe(p.run.task_runner, p.run.max_workers, p.run.dask_address)} "
                             f"(MLflow run {run.run_id})")
        mix = p.run.task_runner == "thread"
        results = Results.of_jobs(jobs, fan_out(jobs, label=stage.name, mix_kinds=mix), stage.name)
        if stage.followups is not None:
            more = stage.followups(p, results)
            check_keys(stage.name, more, earlier=jobs)
            announce(stage.name, f"{len(more)} follow-up tasks (built from the first {len(jobs)} results)")
            results = results + Results.of_jobs(more, fan_out(more, label=stage.name, mix_kinds=mix), stage.name)
        announce(stage.name, "report: tables, figures, metrics")
        reports = dirs[stage.outputs[0]]
        metrics = stage.report(p, results, TrackedReport(run, reports), dirs)
        # metrics.json (``dvc metrics show``) holds the headline numbers, never a wall time; MLflow gets all
        for pattern in unmatched_patterns(metrics, stage.headline):
            announce(stage.name, f"warning: headline pattern {pattern!r} matches no metric")
        io.write_json(headline_metrics(metrics, stage.headline), reports / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(reports / "metrics.json")
        if lifeline is not None:
            lifeline.check()  # the last step before the swap: nobody is left to record these outputs
    announce(stage.name, f"done in {_clock(time.monotonic() - start)} → {', '.join(stage.outputs)}")
    return metrics


def clear_leftovers(stage: Stage) -> list[leftovers.Leftover]:
    """Clean what killed stages left beside *every* stage's output folders (and ``stage``'s own) — staging
    folders, a previous-outputs folder a kill stranded mid-swap, owner records — where their owner process is
    gone (:func:`flows.leftovers.clean_stale`; a live stage's are kept), one line each. Returns what was done."""
    done = leftovers.clean_stale([*output_owners(), *stage.outputs])
    for found in done:
        if not found.quiet:
            announce(stage.name, found.line())
    return done


def record_kernels(label: str, run: tracking.TrackedRun) -> None:
    """The CPU kernels this stage runs on (:func:`otfed.cpu_kernels.kernels_in_use`) as the run's
    ``cpu_kernels.*`` tags; a warning line where the stage should hold them to the portable ones and cannot
    (numpy or torch was imported before :func:`otfed.cpu_kernels.use_portable_kernels` could run) — its
    outputs may then differ in the last bits on another CPU."""
    found = kernels_in_use()
    run.set_tags({f"cpu_kernels.{key}": value for key, value in found.items()})
    if found["switch"] == "native":
        return
    gaps = portability_gaps(found)
    if gaps:
        announce(label, f"warning: not on the portable CPU kernels ({'; '.join(gaps)}): outputs may differ in the "
                        "last bits on another CPU (start the stage with `python -m flows.stage <name>`, or set "
                        "OTFED_CPU_KERNELS=native to say this is meant)")


# ------------------------------------------------------------------------------------------- main
@contextmanager
def interrupts_raise() -> Iterator[list[str]]:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread, so every ``finally`` runs: the MLflow
    run ends KILLED, the staging folders are removed, Prefect marks the flow run crashed. Yields the names of the signals received (a failure after one is
    an interruption, whatever it raised). The previous handlers are restored afterwards.

    Ctrl-C sends SIGINT to the whole process group: SIGINT is blocked on entry — every thread and process
    started inside inherits the block (the project's Prefect server runs in a session of its own anyway) — and
    :func:`accept_interrupts` unblocks it for the main thread once the flow is running, so the interrupt
    arrives where the handler can record it."""
    received: list[str] = []

    def interrupt(signum: int, frame: Any) -> None:
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield received
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def accept_interrupts() -> None:
    """Unblock SIGINT in the calling (main) thread; a Ctrl-C pressed meanwhile is delivered now."""
    if threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _quiet_console(verbose: bool) -> None:
    """Prefect's console handlers at INFO with ``verbose``, else silent (also when prefect was imported and
    configured before :func:`configure_prefect_environment` ran, e.g. in-process)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in logging.root.manager.loggerDict]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.setLevel(logging.INFO if verbose else logging.CRITICAL)


@contextmanager
def _log_to_file(stage: str) -> Iterator[Path]:
    """Every log record of this run (Prefect's INFO logs, full tracebacks) → ``.prefect/logs/<stage>.log``."""
    path = project.log_dir() / f"{stage}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="w")
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)-7s %(name)s - %(message)s"))
    handler.setLevel(logging.INFO)
    logging.getLogger().addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield path
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()


def undo_failed_override(params_path: str | Path, error: ConfigError) -> bool:
    """After ``dvc exp run -S key=bad`` in the workspace, put ``params.yaml`` back as it was.

    DVC writes the ``-S`` values into the workspace's ``params.yaml`` before it runs the stages and leaves
    them there when a stage fails. When this run is such an experiment (``DVC_EXP_NAME`` set, running in
    the user's repository itself) and the file differs from the experiment's baseline commit only at keys
    the validation error names, the baseline's file (comments included) is restored. Anything else — other
    uncommitted edits — is left alone. Returns whether the file was restored.
    """
    path = Path(params_path)
    base = os.environ.get("DVC_EXP_BASELINE_REV")
    if not os.environ.get("DVC_EXP_NAME") or not base or Path.cwd().resolve() != project.project_root():
        return False
    try:
        text = subprocess.run(["git", "show", f"{base}:{path.as_posix()}"], capture_output=True, text=True,
                              check=True).stdout
        before, now = yaml.safe_load(text), yaml.safe_load(path.read_text())
    except (OSError, subprocess.CalledProcessError, yaml.YAMLError):
        return False
    named = {re.sub(r"\[\d+\]", "", key) for key in error.keys}  # the keys validation named
    changed = {re.sub(r"\[\d+\]", "", key) for key in _differences(before, now)}
    if not changed or not all(any(c == k or c.startswith(k + ".") or k.startswith(c + ".") for k in named)
                              for c in changed):
        return False
    io.write_text(text, path)
    return True


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted key paths at which two parsed YAML documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(key), b.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if a == b else [prefix]


def failure_lines(exc: BaseException, log_file: Path | None) -> list[str]:
    """The console lines of a failure: ``error: …`` per line of an OtfedError's message (``error: <Type>:
    <message>`` otherwise), the task it came from, and where the full log is — credentials in URIs hidden
    (:func:`flows.redaction.redact`)."""
    lines = [f"error: {line}" for line in (str(exc) or type(exc).__name__).splitlines()]
    if not isinstance(exc, OtfedError):
        lines[0] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    task_name = failed_task(exc)
    if task_name:
        lines.append(f"  in task {task_name}")
    if log_file is not None:
        lines.append(f"  full log: {log_file} (or rerun with --verbose)")
    return [redact(line) for line in lines]


def main(stage: Stage | str, params_path: str | Path = "params.yaml", argv: list[str] | None = None) -> int:
    """Run ``stage`` (``python -m flows.stage <name> [--verbose]``, :func:`cli`): validate params, check inputs,
    run the stage as a Prefect flow; errors → one ``error:`` line (exit 2 for bad params / data, 1 otherwise,
    130 / 143 interrupted). ``argv``: the process's arguments (``sys.argv[1:]`` when None: the process's own
    program), read for ``--verbose``."""
    argv = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in argv or os.environ.get("OTFED_VERBOSE", "") not in {"", "0"}
    try:
        the_stage = stage_named(stage) if isinstance(stage, str) else stage
        p = load_params(params_path, stage=the_stage)
        preflight(the_stage, p, producers=output_owners)  # inputs, outputs writable, disk, the stage's data
        if p.run.task_runner == "dask" and p.run.dask_address:  # the cluster answers and has workers
            runners.check_dask_address(p.run.dask_address)
    except OtfedError as exc:
        for line in failure_lines(exc, None):
            print(line, file=sys.stderr)
        if isinstance(exc, ConfigError) and undo_failed_override(params_path, exc):
            print(f"{params_path}: restored as it was before this experiment's -S values", file=sys.stderr)
        return 2
    with interrupts_raise() as received:  # before prefect starts any thread or server
        lifeline = arm(Lifeline().start())  # SIGTERM once the caller is gone (the handler above is in place)
        try:
            status = _run_flow(the_stage, p, verbose, received, lifeline)
        finally:
            lifeline.stop()
            disarm()
    if status in (130, 143) and argv_is_program(argv):
        exit_now(the_stage, status)
    return status


def output_owners() -> dict[str, str]:
    """Every stage's output folder → the stage's name (the hint of a missing input: which stage to run)."""
    return {folder: s.name for s in all_stages().values() for folder in s.outputs}


def argv_is_program(argv: list[str] | None) -> bool:
    """Whether :func:`main` runs as the process's program (``python -m flows.stage <name>``), not inside a
    caller."""
    return argv is None or argv == sys.argv[1:]


def exit_now(the_stage: Stage, status: int) -> None:
    """End an interrupted stage's process now: task threads still computing (threads cannot be stopped) would
    otherwise keep it alive for minutes, reparented to init (the interpreter joins them before it exits). The
    MLflow run has ended KILLED by then; the exit handlers still run — the stage stops being a user of the
    project's Prefect server and the staging folders are removed — and only the wait for the task threads is
    skipped."""
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _run_flow(the_stage: Stage, p: Any, verbose: bool, received: list[str], lifeline: Lifeline | None = None) -> int:
    """The stage as a Prefect flow; the exit status, with one ``error:`` line (and the failed task) when it
    fails, the traceback in the log file."""
    configure_prefect_environment(verbose)
    from prefect import flow, tags  # configures logging: the console level and the log file go on afterwards

    _quiet_console(verbose)
    hide_in_prefect_logs()  # what Prefect's handlers send to its database, credentials hidden

    def stage_flow(params: dict[str, Any]) -> dict[str, Any]:
        accept_interrupts()  # the flow runs: an interrupt now ends it as crashed
        # ``params`` is what the Prefect UI shows; p is validated. The lifeline comes through armed(), never
        # held here: Dask pickles this function by value with the tasks, and a lifeline's lock cannot be pickled.
        # Prefect stores a failed flow's exception: one whose text holds a credential leaves redacted
        with exceptions_hidden():
            return run_stage(the_stage, p, armed())

    # tasks still running when a stage fails or is interrupted finish before the interpreter exits (threads
    # cannot be stopped) and may write into a staging folder already removed: remove it at the very end
    atexit.register(lambda: [io.remove_staging(folder) for folder in the_stage.outputs])
    runner = runners.task_runner(p.run.task_runner, p.run.max_workers, p.run.dask_address)
    pipeline_run = os.environ.get("OTFED_PIPELINE_RUN")
    run_tags = ["otfed", f"stage:{the_stage.name}"] + ([f"pipeline:{pipeline_run}"] if pipeline_run else [])
    with _log_to_file(the_stage.name) as log_file:
        try:
            with prefect_server.project_api(say=lambda line: announce(the_stage.name, line)), tags(*run_tags):
                flow(name=the_stage.name, validate_parameters=False, task_runner=runner,
                     description=description(the_stage))(stage_flow)(params_read(p, the_stage))
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                raise
            exc = unhidden(exc)  # the failure itself, not the redacted stand-in Prefect stored
            if received or not isinstance(exc, Exception):  # Ctrl-C / SIGTERM, or Prefect's TerminationSignal
                name = received[0] if received else str(exc) or (
                    "SIGTERM" if getattr(exc, "signal", None) == signal.SIGTERM else "SIGINT")
                gone = lifeline is not None and (lifeline.fired or isinstance(exc, CallerGone))
                why = f"its caller {lifeline.process.name} (pid {lifeline.process.pid}) exited" if gone else name
                log.warning("interrupted (%s)", why, exc_info=exc)
                print(f"error: {the_stage.name} interrupted ({why}); previous outputs kept", file=sys.stderr)
                return 143 if name == "SIGTERM" or gone else 130
            log.error("stage %s failed", the_stage.name, exc_info=exc)
            for line in failure_lines(exc, log_file):
                print(line, file=sys.stderr)
            return 2 if isinstance(exc, OtfedError) else 1
    return 0


USAGE = "usage: python -m flows.stage <stage> [--verbose]"


def cli(argv: list[str] | None = None) -> int:
    """``python -m flows.stage <stage> [--verbose]`` — the command of every ``dvc.yaml`` stage: :func:`main` for
    the stage named (``argv``: ``sys.argv[1:]`` when None, the process's own program). No stage name, two, or an
    option other than ``--verbose`` → one ``error:`` line with the usage and the stages, exit 2; an unknown
    stage → :func:`main`'s ``error: unknown stage …`` line, exit 2."""
    args = sys.argv[1:] if argv is None else list(argv)
    names = [a for a in args if not a.startswith("-")]
    options = [a for a in args if a.startswith("-") and a != "--verbose"]
    if len(names) != 1 or options:
        print(f"error: {USAGE} (got {' '.join(args) or 'nothing'}); stages: {', '.join(sorted(all_stages()))}",
              file=sys.stderr)
        return 2
    return main(names[0], argv=None if argv is None else args)


if __name__ == "__main__":  # python -m flows.stage <name> [--verbose]: what dvc.yaml runs
    # the imported module's cli, not this __main__ copy's: the runner's functions then belong to flows.stage,
    # which a Dask worker imports (it cannot import __main__)
    from flows.stage import cli as _cli

    raise SystemExit(_cli())
