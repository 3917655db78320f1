"""Stage ``fed_distance`` — FedWaD §5 (Rakotomamonjy et al., ICLR 2024): federated Wasserstein distances.

* toy study (fig. 2/8/9): time and relative error vs n of approximate FedWaD, exact-interpolation FedWaD
  and the exact W (POT network simplex) on two Gaussians; A^k per iteration (fig. 3, theorem 2);
* federated OTDD between datasets (fig. 6): FedWaD on label-augmented samples next to the exact OTDD;
* client clustering (§5 "boosting FL", tables 1–5): spectral clustering of clients from their pairwise
  federated OTDDs, scored by ARI against the planted groups;
* federated Wasserstein coresets (fig. 4–5, 12): every client's coreset learnt through FedWaD sessions
  with the server, a global 1-NN classifier over all clients' labelled coresets, each client scored on
  its held-out split — next to FedAvg / FedPer / FedRep on the same splits;
* clustered FL (tables 1–5): FedAvg / FedPer / FedRep trained within the clusters found (and within one
  global federation, and the planted groups), each client scored on its own held-out split, over seeds.

One flat job list: every toy case, every convergence run, every OTDD pair and every clustering pair (one
FedWaD session each, with its own per-pair seed), every coreset run; then follow-up jobs (:func:`followups`),
one per (federation, clustering, algorithm, seed) of clustered FL, built from the clusters the pairs give.
Degenerate clients (no samples, NaN features, a class with one sample) are left out of the distances and
listed in ``degenerate_clients.csv``.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, NamedTuple

import numpy as np
import pandas as pd
from pydantic import Field

from otfed.clustering import spectral_clusters
from otfed.data.features import fit_pca, reduce_features
from otfed.data.gaussians import gaussian_pair
from otfed.data.store import VAL, FederationData, load_federation
from otfed.device import stage_device, threads_for
from otfed.errors import DegenerateClientError, SupportGrowthError
from otfed.federation.coresets import (CoresetClassifier, CoresetConfig, client_coresets, client_seed,
                                       coreset_classifier, nearest_sample_labels, wasserstein_coreset)
from otfed.federation.fedwad import FedWaDConfig, FedWaDResult, federated_wasserstein
from otfed.federation.otdd import (client_pairs, distance_matrix, federated_otdd, matrix_and_ledger,
                                   pairwise_sessions, usable_clients)
from otfed.figures import fed_distance as figs
from otfed.fl import PersonalizedConfig, per_cluster_accuracy
from otfed.metrics import adjusted_rand_index, mean_confidence_interval, order_preservation
from otfed.ot import otdd_exact, wasserstein
from otfed.ot.otdd import LabelledData
from otfed.schema import PositiveInt, Strict
from stages import layout
from stages.params import named_federation
from stages.stage import Job, Report, Stage, timed

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.FED_DISTANCE_REPORTS,)

EXACT_SUPPORT_CAP = 10  # exact-interpolation FedWaD gives up once ξ has more than 10·n atoms


# ------------------------------------------------------------------------------------------ params
class ToyParams(Strict):
    """Toy Gaussians (FedWaD fig. 2–3): time and relative error vs n."""

    n_values: list[PositiveInt] = Field(min_length=1)
    supports: list[PositiveInt] = Field(min_length=1)
    ratios: list[PositiveInt] = Field([1, 3], min_length=1, description="n_ν = n_μ / ratio.")
    dims: list[PositiveInt] = Field([2, 50], min_length=1)
    iterations: int = Field(20, ge=1)
    exact_interp_max_n: int = Field(1000, ge=0, description="Skip exact-interpolation FedWaD above this n.")
    repeats: int = Field(1, ge=1)
    convergence_n: int = Field(500, ge=10, description="n for the A(k) convergence figure (fig. 3).")
    sweep_supports: list[PositiveInt] = Field([], description="More supports S < convergence_n for the convergence "
                                              "runs (approx, random t): the S at which the error drops below 5%.")


class OTDDParams(Strict):
    """Federated OTDD between datasets (FedWaD fig. 6)."""

    federation: str = "otdd_benchmarks"
    diagonal: bool = True
    fedwad: FedWaDConfig = FedWaDConfig(support_size=200, iterations=20)
    self_pairs: bool = Field(True, description="Also run FedWaD between each dataset and itself (a check: "
                             "exact OTDD is 0 there); false leaves the heatmaps' diagonal at 0.")


class ClusteringParams(Strict):
    """Pairwise federated OTDD between clients → spectral clustering (FedWaD §5, tables 1–5)."""

    federations: list[str] = Field(min_length=1)
    n_clusters: int = Field(5, ge=2)
    neighbors: list[int] = Field([3, 5], description="kNN graph sizes; the precomputed affinity always runs.")
    diagonal: bool = True
    fedwad: FedWaDConfig = FedWaDConfig(support_size=10, iterations=10)


class ClusteredFLParams(Strict):
    """FL within the clusters (FedWaD §5 tables 1–5): each algorithm trained separately in every cluster;
    ``global`` = one cluster of all clients (the baseline), ``planted`` = the true groups (an oracle),
    ``affinity`` / ``knn<k>`` = the spectral clusterings of ``clustering``. Each client is scored on its own
    held-out split (the partition's validation rows)."""

    clusterings: list[str] = Field(["global", "affinity"], min_length=1)
    algorithms: list[Literal["fedavg", "fedper", "fedrep"]] = Field(["fedavg", "fedper", "fedrep"], min_length=1)
    seeds: int = Field(3, ge=1, le=100, description="Seeds seed … seed+seeds−1 (initialisation, batches).")
    fl: PersonalizedConfig = PersonalizedConfig()


class CoresetParams(Strict):
    """Federated Wasserstein coresets + 1-NN (FedWaD §5 fig. 5, 12): each client of each federation learns
    ``points`` coreset points through FedWaD sessions with the server; the server's 1-NN classifier uses
    every client's labelled coreset. Features: a PCA fitted on the server's test split (the paper
    autoencodes MNIST; the PCA is the linear autoencoder, fitted on server data)."""

    federations: list[str] = Field(["pairs_none", "pairs_strong"])
    points: list[PositiveInt] = Field([5, 10], min_length=1)
    pca_components: int = Field(32, ge=1)
    seeds: int = Field(3, ge=1, le=100)
    coreset: CoresetConfig = CoresetConfig(epochs=30, fedwad=FedWaDConfig(support_size=10, iterations=5))


class FedDistanceParams(Strict):
    """Stage ``fed_distance``: toy study (fig. 2–3), federated OTDD (fig. 6), client clustering and FL
    within the clusters (tables 1–5)."""

    toy: ToyParams
    otdd: OTDDParams = OTDDParams()
    clustering: ClusteringParams
    clustered_fl: ClusteredFLParams | None = ClusteredFLParams()
    coresets: CoresetParams | None = Field(None, description="Off unless set: its default federations may not exist.")


def check(p: Params) -> None:
    """The OTDD federation exists and has one client per dataset; the clustering federations exist."""
    ref = p.fed_distance.otdd.federation
    if named_federation(p, "fed_distance.otdd.federation", ref).scheme != "by_dataset":
        raise ValueError(f"fed_distance.otdd.federation: {ref!r} must have scheme 'by_dataset'")
    for name in p.fed_distance.clustering.federations:
        named_federation(p, "fed_distance.clustering.federations", name)
    if p.fed_distance.coresets is not None:
        for i, name in enumerate(p.fed_distance.coresets.federations):
            named_federation(p, f"fed_distance.coresets.federations[{i}]", name)
    fl = p.fed_distance.clustered_fl
    if fl is not None:
        allowed = clustering_names(p.fed_distance.clustering)
        for i, name in enumerate(fl.clusterings):
            if name not in allowed:
                raise ValueError(f"fed_distance.clustered_fl.clusterings[{i}]: {name!r} is not one of "
                                 f"{', '.join(allowed)} (knn<k> for k in fed_distance.clustering.neighbors)")


# -------------------------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Roster:
    """A federation's usable clients (their data stay in the jobs), their planted groups, the degenerate
    clients left out (rows federation, client, reason), and each usable client's held-out split."""

    clients: list[LabelledData]
    groups: np.ndarray
    degenerate: list[dict[str, str]]
    held_out: list[tuple[np.ndarray, np.ndarray]]


def roster(name: str, diagonal: bool) -> Roster:
    """The usable clients of federation ``name`` (read from ``data/partitions``), checked client-side.

    Raises DegenerateClientError when fewer than two clients are usable.
    """
    return roster_of(load_federation(name, layout.PARTITIONS), diagonal)


def roster_of(fed: FederationData, diagonal: bool, min_clients: int = 2) -> Roster:
    """:func:`roster` of a loaded federation; DegenerateClientError below ``min_clients`` usable clients."""
    name = fed.name
    clients = [LabelledData(fed.client_names[k], *fed.client_data(k)) for k in range(fed.n_clients)]
    keep, problems = usable_clients(clients, diagonal)
    if len(keep) < min_clients:
        raise DegenerateClientError(f"federation {name!r}: fewer than {min_clients} usable clients; "
                                    + "; ".join(r for _, r in problems))
    return Roster([clients[k] for k in keep], fed.client_group[keep],
                  [dict(federation=name, client=c, reason=r) for c, r in problems],
                  [fed.client_data(k, VAL) for k in keep])


def toy_cases(toy: ToyParams, seed: int) -> list[dict[str, Any]]:
    """The arguments of every :func:`toy_case`: d × ratio × n × repeat (n_ν = n // ratio ≥ 1)."""
    return [dict(dim=d, ratio=r, n=n, repeat=k, supports=toy.supports, iterations=toy.iterations,
                 exact_interp_max_n=toy.exact_interp_max_n, seed=seed)
            for d in toy.dims for r in toy.ratios for n in toy.n_values for k in range(toy.repeats)
            if n // r >= 1]


def convergence_runs(toy: ToyParams, seed: int) -> list[dict[str, Any]]:
    """The arguments of every :func:`toy_convergence`: per d, S = 10 and S = n (approx, random t), S = n
    with t = 0.5, S = n with exact interpolation, and every S of ``sweep_supports`` below n (approx, random
    t)."""
    n = toy.convergence_n
    sweep = [(s, "approx", None) for s in sorted(set(toy.sweep_supports)) if s < n and s != 10]
    return [dict(dim=d, n=n, support=s, iterations=toy.iterations, interpolation=i, t=t, seed=seed)
            for d in toy.dims for (s, i, t) in [(10, "approx", None), (n, "approx", None), (n, "approx", 0.5),
                                                (n, "exact", None), *sweep]]


def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """Toy cases, convergence runs, OTDD pairs (self-pairs included), then every clustering pair."""
    fd, seed = p.fed_distance, p.run.seed
    out = [Job(f"toy d={kw['dim']} ratio={kw['ratio']} n={kw['n']} repeat={kw['repeat']}", toy_case, kw)
           for kw in toy_cases(fd.toy, seed)]
    out += [Job(f"convergence d={kw['dim']} {kw['interpolation']} S={kw['support']} "
                f"t={'random' if kw['t'] is None else kw['t']}", toy_convergence, kw)
            for kw in convergence_runs(fd.toy, seed)]
    otdd = roster(fd.otdd.federation, fd.otdd.diagonal)
    out += [Job(f"otdd {kw['a'].name}|{kw['b'].name}", otdd_pair, kw)
            for kw in pairwise_sessions(otdd.clients, fd.otdd.fedwad, seed, fd.otdd.diagonal,
                                           include_diagonal=fd.otdd.self_pairs)]
    cfg = fd.clustering
    for name in cfg.federations:
        clients = roster(name, cfg.diagonal).clients
        out += [Job(f"clustering {name} {kw['a'].name}|{kw['b'].name}", federated_otdd, kw)
                for kw in pairwise_sessions(clients, cfg.fedwad, seed, cfg.diagonal)]
    out += [Job(f"coresets {kw['federation']} K={kw['config'].points} seed {kw['seed']}", coreset_classification, kw)
            for kw in coreset_runs(p)]
    return out


def coreset_cells(p: Params) -> list[tuple[str, int, int]]:
    """(federation, points, seed) of every :func:`coreset_classification`, in job order."""
    cs, seed = p.fed_distance.coresets, p.run.seed
    if cs is None:
        return []
    return [(name, k, s) for name in cs.federations for k in cs.points for s in range(seed, seed + cs.seeds)]


def coreset_runs(p: Params) -> list[dict[str, Any]]:
    """The arguments of every :func:`coreset_classification` (:func:`coreset_cells`): the federation's
    usable clients (:func:`roster_of`), training and held-out splits projected on its server-fitted PCA."""
    fd, seed = p.fed_distance, p.run.seed
    splits: dict[str, tuple[list[LabelledData], list[LabelledData]]] = {}
    out = []
    for name, k, s in coreset_cells(p):
        cs = fd.coresets
        assert cs is not None  # coreset_cells is empty otherwise
        if name not in splits:
            fed = load_federation(name, layout.PARTITIONS)
            pca = fit_pca(fed.x_test.astype(np.float64), cs.pca_components, seed)
            r = roster_of(fed, fd.clustering.diagonal, min_clients=1)
            splits[name] = ([LabelledData(c.name, reduce_features(c.x, pca), c.y) for c in r.clients],
                            [LabelledData(c.name, reduce_features(x, pca), y)
                             for c, (x, y) in zip(r.clients, r.held_out)])
        train, held = splits[name]
        out.append(dict(federation=name, train=train, held_out=held,
                        config=cs.coreset.model_copy(update={"points": k}), seed=s))
    return out


def coreset_classification(federation: str, train: list[LabelledData], held_out: list[LabelledData],
                           config: CoresetConfig, seed: int) -> list[dict[str, Any]]:
    """FedWaD fig. 5 / 12, one cell: every client's coreset of ``config.points`` points — federated
    (:func:`~otfed.federation.coresets.client_coresets`: FedWaD sessions with the server, labels from the
    client's nearest sample) and, for reference, exact (:func:`~otfed.federation.coresets.wasserstein_coreset`
    on the client's own data, same start) —, the 1-NN classifier over all clients' labelled coresets, and
    every client's held-out accuracy. Rows: method, client, correct, total, accuracy, w2 (the client's
    exact W_2 between its coreset and its data)."""
    rows = []
    federated = client_coresets(train, config, seed)
    exact = []
    for i, c in enumerate(train):
        res = wasserstein_coreset(c.x, config.points, epochs=config.epochs, lr=config.lr,
                                  seed=client_seed(seed, i), init_scale=config.init_scale)
        points = res.coreset
        exact.append((points, nearest_sample_labels(points, c.x, c.y)))
    classifiers = {"fedwad_coreset": coreset_classifier(federated),
                   "exact_coreset": CoresetClassifier(np.concatenate([p for p, _ in exact]),
                                                      np.concatenate([lab for _, lab in exact]))}
    supports = {"fedwad_coreset": [fc.message.points for fc in federated], "exact_coreset": [p for p, _ in exact]}
    for method, classifier in classifiers.items():
        for c, test, points in zip(train, held_out, supports[method]):
            correct = int(np.sum(classifier.predict(test.x) == test.y))
            rows.append(dict(federation=federation, points=config.points, seed=seed, method=method, client=c.name,
                             correct=correct, total=len(test.y), accuracy=correct / len(test.y),
                             w2=wasserstein(points, c.x, p=2)))
    return rows


def toy_case(dim: int, ratio: int, n: int, repeat: int, supports: list[int], iterations: int,
             exact_interp_max_n: int, seed: int, solver: str = "auto") -> list[dict[str, Any]]:
    """One (d, ratio, n, repeat) cell of fig. 2: exact W, approximate FedWaD per support S, and
    exact-interpolation FedWaD.

    Rows: method, dim, ratio, n, n_nu, support, repeat, value (W2), exact (W2), rel_error, seconds.
    Exact-interpolation FedWaD starts, as in the paper, from a support of size n (then the plans stay
    near-permutations and the support stays ≈ n; from a small S it grows combinatorially); it is skipped
    above ``exact_interp_max_n``.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, dim, ratio, n, repeat]))
    x_mu, x_nu = gaussian_pair(n, ratio, dim, rng)
    exact, t_exact = timed(wasserstein, x_mu, x_nu, p=2)
    base = dict(dim=dim, ratio=ratio, n=n, n_nu=len(x_nu), repeat=repeat, exact=exact)
    rows = [dict(base, method="exact_ot", support=0, value=exact, rel_error=0.0, seconds=t_exact, note="")]
    variants = [("fedwad_approx", FedWaDConfig(support_size=s, iterations=iterations, interpolation="approx",
                                               solver=solver)) for s in supports]
    if n <= exact_interp_max_n:
        variants.append(("fedwad_exact_interp", FedWaDConfig(support_size=n, iterations=iterations,
                                                             interpolation="exact", solver="network_simplex",
                                                             max_support=EXACT_SUPPORT_CAP * n)))
    for method, config in variants:
        try:
            result, secs = timed(federated_wasserstein, x_mu, x_nu, config, seed=seed + repeat)
        except SupportGrowthError as exc:  # unequal sizes split atoms every round: report, don't hang
            rows.append(dict(base, method=method, support=config.support_size, value=np.nan, rel_error=np.nan,
                             seconds=np.nan, note=str(exc)))
            continue
        rows.append(dict(base, method=method, support=config.support_size, value=result.estimate,
                         rel_error=abs(result.estimate - exact) / exact, seconds=secs,
                         note=f"final support {result.support_sizes[-1]}"))
    return rows


def toy_convergence(dim: int, n: int, support: int, iterations: int, interpolation: str,
                    t: float | None, seed: int) -> list[dict[str, Any]]:
    """A^k per iteration (fig. 3) for one setting, with the exact W for reference (ratio 1:1).

    Uses the network simplex for every subproblem so that A^k is the quantity of theorem 2.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, dim, n, support, 7]))
    x_mu, x_nu = gaussian_pair(n, 1, dim, rng)
    exact = wasserstein(x_mu, x_nu, p=2)
    config = FedWaDConfig(support_size=support, iterations=iterations, t=t, interpolation=interpolation,
                          solver="network_simplex", record_history=True)
    result = federated_wasserstein(x_mu, x_nu, config, seed=seed)
    label = f"{interpolation}, S={support}, t={'random' if t is None else t}"
    final = abs(result.estimate - exact) / exact  # the estimate d(μ,ξ^K) + d(ξ^K,ν), not the bound A^K
    return [dict(dim=dim, n=n, support=support, interpolation=interpolation,
                 t="random" if t is None else t, setting=label, iteration=k + 1, A=a, exact=exact,
                 rel_gap=(a - exact) / exact, estimate_rel_error=final)
            for k, a in enumerate(result.history)]


