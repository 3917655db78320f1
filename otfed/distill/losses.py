"""KNOT's ensemble distillation loss (eq. 3) with the Sinkhorn discrepancy or the KL ("Entropy") baseline.

For a transfer batch x_1..x_B, student predictions h_θ(x_b) (B×C) and K teachers' predictions h_k(x_b)
(B×K×C), eq. 3 averaged over the batch (eq. 2's empirical risk) is

    L = (1/B) Σ_b Σ_k W̄_bk · T(h_θ(x_b), h_k(x_b)),   W̄_bk = W_bk / Σ_j W_bj,

with T the entropic OT cost on the label support (:func:`otfed.ot.entropic_histograms.sinkhorn_histogram_loss`)
or KL(h_k(x) || h_θ(x)) for the papers' "Entropy" baseline.

**Normalised weights.** Eq. 3 writes Σ_k W_k T_k, but the papers' appendix E gives its gradient as
Σ_k W_k f^k / Σ_k W_k and their risk bound (appendix F, eq. 15 of the ICLR draft) is stated for the
normalised scores w̄_k = w_k / Σ_j w_j; so the weights are normalised per sample by default. This also
makes the weightings comparable: D's shares, U's and E's distances and A's ones all give a convex
combination of the teachers' discrepancies. ``normalize=False`` reproduces the authors' code, which
leaves Σ_k W_k T_k unnormalised. A sample whose weights are all 0 (every
teacher predicts exactly its bias under E) contributes 0.

**Learning without forgetting** (KNOT §6): the frozen pretrained global model is one more teacher,
stacked last by :func:`teacher_stack` and weighted like the others.

**Mixture ablation** (:func:`mixture_sinkhorn_loss`, not the papers' loss): one OT term per sample,
T(h_θ(x), Σ_k W̄_k h_k(x)), between the student and the teachers' weighted mixture. With T = W1 on a line
the two forms have different minimisers — eq. 3's sum of per-teacher terms puts the student's CDF at the
weighted *median* of the teachers' CDFs, the mixture term at their weighted *mean* (the mixture itself, which
is also where the KL baseline's sum lands, since Σ_k W̄_k KL(q_k || p) = KL(Σ_k W̄_k q_k || p) + const).
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from otfed.label_space import LabelSpace
from otfed.ot.entropic_histograms import sinkhorn_histogram_loss

KINDS = ("sinkhorn", "kl")
REDUCTIONS = ("mean", "none")


def teacher_stack(local_probs: Sequence[torch.Tensor], global_probs: torch.Tensor | None = None) -> torch.Tensor:
    """B×K×C teacher predictions: the local teachers' B×C predictions in order, then — for learning
    without forgetting (KNOT §6) — the frozen pretrained global model's predictions as the last teacher.

    Parameters:
        local_probs: the K local teachers' predictions h_k(x) on the same B transfer samples, each B×C.
        global_probs: the frozen global model's B×C predictions, stacked last; None: the local teachers only.

    Returns:
        The B×K×C (K + 1 with ``global_probs``) tensor that :func:`ensemble_loss` takes as ``teacher_probs``.

    Raises ValueError when there is nothing to stack or the predictions are not all B×C of one shape.

    >>> local = [torch.full((4, 3), 1 / 3), torch.eye(3)[[0, 1, 2, 0]]]
    >>> frozen = torch.eye(3)[[2, 2, 2, 2]]
    >>> stack = teacher_stack(local, frozen)
    >>> tuple(stack.shape), bool(torch.equal(stack[:, 1], local[1])), bool(torch.equal(stack[:, -1], frozen))
    ((4, 3, 3), True, True)
    """
    members = list(local_probs) + ([] if global_probs is None else [global_probs])
    if not members:
        raise ValueError("no teacher predictions to stack")
    shapes = {tuple(m.shape) for m in members}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"every teacher's predictions must be B×C with the same shape, got {sorted(shapes)}")
    return torch.stack(members, dim=1)


def kl_histogram_loss(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(h_k(x) || h_θ(x)) = Σ_l q_l log(q_l / p_l) for every sample and teacher — the papers'
    "Entropy" discrepancy (KNOT §5): B×K for q B×K×C (B for q B×C); differentiable w.r.t. p.

    Terms with q_l = 0 are 0; p is floored at the dtype's smallest normal number, so a student
    probability that underflowed to 0 gives a large finite loss instead of inf/NaN.

    Parameters:
        p: the student's B×C probabilities h_θ(x).
        q: the teachers' B×K×C probabilities h_k(x), or B×C for one teacher.

    Returns:
        KL(q || p) in nats, B×K (B for q B×C); 0 where a teacher's histogram equals the student's.

    Raises ValueError when the shapes do not match. Against SciPy's ``entropy(q, p)``:

    >>> from scipy.stats import entropy
    >>> p = torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64)
    >>> q = torch.tensor([[[0.2, 0.5, 0.3], [0.0, 0.4, 0.6]]], dtype=torch.float64)
    >>> kl = kl_histogram_loss(p, q)
    >>> tuple(kl.shape), float(kl[0, 0])
    ((1, 2), 0.0)
    >>> bool(abs(float(kl[0, 1]) - entropy(q[0, 1].numpy(), p[0].numpy())) < 1e-12)
    True
    """
    if p.ndim != 2 or q.ndim not in (2, 3) or q.shape[0] != p.shape[0] or q.shape[-1] != p.shape[-1]:
        raise ValueError(f"need p B×C and q B×K×C or B×C, got {tuple(p.shape)} and {tuple(q.shape)}")
    _real_probabilities(p=p, q=q)
    p_b = p[:, None, :] if q.ndim == 3 else p
    floor = torch.finfo(p.dtype).tiny
    return (torch.xlogy(q, q) - torch.xlogy(q, p_b.clamp_min(floor))).sum(-1)


