"""Federated learning algorithms as pure functions over model state.

- :mod:`.fedavg` — ``init_state``, ``client_update``, ``server_aggregate``, ``evaluate``, ``predict``,
  ``fedavg``, ``fedavg_state``, ``fedavg_accuracy``; softmax regression or a small MLP in torch
- :mod:`.personalized` — FedPer / FedRep (personal heads, averaged bodies: ``split_state``, ``join_state``,
  ``fedper_client_update``, ``fedrep_client_update``, ``aggregate_bodies``, ``fedper``, ``fedrep``) and
  ``per_cluster_accuracy`` (FedAvg / FedPer / FedRep within clusters of clients, FedWaD §5)
"""
from otfed.fl.fedavg import (FedAvgConfig, FedAvgResult, FeedForward, State, build_model, client_update, evaluate,
                             fedavg, fedavg_accuracy, fedavg_state,
                             init_state, predict, server_aggregate, torch_threads)
from otfed.fl.personalized import (Algorithm, ClientAccuracies, PersonalizedConfig, PersonalizedResult,
                                   aggregate_bodies, fedper, fedper_client_update, fedrep, fedrep_client_update,
                                   join_state, per_cluster_accuracy, split_state)

__all__ = ["FedAvgConfig", "FedAvgResult", "FeedForward", "State", "build_model", "client_update", "evaluate",
           "fedavg", "fedavg_accuracy", "fedavg_state",
           "init_state", "predict", "server_aggregate", "torch_threads",
           "Algorithm", "ClientAccuracies", "PersonalizedConfig", "PersonalizedResult", "aggregate_bodies", "fedper",
           "fedper_client_update", "fedrep", "fedrep_client_update", "join_state", "per_cluster_accuracy",
           "split_state"]
