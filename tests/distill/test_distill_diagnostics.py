"""Constant-prediction floor, rank informativeness and teacher gate for Semantic Distance (KNOT §1)."""
import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import linprog, minimize
from scipy.stats import spearmanr

from otfed.distill.diagnostics import (
    best_constant,
    diagnostics,
    expected_coordinates,
    expected_label_profile,
    informativeness,
    teacher_gate,
)
from otfed.label_space import LabelSpace
from otfed.metrics import semantic_distance

SA, ERC, NLI = (LabelSpace.for_task(t) for t in ("sa", "erc", "nli"))


def _coords(space) -> np.ndarray:
    return space.coordinates.numpy() if isinstance(space, LabelSpace) else np.asarray(space, dtype=float)


def _sd_of_constant(m, points) -> float:
    """Independent objective: mean distance from m to the (equally weighted) present label points."""
    return float(np.mean([np.linalg.norm(np.asarray(m) - p) for p in points]))


def _scipy_minimum(points: np.ndarray) -> float:
    """Multi-start Nelder–Mead (centroid and every point, nudged) on the mean-distance objective."""
    f = lambda m: _sd_of_constant(m, points)
    starts = [points.mean(axis=0)] + [p + 1e-3 for p in points]
    return min(
        minimize(f, s, method="Nelder-Mead", options={"xatol": 1e-11, "fatol": 1e-13, "maxiter": 20_000}).fun
        for s in starts
    )


def _histogram_with_mean(points: np.ndarray, m: np.ndarray) -> np.ndarray:
    """A histogram p ≥ 0, Σp = 1 over ``points`` with Σ p_i points_i = m (LP feasibility), or None."""
    k = points.shape[0]
    res = linprog(np.zeros(k), A_eq=np.vstack([points.T, np.ones(k)]), b_eq=np.append(m, 1.0),
                  bounds=[(0, None)] * k, method="highs")
    return res.x if res.status == 0 else None


def _random_probs(rng, n, c, concentration=1.0):
    return rng.dirichlet(np.full(c, concentration), size=n)


# ---------------------------------------------------------------------------------------------------- expected


def test_expected_coordinates_is_the_probability_weighted_mean_of_the_label_points():
    rng = np.random.default_rng(0)
    probs = _random_probs(rng, 7, 5)
    coords = _coords(ERC)
    want = np.array([sum(p[l] * coords[l] for l in range(5)) for p in probs])
    np.testing.assert_allclose(expected_coordinates(probs, ERC), want, atol=1e-14)
    np.testing.assert_allclose(expected_coordinates(torch.from_numpy(probs), coords), want, atol=1e-14)
    assert expected_coordinates(np.eye(5), SA).ravel().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: expected_coordinates(np.ones((4, 3)) / 3, SA), "C = 5 labels"),
        (lambda: expected_coordinates(np.zeros((0, 5)), SA), "empty"),
        (lambda: best_constant([], SA), "empty"),
        (lambda: best_constant([0, 5], SA), r"0\.\.4"),
        (lambda: best_constant([0.5, 1.0], SA), "integer"),
        (lambda: informativeness(np.eye(5), [0, 1, 2], SA), "one label per sample"),
        (lambda: expected_label_profile(np.eye(5)[:, :3], [0, 1, 2, 3, 4], SA), "C = 5"),
        (lambda: diagnostics(np.eye(5), np.zeros((5, 1), dtype=int), SA), "1-D"),
        (lambda: expected_coordinates(np.eye(3), np.zeros((3, 0))), "C×D"),
        (lambda: teacher_gate({}, [0, 1], SA), "no teachers"),
        (lambda: teacher_gate({"a": np.eye(5), "b": np.eye(5)[:4]}, [0, 1, 2, 3, 4], SA), "teacher 'b'"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------------------------------------------- best constant


def test_sa_with_all_five_labels_is_floored_at_1_2_by_the_neutral_rating():
    # closed form: the median rating 3, mean |3 − r| over r = 1..5 is (2 + 1 + 0 + 1 + 2)/5
    value, m = best_constant([0, 1, 2, 3, 4, 4, 4], SA)
    assert value == pytest.approx(1.2, abs=1e-15)
    assert m.tolist() == [3.0]


def test_1d_counts_do_not_matter_and_even_sets_give_the_midpoint():
    value, m = best_constant([0] * 100 + [4], SA)  # ratings 1 and 5, each counted once
    assert value == pytest.approx(2.0) and m.tolist() == [3.0]
    value, m = best_constant([1, 2, 3, 4], SA)  # ratings 2..5: any m in [3, 4] gives (1.5 + 0.5 + 0.5 + 1.5)/4
    assert value == pytest.approx(1.0) and m.tolist() == [3.5]
    value, m = best_constant([2, 2], SA)
    assert value == 0.0 and m.tolist() == [3.0]


def test_equilateral_triangle_and_regular_tetrahedron_have_their_centroid_as_median():
    tri = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    value, m = best_constant([0, 1, 2], tri)
    np.testing.assert_allclose(m, tri.mean(axis=0), atol=1e-10)
    assert value == pytest.approx(1 / math.sqrt(3), abs=1e-12)  # circumradius of the unit triangle
    tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]], dtype=float)
    value, m = best_constant([0, 1, 2, 3], tet)
    np.testing.assert_allclose(m, 0.0, atol=1e-10)
    assert value == pytest.approx(math.sqrt(3), abs=1e-12)


