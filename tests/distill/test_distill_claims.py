"""The papers' relative claims as paired statistics over seeds (otfed.distill.evaluation): the means and
intervals against scipy's paired t interval, computed independently; the verdict's direction per metric."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from otfed.distill.evaluation import (adjusted_verdicts, claim_pairs, holm_adjusted, paired_claims, paired_p_value,
                                     seed_summary)

NAMES = {"sinkhorn": "Sinkhorn", "kl": "Entropy"}


def rows_for(values: dict[str, list[float]], metric: str = "score", task: str = "sa") -> pd.DataFrame:
    out = []
    for variant, per_seed in values.items():
        for seed, v in enumerate(per_seed):
            other = 1.0 if metric == "score" else 0.5
            out.append(dict(task=task, test_set="ALL", variant=variant, seed=seed,
                            score=v if metric == "score" else other,
                            semantic_distance=v if metric == "semantic_distance" else other))
    return pd.DataFrame(out)


def test_the_claims_are_sinkhorn_vs_entropy_per_weighting_and_e_vs_the_others_per_loss():
    claims = claim_pairs(["sinkhorn", "kl"], ["A", "D", "U", "E"], NAMES)
    assert [c[0] for c in claims] == [
        "Sinkhorn-A vs Entropy-A", "Sinkhorn-D vs Entropy-D", "Sinkhorn-U vs Entropy-U", "Sinkhorn-E vs Entropy-E",
        "Sinkhorn-E vs Sinkhorn-A", "Sinkhorn-E vs Sinkhorn-D", "Sinkhorn-E vs Sinkhorn-U",
        "Entropy-E vs Entropy-A", "Entropy-E vs Entropy-D", "Entropy-E vs Entropy-U"]
    assert claims[0][1:] == ("Sinkhorn-A", "Entropy-A")
    assert claim_pairs(["sinkhorn"], ["A", "D"], NAMES) == []  # nothing to compare


def test_paired_difference_and_interval_match_scipys_paired_t_interval():
    better = [0.31, 0.35, 0.30, 0.36, 0.33]
    baseline = [0.30, 0.31, 0.29, 0.33, 0.30]
    rows = rows_for({"Sinkhorn-A": better, "Entropy-A": baseline})
    out = paired_claims(rows, [("S vs E", "Sinkhorn-A", "Entropy-A")])
    score = out[out.metric == "score"].iloc[0]
    d = np.array(better) - np.array(baseline)
    low, high = stats.t.interval(0.95, d.size - 1, loc=d.mean(), scale=stats.sem(d))
    assert score.mean_difference == pytest.approx(d.mean())
    assert (score.low, score.high) == (pytest.approx(low), pytest.approx(high))
    assert score.seeds == 5 and score.verdict == "replicates"  # every difference > 0: the CI excludes 0
    sd = out[out.metric == "semantic_distance"].iloc[0]
    assert sd.mean_difference == 0.0 and sd.verdict == "undecided"  # identical SDs: no evidence either way


def test_verdict_follows_each_metrics_better_side_and_pairs_by_seed():
    # Semantic Distance: lower is better, so a consistently lower SD replicates and a higher one reverses
    lower = rows_for({"Sinkhorn-E": [1.0, 1.1, 1.2], "Entropy-E": [1.1, 1.2, 1.31]}, metric="semantic_distance")
    out = paired_claims(lower, [("c", "Sinkhorn-E", "Entropy-E")])
    assert out.set_index("metric").verdict["semantic_distance"] == "replicates"
    higher = rows_for({"Sinkhorn-E": [1.2, 1.3, 1.41], "Entropy-E": [1.1, 1.2, 1.3]}, metric="semantic_distance")
    assert paired_claims(higher, [("c", "Sinkhorn-E", "Entropy-E")]).set_index("metric").verdict[
        "semantic_distance"] == "reversed"
    # paired by seed: shuffled row order gives the same result; unpaired spread would hide this effect
    shuffled = lower.sample(frac=1.0, random_state=0)
    pd.testing.assert_frame_equal(paired_claims(shuffled, [("c", "Sinkhorn-E", "Entropy-E")]), out)


def test_an_interval_across_zero_decides_nothing_on_either_metric():
    """The paired differences straddle 0 (one seed each way): undecided for the score and — lower being better —
    for Semantic Distance too (a sign slip once called every SD interval with a negative lower end "replicates")."""
    for metric in ("score", "semantic_distance"):
        rows = rows_for({"Sinkhorn-E": [1.0, 1.3, 1.1], "Entropy-E": [1.1, 1.2, 1.1]}, metric=metric)
        row = paired_claims(rows, [("c", "Sinkhorn-E", "Entropy-E")]).set_index("metric").loc[metric]
        assert row.low < 0 < row.high and row.verdict == "undecided"


def test_one_seed_has_no_interval_and_decides_nothing():
    rows = rows_for({"Sinkhorn-A": [0.9], "Entropy-A": [0.1]})
    out = paired_claims(rows, [("c", "Sinkhorn-A", "Entropy-A")])
    assert out.ci95.isna().all() and (out.verdict == "undecided").all()


def test_seed_summary_is_the_mean_and_t_interval_per_variant_and_set():
    rows = rows_for({"Sinkhorn-A": [0.2, 0.4, 0.3], "Entropy-A": [0.5, 0.5, 0.5]})
    summary = seed_summary(rows).set_index("variant")
    x = np.array([0.2, 0.4, 0.3])
    half = stats.t.ppf(0.975, 2) * x.std(ddof=1) / np.sqrt(3)
    assert summary.score["Sinkhorn-A"] == pytest.approx(0.3)
    assert summary.score_ci95["Sinkhorn-A"] == pytest.approx(half)
    assert summary.score_ci95["Entropy-A"] == 0.0 and summary.seeds["Entropy-A"] == 3


def test_p_value_is_scipys_paired_t_test_and_agrees_with_the_interval():
    better = [0.31, 0.35, 0.30, 0.36, 0.33]
    baseline = [0.30, 0.31, 0.29, 0.33, 0.30]
    out = paired_claims(rows_for({"Sinkhorn-A": better, "Entropy-A": baseline}),
                        [("S vs E", "Sinkhorn-A", "Entropy-A")]).iloc[0]
    assert out.p_value == pytest.approx(stats.ttest_rel(better, baseline).pvalue, rel=1e-12)
    assert (out.p_value < 0.05) == (out.low > 0 or out.high < 0)  # the test behind the 95% interval
    assert paired_p_value(np.array([0.2])) != paired_p_value(np.array([0.2]))  # one seed: NaN
    assert paired_p_value(np.array([0.5, 0.5, 0.5])) == 0.0 and paired_p_value(np.zeros(3)) == 1.0


def _holm_rejections(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's step-down procedure as he states it: reject H_(1), H_(2), … while p_(i) ≤ α / (m − i + 1)."""
    order = np.argsort(p, kind="stable")
    reject = np.zeros(p.size, dtype=bool)
    for i, k in enumerate(order):
        if p[k] > alpha / (p.size - i):
            break
        reject[k] = True
    return reject


