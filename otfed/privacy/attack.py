"""An honest-but-curious server against FedWaD, federated OTDD and FedBary: what it can reconstruct of a
client's samples from nothing but the messages it received and the messages it sent itself.

**What the server sees.** FedWaD (Algorithm 1): for every round k and client c it sent ξ^{k−1} and received
ξ_c^k = InterpMeas(ξ^{k−1} → μ_c) at the client's time t_k; at the end one distance d_{c,ξ^K} = W_p(μ_c, ξ^K)
(per round as well when the clients report monitoring distances). Federated OTDD (FedWaD §4 "Federated
OTDD", app. D.3) is FedWaD on label-augmented samples [x; m_y; vec(Σ_y^{1/2})]. FedBary (Algorithm 1,
eqs. 4–7): per round the server receives γ_i^{(k−1)} and d_i^client and sends η_{Q_i}^{(k)}; the client's
next γ_i^{(k)} = InterpMeas(η_{P_i}^{(k)} → η_{Q_i}^{(k)}) arrives with the next round.

**Inversion (FedWaD eq. 10).** The approximate interpolant keeps ξ's atoms in order:
ξ_{c,i} = (1 − t) ξ_i + t T(ξ_i), T(ξ_i) = (P Y)_i / a_i the barycentric projection of ξ_i onto the client's
samples. Knowing t, T(ξ_i) = (ξ_{c,i} − (1 − t) ξ_i) / t exactly (:func:`invert_interpolation`). T(ξ_i) is the
mean of the samples in ξ_i's transport cell; where the plan row is not split it *is* a sample. The optimal
plan between uniform measures is a vertex of the transportation polytope: with S = n a permutation (FedWaD
theorem 1), with n | S every row whole, and for any S ≥ n at most n − 1 rows are split — so with S ≥ n nearly
every T(ξ_i) is a client sample. With S ≪ n they are S cell means per round.
**Exact interpolation (FedWaD eq. 5)** sends atoms (1 − t) x_i + t y_j with mass P_ij. The coupling
x_i ↔ (1 − t) x_i + t y_j is the unique optimal plan from ξ^{k−1} to ξ_c^k for t < 1 (a piece of a geodesic),
so the server recovers each atom's source by solving that OT problem itself (:func:`interpolant_sources`)
and then y_j exactly: every client sample, in one round.

**Estimating a random t.** t ~ U(0, 1), drawn privately per interpolation (FedWaD §3's privacy option),
does not hide the samples:
- *means* (:func:`estimate_times_from_means`): for any feasible plan Σ_i a_i T(ξ_i) = Σ_j b_j y_j = m_c, so
  the mean of ξ_c^k is (1 − t_k) mean(ξ^{k−1}) + t_k m_c (eq. 10 and eq. 5 alike). Every round is a line
  through the unknown client mean m_c; two non-parallel rounds intersect exactly at m_c, and each line's
  position gives t_k. Measured: t_k and m_c to ~1e-15 (network-simplex plans) from K ≥ 2 rounds.
- *coincidences* (:func:`estimate_time_from_coincidences`, one round): two atoms sent to the same sample
  y_j (a split column in eq. 5; S > n in eq. 10) satisfy z − z' = (1 − t)(x − x').
- *monitor distances* (:func:`estimate_times_from_monitor`): with per-round W(μ_c, ξ_c^k) reported,
  t_k = W(ξ^{k−1}, ξ_c^k) / (W(ξ^{k−1}, ξ_c^k) + W(ξ_c^k, μ_c)), exact on a geodesic — the reason FedWaD §3
  recommends sending distances only at the last iteration.
- *final distance* (:func:`estimate_time_from_distance`, last round): the t at which the reconstruction's
  distance to ξ^K equals the reported d_{c,ξ^K} (exact for eq. 5, where the reconstruction is μ_c itself).
:func:`estimate_times` tries them in that order of precision.

**FedBary** (:func:`attack_fedbary`, approximate interpolation): γ_j^{(k)} = (1 − t') η_{P,j} + t' B_j with
η_{P,j} = (1 − t) γ_j^{(k−1)} + t T_P(γ_j^{(k−1)}) and B_j the barycentric projection of η_{P,j} onto η_Q, which
the server sent. A fixed point on the pairing recovers η_P and then T_P. Random (t, t'): the means give
mean(γ^{(k)}) − η̄_Q = (1 − t')(γ̄ − η̄_Q) + (1 − t') t (m_P − γ̄), so every round is a plane through the client's
mean and the server's; while the barycenter Q moves, K ≥ 3 such planes meet in m_P, which gives each round's
(t, t') (:func:`estimate_fedbary_times`). With a fixed validation Q all planes coincide and the times stay unknown.
This refutes FedBary §4.4's "Privacy Guarantee" ("raw training samples cannot be reconstructed", as the
time t and the plans are only known to the client).

**Labels (OTDD, FedBary).** A reconstructed augmented vector's label part [m_y; Σ_y^{1/2}] is exact whenever
its transport cell is class-pure — usually, as the augmented cost separates classes. Parts that recur are
the client's class statistics (means and covariances); points carrying them are labelled up to the names
of the classes (:func:`decode_label_augmented`).

**Evaluation** (:func:`reconstruction_scores`, needs the truth, never used by the attacker): NN distance
from reconstructed points to the client's samples relative to the median NN distance within the samples,
the fraction of samples recovered within ``threshold`` × that scale, and a membership-inference AUC (score:
minus the distance to the nearest reconstructed point; negatives: held-out records of the same
distribution). :func:`attack_protocol` runs a protocol on given client data (with DP FedWaD clients if asked),
attacks it and scores it; :func:`attack_experiment` does so on synthetic data.

**Against DP clients** (:mod:`otfed.privacy.dp`): :func:`round_targets` / :func:`round_average` average each atom's
inverted target over the K rounds (eq. 10 keeps the atoms' order; the noise is fresh each round, so its variance
falls as 1/K where the plan keeps the atom's cell); :func:`round_likelihood_scores` scores membership by a
likelihood ratio over the rounds; :func:`canary_audit` inserts records at the clip radius, where the guarantee is
tightest; :func:`membership_splits` scores membership over many member / non-member splits, each a new session,
with an interval (:func:`membership_auc_interval`) — one split's AUC swings with the draw. :func:`dp_attack` runs one
DP session and all of them.

Every attack function takes a :class:`ServerView` — messages only, never a client object or array.

>>> import numpy as np
>>> from otfed.federation import Channel, FedWaDConfig, federated_wasserstein
>>> rng = np.random.default_rng(0)
>>> x, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 3)) + 2.0
>>> channel = Channel(keep_inbox=True)
>>> config = FedWaDConfig(support_size=20, iterations=3)       # t drawn at random by every party
>>> _ = federated_wasserstein(x, y, config, seed=1, channel=channel)
>>> rec = attack_fedwad(server_view(channel), "client_mu", config)
>>> rec.times.methods
('means', 'means', 'means')
>>> bool(np.abs(rec.client_mean - x.mean(0)).max() < 1e-8)
True
>>> reconstruction_scores(rec.points, x, y).recovered_fraction
1.0
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, Sequence

import numpy as np
from pydantic import Field, model_validator
from scipy.optimize import brentq
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree
from scipy.special import logsumexp
from scipy.stats import t as student_t
from sklearn.metrics import adjusted_rand_score, roc_auc_score

from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from otfed.federation.ledger import Channel
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage, Message
from otfed.federation.otdd import federated_otdd
from otfed.ot import Measure, interpolate_approx, optimal_transport
from otfed.ot.otdd import LabelledData, augmented_measure, class_statistics
from otfed.privacy.dp import DPConfig, dp_federated_wasserstein, interpolant_sensitivity
from otfed.privacy.dp_fedbary import dp_federated_valuation
from otfed.schema import InterpolationTime, Strict

Interpolation = Literal["approx", "exact"]
Protocol = Literal["fedwad", "otdd", "fedbary"]

#: t used where nothing in the transcript identifies it: the mean of U(0, 1).
PRIOR_TIME = 0.5


# ----------------------------------------------------------------------------------------------------
# what the server saw


@dataclass(frozen=True)
class ServerView:
    """Every message the server received and every message it sent, each list in the order of sending."""

    received: tuple[Message, ...]
    sent: tuple[Message, ...]
    server: str = SERVER

    def received_from(self, client: str, kind: str) -> list[Message]:
        """The messages of ``kind`` that ``client`` sent to the server, in order."""
        return [m for m in self.received if m.sender == client and m.kind == kind]

    def sent_to(self, client: str, kind: str) -> list[Message]:
        """The messages of ``kind`` the server sent to ``client``, in order."""
        return [m for m in self.sent if m.receiver == client and m.kind == kind]


def server_view(channel: Channel, server: str = SERVER) -> ServerView:
    """The server's transcript of a session run over ``channel`` (built with ``keep_inbox=True``): what
    arrived in its inbox and what it put in the clients' inboxes."""
    if not channel.keep_inbox:
        raise ValueError("the channel kept no messages: run the protocol over Channel(keep_inbox=True)")
    sent = [m for party, messages in channel.inbox.items() if party != server
            for m in messages if m.sender == server]
    return ServerView(tuple(channel.received_by(server)), tuple(sent), server)


@dataclass(frozen=True)
class InterpolationRound:
    """One client step of FedWaD Algorithm 1 (lines 4–5) as the server saw it: the ξ^{k−1} it sent and
    the interpolant ξ_c^k = InterpMeas(ξ^{k−1} → μ_c) it received."""

    source: Measure
    interpolant: Measure


def fedwad_rounds(view: ServerView, client: str) -> list[InterpolationRound]:
    """FedWaD Algorithm 1's rounds for ``client``: the k-th ξ sent paired with the k-th interpolant received."""
    sent = view.sent_to(client, "xi")
    got = view.received_from(client, "interpolant")
    if not got:
        raise ValueError(f"the server received no interpolant from client {client!r}")
    if len(sent) < len(got):
        raise ValueError(f"client {client!r}: {len(got)} interpolants but only {len(sent)} ξ sent")
    return [InterpolationRound(s.measure, g.measure) for s, g in zip(sent, got)  # type: ignore[attr-defined]
            if isinstance(s, MeasureMessage) and isinstance(g, MeasureMessage)]


