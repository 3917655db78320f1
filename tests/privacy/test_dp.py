"""DP FedWaD (otfed.privacy.dp) against independent truth: the analytic Gaussian mechanism (Balle & Wang
2018) and the RDP of the Gaussian, α/(2σ²), converted by hand; the noise the clients actually add; the
non-private protocol (ε = ∞); the sensitivity bounds on neighbouring data sets, including a data set that
attains them; POT's exact W2 for utility."""
from __future__ import annotations

import doctest
import math

import numpy as np
import ot
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

import otfed.privacy.dp as dp_module
from otfed.errors import ConfigError
from otfed.federation.fedwad import FedWaDConfig, client_step, federated_wasserstein
from otfed.federation.ledger import Channel
from otfed.federation.messages import SERVER, MeasureMessage
from otfed.ot import Measure
from otfed.privacy.dp import (DPConfig, DPWassersteinClient, PrivacyBudgetError, barycentric_targets, clip_to_ball,
                              distance_sensitivity, dp_client_step, dp_distance, dp_federated_wasserstein,
                              gaussian_epsilon, gaussian_noise_multiplier, interpolant_sensitivity)

DELTA = 1e-5


# ---------------------------------------------------------------------------------- independent closed forms
def analytic_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of the Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, theorem 8)."""
    return float(norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon + norm.logcdf(-mu / 2 - epsilon / mu)))


def analytic_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Exact ε of `releases` Gaussian mechanisms of multiplier z: one Gaussian with μ = √releases / z."""
    mu = math.sqrt(releases) / noise_multiplier
    return brentq(lambda e: analytic_delta(e, mu) - delta, 0.0, mu * mu / 2 + 10.0 * mu + 10.0, xtol=1e-12)


def rdp_epsilon_by_hand(noise_multiplier: float, releases: int, delta: float) -> tuple[float, float]:
    """From the Gaussian's RDP ε(α) = R·α/(2z²): (Mironov 2017, prop. 3, closed-form optimum over α;
    the improved conversion of Canonne, Kamath & Steinke 2020, minimised over a fine grid of α)."""
    a, log_inv_delta = releases / (2 * noise_multiplier ** 2), math.log(1 / delta)
    mironov = a + 2 * math.sqrt(a * log_inv_delta)
    alphas = np.linspace(1.02, 1100.0, 2_000_000)
    improved = a * alphas + np.log1p(-1 / alphas) - (math.log(delta) + np.log(alphas)) / (alphas - 1)
    return mironov, float(improved.min())


def exact_w2(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(ot.emd2(ot.unif(len(x)), ot.unif(len(y)), ot.dist(x, y), numItermax=10_000_000)))


# ---------------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("z, releases", [(1.0, 1), (0.7, 1), (5.0, 21), (2.0, 5), (0.4, 11)])
def test_pld_accountant_matches_the_analytic_gaussian(z: float, releases: int) -> None:
    exact = analytic_epsilon(z, releases, DELTA)
    pld = gaussian_epsilon(z, releases, DELTA, "pld")
    assert exact - 1e-9 <= pld <= exact + 2e-3 * max(1.0, exact)  # pessimistic, and tight
    assert analytic_delta(pld, math.sqrt(releases) / z) <= DELTA * (1 + 1e-6)


@pytest.mark.parametrize("z, releases", [(1.0, 1), (0.7, 1), (5.0, 21), (2.0, 5), (0.4, 11)])
def test_rdp_accountant_matches_the_gaussian_rdp_converted_by_hand(z: float, releases: int) -> None:
    exact = analytic_epsilon(z, releases, DELTA)
    mironov, improved = rdp_epsilon_by_hand(z, releases, DELTA)
    rdp = gaussian_epsilon(z, releases, DELTA, "rdp")
    assert exact <= rdp <= mironov  # an upper bound, never looser than the classical conversion
    assert improved - 1e-6 <= rdp <= improved * 1.02 + 1e-3  # its orders are a subset of the grid's


def test_composition_of_gaussians_is_one_gaussian() -> None:
    for accountant in ("rdp", "pld"):
        composed = gaussian_epsilon(3.0, 9, DELTA, accountant)
        assert composed == pytest.approx(gaussian_epsilon(1.0, 1, DELTA, accountant), rel=2e-3)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("epsilon, releases", [(1.0, 11), (8.0, 21), (0.5, 1)])
