"""The one shape every stage has, and the interfaces its report step writes through.

A stage module in ``stages/`` holds, in this order:

0. ``OUTPUTS`` — the folders it writes (constants of ``stages/layout.py``; the first holds its reports);
1. its **params type** — a :class:`~otfed.schema.Strict` model, validated from the ``params.yaml`` group
   named after the stage (built from the library's own config types: no mirrors, no adapters);
2. :func:`jobs` — the list of independent units of work (:class:`Job`: one pure task function + its
   arguments + its **key**), built from the validated params. A key says which result a job gives: a tuple
   whose first element is the kind of job and whose others say which one (``("pair", federation, a, b)``,
   ``("student", task, variant)``), or a string for a job of its own kind (``"outlier"``); unique among the
   stage's jobs and follow-ups (the runner stops the stage before any job runs otherwise, naming the key);
3. one **pure task function per kind of job** — arrays / paths in, table rows and arrays out; no MLflow,
   no Prefect, no global state (files only under the staged output folders it is handed);
   Where some work needs the results of the first jobs (FL within the clusters that the pairwise distances
   give), ``followups(p, results)`` returns a second list of jobs, fanned out the same way after the first;
4. :func:`report` — turns the job results into tables, figures, nested variant runs and the headline metrics
   (returned; the runner writes ``metrics.json``). It reads them by key (:class:`Results`, a read-only mapping in
   job order): ``results[("gate", task)]``, ``results.of("pair", federation)`` (every pair of one federation, in
   job order), ``results.by("student", task)`` (variant → result) — never by counting positions, and never by
   reading the inputs again for something a job already computed (pass it through a job instead, as
   ``distill``'s gate). ``check(p)`` beside them when the group names things in other groups (a federation, a
   task), raising ValueError naming the key. Wall times go into the tables as columns (:func:`timed`) and into
   figures through :meth:`Report.timing_figure`: the runner keeps them out of the committed reports folder
   (:func:`committed_table`) and logs them to MLflow;
5. ``STAGE`` — the :class:`Stage` record tying these together. There is no ``__main__``: DVC runs every stage
   through the one entry point, the runner ``python -m flows.stage <name>``, which finds ``STAGE`` by name
   (:func:`stages.params.stages`).

The runner (``flows/stage.py``) validates params once, stages every output folder atomically, fans the
jobs out with the configured task runner, opens the MLflow run and hands :func:`report` the :class:`Results`
and a :class:`Report`. Stages never import ``flows``, Prefect or MLflow (``tests/architecture``); the library
(``otfed/``) never imports stages.

**Adding a stage** ``<name>`` — 9 files, 2 of them new, every item checked for every stage by
``tests/architecture/test_stage_contract.py`` (which names each missing item and the file to edit); there is no
registry: ``stages/params.py`` finds the module's ``STAGE``.

1. ``stages/<name>.py`` (new) — the shape above: ``OUTPUTS``, the params type, :func:`jobs` with a ``key=`` on
   every :class:`Job`, the task functions, :func:`report` reading :class:`Results` by key, ``inputs`` (the files
   it reads) and ``STAGE = Stage("<name>", …, headline=(…))`` — a few headline metric patterns, never empty;
2. ``stages/layout.py`` — its output folders: ``reports("<folder>")`` and any data folder;
3. ``params.yaml`` — its group ``<name>:`` (commented like the others), valid for the stage;
4. ``params-paper.yaml`` — its group at the papers' scale;
5. ``dvc.yaml`` — its block: ``cmd: python -m flows.stage <name>``, the data deps (every input of ``inputs`` under
   one), the code deps printed by ``python -m tests.architecture.import_graph <name>``, ``params`` (``run.seed``,
   ``run.device``, ``<name>`` and its ``reads``), ``outs`` = ``OUTPUTS`` with ``persist: true``; and its
   ``reports/<folder>/metrics.json`` under ``metrics:``, its figures under ``plots:``;
6. ``flows/paper_numbers.py`` — an item of the results page naming the stage (``"stage": "<name>"``; a table it
   shows needs a view in ``flows/results.py``: one file more);
7. ``tests/stages/conftest.py`` — the stage in a tiny track, ``FEATURE_TRACK`` (its tiny params in
   ``feature_params``) or ``TEXT_TRACK`` (in ``text_params``, ``tests/stages/test_text_stages.py``), whose outputs
   the stage tests check byte for byte on a rerun;
8. ``tests/stages/test_preflight.py`` — the stage in ``STAGES`` and its group in ``preflight_params()``: the
   positive control of the preflight (valid tiny inputs pass) and the place for its bad-input cases;
9. ``tests/stages/test_<name>_stage.py`` (new; or the track's module) — its outputs against independent truths,
   its module docstring naming the stage in double backquotes (as this docstring writes ``distill``).

Not checked there: ``docs/running.md``'s table of stages and the counts its tests check (10 files with it).
Generated, then committed, never edited by hand: ``reports/<folder>/`` and ``dvc.lock`` (``dvc repro <name>``),
``reports/index.html`` (``python -m flows.results``).
"""
from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Protocol, Sequence

