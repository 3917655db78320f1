"""A stage whose second job kills the Dask worker process running it (as an out-of-memory kill would): for
tests/integration/test_dask_runner.py. It validates and writes like the ``partition`` stage (same params
group, same reports folder) so that the test can check that the previous outputs stay intact."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from stages.partition import STAGE as PARTITION
from stages.stage import Job, Report, Results, Stage


def fine() -> int:
    return 1


def doomed() -> int:
    from distributed import get_worker

    get_worker()  # raises ValueError outside a Dask worker: only a worker process dies
    os._exit(17)


def jobs(p: Any, dirs: Mapping[str, Path]) -> list[Job]:
    return [Job("fine", fine, key="fine"), Job("doomed", doomed, key="doomed")]


def report(p: Any, results: Results, out: Report, dirs: Mapping[str, Path]) -> dict[str, Any]:
    return {"jobs": len(results)}


STAGE = Stage("partition", PARTITION.params, PARTITION.outputs, jobs, report)

if __name__ == "__main__":
    from flows.stage import main

    raise SystemExit(main(STAGE))
