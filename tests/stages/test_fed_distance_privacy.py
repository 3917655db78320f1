"""Stage ``fed_distance``'s privacy jobs (the honest-but-curious server's attack, the DP FedWaD client) on tiny
params (the session's feature-track run, ``tests/stages/conftest.py:PRIVACY``): the values in the tables against
truths computed here — the federation file read with numpy, the PCA with scikit-learn, nearest neighbours by
brute force, W2 by POT, FedWaD run without DP on hand-clipped records, ε from ``dp-accounting`` directly."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import ot
import pandas as pd
import pytest
from dp_accounting.rdp import RdpAccountant
from sklearn.decomposition import PCA

from otfed.errors import ConfigError
from otfed.federation.fedwad import FedWaDConfig, federated_wasserstein
from stages import layout
from stages.fed_distance import PRIVACY_QUOTES, dp_baselines, privacy_attack_cells, privacy_jobs, privacy_seed
from stages.params import validate_params
from tests.stages.conftest import tiny_params


def _inputs(root: Path, params: dict) -> dict[str, Any]:
    """The privacy group's clients as the test computes them: the .npz read with numpy, a scikit-learn PCA fitted
    on the server's test rows, client 0's training / held-out rows and client 1's training rows; C = the largest
    norm of the projected test rows (clip_quantile 1.0)."""
    cfg = params["fed_distance"]["privacy"]
    f = np.load(root / layout.PARTITIONS / f"{cfg['federation']}.npz")
    seed = params["run"]["seed"]
    pca = PCA(n_components=cfg["pca_components"], random_state=seed).fit(f["x_test"].astype(np.float64))
    rows = {(c, s): np.flatnonzero((f["client"] == c) & (f["split"] == s)) for c in (0, 1) for s in (0, 1)}
    project = lambda c, s: pca.transform(f["x"][rows[c, s]].astype(np.float64))  # noqa: E731
    test = pca.transform(f["x_test"].astype(np.float64))
    return dict(target=project(0, 0), held=project(0, 1), partner=project(1, 0),
                radius=float(np.linalg.norm(test, axis=1).max()))


def _clip(x: np.ndarray, radius: float) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.where(norms > radius, x * radius / np.maximum(norms, 1e-300), x)


def _median_nn(x: np.ndarray) -> float:
    d = np.linalg.norm(x[:, None] - x[None], axis=2)
    np.fill_diagonal(d, np.inf)
    return float(np.median(d.min(axis=1)))


def _rdp_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(float(noise_multiplier)), int(releases))
    return float(RdpAccountant().compose(event).get_epsilon(delta))


@pytest.mark.slow  # reads the feature track run (four stages)
def test_attack_recovers_every_sample_where_theory_says_so(feature_run: dict[str, Any]) -> None:
    """S = n with a public t (FedWaD theorem 1: a permutation plan; eq. 5 for exact interpolation) and S = n with a
    random t over K = 3 rounds (the interpolants' means give t): every one of the target's samples is recovered;
    the non-member baseline there is the held-out rows' share within 0.5 × the NN scale of a training row."""
    root, params = feature_run["root"], feature_run["params"]
    out = root / layout.FED_DISTANCE_REPORTS
    rows = pd.read_csv(out / "privacy_attack.csv", dtype={"support": str, "t": str})
    cfg = params["fed_distance"]["privacy"]
    inputs = _inputs(root, params)
    n = inputs["target"].shape[0]
    assert set(rows.n) == {n} and set(rows.target) == {"client_00"} and set(rows.partner) == {"client_01"}
    assert set(rows.protocol) == {"fedwad", "otdd", "fedbary"}
    # FedBary: approximate only; exact interpolation at the smallest K only
    assert set(rows[rows.protocol == "fedbary"].interpolation) == {"approx"}
    assert set(rows[rows.interpolation == "exact"].iterations) == {1}
    privacy = validate_params(params, stage="fed_distance").fed_distance.privacy
    assert len(rows) == len(privacy.pairs) * privacy.seeds * len(privacy_attack_cells(privacy))  # one row per cell
    known = rows[(rows.support == "n") & (rows.t == "0.5")]
    assert len(known) == 8 and (known.S == n).all()  # FedWaD, OTDD: approx K = 1, 3 and exact K = 1; FedBary: 2
    assert (known.recovered_fraction == 1.0).all() and (known.membership_auc == 1.0).all()
    scale = _median_nn(inputs["target"])
    to_train = np.linalg.norm(inputs["held"][:, None] - inputs["target"][None], axis=2).min(axis=1)
    baseline = float(np.mean(to_train <= cfg.get("threshold", 0.5) * scale))
    assert known.non_member_fraction.to_numpy() == pytest.approx(np.full(len(known), baseline), abs=1e-12)
    means = rows[(rows.support == "n") & (rows.t == "random") & (rows.iterations == 3)
                 & (rows.protocol != "fedbary")]
    assert (means.t_methods == "means").all() and (means.t_error < 1e-8).all()
    assert (means.recovered_fraction == 1.0).all()
    labelled = known[known.protocol != "fedwad"]
    assert (labelled.label_ari == 1.0).all() and (labelled.classes_matched == 2).all()  # one class pair
    metrics = feature_run["metrics"]["fed_distance"]["privacy"]
    assert metrics["fedwad_recovered_paper_defences_S_n"] == 1.0  # random t, distance at the end, K = 3
    assert metrics["fedwad_recovered_S5"] < 0.5  # S = 5 ≪ n: transport-cell means, not samples
    # the Markdown twin carries the papers' statements and what the numbers say about them
    text = (out / "privacy_attack.md").read_text()
    for key in ("random_t", "last_distance", "fedbary"):
        assert PRIVACY_QUOTES[key][1] in text
    assert "Claim (1), \"raw training samples cannot be reconstructed\": refuted" in text
    assert text.splitlines()[0].startswith("# Honest-but-curious server")


@pytest.mark.slow  # reads the feature track run (four stages)
def test_dp_values_against_fedwad_pot_and_dp_accounting(feature_run: dict[str, Any]) -> None:
    """ε = ∞: the DP session is FedWaD on records clipped to B(0, C) with the same seed (C: the largest norm of
    the server's projected test rows); W2 is POT's; the ε spent is dp-accounting's RDP ε for σ_mult and the
    K + 1 releases of a session (clustering: (m − 1)(K + 1)); the headline error is the table's at the ε where
    the attack stops recovering more members than non-members."""
    root, params = feature_run["root"], feature_run["params"]
    out = root / layout.FED_DISTANCE_REPORTS
    dp_cfg = params["fed_distance"]["privacy"]["dp"]
    rows = pd.read_csv(out / "privacy_dp.csv", dtype={"support": str, "t": str})
    inputs = _inputs(root, params)
    n = inputs["target"].shape[0]
    assert len(rows) == 2 and set(rows.epsilon) == {10.0, math.inf}
    radius = inputs["radius"]
    assert rows.clip_radius.to_numpy() == pytest.approx([radius, radius], rel=1e-9)
    w2 = float(np.sqrt(ot.emd2(ot.unif(n), ot.unif(inputs["partner"].shape[0]),
                               ot.dist(inputs["target"], inputs["partner"]), numItermax=10**7)))
    assert rows.exact_w2.to_numpy() == pytest.approx([w2, w2], rel=1e-9)
    config = FedWaDConfig(support_size=n, iterations=dp_cfg["iterations"], t=0.5, lower_bound=False)
    seed = privacy_seed(0, 0, 1, 0)
    plain = federated_wasserstein(inputs["target"], inputs["partner"], config, seed=seed).estimate
    clipped = federated_wasserstein(_clip(inputs["target"], radius), _clip(inputs["partner"], radius), config,
                                    seed=seed).estimate
    free = rows[rows.epsilon == math.inf].iloc[0]
    assert free.estimate == pytest.approx(clipped, rel=1e-9)
    assert free.fedwad_estimate == pytest.approx(plain, rel=1e-9)
    assert free.rel_error == pytest.approx(abs(clipped - w2) / w2, rel=1e-8)
    if free.clipped_fraction == 0.0 and np.linalg.norm(inputs["partner"], axis=1).max() <= radius:
        assert free.rel_error == pytest.approx(free.fedwad_rel_error, rel=1e-9)  # no record clipped: FedWaD itself
        assert free.recovered_fraction == 1.0  # S = n, public t, no noise: every sample, as without DP
    noisy = rows[rows.epsilon == 10.0].iloc[0]
    assert noisy.releases == dp_cfg["iterations"] + 1
    assert noisy.epsilon_spent == pytest.approx(_rdp_epsilon(noisy.noise_multiplier, noisy.releases, 1e-5), rel=1e-9)
    assert noisy.epsilon_spent <= 10.0
    clustering = pd.read_csv(out / "privacy_dp_clustering.csv")
    m = dp_cfg["clustering_clients"]
    assert set(clustering.clients) == {m} and set(clustering.method) == {"affinity", "knn3"}
    finite = clustering[clustering.epsilon == 10.0].iloc[0]
    clustering_k = params["fed_distance"]["clustering"]["fedwad"]["iterations"]
    assert finite.releases == (m - 1) * (clustering_k + 1)
    assert finite.epsilon_spent == pytest.approx(_rdp_epsilon(finite.noise_multiplier, int(finite.releases), 1e-5),
                                                 rel=1e-9)
    metrics = feature_run["metrics"]["fed_distance"]["privacy"]
    ordered = rows.sort_values("epsilon")
    leaking = ordered.recovered_fraction > ordered.non_member_fraction
    k = int(np.argmax(leaking.to_numpy())) if leaking.any() else len(ordered)
    if k:
        assert metrics["dp_baseline_epsilon"] == ordered.epsilon.iloc[k - 1]
        assert metrics["dp_rel_error_at_baseline"] == pytest.approx(ordered.rel_error.iloc[k - 1], rel=1e-9)
    else:
        assert math.isnan(metrics["dp_baseline_epsilon"])
    text = (out / "privacy_dp.md").read_text()
    assert PRIVACY_QUOTES["dp"][1] in text and "FedBary's noisy-data detection AUC vs ε" in text
    # DP FedBary (every client DP, Q the validation set): ε = ∞ releases without noise, finite ε within budget
    fedbary = pd.read_csv(out / "privacy_dp_fedbary.csv", dtype={"support": str})
    assert sorted(fedbary.epsilon) == [10.0, math.inf] and set(fedbary.support) == {"n"}
    finite_fb = fedbary[fedbary.epsilon == 10.0].iloc[0]
    assert finite_fb.releases == 2 * dp_cfg["iterations"] + 1
    assert finite_fb.epsilon_spent == pytest.approx(_rdp_epsilon(finite_fb.noise_multiplier, 2 * dp_cfg["iterations"]
                                                                 + 1, 1e-5), rel=1e-9)
    assert finite_fb.epsilon_spent <= 10.0
    assert fedbary[fedbary.epsilon == math.inf].iloc[0].noise_multiplier == 0.0
    assert "dp_fedbary_Sn_baseline_epsilon" in metrics and "FedBary, every client DP" in text
    assert (out / "privacy.png").stat().st_size > 0


def test_dp_baselines_on_a_hand_built_summary() -> None:
    summary = pd.DataFrame([dict(support="n", t="0.5", epsilon=e, recovered=r, non_member=0.1, rel_error=err,
                                 fedwad_rel_error=0.05) for e, r, err in
                            [(1.0, 0.0, 9.0), (10.0, 0.1, 3.0), (100.0, 0.4, 1.0), (math.inf, 1.0, 0.05)]]
                           + [dict(support="5", t="random", epsilon=e, recovered=0.0, non_member=0.0, rel_error=0.5,
                                   fedwad_rel_error=0.5) for e in (1.0, math.inf)]
                           + [dict(support="7", t="random", epsilon=e, recovered=0.9, non_member=0.0, rel_error=0.5,
                                   fedwad_rel_error=0.5) for e in (1.0, math.inf)])
    got = dp_baselines(summary).set_index("support")
    assert got.loc["n", "baseline_epsilon"] == 10.0 and got.loc["n", "rel_error_at_baseline"] == 3.0
    assert got.loc["5", "baseline_epsilon"] == math.inf  # never leaks: no noise needed
    assert math.isnan(got.loc["7", "baseline_epsilon"])  # leaks at every ε of the grid
    assert got.loc["n", "recovered_at_largest_epsilon"] == 1.0


@pytest.mark.parametrize("change, key", [
    ({"pairs": [[0, 0]]}, "pairs[0]"),
    ({"pairs": [[0, 12]]}, "fed_distance.privacy.pairs[0]"),
    ({"federation": "bench"}, "fed_distance.privacy.federation"),
    ({"validation_samples": 60}, "fed_distance.privacy.validation_samples"),
    ({"supports": [0]}, "supports"),
    ({"dp": {"clustering_clients": 11}}, "fed_distance.privacy.dp.clustering_clients"),
    ({"protocols": ["fedbary"], "interpolations": ["exact"]}, "fed_distance.privacy.interpolations"),
    ({"dp": {"epsilons": [0.0]}}, "epsilons"),
])
def test_privacy_params_errors_name_the_key(tmp_path: Path, change: dict, key: str) -> None:
    params = tiny_params(tmp_path)
    params["fed_distance"]["privacy"].update(change)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        validate_params(params, stage="fed_distance")


def test_privacy_is_off_unless_configured(tmp_path: Path) -> None:
    params = tiny_params(tmp_path)
    params["fed_distance"].pop("privacy")
    p = validate_params(params, stage="fed_distance")
    assert p.fed_distance.privacy is None and privacy_jobs(p) == []
