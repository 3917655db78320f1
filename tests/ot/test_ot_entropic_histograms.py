"""Batched entropic OT between label histograms (KNOT's T_ε) against POT, the exact W1, closed-form
bounds, finite differences and the papers' appendix E."""
import warnings

import numpy as np
import ot
import pytest
import torch

from otfed.errors import OTConvergenceError
from otfed.label_space import LabelSpace
from otfed.ot import entropic_histogram_transport, sinkhorn_histogram_loss

F64 = torch.float64
TASKS = ("sa", "erc", "nli")


def _histograms(n_labels, batch, teachers, seed):
    """Student (batch×C) and teacher (batch×teachers×C) histograms, Dirichlet(1) (normalised exponentials)."""
    g = torch.Generator().manual_seed(seed)
    draws = -torch.log(torch.rand(batch * (teachers + 1), n_labels, generator=g, dtype=F64))
    draws = draws / draws.sum(-1, keepdim=True)
    return draws[:batch], draws[batch:].reshape(batch, teachers, n_labels)


def _pot_cost(p, q, C, eps):
    return ot.sinkhorn2(p.numpy(), q.numpy(), C.numpy(), eps, method="sinkhorn_log", numItermax=200_000,
                        stopThr=1e-13)


def _entropy(x):
    x = x[x > 0]
    return float(-(x * torch.log(x)).sum())


@pytest.mark.parametrize("task", TASKS)
# POT's log-domain Sinkhorn is slower the smaller ε: `make test-fast` compares with it at ε = 0.5 only
@pytest.mark.parametrize("eps", [0.5, pytest.param(0.1, marks=pytest.mark.slow), pytest.param(0.05, marks=pytest.mark.slow)])
def test_transport_cost_and_plan_match_pot(task, eps):
    C = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms(C.shape[0], 3, 2, seed=1)
    result = entropic_histogram_transport(p, q, C, eps, tol=1e-12)
    assert result.converged
    for b in range(3):
        for k in range(2):
            assert abs(float(result.cost[b, k]) - _pot_cost(p[b], q[b, k], C, eps)) < 1e-6
            plan = ot.sinkhorn(p[b].numpy(), q[b, k].numpy(), C.numpy(), eps, method="sinkhorn_log",
                               numItermax=200_000, stopThr=1e-13)
            np.testing.assert_allclose(result.plan[b, k].numpy(), plan, atol=1e-7)
    # the plan's marginals and the dual form of the plan (papers' appendix E: π = exp((f⊕g−C)/ε)·μ⊗ν)
    np.testing.assert_allclose(result.plan.sum(-1).numpy(), p[:, None, :].expand_as(q).numpy(), atol=1e-12)
    np.testing.assert_allclose(result.plan.sum(-2).numpy(), q.numpy(), atol=1e-11)
    rebuilt = p[:, None, :, None] * q[:, :, None, :] * torch.exp(
        (result.f[..., :, None] + result.g[..., None, :] - C) / eps)
    np.testing.assert_allclose(rebuilt.numpy(), result.plan.numpy(), atol=1e-12)


def test_regularized_value_is_the_primal_objective_of_eq1():
    C = LabelSpace.for_task("erc").cost_matrix()
    p, q = _histograms(5, 4, 3, seed=2)
    eps = 0.05
    r = entropic_histogram_transport(p, q, C, eps, tol=1e-12)
    P = r.plan
    ref = p[:, None, :, None] * q[:, :, None, :]
    kl = (P * torch.log(P / ref) - P + ref).sum((-1, -2))
    np.testing.assert_allclose(r.regularized.numpy(), ((P * C).sum((-1, -2)) + eps * kl).numpy(), atol=1e-10)
    assert torch.all(r.regularized >= r.cost)


def _exact_w1(p, q, C, task):
    """W1 by the 1-D closed form Σ_l |F_μ(l) − F_ν(l)| for SA's unit-spaced line (POT's network simplex
    is off by up to ~4e-8 there), by POT's ot.emd2 otherwise."""
    if task == "sa":
        return (torch.cumsum(p[:, None, :], -1) - torch.cumsum(q, -1)).abs()[..., :-1].sum(-1)
    return torch.tensor([[ot.emd2(p[b].numpy(), q[b, k].numpy(), C.numpy(), numItermax=10**7)
                          for k in range(q.shape[1])] for b in range(q.shape[0])], dtype=F64)


