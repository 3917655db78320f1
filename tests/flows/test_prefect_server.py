"""One Prefect server per project (flows/prefect_server.py): stages run one after the other or together share
it, it stops once nobody uses it — also when its last user was SIGKILLed —, a server that cannot start fails
with its cause, and a user's own ``PREFECT_API_URL`` wins.

Each test starts real servers in a throw-away ``PREFECT_HOME``; the stages are stood in for by small child
processes that :func:`~flows.prefect_server.attach` as a stage does. Waits are ceilings (tests/ceilings.py) that
only catch a hang.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from flows import prefect_server
from tests.ceilings import wait_until
from tests.integration.support import REPO, clean_env

pytestmark = pytest.mark.integration

START_S = 300  # a server start: ~5 s idle, a minute or more on a loaded 2-core machine
USER = """
import sys, time
from pathlib import Path
from flows.prefect_server import attach, read_record
home = Path(sys.argv[1])
url = attach(home)
print(url, read_record(home).server_pid, flush=True)
if sys.argv[2] == "hold":
    time.sleep(3600)
"""


def _user(home: Path, hold: bool = False, **env: str) -> subprocess.Popen:
    """A stand-in stage: attaches to ``home``'s server, prints ``<url> <server pid>``, exits or holds on."""
    return subprocess.Popen([sys.executable, "-c", USER, str(home), "hold" if hold else "exit"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(OTFED_PREFECT_IDLE_S=env.pop("idle", "3"), **env))


def _answer(proc: subprocess.Popen) -> tuple[str, int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the user exited with {proc.wait()}: {proc.stderr.read() if proc.stderr else ''}"
    url, pid = line.split()
    return url, int(pid)


def _keepers(home: Path) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "flows.prefect_server" in cmd and "keep" in cmd and str(home) in cmd:
            out.append(proc)
    return out


def _gone(home: Path, server_pid: int) -> bool:
    return not psutil.pid_exists(server_pid) and not _keepers(home) and prefect_server.read_record(home) is None


@pytest.fixture
def home(tmp_path: Path):
    home = tmp_path / ".prefect"
    yield home
    prefect_server.stop(home)  # whatever a failed test left running


def test_stages_one_after_the_other_share_one_server_that_stops_once_idle(home: Path) -> None:
    first = _user(home)
    url, pid = _answer(first)
    assert first.wait() == 0
    assert prefect_server.healthy(url)
    second = _user(home)
    assert _answer(second) == (url, pid)  # found again, not started anew
    assert second.wait() == 0
    assert len(_keepers(home)) == 1
    wait_until(lambda: _gone(home, pid), "the server to stop once nobody has used it for 3 s", START_S, poll=0.2)
    assert not list((home / prefect_server.USERS).iterdir())


def test_stages_started_together_share_one_server(home: Path) -> None:
    users = [_user(home, hold=True), _user(home, hold=True)]
    try:
        answers = [_answer(u) for u in users]
        assert answers[0] == answers[1]
        assert len(_keepers(home)) == 1
        assert sorted(prefect_server.live_users(home)) == sorted(u.pid for u in users)
    finally:
        for u in users:
            u.kill()
            u.wait()
    wait_until(lambda: _gone(home, answers[0][1]), "the server to stop after both users died", START_S, poll=0.2)


def test_a_user_holds_the_server_and_a_sigkilled_one_does_not(home: Path) -> None:
    """A live user keeps the server past the idle time; SIGKILL runs no handler, yet the keeper sees the
    process gone and retires the server."""
    user = _user(home, hold=True, idle="1")
    url, pid = _answer(user)
    assert prefect_server.live_users(home) == [user.pid]
    # several idle periods with a live user: the keeper checks every 0.5 s and must not retire the server
    for _ in range(8):
        subprocess.run(["sleep", "0.5"], check=True)
        assert prefect_server.healthy(url) and psutil.pid_exists(pid)
    os.kill(user.pid, signal.SIGKILL)
    user.wait()
    wait_until(lambda: _gone(home, pid), "the server to stop after its only user was SIGKILLed", START_S, poll=0.2)


def test_a_stale_record_is_replaced(home: Path) -> None:
    """A record left by a keeper that is gone (a reboot, a SIGKILL of the keeper) is not trusted."""
    home.mkdir(parents=True)
    (home / prefect_server.RECORD).write_text('{"keeper_pid": 1, "keeper_started": 0.0, "server_pid": 999999999, '
                                              '"url": "http://127.0.0.1:9/api"}')
    user = _user(home)
    url, pid = _answer(user)
    assert user.wait() == 0
    assert url != "http://127.0.0.1:9/api" and prefect_server.healthy(url)
    wait_until(lambda: _gone(home, pid), "the server to stop once idle", START_S, poll=0.2)


def test_a_server_that_cannot_start_fails_with_its_cause(home: Path) -> None:
    user = _user(home, PREFECT_SERVER_DATABASE_CONNECTION_URL="sqlite+aiosqlite:////nonexistent-otfed/x/prefect.db")
    _, err = user.communicate(timeout=None)
    assert user.returncode == 1
    assert "ServerFailed: the project's Prefect server could not start: sqlalchemy.exc.OperationalError: " \
           "(sqlite3.OperationalError) unable to open database file" in err, err
    assert not _keepers(home) and prefect_server.read_record(home) is None


def test_the_users_own_server_wins(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.example:4200/api")
    assert prefect_server.attach(home) is None
    assert not home.exists()  # nothing started, nothing written


def test_a_server_too_busy_to_answer_is_waited_for_not_replaced(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine the server in use may not answer a health check in time: a stage that finds it with
    its keeper and process alive waits until it answers; it neither stops it nor starts another. (Stand-ins: the
    keeper and the server are this process; the server answers at the third check.)"""
    home.mkdir(parents=True)
    me = psutil.Process()
    (home / prefect_server.RECORD).write_text(
        f'{{"keeper_pid": {me.pid}, "keeper_started": {me.create_time()}, "server_pid": {me.pid}, '
        '"url": "http://127.0.0.1:9/api"}')
    answers = iter([False, False, True])
    monkeypatch.setattr(prefect_server, "healthy", lambda url, timeout=5.0: next(answers))
    monkeypatch.setattr(prefect_server, "POLL_S", 0.01)
    monkeypatch.setattr(prefect_server, "_stop_pid", lambda pid, grace=10.0: pytest.fail("stopped the server"))
    monkeypatch.setattr(prefect_server, "_start", lambda home, say: pytest.fail("started another server"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert prefect_server.attach(home) == "http://127.0.0.1:9/api"
    assert prefect_server.live_users(home) == [me.pid]
    prefect_server.detach(home)
    (home / prefect_server.RECORD).unlink()  # the fixture's stop() must not signal this process