def test_noise_multiplier_is_the_smallest_that_meets_the_target(accountant: str, epsilon: float,
                                                                releases: int) -> None:
    z = gaussian_noise_multiplier(epsilon, DELTA, releases, accountant)
    assert gaussian_epsilon(z, releases, DELTA, accountant) <= epsilon
    assert gaussian_epsilon(z * (1 - 1e-3), releases, DELTA, accountant) > epsilon
    if accountant == "pld":  # ≈ the analytic calibration, solved here independently
        z_exact = brentq(lambda s: analytic_epsilon(s, releases, DELTA) - epsilon, 0.05, 100.0, xtol=1e-10)
        assert z == pytest.approx(z_exact, rel=2e-3)


def test_accounting_edge_cases() -> None:
    assert gaussian_noise_multiplier(math.inf, DELTA, 5) == 0.0
    assert gaussian_epsilon(0.0, 5, DELTA) == math.inf
    assert gaussian_epsilon(1.0, 0, DELTA) == 0.0
    config = FedWaDConfig(iterations=7, record_history=True)
    assert DPConfig(clip_radius=1.0, sessions=4).releases(config) == 4 * (7 + 1 + 7)


# ---------------------------------------------------------------------------------- the noise actually added
def test_interpolant_noise_has_the_calibrated_std() -> None:
    """Released atoms minus the noiseless interpolant, / t: N(0, σ²) with σ = σ_mult · 2C√S."""
    rng = np.random.default_rng(0)
    S, d, C, t = 10, 2, 3.0, 0.5
    config = FedWaDConfig(support_size=S, iterations=1, t=t)
    dp = DPConfig(epsilon=50.0, clip_radius=C, sessions=200, project=False)
    measure = Measure.uniform(rng.normal(size=(30, d)))
    client = DPWassersteinClient("c", measure, config, np.random.default_rng(1), dp,
                                 noise_rng=np.random.default_rng(2))
    z = gaussian_noise_multiplier(50.0, DELTA, 200 * 2)
    assert client.noise_multiplier == z and z > 0
    xi = Measure.uniform(rng.normal(size=(S, d)))
    noiseless = client_step(measure, xi, t, config)  # the non-private step (records inside B(0, C))
    assert np.linalg.norm(measure.support, axis=1).max() < C
    noise = np.concatenate([(client.interpolate(MeasureMessage("xi", SERVER, "c", measure=xi)).measure.support
                             - noiseless.support).ravel() / t for _ in range(400)])
    sigma = z * interpolant_sensitivity(S, C)
    assert sigma == pytest.approx(z * 2 * C * math.sqrt(S))
    assert abs(noise.std() / sigma - 1) < 0.05  # 8,000 draws: the estimate's own spread is ~0.8 %
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(noise.size)
    assert client.releases == 400 and client.privacy_spent()[0] <= 50.0


def test_distance_noise_has_the_calibrated_std() -> None:
    rng = np.random.default_rng(3)
    n, C, z = 100, 1.0, 0.5
    config = FedWaDConfig(support_size=4)
    dp = DPConfig(clip_radius=C)
    private = Measure.uniform(clip_to_ball(rng.normal(size=(n, 2)), C))
    xi = Measure.uniform(np.array([[5.0, 0.0], [5.0, 0.5], [4.5, 0.0], [5.0, -0.5]]))
    exact = exact_w2(private.support, xi.support)
    noise_rng = np.random.default_rng(4)
    noise = np.array([dp_distance(private, xi, config, dp, z, noise_rng) for _ in range(2000)]) - exact
    sigma = z * 2 * C / math.sqrt(n)  # 2C·n^(−1/2), p = 2
    assert distance_sensitivity(private.weights, C, 2) == pytest.approx(2 * C / math.sqrt(n))
    assert abs(noise.std() / sigma - 1) < 0.08 and abs(noise.mean()) < 5 * sigma / math.sqrt(noise.size)


# ---------------------------------------------------------------------------------- ε = ∞ is FedWaD itself
def test_infinite_epsilon_reproduces_fedwad_exactly() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(60, 2)), rng.normal(size=(50, 2)) + 2.0
    config = FedWaDConfig(support_size=10, iterations=8, record_history=True, lower_bound=False)  # no moments
    plain = federated_wasserstein(x, y, config, seed=11)
    private = dp_federated_wasserstein(x, y, config, DPConfig(epsilon=math.inf, clip_radius=50.0), seed=11)
    assert private.estimate == plain.estimate
    assert np.array_equal(private.fedwad.xi.support, plain.xi.support)
    assert private.fedwad.history == plain.history
    assert private.fedwad.ledger.to_frame().equals(plain.ledger.to_frame())
    assert private.epsilon == math.inf and private.noise_multiplier == 0.0 and private.releases == 2 * 8 + 1


