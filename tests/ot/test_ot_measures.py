"""Measure: validation and the uniform constructor."""

import numpy as np
import pytest

from otfed.ot import Measure


def test_uniform_measure_has_equal_weights_summing_to_one():
    X = np.arange(12.0).reshape(4, 3)
    mu = Measure.uniform(X)
    assert mu.n == 4 and mu.dim == 3
    np.testing.assert_array_equal(mu.weights, np.full(4, 0.25))
    assert mu.nbytes() == 4 * 3 * 8 + 4 * 8


@pytest.mark.parametrize(
    ("support", "weights", "message"),
    [
        (np.zeros(3), np.full(3, 1 / 3), "2-D"),
        (np.zeros((3, 2)), np.full(2, 0.5), "3 atoms but weights has 2"),
        (np.array([[0.0], [np.nan]]), np.full(2, 0.5), "NaN"),
        (np.zeros((2, 1)), np.array([0.5, 0.6]), "sum to 1"),
        (np.zeros((2, 1)), np.array([1.5, -0.5]), ">= 0"),
    ],
)
def test_invalid_measures_raise_value_error_naming_the_problem(support, weights, message):
    with pytest.raises(ValueError, match=message):
        Measure(support, weights)
