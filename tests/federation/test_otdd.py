"""Federated OTDD: close to the exact OTDD, ≈0 on itself, clear errors for degenerate clients, private."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.errors import DegenerateClientError
from otfed.federation import Channel, FedWaDConfig, LabelledData, federated_otdd, pairwise_federated_otdd
from otfed.federation.otdd import matrix_and_ledger, pairwise_sessions
from otfed.ot import augment_with_label_stats, class_statistics, otdd_exact
from tests.privacy_boundary import assert_boundary_holds


def labelled(name: str, n: int, shift: float, seed: int, d: int = 3, classes: int = 2) -> LabelledData:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.standard_normal((n, d)) + shift + 3.0 * y[:, None]
    return LabelledData(name, x, y)


CONFIG = FedWaDConfig(support_size=60, iterations=25, solver="network_simplex")


def test_federated_otdd_close_to_exact() -> None:
    a, b = labelled("a", 60, 0.0, 1), labelled("b", 60, 1.5, 2)
    fed = federated_otdd(a, b, CONFIG, seed=0).estimate
    exact = otdd_exact(a.x, a.y, b.x, b.y)
    assert exact * (1 - 1e-9) <= fed < 1.02 * exact


def test_otdd_of_a_dataset_with_itself_is_near_zero() -> None:
    a = labelled("a", 60, 0.0, 1)
    fed = federated_otdd(a, a, CONFIG, seed=0).estimate
    shifted = labelled("b", 60, 2.0, 2)
    assert otdd_exact(a.x, a.y, a.x, a.y) < 1e-6  # sqrt of ~1e-16 rounding in squared distances
    assert fed < 0.05 * otdd_exact(a.x, a.y, shifted.x, shifted.y)


def test_pairwise_matrix_orders_like_exact_and_is_reproducible() -> None:
    clients = [labelled(f"c{k}", 40, shift, 10 + k) for k, shift in enumerate([0.0, 0.5, 3.0, 6.0])]
    config = FedWaDConfig(support_size=40, iterations=20, solver="network_simplex")
    d, ledger = pairwise_federated_otdd(clients, config, seed=4)
    d2, _ = pairwise_federated_otdd(clients, config, seed=4)
    np.testing.assert_array_equal(d, d2)
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)
    assert d[0, 1] < d[0, 2] < d[0, 3]
    assert len({e.session for e in ledger.entries}) == 6


def test_pair_sessions_run_in_any_order_give_the_pairwise_matrix() -> None:
    """A stage fans the per-pair sessions out as jobs: run backwards, they give the same matrix and ledger."""
    clients = [labelled(f"c{k}", 30, shift, 20 + k) for k, shift in enumerate([0.0, 1.0, 4.0])]
    config = FedWaDConfig(support_size=20, iterations=5)
    d, ledger = pairwise_federated_otdd(clients, config, seed=7)
    sessions = pairwise_sessions(clients, config, seed=7)
    assert [(s["a"].name, s["b"].name) for s in sessions] == [("c0", "c1"), ("c0", "c2"), ("c1", "c2")]
    results = [federated_otdd(**s) for s in reversed(sessions)][::-1]
    d2, ledger2 = matrix_and_ledger(len(clients), results)
    np.testing.assert_array_equal(d, d2)
    assert ledger2.total_bytes == ledger.total_bytes and len(ledger2.entries) == len(ledger.entries)
    with_self = pairwise_sessions(clients, config, seed=7, include_diagonal=True)
    assert len(with_self) == 6 and with_self[1]["seed"] == sessions[0]["seed"]  # (0, 1): same pair, same seed


def test_degenerate_clients_are_named() -> None:
    good = labelled("good", 20, 0.0, 1)
    empty = LabelledData("empty-client", np.zeros((0, 3)), np.zeros(0, dtype=int))
    with pytest.raises(DegenerateClientError, match="empty-client"):
        federated_otdd(good, empty, CONFIG)
    lonely = LabelledData("lonely-class", np.vstack([good.x, [[9.0, 9.0, 9.0]]]), np.append(good.y, 7))
    with pytest.raises(DegenerateClientError, match="lonely-class"):
        federated_otdd(good, lonely, CONFIG)
    nan_x = good.x.copy()
    nan_x[3, 1] = np.nan
    with pytest.raises(DegenerateClientError, match="nan-client"):
        federated_otdd(good, LabelledData("nan-client", nan_x, good.y), CONFIG)


def test_single_class_client_gives_a_finite_distance() -> None:
    a = labelled("a", 30, 0.0, 1, classes=1)
    b = labelled("b", 30, 1.0, 2, classes=2)
    value = federated_otdd(a, b, CONFIG).estimate
    assert np.isfinite(value) and value > 0


def test_server_sees_no_sample_label_or_statistic() -> None:
    a, b = labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2)
    channel = Channel(keep_inbox=True)
    federated_otdd(a, b, FedWaDConfig(support_size=30, iterations=5, interpolation="exact"), channel=channel)
    received = channel.received_by("server")
    supports = [arr for m in received for arr in m.arrays() if arr.ndim == 2]
    assert supports and all(s.shape[1] == 3 * a.x.shape[1] for s in supports)  # augmented space only
    private = {}
    for data in (a, b):  # raw features, augmented samples [x; m_y; s_y], class statistics [m_y; s_y]
        augmented = augment_with_label_stats(data.x, data.y, class_statistics(data.x, data.y))
        private[data.name] = [data.x, augmented, np.unique(augmented[:, data.x.shape[1]:], axis=0)]
    assert_boundary_holds(received, private)  # every field, every window (tests/privacy_boundary.py)
