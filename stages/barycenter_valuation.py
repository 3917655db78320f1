"""Stage ``barycenter_valuation`` — FedBary §5: client contributions, outliers, datum values.

* **contributions** (fig. 4), one job per (federation, seed) (cases 1–5): client contributions (%) by
  FedBary with and without a server validation set, next to the FedAvg-utility games — exact Shapley (all
  2^N coalitions), leave-one-out, Monte-Carlo permutation Shapley and truncated Monte-Carlo Shapley
  (DataSV) — and the FL baselines that value clients from FedAvg's recorded updates (OR, MR, GTG-Shapley),
  with wall times, and their rank agreement with exact Shapley and with the planted noise as mean ± 95% CI
  over the seeds;
* **outlier** (fig. 4 histogram), one job: every client's distance to the federated barycenter when one
  client of 4 + 1 carries feature noise;
* **detection** (fig. 5), one job per (noise kind, rate): datum values (calibrated gradients, eq. 10) from
  FedBary's client-side potentials vs LAVA, KNN-Shapley, leave-one-out (KNN utility) and random —
  precision / recall / F1 of the flags and point-removal curves;
* **duplication** (table 3), one job: a client's whole dataset, or one of its data, duplicated; the exact
  W_2 (POT's network simplex) next to FedBary's estimate.

All jobs form one flat list (contributions, outlier, detection, duplication, privacy — in that order), each
keyed by its kind first (``("contributions", federation, seed)``, ``"outlier"``, ``("detection", kind, rate)``,
``"duplication"``, ``("privacy", kind, seed)``); the report reads each kind's results by key. Score convention
for detection: a *suspicion* per datum, larger = more likely noisy (FedBary / LAVA calibrated gradients as they
are; KNN-Shapley and leave-one-out values negated); a method flags the data with suspicion > 0 (value < 0 for the
Shapley-type methods) and the removal curves drop the most suspicious first.
"""
from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd
from pydantic import Field, field_validator, model_validator
from scipy.stats import spearmanr

from otfed.data.corruption import corrupted_federation, noisy_client_federation
from otfed.data.features import fit_pca, reduce_features
from otfed.data.parties import FeatureProjection, client_sets, server_split
from otfed.data.store import FederationData, load_federation
from otfed.device import stage_device, threads_for
from otfed.federation.fedbary import FedBaryConfig, fedbary_on_measures, federated_valuation
from otfed.figures import valuation as figs
from otfed.fl import FedAvgConfig
from otfed.metrics import mean_confidence_interval
from otfed.ot import Measure
from otfed.ot.otdd import LabelledData, augmented_measure
from otfed.privacy.dp import DPConfig
from otfed.privacy.dp_fedbary import dp_federated_valuation
from otfed.schema import PositiveInt, Strict
from otfed.valuation.baselines import (ExactShapley, KNNShapley, Lava, LeaveOneOut, PermutationShapley,
                                       TruncatedMonteCarloShapley, ValuationData, knn_leave_one_out)
from otfed.valuation.calibrated import datum_values as calibrated_values, flag_noisy
from otfed.valuation.client_games import MemoizedUtility, fedavg_rounds, fedavg_utility, percent_of_total
from otfed.valuation.detection import detection_auc, detection_scores, point_removal_curve
from otfed.valuation.duplication import exact_wasserstein, mass_moved_by_duplication, repeated_dataset, repeated_datum
from otfed.valuation.reconstruction import (accuracy_utility, gtg_shapley, multi_round_reconstruction,
                                            one_round_reconstruction)
from stages import layout
from stages.params import server_split_federation
from stages.stage import Job, Report, Results, Stage, check_memory, timed

if TYPE_CHECKING:
    from stages.params import Params

# the folders this stage writes (declared in stages/layout.py); the first holds its reports and metrics.json
OUTPUTS = (layout.VALUATION_REPORTS,)

CONTRIBUTION_METHODS = ("fedbary_validation", "fedbary_barycenter", "exact_shapley", "leave_one_out",
                        "monte_carlo_shapley", "tmc_shapley", "one_round", "multi_round", "gtg_shapley")
DETECTION_METHODS = ("fedbary", "lava", "knn_shapley", "leave_one_out", "random")


# ------------------------------------------------------------------------------------------ params
class OutlierParams(Strict):
    """4 iid clients + 1 noisy client (fig. 4 histogram): feature noise planted on one client in-stage."""

    federation: str = "case1"
    client: int = Field(4, ge=0, description="Index of the client that gets the noise.")
    fraction: float = Field(0.5, gt=0.0, le=1.0, description="Share of its samples that get feature noise.")
    noise_std: float = Field(1.0, gt=0.0, description="N(0, std²) per pixel, before PCA.")


class GTGParams(Strict):
    """GTG-Shapley's truncations and stopping rule (:func:`otfed.valuation.gtg_shapley`)."""

    eps_between: float | None = Field(0.005, ge=0.0, description="A round whose validation accuracy changes by at "
                                      "most this is skipped (value 0); null: never skip.")
    eps_within: float = Field(0.01, ge=0.0, description="A permutation stops once its prefix is within this of the "
                              "round's full-coalition accuracy.")
    tolerance: float = Field(0.05, ge=0.0, description="Stop a round when the estimates change by less than this "
                             "(relative, mean over clients).")
    max_permutations: int = Field(100, ge=1, le=100000)


class ContributionParams(Strict):
    """Client contributions, cases 1–5: FedBary (with / without validation) vs FedAvg-utility games and the
    gradient-reconstruction FL baselines (OR, MR, GTG-Shapley)."""

    federations: list[str] = Field(["case1", "case2", "case3", "case4", "case5"], min_length=1)
    validation_samples: int = Field(300, ge=10, description="Server validation = the first rows of the test split.")
    monte_carlo_permutations: int = Field(10, ge=1, le=100000, description="Permutations of Monte-Carlo and of "
                                          "truncated Monte-Carlo (DataSV) Shapley.")
    tmc_tolerance: float = Field(0.01, ge=0.0, description="Truncated Monte-Carlo Shapley: a permutation stops once "
                                 "its prefix is within this share of u(N).")
    gtg: GTGParams = GTGParams()
    seeds: int = Field(3, ge=1, le=100, description="Every case is valued with seeds seed … seed+seeds−1 "
                       "(FedBary's draws, FedAvg's initialisation and batches, the Monte-Carlo permutations); "
                       "rank correlations are reported as mean ± 95% CI over them.")
    fedavg: FedAvgConfig = FedAvgConfig()
    outlier: OutlierParams = OutlierParams()


