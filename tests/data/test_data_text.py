"""KNOT text parties (KNOT §6): labels, texts, splits and chunks are checked against the raw CSVs
re-read independently with pandas; bad inputs fail with messages naming file, column and value; the
transfer set's labels are provably never read."""

import dataclasses
import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from otfed.data.text import (
    RAW_FILES,
    SPLITS,
    TASKS,
    TextSplit,
    TextTaskSpec,
    build_text_federation,
    default_spec,
    federation_summary,
    load_text_federation,
    save_text_federation,
)
from otfed.data.apportionment import stratified_parts
from otfed.label_space import LabelSpace
from otfed.errors import ConfigError, DataFileError, DegenerateClientError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
SEP = " [SEP] "
UNCAPPED = dict(max_train=None, max_eval=None, max_transfer=None)
# independent truth: the unified raw label → the LabelSpace name (KNOT fig. 3)
ERC_NAME = {"neutral": "no emotion", "anger": "anger", "joy": "happiness", "sadness": "sadness",
            "surprise": "surprise"}


def raw(dataset: str) -> pd.DataFrame:
    return pd.read_csv(RAW / RAW_FILES[dataset], keep_default_na=False)


def write_raw(frame: pd.DataFrame, path: Path) -> None:
    frame.to_csv(path, index=False, compression={"method": "gzip", "compresslevel": 1})


def rows_of(split: TextSplit) -> np.ndarray:
    """Raw row numbers behind a split's ids ("<file stem>:<row>")."""
    return np.array([int(i.rsplit(":", 1)[1]) for i in split.ids], dtype=np.int64)


def all_rows(party) -> np.ndarray:
    return np.concatenate([rows_of(party.split(s)) for s in SPLITS])


@pytest.fixture(scope="module")
def feds():
    """Default (capped) and uncapped federations of every task, seed 0."""
    out = {}
    for task in TASKS:
        out[task] = build_text_federation(default_spec(task), RAW, seed=0)
        out[task, "full"] = build_text_federation(default_spec(task, **UNCAPPED), RAW, seed=0)
    return out


@pytest.fixture(scope="module")
def erc_all_chunks():
    """ERC with all four DailyDialog chunks labelled (MELD as transfer), uncapped."""
    spec = default_spec("erc", locals=("dd_chunk1", "dd_chunk2", "dd_chunk4"), global_party="dd_chunk3",
                        transfer="meld", **UNCAPPED)
    return build_text_federation(spec, RAW, seed=0)


# ------------------------------------------------------------------------------------- defaults
def test_default_specs_and_label_names(feds):
    assert default_spec("sa").locals == ("cell_phones", "musical_instruments", "digital_music")
    assert (default_spec("sa").global_party, default_spec("sa").transfer) == ("baby", "grocery_food")
    assert default_spec("erc").locals == ("dd_chunk1", "dd_chunk2", "meld")
    assert (default_spec("erc").global_party, default_spec("erc").transfer) == ("dd_chunk3", "dd_chunk4")
    assert default_spec("nli").locals == ("fiction", "government", "slate", "telephone", "travel")
    assert (default_spec("nli").global_party, default_spec("nli").transfer) == ("snli", "anli")
    alt = default_spec("sa", dataset="womens_clothing")
    assert (alt.locals, alt.global_party, alt.transfer) == (("tops", "dresses", "bottoms"), "intimate", "jackets")
    for task in TASKS:
        fed = feds[task]
        assert fed.label_names == LabelSpace.for_task(task).labels
        assert [p.name for p in fed.locals] == list(fed.spec.locals) and fed.global_party.role == "global"
        assert all(p.role == "local" for p in fed.locals)


@pytest.mark.parametrize("kwargs, key", [
    (dict(locals=("baby",)), "repeated: baby"),
    (dict(max_train=0), "max_train"),
    (dict(val_fraction=0.5, test_fraction=0.5), "val_fraction + test_fraction"),
    (dict(dataset="imdb"), "unknown dataset 'imdb'"),
    (dict(lr=1.0), "unknown field(s) lr"),
])
def test_bad_spec_names_the_field(kwargs, key):
    with pytest.raises(ConfigError) as err:
        default_spec("sa", **kwargs)
    assert key in str(err.value)


# ------------------------------------------------------------------------- labels and texts vs CSV
def test_sa_labels_and_texts_match_the_csv(feds):
    frame = raw("amazon_categories")
    fed = feds["sa", "full"]
    for party in fed.parties:
        rows = all_rows(party)
        domain = frame[frame["domain"] == party.name]
        np.testing.assert_array_equal(np.sort(rows), domain.index.to_numpy())  # every row, once
        for s in SPLITS:
            split = party.split(s)
            src = frame.loc[rows_of(split)]
            assert list(split.texts) == src["text"].tolist()
            np.testing.assert_array_equal(split.labels, src["label"].to_numpy() - 1)  # stars 1..5 → 0..4
        counts = sum(np.bincount(party.split(s).labels, minlength=5) for s in SPLITS)
        expected = domain["label"].value_counts().reindex([1, 2, 3, 4, 5], fill_value=0).to_numpy()
        np.testing.assert_array_equal(counts, expected)
    transfer = frame.loc[frame["domain"] == "grocery_food", "text"]
    assert sorted(fed.transfer_texts) == sorted(transfer)
    assert fed.dropped_texts == {"sentiment_amazon_categories.csv.gz": 0}


def test_nli_labels_and_texts_match_the_csvs(feds):
    fed = feds["nli", "full"]
    names = LabelSpace.for_task("nli").labels
    for party in fed.parties:
        frame = raw("snli" if party.name == "snli" else "multinli")
        if party.name != "snli":
            assert set(frame.loc[all_rows(party), "genre"]) == {party.name}
            assert all_rows(party).size == (frame["genre"] == party.name).sum()
        for s in SPLITS:
            split = party.split(s)
            src = frame.loc[rows_of(split)]
            assert list(split.texts) == (src["premise"] + SEP + src["hypothesis"]).tolist()
            assert [names[i] for i in split.labels] == src["label"].tolist()
    anli = raw("anli")
    assert sorted(fed.transfer_texts) == sorted(anli["premise"] + SEP + anli["hypothesis"])


def test_erc_labels_utterances_and_meld_split_match_the_csvs(feds):
    fed = feds["erc", "full"]
    names = LabelSpace.for_task("erc").labels
    for party in fed.parties:
        frame = raw("meld" if party.name == "meld" else "dailydialog")
        for s in SPLITS:
            split = party.split(s)
            src = frame.loc[rows_of(split)]
            assert [t.rsplit(SEP, 1)[-1] for t in split.texts] == src["text"].tolist()
            assert [names[i] for i in split.labels] == [ERC_NAME[v] for v in src["label"]]
            if party.name == "meld":  # MELD keeps its own split
                assert set(src["split"]) == {{"train": "train", "val": "dev", "test": "test"}[s]}
    meld = raw("meld")
    counts = sum(np.bincount(fed.party("meld").split(s).labels, minlength=5) for s in SPLITS)
    expected = meld["label"].map(ERC_NAME).value_counts().reindex(names, fill_value=0).to_numpy()
    np.testing.assert_array_equal(counts, expected)


def test_erc_context_holds_the_previous_turns_of_the_dialogue(feds):
    frame = raw("dailydialog")
    frame = frame.assign(row=frame.index).sort_values(["dialogue_id", "utt_idx"])
    expected = {}
    for _, dialogue in frame.groupby("dialogue_id"):
        texts, rows = dialogue["text"].tolist(), dialogue["row"].tolist()
        for k, row in enumerate(rows):
            expected[row] = SEP.join(texts[max(0, k - 2):k + 1])
    fed = feds["erc", "full"]
    n_with_context = 0
    for party in fed.parties[:2] + (fed.global_party,):
        for s in SPLITS:
            split = party.split(s)
            for text, row in zip(split.texts, rows_of(split)):
                assert text == expected[row]
                n_with_context += SEP in text
    assert n_with_context > 3000
    bare = build_text_federation(default_spec("erc", context_turns=0), RAW, seed=0)
    split = bare.locals[0].train
    assert list(split.texts) == raw("dailydialog").loc[rows_of(split), "text"].tolist()


# ------------------------------------------------------------------------------------ splitting
def test_stratified_parts_meet_sizes_and_label_shares_within_one_row():
    rng = np.random.default_rng(0)
    for _ in range(300):
        labels = rng.integers(0, rng.integers(1, 7), rng.integers(5, 200))
        sizes = rng.multinomial(labels.size, rng.dirichlet(np.ones(rng.integers(2, 5))))
        parts = stratified_parts(labels, sizes, rng)
        np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(labels.size))
        counts = np.bincount(labels, minlength=6)
        for size, part in zip(sizes, parts):
            assert part.size == size
            assert np.abs(np.bincount(labels[part], minlength=6) - counts * size / labels.size).max() <= 1 + 1e-9


@pytest.mark.parametrize("task", ["sa", "nli"])
def test_splits_are_disjoint_and_stratified(feds, task):
    spec = feds[task].spec
    for full, capped in zip(feds[task, "full"].parties, feds[task].parties):
        ids = [set(full.split(s).ids) for s in SPLITS]
        assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
        labels = np.concatenate([full.split(s).labels for s in SPLITS])
        counts, n = np.bincount(labels, minlength=5), labels.size
        for s in SPLITS:
            part = full.split(s).labels
            share = np.bincount(part, minlength=5) - counts * part.size / n
            assert np.abs(share).max() <= 1.0, (full.name, s, share)
        assert abs(full.val.labels.size - spec.val_fraction * n) <= 1
        assert abs(full.test.labels.size - spec.test_fraction * n) <= 1
        # a cap subsamples the same split, stratified
        for s, cap in zip(SPLITS, (spec.max_train, spec.max_eval, spec.max_eval)):
            whole, sub = full.split(s), capped.split(s)
            assert len(sub) == min(cap, len(whole)) and set(sub.ids) <= set(whole.ids)
            share = (np.bincount(sub.labels, minlength=5)
                     - np.bincount(whole.labels, minlength=5) * len(sub) / len(whole))
            assert np.abs(share).max() <= 1.0, (full.name, s, share)


def test_erc_chunks_are_contiguous_whole_dialogues(erc_all_chunks):
    frame = raw("dailydialog")
    order = {"train": 0, "validation": 1, "test": 2}
    pooled = (frame.assign(first=frame.index, rank=frame["split"].map(order))
              .groupby("dialogue_id").agg(rank=("rank", "first"), first=("first", "min"), n=("text", "size"))
              .sort_values(["rank", "first"]))
    position = {d: i for i, d in enumerate(pooled.index)}
    blocks = []
    for k in range(1, 5):
        party = erc_all_chunks.party(f"dd_chunk{k}")
        dialogues = set(frame.loc[all_rows(party), "dialogue_id"])
        # whole dialogues: the chunk holds every utterance of each of its dialogues
        assert all_rows(party).size == pooled.loc[list(dialogues), "n"].sum()
        blocks.append(sorted(position[d] for d in dialogues))
        assert abs(all_rows(party).size - len(frame) / 4) <= pooled["n"].max()
        # no dialogue in two splits
        per_split = [set(frame.loc[rows_of(party.split(s)), "dialogue_id"]) for s in SPLITS]
        assert not (per_split[0] & per_split[1] or per_split[0] & per_split[2] or per_split[1] & per_split[2])
    flat = [p for block in blocks for p in block]
    assert flat == list(range(len(pooled)))  # contiguous, in order 1..4, covering every dialogue


# --------------------------------------------------------------------- determinism and round trip
def test_same_seed_same_federation_other_seed_differs(feds):
    for task in ("sa", "erc"):
        again = build_text_federation(default_spec(task), RAW, seed=0)
        other = build_text_federation(default_spec(task), RAW, seed=1)
        assert again == feds[task]
        assert other != feds[task]
        assert other.locals[0].train.texts != feds[task].locals[0].train.texts
        assert other.transfer_texts != feds[task].transfer_texts


def test_save_load_round_trip(feds, tmp_path):
    fed = feds["erc"]
    save_text_federation(fed, tmp_path / "erc")
    assert load_text_federation(tmp_path / "erc") == fed
    parties = pd.read_csv(tmp_path / "erc" / "parties.csv.gz")
    assert list(parties.columns) == ["party", "role", "split", "text", "label", "id"]
    assert list(pd.read_csv(tmp_path / "erc" / "transfer.csv.gz").columns) == ["text"]
    manifest = json.loads((tmp_path / "erc" / "manifest.json").read_text())
    for name, digest in manifest["raw_files"].items():
        assert digest == hashlib.sha256((RAW / name).read_bytes()).hexdigest()
    assert manifest["label_names"] == list(LabelSpace.for_task("erc").labels)
    # equal federations give byte-identical files (stable DVC hashes)
    save_text_federation(fed, tmp_path / "again")
    for name in ("parties.csv.gz", "transfer.csv.gz", "audit.csv.gz", "manifest.json"):
        assert (tmp_path / "erc" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_summary_counts(feds):
    fed = feds["nli"]
    table = federation_summary(fed)
    assert len(table) == 3 * len(fed.parties) + 1
    body = table[table["role"] != "transfer"]
    np.testing.assert_array_equal(body[list(fed.label_names)].sum(axis=1).to_numpy(), body["n"].to_numpy())
    row = body[(body["party"] == "snli") & (body["split"] == "test")].iloc[0]
    assert row["n"] == len(fed.global_party.test) == 300
    last = table.iloc[-1]
    assert (last["party"], last["role"], last["n"]) == ("anli", "transfer", len(fed.transfer_texts))
    assert last[list(fed.label_names)].isna().all()


# ------------------------------------------------------------------------- transfer labels unread
def _federation_without_provenance(fed):
    return dataclasses.replace(fed, raw_sha256={})


@pytest.mark.parametrize("task", TASKS)
def test_transfer_labels_are_never_read(feds, task, tmp_path):
    """Transfer labels replaced by an invalid value: no error and the very same federation."""
    for name in RAW_FILES.values():
        shutil.copy(RAW / name, tmp_path / name)
    poison = "POISONED-LABEL"
    if task == "sa":
        frame = raw("amazon_categories").astype({"label": object})
        frame.loc[frame["domain"] == "grocery_food", "label"] = poison
        write_raw(frame, tmp_path / RAW_FILES["amazon_categories"])
    elif task == "erc":  # DailyDialog's test split lies wholly in the last chunk (the transfer set)
        frame = raw("dailydialog")
        frame.loc[frame["split"] == "test", "label"] = poison
        write_raw(frame, tmp_path / RAW_FILES["dailydialog"])
    else:  # ANLI: the label column is not even needed
        frame = raw("anli").drop(columns=["label"])
        write_raw(frame, tmp_path / RAW_FILES["anli"])
    fed = build_text_federation(default_spec(task), tmp_path, seed=0)
    assert _federation_without_provenance(fed) == _federation_without_provenance(feds[task])
    assert poison not in repr(dataclasses.asdict(fed))
    save_text_federation(fed, tmp_path / "out")
    for name in ("parties.csv.gz", "transfer.csv.gz", "audit.csv.gz"):
        assert poison not in gzip.decompress((tmp_path / "out" / name).read_bytes()).decode()
    assert "label" not in pd.read_csv(tmp_path / "out" / "transfer.csv.gz").columns


# ------------------------------------------------------------------------------------ bad input
def write_sa(tmp_path, frame):
    write_raw(frame, tmp_path / RAW_FILES["amazon_categories"])


def tiny_sa(n=20):
    rows = [{"text": f"review {d} {i}", "label": 1 + i % 5, "domain": d} for d in "abcgt" for i in range(n)]
    return pd.DataFrame(rows)


TINY_SPEC = TextTaskSpec(task="sa", dataset="amazon_categories", locals=("a", "b", "c"), global_party="g",
                         transfer="t", max_train=None, max_eval=None, max_transfer=None)


def test_missing_file_and_column_are_named(tmp_path):
    with pytest.raises(DataFileError, match=r"sentiment_amazon_categories\.csv\.gz: text dataset file not found"):
        build_text_federation(TINY_SPEC, tmp_path, seed=0)
    write_sa(tmp_path, tiny_sa().drop(columns=["domain"]))
    with pytest.raises(DataFileError, match=r"sentiment_amazon_categories\.csv\.gz: missing column\(s\) 'domain'"):
        build_text_federation(TINY_SPEC, tmp_path, seed=0)


@pytest.mark.parametrize("dataset, column, value, allowed", [
    ("amazon_categories", "label", "7", "1, 2, 3, 4, 5"),
    ("dailydialog", "label", "fear", "neutral, anger, joy, sadness, surprise"),
    ("multinli", "label", "hidden", "entailment, neutral, contradiction"),
])
def test_unknown_label_names_file_column_value_and_allowed(tmp_path, dataset, column, value, allowed):
    for name in RAW_FILES.values():
        shutil.copy(RAW / name, tmp_path / name)
    frame = raw(dataset).astype({column: object})
    frame.loc[3, column] = value  # row 3 is a local party's: musical_instruments, dd_chunk1, fiction
    write_raw(frame, tmp_path / RAW_FILES[dataset])
    task = {"amazon_categories": "sa", "dailydialog": "erc", "multinli": "nli"}[dataset]
    with pytest.raises(DataFileError) as err:
        build_text_federation(default_spec(task), tmp_path, seed=0)
    message = str(err.value)
    assert RAW_FILES[dataset] in message and f"column '{column}'" in message
    assert repr(value) in message and f"allowed: {allowed}" in message


def test_unknown_domain_lists_the_available_ones(tmp_path):
    write_sa(tmp_path, tiny_sa())
    spec = TINY_SPEC.model_copy(update=dict(locals=("a", "toys")))
    with pytest.raises(DataFileError, match=r"party 'toys' has no rows.*column 'domain'.*: a, b, c, g, t"):
        build_text_federation(spec, tmp_path, seed=0)
    with pytest.raises(DataFileError, match=r"party 'nope' has no rows.*dd_chunk1, dd_chunk2, dd_chunk3, "
                                            r"dd_chunk4.*erc_meld\.csv\.gz: meld"):
        build_text_federation(default_spec("erc", global_party="nope"), RAW, seed=0)


def test_blank_texts_are_dropped_and_counted(tmp_path):
    frame = tiny_sa()
    frame.loc[[0, 1, 25], "text"] = ["", "   ", np.nan]  # two in domain a, one in b
    frame.loc[99, "text"] = ""  # one in transfer domain t
    frame = frame.astype({"text": object})
    write_sa(tmp_path, frame)
    fed = build_text_federation(TINY_SPEC, tmp_path, seed=0)
    assert fed.dropped_texts == {"sentiment_amazon_categories.csv.gz": 4}
    assert sum(len(fed.party("a").split(s)) for s in SPLITS) == 18
    assert sum(len(fed.party("b").split(s)) for s in SPLITS) == 19
    assert len(fed.transfer_texts) == 19
    assert all(t.strip() for p in fed.parties for s in SPLITS for t in p.split(s).texts)


def test_a_party_too_small_to_split_is_named(tmp_path):
    frame = tiny_sa()
    write_sa(tmp_path, pd.concat([frame[frame["domain"] != "c"], frame[frame["domain"] == "c"].head(2)]))
    with pytest.raises(DegenerateClientError, match="party 'c'"):
        build_text_federation(TINY_SPEC, tmp_path, seed=0)


def test_load_errors_name_file_and_column(feds, tmp_path):
    with pytest.raises(DataFileError, match="manifest.json: text federation manifest not found"):
        load_text_federation(tmp_path / "none")
    save_text_federation(feds["sa"], tmp_path / "sa")
    parties = pd.read_csv(tmp_path / "sa" / "parties.csv.gz").drop(columns=["label"])
    parties.to_csv(tmp_path / "sa" / "parties.csv.gz", index=False)
    with pytest.raises(DataFileError, match=r"parties\.csv\.gz: missing column\(s\) 'label'"):
        load_text_federation(tmp_path / "sa")


# --------------------------------------------------------------- unequal sizes, held-out transfer texts
def test_held_out_transfer_comes_from_spare_train_rows_only():
    """``transfer: null`` draws the transfer texts from rows of the labelled parties' own train splits that
    no party trains on: disjoint from every train / val / test split (checked on the raw CSV's row ids),
    spread as evenly over the parties as their spare rows allow, and deterministic in the seed."""
    sizes = {"cell_phones": 1500, "musical_instruments": 600, "digital_music": 250, "baby": 100}
    spec = default_spec("sa", transfer=None, max_train=2000, max_eval=300, max_transfer=1200, train_sizes=sizes)
    fed = build_text_federation(spec, RAW, seed=0)
    assert {p.name: len(p.train) for p in fed.parties} == sizes
    assert fed.transfer_source == "amazon_categories/held_out" and len(fed.transfer_texts) == 1200
    frame = raw("amazon_categories")
    used = {i for p in fed.parties for s in SPLITS for i in p.split(s).ids}
    row_of_text = {}
    for row, text in zip(frame.index, frame.text):
        row_of_text.setdefault(text, []).append(row)
    # every transfer text is a raw row of a labelled party's domain that is in no split
    domain = dict(zip(frame.index, frame.domain))
    parties = [p.name for p in fed.parties]
    per_party = dict.fromkeys(parties, 0)
    for text in fed.transfer_texts:
        rows = [r for r in row_of_text[text] if f"sentiment_amazon_categories:{r}" not in used]
        assert rows and domain[rows[0]] in parties
        per_party[domain[rows[0]]] += 1
    assert per_party == dict.fromkeys(parties, 300)  # 1,200 over 4 parties with ≥ 300 spare rows each
    assert build_text_federation(spec, RAW, seed=0).transfer_texts == fed.transfer_texts
    assert build_text_federation(spec, RAW, seed=1).transfer_texts != fed.transfer_texts


def test_held_out_transfer_shares_a_full_pools_surplus():
    from otfed.data.text.build import held_out_picks

    picks = held_out_picks([2, 10, 10], 12, np.random.default_rng(0))
    assert [p.size for p in picks] == [2, 5, 5]
    assert all(np.array_equal(p, np.unique(p)) and p.max() < n for p, n in zip(picks, [2, 10, 10]))
    assert sum(p.size for p in held_out_picks([2, 10, 10], None, np.random.default_rng(0))) == 22
    assert sum(p.size for p in held_out_picks([2, 10, 10], 50, np.random.default_rng(0))) == 22


def test_train_sizes_name_parties_and_no_spare_rows_is_an_error():
    with pytest.raises(ValueError, match=r"train_sizes: grocery not a party of this task; parties: cell_phones"):
        default_spec("sa", train_sizes={"grocery": 10})
    with pytest.raises(ValueError, match="sizes must be integers ≥ 1"):
        default_spec("sa", train_sizes={"baby": 0})
    spec = default_spec("nli", transfer=None, max_train=None)  # every train row used: nothing left to transfer
    with pytest.raises(DataFileError, match="transfer: null draws texts from the parties' spare train rows"):
        build_text_federation(spec, RAW, seed=0)