# ---------------------------------------------------------------------------------- clipping and sensitivity
def test_released_atoms_stay_within_the_clip() -> None:
    """Records far outside B(0, C): every released atom lies within t·C of (1−t)·z_i — with no noise, and
    with noise projected back (project=True)."""
    rng = np.random.default_rng(6)
    C, t, S = 1.0, 0.5, 8
    config = FedWaDConfig(support_size=S, t=t)
    measure = Measure.uniform(50.0 * rng.normal(size=(40, 3)))
    for epsilon in (math.inf, 2.0):
        client = DPWassersteinClient("c", measure, config, np.random.default_rng(7), DPConfig(
            epsilon=epsilon, clip_radius=C, sessions=5))
        for _ in range(20):
            xi = Measure.uniform(3.0 * rng.normal(size=(S, 3)))
            out = client.interpolate(MeasureMessage("xi", SERVER, "c", measure=xi)).measure
            moved = np.linalg.norm((out.support - (1 - t) * xi.support) / t, axis=1)
            assert moved.max() <= C * (1 + 1e-12)
            assert np.array_equal(out.weights, xi.weights)
    # with ε = ∞ the released distance is POT's exact W2 of the clipped records
    plain = DPWassersteinClient("c", measure, config, np.random.default_rng(8), DPConfig(
        epsilon=math.inf, clip_radius=C))
    xi = Measure.uniform(rng.normal(size=(S, 3)))
    clipped = measure.support * np.minimum(1.0, C / np.linalg.norm(measure.support, axis=1, keepdims=True))
    value = plain.distance(MeasureMessage("xi", SERVER, "c", measure=xi)).value
    assert value == pytest.approx(exact_w2(clipped, xi.support), rel=1e-9)


def test_one_record_can_flip_every_target_and_no_more() -> None:
    """A tie between two assignments, broken either way by one record: the targets move by 2C per atom,
    ≈ the bound 2C√S — attained, never exceeded."""
    C, eta = 1.0, 1e-3
    config = FedWaDConfig(support_size=2, solver="network_simplex")
    xi = Measure.uniform(np.array([[0.0, 1.0], [0.0, -1.0]]))
    d_1 = Measure.uniform(np.array([[C, eta], [-C, 0.0]]))
    d_2 = Measure.uniform(np.array([[C, -eta], [-C, 0.0]]))  # neighbour: record 0 replaced
    moved = np.linalg.norm(barycentric_targets(xi, d_1, config, C) - barycentric_targets(xi, d_2, config, C))
    bound = interpolant_sensitivity(2, C)
    assert 0.99 * bound <= moved <= bound


@pytest.mark.parametrize("p", [1, 2])
def test_random_neighbours_respect_both_sensitivity_bounds(p: int) -> None:
    rng = np.random.default_rng(9 + p)
    C, n, S = 1.5, 12, 5
    config = FedWaDConfig(support_size=S, p=p, solver="network_simplex")
    dp = DPConfig(epsilon=math.inf, clip_radius=C)
    for _ in range(60):
        x = 2.0 * rng.normal(size=(n, 2))
        x_prime = x.copy()
        x_prime[rng.integers(n)] = 4.0 * rng.normal(size=2)
        xi = Measure.uniform(rng.normal(size=(S, 2)))
        a, b = Measure.uniform(x), Measure.uniform(x_prime)
        moved = np.linalg.norm(barycentric_targets(xi, a, config, C) - barycentric_targets(xi, b, config, C))
        assert moved <= interpolant_sensitivity(S, C) * (1 + 1e-12)
        gap = abs(dp_distance(a, xi, config, dp, 0.0, rng) - dp_distance(b, xi, config, dp, 0.0, rng))
        assert gap <= distance_sensitivity(a.weights, C, p) * (1 + 1e-9)


