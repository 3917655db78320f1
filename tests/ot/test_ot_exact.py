"""Exact OT: cost matrix, network simplex plan and W_p against POT's solvers and 1-D closed forms."""

import numpy as np
import ot
import pytest

from otfed.errors import OTConvergenceError
from otfed.ot import Measure, cost_matrix, exact_plan, optimal_transport, wasserstein


def test_cost_matrix_matches_brute_force_distances():
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(7, 3)), rng.normal(size=(5, 3))
    brute = np.linalg.norm(X[:, None, :] - Y[None, :, :], axis=-1)
    np.testing.assert_allclose(cost_matrix(X, Y, 1), brute, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cost_matrix(X, Y, 2), brute**2, rtol=1e-12, atol=1e-12)


def test_cost_matrix_is_exactly_zero_for_coincident_points_and_accurate_far_from_the_origin():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3)) + 1e6  # the plain expansion ||x||²+||y||²−2x·y loses ~all digits here
    Y = np.vstack([X[:10], X[:10] + 1e-4, rng.normal(size=(5, 3)) + 1e6])
    brute = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(axis=-1)
    C = cost_matrix(X, Y, 2)
    np.testing.assert_array_equal(np.diag(C[:10, :10]), 0.0)
    np.testing.assert_allclose(C, brute, rtol=1e-9, atol=0)
    np.testing.assert_allclose(cost_matrix(X, Y, 1), np.sqrt(brute), rtol=1e-9, atol=0)
    with pytest.raises(ValueError, match="p in"):
        cost_matrix(X, Y, 3)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize(("n", "m", "uniform"), [(30, 30, True), (25, 40, True), (33, 17, False)])
def test_wasserstein_equals_pot_emd2(p, n, m, uniform):
    rng = np.random.default_rng(n * m + p)
    X, Y = rng.normal(size=(n, 2)), rng.normal(size=(m, 2)) + 1.5
    if uniform:
        a, b = np.full(n, 1 / n), np.full(m, 1 / m)
    else:
        a, b = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m))
    expected = ot.emd2(a, b, ot.dist(X, Y, metric="sqeuclidean" if p == 2 else "euclidean"), numItermax=10**7) ** (1 / p)
    assert wasserstein(X, Y, a, b, p=p) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("p", [1, 2])
def test_wasserstein_in_1d_equals_sorted_sample_closed_form(p):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=50), rng.exponential(size=50)
    closed_form = np.mean(np.abs(np.sort(x) - np.sort(y)) ** p) ** (1 / p)
    assert wasserstein(x[:, None], y[:, None], p=p) == pytest.approx(closed_form, rel=1e-10)
    # unequal sizes with weights: POT's 1-D quantile solver is an independent reference
    z = rng.normal(size=31) * 2
    wz = rng.dirichlet(np.ones(31))
    ref = ot.wasserstein_1d(x, z, np.full(50, 1 / 50), wz, p=p) ** (1 / p)
    assert wasserstein(x, z, None, wz, p=p) == pytest.approx(ref, rel=1e-9)


def test_normalising_the_cost_by_its_max_leaves_the_plan_unchanged():
    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(40, 3)) * 50, rng.normal(size=(40, 3)) * 50
    a = rng.dirichlet(np.ones(40))
    b = rng.dirichlet(np.ones(40))
    M = cost_matrix(X, Y, 2)
    plan_raw = ot.emd(a, b, M, numItermax=10**7)
    np.testing.assert_allclose(exact_plan(a, b, M), plan_raw, atol=1e-14)
    np.testing.assert_allclose(exact_plan(a, b, M * 1e-6), plan_raw, atol=1e-14)


def test_exact_plan_raises_when_num_itermax_is_hit():
    rng = np.random.default_rng(5)
    M = cost_matrix(rng.normal(size=(200, 2)), rng.normal(size=(200, 2)), 2)
    u = np.full(200, 1 / 200)
    with pytest.raises(OTConvergenceError, match=r"numItermax=10 .*200×200"):
        exact_plan(u, u, M, num_itermax=10)


