"""Statistics the valuation stages report over seeds and noisy data, checked against independent truth:
ROC AUC against brute-force pair counting (and scikit-learn), the Student-t interval against SciPy's
``t.interval``, the memoized client game against the plain one, and the random projection's
Johnson–Lindenstrauss norm preservation."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from otfed.data.parties import project_federation, random_projection_federation
from otfed.data.store import FederationData
from otfed.metrics import mean_confidence_interval
from otfed.valuation import ExactShapley, LeaveOneOut, MemoizedUtility, PermutationShapley, ValuationData
from otfed.valuation import detection_auc


def _auc_by_pairs(s: np.ndarray, bad: np.ndarray) -> float:
    """P(s_noisy > s_clean) + ½ P(tie), by counting every (noisy, clean) pair."""
    pos, neg = s[bad], s[~bad]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auc_counts_pairs_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 6, size=80).astype(float)  # many ties
    bad = rng.random(80) < 0.3
    assert detection_auc(s, bad) == pytest.approx(_auc_by_pairs(s, bad), abs=1e-12)
    assert detection_auc(s, bad) == pytest.approx(roc_auc_score(bad, s), abs=1e-12)


def test_auc_extremes_and_errors() -> None:
    bad = np.array([False, False, True, True])
    assert detection_auc(np.array([0.0, 1.0, 2.0, 3.0]), bad) == 1.0
    assert detection_auc(np.array([3.0, 2.0, 1.0, 0.0]), bad) == 0.0
    assert detection_auc(np.ones(4), bad) == 0.5
    assert np.isnan(detection_auc(np.arange(4.0), np.zeros(4, dtype=bool)))
    with pytest.raises(ValueError, match="NaN"):
        detection_auc(np.array([0.0, np.nan, 1.0, 2.0]), bad)
    with pytest.raises(ValueError, match="one length"):
        detection_auc(np.arange(3.0), bad)


@pytest.mark.parametrize("values", [[0.71, 0.74, 0.69], [1.0, 2.0, 4.0, 8.0, 16.0], [-0.02, 0.01]])
def test_confidence_interval_matches_scipy(values: list[float]) -> None:
    x = np.asarray(values)
    mean, half = mean_confidence_interval(x)
    low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert mean == pytest.approx(x.mean(), abs=1e-15)
    assert mean - half == pytest.approx(low, rel=1e-12) and mean + half == pytest.approx(high, rel=1e-12)


def test_confidence_interval_edge_cases() -> None:
    mean, half = mean_confidence_interval([0.5])
    assert mean == 0.5 and np.isnan(half)
    assert mean_confidence_interval([1.0, np.nan, 3.0])[0] == 2.0  # NaNs dropped
    with pytest.raises(ValueError, match="no finite"):
        mean_confidence_interval([np.nan])
    with pytest.raises(ValueError, match="level"):
        mean_confidence_interval([1.0, 2.0], level=1.0)


def test_memoized_game_gives_the_plain_values_with_each_coalition_once() -> None:
    # a 4-player game with a known, non-additive worth: u(S) = (Σ_{i∈S} w_i)² (deterministic)
    w = np.array([1.0, 2.0, 3.0, 4.0])
    calls: list[tuple[int, ...]] = []

    def utility(data: ValuationData, coalition: np.ndarray) -> float:
        calls.append(tuple(sorted(int(i) for i in coalition)))
        return float(w[np.asarray(coalition, dtype=int)].sum() ** 2)

    players = ValuationData(np.arange(4.0)[:, None], np.zeros(4, dtype=np.int64))
    plain = [ExactShapley(utility).fit(players), LeaveOneOut(utility).fit(players),
             PermutationShapley(utility, 5, seed=3).fit(players)]
    calls.clear()
    memo = MemoizedUtility(utility)
    shared, seconds = [], []
    for valuer in (ExactShapley(memo), LeaveOneOut(memo), PermutationShapley(memo, 5, seed=3)):
        memo.start_method()
        shared.append(valuer.fit(players))
        seconds.append(memo.method_seconds())
    for a, b in zip(plain, shared):
        np.testing.assert_array_equal(a, b)
    assert len(calls) == len(set(calls)) == memo.evaluations == 16  # every coalition of 4 players, once
    # Shapley of (Σ w)²: φ_i = w_i · Σ_j w_j (closed form: efficiency + symmetry of the quadratic game)
    np.testing.assert_allclose(shared[0], w * w.sum(), rtol=1e-12)
    assert all(s >= 0 for s in seconds) and seconds[1] <= seconds[0] + 1e-9  # LOO touches a subset


def _federation(x: np.ndarray, x_test: np.ndarray) -> FederationData:
    n = len(x)
    return FederationData(name="f", x=x, y=np.zeros(n, dtype=np.int64), y_clean=np.zeros(n, dtype=np.int64),
                          client=np.zeros(n, dtype=np.int64), split=np.zeros(n, dtype=np.int8),
                          corrupted=np.zeros(n, dtype=bool), source_index=np.arange(n),
                          x_test=x_test, y_test=np.zeros(len(x_test), dtype=np.int64), client_names=("c0",),
                          client_group=np.zeros(1, dtype=np.int64))


def test_random_projection_keeps_distances_and_noise_energy() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 1024)).astype(np.float32)
    fed = _federation(x, x[:10])
    proj = random_projection_federation(fed, 256, seed=5)
    assert proj.x.shape == (200, 256) and proj.x_test.shape == (10, 256)
    np.testing.assert_array_equal(proj.x[:10], proj.x_test)  # one R for clients and server
    np.testing.assert_array_equal(proj.x, random_projection_federation(fed, 256, seed=5).x)  # seeded
    assert not np.array_equal(proj.x, random_projection_federation(fed, 256, seed=6).x)
    # Johnson–Lindenstrauss: ‖Rᵀ(x_i − x_j)‖² / ‖x_i − x_j‖² has mean 1 and sd √(2/k) ≈ 0.088
    d_raw = ((x[:100] - x[100:]) ** 2).sum(axis=1)
    d_proj = ((proj.x[:100] - proj.x[100:]).astype(np.float64) ** 2).sum(axis=1)
    ratio = d_proj / d_raw
    assert abs(ratio.mean() - 1.0) < 3 * np.sqrt(2 / 256) / np.sqrt(100)
    assert ratio.std() == pytest.approx(np.sqrt(2 / 256), rel=0.3)
    # isotropic noise: the projection keeps its energy; a PCA fitted on the (clean, rank-8) server data keeps
    # only the noise in those 8 directions, ≈ 8/1024 of it
    basis = np.linalg.qr(rng.normal(size=(1024, 8)))[0]
    clean = (rng.normal(size=(300, 8)) * 10) @ basis.T
    noise = rng.normal(size=(300, 1024))
    noisy = _federation((clean + noise).astype(np.float32), clean.astype(np.float32))
    base = _federation(clean.astype(np.float32), clean.astype(np.float32))
    for projected, kept in ((lambda f: random_projection_federation(f, 256, seed=1), (0.85, 1.15)),
                            (lambda f: project_federation(f, 8, seed=0), (0.0, 0.02))):
        energy = ((projected(noisy).x.astype(np.float64) - projected(base).x) ** 2).sum() / (noise ** 2).sum()
        assert kept[0] <= energy <= kept[1], energy
    assert project_federation(fed, 0, 0, random_components=0) is fed
    with pytest.raises(ValueError, match="not both"):
        project_federation(fed, 8, 0, random_components=16)
    with pytest.raises(ValueError, match="fewer than the 1024"):
        random_projection_federation(dataclasses.replace(fed), 1024, seed=0)
