"""The privacy boundary, enforced (DESIGN "the privacy boundary is code").

Every field of everything the server received is inspected for near-copies of private samples and texts
(:mod:`tests.privacy_boundary`), and the clients run in their own processes, so that server-side code reaches
them only through their protocol methods and the channel. Honest runs of FedWaD (approximate and exact),
federated OTDD, FedBary and KNOT pass with a positive, independently counted number of inspected items; leaks
injected into the real code path at test time (monkeypatch, never an edit of a source file) are caught:
  (a) a raw sample + 1e-4 inside an interpolant, (b) the private dataset as an extra attribute of an interpolant
  message, (c) the server reading ``client._measure`` outside the channel, (d) a sample sent as a d×1 measure;
and, for KNOT, a private text in a message string, a private embedding as an extra attribute and a model object.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import sys
import textwrap
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from otfed.federation import (Channel, FedWaDConfig, LabelledData, MeasureMessage, WassersteinClient,
                              WassersteinServer, federated_otdd, federated_wasserstein)
from otfed.federation.fedbary import BaryClient, BaryServer, FedBaryConfig, fedbary, federated_valuation
from otfed.federation.messages import SERVER, DistanceMessage, Message
from otfed.federation.otdd import labelled_client
from otfed.label_space import LabelSpace
from otfed.ot import Measure, augment_with_label_stats, class_statistics
from tests.privacy_boundary import (BoundaryInspector, BoundaryViolation, IsolatedParty, UninspectableField,
                                    assert_boundary_holds, inspect_boundary, isolated_parties,
                                    nearest_neighbour_scale)

FEDWAD = importlib.import_module("otfed.federation.fedwad")  # the package re-exports a function of that name
KNOT = importlib.import_module("otfed.federation.knot")
FEDWAD_METHODS = ("interpolate", "distance")
BARY_METHODS = ("report", "update", "final_report", "datum_values")


# ------------------------------------------------------------------------------------------ helpers


def gaussians(n: int, m: int, d: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)), rng.standard_normal((m, d)) + 4.0 / np.sqrt(d)


def labelled(name: str, n: int, shift: float, seed: int, d: int = 3) -> LabelledData:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    return LabelledData(name, rng.standard_normal((n, d)) + shift + 3.0 * y[:, None], y)


def private_views(data: LabelledData) -> list[np.ndarray]:
    """A labelled client's private arrays: raw features, label-augmented samples [x; m_y; s_y], and its class
    statistics [m_y; s_y] (one row per class)."""
    augmented = augment_with_label_stats(data.x, data.y, class_statistics(data.x, data.y))
    return [data.x, augmented, np.unique(augmented[:, data.x.shape[1]:], axis=0)]


def payload_values(received: list[Message]) -> int:
    """Independent count: the numbers in every message's declared payload (``arrays()``)."""
    return sum(a.size for m in received for a in m.arrays())


def assert_every_field_counted(inspection, received: list[Message]) -> None:
    """The inspector read every message, every number of every payload, and three strings per message (kind,
    sender, receiver); no message carried anything beyond its declared fields."""
    assert inspection.roots == len(received) > 0
    assert inspection.values == payload_values(received) > 0
    assert inspection.strings >= 3 * len(received)
    assert inspection.extra_attributes == 0
    assert inspection.vectors > 0


# FedWaD: d = 5, the embedded-size case S = n (the setting where interpolants come closest to the data).
D, N = 5, 40
FEDWAD_CASES = {
    # (config, n_μ, n_ν): approximate with S = n_μ = n_ν (every plan a permutation); exact with unequal sizes
    # (atoms split, the support grows); A^k monitoring adds one distance per client and round.
    "approx": (FedWaDConfig(support_size=N, iterations=6, record_history=True), N, N),
    "exact": (FedWaDConfig(support_size=N, iterations=6, interpolation="exact"), N, 30),
}


