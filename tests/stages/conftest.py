"""Tiny params for stage tests: real embedded data, a few dozen samples, a few iterations; the feature track
run once per session on them (``feature_run``), shared by the stage tests that read its outputs."""
from __future__ import annotations

import copy
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


# the attack on every protocol at S = 5 and S = n, random and fixed t, K = 1 and 3 (FedBary with its federated
# barycenter); DP FedWaD at S = n with a public t (ε = 10 and no noise) and DP clustering of 4 clients
PRIVACY = {"federation": "pairs", "pca_components": 4, "pairs": [[0, 1]], "supports": [5, "n"],
           "times": ["random", 0.5], "iterations": [1, 3], "per_round_distances": [False],
           "fedbary_validation": [False], "validation_samples": 20, "seeds": 1,
           "dp": {"epsilons": [10.0, math.inf], "supports": ["n"], "times": [0.5], "iterations": 2, "seeds": 1,
                  "clustering_clients": 4}}


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
                    "exact_interp_max_n": 40, "repeats": 1, "convergence_n": 20, "sweep_supports": [5]},
            "otdd": {"federation": "bench", "fedwad": {"support_size": 10, "iterations": 3}},
            "clustering": {"federations": ["pairs"], "n_clusters": 5, "neighbors": [3],
                           "fedwad": {"support_size": 5, "iterations": 3}},
            "clustered_fl": {"clusterings": ["global", "affinity", "planted"], "algorithms": ["fedavg", "fedper", "fedrep"],
                             "seeds": 2, "fl": {"rounds": 2, "batch_size": 16, "hidden": [8]}},
            "coresets": {"federations": ["pairs"], "points": [3], "pca_components": 8, "seeds": 2,
                         "coreset": {"epochs": 4, "clients_per_epoch": 3,
                                     "fedwad": {"support_size": 6, "iterations": 2}}},
            "privacy": copy.deepcopy(PRIVACY),
        },
    }


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mlflow_uri: str) -> dict:
    monkeypatch.chdir(tmp_path)
    return tiny_params(tmp_path)


FEDBARY = {"support_size": 10, "iterations": 3}
FEDAVG = {"rounds": 3, "epochs": 2, "lr": 0.1}
# the two tracks the stage tests run on tiny params, in order — every stage is in one (the feature track on
# feature_params below, the text track on tests/stages/test_text_stages.py's text_params), so that its outputs are
# checked byte for byte on a rerun (test_reproducible_reports.py, test_text_stages.py) and its params group is
# checked on the track's own (tests/test_params_tracks.py); tests/architecture/test_stage_contract.py checks it
FEATURE_TRACK = ("partition", "fed_distance", "barycenter_valuation", "noisy_removal")
TEXT_TRACK = ("partition", "train_teachers", "estimate_bias", "distill")


def feature_params(root: Path) -> dict:
    """:func:`tiny_params` plus the federations and groups of ``barycenter_valuation`` and ``noisy_removal``:
    the whole feature track on tiny data."""
    params = tiny_params(root)
    params["partition"]["federations"].update({
        "c1": {"scheme": "fedbary_case", "case": 1, "dataset": "cifar10", "n_clients": 5, "samples_per_client": 50,
               "val_fraction": 0.0, "test_samples": 150},
        "c5": {"scheme": "fedbary_case", "case": 5, "dataset": "cifar10", "n_clients": 5, "samples_per_client": 50,
               "val_fraction": 0.0, "test_samples": 150},
        "fclean": {"scheme": "iid", "dataset": "fashionmnist", "n_clients": 5, "samples": 300, "val_fraction": 0.0,
                   "test_samples": 200},
        "fnoisy": {"scheme": "fedbary_case", "case": 5, "dataset": "fashionmnist", "n_clients": 5,
                   "samples_per_client": 60, "val_fraction": 0.0, "test_samples": 200},
    })
    params["barycenter_valuation"] = {
        "pca_components": 8, "fedbary": FEDBARY,
        "contributions": {"federations": ["c1", "c5"], "validation_samples": 60, "monte_carlo_permutations": 3,
                          "seeds": 2,
                          "fedavg": FEDAVG,
                          "outlier": {"federation": "c1", "client": 4, "fraction": 1.0, "noise_std": 5.0}},
        "detection": {"federation": "fclean", "kinds": ["label", "feature"], "rates": [0.3], "validation_samples": 100,
                      "noise_std": 3.0,
                      "removal_step": 0.1, "removal_max_fraction": 0.3},
        "duplication": {"federation": "c1", "client": 1, "copies": [1, 2, 3], "datum_copies": 5,
                        "validation_samples": 60, "seed_repeats": 2},
        "privacy": {"kinds": ["feature"], "rate": 0.3, "epsilons": [1.0, math.inf], "seeds": 1},
    }
    params["noisy_removal"] = {
        "federations": ["fnoisy"], "random_projection": 16,
        "validation_samples": 100, "max_remove_fraction": 0.4, "fedbary": FEDBARY, "fedavg": {"rounds": 5},
        "budgets": [0.0, 0.1, 0.2], "seeds": 2,
    }
    return params


def run_track(root: Path, migrated_db: Path, params: dict, stage_names: tuple[str, ...]) -> dict[str, Any]:
    """Run ``stage_names`` in order, in-process, with ``root`` as the working directory and a fresh MLflow
    store ``root/mlruns.db``; the working directory and environment are restored afterwards.
    Returns ``{"root", "params", "uri", "metrics": {stage: metrics}}``."""
    from flows.stage import run_stage

    db = root / "mlruns.db"
    shutil.copy(migrated_db, db)
    uri = f"sqlite:///{db}"
    metrics: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        mp.chdir(root)
        for name in stage_names:
            metrics[name] = run_stage(name, params)
    return {"root": root, "params": params, "uri": uri, "metrics": metrics}


@pytest.fixture(scope="session")
def feature_run(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path) -> dict[str, Any]:
    """The feature track (partition → fed_distance → barycenter_valuation → noisy_removal) on
    :func:`feature_params`, run once per session in its own folder and MLflow store."""
    root = tmp_path_factory.mktemp("feature")
    return run_track(root, migrated_mlflow_db, feature_params(root), FEATURE_TRACK)


# a column name that says "wall time" in plain words, independent of stages.stage.is_wall_time's word list
TIME_IN_NAME = re.compile(r"second|time|elapsed|duration", re.IGNORECASE)


def output_files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: relative path → bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_reproducible(stage_name: str, first: Path, second: Path) -> None:
    """Stage ``stage_name`` wrote the same files, byte for byte, in both run folders ``first`` and ``second``
    (every output folder: its reports, committed to git, and its data, hashed in ``dvc.lock``), and none of
    its committed tables (CSV header, Markdown header) has a wall-time column."""
    from stages.params import stage
    from stages.stage import wall_time_columns

    outputs = stage(stage_name).outputs
    for folder in outputs:
        a, b = output_files(first / folder), output_files(second / folder)
        assert sorted(a) == sorted(b), f"{folder}: different files in the two runs"
        differ = [name for name in a if a[name] != b[name]]
        assert not differ, f"{folder}: {differ} differ between two runs of the same params"
    reports = output_files(first / outputs[0])
    assert "metrics.json" in reports and any(name.endswith(".csv") for name in reports)
    for name, content in reports.items():
        if name.endswith((".csv", ".md")):
            header = content.decode().splitlines()[0]
            columns = [c.strip() for c in header.strip("| ").split(" | " if name.endswith(".md") else ",")]
            assert not wall_time_columns(columns) and not any(TIME_IN_NAME.search(c) for c in columns), (name, header)
