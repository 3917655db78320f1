"""Label flips, Gaussian feature noise and the five FedBary client cases, with ground-truth indices.

FedBary (paper appendix 10.1) values 5 clients built from one labelled pool:
  1. same distribution, same size;           2. different distributions, same size;
  3. same distribution, sizes 10/15/20/25/30%; 4. case 1 + label noise on 0/5/10/15/20% of each client;
  5. case 1 + Gaussian feature noise on 0/5/10/15/20% of each client's samples.
Every corrupted sample is recorded, so detection (datum values g > 0, FedBary eq. 10) can be scored
against the exact truth. Feature noise is drawn independently per sample (the authors' code shared
one noise image per batch of 32).

Noise planted in a stored federation by the valuation stages (the one home of noise planting):
:func:`plant_noise` corrupts a share of every group's rows, :func:`corrupted_federation` applies it to
every client of a :class:`~otfed.data.store.FederationData` (FedBary fig. 5, table 4), and
:func:`noisy_client_federation` gives one client feature noise (the fig. 4 outlier histogram).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from otfed.data.apportionment import largest_remainder, stratified_split
from otfed.data.parties import n_classes_of
from otfed.data.store import TRAIN, FederationData

CASES: dict[int, str] = {
    1: "same distribution, same size",
    2: "different distributions, same size",
    3: "same distribution, different sizes",
    4: "noisy labels, same size",
    5: "noisy features, same size",
}
MAX_NOISE_RATE = 0.20  # the last client's corruption rate in cases 4–5
OWN_CLASS_SHARE = 0.80  # share of a case-2 client's samples from its two own classes
SIZE_RATIO = 3.0  # case 3: largest / smallest client (30% / 10%)


def _unique_indices(idx: np.ndarray, n: int, what: str) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ValueError(f"{what}: indices out of range for {n} samples")
    idx = np.where(idx < 0, idx + n, idx)
    if np.unique(idx).size != idx.size:
        raise ValueError(f"{what}: indices must be unique")
    return idx


def flip_labels(labels: np.ndarray, idx: np.ndarray, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Copy of ``labels`` with every label at ``idx`` replaced by a uniformly random *different* class.

    The label-noise model of FedBary case 4 (appendix 10.1): the new label is y + u mod n_classes with
    u uniform on 1..n_classes−1, i.e. uniform over the other classes. Labels outside ``idx`` are kept.
    """
    labels = np.asarray(labels)
    if n_classes < 2:
        raise ValueError(f"flipping needs n_classes >= 2; got {n_classes}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels must lie in 0..{n_classes - 1}; found {labels.min()}..{labels.max()}")
    idx = _unique_indices(idx, labels.shape[0], "flip_labels")
    out = labels.copy()
    out[idx] = (labels[idx] + rng.integers(1, n_classes, size=idx.size)) % n_classes
    return out


