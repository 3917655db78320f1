"""DP FedBary (otfed.privacy.dp_fedbary) against independent truth: the non-private protocol (ε = ∞
reproduces federated_valuation bit for bit up to solver rounding), the noise the clients actually add (its
empirical std against σ_mult·2C), brute-force neighbours for the distance's sensitivity (one replaced record
moves a label-augmented measure by up to the diameter, far beyond FedWaD's 2C·n^{-1/p}), the accountant, and
the messages on the channel."""
from __future__ import annotations

import math

import numpy as np
import pytest

from otfed.errors import ConfigError
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.federation.ledger import Channel
from otfed.federation.messages import SERVER
from otfed.federation.otdd import LabelledData, augmented_measure
from otfed.ot import Measure, optimal_transport
from otfed.privacy.dp import DPConfig, PrivacyBudgetError, clip_to_ball, gaussian_epsilon
from otfed.privacy.dp_fedbary import (DPBaryClient, distance_sensitivity, dp_federated_valuation,
                                      releases_per_session)

DELTA = 1e-5


def _clients(seed: int = 0, n: int = 24, d: int = 3, classes: int = 3, shift: float = 0.0) -> list[LabelledData]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(3):
        y = np.repeat(np.arange(classes), n // classes)
        x = rng.normal(size=(len(y), d)) + y[:, None] * 1.5 + (shift if c == 2 else 0.0)
        out.append(LabelledData(f"client_{c}", x, y))
    return out


def _validation(seed: int = 9) -> LabelledData:
    data = _clients(seed)[0]
    return LabelledData("validation", data.x, data.y)


CONFIG = FedBaryConfig(support_size=6, iterations=3, interpolation="approx", solver="network_simplex")


def test_infinite_epsilon_reproduces_fedbary() -> None:
    """ε = ∞ and a clip radius no record reaches: no noise, no clipping — the same γ's, distances and datum
    values as the non-private protocol (same seed → the same γ^(0), Q and t's)."""
    clients, validation = _clients(), _validation()
    plain = federated_valuation(clients, CONFIG, validation=validation, seed=3, datum_values=True,
                                potential="exact")
    dp, parties = dp_federated_valuation(clients, CONFIG, DPConfig(epsilon=math.inf, clip_radius=1e6),
                                         validation=validation, seed=3, datum_values=True, potential="exact")
    np.testing.assert_allclose(dp.distances, plain.distances, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dp.client_history, plain.client_history, rtol=1e-10, atol=1e-10)
    for name in plain.names:
        np.testing.assert_allclose(dp.datum_values[name], plain.datum_values[name], rtol=1e-8, atol=1e-10)
    assert all(c.noise_multiplier == 0.0 for c in parties)


def test_every_release_is_counted_and_the_budget_is_met() -> None:
    """2K + 1 releases per client per session; after them the accountant's ε is the target (σ_mult is the
    smallest that meets it); one more release is refused."""
    dp = DPConfig(epsilon=2.0, delta=DELTA, clip_radius=6.0)
    result, parties = dp_federated_valuation(_clients(), CONFIG, dp, validation=_validation(), seed=1)
    assert releases_per_session(CONFIG) == 2 * CONFIG.iterations + 1 == 7
    for client in parties:
        assert client.releases == client.budget == 7
        spent, delta = client.privacy_spent()
        assert delta == DELTA and 0.98 * 2.0 <= spent <= 2.0
        assert spent == pytest.approx(gaussian_epsilon(client.noise_multiplier, 7, DELTA), rel=1e-12)
        with pytest.raises(PrivacyBudgetError, match=client.name):
            client.final_report()
    assert np.isfinite(result.distances).all() and (result.distances >= 0).all()


def test_distance_noise_has_the_calibrated_std() -> None:
    """The closing distance released 4,000 times from one state: mean ≈ the exact W_p of the clipped measure,
    std ≈ σ_mult·2C (the clamp to [0, C + max‖z‖] is far away here)."""
    data = _clients()[0]
    dp = DPConfig(epsilon=1e6, delta=DELTA, clip_radius=8.0, sessions=600)  # σ_mult·2C ≈ 0.8
    client = DPBaryClient.from_data(data, CONFIG, np.random.default_rng(0), dp=dp,
                                    noise_rng=np.random.default_rng(1))
    gamma = client._gamma
    exact = optimal_transport(Measure.uniform(clip_to_ball(augmented_measure(data).support, 8.0)), gamma, p=2,
                              solver="network_simplex").cost
    draws = np.array([client.final_report()[1].value for _ in range(4000)])
    std = client.noise_multiplier * distance_sensitivity(8.0)
    assert std > 0.3  # noise well above the clamp's rounding, well below the clamp range
    assert abs(draws.mean() - exact) < 4 * std / math.sqrt(4000)
    assert draws.std() == pytest.approx(std, rel=0.05)


def test_one_replaced_record_moves_the_augmented_measure_up_to_the_diameter() -> None:
    """Brute force over neighbours (one record moved far and relabelled): W_2(P̄, P̄') — which bounds the
    change of W_2(P̄, ξ) for every ξ — never exceeds the diameter 2C, while some neighbours exceed FedWaD's
    per-record bound 2C·n^{-1/2} (the record's class-mates move with their class statistics): why the DP FedBary
    client calibrates its distances to 2C."""
    rng = np.random.default_rng(4)
    radius, n = 3.0, 12
    moved, gaps = [], []
    for _ in range(40):
        x = rng.normal(size=(n, 2)) * 0.3
        y = np.repeat([0, 1, 2], n // 3)
        neighbour_x, neighbour_y = x.copy(), y.copy()
        j = rng.integers(n)
        neighbour_x[j] = rng.normal(size=2) * 50
        neighbour_y[j] = (y[j] + 1) % 3
        a = Measure.uniform(clip_to_ball(augmented_measure(LabelledData("a", x, y)).support, radius))
        b = Measure.uniform(clip_to_ball(augmented_measure(LabelledData("b", neighbour_x, neighbour_y)).support,
                                         radius))
        moved.append(optimal_transport(a, b, p=2, solver="network_simplex").cost)
        xi = Measure.uniform(rng.normal(size=(5, a.dim)))
        gaps.append(abs(optimal_transport(a, xi, p=2, solver="network_simplex").cost
                        - optimal_transport(b, xi, p=2, solver="network_simplex").cost))
    assert max(gaps) <= max(moved) <= distance_sensitivity(radius)
    assert max(moved) > 2 * radius / math.sqrt(n)  # the per-record bound would under-noise the augmented measure


def test_messages_are_gammas_and_distances_only() -> None:
    """On the channel a DP client sends γ_i (S atoms, never a record) and distances; γ^(0) is data-independent."""
    channel = Channel(session="dp-fedbary", keep_inbox=True)
    clients = _clients()
    dp = DPConfig(epsilon=1.0, delta=DELTA, clip_radius=5.0)
    from otfed.federation.fedbary import BaryServer, fedbary

    seeds = np.random.SeedSequence(0).spawn(len(clients) + 1)
    parties = [DPBaryClient.from_data(c, CONFIG, np.random.default_rng(s), dp=dp) for c, s in zip(clients, seeds)]
    server = BaryServer(CONFIG, np.random.default_rng(seeds[-1]),
                        target=augmented_measure(_validation()))
    fedbary(parties, server, channel=channel)
    received = channel.received_by(SERVER)
    assert {(m.sender, m.kind) for m in received} == {(c.name, k) for c in clients
                                                      for k in ("gamma", "client_distance", "distance")}
    records = np.concatenate([augmented_measure(c).support for c in clients])
    for m in received:
        if m.kind == "gamma":
            assert m.measure.n == CONFIG.support_size
            gaps = np.linalg.norm(m.measure.support[:, None, :] - records[None], axis=2).min(axis=1)
            assert gaps.min() > 1e-6


def test_config_errors_name_the_client() -> None:
    exact = FedBaryConfig(support_size=4, iterations=2, interpolation="exact")
    with pytest.raises(ConfigError, match="client_0.*approx"):
        DPBaryClient.from_data(_clients()[0], exact, np.random.default_rng(0),
                               dp=DPConfig(epsilon=1.0, clip_radius=1.0))
    with pytest.raises(ConfigError, match="client_0.*DPConfig"):
        DPBaryClient.from_data(_clients()[0], CONFIG, np.random.default_rng(0))


# ------------------------------------------------------------------------------------ the singleton gap (issue #34)
ISSUE_X = np.array([[0.0], [0.1], [1.0], [1.1]])


@pytest.mark.parametrize("epsilon", [1.0, math.inf])
def test_neighbours_that_leave_a_class_with_one_record_run_the_same_session(epsilon: float) -> None:
    """x = [[0], [0.1], [1], [1.1]] with y = [0, 0, 1, 1] and its replace-one neighbour y = [0, 1, 1, 1] (class 0
    left with one record, whose covariance is undefined): both sessions run — the same messages, kinds, sizes and
    release counts, no DegenerateClientError for one and a result for the other (an event no noise covers)."""
    other = LabelledData("b", np.array([[0.2], [0.3], [0.9], [1.2]]), np.array([0, 0, 1, 1]))
    transcripts = []
    for y in ([0, 0, 1, 1], [0, 1, 1, 1]):
        channel = Channel(keep_inbox=True)
        result, parties = dp_federated_valuation([LabelledData("a", ISSUE_X, np.array(y)), other],
                                                 FedBaryConfig(support_size=4, iterations=2),
                                                 DPConfig(epsilon=epsilon, clip_radius=3.0), seed=0, channel=channel)
        assert np.all(np.isfinite(result.distances))
        transcripts.append([(m.kind, m.sender, getattr(getattr(m, "measure", None), "n", None))
                            for m in channel.received_by(SERVER)] + [p.releases for p in parties])
    assert transcripts[0] == transcripts[1]


def test_the_public_minimum_class_size_gives_small_classes_a_data_independent_covariance() -> None:
    """By hand: y = [0, 1, 1, 1] — class 0's mean is its record and its s_y the public fallback 0; class 1 keeps
    its own mean and unbiased standard deviation. With min_class_size = 4 class 1 (3 records) falls back as well;
    with every class large enough it is augmented_measure."""
    from otfed.privacy.dp_fedbary import dp_augmented_measure
    y = np.array([0, 1, 1, 1])
    got = dp_augmented_measure(LabelledData("a", ISSUE_X, y)).support
    ones = ISSUE_X[1:, 0]
    s1 = math.sqrt(sum((v - ones.mean()) ** 2 for v in ones) / 2)
    np.testing.assert_allclose(got, [[0.0, 0.0, 0.0]] + [[v, ones.mean(), s1] for v in ones], rtol=1e-12)
    strict = dp_augmented_measure(LabelledData("a", ISSUE_X, y), min_class_size=4).support
    np.testing.assert_allclose(strict[:, 2], 0.0)
    even = LabelledData("a", ISSUE_X, np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(dp_augmented_measure(even).support, augmented_measure(even).support, rtol=1e-14)
    with pytest.raises(ConfigError, match="min_class_size"):
        DPConfig(clip_radius=1.0, min_class_size=1)
