"""One party's text classifier: a tokenizer, a sequence-classification transformer and a token budget.

KNOT (§6; app. H: a pretrained BERT-Tiny, 2 layers, hidden 128, 2 heads) trains each local teacher with
cross-entropy and allows the teachers to differ in architecture; here each local teacher, the global model
and the student is such a classifier, of the kind its spec names. Nothing is downloaded:

- ``kind="bert"`` — ``BertForSequenceClassification`` built from a ``BertConfig`` of the spec's size,
  over a WordPiece vocabulary trained on the party's own training texts (:mod:`otfed.models.tokenizer`);
- ``kind="distilbert"`` — ``DistilBertForSequenceClassification`` of the same size (n_layers, dim,
  n_heads, hidden_dim), a second architecture for heterogeneous teachers;
- ``kind="checkpoint"`` — any local Hugging Face directory (config.json + weights + tokenizer files),
  loaded with ``local_files_only=True``; a classification head of the wrong size is re-initialised
  (e.g. an encoder pretrained with :func:`otfed.models.pretraining.pretrain_mlm`);
- ``kind="bow"`` — :class:`~otfed.models.bow.BagOfWordsClassifier`, a fastText-style mean of word-piece (and
  optionally hashed-bigram) embeddings + MLP over the same per-party WordPiece vocabulary: a fast third
  architecture.

Random initialisation draws from a private ``torch.Generator`` seeded by the caller (never torch's
global RNG, which other threads of a stage share): the same seed gives identical weights.
"""
from __future__ import annotations

import inspect
import json
import threading
from pathlib import Path
from typing import Iterable, Literal, Sequence, Union, get_args

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import nn
from tqdm.auto import tqdm

from otfed.errors import ConfigError, DataError, DataFileError
from otfed.io import staged_directory, write_json
from otfed.device import resolve_device as resolve_device_name, to_device
from otfed.models.bow import BagOfWordsClassifier, BowConfig, initialise_bow, load_bow, save_bow
from otfed.models.tokenizer import train_wordpiece
from otfed.schema import Strict

ModelKind = Literal["bert", "distilbert", "checkpoint", "bow"]
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)

#: The file :meth:`TextClassifier.save` writes beside the Hugging Face files.
META_FILE = "otfed_classifier.json"

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                    "sentencepiece.bpe.model", "tokenizer.model")
_INIT_STD = 0.02  # BERT's initializer_range

#: kind="bow": hashed-bigram embedding rows when ``ModelSpec.buckets`` is None, and the most hidden layers.
BOW_DEFAULT_BUCKETS = 0  # bigrams measured no better on SA (studies/teacher_options) and 2–3× slower
BOW_MAX_LAYERS = 4

#: One input of a classifier: a text, or a (first, second) pair of texts (NLI premise and hypothesis).
Text = Union[str, tuple[str, str]]


def _split_texts(texts: Iterable[Text]) -> tuple[list[str], list[str] | None]:
    """(first texts, second texts or None) of a batch of all-single or all-pair inputs."""
    texts = list(texts)
    pairs = [isinstance(t, (tuple, list)) for t in texts]
    if not any(pairs):
        return [str(t) for t in texts], None
    if not all(pairs) or any(len(t) != 2 for t in texts):
        raise ValueError("texts must be all strings or all (first, second) pairs")
    return [str(t[0]) for t in texts], [str(t[1]) for t in texts]


def flatten_texts(texts: Iterable[Text]) -> list[str]:
    """Every string of ``texts`` (both parts of a pair): what a WordPiece vocabulary is trained on."""
    firsts, seconds = _split_texts(texts)
    return firsts + (seconds or [])


