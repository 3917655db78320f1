"""Stage ``distill`` — KNOT tables 2–4, fig. 2 and the one-hot ablation of app. C.1.

The server side only: it reads the messages clients sent (transfer-set predictions, dataset sizes,
probability biases), assembles its teacher ensemble from them, and trains a student from its own
pretrained global model with eq. 3 for every {Sinkhorn, Entropy} × {A, D, U, E}, once per seed. The test
sets are read for scoring only — the experimenter's view, as in the papers' tables. One job per (task,
seed, variant), and one per task scoring the undistilled global model (the "before distillation" reference
row). The papers' relative claims are reported as paired differences over the seeds with 95% CIs.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from pydantic import Field, field_validator

from otfed import io
from otfed.data.text import TextFederation, load_text_federation
from otfed.data.text.store import FILES
from otfed.device import stage_device
from otfed.distill.ensemble import TeacherEnsemble
from otfed.distill.evaluation import (ALL, EvaluationSet, claim_pairs, evaluate, evaluation_sets, paired_claims,
                                      seed_summary)
from otfed.distill.student import distill_student, ensemble_weights
from otfed.errors import DataError
from otfed.federation.knot import BIAS, DATASET_SIZE, PREDICTIONS, load_messages, server_ensemble
from otfed.federation.messages import CountMessage, HistogramMessage, Message, PredictionMessage
from otfed.figures import distill as figs
from otfed.label_space import LabelSpace
from otfed.models import TextClassifier
from otfed.models.text import META_FILE
from otfed.schema import Strict
from stages import layout
from stages.stage import Job, Report, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.DISTILL_REPORTS,)

LOSS_NAMES = {"sinkhorn": "Sinkhorn", "kl": "Entropy"}
GLOBAL = "global (no distillation)"  # the reference row: the pretrained global model itself
Weighting = Literal["A", "D", "U", "E"]


# ------------------------------------------------------------------------------------------ params
class DistillParams(Strict):
    """Stage ``distill``: the eq. 3 student for {Sinkhorn, Entropy} × {A, D, U, E} (+ one-hot ablation)."""

    losses: list[Literal["sinkhorn", "kl"]] = Field(["sinkhorn", "kl"], min_length=1)
    weightings: list[Weighting] = Field(["A", "D", "U", "E"], min_length=1)
    eps: float = Field(0.01, gt=0.0, le=100.0, description="Entropic regularisation ε of T_ε (cost units).")
    sinkhorn_iterations: int = Field(300, ge=1, le=100000)
    sinkhorn_solver: Literal["newton", "fixed"] = Field(
        "newton", description="The T_ε solver (otfed.ot.entropic_histograms): newton (adaptive; the faster on a "
                              "CPU) or fixed (a fixed program with no host sync, built for GPUs; not yet timed on one).")
    one_hot_ablation: bool = Field(True, description="Also Sinkhorn-E with one-hot label coordinates (app. C.1).")
    learning_without_forgetting: bool = Field(True, description="The frozen global model is one more teacher.")
    seeds: int = Field(5, ge=1, le=100, description="Students per variant, seeds run.seed … run.seed+seeds−1; the "
                                                    "variants of one seed share batches and dropout masks (paired).")
    epochs: int = Field(3, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)
    lr: float = Field(2e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    eval_batch_size: int = Field(128, ge=1)

    @field_validator("losses", "weightings")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"entries must be distinct (got {v})")
        return v

    @property
    def needs_bias(self) -> bool:
        """Weighting E (and the one-hot ablation, a Sinkhorn-E student) needs the teachers' biases B_k."""
        return "E" in self.weightings or self.one_hot_ablation

    @property
    def settings(self) -> dict[str, Any]:
        """What every student's training and scoring reads (logged as each variant run's params)."""
        return self.model_dump(include={"epochs", "batch_size", "lr", "weight_decay", "eps", "sinkhorn_iterations",
                                        "sinkhorn_solver", "eval_batch_size"})


def check(p: Params) -> None:
    """The text partitions and the teachers' stage are configured; ``estimate_bias`` too when a student
    needs the teachers' biases."""
    if p.partition.text is None:
        raise ValueError("partition.text: required by the text-track stages (train_teachers, estimate_bias, "
                         "distill)")
    if p.train_teachers is None:
        raise ValueError("train_teachers: required by estimate_bias and distill")
    if p.distill.needs_bias and p.estimate_bias is None:
        raise ValueError("estimate_bias: required by distill.weightings 'E' / one_hot_ablation")


def variants(d: DistillParams) -> list[tuple[str, str, str, bool]]:
    """(variant name, loss, weighting, one-hot?) for every student the params ask for."""
    out = [(f"{LOSS_NAMES[loss]}-{w}", loss, w, False) for loss in d.losses for w in d.weightings]
    if d.one_hot_ablation:
        out.append(("Sinkhorn-E-onehot", "sinkhorn", "E", True))
    return out


# ------------------------------------------------------------------------------------------ inputs
def message_files(p: Params, task: str) -> list[Path]:
    """The message files the server reads for ``task``: the teachers' (``data/text_messages/<task>.npz``) and,
    when a student needs B_k, the biases (``data/text_bias/<task>.npz``)."""
    return [Path(layout.TEXT_MESSAGES) / f"{task}.npz",
            *([Path(layout.TEXT_BIAS) / f"{task}.npz"] if p.distill.needs_bias else [])]


def global_dir(p: Params, task: str) -> Path:
    """The server's own pretrained global model of ``task`` (``models/text/<task>/<global party>``)."""
    return Path(layout.TEXT_MODELS) / task / p.partition.text.tasks[task].global_party


def inputs(p: Params) -> list[Path]:
    """Per task: the partition files, the message files and the global model's checkpoint folder."""
    return [path for task in p.train_teachers.tasks
            for path in (*(Path(layout.TEXT_PARTITIONS) / task / name for name in FILES), *message_files(p, task),
                         global_dir(p, task))]


def check_messages(path: Path, messages: Sequence[Message], senders: Sequence[str],
                   expected: Mapping[str, tuple[type[Message], tuple[int, ...]]]) -> None:
    """DataError naming the message file ``path``, the sender and the message unless every sender in
    ``senders`` sent exactly one message of each kind in ``expected`` (kind → its type and payload shape:
    predictions N transfer texts × C labels, a histogram of C labels, a count) and every count is ≥ 1. The
    payloads' values (finite probabilities summing to 1) are checked by the messages themselves on load."""
    for sender in senders:
        for kind, (cls, shape) in expected.items():
            mine = [m for m in messages if m.sender == sender and m.kind == kind]
            if len(mine) != 1:
                sent = sorted({m.kind for m in messages if m.sender == sender})
                raise DataError(f"{path}: {len(mine)} {kind!r} messages from {sender!r} (it sent {sent or 'none'}); "
                                f"the server needs one from each of {', '.join(senders)}")
            m = mine[0]
            if not isinstance(m, cls) or m.shape != shape:
                raise DataError(f"{path}: {kind} of {sender!r}: {type(m).__name__} of shape {m.shape}; expected "
                                f"{cls.__name__} of shape {shape}")
            if isinstance(m, CountMessage) and m.value < 1:
                raise DataError(f"{path}: {kind} of {sender!r}: {m.value}; a teacher's dataset holds ≥ 1 text")


def server_inputs(p: Params, task: str) -> tuple[TextFederation, list[Message]]:
    """The partition of ``task`` (checked against its format and ``partition.text``) and the messages the
    server received (:func:`check_messages`): from every teacher of the ensemble — the locals, and the
    global model under learning without forgetting — predictions of shape (transfer texts × labels), a
    dataset size and, when a student needs B_k, a bias over the labels."""
    fed = load_text_federation(Path(layout.TEXT_PARTITIONS) / task, spec=p.partition.text.tasks[task])
    n, c = len(fed.transfer_texts), len(fed.label_names)
    teachers = [q.name for q in (fed.parties if p.distill.learning_without_forgetting else fed.locals)]
    files = message_files(p, task)
    expected = [{PREDICTIONS: (PredictionMessage, (n, c)), DATASET_SIZE: (CountMessage, (1,))},
                {BIAS: (HistogramMessage, (c,))}]
    messages: list[Message] = []
    for path, kinds in zip(files, expected):
        received = load_messages(path)
        check_messages(path, received, teachers, kinds)
        messages += received
    return fed, messages


def preflight(p: Params) -> None:
    """Every task's partition and message files read and agree (:func:`server_inputs`), and the global model's
    checkpoint loads (:meth:`~otfed.models.TextClassifier.load`) with the task's labels — before any server
    starts (DataFileError / DataError naming the file otherwise)."""
    for task in p.train_teachers.tasks:
        fed, _ = server_inputs(p, task)
        directory = global_dir(p, task)
        clf = TextClassifier.load(directory)
        if tuple(clf.labels) != tuple(fed.label_names):
            raise DataError(f"{directory / META_FILE}: labels {list(clf.labels)}; the task's partition declares "
                            f"{list(fed.label_names)} — rerun `dvc repro train_teachers`")


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """Per task: the global model's reference scores, then one student per variant. The server's inputs
    are the messages (``data/text_messages``, and ``data/text_bias`` when a student needs B_k), its own
    global model and the transfer texts; the test sets for scoring only."""
    d = p.distill
    device = stage_device(p.run.device)  # one torch thread per task on CPU
    out = []
    for task in p.train_teachers.tasks:
        fed, messages = server_inputs(p, task)
        ensemble = server_ensemble(messages, [q.name for q in fed.locals],
                                   fed.global_party.name if d.learning_without_forgetting else None)
        semantic = LabelSpace.for_task(task)
        model_dir = str(Path(layout.TEXT_MODELS) / task / fed.global_party.name)
        sets = evaluation_sets(fed)  # scoring only; the server never gets the clients' training splits
        out.append(Job(f"{task}/global", global_reference, dict(
            task=task, global_model_dir=model_dir, sets=sets, batch_size=d.eval_batch_size, device=device)))
        for seed in seeds(p):
            for name, loss, weighting, one_hot in variants(d):
                out.append(Job(f"{task}/{name} seed {seed}", distill_variant, dict(
                    task=task, variant=name, loss=loss, weighting=weighting,
                    label_space=LabelSpace.one_hot(semantic) if one_hot else semantic, global_model_dir=model_dir,
                    transfer_texts=fed.transfer_texts, ensemble=ensemble, sets=sets, settings=d.settings,
                    seed=seed, device=device)))
    return out


def seeds(p: Params) -> list[int]:
    """The students' seeds: run.seed, run.seed + 1, … (``distill.seeds`` of them)."""
    return [p.run.seed + i for i in range(p.distill.seeds)]


