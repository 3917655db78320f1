"""The report a stage writes through the runner: the committed files are written by the runner (flows/stage.py, a
code dep of every stage), and MLflow only receives them as artifacts (flows/tracking.py writes nothing)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from flows.stage import TrackedReport  # noqa: E402


class _Run:
    """Stands in for :class:`flows.tracking.TrackedRun`: records what was logged, writes nothing."""

    def __init__(self) -> None:
        self.logged: list[Path] = []

    def log_artifact(self, path: str | Path) -> None:
        self.logged.append(Path(path))


def test_a_table_and_its_markdown_twin_are_written_rounded_then_logged(tmp_path: Path) -> None:
    run = _Run()
    report = TrackedReport(run, tmp_path)  # type: ignore[arg-type]
    path = report.table(pd.DataFrame({"x": [1, 2], "v": [1 / 3, 2.0]}), "t.csv")
    assert path == tmp_path / "t.csv" and run.logged == [tmp_path / "t.csv", tmp_path / "t.md"]
    assert pd.read_csv(path).x.tolist() == [1, 2]
    assert pd.read_csv(path).v.iloc[0] != 1 / 3  # committed_table: rounded to the committed digits
    assert (tmp_path / "t.md").read_text().startswith("| x | v |")


def test_a_figure_is_saved_as_png_then_logged(tmp_path: Path) -> None:
    run = _Run()
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    path = TrackedReport(run, tmp_path).figure(fig, "f.png")  # type: ignore[arg-type]
    assert run.logged == [tmp_path / "f.png"] and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
