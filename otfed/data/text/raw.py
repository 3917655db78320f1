"""Readers of the embedded raw files (data/README.md): SA reviews, ERC dialogues (DailyDialog, MELD), NLI
pairs. Texts are composed here (ERC context turns, NLI premise + separator + hypothesis); raw label strings
become indices of the task's label order. Errors name the file, the column and the allowed values.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from otfed.data.text.spec import DATASET_PARTIES, TextTaskSpec, label_names
from otfed.data.text.splits import contiguous_bins
from otfed.errors import DataFileError

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

#: Raw label value (as written in the CSV) → label name of ``LabelSpace.for_task(task)`` (KNOT §6).
RAW_LABELS: dict[str, dict[str, str]] = {
    "sa": {"1": "strong negative", "2": "weak negative", "3": "neutral", "4": "weak positive",
           "5": "strong positive"},
    "erc": {"neutral": "no emotion", "anger": "anger", "joy": "happiness", "sadness": "sadness",
            "surprise": "surprise"},
    "nli": {"entailment": "entailment", "neutral": "neutral", "contradiction": "contradiction"},
}

DD_CHUNKS = 4
_DD_SPLIT_ORDER = ("train", "validation", "test")  # DailyDialog's pooled order (KNOT §6: four chunks)
_SPLIT_NAMES = {"train": "train", "validation": "val", "val": "val", "dev": "val", "test": "test"}


def read_columns(path: Path, columns: list[str], skip_blank_lines: bool = True) -> pd.DataFrame:
    """``columns`` of a raw CSV as strings ("" for empty cells; "NA" stays a text); errors name file and column.
    ``skip_blank_lines=False`` keeps a blank line as a row (a file of one text column: a blank text)."""
    if not path.is_file():
        raise DataFileError(f"{path}: text dataset file not found (the embedded datasets are listed in "
                            f"data/README.md)")
    try:
        header = pd.read_csv(path, nrows=0).columns
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataFileError(f"{path}: missing column(s) {', '.join(map(repr, missing))}; "
                                f"found: {', '.join(map(str, header))}")
        frame = pd.read_csv(path, usecols=columns, dtype=str, keep_default_na=False, skip_blank_lines=skip_blank_lines)
    except DataFileError:
        raise
    except Exception as exc:  # gzip/zlib/UnicodeDecodeError/ParserError …
        raise DataFileError(f"{path}: cannot read CSV ({type(exc).__name__}: {exc})") from None
    return frame[columns].astype(object)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class RawRows:
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
               with_labels: bool, separator: str) -> RawRows:
    """SA files (one review per row, ``domain`` column) and NLI files (premise + separator + hypothesis)."""
    columns = [*text_columns, *(["label"] if with_labels else []), *([domain_column] if domain_column else [])]
    frame = read_columns(path, columns)
    frame, dropped = _kept(frame, text_columns)
    text = frame[text_columns[0]].to_numpy(dtype=object)
    for c in text_columns[1:]:
        text = text + separator + frame[c].to_numpy(dtype=object)
    domain = frame[domain_column].to_numpy(dtype=object) if domain_column else \
        np.full(len(frame), constant_domain, dtype=object)
    ids = np.array([f"{_stem(path)}:{i}" for i in frame.index], dtype=object)
    return RawRows(path, domain, text, ids, frame["label"].to_numpy(dtype=object) if with_labels else None,
                 dropped=dropped)


def _stem(path: Path) -> str:
    return path.name.split(".")[0]


def _read_dialogues(path: Path, name: str, with_labels: bool, spec: TextTaskSpec, chunks: int | None) -> RawRows:
    """ERC files: utterances with up to ``context_turns`` previous turns of their dialogue (KNOT §6, ERC).

    DailyDialog (``chunks`` = 4): dialogues pooled in the order train, validation, test, then file order,
    and cut into ``chunks`` contiguous runs of whole dialogues with ≈ equal utterance counts, named
    ``dd_chunk1`` …. MELD (``chunks`` None): one party ``name`` that keeps its own train/dev/test split.
    """
    columns = ["text", *(["label"] if with_labels else []), "dialogue_id", "utt_idx", "split"]
    frame = read_columns(path, columns)
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
        per_row = np.repeat(contiguous_bins(sizes, np.full(chunks, 1.0 / chunks)), sizes)
        domain = np.array([f"dd_chunk{b + 1}" for b in per_row], dtype=object)
        fixed = None
    ids = np.array([f"{_stem(path)}:{r}" for r in frame["_row"]], dtype=object)
    label = frame["label"].to_numpy(dtype=object) if with_labels else None
    return RawRows(path, domain, composed, ids, label, group=dialogue, fixed_split=fixed, dropped=dropped)


@dataclass(frozen=True)
class RawSource:
    """One raw file of a task and the domain names it holds (internal)."""

    dataset: str
    kind: str  # "flat" | "pair" | "dd_chunks" | "dialogue"
    domain_column: str | None = None  # flat/pair files with several domains; None = the whole file is `dataset`


SOURCES: dict[tuple[str, str], tuple[RawSource, ...]] = {
    **{("sa", d): (RawSource(d, "flat", "domain"),) for d in DATASET_PARTIES["sa"]},
    ("erc", "dailydialog"): (RawSource("dailydialog", "dd_chunks"), RawSource("meld", "dialogue")),
    ("nli", "multinli"): (RawSource("multinli", "pair", "genre"), RawSource("snli", "pair"), RawSource("anli", "pair")),
}


def domain_names(source: RawSource, data_dir: Path) -> tuple[str, ...]:
    if source.kind == "dd_chunks":
        return tuple(f"dd_chunk{k + 1}" for k in range(DD_CHUNKS))
    if source.domain_column is None:
        return (source.dataset,)
    values = read_columns(data_dir / RAW_FILES[source.dataset], [source.domain_column])[source.domain_column]
    return tuple(dict.fromkeys(v for v in values if str(v).strip()))


def read_source(source: RawSource, data_dir: Path, spec: TextTaskSpec, with_labels: bool) -> RawRows:
    path = data_dir / RAW_FILES[source.dataset]
    if source.kind == "dd_chunks":
        return _read_dialogues(path, source.dataset, with_labels, spec, DD_CHUNKS)
    if source.kind == "dialogue":
        return _read_dialogues(path, source.dataset, with_labels, spec, None)
    text_columns = ["text"] if source.kind == "flat" else ["premise", "hypothesis"]
    return _read_flat(path, source.domain_column, source.dataset, text_columns, with_labels, spec.separator)


def label_indices(raw: np.ndarray, task: str, path: Path, party: str) -> np.ndarray:
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
