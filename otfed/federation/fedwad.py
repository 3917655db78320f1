"""FedWaD (Rakotomamonjy et al., ICLR 2024): the Wasserstein distance between two clients' measures,
computed by a server that only ever receives interpolating measures and, at the end, two distances.

Algorithm 1. ξ⁰ = random support of size S. For k = 1..K:
  client μ:  ξ_μ^k = InterpMeas(μ, ξ^{k−1})           (eq. 5 exact or eq. 10 approximate)
  client ν:  ξ_ν^k = InterpMeas(ν, ξ^{k−1})
  server:    ξ^k  = InterpMeas(ξ_μ^k, ξ_ν^k)
Finally the clients return d_{μ,ξ^K} = W_p(μ, ξ^K) and d_{ξ^K,ν} = W_p(ξ^K, ν); the estimate is their sum.
A^k = W(μ,ξ_μ^k) + W(ξ_μ^k,ξ^k) + W(ξ^k,ξ_ν^k) + W(ξ_ν^k,ν) is non-increasing and ≥ W_p(μ,ν)
(theorem 2, for exact interpolating measures).

How far to trust it. The estimate is an UPPER bound of W_p(μ, ν), whatever ξ^K is: the triangle inequality
W_p(μ, ν) ≤ W_p(μ, ξ) + W_p(ξ, ν) (eq. 6), with the final distances computed exactly (the network simplex;
the semi-dual solver's cost of a near-feasible plan is above W_p up to its marginal tolerance). It reaches
W_p only when ξ^K lies on a geodesic between μ and ν, which a support of S ≪ n atoms cannot: with S = 10 it
was 18–83 % above W₂ in the measurements quoted at :class:`FedWaDConfig` (with S = n, within 1 %; for clients of
different sizes S must be a multiple of both, :func:`support_rule_met`). For
p = 2 the clients may also send their means and covariances (:class:`~otfed.federation.messages.MomentMessage`),
from which the server computes Gelbrich's LOWER bound W₂(μ, ν) ≥ √(‖m_μ − m_ν‖² + B²(Σ_μ, Σ_ν)) (Gelbrich
1990, Theorem 2.1; :func:`~otfed.ot.gelbrich_bound`), valid for any measures with those moments.
:class:`FedWaDResult` carries both (``lower``, ``upper``, ``bracket``, ``ratio``), whether A^k settled
(``status``, with ``record_history``), and a ``RuntimeWarning`` says when the bracket is wide.

Client and server steps are pure functions of their inputs (a private measure, or messages); the
:class:`WassersteinClient` / :class:`WassersteinServer` roles wrap them behind typed messages, and
:func:`fedwad` drives the protocol over a :class:`~otfed.federation.ledger.Channel`. Every OT subproblem
goes through :func:`subproblem_transport` (solver choice, and the fallback of ``solver="auto"``).
"""
from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from pydantic import Field, model_validator

from otfed.errors import DegenerateClientError, OTConvergenceError, SupportGrowthError
from otfed.federation.ledger import Channel, Ledger
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage, MomentMessage
from otfed.ot import (Measure, Transport, gelbrich_bound, interpolate_approx, interpolate_exact, measure_moments,
                      optimal_transport)
from otfed.schema import InterpolationTime, Strict, as_config

_HERE = os.path.dirname(os.path.abspath(__file__))

Interpolation = Literal["approx", "exact"]
Solver = Literal["auto", "network_simplex", "semidual_newton"]


#: The largest S :class:`FedWaDConfig` accepts (``support_size``'s bound).
MAX_SUPPORT_SIZE = 20000


