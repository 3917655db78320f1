"""The scheduled pipeline: a small Prefect flow that shells out to DVC (DVC owns the graph).

Run once:                      python -m flows.pipeline [STAGE ...] [--force] [-S key=value ...]
Serve on a cron schedule:      python -m flows.pipeline --serve --cron "0 3 * * *"
                               (needs a real Prefect server: `prefect server start`, then
                               `export PREFECT_API_URL=http://127.0.0.1:4200/api`; schedules do not fire on
                               the ephemeral server) — then trigger or inspect runs from the Prefect UI.
Deploy to a work pool:         see prefect.yaml (`prefect deploy --all`), GPU workers in the README.

A run can also be an experiment: ``set_params`` become ``dvc exp run -S key=value`` overrides. They are
applied to a copy of ``params.yaml`` and validated first: a bad value stops the run with one line naming
the key before DVC (which writes ``-S`` values into the workspace's ``params.yaml``) is called.

DVC's output streams into the flow run's logs line by line; every stage flow run it starts is tagged
``pipeline:<this run's id>`` and logs to the same Prefect server, so the UI links them.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

import yaml

from flows.prefect_server import project_api
from flows.project import project_root
from flows.redaction import hide_in_prefect_logs, redact
from flows.stage import configure_prefect_environment, failure_lines
from otfed.errors import ConfigError
from stages.params import read_params_file, validate_params

configure_prefect_environment(verbose=True)

from prefect import flow, get_run_logger  # noqa: E402

hide_in_prefect_logs()  # DVC's lines and this flow's failure reach Prefect's database without credentials


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


def check_overrides(set_params: dict[str, str], params_path: str | Path = "params.yaml",
                    stages: list[str] | None = None) -> None:
    """Apply ``key=value`` overrides (values parsed as YAML, as DVC does) to a copy of ``params_path`` and
    validate it — for each of ``stages`` the groups it needs, or the whole file — ConfigError naming the
    key otherwise. ``params_path`` itself is not touched."""
    data = read_params_file(params_path)
    for key, raw in set_params.items():
        node = data
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"-S {key}={raw}: {key}: no such key in {params_path}")
            node = node[part]
        if not isinstance(node, dict):
            raise ConfigError(f"-S {key}={raw}: {'.'.join(parents)} is not a group")
        try:
            node[leaf] = yaml.safe_load(str(raw))
        except yaml.YAMLError as exc:
            raise ConfigError(f"-S {key}={raw}: not a YAML value ({exc})".replace("\n", " ")) from None
    source = f"{params_path} with -S {' '.join(f'{k}={v}' for k, v in set_params.items())}"
    for stage in stages or [None]:
        validate_params(data, source=source, stage=stage)


def _stage_environment(flow_run_id: str) -> dict[str, str]:
    """The environment of the DVC subprocess: stage flow runs tagged with this run and logging to the same
    Prefect server; stage consoles quiet again (this flow's console shows INFO)."""
    from prefect.client.orchestration import get_client

    env = dict(os.environ, OTFED_PIPELINE_RUN=flow_run_id)
    env.pop("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", None)
    with get_client(sync_client=True) as client:
        env["PREFECT_API_URL"] = str(client.api_url).rstrip("/")
    return env


@flow(name="otfed-pipeline", log_prints=True)
def pipeline(stages: list[str] | None = None, set_params: dict[str, str] | None = None,
             force: bool = False) -> int:
    """Run (part of) the otfed pipeline through DVC; each stage appears as its own Prefect flow run."""
    from prefect.runtime import flow_run

    logger = get_run_logger()
    root = project_root()
    if set_params:
        check_overrides(set_params, root / "params.yaml", stages)
    cmd = dvc_command(stages, set_params, force)
    logger.info("running: %s (in %s)", " ".join(cmd), root)
    tail: deque[str] = deque(maxlen=40)
    proc = subprocess.Popen(cmd, cwd=root, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=_stage_environment(str(flow_run.id)))
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if line.strip():
            tail.append(line)
            logger.info(line)
    if proc.wait() != 0:
        raise RuntimeError(redact(f"{' '.join(cmd)} exited with {proc.returncode}:\n" + "\n".join(tail)))
    return proc.returncode


def _overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"-S {pair}: expected key=value")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="*", help="stages to reproduce (default: all)")
    parser.add_argument("--serve", action="store_true", help="serve as a deployment on a schedule")
    parser.add_argument("--cron", default="0 3 * * *", help="cron schedule for --serve (default 03:00 daily)")
    parser.add_argument("--force", action="store_true", help="recompute even if DVC says up to date")
    parser.add_argument("-S", "--set-param", action="append", default=[], metavar="KEY=VALUE",
                        help="run as a DVC experiment with this params override (repeatable)")
    args = parser.parse_args(argv)
    try:
        overrides = _overrides(args.set_param)
        if overrides:
            check_overrides(overrides, project_root() / "params.yaml", args.stages)
    except ConfigError as exc:
        for line in failure_lines(exc, None):
            print(line, file=sys.stderr)
        return 2
    if args.serve:
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:  # the ephemeral server runs no scheduler service
            print("error: --serve needs a real Prefect server: run `prefect server start` and set "
                  "PREFECT_API_URL=http://127.0.0.1:4200/api (schedules never fire on the ephemeral server)",
                  file=sys.stderr)
            return 2
        pipeline.serve(name="otfed-scheduled", cron=args.cron,
                       parameters={"stages": args.stages or None, "set_params": overrides or None})
        return 0
    try:
        with project_api():  # the pipeline's flow run and every stage's on the project's one server
            pipeline(stages=args.stages or None, set_params=overrides or None, force=args.force)
    except RuntimeError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
