"""One Prefect server per project (flows/prefect_server.py): stages run one after the other or together share
it, it stops once nobody uses it — also when its last user was SIGKILLed —, a server that cannot start fails
with its cause (ENOSPC for a full disk), and a user's own ``PREFECT_API_URL`` wins. It dies with its keeper; a
stale record never gets a stranger signalled, an orphaned server is stopped only when proven the project's, and
a server that stops answering or whose record is broken fails the next stage with the command that clears it.

Each test starts real servers in a throw-away ``PREFECT_HOME``; the stages are stood in for by small child
processes that :func:`~flows.prefect_server.attach` as a stage does. Waits are ceilings (tests/ceilings.py) that
only catch a hang.
"""
from __future__ import annotations

import json
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
    """(Between the two stand-in stages this test process is a user, as ``dvc repro`` starting its next stage
    within the idle time is: a second process may take longer than 3 s to start on a loaded machine.)"""
    first = _user(home)
    url, pid = _answer(first)
    between = prefect_server._user_file(home, os.getpid())
    between.touch()  # while the first still runs: the keeper never sees the server unused
    assert first.wait() == 0
    assert prefect_server.healthy(url)
    second = _user(home)
    assert _answer(second) == (url, pid)  # found again, not started anew
    assert second.wait() == 0
    between.unlink()
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


