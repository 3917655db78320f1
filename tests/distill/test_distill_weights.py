"""Teacher weights A/D/U/E of KNOT eq. 3 on hand-computed examples."""
import math

import pytest
import torch

from otfed.distill import teacher_weights, weights_A, weights_D, weights_E, weights_U

# 2 samples, 3 teachers, 3 labels
Q = torch.tensor(
    [
        [[1.0, 0.0, 0.0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]],
        [[0.2, 0.3, 0.5], [0.0, 0.0, 1.0], [0.6, 0.2, 0.2]],
    ],
    dtype=torch.float64,
)
BIAS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.6, 0.2, 0.2]], dtype=torch.float64)


def test_A_is_all_ones():
    assert torch.equal(weights_A(Q), torch.ones(2, 3, dtype=torch.float64))


def test_D_is_the_share_of_local_data():
    assert torch.allclose(weights_D([100, 300, 600]), torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64))
    per_sample = weights_D([100, 300, 600], Q)
    assert per_sample.shape == (2, 3)
    assert torch.allclose(per_sample[1], torch.tensor([0.1, 0.3, 0.6], dtype=torch.float64))
    with pytest.raises(ValueError, match="positive"):
        weights_D([10, 0, 5])
    with pytest.raises(ValueError, match="2 dataset sizes for 3 teachers"):
        weights_D([1, 2], Q)


def test_U_is_the_distance_from_uniform():
    expected = torch.tensor(
        [
            [math.sqrt((2 / 3) ** 2 + 2 * (1 / 3) ** 2), 0.0, math.sqrt(2 * (1 / 6) ** 2 + (1 / 3) ** 2)],
            [
                math.sqrt((2 / 15) ** 2 + (1 / 30) ** 2 + (1 / 6) ** 2),
                math.sqrt(2 / 3),
                math.sqrt((4 / 15) ** 2 + 2 * (2 / 15) ** 2),
            ],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(weights_U(Q), expected)


def test_E_is_the_l2_distance_from_each_teachers_own_bias():
    expected = torch.tensor(
        [
            [0.0, math.sqrt(1 / 9 + 4 / 9 + 1 / 9), math.sqrt(0.01 + 0.09 + 0.04)],
            [math.sqrt(0.64 + 0.09 + 0.25), math.sqrt(0 + 1 + 1), 0.0],
        ],
        dtype=torch.float64,
    )
    assert torch.allclose(weights_E(Q, BIAS), expected)
    with pytest.raises(ValueError, match="K×C"):
        weights_E(Q, BIAS[:2])


def test_E_is_largest_at_the_vertex_the_teacher_is_least_biased_towards():
    """The papers' Proposition B.1: over the simplex, ||p − B||₂ peaks at the vertex of argmin_l b_l."""
    bias = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    vertices = torch.eye(3, dtype=torch.float64)[None]  # 1×3×3: each "teacher" predicts one vertex
    w = weights_E(vertices, bias.expand(3, 3))
    assert int(w.argmax()) == 2


def test_dispatch_by_table_name():
    assert torch.equal(teacher_weights("e", Q, bias=BIAS), weights_E(Q, BIAS))
    assert torch.equal(teacher_weights("D", Q, dataset_sizes=[1, 1, 2]), weights_D([1, 1, 2], Q))
    with pytest.raises(ValueError, match="A, D, U, E"):
        teacher_weights("X", Q)
    with pytest.raises(ValueError, match="needs bias"):
        teacher_weights("E", Q)
