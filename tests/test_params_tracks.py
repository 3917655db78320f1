"""params.yaml per stage and per track, and strict types.

* A stage validates only ``run``, ``partition``, its own group and the groups it reads or checks: the text
  track runs with no feature-track groups, or with a broken one, and the other way round. ``partition``
  needs a feature part, a text part, or both.
* Config types are strict: a bool or a string where a number is expected is an error naming the key, never
  coerced; an int is still a valid float.
"""
from __future__ import annotations

import copy

import pytest

from otfed.errors import ConfigError
from otfed.federation.fedwad import FedWaDConfig
from stages.params import groups_of, stages, validate_params
from tests.stages.conftest import FEATURE_TRACK, TEXT_TRACK

# the tracks as the stage tests run them (every stage is in one); a track's own groups: all but the required ones
TEXT_STAGES, FEATURE_STAGES = TEXT_TRACK, FEATURE_TRACK
FEATURE_GROUPS = tuple(name for name in FEATURE_TRACK if not stages()[name].required)
TEXT_GROUPS = tuple(name for name in TEXT_TRACK if not stages()[name].required)


def _text_only(raw: dict) -> dict:
    data = {k: v for k, v in copy.deepcopy(raw).items() if k not in FEATURE_GROUPS}
    del data["partition"]["federations"]
    return data


def _feature_only(raw: dict) -> dict:
    data = {k: v for k, v in copy.deepcopy(raw).items() if k not in TEXT_GROUPS}
    del data["partition"]["text"]
    return data


