"""The fixed-shape solver of KNOT's T_ε (``solver="fixed"``, otfed.ot.entropic_histograms): no host
synchronisation and no data-dependent control flow in its loop (proved on the CPU by recording what the
solve dispatches), and its values, gradients and marginals against POT (``ot.sinkhorn2`` /
``ot.sinkhorn`` in the log domain, ``ot.emd2`` for the ε → 0 limit, POT's autodiff through its own
iterations for the gradient) and against the adaptive Newton solver."""
from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import ot
import pytest
import torch

import otfed.ot.entropic_histograms as eh
from otfed.errors import OTConvergenceError
from otfed.host_sync import HostSyncs
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport, sinkhorn_histogram_loss

F64 = torch.float64
TASKS = ("sa", "erc", "nli")
EPS = (0.1, 0.01, 0.001)
# POT's log-domain Sinkhorn crawls at small ε (up to 20,000 iterations per reference at 1e-3): `make test-fast`
# compares with it at ε = 0.1 only
POT_EPS = (0.1, pytest.param(0.01, marks=pytest.mark.slow), pytest.param(0.001, marks=pytest.mark.slow))
# the solver's own checks take the most steps at ε = 1e-3: `make test-fast` stops at 1e-2
EPS_SLOW_SMALLEST = (0.1, 0.01, pytest.param(0.001, marks=pytest.mark.slow))


def _histograms(kind, n, batch, teachers, seed):
    """(p B×C, q B×K×C) float64: random (Dirichlet 1), near-one-hot (softmax of N(0, 10²) logits) or
    one-hot-ish (one-hot students, teachers one-hot smoothed by 1e-3)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        p, q = rng.dirichlet(np.ones(n), batch), rng.dirichlet(np.ones(n), (batch, teachers))
    elif kind == "near-one-hot":
        p = torch.softmax(torch.as_tensor(10 * rng.standard_normal((batch, n))), -1)
        q = torch.softmax(torch.as_tensor(10 * rng.standard_normal((batch, teachers, n))), -1)
    else:
        p = np.eye(n)[rng.integers(n, size=batch)]
        q = 0.999 * np.eye(n)[rng.integers(n, size=(batch, teachers))] + 0.001 / n
    return torch.as_tensor(p, dtype=F64), torch.as_tensor(q, dtype=F64)


def _solve_inputs(p, q, cost, eps):
    """The flattened problems, the plan and max C, as entropic_histogram_transport hands them to the solve."""
    p3, q3, cost, _, cmax = eh._checked_inputs(p, q, cost)
    B, K, n = q3.shape
    return (p3.expand(B, K, n).reshape(-1, n), q3.reshape(-1, n), cost, eh._fixed_plan(cmax, eps, eh._FIXED_SCALING),
            cmax)


# ------------------------------------------------------------------------------------------- no host sync
@pytest.mark.parametrize("eps", EPS)
def test_fixed_solve_has_no_host_sync_and_the_same_program_for_any_values(eps):
    """The hot loop reads nothing back and its sequence of operations depends on shapes only: the same
    ops, in the same order, for random, one-hot and identical histograms (so it can be captured once,
    e.g. in a CUDA graph, and replayed)."""
    cost = LabelSpace.for_task("sa").cost_matrix()
    programs = []
    for kind in ("random", "one-hot-ish", "near-one-hot"):
        p, q = _histograms(kind, 5, 8, 3, seed=1)
        if kind == "near-one-hot":
            q[:, 0] = p  # μ = ν for one teacher
        mu, nu, cost_t, plan, cmax = _solve_inputs(p, q, cost, eps)
        with HostSyncs() as record:
            eh._fixed_solve(mu, nu, cost_t, plan, cmax)
        assert record.syncs == [], record.syncs
        programs.append(record.ops)
    assert programs[0] == programs[1] == programs[2]
    assert len(programs[0]) > 100  # the recorder saw the solve


def test_a_fixed_call_reads_back_once_and_its_backward_never():
    """The whole call: one read, for the input checks (values and max C, in one .tolist()), then nothing —
    not the solve, not the values and gradients, not the convergence flag (a tensor), not the backward.
    The adaptive Newton solver, for contrast, reads back at every step."""
    cost = LabelSpace.for_task("erc").cost_matrix()
    p, q = _histograms("random", 5, 16, 6, seed=2)
    x = p.clone().requires_grad_(True)
    with HostSyncs() as call:
        result = entropic_histogram_transport(x, q, cost, 0.01, solver="fixed")
    assert call.syncs == ["tolist"]
    assert torch.is_tensor(result.converged) and result.converged.shape == ()
    with HostSyncs() as backward:
        result.cost.sum().backward()
    assert backward.syncs == []
    with HostSyncs() as newton:
        entropic_histogram_transport(p, q, cost, 0.01, solver="newton")
    assert len(newton.syncs) > 20


# ------------------------------------------------------------------------------------------- accuracy
def _pot(p, q, cost, eps, max_iter=20_000):
    """POT's log-domain Sinkhorn run to convergence: (⟨P, C⟩, P, POT's final marginal error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan, log = ot.sinkhorn(p.numpy(), q.numpy(), cost.numpy(), eps, method="sinkhorn_log", numItermax=max_iter,
                                stopThr=1e-13, log=True)
    return float((plan * cost.numpy()).sum()), plan, log["err"][-1]


