"""Label flips, feature noise and the FedBary client cases (FedBary app. 10.1): the recorded ground truth must be
exactly the set of samples that changed, and the rates and sizes must be the paper's."""

from pathlib import Path

import numpy as np
import pytest

from otfed.data import add_feature_noise, fedbary_case, flip_labels, load_images, pixel_features

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"


@pytest.fixture(scope="module")
def pool():
    s = load_images("mnist", "train", RAW)
    return pixel_features(s.images), s.labels


def test_flip_labels_changes_exactly_idx_to_other_classes():
    rng = np.random.default_rng(0)
    labels = np.zeros(20000, dtype=np.int64)
    idx = np.arange(0, 20000, 2)
    out = flip_labels(labels, idx, 10, rng)
    assert labels.max() == 0  # input untouched
    np.testing.assert_array_equal(np.flatnonzero(out != labels), idx)
    counts = np.bincount(out[idx], minlength=10)
    assert counts[0] == 0
    # Uniform over the 9 other classes: each ~1111, binomial sd ~31.
    assert np.abs(counts[1:] - 10000 / 9).max() < 5 * np.sqrt(10000 * (1 / 9) * (8 / 9))
    with pytest.raises(ValueError, match="unique"):
        flip_labels(labels, [1, 1], 10, rng)


def test_feature_noise_is_per_sample_and_has_the_right_scale():
    rng = np.random.default_rng(1)
    x = np.full((400, 50), 0.5)
    idx = np.arange(100, 300)
    out = add_feature_noise(x, idx, 2.0, rng)
    assert (x == 0.5).all()
    np.testing.assert_array_equal(np.flatnonzero((out != x).any(axis=1)), idx)
    assert ((out != x).all(axis=1) == np.isin(np.arange(400), idx)).all()
    noise = out[idx] - 0.5
    assert abs(noise.std() - 2.0) < 0.05 and abs(noise.mean()) < 0.05
    # Independent per sample: no two rows share a noise pattern (the authors' batch-shared bug).
    corr = np.corrcoef(noise)
    assert np.abs(corr[np.triu_indices(200, 1)]).max() < 0.8


def _changed(part, features, labels):
    if part.noise_kind == "label":
        return np.flatnonzero(part.labels != labels)
    if part.noise_kind == "feature":
        return np.flatnonzero((part.features != features).any(axis=1))
    return np.empty(0, np.int64)


@pytest.mark.parametrize("case", [1, 2, 3, 4, 5])
def test_case_clients_are_disjoint_and_ground_truth_is_exact(pool, case):
    features, labels = pool
    part = fedbary_case(case, features, labels, np.random.default_rng(case))
    assert len(part.client_indices) == 5 == len(part.corrupted)
    joined = np.concatenate(part.client_indices)
    assert np.unique(joined).size == joined.size
    corrupted = np.concatenate(part.corrupted)
    np.testing.assert_array_equal(np.sort(corrupted), _changed(part, features, labels))
    for idx, bad in zip(part.client_indices, part.corrupted):
        assert np.isin(bad, idx).all()
    assert part.noise_kind == {4: "label", 5: "feature"}.get(case, "none")
    again = fedbary_case(case, features, labels, np.random.default_rng(case))
    assert all(np.array_equal(a, b) for a, b in zip(part.client_indices, again.client_indices))
    np.testing.assert_array_equal(again.labels, part.labels)


@pytest.mark.parametrize("case", [4, 5])
def test_noise_rates_are_0_5_10_15_20_percent(pool, case):
    features, labels = pool
    part = fedbary_case(case, features, labels, np.random.default_rng(0))
    assert [idx.size for idx in part.client_indices] == [1000] * 5
    assert [bad.size for bad in part.corrupted] == [0, 50, 100, 150, 200]
    if case == 4:
        assert (part.labels[np.concatenate(part.corrupted)] != labels[np.concatenate(part.corrupted)]).all()


def test_noise_rates_scale_linearly_with_more_clients(pool):
    features, labels = pool
    part = fedbary_case(4, features, labels, np.random.default_rng(0), n_clients=9, samples_per_client=400)
    # rates 0, 2.5, 5, ..., 20% of 400, halves rounded up
    assert [bad.size for bad in part.corrupted] == [0, 10, 20, 30, 40, 50, 60, 70, 80]


def test_case1_clients_share_the_pool_distribution(pool):
    _, labels = pool
    part = fedbary_case(1, *pool, rng=np.random.default_rng(0))
    expected = np.bincount(labels, minlength=10) / 5
    for idx in part.client_indices:
        assert idx.size == 1000
        assert np.abs(np.bincount(labels[idx], minlength=10) - expected).max() <= 2


def test_case2_top_two_classes_hold_80_percent(pool):
    _, labels = pool
    part = fedbary_case(2, *pool, rng=np.random.default_rng(0))
    sizes = {idx.size for idx in part.client_indices}
    assert len(sizes) == 1
    for i, idx in enumerate(part.client_indices):
        counts = np.bincount(labels[idx], minlength=10)
        top2 = set(np.argsort(counts)[-2:])
        assert top2 == {2 * i, 2 * i + 1}
        assert counts[2 * i] + counts[2 * i + 1] == pytest.approx(0.8 * idx.size, abs=1)
        assert (counts > 0).all()


def test_case3_sizes_are_10_to_30_percent(pool):
    _, labels = pool
    part = fedbary_case(3, *pool, rng=np.random.default_rng(0))
    assert [idx.size for idx in part.client_indices] == [500, 750, 1000, 1250, 1500]
    np.testing.assert_array_equal(np.sort(np.concatenate(part.client_indices)), np.arange(5000))
    pool_share = np.bincount(labels, minlength=10) / 5000
    for idx in part.client_indices:  # same distribution: class shares follow the pool
        assert np.abs(np.bincount(labels[idx], minlength=10) - pool_share * idx.size).max() <= 2
    ten = fedbary_case(3, *pool, rng=np.random.default_rng(0), n_clients=10, samples_per_client=200)
    sizes = np.array([idx.size for idx in ten.client_indices])
    assert sizes.sum() == 2000 and sizes[-1] == 3 * sizes[0] and (np.diff(sizes) > 0).all()


def test_case_argument_errors(pool):
    with pytest.raises(ValueError, match="1, 2, 3, 4, 5"):
        fedbary_case(6, *pool, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="does not fit"):
        fedbary_case(1, *pool, rng=np.random.default_rng(0), samples_per_client=1001)
    with pytest.raises(ValueError, match="class 0 has 485 samples but 5 clients of 1000 need 500"):
        fedbary_case(2, *pool, rng=np.random.default_rng(0), samples_per_client=1000)
