"""Text data of the KNOT track: the three tasks' parties, read from data/raw and split deterministically.

KNOT (COLING 2022, §6 "Datasets"; SPEC §1 "Experiments") evaluates federated distillation on three
tasks. Each task has K **local** parties (private teachers), one **global** party (the server's own
labelled data, used to pretrain the student: learning without forgetting) and an unlabelled
**transfer** set on which the teachers' predictions are distilled:

====  ==========================================  ==================  ======================
task  locals                                      global              transfer (labels dropped)
====  ==========================================  ==================  ======================
sa    Amazon categories (paper: Cell, Clothing,   baby (paper: Food)  grocery_food
      Toys; here cell_phones, musical_instruments,
      digital_music)
erc   DailyDialog chunks 1 and 2, MELD            DailyDialog ch. 3   DailyDialog chunk 4
nli   MultiNLI genres fiction, government,        SNLI                ANLI
      slate, telephone, travel
====  ==========================================  ==================  ======================

The embedded files are real subsamples (data/README.md, PROVENANCE §1–3, §5). Labels become indices
into the task's label order, ``LabelSpace.for_task(task).labels`` (SA stars 1..5 → 0..4; ERC
neutral → "no emotion", joy → "happiness"; NLI entailment / neutral / contradiction).

**The transfer set carries no labels.** Its rows are separated from the labelled parties before any
label is looked at (ANLI is read without its label column at all): no function here returns, stores or
even validates a transfer label.

Each labelled party is split train / val / test (seeded): stratified by label for SA and NLI; by whole
dialogue for the DailyDialog chunks (no dialogue in two splits); MELD keeps its own train / dev / test
split. Caps (``max_train``, ``max_eval``, ``max_transfer``) then subsample stratified by label
(uniformly for the transfer set, whose labels are unknown). Every party draws from its own generator
seeded by ``(seed, task, party name)``, so a party's rows do not change when another party is added.

On-disk format (written by :func:`save_text_federation`, the contract with the text-track stages)::

    <dir>/parties.csv.gz   party, role, split, text, label, id   (label = int index; id = "<file stem>:<row>")
    <dir>/transfer.csv.gz  text
    <dir>/manifest.json    task, label_names, spec, seed, parties (name, role, source, counts),
                           transfer (source, n), dropped_texts, raw_files (file → SHA-256)
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.apportionment import largest_remainder, stratified_parts
from otfed.errors import ConfigError, DataFileError, DegenerateClientError

TASKS: tuple[str, ...] = ("sa", "erc", "nli")
SPLITS: tuple[str, ...] = ("train", "val", "test")
ROLES: tuple[str, ...] = ("local", "global")
FORMAT = "otfed.text_federation/1"

#: Dataset name → file name inside the raw-data folder (data/README.md gives source, licence, SHA-256).
RAW_FILES: dict[str, str] = {
    "amazon_categories": "sentiment_amazon_categories.csv.gz",
    "womens_clothing": "sentiment_womens_clothing.csv.gz",
    "mdsd_amazon4": "sentiment_mdsd_amazon4.csv.gz",
    "dailydialog": "erc_dailydialog.csv.gz",
    "meld": "erc_meld.csv.gz",
    "multinli": "nli_multinli.csv.gz",
    "snli": "nli_snli.csv.gz",
    "anli": "nli_anli.csv.gz",
}

#: task → dataset → default (locals, global party, transfer). The first dataset is the task's default.
DATASET_PARTIES: dict[str, dict[str, tuple[tuple[str, ...], str, str]]] = {
    "sa": {
        "amazon_categories": (("cell_phones", "musical_instruments", "digital_music"), "baby", "grocery_food"),
        "womens_clothing": (("tops", "dresses", "bottoms"), "intimate", "jackets"),
        "mdsd_amazon4": (("books", "dvd"), "electronics", "kitchen"),
    },
    "erc": {"dailydialog": (("dd_chunk1", "dd_chunk2", "meld"), "dd_chunk3", "dd_chunk4")},
    "nli": {"multinli": (("fiction", "government", "slate", "telephone", "travel"), "snli", "anli")},
}

#: Raw label value (as written in the CSV) → label name of ``LabelSpace.for_task(task)`` (SPEC §1).
RAW_LABELS: dict[str, dict[str, str]] = {
    "sa": {"1": "strong negative", "2": "weak negative", "3": "neutral", "4": "weak positive",
           "5": "strong positive"},
    "erc": {"neutral": "no emotion", "anger": "anger", "joy": "happiness", "sadness": "sadness",
            "surprise": "surprise"},
    "nli": {"entailment": "entailment", "neutral": "neutral", "contradiction": "contradiction"},
}

#: CPU-sized caps used by :func:`default_spec` (paper-scale runs set them to None).
DEFAULT_CAPS: dict[str, int] = {"max_train": 800, "max_eval": 300, "max_transfer": 1000}

DD_CHUNKS = 4
_DD_SPLIT_ORDER = ("train", "validation", "test")  # DailyDialog's pooled order (SPEC §1: contiguous chunks)
_SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "dev": "val", "test": "test"}


# ----------------------------------------------------------------------------------------- values
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


@dataclass(frozen=True)
class TextFederation:
    """All parties of one KNOT task (SPEC §1): locals, the global party and the unlabelled transfer texts.

    ``dropped_texts`` counts, per raw file, the rows read for this federation whose text was missing or
    blank and that were dropped. ``raw_sha256`` maps each raw file read to its SHA-256.
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

    @property
    def parties(self) -> tuple[TextParty, ...]:
        """Locals in spec order, then the global party."""
        return (*self.locals, self.global_party)

    def party(self, name: str) -> TextParty:
        for p in self.parties:
            if p.name == name:
                return p
        raise KeyError(f"no party {name!r}; parties: {', '.join(p.name for p in self.parties)}")