class FedWaDConfig(Strict):
    """Algorithm 1 settings — also the ``fedwad`` params groups of ``params.yaml``.

    ``t="random"`` (default; ``None`` is accepted as the same) draws t ~ U(0,1) independently at every
    interpolation: with a fixed t = 0.5 the estimate stalls strictly above W in dimension ≥ 10 (FedWaD §3 lets
    clients pick t at random).

    ``solver="auto"`` picks per subproblem (:func:`subproblem_solver`): the network simplex for exact
    interpolation (eq. 5 needs its sparse vertex plan) and for comparable sizes; the semi-dual Newton
    solver when one side is ≥ 100× larger than the other (S ≪ n), where it is 6–180× faster. Should
    Newton fail on a subproblem (:class:`~otfed.errors.OTConvergenceError`, or a non-finite plan), ``auto``
    solves that subproblem with the network simplex instead and says so with a ``RuntimeWarning``
    (:func:`subproblem_transport`). An explicit ``"semidual_newton"`` or ``"network_simplex"`` never
    falls back: its errors propagate.
    ``record_history`` keeps A^k per iteration (and lets the result say whether it settled,
    :attr:`FedWaDResult.status`); ``max_support`` (exact mode) stops with :class:`SupportGrowthError` beyond
    this many atoms.

    ``lower_bound`` (p = 2 only; ignored for p = 1): :func:`federated_wasserstein` has each client send its
    mean and covariance (:class:`~otfed.federation.messages.MomentMessage`, one message each, after the last
    round) and the result carries Gelbrich's lower bound next to the estimate, which is an upper bound. The
    privacy cost: the server learns both clients' first two moments, exactly. Set it False where that is too
    much. :func:`fedwad` itself exchanges moments only when its caller asks (``lower_bound=True``): federated
    OTDD (d×d moments of augmented vectors), DP FedWaD (its guarantee does not cover un-noised moments) and
    FedBary do not; FedBaryConfig inherits this field without using it.

    Choosing S (``support_size``). The rule (:func:`support_rule_met`): S a multiple of BOTH clients' sample
    sizes n and m — S = n for equal sizes, S = max(n, m) where the smaller divides the larger, S = lcm(n, m)
    otherwise (:func:`support_rule_size`) — and NOT the smaller client's size. At such an S, μ and ν are uniform
    measures on S atoms each (every sample repeated S/n resp. S/m times) and theorem 1 makes eq. 10 exact. With
    S < max(n, m), ξ has too few atoms to lie on a geodesic; with S ≥ max(n, m) but not a multiple of both, eq. 10
    averages atoms of ξ that the plans split between samples. Either way the estimate is biased UP, and more
    iterations do not remove that bias. Where K·3 network simplex solves at that S are unaffordable (or lcm(n, m)
    exceeds :data:`MAX_SUPPORT_SIZE`), use the largest affordable S — and read the bracket: in d ≥ 5 even S = 100
    stayed 28–62 % above W₂ (first table). Where approximate interpolation misses the rule,
    :func:`federated_wasserstein` raises a ``RuntimeWarning`` before the run that names both sizes and the S to use
    (:func:`support_rule_warning`; its text also in :attr:`FedWaDResult.notes`, before the bracket's). The entry
    point can, as it holds both clients' data; the protocol (:func:`fedwad`) does not tell the server the clients'
    sample counts. Exact interpolation (eq. 5) is not held to the rule.

    Equal sizes (two Gaussian clouds of n points each, N(0, I) vs N(m, 1.5² I) with ‖m‖ = 2, data seed
    100 + d + n, FedWaD seed 0, K = 20, approximate interpolation, solver "auto"; estimate / POT's exact W₂ − 1,
    and exact W₂ / Gelbrich's bound; ``python -m studies.fedwad_support_rule 2,5,50 500,2000 10,100,n``):

    ====  ======  ========  =========  ========  ===============
    d     n       S = 10    S = 100    S = n     W₂ / Gelbrich
    ====  ======  ========  =========  ========  ===============
    2     500     +18 %     +2.3 %     +0.0 %    1.009
    2     2000    +21 %     +3.1 %     +0.0 %    1.004
    5     500     +73 %     +28 %      +0.5 %    1.135
    5     2000    +83 %     +38 %      +0.1 %    1.080
    50    500     +65 %     +50 %      +1.0 %    2.26
    50    2000    +73 %     +62 %      +1.0 %    2.39
    ====  ======  ========  =========  ========  ===============

    Unequal sizes (the same clouds: n points of N(0, I) against m of N(m, 1.5² I); data seeds 100 + d + n and
    10⁶ + 100 + d + n with FedWaD seeds 0 and 1, K = 20, the range over both; the rule met (✓) at S = max(n, m)
    where the smaller size divides the larger; ``python -m studies.fedwad_support_rule 2,5,50
    600:200,600:240,600:400,600:60,200:600 min,300,max 0,1``):

    ====  =========  ===============  ============  ===============
    d     n : m      S = min(n, m)    S = 300       S = max(n, m)
    ====  =========  ===============  ============  ===============
    5     600 : 200  +1.7–3.9 %       +7.8–9.8 %    +0.27–0.66 % ✓
    5     200 : 600  +11–17 %         +7.3–12 %     +0.26–0.77 % ✓
    5     600 : 60   +2.9–7.7 %       +1.5–6.9 %    +0.14–0.44 % ✓
    5     600 : 240  +4.7–6.2 %       +8.3–10 %     +1.2–4.7 %
    5     600 : 400  +1.6–3 %         +11 %         +1.7–5.8 %
    50    600 : 200  +16–22 %         +18–23 %      +0.26–0.47 % ✓
    50    200 : 600  +5.5–9.9 %       +18–22 %      +0.37–0.49 % ✓
    50    600 : 60   +5.2–17 %        +6.9–16 %     +0.21–0.33 % ✓
    50    600 : 240  +3.7–19 %        +18–22 %      +3.3–7.9 %
    50    600 : 400  +14–15 %         +27 %         +5.1–12 %
    ====  =========  ===============  ============  ===============

    In 2-D every one of these runs was within 1 % (S = min(n, m): ≤ 0.92 %; S = max(n, m): ≤ 0.12 %). More atoms
    alone do not help: S = 300 was, on average over the two seeds, above S = min(n, m) in 8 of the 10 rows. Where
    no size divides the other, S = max(n, m) still misses the rule, and lcm(n, m) is what helps (300 points
    against 200 and 120; the same clouds and seeds, K = 20 and 60; ``python -m studies.fedwad_support_rule 5,50
    300:200,300:120 min,max,lcm 0,1 20,60``):

    ====  =========  ====  ===============  ===============  ===============
    d     n : m      K     S = min(n, m)    S = max(n, m)    S = lcm = 600
    ====  =========  ====  ===============  ===============  ===============
    5     300 : 200  20    +1.3–3.1 %       +1.2–5.1 %       +0.25–0.6 % ✓
    5     300 : 200  60    +1.8–6.8 %       +0.75–2.1 %      +0.13–0.25 % ✓
    5     300 : 120  20    +4.5–5.4 %       +1–3.9 %         +0.18–0.54 % ✓
    5     300 : 120  60    +4.6–13 %        +0.57–1.7 %      +0.12–0.18 % ✓
    50    300 : 200  20    +13–17 %         +3.6–9.4 %       +0.38–0.4 % ✓
    50    300 : 200  60    +8.7–20 %        +0.88–8.2 %      +0.14–0.4 % ✓
    50    300 : 120  20    +7.1–18 %        +2.5–6.6 %       +0.25–0.4 % ✓
    50    300 : 120  60    +4–26 %          +0.7–5.5 %       +0.12–0.3 % ✓
    ====  =========  ====  ===============  ===============  ===============

    Where the rule is met (✓, both tables) the estimate was within 0.8 % of W₂ in every run; where it is missed,
    60 rounds instead of 20 did not close the gap (up to +8.2 % at S = max(n, m), +26 % at S = min(n, m)).

    The bracket warning (``lower_bound``): a ``RuntimeWarning``, its text also in
    :attr:`FedWaDResult.notes`, when upper > :data:`BRACKET_RATIO` (1.25) × lower + :data:`BRACKET_ABS_TOL`
    (0.05) × the clouds' spread. No warning is a guarantee — W₂ ≥ lower, so the estimate is then at most 25 %
    (+ 0.05 × spread) above W₂. A warning is not a proof of error: in the equal-size grid it fired for every
    S = 10 and S = 100 run in d ≥ 5, for none at S = n in d ≤ 5, and at S = n in d = 50, where W₂ between
    2,000 samples is itself 2.4× the moment bound (the empirical measures are far from Gaussian at that
    sample size); there only a larger S, or a second run, tells. With S = 10 in d = 2 (+18–21 %) it stayed
    silent, within its 25 % guarantee. In the two unequal-size grids it fired in 3 of the 40 5-D runs that missed
    the support rule (up to +17 % there) and in all 54 50-D runs: the support warning is what tells in 5-D.
    """

    support_size: int = Field(10, ge=1, le=MAX_SUPPORT_SIZE,
                              description="S, support of the interpolating measure ξ; most accurate at a multiple of "
                                          "both clients' sample sizes, lcm(n, m) (support_rule_met).")
    iterations: int = Field(20, ge=1, le=10000, description="K.")
    t: InterpolationTime = Field("random", description="'random' (default) or a fixed t in (0,1).")
    p: Literal[1, 2] = 2
    interpolation: Interpolation = "approx"
    solver: Solver = Field("auto", description="auto: network simplex for exact interpolation and comparable "
                                               "sizes, semi-dual Newton for approx with S ≪ n (network "
                                               "simplex, with a warning, where Newton fails).")
    init_scale: float = Field(1.0, gt=0.0, description="ξ⁰ ~ N(0, init_scale² I).")
    record_history: bool = False
    max_support: int | None = Field(None, ge=1)
    lower_bound: bool = Field(True, description="p = 2: clients send their mean and covariance (revealed to the "
                                                "server) for Gelbrich's lower bound of W2 next to the estimate.")

    @model_validator(mode="after")
    def _exact_needs_simplex(self) -> "FedWaDConfig":
        if self.interpolation == "exact" and self.solver == "semidual_newton":
            raise ValueError("solver: exact interpolation (eq. 5) needs 'network_simplex' (or 'auto'): an "
                             "entropic plan is dense and the support would grow to n·m atoms")
        return self

    @property
    def fixed_t(self) -> float | None:
        """The fixed interpolation time, or None when t is drawn at random."""
        return None if self.t == "random" else float(self.t)


