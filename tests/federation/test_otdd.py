"""Federated OTDD: close to the exact OTDD, ≈0 on itself, clear errors for degenerate clients, private; a bracket
lower ≤ OTDD ≤ estimate (POT's exact solver) that warns when wide, and a pairwise result object."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import ot
import pytest
from ot.gaussian import bures_wasserstein_distance

from otfed.errors import DegenerateClientError
from otfed.federation import Channel, FedWaDConfig, LabelledData, federated_otdd, pairwise_federated_otdd
from otfed.federation.messages import MomentMessage
from otfed.federation.otdd import bound_vectors, client_pairs, matrix_and_ledger, pair_seed, pairwise_sessions
from otfed.ot import augment_with_label_stats, class_statistics, gelbrich_bound, measure_moments, otdd_exact
from otfed.ot.otdd import augmented_measure
from tests.privacy_boundary import assert_boundary_holds


def labelled(name: str, n: int, shift: float, seed: int, d: int = 3, classes: int = 2) -> LabelledData:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.standard_normal((n, d)) + shift + 3.0 * y[:, None]
    return LabelledData(name, x, y)


CONFIG = FedWaDConfig(support_size=60, iterations=25, solver="network_simplex")


def test_federated_otdd_close_to_exact() -> None:
    a, b = labelled("a", 60, 0.0, 1), labelled("b", 60, 1.5, 2)
    fed = federated_otdd(a, b, CONFIG, seed=0).estimate
    exact = otdd_exact(a.x, a.y, b.x, b.y)
    assert exact * (1 - 1e-9) <= fed < 1.02 * exact


def test_otdd_of_a_dataset_with_itself_is_near_zero() -> None:
    a = labelled("a", 60, 0.0, 1)
    fed = federated_otdd(a, a, CONFIG, seed=0).estimate
    shifted = labelled("b", 60, 2.0, 2)
    assert otdd_exact(a.x, a.y, a.x, a.y) < 1e-6  # sqrt of ~1e-16 rounding in squared distances
    assert fed < 0.05 * otdd_exact(a.x, a.y, shifted.x, shifted.y)


def test_pairwise_matrix_orders_like_exact_and_is_reproducible() -> None:
    clients = [labelled(f"c{k}", 40, shift, 10 + k) for k, shift in enumerate([0.0, 0.5, 3.0, 6.0])]
    config = FedWaDConfig(support_size=40, iterations=20, solver="network_simplex")
    out = pairwise_federated_otdd(clients, config, seed=4)
    d, ledger = out.estimates, out.ledger
    d2 = pairwise_federated_otdd(clients, config, seed=4).estimates
    np.testing.assert_array_equal(d, d2)
    assert np.allclose(d, d.T) and np.all(np.diag(d) == 0)
    assert d[0, 1] < d[0, 2] < d[0, 3]
    assert len({e.session for e in ledger.entries}) == 6


def test_pair_sessions_run_in_any_order_give_the_pairwise_matrix() -> None:
    """A stage fans the per-pair sessions out as jobs: run backwards, they give the same matrix and ledger."""
    clients = [labelled(f"c{k}", 30, shift, 20 + k) for k, shift in enumerate([0.0, 1.0, 4.0])]
    config = FedWaDConfig(support_size=20, iterations=5)
    out = pairwise_federated_otdd(clients, config, seed=7)
    d, ledger = out.estimates, out.ledger
    sessions = pairwise_sessions(clients, config, seed=7)
    assert [(s["a"].name, s["b"].name) for s in sessions] == [("c0", "c1"), ("c0", "c2"), ("c1", "c2")]
    results = [federated_otdd(**s) for s in reversed(sessions)][::-1]
    d2, ledger2 = matrix_and_ledger(len(clients), results)
    np.testing.assert_array_equal(d, d2)
    assert ledger2.total_bytes == ledger.total_bytes and len(ledger2.entries) == len(ledger.entries)
    with_self = pairwise_sessions(clients, config, seed=7, include_diagonal=True)
    assert len(with_self) == 6 and with_self[1]["seed"] == sessions[0]["seed"]  # (0, 1): same pair, same seed


def test_degenerate_clients_are_named() -> None:
    good = labelled("good", 20, 0.0, 1)
    empty = LabelledData("empty-client", np.zeros((0, 3)), np.zeros(0, dtype=int))
    with pytest.raises(DegenerateClientError, match="empty-client"):
        federated_otdd(good, empty, CONFIG)
    lonely = LabelledData("lonely-class", np.vstack([good.x, [[9.0, 9.0, 9.0]]]), np.append(good.y, 7))
    with pytest.raises(DegenerateClientError, match="lonely-class"):
        federated_otdd(good, lonely, CONFIG)
    nan_x = good.x.copy()
    nan_x[3, 1] = np.nan
    with pytest.raises(DegenerateClientError, match="nan-client"):
        federated_otdd(good, LabelledData("nan-client", nan_x, good.y), CONFIG)


def test_single_class_client_gives_a_finite_distance() -> None:
    a = labelled("a", 30, 0.0, 1, classes=1)
    b = labelled("b", 30, 1.0, 2, classes=2)
    value = federated_otdd(a, b, CONFIG).estimate
    assert np.isfinite(value) and value > 0


def test_server_sees_no_sample_label_or_statistic() -> None:
    a, b = labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2)
    channel = Channel(keep_inbox=True)
    federated_otdd(a, b, FedWaDConfig(support_size=30, iterations=5, interpolation="exact"), channel=channel)
    received = channel.received_by("server")
    supports = [arr for m in received for arr in m.arrays() if arr.ndim == 2]
    assert supports and all(s.shape[1] == 3 * a.x.shape[1] for s in supports)  # augmented space only
    private = {}
    for data in (a, b):  # raw features, augmented samples [x; m_y; s_y], class statistics [m_y; s_y]
        augmented = augment_with_label_stats(data.x, data.y, class_statistics(data.x, data.y))
        private[data.name] = [data.x, augmented, np.unique(augmented[:, data.x.shape[1]:], axis=0)]
    assert_boundary_holds(received, private)  # every field, every window (tests/privacy_boundary.py)


# ------------------------------------------------------------------------ the bracket (issue #34, item 1)

def pot_otdd(a: LabelledData, b: LabelledData, diagonal: bool) -> float:
    """The exact OTDD from POT alone: ``ot.emd2`` on ||x − x'||² + W₂²(N(m_y, Σ_y), N(m_y', Σ_y')) with NumPy's
    class means and unbiased covariances (their diagonal in diagonal mode) and POT's closed-form Gaussian W₂."""
    def gaussian(data: LabelledData, c: Any) -> tuple[np.ndarray, np.ndarray]:
        x = data.x[data.y == c]
        cov = np.cov(x.T)
        return x.mean(axis=0), (np.diag(np.diag(cov)) if diagonal else cov)

    ga = {c: gaussian(a, c) for c in np.unique(a.y)}
    gb = {c: gaussian(b, c) for c in np.unique(b.y)}
    label = {(c, e): float(bures_wasserstein_distance(ga[c][0], gb[e][0], ga[c][1], gb[e][1])) ** 2
             for c in ga for e in gb}
    cost = ot.dist(a.x, b.x) + np.array([[label[c, e] for e in b.y] for c in a.y])
    n, m = len(a.y), len(b.y)
    return float(np.sqrt(ot.emd2(np.full(n, 1 / n), np.full(m, 1 / m), cost, numItermax=10_000_000)))


