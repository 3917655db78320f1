"""The KNOT text-track experiments (KNOT §6, SPEC §1), one function per unit of fan-out work.

* :func:`train_party` — stage ``train_teachers``: a local teacher (or the server's global model) trained
  with cross-entropy and early stopping; the client then labels the transfer set, and its messages
  (predictions, dataset size) are all that leaves it. Table 1 row.
* :func:`party_bias` — stage ``estimate_bias``: the teacher's probability bias B_k on random texts drawn
  from its own tokenizer vocabulary (KNOT app. D.1).
* :func:`distill_variant` — stage ``distill``: one of {Sinkhorn, Entropy} × {A, D, U, E} (or the one-hot
  ablation): student initialised from the global model, trained with eq. 3 against the teacher ensemble
  the server assembled from messages, scored on every test set (tables 2–4).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from otfed.config import TextModelParams, TextTaskParams
from otfed.data.text import TextFederation, TextParty, TextTaskSpec
from otfed.distill.bias import random_texts, probability_bias
from otfed.distill.label_space import LabelSpace
from otfed.distill.student import distill_student, ensemble_weights
from otfed.federation.knot import TeacherEnsemble, bias_message, client_messages, teacher_ensemble
from otfed.federation.messages import Message
from otfed.metrics import accuracy, macro_f1, semantic_distance
from otfed.models import ModelSpec, TextClassifier, build_classifier, train_classifier
from otfed.models.tokenizer import vocabulary

ALL = "ALL"


def text_spec(task: str, params: TextTaskParams) -> TextTaskSpec:
    """The data layer's spec of ``task`` from its params group (``partition.text.tasks.<task>``)."""
    return TextTaskSpec(task=task, **params.model_dump())


def model_spec(params: TextModelParams) -> ModelSpec:
    """The model layer's spec from ``train_teachers.model`` (or a per-party override)."""
    return ModelSpec(**params.model_dump())


def score_name(task: str) -> str:
    """The papers' headline score: macro-F1 for SA and ERC, accuracy for NLI."""
    return "accuracy" if task == "nli" else "macro_f1"


def task_score(task: str, labels: np.ndarray, probs: np.ndarray, n_labels: int) -> float:
    """Macro-F1 (SA, ERC) or accuracy (NLI) of the argmax predictions."""
    if task == "nli":
        return accuracy(labels, probs)
    return macro_f1(labels, probs, n_labels=n_labels)


def test_sets(fed: TextFederation) -> list[tuple[str, Sequence[str], np.ndarray]]:
    """(name, texts, labels) of every local test set, the global test set and ALL (their union)."""
    sets = [(p.name, p.test.texts, p.test.labels) for p in (*fed.locals, fed.global_party)]
    texts = [t for _, ts, _ in sets for t in ts]
    labels = np.concatenate([ls for _, _, ls in sets])
    return [*sets, (ALL, texts, labels)]


def evaluate(clf: TextClassifier, task: str, sets: Sequence[tuple[str, Sequence[str], np.ndarray]],
             label_space: LabelSpace, batch_size: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Score ``clf`` on every test set of :func:`test_sets`: the task score and Semantic Distance
    (label-wise mean, SPEC §1). ALL reuses the other sets' predictions.

    Returns table rows (test_set, n, score, semantic_distance) and each set's N×C probabilities.
    """
    rows, probabilities = [], {}
    for name, texts, labels in sets:
        if name == ALL:
            probs = np.concatenate([probabilities[n] for n, _, _ in sets if n != ALL])
        else:
            probs = clf.predict_proba(list(texts), batch_size=batch_size)
        probabilities[name] = probs
        rows.append({"test_set": name, "n": int(len(labels)),
                     "score": task_score(task, labels, probs, label_space.n_labels),
                     "semantic_distance": semantic_distance(probs, labels, label_space)})
    return rows, probabilities


def train_party(task: str, party: TextParty, model: TextModelParams, training: dict[str, Any],
                transfer_texts: Sequence[str], label_names: Sequence[str], out_dir: str, seed: int,
                device: str, predict_batch_size: int, run: Any = None,
                ) -> tuple[dict[str, Any], list[dict[str, Any]], list[Message]]:
    """Train one party's model on its own data (KNOT §6 teachers: cross-entropy, early stopping on
    validation macro-F1), save it to ``out_dir``, and label the transfer set client-side.

    Returns the Table 1 row, the per-epoch history and the client's outgoing messages.
    """
    start = time.perf_counter()
    spec = model_spec(model)
    clf = build_classifier(spec, label_names, party.train.texts, seed=seed, device=device)
    history: list[dict[str, Any]] = []

    def on_epoch(record: dict[str, Any]) -> None:
        history.append({"task": task, "party": party.name, **record})
        if run is not None:
            run.log_metrics({k: float(v) for k, v in record.items() if k != "epoch"}, step=int(record["epoch"]))

    result = train_classifier(clf, party.train.texts, party.train.labels, party.val.texts, party.val.labels,
                              seed=seed, on_epoch=on_epoch, progress=True, description=f"{task}/{party.name}",
                              **training)
    clf.save(out_dir)
    test_probs = clf.predict_proba(list(party.test.texts), batch_size=predict_batch_size)
    transfer_probs = clf.predict_proba(list(transfer_texts), batch_size=predict_batch_size, progress=True)
    n_labels = len(label_names)
    row = {
        "task": task, "party": party.name, "role": party.role, "source": party.source, "model": spec.kind,
        "parameters": int(clf.n_parameters), "n_train": len(party.train.texts), "n_val": len(party.val.texts),
        "n_test": len(party.test.texts), "best_epoch": result.best_epoch, "val_macro_f1": result.best_score,
        "test_score": task_score(task, party.test.labels, test_probs, n_labels), "score": score_name(task),
        "test_macro_f1": macro_f1(party.test.labels, test_probs, n_labels=n_labels),
        "seconds": time.perf_counter() - start,
    }
    if run is not None:
        run.log_metrics({k: float(row[k]) for k in ("test_score", "test_macro_f1", "val_macro_f1", "seconds")})
    return row, history, client_messages(party.name, transfer_probs, len(party.train.texts))


def party_bias(task: str, party: str, model_dir: str, n_texts: int, text_length: int, batch_size: int,
               seed: int, device: str) -> tuple[dict[str, Any], Message]:
    """B_k of one teacher (KNOT §5.2, app. D.1): argmax frequencies on ``n_texts`` random texts of
    ``text_length`` entries drawn uniformly from the teacher's own tokenizer vocabulary."""
    clf = TextClassifier.load(model_dir, device=device)
    texts = random_texts(vocabulary(clf.tokenizer), n_texts, text_length, rng=seed)
    bias = probability_bias(lambda batch: clf.predict_proba(batch, batch_size=len(batch)), texts,
                            batch_size=batch_size, n_labels=len(clf.labels), description=f"bias {task}/{party}")
    b = bias.numpy()
    row = {"task": task, "party": party, **{label: float(v) for label, v in zip(clf.labels, b)},
           "max_share": float(b.max()), "majority_label": clf.labels[int(b.argmax())]}
    return row, bias_message(party, b)


