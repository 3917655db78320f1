"""Tiny params for stage tests: real embedded data, a few dozen samples, a few iterations."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tiny_params(root: Path) -> dict:
    """Tiny params for a test run in ``root``: every stage writes to its ``stages.layout`` folders under the
    cwd, so run them with ``root`` as the cwd (the ``tiny`` fixture does)."""
    return {
        "run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
        "partition": {
            "data_dir": str(REPO / "data" / "raw"),
            "federations": {
                "bench": {"scheme": "by_dataset", "datasets": ["mnist", "usps", "fashionmnist", "kmnist"],
                          "samples_per_client": 40, "image_size": 28, "val_fraction": 0.0},
                "pairs": {"scheme": "class_pairs", "dataset": "mnist", "structure": "strong", "n_clients": 10,
                          "samples": 600, "pca_components": 20, "test_samples": 50},
                "noisy": {"scheme": "fedbary_case", "case": 4, "dataset": "cifar10", "n_clients": 5,
                          "samples_per_client": 40, "test_samples": 30},
            },
        },
        "fed_distance": {
            "toy": {"n_values": [20, 40], "supports": [2, 5], "ratios": [1, 3], "dims": [2], "iterations": 3,
                    "exact_interp_max_n": 40, "repeats": 1, "convergence_n": 20},
            "otdd": {"federation": "bench", "fedwad": {"support_size": 10, "iterations": 3}},
            "clustering": {"federations": ["pairs"], "n_clusters": 5, "neighbors": [3],
                           "fedwad": {"support_size": 5, "iterations": 3}},
        },
    }


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> dict:
    monkeypatch.chdir(tmp_path)
    return tiny_params(tmp_path)