def fedwad_run(case: str, isolated: bool, seed: int = 3) -> tuple[Any, Channel, dict[str, np.ndarray], Any]:
    """FedWaD between two Gaussian clouds, seeded exactly as :func:`federated_wasserstein`; the clients are
    built inside their own processes (``isolated``) or in this one. Returns result, channel, private data and
    the server."""
    config, n, m = FEDWAD_CASES[case]
    x, y = gaussians(n, m, D, seed=20 + seed)
    seeds = np.random.SeedSequence(seed).spawn(3)
    factories = [functools.partial(WassersteinClient, name, Measure.uniform(data), config, np.random.default_rng(s))
                 for name, data, s in zip(("client_mu", "client_nu"), (x, y), seeds)]
    server = WassersteinServer(config, np.random.default_rng(seeds[2]))
    channel = Channel(session="client_mu|client_nu", keep_inbox=True)
    if isolated:
        with isolated_parties(factories, FEDWAD_METHODS) as (mu, nu):
            result = FEDWAD.fedwad(mu, nu, server, channel)
    else:
        result = FEDWAD.fedwad(factories[0](), factories[1](), server, channel)
    return result, channel, {"client_mu": x, "client_nu": y}, server


def inject(monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, anchor: str, code: str) -> None:
    """Replace ``module.name`` by its own source with ``code`` inserted after the one line containing
    ``anchor`` (same indentation), compiled in the module's namespace: an edit of the file, made in memory
    for this test only."""
    source = textwrap.dedent(inspect.getsource(getattr(module, name)))
    lines = source.splitlines()
    hits = [i for i, line in enumerate(lines) if anchor in line]
    assert len(hits) == 1, f"anchor {anchor!r} occurs {len(hits)} times in {module.__name__}.{name}"
    indent = re.match(r"\s*", lines[hits[0]]).group()
    lines[hits[0] + 1:hits[0] + 1] = [indent + line for line in code.splitlines()]
    namespace = dict(vars(module))
    exec(compile("from __future__ import annotations\n" + "\n".join(lines),  # noqa: S102 — test-time injection
                 f"<{module.__name__}.{name} with an injected leak>", "exec"), namespace)
    monkeypatch.setattr(module, name, namespace[name])


# ------------------------------------------------------------------------------------------ honest runs


@pytest.mark.parametrize("case", sorted(FEDWAD_CASES))
def test_honest_fedwad_passes_every_field_inspected_with_clients_in_their_own_processes(case: str) -> None:
    """Clients in other processes give the same estimate as :func:`federated_wasserstein` (same seeds), and
    every field of every message the server received is free of near-copies of either client's samples."""
    result, channel, private, _ = fedwad_run(case, isolated=True)
    config = FEDWAD_CASES[case][0]
    reference = federated_wasserstein(private["client_mu"], private["client_nu"], config, seed=3)
    assert result.estimate == pytest.approx(reference.estimate, rel=1e-9)
    received = channel.received_by(SERVER)
    inspection = assert_boundary_holds(received, private)
    assert_every_field_counted(inspection, received)
    kinds = {msg.kind for msg in received}
    assert kinds == ({"interpolant", "distance", "monitor_distance"} if config.record_history
                     else {"interpolant", "distance"})
    assert inspection.closest > 2.0  # measured margin: no vector within 2 thresholds of a sample (module doc)


def test_honest_federated_otdd_hides_samples_features_and_class_statistics() -> None:
    """Federated OTDD (FedWaD on [x; m_y; s_y]) at S = n: no near-copy of a raw feature vector (it would sit
    inside an augmented row), of an augmented sample, or of a class's statistics; same estimate with the
    clients in their own processes."""
    a, b = labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2)
    config = FedWaDConfig(support_size=30, iterations=6, interpolation="exact")
    channel = Channel(keep_inbox=True)
    estimate = federated_otdd(a, b, config, seed=0, channel=channel).estimate
    received = channel.received_by(SERVER)
    inspection = assert_boundary_holds(received, {d.name: private_views(d) for d in (a, b)})
    assert_every_field_counted(inspection, received)
    seeds = np.random.SeedSequence(0).spawn(3)
    factories = [functools.partial(labelled_client, data, config, np.random.default_rng(s))
                 for data, s in zip((a, b), seeds)]
    with isolated_parties(factories, FEDWAD_METHODS) as (client_a, client_b):
        isolated = FEDWAD.fedwad(client_a, client_b, WassersteinServer(config, np.random.default_rng(seeds[2])))
    assert isolated.estimate == pytest.approx(estimate, rel=1e-9)


