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
  global federation, and the planted groups), each client scored on its own held-out split, over seeds;
* privacy (FedWaD §3, FedBary §4.4): an honest-but-curious server reconstructs a client's samples from the
  FedWaD / federated OTDD / FedBary messages it received, over the protocols' privacy knobs (random t,
  distances only at the end, S, K), and the DP FedWaD client against the same attack and the stronger ones
  (round averaging, a likelihood ratio over rounds, membership over many splits, clip-radius canaries; error vs ε,
  ARI vs ε), reported as a guarantee only at ε ≤ ``dp.meaningful_epsilon`` and labelled "no formal guarantee" above.

One flat job list: every toy case, every convergence run, every OTDD pair and every clustering pair (one
FedWaD session each, with its own per-pair seed), every coreset run, every privacy cell; then follow-up jobs
(:func:`followups`), one per (federation, clustering, algorithm, seed) of clustered FL, built from the clusters the
pairs give. Each job's key names its kind first, then which one it is — ``("toy", d, ratio, n, repeat)``,
``("convergence", d, S, interpolation, t)``, ``("otdd", a, b)``, ``("pair", federation, a, b)``, ``("coreset",
federation, points, seed)``, ``("attack", pair index, repeat, …cell)``, ``("dp", pair index, repeat, S, t, ε)``,
``("dp_fedbary", pair index, repeat, S, ε)``, ``("dp_audit", pair index, ε)``, ``("dp_clustering", ε)``, ``("clustered_fl", federation,
clustering, algorithm, seed)`` — and the report reads each kind's results by it.
Degenerate clients (no samples, NaN features, a class with one sample) are left out of the distances and
listed in ``degenerate_clients.csv``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, Union

import numpy as np
import pandas as pd
from pydantic import Field, field_validator

from otfed import io
from otfed.clustering import spectral_clusters
from otfed.data.features import check_pca_components, fit_pca, reduce_features
from otfed.data.gaussians import gaussian_pair
from otfed.data.store import VAL, FederationData, bounded_federation, load_federation
from otfed.device import stage_device, threads_for
from otfed.errors import DegenerateClientError, SupportGrowthError
from otfed.federation.coresets import (CoresetClassifier, CoresetConfig, client_coresets, client_seed,
                                       coreset_classifier, nearest_sample_labels, wasserstein_coreset)
from otfed.federation.fedbary import FedBaryConfig
from otfed.federation.fedwad import FedWaDConfig, FedWaDResult, federated_wasserstein
from otfed.federation.otdd import (client_pairs, distance_matrix, federated_otdd, matrix_and_ledger, pair_seed,
                                   pairwise_sessions, usable_clients)
from otfed.figures import fed_distance as figs
from otfed.fl import PersonalizedConfig, per_cluster_accuracy
from otfed.metrics import adjusted_rand_index, bonferroni_interval, mean_confidence_interval, order_preservation
from otfed.ot import otdd_exact, wasserstein
from otfed.ot.otdd import LabelledData, augmented_measure
from otfed.privacy.attack import Protocol, attack_protocol, canary_audit, dp_attack, membership_splits
from otfed.privacy.dp import DPConfig, dp_federated_wasserstein, gaussian_epsilon
from otfed.schema import InterpolationTime, PositiveInt, Strict
from stages import layout
from stages.params import named_federation, server_split_federation
from stages.stage import Job, Report, Results, Stage, check_memory, committed_table, timed

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


Support = Union[PositiveInt, Literal["n"]]  # a support size S, or "n": the target client's sample count


class PrivacyDPParams(Strict):
    """The DP FedWaD client (:mod:`otfed.privacy.dp`) against the same attack: per pair, support, t, ε and seed
    one DP FedWaD session (both clients DP, total (ε, δ) per client), its error against the exact W2 (POT)
    next to the non-DP FedWaD error, and the attack on the target's DP messages; with ``clustering_clients``,
    pairwise DP FedWaD between the federation's first clients → spectral clustering (ARI vs ε).

    Clip radius C (every sensitivity is ∝ C): the ``clip_quantile`` quantile of the norms of the server's own
    public test rows in the PCA space — fixed by public data before any client message, not by results.
    """

    epsilons: list[Annotated[float, Field(gt=0.0)]] = Field([1.0, 10.0, 100.0, 1000.0, 1e4, 1e5, math.inf],
                                                            min_length=1, description="Total ε per client; "
                                                            "inf = no noise (FedWaD on clipped records).")
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    clip_quantile: float = Field(1.0, gt=0.0, le=1.0)
    supports: list[Support] = Field([10, "n"], min_length=1)
    times: list[InterpolationTime] = Field(["random", 0.5], min_length=1)
    iterations: int = Field(10, ge=1, le=1000)
    accountant: Literal["rdp", "pld"] = "rdp"
    seeds: int = Field(3, ge=1, le=100)
    clustering_clients: int = Field(10, ge=0, description="0: no clustering; else pairwise DP FedWaD (the "
                                    "clustering group's fedwad config) between the first k usable clients.")
    fedbary: bool = Field(True, description="Also FedBary with every client DP (otfed.privacy.dp_fedbary; Q the "
                          "server's validation set, t random, K = iterations, S in supports): the attack vs ε. C in "
                          "the label-augmented space: the clip_quantile quantile of the norms of the server's "
                          "augmented validation samples.")
    meaningful_epsilon: float = Field(10.0, gt=0.0, description="The largest ε reported as a formal guarantee; "
                                      "rows above it are labelled 'no formal guarantee' (docs/privacy.md says why).")
    membership_splits: int = Field(20, ge=0, le=1000, description="Per (pair, ε): member / non-member splits of the "
                                   "target's rows ∪ held-out rows, one DP FedWaD session each (S = members, the fixed "
                                   "t of times), AUC mean and 95% interval; 0: off.")
    canaries: int = Field(10, ge=0, le=1000, description="Per (pair, ε) and audit session: clip-radius canaries "
                          "inserted (as many held out), the likelihood-ratio AUC; 0: off.")
    canary_sessions: int = Field(5, ge=1, le=1000, description="Audit sessions per (pair, ε).")


class PrivacyParams(Strict):
    """An honest-but-curious server's reconstruction attack (:mod:`otfed.privacy.attack`) on FedWaD, federated
    OTDD and FedBary sessions between real clients (FedWaD §3's random t and "distances only at the last
    iteration"; FedBary §4.4's "raw training samples cannot be reconstructed"), and the DP defence (``dp``).

    Clients: ``pairs`` of (target, partner) client indices of ``federation``, features projected on a PCA
    fitted on the server's test split (public); the attack is scored against the target's training rows,
    with its held-out (validation) rows as non-members. The grid: ``protocols`` × ``interpolations`` ×
    ``supports`` × ``times`` × ``iterations`` × ``per_round_distances`` (FedWaD / OTDD) or
    ``fedbary_validation`` (FedBary: Q the server's first ``validation_samples`` test rows, or the federated
    barycenter); FedBary approximate interpolation only, exact interpolation at the smallest K only (its
    support grows every round; one round already gives every sample away, FedWaD eq. 5).
    """

    federation: str = "pairs_strong"
    pca_components: int = Field(16, ge=1)
    pairs: list[list[Annotated[int, Field(ge=0)]]] = Field([[0, 1]], min_length=1)
    protocols: list[Protocol] = Field(["fedwad", "otdd", "fedbary"], min_length=1)
    interpolations: list[Literal["approx", "exact"]] = Field(["approx", "exact"], min_length=1)
    supports: list[Support] = Field([10, 50, "n"], min_length=1)
    times: list[InterpolationTime] = Field(["random", 0.5], min_length=1)
    iterations: list[PositiveInt] = Field([1, 10], min_length=1)
    per_round_distances: list[bool] = Field([False, True], min_length=1)
    fedbary_validation: list[bool] = Field([False, True], min_length=1)
    validation_samples: int = Field(300, ge=2)
    threshold: float = Field(0.5, gt=0.0, description="Recovered: within threshold × the target's median NN "
                             "distance.")
    seeds: int = Field(1, ge=1, le=100)
    dp: PrivacyDPParams | None = PrivacyDPParams()

    @field_validator("pairs")
    @classmethod
    def _pairs(cls, v: list[list[int]]) -> list[list[int]]:
        for i, pair in enumerate(v):
            if len(pair) != 2 or pair[0] == pair[1]:
                raise ValueError(f"pairs[{i}]: must be [target, partner], two different client indices (got {pair})")
        return v


class FedDistanceParams(Strict):
    """Stage ``fed_distance``: toy study (fig. 2–3), federated OTDD (fig. 6), client clustering and FL
    within the clusters (tables 1–5), coresets (fig. 5, 12), the server's attack and the DP defence."""

    toy: ToyParams
    otdd: OTDDParams = OTDDParams()
    clustering: ClusteringParams
    clustered_fl: ClusteredFLParams | None = ClusteredFLParams()
    coresets: CoresetParams | None = Field(None, description="Off unless set: its default federations may not exist.")
    privacy: PrivacyParams | None = Field(None, description="Off unless set: its default federation may not exist.")


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
    if p.fed_distance.privacy is not None:
        check_privacy(p)
    fl = p.fed_distance.clustered_fl
    if fl is not None:
        allowed = clustering_names(p.fed_distance.clustering)
        for i, name in enumerate(fl.clusterings):
            if name not in allowed:
                raise ValueError(f"fed_distance.clustered_fl.clusterings[{i}]: {name!r} is not one of "
                                 f"{', '.join(allowed)} (knn<k> for k in fed_distance.clustering.neighbors)")