#: A label cost's diagonal entry |C_ll| above this fraction of max |C| is an error: eq. 1's ground cost is a
#: distance between labels, so keeping a label costs 0 (a non-zero C_ll makes T(p, p) > 0: a student that
#: matches its teacher exactly still pays).
DIAGONAL_TOLERANCE = 1e-12


def validate_weights(weights: torch.Tensor | Sequence[float]) -> None:
    """Raise ValueError unless every teacher weight is real, finite and non-negative (reads the values: on a GPU,
    a host sync)."""
    w = torch.as_tensor(weights).detach()
    if w.is_complex():
        raise ValueError(f"teacher weights must be real numbers, got dtype {w.dtype}")
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ValueError("teacher weights must be finite and non-negative")


def validate_label_cost(cost: torch.Tensor | LabelSpace) -> torch.Tensor:
    """The C×C ground cost of KNOT eq. 1 as a tensor (a :class:`LabelSpace` gives its ``cost_matrix()``), after
    checking that it is real, square, finite, non-negative and has a zero diagonal (|C_ll| ≤
    :data:`DIAGONAL_TOLERANCE` · max |C|): the cost between labels is a distance, so T(p, p) = 0. Raises
    ValueError naming what is wrong and what is allowed. Reads the values (on a GPU, one host sync): a training
    loop checks its cost once and passes ``check_weights=False`` to the losses.

    >>> validate_label_cost(torch.tensor([[0.0, 1.0], [1.0, 0.0]])).tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    >>> validate_label_cost(torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
    Traceback (most recent call last):
    ...
    ValueError: label cost: the diagonal must be 0 (keeping a label costs nothing), got C_ll up to 1 at label 0; pass a distance between labels, e.g. LabelSpace.cost_matrix()
    """
    if isinstance(cost, LabelSpace):
        cost = cost.cost_matrix()
    c = torch.as_tensor(cost).detach()
    if c.is_complex():
        raise ValueError(f"label cost: must be real, got dtype {c.dtype}")
    if c.ndim != 2 or c.shape[0] != c.shape[1]:
        raise ValueError(f"label cost: must be a square C×C matrix, got shape {tuple(c.shape)}")
    if not torch.isfinite(c).all() or (c < 0).any():
        raise ValueError("label cost: must be finite and non-negative")
    diagonal = c.diagonal().abs()
    scale = float(c.abs().amax()) if c.numel() else 0.0
    worst = int(diagonal.argmax()) if diagonal.numel() else 0
    if diagonal.numel() and float(diagonal[worst]) > DIAGONAL_TOLERANCE * scale:
        raise ValueError(f"label cost: the diagonal must be 0 (keeping a label costs nothing), got C_ll up to "
                         f"{float(diagonal[worst]):.3g} at label {worst}; pass a distance between labels, e.g. "
                         f"LabelSpace.cost_matrix()")
    return cost


