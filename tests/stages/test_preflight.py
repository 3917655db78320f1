"""Every stage checks its inputs, its output folders and its data before any server starts (issue #25 item 4).

``python -m flows.stage <name>`` → :func:`flows.stage.main`: a partition file holding label 99 or client index 42,
x and y of different lengths, test features of another image size, raw images of two sizes, a text partition
without its ``label`` column, a missing checkpoint or one without weights, a message file of the wrong shape, a
read-only output folder, too little free disk → exit 2 and one ``error:`` line naming the file and the field,
before the Prefect flow (and its temporary server) starts — ``_run_flow`` fails the test if it is called — and
every file of the working folder byte for byte as before (the previous outputs included). On valid inputs
each stage's preflight passes and the flow is called.

The working folder is made once per module (partition → train_teachers → estimate_bias on tiny params: the
feature federation c1 and the text task sa) and copied for each test; the output folders of the stages not
run hold a stand-in for their previous outputs."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest
import yaml

import flows.stage
import stages.stage
from flows.stage import PREFECT_STARTUP_TIMEOUT_S, configure_prefect_environment, main
from otfed.federation.knot import load_messages, save_messages
from otfed.federation.messages import PredictionMessage
from stages import layout
from stages.params import stage as stage_named
from tests.stages.conftest import REPO, run_track

FED = {"scheme": "fedbary_case", "case": 1, "dataset": "fashionmnist", "n_clients": 5, "samples_per_client": 12,
       "val_fraction": 0.0, "test_samples": 40}
FEDBARY = {"support_size": 5, "iterations": 2}
SA = {"dataset": "amazon_categories", "locals": ["cell_phones", "digital_music"], "global_party": "baby",
      "transfer": "grocery_food", "max_train": 30, "max_eval": 10, "max_transfer": 20, "audit": 5}
BOW = {"kind": "bow", "layers": 1, "hidden": 16, "max_length": 24, "vocab_size": 200}
STAGES = ("partition", "train_teachers", "estimate_bias", "distill", "fed_distance", "barycenter_valuation",
          "noisy_removal")
BENCH = {"scheme": "by_dataset", "datasets": ["mnist", "usps"], "samples_per_client": 80, "image_size": 28,
         "val_fraction": 0.0}


def preflight_params() -> dict:
    """Both tracks on tiny data: the federation c1 (5 clients × 12 rows) and the text task sa (3 parties)."""
    return {
        "run": {"seed": 0, "device": "cpu", "task_runner": "sequential", "max_workers": 1},
        "partition": {"data_dir": str(REPO / "data" / "raw"), "federations": {"c1": FED, "bench": BENCH},
                      "text": {"tasks": {"sa": SA}}},
        "train_teachers": {"tasks": ["sa"], "model": BOW, "training": {"epochs": 1, "batch_size": 16}},
        "estimate_bias": {"n_texts": 10, "text_length": 5, "batch_size": 8},
        "distill": {"epochs": 1, "seeds": 1},
        "fed_distance": {
            "toy": {"n_values": [20], "supports": [2], "ratios": [1], "dims": [2], "iterations": 2,
                    "exact_interp_max_n": 20, "repeats": 1, "convergence_n": 20, "sweep_supports": [5]},
            "otdd": {"federation": "bench", "fedwad": {"support_size": 5, "iterations": 2}},
            "clustering": {"federations": ["bench"], "n_clusters": 2, "neighbors": [1],
                           "fedwad": {"support_size": 5, "iterations": 2}},
            "clustered_fl": None,
        },
        "barycenter_valuation": {
            "pca_components": 4, "fedbary": FEDBARY,
            "contributions": {"federations": ["c1"], "validation_samples": 20, "monte_carlo_permutations": 2,
                              "fedavg": {"rounds": 1, "epochs": 1}, "outlier": {"federation": "c1", "client": 4}},
            "detection": {"federation": "c1", "kinds": ["label"], "rates": [0.3], "validation_samples": 20},
            "duplication": {"federation": "c1", "client": 0, "copies": [1, 2], "datum_copies": 2,
                            "validation_samples": 20, "seed_repeats": 0},
        },
        "noisy_removal": {"federations": ["c1"], "pca_components": 4, "validation_samples": 20, "fedbary": FEDBARY,
                          "fedavg": {"rounds": 1, "epochs": 1}},
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path) -> Path:
    """A working folder with the outputs of partition, train_teachers and estimate_bias, and a stand-in
    ``metrics.json`` in each output folder of the stages not run (their previous outputs)."""
    root = tmp_path_factory.mktemp("preflight")
    params = preflight_params()
    run_track(root, migrated_mlflow_db, params, ("partition", "train_teachers", "estimate_bias"))
    for name in STAGES:
        for folder in stage_named(name).outputs:
            if not (root / folder).exists():
                (root / folder).mkdir(parents=True)
                (root / folder / "metrics.json").write_text('{"previous": "outputs"}\n')
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for extra in ("mlruns.db", "mlartifacts"):
        shutil.rmtree(root / extra, ignore_errors=True) if (root / extra).is_dir() else (root / extra).unlink(True)
    return root


@pytest.fixture
def ws(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the template as the cwd; ``_run_flow`` (the Prefect flow and its temporary server) fails the
    test if it is called."""
    root = tmp_path / "ws"
    shutil.copytree(template, root)
    monkeypatch.chdir(root)

    def no_flow(*args: Any, **kwargs: Any) -> int:
        raise AssertionError("the preflight let the stage start its Prefect flow")

    monkeypatch.setattr(flows.stage, "_run_flow", no_flow)
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root``: a file's bytes, None for a folder."""
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def fails_before_the_flow(root: Path, stage: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run stage ``stage`` as ``python -m flows.stage <stage>`` does; assert exit 2, one ``error:`` line on stderr,
    nothing written or removed anywhere in ``root``; return the line (without ``error: ``)."""
    before = tree(root)
    capsys.readouterr()
    assert main(stage, params_path="params.yaml", argv=[]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    after = tree(root)
    assert sorted(after) == sorted(before), set(after) ^ set(before)
    assert [k for k in before if before[k] != after[k]] == []
    return err[0][len("error: "):]


def rewrite_npz(path: Path, edit: Callable[[dict[str, np.ndarray]], Any]) -> None:
    """Edit a partition file in place as an outside hand would (no check on the way in)."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    edit(arrays)
    np.savez_compressed(path, **arrays)


C1 = Path(layout.PARTITIONS) / "c1.npz"


def test_valid_inputs_pass_every_preflight(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The positive control: on the files the earlier stages wrote every stage's preflight passes and the
    flow is started (a stand-in here); it wrote nothing."""
    started: list[str] = []
    monkeypatch.setattr(flows.stage, "_run_flow", lambda the_stage, *args, **kw: started.append(the_stage.name) or 0)
    before = tree(ws)
    for name in STAGES:
        assert main(name, params_path="params.yaml", argv=[]) == 0, capsys.readouterr().err
    assert started == list(STAGES)
    assert tree(ws) == before


# --------------------------------------------------------------------------------- partition files
def test_label_99_is_named_with_its_client(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def edit(a: dict[str, np.ndarray]) -> None:
        a["y"][np.flatnonzero(a["client"] == 3)[2]] = 99
    rewrite_npz(ws / C1, edit)
    row = 3 * 12 + 2
    assert fails_before_the_flow(ws, "noisy_removal", capsys) == (
        f"{C1}: y of client 3 (client_03): label 99 outside 0..9 (row {row})")


def test_fed_distance_checks_every_federation_it_reads(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, fed_distance had no preflight: a bad federation surfaced inside a task, after the server
    started (its OTDD and clustering federation with a label 99, then with its file missing)."""
    bench = Path(layout.PARTITIONS) / "bench.npz"
    rewrite_npz(ws / bench, lambda a: a["y"].__setitem__(0, 99))
    assert fails_before_the_flow(ws, "fed_distance", capsys) == (
        f"{bench}: y of client 0 (mnist): label 99 outside 0..9 (row 0)")
    (ws / bench).unlink()
    assert fails_before_the_flow(ws, "fed_distance", capsys) == (
        f"{bench}: not found — an input of stage fed_distance (written by stage partition: run `dvc repro "
        "partition`)")


def test_a_client_index_past_the_clients_listed_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_npz(ws / C1, lambda a: a["client"].__setitem__(7, 42))
    assert fails_before_the_flow(ws, "barycenter_valuation", capsys) == (
        f"{C1}: client: row 7 has client index 42 outside 0..4 (client_names lists 5 clients)")


def test_x_and_y_of_different_lengths_are_named_not_an_index_error(ws: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_npz(ws / C1, lambda a: a.update(y=a["y"][:-1]))
    assert fails_before_the_flow(ws, "noisy_removal", capsys) == (
        f"{C1}: x: 60 entries but y has 59; each of x, y, y_clean, client, split, corrupted, source_index holds "
        f"one entry per row")


def test_test_features_of_another_image_size_are_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rewrite_npz(ws / C1, lambda a: a.update(x_test=np.zeros((40, 16 * 16), np.float32)))
    assert fails_before_the_flow(ws, "barycenter_valuation", capsys) == (
        f"{C1}: x_test: 256 features per row but x has 784; the clients and the server's test split share one "
        f"feature space (same image size, same PCA)")


def test_raw_images_of_two_sizes_are_named_before_partitioning(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = ws / "raw"
    raw.mkdir()
    with np.load(REPO / "data" / "raw" / "images_fashionmnist.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["x_test"] = np.ascontiguousarray(arrays["x_test"][:, :16, :16])  # an edited test split: 16×16 images
    np.savez_compressed(raw / "images_fashionmnist.npz", **arrays)
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["partition"] = {"data_dir": "raw", "federations": {"c1": FED}}
    (ws / "params.yaml").write_text(yaml.safe_dump(params))
    assert fails_before_the_flow(ws, "partition", capsys) == (
        "partition.federations.c1: images of different sizes — raw/images_fashionmnist.npz x_train: 28×28 images → "
        "784 features; raw/images_fashionmnist.npz x_test: 16×16 images → 256 features; set "
        "partition.federations.c1.image_size (e.g. 28) so that all are resized alike")


def test_a_missing_partition_file_names_the_stage_that_writes_it(ws: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (ws / C1).unlink()
    assert fails_before_the_flow(ws, "noisy_removal", capsys) == (
        f"{C1}: not found — an input of stage noisy_removal (written by stage partition: run `dvc repro partition`)")


# ------------------------------------------------------------------------------------- text track
def test_a_missing_csv_column_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(layout.TEXT_PARTITIONS) / "sa" / "parties.csv.gz"
    pd.read_csv(ws / path, dtype=str, keep_default_na=False).drop(columns=["label"]).to_csv(ws / path, index=False)
    assert fails_before_the_flow(ws, "train_teachers", capsys) == (
        f"{path}: missing column(s) 'label'; found: party, role, split, text, id")


@pytest.mark.parametrize("stage, party", [("estimate_bias", "digital_music"), ("distill", "baby")])
def test_a_missing_checkpoint_is_named(ws: Path, capsys: pytest.CaptureFixture[str], stage: str, party: str) -> None:
    folder = Path(layout.TEXT_MODELS) / "sa" / party
    shutil.rmtree(ws / folder)
    assert fails_before_the_flow(ws, stage, capsys) == (
        f"{folder}: not found — an input of stage {stage} (written by stage train_teachers: run "
        f"`dvc repro train_teachers`)")


def test_a_checkpoint_without_its_weights_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = Path(layout.TEXT_MODELS) / "sa" / "cell_phones" / "model.safetensors"
    (ws / weights).unlink()
    assert fails_before_the_flow(ws, "estimate_bias", capsys) == (
        f"{weights}: missing — a bag-of-words classifier needs model.safetensors")


def test_a_message_file_of_the_wrong_shape_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(layout.TEXT_MESSAGES) / "sa.npz"
    messages = load_messages(ws / path)
    spoilt = []
    for m in messages:  # digital_music's predictions over 4 labels instead of the task's 5
        if isinstance(m, PredictionMessage) and m.sender == "digital_music":
            p = m.probabilities[:, :4] / m.probabilities[:, :4].sum(1, keepdims=True)
            m = PredictionMessage(kind=m.kind, sender=m.sender, receiver=m.receiver, probabilities=p)
        spoilt.append(m)
    save_messages(ws / path, spoilt)
    assert fails_before_the_flow(ws, "distill", capsys) == (
        f"{path}: transfer_predictions of 'digital_music': PredictionMessage of shape (20, 4); expected "
        f"PredictionMessage of shape (20, 5)")


def test_a_teacher_missing_from_the_bias_file_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(layout.TEXT_BIAS) / "sa.npz"
    save_messages(ws / path, [m for m in load_messages(ws / path) if m.sender != "cell_phones"])
    assert fails_before_the_flow(ws, "distill", capsys) == (
        f"{path}: 0 'probability_bias' messages from 'cell_phones' (it sent none); the server needs one from each "
        f"of cell_phones, digital_music, baby")


# ------------------------------------------------------------------------------ output folders, disk
def test_a_read_only_reports_folder_is_named(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod does not stop root from writing (the injected twin below runs)")
    reports = ws / "reports"
    reports.chmod(0o555)
    try:
        assert fails_before_the_flow(ws, "noisy_removal", capsys) == (
            "reports: not writable — stage noisy_removal writes reports/removal there (built in a staging folder "
            "beside it, then swapped in); make reports writable")
    finally:
        reports.chmod(0o755)


@pytest.mark.parametrize("folder, stage", [("reports", "noisy_removal"), ("models/text/sa", "train_teachers")])
def test_an_unwritable_output_folder_is_named(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str], folder: str, stage: str) -> None:
    """The same, with the folder's permission injected (it runs as root too): the folder that holds an output
    (reports/), or a folder inside the previous outputs, which go once the new ones are in (models/text/sa)."""
    real = stages.stage.writable
    monkeypatch.setattr(stages.stage, "writable", lambda path: Path(path) != Path(folder) and real(path))
    message = fails_before_the_flow(ws, stage, capsys)
    if folder == "reports":
        assert message == ("reports: not writable — stage noisy_removal writes reports/removal there (built in a "
                           "staging folder beside it, then swapped in); make reports writable")
    else:
        assert message == ("models/text/sa: not writable — stage train_teachers replaces models/text (its previous "
                           "outputs) when it succeeds; make models/text/sa writable")


def test_too_little_disk_is_named(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(stages.stage, "free_bytes", lambda path: 10 * 2**20)
    assert fails_before_the_flow(ws, "noisy_removal", capsys) == (
        "reports/removal: 10 MiB free on the disk that holds it; stage noisy_removal needs at least 256 MiB "
        "(256 MiB to work in + 0 MiB, the size of its current outputs reports/removal, rebuilt beside them) — "
        "free some space (or set OTFED_MIN_FREE_MB)")


def test_the_disk_needs_room_for_the_outputs_rebuilt_beside_the_old(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """OTFED_MIN_FREE_MB=1: the stage needs 1 MiB + the bytes of its current outputs, exactly."""
    monkeypatch.setenv("OTFED_MIN_FREE_MB", "1")
    outputs = stage_named("train_teachers").outputs
    size = sum(f.stat().st_size for folder in outputs for f in (ws / folder).rglob("*") if f.is_file())
    monkeypatch.setattr(stages.stage, "free_bytes", lambda path: 2**20 + size - 1)
    assert "stage train_teachers needs at least" in fails_before_the_flow(ws, "train_teachers", capsys)
    monkeypatch.setattr(stages.stage, "free_bytes", lambda path: 2**20 + size)
    monkeypatch.setattr(flows.stage, "_run_flow", lambda *args, **kw: 0)
    assert main("train_teachers", params_path="params.yaml", argv=[]) == 0


# ----------------------------------------------------------------------------- Prefect start-up ceiling
VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def test_the_server_start_up_ceiling_is_generous_unless_the_user_sets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PREFECT_HOME", "PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_LEVEL",
                 "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", VARIABLE):
        monkeypatch.setenv(name, "x")  # monkeypatch restores each one afterwards
        monkeypatch.delenv(name)
    configure_prefect_environment()
    assert os.environ[VARIABLE] == str(PREFECT_STARTUP_TIMEOUT_S) == "600"
    monkeypatch.setenv(VARIABLE, "45")
    configure_prefect_environment()
    assert os.environ[VARIABLE] == "45"
