"""FedWaD interpolating measures on the Wasserstein geodesic between μ (t = 0) and ν (t = 1) (FedWaD eq. 5, 10)."""

from __future__ import annotations

import numpy as np

from otfed.ot.exact import SOLVERS, optimal_transport
from otfed.ot.measures import Measure

#: Interpolation modes accepted by :func:`interpolating_measure`.
MODES = ("approx", "exact")


def _check(mu: Measure, nu: Measure, plan: np.ndarray, t: float) -> np.ndarray:
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"interpolation time t must lie in [0, 1], got {t!r}")
    if mu.dim != nu.dim:
        raise ValueError(f"measures live in different dimensions: {mu.dim} vs {nu.dim}")
    plan = np.asarray(plan, dtype=np.float64)
    if plan.shape != (mu.n, nu.n):
        raise ValueError(f"plan has shape {plan.shape}, expected ({mu.n}, {nu.n}) for μ with {mu.n} and ν with {nu.n} atoms")
    return plan


def interpolate_exact(mu: Measure, nu: Measure, plan: np.ndarray, t: float, rel_threshold: float = 1e-12) -> Measure:
    """Exact McCann interpolant ξ_t = Σ_ij P_ij δ_{(1−t)x_i + t y_j} — FedWaD eq. 5.

    Every pair with P_ij > ``rel_threshold``·max(P) becomes an atom (1−t)x_i + t·y_j with weight P_ij;
    the weights are renormalised to sum to 1. The threshold is *relative* to the largest entry: the
    authors' absolute 1e-5 cut drops every atom once masses fall below 1e-5.
    For a vertex (network-simplex) plan the support has at most n + m − 1 atoms. With the optimal plan
    for the cost ||x − y||², t ↦ ξ_t is a constant-speed W_2 geodesic: W_2(μ, ξ_t) = t·W_2(μ, ν).

    Parameters:
        mu, nu: the measures at t = 0 and t = 1, of the same dimension.
        plan: a transport plan between them, μ.n × ν.n (the optimal one for the geodesic, e.g.
            :func:`~otfed.ot.optimal_transport`'s ``plan``).
        t: the time, in [0, 1].
        rel_threshold: plan entries at or below this fraction of the largest entry are dropped.

    Returns:
        ξ_t, a :class:`Measure` with one atom per kept plan entry.

    Raises ValueError for t outside [0, 1], a plan of the wrong shape or without a positive entry.

    Closed forms: between two Diracs ξ_t is the Dirac at (1 − t)x + t·y; with the optimal plan the interpolant
    lies on the geodesic, W₂(μ, ξ_t) = t·W₂(μ, ν) and W₂(ξ_t, ν) = (1 − t)·W₂(μ, ν) (FedWaD eq. 4), each
    computed by POT's exact ``ot.emd2``:

    >>> import ot
    >>> from otfed.ot import optimal_transport
    >>> xi = interpolate_exact(Measure.uniform(np.array([[0.0, 0.0]])), Measure.uniform(np.array([[4.0, 2.0]])),
    ...                        np.ones((1, 1)), 0.25)
    >>> xi.support.tolist(), xi.weights.tolist()
    ([[1.0, 0.5]], [1.0])
    >>> def w2(m, n):
    ...     return np.sqrt(ot.emd2(m.weights, n.weights, ot.dist(m.support, n.support)))
    >>> rng = np.random.default_rng(0)
    >>> mu = Measure.uniform(rng.normal(size=(6, 2)))
    >>> nu = Measure(rng.normal(size=(4, 2)) + 3.0, np.array([0.1, 0.2, 0.3, 0.4]))
    >>> xi = interpolate_exact(mu, nu, optimal_transport(mu, nu).plan, 0.3)
    >>> xi.n <= 6 + 4 - 1, bool(np.isclose(w2(mu, xi), 0.3 * w2(mu, nu))), bool(np.isclose(w2(xi, nu), 0.7 * w2(mu, nu)))
    (True, True, True)
    """
    plan = _check(mu, nu, plan, t)
    p_max = float(plan.max())
    if not p_max > 0:
        raise ValueError("transport plan has no positive entry")
    rows, cols = np.nonzero(plan > rel_threshold * p_max)
    support = (1.0 - t) * mu.support[rows] + t * nu.support[cols]
    weights = plan[rows, cols]
    return Measure(support, weights / weights.sum())


