"""Datum values by calibrated gradients of the OT distance (FedBary eq. 10; LAVA, Just et al. 2023).

By OT duality W_p^p(P, Q) = max_{f, g} <f, a> + <g, b>, so the optimal dual potential f is the gradient
of W_p^p(P, Q) with respect to the masses a of P's atoms. Because a must stay on the simplex, only
differences of f are meaningful; FedBary (and LAVA) use the *calibrated gradient*

    g_l = f_l − Σ_{j≠l} f_j / (m − 1)                                              (FedBary eq. 10)

— the rate of change of the distance when a little mass moves to datum l from all other data equally.
g_l > 0: moving mass to datum l increases the distance to the target, so the datum is likely noisy.
It is invariant to f → f + c (the dual's only non-uniqueness for a non-degenerate problem).

Choice of potentials (``potential``):
- ``"sinkhorn"`` (default): the log-domain Sinkhorn potential f of the entropic problem
  (``otfed.ot.sinkhorn_log``, POT-equivalent to ``ot.sinkhorn(..., method="sinkhorn_log")``) with
  ε = ``eps_rel`` · mean(M), eps_rel = 0.1 by default. The entropic dual is unique up to a constant and
  smooth in the data; LAVA makes the same choice (geomloss Sinkhorn, ε = 0.1 on ||x − y||²/2).
- ``"exact"``: the network-simplex duals of POT ``ot.emd(a, b, M, log=True)`` (log["u"]). By
  complementary slackness f is the c-transform of g, f_l = min_j (M_lj − g_j). But for uniform measures
  of equal size the optimal plan is a permutation and the LP dual is far from unique: which vertex the
  simplex returns changes f by much more than a constant. Measured on the planted feature-noise data
  (5-D, 200 points, 40 noisy, seeds 0–2, direct train-vs-validation): exact duals flagged 42/36/75
  points (precision 0.91/0.89/0.43), Sinkhorn duals 45/37/42 (precision 0.89/0.95/0.79) with recall
  ≥ 0.83 for both. Hence the default.
"""
from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import ot

from otfed.errors import OTConvergenceError
from otfed.ot import Measure, cost_matrix, sinkhorn_log
from otfed.ot.exact import DEFAULT_NUM_ITERMAX

Potential = Literal["sinkhorn", "exact"]


def calibrated_gradient(f: np.ndarray) -> np.ndarray:
    """g_l = f_l − Σ_{j≠l} f_j / (m − 1) for every datum l — FedBary eq. 10 (LAVA eq. 4).

    Equivalently g = (1 + 1/(m−1)) f − Σ_j f_j/(m−1) = m/(m−1) · (f − mean f). Shift-invariant.
    For m = 2 and f = (a, b): g = (a − b, b − a).
    """
    f = np.asarray(f, dtype=np.float64)
    if f.ndim != 1:
        raise ValueError(f"potential must be a 1-D vector, got shape {f.shape}")
    m = f.shape[0]
    if m < 2:
        raise ValueError("a calibrated gradient needs at least 2 data points")
    if not np.all(np.isfinite(f)):
        raise ValueError("potential contains NaN or inf")
    return f - (f.sum() - f) / (m - 1)


def dual_potential(source: Measure, target: Measure, p: int = 2, potential: Potential = "sinkhorn",
                   eps_rel: float = 0.1, max_iter: int = 20_000, tol: float = 1e-6,
                   num_itermax: int = DEFAULT_NUM_ITERMAX) -> np.ndarray:
    """The dual potential f on ``source``'s atoms of OT(source, target) for the cost ||x − y||^p.

    ``potential="exact"``: network-simplex duals (POT ``ot.emd`` with ``log=True``); raises
    :class:`OTConvergenceError` when the solver stops before optimality. ``"sinkhorn"`` (default): log-domain
    Sinkhorn potential with ε = ``eps_rel`` · mean cost, run until the row-marginal L1 error ≤ ``tol``
    (raises when it does not converge within ``max_iter``). f is returned
    centred (mean 0); only its differences carry information.
    """
    if source.dim != target.dim:
        raise ValueError(f"measures live in different dimensions: {source.dim} vs {target.dim}")
    M = cost_matrix(source.support, target.support, p)
    if potential == "exact":
        scale = float(M.max()) if M.size and M.max() > 0 else 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            _, log = ot.emd(source.weights, target.weights, M / scale, numItermax=int(num_itermax), log=True)
        if int(log.get("result_code", 1)) != 1:
            raise OTConvergenceError(f"network simplex did not reach optimality ({log.get('warning')}); "
                                     f"increase num_itermax")
        f = np.asarray(log["u"], dtype=np.float64) * scale
    elif potential == "sinkhorn":
        eps = eps_rel * float(M.mean()) if M.mean() > 0 else eps_rel
        _, f, _, converged = sinkhorn_log(source.weights, target.weights, M, eps, max_iter=max_iter, tol=tol)
        if not converged:
            raise OTConvergenceError(f"Sinkhorn (ε = {eps:.3g}) did not converge in {max_iter} iterations; "
                                     f"raise eps_rel or max_iter")
    else:
        raise ValueError(f"unknown potential {potential!r}; allowed values: exact, sinkhorn")
    return f - f.mean()


def datum_values(private: Measure, reference: Measure, p: int = 2, potential: Potential = "sinkhorn",
                 **options) -> np.ndarray:
    """Calibrated gradients (FedBary eq. 10) of the atoms of ``private`` against ``reference``.

    FedBary: ``private`` = the client's P_i and ``reference`` = η_{Q_i}, the server's last interpolating
    measure (client-side, no data leaves the client). LAVA: ``reference`` = the validation set itself.
    Larger = more harmful; see :func:`flag_noisy` and :func:`rank_by_value`.
    """
    return calibrated_gradient(dual_potential(private, reference, p=p, potential=potential, **options))


def flag_noisy(values: np.ndarray) -> np.ndarray:
    """FedBary's detection rule: flag every datum with a positive calibrated gradient (boolean mask)."""
    return np.asarray(values, dtype=np.float64) > 0


def rank_by_value(values: np.ndarray) -> np.ndarray:
    """Indices ordered from most to least suspicious (descending calibrated gradient; ties by index)."""
    v = np.asarray(values, dtype=np.float64)
    return np.argsort(-v, kind="stable")


def most_suspicious(values: np.ndarray, count: int) -> np.ndarray:
    """Mask of the ``count`` data that :func:`rank_by_value` puts first (largest calibrated gradient; ties by
    index)."""
    mask = np.zeros(len(values), dtype=bool)
    mask[rank_by_value(values)[:count]] = True
    return mask


def budget_removal(values: np.ndarray, share: float) -> np.ndarray:
    """Removal by a budget: the ⌊share · n⌋ most suspicious of a client's n data (:func:`most_suspicious`)."""
    return most_suspicious(values, int(np.floor(share * len(values))))


def flagged_removal(values: np.ndarray, max_fraction: float = 1.0) -> np.ndarray:
    """FedBary's removal rule (table 4): every flagged datum (:func:`flag_noisy`, g > 0), at most the
    ⌊max_fraction · n⌋ most suspicious of them."""
    return most_suspicious(values, min(int(flag_noisy(values).sum()), int(np.floor(max_fraction * len(values)))))


def random_removal(masks: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Per client, as many data as ``masks[k]`` removes, drawn uniformly without replacement (the random
    reference of a removal rule); clients drawn in order."""
    out = []
    for m in masks:
        r = np.zeros(len(m), dtype=bool)
        r[rng.choice(len(m), int(m.sum()), replace=False)] = True
        out.append(r)
    return out