def _distances(view: ServerView, client: str, kind: str) -> list[float]:
    return [m.value for m in view.received_from(client, kind) if isinstance(m, DistanceMessage)]


# ----------------------------------------------------------------------------------------------------
# inversion


def _mean(measure: Measure) -> np.ndarray:
    return measure.weights @ measure.support


def interpolant_sources(source: Measure, interpolant: Measure, interpolation: Interpolation, p: int = 2
                        ) -> np.ndarray:
    """The atom of ``source`` (ξ^{k−1}) each atom of ``interpolant`` moved from, one row per interpolant atom.

    FedWaD eq. 10 keeps the source's atoms in order (row i ← ξ_i). Eq. 5's atoms (1 − t) x_i + t y_j are matched
    by the optimal plan from ``source`` to ``interpolant`` — for t < 1 the unique one, x_i ↔ its own atoms — which
    the server computes itself (the column's largest entry names the source).
    """
    if source.dim != interpolant.dim:
        raise ValueError(f"source and interpolant live in different dimensions: {source.dim} vs {interpolant.dim}")
    if interpolation == "approx":
        if source.n != interpolant.n:
            raise ValueError(f"approximate interpolation (eq. 10) keeps the support: {source.n} source atoms but "
                             f"{interpolant.n} interpolant atoms (was it exact interpolation?)")
        return source.support
    plan = optimal_transport(source, interpolant, p=p).plan
    return source.support[np.argmax(plan, axis=0)]


def invert_interpolation(sources: np.ndarray, interpolant: np.ndarray, t: float) -> np.ndarray:
    """The targets y with z = (1 − t) x + t y, i.e. (z − (1 − t) x) / t, row by row — FedWaD eq. 10 (y = T(ξ_i),
    the barycentric projection) or eq. 5 (y = y_j, a client sample) solved for the client's side."""
    if not 0.0 < t <= 1.0:
        raise ValueError(f"interpolation time t must lie in (0, 1] to be inverted, got {t!r}")
    sources = np.asarray(sources, dtype=np.float64)
    interpolant = np.asarray(interpolant, dtype=np.float64)
    if sources.shape != interpolant.shape:
        raise ValueError(f"sources of shape {sources.shape} and interpolant of shape {interpolant.shape} differ")
    return (interpolant - (1.0 - t) * sources) / t


# ----------------------------------------------------------------------------------------------------
# the interpolation time


@dataclass(frozen=True)
class TimeEstimate:
    """Per-round interpolation times as the attacker estimates them.

    ``methods[k]``: how round k's time was found (``known``, ``means``, ``monitor``, ``coincidence``,
    ``distance``, ``prior``); ``client_mean``: the client's mean m_c, recovered by the ``means`` method (else
    None); ``residual``: how far the rounds miss a common client mean, relative to their spread (≈ 1e-15
    for exact plans; large means the identity did not hold). FedBary adds ``update_times`` (t' of eq. 7).
    """

    times: np.ndarray
    methods: tuple[str, ...]
    client_mean: np.ndarray | None = None
    residual: float = float("nan")
    update_times: np.ndarray | None = None


