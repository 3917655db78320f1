"""FedAvg as pure functions: aggregation is the weighted mean; one client = centralised training
(checked against an independent NumPy softmax-regression gradient descent)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from otfed.fl import client_update, evaluate, fedavg, init_state, predict, server_aggregate


def softmax_regression_gd(W: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float, steps: int):
    """Independent reference: full-batch gradient descent on mean cross-entropy, by hand.
    logits = x Wᵀ + b; ∇_W = (softmax − onehot)ᵀ x / n, ∇_b = mean(softmax − onehot)."""
    onehot = np.eye(W.shape[0])[y]
    for _ in range(steps):
        z = x @ W.T + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        residual = (p - onehot) / len(y)
        W, b = W - lr * residual.T @ x, b - lr * residual.sum(axis=0)
    return W, b


def blobs(n: int, seed: int, classes: int = 3, d: int = 4):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = rng.standard_normal((n, d)) + 2.0 * np.eye(classes, d)[y]
    return x, y


def test_one_client_fedavg_equals_centralised_gradient_descent() -> None:
    x, y = blobs(60, 0)
    state = init_state(4, 3, seed=1, dtype=torch.float64)
    rounds, epochs, lr = 4, 3, 0.3
    result = fedavg([(x, y)], state, rounds=rounds, epochs=epochs, lr=lr)
    W, b = softmax_regression_gd(state["layers.0.weight"].numpy(), state["layers.0.bias"].numpy(), x, y, lr,
                                 rounds * epochs)
    np.testing.assert_allclose(result.state["layers.0.weight"].numpy(), W, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result.state["layers.0.bias"].numpy(), b, rtol=1e-10, atol=1e-12)


def test_one_client_fedavg_equals_centralised_minibatch_sgd() -> None:
    """Mini-batches: one client for R rounds equals R chained client updates with the same seeds."""
    x, y = blobs(50, 1)
    state = init_state(4, 3, hidden=(8,), seed=2)
    result = fedavg([(x, y)], state, rounds=3, epochs=2, lr=0.1, batch_size=16, seed=7)
    chained = state
    for r in range(3):
        seed = int(np.random.SeedSequence([7, r, 0]).generate_state(1)[0])
        chained = client_update(chained, (x, y), epochs=2, lr=0.1, seed=seed, batch_size=16)
    for key in state:
        torch.testing.assert_close(result.state[key], chained[key], rtol=0, atol=0)


def test_server_aggregate_is_the_weighted_mean() -> None:
    s1 = {"layers.0.weight": torch.tensor([[1.0, 2.0]]), "layers.0.bias": torch.tensor([0.0])}
    s2 = {"layers.0.weight": torch.tensor([[3.0, -2.0]]), "layers.0.bias": torch.tensor([4.0])}
    out = server_aggregate([s1, s2], weights=[1, 3])
    torch.testing.assert_close(out["layers.0.weight"], torch.tensor([[2.5, -1.0]]))
    torch.testing.assert_close(out["layers.0.bias"], torch.tensor([3.0]))
    with pytest.raises(ValueError):
        server_aggregate([s1, s2], weights=[1])
    with pytest.raises(ValueError):
        server_aggregate([s1, {"other": torch.zeros(1)}], weights=[1, 1])


def test_client_update_is_pure_and_seeded() -> None:
    x, y = blobs(30, 2)
    state = init_state(4, 3, seed=0)
    before = {k: v.clone() for k, v in state.items()}
    a = client_update(state, (x, y), epochs=2, lr=0.1, seed=5, batch_size=8)
    b = client_update(state, (x, y), epochs=2, lr=0.1, seed=5, batch_size=8)
    c = client_update(state, (x, y), epochs=2, lr=0.1, seed=6, batch_size=8)
    for key in state:
        torch.testing.assert_close(state[key], before[key], rtol=0, atol=0)
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert any(not torch.equal(a[k], c[k]) for k in state)


def test_evaluate_counts_argmax_hits() -> None:
    state = {"layers.0.weight": torch.tensor([[1.0, 0.0], [0.0, 1.0]]), "layers.0.bias": torch.zeros(2)}
    x = np.array([[2.0, 1.0], [0.0, 3.0], [5.0, 4.0], [1.0, 2.0]])
    np.testing.assert_array_equal(predict(state, x), [0, 1, 0, 1])
    assert evaluate(state, x, np.array([0, 1, 1, 1])) == pytest.approx(0.75)


def test_fedavg_learns_separable_blobs_with_mlp() -> None:
    x, y = blobs(300, 3)
    clients = [(x[i::3], y[i::3]) for i in range(3)]
    xt, yt = blobs(300, 4)
    result = fedavg(clients, init_state(4, 3, hidden=(16,), seed=0), rounds=5, epochs=3, lr=0.2, batch_size=20,
                    eval_data=(xt, yt))
    assert len(result.accuracy) == 5 and result.accuracy[-1] > 0.85


def test_init_state_is_reproducible_across_concurrent_threads() -> None:
    """Regression: seeding torch's global RNG from Prefect worker threads interleaved the draws."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from otfed.fl.fedavg import init_state

    reference = init_state(32, 10, hidden=(16,), seed=3)
    with ThreadPoolExecutor(max_workers=8) as pool:
        states = list(pool.map(lambda _: init_state(32, 10, hidden=(16,), seed=3), range(64)))
    for state in states:
        for key, value in reference.items():
            assert torch.equal(state[key], value)
    assert not torch.equal(init_state(32, 10, seed=4)["layers.0.weight"] if "layers.0.weight" in reference
                           else next(iter(init_state(32, 10, seed=4).values())),
                           next(iter(init_state(32, 10, seed=3).values())))


