"""The ClientApp: one handler per protocol call (``query.<method>``); the client and its data live on this
SuperNode only (its node config names its partition file), its state in the run's context between messages."""
from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from otfed.flower.fedbary import STATE_KEY
from otfed.flower.node import METHODS, client_reply
from otfed.flower.transport import packet_from_recorddict, packet_to_recorddict

app = ClientApp()


def _serve(method: str, message: Message, context: Context) -> Message:
    kept = context.state[STATE_KEY]["party"] if STATE_KEY in context.state else None
    request = packet_from_recorddict(message.content, "client node: message from the server")
    reply, state = client_reply(method, request, context.node_config, kept)
    context.state[STATE_KEY] = ConfigRecord({"party": state})
    return Message(packet_to_recorddict(reply), reply_to=message)


def _handler(method: str):
    def handle(message: Message, context: Context) -> Message:
        return _serve(method, message, context)
    handle.__name__ = method
    return handle


for _method in METHODS:
    app.query(_method)(_handler(_method))