def check_privacy(p: Params) -> None:
    """The privacy federation has a server test split (the PCA, the FedBary validation set) larger than
    ``validation_samples``; pair indices and ``dp.clustering_clients`` lie within its clients; DP clustering
    uses approximate interpolation (the DP client's only mode)."""
    cfg, key = p.fed_distance.privacy, "fed_distance.privacy"
    if not privacy_attack_cells(cfg):
        raise ValueError(f"{key}.interpolations: no attack cell (FedBary is attacked with 'approx' only)")
    spec = server_split_federation(p, f"{key}.federation", cfg.federation, cfg.validation_samples,
                                   f"{key}.validation_samples")
    n_clients = getattr(spec, "n_clients", None)
    if n_clients is not None:
        for i, pair in enumerate(cfg.pairs):
            if max(pair) >= n_clients:
                raise ValueError(f"{key}.pairs[{i}]: client index {max(pair)} out of range: {cfg.federation!r} has "
                                 f"{n_clients} clients")
        if cfg.dp is not None and cfg.dp.clustering_clients > n_clients:
            raise ValueError(f"{key}.dp.clustering_clients: {cfg.dp.clustering_clients} > the {n_clients} clients "
                             f"of {cfg.federation!r}")
    if cfg.dp is not None and cfg.dp.clustering_clients and p.fed_distance.clustering.fedwad.interpolation != "approx":
        raise ValueError(f"{key}.dp.clustering_clients: DP FedWaD needs fed_distance.clustering.fedwad.interpolation "
                         "'approx' (or set clustering_clients: 0)")
    if cfg.dp is not None and cfg.dp.clustering_clients == 1:
        raise ValueError(f"{key}.dp.clustering_clients: 0 (off) or at least 2 clients")


def federations_read(p: Params) -> list[str]:
    """The federations the stage reads from ``data/partitions``: OTDD's, the clustering ones, the coresets'
    and the privacy one (when on), each once, in that order."""
    fd = p.fed_distance
    names = [fd.otdd.federation, *fd.clustering.federations]
    names += fd.coresets.federations if fd.coresets is not None else []
    names += [fd.privacy.federation] if fd.privacy is not None else []
    return list(dict.fromkeys(names))


def inputs(p: Params) -> list[Path]:
    """The partition files of :func:`federations_read` (checked to exist before :func:`preflight`)."""
    return [Path(layout.PARTITIONS) / f"{name}.npz" for name in federations_read(p)]


def preflight(p: Params) -> None:
    """The toy study's arrays fit in this machine's memory (:func:`toy_memory`); every federation read holds
    what the partition format declares (labels, client indices, lengths, shapes, the manifest's sizes) and
    features small enough for float32 distances (:func:`~otfed.data.store.bounded_federation`); the OTDD and
    clustering federations have two usable clients; the privacy study's pairs are usable clients with held-out
    rows and its server validation split a usable FedBary reference (:func:`check_privacy_data`) — before any
    server starts (ConfigError naming the key, DataError / DegenerateClientError naming the file or the
    federation otherwise)."""
    fd = p.fed_distance
    check_memory(toy_memory(fd.toy))
    compared = {fd.otdd.federation: fd.otdd.diagonal,
                **{name: fd.clustering.diagonal for name in fd.clustering.federations}}
    # (federation, key, components) of every PCA the stage fits on a federation's test split (public data)
    pcas = [(name, "fed_distance.coresets.pca_components", fd.coresets.pca_components)
            for name in (fd.coresets.federations if fd.coresets is not None else [])]
    pcas += [(fd.privacy.federation, "fed_distance.privacy.pca_components", fd.privacy.pca_components)] \
        if fd.privacy is not None else []
    for name in federations_read(p):
        source = Path(layout.PARTITIONS) / f"{name}.npz"
        fed = bounded_federation(load_federation(name, layout.PARTITIONS), source)
        if name in compared:
            roster_of(fed, compared[name])
        for key, k in ((key, k) for federation, key, k in pcas if federation == name):
            check_pca_components(k, *fed.x_test.shape, key, f"the test split of {source}")
    if fd.privacy is not None:
        check_privacy_data(p, privacy_data(p))


# float64 bytes of an n × m cost matrix and its transport plan, which an exact or FedWaD solve holds at once
PLAN_BYTES = 2 * 8


