"""Text classifiers built without downloads (a BERT-tiny-sized encoder + classifier; KNOT §6)."""
from __future__ import annotations

import json
import numpy as np
import pytest
import torch
from transformers import (BertConfig, BertForSequenceClassification, BertTokenizer,
                          DistilBertForSequenceClassification)

from otfed.errors import ConfigError, DataFileError
from otfed.models import ModelSpec, TextClassifier, build_classifier
from otfed.models.text import META_FILE

LABELS = ("neg", "pos")


def bert_parameter_count(V: int, P: int, H: int, L: int, I: int, C: int, T: int = 2) -> int:
    """Closed form: embeddings (word, position, token type, LayerNorm) + L layers (Q, K, V, attention
    output, LayerNorm, intermediate, output, LayerNorm) + pooler + classifier."""
    embeddings = V * H + P * H + T * H + 2 * H
    layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    return embeddings + L * layer + (H * H + H) + (H * C + C)


def distilbert_parameter_count(V: int, P: int, H: int, L: int, I: int, C: int) -> int:
    """Closed form: embeddings (word, position, LayerNorm) + L layers + pre-classifier + classifier."""
    layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    return V * H + P * H + 2 * H + L * layer + (H * H + H) + (H * C + C)


def state(clf: TextClassifier) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in clf.model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------ spec
@pytest.mark.parametrize("kwargs, key", [
    ({"kind": "gpt"}, "ModelSpec: kind: Input should be 'bert', 'distilbert', 'checkpoint' or 'bow'"),
    ({"hidden": 30, "heads": 4}, r"ModelSpec: hidden \(30\) must be a multiple of heads \(4\)"),
    ({"dropout": 1.0}, "ModelSpec: dropout"),
    ({"layers": 0}, "ModelSpec: layers"),
    ({"kind": "checkpoint"}, "ModelSpec: kind 'checkpoint' needs checkpoint"),
    ({"checkpoint": "some/dir"}, "ModelSpec: checkpoint is only read with kind 'checkpoint'"),
])
def test_model_spec_rejects_bad_values(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        ModelSpec(**kwargs)


# ----------------------------------------------------------------------------------------- build
def test_bert_parameter_count_matches_closed_form_and_transformers(task, tiny_spec):
    texts = task[0]
    spec = tiny_spec.model_copy(update=dict(layers=2))
    clf = build_classifier(spec, LABELS, texts, seed=0)
    V = len(clf.tokenizer)
    expected = bert_parameter_count(V, spec.max_length, spec.hidden, spec.layers, spec.intermediate, len(LABELS))
    assert clf.n_parameters == expected
    independent = BertForSequenceClassification(BertConfig(
        vocab_size=V, hidden_size=spec.hidden, num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        intermediate_size=spec.intermediate, max_position_embeddings=spec.max_length, num_labels=len(LABELS)))
    assert {k: v.shape for k, v in independent.state_dict().items()} == \
        {k: v.shape for k, v in clf.model.state_dict().items()}


def test_bert_tiny_default_size():
    # The papers' teacher: 2 layers, hidden 128, 2 heads, intermediate 512 (BERT-tiny), here over a small
    # trained vocabulary and 128 positions.
    spec = ModelSpec()
    clf = build_classifier(spec, ("a", "b", "c"), ["good movie", "bad film", "good film"] * 2, seed=0)
    assert clf.n_parameters == bert_parameter_count(len(clf.tokenizer), 128, 128, 2, 512, 3)


def test_distilbert_parameter_count_and_logits(task, tiny_spec):
    spec = tiny_spec.model_copy(update=dict(kind="distilbert", layers=2))
    clf = build_classifier(spec, LABELS, task[0], seed=0)
    assert isinstance(clf.model, DistilBertForSequenceClassification)
    assert clf.n_parameters == distilbert_parameter_count(len(clf.tokenizer), spec.max_length, spec.hidden,
                                                          spec.layers, spec.intermediate, len(LABELS))
    batch = clf.encode(task[0][:5])
    assert "token_type_ids" not in batch
    assert clf.logits(batch).shape == (5, 2)


@pytest.mark.parametrize("kind", ["bert", "distilbert"])
def test_same_seed_same_weights_whatever_the_global_rng(task, tiny_spec, kind):
    spec = tiny_spec.model_copy(update=dict(kind=kind))
    torch.manual_seed(1)
    a = state(build_classifier(spec, LABELS, task[0], seed=7))
    torch.manual_seed(2)
    b = state(build_classifier(spec, LABELS, task[0], seed=7))
    c = state(build_classifier(spec, LABELS, task[0], seed=8))
    assert same_state(a, b)
    assert not same_state(a, c)


def test_initialisation_is_berts(task):
    spec = ModelSpec(layers=1, hidden=64, heads=2, intermediate=256, max_length=64, vocab_size=300)
    model = build_classifier(spec, LABELS, task[0], seed=3).model
    word = model.bert.embeddings.word_embeddings.weight
    assert torch.all(word[0] == 0)  # [PAD] row
    dense = model.bert.encoder.layer[0].intermediate.dense
    weight = dense.weight.detach()
    assert abs(float(weight.std()) - 0.02) < 0.001 and abs(float(weight.mean())) < 0.001
    assert torch.all(dense.bias == 0)
    norm = model.bert.encoder.layer[0].output.LayerNorm
    assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)


