"""Client-level cooperative games of FedBary §5.1: the players are the clients, a coalition's worth is
the validation accuracy of FedAvg trained on its members, and values are reported as shares of the total.

* :func:`fedavg_utility` — u(S) for :class:`~otfed.valuation.baselines.ExactShapley`,
  :class:`~otfed.valuation.baselines.LeaveOneOut`, :class:`~otfed.valuation.baselines.PermutationShapley`
  (players = rows 0..N−1 of the ValuationData).
* :class:`MemoizedUtility` — u(S) computed once per coalition and shared by the games (with 5 clients
  exact Shapley, leave-one-out and permutation Shapley query the same 32 coalitions), with each method's
  cost as the training time of the coalitions it queried.
* :func:`fedavg_rounds` — the updates the FedAvg server receives while training the grand coalition (the
  run behind u(N)), for the gradient-reconstruction valuations of :mod:`otfed.valuation.reconstruction`
  (OR, MR, GTG-Shapley), which value the clients from them instead of retraining on every coalition.
* :func:`percent_of_total` — 100 · v_i / Σ_j v_j, the paper's normalisation (fig. 4).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from otfed.data.parties import n_classes_of
from otfed.device import threads_for
from otfed.fl.fedavg import FedAvgConfig, RoundUpdates, fedavg, fedavg_accuracy, init_state
from otfed.ot.otdd import LabelledData
from otfed.valuation.baselines import Utility, ValuationData


def fedavg_utility(clients: Sequence[LabelledData], validation: LabelledData, config: FedAvgConfig,
                   seed: int, device: str = "cpu") -> Utility:
    """The client-level cooperative game of FedBary §5.1: u(S) = validation accuracy of FedAvg
    (:func:`~otfed.fl.fedavg.fedavg_accuracy`, ``config``, seeded by ``seed``, on ``device`` — one torch
    thread on CPU, :func:`otfed.device.threads_for`) trained on the clients in S (players = rows 0..N−1 of
    the ValuationData); u(∅) = the initial model's accuracy."""
    n_classes = n_classes_of(validation.y, *[c.y for c in clients])

    def utility(data: ValuationData, coalition: np.ndarray) -> float:
        members = [(clients[int(i)].x, clients[int(i)].y) for i in np.sort(coalition)]
        return fedavg_accuracy(members, (validation.x, validation.y), n_classes, config, seed, device=device,
                               num_threads=threads_for(device))

    return utility


def fedavg_rounds(clients: Sequence[LabelledData], validation: LabelledData, config: FedAvgConfig, seed: int,
                  device: str = "cpu") -> list[RoundUpdates]:
    """Every round's start state, client updates and weights of FedAvg over all ``clients`` — the same run
    (initial state, seeds, settings) that :func:`fedavg_utility` trains for the grand coalition N, recorded
    (``fedavg(..., record_updates=True)``): the messages a FedAvg server holds after training."""
    n_classes = n_classes_of(validation.y, *[c.y for c in clients])
    state = init_state(validation.x.shape[1], n_classes, hidden=config.hidden, seed=seed)
    result = fedavg([(c.x, c.y) for c in clients], state, rounds=config.rounds, epochs=config.epochs, lr=config.lr,
                    seed=seed, batch_size=config.batch_size, device=device, num_threads=threads_for(device),
                    record_updates=True)
    return result.rounds


class MemoizedUtility:
    """A deterministic utility u(S) evaluated once per coalition S (key: its sorted members).

    Exact Shapley, leave-one-out and permutation Shapley over the same game query overlapping coalitions;
    with a deterministic u (FedAvg with a fixed seed) a cached value is the value a fresh call would
    return, so sharing the cache changes no number. :meth:`seconds_of` gives the time the coalitions a set
    of queries touched took to evaluate the first time — what a method would have cost on its own."""

    def __init__(self, utility: Utility) -> None:
        self._utility = utility
        self._values: dict[tuple[int, ...], float] = {}
        self._seconds: dict[tuple[int, ...], float] = {}
        self.queried: set[tuple[int, ...]] = set()

    def __call__(self, data: ValuationData, coalition: np.ndarray) -> float:
        key = tuple(sorted(int(i) for i in np.asarray(coalition).ravel()))
        if key not in self._values:
            start = time.perf_counter()
            self._values[key] = float(self._utility(data, np.asarray(key, dtype=np.intp)))
            self._seconds[key] = time.perf_counter() - start
        self.queried.add(key)
        return self._values[key]

    @property
    def evaluations(self) -> int:
        """Distinct coalitions evaluated so far (each one FedAvg training)."""
        return len(self._values)

    def start_method(self) -> None:
        """Forget which coalitions were queried (the cache stays): call before each method."""
        self.queried = set()

    def method_seconds(self) -> float:
        """Σ first-evaluation time of the coalitions queried since :meth:`start_method`."""
        return float(sum(self._seconds[k] for k in self.queried))


def percent_of_total(values: np.ndarray) -> np.ndarray:
    """100 · v_i / Σ_j v_j (the paper's normalisation of Shapley-type values, fig. 4); NaN when Σ v = 0."""
    values = np.asarray(values, dtype=np.float64)
    total = values.sum()
    if not abs(total) > 1e-9 * max(float(np.abs(values).max(initial=0.0)), 1e-300):
        return np.full_like(values, np.nan)  # Σ v ≈ 0 (e.g. leave-one-out on a flat game): no share defined
    return 100.0 * values / total
