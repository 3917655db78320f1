"""Every stage checks its inputs, its output folders and its data before any server starts (issue #25 item 4).

``python -m flows.stage <name>`` → :func:`flows.stage.main`: a partition file holding label 99 or client index 42,
x and y of different lengths, test features of another image size, raw images of two sizes, a text partition
without its ``label`` column, a missing checkpoint or one without weights, a message file of the wrong shape, a
read-only output folder, too little free disk → exit 2 and one ``error:`` line naming the file and the field,
before the Prefect flow (and its temporary server) starts — ``_run_flow`` fails the test if it is called — and
every file of the working folder byte for byte as before (the previous outputs included). On valid inputs
each stage's preflight passes and the flow is called.

The working folder is made once per module (:data:`TEMPLATE_STAGES`, partition → train_teachers → estimate_bias on
tiny params: the feature federation c1 and the text task sa) and copied for each test; the output folders of the
stages not run hold a stand-in for their previous outputs. A stage whose inputs none of :data:`TEMPLATE_STAGES`
writes gets a stand-in for each in :data:`STAND_INS` (the stage checklist, ``tests/architecture/stage_contract.py``,
names every input that has neither)."""
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
#: The stages the template runs: their outputs are the other stages' inputs here.
TEMPLATE_STAGES = ("partition", "train_teachers", "estimate_bias")
#: Inputs (paths relative to the working folder) that no stage of :data:`TEMPLATE_STAGES` writes, each with the
#: function that writes a valid stand-in for it there (none yet: every stage reads raw data or those stages' outputs).
STAND_INS: dict[str, Callable[[Path], None]] = {}


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
                          "fedavg": {"rounds": 1, "epochs": 1}, "alpha": None},  # 20 rows: too few to calibrate
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path) -> Path:
    """A working folder with the outputs of :data:`TEMPLATE_STAGES`, the :data:`STAND_INS`, and a stand-in
    ``metrics.json`` in each output folder of the stages not run (their previous outputs)."""
    root = tmp_path_factory.mktemp("preflight")
    params = preflight_params()
    run_track(root, migrated_mlflow_db, params, TEMPLATE_STAGES)
    for path, write in STAND_INS.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        write(root / path)
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


