"""The new-stage checklist — the one list of everything a contributor edits to add a stage — and its checks.

:data:`CHECKLIST` holds one :class:`Item` per rule: what it is (``name``), the file to edit (``place``), the rule in
words (``rule``) and a check that returns what is missing. ``docs/contributing.md``'s "Adding a stage" list is
rendered from it (:func:`checklist_markdown`; ``python -m tests.architecture.stage_contract --write`` rewrites that
section, and ``tests/architecture/test_stage_contract.py`` fails while the page differs), so the words and the
checks cannot drift apart. A check takes a :class:`~stages.stage.Stage` record and reads files only (the stage
module's source, ``stages/layout.py``, the params files, ``dvc.yaml``, the committed ``metrics.json``, the results
page of an empty reports folder, the tests under ``tests/stages/``, ``docs/running.md``): it runs no job and no DVC.
:func:`problems` runs every check on every stage :func:`stages.params.stages` discovers and returns one line per
missing item — ``stage <name>: <item> — <what is missing> (edit <place>)`` — so that a contributor sees all of
them at once. ``tests/architecture/test_stage_contract.py`` asserts there are none, and that a stage lacking every
item is named for each; the other tests of the same items (``test_architecture.py``'s dvc.yaml tests,
``tests/stages/test_headline.py``) call the same checks. One rule is checked elsewhere and says so in its words:
the counts ``docs/running.md`` quotes from ``dvc.yaml`` (``tests/test_readme.py``).
"""
from __future__ import annotations

import ast
import importlib
import json
import tempfile
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from tests.architecture.import_graph import REPO, compact_deps, modules, stage_command

PARAMS_FILES = ("params.yaml", "params-paper.yaml")
STAGE_TESTS = Path("tests/stages")
RUNNING = Path("docs/running.md")
CONTRIBUTING = Path("docs/contributing.md")
#: How many headline metrics a stage's ``Stage(headline=...)`` selects from its committed ``metrics.json``: enough
#: to say what the stage found, few enough for ``dvc metrics show``.
HEADLINE_MIN, HEADLINE_MAX = 3, 20


@dataclass(frozen=True)
class Item:
    """One item of the checklist: ``name`` (what it is), ``place`` (the file to edit, its first word; ``{name}`` is
    the stage's name), ``check`` (a stage → what is missing, one string each) and ``rule`` (the item in words, as
    ``docs/contributing.md`` shows it; Markdown, ``<name>`` for the stage's name)."""

    name: str
    place: str
    check: Callable[[Any], list[str]]
    rule: str

    @property
    def file(self) -> str:
        """The file to edit, as the checklist shows it (``stages/<name>.py``)."""
        return self.place.split()[0].replace("{name}", "<name>")


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


