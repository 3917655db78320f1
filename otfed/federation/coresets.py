"""Federated Wasserstein coresets (FedWaD §5 "Wasserstein coreset and application to federated learning",
fig. 4–5, app. D.2; Claici, Genevay & Solomon 2018, "Wasserstein measure coresets").

A coreset is K points X' = {x'_1..x'_K} whose uniform measure C = 1/K Σ_i δ_{x'_i} minimises W_2(C, μ).
Here μ's samples live on clients, and the server learns X' without seeing any of them.

**The gradient (FedWaD §5, "update the coreset given the aggregated gradients of these distances").**
For a target measure ν = Σ_j b_j δ_{z_j} and the optimal plan P between C (weights 1/K) and ν,
W_2²(C, ν) = Σ_ij P_ij ||x'_i − z_j||², and where P is unique (envelope theorem)

    ∂W_2²(C, ν)/∂x'_i = 2 Σ_j P_ij (x'_i − z_j) = (2/K) (x'_i − T_ν(x'_i)),    T_ν(x'_i) = K (P Z)_i,

T_ν being the barycentric projection of the plan (FedWaD eq. 10 at t = 1). :func:`coreset_gradient`
returns the *per-atom* gradient g_i = 2 (x'_i − K (P Z)_i) = K · ∂W_2²/∂x'_i — the gradient with respect
to x'_i divided by the atom's mass 1/K, a positive rescaling of the exact gradient.

**Why FedWaD's interpolating measure gives a descent direction.** A FedWaD session (Algorithm 1) between
the server — which plays the μ party with its own coreset C, as the coreset is the server's own data —
and a client holding ν leaves the server with ξ^K, an interpolating measure close to the W_2 geodesic
C → ν. Let ξ_s = Σ_ij P_ij δ_{(1−s)x'_i + s z_j} be the point of that geodesic at time s ∈ (0, 1] (McCann
interpolant, FedWaD eq. 5). The coupling (x'_i, (1−s)x'_i + s z_j) with mass P_ij is an optimal plan
C → ξ_s (a piece of a geodesic is a geodesic), and for s < 1 the only one (optimal transport from an
intermediate point of a W_2 geodesic to an endpoint is unique; Villani 2009, ch. 7). Its barycentric
projection is Σ_j P_ij ((1−s)x'_i + s z_j) / (1/K), so

    T_{ξ_s}(x'_i) = x'_i + s (T_ν(x'_i) − x'_i),   hence   g_i(C, ξ_s) = s · g_i(C, ν).

The gradient the server computes against ξ^K is the gradient towards ν scaled by the geodesic time s > 0:
a descent direction for W_2²(C, ν), hence for W_2(C, ν). With FedWaD's approximate interpolating
measures (eq. 10, S atoms) this holds where the plans are maps (FedWaD theorem 1) and approximately
otherwise — the paper's observation that FedWaD coresets reach a worse minimum than the exact ones.
tests/federation/test_coresets.py checks g(C, ν) = K·∇W_2² and g(C, ξ_s) = s·g(C, ν) against finite
differences of the exact W_2² (POT), and the direction from a whole FedWaD session.

A caveat of eq. 10 measured here: ξ has S atoms of mass 1/S, so a client cluster whose mass is not a
multiple of 1/S is covered by an atom straddling two clusters, whose barycentric projection lies between
them and pulls the coreset. Three equal tight blobs (centres ~ N(0, 5² I)), K = 3: S = 10 left the
coreset 0.4–2.6 from the blob means, S ∈ {9, 30} within 0.015 (0.075 once with a random ξ⁰). Choose S a
multiple of K when clusters are balanced, or a large S.

**Where each session starts.** ``session_start="coreset"`` (default) starts FedWaD at ξ⁰ = the coreset's
atoms (x'_{j mod K}, j < S; exactly C when K divides S) instead of FedWaD's random ξ⁰ ~ N(0, I)
(``"random"``, the paper's). ξ⁰ is then already on the geodesic C → ν (s = 0) and every interpolant
stays near it, so few FedWaD iterations suffice: blobs as above, S = 9, 25 epochs, 5 FedWaD iterations: within
0.004 of the means from ξ⁰ = C, 0.08–1.4 from a random ξ⁰ (10 iterations: 0.004–0.075); 32-D, n = 250,
K = S = 10: 5 iterations reach the W_2 of the exact reference (within 0.3 %). It reveals little more: a client
sees the coreset after a few iterations anyway (ξ^k lies between C and its data), and the coreset — the
clients' Laguerre-cell means at convergence — is what the protocol computes.

**The scale s.** s is unknown to the server: FedWaD's t's are random and partly drawn privately by the
client. It is estimated from ξ^K's side. In FedWaD's approximate interpolation (eq. 10) every atom ξ_j
moves along the segment from its barycentric projection a_j onto C to its projection b_j onto ν, so near
the geodesic ξ_j ≈ (1 − s) a_j + s b_j and
    ŝ = e_C / (e_C + e_ν),   e_C = (Σ_j w_j ||ξ_j − a_j||²)^½ (server, own plan ξ → C),
                             e_ν = (Σ_j w_j ||ξ_j − b_j||²)^½ (client, one scalar: :func:`projection_distance`).
(The ratio of the distances W(C, ξ^K) / (W(C, ξ^K) + W(ξ^K, ν)) was measured biased: W(ξ^K, ν) also holds the
quantisation error of ν by S atoms, so it underestimates s — K = 1 on three non-iid clients, S = 5, random
ξ⁰: error 0.27–0.40 from the mean, against 0.00–0.04 with the projections. On a geodesic point the
projections give ŝ = s exactly: tests/federation/test_coresets.py.)
The update is the Lloyd-like fixed-point step (Claici et al. 2018; the free-support barycenter step of
Cuturi & Doucet 2014 with one measure) applied to the clients' directions D_c = T_{ξ_c}(x') − x':

    x'_i ← x'_i + lr · Σ_c ω_c D_c(x'_i) = x'_i − (lr/2) · Σ_c ω_c g_i(C, ξ_c),

a gradient step of size lr/2 on the per-atom gradient (lr·K/2 on the exact gradient of W_2²), with
``step`` choosing ω (Σ n_c over the epoch's clients normalises the counts n_c):
- ``"reweighted"`` (default): ω_c ∝ n_c / ŝ_c, normalised to Σ_c ω_c = 1. Since D_c = ŝ_c D_{ν_c}, the step is
  h·Σ_c n_c D_{ν_c} with h ≤ 1 — the exact update's direction on the clients' measures, and its fixed point —
  while remaining a convex combination of the D_c (a small ŝ_c amplifies nothing). With one client it is
  x' ← x' + lr D (a step of lr·s of the way to T_ν(x')).
- ``"rescaled"``: ω_c = n_c / (Σ n) / ŝ_c — the step towards T_ν itself (lr = 1: the full Lloyd step), faster
  but it divides the errors of ξ^K by ŝ_c (floored at ``min_geodesic_fraction``).
- ``"plain"``: ω_c ∝ n_c, the paper's literal aggregated gradient; its effective step lr·s_c is a random
  fraction of the Lloyd step, so clients whose ξ ended close to C pull less — the fixed point jitters
  (K = 1, three non-iid clients, S = 5, 40 epochs: 0.01–0.48 from the mean, against 0.002–0.008 for
  ``reweighted`` and 0.000–0.004 for ``rescaled``; with a random ξ⁰ 0.17–1.04, 0.00–0.04, 0.00–0.01).
With lr = 1 and the exact plan to μ the update is x' ← T_μ(x'), the Lloyd step of the exact coreset
(:func:`wasserstein_coreset`).

**What the federated objective is.** Aggregating per-client gradients (weights n_c / Σ n_c over the
sampled clients) descends Σ_c w_c W_2²(C, ν_c), an upper bound of W_2²(C, μ) for μ = Σ_c w_c ν_c (joint
convexity of W_2²: mixing the clients' plans gives a plan C → μ), with equality when the clients hold the
same distribution. With non-iid clients the federated coreset is the Wasserstein barycenter-type minimiser
of that bound, not the coreset of the pooled data — part of what the paper reports as FedWaD coresets
missing modes when classes are split across clients (fig. 4, 10). Measured: three equal tight blobs split
at random over four clients (so each client's blob proportions differ from 1/3) keep even the exact
minimiser of the bound 0.2 from the blob means; a stratified split (equal proportions) recovers them.

**Privacy.** The server receives interpolating measures ξ_ν (S atoms), two scalars per session (W(ξ^K, ν),
FedWaD's closing distance, and e_ν), and each client's sample count (one
:class:`~otfed.federation.messages.CountMessage`); never a sample. The
per-client classification model (§5 "Federated coreset classification model") also has every client send
its final coreset points with labels (:class:`LabelledCoresetMessage`), the label of each point being that
of the nearest client sample, computed on the client. With K close to a client's n the coreset converges
onto the samples themselves, so :func:`client_coreset` requires K < n.

Server methods take messages only (:class:`CoresetServer`); :func:`federated_coreset` drives the
protocol over a ledgered :class:`~otfed.federation.ledger.Channel`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar, Literal, Sequence

import numpy as np

from pydantic import Field, model_validator

from otfed.errors import DegenerateClientError, SupportGrowthError
from otfed.federation.fedwad import (FedWaDConfig, WassersteinClient, client_step, draw_t, server_step,
                                     subproblem_transport)
from otfed.federation.ledger import Channel, Ledger
from otfed.federation.messages import SERVER, CountMessage, DistanceMessage, MeasureMessage, Message
from otfed.federation.parties import check_roster
from otfed.ot import Measure, Transport, interpolate_approx, optimal_transport
from otfed.ot.otdd import LabelledData
from otfed.schema import Strict

CoresetStep = Literal["reweighted", "rescaled", "plain"]
SessionStart = Literal["random", "coreset"]

#: ``kind`` of the messages a coreset session adds to FedWaD's.
SAMPLE_COUNT = "sample_count"
PROJECTION_DISTANCE = "projection_distance"
LABELLED_CORESET = "labelled_coreset"


class CoresetInputError(DegenerateClientError, ValueError):
    """A client's data cannot be used for a coreset (empty, NaN/inf, labels that do not match); names the
    client. Both a :class:`~otfed.errors.DegenerateClientError` (stages exit 2) and a ``ValueError``."""


def _default_fedwad() -> FedWaDConfig:
    return FedWaDConfig(support_size=10, iterations=10)


class CoresetConfig(Strict):
    """Federated Wasserstein coreset settings (FedWaD §5, app. D.2 used 10 points, 1000 epochs, 10 clients
    per epoch, S ∈ {10, 100}, 20 FedWaD iterations).

    ``points`` K; ``epochs`` coreset updates; ``clients_per_epoch`` clients drawn without replacement per
    epoch among the active ones (all of them when fewer); ``lr`` the step of the Lloyd-like update
    (1 = the full fixed-point step; module docstring); ``step`` how the clients' directions are weighted
    (``reweighted``: ∝ n_c/ŝ_c, convex; ``rescaled``: n_c/ŝ_c; ``plain``: ∝ n_c); ``min_geodesic_fraction``
    floors ŝ_c; ``init_scale`` the initial coreset ~ N(0, init_scale² I); ``session_start`` the ξ⁰ of every
    FedWaD session (the coreset, or random as in FedWaD); ``fedwad`` the settings of every
    FedWaD session (S = ``fedwad.support_size``, its iterations, t, solver …; p must be 2).
    """

    points: int = Field(10, ge=1, le=100000, description="K, the number of coreset points.")
    epochs: int = Field(100, ge=1, le=1000000, description="Coreset updates.")
    clients_per_epoch: int = Field(10, ge=1, description="Clients drawn per epoch (capped at the number of clients).")
    lr: float = Field(1.0, gt=0.0, le=1.0, description="x' ← x' + lr·Σ_c ω_c (T_ξc(x') − x'); 1 = Lloyd step.")
    step: CoresetStep = "reweighted"
    min_geodesic_fraction: float = Field(0.05, gt=0.0, le=1.0, description="Floor of ŝ_c.")
    init_scale: float = Field(1.0, gt=0.0, description="Initial coreset ~ N(0, init_scale² I).")
    session_start: SessionStart = Field("coreset", description="ξ⁰ of every FedWaD session: 'random' "
                                        "(FedWaD's N(0, fedwad.init_scale² I)) or 'coreset' (the coreset's atoms).")
    fedwad: FedWaDConfig = Field(default_factory=_default_fedwad)

    @model_validator(mode="after")
    def _p_is_two(self) -> "CoresetConfig":
        if self.fedwad.p != 2:
            raise ValueError("fedwad.p: coreset sessions need p = 2 (the gradient is that of W_2²)")
        return self


# ----------------------------------------------------------------------------------------------------
# pure steps


def initial_coreset(points: int, dim: int, init_scale: float, rng: np.random.Generator) -> Measure:
    """X'^(0): K atoms ~ N(0, init_scale² I), uniform weights 1/K (the server knows nothing of the data)."""
    return Measure.uniform(rng.normal(0.0, init_scale, size=(points, dim)))