def rotated_classes(name: str, n: int, seed: int, angle: float, shift: float) -> LabelledData:
    """Two classes of very different, non-commuting covariances (an anisotropic cloud turned by ``angle``): the
    case where the Frobenius term of the full-mode augmentation is far above the Bures term."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    turn = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    x = rng.standard_normal((n, 2)) * np.where(y[:, None] == 0, [3.0, 0.2], [0.3, 0.3]) @ turn.T
    return LabelledData(name, x + shift + 2.0 * y[:, None], y)


def three_classes_relabelled(name: str, n: int, seed: int) -> LabelledData:
    """Three classes whose labels are 5, 6, 7 (no label in common with the clients labelled 0, 1) and whose
    class 5 sits where their class 1 sits."""
    data = labelled(name, n, 0.5, seed, classes=3)
    return LabelledData(name, data.x, np.array([6, 5, 7])[data.y])


BRACKET_CASES = {  # name: (a, b, config) — defaults (S = 10) and S = n, balanced and adversarial
    "shifted, defaults": (labelled("a", 60, 0.0, 1), labelled("b", 60, 1.5, 2), FedWaDConfig()),
    "shifted, S = n": (labelled("a", 60, 0.0, 1), labelled("b", 60, 1.5, 2), FedWaDConfig(support_size=60)),
    "3 vs 2 classes": (labelled("a", 90, 0.0, 3, classes=3), labelled("b", 50, 0.0, 4), FedWaDConfig()),
    "labels shifted and permuted": (labelled("a", 70, 0.0, 5), three_classes_relabelled("b", 45, 6),
                                    FedWaDConfig(support_size=20)),
    "one class vs two": (labelled("a", 40, 0.0, 7, classes=1), labelled("b", 40, 0.0, 8), FedWaDConfig()),
    "near-identical": (labelled("a", 50, 0.0, 9), labelled("b", 50, 0.01, 9), FedWaDConfig(support_size=5)),
    "non-commuting covariances": (rotated_classes("a", 80, 10, 0.0, 0.0), rotated_classes("b", 60, 11, 1.2, 0.5),
                                  FedWaDConfig(support_size=15)),
    "exact interpolation": (labelled("a", 30, 0.0, 12, d=4), labelled("b", 25, 2.0, 13, d=4, classes=3),
                            FedWaDConfig(support_size=8, iterations=5, interpolation="exact")),
}


@pytest.mark.parametrize("diagonal", [True, False], ids=["diagonal", "full"])
@pytest.mark.parametrize("case", list(BRACKET_CASES))
def test_the_bracket_holds_the_exact_otdd(case: str, diagonal: bool) -> None:
    """lower ≤ OTDD ≤ estimate against POT's exact solver on the OTDD cost (Gaussian W₂ from POT's closed form),
    in both covariance modes — in full mode the lower bound comes from [x; m_y; √tr Σ_y], the estimate from the
    Frobenius augmentation, and the OTDD between them uses the Bures term."""
    a, b, config = BRACKET_CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the wide-bracket warning: tested below
        result = federated_otdd(a, b, config, seed=3, diagonal=diagonal)
    exact = pot_otdd(a, b, diagonal)
    assert exact == pytest.approx(otdd_exact(a.x, a.y, b.x, b.y, diagonal=diagonal), rel=1e-9, abs=1e-9)
    assert result.lower is not None and result.bracket == (result.lower, result.estimate)
    assert result.lower <= exact * (1 + 1e-9) + 1e-9
    assert exact <= result.estimate * (1 + 1e-9) + 1e-9


def issue_datasets() -> list[LabelledData]:
    """Issue #34's setting: three labelled 5-D datasets of 300, 250 and 280 points, 3 classes (random labels,
    class centres drawn from N(0, I), unit-variance noise, each dataset shifted 0.5 per coordinate from the last)."""
    centres = np.random.default_rng(0).normal(size=(3, 5))
    out = []
    for k, (name, n) in enumerate([("a", 300), ("b", 250), ("c", 280)]):
        rng = np.random.default_rng(k + 1)
        y = rng.integers(0, 3, n)
        out.append(LabelledData(name, rng.normal(size=(n, 5)) + centres[y] + 0.5 * k, y))
    return out


def test_at_the_defaults_a_loose_estimate_warns_and_the_bracket_holds_the_otdd() -> None:
    """S = 10 in 5-D puts every estimate well above the exact OTDD (POT); each pair now says so: a RuntimeWarning
    whose text is also in the notes, and a bracket that holds the OTDD (before: lower None, silence)."""
    datasets = issue_datasets()
    for i, j in client_pairs(3):
        a, b = datasets[i], datasets[j]
        exact = pot_otdd(a, b, diagonal=True)
        with pytest.warns(RuntimeWarning, match=r"is an upper bound of W2 and is .* the Gelbrich lower bound") as got:
            result = federated_otdd(a, b, FedWaDConfig())
        assert result.estimate > 1.25 * exact  # the loose estimate the issue found
        assert result.lower is not None and result.lower <= exact <= result.estimate
        assert result.kind == "upper bound (triangle inequality)"
        texts = [str(w.message) for w in got if issubclass(w.category, RuntimeWarning)]
        assert any("Gelbrich lower bound" in text for text in texts) and set(texts) <= set(result.notes)


def test_without_the_lower_bound_no_moments_are_sent_and_the_estimate_is_the_same() -> None:
    """``lower_bound=False``: Algorithm 1's messages only, ``lower`` None, the same estimate (the moments draw
    no random number)."""
    a, b = issue_datasets()[:2]
    plain = Channel(keep_inbox=True)
    off = federated_otdd(a, b, FedWaDConfig(lower_bound=False), seed=2, channel=plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        on = federated_otdd(a, b, FedWaDConfig(), seed=2)
    assert off.lower is None and off.bracket == (0.0, off.estimate) and on.estimate == off.estimate
    assert {m.kind for m in plain.received_by("server")} == {"interpolant", "distance"}


def test_pairwise_result_matches_the_per_pair_sessions() -> None:
    """The pairwise object's matrices, statuses and ledger are those of the per-pair calls (each with its
    pair seed), and lowers ≤ exact OTDD ≤ estimates entry by entry."""
    clients = [labelled(f"c{k}", 30, shift, 30 + k, classes=2 + k % 2) for k, shift in enumerate([0.0, 1.0, 4.0])]
    config = FedWaDConfig(support_size=12, iterations=6, record_history=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = pairwise_federated_otdd(clients, config, seed=5)
        single = {(i, j): federated_otdd(clients[i], clients[j], config, seed=pair_seed(5, i, j))
                  for i, j in client_pairs(3)}
    assert out.names == ["c0", "c1", "c2"] and out.pairs == list(single)
    for (i, j), result in single.items():
        assert out.estimates[i, j] == out.estimates[j, i] == result.estimate
        assert out.lowers[i, j] == out.lowers[j, i] == result.lower
        assert out.statuses[(clients[i].name, clients[j].name)] == result.status != "not monitored"
        exact = pot_otdd(clients[i], clients[j], diagonal=True)
        assert out.lowers[i, j] <= exact <= out.estimates[i, j]
    assert np.all(np.diag(out.estimates) == 0) and np.all(np.diag(out.lowers) == 0)
    assert len(out.ledger.entries) == sum(len(r.ledger.entries) for r in single.values())
    assert out.ledger.total_bytes == sum(r.ledger.total_bytes for r in single.values())
    assert [(r["a"], r["b"], r["estimate"], r["lower"]) for r in out.rows()] == \
        [(clients[i].name, clients[j].name, r.estimate, r.lower) for (i, j), r in single.items()]
    assert set(out.notes) == {(clients[i].name, clients[j].name) for (i, j), r in single.items() if r.notes}


def test_pairwise_lowers_are_nan_without_the_lower_bound() -> None:
    clients = [labelled(f"c{k}", 20, float(k), 40 + k) for k in range(3)]
    out = pairwise_federated_otdd(clients, FedWaDConfig(support_size=20, iterations=3, lower_bound=False), seed=1)
    assert np.isnan(out.lowers[0, 1]) and np.isnan(out.lowers[1, 2]) and np.all(np.diag(out.lowers) == 0)
    assert all(r["lower"] is None for r in out.rows())


@pytest.mark.parametrize("diagonal", [True, False], ids=["diagonal", "full"])
def test_the_server_receives_interpolants_distances_and_the_bound_vectors_moments_only(diagonal: bool) -> None:
    """Everything the server received: interpolating measures of the augmented width, two distances, and one
    moment message per client — the mean and covariance (ddof = 0) of [x; m_y; s_y] (diagonal) or
    [x; m_y; √tr Σ_y] (full), recomputed here from NumPy's class statistics — and no near-copy of a sample,
    an augmented sample or a class's statistics (tests/privacy_boundary.py)."""
    a, b = labelled("a", 30, 0.0, 1), labelled("b", 30, 1.0, 2)
    d = a.x.shape[1]
    channel = Channel(keep_inbox=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        federated_otdd(a, b, FedWaDConfig(support_size=30, iterations=5), diagonal=diagonal, channel=channel)
    received = channel.received_by("server")
    assert sorted({m.kind for m in received}) == ["distance", "interpolant", "moments"]
    width = 3 * d if diagonal else 2 * d + d * d
    assert all(m.measure.dim == width for m in received if m.kind == "interpolant")
    moments = {m.sender: m for m in received if m.kind == "moments"}
    assert sorted(moments) == ["a", "b"] and all(isinstance(m, MomentMessage) for m in moments.values())
    private = {}
    for data in (a, b):
        per_class = {c: data.x[data.y == c] for c in np.unique(data.y)}
        spread = {c: (x.std(axis=0, ddof=1) if diagonal else [np.sqrt(np.trace(np.cov(x.T)))])
                  for c, x in per_class.items()}
        vectors = np.array([np.concatenate([x, per_class[c].mean(axis=0), spread[c]]) for x, c in zip(data.x, data.y)])
        np.testing.assert_allclose(moments[data.name].mean, vectors.mean(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(moments[data.name].covariance, np.cov(vectors.T, bias=True), rtol=1e-10,
                                   atol=1e-12)
        augmented = augment_with_label_stats(data.x, data.y, class_statistics(data.x, data.y, diagonal=diagonal))
        private[data.name] = [data.x, augmented, np.unique(augmented[:, d:], axis=0), vectors]
    assert_boundary_holds(received, private)


def test_full_mode_needs_the_trace_vectors_not_the_augmented_vectors_moments() -> None:
    """Why :func:`bound_vectors` in full mode: on classes with non-commuting covariances, Gelbrich's bound from
    the Frobenius-augmented vectors' own moments exceeds the exact OTDD (POT) — it bounds a larger distance —
    while the one federated_otdd computes, from [x; m_y; √tr Σ_y], stays below it."""
    a, b, config = BRACKET_CASES["non-commuting covariances"]
    exact = pot_otdd(a, b, diagonal=False)
    (ma, ca), (mb, cb) = (measure_moments(augmented_measure(d, diagonal=False)) for d in (a, b))
    assert gelbrich_bound(ma, ca, mb, cb) > exact * (1 + 1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = federated_otdd(a, b, config, seed=3, diagonal=False)
    assert result.lower is not None and result.lower <= exact
    bound = bound_vectors(a, diagonal=False)
    assert bound.dim == 2 * a.x.shape[1] + 1