def _flat_system(points: np.ndarray, bases: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_k Q_k, Σ_k Q_k c_k), Q_k the projector orthogonal to flat k = c_k + span(bases[k]): the normal
    equations of argmin_m Σ_k ||Q_k (m − c_k)||², the point nearest to all flats."""
    d = points.shape[1]
    total, rhs = np.zeros((d, d)), np.zeros(d)
    for c, basis in zip(points, bases):
        q, _ = np.linalg.qr(basis)
        proj = np.eye(d) - q @ q.T
        total += proj
        rhs += proj @ c
    return total, rhs


def _nearest_point_to_flats(points: np.ndarray, bases: Sequence[np.ndarray]) -> tuple[np.ndarray, float]:
    """The point nearest to all flats c_k + span(bases[k]), and the smallest eigenvalue of Σ_k Q_k divided by
    the number of flats (≈ 0: the flats do not pin a point; the point is then NaN)."""
    total, rhs = _flat_system(points, bases)
    eig = float(np.linalg.eigvalsh(total)[0]) / max(len(points), 1)
    if eig < 1e-10:
        return np.full(points.shape[1], np.nan), eig
    return np.linalg.solve(total, rhs), eig


def estimate_times_from_means(sources: Sequence[Measure], interpolants: Sequence[Measure],
                              min_conditioning: float = 1e-10) -> TimeEstimate | None:
    """Every round's t and the client's mean from the means of the messages (FedWaD eqs. 5 and 10).

    mean(ξ_c^k) = (1 − t_k) mean(ξ^{k−1}) + t_k m_c for any feasible plan (the barycentric projections
    average to the client's mean), so round k is the line c_k + a·v_k, v_k = mean(ξ_c^k) − c_k, through m_c at
    a = 1/t_k. The point nearest to all lines is m_c (exact when two lines are not parallel); then
    t_k = ||v_k||² / (v_k · (m_c − c_k)). Returns None with fewer than two usable rounds or parallel lines;
    a round whose implied t falls outside (0, 1] (or whose v_k vanishes) gets NaN.
    """
    if len(sources) != len(interpolants):
        raise ValueError(f"{len(sources)} sources but {len(interpolants)} interpolants")
    c = np.array([_mean(s) for s in sources])
    v = np.array([_mean(z) for z in interpolants]) - c
    if c.ndim != 2 or c.shape[0] < 2:
        return None
    spread = float(np.abs(np.vstack([c, c + v])).max()) or 1.0
    usable = np.linalg.norm(v, axis=1) > 1e-12 * spread
    if usable.sum() < 2:
        return None
    m, conditioning = _nearest_point_to_flats(c[usable], [vk[:, None] for vk in v[usable]])
    if not conditioning > min_conditioning:
        return None
    times = np.full(len(c), np.nan)
    residual = 0.0
    for k in np.flatnonzero(usable):
        along = float(v[k] @ (m - c[k]))
        if along > 0:
            a = along / float(v[k] @ v[k])
            times[k] = 1.0 / a if a >= 1.0 - 1e-9 else np.nan
            residual = max(residual, float(np.linalg.norm(m - c[k] - a * v[k])) / spread)
    times = np.where(times > 1.0, 1.0, times)
    methods = tuple("means" if np.isfinite(tk) else "none" for tk in times)
    return TimeEstimate(times, methods, client_mean=m, residual=residual)


def estimate_time_from_coincidences(sources: np.ndarray, interpolant: np.ndarray, rtol: float = 1e-7,
                                    max_atoms: int = 4000) -> float | None:
    """t from one round's atoms that went to the same client point: z − z' = (1 − t)(x − x').

    Two interpolant atoms carried to one target (a split column of eq. 5's plan; S > n in eq. 10) differ by
    (1 − t) times the difference of their sources; other pairs generically do not (d ≥ 2). Returns 1 − the
    median of (1 − t) over such pairs, or None when there are none (or d = 1, where every pair qualifies).
    """
    x = np.asarray(sources, dtype=np.float64)
    z = np.asarray(interpolant, dtype=np.float64)
    if x.ndim != 2 or x.shape != z.shape or x.shape[1] < 2 or x.shape[0] < 2 or x.shape[0] > max_atoms:
        return None
    scale = float(np.abs(np.vstack([x, z])).max()) or 1.0
    found: list[np.ndarray] = []
    for i in range(x.shape[0] - 1):
        dx, dz = x[i + 1:] - x[i], z[i + 1:] - z[i]
        nx = (dx * dx).sum(axis=1)
        ok = nx > (1e-9 * scale) ** 2
        u = np.where(ok, (dz * dx).sum(axis=1) / np.where(ok, nx, 1.0), np.nan)
        resid = np.linalg.norm(dz - u[:, None] * dx, axis=1)
        keep = ok & (resid <= rtol * scale) & (u > 0.0) & (u < 1.0)
        if keep.any():
            found.append(u[keep])
    if not found:
        return None
    return float(1.0 - np.median(np.concatenate(found)))


def estimate_times_from_monitor(sources: Sequence[Measure], interpolants: Sequence[Measure],
                                monitor: Sequence[float], p: int = 2) -> np.ndarray:
    """t_k = W(ξ^{k−1}, ξ_c^k) / (W(ξ^{k−1}, ξ_c^k) + W(ξ_c^k, μ_c)) from per-round monitoring distances
    W(μ_c, ξ_c^k) (FedWaD Algorithm 1, lines 4–5, "optional return of the distances"): exact on a
    geodesic (eq. 5; eq. 10 with S = n). For eq. 10 with S < n, W(ξ_c^k, μ_c) also holds the quantisation of μ_c
    by S atoms and t comes out too small (measured: off by 0.53 with S = 10, n = 100)."""
    if not (len(sources) == len(interpolants) == len(monitor)):
        raise ValueError(f"{len(sources)} sources, {len(interpolants)} interpolants, {len(monitor)} distances")
    out = np.empty(len(sources))
    for k, (s, z, d) in enumerate(zip(sources, interpolants, monitor)):
        w = optimal_transport(s, z, p=p).cost
        out[k] = w / (w + d) if w + d > 0 else np.nan
    return out


def estimate_time_from_distance(last: InterpolationRound, final_xi: Measure, distance: float,
                                interpolation: Interpolation, p: int = 2, grid: int = 64) -> float:
    """The last round's t from the final distance d_{c,ξ^K} = W_p(μ_c, ξ^K) (FedWaD Algorithm 1, line 9): a t in
    (0, 1] where the reconstruction R_t (:func:`invert_interpolation`) has W_p(R_t, ξ^K) = d.

    For eq. 5, and for eq. 10 with a permutation plan (S = n), R_t is μ_c at the true t, so the true t is a root.
    The gap can have several roots (measured: d = 2, 2 of 10 runs); the largest is returned. For eq. 10 with
    S < n, R_t holds cell means, W(R_t, ξ^K) misses the within-cell spread and the root lies below the true t
    (measured: 0.2–0.45 below). Without a sign change, the t of the smallest gap.
    """
    src = interpolant_sources(last.source, last.interpolant, interpolation, p)
    weights = last.interpolant.weights

    def gap(t: float) -> float:
        rec = Measure(invert_interpolation(src, last.interpolant.support, t), weights)
        return optimal_transport(rec, final_xi, p=p).cost - distance

    ts = np.geomspace(1e-3, 1.0, grid)
    gaps = np.array([gap(t) for t in ts])
    changes = np.flatnonzero(np.sign(gaps[:-1]) * np.sign(gaps[1:]) <= 0)
    if changes.size == 0:
        return float(ts[int(np.argmin(np.abs(gaps)))])
    k = int(changes[-1])
    if gaps[k] == 0.0:
        return float(ts[k])
    if gaps[k + 1] == 0.0:
        return float(ts[k + 1])
    return float(brentq(gap, ts[k], ts[k + 1], xtol=1e-13, rtol=1e-12))


def estimate_times(rounds: Sequence[InterpolationRound], interpolation: Interpolation, p: int = 2,
                   known_t: float | None = None, monitor: Sequence[float] | None = None,
                   final: tuple[Measure, float] | None = None) -> TimeEstimate:
    """Every round's t by the most precise method the transcript allows: ``known`` (a fixed t is public
    protocol configuration), ``means`` (:func:`estimate_times_from_means`, K ≥ 2), ``monitor`` (per-round
    distances), ``coincidence`` (one round), ``distance`` (the last round, from ``final`` = (ξ^K, d_{c,ξ^K})),
    else ``prior`` (t = 1/2, the mean of U(0, 1))."""
    n = len(rounds)
    if known_t is not None:
        return TimeEstimate(np.full(n, float(known_t)), ("known",) * n)
    times = np.full(n, np.nan)
    methods = ["none"] * n
    client_mean, residual = None, float("nan")
    means = estimate_times_from_means([r.source for r in rounds], [r.interpolant for r in rounds])
    if means is not None:
        times, methods = means.times.copy(), list(means.methods)
        client_mean, residual = means.client_mean, means.residual
    if monitor is not None and len(monitor) == n:
        todo = [k for k in range(n) if not np.isfinite(times[k])]
        if todo:
            est = estimate_times_from_monitor([rounds[k].source for k in todo],
                                              [rounds[k].interpolant for k in todo], [monitor[k] for k in todo], p)
            for k, tk in zip(todo, est):
                if np.isfinite(tk) and tk > 0:
                    times[k], methods[k] = tk, "monitor"
    for k in range(n):
        if not np.isfinite(times[k]):
            r = rounds[k]
            tk = estimate_time_from_coincidences(interpolant_sources(r.source, r.interpolant, interpolation, p),
                                                 r.interpolant.support)
            if tk is not None:
                times[k], methods[k] = tk, "coincidence"
    if final is not None and n and not np.isfinite(times[-1]):
        times[-1] = estimate_time_from_distance(rounds[-1], final[0], final[1], interpolation, p)
        methods[-1] = "distance"
    for k in range(n):
        if not np.isfinite(times[k]):
            times[k], methods[k] = PRIOR_TIME, "prior"
    return TimeEstimate(times, tuple(methods), client_mean=client_mean, residual=residual)


# ----------------------------------------------------------------------------------------------------
# FedWaD and federated OTDD


@dataclass(frozen=True)
class Reconstruction:
    """What the attacker rebuilt of one client: ``points`` (one row per inverted atom, all rounds pooled),
    the mass each carried in its message (``weights``), its round (1-based), and the time estimate used."""

    client: str
    points: np.ndarray
    weights: np.ndarray
    rounds: np.ndarray
    times: TimeEstimate

    @property
    def client_mean(self) -> np.ndarray | None:
        """The client's mean, when the ``means`` estimator recovered it (exact for network-simplex plans)."""
        return self.times.client_mean

    def of_round(self, k: int) -> np.ndarray:
        """The points inverted from round k (1-based)."""
        return self.points[self.rounds == k]


def reconstruct_rounds(rounds: Sequence[InterpolationRound], times: TimeEstimate, interpolation: Interpolation,
                       p: int = 2, client: str = "") -> Reconstruction:
    """Invert every round at its estimated time (:func:`interpolant_sources`, :func:`invert_interpolation`)."""
    points, weights, index = [], [], []
    for k, (r, t) in enumerate(zip(rounds, times.times), start=1):
        src = interpolant_sources(r.source, r.interpolant, interpolation, p)
        points.append(invert_interpolation(src, r.interpolant.support, float(t)))
        weights.append(r.interpolant.weights)
        index.append(np.full(r.interpolant.n, k))
    return Reconstruction(client, np.vstack(points), np.concatenate(weights), np.concatenate(index), times)


def attack_fedwad(view: ServerView, client: str, config: FedWaDConfig, use_known_t: bool = True,
                  use_distances: bool = True) -> Reconstruction:
    """Reconstruct ``client``'s samples (FedWaD eq. 10: its transport-cell means; eq. 5: the samples) from a
    FedWaD (or federated OTDD) transcript. ``config`` is the protocol's public configuration: interpolation
    mode, p, and t when fixed (``use_known_t=False`` makes the attacker estimate a fixed t too).
    ``use_distances`` lets the estimator read the per-round monitoring distances and the final distance.

    Parameters:
        view: the server's transcript (:func:`server_view` of a ``Channel(keep_inbox=True)``) — messages only.
        client: the attacked client's name.
        config: the protocol's public :class:`~otfed.federation.fedwad.FedWaDConfig`.
        use_known_t: use a fixed t from ``config`` (else estimate it like a random one).
        use_distances: let the time estimators read the reported distances.

    Returns:
        A :class:`Reconstruction`: the inverted ``points`` of every round (one row per atom of ξ), their
        ``weights`` and ``rounds``, and the time estimate (``times``; ``client_mean`` when the means gave it).

    Raises ValueError when the transcript holds no interpolant from ``client``.

    With S = n the optimal plan is a permutation (FedWaD theorem 1), so inverting eq. 10 at the public t gives
    the client's samples themselves — every one of them, to rounding, in every round. With t drawn at random
    the means of the messages give every t and the client's mean (eq. 10's barycentric projections average
    to it):

    >>> rng = np.random.default_rng(0)
    >>> x, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 3)) + 2.0
    >>> channel = Channel(keep_inbox=True)
    >>> config = FedWaDConfig(support_size=20, iterations=3, t=0.3)
    >>> _ = federated_wasserstein(x, y, config, seed=1, channel=channel)
    >>> rec = attack_fedwad(server_view(channel), "client_mu", config)
    >>> rec.times.methods, rec.points.shape
    (('known', 'known', 'known'), (60, 3))
    >>> distance, _ = cKDTree(rec.of_round(1)).query(x)  # each sample to its nearest reconstructed point
    >>> bool(distance.max() < 1e-12)
    True
    >>> channel = Channel(keep_inbox=True)
    >>> config = FedWaDConfig(support_size=20, iterations=3)  # t ~ U(0, 1), private to each client
    >>> _ = federated_wasserstein(x, y, config, seed=1, channel=channel)
    >>> rec = attack_fedwad(server_view(channel), "client_mu", config)
    >>> rec.times.methods, bool(np.abs(rec.client_mean - x.mean(axis=0)).max() < 1e-12)
    (('means', 'means', 'means'), True)
    >>> distance, _ = cKDTree(rec.of_round(3)).query(x)
    >>> bool(distance.max() < 1e-12)
    True
    """
    rounds = fedwad_rounds(view, client)
    known = config.fixed_t if use_known_t else None
    monitor = _distances(view, client, "monitor_distance") if use_distances else []
    final = None
    finals = _distances(view, client, "distance") if use_distances else []
    sent = view.sent_to(client, "xi")
    if finals and len(sent) > len(rounds) and isinstance(sent[len(rounds)], MeasureMessage):
        final = (sent[len(rounds)].measure, finals[-1])  # type: ignore[attr-defined]
    times = estimate_times(rounds, config.interpolation, config.p, known, monitor or None, final)
    return reconstruct_rounds(rounds, times, config.interpolation, config.p, client)


def feature_dim(augmented_dim: int, diagonal: bool) -> int:
    """d from the dimension of label-augmented vectors [x; m_y; s_y] (3d, diagonal) or [x; m_y; vec Σ^{1/2}]
    (2d + d²) — public, as the server knows the augmentation mode."""
    d = augmented_dim // 3 if diagonal else int(round(np.sqrt(1 + augmented_dim))) - 1
    if (3 * d if diagonal else 2 * d + d * d) != augmented_dim or d < 1:
        raise ValueError(f"{augmented_dim} is not the dimension of {'diagonal' if diagonal else 'full'} "
                         f"label-augmented vectors")
    return d


@dataclass(frozen=True)
class LabelledReconstruction:
    """Augmented points split into features and labels (OTDD embedding, FedWaD §4 / app. D.3).

    ``labels[i]``: the recovered class of point i (indices into ``class_means``; classes are known up to their
    names), −1 where its label part is no class's statistics (a class-mixed transport cell);
    ``class_sqrt_covs``: per class (d,) standard deviations (diagonal) or (d, d) covariance square roots.
    """

    features: np.ndarray
    labels: np.ndarray
    class_means: np.ndarray
    class_sqrt_covs: np.ndarray
    diagonal: bool

    @property
    def class_covariances(self) -> np.ndarray:
        """Σ_y per recovered class: diag(s²) (diagonal) or S S (full)."""
        s = self.class_sqrt_covs
        return np.stack([np.diag(r * r) for r in s]) if self.diagonal else np.matmul(s, s)


def _groups(points: np.ndarray, tol: float) -> tuple[np.ndarray, int]:
    tree = cKDTree(points)
    pairs = tree.query_pairs(tol, output_type="ndarray")
    n = points.shape[0]
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])) if len(pairs) else
                       (np.zeros(0), (np.zeros(0, int), np.zeros(0, int))), shape=(n, n))
    count, labels = connected_components(graph, directed=False)
    return labels, count