import pandas as pd

from otfed.errors import ConfigError, DataFileError, WorkspaceError
from otfed.schema import Strict


@dataclass(frozen=True)
class Job:
    """One unit of fan-out work: ``fn(**kwargs)``. ``name`` labels its task run and progress line; ``key`` is
    what :func:`report` and ``followups`` find its result under (:class:`Results`): a hashable unique among the
    stage's jobs and follow-ups — a tuple whose first element is the kind of job and whose others say which one,
    ``("pair", "pairs_strong", "client_03", "client_07")``, or a plain string (``"outlier"``). Without one the
    key is the name."""

    name: str
    fn: Callable[..., Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    key: Hashable = None

    def __post_init__(self) -> None:
        if self.key is None:
            object.__setattr__(self, "key", self.name)
        hash(self.key)  # TypeError now, not when the results are gathered

    def __call__(self) -> Any:
        return self.fn(**self.kwargs)


def check_keys(stage: str, jobs: Iterable[Job], earlier: Iterable[Job] = ()) -> None:
    """ValueError naming the stage, the key and both jobs unless every job of ``jobs`` has a key of its own —
    among them and among the ``earlier`` jobs (the first list, when ``jobs`` are its follow-ups)."""
    seen: dict[Hashable, Job] = {}
    for job in (*earlier, *jobs):
        if job.key in seen:
            raise ValueError(f"stage {stage}: two jobs have the key {job.key!r} ({seen[job.key].name!r} and "
                             f"{job.name!r}); every job of a stage, its follow-ups included, needs a key of its own "
                             "(Job(..., key=...)) — the report finds each result by it")
        seen[job.key] = job


def _key_parts(key: Hashable) -> tuple[Any, ...]:
    return key if isinstance(key, tuple) else (key,)


class Results(Mapping[Hashable, Any]):
    """The results of a stage's jobs, read-only: ``results[key]`` is the result of the job with that
    :attr:`Job.key`; iteration (keys, :meth:`values`, :meth:`items`) is in job order — the first jobs, then
    their follow-ups. :meth:`of` selects by the leading elements of tuple keys (``results.of("pair", fed)``:
    every pair of one federation, in job order), :meth:`by` does the same keyed by the rest of each key.

    Built by the runner from the jobs and their results in job order (:meth:`of_jobs`); a key given twice is a
    ValueError naming it and the stage."""

    def __init__(self, items: Iterable[tuple[Hashable, Any]] = (), stage: str = "stage") -> None:
        self.stage = stage
        self._results: dict[Hashable, Any] = {}
        for key, value in items:
            if key in self._results:
                raise ValueError(f"stage {stage}: two results have the key {key!r}; a job's key is unique")
            self._results[key] = value

    @classmethod
    def of_jobs(cls, jobs: Sequence[Job], values: Sequence[Any], stage: str = "stage") -> "Results":
        """The results ``values`` of ``jobs`` (in job order, one each), by key (:func:`check_keys`)."""
        check_keys(stage, jobs)
        if len(values) != len(jobs):
            raise ValueError(f"stage {stage}: {len(values)} results for {len(jobs)} jobs")
        return cls(((job.key, value) for job, value in zip(jobs, values)), stage)

    def __getitem__(self, key: Hashable) -> Any:
        try:
            return self._results[key]
        except KeyError:
            kinds = ", ".join(dict.fromkeys(repr(_key_parts(k)[0]) for k in self._results)) or "none"
            raise KeyError(f"stage {self.stage}: no job has the key {key!r} (kinds of key: {kinds})") from None

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def __add__(self, other: "Results") -> "Results":
        """These results, then ``other``'s (follow-ups after the first jobs); a key in both is a ValueError."""
        return Results([*self.items(), *other.items()], self.stage)

    def __repr__(self) -> str:
        return f"Results(stage={self.stage!r}, keys={list(self._results)!r})"

    def of(self, *prefix: Any) -> list[Any]:
        """The results whose key starts with ``prefix``, in job order: a tuple key whose first ``len(prefix)``
        elements are ``prefix`` (a key that is not a tuple counts as the tuple of itself): ``of("toy")`` every
        toy case, ``of("pair", "pairs_strong")`` every client pair of that federation, ``of()`` all."""
        n = len(prefix)
        return [value for key, value in self._results.items() if _key_parts(key)[:n] == prefix]

    def by(self, *prefix: Any) -> dict[Any, Any]:
        """:meth:`of` as a dict, keyed by the rest of each key — its one remaining element, or the tuple of the
        remaining ones: ``by("student", "sa")`` → ``{variant name: result}``, in job order."""
        n = len(prefix)
        out: dict[Any, Any] = {}
        for key, value in self._results.items():
            parts = _key_parts(key)
            if parts[:n] == prefix:
                rest = parts[n:]
                out[rest[0] if len(rest) == 1 else rest] = value
        return out


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its wall time in seconds (the ``seconds`` columns of stage tables: logged to
    MLflow, left out of the committed reports — :func:`committed_table`)."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


class Variant(Protocol):
    """A nested run (one per variant: same metric names across siblings for the MLflow compare view)."""

    def log_params(self, params: Mapping[str, Any]) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...


class Report(Variant, Protocol):
    """What a report step writes through: files in the staged reports folder, logged as they are written.

    Everything written into the reports folder is committed (git, ``dvc.lock``) and must come out byte for byte
    the same on every rerun: nothing that measures the run itself (wall times) goes there."""

    @property
    def out(self) -> Path: ...  # the (staged) reports folder of the stage

    def table(self, frame: pd.DataFrame, name: str, markdown: bool = True) -> Path:
        """Write ``frame`` as ``name`` (CSV, and a Markdown twin) as :func:`committed_table` has it — no
        wall-time column, floats to :data:`COMMITTED_DIGITS` digits; the full table goes to the tracking run."""
        ...

    def figure(self, fig: Any, name: str) -> Path:
        """Write a figure of results (never of wall times) as ``name`` (PNG)."""
        ...

    def timing_figure(self, fig: Any, name: str) -> None:
        """Log a figure that plots wall times to the tracking run only: never written into the reports folder."""
        ...

    def artifact(self, path: str | Path) -> None: ...

    def variant(self, name: str, tags: Mapping[str, Any] | None = None) -> AbstractContextManager[Variant]: ...


# (validated Params, {output folder → its staging folder}) → the jobs
JobsFn = Callable[[Any, Mapping[str, Path]], list[Job]]
# (validated Params, the job results by key, report, {output folder → staging folder}) → all the metrics
ReportFn = Callable[[Any, Results, Report, Mapping[str, Path]], dict[str, Any]]
# validated Params → None, or ValueError naming the key (cross-group references, checked before any work)
CheckFn = Callable[[Any], None]
FollowupsFn = Callable[[Any, Results], list[Job]]  # (params, the first jobs' results by key) -> more jobs
InputsFn = Callable[[Any], Iterable[str | Path]]  # validated Params → the files / folders the stage reads


@dataclass(frozen=True)
class Stage:
    """A DVC stage: its params group, its output folders (``stages.layout``), its jobs and its report.

    ``name`` is the DVC stage name and the ``params.yaml`` group. ``outputs[0]`` is the reports folder
    (``metrics.json`` goes there). ``reads`` are the other params keys its results depend on (its
    ``dvc.yaml`` params deps besides ``run`` and its own group; ``check`` may look at more, e.g. that a
    federation it names exists — its data arrive through the files it depends on). ``needs`` are the other
    params groups its ``check`` looks at (e.g. ``distill`` needs ``estimate_bias`` for weighting E).
    ``required`` groups must be present in every params file. A stage validates only ``run``, the required
    groups, its own group and the groups of its ``reads`` and ``needs`` (:func:`stages.params.groups_of`):
    one track runs without the other track's groups. ``headline`` are the dotted key patterns of the
    few metrics ``dvc metrics show`` shows (:func:`headline_metrics`); the full dict goes to MLflow.
    ``preflight(p)`` checks the stage's input files cheaply (exist, readable, the right shape) before the
    runner starts any server, raising :class:`~otfed.errors.OtfedError` naming the file. ``followups(p,
    results)``: jobs built from the :class:`Results` of :attr:`jobs` (fanned out after them, their keys unique
    among both lists; :attr:`report` gets the results of both, in job order, the first list first). ``inputs(p)`` are the files and folders
    it reads (raw files, the outputs of earlier stages, checkpoints): :func:`check_workspace` checks they
    exist and are readable, and that its output folders can be written, before :attr:`preflight` runs.
    """

    name: str
    params: type[Strict]
    outputs: tuple[str, ...]
    jobs: JobsFn
    report: ReportFn
    check: CheckFn | None = None
    reads: tuple[str, ...] = ()
    required: bool = False
    needs: tuple[str, ...] = ()
    headline: tuple[str, ...] = ()
    preflight: CheckFn | None = None
    followups: FollowupsFn | None = None
    inputs: InputsFn | None = None


# ------------------------------------------------------------------------------------ headline metrics
# words that make a metric key a wall time (never a headline: times differ on every run, so a DVC-tracked
# metrics.json holding one would show a diff after every rerun); a key's words are split on non-alphanumerics
WALL_TIME_WORDS = frozenset({"seconds", "second", "secs", "sec", "ms", "milliseconds", "minutes", "time", "times",
                             "timing", "elapsed", "duration", "runtime", "walltime"})


def is_wall_time(path: Iterable[Any]) -> bool:
    """Whether a metric at ``path`` (its keys from the root) is a wall time: one of its keys contains a word
    of :data:`WALL_TIME_WORDS` (``seconds``, ``fedbary_seconds``, ``seconds_exact_ot_total``, ``wall_time``;
    not ``rel_error`` or ``convergence_gap_d2_approx_S300_t0.5``)."""
    return any(word in WALL_TIME_WORDS for key in path for word in re.split(r"[^0-9a-z]+", str(key).lower()))


def wall_time_columns(columns: Iterable[Any]) -> list[Any]:
    """The columns of a table that are wall times: :func:`is_wall_time` of the column name (``seconds``,
    ``fedbary_seconds``, ``seconds_exact``; not ``rel_error``), in table order."""
    return [c for c in columns if is_wall_time((c,))]


# -------------------------------------------------------------------------------- committed outputs
# significant digits of the floats in committed outputs (tables, metrics.json). The last digits of a float
# computed with BLAS depend on the machine's kernels and threads: two `dvc repro` runs of the same fed_distance
# code (commits 24dd300, 108eb8d) differed by up to 3e-13 (relative) in 79 values, in none at 10 digits;
# 10 digits keep far more than any result here means.
COMMITTED_DIGITS = 10


def committed_number(value: float, digits: int = COMMITTED_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits (NaN and ±inf unchanged): the float whose shortest
    repr has at most ``digits`` digits. Idempotent."""
    return float(format(float(value), f".{digits}g"))


def committed_table(frame: pd.DataFrame, digits: int = COMMITTED_DIGITS) -> pd.DataFrame:
    """What a stage commits of a table (``reports/<stage>/<name>.csv`` and its Markdown twin): ``frame``
    without its wall-time columns (:func:`wall_time_columns`; they go to MLflow only) and with its float
    columns rounded by :func:`committed_number`, so that a rerun writes the same bytes (the last-digit noise
    of BLAS kernels and threads does not reach the file). Pure."""
    keep = [i for i, c in enumerate(frame.columns) if not is_wall_time((c,))]
    out = frame.iloc[:, keep].copy()
    for i in range(out.shape[1]):
        col = out.iloc[:, i]
        if col.dtype.kind == "f":
            out.isetitem(i, col.map(lambda v: committed_number(v, digits), na_action="ignore").astype(col.dtype))
    return out


def key_matches(path: tuple[str, ...], pattern: str) -> bool:
    """Whether the metric at ``path`` (keys from the root) is selected by a dotted ``pattern``.

    The pattern's dot-separated segments are matched against the keys in order with :func:`fnmatch.fnmatchcase`
    (``*`` and ``?`` within a key: ``detection.*.fedbary.f1``); a key that itself contains dots
    (``convergence_gap_d2_approx_S300_t0.5``) matches several segments joined by dots, or one ``*``. A pattern
    that ends at an inner key selects everything under it (``clustering`` = every ``clustering.*.*``).
    """
    segments = tuple(pattern.split("."))

    def match(i: int, j: int) -> bool:
        if j == len(segments):  # pattern used up: this key, or everything under it
            return True
        if i == len(path):
            return False
        return any(fnmatchcase(path[i], ".".join(segments[j:j + r])) and match(i + 1, j + r)
                   for r in range(1, len(segments) - j + 1))

    return match(0, 0)


def headline_metrics(metrics: Mapping[str, Any], patterns: Iterable[str] = ()) -> dict[str, Any]:
    """The headline subset of a stage's nested metrics dict (what ``metrics.json`` — ``dvc metrics show`` —
    holds; the full dict goes to MLflow): every leaf whose key path matches one of the dotted ``patterns``
    (:func:`key_matches`), or every leaf when there are none; wall times (:func:`is_wall_time`) are never
    selected, floats are rounded by :func:`committed_number` (reproducible digits). Same nesting and key
    order as ``metrics``; inner dicts left empty are dropped. Pure."""
    patterns = tuple(patterns)

    def select(node: Mapping[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            here = path + (str(key),)
            if is_wall_time(here):
                continue
            if isinstance(value, Mapping):
                sub = select(value, here)
                if sub:
                    out[key] = sub
            elif not patterns or any(key_matches(here, p) for p in patterns):
                out[key] = committed_number(value) if isinstance(value, float) else value
        return out

    return select(metrics, ())


def unmatched_patterns(metrics: Mapping[str, Any], patterns: Iterable[str]) -> list[str]:
    """The ``patterns`` that select no (non-wall-time) metric of ``metrics`` — a renamed metric key, a typo."""
    return [p for p in patterns if not headline_metrics(metrics, (p,))]


# ------------------------------------------------------------------------------------------ preflight
# free disk space a stage needs besides the size of its current outputs (its new outputs are built beside them
# before the old ones go): room for the MLflow store and artifacts, Prefect's home and logs, temporary files.
# OTFED_MIN_FREE_MB overrides it (e.g. 0 on a disk known to be large enough).
MIN_FREE_BYTES = 256 * 2**20
Producers = Callable[[], Mapping[str, str]]  # () → {output folder: the stage that writes it}


def min_free_bytes() -> int:
    """:data:`MIN_FREE_BYTES`, or ``OTFED_MIN_FREE_MB`` (MiB) when set."""
    value = os.environ.get("OTFED_MIN_FREE_MB", "").strip()
    try:
        return int(float(value) * 2**20) if value else MIN_FREE_BYTES
    except ValueError:
        raise WorkspaceError(f"OTFED_MIN_FREE_MB: {value!r} is not a number of MiB") from None


def free_bytes(path: Path) -> int:
    """Free bytes, for this user, on the disk that holds ``path`` (an existing folder)."""
    return shutil.disk_usage(path).free


def memory_bytes() -> int:
    """The memory this process can have at most: the machine's physical memory, or its control group's limit
    (a container's) when that is lower. A job whose arrays alone need more cannot run here on any load."""
    limits = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limits.append(int(Path(path).read_text().strip()))
        except (OSError, ValueError):  # absent, or "max" (no limit)
            pass
    return min(limits)


def check_memory(needs: Iterable[tuple[str, int, str]], memory: int | None = None) -> None:
    """ConfigError naming the key of the first ``(key, bytes, what)`` of ``needs`` whose bytes exceed
    ``memory`` (:func:`memory_bytes` when None): an array a job must hold that no run on this machine can, so
    the stage fails before any server starts instead of with a MemoryError inside a task."""
    memory = memory_bytes() if memory is None else memory
    for key, need, what in needs:
        if need > memory:
            raise ConfigError(f"{key}: {what} alone need {readable_bytes(need)}, more than the "
                              f"{readable_bytes(memory)} of memory this machine has; lower it", keys=(key,))


def readable_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit that keeps the number ≥ 1 (``1.5 GiB``, ``142 PiB``)."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
    k = 0
    while n >= 1024 and k < len(units) - 1:
        n, k = n / 1024, k + 1
    return f"{n:,.0f} {units[k]}" if k == 0 or n >= 100 else f"{n:.1f} {units[k]}"


def writable(path: Path) -> bool:
    """Whether this process may create and remove entries in the existing folder ``path`` (False on a
    read-only file system; root may write anywhere else)."""
    return os.access(path, os.W_OK | os.X_OK)


def existing_ancestor(path: Path) -> Path:
    """``path`` itself if it exists, else its nearest existing ancestor (the cwd for a relative path)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 if it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def check_inputs(stage: Stage, paths: Iterable[str | Path], producers: Producers | None = None) -> None:
    """DataFileError naming the first of ``paths`` that is missing or unreadable (a folder must be listable);
    ``producers()`` maps output folders to the stage writing them, for the hint ``run `dvc repro <stage>```
    (called only when an input is missing)."""
    for path in map(Path, paths):
        if not path.exists():
            owner = next((name for folder, name in (producers() if producers else {}).items()
                          if path == Path(folder) or Path(folder) in path.parents), None)
            hint = (f"written by stage {owner}: run `dvc repro {owner}`" if owner and owner != stage.name
                    else "check the paths in params.yaml")
            raise DataFileError(f"{path}: not found — an input of stage {stage.name} ({hint})")
        if not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
            raise DataFileError(f"{path}: not readable — an input of stage {stage.name} (check its permissions)")


def check_outputs(stage: Stage) -> None:
    """WorkspaceError naming the folder unless every output folder of ``stage`` can be replaced: the folder
    that holds it (or will: its nearest existing ancestor) is writable — the new outputs are built in a
    staging folder beside it and swapped in — and, where it exists, it is a folder whose own folders are
    writable (the old outputs are removed once the new ones are in)."""
    for out in map(Path, stage.outputs):
        parent = existing_ancestor(out.parent)
        if not parent.is_dir() or not writable(parent):
            raise WorkspaceError(f"{parent}: not writable — stage {stage.name} writes {out} there (built in a "
                                 f"staging folder beside it, then swapped in); make {parent} writable")
        if out.exists() and not out.is_dir():
            raise WorkspaceError(f"{out}: not a folder — stage {stage.name} writes its outputs there; move the "
                                 f"file away")
        if out.is_dir():
            for folder in (out, *(d for d in out.rglob("*") if d.is_dir() and not d.is_symlink())):
                if not writable(folder):
                    raise WorkspaceError(f"{folder}: not writable — stage {stage.name} replaces {out} (its "
                                         f"previous outputs) when it succeeds; make {folder} writable")


def check_free_space(stage: Stage, minimum: int | None = None) -> None:
    """WorkspaceError naming the folder unless the disk of each output folder has ``minimum`` bytes
    (:func:`min_free_bytes`) free plus the size of the stage's current outputs on that disk (the new
    outputs are built beside them before the old ones are removed)."""
    minimum = min_free_bytes() if minimum is None else minimum
    disks: dict[int, tuple[Path, list[Path]]] = {}
    for out in map(Path, stage.outputs):
        anchor = existing_ancestor(out)
        disks.setdefault(anchor.stat().st_dev, (anchor, []))[1].append(out)
    for anchor, outs in disks.values():
        current = sum(folder_bytes(out) for out in outs)
        need, free = minimum + current, free_bytes(anchor)
        if free < need:
            raise WorkspaceError(
                f"{outs[0]}: {_mib(free)} free on the disk that holds it; stage {stage.name} needs at least "
                f"{_mib(need)} ({_mib(minimum)} to work in + {_mib(current)}, the size of its current outputs "
                f"{', '.join(map(str, outs))}, rebuilt beside them) — free some space (or set OTFED_MIN_FREE_MB)")


def check_workspace(stage: Stage, p: Any, producers: Producers | None = None) -> None:
    """The generic preflight every stage gets, before its own :attr:`Stage.preflight` and before any server
    starts (it writes nothing): its :attr:`Stage.inputs` exist and are readable (:func:`check_inputs`), its
    output folders can be replaced (:func:`check_outputs`), their disk has room (:func:`check_free_space`).
    Raises an :class:`~otfed.errors.OtfedError` naming the file or folder."""
    check_inputs(stage, stage.inputs(p) if stage.inputs is not None else (), producers)
    check_outputs(stage)
    check_free_space(stage)


def preflight(stage: Stage, p: Any, producers: Producers | None = None) -> None:
    """:func:`check_workspace`, then the stage's own :attr:`Stage.preflight` (its data, read through the
    validating loaders)."""
    check_workspace(stage, p, producers)
    if stage.preflight is not None:
        stage.preflight(p)
