"""Pricing (otfed.ot.pricing_plan): the network simplex on a few arcs, priced against all of them, must return the
optimum of the full problem — checked against POT's dense network simplex (``ot.emd`` / ``ot.emd2``), a closed form
(a cloud and its image under an affine map with a symmetric positive definite matrix: the identity is optimal) and
FedWaD run both ways."""
from __future__ import annotations

import numpy as np
import ot
import pytest

import otfed.ot.exact as exact
from otfed.federation import FedWaDConfig, federated_wasserstein
from otfed.ot import Measure, cost_matrix, exact_plan, gaussian_potentials, optimal_transport, pricing_plan


def clouds(n: int, m: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), 2.0 + 1.5 * rng.normal(size=(m, d))


@pytest.mark.parametrize("n,m,d,seed", [(500, 500, 2, 0), (600, 450, 5, 1), (420, 700, 20, 2), (800, 800, 50, 3)])
def test_pricing_is_pot_optimum(n, m, d, seed):
    x, y = clouds(n, m, d, seed)
    rng = np.random.default_rng(seed + 100)
    a, b = rng.uniform(0.5, 1.5, n), rng.uniform(0.5, 1.5, m)
    a, b = a / a.sum(), b / b.sum()
    M = cost_matrix(x, y, 2)
    reference = ot.emd2(a, b, ot.dist(x, y), numItermax=10**8)
    for potentials in (None, gaussian_potentials(Measure(x, a), Measure(y, b))):
        plan, rounds = pricing_plan(a, b, M, potentials)
        assert rounds >= 1
        np.testing.assert_allclose(plan.sum(axis=1), a, atol=1e-15)
        np.testing.assert_allclose(plan.sum(axis=0), b, atol=1e-15)
        assert (plan >= 0).all()
        assert np.isclose((plan * M).sum(), reference, rtol=1e-12)
        assert np.count_nonzero(plan) <= n + m - 1  # a vertex


def test_uniform_clouds_give_pots_permutation():
    """Equal sizes, uniform weights: the optimum is a permutation, unique for points in general position — pricing
    finds POT's, entry for entry."""
    x, y = clouds(1000, 1000, 5, 7)
    a = np.full(1000, 1e-3)
    dense = ot.emd(a, a, ot.dist(x, y), numItermax=10**8)
    plan = optimal_transport(Measure.uniform(x), Measure.uniform(y)).plan
    assert np.array_equal(plan > 0, dense > 0)
    np.testing.assert_allclose(plan, dense, rtol=0, atol=1e-18)


