"""The bag-of-words classifier kind (a fastText-style heterogeneous teacher; KNOT §6)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from otfed.errors import ConfigError, DataFileError
from otfed.models import ModelSpec, TextClassifier, TrainingConfig, build_classifier, predict_labels, train_classifier
from otfed.models.bow import BOW_CONFIG_FILE, BagOfWordsClassifier, BowConfig
from otfed.models.text import BOW_DEFAULT_BUCKETS, META_FILE
from otfed.metrics import macro_f1

LABELS = ("neg", "pos")


@pytest.fixture(scope="module")
def bow_spec() -> ModelSpec:
    return ModelSpec(kind="bow", layers=1, hidden=16, dropout=0.1, max_length=24, vocab_size=300, buckets=64)


def state(clf: TextClassifier) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in clf.model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------ spec
@pytest.mark.parametrize("kwargs, key", [
    ({"kind": "bert", "buckets": 100}, "ModelSpec: buckets is only read with kind 'bow' \\(kind is 'bert'\\)"),
    ({"kind": "bow", "layers": 5}, "ModelSpec: layers: kind 'bow' takes 1..4 hidden layers \\(got 5\\)"),
    ({"kind": "bow", "buckets": -1}, "ModelSpec: buckets: Input should be greater than or equal to 0"),
    ({"kind": "bow", "checkpoint": "x"}, "ModelSpec: checkpoint is only read with kind 'checkpoint'"),
    ({"kind": "bag"}, "ModelSpec: kind: Input should be 'bert', 'distilbert', 'checkpoint' or 'bow'"),
])
def test_bow_spec_rejects_bad_values(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        ModelSpec(**kwargs)


def test_bow_spec_ignores_the_attention_fields():
    # heads/intermediate are not read by a bag of words, so hidden need not be a multiple of heads
    spec = ModelSpec(kind="bow", hidden=30, heads=4)
    assert spec.bow_buckets == BOW_DEFAULT_BUCKETS
    assert ModelSpec(kind="bow", buckets=0).bow_buckets == 0


# ----------------------------------------------------------------------------------------- build
def test_parameter_count_and_logits_shape(task, bow_spec):
    clf = build_classifier(bow_spec, LABELS, task[0], seed=0)
    assert isinstance(clf.model, BagOfWordsClassifier) and not clf.model.config.pairs
    V, B, H = len(clf.tokenizer), 64, 16
    assert clf.n_parameters == (V + B) * H + (H * H + H) + (H * 2 + 2)
    assert clf.logits(clf.encode(task[0][:5])).shape == (5, 2)
    two = build_classifier(bow_spec.model_copy(update=dict(layers=2, buckets=0)), LABELS, task[0], seed=0)
    assert two.n_parameters == V * H + 2 * (H * H + H) + (H * 2 + 2)


def test_same_seed_same_weights_whatever_the_global_rng(task, bow_spec):
    torch.manual_seed(1)
    a = state(build_classifier(bow_spec, LABELS, task[0], seed=7))
    torch.manual_seed(2)
    b = state(build_classifier(bow_spec, LABELS, task[0], seed=7))
    c = state(build_classifier(bow_spec, LABELS, task[0], seed=8))
    assert same_state(a, b) and not same_state(a, c)
    assert torch.all(a["embeddings.weight"][0] == 0)  # the [PAD] row
    assert torch.all(a["classifier.bias"] == 0)


def test_bag_is_the_mean_of_piece_and_bigram_embeddings(task, bow_spec):
    """Features recomputed by hand from the embedding table: unigram rows, and bigram rows at
    V + (a·1000003 + b) mod buckets; padding never counts."""
    clf = build_classifier(bow_spec, LABELS, task[0], seed=0)
    model = clf.model.eval()
    table = model.embeddings.weight.detach().numpy()
    V, buckets = model.config.vocab_size, model.config.buckets
    texts = ["good movie", "the plot was bad and the film was quite very bad"]
    batch = clf.encode(texts)
    with torch.no_grad():
        bag = model.bag(**batch).numpy()
    for row, text in enumerate(texts):
        ids = clf.tokenizer(text)["input_ids"]  # [CLS] … [SEP], unpadded
        rows = list(ids) + [V + (a * 1_000_003 + b) % buckets for a, b in zip(ids[:-1], ids[1:])]
        np.testing.assert_allclose(bag[row], table[rows].mean(axis=0), rtol=1e-5, atol=1e-7)
    # a text scores the same alone as beside a longer one (padding is masked out)
    with torch.no_grad():
        alone = clf.logits(clf.encode(texts[:1]))
        padded = clf.logits(batch)[:1]
    torch.testing.assert_close(alone, padded)


def test_pairs_average_each_segment_and_read_pair_features(task, bow_spec):
    pairs = [(t, u) for t, u in zip(task[0][:40], task[0][40:80])]
    clf = build_classifier(bow_spec.model_copy(update=dict(buckets=0)), LABELS, pairs, seed=0)
    model = clf.model.eval()
    assert model.config.pairs and model.classifier.in_features == 16
    assert model.mlp[1].in_features == 4 * 16
    table = model.embeddings.weight.detach().numpy()
    first, second = "good film plot", "bad movie"
    with torch.no_grad():
        bag = model.bag(**clf.encode([(first, second)]))[0].numpy()
        swapped = model.bag(**clf.encode([(second, first)]))[0].numpy()
    enc = clf.tokenizer(first, second, return_token_type_ids=True)
    ids, seg = np.array(enc["input_ids"]), np.array(enc["token_type_ids"])
    u, v = table[ids[seg == 0]].mean(axis=0), table[ids[seg == 1]].mean(axis=0)
    np.testing.assert_allclose(bag, np.concatenate([u, v, np.abs(u - v), u * v]), rtol=1e-5, atol=1e-7)
    assert not np.allclose(bag, swapped)


# ------------------------------------------------------------------------------------ training
def test_learns_a_separable_task_reproducibly(task, bow_spec):
    tr, ytr, va, yva = task
    runs = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)  # dropout draws from the private generator, not this one
        spec = bow_spec.model_copy(update=dict(dropout=0.3, buckets=0))  # 64 bigram rows memorise the filler
        clf = build_classifier(spec, LABELS, tr, seed=0)
        result = train_classifier(clf, tr, ytr, va, yva, TrainingConfig(epochs=15, batch_size=16, lr=1e-2,
                                                                       patience=None), seed=3, progress=False)
        runs.append((state(clf), result))
    assert runs[0][1].best_score == 1.0 and runs[0][1].history[-1]["val_macro_f1"] == 1.0
    assert macro_f1(yva, predict_labels(clf, va), n_labels=2) == 1.0
    assert same_state(runs[0][0], runs[1][0])
    assert [r["train_loss"] for r in runs[0][1].history] == [r["train_loss"] for r in runs[1][1].history]


# ------------------------------------------------------------------------------------- save/load
def test_save_load_round_trip(task, bow_spec, tmp_path):
    tr, ytr, va, yva = task
    clf = build_classifier(bow_spec, LABELS, tr, seed=0)
    train_classifier(clf, tr, ytr, va, yva, TrainingConfig(epochs=2, batch_size=16, lr=1e-2, patience=None),
                     progress=False)
    target = tmp_path / "teacher"
    clf.save(target)
    clf.save(target)  # overwriting works
    meta = json.loads((target / META_FILE).read_text())
    assert meta["architecture"] == "BagOfWordsClassifier" and meta["spec"]["kind"] == "bow"
    assert not (target / "config.json").exists()  # not mistaken for a Hugging Face checkpoint
    loaded = TextClassifier.load(target, device="cpu")
    assert isinstance(loaded.model, BagOfWordsClassifier) and not loaded.model.training
    assert loaded.labels == clf.labels and loaded.spec == clf.spec and loaded.max_length == clf.max_length
    assert loaded.model.config == clf.model.config
    assert same_state(state(loaded), state(clf))
    np.testing.assert_array_equal(loaded.predict_proba(va), clf.predict_proba(va))
    assert loaded.tokenizer.get_vocab() == clf.tokenizer.get_vocab()


def test_load_names_a_missing_bow_file(task, bow_spec, tmp_path):
    clf = build_classifier(bow_spec, LABELS, task[0], seed=0)
    target = tmp_path / "teacher"
    clf.save(target)
    (target / BOW_CONFIG_FILE).unlink()
    with pytest.raises(DataFileError, match=BOW_CONFIG_FILE):
        TextClassifier.load(target)


def test_config_round_trips_through_json():
    config = BowConfig(vocab_size=10, hidden=4, num_labels=3, buckets=5, pairs=True,
                       id2label={0: "a", 1: "b", 2: "c"}, label2id={"a": 0, "b": 1, "c": 2})
    assert BowConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ValueError, match="bag-of-words config"):
        BagOfWordsClassifier(BowConfig(vocab_size=10, hidden=4, num_labels=1))
