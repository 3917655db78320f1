"""Entropic OT by log-domain Sinkhorn iterations."""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp


def sinkhorn_log(
    a: np.ndarray, b: np.ndarray, M: np.ndarray, eps: float, max_iter: int = 10_000, tol: float = 1e-9
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Entropic OT plan argmin_{P ∈ Π(a,b)} <P, M> − ε H(P) by Sinkhorn in the log domain.

    This is the regularised problem behind KNOT's T_ε (eq. 1, inside eq. 3) and the entropic OT of
    Cuturi (2013); the plan is P_ij = exp((f_i + g_j − M_ij)/ε) with dual potentials f, g, and
    alternately
        f_i = ε log a_i − ε LSE_j((g_j − M_ij)/ε),   g_j = ε log b_j − ε LSE_i((f_i − M_ij)/ε),
    computed with a stable log-sum-exp (no under/overflow for small ε). After each g-update the column
    marginal is exact; iterations stop once the row-marginal error ||P1 − a||₁ ≤ ``tol``.
    (The same plan minimises <P, M> + ε KL(P | a⊗b), which differs from −εH(P) by a constant on Π(a,b).)

    Returns ``(plan, f, g, converged)``; ``converged`` is False if ``max_iter`` iterations ran out.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape != (a.shape[0], b.shape[0]):
        raise ValueError(f"cost matrix shape {M.shape} does not match marginals of lengths {a.shape} and {b.shape}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    with np.errstate(divide="ignore"):
        log_a, log_b = np.log(a), np.log(b)
    K = -M / eps  # log-kernel
    f = np.zeros_like(a)
    g = np.zeros_like(b)
    converged = False
    for _ in range(max_iter):
        # g-update makes the column marginal exact
        g = eps * (log_b - logsumexp(K + f[:, None] / eps, axis=0))
        lse_rows = logsumexp(K + g[None, :] / eps, axis=1)
        row_marginal = np.exp(f / eps + lse_rows)
        if float(np.abs(row_marginal - a).sum()) <= tol:
            converged = True
            break
        f = eps * (log_a - lse_rows)
    plan = np.exp(K + f[:, None] / eps + g[None, :] / eps)
    return plan, f, g, converged