@dataclass(frozen=True)
class TextTaskSpec:
    """Which parties a KNOT task has and how they are sized (mirrored by ``otfed.config.TextTaskParams``).

    Domain names: SA — the ``domain`` values of the dataset's file; ERC — ``dd_chunk1`` … ``dd_chunk4``
    (DailyDialog cut into 4 contiguous chunks) and ``meld``; NLI — MultiNLI ``genre`` values, ``snli``
    and ``anli``. Caps: ``None`` = no cap.
    """

    task: str
    dataset: str
    locals: tuple[str, ...]
    global_party: str
    transfer: str
    max_train: int | None
    max_eval: int | None
    max_transfer: int | None
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    context_turns: int = 2
    separator: str = " [SEP] "

    def __post_init__(self) -> None:
        object.__setattr__(self, "locals", tuple(self.locals))
        _check_spec(self)


def _check_spec(spec: TextTaskSpec) -> None:
    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(f"text spec {spec.task}.{key}: {msg}")

    if spec.task not in TASKS:
        raise ConfigError(f"text spec: unknown task {spec.task!r}; allowed: {', '.join(TASKS)}")
    if spec.dataset not in DATASET_PARTIES[spec.task]:
        raise bad("dataset", f"unknown dataset {spec.dataset!r}; allowed: {', '.join(DATASET_PARTIES[spec.task])}")
    if not spec.locals:
        raise bad("locals", "at least one local party is needed")
    names = [*spec.locals, spec.global_party, spec.transfer]
    if not all(isinstance(n, str) and n for n in names):
        raise bad("locals", f"party names must be non-empty strings; got {names}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise bad("locals", f"a domain can play one role only; repeated: {', '.join(repeated)}")
    for key in ("max_train", "max_eval", "max_transfer"):
        cap = getattr(spec, key)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1):
            raise bad(key, f"must be a positive integer or None; got {cap!r}")
    for key in ("val_fraction", "test_fraction"):
        if not 0.0 < float(getattr(spec, key)) < 1.0:
            raise bad(key, f"must lie in (0, 1); got {getattr(spec, key)!r}")
    if spec.val_fraction + spec.test_fraction >= 1.0:
        raise bad("test_fraction", f"val_fraction + test_fraction must be < 1; got "
                                   f"{spec.val_fraction} + {spec.test_fraction}")
    if isinstance(spec.context_turns, bool) or not isinstance(spec.context_turns, (int, np.integer)) \
            or spec.context_turns < 0:
        raise bad("context_turns", f"must be a non-negative integer; got {spec.context_turns!r}")
    if not isinstance(spec.separator, str) or not spec.separator:
        raise bad("separator", f"must be a non-empty string; got {spec.separator!r}")


