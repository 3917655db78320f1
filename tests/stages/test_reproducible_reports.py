"""A clean tree after the main command (issue #12): every committed output of the feature track — the reports
folders (git) and the data folders (hashed in ``dvc.lock``) of ``partition``, ``fed_distance``,
``barycenter_valuation`` and ``noisy_removal`` — comes out byte for byte the same when the track runs again on
the same params in another folder, with no wall-time column in any committed table. The first run is the
session's shared one (``feature_run``, also read by the stage tests); the text track's twin check is in
``test_text_stages.py``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.stages.conftest import FEATURE_TRACK, assert_reproducible, feature_params, run_track

pytestmark = pytest.mark.slow  # the feature track run twice (four stages each)


@pytest.fixture(scope="module")
def feature_rerun(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("feature_rerun")
    return run_track(root, migrated_mlflow_db, feature_params(root), FEATURE_TRACK)


@pytest.mark.parametrize("stage_name", FEATURE_TRACK)
def test_feature_track_outputs_are_byte_reproducible(stage_name: str, feature_run: dict[str, Any],
                                                     feature_rerun: dict[str, Any]) -> None:
    assert feature_run["root"] != feature_rerun["root"]
    assert_reproducible(stage_name, feature_run["root"], feature_rerun["root"])