def test_bert_kind_needs_training_texts(tiny_spec):
    with pytest.raises(ValueError, match="train_texts"):
        build_classifier(tiny_spec, LABELS, None, seed=0)
    with pytest.raises(ValueError, match="labels"):
        build_classifier(tiny_spec, ("x",), ["a b"], seed=0)


# ---------------------------------------------------------------------------------- encode/predict
@pytest.fixture(scope="module")
def clf(task, tiny_spec) -> TextClassifier:
    return build_classifier(tiny_spec, LABELS, task[0], seed=0)


def test_encode_pads_to_longest_and_truncates(clf):
    long_text = " ".join(["good movie"] * 50)
    batch = clf.encode(["good", "bad movie plot", long_text])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert ids.shape == (3, clf.max_length)
    assert ids[:, 0].tolist() == [clf.tokenizer.cls_token_id] * 3
    assert mask[0].tolist() == [1, 1, 1] + [0] * (clf.max_length - 3)  # [CLS] good [SEP] + padding
    assert ids[0, 3:].eq(clf.tokenizer.pad_token_id).all()
    assert ids[2, -1] == clf.tokenizer.sep_token_id and mask[2].all()
    short = clf.encode(["good", "bad movie plot"])["input_ids"]
    assert short.shape == (2, 5)  # [CLS] bad movie plot [SEP]