def _leaves(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        out.update(_leaves(value, prefix + (key,)) if isinstance(value, dict) else {prefix + (key,): value})
    return out


def headline_problems(stage: Any) -> list[str]:
    """``Stage(headline=...)`` names its headline metrics; where its ``metrics.json`` is committed, each pattern
    matches a metric of it and they select :data:`HEADLINE_MIN` to :data:`HEADLINE_MAX` numbers, none a wall
    time."""
    from stages.stage import headline_metrics, unmatched_patterns

    if not stage.headline:
        return ["Stage(headline=...) is empty"]
    path = REPO / stage.outputs[0] / "metrics.json" if stage.outputs else None
    if path is None or not path.is_file():
        return []
    metrics = json.loads(path.read_text())
    where = path.relative_to(REPO)
    out = [f"headline pattern {p!r} matches no metric of {where}" for p in unmatched_patterns(metrics, stage.headline)]
    selected = _leaves(headline_metrics(metrics, stage.headline))
    if not HEADLINE_MIN <= len(selected) <= HEADLINE_MAX:
        out.append(f"the patterns select {len(selected)} metrics of {where}; must be {HEADLINE_MIN} to "
                   f"{HEADLINE_MAX}")
    out += [f"headline metric {'.'.join(k)} of {where} is not a number: {v!r}" for k, v in selected.items()
            if isinstance(v, bool) or not isinstance(v, (int, float))]
    return out


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
    ``tests/stages/test_preflight.py``'s ``STAGES``, its ``preflight_params()`` have its group, and every input
    it reads with them is raw data, an output of a stage the template runs (``TEMPLATE_STAGES``) or one of the
    template's ``STAND_INS``."""
    from otfed.errors import ConfigError
    from stages.params import stages, validate_params
    from tests.stages import test_preflight

    out = [] if stage.name in test_preflight.STAGES else ["not in STAGES (the preflight's positive control)"]
    params = test_preflight.preflight_params()
    if stage.name not in params:
        return out + ["no group in preflight_params()"]
    if stage.inputs is None:
        return out
    try:
        p = validate_params(params, source="preflight_params()", stage=stage.name)
    except ConfigError as exc:
        return out + [f"preflight_params() do not validate: {line}" for line in str(exc).splitlines()]
    found = stages()
    written = [Path(folder) for name in test_preflight.TEMPLATE_STAGES if name in found
               for folder in found[name].outputs]
    raw = REPO / params["partition"]["data_dir"]
    for path in map(Path, stage.inputs(p)):
        path = path.relative_to(REPO) if path.is_absolute() and path.is_relative_to(REPO) else path
        if (str(path) in test_preflight.STAND_INS or (REPO / path).is_relative_to(raw)
                or any(d == path or d in path.parents for d in written)):
            continue
        out.append(f"input {path} is written by no stage of TEMPLATE_STAGES: give the template a stand-in for it "
                   "(STAND_INS)")
    return out


def stage_test_problems(stage: Any) -> list[str]:
    """A test module under ``tests/stages/`` checks the stage's outputs: its module docstring names the stage in
    double backquotes."""
    for path in sorted((REPO / STAGE_TESTS).glob("test_*.py")):
        if f"``{stage.name}``" in (ast.get_docstring(ast.parse(path.read_text())) or ""):
            return []
    return [f"no tests/stages/test_*.py whose docstring names ``{stage.name}``"]


def running_problems(stage: Any) -> list[str]:
    """``docs/running.md``'s table of stages (under "## Pipeline stages") has a row for the stage."""
    text = (REPO / RUNNING).read_text(encoding="utf-8")
    section = text.split("\n## Pipeline stages", 1)[1].split("\n## ", 1)[0] if "\n## Pipeline stages" in text else ""
    return [] if f"\n| `{stage.name}` |" in section else [
        f"no row `| `{stage.name}` | reads | writes |` in the table under \"## Pipeline stages\""]


CHECKLIST: tuple[Item, ...] = (
    Item("stage module", "stages/{name}.py", module_problems,
         "the module, in `stages/stage.py`'s shape (copy `stages/noisy_removal.py`): `OUTPUTS`, the params type, "
         "`jobs()`, one pure task function per kind of job, `report()` reading `Results` by key, `inputs` (the files "
         "it reads) and `STAGE = Stage(\"<name>\", …)`, which `stages/params.py` finds (there is no registry)"),
    Item("job keys", "stages/{name}.py", job_key_problems,
         "a `key=` on every `Job(...)` it builds"),
    Item("headline", "stages/{name}.py STAGE", headline_problems,
         f"`Stage(headline=(…))`: patterns that select {HEADLINE_MIN} to {HEADLINE_MAX} numbers of its "
         "`metrics.json` (never a wall time), each pattern matching one"),
    Item("output folders", "stages/layout.py", layout_problems,
         "its output folders as constants: `reports(\"<folder>\")` first, then any data folder"),
    Item("params group", "params.yaml", params_problems("params.yaml"),
         "its group `<name>:` (commented like the others), valid for the stage"),
    Item("paper params group", "params-paper.yaml", params_problems("params-paper.yaml"),
         "its group at the papers' scale, valid for the stage"),
    Item("dvc.yaml cmd", "dvc.yaml stages.{name}.cmd", cmd_problems,
         "its block's `cmd: python -m flows.stage <name>`"),
    Item("dvc.yaml code deps", "dvc.yaml stages.{name}.deps", code_deps_problems,
         "the code deps printed by `python -m tests.architecture.import_graph <name>`"),
    Item("dvc.yaml data deps", "dvc.yaml stages.{name}.deps", data_deps_problems,
         "data deps covering every file of `inputs`"),
    Item("dvc.yaml outs", "dvc.yaml stages.{name}.outs", outs_problems,
         "`outs` = `OUTPUTS`, each with `persist: true`"),
    Item("dvc.yaml params", "dvc.yaml stages.{name}.params", params_deps_problems,
         "`params`: `run.seed`, `run.device`, `<name>` and what `Stage(reads=…)` names"),
    Item("dvc.yaml metrics", "dvc.yaml metrics", metrics_problems,
         "`reports/<folder>/metrics.json` under `metrics:`"),
    Item("dvc.yaml plots", "dvc.yaml plots", plots_problems,
         "at least one figure under `plots:` (a stage of tables only fails), and once its reports are committed "
         "exactly the PNGs of its reports folder"),
    Item("results page", "flows/paper_numbers.py (views: flows/results.py)", results_page_problems,
         "an item of the results page naming the stage (`\"stage\": \"<name>\"`); a table it shows needs a view in "
         "`flows/results.py`"),
    Item("tiny track", "tests/stages/conftest.py", track_problems,
         "the stage in a tiny track, `FEATURE_TRACK` (its tiny params in `feature_params`) or `TEXT_TRACK` (in "
         "`text_params`, `tests/stages/test_text_stages.py`), whose outputs the stage tests check byte for byte on a "
         "rerun"),
    Item("preflight test", "tests/stages/test_preflight.py", preflight_test_problems,
         "the stage in `STAGES` and its tiny group in `preflight_params()` (the preflight's positive control); every "
         "input it reads there written by a stage of `TEMPLATE_STAGES`, else a stand-in for it in `STAND_INS`"),
    Item("stage tests", "tests/stages/test_{name}_stage.py (or the track's module)", stage_test_problems,
         "its outputs against independent truths (or the track's test module), its module docstring naming the "
         "stage in double backquotes"),
    Item("running.md", "docs/running.md", running_problems,
         "a row of the table under \"Pipeline stages\" (what it reads and writes), and the three counts the page "
         "quotes from `dvc.yaml` — metric values, stages, PNG figures (checked by `tests/test_readme.py`)"),
)

#: The generated section of docs/contributing.md lies between these two lines.
BEGIN = ("<!-- generated from CHECKLIST in tests/architecture/stage_contract.py by `python -m "
         "tests.architecture.stage_contract --write`: edit the checklist there, not here -->")
END = "<!-- end of the generated checklist -->"
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
          10: "ten", 11: "eleven", 12: "twelve"}