# ---------------------------------------------------------------------------------- utility
def test_error_falls_as_epsilon_grows() -> None:
    """Mean |DP estimate − exact W2| over 8 seeds, 2-D, n = 60/50, S = 10, K = 10, C = 4: measured
    4.3–6.1 at ε = 1, 1.4–2.1 at ε = 100, 0.18–0.36 at ε = 10⁴ (4 data sets × 3 blocks of 8 seeds)."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(60, 2)), rng.normal(size=(50, 2)) + 2.0
    exact = exact_w2(x, y)
    config = FedWaDConfig(support_size=10, iterations=10)
    error = {eps: np.mean([abs(dp_federated_wasserstein(x, y, config, DPConfig(epsilon=eps, clip_radius=4.0),
                                                        seed=s).estimate - exact) for s in range(8)])
             for eps in (1.0, 100.0, 1e4)}
    assert error[1.0] > 1.5 * error[100.0] > 2.25 * error[1e4]
    assert error[1e4] < 0.5


# ---------------------------------------------------------------------------------- budget, config, boundary
def test_budget_counts_every_release_and_refuses_more() -> None:
    rng = np.random.default_rng(12)
    x, y = rng.normal(size=(20, 2)), rng.normal(size=(20, 2))
    config = FedWaDConfig(support_size=4, iterations=3, record_history=True)
    dp = DPConfig(epsilon=3.0, clip_radius=3.0, sessions=3)
    out = dp_federated_wasserstein(x, y, config, dp, seed=0)
    assert out.releases == 7  # K interpolants + K monitor distances + 1 distance
    assert out.epsilon == gaussian_epsilon(out.noise_multiplier, 7, DELTA) < 3.0
    assert gaussian_epsilon(out.noise_multiplier, 3 * 7, DELTA) <= 3.0  # the whole budget over 3 sessions
    client = DPWassersteinClient("c", Measure.uniform(x), FedWaDConfig(support_size=4, iterations=1),
                                 np.random.default_rng(0), DPConfig(epsilon=3.0, clip_radius=3.0))
    xi = MeasureMessage("xi", SERVER, "c", measure=Measure.uniform(y[:4]))
    client.interpolate(xi)
    client.distance(xi)
    with pytest.raises(PrivacyBudgetError, match="'c'"):
        client.interpolate(xi)


def test_config_errors_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="clip_radius"):
        DPConfig(epsilon=1.0)
    with pytest.raises(ConfigError, match="clip_radius"):
        DPConfig(clip_radius=math.inf)
    with pytest.raises(ConfigError, match="delta"):
        DPConfig(clip_radius=1.0, delta=0.0)
    with pytest.raises(ConfigError, match="unknown key"):
        DPConfig(clip_radius=1.0, eps=1.0)
    with pytest.raises(ConfigError, match="approx"):
        DPWassersteinClient("c", Measure.uniform(np.zeros((3, 2))), FedWaDConfig(interpolation="exact"),
                            np.random.default_rng(0), DPConfig(clip_radius=1.0))
    with pytest.raises(ConfigError, match="approx"):
        dp_client_step(Measure.uniform(np.zeros((3, 2))), Measure.uniform(np.ones((2, 2))), 0.5,
                       FedWaDConfig(interpolation="exact"), DPConfig(clip_radius=1.0), 1.0, np.random.default_rng(0))


def test_no_raw_sample_reaches_the_server() -> None:
    rng = np.random.default_rng(13)
    x, y = rng.normal(size=(30, 2)), rng.normal(size=(30, 2)) + 1.0
    channel = Channel(keep_inbox=True)
    dp_federated_wasserstein(x, y, FedWaDConfig(support_size=30, iterations=5), DPConfig(clip_radius=5.0),
                             seed=1, channel=channel)
    received = channel.received_by(SERVER)
    assert received
    for message in received:
        for array in message.arrays():
            rows = np.atleast_2d(array)
            if rows.shape[-1] == 2:
                assert not any(np.isclose(rows[:, None, :], s).all(-1).any() for s in (x, y))


def test_module_examples_run() -> None:
    result = doctest.testmod(dp_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 3 and result.failed == 0


def test_a_dp_client_refuses_to_send_its_exact_moments() -> None:
    """Gelbrich's lower bound needs each client's exact mean and covariance, which the DP budget does not cover:
    the DP client refuses, naming itself and the way out."""
    import pytest

    from otfed.federation.fedwad import FedWaDConfig
    from otfed.ot import Measure
    from otfed.privacy.dp import DPConfig, DPWassersteinClient, PrivacyBudgetError

    x = np.random.default_rng(0).normal(size=(20, 2))
    client = DPWassersteinClient("client_mu", Measure.uniform(x), FedWaDConfig(support_size=5, iterations=2),
                                 np.random.default_rng(1), DPConfig(epsilon=1.0, clip_radius=3.0))
    with pytest.raises(PrivacyBudgetError, match="client_mu: a DP client does not send its exact moments"):
        client.moments()
