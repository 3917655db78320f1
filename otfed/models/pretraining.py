"""In-domain masked-language-model pretraining of a shared BERT-tiny encoder, offline.

KNOT (§6, app. H) fine-tunes teachers that start from a pretrained BERT; nothing may be downloaded
here, so the only pretraining available is on the embedded texts themselves. :func:`pretrain_mlm` trains
a BERT encoder of a :class:`~otfed.models.ModelSpec`'s size with BERT's masked-language-model objective
(Devlin et al., 2019, §3.1: 15 % of the word pieces chosen; of those 80 % replaced by ``[MASK]``, 10 % by a
random piece, 10 % kept; cross-entropy on the chosen pieces only) over a WordPiece vocabulary trained on
the same texts, and saves it as a local Hugging Face directory — ``ModelSpec(kind="checkpoint",
checkpoint=<that directory>)`` then builds each party's classifier from it (shared vocabulary; pooler and
classification head initialised from the party's seed) and :func:`otfed.models.train_classifier`
fine-tunes it.

Which texts may be used is the caller's decision and a privacy one: the server's unlabelled transfer set
is already shared with every party; other parties' training texts are not (pretraining on them is only
fair as a stand-in for a public in-domain corpus). Test rows must never be included.

Like :func:`otfed.models.train_classifier`, nothing draws from torch's global RNG: masking, batch order
and dropout come from generators seeded by the caller, so the same seed gives identical weights on CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from tqdm.auto import tqdm

from otfed.io import staged_directory
from otfed.models.text import ModelSpec, _initialise, resolve_device
from otfed.models.tokenizer import train_wordpiece
from otfed.models.training import EpochLoss, _adamw, seeded_dropout
from otfed.schema import Strict

#: Label of a position that is not predicted (ignored by the loss), as in ``transformers``.
IGNORE = -100


class MLMConfig(Strict):
    """Masked-language-model pretraining (BERT §3.1): epochs over the texts, AdamW, the masking rate."""

    epochs: int = Field(3, ge=1, le=1000)
    batch_size: int = Field(32, ge=1, le=4096)
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    mask_prob: float = Field(0.15, gt=0.0, lt=1.0, description="Share of word pieces chosen for prediction.")


@dataclass
class MLMResult:
    """What :func:`pretrain_mlm` wrote (``directory``) and its per-epoch records (epoch, loss, seconds)."""

    directory: Path
    history: list[dict] = field(default_factory=list)


def mask_tokens(input_ids: torch.Tensor, special: torch.Tensor, mask_token_id: int, vocab_size: int,
                generator: torch.Generator, mask_prob: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking (Devlin et al., 2019, §3.1) of a B×T batch: each position that is not ``special``
    (padding, [CLS], [SEP]) is chosen with probability ``mask_prob``; a chosen position becomes
    ``[MASK]`` with probability 0.8, a uniformly random word piece with 0.1, and stays as it is with 0.1.
    Returns (inputs, labels): labels hold the original id at chosen positions and :data:`IGNORE`
    elsewhere. Draws only from ``generator`` (CPU)."""
    shape = input_ids.shape
    chosen = (torch.rand(shape, generator=generator) < mask_prob) & ~special
    action = torch.rand(shape, generator=generator)
    random_ids = torch.randint(0, vocab_size, shape, generator=generator)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    inputs = torch.where(chosen & (action < 0.8), torch.full_like(input_ids, mask_token_id), input_ids)
    inputs = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels


def build_mlm_model(spec: ModelSpec, tokenizer, seed: int):
    """A ``BertForMaskedLM`` of ``spec``'s size (layers, hidden, heads, intermediate, dropout, max_length
    positions) over ``tokenizer``'s vocabulary, with BERT's initialisation drawn from a generator seeded
    with ``seed`` (the decoder is tied to the word embeddings; its bias starts at 0)."""
    from transformers import BertConfig, BertForMaskedLM

    if spec.kind != "bert":
        raise ValueError(f"MLM pretraining builds a BERT encoder: spec.kind must be 'bert' (got {spec.kind!r})")
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                        num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
                        hidden_dropout_prob=spec.dropout, attention_probs_dropout_prob=spec.dropout,
                        max_position_embeddings=spec.max_length, pad_token_id=tokenizer.pad_token_id,
                        type_vocab_size=2, initializer_range=0.02)
    model = BertForMaskedLM(config)
    with torch.no_grad():
        left = _initialise(model, torch.Generator().manual_seed(int(seed)))
        params = dict(model.named_parameters(remove_duplicate=False))
        for name in left:
            if not name.endswith("bias"):  # only the LM head's output bias lives outside a Linear
                raise RuntimeError(f"parameter without a seeded initialisation: {name}")
            params[name].zero_()
    return model.eval()