@pytest.mark.parametrize("validation", [False, True], ids=["barycenter", "validation"])
def test_honest_fedbary_passes_with_clients_in_their_own_processes(validation: bool) -> None:
    """FedBary at S = n with the clients in their own processes: the same distances as in one process, and
    nothing the server received (γ_i, d_i^client, the closing distances) is a near-copy of a client's data."""
    datasets = [labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2), labelled("c", 30, 2.0, 3)]
    target = labelled("server", 40, 0.5, 4) if validation else None
    config = FedBaryConfig(support_size=30, iterations=5)
    reference = federated_valuation(datasets, config, validation=target, seed=1)
    seeds = np.random.SeedSequence(1).spawn(len(datasets) + 1)
    factories = [functools.partial(BaryClient.from_data, data, config, np.random.default_rng(s))
                 for data, s in zip(datasets, seeds)]
    q = None if target is None else Measure.uniform(private_views(target)[1])
    channel = Channel(keep_inbox=True)
    with isolated_parties(factories, BARY_METHODS) as clients:
        result = fedbary(clients, BaryServer(config, np.random.default_rng(seeds[-1]), target=q), channel=channel)
    np.testing.assert_allclose(result.distances, reference.distances, rtol=1e-9)
    received = channel.received_by(SERVER)
    inspection = assert_boundary_holds(received, {d.name: private_views(d) for d in datasets})
    assert_every_field_counted(inspection, received)
    assert {m.kind for m in received} == {"gamma", "client_distance", "distance"}


# KNOT: the clients' private texts and their embeddings; the transfer set is public.
VOCABULARY = [f"{a}{b}" for a in ("bat", "cas", "del", "fit", "gra", "hum", "lig", "mus") for b in
              ("ter", "ion", "ly", "ment", "ness", "ful", "ing", "ed")]
N_LABELS, EMBED_DIM = 5, 16


def texts_of(rng: np.random.Generator, n: int) -> list[str]:
    return [" ".join(rng.choice(VOCABULARY, size=int(rng.integers(6, 12)))) for _ in range(n)]


def embed(texts: list[str]) -> np.ndarray:
    """A hashed bag of words (stable across processes: no Python hash)."""
    out = np.zeros((len(texts), EMBED_DIM))
    for i, text in enumerate(texts):
        for word in text.split():
            out[i, VOCABULARY.index(word) % EMBED_DIM] += 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def knot_client(name: str, texts: list[str], labels: np.ndarray, transfer: list[str], seed: int) -> list[Message]:
    """A KNOT client's side (KNOT §3): a nearest-centroid teacher trained on its own embedded texts labels the
    public transfer set; it sends those predictions, its dataset size and its probability bias (argmax
    frequencies on random texts, app. D.1), built by the library's message constructors."""
    x = embed(texts)
    centroids = np.stack([x[labels == c].mean(0) if (labels == c).any() else np.zeros(EMBED_DIM)
                          for c in range(N_LABELS)])

    def predict(batch: list[str]) -> np.ndarray:
        logits = -8.0 * ((embed(batch)[:, None, :] - centroids[None]) ** 2).sum(-1)
        p = np.exp(logits - logits.max(1, keepdims=True))
        return p / p.sum(1, keepdims=True)

    bias = np.bincount(predict(texts_of(np.random.default_rng(seed), 50)).argmax(1), minlength=N_LABELS) / 50
    return [*KNOT.client_messages(name, predict(transfer), len(texts)), KNOT.bias_message(name, bias)]


def knot_data(seed: int = 0) -> tuple[dict[str, list[str]], dict[str, np.ndarray], list[str]]:
    """Three parties' private texts and labels (unequal sizes), and the public transfer texts."""
    rng = np.random.default_rng(seed)
    sizes = {"cell_phones": 40, "music": 25, "baby": 12}
    texts = {name: texts_of(rng, n) for name, n in sizes.items()}
    labels = {name: rng.integers(0, N_LABELS, n) for name, n in sizes.items()}
    return texts, labels, texts_of(rng, 30)


