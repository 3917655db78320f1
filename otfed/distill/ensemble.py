"""The KNOT server's view of its teachers (KNOT §3): what it learnt from client messages, nothing more.

Built from messages by :func:`otfed.federation.knot.teacher_ensemble`; consumed by the teacher weights and
the student loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TeacherEnsemble:
    """What the KNOT server knows about its teachers — built from messages only (:func:`teacher_ensemble`).

    ``probabilities`` is N×K×C (transfer sample × teacher × label), ``dataset_sizes`` K and ``biases``
    K×C (None when no bias messages were received): the papers' argmax frequencies B_k (KNOT §5.2) or, for
    the ablation, the teachers' mean probability rows on the same random texts — whichever kind the
    ensemble was built with (``bias_kind`` of :func:`teacher_ensemble`). Teacher order is ``names``.
    """

    names: tuple[str, ...]
    probabilities: np.ndarray
    dataset_sizes: np.ndarray
    biases: np.ndarray | None

    @property
    def n_teachers(self) -> int:
        return len(self.names)

    def subset(self, names: Sequence[str]) -> "TeacherEnsemble":
        """The ensemble restricted to (and ordered as) ``names``."""
        index = [self.names.index(n) for n in names]
        return TeacherEnsemble(tuple(names), self.probabilities[:, index], self.dataset_sizes[index],
                               None if self.biases is None else self.biases[index])
