"""Entropic OT between label histograms on a fixed support — KNOT's T_ε (eq. 1), batched over samples
and teachers.

KNOT (SPEC §1, eq. 3) compares the student's prediction h_θ(x) ∈ Δ^C with each teacher's h_k(x) ∈ Δ^C
by the vanilla Sinkhorn distance of the papers' eq. 1,

    T_ε(μ, ν) = min_{P ∈ Π(μ, ν)} ⟨P, C⟩ + ε KL(P | μ⊗ν),

where both histograms live on the same C label points and C is the ground cost between labels
(:meth:`otfed.distill.label_space.LabelSpace.cost_matrix`). A transfer batch of B samples and K teachers
is B·K independent C×C problems; they are solved together in one tensor program.

**Which number is returned.** :func:`sinkhorn_histogram_loss` returns, by default, the *transport cost
of the entropic plan* ⟨P_ε, C⟩ (``value="transport"``). It is what POT's ``ot.sinkhorn2`` returns, it
is measured in units of the label cost, it is ≥ the exact W₁ and tends to it as ε → 0 with a closed-form
gap (⟨P_ε, C⟩ − W₁ ≤ ε·min(H(μ), H(ν)) ≤ ε log C), so the loss keeps the meaning "expected label
distance moved" of the papers' W₁ risk bound (Theorem 5.2). ``value="regularized"`` returns eq. 1 itself
(= the dual value of appendix E, eq. 4, ⟨μ, f⟩ + ⟨ν, g⟩ at the optimum).

**Gradients.** For ``value="regularized"`` the gradient w.r.t. the student histogram μ is the dual
potential f (appendix E, Algorithm 1, line 10): the value is assembled as ⟨μ, f⟩ + ⟨ν, g⟩ with f, g the
converged potentials held fixed (envelope theorem). For ``value="transport"`` the gradient is the exact
implicit derivative of ⟨P_ε(μ, ν), C⟩ at the converged potentials: the value is evaluated after one extra
Newton step g ← g + ε A⁻¹ ∇J(g) taken from the converged, detached potentials; at a fixed point the
Newton map has zero Jacobian in g, so backpropagating through that one step gives exactly the implicit
function theorem's derivative (and its forward value is the converged one — the step is added as
``s − s.detach()``). No iterations are unrolled: memory does not grow with the iteration count. In both
cases the histograms are renormalised to sum 1 inside, so gradients are those of μ ↦ T(μ/Σμ, ν/Σν): they
are orthogonal to the all-ones vector (only mass-preserving directions are meaningful).

**Solver.** Both solvers work in the log domain (``torch.logsumexp``) in float64 (inputs of any float
dtype are converted; results come back in the inputs' dtype), with ε-scaling: ε runs geometrically
(factor ``eps_scaling``) from the largest label cost down to the requested ε, the potentials of one stage
warm-starting the next. ε is absolute, in the units of the cost (like POT's ``reg`` and geomloss's
``blur`` for p = 1).

- ``solver="newton"`` (default) maximises the entropic semi-dual J(g) = ⟨ν, g⟩ + ⟨μ, f(g)⟩, where
  f_i(g) = −ε LSE_j(log ν_j + (g_j − C_ij)/ε) is the exact soft c-transform (so the plan's row
  marginals are always exact). Each problem has only C unknowns: a step is a batched C×C
  eigendecomposition of the mass-scaled Hessian. The Newton step is taken when it behaves (quadratic
  model confirmed, no flat directions); otherwise the best of damped (Levenberg–Marquardt) steps,
  shortened Newton steps and the Sinkhorn step g ← g + ε(log ν − log Pᵀ1) — see :func:`_newton_step`.
  Far from the optimum, at small ε, J is exponentially flat along some directions (a row sending all
  its mass to one column); that is where plain Newton overshoots and plain Sinkhorn crawls. Problems
  leave the active set as they converge.
- ``solver="sinkhorn"`` runs the papers' Algorithm 1 (alternating log-domain f- and g-updates) with the
  same ε-scaling, kept as an independent check. It needs thousands of iterations on many problems
  already at ε = 0.1 with SA's costs up to 4, and leaves a sizeable fraction unconverged after
  thousands of iterations at the papers' ε = 1e-3 (``tests/distill/test_distill_sinkhorn.py``).

Measured (CPU, one thread; ``python -m bench.distill_speed [--convergence-sweep --seed S]``): 1024
samples × 6 teachers × 5 labels at ε = 1e-3 take ≈ 1 s, every problem to a marginal error ≤ 1e-9. On
the sweep's 3 × 82,944 random problems (Dirichlet 1 / 0.1 / 0.03 histograms, softmax of N(0, 5²)
logits, near-identical and one-hot pairs; SA, ERC and NLI costs; ε = 1e-2, 3e-3, 1e-3; seeds 0–2) one
did not converge within the default budget: a near-identical NLI pair at ε = 1e-3, stopped at 1e-7.

Threads: the tensors are small (B·K·C² elements), and on a machine shared with other processes torch's
intra-op threads can make them 10–50× slower (measured on 2 shared cores); call
``torch.set_num_threads(1)`` there (the benchmark and the tests do).

Convergence is checked per problem: the L1 error of the column marginal ||Pᵀ1 − ν||₁ (rows are exact by
construction) must fall below ``tol``. :class:`HistogramTransport` reports the error, the step count
and a ``converged`` flag; :func:`sinkhorn_histogram_loss` warns or raises when the budget runs out.

Caveat: for μ = ν exactly (e.g. the LwF teacher at the start of distillation) at tiny ε the plan is
diagonal to working precision and the Newton system behind the ``value="transport"`` gradient is
singular; a ridge of 1e-12 (in mass-scaled units) keeps it finite — the gradient there is that of a
slightly regularised problem. ``value="regularized"`` (gradient f) has no such issue.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from otfed.errors import OTConvergenceError

SOLVERS = ("newton", "sinkhorn")
VALUES = ("transport", "regularized")
ON_UNCONVERGED = ("warn", "raise", "ignore")

#: Default L1 tolerance on the column marginal ||Pᵀ1 − ν||₁ (the solve runs in float64).
DEFAULT_TOL = 1e-9
_DAMPING = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # Levenberg–Marquardt ladder (0 = Newton)
_EIGEN_FLOOR = 1e-13
_SHORTENED = (0.25, 0.0625)  # shortened Newton steps tried when the full one is refused
_J_ROUNDING = 1e-14
_STAGE_STEPS = 4
_STAGE_TOL = 1e-3
_TINY = 1e-300
_RIDGE = 1e-12  # guards the implicit-gradient solve against numerically disconnected plans
_MASS_TOLERANCE = 1e-2  # |Σ histogram − 1| above this is an input error (logits, wrong axis)


@dataclass(frozen=True)
class HistogramTransport:
    """Entropic OT between a batch of student histograms and K teacher histograms each (KNOT eq. 1).

    Shapes: B samples, K teachers, C labels. Tensors are in the inputs' dtype and on their device.

    - ``cost`` (B, K): transport cost ⟨P, C⟩ of the entropic plan; differentiable (see module doc).
    - ``regularized`` (B, K): ⟨P, C⟩ + ε KL(P | μ⊗ν) = ⟨μ, f⟩ + ⟨ν, g⟩ (eq. 1 = dual eq. 4 at optimum);
      its gradient w.r.t. μ is f (appendix E).
    - ``plan`` (B, K, C, C): P_ij = μ_i ν_j exp((f_i + g_j − C_ij)/ε); row i = student label i.
    - ``f``, ``g`` (B, K, C): dual potentials of the papers' eq. 4 (in the units of the cost).
    - ``marginal_error`` (B, K): ||Pᵀ1 − ν||₁ (rows are exact).
    - ``n_steps``: solver steps taken in total (ε-scaling stages included).
    - ``converged``: every problem reached ``marginal_error ≤ tol``.
    """

    cost: torch.Tensor
    regularized: torch.Tensor
    plan: torch.Tensor
    f: torch.Tensor
    g: torch.Tensor
    marginal_error: torch.Tensor
    n_steps: int
    converged: bool
    eps: float
    tol: float


# ----------------------------------------------------------------------------------------------------
# input handling


def _solve_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64


def _safe_log(x: torch.Tensor) -> torch.Tensor:
    """log x with log 0 = −inf and a zero (not NaN) gradient at the zeros."""
    positive = x > 0
    return torch.where(positive, torch.log(torch.where(positive, x, torch.ones_like(x))), float("-inf"))


def _checked_inputs(
    p: torch.Tensor, q: torch.Tensor, cost: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(p as B×1×C, q as B×K×C, cost as C×C, whether q came as B×C); raises ValueError on bad input."""
    if not (torch.is_tensor(p) and torch.is_tensor(q)):
        raise TypeError("p and q must be torch tensors")
    cost = torch.as_tensor(cost, device=p.device)
    if p.ndim != 2:
        raise ValueError(f"student histograms p must be B×C, got shape {tuple(p.shape)}")
    single = q.ndim == 2
    if single:
        q = q[:, None, :]
    if q.ndim != 3 or q.shape[0] != p.shape[0] or q.shape[-1] != p.shape[-1]:
        raise ValueError(f"teacher histograms q must be B×K×C or B×C matching p {tuple(p.shape)}, got {tuple(q.shape)}")
    n = p.shape[-1]
    if cost.shape != (n, n):
        raise ValueError(f"cost must be {n}×{n} for {n} labels, got {tuple(cost.shape)}")
    for name, x in (("p", p), ("q", q)):
        x = x.detach()
        if not torch.isfinite(x).all():
            raise ValueError(f"histograms {name} contain NaN or inf")
        if (x < 0).any():
            raise ValueError(f"histograms {name} have negative entries (pass probabilities, not logits)")
        mass_error = (x.sum(-1) - 1).abs().max().item() if x.numel() else 0.0
        if mass_error > _MASS_TOLERANCE:
            raise ValueError(f"histograms {name} must sum to 1 over the last axis (off by up to {mass_error:.3g})")
    if not torch.isfinite(cost).all() or (cost < 0).any():
        raise ValueError("cost must be finite and non-negative")
    return p[:, None, :], q, cost, single


