"""Build a federation (all clients' splits + server test data) from a ``partition.federations`` spec.

Features are flattened pixels in [0, 1] (optionally resized, optionally PCA-reduced with a PCA fitted
on the dataset's official *test* split — server-side public data, never client data). No downloaded
weights anywhere. The same spec and seed give byte-identical federations.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Mapping, Union

import numpy as np
from pydantic import Field

from otfed.data.corruption import fedbary_case
from otfed.data.features import check_finite, fit_pca, pixel_features, reduce_features
from otfed.data.images import IMAGE_DATASETS, load_images
from otfed.data.partition import (partition_class_pairs, partition_dirichlet, partition_iid,
                                  split_train_val)
from otfed.data.store import FederationData
from otfed.errors import DataFileError
from otfed.schema import Strict

ImageDataset = Literal["mnist", "fashionmnist", "kmnist", "usps", "cifar10"]


class _FederationBase(Strict):
    dataset: ImageDataset = "mnist"
    image_size: int | None = Field(None, ge=4, le=64, description="Resize images to size×size (USPS 16→28).")
    pca_components: int = Field(0, ge=0, description="0 = raw pixels; else PCA fitted on the public test split.")
    val_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    test_samples: int = Field(1000, ge=0, description="Server-side test samples (official test split).")


class ByDatasetFederation(_FederationBase):
    """One client per dataset (federated OTDD between datasets, FedWaD fig. 6)."""

    scheme: Literal["by_dataset"]
    datasets: list[ImageDataset] = Field(min_length=2)
    samples_per_client: int = Field(1000, ge=10, le=5000)


class IidFederation(_FederationBase):
    """Clients with iid shares of the training split."""

    scheme: Literal["iid"]
    n_clients: int = Field(ge=1, le=1000)
    samples: int | None = Field(None, ge=1, description="Train samples used in all (None = all).")


class DirichletFederation(_FederationBase):
    """Label-skewed clients: per class, client shares ~ Dir(α)."""

    scheme: Literal["dirichlet"]
    n_clients: int = Field(ge=1, le=1000)
    alpha: float = Field(gt=0.0)
    samples: int | None = Field(None, ge=1)


class ClassPairsFederation(_FederationBase):
    """FedWaD 'boosting FL' partition: strong structure (fixed pairs) or none (random pair per client)."""

    scheme: Literal["class_pairs"]
    n_clients: int = Field(ge=10, le=1000)
    structure: Literal["strong", "none"]
    samples: int | None = Field(None, ge=1)


class FedBaryCaseFederation(_FederationBase):
    """FedBary client cases 1–5 (FedBary appendix 10.1) with ground-truth corrupted indices."""

    scheme: Literal["fedbary_case"]
    case: int = Field(ge=1, le=5)
    n_clients: int = Field(5, ge=2, le=100)
    samples_per_client: int = Field(200, ge=10)
    noise_std: float = Field(1.0, gt=0.0, description="Feature-noise std (case 5), in [0,1]-pixel units.")


FederationSpec = Annotated[
    Union[ByDatasetFederation, IidFederation, DirichletFederation, ClassPairsFederation, FedBaryCaseFederation],
    Field(discriminator="scheme"),
]


def _features(dataset: str, split: str, image_size: int | None, root: Path,
              ) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """Pixel features, labels and the shape of one image (H, W[, C]) as stored in the file."""
    images = load_images(dataset, split, root=root)
    x = pixel_features(images.images, size=image_size)
    check_finite(x, f"{dataset} {split} features")
    return x, np.asarray(images.labels, dtype=np.int64), tuple(images.images.shape[1:])


def image_splits(spec: FederationSpec) -> list[tuple[str, str]]:
    """The (dataset, split) image files a federation draws from: each dataset's train split (one client per
    dataset), else the dataset's train and test splits (clients and the server's test split)."""
    if spec.scheme == "by_dataset":
        return [(d, "train") for d in spec.datasets]
    return [(spec.dataset, "train"), (spec.dataset, "test")]


def check_image_shapes(name: str, spec: FederationSpec, shapes: Mapping[tuple[str, str], tuple[int, ...]],
                       root: str | Path) -> None:
    """DataFileError naming the files and their image sizes unless every image split of :func:`image_splits`
    (``shapes``: (dataset, split) → one image's shape (H, W[, C])) gives the same number of pixel features
    once resized to ``spec.image_size`` — the clients (and the server's test split) share one feature space."""
    dims = {}
    for d, split in image_splits(spec):
        shape = tuple(shapes[(d, split)])
        h, w = (spec.image_size, spec.image_size) if spec.image_size else shape[:2]
        dims[(d, split)] = (shape, h * w * (shape[2] if len(shape) == 3 else 1))
    if len({dim for _, dim in dims.values()}) <= 1:
        return
    listed = "; ".join(f"{Path(root) / IMAGE_DATASETS[d]} x_{split}: {'×'.join(map(str, shape))} images → {dim} "
                       "features" for (d, split), (shape, dim) in dims.items())
    channels = {shape[2] if len(shape) == 3 else 1 for shape, _ in dims.values()}
    fix = (f"set partition.federations.{name}.image_size (e.g. 28) so that all are resized alike"
           if len(channels) == 1 else "the images differ in colour channels: federate images of one kind")
    raise DataFileError(f"partition.federations.{name}: images of different sizes — {listed}; {fix}")


def _subsample(n_pool: int, n: int | None, rng: np.random.Generator) -> np.ndarray:
    if n is None or n >= n_pool:
        return np.arange(n_pool)
    return np.sort(rng.choice(n_pool, size=n, replace=False))


def build_federation(name: str, spec: FederationSpec, data_dir: str | Path, seed: int) -> tuple[FederationData, dict]:
    """Partition one federation as declared by ``spec`` (one of the federation specs above); returns data +
    its manifest entry."""
    root = Path(data_dir)
    rng = np.random.default_rng(np.random.SeedSequence([seed, *name.encode()]))
    scheme = spec.scheme
    corrupted_rows: set[int] = set()
    if scheme == "by_dataset":
        xs, ys, parts, names, srcs = [], [], [], [], []
        shapes = {}
        for d in spec.datasets:
            x, y, shapes[(d, "train")] = _features(d, "train", spec.image_size, root)
            idx = _subsample(len(y), spec.samples_per_client, rng)
            parts.append(np.arange(len(idx)) + sum(len(v) for v in ys))
            xs.append(x[idx])
            ys.append(y[idx])
            names.append(d)
            srcs.append(idx)
        check_image_shapes(name, spec, shapes, root)
        pool_x, pool_y = np.concatenate(xs), np.concatenate(ys)
        pool_y_clean = pool_y
        source = np.concatenate(srcs)
        groups = np.arange(len(names))
        test_x = np.zeros((0, pool_x.shape[1]))
        test_y = np.zeros(0, dtype=np.int64)
        pca_ref = None
    else:
        pool_x, pool_y, train_shape = _features(spec.dataset, "train", spec.image_size, root)
        test_x, test_y, test_shape = _features(spec.dataset, "test", spec.image_size, root)
        check_image_shapes(name, spec, {(spec.dataset, "train"): train_shape, (spec.dataset, "test"): test_shape},
                           root)
        keep = _subsample(len(pool_y), getattr(spec, "samples", None), rng)
        source = keep
        pool_x, pool_y = pool_x[keep], pool_y[keep]
        pool_y_clean = pool_y
        pca_ref = test_x
        groups = None
        if scheme == "iid":
            parts = partition_iid(pool_y, spec.n_clients, rng)
        elif scheme == "dirichlet":
            parts = partition_dirichlet(pool_y, spec.n_clients, spec.alpha, rng)
        elif scheme == "class_pairs":
            parts, groups = partition_class_pairs(pool_y, spec.n_clients, spec.structure, rng)
        elif scheme == "fedbary_case":
            case = fedbary_case(spec.case, pool_x, pool_y, rng, n_clients=spec.n_clients,
                                noise_std=spec.noise_std, samples_per_client=spec.samples_per_client)
            parts = case.client_indices
            pool_x, pool_y = case.features, case.labels
            corrupted_rows = {int(i) for c in case.corrupted for i in c}
            groups = np.full(spec.n_clients, spec.case)
        else:  # pragma: no cover - the config schema forbids it
            raise ValueError(f"unknown scheme {scheme!r}")
        names = [f"client_{k:02d}" for k in range(len(parts))]
        if groups is None:
            groups = np.full(len(parts), -1)
        if spec.test_samples < len(test_y):
            t_idx = _subsample(len(test_y), spec.test_samples, rng)
            test_x, test_y = test_x[t_idx], test_y[t_idx]

    if spec.pca_components:
        reference = pca_ref if pca_ref is not None and len(pca_ref) else pool_x
        pca = fit_pca(reference, spec.pca_components, seed)
        pool_x = reduce_features(pool_x, pca)
        test_x = reduce_features(test_x, pca) if len(test_x) else np.zeros((0, spec.pca_components))

    train_parts, val_parts = split_train_val(list(parts), pool_y, spec.val_fraction, rng)
    rows, client, split = [], [], []
    for k, (tr, va) in enumerate(zip(train_parts, val_parts)):
        for part, tag in ((tr, 0), (va, 1)):
            rows.append(part)
            client.append(np.full(len(part), k))
            split.append(np.full(len(part), tag))
    rows_arr = np.concatenate(rows).astype(np.int64)
    data = FederationData(
        name=name,
        x=pool_x[rows_arr].astype(np.float32),
        y=pool_y[rows_arr].astype(np.int64),
        y_clean=pool_y_clean[rows_arr].astype(np.int64),
        client=np.concatenate(client).astype(np.int64),
        split=np.concatenate(split).astype(np.int8),
        corrupted=np.isin(rows_arr, np.fromiter(corrupted_rows, dtype=np.int64, count=len(corrupted_rows))),
        source_index=np.asarray(source)[rows_arr].astype(np.int64),
        x_test=np.asarray(test_x, dtype=np.float32),
        y_test=np.asarray(test_y, dtype=np.int64),
        client_names=tuple(names),
        client_group=np.asarray(groups, dtype=np.int64),
    )
    return data, manifest_entry(data, spec)


def manifest_entry(data: FederationData, spec: FederationSpec) -> dict:
    """Per-federation manifest: spec, sizes, class histograms and ground-truth corrupted rows per client."""
    n_classes = int(max(data.y.max(initial=0), data.y_clean.max(initial=0))) + 1
    clients = []
    for k, name in enumerate(data.client_names):
        tr, va = data.rows(k, 0), data.rows(k, 1)
        mine = np.concatenate([tr, va])
        clients.append(dict(
            name=name, group=int(data.client_group[k]), n_train=int(len(tr)), n_val=int(len(va)),
            class_counts=np.bincount(data.y[tr], minlength=n_classes).tolist(),
            n_corrupted=int(data.corrupted[mine].sum()),
            corrupted_rows=np.flatnonzero(data.corrupted & (data.client == k)).tolist(),
        ))
    return dict(spec=spec.model_dump(mode="json"), n_clients=data.n_clients, feature_dim=int(data.x.shape[1]),
                n_rows=int(len(data.y)), n_test=int(len(data.y_test)), clients=clients)
