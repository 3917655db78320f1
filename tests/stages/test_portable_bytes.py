"""Same params, same bytes: under load, on either task runner, and whatever else the CPU offers.

A BERT-tiny teacher trained by the same code and seed came out with other weights on an AMD EPYC (AVX2) than on
an Intel Xeon (AVX-512), and DVC re-ran every stage after it. :mod:`otfed.cpu_kernels` holds the stages to
kernels every x86-64 CPU with AVX2 runs alike. Here ``train_teachers`` (tiny params, a BERT and a DistilBERT
party) runs as the user runs it, ``python -m flows.stage train_teachers``:

1. on the ``thread`` runner (two tasks at once) with both cores kept busy by two busy loops;
2. on the ``sequential`` runner, with MKL and oneDNN told that the CPU offers no more than AVX2
   (``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``: what an AVX2-only CPU looks like to them);

and its models, messages and reports must be the same bytes. A third run on the machine's own kernels with
MKL's AVX2 branch (``OTFED_CPU_KERNELS=native``) must differ from the first: the comparison can see a kernel.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from otfed.cpu_kernels import cpu_flags, portable_environ
from stages import layout
from tests.ceilings import completed
from tests.integration.support import REPO, clean_env
from tests.stages.conftest import output_files
from tests.stages.test_text_stages import text_params

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STAGE_S = 600  # ceiling (tests/ceilings.py) of one stage run; idle ~20 s, with both cores busy ~1 min
OUTPUTS = (layout.TEACHER_REPORTS, layout.TEXT_MODELS, layout.TEXT_MESSAGES)


def _stage(root: Path, name: str, runner: str, **environ: str) -> None:
    params = text_params(root)
    params["run"].update(task_runner=runner, max_workers=2)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = completed([sys.executable, "-m", "flows.stage", name], f"`python -m flows.stage {name}` to exit", STAGE_S,
                     cwd=root, env=clean_env(OTFED_HOME=str(root), PYTHONPATH=str(REPO), **environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not on the portable CPU kernels" not in done.stderr


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("partitioned")
    _stage(root, "partition", "sequential")
    return root


def _teachers(partitioned: Path, root: Path, runner: str, **environ: str) -> dict[str, bytes]:
    shutil.copytree(partitioned / layout.TEXT_PARTITIONS, root / layout.TEXT_PARTITIONS)
    _stage(root, "train_teachers", runner, **environ)
    return {f"{folder}/{name}": content for folder in OUTPUTS for name, content in output_files(root / folder).items()}


@pytest.fixture(scope="module")
def busy_threads(partitioned: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        return _teachers(partitioned, tmp_path_factory.mktemp("busy"), "thread")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.mark.skipif(not portable_environ(), reason="portable kernels are defined for x86-64 only")
def test_teachers_are_the_same_bytes_under_load_on_threads_and_on_an_avx2_only_view_of_the_cpu(
        partitioned: Path, busy_threads: dict[str, bytes], tmp_path: Path) -> None:
    other = _teachers(partitioned, tmp_path, "sequential", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    assert sorted(other) == sorted(busy_threads)
    assert any(name.endswith("model.safetensors") for name in other)  # the weights are among the bytes compared
    differ = [name for name in other if other[name] != busy_threads[name]]
    assert not differ, f"differ between the two runs: {differ}"


@pytest.mark.skipif(not {"avx2", "fma"} <= cpu_flags(), reason="the control needs MKL's AVX2 branch")
def test_the_comparison_sees_a_kernel_change(partitioned: Path, busy_threads: dict[str, bytes],
                                             tmp_path: Path) -> None:
    native = _teachers(partitioned, tmp_path, "sequential", OTFED_CPU_KERNELS="native", MKL_CBWR="AVX2")
    weights = [name for name in native if name.endswith("model.safetensors")]
    assert weights and all(native[name] != busy_threads[name] for name in weights)
