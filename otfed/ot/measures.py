"""Discrete probability measures (FedWaD §2.1): a support X (n×d) with weights w (n,) summing to one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Tolerance on |Σ w − 1| accepted by :class:`Measure`.
WEIGHT_SUM_TOL = 1e-8


@dataclass(frozen=True, eq=False)
class Measure:
    """A discrete measure μ = Σ_i w_i δ_{x_i} (FedWaD §2.1; stored as ``(X, w)``).

    ``support`` is an (n, d) float64 array of atoms, ``weights`` an (n,) float64 array of non-negative
    masses summing to 1 (within 1e-8). Both are converted to float64 and validated on construction;
    invalid input raises :class:`ValueError` naming the problem.

    Parameters:
        support: the atoms x_1..x_n, an (n, d) array (one row per atom; n ≥ 1, finite).
        weights: their masses w_1..w_n, an (n,) array, non-negative and summing to 1 within ``WEIGHT_SUM_TOL``.
            :meth:`uniform` gives the empirical measure (1/n) Σ_i δ_{x_i} of a sample.

    Raises ValueError naming the problem: wrong shapes, no atom, NaN / inf, a negative weight, a total mass ≠ 1.

    Three quarters of the mass at (1, 0): the mean Σ_i w_i x_i is (0.75, 0), as by hand; weights that do not
    sum to 1 are refused.

    >>> mu = Measure(np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([0.25, 0.75]))
    >>> mu.n, mu.dim, (mu.weights @ mu.support).tolist()
    (2, 2, [0.75, 0.0])
    >>> Measure(np.zeros((2, 1)), np.array([0.5, 0.6]))
    Traceback (most recent call last):
        ...
    ValueError: Measure weights must sum to 1 (within 1e-08), got 1.1
    """

    support: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        for name, value in (("support", self.support), ("weights", self.weights)):
            if np.iscomplexobj(value):  # a float64 cast would drop the imaginary part in silence
                raise ValueError(f"Measure {name} must be real, got a complex array")
        support = np.asarray(self.support, dtype=np.float64)
        weights = np.asarray(self.weights, dtype=np.float64)
        if support.ndim != 2:
            raise ValueError(f"Measure support must be a 2-D (n, d) array, got shape {support.shape}")
        if weights.ndim != 1:
            raise ValueError(f"Measure weights must be a 1-D (n,) array, got shape {weights.shape}")
        if support.shape[0] != weights.shape[0]:
            raise ValueError(
                f"Measure support has {support.shape[0]} atoms but weights has {weights.shape[0]} entries"
            )
        if support.shape[0] == 0:
            raise ValueError("Measure must have at least one atom")
        if not np.all(np.isfinite(support)):
            raise ValueError("Measure support contains NaN or inf")
        if not np.all(np.isfinite(weights)):
            raise ValueError("Measure weights contain NaN or inf")
        if np.any(weights < 0):
            raise ValueError(f"Measure weights must be >= 0, got min {weights.min():.3g}")
        total = float(weights.sum())
        if abs(total - 1.0) > WEIGHT_SUM_TOL:
            raise ValueError(f"Measure weights must sum to 1 (within {WEIGHT_SUM_TOL:g}), got {total!r}")
        object.__setattr__(self, "support", support)
        object.__setattr__(self, "weights", weights)

    @classmethod
    def uniform(cls, X: np.ndarray) -> "Measure":
        """The empirical measure (1/n) Σ_i δ_{x_i} of the rows of X.

        Parameters:
            X: the sample, an (n, d) array with n ≥ 1 (one atom per row).

        Returns:
            The :class:`Measure` with support X (as float64) and weights 1/n each.

        >>> Measure.uniform(np.arange(6.0).reshape(3, 2)).weights.tolist() == [1 / 3] * 3
        True
        """
        if np.iscomplexobj(X):  # a float64 cast would drop the imaginary part in silence
            raise ValueError("Measure support must be real, got a complex array")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"Measure support must be a 2-D (n, d) array, got shape {X.shape}")
        n = X.shape[0]
        if n == 0:
            raise ValueError("Measure must have at least one atom")
        return cls(X, np.full(n, 1.0 / n))

    @property
    def n(self) -> int:
        """Number of atoms."""
        return int(self.support.shape[0])

    @property
    def dim(self) -> int:
        """Dimension d of the ambient space."""
        return int(self.support.shape[1])

    def nbytes(self) -> int:
        """Bytes needed to send this measure: support plus weights (used by the message ledger)."""
        return int(self.support.nbytes + self.weights.nbytes)