class DetectionParams(Strict):
    """Noisy-datum detection (fig. 5): corruptions planted in-stage on a clean federation."""

    federation: str = "fmnist_clean"
    kinds: list[Literal["label", "feature"]] = Field(["label", "feature"], min_length=1)
    rates: list[float] = Field([0.05, 0.15, 0.30], min_length=1)
    noise_std: float = Field(1.0, gt=0.0, description="Feature-noise std per pixel, before PCA.")
    validation_samples: int = Field(300, ge=10, description="Server validation = first rows of the test split; "
                                    "the rest is the removal-curve holdout.")
    knn_k: int = Field(5, ge=1, description="K of KNN-Shapley and of leave-one-out's KNN utility.")
    removal_step: float = Field(0.05, gt=0.0, lt=1.0)
    removal_max_fraction: float = Field(0.5, gt=0.0, lt=1.0)
    removal_embedding: int = Field(32, ge=0, description="The removal curves' logistic regression runs on a PCA "
                                   "embedding of this size fitted on the server's validation set (0 = the features "
                                   "as valued).")

    @field_validator("rates")
    @classmethod
    def _rates(cls, v: list[float]) -> list[float]:
        if any(not 0.0 < r < 1.0 for r in v):
            raise ValueError("rates must lie in (0, 1)")
        return v

    @model_validator(mode="after")
    def _removal(self) -> "DetectionParams":
        if self.removal_step > self.removal_max_fraction:
            raise ValueError("removal_step must be ≤ removal_max_fraction")
        return self


class DuplicationParams(Strict):
    """Duplication robustness (table 3): one client's whole dataset, or one of its data, duplicated; exact W
    (POT) next to FedBary's estimate. The federation is checked by the stage before any work starts."""

    federation: str = "case1"
    client: int = Field(0, ge=0, description="Index of the client whose data are duplicated.")
    copies: list[PositiveInt] = Field([1, 2, 3, 4], min_length=1, description="Times the client's dataset "
                                      "appears: 1 = as is, 2–4 = duplicated 1–3×.")
    datum_copies: int = Field(11, ge=2, description="Times the most valuable / most harmful datum appears "
                              "(11 = duplicated 10×).")
    validation_samples: int = Field(300, ge=10, description="Q = the first rows of the test split.")
    seed_repeats: int = Field(5, ge=0, le=100, description="FedBary reruns with seeds seed … seed+n−1 on the "
                              "original data: the estimate's seed-to-seed spread.")


class PrivacyParams(Strict):
    """DP FedBary (:mod:`otfed.privacy.dp_fedbary`) on the detection setting: noise of each kind planted at
    ``rate`` on ``detection.federation``; per kind, seed and ε one DP FedBary run (every client DP, total
    (ε, δ) per client; Q = the server's validation set) next to plain FedBary with the same seed. Reported: the
    detection ROC AUC of the clients' datum values (computed locally against the noisier η_Q), the closing
    distances' relative error against plain FedBary's, the ε spent.

    Clip radius C: the ``clip_quantile`` quantile of the norms of the server's own augmented validation
    samples — public to the server, fixed before any client message, not by results."""

    kinds: list[Literal["label", "feature"]] = Field(["label", "feature"], min_length=1)
    rate: float = Field(0.15, gt=0.0, lt=1.0)
    epsilons: list[Annotated[float, Field(gt=0.0)]] = Field([1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, math.inf],
                                                            min_length=1, description="Total ε per client; inf = no "
                                                            "noise (FedBary on clipped records).")
    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    clip_quantile: float = Field(1.0, gt=0.0, le=1.0)
    accountant: Literal["rdp", "pld"] = "rdp"
    seeds: int = Field(3, ge=1, le=100)


class BarycenterValuationParams(FeatureProjection):
    """Stage ``barycenter_valuation``: contributions (fig. 4), outlier histogram, detection (fig. 5),
    duplication robustness (table 3), DP FedBary's detection vs ε."""

    fedbary: FedBaryConfig = FedBaryConfig()
    contributions: ContributionParams = ContributionParams()
    detection: DetectionParams = DetectionParams()
    duplication: DuplicationParams = DuplicationParams()
    privacy: PrivacyParams | None = Field(None, description="Off unless set: DP FedBary's detection AUC vs ε.")


def check(p: Params) -> None:
    """Every federation named exists, has a server test split larger than the validation set cut from it;
    the outlier client and the duplicated client exist, and the outlier federation is clean."""
    bv = p.barycenter_valuation
    c, o, d = bv.contributions, bv.contributions.outlier, bv.duplication
    for i, name in enumerate(c.federations):
        server_split_federation(p, f"barycenter_valuation.contributions.federations[{i}]", name,
                                c.validation_samples)
    spec = server_split_federation(p, "barycenter_valuation.contributions.outlier.federation", o.federation,
                                   c.validation_samples)
    server_split_federation(p, "barycenter_valuation.detection.federation", bv.detection.federation,
                            bv.detection.validation_samples)
    if o.client >= getattr(spec, "n_clients", 0):
        raise ValueError(f"barycenter_valuation.contributions.outlier.client: {o.client} ≥ n_clients of "
                         f"{o.federation!r}")
    if getattr(spec, "scheme", None) == "fedbary_case" and spec.case in (4, 5):
        raise ValueError(f"barycenter_valuation.contributions.outlier.federation: {o.federation!r} is already "
                         f"noisy (case {spec.case}); use a clean federation")
    key = "barycenter_valuation.duplication"
    spec = server_split_federation(p, f"{key}.federation", d.federation, d.validation_samples,
                                   validation_key=f"{key}.validation_samples")
    if d.client >= getattr(spec, "n_clients", 0):
        raise ValueError(f"{key}.client: {d.client} ≥ n_clients of {d.federation!r} "
                         f"({getattr(spec, 'n_clients', 0)})")