def test_a_data_point_is_the_median_when_collinear_or_behind_a_wide_angle():
    line = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, 3.0]])
    value, m = best_constant([0, 1, 2], line)
    assert m.tolist() == [1.0, 1.0]
    assert value == pytest.approx((math.sqrt(2) + 0 + 2 * math.sqrt(2)) / 3, abs=1e-15)
    # a triangle whose angle at (0, 0) is ≥ 120°: the Fermat point is that vertex
    wide = np.array([[0.0, 0.0], [1.0, 0.0], [-0.5, 0.1]])
    value, m = best_constant([0, 1, 2], wide)
    assert m.tolist() == [0.0, 0.0]
    assert value == pytest.approx((1.0 + math.hypot(0.5, 0.1)) / 3, abs=1e-15)
    # two labels at one point weigh double: (2|m| + |m − (1, 0)|)/3 is smallest at (0, 0)
    twin = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    value, m = best_constant([0, 1, 2], twin)
    assert m.tolist() == [0.0, 0.0] and value == pytest.approx(1 / 3, abs=1e-15)


def _check_against_scipy(points: np.ndarray, labels, coords):
    value, m = best_constant(labels, coords)
    assert m.shape == (coords.shape[1],)
    assert value == pytest.approx(_sd_of_constant(m, points), abs=1e-14)  # the value belongs to m
    reference = _scipy_minimum(points)
    assert value <= reference + 1e-10  # no worse than a generic optimiser
    assert value >= reference - 1e-7  # and the optimiser agrees to its own accuracy
    p = _histogram_with_mean(points, m)  # m* is the expected label of a histogram over the present labels
    assert p is not None
    return value, m


@pytest.mark.parametrize("space", [ERC, NLI], ids=["erc", "nli"])
def test_every_subset_of_real_labels_matches_scipy_and_is_attained_by_a_constant_histogram(space):
    coords = _coords(space)
    c = coords.shape[0]
    for size in range(1, c + 1):
        for subset in itertools.combinations(range(c), size):
            labels = np.repeat(subset, np.arange(1, size + 1))  # unequal counts: must not matter
            value, m = _check_against_scipy(coords[list(subset)], labels, coords)
            # the constant prediction with expected label m* scores exactly that SD
            hist = np.zeros(c)
            hist[list(subset)] = _histogram_with_mean(coords[list(subset)], m)
            probs = np.tile(hist, (labels.size, 1))
            assert semantic_distance(probs, labels, coords) == pytest.approx(value, abs=1e-9)


def test_random_point_sets_in_2d_and_3d_match_scipy_and_a_grid():
    rng = np.random.default_rng(1)
    for d in (2, 3):
        for trial in range(6):
            k = rng.integers(3, 7)
            coords = rng.normal(size=(k, d))
            if trial % 2:  # a point very close to (but not at) the median of the others: slow for plain Weiszfeld
                others = coords[1:]
                g = minimize(lambda m: _sd_of_constant(m, others), others.mean(axis=0), method="Nelder-Mead",
                             options={"xatol": 1e-12, "fatol": 1e-14}).x
                coords[0] = g + 1e-6 * rng.normal(size=d)
            value, _ = _check_against_scipy(coords, np.arange(k), coords)
            if d == 2:  # brute-force grid over the bounding box: the grid minimum is an upper bound
                xs = [np.linspace(coords[:, j].min(), coords[:, j].max(), 301) for j in range(2)]
                grid = np.stack(np.meshgrid(*xs), axis=-1).reshape(-1, 2)
                f = np.linalg.norm(grid[:, None, :] - coords[None], axis=-1).mean(axis=1)
                assert value <= f.min() + 1e-12
                assert value >= f.min() - np.ptp(coords, axis=0).max() / 300  # f is 1-Lipschitz