def toy_memory(toy: ToyParams) -> list[tuple[str, int, str]]:
    """(key, bytes, what) for each array a toy job must hold (:func:`~stages.stage.check_memory`): a lower bound
    of the job's memory (the solvers need more besides). Per d and n of :func:`toy_cases`, with m = n / ratio
    for the smallest ratio: the exact W's n × m cost matrix and plan (float64; POT's network simplex), FedWaD's
    n × S ones per support S, the two samples (n + m points of d float64 coordinates); the convergence runs'
    n × n ones (S up to n). Pure."""
    out = []
    for k, d in enumerate(toy.dims):
        for i, n in enumerate(toy.n_values):
            m = max(n // r for r in toy.ratios)
            if m < 1:
                continue
            out.append((f"fed_distance.toy.n_values[{i}]", PLAN_BYTES * n * m,
                        f"n = {n}: the exact W's {n} × {m} cost matrix and plan (float64)"))
            out += [(f"fed_distance.toy.supports[{j}]", PLAN_BYTES * n * s,
                     f"S = {s}: FedWaD's {n} × {s} cost matrix and plan at n = {n} (float64)")
                    for j, s in enumerate(toy.supports)]
            out.append((f"fed_distance.toy.dims[{k}]", 8 * d * (n + m),
                        f"d = {d}: {n} + {m} samples of {d} float64 coordinates"))
    n = toy.convergence_n
    out.append(("fed_distance.toy.convergence_n", PLAN_BYTES * n * n,
                f"n = {n}: the convergence runs' {n} × {n} cost matrix and plan (float64)"))
    return out


def check_privacy_data(p: Params, data: PrivacyData) -> None:
    """DegenerateClientError naming the key unless every ``fed_distance.privacy.pairs`` entry names usable
    clients, the target with held-out rows (:func:`_privacy_pair`), and — where FedBary takes the server's
    validation split as its reference (``fedbary_validation`` or ``dp.fedbary``) — that split (the first
    ``validation_samples`` test rows) is a usable labelled measure: every class in it with at least two
    rows (:func:`~otfed.ot.otdd.augmented_measure`); ``dp.canaries`` at most every target's size."""
    cfg = p.fed_distance.privacy
    for i, pair in enumerate(cfg.pairs):
        target, _, _ = _privacy_pair(data, i, pair)
        n = int(np.asarray(target.x).shape[0])
        if cfg.dp is not None and cfg.dp.canaries > n:
            raise DegenerateClientError(f"fed_distance.privacy.dp.canaries: {cfg.dp.canaries} canaries cannot replace "
                                        f"records of pairs[{i}]'s target {target.name!r} (n = {n}); take at most {n}")
    uses_validation = (("fedbary" in cfg.protocols and True in cfg.fedbary_validation)
                       or (cfg.dp is not None and cfg.dp.fedbary))
    if uses_validation:
        try:
            augmented_measure(data.validation, diagonal=True)
        except DegenerateClientError as exc:
            reason = str(exc).split(": ", 1)[-1]
            raise DegenerateClientError(
                f"fed_distance.privacy.validation_samples: the server's validation split of {cfg.federation!r} (its "
                f"first {cfg.validation_samples} test rows, FedBary's reference) is degenerate: {reason}; take more "
                "rows (or set fedbary_validation: [false] and dp.fedbary: false)") from None


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
    settings = dict.fromkeys([(10, "approx", None), (n, "approx", None), (n, "approx", 0.5), (n, "exact", None),
                              *sweep])  # each once: S = 10 is S = n when convergence_n is 10
    return [dict(dim=d, n=n, support=s, iterations=toy.iterations, interpolation=i, t=t, seed=seed)
            for d in toy.dims for (s, i, t) in settings]


def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """Toy cases, convergence runs, OTDD pairs (self-pairs included), every clustering pair, the coreset runs,
    then the privacy cells (:func:`privacy_jobs`); keys in the module docstring."""
    fd, seed = p.fed_distance, p.run.seed
    out = [Job(f"toy d={kw['dim']} ratio={kw['ratio']} n={kw['n']} repeat={kw['repeat']}", toy_case, kw,
               key=("toy", kw["dim"], kw["ratio"], kw["n"], kw["repeat"]))
           for kw in toy_cases(fd.toy, seed)]
    for kw in convergence_runs(fd.toy, seed):
        t = "random" if kw["t"] is None else kw["t"]
        out.append(Job(f"convergence d={kw['dim']} {kw['interpolation']} S={kw['support']} t={t}", toy_convergence,
                       kw, key=("convergence", kw["dim"], kw["support"], kw["interpolation"], t)))
    otdd = roster(fd.otdd.federation, fd.otdd.diagonal)
    out += [Job(f"otdd {kw['a'].name}|{kw['b'].name}", otdd_pair, kw, key=("otdd", kw["a"].name, kw["b"].name))
            for kw in pairwise_sessions(otdd.clients, fd.otdd.fedwad, seed, fd.otdd.diagonal,
                                           include_diagonal=fd.otdd.self_pairs)]
    cfg = fd.clustering
    for name in cfg.federations:
        clients = roster(name, cfg.diagonal).clients
        out += [Job(f"clustering {name} {kw['a'].name}|{kw['b'].name}", federated_otdd, kw,
                    key=("pair", name, kw["a"].name, kw["b"].name))
                for kw in pairwise_sessions(clients, cfg.fedwad, seed, cfg.diagonal)]
    out += [Job(f"coresets {kw['federation']} K={kw['config'].points} seed {kw['seed']}", coreset_classification, kw,
                key=("coreset", kw["federation"], kw["config"].points, kw["seed"]))
            for kw in coreset_runs(p)]
    out += privacy_jobs(p)
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


# ------------------------------------------------------------------------------------- privacy jobs
@dataclass(frozen=True)
class PrivacyData:
    """The privacy federation as its jobs see it (:func:`privacy_data`): per client index (the federation's
    order) the training rows and the held-out rows on the server-fitted PCA, and the planted group; the
    usable client indices in order; the server's validation set (its first test rows, public); the clip radius
    C of the DP client, from the server's test rows (public)."""

    clients: dict[int, LabelledData]
    held_out: dict[int, np.ndarray]
    groups: dict[int, int]
    usable: list[int]
    validation: LabelledData
    clip_radius: float


def privacy_data(p: Params) -> PrivacyData:
    """Read ``fed_distance.privacy.federation`` from ``data/partitions``, fit a PCA of ``pca_components`` on the
    server's test split (public data, as the coresets do) and project every usable client's rows on it; C = the
    ``dp.clip_quantile`` quantile of the norms of the projected test rows (:class:`PrivacyDPParams`)."""
    cfg, seed = p.fed_distance.privacy, p.run.seed
    fed = load_federation(cfg.federation, layout.PARTITIONS)
    x_test = fed.x_test.astype(np.float64)
    pca = fit_pca(x_test, cfg.pca_components, seed)
    test = reduce_features(x_test, pca)
    r = roster_of(fed, diagonal=True, min_clients=1)
    index = [fed.client_names.index(c.name) for c in r.clients]
    quantile = cfg.dp.clip_quantile if cfg.dp is not None else 1.0
    k = cfg.validation_samples
    return PrivacyData(clients={i: LabelledData(c.name, reduce_features(c.x, pca), c.y)
                                for i, c in zip(index, r.clients)},
                       held_out={i: reduce_features(x, pca) for i, (x, _) in zip(index, r.held_out)},
                       groups={i: int(g) for i, g in zip(index, r.groups)}, usable=index,
                       validation=LabelledData("server_validation", test[:k], fed.y_test[:k]),
                       clip_radius=float(np.quantile(np.linalg.norm(test, axis=1), quantile)))


def privacy_attack_cells(cfg: PrivacyParams) -> list[dict[str, Any]]:
    """Every setting of the attack grid, in grid order (:class:`PrivacyParams`): FedWaD and OTDD over
    interpolation × S × t × K × per-round distances (exact interpolation at the smallest K only); FedBary
    (approximate only, its clients report d_i every round by protocol) over S × t × K × validation set."""
    cells = []
    ks = list(dict.fromkeys(cfg.iterations))
    for protocol in dict.fromkeys(cfg.protocols):
        for interpolation in dict.fromkeys(cfg.interpolations):
            if protocol == "fedbary" and interpolation != "approx":
                continue
            for support in dict.fromkeys(cfg.supports):
                for t in dict.fromkeys(cfg.times):
                    for k in ks if interpolation == "approx" else [min(ks)]:
                        if protocol == "fedbary":
                            cells += [dict(protocol=protocol, interpolation=interpolation, support=support, t=t,
                                           iterations=k, per_round_distances=True, validation=v)
                                      for v in dict.fromkeys(cfg.fedbary_validation)]
                        else:
                            cells += [dict(protocol=protocol, interpolation=interpolation, support=support, t=t,
                                           iterations=k, per_round_distances=d, validation=False)
                                      for d in dict.fromkeys(cfg.per_round_distances)]
    return cells


def privacy_dp_cells(dp: PrivacyDPParams) -> list[dict[str, Any]]:
    """Every (S, t, ε) of the DP grid, in grid order."""
    return [dict(support=s, t=t, epsilon=e) for s in dict.fromkeys(dp.supports) for t in dict.fromkeys(dp.times)
            for e in dict.fromkeys(dp.epsilons)]


def privacy_dp_fedbary_cells(dp: PrivacyDPParams) -> list[dict[str, Any]]:
    """Every (S, ε) of the DP FedBary grid (none unless ``dp.fedbary``), in grid order."""
    return [dict(support=s, epsilon=e) for s in dict.fromkeys(dp.supports) for e in dict.fromkeys(dp.epsilons)] \
        if dp.fedbary else []


def privacy_seed(seed: int, target: int, partner: int, repeat: int) -> int:
    """The protocol seed of a (target, partner, repeat), shared by every grid cell (the cells differ in their
    setting only) — independent of the order jobs run in (as :func:`~otfed.federation.otdd.pair_seed`)."""
    return int(np.random.SeedSequence([seed, target, partner, repeat, 24]).generate_state(1)[0])


def _privacy_pair(data: PrivacyData, i: int, pair: list[int]) -> tuple[LabelledData, LabelledData, np.ndarray]:
    for k in pair:
        if k not in data.clients:
            raise DegenerateClientError(f"fed_distance.privacy.pairs[{i}]: client {k} is not usable "
                                        "(degenerate_clients.csv says why)")
    target, partner = data.clients[pair[0]], data.clients[pair[1]]
    if data.held_out[pair[0]].shape[0] == 0:
        raise DegenerateClientError(f"fed_distance.privacy.pairs[{i}]: client {target.name!r} has no held-out rows "
                                    "(the non-members of the membership test): partition it with val_fraction > 0")
    return target, partner, data.held_out[pair[0]]


def privacy_jobs(p: Params) -> list[Job]:
    """Per (pair, seed) one :func:`privacy_attack` per attack cell (key ``("attack", i, r, …the cell's values)``
    for ``pairs[i]`` and seed r), then per (pair, seed) one :func:`privacy_dp` per DP cell (``("dp", i, r, S, t,
    ε)``), then per (pair, ε) one :func:`privacy_dp_audit` (``("dp_audit", i, ε)``; unless both its parts are off),
    then per (pair, seed) one :func:`privacy_dp_fedbary` per DP FedBary cell (``("dp_fedbary", i, r, S, ε)``), then
    one :func:`privacy_dp_clustering` per ε (``("dp_clustering", ε)``)."""
    cfg, seed = p.fed_distance.privacy, p.run.seed
    if cfg is None:
        return []
    data = privacy_data(p)
    out = []
    cells = privacy_attack_cells(cfg)
    for i, pair in enumerate(cfg.pairs):
        target, partner, held = _privacy_pair(data, i, pair)
        for r in range(cfg.seeds):
            for c in cells:
                validation = data.validation if c["validation"] else None
                name = (f"privacy attack {c['protocol']} {c['interpolation']} S={c['support']} t={c['t']} "
                        f"K={c['iterations']} {'every' if c['per_round_distances'] else 'last'}"
                        f"{' validation' if validation else ''} {target.name}|{partner.name} seed {r}")
                out.append(Job(name, privacy_attack, dict(
                    federation=cfg.federation, target=target, partner=partner, non_members=held,
                    protocol=c["protocol"], interpolation=c["interpolation"], support=c["support"], t=c["t"],
                    iterations=c["iterations"], per_round_distances=c["per_round_distances"], validation=validation,
                    threshold=cfg.threshold, seed=privacy_seed(seed, pair[0], pair[1], r), repeat=r),
                    key=("attack", i, r, *c.values())))
    dp = cfg.dp
    if dp is None:
        return out
    for i, pair in enumerate(cfg.pairs):
        target, partner, held = _privacy_pair(data, i, pair)
        for r in range(dp.seeds):
            for c in privacy_dp_cells(dp):
                out.append(Job(f"privacy dp S={c['support']} t={c['t']} eps={c['epsilon']:g} "
                               f"{target.name}|{partner.name} seed {r}", privacy_dp, dict(
                                   federation=cfg.federation, target=target, partner=partner, non_members=held,
                                   support=c["support"], t=c["t"], iterations=dp.iterations, epsilon=c["epsilon"],
                                   delta=dp.delta, clip_radius=data.clip_radius, accountant=dp.accountant,
                                   threshold=cfg.threshold, seed=privacy_seed(seed, pair[0], pair[1], r), repeat=r,
                                   meaningful_epsilon=dp.meaningful_epsilon),
                               key=("dp", i, r, c["support"], c["t"], c["epsilon"])))
    if dp.membership_splits or dp.canaries:
        for i, pair in enumerate(cfg.pairs):
            target, partner, held = _privacy_pair(data, i, pair)
            for e in dict.fromkeys(dp.epsilons):
                out.append(Job(f"privacy dp audit eps={e:g} {target.name}|{partner.name}", privacy_dp_audit, dict(
                    federation=cfg.federation, target=target, partner=partner, non_members=held,
                    t=audit_time(dp), iterations=dp.iterations, epsilon=e, delta=dp.delta,
                    clip_radius=data.clip_radius, accountant=dp.accountant, splits=dp.membership_splits,
                    canaries=dp.canaries, canary_sessions=dp.canary_sessions, threshold=cfg.threshold,
                    seed=privacy_seed(seed, pair[0], pair[1], 0)), key=("dp_audit", i, e)))
    if dp.fedbary:
        radius = float(np.quantile(np.linalg.norm(augmented_measure(data.validation, diagonal=True).support, axis=1),
                                   dp.clip_quantile))
        for i, pair in enumerate(cfg.pairs):
            target, partner, held = _privacy_pair(data, i, pair)
            for r in range(dp.seeds):
                for c in privacy_dp_fedbary_cells(dp):
                    out.append(Job(f"privacy dp-fedbary S={c['support']} eps={c['epsilon']:g} "
                                   f"{target.name}|{partner.name} seed {r}", privacy_dp_fedbary, dict(
                                       federation=cfg.federation, target=target, partner=partner, non_members=held,
                                       validation=data.validation, support=c["support"], iterations=dp.iterations,
                                       epsilon=c["epsilon"], delta=dp.delta, clip_radius=radius,
                                       accountant=dp.accountant, threshold=cfg.threshold,
                                       seed=privacy_seed(seed, pair[0], pair[1], r), repeat=r),
                                   key=("dp_fedbary", i, r, c["support"], c["epsilon"])))
    if dp.clustering_clients:
        chosen = data.usable[:dp.clustering_clients]
        clients = [data.clients[k] for k in chosen]
        groups = np.array([data.groups[k] for k in chosen])
        for e in dict.fromkeys(dp.epsilons):
            out.append(Job(f"privacy dp clustering eps={e:g} ({len(clients)} clients)", privacy_dp_clustering, dict(
                federation=cfg.federation, clients=clients, groups=groups, epsilon=e, delta=dp.delta,
                clip_radius=data.clip_radius, config=p.fed_distance.clustering.fedwad, accountant=dp.accountant,
                seed=seed), key=("dp_clustering", e)))
    return out


def _support_size(support: int | str, n: int) -> int:
    return n if support == "n" else int(support)


def privacy_attack(federation: str, target: LabelledData, partner: LabelledData, non_members: np.ndarray,
                   protocol: str, interpolation: str, support: int | str, t: float | str, iterations: int,
                   per_round_distances: bool, validation: LabelledData | None, threshold: float, seed: int,
                   repeat: int) -> dict[str, Any]:
    """One attack cell: ``protocol`` between ``target`` and ``partner`` (FedBary: Q = ``validation``, or the
    federated barycenter), the honest-but-curious server's reconstruction of the target from its transcript
    (:func:`~otfed.privacy.attack.attack_protocol`), scored against the target's rows with ``non_members`` its
    held-out rows. S = ``support`` ("n": the target's sample count). One row: the setting; t_methods, t_error
    (the attacker's time estimators and largest time error); recovered_fraction (target rows within
    ``threshold`` × their median NN distance of a reconstructed point), non_member_fraction (the same for the
    non-members: the baseline), precise_fraction, median_error (in NN units), membership_auc; label_ari and
    classes_matched (OTDD, FedBary); seconds; note (exact interpolation past its support cap)."""
    n = int(np.asarray(target.x).shape[0])
    s = _support_size(support, n)
    row: dict[str, Any] = dict(federation=federation, target=target.name, partner=partner.name, n=n, protocol=protocol,
                               interpolation=interpolation, support=str(support), S=s, t=str(t), iterations=iterations,
                               distances="every round" if per_round_distances else "last",
                               validation=validation is not None, repeat=repeat)
    # the papers' messages only: no moment messages for Gelbrich's lower bound (they would give the server the
    # exact mean and covariance besides; the attack does not read them)
    if protocol == "fedbary":
        config: FedWaDConfig = FedBaryConfig(support_size=s, iterations=iterations, t=t, lower_bound=False)
    else:
        config = FedWaDConfig(support_size=s, iterations=iterations, t=t, interpolation=interpolation,
                              record_history=per_round_distances, lower_bound=False,
                              max_support=EXACT_SUPPORT_CAP * n if interpolation == "exact" else None)
    try:
        res, secs = timed(attack_protocol, protocol, target, [partner], non_members, config, seed=seed,
                          validation=validation, threshold=threshold)
    except SupportGrowthError as exc:  # exact interpolation past its cap: report, don't hang
        return row | dict(t_methods="", t_error=np.nan, points=0, recovered_fraction=np.nan,
                          non_member_fraction=np.nan, precise_fraction=np.nan, median_error=np.nan,
                          membership_auc=np.nan, label_ari=np.nan, classes_matched=-1, seconds=np.nan, note=str(exc))
    sc = res.scores
    return row | dict(t_methods=res.t_methods, t_error=res.t_error, points=res.points,
                      recovered_fraction=sc.recovered_fraction, non_member_fraction=sc.non_member_fraction,
                      precise_fraction=sc.precise_fraction, median_error=sc.median_error,
                      membership_auc=sc.membership_auc, label_ari=res.label_ari, classes_matched=res.classes_matched,
                      seconds=secs, note="")


def privacy_dp(federation: str, target: LabelledData, partner: LabelledData, non_members: np.ndarray,
               support: int | str, t: float | str, iterations: int, epsilon: float, delta: float, clip_radius: float,
               accountant: str, threshold: float, seed: int, repeat: int,
               meaningful_epsilon: float = 10.0) -> dict[str, Any]:
    """One DP cell: FedWaD between ``target`` and ``partner`` with both clients (ε, δ)-DP
    (:class:`~otfed.privacy.dp.DPWassersteinClient`, records clipped to B(0, ``clip_radius``)), attacked like
    :func:`privacy_attack`; next to it the exact W2 (POT network simplex) and the non-DP FedWaD estimate of the
    same session (same seed: same ξ⁰ and t's). One row: the setting; guarantee (:func:`guarantee_label`);
    epsilon_spent (the accountant's ε of the target's releases), noise_multiplier, releases, clipped_fraction (target
    rows outside the ball); estimate, exact_w2, fedwad_estimate, rel_error and fedwad_rel_error (|· − W2| / W2); the
    per-round attack's scores; the round-averaged attack's (averaged_*) and the likelihood-ratio AUCs (lr_*,
    :func:`~otfed.privacy.attack.dp_attack`); seconds."""
    x = np.asarray(target.x, dtype=np.float64)
    n = x.shape[0]
    s = _support_size(support, n)
    config = FedWaDConfig(support_size=s, iterations=iterations, t=t, lower_bound=False)  # Algorithm 1's messages
    exact = wasserstein(x, partner.x, p=2)
    plain = federated_wasserstein(x, partner.x, config, seed=seed).estimate
    dp = DPConfig(epsilon=epsilon, delta=delta, clip_radius=clip_radius, accountant=accountant)
    res, secs = timed(dp_attack, x, partner.x, non_members, config, dp, seed=seed, threshold=threshold,
                      names=(target.name, partner.name))
    sc, av = res.baseline, res.averaged
    return dict(federation=federation, target=target.name, partner=partner.name, n=n, support=str(support), S=s,
                t=str(t), iterations=iterations, epsilon=float(epsilon), delta=delta, repeat=repeat,
                guarantee=guarantee_label(epsilon, meaningful_epsilon),
                epsilon_spent=res.epsilon, noise_multiplier=res.noise_multiplier, releases=res.releases,
                clip_radius=clip_radius, clipped_fraction=float(np.mean(np.linalg.norm(x, axis=1) > clip_radius)),
                estimate=res.estimate, exact_w2=exact, fedwad_estimate=plain,
                rel_error=abs(res.estimate - exact) / exact,
                fedwad_rel_error=abs(plain - exact) / exact, t_methods=res.t_methods, points=res.points,
                recovered_fraction=sc.recovered_fraction, non_member_fraction=sc.non_member_fraction,
                precise_fraction=sc.precise_fraction, median_error=sc.median_error, membership_auc=sc.membership_auc,
                averaged_recovered_fraction=av.recovered_fraction, averaged_non_member_fraction=av.non_member_fraction,
                averaged_membership_auc=av.membership_auc, lr_membership_auc=res.lr_auc,
                lr_rounds_membership_auc=res.lr_rounds_auc, seconds=secs)


def max_advantage(noise_multiplier: float, releases: int) -> float:
    """The largest membership advantage TPR − FPR of any test on ``releases`` Gaussian releases of multiplier
    ``noise_multiplier``: their composition is μ-GDP with μ = √releases / σ_mult (Dong, Roth & Su 2022, "Gaussian
    differential privacy"), whose trade-off curve allows at most 2Φ(μ/2) − 1 = erf(μ/(2√2)); 1 without noise."""
    if noise_multiplier <= 0:
        return 1.0
    return math.erf(math.sqrt(releases) / noise_multiplier / (2.0 * math.sqrt(2.0)))


def guarantee_label(epsilon: float, meaningful: float) -> str:
    """``"formal"`` for ε ≤ ``meaningful`` (:attr:`PrivacyDPParams.meaningful_epsilon`), else ``"no formal
    guarantee"`` (∞: no noise at all)."""
    return "formal" if epsilon <= meaningful else "no formal guarantee"


def audit_time(dp: PrivacyDPParams) -> float:
    """The fixed t of the audits: the first fixed t of ``dp.times`` (public: the strongest attacker), else 0.5."""
    return next((float(t) for t in dp.times if t != "random"), 0.5)


def privacy_dp_audit(federation: str, target: LabelledData, partner: LabelledData, non_members: np.ndarray,
                     t: float, iterations: int, epsilon: float, delta: float, clip_radius: float, accountant: str,
                     splits: int, canaries: int, canary_sessions: int, threshold: float, seed: int) -> dict[str, Any]:
    """The DP FedWaD client audited at one ε by the strongest attacks of :mod:`otfed.privacy.attack`, fixed public
    t, S = the client's size: membership over ``splits`` member / non-member splits of the target's rows ∪
    ``non_members`` (:func:`~otfed.privacy.attack.membership_splits`: per split a session of n = the target's size
    members, mean AUC and 95% interval for the per-round nearest-point, round-averaged and likelihood-ratio
    scores, and the round average's recovered fractions) and ``canaries`` clip-radius canaries per session over
    ``canary_sessions`` sessions (:func:`~otfed.privacy.attack.canary_audit`: likelihood-ratio AUC, mean and 95%
    interval). One row; NaN where a part is off (0)."""
    x = np.asarray(target.x, dtype=np.float64)
    n = x.shape[0]
    dp = DPConfig(epsilon=epsilon, delta=delta, clip_radius=clip_radius, accountant=accountant)
    row: dict[str, Any] = dict(federation=federation, target=target.name, partner=partner.name, n=n, t=t,
                               iterations=iterations, epsilon=float(epsilon), delta=delta, splits=splits,
                               canaries=canaries, canary_sessions=canary_sessions if canaries else 0)
    config = FedWaDConfig(support_size=n, iterations=iterations, t=t, lower_bound=False)
    secs = 0.0
    if splits:
        pool = np.vstack([x, np.asarray(non_members, dtype=np.float64)])
        res, secs = timed(membership_splits, pool, partner.x, n, config, dp, splits=splits, seed=seed,
                          threshold=threshold)
        for score in ("nearest", "averaged", "lr"):
            mean, low, high = res.interval(score)
            row |= {f"{score}_auc": mean, f"{score}_auc_low": low, f"{score}_auc_high": high}
        row |= dict(averaged_recovered=float(res.averaged_recovered.mean()),
                    averaged_non_member=float(res.averaged_non_member.mean()))
    else:
        row |= {f"{s}_auc{e}": np.nan for s in ("nearest", "averaged", "lr") for e in ("", "_low", "_high")}
        row |= dict(averaged_recovered=np.nan, averaged_non_member=np.nan)
    if canaries:
        audit, more = timed(canary_audit, x, partner.x, config, dp, canaries=canaries, sessions=canary_sessions,
                            seed=seed)
        secs += more
        mean, low, high = audit.interval("lr")
        row |= dict(canary_auc=mean, canary_auc_low=low, canary_auc_high=high)
    else:
        row |= dict(canary_auc=np.nan, canary_auc_low=np.nan, canary_auc_high=np.nan)
    return row | dict(seconds=secs)


AUDIT_SCORES = ("nearest", "averaged", "lr", "canary")


def simultaneous_audit_intervals(audit: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """``audit`` (:func:`privacy_dp_audit` rows) with every AUC interval also widened to hold simultaneously with
    all the others of the table (:func:`~otfed.metrics.bonferroni_interval`; family = the finite intervals:
    targets × ε × scores): columns ``<score>_auc_low_simultaneous`` / ``..._high_simultaneous``, and
    ``simultaneous_family``, cut to [0, 1]. Membership scores have splits − 1 degrees of freedom, the canaries
    sessions − 1."""
    audit = audit.copy()
    family = int(sum(np.isfinite(audit[f"{s}_auc_low"]).sum() for s in AUDIT_SCORES))
    for score in AUDIT_SCORES:
        dof = (audit.canary_sessions if score == "canary" else audit.splits).to_numpy(dtype=np.float64) - 1.0
        dof[dof < 1] = np.nan  # a part that was off: its interval is NaN already
        low, high = bonferroni_interval(audit[f"{score}_auc"], audit[f"{score}_auc_low"], audit[f"{score}_auc_high"],
                                        dof, max(family, 1), level)
        # an AUC lies in [0, 1]: the interval is cut to it
        audit[f"{score}_auc_low_simultaneous"] = np.clip(low, 0.0, 1.0)
        audit[f"{score}_auc_high_simultaneous"] = np.clip(high, 0.0, 1.0)
    audit["simultaneous_family"] = family
    return audit


def privacy_dp_fedbary(federation: str, target: LabelledData, partner: LabelledData, non_members: np.ndarray,
                       validation: LabelledData, support: int | str, iterations: int, epsilon: float, delta: float,
                       clip_radius: float, accountant: str, threshold: float, seed: int, repeat: int) -> dict[str, Any]:
    """One DP FedBary cell: FedBary between ``target`` and ``partner`` with Q the server's ``validation`` set
    and every client (ε, δ)-DP (:class:`~otfed.privacy.dp_fedbary.DPBaryClient`, label-augmented records clipped
    to B(0, ``clip_radius``); t random), attacked like :func:`privacy_attack`. One row: the setting; epsilon_spent,
    noise_multiplier, releases; the target's distance estimate; the attack's scores; seconds."""
    n = int(np.asarray(target.x).shape[0])
    s = _support_size(support, n)
    config = FedBaryConfig(support_size=s, iterations=iterations, lower_bound=False)
    dp = DPConfig(epsilon=epsilon, delta=delta, clip_radius=clip_radius, accountant=accountant)
    res, secs = timed(attack_protocol, "fedbary", target, [partner], non_members, config, seed=seed,
                      validation=validation, threshold=threshold, dp=dp)
    sc = res.scores
    return dict(federation=federation, target=target.name, partner=partner.name, n=n, support=str(support), S=s,
                iterations=iterations, epsilon=float(epsilon), delta=delta, repeat=repeat,
                epsilon_spent=res.epsilon, noise_multiplier=res.noise_multiplier, releases=res.releases,
                clip_radius=clip_radius, estimate=res.estimate, points=res.points,
                recovered_fraction=sc.recovered_fraction, non_member_fraction=sc.non_member_fraction,
                precise_fraction=sc.precise_fraction, median_error=sc.median_error, membership_auc=sc.membership_auc,
                label_ari=res.label_ari, seconds=secs)


def privacy_dp_clustering(federation: str, clients: list[LabelledData], groups: np.ndarray, epsilon: float,
                          delta: float, clip_radius: float, config: FedWaDConfig, accountant: str,
                          seed: int) -> dict[str, Any]:
    """Pairwise DP FedWaD between ``clients`` (one session per pair, per-pair seeds as the clustering jobs; each
    client's (ε, δ) covers its n − 1 sessions), the matrix the server would cluster. Returns federation,
    epsilon, names, groups, distances (the matrix), noise_multiplier, releases (per client, all sessions),
    epsilon_spent (the accountant's ε for them) and seconds."""
    m = len(clients)
    dp = DPConfig(epsilon=epsilon, delta=delta, clip_radius=clip_radius, sessions=m - 1, accountant=accountant)
    pairs = client_pairs(m)
    values, secs = timed(lambda: [dp_federated_wasserstein(clients[i].x, clients[j].x, config, dp,
                                                           seed=pair_seed(seed, i, j),
                                                           names=(clients[i].name, clients[j].name)).estimate
                                  for i, j in pairs])
    sigma = dp.noise_multiplier(config)
    return dict(federation=federation, epsilon=float(epsilon), names=[c.name for c in clients],
                groups=np.asarray(groups), distances=distance_matrix(m, pairs, values), noise_multiplier=sigma,
                releases=dp.releases(config),
                epsilon_spent=gaussian_epsilon(sigma, dp.releases(config), delta, accountant),
                seconds=secs)


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
    # the study measures each estimate's error against the exact W itself: no lower bound (Algorithm 1's messages
    # only, timed as the paper times them) and no warning that a small S is loose — that is what it shows
    variants = [("fedwad_approx", FedWaDConfig(support_size=s, iterations=iterations, interpolation="approx",
                                               solver=solver, lower_bound=False)) for s in supports]
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
                          solver="network_simplex", record_history=True, lower_bound=False)  # error measured here
    result = federated_wasserstein(x_mu, x_nu, config, seed=seed)
    label = f"{interpolation}, S={support}, t={'random' if t is None else t}"
    final = abs(result.estimate - exact) / exact  # the estimate d(μ,ξ^K) + d(ξ^K,ν), not the bound A^K
    return [dict(dim=dim, n=n, support=support, interpolation=interpolation,
                 t="random" if t is None else t, setting=label, iteration=k + 1, A=a, exact=exact,
                 rel_gap=(a - exact) / exact, estimate_rel_error=final)
            for k, a in enumerate(result.history)]


def otdd_pair(a: LabelledData, b: LabelledData, config: FedWaDConfig, seed: int,
              diagonal: bool = True) -> dict[str, Any]:
    """Federated OTDD (FedWaD on augmented samples) next to the exact OTDD on the same samples (fig. 6): the
    estimate (an upper bound, FedWaD eq. 6), ``lower`` (Gelbrich's bound from the clients' moments when
    ``config.lower_bound``, else NaN; :func:`~otfed.federation.otdd.federated_otdd`) and the exact OTDD between."""
    fed, t_fed = timed(federated_otdd, a, b, config, seed=seed, diagonal=diagonal)
    exact, t_exact = timed(otdd_exact, a.x, a.y, b.x, b.y, diagonal=diagonal)
    return dict(a=a.name, b=b.name, federated=fed.estimate, lower=np.nan if fed.lower is None else fed.lower,
                exact=exact, seconds_federated=t_fed, seconds_exact=t_exact, bytes=fed.ledger.total_bytes,
                messages=len(fed.ledger.entries))


def clustering_names(cfg: ClusteringParams) -> list[str]:
    """The clusterings clustered FL can train within: ``global``, ``planted``, ``affinity``, ``knn<k>``."""
    return ["global", "planted", "affinity"] + [f"knn{k}" for k in cfg.neighbors]


def clustering_sessions(p: Params, results: Results) -> list[tuple[str, Roster, list[FedWaDResult]]]:
    """Per clustering federation: its name, its roster (:func:`roster`: read again from ``data/partitions``, the
    file its jobs read — the client names, planted groups and held-out splits) and the federated OTDD results of
    its client pairs (``("pair", federation, a, b)``, in :func:`~otfed.federation.otdd.client_pairs` order)."""
    fd = p.fed_distance
    return [(name, roster(name, fd.clustering.diagonal), results.of("pair", name))
            for name in fd.clustering.federations]


def rows_of(results: Results, kind: str) -> list[dict[str, Any]]:
    """The table rows of every job of ``kind`` (each returns a list of rows), in job order."""
    return [row for rows in results.of(kind) for row in rows]


def cluster_labels(cfg: ClusteringParams, r: Roster, distances: np.ndarray,
                   seed: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """A federation's clustering scores and labels (:func:`clustering_scores`) from its federated-OTDD
    matrix, with at most as many clusters as planted groups and clients."""
    n_clusters = min(cfg.n_clusters, len(np.unique(r.groups)), len(r.clients))
    return clustering_scores(distances, r.groups, max(n_clusters, 2), cfg.neighbors, seed)


def followups(p: Params, results: Results) -> list[Job]:
    """Clustered FL: one job per (clustering federation, clustering, algorithm, seed) (key ``("clustered_fl",
    federation, clustering, algorithm, seed)``), with the clusters spectral clustering finds on the federated
    OTDDs of the first jobs (the server's only input: the distance matrix) — or one global cluster, or the
    planted groups."""
    fd, seed = p.fed_distance, p.run.seed
    fl = fd.clustered_fl
    if fl is None:
        return []
    device = stage_device(p.run.device)
    out = []
    for name, r, pair_results in clustering_sessions(p, results):
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
                        clusters=sets[clustering], config=fl.fl, n_classes=n_classes, seed=s, device=device),
                        key=("clustered_fl", name, clustering, algorithm, s)))
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
def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Toy tables and figures, OTDD pairs and heatmaps, clustering matrices and ARIs, the communication
    ledger and the degenerate clients; nested runs per toy method × support, for OTDD and per federation.

    Each kind of result is read by its key (module docstring); each federation's roster (client names, planted
    groups, degenerate clients) is read again from ``data/partitions``, the files the jobs read.
    """
    fd, seed = p.fed_distance, p.run.seed
    metrics: dict[str, Any] = {"toy": toy_metrics(pd.DataFrame(rows_of(results, "toy")),
                                                  pd.DataFrame(rows_of(results, "convergence")), out)}
    otdd = roster(fd.otdd.federation, fd.otdd.diagonal)
    metrics["otdd"] = otdd_metrics(fd.otdd, otdd, results.of("otdd"), out)
    clustering = clustering_sessions(p, results)
    degenerate = list(otdd.degenerate) + [row for _, r, _ in clustering for row in r.degenerate]
    metrics["clustering"] = clustering_metrics(fd.clustering, clustering, seed, out)
    fl_rows = pd.DataFrame(rows_of(results, "clustered_fl"))
    fl_summary = clustered_fl_summary(fl_rows) if len(fl_rows) else None
    if fd.clustered_fl is not None:
        metrics["clustered_fl"] = clustered_fl_metrics(fl_rows, fl_summary, out)
    if fd.coresets is not None:
        metrics["coresets"] = coreset_metrics(rows_of(results, "coreset"), fl_summary, out)
    if fd.privacy is not None:
        metrics["privacy"] = privacy_metrics(p, results.of("attack"), results.of("dp"), results.of("dp_fedbary"),
                                             results.of("dp_clustering"), out, results.of("dp_audit"))
    out.table(pd.DataFrame(degenerate, columns=["federation", "client", "reason"]), "degenerate_clients.csv")
    metrics["degenerate_clients"] = len(degenerate)
    return metrics


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


# ------------------------------------------------------------------------------------------ privacy report
# the papers' statements the privacy tables test, verbatim (the PDF extraction's garbled math restated)
PRIVACY_QUOTES = {
    "random_t": ("FedWaD §3", "… are not unique, thus clients can compute these interpolating measures based on a "
                 "random value of t."),
    "last_distance": ("FedWaD §3", "Besides, since communicating the distance may reveal information about the "
                      "data, they can be shared with the server only for the last iteration."),
    "dp": ("FedWaD §3", "More effectively, one can incorporate an (adapted) differentially private version of the "
           "Wasserstein distance (Lê Tien et al., 2019)."),
    "fedbary": ("FedBary §4.4, Privacy Guarantee", "In our setting, privacy is guaranteed from two aspects: (1) Raw "
                "training samples cannot be reconstructed. (2) Generating data with similar appearance is not "
                "feasible. […] Secondly, hyperparameter t for approximating the interpolating measure, the OT "
                "plan between X̃_i and γ_i, and OT plan between η_Q_i and η_P_i are only known to the client i "
                "himself."),
}
ATTACK_KEYS = ["protocol", "interpolation", "support", "t", "iterations", "distances", "validation"]
DP_KEYS = ["support", "t", "epsilon"]
ROUNDING = 1e-9  # t_error, median_error below this are floating-point rounding (digits differ between CPUs): 0


def without_rounding_noise(frame: pd.DataFrame, columns: tuple[str, ...] = ("t_error", "median_error")) -> pd.DataFrame:
    """``frame`` with the ``columns``' values below :data:`ROUNDING` set to 0 — exact recoveries differ from the
    truth by ~1e-15 in digits no CPU reproduces; the committed tables keep the same bytes everywhere."""
    return frame.assign(**{c: frame[c].mask(frame[c].abs() < ROUNDING, 0.0) for c in columns if c in frame})


def privacy_attack_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per attack cell (:data:`ATTACK_KEYS`, grid order): means over pairs and seeds of recovered, non_member,
    precise, median_error, auc and label_ari; the largest t_error, the fewest classes matched, the estimators."""
    return rows.groupby(ATTACK_KEYS, sort=False, as_index=False).agg(
        runs=("repeat", "size"), recovered=("recovered_fraction", "mean"), non_member=("non_member_fraction", "mean"),
        precise=("precise_fraction", "mean"), median_error=("median_error", "mean"), auc=("membership_auc", "mean"),
        label_ari=("label_ari", "mean"), classes_matched=("classes_matched", "min"), t_error=("t_error", "max"),
        t_methods=("t_methods", lambda s: "/".join(sorted(set(s)))))