def _transport(source: Measure, target: Measure, config: FedWaDConfig | None) -> Transport:
    if source.dim != target.dim:
        raise ValueError(f"measures live in different dimensions: {source.dim} vs {target.dim}")
    if config is None:
        return optimal_transport(source, target, p=2)
    return subproblem_transport(source, target, config)


def barycentric_displacement(coreset: Measure, target: Measure, config: FedWaDConfig | None = None
                             ) -> tuple[np.ndarray, float]:
    """D_i = T(x'_i) − x'_i for every coreset atom, T(x'_i) = (P Z)_i / a_i the barycentric projection of the
    optimal W_2 plan P (FedWaD eq. 10 at t = 1), and W_2(coreset, target) from the same plan.

    ``config`` None: the exact network simplex (the reference coreset); else FedWaD's subproblem solver.
    """
    transport = _transport(coreset, target, config)
    mapped = interpolate_approx(coreset, target, transport.plan, 1.0).support
    return mapped - coreset.support, transport.cost


def coreset_gradient(coreset: Measure, target: Measure, config: FedWaDConfig | None = None) -> np.ndarray:
    """Per-atom gradient g_i = 2 (x'_i − K (P Z)_i) = K · ∂W_2²(C, target)/∂x'_i for a uniform coreset C
    (module docstring; FedWaD §5's coreset gradient; exact where the optimal plan P is unique). Against an
    interpolating measure ξ_s at time s on the geodesic C → ν it equals s · g(C, ν). In general
    g_i = −2 D_i (:func:`barycentric_displacement`), the gradient divided by the atom's mass a_i."""
    return -2.0 * barycentric_displacement(coreset, target, config)[0]


