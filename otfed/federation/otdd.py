"""Federated OTDD (FedWaD §4 "Federated OTDD"): the optimal-transport dataset distance between two
clients' labelled datasets, computed with FedWaD on label-augmented samples.

Each client, locally, fits Gaussian class-conditionals to its own data and augments every sample to
x̃ = [x; m_y; vec(Σ_y^{1/2})] (or the diagonal variant). The squared Euclidean distance between augmented
vectors is the OTDD ground cost ||x − x'||² + W₂²(N(m_y,Σ_y), N(m_y',Σ_y')) (exact in the diagonal mode,
a Frobenius upper bound of the Bures term otherwise), so FedWaD with p = 2 on augmented samples
estimates OTDD = W₂ over (feature, label) pairs. The server receives interpolating measures in the
augmented space and two distances — never samples, labels or class statistics.
"""
from __future__ import annotations

from itertools import combinations_with_replacement
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from otfed.errors import DegenerateClientError
from otfed.federation.fedwad import (FedWaDConfig, FedWaDResult, WassersteinClient, WassersteinServer,
                                     fedwad)
from otfed.federation.ledger import Channel, Ledger
from otfed.ot.otdd import LabelledData, augmented_measure
from otfed.schema import as_config


def labelled_client(data: LabelledData, config: FedWaDConfig, rng: np.random.Generator,
                    diagonal: bool = True) -> WassersteinClient:
    """A FedWaD client whose private measure is its label-augmented dataset."""
    return WassersteinClient(data.name, augmented_measure(data, diagonal), config, rng)


def feature_dimension(data: LabelledData) -> int:
    """d, the feature columns of the client's n × d samples x (before label augmentation)."""
    return int(np.shape(data.x)[1])


def federated_otdd(a: LabelledData, b: LabelledData, config: FedWaDConfig | Mapping[str, Any], seed: int = 0,
                   diagonal: bool = True, channel: Channel | None = None) -> FedWaDResult:
    """Federated OTDD between two clients: FedWaD (Algorithm 1, p = 2) on their label-augmented measures — each
    sample [x; m_y; vec(Σ_y^{1/2})] with its class's mean and covariance, computed client-side (Alvarez-Melis &
    Fusi 2020's OTDD with the Gaussian label distance; FedWaD app. D.3–D.4).

    Parameters:
        a, b: the two clients' labelled datasets (:class:`~otfed.ot.otdd.LabelledData`); every class needs ≥ 2
            samples.
        config: a :class:`FedWaDConfig` or a mapping of its fields (:func:`~otfed.schema.as_config`); ``p`` must
            be 2. ``support_size`` = the clients' sample count makes the estimate exact (FedWaD theorem 1).
        seed: every party's generator is spawned from it (same seed → same numbers).
        diagonal: diagonal class covariances (the Bures term in closed form) or full ones.
        channel: the ledger every message goes through (a fresh one by default).

    Returns:
        A :class:`FedWaDResult`: ``estimate`` (an upper bound of the OTDD by the triangle inequality), its
        ``history``, ``kind`` and ``ledger``.

    Raises DegenerateClientError naming an unusable client, ValueError naming both clients and their feature
    dimensions (the label-augmented ones in parentheses) when these differ.

    Against POT's exact solver on the augmented measures (which only the clients together could build):

    >>> import ot
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 50)
    >>> a = LabelledData("a", rng.normal(size=(100, 2)) + 3.0 * y[:, None], y)
    >>> b = LabelledData("b", rng.normal(size=(100, 2)) + 3.0 * y[:, None] + 1.0, y)
    >>> result = federated_otdd(a, b, FedWaDConfig(support_size=100, iterations=10))
    >>> ma, mb = augmented_measure(a), augmented_measure(b)
    >>> exact = ot.emd2(ma.weights, mb.weights, ot.dist(ma.support, mb.support)) ** 0.5
    >>> bool(abs(result.estimate - exact) < 1e-2 * exact)
    True
    """
    config = as_config(config, FedWaDConfig)
    if config.p != 2:
        raise ValueError("federated OTDD uses p = 2 (the augmented squared distance is the OTDD cost)")
    seeds = np.random.SeedSequence(seed).spawn(3)
    client_a = labelled_client(a, config, np.random.default_rng(seeds[0]), diagonal)
    client_b = labelled_client(b, config, np.random.default_rng(seeds[1]), diagonal)
    if client_a.dim != client_b.dim:
        raise ValueError(f"clients {a.name!r} and {b.name!r} have different feature dimensions: "
                         f"{feature_dimension(a)} vs {feature_dimension(b)} (label-augmented: {client_a.dim} vs "
                         f"{client_b.dim})")
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    return fedwad(client_a, client_b, server, channel=channel or Channel(session=f"{a.name}|{b.name}"))


