"""The persisted accountant (otfed.privacy.accountant): a client's budget holds across sessions and processes —
against dp-accounting called directly, the exact privacy curve of composed Gaussian mechanisms (μ-GDP with
μ = √(Σ_k r_k / z_k²), Dong, Roth & Su 2022), and the messages the server received in a refused session."""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from scipy.optimize import brentq
from scipy.stats import norm

from otfed.errors import ConfigError
from otfed.federation import Channel, FedWaDConfig
from otfed.federation.fedbary import FedBaryConfig
from otfed.federation.messages import SERVER
from otfed.federation.otdd import LabelledData
from otfed.privacy.accountant import BudgetLedger, Reservation, composed_epsilon
from otfed.privacy.dp import DPConfig, PrivacyBudgetError, dp_federated_wasserstein, gaussian_noise_multiplier
from otfed.privacy.dp_fedbary import dp_federated_valuation


def _exact_epsilon(mu: float, delta: float) -> float:
    """ε of a μ-GDP mechanism at δ (Balle & Wang 2018: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2))."""
    return brentq(lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta, 0, 500)


def test_composed_epsilon_is_dp_accounting_and_bounds_the_exact_curve() -> None:
    parts = [Reservation("s1", 2.0, 11), Reservation("s2", 5.0, 21), Reservation("s3", 0.8, 3)]
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(r.noise_multiplier), r.releases)
              for r in parts]
    direct = RdpAccountant().compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(1e-5)
    assert composed_epsilon(parts, 1e-5) == pytest.approx(direct, rel=1e-12)
    exact = _exact_epsilon(math.sqrt(sum(r.releases / r.noise_multiplier ** 2 for r in parts)), 1e-5)
    assert exact <= composed_epsilon(parts, 1e-5) <= 1.15 * exact  # an upper bound, and not a loose one
    assert exact <= composed_epsilon(parts, 1e-5, "pld") <= composed_epsilon(parts, 1e-5)
    assert composed_epsilon([], 1e-5) == 0.0 and composed_epsilon([Reservation("x", 0.0, 1)], 1e-5) == math.inf


def _run(x, y, dp: DPConfig, channel: Channel | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return dp_federated_wasserstein(x, y, FedWaDConfig(support_size=5, iterations=3, lower_bound=False), dp,
                                        seed=0, names=("alice", "bob"), channel=channel)


def test_sessions_beyond_the_budget_are_refused_across_client_objects(tmp_path: Path) -> None:
    """sessions = 3: three FedWaD sessions (fresh clients each, as in pairwise distances) pass and the fourth is
    refused before it releases anything; the ledger's ε is dp-accounting's for 3 × (K + 1) releases, ≤ ε."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(20, 2)), rng.normal(size=(20, 2)) + 1.0
    dp = DPConfig(epsilon=2.0, clip_radius=4.0, sessions=3, ledger_dir=str(tmp_path))
    for _ in range(3):
        _run(x, y, dp)
    z = gaussian_noise_multiplier(2.0, 1e-5, 12)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), 12)
    spent = BudgetLedger(tmp_path / "alice.json", "alice", 2.0, 1e-5).spent()
    assert spent == pytest.approx(RdpAccountant().compose(event).get_epsilon(1e-5), rel=1e-12) and spent <= 2.0
    channel = Channel(keep_inbox=True)
    with pytest.raises(PrivacyBudgetError, match=r"client 'alice'.*alice\.json"):
        _run(x, y, dp, channel)
    assert not [m for m in channel.received_by(SERVER) if m.sender == "alice"]  # refused before any release
    assert len(json.loads((tmp_path / "alice.json").read_text())["reservations"]) == 3  # nothing written


def test_a_session_calibrated_for_one_is_refused_the_second_time(tmp_path: Path) -> None:
    """Without a ledger two sessions of the same records each spend the whole ε (the old behaviour: the count
    restarts); with one the second is refused."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(20, 2)), rng.normal(size=(20, 2))
    assert _run(x, y, DPConfig(epsilon=1.0, clip_radius=4.0)).epsilon == _run(x, y, DPConfig(epsilon=1.0,
                                                                                            clip_radius=4.0)).epsilon
    dp = DPConfig(epsilon=1.0, clip_radius=4.0, ledger_dir=str(tmp_path))
    _run(x, y, dp)
    with pytest.raises(PrivacyBudgetError, match="over the budget"):
        _run(x, y, dp)


def test_dp_fedbary_clients_reserve_their_sessions(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    data = [LabelledData(f"c{i}", rng.normal(size=(12, 2)), np.arange(12) % 2) for i in range(2)]
    config = FedBaryConfig(support_size=4, iterations=2)
    dp = DPConfig(epsilon=3.0, clip_radius=4.0, sessions=2, ledger_dir=str(tmp_path))
    for _ in range(2):
        dp_federated_valuation(data, config, dp, seed=0)
    ledger = json.loads((tmp_path / "c0.json").read_text())
    assert [r["releases"] for r in ledger["reservations"]] == [5, 5]  # 2K + 1 per session
    with pytest.raises(PrivacyBudgetError, match="'c0'"):
        dp_federated_valuation(data, config, dp, seed=0)


def test_a_ledger_keeps_its_client_and_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    BudgetLedger(path, "a", 1.0, 1e-5).reserve("s", 10.0, 2)
    for client, eps, delta in (("b", 1.0, 1e-5), ("a", 2.0, 1e-5), ("a", 1.0, 1e-6)):
        with pytest.raises(ConfigError, match="a ledger keeps its client and its budget"):
            BudgetLedger(path, client, eps, delta)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not a readable ledger"):
        BudgetLedger(path, "a", 1.0, 1e-5)
