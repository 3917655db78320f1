"""The federated protocol: Client / Server roles exchanging typed messages over a ledgered channel.

- :mod:`.messages` — MeasureMessage, DistanceMessage, MomentMessage (the only things that cross the boundary)
- :mod:`.ledger` — Ledger (kind, sender, receiver, shape, bytes of every message) and Channel
- :mod:`.fedwad` — FedWaD Algorithm 1 (Rakotomamonjy et al., ICLR 2024)
- :mod:`.otdd` — federated OTDD: FedWaD on label-augmented samples, bracketed by Gelbrich's lower bound
- :mod:`.coresets` — federated Wasserstein coresets (FedWaD §5) and the 1-NN model over labelled coresets
"""
from otfed.federation.coresets import (CoresetClassifier, CoresetClient, CoresetConfig, CoresetInputError,
                                       CoresetResult, CoresetServer, LabelledCoreset, LabelledCoresetMessage,
                                       client_accuracies, client_coreset, client_coresets, coreset_classifier,
                                       coreset_gradient, coreset_session, federated_coreset,
                                       federated_wasserstein_coreset, geodesic_fraction, projection_distance,
                                       wasserstein_coreset)
from otfed.federation.fedwad import (FedWaDConfig, FedWaDResult, WassersteinClient, WassersteinServer,
                                     client_step, distance_to, fedwad, federated_wasserstein, server_step)
from otfed.federation.ledger import Channel, Ledger, LedgerEntry
from otfed.federation.messages import SERVER, DistanceMessage, MeasureMessage, Message, MomentMessage
from otfed.federation.otdd import (LabelledData, PairwiseOTDD, augmented_measure, federated_otdd,
                                   pairwise_federated_otdd)

__all__ = [
    "CoresetClassifier", "CoresetClient", "CoresetConfig", "CoresetInputError", "CoresetResult", "CoresetServer",
    "LabelledCoreset", "LabelledCoresetMessage", "client_accuracies", "client_coreset",
    "client_coresets", "coreset_classifier", "coreset_gradient", "coreset_session", "federated_coreset",
    "federated_wasserstein_coreset", "geodesic_fraction", "projection_distance", "wasserstein_coreset",
    "SERVER", "Channel", "DistanceMessage", "FedWaDConfig", "FedWaDResult", "LabelledData", "Ledger",
    "LedgerEntry", "MeasureMessage", "Message", "MomentMessage", "PairwiseOTDD", "WassersteinClient", "WassersteinServer", "augmented_measure",
    "client_step", "distance_to", "federated_otdd", "federated_wasserstein", "fedwad",
    "pairwise_federated_otdd", "server_step",
]
