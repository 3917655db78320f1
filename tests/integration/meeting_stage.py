"""A stage run that, once its MLflow run is open, waits until ``MEETING_SIZE`` runs (counting itself) are open
at once, for tests/integration/test_tracking_server.py: two stage runs that must log *at the same time* do,
however the machine schedules their starts. Usage: ``python meeting_stage.py <stage>`` from a repository's
root (copied there by the test), with ``MEETING_DIR`` a folder shared by the runs.

Each run writes a file named after its MLflow run id into ``MEETING_DIR`` right after the run opens, then
waits for ``MEETING_SIZE`` files; after ``MEETING_TIMEOUT_S`` (a ceiling that only catches a run that never
comes: the test sets it from tests/ceilings.py; default 240) it fails the stage, saying how many runs were open.
A run arriving after the meeting (a third queued experiment) finds the files there and goes on. Everything
else is the stage's own ``python -m flows.stage <stage>``."""
from __future__ import annotations

import os
import runpy
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from flows import tracking

_open_run = tracking.stage_run


@contextmanager
def _meeting_run(*args: Any, **kwargs: Any) -> Iterator[Any]:
    folder, size = Path(os.environ["MEETING_DIR"]), int(os.environ["MEETING_SIZE"])
    timeout = float(os.environ.get("MEETING_TIMEOUT_S", "240"))
    with _open_run(*args, **kwargs) as run:
        (folder / run.run_id).touch()
        deadline = time.monotonic() + timeout
        while len(list(folder.iterdir())) < size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(list(folder.iterdir()))} of {size} stage runs open after {timeout:g} s: "
                                   "the runs did not log at the same time")
            time.sleep(0.2)
        yield run


if __name__ == "__main__":
    tracking.stage_run = _meeting_run  # flows.stage opens its run as tracking.stage_run(...)
    runpy.run_module("flows.stage", run_name="__main__", alter_sys=True)  # sys.argv[1:]: <stage> [--verbose]
