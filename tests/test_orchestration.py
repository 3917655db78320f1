"""Orchestration: task-runner choice, device resolution, in-process fan-out, the pipeline's DVC command."""
from __future__ import annotations

import pytest
from prefect import task
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner

from flows.pipeline import dvc_command
from otfed.orchestration import fan_out, resolve_device, stage_torch_device, task_runner


def test_task_runner_kinds() -> None:
    assert isinstance(task_runner("thread", 3), ThreadPoolTaskRunner)
    assert isinstance(task_runner("sequential", 3), ThreadPoolTaskRunner)
    assert isinstance(task_runner("process", 2), ProcessPoolTaskRunner)
    with pytest.raises(ValueError, match="thread, sequential, process"):
        task_runner("dask", 1)


def test_resolve_device() -> None:
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == "cuda:1"


def test_stage_torch_device_pins_one_cpu_thread() -> None:
    import torch

    torch.set_num_threads(2)
    assert stage_torch_device("cpu") == "cpu"
    assert torch.get_num_threads() == 1



def test_fan_out_outside_a_flow_runs_in_order_without_a_server() -> None:
    @task
    def square(x: int) -> int:
        return x * x

    assert fan_out(square, [dict(x=i) for i in range(5)]) == [0, 1, 4, 9, 16]


def test_pipeline_dvc_command() -> None:
    assert dvc_command() == ["dvc", "repro"]
    assert dvc_command(["fed_distance"], force=True) == ["dvc", "repro", "--force", "fed_distance"]
    assert dvc_command(set_params={"run.seed": "1"}) == ["dvc", "exp", "run", "-S", "run.seed=1"]
