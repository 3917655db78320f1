"""FedBary (Li, Fu, Zhang, Pang — "Data Valuation and Detections in Federated Learning"), Algorithm 1:
the distance W_p(P_i, Q) between every client's label-augmented measure P_i and a server-side target Q,
computed without any client sample leaving its client.

The server's target Q is its validation set (augmented with the server's own class statistics) when it
has one, else a free-support Wasserstein barycenter of the clients whose support X̃_Q (S atoms, uniform
weights) starts at random. Each client i keeps γ_i, an interpolating measure between P_i and Q (S
random atoms at first, drawn privately by the client). Iteration k = 1..K (paper Algorithm 1, eqs. 4–7):

  client i:  η_{P_i} = InterpMeas(γ_i → P_i);  d_i^client = W(P_i, η_{P_i}) + W(η_{P_i}, γ_i)   (line 3)
             sends γ_i and d_i^client                                                          (line 4)
  server:    [no validation, k ≥ 2] X̃_Q ← barycenter step towards the received γ_i            (line 8)
             η_{Q_i} = InterpMeas(γ_i → Q);  d_i^server = W(Q, η_{Q_i}) + W(η_{Q_i}, γ_i)       (line 5)
             sends η_{Q_i}                                                                     (line 6)
  client i:  γ_i ← InterpMeas(η_{P_i} → η_{Q_i})                                  (line 7, eq. 7)

W(P_i, Q) ≤ d_i^client + d_i^server (eq. 6, triangle inequality) is the per-iteration estimate; the
history records Σ_i of it. A closing round (K + 1) sends γ_i^(K) and the direct W(P_i, γ_i^(K)); the
server adds W(γ_i^(K), Q) — the reported distance, again an upper bound on W(P_i, Q).

Design choices (and why):
- Interpolating measures are built on γ's atoms (FedWaD eq. 10 from the γ side, as in FedWaD's client
  step), so every measure that crosses the boundary has S atoms in approximate mode: communication is
  O(S·d) per message and the server's OT problems are S × S or S × m. The paper's eq. 5 writes η_{P_i}
  on P_i's atoms; on the geodesic both parametrisations describe the same measures, and η_{P_i} never
  leaves the client anyway.
- t ~ U(0, 1) is drawn privately at every interpolation by default (FedWaD §3 allows a random t; a fixed
  t = 0.5 stalls above W in dimension ≥ 10).
- Monotonicity (paper theorem 1): with a fixed target Q (validation set) and geodesic interpolants
  (``interpolation="exact"``, or approximate interpolation where every plan is a permutation: uniform
  measures with S = n_i = m), Σ_i (d_i^client + d_i^server) is non-increasing in k; proof: the γ update
  replaces the broken path η_P → γ → η_Q by the geodesic η_P → η_Q. With approximate interpolation and
  split plans (S ≠ n_i) each triangle step can add a small excess (barycentric projections are not
  geodesic points), and without validation Q moves between iterations.
- Barycenter step (``barycenter_step``): ``"interpolants"`` is the paper's literal line 8, one
  free-support fixed-point step X̃_Q ← Σ_i λ_i T_{Q→γ_i}(X̃_Q) (barycentric maps, λ_i = 1/N) — the
  barycenter of the γ_i. Because γ_i sits at a random, client-specific fraction s_i of the geodesic
  from Q to P_i, T_{Q→γ_i} = (1 − s_i)·Id + s_i·T_{Q→P_i} there, so the fixed point of this step is a
  barycenter of the P_i with weights ∝ λ_i s_i, and it keeps jittering with the random t's (measured:
  W2 to the true barycenter 0.04–1.1 after 40 iterations, tests/federation/test_fedbary.py).
  ``"reweighted"`` (default) takes X̃_Q ← Σ_i w_i T_{Q→γ_i}(X̃_Q) with w_i ∝ λ_i/ŝ_i, where
  ŝ_i = W(Q, γ_i) / (W(Q, γ_i) + d_i^client) is γ_i's position on the Q → P_i path (the server has its
  own plan to γ_i and the distance the client reports). Its fixed points satisfy
  Σ_i λ_i (T_{Q→P_i}(X) − X) = 0 when the γ_i are on their geodesics — the free-support barycenter of
  the P_i (Cuturi & Doucet 2014; POT ``free_support_barycenter``) — and each step is a convex
  combination of the maps to the γ_i, so nothing is amplified. (The unnormalised "extrapolated" step
  X + Σ_i λ_i (T_{Q→γ_i}(X) − X)/ŝ_i has the same fixed points but divides errors by small ŝ_i; it was
  measured unstable and is not offered.)
- Privacy caveat (a property of the paper's protocol, which sends d_i^client every round): from γ_i,
  d_i^client and its own Q the server can form X + (T_{Q→γ_i}(X) − X)/ŝ_i ≈ T_{Q→P_i}(X), the
  barycentric projections of Q's atoms onto P_i (cell means of P_i). With S ≥ n_i and converged γ_i
  these approach P_i's samples. No message carries a sample (tested), but keep S ≪ n_i when that
  matters.

Client and server steps are pure functions (:func:`geodesic_split`, :func:`client_gamma_update`,
:func:`barycenter_step`); :class:`BaryClient` / :class:`BaryServer` wrap them behind typed messages, and
:func:`fedbary` drives the protocol over a ledgered :class:`~otfed.federation.ledger.Channel`. Server
methods take messages only.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from pydantic import Field

from otfed.errors import DegenerateClientError, SupportGrowthError
from otfed.federation.fedwad import FedWaDConfig, draw_t, interpolation_step, subproblem_transport
from otfed.federation.ledger import Channel, Ledger
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage
from otfed.federation.otdd import LabelledData, augmented_measure, feature_dimension
from otfed.federation.parties import InProcess, Workers, check_roster
from otfed.metrics import mean_confidence_interval
from otfed.ot import Measure, interpolate_approx
from otfed.schema import as_config
from otfed.valuation.calibrated import PotentialConvergence, calibrated_threshold, datum_values as calibrated_datum_values
from otfed.valuation.detection import split_validation

BarycenterStep = Literal["reweighted", "interpolants"]
DetectionScore = Literal["standardised", "raw"]
Potential = Literal["sinkhorn", "exact"]


class FedBaryConfig(FedWaDConfig):
    """Algorithm 1 settings — also the ``fedbary`` params groups of ``params.yaml``.

    FedWaD's protocol settings (``t``, ``p``, ``interpolation``, ``solver``, ``init_scale``,
    ``max_support`` and their checks, :class:`~otfed.federation.fedwad.FedWaDConfig`) plus:
    ``support_size`` S — atoms of every γ_i and of the barycenter support X̃_Q (γ_i^(0) and X̃_Q^(0)
    atoms ~ N(0, init_scale² I)); ``barycenter_step`` — see the module docstring;
    ``min_geodesic_fraction`` floors ŝ_i (guards against division by ~0); ``diagonal`` — diagonal class
    covariances in the label augmentation (FedBary §4.1); ``potential`` — the dual potentials behind datum
    values (calibrated gradients, eq. 10).
    """

    support_size: int = Field(50, ge=1, le=20000, description="S, atoms of every γ_i and of the barycenter.")
    iterations: int = Field(10, ge=1, le=10000, description="K.")
    barycenter_step: BarycenterStep = "reweighted"
    min_geodesic_fraction: float = Field(1e-3, gt=0.0, le=1.0)
    diagonal: bool = True
    potential: Potential = Field("sinkhorn", description="Dual potentials for datum values.")

    def fedwad(self) -> FedWaDConfig:
        """The FedWaD settings used for every interpolation and OT subproblem."""
        return FedWaDConfig(**self.model_dump(include=set(FedWaDConfig.model_fields)))


# ----------------------------------------------------------------------------------------------------
# pure steps


def _distance(mu: Measure, nu: Measure, config: FedWaDConfig) -> float:
    """W_p(μ, ν) with the subproblem solver FedWaD would pick for these sizes (and its fallback)."""
    return subproblem_transport(mu, nu, config).cost


def geodesic_split(endpoint: Measure, gamma: Measure, t: float, config: FedBaryConfig) -> tuple[Measure, float]:
    """η = InterpMeas(γ → endpoint) at time t and W(endpoint, η) + W(η, γ) — FedBary eqs. 4–5.

    Used by the client with endpoint P_i (η_{P_i}, d_i^client; Algorithm 1, line 3) and by the server with
    endpoint Q (η_{Q_i}, d_i^server; line 5). The sum is ≥ W(endpoint, γ) (triangle inequality), with
    equality for geodesic (exact) interpolants.
    """
    fw = config.fedwad()
    eta, _ = interpolation_step(gamma, endpoint, t, fw)
    return eta, _distance(endpoint, eta, fw) + _distance(eta, gamma, fw)


def client_gamma_update(eta_p: Measure, eta_q: Measure, t: float, config: FedBaryConfig) -> Measure:
    """γ_i ← InterpMeas(η_{P_i} → η_{Q_i}) at time t — FedBary eq. 7 (Algorithm 1, line 7).

    A point on the geodesic between η_{P_i} and η_{Q_i}: W(η_P, γ) + W(γ, η_Q) = W(η_P, η_Q) for exact
    interpolants, which is what makes Σ_i A_i^(k) non-increasing (theorem 1).
    """
    gamma, _ = interpolation_step(eta_p, eta_q, t, config.fedwad())
    return gamma


def barycentric_map(source: Measure, target: Measure, config: FedBaryConfig) -> tuple[np.ndarray, float]:
    """T_{source→target}(X) = (π Y)_i / a_i for every atom of ``source`` — the barycentric projection of
    the optimal plan π (FedWaD eq. 10 at t = 1) — and W_p(source, target) from the same plan.
    Returns an (n_source, d) array and the distance."""
    transport = subproblem_transport(source, target, config.fedwad())
    return interpolate_approx(source, target, transport.plan, 1.0).support, transport.cost


def geodesic_fraction(d_server: float, d_client: float, floor: float) -> float:
    """ŝ_i = W(Q, γ_i) / (W(Q, γ_i) + W(γ_i, P_i)), clipped to [floor, 1]: the fraction of the path
    Q → γ_i → P_i covered at γ_i (exact on a geodesic)."""
    total = d_client + d_server
    if not total > 0:
        return 1.0
    return float(np.clip(d_server / total, floor, 1.0))


def barycenter_step(support: Measure, gammas: Sequence[Measure], config: FedBaryConfig,
                    client_distances: Sequence[float] | None = None,
                    weights: Sequence[float] | None = None, workers: Workers | None = None) -> Measure:
    """One free-support barycenter fixed-point step X̃_Q ← Σ_i w_i T_{Q→γ_i}(X̃_Q) (Algorithm 1, line 8).

    T is the barycentric map (:func:`barycentric_map`). ``client_distances=None`` or
    ``config.barycenter_step == "interpolants"``: w_i = λ_i, the paper's literal step towards the γ_i
    (Cuturi & Doucet 2014, alg. 2, with the γ_i as the input measures). Otherwise (``"reweighted"``)
    w_i ∝ λ_i/ŝ_i with ŝ_i = :func:`geodesic_fraction` of W(Q, γ_i) (from the same plan) and the
    client's d_i ≈ W(P_i, γ_i): since T_{Q→γ_i} − Id = ŝ_i (T_{Q→P_i} − Id) on the geodesic, the step
    is h·Σ_i λ_i (T_{Q→P_i}(X) − X) with h = 1/Σ_i(λ_i/ŝ_i) ≤ 1 — the free-support fixed point of the
    P_i, damped. ``weights`` λ_i default to 1/N. Q's weights stay fixed (uniform); only its support moves.
    The N barycentric maps are independent: ``workers`` (default: in order, in this process) computes them.
    """
    n = len(gammas)
    if n == 0:
        raise ValueError("barycenter_step needs at least one measure")
    lam = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    if lam.shape != (n,) or np.any(lam < 0) or not np.isclose(lam.sum(), 1.0):
        raise ValueError(f"barycenter weights must be {n} non-negative numbers summing to 1, got {lam}")
    reweight = client_distances is not None and config.barycenter_step != "interpolants"
    if reweight and len(client_distances) != n:  # type: ignore[arg-type]
        raise ValueError(f"need {n} client distances, got {len(client_distances)}")  # type: ignore[arg-type]
    X = support.support
    displacement, inv_s = [], np.ones(n)
    maps = (workers or InProcess()).map(barycentric_map, [dict(source=support, target=gamma, config=config)
                                                          for gamma in gammas])
    for i, (mapped, w_q_gamma) in enumerate(maps):
        displacement.append(mapped - X)
        if reweight:
            inv_s[i] = 1.0 / geodesic_fraction(w_q_gamma, float(client_distances[i]),  # type: ignore[index]
                                               config.min_geodesic_fraction)
    w = lam * inv_s
    w /= w.sum()
    step = sum(w_i * d_i for w_i, d_i in zip(w, displacement))
    return Measure(X + step, support.weights)


def contribution_percent(distances: Sequence[float]) -> np.ndarray:
    """Client contributions (FedBary §4.2): score_i = (1/W(P_i, Q)) / Σ_j (1/W(P_j, Q)), in percent.

    A client at distance 0 from the target takes the whole contribution (shared equally among such
    clients).
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 1 or d.size == 0 or np.any(d < 0) or not np.all(np.isfinite(d)):
        raise ValueError(f"distances must be a non-empty vector of finite non-negative numbers, got {d}")
    zero = d <= 0
    if zero.any():
        return 100.0 * zero / zero.sum()
    inv = 1.0 / d
    return 100.0 * inv / inv.sum()


