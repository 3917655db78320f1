"""A stage waits for the project's Prefect server only so long (flows/prefect_server.py): a server alive but not
answering used to hold every stage forever, each printing "a busy machine; waiting" every 30 s. Now the wait ends
after ``OTFED_PREFECT_WAIT_S`` seconds (default :data:`~flows.prefect_server.WAIT_S`) in one line naming the pid
and the command that clears it.

No server starts: the keeper and the server of the record are this test process, ``healthy`` is a stand-in that
never answers (and gives up after many checks, so that an unbounded wait fails the test instead of hanging it),
and the wait's clock is injected where its length matters.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
import pytest

from flows import prefect_server

URL = "http://127.0.0.1:9/api"
CHECKS = 200  # health checks before the stand-in calls the wait unbounded


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("OTFED_PREFECT_IDLE_S", raising=False)
    monkeypatch.setattr(prefect_server, "POLL_S", 0.0)
    monkeypatch.setattr(prefect_server, "_start", lambda home, say: pytest.fail("started a second server"))
    for way in ("send_signal", "terminate", "kill"):  # the server (this process) is never signalled
        monkeypatch.setattr(psutil.Process, way, lambda self, *sig: pytest.fail(f"signalled the server: {sig}"))
    monkeypatch.setattr(os, "kill", lambda pid, sig: pytest.fail(f"signalled pid {pid}"))
    home = tmp_path / ".prefect"
    home.mkdir()
    me = psutil.Process()
    (home / "server.json").write_text(json.dumps(dict(
        keeper_pid=me.pid, keeper_started=me.create_time(), server_pid=me.pid, server_started=me.create_time(),
        url=URL)))
    return home


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs health-checked; the server never answers."""
    seen: list[str] = []

    def healthy(url: str, timeout: float = 5.0) -> bool:
        seen.append(url)
        assert len(seen) < CHECKS, f"still waiting after {CHECKS} health checks: the wait has no bound"
        return False

    monkeypatch.setattr(prefect_server, "healthy", healthy)
    return seen


def test_a_server_that_does_not_answer_fails_the_stage_naming_its_pid_and_the_command_that_clears_it(
        home: Path, checks: list, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTFED_PREFECT_WAIT_S", "0")
    with pytest.raises(prefect_server.ServerStuck) as raised:
        prefect_server.attach(home)
    assert str(raised.value) == (
        f"the project's Prefect server (pid {os.getpid()}, {URL}) has not answered for 0 s "
        f"(OTFED_PREFECT_WAIT_S=0): stop it with `python -m flows.prefect_server stop --home {home}` and rerun")
    assert checks == [URL]
    assert not list((home / "server.users").iterdir())  # the failed stage is no user
    assert prefect_server.read_record(home) is not None  # the record stays: the keeper still runs


def test_the_wait_lasts_the_setting_with_a_line_every_30_s(home: Path, checks: list) -> None:
    """A clock that moves 30 s per reading: the wait checks the server until 600 s have passed (the default),
    saying so every 30 s, and then fails."""
    readings = iter(range(0, 10_000, 30))
    said: list[str] = []
    record = prefect_server.read_record(home)
    assert record is not None
    with pytest.raises(prefect_server.ServerStuck, match=r"has not answered for 600 s \(OTFED_PREFECT_WAIT_S=600\)"):
        prefect_server._running(record, home, said.append, prefect_server.wait_s({}),
                                clock=lambda: float(next(readings)))
    assert len(checks) == 20  # at 0, 30, …, 570 s
    assert said[0] == (f"the project's Prefect server at {URL} has not answered for 30 s "
                       "(a busy machine; waiting up to 600 s)")
    assert len(said) == 19


def test_a_server_that_answers_within_the_wait_is_used(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([False, False, True])
    monkeypatch.setattr(prefect_server, "healthy", lambda url, timeout=5.0: next(answers))
    monkeypatch.setenv("OTFED_PREFECT_WAIT_S", "3600")
    assert prefect_server.attach(home) == URL
    prefect_server.detach(home)


@pytest.mark.parametrize("raw, seconds", [(None, 600.0), ("", 600.0), ("0", 0.0), ("2.5", 2.5), (" 90 ", 90.0)])
def test_the_wait_setting(raw: str | None, seconds: float) -> None:
    assert prefect_server.wait_s({} if raw is None else {"OTFED_PREFECT_WAIT_S": raw}) == seconds


@pytest.mark.parametrize("raw", ["ten", "-1", "nan", "1e"])
def test_a_bad_wait_setting_is_one_line_naming_the_variable(home: Path, raw: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTFED_PREFECT_WAIT_S", raw)
    with pytest.raises(ValueError, match=rf"^OTFED_PREFECT_WAIT_S='{raw}': must be a number of seconds ≥ 0 "
                                         r"\(default 600\)$"):
        prefect_server.attach(home)
    assert not (home / "server.users").exists()  # refused before anything was written
