"""Gradient-reconstruction client valuation, the FL baselines of FedBary §5.1 / appendix 10.3: the FedAvg
server values its clients from the updates it already received (:class:`~otfed.fl.fedavg.RoundUpdates`,
recorded by ``fedavg(..., record_updates=True)``) and a validation set, rebuilding the model a coalition S
would have produced instead of retraining FedAvg on S.

Reconstruction of round r for a coalition S (Song, Tong & Wei 2019; Liu et al. 2022):

    M_S^r = M^{r−1} + Σ_{k∈S} ω_k Δ_k^r / Σ_{k∈S} ω_k,        M_∅^r = M^{r−1},

with Δ_k^r = client k's local state − M^{r−1} and ω_k the FedAvg weights (a coalition whose weights sum to
0 counts as ∅, so a zero-weight client is a null player). Every game below is valued with the Shapley
value φ_i = Σ_{S ⊆ N∖{i}} |S|!(N−|S|−1)!/N! · (u(S ∪ {i}) − u(S)) (FedBary eq. 60), exactly over all 2^N
coalitions or by Monte Carlo.

- :func:`reconstructed_round_state` — M_S^r.
- :func:`reconstructed_final_state` — OR's model of S: M^0 + Σ_r (M_S^r − M^{r−1}).
- :func:`one_round_reconstruction` — **OR** (Song, Tong & Wei 2019, "Profit allocation for federated
  learning", IEEE Big Data): exact Shapley of u(S) = V(M^0 + Σ_r (M_S^r − M^{r−1})), u(∅) = V(M^0).
- :func:`multi_round_reconstruction` — **MR** (same paper): φ_i = Σ_r λ_r φ_i^r, φ^r the exact Shapley
  values of u_r(S) = V(M_S^r), u_r(∅) = V(M^{r−1}). FedShapley (Wang et al. 2020, "A principled approach
  to data valuation for federated learning") with every client taking part in every round is MR with
  λ_r = 1 — each round's players are all clients and V(M^r) − V(M^{r−1}) is split by the Shapley value of
  the same reconstructed game — so it is not built separately.
- :func:`gtg_shapley` — **GTG-Shapley** (Liu et al. 2022, "GTG-Shapley: efficient and accurate participant
  contribution evaluation in federated learning", ACM TIST 13(4), alg. 1): MR's per-round game estimated by
  guided Monte Carlo permutations with between-round and within-round truncation.
- :func:`accuracy_utility` — V = validation accuracy (:func:`otfed.fl.fedavg.evaluate`), the utility of
  all three papers; any ``State → float`` can be given instead.

Each valuation returns :class:`ClientValues`: one value per client (larger = more valuable) and the number
of utility evaluations, memoised per (round, coalition) so no reconstructed model is evaluated twice.

**Privacy boundary.** These functions take the recorded rounds and a utility of a state — the messages an
FL server receives plus its own validation set — and never a client's samples.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from otfed.fl.fedavg import RoundUpdates, State, evaluate
from otfed.valuation.baselines import ExactShapley, ValuationData

#: The worth of a (reconstructed) model state, e.g. its validation accuracy (:func:`accuracy_utility`).
StateUtility = Callable[[State], float]


@dataclass(frozen=True, eq=False)
class ClientValues:
    """Client values (one per client, larger = more valuable) and the number of distinct utility
    evaluations they took. ``per_round`` (MR, GTG): the (R, N) per-round values φ_i^r, before MR's round
    weights; ``permutations`` (GTG): Monte Carlo permutations drawn per round (0 for a truncated round)."""

    values: np.ndarray
    evaluations: int
    per_round: np.ndarray | None = None
    permutations: tuple[int, ...] = ()


def accuracy_utility(x_val: np.ndarray, y_val: np.ndarray, device: str | torch.device = "cpu",
                     num_threads: int | None = 1) -> StateUtility:
    """V(M) = accuracy of the state's classifier on the server's validation set (x_val, y_val)
    (:func:`otfed.fl.fedavg.evaluate` on ``device`` with ``num_threads`` torch CPU threads)."""
    x_val, y_val = np.asarray(x_val), np.asarray(y_val)
    if x_val.ndim != 2 or y_val.ndim != 1 or x_val.shape[0] != y_val.shape[0] or y_val.shape[0] == 0:
        raise ValueError(f"validation set must be x (m, d) and y (m,) with m ≥ 1, "
                         f"got {x_val.shape} and {y_val.shape}")

    def utility(state: State) -> float:
        return evaluate(state, x_val, y_val, device=device, num_threads=num_threads)

    return utility


def _n_clients(rounds: Sequence[RoundUpdates]) -> int:
    """The number of clients, after checking every round has one delta and one non-negative weight per
    client and every delta the start state's keys and shapes."""
    if len(rounds) == 0:
        raise ValueError("no recorded rounds: run fedavg(..., record_updates=True)")
    n = len(rounds[0].deltas)
    if n == 0:
        raise ValueError("round 0 has no client updates")
    for r, update in enumerate(rounds):
        if len(update.deltas) != n or len(update.weights) != n:
            raise ValueError(f"round {r}: {len(update.deltas)} deltas and {len(update.weights)} weights, "
                             f"round 0 has {n} clients (full participation needed)")
        w = np.asarray(update.weights, dtype=np.float64)
        if not np.all(np.isfinite(w)) or np.any(w < 0):
            raise ValueError(f"round {r}: weights must be finite and non-negative, got {update.weights}")
        for k, delta in enumerate(update.deltas):
            if set(delta) != set(update.start) or any(delta[key].shape != update.start[key].shape
                                                      for key in update.start):
                raise ValueError(f"round {r}, client {k}: the delta's keys or shapes differ from the start state's")
    return n