def federations(p: Params) -> list[str]:
    """Every federation the stage reads, each once: contributions, outlier, detection, duplication."""
    bv = p.barycenter_valuation
    return list(dict.fromkeys([*bv.contributions.federations, bv.contributions.outlier.federation,
                               bv.detection.federation, bv.duplication.federation]))


def inputs(p: Params) -> list[Path]:
    """The partition files of :func:`federations` (checked to exist before :func:`preflight`)."""
    return [Path(layout.PARTITIONS) / f"{name}.npz" for name in federations(p)]


def preflight(p: Params) -> None:
    """Every federation read holds what the partition format declares (labels, client indices, lengths,
    shapes, the manifest's sizes) and finite features within the float32 bound (FedBary values every client:
    none can be left out), its projection fits it (:meth:`~otfed.data.parties.FeatureProjection.check_fits`),
    and the duplication's arrays fit in this machine's memory (:func:`duplication_memory`) — before any server
    starts (DataError / DegenerateClientError naming the file, ConfigError naming the key, otherwise)."""
    bv = p.barycenter_valuation
    for name in federations(p):
        fed = load_federation(name, layout.PARTITIONS, require_finite=True)
        bv.check_fits(fed, Path(layout.PARTITIONS) / f"{name}.npz", "barycenter_valuation")
        if name == bv.duplication.federation:
            check_memory(duplication_memory(bv.duplication, len(fed.rows(bv.duplication.client))))


def duplication_memory(u: DuplicationParams, n: int) -> list[tuple[str, int, str]]:
    """(key, bytes, what) of the largest array the duplication job holds per setting
    (:func:`~stages.stage.check_memory`), for a client of ``n`` training rows: the exact W's float64 cost
    matrix and plan between the duplicated data (k·n atoms for ``copies`` k, n + datum_copies − 1 for the
    datum) and Q's ``validation_samples`` atoms — a lower bound of the job's memory. Pure."""
    v = u.validation_samples
    out = [(f"barycenter_valuation.duplication.copies[{i}]", 2 * 8 * k * n * v,
            f"{k} copies of the {n} rows: the exact W's {k * n} × {v} cost matrix and plan (float64)")
           for i, k in enumerate(u.copies)]
    m = n + u.datum_copies - 1
    out.append(("barycenter_valuation.duplication.datum_copies", 2 * 8 * m * v,
                f"{u.datum_copies} copies of one datum: the exact W's {m} × {v} cost matrix and plan (float64)"))
    return out


# -------------------------------------------------------------------------------------------- jobs
def jobs(p: Params, dirs: Mapping[str, Path]) -> list[Job]:
    """One contributions job per (federation, seed), the outlier job, one detection job per (kind, rate), the
    duplication job, one DP FedBary job per (kind, seed) (features projected as the params say; noise planted
    before the projection); keys in the module docstring."""
    # FedAvg (the contributions jobs' utility) runs on run.device; on CPU one torch thread per task
    device = stage_device(p.run.device)
    bv, seed = p.barycenter_valuation, p.run.seed
    c, o, d, u = bv.contributions, bv.contributions.outlier, bv.detection, bv.duplication

    def load(name: str) -> FederationData:
        return load_federation(name, layout.PARTITIONS, require_finite=True)

    out = []
    for name in c.federations:
        fed = bv.project(load(name), seed)
        validation, _ = server_split(fed, c.validation_samples)
        planted = [float(fed.corrupted[fed.rows(k)].mean()) for k in range(fed.n_clients)]
        for s in range(seed, seed + c.seeds):
            out.append(Job(f"contributions {name} seed {s}", client_contributions, dict(
                name=name, clients=client_sets(fed), validation=validation, config=bv.fedbary, fedavg=c.fedavg,
                permutations=c.monte_carlo_permutations, tmc_tolerance=c.tmc_tolerance, gtg=c.gtg, seed=s,
                device=device, planted_noise=planted), key=("contributions", name, s)))
    out.append(Job(f"outlier {o.federation}", outlier_distances, dict(
        fed=load(o.federation), noisy_client=o.client, fraction=o.fraction, noise_std=o.noise_std,
        projection=FeatureProjection(pca_components=bv.pca_components, random_projection=bv.random_projection),
        validation_samples=c.validation_samples, config=bv.fedbary, seed=seed), key="outlier"))
    clean = load(d.federation)
    for kind in d.kinds:
        for rate in d.rates:
            fed = bv.project(corrupted_federation(clean, kind, rate, d.noise_std, seed), seed)
            validation, holdout = server_split(fed, d.validation_samples)
            noisy = np.concatenate([fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)])
            out.append(Job(f"detection {kind} {rate}", detection_setting, dict(
                kind=kind, rate=rate, clients=client_sets(fed), noisy=noisy, validation=validation, holdout=holdout,
                config=bv.fedbary, knn_k=d.knn_k, removal_step=d.removal_step,
                removal_max_fraction=d.removal_max_fraction, seed=seed, removal_embedding=d.removal_embedding),
                key=("detection", kind, rate)))
    fed = bv.project(load(u.federation), seed)
    validation, _ = server_split(fed, u.validation_samples)
    out.append(Job(f"duplication {u.federation}", duplication_robustness, dict(
        clients=client_sets(fed), validation=validation, client=u.client, copies=u.copies,
        datum_copies=u.datum_copies, config=bv.fedbary, seed=seed, seed_repeats=u.seed_repeats), key="duplication"))
    if bv.privacy is not None:
        q = bv.privacy
        for kind in q.kinds:
            fed = bv.project(corrupted_federation(clean, kind, q.rate, d.noise_std, seed), seed)
            validation, _ = server_split(fed, d.validation_samples)
            noisy = np.concatenate([fed.corrupted[fed.rows(k)] for k in range(fed.n_clients)])
            radius = float(np.quantile(np.linalg.norm(augmented_measure(validation, diagonal=bv.fedbary.diagonal)
                                                      .support, axis=1), q.clip_quantile))
            for s in range(seed, seed + q.seeds):
                out.append(Job(f"dp-fedbary {kind} seed {s}", dp_detection, dict(
                    kind=kind, rate=q.rate, clients=client_sets(fed), noisy=noisy, validation=validation,
                    config=bv.fedbary, epsilons=q.epsilons, delta=q.delta, clip_radius=radius,
                    accountant=q.accountant, seed=s), key=("privacy", kind, s)))
    return out


