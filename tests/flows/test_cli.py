"""The ``otfed`` command (flows/cli.py, flows/doctor.py) through typer's CliRunner: help lists the commands,
an unknown stage exits 2 listing the stages, ``doctor`` passes on this repository and FAILs naming the key
of a broken params file, the lock-version comparison reads pins as pip does."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows import doctor
from flows.cli import app
from stages.params import stages

REPO = Path(__file__).resolve().parents[2]
STAGES = ", ".join(sorted(stages()))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_help_lists_the_commands(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("run", "repro", "results", "doctor"):
        assert f" {command} " in result.output


def test_an_unknown_stage_exits_2_listing_the_stages(runner: CliRunner) -> None:
    result = runner.invoke(app, ["run", "nosuchstage"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: unknown stage 'nosuchstage'; stages: {STAGES}"


def test_run_hands_the_stage_params_and_verbosity_to_the_runner(runner: CliRunner, monkeypatch) -> None:
    import flows.stage

    calls = []
    monkeypatch.setattr(flows.stage, "main", lambda stage, params_path, argv: calls.append(
        (stage, params_path, argv)) or 7)
    result = runner.invoke(app, ["run", "distill", "--params", "other.yaml", "--verbose"])
    assert result.exit_code == 7
    assert calls == [("distill", Path("other.yaml"), ["--verbose"])]


def test_repro_and_results_pass_their_arguments_on(runner: CliRunner, monkeypatch) -> None:
    import flows.cli
    import flows.results

    calls = []
    monkeypatch.setattr(flows.cli.subprocess, "call", lambda cmd: calls.append(cmd) or 3)
    result = runner.invoke(app, ["repro", "distill", "--force", "-s"])
    assert result.exit_code == 3
    assert Path(calls[0][0]).name == "dvc" and calls[0][1:] == ["repro", "distill", "--force", "-s"]
    monkeypatch.setattr(flows.results, "main", lambda argv: calls.append(argv) or 0)
    assert runner.invoke(app, ["results", "--out", "page.html"]).exit_code == 0
    assert calls[1] == ["--out", "page.html"]


def test_doctor_passes_on_this_repository(runner: CliRunner, monkeypatch, mlflow_uri: str) -> None:
    monkeypatch.chdir(REPO)
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")]
    for what in ("python", "torch", "prefect", "mlflow", "dvc", "POT", "geomloss", "pandas", "SQLAlchemy",
                 "pydantic", "dvc command", "git command", "params", "data", "cuda"):
        assert any(line.split(":")[0].split(maxsplit=1)[1] == what for line in lines), what
    assert any(line.startswith("info  cuda:") for line in lines)


def test_doctor_fails_naming_the_broken_key(runner: CliRunner, monkeypatch, tmp_path: Path, mlflow_uri: str) -> None:
    monkeypatch.chdir(REPO)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    broken = copy.deepcopy(raw)
    broken["fed_distance"]["toy"]["iterations"] = "lots"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = runner.invoke(app, ["doctor", "--params", str(path)])
    assert result.exit_code == 1
    fails = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert fails == [f"FAIL  params: {path}: fed_distance.toy.iterations: Input should be a valid integer "
                     f"(got 'lots')"]
    assert ("info  params: stages whose groups are valid: barycenter_valuation, distill, estimate_bias, "
            "noisy_removal, partition, train_teachers") in result.output


def test_doctor_fails_on_missing_data_and_a_version_off_the_lock(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"partition": {"data_dir": "raw", "federations": {
        "b": {"scheme": "by_dataset", "datasets": ["mnist", "usps"]}}}}))
    checks, view = doctor.params(Path("params.yaml"))
    assert [c.status for c in checks] == ["ok"]
    assert doctor.raw_data(view) == doctor.Check("FAIL", "data", "missing raw/images_mnist.npz, raw/images_usps.npz "
                                                                 "(the embedded data: data/README.md)")
    (tmp_path / "requirements.lock").write_text("pandas==0.0.1  # a comment\ntorch==2.13.0\nPyYAML==6.0.3\n")
    pins = doctor.locked_versions(Path("requirements.lock"))
    assert pins == {"pandas": "0.0.1", "torch": "2.13.0", "pyyaml": "6.0.3"}
    assert doctor.package("pandas", "pandas", pins).status == "FAIL"
    assert "requirements.lock pins 0.0.1" in doctor.package("pandas", "pandas", pins).detail
    assert doctor.package("geomloss", "geomloss", pins).detail.endswith("(not pinned in requirements.lock)")
    assert doctor.package("no-such-dist", "no_such_dist", pins).detail.startswith("not installed")


@pytest.mark.parametrize("installed, pin, ok", [
    ("2.13.0+cpu", "2.13.0", True), ("2.13.0", "2.13.0", True), ("2.13.1", "2.13.0", False),
    ("2.13.0", "2.13.0+cu121", False), ("0.9.7.post1", "0.9.7.post1", True),
])
def test_lock_pins_compare_as_pip_does(monkeypatch, installed: str, pin: str, ok: bool) -> None:
    monkeypatch.setattr(doctor.importlib.metadata, "version", lambda _: installed)
    assert (doctor.package("pandas", "pandas", {"pandas": pin}).status == "ok") is ok


def test_python_version_and_mlflow_store(monkeypatch, tmp_path: Path) -> None:
    assert doctor.python_version((3, 10, 4)) == doctor.Check("FAIL", "python", "3.10.4 (needs ≥ 3.11)")
    assert doctor.python_version((3, 12, 0)).status == "ok"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'store' / 'mlruns.db'}")
    assert doctor.mlflow_store().status == "ok"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the store's folder should be")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{blocked / 'mlruns.db'}")
    assert doctor.mlflow_store().status == "FAIL"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert doctor.mlflow_store().status == "info"
