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

**A detached run.** ``nohup python -m flows.stage <name> &`` answers to the shell that started it, and is stopped
when that shell exits. With ``OTFED_DETACHED=1`` in its environment a stage answers to nobody: nothing is watched,
and it runs to its end and swaps its outputs in whoever is left to hear of it. Set it on that one command, not
exported: a stage of a ``dvc repro`` that inherits it runs on after ``dvc`` is stopped.

**Every signal goes through** :meth:`Process.signal` (and :meth:`Process.stop`, built on it): a process is named by
pid and start time before any signal is sent, so a record on disk that has outlived its process (a SIGKILL, a
reboot) never gets a recycled pid — a stranger — signalled.
"""
from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from typing import Mapping

import psutil

#: shells that DVC (``sh -c``), make or a user's ``bash -c`` may leave standing between the caller and the stage
SHELLS = frozenset({"sh", "dash", "bash", "zsh"})
POLL_S = 1.0
#: two start times closer than this are one process's (records on disk keep them to the millisecond)
SAME_START_S = 1e-3
#: the environment variable that makes a stage answer to nobody (module docstring: a detached run)
DETACHED = "OTFED_DETACHED"


class CallerGone(KeyboardInterrupt):
    """The process that started this stage has exited: its outputs must not be swapped in. An interruption
    (not an error of the stage): the MLflow run ends KILLED, like after SIGTERM."""


@dataclass(frozen=True)
class Process:
    """A process named by pid and start time (``psutil``'s create time), so a recycled pid is not it."""

    pid: int
    started: float
    name: str

    @classmethod
    def of(cls, pid: int) -> "Process | None":
        """The process that has ``pid`` now (None: there is none, or it is a zombie)."""
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return cls(pid, proc.create_time(), proc.name())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def _running(self) -> psutil.Process | None:
        """psutil's handle on this very process (pid *and* start time), None once it is gone."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.started) < SAME_START_S and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        return None

    def alive(self) -> bool:
        return self._running() is not None

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to this process if it still runs — the pid *and* the start time match; a recycled pid
        is another process and is left alone. Whether the signal was sent."""
        proc = self._running()
        if proc is None:
            return False
        try:
            proc.send_signal(signum)  # psutil checks the start time once more right before it signals
            return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if this process has not exited ``grace`` seconds later; nothing if it is gone."""
        proc = self._running()
        if proc is None or not self.signal(signal.SIGTERM):
            return
        try:
            proc.wait(grace)
        except psutil.TimeoutExpired:
            self.signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass


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


def detached(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``OTFED_DETACHED`` asks for a detached run (set, and neither empty nor ``0``): then a stage
    answers to nobody — a run the user put in the background on purpose (``nohup … &``) is not stopped when the
    shell that started it exits."""
    return (os.environ if environ is None else environ).get(DETACHED, "") not in {"", "0"}


class Lifeline:
    """Tie this process to its caller: :meth:`start` a watcher that SIGTERMs this process once the caller is
    gone; :meth:`check` raises :class:`CallerGone` if it is gone now (call it right before swapping outputs).
    Without a caller to answer to (started by init, the caller died before we looked, or a detached run:
    ``OTFED_DETACHED=1``) nothing is watched and :meth:`check` always passes — there is nobody left to report a
    failure to."""

    def __init__(self, process: Process | None = None, poll_s: float = POLL_S) -> None:
        self.process = process if process is not None else None if detached() else caller()
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
                me = Process.of(os.getpid())
                if me is not None:
                    me.signal(signal.SIGTERM)
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