SEMIDUAL_MIN_RATIO = 100


def subproblem_solver(config: FedWaDConfig, n: int, m: int) -> str:
    """The OT solver for one n×m subproblem. ``auto``: semi-dual Newton iff approximate interpolation and
    max(n, m) ≥ 100·min(n, m) — measured: 10×20,000 ≈ 100× faster than the network simplex, 100×20,000
    6×, but 100–200 × 2,000–5,000 2–3× slower (bench/ and tests/ot). Where Newton then fails,
    :func:`subproblem_transport` falls back to the network simplex."""
    if config.solver != "auto":
        return config.solver
    if config.interpolation == "exact":
        return "network_simplex"
    return "semidual_newton" if max(n, m) >= SEMIDUAL_MIN_RATIO * min(n, m) else "network_simplex"


def subproblem_transport(source: Measure, target: Measure, config: FedWaDConfig) -> Transport:
    """The optimal plan and W_p(source, target) of one FedWaD subproblem (FedWaD eq. 2; Algorithm 1, the plan
    behind every InterpMeas and the final distances), by the solver :func:`subproblem_solver` picks.

    ``solver="auto"`` falls back: where it picked the semi-dual Newton solver and that raises
    :class:`~otfed.errors.OTConvergenceError` (e.g. its column marginal stalls above ``tol`` after
    ``max_newton`` steps) or returns a non-finite plan, the subproblem is solved again, exactly, by the
    network simplex, and a ``RuntimeWarning`` names the problem size and Newton's failure — once per
    fallback. If the network simplex fails as well, :class:`~otfed.errors.OTConvergenceError` names both
    failures. Without a fallback the result is exactly that of the picked solver. An explicit solver in
    the config is used as asked, with no fallback.
    """
    solver = subproblem_solver(config, source.n, target.n)
    if config.solver != "auto" or solver != "semidual_newton":
        return optimal_transport(source, target, p=config.p, solver=solver)
    try:
        transport = optimal_transport(source, target, p=config.p, solver=solver)
    except OTConvergenceError as error:
        reason = str(error)
    else:
        if np.isfinite(transport.cost) and np.isfinite(transport.plan).all():
            return transport
        reason = "its plan or cost is not finite"
    size = f"{source.n}×{target.n}"
    warnings.warn(f"FedWaD solver='auto': the semi-dual Newton solver failed on a {size} subproblem ({reason}); "
                  f"solved it with the network simplex instead", RuntimeWarning, stacklevel=2)
    try:
        return optimal_transport(source, target, p=config.p, solver="network_simplex")
    except OTConvergenceError as error:
        raise OTConvergenceError(f"FedWaD solver='auto': both solvers failed on a {size} subproblem — semi-dual "
                                 f"Newton: {reason}; network simplex (fallback): {error}") from error


def draw_t(config: FedWaDConfig, rng: np.random.Generator) -> float:
    """The interpolation time: fixed, or a fresh t ~ U(0,1) drawn privately by the party (privacy option)."""
    return config.fixed_t if config.fixed_t is not None else float(rng.uniform(1e-6, 1.0 - 1e-6))


def interpolation_step(source: Measure, target: Measure, t: float, config: FedWaDConfig) -> tuple[Measure, float]:
    """InterpMeas(source → target) at time t: eq. 10 (approx, support = |source|) or eq. 5 (exact).

    Returns the interpolating measure and W_p(source, target) (one plan, :func:`subproblem_transport`,
    serves both).
    """
    transport = subproblem_transport(source, target, config)
    build = interpolate_approx if config.interpolation == "approx" else interpolate_exact
    return build(source, target, transport.plan, t), transport.cost


def client_step(private: Measure, xi: Measure, t: float, config: FedWaDConfig) -> Measure:
    """Client side of one FedWaD iteration (Algorithm 1, lines 4–5): ξ_client = InterpMeas(ξ → private).

    Moving from ξ (t = 0) towards the private measure keeps the support size of ξ in approximate mode.
    """
    interp, _ = interpolation_step(xi, private, t, config)
    return interp


def server_step(xi_mu: Measure, xi_nu: Measure, t: float, config: FedWaDConfig) -> Measure:
    """Server side of one iteration (Algorithm 1, line 7): ξ = InterpMeas(ξ_μ, ξ_ν)."""
    interp, _ = interpolation_step(xi_mu, xi_nu, t, config)
    return interp


def distance_to(private: Measure, xi: Measure, config: FedWaDConfig) -> float:
    """W_p(private, ξ), computed by the client that holds ``private`` (Algorithm 1, line 9)."""
    return subproblem_transport(private, xi, config).cost


class WassersteinClient:
    """A client holding a private measure. It answers with interpolating measures and distances only."""

    def __init__(self, name: str, measure: Measure, config: FedWaDConfig, rng: np.random.Generator) -> None:
        self.name = name
        self._measure = measure
        self._config = config
        self._rng = rng

    @property
    def dim(self) -> int:
        """Public metadata: the feature dimension (the server needs it to initialise ξ⁰)."""
        return self._measure.dim

    def interpolate(self, request: MeasureMessage) -> MeasureMessage:
        t = draw_t(self._config, self._rng)
        xi_client = client_step(self._measure, request.measure, t, self._config)
        return MeasureMessage("interpolant", self.name, SERVER, measure=xi_client)

    def distance(self, request: MeasureMessage, kind: str = "distance") -> DistanceMessage:
        return DistanceMessage(kind, self.name, SERVER, value=distance_to(self._measure, request.measure,
                                                                           self._config))

    def moments(self) -> MomentMessage:
        """The private measure's own mean and covariance (weighted, ddof = 0; :func:`~otfed.ot.measure_moments`),
        for Gelbrich's lower bound. Reveals them to the server (the privacy cost of ``lower_bound``). Draws no
        random number: the protocol's random stream is the same with or without it."""
        mean, covariance = measure_moments(self._measure)
        return MomentMessage("moments", self.name, SERVER, mean=mean, covariance=covariance)


class WassersteinServer:
    """The server: keeps ξ and combines the clients' interpolants. Its methods take messages only."""

    def __init__(self, config: FedWaDConfig, rng: np.random.Generator, name: str = SERVER) -> None:
        self.name = name
        self.config = config
        self._rng = rng
        self.xi: Measure | None = None

    def initialise(self, dim: int) -> Measure:
        """ξ⁰: S atoms ~ N(0, init_scale² I), uniform weights."""
        support = self._rng.normal(0.0, self.config.init_scale, size=(self.config.support_size, dim))
        self.xi = Measure.uniform(support)
        return self.xi

    def broadcast(self, receiver: str) -> MeasureMessage:
        assert self.xi is not None, "initialise() first"
        return MeasureMessage("xi", self.name, receiver, measure=self.xi)

    def combine(self, msg_mu: MeasureMessage, msg_nu: MeasureMessage) -> Measure:
        t = draw_t(self.config, self._rng)
        self.xi = server_step(msg_mu.measure, msg_nu.measure, t, self.config)
        return self.xi

    def monitor(self, msg_mu: MeasureMessage, msg_nu: MeasureMessage, d_mu: DistanceMessage,
                d_nu: DistanceMessage) -> float:
        """A^k from the clients' reported W(μ,ξ_μ^k), W(ξ_ν^k,ν) and the server's own two terms."""
        assert self.xi is not None
        p = self.config.p
        inner = (optimal_transport(msg_mu.measure, self.xi, p=p).cost
                 + optimal_transport(self.xi, msg_nu.measure, p=p).cost)  # exact, for theorem 2
        return d_mu.value + inner + d_nu.value

    @staticmethod
    def estimate(d_mu: DistanceMessage, d_nu: DistanceMessage) -> float:
        """d_{μ,ν} = d_{μ,ξ^K} + d_{ξ^K,ν} (Algorithm 1, line 10) — an upper bound of W_p(μ, ν) by the
        triangle inequality (eq. 6)."""
        return d_mu.value + d_nu.value

    @staticmethod
    def lower_bound(m_mu: MomentMessage, m_nu: MomentMessage) -> float:
        """Gelbrich's lower bound √(‖m_μ − m_ν‖² + B²(Σ_μ, Σ_ν)) ≤ W₂(μ, ν) from the clients' moments
        (Gelbrich 1990, Theorem 2.1; :func:`~otfed.ot.gelbrich_bound`): valid for any measures with these
        moments, equal to W₂ for Gaussians."""
        if m_mu.mean.shape != m_nu.mean.shape:
            raise ValueError(f"clients {m_mu.sender!r} and {m_nu.sender!r} sent moments of different dimensions "
                             f"({m_mu.mean.shape[0]} vs {m_nu.mean.shape[0]})")
        return gelbrich_bound(m_mu.mean, m_mu.covariance, m_nu.mean, m_nu.covariance)

    @staticmethod
    def spread(m_mu: MomentMessage, m_nu: MomentMessage) -> float:
        """√((tr Σ_μ + tr Σ_ν) / 2): the clouds' root-mean-square radius, the scale of the bracket's absolute
        tolerance (W₂ between a measure and the Dirac at its mean is √tr Σ)."""
        return float(np.sqrt(max(0.5 * (np.trace(m_mu.covariance) + np.trace(m_nu.covariance)), 0.0)))


#: The bracket is wide (a RuntimeWarning) when upper > BRACKET_RATIO · lower + BRACKET_ABS_TOL · spread.
BRACKET_RATIO = 1.25
#: Absolute slack, relative to the clouds' spread √((tr Σ_μ + tr Σ_ν)/2), for W₂ ≈ lower ≈ 0 (e.g. μ = ν).
BRACKET_ABS_TOL = 0.05
#: A^k has settled when it changed by at most HISTORY_RTOL · A^K over its last HISTORY_WINDOW iterations.
HISTORY_RTOL = 1e-3
HISTORY_WINDOW = 3
#: What the estimate is.
UPPER_BOUND = "upper bound (triangle inequality)"

Status = Literal["converged", "not converged", "not monitored"]


def history_status(history: list[float]) -> Status:
    """Whether A^k (theorem 2) stopped decreasing: "converged" when it moved by at most
    HISTORY_RTOL · A^K over its last HISTORY_WINDOW iterations, "not converged" otherwise (or with fewer
    iterations than that), "not monitored" without a history (``record_history=False``).

    Settled is not the same as accurate: with S ≪ n, A^k settles well above W_p (the bracket tells)."""
    if not history:
        return "not monitored"
    if len(history) <= HISTORY_WINDOW:
        return "not converged"
    last = history[-1]
    return "converged" if abs(history[-1 - HISTORY_WINDOW] - last) <= HISTORY_RTOL * abs(last) else "not converged"


def support_rule_met(support_size: int, n: int, m: int) -> bool:
    """The support rule of approximate interpolation (eq. 10): S is a common multiple of both clients' sample
    sizes n and m — S = n for equal sizes, S = max(n, m) where the smaller size divides the larger, S = lcm(n, m)
    otherwise (:func:`support_rule_size`). Not the smaller client's size.

    Why: ξ has S atoms of weight 1/S, and eq. 10 moves each to the barycentric projection of its row of the plan.
    Where S is a multiple of n and of m, μ and ν are themselves uniform measures on S atoms (each sample repeated
    S/n resp. S/m times), and theorem 1 (equal sizes, uniform weights: eq. 10 is the exact interpolant, eq. 5)
    applies to them: ξ can reach a geodesic, and the estimate W_p. Below max(n, m), ξ has fewer atoms than the
    geodesic and the estimate (an upper bound, eq. 6) stays above W_p at any K; at S ≥ max(n, m) that is not a
    multiple of both, some atoms of ξ must split between samples and eq. 10 averages them — again above W_p.
    Measured in :class:`FedWaDConfig` (``studies/fedwad_support_rule.py``). Exact interpolation (eq. 5) is not
    held to it: its support grows to the plan's."""
    return support_size % n == 0 and support_size % m == 0