# ----------------------------------------------------------------------------------------------------
# roles


class BaryClient:
    """A FedBary client: keeps its label-augmented measure P_i, γ_i, η_{P_i} and the last η_{Q_i} private;
    sends only γ_i (S atoms) and distances."""

    def __init__(self, name: str, measure: Measure, config: FedBaryConfig, rng: np.random.Generator) -> None:
        self.name = name
        self._measure = measure
        self._config = config
        self._rng = rng
        self._gamma = Measure.uniform(rng.normal(0.0, config.init_scale, size=(config.support_size, measure.dim)))
        self._eta_p: Measure | None = None
        self._eta_q: Measure | None = None

    @classmethod
    def from_data(cls, data: LabelledData, config: FedBaryConfig, rng: np.random.Generator) -> "BaryClient":
        """A client whose P_i is the uniform measure on its label-augmented samples [x; m_y; Σ_y^{1/2}].

        Raises :class:`DegenerateClientError` naming the client (no samples, NaN/inf features, a class
        with fewer than two samples).
        """
        return cls(data.name, augmented_measure(data, diagonal=config.diagonal), config, rng)

    @property
    def dim(self) -> int:
        """Public metadata: the (augmented) dimension, needed by the server to initialise X̃_Q."""
        return self._measure.dim

    @property
    def eta_q(self) -> Measure | None:
        """The last η_{Q_i} received from the server (client-local; the reference for datum values)."""
        return self._eta_q

    def report(self) -> tuple[MeasureMessage, DistanceMessage]:
        """Algorithm 1, lines 3–4: compute η_{P_i} and d_i^client; send γ_i and d_i^client."""
        t = draw_t(self._config.fedwad(), self._rng)
        self._eta_p, d_client = geodesic_split(self._measure, self._gamma, t, self._config)
        return (MeasureMessage("gamma", self.name, SERVER, measure=self._gamma),
                DistanceMessage("client_distance", self.name, SERVER, value=d_client))

    def update(self, eta_q: MeasureMessage) -> None:
        """Algorithm 1, line 7: γ_i ← InterpMeas(η_{P_i} → η_{Q_i})."""
        if self._eta_p is None:
            raise RuntimeError(f"client {self.name!r}: update() before report()")
        self._eta_q = eta_q.measure
        t = draw_t(self._config.fedwad(), self._rng)
        self._gamma = client_gamma_update(self._eta_p, eta_q.measure, t, self._config)
        cap = self._config.max_support
        if cap is not None and self._gamma.n > cap:
            raise SupportGrowthError(f"client {self.name!r}: exact interpolation grew γ to {self._gamma.n} atoms "
                                     f"(> max_support={cap})")

    def final_report(self) -> tuple[MeasureMessage, DistanceMessage]:
        """Closing round: send γ_i^(K) and the direct W(P_i, γ_i^(K))."""
        d = _distance(self._measure, self._gamma, self._config.fedwad())
        return (MeasureMessage("gamma", self.name, SERVER, measure=self._gamma),
                DistanceMessage("distance", self.name, SERVER, value=d))

    def datum_values(self, potential: Potential = "sinkhorn", **options) -> np.ndarray:
        """Calibrated gradients of this client's samples against its last η_{Q_i} (FedBary eq. 10).

        Computed locally; never sent. See :func:`otfed.valuation.calibrated.datum_values` (``options``, e.g.
        ``with_convergence=True`` for the values and their convergence report).
        """
        if self._eta_q is None:
            raise RuntimeError(f"client {self.name!r} has received no η_Q yet")
        return calibrated_datum_values(self._measure, self._eta_q, p=self._config.p, potential=potential, **options)


