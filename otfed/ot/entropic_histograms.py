"""Entropic OT between label histograms on a fixed support — KNOT's T_ε (eq. 1), batched over samples
and teachers.

KNOT (eq. 3) compares the student's prediction h_θ(x) ∈ Δ^C with each teacher's h_k(x) ∈ Δ^C
by the vanilla Sinkhorn distance of the papers' eq. 1,

    T_ε(μ, ν) = min_{P ∈ Π(μ, ν)} ⟨P, C⟩ + ε KL(P | μ⊗ν),

where both histograms live on the same C label points and C is the ground cost between labels
(:meth:`otfed.label_space.LabelSpace.cost_matrix`). A transfer batch of B samples and K teachers
is B·K independent C×C problems; they are solved together in one tensor program.

It is otfed's torch entropic solver, beside the NumPy semi-dual Newton solver for one problem between point
clouds: :func:`otfed.ot.semidual.semidual_plan` (a small support against a large one; FedWaD) and
:func:`otfed.ot.semidual.entropic_potentials` (the potentials of FedBary's calibrated gradients at a given ε,
:func:`otfed.valuation.calibrated.dual_potential`). They solve
min ⟨P, C⟩ + ε KL(P | μ⊗ν) through dual potentials, but their ε (absolute here and in ``entropic_potentials``,
relative to the mean cost in ``semidual_plan``), ε-scaling schedules, stopping rules and array layouts differ;
each is pinned to POT by its own tests, so they share no code.

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

**Solver.** All three solvers work in the log domain in float64 (inputs of any float dtype are
converted; results come back in the inputs' dtype), with ε-scaling: ε runs geometrically (factor
``eps_scaling``) from the largest label cost down to the requested ε, the potentials of one stage
warm-starting the next. ε is absolute, in the units of the cost (like POT's ``reg`` and geomloss's
``blur`` for p = 1).

- ``solver="fixed"`` maximises the same semi-dual as "newton" (below) with a *fixed program*
  made for GPUs, where the adaptive solver's read-backs (active sets, acceptance tests, ``.item()``)
  stall the device at every step: a plan of steps decided from ε and max C alone (:func:`_fixed_plan`:
  ε-scaling by 1/2; one predictor–corrector step per stage change — the Newton step and the solution
  path's tangent from one factorisation; two more Newton steps per stage in the band 2⁻⁹ ≤ ε/max C ≤
  2⁻², where the plan turns sparse and the path bends; eight at the final ε), every step taking, for
  every problem, the best of a fixed set of candidates evaluated together (:func:`_fixed_step`: full,
  damped, clipped and scaled Newton steps, the Sinkhorn step, staying; the best is the one with the
  highest J, ties within rounding going to the smallest marginal error — a ``torch.where``/argmin,
  never a Python branch). Every tensor has a shape fixed by (B, K, C) and the plan, the sequence of
  operations is the same for any values (``tests/ot/test_ot_histograms_fixed.py`` records it), and
  nothing is read back to the host between the input check (one read of the checks and max C) and the
  return: the marginal error and the ``converged`` flag are returned as tensors, and the loss's
  warning about them comes, on a GPU, one call later (see :func:`sinkhorn_histogram_loss`). The
  closed-form gradients below are unchanged. It does more arithmetic than "newton" (every problem
  runs every step with every candidate), so on a CPU it is slower (measured below). It is not the
  default: it was built for GPUs and has not been timed on one yet (``python -m
  bench.sinkhorn_backends --device cuda`` and ``python -m bench.distill_step --device cuda --solver
  fixed`` do that; ``gpu/gpu_session.sh`` runs them on a lent GPU machine).
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

**Measured, newton** on this project's 2 CPU cores, shared with other processes (``python -m
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

**Measured, fixed vs newton** on the same 2 shared CPU cores (``python -m bench.sinkhorn_backends``,
``python -m bench.distill_step``, ``python -m bench.sinkhorn_backends --convergence-sweep --seeds 0 1 2
--solvers fixed newton``; ``reports/bench/sinkhorn_backends.md``, ``distill_step.md``,
``sinkhorn_convergence.csv``). Forward + backward for B × 6 SA problems at ε = 0.1 / 0.01 / 0.001:
B = 32: 28 / 40 / 53 ms (newton 17 / 23 / 31 ms); B = 256: 171 / 246 / 322 ms (newton 45 / 67 / 95 ms).
Host reads per forward + backward: 1 (the input check) against newton's 113–289. Dispatched torch
operations per call (about one kernel launch each on a GPU): 3,800 / 5,400 / 6,400 (newton 3,600 /
5,300–7,000 / 7,100–10,300), so in eager mode a GPU still pays some ms of launch overhead per call;
what the fixed program adds is that it never waits for the device and runs the same operations
whatever the values (capturable, e.g. in a CUDA graph). Values within 1e-12 of POT's ``sinkhorn_log``
run to convergence (newton: 1e-9). In the training step (BERT-tiny-shaped student, torch's two
threads, load 2–3) the loss adds 0.03 / 0.05 / 0.05 s at batch 32 and 0.15 / 0.22 / 0.31 s at batch
256. Convergence sweep (float32 inputs; Dirichlet 1 / 0.1 / 0.03, softmax of N(0, 5²) and N(0, 10²)
logits, near-identical pairs, one-hot students against Dirichlet or smoothed one-hot teachers;
ε = 1e-1, 1e-2, 3e-3, 1e-3; seeds 0–2): on KNOT's costs (SA, ERC, NLI, one-hot ablation) 3 of
589,824 pairs end above the tolerance 1e-9 (worst 1.5e-6, Dirichlet(0.03) and N(0, 10²) histograms on
ERC's cost); on two costs KNOT does not use (the authors' 6-D coordinates, 7 random points) 17 of
294,912 (worst 7.5e-5); newton: none (153 s against 64 s in all).

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
and a ``converged`` flag (a 0-d tensor for "fixed"); :func:`sinkhorn_histogram_loss` warns or raises
when the budget runs out (for "fixed", whose budget is its plan: ``solver="newton"`` is the fallback).

Caveat: for μ = ν exactly (e.g. the LwF teacher at the start of distillation) at tiny ε the plan is
diagonal to working precision and the Newton system behind the ``value="transport"`` gradient is
singular; a ridge of 1e-12 (in mass-scaled units) keeps it finite — the gradient there is that of a
slightly regularised problem. ``value="regularized"`` (gradient f) has no such issue.
"""
from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from otfed.device import torch_threads
from otfed.errors import OTConvergenceError

