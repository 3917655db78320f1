"""Semantic Distance (KNOT §1), macro-F1 and accuracy."""
import numpy as np
import pytest
import torch

from otfed.label_space import LabelSpace
from otfed.metrics import (accuracy, expected_label_coordinates, macro_f1, score_name, semantic_distance,
                           semantic_errors, task_score)

SA = LabelSpace.for_task("sa")
ERC = LabelSpace.for_task("erc")


def test_papers_worked_example_sentiment():
    """Truth "strong negative" (1). The papers print e = 1.97 for m1, but their own footnote formula
    1·0.2 + 2·0.7 + 3·0.033 + 4·0.033 + 5·0.033 gives 1.996; m2 gives 2.80. m1 (argmax wrong) is
    semantically closer than m2 (argmax right)."""
    probs = np.array([[0.2, 0.7, 0.033, 0.033, 0.033], [0.4, 0.1, 0.1, 0.1, 0.3]])
    e = expected_label_coordinates(probs, SA)[:, 0]
    assert e == pytest.approx([1.996, 2.80], abs=1e-12)
    errors = semantic_errors(probs, [0, 0], SA)
    assert errors == pytest.approx([0.996, 1.80], abs=1e-12)
    assert semantic_distance(probs[:1], [0], SA) < semantic_distance(probs[1:], [0], SA)
    assert accuracy([0, 0], probs) == 0.5  # only m2's argmax is right


def test_reference_notes_examples():
    # SA: a label-1 sample predicted [.5, .5, 0, 0, 0] (error .5) and a label-5 one-hot (error 0) → .25
    probs = np.array([[0.5, 0.5, 0, 0, 0], [0, 0, 0, 0, 1.0]])
    assert semantic_distance(probs, [0, 4], SA) == pytest.approx(0.25)
    # ERC: a uniform prediction for an anger sample → e = (0, 0.3), error √(0.16 + 0.25)
    uniform = torch.full((1, 5), 0.2, dtype=torch.float64)
    assert semantic_distance(uniform, [ERC.index("anger")], ERC) == pytest.approx(np.sqrt(0.41))


def test_label_wise_mean_differs_from_the_plain_mean_on_imbalanced_labels():
    # nine easy samples of label 3 (error 0) and one hard sample of label 1 (error 2)
    probs = np.zeros((10, 5))
    probs[:, 2] = 1.0  # every prediction: all mass on label 3
    labels = np.array([2] * 9 + [0])
    errors = semantic_errors(probs, labels, SA)
    assert errors.mean() == pytest.approx(0.2)  # plain mean over samples
    assert semantic_distance(probs, labels, SA) == pytest.approx(1.0)  # (0 + 2) / 2 labels present


def test_macro_f1_by_hand():
    labels = [0, 0, 1, 1, 2]
    preds = [0, 1, 1, 1, 0]
    # label 0: P 1/2 R 1/2 F 1/2; label 1: P 2/3 R 1 F 4/5; label 2: F 0
    assert macro_f1(labels, preds) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert macro_f1(labels, np.eye(3)[preds]) == pytest.approx((0.5 + 0.8) / 3)  # scores: argmax taken
    assert macro_f1([0, 0], [0, 0], n_labels=2) == pytest.approx(0.5)  # absent label 1 scores 0
    assert accuracy(labels, preds) == pytest.approx(0.6)


def test_semantic_distance_input_checks():
    with pytest.raises(ValueError, match="one label per sample"):
        semantic_distance(np.full((2, 5), 0.2), [0], SA)
    with pytest.raises(ValueError, match="0..4"):
        semantic_distance(np.full((1, 5), 0.2), [5], SA)
    with pytest.raises(ValueError, match="do not match"):
        semantic_distance(np.full((1, 3), 1 / 3), [0], SA)


def test_task_score_is_accuracy_for_nli_and_macro_f1_otherwise():
    labels = [0, 0, 1, 1, 2]
    probs = np.eye(3)[[0, 1, 1, 1, 0]]  # the macro-F1 example above, as one-hot scores
    assert score_name("nli") == "accuracy" and task_score("nli", labels, probs, 3) == pytest.approx(0.6)
    for task in ("sa", "erc"):
        assert score_name(task) == "macro_f1"
        assert task_score(task, labels, probs, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    # a label absent from the gold labels is not averaged, even when predicted: gold [0,0,1,1], predicted
    # [0,1,1,2] → label 0: P 1 R 1/2 F 2/3; label 1: P 1/2 R 1/2 F 1/2; label 2 (absent) left out
    gold, predicted = [0, 0, 1, 1], np.eye(3)[[0, 1, 1, 2]]
    assert task_score("erc", gold, predicted, 3) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert macro_f1(gold, predicted, n_labels=3) == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)  # all labels
    with pytest.raises(ValueError, match="3 columns for 4 labels"):
        task_score("sa", labels, probs, 4)
