"""The experiments of stages ``barycenter_valuation`` and ``noisy_removal`` (FedBary §5), as pure functions
returning table rows.

* :func:`client_contributions` — FedBary fig. 4: client contributions (%) of one federation by FedBary
  with a validation set, FedBary against the federated barycenter (no validation), and the FedAvg-utility
  games: exact Shapley (all 2^N coalitions), leave-one-out, Monte-Carlo permutation Shapley; with wall times.
* :func:`outlier_distances` — FedBary fig. 4 (histogram): distance of every client to the federated
  barycenter when one client carries feature noise.
* :func:`detection_setting` — FedBary fig. 5: datum values (calibrated gradients, eq. 10) from FedBary's
  client-side potentials vs LAVA, KNN-Shapley, leave-one-out (KNN utility) and random; precision / recall /
  F1 of the flags and point-removal curves.
* :func:`removal_experiment` — FedBary table 4: every client drops what it flags, FedAvg before vs after.
* :func:`duplication_robustness` — FedBary table 3: one client's whole dataset duplicated, or one of its
  data duplicated, with the exact W_2 (POT's network simplex) next to FedBary's estimate.

Each function is one unit of fan-out work (a Prefect task in ``flows/``). Inputs are arrays, never files.
Score convention for detection: a *suspicion* per datum, larger = more likely noisy (FedBary / LAVA
calibrated gradients as they are; KNN-Shapley and leave-one-out values negated); a method flags the data
with suspicion > 0 (value < 0 for the Shapley-type methods) and the removal curves drop the most
suspicious first.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np
import ot
from scipy.stats import spearmanr

from otfed.data.corruption import add_feature_noise, flip_labels
from otfed.data.features import fit_pca, reduce_features
from otfed.data.store import FederationData
from otfed.errors import OTConvergenceError
from otfed.federation.fedbary import (BaryClient, BaryServer, FedBaryConfig, FedBaryResult, contribution_percent,
                                      fedbary, federated_valuation)
from otfed.federation.otdd import LabelledData, augmented_measure
from otfed.ot import Measure, cost_matrix
from otfed.fl.fedavg import evaluate, fedavg, init_state
from otfed.valuation import (ExactShapley, KNNShapley, Lava, LeaveOneOut, PermutationShapley, ValuationData,
                             detection_scores, flag_noisy, point_removal_curve)

CONTRIBUTION_METHODS = ("fedbary_validation", "fedbary_barycenter", "exact_shapley", "leave_one_out",
                        "monte_carlo_shapley")
DETECTION_METHODS = ("fedbary", "lava", "knn_shapley", "leave_one_out", "random")


# ----------------------------------------------------------------------------------------------- data
def fedbary_config(p: Any) -> FedBaryConfig:
    """FedBaryConfig from its params group (``otfed.config.FedBaryParams``; ``t: random`` → None)."""
    return FedBaryConfig(support_size=p.support_size, iterations=p.iterations,
                         t=None if p.t == "random" else float(p.t), p=p.p, interpolation=p.interpolation,
                         solver=p.solver, init_scale=p.init_scale, barycenter_step=p.barycenter_step,
                         diagonal=p.diagonal)


def project_federation(fed: FederationData, n_components: int, seed: int) -> FederationData:
    """The federation with features projected on a PCA fitted on its server-side test split (the
    partition stage's rule: the server's public data, never client rows). ``n_components=0``: unchanged."""
    if n_components == 0:
        return fed
    pca = fit_pca(fed.x_test.astype(np.float64), n_components, seed)
    return dataclasses.replace(fed, x=reduce_features(fed.x, pca).astype(np.float32),
                               x_test=reduce_features(fed.x_test, pca).astype(np.float32))


def client_sets(fed: FederationData) -> list[LabelledData]:
    """Every client's training split as LabelledData (float64 features)."""
    return [LabelledData(fed.client_names[k], *fed.client_data(k)) for k in range(fed.n_clients)]


def server_split(fed: FederationData, n_validation: int) -> tuple[LabelledData, tuple[np.ndarray, np.ndarray]]:
    """The server's data: the first ``n_validation`` rows of the test split are its validation set, the
    rest its test (holdout) set."""
    n = len(fed.y_test)
    if not 0 < n_validation < n:
        raise ValueError(f"federation {fed.name!r}: validation_samples={n_validation} must be in 1..{n - 1} "
                         f"(its test split has {n} rows)")
    x, y = fed.x_test.astype(np.float64), fed.y_test
    return LabelledData("server_validation", x[:n_validation], y[:n_validation]), (x[n_validation:], y[n_validation:])


