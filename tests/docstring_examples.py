"""The runnable examples of the library's public entry points (issue #23): each entry point's docstring has a
Parameters and a Returns section and an example that checks its result against an independent truth. The
``test_*_entry_points.py`` files list their entry points and call these two checks."""
from __future__ import annotations

import doctest
import importlib
import inspect
import io
from typing import Any


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
