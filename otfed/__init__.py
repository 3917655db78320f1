"""otfed — optimal-transport methods for federated learning (FedWaD, federated OTDD, FedBary, KNOT) as a pure
library: it never imports the pipeline (stages/, flows/), Prefect or MLflow."""

__version__ = "0.1.0"  # the same as pyproject.toml's [project] version (tests/test_version.py)
