"""otfed.host_sync.HostSyncs against operations whose behaviour on a GPU is known: reading a value, boolean
indexing and nonzero (value-dependent shapes), a linear solve that checks its error flags (``solve``) and one
that does not (``solve_ex``), torch.tensor of host data — and pure arithmetic, which never waits."""
from __future__ import annotations

import torch

from otfed.host_sync import HostSyncs


def test_value_reads_and_value_dependent_shapes_are_recorded():
    x = torch.arange(6.0).reshape(2, 3)
    cases = [  # (operation, what must be among the recorded waits)
        (lambda: x.sum().item(), {"item", "aten._local_scalar_dense.default"}),
        (lambda: bool((x > 2).any()), {"__bool__", "aten._local_scalar_dense.default"}),
        (lambda: x[x > 2], {"boolean indexing"}),
        (lambda: torch.nonzero(x), {"aten.nonzero.default"}),
        (lambda: torch.tensor([1.0, 2.0]), {"aten.lift_fresh.default"}),
    ]
    for operation, expected in cases:
        with HostSyncs() as record:
            operation()
        assert expected <= set(record.syncs), (expected, record.syncs)


def test_arithmetic_and_unchecked_solves_never_wait_but_checked_ones_do():
    a = torch.eye(3, dtype=torch.float64) * 2 + 0.1
    b = torch.ones(3, 1, dtype=torch.float64)
    with HostSyncs() as quiet:
        y = torch.linalg.solve_ex(a, b)[0]
        torch.where(y > 0, y.exp(), y).sum(0)
    assert quiet.syncs == [] and len(quiet.ops) >= 5
    with HostSyncs() as checked:
        torch.linalg.solve(a, b)
    assert "aten._linalg_check_errors.default" in checked.syncs


def test_the_recorder_leaves_no_mode_behind():
    with HostSyncs():
        pass
    with HostSyncs() as outer:
        torch.ones(2).sum()
    assert outer.syncs == [] and outer.ops == ["aten.ones.default", "aten.sum.default"]