class BaryServer:
    """The FedBary server: holds the target Q (validation measure, or the barycenter support X̃_Q).

    Its methods take messages only; it never sees P_i, η_{P_i} or any t drawn by a client.
    """

    def __init__(self, config: FedBaryConfig, rng: np.random.Generator, target: Measure | None = None,
                 name: str = SERVER) -> None:
        self.name = name
        self.config = config
        self._rng = rng
        self.has_validation = target is not None
        self.target: Measure | None = target

    def initialise(self, dim: int) -> Measure:
        """X̃_Q^(0): S atoms ~ N(0, init_scale² I), uniform weights (no validation set); else Q as given."""
        if self.target is None:
            support = self._rng.normal(0.0, self.config.init_scale, size=(self.config.support_size, dim))
            self.target = Measure.uniform(support)
        elif self.target.dim != dim:
            raise ValueError(f"the validation set has dimension {self.target.dim} but the clients' augmented "
                             f"samples have dimension {dim}")
        return self.target

    def update_barycenter(self, gammas: Sequence[MeasureMessage],
                          client_distances: Sequence[DistanceMessage], workers: Workers | None = None) -> Measure:
        """Algorithm 1, line 8 (no validation set): one barycenter fixed-point step towards the γ_i
        (:func:`barycenter_step`; the clients' distances give ŝ_i for the ``"reweighted"`` step)."""
        if self.has_validation:
            raise RuntimeError("the server has a validation set: Q is fixed")
        assert self.target is not None, "initialise() first"
        by_sender = {d.sender: d.value for d in client_distances}
        self.target = barycenter_step(self.target, [g.measure for g in gammas], self.config,
                                      client_distances=[by_sender[g.sender] for g in gammas], workers=workers)
        return self.target

    def respond(self, gamma: MeasureMessage) -> tuple[MeasureMessage, DistanceMessage]:
        """:meth:`respond_all` to one γ_i."""
        return self.respond_all([gamma])[0]

    def respond_all(self, gammas: Sequence[MeasureMessage], workers: Workers | None = None
                    ) -> list[tuple[MeasureMessage, DistanceMessage]]:
        """Algorithm 1, lines 5–6, for every received γ_i: η_{Q_i} = InterpMeas(γ_i → Q) and d_i^server;
        η_{Q_i} goes to client i, d_i^server stays on the server (returned as a local message addressed to
        itself). The t's are drawn first, in message order, then the N independent computations run on
        ``workers`` (default: in order, in this process): the replies do not depend on where they ran."""
        assert self.target is not None, "initialise() first"
        ts = [draw_t(self.config.fedwad(), self._rng) for _ in gammas]
        splits = (workers or InProcess()).map(geodesic_split, [
            dict(endpoint=self.target, gamma=g.measure, t=t, config=self.config) for g, t in zip(gammas, ts)])
        return [(MeasureMessage("eta_Q", self.name, g.sender, measure=eta_q),
                 DistanceMessage("server_distance", self.name, self.name, value=d_server))
                for g, (eta_q, d_server) in zip(gammas, splits)]

    def final_distance(self, gamma: MeasureMessage, client_distance: DistanceMessage) -> float:
        """:meth:`final_distances` of one client."""
        return float(self.final_distances([gamma], [client_distance])[0])

    def final_distances(self, gammas: Sequence[MeasureMessage], client_distances: Sequence[DistanceMessage],
                        workers: Workers | None = None) -> np.ndarray:
        """Closing round: W(P_i, Q) ≤ W(P_i, γ_i) + W(γ_i, Q) for every client, the client's value plus the
        server's own; the N W(γ_i, Q) on ``workers``."""
        assert self.target is not None
        own = (workers or InProcess()).map(_distance, [dict(mu=g.measure, nu=self.target, config=self.config.fedwad())
                                                       for g in gammas])
        return np.array([d.value + w for d, w in zip(client_distances, own)])

    @staticmethod
    def estimate(client_distance: DistanceMessage, server_distance: DistanceMessage) -> float:
        """Per-iteration estimate W(P_i, Q) ≤ d_i^client + d_i^server (FedBary eq. 6)."""
        return client_distance.value + server_distance.value


