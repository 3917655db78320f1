"""Label-augmented OTDD: augmented vectors vs the Bures ground cost, closed forms, degenerate clients."""

import numpy as np
import pytest

from otfed.errors import DegenerateClientError
from otfed.ot import (
    ClassStats,
    augment_with_label_stats,
    class_statistics,
    cost_matrix,
    label_cost,
    otdd_exact,
    otdd_ground_cost,
)


def _labelled(seed, n=60, d=3, k=3, shift=0.0, anisotropic=False):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    x = rng.normal(size=(n, d)) + 3.0 * y[:, None] + shift
    if anisotropic:  # class-dependent, non-axis-aligned covariances (non-commuting)
        for c in range(k):
            A = rng.normal(size=(d, d))
            x[y == c] = x[y == c] @ A
    return x, y


def test_augmented_squared_distance_equals_ground_cost_in_diagonal_mode():
    xs, ys = _labelled(0)
    xt, yt = _labelled(1, n=45, shift=0.5)
    ss, st = class_statistics(xs, ys), class_statistics(xt, yt)
    aug = cost_matrix(augment_with_label_stats(xs, ys, ss), augment_with_label_stats(xt, yt, st), 2)
    np.testing.assert_allclose(aug, otdd_ground_cost(xs, ys, ss, xt, yt, st), rtol=1e-10, atol=1e-9)


def test_augmented_cost_equals_bures_cost_for_commuting_full_covariances():
    # diagonal (hence commuting) square roots stored in full mode: Frobenius distance == Bures distance
    rng = np.random.default_rng(2)
    x, y = _labelled(2, n=30, d=3, k=3)
    sd_s = rng.uniform(0.2, 3.0, size=(3, 3))
    sd_t = rng.uniform(0.2, 3.0, size=(3, 3))
    means_t = rng.normal(size=(3, 3))
    full_s = ClassStats(np.arange(3), np.zeros((3, 3)), np.stack([np.diag(s) for s in sd_s]), False, np.full(3, 10))
    full_t = ClassStats(np.arange(3), means_t, np.stack([np.diag(s) for s in sd_t]), False, np.full(3, 10))
    diag_s = ClassStats(np.arange(3), np.zeros((3, 3)), sd_s, True, np.full(3, 10))
    diag_t = ClassStats(np.arange(3), means_t, sd_t, True, np.full(3, 10))
    np.testing.assert_allclose(label_cost(full_s, full_t), label_cost(diag_s, diag_t), rtol=1e-12)
    aug = cost_matrix(augment_with_label_stats(x, y, full_s), augment_with_label_stats(x, y, full_t), 2)
    np.testing.assert_allclose(aug, otdd_ground_cost(x, y, full_s, x, y, full_t), rtol=1e-10, atol=1e-10)


def test_augmented_cost_upper_bounds_bures_cost_for_non_commuting_covariances():
    xs, ys = _labelled(3, n=90, anisotropic=True)
    xt, yt = _labelled(4, n=90, anisotropic=True)
    ss, st = class_statistics(xs, ys, diagonal=False), class_statistics(xt, yt, diagonal=False)
    aug = cost_matrix(augment_with_label_stats(xs, ys, ss), augment_with_label_stats(xt, yt, st), 2)
    ground = otdd_ground_cost(xs, ys, ss, xt, yt, st)
    assert np.all(aug >= ground - 1e-9)
    assert np.any(aug > ground + 1e-3)  # strict somewhere: the covariances really do not commute


def test_full_mode_bures_matches_closed_form_commuting_and_brute_force():
    rng = np.random.default_rng(5)
    A = rng.normal(size=(3, 3))
    B = rng.normal(size=(3, 3))
    SA, SB = A @ A.T, B @ B.T  # use these as the square roots
    ss = ClassStats(np.array([0]), np.zeros((1, 3)), SA[None], False, np.array([5]))
    st = ClassStats(np.array([0]), np.ones((1, 3)), SB[None], False, np.array([5]))
    covA, covB = SA @ SA, SB @ SB
    lam, V = np.linalg.eigh(SA @ covB @ SA)
    bures = np.trace(covA) + np.trace(covB) - 2 * np.sqrt(np.clip(lam, 0, None)).sum()
    assert label_cost(ss, st)[0, 0] == pytest.approx(3.0 + bures, rel=1e-10)


def test_label_cost_equals_1d_gaussian_w2_closed_form():
    rng = np.random.default_rng(6)
    y = np.repeat([0, 1], 50)
    x = np.where(y == 0, rng.normal(-1, 0.5, 100), rng.normal(2, 3.0, 100))[:, None]
    for diagonal in (True, False):
        s = class_statistics(x, y, diagonal=diagonal)
        m = [x[y == c, 0].mean() for c in (0, 1)]
        sd = [x[y == c, 0].std(ddof=1) for c in (0, 1)]
        L = label_cost(s, s)
        assert L[0, 1] == pytest.approx((m[0] - m[1]) ** 2 + (sd[0] - sd[1]) ** 2, rel=1e-12)
        assert L[0, 0] == pytest.approx(0.0, abs=1e-12)


def test_class_statistics_separates_well_separated_classes_and_uses_unbiased_covariance():
    rng = np.random.default_rng(7)
    y = np.repeat([3, 8], 40)
    x = rng.normal(size=(80, 2)) + np.where(y[:, None] == 3, -10.0, 10.0)
    s = class_statistics(x, y)
    np.testing.assert_array_equal(s.labels, [3, 8])
    np.testing.assert_allclose(s.means, [x[y == 3].mean(0), x[y == 8].mean(0)])
    assert s.means[0, 0] < -5 < 5 < s.means[1, 0]
    np.testing.assert_allclose(s.sqrt_covs[1], x[y == 8].std(axis=0, ddof=1))
    full = class_statistics(x, y, diagonal=False)
    np.testing.assert_allclose(full.sqrt_covs[0] @ full.sqrt_covs[0], np.cov(x[y == 3].T), atol=1e-12)


def test_otdd_of_a_dataset_with_itself_is_zero_and_positive_against_a_shift():
    x, y = _labelled(8, n=60)
    assert otdd_exact(x, y, x, y) < 1e-8
    assert otdd_exact(x, y, x, y, diagonal=False) < 1e-8
    assert otdd_exact(x, y, x + 1.0, y) == pytest.approx(np.sqrt(2 * 3.0), rel=1e-9)  # ||1||² + ||Δm||²


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((0, 2)), np.zeros(0, dtype=int), "has no samples"),
        (np.array([[0.0, np.nan], [1.0, 1.0], [2.0, 2.0]]), np.array([0, 0, 0]), "NaN or inf"),
        (np.arange(10.0).reshape(5, 2), np.array([0, 0, 1, 1, 2]), "class 2 has 1 sample"),
    ],
)
def test_degenerate_clients_raise_naming_the_client(x, y, message):
    with pytest.raises(DegenerateClientError, match=message) as info:
        class_statistics(x, y, client="hospital-7")
    assert "hospital-7" in str(info.value)


def test_augmenting_with_an_unknown_label_raises():
    x, y = _labelled(9)
    s = class_statistics(x, y)
    with pytest.raises(ValueError, match=r"label\(s\) \[7\]"):
        augment_with_label_stats(x[:2], np.array([0, 7]), s)
