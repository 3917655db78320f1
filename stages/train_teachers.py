"""Stage ``train_teachers`` — KNOT table 1 (§6): a teacher per local client and the server's global model.

Every local client trains its teacher on its own partition (cross-entropy, early stopping on validation
macro-F1) and labels the shared transfer set; the server pretrains the global model on its labelled dataset
the same way (learning without forgetting). What leaves a client — transfer-set predictions and its dataset
size — is written as typed messages, one file per task (``data/text_messages/<task>.npz``), and recorded in
the ledger (``communication.csv``). Models go to ``models/text/<task>/<party>/``. One job per (task, party).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from pydantic import Field

from otfed.data.text import TextFederation, TextParty, TextTask, load_text_federation
from otfed.data.text.store import FILES
from otfed.device import stage_device
from otfed.federation.knot import client_messages, save_messages
from otfed.federation.ledger import Channel
from otfed.federation.messages import Message
from otfed.figures import distill as figs
from otfed.metrics import macro_f1, score_name, task_score
from otfed.models import EPOCH_KEYS, ModelSpec, TrainingConfig, build_classifier, train_classifier
from otfed.schema import Strict
from stages import layout
from stages.stage import Job, Report, Results, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.TEACHER_REPORTS, layout.TEXT_MODELS, layout.TEXT_MESSAGES)


# ------------------------------------------------------------------------------------------ params
class TrainTeachersParams(Strict):
    """Stage ``train_teachers``: one teacher per local client plus the global model, per task."""

    tasks: list[TextTask] = Field(["sa", "erc", "nli"], min_length=1)
    model: ModelSpec = ModelSpec()
    party_models: dict[str, ModelSpec] = Field(
        {}, description="'<task>.<party>' → model for that party (teachers may differ in architecture).")
    training: TrainingConfig = TrainingConfig()
    party_training: dict[str, TrainingConfig] = Field(
        {}, description="'<task>.<party>' → training settings for that party (e.g. a transformer teacher's lower lr).")
    predict_batch_size: int = Field(128, ge=1)
    global_vocabulary: Literal["own", "own+transfer"] = Field(
        "own+transfer", description="The texts the global model's word-piece vocabulary is built from: its own "
                                    "train split, or that and the unlabelled transfer texts — both the server's, so "
                                    "no client text is used — so that the student distilled from it can represent "
                                    "the words of the texts it distils on.")


def check(p: Params) -> None:
    """The text partitions exist for every task trained; per-party models name real parties."""
    text = p.partition.text
    if text is None:
        raise ValueError("partition.text: required by the text-track stages (train_teachers, estimate_bias, "
                         "distill)")
    tt = p.train_teachers
    for i, task in enumerate(tt.tasks):
        if task not in text.tasks:
            raise ValueError(f"train_teachers.tasks[{i}]: task {task!r} has no partition.text.tasks entry; "
                             f"defined: {sorted(text.tasks)}")
    for group in ("party_models", "party_training"):
        for key in getattr(tt, group):
            task, _, party = key.partition(".")
            spec = text.tasks.get(task)
            parties = [] if spec is None else [*spec.locals, spec.global_party]
            if party not in parties:
                allowed = [f"{t}.{q}" for t, s in text.tasks.items() for q in [*s.locals, s.global_party]]
                raise ValueError(f"train_teachers.{group}: unknown party {key!r}; allowed: {', '.join(allowed)}")


def inputs(p: Params) -> list[Path]:
    """The text partition files of every task trained (checked to exist before :func:`preflight`)."""
    return [Path(layout.TEXT_PARTITIONS) / task / name for task in p.train_teachers.tasks for name in FILES]


def text_partition(p: Params, task: str) -> TextFederation:
    """The partition of ``task`` (``data/text_partitions/<task>``), checked against the format and against the
    parties ``partition.text`` declares (DataError naming the file and the column / key otherwise)."""
    return load_text_federation(Path(layout.TEXT_PARTITIONS) / task, spec=p.partition.text.tasks[task])


def preflight(p: Params) -> None:
    """Every task's partition reads and holds what its format and ``partition.text`` declare — labels of the
    task's label set, known parties and splits, the declared row counts — before any server starts."""
    for task in p.train_teachers.tasks:
        text_partition(p, task)


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One job per (task, party): the task's local clients in order, then its global party."""
    tt, seed = p.train_teachers, p.run.seed
    device = stage_device(p.run.device)  # one torch thread per task on CPU
    models = dirs[layout.TEXT_MODELS]
    out = []
    for task in tt.tasks:
        fed = text_partition(p, task)
        for party in fed.parties:
            override = f"{task}.{party.name}"  # its key in party_models / party_training
            out.append(Job(f"{task}/{party.name}", train_party, dict(
                task=task, party=party, model=tt.party_models.get(override, tt.model),
                training=tt.party_training.get(override, tt.training), transfer_texts=fed.transfer_texts,
                label_names=fed.label_names,
                vocabulary_texts=(fed.transfer_texts if party.role == "global" and tt.global_vocabulary ==
                                  "own+transfer" else ()),
                out_dir=str(models / task / party.name), seed=seed, device=device,
                predict_batch_size=tt.predict_batch_size), key=("teacher", task, party.name)))
    return out


