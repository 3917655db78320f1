"""Gradient-reconstruction client valuation (OR, MR, GTG-Shapley) against brute-force Shapley values over
all N! orderings of hand-made games, the Shapley axioms, FedAvg's own records, and the privacy boundary."""
from __future__ import annotations

import inspect
from itertools import permutations
from math import factorial
from typing import Callable

import numpy as np
import pytest
import torch

from otfed.fl.fedavg import RoundUpdates, State, evaluate, fedavg, init_state
from otfed.valuation import (accuracy_utility, gtg_shapley, multi_round_reconstruction, one_round_reconstruction,
                             reconstructed_final_state, reconstructed_round_state)

# ----------------------------------------------------------------------------------------------------
# a hand-made game: states are flat float64 vectors split into two tensors, the utility a function of them

SPLIT = 3  # "w" = v[:3], "b" = v[3:]


def as_state(v: np.ndarray) -> State:
    return {"w": torch.tensor(v[:SPLIT]), "b": torch.tensor(v[SPLIT:])}


def as_vector(state: State) -> np.ndarray:
    return np.concatenate([state["w"].numpy(), state["b"].numpy()])


COEF = np.array([0.7, -1.3, 0.4, 2.0, -0.5])
TARGET = np.array([0.5, -0.2, 0.1, 0.3, 0.8])


def linear(v: np.ndarray) -> float:
    return float(COEF @ v)


def nonlinear(v: np.ndarray) -> float:
    return float(np.tanh(COEF @ v) - np.sum((v - TARGET) ** 2) + np.sin(v[0] * v[3]))


def state_utility(f: Callable[[np.ndarray], float]) -> Callable[[State], float]:
    return lambda state: f(as_vector(state))


def aggregate(start: np.ndarray, deltas: np.ndarray, weights: np.ndarray, coalition) -> np.ndarray:
    """Independent numpy reconstruction: start + Σ_{k∈S} ω_k Δ_k / Σ_{k∈S} ω_k (start for S = ∅)."""
    s = sorted(coalition)
    if not s or weights[s].sum() == 0:
        return start
    return start + (weights[s, None] * deltas[s]).sum(axis=0) / weights[s].sum()


def hand_made_rounds(n: int = 4, rounds: int = 3, seed: int = 0, weights=None):
    """Random start and deltas; each round starts from the previous round's full aggregate (as in FedAvg).
    Returns the RoundUpdates and the same numbers as numpy (starts (R+1, d), deltas (R, n, d), weights)."""
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 3.0, n) if weights is None else np.asarray(weights, dtype=float)
    starts = [rng.normal(0, 0.5, 5)]
    deltas = rng.normal(0, 0.4, (rounds, n, 5))
    for r in range(rounds):
        starts.append(aggregate(starts[r], deltas[r], w, range(n)))
    recorded = [RoundUpdates(start=as_state(starts[r]), deltas=[as_state(d) for d in deltas[r]],
                             weights=[float(x) for x in w]) for r in range(rounds)]
    return recorded, np.array(starts), deltas, w


def brute_force_shapley(value: Callable[[frozenset], float], n: int) -> np.ndarray:
    """Mean marginal contribution over all n! orderings (independent of the subset-weight formula)."""
    phi = np.zeros(n)
    for order in permutations(range(n)):
        for pos, i in enumerate(order):
            before = frozenset(order[:pos])
            phi[i] += value(before | {i}) - value(before)
    return phi / factorial(n)


class Counting:
    """A utility that counts its calls (to check memoisation against the reported evaluations)."""

    def __init__(self, utility: Callable[[State], float]) -> None:
        self.utility = utility
        self.calls = 0

    def __call__(self, state: State) -> float:
        self.calls += 1
        return self.utility(state)


# ----------------------------------------------------------------------------------------------------
# OR and MR: exact against brute force; efficiency; axioms


