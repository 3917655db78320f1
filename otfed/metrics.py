"""Evaluation metrics shared by the stages: clustering agreement and distance-order preservation; for the
KNOT text track Semantic Distance, macro-F1, accuracy and each task's headline score.

Also :func:`mean_confidence_interval` (Student-t) for results repeated over seeds.
"""
from __future__ import annotations

import numpy as np


def mean_confidence_interval(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t confidence interval, x̄ ± t_{(1+level)/2, n−1} · s/√n
    (s: sample standard deviation). One value → half-width NaN (no spread to estimate); NaNs are dropped."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise ValueError("no finite values to average")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if x.size == 1:
        return float(x[0]), float("nan")
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return float(x.mean()), half


def bonferroni_interval(mean, low, high, dof, family: int, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Student-t intervals at ``level`` (mean ± t_{(1+level)/2, dof} · se, e.g. :func:`mean_confidence_interval`)
    widened to hold *simultaneously*: each at 1 − (1 − level)/``family`` (Bonferroni), so that all ``family``
    intervals of a table cover their means together with probability ≥ ``level`` — the correction a table of
    many intervals needs before any one of them is read as a finding. The half-width scales by
    t_{1 − (1 − level)/(2·family), dof} / t_{(1+level)/2, dof}. Element-wise over arrays; NaN stays NaN.

    Returns:
        ``(low, high)`` of the simultaneous intervals.

    >>> low, high = bonferroni_interval(0.5, 0.4, 0.6, dof=19, family=1)
    >>> float(low), float(high)
    (0.4, 0.6)
    >>> low, high = bonferroni_interval(0.5, 0.4, 0.6, dof=19, family=10)
    >>> bool(low < 0.4 and high > 0.6)
    True
    """
    if family < 1:
        raise ValueError(f"family must count at least one interval, got {family}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from scipy.stats import t as student_t

    mean, low, high, dof = (np.asarray(v, dtype=np.float64) for v in (mean, low, high, dof))
    scale = student_t.ppf(1.0 - (1.0 - level) / (2.0 * family), dof) / student_t.ppf(0.5 + level / 2.0, dof)
    return mean - (mean - low) * scale, mean + (high - mean) * scale


def adjusted_rand_index(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """ARI between a clustering and the true groups (1 = identical partitions, ≈0 = chance)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(labels_true), np.asarray(labels_pred)))


def order_preservation(d_reference: np.ndarray, d_estimate: np.ndarray) -> float:
    """Fraction of order relations between pairwise distances kept by ``d_estimate`` (FedWaD fig. 6).

    Over all pairs of distinct off-diagonal entries {(i,j), (k,l)} of the upper triangle, the fraction
    for which sign(d_ref[i,j] − d_ref[k,l]) == sign(d_est[i,j] − d_est[k,l]). Ties in the reference
    are skipped.
    """
    d_reference = np.asarray(d_reference, dtype=float)
    d_estimate = np.asarray(d_estimate, dtype=float)
    if d_reference.shape != d_estimate.shape or d_reference.ndim != 2:
        raise ValueError("distance matrices must have the same square shape")
    iu = np.triu_indices_from(d_reference, k=1)
    ref, est = d_reference[iu], d_estimate[iu]
    a, b = np.triu_indices(len(ref), k=1)
    sref = np.sign(ref[a] - ref[b])
    sest = np.sign(est[a] - est[b])
    keep = sref != 0
    if not keep.any():
        return float("nan")
    return float(np.mean(sref[keep] == sest[keep]))


# ----------------------------------------------------------------------------------------------------
# Text track (KNOT): Semantic Distance, macro-F1, accuracy


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _predicted_labels(predictions) -> np.ndarray:
    predictions = _as_numpy(predictions)
    return predictions.argmax(axis=1) if predictions.ndim == 2 else predictions.astype(int)


def expected_label_coordinates(probs, label_space) -> np.ndarray:
    """e = Σ_l p_l · coord(l) for every sample (KNOT §1, "Semantic Distance (SD)"): N×D.

    ``probs`` is N×C (numpy or torch); ``label_space`` an :class:`otfed.distill.LabelSpace` or a C×D
    array of label coordinates.
    """
    probs = _as_numpy(probs).astype(float)
    coords = _as_numpy(getattr(label_space, "coordinates", label_space)).astype(float)
    if probs.ndim != 2 or coords.ndim != 2 or probs.shape[1] != coords.shape[0]:
        raise ValueError(f"probabilities N×C and coordinates C×D do not match: {probs.shape} and {coords.shape}")
    return probs @ coords


