"""Prefect flow of stage ``partition``: one task per federation; writes data/partitions + reports/partition."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import Params, flatten, groups, params_hash
from otfed.data.federations import build_federation
from otfed.data.store import save_federation
from otfed.figures.partition import class_histograms
from otfed.orchestration import fan_out, stage_flow


@task(name="build-federation", cache_policy=NO_CACHE)
def build_one(name: str, spec: Any, data_dir: str, seed: int, out_dir: str) -> dict:
    """Partition one federation and write ``<out_dir>/<name>.npz``; returns its manifest entry."""
    data, entry = build_federation(name, spec, data_dir, seed)
    save_federation(data, out_dir)
    return entry


def partition_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("partition", partition, params.run.task_runner, params.run.max_workers)


def partition(params: dict) -> dict:
    """Stage ``partition``: every federation in ``partition.federations`` → npz + manifest, logged to MLflow."""
    p = Params.model_validate(params)
    read = groups(p, "run", "partition")
    out_dir = Path(p.partition.out_dir)
    report_dir = Path("reports/partition")
    with tracking.stage_run("partition", flatten(read), params_hash(read)) as run, \
            io.staged_directory(out_dir) as staging, io.staged_directory(report_dir) as reports:
        jobs = [dict(name=name, spec=spec, data_dir=p.partition.data_dir, seed=p.run.seed, out_dir=str(staging))
                for name, spec in p.partition.federations.items()]
        entries = fan_out(build_one, jobs)
        manifest = {job["name"]: entry for job, entry in zip(jobs, entries)}
        io.write_json(manifest, staging / "manifest.json")
        rows = [dict(federation=f, client=c["name"], group=c["group"], n_train=c["n_train"], n_val=c["n_val"],
                     n_corrupted=c["n_corrupted"], classes=int(np.count_nonzero(c["class_counts"])))
                for f, e in manifest.items() for c in e["clients"]]
        table = pd.DataFrame(rows)
        run.log_table(table, reports / "clients.csv")
        run.log_figure(class_histograms(manifest), reports / "class_histograms.png")
        summary = {"federations": len(manifest), "clients": len(rows), "rows": int(table.n_train.sum() + table.n_val.sum()),
                   "corrupted": int(table.n_corrupted.sum())}
        io.write_json(summary, reports / "metrics.json")
        run.log_metrics(summary)
        run.log_artifact(staging / "manifest.json")
    return summary
