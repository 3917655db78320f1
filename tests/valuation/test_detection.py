"""Detection metrics (hand-computed) and the planted feature-noise experiment (FedBary fig. 5)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.linear_model import LogisticRegression

from otfed.federation import LabelledData
from otfed.federation.fedbary import FedBaryConfig, federated_valuation
from otfed.valuation import (KNNShapley, Lava, ValuationData, detection_scores, flag_noisy, point_removal_curve,
                             rank_by_value)


def test_detection_scores_hand_case() -> None:
    flagged = np.zeros(10, dtype=bool)
    flagged[[0, 1, 2, 7]] = True
    scores = detection_scores(flagged, noisy=[1, 2, 3], n=10)
    assert (scores.true_positives, scores.flagged, scores.noisy) == (2, 4, 3)
    assert scores.precision == pytest.approx(0.5) and scores.recall == pytest.approx(2 / 3)
    assert scores.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert detection_scores(np.array([4, 5]), noisy=[1]).f1 == 0.0  # index form, no hit
    with pytest.raises(ValueError):
        detection_scores(np.zeros(3, dtype=bool), noisy=[5])


def test_point_removal_curve_refits_on_the_remaining_points() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 2))
    y = (x[:, 0] > 0).astype(int)
    xt = rng.standard_normal((50, 2))
    yt = (xt[:, 0] > 0).astype(int)
    values = rng.standard_normal(40)
    curve = point_removal_curve(values, x, y, xt, yt, step=0.25, max_fraction=0.5)
    np.testing.assert_allclose(curve.fractions, [0.0, 0.25, 0.5])
    assert curve.removed.tolist() == [0, 10, 20]
    order = np.argsort(-values)
    for r, acc in zip(curve.removed, curve.accuracy):
        keep = np.sort(order[r:])
        model = LogisticRegression(max_iter=2000, random_state=0).fit(x[keep], y[keep])
        assert acc == pytest.approx(np.mean(model.predict(xt) == yt))


def planted_feature_noise(seed: int = 0):
    """5-D Gaussians, two classes (class 1 shifted by 3 on the first axis), 200 training points of which
    40 get extra N(0, 3²) feature noise; a clean validation set (200) and a clean holdout (500)."""
    rng = np.random.default_rng(seed)
    n, d = 200, 5

    def clean(m: int):
        labels = rng.integers(0, 2, m)
        feats = rng.standard_normal((m, d))
        feats[:, 0] += 3.0 * labels
        return feats, labels

    x, y = clean(n)
    noisy = np.sort(rng.choice(n, 40, replace=False))
    x[noisy] += rng.normal(0.0, 3.0, (40, d))
    return (x, y), clean(200), clean(500), noisy


@pytest.mark.slow  # FedBary, LAVA and KNN-Shapley on 700 points
def test_fedbary_detects_planted_feature_noise_like_lava() -> None:
    """Measured (seed 0, S = 100, 20 iterations, Sinkhorn potentials vs η_Q): FedBary flags 46 points,
    recall 1.00, precision 0.87, top-40 precision 1.00; LAVA (direct access) recall 1.00, precision 0.91;
    Spearman(FedBary, LAVA) = 0.99; KNN-Shapley's 40 lowest values hit only 19 noisy points (feature
    noise with correct labels barely hurts a KNN). Seeds 1–3: FedBary recall 0.875–0.90, precision
    0.63–0.97 (LAVA 0.85 / 0.58–0.97), ρ 0.98–0.99. Holdout accuracy after removing 20 % by FedBary
    value: 0.922 → 0.936 (random order: 0.908)."""
    (x, y), (xv, yv), (xt, yt), noisy = planted_feature_noise(0)
    result = federated_valuation([LabelledData("client", x, y)], FedBaryConfig(support_size=100, iterations=20),
                                 validation=LabelledData("validation", xv, yv), seed=0, datum_values=True)
    values = result.datum_values["client"]
    fed = detection_scores(flag_noisy(values), noisy, 200)
    assert fed.recall >= 0.95 and fed.precision >= 0.8
    assert detection_scores(rank_by_value(values)[:40], noisy).precision >= 0.95
    data = ValuationData(x, y, xv, yv)
    lava = Lava().fit(data)
    direct = detection_scores(flag_noisy(lava), noisy, 200)
    assert direct.recall >= 0.95 and direct.precision >= 0.8
    assert spearmanr(values, lava)[0] > 0.95
    knn = KNNShapley(5).fit(data)
    assert detection_scores(rank_by_value(-knn)[:40], noisy).precision < fed.precision
    # removing the most harmful points first does not hurt the holdout accuracy; random order is no better
    curve = point_removal_curve(values, x, y, xt, yt, max_fraction=0.3)
    random_curve = point_removal_curve(np.random.default_rng(1).permutation(200).astype(float), x, y, xt, yt,
                                       max_fraction=0.3)
    assert curve.accuracy[4] >= curve.accuracy[0]
    assert curve.accuracy.mean() >= random_curve.accuracy.mean()
