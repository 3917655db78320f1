"""Evaluation metrics shared by the stages: clustering agreement and distance-order preservation.

(Classification metrics, Semantic Distance and detection precision/recall join this module with the
text-track and valuation issues.)
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import adjusted_rand_score as _ari


def adjusted_rand_index(labels_true: np.ndarray, labels_pred: np.ndarray) -> float:
    """ARI between a clustering and the true groups (1 = identical partitions, ≈0 = chance)."""
    return float(_ari(np.asarray(labels_true), np.asarray(labels_pred)))


def order_preservation(d_reference: np.ndarray, d_estimate: np.ndarray) -> float:
    """Fraction of order relations between pairwise distances kept by ``d_estimate`` (FedWaD fig. 6).

    Over all pairs of distinct off-diagonal entries {(i,j), (k,l)} of the upper triangle, the fraction
    for which sign(d_ref[i,j] − d_ref[k,l]) == sign(d_est[i,j] − d_est[k,l]). Ties in the reference
    are skipped.
    """
    d_reference = np.asarray(d_reference, dtype=float)
    d_estimate = np.asarray(d_estimate, dtype=float)
    if d_reference.shape != d_estimate.shape or d_reference.ndim != 2:
        raise ValueError("distance matrices must have the same square shape")
    iu = np.triu_indices_from(d_reference, k=1)
    ref, est = d_reference[iu], d_estimate[iu]
    a, b = np.triu_indices(len(ref), k=1)
    sref = np.sign(ref[a] - ref[b])
    sest = np.sign(est[a] - est[b])
    keep = sref != 0
    if not keep.any():
        return float("nan")
    return float(np.mean(sref[keep] == sest[keep]))