def otdd_pair(a: LabelledData, b: LabelledData, config: FedWaDConfig, seed: int,
              diagonal: bool = True) -> dict[str, Any]:
    """Federated OTDD (FedWaD on augmented samples) next to the exact OTDD on the same samples (fig. 6)."""
    fed, t_fed = timed(federated_otdd, a, b, config, seed=seed, diagonal=diagonal)
    exact, t_exact = timed(otdd_exact, a.x, a.y, b.x, b.y, diagonal=diagonal)
    return dict(a=a.name, b=b.name, federated=fed.estimate, exact=exact, seconds_federated=t_fed,
                seconds_exact=t_exact, bytes=fed.ledger.total_bytes, messages=len(fed.ledger.entries))


def clustering_names(cfg: ClusteringParams) -> list[str]:
    """The clusterings clustered FL can train within: ``global``, ``planted``, ``affinity``, ``knn<k>``."""
    return ["global", "planted", "affinity"] + [f"knn{k}" for k in cfg.neighbors]


class Sessions(NamedTuple):
    """The first jobs' results regrouped: toy rows, convergence rows, OTDD pairs, and per clustering
    federation its name, roster and pair results; ``rest`` = the follow-up results."""

    toy: list[dict[str, Any]]
    convergence: list[dict[str, Any]]
    otdd: tuple[Roster, list[dict[str, Any]]]
    clustering: list[tuple[str, Roster, list[FedWaDResult]]]
    coresets: list[dict[str, Any]]
    rest: list[Any]


