"""FedWaD (Rakotomamonjy et al., Algorithm 1) between a Flower ServerApp and two ClientApps.

The protocol is :func:`otfed.federation.fedwad.fedwad` itself: it is handed two :class:`RemoteWassersteinClient`
stand-ins whose methods each send one Flower message to their SuperNode and return the checked reply, so every
protocol message is one Flower message, in the order the protocol sends them. Each SuperNode builds its
:class:`~otfed.federation.fedwad.WassersteinClient` from the samples ``x`` of its own partition file (the uniform
measure on them, as :func:`~otfed.federation.fedwad.federated_wasserstein` does), seeded as that function seeds
client ``partition-id`` (0: μ, 1: ν; the server draws from the third child).

===============  ============================================  ==========================================
call             server → client                               client → server
===============  ============================================  ==========================================
``enrol``        config, seed, number of clients (2)           name, d, partition, rows
``interpolate``  ξ^(k) (S × d, Algorithm 1 line 3)              ξ_client^(k) = InterpMeas(ξ → own) (lines 4–5)
``distance``     ξ^(K) (or nothing: W to its own interpolant)  W_p(own, ξ^(K)) (line 9)
``moments``      —                                             mean and covariance (Gelbrich's bound)
===============  ============================================  ==========================================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from otfed.federation.fedwad import FedWaDConfig, FedWaDResult, WassersteinClient, WassersteinServer, client_samples, fedwad
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage, MomentMessage
from otfed.flower.fedbary import PROTOCOL_VERSION, enrol_config, enrol_request, node_seed, read_partition
from otfed.flower.records import (Expected, MessageRefused, Packet, head_refusal, measure_atoms, message_from_wire,
                                  message_to_wire)
from otfed.ot import Measure
from otfed.schema import as_config

METHODS = ("interpolate", "distance", "moments")
DISTANCE_KINDS = ("distance", "monitor_distance")


def xi_expectation(config: FedWaDConfig, kind: str, dim: int, sender: str | None) -> Expected:
    """A FedWaD measure message (``"xi"``, ``"interpolant"``): S atoms of dimension d with approximate
    interpolation (eq. 10 keeps ξ's support), at most ``max_support`` with exact interpolation (eq. 5)."""
    atoms, max_atoms = measure_atoms(config.support_size, config.interpolation, config.max_support)
    return Expected("measure", kind, sender=sender, atoms=atoms, max_atoms=max_atoms, dim=dim)


# ----------------------------------------------------------------------------------------------- client node


def fedwad_enrol(request: Packet, node_config: Mapping[str, Any], node: str) -> tuple[Packet, dict]:
    """A FedWaD client node's enrolment: its client, on the uniform measure of its partition's samples."""
    config = enrol_config(request, node, FedWaDConfig)
    partition, seed = node_seed(node_config, request)
    data = read_partition(str(node_config["data"]))
    x = client_samples(data.x, data.name)
    client = WassersteinClient(data.name, Measure.uniform(x), config, np.random.default_rng(seed))
    reply = Packet({"version": PROTOCOL_VERSION, "name": client.name, "dim": int(client.dim),
                    "partition": partition, "samples": int(x.shape[0])})
    return reply, {"protocol": "fedwad", "client": client, "config": config}


def fedwad_call(method: str, request: Packet, state: Mapping[str, Any], node: str) -> tuple[Packet, dict]:
    """A FedWaD client node's answer to one call, each request checked first (ξ against S and d)."""
    client: WassersteinClient = state["client"]
    config: FedWaDConfig = state["config"]
    fields: dict[str, Any] = {"version": str, **({"kind": str} if method == "distance" else {})}
    problem = head_refusal(request.head, fields)
    wanted = 0 if method == "moments" or request.head.get("kind") == "monitor_distance" else 1
    if problem is None and (len(request.messages) != wanted or request.arrays):
        problem = f"{len(request.messages)} messages and {len(request.arrays)} arrays, expected {wanted} ξ"
    if problem is None and method == "distance" and request.head["kind"] not in DISTANCE_KINDS:
        problem = f"distance kind {request.head['kind']!r}"
    if problem is None and method not in METHODS:
        problem = f"FedWaD clients serve {METHODS}, not {method!r}"
    if problem is not None:
        raise MessageRefused(f"{node}: refused: {problem}")
    kept = dict(state)
    if method == "moments":
        message: Any = client.moments()
    elif method == "distance" and request.head["kind"] == "monitor_distance":
        # W(own, own interpolant): the interpolant is this node's own last one, never sent back over the wire
        if kept.get("interpolant") is None:
            raise MessageRefused(f"{node}: refused: a monitor distance before any interpolant")
        message = client.distance(MeasureMessage("local", client.name, client.name, measure=kept["interpolant"]),
                                  kind="monitor_distance")
    else:
        xi = message_from_wire(request.messages[0], xi_expectation(config, "xi", client.dim, SERVER), node)
        if method == "interpolate":
            message = client.interpolate(xi)  # type: ignore[arg-type]
            kept["interpolant"] = message.measure
        else:
            message = client.distance(xi, kind="distance")  # type: ignore[arg-type]
    return Packet({"version": PROTOCOL_VERSION}, [message_to_wire(message)]), kept


# ----------------------------------------------------------------------------------------------- server side


@dataclass
class RemoteWassersteinClient:
    """The server's stand-in for a FedWaD client on a SuperNode: :func:`~otfed.federation.fedwad.fedwad` calls
    its methods as it calls a :class:`~otfed.federation.fedwad.WassersteinClient`'s; each is one Flower message
    to the node and returns the reply once it passed its check."""

    name: str
    dim: int
    node_id: int
    workers: Any
    config: FedWaDConfig

    def _ask(self, method: str, packet: Packet, expected: Expected) -> Any:
        node = f"node {self.node_id} ({self.name})"
        reply = self.workers._exchange({self.node_id: packet}, method, {self.node_id: self.name})[self.node_id]
        problem = head_refusal(reply.head, {"version": str})
        if problem is None and (len(reply.messages) != 1 or reply.arrays):
            problem = f"{len(reply.messages)} messages and {len(reply.arrays)} arrays, expected 1 message"
        if problem is not None:
            raise MessageRefused(f"{node}: refused a reply to {method!r}: {problem}")
        return message_from_wire(reply.messages[0], expected, node)

    def interpolate(self, request: MeasureMessage) -> MeasureMessage:
        """Algorithm 1, lines 3–5: send ξ, receive the client's interpolant."""
        return self._ask("interpolate", Packet({"version": PROTOCOL_VERSION}, [message_to_wire(request)]),
                         xi_expectation(self.config, "interpolant", self.dim, self.name))

    def distance(self, request: MeasureMessage, kind: str = "distance") -> DistanceMessage:
        """Algorithm 1, line 9: send ξ^(K), receive W_p(own, ξ^(K)). A ``"local"`` request (the client's own
        interpolant, handed back in process without a transfer; ``record_history``) is not sent: the node uses
        the interpolant it keeps."""
        local = request.kind == "local"
        if local != (kind == "monitor_distance"):
            raise ValueError(f"a {kind!r} distance of a {request.kind!r} measure has no FedWaD call over Flower")
        return self._ask("distance", Packet({"version": PROTOCOL_VERSION, "kind": kind},
                                            [] if local else [message_to_wire(request)]),
                         Expected("distance", kind, sender=self.name))

    def moments(self) -> MomentMessage:
        """The client's mean and covariance (Gelbrich 1990, Theorem 2.1 needs them)."""
        return self._ask("moments", Packet({"version": PROTOCOL_VERSION}),
                         Expected("moments", "moments", sender=self.name, dim=self.dim))


def run_fedwad_session(workers: Any, config: FedWaDConfig | Mapping[str, Any], seed: int) -> FedWaDResult:
    """FedWaD Algorithm 1 over ``workers`` (a :class:`~otfed.flower.workers.FlowerWorkers` with two SuperNodes,
    partitions 0 = μ and 1 = ν), seeded as :func:`~otfed.federation.fedwad.federated_wasserstein` seeds it."""
    config = as_config(config, FedWaDConfig)
    mu, nu = workers.enrol(enrol_request(config, seed, 2, protocol="fedwad"), 2, config)
    stand_ins = [RemoteWassersteinClient(p.name, p.dim, p.node_id, workers, config) for p in (mu, nu)]
    server = WassersteinServer(config, np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2]))
    return fedwad(*stand_ins, server, lower_bound=config.lower_bound)


def fedwad_result_arrays(result: FedWaDResult) -> dict[str, np.ndarray]:
    """A FedWaD session's numbers as arrays: the upper and lower bounds, the history, ξ^(K), its support sizes
    and the ledger's bytes."""
    assert result.xi is not None
    return {"upper": np.array(result.upper), "lower": np.array(np.nan if result.lower is None else result.lower),
            "history": np.array(result.history), "xi_support": result.xi.support, "xi_weights": result.xi.weights,
            "support_sizes": np.array(result.support_sizes), "ledger_bytes": np.array(result.ledger.total_bytes)}
