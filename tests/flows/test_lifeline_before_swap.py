"""A stage whose caller is gone swaps nothing in (flows/stage.py's last check before the swap, flows/caller.py).

The watcher thread polls the caller about once a second; a caller that dies between its last poll and the swap
is caught only by :meth:`~flows.caller.Lifeline.check` right before the swap. Here the caller is "gone" without
any process or thread: a lifeline naming this process's pid with another start time — a recycled pid, which is
not the caller (flows/caller.py identifies a process by pid and start time). The watcher is never started, so
only the check before the swap can stop the new outputs."""
from __future__ import annotations

import os
from pathlib import Path

import mlflow
import pandas as pd
import psutil
import pytest

from flows.caller import CallerGone, Lifeline, Process
from flows.stage import run_stage
from stages.noisy_removal import NoisyRemovalParams
from stages.params import validate_params
from stages.stage import Job, Stage

PARAMS = {"run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
          "partition": {"federations": {"c": {"scheme": "fedbary_case", "case": 1, "test_samples": 100}}},
          "noisy_removal": {"federations": ["c"], "validation_samples": 50}}


def _stage(value: str) -> Stage:
    """A stage shaped like the real ones: one job per row, a table of the rows in ``out/reports``."""
    def report(p, results, rep, dirs):
        rep.table(pd.DataFrame({"row": list(results.values())}), "rows.csv")
        return {"n": len(results)}

    return Stage(name="noisy_removal", params=NoisyRemovalParams, outputs=("out/reports",),
                 jobs=lambda p, dirs: [Job(f"row {i}", lambda i: f"{value}{i}", dict(i=i), key=("row", i))
                                       for i in range(2)],
                 report=report, reads=("partition.federations",))


def _lifeline(alive: bool) -> Lifeline:
    """A lifeline on this process (alive), or on this pid with another start time (a caller that is gone)."""
    started = psutil.Process(os.getpid()).create_time()
    return Lifeline(Process(os.getpid(), started if alive else started - 1.0, "dvc"))


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_caller_gone_before_the_swap_keeps_the_previous_outputs(tmp_path: Path, mlflow_uri: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = validate_params(PARAMS)
    assert run_stage(_stage("old"), p, lifeline=_lifeline(alive=True)) == {"n": 2}  # the caller is there: swapped
    before = _files(tmp_path / "out")
    assert pd.read_csv("out/reports/rows.csv").row.tolist() == ["old0", "old1"]

    gone = _lifeline(alive=False)
    assert not gone.process.alive()
    with pytest.raises(CallerGone, match=r"\(dvc, pid \d+\) has exited: outputs not swapped in"):
        run_stage(_stage("new"), p, lifeline=gone)
    assert _files(tmp_path / "out") == before  # the previous outputs, byte for byte
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == ["reports"]  # no staging folder left
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("otfed").experiment_id],
                              "tags.stage = 'noisy_removal'", order_by=["attributes.start_time ASC"])
    assert [r.info.status for r in runs] == ["FINISHED", "KILLED"]
