"""Prefect flow of stage ``distill``: one task per (task, variant); writes reports/distill (KNOT tables 2–4,
fig. 2, the one-hot ablation of app. C.1).

The server side only: it reads the messages clients sent (transfer-set predictions, dataset sizes,
probability biases), assembles its teacher ensemble from them, and trains a student from its own
pretrained global model with eq. 3 for every {Sinkhorn, Entropy} × {A, D, U, E}. The test sets are read
for scoring only — the experimenter's view, as in the papers' tables.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import numpy as np
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from otfed import io, tracking
from otfed.config import Params, flatten, groups, params_hash
from otfed.data.text import load_text_federation
from otfed.distill.label_space import LabelSpace
from otfed.errors import ConfigError
from otfed.experiments import knot as exp
from otfed.federation.knot import load_messages
from otfed.models import TextClassifier
from otfed.figures import distill as figs
from otfed.orchestration import fan_out, stage_flow, stage_torch_device

distill_task = task(name="distill-variant", cache_policy=NO_CACHE)(exp.distill_variant)

LOSS_NAMES = {"sinkhorn": "Sinkhorn", "kl": "Entropy"}


def distill_flow_factory(params: Params) -> Any:
    """The stage flow, with the task runner named in ``run.task_runner``."""
    return stage_flow("distill", distill, params.run.task_runner, params.run.max_workers)


def variants(d: Any) -> list[tuple[str, str, str, bool]]:
    """(variant name, loss, weighting, one-hot?) for every student the params ask for."""
    out = [(f"{LOSS_NAMES[loss]}-{w}", loss, w, False) for loss in d.losses for w in d.weightings]
    if d.one_hot_ablation:
        out.append(("Sinkhorn-E-onehot", "sinkhorn", "E", True))
    return out


def distill(params: dict) -> dict:
    """Stage ``distill``: eight students per task (+ ablation), tables 2–4, fig. 2, MLflow child runs."""
    p = Params.model_validate(params)
    d, tt, eb = p.distill, p.train_teachers, p.estimate_bias
    if d is None or tt is None or p.partition.text is None:
        raise ConfigError("params.yaml: distill, train_teachers and partition.text are required for stage distill")
    needs_bias = any(w == "E" for w in d.weightings) or d.one_hot_ablation
    if needs_bias and eb is None:
        raise ConfigError("params.yaml: estimate_bias: required by distill.weightings 'E' / one_hot_ablation")
    read = groups(p, "run", "distill")
    read["train_teachers.tasks"] = tt.tasks
    device = stage_torch_device(p.run.device)  # one torch thread per task on CPU
    settings = d.model_dump(include={"epochs", "batch_size", "lr", "weight_decay", "eps", "sinkhorn_iterations",
                                     "eval_batch_size"})
    with tracking.stage_run("distill", flatten(read), params_hash(read)) as run, \
            io.staged_directory(d.out_dir) as out:
        rows: list[dict] = []
        histories: list[dict] = []
        metrics: dict[str, Any] = {}
        for task_name in tt.tasks:
            fed = load_text_federation(f"{p.partition.text.out_dir}/{task_name}")
            messages = load_messages(f"{tt.messages_dir}/{task_name}.npz")
            if needs_bias:
                messages += load_messages(f"{eb.out_dir}/messages_{task_name}.npz")
            ensemble = exp.ensemble_of(messages, fed, d.learning_without_forgetting)
            semantic = LabelSpace.for_task(task_name)
            global_dir = str(exp.model_dir(tt.models_dir, task_name, fed.global_party.name))
            sets = exp.test_sets(fed)  # scoring only; the server never gets the clients' training splits
            with ExitStack() as children:
                jobs = []
                for name, loss, weighting, one_hot in variants(d):
                    child = children.enter_context(run.child(
                        f"{task_name}/{name}", tags={"task": task_name, "loss": loss, "weighting": weighting,
                                                      "label_coordinates": "one-hot" if one_hot else "semantic"}))
                    child.log_params({"task": task_name, "loss": loss, "weighting": weighting,
                                      "one_hot": one_hot, **settings})
                    jobs.append(dict(task=task_name, variant=name, loss=loss, weighting=weighting,
                                     label_space=LabelSpace.one_hot(semantic) if one_hot else semantic,
                                     global_model_dir=global_dir, transfer_texts=fed.transfer_texts,
                                     ensemble=ensemble, sets=sets, settings=settings, seed=p.run.seed,
                                     device=device, run=child))
                results = fan_out(distill_task, jobs)
            # the pretrained global model itself: the "before distillation" reference row
            base_rows, base_probs = exp.evaluate(TextClassifier.load(global_dir, device=device), task_name,
                                                 sets, semantic, d.eval_batch_size)
            for r in base_rows:
                r.update(task=task_name, variant="global (no distillation)", loss="", weighting="", seconds=0.0)
            rows.extend(base_rows)
            probabilities = {"global (no distillation)": base_probs}
            for (name, *_), (variant_rows, probs, history) in zip(variants(d), results):
                rows.extend(variant_rows)
                histories.extend(history)
                probabilities[name] = probs
            labels = {name: y for name, _, y in sets}
            io.write_npz(out / f"predictions_{task_name}.npz",
                         **{f"{v}|{s}": pr for v, by_set in probabilities.items() for s, pr in by_set.items()},
                         **{f"labels|{s}": y for s, y in labels.items()})
            task_table = pd.DataFrame([r for r in rows if r["task"] == task_name])
            run.log_table(figs.results_table(task_table), out / f"table_{task_name}.csv")
            run.log_figure(figs.expected_label_boxplots(probabilities, labels[exp.ALL], semantic,
                                                        ["Sinkhorn-E", "Entropy-E"]),
                           out / f"expected_label_{task_name}.png")
            all_rows = task_table[task_table.test_set == exp.ALL]
            metrics[task_name] = {r["variant"]: {"score": round(r["score"], 4),
                                                 "semantic_distance": round(r["semantic_distance"], 4)}
                                  for r in all_rows.to_dict("records")}
        run.log_table(pd.DataFrame(rows), out / "results.csv")
        run.log_table(pd.DataFrame(histories), out / "history.csv")
        run.log_figure(figs.sinkhorn_vs_entropy(pd.DataFrame(rows)), out / "sinkhorn_vs_entropy.png")
        io.write_json(metrics, out / "metrics.json")
        run.log_metrics(tracking.flat_metrics(metrics))
        run.log_artifact(out / "metrics.json")
    return metrics