def test_a_stale_record_is_replaced_and_the_process_it_names_left_alone(home: Path) -> None:
    """A record left by a keeper that is gone (a reboot, a SIGKILL of the keeper) is not trusted: the issue's
    repro — its ``server_pid`` is now a stranger's (a ``sleep``), which used to get SIGTERM."""
    home.mkdir(parents=True)
    stranger = subprocess.Popen(["sleep", "900"])
    try:
        (home / prefect_server.RECORD).write_text(f'{{"keeper_pid": 4000000, "keeper_started": 1.0, '
                                                  f'"server_pid": {stranger.pid}, "url": "http://127.0.0.1:1/api"}}')
        user = _user(home)
        url, pid = _answer(user)
        assert user.wait() == 0
        assert url != "http://127.0.0.1:1/api" and prefect_server.healthy(url)
        assert stranger.poll() is None, f"the stranger the stale record named exited with {stranger.returncode}"
    finally:
        stranger.kill()
        stranger.wait()
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
        f'"server_started": {me.create_time()}, "url": "http://127.0.0.1:9/api"}}')
    answers = iter([False, False, True])
    monkeypatch.setattr(prefect_server, "healthy", lambda url, timeout=5.0: next(answers))
    monkeypatch.setattr(prefect_server, "POLL_S", 0.01)
    monkeypatch.setattr(prefect_server.Process, "stop", lambda self, grace=10.0: pytest.fail("stopped the server"))
    monkeypatch.setattr(prefect_server, "_start", lambda home, say: pytest.fail("started another server"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    assert prefect_server.attach(home) == "http://127.0.0.1:9/api"
    assert prefect_server.live_users(home) == [me.pid]
    prefect_server.detach(home)
    (home / prefect_server.RECORD).unlink()  # the fixture's stop() must not signal this process


def test_a_sigkilled_keeper_takes_its_server_with_it(home: Path) -> None:
    """SIGKILL runs no handler of the keeper's; the kernel still ends its server (``PR_SET_PDEATHSIG``), which
    used to listen on indefinitely."""
    user = _user(home, hold=True, idle="600")
    try:
        url, pid = _answer(user)
        record = prefect_server.read_record(home)
        assert record is not None and record.server_pid == pid
        os.kill(record.keeper_pid, signal.SIGKILL)
        wait_until(lambda: not psutil.pid_exists(pid), "the server to exit after its keeper was SIGKILLed", 120,
                   poll=0.2)
    finally:
        user.kill()
        user.wait()


def test_a_server_that_stops_answering_fails_the_next_stage_with_the_command_that_clears_it(home: Path) -> None:
    """The server runs but answers nothing (SIGSTOP): a stage used to wait forever, holding the lock. Now it
    fails after ``OTFED_PREFECT_WAIT_S`` with one line naming the pid and the command; that command clears it."""
    first = _user(home, idle="600")  # the keeper must not retire the server meanwhile
    url, pid = _answer(first)
    assert first.wait() == 0
    os.kill(pid, signal.SIGSTOP)
    try:
        second = _user(home, OTFED_PREFECT_WAIT_S="1", idle="600")
        _, err = second.communicate()
        assert second.returncode == 1
        command = f"python -m flows.prefect_server stop --home {home}"
        assert (f"ServerStuck: the project's Prefect server (pid {pid}, {url}) has not answered for ") in err, err
        assert f"(OTFED_PREFECT_WAIT_S=1): stop it with `{command}` and rerun" in err, err
        assert len(_keepers(home)) == 1  # no second server either
        stopped = subprocess.run(command, shell=True, cwd=REPO, env=clean_env(), capture_output=True, text=True)
        assert (stopped.returncode, stopped.stdout) == (0, "stopped\n"), stopped.stderr
        wait_until(lambda: _gone(home, pid), "the stuck server and its keeper to be stopped", 120, poll=0.2)
    finally:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGCONT)


def test_a_broken_record_while_the_server_runs_is_refused_and_the_command_clears_it(home: Path) -> None:
    """``server.json`` damaged while its server runs: a stage used to start a second keeper and server on the same
    ``prefect.db``. Now it fails in one line naming the live keeper and the command that stops it."""
    holder = _user(home, hold=True, idle="600")
    try:
        url, pid = _answer(holder)
        keeper = prefect_server.read_record(home).keeper_pid
        (home / prefect_server.RECORD).write_text('{"keeper_pid": ')
        second = _user(home)
        _, err = second.communicate()
        assert second.returncode == 1
        command = f"python -m flows.prefect_server stop --home {home}"
        assert (f"ServerStuck: {home / prefect_server.RECORD} is not JSON (") in err, err
        assert (f"but the project's Prefect server keeper (pid {keeper}, holding {home / prefect_server.KEEPER_LOCK})"
                f" still runs; not starting a second server on the same database: stop it with `{command}` and "
                "rerun") in err, err
        assert [k.pid for k in _keepers(home)] == [keeper] and prefect_server.healthy(url)
        stopped = subprocess.run(command, shell=True, cwd=REPO, env=clean_env(), capture_output=True, text=True)
        assert (stopped.returncode, stopped.stdout) == (0, "stopped\n"), stopped.stderr
        wait_until(lambda: _gone(home, pid), "the server and its keeper to be stopped", 120, poll=0.2)
    finally:
        holder.kill()
        holder.wait()


FAKE_SERVER = "import time; time.sleep(900)"  # argv then carries the server's app and port


def test_a_server_its_dead_keeper_left_is_stopped_only_when_proven_the_projects(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in servers (``python -c … prefect.server.api.server:create_app --port P``) named by a record whose
    keeper is gone: the next stage stops the one whose pid, start time, command line and PREFECT_HOME all match,
    and leaves the one of another project and the one the record dates to another start time."""
    home.mkdir(parents=True)
    other_home = home.parent / "other" / ".prefect"

    def fake(port: int, prefect_home: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", FAKE_SERVER, prefect_server.SERVER_APP, "--port", str(port)],
                                env=clean_env(PREFECT_HOME=str(prefect_home)))

    ours, theirs, recycled = fake(1, home), fake(1, other_home), fake(1, home)
    monkeypatch.setattr(prefect_server, "_start", lambda home, say: "http://127.0.0.1:2/api")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    try:
        for proc, shift in ((theirs, 0.0), (recycled, -5.0), (ours, 0.0)):
            wait_until(lambda: FAKE_SERVER in psutil.Process(proc.pid).cmdline(), "the stand-in to start", 60,
                       poll=0.05)
            (home / prefect_server.RECORD).write_text(json.dumps(dict(
                keeper_pid=4_000_000, keeper_started=1.0, server_pid=proc.pid,
                server_started=psutil.Process(proc.pid).create_time() + shift, url="http://127.0.0.1:1/api")))
            assert prefect_server.attach(home) == "http://127.0.0.1:2/api"
            prefect_server.detach(home)
        wait_until(lambda: not psutil.pid_exists(ours.pid) or psutil.Process(ours.pid).status() == psutil.STATUS_ZOMBIE,
                   "the proven orphan to exit", 60, poll=0.05)
        assert theirs.poll() is None and recycled.poll() is None
    finally:
        for proc in (ours, theirs, recycled):
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device that is always full)")
def test_a_server_whose_database_cannot_grow_fails_with_enospc(home: Path) -> None:
    """A real server on a database that cannot grow (``/dev/full`` answers every write with ENOSPC)."""
    user = _user(home, PREFECT_SERVER_DATABASE_CONNECTION_URL="sqlite+aiosqlite:////dev/full")
    _, err = user.communicate()
    assert user.returncode == 1
    assert ("ServerFailed: the project's Prefect server could not start: no space left on device (ENOSPC): the "
            f"server needs room for its database and log in {home} (") in err, err
    assert "or set PREFECT_HOME to another disk (sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) " \
           "database or disk is full)" in err, err
    assert not _keepers(home) and prefect_server.read_record(home) is None