def projection_distance(source: Measure, target: Measure, config: FedWaDConfig | None = None) -> float:
    """e = (Σ_j w_j ||ξ_j − T(ξ_j)||²)^½: the distance from ``source`` = ξ to the barycentric projection of its
    atoms onto ``target`` (FedWaD eq. 10 at t = 1), i.e. to the end of the approximate geodesic from ξ.
    The client's e_ν and the server's e_C give ŝ (:func:`geodesic_fraction`)."""
    transport = _transport(source, target, config)
    mapped = interpolate_approx(source, target, transport.plan, 1.0).support
    return float(np.sqrt(np.dot(source.weights, ((mapped - source.support) ** 2).sum(axis=1))))


def geodesic_fraction(e_coreset: float, e_client: float, floor: float = 0.0) -> float:
    """ŝ = e_C / (e_C + e_ν), clipped to [floor, 1]: ξ's position on the segments from its projections onto
    C to its projections onto ν (module docstring, "The scale s"); 1 when both are 0."""
    total = e_coreset + e_client
    if not total > 0:
        return 1.0
    return float(np.clip(e_coreset / total, floor, 1.0))


def aggregate_step(coreset: Measure, displacements: Sequence[np.ndarray], counts: Sequence[int],
                   fractions: Sequence[float], config: CoresetConfig) -> Measure:
    """One coreset update x' ← x' + lr Σ_c ω_c D_c (module docstring): D_c the displacement towards ξ_c,
    ω_c ∝ n_c/ŝ_c with Σ ω_c = 1 (``reweighted``), ω_c = (n_c/Σ n)/ŝ_c (``rescaled``), ω_c = n_c/Σ n
    (``plain``); ŝ_c floored at ``min_geodesic_fraction``. The weights 1/K stay."""
    n = len(displacements)
    if n == 0 or len(counts) != n or len(fractions) != n:
        raise ValueError(f"need one count and one geodesic fraction per displacement, got {n} displacements, "
                         f"{len(counts)} counts, {len(fractions)} fractions")
    w = np.asarray(counts, dtype=np.float64)
    s = np.maximum(np.asarray(fractions, dtype=np.float64), config.min_geodesic_fraction)
    if config.step == "reweighted":
        w = w / s
    w = w / w.sum()
    if config.step == "rescaled":
        w = w / s
    step = sum(w_c * d_c for w_c, d_c in zip(w, displacements))
    return Measure(coreset.support + config.lr * step, coreset.weights)


