"""One track at a time, end to end through the stage runner: ``partition`` runs on a params file with the
text track only (and a broken feature group), or the feature track only (and a broken text group), and writes
that track's outputs alone; distill depends on the bias-messages folder, whatever tasks are trained."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from flows.stage import run_stage
from otfed.data.store import load_federation
from stages import layout
from stages.params import validate_params
from tests.stages.conftest import REPO

SA = {"dataset": "amazon_categories", "locals": ["cell_phones", "digital_music"], "global_party": "baby",
      "transfer": "grocery_food", "max_train": 30, "max_eval": 10, "max_transfer": 20}


@pytest.mark.slow  # a stage run
def test_partition_on_the_text_track_only(tiny: dict) -> None:
    params = {"run": tiny["run"],
              "partition": {"data_dir": tiny["partition"]["data_dir"], "text": {"tasks": {"sa": SA}}},
              "fed_distance": {"toy": "not a mapping"},
              "train_teachers": {"tasks": ["sa"]}}
    metrics = run_stage("partition", validate_params(params, stage="partition"))
    assert metrics["federations"] == 0 and metrics["text_tasks"] == 1
    assert json.loads((Path(layout.PARTITIONS) / "manifest.json").read_text()) == {}
    assert not list(Path(layout.PARTITIONS).glob("*.npz"))
    parties = pd.read_csv(Path(layout.TEXT_PARTITIONS) / "sa" / "parties.csv.gz")
    assert set(parties.party) == {"cell_phones", "digital_music", "baby"}
    reports = {p.name for p in Path(layout.PARTITION_REPORTS).iterdir()}
    assert "text_parties.csv" in reports and "clients.csv" not in reports


@pytest.mark.slow  # a stage run
def test_partition_on_the_feature_track_only(tiny: dict) -> None:
    params = {"run": tiny["run"],
              "partition": {"data_dir": tiny["partition"]["data_dir"],
                            "federations": {"bench": tiny["partition"]["federations"]["bench"]}},
              "distill": {"losses": ["wasserstein"]}}
    metrics = run_stage("partition", validate_params(params, stage="partition"))
    assert metrics["federations"] == 1 and "text_tasks" not in metrics
    bench = load_federation("bench", layout.PARTITIONS)
    assert bench.client_names == ("mnist", "usps", "fashionmnist", "kmnist")
    assert Path(layout.TEXT_PARTITIONS).is_dir() and not list(Path(layout.TEXT_PARTITIONS).iterdir())
    clients = pd.read_csv(Path(layout.PARTITION_REPORTS) / "clients.csv")
    assert clients.n_train.sum() == 4 * 40


def test_distill_depends_on_the_bias_folder_not_on_one_file_per_task() -> None:
    """Restricting train_teachers.tasks must not leave distill depending on files nobody writes."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    outs = [o if isinstance(o, str) else next(iter(o)) for o in stages["estimate_bias"]["outs"]]
    assert layout.TEXT_BIAS in outs
    deps = stages["distill"]["deps"]
    assert layout.TEXT_BIAS in deps and layout.TEXT_MESSAGES in deps
    per_file = [d for d in deps if d.endswith((".npz", ".csv", ".csv.gz"))]
    assert not per_file, f"distill depends on single files of a folder output: {per_file}"

