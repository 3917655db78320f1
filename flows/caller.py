"""The process a stage answers to: a stage never outlives its caller, and never swaps in outputs after it.

``dvc repro`` starts ``python -m flows.stage <name>`` (through ``/bin/sh -c`` when ``$SHELL`` is unset: dash then
stays in between as the parent). When DVC itself is stopped — ``kill <pid>``, a CI cancel, ``docker stop``,
a Prefect cancellation of the pipeline flow — it exits at once and reports failure; nothing tells the stage.
Left alone, the stage would run on, reparented to init, and swap new outputs in after DVC had reported the
failure (``dvc.lock`` then describes the old ones).

:func:`caller` finds the process that started the stage: the nearest ancestor that is not a shell merely
standing in between (sh, dash, bash, zsh with the stage as its only child). :class:`Lifeline` watches it —
a daemon thread polls it about once a second and, once it is gone, sends this process SIGTERM, so the stage
ends the way an interrupted stage ends (MLflow run KILLED, staging folders removed, previous outputs kept,
exit 143); :meth:`Lifeline.check` is the last word before the swap, so a caller that died between two polls
cannot see outputs replaced either. A process is identified by its pid *and* its start time: a recycled pid
is not the caller.
"""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass

import psutil

#: shells that DVC (``sh -c``), make or a user's ``bash -c`` may leave standing between the caller and the stage
SHELLS = frozenset({"sh", "dash", "bash", "zsh"})
POLL_S = 1.0


class CallerGone(KeyboardInterrupt):
    """The process that started this stage has exited: its outputs must not be swapped in. An interruption
    (not an error of the stage): the MLflow run ends KILLED, like after SIGTERM."""


@dataclass(frozen=True)
class Process:
    """A process named by pid and start time (``psutil``'s create time), so a recycled pid is not it."""

    pid: int
    started: float
    name: str

    def alive(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.started and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False


def caller(pid: int | None = None) -> Process | None:
    """The process that started process ``pid`` (default: this one): its parent, or — while that parent is a
    shell whose only child is the process below it — the shell's own parent. None when there is no parent
    to answer to (init, or the parent is already gone)."""
    try:
        below = psutil.Process(os.getpid() if pid is None else pid)
        parent = below.parent()
        while parent is not None and parent.name() in SHELLS and len(parent.children()) == 1:
            up = parent.parent()
            if up is None or up.pid <= 1:
                break
            below, parent = parent, up
        if parent is None or parent.pid <= 1:
            return None
        return Process(parent.pid, parent.create_time(), parent.name())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class Lifeline:
    """Tie this process to its caller: :meth:`start` a watcher that SIGTERMs this process once the caller is
    gone; :meth:`check` raises :class:`CallerGone` if it is gone now (call it right before swapping outputs).
    Without a caller to answer to (started by init, or the caller died before we looked) nothing is watched
    and :meth:`check` always passes — there is nobody left to report a failure to."""

    def __init__(self, process: Process | None = None, poll_s: float = POLL_S) -> None:
        self.process = caller() if process is None else process
        self.poll_s = poll_s
        self._stop = threading.Event()
        self.fired = False

    def start(self) -> "Lifeline":
        if self.process is not None:
            threading.Thread(target=self._watch, name="otfed-lifeline", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not self.process.alive():
                self.fired = True
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def check(self) -> None:
        if self.process is not None and not self.process.alive():
            raise CallerGone(f"the process that started this stage ({self.process.name}, pid {self.process.pid}) "
                             "has exited: outputs not swapped in")


_ARMED: list[Lifeline] = []


def arm(lifeline: Lifeline) -> Lifeline:
    """Make ``lifeline`` the one :func:`armed` returns (the stage's, for code that must not hold it itself)."""
    _ARMED[:] = [lifeline]
    return lifeline


def armed() -> Lifeline | None:
    """The lifeline :func:`arm` set, None after :func:`disarm`. A Prefect flow function reads it through this
    function instead of closing over it: Dask pickles the flow function by value with the stage's tasks, and
    a lifeline (a thread, an event's lock) cannot be pickled."""
    return _ARMED[0] if _ARMED else None


def disarm() -> None:
    _ARMED.clear()
