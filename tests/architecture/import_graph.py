"""The project's import graph, read from the source (``ast``), for the architecture contract and for
``dvc.yaml``'s code deps.

Every ``import`` / ``from … import`` of every module in ``otfed/``, ``stages/``, ``flows/``, ``bench/``,
``studies/`` and ``gpu/`` is recorded with where it sits: at module level, inside a function (``function``), under
``if TYPE_CHECKING:`` (``type_checking``, annotations only) or under ``if __name__ == "__main__":``
(``main``, a module's own command line).

Every ``dvc.yaml`` stage runs the one entry point, :data:`RUNNER` (``python -m flows.stage <stage>``:
:func:`stage_command`), which loads the stage module ``stages/<stage>.py`` by name. ``python -m
tests.architecture.import_graph <stage>`` prints the project files that command's code needs — what the stage's
``dvc.yaml`` deps must cover.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("otfed", "stages", "flows", "bench", "studies", "gpu")
RUNNER = "flows.stage"  # the one entry point: every dvc.yaml cmd runs it (stage_command)
#: The runner's operations: the modules that start, keep and signal processes (the Prefect server's keeper, the
#: caller's lifeline), clean what killed stages left (leftovers), log (MLflow tracking, redaction) and find the
#: project's stores — code that cannot change an output's bytes, so no stage depends on it: a comment added to one
#: of them leaves every stage up to date. They write no output (``tests/architecture/test_architecture.py``
#: checks that none calls a writer of ``otfed.io``); the runner's own module, which runs the jobs and writes the
#: report's files, stays a dep.
OPERATIONS = frozenset({"flows.caller", "flows.leftovers", "flows.prefect_server", "flows.project",
                        "flows.redaction", "flows.tracking"})


@dataclass(frozen=True)
class Import:
    source: str   # importing module
    target: str   # imported module (a project module, or the top-level name of a third-party one)
    where: str    # module | function | type_checking | main
    line: int


@cache
def modules() -> dict[str, Path]:
    """Project module name → file (``pkg/__init__.py`` is module ``pkg``)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _resolve(name: str) -> str:
    """The longest project module that ``name`` starts with, else the top-level third-party name."""
    known = modules()
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in known:
            return candidate
    return parts[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main(test: ast.expr) -> bool:
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    """Every import statement of ``module`` with its context."""
    path = modules()[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, "function" if where == "module" else where)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "type_checking")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), where)
            elif isinstance(child, ast.If) and _is_main(child.test) and where == "module":
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "main")
            elif isinstance(child, ast.Import):
                found.extend(Import(module, _resolve(a.name), where, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in child.names:
                    target = _resolve(f"{base}.{alias.name}")
                    found.append(Import(module, target if target in modules() else _resolve(base), where,
                                        child.lineno))
            else:
                visit(child, where)

    visit(tree, "module")
    return tuple(found)


def project_imports(module: str, where: frozenset[str] = frozenset({"module", "function"})) -> set[str]:
    """Project modules ``module`` imports in the given contexts (plus the packages their names pass through)."""
    out = set()
    for imp in imports_of(module):
        if imp.where in where and imp.target in modules():
            out.add(imp.target)
            parts = imp.target.split(".")
            out.update(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules())
    return out


def closure(roots: set[str], where: frozenset[str] = frozenset({"module", "function"}),
            skip: frozenset[str] = frozenset()) -> set[str]:
    """Every project module reachable from ``roots`` through imports in the given contexts."""
    seen, stack = set(), list(roots)
    while stack:
        m = stack.pop()
        if m in seen or m in skip:
            continue
        seen.add(m)
        stack.extend(project_imports(m, where) - seen)
    return seen


def stage_command(stage: str) -> str:
    """The ``dvc.yaml`` cmd of ``stage``: the runner, given the stage's name."""
    return f"python -m {RUNNER} {stage}"


def stage_code(stage: str) -> set[str]:
    """The project modules whose code computes the outputs of ``stage`` when DVC runs it
    (:func:`stage_command`): the runner, the stage module it loads by name (``stages.params.stage``), and what
    they import — but not the runner's :data:`OPERATIONS`, and not the other stage modules, which the runner's
    params model only reads for their params types (``stages.params`` discovers them at run time)."""
    others = frozenset(m for m in modules() if m.startswith("stages.") and m not in
                       {f"stages.{stage}", "stages.stage", "stages.params", "stages.layout"})
    return closure({f"stages.{stage}", RUNNER}, skip=others | OPERATIONS)


def stage_files(stage: str) -> list[str]:
    """:func:`stage_code` as repository paths, sorted."""
    return sorted(str(modules()[m].relative_to(REPO)) for m in stage_code(stage))


def compact_deps(stage: str) -> list[str]:
    """:func:`stage_files` for ``dvc.yaml``: a package folder when all its modules (recursively) are needed,
    else the files; ``__init__.py`` files go with their folder or are listed."""
    needed = set(stage_files(stage))
    folders: dict[str, set[str]] = {}
    for path in modules().values():
        rel = str(path.relative_to(REPO))
        parent = str(Path(rel).parent)
        while parent not in (".", ""):
            folders.setdefault(parent, set()).add(rel)
            parent = str(Path(parent).parent)
    chosen: list[str] = []
    covered: set[str] = set()
    for folder in sorted(folders, key=lambda f: (f.count("/"), f)):
        if folder in PACKAGES:
            continue  # never a whole top-level package: it would rerun every stage on any change
        if any(folder.startswith(c + "/") for c in chosen):
            continue
        if folders[folder] <= needed:
            chosen.append(folder)
            covered |= folders[folder]
    return sorted(chosen + sorted(needed - covered))


if __name__ == "__main__":  # python -m tests.architecture.import_graph <stage> …: the code deps for dvc.yaml
    for name in sys.argv[1:]:
        print(f"  {name}:")
        for dep in compact_deps(name):
            print(f"      - {dep}")
