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
starting fails the stage, with the tail of its log (``<PREFECT_HOME>/logs/server.log``) — or, when the disk
where it writes is full, with ``no space left on device (ENOSPC)``. A server that *was* running but stops
answering is waited for :data:`WAIT_S` seconds (``OTFED_PREFECT_WAIT_S``); then the stage fails with one line
naming its pid and the command that clears it (:func:`stop_command`).

**Records on disk may be stale.** ``server.json`` names the keeper and the server each by pid *and* start time,
and every signal goes through :meth:`flows.caller.Process.signal`: a record left by a SIGKILLed keeper or by a
reboot never gets a recycled pid — a stranger — signalled. The server dies with its keeper (``PR_SET_PDEATHSIG``);
a server that outlived it anyway is stopped by the next stage only when its pid, start time, command line and
``PREFECT_HOME`` prove it is this project's. The keeper holds ``keeper.lock`` (a ``flock``, released by the kernel
however the keeper ends) for its whole life: a stage that finds ``server.json`` unreadable or missing while a
keeper runs refuses to start a second server on the same ``prefect.db`` and says how to stop the first.

A user's own server wins: with ``PREFECT_API_URL`` set nothing is started (:func:`attach` returns None).
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import fcntl
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

import psutil

from flows.caller import Process
from flows.project import exclusive, prefect_home

#: seconds without any user before the keeper stops the server (``OTFED_PREFECT_IDLE_S`` overrides)
IDLE_S = 60.0
#: seconds a stage waits for a running server that does not answer before it fails (``OTFED_PREFECT_WAIT_S``)
WAIT_S = 600.0
#: seconds between two "still starting" lines while a stage waits for the server it started
PROGRESS_S = 30.0
POLL_S = 0.5
#: tries to start the server when it exits with uvicorn's start-up failure (3: e.g. its port taken meanwhile)
STARTS = 3
RECORD = "server.json"
LOCK = "server.lock"
USERS = "server.users"
#: held (``flock``) by the live keeper for its whole life; holds its pid and start time
KEEPER_LOCK = "keeper.lock"
#: what the server's command line runs (:func:`_server_command`): with its port, the proof that a process is one
SERVER_APP = "prefect.server.api.server:create_app"
#: a server that could not start with less than this free where it writes is said to have met a full disk
LOW_FREE_MB = 64
#: how a full disk shows in the server's log
ENOSPC_SIGNS = ("No space left on device", "[Errno 28]", "database or disk is full", "ENOSPC")
PR_SET_PDEATHSIG = 1


class ServerFailed(RuntimeError):
    """The project's Prefect server exited while starting; the message ends with the tail of its log."""


class ServerStuck(RuntimeError):
    """The project's Prefect server or its keeper runs but cannot be used (it does not answer, or its record is
    unreadable): one line naming the pid and the command that clears it (:func:`stop_command`)."""


@dataclass(frozen=True)
class Record:
    """What ``server.json`` says: the keeper and the server process, each by pid and start time (so a recycled
    pid is not it), and the API's URL."""

    keeper_pid: int
    keeper_started: float
    server_pid: int
    server_started: float
    url: str

    def keeper(self) -> Process:
        return Process(self.keeper_pid, self.keeper_started, "keeper")

    def server(self) -> Process:
        return Process(self.server_pid, self.server_started, "server")

    def keeper_alive(self) -> bool:
        return self.keeper().alive()


