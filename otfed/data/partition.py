"""Client partitions of a labelled pool: iid, Dirichlet label skew, and FedWaD's class-pair structure.

Every function takes the label vector of the pool and a ``numpy.random.Generator`` and returns one
sorted index array per client into that vector. Clients are disjoint; the output depends only on the
arguments and the generator's state.

The class-pair partition is the "Boosting FL" setting of FedWaD (app. D.5): with "strong structure"
each client holds one of the pairs (0,1),(2,3),(4,5),(6,7),(8,9), at least two clients per pair; with
"no structure" each client holds a random pair of distinct classes.
"""

from __future__ import annotations

from itertools import combinations

import numpy as np

from otfed.data.apportionment import stratified_split
from otfed.errors import DegenerateClientError

N_CLASSES = 10
STRONG_GROUPS: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
ALL_PAIRS: tuple[tuple[int, int], ...] = tuple(combinations(range(N_CLASSES), 2))
STRUCTURES: tuple[str, ...] = ("strong", "none")
MAX_DIRICHLET_DRAWS = 1000


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a 1-D integer array; got dtype {labels.dtype}, shape {labels.shape}")
    if labels.size and labels.min() < 0:
        raise ValueError(f"labels must be non-negative; found {labels.min()}")
    return labels


def _check_n_clients(n_clients: int, n_samples: int) -> None:
    if not 1 <= n_clients <= n_samples:
        raise ValueError(f"n_clients must lie in 1..{n_samples} (the number of samples); got {n_clients}")


def partition_iid(labels: np.ndarray, n_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """iid partition: shuffle all samples and cut them into ``n_clients`` parts whose sizes differ by
    at most one (the homogeneous baseline)."""
    labels = _check_labels(labels)
    _check_n_clients(n_clients, labels.shape[0])
    return [np.sort(part) for part in np.array_split(rng.permutation(labels.shape[0]), n_clients)]


def partition_dirichlet(
    labels: np.ndarray,
    n_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 2,
) -> list[np.ndarray]:
    """Dirichlet label-skew partition (Hsu et al. 2019), a standard non-iid baseline.

    For every class its shuffled samples are cut among clients in proportions p ~ Dir(α·1): small α
    gives clients dominated by few classes, large α approaches iid. The whole draw is repeated until
    every client has at least ``min_size`` samples; after MAX_DIRICHLET_DRAWS failed draws
    DegenerateClientError names the smallest client.
    """
    labels = _check_labels(labels)
    n = labels.shape[0]
    _check_n_clients(n_clients, n)
    if not alpha > 0:
        raise ValueError(f"alpha must be positive; got {alpha}")
    if n_clients * min_size > n:
        raise ValueError(f"{n_clients} clients x min_size {min_size} exceeds the {n} samples")
    classes = np.unique(labels)
    sizes = np.zeros(n_clients, dtype=np.int64)
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = np.floor(np.cumsum(p)[:-1] * members.size).astype(np.int64)
            for k, chunk in enumerate(np.split(members, cuts)):
                parts[k].append(chunk)
        sizes = np.array([sum(chunk.size for chunk in p) for p in parts])
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)) for p in parts]
    worst = int(np.argmin(sizes))
    raise DegenerateClientError(
        f"client {worst}: Dirichlet partition (alpha={alpha}, {n_clients} clients) left it with "
        f"{sizes[worst]} < min_size={min_size} samples in {MAX_DIRICHLET_DRAWS} draws; raise alpha or "
        f"lower n_clients"
    )


def partition_class_pairs(
    labels: np.ndarray, n_clients: int, structure: str, rng: np.random.Generator
) -> tuple[list[np.ndarray], np.ndarray]:
    """Class-pair partition of FedWaD's "Boosting FL" experiments (FedWaD app. D.5; tables 1–5 of FedWaD).

    structure="strong": groups (0,1),(2,3),(4,5),(6,7),(8,9). Clients 0–9 get groups 0,0,1,1,…,4,4
    (two per group); clients 10.. get groups drawn uniformly at random. Needs n_clients ≥ 10.
    structure="none": every client gets a pair of distinct classes drawn uniformly from the 45 pairs;
    its group id is the pair's index in ``ALL_PAIRS`` (lexicographic order).

    In both, each class's shuffled samples are split evenly (sizes differ by ≤ 1) among the clients
    whose pair contains it; classes that no client holds are dropped. Labels must lie in 0..9.
    Returns (index arrays per client, group id per client).
    """
    labels = _check_labels(labels)
    if labels.size and labels.max() >= N_CLASSES:
        raise ValueError(f"class-pair partitions need labels in 0..{N_CLASSES - 1}; found {labels.max()}")
    if structure == "strong":
        if n_clients < 2 * len(STRONG_GROUPS):
            raise ValueError(
                f"structure 'strong' needs n_clients >= {2 * len(STRONG_GROUPS)} (two clients per class pair); "
                f"got {n_clients}"
            )
        groups = np.concatenate(
            [np.repeat(np.arange(len(STRONG_GROUPS)), 2), rng.integers(0, len(STRONG_GROUPS), n_clients - 10)]
        )
        pairs = [STRONG_GROUPS[g] for g in groups]
    elif structure == "none":
        if n_clients < 1:
            raise ValueError(f"n_clients must be positive; got {n_clients}")
        groups = rng.integers(0, len(ALL_PAIRS), n_clients)
        pairs = [ALL_PAIRS[g] for g in groups]
    else:
        raise ValueError(f"unknown structure {structure!r}; allowed: {', '.join(STRUCTURES)}")

    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for c in range(N_CLASSES):
        holders = np.array([k for k, pair in enumerate(pairs) if c in pair], dtype=np.int64)
        if holders.size == 0:
            continue
        members = rng.permutation(np.flatnonzero(labels == c))
        for k, chunk in zip(rng.permutation(holders), np.array_split(members, holders.size)):
            parts[k].append(chunk)
    indices = [np.sort(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]
    for k, idx in enumerate(indices):
        if idx.size == 0:
            raise DegenerateClientError(f"client {k}: class pair {pairs[k]} has no samples left for it")
    return indices, groups.astype(np.int64)


def split_train_val(
    indices: list[np.ndarray], labels: np.ndarray, val_fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split every client's indices into a training and a validation part, stratified by class.

    Client k keeps round(val_fraction·n_k) (halves up) samples for validation; each class's share of
    them is within about one sample of its share of the client ("where possible": a class with a
    single sample goes to one side). Returns (train index arrays, validation index arrays), sorted;
    DegenerateClientError if a client would be left without training samples.
    """
    labels = _check_labels(labels)
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in [0, 1); got {val_fraction}")
    train, val = [], []
    for k, idx in enumerate(indices):
        idx = np.asarray(idx, dtype=np.int64)
        n_val = int(np.floor(val_fraction * idx.size + 0.5))
        if idx.size - n_val < 1:
            raise DegenerateClientError(
                f"client {k}: {idx.size} samples leave no training data at val_fraction={val_fraction}"
            )
        tr_pos, va_pos = stratified_split(labels[idx], [idx.size - n_val, n_val], rng)
        train.append(np.sort(idx[tr_pos]))
        val.append(np.sort(idx[va_pos]))
    return train, val
