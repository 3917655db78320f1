"""NaN / inf features in a partition file: the FedBary stages stop before any work with one error naming the
file and the client (they value every client, so none can be left out); federated OTDD keeps reporting such
a client as degenerate instead (``load_federation`` without ``require_finite``)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from flows.stage import run_stage
from otfed.data.store import load_federation, save_federation
from otfed.errors import DegenerateClientError
from stages import layout
from stages.params import validate_params

FEDBARY = {"support_size": 5, "iterations": 2}


def fedbary_params(tiny: dict) -> dict:
    fed = {"scheme": "fedbary_case", "case": 1, "dataset": "fashionmnist", "n_clients": 5,
           "samples_per_client": 12, "val_fraction": 0.0, "test_samples": 40}
    return {
        "run": tiny["run"],
        "partition": {"data_dir": tiny["partition"]["data_dir"], "federations": {"c1": fed}},
        "barycenter_valuation": {
            "pca_components": 4, "fedbary": FEDBARY,
            "contributions": {"federations": ["c1"], "validation_samples": 20, "monte_carlo_permutations": 2,
                              "fedavg": {"rounds": 1, "epochs": 1},
                              "outlier": {"federation": "c1", "client": 4}},
            "detection": {"federation": "c1", "kinds": ["label"], "rates": [0.3], "validation_samples": 20},
            "duplication": {"federation": "c1", "client": 0, "copies": [1, 2], "datum_copies": 2,
                            "validation_samples": 20, "seed_repeats": 0},
        },
        "noisy_removal": {"federations": ["c1"], "pca_components": 4, "validation_samples": 20, "fedbary": FEDBARY,
                          "fedavg": {"rounds": 1, "epochs": 1}, "alpha": None},  # 20 rows: too few to calibrate
    }


def _spoil(rows_of: str | None, feature: float = np.nan) -> str:
    """Overwrite c1.npz with one bad feature in the first row of client ``rows_of`` (None: of the server's
    test split); returns the spoilt client's name (or "")."""
    fed = load_federation("c1", layout.PARTITIONS)
    x, x_test = fed.x.copy(), fed.x_test.copy()
    if rows_of is None:
        x_test[3, 7] = feature
    else:
        x[fed.rows(fed.client_names.index(rows_of))[0], 5] = feature
    save_federation(dataclasses.replace(fed, x=x, x_test=x_test), layout.PARTITIONS)
    return rows_of or ""


@pytest.mark.parametrize("stage", ["barycenter_valuation", "noisy_removal"])
def test_fedbary_stages_name_the_file_and_the_client(tiny: dict, stage: str) -> None:
    params = fedbary_params(tiny)
    run_stage("partition", validate_params(params, stage="partition"))
    names = load_federation("c1", layout.PARTITIONS).client_names
    client = _spoil(names[2])
    with pytest.raises(DegenerateClientError) as info:
        run_stage(stage, validate_params(params, stage=stage))
    assert str(info.value) == (f"{Path(layout.PARTITIONS) / 'c1.npz'}: client {client!r} features: "
                               f"1 of 12 rows contain NaN or inf values")
    reports = layout.VALUATION_REPORTS if stage == "barycenter_valuation" else layout.REMOVAL_REPORTS
    assert not Path(reports).exists()  # nothing half-written


def test_inf_in_the_servers_test_split_is_named_too(tiny: dict) -> None:
    params = fedbary_params(tiny)
    run_stage("partition", validate_params(params, stage="partition"))
    _spoil(None, feature=np.inf)
    with pytest.raises(DegenerateClientError, match=r"c1\.npz: server test split \(x_test\) features: 1 of 40 rows"):
        run_stage("noisy_removal", validate_params(params, stage="noisy_removal"))


def test_the_loader_checks_only_when_asked(tiny: dict) -> None:
    params = fedbary_params(tiny)
    run_stage("partition", validate_params(params, stage="partition"))
    client = _spoil(load_federation("c1", layout.PARTITIONS).client_names[0])
    fed = load_federation("c1", layout.PARTITIONS)  # federated OTDD reports the client as degenerate itself
    assert np.isnan(fed.x).sum() == 1
    with pytest.raises(DegenerateClientError, match=f"client {client!r} features: 1 of 12 rows"):
        load_federation("c1", layout.PARTITIONS, require_finite=True)