# ----------------------------------------------------------------------------------------------------
# driver


@dataclass
class ContributionSpread:
    """Client contributions (percent, FedBary §4.2) over FedBary runs that differ only in their seed.

    ``contributions[r, i]``: client i's share in the run seeded ``seeds[r]``; ``mean``, ``std`` (sample
    standard deviation, ddof = 1) and ``half_width`` (of the ``level`` Student-t confidence interval of the
    mean, :func:`otfed.metrics.mean_confidence_interval`) per client, in ``names`` order.
    """

    names: list[str]
    seeds: list[int]
    contributions: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    half_width: np.ndarray
    level: float = 0.95


@dataclass
class FedBaryResult:
    """Outcome of one FedBary session.

    ``distances[i]``: the closing-round upper bound on W(P_i, Q); ``contributions``: percent (sums to 100);
    ``history[k]``: Σ_i (d_i^client + d_i^server) at iteration k + 1; ``client_history[k, i]`` its terms;
    ``target``: the final Q; ``datum_values``: per-client calibrated gradients when requested (computed
    client-side; they never crossed the channel); ``datum_convergence``: per client, how converged the dual
    potential behind its values is (:class:`~otfed.valuation.calibrated.PotentialConvergence`: Newton steps, the
    potential's remaining change relative to the mean cost, the tolerance, a converged flag; a
    :class:`UserWarning` names the clients whose potential missed it); ``spread``: the contributions' spread over
    reruns with other seeds, when requested (:func:`valuation_spread`; None otherwise).
    """

    names: list[str]
    distances: np.ndarray
    contributions: np.ndarray
    target: Measure
    history: list[float] = field(default_factory=list)
    client_history: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    ledger: Ledger = field(default_factory=Ledger)
    datum_values: dict[str, np.ndarray] | None = None
    spread: ContributionSpread | None = None
    datum_convergence: dict[str, PotentialConvergence] | None = None

    @property
    def total_distance(self) -> float:
        """Σ_i W(P_i, Q) estimate after the closing round."""
        return float(self.distances.sum())

    def to_dataframe(self) -> Any:
        """This result as a pandas table, one row per client: ``client``, ``contribution`` (percent), ``distance``;
        with a spread also ``runs``, ``mean``, ``std``, ``ci_low``, ``ci_high``. Needs pandas (the ``valuation``
        extra). The datum values' table and pyDVL's and OpenDataVal's forms: :mod:`otfed.federation.adapters`."""
        try:
            import pandas
        except ImportError as exc:  # the core install has no pandas
            raise ImportError("FedBaryResult.to_dataframe needs pandas: pip install 'otfed[valuation]'") from exc
        columns: dict[str, Any] = {"client": list(self.names), "contribution": np.asarray(self.contributions),
                                   "distance": np.asarray(self.distances)}
        if self.spread is not None:
            if list(self.spread.names) != list(self.names):
                raise ValueError(f"the spread's clients {self.spread.names} are not the result's {list(self.names)}")
            columns.update(runs=len(self.spread.seeds), mean=self.spread.mean, std=self.spread.std,
                           ci_low=self.spread.mean - self.spread.half_width,
                           ci_high=self.spread.mean + self.spread.half_width)
        return pandas.DataFrame(columns)


