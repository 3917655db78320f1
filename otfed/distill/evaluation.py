"""Scoring a KNOT model on every test set (KNOT tables 2–4): the task's headline score and
Semantic Distance, on each party's test split and on their union ``ALL``.

The test sets are the experimenter's view, as in the papers' tables: the server uses them for scoring
only, never for training.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from otfed.data.text import TextFederation
from otfed.distill.diagnostics import diagnostics
from otfed.label_space import LabelSpace
from otfed.metrics import mean_confidence_interval, semantic_distance, task_score
from otfed.models import TextClassifier

ALL = "ALL"  # the union of every party's test split

#: (name, texts, labels) of one test set
EvaluationSet = tuple[str, Sequence[str], np.ndarray]


def evaluation_sets(fed: TextFederation) -> list[EvaluationSet]:
    """(name, texts, labels) of every local test set, the global test set and ALL (their union)."""
    sets = [(p.name, p.test.texts, p.test.labels) for p in (*fed.locals, fed.global_party)]
    texts = [t for _, ts, _ in sets for t in ts]
    labels = np.concatenate([ls for _, _, ls in sets])
    return [*sets, (ALL, texts, labels)]


def evaluate(clf: TextClassifier, task: str, sets: Sequence[EvaluationSet], label_space: LabelSpace,
             batch_size: int) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Score ``clf`` on every test set of :func:`evaluation_sets`: the task score (macro-F1 or accuracy,
    :func:`otfed.metrics.task_score`), Semantic Distance (label-wise mean, KNOT §1) and the :data:`DIAGNOSTICS`
    that say whether that Semantic Distance is any better than a constant's. ALL reuses the other sets'
    predictions.

    Returns table rows (test_set, n, score, semantic_distance and the diagnostics) and each set's N×C
    probabilities.
    """
    rows, probabilities = [], {}
    for name, texts, labels in sets:
        if name == ALL:
            probs = np.concatenate([probabilities[n] for n, _, _ in sets if n != ALL])
        else:
            probs = clf.predict_proba(list(texts), batch_size=batch_size)
        probabilities[name] = probs
        extra = diagnostics(probs, labels, label_space)
        rows.append({"test_set": name, "n": int(len(labels)),
                     "score": task_score(task, labels, probs, label_space.n_labels),
                     "semantic_distance": semantic_distance(probs, labels, label_space),
                     **{key: float(extra[key]) for key in DIAGNOSTICS}})
    return rows, probabilities


#: The diagnostics beside every score (:func:`otfed.distill.diagnostics.diagnostics`): the best constant's
#: Semantic Distance, SD skill = 1 − SD / that, Spearman(expected label, truth), the expected label's mean (1-D),
#: its distance from the best constant's and its spread across true labels.
DIAGNOSTICS = ("sd_constant", "sd_skill", "informativeness", "expected_label_mean", "expected_offset",
               "expected_label_spread")


# ------------------------------------------------------------------- the papers' claims, as statistics
#: metric → the direction the papers claim a better method moves it (+1: higher is better, −1: lower)
BETTER = {"score": +1, "semantic_distance": -1}


def claim_pairs(losses: Sequence[str], weightings: Sequence[str], names: Mapping[str, str]
                ) -> list[tuple[str, str, str]]:
    """(claim, better variant, baseline variant) of the papers' relative claims (KNOT tables 2–4; the
    confident-Sinkhorn paper's weighting ablation): Sinkhorn-X beats Entropy-X for each weighting X, and
    for each loss L, L-E (L2 confidence) beats L-A, L-D and L-U. ``names`` maps a loss to its table name
    (``sinkhorn`` → ``Sinkhorn``, ``kl`` → ``Entropy``); claims whose variants are not both run are left out."""
    out = []
    if "sinkhorn" in losses and "kl" in losses:
        out += [(f"Sinkhorn-{w} vs Entropy-{w}", f"{names['sinkhorn']}-{w}", f"{names['kl']}-{w}")
                for w in weightings]
    if "E" in weightings:
        out += [(f"{names[loss]}-E vs {names[loss]}-{w}", f"{names[loss]}-E", f"{names[loss]}-{w}")
                for loss in losses for w in weightings if w != "E"]
    return out


def paired_claims(rows: pd.DataFrame, claims: Sequence[tuple[str, str, str]], level: float = 0.95) -> pd.DataFrame:
    """Each claim as a paired comparison over seeds: per (task, test set, metric), the differences
    better − baseline of the two variants trained with the same seed (same batches, same dropout masks),
    their mean and Student-t confidence interval (:func:`otfed.metrics.mean_confidence_interval`), and a
    verdict: ``replicates`` when the interval excludes 0 on the side the papers claim (score up, Semantic
    Distance down), ``reversed`` when it excludes 0 on the other side, ``undecided`` otherwise (also with
    a single seed, which has no interval).

    ``rows``: columns task, test_set, variant, seed, score, semantic_distance (one row per student and test
    set). Returns columns task, test_set, claim, better, baseline, metric, seeds, mean_difference,
    ci95 (half-width), low, high, p_value (two-sided paired t-test of the differences, :func:`paired_p_value`),
    verdict.
    """
    out = []
    for (task, test_set), sub in rows.groupby(["task", "test_set"], sort=False):
        for claim, better, baseline in claims:
            for metric, sign in BETTER.items():
                table = sub[sub.variant.isin([better, baseline])].pivot_table(
                    index="seed", columns="variant", values=metric, aggfunc="first")
                if better not in table or baseline not in table:
                    continue
                diff = (table[better] - table[baseline]).dropna().to_numpy()
                if not diff.size:
                    continue
                mean, half = mean_confidence_interval(diff, level)
                low, high = mean - half, mean + half
                # the interval in the papers' direction (a lower SD is better: flip it, and its ends swap)
                near, far = sorted((sign * low, sign * high))
                if np.isfinite(half) and near > 0:
                    verdict = "replicates"
                elif np.isfinite(half) and far < 0:
                    verdict = "reversed"
                else:
                    verdict = "undecided"
                out.append(dict(task=task, test_set=test_set, claim=claim, better=better, baseline=baseline,
                                metric=metric, seeds=int(diff.size), mean_difference=mean, ci95=half,
                                low=low, high=high, p_value=paired_p_value(diff), verdict=verdict))
    return pd.DataFrame(out, columns=["task", "test_set", "claim", "better", "baseline", "metric", "seeds",
                                      "mean_difference", "ci95", "low", "high", "p_value", "verdict"])


