"""Simultaneous (Bonferroni) intervals: against SciPy's Student-t interval computed from the raw samples at the
adjusted level, and the privacy audit table's family count and [0, 1] cut."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from otfed.metrics import bonferroni_interval, mean_confidence_interval


@pytest.mark.parametrize("family", [1, 3, 56])
def test_bonferroni_interval_is_scipys_interval_at_the_adjusted_level(family: int) -> None:
    rng = np.random.default_rng(family)
    samples = [rng.normal(0.5, 0.05, size=n) for n in (5, 20, 20)]
    means, halves = zip(*(mean_confidence_interval(x) for x in samples))
    means, halves = np.array(means), np.array(halves)
    dof = np.array([len(x) - 1 for x in samples], dtype=float)
    low, high = bonferroni_interval(means, means - halves, means + halves, dof, family)
    for x, lo, hi in zip(samples, low, high):
        want = stats.t.interval(1 - 0.05 / family, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
        assert (lo, hi) == pytest.approx(want, rel=1e-12)


def test_bonferroni_interval_refuses_an_empty_family_and_keeps_nan() -> None:
    with pytest.raises(ValueError, match="family"):
        bonferroni_interval(0.5, 0.4, 0.6, 10, family=0)
    low, high = bonferroni_interval([0.5, np.nan], [0.4, np.nan], [0.6, np.nan], [10, np.nan], family=2)
    assert np.isfinite(low[0]) and np.isnan(low[1]) and np.isnan(high[1])


def test_audit_table_counts_its_finite_intervals_and_cuts_to_the_unit_interval() -> None:
    from stages.fed_distance import AUDIT_SCORES, simultaneous_audit_intervals

    row = dict(splits=20, canary_sessions=5)
    for s in AUDIT_SCORES:
        row |= {f"{s}_auc": 0.5, f"{s}_auc_low": 0.45, f"{s}_auc_high": 0.55}
    off = row | {f"{s}_auc{e}": np.nan for s in ("canary",) for e in ("", "_low", "_high")} | dict(canary_sessions=0)
    wide = row | dict(canary_auc=0.9, canary_auc_low=0.6, canary_auc_high=1.2)
    table = simultaneous_audit_intervals(pd.DataFrame([row, off, wide]))
    assert (table.simultaneous_family == 4 + 3 + 4).all()
    low, high = stats.t.interval(1 - 0.05 / 11, 19, loc=0.5, scale=0.05 / stats.t.ppf(0.975, 19))
    assert table.lr_auc_low_simultaneous[0] == pytest.approx(low) and table.lr_auc_high_simultaneous[0] == pytest.approx(high)
    assert np.isnan(table.canary_auc_low_simultaneous[1])
    assert table.canary_auc_high_simultaneous[2] == 1.0 and 0.0 <= table.canary_auc_low_simultaneous[2] < 0.6
