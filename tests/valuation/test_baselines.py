"""Valuation baselines against games with known Shapley values and brute force."""
from __future__ import annotations

from itertools import permutations
from math import factorial

import numpy as np
import pytest

from otfed.valuation import (ExactShapley, KNNShapley, LeaveOneOut, PermutationShapley, TruncatedMonteCarloShapley,
                             ValuationData, classifier_accuracy, knn_leave_one_out, knn_utility)


def players(n: int) -> ValuationData:
    """n players; column 0 of x carries a per-player number used by the test games."""
    return ValuationData(x=np.arange(n, dtype=float)[:, None] + 1.0, y=np.zeros(n, dtype=int))


def additive(data: ValuationData, coalition: np.ndarray) -> float:
    return float(data.x[coalition, 0].sum())


def squared_size(data: ValuationData, coalition: np.ndarray) -> float:
    return float(len(coalition) ** 2)


def glove(data: ValuationData, coalition: np.ndarray) -> float:
    """Player 0 holds a left glove, players 1 and 2 right gloves; a pair is worth 1.
    Known Shapley values: (2/3, 1/6, 1/6)."""
    s = set(coalition.tolist())
    return float(min(len(s & {0}), len(s & {1, 2})))


def brute_force_shapley(utility, data: ValuationData) -> np.ndarray:
    """Average of marginal contributions over all n! orderings (independent of the bitmask formula)."""
    n = data.n
    values = np.zeros(n)
    for order in permutations(range(n)):
        for pos, i in enumerate(order):
            before = np.array(order[:pos], dtype=np.intp)
            values[i] += utility(data, np.append(before, i).astype(np.intp)) - utility(data, before)
    return values / factorial(n)


def test_exact_shapley_known_games() -> None:
    np.testing.assert_allclose(ExactShapley(additive).fit(players(6)), np.arange(1, 7), rtol=1e-12)
    np.testing.assert_allclose(ExactShapley(squared_size).fit(players(5)), [5.0] * 5, rtol=1e-12)  # N²/N
    np.testing.assert_allclose(ExactShapley(glove).fit(players(3)), [2 / 3, 1 / 6, 1 / 6], rtol=1e-12)
    with pytest.raises(ValueError, match="max_players"):
        ExactShapley(additive, max_players=4).fit(players(5))


def test_leave_one_out_known_games() -> None:
    np.testing.assert_allclose(LeaveOneOut(additive).fit(players(4)), [1, 2, 3, 4])
    np.testing.assert_allclose(LeaveOneOut(glove).fit(players(3)), [1, 0, 0])  # redundancy hides the right gloves


def test_permutation_shapley_exact_on_additive_and_converges_on_glove() -> None:
    np.testing.assert_allclose(PermutationShapley(additive, n_permutations=3).fit(players(5)), np.arange(1, 6))
    estimate = PermutationShapley(glove, n_permutations=3000, seed=1).fit(players(3))
    np.testing.assert_allclose(estimate, [2 / 3, 1 / 6, 1 / 6], atol=0.02)
    np.testing.assert_allclose(estimate.sum(), 1.0)  # efficiency holds for every permutation


@pytest.mark.parametrize("k", [1, 3])
def test_knn_shapley_recursion_matches_brute_force(k: int) -> None:
    rng = np.random.default_rng(k)
    data = ValuationData(x=rng.standard_normal((6, 2)), y=rng.integers(0, 2, 6),
                         x_val=rng.standard_normal((3, 2)), y_val=rng.integers(0, 2, 3))
    utility = knn_utility(k)
    recursion = KNNShapley(k).fit(data)
    np.testing.assert_allclose(recursion, brute_force_shapley(utility, data), atol=1e-12)
    np.testing.assert_allclose(recursion, ExactShapley(utility).fit(data), atol=1e-12)
    np.testing.assert_allclose(recursion.sum(), utility(data, np.arange(6)), atol=1e-12)  # efficiency


def test_knn_shapley_penalises_a_mislabelled_point() -> None:
    rng = np.random.default_rng(5)
    x = np.vstack([rng.normal(-2, 0.5, (20, 2)), rng.normal(2, 0.5, (20, 2))])
    y = np.repeat([0, 1], 20)
    y[3] = 1  # a class-0 point labelled 1
    xv = np.vstack([rng.normal(-2, 0.5, (20, 2)), rng.normal(2, 0.5, (20, 2))])
    values = KNNShapley(5).fit(ValuationData(x, y, xv, np.repeat([0, 1], 20)))
    assert int(np.argmin(values)) == 3 and values[3] < 0


def test_classifier_accuracy_utility_edge_cases() -> None:
    from sklearn.neighbors import KNeighborsClassifier

    data = ValuationData(x=np.array([[0.0], [1.0], [10.0], [11.0]]), y=np.array([0, 0, 1, 1]),
                         x_val=np.array([[0.5], [10.5], [9.0]]), y_val=np.array([0, 1, 1]))
    utility = classifier_accuracy(lambda: KNeighborsClassifier(n_neighbors=1))
    assert utility(data, np.array([], dtype=int)) == 0.0
    assert utility(data, np.array([0, 1])) == pytest.approx(1 / 3)  # single class: predicts 0
    assert utility(data, np.arange(4)) == 1.0