SOLVERS = ("fixed", "newton", "sinkhorn")
DEFAULT_SOLVER = "newton"
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
# the fixed-shape solver (solver="fixed"); units of ε for the radii
_FIXED_SCALING = 0.5  # its ε-scaling factor
_FIXED_STEPS = ((2.0 ** -2, 0), (2.0 ** -9, 2), (0.0, 0))  # Newton steps of a stage: (least ε/max C, steps)
_FIXED_FINAL_STEPS = ((0.0, 8),)  # … of the last stage
_FIXED_DAMPING = (1e-6, 1e-3)  # Levenberg–Marquardt candidates
_FIXED_NEWTON_RADII = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # the Newton step clipped to these
_FIXED_DAMPED_RADII = (2.0, 8.0, 32.0)  # the least-damped step scaled to these
_FIXED_SHIFT_BOUND = 32.0  # moves up to this are evaluated from the step's exponentials
assert max(_FIXED_NEWTON_RADII + _FIXED_DAMPED_RADII) <= _FIXED_SHIFT_BOUND


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
    - ``n_steps``: solver steps taken in total (ε-scaling stages included; for "fixed", its plan's length).
    - ``converged``: every problem reached ``marginal_error ≤ tol`` — a bool, or for ``solver="fixed"`` a
      0-d bool tensor on the inputs' device (``bool()`` of it reads it back, on a GPU waiting for the solve).
    """

    cost: torch.Tensor
    regularized: torch.Tensor
    plan: torch.Tensor
    f: torch.Tensor
    g: torch.Tensor
    marginal_error: torch.Tensor
    n_steps: int
    converged: bool | torch.Tensor
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, float]:
    """(p as B×1×C, q as B×K×C, cost as C×C, whether q came as B×C, max C); raises ValueError on bad input.

    The values are checked, and max C read, in one read-back to the host (on a GPU, one synchronisation
    per call, before any solver work).
    """
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
    zero = torch.zeros((), dtype=_solve_dtype(p.device), device=p.device)
    flags = []
    for x in (p.detach(), q.detach()):
        flags += [(~torch.isfinite(x)).any().to(zero.dtype), (x < 0).any().to(zero.dtype),
                  (x.sum(-1).to(zero.dtype) - 1).abs().amax() if x.numel() else zero]
    c = cost.detach()
    flags += [((~torch.isfinite(c)) | (c < 0)).any().to(zero.dtype), c.amax().to(zero.dtype) if c.numel() else zero]
    values = torch.stack(flags).tolist()  # the one host read
    for name, (nonfinite, negative, mass_error) in (("p", values[0:3]), ("q", values[3:6])):
        if nonfinite:
            raise ValueError(f"histograms {name} contain NaN or inf")
        if negative:
            raise ValueError(f"histograms {name} have negative entries (pass probabilities, not logits)")
        if mass_error > _MASS_TOLERANCE:
            raise ValueError(f"histograms {name} must sum to 1 over the last axis (off by up to {mass_error:.3g})")
    if values[6]:
        raise ValueError("cost must be finite and non-negative")
    return p[:, None, :], q, cost, single, values[7]


def _eps_schedule(cmax: float, eps: float, eps_scaling: float) -> list[float]:
    """ε-scaling stages: max(C), max(C)·s, max(C)·s², … (all > ε), then ε itself (last entry)."""
    stages = []
    e = cmax
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
# the fixed-shape solver (solver="fixed"): the same semi-dual, a precomputed plan of steps, no host sync
#
# Potentials are carried as h = g/ε (units of ε): the logits are S = log ν + h − C/ε and J/ε replaces J.
# Every tensor has a shape fixed by the number of problems, C and the plan; every choice between steps
# is an argmin over candidates evaluated together, never Python control flow on values.


def _fixed_plan(
    cmax: float, eps: float, eps_scaling: float, final_steps: int | None = None
) -> list[tuple[float, float]]:
    """The fixed solver's steps as (ε of the linearisation, target ε) pairs, from ε and max C alone.

    Stages ε_0 = max C, ε_0·s, ε_0·s², … (all > ε), then ε (as :func:`_eps_schedule`). The move from one
    stage to the next is one predictor–corrector step (ε_k → ε_{k+1}); a stage then gets the number of
    plain Newton steps ``_FIXED_STEPS`` gives its ε/max C (two in the band where the plan turns from
    diffuse to nearly sparse and the solution path bends; none above it, where Newton is at home, or
    below it, where the predictor alone lands within rounding), and the last stage the number
    ``_FIXED_FINAL_STEPS`` gives, capped by ``final_steps``.
    """
    stages = _eps_schedule(cmax, eps, eps_scaling)

    def steps(table, ratio):
        return next(n for bound, n in table if ratio >= bound)

    plan = []
    for k, e in enumerate(stages):
        if k:
            plan.append((stages[k - 1], e))
        ratio = e / cmax if cmax > 0 else 1.0
        if k == len(stages) - 1:
            n = steps(_FIXED_FINAL_STEPS, ratio)
            n = n if final_steps is None else min(n, final_steps)
        else:
            n = steps(_FIXED_STEPS, ratio)
        plan.extend([(e, e)] * n)
    return plan


def _fixed_base(p, q, log_q, h, cost_e, with_plan=True):
    """At potentials h (units of ε; may carry a leading axis of candidates): (π, Pᵀ1, lse, J/ε, base).

    π is the conditional plan (None unless ``with_plan``), Pᵀ1 the column marginal, lse the row
    log-sum-exp of S = log ν + h − C/ε (``cost_e`` = C/ε), J/ε = ⟨ν, h⟩ − ⟨μ, lse⟩ the semi-dual, and
    ``base`` (with the plan) = (E = exp(S − max_j S), the row maxima), for :func:`_fixed_shifted`.
    """
    S = (log_q + h).unsqueeze(-2) - cost_e
    m = S.amax(-1, keepdim=True)
    E = (S - m).exp_()
    s = E.sum(-1, keepdim=True)
    lse = (m + s.log()).squeeze(-1)
    J = torch.linalg.vecdot(q, h) - torch.linalg.vecdot(p, lse)
    if not with_plan:
        return None, ((p / s.squeeze(-1)).unsqueeze(-2) @ E).squeeze(-2), lse, J, None
    pi = E / s
    return pi, (p.unsqueeze(-2) @ pi).squeeze(-2), lse, J, (E, m.squeeze(-1))


def _fixed_shifted(p, q, h, base, D):
    """(Pᵀ1, J/ε) at h + d for moves d (leading axis; problems flattened to N×C) of at most
    ``_FIXED_SHIFT_BOUND`` in every coordinate, from E = exp(S − max_j S) at h (``base``).

    exp(S_ij + d_j − max_j S_ij − max d) = E_ij·exp(d_j − max d): two small matrix products instead of
    a new exponential of every logit. Entries of E that underflowed (below e^−745 of their row's
    largest) stay below e^(−745 + 2·bound) of the shifted row's largest — far below rounding.
    """
    E, m = base
    top = D.amax(-1, keepdim=True)
    w = (D - top).exp_()
    s = torch.bmm(E, w.permute(1, 2, 0)).permute(2, 0, 1)  # Σ_j E_ij w_j
    col = w * torch.bmm((p / s).transpose(0, 1), E).transpose(0, 1)  # Σ_i (μ_i / s_i) E_ij w_j
    return col, torch.linalg.vecdot(q, h + D) - torch.linalg.vecdot(p, m + top + s.log())


def _fixed_step(p, q, log_q, log_q_floor, off, h, cost, eps_from, eps_to, max_step, constant):
    """One step of the fixed solver for all N problems: linearise at (h, ε_from), move to ε_to.

    With ρ = ε_from/ε_to the target potentials are h' = ρ(h + y₁) + (ρ − 1) y₂ (units of ε_to), where
    y₁ = R Â⁻¹ R ∇J is the Newton step at ε_from (:func:`_scaled_newton_matrix`) and
    y₂ = R Â⁻¹ R ε ∂(Pᵀ1)/∂ε the solution path's tangent (:func:`_predicted_potentials`), both from
    one factorisation. ρ = 1 is
    a plain Newton step. Candidates, evaluated together at ε_to:

    - staying (ρh); the full step; Levenberg–Marquardt steps with R (Â + λI)⁻¹ R ∇J, λ ∈
      ``_FIXED_DAMPING``; for ρ > 1 also the Newton step alone and the tangent alone;
    - the full step clipped to a largest coordinate of each of ``_FIXED_NEWTON_RADII``, and the
      least-damped step scaled to each of ``_FIXED_DAMPED_RADII`` (units of ε_to): near a sparse plan
      the full step overshoots, while far from the optimum J is exponentially flat along some
      directions that need moves of many ε and where the rounded Newton step may even point downhill;
    - for ρ = 1 the Sinkhorn step log ν − log Pᵀ1, the exact maximiser of J along each h_j alone.

    Taken, per problem: among the candidates whose J/ε is within rounding of the best one, the one with
    the smallest marginal error (J never falls beyond rounding; near the optimum, where J cannot tell
    steps apart, the error decides). The old solver's eigendecomposition-based steps are left out (an
    eigensolver reads its convergence flag back to the host on a GPU).

    ``constant(values)`` gives a tuple of numbers as a tensor on the problems' device (made there once).
    Returns the new h (units of ε_to) and the marginal error ||Pᵀ1 − ν||₁ before the step.
    """
    cost_e = cost / eps_from
    pi, col, lse, J, base = _fixed_base(p, q, log_q, h, cost_e)
    grad = q - col
    error = grad.abs().sum(-1)
    # Â (:func:`_scaled_newton_matrix`, without its masks: off = 1 − s is 1 where ν_j = 0, and there
    # π_·j = Pᵀ1_j = 0, so the row and column of j reduce to the pinned 1 on the diagonal)
    m = torch.maximum(q, col) + off
    r = m.rsqrt()
    u = m.sqrt() * (1 - off)
    u = u / torch.linalg.vector_norm(u, dim=-1, keepdim=True).clamp_min(_TINY)
    X = pi * r.unsqueeze(-2)
    A = torch.diag_embed(col * r * r + off) + u.unsqueeze(-1) * u.unsqueeze(-2) - (X * p.unsqueeze(-1)).mT @ X
    rho = eps_from / eps_to
    rhs = (r * grad).unsqueeze(-1)
    if rho != 1.0:
        b = cost_e - h.unsqueeze(-2)  # (C − g)/ε = ε ∂S/∂ε at fixed g
        dcol = (p.unsqueeze(-2) @ (pi * (b - (pi * b).sum(-1, keepdim=True)))).squeeze(-2)
        rhs = torch.cat([rhs, (r * dcol).unsqueeze(-1)], -1)
    A = A + constant((0.0,) + _FIXED_DAMPING)[:, None, None, None] * constant("eye")
    y = torch.linalg.solve_ex(A, rhs)[0] * r.unsqueeze(-1)  # no error check: no host sync
    moves = y[..., 0] * rho  # Newton, then the damped steps
    if rho != 1.0:
        tangent = (rho - 1) * y[0, ..., 1]
        moves = torch.cat([moves + tangent, moves[:1], tangent.unsqueeze(0)])
    moves = torch.nan_to_num(moves).clamp_(-max_step, max_step)
    near = [torch.zeros_like(moves[:1])]  # moves of at most _FIXED_SHIFT_BOUND
    far = [moves]
    radii = tuple(t for t in _FIXED_NEWTON_RADII if t < max_step)
    if radii:
        step = moves[0]
        radii = constant(radii).unsqueeze(-1)
        near.append(step * (radii / step.abs().amax(-1).clamp_min(_TINY)).clamp_(max=1.0).unsqueeze(-1))
    radii = tuple(t for t in _FIXED_DAMPED_RADII if t < max_step)
    if radii:
        step = moves[1]
        radii = constant(radii).unsqueeze(-1)
        near.append(step * (radii / step.abs().amax(-1).clamp_min(_TINY)).unsqueeze(-1))
    if rho == 1.0:
        far.append((log_q_floor - col.clamp_min(_TINY).log()).unsqueeze(0))
    near, far = torch.cat(near), torch.cat(far)
    h0 = h * rho
    cost_to = cost / eps_to
    if rho != 1.0:  # the exponentials at the target ε around the rescaled potentials
        base = _fixed_base(p, q, log_q, h0, cost_to)[-1]
    col_n, J_n = _fixed_shifted(p, q, h0, base, near)
    _, col_f, _, J_f, _ = _fixed_base(p, q, log_q, h0 + far, cost_to, with_plan=False)
    D = torch.cat([near, far])
    J_c = torch.nan_to_num(torch.cat([J_n, J_f]), nan=-math.inf)
    tie = J_c >= J_c.amax(0) - _J_ROUNDING * (1 + max_step)
    best = torch.where(tie, (q - torch.cat([col_n, col_f])).abs().sum(-1), math.inf).argmin(0)
    return h0 + D.gather(0, best.unsqueeze(0).unsqueeze(-1).expand(1, *h.shape)).squeeze(0), error


def _fixed_solve(p, q, cost, plan, cmax):
    """Maximise the semi-dual of KNOT's eq. 1 (the papers' dual eq. 4 with f the soft c-transform of g) by
    the fixed plan (:func:`_fixed_plan`) for N problems p, q (N×C; ν's zeros allowed); returns the
    potentials g (N×C, in the units of the cost; 0 where ν = 0). No host synchronisation: every shape
    and every Python branch depends on N, C and the plan only."""
    support = q > 0
    off = (~support).to(q.dtype)
    log_q = _safe_log(q)
    log_q_floor = q.clamp_min(_TINY).log()
    h = (p.unsqueeze(-1) * cost).sum(-2) / plan[0][0]  # g_j = Σ_i μ_i C_ij, the solution's limit for ε → ∞
    scale = cmax if cmax > 0 else 1.0
    made = {"eye": torch.eye(q.shape[-1], dtype=q.dtype, device=q.device)}

    def constant(values):
        # made on the device by fill kernels: torch.tensor(list) would copy from the host, a synchronisation
        if values not in made:
            made[values] = torch.stack([torch.full((), v, dtype=q.dtype, device=q.device) for v in values])
        return made[values]

    for eps_from, eps_to in plan:
        h, _ = _fixed_step(p, q, log_q, log_q_floor, off, h, cost, eps_from, eps_to, scale / eps_to, constant)
    return torch.where(support, h * plan[-1][1], 0.0)


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
    w = torch.where(support, r * torch.linalg.solve_ex(A, (r * h)[..., None])[0][..., 0], 0.0)  # no host sync
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
    eps_scaling: float | None = None,
    solver: str = DEFAULT_SOLVER,
    threads: int | None = 1,
) -> HistogramTransport:
    """Solve KNOT's eq. 1 for every (sample, teacher) pair: plan, potentials, values and convergence.

    ``p`` (B×C) are student histograms, ``q`` (B×K×C, or B×C for one teacher) teacher histograms,
    ``cost`` the C×C ground cost, ``eps`` the absolute entropic regularisation (same units as the cost,
    like POT's ``reg`` and geomloss's ``blur`` for p = 1). ``solver``: "newton" (default; adaptive,
    active sets), "fixed" (a precomputed plan of steps with no host synchronisation, for GPUs) or
    "sinkhorn" (the papers' Algorithm 1) — see the module docstring. ``n_iter`` bounds the solver steps
    at the final ε (each ε-scaling stage adds a few; for "fixed" it caps the plan's last-stage steps,
    ``_FIXED_FINAL_STEPS``). ``eps_scaling``: the ε-scaling factor (default 0.5 for "fixed", 0.25
    otherwise). ``threads``: torch intra-op threads while solving (default 1, see the module docstring;
    None leaves torch's setting alone). ``cost`` and ``regularized`` are differentiable (once) w.r.t.
    ``p`` and ``q``; ``plan``, ``f``, ``g`` are not. With "fixed", ``converged`` is a 0-d bool tensor,
    left on the device (reading it waits for the solve).

    Parameters:
        p: B×C student histograms μ (each renormalised to sum 1 inside).
        q: B×K×C teacher histograms ν (or B×C for one teacher), on the same C labels.
        cost: the C×C ground cost between labels (:meth:`otfed.label_space.LabelSpace.cost_matrix`).
        eps: the absolute entropic regularisation ε of eq. 1 (> 0, in the cost's units).
        n_iter: the solver's step budget at the final ε (≥ 1).
        tol: the L1 tolerance on every problem's column marginal ||Pᵀ1 − ν||₁.
        eps_scaling: the ε-scaling factor in (0, 1); None for the solver's default.
        solver: "newton" (default), "fixed" or "sinkhorn".
        threads: torch intra-op threads during the solve (None: leave torch's setting).

    Returns:
        A :class:`HistogramTransport`: ``cost`` ⟨P, C⟩ and ``regularized`` (eq. 1's value), B×K (B for one
        teacher); ``plan`` B×K×C×C; the potentials ``f``, ``g``; ``marginal_error``, ``n_steps``, ``converged``.

    Raises ValueError for an unknown solver, ``n_iter`` < 1, ε ≤ 0, ``eps_scaling`` outside (0, 1), or
    histograms / a cost of the wrong shape or mass.

    One student and two teachers on five ratings (cost |i − j|), ε = 0.5: the plans, transport costs and eq. 1
    values are those of POT's log-domain Sinkhorn run to convergence (``ot.sinkhorn``, ``ot.sinkhorn2``), and
    ``regularized`` is ⟨P, C⟩ + ε KL(P | μ⊗ν) of that plan:

    >>> import numpy as np
    >>> import ot
    >>> cost = (torch.arange(5.0)[:, None] - torch.arange(5.0)[None, :]).abs().double()
    >>> p = torch.tensor([[0.1, 0.5, 0.2, 0.1, 0.1]], dtype=torch.float64)
    >>> q = torch.tensor([[[0.6, 0.1, 0.1, 0.1, 0.1], [0.05, 0.05, 0.4, 0.4, 0.1]]], dtype=torch.float64)
    >>> out = entropic_histogram_transport(p, q, cost, eps=0.5)
    >>> out.cost.shape, out.plan.shape, out.converged
    (torch.Size([1, 2]), torch.Size([1, 2, 5, 5]), True)
    >>> mu, nu, C = p[0].numpy(), q[0, 1].numpy(), cost.numpy()
    >>> P = ot.sinkhorn(mu, nu, C, 0.5, method="sinkhorn_log", stopThr=1e-12, numItermax=10_000)
    >>> bool(np.allclose(out.plan[0, 1].numpy(), P, atol=1e-9))
    True
    >>> reference = [ot.sinkhorn2(mu, t.numpy(), C, 0.5, method="sinkhorn_log", stopThr=1e-12, numItermax=10_000)
    ...              for t in q[0]]
    >>> bool(np.allclose(out.cost[0].numpy(), reference, atol=1e-9))
    True
    >>> kl = float((P * np.log(P / np.outer(mu, nu))).sum())
    >>> bool(abs(float(out.regularized[0, 1]) - ((P * C).sum() + 0.5 * kl)) < 1e-9)
    True
    """
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; allowed: {', '.join(SOLVERS)}")
    if n_iter < 1:
        raise ValueError(f"n_iter must be ≥ 1, got {n_iter!r}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be ≥ 1 or None, got {threads!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if eps_scaling is None:
        eps_scaling = _FIXED_SCALING if solver == "fixed" else 0.25
    if not 0 < eps_scaling < 1:
        raise ValueError(f"eps_scaling must lie in (0, 1), got {eps_scaling!r}")
    p3, q3, cost, single, cmax = _checked_inputs(p, q, cost)
    out_dtype = torch.promote_types(p.dtype, q.dtype)
    work = _solve_dtype(p.device)
    cost_w = cost.to(work)
    eps = float(eps)
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
        mu_flat, nu_flat = mu.expand(B, K, n).reshape(-1, n), nu.reshape(-1, n)
        # 1. the potentials, on the flattened B·K problems
        if solver == "fixed":
            plan = _fixed_plan(cmax, eps, eps_scaling, final_steps=n_iter)
            g_flat = _fixed_solve(mu_flat, nu_flat, cost_w, plan, cmax)
            steps = len(plan)
        else:
            solve = _newton_solve if solver == "newton" else _sinkhorn_solve
            g_flat, error, steps = solve(mu_flat, nu_flat, log_q.reshape(-1, n), support.reshape(-1, n), cost_w,
                                         _eps_schedule(cmax, eps, eps_scaling), n_iter, tol)
        g_star = g_flat.reshape(B, K, n)
        # 2. values at the converged potentials, and their gradients where needed
        plan, transport, regularized, f_star, grads = _values_and_gradients(mu, nu, log_q, support, g_star, cost_w,
                                                                             eps, needs_grad)
        if solver == "fixed":  # the error of the returned plan, and the flag, as tensors: no host sync
            error = torch.where(support, nu - plan.sum(-2), 0.0).abs().sum(-1)
            converged = (error <= tol).all()
        else:
            error = error.reshape(B, K)
            converged = bool((error <= tol).all())
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
        marginal_error=out(error),
        n_steps=steps,
        converged=converged,
        eps=eps,
        tol=tol,
    )


#: Convergence flags of "fixed" solves on a GPU not read yet: (event, host copy of (¬converged, worst), message).
_PENDING: deque = deque(maxlen=256)


def _unconverged_message(solver: str, eps: float, tol: float, n_iter: int, steps: int) -> str:
    """The warning for an unconverged solve, with a ``{worst}`` field for the worst marginal error."""
    if solver == "fixed":
        return (f"entropic OT (fixed, eps={eps:g}) did not reach marginal error {tol:g} within its plan of {steps} "
                "steps (worst {worst:.3g}); use solver='newton' (adaptive) or a larger eps")
    return (f"entropic OT ({solver}, eps={eps:g}) did not reach marginal error {tol:g} within n_iter={n_iter} "
            "steps (worst {worst:.3g}); raise n_iter or eps")


def _warn_pending(stacklevel: int) -> None:
    """Warn for the deferred convergence flags whose copies have arrived (no waiting)."""
    while _PENDING and _PENDING[0][0].query():
        _, flags, message = _PENDING.popleft()
        unconverged, worst = flags.tolist()
        if unconverged:
            warnings.warn(message.format(worst=worst), RuntimeWarning, stacklevel=stacklevel + 1)


def _check_convergence(result: HistogramTransport, solver: str, n_iter: int, on_unconverged: str) -> None:
    """Warn or raise for an unconverged solve. A "fixed" solve's flag on a CUDA device is, with "warn",
    copied to the host without waiting and checked at a later call (the warning comes one or more calls
    late); elsewhere it is read at once (on a CPU that costs nothing, with "raise" it waits)."""
    converged = result.converged
    deferred = torch.is_tensor(converged) and converged.device.type == "cuda" and on_unconverged == "warn"
    if deferred:
        flags = torch.stack([(~converged).to(result.marginal_error.dtype), result.marginal_error.max()])
        host = flags.to("cpu", non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        _PENDING.append((event, host, _unconverged_message(solver, result.eps, result.tol, n_iter, result.n_steps)))
        return
    if bool(converged):
        return
    message = _unconverged_message(solver, result.eps, result.tol, n_iter, result.n_steps).format(
        worst=float(result.marginal_error.max()))
    if on_unconverged == "raise":
        raise OTConvergenceError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def sinkhorn_histogram_loss(
    p: torch.Tensor,
    q: torch.Tensor,
    cost: torch.Tensor,
    eps: float,
    n_iter: int = 300,
    *,
    value: str = "transport",
    tol: float = DEFAULT_TOL,
    eps_scaling: float | None = None,
    solver: str = DEFAULT_SOLVER,
    on_unconverged: str = "warn",
    threads: int | None = 1,
) -> torch.Tensor:
    """T_ε(h_θ(x), h_k(x)) of KNOT eq. 3 for every sample and teacher: a B×K tensor (B if q is B×C).

    ``value="transport"`` (default) gives the entropic plan's transport cost ⟨P_ε, C⟩ (POT's
    ``sinkhorn2``), ``value="regularized"`` the papers' eq. 1 value ⟨P_ε, C⟩ + ε KL(P_ε | μ⊗ν) whose
    gradient is the dual potential f (appendix E). Differentiable w.r.t. ``p`` (and ``q``). If some
    problem has not converged, ``on_unconverged`` decides: "warn" (default; for the "fixed" solver on a
    GPU the flag is checked without waiting, and the warning comes at a later call), "raise"
    (:class:`otfed.errors.OTConvergenceError`) or "ignore". Arguments as in
    :func:`entropic_histogram_transport`.

    Parameters:
        p: B×C student histograms h_θ(x) (the loss is differentiable w.r.t. them).
        q: B×K×C teacher histograms h_k(x), or B×C for one teacher.
        cost: the C×C ground cost between labels.
        eps: the absolute entropic regularisation ε of eq. 1 (> 0).
        n_iter: the solver's step budget at the final ε.
        value: "transport" (⟨P_ε, C⟩, default) or "regularized" (eq. 1's value).
        tol: the L1 tolerance on every problem's column marginal.
        eps_scaling: the ε-scaling factor in (0, 1); None for the solver's default.
        solver: "newton" (default), "fixed" or "sinkhorn".
        on_unconverged: "warn" (default), "raise" or "ignore".
        threads: torch intra-op threads during the solve (None: leave torch's setting).

    Returns:
        T_ε for every sample and teacher: a B×K tensor (B for one teacher) in the inputs' dtype, with a gradient.

    Raises ValueError for an unknown ``value`` or ``on_unconverged`` (and as
    :func:`entropic_histogram_transport`).

    At a small ε the transport cost is the exact W₁ between the histograms (POT's ``ot.emd2``) within the
    closed-form gap ε·log C, and it has a gradient w.r.t. the student:

    >>> import ot
    >>> cost = (torch.arange(5.0)[:, None] - torch.arange(5.0)[None, :]).abs().double()
    >>> p = torch.tensor([[0.1, 0.6, 0.2, 0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    >>> q = torch.tensor([[[1.0, 0, 0, 0, 0], [0, 0, 0.5, 0.5, 0]]], dtype=torch.float64)
    >>> loss = sinkhorn_histogram_loss(p, q, cost, eps=1e-3)
    >>> exact = torch.tensor([[ot.emd2(p[0].detach().numpy(), t.numpy(), cost.numpy()) for t in q[0]]])
    >>> loss.shape, bool(((loss - exact).abs() <= 1e-3 * math.log(5)).all())
    (torch.Size([1, 2]), True)
    >>> loss.sum().backward()
    >>> p.grad.shape
    torch.Size([1, 5])
    """
    if value not in VALUES:
        raise ValueError(f"unknown value {value!r}; allowed: {', '.join(VALUES)}")
    if on_unconverged not in ON_UNCONVERGED:
        raise ValueError(f"unknown on_unconverged {on_unconverged!r}; allowed: {', '.join(ON_UNCONVERGED)}")
    _warn_pending(stacklevel=2)
    result = entropic_histogram_transport(p, q, cost, eps, n_iter, tol=tol, eps_scaling=eps_scaling, solver=solver,
                                          threads=threads)
    if on_unconverged != "ignore":
        _check_convergence(result, solver, n_iter, on_unconverged)
    return result.cost if value == "transport" else result.regularized
