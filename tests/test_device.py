"""Device resolution and torch thread control (otfed/device.py): the values, the restore, and a real
concurrency check — threads toggling the setting at the same time never see a wrong count in their block,
with torch's own setting and with a simulated process-wide one (torch's native backend), where an
unguarded toggle does race."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from otfed.device import pin_torch_threads, resolve_device, stage_device, threads_for, to_device, torch_threads
from otfed.models import resolve_device as torch_device
from tests.ceilings import ceiling


@pytest.mark.parametrize("cuda", [True, False])
def test_resolve_device(cuda: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert resolve_device("auto") == ("cuda" if cuda else "cpu")
    assert resolve_device(None) == "cpu"
    for explicit in ("cpu", "cuda", "cuda:1", "mps"):
        assert resolve_device(explicit) == explicit


def test_models_resolve_device_gives_the_same_device_as_a_torch_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert torch_device("auto") == torch.device("cpu") == torch_device(None)
    assert torch_device(torch.device("cuda", 1)) == torch.device("cuda:1")


def test_stage_device_pins_one_thread_on_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    assert stage_device("cpu") == "cpu"
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert stage_device("auto") == "cpu"
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert stage_device("cuda:0") == "cuda:0"  # no GPU needed to name one; the CPU setting is left alone
    assert torch.get_num_threads() == 2


def test_threads_for_is_one_on_cpu_and_torchs_own_setting_elsewhere() -> None:
    for cpu in ("cpu", "cpu:0", torch.device("cpu")):
        assert threads_for(cpu) == 1
    for other in ("cuda", "cuda:1", torch.device("cuda", 0), "mps"):
        assert threads_for(other) is None


def test_to_device_on_the_cpu_is_a_plain_move() -> None:
    t = torch.arange(5)
    assert to_device(t, torch.device("cpu")) is t and to_device(t, "cpu") is t


def test_torch_threads_sets_and_restores_the_previous_value() -> None:
    torch.set_num_threads(2)
    with torch_threads(1):
        assert torch.get_num_threads() == 1
        with torch_threads(2):  # nested change inside a change
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="inside"):
        with torch_threads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == 2
    pin_torch_threads(1)
    assert torch.get_num_threads() == 1


def test_torch_threads_is_a_no_op_at_the_current_value(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)

    def must_not_be_called(n: int) -> None:
        raise AssertionError(f"set_num_threads({n}) called although torch already runs with that many")

    monkeypatch.setattr(torch, "set_num_threads", must_not_be_called)
    with torch_threads(1), torch_threads(1), torch_threads(None):
        assert torch.get_num_threads() == 1


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_torch_threads_rejects_bad_counts(n) -> None:
    with pytest.raises(ValueError, match="threads"):
        with torch_threads(n):
            pass


class _ProcessWideSetting:
    """torch.get/set_num_threads as one process-wide value (the native backend's semantics) whose setter
    yields the CPU, so that an unguarded toggle is interleaved with other threads' blocks."""

    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value

    def set(self, n: int) -> None:
        time.sleep(0)
        self.value = n
        time.sleep(0)


@pytest.mark.parametrize("setting", ["torch", "process-wide"])
def test_concurrent_blocks_each_see_their_own_thread_count(setting: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads, each 60 blocks, all started together: at the pinned value (1, concurrent readers),
    at another value (2, exclusive), and a change nested in a block at the pinned value (1 → 2 → 1).
    Inside every block, checked several times with sleeps between, the count is the block's own."""
    torch.set_num_threads(1)
    if setting == "process-wide":
        fake = _ProcessWideSetting(1)
        monkeypatch.setattr(torch, "get_num_threads", fake.get)
        monkeypatch.setattr(torch, "set_num_threads", fake.set)
    errors: list[str] = []
    start = threading.Barrier(4)

    def check(n: int, where: str) -> None:
        for _ in range(3):
            seen = torch.get_num_threads()
            if seen != n:
                errors.append(f"{where}: saw {seen} threads inside torch_threads({n})")
            time.sleep(0.0002)

    def blocks(pattern: str) -> None:
        start.wait(timeout=ceiling(60))
        for i in range(60):
            if pattern == "nested":
                with torch_threads(1):
                    check(1, f"{pattern} {i} outer")
                    with torch_threads(2):
                        check(2, f"{pattern} {i} inner")
                    check(1, f"{pattern} {i} outer after")
            else:
                n = 1 if pattern == "pinned" else 2
                with torch_threads(n):
                    check(n, f"{pattern} {i}")

    workers = [threading.Thread(target=blocks, args=(p,), daemon=True)
               for p in ("pinned", "pinned", "other", "nested")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=ceiling(300))  # a ceiling that only catches a deadlock (tests/ceilings.py)
    assert not any(w.is_alive() for w in workers), "torch_threads deadlocked"
    assert not errors, errors[:5]
    assert torch.get_num_threads() == 1