def test_fast_knn_leave_one_out_matches_the_definition() -> None:
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(40, 3)), 1)  # rounding makes distance ties
    y = rng.integers(0, 3, 40)
    data = ValuationData(x, y, np.round(rng.normal(size=(25, 3)), 1), rng.integers(0, 3, 25))
    for k in (1, 3, 5):
        assert np.allclose(knn_leave_one_out(data, k), LeaveOneOut(knn_utility(k)).fit(data), atol=1e-12)
    tiny = ValuationData(x[:3], y[:3], data.x_val, data.y_val)  # fewer than K + 1 points
    assert np.allclose(knn_leave_one_out(tiny, 5), LeaveOneOut(knn_utility(5)).fit(tiny), atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# TMC-Shapley (Ghorbani & Zou 2019)


class CountingUtility:
    """Wraps a utility and counts its calls."""

    def __init__(self, utility) -> None:
        self.utility = utility
        self.calls = 0

    def __call__(self, data: ValuationData, coalition: np.ndarray) -> float:
        self.calls += 1
        return self.utility(data, coalition)


def saturating(data: ValuationData, coalition: np.ndarray) -> float:
    """u(S) = min(|S|, 2)/2: any two players achieve everything; exact Shapley 1/N each."""
    return min(len(coalition), 2) / 2


def nonempty(data: ValuationData, coalition: np.ndarray) -> float:
    """u(S) = 1 for S ≠ ∅: only the first player of a permutation contributes; exact Shapley 1/N each."""
    return float(len(coalition) > 0)


def independent_successes(data: ValuationData, coalition: np.ndarray) -> float:
    """u(S) = 1 − Π_{i∈S} (1 − p_i) with p_i = x_i / 10: monotone, with ever smaller marginals."""
    return float(1.0 - np.prod(1.0 - data.x[coalition, 0] / 10.0))


def parity(data: ValuationData, coalition: np.ndarray) -> float:
    """u(S) = 1 + (|S| mod 2): with N even, ∅ and every even prefix have exactly u(N), yet the marginals
    that follow are ±1 (a truncation test with ≤ would stop every permutation at ∅)."""
    return float(1 + len(coalition) % 2)


@pytest.mark.parametrize("utility,n", [(glove, 3), (parity, 6), (saturating, 5), (nonempty, 4), (additive, 5)])
def test_tmc_with_zero_tolerance_is_permutation_shapley(utility, n: int) -> None:
    """tolerance 0 never truncates (strict test, as in Ghorbani & Zou's alg. 1) and the permutations are
    drawn identically: the same numbers bit for bit."""
    for seed in (0, 1, 2):
        tmc = TruncatedMonteCarloShapley(utility, n_permutations=50, tolerance=0.0, seed=seed).fit(players(n))
        np.testing.assert_array_equal(tmc, PermutationShapley(utility, n_permutations=50, seed=seed).fit(players(n)))


def test_tmc_truncation_is_exact_when_the_prefix_already_has_everything() -> None:
    """On u = min(|S|, 2)/2 and u = 1[S ≠ ∅] the truncated marginals are truly 0: the same values as
    untruncated permutation sampling, from 3 (resp. 2) evaluations per permutation instead of N + 1; on
    1[S ≠ ∅] within 4 binomial standard errors of the brute-force Shapley values 1/N."""
    P = 400
    for utility, n, per_permutation in ((saturating, 4, 3), (nonempty, 4, 2)):
        counted = CountingUtility(utility)
        tmc = TruncatedMonteCarloShapley(counted, n_permutations=P, tolerance=1e-6, seed=3).fit(players(n))
        counted_mc = CountingUtility(utility)
        mc = PermutationShapley(counted_mc, n_permutations=P, seed=3).fit(players(n))
        np.testing.assert_array_equal(tmc, mc)
        assert counted.calls == 1 + P * per_permutation and counted_mc.calls == P * (n + 1)
        np.testing.assert_allclose(tmc.sum(), 1.0)
    truth = brute_force_shapley(nonempty, players(4))
    np.testing.assert_allclose(truth, [0.25] * 4, atol=1e-12)
    P = 4000
    estimate = TruncatedMonteCarloShapley(nonempty, n_permutations=P, tolerance=1e-6, seed=4).fit(players(4))
    np.testing.assert_allclose(estimate, truth, atol=4 * np.sqrt(0.25 * 0.75 / P))


def test_tmc_truncation_error_is_within_the_tolerance_bound() -> None:
    """Monotone game: each truncated marginal lies in [0, u(N) − u(prefix)) ⊂ [0, tolerance · u(N)), so per
    player 0 ≤ (untruncated − truncated estimate) < tolerance · u(N) for the same permutations, and the
    values fall short of efficiency by less than that; truncation saves evaluations."""
    data = players(6)
    full = independent_successes(data, np.arange(6))
    for tolerance in (0.02, 0.1, 0.3):
        counted = CountingUtility(independent_successes)
        tmc = TruncatedMonteCarloShapley(counted, n_permutations=300, tolerance=tolerance, seed=5).fit(data)
        mc = PermutationShapley(independent_successes, n_permutations=300, seed=5).fit(data)
        gap = mc - tmc
        assert np.all(gap >= -1e-15) and np.all(gap < tolerance * full) and gap.max() > 0
        assert 0 <= full - independent_successes(data, np.array([], dtype=int)) - tmc.sum() < tolerance * full
        assert counted.calls < 300 * 7
