"""Datum values by calibrated gradients of the OT distance (FedBary eq. 10; LAVA, Just et al. 2023).

By OT duality W_p^p(P, Q) = max_{f, g} <f, a> + <g, b>, so the optimal dual potential f is the gradient
of W_p^p(P, Q) with respect to the masses a of P's atoms. Because a must stay on the simplex, only
differences of f are meaningful; FedBary (and LAVA) use the *calibrated gradient*

    g_l = f_l − Σ_{j≠l} f_j / (m − 1)                                              (FedBary eq. 10)

— the rate of change of the distance when a little mass moves to datum l from all other data equally.
g_l > 0: moving mass to datum l increases the distance to the target, so the datum is likely noisy.
It is invariant to f → f + c (the dual's only non-uniqueness for a non-degenerate problem).

Choice of potentials (``potential``):
- ``"sinkhorn"`` (default): the dual potential f of the entropic problem min <P, M> + ε Σ P (log P − 1) — the
  fixed point of Sinkhorn's iterations, P_ij = exp((f_i + g_j − M_ij)/ε) — with ε = ``eps_rel`` · mean(M),
  eps_rel = 0.1 by default. The entropic dual is unique up to a constant and smooth in the data; LAVA makes the
  same choice (geomloss Sinkhorn, ε = 0.1 on ||x − y||²/2). It is computed by damped Newton ascent on the
  semi-dual of the smaller side with ε annealed down to its value (:func:`otfed.ot.semidual.entropic_potentials`),
  stopping on the quantity the values depend on: the oscillation max − min of the next Newton step, i.e. the
  change still to come in the centred potential, ≤ ``tol`` · mean(M). Sinkhorn itself (POT's
  ``sinkhorn_log``, stopping on its column-marginal error ≤ 1e-6) left the calibrated gradients of a
  3-client × 60-point FedBary session up to 3.2e-3 of the largest value away from converged ones after up to
  6,290 iterations (the marginal error shrinks slowly and says little about the potentials); Newton steps are
  within 3.2e-9 of them after 5–7 steps (``studies/datum_values.py``). :class:`PotentialConvergence` reports
  the steps, the final criterion and whether it met ``tol``.
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
from dataclasses import dataclass
from typing import Literal

import numpy as np
import ot

from otfed.errors import OTConvergenceError
from otfed.ot import Measure, cost_matrix
from otfed.ot.exact import DEFAULT_NUM_ITERMAX
from otfed.ot.semidual import entropic_potentials

Potential = Literal["sinkhorn", "exact"]


def calibrated_gradient(f: np.ndarray) -> np.ndarray:
    """g_l = f_l − Σ_{j≠l} f_j / (m − 1) for every datum l — FedBary eq. 10 (LAVA eq. 4).

    Equivalently g = (1 + 1/(m−1)) f − Σ_j f_j/(m−1) = m/(m−1) · (f − mean f). Shift-invariant.
    For m = 2 and f = (a, b): g = (a − b, b − a).

    Parameters:
        f: the dual potential on the m ≥ 2 data points, a finite 1-D array (:func:`dual_potential`).

    Returns:
        The m calibrated gradients g, a float64 array; g_l > 0 marks a datum whose extra mass would increase
        the distance.

    Raises ValueError for a potential that is not 1-D, has fewer than 2 entries, or holds NaN / inf.

    By hand: m = 2 gives (a − b, b − a); for f = (1, 4, 7), g_1 = 1 − (4 + 7)/2 = −4.5, g_2 = 4 − (1 + 7)/2 = 0,
    g_3 = 7 − (1 + 4)/2 = 4.5, and adding a constant to f changes nothing:

    >>> calibrated_gradient(np.array([1.0, 4.0])).tolist()
    [-3.0, 3.0]
    >>> calibrated_gradient(np.array([1.0, 4.0, 7.0])).tolist()
    [-4.5, 0.0, 4.5]
    >>> calibrated_gradient(np.array([1.0, 4.0, 7.0]) + 5.0).tolist()
    [-4.5, 0.0, 4.5]
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


