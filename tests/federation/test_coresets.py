"""Federated Wasserstein coresets (FedWaD §5) against independent truth: finite differences of POT's exact
W_2², closed-form coresets (K tight blobs → their means; K = 1 → the mean), brute-force nearest neighbours,
and the privacy boundary (what the server received)."""
from __future__ import annotations

import inspect
from itertools import permutations

import numpy as np
import ot
import pytest

from otfed.errors import ConfigError
from otfed.federation import (Channel, CoresetClassifier, CoresetClient, CoresetConfig,
                              CoresetInputError, CoresetServer, DistanceMessage, FedWaDConfig,
                              LabelledCoresetMessage, LabelledData, MeasureMessage, Message, client_accuracies,
                              client_coreset, client_coresets, coreset_classifier, coreset_gradient,
                              coreset_session, federated_wasserstein_coreset, geodesic_fraction,
                              projection_distance, wasserstein_coreset)
from otfed.federation.messages import CountMessage
from otfed.ot import Measure, interpolate_exact
from tests.privacy_boundary import assert_boundary_holds


def exact_w2_squared(c: np.ndarray, x: np.ndarray) -> float:
    """Independent reference: POT's network simplex, uniform weights, squared Euclidean cost."""
    return float(ot.emd2(ot.unif(len(c)), ot.unif(len(x)), ot.dist(c, x), numItermax=10_000_000))


def exact_w2(c: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(exact_w2_squared(c, x)))


