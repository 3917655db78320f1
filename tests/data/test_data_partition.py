"""Partitions: disjoint, complete, reproducible, and with the class structure each one promises
(checked by counting labels, independently of how the partition was built)."""

from pathlib import Path

import numpy as np
import pytest

from otfed.data import (
    ALL_PAIRS,
    STRONG_GROUPS,
    interleaved_assignment,
    largest_remainder,
    load_images,
    partition_class_pairs,
    partition_dirichlet,
    partition_iid,
    split_train_val,
)
from otfed.errors import DegenerateClientError

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"


@pytest.fixture(scope="module")
def labels():
    return load_images("mnist", "train", RAW).labels


def assert_disjoint(parts):
    joined = np.concatenate(parts)
    assert np.unique(joined).size == joined.size


def assert_complete(parts, n):
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def _make(kind, labels, seed):
    rng = np.random.default_rng(seed)
    if kind == "iid":
        return partition_iid(labels, 7, rng)
    if kind == "dirichlet":
        return partition_dirichlet(labels, 10, 0.5, rng)
    return partition_class_pairs(labels, 20, kind, rng)[0]


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "strong", "none"])
def test_partitions_are_disjoint_and_reproducible(labels, kind):
    a, b, c = _make(kind, labels, 3), _make(kind, labels, 3), _make(kind, labels, 4)
    assert_disjoint(a)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    assert not all(np.array_equal(p, q) for p, q in zip(a, c))
    if kind != "none":  # "none" drops classes no client holds
        assert_complete(a, labels.size)


def test_iid_sizes_differ_by_at_most_one(labels):
    sizes = [p.size for p in partition_iid(labels, 7, np.random.default_rng(0))]
    assert sum(sizes) == 5000 and max(sizes) - min(sizes) <= 1


def _mean_max_class_fraction(labels, parts):
    return np.mean([np.bincount(labels[p], minlength=10).max() / p.size for p in parts])


def test_dirichlet_skew_shrinks_with_alpha(labels):
    rng = np.random.default_rng(0)
    skewed = _mean_max_class_fraction(labels, partition_dirichlet(labels, 10, 0.1, rng))
    flat = _mean_max_class_fraction(labels, partition_dirichlet(labels, 10, 1000.0, rng))
    assert skewed > 0.5  # a handful of classes dominate each client
    assert flat < 0.16  # close to the pool's own largest class share 574/5000 = 0.115
    parts = partition_dirichlet(labels, 10, 0.05, rng, min_size=20)
    assert min(p.size for p in parts) >= 20


def test_dirichlet_gives_up_with_a_named_client():
    labels = np.repeat(np.arange(10), 3)
    with pytest.raises(DegenerateClientError, match="client"):
        partition_dirichlet(labels, 14, 0.001, np.random.default_rng(0), min_size=2)
    with pytest.raises(ValueError, match="exceeds"):
        partition_dirichlet(labels, 16, 1.0, np.random.default_rng(0), min_size=2)


@pytest.mark.parametrize("n_clients", [10, 20, 37])
def test_strong_class_pairs(labels, n_clients):
    parts, groups = partition_class_pairs(labels, n_clients, "strong", np.random.default_rng(1))
    assert len(parts) == n_clients == groups.size
    np.testing.assert_array_equal(groups[:10], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    assert np.bincount(groups, minlength=5).min() >= 2
    assert_complete(parts, labels.size)
    for p, g in zip(parts, groups):
        assert set(np.unique(labels[p])) == set(STRONG_GROUPS[g])
    # Each class is split evenly among the clients of its group.
    for c in range(10):
        per_holder = [np.sum(labels[p] == c) for p, g in zip(parts, groups) if c in STRONG_GROUPS[g]]
        assert sum(per_holder) == np.sum(labels == c) and max(per_holder) - min(per_holder) <= 1


def test_no_structure_class_pairs(labels):
    parts, groups = partition_class_pairs(labels, 20, "none", np.random.default_rng(2))
    assert_disjoint(parts)
    held = set()
    for p, g in zip(parts, groups):
        assert len(np.unique(labels[p])) == 2
        assert tuple(np.unique(labels[p])) == ALL_PAIRS[g]
        held |= set(ALL_PAIRS[g])
    # Exactly the samples of the classes that some client holds are used.
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.flatnonzero(np.isin(labels, sorted(held))))
    assert len(ALL_PAIRS) == 45 and len(set(ALL_PAIRS)) == 45


def test_class_pairs_argument_errors(labels):
    with pytest.raises(ValueError, match="n_clients >= 10"):
        partition_class_pairs(labels, 9, "strong", np.random.default_rng(0))
    with pytest.raises(ValueError, match="strong, none"):
        partition_class_pairs(labels, 10, "overlap", np.random.default_rng(0))


def test_split_train_val_is_stratified_and_exact(labels):
    clients = partition_dirichlet(labels, 6, 1.0, np.random.default_rng(5))
    train, val = split_train_val(clients, labels, 0.2, np.random.default_rng(6))
    for idx, tr, va in zip(clients, train, val):
        assert np.intersect1d(tr, va).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, va])), idx)
        assert va.size == int(np.floor(0.2 * idx.size + 0.5))
        expected = 0.2 * np.bincount(labels[idx], minlength=10)
        assert np.abs(np.bincount(labels[va], minlength=10) - expected).max() <= 1.5
    again = split_train_val(clients, labels, 0.2, np.random.default_rng(6))
    assert all(np.array_equal(a, b) for a, b in zip(val, again[1]))
    with pytest.raises(DegenerateClientError, match="client 1"):
        split_train_val([np.arange(10), np.array([3])], labels, 0.6, np.random.default_rng(0))


def test_largest_remainder_hand_values():
    np.testing.assert_array_equal(largest_remainder(10, [1, 1, 1]), [4, 3, 3])
    np.testing.assert_array_equal(largest_remainder(5000, [1, 1.5, 2, 2.5, 3]), [500, 750, 1000, 1250, 1500])
    np.testing.assert_array_equal(largest_remainder(7, [0.5, 0.3, 0.2]), [4, 2, 1])  # quotas 3.5, 2.1, 1.4


def test_interleaved_assignment_counts_and_spread():
    seq = interleaved_assignment([2, 4, 0, 6])
    np.testing.assert_array_equal(np.bincount(seq, minlength=4), [2, 4, 0, 6])
    # Every prefix holds each bin in proportion to its size, within about one element.
    for t in range(1, seq.size + 1):
        counts = np.bincount(seq[:t], minlength=4)
        assert np.abs(counts - np.array([2, 4, 0, 6]) * t / 12).max() < 1.5
