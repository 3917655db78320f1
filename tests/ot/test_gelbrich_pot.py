"""otfed's Bures term against POT's ``ot.gaussian.bures_wasserstein_distance`` (issue #34): the two agree where
the problem is well conditioned; where the trace formula cancels (equal or nearly equal covariances) this
module keeps the closed form and POT does not — the measured reason otfed.ot.gelbrich keeps its own
sum-of-squares form. Truth is the closed form in every case, never either implementation."""
import warnings

import numpy as np
import ot
import pytest

from otfed.ot.gelbrich import bures_squared, gelbrich_bound


def _pot(m1, c1, m2, c2) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # POT's sqrt of a negative eigenvalue (NaN) below
        return float(ot.gaussian.bures_wasserstein_distance(m1, m2, c1, c2))


def _rotation(d: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


@pytest.mark.parametrize("seed", range(20))
def test_commuting_covariances_match_the_closed_form_and_pot(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 12))
    q = _rotation(d, seed)
    lam1, lam2 = rng.uniform(0.1, 5.0, d), rng.uniform(0.1, 5.0, d)
    m1, m2 = rng.normal(size=d), rng.normal(size=d)
    c1, c2 = (q * lam1) @ q.T, (q * lam2) @ q.T
    exact = np.sqrt(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(lam1) - np.sqrt(lam2)) ** 2))
    assert gelbrich_bound(m1, c1, m2, c2) == pytest.approx(exact, rel=1e-10)
    assert _pot(m1, c1, m2, c2) == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("d", [10, 50])
def test_identical_covariances_give_zero_where_pot_leaves_cancellation_error(d):
    a = np.random.default_rng(d).normal(size=(d, d))
    cov, mean = a @ a.T, np.zeros(d)
    ours, theirs = gelbrich_bound(mean, cov, mean, cov), _pot(mean, cov, mean, cov)
    scale = np.sqrt(np.trace(cov))
    assert ours <= 1e-12 * scale  # W₂ = 0: a lower bound must not exceed it
    assert theirs > 1e3 * max(ours, 1e-300)  # the measured reason not to use POT's (module docstring)


def test_identical_rank_deficient_covariances_give_zero_where_pot_gives_nan():
    a = np.random.default_rng(30).normal(size=(30, 2))
    cov, mean = a @ a.T, np.zeros(30)
    assert gelbrich_bound(mean, cov, mean, cov) <= 1e-12 * np.sqrt(np.trace(cov))
    assert not np.isfinite(_pot(mean, cov, mean, cov))


def test_a_small_perturbation_keeps_its_closed_form():
    d, lam, e = 5, np.arange(1.0, 6.0), 1e-8
    q = _rotation(d, 0)
    exact = np.sqrt(np.sum((np.sqrt(lam) - np.sqrt(lam + e)) ** 2))
    c1, c2 = (q * lam) @ q.T, (q * (lam + e)) @ q.T
    assert np.sqrt(bures_squared(c1, c2)) == pytest.approx(exact, rel=1e-6)
    assert abs(_pot(np.zeros(d), c1, np.zeros(d), c2) - exact) > 1.0 * exact


@pytest.mark.parametrize("argument", ["mean1", "cov2"])
def test_complex_moments_are_refused_not_cast(argument):
    args = {"mean1": np.zeros(2), "cov1": np.eye(2), "mean2": np.zeros(2), "cov2": np.eye(2)}
    args[argument] = args[argument] + 1j
    with pytest.raises(ValueError, match=r"must be real, got a complex array"):
        gelbrich_bound(**args)
