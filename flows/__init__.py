"""The Prefect side of otfed: the one generic stage flow (stage.py), MLflow tracking (tracking.py) and the
scheduled pipeline flow (pipeline.py)."""
from otfed.cpu_kernels import use_portable_kernels

use_portable_kernels()  # the stage runner (python -m flows.stage <name>), the `otfed` command, Prefect workers,
# Dask workers: before numpy or torch is imported
