"""Entropic OT between label histograms on a fixed support — KNOT's T_ε (eq. 1), batched over samples
and teachers.

KNOT (SPEC §1, eq. 3) compares the student's prediction h_θ(x) ∈ Δ^C with each teacher's h_k(x) ∈ Δ^C
by the vanilla Sinkhorn distance of the papers' eq. 1,

    T_ε(μ, ν) = min_{P ∈ Π(μ, ν)} ⟨P, C⟩ + ε KL(P | μ⊗ν),

where both histograms live on the same C label points and C is the ground cost between labels
(:meth:`otfed.label_space.LabelSpace.cost_matrix`). A transfer batch of B samples and K teachers
is B·K independent C×C problems; they are solved together in one tensor program.

It is otfed's torch entropic solver, beside the NumPy ones for one problem between point clouds:
:func:`otfed.ot.entropic.sinkhorn_log` (log-domain Sinkhorn; the potentials of FedBary's calibrated
gradients) and :func:`otfed.ot.semidual.semidual_plan` (semi-dual Newton for a small support against a
large one; FedWaD). All three solve min ⟨P, C⟩ + ε KL(P | μ⊗ν) through dual potentials, but their ε
(absolute here and in ``sinkhorn_log``, relative to the mean cost in ``semidual_plan``), ε-scaling
schedules, stopping rules (column vs row marginal) and array layouts differ, and each is pinned to POT
by its own tests, so they share no code.

**Which number is returned.** :func:`sinkhorn_histogram_loss` returns, by default, the *transport cost
of the entropic plan* ⟨P_ε, C⟩ (``value="transport"``). It is what POT's ``ot.sinkhorn2`` returns, it
is measured in units of the label cost, it is ≥ the exact W₁ and tends to it as ε → 0 with a closed-form
gap (⟨P_ε, C⟩ − W₁ ≤ ε·min(H(μ), H(ν)) ≤ ε log C), so the loss keeps the meaning "expected label
distance moved" of the papers' W₁ risk bound (Theorem 5.2). ``value="regularized"`` returns eq. 1 itself
(= the dual value of appendix E, eq. 4, ⟨μ, f⟩ + ⟨ν, g⟩ at the optimum).

**Gradients.** They are computed in closed form at the converged potentials, in the same pass as the
solve (no autograd there), and attached to the two values by a small autograd function whose backward
is one multiply-and-sum: no iterations are unrolled, and the graph holds only B×K×C tensors.

- ``value="regularized"``: the gradient w.r.t. the student histogram μ is the dual potential f
  (appendix E, Algorithm 1, line 10), and w.r.t. the teacher histogram ν it is g (envelope theorem).
- ``value="transport"``: the exact implicit-function derivative of ⟨P_ε(μ, ν), C⟩. With π_i the
  conditional plan of row i (π_ij = P_ij / μ_i), c_i = Σ_j π_ij C_ij the row's mean cost,
  h_k = Σ_i μ_i π_ik (C_ik − c_i), and M = diag(Pᵀ1) − Σ_i μ_i π_i π_iᵀ (ε times the Jacobian of the
  column marginal w.r.t. g): ∂/∂μ_i = c_i − π_iᵀ w and ∂/∂ν = w, where M w = h — one C×C solve per
  problem (derivation: differentiate Pᵀ1 = ν at fixed point; the direct terms in ν cancel).

In both cases the histograms are renormalised to sum 1 inside, so gradients are those of
μ ↦ T(μ/Σμ, ν/Σν): they are orthogonal to the all-ones vector (only mass-preserving directions are
meaningful). Only first derivatives are available (no double backward); ``plan``, ``f`` and ``g`` of
:class:`HistogramTransport` are returned without gradient.

**Solver.** Both solvers work in the log domain in float64 (inputs of any float dtype are converted;
results come back in the inputs' dtype), with ε-scaling: ε runs geometrically (factor ``eps_scaling``)
from the largest label cost down to the requested ε, the potentials of one stage warm-starting the
next. ε is absolute, in the units of the cost (like POT's ``reg`` and geomloss's ``blur`` for p = 1).

- ``solver="newton"`` (default) maximises the entropic semi-dual J(g) = ⟨ν, g⟩ + ⟨μ, f(g)⟩, where
  f_i(g) = −ε LSE_j(log ν_j + (g_j − C_ij)/ε) is the exact soft c-transform (so the plan's row
  marginals are always exact). Each problem has only C unknowns. The potentials start at
  g_j = Σ_i μ_i C_ij, the solution's limit as ε → ∞, and each ε-scaling stage starts from the
  previous stage's solution moved along the solution path's tangent dg/dε (predictor–corrector
  continuation, one C×C solve per problem and stage), so a stage needs one to three steps. A step
  solves the mass-scaled Newton system by a batched Cholesky factorisation and is taken where it
  behaves (J rises by at least a quarter of the quadratic model's prediction or, near the solution
  where J's rounding error hides that, the marginal error at least halves); the other problems get
  the best of a pseudo-inverse Newton step (from an eigendecomposition), damped (Levenberg–Marquardt)
  steps, shortened Newton steps, the Sinkhorn step g ← g + ε(log ν − log Pᵀ1) and long steps along
  J's flat directions — see :func:`_newton_step`. Far from the optimum, at small ε, J is
  exponentially flat along some directions (a row sending all its mass to one column, or a group of
  labels that must exchange a mass of 1e-8 with the others); that is where plain Newton overshoots
  and plain Sinkhorn crawls. Problems leave the active set as they converge.
- ``solver="sinkhorn"`` runs the papers' Algorithm 1 (alternating log-domain f- and g-updates) with the
  same ε-scaling, kept as an independent check. It needs thousands of iterations on many problems
  already at ε = 0.1 with SA's costs up to 4, and leaves a sizeable fraction unconverged after
  thousands of iterations at the papers' ε = 1e-3 (``tests/ot/test_ot_entropic_histograms.py``).

**Measured** on this project's 2 CPU cores, shared with other processes (``python -m
bench.distill_speed``, ``python -m bench.distill_step``, ``python -m bench.distill_speed
--convergence-sweep --seeds 0 1 2``): 1024 samples × 6 teachers × 5 labels, forward + backward, take
0.17 / 0.25 / 0.26 s at ε = 1e-1 / 1e-2 / 1e-3 (load ≈ 1; up to 0.6 s when other processes load the
cores), every problem to a marginal error ≤ 1e-9 (values within 1e-9 of POT's ``sinkhorn_log`` run to
convergence); the solver this one replaced (eigendecomposition at every step, ε-scaling from g = 0,
the gradient through an autograd Newton step) took 0.55 / 0.86 / 1.19 s side by side. In the
default training step (BERT-tiny-shaped student, batch 256 × 6 teachers, torch's default two
threads) the loss adds 0.07–0.09 s to a 1.6 s KL step (``reports/bench/distill_step.md``). On the
sweep's 331,776 random problems (Dirichlet 1 / 0.1 / 0.03 histograms, softmax of N(0, 5²) logits,
near-identical and one-hot pairs; SA, ERC and NLI costs; ε = 1e-1, 1e-2, 3e-3, 1e-3; seeds 0–2)
every one converged within the default budget (27 s in all; the replaced solver: 79 s and one
unconverged near-identical NLI pair).

**Threads.** The solve runs on one torch intra-op thread (``threads=1``, the default) through
:func:`otfed.device.torch_threads`: nothing is changed when torch already runs with one thread (a CPU
stage pins it), and otherwise the caller's setting is restored on return, with concurrent threads kept
from toggling it under each other. Its tensors are small (B·K·C² elements): intra-op threads gain
nothing there, and on a machine whose cores are shared with other processes every operation waits
for a descheduled thread — measured on 2 shared cores, the loss for 256 samples × 6 teachers took
≈ 7 s with torch's default two threads and ≈ 0.15 s with one, inside the same training step.
``threads=None`` leaves torch's setting alone.

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
from torch.autograd.function import once_differentiable

from otfed.device import torch_threads
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
_STAGE_STEPS = 3
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
    - ``plan`` (B, K, C, C): P_ij = μ_i ν_j exp((f_i + g_j − C_ij)/ε); row i = student label i (no gradient).
    - ``f``, ``g`` (B, K, C): dual potentials of the papers' eq. 4 (in the units of the cost; no gradient).
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


def _logits(log_q, g, cost, eps):
    """S_ij = log ν_j + (g_j − C_ij)/ε in one tensor operation on the C×C blocks (the solver's form)."""
    return (log_q + g / eps)[..., None, :] - cost / eps


def _row_lse(S):
    """Row log-sum-exp of S (no row may be all −inf: every ν has mass)."""
    m = S.amax(-1)
    return m + (S - m[..., None]).exp_().sum(-1).log_()


def _row_softmax(S):
    """(π = row softmax of S, row log-sum-exp of S) with one exponential pass."""
    m = S.amax(-1, keepdim=True)
    E = (S - m).exp_()
    s = E.sum(-1, keepdim=True)
    return E.div_(s), (m + s.log())[..., 0]


def _semidual_from_lse(p, q, g, lse, eps):
    """J(g) = ⟨ν, g⟩ + ⟨μ, f(g)⟩ with f = −ε·lse, given the row log-sum-exp of S (g_j with ν_j = 0 do
    not count)."""
    return (q * torch.where(q > 0, g, 0.0)).sum(-1) - eps * (p * lse).sum(-1)


def _semidual_value(p, q, log_q, g, cost, eps):
    """J(g) = ⟨ν, g⟩ + ⟨μ, f(g)⟩; g may carry extra leading (line-search) dimensions."""
    return _semidual_from_lse(p, q, g, _row_lse(_logits(log_q, g, cost, eps)), eps)


def _conditional_and_column(p, log_q, g, cost, eps):
    """π_{j|i} = P_ij / μ_i (rows sum to 1), the column marginal Pᵀ1 and the row log-sum-exp."""
    pi, lse = _row_softmax(_logits(log_q, g, cost, eps))
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
    X = pi * r[..., None, :]  # row i: R π_i
    D = u[..., :, None] * u[..., None, :]
    D.diagonal(dim1=-2, dim2=-1).add_(torch.where(support, col * r * r, 1.0))
    # Â = diag(r² Pᵀ1 + 1 − s) + u uᵀ − Σ_i μ_i (R π_i)(R π_i)ᵀ, the sum as one batched matrix product
    n = D.shape[-1]
    XtP = (X * p[..., None]).transpose(-1, -2).reshape(-1, n, n)
    return torch.baddbmm(D.reshape(-1, n, n), XtP, X.reshape(-1, n, n), alpha=-1).reshape(D.shape), r


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


def _flat_direction(eigenvalues, eigenvectors, r, grad, support):
    """The part of the Newton direction R ∇J along J's flat directions (eigenvalue ≤ ``_EIGEN_FLOOR``,
    dropped by :func:`_damped_steps`), as potentials scaled to a largest coordinate of 1 (0 if none)."""
    coefficients = (eigenvectors.transpose(-1, -2) @ (r * grad)[..., None])[..., 0]
    y = (eigenvectors @ torch.where(eigenvalues <= _EIGEN_FLOOR, coefficients, 0.0)[..., None])[..., 0]
    d = torch.where(support, r * y, 0.0)
    return d / d.abs().amax(-1, keepdim=True).clamp_min(_TINY)


def _long_step_lengths(eps: float, max_step: float) -> list[float]:
    """4ε, 16ε, 64ε, … below the largest cost, then the largest cost: lengths tried along flat directions."""
    lengths, t = [], 4 * eps
    while t < max_step:
        lengths.append(t)
        t *= 4
    return lengths + [max_step]


def _safeguarded_step(p, q, log_q, support, g, cost, eps, max_step, grad, J, A, r, col, slack):
    """The best of several candidate steps, for the problems whose Newton step was refused (see
    :func:`_newton_step`); g stays where none increases J."""
    eigenvalues, eigenvectors = torch.linalg.eigh(A)
    damping = torch.tensor(_DAMPING, dtype=q.dtype, device=q.device)
    steps = _damped_steps(eigenvalues, eigenvectors, r, grad, support, eps, damping, max_step)
    d = steps[0]  # the Newton step with the flat directions dropped (pseudo-inverse)
    sinkhorn = torch.where(support, eps * (log_q - torch.log(col.clamp_min(_TINY))), 0.0)
    flat = _flat_direction(eigenvalues, eigenvectors, r, grad, support)
    lengths = torch.tensor(_long_step_lengths(eps, max_step), dtype=q.dtype, device=q.device)
    candidates = g[None] + torch.cat([d[None], *(d[None] * t for t in _SHORTENED), steps[1:], sinkhorn[None],
                                      flat[None] * lengths[:, None, None]])
    Jc = torch.nan_to_num(_semidual_value(p, q, log_q, candidates, cost, eps), nan=float("-inf"))
    # without flat directions those candidates are g itself: they must not win ties against real steps
    Jc[-len(lengths):] = torch.where(flat.abs().amax(-1) > 0, Jc[-len(lengths):], float("-inf"))
    best = Jc.argmax(0)
    idx = torch.arange(len(g), device=q.device)
    best = torch.where(Jc[0] >= Jc[best, idx] - slack, 0, best)  # ties go to the Newton step
    improved = Jc[best, idx] >= J - slack
    return torch.where(improved[:, None], candidates[best, idx], g)


def _newton_step(p, q, log_q, support, g, cost, eps, max_step):
    """One safeguarded Newton step on the semi-dual for N problems.

    Returns (new g, marginal error before the step, marginal error after it — inf where unknown).

    The Newton step d = ε R Â⁻¹ R ∇J (see :func:`_scaled_newton_matrix`), solved by a batched
    Cholesky factorisation, is taken where the factorisation succeeds and either J rises by at least a
    quarter of the quadratic model's prediction ½ ∇J·d, or — near the solution, where that prediction
    is below J's rounding error and J cannot judge — the marginal error at least halves: most steps of
    most problems. For the others (:func:`_safeguarded_step`) Â is diagonalised and J is evaluated at
    these candidates, the best one being taken (ties within J's rounding error go to the first; g
    stays if none increases J):

    - the Newton step with the flat directions (eigenvalue ≤ 1e-13, where J is flat to working
      precision) dropped (pseudo-inverse), and that step shortened to d/4, d/16;
    - Levenberg–Marquardt steps ε R (Â + λI)⁺ R ∇J for λ = 1e-7 … 1: far from the optimum M can be
      (numerically) singular — a row that sends all its mass to one column makes J exponentially flat
      along some directions, which the Newton step ignores or overshoots; the damped steps are scaled
      gradient steps there;
    - the Sinkhorn step g ← g + ε(log ν − log Pᵀ1), the exact maximiser of J along each g_j alone,
      the right move for a column that receives (almost) no mass;
    - steps of 4ε, 16ε, … up to max C along the gradient's component in the flat directions: when a
      group of labels exchanges (almost) no mass with the others but must exchange a little (say
      1e-8), the group's potentials must move by many ε, which the steps above do about ε at a time.
    """
    pi, col, lse = _conditional_and_column(p, log_q, g, cost, eps)
    grad = torch.where(support, q - col, 0.0)
    error = grad.abs().sum(-1)
    J = _semidual_from_lse(p, q, g, lse, eps)
    slack = _J_ROUNDING * (1 + J.abs())  # J's rounding error
    A, r = _scaled_newton_matrix(p, pi, col, q, support)
    L, info = torch.linalg.cholesky_ex(A)
    y = torch.cholesky_solve((r * grad)[..., None], L)[..., 0]
    d = torch.where(support, eps * r * y, 0.0).clamp(-max_step, max_step)
    g_newton = g + d
    _, col_newton, lse_newton = _conditional_and_column(p, log_q, g_newton, cost, eps)
    error_newton = torch.where(support, q - col_newton, 0.0).abs().sum(-1)
    J_newton = _semidual_from_lse(p, q, g_newton, lse_newton, eps)
    predicted = 0.5 * (grad * d).sum(-1)
    judged = predicted > slack
    good = (info == 0) & torch.where(judged, J_newton - J >= 0.25 * predicted, error_newton <= 0.5 * error)
    new_g = torch.where(good[:, None], g_newton, g)
    error_after = torch.where(good, error_newton, float("inf"))
    k = (~good).nonzero()[:, 0]
    if len(k):
        new_g[k] = _safeguarded_step(p[k], q[k], log_q[k], support[k], g[k], cost, eps, max_step, grad[k], J[k],
                                     A[k], r[k], col[k], slack[k])
    return new_g, error, error_after


def _marginal_error(p, q, log_q, support, g, cost, eps):
    """||Pᵀ1 − ν||₁ of the plan of potentials g (rows are exact by construction)."""
    _, col, _ = _conditional_and_column(p, log_q, g, cost, eps)
    return torch.where(support, q - col, 0.0).abs().sum(-1)


def _predicted_potentials(p, q, log_q, support, g, cost, eps_from, eps_to, max_step):
    """Continuation predictor: g + (ε' − ε) dg/dε at the (near-)solution g for ε, kept where it does not
    lower J at ε'.

    Differentiating Pᵀ1 = ν along the solution path: (1/ε) M dg + ∂(Pᵀ1)/∂ε dε = 0, where
    ∂S_ij/∂ε = (C_ij − g_j)/ε² for S_ij = log ν_j + (g_j − C_ij)/ε; one Cholesky solve per problem.
    """
    pi, col, _ = _conditional_and_column(p, log_q, g, cost, eps_from)
    a = (cost - g[..., None, :]) / eps_from ** 2
    dcol = (p[..., None] * pi * (a - (pi * a).sum(-1, keepdim=True))).sum(-2)
    A, r = _scaled_newton_matrix(p, pi, col, q, support)
    L, info = torch.linalg.cholesky_ex(A)
    y = torch.cholesky_solve(torch.where(support, r * dcol, 0.0)[..., None], L)[..., 0]
    move = torch.where(support & (info == 0)[:, None], (eps_from - eps_to) * eps_from * r * y, 0.0)
    predicted = g + torch.nan_to_num(move).clamp(-max_step, max_step)
    J = _semidual_value(p, q, log_q, torch.stack([g, predicted]), cost, eps_to)
    return torch.where((J[1] >= J[0])[:, None], predicted, g)


def _newton_solve(p, q, log_q, support, cost, schedule, n_iter, tol):
    """Maximise the semi-dual J by safeguarded Newton with ε-scaling; returns (g, error, steps).

    The potentials start at g_j = Σ_i μ_i C_ij, the solution's limit for ε → ∞ (the plan tends to
    μ⊗ν); each later ε-scaling stage starts from the previous stage's potentials moved along the
    solution path's tangent (:func:`_predicted_potentials`). Intermediate stages run at most
    ``_STAGE_STEPS`` steps or until the marginal error is below ``_STAGE_TOL``; the last stage runs
    until ``tol`` or ``n_iter`` steps. Converged problems drop out of the active set.
    """
    N = q.shape[0]
    g = torch.where(support, (p[..., :, None] * cost).sum(-2), 0.0)
    error = torch.full((N,), float("inf"), dtype=q.dtype, device=q.device)
    max_step = float(cost.max()) if cost.numel() else 1.0
    steps = 0
    for stage, eps in enumerate(schedule):
        final = stage == len(schedule) - 1
        if stage:
            g = _predicted_potentials(p, q, log_q, support, g, cost, schedule[stage - 1], eps, max_step)
        budget, stage_tol = (n_iter, tol) if final else (_STAGE_STEPS, _STAGE_TOL)
        active = torch.arange(N, device=q.device)
        for _ in range(budget):
            new_g, err, err_after = _newton_step(p[active], q[active], log_q[active], support[active], g[active], cost,
                                                 eps, max_step)
            done_before = err <= stage_tol  # left as they are (their step is not needed)
            if final:
                error[active] = torch.where(done_before, err, err_after)
            moved = ~done_before
            if bool(moved.any()):
                g[active[moved]] = new_g[moved]
                steps += 1
            active = active[moved & (err_after > stage_tol)]
            if len(active) == 0:
                break
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
            f = -eps * _soft_ctransform(log_q, g, cost, eps)[1]
            g = -eps * torch.logsumexp(log_p[..., :, None] + (f[..., :, None] - cost) / eps, dim=-2)
            g = torch.where(support, g, 0.0)
            steps += 1
            if final and ((it + 1) % check_every == 0 or it == n_iter - 1):
                error = _marginal_error(p, q, log_q, support, g, cost, eps)
                if not bool((error > tol).any()):
                    break
    return g, error, steps


# ----------------------------------------------------------------------------------------------------
# values and gradients at the solution


class _ValueWithGradient(torch.autograd.Function):
    """A value of (μ, ν) computed without autograd, with its gradients: backward multiplies them by
    the incoming gradient (μ is B×1×C, shared by the K teachers; ν, the gradients and the value B×K…)."""

    @staticmethod
    def forward(ctx, mu, nu, value, grad_mu, grad_nu):
        ctx.save_for_backward(grad_mu, grad_nu)
        return value.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        grad_mu, grad_nu = ctx.saved_tensors
        go = grad_out[..., None]
        d_mu = (go * grad_mu).sum(-2, keepdim=True) if ctx.needs_input_grad[0] else None
        d_nu = go * grad_nu if ctx.needs_input_grad[1] else None
        return d_mu, d_nu, None, None, None


def _values_and_gradients(pw, qw, log_q, support, g, cost, eps, with_gradients):
    """Plan, values and (optionally) their gradients at the converged potentials g (module docstring).

    Returns (plan, transport cost, regularized value, f, gradients) with gradients = (∂cost/∂μ,
    ∂cost/∂ν, ∂reg/∂μ, ∂reg/∂ν), each B×K×C (μ's are per teacher, summed over K by the caller), or None.
    """
    S, lse = _soft_ctransform(log_q, g, cost, eps)
    pi = torch.exp(S - lse[..., None])
    plan = pw[..., :, None] * pi
    row_cost = (pi * cost).sum(-1)  # c_i = Σ_j π_ij C_ij
    transport = (pw * row_cost).sum(-1)
    f = -eps * lse
    g = torch.where(support, g, 0.0)
    regularized = (pw * f).sum(-1) + (qw * g).sum(-1)
    if not with_gradients:
        return plan, transport, regularized, f, None
    # implicit derivative of ⟨P, C⟩: ∂/∂μ_i = c_i − π_iᵀ w, ∂/∂ν = w, with M w = h (module docstring)
    h = (plan * (cost - row_cost[..., None])).sum(-2)
    col = plan.sum(-2)
    A, r = _scaled_newton_matrix(pw, pi, col, qw, support)
    A = A + _RIDGE * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    w = torch.where(support, r * torch.linalg.solve(A, (r * h)[..., None])[..., 0], 0.0)
    grad_mu = row_cost - (pi @ w[..., None])[..., 0]
    return plan, transport, regularized, f, (grad_mu, w, f, g)


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
    threads: int | None = 1,
) -> HistogramTransport:
    """Solve KNOT's eq. 1 for every (sample, teacher) pair: plan, potentials, values and convergence.

    ``p`` (B×C) are student histograms, ``q`` (B×K×C, or B×C for one teacher) teacher histograms,
    ``cost`` the C×C ground cost, ``eps`` the absolute entropic regularisation (same units as the cost,
    like POT's ``reg`` and geomloss's ``blur`` for p = 1). ``n_iter`` bounds the solver steps at the
    final ε (each ε-scaling stage adds at most a few). ``threads``: torch intra-op threads while
    solving (default 1, see the module docstring; None leaves torch's setting alone). See the module
    docstring for the solvers, the returned quantities and how gradients flow; ``cost`` and
    ``regularized`` are differentiable (once) w.r.t. ``p`` and ``q``; ``plan``, ``f``, ``g`` are not.
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; allowed: {', '.join(SOLVERS)}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be ≥ 1, got {n_iter!r}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be ≥ 1 or None, got {threads!r}")
    p3, q3, cost, single = _checked_inputs(p, q, cost)
    out_dtype = torch.promote_types(p.dtype, q.dtype)
    work = _solve_dtype(p.device)
    schedule = _eps_schedule(cost, eps, eps_scaling)
    cost_w = cost.to(work)
    eps_f = schedule[-1]
    B, K, n = q3.shape
    needs_grad = torch.is_grad_enabled() and (p3.requires_grad or q3.requires_grad)
    # the histograms are renormalised: gradients are those of μ ↦ T(μ/Σμ, ν/Σν) (autograd, below)
    pw = p3.to(work)
    qw = q3.to(work)
    pw = pw / pw.sum(-1, keepdim=True)
    qw = qw / qw.sum(-1, keepdim=True)
    with torch_threads(threads), torch.no_grad():
        mu, nu = pw.detach(), qw.detach()
        support = nu > 0
        log_q = _safe_log(nu)
        # 1. the potentials, on the flattened B·K problems
        solve = _newton_solve if solver == "newton" else _sinkhorn_solve
        g_flat, error, steps = solve(mu.expand(B, K, n).reshape(-1, n), nu.reshape(-1, n), log_q.reshape(-1, n),
                                     support.reshape(-1, n), cost_w, schedule, n_iter, tol)
        g_star = g_flat.reshape(B, K, n)
        # 2. values at the converged potentials, and their gradients where needed
        plan, transport, regularized, f_star, grads = _values_and_gradients(mu, nu, log_q, support, g_star, cost_w,
                                                                             eps_f, needs_grad)
    if needs_grad:
        transport = _ValueWithGradient.apply(pw, qw, transport, grads[0], grads[1])
        regularized = _ValueWithGradient.apply(pw, qw, regularized, grads[2], grads[3])

    def out(x: torch.Tensor) -> torch.Tensor:
        x = x.to(out_dtype)
        return x[:, 0] if single and x.ndim >= 2 else x

    return HistogramTransport(
        cost=out(transport),
        regularized=out(regularized),
        plan=out(plan),
        f=out(f_star),
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
    threads: int | None = 1,
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
    result = entropic_histogram_transport(p, q, cost, eps, n_iter, tol=tol, eps_scaling=eps_scaling, solver=solver,
                                          threads=threads)
    if not result.converged and on_unconverged != "ignore":
        worst = float(result.marginal_error.max())
        message = (f"entropic OT ({solver}, eps={eps:g}) did not reach marginal error {tol:g} within n_iter={n_iter} "
                   f"steps (worst {worst:.3g}); raise n_iter or eps")
        if on_unconverged == "raise":
            raise OTConvergenceError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
    return result.cost if value == "transport" else result.regularized
