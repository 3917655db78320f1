"""KNOT eq. 3 (ensemble loss) and the KL "Entropy" baseline, by hand and against the single-teacher loss."""
import math

import pytest
import torch

from otfed.distill import (
    LabelSpace,
    entropic_histogram_transport,
    ensemble_loss,
    kl_histogram_loss,
    sinkhorn_histogram_loss,
    teacher_stack,
)

F64 = torch.float64
SA = LabelSpace.for_task("sa")
LABEL_COST = {"sinkhorn": {"cost": SA, "eps": 0.01}, "kl": {}}  # kind="kl" takes no cost and no ε


def _batch(seed, B=4, K=3, C=5):
    g = torch.Generator().manual_seed(seed)
    student = torch.softmax(torch.randn(B, C, generator=g, dtype=F64), -1)
    teachers = torch.softmax(2 * torch.randn(B, K, C, generator=g, dtype=F64), -1)
    weights = torch.rand(B, K, generator=g, dtype=F64) + 0.1
    return student, teachers, weights


@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
def test_one_teacher_reduces_to_the_single_teacher_loss(kind):
    student, teachers, weights = _batch(0)
    single = (sinkhorn_histogram_loss(student, teachers[:, 0], SA.cost_matrix(), 0.01) if kind == "sinkhorn"
              else kl_histogram_loss(student, teachers[:, 0]))
    loss = ensemble_loss(student, teachers[:, :1], weights[:, :1], kind=kind, **LABEL_COST[kind])
    assert float(loss) == pytest.approx(float(single.mean()), abs=1e-12)  # normalised weight = 1
    raw = ensemble_loss(student, teachers[:, 0], weights[:, :1], kind=kind, **LABEL_COST[kind], normalize=False)
    assert float(raw) == pytest.approx(float((weights[:, 0] * single).mean()), abs=1e-12)


@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
def test_weighting_by_hand(kind):
    student, teachers, weights = _batch(1)
    T = (sinkhorn_histogram_loss(student, teachers, SA.cost_matrix(), 0.01) if kind == "sinkhorn"
         else kl_histogram_loss(student, teachers))
    expected_rows = [sum(weights[b, k] * T[b, k] for k in range(3)) / weights[b].sum() for b in range(4)]
    per_sample = ensemble_loss(student, teachers, weights, kind=kind, **LABEL_COST[kind], reduction="none")
    assert torch.allclose(per_sample, torch.stack(expected_rows), atol=1e-12)
    mean = ensemble_loss(student, teachers, weights, kind=kind, **LABEL_COST[kind])
    assert float(mean) == pytest.approx(float(sum(expected_rows) / 4), abs=1e-12)
    # per-teacher weights (K) broadcast over the batch; no weights = "A" = plain mean over teachers
    per_teacher = ensemble_loss(student, teachers, weights[0], kind=kind, **LABEL_COST[kind], reduction="none")
    assert torch.allclose(per_teacher, (weights[0] * T).sum(-1) / weights[0].sum(), atol=1e-12)
    unweighted = ensemble_loss(student, teachers, kind=kind, **LABEL_COST[kind])
    assert float(unweighted) == pytest.approx(float(T.mean()), abs=1e-12)


def test_kl_baseline_closed_forms():
    p = torch.full((1, 4), 0.25, dtype=F64)
    q = torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]], dtype=F64)
    kl = kl_histogram_loss(p, q)
    assert torch.allclose(kl, torch.tensor([[math.log(4), math.log(2), 0.0]], dtype=F64), atol=1e-15)
    x = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64, requires_grad=True)
    kl_histogram_loss(x, q[:, 1]).sum().backward()  # ∂KL(q||p)/∂p = −q/p
    assert torch.allclose(x.grad, -q[0, 1] / x.detach()[0], atol=1e-15)
    underflow = kl_histogram_loss(torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([[0.5, 0.5]], dtype=F64))
    assert torch.isfinite(underflow).all() and float(underflow) > 300


