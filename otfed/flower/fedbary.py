"""FedBary (Algorithm 1) between a Flower ServerApp and ClientApps: what each step's messages must be, the
client node's side, and the session the ServerApp runs.

The protocol is :func:`otfed.federation.fedbary.fedbary` itself; over Flower only where the parties live
changes. The server holds :class:`RemoteClient` stand-ins (a name and an augmented dimension, nothing else);
each SuperNode builds its :class:`~otfed.federation.fedbary.BaryClient` from its own data file at
:data:`ENROL` and keeps it, between messages, in its own run state. One Flower message per protocol call:

===================  =======================================  ==============================================
call                 server → client                          client → server
===================  =======================================  ==============================================
``enrol``            config, seed, number of clients          name, d (augmented), partition, rows
``report``           —                                        γ_i (S × d measure), d_i^client (lines 3–4)
``update``           η_{Q_i} (S × d measure, line 6)          —
``final_report``     —                                        γ_i^(K), W(P_i, γ_i^(K)) (closing round)
``datum_values``     the potential                            the client's calibrated gradients (eq. 10)
===================  =======================================  ==============================================

Every received message is checked against :class:`~otfed.flower.records.Expected` built from the session's
config (S, d, interpolation, max_support) before use, at the server and at the client.

Seeding is :func:`~otfed.federation.fedbary.federated_valuation`'s: ``SeedSequence(seed).spawn(N + 1)``, client i
(its node's ``partition-id``) draws from the i-th child, the server from the last — the same numbers as in process.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeVar

import numpy as np

from otfed.federation.fedbary import BaryClient, BaryServer, FedBaryConfig, FedBaryResult, fedbary
from otfed.federation.messages import SERVER, Message
from otfed.flower.records import (Expected, MessageRefused, Packet, WireArray, head_refusal, loose_array,
                                  measure_atoms, message_from_wire, message_to_wire)
from otfed.ot.otdd import LabelledData
from otfed.schema import as_config
from otfed.valuation.calibrated import PotentialConvergence

#: the wire protocol's version: a party speaking another one is refused
PROTOCOL_VERSION = "otfed-flower/1"
ENROL = "enrol"
#: the client methods a FedBary node serves (besides :data:`ENROL`)
METHODS = ("report", "update", "final_report", "datum_values")
STATE_KEY = "otfed.party"


@dataclass(frozen=True)
class RemoteClient:
    """The server's stand-in for a FedBary client on a SuperNode: its public name and augmented dimension."""

    name: str
    dim: int
    node_id: int
    samples: int


def measure_expectation(config: FedBaryConfig, kind: str, dim: int, sender: str | None) -> Expected:
    """A FedBary measure message of ``kind`` (``"gamma"``, ``"eta_Q"``): S atoms of dimension d (approximate
    interpolation), or at most ``max_support`` (exact)."""
    atoms, max_atoms = measure_atoms(config.support_size, config.interpolation, config.max_support)
    return Expected("measure", kind, sender=sender, atoms=atoms, max_atoms=max_atoms, dim=dim)


def reply_expectations(method: str, config: FedBaryConfig, dim: int, sender: str) -> list[Expected]:
    """The typed messages a client's reply to ``method`` must hold, in order."""
    closing = {"report": "client_distance", "final_report": "distance"}
    if method in closing:
        return [measure_expectation(config, "gamma", dim, sender), Expected("distance", closing[method], sender)]
    return []


# ----------------------------------------------------------------------------------------------- client node


def write_partition(path: str | Path, data: LabelledData) -> Path:
    """One client's data as the ``.npz`` its SuperNode reads (``name``, ``x``, ``y``)."""
    path = Path(path)
    np.savez(path, name=np.array(data.name), x=np.asarray(data.x), y=np.asarray(data.y))
    return path


def read_partition(path: str | Path) -> LabelledData:
    """The client's data a SuperNode holds (:func:`write_partition`); pickled objects are refused."""
    with np.load(Path(path), allow_pickle=False) as npz:
        return LabelledData(str(npz["name"]), npz["x"], npz["y"])


