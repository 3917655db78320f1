"""entropic_potentials (the potentials behind FedBary's datum values) against POT's log-domain Sinkhorn run far past
convergence, on weighted problems with either side the smaller one, and its convergence report."""
from __future__ import annotations

import numpy as np
import ot
import pytest

from otfed.ot.semidual import entropic_potentials


def _problem(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, 3)), rng.standard_normal((m, 3)) + 0.7
    return rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m)), ot.dist(x, y)


@pytest.mark.parametrize("n, m", [(50, 20), (20, 50), (30, 30)])
def test_potentials_match_a_tight_pot_sinkhorn(n: int, m: int) -> None:
    """POT's plan diag(u) K diag(v) at a column-marginal error < 1e-13 equals a⊗b·exp((f ⊕ g − M)/ε), so
    ε log u − ε log a = f and ε log v − ε log b = g up to one shared constant."""
    a, b, M = _problem(n, m, n + m)
    eps = 0.1 * M.mean()
    sol = entropic_potentials(a, b, M, eps, step_tol=1e-10 * M.mean())
    assert sol.converged and sol.step <= sol.step_tol and sol.newton_steps >= 1
    _, log = ot.bregman.sinkhorn_log(a, b, M, eps, numItermax=1_000_000, stopThr=1e-13, log=True)
    f_ref, g_ref = eps * log["log_u"] - eps * np.log(a), eps * log["log_v"] - eps * np.log(b)
    shift = np.mean(f_ref - sol.f)
    np.testing.assert_allclose(sol.f + shift, f_ref, atol=1e-9 * M.mean())
    np.testing.assert_allclose(sol.g - shift, g_ref, atol=1e-9 * M.mean())


def test_a_step_budget_that_is_too_small_is_reported_not_hidden() -> None:
    a, b, M = _problem(40, 30, 1)
    sol = entropic_potentials(a, b, M, 1e-3 * M.mean(), step_tol=1e-9, max_newton=2)
    assert sol.newton_steps == 2 and not sol.converged and sol.step > sol.step_tol
    with pytest.raises(ValueError, match="positive"):
        entropic_potentials(np.r_[a[:-1], 0.0] / a[:-1].sum(), b, M, 0.1, 1e-9)