def paired_p_value(differences: np.ndarray) -> float:
    """Two-sided p-value of Student's paired t-test that the mean of ``differences`` (one per seed) is 0: the test
    whose 95% interval :func:`paired_claims` reports (p < 0.05 exactly when that interval excludes 0). NaN with
    fewer than two differences; with no spread, 0 for a non-zero mean and 1 for a zero one.

    >>> round(paired_p_value(np.array([1.0, 2.0, 3.0])), 4)   # t = 2 / (1 / √3) = 3.4641, 2 degrees of freedom
    0.0742
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        return float("nan")
    sd = d.std(ddof=1)
    if sd == 0.0:
        return 0.0 if d.mean() != 0.0 else 1.0
    from scipy.stats import t as student_t

    t = d.mean() / (sd / np.sqrt(d.size))
    return float(2.0 * student_t.sf(abs(t), d.size - 1))


def holm_adjusted(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979): sort the m finite p-values, p_(1) ≤ … ≤ p_(m); the adjusted
    p_(i) is max_{j ≤ i} min(1, (m − j + 1) · p_(j)). Rejecting where the adjusted value is < α keeps the
    probability of any false rejection in the family ≤ α, under any dependence between the tests. NaN stays NaN
    and does not count in m.

    >>> holm_adjusted([0.01, 0.04, 0.03, np.nan]).round(4).tolist()   # m = 3: 3·0.01; 2·0.03; max(0.06, 1·0.04)
    [0.03, 0.06, 0.06, nan]
    """
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m = order.size
    running = 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[k]))
        out[k] = running
    return out


def adjusted_verdicts(claims: pd.DataFrame, family: np.ndarray, alpha: float = 0.05) -> pd.DataFrame:
    """``claims`` (:func:`mark_uninformative`) with the family-wise correction of the declared ``family`` (a boolean
    mask of its rows): ``p_holm``, Holm's adjusted p-value over the family's rows (:func:`holm_adjusted`; NaN
    outside it), and ``adjusted_verdict`` — the statistical verdict where ``p_holm`` < ``alpha``, ``undecided``
    where not, ``uninformative`` where ``verdict`` says so, and ``exploratory`` outside the family (read those rows
    as descriptions, not tests). The chance that any family row's adjusted verdict is decided wrongly is then
    ≤ ``alpha``."""
    out = claims.copy()
    family = np.asarray(family, dtype=bool)
    p_holm = np.full(len(out), np.nan)
    p_holm[family] = holm_adjusted(out.loc[family, "p_value"].to_numpy(dtype=np.float64))
    out.insert(out.columns.get_loc("p_value") + 1, "p_holm", p_holm)
    decided = np.where(p_holm < alpha, out["statistical_verdict"], "undecided")
    verdict = np.where(out["verdict"] == "uninformative", "uninformative", decided)
    out["adjusted_verdict"] = np.where(family, verdict, "exploratory")
    return out


def seed_summary(rows: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Mean and Student-t confidence half-width over seeds of score and Semantic Distance per (task, variant,
    test set), in the order the rows come (the arm, loss and weighting columns, when present, carried along), and
    the mean over seeds of the :data:`DIAGNOSTICS`, the epochs kept and the learning rate, when present. A single
    seed has no interval: half-width NaN."""
    out = []
    for (task, variant, test_set), sub in rows.groupby(["task", "variant", "test_set"], sort=False):
        score, score_ci = mean_confidence_interval(sub.score, level)
        sd, sd_ci = mean_confidence_interval(sub.semantic_distance, level)
        extra = {key: sub[key].iloc[0] for key in ("arm", "loss", "weighting") if key in sub}
        means = {key: float(sub[key].mean()) for key in (*DIAGNOSTICS, "epochs", "lr") if key in sub}
        out.append(dict(task=task, variant=variant, test_set=test_set, **extra, seeds=int(len(sub)), score=score,
                        score_ci95=score_ci, semantic_distance=sd, semantic_distance_ci95=sd_ci, **means))
    return pd.DataFrame(out)


def mark_uninformative(claims: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``claims`` (:func:`paired_claims`) with a column ``statistical_verdict`` (the verdict as computed) and
    ``verdict`` set to ``uninformative`` where either variant's mean SD skill over the seeds on that test set
    (``summary``, :func:`seed_summary`) is ≤ 0 or NaN: a student no better than a constant prediction, so the
    difference compares constants, whatever its interval says."""
    out = claims.copy()
    out.insert(out.columns.get_loc("verdict"), "statistical_verdict", out["verdict"])
    if out.empty:
        return out
    skill = summary.set_index(["task", "test_set", "variant"])["sd_skill"]
    informative = [bool(skill.get((r.task, r.test_set, r.better), np.nan) > 0
                        and skill.get((r.task, r.test_set, r.baseline), np.nan) > 0) for r in out.itertuples()]
    out.loc[~np.asarray(informative), "verdict"] = "uninformative"
    return out
