"""Benchmark: what a stage waits for before its first task — its own temporary Prefect server (before) or the
project's shared one (now, ``flows.prefect_server``) — on an idle and on a busy machine.

Three ways to get a Prefect API that answers ``/health``, measured side by side in one run, interleaved, each
``--repeats`` times, in a throw-away ``PREFECT_HOME``:

* ``temporary`` — Prefect's own temporary server, as every stage process and every Dask worker started one
  before (``SubprocessASGIServer().start()``; stopped after each measurement);
* ``project, first stage`` — :func:`flows.prefect_server.attach` with no server running: the keeper starts it;
* ``project, next stage`` — :func:`~flows.prefect_server.attach` from a new process while the server runs:
  what every later stage of a ``dvc repro`` (and every Dask worker) pays.

Each measurement is a fresh Python process (``python -c``), timed from its start to a healthy API, so the
import of Prefect / flows is included as a stage pays it. With ``--busy N``, N processes spinning on the CPU
run throughout (the "busy machine" column: the 2-core CI machine under another job). Reported: median and
max seconds, and the median's ratio to ``temporary`` of the same load.

    python -m bench.prefect_startup                      # idle and busy (2 spinners), 5 repeats
Results: reports/bench/prefect_startup.{csv,md}.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from bench.scale_out import invocation, write_report

REPO = Path(__file__).resolve().parent.parent

TEMPORARY = """
from prefect.server.api.server import SubprocessASGIServer
server = SubprocessASGIServer()
server.start(timeout=3600)
server.stop()
"""
PROJECT = """
import sys
from pathlib import Path
from flows.prefect_server import attach
attach(Path(sys.argv[1]))
"""


def _timed(code: str, home: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(home)], cwd=REPO, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _spinners(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def measure(repeats: int, busy: int) -> list[dict]:
    from flows import prefect_server

    rows = []
    with tempfile.TemporaryDirectory(prefix="otfed-prefect-bench-") as tmp:
        home = Path(tmp) / ".prefect"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", OTFED_PREFECT_IDLE_S="600",
                   PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="3600")
        _timed(TEMPORARY, home, env)  # the database's migrations once, outside the timings
        spinning = _spinners(busy)
        try:
            for repeat in range(repeats):
                load = os.getloadavg()[0]
                rows.append(dict(load=f"busy ({busy} spinners)" if busy else "idle", way="temporary",
                                 repeat=repeat, seconds=_timed(TEMPORARY, home, env), load_1min=load))
                rows.append(dict(load=rows[-1]["load"], way="project, first stage", repeat=repeat,
                                 seconds=_timed(PROJECT, home, env), load_1min=load))
                rows.append(dict(load=rows[-1]["load"], way="project, next stage", repeat=repeat,
                                 seconds=_timed(PROJECT, home, env), load_1min=load))
                prefect_server.stop(home)
        finally:
            for proc in spinning:
                proc.kill()
                proc.wait()
            prefect_server.stop(home)
    return rows


def summary(raw: pd.DataFrame) -> pd.DataFrame:
    table = raw.groupby(["load", "way"], sort=False).seconds.agg(median="median", max="max").reset_index()
    base = table[table.way == "temporary"].set_index("load")["median"]
    table["ratio_to_temporary"] = table["median"] / table["load"].map(base)
    table["repeats"] = raw.groupby(["load", "way"], sort=False).size().to_numpy()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=2, help="spinners for the busy rows (0: idle rows only)")
    args = parser.parse_args(argv)
    rows = measure(args.repeats, 0) + (measure(args.repeats, args.busy) if args.busy else [])
    raw = pd.DataFrame(rows)
    table = summary(raw)
    header = (f"# Prefect API start-up: a stage's temporary server vs the project's shared one\n\n"
              f"`{invocation('bench.prefect_startup', argv)}` on {os.cpu_count()} CPUs; seconds from a fresh "
              "Python process's start to a healthy API (imports included), median and max over the repeats; "
              "`ratio_to_temporary`: median over the temporary server's median at the same load.")
    write_report(table, "prefect_startup", header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
