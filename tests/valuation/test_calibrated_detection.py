"""FedBary's calibrated detection (`calibrated_detection`): the split-conformal threshold comes from the server's
clean calibration part valued in the same session, and its false-positive rate on clean clients is near α, where
the paper's g > 0 flags about half of every client."""
from __future__ import annotations

import numpy as np
import pytest

from otfed.federation import LabelledData
from otfed.federation.fedbary import FedBaryConfig, calibrated_detection, federated_valuation
from otfed.valuation.detection import split_validation

MEANS = 3.0 * np.linalg.qr(np.random.default_rng(7).standard_normal((6, 3)))[0].T  # 3 classes in 6-D


def draw(rng: np.random.Generator, name: str, n: int, flip: float = 0.0) -> tuple[LabelledData, np.ndarray]:
    y = np.arange(n) % 3
    x = MEANS[y] + rng.standard_normal((n, 6))
    moved = np.zeros(n, dtype=bool)
    moved[rng.choice(n, int(round(flip * n)), replace=False)] = True
    return LabelledData(name, x, np.where(moved, (y + 1) % 3, y)), moved


@pytest.fixture(scope="module")
def session():
    rng = np.random.default_rng(0)
    clean = [draw(rng, f"clean_{i}", 100)[0] for i in range(6)]
    noisy, moved = draw(rng, "noisy", 100, flip=0.4)
    validation = draw(rng, "server", 200)[0]
    config = FedBaryConfig(support_size=40, iterations=8)
    return clean, noisy, moved, validation, config, calibrated_detection(
        [*clean, noisy], config, validation, alpha=0.1, calibration_fraction=0.5, seed=3)


def test_threshold_is_the_conformal_quantile_of_a_separate_session(session) -> None:
    """Independent recomputation: split the validation set, run plain FedBary with the calibration part as the
    last client and the reference part as Q; the threshold is the ⌈(n + 1)(1 − α)⌉-th smallest calibration value,
    and every client's values and flags follow from it."""
    clean, noisy, _, validation, config, det = session
    reference, calibration = split_validation(validation, 0.5, seed=3)
    again = federated_valuation([*clean, noisy, calibration], config, validation=reference, seed=3,
                                datum_values=True)
    raw = again.datum_values[calibration.name]
    assert raw.size == sum(round(0.5 * c) for c in np.bincount(validation.y))  # half of every class
    cal = np.sort((raw - raw.mean()) / raw.std())  # standardised within the party (the default score)
    k = int(np.ceil((cal.size + 1) * 0.9))
    assert det.threshold == pytest.approx(cal[k - 1], rel=1e-12)
    np.testing.assert_array_equal(det.calibration_values, raw)
    for c in [*clean, noisy]:
        g = again.datum_values[c.name]
        np.testing.assert_array_equal(det.values[c.name], g)
        np.testing.assert_allclose(det.scores[c.name], (g - g.mean()) / g.std(), rtol=1e-12)
        np.testing.assert_array_equal(det.flags[c.name], det.scores[c.name] > det.threshold)
    assert det.flagged == sum(int(f.sum()) for f in det.flags.values())
    assert det.names == [c.name for c in [*clean, noisy]] and det.calibration_name == calibration.name
    raw_rule = calibrated_detection([*clean, noisy], config, validation, alpha=0.1, seed=3, score="raw")
    assert raw_rule.threshold == np.sort(raw)[k - 1]
    np.testing.assert_array_equal(raw_rule.flags["noisy"], again.datum_values["noisy"] > np.sort(raw)[k - 1])


def test_clean_clients_are_flagged_near_alpha_and_g_positive_flags_half(session) -> None:
    clean, _, moved, _, _, det = session
    fpr = np.mean([det.flags[c.name].mean() for c in clean])
    g_positive = np.mean([(det.values[c.name] > 0).mean() for c in clean])
    assert fpr <= 0.2, fpr  # α = 0.1; approximate exchangeability (see the docstring): the measured rate is stated
    assert g_positive >= 0.35, g_positive  # eq. 10 centres each client: g > 0 is about the upper half
    flags = det.flags["noisy"]
    assert flags[moved].mean() > flags[~moved].mean()  # the moved rows stand out within their client


def test_bad_alpha_and_a_name_clash_are_refused(session) -> None:
    clean, _, _, validation, config, _ = session
    with pytest.raises(ValueError, match="alpha"):
        calibrated_detection(clean, config, validation, alpha=1.0)
    with pytest.raises(ValueError, match="score must be 'standardised' or 'raw'"):
        calibrated_detection(clean, config, validation, score="ranked")
    with pytest.raises(ValueError, match="calibration_fraction"):
        calibrated_detection(clean, config, validation, calibration_fraction=0.0)
    clash = LabelledData("server/calibration", clean[0].x, clean[0].y)
    with pytest.raises(ValueError, match="server/calibration"):
        calibrated_detection([clean[1], clash], config, validation)