def test_no_constant_prediction_scores_below_the_floor():
    rng = np.random.default_rng(2)
    for space in (SA, ERC, NLI):
        c = space.n_labels
        labels = rng.integers(0, c, size=40)
        value, _ = best_constant(labels, space)
        for hist in _random_probs(rng, 300, c, 0.3):
            assert semantic_distance(np.tile(hist, (40, 1)), labels, space) >= value - 1e-12


# ---------------------------------------------------------------------------------------------------- informativeness


def test_1d_informativeness_is_spearman_of_expected_and_true_rating():
    rng = np.random.default_rng(3)
    probs = _random_probs(rng, 60, 5)
    labels = rng.integers(0, 5, size=60)
    expected = probs @ np.arange(1.0, 6.0)
    assert informativeness(probs, labels, SA) == pytest.approx(spearmanr(expected, labels + 1.0).statistic,
                                                               abs=1e-14)


def test_monotone_predictions_score_one_and_reversed_ones_minus_one():
    labels = np.array([0, 1, 2, 3, 4, 0, 4])
    sharp = np.eye(5)[labels] * 0.6 + 0.1  # expected rating 0.6·r + 1.2: increasing in r
    assert informativeness(sharp, labels, SA) == pytest.approx(1.0)
    assert informativeness(sharp[:, ::-1], labels, SA) == pytest.approx(-1.0)
    assert informativeness(np.eye(5)[labels], labels, SA) == pytest.approx(1.0)


def test_informativeness_is_nan_without_variation():
    labels = np.array([0, 1, 2, 3, 4])
    assert math.isnan(informativeness(np.full((5, 5), 0.2), labels, SA))  # constant expected label
    assert math.isnan(informativeness(np.eye(5)[[2, 2, 2]], [2, 2, 2], SA))  # one label present
    twin = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert math.isnan(informativeness(np.eye(3)[[0, 1]], [0, 1], twin))  # two labels, one point


def test_multi_d_informativeness_averages_the_axes_the_present_labels_vary_on():
    rng = np.random.default_rng(4)
    probs = _random_probs(rng, 80, 5)
    labels = rng.integers(0, 5, size=80)
    e, t = probs @ _coords(ERC), _coords(ERC)[labels]
    want = np.mean([spearmanr(e[:, a], t[:, a]).statistic for a in range(2)])
    assert informativeness(probs, labels, ERC) == pytest.approx(want, abs=1e-14)
    # NLI with entailment (1,0,0) and contradiction (0,0,1) only: axis 1 has no variation and is skipped
    probs = _random_probs(rng, 50, 3)
    labels = rng.choice([0, 2], size=50)
    e, t = probs @ _coords(NLI), _coords(NLI)[labels]
    want = np.mean([spearmanr(e[:, a], t[:, a]).statistic for a in (0, 2)])
    assert informativeness(probs, labels, NLI) == pytest.approx(want, abs=1e-14)


def test_an_axis_with_constant_expected_labels_counts_as_zero():
    square = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    rng = np.random.default_rng(5)
    labels = rng.integers(0, 4, size=30)
    probs = np.zeros((30, 4))
    probs[:, :2] = _random_probs(rng, 30, 2)  # mass only on the y = 0 labels: expected y is always 0
    rho_x = spearmanr(probs @ square[:, 0], square[labels, 0]).statistic
    assert informativeness(probs, labels, square) == pytest.approx(rho_x / 2, abs=1e-14)


# ---------------------------------------------------------------------------------------------------- profile, diagnostics


def test_profile_reports_overall_and_per_label_mean_expected_labels():
    rng = np.random.default_rng(6)
    probs = _random_probs(rng, 40, 5)
    labels = rng.choice([0, 2, 4], size=40)
    rating = probs @ np.arange(1.0, 6.0)
    prof = expected_label_profile(probs, labels, SA)
    assert isinstance(prof["mean"], float) and prof["mean"] == pytest.approx(rating.mean())
    assert set(prof["per_label"]) == {0, 2, 4}
    for label in (0, 2, 4):
        assert prof["per_label"][label] == pytest.approx(rating[labels == label].mean())
    per = [rating[labels == label].mean() for label in (0, 2, 4)]
    assert prof["spread"] == pytest.approx(max(per) - min(per))

    probs = _random_probs(rng, 40, 5)
    labels = rng.integers(0, 5, size=40)
    e = probs @ _coords(ERC)
    prof = expected_label_profile(probs, labels, ERC)
    assert prof["mean"] == pytest.approx(list(e.mean(axis=0)))
    means = {l: e[labels == l].mean(axis=0) for l in np.unique(labels)}
    want = max(math.dist(a, b) for a, b in itertools.combinations(means.values(), 2))
    assert prof["spread"] == pytest.approx(want)
    assert prof["per_label"][int(labels[0])] == pytest.approx(list(means[labels[0]]))