def fedbary(clients: Sequence[BaryClient], server: BaryServer, channel: Channel | None = None,
            datum_values: bool = False, potential: Potential = "sinkhorn",
            workers: Workers | None = None) -> FedBaryResult:
    """Run FedBary Algorithm 1 between ``clients`` and ``server`` through ``channel`` (every message is
    ledgered). ``datum_values=True`` also has each client compute its calibrated gradients (eq. 10)
    locally at the end.

    ``workers`` (:mod:`otfed.federation.parties`; default :class:`~otfed.federation.parties.InProcess`, in
    order): where the clients live — they are handed to ``workers.host`` and from then on only their
    methods are called, by name, and their messages come back — and where the server's N independent
    computations per round run. Same clients and seeds → the same result on any ``workers``."""
    names = [c.name for c in clients]
    check_roster(names, {c.name: c.dim for c in clients}, space="augmented", protocol="FedBary")
    channel = channel or Channel(session="fedbary")
    config = server.config
    workers = workers or InProcess()
    server.initialise(clients[0].dim)
    hosted = workers.host(clients)  # from here on the clients are reached only through their methods
    history: list[float] = []
    per_client: list[list[float]] = []
    for k in range(1, config.iterations + 1):
        channel.round = k
        reports = hosted.call("report")
        gammas = [channel.send(g) for g, _ in reports]
        d_clients = [channel.send(d) for _, d in reports]
        if not server.has_validation and k >= 2:
            server.update_barycenter(gammas, d_clients, workers)
        replies = server.respond_all(gammas, workers)
        hosted.call("update", [(channel.send(eta_q),) for eta_q, _ in replies])
        row = [server.estimate(dc, ds) for dc, (_, ds) in zip(d_clients, replies)]
        per_client.append(row)
        history.append(float(sum(row)))
    channel.round = config.iterations + 1
    finals = hosted.call("final_report")
    gammas = [channel.send(g) for g, _ in finals]
    d_finals = [channel.send(d) for _, d in finals]
    if not server.has_validation:
        server.update_barycenter(gammas, d_finals, workers)
    distances = server.final_distances(gammas, d_finals, workers)
    values = convergence = None
    if datum_values:
        solved = hosted.call("datum_values", potential=potential, with_convergence=True)
        values = {n: v for n, (v, _) in zip(names, solved)}
        convergence = {n: c for n, (_, c) in zip(names, solved)}
        missed = [n for n, c in convergence.items() if not c.converged]
        if missed:
            warnings.warn(f"FedBary datum values: the dual potential of client(s) {', '.join(missed)} did not reach "
                          f"its tolerance (result.datum_convergence says by how much)", UserWarning, stacklevel=2)
    assert server.target is not None
    return FedBaryResult(names=names, distances=distances, contributions=contribution_percent(distances),
                         target=server.target, history=history, client_history=np.array(per_client),
                         ledger=channel.ledger, datum_values=values, datum_convergence=convergence)