@pytest.mark.parametrize("f", [linear, nonlinear])
def test_or_and_mr_equal_brute_force_shapley(f) -> None:
    n, R = 4, 3
    rounds, starts, deltas, w = hand_made_rounds(n, R)

    def or_value(S):  # M^0 + Σ_r (round r's aggregate over S)
        v = starts[0].copy()
        for r in range(R):
            v = v + aggregate(starts[r], deltas[r], w, S) - starts[r]
        return f(v)

    counting = Counting(state_utility(f))
    result = one_round_reconstruction(rounds, counting)
    np.testing.assert_allclose(result.values, brute_force_shapley(or_value, n), rtol=0, atol=1e-12)
    assert result.evaluations == counting.calls == 2 ** n

    per_round = np.array([brute_force_shapley(lambda S, r=r: f(aggregate(starts[r], deltas[r], w, S)), n)
                          for r in range(R)])
    counting = Counting(state_utility(f))
    result = multi_round_reconstruction(rounds, counting)
    np.testing.assert_allclose(result.per_round, per_round, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.values, per_round.sum(axis=0), rtol=0, atol=1e-12)
    assert result.evaluations == counting.calls == R * 2 ** n
    lam = np.array([0.2, 1.0, 3.0])
    weighted = multi_round_reconstruction(rounds, state_utility(f), round_weights=lam)
    np.testing.assert_allclose(weighted.values, lam @ per_round, rtol=0, atol=1e-12)


def test_efficiency_per_round_telescoping_and_or_total() -> None:
    """MR: Σ_i φ_i^r = u(M^r) − u(M^{r−1}) per round, so with λ_r = 1 the values sum to u(M^R) − u(M^0);
    OR: Σ_i φ_i = u(M^0 + Σ_r aggregate^r) − u(M^0) = u(M^R) − u(M^0) too."""
    rounds, starts, _, _ = hand_made_rounds(n=5, rounds=4, seed=3)
    u = [nonlinear(s) for s in starts]
    mr = multi_round_reconstruction(rounds, state_utility(nonlinear))
    np.testing.assert_allclose(mr.per_round.sum(axis=1), np.diff(u), rtol=0, atol=1e-12)
    assert mr.values.sum() == pytest.approx(u[-1] - u[0], abs=1e-12)
    orr = one_round_reconstruction(rounds, state_utility(nonlinear))
    assert orr.values.sum() == pytest.approx(u[-1] - u[0], abs=1e-12)
    np.testing.assert_allclose(as_vector(reconstructed_final_state(rounds, range(5))), starts[-1], atol=1e-12)


def test_symmetric_null_and_identical_clients() -> None:
    """Symmetry: clients 0 and 1 send the same delta with the same weight every round → equal values.
    Null player: a zero-weight client changes no reconstructed model → 0 (OR, MR and GTG).
    Identical updates: every non-empty coalition rebuilds the same model → u(all) − u(∅) split equally."""
    rounds, _, _, _ = hand_made_rounds(n=4, rounds=2, seed=5, weights=[1.5, 1.5, 0.0, 2.0])
    twins = [RoundUpdates(start=u.start, deltas=[u.deltas[0], u.deltas[0], *u.deltas[2:]], weights=u.weights)
             for u in rounds]
    utility = state_utility(nonlinear)
    for result in (one_round_reconstruction(twins, utility), multi_round_reconstruction(twins, utility)):
        assert result.values[0] == pytest.approx(result.values[1], abs=1e-12)
        assert result.values[2] == 0.0
        assert abs(result.values[0] - result.values[3]) > 1e-3  # not trivially all equal
    assert gtg_shapley(twins, utility, eps_between=None, eps_within=0.0, max_permutations=40).values[2] == 0.0

    same = [RoundUpdates(start=u.start, deltas=[u.deltas[3]] * 4, weights=[1.0, 2.0, 3.0, 4.0]) for u in rounds]
    full = [utility(reconstructed_round_state(u, range(4))) - utility(u.start) for u in same]
    mr = multi_round_reconstruction(same, utility)
    np.testing.assert_allclose(mr.per_round, np.repeat(np.array(full)[:, None] / 4, 4, axis=1), atol=1e-12)
    end = utility(reconstructed_final_state(same, range(4))) - utility(same[0].start)
    np.testing.assert_allclose(one_round_reconstruction(same, utility).values, [end / 4] * 4, atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# GTG-Shapley


def test_gtg_without_truncation_approaches_mr_per_round_shapley() -> None:
    """Both truncations off and 3000 permutations per round of a 3-client game: GTG's per-round estimates
    are within Monte Carlo error of MR's exact per-round Shapley values. Guided sampling fixes the leader,
    so a client's marginal per permutation takes at most 3 values spanning ≤ 2·max|marginal|; 5 standard
    errors of that bound is 5·max|marginal|/√P. Efficiency holds exactly per permutation."""
    n, P = 3, 3000
    rounds, starts, deltas, w = hand_made_rounds(n=n, rounds=2, seed=7)
    utility = state_utility(nonlinear)
    mr = multi_round_reconstruction(rounds, utility)
    gtg = gtg_shapley(rounds, utility, eps_between=None, eps_within=0.0, tolerance=0.0, max_permutations=P)
    assert gtg.permutations == (P, P)
    assert gtg.evaluations == 2 * 2 ** n
    for r in range(2):
        value = lambda S: nonlinear(aggregate(starts[r], deltas[r], w, S))  # noqa: E731
        biggest = max(abs(value(S | {i}) - value(S)) for i in range(n)
                      for S in map(frozenset, [(), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2)]) if i not in S)
        np.testing.assert_allclose(gtg.per_round[r], mr.per_round[r], rtol=0, atol=5 * biggest / np.sqrt(P))
        assert gtg.per_round[r].sum() == pytest.approx(value(frozenset(range(n))) - value(frozenset()), abs=1e-12)
    assert np.max(np.abs(gtg.per_round - mr.per_round)) > 0  # an estimate, not MR itself


