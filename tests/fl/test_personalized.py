"""FedPer / FedRep and FedAvg within clusters (FedWaD §5), against independent references: a NumPy weighted
mean of the bodies, a NumPy softmax-regression gradient descent for FedRep's head phase, plain local SGD
(otfed.fl.fedavg.client_update) for one-client FedPer, otfed.fl.fedavg.fedavg for FedAvg within a cluster,
and a problem with conflicting label maps whose attainable accuracies are known."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.fl.test_fedavg import softmax_regression_gd  # the independent reference, by hand

from otfed.errors import ConfigError
from otfed.fl import (PersonalizedConfig, aggregate_bodies, client_update, evaluate, fedavg, fedper,
                      fedper_client_update, fedrep, fedrep_client_update, init_state, join_state,
                      per_cluster_accuracy, split_state)


def blobs(n: int, seed: int, classes: int = 3, d: int = 4):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, d)) + 2.0 * np.eye(classes, d)[y]
    return x, y


def conflicting_groups(seed: int, per_group: int = 4, n: int = 40, d: int = 4, m: float = 3.0):
    """Two groups of clients on the same features: class 1 at +m e_1 and class 0 at −m e_1 in group 0, the
    labels swapped in group 1. Knowing the group, the Bayes accuracy is Φ(m) ≈ 0.9987; one classifier for
    both groups gets half of the pooled samples wrong whatever it does (≈ 50 %)."""
    rng = np.random.default_rng(seed)
    clients, groups = [], []
    for g in (0, 1):
        for _ in range(per_group):
            parts = []
            for _ in ("train", "test"):
                y = rng.integers(0, 2, n)
                x = rng.standard_normal((n, d))
                x[:, 0] += np.where(y == 1, m, -m)
                parts.append((x, y if g == 0 else 1 - y))
            clients.append(tuple(parts))
            groups.append(g)
    return clients, groups


def seed_of(seed: int, r: int, k: int) -> int:
    return int(np.random.SeedSequence([seed, r, k]).generate_state(1)[0])


CONFIG = PersonalizedConfig(rounds=5, epochs=2, head_epochs=2, body_epochs=1, lr=0.1, batch_size=10, hidden=[8])


def test_split_and_join_are_inverse_and_the_head_is_the_last_layer() -> None:
    state = init_state(4, 3, hidden=(6, 5), seed=0)
    body, head = split_state(state)
    assert sorted(body) == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"]
    assert sorted(head) == ["layers.2.bias", "layers.2.weight"]
    assert all(torch.equal(join_state(body, head)[k], state[k]) for k in state)
    with pytest.raises(ValueError, match="single layer"):
        split_state(init_state(4, 3, seed=0))
    middle = {k: v for k, v in state.items() if k.startswith("layers.1.")}
    with pytest.raises(ValueError, match="last layer layers.2"):
        join_state({k: v for k, v in state.items() if not k.startswith("layers.1.")}, middle)
    with pytest.raises(ValueError, match="share keys"):
        join_state(body, middle)


def test_one_round_body_is_the_size_weighted_mean_and_heads_never_pass_the_server() -> None:
    """fedper / fedrep, one round: the body is the NumPy n_k-weighted mean of the client bodies that the
    independent client updates produce; every head is exactly that client's own update."""
    clients = [blobs(n, seed) for n, seed in ((20, 1), (35, 2), (50, 3))]
    sizes = np.array([20.0, 35.0, 50.0])
    state = init_state(4, 3, hidden=(6,), seed=4, dtype=torch.float64)
    body0, head0 = split_state(state)
    runs = {
        "fedper": (fedper(clients, state, rounds=1, epochs=2, lr=0.1, seed=9, batch_size=8),
                   lambda k, d: fedper_client_update(body0, head0, d, epochs=2, lr=0.1, seed=seed_of(9, 0, k),
                                                     batch_size=8)),
        "fedrep": (fedrep(clients, state, rounds=1, head_epochs=3, body_epochs=1, lr=0.1, seed=9, batch_size=8),
                   lambda k, d: fedrep_client_update(body0, head0, d, head_epochs=3, body_epochs=1, lr=0.1,
                                                     seed=seed_of(9, 0, k), batch_size=8)),
    }
    for name, (result, update) in runs.items():
        local = [update(k, d) for k, d in enumerate(clients)]
        for key in body0:
            by_hand = np.einsum("k,k...->...", sizes / sizes.sum(), np.stack([b[key].numpy() for b, _ in local]))
            np.testing.assert_allclose(result.body[key].numpy(), by_hand, rtol=1e-12, atol=1e-14, err_msg=name)
        for k, (_, head) in enumerate(local):
            assert set(result.heads[k]) == set(head0)
            assert all(torch.equal(result.heads[k][key], head[key]) for key in head), (name, k)
        assert not torch.equal(result.heads[0]["layers.1.weight"], result.heads[1]["layers.1.weight"])


