"""The on-disk format of a partitioned federation: the contract between stage ``partition`` and the
stages that read it.

One ``<out_dir>/<federation>.npz`` per federation holds every client's samples in one table:

=============  ===========  ==================================================================
key            shape        meaning
=============  ===========  ==================================================================
x              (N, D) f32   features (flattened scaled pixels, optionally PCA-reduced)
y              (N,) i64     labels as the client holds them (possibly corrupted)
y_clean        (N,) i64     labels before corruption
client         (N,) i64     client index of each row
split          (N,) i8      0 = train, 1 = validation
corrupted      (N,) bool    ground truth: the row's label or features were corrupted
source_index   (N,) i64     row in the dataset's official train split
x_test, y_test (M, D), (M,) server-side test data (official test split)
client_names   (C,) str     client names
client_group   (C,) i64     planted group of each client (class pair, case, dataset); −1 if none
=============  ===========  ==================================================================

``<out_dir>/manifest.json`` describes every federation (scheme, params, per-client counts, class
histograms, corrupted counts).

:func:`load_federation` checks a file against this table before any stage uses it
(:func:`check_federation`): the keys, their dtypes and dimensions, one entry per row in every per-row key,
client indices in ``0..C−1``, splits in {0, 1}, labels in ``0..n_classes−1``, one feature space for the
clients and the server's test split, and the sizes ``manifest.json`` declares for the federation. NaN / inf
features are left to the reader (``require_finite``): federated OTDD reports such a client as degenerate.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from otfed import io
from otfed.data.features import check_finite
from otfed.data.images import N_CLASSES
from otfed.errors import DataError, DataFileError

TRAIN, VAL = 0, 1
REQUIRED = ("x", "y", "y_clean", "client", "split", "corrupted", "source_index", "x_test", "y_test",
            "client_names", "client_group")
PER_ROW = ("x", "y", "y_clean", "client", "split", "corrupted", "source_index")  # one entry per row
LABELS = ("y", "y_clean")
# key → (dimensions, numpy dtype kinds allowed, what the format declares)
LAYOUT: dict[str, tuple[int, str, str]] = {
    "x": (2, "f", "float32 features (N, D)"), "y": (1, "iu", "int64 labels (N,)"),
    "y_clean": (1, "iu", "int64 labels (N,)"), "client": (1, "iu", "int64 client indices (N,)"),
    "split": (1, "iu", "int8 splits (N,)"), "corrupted": (1, "b", "bool flags (N,)"),
    "source_index": (1, "iu", "int64 row indices (N,)"), "x_test": (2, "f", "float32 features (M, D)"),
    "y_test": (1, "iu", "int64 labels (M,)"), "client_names": (1, "U", "client names (C,) str"),
    "client_group": (1, "iu", "int64 groups (C,)"),
}


@dataclass(frozen=True)
class FederationData:
    """All clients of one federation (read by the stage that plays every party in simulation)."""

    name: str
    x: np.ndarray
    y: np.ndarray
    y_clean: np.ndarray
    client: np.ndarray
    split: np.ndarray
    corrupted: np.ndarray
    source_index: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    client_names: tuple[str, ...]
    client_group: np.ndarray

    @property
    def n_clients(self) -> int:
        return len(self.client_names)

    def rows(self, client: int, split: int = TRAIN) -> np.ndarray:
        """Global row indices of one client's split."""
        return np.flatnonzero((self.client == client) & (self.split == split))

    def client_data(self, client: int, split: int = TRAIN) -> tuple[np.ndarray, np.ndarray]:
        """(features float64, labels) of one client's split."""
        idx = self.rows(client, split)
        return self.x[idx].astype(np.float64), self.y[idx]