def test_normalised_gradient_is_the_weighted_mean_of_dual_potentials_appendix_e():
    """Appendix E: ∂L/∂h_θ(x) = Σ_k W_k f^k / Σ_k W_k (on the simplex: minus its μ-mean)."""
    student, teachers, weights = _batch(2)
    x = student.clone().requires_grad_(True)
    ensemble_loss(x, teachers, weights, cost=SA, eps=0.01, value="regularized", reduction="none").sum().backward()
    f = entropic_histogram_transport(student, teachers, SA.cost_matrix(), 0.01).f
    combined = (weights[..., None] * f).sum(1) / weights.sum(1, keepdim=True)
    expected = combined - (student * combined).sum(-1, keepdim=True)
    assert torch.allclose(x.grad, expected, atol=1e-10)


@pytest.mark.parametrize("eps", [0.1, 0.01])
def test_sinkhorn_loss_gradient_wrt_student_logits_matches_finite_differences(eps):
    """The training path: logits → softmax → eq. 3 with the transport cost (implicit gradient)."""
    _, teachers, weights = _batch(5)
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 5, generator=g, dtype=F64)
    loss = lambda z: ensemble_loss(torch.softmax(z, -1), teachers, weights, cost=SA, eps=eps, tol=1e-13)
    z = logits.clone().requires_grad_(True)
    loss(z).backward()
    for _ in range(3):
        direction = torch.randn(logits.shape, generator=g, dtype=F64)
        h = 1e-6
        fd = (loss(logits + h * direction) - loss(logits - h * direction)) / (2 * h)
        assert float(abs(fd - (z.grad * direction).sum())) <= 1e-7 * (1 + float(z.grad.norm() * direction.norm()))


def test_weights_are_constants_and_all_zero_weights_give_zero_loss():
    student, teachers, weights = _batch(3)
    w = weights.clone().requires_grad_(True)
    x = student.clone().requires_grad_(True)
    ensemble_loss(x, teachers, w, kind="kl").backward()
    assert w.grad is None and x.grad is not None
    w0 = weights.clone()
    w0[1] = 0
    per_sample = ensemble_loss(student, teachers, w0, kind="kl", reduction="none")
    assert float(per_sample[1]) == 0.0 and float(per_sample[0]) > 0


def test_teacher_stack_puts_the_frozen_global_model_last():
    locals_ = [torch.full((2, 3), v, dtype=F64) for v in (0.1, 0.2)]
    glob = torch.full((2, 3), 0.9, dtype=F64)
    stacked = teacher_stack(locals_, glob)
    assert stacked.shape == (2, 3, 3)
    assert [float(stacked[0, k, 0]) for k in range(3)] == [0.1, 0.2, 0.9]
    with pytest.raises(ValueError, match="same shape"):
        teacher_stack([torch.zeros(2, 3), torch.zeros(3, 3)])


def test_bad_arguments_are_named():
    student, teachers, weights = _batch(4)
    with pytest.raises(ValueError, match="sinkhorn, kl"):
        ensemble_loss(student, teachers, kind="wasserstein")
    with pytest.raises(ValueError, match="label cost"):
        ensemble_loss(student, teachers)
    with pytest.raises(ValueError, match="B×K"):
        ensemble_loss(student, teachers, weights[:, :2], kind="kl")
    with pytest.raises(ValueError, match="non-negative"):
        ensemble_loss(student, teachers, -weights, kind="kl")


def test_unchecked_weights_give_the_checked_value_and_the_check_stands_alone():
    """check_weights=False (a training loop that validated its weights once) changes nothing but the check."""
    from otfed.distill.losses import validate_weights

    student, teachers, weights = _batch(5)
    checked = ensemble_loss(student, teachers, weights, kind="kl")
    assert float(ensemble_loss(student, teachers, weights, kind="kl", check_weights=False)) == float(checked)
    by_hand = ((weights / weights.sum(-1, keepdim=True)) * kl_histogram_loss(student, teachers)).sum(-1).mean()
    assert float(checked) == pytest.approx(float(by_hand), abs=1e-14)
    for bad in (-weights, weights.clone().fill_(float("nan"))):
        with pytest.raises(ValueError, match="finite and non-negative"):
            validate_weights(bad)
    validate_weights(weights)
