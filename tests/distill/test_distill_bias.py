"""Random texts and the probability bias (KNOT §5.2, appendix D.1)."""
import numpy as np
import pytest
import torch

from otfed.distill import probability_bias, random_texts

VOCAB = ["good", "bad", "[CLS]", "##ing", "meh"]


def test_random_texts_are_uniform_tokens_joined_by_spaces_and_seeded():
    texts = random_texts(VOCAB, 2000, 7, rng=0)
    assert len(texts) == 2000 and all(len(t.split(" ")) == 7 for t in texts)
    assert texts == random_texts(VOCAB, 2000, 7, rng=np.random.default_rng(0))
    assert texts != random_texts(VOCAB, 2000, 7, rng=1)
    tokens = [tok for t in texts for tok in t.split(" ")]
    freq = np.array([tokens.count(v) for v in VOCAB]) / len(tokens)
    # 14,000 draws: each frequency within 5 standard errors of 1/5
    assert np.all(np.abs(freq - 0.2) < 5 * np.sqrt(0.2 * 0.8 / len(tokens)))


def test_constant_classifier_has_a_one_hot_bias():
    texts = random_texts(VOCAB, 50, 4, rng=0)
    calls = []

    def predict(batch):
        calls.append(len(batch))
        return np.tile([0.1, 0.2, 0.6, 0.1], (len(batch), 1))

    bias = probability_bias(predict, texts, batch_size=16, progress=False)
    assert torch.equal(bias, torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64))
    assert calls == [16, 16, 16, 2]


def test_bias_is_the_frequency_of_the_argmax_label():
    """A classifier that says "positive" iff the token "good" occurs: b_1 = P(good ∈ text)."""
    length, n = 3, 20_000
    texts = random_texts(VOCAB, n, length, rng=3)

    def predict(batch):
        has_good = torch.tensor([float("good" in t.split(" ")) for t in batch])
        return torch.stack([1 - has_good, has_good], dim=1)  # torch output is accepted too

    bias = probability_bias(predict, texts, batch_size=1000, progress=False)
    counted = np.mean(["good" in t.split(" ") for t in texts])
    assert float(bias[1]) == pytest.approx(counted, abs=1e-12)  # exact frequency, no smoothing
    assert float(bias.sum()) == pytest.approx(1.0, abs=1e-12)
    expected = 1 - (4 / 5) ** length
    assert abs(float(bias[1]) - expected) < 5 * np.sqrt(expected * (1 - expected) / n)


def test_bias_rejects_inconsistent_classifiers():
    texts = ["a b", "c d", "e f"]
    with pytest.raises(ValueError, match="2 predictions for 3 texts"):
        probability_bias(lambda b: np.zeros((2, 3)), texts, progress=False)
    with pytest.raises(ValueError, match="no texts"):
        probability_bias(lambda b: np.zeros((len(b), 3)), [], progress=False)


def test_tensor_and_array_predictions_count_alike():
    """Counts kept next to tensor predictions (no read-back per batch) equal np.bincount of the argmaxes."""
    texts = [f"text {i}" for i in range(37)]
    scores = np.random.default_rng(2).random((37, 4))
    lookup = {t: i for i, t in enumerate(texts)}

    def as_array(batch):
        return scores[[lookup[t] for t in batch]]

    expected = np.bincount(scores.argmax(1), minlength=4) / 37
    from_array = probability_bias(as_array, texts, batch_size=5, progress=False)
    from_tensor = probability_bias(lambda b: torch.as_tensor(as_array(b)), texts, batch_size=5, progress=False)
    assert from_array.dtype == from_tensor.dtype == torch.float64
    assert from_array.tolist() == from_tensor.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="expected 5"):
        probability_bias(lambda b: torch.as_tensor(as_array(b)), texts, n_labels=5, progress=False)
