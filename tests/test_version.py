"""One version number: ``otfed.__version__`` is pyproject.toml's ``[project] version``, and CHANGELOG.md has a
section for it."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import otfed

REPO = Path(__file__).resolve().parent.parent


def test_version_is_pyprojects() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert otfed.__version__ == project["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", otfed.__version__)


def test_changelog_has_a_section_for_the_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(otfed.__version__)}\]", changelog, flags=re.MULTILINE)