def sessions(p: Params, results: list[Any]) -> Sessions:
    """:func:`jobs`' results (in job order) regrouped; each federation's roster read again from
    ``data/partitions``, the files the jobs read."""
    fd, seed = p.fed_distance, p.run.seed
    remaining = iter(results)
    toy_rows = [row for rows in islice(remaining, len(toy_cases(fd.toy, seed))) for row in rows]
    conv_rows = [row for rows in islice(remaining, len(convergence_runs(fd.toy, seed))) for row in rows]
    otdd = roster(fd.otdd.federation, fd.otdd.diagonal)
    otdd_results = _take(remaining, len(otdd.clients), include_diagonal=fd.otdd.self_pairs)
    rosters = []
    for name in fd.clustering.federations:
        r = roster(name, fd.clustering.diagonal)
        rosters.append((name, r, _take(remaining, len(r.clients), include_diagonal=False)))
    coreset_rows = [row for rows in islice(remaining, len(coreset_cells(p))) for row in rows]
    return Sessions(toy_rows, conv_rows, (otdd, otdd_results), rosters, coreset_rows, list(remaining))


def cluster_labels(cfg: ClusteringParams, r: Roster, distances: np.ndarray,
                   seed: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """A federation's clustering scores and labels (:func:`clustering_scores`) from its federated-OTDD
    matrix, with at most as many clusters as planted groups and clients."""
    n_clusters = min(cfg.n_clusters, len(np.unique(r.groups)), len(r.clients))
    return clustering_scores(distances, r.groups, max(n_clusters, 2), cfg.neighbors, seed)


def followups(p: Params, results: list[Any]) -> list[Job]:
    """Clustered FL: one job per (clustering federation, clustering, algorithm, seed), with the clusters
    spectral clustering finds on the federated OTDDs of the first jobs (the server's only input: the
    distance matrix) — or one global cluster, or the planted groups."""
    fd, seed = p.fed_distance, p.run.seed
    fl = fd.clustered_fl
    if fl is None:
        return []
    device = stage_device(p.run.device)
    out = []
    for name, r, pair_results in sessions(p, results).clustering:
        _, labels = cluster_labels(fd.clustering, r, matrix_and_ledger(len(r.clients), pair_results)[0], seed)
        sets = {"global": np.zeros(len(r.clients), dtype=np.int64), "planted": np.asarray(r.groups)} | labels
        data = [((c.x, c.y), held) for c, held in zip(r.clients, r.held_out)]
        n_classes = int(max(np.max(c.y) for c in r.clients)) + 1
        for clustering in fl.clusterings:
            for algorithm in fl.algorithms:
                for s in range(seed, seed + fl.seeds):
                    out.append(Job(f"clustered-fl {name} {clustering} {algorithm} seed {s}", clustered_fl, dict(
                        federation=name, clustering=clustering, algorithm=algorithm,
                        names=[c.name for c in r.clients], groups=np.asarray(r.groups), clients=data,
                        clusters=sets[clustering], config=fl.fl, n_classes=n_classes, seed=s, device=device)))
    return out


def clustered_fl(federation: str, clustering: str, algorithm: str, names: list[str], groups: np.ndarray,
                 clients: list[tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]],
                 clusters: np.ndarray, config: PersonalizedConfig, n_classes: int, seed: int,
                 device: str) -> list[dict[str, Any]]:
    """FedWaD tables 1–5, one cell: ``algorithm`` trained within each cluster
    (:func:`~otfed.fl.per_cluster_accuracy`); one row per client with its held-out accuracy."""
    acc = per_cluster_accuracy(clients, clusters, algorithm, config, n_classes, seed=seed, device=device,
                               num_threads=threads_for(device))
    return [dict(federation=federation, clustering=clustering, algorithm=algorithm, seed=seed, client=name,
                 group=int(g), cluster=int(c), correct=int(k), total=int(n), accuracy=float(k / n))
            for name, g, c, k, n in zip(names, groups, clusters, acc.correct, acc.total)]