def n_classes_of(*labels: np.ndarray) -> int:
    return int(max(int(np.max(y)) for y in labels if len(y))) + 1


# ------------------------------------------------------------------------------------ contributions
def fedavg_accuracy(clients: Sequence[tuple[np.ndarray, np.ndarray]], eval_data: tuple[np.ndarray, np.ndarray],
                    n_classes: int, fedavg_params: dict, seed: int) -> float:
    """Accuracy on ``eval_data`` of FedAvg (McMahan et al. 2017) over ``clients`` from a seeded initial
    state; no clients → the initial model's accuracy."""
    state = init_state(eval_data[0].shape[1], n_classes, hidden=fedavg_params.get("hidden", ()), seed=seed)
    if clients:
        state = fedavg(clients, state, rounds=fedavg_params["rounds"], epochs=fedavg_params["epochs"],
                       lr=fedavg_params["lr"], seed=seed, batch_size=fedavg_params.get("batch_size")).state
    return evaluate(state, *eval_data)


def fedavg_utility(clients: Sequence[LabelledData], validation: LabelledData, fedavg_params: dict, seed: int):
    """The client-level cooperative game of FedBary §5.1: u(S) = validation accuracy of FedAvg trained on
    the clients in S (players = rows 0..N−1 of the ValuationData)."""
    n_classes = n_classes_of(validation.y, *[c.y for c in clients])

    def utility(data: ValuationData, coalition: np.ndarray) -> float:
        members = [(clients[int(i)].x, clients[int(i)].y) for i in np.sort(coalition)]
        return fedavg_accuracy(members, (validation.x, validation.y), n_classes, fedavg_params, seed)

    return utility


def percent_of_total(values: np.ndarray) -> np.ndarray:
    """100 · v_i / Σ_j v_j (the paper's normalisation of Shapley-type values); NaN when Σ v = 0."""
    values = np.asarray(values, dtype=np.float64)
    total = values.sum()
    if not abs(total) > 1e-9 * max(float(np.abs(values).max(initial=0.0)), 1e-300):
        return np.full_like(values, np.nan)  # Σ v ≈ 0 (e.g. leave-one-out on a flat game): no share defined
    return 100.0 * values / total


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def client_contributions(name: str, clients: list[LabelledData], validation: LabelledData, config: FedBaryConfig,
                         fedavg_params: dict, permutations: int, seed: int) -> list[dict[str, Any]]:
    """One federation of FedBary fig. 4: every method's value and contribution (%) per client, and its
    wall time. FedBary: score ∝ 1/W(P_i, Q) (Q = validation set, or the federated barycenter); Shapley
    types: φ_i / Σ_j φ_j with the FedAvg-validation-accuracy utility."""
    rows: list[dict[str, Any]] = []
    names = [c.name for c in clients]

    def add(method: str, values: np.ndarray, percent: np.ndarray, seconds: float) -> None:
        for k, client in enumerate(names):
            rows.append(dict(federation=name, method=method, client=client, value=float(values[k]),
                             percent=float(percent[k]), seconds=seconds))

    res, secs = _timed(federated_valuation, clients, config, validation=validation, seed=seed)
    add("fedbary_validation", res.distances, res.contributions, secs)
    res, secs = _timed(federated_valuation, clients, config, validation=None, seed=seed)
    add("fedbary_barycenter", res.distances, res.contributions, secs)
    players = ValuationData(np.arange(len(clients), dtype=np.float64)[:, None], np.zeros(len(clients), dtype=np.int64))
    utility = fedavg_utility(clients, validation, fedavg_params, seed)
    for method, valuer in (("exact_shapley", ExactShapley(utility)), ("leave_one_out", LeaveOneOut(utility)),
                           ("monte_carlo_shapley", PermutationShapley(utility, permutations, seed=seed))):
        values, secs = _timed(valuer.fit, players)
        add(method, values, percent_of_total(values), secs)
    return rows


