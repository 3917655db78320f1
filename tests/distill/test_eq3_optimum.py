"""Where KNOT's eq. 3 (eq. 4 of the confident-Sinkhorns draft) puts the student, against closed forms and
independent solvers, and the single-term mixture ablation beside it.

For one transfer sample, teachers q_1..q_K and normalised weights w̄_k, eq. 3 with the 1-D ordinal cost |i − j|
and ε → 0 is Σ_k w̄_k W1(q_k, p) = Σ_k w̄_k Σ_i |F_p(i) − F_k(i)| (W1 on a unit-spaced line is the L1 distance
between CDFs). The sum separates over the labels i, so it is minimised by the p whose CDF at each label is the
weighted median of the teachers' CDF values there — unique when no prefix of the sorted weights sums to exactly
½. KL's weighted sum Σ_k w̄_k KL(q_k || p) = KL(Σ_k w̄_k q_k || p) + const is minimised by the mixture
Σ_k w̄_k q_k. Independent truth here: a linear program over p AND the K transport plans jointly (scipy's HiGHS;
no CDF formula in it), a brute-force grid over the simplex, scipy.optimize for KL, and POT's exact ``ot.emd2``
for every W1 value. otfed's entropic loss is then checked against those: its value is ≥ the W1 sum everywhere
(a feasible plan costs at least the optimal one) and ≤ W1 sum + ε log C; on SA's line it is the W1 sum to solver
precision (≤ 1e-8), so the median minimises it to that tolerance; gradient descent through its implicit
gradients lands on the median (W1 sum within 5e-3 of the minimum, CDF within 0.01).
"""
from __future__ import annotations

import doctest
import itertools

import numpy as np
import ot
import pytest
import torch
from scipy.optimize import linprog, minimize

from otfed.distill import losses as losses_module
from otfed.distill.ensemble import TeacherEnsemble
from otfed.distill.losses import ensemble_loss, mixture_sinkhorn_loss
from otfed.distill.student import distill_student
from otfed.label_space import LabelSpace
from otfed.ot.entropic_histograms import sinkhorn_histogram_loss

F64 = torch.float64
SA = LabelSpace.for_task("sa")
COST = SA.cost_matrix().numpy()  # |i − j|: SA's labels sit at 1..5
C = 5
LOG_C = float(np.log(C))
SOLVER_SLACK = 1e-8  # otfed's plans meet their marginals to 1e-9 (L1); × max cost 4, with room


def _simplex_grid(step: int) -> np.ndarray:
    """Every histogram on C labels with masses in multiples of 1/step."""
    rows = [c for c in itertools.product(range(step + 1), repeat=C - 1) if sum(c) <= step]
    counts = np.array([list(c) + [step - sum(c)] for c in rows], dtype=float)
    return counts / step


GRID = _simplex_grid(20)  # 10,626 histograms


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Teacher histograms (K×C) and weights (K) of the test cases."""
    rng = np.random.default_rng(20240522)
    adjacent = np.exp(-2.0 * np.abs(np.arange(C) - np.array([2, 2, 1])[:, None]))  # one teacher off by one
    q1 = np.array([0.70, 0.20, 0.05, 0.03, 0.02])
    cases = {
        "adjacent-mistake-A": (adjacent / adjacent.sum(1, keepdims=True), np.full(3, 1 / 3)),
        "two-teachers-D": (np.stack([q1, q1[::-1]]), np.array([0.25, 0.75])),
    }
    for K, concentration in [(3, 1.0), (4, 1.0), (3, 0.3), (5, 0.3)]:
        cases[f"dirichlet-{K}x{concentration}"] = (rng.dirichlet(np.full(C, concentration), size=K),
                                                    rng.dirichlet(np.ones(K)))
    return cases


CASES = _cases()


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The smallest value whose cumulative weight (values sorted) reaches ½."""
    order = np.argsort(values, kind="stable")
    return float(values[order][np.searchsorted(np.cumsum(weights[order]), 0.5 - 1e-12)])


def median_is_unique(q: np.ndarray, w: np.ndarray) -> bool:
    F = np.cumsum(q, 1)[:, :-1]
    return all(np.abs(np.cumsum(w[np.argsort(F[:, i], kind="stable")])[:-1] - 0.5).min() > 1e-9
               for i in range(C - 1))


