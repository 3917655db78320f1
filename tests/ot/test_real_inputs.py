"""Inputs that used to pass in silence (issue #34): complex samples (a float64 cast dropped the imaginary part
and the distance came out as if it had never been there) and NaN labels (each NaN its own class, then an error
naming no client). Each is now refused, naming the client where there is one."""
import numpy as np
import pytest

from otfed.errors import DegenerateClientError
from otfed.federation.fedbary import federated_valuation
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from otfed.ot.measures import Measure
from otfed.ot.otdd import LabelledData, augmented_measure, class_statistics

RNG = np.random.default_rng(0)
X = RNG.normal(size=(12, 2))
Y = np.arange(12) % 3


def test_a_measure_refuses_a_complex_support_or_weights():
    with pytest.raises(ValueError, match="Measure support must be real"):
        Measure.uniform(X + 1j)
    with pytest.raises(ValueError, match="Measure support must be real"):
        Measure(X + 1j, np.full(12, 1 / 12))
    with pytest.raises(ValueError, match="Measure weights must be real"):
        Measure(X, np.full(12, 1 / 12) + 0j)


def test_fedwad_names_the_client_with_complex_samples():
    with pytest.raises(ValueError, match=r"client 'alice': samples must be real"):
        federated_wasserstein(X, X + 1j, FedWaDConfig(support_size=12, iterations=2), names=("bob", "alice"))


def test_a_labelled_client_with_complex_features_is_named():
    with pytest.raises(ValueError, match=r"client 'carol': features and labels must be real"):
        augmented_measure(LabelledData("carol", X + 1j, Y))
    with pytest.raises(ValueError, match=r"client 'carol': features and labels must be real"):
        class_statistics(X + 1j, Y, client="carol")


@pytest.mark.parametrize("n_nan", [1, 2, 5])
def test_nan_labels_name_the_client_and_count_the_samples(n_nan):
    y = Y.astype(float)
    y[:n_nan] = np.nan
    with pytest.raises(DegenerateClientError, match=rf"client 'alice' has NaN or inf labels in {n_nan} sample"):
        augmented_measure(LabelledData("alice", X, y))


def test_fedbary_names_the_client_with_nan_labels():
    y = Y.astype(float)
    y[[0, 4]] = np.nan
    clients = [LabelledData("bob", RNG.normal(size=(12, 2)), Y), LabelledData("alice", X, y)]
    with pytest.raises(DegenerateClientError, match=r"client 'alice' has NaN or inf labels in 2 sample"):
        federated_valuation(clients, {"support_size": 5, "iterations": 2})


def test_float_labels_without_nan_are_still_classes():
    stats = class_statistics(X, Y.astype(float), client="alice")
    assert stats.labels.tolist() == [0.0, 1.0, 2.0]
    assert np.allclose(stats.means[2], X[Y == 2].mean(axis=0))