def train_party(task: str, party: TextParty, model: ModelSpec, training: TrainingConfig,
                transfer_texts: Sequence[str], label_names: Sequence[str], out_dir: str, seed: int, device: str,
                predict_batch_size: int, vocabulary_texts: Sequence[str] = ()) -> tuple[dict[str, Any], list[dict[str, Any]], list[Message]]:
    """Train one party's model on its own data (KNOT §6 teachers: cross-entropy, early stopping on
    validation macro-F1), save it to ``out_dir``, and label the transfer set client-side. The word-piece
    vocabulary is built from the party's train texts and ``vocabulary_texts`` (the global model: the server's
    transfer texts, :attr:`TrainTeachersParams.global_vocabulary`).

    Returns the Table 1 row, the per-epoch history and the client's outgoing messages.
    """
    start = time.perf_counter()
    clf = build_classifier(model, label_names, [*party.train.texts, *vocabulary_texts], seed=seed, device=device)
    result = train_classifier(clf, party.train.texts, party.train.labels, party.val.texts, party.val.labels,
                              training, seed=seed, progress=True, description=f"{task}/{party.name}")
    history = [{"task": task, "party": party.name, **record} for record in result.history]
    clf.save(out_dir)
    test_probs = clf.predict_proba(list(party.test.texts), batch_size=predict_batch_size)
    transfer_probs = clf.predict_proba(list(transfer_texts), batch_size=predict_batch_size, progress=True)
    n_labels = len(label_names)
    # the majority-label baseline: every test text gets the party's most frequent training label
    majority = np.eye(n_labels)[np.full(len(party.test.labels),
                                        np.bincount(party.train.labels, minlength=n_labels).argmax())]
    row = {
        "task": task, "party": party.name, "role": party.role, "source": party.source, "model": model.kind,
        "parameters": int(clf.n_parameters), "n_train": len(party.train.texts), "n_val": len(party.val.texts),
        "n_test": len(party.test.texts), "best_epoch": result.best_epoch, "val_macro_f1": result.best_score,
        "test_score": task_score(task, party.test.labels, test_probs, n_labels), "score": score_name(task),
        "majority_score": task_score(task, party.test.labels, majority, n_labels),
        "test_macro_f1": macro_f1(party.test.labels, test_probs, present_only=True),
        "seconds": time.perf_counter() - start,
    }
    return row, history, client_messages(party.name, transfer_probs, len(party.train.texts))


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Table 1 (``teachers.csv``), the training history and curves, the message files and their ledger
    (``communication.csv``); one nested run per (task, party) with its per-epoch metrics. Each result:
    :func:`train_party`'s (row, history, messages), under ``("teacher", task, party)``."""
    channel = Channel(session="knot")
    rows: list[dict[str, Any]] = []
    histories: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    for task in p.train_teachers.tasks:
        mine = results.of("teacher", task)  # the task's parties, in job order
        task_messages = []
        for row, history, msgs in mine:
            rows.append(row)
            histories.extend(history)
            for m in msgs:
                channel.send(m)
            task_messages.extend(msgs)
            with out.variant(f"{task}/{row['party']}", tags={"task": task, "party": row["party"], "role": row["role"],
                                                             "model": row["model"]}) as child:
                for record in history:
                    child.log_metrics({k: float(record[k]) for k in EPOCH_KEYS if k != "epoch"},
                                      step=int(record["epoch"]))
                child.log_metrics({k: float(row[k]) for k in ("test_score", "test_macro_f1", "val_macro_f1",
                                                              "seconds")})
        save_messages(dirs[layout.TEXT_MESSAGES] / f"{task}.npz", task_messages)
        metrics[task] = {r["party"]: round(r["test_score"], 4) for r, _, _ in mine}
        metrics[task]["above_majority"] = int(sum(r["test_score"] > r["majority_score"] for r, _, _ in mine))
    out.table(pd.DataFrame(rows), "teachers.csv")
    out.table(pd.DataFrame(histories), "history.csv")
    out.table(channel.ledger.cost_table(), "communication.csv")
    out.figure(figs.training_curves(pd.DataFrame(histories)), "training_curves.png")
    return metrics


STAGE = Stage("train_teachers", TrainTeachersParams, OUTPUTS, jobs, report, check, preflight=preflight,
              inputs=inputs, headline=("*.*",))  # table 1: every teacher's test score (macro-F1; NLI accuracy)