def default_spec(task: str, **overrides: Any) -> TextTaskSpec:
    """The KNOT §6 party layout of ``task`` with CPU-sized caps (:data:`DEFAULT_CAPS`).

    ``dataset=`` picks the dataset's own default parties (e.g. ``default_spec("sa",
    dataset="womens_clothing")``); any other field can be overridden by name.
    """
    if task not in TASKS:
        raise ConfigError(f"text spec: unknown task {task!r}; allowed: {', '.join(TASKS)}")
    names = {f.name for f in dataclasses.fields(TextTaskSpec)} - {"task"}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"text spec {task}: unknown field(s) {', '.join(unknown)}; allowed: "
                          f"{', '.join(sorted(names))}")
    dataset = overrides.get("dataset", next(iter(DATASET_PARTIES[task])))
    if dataset not in DATASET_PARTIES[task]:
        raise ConfigError(f"text spec {task}.dataset: unknown dataset {dataset!r}; allowed: "
                          f"{', '.join(DATASET_PARTIES[task])}")
    locals_, global_party, transfer = DATASET_PARTIES[task][dataset]
    values: dict[str, Any] = dict(task=task, dataset=dataset, locals=locals_, global_party=global_party,
                                  transfer=transfer, **DEFAULT_CAPS)
    values.update(overrides)
    return TextTaskSpec(**values)


# ------------------------------------------------------------------------------------ raw reading
def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    """``columns`` of a raw CSV as strings ("" for empty cells; "NA" stays a text); errors name file and column."""
    if not path.is_file():
        raise DataFileError(f"{path}: text dataset file not found (the embedded datasets are listed in "
                            f"data/README.md)")
    try:
        header = pd.read_csv(path, nrows=0).columns
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataFileError(f"{path}: missing column(s) {', '.join(map(repr, missing))}; "
                                f"found: {', '.join(map(str, header))}")
        frame = pd.read_csv(path, usecols=columns, dtype=str, keep_default_na=False)
    except DataFileError:
        raise
    except Exception as exc:  # gzip/zlib/UnicodeDecodeError/ParserError …
        raise DataFileError(f"{path}: cannot read CSV ({type(exc).__name__}: {exc})") from None
    return frame[columns].astype(object)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class _Rows:
    """Rows of one raw file after reading: one entry per kept row (internal)."""

    path: Path
    domain: np.ndarray  # domain / party name of each row
    text: np.ndarray  # model input (composed: context, premise+hypothesis)
    ids: np.ndarray
    label: np.ndarray | None  # raw label strings; None when the file was read without labels
    group: np.ndarray | None = None  # dialogue id (ERC)
    fixed_split: np.ndarray | None = None  # MELD's own split, mapped to train/val/test
    dropped: int = 0


def _kept(frame: pd.DataFrame, text_columns: list[str]) -> tuple[pd.DataFrame, int]:
    blank = np.zeros(len(frame), dtype=bool)
    for c in text_columns:
        blank |= frame[c].map(lambda s: not str(s).strip()).to_numpy(dtype=bool)
    return frame.loc[~blank], int(blank.sum())


