"""When a Semantic Distance comparison means nothing: the constant-prediction floor and rank informativeness.

Semantic Distance (KNOT §1, "Semantic Distance (SD)") scores a model only through its expected label
e(x) = Σ_l p_l(x) · coord(l). A model that predicts (nearly) the same expected label for every text can
still score well when that label sits near the middle of the label space, so a table of SDs alone may rank
models that carry no information about the text. The functions here measure this:

- :func:`best_constant` — the lowest SD any *constant* prediction can reach on the evaluated labels (the
  geometric median of the present labels' coordinates), the floor every useful model must beat;
- :func:`informativeness` — Spearman rank correlation between the expected label and the true label's
  coordinate (does the expected label at least move in the right direction?);
- :func:`expected_label_profile` — where the expected labels sit, overall and per true label;
- :func:`diagnostics` — all of the above for one model, with the skill score 1 − SD / SD_constant;
- :func:`teacher_gate` — one row per teacher, passing those whose informativeness reaches a threshold.

Inputs: ``probs`` N×C (numpy or torch), ``labels`` N integer label indices (columns of ``probs``),
``label_space`` an :class:`otfed.label_space.LabelSpace` or a C×D array of label coordinates.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from otfed.metrics import _as_numpy, semantic_distance

#: Tolerance of the geometric median's data-point optimality test, relative to the total weight.
MEDIAN_TOL = 1e-10
_GRADIENT_TOL = 1e-12  # stopping gradient norm of the iteration off the data points, relative to the total weight
_MEDIAN_MAX_ITER = 100_000


def _coordinates(label_space) -> np.ndarray:
    coords = _as_numpy(getattr(label_space, "coordinates", label_space)).astype(np.float64)
    if coords.ndim != 2 or coords.shape[0] == 0 or coords.shape[1] == 0:
        raise ValueError(f"label coordinates must be a non-empty C×D array, got shape {coords.shape}")
    if not np.all(np.isfinite(coords)):
        raise ValueError("label coordinates must be finite")
    return coords


def _labels(labels, n_labels: int, n_samples: int | None = None) -> np.ndarray:
    y = _as_numpy(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be a 1-D array of label indices, got shape {y.shape}")
    if y.size == 0:
        raise ValueError("no labels: the evaluated set is empty")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.number) or not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            raise ValueError(f"labels must be integer label indices 0..{n_labels - 1}, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.min() < 0 or y.max() >= n_labels:
        raise ValueError(f"labels must lie in 0..{n_labels - 1} (the label space has {n_labels} labels), "
                         f"got values in {y.min()}..{y.max()}")
    if n_samples is not None and y.size != n_samples:
        raise ValueError(f"need one label per sample: {y.size} labels for {n_samples} samples")
    return y


def _probs(probs, n_labels: int) -> np.ndarray:
    p = _as_numpy(probs).astype(np.float64)
    if p.ndim != 2 or p.shape[1] != n_labels:
        raise ValueError(f"probabilities must be N×C with C = {n_labels} labels, got shape {p.shape}")
    if p.shape[0] == 0:
        raise ValueError("no probabilities: the evaluated set is empty")
    if not np.all(np.isfinite(p)):
        raise ValueError("probabilities must be finite")
    return p


def expected_coordinates(probs, label_space) -> np.ndarray:
    """The expected label e = Σ_l p_l · coord(l) of every sample (KNOT §1, "Semantic Distance"): N×D.

    In 1-D (SA) this is the expected rating; SD is the mean distance between e and the true label's point.
    """
    coords = _coordinates(label_space)
    return _probs(probs, coords.shape[0]) @ coords


def _unit_pull(y: np.ndarray, points: np.ndarray, weights: np.ndarray):
    """Σ w_i (x_i − y)/||x_i − y||, Σ w_i/||x_i − y|| and Σ w_i (I − u_i u_iᵀ)/||x_i − y|| (u_i the unit vector
    towards x_i) over the points x_i ≠ y, and the weight of the point equal to y (0 if none). Away from the
    points the first is −∇f and the third the Hessian of f(y) = Σ w_i ||y − x_i||."""
    diff = points - y
    dist = np.linalg.norm(diff, axis=1)
    at = dist == 0.0
    inv = np.zeros_like(dist)
    inv[~at] = weights[~at] / dist[~at]
    unit = np.zeros_like(diff)
    unit[~at] = diff[~at] / dist[~at, None]
    eye = np.eye(points.shape[1])
    hessian = np.einsum("i,ijk->jk", inv, eye[None] - unit[:, :, None] * unit[:, None, :])
    return (inv[:, None] * diff).sum(axis=0), inv.sum(), hessian, weights[at].sum()


def _geometric_median(points: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """argmin_m f(m) = Σ w_i ||m − x_i||₂ for distinct points x_i (rows).

    A data point x_j is the minimiser iff ||Σ_{i≠j} w_i (x_i − x_j)/||x_i − x_j|| || ≤ w_j (the optimality
    condition behind the Vardi–Zhang modification of Weiszfeld's algorithm); every data point is tested
    first. Otherwise the minimiser is not a data point, where f is smooth, and the iteration starts at the
    weighted mean: each step takes whichever of Weiszfeld's step (which never increases f, but crawls when
    the minimiser lies close to a data point) and a Newton step on f lowers f more, stopping once
    ||∇f|| ≤ 1e-12 · Σ w_i — then f(y) − f(m*) ≤ ||∇f|| · diam, f being convex and both points in the hull —
    or when neither step lowers f (floating-point optimum). A data point passes its test within
    1e-10 · Σ w_i, so in every case f(m)/Σ w_i exceeds the minimum by at most 1e-10 · diam.
    """
    total = weights.sum()

    def f(y):
        return float(weights @ np.linalg.norm(points - y, axis=1))

    for j in range(points.shape[0]):
        pull, _, _, own = _unit_pull(points[j], points, weights)
        if np.linalg.norm(pull) <= own + MEDIAN_TOL * total:
            return points[j].copy()
    y = (weights[:, None] * points).sum(axis=0) / total
    fy = f(y)
    for _ in range(_MEDIAN_MAX_ITER):
        pull, inv_sum, hessian, own = _unit_pull(y, points, weights)
        r = np.linalg.norm(pull)
        if r <= own + _GRADIENT_TOL * total:  # (sub)gradient ~ 0: optimal
            return y
        candidates = [y + (1.0 - own / r) * pull / inv_sum]  # Weiszfeld / Vardi–Zhang (own = 0 off the points)
        if own == 0.0:
            try:
                candidates.append(y + np.linalg.solve(hessian, pull))  # Newton: H⁻¹(−∇f)
            except np.linalg.LinAlgError:
                pass
        values = [f(c) for c in candidates]
        best = int(np.argmin(values))
        if not values[best] < fy:
            return y
        y, fy = candidates[best], values[best]
    raise RuntimeError(f"geometric median did not converge in {_MEDIAN_MAX_ITER} steps")


def best_constant(labels, label_space) -> tuple[float, np.ndarray]:
    """The lowest Semantic Distance any constant prediction reaches on ``labels``, and its expected label m*.

    A constant prediction p has one expected label m = Σ_l p_l coord(l), and its SD (KNOT §1, label-wise
    mean) is f(m) = (1/|Y|) Σ_{y∈Y} ||m − coord(y)||₂ over the set Y of labels present in ``labels``: every
    present label counts once, whatever its number of samples. f is minimised by the (equally weighted)
    geometric median m* of the present labels' coordinates; m* lies in their convex hull, which is the set
    of expected labels of histograms over the present labels, so some constant prediction attains it.

    1-D: exact, m* = the median of the present coordinates; with an even number of them every point between
    the two middle ones is optimal and the midpoint is returned. ≥2-D: Weiszfeld's algorithm (with the
    Vardi–Zhang step at data points, each data point first tested for optimality) sped up by Newton steps,
    to within 1e-10 × the diameter of the present coordinates in SD.
    Labels with equal coordinates are one point of summed weight. Returns (f(m*), m*), m* of length D.

    Parameters:
        labels: the evaluated set's N true labels, integer indices 0..C−1 (only which labels are present counts).
        label_space: a :class:`otfed.label_space.LabelSpace` or a C×D array of label coordinates.

    Returns:
        (f(m*), m*): the best constant's Semantic Distance (a float, the floor a model must beat) and its
        expected label, a float64 array of length D.

    Raises ValueError for empty labels, labels outside 0..C−1 or bad coordinates.

    SA's ratings 1..5 on a line, ratings 1, 2 and 5 present: the median 2, at SD (1 + 0 + 3) / 3:

    >>> from otfed.label_space import LabelSpace
    >>> value, m = best_constant([0, 0, 1, 4], LabelSpace.for_task("sa"))
    >>> round(value, 12), m.tolist()
    (1.333333333333, [2.0])

    ERC's five emotions in the valence–arousal plane, against brute force over a 0.005 grid of the labels' box:

    >>> erc = LabelSpace.for_task("erc")
    >>> value, m = best_constant([0, 1, 2, 3, 4], erc)
    >>> axis = np.linspace(-1, 1, 401)
    >>> grid = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 1, 2)
    >>> brute = np.linalg.norm(grid - erc.coordinates.double().numpy(), axis=-1).mean(1).min()
    >>> bool(0 <= brute - value < 1e-3)
    True
    """
    coords = _coordinates(label_space)
    y = _labels(labels, coords.shape[0])
    present = coords[np.unique(y)]
    if coords.shape[1] == 1:
        m = np.array([float(np.median(present[:, 0]))])
    else:
        points, counts = np.unique(present, axis=0, return_counts=True)
        m = _geometric_median(points, counts.astype(np.float64))
    value = float(np.linalg.norm(present - m, axis=1).mean())
    return value, m


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def informativeness(probs, labels, label_space) -> float:
    """Spearman rank correlation between the expected label and the true label's coordinate.

    1-D (SA): exactly Spearman(e, coord(y)), i.e. whether higher true ratings get higher expected ratings
    (1: same order; −1: reversed; ≈0: no relation). ≥2-D: the mean of the per-axis Spearman correlations
    over the axes on which the present labels' coordinates are not all equal (axes without variation are
    skipped); an axis on which every expected label is the same contributes 0 (no rank information there).
    NaN when fewer than two distinct labels are present, when the present labels share one point, or when
    the expected labels are constant on every axis that varies.
    """
    coords = _coordinates(label_space)
    p = _probs(probs, coords.shape[0])
    y = _labels(labels, coords.shape[0], p.shape[0])
    present = coords[np.unique(y)]
    if present.shape[0] < 2:
        return float("nan")
    axes = np.flatnonzero(np.ptp(present, axis=0) > 0)
    if axes.size == 0:
        return float("nan")
    expected = p @ coords
    truth = coords[y]
    varying = [a for a in axes if np.ptp(expected[:, a]) > 0]
    if not varying:
        return float("nan")
    rhos = [_spearman(expected[:, a], truth[:, a]) if a in varying else 0.0 for a in axes]
    return float(np.mean(rhos))


def expected_label_profile(probs, labels, label_space) -> dict:
    """Where the expected labels e = Σ_l p_l coord(l) sit: overall and per true label.

    Keys: ``mean`` — the mean expected label over all samples (a float in 1-D, a list of D floats
    otherwise); ``per_label`` — {label index: mean expected label of that label's samples} over the present
    labels (same types); ``spread`` — the largest Euclidean distance between two present labels' mean
    expected labels (1-D: max − min of the per-label means; 0 with a single present label). A spread near 0
    says the model predicts the same expected label whatever the true label.
    """
    coords = _coordinates(label_space)
    p = _probs(probs, coords.shape[0])
    y = _labels(labels, coords.shape[0], p.shape[0])
    expected = p @ coords
    one_d = coords.shape[1] == 1

    def out(v: np.ndarray):
        return float(v[0]) if one_d else [float(x) for x in v]

    present = np.unique(y)
    means = np.stack([expected[y == label].mean(axis=0) for label in present])
    spread = float(np.linalg.norm(means[:, None, :] - means[None, :, :], axis=-1).max())
    return {
        "mean": out(expected.mean(axis=0)),
        "spread": spread,
        "per_label": {int(label): out(m) for label, m in zip(present, means)},
    }


def diagnostics(probs, labels, label_space) -> dict:
    """Semantic Distance of one model together with what it takes to read it (KNOT §1 "Semantic Distance").

    Keys:

    - ``semantic_distance`` — SD, :func:`otfed.metrics.semantic_distance` (label-wise mean);
    - ``sd_constant`` — the lowest SD of any constant prediction on these labels (:func:`best_constant`);
    - ``sd_skill`` — 1 − SD / sd_constant: 1 = perfect, 0 = no better than the best constant, < 0 = worse;
      NaN when sd_constant is 0 (a single present label, or all present labels at one point);
    - ``beats_constant`` — sd_skill > 0 (False when NaN);
    - ``informativeness`` — :func:`informativeness` (Spearman; NaN when undefined);
    - ``expected_offset`` — ||mean expected label − m*||₂, the distance of the mean expected label from the
      best constant's expected label m*;
    - ``expected_label_mean`` — the mean expected label (1-D label spaces only; NaN otherwise);
    - ``expected_label_spread`` — the ``spread`` of :func:`expected_label_profile`.
    """
    coords = _coordinates(label_space)
    p = _probs(probs, coords.shape[0])
    y = _labels(labels, coords.shape[0], p.shape[0])
    sd = semantic_distance(p, y, coords)
    sd_constant, m_star = best_constant(y, coords)
    skill = 1.0 - sd / sd_constant if sd_constant > 0 else float("nan")
    profile = expected_label_profile(p, y, coords)
    mean = np.atleast_1d(np.asarray(profile["mean"], dtype=np.float64))
    return {
        "semantic_distance": float(sd),
        "sd_constant": float(sd_constant),
        "sd_skill": float(skill),
        "beats_constant": bool(skill > 0),
        "informativeness": informativeness(p, y, coords),
        "expected_offset": float(np.linalg.norm(mean - m_star)),
        "expected_label_mean": float(mean[0]) if coords.shape[1] == 1 else float("nan"),
        "expected_label_spread": float(profile["spread"]),
    }


def teacher_gate(probs_by_teacher: Mapping[str, np.ndarray], labels, label_space, threshold: float = 0.3):
    """One row per teacher: does its expected label carry rank information about the true label?

    Columns: ``teacher``, ``n`` (samples), ``informativeness``, ``semantic_distance``, ``sd_constant``,
    ``sd_skill`` (see :func:`diagnostics`) and ``passes`` = informativeness ≥ ``threshold`` (NaN fails).
    Every teacher is scored on the same ``labels``. Returns a pandas DataFrame in the mapping's order.

    Parameters:
        probs_by_teacher: teacher name → its N×C predicted probabilities on the evaluated texts (numpy or torch).
        labels: the N true labels, integer indices 0..C−1, the same for every teacher.
        label_space: a :class:`otfed.label_space.LabelSpace` or a C×D array of label coordinates.
        threshold: the informativeness (Spearman's ρ, :func:`informativeness`) a teacher needs to pass.

    Returns:
        A pandas DataFrame, one row per teacher in the mapping's order, with the columns above.

    Raises ValueError for no teachers, a non-finite ``threshold``, or a teacher whose inputs are unusable
    (naming the teacher).

    Two teachers on SA's ratings 1..5. One leans towards the true rating y: its expected rating 0.6·y + 1.2
    increases with y (Spearman 1), and its SD, 0.4 × the label-wise mean |3 − y| = 0.48, has skill
    1 − 0.48 / 1.2 = 0.6 against the best constant's 1.2 (the median rating 3). The other predicts one
    histogram whatever the text, whose expected rating is that best constant: skill 0, no rank information,
    so it fails.

    >>> from otfed.label_space import LabelSpace
    >>> labels = np.array([0, 1, 2, 3, 4, 0, 4])
    >>> reads = 0.6 * np.eye(5)[labels] + 0.4 / 5
    >>> constant = np.tile([0.1, 0.2, 0.4, 0.2, 0.1], (7, 1))
    >>> table = teacher_gate({"reads": reads, "constant": constant}, labels, LabelSpace.for_task("sa"))
    >>> table.round(6)[["teacher", "informativeness", "semantic_distance", "sd_skill", "passes"]].values.tolist()
    [['reads', 1.0, 0.48, 0.6, True], ['constant', nan, 1.2, 0.0, False]]
    """
    if not probs_by_teacher:
        raise ValueError("no teachers to gate: probs_by_teacher is empty")
    if not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number, got {threshold}")
    import pandas as pd

    rows = []
    for teacher, probs in probs_by_teacher.items():
        try:
            d = diagnostics(probs, labels, label_space)
        except ValueError as err:
            raise ValueError(f"teacher {teacher!r}: {err}") from None
        info = d["informativeness"]
        rows.append({
            "teacher": teacher,
            "n": int(_as_numpy(probs).shape[0]),
            "informativeness": info,
            "semantic_distance": d["semantic_distance"],
            "sd_constant": d["sd_constant"],
            "sd_skill": d["sd_skill"],
            "passes": bool(np.isfinite(info) and info >= threshold),
        })
    return pd.DataFrame(rows, columns=["teacher", "n", "informativeness", "semantic_distance", "sd_constant",
                                       "sd_skill", "passes"])
