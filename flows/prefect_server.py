"""One Prefect server per project, shared by every stage and every Dask worker, and gone once nobody uses it.

Before, every stage process — and every Dask worker process of a local cluster — started its own temporary
Prefect server (a uvicorn process, ~225 MB, 9–14 s to start on an idle machine, minutes on a loaded one),
and a killed process left its server running. Now the first stage of a project to need one starts a
*keeper* (``python -m flows.prefect_server keep``, a process in a session of its own) that runs the server
on a free port of 127.0.0.1; every stage after it finds the server again through ``<PREFECT_HOME>/server.json``
and uses it at once; a stage's Dask workers inherit its ``PREFECT_API_URL``.

**Who uses it.** A stage that :func:`attach`\\ es registers itself as a *user* (a file
``server.users/<pid>-<start time>``) and removes that file when it exits. The keeper checks its users
about once a second: a user whose process is gone — also after SIGKILL or the OOM killer, when no handler
runs — is dropped. Once it has had no user for ``idle_s`` seconds (:data:`IDLE_S`, ``OTFED_PREFECT_IDLE_S``;
long enough for ``dvc repro`` to start its next stage) the keeper stops the server cleanly (SIGTERM, then
SIGKILL after 10 s) and exits. If the server dies, the keeper removes the record and exits, and the next
stage starts a new one. Starting, finding and retiring happen under one ``flock``
(``server.lock``), so two stages started together share one server, and a stage never attaches to a server
that is being stopped.

**No start-up timeout decides a run.** A stage waits for a server it started as long as the keeper and the
server process are alive, printing a line every :data:`PROGRESS_S` seconds; only a server that exits while
starting fails the stage, with the tail of its log (``<PREFECT_HOME>/logs/server.log``).

A user's own server wins: with ``PREFECT_API_URL`` set nothing is started (:func:`attach` returns None).
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import psutil

from flows.project import exclusive, prefect_home

#: seconds without any user before the keeper stops the server (``OTFED_PREFECT_IDLE_S`` overrides)
IDLE_S = 60.0
#: seconds between two "still starting" lines while a stage waits for the server it started
PROGRESS_S = 30.0
POLL_S = 0.5
#: tries to start the server when it exits with uvicorn's start-up failure (3: e.g. its port taken meanwhile)
STARTS = 3
RECORD = "server.json"
LOCK = "server.lock"
USERS = "server.users"


class ServerFailed(RuntimeError):
    """The project's Prefect server exited while starting; the message ends with the tail of its log."""


@dataclass(frozen=True)
class Record:
    """What ``server.json`` says: the keeper (pid and start time, so a recycled pid is not it), the server
    process and the API's URL."""

    keeper_pid: int
    keeper_started: float
    server_pid: int
    url: str

    def keeper_alive(self) -> bool:
        return _alive(self.keeper_pid, self.keeper_started)


def idle_s() -> float:
    """:data:`IDLE_S`, or ``OTFED_PREFECT_IDLE_S`` when set (seconds, ≥ 0)."""
    raw = os.environ.get("OTFED_PREFECT_IDLE_S")
    return IDLE_S if not raw else max(0.0, float(raw))