def _on_a_segment(point: np.ndarray, others: np.ndarray, tol: float) -> bool:
    """Whether ``point`` lies strictly inside a segment between two rows of ``others`` (within ``tol``)."""
    if others.shape[0] < 2:
        return False
    for i in range(others.shape[0] - 1):
        ab = others[i] - others[i + 1:]
        rel = point - others[i + 1:]
        lam = (rel * ab).sum(axis=1) / np.maximum((ab * ab).sum(axis=1), 1e-300)
        off = np.linalg.norm(rel - lam[:, None] * ab, axis=1)
        if np.any((lam > 0.0) & (lam < 1.0) & (off <= tol)):
            return True
    return False


def decode_label_augmented(points: np.ndarray, diagonal: bool = True, rtol: float = 1e-6,
                           min_count: int = 2) -> LabelledReconstruction:
    """Features, labels and class statistics from reconstructed label-augmented vectors (OTDD embedding).

    Label parts [m; s] (the class embedding of the OTDD cost, FedBary eq. 8) that coincide (within ``rtol`` of
    their spread) in ≥ ``min_count`` points are class statistics — a class-pure cell's part is exactly its
    class's — unless the part lies on a segment between two others (a two-class cell, a convex combination; a
    cell mixing three classes that recurs is not caught). Points with a class's part get its index; others −1.
    """
    points = np.asarray(points, dtype=np.float64)
    d = feature_dim(points.shape[1], diagonal)
    features, parts = points[:, :d], points[:, d:]
    spread = float(np.ptp(parts, axis=0).max()) if parts.shape[0] > 1 else 0.0
    tol = rtol * (spread or 1.0)
    groups, count = _groups(parts, tol)
    sizes = np.bincount(groups, minlength=count)
    reps = np.array([parts[groups == g].mean(axis=0) for g in range(count)])
    candidates = [g for g in range(count) if sizes[g] >= min_count]
    keep = [g for g in candidates if not _on_a_segment(reps[g], reps[[h for h in candidates if h != g]], 10 * tol)]
    index = {g: i for i, g in enumerate(keep)}
    labels = np.array([index.get(g, -1) for g in groups], dtype=np.int64)
    stats = reps[keep] if keep else np.zeros((0, parts.shape[1]))
    means = stats[:, :d]
    roots = stats[:, d:] if diagonal else stats[:, d:].reshape(-1, d, d)
    return LabelledReconstruction(features, labels, means, roots, diagonal)


def attack_otdd(view: ServerView, client: str, config: FedWaDConfig, diagonal: bool = True,
                use_known_t: bool = True) -> tuple[Reconstruction, LabelledReconstruction]:
    """Federated OTDD (FedWaD on label-augmented samples): :func:`attack_fedwad` in the augmented space, then
    :func:`decode_label_augmented` into features, labels and the client's class means / covariances.

    Parameters:
        view: the server's transcript of a federated OTDD session (:func:`server_view`).
        client: the attacked client's name.
        config: the protocol's public :class:`~otfed.federation.fedwad.FedWaDConfig`.
        diagonal: the augmentation's mode (public: it sets the messages' dimension).
        use_known_t: use a fixed t from ``config``.

    Returns:
        ``(reconstruction, decoded)``: the :class:`Reconstruction` in the augmented space and the
        :class:`LabelledReconstruction` — ``features``, ``labels`` (class indices, −1 where undecided) and the
        recovered ``class_means`` and ``class_sqrt_covs``.

    Two classes of 10 samples each: the features come back exactly, and so do the client's class means
    (NumPy's, per class — named up to the classes' order):

    >>> def client(name, seed):
    ...     labels = np.arange(20) % 2
    ...     return LabelledData(name, np.random.default_rng(seed).normal(size=(20, 2)) + 4.0 * labels[:, None], labels)
    >>> a, b = client("a", 1), client("b", 2)
    >>> channel = Channel(keep_inbox=True)
    >>> config = FedWaDConfig(support_size=20, iterations=3, t=0.5)
    >>> _ = federated_otdd(a, b, config, seed=1, channel=channel)
    >>> rec, decoded = attack_otdd(server_view(channel), "a", config)
    >>> distance, _ = cKDTree(decoded.features).query(a.x)
    >>> bool(distance.max() < 1e-12), sorted(set(decoded.labels.tolist()))
    (True, [0, 1])
    >>> means = decoded.class_means[np.argsort(decoded.class_means[:, 0])]
    >>> bool(np.allclose(means, [a.x[a.y == 0].mean(axis=0), a.x[a.y == 1].mean(axis=0)]))
    True
    """
    rec = attack_fedwad(view, client, config, use_known_t)
    return rec, decode_label_augmented(rec.points, diagonal)


# ----------------------------------------------------------------------------------------------------
# FedBary


@dataclass(frozen=True)
class BaryRound:
    """One FedBary iteration for one client as the server saw it (Algorithm 1, lines 4–7): γ^{(k−1)} received,
    η_Q^{(k)} sent, and γ^{(k)} = InterpMeas(η_P^{(k)} → η_Q^{(k)}) received the round after."""

    gamma: Measure
    eta_q: Measure
    next_gamma: Measure


def fedbary_rounds(view: ServerView, client: str) -> list[BaryRound]:
    """FedBary's rounds for ``client``: consecutive γ's received around each η_Q sent."""
    gammas = [m.measure for m in view.received_from(client, "gamma")]  # type: ignore[attr-defined]
    etas = [m.measure for m in view.sent_to(client, "eta_Q")]  # type: ignore[attr-defined]
    if len(gammas) < 2 or not etas:
        raise ValueError(f"client {client!r}: a FedBary transcript needs two γ and one η_Q at least "
                         f"(got {len(gammas)} and {len(etas)})")
    k = min(len(etas), len(gammas) - 1)
    return [BaryRound(gammas[i], etas[i], gammas[i + 1]) for i in range(k)]


