"""otfed.schema.as_config: a config, or a plain mapping validated into one, or a TypeError naming the parameter."""
from __future__ import annotations

import pytest

from otfed.errors import ConfigError
from otfed.federation.fedbary import FedBaryConfig
from otfed.federation.fedwad import FedWaDConfig
from otfed.schema import as_config


def test_a_config_passes_unchanged_and_a_subclass_is_one() -> None:
    config = FedWaDConfig(support_size=7)
    assert as_config(config, FedWaDConfig) is config
    bary = FedBaryConfig(support_size=7)
    assert as_config(bary, FedWaDConfig) is bary


def test_a_mapping_validates_into_the_same_config_as_the_constructor() -> None:
    got = as_config({"support_size": 7, "t": 0.25, "interpolation": "exact"}, FedWaDConfig)
    assert type(got) is FedWaDConfig
    assert got == FedWaDConfig(support_size=7, t=0.25, interpolation="exact")
    assert as_config({}, FedBaryConfig) == FedBaryConfig()  # the defaults of the type asked for


def test_an_unknown_key_names_the_key_the_parameter_and_the_allowed_keys() -> None:
    with pytest.raises(ConfigError, match=r"^config \(FedWaDConfig\): support_sise: unknown key; allowed keys: "
                                          r"init_scale, interpolation, iterations, lower_bound, ") as info:
        as_config({"support_sise": 10}, FedWaDConfig)
    assert info.value.keys == ("support_sise",)


def test_a_bad_value_names_its_key_and_strict_types_hold() -> None:
    with pytest.raises(ConfigError, match=r"settings \(FedBaryConfig\): support_size: .*greater than or equal to 1"):
        as_config({"support_size": 0}, FedBaryConfig, "settings")
    with pytest.raises(ConfigError, match="iterations") as info:  # strict: "3" is not an int
        as_config({"iterations": "3", "support_size": 0}, FedWaDConfig)
    assert set(info.value.keys) == {"iterations", "support_size"}
    with pytest.raises(ConfigError, match="exact interpolation"):  # a model-level check has no key
        as_config({"interpolation": "exact", "solver": "semidual_newton"}, FedWaDConfig)


@pytest.mark.parametrize("value, got", [(None, "NoneType"), ([("support_size", 3)], "list"), (10, "int"),
                                        ("support_size=10", "str")])
def test_anything_else_is_a_type_error_naming_parameter_expected_and_got(value, got) -> None:
    with pytest.raises(TypeError, match=rf"^config must be a FedWaDConfig or a mapping of its fields, got {got}$"):
        as_config(value, FedWaDConfig)


def test_a_config_of_another_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="config must be a FedBaryConfig .* got FedWaDConfig"):
        as_config(FedWaDConfig(), FedBaryConfig)


def test_the_docstring_examples() -> None:
    import doctest

    import otfed.schema

    assert doctest.testmod(otfed.schema).failed == 0
