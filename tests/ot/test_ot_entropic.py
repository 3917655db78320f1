"""Log-domain Sinkhorn against POT and against the exact OT limit."""

import numpy as np
import ot
import pytest

from otfed.ot import cost_matrix, exact_plan, sinkhorn_log


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    X, Y = rng.normal(size=(40, 2)), rng.normal(size=(30, 2)) + 1.0
    a, b = rng.dirichlet(np.ones(40)), rng.dirichlet(np.ones(30))
    M = cost_matrix(X, Y, 2)
    return a, b, M / M.max()


@pytest.mark.parametrize("eps", [0.5, 0.05, 0.01])
def test_sinkhorn_log_plan_matches_pot(eps):
    a, b, M = _problem()
    plan, f, g, converged = sinkhorn_log(a, b, M, eps)
    reference = ot.sinkhorn(a, b, M, eps, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
    assert converged
    np.testing.assert_allclose(plan, reference, atol=1e-6)
    np.testing.assert_allclose(plan, np.exp((f[:, None] + g[None, :] - M) / eps), rtol=1e-12)
    assert np.abs(plan.sum(axis=1) - a).sum() <= 1e-9


def test_sinkhorn_cost_tends_to_the_exact_cost_as_eps_shrinks():
    a, b, M = _problem(1)
    exact = (exact_plan(a, b, M) * M).sum()
    gaps = []
    for eps in (0.1, 0.01, 0.001):
        plan, _, _, converged = sinkhorn_log(a, b, M, eps, max_iter=200_000)
        assert converged
        gaps.append((plan * M).sum() - exact)
    assert gaps[0] > gaps[1] > gaps[2] >= -1e-12
    assert gaps[2] < 1e-3 * np.log(30)  # the ε·log(n) bound of the entropic excess


def test_sinkhorn_reports_non_convergence():
    a, b, M = _problem(2)
    _, _, _, converged = sinkhorn_log(a, b, M, 1e-3, max_iter=3)
    assert not converged
