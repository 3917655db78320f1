"""Scoring a KNOT model on every test set (KNOT tables 2–4; SPEC §1): the task's headline score and
Semantic Distance, on each party's test split and on their union ``ALL``.

The test sets are the experimenter's view, as in the papers' tables: the server uses them for scoring
only, never for training.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from otfed.data.text import TextFederation
from otfed.label_space import LabelSpace
from otfed.metrics import semantic_distance, task_score
from otfed.models import TextClassifier

ALL = "ALL"  # the union of every party's test split

#: (name, texts, labels) of one test set
EvaluationSet = tuple[str, Sequence[str], np.ndarray]


def evaluation_sets(fed: TextFederation) -> list[EvaluationSet]:
    """(name, texts, labels) of every local test set, the global test set and ALL (their union)."""
    sets = [(p.name, p.test.texts, p.test.labels) for p in (*fed.locals, fed.global_party)]
    texts = [t for _, ts, _ in sets for t in ts]
    labels = np.concatenate([ls for _, _, ls in sets])
    return [*sets, (ALL, texts, labels)]


def evaluate(clf: TextClassifier, task: str, sets: Sequence[EvaluationSet], label_space: LabelSpace,
             batch_size: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Score ``clf`` on every test set of :func:`evaluation_sets`: the task score (macro-F1 or accuracy,
    :func:`otfed.metrics.task_score`) and Semantic Distance (label-wise mean, KNOT §1). ALL reuses the other
    sets' predictions.

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
