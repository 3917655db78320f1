"""Where torch code runs and with how many threads — the one place that decides either.

* :func:`resolve_device` — ``run.device`` → a concrete device: ``auto`` → ``cuda`` when torch sees a GPU,
  else ``cpu``; explicit values (``cpu``, ``cuda``, ``cuda:N``) pass through.
* :func:`stage_device` — the device of a whole stage. On CPU it also pins torch to one intra-op thread
  for the process (:func:`pin_torch_threads`): a stage's concurrent tasks then each use one core without
  oversubscription, and float reductions are the same from run to run (and whatever the task runner).
* :func:`threads_for` — the ``num_threads`` / ``threads`` argument of otfed's torch functions for work on
  a device: 1 on CPU, None (torch's setting left alone) on an accelerator.
* :func:`to_device` — a host tensor on a device without making the host wait for a GPU.
* :func:`torch_threads` — run a block with a given number of torch intra-op threads, then restore the
  previous number.

**Why a lock, and which.** Whether ``torch.set_num_threads`` is process-wide or belongs to the calling
thread depends on torch's parallel backend (with OpenMP each thread keeps its own value once it has run
a torch operation, and new threads start from the last value set; the native backend has one pool for
the process). Blocks are therefore coordinated as if the setting were process-wide, by a
readers–writer discipline keyed on the value:

- a block that finds torch already at its ``n`` threads (the usual case once a stage has pinned one
  thread) changes nothing and runs *concurrently* with any other such block;
- a block that must change the setting waits until no other thread is inside a block, then runs alone
  (other threads' blocks wait) and restores the previous value on exit;
- a thread waiting to change the setting keeps new blocks of other threads from starting (no
  starvation); a thread's own nested blocks never wait for themselves.

So inside every ``torch_threads(n)`` block ``torch.get_num_threads() == n`` holds, whatever other
threads do with this module. Code that calls ``torch.set_num_threads`` directly is outside this
guarantee; in ``otfed/`` only this module does.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


def resolve_device(device: str | None) -> str:
    """``auto`` → ``cuda`` when torch sees a GPU, else ``cpu``; None → ``cpu``; other values as given."""
    if device is None:
        return "cpu"
    device = str(device)
    if device != "auto":
        return device
    import torch  # torch loads only where a device is resolved: this module is cheap to import

    return "cuda" if torch.cuda.is_available() else "cpu"


class _ThreadSetting:
    """Torch's intra-op thread count, shared by blocks that each need it at a given value (module docstring).

    State (guarded by ``_changed``'s lock): ``_readers`` counts the open blocks that run at the current
    value without changing it, ``_writer`` is the thread whose blocks changed it (then no other thread
    has an open block), ``_waiting`` counts threads waiting to change it. Per thread: how many reading
    blocks and how deep a nest of changing blocks it has open.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None
        self._waiting = 0
        self._mine = threading.local()

    def _own(self) -> tuple[int, int]:
        return getattr(self._mine, "reads", 0), getattr(self._mine, "writes", 0)

    def _acquire_exclusive(self, own_reads: int) -> None:
        """Wait until no other thread has an open block; the caller's own reading blocks are set aside
        (they are suspended while its changing block runs). Called with the lock held."""
        self._waiting += 1
        self._readers -= own_reads
        try:
            while self._writer is not None or self._readers > 0:
                self._changed.wait()
        except BaseException:
            self._readers += own_reads
            raise
        finally:
            self._waiting -= 1
            self._changed.notify_all()
        self._writer = threading.get_ident()

    def _release_exclusive(self, own_reads: int) -> None:
        """Let other threads' blocks in again; the caller's reading blocks count again. Lock held."""
        self._writer = None
        self._readers += own_reads
        self._changed.notify_all()

    @contextmanager
    def held_at(self, n: int) -> Iterator[None]:
        import torch

        reads, writes = self._own()
        with self._changed:
            if writes:  # inside this thread's own changing block: no other thread has a block open
                mode = "nested"
            else:
                while self._writer is not None or (self._waiting and not reads):
                    self._changed.wait()
                mode = "read" if torch.get_num_threads() == n else "write"
                if mode == "read":
                    self._readers += 1
                else:
                    self._acquire_exclusive(reads)
            previous = torch.get_num_threads()
            try:
                if previous != n:
                    torch.set_num_threads(n)
            except BaseException:
                if mode == "write":
                    self._release_exclusive(reads)
                raise
        self._mine.reads, self._mine.writes = reads + (mode == "read"), writes + (mode != "read")
        try:
            yield
        finally:
            with self._changed:
                try:
                    if previous != n:
                        torch.set_num_threads(previous)
                finally:
                    if mode == "read":
                        self._readers -= 1
                        if self._readers == 0:
                            self._changed.notify_all()
                    elif mode == "write":
                        self._release_exclusive(reads)
            self._mine.reads, self._mine.writes = reads, writes

    def pin(self, n: int) -> None:
        """Set the value for good, once no other thread has a block open (the caller's own open blocks
        still restore their previous values when they close)."""
        import torch

        reads, writes = self._own()
        with self._changed:
            if writes:
                torch.set_num_threads(n)
                return
            self._acquire_exclusive(reads)
            try:
                torch.set_num_threads(n)
            finally:
                self._release_exclusive(reads)


_TORCH_THREADS = _ThreadSetting()


def _checked_threads(n: int) -> int:
    if isinstance(n, bool) or int(n) != n or int(n) < 1:
        raise ValueError(f"torch threads must be an integer ≥ 1, got {n!r}")
    return int(n)


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads and restore the previous value (None: unchanged).

    A no-op (nothing set, runs alongside other such blocks) when torch already runs with ``n`` threads;
    otherwise the block runs while no other thread is inside a ``torch_threads`` block (module docstring).
    Small tensor work runs fastest single-threaded: on the shared 2-core development machine a 15-step
    FedAvg update of a 4-16-3 MLP took 1.03 s with torch's default 2 threads and 0.03 s with 1.
    """
    if n is None:
        yield
        return
    with _TORCH_THREADS.held_at(_checked_threads(n)):
        yield


def pin_torch_threads(n: int) -> None:
    """Set torch's intra-op threads to ``n`` for the rest of the process (a stage or a benchmark), waiting
    until no other thread is inside a :func:`torch_threads` block."""
    _TORCH_THREADS.pin(_checked_threads(n))


def threads_for(device: object) -> int | None:
    """The torch CPU threads to run work on ``device`` with (the ``num_threads`` / ``threads`` argument of
    otfed's torch functions): 1 on CPU (small tensors, shared cores: :func:`torch_threads`), None on any
    other device. On a GPU the host thread count does not matter, and a block that had to change it would
    run alone (module docstring): concurrent GPU tasks would take turns instead of overlapping."""
    return 1 if str(device).split(":")[0] == "cpu" else None


def to_device(tensor, device):
    """``tensor`` (a torch tensor) on ``device``. From the host to a CUDA device through pinned memory, without
    blocking: a plain ``.to("cuda")`` from pageable memory waits until the GPU has finished the work queued
    before it (a host sync), so the host could not queue the next step while the GPU runs this one. Anywhere
    else a plain ``.to(device)`` (on CPU: ``tensor`` itself)."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def stage_device(device: str | None) -> str:
    """The device of a torch stage (:func:`resolve_device`); on CPU, torch is pinned to one thread."""
    device = resolve_device(device)
    if device == "cpu":
        pin_torch_threads(1)
    return device
