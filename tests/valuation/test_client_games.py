"""Client-level games of FedBary §5.1: the share normalisation and the FedAvg utility."""
from __future__ import annotations

import numpy as np

from otfed.fl import FedAvgConfig, evaluate, fedavg, init_state
from otfed.ot.otdd import LabelledData
from otfed.valuation import ValuationData, fedavg_utility, percent_of_total


def test_percent_of_total_is_undefined_for_a_zero_sum() -> None:
    assert np.allclose(percent_of_total(np.array([1.0, 3.0])), [25.0, 75.0])
    assert np.isnan(percent_of_total(np.array([0.2, -0.2 + 1e-18]))).all()


def test_fedavg_utility_is_fedavg_validation_accuracy_of_the_coalition() -> None:
    rng = np.random.default_rng(0)

    def labelled(name: str, n: int) -> LabelledData:
        y = rng.integers(0, 3, n)
        return LabelledData(name, rng.normal(size=(n, 4)) + y[:, None], y)

    clients, validation = [labelled(f"c{i}", 30) for i in range(3)], labelled("server", 40)
    config = FedAvgConfig(rounds=2, epochs=2, lr=0.1)
    u = fedavg_utility(clients, validation, config, seed=5)
    players = ValuationData(np.arange(3, dtype=np.float64)[:, None], np.zeros(3, dtype=np.int64))
    # by hand: FedAvg from the seeded initial state over clients 0 and 2 (in player order), then accuracy
    state = init_state(4, 3, seed=5)
    trained = fedavg([(clients[0].x, clients[0].y), (clients[2].x, clients[2].y)], state, rounds=2, epochs=2,
                     lr=0.1, seed=5).state
    assert u(players, np.array([2, 0])) == evaluate(trained, validation.x, validation.y)
    assert u(players, np.array([], dtype=np.int64)) == evaluate(state, validation.x, validation.y)
