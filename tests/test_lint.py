"""The tree is lint-clean: ``ruff check`` with the rules of ``[tool.ruff]`` in pyproject.toml (pyflakes — unused
and undefined names — and pycodestyle's error-prone rules) reports nothing. A contributor runs the same command:
``.venv/bin/ruff check .``."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("ruff is not installed in this environment (requirements.lock pins it)")
    return found


def test_ruff_finds_nothing() -> None:
    done = subprocess.run([_ruff(), "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_catches_what_it_is_configured_for(tmp_path: Path) -> None:
    """The configuration is live: an unused import and an undefined name in a file under its rules fail."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    done = subprocess.run([_ruff(), "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), str(bad)],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1 and "F401" in done.stdout and "F821" in done.stdout, done.stdout