def _alive(pid: int, started: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _started(pid: int) -> float:
    return psutil.Process(pid).create_time()


def healthy(url: str, timeout: float = 5.0) -> bool:
    """Whether the Prefect API at ``url`` answers ``/health`` with 200."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def read_record(home: Path) -> Record | None:
    try:
        return Record(**json.loads((home / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write_record(home: Path, record: Record) -> None:
    tmp = home / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, home / RECORD)


@contextmanager
def _locked(home: Path) -> Iterator[None]:
    with exclusive(home / LOCK):
        yield


# ------------------------------------------------------------------------------------------- users
def _user_file(home: Path, pid: int) -> Path:
    return home / USERS / f"{pid}-{_started(pid):.3f}"


def live_users(home: Path, prune: bool = False) -> list[int]:
    """The pids of the processes registered as users that are still alive (``prune``: remove the others)."""
    out = []
    for path in sorted((home / USERS).glob("*-*")):
        pid, _, started = path.name.partition("-")
        try:
            alive = _alive(int(pid), float(started))
        except ValueError:
            alive = False
        if alive:
            out.append(int(pid))
        elif prune:
            path.unlink(missing_ok=True)
    return out


# ------------------------------------------------------------------------------------------ attach
def attach(home: Path | None = None, say: Callable[[str], None] = lambda line: None) -> str | None:
    """The URL of this project's Prefect API, starting its server if none runs; this process becomes a user
    until it exits (module docstring). None when the user has set ``PREFECT_API_URL`` (their server is used).
    ``say`` receives the progress lines ("starting …", "still starting after …")."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    home = Path(home or prefect_home())
    (home / USERS).mkdir(parents=True, exist_ok=True)
    me = _user_file(home, os.getpid())
    with _locked(home):
        me.touch()  # a user before the keeper's next look, so a server found here is not retired under us
        record = read_record(home)
        url = _running(record, say) if record is not None else None
        if url is None:
            if record is not None:  # a keeper or server that died with its record: stop what it left
                _stop_pid(record.server_pid)
                (home / RECORD).unlink(missing_ok=True)
            url = _start(home, say)
    atexit.register(lambda: me.unlink(missing_ok=True))
    return url


def _running(record: Record, say: Callable[[str], None]) -> str | None:
    """The URL of the server ``record`` describes once it answers — waiting, as long as its keeper and its
    process live, for a server too busy to answer at once (a loaded machine: it is in use, never replaced) —
    or None when the keeper or the server is gone."""
    began = last = time.monotonic()
    while record.keeper_alive() and psutil.pid_exists(record.server_pid):
        if healthy(record.url):
            return record.url
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            say(f"the project's Prefect server at {record.url} has not answered for {last - began:.0f} s "
                "(a busy machine; waiting)")
        time.sleep(POLL_S)
    return None


def detach(home: Path | None = None) -> None:
    """This process is no longer a user (it also stops being one when it exits)."""
    home = Path(home or prefect_home())
    for path in (home / USERS).glob(f"{os.getpid()}-*"):
        path.unlink(missing_ok=True)


@contextmanager
def project_api(say: Callable[[str], None] = lambda line: None) -> Iterator[str | None]:
    """The block runs against this project's Prefect server (:func:`attach`): ``PREFECT_API_URL`` in the
    environment (for child processes) and in Prefect's settings (which Prefect serialises into every task it
    sends to a Dask worker, so the workers report to the same server instead of starting their own). This
    process stops being a user when the block ends. Yields the URL (None: the user's ``PREFECT_API_URL``)."""
    url = attach(say=say)
    if url is None:
        yield None
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = url
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield url
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before
        detach()


def _start(home: Path, say: Callable[[str], None]) -> str:
    """Start a keeper and wait — as long as it and its server live — for its record to show a healthy API."""
    log = home / "logs" / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PREFECT_HOME=str(home))
    offset = log.stat().st_size if log.exists() else 0  # this start's lines begin here
    with open(log, "ab") as out:
        keeper = subprocess.Popen([sys.executable, "-m", "flows.prefect_server", "keep", "--home", str(home)],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    say(f"starting the project's Prefect server (log: {log})")
    began = last = time.monotonic()
    while True:
        record = read_record(home)
        if record is not None and record.keeper_pid == keeper.pid:
            if healthy(record.url):
                say(f"Prefect server ready at {record.url} after {time.monotonic() - began:.0f} s")
                return record.url
        if keeper.poll() is not None:
            lines = _lines(log, offset)
            raise ServerFailed(f"the project's Prefect server could not start: {_cause(lines)} (full log: {log})\n"
                               + "\n".join(lines[-15:]))
        if time.monotonic() - last >= PROGRESS_S:
            last = time.monotonic()
            say(f"Prefect server still starting after {last - began:.0f} s (a busy machine; waiting)")
        time.sleep(POLL_S)


def _lines(path: Path, offset: int = 0) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _cause(lines: list[str]) -> str:
    """The last exception line of a server log (``sqlalchemy.exc.OperationalError: … unable to open database
    file``), else its last line."""
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*?:", line):
            return line.strip()
    return lines[-1].strip() if lines else "it exited before writing anything"


def _stop_pid(pid: int, grace: float = 10.0) -> None:
    try:
        proc = psutil.Process(pid)
        proc.terminate()
        proc.wait(grace)
    except psutil.TimeoutExpired:
        proc.kill()
    except psutil.NoSuchProcess:
        pass


def stop(home: Path | None = None) -> bool:
    """Stop this project's server now (``python -m flows.prefect_server stop``); whether one was running."""
    home = Path(home or prefect_home())
    with _locked(home):
        record = read_record(home)
        if record is None:
            return False
        (home / RECORD).unlink(missing_ok=True)
    if record.keeper_alive():
        os.kill(record.keeper_pid, signal.SIGTERM)
        for _ in range(int(30 / POLL_S)):
            if not record.keeper_alive():
                break
            time.sleep(POLL_S)
    _stop_pid(record.server_pid)
    return True


# ------------------------------------------------------------------------------------------ keeper
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_command(port: int) -> list[str]:
    """The API only (no UI, no background services), as Prefect runs its own temporary server."""
    spec = importlib.util.find_spec("prefect")  # where prefect lives, without importing it in the keeper
    assert spec is not None and spec.origin is not None, "prefect is not installed"
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(spec.origin).parent.parent),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]


