"""The parties of one KNOT task, built from the raw files: :func:`build_text_federation`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from otfed.data.text.federation import TextFederation, TextParty, TextSplit
from otfed.data.text.raw import RAW_FILES, SOURCES, RawRows, RawSource, domain_names, file_sha256, label_indices, \
    read_source
from otfed.data.text.spec import SPLITS, TextTaskSpec, label_names
from otfed.data.text.splits import party_rng, split_positions, stratified_cap
from otfed.errors import ConfigError, DataFileError


def _make_party(name: str, role: str, source: str, rows: RawRows, mask: np.ndarray, spec: TextTaskSpec,
                seed: int) -> TextParty:
    assert rows.label is not None
    labels = label_indices(rows.label[mask], spec.task, rows.path, name)
    texts, ids = rows.text[mask], rows.ids[mask]
    rng = party_rng(seed, spec.task, name)
    parts = split_positions(labels, None if rows.group is None else rows.group[mask],
                             None if rows.fixed_split is None else rows.fixed_split[mask], spec, rng, name)
    splits = []
    for split, part in zip(SPLITS, parts):
        keep = part[stratified_cap(labels[part], spec.max_train if split == "train" else spec.max_eval, rng)]
        splits.append(TextSplit(tuple(texts[keep]), labels[keep], tuple(ids[keep])))
    return TextParty(name, role, source, *splits)


def build_text_federation(spec: TextTaskSpec, data_dir: str | Path, seed: int) -> TextFederation:
    """The parties of one KNOT task (KNOT §6 datasets; SPEC §1 "Experiments"), deterministic in ``seed``.

    Reads the task's raw files from ``data_dir``; raises :class:`DataFileError` for a missing file or
    column, an unknown label value (naming file, column, values and the allowed ones) or a party name
    with no rows (listing the available domains), and :class:`DegenerateClientError` for a party too
    small to split. Blank texts are dropped and counted in ``dropped_texts``. The transfer rows are
    separated before any label is looked at, and only their texts are kept.
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"text federation seed must be a non-negative integer; got {seed!r}")
    data_dir = Path(data_dir)
    sources = SOURCES[(spec.task, spec.dataset)]
    labelled = [*spec.locals, spec.global_party]
    wanted = {*labelled, spec.transfer}

    available = {s: domain_names(s, data_dir) for s in sources}
    known = {name for names in available.values() for name in names}
    for name in [*labelled, spec.transfer]:
        if name not in known:
            where = "; ".join(f"{data_dir / RAW_FILES[s.dataset]}"
                              f"{f' (column {s.domain_column!r})' if s.domain_column else ''}: {', '.join(names)}"
                              for s, names in available.items())
            raise DataFileError(f"{spec.task} party {name!r} has no rows; available domains — {where}")

    rows_by_name: dict[str, tuple[RawRows, np.ndarray]] = {}
    transfer_texts: np.ndarray | None = None
    dropped: dict[str, int] = {}
    sha: dict[str, str] = {}
    for source in sources:
        holds = [n for n in available[source] if n in wanted]
        if not holds:
            continue
        rows = read_source(source, data_dir, spec, with_labels=any(n in labelled for n in holds))
        if spec.transfer in holds:  # separate the transfer rows first and keep only their texts
            in_transfer = rows.domain == spec.transfer
            transfer_texts = rows.text[in_transfer]
            if rows.label is not None:
                rows.label = np.where(in_transfer, None, rows.label)
        for name in holds:
            if name != spec.transfer:
                rows_by_name[name] = (rows, rows.domain == name)
        dropped[rows.path.name] = rows.dropped
        sha[rows.path.name] = file_sha256(rows.path)

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
        pick = np.sort(party_rng(int(seed), spec.task, f"transfer:{spec.transfer}").choice(
            len(transfer_texts), spec.max_transfer, replace=False))
        transfer_texts = transfer_texts[pick]
    return TextFederation(
        task=spec.task, label_names=label_names(spec.task), locals=tuple(parties[:-1]), global_party=parties[-1],
        transfer_texts=tuple(transfer_texts),
        transfer_source=f"{_dataset_of(spec.transfer, available)}/{spec.transfer}",
        spec=spec, seed=int(seed), dropped_texts=dropped, raw_sha256=sha)


def _dataset_of(name: str, available: dict[RawSource, tuple[str, ...]]) -> str:
    return next(s.dataset for s, names in available.items() if name in names)
