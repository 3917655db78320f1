"""The Prefect side of otfed: the one generic stage flow (stage.py), MLflow tracking (tracking.py) and the
scheduled pipeline flow (pipeline.py)."""
