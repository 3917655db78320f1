"""``attack_protocol``: a protocol run on GIVEN client arrays, attacked from the server's transcript and scored —
checked against truths computed here by brute force (nearest neighbours with numpy, POT's exact W2,
``dp-accounting`` called directly) and against the non-private protocol run with the same seed."""
from __future__ import annotations

import doctest

import dp_accounting
import numpy as np
import ot
import pytest
from dp_accounting.rdp import RdpAccountant

from otfed.federation import FedWaDConfig, federated_wasserstein
from otfed.federation.fedbary import FedBaryConfig
from otfed.ot.otdd import LabelledData
from otfed.privacy import attack as attack_module
from otfed.privacy.attack import ProtocolAttack, attack_protocol, reconstruction_scores
from otfed.privacy.dp import DPConfig


def _clients(seed: int, n: int = 30, d: int = 3, classes: int = 2) -> tuple[LabelledData, LabelledData, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(classes, d))
    y_a, y_b = np.arange(n) % classes, np.arange(n) % classes
    a = LabelledData("a", centres[y_a] + rng.normal(size=(n, d)), y_a)
    b = LabelledData("b", centres[y_b] + rng.normal(size=(n, d)) + 1.0, y_b)
    held = centres[np.arange(n) % classes] + rng.normal(size=(n, d))
    return a, b, held


def _brute_force_non_member_fraction(samples: np.ndarray, non_members: np.ndarray, threshold: float) -> float:
    """Non-members within threshold × (median NN distance of the samples) of a sample — the baseline a perfect
    reconstruction (= the samples themselves) reaches."""
    within = np.linalg.norm(samples[:, None] - samples[None], axis=2)
    np.fill_diagonal(within, np.inf)
    scale = np.median(within.min(axis=1))
    to_samples = np.linalg.norm(non_members[:, None] - samples[None], axis=2).min(axis=1)
    return float(np.mean(to_samples <= threshold * scale))


@pytest.mark.parametrize("protocol", ["fedwad", "otdd", "fedbary"])
@pytest.mark.parametrize("t", ["random", 0.4])
def test_S_equal_n_reveals_every_given_sample_and_the_baseline_is_brute_force(protocol: str, t) -> None:
    """S = n uniform: every plan a permutation (FedWaD theorem 1), every T(ξ_i) a sample; t public or estimated
    from the interpolants' means (K = 3). The baseline is the non-members' share near a sample, by brute force."""
    a, b, held = _clients(1)
    config = (FedBaryConfig if protocol == "fedbary" else FedWaDConfig)(support_size=30, iterations=3, t=t)
    out = attack_protocol(protocol, a, [b], held, config, seed=2)
    assert out.scores.recovered_fraction == 1.0 and out.scores.membership_auc == 1.0
    assert out.scores.median_error < 1e-8  # most reconstructed points are samples to rounding
    if protocol != "fedbary":  # FedWaD's rounds invert to samples only (FedBary: some γ atoms are mixtures)
        assert out.scores.precise_fraction == 1.0
    assert out.scores.non_member_fraction == _brute_force_non_member_fraction(a.x, held, 0.5)
    assert out.t_error < 1e-8 and out.t_methods == ("known" if t != "random" else "means")
    if protocol != "fedwad":  # labels and both classes' statistics leak with the samples
        assert out.label_ari == 1.0 and out.classes_matched == 2
    else:
        assert np.isnan(out.label_ari) and out.classes_matched == -1
    assert np.isnan(out.epsilon) and out.releases == 0  # no DP


def test_fedwad_estimate_is_the_protocols_own() -> None:
    a, b, held = _clients(3)
    config = FedWaDConfig(support_size=7, iterations=4)
    out = attack_protocol("fedwad", a, [b], held, config, seed=5)
    assert out.estimate == federated_wasserstein(a.x, b.x, config, seed=5).estimate
    assert out.points == 4 * 7  # S atoms per round, K rounds
    assert out.scores.recovered_fraction < 0.5  # S ≪ n: cell means, not samples


