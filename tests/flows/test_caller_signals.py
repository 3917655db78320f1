"""Every signal the project sends goes through one helper that names the process by pid and start time first
(:meth:`flows.caller.Process.signal`): a record or a lifeline that outlived its process never gets a recycled
pid — a stranger — signalled. Checked on this test process (SIGUSR1, handled here) and on the source of the
project's code: no other way to send a signal is written anywhere in it."""
from __future__ import annotations

import ast
import os
import signal
from pathlib import Path

import psutil
import pytest

from flows import caller
from tests.ceilings import wait_until

REPO = Path(__file__).resolve().parents[2]
#: the project's code (what ``make test`` may run, bench/ excluded: it only kills children it has not reaped)
CODE = ("flows", "stages", "otfed")
#: calls that send a signal: os.kill / killpg / pidfd_send_signal, psutil's and subprocess's methods
SENDERS = {"kill", "killpg", "pidfd_send_signal", "send_signal", "terminate"}
#: where a signal may be sent: the helper itself
HELPER = ("flows/caller.py", "Process.signal")


@pytest.fixture
def received():
    got: list[int] = []
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    yield got
    signal.signal(signal.SIGUSR1, before)


def test_a_process_named_by_pid_and_start_time_is_signalled(received: list[int]) -> None:
    me = caller.Process.of(os.getpid())
    assert me is not None and me.started == psutil.Process().create_time()
    assert me.signal(signal.SIGUSR1) is True
    wait_until(lambda: received, "SIGUSR1 to reach this process", 30, poll=0.01)
    assert received == [signal.SIGUSR1]


def test_a_recycled_pid_is_not_signalled(received: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """This pid, another start time: another process, long gone. No signal leaves (every way is watched)."""
    tried: list[object] = []
    monkeypatch.setattr(psutil.Process, "send_signal", lambda self, sig: tried.append(sig))
    monkeypatch.setattr(os, "kill", lambda pid, sig: tried.append(sig))
    gone = caller.Process(os.getpid(), psutil.Process().create_time() - 5.0, "server")
    assert gone.alive() is False
    assert gone.signal(signal.SIGUSR1) is False
    gone.stop(grace=0.0)
    assert tried == [] and received == []


def test_a_process_that_does_not_exist_is_neither_found_nor_signalled() -> None:
    never = 2**22 + 1  # above Linux's largest pid_max (PID_MAX_LIMIT, 2**22): no process ever has it
    assert caller.Process.of(never) is None
    absent = caller.Process(never, 1.0, "server")
    assert absent.signal(signal.SIGTERM) is False


def _senders(path: Path) -> list[tuple[str, str, int]]:
    """(function, call, line) of every signal-sending call in ``path`` (``x.kill(…)``, ``os.kill(…)``, …),
    with the function it is written in (``Class.method``)."""
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}".lstrip("."))
                continue
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in SENDERS:
                    found.append((where, name, child.lineno))
            visit(child, where)

    visit(ast.parse(path.read_text()), "")
    return found


def test_every_signal_of_the_project_goes_through_the_one_helper() -> None:
    stray = []
    for folder in CODE:
        for path in sorted((REPO / folder).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            for where, call, line in _senders(path):
                if (relative, where) != HELPER:
                    stray.append(f"{relative}:{line}: {call}(…) in {where or 'the module'}")
    assert not stray, ("signals sent without naming the process by pid and start time first (use "
                       "flows.caller.Process.signal / .stop):\n" + "\n".join(stray))
    assert _senders(REPO / HELPER[0]) == [(HELPER[1], "send_signal", _senders(REPO / HELPER[0])[0][2])]