def _fedbary_means(rounds: Sequence[BaryRound]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (np.array([_mean(r.gamma) for r in rounds]), np.array([_mean(r.eta_q) for r in rounds]),
            np.array([_mean(r.next_gamma) for r in rounds]))


def _fedbary_times_given_mean(rounds: Sequence[BaryRound], m: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Per round (t, t') from γ̄' − η̄ = α (γ̄ − η̄) + β (m − γ̄), α = 1 − t', β = (1 − t') t (NaN where outside
    (0, 1)), and the largest residual relative to the means' spread."""
    g, e, g2 = _fedbary_means(rounds)
    spread = float(np.abs(np.vstack([g, e, g2])).max()) or 1.0
    t, t2 = np.full(len(g), np.nan), np.full(len(g), np.nan)
    residual = 0.0
    for k in range(len(g)):
        a = np.stack([g[k] - e[k], m - g[k]], axis=1)
        (alpha, beta), *_ = np.linalg.lstsq(a, g2[k] - e[k], rcond=None)
        residual = max(residual, float(np.linalg.norm(a @ [alpha, beta] - (g2[k] - e[k]))) / spread)
        if 0.0 < alpha < 1.0 and 0.0 < beta <= alpha * (1.0 + 1e-9):
            t[k], t2[k] = min(beta / alpha, 1.0), 1.0 - alpha
    return t, t2, residual


def _fedbary_eta_p(r: BaryRound, t_update: float, p: int = 2, max_iter: int = 50) -> np.ndarray:
    """η_P^{(k)} from γ^{(k)} = InterpMeas(η_P → η_Q) at t' (eq. 7 via FedWaD eq. 10): γ_j = (1 − t') η_{P,j} + t' B_j,
    B_j the barycentric projection of η_{P,j} onto η_Q — a fixed point on the pairing, from B = η_Q."""
    weights = r.next_gamma.weights
    target = r.eta_q.support
    eta_p = (r.next_gamma.support - t_update * target) / (1.0 - t_update)
    for _ in range(max_iter):
        eta_p_measure = Measure(eta_p, weights)
        plan = optimal_transport(eta_p_measure, r.eta_q, p=p).plan
        projected = interpolate_approx(eta_p_measure, r.eta_q, plan, 1.0).support
        new = (r.next_gamma.support - t_update * projected) / (1.0 - t_update)
        done = np.allclose(new, eta_p, rtol=0.0, atol=1e-12 * (np.abs(new).max() or 1.0))
        eta_p = new
        if done:
            break
    return eta_p


def estimate_fedbary_times(rounds: Sequence[BaryRound], min_conditioning: float = 1e-10) -> TimeEstimate | None:
    """The client's two times per round, (t, t'), and its mean, from the means (FedBary Algorithm 1, eqs. 4–7).

    With γ̄, η̄ (η_Q) and γ̄' the means, γ̄' − η̄ = (1 − t')(γ̄ − η̄) + (1 − t') t (m_P − γ̄): m_P lies on the plane
    γ̄ + span(γ̄ − η̄, γ̄' − η̄) of every round. That plane holds the server's Q̄ too (η̄ is on the segment γ̄–Q̄) and
    the next γ̄', which starts the next round, so consecutive planes share the line through γ̄^{(k)} and m_P.
    While Q moves (the federated barycenter, no validation set) three rounds or more meet in m_P alone: exact
    (measured: t, t' to ~1e-11 with K = 5; K = 2 leaves a line: None). With a fixed Q (a validation set) every
    plane holds the line through Q̄ and m_P — in the protocol, where γ̄' starts the next round, all planes are
    one plane — so m_P and the times are not identified: None. (A search over that plane for the point whose
    reconstruction best reproduces the reported d_i^client was tried and missed the times by 0.05–0.5 even
    with S = n.)
    """
    g, e, g2 = _fedbary_means(rounds)
    if g.shape[0] < 2 or g.shape[1] < 3:
        return None
    m, conditioning = _nearest_point_to_flats(g, [np.stack([gk - ek, g2k - ek], axis=1)
                                                  for gk, ek, g2k in zip(g, e, g2)])
    if not conditioning > min_conditioning:
        return None
    t, t2, residual = _fedbary_times_given_mean(rounds, m)
    return TimeEstimate(t, tuple("means" if np.isfinite(x) else "none" for x in t), m, residual, t2)


def invert_fedbary_round(r: BaryRound, t: float, t_update: float, p: int = 2, max_iter: int = 50) -> np.ndarray:
    """T_P(γ_j), the barycentric projections of γ^{(k−1)}'s atoms onto the client's measure, from one round.

    γ_j^{(k)} = (1 − t') η_{P,j} + t' B_j (FedBary eq. 7 via FedWaD eq. 10), B_j η_{P,j}'s projection onto η_Q:
    start from B = η_Q (atoms paired as they are built, both on γ's atoms), solve η_P, recompute B from the
    plan η_P → η_Q, repeat until the pairing is stable; then T_P = (η_P − (1 − t) γ) / t (eq. 5).
    """
    if not (0.0 < t <= 1.0 and 0.0 <= t_update < 1.0):
        raise ValueError(f"need t in (0, 1] and t' in [0, 1), got {t!r} and {t_update!r}")
    if not (r.gamma.n == r.eta_q.n == r.next_gamma.n):
        raise ValueError("FedBary inversion needs approximate interpolation: γ, η_Q and the next γ must have the "
                         f"same support size (got {r.gamma.n}, {r.eta_q.n}, {r.next_gamma.n})")
    return invert_interpolation(r.gamma.support, _fedbary_eta_p(r, t_update, p, max_iter), t)


def attack_fedbary(view: ServerView, client: str, config: FedBaryConfig, use_known_t: bool = True
                   ) -> Reconstruction:
    """Reconstruct ``client``'s (label-augmented) samples from a FedBary transcript: per round the barycentric
    projections of γ^{(k−1)} onto P_i (:func:`invert_fedbary_round`) at times known (fixed t) or estimated
    (:func:`estimate_fedbary_times`; prior 1/2 where they cannot be: a validation set with random t — measured
    with S = n = 100, 4 runs: 15–100 % of the samples still recovered, membership AUC 0.87, no class statistics).
    Approximate interpolation only.

    Parameters:
        view: the server's transcript of a FedBary session (:func:`server_view`).
        client: the attacked client's name.
        config: the protocol's public :class:`~otfed.federation.fedbary.FedBaryConfig` (``interpolation="approx"``).
        use_known_t: use a fixed t from ``config``.

    Returns:
        A :class:`Reconstruction` of the client's label-augmented samples (one row per atom of γ, every round).

    Raises ValueError for exact interpolation or a transcript without two γ and one η_Q from ``client``.

    Three clients with S = n = 12 label-augmented samples each (FedBary eq. 8's embedding): with the public t
    every augmented sample of the client comes back, and so with t drawn at random, where the means give the
    times while the barycenter moves (:func:`estimate_fedbary_times`):

    >>> def client(name, seed):
    ...     labels = np.arange(12) % 2
    ...     return LabelledData(name, np.random.default_rng(seed).normal(size=(12, 2)) + 4.0 * labels[:, None], labels)
    >>> clients = [client(f"c{i}", i) for i in range(3)]
    >>> truth = augmented_measure(clients[0]).support  # [x; m_y; s_y], the client's private measure
    >>> configs = FedBaryConfig(support_size=12, iterations=3, t=0.5), FedBaryConfig(support_size=12, iterations=4)
    >>> for config in configs:
    ...     channel = Channel(keep_inbox=True)
    ...     _ = federated_valuation(clients, config, seed=0, channel=channel)
    ...     rec = attack_fedbary(server_view(channel), "c0", config)
    ...     distance, _ = cKDTree(rec.points).query(truth)
    ...     print(sorted(set(rec.times.methods)), bool(distance.max() < 1e-9))
    ['known'] True
    ['means'] True
    """
    if config.interpolation != "approx":
        raise ValueError("attack_fedbary inverts approximate interpolation (FedWaD eq. 10) only; "
                         "exact FedBary interpolants nest two plans")
    rounds = fedbary_rounds(view, client)
    n = len(rounds)
    if use_known_t and config.fixed_t is not None:
        times = TimeEstimate(np.full(n, config.fixed_t), ("known",) * n, update_times=np.full(n, config.fixed_t))
    else:
        est = estimate_fedbary_times(rounds)
        if est is None:
            times = TimeEstimate(np.full(n, PRIOR_TIME), ("prior",) * n, update_times=np.full(n, PRIOR_TIME))
        else:
            ok = np.isfinite(est.times)
            times = TimeEstimate(np.where(ok, est.times, PRIOR_TIME),
                                 tuple(m if f else "prior" for m, f in zip(est.methods, ok)),
                                 est.client_mean, est.residual,
                                 np.where(ok, est.update_times, PRIOR_TIME))  # type: ignore[arg-type]
    points = [invert_fedbary_round(r, float(t), float(t2), config.p)
              for r, t, t2 in zip(rounds, times.times, times.update_times)]  # type: ignore[arg-type]
    weights = np.concatenate([r.gamma.weights for r in rounds])
    index = np.concatenate([np.full(r.gamma.n, k) for k, r in enumerate(rounds, start=1)])
    return Reconstruction(client, np.vstack(points), weights, index, times)


# ----------------------------------------------------------------------------------------------------
# evaluation (needs the truth; never part of the attack)


@dataclass(frozen=True)
class ReconstructionScores:
    """How much of a client's data a reconstruction reveals.

    ``scale``: median nearest-neighbour distance within the client's samples; ``median_error``: median over
    reconstructed points of their distance to the nearest sample, in units of ``scale``;
    ``recovered_fraction``: samples with a reconstructed point within ``threshold``·scale;
    ``precise_fraction``: reconstructed points within ``threshold``·scale of a sample; ``membership_auc``: ROC
    AUC of "member" scored by minus the distance to the nearest reconstructed point (members vs non-members);
    ``non_member_fraction``: non-members with a reconstructed point within ``threshold``·scale — the recovered
    fraction a reconstruction reaches without having learnt anything about the members (its baseline).
    """

    scale: float
    median_error: float
    recovered_fraction: float
    precise_fraction: float
    membership_auc: float
    threshold: float
    non_member_fraction: float = float("nan")


def nn_scale(samples: np.ndarray) -> float:
    """Median distance from each sample to its nearest other sample (0 if duplicated; NaN for one sample)."""
    samples = np.asarray(samples, dtype=np.float64)
    if samples.shape[0] < 2:
        return float("nan")
    dist, _ = cKDTree(samples).query(samples, k=2)
    return float(np.median(dist[:, 1]))


def reconstruction_scores(reconstructed: np.ndarray, samples: np.ndarray, non_members: np.ndarray,
                          threshold: float = 0.5, scale: float | None = None) -> ReconstructionScores:
    """Score ``reconstructed`` points against the client's ``samples`` and held-out ``non_members`` (the
    evaluation, which knows the truth). ``scale`` defaults to :func:`nn_scale` of the samples."""
    rec = np.asarray(reconstructed, dtype=np.float64)
    x = np.asarray(samples, dtype=np.float64)
    out = np.asarray(non_members, dtype=np.float64)
    if rec.ndim != 2 or x.ndim != 2 or out.ndim != 2 or not (rec.shape[1] == x.shape[1] == out.shape[1]):
        raise ValueError(f"reconstructed {rec.shape}, samples {x.shape} and non-members {out.shape} must be 2-D "
                         f"arrays of one dimension")
    if rec.shape[0] == 0 or x.shape[0] == 0 or out.shape[0] == 0:
        raise ValueError("reconstructed points, samples and non-members must all be non-empty")
    scale = nn_scale(x) if scale is None else float(scale)
    if not scale > 0:
        raise ValueError(f"the samples' nearest-neighbour scale must be positive, got {scale!r}")
    to_sample, _ = cKDTree(x).query(rec)
    rec_tree = cKDTree(rec)
    member_d, _ = rec_tree.query(x)
    other_d, _ = rec_tree.query(out)
    labels = np.concatenate([np.ones(x.shape[0]), np.zeros(out.shape[0])])
    auc = float(roc_auc_score(labels, -np.concatenate([member_d, other_d])))
    cut = threshold * scale
    return ReconstructionScores(scale=scale, median_error=float(np.median(to_sample)) / scale,
                                recovered_fraction=float(np.mean(member_d <= cut)),
                                precise_fraction=float(np.mean(to_sample <= cut)),
                                membership_auc=auc, threshold=float(threshold),
                                non_member_fraction=float(np.mean(other_d <= cut)))


def label_scores(decoded: LabelledReconstruction, x: np.ndarray, y: np.ndarray, diagonal: bool = True
                 ) -> tuple[float, int]:
    """(ARI, classes matched): the adjusted Rand index between the client's labels and those of each sample's
    nearest labelled reconstructed point, and how many of its classes have statistics [m_y; s_y] recovered
    within 1e-6 relative (the evaluation, which knows the truth)."""
    stats = class_statistics(x, y, diagonal=diagonal)
    true_parts = np.hstack([stats.means, stats.sqrt_covs.reshape(stats.means.shape[0], -1)])
    got = np.hstack([decoded.class_means, decoded.class_sqrt_covs.reshape(decoded.class_means.shape[0],
                                                                             true_parts.shape[1] - stats.dim)])
    matched = 0
    if got.shape[0]:
        for part in true_parts:
            err = np.linalg.norm(got - part, axis=1).min()
            matched += int(err <= 1e-6 * max(float(np.linalg.norm(part)), 1.0))
    labelled = decoded.labels >= 0
    if not labelled.any():
        return 0.0, matched
    _, nearest = cKDTree(decoded.features[labelled]).query(np.asarray(x, dtype=np.float64))
    return float(adjusted_rand_score(np.asarray(y), decoded.labels[labelled][nearest])), matched


# ----------------------------------------------------------------------------------------------------
# one experiment


class AttackConfig(Strict):
    """One attack experiment: a protocol run on synthetic data, attacked by the server, scored.

    FedWaD: client μ ~ N(0, I_d), client ν ~ N(2·1/√d, I_d) (the attack targets μ). OTDD and FedBary: labelled
    clients, ``classes`` Gaussian classes with means ~ N(0, 3² I_d) and unit covariance (FedBary: ``clients``
    clients; Q the server's barycenter, or with ``validation`` a server-held set of ``samples`` records).
    Non-members: ``samples`` fresh records of the target's distribution. ``record_history`` has FedWaD clients
    report W(μ_c, ξ_c^k) every round (the defence "distances only at the end" switched off);
    ``attacker_knows_t``: a fixed t is public configuration the attacker uses.
    """

    protocol: Protocol = "fedwad"
    interpolation: Interpolation = "approx"
    support_size: int = Field(10, ge=1, le=5000)
    t: InterpolationTime = "random"
    iterations: int = Field(5, ge=1, le=200)
    dim: int = Field(5, ge=1, le=256)
    samples: int = Field(100, ge=4, le=5000)
    classes: int = Field(3, ge=1, le=20)
    clients: int = Field(3, ge=1, le=20)
    validation: bool = False
    record_history: bool = False
    attacker_knows_t: bool = True
    threshold: float = Field(0.5, gt=0.0)
    seed: int = 0

    @model_validator(mode="after")
    def _feasible(self) -> "AttackConfig":
        if self.protocol == "fedbary" and self.interpolation != "approx":
            raise ValueError("interpolation: the FedBary attack inverts approximate interpolation only")
        if self.protocol != "fedwad" and self.samples < 2 * self.classes:
            raise ValueError(f"samples: {self.samples} samples cannot give each of {self.classes} classes the two "
                             f"samples its covariance needs")
        return self


@dataclass(frozen=True)
class AttackResult:
    """Scores of one attack experiment (:func:`attack_experiment`). ``t_error``: the largest error of the
    attacker's per-round times against the true ones (which the evaluation recovers from the true client
    mean; FedBary: both times); ``t_methods``: the estimators used, joined; ``label_ari`` and
    ``classes_matched`` (OTDD, FedBary; NaN / −1 otherwise): :func:`label_scores`; ``points``: reconstructed
    points, all rounds."""

    protocol: str
    interpolation: str
    support_size: int
    t: str
    iterations: int
    dim: int
    samples: int
    validation: bool
    record_history: bool
    attacker_knows_t: bool
    seed: int
    t_methods: str
    t_error: float
    points: int
    median_error: float
    recovered_fraction: float
    precise_fraction: float
    membership_auc: float
    label_ari: float
    classes_matched: int

    def as_row(self) -> dict:
        """The result as one flat table row."""
        return asdict(self)


def _labelled(name: str, n: int, dim: int, centres: np.ndarray, rng: np.random.Generator) -> LabelledData:
    y = np.arange(n) % centres.shape[0]
    rng.shuffle(y)
    return LabelledData(name, centres[y] + rng.normal(size=(n, dim)), y)


def _true_fedwad_times(rounds: Sequence[InterpolationRound], mean: np.ndarray) -> np.ndarray:
    out = []
    for r in rounds:
        c, v = _mean(r.source), _mean(r.interpolant) - _mean(r.source)
        u = mean - c
        out.append(float(v @ u) / float(u @ u) if float(u @ u) > 0 else np.nan)
    return np.array(out)


def _true_fedbary_times(rounds: Sequence[BaryRound], mean: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t, t2 = [], []
    for r in rounds:
        g, e, g2 = _mean(r.gamma), _mean(r.eta_q), _mean(r.next_gamma)
        (alpha, beta), *_ = np.linalg.lstsq(np.stack([g - e, mean - g], axis=1), g2 - e, rcond=None)
        t.append(beta / alpha if alpha else np.nan)
        t2.append(1.0 - alpha)
    return np.array(t), np.array(t2)


@dataclass(frozen=True)
class ProtocolAttack:
    """One protocol session on given client data, attacked from the server's transcript and scored against the
    truth (:func:`attack_protocol`).

    ``t_methods``: the attacker's time estimators, joined; ``t_error``: the largest error of its per-round times
    against the true ones (NaN under DP, where noisy interpolants no longer pin the true times down);
    ``points``: reconstructed points, all rounds; ``scores``: :func:`reconstruction_scores` of the features;
    ``label_ari`` / ``classes_matched``: :func:`label_scores` (OTDD, FedBary; NaN / −1 otherwise);
    ``estimate``: what the protocol computed — FedWaD / OTDD: d(μ, ξ^K) + d(ξ^K, ν) (Algorithm 1, line 10),
    FedBary: the target's distance to Q; ``epsilon`` / ``noise_multiplier`` / ``releases``: with ``dp``, the ε
    each client spent in the session (the larger of the two, by its accountant), σ_mult and the releases the
    target made (NaN / NaN / 0 without DP).
    """

    t_methods: str
    t_error: float
    points: int
    scores: ReconstructionScores
    label_ari: float
    classes_matched: int
    estimate: float
    epsilon: float = float("nan")
    noise_multiplier: float = float("nan")
    releases: int = 0

    def as_row(self) -> dict:
        """The outcome as one flat table row (the scores' fields inline)."""
        row = asdict(self)
        return {k: v for k, v in row.items() if k != "scores"} | asdict(self.scores)


def attack_protocol(protocol: Protocol, target: LabelledData, others: Sequence[LabelledData],
                    non_members: np.ndarray, config: FedWaDConfig, seed: int = 0,
                    validation: LabelledData | None = None, attacker_knows_t: bool = True, threshold: float = 0.5,
                    diagonal: bool = True, dp: DPConfig | None = None) -> ProtocolAttack:
    """Run ``protocol`` on the given clients over a ledgered channel, attack ``target`` from the server's
    transcript alone and score the reconstruction against its true samples (the evaluation; never the attack).

    FedWaD (Algorithm 1): ``target`` against ``others[0]`` on features (labels unused) — with ``dp`` both
    clients are :class:`~otfed.privacy.dp.DPWassersteinClient` s (approximate interpolation only); federated
    OTDD (FedWaD §4): the same on label-augmented samples; FedBary (Algorithm 1, eqs. 4–7): ``target`` and
    every client of ``others``, Q the server's ``validation`` set or, without one, the federated barycenter
    (``config`` must be a :class:`~otfed.federation.fedbary.FedBaryConfig`) — with ``dp`` every client is a
    :class:`~otfed.privacy.dp_fedbary.DPBaryClient` (``dp.clip_radius`` in the label-augmented space). ``non_members``: held-out records
    of the target's distribution (membership AUC, non-member baseline). The attacker knows ``config`` (public
    protocol configuration: a fixed t with ``attacker_knows_t``), never the data. Same inputs → same result.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> a = LabelledData("a", rng.normal(size=(30, 3)), np.zeros(30, dtype=int))
    >>> b = LabelledData("b", rng.normal(size=(30, 3)) + 1.0, np.zeros(30, dtype=int))
    >>> out = attack_protocol("fedwad", a, [b], rng.normal(size=(30, 3)), FedWaDConfig(support_size=30, iterations=3))
    >>> out.scores.recovered_fraction, out.t_methods
    (1.0, 'means')
    """
    if not others:
        raise ValueError(f"{protocol}: the target needs at least one other client")
    if dp is not None and protocol == "otdd":
        raise ValueError("dp: a differentially private client exists for FedWaD and FedBary, not for 'otdd'")
    channel = Channel(keep_inbox=True)
    x = np.asarray(target.x, dtype=np.float64)
    ari, matched = float("nan"), -1
    eps, sigma, releases = float("nan"), float("nan"), 0
    if protocol == "fedwad":
        names = (target.name, others[0].name)
        if dp is None:
            estimate = federated_wasserstein(x, others[0].x, config, seed=seed, names=names, channel=channel).estimate
        else:
            out = dp_federated_wasserstein(x, others[0].x, config, dp, seed=seed, names=names, channel=channel)
            estimate, eps, sigma, releases = out.estimate, out.epsilon, out.noise_multiplier, out.releases
        view = server_view(channel)
        rec = attack_fedwad(view, target.name, config, attacker_knows_t)
        true_t = _true_fedwad_times(fedwad_rounds(view, target.name), x.mean(axis=0))
        t_err = float(np.max(np.abs(rec.times.times - true_t))) if dp is None else float("nan")
        features = rec.points
    elif protocol == "otdd":
        truth_mean = _mean(augmented_measure(target, diagonal))
        estimate = federated_otdd(target, others[0], config, seed=seed, diagonal=diagonal, channel=channel).estimate
        view = server_view(channel)
        rec, decoded = attack_otdd(view, target.name, config, diagonal, use_known_t=attacker_knows_t)
        true_t = _true_fedwad_times(fedwad_rounds(view, target.name), truth_mean)
        t_err = float(np.max(np.abs(rec.times.times - true_t)))
        ari, matched = label_scores(decoded, x, target.y, diagonal)
        features = decoded.features
    elif protocol == "fedbary":
        if not isinstance(config, FedBaryConfig):
            raise ValueError("fedbary: config must be a FedBaryConfig")
        truth_mean = _mean(augmented_measure(target, config.diagonal))
        if dp is None:
            result = federated_valuation([target, *others], config, validation=validation, seed=seed, channel=channel)
        else:  # every client DP (otfed.privacy.dp_fedbary)
            result, parties = dp_federated_valuation([target, *others], config, dp, validation=validation, seed=seed,
                                                     channel=channel)
            eps, sigma, releases = parties[0].privacy_spent()[0], parties[0].noise_multiplier, parties[0].releases
        estimate = float(result.distances[0])
        view = server_view(channel)
        rec = attack_fedbary(view, target.name, config, attacker_knows_t)
        decoded = decode_label_augmented(rec.points, config.diagonal)
        if dp is None:
            true_t, true_t2 = _true_fedbary_times(fedbary_rounds(view, target.name), truth_mean)
            t_err = float(max(np.max(np.abs(rec.times.times - true_t)),
                              np.max(np.abs(rec.times.update_times - true_t2))))  # type: ignore[operator]
        else:
            t_err = float("nan")
        ari, matched = label_scores(decoded, x, target.y, config.diagonal)
        features = decoded.features
    else:
        raise ValueError(f"unknown protocol {protocol!r}; allowed: fedwad, otdd, fedbary")
    scores = reconstruction_scores(features, x, non_members, threshold)
    return ProtocolAttack(t_methods="+".join(sorted(set(rec.times.methods))), t_error=t_err,
                          points=int(rec.points.shape[0]), scores=scores, label_ari=ari, classes_matched=matched,
                          estimate=float(estimate), epsilon=float(eps), noise_multiplier=float(sigma),
                          releases=int(releases))


def attack_experiment(config: AttackConfig) -> AttackResult:
    """Run ``config.protocol`` on synthetic clients over a ledgered channel, attack the target client from the
    server's transcript alone (:func:`attack_fedwad`, :func:`attack_otdd`, :func:`attack_fedbary`) and score the
    reconstruction against the truth (:func:`reconstruction_scores`, :func:`label_scores`) — the synthetic
    draws of :class:`AttackConfig`, then :func:`attack_protocol`. Same config → same result. Small sizes
    (n ≈ 100, S ≤ 100, K ≤ 10) run in well under a second (exact interpolation grows ξ's support every round:
    keep K ≤ 3 there).

    Parameters:
        config: the :class:`AttackConfig` — protocol, interpolation, S, t, K, sizes, seed.

    Returns:
        An :class:`AttackResult`: the configuration and the scores (``recovered_fraction``, ``median_error``,
        ``membership_auc``, ``t_error``, ``t_methods``; for OTDD / FedBary ``label_ari`` and ``classes_matched``).

    Exact interpolation (FedWaD eq. 5) sends atoms (1 − t)x_i + t·y_j: the server matches each to its source and
    solves for y_j, so one round reveals every sample even with S = 5 < n = 30 — the time comes from the final
    distance, and the members are told apart from fresh records of their distribution perfectly:

    >>> result = attack_experiment(AttackConfig(protocol="fedwad", interpolation="exact", support_size=5,
    ...                                         iterations=1, samples=30, dim=2))
    >>> result.t_methods, result.recovered_fraction, result.membership_auc, bool(result.t_error < 1e-9)
    ('distance', 1.0, 1.0, True)
    """
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, 2024]))
    d, n = config.dim, config.samples
    validation = None
    if config.protocol == "fedwad":
        proto: FedWaDConfig = FedWaDConfig(support_size=config.support_size, iterations=config.iterations,
                                           t=config.t, interpolation=config.interpolation,
                                           record_history=config.record_history)
        x = rng.normal(size=(n, d))
        other = rng.normal(size=(n, d)) + 2.0 / np.sqrt(d)
        holdout = rng.normal(size=(n, d))
        unlabelled = np.zeros(n, dtype=np.int64)
        target, others = LabelledData("client_mu", x, unlabelled), [LabelledData("client_nu", other, unlabelled)]
    else:
        centres = rng.normal(scale=3.0, size=(config.classes, d))
        count = 2 if config.protocol == "otdd" else config.clients
        data = [_labelled(f"client_{i}", n, d, centres, rng) for i in range(count)]
        holdout = _labelled("holdout", n, d, centres, rng).x
        target, others = data[0], data[1:]
        if config.protocol == "otdd":
            proto = FedWaDConfig(support_size=config.support_size, iterations=config.iterations, t=config.t,
                                 interpolation=config.interpolation, record_history=config.record_history)
        else:
            proto = FedBaryConfig(support_size=config.support_size, iterations=config.iterations, t=config.t,
                                  interpolation=config.interpolation)
            validation = _labelled("server", n, d, centres, rng) if config.validation else None
    out = attack_protocol(config.protocol, target, others, holdout, proto, seed=config.seed, validation=validation,
                          attacker_knows_t=config.attacker_knows_t, threshold=config.threshold)
    s = out.scores
    return AttackResult(protocol=config.protocol, interpolation=config.interpolation,
                        support_size=config.support_size, t=str(config.t), iterations=config.iterations, dim=d,
                        samples=n, validation=config.validation, record_history=config.record_history,
                        attacker_knows_t=config.attacker_knows_t, seed=config.seed, t_methods=out.t_methods,
                        t_error=out.t_error, points=out.points, median_error=s.median_error,
                        recovered_fraction=s.recovered_fraction, precise_fraction=s.precise_fraction,
                        membership_auc=s.membership_auc, label_ari=out.label_ari, classes_matched=out.classes_matched)


