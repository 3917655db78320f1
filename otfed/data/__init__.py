"""Image data for the feature track: embedded datasets, pixel features, client partitions, corruption.

* :mod:`otfed.data.images` — registry and loader of the five embedded image files in data/raw
  (MNIST, Fashion-MNIST, KMNIST, USPS, CIFAR-10; provenance in data/README.md).
* :mod:`otfed.data.features` — pixel features with bilinear resize, server-side PCA, finiteness check.
* :mod:`otfed.data.partition` — iid, Dirichlet and FedWaD class-pair partitions (FedWaD app. D.5), and
  per-client stratified train/validation splits.
* :mod:`otfed.data.corruption` — label flips, Gaussian feature noise and the five FedBary client
  cases with ground-truth corrupted indices (FedBary appendix 10.1).
* :mod:`otfed.data.apportionment` — exact integer shares (largest remainder, stratified dealing).
* :mod:`otfed.data.gaussians` — the two Gaussians of FedWaD's toy study (population W2 = 4).

All randomness comes from a caller-supplied ``numpy.random.Generator``.
"""

from otfed.data.apportionment import interleaved_assignment, largest_remainder, stratified_parts, stratified_split
from otfed.data.corruption import (
    CASES,
    CasePartition,
    add_feature_noise,
    case_noise_rates,
    case_size_weights,
    fedbary_case,
    flip_labels,
)
from otfed.data.features import (
    bilinear_resize_matrix,
    check_finite,
    fit_pca,
    pixel_features,
    reduce_features,
)
from otfed.data.images import IMAGE_DATASETS, ImageSplit, load_images
from otfed.data.partition import (
    ALL_PAIRS,
    STRONG_GROUPS,
    STRUCTURES,
    partition_class_pairs,
    partition_dirichlet,
    partition_iid,
    split_train_val,
)

__all__ = [
    "ALL_PAIRS",
    "CASES",
    "IMAGE_DATASETS",
    "STRONG_GROUPS",
    "STRUCTURES",
    "CasePartition",
    "ImageSplit",
    "add_feature_noise",
    "bilinear_resize_matrix",
    "case_noise_rates",
    "case_size_weights",
    "check_finite",
    "fedbary_case",
    "fit_pca",
    "flip_labels",
    "interleaved_assignment",
    "largest_remainder",
    "load_images",
    "partition_class_pairs",
    "partition_dirichlet",
    "partition_iid",
    "pixel_features",
    "reduce_features",
    "split_train_val",
    "stratified_parts",
    "stratified_split",
]