# --------------------------------------------------------------------------------- contributions
def client_contributions(name: str, clients: list[LabelledData], validation: LabelledData, config: FedBaryConfig,
                         fedavg: FedAvgConfig, permutations: int, tmc_tolerance: float, gtg: GTGParams, seed: int,
                         device: str, planted_noise: Sequence[float] | None = None) -> list[dict[str, Any]]:
    """One federation and seed of FedBary fig. 4: every method's value and contribution (%) per client,
    and its cost. FedBary: score ∝ 1/W(P_i, Q) (Q = validation set, or the federated barycenter); Shapley
    types: φ_i / Σ_j φ_j (:func:`~otfed.valuation.percent_of_total`) with the FedAvg-validation-accuracy
    utility (:func:`~otfed.valuation.fedavg_utility`, FedAvg on ``device``), each coalition trained once
    and shared by exact, leave-one-out, Monte-Carlo and truncated Monte-Carlo (DataSV) Shapley
    (:class:`~otfed.valuation.MemoizedUtility`; a method's ``seconds`` is the training time of the
    coalitions it queried); the FL baselines OR, MR and GTG-Shapley value the clients from the updates of
    one recorded FedAvg run over all clients (:func:`~otfed.valuation.fedavg_rounds`, the run behind u(N);
    their ``seconds``: that training plus their own evaluations). ``planted_noise``: each client's share of
    corrupted data (the ground truth of cases 4–5), copied into the rows."""
    rows: list[dict[str, Any]] = []
    names = [c.name for c in clients]
    planted = list(planted_noise) if planted_noise is not None else [float("nan")] * len(clients)

    def add(method: str, values: np.ndarray, percent: np.ndarray, seconds: float) -> None:
        for k, client in enumerate(names):
            rows.append(dict(federation=name, seed=seed, method=method, client=client, planted_noise=planted[k],
                             value=float(values[k]), percent=float(percent[k]), seconds=seconds))

    res, secs = timed(federated_valuation, clients, config, validation=validation, seed=seed)
    add("fedbary_validation", res.distances, res.contributions, secs)
    res, secs = timed(federated_valuation, clients, config, validation=None, seed=seed)
    add("fedbary_barycenter", res.distances, res.contributions, secs)
    players = ValuationData(np.arange(len(clients), dtype=np.float64)[:, None], np.zeros(len(clients), dtype=np.int64))
    utility = MemoizedUtility(fedavg_utility(clients, validation, fedavg, seed, device))
    for method, valuer in (("exact_shapley", ExactShapley(utility)), ("leave_one_out", LeaveOneOut(utility)),
                           ("monte_carlo_shapley", PermutationShapley(utility, permutations, seed=seed)),
                           ("tmc_shapley", TruncatedMonteCarloShapley(utility, permutations, tolerance=tmc_tolerance,
                                                                      seed=seed))):
        utility.start_method()
        values = valuer.fit(players)
        add(method, values, percent_of_total(values), utility.method_seconds())
    rounds, training = timed(fedavg_rounds, clients, validation, fedavg, seed, device)
    accuracy = accuracy_utility(validation.x, validation.y, device=device, num_threads=threads_for(device))
    for method, valuer in (("one_round", one_round_reconstruction), ("multi_round", multi_round_reconstruction),
                           ("gtg_shapley", partial(gtg_shapley, eps_between=gtg.eps_between, eps_within=gtg.eps_within,
                                                   tolerance=gtg.tolerance, max_permutations=gtg.max_permutations,
                                                   seed=seed))):
        result, secs = timed(valuer, rounds, accuracy)
        add(method, result.values, percent_of_total(result.values), training + secs)
    return rows


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman ρ, NaN when either ranking is constant or has a NaN."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or len(np.unique(a)) < 2 or len(np.unique(b)) < 2:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def rank_agreement(rows: list[dict[str, Any]], reference: str = "exact_shapley") -> list[dict[str, Any]]:
    """Per federation, seed and method: Spearman ρ of the client contributions with ``reference``'s
    (same seed) and with the planted quality −(share of corrupted data) — the ground truth where the
    clients' noise differs (cases 4–5; NaN elsewhere) —, and the method's seconds."""
    frame = pd.DataFrame(rows)
    if "seed" not in frame:
        frame["seed"] = 0
    out = []
    for (fed, seed, method), sub in frame.groupby(["federation", "seed", "method"], sort=False):
        ref = frame[(frame.federation == fed) & (frame.seed == seed) & (frame.method == reference)]
        ref = ref.set_index("client").percent
        mine = sub.set_index("client").reindex(ref.index)
        planted = (-mine.planted_noise.to_numpy() if "planted_noise" in mine
                   else np.full(len(mine), np.nan))
        out.append(dict(federation=fed, seed=int(seed), method=method,
                        spearman_vs_exact_shapley=_spearman(mine.percent.to_numpy(), ref.to_numpy()),
                        spearman_vs_planted=_spearman(mine.percent.to_numpy(), planted),
                        seconds=float(sub.seconds.iloc[0])))
    return out


