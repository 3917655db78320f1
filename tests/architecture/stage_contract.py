"""The new-stage checklist as checks: every place a contributor edits to add a stage, for every stage.

``stages/stage.py``'s module docstring ("Adding a stage") lists the same items in words; :data:`CHECKLIST` holds
one :class:`Item` per item — what it is, the file to edit, and a check that returns what is missing. A check takes
a :class:`~stages.stage.Stage` record and reads files only (the stage module's source, ``stages/layout.py``, the
params files, ``dvc.yaml``, the results page of an empty reports folder, the tests under ``tests/stages/``): it runs
no job and no DVC. :func:`problems` runs every check on every stage :func:`stages.params.stages` discovers and returns one line
per missing item — ``stage <name>: <item> — <what is missing> (edit <place>)`` — so that a contributor sees all of
them at once. ``tests/architecture/test_stage_contract.py`` asserts there are none, and that a stage lacking every
item is named for each; the other tests of the same items (``test_architecture.py``'s dvc.yaml tests,
``tests/stages/test_headline.py``) call the same checks.
"""
from __future__ import annotations

import ast
import importlib
import json
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from tests.architecture.import_graph import REPO, compact_deps, modules, stage_command

PARAMS_FILES = ("params.yaml", "params-paper.yaml")
STAGE_TESTS = Path("tests/stages")


@dataclass(frozen=True)
class Item:
    """One item of the checklist: ``name`` (what it is), ``place`` (the file to edit; ``{name}`` is the stage's
    name) and ``check`` (a stage → what is missing, one string each)."""

    name: str
    place: str
    check: Callable[[Any], list[str]]


# ------------------------------------------------------------------------------------------ sources
def _dvc() -> dict[str, Any]:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())


def dvc_block(name: str) -> dict[str, Any]:
    """The stage's block of ``dvc.yaml`` (empty when there is none)."""
    return _dvc()["stages"].get(name) or {}


def is_code(dep: str) -> bool:
    """Whether a ``dvc.yaml`` dep is code (derived from the imports) rather than data (what earlier stages wrote)."""
    return dep.endswith(".py") or dep.split("/")[0] in {"otfed", "stages", "flows"}


def _entry(o: Any) -> str:
    """A ``dvc.yaml`` out / plot entry's path (an entry is a path, or a one-key mapping path → options)."""
    return next(iter(o)) if isinstance(o, dict) else o


def stage_file(stage: Any) -> Path:
    return REPO / "stages" / f"{stage.name}.py"


def _module_source(stage: Any) -> ast.Module | None:
    path = stage_file(stage)
    return ast.parse(path.read_text(), filename=str(path)) if path.is_file() else None


def _params(path: str, stage: Any) -> tuple[Any, list[str]]:
    """The params file's view of ``stage`` (validated, :func:`stages.params.validate_params`) and what is wrong."""
    from otfed.errors import ConfigError
    from stages.params import read_params_file, validate_params

    data = read_params_file(REPO / path)
    if stage.name not in (data or {}):
        return None, [f"no group `{stage.name}:`"]
    try:
        return validate_params(data, source=path, stage=stage.name), []
    except ConfigError as exc:
        return None, [f"does not validate: {line}" for line in str(exc).splitlines()]


@cache
def _results_page() -> str:
    """The results page (:func:`flows.results.page_html`) of an empty reports folder: every stage it shows says
    ``not run yet (dvc repro <stage>)``."""
    from flows import results

    with tempfile.TemporaryDirectory(prefix="otfed-contract-") as tmp:
        root = Path(tmp) / "reports"
        root.mkdir()
        return results.page_html(root, root / "index.html")


# ------------------------------------------------------------------------------------------- checks
def module_problems(stage: Any) -> list[str]:
    """``stages/<name>.py`` exists and its ``STAGE`` is this stage (the runner finds it by name)."""
    if not stage_file(stage).is_file():
        return [f"stages/{stage.name}.py does not exist (the runner, `{stage_command(stage.name)}`, loads it)"]
    found = getattr(importlib.import_module(f"stages.{stage.name}"), "STAGE", None)
    return [] if getattr(found, "name", None) == stage.name else [
        f"stages/{stage.name}.py has no STAGE = Stage({stage.name!r}, …)"]


def job_key_problems(stage: Any) -> list[str]:
    """Every ``Job(...)`` the stage module builds names its ``key=`` (the report reads each result by it)."""
    tree = _module_source(stage)
    if tree is None:
        return [f"no Job(..., key=...) to check: stages/{stage.name}.py does not exist"]
    return [f"stages/{stage.name}.py:{node.lineno}: Job(...) without key=" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Job"
            and not any(k.arg == "key" for k in node.keywords)]


