"""The Python packages otfed needs on a CUDA node with no package index, packed to travel with the checkout.

The CUDA nodes the project's GPU runs target (``gpu/gpu_session.sh``; ``gpu/device_packages.txt`` lists what they
have) bring PyTorch, transformers, pandas and scikit-learn, but not POT, geomloss, Prefect, MLflow, pydantic or Dask,
and reach no package index. This script builds, ahead of a run, the kit that supplies what they lack, sized so that a
copy of the checkout plus one archive stays under :data:`TRAVEL_LIMIT`:

1. **What to carry.** The closure of the project's declared dependencies (``pyproject.toml``: the core and the
   ``pipeline`` and ``bench`` extras, dp-accounting included; DVC apart,
   in a second archive with ``--with-dvc``), read from this environment's installed metadata (the lock's versions),
   with the environment markers evaluated for the machine's Python (3.12, ``--python``), minus what the
   machine already has (:data:`FROM_THE_MACHINE`: its torch / numpy / pyarrow stack, which ours could
   break, and the rest of its packages; what we carry pins them only loosely). What is carried is
   installed at the lock's version.
2. **Wheels** for that Python and manylinux x86-64 (a pure-Python sdist is built into a wheel here),
   installed into a staging folder with ``pip install --target`` for that platform.
3. **Slimmed**, leaving every code path otfed runs intact: MLflow's and Prefect's web UIs (JavaScript;
   runs are logged and read without them, with ``PREFECT_UI_ENABLED=false``) are dropped, and POT's
   bijection-sliced OT (``ot/bsp``, a 174 MB compiled extension otfed never calls, checked in
   :func:`check_unused_bsp`) is replaced by functions that raise. Console scripts get a
   ``#!/usr/bin/env python3`` line.
4. **Packed** as ``.devkit/site.tar.xz`` (and ``.devkit/dvc.tar.xz``: DVC, for the Prefect pipeline flow,
   which runs ``dvc repro``; unpacked over the first, for the worker phase) with ``MANIFEST.txt`` (packages,
   versions, what was slimmed, what the machine provides), and the size checked: the checkout's files that a
   copy takes (tracked and untracked-not-ignored) plus one archive must stay under 64 MiB.

On the node, ``gpu/gpu_session.sh`` unpacks it into ``/tmp/otfed-site`` and puts it first on ``PYTHONPATH``;
``.devkit/site.tar.xz`` goes with the checkout for every phase, ``.devkit/dvc.tar.xz`` for the worker phase only
(the two together pass :data:`TRAVEL_LIMIT`). ``docs/scaling.md`` ("A GPU node with no package index") has the
phases.

Usage: ``python -m gpu.device_kit [--python 3.12] [--with-dvc] [--out .devkit]``; ``--python 3.11``
builds a kit for this machine's Python, which ``tests``-style checks can unpack into a clean venv
(``--verify VENV``: unpack into a temporary folder and import the pipeline with that venv's python).
"""
from __future__ import annotations

import argparse
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


TRAVEL_LIMIT = 64 * 2**20  # the size budget of the checkout copied to a GPU node with one archive of the kit
MARGIN = 2**20             # room for a report written into the tree between the build and a call

#: The packages already on the CUDA hosts (``gpu/device_packages.txt``, from their image's package list).
DEVICE_PACKAGES = frozenset(normalize(line.strip()) for line in
                            (ROOT / "gpu" / "device_packages.txt").read_text().splitlines()
                            if line.strip() and not line.lstrip().startswith("#"))
#: Carried even though the machines have them: pydantic 2.14 and anyio 4.16 need typing-extensions ≥ 4.16,
#: and the machines' version is not known (a newer typing-extensions serves torch as well).
CARRIED_ANYWAY = frozenset({"typing-extensions"})
#: Taken from the machine, never carried: its numeric / GPU stack (our torch, numpy or pyarrow could break its
#: CUDA build) and every other package it has (loosely pinned by what we carry; see MANIFEST.txt).
FROM_THE_MACHINE = DEVICE_PACKAGES - CARRIED_ANYWAY

#: Dropped from the kit: (path inside the site folder, why). Nothing otfed runs touches them.
DROPPED = (
    ("mlflow/server/js", "MLflow's web UI (JavaScript); runs are logged and read back without it"),
    ("prefect/server/ui", "Prefect's web UI; gpu_session.sh runs with PREFECT_UI_ENABLED=false"),
    ("prefect/server/ui-v2", "Prefect's new web UI; likewise"),
)
BSP_STUB = '''"""Stub put in place by otfed's gpu/device_kit.py: POT's BSP-OT solver (a 174 MB compiled extension)
is not carried to the GPU machine; otfed never calls it."""


def compute_bspot_bijection(*args, **kwargs):
    raise NotImplementedError("POT's BSP-OT was left out of otfed's device kit (gpu/device_kit.py)")


def merge_bijections(*args, **kwargs):
    raise NotImplementedError("POT's BSP-OT was left out of otfed's device kit (gpu/device_kit.py)")
'''
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def declared_dependencies(pyproject: Path = ROOT / "pyproject.toml", extras: tuple[str, ...] = ("pipeline", "bench")
                          ) -> list[str]:
    """The names in ``[project] dependencies`` (the core install) and in the optional dependencies of ``extras``
    (default: what the stages, the benches and the studies need), following ``otfed[...]`` references between
    extras; each name once, in order."""
    import tomllib

    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    names: list[str] = []
    seen: set[str] = set()

    def add(requirements: list[str]) -> None:
        for line in requirements:
            requirement = Requirement(line)
            if normalize(requirement.name) == normalize(project["name"]):  # otfed[text,valuation]: those extras
                for extra in sorted(requirement.extras - seen):
                    seen.add(extra)
                    add(optional[extra])
            elif requirement.name not in names:
                names.append(requirement.name)

    add(project["dependencies"])
    for extra in extras:
        if extra not in seen:
            seen.add(extra)
            add(optional[extra])
    return names


def marker_environment(python: str) -> dict[str, str]:
    """Environment-marker values of CPython ``python`` (e.g. "3.12": the machine's 3.12.3) on x86-64 Linux."""
    full = {"3.12": "3.12.3"}.get(python, platform.python_version() if platform.python_version().startswith(
        python + ".") else f"{python}.0")
    return {"python_version": python, "python_full_version": full, "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def closure(roots: list[str], python: str, exclude: frozenset[str] = FROM_THE_MACHINE,
            distribution=metadata.distribution) -> dict[str, str]:
    """{normalized name: installed version} of ``roots`` and everything they require (extras not taken,
    markers evaluated for ``python``), not descending into ``exclude``d packages. ``distribution`` looks a
    name up (``importlib.metadata.distribution``; a stand-in in tests)."""
    env = marker_environment(python)
    found: dict[str, str] = {}
    stack = list(roots)
    while stack:
        name = normalize(stack.pop())
        if name in found or name in exclude:
            continue
        dist = distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(env):
                stack.append(req.name)
    return dict(sorted(found.items()))


def check_unused_bsp(root: Path = ROOT) -> None:
    """Raise if otfed's code (library, pipeline, benches, studies, GPU tooling, tests) mentions POT's BSP-OT,
    which the kit stubs."""
    pattern = re.compile(r"\bot\.bsp\b|compute_bspot_bijection|merge_bijections")
    for folder in ("otfed", "stages", "flows", "bench", "studies", "gpu", "tests"):
        for path in (root / folder).rglob("*.py"):
            if path.name in ("device_kit.py", "test_gpu_device_kit.py"):  # the kit and its test name it
                continue
            if pattern.search(path.read_text()):
                raise RuntimeError(f"{path.relative_to(root)} uses POT's BSP-OT, which the device kit stubs out")


