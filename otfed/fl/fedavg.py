"""FedAvg (McMahan et al. 2017) as pure functions over model state (the "Boost FL" experiments: FedWaD
app. D.5, FedBary §11.4; a Flower-style separation of training code from transport).

A *state* is a ``dict[str, torch.Tensor]`` (a module ``state_dict``) of a feed-forward classifier:
linear layers ``layers.{k}.weight`` / ``layers.{k}.bias`` with ReLU between them. One layer is
multinomial logistic regression (softmax regression); more layers are a small MLP. The architecture is
read back from the state's shapes, so states are all that clients and server exchange.

- :func:`init_state` — a fresh, seeded state.
- :func:`client_update` — local SGD on cross-entropy: w ← w − lr ∇ (1/|B|) Σ_{(x,y)∈B} CE(f_w(x), y) for
  ``epochs`` passes over the client's data (full batch when ``batch_size`` is None).
- :func:`server_aggregate` — w = Σ_k ω_k w_k / Σ_k ω_k (FedAvg aggregation; ω_k = client sizes n_k in
  the paper, any non-negative weights here).
- :func:`evaluate` — accuracy.
- :func:`fedavg` — the loop: every round each client starts from the global state, the server averages.

**Devices.** Every function takes ``device`` (``"cpu"``, ``"cuda"``, …; a stage passes
:func:`otfed.device.stage_device` of ``run.device``) and ``num_threads`` (torch CPU threads while it runs;
:func:`otfed.device.threads_for` gives 1 on CPU, None elsewhere). :func:`fedavg` moves each client's data
and the state to the device once and keeps them there for all rounds (local updates and aggregation run
on the device); only the final state comes back (on CPU) and, when asked for, one accuracy per round and
each round's :class:`RoundUpdates` (what the server received).
Mini-batch orders are drawn from a CPU generator, so the same seed gives the same batches on any device.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from pydantic import Field

from otfed.device import to_device, torch_threads
from otfed.schema import PositiveInt, Strict

State = dict[str, torch.Tensor]


class FedAvgConfig(Strict):
    """FedAvg settings — also the ``fedavg`` params groups: softmax regression (``hidden: []``) or an MLP
    with ``hidden`` widths, ``rounds`` of ``epochs`` local passes with SGD step ``lr``."""

    rounds: int = Field(10, ge=1, le=10000)
    epochs: int = Field(5, ge=1, le=1000, description="Local epochs per round.")
    lr: float = Field(0.1, gt=0.0, le=10.0)
    batch_size: int | None = Field(None, ge=1, description="None = full batch.")
    hidden: list[PositiveInt] = Field([], description="Hidden widths; [] = multinomial logistic regression.")


class FeedForward(nn.Module):
    """Linear layers with ReLU between them; logits out (no softmax: CrossEntropyLoss applies it)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        super().__init__()
        if len(sizes) < 2:
            raise ValueError(f"need at least input and output sizes, got {list(sizes)}")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k, layer in enumerate(self.layers):
            x = layer(x)
            if k < len(self.layers) - 1:
                x = torch.relu(x)
        return x


def _sizes(state: State) -> list[int]:
    n_layers = len([k for k in state if k.endswith(".weight")])
    if n_layers == 0 or any(f"layers.{k}.weight" not in state or f"layers.{k}.bias" not in state
                            for k in range(n_layers)):
        raise ValueError(f"not a FeedForward state: keys {sorted(state)}")
    sizes = [int(state["layers.0.weight"].shape[1])]
    for k in range(n_layers):
        w = state[f"layers.{k}.weight"]
        if int(w.shape[1]) != sizes[-1]:
            raise ValueError(f"layer {k} expects {w.shape[1]} inputs but the previous layer gives {sizes[-1]}")
        sizes.append(int(w.shape[0]))
    return sizes


def build_model(state: State, device: str | torch.device = "cpu") -> FeedForward:
    """The module whose ``state_dict`` is ``state`` (architecture read from the weight shapes), on ``device``.
    Its parameters are allocated there and filled from ``state`` (no initialisation drawn and copied over
    first: no global RNG draw, and no host-to-GPU copy that would wait for the GPU)."""
    with torch.device("meta"):
        model = FeedForward(_sizes(state))
    model = model.to(dtype=state["layers.0.weight"].dtype).to_empty(device=device)
    model.load_state_dict(state)
    return model


