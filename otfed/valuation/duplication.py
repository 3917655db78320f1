"""Duplication robustness (FedBary table 3): a client's data duplicated, as measures, and the exact
W_p they are compared with.

* :func:`repeated_dataset` — a whole dataset appearing k times: the same measure, so W_p(·, Q) is unchanged.
* :func:`repeated_datum` — one datum appearing k times in a uniform (empirical) measure.
* :func:`mass_moved_by_duplication` — the mass δ that duplicating one datum moves to it; δ · g_l
  (calibrated gradient, eq. 10) is a first-order lower bound on the change of W_p^p.
* :func:`exact_wasserstein` — W_p by POT's network simplex, an independent reference for FedBary's estimate.
"""
from __future__ import annotations

import numpy as np
import ot

from otfed.errors import OTConvergenceError
from otfed.ot import Measure


def repeated_dataset(measure: Measure, copies: int) -> Measure:
    """``measure`` with every atom repeated ``copies`` times (a client's whole dataset duplicated
    copies − 1 times), each copy carrying 1/copies of the atom's mass. It is the same measure, so
    W_p(·, Q) is unchanged for every Q — the invariance of FedBary table 3."""
    if copies < 1:
        raise ValueError(f"copies must be ≥ 1, got {copies}")
    return Measure(np.tile(measure.support, (copies, 1)), np.tile(measure.weights, copies) / copies)


def repeated_datum(measure: Measure, index: int, copies: int) -> Measure:
    """The uniform measure on a client's n data with datum ``index`` appearing ``copies`` times
    (duplicated copies − 1 times): n + copies − 1 atoms of mass 1/(n + copies − 1). ``measure`` must be
    uniform (an empirical measure)."""
    n = measure.n
    if not 0 <= index < n:
        raise ValueError(f"datum index {index} is out of range for a measure with {n} atoms")
    if copies < 1:
        raise ValueError(f"copies must be ≥ 1, got {copies}")
    if not np.allclose(measure.weights, 1.0 / n, rtol=1e-9, atol=0.0):
        raise ValueError("repeated_datum needs a uniform (empirical) measure")
    extra = np.repeat(measure.support[index:index + 1], copies - 1, axis=0)
    return Measure.uniform(np.vstack([measure.support, extra]))


def mass_moved_by_duplication(n: int, copies: int) -> float:
    """δ such that duplicating one of n uniform data to ``copies`` copies moves mass δ to it from all
    other data equally: its weight goes 1/n → 1/n + δ = copies/(n + copies − 1), every other datum's
    1/n → 1/n − δ/(n − 1). δ = (n − 1)(copies − 1) / (n (n + copies − 1)).

    This is the direction of the calibrated gradient g_l (FedBary eq. 10), and W_p^p is convex in the
    weights with the optimal dual potential as a subgradient, so ΔW_p^p ≥ δ · g_l for exact duals."""
    if n < 2 or copies < 1:
        raise ValueError(f"need n ≥ 2 data and copies ≥ 1, got n={n}, copies={copies}")
    return (n - 1) * (copies - 1) / (n * (n + copies - 1))


def exact_wasserstein(mu: Measure, nu: Measure, p: int = 2, num_itermax: int = 100_000_000) -> float:
    """W_p(μ, ν) by POT's network simplex (``ot.emd2`` on ``ot.dist``'s ground cost ||x − y||^p), with a
    large ``num_itermax`` and its optimality flag checked (:class:`OTConvergenceError` otherwise). An
    independent reference for FedBary's estimate (it shares no code with otfed's solvers)."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p}")
    M = ot.dist(mu.support, nu.support, metric="sqeuclidean" if p == 2 else "euclidean")
    value, log = ot.emd2(mu.weights, nu.weights, M, numItermax=int(num_itermax), log=True)
    if int(log.get("result_code", 1)) != 1:
        raise OTConvergenceError(f"ot.emd2 stopped before optimality on a {mu.n}×{nu.n} problem "
                                 f"({log.get('warning')}); raise num_itermax")
    return float(max(float(value), 0.0) ** (1.0 / p))