def fedbary_call(method: str, request: Packet, state: Mapping[str, Any], node: str) -> tuple[Packet, dict]:
    """A FedBary client node's answer to one call after :data:`ENROL` (``state``: what the previous call left),
    and its new state. The request is checked first (its fields and, for ``update``, η_{Q_i} against S and d): a
    bad one is refused with :class:`MessageRefused` naming ``node``."""
    client: BaryClient = state["client"]
    config: FedBaryConfig = state["config"]
    if method == "update":
        problem = head_refusal(request.head, {"version": str})
        if problem is None and (len(request.messages) != 1 or request.arrays):
            problem = f"{len(request.messages)} messages and {len(request.arrays)} arrays, expected one η_Q"
        if problem is not None:
            raise MessageRefused(f"{node}: refused: {problem}")
        eta_q = message_from_wire(request.messages[0],
                                  measure_expectation(config, "eta_Q", client.dim, SERVER), node)
        client.update(eta_q)  # type: ignore[arg-type]
        reply = Packet({"version": PROTOCOL_VERSION})
    elif method == "datum_values":
        problem = head_refusal(request.head, {"version": str, "potential": str})
        if problem is None and (request.messages or request.arrays):
            problem = "unexpected messages or arrays"
        if problem is not None:
            raise MessageRefused(f"{node}: refused: {problem}")
        values, convergence = client.datum_values(request.head["potential"], with_convergence=True)
        reply = Packet({"version": PROTOCOL_VERSION, "potential": convergence.potential,
                        "iterations": -1 if convergence.iterations is None else int(convergence.iterations),
                        "criterion": float(convergence.criterion), "tol": float(convergence.tol),
                        "converged": bool(convergence.converged)}, arrays={"values": WireArray.of(values)})
    elif method in ("report", "final_report"):
        problem = head_refusal(request.head, {"version": str})
        if problem is None and (request.messages or request.arrays):
            problem = "unexpected messages or arrays"
        if problem is not None:
            raise MessageRefused(f"{node}: refused: {problem}")
        messages = getattr(client, method)()
        reply = Packet({"version": PROTOCOL_VERSION}, [message_to_wire(m) for m in messages])
    else:
        raise MessageRefused(f"{node}: refused: FedBary clients serve {METHODS}, not {method!r}")
    return reply, {**state, "client": client}


ConfigT = TypeVar("ConfigT")


def enrol_config(request: Packet, node: str, config_type: type[ConfigT]) -> ConfigT:
    """The protocol config of an :data:`ENROL` request, once its head holds exactly the enrolment fields (version,
    protocol, config, seed, clients) and it carries no message or array; :class:`MessageRefused` naming ``node``
    otherwise, and the config's own error for a bad config."""
    problem = head_refusal(request.head, {"version": str, "protocol": str, "config": str, "seed": int,
                                          "clients": int})
    if problem is None and (request.messages or request.arrays):
        problem = "unexpected messages or arrays"
    if problem is not None:
        raise MessageRefused(f"{node}: refused: {problem}")
    return as_config(json.loads(str(request.head["config"])), config_type)


def fedbary_enrol(request: Packet, node_config: Mapping[str, Any], node: str) -> tuple[Packet, dict]:
    """A FedBary client node's :data:`ENROL`: check the request, build the client from this node's own partition
    file (``node_config["data"]``) seeded as :func:`~otfed.federation.fedbary.federated_valuation` seeds client
    ``partition-id``; reply with its public metadata. Returns the reply and the node's state."""
    config = enrol_config(request, node, FedBaryConfig)
    partition, seeds = node_seed(node_config, request)
    data = read_partition(str(node_config["data"]))
    client = BaryClient.from_data(data, config, np.random.default_rng(seeds))
    reply = Packet({"version": PROTOCOL_VERSION, "name": client.name, "dim": int(client.dim),
                    "partition": partition, "samples": int(len(data.y))})
    return reply, {"protocol": "fedbary", "client": client, "config": config}


def node_seed(node_config: Mapping[str, Any], request: Packet) -> tuple[int, np.random.SeedSequence]:
    """This node's partition (``partition-id`` of its node config) and its client's seed: child ``partition`` of
    ``SeedSequence(seed).spawn(N + 1)`` (the last child is the server's), as the in-process entry points seed."""
    partition, clients = int(node_config["partition-id"]), int(request.head["clients"])
    if not 0 <= partition < clients:
        raise ValueError(f"this node's partition-id {partition} is outside the session's {clients} clients")
    return partition, np.random.SeedSequence(int(request.head["seed"])).spawn(clients + 1)[partition]


# ----------------------------------------------------------------------------------------------- server side


def enrol_request(config: FedBaryConfig | Any, seed: int, clients: int, protocol: str = "fedbary") -> Packet:
    """The :data:`ENROL` message: the protocol, the session's config, seed and number of clients."""
    return Packet({"version": PROTOCOL_VERSION, "protocol": protocol, "config": config.model_dump_json(),
                   "seed": int(seed), "clients": int(clients)})


