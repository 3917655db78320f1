"""Evaluation of noisy-data detection (FedBary §5.2, fig. 5; OpenDataVal's protocols).

- :func:`detection_scores` — precision / recall / F1 of the flagged points against the planted noisy
  indices (the authors' notebooks report recall only, as "accuracy"; we report all three).
- :func:`detection_auc` — ROC AUC of a suspicion score against the planted noise (threshold-free: the
  probability that a random noisy datum is ranked above a random clean one).
- :func:`point_removal_curve` — remove training points in descending order of value (most harmful first
  for calibrated gradients), refit a logistic regression after every further 5 % and record holdout
  accuracy (FedBary fig. 5 b, d).
- :func:`split_validation` — the server's validation set split, class by class, into the target Q and a clean
  calibration set for :func:`otfed.valuation.calibrated.calibrated_threshold` (a flagging rule with a stated
  false-positive rate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from otfed.ot.otdd import LabelledData

if TYPE_CHECKING:  # scikit-learn (the `valuation` extra) is imported where a removal curve fits a model
    from sklearn.linear_model import LogisticRegression


@dataclass(frozen=True)
class DetectionScores:
    """Detection quality: counts and precision = TP/flagged, recall = TP/noisy, F1 (0 when undefined)."""

    true_positives: int
    flagged: int
    noisy: int
    precision: float
    recall: float
    f1: float


def detection_scores(flagged: np.ndarray, noisy: np.ndarray, n: int | None = None) -> DetectionScores:
    """Precision, recall and F1 of ``flagged`` (a boolean mask of length n, or an index array) against the
    true ``noisy`` indices."""
    flagged = np.asarray(flagged)
    noisy_idx = np.unique(np.asarray(noisy, dtype=np.intp))
    if flagged.dtype == bool:
        if n is not None and flagged.shape[0] != n:
            raise ValueError(f"flag mask has length {flagged.shape[0]}, expected {n}")
        flagged_idx = np.flatnonzero(flagged)
        n = flagged.shape[0]
    else:
        flagged_idx = np.unique(flagged.astype(np.intp))
    if n is not None and noisy_idx.size and (noisy_idx.min() < 0 or noisy_idx.max() >= n):
        raise ValueError(f"noisy indices must lie in [0, {n})")
    tp = int(np.intersect1d(flagged_idx, noisy_idx).size)
    precision = tp / flagged_idx.size if flagged_idx.size else 0.0
    recall = tp / noisy_idx.size if noisy_idx.size else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return DetectionScores(tp, int(flagged_idx.size), int(noisy_idx.size), float(precision), float(recall), float(f1))


def detection_auc(suspicion: np.ndarray, noisy: np.ndarray) -> float:
    """ROC AUC of ``suspicion`` (larger = more likely noisy) against the boolean mask ``noisy``: the
    Mann–Whitney statistic P(s_noisy > s_clean) + ½ P(s_noisy = s_clean), from average ranks (ties share
    their rank). NaN when every datum is noisy or none is (no pair to compare)."""
    s = np.asarray(suspicion, dtype=np.float64)
    bad = np.asarray(noisy, dtype=bool)
    if s.ndim != 1 or bad.shape != s.shape:
        raise ValueError(f"suspicion and noisy must be 1-D of one length, got {s.shape} and {bad.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("suspicion scores contain NaN/inf")
    n_bad, n_good = int(bad.sum()), int((~bad).sum())
    if n_bad == 0 or n_good == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(s)  # average ranks for ties
    return float((ranks[bad].sum() - n_bad * (n_bad + 1) / 2) / (n_bad * n_good))


@dataclass(frozen=True)
class RemovalCurve:
    """Holdout accuracy after removing the first ``removed[k]`` points (fraction ``fractions[k]``)."""

    fractions: np.ndarray
    removed: np.ndarray
    accuracy: np.ndarray


def _default_model(seed: int) -> LogisticRegression:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=2000, random_state=seed)


def point_removal_curve(values: np.ndarray, x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                        step: float = 0.05, max_fraction: float = 0.5, seed: int = 0,
                        make_model: Callable[[int], object] | None = None) -> RemovalCurve:
    """Point-removal experiment (FedBary fig. 5 b, d): sort the training points by descending ``values``
    (ties by index), and for each fraction f = 0, step, 2·step, …, ≤ max_fraction remove the first
    round(f·n) of them, refit a logistic regression (``make_model(seed)``, default scikit-learn
    ``LogisticRegression``) on the rest and record its accuracy on (x_test, y_test). A remainder with a
    single class predicts that class.
    """
    values = np.asarray(values, dtype=np.float64)
    x, y = np.asarray(x), np.asarray(y)
    if values.shape != (x.shape[0],) or y.shape != (x.shape[0],):
        raise ValueError(f"values {values.shape}, x {x.shape} and y {y.shape} do not match")
    if not 0 < step <= max_fraction < 1:
        raise ValueError(f"need 0 < step ≤ max_fraction < 1, got step={step}, max_fraction={max_fraction}")
    make_model = make_model or _default_model
    order = np.argsort(-values, kind="stable")
    n = x.shape[0]
    fractions = np.arange(0.0, max_fraction + 1e-12, step)
    removed = np.rint(fractions * n).astype(int)
    accuracy = np.empty(fractions.shape[0])
    for k, r in enumerate(removed):
        keep = np.sort(order[r:])
        classes = np.unique(y[keep])
        if classes.size == 1:
            accuracy[k] = float(np.mean(y_test == classes[0]))
            continue
        model = make_model(seed)
        model.fit(x[keep], y[keep])  # type: ignore[attr-defined]
        accuracy[k] = float(np.mean(model.predict(x_test) == y_test))  # type: ignore[attr-defined]
    return RemovalCurve(fractions=fractions, removed=removed, accuracy=accuracy)


def split_validation(validation: LabelledData, calibration_fraction: float = 0.5,
                     seed: int = 0) -> tuple[LabelledData, LabelledData]:
    """The server's labelled ``validation`` set split at random, class by class, into a reference part (FedBary's
    target Q) and a calibration part (``calibration_fraction`` of every class, rounded, at least 2 rows on each
    side so that both can be label-augmented). The calibration part joins the FedBary session as one more —
    clean — client named ``"<name>/calibration"``; its datum values (eq. 10) give the threshold of
    :func:`otfed.valuation.calibrated.calibrated_threshold`. Keep it about the size of a client: eq. 10 centres
    every client's values, so their spread depends on the client's size. Same ``seed`` → same split.

    Parameters:
        validation: the server's labelled validation set.
        calibration_fraction: the share of every class that goes to calibration, in (0, 1).
        seed: the split's random draw.

    Returns:
        ``(reference, calibration)``, named ``"<name>/reference"`` and ``"<name>/calibration"``.

    Raises ValueError for a fraction outside (0, 1) or a class with fewer than 4 rows (it cannot leave 2 on each
    side).

    >>> data = LabelledData("validation", np.arange(20.0).reshape(10, 2), np.array([0] * 6 + [1] * 4))
    >>> reference, calibration = split_validation(data, 0.5, seed=0)
    >>> np.bincount(reference.y).tolist(), np.bincount(calibration.y).tolist(), calibration.name
    ([3, 2], [3, 2], 'validation/calibration')
    >>> sorted(np.concatenate([reference.x[:, 0], calibration.x[:, 0]]).tolist()) == data.x[:, 0].tolist()
    True
    """
    if not 0.0 < calibration_fraction < 1.0:
        raise ValueError(f"calibration_fraction must lie in (0, 1), got {calibration_fraction!r}")
    x, y = np.asarray(validation.x), np.asarray(validation.y)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA1]))
    to_calibration = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        if rows.size < 4:
            raise ValueError(f"{validation.name!r}: class {label.item()!r} has {rows.size} rows; splitting it needs ≥ 4")
        take = int(np.clip(round(calibration_fraction * rows.size), 2, rows.size - 2))
        to_calibration[rng.choice(rows, take, replace=False)] = True
    return (LabelledData(f"{validation.name}/reference", x[~to_calibration], y[~to_calibration]),
            LabelledData(f"{validation.name}/calibration", x[to_calibration], y[to_calibration]))