def agreement_over_seeds(agreement: pd.DataFrame) -> pd.DataFrame:
    """Per federation and method (and over all federations): mean ± 95% CI half-width (Student t over the
    seeds, :func:`~otfed.metrics.mean_confidence_interval`) of both rank correlations, the number of
    seeds with a defined ρ, and the mean seconds."""
    def summarise(sub: pd.DataFrame) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for col in ("spearman_vs_exact_shapley", "spearman_vs_planted"):
            vals = sub[col].to_numpy(dtype=np.float64)
            finite = vals[np.isfinite(vals)]
            mean, half = mean_confidence_interval(finite) if finite.size else (float("nan"), float("nan"))
            out[col], out[f"{col}_ci95"], out[f"{col}_n"] = mean, half, int(finite.size)
        out["seconds"] = float(sub.seconds.mean())
        return out

    rows = [dict(federation=fed, method=method) | summarise(sub)
            for (fed, method), sub in agreement.groupby(["federation", "method"], sort=False)]
    # over all federations: the per-seed mean ρ over the federations, then its CI over the seeds
    per_seed = agreement.groupby(["seed", "method"], sort=False).agg(
        spearman_vs_exact_shapley=("spearman_vs_exact_shapley", "mean"),
        spearman_vs_planted=("spearman_vs_planted", "mean"), seconds=("seconds", "sum")).reset_index()
    rows += [dict(federation="all (mean ρ)", method=method) | summarise(sub)
             for method, sub in per_seed.groupby("method", sort=False)]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------- outlier
class Outlier(NamedTuple):
    """The outlier job's result: the noisy client, how many of its samples got noise, the distance rows."""

    noisy_client: str
    noisy_samples: int
    rows: list[dict[str, Any]]


def outlier_distances(fed: FederationData, noisy_client: int, fraction: float, noise_std: float,
                      projection: FeatureProjection, validation_samples: int, config: FedBaryConfig,
                      seed: int) -> Outlier:
    """FedBary fig. 4 histogram: client ``noisy_client`` gets feature noise on ``fraction`` of its samples
    (:func:`~otfed.data.corruption.noisy_client_federation`, in the stored pixel space, before the PCA),
    then W(P_i, Q) per client against the federated barycenter and against the server's validation set."""
    noisy = noisy_client_federation(fed, noisy_client, fraction, noise_std, seed)
    noisy = projection.project(noisy, seed)
    validation, _ = server_split(noisy, validation_samples)
    clients = client_sets(noisy)
    rows = []
    for target, val in (("barycenter", None), ("validation", validation)):
        res = federated_valuation(clients, config, validation=val, seed=seed)
        far = int(np.argmax(res.distances))
        for k, c in enumerate(clients):
            rows.append(dict(target=target, client=c.name, noisy=k == noisy_client,
                             distance=float(res.distances[k]), percent=float(res.contributions[k]),
                             farthest=k == far))
    return Outlier(fed.client_names[noisy_client], int(noisy.corrupted.sum()), rows)


# ------------------------------------------------------------------------------------- detection
def _removal_model(seed: int) -> Any:
    """Standardised multinomial logistic regression (the scaler is refitted on the kept data)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))


def suspicion_scores(clients: list[LabelledData], validation: LabelledData, config: FedBaryConfig, knn_k: int,
                     seed: int) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, np.ndarray]]:
    """Per method: suspicion per pooled datum (clients concatenated in order; larger = more suspicious),
    wall time, and flags. FedBary runs federated (values computed client-side against η_{Q_i}, eq. 10,
    with ``config.potential``); the baselines get the pooled data directly (as in the paper)."""
    x = np.concatenate([c.x for c in clients])
    y = np.concatenate([c.y for c in clients])
    data = ValuationData(x, y, validation.x, validation.y)
    scores: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    res, seconds["fedbary"] = timed(federated_valuation, clients, config, validation=validation, seed=seed,
                                     datum_values=True, potential=config.potential)
    scores["fedbary"] = np.concatenate([res.datum_values[c.name] for c in clients])
    scores["lava"], seconds["lava"] = timed(Lava(p=config.p, potential=config.potential,
                                                  diagonal=config.diagonal).fit, data)
    values, seconds["knn_shapley"] = timed(KNNShapley(knn_k).fit, data)
    scores["knn_shapley"] = -values
    values, seconds["leave_one_out"] = timed(knn_leave_one_out, data, knn_k)
    scores["leave_one_out"] = -values
    scores["random"] = np.random.default_rng(np.random.SeedSequence([seed, 7])).random(len(y))
    seconds["random"] = 0.0
    flags = {m: flag_noisy(s) for m, s in scores.items() if m != "random"}
    return scores, seconds, flags


def detection_setting(kind: str, rate: float, clients: list[LabelledData], noisy: np.ndarray,
                      validation: LabelledData, holdout: tuple[np.ndarray, np.ndarray], config: FedBaryConfig,
                      knn_k: int, removal_step: float, removal_max_fraction: float,
                      seed: int, removal_embedding: int = 0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One (noise kind, rate) cell of FedBary fig. 5: detection scores (precision / recall / F1, #flagged
    vs #noisy, the threshold-free ROC AUC of the suspicion ranking) and point-removal curves for every
    method (logistic regression refitted on a ``removal_embedding``-D PCA of the data, fitted on the
    server's validation set; 0 = on the features as valued). ``random`` flags as many data as are noisy
    (chance precision = the noise rate)."""
    scores, seconds, flags = suspicion_scores(clients, validation, config, knn_k, seed)
    n_noisy = int(noisy.sum())
    flags["random"] = np.zeros(len(noisy), dtype=bool)
    flags["random"][np.argsort(-scores["random"])[:n_noisy]] = True
    x = np.concatenate([c.x for c in clients])
    y = np.concatenate([c.y for c in clients])
    x_holdout = holdout[0]
    if removal_embedding:  # the paper refits its classifier on embeddings; a PCA fitted on server data here
        pca = fit_pca(validation.x, min(removal_embedding, *validation.x.shape), seed)
        x, x_holdout = reduce_features(x, pca), reduce_features(x_holdout, pca)
    score_rows, curve_rows = [], []
    for method in DETECTION_METHODS:
        d = detection_scores(flags[method], np.flatnonzero(noisy), n=len(noisy))
        top = np.argsort(-scores[method], kind="stable")[:n_noisy]
        score_rows.append(dict(kind=kind, rate=rate, method=method, n=len(noisy), noisy=d.noisy, flagged=d.flagged,
                               true_positives=d.true_positives, precision=d.precision, recall=d.recall, f1=d.f1,
                               recall_at_noisy=float(noisy[top].mean()), auc=detection_auc(scores[method], noisy),
                               seconds=seconds[method]))
        curve = point_removal_curve(scores[method], x, y, x_holdout, holdout[1], step=removal_step,
                                    max_fraction=removal_max_fraction, seed=seed,
                                    make_model=_removal_model)
        for f, r, a in zip(curve.fractions, curve.removed, curve.accuracy):
            curve_rows.append(dict(kind=kind, rate=rate, method=method, fraction=round(float(f), 6), removed=int(r),
                                   accuracy=float(a)))
    return score_rows, curve_rows