# ----------------------------------------------------------------------------------------------------
# the classification model: labelled coresets and 1-NN


def nearest_indices(queries: np.ndarray, reference: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Index of the nearest row of ``reference`` (Euclidean) for every row of ``queries``; ties → first."""
    queries = np.asarray(queries, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if queries.ndim != 2 or reference.ndim != 2 or queries.shape[1] != reference.shape[1]:
        raise ValueError(f"nearest neighbours: queries of shape {queries.shape} and reference of shape "
                         f"{reference.shape} must be 2-D with the same dimension")
    if reference.shape[0] == 0:
        raise ValueError("nearest neighbours: the reference set is empty")
    r2 = (reference * reference).sum(axis=1)
    out = np.empty(queries.shape[0], dtype=np.int64)
    for start in range(0, queries.shape[0], chunk):
        q = queries[start:start + chunk]
        out[start:start + chunk] = np.argmin(r2[None, :] - 2.0 * q @ reference.T, axis=1)
    return out


def nearest_sample_labels(points: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The label of the nearest sample of (x, y) for every coreset point — the client-side labelling of FedWaD
    §5 ("assigned to each element of a coreset the label of the closest element in the client dataset")."""
    return np.asarray(y)[nearest_indices(points, x)]


@dataclass(frozen=True)
class LabelledCoresetMessage(Message):
    """A client's coreset points with the label of each point's nearest client sample (FedWaD §5,
    "Federated coreset classification model"): what a client shares for the global 1-NN classifier."""

    points: np.ndarray = None  # type: ignore[assignment]
    labels: np.ndarray = None  # type: ignore[assignment]

    payload_type: ClassVar[str] = "labelled_coreset"

    def __post_init__(self) -> None:
        points = np.asarray(self.points, dtype=np.float64)
        labels = np.asarray(self.labels)
        if points.ndim != 2 or labels.shape != (points.shape[0],):
            raise ValueError(f"{self.sender}: a labelled coreset needs K×d points and K labels "
                             f"(got shapes {points.shape} and {labels.shape})")
        object.__setattr__(self, "points", points)
        object.__setattr__(self, "labels", labels)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.points, self.labels)