def semantic_errors(probs, labels, label_space) -> np.ndarray:
    """Per-sample Semantic Distance error ||e − coord(y)||₂, e the expected coordinate (KNOT §1): N."""
    coords = _as_numpy(getattr(label_space, "coordinates", label_space)).astype(float)
    labels = _as_numpy(labels).astype(int)
    expected = expected_label_coordinates(probs, coords)
    if labels.shape != (expected.shape[0],):
        raise ValueError(f"need one label per sample: {labels.shape} labels for {expected.shape[0]} samples")
    if labels.size and (labels.min() < 0 or labels.max() >= coords.shape[0]):
        raise ValueError(f"labels must lie in 0..{coords.shape[0] - 1}")
    return np.linalg.norm(expected - coords[labels], axis=1)


def semantic_distance(probs, labels, label_space) -> float:
    """Semantic Distance (KNOT §1): the mean over the labels present in ``labels`` of the mean error
    ||Σ_l p_l coord(l) − coord(y)||₂ of that label's samples (label-wise mean, for class imbalance).

    Lower is better; 0 when every prediction puts all its mass on the true label. ``probs`` N×C,
    ``labels`` N integer labels (column indices), ``label_space`` a LabelSpace or C×D coordinates.

    Parameters:
        probs: N×C predicted probabilities (numpy or torch), column l for label l.
        labels: the N true labels, integer indices 0..C−1.
        label_space: an :class:`otfed.label_space.LabelSpace` (its ``coordinates``) or a C×D array of label
            coordinates.

    Returns:
        SD as a float: the mean over the present labels of their samples' mean Euclidean error.

    Raises ValueError for an empty set, shapes that do not match or labels outside 0..C−1.

    KNOT §1's example (its 0.033s written 0.1 / 3, so that m1 sums to 1), a strongly negative text (rating 1):
    m1's argmax is wrong but its expected rating, 2.0, is closer to 1 than that of m2, whose argmax is right
    (2.8):

    >>> from otfed.label_space import LabelSpace
    >>> sa = LabelSpace.for_task("sa")
    >>> m1, m2 = [0.2, 0.7, 0.1 / 3, 0.1 / 3, 0.1 / 3], [0.4, 0.1, 0.1, 0.1, 0.3]
    >>> [round(semantic_distance([m], [0], sa), 12) for m in (m1, m2)]
    [1.0, 1.8]

    A perfect prediction scores 0; the mean is label-wise, so one wrong sample of the rare rating 5 (predicted
    4) counts half, not a quarter:

    >>> labels = np.array([0, 0, 0, 4])
    >>> semantic_distance(np.eye(5)[labels], labels, sa), semantic_distance(np.eye(5)[[0, 0, 0, 3]], labels, sa)
    (0.0, 0.5)
    """
    errors = semantic_errors(probs, labels, label_space)
    labels = _as_numpy(labels).astype(int)
    if errors.size == 0:
        raise ValueError("Semantic Distance of an empty set")
    return float(np.mean([errors[labels == label].mean() for label in np.unique(labels)]))


def macro_f1(labels, predictions, n_labels: int | None = None, present_only: bool = False) -> float:
    """Macro-averaged F1 (the papers' SA and ERC score). ``predictions`` are label indices or N×C scores
    (argmax taken). Averages over the labels present in ``labels`` when ``present_only`` (a label absent
    from the evaluated set has no F1 to measure: counting it as 0 would score a set without a rare emotion
    lower for a reason no model can change), else over 0..n_labels−1 when given, else over the labels seen in
    either input; a label with no true and no predicted sample scores 0 (sklearn ``zero_division=0``)."""
    from sklearn.metrics import f1_score

    y = _as_numpy(labels).astype(int)
    if present_only:
        kwargs = {"labels": np.unique(y).tolist()}
    else:
        kwargs = {} if n_labels is None else {"labels": list(range(n_labels))}
    return float(f1_score(y, _predicted_labels(predictions), average="macro", zero_division=0, **kwargs))


def accuracy(labels, predictions) -> float:
    """Fraction of correct predictions (the papers' NLI score); ``predictions`` as in :func:`macro_f1`."""
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(_as_numpy(labels).astype(int), _predicted_labels(predictions)))


def score_name(task: str) -> str:
    """The papers' headline score of a KNOT task (tables 1–4): ``accuracy`` for NLI, ``macro_f1`` for SA and ERC."""
    return "accuracy" if task == "nli" else "macro_f1"


def task_score(task: str, labels, probs, n_labels: int) -> float:
    """The :func:`score_name` score of ``task``: macro-F1 over the labels present in ``labels`` (SA, ERC; a
    test set without a rare emotion is not scored 0 on it) or accuracy (NLI) of the argmax predictions of
    the N×C ``probs``. ``n_labels`` checks the width of ``probs``."""
    probs = _as_numpy(probs)
    if probs.ndim == 2 and probs.shape[1] != n_labels:
        raise ValueError(f"probabilities have {probs.shape[1]} columns for {n_labels} labels")
    if task == "nli":
        return accuracy(labels, probs)
    return macro_f1(labels, probs, present_only=True)
