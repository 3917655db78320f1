"""studies.coreset_users: the federations it builds keep the training pool fixed as the number of clients grows
and give every client two classes (checked against the raw file's labels, independently of the partitioner)."""
from pathlib import Path

import numpy as np
import pytest

from studies.coreset_users import federation, load_setting
from otfed.data.store import TRAIN, VAL

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setting():
    return load_setting(str(REPO / "params.yaml"))


@pytest.fixture(scope="module")
def raw_labels(setting):
    with np.load(REPO / setting.data_dir / "images_mnist.npz") as f:
        return np.asarray(f["y_train"])


@pytest.mark.parametrize("structure", ["none", "strong"])
@pytest.mark.parametrize("n_clients", [20, 100])
def test_pool_is_fixed_and_every_client_has_two_classes(setting, raw_labels, structure, n_clients):
    fed = federation(setting, structure, n_clients, seed=1)
    val_fraction = setting.federations[structure][1].val_fraction
    assert fed.n_clients == n_clients
    # every training row of the held classes is used exactly once, with its raw label
    held_classes = np.unique(fed.y)
    expected = np.flatnonzero(np.isin(raw_labels, held_classes))
    np.testing.assert_array_equal(np.sort(fed.source_index), expected)
    np.testing.assert_array_equal(fed.y, raw_labels[fed.source_index])
    if len(held_classes) == 10:
        assert len(fed.y) == len(raw_labels) == 5000
    for k in range(n_clients):
        train, held = fed.y[fed.rows(k, TRAIN)], fed.y[fed.rows(k, VAL)]
        classes = np.unique(train)
        assert len(classes) == 2, f"client {k} holds classes {classes}"
        assert set(np.unique(held)) <= set(classes)
        if structure == "strong":
            assert classes[0] % 2 == 0 and classes[1] == classes[0] + 1
        n = len(train) + len(held)
        assert len(held) == int(np.floor(val_fraction * n + 0.5))  # the stage's held-out share, rounded half up