def travelling_bytes(root: Path = ROOT) -> int:
    """Bytes of the files that travel to the machine on every call: tracked and untracked-not-ignored."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def _platform_args() -> list[str]:
    return [arg for tag in PLATFORMS for arg in ("--platform", tag)]


def download(pins: dict[str, str], python: str, wheels: Path) -> None:
    """A wheel per pin for CPython ``python`` on manylinux x86-64; a pure-Python sdist is built here."""
    for name, version in pins.items():
        try:
            _pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", python,
                 "--implementation", "cp", *_platform_args(), "-d", str(wheels), f"{name}=={version}")
        except subprocess.CalledProcessError:
            print(f"  no wheel for {name}=={version}: building one from its sdist")
            _pip("wheel", "-q", "--no-deps", "-w", str(wheels), f"{name}=={version}")


def install(wheels: Path, python: str, site: Path) -> None:
    """The wheels installed into ``site`` as pip would on the machine (its Python and platform)."""
    _pip("install", "-q", "--no-deps", "--no-index", "--no-compile", "--target", str(site), "--python-version",
         python, "--implementation", "cp", *_platform_args(), "--only-binary=:all:",
         *map(str, sorted(wheels.iterdir())))


def slim(site: Path) -> list[str]:
    """Drop :data:`DROPPED`, stub POT's BSP-OT, fix console scripts, remove caches; returns what was done."""
    done = []
    for rel, why in DROPPED:
        if (site / rel).exists():
            shutil.rmtree(site / rel)
            done.append(f"dropped {rel}: {why}")
    bsp = site / "ot" / "bsp"
    if bsp.exists():
        check_unused_bsp()
        for compiled in bsp.glob("bsp_wrap*"):
            compiled.unlink()
        (bsp / "bsp_ot.py").write_text(BSP_STUB)
        done.append("stubbed ot/bsp (POT's BSP-OT, a 174 MB extension otfed never calls; the stub raises)")
    for script in (site / "bin").glob("*") if (site / "bin").exists() else ():
        text = script.read_bytes()
        if text.startswith(b"#!"):
            script.write_bytes(b"#!/usr/bin/env python3\n" + text.split(b"\n", 1)[1])
    for cache in site.rglob("__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)
    return done


def pack(site: Path, out: Path, name: str = "site.tar.xz") -> Path:
    """``site``'s content as ``out/name`` (xz -9, on every core)."""
    archive = out / name
    tmp = archive.with_suffix(".tmp")
    with tmp.open("wb") as sink:
        tar = subprocess.Popen(["tar", "-C", str(site), "--sort=name", "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=sink, check=True)
        if tar.wait():
            raise RuntimeError(f"tar of {site} failed")
    tmp.replace(archive)
    return archive


def _archive(pins: dict[str, str], python: str, out: Path, name: str) -> tuple[Path, list[str]]:
    """``pins`` downloaded, installed for ``python``, slimmed and packed as ``out/name``; (archive, what was
    slimmed)."""
    with tempfile.TemporaryDirectory(prefix="otfed_devkit_") as tmp:
        wheels, site = Path(tmp) / "wheels", Path(tmp) / "site"
        wheels.mkdir()
        download(pins, python, wheels)
        install(wheels, python, site)
        slimmed = slim(site)
        return pack(site, out, name), slimmed


def build(python: str, out: Path, with_dvc: bool) -> list[Path]:
    """``out/site.tar.xz`` (all the stages, flows, benches and studies need) and, ``with_dvc``, ``out/dvc.tar.xz``
    (what DVC adds: the Prefect pipeline flow runs ``dvc repro``; it travels in a call of its own, unpacked
    over the first); ``out/MANIFEST.txt``. Raises SystemExit when an archive cannot travel with the tree."""
    roots = [r for r in declared_dependencies() if normalize(r) != "dvc"]
    pins = closure(roots, python)
    parts = [("site.tar.xz", pins)]
    if with_dvc:
        everything = closure(roots + ["dvc"], python)
        parts.append(("dvc.tar.xz", {name: v for name, v in everything.items() if name not in pins}))
    carried = {name for _, part in parts for name in part}
    machine = {name: v for name, v in closure(roots + ["dvc"] * with_dvc, python, exclude=frozenset()).items()
               if name not in carried}
    out.mkdir(parents=True, exist_ok=True)
    tree = travelling_bytes()
    manifest = [f"otfed device kit for CPython {python} on x86-64 Linux (python -m gpu.device_kit --python {python}"
                f"{' --with-dvc' if with_dvc else ''}); the tree that travels with it: {tree / 2**20:.1f} MiB",
                "taken from the machine (the lock's versions shown; the machine's may differ): "
                + ", ".join(f"{name}=={version}" for name, version in machine.items())]
    archives, too_big = [], []
    for name, part in parts:
        print(f"{name}: {len(part)} packages for CPython {python}")
        archive, slimmed = _archive(part, python, out, name)
        size = archive.stat().st_size
        manifest += ["", f"{name}: {size / 2**20:.1f} MiB; with the tree {(size + tree) / 2**20:.1f} MiB of the "
                         f"{TRAVEL_LIMIT // 2**20} MiB budget", *slimmed, *(f"{n}=={v}" for n, v in part.items())]
        print(f"{name}: {size / 2**20:.1f} MiB; with the tree ({tree / 2**20:.1f} MiB) {(size + tree) / 2**20:.1f} MiB")
        archives.append(archive)
        if size + tree > TRAVEL_LIMIT - MARGIN:
            too_big.append(f"{name} ({size / 2**20:.1f} MiB)")
    (out / "MANIFEST.txt").write_text("\n".join(manifest) + "\n")
    if too_big:
        raise SystemExit(f"{', '.join(too_big)} and the tree ({tree / 2**20:.1f} MiB) exceed what may travel "
                         f"({(TRAVEL_LIMIT - MARGIN) / 2**20:.0f} MiB with a margin): slim more")
    return archives


def verify(archives: list[Path], python: Path) -> None:
    """Unpack ``archives`` into a temporary folder and import the pipeline's stages and flows (and DVC, where
    carried) with ``python`` (a venv holding only the machine's kind of packages), the kit first on its path."""
    with tempfile.TemporaryDirectory(prefix="otfed_devkit_verify_") as tmp:
        for archive in archives:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        code = ("import importlib; mods = ['ot', 'geomloss', 'prefect', 'mlflow', 'pydantic', 'prefect_dask', "
                "'otfed', 'flows.stage', 'stages.partition', 'stages.train_teachers', 'stages.estimate_bias', "
                "'stages.distill', 'stages.fed_distance', 'stages.barycenter_valuation', 'stages.noisy_removal'"
                + (", 'dvc.repo', 'flows.pipeline'" if len(archives) > 1 else "") + "]; "
                "[importlib.import_module(m) for m in mods]; print('imported:', ', '.join(mods))")
        env = {"PYTHONPATH": f"{tmp}:{ROOT}", "PATH": f"{tmp}/bin:/usr/bin:/bin", "HOME": tmp,
               "PREFECT_UI_ENABLED": "false"}
        subprocess.run([str(python), "-c", code], check=True, cwd=ROOT, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default="3.12", help="the GPU node's CPython (default 3.12: CPython 3.12.3)")
    parser.add_argument("--with-dvc", action="store_true",
                        help="also out/dvc.tar.xz, DVC for the pipeline flow (gpu_session.sh worker-start)")
    parser.add_argument("--out", type=Path, default=ROOT / ".devkit")
    parser.add_argument("--verify", type=Path, default=None, metavar="PYTHON",
                        help="after building, import the pipeline with this interpreter and the kit")
    args = parser.parse_args(argv)
    archives = build(args.python, args.out, args.with_dvc)
    if args.verify:
        verify(archives, args.verify)
    return 0


if __name__ == "__main__":
    sys.exit(main())
