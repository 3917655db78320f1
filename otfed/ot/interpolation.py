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