def knot_federation(seed: int = 0) -> tuple[dict[str, list[str]], dict[str, np.ndarray], list[str], Channel]:
    """Every party's messages sent to the server; returns texts, their embeddings, the transfer set, channel."""
    texts, labels, transfer = knot_data(seed)
    channel = Channel(keep_inbox=True)
    for k, name in enumerate(texts):
        for message in knot_client(name, texts[name], labels[name], transfer, seed=k):
            channel.send(message)
    return texts, {name: embed(t) for name, t in texts.items()}, transfer, channel


def test_honest_knot_messages_ensemble_and_label_space_pass() -> None:
    """KNOT: every field of the prediction, count and bias messages (N×C and C-wide label-space payloads, not
    the feature width), of the server's TeacherEnsemble built from them and of the task's LabelSpace (a torch
    tensor) holds no client text and no near-copy of a client's text embedding."""
    texts, features, transfer, channel = knot_federation()
    received = channel.received_by(SERVER)
    ensemble = KNOT.server_ensemble(received, ["cell_phones", "music"], "baby")
    inspection = assert_boundary_holds([*received, ensemble, LabelSpace.for_task("sa")], features, texts)
    assert inspection.roots == len(received) + 2 == 11
    ensemble_values = (ensemble.probabilities.size + ensemble.dataset_sizes.size + ensemble.biases.size
                       + LabelSpace.for_task("sa").coordinates.numel())
    assert inspection.values == payload_values(received) + ensemble_values
    assert inspection.types["TeacherEnsemble"] == 1 and inspection.types["Tensor"] == 1
    assert inspection.strings >= 3 * len(received) + len(ensemble.names) + N_LABELS + 2
    # the transfer set is public: the same inspector flags it once it is declared private
    leaked = inspect_boundary([*received, transfer], features, {"public transfer set": transfer})
    assert len(leaked.leaks) == len(transfer)


def test_a_fixed_t_near_one_sends_near_copies_of_the_data_and_is_flagged() -> None:
    """Not an injected leak: the protocol itself. With S = n every plan is a permutation, so an interpolant
    atom is (1 − t)·ξ_i + t·x_σ(i): at t = 1 − 1e-5 the client sends its whole dataset to within
    1e-5·‖ξ − x‖.
    The inspector flags every sample of that client (t ~ U(0, 1) lands that close to 1 with probability
    ~1e-4 per message)."""
    x, y = gaussians(N, N, D, seed=23)
    channel = Channel(keep_inbox=True)
    federated_wasserstein(x, y, FedWaDConfig(support_size=N, iterations=2, t=1 - 1e-5), seed=3, channel=channel)
    inspection = inspect_boundary(channel.received_by(SERVER), {"client_mu": x, "client_nu": y})
    assert {(leak.client, leak.sample) for leak in inspection.leaks} >= {("client_mu", i) for i in range(N)}


# ------------------------------------------------------------------------------------------ injected leaks


def leak_near_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """(a) the client's interpolant carries its own sample #0 + 1e-4 (every coordinate) as atom 0."""
    honest = WassersteinClient.interpolate

    def interpolate(self: WassersteinClient, request: MeasureMessage) -> MeasureMessage:
        message = honest(self, request)
        support = message.measure.support.copy()
        support[0] = self._measure.support[0] + 1e-4
        return dataclasses.replace(message, measure=Measure(support, message.measure.weights))

    monkeypatch.setattr(WassersteinClient, "interpolate", interpolate)


def leak_extra_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    """(b) the client's interpolant message carries the whole private dataset as an extra attribute."""
    honest = WassersteinClient.interpolate

    def interpolate(self: WassersteinClient, request: MeasureMessage) -> MeasureMessage:
        message = honest(self, request)
        object.__setattr__(message, "dataset", self._measure.support)
        return message

    monkeypatch.setattr(WassersteinClient, "interpolate", interpolate)


