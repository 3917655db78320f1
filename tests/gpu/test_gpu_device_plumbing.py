"""Runs everywhere, CPU CI included (no ``gpu`` mark): every torch stage resolves ``run.device`` once and hands
the result to each job that runs torch code, and each such job hands it on to the library — checked with a GPU
pretended (``torch.cuda.is_available`` patched to True, ``run.device: auto``), so a GPU run cannot silently stay
on the CPU. Nothing is put on the pretended GPU: the jobs' library entry points are replaced by spies that record
the device they are given and stop the job there."""
from __future__ import annotations

import importlib
import inspect
import shutil
from pathlib import Path

import pytest
import torch

from flows.stage import run_stage
from otfed.models import TextClassifier
from stages.params import validate_params
from tests.stages.test_text_stages import text_params
from tests.stages.test_valuation_stages import valuation_params

pytestmark = pytest.mark.slow  # the partition stage runs first, on both tracks' tiny params

#: stage → the jobs that run torch code (each takes ``device``)
TORCH_JOBS = {
    "train_teachers": {"train_party"},
    "estimate_bias": {"party_bias"},
    "distill": {"global_reference", "distill_variant"},
    "barycenter_valuation": {"client_contributions"},
    "noisy_removal": {"removal_experiment"},
}


class Stop(Exception):
    """Raised by a spy once it has recorded what the job handed to the library."""


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory, migrated_mlflow_db: Path):
    """Both tracks' tiny partitions in one folder (the stages' jobs read them), and the params of both."""
    root = tmp_path_factory.mktemp("plumbing")
    shutil.copy(migrated_mlflow_db, root / "mlruns.db")
    params = valuation_params(root)
    text = text_params(root)
    params["partition"]["text"] = text["partition"]["text"]
    params.update({k: text[k] for k in ("train_teachers", "estimate_bias", "distill")})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlruns.db'}")
        mp.chdir(root)
        run_stage("partition", validate_params(params, stage="partition"))
    return root, params


def _jobs(stage: str, root: Path, params: dict, device: str, monkeypatch: pytest.MonkeyPatch):
    """The stage's jobs for ``run.device: device``, built in ``root``. ``distill`` reads the teachers' message
    files, which come from ``train_teachers`` (not run here): an empty message list, not checked, and a
    stand-in ensemble."""
    module = importlib.import_module(f"stages.{stage}")
    monkeypatch.chdir(root)
    if stage == "distill":
        monkeypatch.setattr(module, "load_messages", lambda path: [])
        monkeypatch.setattr(module, "check_messages", lambda *args, **kwargs: None)  # (tests/stages/test_preflight.py)
        import numpy as np

        from otfed.data.text import load_text_federation
        from otfed.distill.ensemble import TeacherEnsemble

        fed = load_text_federation(root / "data" / "text_partitions" / "sa")
        n, k, c = len(fed.transfer_texts), len(fed.parties), len(fed.label_names)
        stand_in = TeacherEnsemble(tuple(q.name for q in fed.parties), np.full((n, k, c), 1.0 / c),
                                   np.full(k, 10), np.full((k, c), 1.0 / c))  # uniform teachers, as if from messages
        monkeypatch.setattr(module, "server_ensemble", lambda *args, **kwargs: stand_in)
    p = validate_params({**params, "run": {**params["run"], "device": device}}, stage=stage)
    return module, module.STAGE.jobs(p, {folder: root / "staged" / stage / folder for folder in module.OUTPUTS})


@pytest.mark.parametrize("stage", TORCH_JOBS)
@pytest.mark.parametrize("device, gpu, resolved", [("auto", True, "cuda"), ("auto", False, "cpu"),
                                                   ("cuda:1", False, "cuda:1"), ("cpu", True, "cpu")])
def test_torch_jobs_carry_the_resolved_run_device(stage: str, device: str, gpu: bool, resolved: str, partitioned,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, params = partitioned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    torch.set_num_threads(2)  # (the autouse fixture restores the caller's setting)
    _, jobs = _jobs(stage, root, params, device, monkeypatch)
    with_device = [job for job in jobs if "device" in inspect.signature(job.fn).parameters]
    assert {job.fn.__name__ for job in with_device} == TORCH_JOBS[stage]
    assert [job.kwargs["device"] for job in with_device] == [resolved] * len(with_device)
    # one torch thread per task on CPU (pinned for the stage); on a GPU the thread setting is left alone
    assert torch.get_num_threads() == (1 if resolved == "cpu" else 2)


@pytest.mark.parametrize("stage", TORCH_JOBS)
def test_torch_jobs_hand_the_device_to_the_library(stage: str, partitioned, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each torch job, run with a pretended GPU, gives ``cuda`` to the library call that builds or loads its model
    (text track) or runs FedAvg (feature track) — and, for FedAvg, leaves the CPU thread setting alone."""
    root, params = partitioned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    module, jobs = _jobs(stage, root, params, "auto", monkeypatch)
    seen: list[dict] = []

    def record(**kwargs):
        seen.append(kwargs)
        raise Stop

    if stage == "train_teachers":
        monkeypatch.setattr(module, "build_classifier", lambda spec, labels, texts, seed, device: record(device=device))
    elif stage in ("estimate_bias", "distill"):
        monkeypatch.setattr(TextClassifier, "load", classmethod(lambda cls, directory, device=None:
                                                                record(device=device)))
    else:
        import otfed.valuation.client_games as games  # barycenter_valuation's game: fedavg_utility(device)

        # barycenter_valuation's utility calls fedavg_accuracy; noisy_removal trains each kept set once
        where, name = (games, "fedavg_accuracy") if stage == "barycenter_valuation" else (module, "fedavg_state")
        monkeypatch.setattr(where, name, lambda *args, device="cpu", num_threads=1, **kwargs:
                            record(device=device, num_threads=num_threads))
    torch_jobs = [job for job in jobs if job.fn.__name__ in TORCH_JOBS[stage]]
    assert torch_jobs
    for job in torch_jobs:
        with pytest.raises(Stop):
            job()
    assert [s["device"] for s in seen] == ["cuda"] * len(torch_jobs)
    if stage in ("barycenter_valuation", "noisy_removal"):
        assert all(s["num_threads"] is None for s in seen)
