"""Prefect flow of stage ``noisy_removal``: one task per noisy federation; writes reports/removal.

FedBary table 4 (SPEC §3 "Boost FL"): 5 clients with planted noise, the server holding a validation set
(FedBary's target Q) and a test set; each client computes its datum values locally (calibrated gradients
against η_{Q_i}), drops what it flags, and FedAvg is trained before and after.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import Params, flatten, groups, params_hash
from otfed.data.store import load_federation
from otfed.errors import ConfigError
from otfed.experiments import valuation as exp
from otfed.figures import valuation as figs
from otfed.orchestration import fan_out, stage_flow

removal_task = task(name="noisy-removal", cache_policy=NO_CACHE)(exp.removal_experiment)


def noisy_removal_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("noisy_removal", noisy_removal, params.run.task_runner, params.run.max_workers)


def noisy_removal(params: dict) -> dict:
    """Stage ``noisy_removal``: table 4 (#noisy, #removed, FedAvg accuracy before / after removal)."""
    p = Params.model_validate(params)
    if p.noisy_removal is None:
        raise ConfigError("params.yaml: noisy_removal: required key is missing")
    nr, seed = p.noisy_removal, p.run.seed
    read = groups(p, "run", "noisy_removal")
    # FedAvg's torch_threads(1) toggles a process-wide setting; concurrent Prefect tasks would race on it and
    # occasionally train with 2 threads (different float reductions → different accuracies). Pin it once.
    torch.set_num_threads(1)
    config = exp.fedbary_config(nr.fedbary)
    with tracking.stage_run("noisy_removal", flatten(read), params_hash(read)) as run, \
            io.staged_directory(nr.out_dir) as out:
        jobs = []
        for name in nr.federations:
            fed = exp.project_federation(load_federation(name, p.partition.out_dir), nr.pca_components, seed)
            validation, test = exp.server_split(fed, nr.validation_samples)
            jobs.append(dict(name=name, clients=exp.client_sets(fed),
                             noisy=[fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)],
                             validation=validation, test=test, config=config, potential=nr.fedbary.potential,
                             fedavg_params=nr.fedavg.model_dump(), max_remove_fraction=nr.max_remove_fraction,
                             seed=seed))
        results = fan_out(removal_task, jobs)
        table = pd.DataFrame([s for s, _ in results])
        clients = pd.DataFrame([r for _, rows in results for r in rows])
        run.log_table(table, out / "removal.csv")
        run.log_table(clients, out / "removal_clients.csv")
        run.log_figure(figs.removal_figure(table), out / "removal.png")
        metrics: dict[str, Any] = {}
        for r in table.to_dict("records"):
            name = r.pop("federation")
            metrics[name] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
            with run.child(f"removal/{name}", tags={"federation": name}) as child:
                child.log_metrics({k: float(v) for k, v in r.items() if np.isfinite(float(v))})
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics
