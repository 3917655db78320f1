"""Stage ``distill`` — KNOT tables 2–4, fig. 2 and the one-hot ablation of app. C.1, with a gate and diagnostics
that say when a comparison can mean something.

The server side only: it reads the messages clients sent (transfer-set predictions, dataset sizes,
probability biases), assembles its teacher ensemble from them, and trains a student from its own
pretrained global model with eq. 3 for every {Sinkhorn, Entropy} × {A, D, U, E}, once per seed — the
*replication* arm — beside two arms that separate the mechanisms: Sinkhorn against the teachers' weighted
mixture (one OT term, :func:`otfed.distill.losses.mixture_sinkhorn_loss`) and weighting E with the soft
probability bias (mean softmax on random texts) instead of the papers' argmax frequency.

**Gate.** Before any student is trained, each teacher's transfer predictions are scored on the labelled audit
slice of the transfer pool (labels for diagnostics only: never for training or any choice): a teacher passes
when its expected label correlates with the truth (Spearman ≥ ``gate_threshold``); the task is testable when at
least one local teacher passes and the global model beats the best constant prediction's Semantic Distance
there. A task that is not is reported as "cannot test here" and gets no students and no claims (``gate: false``
trains them anyway, the verdict beside every claim).

**Convergence at equal effort.** The transfer texts outside the audit slice are split once into a training part
and a held-out part (``holdout_fraction``); every student trains until its own loss on the held-out part has not
improved for ``patience`` epochs (at most ``epochs``) and keeps the epoch with the lowest held-out loss; its
learning rate is chosen from ``lr_grid`` by that same held-out loss on the first seed and reused for the others.
No label is looked at.

The test sets are read for scoring only — the experimenter's view, as in the papers' tables — with diagnostics
beside every score (:func:`otfed.distill.diagnostics.diagnostics`): the best constant's Semantic Distance, the SD
skill, the expected label's mean and spread across true labels, its Spearman with the truth. The papers' relative
claims are paired differences over the seeds with 95% CIs, marked "uninformative" when a student involved does
not beat its best constant. Per task one job holding its gate (``("gate", task)``: computed from the server's
inputs when the jobs are built, since it decides whether the task gets students), one scoring the undistilled
global model (``("global", task)``) and, when the gate lets it, one per variant training its students seed by seed
(``("student", task, variant)``); the report reads them by these keys.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
import torch
from pydantic import Field, field_validator

from otfed import io
from otfed.data.text import TextFederation, load_text_federation
from otfed.data.text.store import FILES
from otfed.device import stage_device
from otfed.distill.ensemble import TeacherEnsemble
from otfed.distill.diagnostics import best_constant, teacher_gate
from otfed.distill.evaluation import (ALL, EvaluationSet, adjusted_verdicts, claim_pairs, evaluate, evaluation_sets,
                                      mark_uninformative, paired_claims, seed_summary)
from otfed.distill.student import MIXTURE, Holdout, distill_student, ensemble_weights
from otfed.errors import DataError
from otfed.federation.knot import BIAS, DATASET_SIZE, PREDICTIONS, SOFT_BIAS, load_messages, server_ensemble
from otfed.federation.messages import CountMessage, HistogramMessage, Message, PredictionMessage
from otfed.figures import distill as figs
from otfed.label_space import LabelSpace
from otfed.models import TextClassifier
from otfed.models.text import META_FILE
from otfed.schema import Strict
from stages import layout
from stages.stage import Job, Report, Results, Stage

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.DISTILL_REPORTS,)

LOSS_NAMES = {"sinkhorn": "Sinkhorn", "kl": "Entropy"}
GLOBAL = "global (no distillation)"  # the reference row: the pretrained global model itself
Weighting = Literal["A", "D", "U", "E"]
CANNOT_TEST = "cannot test here"


class Variant(NamedTuple):
    """One student recipe: its table name, arm (replication | one_hot | mixture | soft_bias), loss kind of
    :func:`~otfed.distill.student.distill_student`, weighting, one-hot label coordinates?, bias kind for E."""

    name: str
    arm: str
    loss: str
    weighting: str
    one_hot: bool = False
    bias: str = BIAS


# ------------------------------------------------------------------------------------------ params
class DistillParams(Strict):
    """Stage ``distill``: the eq. 3 student for {Sinkhorn, Entropy} × {A, D, U, E}, the mechanism arms (mixture,
    soft bias, one-hot), the gate on the audit slice and training to convergence on a held-out transfer split."""

    losses: list[Literal["sinkhorn", "kl"]] = Field(["sinkhorn", "kl"], min_length=1)
    weightings: list[Weighting] = Field(["A", "D", "U", "E"], min_length=1)
    eps: float = Field(0.01, gt=0.0, le=100.0, description="Entropic regularisation ε of T_ε (cost units).")
    sinkhorn_iterations: int = Field(300, ge=1, le=100000)
    sinkhorn_solver: Literal["newton", "fixed"] = Field(
        "newton", description="The T_ε solver (otfed.ot.entropic_histograms): newton (adaptive; the faster on a "
                              "CPU) or fixed (a fixed program with no host sync, built for GPUs; not yet timed on one).")
    one_hot_ablation: bool = Field(True, description="Also Sinkhorn-E with one-hot label coordinates (app. C.1).")
    mixture_weightings: list[Weighting] = Field(
        ["A", "E"], description="Arm 'mixture': Sinkhorn against the teachers' weighted mixture (one OT term) for "
                                "these weightings; [] leaves the arm out.")
    soft_bias: bool = Field(True, description="Arm 'soft_bias': Sinkhorn-E and Entropy-E with the soft probability "
                                              "bias (mean softmax on random texts) instead of the argmax frequency.")
    learning_without_forgetting: bool = Field(True, description="The frozen global model is one more teacher.")
    seeds: int = Field(5, ge=1, le=100, description="Students per variant, seeds run.seed … run.seed+seeds−1; the "
                                                    "variants of one seed share batches and dropout masks (paired).")
    epochs: int = Field(40, ge=1, le=1000, description="Most epochs a student trains (it stops earlier by patience).")
    patience: int | None = Field(3, ge=1, le=1000, description="Epochs without a lower held-out loss before a "
                                                               "student stops; null: every epoch.")
    holdout_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of the (non-audit) transfer texts held "
                                                                     "out for the stopping rule and the lr choice.")
    lr_grid: list[float] = Field([0.01, 0.03], min_length=1, description="Learning rates tried on the first seed; "
                                                                         "the lowest held-out loss wins.")
    gate_threshold: float = Field(0.3, gt=-1.0, le=1.0, description="A teacher passes the gate when the Spearman "
                                  "correlation of its expected label with the truth on the audit slice is ≥ this.")
    gate: bool = Field(True, description="false: train students and compute the claims even for a task that fails "
                                         "the gate (the verdict is still reported, in gate.csv and every claim row).")
    batch_size: int = Field(32, ge=1, le=4096)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    eval_batch_size: int = Field(128, ge=1)

    @field_validator("losses", "weightings", "mixture_weightings")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"entries must be distinct (got {v})")
        return v

    @field_validator("lr_grid")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < lr <= 1.0 for lr in v) or len(set(v)) != len(v):
            raise ValueError(f"learning rates must be distinct and in (0, 1] (got {v})")
        return v

    @property
    def needs_bias(self) -> bool:
        """Weighting E (and the one-hot, mixture-E and soft-bias arms) needs the teachers' biases B_k."""
        return any(v.weighting == "E" for v in variants(self))

    @property
    def needs_soft_bias(self) -> bool:
        return any(v.bias == SOFT_BIAS for v in variants(self))

    @property
    def settings(self) -> dict[str, Any]:
        """What every student's training and scoring reads (logged as each variant run's params)."""
        return self.model_dump(include={"epochs", "patience", "lr_grid", "batch_size", "weight_decay", "eps",
                                        "sinkhorn_iterations", "sinkhorn_solver", "eval_batch_size"})


def check(p: Params) -> None:
    """The text partitions and the teachers' stage are configured; ``estimate_bias`` too when a student
    needs the teachers' biases."""
    if p.partition.text is None:
        raise ValueError("partition.text: required by the text-track stages (train_teachers, estimate_bias, "
                         "distill)")
    if p.train_teachers is None:
        raise ValueError("train_teachers: required by estimate_bias and distill")
    if p.distill.needs_bias and p.estimate_bias is None:
        raise ValueError("estimate_bias: required by distill.weightings 'E' / one_hot_ablation / soft_bias / "
                         "mixture_weightings 'E'")
    for task in p.train_teachers.tasks:
        spec = p.partition.text.tasks.get(task)  # a task without a spec: train_teachers' check names it
        if spec is not None and spec.audit < 2:
            raise ValueError(f"partition.text.tasks.{task}.audit: the gate needs a labelled audit slice of ≥ 2 "
                             f"transfer texts (got {spec.audit})")


def variants(d: DistillParams) -> list[Variant]:
    """Every student recipe the params ask for: the replication arm (each loss × weighting), then the one-hot,
    mixture and soft-bias arms."""
    out = [Variant(f"{LOSS_NAMES[loss]}-{w}", "replication", loss, w) for loss in d.losses for w in d.weightings]
    if d.one_hot_ablation:
        out.append(Variant("Sinkhorn-E-onehot", "one_hot", "sinkhorn", "E", one_hot=True))
    out += [Variant(f"Sinkhorn-mixture-{w}", "mixture", MIXTURE, w) for w in d.mixture_weightings]
    if d.soft_bias:
        out += [Variant(f"{LOSS_NAMES[loss]}-E-soft", "soft_bias", loss, "E", bias=SOFT_BIAS) for loss in d.losses]
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
    teachers = [q.name for q in fed.parties]  # the global model's predictions too: the gate scores them
    files = message_files(p, task)
    expected = [{PREDICTIONS: (PredictionMessage, (n, c)), DATASET_SIZE: (CountMessage, (1,))},
                {BIAS: (HistogramMessage, (c,)),
                 **({SOFT_BIAS: (HistogramMessage, (c,))} if p.distill.needs_soft_bias else {})}]
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


# -------------------------------------------------------------------------------------------- gate
class Gate(NamedTuple):
    """A task's gate (:func:`audit_gate`): every teacher on the audit slice (the rows of ``gate.csv``), the task's
    verdict ("testable" or :data:`CANNOT_TEST`) and the reason (empty when testable)."""

    table: pd.DataFrame
    verdict: str
    reason: str


def audit_gate(task: str, fed: TextFederation, ensemble: TeacherEnsemble, threshold: float) -> Gate:
    """The gate on the audit slice (module docstring): per teacher — the locals and the global model, from their
    transfer-set predictions at the audit rows — the Spearman correlation of its expected label with the truth
    and its Semantic Distance against the best constant's (:func:`otfed.distill.diagnostics.teacher_gate`);
    then the task's verdict, "testable" or :data:`CANNOT_TEST`, and the reason. The audit labels are read here
    and nowhere in training."""
    space = LabelSpace.for_task(task)
    probs = {name: ensemble.probabilities[fed.audit_index, k] for k, name in enumerate(ensemble.names)}
    table = teacher_gate(probs, fed.audit_labels, space, threshold)
    glob = fed.global_party.name
    table.insert(0, "task", task)
    table.insert(2, "role", ["global" if t == glob else "local" for t in table.teacher])
    local_pass = table[(table.role == "local") & table.passes]
    global_row = table[table.role == "global"].iloc[0]
    reasons = []
    if local_pass.empty:
        reasons.append(f"no local teacher's expected label correlates with the truth on the audit slice "
                       f"(Spearman ≥ {threshold}: best {table[table.role == 'local'].informativeness.max():.2f})")
    if not global_row.sd_skill > 0:
        reasons.append(f"the global model does not beat the best constant (Semantic Distance "
                       f"{global_row.semantic_distance:.3f} vs {global_row.sd_constant:.3f})")
    return Gate(table, "testable" if not reasons else CANNOT_TEST, "; ".join(reasons))


def task_gate(gate: Gate) -> Gate:
    """The job ``("gate", task)``: the task's gate, as :func:`jobs` computed it from the server's inputs (it decides
    whether the task gets students) — a job of its own so that the report reads it from the results, like every
    other result, and never reads the inputs again."""
    return gate


def transfer_split(n: int, audit_index: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of the transfer set: the rows outside the audit slice, ``fraction`` of them
    drawn uniformly (seeded) for the held-out part; both sorted."""
    rest = np.setdiff1d(np.arange(n), audit_index)
    if rest.size < 2:
        raise DataError(f"{rest.size} transfer text(s) outside the audit slice: too few to train and hold out")
    order = np.random.default_rng([seed, 22]).permutation(rest)
    k = min(max(1, int(round(fraction * rest.size))), rest.size - 1)
    return np.sort(order[k:]), np.sort(order[:k])


def rows_of(ensemble: TeacherEnsemble, index: np.ndarray) -> TeacherEnsemble:
    """The ensemble's predictions at the transfer rows ``index`` (sizes and biases unchanged)."""
    return TeacherEnsemble(ensemble.names, ensemble.probabilities[index], ensemble.dataset_sizes, ensemble.biases)


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """Per task: its gate (:func:`audit_gate`, ``("gate", task)``), the global model's reference scores
    (``("global", task)``), then — when the gate passes, or ``gate: false`` — one job per variant training its
    students seed by seed (``("student", task, variant name)``). The server's inputs are the messages
    (``data/text_messages``, and ``data/text_bias`` when a student needs B_k), its own global model and the
    transfer texts; the audit labels and the test sets for the gate and scoring only."""
    d = p.distill
    device = stage_device(p.run.device)  # one torch thread per task on CPU
    out = []
    for task in p.train_teachers.tasks:
        fed, messages, ensembles = task_inputs(p, task)
        semantic = LabelSpace.for_task(task)
        model_dir = str(global_dir(p, task))
        sets = evaluation_sets(fed)  # scoring only; the server never gets the clients' training splits
        gate = audit_gate(task, fed, ensembles["gate"], d.gate_threshold)
        out.append(Job(f"{task}/gate", task_gate, dict(gate=gate), key=("gate", task)))
        out.append(Job(f"{task}/global", global_reference, dict(
            task=task, global_model_dir=model_dir, sets=sets, batch_size=d.eval_batch_size, device=device),
            key=("global", task)))
        if d.gate and gate.verdict != "testable":
            continue
        split = transfer_split(len(fed.transfer_texts), fed.audit_index, d.holdout_fraction, p.run.seed)
        for v in variants(d):
            out.append(Job(f"{task}/{v.name}", distill_variant, dict(
                task=task, variant=v, label_space=LabelSpace.one_hot(semantic) if v.one_hot else semantic,
                global_model_dir=model_dir, transfer_texts=fed.transfer_texts, ensemble=ensembles[v.bias],
                split=split, sets=sets, settings=d.settings, seeds=seeds(p), device=device),
                key=("student", task, v.name)))
    return out


def task_inputs(p: Params, task: str) -> tuple[TextFederation, list[Message], dict[str, TeacherEnsemble]]:
    """The partition, the messages and the server's ensembles of ``task``: by bias kind (the argmax bias
    ``BIAS``, the soft one ``SOFT_BIAS`` when an arm needs it; the local teachers, then the global model under
    learning without forgetting) and ``"gate"`` (every party, the global model last: what the gate scores)."""
    d = p.distill
    fed, messages = server_inputs(p, task)
    locals_ = [q.name for q in fed.locals]
    glob = fed.global_party.name if d.learning_without_forgetting else None
    kinds = [BIAS] * d.needs_bias + [SOFT_BIAS] * d.needs_soft_bias or [BIAS]  # no bias needed: none is read
    ensembles = {kind: server_ensemble(messages, locals_, glob, bias_kind=kind) for kind in kinds}
    ensembles["gate"] = server_ensemble([m for m in messages if m.kind in (PREDICTIONS, DATASET_SIZE)], locals_,
                                        fed.global_party.name)
    return fed, messages, ensembles


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
        r.update(task=task, variant=GLOBAL, arm="", loss="", weighting="", seconds=0.0)
    return rows, probs, {name: labels for name, _, labels in sets}


def distill_variant(task: str, variant: Variant, label_space: LabelSpace, global_model_dir: str,
                    transfer_texts: Sequence[str], ensemble: TeacherEnsemble,
                    split: tuple[np.ndarray, np.ndarray], sets: Sequence[EvaluationSet], settings: dict[str, Any],
                    seeds: Sequence[int], device: str,
                    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[dict[str, Any]]]:
    """The students of one variant, seed by seed: each starts from the pretrained global model and minimises
    eq. 3 (or the arm's loss) with the variant's teacher weights (:func:`ensemble_weights`, from the messages) over
    the training rows of the transfer set ``split = (training rows, held-out rows)``, until its loss on the
    held-out rows stops improving (:func:`~otfed.distill.student.distill_student` with ``holdout``); on the first
    seed every learning rate of
    ``settings["lr_grid"]`` is tried and the lowest held-out loss picks the one the other seeds use. Each kept
    student is scored on every test set. Server side: it sees the global model, the transfer texts, the ensemble
    built from client messages and — for scoring only — the test sets ``sets``; never a client's training data
    or teacher weights.

    Returns table rows (every seed), the first seed's test-set probabilities and the per-epoch history.
    """
    space = LabelSpace.for_task(task)  # scores always use the task's semantic coordinates
    train, held = split
    texts = np.asarray(transfer_texts, dtype=object)
    all_weights = ensemble_weights(ensemble, variant.weighting)
    weights = all_weights[train]
    holdout = Holdout(tuple(texts[held]), ensemble.probabilities[held], all_weights[held])
    ensemble, transfer_texts = rows_of(ensemble, train), tuple(texts[train])
    rows: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    first_probs: dict[str, np.ndarray] = {}
    chosen = None
    for i, seed in enumerate(seeds):
        start = time.perf_counter()
        best = None
        for lr in (settings["lr_grid"] if chosen is None else [chosen]):
            student = TextClassifier.load(global_model_dir, device=device)
            records = distill_student(
                student, transfer_texts, ensemble, weights, kind=variant.loss,
                cost=label_space.cost_matrix(dtype=torch.float64) if variant.loss != "kl" else None,
                eps=settings["eps"] if variant.loss != "kl" else None,
                sinkhorn_iterations=settings["sinkhorn_iterations"], sinkhorn_solver=settings["sinkhorn_solver"],
                epochs=settings["epochs"], batch_size=settings["batch_size"], lr=lr,
                weight_decay=settings["weight_decay"], seed=seed, holdout=holdout, patience=settings["patience"],
                description=f"{task}/{variant.name} seed {seed} lr {lr:g}", progress=False)
            loss = min(r["holdout_loss"] for r in records)
            history += [{"task": task, "variant": variant.name, "seed": seed, "lr": lr, **r} for r in records]
            if best is None or loss < best[0]:
                best = (loss, lr, student, next(r["epoch"] for r in records if r["best"]))
        _, chosen, student, epoch = best
        for r in history:
            if r["seed"] == seed:
                r["chosen"] = r["lr"] == chosen
        set_rows, probs = evaluate(student, task, sets, space, settings["eval_batch_size"])
        seconds = time.perf_counter() - start
        for r in set_rows:
            r.update(task=task, variant=variant.name, arm=variant.arm, loss=variant.loss, weighting=variant.weighting,
                     seed=seed, lr=chosen, epochs=epoch, holdout_loss=best[0], seconds=seconds)
        rows += set_rows
        if i == 0:
            first_probs = probs
    return rows, first_probs, history


# ------------------------------------------------------------------------------------------ report
def claims(d: DistillParams) -> list[tuple[str, str, str, str]]:
    """(arm, claim, first, second) of every comparison: the papers' claims (replication arm, :func:`claim_pairs`:
    "first beats second" is the papers' side), then the mechanism arms — one-hot vs semantic coordinates (app.
    C.1's claim), Sinkhorn against the mixture vs Entropy and vs eq. 3's Sinkhorn, soft-bias E vs A and vs E —
    and the "distillation" arm: every replication student against the undistilled global model (KNOT tables 2–4:
    distillation improves on the model the server started from)."""
    out = [("replication", *c) for c in claim_pairs(d.losses, d.weightings, LOSS_NAMES)]
    names = {v.name for v in variants(d)}
    more = [("one_hot", "Sinkhorn-E vs Sinkhorn-E-onehot", "Sinkhorn-E", "Sinkhorn-E-onehot")]
    for w in d.mixture_weightings:
        more += [("mixture", f"Sinkhorn-mixture-{w} vs Entropy-{w}", f"Sinkhorn-mixture-{w}", f"Entropy-{w}"),
                 ("mixture", f"Sinkhorn-mixture-{w} vs Sinkhorn-{w}", f"Sinkhorn-mixture-{w}", f"Sinkhorn-{w}")]
    for loss in d.losses:
        name = LOSS_NAMES[loss]
        more += [("soft_bias", f"{name}-E-soft vs {name}-A", f"{name}-E-soft", f"{name}-A"),
                 ("soft_bias", f"{name}-E-soft vs {name}-E", f"{name}-E-soft", f"{name}-E")]
    out += [c for c in more if c[2] in names and c[3] in names]
    return out + [("distillation", f"{v.name} vs global", v.name, GLOBAL) for v in variants(d)
                  if v.arm == "replication"]


#: The declared family of tests, fixed before any result: every comparison of :func:`claims` (each claim × metric ×
#: task) on the union of the test sets, ALL — the rows the docs read. Holm's correction runs over it at
#: CLAIMS_ALPHA; the per-party test sets' rows are exploratory (``adjusted_verdict`` "exploratory").
CONFIRMATORY_TEST_SET = ALL
CLAIMS_ALPHA = 0.05


def comparisons(d: DistillParams, frame: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Every comparison of :func:`claims` as paired differences over seeds (:func:`paired_claims`), with its arm;
    in the mechanism arms the verdicts read "first better" / "second better" (no paper claims a side); against the
    global model, which is one fixed model, the differences pair each seed's student with it. A
    comparison whose either student does not beat its best constant on that test set (mean SD skill over the
    seeds ≤ 0) is marked "uninformative" (:func:`mark_uninformative`); the statistical verdict is kept. Each row's
    paired t-test p-value, and over the declared family (:data:`CONFIRMATORY_TEST_SET`) Holm's adjusted p-value
    and the verdict on it (:func:`~otfed.distill.evaluation.adjusted_verdicts`)."""
    pairs = claims(d)
    arm_of = {c: a for a, c, _, _ in pairs}
    students = frame[frame.variant != GLOBAL]
    # the undistilled global model is one fixed model: the same rows stand beside every seed's student
    glob = frame[frame.variant == GLOBAL]
    paired = pd.concat([students, *(glob.assign(seed=seed) for seed in sorted(set(students.seed)))])
    table = paired_claims(paired, [(c, f, s) for _, c, f, s in pairs])
    table.insert(1, "arm", table.claim.map(arm_of))
    mechanism = ~table.arm.isin(["replication", "distillation"])
    table.loc[mechanism, "verdict"] = table.loc[mechanism, "verdict"].map(
        {"replicates": "first better", "reversed": "second better", "undecided": "undecided"})
    table = mark_uninformative(table, summary)
    return adjusted_verdicts(table, (table.test_set == CONFIRMATORY_TEST_SET).to_numpy(), CLAIMS_ALPHA)


def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Per task: the gate (``gate.csv``: every teacher on the audit slice and the task's verdict, from the result
    ``("gate", task)``), and for a task with students (testable, or ``gate: false``) ``table_<task>.csv`` (tables
    2–4 with the diagnostics: mean ± 95% CI over the seeds), the first seed's saved predictions, fig. 2's
    expected-label boxes and the expected label against the true label per variant; ``results.csv`` (every
    student and seed), ``summary.csv``, ``claims.csv`` (every comparison of :func:`comparisons`), ``history.csv``
    (every epoch of every learning rate tried), the Sinkhorn-vs-Entropy and claims figures; one nested run per
    (task, variant) with the means, the CIs and each seed's scores."""
    d = p.distill
    rows: list[dict[str, Any]] = []
    histories: list[dict[str, Any]] = []
    gates, verdicts, trained = [], {}, []
    for task in p.train_teachers.tasks:
        gate: Gate = results[("gate", task)]
        gates.append(gate.table.assign(task_verdict=gate.verdict, reason=gate.reason))
        verdicts[task] = gate.verdict
        base_rows, base_probs, labels = results[("global", task)]
        rows.extend(dict(r, seed=p.run.seed) for r in base_rows)
        probabilities = {GLOBAL: base_probs}
        students = results.by("student", task)  # variant name → its result; none where the gate stopped the task
        for name, (variant_rows, probs, history) in students.items():
            rows.extend(variant_rows)
            histories.extend(history)
            probabilities[name] = probs
        io.write_npz(out.out / f"predictions_{task}.npz",
                     **{f"{v}|{s}": pr for v, by_set in probabilities.items() for s, pr in by_set.items()},
                     **{f"labels|{s}": y for s, y in labels.items()})
        if students:
            trained.append(task)
            space = LabelSpace.for_task(task)
            out.figure(figs.expected_label_boxplots(probabilities, labels[ALL], space, ["Sinkhorn-E", "Entropy-E"]),
                       f"expected_label_{task}.png")
            out.figure(figs.expected_vs_true(probabilities, labels[ALL], space, best_constant(labels[ALL], space)[1]),
                       f"expected_vs_true_{task}.png")
    frame = pd.DataFrame(rows)
    summary = seed_summary(frame)
    table = comparisons(d, frame, summary)
    table.insert(1, "gate", table.task.map(verdicts))
    for task in trained:
        out.table(figs.results_table(summary[summary.task == task]), f"table_{task}.csv")
    for task in trained:
        for v in variants(d):
            tags = {"task": task, "arm": v.arm, "loss": v.loss, "weighting": v.weighting, "bias": v.bias,
                    "label_coordinates": "one-hot" if v.one_hot else "semantic"}
            with out.variant(f"{task}/{v.name}", tags=tags) as child:
                child.log_params({"task": task, "arm": v.arm, "loss": v.loss, "weighting": v.weighting,
                                  "one_hot": v.one_hot, "bias": v.bias, "seeds": d.seeds, **d.settings})
                for r in summary[(summary.task == task) & (summary.variant == v.name)].itertuples():
                    child.log_metrics({f"{r.test_set}.score": r.score, f"{r.test_set}.score_ci95": r.score_ci95,
                                       f"{r.test_set}.semantic_distance": r.semantic_distance,
                                       f"{r.test_set}.semantic_distance_ci95": r.semantic_distance_ci95,
                                       f"{r.test_set}.sd_skill": r.sd_skill})
                for r in frame[(frame.task == task) & (frame.variant == v.name) & (frame.test_set == ALL)].itertuples():
                    child.log_metrics({"seed_score": r.score, "seed_semantic_distance": r.semantic_distance,
                                       "seed_epochs": r.epochs, "seed_lr": r.lr, "seconds": r.seconds},
                                      step=int(r.seed))
    out.table(pd.concat(gates, ignore_index=True), "gate.csv")
    out.table(frame, "results.csv")
    out.table(summary, "summary.csv")
    out.table(table, "claims.csv")
    out.table(pd.DataFrame(histories), "history.csv")
    out.figure(figs.sinkhorn_vs_entropy(summary[summary.task.isin(trained)]), "sinkhorn_vs_entropy.png")
    out.figure(figs.claims_figure(table[table.test_set == ALL]), "claims.png")
    return distill_metrics(summary, table, p.train_teachers.tasks, verdicts)


def distill_metrics(summary: pd.DataFrame, claims: pd.DataFrame, tasks: Sequence[str], verdicts: Mapping[str, str]
                    ) -> dict[str, Any]:
    """Per task, on ALL: the gate's verdict (``testable``: 1, or 0 for "cannot test here"); every variant's mean score, Semantic Distance and SD skill with
    the CI half-widths; each comparison's verdict per metric, and how many replication-arm (claim, metric)
    comparisons replicate / reverse / are uninformative, and replicate after Holm's correction."""
    metrics: dict[str, Any] = {}
    for task in tasks:
        rows = summary[(summary.task == task) & (summary.test_set == ALL)]
        metrics[task] = {r["variant"]: {key: r[key] for key in ("score", "score_ci95", "semantic_distance",
                                                                 "semantic_distance_ci95", "sd_skill")}
                         for r in rows.to_dict("records")}
        metrics[task]["testable"] = int(verdicts[task] == "testable")  # the gate: 1 testable, 0 "cannot test here"
        mine = claims[(claims.task == task) & (claims.test_set == ALL)] if len(claims) else claims
        metrics[task]["claims"] = {f"{r.claim} ({r.metric})": r.verdict for r in mine.itertuples()}
        papers = mine[mine.arm == "replication"] if len(mine) else mine
        for verdict in ("replicates", "reversed", "uninformative"):
            metrics[task][f"claims_{'replicated' if verdict == 'replicates' else verdict}"] = int(
                (papers.verdict == verdict).sum()) if len(papers) else 0
        # after Holm's correction over the declared family (the ALL rows of every task)
        metrics[task]["claims_replicated_holm"] = int((papers.adjusted_verdict == "replicates").sum()) if len(
            papers) else 0
    return metrics


STAGE = Stage("distill", DistillParams, OUTPUTS, jobs, report, check, reads=("train_teachers.tasks",),
              needs=("estimate_bias",), preflight=preflight, inputs=inputs,
              headline=("*.testable", "*.Sinkhorn-E.semantic_distance", "*.Entropy-E.semantic_distance",
                        "*.global (no distillation).semantic_distance", "*.global (no distillation).sd_skill",
                        "*.claims_replicated", "*.claims_reversed", "*.claims_replicated_holm"))  # gate, tables 2-4 and the claims, on ALL
