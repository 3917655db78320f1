"""Registry and loader of the embedded image datasets (data/raw/images_*.npz).

The five files are real, uniformly drawn subsamples of MNIST, Fashion-MNIST, KMNIST, USPS and CIFAR-10
(5,000 train + 1,000 test images each); data/README.md gives source, licence and SHA-256 of every
file. They feed the feature track: federated OTDD between datasets and the "Boosting FL" clustering
experiments (FedWaD §5) and the FedBary client cases (FedBary appendix 10.1).

Only :func:`load_images` touches the file system; everything else in :mod:`otfed.data` works on arrays.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otfed.errors import DataFileError

IMAGE_DATASETS: dict[str, str] = {
    "mnist": "images_mnist.npz",
    "fashionmnist": "images_fashionmnist.npz",
    "kmnist": "images_kmnist.npz",
    "usps": "images_usps.npz",
    "cifar10": "images_cifar10.npz",
}
"""Dataset name → file name inside the raw-data folder."""

SPLITS: tuple[str, ...] = ("train", "test")
N_CLASSES = 10

# Errors NumPy / zipfile raise on a truncated, non-zip or otherwise damaged .npz.
_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class ImageSplit:
    """One split of one embedded image dataset.

    ``images`` is uint8 with shape (n, H, W) for grey images or (n, H, W, 3) for CIFAR-10 (channels
    last); ``labels`` is int64 in 0..9; ``class_names[k]`` names label k.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    dataset: str
    split: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def load_images(name: str, split: str, root: Path | str = Path("data/raw")) -> ImageSplit:
    """Load split ``"train"`` or ``"test"`` of the embedded dataset ``name`` from ``root``.

    Raises ValueError for an unknown dataset or split name, and :class:`~otfed.errors.DataFileError`
    (naming the file, and the key where one is at fault) when the file is missing, is not a readable
    .npz, lacks ``x_<split>`` / ``y_<split>`` / ``class_names``, or holds images and labels that do not
    match (non-uint8 images, label count ≠ image count, labels outside 0..9).
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; allowed: {', '.join(IMAGE_DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    path = Path(root) / IMAGE_DATASETS[name]
    if not path.is_file():
        raise DataFileError(
            f"{path}: image dataset file not found (the embedded datasets and where they come from are "
            f"listed in data/README.md)"
        )
    x_key, y_key = f"x_{split}", f"y_{split}"
    try:
        archive = np.load(path, allow_pickle=False)
    except _READ_ERRORS as exc:
        raise DataFileError(f"{path}: not a readable .npz file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataFileError(f"{path}: expected a .npz archive, found a single .npy array")
    with archive:
        arrays = {}
        for key in (x_key, y_key, "class_names"):
            if key not in archive.files:
                raise DataFileError(f"{path}: missing key {key!r} (keys present: {', '.join(archive.files)})")
            try:
                arrays[key] = archive[key]
            except _READ_ERRORS as exc:
                raise DataFileError(
                    f"{path}: key {key!r} cannot be read ({type(exc).__name__}: {exc})"
                ) from exc
    images, labels, names = arrays[x_key], arrays[y_key], arrays["class_names"]
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise DataFileError(
            f"{path}: key {x_key!r} must be uint8 images (n, H, W) or (n, H, W, C); "
            f"got dtype {images.dtype}, shape {images.shape}"
        )
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataFileError(
            f"{path}: key {y_key!r} must be a 1-D integer label vector; got {labels.dtype} {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise DataFileError(
            f"{path}: key {y_key!r} has {labels.shape[0]} labels but {x_key!r} has {images.shape[0]} images"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= N_CLASSES):
        raise DataFileError(
            f"{path}: key {y_key!r} has labels outside 0..{N_CLASSES - 1} (min {labels.min()}, max {labels.max()})"
        )
    if names.shape != (N_CLASSES,):
        raise DataFileError(f"{path}: key 'class_names' must hold {N_CLASSES} names; got shape {names.shape}")
    return ImageSplit(
        images=images,
        labels=labels.astype(np.int64, copy=False),
        class_names=tuple(str(s) for s in names),
        dataset=name,
        split=split,
    )