class CoresetClassifier:
    """The server's global 1-NN classifier over every client's labelled coreset (FedWaD §5, fig. 5, 12).
    Built from messages only."""

    def __init__(self, points: np.ndarray, labels: np.ndarray) -> None:
        points = np.asarray(points, dtype=np.float64)
        labels = np.asarray(labels)
        if points.ndim != 2 or points.shape[0] == 0 or labels.shape != (points.shape[0],):
            raise ValueError(f"a 1-NN classifier needs n×d points and n labels, got shapes {points.shape} "
                             f"and {labels.shape}")
        self.points, self.labels = points, labels

    @classmethod
    def from_messages(cls, messages: Sequence[LabelledCoresetMessage]) -> "CoresetClassifier":
        """Pool the labelled coresets the clients shared."""
        if not messages:
            raise ValueError("a coreset classifier needs at least one labelled coreset")
        dims = {m.sender: m.points.shape[1] for m in messages}
        if len(set(dims.values())) != 1:
            raise ValueError(f"labelled coresets have different dimensions: {dims}")
        return cls(np.vstack([m.points for m in messages]), np.concatenate([m.labels for m in messages]))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The label of the nearest coreset point for every row of x."""
        return self.labels[nearest_indices(x, self.points)]

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        """Fraction of rows of x whose predicted label is y (evaluated by the client on its test data)."""
        y = np.asarray(y)
        if y.shape != (np.asarray(x).shape[0],) or y.size == 0:
            raise ValueError(f"accuracy needs n > 0 samples and n labels, got {np.asarray(x).shape} and {y.shape}")
        return float(np.mean(self.predict(x) == y))


# ----------------------------------------------------------------------------------------------------
# roles


def _client_samples(name: str, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise CoresetInputError(f"client {name!r}: samples must be an (n, d) array, got shape {x.shape}")
    if x.shape[0] == 0:
        raise CoresetInputError(f"client {name!r} has no samples")
    if not np.isfinite(x).all():
        raise CoresetInputError(f"client {name!r}: samples contain NaN or inf")
    return x


class CoresetClient(WassersteinClient):
    """A FedWaD client (:class:`~otfed.federation.fedwad.WassersteinClient`: interpolants and distances) that
    also reports its sample count and e_ν, and, when it has labels, labels a coreset by its nearest samples.
    It never sends a sample."""

    def __init__(self, name: str, x: np.ndarray, config: FedWaDConfig, rng: np.random.Generator,
                 y: np.ndarray | None = None) -> None:
        x = _client_samples(name, x)
        if y is not None:
            y = np.asarray(y)
            if y.shape != (x.shape[0],):
                raise CoresetInputError(f"client {name!r}: {x.shape[0]} samples but labels of shape {y.shape}")
        super().__init__(name, Measure.uniform(x), config, rng)
        self._x, self._y = x, y

    @classmethod
    def from_data(cls, data: LabelledData, config: FedWaDConfig, rng: np.random.Generator) -> "CoresetClient":
        return cls(data.name, data.x, config, rng, y=data.y)

    @property
    def n(self) -> int:
        """Public metadata: the sample count (also sent as a :class:`CountMessage`)."""
        return int(self._x.shape[0])

    def count(self) -> CountMessage:
        """n_c, the weight of this client's direction in the aggregated step."""
        return CountMessage(SAMPLE_COUNT, self.name, SERVER, value=self.n)

    def projection_distance(self, request: MeasureMessage) -> DistanceMessage:
        """e_ν = :func:`projection_distance` from the received ξ to this client's measure."""
        return DistanceMessage(PROJECTION_DISTANCE, self.name, SERVER,
                               value=projection_distance(request.measure, self._measure, self._config))

    def label(self, coreset: MeasureMessage) -> LabelledCoresetMessage:
        """Label each point of the received coreset by its nearest own sample (computed here) and share the
        labelled coreset (FedWaD §5, "Federated coreset classification model")."""
        if self._y is None:
            raise ValueError(f"client {self.name!r} has no labels to assign to a coreset")
        if coreset.measure.dim != self.dim:
            raise ValueError(f"client {self.name!r}: the coreset has dimension {coreset.measure.dim} but the "
                             f"data {self.dim}")
        points = coreset.measure.support
        return LabelledCoresetMessage(LABELLED_CORESET, self.name, SERVER, points=points,
                                      labels=nearest_sample_labels(points, self._x, self._y))


@dataclass
class SessionOutcome:
    """What the server keeps from one FedWaD session with one client: the displacement D of its coreset
    towards ξ^K (= −g/2), ŝ, and FedWaD's estimate W(C, ξ^K) + W(ξ^K, ν) of W_2(C, ν)."""

    client: str
    displacement: np.ndarray
    fraction: float
    estimate: float


