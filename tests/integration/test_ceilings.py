"""tests/ceilings.py, the waits every test with real processes relies on: the factor scales each ceiling, a bad
factor is one error naming the variable, a wait returns on its event, and a ceiling that is hit says what was
awaited, how long, and what the process printed — having killed it and its children. (Not marked
``integration``: the processes here are ``sh`` one-liners, so it runs with the fast tests.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.ceilings import FACTOR_ENV, ceiling, completed, finished, wait_until


@pytest.mark.parametrize("value, expected", [(None, 90.0), ("", 90.0), ("1", 90.0), ("2.5", 225.0),
                                             (" 0.5 ", 45.0)])
def test_a_ceiling_is_the_seconds_times_the_factor(monkeypatch: pytest.MonkeyPatch, value, expected) -> None:
    if value is None:
        monkeypatch.delenv(FACTOR_ENV, raising=False)
    else:
        monkeypatch.setenv(FACTOR_ENV, value)
    assert ceiling(90) == expected


@pytest.mark.parametrize("value", ["three", "0", "-2", "nan", "inf", "2s"])
def test_a_bad_factor_is_an_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(FACTOR_ENV, value)
    with pytest.raises(ValueError) as info:
        ceiling(10)
    assert str(info.value).startswith(f"{FACTOR_ENV}={value!r}: must be a positive number")


def test_a_bad_factor_stops_the_collection_of_a_module_that_uses_ceilings(tmp_path: Path) -> None:
    """Before any server starts: importing tests.ceilings fails, naming the variable."""
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", "import tests.ceilings"], cwd=repo, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(repo), FACTOR_ENV: "fast"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"ValueError: {FACTOR_ENV}='fast': must be a positive")


def test_a_wait_returns_what_its_event_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FACTOR_ENV, raising=False)
    polls: list[int] = []

    def third_poll() -> str | None:
        polls.append(1)
        return "ready" if len(polls) == 3 else None

    assert wait_until(third_poll, "the third poll", 600, poll=0.01) == "ready"
    assert len(polls) == 3


def test_a_wait_that_hits_its_ceiling_says_what_how_long_and_the_details(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FACTOR_ENV, "2")
    with pytest.raises(pytest.fail.Exception) as info:
        wait_until(lambda: False, "a port that never opens", 0.05, poll=0.01, details=lambda: "server log line")
    message = str(info.value)
    assert message.startswith("gave up waiting for a port that never opens after 0.1 s, the ceiling that catches a "
                              f"hang (0.05 s × {FACTOR_ENV}=2;")
    assert message.endswith("--- output (tail) ---\nserver log line")


def test_a_process_past_its_ceiling_is_killed_with_its_children_and_its_output_shown(tmp_path: Path) -> None:
    """A shell that printed a line and waits on a child that never ends: at the ceiling both are killed and the
    failure names the wait and shows the line."""
    script = 'sleep 600 & echo $! > child.pid; echo "still working"; touch printed; wait'
    proc = subprocess.Popen(["sh", "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    wait_until(lambda: (tmp_path / "printed").exists(), "the shell to print its line", 60, poll=0.05)
    child = psutil.Process(int((tmp_path / "child.pid").read_text()))
    with pytest.raises(pytest.fail.Exception) as info:
        finished(proc, "the shell to exit", 0.01)
    assert str(info.value).startswith("gave up waiting for the shell to exit after ")
    assert str(info.value).endswith("--- output (tail) ---\nstill working")
    assert proc.returncode == -9

    def gone() -> bool:
        try:
            return child.status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by whoever adopted it
        except psutil.NoSuchProcess:
            return True

    wait_until(gone, "the killed shell's child to die", 60, poll=0.05)


def test_completed_gives_the_exit_status_and_both_streams() -> None:
    done = completed(["sh", "-c", "echo out; echo err >&2; exit 3"], "the shell to exit", 60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
