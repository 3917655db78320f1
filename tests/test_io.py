"""Atomic writers: a failure leaves the previous file / directory untouched and no temp files behind."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from otfed import io


def test_atomic_path_keeps_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "table.csv"
    io.write_csv(pd.DataFrame({"a": [1]}), target)
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half-written")
            raise RuntimeError("crash")
    assert pd.read_csv(target).a.tolist() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.csv"]


def test_staged_directory_swaps_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    with io.staged_directory(out) as staging:
        (staging / "a.txt").write_text("v1")
    assert (out / "a.txt").read_text() == "v1"
    with pytest.raises(ValueError):
        with io.staged_directory(out) as staging:
            (staging / "a.txt").write_text("v2")
            raise ValueError("stage failed")
    assert (out / "a.txt").read_text() == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports"]
    with io.staged_directory(out) as staging:
        (staging / "b.txt").write_text("v3")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]


def test_final_location_maps_staging_paths() -> None:
    assert io.final_location(Path("/r/reports/.fed_distance.staging/x.csv")) == Path("/r/reports/fed_distance/x.csv")


def test_markdown_table_formats_rows() -> None:
    md = io.markdown_table(pd.DataFrame({"method": ["a", "b"], "value": [0.123456, 2.0]}))
    assert md.splitlines() == ["| method | value |", "| --- | --- |", "| a | 0.1235 |", "| b | 2 |"]
