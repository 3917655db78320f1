"""What each party of a stored federation holds, for stages that play every party in one process.

* :func:`client_sets` — every client's training split as :class:`~otfed.ot.otdd.LabelledData`.
* :func:`server_split` — the server's data: a validation set (FedBary's target Q) and a test set, both
  cut from the federation's server-side test split.
* :func:`project_federation` — the federation with features projected on a PCA fitted on the server's
  test split (the partition stage's rule: the server's public data, never client rows).
* :func:`n_classes_of` — the number of classes a model over some label arrays needs.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from otfed.data.features import fit_pca, reduce_features
from otfed.data.store import FederationData
from otfed.ot.otdd import LabelledData


def project_federation(fed: FederationData, n_components: int, seed: int) -> FederationData:
    """The federation with features projected on a PCA fitted on its server-side test split (the
    partition stage's rule: the server's public data, never client rows). ``n_components=0``: unchanged."""
    if n_components == 0:
        return fed
    pca = fit_pca(fed.x_test.astype(np.float64), n_components, seed)
    return dataclasses.replace(fed, x=reduce_features(fed.x, pca).astype(np.float32),
                               x_test=reduce_features(fed.x_test, pca).astype(np.float32))


def client_sets(fed: FederationData) -> list[LabelledData]:
    """Every client's training split as LabelledData (float64 features), in client order."""
    return [LabelledData(fed.client_names[k], *fed.client_data(k)) for k in range(fed.n_clients)]


def server_split(fed: FederationData, n_validation: int) -> tuple[LabelledData, tuple[np.ndarray, np.ndarray]]:
    """The server's data: the first ``n_validation`` rows of the test split are its validation set, the
    rest its test (holdout) set."""
    n = len(fed.y_test)
    if not 0 < n_validation < n:
        raise ValueError(f"federation {fed.name!r}: validation_samples={n_validation} must be in 1..{n - 1} "
                         f"(its test split has {n} rows)")
    x, y = fed.x_test.astype(np.float64), fed.y_test
    return LabelledData("server_validation", x[:n_validation], y[:n_validation]), (x[n_validation:], y[n_validation:])


def n_classes_of(*labels: np.ndarray) -> int:
    """1 + the largest label in any of the (non-empty) label arrays: the classes a model must output."""
    return int(max(int(np.max(y)) for y in labels if len(y))) + 1
