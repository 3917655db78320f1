"""Valuation baselines against games with known Shapley values and brute force."""
from __future__ import annotations

from itertools import permutations
from math import factorial

import numpy as np
import pytest

from otfed.valuation import (ExactShapley, KNNShapley, LeaveOneOut, PermutationShapley, ValuationData,
                             classifier_accuracy, knn_leave_one_out, knn_utility)


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
