"""Membership inference scores (otfed.privacy.membership) against brute force and scikit-learn: the AUC is the
fraction of (member, non-member) pairs ordered right (ties ½), equal to sklearn's ROC AUC; the advantage is the
best TPR − FPR over every threshold, counted by hand; the loss attack reads log p(y | x)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from otfed.privacy.membership import (confidence_scores, loss_scores, membership_advantage, membership_auc,
                                      membership_inference)


def _brute_auc(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean([1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b]))


def _brute_advantage(a: np.ndarray, b: np.ndarray) -> float:
    best = 0.0
    for tau in np.concatenate([a, b, [np.inf]]):
        best = max(best, float(np.mean(a >= tau) - np.mean(b >= tau)))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_auc_and_advantage_match_brute_force_and_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = np.round(rng.normal(0.5, 1.0, size=37), 1)  # rounding makes ties
    b = np.round(rng.normal(0.0, 1.0, size=23), 1)
    auc = membership_auc(a, b)
    assert auc == pytest.approx(_brute_auc(a, b), abs=1e-12)
    assert auc == pytest.approx(roc_auc_score(np.r_[np.ones(37), np.zeros(23)], np.r_[a, b]), abs=1e-12)
    assert membership_advantage(a, b) == pytest.approx(_brute_advantage(a, b), abs=1e-12)


def test_extremes() -> None:
    assert membership_auc([2.0, 3.0], [0.0, 1.0]) == 1.0 and membership_advantage([2.0, 3.0], [0.0, 1.0]) == 1.0
    assert membership_auc([1.0, 1.0], [1.0]) == 0.5 and membership_advantage([1.0, 1.0], [1.0]) == 0.0
    with pytest.raises(ValueError, match="at least one member"):
        membership_auc([], [1.0])


def test_loss_and_confidence_scores_read_the_right_entries() -> None:
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    assert loss_scores(p, np.array([1, 2])) == pytest.approx(np.log([0.2, 0.8]))
    assert confidence_scores(p) == pytest.approx([0.7, 0.8])
    with pytest.raises(ValueError, match="labels must lie in 0..2"):
        loss_scores(p, np.array([0, 3]))


def test_an_overconfident_teacher_is_caught_and_a_calibrated_one_is_not() -> None:
    """Members predicted with probability ~0.99 on their label, non-members ~0.6: both attacks separate them;
    the same distribution for both: AUC ≈ ½."""
    rng = np.random.default_rng(0)

    def probs(n: int, right: float) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 3, size=n)
        p = np.full((n, 3), (1 - right) / 2)
        p[np.arange(n), y] = right + rng.uniform(-0.01, 0.01, size=n)
        return p / p.sum(axis=1, keepdims=True), y

    caught = membership_inference(*probs(200, 0.99), *probs(200, 0.6))
    assert caught.loss_auc == 1.0 and caught.confidence_auc == 1.0 and caught.loss_advantage == 1.0
    same = membership_inference(*probs(400, 0.8), *probs(400, 0.8))
    assert abs(same.loss_auc - 0.5) < 0.06 and same.members == same.non_members == 400
