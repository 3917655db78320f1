"""FedWaD's ``solver="auto"`` falls back to the network simplex where semi-dual Newton fails (issue #11,
item 4). Independent truth: POT's exact network simplex (``ot.emd2`` / ``ot.emd``)."""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import ot
import pytest

from otfed.errors import OTConvergenceError
from otfed.federation.fedwad import (FedWaDConfig, distance_to, federated_wasserstein, interpolation_step,
                                     subproblem_transport)
from otfed.ot import Measure, Transport, interpolate_approx, optimal_transport

AUTO = FedWaDConfig(support_size=3, solver="auto")
NEWTON = FedWaDConfig(support_size=3, solver="semidual_newton")
# the module itself: ``otfed.federation.fedwad`` as an attribute path names the re-exported function fedwad()
FEDWAD_MODULE = importlib.import_module("otfed.federation.fedwad")
FALLBACK = r"semi-dual Newton solver failed on a {}×{} subproblem \(semi-dual Newton stopped at column-marginal error"


@pytest.fixture(scope="module")
def stalling() -> tuple[Measure, Measure]:
    """A tall subproblem on which semi-dual Newton stalls: a client of 8,000 samples of only two distinct
    points (4,029 and 3,971 copies) against ξ of S = 3 atoms, in 2-D.

    Each group of copies (mass ≈ ½) is split between atoms, so whole groups sit on the softmax boundary and
    ∂(column mass)/∂g ≈ ½·π(1−π)/ε is huge at the final ε = 1e-7·mean(C) ≈ 6e-7. Newton's last steps
    (≈ 2e-12 in g) predict increases of F (≈ 3e-18) far below the rounding noise of F, a sum of 8,000
    log-sum-exps of size |C|/ε ≈ 1e7; the line search backs off to steps below one ulp of g, which leave
    g unchanged, and the column marginal stays at 1.4e-6 > tol = 1e-9 for all 1,000 Newton steps — the
    failure of the issue (20,000 × 10, stalled at 5.2e-8), in ≈ 2 s instead of ≈ 16 s.
    """
    rng = np.random.default_rng([23, 2, 2])
    points = rng.normal(size=(2, 2))
    private = Measure.uniform(points[rng.integers(0, 2, 8000)])
    xi = Measure.uniform(rng.normal(size=(3, 2)))
    return private, xi


def _emd_plan(mu: Measure, nu: Measure) -> np.ndarray:
    return ot.emd(mu.weights, nu.weights, ot.dist(mu.support, nu.support), numItermax=10_000_000)


def test_auto_distance_falls_back_to_the_exact_value_and_warns_once(stalling) -> None:
    private, xi = stalling
    with pytest.warns(RuntimeWarning, match=FALLBACK.format(8000, 3)) as record:
        distance = distance_to(private, xi, AUTO)
    assert len([w for w in record if issubclass(w.category, RuntimeWarning)]) == 1
    truth = ot.emd2(private.weights, xi.weights, ot.dist(private.support, xi.support), numItermax=10_000_000)
    assert distance**2 == pytest.approx(truth, rel=1e-9)


def test_auto_interpolation_falls_back_to_the_exact_interpolant(stalling) -> None:
    """The client step ξ → private (the S×n orientation): eq. 10 from POT's exact plan."""
    private, xi = stalling
    with pytest.warns(RuntimeWarning, match=FALLBACK.format(3, 8000)):
        interp, distance = interpolation_step(xi, private, 0.3, AUTO)
    plan = _emd_plan(xi, private)
    expected = interpolate_approx(xi, private, plan, 0.3)
    # two groups vs three atoms, generic costs: the group-level optimal plan is unique, so are the projections
    np.testing.assert_allclose(interp.support, expected.support, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(interp.weights, xi.weights)
    assert distance**2 == pytest.approx(float((plan * ot.dist(xi.support, private.support)).sum()), rel=1e-9)


def test_explicit_semidual_newton_still_raises(stalling) -> None:
    private, xi = stalling
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback, so no fallback warning either
        with pytest.raises(OTConvergenceError, match=r"column-marginal error .* > tol=1e-09 .* 8000×3 problem"):
            distance_to(private, xi, NEWTON)


def test_auto_where_newton_converges_is_newton_unchanged_and_silent() -> None:
    rng = np.random.default_rng(11)
    private = Measure.uniform(rng.normal(size=(2000, 2)) + 1.0)
    xi = Measure.uniform(rng.normal(size=(10, 2)))
    config = FedWaDConfig(support_size=10, solver="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transport = subproblem_transport(private, xi, config)
        interp, _ = interpolation_step(xi, private, 0.4, config)
    newton = optimal_transport(private, xi, p=2, solver="semidual_newton")  # the solver auto picked before
    np.testing.assert_array_equal(transport.plan, newton.plan)
    assert transport.cost == newton.cost
    plan_t = optimal_transport(xi, private, p=2, solver="semidual_newton").plan
    np.testing.assert_array_equal(interp.support, interpolate_approx(xi, private, plan_t, 0.4).support)
    # and Newton's value is the exact one up to its entropic excess ε·log S (ε = 1e-7·mean C)
    C = ot.dist(private.support, xi.support)
    truth = ot.emd2(private.weights, xi.weights, C, numItermax=10_000_000)
    assert truth * (1 - 1e-9) <= transport.cost**2 <= truth + 1e-7 * C.mean() * np.log(10) + 1e-12


def test_auto_falls_back_on_a_non_finite_newton_plan(monkeypatch) -> None:
    rng = np.random.default_rng(12)
    private = Measure.uniform(rng.normal(size=(400, 2)))
    xi = Measure.uniform(rng.normal(size=(3, 2)))
    real = optimal_transport

    def nan_newton(mu, nu, p=2, solver="network_simplex", **options):
        if solver == "semidual_newton":
            return Transport(plan=np.full((mu.n, nu.n), np.nan), cost=float("nan"), p=p)
        return real(mu, nu, p=p, solver=solver, **options)

    monkeypatch.setattr(FEDWAD_MODULE, "optimal_transport", nan_newton)
    with pytest.warns(RuntimeWarning, match=r"400×3 subproblem \(its plan or cost is not finite\)"):
        distance = distance_to(private, xi, AUTO)
    truth = ot.emd2(private.weights, xi.weights, ot.dist(private.support, xi.support), numItermax=10_000_000)
    assert distance**2 == pytest.approx(truth, rel=1e-9)


def test_auto_names_both_failures_when_the_network_simplex_fails_too(monkeypatch) -> None:
    rng = np.random.default_rng(13)
    private = Measure.uniform(rng.normal(size=(400, 2)))
    xi = Measure.uniform(rng.normal(size=(3, 2)))

    def failing(mu, nu, p=2, solver="network_simplex", **options):
        raise OTConvergenceError(f"{solver} gave up")

    monkeypatch.setattr(FEDWAD_MODULE, "optimal_transport", failing)
    with pytest.warns(RuntimeWarning, match="400×3"):
        with pytest.raises(OTConvergenceError, match=r"both solvers failed on a 400×3 subproblem .*"
                                                     r"semidual_newton gave up.*network_simplex gave up"):
            distance_to(private, xi, AUTO)


def test_a_fedwad_run_with_a_stalling_subproblem_completes_as_with_the_network_simplex() -> None:
    """Issue #11's symptom end to end: the client holding the duplicated points hits a stalling Newton
    subproblem (one of its 3×8,000 interpolations ξ → client); ``auto`` completes, with one warning, and its
    estimate is the one every-subproblem-exact FedWaD gives (the same t and ξ⁰ draws)."""
    rng = np.random.default_rng([23, 2, 2])
    points = rng.normal(size=(2, 2))
    x = points[rng.integers(0, 2, 8000)]
    y = np.random.default_rng(5).normal(size=(800, 2)) + 1.0
    with pytest.warns(RuntimeWarning, match=FALLBACK.format(3, 8000)):
        auto = federated_wasserstein(x, y, FedWaDConfig(support_size=3, iterations=2), seed=3)
    exact = federated_wasserstein(x, y, FedWaDConfig(support_size=3, iterations=2, solver="network_simplex"), seed=3)
    assert auto.estimate == pytest.approx(exact.estimate, rel=1e-9)
