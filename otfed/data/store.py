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
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from otfed import io
from otfed.data.features import check_finite
from otfed.errors import DataFileError

TRAIN, VAL = 0, 1
REQUIRED = ("x", "y", "y_clean", "client", "split", "corrupted", "source_index", "x_test", "y_test",
            "client_names", "client_group")


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
                    require_finite: bool = False) -> FederationData:
    """Read a federation written by stage ``partition``; errors name the file and the missing key.

    ``require_finite``: NaN / inf features of any client or of the server's test split raise
    :class:`~otfed.errors.DegenerateClientError` naming the file and the client (:func:`finite_federation`)
    — for stages that cannot leave a client out (FedBary values every client); stages that can report the
    client and go on without it instead (federated OTDD)."""
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
    arrays["client_names"] = tuple(str(s) for s in arrays["client_names"])
    fed = FederationData(name=name, **arrays)
    return finite_federation(fed, path) if require_finite else fed


def finite_federation(fed: FederationData, source: str | Path) -> FederationData:
    """``fed`` unchanged if every feature is finite; else DegenerateClientError naming ``source`` (its file),
    the first client (or the server's test split) with NaN / inf features and how many rows hold them."""
    for k, client in enumerate(fed.client_names):
        check_finite(fed.x[fed.client == k], f"{source}: client {client!r} features")
    check_finite(fed.x_test, f"{source}: server test split (x_test) features")
    return fed