def _members(mask: int, n: int) -> list[int]:
    return [i for i in range(n) if mask >> i & 1]


def _aggregated_delta(update: RoundUpdates, coalition: Sequence[int]) -> dict[str, torch.Tensor] | None:
    """Σ_{k∈S} ω_k Δ_k / Σ_{k∈S} ω_k in float64; None for S = ∅ or Σ_{k∈S} ω_k = 0."""
    members = sorted(int(k) for k in coalition)
    w = np.asarray(update.weights, dtype=np.float64)[members]
    if len(members) == 0 or not w.sum() > 0:
        return None
    fractions = w / w.sum()
    return {key: sum((float(f) * update.deltas[k][key].to(torch.float64) for f, k in zip(fractions, members)),
                     torch.zeros_like(start, dtype=torch.float64))
            for key, start in update.start.items()}


def reconstructed_round_state(update: RoundUpdates, coalition: Sequence[int]) -> State:
    """M_S^r = M^{r−1} + Σ_{k∈S} ω_k Δ_k^r / Σ_{k∈S} ω_k (Song et al. 2019; Liu et al. 2022), summed in
    float64 and returned in the start state's dtype; S = ∅ (or zero total weight) → M^{r−1}."""
    delta = _aggregated_delta(update, coalition)
    if delta is None:
        return dict(update.start)
    return {key: (start.to(torch.float64) + delta[key]).to(start.dtype) for key, start in update.start.items()}


def reconstructed_final_state(rounds: Sequence[RoundUpdates], coalition: Sequence[int]) -> State:
    """OR's model of S (Song et al. 2019): M^0 + Σ_r Σ_{k∈S} ω_k Δ_k^r / Σ_{k∈S} ω_k — the initial global
    model moved by S's aggregated update of every round (float64 sum, start dtype). With S = all clients it
    is FedAvg's final state up to rounding."""
    _n_clients(rounds)
    first = rounds[0].start
    total = {key: v.to(torch.float64) for key, v in first.items()}
    for update in rounds:
        delta = _aggregated_delta(update, coalition)
        if delta is not None:
            total = {key: total[key] + delta[key] for key in total}
    return {key: total[key].to(v.dtype) for key, v in first.items()}


