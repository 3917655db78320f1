"""The federated protocol: Client / Server roles exchanging typed messages over a ledgered channel.

- :mod:`.messages` — MeasureMessage, DistanceMessage (the only things that cross the boundary)
- :mod:`.ledger` — Ledger (kind, sender, receiver, shape, bytes of every message) and Channel
- :mod:`.fedwad` — FedWaD Algorithm 1 (Rakotomamonjy et al., ICLR 2024)
- :mod:`.otdd` — federated OTDD: FedWaD on label-augmented samples
"""
from otfed.federation.fedwad import (FedWaDConfig, FedWaDResult, WassersteinClient, WassersteinServer,
                                     client_step, distance_to, fedwad, federated_wasserstein, server_step)
from otfed.federation.ledger import Channel, Ledger, LedgerEntry
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage, Message
from otfed.federation.otdd import (LabelledData, augmented_measure, federated_otdd, pairwise_federated_otdd)

__all__ = [
    "SERVER", "Channel", "DistanceMessage", "FedWaDConfig", "FedWaDResult", "LabelledData", "Ledger",
    "LedgerEntry", "MeasureMessage", "Message", "WassersteinClient", "WassersteinServer", "augmented_measure",
    "client_step", "distance_to", "federated_otdd", "federated_wasserstein", "fedwad",
    "pairwise_federated_otdd", "server_step",
]