def privacy_dp_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DP cell (:data:`DP_KEYS`, grid order): the guarantee label, the largest ε spent, σ_mult, releases; means
    over pairs and seeds of the DP and non-DP relative errors, the per-round attack's recovered, non_member and
    auc, the round-averaged attack's (avg_recovered, avg_non_member, avg_auc), the likelihood-ratio AUC (lr_auc)
    and the clipped fraction."""
    extra = {}
    if "averaged_recovered_fraction" in rows:
        extra = dict(avg_recovered=("averaged_recovered_fraction", "mean"),
                     avg_non_member=("averaged_non_member_fraction", "mean"),
                     avg_auc=("averaged_membership_auc", "mean"), lr_auc=("lr_membership_auc", "mean"))
    guarantee = {"guarantee": ("guarantee", "first")} if "guarantee" in rows else {}
    return rows.groupby(DP_KEYS, sort=False, as_index=False).agg(
        **guarantee, runs=("repeat", "size"), epsilon_spent=("epsilon_spent", "max"),
        noise_multiplier=("noise_multiplier", "mean"), releases=("releases", "max"), rel_error=("rel_error", "mean"),
        fedwad_rel_error=("fedwad_rel_error", "mean"), recovered=("recovered_fraction", "mean"),
        non_member=("non_member_fraction", "mean"), auc=("membership_auc", "mean"), **extra,
        clipped_fraction=("clipped_fraction", "mean"))


def at_baseline(sub: pd.DataFrame) -> int:
    """How many of ``sub``'s rows (one DP setting, sorted by ε) lead the grid with the attack recovering no more
    of the target's samples than of its non-members — the per-round attack and, where the rows have it, the
    round-averaged one (``avg_recovered``, ``avg_non_member``): the baseline ε is row k − 1 (none when 0)."""
    below = (sub.recovered <= sub.non_member).to_numpy()
    if "avg_recovered" in sub:
        below = below & (sub.avg_recovered <= sub.avg_non_member).to_numpy()
    return int(np.argmin(below)) if not below.all() else len(below)


def dp_baselines(summary: pd.DataFrame) -> pd.DataFrame:
    """Per DP setting (S, t): the largest ε of the grid up to which the attack recovers no more of the target's
    samples than of its non-members (every smaller ε too; NaN when even the smallest leaks), the DP estimate's
    relative error there, the non-DP FedWaD error and the recovered fraction at the largest ε."""
    out = []
    for (support, t), sub in summary.groupby(["support", "t"], sort=False):
        sub = sub.sort_values("epsilon", kind="stable")
        k = at_baseline(sub)
        out.append(dict(support=support, t=t, baseline_epsilon=float(sub.epsilon.iloc[k - 1]) if k else np.nan,
                        rel_error_at_baseline=float(sub.rel_error.iloc[k - 1]) if k else np.nan,
                        fedwad_rel_error=float(sub.fedwad_rel_error.mean()),
                        recovered_at_largest_epsilon=float(sub.recovered.iloc[-1])))
    return pd.DataFrame(out)


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:.0f}%"


def _num(x: float) -> str:
    return "n/a" if x != x else ("∞" if x == math.inf else f"{x:.3g}")


def _cell(summary: pd.DataFrame, **match: Any) -> pd.Series | None:
    """The one summary row whose columns equal ``match`` (None when the grid has no such cell)."""
    sel = summary
    for key, value in match.items():
        sel = sel[sel[key] == value]
    return None if sel.empty else sel.iloc[0]


def _defended(summary: pd.DataFrame, protocol: str, support: str, t: str, k: int,
              validation: bool = False) -> pd.Series | None:
    """The cell under the papers' defences: approximate interpolation, distances only at the end (FedBary:
    the d_i it sends every round by protocol), K = ``k``."""
    return _cell(summary, protocol=protocol, interpolation="approx", support=support, t=t, iterations=k,
                 distances="every round" if protocol == "fedbary" else "last", validation=validation)


def attack_findings(summary: pd.DataFrame) -> list[str]:
    """What the attack table says about FedWaD §3's random t and last-iteration distances and FedBary §4.4's
    claim, in plain sentences computed from the summary (:func:`privacy_attack_summary`)."""
    k, k1 = int(summary.iterations.max()), int(summary.iterations.min())
    fixed = next((t for t in dict.fromkeys(summary.t) if t != "random"), None)
    names = {"fedwad": "FedWaD", "otdd": "federated OTDD", "fedbary": "FedBary"}
    lines = []
    parts, verdicts = [], []
    for protocol in dict.fromkeys(summary.protocol):
        rand = _defended(summary, protocol, "n", "random", k)
        fix = _defended(summary, protocol, "n", fixed, k) if fixed else None
        if rand is None:
            continue
        error = f"below {ROUNDING:g}" if rand.t_error < ROUNDING else _num(rand.t_error)
        parts.append(f"{names[protocol]} {_pct(rand.recovered)} with a random t (the attacker's t from "
                     f"{rand.t_methods}, largest error {error})"
                     + (f" and {_pct(fix.recovered)} with t = {fixed} (public)" if fix is not None else ""))
        if fix is not None:
            verdicts.append(rand.recovered >= fix.recovered - 0.05)
    if parts:
        verdict = ("a random t does not reduce what the server recovers: it estimates t from the messages"
                   if verdicts and all(verdicts) else
                   "a random t reduces what the server recovers in some protocols (compare the rows)")
        lines.append(f"**Random t (FedWaD §3).** With S = n (the target's sample count), K = {k} and distances only "
                     f"at the end, the server recovered: {'; '.join(parts)}. Measured: {verdict}.")
    one = _defended(summary, "fedwad", "n", "random", k1)
    if one is not None and k1 == 1 and k1 != k:
        lines.append("With a single iteration (K = 1) there are no two rounds whose means would give t; FedWaD's "
                     f"random t then came from {one.t_methods} (the final distance) and {_pct(one.recovered)} of the "
                     "samples were recovered at S = n.")
    small = [r for s in dict.fromkeys(summary.support) if s != "n"
             for r in [_defended(summary, "fedwad", s, "random", k)] if r is not None]
    if small:
        lines.append("With S < n the messages carry S transport-cell means per round, not samples: FedWaD "
                     + ", ".join(f"S = {r.support}: {_pct(r.recovered)} recovered (membership AUC {_num(r.auc)})"
                                 for r in small) + ".")
    pairs = summary[summary.protocol != "fedbary"]
    keys = [c for c in ATTACK_KEYS if c != "distances"]
    wide = pairs.pivot_table(index=keys, columns="distances", values="recovered", sort=False)
    if {"last", "every round"} <= set(wide.columns):
        gap = (wide["every round"] - wide["last"]).abs()
        worst = dict(zip(keys, gap.idxmax())) if gap.notna().any() and gap.max() > 0 else None
        at = (f" (largest: {worst['protocol']}, {worst['interpolation']}, S = {worst['support']}, t {worst['t']}, "
              f"K = {worst['iterations']})" if worst else "")
        gain = float((wide["every round"] - wide["last"]).max())
        verdict = ("keeping the distances to the last iteration does not reduce what the server recovers: the "
                   "interpolants' means give t (K ≥ 2), a fixed t is public, and with K = 1 the final distance "
                   "gives t" if gain <= 0.05 else
                   f"per-round distances raise the recovered fraction by up to {_num(gain)}: the defence helps there")
        lines.append("**Distances only at the last iteration (FedWaD §3).** Sending W(μ, ξ_μ^k) every round "
                     f"changed the recovered fraction by at most {_num(float(gap.max()))}{at} over the FedWaD and OTDD "
                     f"cells. Measured: {verdict}.")
    bary = [(label, r) for label, r in [
        ("Q the federated barycenter, random t", _defended(summary, "fedbary", "n", "random", k)),
        ("Q the server's validation set, random t", _defended(summary, "fedbary", "n", "random", k, True)),
        (f"t = {fixed} (public)", _defended(summary, "fedbary", "n", fixed, k) if fixed else None)] if r is not None]
    if bary:
        best = summary[summary.protocol == "fedbary"].recovered.max()
        claim = ("refuted in this setting: the server reconstructs raw training samples from FedBary's messages"
                 if best >= 0.5 else f"not refuted by this attack: at most {_pct(best)} of the samples recovered")
        lines.append("**FedBary §4.4.** With S = n, K = " + str(k) + ": " + "; ".join(
            f"{label}: {_pct(r.recovered)} recovered (times from {r.t_methods}), label ARI {_num(r.label_ari)}, "
            f"class statistics recovered exactly: {int(r.classes_matched)} (fewest over runs)" for label, r in bary)
            + f". Claim (1), \"raw training samples cannot be reconstructed\": {claim} (rule: recovered ≥ 50% "
            "in some cell).")
    return lines


def dp_findings(summary: pd.DataFrame, baselines: pd.DataFrame, clustering: pd.DataFrame | None,
                rows: pd.DataFrame, fedbary: pd.DataFrame | None = None, meaningful: float = 10.0,
                audit: pd.DataFrame | None = None) -> list[str]:
    """What the DP table says: which ε carry a formal guarantee (≤ ``meaningful``); per setting where the
    per-round and the round-averaged attacks fall to the non-member baseline and the error there; what the
    strongest attacks find above the threshold (no formal guarantee); the membership audit over splits and the
    clip-radius canaries (``audit``, :func:`privacy_dp_audit` rows); the ε the accountant says was spent; the
    clustering ARI; the attack on DP FedBary (``fedbary``: rows support, epsilon, recovered, non_member) and where
    its detection cost is measured."""
    lines = []
    c, q = float(rows.clip_radius.iloc[0]), float(rows.clipped_fraction.mean())
    lines.append(f"Both clients DP (replace-one (ε, δ) per client, δ = {_num(float(rows.delta.iloc[0]))}); clip "
                 f"radius C = {c:.4g} from the server's public test rows; {100 * q:.1f}% of the targets' rows clipped.")
    per_eps = summary.groupby("epsilon", sort=True).agg(z=("noise_multiplier", "max"), r=("releases", "max"))
    bounds = ", ".join(f"ε = {_num(e)}: {max_advantage(r.z, int(r.r)):.6g}" for e, r in per_eps.iterrows()
                       if np.isfinite(e))
    lines.append(f"Formal guarantee: ε ≤ {_num(meaningful)}; every row with a larger ε (and ∞, no noise) is labelled "
                 "\"no formal guarantee\". The largest membership advantage (TPR − FPR) any attack can reach on a "
                 "client's releases, erf(μ/(2√2)) with μ = √releases / σ_mult (μ-GDP, Dong, Roth & Su 2022): "
                 f"{bounds}.")
    for b in baselines.itertuples():
        sub = summary[(summary.support == b.support) & (summary.t == b.t)].sort_values("epsilon", kind="stable")
        formal = sub[sub.epsilon <= meaningful]
        k = at_baseline(formal) if len(formal) else 0
        where = (f"at every formally guaranteed ε (≤ {_num(meaningful)})" if len(formal) and k == len(formal) else
                 f"at every ε ≤ {_num(float(formal.epsilon.iloc[k - 1]))}" if k else "at no ε of the grid")
        attacks = "neither the per-round nor the round-averaged attack" if "avg_recovered" in sub else "the attack"
        line = (f"S = {b.support}, t = {b.t}: {attacks} recovers more of the target's samples than of its "
                f"non-members {where}; the DP estimate's relative error vs the exact W2 is "
                f"{_num(float(formal.rel_error.iloc[k - 1])) if k else 'n/a'} there (non-DP FedWaD: "
                f"{_num(b.fedwad_rel_error)}).")
        loose = sub[sub.epsilon > meaningful]
        if len(loose) and "avg_recovered" in loose:
            line += (" No formal guarantee: " + ", ".join(
                f"ε = {_num(r.epsilon)}: {_pct(r.recovered)} / {_pct(r.avg_recovered)} recovered per-round / "
                f"round-averaged (non-members {_pct(r.avg_non_member)}), AUC {_num(r.auc)} / {_num(r.avg_auc)}"
                for r in loose.itertuples()) + ".")
        lines.append(line)
    if audit is not None and len(audit):
        family = int(audit.simultaneous_family.iloc[0])
        for target, sub in audit.groupby("target", sort=False):
            parts = []
            for r in sub.itertuples():
                label = "formal" if r.epsilon <= meaningful else "no formal guarantee"
                parts.append(f"ε = {_num(r.epsilon)} ({label}): membership AUC {_num(r.averaged_auc)} "
                             f"[{_num(r.averaged_auc_low_simultaneous)}, {_num(r.averaged_auc_high_simultaneous)}], "
                             f"canaries {_num(r.canary_auc)} [{_num(r.canary_auc_low_simultaneous)}, "
                             f"{_num(r.canary_auc_high_simultaneous)}]")
            first = sub.iloc[0]
            lines.append(f"The strongest attacks on {target} (n = {int(first.n)}), S = n, t = {_num(float(first.t))} "
                         f"(public), mean and simultaneous 95% interval (Bonferroni over the table's {family} "
                         f"intervals) over {int(first.splits)} member / non-member splits (round-averaged score) and "
                         f"over {int(first.canary_sessions)} sessions of {int(first.canaries)} clip-radius canaries "
                         "(likelihood-ratio score; privacy_dp_audit.csv, which also has the uncorrected 95% "
                         "intervals): " + "; ".join(parts) + ".")
        formal = audit[audit.epsilon <= meaningful]
        above = [f"{r.target} {score} at ε = {_num(r.epsilon)}" for r in formal.itertuples()
                 for score in AUDIT_SCORES if getattr(r, f"{score}_auc_low_simultaneous") > 0.5]
        lines.append(f"At the formally guaranteed ε (≤ {_num(meaningful)}), simultaneous intervals above chance "
                     f"(0.5): {', '.join(above) if above else 'none'} — of {len(formal) * len(AUDIT_SCORES)} "
                     "(target, ε, score) cells.")
    finite = rows[np.isfinite(rows.epsilon)]
    if len(finite):
        ratio = float((finite.epsilon_spent / finite.epsilon).max())
        lines.append(f"ε spent (dp-accounting, over the session's K + 1 releases) / target ε: at most {ratio:.6f} "
                     "(the budget holds).")
    if clustering is not None and len(clustering):
        aff = clustering[clustering.method == "affinity"]
        lines.append(f"Clustering (FedWaD §5): pairwise DP FedWaD between {int(aff.clients.iloc[0])} clients → "
                     "spectral clustering (affinity), ARI vs the planted groups: "
                     + ", ".join(f"ε = {_num(r.epsilon)}: {_num(r.ari)}" for r in aff.itertuples()) + ".")
    if fedbary is not None and len(fedbary):
        for support, sub in fedbary.groupby("support", sort=False):
            sub = sub.sort_values("epsilon", kind="stable")
            lines.append(f"FedBary, every client DP (otfed.privacy.dp_fedbary; Q the server's validation set, t "
                         f"random), S = {support}: recovered (non-members) per ε — "
                         + ", ".join(f"{_num(r.epsilon)}{'' if r.epsilon <= meaningful else ' (no formal guarantee)'}: "
                                     f"{_pct(r.recovered)} ({_pct(r.non_member)})"
                                     for r in sub.itertuples()) + " (privacy_dp_fedbary.csv).")
    lines.append("FedBary's noisy-data detection AUC vs ε with every client DP: stage barycenter_valuation, "
                 "reports/valuation/privacy_dp_detection_summary.md — read it at the formally guaranteed ε only.")
    return lines


def write_privacy_markdown(out: Report, name: str, title: str, quotes: list[str], findings: list[str],
                           setting: str, table: pd.DataFrame) -> None:
    """``name`` (Markdown): the papers' statements, what the measurement says, the setting and the table (the
    committed digits, :func:`committed_table`) — written into the reports folder and logged."""
    text = [f"# {title}", "", "The papers' statements tested here:", ""]
    for key in quotes:
        ref, quote = PRIVACY_QUOTES[key]
        text += [f"> “{quote}” — {ref}", ""]
    text += ["What the measurement says:", ""] + [f"- {line}" for line in findings]
    text += ["", setting, "", io.markdown_table(committed_table(table))]
    out.artifact(io.write_text("\n".join(text), out.out / name))


def privacy_metrics(p: Params, attack_rows: list[dict[str, Any]], dp_rows: list[dict[str, Any]],
                    dp_fedbary_rows: list[dict[str, Any]], clustering: list[dict[str, Any]], out: Report,
                    audit_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The attack and DP tables (``privacy_attack.csv``, ``privacy_dp.csv``, ``privacy_dp_clustering.csv``; their
    Markdown twins carry the papers' statements and what the numbers say), ``privacy.png``, and the metrics:
    per protocol and S the recovered fraction under the papers' defences (random t, distances at the end, the
    largest K; ``fedwad_recovered_paper_defences_S_n`` at S = n), and for the DP setting S = n with a public
    fixed t (the strongest attacker; else the first setting) the largest ε at which the attack is at its
    non-member baseline (``dp_baseline_epsilon``), the DP error there (``dp_rel_error_at_baseline``) and the
    non-DP error; per ε the clustering ARI; per S the largest ε at which the attack on DP FedBary is at its
    baseline (``dp_fedbary_S<S>_baseline_epsilon``; table ``privacy_dp_fedbary.csv``); with ``audit_rows``
    (:func:`privacy_dp_audit`) the table ``privacy_dp_audit.csv`` and per ε ``dp_audit_auc_eps<ε>`` and
    ``dp_canary_auc_eps<ε>`` (nested run ``privacy``)."""
    cfg, fd, seed = p.fed_distance.privacy, p.fed_distance, p.run.seed
    metrics: dict[str, Any] = {}
    attack = without_rounding_noise(pd.DataFrame(attack_rows))
    out.table(attack, "privacy_attack.csv", markdown=False)
    summary = privacy_attack_summary(attack)
    k = int(summary.iterations.max())
    for protocol in dict.fromkeys(summary.protocol):
        for support in dict.fromkeys(summary.support):
            for t in dict.fromkeys(summary.t):
                r = _defended(summary, protocol, support, t, k)
                if r is not None:
                    suffix = "" if t == "random" else f"_t{t}"
                    metrics[f"{protocol}_recovered_S{support}{suffix}"] = float(r.recovered)
    if "fedwad_recovered_Sn" in metrics:
        metrics["fedwad_recovered_paper_defences_S_n"] = metrics["fedwad_recovered_Sn"]
    sizes = attack.groupby("target", sort=False).n.first()
    setting = (f"Setting: federation {cfg.federation}, targets " + ", ".join(f"{c} (n = {n})" for c, n in sizes.items())
               + f"; features: {cfg.pca_components}-component PCA fitted on the server's test split; non-members: "
               f"the target's held-out rows; recovered = within {cfg.threshold} × the target's median nearest-"
               f"neighbour distance of a reconstructed point (non_member: the same for the non-members — the "
               f"baseline); median_error in units of that distance; t_error and median_error below {ROUNDING:g} "
               f"(rounding) written as 0; means over {attack.repeat.nunique()} seed(s) and {len(sizes)} target(s); "
               "one row per run in privacy_attack.csv.")
    write_privacy_markdown(out, "privacy_attack.md", "Honest-but-curious server: reconstruction from FedWaD, "
                           "federated OTDD and FedBary messages", ["random_t", "last_distance", "fedbary"],
                           attack_findings(summary), setting, summary)
    fedbary_summary = None
    if dp_fedbary_rows:
        dp_fedbary = without_rounding_noise(pd.DataFrame(dp_fedbary_rows))
        out.table(dp_fedbary, "privacy_dp_fedbary.csv", markdown=False)
        fedbary_summary = dp_fedbary.groupby(["support", "epsilon"], sort=False, as_index=False).agg(
            runs=("repeat", "size"), epsilon_spent=("epsilon_spent", "max"), releases=("releases", "max"),
            recovered=("recovered_fraction", "mean"), non_member=("non_member_fraction", "mean"),
            auc=("membership_auc", "mean"), label_ari=("label_ari", "mean"))
        out.table(fedbary_summary, "privacy_dp_fedbary_summary.csv")
        for support, sub in fedbary_summary.groupby("support", sort=False):
            sub = sub.sort_values("epsilon", kind="stable")
            k = at_baseline(sub)
            metrics[f"dp_fedbary_S{support}_baseline_epsilon"] = float(sub.epsilon.iloc[k - 1]) if k else np.nan
            metrics[f"dp_fedbary_S{support}_recovered_at_largest_epsilon"] = float(sub.recovered.iloc[-1])
    dp_summary, clustering_table = None, None
    if dp_rows:
        dp = without_rounding_noise(pd.DataFrame(dp_rows))
        out.table(dp, "privacy_dp.csv", markdown=False)
        dp_summary = privacy_dp_summary(dp)
        baselines = dp_baselines(dp_summary)
        head = baselines[(baselines.support == "n") & (baselines.t != "random")]
        head = head if len(head) else baselines
        b = head.iloc[0]
        metrics |= {"dp_baseline_epsilon": float(b.baseline_epsilon),
                    "dp_rel_error_at_baseline": float(b.rel_error_at_baseline),
                    "dp_fedwad_rel_error": float(b.fedwad_rel_error)}
        for r in baselines.itertuples():
            metrics[f"dp_S{r.support}_t{r.t}_baseline_epsilon"] = float(r.baseline_epsilon)
            metrics[f"dp_S{r.support}_t{r.t}_rel_error_at_baseline"] = float(r.rel_error_at_baseline)
        if clustering:
            clustering_table = privacy_clustering_table(fd.clustering, clustering, seed)
            out.table(clustering_table, "privacy_dp_clustering.csv")
            for r in clustering_table[clustering_table.method == "affinity"].itertuples():
                metrics[f"dp_clustering_ari_eps{r.epsilon:g}"] = float(r.ari)
        dp_cfg = cfg.dp
        assert dp_cfg is not None  # dp rows exist
        audit = None
        if audit_rows:
            audit = simultaneous_audit_intervals(pd.DataFrame(audit_rows))
            out.table(audit, "privacy_dp_audit.csv")
            for eps, sub in audit.groupby("epsilon", sort=False):
                metrics[f"dp_audit_auc_eps{eps:g}"] = float(sub.averaged_auc.mean())
                metrics[f"dp_canary_auc_eps{eps:g}"] = float(sub.canary_auc.mean())
        setting = (f"Setting: the attack's federation, targets and scoring; FedWaD with K = {dp_cfg.iterations}, "
                   f"approximate interpolation; C = the {dp_cfg.clip_quantile} quantile of the norms of the server's "
                   f"test rows in the PCA space; accountant {dp_cfg.accountant}; rel_error = |estimate − W2| / W2 "
                   "(W2: exact, POT network simplex); means over seeds and targets; one row per run in "
                   "privacy_dp.csv; the clustering rows in privacy_dp_clustering.csv.")
        write_privacy_markdown(out, "privacy_dp.md", "DP FedWaD: the attack and the distance error vs ε", ["dp"],
                               dp_findings(dp_summary, baselines, clustering_table, dp, fedbary_summary,
                                           dp_cfg.meaningful_epsilon, audit), setting, dp_summary)
    out.figure(figs.privacy_figure(summary, dp_summary, clustering_table, fedbary_summary), "privacy.png")
    with out.variant("privacy", tags={"federation": cfg.federation}) as child:
        child.log_metrics({key: v for key, v in metrics.items() if np.isfinite(v)})
    return metrics