# ----------------------------------------------------------------------------------------------------
# stronger attacks on DP messages: round averaging, a likelihood ratio over rounds, clip-radius canaries


def round_targets(view: ServerView, client: str, config: FedWaDConfig, use_known_t: bool = True
                  ) -> tuple[np.ndarray, TimeEstimate]:
    """Every round's inverted targets, K × S × d in ξ's atom order, and the times used: row i of round k is
    (ξ_{c,i}^k − (1 − t_k) ξ_i^{k−1}) / t_k (FedWaD eq. 10 solved for T(ξ_i), :func:`invert_interpolation`). Under
    DP each is T(ξ_i^{k−1}) + fresh Gaussian noise, projected onto B(0, C) (:func:`~otfed.privacy.dp.dp_client_step`).
    Approximate interpolation only (eq. 10 keeps the atoms' order)."""
    if config.interpolation != "approx":
        raise ValueError("round_targets inverts approximate interpolation (FedWaD eq. 10) only")
    rec = attack_fedwad(view, client, config, use_known_t)
    k = int(rec.rounds.max())
    return rec.points.reshape(k, -1, rec.points.shape[1]), rec.times


def round_average(targets: np.ndarray) -> np.ndarray:
    """The per-atom mean of the inverted targets over the K rounds (S × d). Eq. 10 keeps ξ's atom order and the
    DP noise is drawn afresh every round, so where an atom keeps its transport cell its K noisy copies of the same
    T(ξ_i) average to T(ξ_i) + noise of variance σ²/K: K rounds buy the attacker a √K smaller noise. Where the
    plan reassigns the atom between rounds, the mean mixes cells (it is then a cell mean, not a record)."""
    targets = np.asarray(targets, dtype=np.float64)
    if targets.ndim != 3 or targets.shape[0] == 0:
        raise ValueError(f"targets must be a K × S × d array with K ≥ 1, got shape {targets.shape}")
    return targets.mean(axis=0)


