"""Prefect flow of stage ``train_teachers``: one task per (task, party); writes models/text,
data/text_messages and reports/teachers (KNOT table 1).

Every local client trains its teacher on its own partition and labels the shared transfer set; the
server pretrains the global model on its labelled dataset (learning without forgetting). What leaves a
client — transfer-set predictions and its dataset size — is written as typed messages, one file per task,
and recorded in the ledger (``communication.csv``).
"""
from __future__ import annotations

from contextlib import ExitStack
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
from otfed.federation.ledger import Channel
from otfed.figures import distill as figs
from otfed.orchestration import fan_out, stage_flow, stage_torch_device

train_party_task = task(name="train-party", cache_policy=NO_CACHE)(exp.train_party)


def train_teachers_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("train_teachers", train_teachers, params.run.task_runner, params.run.max_workers)


def train_teachers(params: dict) -> dict:
    """Stage ``train_teachers``: teachers + global model per task, their transfer-set predictions, table 1."""
    p = Params.model_validate(params)
    tt = p.train_teachers
    if tt is None or p.partition.text is None:
        raise ConfigError("params.yaml: train_teachers and partition.text are required for stage train_teachers")
    read = groups(p, "run", "train_teachers")
    read["partition.text.out_dir"] = p.partition.text.out_dir
    device = stage_torch_device(p.run.device)  # one torch thread per task on CPU
    channel = Channel(session="knot")
    with tracking.stage_run("train_teachers", flatten(read), params_hash(read)) as run, \
            io.staged_directory(tt.models_dir) as models, io.staged_directory(tt.messages_dir) as messages_dir, \
            io.staged_directory(tt.out_dir) as out:
        rows: list[dict] = []
        histories: list[dict] = []
        metrics: dict[str, Any] = {}
        for task_name in tt.tasks:
            fed = load_text_federation(f"{p.partition.text.out_dir}/{task_name}")
            with ExitStack() as children:  # one nested MLflow run per party, closed FAILED if training fails
                jobs = []
                for party in (*fed.locals, fed.global_party):
                    model = tt.party_models.get(f"{task_name}.{party.name}", tt.model)
                    child = children.enter_context(run.child(
                        f"{task_name}/{party.name}",
                        tags={"task": task_name, "party": party.name, "role": party.role, "model": model.kind}))
                    jobs.append(dict(task=task_name, party=party, model=model, training=tt.training.model_dump(),
                                     transfer_texts=fed.transfer_texts, label_names=fed.label_names,
                                     out_dir=str(exp.model_dir(models, task_name, party.name)), seed=p.run.seed,
                                     device=device, predict_batch_size=tt.predict_batch_size, run=child))
                results = fan_out(train_party_task, jobs)
            task_messages = []
            for row, history, msgs in results:
                rows.append(row)
                histories.extend(history)
                for m in msgs:
                    channel.send(m)
                task_messages.extend(msgs)
            save_messages(messages_dir / f"{task_name}.npz", task_messages)
            metrics[task_name] = {r["party"]: round(r["test_score"], 4) for r, _, _ in results}
        table = pd.DataFrame(rows)
        run.log_table(table, out / "teachers.csv")
        run.log_table(pd.DataFrame(histories), out / "history.csv")
        run.log_table(channel.ledger.cost_table(), out / "communication.csv")
        run.log_figure(figs.training_curves(pd.DataFrame(histories)), out / "training_curves.png")
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics
