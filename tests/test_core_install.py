"""The core install: FedWaD (with its bracket), federated OTDD and FedBary need numpy, scipy, POT and pydantic only.

The check runs the three in a fresh interpreter in which importing torch, pandas, scikit-learn, matplotlib,
transformers, Prefect, MLflow, DVC, Dask or dp-accounting raises ImportError (a meta-path finder installed before
anything else) — what a ``pip install otfed`` without extras gives. POT imports torch and scikit-learn only when
they are there."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NOT_CORE = ("torch", "pandas", "sklearn", "matplotlib", "transformers", "tokenizers", "prefect", "mlflow", "dvc",
            "distributed", "dask", "dp_accounting", "geomloss", "tqdm", "yaml")

SCRIPT = textwrap.dedent(f"""
    import importlib.abc, sys

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {NOT_CORE!r}:
                raise ImportError(f"{{name}} is not part of the core install")
            return None

    sys.meta_path.insert(0, Blocked())

    import numpy as np
    from otfed.federation.fedbary import FedBaryConfig, federated_valuation
    from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
    from otfed.federation.otdd import LabelledData, federated_otdd

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 3)), rng.normal(size=(60, 3)) + 1.0
    result = federated_wasserstein(x, y, FedWaDConfig(support_size=60, iterations=5), seed=0)
    lower, upper = result.bracket
    assert 0 < lower <= upper, result.bracket
    labels = np.repeat([0, 1, 2], 20)
    clients = [LabelledData(f"c{{i}}", rng.normal(size=(60, 3)) + i, labels) for i in range(3)]
    otdd = federated_otdd(clients[0], clients[1], FedWaDConfig(support_size=20, iterations=3), seed=0)
    valuation = federated_valuation(clients, FedBaryConfig(support_size=10, iterations=3), seed=0)
    assert abs(valuation.contributions.sum() - 100.0) < 1e-9
    print("core ok", round(upper, 4), round(otdd.estimate, 4), [round(c, 2) for c in valuation.contributions])
    print("loaded:", sorted(m for m in {NOT_CORE!r} if m in sys.modules))
""")


def test_fedwad_otdd_and_fedbary_run_without_the_extras() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "core ok" in done.stdout and "loaded: []" in done.stdout, done.stdout