def leak_column_measure(monkeypatch: pytest.MonkeyPatch) -> None:
    """(d) the driver sends a client's sample #0 as a d×1 measure (d one-dimensional atoms)."""
    inject(monkeypatch, FEDWAD, "fedwad", "d_nu = channel.send(client_nu.distance(final_nu))",
           "channel.send(MeasureMessage('interpolant', client_mu.name, SERVER,\n"
           "                            measure=Measure.uniform(client_mu._measure.support[:1].T)))")


@pytest.mark.parametrize("isolated", [False, True], ids=["in_process", "isolated"])
@pytest.mark.parametrize("leak", [leak_near_copy, leak_extra_attribute, leak_column_measure],
                         ids=["a_sample_plus_1e-4", "b_dataset_as_extra_attribute", "d_sample_as_dx1_measure"])
def test_injected_fedwad_leak_is_detected(leak, isolated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest run of the same data and seeds passes (test above); with the leak the boundary check fails,
    naming client_mu's sample #0. Leak (d) reads the client's measure in the driver: with the clients in
    their own processes it is stopped there, before anything is sent."""
    leak(monkeypatch)
    if isolated and leak is leak_column_measure:
        with pytest.raises(BoundaryViolation, match="'_measure' of client 'client_mu'"):
            fedwad_run("approx", isolated=True)
        return
    _, channel, private, _ = fedwad_run("approx", isolated=isolated)
    received = channel.received_by(SERVER)
    inspection = inspect_boundary(received, private)
    assert ("client_mu", 0) in {(found.client, found.sample) for found in inspection.leaks}
    with pytest.raises(AssertionError, match="near-copies of private samples"):
        assert_boundary_holds(received, private)
    if leak is leak_extra_attribute:  # on every interpolant of both clients: every sample of both
        iterations = FEDWAD_CASES["approx"][0].iterations
        assert inspection.extra_attributes == 2 * iterations
        assert {(c, i) for c in private for i in range(N)} <= {
            (found.client, found.sample) for found in inspection.leaks if "(extra attribute)" in found.path}
    if leak is leak_column_measure:
        column = [i for i, m in enumerate(received) if m.shape == (D, 1)]
        assert len(column) == 1 and any(found.path.startswith(f"[{column[0]}] MeasureMessage")
                                        for found in inspection.leaks)


def read_in_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) the driver hands the server a client's private support, outside the channel."""
    inject(monkeypatch, FEDWAD, "fedwad", "server.initialise(client_mu.dim)",
           "server.stolen = client_mu._measure.support.copy()")


def read_through_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c') a server method reaches into its caller's frame for the client object and reads its measure."""
    honest = WassersteinServer.combine

    def combine(self: WassersteinServer, msg_mu: MeasureMessage, msg_nu: MeasureMessage) -> Measure:
        self.stolen = sys._getframe(1).f_locals["client_mu"]._measure.support.copy()
        return honest(self, msg_mu, msg_nu)

    monkeypatch.setattr(WassersteinServer, "combine", combine)


@pytest.mark.parametrize("read", [read_in_driver, read_through_frame], ids=["driver", "server_method"])
def test_server_reading_a_client_outside_the_channel_fails(read, monkeypatch: pytest.MonkeyPatch) -> None:
    """(c) In one process the read succeeds silently — the server ends up holding the client's samples and no
    message shows it, so no inspection of messages can catch it. With the clients in their own processes the
    same code fails with a BoundaryViolation naming the attribute and the client."""
    read(monkeypatch)
    _, channel, private, server = fedwad_run("approx", isolated=False)
    np.testing.assert_array_equal(server.stolen, private["client_mu"])
    assert inspect_boundary(channel.received_by(SERVER), private).clean
    with pytest.raises(BoundaryViolation, match="'_measure' of client 'client_mu'"):
        fedwad_run("approx", isolated=True)


def test_injected_fedbary_leak_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A FedBary client whose γ_i carries its own label-augmented sample #0 + 1e-4 is caught (in its own
    process, the message crossing by pipe), in the augmented space and in the raw feature space."""
    honest = BaryClient.report

    def report(self: BaryClient) -> tuple[MeasureMessage, DistanceMessage]:
        gamma, distance = honest(self)
        support = gamma.measure.support.copy()
        support[0] = self._measure.support[0] + 1e-4
        return dataclasses.replace(gamma, measure=Measure(support, gamma.measure.weights)), distance

    monkeypatch.setattr(BaryClient, "report", report)
    datasets = [labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2)]
    config = FedBaryConfig(support_size=30, iterations=2)
    seeds = np.random.SeedSequence(1).spawn(3)
    channel = Channel(keep_inbox=True)
    factories = [functools.partial(BaryClient.from_data, data, config, np.random.default_rng(s))
                 for data, s in zip(datasets, seeds)]
    with isolated_parties(factories, BARY_METHODS) as clients:
        fedbary(clients, BaryServer(config, np.random.default_rng(seeds[-1])), channel=channel)
    inspection = inspect_boundary(channel.received_by(SERVER), {d.name: private_views(d)[:2] for d in datasets})
    widths = {leak.width for leak in inspection.leaks if leak.client == "a" and leak.sample == 0}
    assert widths == {3, 9}  # found as a raw x and as a label-augmented sample


