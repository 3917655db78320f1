"""dvc.yaml stays consistent with params.yaml: every federation a stage reads is among its deps.

(Code deps, outs and params of every stage: tests/architecture/test_architecture.py.)"""
from __future__ import annotations

from pathlib import Path

import yaml

from stages import layout
from stages.params import load_params
from tests.architecture.import_graph import stage_command

REPO = Path(__file__).resolve().parent.parent


def test_fed_distance_depends_on_the_federations_it_reads() -> None:
    params = load_params(REPO / "params.yaml")
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["fed_distance"]
    deps = set(stage["deps"])
    needed = {params.fed_distance.otdd.federation, *params.fed_distance.clustering.federations}
    for name in needed:
        assert f"{layout.PARTITIONS}/{name}.npz" in deps or layout.PARTITIONS in deps, \
            f"dvc.yaml fed_distance misses {name}.npz"


def test_every_stage_has_a_module_and_reads_its_params_group() -> None:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        assert stage["cmd"] == stage_command(name)  # the one entry point, the runner: python -m flows.stage <name>
        assert (REPO / "stages" / f"{name}.py").is_file()
        assert {"run.seed", "run.device", name} <= set(stage["params"])
