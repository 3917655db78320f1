"""Label coordinates and ground costs of the KNOT tasks (the papers' fig. 3)."""
import numpy as np
import pytest
import torch

from otfed.label_space import LabelSpace


def test_sentiment_is_the_line_one_to_five_with_taxicab_cost():
    sa = LabelSpace.for_task("SA")
    assert sa.labels[0] == "strong negative" and sa.labels[-1] == "strong positive"
    expected = np.abs(np.arange(1, 6)[:, None] - np.arange(1, 6)[None, :])
    np.testing.assert_array_equal(sa.cost_matrix().numpy(), expected)


def test_emotion_cost_is_l1_between_valence_arousal_points():
    erc = LabelSpace.for_task("erc")
    C = erc.cost_matrix()
    anger, happiness = erc.index("anger"), erc.index("happiness")
    sadness, surprise, neutral = erc.index("sadness"), erc.index("surprise"), erc.index("no emotion")
    assert float(C[anger, happiness]) == pytest.approx(1.3 + 0.6)  # (−0.4, 0.8) vs (0.9, 0.2)
    assert float(C[sadness, surprise]) == pytest.approx(1.3 + 1.3)  # (−0.9, −0.4) vs (0.4, 0.9)
    assert float(C[neutral, anger]) == pytest.approx(1.2)
    assert torch.equal(C, C.T) and torch.all(C.diagonal() == 0)


def test_nli_cost_is_euclidean():
    nli = LabelSpace.for_task("nli")
    C = nli.cost_matrix()
    e, n, c = nli.index("entailment"), nli.index("neutral"), nli.index("contradiction")
    assert float(C[e, c]) == pytest.approx(np.sqrt(2))
    assert float(C[e, n]) == pytest.approx(np.sqrt(0.25 + 1 + 0.25))
    assert float(C[n, c]) == pytest.approx(float(C[e, n]))  # neutral sits between the two


def test_one_hot_ablation_puts_every_pair_at_the_same_distance():
    sa = LabelSpace.for_task("sa")
    hot = LabelSpace.one_hot(sa)
    assert hot.labels == sa.labels and hot.task == "sa-one-hot"
    C = hot.cost_matrix()
    np.testing.assert_array_equal(C.numpy(), 2 * (1 - np.eye(5)))  # taxi-cab between one-hot vectors
    assert float(LabelSpace.one_hot(["a", "b", "c"], metric="l2").cost_matrix()[0, 1]) == pytest.approx(np.sqrt(2))


def test_cost_matrix_follows_the_requested_dtype():
    C = LabelSpace.for_task("erc").cost_matrix(dtype=torch.float32)
    assert C.dtype == torch.float32


def test_unknown_task_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="erc, nli, sa"):
        LabelSpace.for_task("ner")


def test_malformed_spaces_are_rejected():
    with pytest.raises(ValueError, match="metric"):
        LabelSpace("t", ("a", "b"), torch.zeros(2, 1), "cosine")
    with pytest.raises(ValueError, match="C×D"):
        LabelSpace("t", ("a", "b"), torch.zeros(3, 1), "l1")
    with pytest.raises(ValueError, match="unknown label"):
        LabelSpace.for_task("sa").index("great")