def _seconds(variable: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """``variable`` of the environment as seconds (unset or empty: ``default``); anything but a number ≥ 0 is a
    ValueError naming the variable."""
    raw = (os.environ if environ is None else environ).get(variable, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise ValueError(f"{variable}={raw!r}: must be a number of seconds ≥ 0 (default {default:g})")
    return value


def idle_s(environ: Mapping[str, str] | None = None) -> float:
    """:data:`IDLE_S`, or ``OTFED_PREFECT_IDLE_S`` when set (seconds, ≥ 0)."""
    return _seconds("OTFED_PREFECT_IDLE_S", IDLE_S, environ)


def wait_s(environ: Mapping[str, str] | None = None) -> float:
    """:data:`WAIT_S`, or ``OTFED_PREFECT_WAIT_S`` when set (seconds, ≥ 0): how long a stage waits for a running
    server that does not answer."""
    return _seconds("OTFED_PREFECT_WAIT_S", WAIT_S, environ)


def _alive(pid: int, started: float) -> bool:
    return Process(pid, started, "").alive()


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
    """The record in ``home`` (None: none, or one that is not a record — :func:`_record_or_problem` says why)."""
    found = _record_or_problem(home)
    return found if isinstance(found, Record) else None


def _record_or_problem(home: Path) -> Record | str | None:
    """``server.json`` as a :class:`Record`; None when there is no such file; else what is wrong with it (not
    JSON, a field missing — also a record of an older version, which named the server by pid only)."""
    try:
        text = (home / RECORD).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    try:
        return Record(**json.loads(text))
    except ValueError as exc:
        return f"not JSON ({exc})"
    except TypeError:
        return "not a record of this version (fields: " + ", ".join(Record.__dataclass_fields__) + ")"


def stop_command(home: Path) -> str:
    """The command that stops ``home``'s server and keeper, whatever state they are in (:func:`stop`)."""
    return f"python -m flows.prefect_server stop --home {shlex.quote(str(home))}"


# ------------------------------------------------------------------------------------------- keeper lock
def _hold_keeper_lock(home: Path) -> IO[str]:
    """Take ``keeper.lock`` for this keeper's life (waiting while a keeper that is retiring still holds it) and
    write this process's pid and start time into it. The open file is the lock: keep it open; the kernel
    releases it however this process ends."""
    handle = open(home / KEEPER_LOCK, "a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    me = os.getpid()
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"pid": me, "started": _started(me)}))
    handle.flush()
    return handle


def keeper_running(home: Path) -> bool:
    """Whether a keeper of ``home`` is alive: ``keeper.lock`` is held (whatever ``server.json`` says)."""
    try:
        with open(home / KEEPER_LOCK, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(handle, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def _keeper_from_lock(home: Path) -> Process | None:
    """The keeper that holds ``keeper.lock``, as the file names it (pid and start time, written by the holder):
    None when the lock is free, or the process it names no longer runs."""
    if not keeper_running(home):
        return None
    try:
        said = json.loads((home / KEEPER_LOCK).read_text())
        keeper = Process(int(said["pid"]), float(said["started"]), "keeper")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return keeper if keeper.alive() else None


def _is_keeper_command(pid: int) -> bool:
    """Whether process ``pid`` runs a keeper (``python -m flows.prefect_server keep …``)."""
    try:
        command = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "flows.prefect_server" in command and "keep" in command


def _write_record(home: Path, record: Record) -> None:
    tmp = home / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(record)))
    os.replace(tmp, home / RECORD)


@contextmanager
def _locked(home: Path) -> Iterator[None]:
    with exclusive(home / LOCK):
        yield


