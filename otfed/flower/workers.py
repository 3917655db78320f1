""":class:`~otfed.federation.parties.Workers` over a Flower ``Grid``: the parties live on SuperNodes.

:meth:`FlowerWorkers.enrol` has every connected SuperNode build its client from its own node config and data
(the server never holds client data) and returns the server's stand-ins for them; :meth:`FlowerWorkers.host`
places those stand-ins, and :meth:`call <FlowerHosted.call>` sends one Flower message per party per protocol
call (``query.<method>``) and returns the decoded, checked replies in party order. :meth:`FlowerWorkers.map`
runs the server's own pure computations in the ServerApp's process, in order, as
:class:`~otfed.federation.parties.InProcess` does — the numbers do not depend on the transport.

Waits are bounded: a node that does not answer within ``timeout`` seconds, or answers with an error, ends the
session with one line naming the node, its client and the call. Needs ``flwr`` (imported when used).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

from otfed.federation.fedbary import FedBaryConfig
from otfed.flower.fedbary import ENROL, RemoteClient, call_request, call_result, enrolled
from otfed.flower.records import Packet
from otfed.flower.transport import packet_from_recorddict, packet_to_recorddict

#: seconds between two pulls of the replies to one call
PULL_INTERVAL = 0.05

log = logging.getLogger("flwr")  # Flower's logger: the line shows in the ServerApp's log (``flwr run --stream``)


class FlowerWorkers:
    """Parties on the SuperNodes of ``grid``, the server's computations here. ``timeout``: seconds to wait
    for the replies to one call (and for the nodes to connect at :meth:`enrol`)."""

    def __init__(self, grid: Any, timeout: float = 300.0) -> None:
        self.grid = grid
        self.timeout = float(timeout)
        self.config: FedBaryConfig | None = None
        self.wire_bytes = 0  # array payload bytes received and sent over the grid

    def map(self, fn: Callable[..., Any], calls: Sequence[Mapping[str, Any]]) -> list[Any]:
        return [fn(**kw) for kw in calls]

    def _exchange(self, packets: Mapping[int, Packet], method: str, who: Mapping[int, str]) -> dict[int, Packet]:
        """Send ``packets`` (node id → packet) as ``query.<method>`` messages; the replies by node id."""
        from flwr.app import Message

        messages = [Message(content=packet_to_recorddict(p), dst_node_id=node, message_type=f"query.{method}")
                    for node, p in packets.items()]
        self.wire_bytes += sum(p.nbytes for p in packets.values())
        replies = {r.metadata.src_node_id: r for r in self._send_and_receive(messages)}
        out = {}
        for node in packets:
            if node not in replies:
                raise RuntimeError(f"node {node} ({who[node]}) sent no reply to {method!r} within {self.timeout:g} s")
            reply = replies[node]
            if reply.has_error():
                raise RuntimeError(f"node {node} ({who[node]}) failed at {method!r}: {reply.error.reason}")
            out[node] = packet_from_recorddict(reply.content, f"node {node} ({who[node]})")
            self.wire_bytes += out[node].nbytes
        return out

    def _send_and_receive(self, messages: list[Any]) -> list[Any]:
        """Push ``messages`` and pull their replies every :data:`PULL_INTERVAL` seconds until all are in or
        ``timeout`` passed — ``Grid.send_and_receive`` with a shorter wait between pulls (Flower 1.42's is 3 s,
        which every protocol round paid on top of the clients' work)."""
        started = time.monotonic()
        pending = set(self.grid.push_messages(messages))
        deadline = started + self.timeout
        replies: list[Any] = []
        while pending:
            pulled = list(self.grid.pull_messages(pending))
            replies += pulled
            pending -= {m.metadata.reply_to_message_id for m in pulled}
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(PULL_INTERVAL)
        log.info("otfed: %d message(s) %s answered in %.2f s", len(replies), messages[0].metadata.message_type
                 if messages else "", time.monotonic() - started)
        return replies

    def enrol(self, request: Packet, clients: int, config: FedBaryConfig) -> list[RemoteClient]:
        """Wait (at most ``timeout`` s) for ``clients`` SuperNodes, send each the enrolment ``request`` and
        return their clients' stand-ins in partition order."""
        deadline = time.monotonic() + self.timeout
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < clients:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(nodes)} of {clients} SuperNodes connected within {self.timeout:g} s")
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        replies = self._exchange({n: request for n in nodes}, ENROL, {n: "enrolling" for n in nodes})
        self.config = config
        return enrolled(replies, clients)

    def host(self, parties: Sequence[Any]) -> "FlowerHosted":
        if self.config is None:
            raise RuntimeError("enrol() the nodes before hosting their clients")
        if not all(isinstance(p, RemoteClient) for p in parties):
            raise TypeError("FlowerWorkers hosts the RemoteClient stand-ins enrol() returned; a client object "
                            "with its data stays on its SuperNode")
        return FlowerHosted(self, list(parties))


class FlowerHosted:
    """The clients on their SuperNodes, reached one Flower message per party per call."""

    def __init__(self, workers: FlowerWorkers, parties: list[RemoteClient]) -> None:
        self._workers, self._parties = workers, parties

    def call(self, method: str, args: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        args = [()] * len(self._parties) if args is None else list(args)
        if len(args) != len(self._parties):
            raise ValueError(f"{method}: {len(args)} argument tuples for {len(self._parties)} parties")
        who = {p.node_id: p.name for p in self._parties}
        replies = self._workers._exchange({p.node_id: call_request(method, tuple(a), kwargs)
                                           for p, a in zip(self._parties, args)}, method, who)
        config = self._workers.config
        assert config is not None
        return [call_result(method, replies[p.node_id], p, config, f"node {p.node_id} ({p.name})")
                for p in self._parties]