@pytest.mark.parametrize("task", TASKS)
def test_cost_tends_to_exact_w1_within_the_entropic_bound(task):
    """0 ≤ ⟨P_ε, C⟩ − W1 ≤ ε·min(H(μ), H(ν)), shrinking with ε (the papers: ε → 0 gives W1)."""
    C = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms(C.shape[0], 4, 2, seed=3)
    exact = _exact_w1(p, q, C, task)
    previous, previous_slack = None, 0.0
    for eps in (1e-1, 1e-2, 1e-3, 1e-4):
        r = entropic_histogram_transport(p, q, C, eps)
        assert r.converged, (eps, r.marginal_error.max())
        gap = r.cost - exact
        bound = torch.tensor([[eps * min(_entropy(p[b]), _entropy(q[b, k])) for k in range(2)] for b in range(4)])
        # a plan whose column marginal is off by δ (L1) can undercut W1 by at most max(C)·δ
        slack = float(C.max() * r.marginal_error.max()) + (1e-12 if task == "sa" else 1e-7)
        assert torch.all(gap >= -slack) and torch.all(gap <= bound + slack)
        if previous is not None:
            assert torch.all(gap <= previous + slack + previous_slack)
        previous, previous_slack = gap, slack
    assert float(previous.abs().max()) < 1e-4


def test_authors_test_vector_at_eps_1e_3():
    """The authors' code's example: softmax([2,1,0,−1,−2]) vs [.1,.2,.3,.2,.2] on the authors' 6-D coordinates;
    exact W1 1.849592 and POT's sinkhorn_log transport cost 1.84959 at reg 1e-3 (geomloss's default
    ε-scaling stops at 1.550697, far from both)."""
    coords = torch.cat([torch.eye(5, dtype=F64), torch.arange(-2.0, 3.0, dtype=F64)[:, None]], dim=1)
    C = torch.cdist(coords, coords)
    p = torch.softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0]], dtype=F64), -1)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]], dtype=F64)
    exact = ot.emd2(p[0].numpy(), q[0].numpy(), C.numpy())
    value = float(sinkhorn_histogram_loss(p, q, C, 1e-3))
    assert exact == pytest.approx(1.849592, abs=1e-6)
    assert exact <= value <= exact + 1e-3 * np.log(5)
    assert value == pytest.approx(1.84959, abs=1e-5)


@pytest.mark.parametrize("task", TASKS)
def test_newton_converges_at_the_papers_eps_where_plain_sinkhorn_stalls(task):
    C = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms(C.shape[0], 64, 4, seed=4)
    newton = entropic_histogram_transport(p, q, C, 1e-3)
    assert newton.converged and float(newton.marginal_error.max()) <= 1e-9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sinkhorn = entropic_histogram_transport(p, q, C, 1e-3, n_iter=300, solver="sinkhorn")
    assert not sinkhorn.converged
    # both solve the same problem: where the papers' iterations converge (ε = 0.5) they agree
    a = entropic_histogram_transport(p, q, C, 0.5, tol=1e-11)
    b = entropic_histogram_transport(p, q, C, 0.5, n_iter=2000, tol=1e-11, solver="sinkhorn")
    assert a.converged and b.converged
    np.testing.assert_allclose(a.cost.numpy(), b.cost.numpy(), atol=1e-9)


def _assert_gradient_matches_central_finite_differences(loss, at, generator):
    """Autograd's gradient of ``loss`` at ``at`` against central differences along 3 random directions
    that keep every histogram's mass (only those are meaningful, see the module docstring)."""
    x = at.clone().requires_grad_(True)
    loss(x).backward()
    for _ in range(3):
        direction = torch.randn(at.shape, generator=generator, dtype=F64)
        direction -= direction.mean(-1, keepdim=True)  # stay on the simplex
        h = 1e-6
        fd = (loss(at + h * direction) - loss(at - h * direction)) / (2 * h)
        ad = (x.grad * direction).sum()
        assert float(abs(fd - ad)) <= 1e-6 * (1 + float(x.grad.norm() * direction.norm()))


@pytest.mark.parametrize("value", ["transport", "regularized"])
@pytest.mark.parametrize("eps", [0.1, 0.02])
@pytest.mark.parametrize("task", ["sa", "erc"])
def test_gradient_matches_central_finite_differences(task, eps, value):
    C = LabelSpace.for_task(task).cost_matrix()
    p, q = _histograms(5, 3, 2, seed=5)
    g = torch.Generator().manual_seed(6)
    weights = torch.randn(3, 2, generator=g, dtype=F64)
    loss = lambda x: (sinkhorn_histogram_loss(x, q, C, eps, value=value, tol=1e-13) * weights).sum()
    _assert_gradient_matches_central_finite_differences(loss, p, g)


