"""Typed messages: the only things that cross the client/server boundary.

A message carries either a discrete measure (an interpolating measure, never raw samples) or a scalar
(a distance). Its size in bytes and its shape are what the ledger records.
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
        return ()

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

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.measure.support.shape)


@dataclass(frozen=True)
class DistanceMessage(Message):
    """A scalar distance, e.g. d_{μ,ξ^(K)} sent at the last FedWaD iteration."""

    value: float = float("nan")

    payload_type: ClassVar[str] = "distance"

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (np.asarray([self.value], dtype=np.float64),)

    @property
    def shape(self) -> tuple[int, ...]:
        return (1,)