def median_student(q: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The histogram whose CDF is the weighted median of the teachers' CDFs at every label."""
    F = np.cumsum(q, 1)
    F_med = [weighted_median(F[:, i], w) for i in range(C - 1)] + [1.0]
    return np.diff(F_med, prepend=0.0)


def w1_sum(p: np.ndarray, q: np.ndarray, w: np.ndarray) -> float:
    """Σ_k w_k W1(q_k, p) with POT's exact network simplex."""
    total = 0.0
    for qk, wk in zip(q, w):
        value, log = ot.emd2(qk, p, COST, numItermax=10**7, log=True)
        assert log["warning"] is None, log["warning"]
        total += wk * float(value)
    return total


def lp_optimum(q: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """min over p ∈ Δ and plans P_k ∈ Π(q_k, p) of Σ_k w_k ⟨P_k, C⟩: one LP, solved by HiGHS."""
    K = len(w)
    n = C + K * C * C
    A, b = [], []
    row = np.zeros(n)
    row[:C] = 1.0
    A.append(row)
    b.append(1.0)
    for k in range(K):
        plan = C + k * C * C + np.arange(C * C).reshape(C, C)  # column indices of P_k (row i: teacher label)
        for i in range(C):
            row = np.zeros(n)
            row[plan[i]] = 1.0
            A.append(row)
            b.append(q[k, i])
        for j in range(C):
            row = np.zeros(n)
            row[plan[:, j]] = 1.0
            row[j] = -1.0
            A.append(row)
            b.append(0.0)
    c = np.concatenate([np.zeros(C)] + [wk * COST.ravel() for wk in w])
    result = linprog(c, A_eq=np.array(A), b_eq=np.array(b), bounds=(0, None), method="highs")
    assert result.status == 0, result.message
    return float(result.fun), result.x[:C]


def w1_sum_by_cdfs(P: np.ndarray, q: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ_k w_k Σ_i |F_p(i) − F_k(i)| for every row p of P (vectorised; checked against POT below)."""
    return (np.abs(np.cumsum(P, 1)[:, None, :] - np.cumsum(q, 1)[None]).sum(-1) * w).sum(-1)


def kl_sum(p: np.ndarray, q: np.ndarray, w: np.ndarray) -> float:
    with np.errstate(divide="ignore"):
        return float(sum(wk * np.sum(qk * (np.log(qk) - np.log(p))) for qk, wk in zip(q, w)))


def _teachers_for(P: np.ndarray, q: np.ndarray) -> torch.Tensor:
    return torch.tensor(q, dtype=F64)[None].expand(len(P), -1, -1)


# ---------------------------------------------------------------------------------------------------- truth


@pytest.mark.parametrize("name", CASES)
def test_the_w1_sum_is_minimised_at_the_weighted_median_of_the_teachers_cdfs(name):
    q, w = CASES[name]
    assert median_is_unique(q, w)
    p_med = median_student(q, w)
    assert (p_med >= 0).all() and p_med.sum() == pytest.approx(1.0, abs=1e-15)
    value, p_lp = lp_optimum(q, w)
    assert w1_sum(p_med, q, w) == pytest.approx(value, abs=1e-10)
    np.testing.assert_allclose(p_lp, p_med, atol=1e-8)  # the LP's minimiser is the median (it is unique)
    on_grid = w1_sum_by_cdfs(GRID, q, w)
    sample = np.random.default_rng(0).choice(len(GRID), 50, replace=False)
    np.testing.assert_allclose(on_grid[sample], [w1_sum(GRID[s], q, w) for s in sample], atol=1e-12)
    assert on_grid.min() >= value - 1e-12  # brute force: no grid histogram beats the median
    mixture = w @ q
    assert w1_sum(mixture, q, w) > value + 1e-3  # the mixture is not eq. 3's optimum


@pytest.mark.parametrize("name", CASES)
def test_the_kl_sum_is_minimised_at_the_mixture(name):
    q, w = CASES[name]
    mixture = w @ q
    found = minimize(kl_sum, np.full(C, 1 / C), args=(q, w), method="SLSQP", bounds=[(1e-12, 1.0)] * C,
                     constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0}],
                     options={"ftol": 1e-15, "maxiter": 1000})
    assert found.success, found.message
    np.testing.assert_allclose(found.x, mixture, atol=1e-5)
    best = kl_sum(mixture, q, w)
    assert min(kl_sum(p, q, w) for p in GRID[::7]) >= best
    # Σ_k w_k KL(q_k || p) = KL(m || p) + Σ_k w_k KL(q_k || m): the same function of p up to a constant
    p = np.random.default_rng(1).dirichlet(np.ones(C))
    assert kl_sum(p, q, w) == pytest.approx(kl_sum(p, mixture[None], np.ones(1)) + best, abs=1e-12)


# ---------------------------------------------------------------------------------------------------- otfed


@pytest.mark.parametrize("eps", [1e-2, pytest.param(1e-3, marks=pytest.mark.slow)])  # ε = 1e-3: the most steps
@pytest.mark.parametrize("name", CASES)
def test_otfeds_eq3_loss_is_the_w1_sum_on_sas_line_and_minimised_at_the_weighted_median(name, eps):
    """ensemble_loss (transport value ⟨P_ε, C⟩) lies between the W1 sum and W1 sum + ε log C (closed-form bound).
    On SA's unit-spaced line it is in fact the W1 sum to solver precision: the excess is twice the mass the
    entropic plan sends across a cut against the net flow, which the Gibbs kernel suppresses like e^{−1/ε}
    (measured: ≤ 1.5e-9 for ε ≤ 0.03 on these grids, up to 6.5e-5 at ε = 0.1). So on grid ∪ {median, mixture}
    its minimum is at the median to within 2 × 1e-8."""
    q, w = CASES[name]
    p_med, mixture = median_student(q, w), w @ q
    value, _ = lp_optimum(q, w)
    P = np.vstack([p_med, mixture, GRID[::3]])
    loss = ensemble_loss(torch.tensor(P, dtype=F64), _teachers_for(P, q), torch.tensor(w), cost=SA, eps=eps,
                         reduction="none").numpy()
    exact = w1_sum_by_cdfs(P, q, w)
    assert (loss >= exact - SOLVER_SLACK).all() and (loss <= exact + eps * LOG_C).all()  # the bound
    np.testing.assert_allclose(loss, exact, atol=SOLVER_SLACK, rtol=0)  # what it is on this cost
    assert loss[0] == pytest.approx(value, abs=SOLVER_SLACK)
    assert loss[0] <= loss.min() + 2 * SOLVER_SLACK
    assert loss[1] > loss[0] + 1e-3  # the mixture does worse


@pytest.mark.slow  # hundreds of Adam steps through the OT solver
def test_gradient_descent_on_otfeds_eq3_loss_finds_the_weighted_median():
    """Minimise ensemble_loss (ε = 0.01) over the student's logits through its implicit gradients — every case in
    one batch, teachers padded to the same K with weight 0 — by Adam (lr 0.1, then 0.01 for the last quarter):
    in every case the result's W1 sum (POT) is within 5e-3 of the LP's minimum and its CDF within 0.01 (L∞) of
    the median's (measured worst: 3.2e-3 and 3.3e-3), while the mixture's W1 sum is ≥ 0.05 above the minimum."""
    names = list(CASES)
    k_max = max(len(w) for _, w in CASES.values())
    teachers = np.full((len(names), k_max, C), 1 / C)
    weights = np.zeros((len(names), k_max))
    for b, name in enumerate(names):
        q, w = CASES[name]
        teachers[b, :len(w)], weights[b, :len(w)] = q, w
    z = torch.zeros(len(names), C, dtype=F64, requires_grad=True)
    optimizer = torch.optim.Adam([z], lr=0.1)
    for step in range(200):
        if step == 150:
            optimizer.param_groups[0]["lr"] = 0.01
        loss = ensemble_loss(torch.softmax(z, -1), torch.tensor(teachers), torch.tensor(weights), cost=SA, eps=0.01)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    found = torch.softmax(z, -1).detach().numpy()
    for b, name in enumerate(names):
        q, w = CASES[name]
        value, _ = lp_optimum(q, w)
        assert w1_sum(found[b], q, w) <= value + 5e-3, name
        assert np.abs(np.cumsum(found[b]) - np.cumsum(median_student(q, w))).max() <= 0.01, name
        assert w1_sum(w @ q, q, w) >= value + 0.05, name


@pytest.mark.parametrize("name", CASES)
def test_otfeds_kl_loss_is_stationary_at_the_mixture(name):
    """The KL loss's gradient at the mixture is normal to the simplex (all components equal, −1)."""
    q, w = CASES[name]
    mixture = torch.tensor(w @ q, dtype=F64)[None].requires_grad_(True)
    loss = ensemble_loss(mixture, torch.tensor(q, dtype=F64)[None], torch.tensor(w), kind="kl")
    loss.backward()
    np.testing.assert_allclose(mixture.grad.numpy()[0], -1.0, atol=1e-12)
    assert float(loss.detach()) == pytest.approx(kl_sum(w @ q, q, w), abs=1e-12)
    P = GRID[::7]
    on_grid = ensemble_loss(torch.tensor(P, dtype=F64), _teachers_for(P, q), torch.tensor(w), kind="kl",
                            reduction="none")
    assert float(on_grid.min()) >= float(loss.detach())


# ---------------------------------------------------------------------------------------------------- ablation


@pytest.mark.parametrize("name", CASES)
def test_the_mixture_ablation_is_minimised_at_the_mixture(name):
    """One OT term to the teachers' mixture: ≥ 0 everywhere, ≤ ε log C at the mixture, and at the median it is
    W1(median, mixture) (POT) to within ε log C."""
    q, w = CASES[name]
    eps = 1e-3
    p_med, mixture = median_student(q, w), w @ q
    P = np.vstack([mixture, p_med, GRID[::3]])
    loss = mixture_sinkhorn_loss(torch.tensor(P, dtype=F64), _teachers_for(P, q), torch.tensor(w), cost=SA, eps=eps,
                                 reduction="none").numpy()
    assert (loss >= -SOLVER_SLACK).all()
    assert loss[0] <= eps * LOG_C
    assert abs(loss[1] - ot.emd2(p_med, mixture, COST)) <= eps * LOG_C


def test_the_mixture_ablation_is_one_sinkhorn_term_against_the_weighted_mean():
    g = torch.Generator().manual_seed(7)
    student = torch.softmax(torch.randn(6, C, generator=g, dtype=F64), -1)
    teachers = torch.softmax(2 * torch.randn(6, 3, C, generator=g, dtype=F64), -1)
    weights = torch.rand(6, 3, generator=g, dtype=F64) + 0.1
    mixture = (weights[..., None] * teachers).sum(1) / weights.sum(1, keepdim=True)
    x = student.clone().requires_grad_(True)
    y = student.clone().requires_grad_(True)
    got = mixture_sinkhorn_loss(x, teachers, weights, cost=SA, eps=0.01, reduction="none")
    expected = sinkhorn_histogram_loss(y, mixture, SA.cost_matrix(), 0.01)
    assert torch.allclose(got, expected, atol=1e-12, rtol=0)
    got.sum().backward()
    expected.sum().backward()
    assert torch.allclose(x.grad, y.grad, atol=1e-12, rtol=0)
    expected = expected.detach()
    # weights are normalised: scaling them changes nothing; unnormalised, each sample counts Σ_k W_k times
    scaled = mixture_sinkhorn_loss(student, teachers, 3 * weights, cost=SA, eps=0.01, reduction="none")
    assert torch.allclose(scaled, expected, atol=1e-12, rtol=0)
    raw = mixture_sinkhorn_loss(student, teachers, weights, cost=SA, eps=0.01, normalize=False)
    assert float(raw) == pytest.approx(float((weights.sum(1) * expected).mean()), abs=1e-12)
    # per-teacher weights broadcast; no weights = the plain mean of the teachers; mean reduction
    per_teacher = mixture_sinkhorn_loss(student, teachers, weights[0], cost=SA.cost_matrix(), eps=0.01)
    by_hand = sinkhorn_histogram_loss(student, (weights[0, :, None] * teachers).sum(1) / weights[0].sum(),
                                      SA.cost_matrix(), 0.01).mean()
    assert float(per_teacher) == pytest.approx(float(by_hand), abs=1e-12)
    unweighted = mixture_sinkhorn_loss(student, teachers, cost=SA, eps=0.01, reduction="none")
    assert torch.allclose(unweighted, sinkhorn_histogram_loss(student, teachers.mean(1), SA.cost_matrix(), 0.01),
                          atol=1e-12, rtol=0)


def test_the_mixture_ablation_agrees_with_eq3_when_the_teachers_do():
    g = torch.Generator().manual_seed(8)
    student = torch.softmax(torch.randn(4, C, generator=g, dtype=F64), -1)
    one = torch.softmax(torch.randn(4, C, generator=g, dtype=F64), -1)
    weights = torch.rand(4, 3, generator=g, dtype=F64)
    for teachers, w in [(one, weights[:, :1]), (one[:, None].expand(-1, 3, -1), weights)]:
        eq3 = ensemble_loss(student, teachers, w, cost=SA, eps=0.01, reduction="none")
        ablation = mixture_sinkhorn_loss(student, teachers, w, cost=SA, eps=0.01, reduction="none")
        assert torch.allclose(ablation, eq3, atol=1e-10, rtol=0)


def test_the_mixture_ablation_gives_zero_for_a_sample_without_weight_and_names_bad_arguments():
    g = torch.Generator().manual_seed(9)
    student = torch.softmax(torch.randn(3, C, generator=g, dtype=F64), -1)
    teachers = torch.softmax(torch.randn(3, 2, C, generator=g, dtype=F64), -1)
    weights = torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.5, 0.0]], dtype=F64)
    x = student.clone().requires_grad_(True)
    for normalize in (True, False):
        per_sample = mixture_sinkhorn_loss(x, teachers, weights, cost=SA, eps=0.01, normalize=normalize,
                                           reduction="none")
        values = per_sample.detach()
        assert float(values[1]) == 0.0 and float(values[0]) > 0 and float(values[2]) > 0
    per_sample.sum().backward()
    assert torch.equal(x.grad[1], torch.zeros(C, dtype=F64)) and torch.isfinite(x.grad).all()
    with pytest.raises(ValueError, match="reduction"):
        mixture_sinkhorn_loss(student, teachers, cost=SA, eps=0.01, reduction="sum")
    with pytest.raises(ValueError, match="B×K×C"):
        mixture_sinkhorn_loss(student, teachers[:2], cost=SA, eps=0.01)
    with pytest.raises(ValueError, match="B×K"):
        mixture_sinkhorn_loss(student, teachers, weights[:, :1], cost=SA, eps=0.01)
    with pytest.raises(ValueError, match="non-negative"):
        mixture_sinkhorn_loss(student, teachers, -weights, cost=SA, eps=0.01)
    with pytest.raises(ValueError, match="label cost"):
        mixture_sinkhorn_loss(student, teachers, cost=None, eps=0.01)


