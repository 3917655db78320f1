"""FedBary's contributions over seeds (issue #23): one run on identical clients reads e.g. 28 / 38 / 34 %; the
spread over reruns says how far that can be read. Checked against the runs themselves, redone here one by one,
and against the Student-t interval computed here from scipy."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from otfed.federation import LabelledData
from otfed.federation.fedbary import FedBaryConfig, federated_valuation, valuation_spread

CONFIG = FedBaryConfig(support_size=10, iterations=5)
SEEDS = (0, 1, 2, 3, 4)


def identical_clients(k: int = 3) -> list[LabelledData]:
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    x = rng.standard_normal((40, 2)) + 3.0 * y[:, None]
    return [LabelledData(f"c{i}", x, y) for i in range(k)]


def test_identical_clients_share_equally_within_the_reported_interval() -> None:
    result = valuation_spread(identical_clients(), CONFIG, seeds=SEEDS)
    spread = result.spread
    assert spread is not None and spread.names == ["c0", "c1", "c2"] and spread.seeds == list(SEEDS)
    assert spread.contributions.shape == (5, 3)
    np.testing.assert_allclose(spread.contributions.sum(axis=1), 100.0, rtol=1e-12)
    # one run is not equal shares (the 28 / 38 / 34 %), the mean over seeds is, within its 95% CI
    assert np.ptp(result.contributions) > 5.0
    assert np.all(spread.std > 0.5) and np.all(spread.half_width > 0.5)
    assert np.all(np.abs(spread.mean - 100.0 / 3) <= spread.half_width)


def test_spread_is_the_reruns_statistics() -> None:
    datasets = identical_clients()
    result = valuation_spread(datasets, CONFIG, seeds=SEEDS)
    runs = np.array([federated_valuation(datasets, CONFIG, seed=s).contributions for s in SEEDS])
    np.testing.assert_array_equal(result.spread.contributions, runs)
    np.testing.assert_allclose(result.spread.mean, runs.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(result.spread.std, runs.std(axis=0, ddof=1), rtol=1e-12)
    lo, hi = stats.t.interval(0.95, len(SEEDS) - 1, loc=runs.mean(axis=0), scale=stats.sem(runs, axis=0))
    np.testing.assert_allclose(result.spread.half_width, (hi - lo) / 2, rtol=1e-10)
    assert result.spread.level == 0.95


def test_the_result_is_the_first_seeds_run_and_federated_valuation_is_unchanged() -> None:
    datasets = identical_clients()
    plain = federated_valuation(datasets, CONFIG, seed=2)
    assert plain.spread is None
    again = federated_valuation(datasets, CONFIG, seed=2)
    np.testing.assert_array_equal(plain.distances, again.distances)  # same seed → same numbers
    result = valuation_spread(datasets, CONFIG, seeds=(2, 7))
    np.testing.assert_array_equal(result.distances, plain.distances)
    np.testing.assert_array_equal(result.contributions, plain.contributions)


def test_with_a_validation_set_and_a_mapping_config() -> None:
    datasets = identical_clients()
    result = valuation_spread(datasets, {"support_size": 10, "iterations": 5}, validation=datasets[0],
                              seeds=range(4))
    expected = federated_valuation(datasets, CONFIG, validation=datasets[0], seed=3).contributions
    np.testing.assert_array_equal(result.spread.contributions[3], expected)


@pytest.mark.parametrize("seeds", [(0,), (), (1, 1)])
def test_a_spread_needs_two_distinct_seeds(seeds) -> None:
    with pytest.raises(ValueError, match="seeds: need at least two distinct seeds"):
        valuation_spread(identical_clients(), CONFIG, seeds=seeds)