def test_diagnostics_of_a_perfect_model_and_of_the_best_constant():
    labels = np.array([0, 1, 2, 3, 4, 4, 1])
    d = diagnostics(np.eye(5)[labels], labels, SA)
    assert set(d) == {"semantic_distance", "sd_constant", "sd_skill", "beats_constant", "informativeness",
                      "expected_offset", "expected_label_mean", "expected_label_spread"}
    assert d["semantic_distance"] == 0.0 and d["sd_constant"] == pytest.approx(1.2)
    assert d["sd_skill"] == pytest.approx(1.0) and d["beats_constant"] is True
    assert d["informativeness"] == pytest.approx(1.0)
    assert d["expected_label_mean"] == pytest.approx(np.mean(labels + 1.0))
    assert d["expected_offset"] == pytest.approx(abs(np.mean(labels + 1.0) - 3.0))
    assert d["expected_label_spread"] == pytest.approx(4.0)

    # "neutral" for every text: looks good in a table (SD 1.2 < 2, the SD of always "strong negative") but
    # it is the best constant — skill 0, no information
    d = diagnostics(np.tile(np.eye(5)[2], (7, 1)), labels, SA)
    assert d["semantic_distance"] == pytest.approx(1.2) and d["sd_skill"] == pytest.approx(0.0, abs=1e-12)
    assert d["beats_constant"] is False and math.isnan(d["informativeness"])
    assert d["expected_offset"] == 0.0 and d["expected_label_spread"] == 0.0


def test_diagnostics_in_2d_and_with_a_single_present_label():
    rng = np.random.default_rng(7)
    probs = _random_probs(rng, 30, 3)
    labels = rng.integers(0, 3, size=30)
    d = diagnostics(probs, labels, NLI)
    value, m = best_constant(labels, NLI)
    sd = semantic_distance(probs, labels, NLI)
    assert d["semantic_distance"] == sd and d["sd_constant"] == value
    assert d["sd_skill"] == pytest.approx(1 - sd / value) and d["beats_constant"] == (sd < value)
    assert math.isnan(d["expected_label_mean"])
    assert d["expected_offset"] == pytest.approx(np.linalg.norm((probs @ _coords(NLI)).mean(axis=0) - m))

    d = diagnostics(probs, np.zeros(30, dtype=int), NLI)
    assert d["sd_constant"] == 0.0 and math.isnan(d["sd_skill"]) and d["beats_constant"] is False


# ---------------------------------------------------------------------------------------------------- teacher gate


def test_teacher_gate_passes_informative_teachers_only():
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 5, size=50)
    teachers = {
        "sharp": np.eye(5)[labels] * 0.8 + 0.04,
        "noise": _random_probs(rng, 50, 5),
        "neutral": np.tile(np.eye(5)[2], (50, 1)),
        "reversed": (np.eye(5)[labels] * 0.8 + 0.04)[:, ::-1],
    }
    table = teacher_gate(teachers, labels, SA, threshold=0.5)
    assert list(table.columns) == ["teacher", "n", "informativeness", "semantic_distance", "sd_constant",
                                   "sd_skill", "passes"]
    assert table["teacher"].tolist() == list(teachers)
    assert (table["n"] == 50).all()
    rows = table.set_index("teacher")
    assert rows.loc["sharp", "informativeness"] == pytest.approx(1.0)
    assert math.isnan(rows.loc["neutral", "informativeness"])
    want_noise = spearmanr(teachers["noise"] @ np.arange(1.0, 6.0), labels).statistic
    assert rows.loc["noise", "informativeness"] == pytest.approx(want_noise)
    assert rows["passes"].to_dict() == {"sharp": True, "noise": bool(want_noise >= 0.5), "neutral": False,
                                        "reversed": False}
    assert rows.loc["sharp", "semantic_distance"] == pytest.approx(semantic_distance(teachers["sharp"], labels, SA))
    assert rows["sd_constant"].nunique() == 1
    assert teacher_gate({"sharp": teachers["sharp"]}, labels, SA, threshold=1.0 + 1e-9)["passes"].tolist() == [False]


def test_module_imports_pandas_only_inside_functions():
    import otfed.distill.diagnostics as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not any(name.split(".")[0] == "pandas" for name in names)