def enrolled(replies: Mapping[int, Packet], clients: int) -> list[RemoteClient]:
    """The clients of the :data:`ENROL` replies (node id → reply), in partition order; MessageRefused naming the
    node for a bad reply, ValueError when the partitions are not exactly 0..N−1."""
    out: dict[int, RemoteClient] = {}
    for node_id, reply in replies.items():
        node = f"node {node_id}"
        problem = head_refusal(reply.head, {"version": str, "name": str, "dim": int, "partition": int,
                                            "samples": int})
        if problem is None and (reply.messages or reply.arrays):
            problem = "unexpected messages or arrays"
        if problem is None and reply.head["version"] != PROTOCOL_VERSION:
            problem = f"protocol version {reply.head['version']!r}, expected {PROTOCOL_VERSION!r}"
        if problem is None and not (int(reply.head["dim"]) >= 1 and int(reply.head["samples"]) >= 1):
            problem = f"dimension {reply.head['dim']} and {reply.head['samples']} rows"
        if problem is not None:
            raise MessageRefused(f"{node}: refused its enrolment: {problem}")
        partition = int(reply.head["partition"])
        if partition in out:
            raise ValueError(f"nodes {out[partition].node_id} and {node_id} both hold partition {partition}")
        out[partition] = RemoteClient(str(reply.head["name"]), int(reply.head["dim"]), node_id,
                                      int(reply.head["samples"]))
    if sorted(out) != list(range(clients)):
        raise ValueError(f"the nodes hold partitions {sorted(out)}, expected 0..{clients - 1}")
    return [out[i] for i in range(clients)]


def call_request(method: str, args: tuple, kwargs: Mapping[str, Any]) -> Packet:
    """The message of one protocol call ``party.method(*args, **kwargs)``."""
    if method not in METHODS:
        raise ValueError(f"FedBary clients over Flower serve {METHODS}, not {method!r}")
    head: dict[str, Any] = {"version": PROTOCOL_VERSION}
    if method == "datum_values":
        head["potential"] = str(kwargs.get("potential", "sinkhorn"))
    messages = [message_to_wire(a) for a in args if isinstance(a, Message)]
    return Packet(head, messages)


def call_result(method: str, reply: Packet, party: RemoteClient, config: FedBaryConfig, node: str) -> Any:
    """What ``party.method(...)`` returns in process, decoded from the client's reply once every part of it
    passed its check (:class:`MessageRefused` naming the node otherwise)."""
    expected = reply_expectations(method, config, party.dim, party.name)
    head_fields: dict[str, Any] = {"version": str}
    if method == "datum_values":
        head_fields.update(potential=str, iterations=int, criterion=float, tol=float, converged=bool)
    problem = head_refusal(reply.head, head_fields)
    if problem is None and len(reply.messages) != len(expected):
        problem = f"{len(reply.messages)} messages, expected {len(expected)}"
    if problem is None and method != "datum_values" and reply.arrays:
        problem = f"unexpected arrays {sorted(reply.arrays)}"
    if problem is not None:
        raise MessageRefused(f"{node}: refused a reply to {method!r}: {problem}")
    if method == "datum_values":
        values = loose_array(reply, "values", (party.samples,), node)
        h = reply.head
        return values, PotentialConvergence(str(h["potential"]), None if h["iterations"] < 0 else int(h["iterations"]),
                                            float(h["criterion"]), float(h["tol"]), bool(h["converged"]))
    messages = [message_from_wire(w, e, node) for w, e in zip(reply.messages, expected)]
    return tuple(messages) if messages else None


def run_session(workers: Any, config: FedBaryConfig | Mapping[str, Any], seed: int, clients: int,
                datum_values: bool = True) -> FedBaryResult:
    """FedBary Algorithm 1 over ``workers`` (a :class:`~otfed.flower.workers.FlowerWorkers`): the ``clients``
    nodes enrol and build their clients from their own data, then :func:`~otfed.federation.fedbary.fedbary`
    runs with the server seeded as :func:`~otfed.federation.fedbary.federated_valuation` seeds it (no
    validation set: Q is the federated barycenter)."""
    config = as_config(config, FedBaryConfig)
    parties = workers.enrol(enrol_request(config, seed, clients), clients, config)
    server_seed = np.random.SeedSequence(seed).spawn(clients + 1)[-1]
    server = BaryServer(config, np.random.default_rng(server_seed))
    return fedbary(parties, server, datum_values=datum_values, workers=workers)


def result_arrays(result: FedBaryResult) -> dict[str, np.ndarray]:
    """A session's numbers as the arrays :func:`np.savez` writes: names, distances, contributions, history,
    the per-client history, the final target and each client's datum values (``values/<name>``), and the
    ledger's bytes."""
    out = {"names": np.array(result.names), "distances": result.distances, "contributions": result.contributions,
           "history": np.array(result.history), "client_history": result.client_history,
           "target_support": result.target.support, "target_weights": result.target.weights,
           "ledger_bytes": np.array(result.ledger.total_bytes)}
    for name, values in (result.datum_values or {}).items():
        out[f"values/{name}"] = values
    return out
