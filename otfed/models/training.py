"""Supervised training of a text classifier: KNOT's local teachers and pretrained global model.

KNOT §6 and app. H (teachers trained with cross-entropy; BERT-Tiny; Adam; batch size and learning rate
by grid search; 20 epochs): each client fits its teacher on its private labelled texts with the
cross-entropy loss, and the server pretrains the global model the same way on its own labelled set
before distillation (learning without forgetting). :func:`train_classifier` does this with AdamW,
early stopping on validation macro-F1 and the best epoch's weights restored — or, with
``select="last"``, all epochs and the last weights (a validation set of a few hundred rows carries only
a handful of the rare labels, too few to choose an epoch on) — optionally with the cross-entropy
weighted by inverse label frequency (``class_balanced``: SA's reviews are ~2/3 five-star, and an
unweighted teacher scores its macro-F1 mostly on the majority label).

**No global RNG.** Stages train several parties in threads of one process, and torch's global
generator is shared by all of them; so mini-batch order comes from a private ``torch.Generator``, and
dropout — ``nn.Dropout`` modules and the attention-probability dropout of models that use the
``transformers`` attention interface (BERT, DistilBERT and most others) — draws from a private
generator too while :func:`seeded_dropout` is active. The same seed therefore gives identical weights
on CPU whatever other threads do. (Attention dropout of a causal/decoder checkpoint, or of an
architecture outside the attention interface, still draws from the global RNG.)

**Device.** Training runs where the classifier's parameters are (a stage puts them on ``run.device``). A step
does not wait for the GPU: the epoch's order is drawn on the host (the texts are picked there) and moved to
the device once per epoch to index the targets, batches are copied from pinned memory without blocking
(:func:`otfed.device.to_device`), the loss is summed on the device (:class:`EpochLoss`) and read once
per epoch, and the seeded attention's mask is built on a GPU instead of asking the host whether it could be
skipped. ``tests/gpu`` runs a teacher epoch (BERT, seeded dropout) under ``torch.cuda.set_sync_debug_mode
("error")`` to hold it so. Evaluation batches still sync once per forward, inside ``transformers``: its SDPA
attention reads the padding mask back to decide whether it may drop it.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn
from tqdm.auto import tqdm

from otfed.errors import DegenerateClientError
from otfed.metrics import accuracy, macro_f1
from otfed.device import to_device
from otfed.models.text import TextClassifier
from otfed.schema import Strict

#: Keys of every per-epoch record in :attr:`TrainResult.history` (and of the dict given to ``on_epoch``).
EPOCH_KEYS = ("epoch", "train_loss", "val_loss", "val_macro_f1", "val_accuracy", "seconds")

SEEDED_ATTENTION = "otfed_seeded_dropout"


# ------------------------------------------------------------------------------ private-RNG dropout
class GeneratorDropout(nn.Dropout):
    """``nn.Dropout`` whose mask is drawn from ``generator`` instead of torch's global RNG."""

    def __init__(self, p: float, generator: torch.Generator) -> None:
        super().__init__(p)
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _dropout(x, self.p, self.training, self.generator)


def _dropout(x: torch.Tensor, p: float, training: bool, generator: torch.Generator) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return torch.zeros_like(x)
    keep = torch.empty_like(x).bernoulli_(1.0 - p, generator=generator)
    return x * keep / (1.0 - p)


