"""Tables and figures of the KNOT text track (stages ``train_teachers``, ``estimate_bias``, ``distill``).

Each figure function returns a matplotlib Figure (the stages' report steps write and log it).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from otfed.metrics import expected_label_coordinates  # noqa: E402


def training_curves(history: pd.DataFrame) -> plt.Figure:
    """Validation macro-F1 per epoch of every party's model, one panel per task (early stopping keeps the
    best epoch, marked with a dot)."""
    tasks = list(dict.fromkeys(history.task)) if len(history) else []
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4.5 * max(len(tasks), 1), 3.4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        sub = history[history.task == task]
        for party, h in sub.groupby("party", sort=False):
            line, = ax.plot(h.epoch, h.val_macro_f1, marker=".", label=party)
            best = h.loc[h.val_macro_f1.idxmax()]
            ax.plot(best.epoch, best.val_macro_f1, "o", color=line.get_color(), ms=7)
        ax.set_title(task.upper())
        ax.set_xlabel("epoch")
        ax.set_ylabel("validation macro-F1")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def bias_figure(table: pd.DataFrame) -> plt.Figure:
    """Each teacher's probability bias B_k (KNOT §5.2): stacked label shares per teacher, one panel per task."""
    tasks = list(dict.fromkeys(table.task))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
    meta = {"task", "party", "max_share", "majority_label"}
    for ax, task in zip(axes[0], tasks):
        sub = table[table.task == task].dropna(axis=1, how="all")
        labels = [c for c in sub.columns if c not in meta]
        bottom = np.zeros(len(sub))
        for label in labels:
            vals = sub[label].to_numpy(dtype=float)
            ax.bar(sub.party, vals, bottom=bottom, label=label)
            bottom += vals
        ax.set_title(f"{task.upper()}: probability bias B_k")
        ax.set_ylabel("share of random texts (argmax)")
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    return fig


def results_table(rows: pd.DataFrame) -> pd.DataFrame:
    """KNOT tables 2–4 layout: one row per variant, per test set its score (macro-F1 or accuracy) and
    Semantic Distance (SD, lower is better) — and, for rows summarised over seeds (columns ``score_ci95``,
    ``semantic_distance_ci95``), the 95% CI half-width of each (``±``)."""
    sets = list(dict.fromkeys(rows.test_set))
    variants = list(dict.fromkeys(rows.variant))
    out = pd.DataFrame({"variant": variants})
    with_ci = "score_ci95" in rows
    for s in sets:
        sub = rows[rows.test_set == s].set_index("variant")
        out[f"{s} score"] = sub.score.reindex(variants).to_numpy()
        if with_ci:
            out[f"{s} score ±"] = sub.score_ci95.reindex(variants).to_numpy()
        out[f"{s} SD"] = sub.semantic_distance.reindex(variants).to_numpy()
        if with_ci:
            out[f"{s} SD ±"] = sub.semantic_distance_ci95.reindex(variants).to_numpy()
    return out


