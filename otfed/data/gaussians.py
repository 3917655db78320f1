"""Toy measures with a known population distance: the two Gaussians of FedWaD's toy study (§5, fig. 2–3)."""
from __future__ import annotations

import numpy as np

GAUSSIAN_MEAN_SHIFT = 4.0  # ||m||: the population W2 between N(0, I_d) and N(m, I_d)


def gaussian_pair(n: int, ratio: int, dim: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """μ: n samples of N(0, I_d); ν: n // ratio samples of N(m, I_d) with ||m|| = 4 (m = 4/√d · 1).

    Same covariance, different means: the population W2 is exactly ||m|| = 4 (W2² = ||m_μ − m_ν||² +
    Bures²; compare FedWaD to the *empirical* exact W, which is larger for small n in high dimension).
    """
    if n < 1 or ratio < 1 or n // ratio < 1:
        raise ValueError(f"need n ≥ ratio ≥ 1 (got n={n}, ratio={ratio})")
    x_mu = rng.standard_normal((n, dim))
    x_nu = rng.standard_normal((n // ratio, dim)) + GAUSSIAN_MEAN_SHIFT / np.sqrt(dim)
    return x_mu, x_nu
