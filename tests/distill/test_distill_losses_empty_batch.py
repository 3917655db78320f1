"""An empty transfer batch (B = 0 rows) is a clear ValueError, not a silent NaN (issue #23): the batch mean of
KNOT eq. 3 over no sample is 0/0."""
import pytest
import torch

from otfed.distill import LabelSpace, ensemble_loss
from otfed.distill.losses import mixture_sinkhorn_loss

F64 = torch.float64
SA = LabelSpace.for_task("sa")
LABEL_COST = {"sinkhorn": {"cost": SA, "eps": 0.01}, "kl": {}}  # kind="kl" takes no cost and no ε
EMPTY_STUDENT = torch.empty(0, 5, dtype=F64)
EMPTY_TEACHERS = torch.empty(0, 3, 5, dtype=F64)
MESSAGE = r"student_probs: an empty batch \(B = 0 rows\), got shape \(0, 5\)"


@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_ensemble_loss_on_an_empty_batch_names_the_argument_and_its_shape(kind, reduction):
    with pytest.raises(ValueError, match=MESSAGE):
        ensemble_loss(EMPTY_STUDENT, EMPTY_TEACHERS, kind=kind, **LABEL_COST[kind], reduction=reduction)
    with pytest.raises(ValueError, match=MESSAGE):  # one teacher given as B×C
        ensemble_loss(EMPTY_STUDENT, EMPTY_TEACHERS[:, 0], kind=kind, **LABEL_COST[kind], reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_mixture_loss_on_an_empty_batch_names_the_argument_and_its_shape(reduction):
    with pytest.raises(ValueError, match=MESSAGE):
        mixture_sinkhorn_loss(EMPTY_STUDENT, EMPTY_TEACHERS, cost=SA, eps=0.1, reduction=reduction)


@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
def test_one_sample_is_still_a_batch_and_its_value_unchanged(kind):
    """B = 1 goes through, with the value of the hand-computed eq. 3 (KL: Σ_k W̄_k KL(q_k || p) by hand)."""
    student = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]], dtype=F64)
    teachers = torch.tensor([[[0.5, 0.5, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5, 0.5]]], dtype=F64)
    loss = ensemble_loss(student, teachers, [1.0, 3.0], kind=kind, **LABEL_COST[kind])
    assert torch.isfinite(loss)
    if kind == "kl":
        kl = [float((q[q > 0] * (q[q > 0] / student[0][q > 0]).log()).sum()) for q in teachers[0]]
        assert float(loss) == pytest.approx(0.25 * kl[0] + 0.75 * kl[1], abs=1e-12)