def add_feature_noise(x: np.ndarray, idx: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """Float64 copy of ``x`` with i.i.d. N(0, std²) noise added to every feature of the rows ``idx``.

    The feature-noise model of FedBary case 5 (appendix 10.1): each selected sample gets its own noise draw.
    """
    x = np.asarray(x)
    if not std > 0:
        raise ValueError(f"noise std must be positive; got {std}")
    idx = _unique_indices(idx, x.shape[0], "add_feature_noise")
    out = np.array(x, dtype=np.float64, copy=True)
    out[idx] += rng.normal(0.0, std, size=(idx.size,) + x.shape[1:])
    return out


@dataclass(frozen=True)
class CasePartition:
    """One FedBary client case over a training pool.

    ``client_indices[i]`` indexes the pool (the train arrays); ``labels`` and ``features`` are copies of
    the whole pool's labels / features with the case's corruption applied; ``corrupted[i]`` holds the
    pool indices of client i's corrupted samples (exactly those whose label or feature row differs from
    the input; empty for clean clients); ``noise_kind`` is "none", "label" or "feature".
    """

    client_indices: list[np.ndarray]
    labels: np.ndarray
    features: np.ndarray
    corrupted: list[np.ndarray]
    description: str
    noise_kind: str


def case_noise_rates(n_clients: int) -> np.ndarray:
    """Corruption rate of each client in cases 4–5: linear from 0 to 20% (0/5/10/15/20% for 5 clients)."""
    if n_clients == 1:
        return np.zeros(1)
    return MAX_NOISE_RATE * np.arange(n_clients) / (n_clients - 1)


def case_size_weights(n_clients: int) -> np.ndarray:
    """Relative client sizes in case 3: linear from 1 to 3, i.e. 10/15/20/25/30% for 5 clients."""
    if n_clients == 1:
        return np.ones(1)
    return 1.0 + (SIZE_RATIO - 1.0) * np.arange(n_clients) / (n_clients - 1)


def _own_class_demand(m: int, n_clients: int, n_classes: int) -> np.ndarray:
    """(n_clients, n_classes) sample counts of case 2 for clients of size m.

    Client i takes round(0.8·m) samples from its own classes (2i, 2i+1) mod C (split as evenly as
    possible) and spreads the rest evenly over the other C − 2 classes; the leftover units go to the
    other classes in rotating order starting after its own pair, so no class is favoured.
    """
    demand = np.zeros((n_clients, n_classes), dtype=np.int64)
    n_own = int(np.floor(OWN_CLASS_SHARE * m + 0.5))
    rest = m - n_own
    for i in range(n_clients):
        a, b = (2 * i) % n_classes, (2 * i + 1) % n_classes
        demand[i, a] += n_own - n_own // 2
        demand[i, b] += n_own // 2
        others = [(2 * i + 2 + j) % n_classes for j in range(n_classes - 2)]
        base, extra = divmod(rest, n_classes - 2)
        for j, c in enumerate(others):
            demand[i, c] += base + (1 if j < extra else 0)
    return demand


def _size_per_client(samples_per_client: int | None, n_clients: int, n_samples: int) -> int:
    m = n_samples // n_clients if samples_per_client is None else int(samples_per_client)
    if m < 1 or m * n_clients > n_samples:
        raise ValueError(
            f"{n_clients} clients x {m} samples per client does not fit in the pool of {n_samples} samples"
        )
    return m


def fedbary_case(
    case: int,
    features: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    *,
    n_clients: int = 5,
    noise_std: float = 1.0,
    samples_per_client: int | None = None,
) -> CasePartition:
    """Build FedBary client case 1–5 (FedBary appendix 10.1) from a labelled training pool.

    ``features`` (n, D) and ``labels`` (n,) in 0..C−1 form the pool. Clients are disjoint.
    * Cases 1, 4, 5: ``samples_per_client`` (default n // n_clients) samples each, drawn stratified by
      class so all clients share the pool's class distribution.
    * Case 2: equal sizes; client i takes round(80%) of its samples from classes (2i, 2i+1) mod C and
      the rest evenly from the other classes. Default size: the largest m ≤ n // n_clients for which
      every class has enough samples (MNIST's 5,000: 930, limited by class 8's 465 samples).
    * Case 3: sizes proportional to 1 … 3 (10/15/20/25/30% for 5 clients) of n (or of
      n_clients·samples_per_client), stratified by class.
    * Case 4: as case 1, then round(r_i·m) of client i's samples get a different label
      (:func:`flip_labels`), r_i linear from 0 to 20% (0/5/10/15/20% for 5 clients).
    * Case 5: as case 1, then round(r_i·m) of client i's samples get N(0, noise_std²) feature noise
      (:func:`add_feature_noise`).
    Counts round halves up. ``rng`` drives every random choice, so the same generator state gives the
    same partition.
    """
    if case not in CASES:
        raise ValueError(f"unknown FedBary case {case!r}; allowed: {', '.join(map(str, CASES))}")
    features = np.asarray(features)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or (labels.size and labels.min() < 0):
        raise ValueError("labels must be a 1-D array of non-negative integers")
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows but there are {labels.shape[0]} labels")
    n = labels.shape[0]
    if n_clients < 1:
        raise ValueError(f"n_clients must be positive; got {n_clients}")
    n_classes = int(labels.max()) + 1

    if case == 2:
        if n_classes < 3:
            raise ValueError(f"case 2 needs at least 3 classes; the pool has {n_classes}")
        counts = np.bincount(labels, minlength=n_classes)
        if samples_per_client is None:
            m = _size_per_client(None, n_clients, n)
            while m > 0 and (_own_class_demand(m, n_clients, n_classes).sum(axis=0) > counts).any():
                m -= 1
            if m == 0:
                raise ValueError(f"case 2: no client size fits the class counts {counts.tolist()}")
        else:
            m = _size_per_client(samples_per_client, n_clients, n)
        demand = _own_class_demand(m, n_clients, n_classes)
        short = np.flatnonzero(demand.sum(axis=0) > counts)
        if short.size:
            c = int(short[0])
            raise ValueError(
                f"case 2: class {c} has {counts[c]} samples but {n_clients} clients of {m} need {demand[:, c].sum()}"
            )
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(n_classes):
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = np.cumsum(demand[:, c])
            for i, chunk in enumerate(np.split(members[: cuts[-1]], cuts[:-1])):
                parts[i].append(chunk)
        client_indices = [np.sort(np.concatenate(p)) for p in parts]
        description = (
            f"case 2: {CASES[2]}: {n_clients} clients x {m}; client i draws "
            f"{int(np.floor(OWN_CLASS_SHARE * m + 0.5))} samples from classes (2i, 2i+1) mod {n_classes}, "
            f"the rest evenly from the other classes"
        )
    else:
        if case == 3:
            total = n if samples_per_client is None else _size_per_client(samples_per_client, n_clients, n) * n_clients
            sizes = largest_remainder(total, case_size_weights(n_clients))
            shares = "/".join(f"{100 * s / total:g}" for s in sizes)
            description = f"case 3: {CASES[3]}: {n_clients} clients with {shares}% of {total} samples, class-stratified"
        else:
            m = _size_per_client(samples_per_client, n_clients, n)
            sizes = np.full(n_clients, m, dtype=np.int64)
            description = f"case {case}: {CASES[case]}: {n_clients} clients x {m}, class-stratified"
        bins = stratified_split(labels, np.append(sizes, n - sizes.sum()), rng)
        client_indices = bins[:n_clients]

    out_labels = labels.copy()
    out_features = np.array(features, dtype=np.float64, copy=True)
    corrupted = [np.empty(0, dtype=np.int64) for _ in range(n_clients)]
    noise_kind = "none"
    if case in (4, 5):
        rates = case_noise_rates(n_clients)
        corrupted = [
            np.sort(rng.choice(idx, int(np.floor(r * idx.size + 0.5)), replace=False)).astype(np.int64)
            for idx, r in zip(client_indices, rates)
        ]
        every = np.concatenate(corrupted)
        pct = "/".join(f"{100 * r:g}" for r in rates)
        if case == 4:
            noise_kind = "label"
            out_labels = flip_labels(labels, every, n_classes, rng)
            description += f"; labels flipped on {pct}% of each client's samples"
        else:
            noise_kind = "feature"
            out_features = add_feature_noise(out_features, every, noise_std, rng)
            description += f"; N(0, {noise_std:g}^2) feature noise on {pct}% of each client's samples"
    return CasePartition(
        client_indices=client_indices,
        labels=out_labels,
        features=out_features,
        corrupted=corrupted,
        description=description,
        noise_kind=noise_kind,
    )


# ------------------------------------------------------------------------- noise planted in-stage
def plant_noise(x: np.ndarray, y: np.ndarray, groups: np.ndarray, kind: str, rate: float, noise_std: float,
                n_classes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Corrupt round(rate · n_k) rows of every group k (client): labels flipped to a different class
    (:func:`flip_labels`, FedBary case 4) or N(0, std²) feature noise (:func:`add_feature_noise`, case 5).
    Returns the corrupted (x float64, y) and the boolean ground-truth mask."""
    idx = np.concatenate([np.sort(rng.choice(np.flatnonzero(groups == g),
                                             int(np.floor(rate * np.sum(groups == g) + 0.5)), replace=False))
                          for g in np.unique(groups)]).astype(np.int64)
    if kind == "label":
        y = flip_labels(y, idx, n_classes, rng)
        x = np.asarray(x, dtype=np.float64)
    elif kind == "feature":
        x = add_feature_noise(x, idx, noise_std, rng)
    else:
        raise ValueError(f"unknown noise kind {kind!r}; allowed: label, feature")
    mask = np.zeros(len(y), dtype=bool)
    mask[idx] = True
    return x, y, mask


def corrupted_federation(fed: FederationData, kind: str, rate: float, noise_std: float, seed: int) -> FederationData:
    """``fed`` with round(rate · n_k) training rows of every client corrupted (:func:`plant_noise`: labels
    flipped or feature noise, in the stored feature space), ``corrupted`` set to the ground truth; seeded
    by (seed, kind, rate)."""
    train = np.flatnonzero(fed.split == TRAIN)
    stream = [seed, ("label", "feature").index(kind), int(round(rate * 1e4))]
    rng = np.random.default_rng(np.random.SeedSequence(stream))
    n_classes = n_classes_of(fed.y, fed.y_test)
    x, y, mask = plant_noise(fed.x[train], fed.y[train], fed.client[train], kind, rate, noise_std, n_classes, rng)
    new_x, new_y, corrupted = fed.x.astype(np.float64).copy(), fed.y.copy(), np.zeros(len(fed.y), dtype=bool)
    new_x[train], new_y[train], corrupted[train] = x, y, mask
    return dataclasses.replace(fed, x=new_x.astype(np.float32), y=new_y, corrupted=corrupted)


def noisy_client_federation(fed: FederationData, client: int, fraction: float, noise_std: float,
                            seed: int) -> FederationData:
    """``fed`` with N(0, noise_std²) feature noise (:func:`add_feature_noise`, in the stored feature
    space) on round(fraction · n_k) training rows of client ``client`` only — the one noisy client among
    clean ones of FedBary fig. 4 — and ``corrupted`` marking exactly those rows; seeded by (seed, 3)."""
    rows = fed.rows(client)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    chosen = np.sort(rng.choice(rows, int(np.floor(fraction * len(rows) + 0.5)), replace=False))
    noisy_x = add_feature_noise(fed.x, chosen, noise_std, rng)
    corrupted = np.zeros(len(fed.y), dtype=bool)
    corrupted[chosen] = True
    return dataclasses.replace(fed, x=noisy_x.astype(np.float32), corrupted=corrupted)
