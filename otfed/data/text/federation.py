"""The values of the text track: a party's splits, a party, a task's federation, and its table 1 sizes."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from otfed.data.text.spec import SPLITS, TextTaskSpec


@dataclass(frozen=True, eq=False)
class TextSplit:
    """One split of one party: input texts and int64 label indices into the task's label order.

    ``ids`` name each row's origin, ``"<raw file stem>:<0-based data row>"`` (empty when unknown).
    """

    texts: tuple[str, ...]
    labels: np.ndarray
    ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "texts", tuple(self.texts))
        object.__setattr__(self, "ids", tuple(self.ids))
        object.__setattr__(self, "labels", np.asarray(self.labels, dtype=np.int64))
        if self.labels.shape != (len(self.texts),):
            raise ValueError(f"{len(self.texts)} texts but labels of shape {self.labels.shape}")
        if self.ids and len(self.ids) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.ids)} ids")

    def __len__(self) -> int:
        return len(self.texts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextSplit):
            return NotImplemented
        return self.texts == other.texts and self.ids == other.ids and np.array_equal(self.labels, other.labels)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class TextParty:
    """One labelled party of a KNOT task: a local teacher's client or the global (server) dataset."""

    name: str
    role: str  # "local" | "global"
    source: str  # "<dataset>/<domain>", e.g. "amazon_categories/cell_phones", "dailydialog/dd_chunk1"
    train: TextSplit
    val: TextSplit
    test: TextSplit

    def split(self, name: str) -> TextSplit:
        """The split called ``name`` ∈ {"train", "val", "test"}."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; allowed: {', '.join(SPLITS)}")
        return getattr(self, name)


@dataclass(frozen=True, eq=False)
class TextFederation:
    """All parties of one KNOT task (KNOT §6): locals, the global party and the unlabelled transfer texts.

    ``dropped_texts`` counts, per raw file, the rows read for this federation whose text was missing or
    blank and that were dropped. ``raw_sha256`` maps each raw file read to its SHA-256.

    The **audit slice** (``spec.audit`` rows, empty by default) keeps the labels of a few transfer texts for
    diagnostics only — whether the teachers are informative on the transfer set — never for training:
    ``audit_index`` holds increasing, distinct positions into ``transfer_texts`` (int64) and
    ``audit_labels`` their label indices into ``label_names`` (int64, same length).
    """

    task: str
    label_names: tuple[str, ...]
    locals: tuple[TextParty, ...]
    global_party: TextParty
    transfer_texts: tuple[str, ...]
    transfer_source: str
    spec: "TextTaskSpec | None" = None
    seed: int | None = None
    dropped_texts: dict[str, int] = field(default_factory=dict)
    raw_sha256: dict[str, str] = field(default_factory=dict)
    audit_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    audit_labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __post_init__(self) -> None:
        index = np.asarray(self.audit_index, dtype=np.int64)
        labels = np.asarray(self.audit_labels, dtype=np.int64)
        object.__setattr__(self, "audit_index", index)
        object.__setattr__(self, "audit_labels", labels)
        if index.ndim != 1 or labels.shape != index.shape:
            raise ValueError(f"audit_index of shape {index.shape} but audit_labels of shape {labels.shape}; "
                             f"both must be 1-D of the same length")
        if index.size and (index[0] < 0 or index[-1] >= len(self.transfer_texts) or (np.diff(index) <= 0).any()):
            raise ValueError(f"audit_index must hold increasing, distinct positions 0..{len(self.transfer_texts) - 1} "
                             f"into transfer_texts; got {index.tolist()[:10]}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TextFederation):
            return NotImplemented
        arrays = ("audit_index", "audit_labels")
        return (all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self) if f.name not in arrays)
                and all(np.array_equal(getattr(self, name), getattr(other, name)) for name in arrays))

    __hash__ = None  # type: ignore[assignment]

    @property
    def parties(self) -> tuple[TextParty, ...]:
        """Locals in spec order, then the global party."""
        return (*self.locals, self.global_party)

    def party(self, name: str) -> TextParty:
        for p in self.parties:
            if p.name == name:
                return p
        raise KeyError(f"no party {name!r}; parties: {', '.join(p.name for p in self.parties)}")


def federation_summary(fed: TextFederation) -> pd.DataFrame:
    """Table 1 sizes: one row per party and split (party, role, split, n, count per label name), and a
    last row for the transfer set (role and split "transfer"; its label counts are unknown, so NA)."""
    rows = []
    for party in fed.parties:
        for split in SPLITS:
            labels = party.split(split).labels
            counts = np.bincount(labels, minlength=len(fed.label_names))
            rows.append({"party": party.name, "role": party.role, "split": split, "n": int(labels.size),
                         **{name: int(c) for name, c in zip(fed.label_names, counts)}})
    transfer = fed.transfer_source.rsplit("/", 1)[-1]
    rows.append({"party": transfer, "role": "transfer", "split": "transfer", "n": len(fed.transfer_texts),
                 **{name: pd.NA for name in fed.label_names}})
    frame = pd.DataFrame(rows, columns=["party", "role", "split", "n", *fed.label_names])
    return frame.astype({"n": "int64", **{name: "Int64" for name in fed.label_names}})