@pytest.mark.parametrize("kind", ["random", "near-one-hot", "one-hot-ish"])
@pytest.mark.parametrize("eps", POT_EPS)
@pytest.mark.parametrize("task", TASKS)
def test_fixed_values_plans_and_marginals_match_pot(task, eps, kind):
    cost = LabelSpace.for_task(task).cost_matrix()
    n = cost.shape[0]
    p, q = _histograms(kind, n, 4, 2, seed=3)
    r = entropic_histogram_transport(p, q, cost, eps, solver="fixed")
    assert bool(r.converged) and float(r.marginal_error.max()) <= 1e-9
    np.testing.assert_allclose(r.plan.sum(-1).numpy(), p[:, None, :].expand_as(q).numpy(), atol=1e-12)  # rows exact
    np.testing.assert_allclose(r.plan.sum(-2).numpy(), q.numpy(), atol=1e-9)
    compared = 0
    for b in range(4):
        for k in range(2):
            value, plan, pot_error = _pot(p[b], q[b, k], cost, eps)
            if pot_error > 1e-10:  # POT did not converge within 20,000 iterations (it crawls at small ε)
                continue
            compared += 1
            assert float(r.cost[b, k]) == pytest.approx(value, abs=1e-8)
            np.testing.assert_allclose(r.plan[b, k].numpy(), plan, atol=1e-8)
    assert compared >= (6 if eps > 1e-3 else 1)


@pytest.mark.parametrize("task", TASKS)
def test_fixed_cost_tends_to_pots_exact_w1_within_the_entropic_bound(task):
    """0 ≤ ⟨P_ε, C⟩ − W1 ≤ ε·min(H(μ), H(ν)) (the papers' ε → 0 limit), W1 by ot.emd2."""
    cost = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms("random", cost.shape[0], 6, 3, seed=4)
    exact = torch.tensor([[ot.emd2(p[b].numpy(), q[b, k].numpy(), cost.numpy(), numItermax=10**7) for k in range(3)]
                          for b in range(6)], dtype=F64)
    entropy = lambda x: float(-(x[x > 0] * x[x > 0].log()).sum())
    for eps in EPS:
        r = entropic_histogram_transport(p, q, cost, eps, solver="fixed")
        bound = torch.tensor([[eps * min(entropy(p[b]), entropy(q[b, k])) for k in range(3)] for b in range(6)])
        gap = r.cost - exact
        assert torch.all(gap >= -1e-7) and torch.all(gap <= bound + 1e-7), eps


@pytest.mark.parametrize("eps", EPS_SLOW_SMALLEST)
@pytest.mark.parametrize("task", TASKS + ("one-hot",))
def test_fixed_agrees_with_the_adaptive_newton_solver(task, eps):
    """Two solvers with different step rules on the same problems; one-hot: the ablation's cost 2(1 − I)."""
    space = LabelSpace.for_task("sa" if task == "one-hot" else task)
    cost = (LabelSpace.one_hot(space) if task == "one-hot" else space).cost_matrix()
    for kind in ("random", "near-one-hot", "one-hot-ish"):
        p, q = _histograms(kind, cost.shape[0], 32, 6, seed=5)
        fixed = entropic_histogram_transport(p, q, cost, eps, solver="fixed")
        newton = entropic_histogram_transport(p, q, cost, eps, solver="newton")
        assert bool(fixed.converged) and newton.converged
        np.testing.assert_allclose(fixed.cost.numpy(), newton.cost.numpy(), atol=1e-8)
        np.testing.assert_allclose(fixed.regularized.numpy(), newton.regularized.numpy(), atol=1e-8)


@pytest.mark.parametrize("eps", [0.1, 0.05])
@pytest.mark.parametrize("task", TASKS)
def test_fixed_gradient_matches_pots_autodiff(task, eps):
    """∂⟨P_ε, C⟩/∂μ in closed form (module docstring) against POT's torch backend differentiating
    through its own Sinkhorn iterations, on mass-preserving directions (both projected: mean removed)."""
    cost = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms("random", cost.shape[0], 3, 1, seed=6)
    x = p.clone().requires_grad_(True)
    sinkhorn_histogram_loss(x, q, cost, eps, solver="fixed").sum().backward()
    for b in range(3):
        a = p[b].clone().requires_grad_(True)
        ot.sinkhorn2(a, q[b, 0], cost, eps, method="sinkhorn_log", numItermax=100_000, stopThr=1e-14).backward()
        ours, pots = x.grad[b] - x.grad[b].mean(), a.grad - a.grad.mean()
        np.testing.assert_allclose(ours.numpy(), pots.numpy(), atol=1e-7)


