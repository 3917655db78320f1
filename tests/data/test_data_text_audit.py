"""The audit slice of the KNOT transfer set: a few transfer texts, drawn uniformly and seeded, whose labels are
kept for diagnostics only. Its labels are checked against the raw CSVs re-read independently with pandas (by
text), the transfer texts against a federation built without the slice, and the stored ``audit.csv.gz``
against the format (bad contents → :class:`~otfed.errors.DataError` naming the file, the column and what is
allowed)."""
from __future__ import annotations

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from otfed.data.text import (RAW_FILES, SPLITS, TextFederation, TextParty, TextSplit, build_text_federation,
                             default_spec, label_names, load_text_federation, save_text_federation)
from otfed.errors import ConfigError, DataError, DataFileError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
SEP = " [SEP] "
SMALL = dict(max_train=50, max_eval=20, max_transfer=200)


def raw(dataset: str) -> pd.DataFrame:
    return pd.read_csv(RAW / RAW_FILES[dataset], keep_default_na=False)


def labels_by_text(texts: pd.Series, labels: pd.Series) -> dict[str, set[int]]:
    """Raw text → the label indices its rows carry (a text may occur more than once)."""
    out: dict[str, set[int]] = {}
    for text, label in zip(texts, labels):
        out.setdefault(text, set()).add(int(label))
    return out


@pytest.fixture(scope="module")
def sa():
    """SA (transfer domain grocery_food, 200 texts) with a 30-row audit slice, seeds 0 and 1, and without one."""
    spec = default_spec("sa", **SMALL, audit=30)
    return {"spec": spec,
            0: build_text_federation(spec, RAW, seed=0),
            1: build_text_federation(spec, RAW, seed=1),
            "none": build_text_federation(spec.model_copy(update=dict(audit=0)), RAW, seed=0)}


# ------------------------------------------------------------------------------------------ drawing
def test_audit_positions_are_distinct_sorted_in_range_and_seeded(sa):
    fed = sa[0]
    assert fed.audit_index.dtype == np.int64 and fed.audit_labels.dtype == np.int64
    assert fed.audit_index.size == fed.audit_labels.size == 30
    assert np.array_equal(fed.audit_index, np.unique(fed.audit_index))  # sorted and distinct
    assert 0 <= fed.audit_index.min() and fed.audit_index.max() < len(fed.transfer_texts) == 200
    again = build_text_federation(sa["spec"], RAW, seed=0)
    assert np.array_equal(again.audit_index, fed.audit_index) and again == fed
    assert not np.array_equal(sa[1].audit_index, fed.audit_index)


def test_audit_labels_are_the_raw_labels_of_the_audited_texts(sa):
    frame = raw("amazon_categories")
    grocery = frame[frame["domain"] == "grocery_food"]
    truth = labels_by_text(grocery["text"], grocery["label"] - 1)  # stars 1..5 → 0..4
    for seed in (0, 1):
        fed = sa[seed]
        for i, label in zip(fed.audit_index, fed.audit_labels):
            assert truth[fed.transfer_texts[i]] == {label}


def test_the_slice_leaves_every_text_and_split_as_it_was(sa):
    without = sa["none"]
    assert without.audit_index.size == without.audit_labels.size == 0
    assert sa[0].transfer_texts == without.transfer_texts
    assert sa[0].parties == without.parties
    assert dataclasses.replace(sa[0], spec=without.spec, audit_index=np.zeros(0, np.int64),
                               audit_labels=np.zeros(0, np.int64)) == without


def test_held_out_transfer_audit_labels_match_the_raw_file():
    spec = default_spec("sa", transfer=None, **SMALL, audit=40)
    fed = build_text_federation(spec, RAW, seed=0)
    without = build_text_federation(spec.model_copy(update=dict(audit=0)), RAW, seed=0)
    assert fed.transfer_texts == without.transfer_texts and len(fed.transfer_texts) == 200
    assert fed.audit_index.size == 40
    frame = raw("amazon_categories")
    mine = frame[frame["domain"].isin([p.name for p in fed.parties])]
    truth = labels_by_text(mine["text"], mine["label"] - 1)
    for i, label in zip(fed.audit_index, fed.audit_labels):
        assert truth[fed.transfer_texts[i]] == {label}


def test_anli_labels_are_read_only_for_an_audit():
    fed = build_text_federation(default_spec("nli", **SMALL, audit=25), RAW, seed=0)
    anli = raw("anli")
    names = label_names("nli")
    truth = labels_by_text(anli["premise"] + SEP + anli["hypothesis"], anli["label"].map(names.index))
    assert fed.audit_index.size == 25
    for i, label in zip(fed.audit_index, fed.audit_labels):
        assert truth[fed.transfer_texts[i]] == {label}


# --------------------------------------------------------------------------------------- bad input
def test_an_audit_larger_than_the_transfer_set_names_the_key():
    with pytest.raises(ConfigError) as err:
        build_text_federation(default_spec("sa", **SMALL, audit=201), RAW, seed=0)
    assert str(err.value) == ("partition.text.tasks.sa.audit is 201, but the transfer set has 200 texts; "
                              "allowed: 0..200")
    with pytest.raises(ConfigError, match="audit"):
        default_spec("sa", audit=-1)


def test_an_unknown_audited_label_is_named(tmp_path):
    for name in RAW_FILES.values():
        shutil.copy(RAW / name, tmp_path / name)
    frame = raw("amazon_categories").astype({"label": object})
    frame.loc[frame["domain"] == "grocery_food", "label"] = "7"
    frame.to_csv(tmp_path / RAW_FILES["amazon_categories"], index=False, compression="gzip")
    with pytest.raises(DataFileError) as err:
        build_text_federation(default_spec("sa", **SMALL, audit=5), tmp_path, seed=0)
    message = str(err.value)
    assert RAW_FILES["amazon_categories"] in message and "column 'label'" in message and "'7'" in message
    assert "party 'grocery_food'" in message and "allowed: 1, 2, 3, 4, 5" in message


def test_the_federation_refuses_an_inconsistent_slice(sa):
    with pytest.raises(ValueError, match="same length"):
        dataclasses.replace(sa[0], audit_labels=sa[0].audit_labels[:-1])
    with pytest.raises(ValueError, match="increasing, distinct positions 0..199"):
        dataclasses.replace(sa[0], audit_index=sa[0].audit_index[::-1])
    with pytest.raises(ValueError, match="increasing, distinct positions 0..199"):
        dataclasses.replace(sa[0], audit_index=np.r_[sa[0].audit_index[:-1], 200])


# ------------------------------------------------------------------------------------------- store
def test_save_load_round_trip(sa, tmp_path):
    fed = sa[0]
    save_text_federation(fed, tmp_path / "sa")
    loaded = load_text_federation(tmp_path / "sa", task="sa")
    assert loaded == fed
    assert np.array_equal(loaded.audit_index, fed.audit_index)
    assert np.array_equal(loaded.audit_labels, fed.audit_labels)
    audit = pd.read_csv(tmp_path / "sa" / "audit.csv.gz")
    assert list(audit.columns) == ["index", "label"] and len(audit) == 30
    assert json.loads((tmp_path / "sa" / "manifest.json").read_text())["transfer"]["audit"] == 30
    save_text_federation(fed, tmp_path / "again")
    assert (tmp_path / "sa" / "audit.csv.gz").read_bytes() == (tmp_path / "again" / "audit.csv.gz").read_bytes()
    save_text_federation(sa["none"], tmp_path / "none")
    assert gzip.decompress((tmp_path / "none" / "audit.csv.gz").read_bytes()) == b"index,label\n"
    assert load_text_federation(tmp_path / "none") == sa["none"]


def hand_made() -> TextFederation:
    """Task sa: locals a, b and global g (3 texts per split), 4 transfer texts, of which 0 and 2 are audited."""
    def party(name: str, role: str) -> TextParty:
        return TextParty(name, role, f"hand/{name}",
                         *(TextSplit(tuple(f"{name} {s} {i}" for i in range(3)), np.arange(3)) for s in SPLITS))

    return TextFederation(task="sa", label_names=label_names("sa"), locals=(party("a", "local"), party("b", "local")),
                          global_party=party("g", "global"), transfer_texts=tuple(f"t{i}" for i in range(4)),
                          transfer_source="hand/t", seed=0, audit_index=np.array([0, 2]),
                          audit_labels=np.array([1, 4]))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_text_federation(hand_made(), tmp_path / "sa")
    return tmp_path / "sa"


def write_audit(folder: Path, body: str) -> Path:
    path = folder / "audit.csv.gz"
    path.write_bytes(gzip.compress(body.encode()))
    return path


def test_a_valid_folder_loads_as_saved_in_any_row_order(folder: Path) -> None:
    assert load_text_federation(folder) == hand_made()
    write_audit(folder, "index,label\n2,4\n0,1\n")
    assert load_text_federation(folder) == hand_made()


@pytest.mark.parametrize("body, message", [
    ("index,label\n0,1\n4,4\n", "column 'index' must hold positions 0..3 into the 4 texts of transfer.csv.gz; "
                                "found '4'"),
    ("index,label\n-1,1\n2,4\n", "column 'index' must hold positions 0..3 into the 4 texts of transfer.csv.gz; "
                                 "found '-1'"),
    ("index,label\n0,1\n1.5,4\n", "column 'index' must hold positions 0..3 into the 4 texts of transfer.csv.gz; "
                                  "found '1.5'"),
    ("index,label\nx,1\n2,4\n", "column 'index' must hold positions 0..3 into the 4 texts of transfer.csv.gz; "
                                "found 'x'"),
    ("index,label\n2,1\n2,4\n", "column 'index' repeats 2; each transfer text is audited at most once"),
    ("index,label\n0,1\n2,5\n", "column 'label' must hold indices 0..4 (the 5 labels of task 'sa'); found '5'"),
    ("index,label\n0,1\n2,pos\n", "column 'label' must hold indices 0..4 (the 5 labels of task 'sa'); found 'pos'"),
    ("index,label\n0,1\n", "1 audit rows; manifest.json declares 2 (key 'transfer.audit')"),
])
def test_bad_audit_rows_name_the_file_and_the_column(folder: Path, body: str, message: str) -> None:
    path = write_audit(folder, body)
    with pytest.raises(DataError) as info:
        load_text_federation(folder)
    assert str(info.value) == f"{path}: {message}"


def test_a_missing_audit_file_or_column_is_named(folder: Path) -> None:
    write_audit(folder, "index\n0\n2\n")
    with pytest.raises(DataFileError, match=r"audit\.csv\.gz: missing column\(s\) 'label'; found: index$"):
        load_text_federation(folder)
    (folder / "audit.csv.gz").unlink()
    with pytest.raises(DataFileError, match=r"audit\.csv\.gz: text dataset file not found"):
        load_text_federation(folder)