# ------------------------------------------------------------------------------------- DP FedBary
def dp_detection(kind: str, rate: float, clients: list[LabelledData], noisy: np.ndarray, validation: LabelledData,
                 config: FedBaryConfig, epsilons: Sequence[float], delta: float, clip_radius: float, accountant: str,
                 seed: int) -> list[dict[str, Any]]:
    """Plain FedBary and one DP FedBary run per ε (:func:`~otfed.privacy.dp_fedbary.dp_federated_valuation`,
    the same seed: the same γ^(0) and t's): per run the detection ROC AUC of the datum values (eq. 10, computed
    by each client against its last η_Q), the closing distances' mean relative error against plain FedBary's,
    and the ε each client spent. ``epsilon`` = nan marks the plain run."""
    plain, seconds = timed(federated_valuation, clients, config, validation=validation, seed=seed,
                           datum_values=True, potential=config.potential)
    base = dict(kind=kind, rate=rate, seed=seed, clip_radius=clip_radius, delta=delta, clients=len(clients))
    rows = [base | dict(epsilon=float("nan"), epsilon_spent=0.0, noise_multiplier=0.0, releases=0,
                        auc=detection_auc(np.concatenate([plain.datum_values[c.name] for c in clients]), noisy),
                        distance_rel_error=0.0, seconds=seconds)]
    for epsilon in epsilons:
        dp = DPConfig(epsilon=epsilon, delta=delta, clip_radius=clip_radius, accountant=accountant)
        (result, parties), seconds = timed(dp_federated_valuation, clients, config, dp, validation=validation,
                                           seed=seed, datum_values=True, potential=config.potential)
        values = np.concatenate([result.datum_values[c.name] for c in clients])
        rows.append(base | dict(epsilon=epsilon, epsilon_spent=max(c.privacy_spent()[0] for c in parties),
                                noise_multiplier=parties[0].noise_multiplier, releases=parties[0].releases,
                                auc=detection_auc(values, noisy),
                                distance_rel_error=float(np.mean(np.abs(result.distances - plain.distances)
                                                                 / plain.distances)),
                                seconds=seconds))
    return rows


# ----------------------------------------------------------------------------------- duplication
class Duplication(NamedTuple):
    """The duplication job's result: the duplicated client, the table 3 rows, the seed-to-seed spread."""

    client: str
    rows: list[dict[str, Any]]
    spread: dict[str, list[float]]


def duplication_robustness(clients: list[LabelledData], validation: LabelledData, client: int,
                           copies: Sequence[int], datum_copies: int, config: FedBaryConfig,
                           seed: int, seed_repeats: int = 0) -> Duplication:
    """FedBary table 3: the distance of client ``client`` to the target Q (the server's validation set) and
    to the federated barycenter when its data are duplicated — exact W_p(P_i, Q)
    (:func:`~otfed.valuation.exact_wasserstein`) next to FedBary's estimates; every FedBary run uses the
    same seed (common random numbers, :func:`~otfed.federation.fedbary.fedbary_on_measures`), so a change
    is caused by the input, not by the random draws.

    Rows (``experiment``):
    * ``dataset``: the whole dataset appears ``copies`` times. ``stats="original"``: the client's augmented
      measure P_i (class statistics of its original data) with every atom repeated — the same measure, so
      the exact W is unchanged. ``stats="refit"``: the client duplicates its raw rows and re-estimates its
      class statistics on them; the unbiased covariances (÷ (n_c − 1)) then shrink by (n_c − 1)/n_c ·
      k n_c/(k n_c − 1), so the augmented points — and the exact W — move by O(1/n_c).
    * ``datum``: one datum appears ``datum_copies`` times (original statistics): the most valuable datum
      (most negative FedBary calibrated gradient g, eq. 10, computed client-side against η_{Q_i} with
      ``config.potential`` in the run on the original data: moving mass to it decreases the distance) and
      the most harmful one (largest g). ``wp_change_first_order_bound`` = δ · g_l with exact
      (network-simplex) duals of W_p^p(P_i, Q), a lower bound on the exact ``exact_wp_change`` by
      convexity (:func:`~otfed.valuation.mass_moved_by_duplication`).

    ``*_rel_change``: (value − value on the original data) / value on the original data. ``spread``: the
    client's FedBary distances for seeds seed, …, seed + seed_repeats − 1 on the original data (the
    estimate's seed-to-seed spread, to judge the size of a change)."""
    if not 0 <= client < len(clients):
        raise ValueError(f"client index {client} is out of range for {len(clients)} clients")
    if not copies or min(copies) < 1 or datum_copies < 1:
        raise ValueError(f"copies must be ≥ 1, got copies={list(copies)}, datum_copies={datum_copies}")
    measures = [augmented_measure(c, diagonal=config.diagonal) for c in clients]
    target = augmented_measure(validation, diagonal=config.diagonal)
    names = [c.name for c in clients]
    own = clients[client]

    def evaluate(measure: Measure) -> dict[str, Any]:
        current = list(measures)
        current[client] = measure
        val = fedbary_on_measures(current, names, config, target, seed)
        bary = fedbary_on_measures(current, names, config, None, seed)
        return dict(atoms=measure.n, exact_w=exact_wasserstein(measure, target, config.p),
                    fedbary_validation=float(val.distances[client]), fedbary_barycenter=float(bary.distances[client]),
                    percent_validation=float(val.contributions[client]),
                    percent_barycenter=float(bary.contributions[client]))

    base_run = fedbary_on_measures(measures, names, config, target, seed, datum_values=True,
                                   potential=config.potential)
    g = base_run.datum_values[own.name]  # type: ignore[index]
    base = evaluate(measures[client])
    keys = ("exact_w", "fedbary_validation", "fedbary_barycenter")

    def row(experiment: str, stats: str, n_copies: int, result: dict[str, Any], **extra: Any) -> dict[str, Any]:
        out = dict(experiment=experiment, stats=stats, datum="", datum_index=-1, datum_value=float("nan"),
                   copies=n_copies) | extra | result
        for k in keys:
            out[f"{k}_rel_change"] = (result[k] - base[k]) / base[k]
        return out

    rows: list[dict[str, Any]] = []
    for stats in ("original", "refit"):
        for k in copies:
            if stats == "original":
                measure = repeated_dataset(measures[client], k)
            else:
                refit = LabelledData(own.name, np.tile(own.x, (k, 1)), np.tile(own.y, k))
                measure = augmented_measure(refit, diagonal=config.diagonal)
            rows.append(row("dataset", stats, k, evaluate(measure)))
    exact_f = calibrated_values(measures[client], target, p=config.p, potential="exact")
    delta = mass_moved_by_duplication(measures[client].n, datum_copies)
    for label, index in (("most_valuable", int(np.argmin(g))), ("most_harmful", int(np.argmax(g)))):
        result = evaluate(repeated_datum(measures[client], index, datum_copies))
        rows.append(row("datum", "original", datum_copies, result, datum=label, datum_index=index,
                        datum_value=float(g[index]))
                    | dict(exact_wp_change=result["exact_w"] ** config.p - base["exact_w"] ** config.p,
                           wp_change_first_order_bound=delta * float(exact_f[index])))
    spread: dict[str, list[float]] = {"fedbary_validation": [], "fedbary_barycenter": []}
    for r in range(seed_repeats):
        for mode, tgt in (("fedbary_validation", target), ("fedbary_barycenter", None)):
            spread[mode].append(float(fedbary_on_measures(measures, names, config, tgt, seed + r).distances[client]))
    return Duplication(own.name, rows, spread)