def _log_gauss_mixture(points: np.ndarray, candidates: np.ndarray, sigma: float) -> np.ndarray:
    """log (1/m) Σ_i N(candidate; points_i, σ² I) per candidate (d-dimensional isotropic Gaussian)."""
    d = points.shape[1]
    sq = (np.sum(candidates ** 2, axis=1)[:, None] + np.sum(points ** 2, axis=1)[None, :]
          - 2.0 * candidates @ points.T)
    sq = np.maximum(sq, 0.0)
    return (logsumexp(-sq / (2.0 * sigma * sigma), axis=1) - np.log(points.shape[0])
            - 0.5 * d * np.log(2.0 * np.pi * sigma * sigma))


def round_likelihood_scores(targets: np.ndarray, candidates: np.ndarray, sigma: float,
                            reference: np.ndarray | None = None, average: bool = True) -> np.ndarray:
    """A likelihood-ratio membership score per candidate record z from the K rounds of inverted targets.

    Model (the DP client of :mod:`otfed.privacy.dp`, eq. 10): every inverted target is a record of the client (its
    transport cell's mean; a record when S ≥ n) plus N(0, σ² I), σ = σ_mult·2C√S public (ε, δ, K, C and S are
    protocol configuration). "z is a record" makes the targets' density at z a mixture component; "z is not"
    leaves the population's. The score is log p(targets | z ∈ D) − log p(targets | z ∉ D) up to terms the same
    for every z:

    - ``average=True`` (default): one mixture over the round averages (:func:`round_average`, σ/√K): the rounds'
      fresh noise averaged per atom — strongest where the plan keeps its assignment;
    - ``average=False``: Σ_k of each round's mixture log-likelihood (rounds independent given D) — robust to
      atoms that change cells between rounds.

    ``reference`` (public records of the population, e.g. the server's own test rows) gives the denominator: the
    same mixture's log-likelihood at z with the reference in place of the targets (blurred by the same noise), so
    a candidate in a dense region of the population is not mistaken for a member. Without it the denominator is
    taken flat.
    """
    targets = np.asarray(targets, dtype=np.float64)
    z = np.asarray(candidates, dtype=np.float64)
    if targets.ndim != 3 or z.ndim != 2 or z.shape[1] != targets.shape[2]:
        raise ValueError(f"targets must be K × S × d and candidates m × d (got {targets.shape} and {z.shape})")
    if not sigma > 0:
        raise ValueError(f"sigma must be positive (the DP noise std), got {sigma!r}")
    k = targets.shape[0]
    if average:
        score = _log_gauss_mixture(round_average(targets), z, sigma / np.sqrt(k))
        scale = sigma / np.sqrt(k)
    else:
        score = np.sum([_log_gauss_mixture(r, z, sigma) for r in targets], axis=0)
        scale = sigma
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float64)
        if ref.ndim != 2 or ref.shape[1] != z.shape[1]:
            raise ValueError(f"reference must be r × {z.shape[1]}, got {ref.shape}")
        null = _log_gauss_mixture(ref, z, scale)
        score = score - (null if average else k * null)
    return score


