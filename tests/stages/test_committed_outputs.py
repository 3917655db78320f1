"""What a stage commits, and how the runner's :class:`~stages.stage.Report` writes it: no wall-time column and
no last-digit noise in the reports folder (``stages.stage.committed_table``, ``committed_number``, the headline's
digits); the full table, wall times included, and the figures of wall times in the MLflow run only
(``flows.stage.TrackedReport``)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
import pytest

from flows import tracking
from flows.stage import TrackedReport
from stages.stage import committed_number, committed_table, headline_metrics


def test_committed_number_keeps_ten_significant_digits() -> None:
    assert committed_number(1 / 3) == 0.3333333333 and repr(committed_number(2 / 3)) == "0.6666666667"
    assert committed_number(0.1 + 0.2) == 0.3  # 0.30000000000000004: the noise is gone
    assert committed_number(1543568016.0) == 1543568016.0  # ten digits: unchanged
    assert committed_number(12345678901.0) == 12345678900.0
    assert committed_number(-math.inf) == -math.inf and math.isnan(committed_number(math.nan))
    # two dvc repro runs of the same code wrote A(k) = 8.988863313745691 and 8.988863313745693
    assert committed_number(8.988863313745691) == committed_number(8.988863313745693) == 8.988863314
    values = np.random.default_rng(0).lognormal(0.0, 3.0, 1000)
    assert all(committed_number(committed_number(v)) == committed_number(v) for v in values)  # idempotent
    assert all(committed_number(v) == committed_number(np.nextafter(v, np.inf)) for v in values)  # one ulp apart


def test_committed_table_drops_wall_times_and_rounds_floats_only() -> None:
    frame = pd.DataFrame({"method": ["a", "b"], "value": [1 / 3, np.nan], "n": [1, 2], "seconds": [0.1, 0.2],
                          "fedbary_seconds": [1.0, 2.0], "seconds_exact": [3.0, 4.0],
                          "x32": np.array([0.1, 0.7], dtype=np.float32), "flag": [True, False]})
    before = frame.copy()
    out = committed_table(frame)
    assert list(out.columns) == ["method", "value", "n", "x32", "flag"]
    assert out.value.iloc[0] == 0.3333333333 and np.isnan(out.value.iloc[1])
    assert out.x32.dtype == np.float32 and out.x32.tolist() == frame.x32.tolist()  # 7 digits: nothing to round
    assert out.n.dtype == frame.n.dtype and out.flag.tolist() == [True, False] and out.method.tolist() == ["a", "b"]
    pd.testing.assert_frame_equal(frame, before)  # pure


def test_headline_floats_have_the_committed_digits() -> None:
    got = headline_metrics({"a": 1 / 3, "n": 12345678901, "ok": True, "nested": {"b": 0.1 + 0.2, "seconds": 1 / 3}})
    assert got == {"a": 0.3333333333, "n": 12345678901, "ok": True, "nested": {"b": 0.3}}
    assert type(got["n"]) is int and got["ok"] is True


def test_tracked_report_commits_no_wall_time_and_logs_the_full_table(tmp_path: Path, mlflow_uri: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = Path("reports/demo")
    out.mkdir(parents=True)
    frame = pd.DataFrame({"method": ["fedbary", "lava"], "value": [1 / 3, 2.5], "seconds": [0.123456789012345, 1.5],
                          "fedbary_seconds": [2.0, 3.0], "seconds_exact": [4.0, 5.0], "n": [10, 20]})
    with tracking.stage_run("demo", {}, "0") as run:
        report = TrackedReport(run, out)
        report.table(frame, "scores.csv")
        report.table(frame[["method", "n"]], "plain.csv", markdown=False)
        fig, ax = plt.subplots()
        ax.plot(frame.n, frame.seconds)
        report.timing_figure(fig, "time.png")
        run_id = run.run_id
    # on disk (committed): no wall-time column, ten digits; no timing file at all
    assert sorted(p.name for p in out.iterdir()) == ["plain.csv", "scores.csv", "scores.md"]
    assert (out / "scores.csv").read_text() == "method,value,n\nfedbary,0.3333333333,10\nlava,2.5,20\n"
    assert (out / "scores.md").read_text().splitlines()[0] == "| method | value | n |"
    assert (out / "plain.csv").read_text() == "method,n\nfedbary,10\nlava,20\n"
    # in MLflow: the committed files where they live, the full table and the figure under timings/
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    assert {a.path for a in client.list_artifacts(run_id, "reports/demo")} == {
        "reports/demo/scores.csv", "reports/demo/scores.md", "reports/demo/plain.csv"}
    assert {a.path for a in client.list_artifacts(run_id, "timings")} == {
        "timings/scores.csv", "timings/scores.md", "timings/time.png"}  # a table without wall times: not here
    downloads = tmp_path / "downloads"
    full = pd.read_csv(client.download_artifacts(run_id, "timings/scores.csv", str(downloads)))
    pd.testing.assert_frame_equal(full, frame)  # every column, every digit
    md = Path(client.download_artifacts(run_id, "timings/scores.md", str(downloads))).read_text()
    assert md.splitlines()[0] == "| method | value | seconds | fedbary_seconds | seconds_exact | n |"
    png = Path(client.download_artifacts(run_id, "timings/time.png", str(downloads))).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
