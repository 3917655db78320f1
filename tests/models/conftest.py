"""Shared fixtures for the text-classifier tests: a tiny separable sentiment task and a tiny model spec
(one torch thread per test comes from tests/conftest.py)."""
from __future__ import annotations

import random

import pytest

from otfed.models import ModelSpec

FILLER = "the a movie film plot actor scene story was is it this very quite and of".split()


def separable_task(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Texts of filler words with exactly one of "bad" (label 0) or "good" (label 1) inserted."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        y = rng.randrange(2)
        words = [rng.choice(FILLER) for _ in range(rng.randrange(4, 12))]
        words.insert(rng.randrange(len(words) + 1), "good" if y else "bad")
        texts.append(" ".join(words))
        labels.append(y)
    return texts, labels


@pytest.fixture(scope="session")
def task():
    """(train texts, train labels, val texts, val labels) of the separable good/bad task."""
    return (*separable_task(160, 0), *separable_task(48, 1))


@pytest.fixture(scope="session")
def tiny_spec() -> ModelSpec:
    return ModelSpec(kind="bert", layers=1, hidden=32, heads=2, intermediate=64, dropout=0.1, max_length=24,
                     vocab_size=300)
