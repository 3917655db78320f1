"""The federated entry points (issue #23): a plain mapping is a config (validated like one: the same numbers as
the config it spells, a wrong key named), anything else a TypeError; clients of different feature dimensions
are named with the dimensions the user gave (the label-augmented ones in parentheses)."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.errors import ConfigError
from otfed.federation import FedWaDConfig, LabelledData, federated_otdd, federated_wasserstein, pairwise_federated_otdd
from otfed.federation.fedbary import FedBaryConfig, fedbary_on_measures, federated_valuation
from otfed.ot.otdd import augmented_measure


def labelled(name: str, n: int, d: int, seed: int) -> LabelledData:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    return LabelledData(name, rng.standard_normal((n, d)) + 3.0 * y[:, None], y)


FEDWAD = {"support_size": 8, "iterations": 3, "lower_bound": False}
FEDBARY = {"support_size": 6, "iterations": 3}


# ------------------------------------------------------------------------------------------ configs as mappings

def test_federated_wasserstein_takes_a_mapping_as_the_config_it_spells() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 2)), rng.normal(size=(40, 2)) + 1.0
    assert federated_wasserstein(x, y, FEDWAD, seed=3).estimate == \
        federated_wasserstein(x, y, FedWaDConfig(**FEDWAD), seed=3).estimate


def test_federated_otdd_takes_a_mapping_as_the_config_it_spells() -> None:
    a, b = labelled("a", 20, 3, 1), labelled("b", 20, 3, 2)
    assert federated_otdd(a, b, FEDWAD, seed=1).estimate == federated_otdd(a, b, FedWaDConfig(**FEDWAD), seed=1).estimate
    matrix = pairwise_federated_otdd([a, b, labelled("c", 20, 3, 3)], FEDWAD, seed=2).estimates
    expected = pairwise_federated_otdd([a, b, labelled("c", 20, 3, 3)], FedWaDConfig(**FEDWAD), seed=2).estimates
    np.testing.assert_array_equal(matrix, expected)


def test_federated_valuation_and_fedbary_on_measures_take_a_mapping() -> None:
    clients = [labelled(f"c{i}", 20, 2, i) for i in range(3)]
    got = federated_valuation(clients, FEDBARY, seed=4)
    expected = federated_valuation(clients, FedBaryConfig(**FEDBARY), seed=4)
    np.testing.assert_array_equal(got.distances, expected.distances)
    on_measures = fedbary_on_measures([augmented_measure(c) for c in clients], [c.name for c in clients], FEDBARY,
                                      seed=4)
    np.testing.assert_array_equal(on_measures.distances, expected.distances)


@pytest.mark.parametrize("call, cls", [
    (lambda cfg: federated_wasserstein(np.zeros((5, 2)), np.ones((5, 2)), cfg), "FedWaDConfig"),
    (lambda cfg: federated_otdd(labelled("a", 10, 2, 1), labelled("b", 10, 2, 2), cfg), "FedWaDConfig"),
    (lambda cfg: pairwise_federated_otdd([labelled("a", 10, 2, 1), labelled("b", 10, 2, 2)], cfg), "FedWaDConfig"),
    (lambda cfg: federated_valuation([labelled("a", 10, 2, 1)], cfg), "FedBaryConfig"),
    (lambda cfg: fedbary_on_measures([augmented_measure(labelled("a", 10, 2, 1))], ["a"], cfg), "FedBaryConfig"),
])
def test_a_wrong_key_is_named_and_a_wrong_type_is_a_type_error(call, cls: str) -> None:
    with pytest.raises(ConfigError, match=rf"config \({cls}\): support_sise: unknown key") as info:
        call({"support_sise": 10})
    assert info.value.keys == ("support_sise",)
    with pytest.raises(TypeError, match=rf"config must be a {cls} or a mapping of its fields, got list"):
        call([10, 3])


def test_a_fedwad_config_is_not_a_fedbary_config() -> None:
    with pytest.raises(TypeError, match="config must be a FedBaryConfig .*got FedWaDConfig"):
        federated_valuation([labelled("a", 10, 2, 1)], FedWaDConfig())


# -------------------------------------------------------------------------------- feature dimensions, not augmented

def test_federated_otdd_names_the_feature_dimensions_the_user_gave() -> None:
    """5 and 4 feature columns. Label-augmented (FedWaD §4, [x; m_y; diag Σ_y^{1/2}]): 3d = 15 vs 12; with full
    covariances [x; m_y; vec Σ_y^{1/2}]: d + d + d² = 35 vs 24."""
    a, b = labelled("a", 20, 5, 1), labelled("b", 20, 4, 2)
    with pytest.raises(ValueError, match=r"^clients 'a' and 'b' have different feature dimensions: 5 vs 4 "
                                         r"\(label-augmented: 15 vs 12\)$"):
        federated_otdd(a, b, FEDWAD)
    with pytest.raises(ValueError, match=r"5 vs 4 \(label-augmented: 35 vs 24\)$"):
        federated_otdd(a, b, FEDWAD, diagonal=False)


def test_fedbary_names_the_clients_and_their_feature_dimensions() -> None:
    a, b, c = labelled("a", 20, 5, 1), labelled("b", 20, 4, 2), labelled("c", 20, 5, 3)
    with pytest.raises(ValueError, match=r"^clients have different feature dimensions: \{'a': 5, 'b': 4, 'c': 5\} "
                                         r"\(label-augmented: \{'a': 15, 'b': 12, 'c': 15\}\)$"):
        federated_valuation([a, b, c], FEDBARY)
    with pytest.raises(ValueError, match=r"label-augmented: \{'a': 35, 'b': 24, 'c': 35\}"):
        federated_valuation([a, b, c], {**FEDBARY, "diagonal": False})


def test_fedbary_names_a_validation_set_of_another_feature_dimension() -> None:
    clients = [labelled("a", 20, 4, 1), labelled("b", 20, 4, 2)]
    with pytest.raises(ValueError, match=r"^the server's validation set has 5 feature columns but the clients have 4 "
                                         r"\(label-augmented: 15 vs 12\)$"):
        federated_valuation(clients, FEDBARY, validation=labelled("server", 20, 5, 3))


def test_the_entry_points_runnable_examples_pass() -> None:
    """The docstring examples of federated_wasserstein, federated_otdd, pairwise_federated_otdd,
    federated_valuation and valuation_spread run (each checks its result against an independent truth: POT's exact
    solver, the planted outlier client, identical clients' symmetric share)."""
    from tests.docstring_examples import example_report, missing_sections

    for name, entry in (("fedwad", "federated_wasserstein"), ("otdd", "federated_otdd"),
                        ("otdd", "pairwise_federated_otdd"), ("fedbary", "federated_valuation"), ("fedbary", "valuation_spread")):
        report = example_report(f"otfed.federation.{name}", entry)
        assert not report, report
        assert not missing_sections(f"otfed.federation.{name}", entry), entry
