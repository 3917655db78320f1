"""Calibrated gradients (FedBary eq. 10) against hand computations, POT's network-simplex duals and the optimality
conditions of the entropic and exact duals (the Sinkhorn path runs POT's ``sinkhorn_log``)."""
from __future__ import annotations

import warnings

import numpy as np
import ot
import pytest
from scipy.special import logsumexp

from otfed.errors import OTConvergenceError
from otfed.ot import Measure, exact_plan
from otfed.valuation import (budget_removal, calibrated_gradient, datum_values, dual_potential, flag_noisy,
                             flagged_removal, most_suspicious, random_removal, rank_by_value)
from otfed.valuation.calibrated import solve_dual_potential


def test_two_points_hand_case() -> None:
    a, b = 3.7, -1.2
    np.testing.assert_allclose(calibrated_gradient(np.array([a, b])), [a - b, b - a])


def test_definition_and_shift_invariance() -> None:
    rng = np.random.default_rng(0)
    f = rng.standard_normal(7)
    m = f.size
    expected = np.array([f[l] - sum(f[j] for j in range(m) if j != l) / (m - 1) for l in range(m)])
    g = calibrated_gradient(f)
    np.testing.assert_allclose(g, expected, rtol=1e-12)
    # the authors' form (1 + 1/(m−1)) f − Σf/(m−1)
    np.testing.assert_allclose(g, (1 + 1 / (m - 1)) * f - f.sum() / (m - 1), rtol=1e-12)
    np.testing.assert_allclose(calibrated_gradient(f + 123.4), g, atol=1e-12)
    with pytest.raises(ValueError):
        calibrated_gradient(np.array([1.0]))


def test_exact_potential_is_pot_dual_and_certifies_the_optimum() -> None:
    """f from ``potential="exact"`` is POT's network-simplex dual (up to a constant): with the matching g,
    <f, a> + <g, b> equals ot.emd2 and f_i + g_j ≤ M_ij."""
    rng = np.random.default_rng(1)
    X, Y = rng.standard_normal((9, 2)), rng.standard_normal((6, 2)) + 1.0
    a, b = rng.dirichlet(np.ones(9)), rng.dirichlet(np.ones(6))
    f = dual_potential(Measure(X, a), Measure(Y, b), potential="exact")
    M = ot.dist(X, Y)
    # recover g as the c-transform of f and check strong duality against POT's primal value
    g = np.min(M - f[:, None], axis=0)
    assert np.all(f[:, None] + g[None, :] <= M + 1e-9)
    np.testing.assert_allclose(f @ a + g @ b, ot.emd2(a, b, M), rtol=1e-9)


def _weighted_problem(n: int, m: int, seed: int) -> tuple[Measure, Measure, np.ndarray]:
    rng = np.random.default_rng(seed)
    X, Y = rng.standard_normal((n, 2)), rng.standard_normal((m, 2)) + 0.5
    source, target = Measure(X, rng.dirichlet(np.ones(n))), Measure(Y, rng.dirichlet(np.ones(m)))
    return source, target, ot.dist(X, Y)


@pytest.mark.parametrize("eps_rel", [0.5, 0.1, 0.02])
def test_sinkhorn_potential_solves_the_entropic_dual(eps_rel: float) -> None:
    """The Sinkhorn f (POT's ``sinkhorn_log``) is an optimal entropic potential, checked without POT: with g its
    soft c-transform g_j = ε log b_j − ε LSE_i((f_i − M_ij)/ε), the plan exp((f_i + g_j − M_ij)/ε) has column
    marginal b by construction and row marginal a — the optimality condition of the entropic dual."""
    source, target, M = _weighted_problem(40, 30, 0)
    a, b, eps = source.weights, target.weights, eps_rel * M.mean()
    f = dual_potential(source, target, potential="sinkhorn", eps_rel=eps_rel, tol=1e-10, max_iter=200_000)
    g = eps * (np.log(b) - logsumexp((f[:, None] - M) / eps, axis=0))
    plan = np.exp((f[:, None] + g[None, :] - M) / eps)
    np.testing.assert_allclose(plan.sum(axis=0), b, rtol=1e-12)
    assert np.abs(plan.sum(axis=1) - a).sum() <= 1e-8


