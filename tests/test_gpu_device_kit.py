"""gpu/device_kit.py (what travels to a GPU node without a package index) and gpu/gpu_session.sh (what runs
there): the dependency closure against a hand-made package graph, the slimming against a fake site folder, and
the session script's refusals. The kit's build itself (downloads) is run by hand: `python -m gpu.device_kit
--python 3.11 --verify PYTHON` imports the whole pipeline from it in a venv with only a GPU node's packages."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpu import device_kit as kit

ROOT = Path(__file__).resolve().parent.parent


def _graph(edges: dict[str, list[str]]):
    """A stand-in for importlib.metadata.distribution over a hand-made graph {name: requirement strings}."""
    def distribution(name):
        if name not in edges:
            raise LookupError(name)
        return SimpleNamespace(version="1.0", requires=edges[name])
    return distribution


def test_closure_follows_requirements_evaluates_markers_for_the_target_python_and_stops_at_the_machine():
    edges = {
        "app": ["lib-a>=1", "lib_b; python_version < '3.12'", "lib-c; python_version >= '3.12'",
                "extra-only; extra == 'docs'", "torch>=2"],
        "lib-a": ["lib-d", "app"],  # a cycle back to the root
        "lib-b": [], "lib-c": ["lib-d"], "lib-d": [],
        "torch": ["never-reached"],
    }
    on_312 = kit.closure(["app"], "3.12", exclude=frozenset({"torch"}), distribution=_graph(edges))
    assert on_312 == {"app": "1.0", "lib-a": "1.0", "lib-c": "1.0", "lib-d": "1.0"}
    on_311 = kit.closure(["App"], "3.11", exclude=frozenset({"torch"}), distribution=_graph(edges))
    assert set(on_311) == {"app", "lib-a", "lib-b", "lib-d"}
    everything = kit.closure(["app"], "3.12", exclude=frozenset(), distribution=_graph({**edges, "never-reached": []}))
    assert {"torch", "never-reached"} <= set(everything)


def test_the_machine_side_is_what_the_machines_have():
    assert kit.FROM_THE_MACHINE <= kit.DEVICE_PACKAGES
    assert kit.CARRIED_ANYWAY <= kit.DEVICE_PACKAGES
    # the GPU stack is always the machine's own
    assert {"torch", "numpy", "transformers", "triton", "pyarrow"} <= kit.FROM_THE_MACHINE
    # and what the pipeline needs that the machines lack is carried
    declared = {kit.normalize(name) for name in kit.declared_dependencies()}
    assert {"pot", "geomloss", "prefect", "mlflow", "pydantic"} <= declared - kit.FROM_THE_MACHINE


def test_the_real_closure_carries_the_pipeline_and_not_the_gpu_stack():
    roots = [r for r in kit.declared_dependencies() if kit.normalize(r) != "dvc"]
    carried = kit.closure(roots, "3.12")
    assert {"pot", "geomloss", "prefect", "prefect-dask", "mlflow", "mlflow-skinny", "sqlalchemy", "alembic",
            "pydantic", "pydantic-core", "distributed"} <= set(carried)
    assert not set(carried) & kit.FROM_THE_MACHINE
    assert "dvc" not in carried
    lock = {kit.normalize(line.split("==")[0]): line.split("==")[1].split("#")[0].strip()
            for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line}
    assert all(lock[name] == version for name, version in carried.items())  # the lock's versions


def test_slim_drops_the_uis_stubs_bsp_and_fixes_console_scripts(tmp_path):
    site = tmp_path / "site"
    for rel in ("mlflow/server/js/build/app.js", "prefect/server/ui/index.html", "prefect/server/ui-v2/x.js",
                "mlflow/server/handlers.py", "ot/bsp/bsp_wrap.cpython-312-x86_64-linux-gnu.so",
                "ot/bsp/__pycache__/bsp_ot.cpython-312.pyc"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    (site / "ot" / "__init__.py").write_text("from .bsp import compute_bspot_bijection, merge_bijections\n")
    (site / "ot" / "bsp" / "__init__.py").write_text("from .bsp_ot import compute_bspot_bijection, merge_bijections\n")
    (site / "ot" / "bsp" / "bsp_ot.py").write_text("from .bsp_wrap import solve\n")
    (site / "bin").mkdir()
    (site / "bin" / "prefect").write_text("#!/work/main/.venv/bin/python3\nfrom prefect.cli import app\n")
    done = kit.slim(site)
    assert len(done) == 4
    assert not (site / "mlflow/server/js").exists() and not (site / "prefect/server/ui").exists()
    assert (site / "mlflow/server/handlers.py").exists()  # only the UI goes
    assert not list(site.rglob("bsp_wrap*")) and not list(site.rglob("__pycache__"))
    assert (site / "bin" / "prefect").read_text() == "#!/usr/bin/env python3\nfrom prefect.cli import app\n"
    # the stubbed package still imports (POT's __init__ needs the two names), and the functions refuse
    code = ("import ot\ntry:\n    ot.compute_bspot_bijection(1)\nexcept NotImplementedError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, check=True).stdout
    assert "left out of otfed's device kit" in out


def test_otfed_never_uses_pots_bsp_and_the_check_would_say_so(tmp_path):
    kit.check_unused_bsp()  # the repository as it is
    for folder in ("otfed", "stages", "flows", "bench", "studies", "gpu", "tests"):
        (tmp_path / folder).mkdir()
    (tmp_path / "otfed" / "fast.py").write_text("import ot\nperm = ot.bsp.compute_bspot_bijection(x, y)\n")
    with pytest.raises(RuntimeError, match="otfed/fast.py uses POT's BSP-OT"):
        kit.check_unused_bsp(tmp_path)


def test_travelling_bytes_counts_tracked_files_not_ignored_ones():
    size = kit.travelling_bytes()
    tracked = sum((ROOT / name).stat().st_size for name in subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
        if (ROOT / name).is_file())
    assert tracked <= size < tracked + 50 * 2**20  # plus untracked-not-ignored files, never .venv (gigabytes)


def _session(*args, env=None):
    return subprocess.run(["bash", str(ROOT / "gpu" / "gpu_session.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_gpu_session_refuses_an_unknown_phase_and_a_missing_kit(tmp_path):
    result = _session("deploy")
    assert result.returncode == 2 and "usage: bash gpu/gpu_session.sh check | scale" in result.stderr
    result = _session("check", env={"OTFED_KIT": str(tmp_path / "absent.tar.xz"), "OTFED_SITE": str(tmp_path / "s"),
                                    "OUT": str(tmp_path / "out")})
    assert result.returncode == 2 and f"no {tmp_path / 'absent.tar.xz'}: build it with" in result.stderr
    assert not (tmp_path / "s").exists()
