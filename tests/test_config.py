"""params.yaml schema (stages/params.py + each stage's params type): the committed file is valid; each kind
of bad value names its key path."""
from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from flows.tracking import params_hash
from stages.params import load_params, validate_params
from otfed.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def test_committed_params_are_valid() -> None:
    params = load_params(REPO / "params.yaml")
    assert params.fed_distance.otdd.federation in params.partition.federations
    assert params.run.device == "auto"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["run"].update(sedd=1), "run.sedd: unknown key; allowed keys here: dask_address, device, max_workers, seed, task_runner"),
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
    (lambda d: d["fed_distance"]["toy"].update(ratios=[3, 0]), "fed_distance.toy.ratios[1]: Input should be greater than or equal to 1 (got 0)"),
    (lambda d: d["partition"]["federations"]["pairs_strong"].update(n_clients=4), "pairs_strong.n_clients: Input should be greater than or equal to 10"),
])
def test_invalid_params_name_the_key(config_error, mutate, expected: str) -> None:
    message = config_error(mutate)
    assert expected in message and message.startswith("params.yaml: ")


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
    def dumped(group):
        return group.model_dump(mode="json")

    assert params_hash(dumped(a.partition)) == params_hash(dumped(validate_params(copy.deepcopy(raw)).partition))
    assert params_hash(dumped(a.run)) != params_hash(dumped(b.run))


def test_paper_scale_params_are_valid() -> None:
    params = load_params(REPO / "params-paper.yaml")
    assert params.partition.federations["otdd_benchmarks"].samples_per_client == 5000
    assert max(params.fed_distance.toy.n_values) == 10000


# --------------------------------------------------------------- barycenter_valuation / noisy_removal groups
def test_committed_params_have_the_valuation_groups() -> None:
    params = load_params(REPO / "params.yaml")
    assert params.barycenter_valuation is not None and params.noisy_removal is not None
    assert set(params.barycenter_valuation.contributions.federations) <= set(params.partition.federations)
    assert params.barycenter_valuation.detection.rates == [0.05, 0.15, 0.30]


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["barycenter_valuation"]["fedbary"].update(colour=1),
     "barycenter_valuation.fedbary.colour: unknown key; allowed keys here: barycenter_step, diagonal, init_scale, "
     "interpolation, iterations, lower_bound, max_support, min_geodesic_fraction, p, potential, record_history, solver, "
     "support_size, t"),
    (lambda d: d["barycenter_valuation"].update(pca=3), "barycenter_valuation.pca: unknown key; allowed keys here: "
     "contributions, detection, duplication, fedbary, pca_components"),
    (lambda d: d["noisy_removal"]["fedavg"].update(lr=0), "noisy_removal.fedavg.lr: Input should be greater than 0"),
    (lambda d: d["noisy_removal"].update(max_remove_fraction=1.5),
     "noisy_removal.max_remove_fraction: Input should be less than or equal to 1"),
    (lambda d: d["barycenter_valuation"]["detection"].update(rates=[0.05, 1.2]),
     "barycenter_valuation.detection.rates: rates must lie in (0, 1)"),
    (lambda d: d["barycenter_valuation"]["detection"].update(kinds=["label", "pixel"]),
     "barycenter_valuation.detection.kinds[1]: Input should be 'label' or 'feature'"),
    (lambda d: d["barycenter_valuation"]["fedbary"].update(t=0.0), "barycenter_valuation.fedbary.t: must be 'random'"),
    (lambda d: d["barycenter_valuation"]["fedbary"].update(potential="greedy"),
     "barycenter_valuation.fedbary.potential: Input should be 'sinkhorn' or 'exact'"),
    (lambda d: d["barycenter_valuation"]["contributions"].update(federations=["case1", "case9"]),
     "barycenter_valuation.contributions.federations[1]: unknown federation 'case9'"),
    (lambda d: d["barycenter_valuation"]["contributions"].update(federations=["otdd_benchmarks"]),
     "barycenter_valuation.contributions.federations[0]: 'otdd_benchmarks' has scheme 'by_dataset'"),
    (lambda d: d["noisy_removal"].update(validation_samples=1000),
     "noisy_removal.federations[0]: validation_samples (1000) must be smaller than"),
    (lambda d: d["barycenter_valuation"]["contributions"]["outlier"].update(federation="case4"),
     "outlier.federation: 'case4' is already noisy"),
    (lambda d: d["barycenter_valuation"]["contributions"]["outlier"].update(client=5),
     "barycenter_valuation.contributions.outlier.client: 5 ≥ n_clients"),
    (lambda d: d["barycenter_valuation"]["detection"].update(removal_step=0.6),
     "barycenter_valuation.detection: removal_step must be ≤ removal_max_fraction"),
])
def test_invalid_valuation_params_name_the_key(config_error, mutate, expected: str) -> None:
    assert expected in config_error(mutate)