class CoresetServer:
    """The server: holds the coreset C (its own measure) and, per sampled client, runs FedWaD Algorithm 1 as
    the μ party of C. Its methods take messages only."""

    def __init__(self, config: CoresetConfig, rng: np.random.Generator, name: str = SERVER) -> None:
        self.name = name
        self.config = config
        self._rng = rng
        self.coreset: Measure | None = None
        self.xi: Measure | None = None
        self.counts: dict[str, int] = {}

    def initialise(self, dim: int, init: np.ndarray | None = None) -> Measure:
        """C^(0) = :func:`initial_coreset` (the server rng's first draw), or ``init`` (K × d)."""
        K = self.config.points
        if init is None:
            self.coreset = initial_coreset(K, dim, self.config.init_scale, self._rng)
        else:
            self.coreset = Measure.uniform(_initial_points(init, K, dim))
        return self.coreset

    def register(self, count: CountMessage) -> None:
        """Record a client's reported sample count."""
        if count.value < 1:
            raise ValueError(f"client {count.sender!r} reported {count.value} samples")
        self.counts[count.sender] = int(count.value)

    def sample_clients(self, names: Sequence[str]) -> list[str]:
        """This epoch's clients: ``clients_per_epoch`` drawn without replacement (all of them when fewer)."""
        m = min(self.config.clients_per_epoch, len(names))
        if m == len(names):
            return list(names)
        return [names[i] for i in sorted(self._rng.choice(len(names), size=m, replace=False))]

    def start_session(self, dim: int) -> Measure:
        """ξ⁰, S atoms of weight 1/S: ~ N(0, fedwad.init_scale² I) (``session_start="random"``, FedWaD's
        initialisation) or the coreset's atoms x'_{j mod K} (``"coreset"``: ξ⁰ starts on the geodesic C → ν,
        at s = 0 — exactly C when K divides S)."""
        fw = self.config.fedwad
        if self.config.session_start == "coreset":
            assert self.coreset is not None, "initialise() first"
            support = self.coreset.support[np.arange(fw.support_size) % self.coreset.n]
        else:
            support = self._rng.normal(0.0, fw.init_scale, size=(fw.support_size, dim))
        self.xi = Measure.uniform(support)
        return self.xi

    def broadcast(self, receiver: str) -> MeasureMessage:
        assert self.xi is not None, "start_session() first"
        return MeasureMessage("xi", self.name, receiver, measure=self.xi)

    def combine(self, xi_client: MeasureMessage) -> Measure:
        """Algorithm 1 with the server as the μ party: ξ_C = InterpMeas(ξ → C) (line 4, its own interpolant —
        no transfer), then ξ = InterpMeas(ξ_C, ξ_ν) (line 7)."""
        assert self.xi is not None and self.coreset is not None, "initialise() and start_session() first"
        fw = self.config.fedwad
        xi_own = client_step(self.coreset, self.xi, draw_t(fw, self._rng), fw)
        self.xi = server_step(xi_own, xi_client.measure, draw_t(fw, self._rng), fw)
        return self.xi

    def conclude(self, distance: DistanceMessage, projection: DistanceMessage) -> SessionOutcome:
        """End of a session: D towards ξ^K and W(C, ξ^K) from one plan C ↔ ξ^K, e_C from the same plan,
        ŝ = e_C/(e_C + e_ν) with the client's e_ν (``projection``), and the estimate W(C, ξ^K) + W(ξ^K, ν)
        with the client's closing distance (``distance``, FedWaD Algorithm 1, lines 9–10)."""
        assert self.xi is not None and self.coreset is not None
        transport = _transport(self.coreset, self.xi, self.config.fedwad)
        displacement = interpolate_approx(self.coreset, self.xi, transport.plan, 1.0).support - self.coreset.support
        back = interpolate_approx(self.xi, self.coreset, transport.plan.T, 1.0).support - self.xi.support
        e_coreset = float(np.sqrt(np.dot(self.xi.weights, (back ** 2).sum(axis=1))))
        fraction = geodesic_fraction(e_coreset, projection.value, self.config.min_geodesic_fraction)
        return SessionOutcome(distance.sender, displacement, fraction, transport.cost + distance.value)

    def update(self, outcomes: Sequence[SessionOutcome]) -> Measure:
        """The epoch's step (:func:`aggregate_step`), weighted by the clients' reported counts."""
        assert self.coreset is not None
        self.coreset = aggregate_step(self.coreset, [o.displacement for o in outcomes],
                                      [self.counts[o.client] for o in outcomes], [o.fraction for o in outcomes],
                                      self.config)
        return self.coreset

    def share(self, receiver: str) -> MeasureMessage:
        """The learnt coreset, sent to a client (to be labelled)."""
        assert self.coreset is not None
        return MeasureMessage("coreset", self.name, receiver, measure=self.coreset)


