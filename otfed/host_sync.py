"""Which torch operations make the host wait for a GPU — a recorder for checking that code never does.

On a GPU, torch queues kernels and returns at once; the host waits ("synchronises") only where it needs a
value: reading one (``.item()``, ``bool()``, ``float()``, ``.tolist()``, ``.numpy()``), linear algebra that
checks its error flags on the host, and operations whose output shape depends on values (``nonzero``,
boolean indexing, ``masked_select``, ``unique``). A copy of host data to the device (``torch.tensor(list)``
on a GPU) blocks as well. Such a wait inside a hot loop stalls the device at every step.

:class:`HostSyncs` records, inside a ``with`` block, every such operation (``syncs``) and every dispatched
torch operation (``ops``; about one kernel launch each on a GPU). It works on the CPU too, where nothing
waits but the calls are the same: a test on a machine without a GPU can prove that a code path would not
synchronise on one (``tests/ot/test_ot_histograms_fixed.py``; ``bench/sinkhorn_backends.py`` counts them).
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: Python-level reads of tensor values.
HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__", "__index__"})
#: Dispatched operations that wait for the device: value reads, error-flag checks, value-dependent shapes.
SYNCING_OPS = frozenset({
    "aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default",
    "aten._linalg_check_errors.default", "aten.nonzero.default", "aten.masked_select.default",
    "aten.equal.default", "aten.allclose.default", "aten.unique_consecutive.default", "aten._unique2.default",
    "aten.lift_fresh.default",  # torch.tensor(data): a blocking copy from the host on a GPU
})


class _Functions(TorchFunctionMode):
    def __init__(self, syncs: list[str]):
        super().__init__()
        self.syncs = syncs

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


class _Dispatch(TorchDispatchMode):
    def __init__(self, syncs: list[str], ops: list[str]):
        super().__init__()
        self.syncs, self.ops = syncs, ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.ops.append(name)
        if name in SYNCING_OPS:
            self.syncs.append(name)
        if name == "aten.index.Tensor" and any(t is not None and t.dtype == torch.bool for t in args[1]):
            self.syncs.append("boolean indexing")
        return func(*args, **(kwargs or {}))


class HostSyncs:
    """Inside the block, ``syncs`` lists every operation that would make the host wait for a GPU and ``ops``
    every dispatched torch operation, in order."""

    def __enter__(self) -> HostSyncs:
        self.syncs: list[str] = []
        self.ops: list[str] = []
        self._modes = [_Functions(self.syncs), _Dispatch(self.syncs, self.ops)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
