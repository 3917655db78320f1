"""The honest-but-curious server attack (otfed.privacy.attack), checked against truths it never sees: the client's
samples, barycentric projections from POT's own exact plans, times chosen by the test, hand-computed scores."""
from __future__ import annotations

import doctest

import numpy as np
import ot
import pytest

from otfed.errors import ConfigError
from otfed.federation import Channel, FedWaDConfig, federated_wasserstein
from otfed.federation.fedbary import FedBaryConfig
from otfed.ot import Measure, interpolate_approx, interpolate_exact, optimal_transport
from otfed.privacy import attack as attack_module
from otfed.privacy import (AttackConfig, BaryRound, InterpolationRound, ServerView, attack_experiment, attack_fedbary,
                           attack_fedwad, decode_label_augmented, estimate_fedbary_times,
                           estimate_time_from_coincidences, estimate_time_from_distance, estimate_times,
                           estimate_times_from_means, estimate_times_from_monitor, feature_dim, fedwad_rounds,
                           interpolant_sources, invert_fedbary_round, invert_interpolation, nn_scale,
                           reconstruction_scores, server_view)

TOL = 1e-10


def _matches(points: np.ndarray, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distance from every point to its nearest sample, and from every sample to its nearest point."""
    d = np.linalg.norm(points[:, None, :] - samples[None, :, :], axis=2)
    return d.min(axis=1), d.min(axis=0)


def _mean(m: Measure) -> np.ndarray:
    return m.weights @ m.support


def _pot_projection(source: Measure, target: Measure) -> np.ndarray:
    """Barycentric projection of ``source``'s atoms onto ``target`` from POT's exact plan (independent of otfed)."""
    plan = ot.emd(source.weights, target.weights, ot.dist(source.support, target.support), numItermax=10**7)
    return (plan @ target.support) / plan.sum(axis=1, keepdims=True)


# ---------------------------------------------------------------------------------------------- inversion


@pytest.mark.parametrize("S", [4, 7, 12])
def test_exact_interpolation_with_known_t_reveals_every_sample(S: int) -> None:
    """Eq. 5: atoms (1 − t) x_i + t y_j; the server re-derives the sources by OT and solves for y_j exactly."""
    rng = np.random.default_rng(S)
    xi = Measure.uniform(rng.normal(size=(S, 3)))
    samples = rng.normal(size=(10, 3)) + 1.5
    mu = Measure.uniform(samples)
    t = 0.37
    interp = interpolate_exact(xi, mu, optimal_transport(xi, mu).plan, t)
    recovered = invert_interpolation(interpolant_sources(xi, interp, "exact"), interp.support, t)
    to_sample, to_point = _matches(recovered, samples)
    assert to_sample.max() < TOL and to_point.max() < TOL


def test_approx_interpolation_with_S_equal_n_reveals_every_sample() -> None:
    """Eq. 10 with S = n uniform: the plan is a permutation (FedWaD theorem 1), so T(ξ_i) are the samples."""
    rng = np.random.default_rng(1)
    samples = rng.normal(size=(15, 4))
    xi, mu = Measure.uniform(rng.normal(size=(15, 4))), Measure.uniform(samples)
    t = 0.81
    interp = interpolate_approx(xi, mu, optimal_transport(xi, mu).plan, t)
    recovered = invert_interpolation(interpolant_sources(xi, interp, "approx"), interp.support, t)
    to_sample, to_point = _matches(recovered, samples)
    assert to_sample.max() < TOL and to_point.max() < TOL
    # the message itself is no sample: every interpolant atom is far from the data at this t
    assert _matches(interp.support, samples)[0].min() > 1e-3


def test_approx_interpolation_with_S_below_n_reveals_the_cell_means_pot_computes() -> None:
    """S < n: the inversion is the barycentric projection n·(P Y)_i of POT's exact plan, not a sample."""
    rng = np.random.default_rng(2)
    xi, mu = Measure.uniform(rng.normal(size=(5, 2))), Measure.uniform(rng.normal(size=(40, 2)))
    interp = interpolate_approx(xi, mu, optimal_transport(xi, mu).plan, 0.25)
    recovered = invert_interpolation(xi.support, interp.support, 0.25)
    np.testing.assert_allclose(recovered, _pot_projection(xi, mu), rtol=0, atol=1e-10)


def test_invert_interpolation_rejects_a_time_outside_0_1() -> None:
    with pytest.raises(ValueError, match="t must lie in"):
        invert_interpolation(np.zeros((2, 2)), np.ones((2, 2)), 0.0)


# ---------------------------------------------------------------------------------------------- times


def _rounds_with_times(times: list[float], mu: Measure, rng: np.random.Generator, S: int = 6
                       ) -> list[InterpolationRound]:
    rounds = []
    for t in times:
        xi = Measure.uniform(rng.normal(scale=2.0, size=(S, mu.dim)))
        rounds.append(InterpolationRound(xi, interpolate_approx(xi, mu, optimal_transport(xi, mu).plan, t)))
    return rounds


def test_means_estimator_recovers_chosen_times_and_the_client_mean() -> None:
    rng = np.random.default_rng(3)
    mu = Measure.uniform(rng.normal(size=(30, 4)) + 0.7)
    chosen = [0.3, 0.72, 0.55, 0.08]
    rounds = _rounds_with_times(chosen, mu, rng)
    est = estimate_times_from_means([r.source for r in rounds], [r.interpolant for r in rounds])
    assert est is not None and est.methods == ("means",) * 4
    np.testing.assert_allclose(est.times, chosen, rtol=1e-8)
    np.testing.assert_allclose(est.client_mean, mu.support.mean(axis=0), rtol=0, atol=1e-9)
    assert est.residual < 1e-9


def test_means_estimator_needs_two_rounds() -> None:
    rng = np.random.default_rng(4)
    rounds = _rounds_with_times([0.4], Measure.uniform(rng.normal(size=(10, 3))), rng)
    assert estimate_times_from_means([r.source for r in rounds], [r.interpolant for r in rounds]) is None


def test_coincidence_estimator_reads_t_from_atoms_sent_to_one_sample() -> None:
    x = np.array([[0.0, 0.0], [2.0, 1.0], [-1.0, 3.0], [4.0, -2.0]])
    y = np.array([[5.0, 5.0], [5.0, 5.0], [-3.0, 1.0], [1.0, 6.0]])  # atoms 0 and 1 go to the same sample
    t = 0.42
    z = (1 - t) * x + t * y
    assert estimate_time_from_coincidences(x, z) == pytest.approx(t, rel=1e-10)
    y_distinct = y + np.array([[0.0, 0.0], [0.3, -0.2], [0.0, 0.0], [0.0, 0.0]])
    assert estimate_time_from_coincidences(x, (1 - t) * x + t * y_distinct) is None
    assert estimate_time_from_coincidences(x[:, :1], z[:, :1]) is None  # d = 1: every pair would qualify


def test_monitor_estimator_is_exact_on_the_geodesic() -> None:
    """Eq. 5 is a constant-speed geodesic: W(ξ, ξ_t) = t·W(ξ, μ), W(ξ_t, μ) = (1 − t)·W(ξ, μ)."""
    rng = np.random.default_rng(5)
    xi, mu = Measure.uniform(rng.normal(size=(6, 3))), Measure.uniform(rng.normal(size=(9, 3)) + 2.0)
    t = 0.64
    interp = interpolate_exact(xi, mu, optimal_transport(xi, mu).plan, t)
    monitor = [optimal_transport(mu, interp).cost]  # what the client reports: W(μ_c, ξ_c^k)
    assert estimate_times_from_monitor([xi], [interp], monitor)[0] == pytest.approx(t, rel=1e-8)


def test_distance_estimator_recovers_t_from_the_final_distance_for_exact_interpolation() -> None:
    rng = np.random.default_rng(6)
    xi, mu = Measure.uniform(rng.normal(size=(5, 3))), Measure.uniform(rng.normal(size=(8, 3)) + 1.0)
    t = 0.58
    interp = interpolate_exact(xi, mu, optimal_transport(xi, mu).plan, t)
    final = Measure.uniform(rng.normal(size=(7, 3)) + 3.0)
    d = optimal_transport(mu, final).cost  # d_{μ,ξ^K}, as the client reports it
    got = estimate_time_from_distance(InterpolationRound(xi, interp), final, d, "exact")
    assert got == pytest.approx(t, rel=1e-6)


def test_estimate_times_prefers_a_known_t_and_falls_back_to_the_prior() -> None:
    rng = np.random.default_rng(7)
    rounds = _rounds_with_times([0.3], Measure.uniform(rng.normal(size=(20, 3))), rng)
    known = estimate_times(rounds, "approx", known_t=0.5)
    assert known.methods == ("known",) and known.times[0] == 0.5
    prior = estimate_times(rounds, "approx")  # one round, S < n, no distances: nothing identifies t
    assert prior.methods == ("prior",) and prior.times[0] == 0.5


# ---------------------------------------------------------------------------------------------- scores


def test_nn_scale_on_a_hand_built_line() -> None:
    assert nn_scale(np.array([[0.0], [1.0], [3.0], [7.0]])) == pytest.approx(1.5)  # NN distances 1, 1, 2, 4


def test_identity_reconstruction_scores_full_recovery_and_auc_one() -> None:
    rng = np.random.default_rng(8)
    x = rng.normal(size=(50, 3))
    s = reconstruction_scores(x.copy(), x, x + 100.0)
    assert (s.recovered_fraction, s.precise_fraction, s.median_error, s.membership_auc) == (1.0, 1.0, 0.0, 1.0)


def test_far_random_reconstruction_recovers_nothing() -> None:
    rng = np.random.default_rng(9)
    x = rng.normal(size=(50, 3))
    s = reconstruction_scores(rng.normal(size=(40, 3)) + 50.0, x, rng.normal(size=(50, 3)))
    assert s.recovered_fraction == 0.0 and s.precise_fraction == 0.0 and s.median_error > 10.0


def test_membership_auc_on_a_hand_computed_case() -> None:
    """Reconstructed {0}; members at 0 and 3, non-members at 1 and 5: 3 of the 4 member/non-member pairs are
    ordered right, AUC = 0.75; samples recovered within 0.5 × scale (scale 3): only the one at 0."""
    s = reconstruction_scores(np.array([[0.0]]), np.array([[0.0], [3.0]]), np.array([[1.0], [5.0]]))
    assert s.membership_auc == pytest.approx(0.75)
    assert s.scale == pytest.approx(3.0) and s.recovered_fraction == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------- labels


def test_feature_dim_of_both_augmentations() -> None:
    assert feature_dim(15, diagonal=True) == 5 and feature_dim(2 * 4 + 16, diagonal=False) == 4
    with pytest.raises(ValueError, match="label-augmented"):
        feature_dim(10, diagonal=True)


def test_decode_recovers_class_statistics_and_labels_a_mixed_cell_minus_one() -> None:
    m = np.array([[0.0, 1.0], [4.0, -2.0]])
    s = np.array([[1.0, 0.5], [2.0, 0.3]])
    parts = np.hstack([m, s])
    rng = np.random.default_rng(10)
    features = rng.normal(size=(7, 2))
    mixed = 0.3 * parts[0] + 0.7 * parts[1]
    label_parts = np.vstack([parts[0], parts[0], parts[1], parts[1], parts[1], mixed, mixed])
    decoded = decode_label_augmented(np.hstack([features, label_parts]), diagonal=True)
    assert decoded.class_means.shape == (2, 2)
    order = np.argsort(decoded.class_means[:, 0])
    np.testing.assert_allclose(decoded.class_means[order], m, atol=1e-12)
    np.testing.assert_allclose(decoded.class_sqrt_covs[order], s, atol=1e-12)
    np.testing.assert_allclose(decoded.class_covariances[order][1], np.diag(s[1] ** 2), atol=1e-12)
    labels = decoded.labels
    assert labels[0] == labels[1] != labels[2] == labels[3] == labels[4] and labels[5] == labels[6] == -1
    np.testing.assert_array_equal(decoded.features, features)


# ---------------------------------------------------------------------------------------------- FedBary


def _bary_round(gamma: Measure, P: Measure, Q: Measure, t: float, s: float, t2: float) -> BaryRound:
    eta_p = interpolate_approx(gamma, P, optimal_transport(gamma, P).plan, t)
    eta_q = interpolate_approx(gamma, Q, optimal_transport(gamma, Q).plan, s)
    nxt = interpolate_approx(eta_p, eta_q, optimal_transport(eta_p, eta_q).plan, t2)
    return BaryRound(gamma, eta_q, nxt)


def test_fedbary_round_inverts_to_the_barycentric_projection_onto_the_client() -> None:
    rng = np.random.default_rng(11)
    P = Measure.uniform(rng.normal(size=(12, 3)) + 2.0)
    Q = Measure.uniform(rng.normal(size=(9, 3)))
    gamma = Measure.uniform(rng.normal(size=(12, 3)))
    r = _bary_round(gamma, P, Q, t=0.6, s=0.3, t2=0.45)
    recovered = invert_fedbary_round(r, 0.6, 0.45)
    np.testing.assert_allclose(recovered, _pot_projection(gamma, P), rtol=0, atol=1e-9)
    to_sample, to_point = _matches(recovered, P.support)  # S = n: the samples themselves
    assert to_sample.max() < 1e-9 and to_point.max() < 1e-9


def test_fedbary_times_and_client_mean_from_the_means_while_the_barycenter_moves() -> None:
    rng = np.random.default_rng(12)
    P = Measure.uniform(rng.normal(size=(20, 5)) + 1.0)
    chosen = [(0.2, 0.7), (0.65, 0.3), (0.5, 0.5)]
    rounds = [_bary_round(Measure.uniform(rng.normal(scale=2.0, size=(8, 5))), P,
                          Measure.uniform(rng.normal(size=(15, 5)) + rng.normal(size=5)),  # Q moves every round
                          t, float(rng.uniform()), t2)
              for t, t2 in chosen]
    est = estimate_fedbary_times(rounds)
    assert est is not None and est.methods == ("means",) * 3
    np.testing.assert_allclose(est.times, [c[0] for c in chosen], rtol=1e-8)
    np.testing.assert_allclose(est.update_times, [c[1] for c in chosen], rtol=1e-8)
    np.testing.assert_allclose(est.client_mean, P.support.mean(axis=0), atol=1e-9)


def test_fedbary_times_are_not_identified_against_a_fixed_validation_set() -> None:
    """Every round's plane holds γ̄, Q̄ and m_P: with one Q they share the line Q̄–m_P, which pins no point."""
    rng = np.random.default_rng(15)
    P, Q = Measure.uniform(rng.normal(size=(20, 5)) + 1.0), Measure.uniform(rng.normal(size=(15, 5)))
    rounds = [_bary_round(Measure.uniform(rng.normal(scale=2.0, size=(8, 5))), P, Q, t, 0.4, 0.6)
              for t in (0.2, 0.5, 0.8)]
    assert estimate_fedbary_times(rounds) is None


def test_attack_fedbary_refuses_exact_interpolation() -> None:
    with pytest.raises(ValueError, match="approximate interpolation"):
        attack_fedbary(ServerView((), ()), "c", FedBaryConfig(interpolation="exact"))


# ---------------------------------------------------------------------------------------------- end to end


def test_server_view_needs_a_channel_that_keeps_messages() -> None:
    with pytest.raises(ValueError, match="keep_inbox"):
        server_view(Channel())


@pytest.mark.parametrize("t", ["random", 0.35])
def test_fedwad_protocol_transcript_alone_reveals_every_sample_when_S_equals_n(t) -> None:
    """The library's own FedWaD run over a ledgered channel: no message carries a sample, yet the server's
    transcript inverts to every sample of client μ — random t included (means estimator)."""
    rng = np.random.default_rng(13)
    x, other = rng.normal(size=(30, 3)), rng.normal(size=(30, 3)) + 1.0
    config = FedWaDConfig(support_size=30, iterations=3, t=t)
    channel = Channel(keep_inbox=True)
    federated_wasserstein(x, other, config, seed=3, channel=channel)
    view = server_view(channel)
    sent_arrays = [a for m in view.received + view.sent for a in m.arrays() if a.ndim == 2]
    assert min(_matches(a, x)[0].min() for a in sent_arrays) > 1e-6  # no raw sample crossed the boundary
    rec = attack_fedwad(view, "client_mu", config, use_known_t=(t != "random"))
    truth = [float((_mean(r.interpolant) - _mean(r.source)) @ (x.mean(0) - _mean(r.source)))
             / float(np.sum((x.mean(0) - _mean(r.source)) ** 2)) for r in fedwad_rounds(view, "client_mu")]
    np.testing.assert_allclose(rec.times.times, truth, rtol=1e-8)
    scores = reconstruction_scores(rec.points, x, rng.normal(size=(30, 3)))
    assert scores.recovered_fraction == 1.0 and scores.precise_fraction == 1.0 and scores.membership_auc == 1.0
    assert _matches(rec.of_round(1), x)[1].max() < 1e-8  # one round is enough


def test_fedwad_with_S_much_below_n_leaks_only_cell_means() -> None:
    rng = np.random.default_rng(14)
    x, other = rng.normal(size=(80, 3)), rng.normal(size=(80, 3)) + 1.0
    config = FedWaDConfig(support_size=5, iterations=3)
    channel = Channel(keep_inbox=True)
    federated_wasserstein(x, other, config, seed=4, channel=channel)
    rec = attack_fedwad(server_view(channel), "client_mu", config)
    assert rec.times.methods == ("means",) * 3
    np.testing.assert_allclose(rec.client_mean, x.mean(axis=0), atol=1e-9)  # the mean leaks exactly
    scores = reconstruction_scores(rec.points, x, rng.normal(size=(80, 3)))
    assert scores.recovered_fraction <= 0.1


@pytest.mark.parametrize("protocol", ["otdd", "fedbary"])
def test_labelled_protocols_leak_samples_labels_and_class_statistics(protocol: str) -> None:
    full = attack_experiment(AttackConfig(protocol=protocol, support_size=40, samples=40, dim=3, iterations=3))
    assert full.t_methods == "means" and full.t_error < 1e-8
    assert full.recovered_fraction == 1.0 and full.membership_auc == 1.0
    assert full.label_ari == 1.0 and full.classes_matched == 3
    few = attack_experiment(AttackConfig(protocol=protocol, support_size=6, samples=40, dim=3, iterations=3))
    assert few.classes_matched == 3  # class means and covariances leak even with S ≪ n
    assert few.recovered_fraction <= 0.2


def test_attack_experiment_is_deterministic_and_validates_its_config() -> None:
    config = AttackConfig(support_size=12, samples=24, dim=2, iterations=2, interpolation="exact", seed=5)
    first, second = attack_experiment(config), attack_experiment(config)
    assert repr(first.as_row()) == repr(second.as_row())  # NaN fields compare by their text
    assert first.recovered_fraction == 1.0  # eq. 5 gives every sample away
    with pytest.raises(ConfigError):
        AttackConfig(protocol="fedwad", supportsize=3)  # type: ignore[call-arg]


def test_module_example_runs() -> None:
    result = doctest.testmod(attack_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("bad", [dict(protocol="fedbary", interpolation="exact"),
                                 dict(protocol="otdd", samples=5, classes=3)])
def test_attack_config_rejects_experiments_it_cannot_run(bad: dict) -> None:
    with pytest.raises(ConfigError):
        AttackConfig(**bad)
