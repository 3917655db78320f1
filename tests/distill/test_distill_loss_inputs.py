"""Inputs KNOT's loss used to take in silence (issue #34): a label cost with a non-zero diagonal (a student equal
to its teacher still paid), ``kind="kl"`` given a cost or ε (ignored), complex probabilities (a torch kernel error
deep in the solver). Each is now a ValueError naming what is wrong and what is allowed."""
import pytest
import torch

from otfed.distill import LabelSpace, ensemble_loss
from otfed.distill.losses import mixture_sinkhorn_loss, validate_label_cost, validate_weights

F64 = torch.float64
SA = LabelSpace.for_task("sa")
P = torch.tensor([[0.1, 0.6, 0.2, 0.1, 0.0]], dtype=F64)
Q = torch.tensor([[[0.0, 0.5, 0.5, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]], dtype=F64)


def _shifted_cost() -> torch.Tensor:
    """|i − j| + 1: every entry, the diagonal too, one more than SA's ordinal distance."""
    return SA.cost_matrix(F64) + 1.0


def test_a_cost_with_a_non_zero_diagonal_charges_a_student_equal_to_its_teacher():
    # why it matters: with C_ll = 1 the transport cost of p against itself is Σ_l p_l C_ll = 1, not 0
    # (the only plan between a histogram and itself with a cost whose off-diagonal is larger is the diagonal)
    diagonal_mass = float((P[0] * _shifted_cost().diagonal()).sum())
    assert diagonal_mass == pytest.approx(1.0)


@pytest.mark.parametrize("loss", [ensemble_loss, mixture_sinkhorn_loss])
def test_a_label_cost_with_a_non_zero_diagonal_is_refused(loss):
    with pytest.raises(ValueError, match=r"label cost: the diagonal must be 0 .* got C_ll up to 1 at label 0"):
        loss(P, P[:, None, :], cost=_shifted_cost(), eps=0.01)


def test_one_non_zero_diagonal_entry_is_named_by_its_label():
    cost = SA.cost_matrix(F64).clone()
    cost[3, 3] = 0.5
    with pytest.raises(ValueError, match=r"got C_ll up to 0\.5 at label 3"):
        validate_label_cost(cost)


def test_the_papers_label_spaces_pass_and_the_value_is_unchanged():
    assert torch.equal(validate_label_cost(SA.cost_matrix(F64)), SA.cost_matrix(F64))
    # the check changes nothing else: eq. 3 of p against itself under |i − j| is (entropic) ≈ 0
    assert float(ensemble_loss(P, P[:, None, :], cost=SA, eps=1e-3)) < 1e-2


@pytest.mark.parametrize("given", [{"cost": SA}, {"eps": 0.1}, {"cost": SA.cost_matrix(F64), "eps": 0.1}])
def test_kl_given_a_cost_or_eps_is_refused_not_ignored(given):
    with pytest.raises(ValueError, match=r"kind='kl' uses no label cost and no ε, but .* given; they apply to "
                                         r"kind='sinkhorn' only"):
        ensemble_loss(P, Q, kind="kl", **given)


def test_kl_without_cost_or_eps_still_equals_scipy():
    from scipy.stats import entropy

    kl = ensemble_loss(P, Q[:, 0], kind="kl")
    assert float(kl) == pytest.approx(entropy(Q[0, 0].numpy(), P[0].numpy()), abs=1e-12)


@pytest.mark.parametrize("which", ["student_probs", "teacher_probs"])
@pytest.mark.parametrize("kind", ["sinkhorn", "kl"])
def test_complex_probabilities_are_refused_by_name(which, kind):
    args = {"student_probs": P, "teacher_probs": Q}
    args[which] = args[which].to(torch.complex128)
    with pytest.raises(ValueError, match=rf"{which}: probabilities must be real, got dtype torch.complex128"):
        ensemble_loss(args["student_probs"], args["teacher_probs"], kind=kind,
                      **({"cost": SA, "eps": 0.1} if kind == "sinkhorn" else {}))


def test_complex_weights_and_costs_are_refused():
    with pytest.raises(ValueError, match=r"teacher weights must be real numbers"):
        validate_weights(torch.tensor([1.0 + 1j, 1.0]))
    with pytest.raises(ValueError, match=r"label cost: must be real"):
        validate_label_cost(SA.cost_matrix(F64).to(torch.complex128))


def test_validate_label_cost_example_passes():
    import doctest

    import otfed.distill.losses as losses

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(losses.validate_label_cost, "validate_label_cost",
                                             globs=vars(losses).copy()):
        runner.run(test)
    assert runner.tries >= 2 and runner.failures == 0


def test_the_kl_term_alone_refuses_complex_histograms():
    from otfed.distill.losses import kl_histogram_loss

    with pytest.raises(ValueError, match=r"q: probabilities must be real"):
        kl_histogram_loss(P, Q.to(torch.complex128))