# ------------------------------------------------------------------------------------------ report
def report(p: Params, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    """Per kind of job (the first element of its key) its tables, figures, nested runs and headline metrics."""
    return {"contributions": _contributions_report(p, results.of("contributions"), out),
            "outlier": _outlier_report(p, results["outlier"], out),
            "detection": _detection_report(results.of("detection"), out),
            "duplication": _duplication_report(p, results["duplication"], out)} | (
        {"privacy": _privacy_report(results.of("privacy"), out)} if results.of("privacy") else {})


def _contributions_report(p: Params, results: list[list[dict[str, Any]]], out: Report) -> dict[str, Any]:
    """contributions.csv (long: every seed), contributions_wide.csv (mean % over seeds), contributions.png
    (fig. 4, means), method_agreement.csv (ρ mean ± 95% CI over seeds) and method_agreement_seeds.csv."""
    rows = [row for rows in results for row in rows]
    table = pd.DataFrame(rows)
    out.table(table, "contributions.csv")
    means = table.groupby(["federation", "client", "method"], sort=False).agg(
        percent=("percent", "mean"), planted_noise=("planted_noise", "first")).reset_index()
    wide = means.pivot_table(index=["federation", "client"], columns="method", values="percent", sort=False)
    wide = wide[list(CONTRIBUTION_METHODS)]
    wide.insert(0, "planted_noise", means.groupby(["federation", "client"], sort=False).planted_noise.first())
    out.table(wide.reset_index(), "contributions_wide.csv")
    out.figure(figs.contributions_figure(means), "contributions.png")
    per_seed = pd.DataFrame(rank_agreement(rows))
    out.table(per_seed, "method_agreement_seeds.csv")
    agreement = agreement_over_seeds(per_seed)
    out.table(agreement, "method_agreement.csv")
    overall = agreement[agreement.federation == "all (mean ρ)"]
    summary: dict[str, Any] = {}
    for name in p.barycenter_valuation.contributions.federations:
        mine = means[means.federation == name]
        per = {m: {r.client: round(r.percent, 3) for r in mine[mine.method == m].itertuples()}
               for m in CONTRIBUTION_METHODS}
        fed_rows = agreement[agreement.federation == name]
        rho = {r.method: r.spearman_vs_exact_shapley for r in fed_rows.itertuples()}
        planted = {r.method: r.spearman_vs_planted for r in fed_rows.itertuples() if np.isfinite(r.spearman_vs_planted)}
        summary[name] = {"percent": per, "spearman": rho} | ({"spearman_planted": planted} if planted else {})
        with out.variant(f"contributions/{name}", tags={"federation": name}) as child:
            child.log_metrics({f"{m}.{c}": v for m, d in per.items() for c, v in d.items()} |
                              {f"spearman.{m}": v for m, v in rho.items() if np.isfinite(v)} |
                              {f"spearman_planted.{m}": v for m, v in planted.items()})
    summary["mean_spearman"] = {r.method: r.spearman_vs_exact_shapley for r in overall.itertuples()}
    summary["mean_spearman_ci95"] = {r.method: r.spearman_vs_exact_shapley_ci95 for r in overall.itertuples()}
    summary["mean_spearman_planted"] = {r.method: r.spearman_vs_planted for r in overall.itertuples()}
    summary["mean_spearman_planted_ci95"] = {r.method: r.spearman_vs_planted_ci95 for r in overall.itertuples()}
    summary["seeds"] = int(table.seed.nunique())
    summary["seconds"] = {r.method: round(r.seconds, 3) for r in overall.itertuples()}
    return summary


def _outlier_report(p: Params, result: Outlier, out: Report) -> dict[str, Any]:
    """outlier_distances.csv and the histogram (fig. 4): is the noisy client the farthest?"""
    table = pd.DataFrame(result.rows)
    out.table(table, "outlier_distances.csv")
    out.figure(figs.outlier_figure(table), "outlier_histogram.png")
    summary: dict[str, Any] = {"noisy_client": result.noisy_client, "noisy_samples": result.noisy_samples}
    for target, sub in table.groupby("target", sort=False):
        noisy = sub[sub.noisy]
        summary[f"{target}_noisy_is_farthest"] = bool(noisy.farthest.iloc[0])
        summary[f"{target}_noisy_distance"] = float(noisy.distance.iloc[0])
        summary[f"{target}_clean_distance_max"] = float(sub[~sub.noisy].distance.max())
    with out.variant("outlier", tags={"federation": p.barycenter_valuation.contributions.outlier.federation}) as child:
        child.log_metrics({k: float(v) for k, v in summary.items() if isinstance(v, (bool, int, float))})
    return summary


def _detection_report(results: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]],
                      out: Report) -> dict[str, Any]:
    """detection.csv / .png (fig. 5) and removal_curves.csv / .png; one nested run per (kind, rate) with the
    removal curves logged per step (data removed)."""
    scores = pd.DataFrame([r for s, _ in results for r in s])
    curves = pd.DataFrame([r for _, c in results for r in c])
    out.table(scores, "detection.csv")
    out.table(curves, "removal_curves.csv")
    out.figure(figs.detection_figure(scores), "detection.png")
    out.figure(figs.removal_curves_figure(curves), "removal_curves.png")
    summary: dict[str, Any] = {}
    for (kind, rate), sub in scores.groupby(["kind", "rate"], sort=False):
        key = f"{kind}_{round(100 * rate)}pct"
        summary[key] = {r.method: {"precision": round(r.precision, 4), "recall": round(r.recall, 4),
                                   "f1": round(r.f1, 4), "auc": round(r.auc, 4), "flagged": int(r.flagged),
                                   "noisy": int(r.noisy)}
                        for r in sub.itertuples()}
        with out.variant(f"detection/{key}", tags={"kind": kind, "rate": rate}) as child:
            child.log_metrics({f"{r.method}.{m}": float(getattr(r, m)) for r in sub.itertuples()
                               for m in ("precision", "recall", "f1", "auc", "flagged")})
            for method, line in curves[(curves.kind == kind) & (curves.rate == rate)].groupby("method"):
                for r in line.itertuples():
                    child.log_metrics({f"removal_accuracy.{method}": r.accuracy}, step=int(r.removed))
    return summary


