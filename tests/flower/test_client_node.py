"""The FedBary and FedWaD calls over Flower without Flower (no flwr needed): every call goes through the wire form —
the server's request packet, the client node's :func:`client_reply` built from its own partition file, the checked
reply — and the sessions equal :func:`federated_valuation` / :func:`federated_wasserstein` in process bit for bit. A client node refuses a bad
message from the server (NaN in η_Q, another protocol version, a call before enrolment, an unexpected field), and
the server refuses a bad enrolment."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from otfed.federation.messages import MeasureMessage
from otfed.flower.fedbary import (ENROL, PROTOCOL_VERSION, RemoteClient, call_request, call_result, enrol_request,
                                  enrolled, result_arrays, run_session, write_partition)
from otfed.flower.fedwad import fedwad_result_arrays, run_fedwad_session
from otfed.flower.node import client_reply
from otfed.flower.records import MessageRefused, Packet, WireArray, message_to_wire
from otfed.ot import Measure
from otfed.ot.otdd import LabelledData

CONFIG = FedBaryConfig(support_size=10, iterations=3)


def clients(seed: int = 0) -> list[LabelledData]:
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], 12)
    return [LabelledData(f"client_{i}", rng.normal(size=(24, 2)) + 3.0 * y[:, None] + shift, y)
            for i, shift in enumerate([0.0, 1.0, 2.5])]


class Loopback:
    """The FlowerWorkers' logic with the nodes as packets handed to :func:`client_reply` in this process; node
    ids deliberately not in partition order."""

    def __init__(self, paths: list[Path]) -> None:
        self.nodes = {900 - i: {"partition-id": i, "data": str(p)} for i, p in enumerate(paths)}
        self.state: dict[int, bytes | None] = {n: None for n in self.nodes}
        self.config: FedBaryConfig | None = None
        self.parties: list[RemoteClient] = []
        self.sent: list[tuple[str, Packet]] = []

    def _send(self, node: int, method: str, packet: Packet) -> Packet:
        reply, self.state[node] = client_reply(method, packet, self.nodes[node], self.state[node])
        self.sent.append((method, packet))
        return reply

    def _exchange(self, packets, method, who):
        return {node: self._send(node, method, p) for node, p in packets.items()}

    def map(self, fn, calls):
        return [fn(**kw) for kw in calls]

    def enrol(self, request: Packet, n: int, config: FedBaryConfig) -> list[RemoteClient]:
        self.config = config
        self.parties = enrolled({node: self._send(node, ENROL, request) for node in self.nodes}, n)
        return self.parties

    def host(self, parties):
        assert parties == self.parties
        return self

    def call(self, method, args=None, **kwargs):
        parties = self.parties
        args = [()] * len(parties) if args is None else list(args)
        return [call_result(method, self._send(p.node_id, method, call_request(method, tuple(a), kwargs)), p,
                            self.config, f"node {p.node_id}") for p, a in zip(parties, args)]


def test_the_wire_form_session_equals_the_in_process_run_bit_for_bit(tmp_path: Path) -> None:
    data = clients()
    paths = [write_partition(tmp_path / f"client_{i}.npz", d) for i, d in enumerate(data)]
    loop = Loopback(paths)
    over_wire = result_arrays(run_session(loop, CONFIG, seed=3, clients=len(data)))
    in_process = result_arrays(federated_valuation(data, CONFIG, seed=3, datum_values=True))
    assert sorted(over_wire) == sorted(in_process)
    for key, value in in_process.items():
        assert over_wire[key].tobytes() == value.tobytes(), key
    assert [p.name for p in loop.parties] == ["client_0", "client_1", "client_2"]  # partition order, not node ids


def test_fedwad_over_the_wire_form_equals_the_in_process_run_bit_for_bit(tmp_path: Path) -> None:
    """FedWaD's own driver with the stand-ins: every number as in process; the monitored distance (the client's
    own interpolant) sends no measure back."""
    pair = clients()[:2]
    config = FedWaDConfig(support_size=24, iterations=4, record_history=True)
    loop = Loopback([write_partition(tmp_path / f"client_{i}.npz", d) for i, d in enumerate(pair)])
    over_wire = fedwad_result_arrays(run_fedwad_session(loop, config, seed=5))
    in_process = fedwad_result_arrays(federated_wasserstein(pair[0].x, pair[1].x, config, seed=5,
                                                            names=(pair[0].name, pair[1].name)))
    for key, value in in_process.items():
        assert over_wire[key].tobytes() == value.tobytes(), key
    assert np.isfinite(over_wire["lower"]) and len(over_wire["history"]) == 4
    monitor = [p for m, p in loop.sent if m == "distance" and p.head["kind"] == "monitor_distance"]
    assert len(monitor) == 2 * 4 and all(not p.messages for p in monitor)


def enrolled_state(tmp_path: Path) -> tuple[dict, bytes]:
    path = write_partition(tmp_path / "client_0.npz", clients()[0])
    node = {"partition-id": 0, "data": str(path)}
    _, state = client_reply(ENROL, enrol_request(CONFIG, 0, 1), node, None)
    _, state = client_reply("report", call_request("report", (), {}), node, state)
    return node, state


def eta_q(support: np.ndarray) -> MeasureMessage:
    return MeasureMessage("eta_Q", "server", "client_0", measure=Measure.uniform(support))


def test_a_client_node_refuses_bad_server_messages(tmp_path: Path) -> None:
    node, state = enrolled_state(tmp_path)
    dim = 2 + 2 + 2  # x, the class mean and the diagonal class covariance
    good = call_request("update", (eta_q(np.zeros((CONFIG.support_size, dim))),), {})
    client_reply("update", good, node, state)  # the well-formed one passes
    support = np.zeros((CONFIG.support_size, dim))
    support[0, 0] = np.nan
    wire = message_to_wire(eta_q(np.zeros((CONFIG.support_size, dim))))
    nan = dataclasses.replace(good, messages=[dataclasses.replace(wire, arrays={**wire.arrays,
                                                                                "support": WireArray.of(support)})])
    with pytest.raises(MessageRefused, match="message from the server: refused a message: 'eta_Q'.support contains NaN"):
        client_reply("update", nan, node, state)
    wrong_shape = call_request("update", (eta_q(np.zeros((CONFIG.support_size - 1, dim))),), {})
    with pytest.raises(MessageRefused, match=r"shape \(9, 6\), expected \(10, 6\)"):
        client_reply("update", wrong_shape, node, state)
    with pytest.raises(MessageRefused, match="protocol version 'otfed-flower/0'"):
        client_reply("report", Packet({"version": "otfed-flower/0"}), node, state)
    with pytest.raises(MessageRefused, match="unexpected field"):
        client_reply("report", Packet({"version": PROTOCOL_VERSION, "extra": 1}), node, state)
    with pytest.raises(MessageRefused, match="'report' before 'enrol'"):
        client_reply("report", call_request("report", (), {}), node, None)


def test_the_server_refuses_a_bad_enrolment_and_a_bad_reply() -> None:
    good = Packet({"version": PROTOCOL_VERSION, "name": "a", "dim": 6, "partition": 0, "samples": 24})
    assert enrolled({7: good}, 1) == [RemoteClient("a", 6, 7, 24)]
    with pytest.raises(MessageRefused, match="node 7: refused its enrolment: field 'dim' is a str"):
        enrolled({7: dataclasses.replace(good, head={**good.head, "dim": "6"})}, 1)
    with pytest.raises(ValueError, match="partitions \\[0\\], expected 0..1"):
        enrolled({7: good}, 2)
    party = RemoteClient("a", 6, 7, 24)
    nan_values = Packet({"version": PROTOCOL_VERSION, "potential": "sinkhorn", "iterations": 3, "criterion": 0.0,
                         "tol": 1e-9, "converged": True}, arrays={"values": WireArray.of(np.full(24, np.nan))})
    with pytest.raises(MessageRefused, match="node 7 \\(a\\): refused a message: 'values' contains NaN"):
        call_result("datum_values", nan_values, party, CONFIG, "node 7 (a)")
    three = Packet({"version": PROTOCOL_VERSION})
    with pytest.raises(MessageRefused, match="0 messages, expected 2"):
        call_result("report", three, party, CONFIG, "node 7 (a)")
