"""dvc.yaml stays consistent with params.yaml: every federation a stage reads is among its deps."""
from __future__ import annotations

from pathlib import Path

import yaml

from otfed.config import load_params

REPO = Path(__file__).resolve().parent.parent


def test_fed_distance_depends_on_the_federations_it_reads() -> None:
    params = load_params(REPO / "params.yaml")
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["fed_distance"]
    deps = set(stage["deps"])
    out_dir = params.partition.out_dir
    needed = {params.fed_distance.otdd.federation, *params.fed_distance.clustering.federations}
    for name in needed:
        assert f"{out_dir}/{name}.npz" in deps or out_dir in deps, f"dvc.yaml fed_distance misses {name}.npz"


def test_every_stage_has_a_module_and_reads_its_params_group() -> None:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        assert stage["cmd"] == f"python -m stages.{name}"
        assert (REPO / "stages" / f"{name}.py").is_file()
        assert "run" in stage["params"]
