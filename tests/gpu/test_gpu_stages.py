"""The pipeline's torch stages on a CUDA GPU (marked ``gpu``: skipped where torch sees none; ``gpu/gpu_check.sh``
runs them), on the tiny params of the stage tests with ``run.device: cuda``:

* the text track — partition → train_teachers → estimate_bias → distill — completes, every model it builds or
  loads is on the GPU, and its tables and message files agree with independent recomputations on the CPU (the
  saved teachers' transfer predictions, argmax recounts of the bias, scores recomputed from saved predictions);
* the feature track's FedAvg (noisy_removal's accuracies, the contributions job's exact Shapley values) on the GPU
  gives the CPU's numbers within float tolerance: accuracies within 2 test samples, Shapley values within 2
  validation samples (an argmax near a tie may flip; everything else is the same computation).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import stages.barycenter_valuation as bv
import stages.train_teachers
from flows.stage import run_stage
from otfed.data.text import load_text_federation
from otfed.distill.bias import random_texts
from otfed.federation.knot import load_messages
from otfed.label_space import LabelSpace
from otfed.metrics import macro_f1
from otfed.models import TextClassifier
from otfed.models.tokenizer import vocabulary
from stages import layout
from stages.params import validate_params
from tests.stages.test_text_stages import text_params
from tests.stages.test_valuation_stages import valuation_params

pytestmark = pytest.mark.gpu

VARIANTS = {f"{loss}-{w}" for loss in ("Sinkhorn", "Entropy") for w in "ADUE"} | {"Sinkhorn-E-onehot",
                                                                                "global (no distillation)"}


@pytest.fixture(scope="module")
def gpu_text_run(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path):
    """The text track once on ``run.device: cuda``; the devices of every model built or loaded on the way."""
    root = tmp_path_factory.mktemp("gpu_text")
    shutil.copy(migrated_mlflow_db, root / "mlruns.db")
    params = text_params(root)
    params["run"]["device"] = "cuda"
    devices: list[str] = []
    real_build, real_load = stages.train_teachers.build_classifier, TextClassifier.load.__func__

    def build(*args, **kwargs):
        clf = real_build(*args, **kwargs)
        devices.append(clf.device.type)
        return clf

    def load(cls, directory, device=None):
        clf = real_load(cls, directory, device=device)
        devices.append(clf.device.type)
        return clf

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlruns.db'}")
        mp.chdir(root)
        mp.setattr(stages.train_teachers, "build_classifier", build)
        mp.setattr(TextClassifier, "load", classmethod(load))
        metrics = {stage: run_stage(stage, validate_params(params, stage=stage))
                   for stage in ("partition", "train_teachers", "estimate_bias", "distill")}
    return {"root": root, "params": params, "devices": devices, "metrics": metrics}


def test_every_text_model_runs_on_cuda_and_the_tables_are_written(gpu_text_run) -> None:
    root, devices = gpu_text_run["root"], gpu_text_run["devices"]
    # 3 teachers built; 3 loaded for their bias; the global model loaded once for reference, once per student
    assert devices == ["cuda"] * (3 + 3 + 1 + 9)
    for folder, names in ((layout.TEACHER_REPORTS, ("teachers.csv", "history.csv", "communication.csv")),
                          (layout.BIAS_REPORTS, ("bias.csv",)),
                          (layout.DISTILL_REPORTS, ("results.csv", "history.csv", "table_sa.csv",
                                                    "predictions_sa.npz"))):
        for name in names:
            assert (root / folder / name).stat().st_size > 0, f"{folder}/{name}"
    results = pd.read_csv(root / layout.DISTILL_REPORTS / "results.csv")
    assert set(results.variant) == VARIANTS
    history = pd.read_csv(root / layout.DISTILL_REPORTS / "history.csv")
    assert np.isfinite(history.loss).all()


def test_messages_are_what_the_saved_teachers_predict_on_the_cpu(gpu_text_run) -> None:
    root = gpu_text_run["root"]
    fed = load_text_federation(root / layout.TEXT_PARTITIONS / "sa")
    messages = {(m.kind, m.sender): m for m in load_messages(root / layout.TEXT_MESSAGES / "sa.npz")}
    for party in fed.parties:
        clf = TextClassifier.load(root / layout.TEXT_MODELS / "sa" / party.name, device="cpu")
        np.testing.assert_allclose(messages[("transfer_predictions", party.name)].probabilities,
                                   clf.predict_proba(list(fed.transfer_texts)), atol=1e-4)


def test_bias_is_the_argmax_frequency_recounted_on_the_cpu(gpu_text_run) -> None:
    root, params = gpu_text_run["root"], gpu_text_run["params"]
    table = pd.read_csv(root / layout.BIAS_REPORTS / "bias.csv")
    labels = list(LabelSpace.for_task("sa").labels)
    np.testing.assert_allclose(table[labels].sum(axis=1), 1.0)
    eb = params["estimate_bias"]
    clf = TextClassifier.load(root / layout.TEXT_MODELS / "sa" / "cell_phones", device="cpu")
    texts = random_texts(vocabulary(clf.tokenizer), eb["n_texts"], eb["text_length"], rng=params["run"]["seed"])
    counts = np.bincount(clf.predict_proba(texts).argmax(1), minlength=len(labels)) / len(texts)
    row = table[table.party == "cell_phones"].iloc[0]
    # an argmax near a tie may flip between the devices: at most one text of the n_texts
    assert np.abs(row[labels].to_numpy(dtype=float) - counts).sum() <= 2 / len(texts) + 1e-12


def test_distill_scores_are_recomputed_from_the_saved_predictions(gpu_text_run) -> None:
    root = gpu_text_run["root"]
    results = pd.read_csv(root / layout.DISTILL_REPORTS / "results.csv")
    with np.load(root / layout.DISTILL_REPORTS / "predictions_sa.npz") as saved:
        for row in results.itertuples():
            probs, labels = saved[f"{row.variant}|{row.test_set}"], saved[f"labels|{row.test_set}"]
            np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
            assert row.score == pytest.approx(macro_f1(labels, probs, n_labels=5), abs=1e-4)


# ------------------------------------------------------------------------------------- feature track
@pytest.fixture(scope="module")
def valuation_root(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path):
    root = tmp_path_factory.mktemp("gpu_valuation")
    shutil.copy(migrated_mlflow_db, root / "mlruns.db")
    params = valuation_params(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlruns.db'}")
        mp.chdir(root)
        run_stage("partition", validate_params(params, stage="partition"))
    return root, params


def _with_device(params: dict, device: str) -> dict:
    return {**params, "run": {**params["run"], "device": device}}


def test_noisy_removal_on_cuda_gives_the_cpu_accuracies(valuation_root, monkeypatch: pytest.MonkeyPatch) -> None:
    root, params = valuation_root
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlruns.db'}")
    monkeypatch.chdir(root)
    tables = {}
    for device in ("cuda", "cpu"):
        run_stage("noisy_removal", validate_params(_with_device(params, device), stage="noisy_removal"))
        tables[device] = pd.read_csv(Path(layout.REMOVAL_REPORTS) / "removal.csv").iloc[0]
    n_test = 200 - params["noisy_removal"]["validation_samples"]  # fnoisy: 200 test rows, the rest is validation
    for column in ("accuracy_before", "accuracy_after", "accuracy_oracle_removal", "accuracy_random_removal"):
        assert abs(tables["cuda"][column] - tables["cpu"][column]) <= 2 / n_test + 1e-12, column
    for column in ("removed", "removed_noisy", "flagged"):  # FedBary (NumPy) does not depend on the device
        assert tables["cuda"][column] == tables["cpu"][column]


def test_exact_shapley_with_fedavg_on_cuda_gives_the_cpu_values(valuation_root,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    root, params = valuation_root
    monkeypatch.chdir(root)
    values = {}
    for device in ("cuda", "cpu"):
        p = validate_params(_with_device(params, device), stage="barycenter_valuation")
        job = next(j for j in bv.STAGE.jobs(p, {}) if j.name == "contributions c5")
        assert job.kwargs["device"] == device
        rows = pd.DataFrame(job())
        values[device] = rows[rows.method == "exact_shapley"].set_index("client").value
    n_validation = params["barycenter_valuation"]["contributions"]["validation_samples"]
    assert (values["cuda"] - values["cpu"]).abs().max() <= 2 / n_validation + 1e-12
    assert values["cpu"].abs().max() > 0  # the game is not flat: the comparison means something