def test_affine_image_identity_is_optimal_and_potentials_are_tight():
    """y = A x + c with A symmetric positive definite is the gradient of a convex function of x, so the identity
    coupling is optimal (Brenier); the Gaussian potentials are then tight on it: u_i + v_i = ‖x_i − y_i‖²."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 4))
    Q, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    A = Q @ np.diag([0.5, 1.0, 2.0, 3.0]) @ Q.T
    y = x @ A.T + np.array([1.0, -2.0, 0.5, 0.0])
    mu, nu = Measure.uniform(x), Measure.uniform(y)
    u, v = gaussian_potentials(mu, nu)
    M = cost_matrix(x, y, 2)
    assert (M - u[:, None] - v[None, :]).min() >= -1e-9 * M.max()
    np.testing.assert_allclose(u + v, np.diag(M), rtol=1e-9, atol=1e-9)
    plan, _ = pricing_plan(mu.weights, nu.weights, M, (u, v))
    np.testing.assert_array_equal(plan.argmax(axis=1), np.arange(600))
    assert np.isclose((plan * M).sum(), np.diag(M).mean(), rtol=1e-12)


def test_w1_forced_pricing_matches_pot():
    x, y = clouds(450, 500, 3, 4)
    a, b = np.full(450, 1 / 450), np.full(500, 1 / 500)
    M = cost_matrix(x, y, 1)
    plan = exact_plan(a, b, M, method="pricing")
    assert np.isclose((plan * M).sum(), ot.emd2(a, b, ot.dist(x, y, metric="euclidean"), numItermax=10**8),
                      rtol=1e-12)


def test_auto_prices_only_with_potentials(monkeypatch):
    calls = []
    real = exact.pricing_plan
    monkeypatch.setattr(exact, "pricing_plan", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    x, y = clouds(450, 450, 3, 5)
    a = np.full(450, 1 / 450)
    M = cost_matrix(x, y, 2)
    exact_plan(a, a, M)  # no potentials: dense
    assert calls == []
    optimal_transport(Measure.uniform(x), Measure.uniform(y))  # p = 2: Gaussian potentials, pricing
    assert calls == [1]
    optimal_transport(Measure.uniform(x[:300]), Measure.uniform(y[:300]))  # below PRICING_MIN_SIDE: dense
    optimal_transport(Measure.uniform(x), Measure.uniform(y), method="dense")
    optimal_transport(Measure.uniform(x), Measure.uniform(y), p=1)
    assert calls == [1]


@pytest.mark.parametrize("failure", ["missing", "not optimal"])
def test_pricing_that_gives_up_falls_back_to_the_dense_solver(monkeypatch, failure):
    x, y = clouds(500, 500, 5, 6)
    mu, nu = Measure.uniform(x), Measure.uniform(y)
    dense = optimal_transport(mu, nu, method="dense")
    if failure == "missing":
        monkeypatch.setattr(exact, "emd_c_sparse", None)
    else:
        real = exact.emd_c_sparse
        monkeypatch.setattr(exact, "emd_c_sparse", lambda *args: (*real(*args)[:-1], 3))  # max iterations reached
    assert exact.pricing_plan(mu.weights, nu.weights, cost_matrix(x, y, 2)) is None
    fallback = optimal_transport(mu, nu)
    np.testing.assert_array_equal(fallback.plan, dense.plan)
    assert fallback.cost == dense.cost


def test_rounds_are_bounded():
    x, y = clouds(450, 450, 2, 8)
    a = np.full(450, 1 / 450)
    assert pricing_plan(a, a, cost_matrix(x, y, 1), max_rounds=1) is None  # W1 from nearest neighbours: > 1 round


def test_bad_method_and_unusable_potentials():
    x, y = clouds(450, 450, 2, 9)
    a = np.full(450, 1 / 450)
    M = cost_matrix(x, y, 2)
    with pytest.raises(ValueError, match="unknown exact_plan method 'fast'; allowed values: auto, dense, pricing"):
        exact_plan(a, a, M, method="fast")
    dense = exact_plan(a, a, M, method="dense")
    for potentials in ((np.zeros(3), np.zeros(450)), (np.full(450, np.nan), np.zeros(450))):
        np.testing.assert_array_equal(exact_plan(a, a, M, potentials=potentials), dense)  # ignored: dense


def test_zero_weights_keep_the_dense_path():
    x, y = clouds(450, 450, 2, 10)
    a = np.full(450, 1 / 449)
    a[0] = 0.0
    b = np.full(450, 1 / 450)
    M = cost_matrix(x, y, 2)
    plan = exact_plan(a, b, M, method="pricing")
    assert np.isclose((plan * M).sum(), ot.emd2(a, b, M, numItermax=10**8), rtol=1e-12)


def test_northwest_corner_arcs_carry_a_feasible_plan():
    rng = np.random.default_rng(11)
    a, b = rng.uniform(size=37), rng.uniform(size=23)
    a, b = a / a.sum(), b / b.sum()
    rows, cols = exact._northwest_corner_arcs(a, b)
    assert set(rows.tolist()) == set(range(37)) and set(cols.tolist()) == set(range(23))
    assert (np.diff(rows) >= 0).all() and (np.diff(cols) >= 0).all()  # a staircase
    M = np.full((37, 23), 1e6)
    M[rows, cols] = 1.0
    plan = exact_plan(a, b, M, method="dense")
    assert np.isclose((plan * M).sum(), 1.0)  # the staircase alone carries all the mass


def test_fedwad_is_the_same_priced_or_dense(monkeypatch):
    x, y = clouds(450, 450, 5, 12)
    config = FedWaDConfig(support_size=450, iterations=3)
    priced = federated_wasserstein(x, y, config, seed=1)
    monkeypatch.setattr(exact, "PRICING_MIN_SIDE", 10**9)
    dense = federated_wasserstein(x, y, config, seed=1)
    assert np.isclose(priced.estimate, dense.estimate, rtol=1e-12)
    np.testing.assert_allclose(priced.xi.support, dense.xi.support, rtol=0, atol=1e-12)


def test_no_gaussian_potentials_above_the_dimension_bound(monkeypatch):
    """Ranking costs O(d³): above PRICING_MAX_DIM (or the sample count) optimal_transport passes no potentials, so
    ``auto`` solves densely."""
    calls = []
    real = exact.pricing_plan
    monkeypatch.setattr(exact, "pricing_plan", lambda *args, **kw: calls.append(1) or real(*args, **kw))
    rng = np.random.default_rng(13)
    mu, nu = Measure.uniform(rng.normal(size=(420, 300))), Measure.uniform(rng.normal(size=(420, 300)))
    assert exact._pricing_potentials(mu, nu, 2, "auto") is None
    optimal_transport(mu, nu)
    assert calls == []
    monkeypatch.setattr(exact, "PRICING_MAX_DIM", 400)
    optimal_transport(mu, nu)
    assert calls == [1]
