"""The scheduled pipeline: a small Prefect flow that shells out to DVC (DVC owns the graph).

Run once:                      python -m flows.pipeline
Serve on a cron schedule:      python -m flows.pipeline --serve --cron "0 3 * * *"
                               (needs a real Prefect server: `prefect server start`, then
                               `export PREFECT_API_URL=http://127.0.0.1:4200/api`; schedules do not fire on
                               the ephemeral server) — then trigger or inspect runs from the Prefect UI.
Deploy to a work pool:         see prefect.yaml (`prefect deploy --all`), GPU workers in the README.

A run can also be an experiment: ``set_params`` become ``dvc exp run -S key=value`` overrides.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from flows.stage import configure_prefect_environment

configure_prefect_environment()

from prefect import flow, get_run_logger  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent


def dvc_command(stages: list[str] | None = None, set_params: dict[str, str] | None = None,
                force: bool = False) -> list[str]:
    """The DVC command line this flow runs: ``dvc repro`` or, with overrides, ``dvc exp run -S …``."""
    if set_params:
        cmd = ["dvc", "exp", "run"]
        for key, value in set_params.items():
            cmd += ["-S", f"{key}={value}"]
    else:
        cmd = ["dvc", "repro"]
    if force:
        cmd.append("--force")
    return cmd + list(stages or [])


@flow(name="otfed-pipeline", log_prints=True)
def pipeline(stages: list[str] | None = None, set_params: dict[str, str] | None = None,
             force: bool = False) -> int:
    """Run (part of) the otfed pipeline through DVC; each stage appears as its own Prefect flow run."""
    logger = get_run_logger()
    cmd = dvc_command(stages, set_params, force)
    logger.info("running: %s", " ".join(cmd))
    proc = subprocess.run(cmd, cwd=REPO_ROOT, text=True, capture_output=True)
    logger.info(proc.stdout[-4000:])
    if proc.returncode != 0:
        logger.error(proc.stderr[-4000:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="*", help="stages to reproduce (default: all)")
    parser.add_argument("--serve", action="store_true", help="serve as a deployment on a schedule")
    parser.add_argument("--cron", default="0 3 * * *", help="cron schedule for --serve (default 03:00 daily)")
    parser.add_argument("--force", action="store_true", help="recompute even if DVC says up to date")
    args = parser.parse_args(argv)
    if args.serve:
        pipeline.serve(name="otfed-scheduled", cron=args.cron, parameters={"stages": args.stages or None})
        return 0
    pipeline(stages=args.stages or None, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