class ModelSpec(Strict):
    """The architecture of one party's classifier (a BERT-tiny-sized encoder + classifier; KNOT app. H) — also the
    ``train_teachers.model`` params group and each entry of ``train_teachers.party_models``.

    ``layers``/``hidden``/``heads``/``intermediate`` are BERT-tiny's shape (the papers' teacher) and map to
    DistilBERT's n_layers/dim/n_heads/hidden_dim. ``dropout`` is used for hidden states and attention
    probabilities. ``max_length`` is the token budget per text (truncation; also the number of position
    embeddings of a model built here). ``vocab_size`` caps the WordPiece vocabulary trained on the
    party's texts (ignored for ``"checkpoint"``). ``checkpoint`` is a local Hugging Face directory,
    required for — and only for — ``kind="checkpoint"``.

    ``kind="bow"`` (:mod:`otfed.models.bow`) reads ``hidden`` (embedding and hidden-layer width), ``layers``
    (hidden layers between the bag and the classifier, at most :data:`BOW_MAX_LAYERS`), ``dropout``,
    ``max_length`` (word pieces read per text; a bag has no positions, so longer budgets cost little),
    ``vocab_size`` and ``buckets`` (rows of hashed word-piece bigram embeddings; None →
    :data:`BOW_DEFAULT_BUCKETS` = 0, unigrams only). It does not read ``heads`` or ``intermediate`` (nor
    checks hidden % heads); ``buckets`` must stay None for the other kinds.
    """

    kind: ModelKind = "bert"
    layers: int = Field(2, ge=1, le=48)
    hidden: int = Field(128, ge=8, le=4096)
    heads: int = Field(2, ge=1, le=64)
    intermediate: int = Field(512, ge=8, le=16384)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    max_length: int = Field(128, ge=8, le=4096, description="Tokens per input (the papers clip at 200).")
    vocab_size: int = Field(8000, ge=100, le=200000, description="WordPiece vocabulary trained per party.")
    checkpoint: str | None = Field(None, description="kind=checkpoint: a local Hugging Face model directory.")
    buckets: int | None = Field(None, ge=0, le=4_000_000,
                                description="kind=bow: hashed bigram embeddings (None: 0, unigrams only).")

    @model_validator(mode="after")
    def _shape(self) -> "ModelSpec":
        if self.kind == "checkpoint" and not self.checkpoint:
            raise ValueError("kind 'checkpoint' needs checkpoint: <a local Hugging Face model directory>")
        if self.kind != "checkpoint" and self.checkpoint is not None:
            raise ValueError(f"checkpoint is only read with kind 'checkpoint' (kind is {self.kind!r})")
        if self.kind != "bow" and self.buckets is not None:
            raise ValueError(f"buckets is only read with kind 'bow' (kind is {self.kind!r})")
        if self.kind == "bow":
            if self.layers > BOW_MAX_LAYERS:
                raise ValueError(f"layers: kind 'bow' takes 1..{BOW_MAX_LAYERS} hidden layers (got {self.layers})")
        elif self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        return self

    @property
    def bow_buckets(self) -> int:
        """Hashed bigram rows of a ``kind="bow"`` model: ``buckets``, or :data:`BOW_DEFAULT_BUCKETS` if None."""
        return BOW_DEFAULT_BUCKETS if self.buckets is None else self.buckets


def resolve_device(device: str | torch.device | None) -> torch.device:
    """:func:`otfed.device.resolve_device` as a ``torch.device``: ``"auto"`` → cuda when available, else
    cpu; None → cpu; anything else as given (``"cuda:1"``)."""
    return torch.device(resolve_device_name(None if device is None else str(device)))


