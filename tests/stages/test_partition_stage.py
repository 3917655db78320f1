"""Stage ``partition`` on tiny params: outputs, manifest, ground truth, bad params → exit 2 (determinism: every
output file byte for byte, in ``test_reproducible_reports.py``)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flows.stage
from flows.stage import main, run_stage
from otfed.data.store import load_federation
from otfed.errors import DataFileError
from stages import layout

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a stage run
def test_partition_writes_federations_and_manifest(tiny: dict, tmp_path: Path) -> None:
    summary = run_stage("partition", tiny)
    out = Path(layout.PARTITIONS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest) == {"bench", "pairs", "noisy"} and summary["federations"] == 3
    bench = load_federation("bench", out)
    assert bench.client_names == ("mnist", "usps", "fashionmnist", "kmnist") and bench.x.shape == (160, 784)
    pairs = load_federation("pairs", out)
    assert pairs.x.shape[1] == 20 and pairs.n_clients == 10
    for k in range(pairs.n_clients):  # strong structure: each client's labels inside its pair
        labels = set(pairs.y[pairs.client == k].tolist())
        g = pairs.client_group[k]
        assert labels <= {2 * g, 2 * g + 1}
    noisy = load_federation("noisy", out)
    # ground truth: corrupted rows are exactly the rows whose label differs from the clean label
    np.testing.assert_array_equal(noisy.corrupted, noisy.y != noisy.y_clean)
    counts = [int(noisy.corrupted[noisy.client == k].sum()) for k in range(5)]
    assert counts == [0, 2, 4, 6, 8]  # 0/5/10/15/20% of 40
    assert sum(c["n_corrupted"] for c in manifest["noisy"]["clients"]) == sum(counts)
    assert (tmp_path / "reports" / "partition" / "class_histograms.png").stat().st_size > 0


def test_bad_params_exit_2_and_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("run: {seed: -1}\npartition: {federations: {}}\n")
    called = []
    monkeypatch.setattr(flows.stage, "run_stage", lambda *args: called.append(args))
    assert main("partition", params_path=tmp_path / "params.yaml") == 2
    assert not called and sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.slow  # a fresh interpreter importing the stage
def test_stage_command_line_reports_config_errors(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text("run: {seeed: 1}\n")
    proc = subprocess.run([sys.executable, "-m", "flows.stage", "partition"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "params.yaml: run.seeed: unknown key" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_missing_data_file_is_named(tiny: dict, tmp_path: Path) -> None:
    tiny["partition"]["data_dir"] = str(tmp_path / "nowhere")
    with pytest.raises(DataFileError, match="images_mnist.npz"):
        run_stage("partition", tiny)
    assert not Path(layout.PARTITIONS).exists()


def test_a_stage_module_is_no_command(tmp_path: Path) -> None:
    """One entry point: ``python -m stages.partition`` (the command before the runner took every stage) says so and
    exits 2 instead of importing the module and exiting 0 having run nothing."""
    proc = subprocess.run([sys.executable, "-m", "stages.partition"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: `python -m stages.partition` runs nothing: a stage runs through the runner, "
                                   "`python -m flows.stage partition` (what dvc.yaml runs; or `otfed run partition`)")
    assert list(tmp_path.iterdir()) == []