def _seeded_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs):
    """Scaled dot-product attention whose probability dropout uses the module's GeneratorDropout.

    Outside training, without dropout, for causal modules or grouped key/value heads it is exactly
    ``transformers``' SDPA attention (the same boolean mask format is registered for it).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    drop = getattr(module, "dropout", None)
    if (not module.training or dropout == 0.0 or not isinstance(drop, GeneratorDropout)
            or getattr(module, "is_causal", False) or key.shape[1] != query.shape[1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = _dropout(torch.softmax(scores, dim=-1), dropout, True, drop.generator)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


_registered = False


def _register_seeded_attention() -> None:
    """Add the seeded attention (and SDPA's mask format for it) to ``transformers``' registries, once."""
    global _registered
    if not _registered:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.modeling_utils import AttentionInterface

        def seeded_mask(*args, allow_is_bidirectional_skip: bool = False, device="cpu", **kwargs):
            """SDPA's boolean mask. On a GPU it is always built: deciding to skip an all-ones mask reads
            the padding mask back to the host (``padding_mask.all()``), a GPU sync in every forward, and the
            seeded attention applies the mask itself (an all-ones mask changes no score). On CPU: as SDPA."""
            if torch.device(device).type == "cuda":
                allow_is_bidirectional_skip = False
            return sdpa_mask(*args, allow_is_bidirectional_skip=allow_is_bidirectional_skip, device=device,
                             **kwargs)

        AttentionInterface.register(SEEDED_ATTENTION, _seeded_attention)
        AttentionMaskInterface.register(SEEDED_ATTENTION, seeded_mask)
        _registered = True


@contextmanager
def seeded_dropout(model: nn.Module, generator: torch.Generator) -> Iterator[nn.Module]:
    """Within the block, the dropout of ``model`` draws from ``generator`` (on the model's device), not
    from torch's global RNG: every ``nn.Dropout`` module is swapped for a :class:`GeneratorDropout`, and
    a ``transformers`` model that uses the attention interface (and SDPA or eager attention) is switched
    to an SDPA-equivalent attention whose probability dropout uses that generator. Everything is put
    back on exit. Use it around any training loop that must be reproducible under threads (the
    teachers here, the KNOT student in distillation)."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                replacement = GeneratorDropout(child.p, generator)
                replacement.train(child.training)
                setattr(parent, name, replacement)
                swapped.append((parent, name, child))
    config = getattr(model, "config", None)
    previous = getattr(config, "_attn_implementation", None)
    switched = False
    if previous in ("sdpa", "eager") and hasattr(model, "set_attn_implementation"):
        _register_seeded_attention()
        try:
            if model._can_set_attn_implementation():
                model.set_attn_implementation(SEEDED_ATTENTION)
                switched = config._attn_implementation == SEEDED_ATTENTION
        except (ValueError, KeyError, ImportError, AttributeError):
            switched = False
    try:
        yield model
    finally:
        if switched:
            model.set_attn_implementation(previous)
        for parent, name, original in swapped:
            original.train(getattr(parent, name).training)
            setattr(parent, name, original)


# ---------------------------------------------------------------------------------- epoch loss
class EpochLoss:
    """Σ_b loss_b · |B_b| over an epoch's mini-batches, kept on the loss's device in float64 so that a
    training step never waits for the GPU (``float(loss)`` per step would); :meth:`mean` reads it back once.

    The sum is exactly the host sum it replaces — each float32 loss widened to float64, multiplied by the
    batch size and added in float64, in batch order — so the logged epoch losses are unchanged.
    :meth:`show` puts the running mean in a progress bar's postfix at most every ``interval`` seconds
    (one host sync each time), and not at all when the bar is disabled.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self._sum: torch.Tensor | None = None
        self.seen = 0
        self.interval = interval
        self._shown = time.monotonic()

    def add(self, loss: torch.Tensor, size: int) -> None:
        term = loss.detach().to(torch.float64) * size
        self._sum = term if self._sum is None else self._sum + term
        self.seen += size

    def mean(self) -> float:
        """Σ loss·|B| / Σ |B| (a host sync)."""
        if self._sum is None:
            raise ValueError("no batch was added")
        return float(self._sum) / self.seen

    def show(self, bar) -> None:
        if getattr(bar, "disable", True) or self._sum is None or time.monotonic() - self._shown < self.interval:
            return
        bar.set_postfix(loss=f"{self.mean():.4f}")
        self._shown = time.monotonic()


# --------------------------------------------------------------------------------------- training
class TrainingConfig(Strict):
    """Supervised training of a teacher or the global model (KNOT §6): cross-entropy, AdamW, early
    stopping on validation macro-F1 — also the ``train_teachers.training`` params group.

    ``patience``: epochs without a strictly better validation macro-F1 before stopping (None: run all
    ``epochs``). ``select``: which epoch's weights are kept — ``"best_val"`` the epoch of the best
    validation macro-F1 (restored at the end), ``"last"`` the last epoch's (no choice is made on the
    validation set, which is still scored each epoch and may then be empty; needs ``patience: None``).
    ``"best_val_loss"`` the epoch of the lowest validation loss — the cross-entropy on the validation split,
    label-balanced (:func:`class_weights` of the validation labels) when ``class_balanced`` — with ``patience``
    counting epochs without a strictly lower one: a proper scoring rule, so it stops before the model grows
    over-confident, where macro-F1 (an argmax score) does not look.
    ``class_balanced``: weight the cross-entropy by inverse training-label frequency
    (:func:`class_weights`), so that a rare label counts as much as a frequent one (the balanced risk).
    """

    epochs: int = Field(5, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)
    lr: float = Field(5e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    patience: int | None = Field(2, ge=1, le=1000,
                                 description="Epochs without a better validation macro-F1 before stopping.")
    select: Literal["best_val", "best_val_loss", "last"] = Field(
        "best_val", description="Weights kept: the best validation macro-F1 epoch's, the lowest validation "
                                "cross-entropy epoch's, or the last epoch's.")
    class_balanced: bool = Field(False, description="Cross-entropy weighted by inverse training-label frequency.")

    @model_validator(mode="after")
    def _selection(self) -> "TrainingConfig":
        if self.select == "last" and self.patience is not None:
            raise ValueError(f"patience must be null when select is 'last' (got {self.patience}): early stopping "
                             "would choose the stopping epoch on the validation set")
        return self


@dataclass
class TrainResult:
    """Outcome of :func:`train_classifier`: the epoch whose weights were kept (the best validation epoch, or
    the last one with ``select="last"``), its validation macro-F1 (NaN without validation texts), and one
    record per epoch run with keys :data:`EPOCH_KEYS`."""

    best_epoch: int
    best_score: float
    history: list[dict] = field(default_factory=list)

    @property
    def epochs_run(self) -> int:
        return len(self.history)


def _label_array(labels, n: int, n_labels: int, what: str) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != (n,):
        raise ValueError(f"{what}: need one label per text ({n} texts, labels of shape {y.shape})")
    if n and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= n_labels):
        raise ValueError(f"{what}: labels must be integers in 0..{n_labels - 1}")
    return y.astype(np.int64)


def class_weights(labels: Sequence[int] | np.ndarray, n_labels: int) -> np.ndarray:
    """Per-label weights of the class-balanced cross-entropy: w_c = n / (C′ · n_c) for the C′ labels present
    among the n training labels (n_c of label c), and 0 for a label absent from them (it has no example
    to weight). Then Σ_i w_{y_i} = n — the mean weight of a training example is 1, so the loss keeps the
    scale of the plain cross-entropy — and (1/n) Σ_i w_{y_i} ℓ_i = (1/C′) Σ_c mean_{i: y_i = c} ℓ_i, the
    mean over present labels of each label's mean loss (the balanced risk; cf. sklearn's
    ``class_weight="balanced"``)."""
    y = np.asarray(labels, dtype=np.int64)
    if y.size == 0:
        raise ValueError("class weights need at least one label")
    counts = np.bincount(y, minlength=n_labels).astype(np.float64)
    present = counts > 0
    weights = np.zeros(n_labels, dtype=np.float64)
    weights[present] = y.size / (present.sum() * counts[present])
    return weights


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy of a mini-batch, (1/|B|) Σ_i w_{y_i} · (−log softmax(z_i)_{y_i}) — with ``weights``
    None, the plain mean (w ≡ 1). Divided by the batch size, not by Σ w: an unbiased mini-batch estimate of
    the full-data weighted loss of :func:`class_weights`."""
    if weights is None:
        return F.cross_entropy(logits, targets)
    losses = F.cross_entropy(logits, targets, reduction="none")
    return (weights[targets] * losses).mean()


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, LayerNorm or other vectors), as in BERT."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr)