def _initial_points(init: np.ndarray, points: int, dim: int) -> np.ndarray:
    init = np.asarray(init, dtype=np.float64)
    if init.shape != (points, dim):
        raise ValueError(f"initial coreset must have shape ({points}, {dim}) (points × dimension), got {init.shape}")
    return init


# ----------------------------------------------------------------------------------------------------
# drivers


@dataclass
class CoresetResult:
    """A learnt coreset (K × d), its initial value, the loss per epoch (federated: the count-weighted FedWaD
    estimates of W_2(C, ν_c) of the epoch's clients; exact: W_2(C, μ)), both before that epoch's step, and
    the ledger of every message (empty for the exact reference)."""

    coreset: np.ndarray
    initial: np.ndarray
    history: list[float] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)


def coreset_session(client: CoresetClient, server: CoresetServer, channel: Channel) -> SessionOutcome:
    """One FedWaD session (Algorithm 1, ``fedwad.iterations`` iterations; two measures per iteration, as the
    server is the μ party) between the server's coreset and one client, then the closing round: ξ^K to the
    client, W(ξ^K, ν) and e_ν back. Returns what the server keeps (:meth:`CoresetServer.conclude`)."""
    fw = server.config.fedwad
    server.start_session(client.dim)
    for _ in range(fw.iterations):
        channel.round += 1
        request = channel.send(server.broadcast(client.name))
        xi = server.combine(channel.send(client.interpolate(request)))
        if fw.max_support is not None and xi.n > fw.max_support:
            raise SupportGrowthError(f"exact interpolation: the support of ξ grew to {xi.n} atoms "
                                     f"(> max_support={fw.max_support}) in a session with {client.name!r}")
    channel.round += 1
    final = channel.send(server.broadcast(client.name))
    distance = channel.send(client.distance(final))
    return server.conclude(distance, channel.send(client.projection_distance(final)))


def _check_clients(clients: Sequence[CoresetClient], points: int) -> None:
    check_roster([c.name for c in clients], {c.name: c.dim for c in clients}, protocol="a federated coreset")
    total = sum(c.n for c in clients)
    if points > total:
        raise ValueError(f"coreset points K={points} exceeds the {total} samples held by the clients")


def federated_coreset(clients: Sequence[CoresetClient], server: CoresetServer, channel: Channel | None = None,
                      init: np.ndarray | None = None,
                      on_epoch: Callable[[int, float], None] | None = None) -> CoresetResult:
    """Learn the server's coreset from the clients (FedWaD §5, app. D.2): the clients report their counts;
    each epoch the server draws ``clients_per_epoch`` of them, runs one FedWaD session with each
    (:func:`coreset_session`) and takes one aggregated step (:meth:`CoresetServer.update`). Every message
    goes through ``channel`` (ledgered; rounds numbered consecutively over the whole run). ``on_epoch(e, loss)``
    is called after every epoch (progress, metric logging) with the epoch's loss estimate."""
    _check_clients(clients, server.config.points)
    channel = channel or Channel(session="coreset")
    names = [c.name for c in clients]
    by_name = dict(zip(names, clients))
    initial = server.initialise(clients[0].dim, init).support.copy()
    channel.round = 0
    for client in clients:
        server.register(channel.send(client.count()))
    history: list[float] = []
    for _ in range(server.config.epochs):
        outcomes = [coreset_session(by_name[name], server, channel) for name in server.sample_clients(names)]
        w = np.array([server.counts[o.client] for o in outcomes], dtype=np.float64)
        history.append(float(np.dot(w / w.sum(), [o.estimate for o in outcomes])))
        server.update(outcomes)
        if on_epoch is not None:
            on_epoch(len(history), history[-1])
    assert server.coreset is not None
    return CoresetResult(server.coreset.support.copy(), initial, history, channel.ledger)


def federated_wasserstein_coreset(datasets: Sequence[np.ndarray], config: CoresetConfig, seed: int = 0,
                                  names: Sequence[str] | None = None, channel: Channel | None = None,
                                  init: np.ndarray | None = None,
                                  on_epoch: Callable[[int, float], None] | None = None) -> CoresetResult:
    """Convenience: the federated coreset of samples spread over clients (one (n_c, d) array per client,
    uniform weights), every party seeded from ``seed`` (same seed → identical coreset). Without ``init`` the
    initial coreset is the one :func:`wasserstein_coreset` draws from the same seed."""
    names = list(names) if names is not None else [f"client_{i}" for i in range(len(datasets))]
    if len(names) != len(datasets):
        raise ValueError(f"{len(names)} names for {len(datasets)} client datasets")
    server_seed, *client_seeds = np.random.SeedSequence(seed).spawn(len(datasets) + 1)
    clients = [CoresetClient(name, x, config.fedwad, np.random.default_rng(s))
               for name, x, s in zip(names, datasets, client_seeds)]
    server = CoresetServer(config, np.random.default_rng(server_seed))
    return federated_coreset(clients, server, channel=channel, init=init, on_epoch=on_epoch)


