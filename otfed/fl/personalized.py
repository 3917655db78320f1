"""Personalised federated learning — FedPer and FedRep — and FedAvg / FedPer / FedRep run within clusters of
clients (FedWaD §5 "boosting FL": clients clustered by federated OTDD, one federation per cluster, compared
with one global federation).

States are those of :mod:`otfed.fl.fedavg` (a :class:`~otfed.fl.fedavg.FeedForward` ``state_dict`` with
layers ``layers.0 … layers.{L-1}``). A state splits in two (:func:`split_state`):

- the **body** (shared representation φ): every layer but the last, ``layers.0 … layers.{L-2}`` — averaged by
  the server;
- the **head** (personal classifier h_k): the last layer ``layers.{L-1}`` — kept by client k, never sent,
  never averaged.

A softmax-regression state (``hidden=[]``, one layer) has no body; FedPer / FedRep on it would be purely
local training of each client's head with nothing federated, so they raise ValueError instead (a baseline
of local training should say so by its name). :class:`PersonalizedConfig` asks for ≥ 1 hidden layer.

- :func:`fedper_client_update` — FedPer (Arivazhagan et al. 2019) client: from (global body, own head), SGD on
  all parameters jointly for ``epochs`` local epochs (FedAvg's ClientUpdate on the joined model).
- :func:`fedrep_client_update` — FedRep (Collins et al. 2021, alg. 1) client: from (global body, own head),
  ``head_epochs`` epochs of SGD on the head with the body frozen, then ``body_epochs`` epochs on the body
  with the head frozen.
- :func:`aggregate_bodies` — the server of both: φ = Σ_k ω_k φ_k / Σ_k ω_k over the client bodies only.
- :func:`fedper`, :func:`fedrep` — the loops (full participation; client k, round r seeded by (seed, r, k) as
  :func:`~otfed.fl.fedavg.fedavg`); a :class:`PersonalizedResult` (final body, every client's head).
- :func:`per_cluster_accuracy` — FedAvg, FedPer or FedRep run separately within each cluster of clients
  (one cluster = the global federation); every client's accuracy on its own test data, and the pooled
  accuracy Σ_k correct_k / Σ_k n_k^test that FedWaD §5 reports.

**Devices.** As :mod:`otfed.fl.fedavg`: ``device`` and ``num_threads`` (torch CPU threads while it runs) on
every function; the loops move each client's data and the states to the device once and keep them there
for all rounds; results come back on CPU. Mini-batch orders are drawn from CPU generators, so the same
seed gives the same batches on any device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np
import torch

from pydantic import Field

from otfed.device import torch_threads
from otfed.fl.fedavg import (State, _client_update, _on_cpu, _sizes, _state_of, _tensors, batch_orders, build_model,
                             fedavg, init_state, round_seed, server_aggregate, sgd_epochs)
from otfed.schema import PositiveInt, Strict

Algorithm = Literal["fedavg", "fedper", "fedrep"]
Data = tuple[np.ndarray, np.ndarray]


class PersonalizedConfig(Strict):
    """Settings of a FedAvg / FedPer / FedRep comparison (FedWaD §5), shared by the three algorithms so they
    are compared on one architecture and budget: an MLP with ``hidden`` widths (≥ 1 layer: the body),
    ``rounds`` of communication, SGD step ``lr`` on mini-batches of ``batch_size``. Local work per round:
    ``epochs`` (FedAvg, FedPer); ``head_epochs`` then ``body_epochs`` (FedRep; the FedWaD authors used 4 + 1,
    FedRep's paper 10 + 1)."""

    rounds: int = Field(10, ge=1, le=10000)
    epochs: int = Field(1, ge=1, le=1000, description="Local epochs per round (FedAvg, FedPer).")
    head_epochs: int = Field(4, ge=0, le=1000, description="FedRep: head epochs per round, body frozen.")
    body_epochs: int = Field(1, ge=0, le=1000, description="FedRep: body epochs per round, head frozen.")
    lr: float = Field(0.05, gt=0.0, le=10.0)
    batch_size: int | None = Field(10, ge=1, description="None = full batch.")
    hidden: list[PositiveInt] = Field([64], min_length=1,
                                      description="Hidden widths; the body is every layer but the last.")


# ---------------------------------------------------------------------------------------------- body / head

def _n_layers(state: State) -> int:
    return len(_sizes(state)) - 1


def split_state(state: State) -> tuple[State, State]:
    """(body, head) of a FeedForward state: body = ``layers.0 … layers.{L-2}``, head = ``layers.{L-1}`` (same
    tensors, not copies). ValueError for a one-layer state (softmax regression has no body)."""
    last = _n_layers(state) - 1
    if last == 0:
        raise ValueError("FedPer/FedRep need a body: this state has a single layer (hidden=[], softmax "
                         "regression), so the head is the whole model and nothing would be federated")
    head_prefix = f"layers.{last}."
    body = {k: v for k, v in state.items() if not k.startswith(head_prefix)}
    head = {k: v for k, v in state.items() if k.startswith(head_prefix)}
    return body, head


def join_state(body: State, head: State) -> State:
    """The FeedForward state with ``body``'s layers followed by ``head``'s (inverse of :func:`split_state`);
    ValueError when the head is not the layer right after the body or the shapes do not chain."""
    if set(body) & set(head):
        raise ValueError(f"body and head share keys {sorted(set(body) & set(head))}")
    state = {**body, **head}
    last = _n_layers(state) - 1
    if set(head) != {f"layers.{last}.weight", f"layers.{last}.bias"}:
        raise ValueError(f"the head must be the last layer layers.{last}, got keys {sorted(head)}")
    return state


# ---------------------------------------------------------------------------------------------- clients

def _fedper_update(body: State, head: State, data: tuple[torch.Tensor, torch.Tensor], epochs: int, lr: float,
                   seed: int, batch_size: int | None, device: str | torch.device) -> tuple[State, State]:
    return split_state(_client_update(join_state(body, head), data, epochs, lr, seed, batch_size, device))


def _fedrep_update(body: State, head: State, data: tuple[torch.Tensor, torch.Tensor], head_epochs: int,
                   body_epochs: int, lr: float, seed: int, batch_size: int | None,
                   device: str | torch.device) -> tuple[State, State]:
    """:func:`fedrep_client_update` on data already on ``device``; the new states stay there.

    The head phase trains a linear layer on fixed features (the body is frozen), so the body's output
    ReLU(φ(x)) is computed once, not once per head epoch."""
    if head_epochs < 0 or body_epochs < 0 or not lr > 0:
        raise ValueError(f"need head_epochs, body_epochs ≥ 0 and lr > 0, got {head_epochs}, {body_epochs}, {lr}")
    x, y = data
    n = x.shape[0]
    if n == 0:
        raise ValueError("client has no samples")
    model = build_model(join_state(body, head), device).train()
    head_layer, body_layers = model.layers[-1], model.layers[:-1]
    orders = batch_orders(n, head_epochs + body_epochs, batch_size, seed, device)
    if head_epochs > 0:  # h_k ← SGD on CE(h(ReLU(φ(x))), y), φ fixed
        with torch.no_grad():
            features = x
            for layer in body_layers:
                features = torch.relu(layer(features))
        sgd_epochs(list(head_layer.parameters()), head_layer, features, y, orders[:head_epochs], batch_size, lr)
    if body_epochs > 0:  # φ ← SGD on CE(h_k(ReLU(φ(x))), y), h_k fixed
        head_layer.requires_grad_(False)
        sgd_epochs(list(body_layers.parameters()), model, x, y, orders[head_epochs:], batch_size, lr)
    return split_state(_state_of(model))


def fedper_client_update(body: State, head: State, data: Data, epochs: int, lr: float, seed: int,
                         batch_size: int | None = None, device: str | torch.device = "cpu",
                         num_threads: int | None = 1) -> tuple[State, State]:
    """FedPer client (Arivazhagan et al. 2019): from the global body φ and the client's own head h_k, SGD on
    body and head jointly, (φ, h_k) ← (φ, h_k) − lr ∇ (1/|B|) Σ_{(x,y)∈B} CE(h_k(ReLU(φ(x))), y), for ``epochs``
    passes (mini-batches shuffled by ``seed``; full batch when ``batch_size`` is None) — FedAvg's
    ClientUpdate (:func:`otfed.fl.fedavg.client_update`) on the joined model. Pure: returns the new
    (body, head) on CPU."""
    with torch_threads(num_threads):
        data_t = _tensors(*data, dtype=body["layers.0.weight"].dtype, device=device)
        new_body, new_head = _fedper_update(body, head, data_t, epochs, lr, seed, batch_size, device)
        return _on_cpu(new_body), _on_cpu(new_head)


def fedrep_client_update(body: State, head: State, data: Data, head_epochs: int, body_epochs: int, lr: float,
                         seed: int, batch_size: int | None = None, device: str | torch.device = "cpu",
                         num_threads: int | None = 1) -> tuple[State, State]:
    """FedRep client (Collins et al. 2021, alg. 1, lines 5–8): from the global body φ and the client's own
    head h_k, first ``head_epochs`` passes of SGD on h_k alone with φ frozen, then ``body_epochs`` passes on φ
    alone with the (updated) h_k frozen; loss the mean cross-entropy of CE(h_k(ReLU(φ(x))), y) on mini-batches
    (one generator seeded by ``seed`` draws the head epochs' orders, then the body epochs'). Pure: returns the
    new (body, head) on CPU; the head phase leaves the body bitwise unchanged and the body phase the head."""
    with torch_threads(num_threads):
        data_t = _tensors(*data, dtype=body["layers.0.weight"].dtype, device=device)
        new_body, new_head = _fedrep_update(body, head, data_t, head_epochs, body_epochs, lr, seed, batch_size,
                                            device)
        return _on_cpu(new_body), _on_cpu(new_head)


# ---------------------------------------------------------------------------------------------- server

def aggregate_bodies(bodies: Sequence[State], weights: Sequence[float]) -> State:
    """Server of FedPer and FedRep (Collins et al. 2021, alg. 1, line 10): φ = Σ_k ω_k φ_k / Σ_k ω_k, key by
    key, over the client bodies only — heads never reach the server (ω_k = client sizes n_k by default in
    the loops; any non-negative weights here)."""
    if bodies and not bodies[0]:
        raise ValueError("empty body")
    for k, b in enumerate(bodies[1:], start=1):  # name the body that differs (FedAvg's check would not)
        if set(b) != set(bodies[0]):
            raise ValueError(f"body {k} has keys {sorted(b)}, body 0 has {sorted(bodies[0])}")
    return server_aggregate(bodies, weights)  # the FedAvg average, over the body keys only


# ---------------------------------------------------------------------------------------------- loops

@dataclass
class PersonalizedResult:
    """Final global body and every client's personal head (client order), on CPU."""

    body: State
    heads: list[State]

    def state(self, k: int) -> State:
        """Client k's personalised model: the global body followed by its own head."""
        return join_state(self.body, self.heads[k])


def _client_tensors(clients: Sequence[Data], dtype: torch.dtype,
                    device: str | torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for k, (x, y) in enumerate(clients):
        try:
            xt, yt = _tensors(x, y, dtype=dtype, device=device)
        except ValueError as exc:
            raise ValueError(f"client {k}: {exc}") from None
        if xt.shape[0] == 0:
            raise ValueError(f"client {k}: no training samples")
        out.append((xt, yt))
    return out


def _personalized(clients: Sequence[Data], state: State, rounds: int, update: Callable[..., tuple[State, State]],
                  seed: int, weights: Sequence[float] | None, device: str | torch.device,
                  num_threads: int | None) -> PersonalizedResult:
    """The round loop shared by FedPer and FedRep: every client updates (global body, own head) with
    ``update(body, head, data, seed=…)``, the server averages the bodies, the heads stay with the clients."""
    if not clients:
        raise ValueError("need at least one client")
    if rounds < 1:
        raise ValueError(f"need rounds ≥ 1, got {rounds}")
    w = [len(c[1]) for c in clients] if weights is None else list(weights)
    body, head = split_state(state)
    with torch_threads(num_threads):
        data = _client_tensors(clients, body["layers.0.weight"].dtype, device)
        body = {k: v.to(device) for k, v in body.items()}
        heads = [{k: v.to(device) for k, v in head.items()} for _ in clients]
        for r in range(rounds):
            local = [update(body, heads[k], d, seed=round_seed(seed, r, k))
                     for k, d in enumerate(data)]
            heads = [h for _, h in local]
            body = aggregate_bodies([b for b, _ in local], w)
    return PersonalizedResult(body=_on_cpu(body), heads=[_on_cpu(h) for h in heads])


def fedper(clients: Sequence[Data], state: State, rounds: int, epochs: int, lr: float, seed: int = 0,
           batch_size: int | None = None, weights: Sequence[float] | None = None,
           device: str | torch.device = "cpu", num_threads: int | None = 1) -> PersonalizedResult:
    """FedPer (Arivazhagan et al. 2019) with full participation: every client starts from ``state``'s head;
    each round client k runs :func:`fedper_client_update` from (global body, own head) (seeded by
    (seed, r, k)), the server runs :func:`aggregate_bodies` with ``weights`` (default: client sizes n_k).
    ValueError for a one-layer ``state`` (no body)."""
    def update(body: State, head: State, d: tuple[torch.Tensor, torch.Tensor], seed: int) -> tuple[State, State]:
        return _fedper_update(body, head, d, epochs, lr, seed, batch_size, device)

    return _personalized(clients, state, rounds, update, seed, weights, device, num_threads)


def fedrep(clients: Sequence[Data], state: State, rounds: int, head_epochs: int, body_epochs: int, lr: float,
           seed: int = 0, batch_size: int | None = None, weights: Sequence[float] | None = None,
           device: str | torch.device = "cpu", num_threads: int | None = 1) -> PersonalizedResult:
    """FedRep (Collins et al. 2021, alg. 1) with full participation: every client starts from ``state``'s
    head; each round client k runs :func:`fedrep_client_update` (``head_epochs`` on its head, then
    ``body_epochs`` on the body; seeded by (seed, r, k)) from (global body, own head), the server runs
    :func:`aggregate_bodies` with ``weights`` (default: client sizes n_k). ValueError for a one-layer
    ``state`` (no body)."""
    def update(body: State, head: State, d: tuple[torch.Tensor, torch.Tensor], seed: int) -> tuple[State, State]:
        return _fedrep_update(body, head, d, head_epochs, body_epochs, lr, seed, batch_size, device)

    return _personalized(clients, state, rounds, update, seed, weights, device, num_threads)


# ---------------------------------------------------------------------------------------------- clusters

@dataclass
class ClientAccuracies:
    """Per client (client order): test samples classified correctly and test-set sizes."""

    correct: np.ndarray
    total: np.ndarray

    @property
    def accuracy(self) -> np.ndarray:
        """Each client's accuracy on its own test data, correct_k / n_k."""
        return self.correct / self.total

    @property
    def pooled(self) -> float:
        """Σ_k correct_k / Σ_k n_k — all clients' test samples pooled (FedWaD §5's figure)."""
        return float(self.correct.sum() / self.total.sum())


def _checked_clients(clients: Sequence[tuple[Data, Data]], clusters: Sequence[int] | None,
                     n_classes: int) -> np.ndarray:
    """The cluster label of every client (all 0 when ``clusters`` is None); ValueError naming the client
    whose train or test set is empty, has x and y of different lengths, another feature dimension or labels
    outside 0 … n_classes − 1."""
    if not clients:
        raise ValueError("need at least one client")
    dim = None
    for k, client in enumerate(clients):
        if len(client) != 2:
            raise ValueError(f"client {k}: expected ((x_train, y_train), (x_test, y_test)), got {len(client)} parts")
        for part, (x, y) in zip(("train", "test"), client):
            x, y = np.asarray(x), np.asarray(y)
            if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
                raise ValueError(f"client {k}: {part} x must be (n, d) and y (n,), got {x.shape} and {y.shape}")
            if x.shape[0] == 0:
                raise ValueError(f"client {k}: no {part}ing samples")
            if dim is None:
                dim = x.shape[1]
            elif x.shape[1] != dim:
                raise ValueError(f"client {k}: {part} features have dimension {x.shape[1]}, client 0 has {dim}")
            if not np.all(np.isfinite(x)):
                raise ValueError(f"client {k}: {part} features contain NaN or inf")
            if y.min() < 0 or y.max() >= n_classes:
                raise ValueError(f"client {k}: {part} labels must be in 0 … {n_classes - 1}, "
                                 f"got {y.min()} … {y.max()}")
    if clusters is None:
        return np.zeros(len(clients), dtype=np.int64)
    labels = np.asarray(clusters)
    if labels.shape != (len(clients),):
        raise ValueError(f"need one cluster label per client: {len(clients)} clients, cluster labels of shape "
                         f"{labels.shape}")
    return labels


def _correct(state: State, x: np.ndarray, y: np.ndarray, device: str | torch.device) -> int:
    with torch.no_grad():
        model = build_model(state, device).eval()
        xt = torch.as_tensor(np.asarray(x)).to(device=device, dtype=state["layers.0.weight"].dtype)
        yt = torch.as_tensor(np.asarray(y)).to(device=device, dtype=torch.long)
        return int((model(xt).argmax(dim=1) == yt).sum())


def per_cluster_accuracy(clients: Sequence[tuple[Data, Data]], clusters: Sequence[int] | None,
                         algorithm: Algorithm, config: PersonalizedConfig, n_classes: int, seed: int = 0,
                         device: str | torch.device = "cpu", num_threads: int | None = 1) -> ClientAccuracies:
    """FedWaD §5 "boosting FL": ``algorithm`` run separately within each cluster of clients, and every
    client's accuracy on its own test data.

    ``clients[k]`` = ((x_train, y_train), (x_test, y_test)); ``clusters[k]`` its cluster label (None = one
    cluster, the global federation). In each cluster, from the state :func:`~otfed.fl.fedavg.init_state` draws
    with ``seed`` (same for every cluster), over the cluster's clients in their order with client sizes as
    weights:

    - ``"fedavg"`` — :func:`~otfed.fl.fedavg.fedavg` (McMahan et al. 2017, alg. 1), ``config.epochs`` local
      epochs; client k is scored with the cluster's global model;
    - ``"fedper"`` — :func:`fedper` (Arivazhagan et al. 2019), ``config.epochs`` local epochs;
    - ``"fedrep"`` — :func:`fedrep` (Collins et al. 2021, alg. 1), ``config.head_epochs`` +
      ``config.body_epochs``;

    FedPer / FedRep score client k with the cluster's final body and k's own head. Each cluster's run is the
    run of that algorithm over the cluster's clients alone (same seed). ValueError naming the client for
    an empty train or test set, mismatched lengths or labels outside 0 … n_classes − 1, and for cluster
    labels that are not one per client."""
    labels = _checked_clients(clients, clusters, n_classes)
    if algorithm not in ("fedavg", "fedper", "fedrep"):
        raise ValueError(f"algorithm must be 'fedavg', 'fedper' or 'fedrep', got {algorithm!r}")
    n_features = int(np.asarray(clients[0][0][0]).shape[1])
    state = init_state(n_features, n_classes, hidden=config.hidden, seed=seed)
    correct = np.zeros(len(clients), dtype=np.int64)
    total = np.array([len(np.asarray(c[1][1])) for c in clients], dtype=np.int64)
    with torch_threads(num_threads):
        for label in np.unique(labels):
            members = [int(k) for k in np.flatnonzero(labels == label)]
            train = [clients[k][0] for k in members]
            if algorithm == "fedavg":
                final = fedavg(train, state, rounds=config.rounds, epochs=config.epochs, lr=config.lr, seed=seed,
                               batch_size=config.batch_size, device=device, num_threads=None).state
                models = [final] * len(members)
            else:
                if algorithm == "fedper":
                    result = fedper(train, state, rounds=config.rounds, epochs=config.epochs, lr=config.lr,
                                    seed=seed, batch_size=config.batch_size, device=device, num_threads=None)
                else:
                    result = fedrep(train, state, rounds=config.rounds, head_epochs=config.head_epochs,
                                    body_epochs=config.body_epochs, lr=config.lr, seed=seed,
                                    batch_size=config.batch_size, device=device, num_threads=None)
                models = [result.state(i) for i in range(len(members))]
            for k, model in zip(members, models):
                correct[k] = _correct(model, *clients[k][1], device=device)
    return ClientAccuracies(correct=correct, total=total)