def test_fedavg_runs_every_model_on_the_given_device_and_moves_data_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model FedAvg builds (local updates and evaluation) is built on the device it is given — "cpu:0",
    a device name distinct from the default that the CPU still runs — each client's data are converted once
    for all rounds, and the numbers are those of the default device."""
    import importlib

    from otfed.fl import FedAvgConfig, fedavg_accuracy

    module = importlib.import_module("otfed.fl.fedavg")  # the module (otfed.fl.fedavg is also the function)

    x, y = blobs(90, 3)
    clients = [(x[:30], y[:30]), (x[30:60], y[30:60]), (x[60:], y[60:])]
    config = FedAvgConfig(rounds=3, epochs=2, lr=0.2, batch_size=8, hidden=[5])
    expected = fedavg_accuracy(clients, (x, y), 3, config, seed=4)
    built, converted = [], []
    real_build, real_tensors = module.build_model, module._tensors

    def build(state, device="cpu"):
        built.append(str(device))
        return real_build(state, device)

    def tensors(x, y, dtype, device):
        converted.append(str(device))
        return real_tensors(x, y, dtype, device)

    monkeypatch.setattr(module, "build_model", build)
    monkeypatch.setattr(module, "_tensors", tensors)
    assert fedavg_accuracy(clients, (x, y), 3, config, seed=4, device="cpu:0", num_threads=1) == expected
    assert built == ["cpu:0"] * (3 * 3 + 1)  # 3 rounds × 3 clients, then the evaluation
    assert converted == ["cpu:0"] * 3  # one conversion per client, not one per round
    result = module.fedavg(clients, init_state(4, 3, seed=0), rounds=2, epochs=1, lr=0.1, device="cpu:0")
    assert all(v.device == torch.device("cpu") for v in result.state.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_recording_updates_changes_nothing_and_the_updates_rebuild_each_round(dtype: torch.dtype) -> None:
    """record_updates: the final state is bit-identical to the unrecorded run; per round r the recorded
    start is the previous round's global state (M^0 = the initial state) and M^{r−1} + Σ_k ω_k Δ_k^r / Σ_k ω_k
    (here by hand, in float64) is M^r; states come back on CPU."""
    clients = [blobs(n, seed) for n, seed in [(30, 10), (45, 11), (20, 12)]]
    state = init_state(4, 3, hidden=(5,), seed=3, dtype=dtype)
    kwargs = dict(rounds=3, epochs=2, lr=0.2, batch_size=8, seed=4)
    plain = fedavg(clients, state, **kwargs)
    recorded = fedavg(clients, state, record_updates=True, **kwargs)
    assert plain.rounds == [] and len(recorded.rounds) == 3
    for key in state:
        assert torch.equal(plain.state[key], recorded.state[key])
        assert torch.equal(recorded.rounds[0].start[key], state[key])
    ends = [u.start for u in recorded.rounds[1:]] + [recorded.state]
    atol = 1e-6 if dtype == torch.float32 else 1e-13
    for update, end in zip(recorded.rounds, ends):
        assert update.weights == [30.0, 45.0, 20.0]
        w = np.array(update.weights) / sum(update.weights)
        for key in state:
            rebuilt = update.start[key].double() + sum(float(w_k) * d[key].double() for w_k, d in zip(w, update.deltas))
            np.testing.assert_allclose(rebuilt.numpy(), end[key].double().numpy(), rtol=0, atol=atol)
            assert update.start[key].device.type == "cpu" and update.start[key].dtype == dtype
            assert all(d[key].device.type == "cpu" for d in update.deltas)
        assert any(not torch.equal(d[key], update.deltas[0][key]) for d in update.deltas[1:] for key in state)


@pytest.mark.parametrize("train_all", [True, False])
def test_sgd_epochs_is_torch_optim_sgd_bit_for_bit(train_all: bool) -> None:
    """The written-out SGD step equals ``torch.optim.SGD`` (no momentum, no weight decay) exactly, over
    shuffled mini-batches with a ragged last batch, on all parameters or on the first layer only (FedRep's
    body phase trains a subset; a parameter the loss does not reach is left alone by both)."""
    from torch import nn

    from otfed.fl.fedavg import sgd_epochs

    def model() -> nn.Sequential:
        torch.manual_seed(3)
        return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))

    rng = torch.Generator().manual_seed(0)
    x, y = torch.randn(23, 6, generator=rng), torch.randint(0, 3, (23,), generator=rng)
    orders = torch.stack([torch.randperm(23, generator=rng) for _ in range(3)])
    mine, theirs = model(), model()
    if not train_all:
        for m in (mine, theirs):
            m[2].requires_grad_(False)
    params = [p for p in mine.parameters() if p.requires_grad]
    sgd_epochs(params, mine, x, y, orders, 4, 0.3)
    optimiser = torch.optim.SGD([p for p in theirs.parameters() if p.requires_grad], lr=0.3)
    for order in orders:
        for start in range(0, 23, 4):
            idx = order[start:start + 4]
            optimiser.zero_grad()
            nn.CrossEntropyLoss()(theirs(x[idx]), y[idx]).backward()
            optimiser.step()
    assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), theirs.parameters()))
    assert not torch.equal(mine[0].weight, model()[0].weight)  # it did train
    assert torch.equal(mine[2].weight, model()[2].weight) != train_all