@pytest.mark.parametrize("value", ["transport", "regularized"])
@pytest.mark.parametrize("eps", [0.1, 0.01])
@pytest.mark.parametrize("task", ["sa", "nli"])
def test_gradient_wrt_teacher_histograms_matches_central_finite_differences(task, eps, value):
    """∂/∂ν: the implicit derivative w of the transport cost (M w = h), the potential g for eq. 1."""
    C = LabelSpace.for_task(task).cost_matrix()
    n = C.shape[0]
    p, q = _histograms(n, 3, 2, seed=12)
    g = torch.Generator().manual_seed(13)
    weights = torch.randn(3, 2, generator=g, dtype=F64)
    loss = lambda y: (sinkhorn_histogram_loss(p, y, C, eps, value=value, tol=1e-13) * weights).sum()
    _assert_gradient_matches_central_finite_differences(loss, q, g)


def test_label_groups_that_must_exchange_a_tiny_mass_converge():
    """On SA's line the CDFs of μ and ν differ by only δ = 1e-8 at the cut between labels 2 and 3 (and
    between 4 and 5), so the plan must send δ across it: at ε = 1e-3 the potentials of the two groups
    must move apart by many ε along a direction where J is flat to working precision (a solver taking
    ε-sized steps there needs hundreds of them)."""
    C = LabelSpace.for_task("sa").cost_matrix()
    delta = 1e-8
    p = torch.tensor([[0.3, 0.2, 0.15, 0.15, 0.2]], dtype=F64)
    q = torch.tensor([[0.2, 0.3 + delta, 0.25, 0.05, 0.2 - delta]], dtype=F64)
    r = entropic_histogram_transport(p, q, C, 1e-3, n_iter=60)
    assert r.converged and float(r.marginal_error.max()) <= 1e-9
    exact = float(_exact_w1(p, q[:, None, :], C, "sa"))  # |F_μ − F_ν| summed: 0.1 + δ + (0.1 + δ) + δ
    assert exact == pytest.approx(0.2 + 3 * delta, abs=1e-15)
    bound = 1e-3 * min(_entropy(p[0]), _entropy(q[0]))
    assert -4 * 1e-9 <= float(r.cost) - exact <= bound + 4 * 1e-9
    assert float(r.plan[0, 2:, :2].sum()) == pytest.approx(delta, rel=0.05)  # the mass crossing the cut


def test_solve_runs_on_its_own_thread_setting_and_restores_the_callers():
    C = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms(5, 4, 2, seed=14)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        reference = sinkhorn_histogram_loss(p, q, C, 1e-2)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        for threads in (2, None):
            value = sinkhorn_histogram_loss(p, q, C, 1e-2, threads=threads)
            assert torch.get_num_threads() == 1
            np.testing.assert_allclose(value.numpy(), reference.numpy(), atol=1e-12)
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        sinkhorn_histogram_loss(p, q, C, 1e-2, threads=0)


def test_regularized_gradient_is_the_dual_potential_appendix_e():
    """Appendix E, Algorithm 1 line 10: ∂T_ε/∂h_θ(x) = f (here projected on the simplex: f − ⟨μ, f⟩)."""
    C = LabelSpace.for_task("nli").cost_matrix()
    p, q = _histograms(3, 4, 3, seed=7)
    x = p.clone().requires_grad_(True)
    r = entropic_histogram_transport(x, q, C, 0.01, tol=1e-12)
    r.regularized[:, 1].sum().backward()
    f = r.f[:, 1]
    np.testing.assert_allclose(x.grad.numpy(), (f - (p * f).sum(-1, keepdim=True)).numpy(), atol=1e-12)


def test_batch_over_samples_and_teachers_equals_per_problem_loop():
    C = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms(5, 6, 3, seed=8)
    batched = sinkhorn_histogram_loss(p, q, C, 1e-2)
    assert batched.shape == (6, 3)
    for b in range(6):
        for k in range(3):
            single = sinkhorn_histogram_loss(p[b:b + 1], q[b:b + 1, k], C, 1e-2)  # q as B×C → shape (B,)
            assert single.shape == (1,)
            assert float(single[0]) == pytest.approx(float(batched[b, k]), abs=1e-9)


