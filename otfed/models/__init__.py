"""Text classifiers for the KNOT track (KNOT §6): tokenizer, models and supervised training, offline.

KNOT's teachers, global model and student are BERT-tiny-sized encoder + classifier models trained
with cross-entropy (KNOT §6, app. H); teachers may differ in architecture. Nothing is downloaded: a
party trains its own WordPiece vocabulary, models are built from configs, and any other model comes
from a local Hugging Face directory.

Public names (implementation modules in parentheses):

- ``train_wordpiece``, ``vocabulary`` — a deterministic BERT-style WordPiece tokenizer trained on a
  party's texts; its vocabulary in id order (for the probability bias, KNOT app. D.1)   (tokenizer)
- ``ModelSpec``, ``MODEL_KINDS`` — the architecture: "bert", "distilbert", "checkpoint" or "bow"; also
  the ``train_teachers.model`` params group                                                    (text)
- ``BagOfWordsClassifier`` — kind "bow": mean of word-piece (+ hashed bigram) embeddings → MLP, a fast
  non-transformer teacher; saved as a state dict + JSON config                                  (bow)
- ``Text`` — one input: a string or a (first, second) pair such as NLI's premise/hypothesis  (text)
- ``TextClassifier`` — tokenizer + model + max_length: ``encode``, ``logits``, ``predict_proba``
  (``predict_proba_tensor``: the same, left on the model's device), ``save`` / ``load``          (text)
- ``build_classifier`` — a fresh seeded classifier for a spec                                  (text)
- ``TrainingConfig``, ``train_classifier``, ``TrainResult``, ``predict_labels`` — cross-entropy training
  (optionally class-balanced: ``class_weights``) with early stopping on validation macro-F1 or the last
  epoch kept (``TrainingConfig`` is also the ``train_teachers.training`` params group)       (training)
- ``MLMConfig``, ``pretrain_mlm`` — masked-language-model pretraining of a shared BERT encoder on
  in-domain texts, saved for ``ModelSpec(kind="checkpoint")``                             (pretraining)
- ``seeded_dropout`` — dropout from a private generator (thread-safe reproducibility)      (training)
"""

from otfed.models.bow import BagOfWordsClassifier
from otfed.models.text import MODEL_KINDS, ModelSpec, Text, TextClassifier, build_classifier, resolve_device
from otfed.models.tokenizer import train_wordpiece, vocabulary
from otfed.models.training import (EPOCH_KEYS, TrainingConfig, TrainResult, class_weights, predict_labels,
                                   seeded_dropout, train_classifier)
from otfed.models.pretraining import MLMConfig, pretrain_mlm

__all__ = [
    "BagOfWordsClassifier",
    "MODEL_KINDS",
    "ModelSpec",
    "Text",
    "TextClassifier",
    "build_classifier",
    "resolve_device",
    "train_wordpiece",
    "vocabulary",
    "EPOCH_KEYS",
    "TrainingConfig",
    "TrainResult",
    "train_classifier",
    "class_weights",
    "MLMConfig",
    "pretrain_mlm",
    "predict_labels",
    "seeded_dropout",
]