def test_dp_without_noise_is_fedwad_and_the_spent_epsilon_is_dp_accountings() -> None:
    """ε = ∞ with every record inside B(0, C): the DP session is FedWaD with the same seed (same ξ⁰ and t's);
    a finite ε: the ε the client reports equals dp-accounting's RDP ε for σ_mult and K + 1 releases."""
    a, b, held = _clients(4)
    config = FedWaDConfig(support_size=30, iterations=3, t=0.5)
    radius = float(max(np.linalg.norm(a.x, axis=1).max(), np.linalg.norm(b.x, axis=1).max())) + 1.0
    free = attack_protocol("fedwad", a, [b], held, config, seed=7,
                           dp=DPConfig(epsilon=np.inf, delta=1e-5, clip_radius=radius))
    plain = federated_wasserstein(a.x, b.x, config, seed=7).estimate
    assert free.estimate == pytest.approx(plain, rel=1e-12)
    assert free.scores.recovered_fraction == 1.0 and free.releases == 4 and free.epsilon == np.inf
    noisy = attack_protocol("fedwad", a, [b], held, config, seed=7,
                            dp=DPConfig(epsilon=2.0, delta=1e-5, clip_radius=radius))
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noisy.noise_multiplier), 4)
    assert noisy.epsilon == pytest.approx(RdpAccountant().compose(event).get_epsilon(1e-5), rel=1e-12)
    assert noisy.epsilon <= 2.0 and noisy.releases == 4
    assert noisy.scores.recovered_fraction < 0.2 and np.isnan(noisy.t_error)


def test_dp_fedbary_without_noise_is_fedbary_and_noise_defeats_the_attack() -> None:
    """Every FedBary client DP: at ε = ∞ with a ball no record leaves, the server's transcript — hence the
    attack and its scores — is the non-private one (same seed); at ε = 1 the attack recovers less than it does
    without DP (S = n and Q the federated barycenter: FedBary gives every sample away there)."""
    a, b, held = _clients(6)
    config = FedBaryConfig(support_size=30, iterations=3)
    validation = None
    plain = attack_protocol("fedbary", a, [b], held, config, seed=2, validation=validation)
    free = attack_protocol("fedbary", a, [b], held, config, seed=2, validation=validation,
                           dp=DPConfig(epsilon=float("inf"), clip_radius=1e6))
    assert free.scores == plain.scores and free.estimate == pytest.approx(plain.estimate, rel=1e-10)
    assert free.noise_multiplier == 0.0 and free.releases == 2 * 3 + 1
    noisy = attack_protocol("fedbary", a, [b], held, config, seed=2, validation=validation,
                            dp=DPConfig(epsilon=1.0, clip_radius=10.0))
    assert plain.scores.recovered_fraction == 1.0 and noisy.scores.recovered_fraction < 0.5
    assert 0.9 <= noisy.epsilon <= 1.0


def test_refuses_what_it_cannot_run() -> None:
    a, b, held = _clients(5)
    with pytest.raises(ValueError, match="FedWaD and FedBary, not for 'otdd'"):
        attack_protocol("otdd", a, [b], held, FedWaDConfig(support_size=5, iterations=2),
                        dp=DPConfig(epsilon=1.0, clip_radius=3.0))
    with pytest.raises(ValueError, match="FedBaryConfig"):
        attack_protocol("fedbary", a, [b], held, FedWaDConfig(support_size=5, iterations=2))
    with pytest.raises(ValueError, match="other client"):
        attack_protocol("fedwad", a, [], held, FedWaDConfig(support_size=5, iterations=2))
    with pytest.raises(ValueError, match="unknown protocol"):
        attack_protocol("knot", a, [b], held, FedWaDConfig(support_size=5, iterations=2))  # type: ignore[arg-type]


def test_non_member_fraction_on_a_hand_computed_case() -> None:
    """Samples 0, 1, 2, 3 on a line (median NN distance 1); non-members at 0.2 (within 0.5 of a point) and 5."""
    samples = np.array([[0.0], [1.0], [2.0], [3.0]])
    scores = reconstruction_scores(samples, samples, np.array([[0.2], [5.0]]))
    assert scores.non_member_fraction == 0.5 and scores.recovered_fraction == 1.0


def test_row_flattens_the_scores() -> None:
    a, b, held = _clients(6)
    out = attack_protocol("fedwad", a, [b], held, FedWaDConfig(support_size=30, iterations=2, t=0.5), seed=1)
    row = out.as_row()
    assert isinstance(out, ProtocolAttack) and "scores" not in row
    assert row["recovered_fraction"] == 1.0 and row["estimate"] == out.estimate and row["threshold"] == 0.5


def test_exact_w2_reference_is_pots() -> None:
    """The estimate converges to POT's exact W2 at S = n (the reference the stage's DP table uses)."""
    a, b, held = _clients(8, n=20)
    out = attack_protocol("fedwad", a, [b], held, FedWaDConfig(support_size=20, iterations=30), seed=0)
    w2 = float(np.sqrt(ot.emd2(ot.unif(20), ot.unif(20), ot.dist(a.x, b.x), numItermax=10**7)))
    assert out.estimate >= w2 * (1 - 1e-9) and out.estimate == pytest.approx(w2, rel=0.05)


def test_module_examples_still_run() -> None:
    result = doctest.testmod(attack_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