def support_rule_size(n: int, m: int) -> int:
    """The least S that meets :func:`support_rule_met`: lcm(n, m) (= max(n, m) where the smaller divides it)."""
    return math.lcm(n, m)


def support_rule_note(support_size: int, clients: Sequence[tuple[str, int]]) -> str:
    """The support-rule warning (:func:`support_rule_met` not met) for two ``clients`` (name, sample count): the
    sizes, why S falls short, what the measurements say it costs, and the S to use."""
    (_, n), (_, m) = clients
    larger, target = max(n, m), support_rule_size(n, m)
    sizes = ", ".join(f"{name!r}: {size}" for name, size in clients)
    if support_size < larger:
        why = (f"support_size S = {support_size} is below the larger client's sample size {larger} ({sizes} "
               f"samples): ξ has too few atoms to lie on a geodesic between the two measures, and the estimate, an "
               f"upper bound of W2, stays above it at any number of iterations ({SUPPORT_COST_BELOW}).")
    else:
        why = (f"support_size S = {support_size} is not a multiple of both clients' sample sizes ({sizes} "
               f"samples): eq. 10 splits atoms of ξ between samples and averages them, and the estimate, an upper "
               f"bound of W2, stays above it ({SUPPORT_COST_SPLIT}).")
    if target <= MAX_SUPPORT_SIZE:
        fix = (f"Set support_size={target} (lcm(n, m): a multiple of both sizes; {SUPPORT_GAIN}), or, if that is "
               f"unaffordable, keep S and read the bracket (lower_bound=True).")
    else:
        fix = (f"No allowed S (≤ {MAX_SUPPORT_SIZE}) is a multiple of both sizes (lcm = {target}): use at least "
               f"S = {larger} (max(n, m)) and read the bracket (lower_bound=True).")
    return f"FedWaD support rule not met: {why} {fix}"


#: What the measurements say (FedWaDConfig's tables; studies/fedwad_support_rule.py).
SUPPORT_COST_BELOW = ("measured with 600 vs 60–400 points, K = 20: up to +0.9 % in 2-D, +17 % in 5-D and +27 % in "
                      "50-D")
SUPPORT_COST_SPLIT = ("measured at S = max(n, m) with 600 vs 240 or 400 points, K = 20: up to +0.12 % in 2-D, +5.8 % "
                      "in 5-D and +12 % in 50-D; with 300 vs 200 or 120 still up to +8.2 % in 50-D after 60 rounds")
SUPPORT_GAIN = "measured within 0.8 % of W2 in 5-D and 50-D, K = 20 and 60"


def support_rule_warning(config: FedWaDConfig, clients: Sequence[tuple[str, int]]) -> str | None:
    """Check the support rule (:func:`support_rule_met`) for a session between two ``clients`` (name, sample
    count) before it runs: where approximate interpolation (eq. 10) misses it, raise a ``RuntimeWarning``
    (:func:`support_rule_note`, pointing at the caller's line outside otfed/federation) and return its text, for
    the result's ``notes``; else None. Exact interpolation (eq. 5) is not held to it.

    Called by the entry points that hold both clients' data (:func:`federated_wasserstein`), never by the protocol
    (:func:`fedwad`): the server does not learn the clients' sample counts."""
    (_, n), (_, m) = clients
    if config.interpolation != "approx" or support_rule_met(config.support_size, n, m):
        return None
    note = support_rule_note(config.support_size, clients)
    warnings.warn(note, RuntimeWarning, stacklevel=_stacklevel_outside_federation())
    return note


def bracket_is_wide(lower: float, upper: float, spread: float) -> bool:
    """upper > BRACKET_RATIO · lower + BRACKET_ABS_TOL · spread: the estimate may be far above W₂."""
    return upper > BRACKET_RATIO * lower + BRACKET_ABS_TOL * spread


@dataclass
class FedWaDResult:
    """Outcome of one FedWaD session: the estimate and how far to trust it.

    ``estimate`` (= ``upper``) is an upper bound of W_p(μ, ν) (``kind``; triangle inequality, eq. 6).
    ``lower`` is Gelbrich's lower bound of W₂ from the clients' moments (Gelbrich 1990, Theorem 2.1), or None
    where they were not exchanged (p = 1, ``lower_bound=False``, or a caller of :func:`fedwad` that did not
    ask). ``status`` says whether A^k settled (:func:`history_status`; "not monitored" without
    ``record_history``). ``notes`` holds every caveat the run found, e.g. the wide-bracket warning's text.
    """

    estimate: float
    history: list[float] = field(default_factory=list)  # A^k per iteration (record_history=True)
    xi: Measure | None = None
    ledger: Ledger = field(default_factory=Ledger)
    support_sizes: list[int] = field(default_factory=list)
    lower: float | None = None
    status: Status = "not monitored"
    notes: list[str] = field(default_factory=list)
    kind: str = UPPER_BOUND

    @property
    def upper(self) -> float:
        """The upper bound: the estimate itself."""
        return self.estimate

    @property
    def bracket(self) -> tuple[float, float]:
        """(lower, upper) ∋ W_p(μ, ν); lower is 0 (the trivial bound) where no moments were exchanged."""
        return (0.0 if self.lower is None else self.lower), self.upper

    @property
    def ratio(self) -> float | None:
        """upper / lower (≥ 1 but for rounding or inexact final distances; inf for lower = 0 < upper), None
        without a lower bound."""
        if self.lower is None:
            return None
        if self.lower > 0:
            return self.upper / self.lower
        return 1.0 if self.upper == 0 else float("inf")

    @property
    def converged(self) -> bool | None:
        """True / False when A^k was monitored (``record_history``), else None."""
        return None if self.status == "not monitored" else self.status == "converged"