def test_sinkhorn_gradient_tends_to_the_unique_lp_one_as_eps_shrinks() -> None:
    """On a problem whose exact plan is a non-degenerate basis (n + m − 1 positive entries) the LP dual is unique
    up to a constant — solved here from f_i + g_j = M_ij on the plan's support — and the calibrated gradients of
    the Sinkhorn potentials converge to its calibrated gradient as ε → 0."""
    n, m = 8, 6
    source, target, M = _weighted_problem(n, m, 0)
    support = np.argwhere(exact_plan(source.weights, target.weights, M) > 1e-12)
    assert len(support) == n + m - 1
    A = np.zeros((n + m, n + m))
    rhs = np.zeros(n + m)
    for k, (i, j) in enumerate(support):
        A[k, i] = A[k, n + j] = 1.0
        rhs[k] = M[i, j]
    A[-1, :n] = 1.0  # fix the constant: Σ f = 0
    duals = np.linalg.solve(A, rhs)
    f_lp, g_lp = duals[:n], duals[n:]
    assert np.all(f_lp[:, None] + g_lp[None, :] <= M + 1e-12)  # dual feasible, hence optimal
    truth = calibrated_gradient(f_lp)
    errors = [np.abs(calibrated_gradient(dual_potential(source, target, eps_rel=e, tol=1e-10, max_iter=1_000_000))
                     - truth).max() / np.ptp(truth) for e in (0.1, 0.01, 0.001)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 5e-3  # measured 1.2e-3 (ε·const: 6.7e-2, 1.0e-2 at eps_rel 0.1, 0.01)


def test_sinkhorn_non_convergence_raises_and_is_reported() -> None:
    """A budget of 3 Newton steps at a tiny ε cannot converge: dual_potential raises, naming the remaining change;
    solve_dual_potential and datum_values(with_convergence=True) return the potential with converged=False."""
    source, target, _ = _weighted_problem(40, 30, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OTConvergenceError, match=r"did not converge in 3 Newton steps \(remaining change"):
            dual_potential(source, target, potential="sinkhorn", eps_rel=1e-3, max_iter=3)
    assert not [w for w in caught if "did not converge" in str(w.message)]
    report = solve_dual_potential(source, target, eps_rel=1e-3, max_iter=3).convergence
    assert (report.iterations, report.converged) == (3, False) and report.criterion > report.tol
    _, report = datum_values(source, target, eps_rel=1e-3, max_iter=3, with_convergence=True)
    assert not report.converged
    # the default settings converge, and say so
    _, report = datum_values(source, target, with_convergence=True)
    assert report.converged and report.criterion <= report.tol == 1e-9 and report.potential == "sinkhorn"
    with pytest.raises(ValueError, match="eps_rel"):
        dual_potential(source, target, potential="sinkhorn", eps_rel=0.0)


def test_far_point_gets_the_largest_positive_gradient() -> None:
    rng = np.random.default_rng(3)
    clean = rng.standard_normal((30, 2))
    train = np.vstack([clean, [[12.0, -9.0]]])
    values = datum_values(Measure.uniform(train), Measure.uniform(rng.standard_normal((30, 2))))
    assert rank_by_value(values)[0] == 30 and flag_noisy(values)[30]
    np.testing.assert_allclose(values.sum(), 0.0, atol=1e-9)  # m/(m−1)·(f − mean f) sums to 0


def test_removal_masks_pick_the_most_suspicious_by_hand() -> None:
    """Budget, flag and random removal masks (FedBary table 4) against hand-picked indices."""
    g = np.array([0.5, -1.0, 2.0, 0.5, 3.0, -0.2, 0.1])
    # order by descending g, ties by index: 4 (3.0), 2 (2.0), 0 (0.5), 3 (0.5), 6 (0.1), 5, 1
    assert np.flatnonzero(most_suspicious(g, 3)).tolist() == [0, 2, 4]
    assert np.flatnonzero(budget_removal(g, 0.5)).tolist() == [0, 2, 4]  # ⌊0.5 · 7⌋ = 3
    assert not budget_removal(g, 0.1).any()  # ⌊0.7⌋ = 0
    assert np.flatnonzero(flagged_removal(g)).tolist() == [0, 2, 3, 4, 6]  # every g > 0
    assert np.flatnonzero(flagged_removal(g, max_fraction=0.3)).tolist() == [2, 4]  # capped at ⌊2.1⌋ = 2
    masks = [budget_removal(g, 0.5), np.zeros(4, dtype=bool)]
    drawn = random_removal(masks, np.random.default_rng(3))
    assert [int(m.sum()) for m in drawn] == [3, 0] and [len(m) for m in drawn] == [7, 4]
    again = random_removal(masks, np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip(drawn, again))
