"""Portable CPU kernels: the same params give the same bytes on any x86-64 CPU, not only on the same machine.

Numerical libraries pick their kernels by the CPU they find, and kernels of different vector widths add floats
in a different order, so the last bits of a result depend on the machine:

* torch's own kernels (ATen) run AVX-512 code where the CPU has it and AVX2 code elsewhere;
* MKL, torch's BLAS on x86, picks a code branch for its matrix products by CPU vendor and instruction set;
* oneDNN (``torch.backends.mkldnn``), which runs some of torch's layers, by instruction set and cache sizes;
* OpenBLAS, numpy's and scipy's BLAS, by core type (SkylakeX on an AVX-512 Xeon, Zen on an AMD EPYC, …).

Training amplifies those bits: the BERT-tiny teacher ``sa/musical_instruments`` (10 epochs) came out of the
same code and seed with validation macro-F1 0.2162 on an Intel Xeon with AVX-512 and 0.2125 on an AMD EPYC
with AVX2 — and ``ATEN_CPU_CAPABILITY=avx2`` alone reproduces the EPYC's number on the Xeon. Its weights, and
so DVC's hash of ``models/``, differed, and DVC re-ran every later stage.

:func:`use_portable_kernels` holds each library to one code path that every x86-64 CPU with AVX2 runs alike:

==========  ============================================  ==================================================
library     setting                                       effect
==========  ============================================  ==================================================
ATen        ``ATEN_CPU_CAPABILITY=avx2``                  AVX2 kernels even where AVX-512 is present (ATen
                                                          itself falls back where AVX2 is missing)
MKL         ``MKL_CBWR=COMPATIBLE``                       MKL's conditional numerical reproducibility, on
                                                          the branch it documents as giving the same results
                                                          on Intel and compatible (AMD) CPUs; its vendor-
                                                          and ISA-specific branches do not
oneDNN      ``torch.backends.mkldnn.enabled = False``     ATen's kernels instead (:func:`hold_torch_kernels`)
OpenBLAS    ``OPENBLAS_CORETYPE=Haswell``                 one core type's AVX2 kernels and block sizes; only
                                                          where the CPU has AVX2 and FMA (a kernel the CPU
                                                          lacks would crash it)
==========  ============================================  ==================================================

The fourth condition, one thread per reduction, is the stages' own: torch runs one intra-op thread per task
(:func:`otfed.device.stage_device`) and BLAS one thread (``flows.runners``).

The environment variables are read when a library loads (OpenBLAS) or makes its first call (ATen, MKL), so
they must be set before numpy or torch is imported: the pipeline's entry packages (``stages``, ``flows``)
call :func:`use_portable_kernels` first thing, and a process they start (a stage run by DVC, a local Dask
cluster's worker) inherits the environment. A process that imported numpy first (a ``dask worker`` started
by hand: ``distributed`` imports it) keeps OpenBLAS's own kernels; start it after
``eval "$(python -m otfed.cpu_kernels)"``. The cost: on
the 2-core development machine the BERT-tiny teacher took about 2× as long (MKL's compatible branch), the
bag-of-words models and the feature track the same. ``OTFED_CPU_KERNELS=native`` leaves every library its
own choice (faster where AVX-512 pays, and the bytes then depend on the CPU). Not covered: other
architectures (ARM runs other kernels altogether) and GPUs.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path

#: ``OTFED_CPU_KERNELS``: ``portable`` (set by :func:`use_portable_kernels` once it holds the kernels) or
#: ``native`` (the user's choice: leave every library its own).
SWITCH = "OTFED_CPU_KERNELS"
OPENBLAS_CORE = "Haswell"
_X86 = {"x86_64", "amd64"}
_MKL_CBWR_BRANCH, _MKL_CBWR_COMPATIBLE = 1, 3  # mkl_cbwr_get's query and the COMPATIBLE branch (mkl_cbwr.h)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (Linux's ``/proc/cpuinfo``; empty where it is absent)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def portable_environ(machine: str | None = None, flags: frozenset[str] | None = None) -> dict[str, str]:
    """The environment that holds ATen, MKL and OpenBLAS to their portable kernels on a CPU of architecture
    ``machine`` (``platform.machine()``) with instruction-set ``flags`` (:func:`cpu_flags`); empty off x86-64."""
    machine = (platform.machine() if machine is None else machine).lower()
    if machine not in _X86:
        return {}
    flags = cpu_flags() if flags is None else flags
    environ = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}
    if {"avx2", "fma"} <= flags:
        environ["OPENBLAS_CORETYPE"] = OPENBLAS_CORE
    return environ


def use_portable_kernels() -> bool:
    """Set :func:`portable_environ` in ``os.environ`` (and so in every process started from here) for each
    library not loaded yet, and mark the process ``OTFED_CPU_KERNELS=portable``; True when every library is
    held. A library already loaded keeps its kernels — torch's (ATen, MKL) once torch is imported, OpenBLAS's
    once numpy is (e.g. by ``distributed`` in a ``dask worker``): :func:`portability_gaps` names it. Does
    nothing with ``OTFED_CPU_KERNELS=native``. Call it before anything imports numpy or torch."""
    if os.environ.get(SWITCH) == "native":
        return False
    late = {"ATEN_CPU_CAPABILITY": "torch", "MKL_CBWR": "torch", "OPENBLAS_CORETYPE": "numpy"}
    held = True
    for key, value in portable_environ().items():
        if late[key] in sys.modules and os.environ.get(key) != value:
            held = False
        else:
            os.environ[key] = value
    os.environ[SWITCH] = "portable"
    return held


def hold_torch_kernels() -> None:
    """Where the environment says ``OTFED_CPU_KERNELS=portable``, turn oneDNN off in this process's torch (a
    flag, not an environment variable); a no-op otherwise, and before torch is imported."""
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get(SWITCH) == "portable" and torch.backends.mkldnn.enabled:
        torch.backends.mkldnn.enabled = False


def kernels_in_use() -> dict[str, str]:
    """What the loaded libraries run now: torch's ATen capability, whether oneDNN is on, MKL's reproducibility
    branch, OpenBLAS's core types — for the run's records. A library not loaded is left out; MKL's branch
    is ``unknown`` where torch's library does not expose MKL's query."""
    found: dict[str, str] = {"switch": os.environ.get(SWITCH, "unset")}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["aten"] = torch.backends.cpu.get_cpu_capability()
        found["onednn"] = "on" if torch.backends.mkldnn.enabled else "off"
        found["mkl_cbwr"] = _mkl_branch(torch)
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_info

        cores = sorted({str(lib.get("architecture")) for lib in threadpool_info()
                        if lib.get("internal_api") == "openblas"})
        if cores:
            found["openblas"] = ",".join(cores)
    return found


def _mkl_branch(torch) -> str:
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        query = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return "unknown"
    query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int]
    branch = query(_MKL_CBWR_BRANCH)
    return "COMPATIBLE" if branch == _MKL_CBWR_COMPATIBLE else f"branch {branch}"


def portability_gaps(found: dict[str, str], environ: dict[str, str] | None = None) -> list[str]:
    """The libraries in ``found`` (:func:`kernels_in_use`) that do not run the kernels ``environ``
    (:func:`portable_environ`) asks for — e.g. numpy imported before :func:`use_portable_kernels` ran."""
    environ = portable_environ() if environ is None else environ
    gaps = []
    if "aten" in found and environ.get("ATEN_CPU_CAPABILITY", "").upper() not in {"", found["aten"]}:
        gaps.append(f"torch runs {found['aten']} kernels, not {environ['ATEN_CPU_CAPABILITY'].upper()}")
    if found.get("onednn") == "on" and environ:
        gaps.append("torch's oneDNN is on")
    if found.get("mkl_cbwr", "COMPATIBLE") not in {"COMPATIBLE", "unknown"} and "MKL_CBWR" in environ:
        gaps.append(f"MKL runs {found['mkl_cbwr']}, not COMPATIBLE")
    if "openblas" in found and "OPENBLAS_CORETYPE" in environ and found["openblas"] != environ["OPENBLAS_CORETYPE"]:
        gaps.append(f"OpenBLAS runs {found['openblas']} kernels, not {environ['OPENBLAS_CORETYPE']}")
    return gaps


if __name__ == "__main__":  # `python -m otfed.cpu_kernels`: the exports for a process otfed does not start
    # (e.g. `eval "$(python -m otfed.cpu_kernels)"` before `dask worker …` on another machine)
    for key, value in {**portable_environ(), SWITCH: "portable"}.items():
        print(f"export {key}={value}")