def rank_agreement(rows: list[dict[str, Any]], reference: str = "exact_shapley") -> list[dict[str, Any]]:
    """Spearman rank correlation of each method's client contributions with ``reference``'s, per
    federation, and the method's wall time (NaN correlation when either ranking is constant)."""
    import pandas as pd

    frame = pd.DataFrame(rows)
    out = []
    for (fed, method), sub in frame.groupby(["federation", "method"], sort=False):
        ref = frame[(frame.federation == fed) & (frame.method == reference)].set_index("client").percent
        mine = sub.set_index("client").percent.reindex(ref.index)
        if mine.nunique() < 2 or ref.nunique() < 2:
            rho = float("nan")
        else:
            rho = float(spearmanr(mine.to_numpy(), ref.to_numpy()).statistic)
        out.append(dict(federation=fed, method=method, spearman_vs_exact_shapley=rho,
                        seconds=float(sub.seconds.iloc[0])))
    return out


def outlier_distances(clients: list[LabelledData], noisy_client: int, validation: LabelledData | None,
                      config: FedBaryConfig, seed: int) -> list[dict[str, Any]]:
    """FedBary fig. 4 histogram: W(P_i, Q) per client against the federated barycenter (and against the
    validation set when given), with one client carrying feature noise."""
    rows = []
    for target, val in (("barycenter", None), ("validation", validation)):
        if target == "validation" and validation is None:
            continue
        res = federated_valuation(clients, config, validation=val, seed=seed)
        far = int(np.argmax(res.distances))
        for k, c in enumerate(clients):
            rows.append(dict(target=target, client=c.name, noisy=k == noisy_client,
                             distance=float(res.distances[k]), percent=float(res.contributions[k]),
                             farthest=k == far))
    return rows


# ---------------------------------------------------------------------------------------- detection
def knn_leave_one_out(data: ValuationData, k: int) -> np.ndarray:
    """Leave-one-out values v_i = u(N) − u(N ∖ {i}) of the K-NN utility (:func:`knn_utility`), in one pass.

    Equal to ``LeaveOneOut(knn_utility(k)).fit(data)`` (tested) but O(m·n log n) instead of n utility
    calls: removing i only changes the utility at validation points that have i among their K nearest
    neighbours, where the (K+1)-th neighbour moves in, so u(N) − u(N ∖ {i}) = mean_j 1[i ∈ top_K(j)] ·
    (1[y_i = y_j] − 1[y_{α_{K+1}(j)} = y_j]) / K (a missing (K+1)-th neighbour counts 0).
    """
    x_val, y_val = data.require_validation("knn_leave_one_out")
    n = data.n
    d2 = ((x_val[:, None, :] - data.x[None, :, :]) ** 2).sum(axis=-1)
    order = np.argsort(d2, axis=1, kind="stable")[:, :k + 1]
    match = (data.y[order] == y_val[:, None]).astype(np.float64)
    nxt = match[:, k] if n > k else np.zeros(len(y_val))
    values = np.zeros(n)
    top = order[:, :k]
    np.add.at(values, top, (match[:, :k] - nxt[:, None]) / k)
    return values / len(y_val)


def _removal_model(seed: int) -> Any:
    """Standardised multinomial logistic regression (the scaler is refitted on the kept data)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))


def plant_noise(x: np.ndarray, y: np.ndarray, groups: np.ndarray, kind: str, rate: float, noise_std: float,
                n_classes: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Corrupt round(rate · n_k) rows of every group k (client): labels flipped to a different class
    (:func:`flip_labels`) or N(0, std²) feature noise (:func:`add_feature_noise`). Returns the corrupted
    (x, y) and the boolean ground-truth mask."""
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


def suspicion_scores(clients: list[LabelledData], validation: LabelledData, config: FedBaryConfig, potential: str,
                     knn_k: int, seed: int) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, np.ndarray]]:
    """Per method: suspicion per pooled datum (clients concatenated in order; larger = more suspicious),
    wall time, and flags. FedBary runs federated (values computed client-side against η_{Q_i}); the
    baselines get the pooled data directly (as in the paper)."""
    x = np.concatenate([c.x for c in clients])
    y = np.concatenate([c.y for c in clients])
    data = ValuationData(x, y, validation.x, validation.y)
    scores: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    res, seconds["fedbary"] = _timed(federated_valuation, clients, config, validation=validation, seed=seed,
                                     datum_values=True, potential=potential)
    scores["fedbary"] = np.concatenate([res.datum_values[c.name] for c in clients])
    scores["lava"], seconds["lava"] = _timed(Lava(p=config.p, potential=potential, diagonal=config.diagonal).fit, data)
    values, seconds["knn_shapley"] = _timed(KNNShapley(knn_k).fit, data)
    scores["knn_shapley"] = -values
    values, seconds["leave_one_out"] = _timed(knn_leave_one_out, data, knn_k)
    scores["leave_one_out"] = -values
    scores["random"] = np.random.default_rng(np.random.SeedSequence([seed, 7])).random(len(y))
    seconds["random"] = 0.0
    flags = {m: flag_noisy(s) for m, s in scores.items() if m != "random"}
    return scores, seconds, flags