def _directional_check(loss, at, seed):
    g = torch.Generator().manual_seed(seed)
    x = at.clone().requires_grad_(True)
    loss(x).backward()
    for _ in range(3):
        direction = torch.randn(at.shape, generator=g, dtype=F64)
        direction -= direction.mean(-1, keepdim=True)
        h = 1e-6
        fd = (loss(at + h * direction) - loss(at - h * direction)) / (2 * h)
        assert float(abs(fd - (x.grad * direction).sum())) <= 1e-6 * (1 + float(x.grad.norm() * direction.norm()))


@pytest.mark.parametrize("value", ["transport", "regularized"])
@pytest.mark.parametrize("eps", EPS_SLOW_SMALLEST)
@pytest.mark.parametrize("task", TASKS)
def test_fixed_gradients_match_central_finite_differences(task, eps, value):
    """Both arguments (student μ and teacher ν), at every ε of the papers' range."""
    cost = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms("random", cost.shape[0], 3, 2, seed=7)
    weights = torch.randn(3, 2, generator=torch.Generator().manual_seed(8), dtype=F64)
    loss = partial(sinkhorn_histogram_loss, cost=cost, eps=eps, value=value, solver="fixed")
    _directional_check(lambda x: (loss(x, q) * weights).sum(), p, 9)
    _directional_check(lambda y: (loss(p, y) * weights).sum(), q, 10)


def test_fixed_handles_zeros_one_hot_pairs_and_float32():
    cost = LabelSpace.for_task("sa").cost_matrix()
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]], dtype=F64)
    q = torch.tensor([[[0.0, 0.0, 0.0, 0.3, 0.7], [0.5, 0.5, 0.0, 0.0, 0.0]],
                      [[0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0]]], dtype=F64)
    r = entropic_histogram_transport(p, q, cost, 1e-3, solver="fixed")
    assert bool(r.converged) and torch.isfinite(r.g).all()
    assert float(r.cost[1, 0]) == pytest.approx(4.0, abs=1e-12)  # one-hot to one-hot: |1 − 5|
    assert float(r.cost[1, 1]) == pytest.approx(0.0, abs=1e-12)
    for b, k in ((0, 0), (0, 1)):  # POT on the supports
        rows, cols = p[b] > 0, q[b, k] > 0
        value, _, _ = _pot(p[b][rows], q[b, k][cols], cost[rows][:, cols], 1e-3)
        assert float(r.cost[b, k]) == pytest.approx(value, abs=1e-8)
    x = p.float().requires_grad_(True)
    loss = sinkhorn_histogram_loss(x, q.float(), cost, 1e-3, solver="fixed")
    loss.sum().backward()
    assert loss.dtype == torch.float32 and torch.isfinite(x.grad).all()


def test_fixed_plan_is_decided_by_eps_and_the_largest_cost_only():
    plan = eh._fixed_plan(4.0, 1e-3, 0.5)
    stages = eh._eps_schedule(4.0, 1e-3, 0.5)
    assert [e for e, t in plan if e != t] == stages[:-1]  # one predictor–corrector step per stage change
    assert plan[-1] == (1e-3, 1e-3) and sum(1 for e, t in plan if e == t == 1e-3) == 8
    assert len(eh._fixed_plan(4.0, 1e-3, 0.5, final_steps=2)) == len(plan) - 6  # n_iter caps the last stage
    assert eh._fixed_plan(1.0, 5.0, 0.5) == [(5.0, 5.0)] * 8  # ε above every cost: Newton steps at ε only


def test_unconverged_fixed_solve_warns_or_raises_on_the_cpu_at_once():
    cost = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms("random", 5, 8, 2, seed=11)
    with pytest.warns(RuntimeWarning, match="fixed, eps=0.001.*solver='newton'"):
        sinkhorn_histogram_loss(p, q, cost, 1e-3, n_iter=1, eps_scaling=0.05, solver="fixed")
    with pytest.raises(OTConvergenceError):
        sinkhorn_histogram_loss(p, q, cost, 1e-3, n_iter=1, eps_scaling=0.05, solver="fixed", on_unconverged="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sinkhorn_histogram_loss(p, q, cost, 1e-3, n_iter=1, eps_scaling=0.05, solver="fixed",
                                on_unconverged="ignore")


# ------------------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fixed_solve_on_cuda_never_syncs_and_matches_the_cpu():
    cost = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms("random", 5, 64, 6, seed=12)
    mu, nu, cost_t, plan, cmax = _solve_inputs(p, q, cost, 1e-3)
    cpu = eh._fixed_solve(mu, nu, cost_t, plan, cmax)
    args = [t.cuda() for t in (mu, nu, cost_t)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        gpu = eh._fixed_solve(*args, plan, cmax)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    np.testing.assert_allclose(gpu.cpu().numpy(), cpu.numpy(), atol=1e-9)
