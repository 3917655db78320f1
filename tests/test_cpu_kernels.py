"""The portable CPU kernels (otfed.cpu_kernels): what each machine is asked to run, that a fresh process is held
to it before numpy and torch load (and a process that loaded them first is left alone, not half held), and
that the gaps a stage reports are the real ones. Whether held kernels give the same bytes whatever else the
CPU offers is tests/stages/test_portable_bytes.py's question."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otfed.cpu_kernels import cpu_flags, portability_gaps, portable_environ

REPO = Path(__file__).resolve().parent.parent
HAS_AVX2 = {"avx2", "fma"} <= cpu_flags()
X86 = bool(portable_environ())


def _fresh_python(code: str, **environ: str) -> dict:
    """Run ``code`` in a new interpreter (no OTFED_CPU_KERNELS unless given); its last stdout line, as JSON."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"OTFED_CPU_KERNELS", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "OPENBLAS_CORETYPE"}}
    env.update(environ)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma\nbugs\t\t: x\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_each_machine_is_asked_for_kernels_it_can_run() -> None:
    full = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "OPENBLAS_CORETYPE": "Haswell"}
    assert portable_environ("x86_64", frozenset({"sse2", "avx2", "fma", "avx512f"})) == full
    assert portable_environ("AMD64", frozenset({"avx2", "fma"})) == full
    # no AVX2 or no FMA: OpenBLAS's Haswell kernels would crash it; ATen falls back by itself; MKL's branch is SSE2
    assert portable_environ("x86_64", frozenset({"sse2", "avx"})) == {k: full[k] for k in ("ATEN_CPU_CAPABILITY",
                                                                                            "MKL_CBWR")}
    assert portable_environ("aarch64", frozenset({"asimd"})) == {}


@pytest.mark.skipif(not X86, reason="portable kernels are defined for x86-64 only")
@pytest.mark.slow  # fresh interpreters importing numpy and torch
def test_a_fresh_process_is_held_to_the_portable_kernels() -> None:
    found = _fresh_python(
        "import json, otfed.cpu_kernels as k; held = k.use_portable_kernels()\n"
        "import numpy, torch; torch.ones(3).sum(); torch.ones(2, 2) @ torch.ones(2, 2); k.hold_torch_kernels()\n"
        "found = k.kernels_in_use()\n"
        "print(json.dumps({'held': held, 'found': found, 'gaps': k.portability_gaps(found)}))")
    assert found["held"] and found["gaps"] == []
    kernels = found["found"]
    assert kernels["switch"] == "portable" and kernels["onednn"] == "off"
    assert kernels["mkl_cbwr"] in {"COMPATIBLE", "unknown"}
    if HAS_AVX2:
        assert kernels["aten"] == "AVX2" and kernels["openblas"] == "Haswell"


@pytest.mark.skipif(not HAS_AVX2, reason="OpenBLAS is held only on a CPU with AVX2 and FMA")
@pytest.mark.slow  # fresh interpreters importing numpy and torch
def test_a_process_that_loaded_numpy_first_holds_torch_and_names_openblas_as_the_gap() -> None:
    """What a `dask worker` started by hand is (``distributed`` imports numpy before any task arrives)."""
    found = _fresh_python(
        "import json, numpy, os, otfed.cpu_kernels as k; held = k.use_portable_kernels()\n"
        "import torch; torch.ones(3).sum(); k.hold_torch_kernels(); found = k.kernels_in_use()\n"
        "print(json.dumps({'held': held, 'openblas_env': os.environ.get('OPENBLAS_CORETYPE'), 'aten': found['aten'], "
        "'gaps': k.portability_gaps(found)}))")
    assert found["held"] is False and found["openblas_env"] is None and found["aten"] == "AVX2"
    assert len(found["gaps"]) == 1 and found["gaps"][0].startswith("OpenBLAS runs ")


def test_native_leaves_every_library_its_own_choice() -> None:
    found = _fresh_python("import json, os, otfed.cpu_kernels as k; held = k.use_portable_kernels()\n"
                          "print(json.dumps({'held': held, 'aten': os.environ.get('ATEN_CPU_CAPABILITY')}))",
                          OTFED_CPU_KERNELS="native")
    assert found == {"held": False, "aten": None}


@pytest.mark.slow  # fresh interpreters importing numpy and torch
def test_the_stage_packages_hold_the_kernels_before_their_modules_load() -> None:
    """What the runner `python -m flows.stage <name>`, the `otfed` command and a stage module import first (flows,
    stages): held before numpy and torch."""
    for package in ("stages.params", "flows.stage"):
        found = _fresh_python(f"import json, os, {package}; print(json.dumps(os.environ.get('OTFED_CPU_KERNELS')))")
        assert found == "portable"


def test_portability_gaps_name_each_library_off_its_kernels() -> None:
    environ = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "OPENBLAS_CORETYPE": "Haswell"}
    held = {"switch": "portable", "aten": "AVX2", "onednn": "off", "mkl_cbwr": "COMPATIBLE", "openblas": "Haswell"}
    assert portability_gaps(held, environ) == []
    loose = {"switch": "unset", "aten": "AVX512", "onednn": "on", "mkl_cbwr": "branch 1",
             "openblas": "SkylakeX"}
    assert portability_gaps(loose, environ) == [
        "torch runs AVX512 kernels, not AVX2", "torch's oneDNN is on", "MKL runs branch 1, not COMPATIBLE",
        "OpenBLAS runs SkylakeX kernels, not Haswell"]
    assert portability_gaps({"switch": "unset", "openblas": "SkylakeX"}, {}) == []  # off x86-64: nothing asked
