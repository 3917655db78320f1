"""dvc.yaml stays consistent with params.yaml: every federation a stage reads is among its deps.

(Code deps, outs and params of every stage: tests/architecture/test_architecture.py.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
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


# the trained text track: teachers and global models, their transfer-set messages, their probability biases
SHIPPED = {"train_teachers": ("models/text", "data/text_messages"), "estimate_bias": ("data/text_bias",)}


def _git(*args: str) -> str:
    import subprocess

    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout


def test_every_output_but_partitions_data_is_committed() -> None:
    """Training amplifies the last bit in which two CPUs' kernels differ, so the trained text track ships with the
    repository (git, ``cache: false``) like the reports: a fresh clone reruns only partition, whose outputs are the
    same bytes on every x86-64 CPU, and finds every later stage up to date. Only partition's data is regenerated."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    regenerated = {layout.PARTITIONS, layout.TEXT_PARTITIONS}
    for name, stage in stages.items():
        for out in stage["outs"]:
            path, options = next(iter(out.items()))
            if path in regenerated:
                assert options.get("cache", True), f"dvc.yaml {name}: {path} is regenerated, keep it in DVC's cache"
                continue
            assert options.get("cache") is False, f"dvc.yaml {name}: {path} must be committed (cache: false)"
            if (REPO / ".git").exists():
                assert not _git("check-ignore", path).strip(), f".gitignore ignores {path}, a committed output"
    assert {p for outs in SHIPPED.values() for p in outs} <= {next(iter(o)) for s in stages.values() for o in s["outs"]}


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs the git checkout")
def test_the_shipped_text_track_is_committed_and_up_to_date() -> None:
    """Every shipped folder has its files in git, and DVC finds them exactly as ``dvc.lock`` records them: on a
    fresh clone ``make pipeline`` trains nothing (``dvc status`` reports no changed output of those stages)."""
    import json
    import shutil
    import subprocess

    for outs in SHIPPED.values():
        for path in outs:
            assert _git("ls-files", path).strip(), f"{path} is not committed"
    dvc = shutil.which("dvc") or str(Path(sys.executable).parent / "dvc")
    status = subprocess.run([dvc, "status", "--json", *SHIPPED], cwd=REPO, capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    changed = {name: [c["changed outs"] for c in changes if isinstance(c, dict) and "changed outs" in c]
               for name, changes in json.loads(status.stdout or "{}").items() if name in SHIPPED}
    assert not any(changed.values()), f"committed text-track outputs differ from dvc.lock: {changed}"
