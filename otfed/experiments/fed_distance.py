"""The experiments of stage ``fed_distance`` (FedWaD §5), as pure functions returning table rows.

* :func:`toy_case` — FedWaD fig. 2/8/9: time and relative error vs n of approximate FedWaD, exact-
  interpolation FedWaD and the exact W (POT network simplex) on two Gaussians.
* :func:`toy_convergence` — FedWaD fig. 3: A^k per iteration.
* :func:`otdd_pair` — FedWaD fig. 6: federated vs exact OTDD between two labelled datasets.
* :func:`clustering_scores` — FedWaD §5 "boosting FL": spectral clustering of clients from their
  pairwise federated OTDDs, scored by ARI against the planted groups.

Each function is one unit of fan-out work (a Prefect task in ``flows/fed_distance.py``).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from otfed.clustering import spectral_clusters
from otfed.errors import SupportGrowthError
from otfed.federation import FedWaDConfig, LabelledData, federated_otdd, federated_wasserstein
from otfed.metrics import adjusted_rand_index
from otfed.ot import otdd_exact, wasserstein

GAUSSIAN_MEAN_SHIFT = 4.0
EXACT_SUPPORT_CAP = 10  # exact-interpolation FedWaD gives up once ξ has more than 10·n atoms


def gaussian_pair(n: int, ratio: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """μ: n samples of N(0, I_d); ν: n // ratio samples of N(m, I_d) with ||m|| = 4 (m = 4/√d · 1).

    Same covariance, different means: the population W2 is exactly 4 (SPEC §2; compare FedWaD to the
    *empirical* exact W, which is larger for small n in high dimension).
    """
    if n < 1 or ratio < 1 or n // ratio < 1:
        raise ValueError(f"need n ≥ ratio ≥ 1 (got n={n}, ratio={ratio})")
    x_mu = rng.standard_normal((n, dim))
    x_nu = rng.standard_normal((n // ratio, dim)) + GAUSSIAN_MEAN_SHIFT / np.sqrt(dim)
    return x_mu, x_nu


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


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
    exact, t_exact = _timed(wasserstein, x_mu, x_nu, p=2)
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
            result, secs = _timed(federated_wasserstein, x_mu, x_nu, config, seed=seed + repeat)
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
    return [dict(dim=dim, n=n, support=support, interpolation=interpolation,
                 t="random" if t is None else t, setting=label, iteration=k + 1, A=a, exact=exact,
                 rel_gap=(a - exact) / exact)
            for k, a in enumerate(result.history)]


def otdd_pair(a: LabelledData, b: LabelledData, config: FedWaDConfig, seed: int,
              diagonal: bool = True) -> dict[str, Any]:
    """Federated OTDD (FedWaD on augmented samples) next to the exact OTDD on the same samples."""
    fed, t_fed = _timed(federated_otdd, a, b, config, seed=seed, diagonal=diagonal)
    exact, t_exact = _timed(otdd_exact, a.x, a.y, b.x, b.y, diagonal=diagonal)
    return dict(a=a.name, b=b.name, federated=fed.estimate, exact=exact, seconds_federated=t_fed,
                seconds_exact=t_exact, bytes=fed.ledger.total_bytes, messages=len(fed.ledger.entries))


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
