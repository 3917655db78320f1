"""The semi-dual solver keeps its promise on ``tol`` (otfed/ot/semidual.py): a returned plan's small-side marginal
is within ``tol`` (L1) of b, and a solve that cannot reach ``tol`` within ``max_newton`` steps raises
:class:`OTConvergenceError` — whatever the tolerance and the budget.

The failure is injected, not provoked by rounding: budgets of 1..12 Newton steps stop the solve at errors from
about 1 down to machine precision, and tolerances 1e-1..1e-12 put each of those errors on both sides of some
tol, so a check looser than tol (a stale factor, a wrong norm) lets some plan through with an error above it."""
from __future__ import annotations

import numpy as np

from otfed.errors import OTConvergenceError
from otfed.ot import cost_matrix, semidual_plan

TOLS = [10.0 ** -k for k in range(1, 13)]
BUDGETS = range(1, 13)


def test_a_returned_plan_always_meets_tol_and_a_short_budget_raises() -> None:
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(300, 2)), rng.normal(size=(6, 2)) + 1.0  # FedWaD's shape: n = 300 vs S = 6
    a, b = np.full(300, 1 / 300), np.full(6, 1 / 6)
    M = cost_matrix(X, Y, 2)
    outcomes = set()
    for tol in TOLS:
        for budget in BUDGETS:
            try:
                plan, _ = semidual_plan(a, b, M, tol=tol, max_newton=budget)
            except OTConvergenceError as err:
                assert f"> tol={tol:g}" in str(err) and f"(max_newton={budget})" in str(err)
                outcomes.add("raised")
                continue
            outcomes.add("returned")
            np.testing.assert_allclose(plan.sum(axis=1), a, rtol=0, atol=1e-15)  # the large side: exact
            error = np.abs(plan.sum(axis=0) - b).sum()
            assert error <= tol, f"tol={tol:g}, max_newton={budget}: a plan with marginal error {error:.3g}"
    assert outcomes == {"raised", "returned"}  # both sides of the promise were exercised