@pytest.mark.parametrize("seed", range(5))
def test_holm_adjusted_rejects_exactly_what_the_step_down_procedure_rejects(seed: int):
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 0.02, 6), rng.uniform(0, 1, 14)])
    adjusted = holm_adjusted(p)
    assert np.all(adjusted >= p) and np.all(adjusted <= 1.0)
    for alpha in (0.01, 0.05, 0.1, 0.2):
        np.testing.assert_array_equal(adjusted <= alpha, _holm_rejections(p, alpha))
    with_nan = holm_adjusted(np.concatenate([p, [np.nan]]))
    np.testing.assert_array_equal(with_nan[:-1], adjusted)  # NaN does not count in m
    assert np.isnan(with_nan[-1])


def test_adjusted_verdicts_correct_only_the_declared_family():
    claims = pd.DataFrame(dict(
        test_set=["ALL", "ALL", "ALL", "cell_phones"], p_value=[0.001, 0.02, 0.04, 0.001],
        statistical_verdict=["replicates", "reversed", "replicates", "replicates"],
        verdict=["replicates", "reversed", "uninformative", "replicates"]))
    out = adjusted_verdicts(claims, (claims.test_set == "ALL").to_numpy(), alpha=0.05)
    np.testing.assert_allclose(out.p_holm[:3], [0.003, 0.04, 0.04])
    assert np.isnan(out.p_holm[3])
    assert out.adjusted_verdict.tolist() == ["replicates", "reversed", "uninformative", "exploratory"]
    stricter = adjusted_verdicts(claims, (claims.test_set == "ALL").to_numpy(), alpha=0.01)
    assert stricter.adjusted_verdict.tolist() == ["replicates", "undecided", "uninformative", "exploratory"]
