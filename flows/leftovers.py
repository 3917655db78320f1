"""What a killed stage leaves behind, and who may clean it: the owner record beside each staging folder.

A stage builds each output folder ``<parent>/<name>`` in ``<parent>/.<name>.staging`` and swaps it in through
``<parent>/.<name>.old`` only when it succeeds (:func:`otfed.io.staged_directory`). A stage killed by SIGKILL,
the OOM killer or a reboot runs no ``finally``: its staging folder stays (possibly gigabytes of models), and a
kill between the two renames of the swap leaves the previous outputs in ``.<name>.old`` with ``<name>`` gone.

:func:`owning` writes an owner record ``<parent>/.<name>.owner`` (host, pid and the pid's start time) before the
staging folder exists and removes it after the folder is gone, so a staging folder without a live owner is
stale. :func:`clean_stale` — run at the start of every stage, whichever it is (``flows/stage.py``), and by
``otfed doctor --fix`` — removes the stale staging folders of *every* stage's outputs, puts a ``.<name>.old``
back where ``<name>`` is missing (the previous outputs, the ones ``dvc.lock`` records) and removes the
leftovers' records. A process is named by its pid *and* start time: a recycled pid is not the owner. A live
owner's folder is never touched, nor one whose owner runs on another host (a shared file system: its pid
means nothing here). :func:`owning` also refuses to start a stage whose output folder a live process is
building (two runs of one stage would remove each other's staging folder).

The check of a folder and the removal of its leftovers happen under an exclusive ``flock`` on the folder that
holds it (``<parent>``), as does writing a record: a stage starting meanwhile cannot have its brand-new
staging folder taken for a stale one.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Literal

import psutil

from flows.caller import Process
from otfed.errors import OtfedError
from otfed.io import STAGING_SUFFIX

OWNER_SUFFIX = ".owner"
OLD_SUFFIX = ".old"  # otfed.io.staged_directory's name for the previous outputs during the swap


class OutputBusy(OtfedError):
    """An output folder is being built by another live stage process (the message names it, its pid and how to
    stop it)."""


@dataclass(frozen=True)
class Owner:
    """The process building an output folder: its stage, host, pid and the pid's start time (psutil's
    ``create_time``; a recycled pid has another)."""

    stage: str
    host: str
    pid: int
    started: float

    def alive(self) -> bool:
        """Whether this very process still runs — on this host only (a process elsewhere cannot be seen: False)."""
        return self.host == socket.gethostname() and Process(self.pid, self.started, self.stage).alive()

    def elsewhere(self) -> bool:
        """Whether the owner runs (or ran) on another host: its folders are not this host's to judge."""
        return self.host != socket.gethostname()

    def describe(self) -> str:
        return f"stage {self.stage}, pid {self.pid}" + (f" on {self.host}" if self.elsewhere() else "")


@dataclass(frozen=True)
class Leftover:
    """One thing a dead stage left: a staging folder or a previous-outputs folder to remove, a previous-outputs
    folder to put back (``restore``: its output folder is missing), or the dead owner's record."""

    path: Path
    final: Path
    action: Literal["remove", "restore"]
    owner: Owner | None
    quiet: bool = False  # a dead owner's record, removed with the folders it describes: not worth a line

    def describe(self) -> str:
        """The leftover, naming its folder and the process that left it."""
        whose = f"left by {self.owner.describe()}, gone" if self.owner else "no owner recorded"
        if self.action == "restore":
            return f"{self.path} ({whose}; killed mid-swap with {self.final} missing: to be put back)"
        return f"{self.path} ({whose})"

    def line(self) -> str:
        """What was done with it."""
        whose = f"left by {self.owner.describe()}, gone" if self.owner else "no owner recorded"
        if self.action == "restore":
            return f"restored {self.final} from {self.path} ({whose}; killed mid-swap)"
        return f"removed {self.path} ({whose})"


def this_process(stage: str) -> Owner:
    """The owner record of the calling process."""
    return Owner(stage, socket.gethostname(), os.getpid(), psutil.Process().create_time())


