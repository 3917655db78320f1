"""Label coordinates of the KNOT tasks (the "semantic space" of the papers' fig. 3) and their ground cost.

The OT loss (eq. 3) and the Semantic Distance metric both place the C labels of a task at points of a
small Euclidean space: the ground cost C_ij between labels i and j is a distance between their points.

=====  ==================================================================================  ========
task   coordinates (label order as stored)                                                 cost
=====  ==================================================================================  ========
SA     1-D: strong negative 1, weak negative 2, neutral 3, weak positive 4, strong pos. 5  |p − q|
ERC    valence–arousal: no emotion (0, 0), anger (−0.4, 0.8), happiness (0.9, 0.2),        |p − q|₁
       sadness (−0.9, −0.4), surprise (0.4, 0.9)
NLI    entailment (1, 0, 0), neutral (0.5, 1, 0.5), contradiction (0, 0, 1)                ||p − q||₂
=====  ==================================================================================  ========

The papers' ERC cost is written |p − q| ("taxi-cab"); on 2-D points that is the L1 distance. The
ablation of the papers' appendix C.1 replaces the coordinates by one-hot vectors (every label on its own
axis), which removes the semantics: every pair of distinct labels is then equally far apart.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

#: Label order and coordinates of each task (the papers' fig. 3).
TASK_COORDINATES: dict[str, tuple[tuple[str, ...], tuple[tuple[float, ...], ...], str]] = {
    "sa": (
        ("strong negative", "weak negative", "neutral", "weak positive", "strong positive"),
        ((1.0,), (2.0,), (3.0,), (4.0,), (5.0,)),
        "l1",
    ),
    "erc": (
        ("no emotion", "anger", "happiness", "sadness", "surprise"),
        ((0.0, 0.0), (-0.4, 0.8), (0.9, 0.2), (-0.9, -0.4), (0.4, 0.9)),
        "l1",
    ),
    "nli": (
        ("entailment", "neutral", "contradiction"),
        ((1.0, 0.0, 0.0), (0.5, 1.0, 0.5), (0.0, 0.0, 1.0)),
        "l2",
    ),
}

_METRICS = ("l1", "l2")


@dataclass(frozen=True, eq=False)  # eq=False: compared by identity (a tensor field has no bool ==)
class LabelSpace:
    """The labels of a task placed at points (``coordinates``, C×D) with a ground metric ("l1" | "l2").

    ``labels[i]`` is the name of label index i, i.e. of column i of every probability histogram.
    """

    task: str
    labels: tuple[str, ...]
    coordinates: torch.Tensor
    metric: str

    def __post_init__(self) -> None:
        coordinates = torch.as_tensor(self.coordinates)
        if not coordinates.is_floating_point():
            coordinates = coordinates.to(torch.get_default_dtype())
        object.__setattr__(self, "coordinates", coordinates)
        object.__setattr__(self, "labels", tuple(self.labels))
        if self.metric not in _METRICS:
            raise ValueError(f"unknown label metric {self.metric!r}; allowed: {', '.join(_METRICS)}")
        if coordinates.ndim != 2 or coordinates.shape[0] != len(self.labels):
            raise ValueError(
                f"coordinates must be C×D with C = {len(self.labels)} labels, got shape {tuple(coordinates.shape)}"
            )
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"label names must be distinct, got {self.labels}")

    @property
    def n_labels(self) -> int:
        return len(self.labels)

    @classmethod
    def for_task(cls, task: str) -> "LabelSpace":
        """The papers' semantic coordinates of ``task`` ∈ {"sa", "erc", "nli"} (KNOT fig. 3)."""
        key = str(task).lower()
        if key not in TASK_COORDINATES:
            raise ValueError(f"unknown task {task!r}; allowed: {', '.join(sorted(TASK_COORDINATES))}")
        labels, coordinates, metric = TASK_COORDINATES[key]
        return cls(task=key, labels=labels, coordinates=torch.tensor(coordinates, dtype=torch.float64), metric=metric)

    @classmethod
    def one_hot(cls, labels: "list[str] | tuple[str, ...] | LabelSpace", metric: str = "l1") -> "LabelSpace":
        """One-hot coordinates, every label on its own axis: the "no semantics" ablation (KNOT app. C.1).

        With the taxi-cab cost the papers use there, every pair of distinct labels is at distance 2, so
        the OT cost becomes 2·TV (total variation) and carries no label geometry. ``labels`` may be a
        :class:`LabelSpace`, whose task name and label order are kept.
        """
        task = "custom"
        if isinstance(labels, LabelSpace):
            task, labels = labels.task, labels.labels
        names = tuple(labels)
        return cls(task=f"{task}-one-hot", labels=names, coordinates=torch.eye(len(names), dtype=torch.float64),
                   metric=metric)

    def cost_matrix(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
        """The C×C ground cost C_ij = ||coord(i) − coord(j)|| in the space's metric (KNOT eq. 1's C)."""
        x = self.coordinates.to(dtype=dtype or self.coordinates.dtype, device=device)
        diff = x[:, None, :] - x[None, :, :]
        if self.metric == "l1":
            return diff.abs().sum(-1)
        return diff.pow(2).sum(-1).sqrt()

    def index(self, label: str) -> int:
        """Column index of the label called ``label`` (ValueError listing the labels if absent)."""
        try:
            return self.labels.index(label)
        except ValueError:
            raise ValueError(
                f"unknown label {label!r} for task {self.task!r}; labels: {', '.join(self.labels)}"
            ) from None