def test_optimal_transport_dispatch_and_unknown_solver():
    rng = np.random.default_rng(6)
    mu, nu = Measure.uniform(rng.normal(size=(12, 2))), Measure.uniform(rng.normal(size=(300, 2)))
    exact = optimal_transport(mu, nu, p=2)
    assert exact.cost == pytest.approx(np.sqrt(ot.emd2(mu.weights, nu.weights, ot.dist(mu.support, nu.support))), rel=1e-9)
    fast = optimal_transport(mu, nu, p=2, solver="semidual_newton")
    assert fast.cost == pytest.approx(exact.cost, rel=1e-6)
    np.testing.assert_allclose(fast.plan.sum(axis=1), mu.weights, atol=1e-12)
    with pytest.raises(ValueError, match="network_simplex, semidual_newton"):
        optimal_transport(mu, nu, solver="sinkhorn")


@pytest.mark.parametrize("shape", [(10, 200), (1, 7), (30, 30), (200, 13)])
def test_exact_plan_is_pots_plan_bit_for_bit(shape):
    """The lean call of POT's compiled solver gives ``ot.emd``'s plan exactly — on uniform and random weights,
    a Fortran-ordered cost and masses that differ within POT's tolerance (b is rescaled as POT does) — and
    on zero weights, which go through ``ot.emd`` itself."""
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    n, m = shape
    X, Y = rng.normal(size=(n, 5)), rng.normal(size=(m, 5))
    M = cost_matrix(X, Y, 2)
    M_solve = M / M.max()
    for a, b in [(np.full(n, 1 / n), np.full(m, 1 / m)),
                 (rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m)) * (1 + 1e-7))]:
        expected = ot.emd(a, b, M_solve, numItermax=10**7)
        assert np.array_equal(exact_plan(a, b, M), expected)
        assert np.array_equal(exact_plan(b, a, np.asfortranarray(M.T)), ot.emd(b, a, M_solve.T.copy(), numItermax=10**7))
    if n > 1:
        a = np.full(n, 1 / (n - 1))
        a[0] = 0.0
        b = np.full(m, 1 / m)
        assert np.array_equal(exact_plan(a, b, M), ot.emd(a, b, M_solve, numItermax=10**7))


def test_exact_plan_refuses_marginals_of_different_mass():
    M = cost_matrix(np.arange(3.0), np.arange(4.0), 2)
    with pytest.raises(ValueError, match="same mass"):
        exact_plan(np.full(3, 1 / 3), np.full(4, 0.3), M)


def test_without_pots_private_entry_point_ot_emd_gives_the_same_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """``emd_c`` is POT's private compiled solver; were a POT upgrade to move it, ``exact_plan`` calls ``ot.emd``
    and gets the same plan bit for bit (both run the same network simplex on the same inputs)."""
    import otfed.ot.exact as exact_module

    rng = np.random.default_rng(5)
    a, b = rng.dirichlet(np.ones(30)), rng.dirichlet(np.ones(40))
    M = ot.dist(rng.normal(size=(30, 3)), rng.normal(size=(40, 3)))
    with_private = exact_module.exact_plan(a, b, M)
    monkeypatch.setattr(exact_module, "emd_c", None)
    np.testing.assert_array_equal(exact_module.exact_plan(a, b, M), with_private)


def test_a_non_optimal_result_code_names_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A result code other than optimal / max-iterations (e.g. 2, unbounded) is an OTConvergenceError naming it
    (before, this path read an undefined POT log and raised NameError)."""
    import otfed.ot.exact as exact_module

    monkeypatch.setattr(exact_module, "_network_simplex", lambda a, b, M, n: (np.zeros((len(a), len(b))), 2))
    with pytest.raises(OTConvergenceError, match=r"result code 2: unbounded"):
        exact_module.exact_plan(np.full(3, 1 / 3), np.full(2, 0.5), np.ones((3, 2)))