def clustering_scores(distances: np.ndarray, groups: np.ndarray, n_clusters: int, neighbors: list[int],
                      seed: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Spectral clustering (precomputed rescaled affinity; kNN graphs) scored by ARI vs planted groups."""
    rows: list[dict[str, Any]] = []
    labels: dict[str, np.ndarray] = {}
    settings = [("affinity", "precomputed", 0)] + [(f"knn{k}", "knn", k) for k in neighbors]
    for name, affinity, k in settings:
        pred = spectral_clusters(distances, n_clusters, affinity=affinity, n_neighbors=max(k, 1), seed=seed)
        labels[name] = pred
        rows.append(dict(method=name, n_neighbors=k, ari=adjusted_rand_index(groups, pred),
                         n_clusters_found=len(np.unique(pred))))
    return rows, labels


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: list[Any], out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Toy tables and figures, OTDD pairs and heatmaps, clustering matrices and ARIs, the communication
    ledger and the degenerate clients; nested runs per toy method × support, for OTDD and per federation.

    The results come in job order; each federation's roster (client names, planted groups, degenerate
    clients) is read again from ``data/partitions``, the files the jobs read.
    """
    fd, seed = p.fed_distance, p.run.seed
    parts = sessions(p, results)
    metrics: dict[str, Any] = {"toy": toy_metrics(pd.DataFrame(parts.toy), pd.DataFrame(parts.convergence), out)}
    otdd, otdd_results = parts.otdd
    metrics["otdd"] = otdd_metrics(fd.otdd, otdd, otdd_results, out)
    degenerate = list(otdd.degenerate) + [row for _, r, _ in parts.clustering for row in r.degenerate]
    metrics["clustering"] = clustering_metrics(fd.clustering, parts.clustering, seed, out)
    fl_rows = pd.DataFrame([row for rows in parts.rest for row in rows])
    fl_summary = clustered_fl_summary(fl_rows) if len(fl_rows) else None
    if fd.clustered_fl is not None:
        metrics["clustered_fl"] = clustered_fl_metrics(fl_rows, fl_summary, out)
    if fd.coresets is not None:
        metrics["coresets"] = coreset_metrics(parts.coresets, fl_summary, out)
    out.table(pd.DataFrame(degenerate, columns=["federation", "client", "reason"]), "degenerate_clients.csv")
    metrics["degenerate_clients"] = len(degenerate)
    return metrics


def _take(results: Iterator[Any], n_clients: int, include_diagonal: bool) -> list[Any]:
    """The next results: one per client pair of ``n_clients`` (:func:`client_pairs` order)."""
    return list(islice(results, len(client_pairs(n_clients, include_diagonal))))


def toy_metrics(rows: pd.DataFrame, conv: pd.DataFrame, out: Report) -> dict[str, Any]:
    """Fig. 2 and 3 tables and figures; one nested run per FedWaD method × support (rel_error and seconds
    per (d, ratio), step = n); headline: relative errors at the largest n, final A^k gaps (the total times
    go to MLflow only, as do the ``seconds`` column and the running-time figure)."""
    out.table(rows, "toy_gaussians.csv")
    out.figure(figs.toy_error_figure(rows), "toy_time_error.png")
    out.timing_figure(figs.toy_time_figure(rows), "toy_time.png")
    # one nested run per method × support, rel_error logged with step = n (MLflow compare view)
    fed_rows = rows[rows.method != "exact_ot"]
    fed_rows = fed_rows.assign(support=np.where(fed_rows.method == "fedwad_exact_interp", "n",
                                                fed_rows.support.astype(str)))
    for (method, support), sub in fed_rows.groupby(["method", "support"]):
        with out.variant(f"toy/{method}/S{support}", tags={"method": method, "support": support}) as child:
            child.log_params({"method": method, "support": support})
            for (dim, ratio), cell in sub.groupby(["dim", "ratio"]):
                for row in cell.groupby("n", as_index=False)[["rel_error", "seconds"]].mean().itertuples():
                    child.log_metrics({f"rel_error_d{dim}_r{ratio}": row.rel_error,
                                       f"seconds_d{dim}_r{ratio}": row.seconds}, step=int(row.n))
    out.table(conv, "convergence.csv")
    out.figure(figs.convergence_figure(conv), "convergence.png")

    largest = rows[rows.n == rows.n.max()]
    summary = {}
    for (method, support, dim, ratio), cell in largest.groupby(["method", "support", "dim", "ratio"]):
        if method == "fedwad_approx":
            summary[f"{method}_S{support}_d{dim}_r{ratio}_rel_error"] = float(cell.rel_error.mean())
    exact_interp = rows[rows.method == "fedwad_exact_interp"]
    for (dim, ratio), cell in exact_interp[exact_interp.n == exact_interp.n.max()].groupby(["dim", "ratio"]):
        summary[f"fedwad_exact_interp_n{int(cell.n.iloc[0])}_d{dim}_r{ratio}_rel_error"] = float(cell.rel_error.mean())
    approx = rows[rows.method == "fedwad_approx"]
    exact_rows = rows[rows.method == "exact_ot"]
    summary["max_n"] = int(rows.n.max())
    summary["seconds_fedwad_approx_total"] = float(approx.seconds.sum())
    summary["seconds_exact_ot_total"] = float(exact_rows.seconds.sum())
    last = conv.sort_values("iteration").groupby(["dim", "setting"]).tail(1)
    for r in last.itertuples():
        summary[f"convergence_gap_d{r.dim}_{r.interpolation}_S{r.support}_t{r.t}"] = float(r.rel_gap)
    summary |= support_needed(last)
    return summary


def support_needed(last: pd.DataFrame, tolerance: float = 0.05) -> dict[str, float]:
    """Per d: the smallest support S whose approximate FedWaD (random t) estimate is within ``tolerance``
    of the exact W after the last iteration (NaN when none is) — the S the toy study needs in that d."""
    out = {}
    runs = last[(last.interpolation == "approx") & (last.t == "random")]
    for dim, sub in runs.groupby("dim"):
        good = sub[sub.estimate_rel_error < tolerance]
        out[f"support_needed_d{dim}_below_{round(100 * tolerance)}pct"] = (
            float(good.support.min()) if len(good) else float("nan"))
    return out


def otdd_metrics(cfg: OTDDParams, otdd: Roster, results: list[dict[str, Any]], out: Report) -> dict[str, Any]:
    """Fig. 6: the pairs table, federated vs exact heatmaps; headline: order preservation, relative errors,
    self-distances, bytes per pair (also the nested run ``otdd``)."""
    table = pd.DataFrame(results)
    out.table(table, "otdd_pairs.csv")
    n = len(otdd.clients)
    pairs = client_pairs(n, include_diagonal=cfg.self_pairs)
    fed_m = distance_matrix(n, pairs, [r["federated"] for r in results])
    exact_m = distance_matrix(n, pairs, [r["exact"] for r in results])
    order = order_preservation(exact_m, fed_m)
    out.figure(figs.otdd_heatmaps([c.name for c in otdd.clients], fed_m, exact_m, order), "otdd_heatmaps.png")
    off = table[table.a != table.b]
    rel = (off.federated - off.exact).abs() / off.exact
    summary = {"order_preserved": order, "mean_rel_error": float(rel.mean()), "max_rel_error": float(rel.max())}
    if cfg.self_pairs:
        summary["self_distance_federated_max"] = float(table[table.a == table.b].federated.max())
        summary["self_distance_exact_max"] = float(table[table.a == table.b].exact.max())
    summary["bytes_per_pair"] = float(off.bytes.mean())
    with out.variant("otdd", tags={"federation": cfg.federation}) as child:
        child.log_metrics(summary)
    return summary


def clustering_metrics(cfg: ClusteringParams, rosters: list[tuple[str, Roster, list[FedWaDResult]]], seed: int,
                       out: Report) -> dict[str, Any]:
    """Tables 1–5: per federation the federated OTDD matrix with the clusters found, its heatmap, ARI per
    method (nested run ``clustering/<federation>``); the ARI table and the communication ledger."""
    summary: dict[str, Any] = {}
    score_rows, ledgers = [], []
    for name, r, results in rosters:
        d, ledger = matrix_and_ledger(len(r.clients), results)
        rows, labels = cluster_labels(cfg, r, d, seed)
        for row in rows:
            row["federation"] = name
        score_rows.extend(rows)
        matrix = pd.DataFrame(d, columns=[c.name for c in r.clients])
        matrix.insert(0, "client", [c.name for c in r.clients])
        matrix.insert(1, "group", r.groups)
        for method, lab in labels.items():
            matrix[f"cluster_{method}"] = lab
        out.table(matrix, f"clustering_{name}_distances.csv", markdown=False)
        best = max(row["ari"] for row in rows)
        out.figure(figs.clustering_heatmap(d, r.groups, f"{name}: federated OTDD (best ARI {best:.2f})"),
                   f"clustering_{name}.png")
        cost = ledger.cost_table()
        cost.insert(0, "federation", name)
        ledgers.append(cost)
        summary[name] = {row["method"]: row["ari"] for row in rows}
        with out.variant(f"clustering/{name}", tags={"federation": name}) as child:
            child.log_metrics({f"ari_{row['method']}": row["ari"] for row in rows} |
                              {"bytes_total": float(ledger.total_bytes)})
    out.table(pd.DataFrame(score_rows)[["federation", "method", "n_neighbors", "ari", "n_clusters_found"]],
              "clustering_ari.csv")
    out.table(pd.concat(ledgers, ignore_index=True), "communication.csv")
    return summary


def clustered_fl_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per federation, clustering and algorithm: the pooled held-out accuracy Σ correct / Σ total (as the
    paper reports) as mean ± 95% CI over seeds, and the uplift over global FedAvg with the same seed
    (paired), mean ± 95% CI — the paper's "average uplift"."""
    pooled = rows.groupby(["federation", "clustering", "algorithm", "seed"], sort=False).agg(
        correct=("correct", "sum"), total=("total", "sum")).reset_index()
    pooled["accuracy"] = pooled.correct / pooled.total
    base = pooled[(pooled.clustering == "global") & (pooled.algorithm == "fedavg")].set_index(["federation", "seed"])
    out = []
    for (fed, clustering, algorithm), sub in pooled.groupby(["federation", "clustering", "algorithm"], sort=False):
        mean, half = mean_confidence_interval(sub.accuracy)
        row = dict(federation=fed, clustering=clustering, algorithm=algorithm, seeds=len(sub), accuracy=mean,
                   accuracy_ci95=half)
        if not base.empty:
            ref = base.accuracy.reindex(list(zip(sub.federation, sub.seed))).to_numpy()
            if np.all(np.isfinite(ref)):
                row["uplift_vs_global_fedavg"], row["uplift_vs_global_fedavg_ci95"] = mean_confidence_interval(
                    sub.accuracy.to_numpy() - ref)
        out.append(row)
    return pd.DataFrame(out)


def clustered_fl_metrics(table: pd.DataFrame, summary: pd.DataFrame, out: Report) -> dict[str, Any]:
    """Tables 1–5: per-client rows (``clustered_fl_clients.csv``), the summary over seeds
    (:func:`clustered_fl_summary`, ``clustered_fl.csv``) and its figure; nested run ``clustered_fl/<federation>``."""
    out.table(table, "clustered_fl_clients.csv", markdown=False)
    out.table(summary, "clustered_fl.csv")
    out.figure(figs.clustered_fl_figure(summary), "clustered_fl.png")
    metrics: dict[str, Any] = {}
    for fed, sub in summary.groupby("federation", sort=False):
        metrics[fed] = {f"{r.clustering}_{r.algorithm}": round(float(r.accuracy), 4) for r in sub.itertuples()}
        metrics[fed] |= {f"{r.clustering}_{r.algorithm}_uplift": round(float(r.uplift_vs_global_fedavg), 4)
                         for r in sub.itertuples()
                         if r.clustering != "global" and np.isfinite(getattr(r, "uplift_vs_global_fedavg", np.nan))}
        with out.variant(f"clustered_fl/{fed}", tags={"federation": fed}) as child:
            child.log_metrics({k: float(v) for k, v in metrics[fed].items()})
    return metrics


def coreset_metrics(rows: list[dict[str, Any]], fl: pd.DataFrame | None, out: Report) -> dict[str, Any]:
    """Fig. 5 / 12: per federation, points and method the pooled held-out accuracy of the coreset 1-NN
    (mean ± 95% CI over seeds) next to the global FedAvg / FedPer / FedRep of clustered FL on the same
    held-out splits (``coresets.csv``, ``coresets.png``); per-client rows in ``coresets_clients.csv``."""
    table = pd.DataFrame(rows)
    out.table(table, "coresets_clients.csv", markdown=False)
    summary = []
    for (fed, points, method), sub in table.groupby(["federation", "points", "method"], sort=False):
        pooled = sub.groupby("seed").agg(correct=("correct", "sum"), total=("total", "sum"), w2=("w2", "mean"))
        mean, half = mean_confidence_interval(pooled.correct / pooled.total)
        summary.append(dict(federation=fed, method=f"{method} K={points}", accuracy=mean, accuracy_ci95=half,
                            mean_client_w2=float(pooled.w2.mean()), seeds=len(pooled)))
    if fl is not None:  # the clustered-FL summary (:func:`clustered_fl_summary`)
        for r in fl[(fl.clustering == "global") & fl.federation.isin(table.federation.unique())].itertuples():
            summary.append(dict(federation=r.federation, method=f"global {r.algorithm}", accuracy=r.accuracy,
                                accuracy_ci95=r.accuracy_ci95, mean_client_w2=float("nan"), seeds=r.seeds))
    frame = pd.DataFrame(summary).sort_values(["federation"], kind="stable")
    out.table(frame, "coresets.csv")
    out.figure(figs.coreset_figure(frame), "coresets.png")
    metrics: dict[str, Any] = {}
    for fed, sub in frame.groupby("federation", sort=False):
        metrics[fed] = {r.method.replace(" ", "_").replace("=", ""): round(float(r.accuracy), 4)
                        for r in sub.itertuples()}
        with out.variant(f"coresets/{fed}", tags={"federation": fed}) as child:
            child.log_metrics({k: float(v) for k, v in metrics[fed].items()})
    return metrics


STAGE = Stage("fed_distance", FedDistanceParams, OUTPUTS, jobs, report, check,
              headline=("toy.fedwad_approx_S100_*_rel_error",  # fig. 2: error at the largest S, n = max_n
                        "toy.support_needed_*",  # the S at which the error falls below 5% (n = convergence_n)
                        "toy.convergence_gap_d50_approx_S300_*",  # fig. 3: fixed t = 0.5 stalls, random t not
                        "otdd.mean_rel_error", "otdd.order_preserved",  # fig. 6
                        "clustering.*.affinity",  # tables 1-5: ARI per structure
                        "clustered_fl.*.global_fedavg", "clustered_fl.*.affinity_fedavg_uplift",  # tables 1-5
                        "coresets.*.fedwad_coreset_K10"),  # fig. 5 / 12: coreset 1-NN accuracy
              followups=followups)

if __name__ == "__main__":  # DVC: python -m stages.fed_distance
    from flows.stage import main
    raise SystemExit(main(STAGE))