def test_valuation_groups_are_optional_and_default_sensibly(raw: dict) -> None:
    bare = {k: v for k, v in copy.deepcopy(raw).items() if k not in {"barycenter_valuation", "noisy_removal"}}
    assert validate_params(bare).barycenter_valuation is None  # stages of other issues validate without them
    minimal = copy.deepcopy(bare) | {"barycenter_valuation": {}, "noisy_removal": {}}
    p = validate_params(minimal)
    assert p.barycenter_valuation.fedbary.support_size == 50 and p.noisy_removal.fedavg.rounds == 20


def test_paper_scale_valuation_groups_are_valid() -> None:
    params = load_params(REPO / "params-paper.yaml")
    assert params.barycenter_valuation.fedbary.support_size == 500
    assert params.noisy_removal.federations == ["fmnist_label_noise", "fmnist_feature_noise"]


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("run:\n  seed: 0\n  device: cpu\n  seed: 1\n")
    with pytest.raises(ConfigError) as err:
        load_params(path)
    assert str(err.value) == (f"{path}: duplicate key 'seed' (first on line 2, again on line 4): YAML would keep "
                              "only the last one")


def test_python_m_stages_params_validates_every_group(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What ``make pipeline`` and ``otfed repro`` run before ``dvc repro``: a misspelt key in a group that no
    stale stage would read is still an error (exit 2, one line naming it and the allowed keys)."""
    from stages.params import main

    assert main([str(REPO / "params.yaml")]) == 0
    path = tmp_path / "params.yaml"
    path.write_text((REPO / "params.yaml").read_text().replace("\n  seed: 0 ", "\n  sedd: 0 ", 1))
    assert main([str(path)]) == 2
    assert capsys.readouterr().err == (f"error: {path}: run.sedd: unknown key; allowed keys here: dask_address, "
                                       "device, max_workers, seed, task_runner\n")


def test_every_key_the_docs_override_exists_in_the_shipped_params() -> None:
    """``dvc exp run -S key=value`` fails on a key that params.yaml lacks: each one the README or the docs show must
    be there (the Dask command once named run.dask_address, which the file did not have)."""
    import re

    import yaml

    shipped = yaml.safe_load((REPO / "params.yaml").read_text())
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    keys = {(key, page.relative_to(REPO)) for page in pages
            for key in re.findall(r"-S ([a-z_]+(?:\.[a-z_]+)+)=", page.read_text(encoding="utf-8"))}
    assert len({key for key, _ in keys}) >= 4
    for key, page in sorted(keys):
        node = shipped
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{page} overrides {key}; params.yaml has no {part!r}"
            node = node[part]


def test_a_cross_reference_error_names_its_key_so_a_failed_exp_run_can_be_undone() -> None:
    """``dvc exp run -S fed_distance.clustering.federations=[ghost]`` writes the value into params.yaml; the
    stage puts the file back only at the keys the error names (flows.stage.undo_failed_override) — a check
    across groups must name its key too (it named none, and the bad value stayed in params.yaml)."""
    import yaml

    data = yaml.safe_load((REPO / "params.yaml").read_text())
    data["fed_distance"]["clustering"]["federations"] = ["ghost"]
    with pytest.raises(ConfigError) as err:
        validate_params(data, stage="fed_distance")
    assert str(err.value).startswith("params.yaml: fed_distance.clustering.federations: unknown federation 'ghost'")
    assert err.value.keys == ("fed_distance.clustering.federations",)



# ------------------------------------------------------------------ bad values refused (issue #32 item 5)
def test_run_seed_is_bounded_by_what_every_seed_consumer_takes(raw: dict, config_error) -> None:
    """run.seed = 2**70 passed validation and overflowed in torch's manual_seed inside a task. The bound leaves
    room for the run.seed + k the stages derive (k < 200: seeds counts ≤ 100, party indices, +1 / +2) within
    scikit-learn's random_state (< 2**32) and torch's manual_seed (< 2**64), checked against both libraries."""
    import torch
    from sklearn.utils import check_random_state

    assert config_error(lambda d: d["run"].update(seed=2**70)) == (
        f"params.yaml: run.seed: Input should be less than or equal to 2147483647 (got {2**70})")
    from stages.params import SEED_MAX

    assert config_error(lambda d: d["run"].update(seed=SEED_MAX + 1)) == (
        f"params.yaml: run.seed: Input should be less than or equal to {SEED_MAX} (got {SEED_MAX + 1})")
    raw["run"]["seed"] = SEED_MAX
    assert validate_params(raw).run.seed == SEED_MAX
    check_random_state(SEED_MAX + 200)
    torch.Generator().manual_seed(SEED_MAX + 200)
    with pytest.raises(ValueError):
        check_random_state(2**32)  # the limit the bound keeps the derived seeds away from


def test_yaml_merge_keys_are_accepted(tmp_path: Path) -> None:
    """``<<: *anchor`` is YAML's own merge key (DVC reads it too); the duplicate-key loader refused the file as "not
    valid YAML". The keys written beside a merge override the merged ones; a key written twice is still an error."""
    committed = (REPO / "params.yaml").read_text()
    anchored = committed.replace("\n  fedbary:                  #", "\n  fedbary: &fedbary         #", 1)
    merged = re.sub(r"\n  fedbary: \{support_size: 50[^}]*\}", "\n  fedbary: {<<: *fedbary, iterations: 20}", anchored)
    assert anchored != committed and merged.count("<<: *fedbary") == 1
    path = tmp_path / "params.yaml"
    path.write_text(merged)
    p, before = load_params(path), load_params(REPO / "params.yaml")
    assert p.noisy_removal.fedbary == before.noisy_removal.fedbary.model_copy(update={"iterations": 20})
    assert p.barycenter_valuation == before.barycenter_valuation
    path.write_text(merged.replace("{<<: *fedbary, iterations: 20}", "{<<: *fedbary, iterations: 20, iterations: 30}"))
    with pytest.raises(ConfigError, match=r"duplicate key 'iterations' \(first on line (\d+), again on line \1\)"):
        load_params(path)


def test_the_readme_names_the_commands_that_catch_an_unknown_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """``run.sedd: 1`` passes a plain ``dvc repro`` when no stage is stale (no stage runs, none reads the file): the
    README names ``make pipeline`` and ``otfed repro`` as the way to run the pipeline, and both refuse the key before
    ``dvc repro`` — ``otfed repro`` exits 2 without starting dvc, the Makefile's pipeline recipe validates first."""
    from typer.testing import CliRunner

    import flows.cli

    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert ("Run the pipeline with `make pipeline` or `otfed repro [STAGES]`: both validate the whole `params.yaml` "
            "first. A plain `dvc repro` runs only the stale stages") in readme
    assert "`run.sedd: 1` when every stage is up to date) passes it unnoticed" in readme
    recipe = (REPO / "Makefile").read_text().split("\npipeline:", 1)[1].split("\n\n", 1)[0]
    commands = [line.split("#")[0].strip() for line in recipe.splitlines()[1:]]
    assert commands.index("python -m stages.params") < next(i for i, c in enumerate(commands) if c.startswith("dvc repro"))
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text().replace("\n  seed: 0 ", "\n  sedd: 1 ", 1))
    monkeypatch.chdir(tmp_path)
    started: list = []
    monkeypatch.setattr(flows.cli.subprocess, "call", lambda cmd: started.append(cmd) or 0)
    result = CliRunner().invoke(flows.cli.app, ["repro"])
    assert result.exit_code == 2 and started == []
    assert "params.yaml: run.sedd: unknown key" in capsys.readouterr().err + result.output