def _read_flat(path: Path, domain_column: str | None, constant_domain: str, text_columns: list[str],
               with_labels: bool, separator: str) -> _Rows:
    """SA files (one review per row, ``domain`` column) and NLI files (premise + separator + hypothesis)."""
    columns = [*text_columns, *(["label"] if with_labels else []), *([domain_column] if domain_column else [])]
    frame = _read_csv(path, columns)
    frame, dropped = _kept(frame, text_columns)
    text = frame[text_columns[0]].to_numpy(dtype=object)
    for c in text_columns[1:]:
        text = text + separator + frame[c].to_numpy(dtype=object)
    domain = frame[domain_column].to_numpy(dtype=object) if domain_column else \
        np.full(len(frame), constant_domain, dtype=object)
    ids = np.array([f"{_stem(path)}:{i}" for i in frame.index], dtype=object)
    return _Rows(path, domain, text, ids, frame["label"].to_numpy(dtype=object) if with_labels else None,
                 dropped=dropped)


def _stem(path: Path) -> str:
    return path.name.split(".")[0]


def _read_dialogues(path: Path, name: str, with_labels: bool, spec: TextTaskSpec, chunks: int | None) -> _Rows:
    """ERC files: utterances with up to ``context_turns`` previous turns of their dialogue (SPEC §1).

    DailyDialog (``chunks`` = 4): dialogues pooled in the order train, validation, test, then file order,
    and cut into ``chunks`` contiguous runs of whole dialogues with ≈ equal utterance counts, named
    ``dd_chunk1`` …. MELD (``chunks`` None): one party ``name`` that keeps its own train/dev/test split.
    """
    columns = ["text", *(["label"] if with_labels else []), "dialogue_id", "utt_idx", "split"]
    frame = _read_csv(path, columns)
    bad_split = sorted(set(frame["split"]) - set(_SPLIT_NAMES))
    if bad_split:
        raise DataFileError(f"{path}: column 'split' has unknown value(s) {', '.join(map(repr, bad_split[:5]))}; "
                            f"allowed: {', '.join(_SPLIT_NAMES)}")
    turn = pd.to_numeric(frame["utt_idx"], errors="coerce")
    if turn.isna().any() or (turn % 1 != 0).any():
        bad = frame.loc[turn.isna() | (turn % 1 != 0), "utt_idx"].unique()[:5]
        raise DataFileError(f"{path}: column 'utt_idx' must hold integers; found {', '.join(map(repr, bad))}")
    frame = frame.assign(_turn=turn.astype(np.int64), _row=np.arange(len(frame)))
    frame, dropped = _kept(frame, ["text"])
    split_rank = frame["split"].map({s: i for i, s in enumerate(_DD_SPLIT_ORDER)} | {"dev": 1, "val": 1})
    dialogue_rank = pd.Series(pd.factorize(frame["dialogue_id"])[0], index=frame.index)
    frame = frame.assign(_split_rank=split_rank, _dialogue_rank=dialogue_rank)
    frame = frame.sort_values(["_split_rank", "_dialogue_rank", "_turn", "_row"], kind="stable")

    texts = frame["text"].to_numpy(dtype=object)
    dialogue = frame["dialogue_id"].to_numpy(dtype=object)
    # after the sort every dialogue is one run of consecutive rows
    starts = np.flatnonzero(np.r_[True, dialogue[1:] != dialogue[:-1]]) if len(frame) else np.empty(0, np.int64)
    sizes = np.diff(np.r_[starts, len(frame)])
    run_start = np.repeat(starts, sizes)
    composed = np.array([spec.separator.join(texts[max(run_start[i], i - spec.context_turns):i + 1])
                         for i in range(len(frame))], dtype=object)

    if chunks is None:
        domain = np.full(len(frame), name, dtype=object)
        fixed = frame["split"].map(_SPLIT_NAMES).to_numpy(dtype=object)
    else:
        if sizes.size < chunks:
            raise DataFileError(f"{path}: {sizes.size} dialogue(s) with text cannot be cut into {chunks} chunks")
        per_row = np.repeat(_contiguous_bins(sizes, np.full(chunks, 1.0 / chunks)), sizes)
        domain = np.array([f"dd_chunk{b + 1}" for b in per_row], dtype=object)
        fixed = None
    ids = np.array([f"{_stem(path)}:{r}" for r in frame["_row"]], dtype=object)
    label = frame["label"].to_numpy(dtype=object) if with_labels else None
    return _Rows(path, domain, composed, ids, label, group=dialogue, fixed_split=fixed, dropped=dropped)


@dataclass(frozen=True)
class _Source:
    """One raw file of a task and the domain names it holds (internal)."""

    dataset: str
    kind: str  # "flat" | "pair" | "dd_chunks" | "dialogue"
    domain_column: str | None = None  # flat/pair files with several domains; None = the whole file is `dataset`


_SOURCES: dict[tuple[str, str], tuple[_Source, ...]] = {
    **{("sa", d): (_Source(d, "flat", "domain"),) for d in DATASET_PARTIES["sa"]},
    ("erc", "dailydialog"): (_Source("dailydialog", "dd_chunks"), _Source("meld", "dialogue")),
    ("nli", "multinli"): (_Source("multinli", "pair", "genre"), _Source("snli", "pair"), _Source("anli", "pair")),
}


def _domain_names(source: _Source, data_dir: Path) -> tuple[str, ...]:
    if source.kind == "dd_chunks":
        return tuple(f"dd_chunk{k + 1}" for k in range(DD_CHUNKS))
    if source.domain_column is None:
        return (source.dataset,)
    values = _read_csv(data_dir / RAW_FILES[source.dataset], [source.domain_column])[source.domain_column]
    return tuple(dict.fromkeys(v for v in values if str(v).strip()))


def _read_source(source: _Source, data_dir: Path, spec: TextTaskSpec, with_labels: bool) -> _Rows:
    path = data_dir / RAW_FILES[source.dataset]
    if source.kind == "dd_chunks":
        return _read_dialogues(path, source.dataset, with_labels, spec, DD_CHUNKS)
    if source.kind == "dialogue":
        return _read_dialogues(path, source.dataset, with_labels, spec, None)
    text_columns = ["text"] if source.kind == "flat" else ["premise", "hypothesis"]
    return _read_flat(path, source.domain_column, source.dataset, text_columns, with_labels, spec.separator)


def _label_indices(raw: np.ndarray, task: str, path: Path, party: str) -> np.ndarray:
    """Raw label strings → indices into ``label_names(task)``; unknown values raise DataFileError."""
    names = label_names(task)
    mapping = {value: names.index(name) for value, name in RAW_LABELS[task].items()}
    keys = np.array([str(v).strip() for v in raw], dtype=object)
    bad = sorted({k for k in keys if k not in mapping})
    if bad:
        n_bad = int(sum(k not in mapping for k in keys))
        raise DataFileError(
            f"{path}: column 'label' has unknown value(s) {', '.join(map(repr, bad[:10]))} in {n_bad} row(s) of "
            f"party {party!r}; allowed: {', '.join(RAW_LABELS[task])}")
    return np.array([mapping[k] for k in keys], dtype=np.int64)


def label_names(task: str) -> tuple[str, ...]:
    """The task's label order, ``LabelSpace.for_task(task).labels`` (KNOT fig. 3; SPEC §1)."""
    # imported here: otfed.distill pulls in torch, which reading and splitting CSVs does not need
    from otfed.distill.label_space import TASK_COORDINATES

    return tuple(TASK_COORDINATES[task][0])