def test_zeros_in_histograms_give_finite_values_and_gradients():
    C = LabelSpace.for_task("sa").cost_matrix()
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]], dtype=F64)
    q = torch.tensor([[[0.0, 0.0, 0.0, 0.3, 0.7], [0.5, 0.5, 0.0, 0.0, 0.0]],
                      [[0.0, 0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0]],
                      [[0.0, 0.0, 1.0, 0.0, 0.0], [0.1, 0.0, 0.4, 0.0, 0.5]]], dtype=F64)
    eps = 0.05
    for value in ("transport", "regularized"):
        x = p.clone().requires_grad_(True)
        loss = sinkhorn_histogram_loss(x, q, C, eps, value=value, tol=1e-12, on_unconverged="raise")
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(x.grad).all()
    transport = sinkhorn_histogram_loss(p, q, C, eps, tol=1e-12)
    # independent truth: POT on the problem restricted to the supports
    for b in range(3):
        for k in range(2):
            rows, cols = p[b] > 0, q[b, k] > 0
            ref = _pot_cost(p[b][rows], q[b, k][cols], C[rows][:, cols], eps)
            assert float(transport[b, k]) == pytest.approx(ref, abs=1e-7)
    transport = sinkhorn_histogram_loss(p, q, C, eps)
    assert float(transport[1, 0]) == pytest.approx(4.0, abs=1e-12)  # one-hot to one-hot: |1 − 5|
    assert float(transport[1, 1]) == pytest.approx(0.0, abs=1e-12)


def test_identical_histograms_cost_at_most_the_entropic_bound():
    C = LabelSpace.for_task("erc").cost_matrix()
    p, _ = _histograms(5, 4, 1, seed=9)
    x = p.clone().requires_grad_(True)
    r = entropic_histogram_transport(x, p[:, None, :], C, 1e-3)
    assert r.converged
    bound = torch.tensor([1e-3 * _entropy(p[b]) for b in range(4)])
    assert torch.all(r.cost[:, 0] >= 0) and torch.all(r.cost[:, 0] <= bound)
    (r.cost.sum() + r.regularized.sum()).backward()  # the LwF teacher at the start of distillation
    assert torch.isfinite(x.grad).all()


def test_float32_inputs_keep_their_dtype_and_the_float64_value():
    C = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms(5, 8, 2, seed=10)
    x = p.float().requires_grad_(True)
    loss32 = sinkhorn_histogram_loss(x, q.float(), C, 1e-3)
    loss32.sum().backward()
    assert loss32.dtype == torch.float32 and x.grad.dtype == torch.float32
    np.testing.assert_allclose(loss32.detach().numpy(), sinkhorn_histogram_loss(p, q, C, 1e-3).numpy(), atol=1e-5)


def test_unconverged_solve_warns_or_raises():
    C = LabelSpace.for_task("sa").cost_matrix()
    p, q = _histograms(5, 8, 2, seed=11)
    with pytest.warns(RuntimeWarning, match="did not reach"):
        sinkhorn_histogram_loss(p, q, C, 1e-3, n_iter=2, solver="sinkhorn")
    with pytest.raises(OTConvergenceError):
        sinkhorn_histogram_loss(p, q, C, 1e-3, n_iter=2, solver="sinkhorn", on_unconverged="raise")


@pytest.mark.parametrize(
    "p, q, cost, eps, match",
    [
        (torch.randn(2, 5, dtype=F64), torch.full((2, 5), 0.2, dtype=F64), None, 0.1, "negative"),
        (torch.full((2, 5), 0.3, dtype=F64), torch.full((2, 5), 0.2, dtype=F64), None, 0.1, "sum to 1"),
        (torch.full((2, 5), 0.2, dtype=F64), torch.full((3, 5), 0.2, dtype=F64), None, 0.1, "B×K×C"),
        (torch.full((2, 5), 0.2, dtype=F64), torch.full((2, 5), 0.2, dtype=F64), torch.zeros(3, 3), 0.1, "cost"),
        (torch.full((2, 5), 0.2, dtype=F64), torch.full((2, 5), 0.2, dtype=F64), None, 0.0, "eps"),
    ],
)
def test_bad_inputs_are_rejected(p, q, cost, eps, match):
    cost = LabelSpace.for_task("sa").cost_matrix() if cost is None else cost
    with pytest.raises(ValueError, match=match):
        sinkhorn_histogram_loss(p, q, cost, eps)


def test_unknown_options_list_the_allowed_ones():
    C = LabelSpace.for_task("sa").cost_matrix()
    p = torch.full((1, 5), 0.2, dtype=F64)
    with pytest.raises(ValueError, match="newton, sinkhorn"):
        sinkhorn_histogram_loss(p, p, C, 0.1, solver="lbfgs")
    with pytest.raises(ValueError, match="transport, regularized"):
        sinkhorn_histogram_loss(p, p, C, 0.1, value="dual")
