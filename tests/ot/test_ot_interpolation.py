"""FedWaD interpolating measures: theorem 1, endpoints and the W_2 geodesic property."""

import numpy as np
import pytest

from otfed.ot import Measure, exact_plan, cost_matrix, interpolate_approx, interpolate_exact, interpolating_measure, wasserstein


def _sorted_rows(A):
    return A[np.lexsort(A.T[::-1])]


def _plan(mu, nu):
    return exact_plan(mu.weights, nu.weights, cost_matrix(mu.support, nu.support, 2))


def test_theorem1_approx_equals_exact_for_uniform_equal_size_measures():
    rng = np.random.default_rng(0)
    mu = Measure.uniform(rng.normal(size=(40, 3)))
    nu = Measure.uniform(rng.normal(size=(40, 3)) + 2.0)
    plan = _plan(mu, nu)
    for t in (0.2, 0.5, 0.9):
        approx = interpolate_approx(mu, nu, plan, t)
        exact = interpolate_exact(mu, nu, plan, t)
        assert exact.n == 40  # a permutation plan has n atoms
        np.testing.assert_allclose(_sorted_rows(approx.support), _sorted_rows(exact.support), atol=1e-12)
        np.testing.assert_allclose(exact.weights, 1 / 40, atol=1e-15)


def test_endpoints_are_mu_and_the_matched_nu_support():
    rng = np.random.default_rng(1)
    mu = Measure.uniform(rng.normal(size=(20, 2)))
    nu = Measure.uniform(rng.normal(size=(20, 2)) * 3)
    plan = _plan(mu, nu)
    perm = plan.argmax(axis=1)
    np.testing.assert_allclose(interpolate_approx(mu, nu, plan, 0.0).support, mu.support, atol=1e-14)
    np.testing.assert_allclose(interpolate_approx(mu, nu, plan, 1.0).support, nu.support[perm], atol=1e-12)
    np.testing.assert_allclose(_sorted_rows(interpolate_exact(mu, nu, plan, 1.0).support), _sorted_rows(nu.support), atol=1e-14)


@pytest.mark.parametrize("t", [0.25, 0.6])
def test_exact_interpolant_lies_on_the_w2_geodesic(t):
    rng = np.random.default_rng(2)
    mu = Measure(rng.normal(size=(30, 2)), rng.dirichlet(np.ones(30)))
    nu = Measure(rng.normal(size=(45, 2)) + np.array([3.0, -1.0]), rng.dirichlet(np.ones(45)))
    xi, w = interpolating_measure(mu, nu, t, mode="exact")
    assert xi.n <= mu.n + nu.n - 1
    W = wasserstein(mu.support, nu.support, mu.weights, nu.weights)
    assert w == pytest.approx(W, rel=1e-12)
    assert wasserstein(mu.support, xi.support, mu.weights, xi.weights) == pytest.approx(t * W, rel=1e-8)
    assert wasserstein(xi.support, nu.support, xi.weights, nu.weights) == pytest.approx((1 - t) * W, rel=1e-8)


def test_exact_interpolant_keeps_tiny_masses_that_an_absolute_cut_would_drop():
    # one atom of μ carries mass 1e-9, far below the authors' absolute 1e-5 threshold
    rng = np.random.default_rng(3)
    weights = np.full(10, (1 - 1e-9) / 9)
    weights[4] = 1e-9
    mu = Measure(rng.normal(size=(10, 2)), weights)
    nu = Measure.uniform(rng.normal(size=(12, 2)))
    plan = _plan(mu, nu)
    xi = interpolate_exact(mu, nu, plan, 0.5)
    assert xi.n == np.count_nonzero(plan)  # every positive entry of the vertex plan is an atom
    j = int(plan[4].argmax())
    hit = np.all(np.isclose(xi.support, 0.5 * mu.support[4] + 0.5 * nu.support[j], atol=1e-14), axis=1)
    assert xi.weights[hit].sum() == pytest.approx(1e-9, rel=1e-6)


def test_approx_interpolant_uses_barycentric_projection_with_nonuniform_weights():
    # hand-computed: x = {0, 10} with a = (1/4, 3/4); y = {1, 2, 3} uniform
    mu = Measure(np.array([[0.0], [10.0]]), np.array([0.25, 0.75]))
    nu = Measure.uniform(np.array([[1.0], [2.0], [3.0]]))
    plan = _plan(mu, nu)  # monotone: x=0 takes 1/4 of y=1; x=10 takes 1/12 of y=1, all of y=2 and y=3
    xi = interpolate_approx(mu, nu, plan, 1.0)
    np.testing.assert_allclose(xi.support[:, 0], [1.0, (1 / 12 * 1 + 1 / 3 * 2 + 1 / 3 * 3) / 0.75], atol=1e-12)
    np.testing.assert_allclose(xi.weights, mu.weights)


def test_interpolating_measure_rejects_bad_t_and_mode():
    mu = Measure.uniform(np.zeros((2, 1)))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        interpolating_measure(mu, mu, 1.5)
    with pytest.raises(ValueError, match="approx, exact"):
        interpolating_measure(mu, mu, 0.5, mode="mccann")


def test_semidual_solver_gives_the_network_simplex_interpolant_on_generic_data():
    rng = np.random.default_rng(4)
    xi0 = Measure.uniform(rng.normal(size=(8, 2)))
    data = Measure.uniform(rng.normal(size=(600, 2)) + 2.0)
    exact, w_exact = interpolating_measure(xi0, data, 0.3, mode="approx")
    fast, w_fast = interpolating_measure(xi0, data, 0.3, mode="approx", solver="semidual_newton")
    np.testing.assert_allclose(fast.support, exact.support, atol=1e-7)
    assert w_fast == pytest.approx(w_exact, rel=1e-7)