def test_injected_knot_leaks_are_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A KNOT client that hides a training text in a message's kind, its embedding of another as an extra
    attribute, or ships its model object is caught: the first two as leaks, the third as a field the
    inspector cannot clear."""
    honest = KNOT.client_messages
    private_texts = knot_data(0)[0]["music"]

    def client_messages(party: str, transfer_probabilities: np.ndarray, n_train: int) -> list[Message]:
        prediction, count = honest(party, transfer_probabilities, n_train)
        if party == "music":
            prediction = dataclasses.replace(prediction, kind=f"{prediction.kind} ({private_texts[2]})")
            object.__setattr__(count, "embedding", embed([private_texts[5]])[0])
        return [prediction, count]

    monkeypatch.setattr(KNOT, "client_messages", client_messages)
    texts, features, _, channel = knot_federation()
    inspection = inspect_boundary(channel.received_by(SERVER), features, texts)
    found = {(leak.client, leak.sample, leak.path.endswith("(text)")) for leak in inspection.leaks}
    assert found == {("music", 2, True), ("music", 5, False)}
    assert inspection.extra_attributes == 1

    model = torch.nn.Linear(EMBED_DIM, N_LABELS)
    object.__setattr__(channel.received_by(SERVER)[0], "teacher", model)
    with pytest.raises(UninspectableField, match=r"\.teacher \(extra attribute\): cannot inspect a torch.nn"):
        inspect_boundary(channel.received_by(SERVER), features, texts)


# ------------------------------------------------------------------------------------------ the inspector itself


def test_nearest_neighbour_scale_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((25, 3))
    x = np.vstack([x, x[:2]])  # two duplicates: left out of the scale
    pairwise = np.linalg.norm(x[:, None] - x[None], axis=-1)
    np.fill_diagonal(pairwise, np.inf)
    nearest = pairwise.min(1)
    assert nearest_neighbour_scale(x) == pytest.approx(np.median(nearest[nearest > 0]), rel=1e-12)
    with pytest.raises(ValueError, match="all identical"):
        nearest_neighbour_scale(np.ones((4, 2)))


def test_every_hiding_place_is_found_and_counted() -> None:
    """Hand-made payloads: a sample as a row, as a column of a d×n array, as a d×1 array, as float32, inside a
    longer row, spread over d scalars of consecutive messages, in a dict value and a dict key, in a list of
    numbers, in an object array, as a torch tensor, in a nested dataclass — each found; the counts are exact."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 3))
    sample = x[7]
    noise = rng.standard_normal((4, 3)) * 10 + 30  # far from every sample

    cube = rng.standard_normal((2, 3, 5)) * 10 + 30
    cube[1, :, 4] = sample  # cube[1, :, 4] is a fibre of the middle axis

    @dataclasses.dataclass(frozen=True)
    class Envelope:
        inner: Any

    hiding = {
        "row": np.vstack([noise, sample]),
        "column": np.hstack([noise.T, sample[:, None]]),
        "dx1": sample[:, None],
        "float32": sample.astype(np.float32),
        "inside a longer row": np.concatenate([[5.0, 6.0], sample, [7.0]]),
        "dict value": {"a": sample.tolist()},
        "dict key": {tuple(sample): 1},
        "list": [float(v) for v in sample],
        "object array": np.array([None, sample], dtype=object),
        "tensor": torch.as_tensor(sample),
        "nested dataclass": Envelope(Envelope((1, sample))),
        "3-D, middle axis": cube,
    }
    for where, payload in hiding.items():
        inspection = inspect_boundary([payload], {"c": x})
        assert (("c", 7) in {(leak.client, leak.sample) for leak in inspection.leaks}), where
    spread = [DistanceMessage("distance", "c", SERVER, value=float(v)) for v in sample]
    assert {(leak.client, leak.sample) for leak in inspect_boundary(spread, {"c": x}).leaks} == {("c", 7)}

    clean = MeasureMessage("interpolant", "c", SERVER, measure=Measure.uniform(0.5 * (x[:10] + x[10:])))
    inspection = inspect_boundary([clean, clean], {"c": x})
    assert inspection.clean and inspection.roots == 2 and inspection.objects == 4
    assert inspection.fields == 2 * (1 + 3 + 1 + 2)  # message; kind, sender, receiver; measure; support, weights
    assert inspection.arrays == 4 and inspection.values == 2 * (10 * 3 + 10) and inspection.strings == 6
    # windows of 3: the C-order stream of both messages, then each support read along its first axis
    assert inspection.vectors == (80 - 2) + 2 * (30 - 2)


