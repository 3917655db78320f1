"""Per-sample teacher weights W_k(h_k(x)) of KNOT's eq. 3, named as in the papers' tables (KNOT §5.1, §5.2, §6).

=====  =====================================================================  ============================
name   W_k for a transfer sample x                                             papers
=====  =====================================================================  ============================
A      1 (unweighted distillation)                                             §5.1; "[Method]-A"
D      ∝ n_k, the size of teacher k's local training set                       §6 "[Method]-D"
U      ||h_k(x) − u||₂, u = (1/C, …, 1/C): distance from the uniform histogram  §6 "[Method]-U"
E      ||h_k(x) − B_k||₂, B_k = teacher k's probability bias: L2 confidence    §5.2, Def. 5.1; "[Method]-E"
=====  =====================================================================  ============================

Teacher predictions come as a B×K×C tensor q (B samples, K teachers, C labels); every function returns
a B×K tensor of non-negative weights on q's device and in q's dtype (``weights_D`` without q: K). The
weights depend on the teachers' outputs only, never on the student, so they carry no gradient.
Normalisation by Σ_k W_k happens in :func:`otfed.distill.losses.ensemble_loss`.
"""
from __future__ import annotations

from typing import Sequence

import torch

WEIGHTINGS = ("A", "D", "U", "E")


def _checked_teachers(q: torch.Tensor) -> torch.Tensor:
    if not torch.is_tensor(q) or q.ndim != 3:
        raise ValueError(f"teacher predictions must be a B×K×C tensor, got {getattr(q, 'shape', type(q))}")
    return q.detach()


def weights_A(q: torch.Tensor) -> torch.Tensor:
    """Unweighted distillation, W_k = 1 for every sample and teacher (KNOT §5.1): B×K ones."""
    q = _checked_teachers(q)
    return torch.ones(q.shape[:2], dtype=q.dtype, device=q.device)


def weights_D(dataset_sizes: Sequence[int] | torch.Tensor, q: torch.Tensor | None = None) -> torch.Tensor:
    """W_k = n_k / Σ_j n_j, proportional to teacher k's local dataset size (KNOT §6, "[Method]-D").

    Returns the K shares, or — given teacher predictions q (B×K×C) — the same shares for every sample
    (B×K, on q's device and dtype).
    """
    sizes = torch.as_tensor(dataset_sizes, dtype=torch.float64)
    if sizes.ndim != 1 or sizes.numel() == 0:
        raise ValueError(f"dataset_sizes must be a non-empty 1-D sequence, got shape {tuple(sizes.shape)}")
    if not torch.isfinite(sizes).all() or (sizes <= 0).any():
        raise ValueError(f"dataset sizes must be positive, got {sizes.tolist()}")
    shares = sizes / sizes.sum()
    if q is None:
        return shares
    q = _checked_teachers(q)
    if q.shape[1] != sizes.numel():
        raise ValueError(f"{sizes.numel()} dataset sizes for {q.shape[1]} teachers")
    return shares.to(dtype=q.dtype, device=q.device).expand(q.shape[0], -1).clone()


def weights_U(q: torch.Tensor) -> torch.Tensor:
    """W_k = ||h_k(x) − u||₂ with u the uniform histogram (KNOT §6, "[Method]-U"): B×K.

    0 for a teacher that cannot decide (uniform output), √(1 − 1/C) for a one-hot prediction.
    """
    q = _checked_teachers(q)
    return (q - 1.0 / q.shape[-1]).square().sum(-1).sqrt()


def weights_E(q: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """L2 confidence W_k = ||h_k(x) − B_k||₂ (KNOT §5.2, Definition 5.1, "[Method]-E"): B×K.

    ``bias`` is K×C, row k the probability bias B_k of teacher k
    (:func:`otfed.distill.bias.probability_bias`). A prediction equal to what the teacher outputs on
    random text gets weight 0; the weight grows as the prediction moves away from that bias, and is
    largest at the vertex of the label the teacher is least biased towards (the papers' Prop. B.1).
    """
    q = _checked_teachers(q)
    bias = torch.as_tensor(bias).to(dtype=q.dtype, device=q.device)
    if bias.shape != q.shape[1:]:
        raise ValueError(f"bias must be K×C = {tuple(q.shape[1:])} (one row per teacher), got {tuple(bias.shape)}")
    return (q - bias).square().sum(-1).sqrt()


def teacher_weights(
    kind: str,
    q: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    dataset_sizes: Sequence[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """B×K weights of the weighting ``kind`` ∈ {"A", "D", "U", "E"} (KNOT eq. 3's W_k; table names).

    "D" needs ``dataset_sizes`` (K), "E" needs ``bias`` (K×C).

    Parameters:
        kind: "A" (1, :func:`weights_A`), "D" (n_k / Σ_j n_j, :func:`weights_D`), "U" (||h_k(x) − u||₂,
            :func:`weights_U`) or "E" (L2 confidence ||h_k(x) − B_k||₂, Definition 5.1, :func:`weights_E`);
            case-insensitive.
        q: the teachers' predictions h_k(x), B×K×C (B transfer samples, K teachers, C labels).
        bias: K×C, row k teacher k's probability bias B_k (:func:`otfed.distill.bias.probability_bias`); "E" only.
        dataset_sizes: the K local training-set sizes n_k; "D" only.

    Returns:
        A B×K tensor of non-negative weights on q's device and in q's dtype, without gradient; eq. 3's
        normalisation by Σ_k W_k is :func:`otfed.distill.losses.ensemble_loss`'s.

    Raises ValueError for an unknown ``kind``, a missing ``bias`` or ``dataset_sizes``, or shapes that do not
    match q's.

    One transfer sample, two teachers on three labels — the first sure of label 1, the second undecided:

    >>> q = torch.tensor([[[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3]]], dtype=torch.float64)
    >>> teacher_weights("A", q).tolist()
    [[1.0, 1.0]]
    >>> shares = teacher_weights("D", q, dataset_sizes=[100, 300])  # n_k / Σ_j n_j: they sum to 1
    >>> shares.tolist(), float(shares.sum())
    ([[0.25, 0.75]], 1.0)
    >>> u = teacher_weights("U", q)  # √(1 − 1/C) for a one-hot prediction, 0 for the uniform one
    >>> bool(torch.allclose(u, torch.tensor([[(2 / 3) ** 0.5, 0.0]], dtype=torch.float64)))
    True
    >>> bias = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)  # B_k, one row per teacher
    >>> e = teacher_weights("E", q, bias=bias)  # 0 for a prediction equal to its teacher's bias
    >>> bool(torch.allclose(e, torch.tensor([[0.0, (1 / 9 + 1 / 9 + 4 / 9) ** 0.5]], dtype=torch.float64)))
    True
    """
    key = str(kind).upper()
    if key == "A":
        return weights_A(q)
    if key == "U":
        return weights_U(q)
    if key == "D":
        if dataset_sizes is None:
            raise ValueError("weighting 'D' needs dataset_sizes (one local dataset size per teacher)")
        return weights_D(dataset_sizes, q)
    if key == "E":
        if bias is None:
            raise ValueError("weighting 'E' needs bias (K×C probability biases, one row per teacher)")
        return weights_E(q, bias)
    raise ValueError(f"unknown teacher weighting {kind!r}; allowed: {', '.join(WEIGHTINGS)}")