def federated_valuation(datasets: Sequence[LabelledData], config: FedBaryConfig | Mapping[str, Any],
                        validation: LabelledData | None = None, seed: int = 0, channel: Channel | None = None,
                        datum_values: bool = False, potential: Potential = "sinkhorn",
                        workers: Workers | None = None) -> FedBaryResult:
    """Convenience: FedBary (Algorithm 1) over labelled client datasets (each augmented client-side with its own
    class statistics, FedBary §4.1), with the server's ``validation`` set (augmented with the server's
    statistics) as Q, or the federated barycenter when ``validation`` is None. Every party is seeded from
    ``seed``.

    Parameters:
        datasets: the clients' labelled datasets (:class:`~otfed.ot.otdd.LabelledData`), same feature size.
        config: a :class:`FedBaryConfig` or a mapping of its fields (:func:`~otfed.schema.as_config`: an unknown
            key or a bad value is a :class:`~otfed.errors.ConfigError` naming it, another type a TypeError).
        validation: the server's own labelled set, Q; None: the federated barycenter.
        seed: every party's generator is spawned from it (same seed → same numbers).
        channel: the ledger every message goes through.
        datum_values: also each client's calibrated gradients (eq. 10), computed client-side.
        potential: the dual potentials for the datum values, "sinkhorn" or "exact".
        workers: how client steps run (in process by default; :mod:`otfed.federation.parties`).

    Returns:
        A :class:`FedBaryResult`: ``distances`` (each client's W to Q, an upper bound), ``contributions`` (percent,
        summing to 100: a client closer to Q contributes more), ``history``, ``datum_values`` when asked for.

    Three clients, the third's features shifted — the farthest from the others, so the least valuable:

    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 30)
    >>> clients = [LabelledData(f"client_{i}", rng.normal(size=(60, 2)) + 3.0 * y[:, None] + shift, y)
    ...            for i, shift in enumerate([0.0, 0.0, 2.0])]
    >>> result = federated_valuation(clients, FedBaryConfig(support_size=30, iterations=10))
    >>> round(float(result.contributions.sum()), 6), int(result.contributions.argmin())
    (100.0, 2)

    Raises :class:`DegenerateClientError` naming the first unusable client, ValueError naming the clients'
    feature dimensions (the label-augmented ones in parentheses) when they, or the validation set's, differ.
    One run's contributions carry the randomness of its seed (γ_i^(0), X̃_Q^(0), the t's): for their spread
    over seeds see :func:`valuation_spread`.
    """
    config = as_config(config, FedBaryConfig)
    seeds = np.random.SeedSequence(seed).spawn(len(datasets) + 1)
    clients = [BaryClient.from_data(d, config, np.random.default_rng(s)) for d, s in zip(datasets, seeds[:-1])]
    check_roster([d.name for d in datasets], {d.name: feature_dimension(d) for d in datasets},
                 protocol="FedBary", augmented={c.name: c.dim for c in clients})
    target = validation_target(validation, datasets[0], clients[0].dim, config)
    server = BaryServer(config, np.random.default_rng(seeds[-1]), target=target)
    return fedbary(clients, server, channel=channel, datum_values=datum_values, potential=potential,
                   workers=workers)


@dataclass
class CalibratedDetection:
    """Datum-level detection with a stated false-positive rate (:func:`calibrated_detection`).

    ``values[name]``: the client's calibrated gradients (eq. 10) against η_{Q_i} of the reference part of the
    server's validation set; ``scores[name]``: what is thresholded — the values standardised within the client
    ((g − mean g) / std g, ``score="standardised"``) or the values themselves (``"raw"``); ``flags[name]``: scores
    > ``threshold``; ``threshold``: the split-conformal (1 − ``alpha``) quantile of ``calibration_scores``, the
    scores of the server's clean calibration part valued in the same session (+inf when it holds too few rows for
    ``alpha``: nothing is flagged), whose raw values are ``calibration_values``; ``result``: the session's
    :class:`FedBaryResult` (its contributions include the calibration party, named ``calibration_name``)."""

    names: list[str]
    values: dict[str, np.ndarray]
    scores: dict[str, np.ndarray]
    flags: dict[str, np.ndarray]
    threshold: float
    alpha: float
    score: DetectionScore
    calibration_name: str
    calibration_values: np.ndarray
    calibration_scores: np.ndarray
    result: FedBaryResult

    @property
    def flagged(self) -> int:
        """Data flagged over all clients."""
        return int(sum(int(f.sum()) for f in self.flags.values()))


