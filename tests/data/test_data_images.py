"""Loader of the embedded image files: shapes and class counts against data/PROVENANCE.md, and a clear
DataFileError for every way a file can be wrong."""

from pathlib import Path

import numpy as np
import pytest

from otfed.data import IMAGE_DATASETS, load_images
from otfed.errors import DataFileError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"

# Class counts as published in the provenance notes (section 4), independent of the loader.
PROVENANCE_COUNTS = {
    "mnist": ([485, 574, 496, 508, 502, 481, 488, 510, 465, 491], [105, 116, 111, 103, 96, 93, 77, 120, 75, 104]),
    "fashionmnist": ([486, 503, 512, 509, 514, 508, 482, 488, 509, 489], [106, 101, 99, 88, 102, 90, 109, 95, 104, 106]),
    "kmnist": ([513, 518, 472, 516, 488, 464, 516, 499, 520, 494], [95, 104, 116, 86, 98, 96, 108, 103, 95, 99]),
    "usps": ([820, 700, 497, 446, 441, 383, 458, 446, 373, 436], [172, 122, 91, 95, 101, 74, 87, 85, 85, 88]),
    "cifar10": ([508, 526, 474, 508, 470, 486, 520, 499, 489, 520], [109, 96, 111, 90, 88, 94, 89, 106, 123, 94]),
}
IMAGE_SHAPE = {"mnist": (28, 28), "fashionmnist": (28, 28), "kmnist": (28, 28), "usps": (16, 16), "cifar10": (32, 32, 3)}


@pytest.mark.parametrize("name", sorted(IMAGE_DATASETS))
@pytest.mark.parametrize("split", ["train", "test"])
def test_loader_matches_provenance(name, split):
    s = load_images(name, split, root=RAW)
    expected = PROVENANCE_COUNTS[name][0 if split == "train" else 1]
    n = 5000 if split == "train" else 1000
    assert s.images.shape == (n, *IMAGE_SHAPE[name])
    assert s.images.dtype == np.uint8 and s.labels.dtype == np.int64
    assert np.bincount(s.labels, minlength=10).tolist() == expected
    assert len(s.class_names) == 10 and (s.dataset, s.split) == (name, split)


def test_class_names_are_the_datasets_own():
    assert load_images("cifar10", "test", RAW).class_names[0] == "airplane"
    assert load_images("kmnist", "test", RAW).class_names == ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")
    assert load_images("fashionmnist", "test", RAW).class_names[9] == "Ankle boot"


def test_unknown_dataset_and_split_list_the_allowed_names():
    with pytest.raises(ValueError, match="mnist, fashionmnist, kmnist, usps, cifar10"):
        load_images("svhn", "train", RAW)
    with pytest.raises(ValueError, match="train, test"):
        load_images("mnist", "valid", RAW)


def test_missing_file_names_path_and_readme(tmp_path):
    with pytest.raises(DataFileError) as err:
        load_images("mnist", "train", root=tmp_path)
    assert str(tmp_path / "images_mnist.npz") in str(err.value)
    assert "data/README.md" in str(err.value)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_file_names_the_file(tmp_path, damage):
    original = (RAW / "images_usps.npz").read_bytes()
    data = b"this is not an npz archive\x00\x01" * 100 if damage == "garbage" else original[: len(original) // 2]
    (tmp_path / "images_usps.npz").write_bytes(data)
    with pytest.raises(DataFileError, match="images_usps.npz"):
        load_images("usps", "train", root=tmp_path)


def _write_usps_copy(tmp_path, **changes):
    with np.load(RAW / "images_usps.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update(changes)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    np.savez(tmp_path / "images_usps.npz", **arrays)


@pytest.mark.parametrize("key", ["x_train", "y_train", "class_names"])
def test_missing_key_names_file_and_key(tmp_path, key):
    _write_usps_copy(tmp_path, **{key: None})
    with pytest.raises(DataFileError) as err:
        load_images("usps", "train", root=tmp_path)
    assert "images_usps.npz" in str(err.value) and repr(key) in str(err.value)
    # The other split does not need the missing train key (class_names aside).
    if key != "class_names":
        assert len(load_images("usps", "test", root=tmp_path)) == 1000


def test_bad_labels_are_data_file_errors(tmp_path):
    y = np.load(RAW / "images_usps.npz")["y_train"].copy()
    y[7] = 10
    _write_usps_copy(tmp_path, y_train=y)
    with pytest.raises(DataFileError, match="'y_train'.*outside 0..9"):
        load_images("usps", "train", root=tmp_path)
    _write_usps_copy(tmp_path, y_train=y[:-1] % 10)
    with pytest.raises(DataFileError, match="4999 labels but 'x_train' has 5000"):
        load_images("usps", "train", root=tmp_path)