# ------------------------------------------------------------------------------------- splitting
def _contiguous_bins(sizes: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Bin index (0..B−1, non-decreasing) of each of n ordered items so that bin b's total size is as close
    to ``shares[b]``·Σsizes as whole items allow: each boundary sits at the item boundary nearest its
    cumulative target, and every bin gets at least one item."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n, n_bins = sizes.size, len(shares)
    if n < n_bins:
        raise ValueError(f"{n} items cannot fill {n_bins} non-empty bins")
    edges = np.concatenate([[0], np.cumsum(sizes)])  # edges[j] = size of the first j items
    targets = edges[-1] * np.cumsum(shares)[:-1] / np.sum(shares)
    cuts = [0]
    for b, target in enumerate(targets, start=1):
        lo, hi = cuts[-1] + 1, n - (n_bins - b)
        cuts.append(lo + int(np.argmin(np.abs(edges[lo:hi + 1] - target))))
    cuts.append(n)
    return np.repeat(np.arange(n_bins), np.diff(cuts))


def _party_rng(seed: int, task: str, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{task}/{name}".encode())])


def _split_positions(labels: np.ndarray, groups: np.ndarray | None, fixed: np.ndarray | None,
                     spec: TextTaskSpec, rng: np.random.Generator, party: str) -> list[np.ndarray]:
    """Train/val/test row positions: the file's own split (MELD), whole dialogues (DailyDialog chunks),
    or stratified by label (SA, NLI)."""
    n = labels.size
    shares = np.array([1.0 - spec.val_fraction - spec.test_fraction, spec.val_fraction, spec.test_fraction])
    if fixed is not None:
        parts = [np.flatnonzero(fixed == s) for s in SPLITS]
    elif groups is not None:
        codes, uniques = pd.factorize(groups)
        if uniques.size < len(SPLITS):
            raise DegenerateClientError(f"party {party!r}: {uniques.size} dialogue(s) cannot fill train/val/test")
        order = rng.permutation(uniques.size)
        sizes = np.bincount(codes, minlength=uniques.size)[order]
        bin_of_group = np.empty(uniques.size, dtype=np.int64)
        bin_of_group[order] = _contiguous_bins(sizes, shares)
        parts = [np.flatnonzero(bin_of_group[codes] == b) for b in range(len(SPLITS))]
    else:
        sizes = largest_remainder(n, shares)
        if (sizes == 0).any():
            raise DegenerateClientError(f"party {party!r}: {n} row(s) are too few for train/val/test splits "
                                        f"of sizes {sizes.tolist()}")
        parts = stratified_parts(labels, sizes, rng)
    for name, part in zip(SPLITS, parts):
        if part.size == 0:
            raise DegenerateClientError(f"party {party!r}: its {name} split is empty")
    return parts


def _stratified_cap(labels: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of a stratified subsample of ``cap`` rows (all rows when ``cap`` is None or larger)."""
    n = labels.size
    if cap is None or cap >= n:
        return np.arange(n)
    return stratified_parts(labels, [cap, n - cap], rng)[0]


def _make_party(name: str, role: str, source: str, rows: _Rows, mask: np.ndarray, spec: TextTaskSpec,
                seed: int) -> TextParty:
    assert rows.label is not None
    labels = _label_indices(rows.label[mask], spec.task, rows.path, name)
    texts, ids = rows.text[mask], rows.ids[mask]
    rng = _party_rng(seed, spec.task, name)
    parts = _split_positions(labels, None if rows.group is None else rows.group[mask],
                             None if rows.fixed_split is None else rows.fixed_split[mask], spec, rng, name)
    splits = []
    for split, part in zip(SPLITS, parts):
        keep = part[_stratified_cap(labels[part], spec.max_train if split == "train" else spec.max_eval, rng)]
        splits.append(TextSplit(tuple(texts[keep]), labels[keep], tuple(ids[keep])))
    return TextParty(name, role, source, *splits)


# ------------------------------------------------------------------------------------------ build
def build_text_federation(spec: TextTaskSpec, data_dir: str | Path, seed: int) -> TextFederation:
    """The parties of one KNOT task (KNOT §6 datasets; SPEC §1 "Experiments"), deterministic in ``seed``.

    Reads the task's raw files from ``data_dir``; raises :class:`DataFileError` for a missing file or
    column, an unknown label value (naming file, column, values and the allowed ones) or a party name
    with no rows (listing the available domains), and :class:`DegenerateClientError` for a party too
    small to split. Blank texts are dropped and counted in ``dropped_texts``. The transfer rows are
    separated before any label is looked at, and only their texts are kept.
    """
    _check_spec(spec)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"text federation seed must be a non-negative integer; got {seed!r}")
    data_dir = Path(data_dir)
    sources = _SOURCES[(spec.task, spec.dataset)]
    labelled = [*spec.locals, spec.global_party]
    wanted = {*labelled, spec.transfer}

    available = {s: _domain_names(s, data_dir) for s in sources}
    known = {name for names in available.values() for name in names}
    for name in [*labelled, spec.transfer]:
        if name not in known:
            where = "; ".join(f"{data_dir / RAW_FILES[s.dataset]}"
                              f"{f' (column {s.domain_column!r})' if s.domain_column else ''}: {', '.join(names)}"
                              for s, names in available.items())
            raise DataFileError(f"{spec.task} party {name!r} has no rows; available domains — {where}")

    rows_by_name: dict[str, tuple[_Rows, np.ndarray]] = {}
    transfer_texts: np.ndarray | None = None
    dropped: dict[str, int] = {}
    sha: dict[str, str] = {}
    for source in sources:
        holds = [n for n in available[source] if n in wanted]
        if not holds:
            continue
        rows = _read_source(source, data_dir, spec, with_labels=any(n in labelled for n in holds))
        if spec.transfer in holds:  # separate the transfer rows first and keep only their texts
            in_transfer = rows.domain == spec.transfer
            transfer_texts = rows.text[in_transfer]
            if rows.label is not None:
                rows.label = np.where(in_transfer, None, rows.label)
        for name in holds:
            if name != spec.transfer:
                rows_by_name[name] = (rows, rows.domain == name)
        dropped[rows.path.name] = rows.dropped
        sha[rows.path.name] = _sha256(rows.path)

    assert transfer_texts is not None
    for name in [*labelled, spec.transfer]:
        if (rows_by_name[name][1].sum() if name in rows_by_name else len(transfer_texts)) == 0:
            raise DataFileError(f"{spec.task} party {name!r}: every row has a blank text; available domains: "
                                f"{', '.join(sorted(known))}")
    parties = [
        _make_party(name, "local" if name in spec.locals else "global", f"{_dataset_of(name, available)}/{name}",
                    *rows_by_name[name], spec, int(seed))
        for name in labelled
    ]
    if spec.max_transfer is not None and spec.max_transfer < len(transfer_texts):
        pick = np.sort(_party_rng(int(seed), spec.task, f"transfer:{spec.transfer}").choice(
            len(transfer_texts), spec.max_transfer, replace=False))
        transfer_texts = transfer_texts[pick]
    return TextFederation(
        task=spec.task, label_names=label_names(spec.task), locals=tuple(parties[:-1]), global_party=parties[-1],
        transfer_texts=tuple(transfer_texts),
        transfer_source=f"{_dataset_of(spec.transfer, available)}/{spec.transfer}",
        spec=spec, seed=int(seed), dropped_texts=dropped, raw_sha256=sha)


def _dataset_of(name: str, available: dict[_Source, tuple[str, ...]]) -> str:
    return next(s.dataset for s, names in available.items() if name in names)


# ------------------------------------------------------------------------------------ summaries
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


# ------------------------------------------------------------------------------------ save / load
def _gzip_csv_bytes(frame: pd.DataFrame) -> bytes:
    # mtime=0 and no file name in the header: equal federations give byte-identical files (stable DVC hashes)
    return gzip.compress(frame.to_csv(index=False).encode("utf-8"), compresslevel=6, mtime=0)


def save_text_federation(fed: TextFederation, directory: str | Path) -> None:
    """Write ``parties.csv.gz``, ``transfer.csv.gz`` and ``manifest.json`` into ``directory`` (replacing it
    as a whole, atomically: a failure leaves the previous directory untouched)."""
    records = []
    for party in fed.parties:
        for split in SPLITS:
            s = party.split(split)
            ids = s.ids or ("",) * len(s)
            records.append(pd.DataFrame({"party": party.name, "role": party.role, "split": split,
                                         "text": list(s.texts), "label": s.labels, "id": list(ids)}))
    parties = pd.concat(records, ignore_index=True)
    manifest = {
        "format": FORMAT,
        "task": fed.task,
        "label_names": list(fed.label_names),
        "spec": None if fed.spec is None else dataclasses.asdict(fed.spec),
        "seed": fed.seed,
        "parties": [
            {"name": p.name, "role": p.role, "source": p.source,
             "counts": {split: {"n": len(p.split(split)),
                                "labels": dict(zip(fed.label_names,
                                                   np.bincount(p.split(split).labels,
                                                               minlength=len(fed.label_names)).tolist()))}
                        for split in SPLITS}}
            for p in fed.parties
        ],
        "transfer": {"source": fed.transfer_source, "n": len(fed.transfer_texts)},
        "dropped_texts": dict(fed.dropped_texts),
        "raw_files": dict(fed.raw_sha256),
    }
    with io.staged_directory(directory) as staging:
        (staging / "parties.csv.gz").write_bytes(_gzip_csv_bytes(parties))
        transfer = pd.DataFrame({"text": list(fed.transfer_texts)})
        (staging / "transfer.csv.gz").write_bytes(_gzip_csv_bytes(transfer))
        io.write_json(manifest, staging / "manifest.json")


def load_text_federation(directory: str | Path) -> TextFederation:
    """Read a federation written by :func:`save_text_federation`; errors name the file and the column/key."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise DataFileError(f"{manifest_path}: text federation manifest not found — run `dvc repro partition` "
                            f"(or check partition.text in params.yaml)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as exc:
        raise DataFileError(f"{manifest_path}: not readable JSON ({type(exc).__name__}: {exc})") from None
    for key in ("task", "label_names", "parties", "transfer"):
        if key not in manifest:
            raise DataFileError(f"{manifest_path}: missing key {key!r}")
    label_names_ = tuple(manifest["label_names"])
    table = _read_csv(directory / "parties.csv.gz", ["party", "role", "split", "text", "label", "id"])
    transfer = _read_csv(directory / "transfer.csv.gz", ["text"])
    labels = pd.to_numeric(table["label"], errors="coerce")
    bad = labels.isna() | (labels % 1 != 0) | (labels < 0) | (labels >= len(label_names_))
    if bad.any():
        raise DataFileError(f"{directory / 'parties.csv.gz'}: column 'label' must hold indices "
                            f"0..{len(label_names_) - 1}; found "
                            f"{', '.join(map(repr, table.loc[bad, 'label'].unique()[:5]))}")
    table = table.assign(label=labels.astype(np.int64))

    parties = []
    for entry in manifest["parties"]:
        mine = table[table["party"] == entry["name"]]
        if mine.empty:
            raise DataFileError(f"{directory / 'parties.csv.gz'}: column 'party' has no rows for party "
                                f"{entry['name']!r} listed in {manifest_path.name}")
        splits = []
        for split in SPLITS:
            rows = mine[mine["split"] == split]
            ids = tuple(rows["id"]) if (rows["id"] != "").all() else ()
            splits.append(TextSplit(tuple(rows["text"]), rows["label"].to_numpy(np.int64), ids))
        parties.append(TextParty(entry["name"], entry["role"], entry["source"], *splits))
    if sum(p.role == "global" for p in parties) != 1 or not any(p.role == "local" for p in parties):
        raise DataFileError(f"{manifest_path}: key 'parties' must list one global party and at least one local; "
                            f"roles: {[p.role for p in parties]}")
    try:
        spec = None if manifest.get("spec") is None else TextTaskSpec(**manifest["spec"])
    except (TypeError, ConfigError) as exc:
        raise DataFileError(f"{manifest_path}: key 'spec' is not a valid text spec ({exc})") from None
    return TextFederation(
        task=manifest["task"], label_names=label_names_,
        locals=tuple(p for p in parties if p.role == "local"),
        global_party=next(p for p in parties if p.role == "global"),
        transfer_texts=tuple(transfer["text"]), transfer_source=manifest["transfer"]["source"],
        spec=spec, seed=manifest.get("seed"),
        dropped_texts=dict(manifest.get("dropped_texts", {})), raw_sha256=dict(manifest.get("raw_files", {})))
