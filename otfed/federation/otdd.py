"""Federated OTDD (FedWaD §4 "Federated OTDD"): the optimal-transport dataset distance between two
clients' labelled datasets, computed with FedWaD on label-augmented samples.

Each client, locally, fits Gaussian class-conditionals to its own data and augments every sample to
x̃ = [x; m_y; vec(Σ_y^{1/2})] (or the diagonal variant). The squared Euclidean distance between augmented
vectors is the OTDD ground cost ||x − x'||² + W₂²(N(m_y,Σ_y), N(m_y',Σ_y')) (exact in the diagonal mode,
a Frobenius upper bound of the Bures term otherwise), so FedWaD with p = 2 on augmented samples
estimates OTDD = W₂ over (feature, label) pairs (FedWaD app. D.3).

How far to trust it: a bracket, as for FedWaD. The estimate is an UPPER bound of the OTDD (the triangle
inequality, FedWaD eq. 6; in full mode the Frobenius term only adds to it). With ``config.lower_bound`` (the
default) each client also sends the mean and covariance of its lower-bound vectors (:class:`LabelledClient`,
:func:`bound_vectors`) — in diagonal mode the augmented vectors themselves, whose W₂ is the OTDD; in full mode
[x; m_y; √tr Σ_y], whose squared distances are at most the OTDD cost — and the server computes Gelbrich's
LOWER bound (Gelbrich 1990, Theorem 2.1), valid whatever the data's law. So lower ≤ OTDD ≤ estimate, and a
``RuntimeWarning`` says when the bracket is wide (:func:`~otfed.federation.fedwad.fedwad`). (The augmented vectors'
own moments would not do in full mode: their bound is one of the Frobenius-augmented W₂, which can exceed the OTDD.)

Measured on three labelled 5-D datasets of 300, 250 and 280 points, 3 classes (``issue_datasets`` in
tests/federation/test_otdd.py), against POT's exact OTDD: at the defaults (S = 10) the three estimates were
37–90 % above the OTDD and every pair warned; at S = max(n, m) they were 0.7–3.6 % above. Gelbrich's bound was
7.7–26 % below the OTDD (class mixtures are far from Gaussian), so at S = max(n, m) one pair of three still
warned, its estimate 2.1 % above the OTDD and its bound 26 % below: there the bound, not the estimate, was loose.

The privacy cost of the bracket: the server learns both clients' augmented moments, exactly — the features'
mean and covariance, and, from the m_y block, the between-class covariance Σ_y p_y (m_y − m̄)(m_y − m̄)ᵀ
(with two classes this is p₀p₁ (m₁ − m₀)(m₁ − m₀)ᵀ: the direction and length of the class-mean difference,
up to sign) and the mean class spread. Set ``lower_bound=False`` where that is too much; the server then
receives interpolating measures in the augmented space and two distances — never samples, labels or class
statistics — and the result's ``lower`` is None.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations_with_replacement
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from otfed.errors import DegenerateClientError
from otfed.federation.fedwad import (FedWaDConfig, FedWaDResult, WassersteinClient, WassersteinServer,
                                     fedwad, support_rule_warning)
from otfed.federation.ledger import Channel, Ledger
from otfed.federation.messages import SERVER, MomentMessage
from otfed.ot import Measure, measure_moments
from otfed.ot.otdd import (ClassStats, LabelledData, augment_with_label_stats, augmented_measure, class_statistics,
                           labelled_arrays)
from otfed.schema import as_config


def bound_vectors(data: LabelledData, diagonal: bool = True) -> Measure:
    """Client-side: the uniform measure whose W₂ to another client's is at most the OTDD, for Gelbrich's lower
    bound. Diagonal mode: the augmented vectors [x; m_y; s_y] themselves (their squared distances are the OTDD
    ground cost, :func:`~otfed.ot.otdd.augment_with_label_stats`). Full mode: [x; m_y; √tr Σ_y], whose squared
    distance ||x − x'||² + ||m − m'||² + (√tr Σ − √tr Σ')² is at most the OTDD cost, because
    Bures²(Σ, Σ') = tr Σ + tr Σ' − 2‖Σ^{1/2} Σ'^{1/2}‖_* ≥ (√tr Σ − √tr Σ')² (‖AB‖_* ≤ ‖A‖_F ‖B‖_F).

    Raises DegenerateClientError naming the client, as :func:`~otfed.ot.otdd.augmented_measure` does.

    >>> rng = np.random.default_rng(0)
    >>> y = np.arange(12) % 2
    >>> data = LabelledData("a", rng.normal(size=(12, 2)), y)
    >>> bound_vectors(data).dim, bound_vectors(data, diagonal=False).dim
    (6, 5)
    >>> roots = class_statistics(data.x, y, diagonal=False).sqrt_covs
    >>> bool(np.isclose(bound_vectors(data, diagonal=False).support[1, 4] ** 2, np.trace(roots[1] @ roots[1])))
    True
    """
    if diagonal:
        return augmented_measure(data, diagonal=True)
    x, y = labelled_arrays(data.x, data.y, data.name)  # the same checks and errors, naming the client
    return _bound_vectors(x, y, class_statistics(x, y, diagonal=False, client=data.name))


def _bound_vectors(x: np.ndarray, y: np.ndarray, stats: ClassStats) -> Measure:
    """Full-covariance :func:`bound_vectors` from statistics already taken (one eigendecomposition per class)."""
    root_trace = np.sqrt(np.einsum("kij,kij->k", stats.sqrt_covs, stats.sqrt_covs))  # √tr Σ_c = ‖Σ_c^{1/2}‖_F
    plain = augment_with_label_stats(x, y, stats)[:, :2 * stats.dim]  # [x; m_y]
    return Measure.uniform(np.hstack([plain, root_trace[stats.index_of(y)][:, None]]))


class LabelledClient(WassersteinClient):
    """A FedWaD client whose private measure is its label-augmented dataset; its moments (for Gelbrich's lower
    bound, sent only when the protocol asks) are those of :func:`bound_vectors`, so that the bound holds for
    the OTDD in both covariance modes."""

    def __init__(self, data: LabelledData, config: FedWaDConfig, rng: np.random.Generator,
                 diagonal: bool = True) -> None:
        x, y = labelled_arrays(data.x, data.y, data.name)
        stats = class_statistics(x, y, diagonal=diagonal, client=data.name)  # once: the measure and the moments
        super().__init__(data.name, Measure.uniform(augment_with_label_stats(x, y, stats)), config, rng)
        self._bound = None if diagonal else _bound_vectors(x, y, stats)

    def moments(self) -> MomentMessage:
        """The mean and covariance (ddof = 0) of :func:`bound_vectors` — revealed to the server."""
        if self._bound is None:
            return super().moments()
        mean, covariance = measure_moments(self._bound)
        return MomentMessage("moments", self.name, SERVER, mean=mean, covariance=covariance)


def labelled_client(data: LabelledData, config: FedWaDConfig, rng: np.random.Generator,
                    diagonal: bool = True) -> LabelledClient:
    """A FedWaD client whose private measure is its label-augmented dataset (:class:`LabelledClient`)."""
    return LabelledClient(data, config, rng, diagonal)


def feature_dimension(data: LabelledData) -> int:
    """d, the feature columns of the client's n × d samples x (before label augmentation)."""
    return int(np.shape(data.x)[1])


def federated_otdd(a: LabelledData, b: LabelledData, config: FedWaDConfig | Mapping[str, Any], seed: int = 0,
                   diagonal: bool = True, channel: Channel | None = None) -> FedWaDResult:
    """Federated OTDD between two clients: FedWaD (Algorithm 1, p = 2) on their label-augmented measures — each
    sample [x; m_y; vec(Σ_y^{1/2})] with its class's mean and covariance, computed client-side (Alvarez-Melis &
    Fusi 2020's OTDD with the Gaussian label distance; FedWaD app. D.3–D.4) — bracketed from below by Gelbrich's
    bound (Gelbrich 1990, Theorem 2.1) on the clients' :func:`bound_vectors` moments.

    Parameters:
        a, b: the two clients' labelled datasets (:class:`~otfed.ot.otdd.LabelledData`); every class needs ≥ 2
            samples.
        config: a :class:`FedWaDConfig` or a mapping of its fields (:func:`~otfed.schema.as_config`); ``p`` must
            be 2. ``support_size`` = the clients' sample count makes the estimate exact (FedWaD theorem 1); the
            default S = 10 is far above the OTDD on data of a few dimensions (the bracket says how far).
            ``lower_bound`` (default True) has each client send the mean and covariance of its
            :func:`bound_vectors` after the last round — revealed to the server (the module docstring lists
            what they tell); False sends none and leaves ``lower`` None.
        seed: every party's generator is spawned from it (same seed → same numbers; the moments draw none, so
            the estimate is the same with or without the lower bound).
        diagonal: diagonal class covariances (the Bures term in closed form) or full ones.
        channel: the ledger every message goes through (a fresh one by default).

    Returns:
        A :class:`FedWaDResult`: ``estimate`` (an upper bound of the OTDD by the triangle inequality, eq. 6),
        ``lower`` (Gelbrich's lower bound, or None), ``bracket`` = (lower, upper) ∋ OTDD, ``ratio``, ``kind``,
        ``status`` and ``converged`` (A^k settled, with ``record_history``), ``notes`` (every caveat, e.g. the
        wide-bracket warning's text), ``history`` and ``ledger``.

    Raises DegenerateClientError naming an unusable client, ValueError naming both clients and their feature
    dimensions (the label-augmented ones in parentheses) when these differ. Warns (``RuntimeWarning``, its text
    also in ``notes``) when the bracket is wide (:func:`~otfed.federation.fedwad.fedwad`): then the OTDD may lie
    anywhere in it; and before the run when S misses the support rule
    (:func:`~otfed.federation.fedwad.support_rule_warning`: S a multiple of both clients' sample counts).

    Against POT's exact solver on the augmented measures (which only the clients together could build), the
    bracket holds it, and at S = n it is tight:

    >>> import ot
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 50)
    >>> a = LabelledData("a", rng.normal(size=(100, 2)) + 3.0 * y[:, None], y)
    >>> b = LabelledData("b", rng.normal(size=(100, 2)) + 3.0 * y[:, None] + 1.0, y)
    >>> result = federated_otdd(a, b, FedWaDConfig(support_size=100, iterations=10))
    >>> ma, mb = augmented_measure(a), augmented_measure(b)
    >>> exact = ot.emd2(ma.weights, mb.weights, ot.dist(ma.support, mb.support)) ** 0.5
    >>> lower, upper = result.bracket
    >>> bool(lower <= exact <= upper < (1 + 1e-2) * exact), result.notes
    (True, [])
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
    support_note = support_rule_warning(config, [(a.name, len(a.x)), (b.name, len(b.x))])
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    result = fedwad(client_a, client_b, server, channel=channel or Channel(session=f"{a.name}|{b.name}"),
                    lower_bound=config.lower_bound)
    if support_note is not None:
        result.notes.insert(0, support_note)
    return result


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


@dataclass
class PairwiseOTDD:
    """Federated OTDDs between all clients and how far to trust each: one :class:`FedWaDResult` per pair.

    ``names`` the clients, ``pairs`` the index pairs (:func:`client_pairs` order) and ``results`` their
    sessions' results; ``estimates`` (upper bounds, eq. 6) and ``lowers`` (Gelbrich's bounds; NaN for a pair
    without one) are symmetric n × n matrices (0 on a diagonal that was not run), so lowers ≤ OTDD ≤
    estimates entry by entry; ``ledger`` holds every message of every session.
    """

    names: list[str]
    pairs: list[tuple[int, int]]
    results: list[FedWaDResult]
    estimates: np.ndarray
    lowers: np.ndarray
    ledger: Ledger

    @property
    def statuses(self) -> dict[tuple[str, str], str]:
        """Per pair (by client names), whether A^k settled (:attr:`FedWaDResult.status`)."""
        return {(self.names[i], self.names[j]): r.status for (i, j), r in zip(self.pairs, self.results)}

    @property
    def notes(self) -> dict[tuple[str, str], list[str]]:
        """Per pair with a caveat (e.g. a wide bracket), its :attr:`FedWaDResult.notes`."""
        return {(self.names[i], self.names[j]): r.notes for (i, j), r in zip(self.pairs, self.results) if r.notes}

    def rows(self) -> list[dict[str, Any]]:
        """One record per pair: the clients, ``estimate``, ``lower`` (None without one), ``status``, ``notes``."""
        return [dict(a=self.names[i], b=self.names[j], estimate=r.estimate, lower=r.lower, status=r.status,
                     notes=list(r.notes)) for (i, j), r in zip(self.pairs, self.results)]


def pairwise_result(names: Sequence[str], results: Sequence[FedWaDResult], include_diagonal: bool = False
                    ) -> PairwiseOTDD:
    """The :class:`PairwiseOTDD` of the results of the :func:`pairwise_sessions` (in their order) between the
    clients called ``names``."""
    n = len(names)
    pairs = client_pairs(n, include_diagonal)
    if len(results) != len(pairs):
        raise ValueError(f"{len(results)} results for the {len(pairs)} pairs of {n} clients")
    estimates, ledger = matrix_and_ledger(n, results, include_diagonal)
    lowers = distance_matrix(n, pairs, [np.nan if r.lower is None else r.lower for r in results])
    return PairwiseOTDD(list(names), pairs, list(results), estimates, lowers, ledger)


def pairwise_federated_otdd(clients: Sequence[LabelledData], config: FedWaDConfig | Mapping[str, Any], seed: int = 0,
                            diagonal: bool = True, include_diagonal: bool = False,
                            map_fn: Callable[..., list[FedWaDResult]] | None = None) -> PairwiseOTDD:
    """Federated OTDDs between all clients, one FedWaD session per pair (:func:`federated_otdd`, each with its
    :func:`pair_seed`), each an upper bound (FedWaD eq. 6) with Gelbrich's lower bound (Gelbrich 1990,
    Theorem 2.1) when ``config.lower_bound``.

    Parameters:
        clients: the labelled datasets, one per client (each stays on its client).
        config: as in :func:`federated_otdd` (the default S = 10 gives loose, warned-about brackets).
        seed: the per-pair seeds come from it (same seed → same matrices, in any order of the pairs).
        diagonal: diagonal class covariances, or full ones.
        include_diagonal: also run each client against itself.
        map_fn: ``map_fn(fn, list_of_kwargs)`` may fan the pairs out; default: in order.

    Returns:
        A :class:`PairwiseOTDD`: ``estimates`` and ``lowers`` (n × n), ``statuses`` and ``notes`` per pair, the
        per-pair ``results`` and one ``ledger``. Each pair whose bracket is wide warns (``RuntimeWarning``).

    Three clients, the third shifted; at S = n every bracket holds the exact OTDD:

    >>> from otfed.ot import otdd_exact
    >>> y = np.arange(40) % 2
    >>> clients = [LabelledData(name, np.random.default_rng(k).normal(size=(40, 2)) + shift + 3.0 * y[:, None], y)
    ...            for k, (name, shift) in enumerate([("a", 0.0), ("b", 0.5), ("c", 3.0)])]
    >>> out = pairwise_federated_otdd(clients, FedWaDConfig(support_size=40, iterations=10))
    >>> exact = otdd_exact(clients[0].x, y, clients[2].x, y)
    >>> bool(out.lowers[0, 2] <= exact <= out.estimates[0, 2] < 1.01 * exact), out.statuses[("a", "c")]
    (True, 'not monitored')
    """
    config = as_config(config, FedWaDConfig)
    sessions = pairwise_sessions(clients, config, seed, diagonal, include_diagonal)
    results = map_fn(federated_otdd, sessions) if map_fn else [federated_otdd(**s) for s in sessions]
    return pairwise_result([c.name for c in clients], results, include_diagonal)


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