def calibrated_detection(datasets: Sequence[LabelledData], config: FedBaryConfig | Mapping[str, Any],
                         validation: LabelledData, alpha: float = 0.05, calibration_fraction: float = 0.5,
                         seed: int = 0, channel: Channel | None = None, potential: Potential = "sinkhorn",
                         workers: Workers | None = None, score: DetectionScore = "standardised") -> CalibratedDetection:
    """FedBary's datum-level detection with a stated false-positive rate — the recommended way to flag data.

    The server splits its labelled ``validation`` set class by class
    (:func:`~otfed.valuation.detection.split_validation`): the reference part is Q, the calibration part
    (``calibration_fraction`` of it) joins the session as one more, clean, party. Every party computes its
    calibrated gradients g (eq. 10) against its η_{Q_i} locally and standardises them, z = (g − mean g) / std g
    (``score="standardised"``, the default; ``"raw"`` keeps g); the calibration party's scores give the
    split-conformal threshold τ, the ⌈(n + 1)(1 − α)⌉-th smallest of its n scores
    (:func:`~otfed.valuation.calibrated.calibrated_threshold`), and each client flags its data with z > τ. No
    client datum leaves its client: τ is a number the server computes from its own data and could send out.

    The rate it states: a clean client drawn like the validation set has ≈ α of its data flagged. It is a
    per-datum rate, not a family-wise one, and exchangeability with the calibration rows holds only
    approximately: eq. 10 centres each party's values, and their spread varies from party to party (with the
    party's class proportions against Q's and with η_{Q_i}'s random atoms) — hence the standardisation. Measured
    (``python -m studies.datum_values``; mean over seeds, in brackets the worst clean client of a seed):

    * 8-D, 3 classes, 6 clients × 150 rows (3 with 40% flipped labels), 150 calibration rows, S = 50, 10 seeds:
      at α = 0.05, 5.3% (6.3%) of the clean clients' rows standardised, 6.7% (9.8%) raw; g > 0: 46.8%.
    * 4-D, 6 clients × 60 rows, 45 calibration rows, 5 seeds, class proportions drawn row by row (they differ
      from party to party): at α = 0.05, 3.0% (5.0%) standardised at S = 20 and 2.9% (4.7%) at S = 60; raw
      13.3% (26.7%) and 14.6% (28.7%) — the raw values break the rate when clients' class proportions differ
      from the validation set's.

    It says nothing of the detection rate, which is low at these α: 12% of the flipped rows in the first
    setting, 13–14% in the second. Standardising costs detection where a client holds much noise (its spread
    grows with it): with every party's classes in turn at S = 60 it caught 8.6% of the flipped rows, the raw
    values 21.7% (at 5.4% false positives). The paper's rule is ``flag_noisy(values)`` (g > 0: the upper half of every client, noisy or
    clean). Stage ``noisy_removal`` reports the rate it measured (``fpr_calibrated``) next to α.

    Parameters:
        datasets, config, seed, channel, potential, workers: as :func:`federated_valuation`.
        validation: the server's labelled validation set (every class ≥ 4 rows).
        alpha: the targeted false-positive rate per clean datum, in (0, 1).
        calibration_fraction: the validation set's share used for calibration, in (0, 1); keep the calibration
            part about a client's size.
        score: ``"standardised"`` (default) or ``"raw"`` — what is thresholded.

    Returns:
        A :class:`CalibratedDetection`: per client its values, scores and flags, the threshold and the
        calibration party's values and scores.

    Raises ValueError for ``alpha`` or ``calibration_fraction`` outside (0, 1), an unknown ``score``, a validation
    class with fewer than 4 rows, or a client named like the calibration party; otherwise as
    :func:`federated_valuation`.

    Three clean clients and one with 40% of its labels moved to the next class, all drawn like the server's set: at
    α = 0.1 no clean client has more than 10% of its data flagged, where g > 0 flags about half of each:

    >>> rng = np.random.default_rng(0)
    >>> means = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])
    >>> def draw(name, n, flip=0.0):
    ...     y = np.arange(n) % 3
    ...     x, moved = means[y] + rng.normal(size=(n, 2)), rng.random(n) < flip
    ...     return LabelledData(name, x, np.where(moved, (y + 1) % 3, y)), moved
    >>> clients = [draw(f"client_{i}", 90)[0] for i in range(3)]
    >>> noisy, moved = draw("client_3", 90, flip=0.4)
    >>> det = calibrated_detection([*clients, noisy], FedBaryConfig(support_size=30, iterations=5),
    ...                            draw("server", 180)[0], alpha=0.1, seed=0)
    >>> clean = [f"client_{i}" for i in range(3)]
    >>> bool(max(det.flags[c].mean() for c in clean) <= 0.1), bool(min((det.values[c] > 0).mean() for c in clean) > 0.4)
    (True, True)
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if score not in ("standardised", "raw"):
        raise ValueError(f"score must be 'standardised' or 'raw', got {score!r}")
    reference, calibration = split_validation(validation, calibration_fraction, seed)
    if any(d.name == calibration.name for d in datasets):
        raise ValueError(f"a client is named {calibration.name!r}, the name of the server's calibration party; "
                         "rename it or the validation set")
    result = federated_valuation([*datasets, calibration], config, validation=reference, seed=seed,
                                 channel=channel, datum_values=True, potential=potential, workers=workers)
    assert result.datum_values is not None
    transform = standardised_values if score == "standardised" else np.asarray
    calibration_values = result.datum_values[calibration.name]
    threshold = calibrated_threshold(transform(calibration_values), alpha)
    names = [d.name for d in datasets]
    values = {n: result.datum_values[n] for n in names}
    scores = {n: transform(v) for n, v in values.items()}
    return CalibratedDetection(names=names, values=values, scores=scores,
                               flags={n: z > threshold for n, z in scores.items()}, threshold=threshold,
                               alpha=float(alpha), score=score, calibration_name=calibration.name,
                               calibration_values=calibration_values,
                               calibration_scores=transform(calibration_values), result=result)


def standardised_values(values: np.ndarray) -> np.ndarray:
    """(g − mean g) / std g (population std) within one party — the scale-free score of
    :func:`calibrated_detection`; all zeros when every value is the same."""
    v = np.asarray(values, dtype=np.float64)
    spread = v.std()
    return (v - v.mean()) / spread if spread > 0 else np.zeros_like(v)


def validation_target(validation: LabelledData | None, client: LabelledData, client_dim: int,
                      config: FedBaryConfig) -> Measure | None:
    """Q from the server's ``validation`` set, augmented with the server's own class statistics (None without
    one): DegenerateClientError naming the validation set when it cannot be augmented, ValueError naming both
    feature sizes (and the augmented ones) when it does not match ``client`` (augmented size ``client_dim``)."""
    if validation is None:
        return None
    try:
        target = augmented_measure(validation, diagonal=config.diagonal)
    except DegenerateClientError as exc:
        raise DegenerateClientError(f"server validation set: {exc}") from exc
    if target.dim != client_dim:
        raise ValueError(f"the server's validation set has {feature_dimension(validation)} feature columns but "
                         f"the clients have {feature_dimension(client)} (label-augmented: {target.dim} vs "
                         f"{client_dim})")
    return target


def fedbary_on_measures(measures: Sequence[Measure], names: Sequence[str], config: FedBaryConfig | Mapping[str, Any],
                        target: Measure | None = None, seed: int = 0, datum_values: bool = False,
                        potential: Potential = "sinkhorn", workers: Workers | None = None) -> FedBaryResult:
    """FedBary Algorithm 1 on clients given as (already label-augmented) measures, seeded exactly as
    :func:`federated_valuation` (same ``seed`` and measures → same numbers), so that runs on modified
    measures share every random draw (γ_i^(0), X̃_Q^(0), the t's) with the original (FedBary table 3).
    ``config`` as in :func:`federated_valuation`."""
    config = as_config(config, FedBaryConfig)
    seeds = np.random.SeedSequence(seed).spawn(len(measures) + 1)
    clients = [BaryClient(name, m, config, np.random.default_rng(s)) for name, m, s in zip(names, measures, seeds)]
    server = BaryServer(config, np.random.default_rng(seeds[-1]), target=target)
    return fedbary(clients, server, datum_values=datum_values, potential=potential, workers=workers)



def valuation_spread(datasets: Sequence[LabelledData], config: FedBaryConfig | Mapping[str, Any],
                     validation: LabelledData | None = None, seeds: Sequence[int] = (0, 1, 2, 3, 4),
                     level: float = 0.95, workers: Workers | None = None) -> FedBaryResult:
    """:func:`federated_valuation` rerun once per seed in ``seeds``: the result of the first seed (the same
    numbers as ``federated_valuation(..., seed=seeds[0])``) with :attr:`FedBaryResult.spread` filled — the
    contribution percent of every client in every run, and per client its mean, standard deviation and the
    half-width of the ``level`` confidence interval of the mean.

    One run's shares move with the random draws of its seed (γ_i^(0), X̃_Q^(0), the t's): three identical
    clients can come out at e.g. 28 / 38 / 34 %. The spread says how far a single run's shares can be read.
    Needs at least two distinct seeds (ValueError otherwise).

    Parameters:
        datasets, config, validation, workers: as :func:`federated_valuation`.
        seeds: the runs' seeds (≥ 2, distinct).
        level: the confidence level of the intervals.

    Returns:
        The first seed's :class:`FedBaryResult`, with ``spread`` (a :class:`ContributionSpread`: every run's
        shares, their mean, standard deviation and interval half-width per client).

    Three identical clients: their mean shares sit within the interval of a third each.

    >>> rng = np.random.default_rng(1)
    >>> y = np.repeat([0, 1], 30)
    >>> x = rng.normal(size=(60, 2)) + 3.0 * y[:, None]
    >>> same = [LabelledData(f"client_{i}", x, y) for i in range(3)]
    >>> spread = valuation_spread(same, FedBaryConfig(support_size=20, iterations=5), seeds=range(5)).spread
    >>> bool(np.all(np.abs(spread.mean - 100 / 3) <= spread.half_width + 1e-9))
    True
    """
    seeds = [int(s) for s in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: need at least two distinct seeds to estimate a spread, got {seeds}")
    config = as_config(config, FedBaryConfig)
    runs = [federated_valuation(datasets, config, validation=validation, seed=s, workers=workers) for s in seeds]
    shares = np.array([r.contributions for r in runs])
    intervals = [mean_confidence_interval(shares[:, i], level) for i in range(shares.shape[1])]
    first = runs[0]
    first.spread = ContributionSpread(names=list(first.names), seeds=seeds, contributions=shares,
                                      mean=np.array([m for m, _ in intervals]), std=shares.std(axis=0, ddof=1),
                                      half_width=np.array([h for _, h in intervals]), level=level)
    return first
