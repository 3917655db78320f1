"""Client clustering from a federated distance matrix (FedWaD §5 "boosting FL").

Server-side: takes only the matrix of pairwise federated OTDDs between clients, never client data.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from sklearn.cluster import SpectralClustering


def rescaled_similarity(distances: np.ndarray) -> np.ndarray:
    """Affinity A = 1 − D / max(D) ∈ [0, 1] (the paper's "precomputed rescaled similarity").

    The authors' code uses (5000 − D)/5000, which turns negative — ill-defined for spectral clustering —
    as soon as a distance exceeds 5000; scaling by the observed maximum keeps A in [0, 1].
    """
    d = _check_distances(distances)
    top = d.max()
    return np.ones_like(d) if top == 0 else 1.0 - d / top


def spectral_clusters(distances: np.ndarray, n_clusters: int,
                      affinity: Literal["precomputed", "knn"] = "precomputed",
                      n_neighbors: int = 5, seed: int = 0) -> np.ndarray:
    """Spectral clustering of clients from their pairwise distances.

    ``precomputed``: affinity = :func:`rescaled_similarity`; ``knn``: sparse symmetrised kNN graph built
    from the distances (sklearn ``precomputed_nearest_neighbors``) with ``n_neighbors`` (paper: 3 or 5).
    """
    d = _check_distances(distances)
    n = d.shape[0]
    if not 2 <= n_clusters <= n:
        raise ValueError(f"n_clusters must be in [2, {n}] for {n} clients, got {n_clusters}")
    if affinity == "precomputed":
        model = SpectralClustering(n_clusters=n_clusters, affinity="precomputed", assign_labels="kmeans",
                                   n_init=10, random_state=seed)
        return model.fit_predict(rescaled_similarity(d))
    if affinity == "knn":
        if not 1 <= n_neighbors < n:
            raise ValueError(f"n_neighbors must be in [1, {n - 1}], got {n_neighbors}")
        model = SpectralClustering(n_clusters=n_clusters, affinity="precomputed_nearest_neighbors",
                                   n_neighbors=n_neighbors, assign_labels="kmeans", n_init=10,
                                   random_state=seed)
        return model.fit_predict(d)
    raise ValueError(f"affinity must be 'precomputed' or 'knn', got {affinity!r}")


def _check_distances(distances: np.ndarray) -> np.ndarray:
    d = np.asarray(distances, dtype=float)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distance matrix must be square, got shape {d.shape}")
    if not np.all(np.isfinite(d)):
        raise ValueError("distance matrix contains NaN/inf (a degenerate client?)")
    if np.any(d < -1e-12):
        raise ValueError("distance matrix has negative entries")
    return 0.5 * (d + d.T)