def fedwad(client_mu: WassersteinClient, client_nu: WassersteinClient, server: WassersteinServer,
           channel: Channel | None = None, lower_bound: bool = False) -> FedWaDResult:
    """Run FedWaD Algorithm 1 between two clients through ``channel`` (every message is ledgered).

    The result's estimate is an upper bound of W_p (eq. 6). With ``lower_bound=True`` and p = 2, each client
    then sends its mean and covariance (:class:`~otfed.federation.messages.MomentMessage`, ledgered in round
    K + 1 — they reveal the first two moments to the server), the server computes Gelbrich's lower bound
    (Gelbrich 1990, Theorem 2.1), and a ``RuntimeWarning`` (one per session, its text also in
    ``result.notes``) says when upper > BRACKET_RATIO · lower + BRACKET_ABS_TOL · spread. The moments draw no
    random number and come after every other message: ξ^k, the estimate and all other messages are the same
    either way.
    """
    channel = channel or Channel()
    config = server.config
    if client_mu.dim != client_nu.dim:
        raise ValueError(f"clients {client_mu.name!r} and {client_nu.name!r} have different feature "
                         f"dimensions ({client_mu.dim} vs {client_nu.dim})")
    server.initialise(client_mu.dim)
    history: list[float] = []
    sizes: list[int] = []
    for k in range(1, config.iterations + 1):
        channel.round = k
        req_mu = channel.send(server.broadcast(client_mu.name))
        req_nu = channel.send(server.broadcast(client_nu.name))
        msg_mu = channel.send(client_mu.interpolate(req_mu))
        msg_nu = channel.send(client_nu.interpolate(req_nu))
        server.combine(msg_mu, msg_nu)
        sizes.append(server.xi.n)  # type: ignore[union-attr]
        if config.max_support is not None and sizes[-1] > config.max_support:
            raise SupportGrowthError(f"exact interpolation: the support of ξ grew to {sizes[-1]} atoms "
                                     f"(> max_support={config.max_support}) at iteration {k}")
        if config.record_history:
            # Optional monitoring: each client reports W(own, own interpolant) — one scalar per round.
            d_mu = channel.send(client_mu.distance(_echo(msg_mu, client_mu.name), kind="monitor_distance"))
            d_nu = channel.send(client_nu.distance(_echo(msg_nu, client_nu.name), kind="monitor_distance"))
            history.append(server.monitor(msg_mu, msg_nu, d_mu, d_nu))
    channel.round = config.iterations + 1
    final_mu = channel.send(server.broadcast(client_mu.name))
    final_nu = channel.send(server.broadcast(client_nu.name))
    d_mu = channel.send(client_mu.distance(final_mu))
    d_nu = channel.send(client_nu.distance(final_nu))
    result = FedWaDResult(server.estimate(d_mu, d_nu), history, server.xi, channel.ledger, sizes,
                          status=history_status(history))
    if lower_bound and config.p == 2:
        m_mu = channel.send(client_mu.moments())
        m_nu = channel.send(client_nu.moments())
        result.lower = server.lower_bound(m_mu, m_nu)
        if result.lower > result.upper * (1 + 1e-9) + 1e-12:
            result.notes.append(f"the estimate {result.upper:.6g} is below the lower bound {result.lower:.6g}: the "
                                f"final distances were not exact (solver {config.solver!r}); W2 ≥ the lower bound")
        if bracket_is_wide(result.lower, result.upper, server.spread(m_mu, m_nu)):
            note = wide_bracket_note(result.lower, result.upper, config)
            result.notes.append(note)
            warnings.warn(note, RuntimeWarning, stacklevel=_stacklevel_outside_federation())
    elif lower_bound:
        result.notes.append(f"no lower bound: Gelbrich's bound is for W2, this run computed W{config.p}")
    return result