def test_gtg_two_clients_is_exact_after_an_even_number_of_permutations() -> None:
    """With N = 2 guided sampling alternates the two orders, so any even number of permutations averages
    both: exact Shapley values."""
    rounds, _, _, _ = hand_made_rounds(n=2, rounds=2, seed=8)
    utility = state_utility(nonlinear)
    gtg = gtg_shapley(rounds, utility, eps_between=None, eps_within=0.0, tolerance=0.0, max_permutations=10)
    np.testing.assert_allclose(gtg.per_round, multi_round_reconstruction(rounds, utility).per_round, atol=1e-12)


def test_gtg_between_round_truncation_skips_a_round_whose_utility_is_unchanged() -> None:
    """Round 1's two updates cancel (+d and −d, equal weights), so V(M^1) = V(M^0): with eps_between = 0 the
    round is worth 0 to everyone and only ∅ and the full coalition are evaluated there — although its exact
    per-round Shapley values are ±(u({0}) − u(∅)) ≠ 0, which GTG without between-round truncation finds."""
    rounds, _, _, _ = hand_made_rounds(n=2, rounds=1, seed=9, weights=[1.0, 1.0])
    d = rounds[0].deltas[0]
    cancelling = RoundUpdates(start=rounds[0].start, deltas=[d, {k: -v for k, v in d.items()}], weights=[1.0, 1.0])
    counting = Counting(state_utility(linear))
    truncated = gtg_shapley([rounds[0], cancelling], counting, eps_between=0.0, eps_within=0.0, tolerance=0.0,
                            max_permutations=10)
    assert truncated.permutations == (10, 0)
    np.testing.assert_array_equal(truncated.per_round[1], [0.0, 0.0])
    assert truncated.evaluations == counting.calls == 4 + 2
    single = gtg_shapley([cancelling], state_utility(linear), eps_between=0.0)
    assert single.evaluations == 2 and np.all(single.values == 0.0)
    gain = linear(as_vector(reconstructed_round_state(cancelling, [0]))) - linear(as_vector(cancelling.start))
    untruncated = gtg_shapley([cancelling], state_utility(linear), eps_between=None, eps_within=0.0, tolerance=0.0,
                              max_permutations=10)
    np.testing.assert_allclose(untruncated.values, [gain, -gain], atol=1e-12)
    assert abs(gain) > 0.1


def test_gtg_guided_sampling_and_within_round_truncation() -> None:
    """All four clients send the same update, so any single client already rebuilds M^r: within-round
    truncation stops every permutation after its leader, whose marginal is u(all) − u(∅). Guided sampling
    lets each client lead exactly 5 of 20 permutations, so each gets exactly (u(all) − u(∅))/4 — and only
    ∅, the full coalition and the 4 singletons are ever evaluated."""
    rounds, _, _, _ = hand_made_rounds(n=4, rounds=1, seed=10)
    same = [RoundUpdates(start=rounds[0].start, deltas=[rounds[0].deltas[1]] * 4, weights=[1.0, 2.0, 0.5, 4.0])]
    utility = state_utility(nonlinear)
    gain = utility(reconstructed_round_state(same[0], range(4))) - utility(same[0].start)
    gtg = gtg_shapley(same, utility, eps_between=None, eps_within=1e-9, tolerance=0.0, max_permutations=20)
    np.testing.assert_allclose(gtg.values, [gain / 4] * 4, rtol=0, atol=1e-12)
    assert gtg.evaluations == 2 + 4 and gtg.permutations == (20,)
    assert abs(gain) > 0.1