def train_classifier(
    clf: TextClassifier,
    train_texts: Sequence[str],
    train_labels: Sequence[int] | np.ndarray,
    val_texts: Sequence[str],
    val_labels: Sequence[int] | np.ndarray,
    config: TrainingConfig | None = None,
    *,
    seed: int = 0,
    on_epoch: Callable[[dict], None] | None = None,
    progress: bool = True,
    description: str = "",
    eval_batch_size: int = 128,
) -> TrainResult:
    """Fit ``clf`` in place on labelled texts with the cross-entropy loss (KNOT §6 teachers).

    Labels are column indices 0..C−1 of ``clf.labels``; ``config`` defaults to ``TrainingConfig()``. Each
    epoch: shuffled mini-batches of ``config.batch_size`` (order from a generator seeded with ``seed``), AdamW
    (``config.lr``, ``config.weight_decay`` on weight matrices), dropout from a private generator
    (:func:`seeded_dropout`), the cross-entropy weighted by :func:`class_weights` of the training labels when
    ``config.class_balanced`` (:func:`cross_entropy`); then the validation macro-F1 (over all C labels) and
    accuracy and cross-entropy (``val_loss``). With ``config.select="best_val"`` (``"best_val_loss"``: the lowest
    validation cross-entropy instead) it stops after ``config.patience`` epochs without a strictly
    better validation macro-F1 (None: run all ``config.epochs``) and restores the best epoch's weights; with
    ``"last"`` it runs every epoch and keeps the last weights (validation texts may then be empty: their
    scores are NaN). The model is left in eval mode. Texts are tokenised once.
    ``on_epoch`` receives each epoch's record (keys :data:`EPOCH_KEYS`) as it ends; a tqdm bar per epoch shows
    progress unless ``progress=False``. The same seed and inputs give identical weights on CPU.
    """
    config = TrainingConfig() if config is None else config
    epochs, batch_size, lr, weight_decay, patience = (config.epochs, config.batch_size, config.lr,
                                                      config.weight_decay, config.patience)
    keep_last = config.select == "last"
    name = description or "classifier"
    if eval_batch_size < 1:
        raise ValueError(f"eval_batch_size must be ≥ 1 (got {eval_batch_size})")
    if not len(train_texts):
        raise DegenerateClientError(f"{name}: no training texts")
    if not len(val_texts) and not keep_last:
        raise DegenerateClientError(f"{name}: no validation texts (early stopping needs them; "
                                    "select: last does not)")
    y_train = _label_array(train_labels, len(train_texts), clf.n_labels, f"{name} train_labels")
    y_val = _label_array(val_labels, len(val_texts), clf.n_labels, f"{name} val_labels")

    features = clf.pretokenize(train_texts)
    val_features = clf.pretokenize(val_texts)
    device = clf.device
    targets = torch.as_tensor(y_train, device=device)
    label_weights = (torch.as_tensor(class_weights(y_train, clf.n_labels), dtype=torch.float32, device=device)
                     if config.class_balanced else None)
    order_rng = torch.Generator().manual_seed(int(seed))
    dropout_rng = torch.Generator(device=device).manual_seed(
        int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(int(seed) + 1))))
    optimizer = _adamw(clf.model, lr, weight_decay)
    by_loss = config.select == "best_val_loss"
    val_weights = class_weights(y_val, clf.n_labels) if config.class_balanced and y_val.size else None

    history: list[dict] = []
    best_score, best_epoch, best_state, since_best = -np.inf, 0, None, 0
    with seeded_dropout(clf.model, dropout_rng):
        for epoch in range(1, epochs + 1):
            start_time = time.perf_counter()
            epoch_loss = _train_epoch(clf, features, targets, order_rng, optimizer, batch_size,
                                      f"{name} epoch {epoch}/{epochs}", progress, label_weights)
            if val_features:
                probs = clf.predict_proba_features(val_features, batch_size=eval_batch_size)
                val_f1, val_acc = macro_f1(y_val, probs, n_labels=clf.n_labels), accuracy(y_val, probs)
                val_loss = validation_loss(probs, y_val, val_weights)
            else:
                val_f1 = val_acc = val_loss = float("nan")
            record = {"epoch": epoch, "train_loss": epoch_loss.mean(), "val_loss": val_loss, "val_macro_f1": val_f1,
                      "val_accuracy": val_acc, "seconds": time.perf_counter() - start_time}
            history.append(record)
            if on_epoch is not None:
                on_epoch(dict(record))
            if keep_last:
                best_score, best_epoch = record["val_macro_f1"], epoch
                continue
            score = -record["val_loss"] if by_loss else record["val_macro_f1"]
            if score > best_score:
                best_score, best_epoch, since_best = score, epoch, 0
                best_state = {k: v.detach().clone() for k, v in clf.model.state_dict().items()}
            else:
                since_best += 1
            if patience is not None and since_best >= patience and epoch < epochs:
                break
    if best_state is not None:
        clf.model.load_state_dict(best_state)
    clf.model.eval()
    if by_loss:  # the kept epoch's validation macro-F1, as for the other selections
        best_score = history[best_epoch - 1]["val_macro_f1"]
    return TrainResult(best_epoch=best_epoch, best_score=float(best_score), history=history)


