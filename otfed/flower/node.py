"""A client node's side of every protocol over Flower: the message's protocol version checked, the call
dispatched to the protocol the node enrolled in (:mod:`otfed.flower.fedbary`, :mod:`otfed.flower.fedwad`), the
node's private state handed from one message to the next. Needs no ``flwr``: the ClientApp wraps it."""
from __future__ import annotations

import pickle
from typing import Any, Callable, Mapping

from otfed.flower import fedbary, fedwad
from otfed.flower.records import MessageRefused, Packet

NODE = "client node: message from the server"
ENROLS: dict[str, Callable[..., tuple[Packet, dict]]] = {"fedbary": fedbary.fedbary_enrol,
                                                         "fedwad": fedwad.fedwad_enrol}
CALLS: dict[str, Callable[..., tuple[Packet, dict]]] = {"fedbary": fedbary.fedbary_call, "fedwad": fedwad.fedwad_call}
#: every message type a client node serves (``query.<method>``)
METHODS = (fedbary.ENROL, *fedbary.METHODS, *fedwad.METHODS)


def client_reply(method: str, request: Packet, node_config: Mapping[str, Any], state: bytes | None
                 ) -> tuple[Packet, bytes]:
    """A client node's answer to one server message, and its new private state (bytes this node alone writes and
    reads; None before enrolment). ``node_config``: the SuperNode's own ``data`` (its partition file) and
    ``partition-id``. A message of another protocol version, an unknown protocol or method, or a call before
    enrolment is refused with :class:`MessageRefused` naming the server as the sender."""
    version = request.head.get("version")
    if version != fedbary.PROTOCOL_VERSION:
        raise MessageRefused(f"{NODE}: refused: protocol version {version!r}, this client speaks "
                             f"{fedbary.PROTOCOL_VERSION!r}")
    if method == fedbary.ENROL:
        protocol = request.head.get("protocol")
        if protocol not in ENROLS:
            raise MessageRefused(f"{NODE}: refused: protocol {protocol!r}, this client serves {sorted(ENROLS)}")
        reply, kept = ENROLS[str(protocol)](request, node_config, NODE)
    else:
        if state is None:
            raise MessageRefused(f"{NODE}: refused: {method!r} before {fedbary.ENROL!r}")
        kept = pickle.loads(state)  # this node's own state, written below — never bytes from the wire
        reply, kept = CALLS[kept["protocol"]](method, request, kept, NODE)
    return reply, pickle.dumps(kept)