def _error(data: dict, stage: str | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        validate_params(data, stage=stage)
    return str(info.value)


def test_each_stage_validates_the_groups_it_reads_or_checks() -> None:
    assert groups_of("partition") == ("run", "partition")
    assert groups_of("fed_distance") == ("run", "partition", "fed_distance")
    assert set(groups_of("estimate_bias")) == {"run", "partition", "estimate_bias", "train_teachers"}
    # distill reads train_teachers.tasks and its check needs estimate_bias (weighting E)
    assert set(groups_of("distill")) == {"run", "partition", "distill", "train_teachers", "estimate_bias"}


@pytest.mark.parametrize("stage", TEXT_STAGES)
def test_text_track_without_any_feature_group(raw: dict, stage: str) -> None:
    data = _text_only(raw)
    p = validate_params(data, stage=stage)
    assert p.partition.federations == {} and set(p.partition.text.tasks) == {"sa", "erc", "nli"}
    assert not hasattr(p, "fed_distance")
    assert validate_params(data).fed_distance is None  # the whole file is valid too


@pytest.mark.parametrize("stage", TEXT_STAGES)
def test_a_broken_feature_group_does_not_stop_the_text_track(raw: dict, stage: str) -> None:
    data = copy.deepcopy(raw)
    data["fed_distance"]["toy"]["iterations"] = "many"
    data["noisy_removal"]["colour"] = "red"
    validate_params(data, stage=stage)
    whole = _error(data)  # the whole file, and the feature stages themselves, still fail naming the keys
    assert "params.yaml: fed_distance.toy.iterations: Input should be a valid integer (got 'many')" in whole
    assert "params.yaml: noisy_removal.colour: unknown key" in whole
    assert "fed_distance.toy.iterations" in _error(data, "fed_distance")
    assert "noisy_removal.colour" in _error(data, "noisy_removal")


@pytest.mark.parametrize("stage", FEATURE_STAGES)
def test_feature_track_without_the_text_groups_or_with_broken_ones(raw: dict, stage: str) -> None:
    data = _feature_only(raw)
    assert validate_params(data, stage=stage).partition.text is None
    data["distill"] = {"weightings": ["A", "Z"]}
    data["train_teachers"] = {"tasks": ["sa"]}  # a text stage without partition.text: caught for it only
    validate_params(data, stage=stage)
    assert "distill.weightings[1]" in _error(data, "distill")
    assert "partition.text: required by the text-track stages" in _error(data, "train_teachers")


def test_a_stage_of_the_missing_track_names_what_is_missing(raw: dict) -> None:
    assert "params.yaml: fed_distance: required key is missing" in _error(_text_only(raw), "fed_distance")
    assert "params.yaml: distill: required key is missing" in _error(_feature_only(raw), "distill")
    data = _text_only(raw) | {"barycenter_valuation": raw["barycenter_valuation"]}
    assert ("barycenter_valuation.contributions.federations[0]: unknown federation 'case1'; defined: none "
            "(partition.federations is empty: no feature track)") in _error(data, "barycenter_valuation")


def test_partition_needs_one_track_at_least(raw: dict) -> None:
    data = _text_only(raw)
    del data["partition"]["text"]
    message = _error(data, "partition")
    assert message == "params.yaml: partition: needs federations (feature track), text (text track) or both"


def test_shared_groups_and_unknown_groups_still_fail_every_stage(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data["run"]["seed"] = -1
    data["fed_distanse"] = {}
    for stage in ("partition", "distill", "fed_distance"):
        message = _error(data, stage)
        assert "params.yaml: run.seed: Input should be greater than or equal to 0" in message
        assert "params.yaml: fed_distanse: unknown key; allowed keys here: barycenter_valuation, distill" in message


# ------------------------------------------------------------------------------------------ strict types
@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["run"].update(seed=True), "params.yaml: run.seed: Input should be a valid integer (got True)"),
    (lambda d: d["run"].update(max_workers="2"), "params.yaml: run.max_workers: Input should be a valid integer (got '2')"),
    (lambda d: d["run"].update(max_workers=2.0), "run.max_workers: Input should be a valid integer (got 2.0)"),
    (lambda d: d["fed_distance"]["toy"].update(dims=[1, "2"]),
     "params.yaml: fed_distance.toy.dims[1]: Input should be a valid integer (got '2')"),
    (lambda d: d["fed_distance"]["toy"].update(ratios=[1, False]), "fed_distance.toy.ratios[1]: Input should be a valid integer (got False)"),
    (lambda d: d["distill"].update(eps=True), "params.yaml: distill.eps: Input should be a valid number (got True)"),
    (lambda d: d["noisy_removal"]["fedavg"].update(lr="0.1"), "noisy_removal.fedavg.lr: Input should be a valid number (got '0.1')"),
    (lambda d: d["distill"].update(one_hot_ablation=1), "distill.one_hot_ablation: Input should be a valid boolean (got 1)"),
    (lambda d: d["partition"]["federations"]["case1"].update(n_clients="5"),
     "partition.federations.case1.n_clients: Input should be a valid integer (got '5')"),
    (lambda d: d["partition"]["text"]["tasks"]["sa"].update(max_train=True),
     "partition.text.tasks.sa.max_train: Input should be a valid integer (got True)"),
    (lambda d: d["barycenter_valuation"]["fedbary"].update(support_size=True),
     "barycenter_valuation.fedbary.support_size: Input should be a valid integer (got True)"),
])
def test_no_coercion_to_numbers(config_error, mutate, expected: str) -> None:
    assert expected in config_error(mutate)


def test_ints_are_valid_floats_and_lists_still_validate_into_tuples(raw: dict) -> None:
    data = copy.deepcopy(raw)
    data["distill"]["gate_threshold"] = 1
    data["barycenter_valuation"]["detection"]["noise_std"] = 2
    data["fed_distance"]["otdd"]["fedwad"]["init_scale"] = 3
    p = validate_params(data)
    assert p.distill.gate_threshold == 1.0 and isinstance(p.distill.gate_threshold, float)
    assert p.barycenter_valuation.detection.noise_std == 2.0
    assert p.partition.text.tasks["sa"].locals == ("cell_phones", "musical_instruments", "digital_music")


def test_direct_construction_is_strict_too() -> None:
    with pytest.raises(ConfigError, match=r"FedWaDConfig: support_size: Input should be a valid integer"):
        FedWaDConfig(support_size="10")
    with pytest.raises(ConfigError, match=r"FedWaDConfig: init_scale: Input should be a valid number"):
        FedWaDConfig(init_scale=True)
    assert FedWaDConfig(t=1 / 2, init_scale=2).init_scale == 2.0