def _real_probabilities(**tensors: torch.Tensor) -> None:
    """ValueError naming the first complex tensor: probabilities are real (torch would fail later, deep inside
    the solver, with an error about a kernel)."""
    for name, t in tensors.items():
        if torch.is_tensor(t) and t.is_complex():
            raise ValueError(f"{name}: probabilities must be real, got dtype {t.dtype}; pass the real histograms "
                             f"(e.g. softmax outputs)")


def _checked_weights(
    weights: torch.Tensor | Sequence[float] | None, B: int, K: int, like: torch.Tensor, check_values: bool = True
) -> torch.Tensor:
    if weights is None:
        return torch.ones(B, K, dtype=like.dtype, device=like.device)
    w = torch.as_tensor(weights).detach().to(dtype=like.dtype, device=like.device)
    if w.shape == (K,):
        w = w.expand(B, K)
    if w.shape != (B, K):
        raise ValueError(f"weights must be K = {K} or B×K = {(B, K)}, got {tuple(w.shape)}")
    if check_values:
        validate_weights(w)
    return w


def _teachers_of(student_probs: torch.Tensor, teacher_probs: torch.Tensor, reduction: str) -> torch.Tensor:
    """The teachers' probabilities as B×K×C (one teacher may come as B×C), checked against the student's B×C and
    ``reduction``; ValueError naming what is wrong, and for an empty batch (B = 0, whose mean is undefined)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; allowed: {', '.join(REDUCTIONS)}")
    _real_probabilities(student_probs=student_probs, teacher_probs=teacher_probs)
    if teacher_probs.ndim == 2:
        teacher_probs = teacher_probs[:, None, :]
    if student_probs.ndim != 2 or teacher_probs.ndim != 3 or teacher_probs.shape[0] != student_probs.shape[0] \
            or teacher_probs.shape[-1] != student_probs.shape[-1]:
        raise ValueError(f"need student B×C and teachers B×K×C, got {tuple(student_probs.shape)} and "
                         f"{tuple(teacher_probs.shape)}")
    if student_probs.shape[0] == 0:  # the mean over B = 0 samples is 0/0: NaN, silently
        raise ValueError(f"student_probs: an empty batch (B = 0 rows), got shape {tuple(student_probs.shape)}; "
                         f"the loss needs at least one sample")
    return teacher_probs


def ensemble_loss(
    student_probs: torch.Tensor,
    teacher_probs: torch.Tensor,
    weights: torch.Tensor | Sequence[float] | None = None,
    kind: str = "sinkhorn",
    cost: torch.Tensor | LabelSpace | None = None,
    eps: float | None = None,
    *,
    normalize: bool = True,
    reduction: str = "mean",
    check_weights: bool = True,
    **sinkhorn_options: Any,
) -> torch.Tensor:
    """KNOT eq. 3 averaged over the batch (eq. 2's empirical risk): mean_b Σ_k W̄_bk T(h_θ(x_b), h_k(x_b)), with
    T the Sinkhorn discrepancy T_ε of eq. 1 ("Sinkhorn") or KL ("Entropy"; see the module docstring).

    Parameters:
        student_probs: B×C student probabilities h_θ(x); the loss is differentiable w.r.t. them.
        teacher_probs: B×K×C (or B×C for one teacher) teacher probabilities h_k(x).
        weights: B×K per-sample or K per-teacher weights W_k (:func:`otfed.distill.weights.teacher_weights`),
            default all ones ("A"); they are constants (detached). With ``normalize`` (default) each sample's
            weights are divided by their sum, as in the papers' appendix E.
        kind: "sinkhorn" — T = the entropic OT transport cost ⟨P_ε, C⟩ on the label support (eq. 1's plan) — or
            "kl" — T = KL(h_k(x) || h_θ(x)), the "Entropy" baseline (:func:`kl_histogram_loss`).
        cost: the C×C ground cost C of eq. 1, a tensor or a :class:`LabelSpace` (its ``cost_matrix()``);
            "sinkhorn" only.
        eps: the absolute entropic regularisation ε (in the cost's units, like POT's ``reg``); "sinkhorn" only.
        normalize: divide each sample's weights by their sum (default); False reproduces the authors' code,
            Σ_k W_k T_k unnormalised.
        reduction: "mean" (a scalar) or "none" (the B per-sample losses).
        check_weights: raise ValueError on a negative or non-finite weight and on a label cost that is not a
            distance (a non-zero diagonal: :func:`validate_label_cost`). Reading the values is a host sync on a
            GPU: a training loop checks its weights and cost once (:func:`validate_weights`,
            :func:`validate_label_cost`) and passes False.
        sinkhorn_options: passed to :func:`otfed.ot.entropic_histograms.sinkhorn_histogram_loss`, e.g.
            ``value="regularized"`` (eq. 1's value, ⟨P_ε, C⟩ + ε KL(P_ε | μ⊗ν)); ``solver="fixed"`` for the
            fixed-shape solver, which never makes the host wait for a GPU inside the solve, instead of the
            default adaptive ``"newton"``; ``n_iter``; or ``threads=None`` to solve with torch's intra-op thread
            setting instead of one thread.

    Returns:
        A 0-d tensor (``reduction="mean"``) or the B per-sample losses (``"none"``), in the inputs' dtype.

    Raises ValueError naming the problem: an unknown ``kind`` or ``reduction``, mismatched shapes, an empty
    batch, complex probabilities, "sinkhorn" without ``cost`` and ``eps``, "kl" given ``cost``, ``eps`` or
    Sinkhorn options (it would ignore them), and with ``check_weights`` a bad weight or a label cost with a
    non-zero diagonal.

    Two teachers on SA's five ratings (ground cost |i − j|), weighted 1 : 3. With a small ε eq. 3 is the
    weighted sum of the exact Wasserstein distances (POT's ``ot.emd2``):

    >>> import ot
    >>> sa = LabelSpace.for_task("sa")
    >>> student = torch.tensor([[0.1, 0.6, 0.2, 0.1, 0.0]], dtype=torch.float64)
    >>> teachers = torch.tensor([[[1.0, 0, 0, 0, 0], [0, 0, 0.5, 0.5, 0]]], dtype=torch.float64)
    >>> loss = ensemble_loss(student, teachers, [1.0, 3.0], cost=sa, eps=1e-3)
    >>> cost = sa.cost_matrix(torch.float64).numpy()
    >>> exact = [ot.emd2(student[0].numpy(), q.numpy(), cost) for q in teachers[0]]
    >>> bool(abs(float(loss) - (0.25 * exact[0] + 0.75 * exact[1])) < 1e-3)
    True

    The "Entropy" baseline with one teacher (B×C) is KL(h_k(x) || h_θ(x)), SciPy's ``entropy(q, p)``:

    >>> from scipy.stats import entropy
    >>> kl = ensemble_loss(student, teachers[:, 1], kind="kl")
    >>> bool(abs(float(kl) - entropy(teachers[0, 1].numpy(), student[0].numpy())) < 1e-12)
    True
    """
    if kind not in KINDS:
        raise ValueError(f"unknown loss kind {kind!r}; allowed: {', '.join(KINDS)}")
    teacher_probs = _teachers_of(student_probs, teacher_probs, reduction)
    B, K, _ = teacher_probs.shape
    if kind == "sinkhorn":
        if cost is None or eps is None:
            raise ValueError("the sinkhorn loss needs the label cost (C×C tensor or LabelSpace) and eps")
        if isinstance(cost, LabelSpace):
            cost = cost.cost_matrix()
        if check_weights:
            validate_label_cost(cost)
        discrepancy = sinkhorn_histogram_loss(student_probs, teacher_probs, cost, eps, **sinkhorn_options)
    else:
        given = [name for name, value in (("cost", cost), ("eps", eps)) if value is not None]
        if given or sinkhorn_options:
            raise ValueError(f"kind='kl' uses no label cost and no ε, but {', '.join(given + sorted(sinkhorn_options))} "
                             f"{'was' if len(given) + len(sinkhorn_options) == 1 else 'were'} given; they apply to "
                             f"kind='sinkhorn' only (drop them, or pass kind='sinkhorn')")
        discrepancy = kl_histogram_loss(student_probs, teacher_probs)
    w = _checked_weights(weights, B, K, discrepancy, check_values=check_weights)
    if normalize:
        w = w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)
    per_sample = (w * discrepancy).sum(-1)
    return per_sample.mean() if reduction == "mean" else per_sample


def mixture_sinkhorn_loss(
    student_probs: torch.Tensor,
    teacher_probs: torch.Tensor,
    weights: torch.Tensor | Sequence[float] | None = None,
    *,
    cost: torch.Tensor | LabelSpace,
    eps: float,
    normalize: bool = True,
    reduction: str = "mean",
    check_weights: bool = True,
    **sinkhorn_options: Any,
) -> torch.Tensor:
    """An ablation of KNOT eq. 3 (eq. 4 of the confident-Sinkhorns draft), not the papers' loss: ONE Sinkhorn
    term per sample between the student and the teachers' weighted mixture,
    mean_b T_ε(h_θ(x_b), Σ_k W̄_bk h_k(x_b)), W̄_bk = W_bk / Σ_j W_bj.

    Eq. 3 sums one term per teacher, Σ_k W̄_k T_ε(h_θ(x), h_k(x)); with the 1-D ordinal cost |i − j| and ε → 0
    that sum is Σ_k W̄_k Σ_i |F_θ(i) − F_k(i)| (W1 on a line is the L1 distance between CDFs), minimised by the
    student whose CDF is the weighted median of the teachers' CDFs, whereas this single term is minimised by the
    mixture, the weighted mean — the KL baseline's minimiser too. So a confident teacher that is wrong by one
    label, outvoted by the others, moves the mixture (and the KL student) but not eq. 3's student.

    The mixture always uses the normalised weights W̄ (it must be a histogram); ``normalize=False`` multiplies
    each sample's term by Σ_k W_bk, the total weight that the unnormalised eq. 3 gives that sample. A sample
    whose weights are all 0 contributes 0, as in :func:`ensemble_loss`. One teacher, or teachers that all
    agree, give the same value as :func:`ensemble_loss`.

    Parameters:
        student_probs: B×C student probabilities h_θ(x); the loss is differentiable w.r.t. them.
        teacher_probs: B×K×C (or B×C for one teacher) teacher probabilities h_k(x).
        weights: B×K or K teacher weights W_k, default all ones; detached.
        cost: the C×C ground cost, a tensor or a :class:`LabelSpace`.
        eps: the absolute entropic regularisation ε.
        normalize, reduction, check_weights, sinkhorn_options: as in :func:`ensemble_loss`
            (``sinkhorn_options`` go to :func:`otfed.ot.entropic_histograms.sinkhorn_histogram_loss`).

    Returns:
        A 0-d tensor (``reduction="mean"``) or the B per-sample losses (``"none"``).

    Raises ValueError as :func:`ensemble_loss` does, and without ``cost`` or ``eps``.

    Three teachers, one on label 1 and two on label 2: the mixture ⅓ δ_1 + ⅔ δ_2 has no loss against itself,
    while eq. 3's sum (mean of W1(mixture, δ_1) = ⅔ and twice W1(mixture, δ_2) = ⅓) is 4/9, as POT's exact
    solver says:

    >>> import torch
    >>> from otfed.label_space import LabelSpace
    >>> teachers = torch.tensor([[[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0], [0, 1.0, 0, 0, 0]]], dtype=torch.float64)
    >>> mixture = torch.tensor([[1 / 3, 2 / 3, 0, 0, 0]], dtype=torch.float64)
    >>> round(float(mixture_sinkhorn_loss(mixture, teachers, cost=LabelSpace.for_task("sa"), eps=1e-3)), 3)
    0.0
    >>> round(float(ensemble_loss(mixture, teachers, cost=LabelSpace.for_task("sa"), eps=1e-3)), 3)  # eq. 3
    0.444
    >>> import ot
    >>> cost = LabelSpace.for_task("sa").cost_matrix(torch.float64).numpy()
    >>> round(float(sum(ot.emd2(mixture[0].numpy(), q.numpy(), cost) for q in teachers[0])) / 3, 3)
    0.444
    """
    teacher_probs = _teachers_of(student_probs, teacher_probs, reduction)
    if cost is None or eps is None:
        raise ValueError("the mixture sinkhorn loss needs the label cost (C×C tensor or LabelSpace) and eps")
    if isinstance(cost, LabelSpace):
        cost = cost.cost_matrix()
    if check_weights:
        validate_label_cost(cost)
    B, K, _ = teacher_probs.shape
    w = _checked_weights(weights, B, K, teacher_probs, check_values=check_weights)
    total = w.sum(-1)
    silent = total <= 0  # every weight 0: no target, the sample contributes 0 (its placeholder target is unused)
    w_bar = torch.where(silent[:, None], torch.full_like(w, 1.0 / K), w / total[:, None].clamp_min(
        torch.finfo(w.dtype).tiny))
    mixture = (w_bar[..., None] * teacher_probs).sum(1)
    discrepancy = sinkhorn_histogram_loss(student_probs, mixture, cost, eps, **sinkhorn_options)
    scale = total.to(discrepancy.dtype) if not normalize else (~silent).to(discrepancy.dtype)
    per_sample = scale * discrepancy
    return per_sample.mean() if reduction == "mean" else per_sample