def staging_folder(final: str | Path) -> Path:
    final = Path(final)
    return final.parent / f".{final.name}{STAGING_SUFFIX}"


def old_folder(final: str | Path) -> Path:
    final = Path(final)
    return final.parent / f".{final.name}{OLD_SUFFIX}"


def owner_file(final: str | Path) -> Path:
    final = Path(final)
    return final.parent / f".{final.name}{OWNER_SUFFIX}"


def read_owner(final: str | Path) -> Owner | None:
    """The owner recorded for output folder ``final``; None when there is no record or it cannot be read (a
    record is written whole, by rename: an unreadable one names no process)."""
    try:
        data = json.loads(owner_file(final).read_text())
        return Owner(str(data["stage"]), str(data["host"]), int(data["pid"]), float(data["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def leftovers_of(final: str | Path) -> list[Leftover]:
    """What a dead stage left of output folder ``final``, in the order to handle it (restore, remove the
    staging folder, remove the record last); nothing while its recorded owner lives or runs on another host."""
    final = Path(final)
    staging, old, record = staging_folder(final), old_folder(final), owner_file(final)
    if not (staging.exists() or old.exists() or record.exists()):
        return []
    owner = read_owner(final)
    if owner is not None and (owner.elsewhere() or owner.alive()):
        return []
    found = []
    if old.is_dir():
        found.append(Leftover(old, final, "restore" if not final.exists() else "remove", owner))
    if staging.exists():
        found.append(Leftover(staging, final, "remove", owner))
    if record.exists():
        found.append(Leftover(record, final, "remove", owner, quiet=bool(found)))
    return found


def stale(folders: Iterable[str | Path]) -> list[Leftover]:
    """:func:`leftovers_of` every output folder in ``folders`` (what ``otfed doctor`` reports; nothing is
    changed)."""
    return [found for final in dict.fromkeys(Path(f) for f in folders) for found in leftovers_of(final)]


def clean_stale(folders: Iterable[str | Path]) -> list[Leftover]:
    """Clean the leftovers of every output folder in ``folders`` whose owner is gone: each folder is judged and
    cleaned under the lock of the folder that holds it (module docstring). Returns what was done."""
    done = []
    for final in dict.fromkeys(Path(f) for f in folders):
        if not final.parent.is_dir():
            continue
        with _locked(final.parent):
            for found in leftovers_of(final):
                _apply(found)
                done.append(found)
    return done


def _apply(found: Leftover) -> None:
    if found.action == "restore":
        os.replace(found.path, found.final)
    elif found.path.is_dir():
        shutil.rmtree(found.path, ignore_errors=True)
    else:
        found.path.unlink(missing_ok=True)


@contextmanager
def owning(stage: str, folders: Iterable[str | Path]) -> Iterator[Owner]:
    """Record this process as the owner of each output folder in ``folders`` for the block (before any staging
    folder of theirs exists), and remove the records afterwards — those still naming this process. Raises
    :class:`OutputBusy` before recording anything when a live process on this host is building one of them."""
    me = this_process(stage)
    finals = list(dict.fromkeys(Path(f) for f in folders))
    written: list[Path] = []
    try:
        for final in finals:
            final.parent.mkdir(parents=True, exist_ok=True)
            with _locked(final.parent):
                owner = read_owner(final)
                if owner is not None and owner != me and owner.alive():
                    raise OutputBusy(f"{final}: stage {owner.stage} (pid {owner.pid}) is building it now; wait "
                                     f"for it to finish, or stop it (kill {owner.pid}) and run this stage again")
                _write_record(me, owner_file(final))
                written.append(final)
        yield me
    finally:
        for final in written:
            if read_owner(final) == me:
                owner_file(final).unlink(missing_ok=True)


def _write_record(owner: Owner, path: Path) -> None:
    """``path`` holds ``owner`` as JSON, written whole (a temporary file renamed onto it)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"stage": owner.stage, "host": owner.host, "pid": owner.pid, "started": owner.started},
                      handle)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself for the block; where the file system cannot lock a folder,
    the block runs unlocked (the lock only closes a race between two starting stages)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
