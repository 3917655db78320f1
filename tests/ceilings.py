"""Ceilings for the tests that wait on real processes and servers: how long a wait may last before the test
calls it a hang.

The rule: a test waits on the event itself — a port answering, a run reaching a state, a file appearing, a
process exiting — never for a fixed time, and gives up only at a ceiling set to several times how long the event
takes on a loaded 2-core machine, so that only a hang reaches it and no behaviour is decided by it. Every ceiling
is ``seconds × OTFED_TEST_TIME_FACTOR`` (a positive number, default 1): a slower or busier machine raises the
factor (e.g. ``OTFED_TEST_TIME_FACTOR=3``) instead of anyone editing a number in a test. A ceiling that is hit
fails the test saying what was awaited, for how long, and the tail of what the process printed.
"""
from __future__ import annotations

import math
import os
import subprocess
import time
from typing import Any, Callable, Sequence, TypeVar

import psutil
import pytest

FACTOR_ENV = "OTFED_TEST_TIME_FACTOR"
T = TypeVar("T")


def time_factor() -> float:
    """``OTFED_TEST_TIME_FACTOR`` as a number (unset or empty: 1). Anything but a positive finite number is a
    ValueError naming the variable: a typo must not silently shorten every ceiling."""
    raw = os.environ.get(FACTOR_ENV, "").strip()
    if not raw:
        return 1.0
    try:
        factor = float(raw)
    except ValueError:
        factor = math.nan
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"{FACTOR_ENV}={raw!r}: must be a positive number, the factor every test ceiling is "
                         "multiplied by (default 1; e.g. 3 on a slow or busy machine)")
    return factor


def ceiling(seconds: float) -> float:
    """``seconds × OTFED_TEST_TIME_FACTOR``: the longest a test waits for an event. ``seconds`` is already
    several times the event's duration on a loaded 2-core machine: reaching it should mean a hang, not slowness."""
    return seconds * time_factor()


def tail(*outputs: str | bytes | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a process's output (its streams one after the other; bytes decoded)."""
    text = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o for o in outputs if o)
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def hit(what: str, seconds: float, details: str = "") -> str:
    """The failure message of a ceiling that was hit: what was awaited, how long, and ``details`` (a tail)."""
    message = (f"gave up waiting for {what} after {ceiling(seconds):g} s, the ceiling that catches a hang "
               f"({seconds:g} s × {FACTOR_ENV}={time_factor():g}; raise {FACTOR_ENV} on a slower machine)")
    return f"{message}\n--- output (tail) ---\n{details}" if details else message


def wait_until(ready: Callable[[], T], what: str, seconds: float, poll: float = 0.5,
               details: Callable[[], str] = lambda: "") -> T:
    """Call ``ready()`` every ``poll`` seconds until it returns something truthy, and return that; at
    ``ceiling(seconds)`` fail the test with :func:`hit` (``what`` and ``details()``, e.g. a log's tail).
    ``ready`` may itself fail the test at once (the process it waits on has exited)."""
    deadline = time.monotonic() + ceiling(seconds)
    while True:
        found = ready()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(hit(what, seconds, details()))
        time.sleep(poll)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every descendant (a stage's temporary Prefect server would hold its pipes open)."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.kill()


def finished(proc: subprocess.Popen, what: str, seconds: float) -> tuple[Any, Any]:
    """``proc.communicate()``: its (stdout, stderr) once it has exited. At ``ceiling(seconds)`` it and its
    descendants are killed and the test fails with :func:`hit` (``what`` and the tail of its output)."""
    try:
        return proc.communicate(timeout=ceiling(seconds))
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired as exc:  # a descendant that left the family still holds a pipe
        out, err = exc.stdout, exc.stderr
    pytest.fail(hit(what, seconds, tail(out, err)))


def completed(cmd: Sequence[str], what: str, seconds: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """The completed process of ``cmd``, as ``subprocess.run(cmd, capture_output=True, text=True, **kwargs)``
    gives it, waiting for its exit under ``ceiling(seconds)`` (see :func:`finished`)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    out, err = finished(proc, what, seconds)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


time_factor()  # a bad OTFED_TEST_TIME_FACTOR fails the collection of every test module using ceilings, at once
