"""Prefect flow of stage ``partition``: one task per federation; writes data/partitions + reports/partition."""
from __future__ import annotations

from contextlib import ExitStack
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
from otfed.data.text import build_text_federation, federation_summary, save_text_federation
from otfed.experiments.knot import text_spec
from otfed.figures.partition import class_histograms
from otfed.orchestration import fan_out, stage_flow


@task(name="build-text-federation", cache_policy=NO_CACHE)
def build_text(task_name: str, spec: Any, data_dir: str, seed: int, out_dir: str) -> pd.DataFrame:
    """Partition one KNOT task into parties (SPEC §1) and write ``<out_dir>/<task>/``; returns its summary."""
    fed = build_text_federation(text_spec(task_name, spec), data_dir, seed)
    save_text_federation(fed, Path(out_dir) / task_name)
    return federation_summary(fed).assign(task=task_name)


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
    text = p.partition.text
    with tracking.stage_run("partition", flatten(read), params_hash(read)) as run, ExitStack() as stack:
        staging = stack.enter_context(io.staged_directory(out_dir))
        reports = stack.enter_context(io.staged_directory(report_dir))
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
        if text is not None:  # KNOT text track: one directory of parties per task
            text_staging = stack.enter_context(io.staged_directory(text.out_dir))
            text_jobs = [dict(task_name=name, spec=spec, data_dir=p.partition.data_dir, seed=p.run.seed,
                              out_dir=str(text_staging)) for name, spec in text.tasks.items()]
            text_table = pd.concat(fan_out(build_text, text_jobs), ignore_index=True)
            text_table = text_table[["task", *[c for c in text_table.columns if c != "task"]]]
            run.log_table(text_table, reports / "text_parties.csv")
            summary["text_tasks"] = len(text_jobs)
            summary["text_rows"] = int(text_table["n"].sum())
        io.write_json(summary, reports / "metrics.json")
        run.log_metrics(summary)
        run.log_artifact(staging / "manifest.json")
    return summary