def _state_of(model: nn.Module) -> State:
    """A copy of the module's state, on the module's device."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _on_cpu(state: State) -> State:
    return {k: v.to("cpu") for k, v in state.items()}


def init_state(n_features: int, n_classes: int, hidden: Sequence[int] = (), seed: int = 0,
               dtype: torch.dtype = torch.float32) -> State:
    """A seeded initial state: softmax regression (``hidden=()``) or an MLP with the given hidden widths
    (PyTorch's default Linear initialisation, U(±1/√fan_in), drawn from a local ``torch.Generator`` seeded
    with ``seed`` — thread-safe and independent of the global RNG)."""
    if n_features < 1 or n_classes < 2:
        raise ValueError(f"need n_features ≥ 1 and n_classes ≥ 2, got {n_features}, {n_classes}")
    model = FeedForward([n_features, *hidden, n_classes]).to(dtype=dtype)
    # A local generator, not torch's global one: Prefect runs tasks in threads, and seeding the global RNG
    # from two threads at once interleaves their draws (made Monte-Carlo Shapley differ between runs).
    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for layer in model.modules():
            if isinstance(layer, torch.nn.Linear):  # nn.Linear's default: U(±1/√fan_in) for weight and bias
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                if layer.bias is not None:
                    layer.bias.uniform_(-bound, bound, generator=generator)
    return _state_of(model)


def _tensors(x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor, dtype: torch.dtype,
             device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    xt = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(device=device, dtype=dtype)
    yt = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y).to(device=device, dtype=torch.long)
    if xt.ndim != 2 or yt.ndim != 1 or xt.shape[0] != yt.shape[0]:
        raise ValueError(f"x must be (n, d) and y (n,), got {tuple(xt.shape)} and {tuple(yt.shape)}")
    return xt, yt


def client_update(state: State, data: tuple[np.ndarray, np.ndarray], epochs: int, lr: float, seed: int,
                  batch_size: int | None = None, device: str | torch.device = "cpu",
                  num_threads: int | None = 1) -> State:
    """ClientUpdate of FedAvg (McMahan et al. 2017, alg. 1): ``epochs`` passes of plain SGD with step
    ``lr`` on the mean cross-entropy of mini-batches (shuffled by ``seed``; the whole data set as one
    batch when ``batch_size`` is None), on ``device``. Pure: returns a new state (on CPU), ``state`` is not
    modified. ``num_threads``: torch CPU threads while training (:func:`otfed.device.torch_threads`; None
    leaves torch's)."""
    with torch_threads(num_threads):
        dtype = state["layers.0.weight"].dtype
        return _on_cpu(_client_update(state, _tensors(*data, dtype=dtype, device=device), epochs, lr, seed,
                                      batch_size, device))


def _client_update(state: State, data: tuple[torch.Tensor, torch.Tensor], epochs: int, lr: float, seed: int,
                   batch_size: int | None, device: str | torch.device) -> State:
    """:func:`client_update` on data already on ``device`` (:func:`_tensors`); the new state stays there.

    No host round trip per step: the mini-batch orders of all epochs are drawn first (CPU generator, in the
    order one epoch after the other would draw them) and moved to the device in one copy."""
    if epochs < 0 or not lr > 0:
        raise ValueError(f"need epochs ≥ 0 and lr > 0, got {epochs}, {lr}")
    model = build_model(state, device)
    x, y = data
    n = x.shape[0]
    if n == 0:
        raise ValueError("client has no samples")
    model.train()
    sgd_epochs(list(model.parameters()), model, x, y, batch_orders(n, epochs, batch_size, seed, device)[:epochs],
               batch_size, lr)
    return _state_of(model)


def batch_orders(n: int, epochs: int, batch_size: int | None, seed: int, device: str | torch.device) -> torch.Tensor:
    """One sample order per epoch (``epochs`` × n, on ``device``): random permutations drawn one epoch after
    the other from a CPU generator seeded with ``seed`` when mini-batching (the same batches on any device),
    the identity for full batches (then max(epochs, 1) rows)."""
    bs = n if batch_size is None else int(batch_size)
    if bs < n and epochs > 0:
        generator = torch.Generator().manual_seed(int(seed))
        return to_device(torch.stack([torch.randperm(n, generator=generator) for _ in range(epochs)]), device)
    return torch.arange(n, device=device).expand(max(epochs, 1), n)


def sgd_epochs(params: Sequence[nn.Parameter], forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
               y: torch.Tensor, orders: torch.Tensor, batch_size: int | None, lr: float) -> None:
    """Plain SGD in place, w ← w − lr ∇_w (1/|B|) Σ_{(x,y)∈B} CE(forward(x), y), over the mini-batches B taken
    in ``orders`` (one row of sample indices per epoch; ``batch_size`` None: the whole row). The update is
    ``torch.optim.SGD``'s without momentum or weight decay (``w.add_(grad, alpha=-lr)``, bit for bit), written
    out: the optimiser's bookkeeping cost about as much as a small MLP's forward and backward, and a task
    thread holds the interpreter lock throughout it."""
    n = x.shape[0]
    bs = n if batch_size is None else int(batch_size)
    loss_fn = nn.CrossEntropyLoss()
    for order in orders:
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            for param in params:
                param.grad = None
            loss_fn(forward(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for param in params:
                    if param.grad is not None:  # a parameter the loss does not reach stays (as SGD leaves it)
                        param.add_(param.grad, alpha=-lr)


def server_aggregate(states: Sequence[State], weights: Sequence[float]) -> State:
    """FedAvg aggregation w = Σ_k ω_k w_k / Σ_k ω_k, key by key (McMahan et al. 2017, alg. 1)."""
    if len(states) == 0 or len(states) != len(weights):
        raise ValueError(f"need one weight per state, got {len(states)} states and {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not w.sum() > 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {w}")
    w = w / w.sum()
    keys = set(states[0])
    for s in states[1:]:
        if set(s) != keys:
            raise ValueError("states have different keys")
    out: State = {}
    for key in states[0]:
        ref = states[0][key]
        acc = torch.zeros_like(ref, dtype=torch.float64)
        for w_k, s in zip(w, states):
            if s[key].shape != ref.shape:
                raise ValueError(f"{key}: shapes differ ({tuple(s[key].shape)} vs {tuple(ref.shape)})")
            acc += float(w_k) * s[key].to(torch.float64)
        out[key] = acc.to(ref.dtype)
    return out


@torch.no_grad()
def predict(state: State, x: np.ndarray, device: str | torch.device = "cpu", num_threads: int | None = 1) -> np.ndarray:
    """Predicted labels argmax_c f_w(x)_c."""
    with torch_threads(num_threads):
        model = build_model(state, device).eval()
        xt = torch.as_tensor(np.asarray(x)).to(device=device, dtype=state["layers.0.weight"].dtype)
        return model(xt).argmax(dim=1).cpu().numpy()


def evaluate(state: State, x: np.ndarray, y: np.ndarray, device: str | torch.device = "cpu",
             num_threads: int | None = 1) -> float:
    """Accuracy of the state's classifier on (x, y)."""
    y = np.asarray(y)
    if y.shape[0] == 0:
        raise ValueError("cannot evaluate on an empty set")
    return float(np.mean(predict(state, x, device, num_threads) == y))


def round_seed(seed: int, round_: int, client: int) -> int:
    """The seed of client ``client``'s local update in round ``round_`` (shared by every FL loop here, so
    FedAvg, FedPer and FedRep draw the same mini-batches for the same (seed, round, client))."""
    return int(np.random.SeedSequence([seed, round_, client]).generate_state(1)[0])


@dataclass(frozen=True, eq=False)
class RoundUpdates:
    """What the FedAvg server received in one round r (all on CPU): the global state M^{r−1} the round
    started from, each client's update Δ_k^r = w_k^r − M^{r−1} (w_k^r: client k's local state after
    :func:`client_update`) and the aggregation weights ω_k, so that M^r = M^{r−1} + Σ_k ω_k Δ_k^r / Σ_k ω_k.
    The messages gradient-reconstruction valuation (:mod:`otfed.valuation.reconstruction`) works from."""

    start: State
    deltas: list[State]
    weights: list[float]


@dataclass
class FedAvgResult:
    """Final global state, per round the accuracy on the evaluation set (if one was given) and, when
    recorded, per round the :class:`RoundUpdates` the server received."""

    state: State
    accuracy: list[float] = field(default_factory=list)
    rounds: list[RoundUpdates] = field(default_factory=list)


def fedavg(clients: Sequence[tuple[np.ndarray, np.ndarray]], state: State, rounds: int, epochs: int, lr: float,
           seed: int = 0, batch_size: int | None = None, weights: Sequence[float] | None = None,
           eval_data: tuple[np.ndarray, np.ndarray] | None = None, device: str | torch.device = "cpu",
           num_threads: int | None = 1, record_updates: bool = False) -> FedAvgResult:
    """FedAvg with full participation: each round every client runs :func:`client_update` from the global
    state (client k, round r seeded by (seed, r, k)), the server aggregates with ``weights`` (default:
    client sizes n_k). Data and states stay on ``device`` for all rounds (module docstring); the returned
    state is on CPU. ``record_updates``: also return each round's :class:`RoundUpdates` (copied to CPU;
    recording changes no number of the run)."""
    if not clients:
        raise ValueError("FedAvg needs at least one client")
    w = [len(c[1]) for c in clients] if weights is None else list(weights)
    dtype = state["layers.0.weight"].dtype
    accuracy: list[float] = []
    recorded: list[RoundUpdates] = []
    with torch_threads(num_threads):
        data = [_tensors(*c, dtype=dtype, device=device) for c in clients]  # moved to the device once
        state = {k: v.to(device) for k, v in state.items()}
        for r in range(rounds):
            local = [_client_update(state, d, epochs, lr,
                                    seed=round_seed(seed, r, k),
                                    batch_size=batch_size, device=device)
                     for k, d in enumerate(data)]
            if record_updates:
                recorded.append(RoundUpdates(start={k: v.to("cpu", copy=True) for k, v in state.items()},
                                             deltas=[_on_cpu({k: s[k] - state[k] for k in state}) for s in local],
                                             weights=[float(x) for x in w]))
            state = server_aggregate(local, w)
            if eval_data is not None:
                accuracy.append(evaluate(state, *eval_data, device=device, num_threads=None))
    return FedAvgResult(state=_on_cpu(state), accuracy=accuracy, rounds=recorded)


def fedavg_state(clients: Sequence[tuple[np.ndarray, np.ndarray]], n_features: int, n_classes: int,
                 config: FedAvgConfig, seed: int, device: str | torch.device = "cpu",
                 num_threads: int | None = 1) -> State:
    """The final global state of :func:`fedavg` (McMahan et al. 2017, alg. 1) over ``clients`` with the
    ``config`` settings, from the state :func:`init_state` draws with ``seed``; no clients → that initial
    state. Evaluate it on as many sets as needed with :func:`evaluate`."""
    state = init_state(n_features, n_classes, hidden=config.hidden, seed=seed)
    if clients:
        state = fedavg(clients, state, rounds=config.rounds, epochs=config.epochs, lr=config.lr, seed=seed,
                       batch_size=config.batch_size, device=device, num_threads=num_threads).state
    return state


def fedavg_accuracy(clients: Sequence[tuple[np.ndarray, np.ndarray]], eval_data: tuple[np.ndarray, np.ndarray],
                    n_classes: int, config: FedAvgConfig, seed: int, device: str | torch.device = "cpu",
                    num_threads: int | None = 1) -> float:
    """Accuracy on ``eval_data`` of :func:`fedavg` (McMahan et al. 2017, alg. 1) over ``clients`` with the
    ``config`` settings, from the state :func:`init_state` draws with ``seed``; no clients → the initial
    model's accuracy. The utility of FedBary §5.1's client-level games and the score of its table 4.
    ``device`` / ``num_threads``: where and with how many torch CPU threads FedAvg runs (module docstring)."""
    state = fedavg_state(clients, eval_data[0].shape[1], n_classes, config, seed, device, num_threads)
    return evaluate(state, *eval_data, device=device, num_threads=num_threads)
