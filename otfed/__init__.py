"""otfed — optimal-transport methods for federated learning (FedWaD, federated OTDD, FedBary, KNOT) as a pure
library: it never imports the pipeline (stages/, flows/), Prefect or MLflow."""