def wasserstein_coreset(x: np.ndarray, points: int, epochs: int = 100, lr: float = 1.0, seed: int = 0,
                        init_scale: float = 1.0, init: np.ndarray | None = None) -> CoresetResult:
    """The exact, non-federated reference (FedWaD §5, fig. 4 top rows): the same update with the exact plan
    (network simplex) between the coreset and the pooled data μ, x' ← x' + lr (T_μ(x') − x') — with lr = 1
    the Lloyd-like fixed-point iteration of Wasserstein measure coresets (Claici et al. 2018).
    ``history[e]`` = W_2(C^(e), μ) (exact). Without ``init`` the initial coreset is the one
    :func:`federated_wasserstein_coreset` draws from the same ``seed``."""
    x = _client_samples("pooled data", x)
    if not 1 <= points <= x.shape[0]:
        raise ValueError(f"coreset points K={points} must be between 1 and the number of samples n={x.shape[0]}")
    if not 0 < lr <= 1:
        raise ValueError(f"lr must be in (0, 1], got {lr}")
    if epochs < 1:
        raise ValueError(f"epochs must be ≥ 1, got {epochs}")
    if init is None:
        server_seed = np.random.SeedSequence(seed).spawn(1)[0]  # the federated run's server seed
        coreset = initial_coreset(points, x.shape[1], init_scale, np.random.default_rng(server_seed))
    else:
        coreset = Measure.uniform(_initial_points(init, points, x.shape[1]))
    data = Measure.uniform(x)
    initial = coreset.support.copy()
    history = []
    for _ in range(epochs):
        displacement, cost = barycentric_displacement(coreset, data)
        history.append(cost)
        coreset = Measure(coreset.support + lr * displacement, coreset.weights)
    return CoresetResult(coreset.support.copy(), initial, history)


# ----------------------------------------------------------------------------------------------------
# per-client coresets for the 1-NN classification model


@dataclass
class LabelledCoreset:
    """One client's labelled coreset (the message it shared), its learning curve and the ledger."""

    message: LabelledCoresetMessage
    history: list[float] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)

    @property
    def name(self) -> str:
        return self.message.sender

    @property
    def points(self) -> np.ndarray:
        return self.message.points

    @property
    def labels(self) -> np.ndarray:
        return self.message.labels


def client_seed(seed: int, index: int) -> int:
    """The seed of client ``index``'s coreset run — independent of the order or place the runs are scheduled."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def client_coreset(data: LabelledData, config: CoresetConfig, seed: int = 0, channel: Channel | None = None,
                   on_epoch: Callable[[int, float], None] | None = None) -> LabelledCoreset:
    """One client's labelled coreset (FedWaD §5, "Federated coreset classification model"): the federated
    coreset between the server and this client alone (``clients_per_epoch`` is moot), then the server sends
    the coreset to the client, which labels each point by its nearest own sample and shares the labelled
    points. Requires K < n: with K ≥ n the coreset converges onto the samples, which would then be shared."""
    server_seed, client_rng_seed = np.random.SeedSequence(seed).spawn(2)
    client = CoresetClient.from_data(data, config.fedwad, np.random.default_rng(client_rng_seed))
    if config.points >= client.n:
        raise ValueError(f"client {data.name!r}: coreset points K={config.points} must be smaller than its "
                         f"n={client.n} samples (with K ≥ n the shared coreset converges onto the samples)")
    channel = channel or Channel(session=f"coreset|{data.name}")
    server = CoresetServer(config, np.random.default_rng(server_seed))
    result = federated_coreset([client], server, channel=channel, on_epoch=on_epoch)
    channel.round += 1
    message = channel.send(client.label(channel.send(server.share(client.name))))
    return LabelledCoreset(message, result.history, channel.ledger)


def client_coresets(datasets: Sequence[LabelledData], config: CoresetConfig, seed: int = 0
                    ) -> list[LabelledCoreset]:
    """:func:`client_coreset` for every client, client i seeded with :func:`client_seed` (seed, i)."""
    check_roster([d.name for d in datasets], {d.name: np.asarray(d.x).shape[1:] for d in datasets})
    return [client_coreset(d, config, client_seed(seed, i)) for i, d in enumerate(datasets)]


def coreset_classifier(coresets: Sequence[LabelledCoreset]) -> CoresetClassifier:
    """The server's global 1-NN classifier over all clients' labelled coresets (:class:`CoresetClassifier`)."""
    return CoresetClassifier.from_messages([c.message for c in coresets])


def client_accuracies(classifier: CoresetClassifier, tests: Sequence[LabelledData]) -> dict[str, float]:
    """Accuracy of the shared 1-NN classifier on every client's test data (FedWaD fig. 5, 12)."""
    return {t.name: classifier.accuracy(t.x, t.y) for t in tests}