def expected_label_boxplots(probabilities: Mapping[str, Mapping[str, np.ndarray]], labels: np.ndarray,
                            label_space, variants: Sequence[str], test_set: str = "ALL") -> plt.Figure:
    """KNOT fig. 2: distribution of the expected label coordinate Σ_l p_l coord(l) per ground-truth label,
    side by side for ``variants`` (e.g. Sinkhorn-E vs Entropy-E). For multi-dimensional label spaces the
    panel shows the distance of the expected coordinate from the true label's point instead."""
    variants = [v for v in variants if v in probabilities]
    coords = np.asarray(label_space.coordinates, dtype=float)
    one_d = coords.shape[1] == 1
    fig, ax = plt.subplots(figsize=(1.4 * len(label_space.labels) * max(len(variants), 1) + 1.5, 3.8))
    width = 0.8 / max(len(variants), 1)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for j, variant in enumerate(variants):
        e = expected_label_coordinates(probabilities[variant][test_set], coords)
        values = e[:, 0] if one_d else np.linalg.norm(e - coords[labels], axis=1)
        groups = [values[labels == k] for k in range(len(label_space.labels))]
        positions = np.arange(len(groups)) + (j - (len(variants) - 1) / 2) * width
        keep = [i for i, g in enumerate(groups) if len(g)]
        bp = ax.boxplot([groups[i] for i in keep], positions=positions[keep], widths=width * 0.9,
                        patch_artist=True, showfliers=False)
        for box in bp["boxes"]:
            box.set_facecolor(colors[j % len(colors)])
            box.set_alpha(0.6)
        ax.plot([], [], color=colors[j % len(colors)], lw=6, alpha=0.6, label=variant)
    if one_d:
        ax.scatter(range(len(coords)), coords[:, 0], marker="_", s=400, color="k", zorder=5, label="true label")
        ax.set_ylabel("expected label Σ p_l · l")
    else:
        ax.set_ylabel("||expected coordinate − true||₂")
    ax.set_xticks(range(len(label_space.labels)), label_space.labels, rotation=20, fontsize=8)
    ax.set_xlabel("ground-truth label")
    ax.set_title(f"{label_space.task.upper()} ({test_set} test): expected label per true label")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def expected_vs_true(probabilities: Mapping[str, Mapping[str, np.ndarray]], labels: np.ndarray, label_space,
                     constant: np.ndarray, test_set: str = "ALL") -> plt.Figure:
    """The expected label against the true label, one line per variant: for each ground-truth label, the mean
    over its test texts of the expected coordinate Σ_l p_l coord(l), one panel per coordinate axis. A model that
    reads its texts follows the true coordinates (black ticks); a near-constant one lies flat, near the best
    constant prediction's coordinate (grey dashes: the point a constant must predict to score the lowest
    Semantic Distance), which is what its Semantic Distance is compared with."""
    coords = np.asarray(label_space.coordinates, dtype=float)
    present = [k for k in range(len(coords)) if np.any(labels == k)]
    n_axes = coords.shape[1]
    fig, axes = plt.subplots(1, n_axes, figsize=(4.8 * n_axes + 1.8, 3.9), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for a in range(n_axes):
        ax = axes[0, a]
        for j, (variant, by_set) in enumerate(probabilities.items()):
            e = expected_label_coordinates(by_set[test_set], coords)
            means = [e[labels == k, a].mean() for k in present]
            style = dict(color="k", lw=2.2) if variant.startswith("global") else dict(color=cmap(j % 20), lw=1.2)
            ax.plot(present, means, marker="o", ms=3, label=variant, **style)
        ax.scatter(present, coords[present, a], marker="_", s=500, color="k", zorder=5, label="true label")
        ax.axhline(float(constant[a]), color="0.5", ls="--", lw=0.8, label="best constant")
        ax.set_xticks(present, [label_space.labels[k] for k in present], rotation=20, fontsize=8)
        ax.set_xlabel("ground-truth label")
        ax.set_ylabel("mean expected label" if n_axes == 1 else f"mean expected coordinate, axis {a + 1}")
        ax.grid(lw=0.3)
    axes[0, 0].set_title(f"{label_space.task.upper()} ({test_set} test): expected vs true label", fontsize=9)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, loc="center right", fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.78 if n_axes == 1 else 0.86, 1))
    return fig


