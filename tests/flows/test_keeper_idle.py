"""The keeper's idle timeout (flows/prefect_server.py), without a server or a wall clock: the decision is a pure
function, and the keeper's watch runs here on an injected clock (each of its looks ``POLL_S`` = 0.5 s later), a
stand-in server process and real user files in a throw-away ``PREFECT_HOME``. (The real keeper with a real server:
tests/flows/test_prefect_server.py, marked integration.)
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from flows import prefect_server
from tests.ceilings import ceiling


@pytest.mark.parametrize("has_users, since, now, expected", [(True, 0.0, 7.5, 7.5), (False, 3.0, 7.5, 3.0)])
def test_the_server_is_in_use_as_long_as_it_has_users(has_users: bool, since: float, now: float,
                                                       expected: float) -> None:
    assert prefect_server.quiet_since(has_users, since, now) == expected


@pytest.mark.parametrize("since, now, idle, over", [(0.0, 2.5, 3.0, False), (0.0, 3.0, 3.0, True),
                                                    (0.0, 9.0, 3.0, True), (5.0, 7.0, 3.0, False),
                                                    (5.0, 5.0, 0.0, True)])
def test_the_server_retires_once_idle_for_the_idle_time(since: float, now: float, idle: float, over: bool) -> None:
    assert prefect_server.idle_over(since, now, idle) is over


class Server:
    """A stand-in for the keeper's server process: running until ``exits_after`` looks (by default far more than
    any test needs, so that a keeper that never retires ends the test with "server exited" instead of a hang)."""

    def __init__(self, exits_after: int = 10_000) -> None:
        self.looks, self.exits_after = 0, exits_after

    def poll(self) -> int | None:
        self.looks += 1
        return 0 if self.looks > self.exits_after else None


class Clock:
    """The keeper's clock: ``sleep`` moves it on (and runs ``then`` once it reaches ``at``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.hooks: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for at, then in list(self.hooks):
            if self.now >= at:
                self.hooks.remove((at, then))
                then()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / ".prefect"
    (home / prefect_server.USERS).mkdir(parents=True)
    return home


def _watch(home: Path, server: Server, clock: Clock, idle: float = 3.0, stopping: list[int] | None = None) -> str:
    return prefect_server._watch(home, server, idle, [] if stopping is None else stopping, clock=clock,
                                 sleep=clock.sleep)


def _my_record(home: Path, keeper_pid: int) -> None:
    (home / prefect_server.RECORD).write_text(json.dumps(dict(
        keeper_pid=keeper_pid, keeper_started=1.0, server_pid=1, server_started=1.0, url="http://127.0.0.1:9/api")))


def test_a_server_without_users_retires_after_the_idle_time_and_its_record_goes(home: Path) -> None:
    _my_record(home, os.getpid())  # this keeper's record
    clock = Clock()
    assert _watch(home, Server(), clock, idle=3.0) == "idle 3 s"
    assert clock.now == 3.0  # the first look with 3 s unused, not one earlier or later
    assert not (home / prefect_server.RECORD).exists()


def test_a_retiring_keeper_leaves_another_keepers_record(home: Path) -> None:
    _my_record(home, os.getpid() + 1)
    assert _watch(home, Server(), Clock(), idle=0.0) == "idle 0 s"
    assert (home / prefect_server.RECORD).exists()


def test_a_live_user_holds_the_server_however_long(home: Path) -> None:
    prefect_server._user_file(home, os.getpid()).touch()  # this process: a user that stays alive
    clock = Clock()
    assert _watch(home, Server(exits_after=400), clock, idle=3.0) == "server exited"
    assert clock.now == 200.0  # 400 looks, 66 idle times, never retired


def test_the_idle_time_counts_from_the_last_user_leaving(home: Path) -> None:
    user = prefect_server._user_file(home, os.getpid())
    user.touch()
    clock = Clock()
    clock.hooks.append((10.0, user.unlink))
    assert _watch(home, Server(), clock, idle=3.0) == "idle 3 s"
    assert clock.now == 12.5  # last seen by the look at 9.5 s (the user leaves before the look at 10 s) + 3 s


def test_a_dead_users_file_is_pruned_and_holds_nothing(home: Path) -> None:
    dead = home / prefect_server.USERS / f"{os.getpid()}-1.000"  # this pid, another start time: long gone
    dead.touch()
    clock = Clock()
    assert _watch(home, Server(), clock, idle=3.0) == "idle 3 s"
    assert clock.now == 3.0 and not dead.exists()


def test_sigterm_ends_the_watch_at_once(home: Path) -> None:
    prefect_server._user_file(home, os.getpid()).touch()
    assert _watch(home, Server(), Clock(), stopping=[15]) == "told to stop"


def test_the_keeper_never_waits_for_a_stage_holding_the_lock(home: Path) -> None:
    """A stage holds the lock (here: this test, on its own descriptor) — e.g. starting the next server because
    this one died, and waiting for this keeper to exit first. The keeper skips its looks (no retirement while a
    stage attaches) and ends its watch when its server exits, instead of waiting for the lock: a keeper blocked
    on it would never exit, and the stage never start its server. (The watch runs in a thread: a keeper that
    waits for the lock would hang there, and the join's ceiling only catches that hang.)"""
    clock, ended = Clock(), []
    with open(home / prefect_server.LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        watch = threading.Thread(target=lambda: ended.append(_watch(home, Server(exits_after=20), clock, idle=0.0)),
                                 daemon=True)
        watch.start()
        watch.join(ceiling(60))
        assert ended == ["server exited"], "the keeper waited for the lock a stage holds"
    assert clock.now == 10.0  # 20 looks, none of them retired the unused server while the lock was held