class _ReconstructedGame:
    """u_r(S) = V(M_S^r) and OR's u(S) = V(reconstructed_final_state(S)), each evaluated at most once
    (keyed by round and coalition bitmask)."""

    def __init__(self, rounds: Sequence[RoundUpdates], utility: StateUtility, n: int) -> None:
        self._rounds = rounds
        self._utility = utility
        self._n = n
        self._values: dict[tuple[str, int, int], float] = {}

    def round_value(self, r: int, mask: int) -> float:
        key = ("round", r, mask)
        if key not in self._values:
            self._values[key] = float(self._utility(reconstructed_round_state(self._rounds[r],
                                                                              _members(mask, self._n))))
        return self._values[key]

    def final_value(self, mask: int) -> float:
        key = ("final", -1, mask)
        if key not in self._values:
            self._values[key] = float(self._utility(reconstructed_final_state(self._rounds, _members(mask, self._n))))
        return self._values[key]

    @property
    def evaluations(self) -> int:
        return len(self._values)


def _exact_shapley(n: int, value_of: Callable[[int], float]) -> np.ndarray:
    """Exact Shapley values (FedBary eq. 60) of the game mask → ``value_of(mask)`` over n clients, by
    :class:`~otfed.valuation.baselines.ExactShapley` with one row per client."""
    players = ValuationData(x=np.zeros((n, 1)), y=np.zeros(n, dtype=np.intp))
    return ExactShapley(lambda _, coalition: value_of(int(sum(1 << int(i) for i in coalition)))).fit(players)


def one_round_reconstruction(rounds: Sequence[RoundUpdates], utility: StateUtility) -> ClientValues:
    """OR (Song, Tong & Wei 2019): exact Shapley values (FedBary eq. 60) over all 2^N coalitions of
    u(S) = V(M^0 + Σ_r Σ_{k∈S} ω_k Δ_k^r / Σ_{k∈S} ω_k) (:func:`reconstructed_final_state`), u(∅) = V(M^0).
    Efficiency: Σ_i φ_i = V(FedAvg's final model) − V(M^0). 2^N evaluations."""
    n = _n_clients(rounds)
    game = _ReconstructedGame(rounds, utility, n)
    values = _exact_shapley(n, game.final_value)
    return ClientValues(values=values, evaluations=game.evaluations)


def multi_round_reconstruction(rounds: Sequence[RoundUpdates], utility: StateUtility,
                               round_weights: Sequence[float] | None = None) -> ClientValues:
    """MR (Song, Tong & Wei 2019): φ_i = Σ_r λ_r φ_i^r with φ^r the exact Shapley values (FedBary eq. 60) of
    round r's game u_r(S) = V(M_S^r) (:func:`reconstructed_round_state`), u_r(∅) = V(M^{r−1}).

    The paper's round weights λ_r are described (FedBary app. 10.3) only as "elaborated"; here λ_r = 1
    unless ``round_weights`` gives one weight per round. With λ_r = 1 this is FedShapley (Wang et al. 2020)
    under full participation, and the values sum to Σ_r [V(M^r) − V(M^{r−1})] (= V(M^R) − V(M^0) when each
    recorded start is the previous round's full reconstruction). R · 2^N evaluations."""
    n = _n_clients(rounds)
    lam = np.ones(len(rounds)) if round_weights is None else np.asarray(round_weights, dtype=np.float64)
    if lam.shape != (len(rounds),) or not np.all(np.isfinite(lam)):
        raise ValueError(f"need one finite weight per round ({len(rounds)}), got {round_weights}")
    game = _ReconstructedGame(rounds, utility, n)
    per_round = np.array([_exact_shapley(n, lambda mask, r=r: game.round_value(r, mask))
                          for r in range(len(rounds))])
    return ClientValues(values=lam @ per_round, evaluations=game.evaluations, per_round=per_round)