def distill_variant(task: str, variant: str, loss: str, weighting: str, label_space: LabelSpace,
                    global_model_dir: str, transfer_texts: Sequence[str], ensemble: TeacherEnsemble,
                    sets: Sequence[tuple[str, Sequence[str], np.ndarray]], settings: dict[str, Any], seed: int,
                    device: str, run: Any = None,
                    ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], list[dict[str, Any]]]:
    """One student of tables 2–4: start from the pretrained global model, minimise eq. 3 with ``loss``
    (sinkhorn | kl) and teacher weights ``weighting`` over the ensemble, then score every test set.
    Server side: it sees the global model, the transfer texts, the ensemble built from client messages and
    — for scoring only — the test sets ``sets``; never a client's training data or teacher weights.

    ``settings`` holds epochs, batch_size, lr, weight_decay, eps, sinkhorn_iterations, eval_batch_size.
    Returns table rows, the test-set probabilities and the per-epoch history.
    """
    start = time.perf_counter()
    student = TextClassifier.load(global_model_dir, device=device)
    weights = ensemble_weights(ensemble, weighting)
    history: list[dict[str, Any]] = []

    def on_epoch(record: dict[str, Any]) -> None:
        history.append({"task": task, "variant": variant, **record})
        if run is not None:
            run.log_metrics({"train_loss": float(record["loss"])}, step=int(record["epoch"]))

    distill_student(student, transfer_texts, ensemble, weights, kind=loss,
                    cost=label_space.cost_matrix(dtype=torch.float64) if loss == "sinkhorn" else None,
                    eps=settings["eps"] if loss == "sinkhorn" else None,
                    sinkhorn_iterations=settings["sinkhorn_iterations"], epochs=settings["epochs"],
                    batch_size=settings["batch_size"], lr=settings["lr"], weight_decay=settings["weight_decay"],
                    seed=seed, on_epoch=on_epoch, description=f"{task}/{variant}")
    # scores always use the task's semantic coordinates (the ablation changes the training cost only)
    rows, probs = evaluate(student, task, sets, LabelSpace.for_task(task), settings["eval_batch_size"])
    seconds = time.perf_counter() - start
    for r in rows:
        r.update(task=task, variant=variant, loss=loss, weighting=weighting, seconds=seconds)
    if run is not None:
        metrics = {}
        for r in rows:
            metrics[f"{r['test_set']}.score"] = float(r["score"])
            metrics[f"{r['test_set']}.semantic_distance"] = float(r["semantic_distance"])
        run.log_metrics({**metrics, "seconds": seconds})
    return rows, probs, history


def ensemble_of(messages: Sequence[Message], fed: TextFederation, learning_without_forgetting: bool,
                ) -> TeacherEnsemble:
    """The server's teacher ensemble from received messages: local teachers in ``fed.locals`` order, then
    the frozen global model (learning without forgetting, SPEC §1) when enabled."""
    order = [p.name for p in fed.locals]
    if learning_without_forgetting:
        order.append(fed.global_party.name)
    return teacher_ensemble([m for m in messages if m.sender in order], order=order)


def model_dir(models_dir: str | Path, task: str, party: str) -> Path:
    """Where stage ``train_teachers`` saves ``party``'s model of ``task``."""
    return Path(models_dir) / task / party