@dataclass(frozen=True)
class PotentialConvergence:
    """How far a dual potential (and so the datum values computed from it) can be trusted.

    ``potential``: ``"sinkhorn"`` or ``"exact"``. ``iterations``: the Newton steps taken for the entropic
    potential (over all ε stages); None for the network simplex (POT does not report its pivots).
    ``criterion``: for ``"sinkhorn"``, the oscillation max − min of the next Newton step divided by mean(M) —
    the change still to come in the centred potential, relative to the mean cost (Newton converges
    quadratically, so this is the remaining error to leading order, and the calibrated gradients would move by at
    most m/(m − 1) · criterion · mean(M)); 0 for the exact duals, which the simplex certifies optimal.
    ``tol``: the threshold it was held to. ``converged``: ``criterion`` ≤ ``tol``."""

    potential: str
    iterations: int | None
    criterion: float
    tol: float
    converged: bool


@dataclass(frozen=True)
class DualPotential:
    """A centred dual potential ``f`` (one entry per source atom, mean 0) and its :class:`PotentialConvergence`."""

    f: np.ndarray
    convergence: PotentialConvergence


def solve_dual_potential(source: Measure, target: Measure, p: int = 2, potential: Potential = "sinkhorn",
                         eps_rel: float = 0.1, max_iter: int = 1000, tol: float = 1e-9,
                         num_itermax: int = DEFAULT_NUM_ITERMAX) -> DualPotential:
    """:func:`dual_potential` with its convergence report, without raising when the entropic potential missed
    ``tol`` (:attr:`PotentialConvergence.converged` is then False).

    Parameters:
        source, target: the measures (as :func:`dual_potential`); f lives on ``source``'s atoms.
        p: the ground cost ||x − y||^p, p ∈ {1, 2}.
        potential: ``"sinkhorn"`` (default, entropic) or ``"exact"`` (network simplex).
        eps_rel: the entropic ε relative to the mean cost (> 0).
        max_iter: the cap on Newton steps for the entropic potential (≥ 1).
        tol: the stopping threshold on the potential's remaining change, relative to the mean cost (> 0).
        num_itermax: the network simplex's iteration cap.

    Returns:
        A :class:`DualPotential`: f centred, and how far it is from converged.

    The entropic potential solves its optimality condition: the plan exp((f ⊕ g − M)/ε) with g the soft
    c-transform of f has both marginals, and the report says so:

    >>> from scipy.special import logsumexp
    >>> rng = np.random.default_rng(0)
    >>> source, target = Measure.uniform(rng.normal(size=(40, 2))), Measure.uniform(rng.normal(size=(30, 2)))
    >>> sol = solve_dual_potential(source, target)
    >>> sol.convergence.converged, sol.convergence.criterion <= 1e-9
    (True, True)
    >>> M = cost_matrix(source.support, target.support, 2)
    >>> eps = 0.1 * M.mean()
    >>> g = eps * (np.log(target.weights) - logsumexp((sol.f[:, None] - M) / eps, axis=0))
    >>> bool(np.allclose(np.exp((sol.f[:, None] + g[None, :] - M) / eps).sum(axis=1), source.weights))
    True
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
        return DualPotential(f - f.mean(), PotentialConvergence("exact", None, 0.0, 0.0, True))
    if potential != "sinkhorn":
        raise ValueError(f"unknown potential {potential!r}; allowed values: exact, sinkhorn")
    scale = float(M.mean()) if M.mean() > 0 else 1.0
    eps = eps_rel * scale
    if not eps > 0:
        raise ValueError(f"eps_rel must be > 0, got {eps_rel!r}")
    if int(max_iter) < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    sol = entropic_potentials(source.weights, target.weights, M, eps, step_tol=tol * scale,
                              max_newton=int(max_iter))
    # entropic_potentials' f is the potential of ε KL(P | a⊗b); the potential of ε Σ P (log P − 1), whose plan
    # is exp((f_i + g_j − M_ij)/ε), is f + ε log a (the same up to a constant for uniform weights)
    f = sol.f + eps * np.log(source.weights)
    report = PotentialConvergence("sinkhorn", sol.newton_steps, sol.step / scale, float(tol), sol.step <= tol * scale)
    return DualPotential(f - f.mean(), report)


def dual_potential(source: Measure, target: Measure, p: int = 2, potential: Potential = "sinkhorn",
                   eps_rel: float = 0.1, max_iter: int = 1000, tol: float = 1e-9,
                   num_itermax: int = DEFAULT_NUM_ITERMAX) -> np.ndarray:
    """The dual potential f on ``source``'s atoms of OT(source, target) for the cost ||x − y||^p.

    ``potential="exact"``: network-simplex duals (POT ``ot.emd`` with ``log=True``); raises
    :class:`OTConvergenceError` when the solver stops before optimality. ``"sinkhorn"`` (default): the entropic
    potential with ε = ``eps_rel`` · mean cost, so that the entropic plan is P_ij = exp((f_i + g_j − M_ij)/ε)
    (the fixed point of Sinkhorn's iterations, POT's ``f = ε log u``), computed by damped Newton steps on the
    semi-dual with ε annealed (:func:`otfed.ot.semidual.entropic_potentials`), at most ``max_iter`` of them. It
    stops once the next Newton step would change the centred potential by at most ``tol`` · mean cost
    (oscillation max − min of the step) — the quantity the datum values depend on — and raises
    :class:`OTConvergenceError` when that is not reached. f is returned centred (mean 0); only its differences
    carry information. :func:`solve_dual_potential` also returns the convergence report. A Newton step costs
    O(n·m·k + k³) for n and m atoms, k = min(n, m) — cheap against FedBary's η_Q (S atoms) or a validation set of
    a few hundred, costly when both measures are large.

    Parameters:
        source: the measure whose atoms get potentials (FedBary: the client's P_i).
        target: the measure it is transported to (FedBary: the last η_{Q_i}; LAVA: the validation set).
        p: the ground cost ||x − y||^p, p ∈ {1, 2}; the potentials are those of W_p^p.
        potential: ``"sinkhorn"`` (default, entropic) or ``"exact"`` (network simplex).
        eps_rel: the entropic ε relative to the mean cost (> 0).
        max_iter: the cap on Newton steps for the entropic potential (≥ 1).
        tol: the stopping threshold on the potential's remaining change, relative to the mean cost (> 0).
        num_itermax: the network simplex's iteration cap.

    Returns:
        f, a float64 array with one entry per atom of ``source``, centred (mean 0).

    Raises ValueError for measures of different dimensions, an unknown ``potential``, ε ≤ 0, ``max_iter`` < 1 or
    ``tol`` ≤ 0.

    By LP duality f_l − f_k is the derivative of W_p^p when mass moves from atom k to atom l (FedBary eq. 9) —
    here against finite differences of POT's exact ``ot.emd2`` on a non-degenerate problem (one split row):

    >>> import ot
    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.5], [2.5]])
    >>> f = dual_potential(Measure.uniform(x), Measure.uniform(y), potential="exact")
    >>> a, b, M = np.full(3, 1 / 3), np.full(2, 1 / 2), ot.dist(x, y)
    >>> def slope(k, l, step=1e-4):  # d W₂² / d(mass moved from atom k to atom l)
    ...     moved = a.copy()
    ...     moved[k], moved[l] = moved[k] - step, moved[l] + step
    ...     return (ot.emd2(moved, b, M) - ot.emd2(a, b, M)) / step
    >>> bool(np.isclose(slope(1, 0), f[0] - f[1], atol=1e-8)), bool(np.isclose(slope(1, 2), f[2] - f[1]))
    (True, True)
    >>> np.round(f, 6).tolist()
    [0.666667, 0.666667, -1.333333]

    Against a single Dirac every plan is a ⊗ δ, so both potentials are the costs to it, centred:

    >>> source = Measure.uniform(np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.2], [3.0, 4.0]]))
    >>> cost = (source.support ** 2).sum(axis=1)
    >>> bool(np.allclose(dual_potential(source, Measure.uniform(np.zeros((1, 2)))), cost - cost.mean()))
    True
    """
    sol = solve_dual_potential(source, target, p=p, potential=potential, eps_rel=eps_rel, max_iter=max_iter,
                               tol=tol, num_itermax=num_itermax)
    c = sol.convergence
    if not c.converged:
        raise OTConvergenceError(f"entropic potential (eps_rel = {eps_rel:g}) did not converge in {c.iterations} "
                                 f"Newton steps (remaining change {c.criterion:.3g} of the mean cost ≥ tol {tol:g}); "
                                 f"raise eps_rel or max_iter")
    return sol.f


def datum_values(private: Measure, reference: Measure, p: int = 2, potential: Potential = "sinkhorn",
                 with_convergence: bool = False, **options) -> np.ndarray | tuple[np.ndarray, PotentialConvergence]:
    """Calibrated gradients (FedBary eq. 10) of the atoms of ``private`` against ``reference``.

    FedBary: ``private`` = the client's P_i and ``reference`` = η_{Q_i}, the server's last interpolating
    measure (client-side, no data leaves the client). LAVA: ``reference`` = the validation set itself.
    Larger = more harmful; see :func:`flag_noisy` and :func:`rank_by_value`.

    Parameters:
        private: the client's data as a measure (≥ 2 atoms), e.g. label-augmented
            (:func:`otfed.ot.otdd.augmented_measure`).
        reference: the measure it is compared with, of the same dimension.
        p: the ground cost ||x − y||^p, p ∈ {1, 2}.
        potential: ``"sinkhorn"`` (default) or ``"exact"`` (:func:`dual_potential`).
        with_convergence: also return the potential's :class:`PotentialConvergence`, and do not raise when the
            entropic potential missed its tolerance (the report says so).
        options: passed to :func:`dual_potential` (``eps_rel``, ``max_iter``, ``tol``, ``num_itermax``).

    Returns:
        One calibrated gradient per atom of ``private`` (float64), larger = more harmful (:func:`flag_noisy`,
        :func:`calibrated_threshold`); with ``with_convergence``, the pair (values, convergence report).

    Raises as :func:`dual_potential` and :func:`calibrated_gradient`.

    Closed form: against a single Dirac r the potential is f_l = ||x_l − r||² up to a constant, so the values
    are m/(m − 1) · (c − mean c) with c the squared distances to r — the planted outlier at (3, 4) alone is
    positive, for both potentials:

    >>> private = Measure.uniform(np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.2], [3.0, 4.0]]))
    >>> reference = Measure.uniform(np.zeros((1, 2)))
    >>> c = (private.support ** 2).sum(axis=1)
    >>> values = datum_values(private, reference)
    >>> bool(np.allclose(values, 4 / 3 * (c - c.mean())))
    True
    >>> bool(np.allclose(datum_values(private, reference, potential="exact"), values))
    True
    >>> flag_noisy(values).tolist()
    [False, False, False, True]
    """
    if not with_convergence:
        return calibrated_gradient(dual_potential(private, reference, p=p, potential=potential, **options))
    sol = solve_dual_potential(private, reference, p=p, potential=potential, **options)
    return calibrated_gradient(sol.f), sol.convergence


def flag_noisy(values: np.ndarray, threshold: float = 0.0) -> np.ndarray:
    """Flag every datum whose calibrated gradient exceeds ``threshold`` (boolean mask).

    ``threshold=0`` is FedBary's rule g > 0 (§4.3): flag a datum when moving a little mass to it from all the
    client's other data would *increase* its distance to the target (the positive side of eq. 10's calibrated
    gradient). It controls no error rate. The values of one client (uniform weights) sum to 0 — eq. 10 centres
    them — so g > 0 flags roughly the upper half of *every* client, noisy or clean (46.8% of the clean clients'
    rows in ``studies/datum_values.py``: 8-D, 3 classes, 6 clients × 150 rows, 3 with 40% flipped labels); it
    ranks, it does not test. For a stated false-positive rate pass
    ``threshold=calibrated_threshold(calibration_values, alpha)``, the (1 − α) conformal quantile of the values of clean data valued the same way — the recommended rule
    (:func:`calibrated_threshold`, with its assumptions); or flag a fixed budget (:func:`budget_removal`).

    Parameters:
        values: calibrated gradients (FedBary eq. 10), e.g. :func:`datum_values`.
        threshold: flag values strictly above it; 0 (default) is FedBary's g > 0.

    Returns:
        A boolean array, True where the value is > ``threshold`` (equality is not flagged).

    >>> flag_noisy(np.array([-1.5, 0.0, 2.0, 1e-9])).tolist()
    [False, False, True, True]
    >>> flag_noisy(np.array([-1.5, 0.0, 2.0, 1e-9]), threshold=1.0).tolist()
    [False, False, True, False]
    """
    return np.asarray(values, dtype=np.float64) > float(threshold)


def calibrated_threshold(calibration_values: np.ndarray, alpha: float = 0.05) -> float:
    """The split-conformal (1 − α) threshold for :func:`flag_noisy`: the k-th smallest of the n values of clean
    calibration data, k = ⌈(n + 1)(1 − α)⌉; +inf when k > n (too few calibration values for this α — nothing is
    flagged) (Vovk, Gammerman & Shafer 2005; Angelopoulos & Bates 2021, §1.1).

    The guarantee: a score exchangeable with the n calibration scores exceeds this threshold with probability
    ≤ α. The calibration values must come from clean data valued the same way as a client's: in FedBary the
    server splits its validation set (:func:`otfed.valuation.detection.split_validation`), keeps one part as the
    target Q and runs the other through the same session as one more client (its values, eq. 10, against its own
    η_Q). The clean rows of a client are then exchangeable with the calibration rows only approximately — when
    the client's clean data and the calibration part come from the same distribution with about the same number
    of rows (eq. 10 centres every client's values, so they depend on the client's whole dataset): the false-
    positive rate on clean clients is ≈ α, not ≤ α surely; ``studies/datum_values.py`` measures it. It is a
    false-positive rate per datum of a clean client, not a family-wise one, and it says nothing about the
    detection rate, which depends on how far the noise moves a datum's value.

    Parameters:
        calibration_values: the datum values of clean calibration data (a finite 1-D array, n ≥ 1).
        alpha: the targeted false-positive rate, in (0, 1).

    Returns:
        The threshold τ; flag with ``flag_noisy(values, τ)``.

    Raises ValueError for an empty or non-finite calibration set or α outside (0, 1).

    By hand: with the 19 values 1, …, 19 and α = 0.1, k = ⌈20 · 0.9⌉ = 18, τ = 18; α = 0.01 needs k = 20 > 19:

    >>> calibrated_threshold(np.arange(1.0, 20.0), alpha=0.1)
    18.0
    >>> calibrated_threshold(np.arange(1.0, 20.0), alpha=0.01)
    inf
    """
    v = np.sort(np.asarray(calibration_values, dtype=np.float64).reshape(-1))
    if v.size == 0 or not np.all(np.isfinite(v)):
        raise ValueError(f"calibration values must be a non-empty finite array, got {v.size} values")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    k = int(np.ceil((v.size + 1) * (1.0 - alpha) - 1e-12))
    return float(v[k - 1]) if k <= v.size else float("inf")


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


def flagged_removal(values: np.ndarray, max_fraction: float = 1.0, threshold: float = 0.0) -> np.ndarray:
    """FedBary's removal rule (table 4): every flagged datum (:func:`flag_noisy`; ``threshold`` 0: g > 0, or a
    :func:`calibrated_threshold`), at most the ⌊max_fraction · n⌋ most suspicious of them."""
    flagged = int(flag_noisy(values, threshold).sum())
    return most_suspicious(values, min(flagged, int(np.floor(max_fraction * len(values)))))


def random_removal(masks: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    """Per client, as many data as ``masks[k]`` removes, drawn uniformly without replacement (the random
    reference of a removal rule); clients drawn in order."""
    out = []
    for m in masks:
        r = np.zeros(len(m), dtype=bool)
        r[rng.choice(len(m), int(m.sum()), replace=False)] = True
        out.append(r)
    return out
