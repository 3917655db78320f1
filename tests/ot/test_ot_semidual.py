"""Semi-dual Newton solver against the exact network simplex."""

import numpy as np
import pytest

from otfed.ot import cost_matrix, exact_plan, semidual_plan
from otfed.ot.semidual import _semidual_solve


def _problem(S, n, d, seed, uniform_small=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(S, d))
    Y = rng.normal(size=(n, d)) + 1.0
    a = np.full(S, 1 / S) if uniform_small else rng.dirichlet(np.ones(S) * 3)
    b = np.full(n, 1 / n)
    return X, Y, a, b, cost_matrix(X, Y, 2)


@pytest.mark.parametrize(("S", "n", "d", "uniform_small"), [(10, 3000, 2, True), (25, 1500, 5, False), (4, 800, 1, True)])
def test_semidual_matches_exact_cost_marginals_and_barycentric_projection(S, n, d, uniform_small):
    X, Y, a, b, M = _problem(S, n, d, seed=S + n, uniform_small=uniform_small)
    plan, g = semidual_plan(a, b, M)
    exact = exact_plan(a, b, M)
    assert g.shape == (S,)
    np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-12)
    assert np.abs(plan.sum(axis=0) - b).sum() <= 1e-9
    cost, cost_exact = (plan * M).sum(), (exact * M).sum()
    eps_bound = 1e-7 * M.mean() * np.log(S)  # ε·log S excess bound of the entropic plan
    assert cost_exact * (1 - 1e-9) <= cost <= cost_exact + eps_bound + 1e-12  # 1e-9: marginal tolerance
    assert abs(cost - cost_exact) / cost_exact < 1e-4
    np.testing.assert_allclose(plan @ Y / a[:, None], exact @ Y / a[:, None], atol=1e-6)


def test_small_side_may_be_either_argument():
    X, Y, a, b, M = _problem(8, 1000, 2, seed=7)
    plan_ab, g_ab = semidual_plan(a, b, M)
    plan_ba, g_ba = semidual_plan(b, a, M.T)
    np.testing.assert_allclose(plan_ba, plan_ab.T, atol=1e-15)
    np.testing.assert_allclose(g_ba, g_ab, atol=1e-9)


def test_warm_start_from_the_solution_needs_no_newton_step_and_reproduces_the_plan():
    X, Y, a, b, M = _problem(12, 2000, 2, seed=8)
    plan, g, cold_steps = _semidual_solve(a, b, M)
    plan_w, g_w, warm_steps = _semidual_solve(a, b, M, g_init=g)
    assert cold_steps > 5 and warm_steps == 0
    np.testing.assert_allclose(plan_w, plan, atol=1e-15)
    # a nearby problem (the small support moved slightly) converges to its own exact solution in fewer steps
    rng = np.random.default_rng(9)
    M2 = cost_matrix(X + 1e-3 * rng.normal(size=X.shape), Y, 2)
    plan2, _, steps2 = _semidual_solve(a, b, M2, g_init=g)
    _, _, steps2_cold = _semidual_solve(a, b, M2)
    assert steps2 < steps2_cold
    exact2 = exact_plan(a, b, M2)
    np.testing.assert_allclose(plan2 @ Y / a[:, None], exact2 @ Y / a[:, None], atol=1e-6)


def test_zero_weight_atoms_get_no_mass():
    X, Y, a, b, M = _problem(6, 500, 2, seed=10)
    a = a.copy()
    a[2] = 0.0
    a /= a.sum()
    plan, g = semidual_plan(a, b, M)
    assert np.all(plan[2] == 0) and g[2] == -np.inf
    exact = exact_plan(a, b, M)
    assert (plan * M).sum() == pytest.approx((exact * M).sum(), rel=1e-6)


def test_p1_cost_and_permutation_case():
    # equal sizes, uniform: the exact plan is a permutation; the semi-dual must find it
    rng = np.random.default_rng(11)
    X, Y = rng.normal(size=(30, 2)), rng.normal(size=(30, 2))
    u = np.full(30, 1 / 30)
    for p in (1, 2):
        M = cost_matrix(X, Y, p)
        plan, _ = semidual_plan(u, u, M)
        np.testing.assert_allclose(plan, exact_plan(u, u, M), atol=1e-8)