def save_federation(data: FederationData, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<name>.npz`` atomically."""
    arrays = {k: getattr(data, k) for k in REQUIRED}
    arrays["client_names"] = np.asarray(data.client_names, dtype=str)
    return io.write_npz(Path(out_dir) / f"{data.name}.npz", **arrays)


def load_federation(name: str, out_dir: str | Path = "data/partitions",
                    require_finite: bool = False, n_classes: int = N_CLASSES) -> FederationData:
    """Read a federation written by stage ``partition``, checked against the format
    (:func:`check_federation`: labels in ``0..n_classes−1``, client indices, lengths, dtypes, shapes, the
    manifest's sizes); errors name the file and the key (:class:`~otfed.errors.DataError` for bad contents).

    ``require_finite``: NaN / inf features of any client or of the server's test split raise
    :class:`~otfed.errors.DegenerateClientError` naming the file and the client, features too large for
    float32 distances a DataError naming the column (:func:`finite_federation`) — for stages that cannot
    leave a client out (FedBary values every client); stages that can report the client and go on without it
    instead (federated OTDD)."""
    path = Path(out_dir) / f"{name}.npz"
    if not path.is_file():
        raise DataFileError(f"{path}: federation {name!r} not found — run `dvc repro partition` "
                            f"(or check partition.federations in params.yaml)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in REQUIRED if k not in npz.files]
            if missing:
                raise DataFileError(f"{path}: missing key(s) {', '.join(missing)}")
            arrays = {k: npz[k] for k in REQUIRED}
    except DataFileError:
        raise
    except Exception as exc:  # zipfile.BadZipFile, ValueError, OSError …
        raise DataFileError(f"{path}: cannot read federation file ({type(exc).__name__}: {exc})") from None
    check_federation(arrays, path, n_classes, declared_sizes(name, Path(out_dir)))
    arrays["client_names"] = tuple(str(s) for s in arrays["client_names"])
    fed = FederationData(name=name, **arrays)
    return finite_federation(fed, path) if require_finite else fed


def declared_sizes(name: str, out_dir: Path) -> dict[str, int]:
    """What ``<out_dir>/manifest.json`` declares about federation ``name`` (``feature_dim``, ``n_clients``,
    ``n_rows``, ``n_test``); empty when the manifest is absent, unreadable or does not list it (the
    manifest describes the partition files: it is not needed to read one)."""
    try:
        entry = json.loads((out_dir / "manifest.json").read_text()).get(name)
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(entry, dict):
        return {}
    return {k: v for k in ("feature_dim", "n_clients", "n_rows", "n_test")
            if isinstance(v := entry.get(k), int) and not isinstance(v, bool)}


def _outside(values: np.ndarray, low: int, high: int) -> np.ndarray:
    """Indices of ``values`` outside ``low..high``."""
    return np.flatnonzero((values < low) | (values > high))


def check_federation(arrays: Mapping[str, np.ndarray], path: str | Path, n_classes: int = N_CLASSES,
                     declared: Mapping[str, int] | None = None) -> None:
    """Raise :class:`~otfed.errors.DataError` naming ``path``, the key and what is allowed unless the
    arrays of a federation file hold what the module's table declares: each key's dimensions and dtype
    kind; every per-row key (x, y, y_clean, client, split, corrupted, source_index) one entry per row of
    ``y``; ``client`` in ``0..C−1`` (C = len(client_names), names distinct), ``client_group`` one per client
    (−1 = no group); ``split`` 0 or 1; ``y``, ``y_clean`` and ``y_test`` in ``0..n_classes−1``; ``x_test``
    as many features as ``x`` and one label per row; ``source_index`` ≥ 0; and, where ``declared`` (the
    federation's manifest entry) gives them, the number of features, clients, rows and test rows. NaN / inf
    features are not checked here (see :func:`finite_federation`). Pure."""
    for key, (ndim, kinds, what) in LAYOUT.items():
        a = arrays[key]
        if a.ndim != ndim or a.dtype.kind not in kinds:
            raise DataError(f"{path}: {key}: dtype {a.dtype}, shape {a.shape}; the format declares {what}")
    n = len(arrays["y"])
    for key in PER_ROW:
        if len(arrays[key]) != n:
            raise DataError(f"{path}: {key}: {len(arrays[key])} entries but y has {n}; each of "
                            f"{', '.join(PER_ROW)} holds one entry per row")
    names = [str(s) for s in arrays["client_names"]]
    c = len(names)
    if len(set(names)) != c:
        twice = sorted({s for s in names if names.count(s) > 1})
        raise DataError(f"{path}: client_names: {', '.join(map(repr, twice))} listed twice; names must be distinct")
    if len(arrays["client_group"]) != c:
        raise DataError(f"{path}: client_group: {len(arrays['client_group'])} entries but client_names lists {c} "
                        f"clients; one group per client")
    if (bad := _outside(arrays["client_group"], -1, np.iinfo(np.int64).max)).size:
        raise DataError(f"{path}: client_group of client {bad[0]}: group {arrays['client_group'][bad[0]]} "
                        f"outside −1 (no group), 0, 1, …")
    client = arrays["client"]
    if (bad := _outside(client, 0, c - 1)).size:
        raise DataError(f"{path}: client: row {bad[0]} has client index {client[bad[0]]} outside 0..{c - 1} "
                        f"(client_names lists {c} clients)")
    if (bad := _outside(arrays["split"], 0, 1)).size:
        raise DataError(f"{path}: split: row {bad[0]} has split {arrays['split'][bad[0]]} outside 0 (train), "
                        f"1 (validation)")
    for key in LABELS:
        if (bad := _outside(arrays[key], 0, n_classes - 1)).size:
            k = int(client[bad[0]])
            raise DataError(f"{path}: {key} of client {k} ({names[k]}): label {arrays[key][bad[0]]} outside "
                            f"0..{n_classes - 1} (row {bad[0]})")
    if (bad := _outside(arrays["y_test"], 0, n_classes - 1)).size:
        raise DataError(f"{path}: y_test: label {arrays['y_test'][bad[0]]} outside 0..{n_classes - 1} "
                        f"(test row {bad[0]})")
    if (bad := np.flatnonzero(arrays["source_index"] < 0)).size:
        raise DataError(f"{path}: source_index: row {bad[0]} has {arrays['source_index'][bad[0]]}; row indices "
                        f"are ≥ 0")
    d, x_test = arrays["x"].shape[1], arrays["x_test"]
    if x_test.shape[1] != d:
        raise DataError(f"{path}: x_test: {x_test.shape[1]} features per row but x has {d}; the clients and "
                        f"the server's test split share one feature space (same image size, same PCA)")
    if len(arrays["y_test"]) != len(x_test):
        raise DataError(f"{path}: y_test: {len(arrays['y_test'])} labels but x_test has {len(x_test)} rows; "
                        f"one label per test row")
    found = {"feature_dim": d, "n_clients": c, "n_rows": n, "n_test": len(x_test)}
    for key, value in (declared or {}).items():
        if found[key] != value:
            field = {"feature_dim": "x", "n_clients": "client_names", "n_rows": "y", "n_test": "y_test"}[key]
            raise DataError(f"{path}: {field}: {key} is {found[key]} but manifest.json declares {value} for "
                            f"this federation; rerun `dvc repro partition`")


def finite_federation(fed: FederationData, source: str | Path) -> FederationData:
    """``fed`` unchanged if every feature is finite and within :func:`feature_bound`; else
    DegenerateClientError naming ``source`` (its file), the first client (or the server's test split) with
    NaN / inf features and how many rows hold them, or :func:`bounded_federation`'s DataError."""
    for k, client in enumerate(fed.client_names):
        check_finite(fed.x[fed.client == k], f"{source}: client {client!r} features")
    check_finite(fed.x_test, f"{source}: server test split (x_test) features")
    return bounded_federation(fed, source)


def feature_bound(n_features: int) -> float:
    """The largest |feature| a federation of ``n_features`` features may hold: B = √(float32 max / D) / 2.
    Two rows within ±B differ by at most 2B per feature, so their squared Euclidean distance — the cost of
    every OT problem here — is at most D·(2B)² = float32's largest value: finite in float32, the features'
    dtype (and torch's on a GPU). The partition writes pixels in [0, 1] and their PCA, far below it."""
    return float(np.sqrt(np.finfo(np.float32).max / max(n_features, 1)) / 2)


def bounded_federation(fed: FederationData, source: str | Path) -> FederationData:
    """``fed`` unchanged unless a finite feature of a client or of the server's test split lies beyond
    ±:func:`feature_bound` (NaN / inf are :func:`finite_federation`'s); else DataError naming ``source``,
    the key, the column, the row, its client and the bound — such a value is too large for the OT costs,
    which would overflow to inf and surface as "NaN or inf" (or a meaningless distance) inside a task."""
    d = fed.x.shape[1]
    bound = feature_bound(d)
    for key, x in (("x", fed.x), ("x_test", fed.x_test)):
        big = np.isfinite(x) & (np.abs(x) > bound)
        if big.any():
            row, column = (int(i) for i in np.argwhere(big)[0])
            owner = f"client {fed.client_names[fed.client[row]]!r}" if key == "x" else "the server's test split"
            raise DataError(f"{source}: {key} column {column}: {x[row, column]:.3g} (row {row}, {owner}) is too large; "
                            f"features must lie within ±{bound:.3g}, so that the squared distance between two rows "
                            f"of {d} features stays finite in float32 — rerun `dvc repro partition`")
    return fed
