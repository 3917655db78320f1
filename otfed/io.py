"""Atomic writers for everything a stage produces: tables (CSV + Markdown), JSON, arrays, figures.

Every writer writes to a temporary file in the destination folder and renames it into place, so a
crash or a Ctrl-C never leaves a half-written output that DVC could mistake for a result.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd


@contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success rename it onto ``path``, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix or path.suffix)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o644)
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(text: str, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(data: Any, path: str | Path) -> Path:
    """Strict JSON (NaN/inf → null, numpy scalars → numbers), written atomically."""
    return write_text(json.dumps(_finite(data), indent=2, sort_keys=True, default=_json_default,
                                 allow_nan=False) + "\n", path)


def _finite(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def write_csv(frame: pd.DataFrame, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)
    return Path(path)


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (no extra dependency)."""
    def fmt(v: Any) -> str:
        if isinstance(v, (float, np.floating)):
            return format(float(v), floatfmt)
        return str(v)

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows]) + "\n"


def write_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez_compressed(tmp, **arrays)
    return Path(path)


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure atomically as PNG and close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)
    return Path(path)


STAGING_SUFFIX = ".staging"


@contextmanager
def staged_directory(final: str | Path) -> Iterator[Path]:
    """Build a whole output directory beside ``final`` and swap it in only if the block succeeds.

    A stage that fails half-way leaves the previous outputs untouched (nothing is lost) and no
    half-written directory behind.
    """
    import shutil

    final = Path(final)
    staging = _staging(final)
    remove_staging(final)  # left by a killed run
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = final.parent / f".{final.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    if old.exists():
        shutil.rmtree(old)


def remove_staging(final: str | Path) -> bool:
    """Remove the staging folder of ``final`` if one is left (a run killed or still writing when it failed);
    ``final`` itself is never touched. Returns whether one was removed."""
    import shutil

    staging = _staging(Path(final))
    if not staging.exists():
        return False
    shutil.rmtree(staging, ignore_errors=True)
    return True


def _staging(final: Path) -> Path:
    """The staging folder of ``final``: ``.<name>.staging`` beside it (git- and DVC-ignored)."""
    return final.parent / f".{final.name}{STAGING_SUFFIX}"


def final_location(path: str | Path) -> Path:
    """Where a file written inside a :func:`staged_directory` will live once the directory is swapped in."""
    parts = [p[1:-len(STAGING_SUFFIX)] if p.startswith(".") and p.endswith(STAGING_SUFFIX) else p
             for p in Path(path).parts]
    return Path(*parts)
