"""Calibrated gradients (FedBary eq. 10) against hand computations and POT's duals."""
from __future__ import annotations

import numpy as np
import ot
import pytest

from otfed.ot import Measure
from otfed.valuation import (budget_removal, calibrated_gradient, datum_values, dual_potential, flag_noisy,
                             flagged_removal, most_suspicious, random_removal, rank_by_value)


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


def test_sinkhorn_potential_matches_pot_sinkhorn_log() -> None:
    rng = np.random.default_rng(2)
    X, Y = rng.standard_normal((12, 3)), rng.standard_normal((8, 3)) + 0.5
    M = ot.dist(X, Y)
    eps = 0.1 * M.mean()
    f = dual_potential(Measure.uniform(X), Measure.uniform(Y), potential="sinkhorn", eps_rel=0.1, tol=1e-12)
    _, log = ot.bregman.sinkhorn_log(ot.unif(12), ot.unif(8), M, eps, numItermax=100_000, stopThr=1e-13, log=True)
    f_pot = log["log_u"] * eps  # POT: plan = diag(u) K diag(v), f = ε log u
    np.testing.assert_allclose(f, f_pot - f_pot.mean(), atol=1e-7)


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