def checklist_markdown(items: tuple[Item, ...] = CHECKLIST) -> str:
    """The checklist as ``docs/contributing.md`` shows it: one numbered entry per file, in the order of
    :data:`CHECKLIST`, each rule under its file with its item's name (the name a failure of the contract test
    gives)."""
    files: dict[str, list[Item]] = {}
    for item in items:
        files.setdefault(item.file, []).append(item)
    new = [f for f in files if "<name>" in f]
    count = _WORDS.get(len(files), str(len(files)))
    intro = (f"{count[0].upper()}{count[1:]} files, {_WORDS.get(len(new), str(len(new)))} of them new; "
             "`tests/architecture/test_stage_contract.py` checks every item for every stage and names each missing "
             "one with the file to edit (a fake stage lacking each item proves it does).")
    lines = [*_wrap(intro, ""), ""]
    for number, (file, rules) in enumerate(files.items(), start=1):
        lines.append(f"{number}. `{file}`{' (new)' if file in new else ''}")
        for i, item in enumerate(rules):
            end = "." if number == len(files) and i == len(rules) - 1 else ";"
            lines += _wrap(f"    - *{item.name}*: {item.rule}{end}", "      ")
    return "\n".join(lines)


def _wrap(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most 116 characters (the docs' width), continuation lines indented by ``indent``."""
    return textwrap.wrap(text, 116, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)


def generated_section(text: str) -> str | None:
    """The part of ``text`` between :data:`BEGIN` and :data:`END` (without them), None when either is missing."""
    if BEGIN not in text or END not in text.split(BEGIN, 1)[1]:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


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


if __name__ == "__main__":  # python -m tests.architecture.stage_contract [--write]
    import sys

    page = REPO / CONTRIBUTING
    text = page.read_text(encoding="utf-8")
    if "--write" not in sys.argv[1:]:
        print(checklist_markdown())
    elif generated_section(text) is None:
        sys.exit(f"error: {CONTRIBUTING} has no section between {BEGIN!r} and {END!r}")
    else:
        before, rest = text.split(BEGIN, 1)
        page.write_text(f"{before}{BEGIN}\n\n{checklist_markdown()}\n\n{END}{rest.split(END, 1)[1]}", encoding="utf-8")
        print(f"{CONTRIBUTING}: checklist rewritten")
