"""The scale of FedWaD's bracket tolerance, :meth:`WassersteinServer.spread`, against exact OT: the root-mean-square
of the two clouds' radii, where a cloud's radius is W₂ between it and the Dirac at its mean (POT's network
simplex here, the clients' weights as given). The server computes it from the clients' moment messages only."""
from __future__ import annotations

import numpy as np
import ot
import pytest

from otfed.federation import FedWaDConfig
from otfed.federation.fedwad import WassersteinClient, WassersteinServer
from otfed.ot import Measure


def radius(x: np.ndarray, w: np.ndarray) -> float:
    """W₂(Σ_i w_i δ_{x_i}, δ_m) with m the weighted mean, by POT's exact solver."""
    mean = (w @ x)[None, :]
    return float(np.sqrt(ot.emd2(w, np.ones(1), ot.dist(x, mean))))


def test_spread_is_the_root_mean_square_radius_of_the_two_clouds() -> None:
    rng = np.random.default_rng(3)
    x_mu = rng.normal(size=(40, 3)) * [1.0, 2.0, 0.5] + 4.0  # anisotropic and far from the origin
    x_nu = 0.3 * rng.normal(size=(25, 3)) @ rng.normal(size=(3, 3))  # a tighter cloud
    w_mu = rng.dirichlet(np.ones(40))  # weights as given, not uniform
    w_nu = np.full(25, 1 / 25)
    config = FedWaDConfig(support_size=4, iterations=1)
    mu = WassersteinClient("alice", Measure(x_mu, w_mu), config, np.random.default_rng(0))
    nu = WassersteinClient("bob", Measure(x_nu, w_nu), config, np.random.default_rng(1))
    r_mu, r_nu = radius(x_mu, w_mu), radius(x_nu, w_nu)
    assert r_mu > 1.5 * r_nu or r_nu > 1.5 * r_mu  # the two radii differ: each one counts
    spread = WassersteinServer.spread(mu.moments(), nu.moments())
    assert spread == pytest.approx(np.sqrt((r_mu ** 2 + r_nu ** 2) / 2), rel=1e-12)
    assert WassersteinServer.spread(mu.moments(), mu.moments()) == pytest.approx(r_mu, rel=1e-12)