def test_encode_text_pairs(clf):
    batch = clf.encode([("good film", "bad plot"), ("a", "b")])
    tokens = clf.tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    assert tokens == ["[CLS]", "good", "film", "[SEP]", "bad", "plot", "[SEP]"]
    assert batch["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="pairs"):
        clf.encode(["one", ("two", "three")])


def test_predict_proba_is_softmax_of_logits(clf, task):
    texts = task[2][:20]
    probs = clf.predict_proba(texts, batch_size=6)
    assert probs.dtype == np.float64 and probs.shape == (20, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    clf.model.eval()
    with torch.no_grad():
        one_by_one = np.stack([torch.softmax(clf.logits(clf.encode([t])).double(), -1)[0].numpy() for t in texts])
    np.testing.assert_allclose(probs, one_by_one, atol=1e-6)
    perm = np.random.default_rng(0).permutation(20)
    np.testing.assert_allclose(clf.predict_proba([texts[i] for i in perm]), probs[perm], atol=1e-6)
    assert clf.predict_proba([]).shape == (0, 2)


def test_predict_proba_restores_training_mode(clf):
    clf.model.train()
    clf.predict_proba(["good"])
    assert clf.model.training
    clf.model.eval()


# ------------------------------------------------------------------------------------- save/load
def test_save_load_round_trip(clf, task, tmp_path):
    texts = task[2]
    target = tmp_path / "teacher"
    clf.save(target)
    clf.save(target)  # overwriting an existing directory works (swapped in atomically)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]  # no staging directory left behind
    meta = json.loads((target / META_FILE).read_text())
    assert meta["labels"] == list(LABELS) and meta["max_length"] == clf.max_length
    loaded = TextClassifier.load(target, device="cpu")
    assert loaded.labels == clf.labels and loaded.spec == clf.spec
    np.testing.assert_array_equal(loaded.predict_proba(texts), clf.predict_proba(texts))
    assert same_state(state(loaded), state(clf))


def test_load_of_a_plain_directory_names_the_missing_file(tmp_path):
    with pytest.raises(DataFileError, match=META_FILE):
        TextClassifier.load(tmp_path)


# ------------------------------------------------------------------------------------ checkpoints
WORDS = ["good", "bad", "movie", "film", "plot", "the", "a", "was", "##s", "##ing"]


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A tiny BERT classifier and a BERT tokenizer made with transformers alone, saved like a Hub model."""
    directory = tmp_path_factory.mktemp("checkpoint")
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tokenizer = BertTokenizer(vocab=vocab)
    torch.manual_seed(123)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, num_labels=3))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, model.eval(), tokenizer


CHECKPOINT_TEXTS = ["the good movie", "a bad films plot", "good", "the plot was bad bad bad"]


def test_checkpoint_logits_equal_the_original_models(checkpoint_dir):
    directory, model, tokenizer = checkpoint_dir
    spec = ModelSpec(kind="checkpoint", checkpoint=str(directory), max_length=32)
    clf = build_classifier(spec, ("x", "y", "z"), None, seed=0)
    with torch.no_grad():
        expected = model(**tokenizer(CHECKPOINT_TEXTS, padding=True, return_tensors="pt")).logits
        got = clf.logits(clf.encode(CHECKPOINT_TEXTS))
    torch.testing.assert_close(got, expected)
    np.testing.assert_allclose(clf.predict_proba(CHECKPOINT_TEXTS),
                               torch.softmax(expected.double(), -1).numpy(), atol=1e-6)
    assert clf.model.config.id2label == {0: "x", 1: "y", 2: "z"}


def test_checkpoint_head_of_another_size_is_reinitialised_with_the_seed(checkpoint_dir):
    directory, model, _ = checkpoint_dir
    spec = ModelSpec(kind="checkpoint", checkpoint=str(directory), max_length=32)
    a = build_classifier(spec, LABELS, None, seed=4)
    b = build_classifier(spec, LABELS, None, seed=4)
    c = build_classifier(spec, LABELS, None, seed=5)
    assert a.model.classifier.weight.shape == (2, 16)
    assert same_state(state(a), state(b))
    assert not torch.equal(a.model.classifier.weight, c.model.classifier.weight)
    original = model.state_dict()
    for key, value in a.model.state_dict().items():
        if not key.startswith("classifier."):
            assert torch.equal(value, original[key]), key  # the encoder is the checkpoint's


def test_checkpoint_errors_name_the_directory_and_file(checkpoint_dir, tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataFileError, match="nowhere"):
        build_classifier(ModelSpec(kind="checkpoint", checkpoint=str(missing)), LABELS, None, seed=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataFileError, match=r"empty.config\.json"):
        build_classifier(ModelSpec(kind="checkpoint", checkpoint=str(empty)), LABELS, None, seed=0)
    (empty / "config.json").write_text((checkpoint_dir[0] / "config.json").read_text())
    with pytest.raises(DataFileError, match="no model weights"):
        build_classifier(ModelSpec(kind="checkpoint", checkpoint=str(empty)), LABELS, None, seed=0)
    (empty / "model.safetensors").write_bytes((checkpoint_dir[0] / "model.safetensors").read_bytes())
    with pytest.raises(DataFileError, match="no tokenizer files"):
        build_classifier(ModelSpec(kind="checkpoint", checkpoint=str(empty)), LABELS, None, seed=0)


def test_checkpoint_max_length_beyond_its_positions(checkpoint_dir):
    spec = ModelSpec(kind="checkpoint", checkpoint=str(checkpoint_dir[0]), max_length=100)
    with pytest.raises(ConfigError, match="64 positions"):
        build_classifier(spec, LABELS, None, seed=0)


def test_predict_proba_tensor_is_predict_proba_left_on_the_models_device(clf, task):
    texts = task[2][:13]
    probs = clf.predict_proba_tensor(texts, batch_size=4)
    assert probs.dtype == torch.float64 and probs.device == clf.device and probs.shape == (13, 2)
    np.testing.assert_array_equal(probs.numpy(), clf.predict_proba(texts, batch_size=4))  # same batches, same values
    assert clf.predict_proba_tensor([]).shape == (0, 2)
    with pytest.raises(ValueError, match="batch_size"):
        clf.predict_proba_tensor(texts, batch_size=0)

