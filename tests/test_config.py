"""params.yaml schema: the committed file is valid; each kind of bad value names its key path."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from otfed.config import load_params, params_hash, validate_params
from otfed.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_committed_params_are_valid() -> None:
    params = load_params(REPO / "params.yaml")
    assert params.fed_distance.otdd.federation in params.partition.federations
    assert params.run.device == "auto"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["run"].update(sedd=1), "run.sedd: unknown key; allowed keys here: device, max_workers, seed, task_runner"),
    (lambda d: d["partition"]["federations"]["pairs_strong"].update(structure="weak"),
     "partition.federations.pairs_strong.structure: Input should be 'strong' or 'none' (got 'weak')"),
    (lambda d: d["fed_distance"]["toy"].update(iterations=0), "fed_distance.toy.iterations: Input should be greater than or equal to 1"),
    (lambda d: d["fed_distance"]["otdd"]["fedwad"].update(t=1.5), "fed_distance.otdd.fedwad.t: must be 'random' or a number in (0, 1)"),
    (lambda d: d["partition"]["federations"]["case1"].update(colour=1), "partition.federations.case1.colour: unknown key"),
    (lambda d: d["fed_distance"]["clustering"].update(federations=["nope"]), "unknown federation 'nope'"),
    (lambda d: d["run"].update(device="gpu"), "run.device: must be one of auto, cpu, cuda, cuda:N"),
    (lambda d: d["fed_distance"]["toy"].update(dims=[2, "x"]), "fed_distance.toy.dims[1]: Input should be a valid integer"),
    (lambda d: d["partition"]["federations"]["pairs_none"].pop("n_clients"), "partition.federations.pairs_none.n_clients: required key is missing"),
    (lambda d: d["partition"]["federations"]["pairs_none"].update(scheme="kmeans"), "'by_dataset', 'iid', 'dirichlet', 'class_pairs', 'fedbary_case'"),
    (lambda d: d["fed_distance"]["toy"].update(ratios=[0]), "fed_distance.toy.ratios: ratios must be integers ≥ 1"),
    (lambda d: d["partition"]["federations"]["pairs_strong"].update(n_clients=4), "pairs_strong.n_clients: Input should be greater than or equal to 10"),
])
def test_invalid_params_name_the_key(raw: dict, mutate, expected: str) -> None:
    bad = copy.deepcopy(raw)
    mutate(bad)
    with pytest.raises(ConfigError) as info:
        validate_params(bad)
    assert expected in str(info.value)
    assert str(info.value).startswith("params.yaml: ")


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("run: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("- just a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_params(tmp_path / "params.yaml")


def test_params_hash_changes_with_values(raw: dict) -> None:
    a = validate_params(raw)
    b_raw = copy.deepcopy(raw)
    b_raw["run"]["seed"] = 1
    b = validate_params(b_raw)
    assert params_hash(a.partition) == params_hash(validate_params(copy.deepcopy(raw)).partition)
    assert params_hash(a.run) != params_hash(b.run)


def test_paper_scale_params_are_valid() -> None:
    params = load_params(REPO / "params-paper.yaml")
    assert params.partition.federations["otdd_benchmarks"].samples_per_client == 5000
    assert max(params.fed_distance.toy.n_values) == 10000
