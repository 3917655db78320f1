"""Data-valuation baselines with direct data access (FedBary §5.2 compares against them).

One small interface: a valuation object is configured in its constructor and ``fit(data) → values``
returns one value per player, where the players are the rows of ``data.x`` (training points — or, for a
client-level game such as the paper's FedAvg-utility Shapley values, one row per client, with a utility
that maps row indices to clients). Larger value = more valuable, except :class:`Lava`, whose calibrated
gradients are larger for more *harmful* points (as in FedBary; rank descending to find noise).

- :class:`ExactShapley` — φ_i = Σ_{S ⊆ N∖{i}} |S|!(N−|S|−1)!/N! · (u(S ∪ {i}) − u(S)) over all 2^N
  coalitions (Shapley 1953), any utility u.
- :class:`LeaveOneOut` — v_i = u(N) − u(N ∖ {i}).
- :class:`PermutationShapley` — Monte-Carlo Shapley: mean marginal contribution over random
  permutations (Castro et al. 2009; Ghorbani & Zou 2019 without truncation).
- :class:`TruncatedMonteCarloShapley` — TMC-Shapley (Ghorbani & Zou 2019, alg. 1; "DataSV" in FedBary
  §5.1): the same permutations, each scanned only until the prefix's utility is within a tolerance of u(N).
- :class:`KNNShapley` — exact Shapley values of the K-nearest-neighbour utility by the closed-form
  recursion of Jia et al. (2019, theorem 1), O(N log N) per validation point.
- :func:`knn_leave_one_out` — leave-one-out values of the same utility in one pass.
- :class:`Lava` — LAVA (Just et al. 2023): calibrated gradients (FedBary eq. 10) of OT between the
  label-augmented training set and the label-augmented validation set (the same computation FedBary
  does federatedly against η_{Q_i}).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import factorial
from typing import Callable, Protocol

import numpy as np

from otfed.ot.otdd import LabelledData, augmented_measure
from otfed.valuation.calibrated import Potential, datum_values


@dataclass(frozen=True, eq=False)
class ValuationData:
    """Training points (x, y) — the players — and a validation set (x_val, y_val) for utilities."""

    x: np.ndarray
    y: np.ndarray
    x_val: np.ndarray | None = None
    y_val: np.ndarray | None = None

    def __post_init__(self) -> None:
        x = np.asarray(self.x)
        y = np.asarray(self.y)
        if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ValueError(f"x must be (n, d) and y (n,), got {x.shape} and {y.shape}")
        object.__setattr__(self, "x", x)
        object.__setattr__(self, "y", y)
        if (self.x_val is None) != (self.y_val is None):
            raise ValueError("give both x_val and y_val, or neither")
        if self.x_val is not None:
            xv, yv = np.asarray(self.x_val), np.asarray(self.y_val)
            if xv.ndim != 2 or yv.ndim != 1 or xv.shape[0] != yv.shape[0] or xv.shape[1] != x.shape[1]:
                raise ValueError(f"x_val must be (m, {x.shape[1]}) and y_val (m,), got {xv.shape} and {yv.shape}")
            object.__setattr__(self, "x_val", xv)
            object.__setattr__(self, "y_val", yv)

    @property
    def n(self) -> int:
        """Number of players (training rows)."""
        return int(self.x.shape[0])

    def require_validation(self, who: str) -> tuple[np.ndarray, np.ndarray]:
        if self.x_val is None or self.y_val is None:
            raise ValueError(f"{who} needs a validation set (x_val, y_val)")
        return self.x_val, self.y_val


#: A utility: (data, indices of the players in the coalition) → u(coalition). Must accept an empty index
#: array (u(∅)).
Utility = Callable[[ValuationData, np.ndarray], float]


class DataValuation(Protocol):
    """The common interface: configure in the constructor, then ``fit(data)`` → one value per player."""

    def fit(self, data: ValuationData) -> np.ndarray: ...


# ----------------------------------------------------------------------------------------------------
# utility-based methods


def _coalition(mask: int, n: int) -> np.ndarray:
    return np.array([i for i in range(n) if mask >> i & 1], dtype=np.intp)


class ExactShapley:
    """Exact Shapley values φ_i = Σ_{S ⊆ N∖{i}} |S|!(N−|S|−1)!/N! [u(S ∪ {i}) − u(S)] (Shapley 1953).

    Evaluates u on all 2^N coalitions once (bitmask cache); refuses N > ``max_players``.
    """

    def __init__(self, utility: Utility, max_players: int = 16) -> None:
        self.utility = utility
        self.max_players = max_players

    def fit(self, data: ValuationData) -> np.ndarray:
        n = data.n
        if n > self.max_players:
            raise ValueError(f"exact Shapley over {n} players needs 2^{n} utility calls "
                             f"(max_players={self.max_players}); use PermutationShapley")
        u = np.array([float(self.utility(data, _coalition(mask, n))) for mask in range(1 << n)])
        sizes = np.array([bin(mask).count("1") for mask in range(1 << n)])
        coef = np.array([factorial(s) * factorial(n - s - 1) / factorial(n) for s in range(n)])
        values = np.zeros(n)
        for i in range(n):
            bit = 1 << i
            without = np.array([m for m in range(1 << n) if not m & bit])
            values[i] = float(np.sum(coef[sizes[without]] * (u[without | bit] - u[without])))
        return values


class LeaveOneOut:
    """Leave-one-out values v_i = u(N) − u(N ∖ {i})."""

    def __init__(self, utility: Utility) -> None:
        self.utility = utility

    def fit(self, data: ValuationData) -> np.ndarray:
        everyone = np.arange(data.n)
        full = float(self.utility(data, everyone))
        return np.array([full - float(self.utility(data, np.delete(everyone, i))) for i in range(data.n)])


class PermutationShapley:
    """Monte-Carlo permutation Shapley: φ̂_i = mean over random permutations π of
    u(pre_π(i) ∪ {i}) − u(pre_π(i)), an unbiased estimate of the Shapley value (Castro et al. 2009).

    Exact for additive games with any number of permutations. ``n_permutations`` × (N + 1) utility calls.
    """

    def __init__(self, utility: Utility, n_permutations: int = 100, seed: int = 0) -> None:
        if n_permutations < 1:
            raise ValueError("n_permutations must be ≥ 1")
        self.utility = utility
        self.n_permutations = n_permutations
        self.seed = seed

    def fit(self, data: ValuationData) -> np.ndarray:
        return _mean_marginals(self.utility, data, self.n_permutations, self.seed, full=None, threshold=0.0)


def _mean_marginals(utility: Utility, data: ValuationData, n_permutations: int, seed: int, full: float | None,
                    threshold: float) -> np.ndarray:
    """Mean over ``n_permutations`` random permutations (``seed``) of the marginals u(pre ∪ {i}) − u(pre);
    with ``full`` = u(N), a permutation stops once |full − u(prefix)| < ``threshold`` (the rest get 0)."""
    rng = np.random.default_rng(seed)
    n = data.n
    total = np.zeros(n)
    for _ in range(n_permutations):
        order = rng.permutation(n)
        previous = float(utility(data, order[:0]))
        for pos in range(n):
            if full is not None and abs(full - previous) < threshold:
                break
            current = float(utility(data, order[: pos + 1]))
            total[order[pos]] += current - previous
            previous = current
    return total / n_permutations


class TruncatedMonteCarloShapley:
    """TMC-Shapley (Ghorbani & Zou 2019, "Data Shapley", alg. 1): :class:`PermutationShapley`'s estimate
    φ̂_i = mean over random permutations π of u(pre_π(i) ∪ {i}) − u(pre_π(i)), except that a permutation is
    scanned only while |u(N) − u(prefix)| ≥ ``tolerance`` · |u(N)|: once the prefix is that close to the
    whole set's utility, the remaining players get marginal 0 without evaluation.

    Draws the same permutations as :class:`PermutationShapley` with the same ``seed`` (so ``tolerance=0``,
    where the strict test never truncates, gives the same values) and evaluates u(N) once more. A fixed
    ``n_permutations`` replaces the paper's convergence check. Each truncated permutation leaves out
    marginals that sum to u(N) − u(prefix), less than ``tolerance`` · |u(N)| in absolute value.
    """

    def __init__(self, utility: Utility, n_permutations: int = 100, tolerance: float = 0.01, seed: int = 0) -> None:
        if n_permutations < 1:
            raise ValueError("n_permutations must be ≥ 1")
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be ≥ 0, got {tolerance}")
        self.utility = utility
        self.n_permutations = n_permutations
        self.tolerance = tolerance
        self.seed = seed

    def fit(self, data: ValuationData) -> np.ndarray:
        full = float(self.utility(data, np.arange(data.n)))
        return _mean_marginals(self.utility, data, self.n_permutations, self.seed, full=full,
                               threshold=self.tolerance * abs(full))


# ----------------------------------------------------------------------------------------------------
# utilities


def _sorted_neighbours(x: np.ndarray, x_val: np.ndarray) -> np.ndarray:
    """For each validation point, training indices sorted by Euclidean distance (ties by index)."""
    d2 = ((x_val[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)
    return np.argsort(d2, axis=1, kind="stable")


def knn_utility(k: int) -> Utility:
    """The K-NN utility of Jia et al. (2019): the mean over validation points of
    (1/K) Σ_{j=1}^{min(K, |S|)} 1[y_{α_j(S)} = y_val], α_j(S) the j-th nearest neighbour within S
    (Euclidean, ties by index); u(∅) = 0."""
    if k < 1:
        raise ValueError("k must be ≥ 1")

    def utility(data: ValuationData, coalition: np.ndarray) -> float:
        x_val, y_val = data.require_validation("knn_utility")
        coalition = np.asarray(coalition, dtype=np.intp)
        if coalition.size == 0:
            return 0.0
        order = _sorted_neighbours(data.x[coalition], x_val)[:, :k]
        return float(np.mean((data.y[coalition][order] == y_val[:, None]).sum(axis=1) / k))

    return utility


def classifier_accuracy(make_model: Callable[[], object]) -> Utility:
    """Validation accuracy of ``make_model()`` (scikit-learn style) fitted on the coalition's points.

    An empty coalition scores 0 (no model); a single-class coalition predicts that class.
    """

    def utility(data: ValuationData, coalition: np.ndarray) -> float:
        x_val, y_val = data.require_validation("classifier_accuracy")
        coalition = np.asarray(coalition, dtype=np.intp)
        if coalition.size == 0:
            return 0.0
        y = data.y[coalition]
        classes = np.unique(y)
        if classes.size == 1:
            return float(np.mean(y_val == classes[0]))
        model = make_model()
        model.fit(data.x[coalition], y)  # type: ignore[attr-defined]
        return float(np.mean(model.predict(x_val) == y_val))  # type: ignore[attr-defined]

    return utility


# ----------------------------------------------------------------------------------------------------
# data-based methods


class KNNShapley:
    """Exact Shapley values of :func:`knn_utility` by the recursion of Jia et al. (2019, theorem 1):
    with training points sorted by distance to a validation point (α_1 nearest, …, α_N farthest),

        s_{α_N} = 1[y_{α_N} = y_val] / N,
        s_{α_i} = s_{α_{i+1}} + (1[y_{α_i} = y_val] − 1[y_{α_{i+1}} = y_val]) / K · min(K, i) / i,

    averaged over the validation points.
    """

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError("k must be ≥ 1")
        self.k = k

    def fit(self, data: ValuationData) -> np.ndarray:
        x_val, y_val = data.require_validation("KNNShapley")
        n, k = data.n, self.k
        order = _sorted_neighbours(data.x, x_val)
        values = np.zeros(n)
        ranks = np.arange(1, n + 1)
        factor = np.minimum(k, ranks[:-1]) / ranks[:-1]  # for i = 1..N−1
        for row, yv in zip(order, y_val):
            match = (data.y[row] == yv).astype(np.float64)
            s = np.empty(n)
            s[n - 1] = match[n - 1] / n
            increments = (match[:-1] - match[1:]) / k * factor
            # s_i = s_N + Σ_{j=i}^{N−1} increments_j
            s[:-1] = s[n - 1] + np.cumsum(increments[::-1])[::-1]
            values[row] += s
        return values / len(y_val)


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


class Lava:
    """LAVA (Just et al. 2023): calibrated gradients (FedBary eq. 10) of OT(train, validation) on
    label-augmented samples, each set augmented with its own class statistics — direct data access.

    Values are larger for more harmful points (flag g > 0, rank descending).
    """

    def __init__(self, p: int = 2, potential: Potential = "sinkhorn", diagonal: bool = True, **options) -> None:
        self.p = p
        self.potential = potential
        self.diagonal = diagonal
        self.options = options

    def fit(self, data: ValuationData) -> np.ndarray:
        x_val, y_val = data.require_validation("Lava")
        train = augmented_measure(LabelledData("train", data.x, data.y), diagonal=self.diagonal)
        valid = augmented_measure(LabelledData("validation", x_val, y_val), diagonal=self.diagonal)
        return datum_values(train, valid, p=self.p, potential=self.potential, **self.options)