def validation_loss(probs: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean cross-entropy −log p_y of predicted probabilities ``probs`` (N×C) at the true ``labels``, each sample
    weighted by ``weights[y]`` (:func:`class_weights`: the label-balanced mean) when given; probabilities are
    floored at 1e-12."""
    nll = -np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None))
    if weights is None:
        return float(nll.mean())
    w = weights[labels]
    return float((w * nll).sum() / w.sum())


def _train_epoch(clf: TextClassifier, features: Sequence[dict], targets: torch.Tensor, order_rng: torch.Generator,
                 optimizer: torch.optim.Optimizer, batch_size: int, description: str, progress: bool,
                 label_weights: torch.Tensor | None = None) -> EpochLoss:
    """One pass of (optionally class-weighted, :func:`cross_entropy`) cross-entropy steps over shuffled
    mini-batches (order from ``order_rng``); returns the summed loss, still on the device. Nothing in it waits
    for a GPU (module docstring): the order is moved to the device once, to index ``targets`` (on the device)
    there, while the texts are picked on the host."""
    n = len(features)
    clf.model.train()
    order = torch.randperm(n, generator=order_rng)
    rows, on_device = order.tolist(), to_device(order, targets.device)
    epoch_loss = EpochLoss()
    bar = tqdm(range(0, n, batch_size), total=(n + batch_size - 1) // batch_size, unit="batch", leave=False,
               disable=not progress, desc=description)
    for start in bar:
        idx = rows[start:start + batch_size]
        logits = clf.logits(clf.collate([features[i] for i in idx]))
        loss = cross_entropy(logits, targets[on_device[start:start + batch_size]], label_weights)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        epoch_loss.add(loss, len(idx))
        epoch_loss.show(bar)
    bar.close()
    return epoch_loss


def predict_labels(clf: TextClassifier, texts: Sequence[str], batch_size: int = 128) -> np.ndarray:
    """Argmax label index (0..C−1, int64) of every text — the hard predictions scored by macro-F1 and
    accuracy (KNOT tables 1–4)."""
    return clf.predict_proba(texts, batch_size=batch_size).argmax(axis=1).astype(np.int64)
