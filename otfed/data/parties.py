"""What each party of a stored federation holds, for stages that play every party in one process.

* :func:`client_sets` — every client's training split as :class:`~otfed.ot.otdd.LabelledData`.
* :func:`server_split` — the server's data: a validation set (FedBary's target Q) and a test set, both
  cut from the federation's server-side test split.
* :func:`project_federation` — the federation with features projected on a PCA fitted on the server's
  test split (the partition stage's rule: the server's public data, never client rows), or by a seeded
  Gaussian random projection (:func:`random_projection_federation`); :class:`FeatureProjection` — those
  settings as a params type.
* :func:`n_classes_of` — the number of classes a model over some label arrays needs.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from pydantic import Field, model_validator

from otfed.data.features import check_pca_components, fit_pca, reduce_features
from otfed.data.store import FederationData
from otfed.errors import ConfigError
from otfed.ot.otdd import LabelledData
from otfed.schema import Strict


def project_federation(fed: FederationData, n_components: int, seed: int, random_components: int = 0) -> FederationData:
    """The federation with features projected on a PCA fitted on its server-side test split (the
    partition stage's rule: the server's public data, never client rows), or — ``random_components`` > 0 —
    by a Gaussian random projection (:func:`random_projection_federation`). Both 0: unchanged."""
    if n_components and random_components:
        raise ValueError(f"federation {fed.name!r}: choose a PCA ({n_components} components) or a random "
                         f"projection ({random_components}), not both")
    if random_components:
        return random_projection_federation(fed, random_components, seed)
    if n_components == 0:
        return fed
    pca = fit_pca(fed.x_test.astype(np.float64), n_components, seed)
    return dataclasses.replace(fed, x=reduce_features(fed.x, pca).astype(np.float32),
                               x_test=reduce_features(fed.x_test, pca).astype(np.float32))


def random_projection_federation(fed: FederationData, n_components: int, seed: int) -> FederationData:
    """The federation with features mapped by one Gaussian random projection x ↦ Rᵀx, R ∈ ℝ^{d×k} with
    i.i.d. N(0, 1/k) entries drawn from ``seed`` (a public seed every party can draw R from: no data are
    involved). Johnson–Lindenstrauss: E‖Rᵀv‖² = ‖v‖² for every v, so distances — and the energy of
    isotropic feature noise, which a PCA fitted on clean data mostly discards — are kept up to
    O(1/√k) relative distortion. ``n_components=0``: unchanged."""
    if n_components == 0:
        return fed
    d = int(np.prod(fed.x.shape[1:]))
    if n_components >= d:
        raise ValueError(f"federation {fed.name!r}: random projection to {n_components} dimensions needs fewer "
                         f"than the {d} features")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x52505]))
    r = rng.normal(0.0, 1.0 / np.sqrt(n_components), size=(d, n_components))

    def project(x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64).reshape(len(x), d) @ r).astype(np.float32)

    return dataclasses.replace(fed, x=project(fed.x), x_test=project(fed.x_test))


class FeatureProjection(Strict):
    """How a stage maps the stored features before valuing them — the ``pca_components`` /
    ``random_projection`` keys of the FedBary stages' params groups (:func:`project_federation`)."""

    pca_components: int = Field(0, ge=0, description="0 = features as stored; else PCA fitted on the test split.")
    random_projection: int = Field(0, ge=0, description="0 = none; else a Gaussian random projection to this many "
                                   "dimensions (keeps distances and feature-noise energy; PCA-32 loses the noise).")

    @model_validator(mode="after")
    def _one_projection(self) -> "FeatureProjection":
        if self.pca_components and self.random_projection:
            raise ValueError("set pca_components or random_projection, not both (0 turns one off)")
        return self

    def check_fits(self, fed: FederationData, source: str | Path, group: str) -> None:
        """ConfigError naming ``<group>.pca_components`` or ``<group>.random_projection`` and what ``fed`` (read
        from ``source``) allows, unless :meth:`project` can map it: a PCA fitted on its test split takes at most
        min(test rows, features) components (:func:`~otfed.data.features.check_pca_components`), a random
        projection maps to fewer dimensions than the features (:func:`random_projection_federation`)."""
        n, d = fed.x_test.shape
        if self.pca_components:
            check_pca_components(self.pca_components, n, d, f"{group}.pca_components", f"the test split of {source}")
        if self.random_projection >= d:
            raise ConfigError(f"{group}.random_projection: {self.random_projection} dimensions, but {source} has {d} "
                              f"features; a projection maps to fewer (at most {d - 1})",
                              keys=(f"{group}.random_projection",))

    def project(self, fed: FederationData, seed: int) -> FederationData:
        """:func:`project_federation` with these settings."""
        return project_federation(fed, self.pca_components, seed, self.random_projection)


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