class TextClassifier:
    """A tokenizer + sequence-classification model + token budget: one party's model (KNOT §6). The model is a
    ``transformers`` one or a :class:`~otfed.models.bow.BagOfWordsClassifier` (same forward/``config`` shape).

    ``labels`` names the C output columns in order. :meth:`logits` is differentiable (the caller sets
    train/eval mode); :meth:`predict_proba` runs in eval mode without gradients. Tokenisation is
    guarded by a lock, so threads may share one classifier for prediction. Batches go to the model's
    device without blocking (:func:`otfed.device.to_device`); :meth:`predict_proba` reads the probabilities back once,
    not per batch, and :meth:`predict_proba_tensor` leaves them on the device.
    """

    def __init__(self, model: nn.Module, tokenizer, labels: Sequence[str], max_length: int,
                 spec: ModelSpec | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.labels = tuple(str(label) for label in labels)
        self.max_length = int(max_length)
        self.spec = spec
        if self.tokenizer.pad_token is None:
            if self.tokenizer.eos_token is None:
                raise DataFileError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no pad or eos token")
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        n_out = int(model.config.num_labels)
        if n_out != len(self.labels):
            raise ValueError(f"model has {n_out} outputs but {len(self.labels)} labels were given")
        params = inspect.signature(model.forward).parameters
        self._inputs = set(params)  # what the model's forward accepts: batches keep only these keys
        if "input_ids" not in params:  # a forward(**kwargs) model: trust the tokenizer's input names
            self._inputs |= set(getattr(tokenizer, "model_input_names", ())) | {"input_ids", "attention_mask"}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------ properties
    @property
    def n_labels(self) -> int:
        return len(self.labels)

    @property
    def n_parameters(self) -> int:
        """Number of trainable and frozen parameters of the model (tied weights counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device | None) -> "TextClassifier":
        """Move the model to ``device`` (:func:`resolve_device`: "auto" picks cuda when available); returns self."""
        self.model.to(resolve_device(device))
        return self

    # ---------------------------------------------------------------------------------- tokenisation
    def pretokenize(self, texts: Iterable[Text]) -> list[dict[str, list[int]]]:
        """Token ids (and the tokenizer's other per-token inputs) of every text, truncated to
        ``max_length``, unpadded — tokenise once, then :meth:`collate` batches of them.

        A text is a string, or a (first, second) pair of strings — e.g. NLI's premise and hypothesis —
        encoded as ``[CLS] first [SEP] second [SEP]`` with segment ids 0/1 (longest part truncated first).
        """
        firsts, seconds = _split_texts(texts)
        if not firsts:
            return []
        with self._lock:
            enc = self.tokenizer(firsts, seconds, truncation=True, max_length=self.max_length, padding=False,
                                 return_token_type_ids="token_type_ids" in self._inputs)
        keys = [k for k in enc.keys() if k in self._inputs]
        return [{k: enc[k][i] for k in keys} for i in range(len(firsts))]

    def collate(self, features: Sequence[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        """Pad pretokenised texts to the longest of the batch (on the tokenizer's padding side) and move
        them to the model's device: a dict of B×T long tensors the model accepts."""
        if not features:
            raise ValueError("cannot collate an empty batch")
        longest = max(len(f["input_ids"]) for f in features)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        pads = {"input_ids": self.tokenizer.pad_token_id,
                "token_type_ids": getattr(self.tokenizer, "pad_token_type_id", 0)}
        batch: dict[str, torch.Tensor] = {}
        for key in features[0]:
            out = torch.full((len(features), longest), int(pads.get(key, 0)), dtype=torch.long)
            for row, feature in enumerate(features):
                values = torch.as_tensor(feature[key], dtype=torch.long)
                if left:
                    out[row, longest - len(values):] = values
                else:
                    out[row, :len(values)] = values
            batch[key] = out
        if "attention_mask" in self._inputs and "attention_mask" not in batch:
            lengths = torch.tensor([len(f["input_ids"]) for f in features])
            positions = torch.arange(longest)
            batch["attention_mask"] = (positions >= longest - lengths[:, None] if left
                                       else positions < lengths[:, None]).long()
        device = self.device
        return {k: to_device(v, device) for k, v in batch.items()}

    def encode(self, texts: Sequence[Text]) -> dict[str, torch.Tensor]:
        """Tokenise ``texts`` into one batch: padded to the longest text, truncated to ``max_length``,
        on the model's device (``[CLS] … [SEP]`` added by the tokenizer's post-processor)."""
        return self.collate(self.pretokenize(texts))

    # ------------------------------------------------------------------------------------- inference
    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """B×C classification logits of an :meth:`encode`/:meth:`collate` batch; differentiable, and the
        caller sets ``model.train()`` / ``model.eval()``."""
        return self.model(**{k: v for k, v in batch.items() if k in self._inputs}).logits

    def predict_proba(self, texts: Sequence[Text], batch_size: int = 128, progress: bool = False,
                      description: str = "predict") -> np.ndarray:
        """N×C float64 softmax probabilities h(x) of ``texts``, in eval mode without gradients.

        Texts are batched in order of length (less padding) and the rows returned in input order.
        """
        return self.predict_proba_features(self.pretokenize(texts), batch_size, progress, description)

    def predict_proba_features(self, features: Sequence[dict[str, list[int]]], batch_size: int = 128,
                               progress: bool = False, description: str = "predict") -> np.ndarray:
        """:meth:`predict_proba` of already :meth:`pretokenize`-d texts."""
        return self._probabilities(features, batch_size, progress, description).cpu().numpy()

    def predict_proba_tensor(self, texts: Sequence[Text], batch_size: int = 128, progress: bool = False,
                             description: str = "predict") -> torch.Tensor:
        """:meth:`predict_proba` as an N×C float64 tensor on the model's device. The batches' probabilities
        stay on the device (not read back per batch), so a caller that reduces them there — the probability
        bias — reads back only its result. (In eval mode ``transformers``' SDPA attention still reads the
        padding mask back once per forward, to decide whether it may drop the mask.)"""
        return self._probabilities(self.pretokenize(texts), batch_size, progress, description)

    def _probabilities(self, features: Sequence[dict[str, list[int]]], batch_size: int, progress: bool,
                       description: str) -> torch.Tensor:
        """Softmax probabilities (float64, on the model's device, input order) of pretokenised texts, batched
        in order of length; one copy back to input order at the end."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
        if not features:
            return torch.empty((0, self.n_labels), dtype=torch.float64, device=self.device)
        order = np.argsort([len(f["input_ids"]) for f in features], kind="stable")
        was_training = self.model.training
        self.model.eval()
        parts = []
        try:
            with torch.no_grad():
                starts = range(0, len(order), batch_size)
                for start in tqdm(starts, total=len(starts), desc=description, unit="batch", disable=not progress):
                    logits = self.logits(self.collate([features[i] for i in order[start:start + batch_size]]))
                    parts.append(torch.softmax(logits.double(), dim=-1))
        finally:
            self.model.train(was_training)
        sorted_probs = torch.cat(parts)
        out = torch.empty_like(sorted_probs)
        out[to_device(torch.as_tensor(order), out.device)] = sorted_probs  # back to input order
        return out

    # ------------------------------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """Write the model, the tokenizer (``save_pretrained``) and ``otfed_classifier.json`` (spec,
        labels, max_length, architecture) to ``directory``, atomically: built beside it, then swapped in.
        A Hugging Face model is written with ``save_pretrained``; a bag-of-words model as its state dict
        (``model.safetensors``) + ``bow_config.json`` (:func:`otfed.models.bow.save_bow`)."""
        directory = Path(directory)
        meta = {"labels": list(self.labels), "max_length": self.max_length,
                "spec": None if self.spec is None else self.spec.model_dump(),
                "architecture": type(self.model).__name__}
        with staged_directory(directory) as tmp:
            if isinstance(self.model, BagOfWordsClassifier):  # not a Hugging Face model: state dict + JSON config
                save_bow(self.model, tmp)
            else:
                self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            write_json(meta, tmp / META_FILE)
        return directory

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device | None = None) -> "TextClassifier":
        """A classifier written by :meth:`save`, offline, in eval mode, on ``device`` (None: cpu; "auto": cuda
        when available). Raises :class:`~otfed.errors.DataFileError` naming a missing or incomplete file."""
        directory = Path(directory)
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            raise DataFileError(f"{meta_path}: missing — not a classifier saved by otfed "
                                "(use ModelSpec(kind='checkpoint') for a plain Hugging Face directory)")
        try:
            meta = json.loads(meta_path.read_text())
            labels, max_length = meta["labels"], int(meta["max_length"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DataFileError(f"{meta_path}: unreadable classifier metadata ({exc})") from exc
        spec = None
        if meta.get("spec"):
            known = set(ModelSpec.model_fields)
            spec = ModelSpec(**{k: v for k, v in meta["spec"].items() if k in known})
        if meta.get("architecture") == BagOfWordsClassifier.__name__:
            model = load_bow(directory)
            tokenizer = _load_tokenizer(directory)
        else:
            tokenizer, model, info = _load_pretrained(directory, labels, output_loading_info=True, strict=True)
            incomplete = sorted(set(info.get("missing_keys", ())) |
                                {str(k[0]) for k in info.get("mismatched_keys", ())})
            if incomplete:
                raise DataFileError(f"{directory}: saved weights lack or mis-shape {', '.join(incomplete)}")
        check_finite_weights(model, directory)
        model.eval()
        return cls(model, tokenizer, labels, max_length, spec).to(device)

    def __repr__(self) -> str:
        return (f"TextClassifier({type(self.model).__name__}, labels={self.labels}, max_length={self.max_length}, "
                f"n_parameters={self.n_parameters}, device={self.device})")


def check_finite_weights(model: nn.Module, directory: Path) -> None:
    """DataError naming the weights file of ``directory``, the first tensor holding NaN or ±inf and how many
    of its values do, unless every floating-point tensor of ``model``'s state is finite: a diverged or damaged
    checkpoint would predict NaN for every text (its bias, its messages), far from the error's cause."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            where = next((directory / f for f in _WEIGHT_FILES if (directory / f).is_file()), directory)
            bad = int((~torch.isfinite(tensor)).sum())
            raise DataError(f"{where}: tensor {name!r} holds {bad} NaN or inf value(s) of {tensor.numel()}; a "
                            "checkpoint's weights must be finite — rerun `dvc repro train_teachers`")


# -------------------------------------------------------------------------------------------- build
def build_classifier(spec: ModelSpec, labels: Sequence[str], train_texts: Sequence[Text] | None, seed: int,
                     device: str | torch.device | None = "cpu") -> TextClassifier:
    """A fresh classifier for one party (a BERT-tiny-sized encoder + classifier; KNOT §6).

    ``bert``/``distilbert``: a WordPiece tokenizer trained on ``train_texts`` and a randomly initialised
    model of ``spec``'s size with ``len(labels)`` outputs — BERT's initialisation (linear and embedding
    weights ~ N(0, 0.02²), biases 0, LayerNorm 1/0, padding embedding 0) drawn from a generator seeded
    with ``seed``, so the same seed gives identical weights. ``bow``: the same tokenizer and a
    :class:`~otfed.models.bow.BagOfWordsClassifier` (pair features when ``train_texts`` are pairs),
    initialised by :func:`~otfed.models.bow.initialise_bow` from the seeded generator. ``checkpoint``: the tokenizer and model of
    the local directory ``spec.checkpoint``; a head whose size does not fit ``labels`` (or is absent) is
    re-initialised the same seeded way. Raises :class:`~otfed.errors.DataFileError` naming the
    directory and the missing file.
    """
    labels = tuple(str(label) for label in labels)
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ValueError(f"need at least two distinct labels, got {labels}")
    generator = torch.Generator().manual_seed(int(seed))
    if spec.kind == "checkpoint":
        tokenizer, model, fresh = _load_checkpoint(Path(spec.checkpoint), labels)
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions is not None and spec.max_length > positions:
            raise ConfigError(f"model.max_length: {spec.max_length} exceeds the {positions} positions of "
                              f"checkpoint {spec.checkpoint}")
        _initialise(model, generator, only=fresh)
    else:
        texts = [] if train_texts is None else list(train_texts)
        if not texts:
            raise ValueError(f"kind {spec.kind!r} trains its WordPiece vocabulary on train_texts: none given")
        tokenizer = train_wordpiece(flatten_texts(texts), vocab_size=spec.vocab_size)
        if spec.kind == "bow":
            model = _fresh_bow(spec, labels, tokenizer, pairs=_split_texts(texts)[1] is not None)
            initialise_bow(model, generator)
        else:
            model = _fresh_model(spec, labels, tokenizer)
            uncovered = _initialise(model, generator)
            if uncovered:  # cannot happen for BERT/DistilBERT: every parameter is a Linear/Embedding/LayerNorm one
                raise RuntimeError(f"parameters without a seeded initialisation: {uncovered}")
    tokenizer.model_max_length = spec.max_length
    model.eval()
    return TextClassifier(model, tokenizer, labels, spec.max_length, spec).to(device)


def _label_maps(labels: Sequence[str]) -> dict:
    return {"id2label": dict(enumerate(labels)), "label2id": {label: i for i, label in enumerate(labels)}}


def _fresh_model(spec: ModelSpec, labels: Sequence[str], tokenizer) -> nn.Module:
    """BERT or DistilBERT of ``spec``'s size over ``tokenizer``'s vocabulary (weights still to initialise)."""
    common = dict(vocab_size=len(tokenizer), max_position_embeddings=spec.max_length,
                  pad_token_id=tokenizer.pad_token_id, initializer_range=_INIT_STD, num_labels=len(labels),
                  **_label_maps(labels))
    if spec.kind == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        config = BertConfig(hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                            num_attention_heads=spec.heads, intermediate_size=spec.intermediate,
                            hidden_dropout_prob=spec.dropout, attention_probs_dropout_prob=spec.dropout,
                            type_vocab_size=2, **common)
        return BertForSequenceClassification(config)
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    config = DistilBertConfig(dim=spec.hidden, n_layers=spec.layers, n_heads=spec.heads,
                              hidden_dim=spec.intermediate, dropout=spec.dropout,
                              attention_dropout=spec.dropout, seq_classif_dropout=spec.dropout,
                              sinusoidal_pos_embds=False, **common)
    return DistilBertForSequenceClassification(config)


def _fresh_bow(spec: ModelSpec, labels: Sequence[str], tokenizer, pairs: bool) -> BagOfWordsClassifier:
    """A bag-of-words model of ``spec``'s size over ``tokenizer``'s vocabulary (weights still to initialise)."""
    return BagOfWordsClassifier(BowConfig(
        vocab_size=len(tokenizer), hidden=spec.hidden, num_labels=len(labels), layers=spec.layers,
        buckets=spec.bow_buckets, dropout=spec.dropout, pairs=pairs, pad_token_id=tokenizer.pad_token_id,
        **_label_maps(labels)))


@torch.no_grad()
def _initialise(model: nn.Module, generator: torch.Generator, only: set[str] | None = None) -> list[str]:
    """BERT's initialisation, drawn from ``generator`` (CPU) in module order, of every parameter of
    ``model`` — or of the parameters named in ``only``: Linear/Embedding weights ~ N(0, std²) (std =
    config.initializer_range, else 0.02), biases 0, an Embedding's padding row 0, LayerNorm weight 1
    and bias 0; a parameter shared by two modules (tied weights) only once, at its first module. Returns the
    names of the parameters in scope it did not know how to initialise."""
    std = float(getattr(getattr(model, "config", None), "initializer_range", None) or _INIT_STD)
    left: list[str] = []
    seen: set[int] = set()  # a tied parameter (an MLM decoder's = the word embeddings) is drawn once
    for mname, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if (only is not None and full not in only) or id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, (nn.Linear, nn.Embedding)) and pname == "weight":
                draw = torch.randn(param.shape, generator=generator, dtype=torch.float32)
                param.copy_(draw.to(param.dtype) * std)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    param[module.padding_idx].zero_()
            elif isinstance(module, nn.Linear) and pname == "bias":
                param.zero_()
            elif isinstance(module, nn.LayerNorm) or "LayerNorm" in type(module).__name__:
                param.fill_(1.0) if pname == "weight" else param.zero_()
            else:
                left.append(full)
    return left


# ------------------------------------------------------------------------------- checkpoint loading
def _check_checkpoint_dir(directory: Path) -> None:
    if not directory.is_dir():
        raise DataFileError(f"{directory}: checkpoint directory not found")
    if not (directory / "config.json").is_file():
        raise DataFileError(f"{directory / 'config.json'}: missing — a checkpoint directory needs config.json")
    if not any((directory / f).is_file() for f in _WEIGHT_FILES):
        raise DataFileError(f"{directory}: no model weights (expected one of {', '.join(_WEIGHT_FILES)})")
    if not any((directory / f).is_file() for f in _TOKENIZER_FILES):
        raise DataFileError(f"{directory}: no tokenizer files (expected one of {', '.join(_TOKENIZER_FILES)})")


def _load_tokenizer(directory: Path):
    """The fast tokenizer ``save_pretrained`` wrote to ``directory`` (a bag-of-words classifier's), offline."""
    from transformers import PreTrainedTokenizerFast

    if not (directory / "tokenizer.json").is_file():
        raise DataFileError(f"{directory / 'tokenizer.json'}: missing — the classifier's tokenizer")
    try:
        return PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"{directory}: cannot load the tokenizer ({exc})") from exc


def _load_pretrained(directory: Path, labels: Sequence[str], output_loading_info: bool = False,
                     strict: bool = False):
    """(tokenizer, model[, loading info]) of a local Hugging Face directory, offline; errors name it.
    Unless ``strict``, weights of the wrong shape (a head for another number of labels) are skipped."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _check_checkpoint_dir(directory)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataFileError(f"{directory}: cannot load the tokenizer ({exc})") from exc
    try:
        loaded = AutoModelForSequenceClassification.from_pretrained(
            str(directory), num_labels=len(labels), local_files_only=True, ignore_mismatched_sizes=not strict,
            output_loading_info=output_loading_info, **_label_maps(labels))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise DataFileError(f"{directory}: cannot load a sequence-classification model ({exc})") from exc
    if output_loading_info:
        model, info = loaded
        return tokenizer, model, info
    return tokenizer, loaded


def _load_checkpoint(directory: Path, labels: Sequence[str]) -> tuple[object, nn.Module, set[str]]:
    """(tokenizer, model, names of the parameters that were absent from the checkpoint or of the wrong
    shape — the ones ``from_pretrained`` initialised from torch's global RNG)."""
    tokenizer, model, info = _load_pretrained(directory, labels, output_loading_info=True)
    fresh = set(info.get("missing_keys", ())) | {k[0] if isinstance(k, (tuple, list)) else k
                                                 for k in info.get("mismatched_keys", ())}
    return tokenizer, model, fresh
