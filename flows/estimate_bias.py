"""Prefect flow of stage ``estimate_bias``: one task per (task, teacher); writes reports/bias.

Each client feeds its own teacher random texts drawn from its own tokenizer vocabulary and sends the
server the argmax frequencies B_k (KNOT §5.2, app. D.1) as a histogram message — the reference point
of the L2-confidence weight E. The frozen global model's bias is estimated too (it is one more teacher
under learning without forgetting).
"""
from __future__ import annotations

from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import Params, flatten, groups, params_hash
from otfed.data.text import load_text_federation
from otfed.errors import ConfigError
from otfed.experiments import knot as exp
from otfed.federation.knot import save_messages
from otfed.figures import distill as figs
from otfed.orchestration import fan_out, stage_flow, stage_torch_device

party_bias_task = task(name="probability-bias", cache_policy=NO_CACHE)(exp.party_bias)


def estimate_bias_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("estimate_bias", estimate_bias, params.run.task_runner, params.run.max_workers)


def estimate_bias(params: dict) -> dict:
    """Stage ``estimate_bias``: B_k of every teacher and global model; table, figure, bias messages."""
    p = Params.model_validate(params)
    eb, tt = p.estimate_bias, p.train_teachers
    if eb is None or tt is None or p.partition.text is None:
        raise ConfigError("params.yaml: estimate_bias, train_teachers and partition.text are required for stage "
                          "estimate_bias")
    read = groups(p, "run", "estimate_bias")
    read["train_teachers.models_dir"] = tt.models_dir
    device = stage_torch_device(p.run.device)  # one torch thread per task on CPU
    with tracking.stage_run("estimate_bias", flatten(read), params_hash(read)) as run, \
            io.staged_directory(eb.out_dir) as out:
        rows: list[dict] = []
        metrics: dict[str, Any] = {}
        for task_name in tt.tasks:
            fed = load_text_federation(f"{p.partition.text.out_dir}/{task_name}")
            parties = [q.name for q in (*fed.locals, fed.global_party)]
            jobs = [dict(task=task_name, party=name, model_dir=str(exp.model_dir(tt.models_dir, task_name, name)),
                         n_texts=eb.n_texts, text_length=eb.text_length, batch_size=eb.batch_size,
                         seed=p.run.seed + i, device=device) for i, name in enumerate(parties)]
            results = fan_out(party_bias_task, jobs)
            save_messages(out / f"messages_{task_name}.npz", [m for _, m in results])
            rows.extend(r for r, _ in results)
            metrics[task_name] = {r["party"]: round(r["max_share"], 4) for r, _ in results}
        table = pd.DataFrame(rows)
        run.log_table(table, out / "bias.csv")
        run.log_figure(figs.bias_figure(table), out / "bias.png")
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics
