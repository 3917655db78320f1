"""The partition file of a federation is checked on load (issue #25 item 3): a file edited to hold label 99, a
client index past the clients listed, x and y of different lengths, test features of another image size, the
wrong dtype, or sizes its manifest does not declare → :class:`~otfed.errors.DataError` naming the file, the key
and what is allowed (never a raw IndexError, never results from bad data). NaN features still load: federated
OTDD reports such a client as degenerate (``require_finite`` is the FedBary stages' stricter reading).

The federations here are built by hand (a few rows, every value known), so each test knows exactly which
row and which value it spoilt; the images of the last tests are the embedded ones."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from otfed.data.federations import ByDatasetFederation, IidFederation, build_federation, check_image_shapes
from otfed.data.store import FederationData, load_federation, save_federation
from otfed.errors import DataError, DataFileError, DegenerateClientError, OtfedError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
N_CLIENTS, ROWS, D, N_TEST = 4, 6, 5, 8


def hand_made() -> FederationData:
    """4 clients × 6 rows (4 train, 2 validation), 5 features, labels 0..9, 8 test rows."""
    n = N_CLIENTS * ROWS
    rng = np.random.default_rng(0)
    y = (np.arange(n) % 10).astype(np.int64)
    return FederationData(
        name="hand", x=rng.normal(size=(n, D)).astype(np.float32), y=y, y_clean=y.copy(),
        client=np.repeat(np.arange(N_CLIENTS), ROWS).astype(np.int64),
        split=np.tile([0, 0, 0, 0, 1, 1], N_CLIENTS).astype(np.int8), corrupted=np.zeros(n, dtype=bool),
        source_index=np.arange(n, dtype=np.int64), x_test=rng.normal(size=(N_TEST, D)).astype(np.float32),
        y_test=(np.arange(N_TEST) % 10).astype(np.int64), client_names=tuple(f"c{k}" for k in range(N_CLIENTS)),
        client_group=np.full(N_CLIENTS, -1, dtype=np.int64))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """``hand.npz`` and a manifest declaring its sizes, in ``tmp_path``; returns the file."""
    save_federation(hand_made(), tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"hand": {"feature_dim": D, "n_clients": N_CLIENTS, "n_rows": N_CLIENTS * ROWS, "n_test": N_TEST}}))
    return tmp_path / "hand.npz"


def rewrite(path: Path, edit: Callable[[dict[str, np.ndarray]], Any]) -> None:
    """Edit the arrays of a federation file in place, as an outside hand would (no check on the way in)."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    edit(arrays)
    np.savez_compressed(path, **arrays)


def set_at(key: str, row: int, value: Any) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(a: dict[str, np.ndarray]) -> None:
        a[key] = a[key].copy()
        a[key][row] = value
    return edit


def replace(key: str, make: Callable[[np.ndarray], np.ndarray]) -> Callable[[dict[str, np.ndarray]], None]:
    def edit(a: dict[str, np.ndarray]) -> None:
        a[key] = make(a[key])
    return edit


def test_a_valid_file_loads_as_saved(saved: Path) -> None:
    fed, ref = load_federation("hand", saved.parent), hand_made()
    for key in ("x", "y", "y_clean", "client", "split", "corrupted", "source_index", "x_test", "y_test",
                "client_group"):
        np.testing.assert_array_equal(getattr(fed, key), getattr(ref, key))
    assert fed.client_names == ref.client_names


ROW_OF_CLIENT_3 = 3 * ROWS + 1  # the second row of client 3 ("c3")
SPOILT = {
    # label 99 written into client 3's labels: the client, the label and the allowed range are named
    "label 99": (set_at("y", ROW_OF_CLIENT_3, 99), rf"y of client 3 \(c3\): label 99 outside 0\.\.9 "
                                                   rf"\(row {ROW_OF_CLIENT_3}\)$"),
    "clean label −1": (set_at("y_clean", 0, -1), r"y_clean of client 0 \(c0\): label -1 outside 0\.\.9"),
    "test label 10": (set_at("y_test", 2, 10), r"y_test: label 10 outside 0\.\.9 \(test row 2\)$"),
    "client index 42": (set_at("client", 5, 42), r"client: row 5 has client index 42 outside 0\.\.3 "
                                                 r"\(client_names lists 4 clients\)$"),
    "split 7": (set_at("split", 4, 7), r"split: row 4 has split 7 outside 0 \(train\), 1 \(validation\)$"),
    # x and y of different lengths: named, where the stages would have hit an IndexError
    "x one row longer": (replace("x", lambda x: np.vstack([x, x[:1]])),
                         r"x: 25 entries but y has 24; each of x, y, y_clean, client, split, corrupted, "
                         r"source_index holds one entry per row$"),
    "y one row shorter": (replace("y", lambda y: y[:-1]), r"x: 24 entries but y has 23"),
    "corrupted one row shorter": (replace("corrupted", lambda c: c[:-1]), r"corrupted: 23 entries but y has 24"),
    # the server's test split with images of another size than the clients'
    "x_test of another size": (replace("x_test", lambda x: np.zeros((N_TEST, 3), np.float32)),
                               r"x_test: 3 features per row but x has 5; the clients and the server's test "
                               r"split share one feature space"),
    "y_test one label short": (replace("y_test", lambda y: y[:-1]), r"y_test: 7 labels but x_test has 8 rows"),
    "x of integers": (replace("x", lambda x: x.astype(np.int64)),
                      r"x: dtype int64, shape \(24, 5\); the format declares float32 features \(N, D\)$"),
    "x flattened": (replace("x", lambda x: x.ravel()), r"x: dtype float32, shape \(120,\); the format declares"),
    "labels as floats": (replace("y", lambda y: y.astype(np.float64)), r"y: dtype float64, shape \(24,\); "
                                                                       r"the format declares int64 labels"),
    "a group too many": (replace("client_group", lambda g: np.append(g, 0)),
                         r"client_group: 5 entries but client_names lists 4 clients"),
    "group −2": (set_at("client_group", 1, -2), r"client_group of client 1: group -2 outside −1"),
    "a name twice": (set_at("client_names", 2, "c0"), r"client_names: 'c0' listed twice"),
    "negative source row": (set_at("source_index", 3, -1), r"source_index: row 3 has -1"),
    # sizes the manifest beside the file does not declare (the file edited after stage partition wrote it)
    "other feature size than declared": (
        lambda a: a.update(x=np.zeros((24, 7), np.float32), x_test=np.zeros((N_TEST, 7), np.float32)),
        r"x: feature_dim is 7 but manifest.json declares 5 for this federation; rerun `dvc repro partition`$"),
    "rows added": (lambda a: a.update({k: np.concatenate([v, v[:ROWS]]) for k, v in a.items()
                                       if k in ("x", "y", "y_clean", "client", "split", "corrupted",
                                                "source_index")}),
                   r"y: n_rows is 30 but manifest.json declares 24"),
}


@pytest.mark.parametrize("case", SPOILT)
def test_a_spoilt_file_is_named_with_its_key_and_what_is_allowed(saved: Path, case: str) -> None:
    edit, message = SPOILT[case]
    rewrite(saved, edit)
    with pytest.raises(DataError) as info:
        load_federation("hand", saved.parent)
    assert str(info.value).startswith(f"{saved}: "), str(info.value)
    assert re.search(message, str(info.value)), str(info.value)
    assert isinstance(info.value, DataFileError) and isinstance(info.value, OtfedError)  # exit 2 in a stage


def test_without_a_manifest_the_file_alone_is_checked(saved: Path) -> None:
    (saved.parent / "manifest.json").unlink()
    rewrite(saved, lambda a: a.update(x=np.zeros((24, 7), np.float32), x_test=np.zeros((N_TEST, 7), np.float32)))
    assert load_federation("hand", saved.parent).x.shape == (24, 7)  # nothing declares 5 features any more
    rewrite(saved, set_at("y", 0, 99))
    with pytest.raises(DataError, match="y of client 0 \\(c0\\): label 99"):
        load_federation("hand", saved.parent)


def test_the_declared_number_of_classes_bounds_the_labels(saved: Path) -> None:
    with pytest.raises(DataError, match=r"label 9 outside 0\.\.8"):
        load_federation("hand", saved.parent, n_classes=9)


def test_nan_features_still_load_for_the_stages_that_handle_them(saved: Path) -> None:
    """Federated OTDD lists a client with NaN features in degenerate_clients.csv and goes on: the loader lets
    NaN / inf through unless asked for finite features (the FedBary stages)."""
    rewrite(saved, set_at("x", ROW_OF_CLIENT_3, np.full(D, np.nan, np.float32)))
    assert np.isnan(load_federation("hand", saved.parent).x).sum() == D
    with pytest.raises(DegenerateClientError, match=r"hand\.npz: client 'c3' features: 1 of 6 rows"):
        load_federation("hand", saved.parent, require_finite=True)


# ------------------------------------------------------------------------------------- image sizes
def test_images_of_different_sizes_name_their_files() -> None:
    spec = ByDatasetFederation(scheme="by_dataset", datasets=["mnist", "usps"], samples_per_client=10)
    shapes = {("mnist", "train"): (28, 28), ("usps", "train"): (16, 16)}
    with pytest.raises(DataFileError) as info:
        check_image_shapes("bench", spec, shapes, RAW)
    assert str(info.value) == (
        f"partition.federations.bench: images of different sizes — {RAW / 'images_mnist.npz'} x_train: 28×28 "
        f"images → 784 features; {RAW / 'images_usps.npz'} x_train: 16×16 images → 256 features; set "
        f"partition.federations.bench.image_size (e.g. 28) so that all are resized alike")
    check_image_shapes("bench", spec.model_copy(update={"image_size": 28}), shapes, RAW)  # resized alike: fine


def test_grey_and_colour_images_cannot_share_a_feature_space() -> None:
    spec = ByDatasetFederation(scheme="by_dataset", datasets=["mnist", "cifar10"], image_size=28)
    with pytest.raises(DataFileError, match=r"images_cifar10\.npz x_train: 32×32×3 images → 2352 features; "
                                            r"the images differ in colour channels"):
        check_image_shapes("mixed", spec, {("mnist", "train"): (28, 28), ("cifar10", "train"): (32, 32, 3)}, RAW)


def test_a_test_split_of_another_size_is_named() -> None:
    spec = IidFederation(scheme="iid", dataset="mnist", n_clients=2)
    with pytest.raises(DataFileError, match=r"images_mnist\.npz x_test: 16×16 images → 256 features"):
        check_image_shapes("iid", spec, {("mnist", "train"): (28, 28), ("mnist", "test"): (16, 16)}, RAW)


def test_building_a_federation_of_mixed_sizes_names_the_embedded_files() -> None:
    spec = ByDatasetFederation(scheme="by_dataset", datasets=["mnist", "usps"], samples_per_client=10)
    with pytest.raises(DataFileError, match=r"images_mnist\.npz x_train: 28×28 images → 784 features; .*"
                                            r"images_usps\.npz x_train: 16×16 images → 256 features"):
        build_federation("bench", spec, RAW, seed=0)
