"""Differentially private FedBary clients: every γ_i and every distance a client sends is (ε, δ)-DP for its
records, accounted over the K + 1 rounds by ``dp-accounting``.

FedBary (Li et al., §4.4) argues privacy from the interpolating measures alone; an honest-but-curious server
recovers the clients' samples from them (:mod:`otfed.privacy.attack`). This module gives the client side of
Algorithm 1 a formal guarantee by output perturbation, the same mechanism as :mod:`otfed.privacy.dp` gives
FedWaD's client step:

**What a client releases, and how.** Round k (Algorithm 1, lines 3–4) builds η_{P_i} = InterpMeas(γ_i → P_i)
on γ_i's atoms (FedWaD eq. 10 from the γ side): (1−t)·γ_i + t·T(γ_i), where the data enter only through the
barycentric targets T(γ_i) of the plan γ_i → P̄_i (P̄_i: the client's label-augmented records clipped to the
ball B(0, C)). The client releases T̃ = Π_C(T + N(0, (σ_mult·2C√S)² I)) (:func:`~otfed.privacy.dp.dp_client_step`:
every T(z) lies in B(0, C), so any change of the records moves the S×d array by at most 2C√S in L2), and
η_{P_i} is built from T̃. d_i^client = W(P̄_i, η_{P_i}) + W(η_{P_i}, γ_i): the first term is a Gaussian release
(sensitivity below), the second is post-processing. γ_i itself (sent every round) is post-processing: γ^(0)
is drawn independently of the data and γ^(k+1) = InterpMeas(η_{P_i} → η_{Q_i}) depends only on the noisy
η_{P_i} and the server's η_{Q_i}. The closing round releases W(P̄_i, γ_i^(K)) with noise. Per round: two
releases; in all 2K + 1 per session.

**Neighbours and the distance's sensitivity.** Replace-one on the client's raw records (x_j, y_j). A record is
augmented with its class's mean and covariance root ([x; m_y; Σ_y^{1/2}]), so replacing one record moves the
augmented points of two whole classes — up to every point. The distance's sensitivity is therefore the
clipped ball's diameter, |W_p(P̄, ξ) − W_p(P̄', ξ)| ≤ W_p(P̄, P̄') ≤ 2C (triangle inequality), not FedWaD's
2C·n^{−1/p}: a DP FedBary client pays more noise on its distances than a DP FedWaD client on raw features.
The interpolant's 2C√S bound holds for any change of the records.

**A public minimum class size.** The label augmentation needs each class's covariance, which a class with one
record does not have; a replace-one neighbour can leave a class with one record, and a client that then failed
(where its neighbour runs) would reveal that record through an event no noise covers. :func:`dp_augmented_measure`
applies a public minimum class size (``DPConfig.min_class_size``) before any release: a smaller class keeps its mean
and gets the data-independent covariance root 0, so neighbours run the same session.

**Accounting.** Every release is a Gaussian mechanism with the same σ_mult on a query chosen from public
history only (γ_i from earlier noisy releases, η_{Q_i} from the server's Q and the γ's): an adaptive
composition, accounted by :func:`~otfed.privacy.dp.gaussian_epsilon` (RDP or PLD). σ_mult is calibrated once
for :meth:`DPBaryClient.budget` releases (``DPConfig.sessions`` sessions); more raises
:class:`~otfed.privacy.dp.PrivacyBudgetError`. With ``DPConfig.ledger_dir`` each session reserves its 2K + 1
releases in the client's persisted ledger first (:mod:`otfed.privacy.accountant`).

What stays local: datum values (FedBary eq. 10, the calibrated gradients against the last η_{Q_i}) are
computed by the client and never sent; they are computed on the client's *unclipped* records (they are not
released), so DP costs detection only through a noisier η_{Q_i}. Only approximate interpolation is supported
(exact interpolation releases the plan's support and weights).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from otfed.errors import ConfigError
from otfed.federation.fedbary import (BaryClient, BaryServer, FedBaryConfig, FedBaryResult, Potential, _distance,
                                      fedbary, validation_target)
from otfed.federation.fedwad import draw_t
from otfed.federation.ledger import Channel
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage
from otfed.federation.otdd import LabelledData
from otfed.ot import Measure, optimal_transport
from otfed.ot.otdd import ClassStats, augment_with_label_stats, class_statistics, labelled_arrays
from otfed.privacy.dp import (DPConfig, clip_to_ball, dp_client_step, gaussian_epsilon, gaussian_mechanism,
                              gaussian_noise_multiplier, spend_release)
from otfed.valuation.calibrated import datum_values as calibrated_datum_values

__all__ = ["DPBaryClient", "distance_sensitivity", "dp_augmented_measure", "dp_federated_valuation",
           "releases_per_session"]


def releases_per_session(config: FedBaryConfig) -> int:
    """A DP FedBary client's releases per session: per round the noisy targets of η_{P_i} and W(P̄_i, η_{P_i}),
    plus the closing W(P̄_i, γ_i^(K)) — 2K + 1."""
    return 2 * config.iterations + 1


def dp_augmented_measure(data: LabelledData, diagonal: bool = True, min_class_size: int = 2) -> Measure:
    """The uniform measure on label-augmented records [x; m_y; s_y] (FedWaD §5, app. D.3; FedBary eq. 8) with a
    public minimum class size: a class with fewer than ``min_class_size`` records keeps its mean but gets the
    data-independent covariance root 0 in place of its own (a single record has none) — so a replace-one
    neighbour that empties a class to one record runs the same session as its neighbour instead of failing
    (an event no noise covers). Classes with ``min_class_size`` records or more get their own statistics
    (:func:`~otfed.ot.otdd.class_statistics`); with every class that large this is
    :func:`~otfed.ot.otdd.augmented_measure`. Everything released from it is clipped to B(0, C), so the
    sensitivities of the module docstring hold whichever statistics a class gets.

    Raises :class:`~otfed.errors.DegenerateClientError` naming the client for no records, non-finite features or
    labels (none is a neighbour of a valid data set of the public size n); ValueError as
    :func:`~otfed.ot.otdd.labelled_arrays`."""
    if min_class_size < 2:
        raise ValueError(f"min_class_size must be at least 2 (a covariance needs two records), got {min_class_size}")
    x, y = labelled_arrays(data.x, data.y, data.name)
    labels, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    large = counts >= min_class_size
    d = x.shape[1]
    means = np.stack([x[inverse == c].mean(axis=0) for c in range(labels.shape[0])])
    sqrt_covs = np.zeros((labels.shape[0], d) if diagonal else (labels.shape[0], d, d))
    if large.any():
        keep = large[inverse]
        own = class_statistics(x[keep], y[keep], diagonal=diagonal, client=data.name)
        sqrt_covs[large] = own.sqrt_covs
    stats = ClassStats(labels=labels, means=means, sqrt_covs=sqrt_covs, diagonal=bool(diagonal), counts=counts)
    return Measure.uniform(augment_with_label_stats(x, y, stats))


def distance_sensitivity(clip_radius: float) -> float:
    """Sensitivity of W_p(P̄_i, ξ) under replace-one neighbours for a label-augmented measure: the diameter 2C
    of the clipping ball (one record changes its class statistics, hence up to every augmented point)."""
    return 2.0 * clip_radius


class DPBaryClient(BaryClient):
    """A FedBary client whose every message is (ε, δ)-DP for its records (module docstring); the same messages
    as :class:`~otfed.federation.fedbary.BaryClient`, so :func:`~otfed.federation.fedbary.fedbary` runs unchanged.

    ``measure``: the client's label-augmented measure (clipped here to B(0, C) for everything released);
    ``datum_measure``: the measure its local datum values are computed on (default: ``measure`` unclipped).
    ``rng`` draws γ^(0) and the t's (the same stream as the non-private client); ``noise_rng`` the noise
    (default: a child spawned from ``rng``)."""

    def __init__(self, name: str, measure: Measure, config: FedBaryConfig, rng: np.random.Generator, dp: DPConfig,
                 noise_rng: np.random.Generator | None = None) -> None:
        if config.interpolation != "approx":
            raise ConfigError(f"client {name!r}: DP FedBary needs interpolation='approx' (eq. 10); exact "
                              "interpolation releases the plan's support and weights")
        super().__init__(name, Measure(clip_to_ball(measure.support, dp.clip_radius), measure.weights), config, rng)
        self._raw = measure
        self.dp = dp
        self.budget = dp.sessions * releases_per_session(config)
        self.noise_multiplier = gaussian_noise_multiplier(dp.epsilon, dp.delta, self.budget, dp.accountant)
        self.releases = 0
        self._noise_rng = noise_rng if noise_rng is not None else rng.spawn(1)[0]
        self._ledger = dp.ledger(name)

    @classmethod
    def from_data(cls, data: LabelledData, config: FedBaryConfig, rng: np.random.Generator,  # type: ignore[override]
                  dp: DPConfig | None = None, noise_rng: np.random.Generator | None = None) -> "DPBaryClient":
        """The client of ``data``'s label-augmented measure with the public minimum class size applied
        (:func:`dp_augmented_measure`)."""
        if dp is None:
            raise ConfigError(f"client {data.name!r}: a DP FedBary client needs its DPConfig")
        return cls(data.name, dp_augmented_measure(data, config.diagonal, dp.min_class_size), config, rng, dp,
                   noise_rng)

    def _spend(self) -> None:
        if self.releases == 0 and self._ledger is not None:  # before the first release of this session
            self._ledger.reserve(f"fedbary session {len(self._ledger.reservations) + 1}", self.noise_multiplier,
                                 releases_per_session(self._config))
        self.releases = spend_release(self.name, self.releases, self.budget, self.dp)

    def _noisy_distance(self, other: Measure) -> float:
        """W_p(P̄_i, other) (network simplex: the bound needs a true W_p) + N(0, (σ_mult·2C)²), clamped to its
        range [0, C + max ‖z‖] — one release."""
        self._spend()
        exact = optimal_transport(self._measure, other, p=self._config.p, solver="network_simplex").cost
        std = self.noise_multiplier * distance_sensitivity(self.dp.clip_radius)
        noisy = float(gaussian_mechanism(np.asarray([exact]), std, self._noise_rng)[0])
        return min(max(noisy, 0.0), self.dp.clip_radius + float(np.linalg.norm(other.support, axis=1).max()))

    def report(self) -> tuple[MeasureMessage, DistanceMessage]:
        """Algorithm 1, lines 3–4, privately: η_{P_i} from noisy targets (one release), d_i^client = noisy
        W(P̄_i, η_{P_i}) (one release) + W(η_{P_i}, γ_i) (post-processing); sends γ_i and d_i^client."""
        fw = self._config.fedwad()
        t = draw_t(fw, self._rng)
        self._spend()
        self._eta_p = dp_client_step(self._measure, self._gamma, t, fw, self.dp, self.noise_multiplier,
                                     self._noise_rng)
        d_client = self._noisy_distance(self._eta_p) + _distance(self._eta_p, self._gamma, fw)
        return (MeasureMessage("gamma", self.name, SERVER, measure=self._gamma),
                DistanceMessage("client_distance", self.name, SERVER, value=d_client))

    def final_report(self) -> tuple[MeasureMessage, DistanceMessage]:
        """Closing round: γ_i^(K) and a noisy W(P̄_i, γ_i^(K)) (one release)."""
        return (MeasureMessage("gamma", self.name, SERVER, measure=self._gamma),
                DistanceMessage("distance", self.name, SERVER, value=self._noisy_distance(self._gamma)))

    def datum_values(self, potential: Potential = "sinkhorn", **options) -> np.ndarray:
        """Calibrated gradients of this client's (unclipped) records against its last η_{Q_i} — local, never
        sent (FedBary eq. 10)."""
        if self._eta_q is None:
            raise RuntimeError(f"client {self.name!r} has received no η_Q yet")
        return calibrated_datum_values(self._raw, self._eta_q, p=self._config.p, potential=potential, **options)

    def privacy_spent(self) -> tuple[float, float]:
        """(ε, δ) of the releases made so far; ε ≤ ``dp.epsilon`` once all :attr:`budget` releases are made."""
        if self.releases == 0 or math.isinf(self.dp.epsilon):
            return (0.0 if self.releases == 0 else math.inf), self.dp.delta
        return gaussian_epsilon(self.noise_multiplier, self.releases, self.dp.delta, self.dp.accountant), self.dp.delta


def dp_federated_valuation(datasets: Sequence[LabelledData], config: FedBaryConfig, dp: DPConfig,
                           validation: LabelledData | None = None, seed: int = 0, datum_values: bool = False,
                           potential: Potential = "sinkhorn", channel: Channel | None = None
                           ) -> tuple[FedBaryResult, list[DPBaryClient]]:
    """:func:`~otfed.federation.fedbary.federated_valuation` with :class:`DPBaryClient` s: seeded the same way
    (the same γ^(0), X̃_Q^(0) and t's for the same ``seed``; the noise from further children of the seed), so
    ``epsilon=math.inf`` with records inside B(0, C) reproduces it exactly. Returns the result and the clients
    (their :meth:`~DPBaryClient.privacy_spent`)."""
    seeds = np.random.SeedSequence(seed).spawn(len(datasets) + 1)
    noise = np.random.SeedSequence([seed, 0xD9]).spawn(len(datasets))
    clients = [DPBaryClient.from_data(d, config, np.random.default_rng(s), dp=dp, noise_rng=np.random.default_rng(z))
               for d, s, z in zip(datasets, seeds[:-1], noise)]
    target = validation_target(validation, datasets[0], clients[0].dim, config)
    server = BaryServer(config, np.random.default_rng(seeds[-1]), target=target)
    return fedbary(clients, server, channel=channel, datum_values=datum_values, potential=potential), clients