def layout_problems(stage: Any) -> list[str]:
    """The output folders are constants of ``stages/layout.py``, the first a reports folder (``reports(...)``)."""
    from stages import layout

    declared = {value for key, value in vars(layout).items() if key.isupper() and isinstance(value, str)}
    out = [f"output folder {folder!r} is no constant of stages/layout.py" for folder in stage.outputs
           if folder not in declared]
    if not stage.outputs or not stage.outputs[0].startswith(layout.reports("")):
        out.append(f"outputs[0] must be its reports folder, layout.reports(...) (got {stage.outputs[:1]})")
    return out


def params_problems(path: str) -> Callable[[Any], list[str]]:
    """The stage's group is in the params file ``path`` and validates for the stage."""
    def check(stage: Any) -> list[str]:
        return _params(path, stage)[1]

    check.__name__ = f"params_problems[{path}]"
    return check


def cmd_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s cmd is the one entry point, the runner."""
    cmd = dvc_block(stage.name).get("cmd")
    return [] if cmd == stage_command(stage.name) else [f"cmd is {cmd!r}; must be {stage_command(stage.name)!r}"]


def code_deps_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s code deps are what the runner and the stage module import (none missing, none stale)."""
    if f"stages.{stage.name}" not in modules():
        return [f"code deps cannot be derived: stages/{stage.name}.py does not exist"]
    listed = sorted(d for d in dvc_block(stage.name).get("deps", []) if is_code(d))
    expected = compact_deps(stage.name)
    if listed == expected:
        return []
    return [f"code deps differ from its imports: missing {sorted(set(expected) - set(listed))}, stale "
            f"{sorted(set(listed) - set(expected))} — regenerate: python -m tests.architecture.import_graph "
            f"{stage.name}"]


def data_deps_problems(stage: Any) -> list[str]:
    """Every input the stage reads with ``params.yaml`` (``Stage.inputs``: raw files, earlier stages' outputs,
    checkpoints) is under a ``dvc.yaml`` data dep."""
    if stage.inputs is None:
        return [f"Stage(inputs=...) is not declared in stages/{stage.name}.py: its inputs cannot be checked"]
    p, wrong = _params("params.yaml", stage)
    if wrong:
        return ["its inputs cannot be listed: params.yaml has no valid group for it"]
    deps = [Path(d) for d in dvc_block(stage.name).get("deps", []) if not is_code(d)]
    return [f"input {path} is under no data dep" for path in map(Path, stage.inputs(p))
            if not any(path == d or d in path.parents for d in deps)]


def outs_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s outs are exactly the output folders, each ``persist: true`` (a failed run loses nothing)."""
    outs = dvc_block(stage.name).get("outs", [])
    listed = {_entry(o) for o in outs}
    out = []
    if listed != set(stage.outputs):
        out.append(f"outs {sorted(listed)} are not the output folders {sorted(stage.outputs)}")
    not_persistent = [_entry(o) for o in outs if not (isinstance(o, dict) and next(iter(o.values())).get("persist"))]
    if not_persistent:
        out.append(f"outs without persist: true: {not_persistent}")
    return out


def params_deps_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s params are the run keys results depend on, the stage's group and its ``reads``."""
    from stages.params import RUN_RESULT_KEYS

    listed = set(dvc_block(stage.name).get("params", []))
    expected = {*RUN_RESULT_KEYS, stage.name, *stage.reads}
    return [] if listed == expected else [f"params {sorted(listed)}; must be {sorted(expected)}"]


def metrics_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s ``metrics:`` lists the stage's ``metrics.json`` (its headline metrics)."""
    path = f"{stage.outputs[0]}/metrics.json" if stage.outputs else "<reports>/metrics.json"
    return [] if path in _dvc().get("metrics", []) else [f"{path} is not in metrics:"]


def plots_problems(stage: Any) -> list[str]:
    """``dvc.yaml``'s ``plots:`` lists the stage's figures: at least one, and — where its reports are committed —
    exactly the PNGs its reports folder holds."""
    if not stage.outputs:
        return ["no reports folder, no figure in plots:"]
    folder = stage.outputs[0]
    plots = [_entry(p) for p in _dvc().get("plots", []) if _entry(p).startswith(folder + "/")]
    if not plots:
        return [f"no figure of {folder}/ in plots:"]
    committed = sorted(str(f.relative_to(REPO)) for f in (REPO / folder).glob("*.png"))
    if not committed:
        return []  # not run yet: nothing to compare
    out = [f"{f} is not in plots:" for f in committed if f not in plots]
    return out + [f"plots: {f} does not exist" for f in plots if f not in committed]


