"""FedWaD (Rakotomamonjy et al., ICLR 2024): the Wasserstein distance between two clients' measures,
computed by a server that only ever receives interpolating measures and, at the end, two distances.

Algorithm 1. ξ⁰ = random support of size S. For k = 1..K:
  client μ:  ξ_μ^k = InterpMeas(μ, ξ^{k−1})           (eq. 5 exact or eq. 10 approximate)
  client ν:  ξ_ν^k = InterpMeas(ν, ξ^{k−1})
  server:    ξ^k  = InterpMeas(ξ_μ^k, ξ_ν^k)
Finally the clients return d_{μ,ξ^K} = W_p(μ, ξ^K) and d_{ξ^K,ν} = W_p(ξ^K, ν); the estimate is their sum.
A^k = W(μ,ξ_μ^k) + W(ξ_μ^k,ξ^k) + W(ξ^k,ξ_ν^k) + W(ξ_ν^k,ν) is non-increasing and ≥ W_p(μ,ν)
(theorem 2, for exact interpolating measures).

Client and server steps are pure functions of their inputs (a private measure, or messages); the
:class:`WassersteinClient` / :class:`WassersteinServer` roles wrap them behind typed messages, and
:func:`fedwad` drives the protocol over a :class:`~otfed.federation.ledger.Channel`. Every OT subproblem
goes through :func:`subproblem_transport` (solver choice, and the fallback of ``solver="auto"``).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from pydantic import Field, model_validator

from otfed.errors import OTConvergenceError, SupportGrowthError
from otfed.federation.ledger import Channel, Ledger
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage
from otfed.ot import Measure, Transport, interpolate_approx, interpolate_exact, optimal_transport
from otfed.schema import InterpolationTime, Strict

Interpolation = Literal["approx", "exact"]
Solver = Literal["auto", "network_simplex", "semidual_newton"]


class FedWaDConfig(Strict):
    """Algorithm 1 settings — also the ``fedwad`` params groups of ``params.yaml``.

    ``t="random"`` (default; ``None`` is accepted as the same) draws t ~ U(0,1) independently at every
    interpolation: with a fixed t = 0.5 the estimate stalls strictly above W in dimension ≥ 10 (SPEC §2).

    ``solver="auto"`` picks per subproblem (:func:`subproblem_solver`): the network simplex for exact
    interpolation (eq. 5 needs its sparse vertex plan) and for comparable sizes; the semi-dual Newton
    solver when one side is ≥ 100× larger than the other (S ≪ n), where it is 6–180× faster. Should
    Newton fail on a subproblem (:class:`~otfed.errors.OTConvergenceError`, or a non-finite plan), ``auto``
    solves that subproblem with the network simplex instead and says so with a ``RuntimeWarning``
    (:func:`subproblem_transport`). An explicit ``"semidual_newton"`` or ``"network_simplex"`` never
    falls back: its errors propagate.
    ``record_history`` keeps A^k per iteration; ``max_support`` (exact mode) stops with
    :class:`SupportGrowthError` beyond this many atoms.
    """

    support_size: int = Field(10, ge=1, le=20000, description="S, support of the interpolating measure ξ.")
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
    """The optimal plan and W_p(source, target) of one FedWaD subproblem (SPEC §0; Algorithm 1, the plan
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
        """d_{μ,ν} = d_{μ,ξ^K} + d_{ξ^K,ν} (Algorithm 1, line 10)."""
        return d_mu.value + d_nu.value


@dataclass
class FedWaDResult:
    """Outcome of one FedWaD session."""

    estimate: float
    history: list[float] = field(default_factory=list)  # A^k per iteration (record_history=True)
    xi: Measure | None = None
    ledger: Ledger = field(default_factory=Ledger)
    support_sizes: list[int] = field(default_factory=list)


def fedwad(client_mu: WassersteinClient, client_nu: WassersteinClient, server: WassersteinServer,
           channel: Channel | None = None) -> FedWaDResult:
    """Run FedWaD Algorithm 1 between two clients through ``channel`` (every message is ledgered)."""
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
    return FedWaDResult(server.estimate(d_mu, d_nu), history, server.xi, channel.ledger, sizes)


def _echo(message: MeasureMessage, receiver: str) -> MeasureMessage:
    """The client's own interpolant handed back to it locally (no transfer: the client already has it)."""
    return MeasureMessage("local", receiver, receiver, measure=message.measure)


def federated_wasserstein(x_mu: np.ndarray, x_nu: np.ndarray, config: FedWaDConfig, seed: int = 0,
                          names: tuple[str, str] = ("client_mu", "client_nu"),
                          channel: Channel | None = None) -> FedWaDResult:
    """Convenience: FedWaD between two sample clouds (uniform weights), each party seeded from ``seed``."""
    seeds = np.random.SeedSequence(seed).spawn(3)
    mu = WassersteinClient(names[0], Measure.uniform(np.asarray(x_mu, dtype=np.float64)), config,
                           np.random.default_rng(seeds[0]))
    nu = WassersteinClient(names[1], Measure.uniform(np.asarray(x_nu, dtype=np.float64)), config,
                           np.random.default_rng(seeds[1]))
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    return fedwad(mu, nu, server, channel=channel or Channel(session=f"{names[0]}|{names[1]}"))