def client_pairs(n: int, include_diagonal: bool = False) -> list[tuple[int, int]]:
    """Index pairs (i, j), i < j (or i ≤ j), in a fixed order (one FedWaD session each)."""
    return [(i, j) for i, j in combinations_with_replacement(range(n), 2) if include_diagonal or i != j]


def pair_seed(seed: int, i: int, j: int) -> int:
    """A per-pair seed, independent of the order in which pairs are scheduled (reproducible in parallel)."""
    return int(np.random.SeedSequence([seed, i, j]).generate_state(1)[0])


def distance_matrix(n: int, pairs: Iterable[tuple[int, int]], values: Sequence[float]) -> np.ndarray:
    """Assemble a symmetric matrix from per-pair values (unset diagonal entries are 0)."""
    d = np.zeros((n, n))
    for (i, j), v in zip(pairs, values):
        d[i, j] = d[j, i] = v
    return d


def pairwise_sessions(clients: Sequence[LabelledData], config: FedWaDConfig, seed: int = 0,
                      diagonal: bool = True, include_diagonal: bool = False) -> list[dict[str, Any]]:
    """The arguments of :func:`federated_otdd` for every client pair (:func:`client_pairs` order), each
    with its own :func:`pair_seed`: one independent FedWaD session per pair, to run in any order or place."""
    return [dict(a=clients[i], b=clients[j], config=config, seed=pair_seed(seed, i, j), diagonal=diagonal)
            for i, j in client_pairs(len(clients), include_diagonal)]


def matrix_and_ledger(n: int, results: Sequence[FedWaDResult], include_diagonal: bool = False
                      ) -> tuple[np.ndarray, Ledger]:
    """The symmetric n × n matrix of per-pair estimates and one ledger of every message, from the results
    of the :func:`pairwise_sessions` (in their order)."""
    ledger = Ledger()
    for result in results:
        ledger.extend(result.ledger)
    return distance_matrix(n, client_pairs(n, include_diagonal), [r.estimate for r in results]), ledger


def pairwise_federated_otdd(clients: Sequence[LabelledData], config: FedWaDConfig | Mapping[str, Any], seed: int = 0,
                            diagonal: bool = True, include_diagonal: bool = False,
                            map_fn: Callable[..., list[FedWaDResult]] | None = None
                            ) -> tuple[np.ndarray, Ledger]:
    """The matrix of federated OTDDs between all clients (one FedWaD session per pair) and their ledger.

    ``map_fn(fn, list_of_kwargs)`` may fan the pairs out; default: in order. ``config`` as in
    :func:`federated_otdd`.
    """
    config = as_config(config, FedWaDConfig)
    sessions = pairwise_sessions(clients, config, seed, diagonal, include_diagonal)
    results = map_fn(federated_otdd, sessions) if map_fn else [federated_otdd(**s) for s in sessions]
    return matrix_and_ledger(len(clients), results, include_diagonal)


def usable_clients(clients: Sequence[LabelledData], diagonal: bool = True
                   ) -> tuple[list[int], list[tuple[str, str]]]:
    """Split clients into usable ones (indices) and degenerate ones ((name, reason)), checked client-side.

    A degenerate client (no samples, NaN/inf features, a class with < 2 samples) is reported, not crashed
    on: stages drop it from the distance matrix and list it in their report.
    """
    usable, problems = [], []
    for k, client in enumerate(clients):
        try:
            augmented_measure(client, diagonal)
        except DegenerateClientError as exc:
            problems.append((client.name, str(exc)))
        else:
            usable.append(k)
    return usable, problems
