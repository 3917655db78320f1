"""Server-side training of KNOT's global student on the transfer set (KNOT §5, eq. 3).

The server holds the student h_θ (initialised from its pretrained global model), the unlabelled transfer
texts and a :class:`~otfed.distill.ensemble.TeacherEnsemble` built from client messages. It minimises
eq. 3 — Σ_k W̄_k(h_k(x)) · T(h_θ(x), h_k(x)) averaged over mini-batches — with T the entropic OT cost on
the label geometry ("Sinkhorn") or KL ("Entropy"). Teacher weights are computed once from the messages
(:func:`ensemble_weights`); they depend on the teachers only, never on θ.

**Device.** The loop runs where the student's parameters are. The teachers' predictions, the weights and the
label cost go there once; a step indexes them there with the epoch's order (moved once per epoch), the
tokenised batch is copied from pinned memory without blocking, the loss is summed there
(:class:`otfed.models.training.EpochLoss`) and read once per epoch, and the weights are checked once, before
the first step: a KL step never makes the host wait for the GPU. A Sinkhorn step still does, inside
:mod:`otfed.ot.entropic_histograms` (input checks, the ε schedule's max cost, and the solver's active set and
convergence flag are read back).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from otfed.device import threads_for, to_device
from otfed.distill.losses import KINDS, ensemble_loss, mixture_sinkhorn_loss, validate_label_cost, validate_weights
from otfed.distill.weights import teacher_weights
from otfed.distill.ensemble import TeacherEnsemble
from otfed.models.training import EpochLoss, seeded_dropout

#: ``kind`` of :func:`distill_student`: eq. 3 with Sinkhorn or KL, or the single-term mixture ablation.
MIXTURE = "sinkhorn_mixture"
LOSS_KINDS = KINDS + (MIXTURE,)


def ensemble_weights(ensemble: TeacherEnsemble, weighting: str) -> np.ndarray:
    """N×K teacher weights W_k(h_k(x)) of ``weighting`` ∈ {A, D, U, E} for every transfer sample
    (KNOT eq. 3 and §5.2), from the server's messages only (sizes for D, biases for E).

    Parameters:
        ensemble: the server's :class:`TeacherEnsemble` (:func:`otfed.federation.knot.teacher_ensemble`).
        weighting: "A", "D", "U" or "E" (:func:`otfed.distill.weights.teacher_weights`); "E" needs the
            ensemble's ``biases``.

    Returns:
        An N×K float64 array, the ``weights`` of :func:`distill_student`.

    >>> ensemble = TeacherEnsemble(("t1", "t2"), np.full((3, 2, 5), 0.2), np.array([100, 300]), None)
    >>> ensemble_weights(ensemble, "D").tolist()  # n_k / Σ_j n_j on every row
    [[0.25, 0.75], [0.25, 0.75], [0.25, 0.75]]
    """
    q = torch.as_tensor(ensemble.probabilities, dtype=torch.float64)
    bias = None if ensemble.biases is None else torch.as_tensor(ensemble.biases, dtype=torch.float64)
    w = teacher_weights(weighting, q, bias=bias, dataset_sizes=ensemble.dataset_sizes)
    return w.numpy()


def distill_student(
    student: Any,
    transfer_texts: Sequence[str],
    ensemble: TeacherEnsemble,
    weights: np.ndarray,
    *,
    kind: str,
    cost: torch.Tensor | None = None,
    eps: float | None = None,
    sinkhorn_iterations: int = 300,
    sinkhorn_solver: str = "newton",
    epochs: int = 3,
    batch_size: int = 32,
    lr: float = 2e-4,
    weight_decay: float = 0.01,
    seed: int = 0,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = True,
    description: str = "distill",
    holdout: Holdout | None = None,
    patience: int | None = None,
) -> list[dict[str, Any]]:
    """Fit ``student`` (an :class:`otfed.models.TextClassifier`) to the ensemble with eq. 3; returns the
    per-epoch history (epoch, loss, seconds; with ``holdout`` also holdout_loss and best).

    **Training to convergence** (``holdout``): the same loss on a held-out split of the transfer set (unlabelled
    texts with the teachers' predictions and weights: nothing a client did not send) is measured before the first
    step (epoch 0, the starting model) and after every epoch; training stops once ``patience`` epochs in a row
    have not lowered it (None: all ``epochs``) and the weights of the epoch with the lowest held-out loss are
    restored — possibly epoch 0's. No label is looked at.

    ``weights`` are N×K (:func:`ensemble_weights`), normalised per sample inside the loss (appendix E).
    Mini-batches come from a seeded local generator; AdamW with ``lr`` and ``weight_decay``. The loss
    of a Sinkhorn batch whose solver did not converge is still used (a warning is emitted).
    ``sinkhorn_solver``: "newton" or "fixed" (:mod:`otfed.ot.entropic_histograms`); ``sinkhorn_iterations``
    bounds its steps at the final ε. ``kind``: "sinkhorn" or "kl" — eq. 3 (:func:`ensemble_loss`) — or
    "sinkhorn_mixture", the ablation with one Sinkhorn term against the teachers' weighted mixture
    (:func:`otfed.distill.losses.mixture_sinkhorn_loss`; same ``cost``, ``eps`` and solver options).

    Parameters:
        student: the global model h_θ — an :class:`otfed.models.TextClassifier` or any object with its
            ``model`` (a torch module), ``pretokenize(texts)``, ``collate(features)`` and ``logits(batch)``;
            trained in place.
        transfer_texts: the N unlabelled transfer texts.
        ensemble: the teachers' N×K×C predictions on them (:class:`TeacherEnsemble`, from messages only).
        weights: N×K teacher weights W_k (:func:`ensemble_weights`), finite and non-negative.
        kind: "sinkhorn" (eq. 3 with eq. 1's T_ε), "kl" (the "Entropy" baseline) or "sinkhorn_mixture".
        cost: the C×C ground cost (:meth:`otfed.label_space.LabelSpace.cost_matrix`); Sinkhorn kinds only.
        eps: the absolute entropic regularisation ε; Sinkhorn kinds only.
        sinkhorn_iterations: the solver's step bound at the final ε.
        sinkhorn_solver: "newton" or "fixed".
        epochs: passes over the transfer set (at most, with ``patience``).
        batch_size: transfer texts per step.
        lr, weight_decay: AdamW's.
        seed: seeds the batch order and the dropout masks (same seed → same batches and masks).
        on_epoch: called with each epoch's history record.
        progress: show tqdm progress bars.
        description: the progress bars' label.
        holdout: a :class:`Holdout` split to stop on and to restore the best epoch's weights from; None: train
            all ``epochs``.
        patience: epochs without a lower held-out loss before stopping (with ``holdout``).

    Returns:
        The history: one dict per epoch — ``epoch``, ``loss`` (the epoch's mean training loss), ``seconds``;
        with ``holdout`` also ``holdout_loss`` and ``best``, and a first record for epoch 0. The student ends
        in eval mode.

    Raises ValueError for an unknown ``kind``, an empty transfer set, texts, predictions and weights that do not
    match, or a negative or non-finite weight.

    A student whose output does not depend on its input (one trainable logit vector) and two teachers on SA's
    five ratings weighted ¼, ¾ (D): the "Entropy" student reaches eq. 3's closed-form KL minimiser, the
    teachers' weighted mixture, while the Sinkhorn student (ε small: W1 on the rating line, minimised by the
    weighted median) lands on the heavier teacher, far from the mixture — distances by POT's exact solver:

    >>> import ot
    >>> from otfed.label_space import LabelSpace
    >>> class ConstantStudent:
    ...     def __init__(self, n_labels):
    ...         self.model = torch.nn.Module()
    ...         self.model.theta = torch.nn.Parameter(torch.zeros(n_labels))
    ...     def pretokenize(self, texts):
    ...         return list(texts)
    ...     def collate(self, features):
    ...         return len(features)
    ...     def logits(self, n):
    ...         return self.model.theta.expand(n, -1)
    ...     def probs(self):
    ...         return torch.softmax(self.model.theta.detach().double(), -1).numpy()
    >>> q1, q2 = np.array([0.7, 0.2, 0.05, 0.03, 0.02]), np.array([0.02, 0.03, 0.05, 0.2, 0.7])
    >>> texts = ["one text", "another", "a third", "a fourth"]
    >>> ensemble = TeacherEnsemble(("t1", "t2"), np.tile([q1, q2], (4, 1, 1)), np.array([100, 300]), None)
    >>> weights = ensemble_weights(ensemble, "D")
    >>> entropy_student = ConstantStudent(5)
    >>> history = distill_student(entropy_student, texts, ensemble, weights, kind="kl", epochs=60, lr=0.15,
    ...                           weight_decay=0.0, progress=False)
    >>> bool(np.allclose(entropy_student.probs(), 0.25 * q1 + 0.75 * q2, atol=3e-3)), len(history)
    (True, 60)
    >>> sa = LabelSpace.for_task("sa")
    >>> sinkhorn_student = ConstantStudent(5)
    >>> _ = distill_student(sinkhorn_student, texts, ensemble, weights, kind="sinkhorn", cost=sa.cost_matrix(),
    ...                     eps=0.01, epochs=30, lr=0.3, weight_decay=0.0, progress=False)
    >>> cost = sa.cost_matrix(torch.float64).numpy()
    >>> p = sinkhorn_student.probs()
    >>> bool(ot.emd2(p, q2, cost) < 0.1), bool(ot.emd2(p, 0.25 * q1 + 0.75 * q2, cost) > 0.5)
    (True, True)
    """
    if kind not in LOSS_KINDS:
        raise ValueError(f"unknown loss kind {kind!r}; allowed: {', '.join(LOSS_KINDS)}")
    texts = list(transfer_texts)
    n = len(texts)
    probs = torch.as_tensor(ensemble.probabilities, dtype=torch.float32)
    w = torch.as_tensor(weights, dtype=torch.float32)
    if probs.shape[0] != n or w.shape != probs.shape[:2]:
        raise ValueError(f"{n} transfer texts, teacher predictions {tuple(probs.shape)}, weights {tuple(w.shape)}: "
                         "need N texts, N×K×C predictions and N×K weights")
    if n == 0:
        raise ValueError("the transfer set is empty")
    validate_weights(w)  # once, here: ensemble_loss then skips the check (a host sync per step on a GPU)
    model = student.model
    device = next(model.parameters()).device
    probs, w = probs.to(device), w.to(device)  # the whole transfer set's teacher outputs: moved once
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)  # batches: no global RNG (stages run tasks in threads)
    dropout_generator = torch.Generator(device=device).manual_seed(seed + 1)
    features = student.pretokenize(texts)  # tokenise once
    if kind != "kl" and cost is not None:
        validate_label_cost(cost)  # once, here, like the weights
    if torch.is_tensor(cost):
        cost = cost.to(device)
    options = {} if kind == "kl" else {"cost": cost, "eps": eps, "n_iter": sinkhorn_iterations,
                                       "solver": sinkhorn_solver, "threads": threads_for(device)}
    history: list[dict[str, Any]] = []
    scorer = None if holdout is None else _holdout_scorer(student, holdout, kind, options, batch_size, device)
    best_loss, best_state, since_best = float("inf"), None, 0
    if scorer is not None:
        best_loss, best_state = scorer(), _state(model)
        history.append({"epoch": 0, "loss": float("nan"), "seconds": 0.0, "holdout_loss": best_loss})
    with seeded_dropout(model, dropout_generator):
        for epoch in range(1, epochs + 1):
            record = _epoch(student, features, probs, w, kind, options, optimizer, generator, batch_size,
                            f"{description} epoch {epoch}/{epochs}", progress)
            record["epoch"] = epoch
            if scorer is not None:
                record["holdout_loss"] = scorer()
                if record["holdout_loss"] < best_loss:
                    best_loss, best_state, since_best = record["holdout_loss"], _state(model), 0
                else:
                    since_best += 1
            history.append(record)
            if on_epoch is not None:
                on_epoch(record)
            if patience is not None and since_best >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
        best_epoch = min(history, key=lambda r: r["holdout_loss"])["epoch"]
        for r in history:
            r["best"] = r["epoch"] == best_epoch
    model.eval()
    return history


@dataclass(frozen=True)
class Holdout:
    """A held-out split of the transfer set for :func:`distill_student`'s stopping rule: its texts, the teachers'
    N×K×C predictions on them and the N×K weights — a slice of what the server already has."""

    texts: Sequence[str]
    probabilities: np.ndarray
    weights: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.texts)
        if n == 0 or np.shape(self.probabilities)[:1] != (n,) or np.shape(self.weights) != np.shape(
                self.probabilities)[:2]:
            raise ValueError(f"holdout: {n} texts, predictions {np.shape(self.probabilities)}, weights "
                             f"{np.shape(self.weights)}; need N ≥ 1 texts, N×K×C predictions and N×K weights")


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _holdout_scorer(student, holdout: Holdout, kind, options, batch_size, device) -> Callable[[], float]:
    """A function giving the mean loss of ``kind`` on ``holdout`` for the student as it is now (eval mode)."""
    features = student.pretokenize(list(holdout.texts))
    probs = torch.as_tensor(holdout.probabilities, dtype=torch.float32).to(device)
    w = torch.as_tensor(holdout.weights, dtype=torch.float32).to(device)
    validate_weights(w)

    def score() -> float:
        student.model.eval()
        total = EpochLoss()
        with torch.no_grad():
            for start in range(0, len(features), batch_size):
                sl = slice(start, start + batch_size)
                p = torch.softmax(student.logits(student.collate(features[sl])).float(), dim=-1)
                if kind == MIXTURE:
                    loss = mixture_sinkhorn_loss(p, probs[sl], w[sl], check_weights=False, **options)
                else:
                    loss = ensemble_loss(p, probs[sl], w[sl], kind=kind, check_weights=False, **options)
                total.add(loss, p.shape[0])
        return total.mean()
    return score


def _epoch(student, features, probs, w, kind, options, optimizer, generator, batch_size, description, progress):
    """One pass over the transfer set in shuffled mini-batches; returns {loss, seconds}. ``probs`` and ``w``
    are on the student's device; nothing in a step waits for it (module docstring)."""
    start = time.perf_counter()
    n = len(features)
    n_batches = (n + batch_size - 1) // batch_size
    device = next(student.model.parameters()).device
    student.model.train()
    order = torch.randperm(n, generator=generator)
    rows, on_device = order.tolist(), to_device(order, device)  # texts picked on the host, teachers on the device
    epoch_loss = EpochLoss()
    bar = tqdm(range(n_batches), desc=description, unit="batch", disable=not progress, leave=False)
    for b in bar:
        idx = on_device[b * batch_size:(b + 1) * batch_size]
        batch = student.collate([features[i] for i in rows[b * batch_size:(b + 1) * batch_size]])
        student_probs = torch.softmax(student.logits(batch).float(), dim=-1)
        if kind == MIXTURE:
            loss = mixture_sinkhorn_loss(student_probs, probs[idx], w[idx], check_weights=False, **options)
        else:
            loss = ensemble_loss(student_probs, probs[idx], w[idx], kind=kind, check_weights=False, **options)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        epoch_loss.add(loss, len(idx))
        epoch_loss.show(bar)
    return {"loss": epoch_loss.mean(), "seconds": time.perf_counter() - start}