def _duplication_report(p: Params, result: Duplication, out: Report) -> dict[str, Any]:
    """duplication.csv and .png (table 3): largest relative changes, the datum experiments, seed spread."""
    table = pd.DataFrame(result.rows)
    out.table(table, "duplication.csv")
    out.figure(figs.duplication_figure(table, result.spread), "duplication.png")
    federation = p.barycenter_valuation.duplication.federation
    dataset = table[table.experiment == "dataset"]
    summary: dict[str, Any] = {"federation": federation, "client": result.client,
                               "exact_w": float(table.exact_w.iloc[0])}
    for stats, sub in dataset.groupby("stats", sort=False):
        for col in ("exact_w", "fedbary_validation", "fedbary_barycenter"):
            summary[f"dataset_{stats}_max_abs_rel_change_{col}"] = float(sub[f"{col}_rel_change"].abs().max())
    for r in table[table.experiment == "datum"].itertuples():
        for col in ("exact_w", "fedbary_validation", "fedbary_barycenter"):
            summary[f"datum_{r.datum}_rel_change_{col}"] = float(getattr(r, f"{col}_rel_change"))
        summary[f"datum_{r.datum}_calibrated_gradient"] = float(r.datum_value)
    for mode, values in result.spread.items():
        if len(values) > 1:
            summary[f"seed_cv_{mode}"] = float(np.std(values, ddof=1) / np.mean(values))
    with out.variant("duplication", tags={"federation": federation}) as child:
        child.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)})
    return summary


def _privacy_report(results: list[list[dict[str, Any]]], out: Report) -> dict[str, Any]:
    """privacy_dp_detection.csv (one row per kind, seed and ε; ε = nan: plain FedBary), its summary (mean ±
    95% CI over seeds) and privacy_dp_detection.png (detection AUC and distance error vs ε)."""
    table = pd.DataFrame([row for rows in results for row in rows])
    out.table(table, "privacy_dp_detection.csv")
    rows = []
    for (kind, epsilon), sub in table.groupby(["kind", "epsilon"], sort=False, dropna=False):
        auc, auc_ci = mean_confidence_interval(sub.auc)
        err, err_ci = mean_confidence_interval(sub.distance_rel_error)
        rows.append(dict(kind=kind, epsilon="no DP" if np.isnan(epsilon) else epsilon, auc=auc, auc_ci95=auc_ci,
                         distance_rel_error=err, distance_rel_error_ci95=err_ci,
                         epsilon_spent=float(sub.epsilon_spent.max()), seeds=len(sub)))
    summary_table = pd.DataFrame(rows)
    out.table(summary_table, "privacy_dp_detection_summary.csv")
    out.figure(figs.dp_detection_figure(table), "privacy_dp_detection.png")
    summary: dict[str, Any] = {}
    for r in summary_table.itertuples():
        key = "no_dp" if r.epsilon == "no DP" else ("eps_inf" if np.isinf(r.epsilon) else f"eps_{r.epsilon:g}")
        summary[f"{r.kind}_auc_{key}"] = round(float(r.auc), 4)
        summary[f"{r.kind}_distance_rel_error_{key}"] = round(float(r.distance_rel_error), 4)
    with out.variant("privacy", tags={"protocol": "dp_fedbary"}) as child:
        child.log_metrics({k: v for k, v in summary.items() if np.isfinite(v)})
    return summary


STAGE = Stage("barycenter_valuation", BarycenterValuationParams, OUTPUTS, jobs, report, check,
              preflight=preflight, inputs=inputs,
              headline=("contributions.mean_spearman.fedbary_*",  # fig. 4: rank agreement with exact Shapley
                        "contributions.mean_spearman_planted.fedbary_*",  # fig. 4: … and with the planted noise
                        "contributions.mean_spearman_planted.exact_shapley",
                        "outlier.barycenter_noisy_distance", "outlier.barycenter_clean_distance_max",  # fig. 4
                        "detection.*.fedbary.auc",  # fig. 5: label / feature noise at each rate (F1 in MLflow)
                        "duplication.dataset_original_max_abs_rel_change_fedbary_validation",  # table 3
                        "duplication.datum_most_harmful_rel_change_fedbary_validation",
                        "privacy.*_auc_eps_1"))  # DP FedBary: detection at ε = 1 (no DP: detection.*.fedbary.auc)