def test_noisy_removal_refuses_a_validation_set_too_small_to_calibrate(ws: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The calibrated rule splits every class of the server's validation rows into Q and calibration rows (≥ 2 on
    each side); with 20 rows of 10 classes that fails — before the flow, naming the key and the way out."""
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["noisy_removal"]["alpha"] = 0.05
    Path("params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    message = fails_before_the_flow(ws, "noisy_removal", capsys)
    assert message.startswith("noisy_removal.validation_samples: 20 rows of 'c1''s test split hold ")
    assert message.endswith("needs ≥ 4 per class (or set noisy_removal.alpha: null)")


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


# ---------------------------------------------------------------- bad values (issue #32 item 5): refused, named
def edit_params(root: Path, edit: Callable[[dict], Any]) -> None:
    """Rewrite ``root/params.yaml`` after ``edit`` (a function of the parsed params)."""
    params = yaml.safe_load((root / "params.yaml").read_text())
    edit(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


MNIST = REPO / "data" / "raw" / "images_mnist.npz"


@pytest.mark.parametrize("federation, message", [
    ({"scheme": "iid", "dataset": "mnist", "n_clients": 5, "samples": 1_000_000_000},
     "partition.federations.big.samples: 1000000000 rows (null: every row), but {mnist} holds 5000 train rows "
     "(x_train); at most 5000"),
    ({"scheme": "fedbary_case", "case": 1, "dataset": "mnist", "n_clients": 5, "samples_per_client": 1001},
     "partition.federations.big.samples_per_client: 5 clients × 1001 rows = 5005 rows, but {mnist} holds 5000 "
     "train rows (x_train); at most 1000 per client"),
    ({"scheme": "dirichlet", "dataset": "mnist", "n_clients": 5, "alpha": 1.0, "test_samples": 1001},
     "partition.federations.big.test_samples: 1001 rows, but {mnist} holds 1000 test rows (x_test); at most 1000"),
])
def test_more_rows_than_the_raw_file_holds_are_refused(ws: Path, capsys: pytest.CaptureFixture[str],
                                                       federation: dict, message: str) -> None:
    """Before, partition took every row there was (5,000) and wrote the number asked for into the manifest."""
    with np.load(MNIST) as npz:  # the rows there are, read independently of the stage
        assert (len(npz["x_train"]), len(npz["x_test"])) == (5000, 1000)
    edit_params(ws, lambda d: d["partition"]["federations"].update(big=federation))
    assert fails_before_the_flow(ws, "partition", capsys) == message.format(mnist=MNIST)


def test_a_seed_past_what_scikit_learn_takes_is_refused_before_the_flow(ws: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """run.seed = 2**70 overflowed inside a task (torch's manual_seed) after the server and the MLflow run started."""
    edit_params(ws, lambda d: d["run"].update(seed=2**70))
    assert fails_before_the_flow(ws, "train_teachers", capsys) == (
        f"params.yaml: run.seed: Input should be less than or equal to 2147483647 (got {2**70})")


def test_a_toy_size_no_memory_holds_is_named_before_the_flow(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """fed_distance.toy.n_values: [100000000] died with a MemoryError naming the task; an n × n float64 cost
    matrix and plan need 16·n² bytes (1.6e17: more than any machine has; the memory is pinned at 64 GiB here
    for an exact line)."""
    monkeypatch.setattr(stages.stage, "memory_bytes", lambda: 64 * 2**30, raising=False)  # absent before: the flow starts
    edit_params(ws, lambda d: d["fed_distance"]["toy"].update(n_values=[20, 100_000_000]))
    assert fails_before_the_flow(ws, "fed_distance", capsys) == (
        "fed_distance.toy.n_values[1]: n = 100000000: the exact W's 100000000 × 100000000 cost matrix and plan "
        "(float64) alone need 142 PiB, more than the 64.0 GiB of memory this machine has; lower it")


def test_the_toy_memory_bound_is_the_float64_cost_matrix_and_plan() -> None:
    """n = 1000 points against n / ratio = 1000 (ratio 1) hold a 1000 × 1000 float64 cost matrix and plan: 16·10⁶
    bytes, exactly at the limit passes, one byte less is refused; S = 5000 atoms against n = 1000 need 8·10⁷."""
    from otfed.errors import ConfigError
    from stages.fed_distance import ToyParams, toy_memory
    from stages.stage import check_memory

    toy = ToyParams(n_values=[1000], supports=[2], ratios=[1, 3], dims=[2], convergence_n=10)
    check_memory(toy_memory(toy), 16 * 1000 * 1000)
    with pytest.raises(ConfigError, match=r"^fed_distance\.toy\.n_values\[0\]: n = 1000: the exact W's 1000 × 1000 "):
        check_memory(toy_memory(toy), 16 * 1000 * 1000 - 1)
    wide = toy.model_copy(update={"supports": [2, 5000]})
    with pytest.raises(ConfigError, match=r"^fed_distance\.toy\.supports\[1\]: S = 5000: FedWaD's 1000 × 5000 ") as err:
        check_memory(toy_memory(wide), 8 * 10**7 - 1)
    assert err.value.keys == ("fed_distance.toy.supports[1]",)
    check_memory(toy_memory(wide), 8 * 10**7)


def test_features_too_large_for_float32_distances_are_named_by_column(ws: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A finite 3e38 feature passed every preflight and surfaced as "NaN or inf" inside a FedBary task (and as a
    distance of 6e37 in fed_distance). The bound: √(float32 max / D) / 2, so that D·(2·bound)² fits float32."""
    bound = np.sqrt(np.finfo(np.float32).max / 784) / 2
    assert 3.29e17 < bound < 3.3e17 and 784 * (2 * np.float64(bound)) ** 2 <= np.finfo(np.float32).max
    rows = {}

    def edit(a: dict[str, np.ndarray]) -> None:
        rows["row"] = int(np.flatnonzero(a["client"] == 2)[0])
        a["x"][rows["row"], 5] = 3e38
    rewrite_npz(ws / C1, edit)
    message = (f"{C1}: x column 5: 3e+38 (row {rows['row']}, client 'client_02') is too large; features must lie "
               "within ±3.29e+17, so that the squared distance between two rows of 784 features stays finite in "
               "float32 — rerun `dvc repro partition`")
    assert fails_before_the_flow(ws, "barycenter_valuation", capsys) == message
    assert fails_before_the_flow(ws, "noisy_removal", capsys) == message
    bench = Path(layout.PARTITIONS) / "bench.npz"
    rewrite_npz(ws / bench, lambda a: a["x"].__setitem__((7, 3), -1e30))
    assert fails_before_the_flow(ws, "fed_distance", capsys) == (
        f"{bench}: x column 3: -1e+30 (row 7, client 'mnist') is too large; features must lie within ±3.29e+17, so "
        "that the squared distance between two rows of 784 features stays finite in float32 — rerun `dvc repro "
        "partition`")


@pytest.mark.parametrize("stage, edit, message", [
    ("partition", lambda d: d["partition"]["federations"].update(
        pcs={"scheme": "iid", "dataset": "mnist", "n_clients": 2, "test_samples": 30, "pca_components": 31}),
     "partition.federations.pcs.pca_components: 31 components, but the PCA is fitted on the server's test split of "
     "{mnist}: 30 rows of 784 features; at most 30"),
    ("barycenter_valuation", lambda d: d["barycenter_valuation"].update(pca_components=41),
     "barycenter_valuation.pca_components: 41 components, but the PCA is fitted on the test split of {c1}: 40 rows "
     "of 784 features; at most 40"),
    ("noisy_removal", lambda d: d["noisy_removal"].update(pca_components=0, random_projection=784),
     "noisy_removal.random_projection: 784 dimensions, but {c1} has 784 features; a projection maps to fewer (at "
     "most 783)"),
])
def test_a_projection_larger_than_its_data_is_named(ws: Path, capsys: pytest.CaptureFixture[str], stage: str,
                                                    edit: Callable[[dict], Any], message: str) -> None:
    """scikit-learn's PCA takes at most min(rows, features) components; fit_pca / project_federation refused more
    only inside a task, without the key."""
    edit_params(ws, edit)
    assert fails_before_the_flow(ws, stage, capsys) == message.format(mnist=MNIST, c1=C1)


def test_a_duplication_no_memory_holds_is_named(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """copies: [1, 10**9] of client 0's 12 rows against Q's 20 rows: an exact W of 1.2e10 × 20 (float64 cost and
    plan: 16 bytes an entry, 3.5 TiB) — a MemoryError inside the duplication task before."""
    monkeypatch.setattr(stages.stage, "memory_bytes", lambda: 64 * 2**30, raising=False)
    edit_params(ws, lambda d: d["barycenter_valuation"]["duplication"].update(copies=[1, 10**9]))
    assert fails_before_the_flow(ws, "barycenter_valuation", capsys) == (
        "barycenter_valuation.duplication.copies[1]: 1000000000 copies of the 12 rows: the exact W's 12000000000 × 20 "
        "cost matrix and plan (float64) alone need 3.5 TiB, more than the 64.0 GiB of memory this machine has; "
        "lower it")


@pytest.mark.parametrize("file, row, where", [("parties.csv.gz", 4, ", party 'cell_phones', split 'train'"),
                                              ("transfer.csv.gz", 3, "")])
def test_a_blank_text_is_named(ws: Path, capsys: pytest.CaptureFixture[str], file: str, row: int, where: str) -> None:
    """The partition drops blank texts; a blank one in its files trained a teacher on an empty input unnoticed
    (or, in the one-column transfer file, read as a missing row)."""
    path = Path(layout.TEXT_PARTITIONS) / "sa" / file
    table = pd.read_csv(ws / path, dtype=str, keep_default_na=False)
    table.loc[row, "text"] = "  \t "
    table.to_csv(ws / path, index=False)
    assert fails_before_the_flow(ws, "train_teachers", capsys) == (
        f"{path}: column 'text' is blank in 1 row(s) (first: row {row}{where}); the partition writes no blank text "
        "— rerun `dvc repro partition`")


@pytest.mark.parametrize("stage, party", [("estimate_bias", "digital_music"), ("distill", "baby")])
def test_nan_teacher_weights_are_named(ws: Path, capsys: pytest.CaptureFixture[str], stage: str, party: str) -> None:
    """A teacher with a NaN weight passed the checkpoint loader: its bias and predictions came out NaN later."""
    from safetensors.torch import load_file, save_file

    weights = Path(layout.TEXT_MODELS) / "sa" / party / "model.safetensors"
    tensors = load_file(ws / weights)
    name = sorted(tensors)[0]
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, ws / weights)
    assert fails_before_the_flow(ws, stage, capsys) == (
        f"{weights}: tensor {name!r} holds 1 NaN or inf value(s) of {tensors[name].numel()}; a checkpoint's weights "
        "must be finite — rerun `dvc repro train_teachers`")


PAIRS = {"scheme": "class_pairs", "dataset": "mnist", "structure": "strong", "n_clients": 10, "samples": 400,
         "val_fraction": 0.2, "test_samples": 60}


@pytest.mark.parametrize("spoil, message", [
    (None, None),
    (lambda a: a["y_test"].__setitem__(slice(0, 30), [0] * 29 + [1]),
     "fed_distance.privacy.validation_samples: the server's validation split of 'pairs' (its first 30 test rows, "
     "FedBary's reference) is degenerate: every class needs at least 2 samples; class 1 has 1 sample; take more rows "
     "(or set fedbary_validation: [false] and dp.fedbary: false)"),
    (lambda a: a["split"].__setitem__(a["client"] == 0, 0),
     "fed_distance.privacy.pairs[0]: client 'client_00' has no held-out rows (the non-members of the membership "
     "test): partition it with val_fraction > 0"),
])
def test_the_privacy_study_checks_its_pairs_and_validation_split(ws: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], spoil: Any,
                                                                 message: str | None) -> None:
    """fed_distance's privacy study took the server's first validation_samples test rows as FedBary's reference and
    its pairs' held-out rows as non-members inside the stage's flow: a degenerate split failed there. The
    positive control (None): the same federation unspoilt passes."""
    from otfed.data.federations import build_federation
    from otfed.data.store import save_federation
    from stages.params import validate_params

    def add(d: dict) -> None:
        d["partition"]["federations"]["pairs"] = PAIRS
        d["fed_distance"]["privacy"] = {"federation": "pairs", "pca_components": 4, "pairs": [[0, 1]],
                                        "validation_samples": 30}
    edit_params(ws, add)
    p = validate_params(yaml.safe_load((ws / "params.yaml").read_text()), stage="partition")
    save_federation(build_federation("pairs", p.partition.federations["pairs"], p.partition.data_dir, 0)[0],
                    ws / layout.PARTITIONS)
    if spoil is not None:
        rewrite_npz(ws / layout.PARTITIONS / "pairs.npz", spoil)
        assert fails_before_the_flow(ws, "fed_distance", capsys) == message
    else:
        monkeypatch.setattr(flows.stage, "_run_flow", lambda *args, **kw: 0)
        assert main("fed_distance", params_path="params.yaml", argv=[]) == 0, capsys.readouterr().err


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