def membership_auc_interval(auc: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean AUC over independent member / non-member splits and its Student-t interval at
    ``level`` (the splits' spread, not one split's luck), cut to [0, 1] where an AUC lives. One split gives
    (auc, NaN, NaN)."""
    a = np.asarray(auc, dtype=np.float64)
    a = a[np.isfinite(a)]
    if a.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(a.mean())
    if a.size < 2:
        return mean, float("nan"), float("nan")
    half = float(student_t.ppf(0.5 + level / 2.0, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size))
    return mean, max(0.0, mean - half), min(1.0, mean + half)


@dataclass(frozen=True)
class DPAttackScores:
    """One DP FedWaD session attacked three ways (:func:`dp_attack`).

    ``baseline``: the per-round attack (:func:`attack_fedwad`, every round's inverted targets pooled — the suite's
    attack before round averaging); ``averaged``: :func:`reconstruction_scores` of :func:`round_average`;
    ``lr_auc``: membership ROC AUC of :func:`round_likelihood_scores` (round averages, the public ``reference`` as
    denominator when given); ``lr_rounds_auc``: the same with one mixture per round (``average=False``);
    ``sigma``: the noise std per coordinate of every inverted target; ``epsilon``, ``noise_multiplier``,
    ``releases``: what the target spent; ``estimate``: the DP distance estimate; ``t_methods``: the attacker's time
    estimators, joined; ``points``: inverted targets, all rounds.
    """

    baseline: ReconstructionScores
    averaged: ReconstructionScores
    lr_auc: float
    lr_rounds_auc: float
    sigma: float
    epsilon: float
    noise_multiplier: float
    releases: int
    estimate: float
    t_methods: str = ""
    points: int = 0


def dp_attack(x: np.ndarray, partner: np.ndarray, non_members: np.ndarray, config: FedWaDConfig, dp: DPConfig,
              seed: int = 0, threshold: float = 0.5, reference: np.ndarray | None = None,
              use_known_t: bool = True, names: tuple[str, str] = ("client_mu", "client_nu")) -> DPAttackScores:
    """One DP FedWaD session (:func:`~otfed.privacy.dp.dp_federated_wasserstein`, both clients DP) between the
    target's records ``x`` and a partner, attacked from the server's transcript with the per-round inversion, round
    averaging and the likelihood ratio over rounds, and scored against ``x`` with ``non_members`` held-out records
    of the same distribution (the evaluation; never the attack). Same inputs → same scores.

    Parameters:
        x: the target client's records (n × d).
        partner: the other client's records.
        non_members: held-out records of the target's distribution (membership negatives).
        config: the public FedWaD configuration (approximate interpolation; a fixed t is what the attacker uses
            with ``use_known_t``, the strongest attacker).
        dp: the clients' :class:`~otfed.privacy.dp.DPConfig`.
        seed: the session's seed.
        threshold: recovered = within ``threshold`` × the target's median NN distance of a reconstructed point.
        reference: public records of the population (the likelihood ratio's denominator), or None.
        use_known_t: let the attacker use a fixed t from ``config``.
        names: the two clients' names.

    Returns:
        A :class:`DPAttackScores`.

    Without noise and S = n every round inverts to the records themselves, so the round average recovers every
    record — and every non-member near none (checked against the records themselves by brute force):

    >>> import math
    >>> rng = np.random.default_rng(0)
    >>> x, other, held = rng.normal(size=(20, 3)), rng.normal(size=(20, 3)) + 1.0, rng.normal(size=(20, 3))
    >>> out = dp_attack(x, other, held, FedWaDConfig(support_size=20, iterations=3, t=0.5),
    ...                 DPConfig(epsilon=math.inf, clip_radius=50.0), seed=1)
    >>> out.averaged.recovered_fraction, out.lr_auc, out.noise_multiplier
    (1.0, 1.0, 0.0)
    """
    channel = Channel(keep_inbox=True)
    out = dp_federated_wasserstein(np.asarray(x, dtype=np.float64), partner, config, dp, seed=seed, names=names,
                                   channel=channel)
    view = server_view(channel)
    targets, times = round_targets(view, names[0], config, use_known_t)
    x = np.asarray(x, dtype=np.float64)
    baseline = reconstruction_scores(targets.reshape(-1, targets.shape[2]), x, non_members, threshold)
    averaged = reconstruction_scores(round_average(targets), x, non_members, threshold)
    sigma = out.noise_multiplier * interpolant_sensitivity(config.support_size, dp.clip_radius)
    labels = np.r_[np.ones(x.shape[0]), np.zeros(np.asarray(non_members).shape[0])]
    both = np.vstack([x, non_members])
    if sigma > 0:
        lr = roc_auc_score(labels, round_likelihood_scores(targets, both, sigma, reference))
        lr_rounds = roc_auc_score(labels, round_likelihood_scores(targets, both, sigma, reference, average=False))
    else:  # no noise: the averages are the targets themselves; the nearest-point rule is the limit σ → 0
        lr = lr_rounds = averaged.membership_auc
    return DPAttackScores(baseline=baseline, averaged=averaged, lr_auc=float(lr), lr_rounds_auc=float(lr_rounds),
                          sigma=float(sigma), epsilon=float(out.epsilon), noise_multiplier=float(out.noise_multiplier),
                          releases=int(out.releases), estimate=float(out.estimate),
                          t_methods="+".join(sorted(set(times.methods))), points=int(targets.shape[0] * targets.shape[1]))


@dataclass(frozen=True)
class MembershipSplits:
    """Membership inference over independent member / non-member splits of one pool of records
    (:func:`membership_splits`): per split the AUC of each score, and for each its mean and t-interval
    (:func:`membership_auc_interval`). ``nearest``: the per-round attack's nearest-point score; ``averaged``: the
    round averages' nearest-point score; ``lr``: :func:`round_likelihood_scores`."""

    nearest: np.ndarray
    averaged: np.ndarray
    lr: np.ndarray
    averaged_recovered: np.ndarray
    averaged_non_member: np.ndarray

    def interval(self, score: str = "lr", level: float = 0.95) -> tuple[float, float, float]:
        """(mean, low, high) of ``score``'s AUC over the splits."""
        return membership_auc_interval(getattr(self, score), level)


def membership_splits(pool: np.ndarray, partner: np.ndarray, members: int, config: FedWaDConfig, dp: DPConfig,
                      splits: int = 20, seed: int = 0, threshold: float = 0.5,
                      reference: np.ndarray | None = None) -> MembershipSplits:
    """Membership inference scored over ``splits`` random member / non-member splits of ``pool``: each split draws
    ``members`` records as the target client's data set (the rest are its non-members), runs one DP FedWaD session
    with a fresh seed and attacks it (:func:`dp_attack`). One split's AUC swings with which records were drawn; the
    mean over splits, with its interval, is the score to report (:meth:`MembershipSplits.interval`)."""
    pool = np.asarray(pool, dtype=np.float64)
    if not 2 <= members < pool.shape[0]:
        raise ValueError(f"members must lie in [2, {pool.shape[0]}) for a pool of {pool.shape[0]} records, "
                         f"got {members}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 34]))
    rows: list[tuple[float, float, float, float, float]] = []
    for s in range(splits):
        chosen = np.zeros(pool.shape[0], dtype=bool)
        chosen[rng.choice(pool.shape[0], members, replace=False)] = True
        out = dp_attack(pool[chosen], partner, pool[~chosen], config, dp, seed=int(rng.integers(2**31)),
                        threshold=threshold, reference=reference)
        rows.append((out.baseline.membership_auc, out.averaged.membership_auc, out.lr_auc,
                     out.averaged.recovered_fraction, out.averaged.non_member_fraction))
    a = np.asarray(rows)
    return MembershipSplits(a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4])


def clip_canaries(count: int, dim: int, radius: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` canary records on the sphere of radius C (uniform random directions): the records a replace-one
    neighbour can move furthest (the 2C of every sensitivity), so the ones the DP guarantee is tight for."""
    u = rng.normal(size=(count, dim))
    return radius * u / np.linalg.norm(u, axis=1, keepdims=True)


@dataclass(frozen=True)
class CanaryAudit:
    """Clip-radius canaries inserted into a client's data or not (:func:`canary_audit`): per session the AUC of the
    likelihood-ratio score (``lr``) and of the round averages' nearest-point score (``averaged``) at telling the
    inserted canaries from the others, and for each its mean and t-interval over sessions."""

    lr: np.ndarray
    averaged: np.ndarray

    def interval(self, score: str = "lr", level: float = 0.95) -> tuple[float, float, float]:
        """(mean, low, high) of ``score``'s AUC over the sessions."""
        return membership_auc_interval(getattr(self, score), level)


def canary_audit(x: np.ndarray, partner: np.ndarray, config: FedWaDConfig, dp: DPConfig, canaries: int = 10,
                 sessions: int = 5, seed: int = 0) -> CanaryAudit:
    """A DP audit with canaries at the clip radius: per session 2m canaries (:func:`clip_canaries`, m =
    ``canaries``), m of them replacing random records of ``x`` (n stays public and fixed), one DP FedWaD session,
    and the server's scores of all 2m (:func:`round_likelihood_scores`, without a reference: the canaries lie
    outside the population) — the AUC of inserted vs not inserted. A canary lies at distance ≈ C√2 from the
    others, so this is the membership game at the records the guarantee is tightest for."""
    x = np.asarray(x, dtype=np.float64)
    if not 1 <= canaries <= x.shape[0]:
        raise ValueError(f"canaries must lie in [1, {x.shape[0]}], got {canaries}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 35]))
    lr, avg = [], []
    labels = np.r_[np.ones(canaries), np.zeros(canaries)]
    for _ in range(sessions):
        c = clip_canaries(2 * canaries, x.shape[1], dp.clip_radius, rng)
        data = x.copy()
        data[rng.choice(x.shape[0], canaries, replace=False)] = c[:canaries]
        channel = Channel(keep_inbox=True)
        out = dp_federated_wasserstein(data, partner, config, dp, seed=int(rng.integers(2**31)), channel=channel)
        targets, _ = round_targets(server_view(channel), "client_mu", config)
        sigma = out.noise_multiplier * interpolant_sensitivity(config.support_size, dp.clip_radius)
        near, _ = cKDTree(round_average(targets)).query(c)
        avg.append(roc_auc_score(labels, -near))
        # no noise: the nearest-point rule is the likelihood ratio's limit σ → 0
        lr.append(roc_auc_score(labels, round_likelihood_scores(targets, c, sigma)) if sigma > 0 else avg[-1])
    return CanaryAudit(np.asarray(lr), np.asarray(avg))