@contextmanager
def _locked_if_free(home: Path) -> Iterator[bool]:
    """The lock if nobody holds it now (yields True), else nothing (False) — the keeper never waits for it: a
    stage holding it may be waiting for this keeper to exit (its server died) before it starts the next one."""
    with open(home / LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
    wait = wait_s()
    idle_s()  # a bad OTFED_PREFECT_IDLE_S fails here, in one line, not in the keeper's log
    (home / USERS).mkdir(parents=True, exist_ok=True)
    me = _user_file(home, os.getpid())
    try:
        with _locked(home):
            me.touch()  # a user before the keeper's next look, so a server found here is not retired under us
            url = _found(home, say, wait)
            if url is None:
                url = _start(home, say)
    except BaseException:
        me.unlink(missing_ok=True)
        raise
    atexit.register(lambda: me.unlink(missing_ok=True))
    return url


def _found(home: Path, say: Callable[[str], None], wait: float) -> str | None:
    """(Under the lock.) The URL of the server that runs for ``home``, or None when a new one is to be started —
    after stopping a server its dead keeper left (only one proven to be this project's: :func:`_project_server`)
    and removing a record nobody holds. :class:`ServerStuck` when a keeper runs but its server cannot be used
    for ``wait`` seconds, or its record is unreadable: a second server on the same database is never started."""
    found = _record_or_problem(home)
    if isinstance(found, Record):
        url = _running(found, home, say, wait)
        if url is not None:
            return url
        if not found.keeper_alive():  # a keeper gone without its server (a SIGKILL): stop what it left
            orphan = _project_server(found, home)
            if orphan is not None:
                say(f"stopping the Prefect server (pid {orphan.pid}) its keeper (pid {found.keeper_pid}) left")
                orphan.stop()
        (home / RECORD).unlink(missing_ok=True)
        found = None  # and a keeper still alive (its server died) is waited for, below
    if keeper_running(home):
        if found is not None:
            keeper = _keeper_from_lock(home)
            raise ServerStuck(f"{home / RECORD} is {found}, but the project's Prefect server keeper "
                              f"(pid {keeper.pid if keeper else '?'}, holding {home / KEEPER_LOCK}) still runs; "
                              f"not starting a second server on the same database: stop it with "
                              f"`{stop_command(home)}` and rerun")
        return _after_keeper(home, say, wait)
    if found is not None:  # a record that is not one, and no keeper: nobody's
        (home / RECORD).unlink(missing_ok=True)
    return None


def _after_keeper(home: Path, say: Callable[[str], None], wait: float,
                  clock: Callable[[], float] = time.monotonic) -> str | None:
    """(Under the lock, no record, a keeper alive.) A keeper retiring has removed its record and is stopping
    its server; one started by a stage that died meanwhile writes its record once its server answers. Wait up to
    ``wait`` seconds for either: None once the keeper is gone, the URL once its record shows a server that
    answers; :class:`ServerStuck` after that."""
    began = clock()
    while keeper_running(home):
        record = read_record(home)
        if record is not None:
            return _running(record, home, say, wait)
        if clock() - began >= wait:
            keeper = _keeper_from_lock(home)
            raise ServerStuck(f"the project's Prefect server keeper (pid {keeper.pid if keeper else '?'}, holding "
                              f"{home / KEEPER_LOCK}) has run without a record ({home / RECORD}) for "
                              f"{clock() - began:.0f} s (OTFED_PREFECT_WAIT_S={wait:g}): stop it with "
                              f"`{stop_command(home)}` and rerun")
        time.sleep(POLL_S)
    return None


def _running(record: Record, home: Path, say: Callable[[str], None], wait: float,
             clock: Callable[[], float] = time.monotonic) -> str | None:
    """The URL of the server ``record`` describes once it answers — waiting up to ``wait`` seconds, as long as
    its keeper and its process live, for a server too busy to answer at once (a loaded machine: it is in use,
    never replaced) — or None when the keeper or the server is gone. :class:`ServerStuck` when both live and it
    has not answered for ``wait`` seconds (a server that hangs would otherwise hold every stage forever)."""
    began = last = clock()
    while record.keeper_alive() and record.server().alive():
        if healthy(record.url):
            return record.url
        now = clock()
        if now - began >= wait:
            raise ServerStuck(f"the project's Prefect server (pid {record.server_pid}, {record.url}) has not "
                              f"answered for {now - began:.0f} s (OTFED_PREFECT_WAIT_S={wait:g}): stop it with "
                              f"`{stop_command(home)}` and rerun")
        if now - last >= PROGRESS_S:
            last = now
            say(f"the project's Prefect server at {record.url} has not answered for {now - began:.0f} s "
                f"(a busy machine; waiting up to {wait:g} s)")
        time.sleep(POLL_S)
    return None


def _project_server(record: Record, home: Path) -> Process | None:
    """The server process ``record`` names, when it still runs and is proven to be ``home``'s Prefect server:
    its pid and start time match the record, its command line runs the Prefect API on the record's port, and
    its ``PREFECT_HOME`` (where it can be read) is ``home``. None otherwise — nothing else is ever stopped."""
    server = record.server()
    try:
        proc = psutil.Process(server.pid)
        if not server.alive() or not _is_server_command(proc.cmdline(), urlsplit(record.url).port):
            return None
        try:
            its_home = proc.environ().get("PREFECT_HOME")
        except psutil.AccessDenied:
            its_home = None
    except (psutil.Error, ValueError):
        return None
    if its_home is not None and Path(its_home).resolve() != Path(home).resolve():
        return None
    return server


def _is_server_command(command: Sequence[str], port: int | None) -> bool:
    """Whether ``command`` (a process's argv) runs the Prefect API (:data:`SERVER_APP`) on ``port``."""
    args = list(command)
    return (port is not None and SERVER_APP in args and "--port" in args[:-1]
            and args[args.index("--port") + 1] == str(port))


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
            raise ServerFailed(f"the project's Prefect server could not start: "
                               f"{_cause(lines, home, _free_mb(home))} (full log: {log})\n" + "\n".join(lines[-15:]))
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


def _cause(lines: list[str], home: Path, free_mb: float | None) -> str:
    """Why the server could not start: the last exception line of its log (``sqlalchemy.exc.OperationalError: …
    unable to open database file``), else its last line — led by ``no space left on device (ENOSPC)`` when the
    log shows a full disk or ``home``'s disk has less than :data:`LOW_FREE_MB` free (``free_mb``; a full disk
    may leave no log at all)."""
    cause = next((line.strip() for line in reversed(lines)
                  if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*?:", line)),
                 lines[-1].strip() if lines else "it exited before writing anything")
    full = any(sign in line for line in lines for sign in ENOSPC_SIGNS)
    if not full and (free_mb is None or free_mb >= LOW_FREE_MB):
        return cause
    free = "" if free_mb is None else f" ({free_mb:.1f} MiB free there)"
    return (f"no space left on device (ENOSPC): the server needs room for its database and log in {home}{free}; "
            f"free some, or set PREFECT_HOME to another disk ({cause})")


def _free_mb(path: Path) -> float | None:
    """MiB free for unprivileged writers on ``path``'s file system (None: it cannot be told)."""
    try:
        return shutil.disk_usage(path).free / 2**20
    except OSError:
        return None


def stop(home: Path | None = None, grace: float = 30.0) -> bool:
    """Stop this project's server now (``python -m flows.prefect_server stop``): its keeper (found through the
    record, or through ``keeper.lock`` when the record is unreadable) is asked to stop it (SIGTERM) and given
    ``grace`` seconds; a server the record names that still runs after that — and is proven to be this
    project's — is stopped directly. Whether anything was running."""
    home = Path(home or prefect_home())
    with _locked(home):
        found = _record_or_problem(home)
        record = found if isinstance(found, Record) else None
        keeper = record.keeper() if record is not None and record.keeper_alive() else _keeper_from_lock(home)
        if keeper is not None and not _is_keeper_command(keeper.pid):
            keeper = None  # named by pid and start time, but not running a keeper: never signalled
        server = _project_server(record, home) if record is not None else None
        (home / RECORD).unlink(missing_ok=True)
    if keeper is not None and keeper.signal(signal.SIGTERM):
        for _ in range(int(grace / POLL_S)):
            if not keeper.alive():
                break
            time.sleep(POLL_S)
    if server is not None:
        server.stop()
    return keeper is not None or server is not None or record is not None


# ------------------------------------------------------------------------------------------ keeper
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_taken(port: int) -> bool:
    """Whether another process has ``port`` of 127.0.0.1 now (a server that exited 3 lost it to one: start
    again on another port; else its start-up failed for good)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _server_command(port: int) -> list[str]:
    """The API only (no UI, no background services), as Prefect runs its own temporary server; a graceful
    shutdown bounded to 10 s."""
    spec = importlib.util.find_spec("prefect")  # where prefect lives, without importing it in the keeper
    assert spec is not None and spec.origin is not None, "prefect is not installed"
    return [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(spec.origin).parent.parent),
            "--factory", SERVER_APP, "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on", "--timeout-graceful-shutdown", "10"]


def _dies_with(keeper: int) -> Callable[[], None]:
    """A ``preexec_fn`` for the server: the kernel sends it SIGTERM when its parent, the keeper (pid ``keeper``),
    ends — also by SIGKILL, when no handler of the keeper runs —, and it exits at once if the keeper is already
    gone. Linux only (elsewhere the next stage stops what a dead keeper left: :func:`_project_server`)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    except (OSError, AttributeError):
        return lambda: None

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != keeper:
            os._exit(1)
    return preexec


def quiet_since(has_users: bool, since: float, now: float) -> float:
    """When the server was last seen in use: ``now`` while it has users, else ``since`` (the keeper's clock)."""
    return now if has_users else since


def idle_over(since: float, now: float, idle: float) -> bool:
    """Whether a server unused since ``since`` is to be retired at ``now``: ``idle`` seconds or more unused."""
    return now - since >= idle


def keep(home: Path, idle: float | None = None) -> int:
    """The keeper's life: hold ``keeper.lock``, start the server, publish its record once healthy, retire it
    after ``idle`` seconds without a user (or when told to by SIGTERM), exit when it dies."""
    idle = idle_s() if idle is None else idle
    lock = _hold_keeper_lock(home)  # noqa: F841 — held open for the keeper's whole life
    env = dict(os.environ, PREFECT_HOME=str(home), PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1",
               PREFECT__SERVER_FINAL="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    env.pop("PREFECT_API_URL", None)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = os.getpid()
    server, url = None, ""
    for attempt in range(STARTS):
        port = _free_port()
        server = subprocess.Popen(_server_command(port), env=env, stdin=subprocess.DEVNULL, preexec_fn=_dies_with(me))
        url = f"http://127.0.0.1:{port}/api"
        while not healthy(url, timeout=2.0):
            if server.poll() is not None:  # 3 and the port in use: taken between the probe and the bind
                if server.returncode != 3 or not _port_taken(port) or attempt == STARTS - 1:
                    print(f"otfed: Prefect server exited with code {server.returncode}", flush=True)
                    return 1
                server = None
                break
            if stopping:
                _child(server).stop()
                return 0
            time.sleep(POLL_S)
        if server is not None:
            break
    assert server is not None
    process = _child(server)
    _write_record(home, Record(me, _started(me), server.pid, process.started, url))
    print(f"otfed: Prefect server {url} (pid {server.pid}) for {home}", flush=True)
    why = _watch(home, server, idle, stopping)
    record = read_record(home)
    if record is not None and record.keeper_pid == me:
        (home / RECORD).unlink(missing_ok=True)
    process.stop()
    server.wait()
    print(f"otfed: Prefect server stopped ({why})", flush=True)
    return 0


def _child(server: subprocess.Popen) -> Process:
    """The keeper's server as a :class:`Process` (not reaped yet, so its pid cannot have been recycled)."""
    return Process(server.pid, _started(server.pid), "server")


def _watch(home: Path, server: subprocess.Popen, idle: float, stopping: list[int],
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str:
    """The keeper's watch over a running server, a look every :data:`POLL_S` seconds: prune the users that are
    gone and retire the server once it has had none for ``idle`` seconds (:func:`quiet_since`,
    :func:`idle_over`) — its record removed under the lock, so nobody attaches to a retiring server; a look that
    finds the lock held (a stage attaching) is skipped. Returns why the watch ended: ``told to stop`` (SIGTERM:
    ``stopping``), ``server exited`` or ``idle <idle> s``."""
    me = os.getpid()
    since = clock()
    while True:
        if stopping:
            return "told to stop"
        if server.poll() is not None:
            return "server exited"
        sleep(POLL_S)
        with _locked_if_free(home) as locked:
            if not locked:
                continue
            since = quiet_since(bool(live_users(home, prune=True)), since, clock())
            if not idle_over(since, clock(), idle):
                continue
            record = read_record(home)
            if record is not None and record.keeper_pid == me:
                (home / RECORD).unlink(missing_ok=True)
            return f"idle {idle:g} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keeper = sub.add_parser("keep", help="run the keeper (started by a stage; not for users)")
    keeper.add_argument("--home", type=Path, required=True)
    for name, text in (("status", "the project's server: URL and users"), ("stop", "stop the project's server now")):
        sub.add_parser(name, help=text).add_argument(
            "--home", type=Path, default=None, help="its PREFECT_HOME (default: the project's .prefect)")
    args = parser.parse_args(argv)
    if args.command == "keep":
        return keep(args.home)
    home = Path(args.home or prefect_home())
    if args.command == "stop":
        print("stopped" if stop(home) else "no server running")
        return 0
    found = _record_or_problem(home)
    if not isinstance(found, Record) and keeper_running(home):
        keeper = _keeper_from_lock(home)
        print(f"{home / RECORD} is {found or 'missing'} while a keeper (pid {keeper.pid if keeper else '?'}) runs: "
              f"{stop_command(home)}")
        return 1
    if not isinstance(found, Record) or not found.keeper_alive():
        print(f"no Prefect server running for {home}")
        return 1
    print(f"{found.url} (server pid {found.server_pid}; users: {live_users(home) or 'none'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
