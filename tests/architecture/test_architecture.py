"""The architecture contract (issue 8): layers point down, no cycles, no dodged imports, and
``dvc.yaml`` lists the code each stage runs and the folders it writes.

Read from the source with ``ast`` (tests/architecture/import_graph.py), so it runs without importing
anything and names file and line of every violation.
"""
from __future__ import annotations

import re
from graphlib import CycleError, TopologicalSorter

from pathlib import Path

import pytest
import yaml

from tests.architecture.import_graph import REPO, imports_of, modules
from tests.architecture.stage_contract import (cmd_problems, code_deps_problems, is_code, outs_problems,
                                               params_deps_problems)

# otfed's layers, high → low. A module may import its own subpackage and anything in a lower layer;
# subpackages sharing a layer are independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("otfed.figures", "otfed.flower"),
    ("otfed.privacy",),
    ("otfed.federation",),
    ("otfed.valuation", "otfed.distill"),
    ("otfed.fl", "otfed.models", "otfed.clustering"),
    ("otfed.data", "otfed.metrics"),
    ("otfed.ot", "otfed.label_space"),
    ("otfed.io", "otfed.schema", "otfed.device", "otfed.host_sync"),
    ("otfed.errors", "otfed.cpu_kernels"),
]
PIPELINE_ONLY = {"prefect", "mlflow"}


def _unit(module: str) -> str:
    """The layer unit of an otfed module: ``otfed.ot.exact`` → ``otfed.ot``; ``otfed.metrics`` itself."""
    return ".".join(module.split(".")[:2])


def _layer(unit: str) -> int:
    for i, units in enumerate(LAYERS):
        if unit in units:
            return i
    raise AssertionError(f"{unit} is in no layer of tests/architecture/test_architecture.py:LAYERS — add it")


def _where(imp) -> str:
    return f"{modules()[imp.source].relative_to(REPO)}:{imp.line}"


def _all_imports(prefix: str):
    return [imp for m in modules() if m == prefix or m.startswith(prefix + ".") for imp in imports_of(m)]


def test_every_otfed_module_is_in_a_layer() -> None:
    for m in modules():
        if m.startswith("otfed."):
            _layer(_unit(m))


def test_otfed_is_a_pure_library() -> None:
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("otfed")
           if i.target.split(".")[0] in {"stages", "flows", "bench", "studies", "gpu", "tests", *PIPELINE_ONLY}]
    assert not bad, "otfed/ must not import the pipeline, Prefect or MLflow:\n" + "\n".join(bad)


def test_otfed_layers_point_down() -> None:
    bad = []
    for imp in _all_imports("otfed"):
        if not imp.target.startswith("otfed.") or imp.where == "type_checking":
            continue
        src, dst = _unit(imp.source), _unit(imp.target)
        if src != dst and _layer(dst) <= _layer(src):
            bad.append(f"{_where(imp)}: {src} (layer {_layer(src)}) imports {dst} (layer {_layer(dst)})")
    assert not bad, "imports must point to a lower layer:\n" + "\n".join(bad)


def test_no_function_level_import_inside_otfed() -> None:
    bad = [f"{_where(i)} imports {i.target} inside a function" for i in _all_imports("otfed")
           if i.where == "function" and i.target.startswith("otfed")]
    assert not bad, "a function-level import hides a dependency (or dodges a cycle):\n" + "\n".join(bad)


def test_otfed_module_graph_has_no_cycle() -> None:
    graph = {m: {i.target for i in imports_of(m) if i.target.startswith("otfed") and i.where != "type_checking"
                 and i.target != m}
             for m in modules() if m.startswith("otfed")}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as exc:
        pytest.fail(f"import cycle in otfed: {' → '.join(exc.args[1])}")


def test_stages_use_neither_prefect_nor_mlflow() -> None:
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("stages") if i.target.split(".")[0] in PIPELINE_ONLY]
    assert not bad, "\n".join(bad)


def test_stages_never_import_flows() -> None:
    """One entry point: the runner (``python -m flows.stage <name>``) imports the stages, never the other way —
    no module under stages/ imports flows, at module level, inside a function, under ``TYPE_CHECKING`` or in
    an ``if __name__ == "__main__":`` block."""
    bad = [f"{_where(i)} imports {i.target} ({i.where})" for i in _all_imports("stages")
           if i.target.split(".")[0] == "flows"]
    assert not bad, ("stages/ must not import flows/ (the runner, flows/stage.py, imports the stages; dvc.yaml runs "
                     "`python -m flows.stage <name>`):\n" + "\n".join(bad))


