"""The runnable examples of the library's public entry points (issue #23): each entry point's docstring has a
Parameters and a Returns section and an example that checks its result against an independent truth. Each
``test_*_entry_points.py`` file lists its entry points and gets its two tests from :func:`entry_point_tests`."""
from __future__ import annotations

import doctest
import importlib
import inspect
import io
from typing import Any, Callable, Sequence

import pytest


def entry_point(module_name: str, qualname: str) -> Any:
    """``module_name.qualname`` (``Measure.uniform``: a method); importlib, since ``otfed.federation`` exports
    functions named like their modules."""
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def example_report(module_name: str, qualname: str) -> str:
    """'' when the entry point's docstring example runs and prints what it says; else doctest's report of the
    failing lines (an AssertionError when there is no example)."""
    module = importlib.import_module(module_name)
    tests = [t for t in doctest.DocTestFinder().find(module) if t.name == f"{module_name}.{qualname}"]
    assert tests and tests[0].examples, f"{module_name}.{qualname} has no example"
    report, runner = io.StringIO(), doctest.DocTestRunner()
    for test in tests:
        runner.run(test, out=report.write)
    return report.getvalue() if runner.summarize(verbose=False).failed else ""


def missing_sections(module_name: str, qualname: str) -> list[str]:
    """The sections the entry point's docstring lacks: Parameters, and Returns for a function (a class documents
    its constructor's parameters; its methods their results)."""
    obj = entry_point(module_name, qualname)
    doc = inspect.getdoc(obj) or ""
    wanted = ["Parameters"] + ([] if inspect.isclass(obj) else ["Returns"])
    return [section for section in wanted if f"\n{section}:\n" not in doc]


def entry_point_tests(examples: Sequence[tuple[str, str]], documented: Sequence[tuple[str, str]] | None = None,
                      ) -> tuple[Callable[[str, str], None], Callable[[str, str], None]]:
    """The two tests of an entry-point module, parametrized over its (module, qualified name) pairs: every one of
    ``examples`` has an example that passes (:func:`example_report`), every one of ``documented`` (default:
    ``examples``) its Parameters / Returns sections (:func:`missing_sections`). Bind them to ``test_*`` names at
    the module's top level for pytest to collect them."""
    documented = examples if documented is None else documented

    @pytest.mark.parametrize("module_name, entry", examples, ids=[entry for _, entry in examples])
    def test_the_entry_points_runnable_example_passes(module_name: str, entry: str) -> None:
        report = example_report(module_name, entry)
        assert not report, report

    @pytest.mark.parametrize("module_name, entry", documented, ids=[entry for _, entry in documented])
    def test_the_entry_point_documents_its_parameters_and_result(module_name: str, entry: str) -> None:
        missing = missing_sections(module_name, entry)
        assert not missing, f"{module_name}.{entry}: no {' or '.join(missing)} section"

    return test_the_entry_points_runnable_example_passes, test_the_entry_point_documents_its_parameters_and_result
