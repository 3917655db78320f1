"""Federated learning algorithms as pure functions over model state (DESIGN: "fl/").

- :mod:`.fedavg` — ``init_state``, ``client_update``, ``server_aggregate``, ``evaluate``, ``predict``,
  ``fedavg``, ``fedavg_accuracy``; softmax regression or a small MLP in torch
"""
from otfed.fl.fedavg import (FedAvgConfig, FedAvgResult, FeedForward, State, build_model, client_update, evaluate,
                             fedavg, fedavg_accuracy,
                             init_state, predict, server_aggregate, torch_threads)

__all__ = ["FedAvgConfig", "FedAvgResult", "FeedForward", "State", "build_model", "client_update", "evaluate",
           "fedavg", "fedavg_accuracy",
           "init_state", "predict", "server_aggregate", "torch_threads"]