def detection_setting(kind: str, rate: float, clients: list[LabelledData], noisy: np.ndarray,
                      validation: LabelledData, holdout: tuple[np.ndarray, np.ndarray], config: FedBaryConfig,
                      potential: str, knn_k: int, removal_step: float, removal_max_fraction: float,
                      seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One (noise kind, rate) cell of FedBary fig. 5: detection scores (precision / recall / F1, #flagged
    vs #noisy) and point-removal curves for every method. ``random`` flags as many data as are noisy
    (chance precision = the noise rate)."""
    scores, seconds, flags = suspicion_scores(clients, validation, config, potential, knn_k, seed)
    n_noisy = int(noisy.sum())
    flags["random"] = np.zeros(len(noisy), dtype=bool)
    flags["random"][np.argsort(-scores["random"])[:n_noisy]] = True
    x = np.concatenate([c.x for c in clients])
    y = np.concatenate([c.y for c in clients])
    score_rows, curve_rows = [], []
    for method in DETECTION_METHODS:
        d = detection_scores(flags[method], np.flatnonzero(noisy), n=len(noisy))
        score_rows.append(dict(kind=kind, rate=rate, method=method, n=len(noisy), noisy=d.noisy, flagged=d.flagged,
                               true_positives=d.true_positives, precision=d.precision, recall=d.recall, f1=d.f1,
                               recall_at_noisy=float(noisy[np.argsort(-scores[method], kind="stable")[:n_noisy]].mean()),
                               seconds=seconds[method]))
        curve = point_removal_curve(scores[method], x, y, *holdout, step=removal_step,
                                    max_fraction=removal_max_fraction, seed=seed,
                                    make_model=_removal_model)
        for f, r, a in zip(curve.fractions, curve.removed, curve.accuracy):
            curve_rows.append(dict(kind=kind, rate=rate, method=method, fraction=round(float(f), 6), removed=int(r),
                                   accuracy=float(a)))
    return score_rows, curve_rows


# ------------------------------------------------------------------------------------------ removal
def removal_experiment(name: str, clients: list[LabelledData], noisy: list[np.ndarray], validation: LabelledData,
                       test: tuple[np.ndarray, np.ndarray], config: FedBaryConfig, potential: str,
                       fedavg_params: dict, max_remove_fraction: float,
                       seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """FedBary table 4: FedBary with the server's validation set; every client drops the data it flags
    (calibrated gradient > 0; at most ``max_remove_fraction`` of its data, the largest values first);
    FedAvg on all data vs on what is kept, accuracy on the server's test set. For reference also FedAvg
    after dropping exactly the noisy data (oracle) and after dropping as many random data per client.
    ``noisy_in_top_noisy``: noisy data among each client's n_noisy largest values (a ranking score that
    does not depend on the g > 0 threshold)."""
    start = time.perf_counter()
    res = federated_valuation(clients, config, validation=validation, seed=seed, datum_values=True,
                              potential=potential)
    fedbary_seconds = time.perf_counter() - start
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    kept, oracle, random_kept, client_rows = [], [], [], []
    for c, bad in zip(clients, noisy):
        g = res.datum_values[c.name]
        flagged = flag_noisy(g)
        cap = int(np.floor(max_remove_fraction * len(g)))
        order = np.argsort(-g, kind="stable")
        remove = np.zeros(len(g), dtype=bool)
        remove[order[:min(int(flagged.sum()), cap)]] = True
        kept.append((c.x[~remove], c.y[~remove]))
        oracle.append((c.x[~bad], c.y[~bad]))
        drop = rng.choice(len(g), int(remove.sum()), replace=False)
        keep_r = np.ones(len(g), dtype=bool)
        keep_r[drop] = False
        random_kept.append((c.x[keep_r], c.y[keep_r]))
        client_rows.append(dict(federation=name, client=c.name, n=len(g), noisy=int(bad.sum()),
                                flagged=int(flagged.sum()), removed=int(remove.sum()),
                                removed_noisy=int((remove & bad).sum()),
                                noisy_in_top_noisy=int(bad[order[:int(bad.sum())]].sum()),
                                contribution_percent=float(
                                    res.contributions[[cl.name for cl in clients].index(c.name)])))
    n_classes = n_classes_of(test[1], validation.y, *[c.y for c in clients])
    every = [(c.x, c.y) for c in clients]
    acc = {key: fedavg_accuracy(sets, test, n_classes, fedavg_params, seed)
           for key, sets in (("before", every), ("after", kept), ("oracle", oracle), ("random", random_kept))}
    all_noisy = np.concatenate(noisy)
    removed = sum(r["removed"] for r in client_rows)
    removed_noisy = sum(r["removed_noisy"] for r in client_rows)
    summary = dict(federation=name, n_train=int(len(all_noisy)), noisy=int(all_noisy.sum()),
                   flagged=sum(r["flagged"] for r in client_rows), removed=removed, removed_noisy=removed_noisy,
                   precision=removed_noisy / removed if removed else 0.0,
                   recall=removed_noisy / all_noisy.sum() if all_noisy.sum() else 0.0,
                   noisy_in_top_noisy=sum(r["noisy_in_top_noisy"] for r in client_rows),
                   accuracy_before=acc["before"], accuracy_after=acc["after"],
                   accuracy_oracle_removal=acc["oracle"], accuracy_random_removal=acc["random"],
                   fedbary_seconds=fedbary_seconds)
    return summary, client_rows


def contribution_summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """federation → method → contribution % per client (metrics.json)."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        out.setdefault(r["federation"], {}).setdefault(r["method"], []).append(round(r["percent"], 3))
    return out


# -------------------------------------------------------------------------------------- duplication
def repeated_dataset(measure: Measure, copies: int) -> Measure:
    """``measure`` with every atom repeated ``copies`` times (a client's whole dataset duplicated
    copies − 1 times), each copy carrying 1/copies of the atom's mass. It is the same measure, so
    W_p(·, Q) is unchanged for every Q — the invariance of FedBary table 3."""
    if copies < 1:
        raise ValueError(f"copies must be ≥ 1, got {copies}")
    return Measure(np.tile(measure.support, (copies, 1)), np.tile(measure.weights, copies) / copies)


def repeated_datum(measure: Measure, index: int, copies: int) -> Measure:
    """The uniform measure on a client's n data with datum ``index`` appearing ``copies`` times
    (duplicated copies − 1 times): n + copies − 1 atoms of mass 1/(n + copies − 1). ``measure`` must be
    uniform (an empirical measure)."""
    n = measure.n
    if not 0 <= index < n:
        raise ValueError(f"datum index {index} is out of range for a measure with {n} atoms")
    if copies < 1:
        raise ValueError(f"copies must be ≥ 1, got {copies}")
    if not np.allclose(measure.weights, 1.0 / n, rtol=1e-9, atol=0.0):
        raise ValueError("repeated_datum needs a uniform (empirical) measure")
    extra = np.repeat(measure.support[index:index + 1], copies - 1, axis=0)
    return Measure.uniform(np.vstack([measure.support, extra]))


def mass_moved_by_duplication(n: int, copies: int) -> float:
    """δ such that duplicating one of n uniform data to ``copies`` copies moves mass δ to it from all
    other data equally: its weight goes 1/n → 1/n + δ = copies/(n + copies − 1), every other datum's
    1/n → 1/n − δ/(n − 1). δ = (n − 1)(copies − 1) / (n (n + copies − 1)).

    This is the direction of the calibrated gradient g_l (FedBary eq. 10), and W_p^p is convex in the
    weights with the optimal dual potential as a subgradient, so ΔW_p^p ≥ δ · g_l for exact duals."""
    if n < 2 or copies < 1:
        raise ValueError(f"need n ≥ 2 data and copies ≥ 1, got n={n}, copies={copies}")
    return (n - 1) * (copies - 1) / (n * (n + copies - 1))


def exact_wasserstein(mu: Measure, nu: Measure, p: int = 2, num_itermax: int = 100_000_000) -> float:
    """W_p(μ, ν) by POT's network simplex (``ot.emd2`` on ``ot.dist``'s ground cost ||x − y||^p), with a
    large ``num_itermax`` and its optimality flag checked (:class:`OTConvergenceError` otherwise). An
    independent reference for FedBary's estimate (it shares no code with otfed's solvers)."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p}")
    M = ot.dist(mu.support, nu.support, metric="sqeuclidean" if p == 2 else "euclidean")
    value, log = ot.emd2(mu.weights, nu.weights, M, numItermax=int(num_itermax), log=True)
    if int(log.get("result_code", 1)) != 1:
        raise OTConvergenceError(f"ot.emd2 stopped before optimality on a {mu.n}×{nu.n} problem "
                                 f"({log.get('warning')}); raise num_itermax")
    return float(max(float(value), 0.0) ** (1.0 / p))


def fedbary_on_measures(measures: Sequence[Measure], names: Sequence[str], config: FedBaryConfig,
                        target: Measure | None = None, seed: int = 0, datum_values: bool = False,
                        potential: str = "sinkhorn") -> FedBaryResult:
    """FedBary Algorithm 1 on clients given as (already label-augmented) measures, seeded exactly as
    :func:`~otfed.federation.fedbary.federated_valuation` (same ``seed`` and measures → same numbers), so
    that runs on modified measures share every random draw (γ_i^(0), X̃_Q^(0), the t's) with the original."""
    seeds = np.random.SeedSequence(seed).spawn(len(measures) + 1)
    clients = [BaryClient(name, m, config, np.random.default_rng(s)) for name, m, s in zip(names, measures, seeds)]
    server = BaryServer(config, np.random.default_rng(seeds[-1]), target=target)
    return fedbary(clients, server, datum_values=datum_values, potential=potential)  # type: ignore[arg-type]


def duplication_robustness(clients: list[LabelledData], validation: LabelledData, client: int,
                           copies: Sequence[int], datum_copies: int, config: FedBaryConfig, potential: str,
                           seed: int, seed_repeats: int = 0) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """FedBary table 3: the distance of client ``client`` to the target Q (the server's validation set) and
    to the federated barycenter when its data are duplicated — exact W_p(P_i, Q) (:func:`exact_wasserstein`)
    next to FedBary's estimates; every FedBary run uses the same seed (common random numbers), so a
    change is caused by the input, not by the random draws.

    Rows (``experiment``):
    * ``dataset``: the whole dataset appears ``copies`` times. ``stats="original"``: the client's augmented
      measure P_i (class statistics of its original data) with every atom repeated — the same measure, so
      the exact W is unchanged. ``stats="refit"``: the client duplicates its raw rows and re-estimates its
      class statistics on them; the unbiased covariances (÷ (n_c − 1)) then shrink by (n_c − 1)/n_c ·
      k n_c/(k n_c − 1), so the augmented points — and the exact W — move by O(1/n_c).
    * ``datum``: one datum appears ``datum_copies`` times (original statistics): the most valuable datum
      (most negative FedBary calibrated gradient g, eq. 10, computed client-side against η_{Q_i} in the run
      on the original data: moving mass to it decreases the distance) and the most harmful one (largest g).
      ``wp_change_first_order_bound`` = δ · g_l with exact (network-simplex) duals of W_p^p(P_i, Q), a lower
      bound on the exact ``exact_wp_change`` by convexity (:func:`mass_moved_by_duplication`).

    ``*_rel_change``: (value − value on the original data) / value on the original data. Also returns the
    client's FedBary distances for seeds seed, …, seed + seed_repeats − 1 on the original data (the
    estimate's seed-to-seed spread, to judge the size of a change)."""
    from otfed.valuation.calibrated import datum_values as calibrated_values

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

    base_run = fedbary_on_measures(measures, names, config, target, seed, datum_values=True, potential=potential)
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
    return rows, spread

__all__ = ["CONTRIBUTION_METHODS", "DETECTION_METHODS", "client_contributions", "client_sets",
           "contribution_percent", "detection_setting", "duplication_robustness", "exact_wasserstein",
           "fedavg_accuracy", "fedbary_config", "fedbary_on_measures", "knn_leave_one_out", "fedavg_utility",
           "mass_moved_by_duplication", "n_classes_of", "outlier_distances", "percent_of_total", "plant_noise",
           "project_federation", "rank_agreement", "removal_experiment", "repeated_dataset", "repeated_datum",
           "server_split", "suspicion_scores"]
