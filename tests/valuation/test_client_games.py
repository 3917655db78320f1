"""Client-level games of FedBary §5.1: the share normalisation and the FedAvg utility."""
from __future__ import annotations

import numpy as np
import torch

from otfed.fl import FedAvgConfig, evaluate, fedavg, init_state
from otfed.ot.otdd import LabelledData
from otfed.valuation import (ValuationData, fedavg_rounds, fedavg_utility, percent_of_total,
                             reconstructed_final_state)


def test_percent_of_total_is_undefined_for_a_zero_sum() -> None:
    assert np.allclose(percent_of_total(np.array([1.0, 3.0])), [25.0, 75.0])
    assert np.isnan(percent_of_total(np.array([0.2, -0.2 + 1e-18]))).all()


def _federation(seed: int = 0) -> tuple[list[LabelledData], LabelledData]:
    rng = np.random.default_rng(seed)

    def labelled(name: str, n: int) -> LabelledData:
        y = rng.integers(0, 3, n)
        return LabelledData(name, rng.normal(size=(n, 4)) + y[:, None], y)

    return [labelled(f"c{i}", 30) for i in range(3)], labelled("server", 40)


def test_fedavg_utility_is_fedavg_validation_accuracy_of_the_coalition() -> None:
    clients, validation = _federation()
    config = FedAvgConfig(rounds=2, epochs=2, lr=0.1)
    u = fedavg_utility(clients, validation, config, seed=5)
    players = ValuationData(np.arange(3, dtype=np.float64)[:, None], np.zeros(3, dtype=np.int64))
    # by hand: FedAvg from the seeded initial state over clients 0 and 2 (in player order), then accuracy
    state = init_state(4, 3, seed=5)
    trained = fedavg([(clients[0].x, clients[0].y), (clients[2].x, clients[2].y)], state, rounds=2, epochs=2,
                     lr=0.1, seed=5).state
    assert u(players, np.array([2, 0])) == evaluate(trained, validation.x, validation.y)
    assert u(players, np.array([], dtype=np.int64)) == evaluate(state, validation.x, validation.y)


def test_fedavg_rounds_record_the_grand_coalitions_run_behind_u_of_n() -> None:
    """The reconstruction baselines value the run whose accuracy is u(N): rebuilding the model of all clients
    from the recorded updates gives FedAvg's final state (up to float32 rounding of the sums), the first start
    is the seeded initial state of u(∅), and the weights are the client sizes."""
    clients, validation = _federation(1)
    clients[1] = LabelledData("c1", clients[1].x[:17], clients[1].y[:17])  # unequal sizes: weights matter
    config = FedAvgConfig(rounds=3, epochs=2, lr=0.1)
    rounds = fedavg_rounds(clients, validation, config, seed=7)
    assert len(rounds) == 3 and [r.weights for r in rounds] == [[30.0, 17.0, 30.0]] * 3
    initial = init_state(4, 3, seed=7)
    for key, value in initial.items():
        assert torch.equal(rounds[0].start[key], value)
    final = fedavg([(c.x, c.y) for c in clients], initial, rounds=3, epochs=2, lr=0.1, seed=7).state
    rebuilt = reconstructed_final_state(rounds, [0, 1, 2])
    for key, value in final.items():
        torch.testing.assert_close(rebuilt[key], value, rtol=0, atol=1e-6)
    players = ValuationData(np.arange(3, dtype=np.float64)[:, None], np.zeros(3, dtype=np.int64))
    assert fedavg_utility(clients, validation, config, seed=7)(players, np.arange(3)) == \
        evaluate(final, validation.x, validation.y)
