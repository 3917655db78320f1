"""A trivial flow served on a schedule, for test_scheduled_run.py (run as a script; not a test module).

    python scheduled_flow.py DEPLOYMENT_NAME DELAY_SECONDS INTERVAL_SECONDS MARKER_DIR

serves ``DEPLOYMENT_NAME`` with an interval schedule (every ``INTERVAL_SECONDS``) anchored ``DELAY_SECONDS`` from
now, so the Prefect server's scheduler (not the test) has to create the runs. The scheduler only creates runs
due after the moment it sees the deployment: with a short interval a loaded machine that registers the deployment
after the anchor gets the next slot, not one an hour later. Each run writes a file named after its flow-run id
into ``MARKER_DIR``. Blocks until terminated, like ``flows.pipeline --serve``.
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
    (Path(marker) / run_id).write_text(run_id)
    return run_id


if __name__ == "__main__":
    name, delay, interval, marker = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    Path(marker).mkdir(parents=True, exist_ok=True)
    anchor = datetime.now(timezone.utc) + timedelta(seconds=delay)
    scheduled_smoke.serve(name=name, schedule=Interval(timedelta(seconds=interval), anchor_date=anchor),
                          parameters={"marker": marker}, print_starting_message=True)
