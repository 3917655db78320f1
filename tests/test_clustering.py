"""Spectral clustering of clients from distances recovers a planted block structure (ARI = 1)."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.clustering import rescaled_similarity, spectral_clusters
from otfed.metrics import adjusted_rand_index, order_preservation


def planted_distances(groups: np.ndarray, rng: np.random.Generator, within: float = 1.0,
                      between: float = 10.0) -> np.ndarray:
    same = groups[:, None] == groups[None, :]
    d = np.where(same, within, between) + rng.uniform(0, 0.5, size=(len(groups), len(groups)))
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    return d


@pytest.mark.parametrize("affinity, k", [("precomputed", 0), ("knn", 3), ("knn", 5)])
def test_planted_blocks_are_recovered(affinity: str, k: int) -> None:
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(5), 4)
    rng.shuffle(groups)
    d = planted_distances(groups, rng, between=1e4)  # > 5000: the authors' affinity would go negative
    pred = spectral_clusters(d, 5, affinity=affinity, n_neighbors=max(k, 1), seed=0)
    assert adjusted_rand_index(groups, pred) == 1.0


def test_rescaled_similarity_is_in_unit_interval() -> None:
    d = np.array([[0, 3, 6000], [3, 0, 2], [6000, 2, 0]], dtype=float)
    a = rescaled_similarity(d)
    assert a.min() == 0.0 and a.max() == 1.0 and np.allclose(a, a.T)


def test_bad_distance_matrices_are_rejected() -> None:
    with pytest.raises(ValueError, match="NaN"):
        spectral_clusters(np.array([[0, np.nan], [np.nan, 0]]), 2)
    with pytest.raises(ValueError, match="square"):
        spectral_clusters(np.zeros((2, 3)), 2)
    with pytest.raises(ValueError, match="n_clusters"):
        spectral_clusters(np.zeros((3, 3)), 4)


def test_ari_and_order_preservation_against_hand_values() -> None:
    assert adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == 1.0
    ref = np.array([[0, 1, 2], [1, 0, 3], [2, 3, 0]], dtype=float)
    assert order_preservation(ref, 2 * ref + 1) == 1.0
    # swapping the two largest distances breaks exactly 1 of the 3 pairwise comparisons
    est = np.array([[0, 1, 3], [1, 0, 2], [3, 2, 0]], dtype=float)
    assert order_preservation(ref, est) == pytest.approx(2 / 3)