def test_stages_do_not_reach_into_each_other() -> None:
    shared = {"stages", "stages.stage", "stages.params", "stages.layout"}
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("stages")
           if i.target.startswith("stages.") and i.target not in shared and i.target != i.source
           and i.source not in shared]
    assert not bad, "a stage reads another stage's outputs, never its module:\n" + "\n".join(bad)


# benchmarks of the pipeline itself (not of the library): bench/scale_out.py times the stage runner's task
# runners on a stage's own jobs; fedbary_scale_out.py runs FedBary on the pipeline's Dask workers
# (flows.runners.DaskWorkers); worker_environ.py times the environment flows.runners gives Dask workers;
# blas_threads.py times fed_distance's own jobs (stages.fed_distance) under BLAS and task thread counts;
# prefect_startup.py times the project's Prefect server (flows.prefect_server) against Prefect's temporary one
PIPELINE_BENCHES = {"scale_out.py", "fedbary_scale_out.py", "worker_environ.py", "blas_threads.py",
                    "prefect_startup.py"}


def _pipeline_imports(module: str) -> list[str]:
    return [i.target for i in imports_of(module) if i.target.split(".")[0] in {"stages", "flows", *PIPELINE_ONLY}]


def test_bench_imports_the_pipeline_only_where_listed() -> None:
    """A benchmark of the library imports otfed only; the benchmarks of the pipeline itself (PIPELINE_BENCHES, which
    docs/contributing.md's diagram names) may import stages/, flows/, Prefect and MLflow — and each of them does,
    so the exemption lists no library benchmark. No benchmark imports a study or the GPU tooling."""
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("bench")
           if i.target.split(".")[0] in {"studies", "gpu"}
           or (i.target.split(".")[0] in {"stages", "flows", *PIPELINE_ONLY}
               and Path(_where(i).split(":")[0]).name not in PIPELINE_BENCHES)]
    assert not bad, "\n".join(bad)
    benches = {path.name: name for name, path in modules().items() if name.startswith("bench.")}
    stale = sorted(name for name in PIPELINE_BENCHES if name not in benches or not _pipeline_imports(benches[name]))
    assert not stale, f"PIPELINE_BENCHES lists benchmarks that import no part of the pipeline: {stale}"


def test_studies_use_the_library_only() -> None:
    """A study asks a question of the methods (otfed), not of the pipeline that runs them; nor does it import a
    benchmark or the GPU tooling."""
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("studies")
           if i.target.split(".")[0] in {"stages", "flows", "bench", "gpu", *PIPELINE_ONLY}]
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------------- dvc.yaml
# (the checks are the stage checklist's, tests/architecture/stage_contract.py; test_stage_contract.py runs all of
# them on every stage at once)
def _dvc_stages() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def test_every_stage_module_is_a_dvc_stage_and_back() -> None:
    from stages.params import stages

    assert set(_dvc_stages()) == set(stages())
    for stage in stages().values():
        assert not cmd_problems(stage), f"dvc.yaml stage {stage.name}: {cmd_problems(stage)}"