def test_threshold_is_relative_to_the_nearest_neighbour_scale() -> None:
    """A vector at 0.9 τ from a sample is a leak, at 1.1 τ it is not; τ scales with the data."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((30, 4))
    direction = rng.standard_normal(4)
    direction /= np.linalg.norm(direction)
    for scale in (1.0, 1e3):
        inspector = BoundaryInspector({"c": scale * x})
        tau = inspector.thresholds[("c", 4)]
        assert tau == pytest.approx(1e-3 * nearest_neighbour_scale(scale * x))
        assert not inspector.inspect([scale * x[3] + 0.9 * tau * direction]).clean
        assert inspector.inspect([scale * x[3] + 1.1 * tau * direction]).clean


def test_what_cannot_be_inspected_fails_loudly() -> None:
    x = np.random.default_rng(3).standard_normal((10, 2))
    for payload in (b"\x00\x01", 1 + 2j, np.zeros(3, dtype=complex), object(), len, torch.nn.Linear(2, 2)):
        with pytest.raises(UninspectableField, match=r"^\[0\]"):
            inspect_boundary([payload], {"c": x})
    with pytest.raises(AssertionError, match="received nothing"):
        assert_boundary_holds([], {"c": x})
    with pytest.raises(AssertionError, match="inspected nothing"):
        assert_boundary_holds([None, "text"], {"c": x})


def test_an_isolated_party_serves_its_protocol_methods_only() -> None:
    x = np.random.default_rng(4).standard_normal((8, 2))
    config = FedWaDConfig(support_size=3, iterations=1)
    factory = functools.partial(WassersteinClient, "c", Measure.uniform(x), config, np.random.default_rng(0))
    party = IsolatedParty(factory, FEDWAD_METHODS, public=("name", "dim"))
    try:
        assert (party.name, party.dim) == ("c", 2)
        request = MeasureMessage("xi", SERVER, "c", measure=Measure.uniform(x[:3] + 1.0))
        answer = party.distance(request)
        assert answer.value == pytest.approx(factory().distance(request).value, rel=1e-9)
        for name in ("_measure", "_rng", "_config", "interpolation_step"):
            with pytest.raises(BoundaryViolation, match=f"{re.escape(repr(name))} of client 'c'"):
                getattr(party, name)
        with pytest.raises(BoundaryViolation, match="tried to set"):
            party.name = "d"
        # an error raised in the party's process comes back with its type
        with pytest.raises(ValueError, match="different dimensions: 5 vs 2"):
            party.interpolate(MeasureMessage("xi", SERVER, "c", measure=Measure.uniform(np.ones((3, 5)))))
    finally:
        party.close()