def test_gtg_is_seeded_and_stops_when_converged() -> None:
    rounds, _, _, _ = hand_made_rounds(n=4, rounds=2, seed=11)
    utility = state_utility(nonlinear)
    kwargs = dict(eps_between=None, eps_within=0.0, max_permutations=400)
    a, b = gtg_shapley(rounds, utility, seed=1, **kwargs), gtg_shapley(rounds, utility, seed=1, **kwargs)
    np.testing.assert_array_equal(a.values, b.values)
    assert a.permutations == b.permutations
    assert not np.array_equal(a.values, gtg_shapley(rounds, utility, seed=2, **kwargs).values)
    assert all(8 <= k < 400 for k in a.permutations)  # converged (tolerance 0.05) after ≥ 2N permutations
    assert gtg_shapley(rounds, utility, tolerance=0.0, **kwargs).permutations == (400, 400)


# ----------------------------------------------------------------------------------------------------
# on FedAvg's records, with the accuracy utility; the privacy boundary


def _blobs(n: int, seed: int, noise_labels: float = 0.0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.standard_normal((n, 4)) + 2.0 * np.eye(3, 4)[y]
    flip = rng.random(n) < noise_labels
    y[flip] = (y[flip] + 1) % 3
    return x, y


def test_on_fedavg_records_or_model_is_the_final_state_and_values_survive_poisoned_client_data() -> None:
    """OR's model of all clients is FedAvg's final state; OR's and MR's values sum to the accuracy gained
    from M^0 to it; valuing uses only the recorded rounds and the validation set: after every client array
    is overwritten with garbage the same records give the same values. The server-side functions have no
    parameter through which client samples could enter."""
    clients = [_blobs(40, 1), _blobs(40, 2), _blobs(40, 3, noise_labels=0.6)]
    x_val, y_val = _blobs(150, 4)
    state = init_state(4, 3, seed=0, dtype=torch.float64)
    result = fedavg(clients, state, rounds=3, epochs=2, lr=0.3, seed=0, record_updates=True)
    final = reconstructed_final_state(result.rounds, range(3))
    for key in state:
        np.testing.assert_allclose(final[key].numpy(), result.state[key].numpy(), rtol=0, atol=1e-12)

    utility = accuracy_utility(x_val, y_val)
    gained = evaluate(result.state, x_val, y_val) - evaluate(state, x_val, y_val)

    def all_values():
        return [one_round_reconstruction(result.rounds, utility).values,
                multi_round_reconstruction(result.rounds, utility).values,
                gtg_shapley(result.rounds, utility, eps_between=0.0, eps_within=0.0, seed=3).values]

    before = all_values()
    assert before[0].sum() == pytest.approx(gained, abs=1e-12)
    assert before[1].sum() == pytest.approx(gained, abs=1e-12)
    assert gained > 0.1
    assert all(v[2] < 0 < min(v[:2]) for v in before)  # the client with 60% flipped labels hurts
    for x, y in clients:
        x[:] = np.nan
        y[:] = -1
    for old, new in zip(before, all_values()):
        np.testing.assert_array_equal(old, new)

    allowed = {"rounds", "update", "coalition", "utility", "round_weights", "eps_between", "eps_within",
               "tolerance", "max_permutations", "seed"}
    for fn in (one_round_reconstruction, multi_round_reconstruction, gtg_shapley, reconstructed_round_state,
               reconstructed_final_state):
        assert set(inspect.signature(fn).parameters) <= allowed, fn.__name__
    assert set(inspect.signature(accuracy_utility).parameters) == {"x_val", "y_val", "device", "num_threads"}


def test_bad_records_raise_clear_errors() -> None:
    rounds, _, _, _ = hand_made_rounds(n=3, rounds=2)
    utility = state_utility(linear)
    with pytest.raises(ValueError, match="no recorded rounds"):
        multi_round_reconstruction([], utility)
    short = RoundUpdates(start=rounds[1].start, deltas=rounds[1].deltas[:2], weights=rounds[1].weights[:2])
    with pytest.raises(ValueError, match="round 1"):
        one_round_reconstruction([rounds[0], short], utility)
    negative = RoundUpdates(start=rounds[0].start, deltas=rounds[0].deltas, weights=[1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        gtg_shapley([negative], utility)
    with pytest.raises(ValueError, match="one finite weight per round"):
        multi_round_reconstruction(rounds, utility, round_weights=[1.0])