def privacy_clustering_table(cfg: ClusteringParams, results: list[dict[str, Any]], seed: int) -> pd.DataFrame:
    """Per ε: spectral clustering of the DP distance matrix (:func:`clustering_scores`, the clustering group's
    settings) scored by ARI vs the planted groups, with the ε spent, σ_mult and releases per client."""
    rows = []
    for res in results:
        groups = np.asarray(res["groups"])
        n_clusters = max(min(cfg.n_clusters, len(np.unique(groups)), len(groups)), 2)
        scores, _ = clustering_scores(res["distances"], groups, n_clusters, cfg.neighbors, seed)
        rows += [dict(federation=res["federation"], epsilon=res["epsilon"], epsilon_spent=res["epsilon_spent"],
                      noise_multiplier=res["noise_multiplier"], releases=res["releases"], clients=len(groups),
                      seconds=res["seconds"]) | row for row in scores]
    return pd.DataFrame(rows)


STAGE = Stage("fed_distance", FedDistanceParams, OUTPUTS, jobs, report, check, preflight=preflight, inputs=inputs,
              headline=("toy.fedwad_approx_S100_*_rel_error",  # fig. 2: error at the largest S, n = max_n
                        "toy.support_needed_*",  # the S at which the error falls below 5% (n = convergence_n)
                        "toy.convergence_gap_d50_approx_S300_*",  # fig. 3: fixed t = 0.5 stalls, random t not
                        "otdd.mean_rel_error", "otdd.order_preserved",  # fig. 6
                        "clustering.*.affinity",  # tables 1-5: ARI per structure
                        "clustered_fl.*.global_fedavg", "clustered_fl.*.affinity_fedavg_uplift",  # tables 1-5
                        "coresets.*.fedwad_coreset_K10",  # fig. 5 / 12: coreset 1-NN accuracy
                        "privacy.fedwad_recovered_paper_defences_S_n",  # FedWaD §3: random t, distance at the end
                        "privacy.dp_rel_error_at_baseline"),  # DP FedWaD: error where the attack stops working
              followups=followups)
