"""A teacher's probability bias B — what it predicts on random text (KNOT §5.2, appendix D.1).

The papers define b_l = E_{x∼N}[h(x) = l]: the probability that the model's *argmax* prediction is
label l when the input x is noise. The noise is random text: 200 tokens drawn uniformly, with
replacement, from the tokenizer's whole vocabulary (30,522 entries for bert-base-uncased, special and
"##" word-piece entries included) and joined by spaces; the papers use 100,000 such texts. The estimate
is the plain frequency of each argmax label (no smoothing, so B sums to 1). The bias is the reference
point of the L2-confidence weight E (:func:`otfed.distill.weights.weights_E`).

Ablation, not the papers' definition: the *soft* bias, the mean predicted probability row on the same
random texts, E_{x∼N}[h(x)]. A near-uniform teacher has an almost one-hot argmax bias (its ties and
near-ties all fall on one label) but a near-uniform soft bias; :func:`probability_biases` returns both
from one pass over the texts.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import torch

#: The papers' setting (appendix D.1).
PAPER_N_TEXTS = 100_000
PAPER_TEXT_LENGTH = 200

_CHUNK = 1024  # texts generated per draw (bounds the index array at CHUNK × length)


def random_texts(
    vocab: Sequence[str], n_texts: int, length: int, rng: np.random.Generator | int | None = None
) -> list[str]:
    """``n_texts`` noise texts of ``length`` tokens drawn uniformly with replacement from ``vocab``,
    joined by single spaces (KNOT appendix D.1; the papers use 100,000 texts of 200 tokens).

    ``rng`` is a numpy Generator or a seed; the same seed gives the same texts.

    Parameters:
        vocab: the tokens to draw from (the papers: the tokenizer's whole vocabulary).
        n_texts: how many texts (:data:`PAPER_N_TEXTS` in the papers).
        length: tokens per text (:data:`PAPER_TEXT_LENGTH` in the papers).
        rng: a numpy Generator or a seed.

    Returns:
        A list of ``n_texts`` strings — the noise distribution N of the bias b_l = E_{x∼N}[h(x) = l] (§5.2).

    Raises ValueError for an empty ``vocab``, ``n_texts`` < 0 or ``length`` < 1.

    >>> texts = random_texts(["good", "bad", "plot"], 3, 4, rng=0)
    >>> [len(t.split(" ")) for t in texts], texts == random_texts(["good", "bad", "plot"], 3, 4, rng=0)
    ([4, 4, 4], True)
    >>> {w for t in texts for w in t.split(" ")} <= {"good", "bad", "plot"}
    True
    """
    tokens = np.asarray(list(vocab), dtype=object)
    if tokens.size == 0:
        raise ValueError("vocab is empty")
    if n_texts < 0 or length < 1:
        raise ValueError(f"need n_texts ≥ 0 and length ≥ 1, got n_texts={n_texts}, length={length}")
    rng = np.random.default_rng(rng)
    texts: list[str] = []
    for start in range(0, n_texts, _CHUNK):
        draws = rng.integers(0, tokens.size, size=(min(_CHUNK, n_texts - start), length))
        texts.extend(" ".join(row) for row in tokens[draws])
    return texts


#: Largest |Σ_l p_l − 1| accepted for a predicted probability row of the soft bias.
ROW_SUM_TOLERANCE = 1e-4


def _scores(scores) -> torch.Tensor:
    """A batch of scores as a (batch × labels) tensor; a tensor's stays on its device."""
    if not torch.is_tensor(scores):
        scores = torch.as_tensor(np.asarray(scores))
    if scores.ndim != 2:
        raise ValueError(f"predict_proba must return a (batch × labels) array, got shape {tuple(scores.shape)}")
    return scores.detach()


def _biases(predict_proba, texts, batch_size: int, n_labels: int | None, progress: bool, description: str,
            soft: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(argmax frequencies, mean probability row or None unless ``soft``) in one pass over ``texts``.

    Counts, probability sums and the number of rows that are not probabilities are kept where the
    predictions are and read back once, at the end."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    texts = list(texts)
    if not texts:
        raise ValueError("no texts to estimate the probability bias from")
    counts: torch.Tensor | None = None
    sums: torch.Tensor | None = None
    bad_rows: torch.Tensor | None = None
    n_batches = (len(texts) + batch_size - 1) // batch_size
    starts = range(0, len(texts), batch_size)
    if progress:  # tqdm is imported only when a bar is shown: the bias needs no progress bar to be computed
        from tqdm.auto import tqdm

        starts = tqdm(starts, total=n_batches, desc=description, unit="batch")
    for start in starts:
        batch = texts[start:start + batch_size]
        scores = _scores(predict_proba(batch))
        width, device = scores.shape[1], scores.device
        if len(scores) != len(batch):
            raise ValueError(f"predict_proba returned {len(scores)} predictions for {len(batch)} texts")
        if counts is None:
            counts = torch.zeros(width if n_labels is None else n_labels, dtype=torch.int64, device=device)
            if soft:
                sums = torch.zeros(counts.numel(), dtype=torch.float64, device=device)
                bad_rows = torch.zeros((), dtype=torch.int64, device=device)
        if width != counts.numel():
            raise ValueError(f"predict_proba returned {width} label scores, expected {counts.numel()}")
        # Σ_rows one_hot(label): a bincount without torch.bincount's read-back of the largest label on a GPU
        counts += (scores.argmax(dim=1)[:, None] == torch.arange(width, device=device)).sum(0)
        if soft:
            rows = scores.to(torch.float64)
            ok = (torch.isfinite(rows).all(1) & (rows >= 0).all(1)
                  & ((rows.sum(1) - 1).abs() <= ROW_SUM_TOLERANCE))
            bad_rows += (~ok).sum()
            sums += torch.where(ok[:, None], rows, torch.zeros_like(rows)).sum(0)
    frequencies = counts.cpu().numpy()
    hard = torch.as_tensor(frequencies / frequencies.sum(), dtype=torch.float64)
    if not soft:
        return hard, None
    n_bad = int(bad_rows.cpu())
    if n_bad:
        raise ValueError(f"predict_proba returned {n_bad} of {len(texts)} rows that are not probabilities; the "
                         f"soft bias needs finite, non-negative rows summing to 1 within {ROW_SUM_TOLERANCE:g} "
                         f"(softmax outputs, not logits)")
    mean = sums.cpu().numpy() / len(texts)
    return hard, torch.as_tensor(mean / mean.sum(), dtype=torch.float64)


def probability_bias(
    predict_proba: Callable[[list[str]], "np.ndarray | torch.Tensor"],
    texts: Iterable[str],
    batch_size: int = 128,
    *,
    n_labels: int | None = None,
    progress: bool = True,
    description: str = "probability bias",
) -> torch.Tensor:
    """B = (b_1, …, b_C), b_l = fraction of ``texts`` whose argmax prediction is l (KNOT §5.2, Def. 5.1).

    ``predict_proba`` maps a list of at most ``batch_size`` texts to a (batch × C) array or tensor of
    probabilities (logits work too: only the argmax is used; a tie goes to the first label). ``n_labels``
    fixes C (default: the width of the first batch's output). Returns a float64 tensor of length C (on the
    CPU) that sums to 1 — plain frequencies, without the +1 smoothing of the authors' code. Shows a tqdm
    progress bar per batch unless ``progress=False``. Counts are kept where the predictions are (a GPU tensor
    from :meth:`otfed.models.TextClassifier.predict_proba_tensor` is never read back per batch) and read once.

    Parameters:
        predict_proba: the teacher, a list of texts → (batch × C) probabilities or logits (numpy or torch).
        texts: the noise texts (:func:`random_texts`).
        batch_size: texts per ``predict_proba`` call.
        n_labels: C; default the width of the first batch's output.
        progress: show a tqdm progress bar.
        description: the progress bar's label.

    Returns:
        B, a float64 CPU tensor of length C summing to 1: the argmax frequency of every label.

    Raises ValueError for no texts, a ``batch_size`` < 1, or a ``predict_proba`` output of the wrong shape.

    A stand-in teacher that reads only its text's first token (label 3 after "good", else label 1): its bias
    is the share of noise texts that start with "good" on label 3, the rest on label 1.

    >>> texts = random_texts(["good", "bad", "plot", "the"], 200, 5, rng=0)
    >>> def predict_proba(batch):
    ...     return np.array([[0.0, 0.1, 0.9] if t.startswith("good ") else [0.6, 0.3, 0.1] for t in batch])
    >>> bias = probability_bias(predict_proba, texts, batch_size=64, progress=False)
    >>> share = sum(t.startswith("good ") for t in texts) / len(texts)
    >>> bool(torch.allclose(bias, torch.tensor([1 - share, 0.0, share], dtype=torch.float64)))
    True
    """
    hard, _ = _biases(predict_proba, texts, batch_size, n_labels, progress, description, soft=False)
    return hard


def probability_biases(
    predict_proba: Callable[[list[str]], "np.ndarray | torch.Tensor"],
    texts: Iterable[str],
    batch_size: int = 128,
    *,
    n_labels: int | None = None,
    progress: bool = True,
    description: str = "probability bias",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hard, soft) from one pass of the teacher over ``texts``: KNOT's B, the argmax frequencies (§5.2,
    app. D.1; the values of :func:`probability_bias`), and the ablation's soft bias E_{x∼N}[h(x)], the mean
    probability row — not the papers' definition. Both float64, on the CPU, summing to 1 (the soft one
    renormalised); accumulated where the predictions are and read back once.

    Arguments as :func:`probability_bias`, but ``predict_proba`` must return probabilities: every row finite,
    non-negative and summing to 1 within ``ROW_SUM_TOLERANCE`` (ValueError otherwise, e.g. for logits).

    Parameters:
        predict_proba: the teacher, a list of texts → (batch × C) probabilities (numpy or torch).
        texts, batch_size, n_labels, progress, description: as in :func:`probability_bias`.

    Returns:
        (hard, soft): two float64 CPU tensors of length C, each summing to 1 — the argmax frequencies (the
        papers' B) and the mean probability row (the ablation).

    The teacher of :func:`probability_bias`'s example: its soft bias is the share-weighted mean of its two rows.

    >>> texts = random_texts(["good", "bad", "plot", "the"], 200, 5, rng=0)
    >>> rows = {True: [0.0, 0.1, 0.9], False: [0.6, 0.3, 0.1]}
    >>> def predict_proba(batch):
    ...     return np.array([rows[t.startswith("good ")] for t in batch])
    >>> hard, soft = probability_biases(predict_proba, texts, batch_size=64, progress=False)
    >>> share = sum(t.startswith("good ") for t in texts) / len(texts)
    >>> expected = share * np.array(rows[True]) + (1 - share) * np.array(rows[False])
    >>> bool(np.allclose(soft.numpy(), expected)), round(float(soft.sum()), 12)
    (True, 1.0)
    >>> bool(torch.equal(hard, probability_bias(predict_proba, texts, progress=False)))  # hard: the papers' B
    True
    """
    hard, soft = _biases(predict_proba, texts, batch_size, n_labels, progress, description, soft=True)
    assert soft is not None
    return hard, soft
