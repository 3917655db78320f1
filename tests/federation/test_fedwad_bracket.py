"""FedWaD's bracket: Gelbrich's lower bound (Gelbrich 1990, Theorem 2.1) ≤ W₂ ≤ FedWaD's estimate (triangle
inequality, FedWaD eq. 6), checked against independent truth — closed forms for Gaussians, POT's exact W₂
(``ot.emd2``) on many random problems, Gaussian and not — and the warning, the ledger and the privacy boundary
of the moment exchange.
"""
from __future__ import annotations

import doctest
import importlib
import warnings

import numpy as np
import ot
import pytest
from scipy.linalg import sqrtm

import otfed.ot.gelbrich as gelbrich_module
from otfed.errors import DegenerateClientError
from otfed.federation import Channel, DistanceMessage, FedWaDConfig, MeasureMessage, federated_wasserstein
from otfed.federation.messages import MomentMessage
from otfed.ot import Measure, bures_squared, gelbrich_bound, measure_moments
from tests.privacy_boundary import assert_boundary_holds

FEDWAD = importlib.import_module("otfed.federation.fedwad")  # the package re-exports a function of that name


# ------------------------------------------------------------------------------------------ references
def exact_w2(x: np.ndarray, y: np.ndarray, a: np.ndarray | None = None, b: np.ndarray | None = None) -> float:
    """Independent reference: POT's network simplex on squared distances summed coordinate by coordinate (no
    ‖x‖² + ‖y‖² − 2x·y cancellation, so a translate's W₂ is exact to rounding)."""
    a = ot.unif(len(x)) if a is None else a
    b = ot.unif(len(y)) if b is None else b
    cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(axis=-1)
    return float(np.sqrt(max(ot.emd2(a, b, cost, numItermax=10_000_000), 0.0)))


def trace_formula_w2(m1: np.ndarray, s1: np.ndarray, m2: np.ndarray, s2: np.ndarray) -> float:
    """W₂ between N(m1, s1) and N(m2, s2) by the textbook trace formula with scipy's ``sqrtm`` (an independent
    implementation of the closed form)."""
    r1 = sqrtm(s1).real
    cross = sqrtm(r1 @ s2 @ r1).real
    return float(np.sqrt(max(np.sum((m1 - m2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(cross), 0.0)))


def random_spd(d: int, rng: np.random.Generator) -> np.ndarray:
    a = rng.normal(size=(d, d))
    return a @ a.T / d + 0.1 * np.eye(d)


def empirical_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The uniform empirical measure's own moments by numpy (biased covariance, ddof = 0)."""
    return x.mean(axis=0), np.atleast_2d(np.cov(x.T, bias=True))


# ------------------------------------------------------------------------------------ the closed form
@pytest.mark.parametrize("seed", range(5))
def test_gelbrich_is_the_gaussian_w2_for_commuting_covariances(seed: int) -> None:
    """Covariances diagonal in a common basis: W₂² = ‖m₁ − m₂‖² + Σ_i (√a_i − √b_i)² exactly."""
    rng = np.random.default_rng(seed)
    d = 1 + 3 * seed
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    a, b = rng.uniform(0.01, 4.0, d), rng.uniform(0.01, 4.0, d)
    b[: d // 3] = 0.0  # some directions degenerate: a singular covariance
    m1, m2 = rng.normal(size=d), rng.normal(size=d)
    expected = np.sqrt(np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    # rotated, a zero eigenvalue is stored as ±1e-16, whose square root is 1e-8: that sets the tolerance
    assert gelbrich_bound(m1, (q * a) @ q.T, m2, (q * b) @ q.T) == pytest.approx(expected, rel=1e-7)
    assert gelbrich_bound(m1, np.diag(a), m2, np.diag(b)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_gelbrich_matches_the_trace_formula_for_non_commuting_covariances(seed: int) -> None:
    rng = np.random.default_rng(10 + seed)
    d = 2 + 4 * seed
    m1, m2, s1, s2 = rng.normal(size=d), rng.normal(size=d), random_spd(d, rng), random_spd(d, rng)
    assert gelbrich_bound(m1, s1, m2, s2) == pytest.approx(trace_formula_w2(m1, s1, m2, s2), rel=1e-9)
    assert bures_squared(s1, s1) < 1e-20 * np.trace(s1) ** 2  # B(Σ, Σ) = 0, no cancellation residue
    assert gelbrich_bound(m1, s1, m2, s2) == pytest.approx(gelbrich_bound(m2, s2, m1, s1), rel=1e-12)


def test_gelbrich_is_w2_of_large_gaussian_samples() -> None:
    """Equality for Gaussians: POT's exact W₂ between 1,500 samples of each of two 2-D Gaussians, elongated and
    45° apart (non-commuting), is within sampling error of the bound for the population moments (measured
    0.8–3.3 % above over seeds 0–2; 1.2 % for this one), while the Frobenius distance of the roots (12 % above)
    or the means alone (63 % below) are far off."""
    rng = np.random.default_rng(1)
    turn = np.array([[1.0, -1.0], [1.0, 1.0]]) / np.sqrt(2.0)
    s1, s2 = np.diag([3.0, 0.1]), turn @ np.diag([3.0, 0.1]) @ turn.T
    m1, m2 = np.zeros(2), np.array([0.5, 0.0])
    x, y = rng.multivariate_normal(m1, s1, 1500), rng.multivariate_normal(m2, s2, 1500)
    bound = gelbrich_bound(m1, s1, m2, s2)
    assert exact_w2(x, y) == pytest.approx(bound, rel=0.04)
    frobenius = np.sqrt(np.sum((m1 - m2) ** 2) + np.sum((sqrtm(s1).real - sqrtm(s2).real) ** 2))
    assert frobenius / bound - 1 > 0.1 and np.linalg.norm(m1 - m2) / bound - 1 < -0.5


def test_gelbrich_in_one_dimension_against_the_quantile_formula() -> None:
    """1-D: W₂ of two equal-size empirical measures is the L2 distance of the sorted samples (independent of
    any solver); for 200,000 Gaussian samples it is √((m₁ − m₂)² + (σ₁ − σ₂)²) within sampling error, and
    above the bound for the samples' own moments."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(0.3, 1.7, 200_000), rng.normal(-1.1, 0.4, 200_000)
    quantile_w2 = np.sqrt(np.mean((np.sort(x) - np.sort(y)) ** 2))
    assert gelbrich_bound(np.array([0.3]), np.array([[1.7**2]]), np.array([-1.1]), np.array([[0.4**2]])) == \
        pytest.approx(np.hypot(1.4, 1.3), rel=1e-12)
    assert quantile_w2 == pytest.approx(np.hypot(1.4, 1.3), rel=5e-3)
    own = gelbrich_bound(*empirical_moments(x[:, None]), *empirical_moments(y[:, None]))
    assert own <= quantile_w2 * (1 + 1e-12)


def test_measure_moments_are_the_weighted_moments() -> None:
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(30, 4)), rng.dirichlet(np.ones(30))
    mean, cov = measure_moments(Measure(x, w))
    np.testing.assert_allclose(mean, np.average(x, axis=0, weights=w), rtol=1e-12)
    np.testing.assert_allclose(cov, np.cov(x.T, aweights=w, bias=True), rtol=1e-10, atol=1e-14)


def test_gelbrich_rejects_bad_input_by_name() -> None:
    eye = np.eye(3)
    with pytest.raises(ValueError, match="different dimensions: 3 vs 2"):
        gelbrich_bound(np.zeros(3), eye, np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match=r"Σ₂ must be 3×3"):
        gelbrich_bound(np.zeros(3), eye, np.zeros(3), np.eye(2))
    with pytest.raises(ValueError, match=r"Σ₁ is not positive semi-definite \(smallest eigenvalue -1"):
        gelbrich_bound(np.zeros(3), np.diag([1.0, -1.0, 1.0]), np.zeros(3), eye)
    with pytest.raises(ValueError, match="Σ₂ is not symmetric"):
        gelbrich_bound(np.zeros(3), eye, np.zeros(3), eye + np.triu(np.ones((3, 3)), 1))
    with pytest.raises(ValueError, match="NaN or inf"):
        gelbrich_bound(np.array([0.0, np.nan, 0.0]), eye, np.zeros(3), eye)
    # rounding-size negative eigenvalues are clipped, not rejected
    assert gelbrich_bound(np.zeros(2), np.diag([1.0, -1e-17]), np.zeros(2), np.diag([1.0, 0.0])) == 0.0


# -------------------------------------------------------------------- the bracket on random problems
FAMILIES = ("gaussian", "uniform_cube", "mixture", "heavy_tail", "discrete", "low_rank")


def cloud(family: str, n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    if family == "gaussian":
        return rng.normal(size=(n, d)) @ rng.normal(size=(d, d))
    if family == "uniform_cube":
        return rng.uniform(-1.0, 1.0, size=(n, d)) * rng.uniform(0.2, 3.0, d)
    if family == "mixture":
        centres = rng.normal(scale=3.0, size=(3, d))
        return centres[rng.integers(0, 3, n)] + 0.3 * rng.normal(size=(n, d))
    if family == "heavy_tail":
        return rng.standard_t(1.5, size=(n, d))
    if family == "discrete":  # few distinct points, many duplicates
        return rng.integers(0, 3, size=(n, d)).astype(np.float64)
    direction = rng.normal(size=d)  # low_rank: points on a line (a rank-1 covariance)
    return rng.normal(size=(n, 1)) * direction + rng.normal(size=d)


def random_problem(seed: int) -> tuple[np.ndarray, np.ndarray, FedWaDConfig, str]:
    """One problem: d ∈ 1..20, n_μ ≠ n_ν ∈ 3..60, two families (or ν = μ, or ν a translate of μ), S, K, t and
    the interpolation drawn at random."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 21))
    n_mu, n_nu = (int(v) for v in rng.integers(3, 61, size=2))
    kind = ["two families"] * 8 + ["same cloud", "translate"]
    what = kind[seed % len(kind)]
    f_mu, f_nu = (str(f) for f in rng.choice(FAMILIES, size=2))
    x = cloud(f_mu, n_mu, d, rng)
    if what == "same cloud":
        y = x.copy()
    elif what == "translate":
        y = x + rng.normal(size=d)
    else:
        y = cloud(f_nu, n_nu, d, rng) * rng.uniform(0.3, 3.0) + rng.normal(scale=2.0, size=d)
    interpolation = "exact" if rng.random() < 0.25 else "approx"
    config = FedWaDConfig(support_size=int(rng.integers(1, max(len(x), len(y)) + 1)),
                          iterations=int(rng.integers(1, 4 if interpolation == "exact" else 7)),
                          t="random" if rng.random() < 0.7 else float(rng.uniform(0.1, 0.9)),
                          interpolation=interpolation, solver="network_simplex")
    pair = f"{f_mu}({n_mu}) vs {f_nu}({n_nu})" if what == "two families" else f"{f_mu}({n_mu})"
    label = f"#{seed} {what}: {pair} in d={d}, S={config.support_size}, K={config.iterations}, {interpolation}"
    return x, y, config, label


N_PROBLEMS = 240


@pytest.mark.slow  # 240 problems, each with an exact W2
def test_lower_le_exact_le_upper_on_many_problems_gaussian_or_not() -> None:
    """lower ≤ W₂ ≤ upper for 240 seeded problems (uniform cubes, mixtures, t(1.5) tails, duplicated lattice
    points, rank-1 clouds, Gaussians; different n per client, d = 1..20, ν = μ and translates), with W₂ from
    POT on the empirical measures. The lower bound is the protocol's own (from the clients' messages) and
    equals Gelbrich's bound for numpy's biased covariance of the samples — for empirical measures with their
    own moments the bound holds exactly. Margins are relative to max(W₂, spread · 1e-3); rounding only may
    make them negative."""
    low_margins, high_margins = [], []
    for seed in range(N_PROBLEMS):
        x, y, config, label = random_problem(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # wide brackets are expected here
            result = federated_wasserstein(x, y, config, seed=seed)
        exact = exact_w2(x, y)
        independent = gelbrich_bound(*empirical_moments(x), *empirical_moments(y))
        spread = np.sqrt((np.trace(np.atleast_2d(np.cov(x.T, bias=True)))
                          + np.trace(np.atleast_2d(np.cov(y.T, bias=True)))) / 2)
        # two roundings of a singular covariance differ by ~ε·tr Σ, their roots by ~√ε·spread
        assert result.lower == pytest.approx(independent, rel=1e-9, abs=1e-7 * spread), label
        scale = max(exact, 1e-3 * spread, 1e-300)
        low_margins.append((exact - result.lower) / scale)
        high_margins.append((result.upper - exact) / scale)
        assert low_margins[-1] >= -1e-8, f"{label}: lower {result.lower!r} > exact {exact!r}"
        assert high_margins[-1] >= -1e-8, f"{label}: upper {result.upper!r} < exact {exact!r}"
        assert result.bracket == (result.lower, result.estimate) and result.kind == FEDWAD.UPPER_BOUND
    worst_low, worst_high = min(low_margins), min(high_margins)
    print(f"\n{N_PROBLEMS} problems: min (W2 − lower)/W2 = {worst_low:.3g}, min (upper − W2)/W2 = {worst_high:.3g}; "
          f"median {np.median(low_margins):.3g} and {np.median(high_margins):.3g}")


# ----------------------------------------------------------------------------------------- the warning
def user_case(n: int, d: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """The outside user's setting: two d-D Gaussian clouds of n points, N(0, I) vs N(m, 1.5² I), ‖m‖ = 2 —
    the clouds of the measured S table in FedWaDConfig's docstring (data seed 100 + d + n)."""
    rng = np.random.default_rng(100 + d + n)
    return rng.standard_normal((n, d)), rng.standard_normal((n, d)) * 1.5 + 2.0 / np.sqrt(d)


@pytest.mark.slow  # FedWaD on 2,000 points
def test_the_outside_users_case_warns_once_with_the_numbers_and_the_remedy() -> None:
    """Two 5-D Gaussians, n = 2,000, default S = 10: the estimate is 83 % above POT's exact W₂ (the user
    measured +73 % on theirs) and the run warns once, naming the estimate, the bound, the ratio and what to do."""
    x, y = user_case(2000)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        result = federated_wasserstein(x, y, FedWaDConfig(), seed=0)
    bracket = [w for w in record if issubclass(w.category, RuntimeWarning) and "Gelbrich" in str(w.message)]
    assert len(bracket) == 1 and bracket[0].filename == __file__  # points at the caller's line
    text = str(bracket[0].message)
    assert f"{result.upper:.4g}" in text and f"{result.lower:.4g}" in text and f"{result.ratio:.2f}×" in text
    assert "raise S" in text and "S = 10" in text and "max(n, m)" in text
    support = [str(w.message) for w in record if "support rule" in str(w.message)]  # S = 10 < 2,000: its own warning
    assert len(support) == 1 and result.notes == [support[0], text]
    exact = exact_w2(x, y)
    assert result.lower <= exact <= result.upper and result.upper > 1.7 * exact and result.ratio > 1.25


@pytest.mark.slow  # K·3 network simplex solves of 500 × 500
def test_no_warning_at_s_equal_n() -> None:
    """The same setting with S = n (n = 500 to keep the test short; K·3 network simplex solves of n × n): no
    warning, and the bracket is tight: the estimate within 1 % above W₂ (measured +0.5 %), the bound 13.5 %
    below it (the sample's W₂ exceeds the Gaussian value)."""
    x, y = user_case(500)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = federated_wasserstein(x, y, FedWaDConfig(support_size=500), seed=0)
    exact = exact_w2(x, y)
    assert result.notes == [] and result.ratio < FEDWAD.BRACKET_RATIO
    assert exact <= result.upper < 1.01 * exact and result.lower > exact / 1.15


def test_a_cloud_against_itself() -> None:
    """μ = ν: W₂ = 0 and the lower bound is 0 (to rounding). S = 10 of 300 points leaves the estimate far above
    0 — it warns (the absolute tolerance does not hide it); S = n drives it to 0 without a warning."""
    x = np.random.default_rng(3).normal(size=(300, 5))
    with pytest.warns(RuntimeWarning, match="far above the Gelbrich lower bound"):
        loose = federated_wasserstein(x, x, FedWaDConfig(support_size=10), seed=0)
    assert loose.lower < 1e-12 and loose.upper > 1.0 and loose.ratio > 1e6
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        tight = federated_wasserstein(x, x, FedWaDConfig(support_size=300), seed=0)
    assert tight.upper < 1e-6 and tight.notes == []


def test_the_bracket_rule_and_its_guarantee() -> None:
    """No warning means upper ≤ 1.25 · lower + 0.05 · spread ≤ 1.25 · W₂ + 0.05 · spread."""
    assert not FEDWAD.bracket_is_wide(1.0, 1.25, 0.0) and FEDWAD.bracket_is_wide(1.0, 1.2501, 0.0)
    assert not FEDWAD.bracket_is_wide(0.0, 0.05, 1.0) and FEDWAD.bracket_is_wide(0.0, 0.0501, 1.0)


# --------------------------------------------------------------------- the result, status and options
def test_moments_change_no_number_and_no_random_draw() -> None:
    """lower_bound on or off: the same estimate, ξ and A^k bit for bit (the moments draw no random number);
    off, no moment message and no lower bound."""
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(120, 3)), rng.normal(size=(90, 3)) + 0.5
    for base in (dict(support_size=7, iterations=6, record_history=True), dict(support_size=30, iterations=4)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            on = federated_wasserstein(x, y, FedWaDConfig(**base), seed=5)
        off = federated_wasserstein(x, y, FedWaDConfig(**base, lower_bound=False), seed=5)
        assert on.estimate == off.estimate and on.history == off.history
        np.testing.assert_array_equal(on.xi.support, off.xi.support)
        assert off.lower is None and off.bracket == (0.0, off.estimate) and off.ratio is None
        assert "moments" not in set(off.ledger.to_frame().kind) and on.lower is not None


def test_p1_has_no_lower_bound_and_says_why() -> None:
    rng = np.random.default_rng(6)
    with pytest.warns(RuntimeWarning, match="support rule not met: support_size S = 5 is below"):
        result = federated_wasserstein(rng.normal(size=(40, 2)), rng.normal(size=(30, 2)),
                                       FedWaDConfig(support_size=5, iterations=3, p=1), seed=0)
    assert result.lower is None and result.ratio is None and result.kind == "upper bound (triangle inequality)"
    assert result.notes[-1] == "no lower bound: Gelbrich's bound is for W2, this run computed W1"
    assert len(result.notes) == 2 and "support rule" in result.notes[0]  # S = 5 < 40: the support rule's note
    assert "moments" not in set(result.ledger.to_frame().kind)


def test_status_says_whether_a_k_settled() -> None:
    """Exact interpolation at S = n (theorem 2: A^k non-increasing) settles within 15 iterations; without a
    history the status is "not monitored"; hand-made sequences check the rule itself."""
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(40, 2)), rng.normal(size=(40, 2)) + 1.0
    settled = federated_wasserstein(x, y, FedWaDConfig(support_size=40, iterations=15, interpolation="exact",
                                                       record_history=True), seed=0)
    assert settled.status == "converged" and settled.converged is True
    unmonitored = federated_wasserstein(x, y, FedWaDConfig(support_size=40, iterations=3), seed=0)
    assert unmonitored.status == "not monitored" and unmonitored.converged is None
    status = FEDWAD.history_status
    assert status([5.0, 4.0, 3.0, 2.0, 2.0, 2.0, 2.0]) == "converged"
    assert status([5.0, 4.0, 3.0, 2.0, 2.0, 2.0, 1.99]) == "not converged"  # still moving by 0.5 %
    assert status([2.0, 2.0, 2.0]) == "not converged"  # too short to judge
    assert status([]) == "not monitored"


def test_clear_errors_for_an_empty_client_and_mismatched_dimensions() -> None:
    x = np.random.default_rng(8).normal(size=(20, 3))
    config = FedWaDConfig(support_size=4, iterations=2)
    with pytest.raises(DegenerateClientError, match=r"client 'bob' has no samples \(shape \(0, 3\)\)"):
        federated_wasserstein(x, np.empty((0, 3)), config, names=("alice", "bob"))
    with pytest.raises(ValueError, match=r"clients 'alice' and 'bob' have different feature dimensions \(3 vs 2\)"):
        federated_wasserstein(x, x[:, :2], config, names=("alice", "bob"))
    with pytest.raises(DegenerateClientError, match=r"client 'alice' has NaN or inf in 1 sample"):
        federated_wasserstein(np.where(np.arange(60).reshape(20, 3) == 4, np.nan, x), x, config,
                              names=("alice", "bob"))
    with pytest.raises(ValueError, match=r"client 'alice': samples must be a 2-D \(n, d\) array"):
        federated_wasserstein(x[:, 0], x, config, names=("alice", "bob"))


# ------------------------------------------------------------------------- ledger and privacy boundary
def test_moment_messages_are_ledgered_and_carry_no_sample() -> None:
    """Each client sends one MomentMessage (d×d covariance + mean, 8·d(d + 1) bytes) in round K + 1; the
    server receives nothing else new, and no field of anything it received is a near-copy of a sample."""
    rng = np.random.default_rng(9)
    d, K = 4, 5
    x, y = rng.normal(size=(50, d)), rng.normal(size=(35, d)) + 1.0
    channel = Channel(keep_inbox=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = federated_wasserstein(x, y, FedWaDConfig(support_size=35, iterations=K), seed=2, channel=channel)
    frame = result.ledger.to_frame()
    moments = frame[frame.kind == "moments"]
    assert len(moments) == 2 and set(moments["round"]) == {K + 1} and set(moments.receiver) == {"server"}
    assert set(moments.sender) == {"client_mu", "client_nu"} and set(moments.payload) == {"moments"}
    assert set(moments["shape"]) == {f"{d}x{d}"} and set(moments.nbytes) == {8 * d * (d + 1)}
    received = channel.received_by("server")
    assert all(isinstance(m, (MeasureMessage, DistanceMessage, MomentMessage)) for m in received)
    sent = {m.sender: m for m in received if isinstance(m, MomentMessage)}
    np.testing.assert_allclose(sent["client_mu"].mean, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(sent["client_nu"].covariance, np.cov(y.T, bias=True), rtol=1e-10)
    inspection = assert_boundary_holds(received, {"client_mu": x, "client_nu": y})
    assert inspection.values == sum(a.size for m in received for a in m.arrays())


def test_module_examples_run() -> None:
    for module, examples in ((gelbrich_module, 4), (FEDWAD, 5)):
        outcome = doctest.testmod(module)
        assert outcome.attempted >= examples and outcome.failed == 0, module.__name__