def sinkhorn_vs_entropy(rows: pd.DataFrame, test_set: str = "ALL") -> plt.Figure:
    """Score and Semantic Distance on ``test_set`` of Sinkhorn vs Entropy for each weighting, per task (KNOT
    tables 2–4): one dot per (loss, weighting) — the mean over seeds with its 95% CI as a bar when the rows
    carry ``score_ci95`` / ``semantic_distance_ci95`` — and the undistilled global model as a dashed line.
    Dots, not bars: the differences are a few hundredths, invisible on bars that must start at zero."""
    glob = rows[(rows.test_set == test_set) & rows.variant.astype(str).str.startswith("global")]
    rows = rows[(rows.test_set == test_set) & rows.loss.isin(["sinkhorn", "kl"])
                & ~rows.variant.str.endswith("onehot")]
    if "arm" in rows:  # the papers' variants only (the one-hot, mixture and soft-bias arms have their own rows)
        rows = rows[rows.arm == "replication"]
    tasks = list(dict.fromkeys(rows.task))
    fig, axes = plt.subplots(2, max(len(tasks), 1), figsize=(4.2 * max(len(tasks), 1), 5.6), squeeze=False)
    styles = [("sinkhorn", "Sinkhorn", "tab:blue", "o"), ("kl", "Entropy (KL)", "tab:orange", "s")]
    for j, task in enumerate(tasks):
        sub = rows[rows.task == task]
        weightings = list(dict.fromkeys(sub.weighting))
        for i, (metric, title) in enumerate([("score", "score (macro-F1 / accuracy) ↑"),
                                             ("semantic_distance", "Semantic Distance ↓")]):
            ax = axes[i, j]
            for k, (loss, name, color, marker) in enumerate(styles):
                mine = sub[sub.loss == loss].set_index("weighting").reindex(weightings)
                err = mine[f"{metric}_ci95"].to_numpy() if f"{metric}_ci95" in mine else None
                ax.errorbar(np.arange(len(weightings)) + (k - 0.5) * 0.2, mine[metric].to_numpy(), yerr=err,
                            ls="none", marker=marker, ms=7, capsize=3, color=color, label=name)
            g = glob[glob.task == task][metric]
            if len(g):
                ax.axhline(float(g.iloc[0]), color="k", lw=0.8, ls="--", label="global model (no distillation)")
            ax.set_xticks(range(len(weightings)), weightings)
            ax.set_xlim(-0.6, len(weightings) - 0.4)
            ax.margins(y=0.25)
            ax.set_title(f"{task.upper()} ({test_set}): {title}", fontsize=9)
            ax.grid(axis="y", lw=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=max(1, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


VERDICT_COLORS = {"replicates": "tab:green", "reversed": "tab:red", "undecided": "tab:gray",
                  "first better": "tab:green", "second better": "tab:red", "uninformative": "tab:purple"}


def claims_figure(claims: pd.DataFrame) -> plt.Figure:
    """The papers' claims as paired differences over seeds (``otfed.distill.evaluation.paired_claims``): per
    task (columns) and metric (rows: score ↑, Semantic Distance ↓), one line per claim — the mean difference
    better − baseline with its 95% CI, coloured by verdict (green: the CI excludes 0 on the papers' side,
    red: on the other side, grey: undecided; in the mechanism arms green / red mean the first / second variant
    is better; purple: uninformative, a student involved does not beat its best constant). The papers claim
    differences right of 0 for the score and left of 0 for Semantic Distance."""
    tasks = list(dict.fromkeys(claims.task)) or [""]
    names = list(dict.fromkeys(claims.claim))
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.6 * len(tasks), 0.32 * max(len(names), 1) * 2 + 2.2),
                             squeeze=False)
    for j, task in enumerate(tasks):
        for i, (metric, title) in enumerate([("score", "Δ score (papers: > 0)"),
                                             ("semantic_distance", "Δ Semantic Distance (papers: < 0)")]):
            ax = axes[i, j]
            sub = claims[(claims.task == task) & (claims.metric == metric)].set_index("claim").reindex(names)
            y = np.arange(len(names))[::-1]
            for yy, r in zip(y, sub.itertuples()):
                if pd.isna(r.mean_difference):
                    continue
                err = 0.0 if pd.isna(r.ci95) else r.ci95
                ax.errorbar(r.mean_difference, yy, xerr=err, fmt="o", capsize=3,
                            color=VERDICT_COLORS.get(r.verdict, "k"))
            ax.axvline(0.0, color="k", lw=0.8)
            ax.set_yticks(y, names if j == 0 else [""] * len(names), fontsize=7)
            ax.set_title(f"{str(task).upper()}: {title}", fontsize=9)
            ax.grid(axis="x", lw=0.3)
    for verdict, color in VERDICT_COLORS.items():
        if verdict in set(claims.get("verdict", [])):
            axes[0, 0].plot([], [], "o", color=color, label=verdict)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