def fd_gradient(c: np.ndarray, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central finite differences of W_2²(C, μ) in every coordinate of the coreset."""
    grad = np.zeros_like(c)
    for idx in np.ndindex(*c.shape):
        up, down = c.copy(), c.copy()
        up[idx] += h
        down[idx] -= h
        grad[idx] = (exact_w2_squared(up, x) - exact_w2_squared(down, x)) / (2 * h)
    return grad


def blobs(seed: int, k: int = 3, per_blob: int = 60, d: int = 2, std: float = 0.01, spread: float = 5.0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, spread, (k, d))
    x = np.vstack([c + std * rng.standard_normal((per_blob, d)) for c in centers])
    return x, np.repeat(np.arange(k), per_blob), centers


def matched_error(found: np.ndarray, truth: np.ndarray) -> float:
    """Largest distance between matched points, minimised over permutations (K ≤ 4 here)."""
    return min(float(np.max(np.linalg.norm(found[list(p)] - truth, axis=1)))
               for p in permutations(range(len(truth))))


def stratified(x: np.ndarray, y: np.ndarray, clients: int) -> list[np.ndarray]:
    """Every client gets the same number of samples of every blob (the clients hold the same measure)."""
    return [np.vstack([x[y == k][i::clients] for k in np.unique(y)]) for i in range(clients)]


# ---------------------------------------------------------------------------------------------- gradient


def test_gradient_is_k_times_the_finite_difference_gradient_of_exact_w2_squared() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, (30, 2))
    c = rng.normal(0.5, 1.5, (4, 2))  # generic point: the optimal plan is unique
    g = coreset_gradient(Measure.uniform(c), Measure.uniform(x))
    np.testing.assert_allclose(g, 4 * fd_gradient(c, x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("s", [0.25, 0.6])
def test_against_a_geodesic_point_the_gradient_is_scaled_by_its_time(s: float) -> None:
    """ξ_s = McCann interpolant (FedWaD eq. 5) between C and μ: g(C, ξ_s) = s · K·∇W_2²(C, μ), and the
    projection distances give ŝ = s."""
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, (25, 3))
    c = rng.normal(1.0, 2.0, (5, 3))
    coreset, data = Measure.uniform(c), Measure.uniform(x)
    plan = ot.emd(ot.unif(5), ot.unif(25), ot.dist(c, x), numItermax=10_000_000)
    xi = interpolate_exact(coreset, data, plan, s)
    np.testing.assert_allclose(coreset_gradient(coreset, xi), s * 5 * fd_gradient(c, x), rtol=1e-5, atol=1e-7)
    s_hat = geodesic_fraction(projection_distance(xi, coreset), projection_distance(xi, data))
    assert s_hat == pytest.approx(s, abs=1e-9)


@pytest.mark.parametrize("start", ["coreset", "random"])
def test_one_fedwad_session_gives_a_descent_direction(start: str) -> None:
    """The server's displacement from a whole FedWaD session against one client points down W_2²(C, ν)
    (positive inner product with −∇ from finite differences, every seed) and, divided by ŝ, approximates
    the exact displacement T_ν(x') − x' — from either ξ⁰."""
    rng = np.random.default_rng(3)
    x = np.vstack([rng.normal(0, 1, (60, 2)), rng.normal(4, 0.5, (40, 2))])
    c = rng.normal(1, 2, (4, 2))
    descent = -fd_gradient(c, x)
    cosines, errors = [], []
    config = CoresetConfig(points=4, epochs=1, session_start=start,
                           fedwad=FedWaDConfig(support_size=8, iterations=10))
    for seed in range(8):
        seeds = np.random.SeedSequence(seed).spawn(2)
        client = CoresetClient("c", x, config.fedwad, np.random.default_rng(seeds[0]))
        server = CoresetServer(config, np.random.default_rng(seeds[1]))
        server.initialise(2, init=c)
        server.register(client.count())
        outcome = coreset_session(client, server, Channel())
        d = outcome.displacement
        cosines.append(np.sum(d * descent) / np.linalg.norm(d) / np.linalg.norm(descent))
        exact_step = descent * 4 / 2  # D = −g/2 = −(K/2)∇W_2²
        errors.append(np.linalg.norm(d / outcome.fraction - exact_step) / np.linalg.norm(exact_step))
    assert min(cosines) > 0.5 and np.median(cosines) > 0.95
    assert np.median(errors) < 0.25


# --------------------------------------------------------------------------------------- closed forms


def test_exact_coreset_of_tight_blobs_is_their_means() -> None:
    x, _, centers = blobs(0)
    result = wasserstein_coreset(x, 3, epochs=10, seed=1)
    assert matched_error(result.coreset, centers) < 0.05
    history = np.array(result.history)
    assert np.all(np.diff(history) <= 1e-9)  # Lloyd-type steps never increase W_2(C, μ)
    assert history[-1] == pytest.approx(exact_w2(result.coreset, x), rel=1e-6)


@pytest.mark.parametrize("start", ["coreset", "random"])
def test_federated_coreset_of_tight_blobs_is_close_to_their_means(start: str) -> None:
    """Four clients holding the same three tight blobs (stratified split), S a multiple of K."""
    x, y, centers = blobs(0)
    exact = wasserstein_coreset(x, 3, epochs=10, seed=1).coreset
    config = CoresetConfig(points=3, epochs=25, clients_per_epoch=2, session_start=start,
                           fedwad=FedWaDConfig(support_size=9, iterations=10))
    result = federated_wasserstein_coreset(stratified(x, y, 4), config, seed=1)
    assert matched_error(result.coreset, centers) < 0.1
    assert exact_w2(result.coreset, x) < 1.5 * exact_w2(exact, x)
    assert matched_error(result.initial, centers) > 1.0  # it did move from its random start


@pytest.mark.parametrize("step", ["reweighted", "rescaled"])
def test_single_point_coreset_is_the_mean(step: str) -> None:
    """K = 1: argmin_x W_2(δ_x, μ) = the mean of μ, also for the federated bound Σ_c w_c W_2²(δ_x, ν_c) with
    clients of different sizes, means and spreads."""
    rng = np.random.default_rng(0)
    parts = [rng.normal(m, s, (n, 3)) for m, s, n in [(0.0, 1.0, 40), (3.0, 0.5, 80), (-2.0, 2.0, 60)]]
    mean = np.vstack(parts).mean(axis=0)
    exact = wasserstein_coreset(np.vstack(parts), 1, epochs=2, seed=0)
    np.testing.assert_allclose(exact.coreset[0], mean, atol=1e-10)
    config = CoresetConfig(points=1, epochs=30, clients_per_epoch=3, step=step,
                           fedwad=FedWaDConfig(support_size=20, iterations=10))
    federated = federated_wasserstein_coreset(parts, config, seed=0)
    assert np.linalg.norm(federated.coreset[0] - mean) < 0.05
    assert np.linalg.norm(federated.initial[0] - mean) > 0.5


# ------------------------------------------------------------------------------------ privacy, ledger


def test_server_never_receives_a_client_sample_and_the_ledger_counts_every_message() -> None:
    rng = np.random.default_rng(5)
    datasets = [LabelledData(f"c{i}", rng.normal(i, 1.0, (30, 2)), rng.integers(0, 2, 30)) for i in range(3)]
    S, iters, epochs, per_epoch = 6, 4, 3, 2
    config = CoresetConfig(points=3, epochs=epochs, clients_per_epoch=per_epoch,
                           fedwad=FedWaDConfig(support_size=S, iterations=iters))
    channel = Channel(keep_inbox=True)
    federated_wasserstein_coreset([d.x for d in datasets], config, seed=0, names=[d.name for d in datasets],
                                  channel=channel)
    labelled_channel = Channel(keep_inbox=True)
    client_coreset(datasets[0], config, seed=0, channel=labelled_channel)
    received = channel.received_by("server") + labelled_channel.received_by("server")
    allowed = (MeasureMessage, DistanceMessage, CountMessage, LabelledCoresetMessage)
    assert received and all(isinstance(m, allowed) for m in received)
    assert any(isinstance(m, LabelledCoresetMessage) for m in received)
    # every field of every message, every window of width 2 (tests/privacy_boundary.py)
    inspection = assert_boundary_holds(received, {d.name: d.x for d in datasets})
    assert inspection.values == sum(a.size for m in received for a in m.arrays())
    frame = channel.ledger.to_frame()
    # one count per client, then per session: ξ out and ξ_ν back per iteration, ξ^K out, two distances back
    assert len(frame) == 3 + epochs * per_epoch * (2 * iters + 3)
    assert (frame.kind == "sample_count").sum() == 3
    interpolants = frame[(frame.kind == "interpolant")]
    assert set(interpolants["shape"]) == {f"{S}x2"} and set(interpolants.receiver) == {"server"}
    assert set(frame[frame.payload == "distance"].kind) == {"distance", "projection_distance"}


def test_server_methods_take_messages_only() -> None:
    namespace = vars(__import__("otfed.federation.coresets", fromlist=["x"]))
    for name in ("register", "combine", "conclude"):
        for param in inspect.signature(getattr(CoresetServer, name)).parameters.values():
            if param.name == "self":
                continue
            annotation = eval(param.annotation, namespace) if isinstance(param.annotation, str) else param.annotation
            assert issubclass(annotation, Message), f"{name}({param.name}) takes {annotation}"
    param = inspect.signature(CoresetClassifier.from_messages).parameters["messages"]
    assert "LabelledCoresetMessage" in str(param.annotation)


# ------------------------------------------------------------------------------------------- 1-NN


def test_one_nn_over_labelled_client_coresets_classifies_separated_blobs() -> None:
    rng = np.random.default_rng(7)
    centers = rng.normal(0.0, 6.0, (6, 5))

    def draw(classes, n):
        y = np.repeat(classes, n)
        return centers[y] + 0.3 * rng.standard_normal((len(y), 5)), y

    pairs = [(0, 1), (2, 3), (4, 5), (1, 4)]
    train = [LabelledData(f"c{i}", *draw(p, 40)) for i, p in enumerate(pairs)]
    test = [LabelledData(f"c{i}", *draw(p, 25)) for i, p in enumerate(pairs)]
    config = CoresetConfig(points=4, epochs=15, fedwad=FedWaDConfig(support_size=8, iterations=8))
    coresets = client_coresets(train, config, seed=0)
    assert [c.name for c in coresets] == [d.name for d in train]
    assert all(c.points.shape == (4, 5) for c in coresets)
    # labels are those of the nearest client sample — brute force for one client
    data, labelled = train[3], coresets[3]
    for point, label in zip(labelled.points, labelled.labels):
        distances = [np.linalg.norm(point - sample) for sample in data.x]
        assert label == data.y[int(np.argmin(distances))]
    accuracies = client_accuracies(coreset_classifier(coresets), test)
    assert set(accuracies) == {d.name for d in test}
    assert min(accuracies.values()) >= 0.99


# --------------------------------------------------------------------------------- seeds, bad input


def test_same_seed_same_coreset() -> None:
    x, y, _ = blobs(2, per_blob=20)
    parts = stratified(x, y, 3)
    config = CoresetConfig(points=3, epochs=4, clients_per_epoch=2,
                           fedwad=FedWaDConfig(support_size=6, iterations=3))
    a = federated_wasserstein_coreset(parts, config, seed=4)
    seen: list[tuple[int, float]] = []
    b = federated_wasserstein_coreset(parts, config, seed=4, on_epoch=lambda e, loss: seen.append((e, loss)))
    c = federated_wasserstein_coreset(parts, config, seed=5)
    np.testing.assert_array_equal(a.coreset, b.coreset)
    assert a.history == b.history and seen == list(enumerate(a.history, start=1))
    assert not np.array_equal(a.coreset, c.coreset)
    np.testing.assert_array_equal(a.initial, wasserstein_coreset(x, 3, epochs=1, seed=4).initial)


def test_bad_input_is_a_clear_error() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 2))
    config = CoresetConfig(points=3, epochs=1, fedwad=FedWaDConfig(support_size=3, iterations=2))
    with pytest.raises(ValueError, match=r"coreset points K=11 must be between 1 and the number of samples n=10"):
        wasserstein_coreset(x, 11)
    with pytest.raises(ValueError, match=r"coreset points K=3 exceeds the 2 samples held by the clients"):
        federated_wasserstein_coreset([x[:1], x[1:2]], config)
    with pytest.raises(ValueError, match=r"client 'small': coreset points K=3 must be smaller than its n=3"):
        client_coreset(LabelledData("small", x[:3], np.zeros(3, int)), config)
    with pytest.raises(CoresetInputError, match=r"client 'empty' has no samples"):
        federated_wasserstein_coreset([x, np.zeros((0, 2))], config, names=["full", "empty"])
    assert issubclass(CoresetInputError, ValueError)
    with pytest.raises(CoresetInputError, match=r"client 'bad': samples contain NaN"):
        federated_wasserstein_coreset([np.full((5, 2), np.nan)], config, names=["bad"])
    with pytest.raises(ValueError, match=r"different feature dimensions: \{'a': 2, 'b': 3\}"):
        federated_wasserstein_coreset([x, rng.normal(size=(10, 3))], config, names=["a", "b"])
    with pytest.raises(ValueError, match=r"initial coreset must have shape \(3, 2\)"):
        federated_wasserstein_coreset([x], config, init=np.zeros((2, 2)))
    with pytest.raises(CoresetInputError, match=r"client 'lab': 10 samples but labels of shape \(9,\)"):
        client_coreset(LabelledData("lab", x, np.zeros(9, int)), config)
    with pytest.raises(ConfigError, match=r"fedwad.p: coreset sessions need p = 2"):
        CoresetConfig(fedwad=FedWaDConfig(p=1))
    with pytest.raises(ConfigError, match=r"lr"):
        CoresetConfig(lr=1.5)
