"""The partition store of the text track: one folder per task, the contract with the text-track stages.

On-disk format (written by :func:`save_text_federation`, the contract with the text-track stages)::

    <dir>/parties.csv.gz   party, role, split, text, label, id   (label = int index; id = "<file stem>:<row>")
    <dir>/transfer.csv.gz  text
    <dir>/audit.csv.gz     index, label   (the audit slice, diagnostics only: index = 0-based row of
                                           transfer.csv.gz, increasing; label = int index; zero rows if none)
    <dir>/manifest.json    task, label_names, spec, seed, parties (name, role, source, counts),
                           transfer (source, n, audit = rows of audit.csv.gz), dropped_texts,
                           raw_files (file → SHA-256)
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
from otfed.data.text.spec import ROLES, SPLITS, TASKS, TextTaskSpec, label_names
from otfed.errors import ConfigError, DataError, DataFileError

FORMAT = "otfed.text_federation/1"
FILES = ("manifest.json", "parties.csv.gz", "transfer.csv.gz", "audit.csv.gz")  # a task's folder


def _gzip_csv_bytes(frame: pd.DataFrame) -> bytes:
    # mtime=0 and no file name in the header: equal federations give byte-identical files (stable DVC hashes)
    return gzip.compress(frame.to_csv(index=False).encode("utf-8"), compresslevel=6, mtime=0)


def save_text_federation(fed: TextFederation, directory: str | Path) -> None:
    """Write ``parties.csv.gz``, ``transfer.csv.gz``, ``audit.csv.gz`` and ``manifest.json`` into ``directory``
    (replacing it as a whole, atomically: a failure leaves the previous directory untouched)."""
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
        "transfer": {"source": fed.transfer_source, "n": len(fed.transfer_texts), "audit": int(fed.audit_index.size)},
        "dropped_texts": dict(fed.dropped_texts),
        "raw_files": dict(fed.raw_sha256),
    }
    with io.staged_directory(directory) as staging:
        (staging / "parties.csv.gz").write_bytes(_gzip_csv_bytes(parties))
        transfer = pd.DataFrame({"text": list(fed.transfer_texts)})
        (staging / "transfer.csv.gz").write_bytes(_gzip_csv_bytes(transfer))
        audit = pd.DataFrame({"index": fed.audit_index, "label": fed.audit_labels})
        (staging / "audit.csv.gz").write_bytes(_gzip_csv_bytes(audit))
        io.write_json(manifest, staging / "manifest.json")


def load_text_federation(directory: str | Path, task: str | None = None,
                         spec: TextTaskSpec | None = None) -> TextFederation:
    """Read a federation written by :func:`save_text_federation`, checked against the format; errors name
    the file and the column / key (:class:`~otfed.errors.DataError` for bad contents).

    Checked: the manifest's ``task`` (``task`` when given; one of the KNOT tasks) and its ``label_names``
    (the task's label order, :func:`~otfed.data.text.spec.label_names`); column ``label`` holds indices
    ``0..len(label_names)−1``; ``party`` only parties the manifest lists, each with the manifest's ``role``;
    ``split`` only train / val / test; the rows of each party's split and of the transfer set number what
    the manifest's ``counts`` and ``transfer.n`` declare; ``audit.csv.gz`` holds distinct positions ``index``
    into the transfer texts and ``label`` indices as above, as many rows as ``transfer.audit`` declares; with
    ``spec`` (the params that partition the task), the parties are the spec's locals, in order, and its
    global party."""
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
    check_manifest(manifest, manifest_path, task if spec is None else spec.task)
    if spec is not None:
        found = [(e["name"], e["role"]) for e in manifest["parties"]]
        declared = [*((name, "local") for name in spec.locals), (spec.global_party, "global")]
        if found != declared:
            raise DataError(f"{manifest_path}: key 'parties' lists {found} (name, role), but "
                            f"partition.text.tasks.{spec.task} declares {declared}; rerun `dvc repro partition`")
    parties_path = directory / "parties.csv.gz"
    table = read_columns(parties_path, ["party", "role", "split", "text", "label", "id"])
    transfer = read_columns(directory / "transfer.csv.gz", ["text"], skip_blank_lines=False)
    check_texts(table, parties_path)
    check_texts(transfer, directory / "transfer.csv.gz")
    labels = pd.to_numeric(table["label"], errors="coerce")
    bad = labels.isna() | (labels % 1 != 0) | (labels < 0) | (labels >= len(label_names_))
    if bad.any():
        first = table.loc[bad].iloc[0]
        raise DataError(f"{parties_path}: column 'label' must hold indices 0..{len(label_names_) - 1} (the "
                        f"{len(label_names_)} labels of task {manifest['task']!r}); found "
                        f"{', '.join(map(repr, table.loc[bad, 'label'].unique()[:5]))} "
                        f"(first: party {first['party']!r}, split {first['split']!r})")
    table = table.assign(label=labels.astype(np.int64))
    check_rows(table, len(transfer), manifest, parties_path)
    audit_index, audit_labels = read_audit(directory / "audit.csv.gz", len(transfer), manifest)

    parties = []
    for entry in manifest["parties"]:
        mine = table[table["party"] == entry["name"]]
        if mine.empty:
            raise DataError(f"{directory / 'parties.csv.gz'}: column 'party' has no rows for party "
                            f"{entry['name']!r} listed in {manifest_path.name}")
        splits = []
        for split in SPLITS:
            rows = mine[mine["split"] == split]
            ids = tuple(rows["id"]) if (rows["id"] != "").all() else ()
            splits.append(TextSplit(tuple(rows["text"]), rows["label"].to_numpy(np.int64), ids))
        parties.append(TextParty(entry["name"], entry["role"], entry["source"], *splits))
    if sum(p.role == "global" for p in parties) != 1 or not any(p.role == "local" for p in parties):
        raise DataError(f"{manifest_path}: key 'parties' must list one global party and at least one local; "
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
        dropped_texts=dict(manifest.get("dropped_texts", {})), raw_sha256=dict(manifest.get("raw_files", {})),
        audit_index=audit_index, audit_labels=audit_labels)


def read_audit(path: Path, n_transfer: int, manifest: dict) -> tuple[np.ndarray, np.ndarray]:
    """The audit slice of ``path`` (``audit.csv.gz``): positions into the ``n_transfer`` transfer texts, in
    increasing order, and their label indices. DataError naming ``path`` and the column unless every
    ``index`` is an integer in ``0..n_transfer−1``, no index repeats, every ``label`` is an index of the
    manifest's ``label_names``, and the rows number the manifest's ``transfer.audit`` (where given)."""
    frame = read_columns(path, ["index", "label"])
    index = pd.to_numeric(frame["index"], errors="coerce")
    bad = index.isna() | (index % 1 != 0) | (index < 0) | (index >= n_transfer)
    if bad.any():
        raise DataError(f"{path}: column 'index' must hold positions 0..{n_transfer - 1} into the {n_transfer} "
                        f"texts of transfer.csv.gz; found {', '.join(map(repr, frame.loc[bad, 'index'].unique()[:5]))}")
    repeated = index[index.duplicated()].unique()
    if repeated.size:
        raise DataError(f"{path}: column 'index' repeats {', '.join(str(int(i)) for i in repeated[:5])}; each "
                        f"transfer text is audited at most once")
    n_labels = len(manifest["label_names"])
    labels = pd.to_numeric(frame["label"], errors="coerce")
    bad = labels.isna() | (labels % 1 != 0) | (labels < 0) | (labels >= n_labels)
    if bad.any():
        raise DataError(f"{path}: column 'label' must hold indices 0..{n_labels - 1} (the {n_labels} labels of "
                        f"task {manifest['task']!r}); found "
                        f"{', '.join(map(repr, frame.loc[bad, 'label'].unique()[:5]))}")
    declared = (manifest.get("transfer") or {}).get("audit")
    if declared is not None and declared != len(frame):
        raise DataError(f"{path}: {len(frame)} audit rows; manifest.json declares {declared} (key 'transfer.audit')")
    order = np.argsort(index.to_numpy(np.int64), kind="stable")
    return index.to_numpy(np.int64)[order], labels.to_numpy(np.int64)[order]


def check_manifest(manifest: dict, path: Path, task: str | None = None) -> None:
    """DataError naming ``path`` and the key unless the manifest's ``task`` is a KNOT task (``task`` when
    given), its ``label_names`` are that task's label order, and each entry of ``parties`` has a distinct
    ``name``, a ``role`` of local / global and a ``source`` and ``counts`` per split."""
    found = manifest["task"]
    if found not in TASKS or (task is not None and found != task):
        allowed = repr(task) if task is not None else ", ".join(TASKS)
        raise DataError(f"{path}: key 'task' is {found!r}; allowed: {allowed}")
    if tuple(manifest["label_names"]) != label_names(found):
        raise DataError(f"{path}: key 'label_names' is {manifest['label_names']!r}; task {found!r} has the "
                        f"{len(label_names(found))} labels {list(label_names(found))!r}")
    names: list[str] = []
    for i, entry in enumerate(manifest["parties"]):
        if not isinstance(entry, dict) or not {"name", "role", "source"} <= set(entry):
            raise DataError(f"{path}: key 'parties[{i}]' must hold name, role and source; found {entry!r}")
        if entry["role"] not in ROLES:
            raise DataError(f"{path}: key 'parties[{i}].role' is {entry['role']!r}; allowed: {', '.join(ROLES)}")
        names.append(entry["name"])
    if len(set(names)) != len(names):
        raise DataError(f"{path}: key 'parties' lists {sorted({n for n in names if names.count(n) > 1})} twice")


def check_texts(table: pd.DataFrame, path: Path) -> None:
    """DataError naming ``path``, the number of blank texts and the first one's row (its party and split where
    the table has them) unless every entry of column ``text`` holds more than white space: the partition drops
    blank texts (its manifest counts them), so a blank one is an edited file — a teacher would train on, or a
    student learn from, an empty input."""
    blank = table["text"].map(lambda s: not str(s).strip()).to_numpy(dtype=bool)
    if blank.any():
        row = int(np.flatnonzero(blank)[0])
        where = (f", party {table['party'].iloc[row]!r}, split {table['split'].iloc[row]!r}"
                 if {"party", "split"} <= set(table.columns) else "")
        raise DataError(f"{path}: column 'text' is blank in {int(blank.sum())} row(s) (first: row {row}{where}); "
                        "the partition writes no blank text — rerun `dvc repro partition`")


def check_rows(table: pd.DataFrame, n_transfer: int, manifest: dict, path: Path) -> None:
    """DataError naming ``path`` (``parties.csv.gz``) and the column unless every row's ``party`` is listed in
    the manifest, with the manifest's ``role``, its ``split`` is train / val / test, and the rows of each
    (party, split) and the ``n_transfer`` transfer texts number what the manifest declares (its ``counts``
    and ``transfer.n``, where given)."""
    roles = {entry["name"]: entry["role"] for entry in manifest["parties"]}
    unknown = sorted(set(table["party"]) - set(roles))
    if unknown:
        raise DataError(f"{path}: column 'party' holds {', '.join(map(repr, unknown[:5]))}, not a party of "
                        f"manifest.json; allowed: {', '.join(map(repr, roles))}")
    bad_split = sorted(set(table["split"]) - set(SPLITS))
    if bad_split:
        raise DataError(f"{path}: column 'split' holds {', '.join(map(repr, bad_split[:5]))}; allowed: "
                        f"{', '.join(SPLITS)}")
    wrong = table[table["role"] != table["party"].map(roles)]
    if len(wrong):
        first = wrong.iloc[0]
        raise DataError(f"{path}: column 'role' is {first['role']!r} for party {first['party']!r}; manifest.json "
                        f"declares {roles[first['party']]!r}")
    sizes = table.groupby(["party", "split"]).size()
    for entry in manifest["parties"]:
        for split, count in (entry.get("counts") or {}).items():
            n = int(sizes.get((entry["name"], split), 0))
            if isinstance(count, dict) and "n" in count and count["n"] != n:
                raise DataError(f"{path}: {n} rows of party {entry['name']!r}, split {split!r}; manifest.json "
                                f"declares {count['n']}")
    declared = (manifest.get("transfer") or {}).get("n")
    if declared is not None and declared != n_transfer:
        raise DataError(f"{path.parent / 'transfer.csv.gz'}: {n_transfer} transfer texts; manifest.json declares "
                        f"{declared}")