def pretrain_mlm(texts: Sequence[str], spec: ModelSpec, out_dir: str | Path, config: MLMConfig | None = None, *,
                 seed: int = 0, progress: bool = True, on_epoch: Callable[[dict], None] | None = None,
                 device: str | torch.device | None = "cpu") -> MLMResult:
    """Pretrain a BERT encoder of ``spec``'s size on ``texts`` with the masked-language-model loss (module
    docstring) and save it — model (``save_pretrained``) and its WordPiece tokenizer (trained on ``texts``,
    ``spec.vocab_size``) — to ``out_dir`` atomically, ready for ``ModelSpec(kind="checkpoint",
    checkpoint=out_dir, max_length ≤ spec.max_length)``.

    Each epoch: the texts (truncated to ``spec.max_length`` pieces) in shuffled mini-batches, fresh masks
    (:func:`mask_tokens`), AdamW (``config.lr``; weight decay on matrices only); the decoder is applied to
    the masked positions only (the loss is the same, the vocabulary projection of the others is skipped).
    """
    config = MLMConfig() if config is None else config
    texts = [str(t) for t in texts]
    if not texts:
        raise ValueError("MLM pretraining needs texts: none given")
    device = resolve_device(device)
    tokenizer = train_wordpiece(texts, vocab_size=spec.vocab_size)
    tokenizer.model_max_length = spec.max_length
    model = build_mlm_model(spec, tokenizer, seed).to(device)
    encoded = tokenizer(texts, truncation=True, max_length=spec.max_length, padding=False,
                        return_special_tokens_mask=True)
    ids, specials = encoded["input_ids"], encoded["special_tokens_mask"]
    order_rng = torch.Generator().manual_seed(int(seed))
    mask_rng = torch.Generator().manual_seed(int(seed) + 1)
    dropout_rng = torch.Generator(device=device).manual_seed(int(seed) + 2)
    optimizer = _adamw(model, config.lr, config.weight_decay)
    vocab_size, mask_id, pad_id = len(tokenizer), tokenizer.mask_token_id, tokenizer.pad_token_id
    history: list[dict] = []
    with seeded_dropout(model, dropout_rng):
        for epoch in range(1, config.epochs + 1):
            start = time.perf_counter()
            model.train()
            order = torch.randperm(len(ids), generator=order_rng).tolist()
            epoch_loss = EpochLoss()
            bar = tqdm(range(0, len(order), config.batch_size), leave=False, unit="batch", disable=not progress,
                       desc=f"MLM epoch {epoch}/{config.epochs}")
            for first in bar:
                rows = order[first:first + config.batch_size]
                batch_ids, special = _pad([ids[i] for i in rows], [specials[i] for i in rows], pad_id)
                inputs, labels = mask_tokens(batch_ids, special, mask_id, vocab_size, mask_rng, config.mask_prob)
                chosen = labels != IGNORE
                if not bool(chosen.any()):
                    continue
                attention = (batch_ids != pad_id).long()
                hidden = model.bert(input_ids=inputs.to(device), attention_mask=attention.to(device)).last_hidden_state
                logits = model.cls(hidden[chosen.to(device)])
                loss = F.cross_entropy(logits, labels[chosen].to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                epoch_loss.add(loss, int(chosen.sum()))
                epoch_loss.show(bar)
            bar.close()
            record = {"epoch": epoch, "loss": epoch_loss.mean(), "seconds": time.perf_counter() - start}
            history.append(record)
            if on_epoch is not None:
                on_epoch(dict(record))
    model.eval()
    out_dir = Path(out_dir)
    with staged_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return MLMResult(directory=out_dir, history=history)


def _pad(ids: Sequence[Sequence[int]], specials: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B×T ids padded with ``pad_id``, B×T bool: special token or padding) of unpadded rows."""
    longest = max(len(row) for row in ids)
    out = torch.full((len(ids), longest), pad_id, dtype=torch.long)
    special = torch.ones((len(ids), longest), dtype=torch.bool)
    for r, (row, flags) in enumerate(zip(ids, specials)):
        out[r, :len(row)] = torch.as_tensor(row, dtype=torch.long)
        special[r, :len(row)] = torch.as_tensor(np.asarray(flags, dtype=bool))
    return out, special