def headline_problems(stage: Any) -> list[str]:
    """``Stage(headline=...)`` names its few headline metrics, each matching a metric of its committed
    ``metrics.json`` (when committed)."""
    from stages.stage import unmatched_patterns

    if not stage.headline:
        return ["Stage(headline=...) is empty"]
    path = REPO / stage.outputs[0] / "metrics.json" if stage.outputs else None
    if path is None or not path.is_file():
        return []
    return [f"headline pattern {p!r} matches no metric of {path.relative_to(REPO)}"
            for p in unmatched_patterns(json.loads(path.read_text()), stage.headline)]


def results_page_problems(stage: Any) -> list[str]:
    """The results page (``python -m flows.results``) shows the stage: an item of ``flows.paper_numbers.PAPERS``
    names it (``"stage": name``)."""
    return [] if f"not run yet (dvc repro {stage.name})" in _results_page() else [
        "no item of the results page names it (\"stage\": name)"]


def track_problems(stage: Any) -> list[str]:
    """The stage runs in one of the tiny tracks of the stage tests (``FEATURE_TRACK``, ``TEXT_TRACK``), which check
    its outputs byte for byte on a rerun and its params group on the track's own."""
    from tests.stages.conftest import FEATURE_TRACK, TEXT_TRACK

    return [] if stage.name in FEATURE_TRACK + TEXT_TRACK else [
        "in neither FEATURE_TRACK nor TEXT_TRACK (its tiny params: feature_params there, or text_params in "
        "tests/stages/test_text_stages.py)"]


def preflight_test_problems(stage: Any) -> list[str]:
    """The preflight tests' positive control runs the stage's preflight on valid tiny inputs: the stage is in
    ``tests/stages/test_preflight.py``'s ``STAGES`` and its ``preflight_params()`` have its group."""
    from tests.stages import test_preflight

    out = [] if stage.name in test_preflight.STAGES else ["not in STAGES (the preflight's positive control)"]
    return out + ([] if stage.name in test_preflight.preflight_params() else ["no group in preflight_params()"])


def stage_test_problems(stage: Any) -> list[str]:
    """A test module under ``tests/stages/`` checks the stage's outputs: its module docstring names the stage in
    double backquotes."""
    for path in sorted((REPO / STAGE_TESTS).glob("test_*.py")):
        if f"``{stage.name}``" in (ast.get_docstring(ast.parse(path.read_text())) or ""):
            return []
    return [f"no tests/stages/test_*.py whose docstring names ``{stage.name}``"]


CHECKLIST: tuple[Item, ...] = (
    Item("stage module", "stages/{name}.py", module_problems),
    Item("job keys", "stages/{name}.py", job_key_problems),
    Item("output folders", "stages/layout.py", layout_problems),
    Item("params group", "params.yaml", params_problems("params.yaml")),
    Item("paper params group", "params-paper.yaml", params_problems("params-paper.yaml")),
    Item("dvc.yaml cmd", "dvc.yaml stages.{name}.cmd", cmd_problems),
    Item("dvc.yaml code deps", "dvc.yaml stages.{name}.deps", code_deps_problems),
    Item("dvc.yaml data deps", "dvc.yaml stages.{name}.deps", data_deps_problems),
    Item("dvc.yaml outs", "dvc.yaml stages.{name}.outs", outs_problems),
    Item("dvc.yaml params", "dvc.yaml stages.{name}.params", params_deps_problems),
    Item("dvc.yaml metrics", "dvc.yaml metrics", metrics_problems),
    Item("dvc.yaml plots", "dvc.yaml plots", plots_problems),
    Item("headline", "stages/{name}.py STAGE", headline_problems),
    Item("results page", "flows/paper_numbers.py (views: flows/results.py)", results_page_problems),
    Item("tiny track", "tests/stages/conftest.py", track_problems),
    Item("preflight test", "tests/stages/test_preflight.py", preflight_test_problems),
    Item("stage tests", "tests/stages/test_<...>.py", stage_test_problems),
)


def stage_problems(stage: Any, items: tuple[Item, ...] = CHECKLIST) -> list[str]:
    """Every missing item of ``stage``: ``stage <name>: <item> — <what> (edit <place>)``."""
    out = []
    for item in items:
        place = item.place.format(name=stage.name)
        out += [f"stage {stage.name}: {item.name} — {what} (edit {place})" for what in item.check(stage)]
    return out


def problems(found: Mapping[str, Any] | None = None) -> list[str]:
    """Every missing item of every stage (``found``: by default every stage :func:`stages.params.stages`
    discovers), stage by stage."""
    if found is None:
        from stages import params

        found = params.stages()
    return [line for name in sorted(found) for line in stage_problems(found[name])]
