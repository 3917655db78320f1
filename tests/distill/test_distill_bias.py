"""Random texts and the probability bias (KNOT §5.2, appendix D.1), and the soft bias of the ablation."""
import numpy as np
import pytest
import torch

from otfed.distill import probability_bias, random_texts
from otfed.distill.bias import probability_biases

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


# ---------------------------------------------------------------- the soft bias (ablation: mean probability row)
def _lookup_predictor(texts, probabilities):
    lookup = {t: i for i, t in enumerate(texts)}
    return lambda batch: probabilities[[lookup[t] for t in batch]]


def test_soft_bias_is_the_mean_probability_row_and_hard_the_argmax_frequency():
    """One pass gives both: the soft bias equals numpy's mean of the rows, the hard one np.bincount of the
    argmaxes (and probability_bias's values), whether the predictions come as arrays or tensors."""
    texts = [f"text {i}" for i in range(53)]
    probabilities = np.random.default_rng(5).dirichlet(np.full(4, 0.7), size=53)
    predict = _lookup_predictor(texts, probabilities)
    expected_soft = probabilities.mean(axis=0)
    expected_hard = np.bincount(probabilities.argmax(1), minlength=4) / 53
    for fn in (predict, lambda b: torch.as_tensor(predict(b))):
        hard, soft = probability_biases(fn, texts, batch_size=8, progress=False)
        assert hard.dtype == soft.dtype == torch.float64 and hard.device.type == soft.device.type == "cpu"
        assert hard.tolist() == expected_hard.tolist()
        np.testing.assert_allclose(soft.numpy(), expected_soft, rtol=0, atol=1e-15)
        assert float(soft.sum()) == pytest.approx(1.0, abs=1e-15)
        assert probability_bias(fn, texts, batch_size=8, progress=False).tolist() == hard.tolist()
        np.testing.assert_allclose(probability_biases(fn, texts, batch_size=8, progress=False)[1].numpy(),
                                   expected_soft, rtol=0, atol=1e-15)


def test_a_uniform_teacher_has_a_uniform_soft_bias_but_a_one_hot_hard_one():
    """The case behind the ablation: a teacher that knows nothing (uniform output) ties on every text; the
    argmax takes the first label each time, so B = one-hot(0) — the farthest a bias can be from uniform —
    while its mean output is uniform."""
    texts = random_texts(VOCAB, 40, 5, rng=1)
    hard, soft = probability_biases(lambda b: np.full((len(b), 4), 0.25), texts, batch_size=16, progress=False)
    assert hard.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert soft.tolist() == [0.25] * 4
    float32 = probability_biases(lambda b: torch.full((len(b), 3), 1 / 3, dtype=torch.float32), texts,
                                 progress=False)
    assert float32[0].tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_allclose(float32[1].numpy(), np.full(3, 1 / 3), atol=1e-7)


@pytest.mark.parametrize("scores, what", [
    (np.array([[2.0, -1.0, 0.5]] * 3), "logits"),
    (np.array([[0.5, 0.5, 0.1]] * 3), "rows summing to 1.1"),
    (np.array([[1.2, -0.2, 0.0]] * 3), "a negative entry"),
    (np.array([[np.nan, 0.5, 0.5]] * 3), "NaN"),
])
def test_soft_bias_rejects_rows_that_are_not_probabilities(scores, what):
    texts = ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"3 of 3 rows that are not probabilities.*sum(ming)? to 1 within 0.0001"):
        probability_biases(lambda b: scores[:len(b)], texts, progress=False)
    # the hard bias alone still takes scores of any kind (only the argmax counts)
    if what == "logits":
        assert probability_bias(lambda b: scores[:len(b)], texts, progress=False).tolist() == [1.0, 0.0, 0.0]


def test_soft_bias_accepts_rows_within_the_tolerance_and_checks_the_width():
    texts = ["a", "b"]
    rows = np.array([[0.5, 0.5 + 5e-5], [0.3, 0.7 - 5e-5]])
    _, soft = probability_biases(lambda b: rows[:len(b)], texts, progress=False)
    assert float(soft.sum()) == pytest.approx(1.0, abs=1e-15)
    with pytest.raises(ValueError, match="expected 3"):
        probability_biases(lambda b: rows[:len(b)], texts, n_labels=3, progress=False)
    with pytest.raises(ValueError, match="no texts"):
        probability_biases(lambda b: rows[:len(b)], [], progress=False)
