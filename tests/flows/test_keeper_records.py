"""What a stage does with the record of the project's Prefect server (flows/prefect_server.py) when that record
is stale or broken: it never signals a process the record merely names, and never starts a second server beside
a keeper that still runs.

No server starts here: ``_start`` is replaced by a stand-in that counts the starts, and every way a signal could
leave this process (``os.kill``, psutil's ``send_signal`` / ``terminate`` / ``kill``) is replaced by a recorder,
so a wrong signal is seen, never sent. The "stranger" a stale record names is this test process: alive, and
not a Prefect server.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import psutil
import pytest

from flows import prefect_server

RECORD, KEEPER_LOCK = "server.json", "keeper.lock"  # in PREFECT_HOME: the record, the live keeper's lock
NEW_URL = "http://127.0.0.1:2/api"  # what the stand-in _start returns: "a new server was started"
GONE_KEEPER = {"keeper_pid": 4_000_000, "keeper_started": 1.0}  # no process has this pid *and* start time


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    for var in ("OTFED_PREFECT_WAIT_S", "OTFED_PREFECT_IDLE_S"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / ".prefect"
    home.mkdir()
    yield home
    prefect_server.detach(home)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every signal the code under test tries to send, as (pid, what); none is sent."""
    calls: list[tuple[int, str]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: calls.append((pid, f"os.kill {sig}")))
    monkeypatch.setattr(psutil.Process, "send_signal", lambda self, sig: calls.append((self.pid, f"signal {sig}")))
    monkeypatch.setattr(psutil.Process, "terminate", lambda self: calls.append((self.pid, "terminate")))
    monkeypatch.setattr(psutil.Process, "kill", lambda self: calls.append((self.pid, "kill")))
    monkeypatch.setattr(psutil.Process, "wait", lambda self, timeout=None: None)
    return calls


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The homes ``_start`` was asked to start a server for (it starts none, and returns :data:`NEW_URL`)."""
    calls: list[Path] = []

    def start(home: Path, say) -> str:
        calls.append(home)
        return NEW_URL

    monkeypatch.setattr(prefect_server, "_start", start)
    return calls


def _me() -> psutil.Process:
    return psutil.Process()


def _write(home: Path, **record: object) -> None:
    (home / RECORD).write_text(json.dumps(record))


def test_a_stale_record_of_a_dead_keeper_never_signals_the_process_that_now_has_its_server_pid(
        home: Path, sent: list, starts: list) -> None:
    """The issue's repro: a record of an earlier version (server by pid only) left by a keeper that is gone, whose
    ``server_pid`` now belongs to another process. Before: that process got SIGTERM (then SIGKILL)."""
    _write(home, **GONE_KEEPER, server_pid=os.getpid(), url="http://127.0.0.1:1/api")
    assert prefect_server.attach(home) == NEW_URL
    assert sent == []
    assert starts == [home]
    assert not (home / RECORD).exists()  # nobody's record: removed, the new keeper writes its own


def test_a_record_whose_server_pid_was_recycled_never_signals_it(home: Path, sent: list, starts: list) -> None:
    """A record of this version: the pid runs, but it started at another time — another process."""
    _write(home, **GONE_KEEPER, server_pid=os.getpid(), server_started=_me().create_time() - 5.0,
           url="http://127.0.0.1:1/api")
    assert prefect_server.attach(home) == NEW_URL
    assert sent == [] and starts == [home]


def test_a_process_with_the_servers_pid_and_start_time_but_not_its_command_is_not_stopped(
        home: Path, sent: list, starts: list) -> None:
    """pid and start time match (the record was written about this very process), but the process does not run
    the Prefect API on the record's port: not proven to be the project's server, so left alone."""
    _write(home, **GONE_KEEPER, server_pid=os.getpid(), server_started=_me().create_time(),
           url="http://127.0.0.1:1/api")
    assert prefect_server._project_server(prefect_server.read_record(home), home) is None
    assert prefect_server.attach(home) == NEW_URL
    assert sent == [] and starts == [home]


def test_the_servers_command_is_told_from_others_by_its_app_and_port() -> None:
    command = prefect_server._server_command(4321)
    assert prefect_server._is_server_command(command, 4321)
    assert not prefect_server._is_server_command(command, 4322)  # another project's server
    assert not prefect_server._is_server_command(command, None)  # a URL without a port proves nothing
    assert not prefect_server._is_server_command(["sleep", "900"], 4321)
    assert not prefect_server._is_server_command(["uvicorn", prefect_server.SERVER_APP, "--port"], 4321)  # no value
    assert not prefect_server._is_server_command(["python", "-m", "uvicorn", "--port", "4321", "other:app"], 4321)


@pytest.fixture
def keeper_lock(home: Path):
    """``keeper.lock`` held, as a live keeper holds it — by this process, named in it by pid and start time."""
    with open(home / KEEPER_LOCK, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"pid": os.getpid(), "started": _me().create_time()}))
        handle.flush()
        yield handle


def test_an_unreadable_record_while_a_keeper_runs_is_refused_with_the_command_that_clears_it(
        home: Path, sent: list, starts: list, keeper_lock) -> None:
    """Before: the unreadable record counted as no record, and a second keeper and server started on the same
    ``prefect.db``."""
    (home / RECORD).write_text('{"keeper_pid": 12')  # cut short
    with pytest.raises(prefect_server.ServerStuck) as raised:
        prefect_server.attach(home)
    message = str(raised.value)
    assert "\n" not in message
    assert f"{home / RECORD} is not JSON" in message
    assert f"keeper (pid {os.getpid()}, holding {home / KEEPER_LOCK}) still runs" in message
    assert f"`python -m flows.prefect_server stop --home {home}`" in message
    assert starts == [] and sent == []
    assert (home / RECORD).read_text() == '{"keeper_pid": 12'  # left for the user to see
    assert not list((home / "server.users").iterdir())  # the refused stage is no user


def test_an_unreadable_record_without_a_keeper_is_removed_and_a_server_started(
        home: Path, sent: list, starts: list) -> None:
    (home / RECORD).write_text("\x00\x00garbage")
    assert prefect_server.attach(home) == NEW_URL
    assert starts == [home] and sent == []
    assert not (home / RECORD).exists()


def test_a_keeper_without_a_record_is_waited_for_until_it_has_retired(
        home: Path, sent: list, starts: list, keeper_lock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retiring keeper removes its record first and stops its server after: a stage that comes in between
    waits for the keeper to exit (here: the lock is released at the third look), then starts a server."""
    looks = []
    read = prefect_server.read_record

    def read_record(where: Path):
        looks.append(where)
        if len(looks) == 3:
            fcntl.flock(keeper_lock, fcntl.LOCK_UN)  # the keeper exits
        return read(where)

    monkeypatch.setattr(prefect_server, "read_record", read_record)
    monkeypatch.setattr(prefect_server, "POLL_S", 0.0)
    assert prefect_server.attach(home) == NEW_URL
    assert len(looks) == 3 and starts == [home] and sent == []


def test_a_keeper_without_a_record_is_waited_for_only_up_to_the_bound(
        home: Path, sent: list, starts: list, keeper_lock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTFED_PREFECT_WAIT_S", "0")
    with pytest.raises(prefect_server.ServerStuck, match=(
            rf"keeper \(pid {os.getpid()}, .*\) has run without a record .* \(OTFED_PREFECT_WAIT_S=0\): "
            rf"stop it with `python -m flows\.prefect_server stop --home {home}` and rerun$")):
        prefect_server.attach(home)
    assert starts == [] and sent == []