def interpolate_approx(mu: Measure, nu: Measure, plan: np.ndarray, t: float) -> Measure:
    """Barycentric-projection interpolant — FedWaD eq. 10: atoms (1−t)x_i + t·(P Y)_i / a_i, weights a.

    a_i is μ's weight of atom i (the row sum of the plan; for uniform a this is the paper's
    (1−t)x_i + t·n·(P Y)_i). Atoms with a_i = 0 keep x_i. The support stays μ's n atoms; for uniform
    μ and ν of equal size, where the optimal plan is a permutation / n, it equals
    :func:`interpolate_exact` (FedWaD theorem 1). The division uses the plan's own row sums, which
    equal a_i for a feasible plan, so each projection is a convex combination of ν's atoms.

    Parameters:
        mu, nu: the measures at t = 0 and t = 1, of the same dimension.
        plan: a transport plan between them, μ.n × ν.n (optimal for FedWaD; any feasible plan is accepted).
        t: the time, in [0, 1].

    Returns:
        The interpolant, a :class:`Measure` on μ's n atoms moved to (1 − t)x_i + t·(P Y)_i / a_i, with μ's weights.

    Raises ValueError for t outside [0, 1] or a plan of the wrong shape.

    The Dirac case is the Dirac at (1 − t)x + t·y; two uniform clouds of 5 points give eq. 5's interpolant
    (FedWaD theorem 1, atom for atom); and at t = 1 the projections of a feasible plan keep ν's mean,
    Σ_i a_i (P Y)_i / a_i = Σ_j b_j y_j:

    >>> from otfed.ot import optimal_transport
    >>> dirac = interpolate_approx(Measure.uniform(np.array([[0.0, 0.0]])), Measure.uniform(np.array([[4.0, 2.0]])),
    ...                            np.ones((1, 1)), 0.25)
    >>> dirac.support.tolist()
    [[1.0, 0.5]]
    >>> rng = np.random.default_rng(0)
    >>> mu, nu = Measure.uniform(rng.normal(size=(5, 2))), Measure.uniform(rng.normal(size=(5, 2)) + 2.0)
    >>> plan = optimal_transport(mu, nu).plan
    >>> bool(np.allclose(interpolate_approx(mu, nu, plan, 0.4).support, interpolate_exact(mu, nu, plan, 0.4).support))
    True
    >>> mu, nu = Measure.uniform(rng.normal(size=(3, 2))), Measure.uniform(rng.normal(size=(7, 2)) + 2.0)
    >>> end = interpolate_approx(mu, nu, optimal_transport(mu, nu).plan, 1.0)
    >>> end.n, bool(np.allclose(end.weights @ end.support, nu.weights @ nu.support))
    (3, True)
    """
    plan = _check(mu, nu, plan, t)
    row_mass = plan.sum(axis=1)
    target = mu.support.copy()
    moved = row_mass > 0
    target[moved] = (plan[moved] @ nu.support) / row_mass[moved, None]
    support = (1.0 - t) * mu.support + t * target
    return Measure(support, mu.weights)


def interpolating_measure(
    mu: Measure,
    nu: Measure,
    t: float,
    p: int = 2,
    mode: str = "approx",
    solver: str = "network_simplex",
    **solver_options,
) -> tuple[Measure, float]:
    """The FedWaD interpolating measure between μ and ν at time t, and W_p(μ, ν) (FedWaD eq. 5, 10).

    Solves the optimal plan P for the cost ||x − y||^p (``solver`` as in
    :func:`otfed.ot.optimal_transport`, which receives ``solver_options``), then builds the interpolant with FedWaD eq. 10 (``mode="approx"``,
    :func:`interpolate_approx`) or eq. 5 (``mode="exact"``, :func:`interpolate_exact`).
    Returns ``(ξ_t, W_p(μ, ν))``.

    Parameters:
        mu, nu: the measures at t = 0 and t = 1, of the same dimension.
        t: the time, in [0, 1].
        p: the order of the ground cost ||x − y||^p (1 or 2).
        mode: ``"approx"`` (eq. 10: μ's support, FedWaD's default) or ``"exact"`` (eq. 5).
        solver: ``"network_simplex"`` (exact) or ``"semidual_newton"``, as in :func:`otfed.ot.optimal_transport`.
        solver_options: passed to the solver.

    Returns:
        ``(ξ_t, W_p(μ, ν))``: the interpolating measure and the distance of the plan it was built from.

    Raises ValueError for t outside [0, 1], an unknown mode or solver.

    Between two Diracs the interpolant is the Dirac at (1 − t)x + t·y and W₂ the distance of the points;
    eq. 5's interpolant at t = 1/2 is the W₂ midpoint, at W₂/2 from μ (FedWaD eq. 4) by POT's exact ``ot.emd2``:

    >>> import ot
    >>> xi, w = interpolating_measure(Measure.uniform(np.array([[0.0, 0.0]])), Measure.uniform(np.array([[4.0, 3.0]])),
    ...                               0.25)
    >>> xi.support.tolist(), w
    ([[1.0, 0.75]], 5.0)
    >>> rng = np.random.default_rng(0)
    >>> mu, nu = Measure.uniform(rng.normal(size=(3, 2))), Measure.uniform(rng.normal(size=(7, 2)) + 2.0)
    >>> xi, w = interpolating_measure(mu, nu, 0.5, mode="exact")
    >>> bool(np.isclose(np.sqrt(ot.emd2(mu.weights, xi.weights, ot.dist(mu.support, xi.support))), w / 2))
    True
    """
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"interpolation time t must lie in [0, 1], got {t!r}")
    if mode not in MODES:
        raise ValueError(f"unknown interpolation mode {mode!r}; allowed values: {', '.join(MODES)}")
    if solver not in SOLVERS:
        raise ValueError(f"unknown OT solver {solver!r}; allowed values: {', '.join(SOLVERS)}")
    transport = optimal_transport(mu, nu, p=p, solver=solver, **solver_options)
    build = interpolate_approx if mode == "approx" else interpolate_exact
    return build(mu, nu, transport.plan, t), transport.cost
