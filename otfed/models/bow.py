"""A bag-of-word-pieces classifier: a fast, non-transformer architecture for heterogeneous KNOT teachers.

KNOT (§6) lets every local teacher have its own architecture — the server only ever sees
its predictions on the transfer set. :class:`BagOfWordsClassifier` is a fastText-style model (Joulin et
al., 2017, "Bag of Tricks for Efficient Text Classification") over the party's own WordPiece ids
(:func:`otfed.models.tokenizer.train_wordpiece`, the same tokenizer a ``kind="bert"`` party trains):

    e(x) = mean of the embeddings of x's word pieces and of its hashed word-piece bigrams,
    logits(x) = W_out · MLP(e(x)),   MLP = ``layers`` × (dropout → Linear(·, hidden) → ReLU), then dropout.

Bigram (a, b) of consecutive pieces of the same segment is embedding row ``V + (a·1000003 + b) mod buckets``
(V = vocabulary size; ``buckets = 0``, the default of ``ModelSpec(kind="bow")``: unigrams only — on SA hashed
bigrams scored no better and trained 2–3× slower, ``studies/teacher_options.py``). Padding never enters the mean. For (first, second)
pairs — NLI's premise and hypothesis — each segment is averaged on its own and the classifier reads
[u, v, |u − v|, u ⊙ v] (the usual sentence-pair features), so the order and overlap of the two parts count.

It behaves like the ``transformers`` models behind :class:`otfed.models.TextClassifier`: a ``config`` with
``num_labels`` and ``pad_token_id``, ``forward(input_ids, attention_mask, token_type_ids)`` returning an
object with ``.logits``, dropout as ``nn.Dropout`` modules (so :func:`otfed.models.seeded_dropout` seeds
them), and :func:`save_bow` / :func:`load_bow` write and read a state dict (safetensors) + JSON config,
offline. Weights are initialised from a caller's ``torch.Generator`` (:func:`initialise_bow`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers.modeling_outputs import SequenceClassifierOutput

from otfed.errors import DataFileError

#: The files :func:`save_bow` writes (besides the tokenizer's).
BOW_CONFIG_FILE = "bow_config.json"
BOW_WEIGHTS_FILE = "model.safetensors"

#: Odd multiplier of the bigram hash (coprime with any power-of-two bucket count).
_HASH_PRIME = 1_000_003


@dataclass
class BowConfig:
    """Shape of a :class:`BagOfWordsClassifier` (what :func:`save_bow` writes as JSON).

    ``vocab_size``: word pieces of the tokenizer; ``hidden``: embedding width and hidden-layer width;
    ``layers``: hidden layers between the bag and the classifier (0 = a linear classifier on the bag, as
    fastText); ``buckets``: hashed-bigram embedding rows (0 = unigrams only); ``pairs``: inputs are
    (first, second) pairs, averaged per segment; ``embedding_std``: std of the N(0, σ²) embedding init.
    """

    vocab_size: int
    hidden: int
    num_labels: int
    layers: int = 1
    buckets: int = 0
    dropout: float = 0.1
    pairs: bool = False
    pad_token_id: int = 0
    embedding_std: float = 0.1
    id2label: dict[int, str] = field(default_factory=dict)
    label2id: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "BowConfig":
        data = dict(data)
        data["id2label"] = {int(k): v for k, v in data.get("id2label", {}).items()}
        return cls(**data)


class BagOfWordsClassifier(nn.Module):
    """Mean of word-piece (+ hashed bigram) embeddings → MLP → classifier (module docstring)."""

    def __init__(self, config: BowConfig) -> None:
        super().__init__()
        if config.vocab_size < 1 or config.hidden < 1 or config.num_labels < 2 or config.layers < 0 \
                or config.buckets < 0:
            raise ValueError(f"invalid bag-of-words config {config}")
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size + config.buckets, config.hidden,
                                       padding_idx=config.pad_token_id)
        width = config.hidden * (4 if config.pairs else 1)
        blocks: list[nn.Module] = []
        for _ in range(config.layers):
            blocks += [nn.Dropout(config.dropout), nn.Linear(width, config.hidden), nn.ReLU()]
            width = config.hidden
        self.mlp = nn.Sequential(*blocks)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(width, config.num_labels)

    def bag(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
            token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """B×H mean embedding of each text (B×4H [u, v, |u−v|, u⊙v] for pairs): the features the MLP reads."""
        cfg = self.config
        mask = (input_ids != cfg.pad_token_id) if attention_mask is None else attention_mask.bool()
        segments = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        vectors = self.embeddings(input_ids)
        weights = mask
        if cfg.buckets and input_ids.shape[1] > 1:
            first, second = input_ids[:, :-1], input_ids[:, 1:]
            bigrams = cfg.vocab_size + torch.remainder(first * _HASH_PRIME + second, cfg.buckets)
            together = mask[:, :-1] & mask[:, 1:] & (segments[:, :-1] == segments[:, 1:])
            vectors = torch.cat([vectors, self.embeddings(bigrams)], dim=1)
            weights = torch.cat([weights, together], dim=1)
            segments = torch.cat([segments, segments[:, :-1]], dim=1)
        if not cfg.pairs:
            return _masked_mean(vectors, weights)
        u = _masked_mean(vectors, weights & (segments == 0))
        v = _masked_mean(vectors, weights & (segments == 1))
        return torch.cat([u, v, (u - v).abs(), u * v], dim=-1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> SequenceClassifierOutput:
        """B×C logits (as ``.logits``) of a padded batch of word-piece ids."""
        hidden = self.mlp(self.bag(input_ids, attention_mask, token_type_ids))
        return SequenceClassifierOutput(logits=self.classifier(self.dropout(hidden)))


def _masked_mean(vectors: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    w = weights.to(vectors.dtype).unsqueeze(-1)
    return (vectors * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)


@torch.no_grad()
def initialise_bow(model: BagOfWordsClassifier, generator: torch.Generator) -> None:
    """Seeded initialisation, drawn from ``generator`` (CPU) in module order: embeddings ~ N(0, σ²)
    (σ = ``config.embedding_std``) with the padding row 0; Linear weights ~ U(−1/√fan_in, 1/√fan_in)
    (torch's default bound for ``nn.Linear``), biases 0. The same generator state gives identical weights."""
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            draw = torch.randn(module.weight.shape, generator=generator, dtype=torch.float32)
            module.weight.copy_(draw * model.config.embedding_std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.Linear):
            bound = 1.0 / math.sqrt(module.in_features)
            draw = torch.rand(module.weight.shape, generator=generator, dtype=torch.float32)
            module.weight.copy_((2.0 * draw - 1.0) * bound)
            module.bias.zero_()


def save_bow(model: BagOfWordsClassifier, directory: Path) -> None:
    """Write ``model``'s state dict (``model.safetensors``) and config (``bow_config.json``) to ``directory``."""
    from safetensors.torch import save_file

    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(directory / BOW_WEIGHTS_FILE))
    (directory / BOW_CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n")


def load_bow(directory: Path) -> BagOfWordsClassifier:
    """The :class:`BagOfWordsClassifier` :func:`save_bow` wrote to ``directory`` (offline, on cpu, eval
    mode). Raises :class:`~otfed.errors.DataFileError` naming a missing, unreadable or mis-shaped file."""
    from safetensors.torch import load_file

    config_path, weights_path = directory / BOW_CONFIG_FILE, directory / BOW_WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise DataFileError(f"{path}: missing — a bag-of-words classifier needs {path.name}")
    try:
        config = BowConfig.from_dict(json.loads(config_path.read_text()))
    except (ValueError, TypeError) as exc:
        raise DataFileError(f"{config_path}: unreadable bag-of-words config ({exc})") from exc
    model = BagOfWordsClassifier(config)
    try:
        model.load_state_dict(load_file(str(weights_path)), strict=True)
    except (RuntimeError, OSError, ValueError) as exc:
        raise DataFileError(f"{weights_path}: weights do not fit {config_path.name} ({exc})") from exc
    return model.eval()
