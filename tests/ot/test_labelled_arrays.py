"""One gate for labelled client data: OTDD's augmented measure, the full-covariance bound vectors, the OTDD
client and the DP FedBary client refuse the same bad inputs with the same message naming the client."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.errors import DegenerateClientError
from otfed.federation import otdd as federated
from otfed.federation.fedwad import FedWaDConfig
from otfed.ot import measure_moments
from otfed.ot.otdd import LabelledData, augmented_measure, labelled_arrays
from otfed.privacy.dp_fedbary import dp_augmented_measure

GOOD_X = np.arange(12.0).reshape(6, 2)
GOOD_Y = np.array([0, 0, 0, 1, 1, 1])
BAD = [
    ("complex", GOOD_X.astype(complex), GOOD_Y, ValueError, r"client 'eve': features and labels must be real"),
    ("1-D", np.arange(6.0), GOOD_Y, ValueError, r"client 'eve': features must be a 2-D \(n, d\) array"),
    ("NaN label", GOOD_X, np.array([0.0, 0.0, np.nan, 1.0, 1.0, 1.0]), DegenerateClientError,
     r"client 'eve' has NaN or inf labels in 1 sample"),
    ("mismatch", GOOD_X, GOOD_Y[:5], ValueError, r"client 'eve': 6 samples but labels have shape \(5,\)"),
    ("empty", np.zeros((0, 2)), np.zeros(0, dtype=int), DegenerateClientError, r"client 'eve' has no samples"),
    ("NaN feature", np.where(np.arange(12).reshape(6, 2) == 3, np.nan, GOOD_X), GOOD_Y, DegenerateClientError,
     r"client 'eve' has NaN or inf features in 1 sample"),
]


@pytest.mark.parametrize("case, x, y, error, message", BAD, ids=[b[0] for b in BAD])
def test_every_labelled_measure_refuses_the_same_inputs_alike(case, x, y, error, message) -> None:
    data = LabelledData("eve", x, y)
    builders = [lambda: labelled_arrays(x, y, "eve"), lambda: augmented_measure(data),
                lambda: augmented_measure(data, diagonal=False),
                lambda: federated.bound_vectors(data, diagonal=False),
                lambda: federated.LabelledClient(data, FedWaDConfig(), np.random.default_rng(0), diagonal=False),
                lambda: dp_augmented_measure(data)]
    for build in builders:
        with pytest.raises(error, match=message):
            build()


def test_dp_measure_no_longer_makes_each_nan_label_a_class_of_its_own() -> None:
    """Before, dp_augmented_measure took np.unique of float labels: every NaN became a one-record class with a
    zero covariance root, and the session ran on it in silence."""
    y = np.array([0.0, 0.0, 0.0, 1.0, 1.0, np.nan])
    with pytest.raises(DegenerateClientError, match="client 'eve' has NaN or inf labels"):
        dp_augmented_measure(LabelledData("eve", GOOD_X, y))


def test_full_covariance_client_takes_class_statistics_once(monkeypatch) -> None:
    """The full-covariance OTDD client builds its measure and its bound vectors from one set of class statistics
    (it took them three times, an eigendecomposition per class each); both still equal the stand-alone ones."""
    rng = np.random.default_rng(0)
    data = LabelledData("ann", rng.normal(size=(30, 3)), np.arange(30) % 3)
    calls = []
    original = federated.class_statistics

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(federated, "class_statistics", counting)
    client = federated.LabelledClient(data, FedWaDConfig(), np.random.default_rng(0), diagonal=False)
    assert len(calls) == 1
    monkeypatch.undo()
    np.testing.assert_allclose(client._measure.support, augmented_measure(data, diagonal=False).support)
    mean, covariance = measure_moments(federated.bound_vectors(data, diagonal=False))
    message = client.moments()
    np.testing.assert_allclose(message.mean, mean)
    np.testing.assert_allclose(message.covariance, covariance)
