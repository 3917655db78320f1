"""Typed messages: the only things that cross the client/server boundary.

A message carries a discrete measure (an interpolating measure, never raw samples), a scalar (a distance),
a client's first two moments (:class:`MomentMessage`, for a lower bound of W₂), or a KNOT payload. Its size
in bytes and its shape are what the ledger records.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from otfed.ot import Measure

SERVER = "server"


@dataclass(frozen=True)
class Message:
    """Base message: who sent it to whom, and which protocol step it belongs to (``kind``)."""

    kind: str
    sender: str
    receiver: str

    payload_type: ClassVar[str] = "none"

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Every array in the payload (what the privacy test inspects)."""
        return ()

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the payload's main array (a measure's support, a prediction matrix, …)."""
        arrays = self.arrays()
        return tuple(arrays[0].shape) if arrays else ()

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())


@dataclass(frozen=True)
class MeasureMessage(Message):
    """A discrete measure (support + weights): ξ^(k), ξ_μ^(k), ξ_ν^(k) in FedWaD Algorithm 1."""

    measure: Measure = None  # type: ignore[assignment]

    payload_type: ClassVar[str] = "measure"

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.measure.support, self.measure.weights)


@dataclass(frozen=True)
class DistanceMessage(Message):
    """A scalar distance, e.g. d_{μ,ξ^(K)} sent at the last FedWaD iteration."""

    value: float = float("nan")

    payload_type: ClassVar[str] = "distance"

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (np.asarray([self.value], dtype=np.float64),)


@dataclass(frozen=True)
class MomentMessage(Message):
    """A client's mean m (d,) and covariance Σ (d×d; its measure's own, weighted, ddof = 0): what the server
    needs for Gelbrich's lower bound of W₂ (Gelbrich 1990, Theorem 2.1) next to FedWaD's upper bound.

    Privacy cost: this reveals the client's first two moments to the server — exactly, not noised. They are
    aggregates, not samples, but they are more than Algorithm 1 sends: the server learns the data's location
    and shape (and, with n known, a one-sample change moves the mean by (x − x')/n). d(d + 1) numbers, 8·d(d + 1)
    bytes (about 4.7 MB at d = 768).
    """

    mean: np.ndarray = None  # type: ignore[assignment]
    covariance: np.ndarray = None  # type: ignore[assignment]

    payload_type: ClassVar[str] = "moments"

    def __post_init__(self) -> None:
        m = np.asarray(self.mean, dtype=np.float64)
        c = np.asarray(self.covariance, dtype=np.float64)
        if m.ndim != 1 or c.shape != (m.shape[0], m.shape[0]):
            raise ValueError(f"{self.sender}: moments need a mean of shape (d,) and a d×d covariance "
                             f"(got {m.shape} and {c.shape})")
        if not (np.isfinite(m).all() and np.isfinite(c).all()):
            raise ValueError(f"{self.sender}: moments contain NaN or inf")
        object.__setattr__(self, "mean", m)
        object.__setattr__(self, "covariance", c)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.covariance, self.mean)  # the covariance first: the ledger's shape is d×d


# ------------------------------------------------------------------------------ KNOT (text track)
@dataclass(frozen=True)
class PredictionMessage(Message):
    """A teacher's probabilities h_k(x) on the shared transfer set (N×C): all a KNOT client ever sends
    about its data and model (KNOT §3; the server only ever sees teacher predictions)."""

    probabilities: np.ndarray = None  # type: ignore[assignment]

    payload_type: ClassVar[str] = "predictions"

    def __post_init__(self) -> None:
        p = np.asarray(self.probabilities, dtype=np.float64)
        if p.ndim != 2 or not np.isfinite(p).all() or (p < 0).any() or not np.allclose(p.sum(1), 1.0, atol=1e-6):
            raise ValueError(f"{self.sender}: predictions must be finite N×C rows of probabilities "
                             f"(got shape {p.shape})")
        object.__setattr__(self, "probabilities", p)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.probabilities,)


@dataclass(frozen=True)
class HistogramMessage(Message):
    """A label histogram a client reports: its probability bias B_k (KNOT app. D.1)."""

    histogram: np.ndarray = None  # type: ignore[assignment]

    payload_type: ClassVar[str] = "histogram"

    def __post_init__(self) -> None:
        h = np.asarray(self.histogram, dtype=np.float64)
        if h.ndim != 1 or not np.isfinite(h).all() or (h < 0).any() or not np.isclose(h.sum(), 1.0, atol=1e-6):
            raise ValueError(f"{self.sender}: a label histogram must be a finite probability vector (got {h!r})")
        object.__setattr__(self, "histogram", h)

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.histogram,)


@dataclass(frozen=True)
class CountMessage(Message):
    """A count a client reports, e.g. its local dataset size (the "D" weighting of KNOT eq. 3)."""

    value: int = 0

    payload_type: ClassVar[str] = "count"

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (np.asarray([self.value], dtype=np.int64),)
