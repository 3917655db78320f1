"""The parties of one KNOT task, built from the raw files: :func:`build_text_federation`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from otfed.data.apportionment import largest_remainder
from otfed.data.text.federation import TextFederation, TextParty, TextSplit
from otfed.data.text.raw import RAW_FILES, SOURCES, RawRows, RawSource, domain_names, file_sha256, label_indices, \
    read_source
from otfed.data.text.spec import SPLITS, TextTaskSpec, label_names
from otfed.data.text.splits import party_rng, split_positions, stratified_cap
from otfed.errors import ConfigError, DataFileError


def _make_party(name: str, role: str, source: str, rows: RawRows, mask: np.ndarray, spec: TextTaskSpec,
                seed: int) -> tuple[TextParty, TextSplit]:
    """The party's train / val / test splits, and the rows of its train split that the train cap left out
    (texts and labels: the pool a held-out transfer set draws from, never in any party's train, val or test
    split; its labels serve the audit slice only)."""
    assert rows.label is not None
    labels = label_indices(rows.label[mask], spec.task, rows.path, name)
    texts, ids = rows.text[mask], rows.ids[mask]
    rng = party_rng(seed, spec.task, name)
    parts = split_positions(labels, None if rows.group is None else rows.group[mask],
                             None if rows.fixed_split is None else rows.fixed_split[mask], spec, rng, name)
    splits, spare = [], np.array([], dtype=np.int64)
    for split, part in zip(SPLITS, parts):
        keep = part[stratified_cap(labels[part], spec.train_cap(name) if split == "train" else spec.max_eval, rng)]
        splits.append(TextSplit(tuple(texts[keep]), labels[keep], tuple(ids[keep])))
        if split == "train":
            spare = np.setdiff1d(part, keep)
    return TextParty(name, role, source, *splits), TextSplit(tuple(texts[spare]), labels[spare])


def held_out_picks(sizes: list[int], n: int | None, rng: np.random.Generator) -> list[np.ndarray]:
    """Sorted positions, per pool, of ``n`` rows drawn uniformly without replacement from pools of ``sizes``
    rows (the parties' spare train rows), as evenly over the pools as their sizes allow (largest remainder,
    a full pool's surplus going to the others); every row when ``n`` is None or exceeds the pools."""
    sizes_ = np.array(sizes, dtype=np.int64)
    target = int(sizes_.sum()) if n is None else min(int(n), int(sizes_.sum()))
    take = np.zeros_like(sizes_)
    while take.sum() < target:  # each pass fills the target or at least one pool
        take = np.minimum(sizes_, take + largest_remainder(int(target - take.sum()), (take < sizes_).astype(float)))
    return [np.sort(rng.choice(int(size), int(k), replace=False)) for size, k in zip(sizes_, take)]


def audit_positions(n_transfer: int, spec: TextTaskSpec, seed: int) -> np.ndarray:
    """Sorted positions of the ``spec.audit`` transfer texts whose labels are kept for diagnostics: drawn
    uniformly without replacement from ``n_transfer`` by their own generator (the transfer texts do not
    depend on it), without looking at any label. ConfigError when ``audit`` exceeds ``n_transfer``."""
    if spec.audit > n_transfer:
        raise ConfigError(f"partition.text.tasks.{spec.task}.audit is {spec.audit}, but the transfer set has "
                          f"{n_transfer} texts; allowed: 0..{n_transfer}")
    if spec.audit == 0:
        return np.zeros(0, dtype=np.int64)
    rng = party_rng(seed, spec.task, "transfer:audit")
    return np.sort(rng.choice(n_transfer, spec.audit, replace=False)).astype(np.int64)


def build_text_federation(spec: TextTaskSpec, data_dir: str | Path, seed: int) -> TextFederation:
    """The parties of one KNOT task (KNOT §6 datasets), deterministic in ``seed``.

    Reads the task's raw files from ``data_dir``; raises :class:`DataFileError` for a missing file or
    column, an unknown label value (naming file, column, values and the allowed ones) or a party name
    with no rows (listing the available domains), and :class:`DegenerateClientError` for a party too
    small to split. Blank texts are dropped and counted in ``dropped_texts``. The transfer rows are
    separated before any label is looked at, and only their texts are kept — but for the ``spec.audit``
    rows of the audit slice (:func:`audit_positions`), whose labels alone are then converted (an unknown
    value raises :class:`DataFileError`) and kept in ``audit_labels``; ConfigError when ``audit`` exceeds
    the transfer texts.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"text federation seed must be a non-negative integer; got {seed!r}")
    data_dir = Path(data_dir)
    sources = SOURCES[(spec.task, spec.dataset)]
    labelled = [*spec.locals, spec.global_party]
    held_out = spec.transfer is None
    named = labelled if held_out else [*labelled, spec.transfer]
    wanted = set(named)

    available = {s: domain_names(s, data_dir) for s in sources}
    known = {name for names in available.values() for name in names}
    for name in named:
        if name not in known:
            where = "; ".join(f"{data_dir / RAW_FILES[s.dataset]}"
                              f"{f' (column {s.domain_column!r})' if s.domain_column else ''}: {', '.join(names)}"
                              for s, names in available.items())
            raise DataFileError(f"{spec.task} party {name!r} has no rows; available domains — {where}")

    rows_by_name: dict[str, tuple[RawRows, np.ndarray]] = {}
    transfer_texts: np.ndarray | None = None
    transfer_raw_labels: np.ndarray | None = None  # raw label strings of the transfer rows, only when audited
    transfer_path: Path | None = None
    dropped: dict[str, int] = {}
    sha: dict[str, str] = {}
    for source in sources:
        holds = [n for n in available[source] if n in wanted]
        if not holds:
            continue
        audited = spec.audit > 0 and not held_out and spec.transfer in holds
        rows = read_source(source, data_dir, spec, with_labels=audited or any(n in labelled for n in holds))
        if not held_out and spec.transfer in holds:  # separate the transfer rows first, keep only their texts
            in_transfer = rows.domain == spec.transfer
            transfer_texts = rows.text[in_transfer]
            transfer_path = rows.path
            if audited:  # kept aside, unread until the audit slice is drawn
                transfer_raw_labels = rows.label[in_transfer]
            if rows.label is not None:
                rows.label = np.where(in_transfer, None, rows.label)
        for name in holds:
            if name != spec.transfer:
                rows_by_name[name] = (rows, rows.domain == name)
        dropped[rows.path.name] = rows.dropped
        sha[rows.path.name] = file_sha256(rows.path)

    assert held_out or transfer_texts is not None
    for name in named:
        if (rows_by_name[name][1].sum() if name in rows_by_name else len(transfer_texts)) == 0:
            raise DataFileError(f"{spec.task} party {name!r}: every row has a blank text; available domains: "
                                f"{', '.join(sorted(known))}")
    built = [
        _make_party(name, "local" if name in spec.locals else "global", f"{_dataset_of(name, available)}/{name}",
                    *rows_by_name[name], spec, int(seed))
        for name in labelled
    ]
    parties = [party for party, _ in built]
    if held_out:
        pools = [pool for _, pool in built]
        if not sum(len(p) for p in pools):
            raise DataFileError(f"{spec.task}: transfer: null draws texts from the parties' spare train rows, but "
                                f"every train row is used (train_sizes / max_train keep them all); lower them or "
                                f"name a transfer domain")
        picks = held_out_picks([len(p) for p in pools], spec.max_transfer,
                               party_rng(int(seed), spec.task, "transfer:held_out"))
        transfer = tuple(pool.texts[i] for pool, pick in zip(pools, picks) for i in pick)
        audit_index = audit_positions(len(transfer), spec, int(seed))
        audit_labels = np.concatenate([pool.labels[pick] for pool, pick in zip(pools, picks)])[audit_index]
        transfer_source = f"{_dataset_of(spec.global_party, available)}/held_out"
    else:
        if spec.max_transfer is not None and spec.max_transfer < len(transfer_texts):
            pick = np.sort(party_rng(int(seed), spec.task, f"transfer:{spec.transfer}").choice(
                len(transfer_texts), spec.max_transfer, replace=False))
            transfer_texts = transfer_texts[pick]
            if transfer_raw_labels is not None:
                transfer_raw_labels = transfer_raw_labels[pick]
        transfer = tuple(transfer_texts)
        audit_index = audit_positions(len(transfer), spec, int(seed))
        audit_labels = np.zeros(0, dtype=np.int64) if transfer_raw_labels is None else \
            label_indices(transfer_raw_labels[audit_index], spec.task, transfer_path, spec.transfer)
        transfer_source = f"{_dataset_of(spec.transfer, available)}/{spec.transfer}"
    return TextFederation(
        task=spec.task, label_names=label_names(spec.task), locals=tuple(parties[:-1]), global_party=parties[-1],
        transfer_texts=transfer, transfer_source=transfer_source,
        spec=spec, seed=int(seed), dropped_texts=dropped, raw_sha256=sha,
        audit_index=audit_index, audit_labels=audit_labels)


def _dataset_of(name: str, available: dict[RawSource, tuple[str, ...]]) -> str:
    return next(s.dataset for s, names in available.items() if name in names)