def _eps_schedule(cost: torch.Tensor, eps: float, eps_scaling: float) -> list[float]:
    """ε-scaling stages: max(C), max(C)·s, max(C)·s², … (all > ε), then ε itself (last entry)."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if not 0 < eps_scaling < 1:
        raise ValueError(f"eps_scaling must lie in (0, 1), got {eps_scaling!r}")
    stages = []
    e = float(cost.max()) if cost.numel() else 0.0
    while e > eps:
        stages.append(e)
        e *= eps_scaling
    return stages + [float(eps)]


# ----------------------------------------------------------------------------------------------------
# the semi-dual (functions below broadcast over leading dimensions: N problems, or B×K)


def _soft_ctransform(log_q: torch.Tensor, g: torch.Tensor, cost: torch.Tensor, eps: float):
    """S_ij = log ν_j + (g_j − C_ij)/ε and its row log-sum-exp; f = −ε·lse (eq. 4's optimal f for g)."""
    S = log_q[..., None, :] + (g[..., None, :] - cost) / eps
    return S, torch.logsumexp(S, dim=-1)


def _semidual_value(p, q, log_q, g, cost, eps):
    """J(g) = ⟨ν, g⟩ + ⟨μ, f(g)⟩; g may carry extra leading (line-search) dimensions."""
    _, lse = _soft_ctransform(log_q, g, cost, eps)
    return (q * torch.where(q > 0, g, 0.0)).sum(-1) - eps * (p * lse).sum(-1)


def _conditional_and_column(p, log_q, g, cost, eps):
    """π_{j|i} = P_ij / μ_i (rows sum to 1) and the column marginal Pᵀ1."""
    S, lse = _soft_ctransform(log_q, g, cost, eps)
    pi = torch.exp(S - lse[..., None])
    return pi, (p[..., None] * pi).sum(-2), lse


def _scaled_newton_matrix(p, pi, col, q, support):
    """(Â, r): the Newton matrix of the semi-dual in mass-scaled coordinates, and the scaling r.

    −ε ∇²J = M = diag(Pᵀ1) − Σ_i μ_i π_i π_iᵀ is positive semi-definite with the constant vector on
    the support s = {j : ν_j > 0} in its kernel (adding a constant to g changes nothing). Its
    eigenvalues scale with the column masses, so it is rescaled (Jacobi) by r = 1/√m with
    m = max(ν, Pᵀ1): Â = R M R + u uᵀ + diag(1 − s), R = diag(r), u = √m/||√m|| on s. The rank-one
    term fixes the gauge (u spans the kernel of R M R and the scaled gradient R ∇J is orthogonal to
    it, so Newton steps are unchanged), diag(1 − s) pins the g_j that multiply ν_j = 0, and all
    entries of Â lie in [−1, 2]. A Newton step is d = ε R Â⁻¹ R ∇J.
    """
    m = torch.where(support, torch.maximum(q, col), 1.0).clamp_min(_TINY)
    r = torch.rsqrt(m)
    u = torch.where(support, m.sqrt(), 0.0)
    u = u / u.norm(dim=-1, keepdim=True).clamp_min(_TINY)
    M = torch.diag_embed(col) - (pi * p[..., None]).transpose(-1, -2) @ pi
    A = r[..., :, None] * M * r[..., None, :] + u[..., :, None] * u[..., None, :]
    return A + torch.diag_embed((~support).to(A.dtype)), r


def _damped_steps(eigenvalues, eigenvectors, r, grad, support, eps, damping, max_step):
    """Levenberg–Marquardt steps d_λ = ε R (Â + λI)⁺ R ∇J, one per λ in ``damping`` (leading axis).

    Directions with eigenvalue below ``_EIGEN_FLOOR`` are dropped (pseudo-inverse: J is flat there to
    working precision), and each coordinate is clipped to ±``max_step``.
    """
    coefficients = (eigenvectors.transpose(-1, -2) @ (r * grad)[..., None])[..., 0]  # N×C
    lam = eigenvalues.clamp_min(0)[None] + damping[:, None, None]  # L×N×C
    scaled = torch.where(lam > _EIGEN_FLOOR, coefficients[None] / lam.clamp_min(_EIGEN_FLOOR), 0.0)
    y = (eigenvectors[None] @ scaled[..., None])[..., 0]
    d = torch.where(support, eps * r * y, 0.0)
    return d.clamp(-max_step, max_step)


def _newton_step(p, q, log_q, support, g, cost, eps, max_step):
    """One safeguarded Newton step on the semi-dual for N problems; returns (new g, error before).

    The Newton step d = ε R Â⁺ R ∇J (see :func:`_scaled_newton_matrix`; the pseudo-inverse drops the
    directions with eigenvalue ≤ 1e-13, where J is flat to working precision) is taken where J rises by
    at least a quarter of the quadratic model's prediction ½ ∇J·d, that prediction exceeds J's
    rounding error, and at most 1% of the scaled gradient R ∇J lies along dropped directions.
    Elsewhere J is evaluated at these candidates and the best one is taken (ties within J's rounding
    error go to the Newton step; g stays if none increases J):

    - d/4, d/16 and Levenberg–Marquardt steps ε R (Â + λI)⁻¹ R ∇J for λ = 1e-7 … 1: far from the
      optimum M can be (numerically) singular — a row that sends all its mass to one column makes J
      exponentially flat along some directions, which the Newton step ignores or overshoots; the
      damped steps are scaled gradient steps there;
    - the Sinkhorn step g ← g + ε(log ν − log Pᵀ1), the exact maximiser of J along each g_j alone,
      the right move for a column that receives (almost) no mass.
    """
    pi, col, lse = _conditional_and_column(p, log_q, g, cost, eps)
    grad = torch.where(support, q - col, 0.0)
    error = grad.abs().sum(-1)
    J = (q * torch.where(support, g, 0.0)).sum(-1) - eps * (p * lse).sum(-1)
    A, r = _scaled_newton_matrix(p, pi, col, q, support)
    eigenvalues, eigenvectors = torch.linalg.eigh(A)
    damping = torch.tensor(_DAMPING, dtype=q.dtype, device=q.device)
    d = _damped_steps(eigenvalues, eigenvectors, r, grad, support, eps, damping[:1], max_step)[0]
    J_newton = _semidual_value(p, q, log_q, g + d, cost, eps)
    slack = _J_ROUNDING * (1 + J.abs())  # J's rounding error
    predicted = 0.5 * (grad * d).sum(-1)
    coefficients = (eigenvectors.transpose(-1, -2) @ (r * grad)[..., None])[..., 0]
    flat = (coefficients.square() * (eigenvalues <= _EIGEN_FLOOR)).sum(-1)
    good = (J_newton - J >= 0.25 * predicted) & (predicted > slack) & (flat <= 0.01 * coefficients.square().sum(-1))
    new_g = torch.where(good[:, None], g + d, g)
    k = (~good).nonzero()[:, 0]
    if len(k):
        steps = _damped_steps(eigenvalues[k], eigenvectors[k], r[k], grad[k], support[k], eps, damping[1:], max_step)
        sinkhorn = torch.where(support[k], eps * (log_q[k] - torch.log(col[k].clamp_min(_TINY))), 0.0)
        candidates = g[k][None] + torch.cat([d[k][None], *(d[k][None] * t for t in _SHORTENED), steps, sinkhorn[None]])
        Jc = torch.cat([J_newton[k][None], _semidual_value(p[k], q[k], log_q[k], candidates[1:], cost, eps)])
        best = Jc.argmax(0)
        idx = torch.arange(len(k), device=q.device)
        best = torch.where(Jc[0] >= Jc[best, idx] - slack[k], 0, best)
        improved = Jc[best, idx] >= J[k] - slack[k]
        new_g[k] = torch.where(improved[:, None], candidates[best, idx], g[k])
    return new_g, error


def _marginal_error(p, q, log_q, support, g, cost, eps):
    """||Pᵀ1 − ν||₁ of the plan of potentials g (rows are exact by construction)."""
    _, col, _ = _conditional_and_column(p, log_q, g, cost, eps)
    return torch.where(support, q - col, 0.0).abs().sum(-1)


def _newton_solve(p, q, log_q, support, cost, schedule, n_iter, tol):
    """Maximise the semi-dual J by safeguarded Newton with ε-scaling; returns (g, error, steps).

    Intermediate stages run at most ``_STAGE_STEPS`` steps or until the marginal error is below
    ``_STAGE_TOL``; the last stage runs until ``tol`` or ``n_iter`` steps. Converged problems drop
    out of the active set.
    """
    N = q.shape[0]
    g = torch.zeros_like(q)
    error = torch.full((N,), float("inf"), dtype=q.dtype, device=q.device)
    max_step = float(cost.max()) if cost.numel() else 1.0
    steps = 0
    for stage, eps in enumerate(schedule):
        final = stage == len(schedule) - 1
        budget, stage_tol = (n_iter, tol) if final else (_STAGE_STEPS, _STAGE_TOL)
        active = torch.arange(N, device=q.device)
        for _ in range(budget):
            new_g, err = _newton_step(p[active], q[active], log_q[active], support[active], g[active], cost, eps,
                                      max_step)
            if final:
                error[active] = err
            keep = err > stage_tol  # the others are left as they are (their step is not needed)
            active, new_g = active[keep], new_g[keep]
            if len(active) == 0:
                break
            g[active] = new_g
            steps += 1
        if final and len(active):  # budget spent: the error after the last step
            error[active] = _marginal_error(p[active], q[active], log_q[active], support[active], g[active],
                                            cost, eps)
    return g, error, steps


def _sinkhorn_solve(p, q, log_q, support, cost, schedule, n_iter, tol, check_every=10):
    """Alternating log-domain Sinkhorn (the papers' Algorithm 1) with ε-scaling; (g, error, steps)."""
    log_p = _safe_log(p)
    f = torch.zeros_like(q)
    g = torch.zeros_like(q)
    error = torch.full(q.shape[:1], float("inf"), dtype=q.dtype, device=q.device)
    steps = 0
    for stage, eps in enumerate(schedule):
        final = stage == len(schedule) - 1
        for it in range(n_iter if final else 1):
            f = -eps * torch.logsumexp(log_q[..., None, :] + (g[..., None, :] - cost) / eps, dim=-1)
            g = -eps * torch.logsumexp(log_p[..., :, None] + (f[..., :, None] - cost) / eps, dim=-2)
            g = torch.where(support, g, 0.0)
            steps += 1
            if final and ((it + 1) % check_every == 0 or it == n_iter - 1):
                error = _marginal_error(p, q, log_q, support, g, cost, eps)
                if not bool((error > tol).any()):
                    break
    return g, error, steps


# ----------------------------------------------------------------------------------------------------
# public API


def entropic_histogram_transport(
    p: torch.Tensor,
    q: torch.Tensor,
    cost: torch.Tensor,
    eps: float,
    n_iter: int = 300,
    *,
    tol: float = DEFAULT_TOL,
    eps_scaling: float = 0.25,
    solver: str = "newton",
) -> HistogramTransport:
    """Solve KNOT's eq. 1 for every (sample, teacher) pair: plan, potentials, values and convergence.

    ``p`` (B×C) are student histograms, ``q`` (B×K×C, or B×C for one teacher) teacher histograms,
    ``cost`` the C×C ground cost, ``eps`` the absolute entropic regularisation (same units as the cost,
    like POT's ``reg`` and geomloss's ``blur`` for p = 1). ``n_iter`` bounds the solver steps at the
    final ε (each ε-scaling stage adds at most a few). See the module docstring for the solvers, the
    returned quantities and how gradients flow; ``cost`` and ``regularized`` are differentiable w.r.t.
    ``p`` and ``q``.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; allowed: {', '.join(SOLVERS)}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be ≥ 1, got {n_iter!r}")
    p3, q3, cost, single = _checked_inputs(p, q, cost)
    out_dtype = torch.promote_types(p.dtype, q.dtype)
    work = _solve_dtype(p.device)
    schedule = _eps_schedule(cost, eps, eps_scaling)
    cost_w = cost.to(work)

    # 1. solve without autograd, on the flattened B·K problems
    B, K, n = q3.shape
    with torch.no_grad():
        pw = p3.detach().to(work)
        qw = q3.detach().to(work)
        pw = pw / pw.sum(-1, keepdim=True)
        qw = qw / qw.sum(-1, keepdim=True)
        p_flat = pw.expand(B, K, n).reshape(-1, n)
        q_flat = qw.reshape(-1, n)
        support = q_flat > 0
        log_q_flat = _safe_log(q_flat)
        solve = _newton_solve if solver == "newton" else _sinkhorn_solve
        g_flat, error, steps = solve(p_flat, q_flat, log_q_flat, support, cost_w, schedule, n_iter, tol)
        g_star = g_flat.reshape(B, K, n)

    # 2. differentiable evaluation at the converged potentials
    eps_f = schedule[-1]
    pw = p3.to(work)
    qw = q3.to(work)
    pw = pw / pw.sum(-1, keepdim=True)
    qw = qw / qw.sum(-1, keepdim=True)
    log_q = _safe_log(qw)
    support3 = support.reshape(B, K, n)
    # one Newton step, forward value unchanged, backward = implicit derivative (module docstring)
    pi, col, _ = _conditional_and_column(pw, log_q, g_star, cost_w, eps_f)
    grad = torch.where(support3, qw - col, 0.0)
    A, r = _scaled_newton_matrix(pw.detach().expand(B, K, n), pi.detach(), col.detach(), qw.detach(), support3)
    A = A + _RIDGE * torch.eye(n, dtype=A.dtype, device=A.device)
    step = torch.where(support3, eps_f * r * torch.linalg.solve(A, (r * grad)[..., None])[..., 0], 0.0)
    g1 = g_star + (step - step.detach())
    pi1, _, lse1 = _conditional_and_column(pw, log_q, g1, cost_w, eps_f)
    plan = pw[..., :, None] * pi1
    transport_cost = (plan * cost_w).sum((-1, -2))
    # regularized value ⟨μ, f⟩ + ⟨ν, g⟩ with f, g fixed: gradient w.r.t. μ is f (appendix E)
    _, lse_star = _soft_ctransform(log_q, g_star, cost_w, eps_f)
    f_star = -eps_f * lse_star
    # f_star carries ν's gradient through log ν; only μ's must see f as a constant
    regularized = (pw * f_star.detach()).sum(-1) + (qw * torch.where(support3, g_star, 0.0)).sum(-1) \
        + (pw.detach() * (f_star - f_star.detach())).sum(-1)

    def out(x: torch.Tensor) -> torch.Tensor:
        x = x.to(out_dtype)
        return x[:, 0] if single and x.ndim >= 2 else x

    return HistogramTransport(
        cost=out(transport_cost),
        regularized=out(regularized),
        plan=out(plan),
        f=out(f_star.detach()),
        g=out(g_star),
        marginal_error=out(error.reshape(B, K)),
        n_steps=steps,
        converged=bool((error <= tol).all()),
        eps=eps_f,
        tol=tol,
    )


def sinkhorn_histogram_loss(
    p: torch.Tensor,
    q: torch.Tensor,
    cost: torch.Tensor,
    eps: float,
    n_iter: int = 300,
    *,
    value: str = "transport",
    tol: float = DEFAULT_TOL,
    eps_scaling: float = 0.25,
    solver: str = "newton",
    on_unconverged: str = "warn",
) -> torch.Tensor:
    """T_ε(h_θ(x), h_k(x)) of KNOT eq. 3 for every sample and teacher: a B×K tensor (B if q is B×C).

    ``value="transport"`` (default) gives the entropic plan's transport cost ⟨P_ε, C⟩ (POT's
    ``sinkhorn2``), ``value="regularized"`` the papers' eq. 1 value ⟨P_ε, C⟩ + ε KL(P_ε | μ⊗ν) whose
    gradient is the dual potential f (appendix E). Differentiable w.r.t. ``p`` (and ``q``). If some
    problem has not converged within ``n_iter`` steps, ``on_unconverged`` decides: "warn" (default),
    "raise" (:class:`otfed.errors.OTConvergenceError`) or "ignore". Arguments as in
    :func:`entropic_histogram_transport`.
    """
    if value not in VALUES:
        raise ValueError(f"unknown value {value!r}; allowed: {', '.join(VALUES)}")
    if on_unconverged not in ON_UNCONVERGED:
        raise ValueError(f"unknown on_unconverged {on_unconverged!r}; allowed: {', '.join(ON_UNCONVERGED)}")
    result = entropic_histogram_transport(p, q, cost, eps, n_iter, tol=tol, eps_scaling=eps_scaling, solver=solver)
    if not result.converged and on_unconverged != "ignore":
        worst = float(result.marginal_error.max())
        message = (f"entropic OT ({solver}, eps={eps:g}) did not reach marginal error {tol:g} within n_iter={n_iter} "
                   f"steps (worst {worst:.3g}); raise n_iter or eps")
        if on_unconverged == "raise":
            raise OTConvergenceError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return result.cost if value == "transport" else result.regularized