def _stacklevel_outside_federation() -> int:
    """The ``stacklevel`` for a warning raised by this module's caller that points at the first frame outside
    otfed/federation (the user's line, not :func:`federated_wasserstein`'s)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_HERE):
        frame, level = frame.f_back, level + 1
    return level


def wide_bracket_note(lower: float, upper: float, config: FedWaDConfig) -> str:
    """The wide-bracket warning: the numbers, the two possible reasons, and what to do."""
    ratio = f"{upper / lower:.2f}×" if upper < 1e3 * lower else "far above"
    return (f"FedWaD: the estimate {upper:.4g} is an upper bound of W2 and is {ratio} the Gelbrich lower bound "
            f"{lower:.4g} (warning above {BRACKET_RATIO}×): W2 lies somewhere in [{lower:.4g}, {upper:.4g}]. "
            f"Either the estimate is loose — support_size S = {config.support_size} is too small for ξ to reach "
            f"a geodesic; raise S, up to the larger client's sample size max(n, m) (the most accurate S) — or W2 "
            f"itself is far above the bound (the measures are far from Gaussian, or few samples for the "
            f"dimension). If a larger S does not lower the estimate, the gap is the bound's.")


def _echo(message: MeasureMessage, receiver: str) -> MeasureMessage:
    """The client's own interpolant handed back to it locally (no transfer: the client already has it)."""
    return MeasureMessage("local", receiver, receiver, measure=message.measure)


def client_samples(x: np.ndarray, name: str) -> np.ndarray:
    """A client's samples as a float64 (n, d) array; :class:`~otfed.errors.DegenerateClientError` naming the
    client if it has no samples or NaN / inf, ValueError if it is not 2-D or complex."""
    if np.iscomplexobj(x):  # a float64 cast would drop the imaginary part in silence
        raise ValueError(f"client {name!r}: samples must be real, got a complex array")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"client {name!r}: samples must be a 2-D (n, d) array, got shape {x.shape}")
    if x.shape[0] == 0:
        raise DegenerateClientError(f"client {name!r} has no samples (shape {x.shape})")
    if not np.isfinite(x).all():
        raise DegenerateClientError(f"client {name!r} has NaN or inf in {int((~np.isfinite(x)).any(1).sum())} "
                                    f"sample(s)")
    return x


def federated_wasserstein(x_mu: np.ndarray, x_nu: np.ndarray, config: FedWaDConfig | Mapping[str, Any],
                          seed: int = 0, names: tuple[str, str] = ("client_mu", "client_nu"),
                          channel: Channel | None = None) -> FedWaDResult:
    """FedWaD (Algorithm 1) between two sample clouds (uniform weights), each party seeded from ``seed``: an
    upper bound of W_p (eq. 6) and, with ``config.lower_bound`` and p = 2, Gelbrich's lower bound (Gelbrich
    1990, Theorem 2.1) from the clients' moments — which reveals them to the server.

    Parameters:
        x_mu, x_nu: the two clients' samples, n_μ × d and n_ν × d (each stays on its client).
        config: a :class:`FedWaDConfig` or a mapping of its fields (:func:`~otfed.schema.as_config`: an unknown
            key or a bad value is a :class:`~otfed.errors.ConfigError` naming it, another type a TypeError).
            ``support_size`` S is the approximate interpolating measure's support (eq. 10): a multiple of both
            clients' sample sizes is the most accurate (S = n for equal sizes, theorem 1; lcm(n, m) otherwise,
            :func:`support_rule_met`), a small S in high dimension is loose — the bracket says how loose.
        seed: every party's generator is spawned from it (same seed → same numbers).
        names: the two clients' names in messages and errors.
        channel: the ledger every message goes through (a fresh one by default).

    Returns:
        A :class:`FedWaDResult`: ``estimate`` (the upper bound), ``lower`` (Gelbrich's bound when computed),
        ``bracket``, ``kind``, ``status``, ``notes``, the per-iteration ``history`` and the ``ledger``.

    Raises DegenerateClientError naming the client for an empty or non-finite sample array, ValueError naming
    both clients and both feature sizes when their dimensions differ. Warns (``RuntimeWarning``, each text also in
    ``notes``) before the run when S misses the support rule (:func:`support_rule_warning`: both sizes and the S to
    use), and after it when the bracket is wide (:func:`fedwad`).

    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(200, 2)), rng.normal(size=(200, 2)) + 2.0
    >>> result = federated_wasserstein(x, y, FedWaDConfig(support_size=200, iterations=10))
    >>> lower, upper = result.bracket
    >>> bool(lower <= upper < 1.25 * lower), result.kind
    (True, 'upper bound (triangle inequality)')
    """
    config = as_config(config, FedWaDConfig)
    x_mu, x_nu = client_samples(x_mu, names[0]), client_samples(x_nu, names[1])
    if x_mu.shape[1] != x_nu.shape[1]:
        raise ValueError(f"clients {names[0]!r} and {names[1]!r} have different feature dimensions "
                         f"({x_mu.shape[1]} vs {x_nu.shape[1]})")
    support_note = support_rule_warning(config, [(names[0], x_mu.shape[0]), (names[1], x_nu.shape[0])])
    seeds = np.random.SeedSequence(seed).spawn(3)
    mu = WassersteinClient(names[0], Measure.uniform(x_mu), config, np.random.default_rng(seeds[0]))
    nu = WassersteinClient(names[1], Measure.uniform(x_nu), config, np.random.default_rng(seeds[1]))
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    result = fedwad(mu, nu, server, channel=channel or Channel(session=f"{names[0]}|{names[1]}"),
                    lower_bound=config.lower_bound)
    if support_note is not None:
        result.notes.insert(0, support_note)
    return result
