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
    """Training points (x, y) — the players — and a validation set (x_val, y_val) for utilities.

    Parameters:
        x: the players' features, an (n, d) array (one row per player: a training point, or a client).
        y: their n labels.
        x_val, y_val: the validation set, (m, d) and (m,), or both None (utilities that need none).

    Raises ValueError for shapes that do not match, or only one of ``x_val`` and ``y_val``.
    """

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

    Parameters:
        utility: u, a :data:`Utility` — (data, indices of a coalition) → float, defined on the empty coalition.
        max_players: the largest N accepted (2^N utility calls).

    Closed forms: in an additive game u(S) = Σ_{i∈S} w_i every player's Shapley value is its own worth w_i; in
    the symmetric majority game (u = 1 from two players of three) each gets 1/3 (symmetry and efficiency):

    >>> worth = np.array([1.0, 2.0, 3.5, -0.5])
    >>> additive = lambda data, coalition: float(worth[coalition].sum())
    >>> np.round(ExactShapley(additive).fit(ValuationData(np.zeros((4, 1)), np.zeros(4))), 12).tolist()
    [1.0, 2.0, 3.5, -0.5]
    >>> majority = lambda data, coalition: float(len(coalition) >= 2)
    >>> np.round(ExactShapley(majority).fit(ValuationData(np.zeros((3, 1)), np.zeros(3))), 12).tolist()
    [0.333333333333, 0.333333333333, 0.333333333333]
    """

    def __init__(self, utility: Utility, max_players: int = 16) -> None:
        self.utility = utility
        self.max_players = max_players

    def fit(self, data: ValuationData) -> np.ndarray:
        """The exact Shapley value of every player.

        Parameters:
            data: the players (the rows of ``data.x``).

        Returns:
            One value per player (float64): φ_i, summing to u(N) − u(∅) (efficiency).
        """
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
    """Leave-one-out values v_i = u(N) − u(N ∖ {i}).

    Parameters:
        utility: u, a :data:`Utility` (N + 1 calls).

    In an additive game each player's leave-one-out value is its own worth; in the majority game of three
    (u = 1 from two players) no single player is pivotal for the grand coalition, so all get 0:

    >>> worth = np.array([1.0, 2.0, 3.5, -0.5])
    >>> LeaveOneOut(lambda data, c: float(worth[c].sum())).fit(ValuationData(np.zeros((4, 1)), np.zeros(4))).tolist()
    [1.0, 2.0, 3.5, -0.5]
    >>> LeaveOneOut(lambda data, c: float(len(c) >= 2)).fit(ValuationData(np.zeros((3, 1)), np.zeros(3))).tolist()
    [0.0, 0.0, 0.0]
    """

    def __init__(self, utility: Utility) -> None:
        self.utility = utility

    def fit(self, data: ValuationData) -> np.ndarray:
        """The leave-one-out value of every player.

        Parameters:
            data: the players (the rows of ``data.x``).

        Returns:
            One value per player (float64): u(N) − u(N ∖ {i}).
        """
        everyone = np.arange(data.n)
        full = float(self.utility(data, everyone))
        return np.array([full - float(self.utility(data, np.delete(everyone, i))) for i in range(data.n)])


class PermutationShapley:
    """Monte-Carlo permutation Shapley: φ̂_i = mean over random permutations π of
    u(pre_π(i) ∪ {i}) − u(pre_π(i)), an unbiased estimate of the Shapley value (Castro et al. 2009).

    Exact for additive games with any number of permutations. ``n_permutations`` × (N + 1) utility calls.

    Parameters:
        utility: u, a :data:`Utility`.
        n_permutations: the number of random permutations (≥ 1).
        seed: the permutations' seed (same seed → same values).

    An additive game's marginals are the players' worths in every permutation, so even 3 permutations give
    the exact Shapley values; in any game each permutation's marginals sum to u(N) − u(∅) (efficiency):

    >>> worth = np.array([1.0, 2.0, 3.5, -0.5])
    >>> additive = lambda data, coalition: float(worth[coalition].sum())
    >>> PermutationShapley(additive, n_permutations=3).fit(ValuationData(np.zeros((4, 1)), np.zeros(4))).tolist()
    [1.0, 2.0, 3.5, -0.5]
    >>> majority = lambda data, coalition: float(len(coalition) >= 2)
    >>> round(float(PermutationShapley(majority, 7).fit(ValuationData(np.zeros((3, 1)), np.zeros(3))).sum()), 12)
    1.0
    """

    def __init__(self, utility: Utility, n_permutations: int = 100, seed: int = 0) -> None:
        if n_permutations < 1:
            raise ValueError("n_permutations must be ≥ 1")
        self.utility = utility
        self.n_permutations = n_permutations
        self.seed = seed

    def fit(self, data: ValuationData) -> np.ndarray:
        """The Monte-Carlo Shapley estimate of every player.

        Parameters:
            data: the players (the rows of ``data.x``).

        Returns:
            One value per player (float64), summing to u(N) − u(∅).
        """
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

    Parameters:
        utility: u, a :data:`Utility`.
        n_permutations: the number of random permutations (≥ 1).
        tolerance: the truncation threshold relative to |u(N)| (≥ 0; 0 never truncates).
        seed: the permutations' seed (the same permutations as :class:`PermutationShapley`'s).

    With ``tolerance=0`` an additive game's values are the worths (the exact Shapley values); with truncation
    the values of every permutation still sum to u(N) − u(∅) within ``tolerance`` · |u(N)| — here exactly, as a
    prefix is truncated only once it reaches u(N):

    >>> worth = np.array([1.0, 2.0, 3.5, -0.5])
    >>> additive = lambda data, coalition: float(worth[coalition].sum())
    >>> data = ValuationData(np.zeros((4, 1)), np.zeros(4))
    >>> TruncatedMonteCarloShapley(additive, n_permutations=5, tolerance=0.0).fit(data).tolist()
    [1.0, 2.0, 3.5, -0.5]
    >>> majority = lambda data, coalition: float(len(coalition) >= 2)
    >>> three = ValuationData(np.zeros((3, 1)), np.zeros(3))
    >>> round(float(TruncatedMonteCarloShapley(majority, 20, tolerance=0.1).fit(three).sum()), 12)
    1.0
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
        """The TMC-Shapley estimate of every player.

        Parameters:
            data: the players (the rows of ``data.x``).

        Returns:
            One value per player (float64).
        """
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

    Parameters:
        k: K, the number of neighbours of :func:`knn_utility` (≥ 1).

    Against brute force: the Shapley value of each of 4 points under :func:`knn_utility` (K = 2), enumerated
    over all 4! orders of the players:

    >>> from itertools import permutations
    >>> data = ValuationData(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 1, 0, 1]),
    ...                      np.array([[0.4], [2.2]]), np.array([0, 1]))
    >>> u = knn_utility(2)
    >>> def brute_force(i):
    ...     total = 0.0
    ...     for order in permutations(range(4)):
    ...         before = list(order[:order.index(i)])
    ...         total += u(data, np.array(before + [i])) - u(data, np.array(before, dtype=int))
    ...     return total / 24
    >>> values = KNNShapley(k=2).fit(data)
    >>> bool(np.allclose(values, [brute_force(i) for i in range(4)])), np.round(values, 6).tolist()
    (True, [0.166667, 0.083333, 0.083333, 0.166667])
    """

    def __init__(self, k: int = 5) -> None:
        if k < 1:
            raise ValueError("k must be ≥ 1")
        self.k = k

    def fit(self, data: ValuationData) -> np.ndarray:
        """The exact K-NN Shapley value of every training point.

        Parameters:
            data: the players (the rows of ``data.x``) and a validation set (ValueError without one).

        Returns:
            One value per training point (float64): its Shapley value under :func:`knn_utility`, averaged
            over the validation points.
        """
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

    Parameters:
        data: the training points (players) and a validation set.
        k: K, the number of neighbours.

    Returns:
        One value per training point (float64).

    Raises ValueError when ``data`` has no validation set.

    Against brute force, u(N) − u(N ∖ {i}) by :func:`knn_utility` for each of 4 points:

    >>> data = ValuationData(np.array([[0.0], [1.0], [2.0], [3.0]]), np.array([0, 1, 0, 1]),
    ...                      np.array([[0.4], [2.2]]), np.array([0, 1]))
    >>> u, everyone = knn_utility(2), np.arange(4)
    >>> brute_force = [u(data, everyone) - u(data, np.delete(everyone, i)) for i in range(4)]
    >>> values = knn_leave_one_out(data, 2)
    >>> bool(np.allclose(values, brute_force)), values.tolist()
    (True, [0.0, -0.25, -0.25, 0.0])
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

    Parameters:
        p: the ground cost ||x − y||^p on augmented samples, p ∈ {1, 2}.
        potential: ``"sinkhorn"`` (default, as LAVA) or ``"exact"``
            (:func:`~otfed.valuation.calibrated.dual_potential`).
        diagonal: class covariances as per-feature standard deviations (default) or full square roots.
        options: passed to :func:`~otfed.valuation.calibrated.dual_potential`.

    Two well-separated classes of 6 points with two labels swapped (points 2 and 8, planted): those two get the
    largest calibrated gradients and are the only ones flagged (g > 0), with either potential:

    >>> from otfed.valuation.calibrated import flag_noisy
    >>> rng = np.random.default_rng(0)
    >>> y = np.repeat([0, 1], 6)
    >>> x = rng.normal(scale=0.3, size=(12, 2)) + 3.0 * y[:, None]
    >>> x_val = rng.normal(scale=0.3, size=(12, 2)) + 3.0 * y[:, None]
    >>> noisy = y.copy()
    >>> noisy[[2, 8]] = [1, 0]
    >>> data = ValuationData(x, noisy, x_val, y)
    >>> values = Lava().fit(data)
    >>> np.flatnonzero(flag_noisy(values)).tolist(), np.argsort(-values)[:2].tolist()
    ([2, 8], [2, 8])
    >>> np.flatnonzero(flag_noisy(Lava(potential="exact").fit(data))).tolist()
    [2, 8]
    """

    def __init__(self, p: int = 2, potential: Potential = "sinkhorn", diagonal: bool = True, **options) -> None:
        self.p = p
        self.potential = potential
        self.diagonal = diagonal
        self.options = options

    def fit(self, data: ValuationData) -> np.ndarray:
        """LAVA's calibrated gradient of every training point.

        Parameters:
            data: the players (the rows of ``data.x``) and a validation set (ValueError without one).

        Returns:
            One value per training point (float64); larger = more harmful, > 0 flagged (FedBary eq. 10).
        """
        x_val, y_val = data.require_validation("Lava")
        train = augmented_measure(LabelledData("train", data.x, data.y), diagonal=self.diagonal)
        valid = augmented_measure(LabelledData("validation", x_val, y_val), diagonal=self.diagonal)
        return datum_values(train, valid, p=self.p, potential=self.potential, **self.options)
