"""Seeded train / val / test splits of a party and the caps on their sizes: stratified by label
(SA, NLI), by whole dialogue (DailyDialog chunks) or the file's own split (MELD). Every party draws from
its own generator seeded by ``(seed, task, party name)``.
"""
from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from otfed.data.apportionment import largest_remainder, stratified_parts
from otfed.data.text.spec import SPLITS, TextTaskSpec
from otfed.errors import DegenerateClientError


def contiguous_bins(sizes: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Bin index (0..B−1, non-decreasing) of each of n ordered items so that bin b's total size is as close
    to ``shares[b]``·Σsizes as whole items allow: each boundary sits at the item boundary nearest its
    cumulative target, and every bin gets at least one item."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n, n_bins = sizes.size, len(shares)
    if n < n_bins:
        raise ValueError(f"{n} items cannot fill {n_bins} non-empty bins")
    edges = np.concatenate([[0], np.cumsum(sizes)])  # edges[j] = size of the first j items
    targets = edges[-1] * np.cumsum(shares)[:-1] / np.sum(shares)
    cuts = [0]
    for b, target in enumerate(targets, start=1):
        lo, hi = cuts[-1] + 1, n - (n_bins - b)
        cuts.append(lo + int(np.argmin(np.abs(edges[lo:hi + 1] - target))))
    cuts.append(n)
    return np.repeat(np.arange(n_bins), np.diff(cuts))


def party_rng(seed: int, task: str, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(f"{task}/{name}".encode())])


def split_positions(labels: np.ndarray, groups: np.ndarray | None, fixed: np.ndarray | None,
                     spec: TextTaskSpec, rng: np.random.Generator, party: str) -> list[np.ndarray]:
    """Train/val/test row positions: the file's own split (MELD), whole dialogues (DailyDialog chunks),
    or stratified by label (SA, NLI)."""
    n = labels.size
    shares = np.array([1.0 - spec.val_fraction - spec.test_fraction, spec.val_fraction, spec.test_fraction])
    if fixed is not None:
        parts = [np.flatnonzero(fixed == s) for s in SPLITS]
    elif groups is not None:
        codes, uniques = pd.factorize(groups)
        if uniques.size < len(SPLITS):
            raise DegenerateClientError(f"party {party!r}: {uniques.size} dialogue(s) cannot fill train/val/test")
        order = rng.permutation(uniques.size)
        sizes = np.bincount(codes, minlength=uniques.size)[order]
        bin_of_group = np.empty(uniques.size, dtype=np.int64)
        bin_of_group[order] = contiguous_bins(sizes, shares)
        parts = [np.flatnonzero(bin_of_group[codes] == b) for b in range(len(SPLITS))]
    else:
        sizes = largest_remainder(n, shares)
        if (sizes == 0).any():
            raise DegenerateClientError(f"party {party!r}: {n} row(s) are too few for train/val/test splits "
                                        f"of sizes {sizes.tolist()}")
        parts = stratified_parts(labels, sizes, rng)
    for name, part in zip(SPLITS, parts):
        if part.size == 0:
            raise DegenerateClientError(f"party {party!r}: its {name} split is empty")
    return parts


def stratified_cap(labels: np.ndarray, cap: int | None, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions of a stratified subsample of ``cap`` rows (all rows when ``cap`` is None or larger)."""
    n = labels.size
    if cap is None or cap >= n:
        return np.arange(n)
    return stratified_parts(labels, [cap, n - cap], rng)[0]
