"""The server-side distillation loop (eq. 3) against closed-form minimisers, with a student whose output does
not depend on the input (logits = a free parameter vector), so eq. 3 has a known optimum:

- KL ("Entropy"): Σ_k w̄_k KL(q_k || p) is minimised by the mixture p* = Σ_k w̄_k q_k;
- Sinkhorn on SA's 1-D label line with ε → 0: Σ_k w̄_k W1(p, q_k) is minimised where p's CDF is the
  weighted median of the teachers' CDFs at every level — with weights (¼, ¾) that is teacher 2 itself.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from otfed.label_space import LabelSpace
from otfed.distill.student import distill_student, ensemble_weights
from otfed.federation.knot import bias_message, client_messages, teacher_ensemble


class ConstantStudent:
    """A "classifier" whose logits are one trainable vector, the same for every text."""

    def __init__(self, n_labels: int) -> None:
        self.model = torch.nn.Module()
        self.model.theta = torch.nn.Parameter(torch.zeros(n_labels))

    def pretokenize(self, texts):
        return [{"input_ids": [0]} for _ in texts]

    def collate(self, features):
        return {"n": len(features)}

    def logits(self, batch):
        return self.model.theta.expand(batch["n"], -1)

    def probs(self) -> np.ndarray:
        return torch.softmax(self.model.theta.detach(), -1).numpy()


Q1 = np.array([0.70, 0.20, 0.05, 0.03, 0.02])
Q2 = np.array([0.02, 0.03, 0.05, 0.20, 0.70])


def _ensemble(n: int = 64, sizes=(100, 300)):
    msgs = [*client_messages("t1", np.tile(Q1, (n, 1)), sizes[0]), *client_messages("t2", np.tile(Q2, (n, 1)),
                                                                                      sizes[1])]
    return teacher_ensemble(msgs), [f"text {i}" for i in range(n)]


def test_kl_distillation_reaches_the_weighted_mixture() -> None:
    ens, texts = _ensemble()
    weights = ensemble_weights(ens, "D")
    np.testing.assert_allclose(weights[0], [0.25, 0.75])
    student = ConstantStudent(5)
    history = distill_student(student, texts, ens, weights, kind="kl", epochs=60, batch_size=16, lr=0.05,
                              weight_decay=0.0, progress=False)
    np.testing.assert_allclose(student.probs(), 0.25 * Q1 + 0.75 * Q2, atol=5e-3)
    assert history[-1]["loss"] < history[0]["loss"]


def test_sinkhorn_distillation_reaches_the_weighted_median_teacher() -> None:
    ens, texts = _ensemble(n=16)
    weights = ensemble_weights(ens, "D")
    student = ConstantStudent(5)
    cost = LabelSpace.for_task("sa").cost_matrix()
    distill_student(student, texts, ens, weights, kind="sinkhorn", cost=cost, eps=0.01, epochs=80, batch_size=16,
                    lr=0.1, weight_decay=0.0, progress=False)
    p = student.probs()
    w1_to_q2 = np.abs(np.cumsum(p) - np.cumsum(Q2)).sum()  # W1 on the unit-spaced line = L1 between CDFs
    w1_to_mixture = np.abs(np.cumsum(p) - np.cumsum(0.25 * Q1 + 0.75 * Q2)).sum()
    assert w1_to_q2 < 0.08 and w1_to_mixture > 0.5


def test_weights_come_from_messages_only() -> None:
    ens, _ = _ensemble(n=4)
    with pytest.raises(ValueError, match="needs bias"):
        ensemble_weights(ens, "E")
    msgs = [*client_messages("t1", np.tile(Q1, (4, 1)), 1), *client_messages("t2", np.tile(Q2, (4, 1)), 1),
            bias_message("t1", Q1), bias_message("t2", np.full(5, 0.2))]
    w = ensemble_weights(teacher_ensemble(msgs), "E")
    np.testing.assert_allclose(w[:, 0], 0.0, atol=1e-12)  # teacher 1 always predicts its own bias
    np.testing.assert_allclose(w[:, 1], np.linalg.norm(Q2 - 0.2))


def test_mismatched_shapes_are_refused() -> None:
    ens, texts = _ensemble(n=8)
    with pytest.raises(ValueError, match="need N texts"):
        distill_student(ConstantStudent(5), texts[:5], ens, ensemble_weights(ens, "A"), kind="kl", progress=False)


def test_bad_weights_are_refused_before_the_first_step() -> None:
    ens, texts = _ensemble(n=8)
    weights = ensemble_weights(ens, "A")
    weights[3, 1] = -1.0
    student = ConstantStudent(5)
    with pytest.raises(ValueError, match="finite and non-negative"):
        distill_student(student, texts, ens, weights, kind="kl", progress=False)
    assert torch.equal(student.model.theta.detach(), torch.zeros(5))  # no step was taken


def test_every_step_sees_its_batchs_teachers_weights_and_the_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """The teachers' predictions and weights indexed where they live give each step the rows of the batch's
    texts: the order is recomputed here from the seed (the batches come from torch.randperm with a generator
    seeded with ``seed``)."""
    import otfed.distill.student as student_module

    n, batch_size, seed = 10, 4, 3
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=(n, 2))
    msgs = [*client_messages("t1", probs[:, 0], 10), *client_messages("t2", probs[:, 1], 30)]
    ens = teacher_ensemble(msgs)
    weights = rng.random((n, 2))
    cost = LabelSpace.for_task("sa").cost_matrix(dtype=torch.float64)
    seen = []
    real = student_module.ensemble_loss

    def spy(student_probs, teacher_probs, w, **kwargs):
        seen.append((teacher_probs.clone(), w.clone(), kwargs))
        return real(student_probs, teacher_probs, w, **kwargs)

    monkeypatch.setattr(student_module, "ensemble_loss", spy)
    distill_student(ConstantStudent(5), [f"t{i}" for i in range(n)], ens, weights, kind="sinkhorn", cost=cost,
                    eps=0.1, epochs=2, batch_size=batch_size, seed=seed, progress=False)
    generator = torch.Generator().manual_seed(seed)
    expected = [order[b:b + batch_size] for order in (torch.randperm(n, generator=generator) for _ in range(2))
                for b in range(0, n, batch_size)]
    assert len(seen) == len(expected) == 6
    for (teacher_probs, w, kwargs), rows in zip(seen, expected):
        np.testing.assert_array_equal(teacher_probs.numpy(), probs[rows.numpy()].astype(np.float32))
        np.testing.assert_array_equal(w.numpy(), weights[rows.numpy()].astype(np.float32))
        assert kwargs["check_weights"] is False and kwargs["threads"] == 1  # checked once; one thread on CPU
        assert torch.equal(kwargs["cost"], cost)
        assert kwargs["solver"] == "newton"  # the default


def test_the_fixed_solver_trains_the_same_student_as_newton() -> None:
    """Both solvers converge every problem to 1e-9, so the same seed gives the same training to rounding."""
    ens, texts = _ensemble(n=16)
    weights = ensemble_weights(ens, "D")
    cost = LabelSpace.for_task("sa").cost_matrix()
    students, histories = {}, {}
    for solver in ("newton", "fixed"):
        students[solver] = ConstantStudent(5)
        histories[solver] = distill_student(students[solver], texts, ens, weights, kind="sinkhorn", cost=cost,
                                            eps=0.01, sinkhorn_solver=solver, epochs=5, batch_size=8, lr=0.1,
                                            weight_decay=0.0, progress=False)
    np.testing.assert_allclose([h["loss"] for h in histories["fixed"]], [h["loss"] for h in histories["newton"]],
                               rtol=1e-6)
    np.testing.assert_allclose(students["fixed"].probs(), students["newton"].probs(), atol=1e-6)
    assert histories["newton"][-1]["loss"] < histories["newton"][0]["loss"]


# ------------------------------------------------------------------ training to convergence on a held-out split
def _kl(q: np.ndarray, p: np.ndarray) -> float:
    return float(np.sum(q * np.log(q / p)))


def test_a_holdout_the_student_only_moves_away_from_keeps_the_starting_weights() -> None:
    """Training teachers say Q1, the held-out split's say Q2: every step towards Q1 raises KL(Q2 || p) (p starts
    uniform), so the best held-out epoch is 0, training stops after ``patience`` epochs without improvement and
    the starting weights come back."""
    from otfed.distill.student import Holdout

    ens, texts = _ensemble(sizes=(100, 100))
    train = ens.subset(["t1"])
    held = Holdout(texts[:16], np.tile(Q2, (16, 1, 1)), np.ones((16, 1)))
    student = ConstantStudent(5)
    history = distill_student(student, texts, train, np.ones((len(texts), 1)), kind="kl", epochs=30, batch_size=16,
                              lr=0.05, weight_decay=0.0, progress=False, holdout=held, patience=3)
    assert [r["epoch"] for r in history] == [0, 1, 2, 3]
    assert [r["best"] for r in history] == [True, False, False, False]
    np.testing.assert_allclose(student.probs(), np.full(5, 0.2), atol=1e-7)
    assert history[0]["holdout_loss"] == pytest.approx(_kl(Q2, np.full(5, 0.2)), rel=1e-5)
    assert all(r["holdout_loss"] > history[0]["holdout_loss"] for r in history[1:])


def test_the_kept_student_is_the_epoch_with_the_lowest_heldout_loss() -> None:
    """Held-out teachers agree with the training ones (the D mixture): the kept student's KL to the mixture,
    computed here with numpy, is the smallest held-out loss in the history, and it is the flagged epoch's."""
    from otfed.distill.student import Holdout

    ens, texts = _ensemble()
    weights = ensemble_weights(ens, "D")
    held = Holdout(texts[:16], ens.probabilities[:16], weights[:16])
    student = ConstantStudent(5)
    history = distill_student(student, texts, ens, weights, kind="kl", epochs=8, batch_size=16, lr=0.05,
                              weight_decay=0.0, progress=False, holdout=held, patience=None)
    mixture = 0.25 * Q1 + 0.75 * Q2
    kept = _kl(mixture, student.probs())
    losses = [r["holdout_loss"] for r in history]
    best = [r for r in history if r["best"]]
    assert len(best) == 1 and best[0]["holdout_loss"] == min(losses)
    # Σ_k w̄_k KL(q_k || p) = KL(mixture || p) + Σ_k w̄_k KL(q_k || mixture)
    constant = 0.25 * _kl(Q1, mixture) + 0.75 * _kl(Q2, mixture)
    assert min(losses) == pytest.approx(kept + constant, rel=1e-4)
    assert len(history) == 9  # patience None: every epoch


def test_a_malformed_holdout_is_refused() -> None:
    from otfed.distill.student import Holdout

    with pytest.raises(ValueError, match="holdout: 2 texts"):
        Holdout(["a", "b"], np.zeros((3, 1, 5)), np.ones((3, 1)))
