"""Headline metrics (``stages.stage.headline_metrics``): the few numbers ``dvc metrics show`` shows.

Selection is checked on hand-built dicts; every stage's patterns are checked against the committed
``reports/<folder>/metrics.json`` (the full dict each stage's report step returns)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.params import stages
from stages.stage import headline_metrics, is_wall_time, key_matches, unmatched_patterns
from tests.architecture.stage_contract import HEADLINE_MAX, HEADLINE_MIN  # the stage checklist's bounds

REPO = Path(__file__).resolve().parents[2]

METRICS = {
    "toy": {"fedwad_approx_S100_d2_r1_rel_error": 0.006, "fedwad_approx_S10_d2_r1_rel_error": 0.045,
            "convergence_gap_d50_approx_S300_t0.5": 0.14, "convergence_gap_d50_approx_S300_trandom": 0.019,
            "seconds_exact_ot_total": 41.4, "max_n": 5000},
    "clustering": {"pairs_strong": {"affinity": 1.0, "knn3": 1.0}, "pairs_none": {"affinity": 0.21, "knn3": 0.23}},
    "removal": {"accuracy_before": 0.73, "fedbary_seconds": 5.4, "wall_time": 3.0},
    "seconds": {"exact_shapley": 24.8},
    "degenerate_clients": 0,
}


def leaves(d: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    out: dict[tuple[str, ...], object] = {}
    for k, v in d.items():
        out.update(leaves(v, prefix + (k,)) if isinstance(v, dict) else {prefix + (k,): v})
    return out


def test_no_pattern_keeps_everything_but_wall_times() -> None:
    assert headline_metrics(METRICS) == {
        "toy": {"fedwad_approx_S100_d2_r1_rel_error": 0.006, "fedwad_approx_S10_d2_r1_rel_error": 0.045,
                "convergence_gap_d50_approx_S300_t0.5": 0.14, "convergence_gap_d50_approx_S300_trandom": 0.019,
                "max_n": 5000},
        "clustering": {"pairs_strong": {"affinity": 1.0, "knn3": 1.0}, "pairs_none": {"affinity": 0.21, "knn3": 0.23}},
        "removal": {"accuracy_before": 0.73},  # fedbary_seconds, wall_time dropped; "seconds" subtree dropped
        "degenerate_clients": 0,
    }


def test_patterns_select_by_segment_with_wildcards() -> None:
    got = headline_metrics(METRICS, ["clustering.*.affinity", "toy.fedwad_approx_S100_*", "degenerate_clients"])
    assert got == {"toy": {"fedwad_approx_S100_d2_r1_rel_error": 0.006},
                   "clustering": {"pairs_strong": {"affinity": 1.0}, "pairs_none": {"affinity": 0.21}},
                   "degenerate_clients": 0}
    # the result keeps the metrics' own nesting and key order, not the patterns' order
    assert list(got) == ["toy", "clustering", "degenerate_clients"]
    assert list(got["clustering"]) == ["pairs_strong", "pairs_none"]


def test_star_stays_within_one_key() -> None:
    # "*.affinity" is two levels deep: it does not reach clustering.<fed>.affinity (three levels)
    assert headline_metrics(METRICS, ["*.affinity"]) == {}
    assert headline_metrics(METRICS, ["*.*.affinity"]) == {
        "clustering": {"pairs_strong": {"affinity": 1.0}, "pairs_none": {"affinity": 0.21}}}


def test_keys_with_dots_and_subtrees() -> None:
    # a key containing a dot matches its literal dotted spelling, or one "*"
    exact = headline_metrics(METRICS, ["toy.convergence_gap_d50_approx_S300_t0.5"])
    assert exact == {"toy": {"convergence_gap_d50_approx_S300_t0.5": 0.14}}
    assert headline_metrics(METRICS, ["toy.convergence_gap_d50_*"]) == {
        "toy": {"convergence_gap_d50_approx_S300_t0.5": 0.14, "convergence_gap_d50_approx_S300_trandom": 0.019}}
    # a pattern ending at an inner key selects its whole subtree
    assert headline_metrics(METRICS, ["clustering.pairs_none"]) == {
        "clustering": {"pairs_none": {"affinity": 0.21, "knn3": 0.23}}}


def test_wall_times_never_selected_even_when_named() -> None:
    assert headline_metrics(METRICS, ["toy.seconds_exact_ot_total", "removal.*", "seconds"]) == {
        "removal": {"accuracy_before": 0.73}}
    assert unmatched_patterns(METRICS, ["toy.seconds_exact_ot_total", "seconds.*", "removal.*", "nope"]) == [
        "toy.seconds_exact_ot_total", "seconds.*", "nope"]


@pytest.mark.parametrize("path, wall", [
    (("toy", "seconds_exact_ot_total"), True), (("contributions", "seconds", "lava"), True),
    (("fmnist", "fedbary_seconds"), True), (("wall_time",), True), (("elapsed",), True),
    (("toy", "convergence_gap_d2_approx_S300_t0.5"), False), (("otdd", "mean_rel_error"), False),
    (("sa", "Sinkhorn-E", "semantic_distance"), False), (("timestamp_free_rate",), False),
])
def test_is_wall_time(path: tuple[str, ...], wall: bool) -> None:
    assert is_wall_time(path) is wall


def test_key_matches_is_case_sensitive_and_whole_key() -> None:
    assert key_matches(("sa", "Sinkhorn-E", "score"), "*.Sinkhorn-E.*")
    assert not key_matches(("sa", "sinkhorn-e", "score"), "*.Sinkhorn-E.*")
    assert not key_matches(("sa", "Sinkhorn-E-onehot", "score"), "*.Sinkhorn-E.*")
    assert not key_matches(("sa",), "sa.score")  # a pattern longer than the path selects nothing


# ----------------------------------------------------------------------- the stages' own headlines
STAGES = sorted(stages())


def committed_metrics(name: str) -> dict:
    path = REPO / stages()[name].outputs[0] / "metrics.json"
    if not path.exists():
        pytest.skip(f"{path.relative_to(REPO)} not committed")
    return json.loads(path.read_text())


@pytest.mark.parametrize("name", STAGES)
def test_every_stage_declares_a_headline(name: str) -> None:
    from tests.architecture.stage_contract import headline_problems  # the stage checklist's item

    assert not headline_problems(stages()[name]), f"stage {name}: {headline_problems(stages()[name])}"


@pytest.mark.parametrize("name", STAGES)
def test_headline_patterns_match_committed_metrics(name: str) -> None:
    stage = stages()[name]
    metrics = committed_metrics(name)
    assert unmatched_patterns(metrics, stage.headline) == [], f"stage {name}: patterns that select nothing"
    selected = leaves(headline_metrics(metrics, stage.headline))
    assert HEADLINE_MIN <= len(selected) <= HEADLINE_MAX, f"stage {name}: {len(selected)} headline metrics"
    assert not [k for k in selected if is_wall_time(k)]
    # headlines are numbers (dvc metrics show / diff compares numbers), never a wall time
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in selected.values()), selected