def _guided_permutation(j: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """GTG-Shapley's guided sampling: permutation j puts client j mod N first, the others in random order,
    so over any N consecutive permutations every client leads once."""
    first = j % n
    return np.concatenate(([first], rng.permutation(np.delete(np.arange(n), first))))


def _converged(estimates: deque[np.ndarray], tolerance: float) -> bool:
    """True when the latest running estimate differs from each of the previous ones kept in ``estimates``
    by less than ``tolerance`` in mean relative change over clients: max_j mean_i |φ̂_i − φ̂_i^{(j)}| / |φ̂_i|
    < tolerance (a client whose estimates are all 0 contributes 0)."""
    latest = estimates[-1]
    scale = np.abs(latest) + np.finfo(np.float64).tiny
    return max(float(np.mean(np.abs(latest - earlier) / scale)) for earlier in list(estimates)[:-1]) < tolerance


def gtg_shapley(rounds: Sequence[RoundUpdates], utility: StateUtility, eps_between: float | None = 0.005,
                eps_within: float = 0.01, tolerance: float = 0.05, max_permutations: int = 100,
                seed: int = 0) -> ClientValues:
    """GTG-Shapley (Liu et al. 2022, alg. 1): per round r, Monte Carlo Shapley of MR's game
    u_r(S) = V(M_S^r) (:func:`reconstructed_round_state`); φ_i = Σ_r φ_i^r.

    - Between-round truncation: if |V(M^r) − V(M^{r−1})| ≤ ``eps_between``, φ^r = 0 and no coalition but
      ∅ and all clients is evaluated (``None``: never truncate — FedBary's GTG-Ti, as we read it).
    - Guided sampling: permutation j (of round r, generator seeded by (``seed``, r)) puts client j mod N
      first and the rest in random order.
    - Within-round truncation: scanning a permutation, once |V(M^r) − u_r(prefix)| < ``eps_within`` the
      remaining clients get marginal 0 without evaluation (strict, as in the paper's alg. 1: 0 = off).
    - Convergence: φ̂^r is the running mean of the marginals; from 2N permutations on, stop once its mean
      relative change over clients against each of the previous N estimates is < ``tolerance`` (0: run all
      ``max_permutations``), or at ``max_permutations``.

    ``permutations`` in the result: permutations drawn per round (0 where truncated). The thresholds'
    defaults are this module's choice for accuracy utilities, not the paper's."""
    n = _n_clients(rounds)
    if max_permutations < 1 or eps_within < 0 or tolerance < 0 or (eps_between is not None and eps_between < 0):
        raise ValueError("need max_permutations ≥ 1 and non-negative eps_between, eps_within, tolerance")
    game = _ReconstructedGame(rounds, utility, n)
    everyone = (1 << n) - 1
    per_round = np.zeros((len(rounds), n))
    drawn: list[int] = []
    for r in range(len(rounds)):
        v_empty, v_full = game.round_value(r, 0), game.round_value(r, everyone)
        if eps_between is not None and abs(v_full - v_empty) <= eps_between:
            drawn.append(0)
            continue
        rng = np.random.default_rng([seed, r])
        totals = np.zeros(n)
        estimates: deque[np.ndarray] = deque(maxlen=n + 1)
        for k in range(1, max_permutations + 1):
            previous, mask = v_empty, 0
            for i in _guided_permutation(k - 1, n, rng):
                if abs(v_full - previous) < eps_within:
                    break
                mask |= 1 << int(i)
                current = game.round_value(r, mask)
                totals[i] += current - previous
                previous = current
            estimates.append(totals / k)
            if k >= 2 * n and _converged(estimates, tolerance):
                break
        per_round[r] = estimates[-1]
        drawn.append(k)
    return ClientValues(values=per_round.sum(axis=0), evaluations=game.evaluations, per_round=per_round,
                        permutations=tuple(drawn))