def global_reference(task: str, global_model_dir: str, sets: Sequence[EvaluationSet], batch_size: int,
                     device: str) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The pretrained global model itself scored on every test set: the "before distillation" rows of
    tables 2–4. Returns table rows, the test-set probabilities and the test-set labels (saved beside every
    variant's predictions)."""
    rows, probs = evaluate(TextClassifier.load(global_model_dir, device=device), task, sets,
                           LabelSpace.for_task(task), batch_size)
    for r in rows:
        r.update(task=task, variant=GLOBAL, loss="", weighting="", seconds=0.0)
    return rows, probs, {name: labels for name, _, labels in sets}


def distill_variant(task: str, variant: str, loss: str, weighting: str, label_space: LabelSpace,
                    global_model_dir: str, transfer_texts: Sequence[str], ensemble: TeacherEnsemble,
                    sets: Sequence[EvaluationSet], settings: dict[str, Any], seed: int, device: str,
                    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[dict[str, Any]]]:
    """One student of tables 2–4: start from the pretrained global model, minimise eq. 3 with ``loss``
    (sinkhorn | kl) and teacher weights ``weighting`` over the ensemble, then score every test set.
    Server side: it sees the global model, the transfer texts, the ensemble built from client messages and
    — for scoring only — the test sets ``sets``; never a client's training data or teacher weights.

    ``settings`` holds epochs, batch_size, lr, weight_decay, eps, sinkhorn_iterations, sinkhorn_solver,
    eval_batch_size.
    Returns table rows, the test-set probabilities and the per-epoch history.
    """
    start = time.perf_counter()
    student = TextClassifier.load(global_model_dir, device=device)
    weights = ensemble_weights(ensemble, weighting)
    records = distill_student(student, transfer_texts, ensemble, weights, kind=loss,
                              cost=label_space.cost_matrix(dtype=torch.float64) if loss == "sinkhorn" else None,
                              eps=settings["eps"] if loss == "sinkhorn" else None,
                              sinkhorn_iterations=settings["sinkhorn_iterations"],
                              sinkhorn_solver=settings["sinkhorn_solver"], epochs=settings["epochs"],
                              batch_size=settings["batch_size"], lr=settings["lr"],
                              weight_decay=settings["weight_decay"], seed=seed, description=f"{task}/{variant}")
    history = [{"task": task, "variant": variant, "seed": seed, **record} for record in records]
    # scores always use the task's semantic coordinates (the ablation changes the training cost only)
    rows, probs = evaluate(student, task, sets, LabelSpace.for_task(task), settings["eval_batch_size"])
    seconds = time.perf_counter() - start
    for r in rows:
        r.update(task=task, variant=variant, loss=loss, weighting=weighting, seed=seed, seconds=seconds)
    return rows, probs, history


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: list[Any], out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Per task: ``table_<task>.csv`` (tables 2–4: mean ± 95% CI over the seeds), the first seed's saved
    predictions and fig. 2's expected-label boxes; ``results.csv`` (every student and seed), ``summary.csv``,
    ``claims.csv`` (the papers' claims as paired differences over seeds, :func:`paired_claims`), ``history.csv``,
    the Sinkhorn-vs-Entropy figure and the claims figure; one nested run per (task, variant) with the means,
    the CIs and each seed's scores (step = seed)."""
    d = p.distill
    names = [name for name, *_ in variants(d)]
    per_task = 1 + len(names) * d.seeds
    rows: list[dict[str, Any]] = []
    histories: list[dict[str, Any]] = []
    for i, task in enumerate(p.train_teachers.tasks):
        (base_rows, base_probs, labels), *students = results[i * per_task:(i + 1) * per_task]
        rows.extend(dict(r, seed=p.run.seed) for r in base_rows)
        for variant_rows, _, history in students:
            rows.extend(variant_rows)
            histories.extend(history)
        # the first seed's students (jobs run seed by seed): fig. 2 and the saved predictions
        probabilities = {GLOBAL: base_probs, **{name: probs for name, (_, probs, _) in zip(names, students)}}
        io.write_npz(out.out / f"predictions_{task}.npz",
                     **{f"{v}|{s}": pr for v, by_set in probabilities.items() for s, pr in by_set.items()},
                     **{f"labels|{s}": y for s, y in labels.items()})
        out.figure(figs.expected_label_boxplots(probabilities, labels[ALL], LabelSpace.for_task(task),
                                                ["Sinkhorn-E", "Entropy-E"]), f"expected_label_{task}.png")
    frame = pd.DataFrame(rows)
    summary = seed_summary(frame)
    claims = paired_claims(frame[frame.variant != GLOBAL], claim_pairs(d.losses, d.weightings, LOSS_NAMES))
    for task in p.train_teachers.tasks:
        out.table(figs.results_table(summary[summary.task == task]), f"table_{task}.csv")
    for (task, name, loss, weighting, one_hot) in [(t, *v) for t in p.train_teachers.tasks for v in variants(d)]:
        tags = {"task": task, "loss": loss, "weighting": weighting,
                "label_coordinates": "one-hot" if one_hot else "semantic"}
        with out.variant(f"{task}/{name}", tags=tags) as child:
            child.log_params({"task": task, "loss": loss, "weighting": weighting, "one_hot": one_hot,
                              "seeds": d.seeds, **d.settings})
            for r in summary[(summary.task == task) & (summary.variant == name)].itertuples():
                child.log_metrics({f"{r.test_set}.score": r.score, f"{r.test_set}.score_ci95": r.score_ci95,
                                   f"{r.test_set}.semantic_distance": r.semantic_distance,
                                   f"{r.test_set}.semantic_distance_ci95": r.semantic_distance_ci95})
            for r in frame[(frame.task == task) & (frame.variant == name) & (frame.test_set == ALL)].itertuples():
                child.log_metrics({"seed_score": r.score, "seed_semantic_distance": r.semantic_distance,
                                   "seconds": r.seconds}, step=int(r.seed))
    out.table(frame, "results.csv")
    out.table(summary, "summary.csv")
    out.table(claims, "claims.csv")
    out.table(pd.DataFrame(histories), "history.csv")
    out.figure(figs.sinkhorn_vs_entropy(summary), "sinkhorn_vs_entropy.png")
    out.figure(figs.claims_figure(claims[claims.test_set == ALL]), "claims.png")
    return distill_metrics(summary, claims, p.train_teachers.tasks)


def distill_metrics(summary: pd.DataFrame, claims: pd.DataFrame, tasks: Sequence[str]) -> dict[str, Any]:
    """Per task, on ALL: every variant's mean score and Semantic Distance with their CI half-widths, each
    claim's verdict per metric, and how many (claim, metric) comparisons replicate / reverse."""
    metrics: dict[str, Any] = {}
    for task in tasks:
        rows = summary[(summary.task == task) & (summary.test_set == ALL)]
        metrics[task] = {r["variant"]: {key: r[key] for key in ("score", "score_ci95", "semantic_distance",
                                                                 "semantic_distance_ci95")}
                         for r in rows.to_dict("records")}
        mine = claims[(claims.task == task) & (claims.test_set == ALL)]
        metrics[task]["claims"] = {f"{r.claim} ({r.metric})": r.verdict for r in mine.itertuples()}
        metrics[task]["claims_replicated"] = int((mine.verdict == "replicates").sum())
        metrics[task]["claims_reversed"] = int((mine.verdict == "reversed").sum())
    return metrics


STAGE = Stage("distill", DistillParams, OUTPUTS, jobs, report, check, reads=("train_teachers.tasks",),
              needs=("estimate_bias",), preflight=preflight, inputs=inputs,
              headline=("*.Sinkhorn-E.score", "*.Sinkhorn-E.semantic_distance", "*.Entropy-E.score",
                        "*.Entropy-E.semantic_distance", "*.global (no distillation).score",
                        "*.claims_replicated"))  # tables 2-4 and the claims, on ALL

if __name__ == "__main__":  # DVC: python -m stages.distill
    from flows.stage import main
    raise SystemExit(main(STAGE))
