"""The architecture contract (issue 8, DESIGN.md): layers point down, no cycles, no dodged imports, and
``dvc.yaml`` lists the code each stage runs and the folders it writes.

Read from the source with ``ast`` (tests/architecture/import_graph.py), so it runs without importing
anything and names file and line of every violation.
"""
from __future__ import annotations

from graphlib import CycleError, TopologicalSorter

from pathlib import Path

import pytest
import yaml

from tests.architecture.import_graph import REPO, compact_deps, imports_of, modules

# otfed's layers, high → low. A module may import its own subpackage and anything in a lower layer;
# subpackages sharing a layer are independent of each other.
LAYERS: list[tuple[str, ...]] = [
    ("otfed.figures",),
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
           if i.target.split(".")[0] in {"stages", "flows", "bench", "tests", *PIPELINE_ONLY}]
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


def test_stages_use_neither_prefect_nor_mlflow_and_reach_flows_only_from_their_entry_point() -> None:
    bad = []
    for imp in _all_imports("stages"):
        top = imp.target.split(".")[0]
        if top in PIPELINE_ONLY:
            bad.append(f"{_where(imp)} imports {imp.target}")
        if top == "flows" and imp.where != "main":
            bad.append(f"{_where(imp)} imports {imp.target} outside `if __name__ == '__main__':`")
    assert not bad, "\n".join(bad)


def test_stages_do_not_reach_into_each_other() -> None:
    shared = {"stages", "stages.stage", "stages.params", "stages.layout"}
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("stages")
           if i.target.startswith("stages.") and i.target not in shared and i.target != i.source
           and i.source not in shared]
    assert not bad, "a stage reads another stage's outputs, never its module:\n" + "\n".join(bad)


# benchmarks of the pipeline itself (not of the library): bench/scale_out.py times the stage runner's task
# runners on a stage's own jobs; fedbary_scale_out.py runs FedBary on the pipeline's Dask workers
# (flows.runners.DaskWorkers); worker_environ.py times the environment flows.runners gives Dask workers;
# prefect_startup.py times the project's Prefect server (flows.prefect_server) against Prefect's temporary one
PIPELINE_BENCHES = {"scale_out.py", "fedbary_scale_out.py", "worker_environ.py", "blas_threads.py",
                    "prefect_startup.py"}


def test_bench_uses_the_library_only() -> None:
    bad = [f"{_where(i)} imports {i.target}" for i in _all_imports("bench")
           if i.target.split(".")[0] in {"stages", "flows", *PIPELINE_ONLY}
           and Path(_where(i).split(":")[0]).name not in PIPELINE_BENCHES]
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------------- dvc.yaml
def _dvc_stages() -> dict:
    return yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def _is_code(dep: str) -> bool:
    return dep.endswith(".py") or dep.split("/")[0] in {"otfed", "stages", "flows"}


def test_every_stage_module_is_a_dvc_stage_and_back() -> None:
    from stages.params import stages

    assert set(_dvc_stages()) == set(stages())
    for name, stage in _dvc_stages().items():
        assert stage["cmd"] == f"python -m stages.{name}"


@pytest.mark.parametrize("name", sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
def test_dvc_code_deps_are_what_the_stage_imports(name: str) -> None:
    """The code deps of a stage in dvc.yaml are derived from its imports (regenerate with
    ``python -m tests.architecture.import_graph <stage>``): none missing, none stale."""
    listed = sorted(d for d in _dvc_stages()[name]["deps"] if _is_code(d))
    expected = compact_deps(name)
    assert listed == expected, (f"dvc.yaml stage {name}: code deps differ from its imports.\n"
                                f"missing: {sorted(set(expected) - set(listed))}\n"
                                f"stale:   {sorted(set(listed) - set(expected))}\n"
                                f"regenerate: python -m tests.architecture.import_graph {name}")


@pytest.mark.parametrize("name", sorted(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]))
def test_dvc_outs_and_params_are_the_stage_declaration(name: str) -> None:
    """Output folders are declared once (stages/layout.py via each STAGE); dvc.yaml's outs are exactly them,
    and its params are the run keys results depend on, the stage's group and what the stage declares it reads."""
    from stages.params import RUN_RESULT_KEYS, stage

    declared = stage(name)
    dvc = _dvc_stages()[name]
    outs = {next(iter(o)) if isinstance(o, dict) else o for o in dvc["outs"]}
    assert outs == set(declared.outputs)
    assert set(dvc["params"]) == {*RUN_RESULT_KEYS, name, *declared.reads}
    # DVC must not delete an output before the command runs (a failed run would lose it): the runner's
    # staged swap replaces outputs only on success
    not_persistent = [o if isinstance(o, str) else next(iter(o)) for o in dvc["outs"]
                      if not (isinstance(o, dict) and next(iter(o.values())).get("persist") is True)]
    assert not not_persistent, f"dvc.yaml stage {name}: outs without persist: true: {not_persistent}"


def test_code_deps_exist() -> None:
    for name, stage in _dvc_stages().items():
        for dep in filter(_is_code, stage["deps"]):
            assert (REPO / dep).exists(), f"dvc.yaml stage {name}: dep {dep} does not exist"
