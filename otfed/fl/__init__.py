"""Federated learning algorithms as pure functions over model state (DESIGN: "fl/").

- :mod:`.fedavg` — ``init_state``, ``client_update``, ``server_aggregate``, ``evaluate``, ``predict``,
  ``fedavg``; softmax regression or a small MLP in torch
"""
from otfed.fl.fedavg import (FedAvgResult, FeedForward, State, build_model, client_update, evaluate, fedavg,
                             init_state, predict, server_aggregate, torch_threads)

__all__ = ["FedAvgResult", "FeedForward", "State", "build_model", "client_update", "evaluate", "fedavg",
           "init_state", "predict", "server_aggregate", "torch_threads"]
