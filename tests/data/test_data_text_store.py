"""The text partition of a KNOT task is checked on load (issue #25 item 3): labels outside the task's label
set, a party or split the manifest does not know, a role that contradicts it, row counts it does not declare,
another task's labels, parties other than the params declare → :class:`~otfed.errors.DataError` naming the file,
the column or key and what is allowed. The federation is built by hand (a few texts, every count known)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pytest

from otfed.data.text import TextFederation, TextParty, TextSplit, default_spec, label_names
from otfed.data.text.store import load_text_federation, save_text_federation
from otfed.errors import DataError, DataFileError


def hand_made() -> TextFederation:
    """Task sa (5 labels): locals a, b and global g, each 6 train / 3 val / 3 test texts; 4 transfer texts."""
    def split(party: str, name: str, n: int) -> TextSplit:
        return TextSplit(tuple(f"{party} {name} text {i}" for i in range(n)), np.arange(n) % 5)

    def party(name: str, role: str) -> TextParty:
        return TextParty(name, role, f"hand/{name}", split(name, "train", 6), split(name, "val", 3),
                         split(name, "test", 3))

    return TextFederation(task="sa", label_names=label_names("sa"), locals=(party("a", "local"), party("b", "local")),
                          global_party=party("g", "global"), transfer_texts=tuple(f"t{i}" for i in range(4)),
                          transfer_source="hand/t", seed=0)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    save_text_federation(hand_made(), tmp_path / "sa")
    return tmp_path / "sa"


def edit_parties(folder: Path, edit: Callable[[pd.DataFrame], None]) -> Path:
    path = folder / "parties.csv.gz"
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    edit(frame)
    path.write_bytes(gzip.compress(frame.to_csv(index=False).encode()))
    return path


def set_cell(column: str, row: int, value: str) -> Callable[[pd.DataFrame], None]:
    def edit(frame: pd.DataFrame) -> None:
        frame.loc[row, column] = value
    return edit


def edit_manifest(folder: Path, edit: Callable[[dict], None]) -> Path:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    return path


def test_a_valid_folder_loads_as_saved(folder: Path) -> None:
    assert load_text_federation(folder, task="sa") == hand_made()


def test_label_99_names_the_file_the_column_and_the_range(folder: Path) -> None:
    path = edit_parties(folder, set_cell("label", 7, "99"))  # party a's train rows are 0-5, its val rows 6-8
    with pytest.raises(DataError) as info:
        load_text_federation(folder)
    assert str(info.value) == (f"{path}: column 'label' must hold indices 0..4 (the 5 labels of task 'sa'); found "
                               f"'99' (first: party 'a', split 'val')")


@pytest.mark.parametrize("column, value, message", [
    ("split", "tst", r"column 'split' holds 'tst'; allowed: train, val, test$"),
    ("party", "z", r"column 'party' holds 'z', not a party of manifest.json; allowed: 'a', 'b', 'g'$"),
    ("role", "global", r"column 'role' is 'global' for party 'a'; manifest.json declares 'local'$"),
])
def test_a_value_the_manifest_does_not_declare_is_named(folder: Path, column: str, value: str, message: str) -> None:
    path = edit_parties(folder, set_cell(column, 0, value))
    with pytest.raises(DataError, match=message) as info:
        load_text_federation(folder)
    assert str(info.value).startswith(f"{path}: ")


def test_rows_the_manifest_does_not_count_are_named(folder: Path) -> None:
    edit_parties(folder, lambda f: f.drop(index=0, inplace=True))
    with pytest.raises(DataError, match=r"parties\.csv\.gz: 5 rows of party 'a', split 'train'; manifest.json "
                                        r"declares 6$"):
        load_text_federation(folder)
    transfer = folder / "transfer.csv.gz"
    transfer.write_bytes(gzip.compress(b"text\nonly one\n"))
    edit_manifest(folder, lambda m: m["parties"][0]["counts"]["train"].update(n=5))
    with pytest.raises(DataError, match=r"transfer\.csv\.gz: 1 transfer texts; manifest.json declares 4$"):
        load_text_federation(folder)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(label_names=["neg", "pos"]), r"key 'label_names' is \['neg', 'pos'\]; task 'sa' has the "
                                                     r"5 labels \['strong negative'"),
    (lambda m: m.update(task="xx"), r"key 'task' is 'xx'; allowed: sa, erc, nli$"),
    (lambda m: m["parties"][1].update(role="server"), r"key 'parties\[1\].role' is 'server'; allowed: local, global$"),
])
def test_a_manifest_off_its_format_is_named(folder: Path, edit: Callable[[dict], None], message: str) -> None:
    path = edit_manifest(folder, edit)
    with pytest.raises(DataError, match=message) as info:
        load_text_federation(folder)
    assert str(info.value).startswith(f"{path}: ")


def test_another_task_or_other_parties_than_declared_are_named(folder: Path) -> None:
    with pytest.raises(DataError, match=r"manifest\.json: key 'task' is 'sa'; allowed: 'erc'$"):
        load_text_federation(folder, task="erc")
    spec = default_spec("sa", locals=["a", "c"], global_party="g", transfer=None)
    with pytest.raises(DataError, match=r"key 'parties' lists \[\('a', 'local'\), \('b', 'local'\), \('g', 'global'\)"
                                        r"\] \(name, role\), but partition.text.tasks.sa declares \[\('a', 'local'\), "
                                        r"\('c', 'local'\), \('g', 'global'\)\]"):
        load_text_federation(folder, spec=spec)
    ok = default_spec("sa", locals=["a", "b"], global_party="g", transfer=None)
    assert load_text_federation(folder, spec=ok) == hand_made()


def test_a_missing_column_is_named(folder: Path) -> None:
    edit_parties(folder, lambda f: f.drop(columns=["split"], inplace=True))
    with pytest.raises(DataFileError, match=r"parties\.csv\.gz: missing column\(s\) 'split'; found: party, role, "
                                            r"text, label, id$"):
        load_text_federation(folder)
