"""Stage ``estimate_bias`` — each teacher's probability bias B_k (KNOT §5.2, app. D.1).

Each client feeds its own teacher random texts drawn from its own tokenizer vocabulary and sends the server
the argmax frequencies B_k as a histogram message — the reference point of the L2-confidence weight E. From the
same pass it also sends, for the ablation, the soft bias: the mean probability row on those texts (not the
papers' definition; a near-uniform teacher has a near-one-hot B_k but a near-uniform soft bias). The frozen
global model's biases are estimated too (it is one more teacher under learning without forgetting). Writes
``reports/bias/`` (the tables ``bias.csv`` and ``bias_soft.csv``, the figure of B_k) and the bias messages of
both kinds ``data/text_bias/<task>.npz``. One job per (task, teacher).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd
from pydantic import Field

from otfed.data.text import TextFederation, load_text_federation
from otfed.data.text.store import FILES
from otfed.device import stage_device
from otfed.distill.bias import probability_biases, random_texts
from otfed.errors import DataError
from otfed.federation.knot import bias_message, save_messages, soft_bias_message
from otfed.federation.messages import Message
from otfed.figures import distill as figs
from otfed.models import TextClassifier
from otfed.models.text import META_FILE
from otfed.models.tokenizer import vocabulary
from otfed.schema import Strict
from stages import layout
from stages.stage import Job, Report, Results, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.BIAS_REPORTS, layout.TEXT_BIAS)


# ------------------------------------------------------------------------------------------ params
class EstimateBiasParams(Strict):
    """Stage ``estimate_bias``: B_k from random texts drawn from each teacher's vocabulary (KNOT app. D.1)."""

    n_texts: int = Field(2000, ge=10, le=10_000_000, description="Random texts per teacher (the papers: 100,000).")
    text_length: int = Field(200, ge=1, le=10_000, description="Vocabulary entries per random text (papers: 200).")
    batch_size: int = Field(256, ge=1)


def check(p: Params) -> None:
    """The text partitions and the teachers' stage are configured (their outputs are this stage's inputs)."""
    if p.partition.text is None:
        raise ValueError("partition.text: required by the text-track stages (train_teachers, estimate_bias, "
                         "distill)")
    if p.train_teachers is None:
        raise ValueError("train_teachers: required by estimate_bias and distill")


def teacher_dirs(p: Params, task: str) -> list[Path]:
    """The checkpoints of ``task``'s teachers (``models/text/<task>/<party>``): its locals, then its global
    model, as ``partition.text`` declares them."""
    spec = p.partition.text.tasks[task]
    return [Path(layout.TEXT_MODELS) / task / party for party in (*spec.locals, spec.global_party)]


def inputs(p: Params) -> list[Path]:
    """The text partition files and every teacher's checkpoint folder, per task (checked to exist first)."""
    return [path for task in p.train_teachers.tasks
            for path in (*(Path(layout.TEXT_PARTITIONS) / task / name for name in FILES), *teacher_dirs(p, task))]


def text_partition(p: Params, task: str) -> TextFederation:
    """The partition of ``task``, checked against its format and the parties ``partition.text`` declares."""
    return load_text_federation(Path(layout.TEXT_PARTITIONS) / task, spec=p.partition.text.tasks[task])


def preflight(p: Params) -> None:
    """Each task's partition reads (:func:`text_partition`) and every teacher's checkpoint loads (the validating
    loader :meth:`~otfed.models.TextClassifier.load`: config, weights of the declared shapes, tokenizer) with
    the task's labels — before any server starts (DataFileError / DataError naming the file otherwise)."""
    for task in p.train_teachers.tasks:
        fed = text_partition(p, task)
        for directory in teacher_dirs(p, task):
            check_labels(TextClassifier.load(directory), directory, fed.label_names)