def test_the_mixture_ablations_example_runs():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in finder.find(losses_module.mixture_sinkhorn_loss, "mixture_sinkhorn_loss",
                            globs=vars(losses_module).copy()):
        runner.run(test)
    assert runner.failures == 0 and runner.tries >= 4


# ---------------------------------------------------------------------------------------------------- training


class ConstantStudent:
    """A "classifier" whose logits are one trainable vector, the same for every input."""

    def __init__(self) -> None:
        self.model = torch.nn.Module()
        self.model.theta = torch.nn.Parameter(torch.zeros(C))

    def pretokenize(self, texts):
        return [0 for _ in texts]

    def collate(self, features):
        return len(features)

    def logits(self, n):
        return self.model.theta.expand(n, -1)

    def probs(self) -> np.ndarray:
        return torch.softmax(self.model.theta.detach(), -1).numpy()


@pytest.mark.slow  # two students trained for 80 epochs
def test_distilling_with_the_mixture_ablation_reaches_the_mixture_and_eq3_the_median():
    q, w = CASES["two-teachers-D"]  # median = the heavier teacher; mixture ¼ q1 + ¾ q2
    n = 16
    ensemble = TeacherEnsemble(("t1", "t2"), np.tile(q, (n, 1, 1)), np.array([100, 300]), None)
    weights = np.tile(w, (n, 1))
    students = {}
    for kind in ("sinkhorn_mixture", "sinkhorn"):
        students[kind] = ConstantStudent()
        distill_student(students[kind], [f"t{i}" for i in range(n)], ensemble, weights, kind=kind,
                        cost=SA.cost_matrix(), eps=0.01, epochs=80, batch_size=16, lr=0.1, weight_decay=0.0,
                        progress=False)
    ablation, eq3 = students["sinkhorn_mixture"].probs(), students["sinkhorn"].probs()
    assert ot.emd2(ablation, w @ q, COST) < 0.03 and ot.emd2(ablation, median_student(q, w), COST) > 0.4
    assert ot.emd2(eq3, median_student(q, w), COST) < 0.08 and ot.emd2(eq3, w @ q, COST) > 0.4
    with pytest.raises(ValueError, match="sinkhorn, kl, sinkhorn_mixture"):
        distill_student(ConstantStudent(), ["a"], ensemble.subset(["t1"]), np.ones((1, 1)), kind="mixture")