def test_aggregate_bodies_by_hand_and_bad_input() -> None:
    b1 = {"layers.0.weight": torch.tensor([[1.0, 2.0]]), "layers.0.bias": torch.tensor([0.0])}
    b2 = {"layers.0.weight": torch.tensor([[3.0, -2.0]]), "layers.0.bias": torch.tensor([4.0])}
    out = aggregate_bodies([b1, b2], weights=[1, 3])
    torch.testing.assert_close(out["layers.0.weight"], torch.tensor([[2.5, -1.0]]))
    torch.testing.assert_close(out["layers.0.bias"], torch.tensor([3.0]))
    with pytest.raises(ValueError, match="one weight per state"):
        aggregate_bodies([b1, b2], weights=[1])
    with pytest.raises(ValueError, match="body 1"):
        aggregate_bodies([b1, {"layers.0.weight": torch.zeros(1, 2)}], weights=[1, 1])


def test_fedrep_head_phase_is_softmax_regression_on_frozen_features_and_body_phase_keeps_the_head() -> None:
    x, y = blobs(40, 5)
    state = init_state(4, 3, hidden=(6,), seed=1, dtype=torch.float64)
    body, head = split_state(state)
    # head phase only: body bitwise unchanged, head = gradient descent on features ReLU(W₀x + b₀), by hand
    b_h, h_h = fedrep_client_update(body, head, (x, y), head_epochs=5, body_epochs=0, lr=0.3, seed=0)
    assert all(torch.equal(b_h[k], body[k]) for k in body)
    features = np.maximum(x @ body["layers.0.weight"].numpy().T + body["layers.0.bias"].numpy(), 0.0)
    W, b = softmax_regression_gd(head["layers.1.weight"].numpy(), head["layers.1.bias"].numpy(), features, y,
                                 0.3, 5)
    np.testing.assert_allclose(h_h["layers.1.weight"].numpy(), W, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(h_h["layers.1.bias"].numpy(), b, rtol=1e-10, atol=1e-12)
    # body phase only: head bitwise unchanged, body moved
    b_b, h_b = fedrep_client_update(body, head, (x, y), head_epochs=0, body_epochs=2, lr=0.3, seed=0,
                                    batch_size=8)
    assert all(torch.equal(h_b[k], head[k]) for k in head)
    assert not torch.equal(b_b["layers.0.weight"], body["layers.0.weight"])
    # the two phases compose (full batch: no randomness) …
    b_both, h_both = fedrep_client_update(body, head, (x, y), head_epochs=5, body_epochs=2, lr=0.3, seed=0)
    b_chain, h_chain = fedrep_client_update(b_h, h_h, (x, y), head_epochs=0, body_epochs=2, lr=0.3, seed=0)
    for mine, chained in ((b_both, b_chain), (h_both, h_chain)):
        for k in mine:
            torch.testing.assert_close(mine[k], chained[k], rtol=1e-12, atol=1e-14)
    # … and the inputs are not modified
    assert all(torch.equal(state[k], join_state(body, head)[k]) for k in state)


def test_one_client_fedper_is_local_sgd_of_the_whole_model() -> None:
    x, y = blobs(50, 6)
    state = init_state(4, 3, hidden=(8,), seed=2)
    result = fedper([(x, y)], state, rounds=1, epochs=3, lr=0.1, seed=7, batch_size=16)
    local = client_update(state, (x, y), epochs=3, lr=0.1, seed=seed_of(7, 0, 0), batch_size=16)
    for key in state:
        torch.testing.assert_close(result.state(0)[key], local[key], rtol=0, atol=0)


def test_fedavg_within_clusters_is_fedavg_over_each_cluster() -> None:
    clients, groups = conflicting_groups(1, per_group=3)
    state = init_state(4, 2, hidden=CONFIG.hidden, seed=3)
    for clusters in (None, groups):
        got = per_cluster_accuracy(clients, clusters, "fedavg", CONFIG, n_classes=2, seed=3)
        labels = np.zeros(len(clients), int) if clusters is None else np.asarray(clusters)
        for g in np.unique(labels):
            members = np.flatnonzero(labels == g)
            final = fedavg([clients[k][0] for k in members], state, rounds=CONFIG.rounds, epochs=CONFIG.epochs,
                           lr=CONFIG.lr, seed=3, batch_size=CONFIG.batch_size).state
            for k in members:
                assert got.accuracy[k] == evaluate(final, *clients[k][1])
        assert got.total.tolist() == [len(c[1][1]) for c in clients]
        assert got.pooled == got.correct.sum() / got.total.sum()


def test_conflicting_label_maps_need_clusters_or_personal_heads() -> None:
    """Global FedAvg cannot beat ~50 % pooled; FedAvg within the true clusters, and FedPer / FedRep with
    personal heads even in one global federation, get near the Bayes accuracy."""
    clients, groups = conflicting_groups(0)
    acc = {(alg, c is not None): per_cluster_accuracy(clients, c, alg, CONFIG, n_classes=2, seed=0).pooled
           for alg in ("fedavg", "fedper", "fedrep") for c in (None, groups)}
    assert acc["fedavg", False] < 0.6
    assert acc["fedavg", True] > 0.9
    for alg in ("fedper", "fedrep"):
        assert acc[alg, False] > 0.9 and acc[alg, True] > 0.9, acc


def test_same_seed_same_numbers() -> None:
    clients, groups = conflicting_groups(2, per_group=2, n=30)
    for alg in ("fedavg", "fedper", "fedrep"):
        a = per_cluster_accuracy(clients, groups, alg, CONFIG, n_classes=2, seed=5)
        b = per_cluster_accuracy(clients, groups, alg, CONFIG, n_classes=2, seed=5)
        assert np.array_equal(a.correct, b.correct) and np.array_equal(a.total, b.total)
    x, y = blobs(30, 0)
    state = init_state(4, 3, hidden=(6,), seed=0)
    r1 = fedrep([(x, y), blobs(20, 1)], state, rounds=2, head_epochs=2, body_epochs=1, lr=0.1, seed=4, batch_size=7)
    r2 = fedrep([(x, y), blobs(20, 1)], state, rounds=2, head_epochs=2, body_epochs=1, lr=0.1, seed=4, batch_size=7)
    r3 = fedrep([(x, y), blobs(20, 1)], state, rounds=2, head_epochs=2, body_epochs=1, lr=0.1, seed=5, batch_size=7)
    assert all(torch.equal(r1.body[k], r2.body[k]) for k in r1.body)
    assert any(not torch.equal(r1.body[k], r3.body[k]) for k in r1.body)


def test_bad_input_names_the_client() -> None:
    clients, groups = conflicting_groups(3, per_group=2, n=10)
    empty = list(clients)
    empty[2] = ((np.zeros((0, 4)), np.zeros(0, int)), clients[2][1])
    with pytest.raises(ValueError, match="client 2: no training samples"):
        per_cluster_accuracy(empty, groups, "fedper", CONFIG, n_classes=2)
    with pytest.raises(ValueError, match="client 2: no training samples"):
        fedrep([c[0] for c in empty], init_state(4, 2, hidden=(3,)), rounds=1, head_epochs=1, body_epochs=1, lr=0.1)
    mismatched = list(clients)
    mismatched[1] = (clients[1][0], (clients[1][1][0], clients[1][1][1][:-1]))
    with pytest.raises(ValueError, match="client 1: test x must be"):
        per_cluster_accuracy(mismatched, groups, "fedavg", CONFIG, n_classes=2)
    with pytest.raises(ValueError, match="client 1: x must be"):
        fedper([clients[0][0], (clients[1][0][0], clients[1][0][1][:-1])], init_state(4, 2, hidden=(3,)),
               rounds=1, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="one cluster label per client: 4 clients"):
        per_cluster_accuracy(clients, groups[:-1], "fedrep", CONFIG, n_classes=2)
    with pytest.raises(ValueError, match="client 0: train labels must be in 0 … 0"):
        per_cluster_accuracy(clients, groups, "fedavg", CONFIG, n_classes=1)
    with pytest.raises(ValueError, match="algorithm"):
        per_cluster_accuracy(clients, groups, "fedprox", CONFIG, n_classes=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="single layer"):
        fedper([c[0] for c in clients], init_state(4, 2), rounds=1, epochs=1, lr=0.1)
    with pytest.raises(ConfigError, match="hidden"):
        PersonalizedConfig(hidden=[])
