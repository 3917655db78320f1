"""Duplication robustness (FedBary table 3) against independent truths: POT's exact W between the same
empirical measure written with duplicated atoms is identical; FedBary run with the same seed gives the
same estimate (stated tolerance 1e-8 relative; measured ≤ 3e-13, also when a larger duplicated client makes
the ``auto`` solver switch to the semi-dual Newton solver); duplicating one datum changes the exact W by
at least the first-order (subgradient) bound δ·g — W_2² is convex in the weights with POT's dual as a
subgradient. (Not necessarily in the direction of g: on these data the most valuable datum, g < 0,
duplicated 10× — 5% of the mass on one point — overshoots and *increases* W_2², as the bound allows.)"""
from __future__ import annotations

import numpy as np
import ot
import pytest

from otfed.federation.fedbary import FedBaryConfig, fedbary_on_measures, federated_valuation
from otfed.federation.otdd import LabelledData, augmented_measure
from otfed.ot import Measure
from otfed.valuation import exact_wasserstein, mass_moved_by_duplication, repeated_dataset, repeated_datum
from stages.barycenter_valuation import duplication_robustness

FEDBARY_REL_TOL = 1e-8


def _labelled(name: str, n: int, shift: float, rng: np.random.Generator) -> LabelledData:
    y = np.repeat([0, 1], n // 2)
    x = rng.normal(size=(n, 3)) + shift + 3.0 * y[:, None]
    return LabelledData(name, x, y)


@pytest.fixture(scope="module")
def federation() -> tuple[list[LabelledData], LabelledData]:
    rng = np.random.default_rng(0)
    clients = [_labelled(f"c{i}", 200, 0.3 * i, rng) for i in range(3)]
    return clients, _labelled("server", 120, 0.0, rng)


def _pot_w2(X: np.ndarray, Y: np.ndarray) -> float:
    """W_2 between the uniform measures on the rows of X and Y, straight from POT."""
    a, b = np.full(len(X), 1.0 / len(X)), np.full(len(Y), 1.0 / len(Y))
    value, log = ot.emd2(a, b, ot.dist(X, Y), numItermax=10**8, log=True)
    assert log["result_code"] == 1
    return float(np.sqrt(value))


def test_duplicated_dataset_leaves_exact_w_unchanged(federation) -> None:
    clients, validation = federation
    P, Q = augmented_measure(clients[0]), augmented_measure(validation)
    base = _pot_w2(P.support, Q.support)
    for copies in (2, 3, 4):
        tiled = np.tile(P.support, (copies, 1))  # the raw duplicated rows, uniform weights
        assert _pot_w2(tiled, Q.support) == pytest.approx(base, rel=1e-9, abs=1e-9)
        assert exact_wasserstein(repeated_dataset(P, copies), Q) == pytest.approx(base, rel=1e-9, abs=1e-9)
    assert exact_wasserstein(P, Q) == pytest.approx(base, rel=1e-12)


@pytest.mark.parametrize("support", [5, 10])  # S = 5: from 3 copies on, the γ→P_i problems switch to semi-dual Newton
def test_fedbary_estimate_is_invariant_to_duplicating_a_dataset(federation, support: int) -> None:
    clients, validation = federation
    measures = [augmented_measure(c) for c in clients]
    Q = augmented_measure(validation)
    names = [c.name for c in clients]
    config = FedBaryConfig(support_size=support, iterations=5)
    for target in (Q, None):
        base = fedbary_on_measures(measures, names, config, target, seed=0).distances
        for copies in (2, 3, 4):
            current = [repeated_dataset(measures[0], copies), *measures[1:]]
            d = fedbary_on_measures(current, names, config, target, seed=0).distances
            np.testing.assert_allclose(d, base, rtol=FEDBARY_REL_TOL)


def test_fedbary_on_measures_is_seeded_like_federated_valuation(federation) -> None:
    clients, validation = federation
    config = FedBaryConfig(support_size=8, iterations=3)
    expected = federated_valuation(clients, config, validation=validation, seed=3)
    got = fedbary_on_measures([augmented_measure(c) for c in clients], [c.name for c in clients], config,
                              augmented_measure(validation), seed=3)
    np.testing.assert_array_equal(got.distances, expected.distances)


def test_mass_moved_by_duplication_matches_the_new_weights() -> None:
    n, copies, index = 7, 4, 2
    P = Measure.uniform(np.arange(n, dtype=float)[:, None])
    dup = repeated_datum(P, index, copies)
    assert dup.n == n + copies - 1
    # collapse the copies back onto the original atoms: the datum holds copies/(n + copies − 1)
    mass = np.array([dup.weights[np.isclose(dup.support[:, 0], j)].sum() for j in range(n)])
    delta = mass_moved_by_duplication(n, copies)
    direction = np.full(n, -1.0 / (n - 1))
    direction[index] = 1.0
    np.testing.assert_allclose(mass, P.weights + delta * direction, rtol=1e-12)
    assert mass[index] == pytest.approx(copies / (n + copies - 1))
    with pytest.raises(ValueError, match="uniform"):
        repeated_datum(Measure(P.support, np.r_[0.4, np.full(n - 1, 0.1)]), 0, 2)


def test_duplicating_one_datum_changes_exact_w_by_at_least_the_subgradient_bound(federation) -> None:
    clients, validation = federation
    P, Q = augmented_measure(clients[1]), augmented_measure(validation)
    a, b = P.weights, Q.weights
    M = ot.dist(P.support, Q.support)
    value, log = ot.emd2(a, b, M, numItermax=10**8, log=True)
    f = log["u"]
    g = f - (f.sum() - f) / (len(f) - 1)  # calibrated gradient from POT's duals, written out
    copies = 11
    delta = mass_moved_by_duplication(P.n, copies)
    for index in (int(np.argmin(g)), int(np.argmax(g))):
        X = np.vstack([P.support, np.repeat(P.support[index:index + 1], copies - 1, axis=0)])
        w2 = _pot_w2(X, Q.support) ** 2
        assert exact_wasserstein(repeated_datum(P, index, copies), Q) ** 2 == pytest.approx(w2, rel=1e-9)
        change = w2 - value
        assert abs(change) > 1e-3 * value  # duplicating one datum does change the distance
        assert change >= delta * g[index] - 1e-9 * value  # convexity: the first-order term is a lower bound


def test_duplication_robustness_rows(federation) -> None:
    # potential="exact": on these two well-separated 3-D clusters the Sinkhorn potential (ε = 0.1·mean cost)
    # needs > 20,000 iterations against η_Q; the stage's PCA features converge
    clients, validation = federation
    config = FedBaryConfig(support_size=10, iterations=4, potential="exact")
    client, rows, spread = duplication_robustness(clients, validation, client=0, copies=[1, 2, 3], datum_copies=6,
                                                  config=config, seed=0, seed_repeats=2)
    assert client == clients[0].name
    by = {(r["experiment"], r["stats"], r["datum"], r["copies"]): r for r in rows}
    base = by[("dataset", "original", "", 1)]
    P, Q = augmented_measure(clients[0]), augmented_measure(validation)
    assert base["exact_w"] == pytest.approx(_pot_w2(P.support, Q.support), rel=1e-9)
    for k in (2, 3):
        same = by[("dataset", "original", "", k)]
        assert same["atoms"] == k * P.n
        assert abs(same["exact_w_rel_change"]) < 1e-9
        assert abs(same["fedbary_validation_rel_change"]) < FEDBARY_REL_TOL
        assert abs(same["fedbary_barycenter_rel_change"]) < FEDBARY_REL_TOL
        # refitted statistics: the unbiased class sd shrinks by √((n_c − 1)/n_c · k n_c/(k n_c − 1))
        # (n_c = 100 per class here); rebuild those points by hand and compare exact W
        refit = by[("dataset", "refit", "", k)]
        n_c = 100
        shrink = np.sqrt((n_c - 1) / n_c * k * n_c / (k * n_c - 1))
        hand = P.support.copy()
        hand[:, 6:] *= shrink  # [x (3) | m_y (3) | s_y (3)]
        assert refit["exact_w"] == pytest.approx(_pot_w2(hand, Q.support), rel=1e-9)
        assert refit["exact_w_rel_change"] != 0.0
    valuable = next(r for r in rows if r["datum"] == "most_valuable")
    harmful = next(r for r in rows if r["datum"] == "most_harmful")
    assert valuable["datum_value"] < 0 < harmful["datum_value"]
    assert valuable["atoms"] == harmful["atoms"] == P.n + 5
    for r in (valuable, harmful):
        assert r["exact_wp_change"] >= r["wp_change_first_order_bound"] - 1e-9
    assert len(spread["fedbary_validation"]) == len(spread["fedbary_barycenter"]) == 2
    assert spread["fedbary_validation"][0] == pytest.approx(base["fedbary_validation"], rel=1e-12)