@pytest.mark.parametrize("name", sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
def test_dvc_code_deps_are_what_the_stage_imports(name: str) -> None:
    """The code deps of a stage in dvc.yaml are derived from the imports of the runner and the stage module
    (regenerate with ``python -m tests.architecture.import_graph <stage>``): none missing, none stale."""
    from stages.params import stage

    problems = code_deps_problems(stage(name))
    assert not problems, f"dvc.yaml stage {name}: {problems[0]}"


@pytest.mark.parametrize("name", sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
def test_dvc_outs_and_params_are_the_stage_declaration(name: str) -> None:
    """Output folders are declared once (stages/layout.py via each STAGE); dvc.yaml's outs are exactly them, each
    ``persist: true`` (DVC must not delete an output before the command runs: the runner's staged swap replaces
    outputs only on success), and its params are the run keys results depend on, the stage's group and what the
    stage declares it reads."""
    from stages.params import stage

    problems = outs_problems(stage(name)) + params_deps_problems(stage(name))
    assert not problems, f"dvc.yaml stage {name}: " + "; ".join(problems)


def test_code_deps_exist() -> None:
    for name, stage in _dvc_stages().items():
        for dep in filter(is_code, stage["deps"]):
            assert (REPO / dep).exists(), f"dvc.yaml stage {name}: dep {dep} does not exist"


# the writers of otfed.io: a call to one puts bytes where an output may land
_WRITERS = {"atomic_path", "write_text", "write_json", "write_csv", "write_npz", "save_figure", "staged_directory"}


def _io_writer_calls(module: str) -> list[str]:
    import ast

    tree = ast.parse(modules()[module].read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _WRITERS and isinstance(node.value, ast.Name) \
                and node.value.id == "io":  # ``from otfed import io`` (the project's one spelling)
            found.append(f"{modules()[module].relative_to(REPO)}:{node.lineno} {node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "otfed.io":
            found += [f"{modules()[module].relative_to(REPO)}:{node.lineno} imports {a.name}" for a in node.names
                      if a.name in _WRITERS]
    return found


def test_the_runners_operations_write_no_output_and_import_no_stage() -> None:
    """The modules no stage depends on (:data:`~tests.architecture.import_graph.OPERATIONS`: keeper, lifeline,
    tracking, redaction, the stores' paths) cannot change an output: none calls a writer of ``otfed.io`` (the
    runner writes the report's files and MLflow only logs them) and none imports a stage module or the runner."""
    from tests.architecture.import_graph import OPERATIONS, project_imports

    assert OPERATIONS <= set(modules())
    for module in sorted(OPERATIONS):
        assert not _io_writer_calls(module), f"{module} writes files an output may be: {_io_writer_calls(module)}"
        reached = {m for m in project_imports(module) if m.startswith("stages") or m == "flows.stage"}
        assert not reached, f"{module} imports {sorted(reached)}: an operations module computes nothing"


def test_the_writer_check_finds_a_write() -> None:
    """The check above sees a writer call (the runner's own module writes the report's files)."""
    assert any("write_csv" in hit for hit in _io_writer_calls("flows.stage"))


def test_no_stage_depends_on_the_runners_operations() -> None:
    """``echo '#' >> flows/redaction.py`` must leave every stage up to date: no stage's deps name an operations
    module, or a folder holding one."""
    from tests.architecture.import_graph import OPERATIONS

    files = {str(modules()[m].relative_to(REPO)) for m in OPERATIONS}
    for name, stage in _dvc_stages().items():
        hits = [d for d in stage["deps"] for f in files if f == d or f.startswith(d.rstrip("/") + "/")]
        assert not hits, f"dvc.yaml stage {name} depends on operations code {hits}"


def _diagram() -> list[str]:
    """The lines of docs/contributing.md's architecture diagram (its first fenced block)."""
    text = (REPO / "docs" / "contributing.md").read_text(encoding="utf-8")
    return text.split("```", 2)[1].splitlines()


def test_the_contributing_diagram_draws_the_enforced_layers_in_order() -> None:
    """Each layer of LAYERS is one row of the diagram's otfed/ block, high → low, naming exactly its units."""
    lines = _diagram()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("otfed/"))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        head = line.strip().split("  ")[0]
        rows.append(tuple(f"otfed.{name.strip()}" for name in head.split("│")))
    assert rows == LAYERS, ("docs/contributing.md's layer diagram differs from the layers the architecture test "
                            f"enforces:\n  drawn:    {rows}\n  enforced: {LAYERS}")


def test_the_contributing_diagram_names_the_pipeline_benchmarks() -> None:
    """bench/ is not library-only: the diagram names every benchmark allowed to import stages/ and flows/, and no
    other benchmark."""
    drawn = set(re.findall(r"\w+", " ".join(_diagram())))
    missing = [name for name in sorted(PIPELINE_BENCHES) if name.removesuffix(".py") not in drawn]
    assert not missing, f"docs/contributing.md's diagram does not name the pipeline benchmarks {missing}"
    others = sorted(path.stem for name, path in modules().items() if name.startswith("bench.")
                    and path.name not in PIPELINE_BENCHES and path.stem != "__init__" and path.stem in drawn)
    assert not others, f"docs/contributing.md's diagram names library benchmarks among the pipeline's: {others}"
