"""A trivial flow served on a schedule, for test_scheduled_run.py (run as a script; not a test module).

    python scheduled_flow.py DEPLOYMENT_NAME DELAY_SECONDS MARKER_FILE

serves ``DEPLOYMENT_NAME`` with an hourly interval schedule anchored ``DELAY_SECONDS`` from now, so the
Prefect server's scheduler (not the test) has to create the one run that falls inside the test. Each run
writes its flow-run id to ``MARKER_FILE``. Blocks until terminated, like ``flows.pipeline --serve``.
"""
from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run
from prefect.schedules import Interval

FLOW_NAME = "otfed-scheduled-smoke"


@flow(name=FLOW_NAME)
def scheduled_smoke(marker: str) -> str:
    run_id = str(flow_run.id)
    Path(marker).write_text(run_id)
    return run_id


if __name__ == "__main__":
    name, delay, marker = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    anchor = datetime.now(timezone.utc) + timedelta(seconds=delay)
    scheduled_smoke.serve(name=name, schedule=Interval(timedelta(hours=1), anchor_date=anchor),
                          parameters={"marker": marker}, print_starting_message=True)