def check_labels(clf: TextClassifier, directory: Path, labels: tuple[str, ...]) -> None:
    """DataError naming the checkpoint unless the classifier predicts exactly the task's ``labels``, in order."""
    if tuple(clf.labels) != tuple(labels):
        raise DataError(f"{directory / META_FILE}: labels {list(clf.labels)}; the task's partition declares "
                        f"{list(labels)} — rerun `dvc repro train_teachers`")


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One job per (task, teacher): the task's local teachers in order, then its global model; the i-th
    party of a task draws its random texts with seed ``run.seed + i``."""
    eb = p.estimate_bias
    device = stage_device(p.run.device)  # one torch thread per task on CPU
    out = []
    for task in p.train_teachers.tasks:
        fed = text_partition(p, task)
        for i, party in enumerate(fed.parties):
            out.append(Job(f"bias {task}/{party.name}", party_bias, dict(
                task=task, party=party.name, model_dir=str(Path(layout.TEXT_MODELS) / task / party.name),
                n_texts=eb.n_texts, text_length=eb.text_length, batch_size=eb.batch_size, seed=p.run.seed + i,
                device=device), key=("bias", task, party.name)))
    return out


def party_bias(task: str, party: str, model_dir: str, n_texts: int, text_length: int, batch_size: int,
               seed: int, device: str) -> tuple[dict[str, Any], dict[str, Any], list[Message]]:
    """B_k of one teacher (KNOT §5.2, app. D.1): argmax frequencies on ``n_texts`` random texts of
    ``text_length`` entries drawn uniformly from the teacher's own tokenizer vocabulary, on ``device`` (the
    predictions and their counts stay there until the end) — and, from the same pass, the ablation's soft
    bias, the mean probability row. Client side: the client sends only the two histogram messages.
    Returns the ``bias.csv`` row, the ``bias_soft.csv`` row and the messages (hard, then soft)."""
    clf = TextClassifier.load(model_dir, device=device)
    texts = random_texts(vocabulary(clf.tokenizer), n_texts, text_length, rng=seed)
    hard, soft = probability_biases(lambda batch: clf.predict_proba_tensor(batch, batch_size=len(batch)), texts,
                                    batch_size=batch_size, n_labels=len(clf.labels),
                                    description=f"bias {task}/{party}")
    b, s = hard.numpy(), soft.numpy()
    row = {"task": task, "party": party, **{label: float(v) for label, v in zip(clf.labels, b)},
           "max_share": float(b.max()), "majority_label": clf.labels[int(b.argmax())]}
    soft_row = {"task": task, "party": party, **{label: float(v) for label, v in zip(clf.labels, s)},
                "max_share": float(s.max()), "majority_label": clf.labels[int(s.argmax())],
                "l2_to_hard": float(((s - b) ** 2).sum() ** 0.5)}
    return row, soft_row, [bias_message(party, b), soft_bias_message(party, s)]


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """The bias messages of both kinds (``data/text_bias/<task>.npz``), ``bias.csv`` (B_k, the argmax shares),
    ``bias_soft.csv`` (the ablation's mean probability rows, the same layout, and ``l2_to_hard`` = ‖soft − B_k‖₂)
    and the figure of B_k; headline: each teacher's largest label share in B_k. Each result: :func:`party_bias`'s
    (row, soft row, messages), under ``("bias", task, party)``."""
    rows: list[dict[str, Any]] = []
    soft_rows: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    for task in p.train_teachers.tasks:
        mine = results.of("bias", task)  # the task's teachers, in job order
        save_messages(dirs[layout.TEXT_BIAS] / f"{task}.npz", [m for *_, messages in mine for m in messages])
        rows.extend(r for r, _, _ in mine)
        soft_rows.extend(s for _, s, _ in mine)
        metrics[task] = {r["party"]: round(r["max_share"], 4) for r, _, _ in mine}
    table = pd.DataFrame(rows)
    out.table(table, "bias.csv")
    out.table(pd.DataFrame(soft_rows), "bias_soft.csv")
    out.figure(figs.bias_figure(table), "bias.png")
    return metrics


STAGE = Stage("estimate_bias", EstimateBiasParams, OUTPUTS, jobs, report, check, reads=("train_teachers.tasks",),
              preflight=preflight, inputs=inputs, headline=("*.*",))  # every teacher's largest label share in B_k
