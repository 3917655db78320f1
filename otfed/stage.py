"""The entry point every DVC stage goes through: validate params, run the stage's Prefect flow, map errors.

``python -m stages.<name>`` → :func:`run_stage`:
1. params.yaml is validated first (bad params → one line per problem, exit 2, nothing written);
2. the stage's flow runs (its outputs are built in a staging directory and swapped in at the end);
3. an :class:`~otfed.errors.OtfedError` (missing data file, degenerate client …) → ``error: …``, exit 2.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from otfed.errors import OtfedError
from otfed.orchestration import configure_prefect_environment


def run_stage(flow_factory: Callable[[Any], Any], params_path: str | Path = "params.yaml") -> int:
    """Validate params, then run ``flow_factory(params)`` (a Prefect flow) on the validated params dict."""
    from otfed.config import load_params

    try:
        params = load_params(params_path)
    except OtfedError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    configure_prefect_environment()
    try:
        flow = flow_factory(params)
        flow(params.model_dump(mode="json"))
    except OtfedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