def keep(home: Path, idle: float | None = None) -> int:
    """The keeper's life: start the server, publish its record once healthy, retire it after ``idle`` seconds
    without a user (or when told to by SIGTERM), exit when it dies."""
    idle = idle_s() if idle is None else idle
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1",
               PREFECT__SERVER_FINAL="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.pop("PREFECT_API_URL", None)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server, url = None, ""
    for attempt in range(STARTS):
        port = _free_port()
        server = subprocess.Popen(_server_command(port), env=env, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}/api"
        while not healthy(url, timeout=2.0):
            if server.poll() is not None:  # 3: e.g. the port was taken between the probe and the bind
                if server.returncode != 3 or attempt == STARTS - 1:
                    print(f"otfed: Prefect server exited with code {server.returncode}", flush=True)
                    return 1
                server = None
                break
            if stopping:
                _stop_pid(server.pid)
                return 0
            time.sleep(POLL_S)
        if server is not None:
            break
    assert server is not None
    me = os.getpid()
    _write_record(home, Record(me, _started(me), server.pid, url))
    print(f"otfed: Prefect server {url} (pid {server.pid}) for {home}", flush=True)
    quiet_since = time.monotonic()
    while not stopping and server.poll() is None:
        time.sleep(POLL_S)
        with _locked(home):
            if live_users(home, prune=True):
                quiet_since = time.monotonic()
                continue
            if time.monotonic() - quiet_since < idle:
                continue
            record = read_record(home)
            if record is not None and record.keeper_pid == me:
                (home / RECORD).unlink(missing_ok=True)  # under the lock: nobody attaches to a retiring server
            break
    record = read_record(home)
    if record is not None and record.keeper_pid == me:
        (home / RECORD).unlink(missing_ok=True)
    why = "told to stop" if stopping else "server exited" if server.poll() is not None else f"idle {idle:g} s"
    _stop_pid(server.pid)
    print(f"otfed: Prefect server stopped ({why})", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keeper = sub.add_parser("keep", help="run the keeper (started by a stage; not for users)")
    keeper.add_argument("--home", type=Path, required=True)
    sub.add_parser("status", help="the project's server: URL and users")
    sub.add_parser("stop", help="stop the project's server now")
    args = parser.parse_args(argv)
    if args.command == "keep":
        return keep(args.home)
    home = prefect_home()
    if args.command == "stop":
        print("stopped" if stop(home) else "no server running")
        return 0
    record = read_record(home)
    if record is None or not record.keeper_alive():
        print(f"no Prefect server running for {home}")
        return 1
    print(f"{record.url} (server pid {record.server_pid}; users: {live_users(home) or 'none'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
