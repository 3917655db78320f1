"""The partition store of the text track: one folder per task, the contract with the text-track stages.

On-disk format (written by :func:`save_text_federation`, the contract with the text-track stages)::

    <dir>/parties.csv.gz   party, role, split, text, label, id   (label = int index; id = "<file stem>:<row>")
    <dir>/transfer.csv.gz  text
    <dir>/manifest.json    task, label_names, spec, seed, parties (name, role, source, counts),
                           transfer (source, n), dropped_texts, raw_files (file → SHA-256)
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd

from otfed import io
from otfed.data.text.federation import TextFederation, TextParty, TextSplit
from otfed.data.text.raw import read_columns
from otfed.data.text.spec import SPLITS, TextTaskSpec
from otfed.errors import ConfigError, DataFileError

FORMAT = "otfed.text_federation/1"


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
        "spec": None if fed.spec is None else fed.spec.model_dump(mode="json"),
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
    table = read_columns(directory / "parties.csv.gz", ["party", "role", "split", "text", "label", "id"])
    transfer = read_columns(directory / "transfer.csv.gz", ["text"])
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
    except ConfigError as exc:
        raise DataFileError(f"{manifest_path}: key 'spec' is not a valid text spec ({exc})") from None
    return TextFederation(
        task=manifest["task"], label_names=label_names_,
        locals=tuple(p for p in parties if p.role == "local"),
        global_party=next(p for p in parties if p.role == "global"),
        transfer_texts=tuple(transfer["text"]), transfer_source=manifest["transfer"]["source"],
        spec=spec, seed=manifest.get("seed"),
        dropped_texts=dict(manifest.get("dropped_texts", {})), raw_sha256=dict(manifest.get("raw_files", {})))
