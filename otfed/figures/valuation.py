"""Figures of stages ``barycenter_valuation`` and ``noisy_removal`` (matplotlib, Agg backend): each returns
a Figure for the report step (``Report.figure``)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

METHOD_COLORS = {"fedbary_validation": "tab:blue", "fedbary_barycenter": "tab:cyan", "exact_shapley": "black",
                 "leave_one_out": "tab:orange", "monte_carlo_shapley": "tab:gray", "tmc_shapley": "silver",
                 "one_round": "tab:brown", "multi_round": "tab:pink", "gtg_shapley": "tab:olive", "fedbary": "tab:blue",
                 "lava": "tab:green", "knn_shapley": "tab:purple", "random": "tab:red"}


YLIM = (-50.0, 100.0)


def contributions_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedBary fig. 4: contribution (%) per client, one group of bars per client and one bar per method,
    one panel per federation (case). The axis is clipped to [−50, 100] %; values outside are printed."""
    feds = list(dict.fromkeys(rows.federation))
    methods = list(dict.fromkeys(rows.method))
    fig, axes = plt.subplots(1, len(feds), figsize=(4.2 * len(feds), 3.6), squeeze=False, sharey=True)
    width = 0.8 / len(methods)
    for ax, fed in zip(axes[0], feds):
        sub = rows[rows.federation == fed]
        clients = list(dict.fromkeys(sub.client))
        for j, method in enumerate(methods):
            vals = sub[sub.method == method].set_index("client").percent.reindex(clients).to_numpy()
            ax.bar(np.arange(len(clients)) + (j - (len(methods) - 1) / 2) * width, vals, width,
                   label=method, color=METHOD_COLORS.get(method))
        ax.axhline(100 / len(clients), color="k", lw=0.6, ls=":")
        ax.set_xticks(range(len(clients)), [c.replace("client_", "c") for c in clients])
        ax.set_title(fed)
        ax.set_ylim(*YLIM)
        for j, method in enumerate(methods):  # leave-one-out shares explode when Σ v ≈ 0: clip and label
            vals = sub[sub.method == method].set_index("client").percent.reindex(clients).to_numpy()
            for k, v in enumerate(vals):
                if np.isfinite(v) and not YLIM[0] <= v <= YLIM[1]:
                    ax.text(k + (j - (len(methods) - 1) / 2) * width, YLIM[1] if v > 0 else YLIM[0], f"{v:.0f}",
                            fontsize=6, ha="center", va="top" if v > 0 else "bottom", rotation=90)
    axes[0][0].set_ylabel("contribution (%)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def outlier_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedBary fig. 4 (histogram): each client's distance to the federated barycenter (and to the
    validation set), the noisy client in red."""
    targets = list(dict.fromkeys(rows.target))
    fig, axes = plt.subplots(1, len(targets), figsize=(4.5 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets):
        sub = rows[rows.target == target]
        ax.bar(sub.client.str.replace("client_", "c"), sub.distance,
               color=["tab:red" if n else "tab:blue" for n in sub.noisy])
        ax.set_title(f"W(P_i, {'barycenter' if target == 'barycenter' else 'validation'})")
        ax.set_ylabel("FedBary distance")
        for k, d in enumerate(sub.distance):  # bars start at 0 (a cut axis overstates the gap): print values
            ax.text(k, d, f"{d:.1f}", ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, float(sub.distance.max()) * 1.12)
    fig.tight_layout()
    return fig


def detection_figure(scores: pd.DataFrame) -> plt.Figure:
    """FedBary fig. 5 (a, c): F1 and recall of the flags per method, per noise kind and rate."""
    kinds = list(dict.fromkeys(scores.kind))
    methods = list(dict.fromkeys(scores.method))
    fig, axes = plt.subplots(2, len(kinds), figsize=(5 * len(kinds), 6), squeeze=False)
    width = 0.8 / len(methods)
    for c, kind in enumerate(kinds):
        sub = scores[scores.kind == kind]
        rates = sorted(sub.rate.unique())
        for r, metric in enumerate(("f1", "recall")):
            ax = axes[r][c]
            for j, method in enumerate(methods):
                vals = sub[sub.method == method].set_index("rate")[metric].reindex(rates).to_numpy()
                ax.bar(np.arange(len(rates)) + (j - (len(methods) - 1) / 2) * width, vals, width, label=method,
                       color=METHOD_COLORS.get(method))
            ax.set_xticks(range(len(rates)), [f"{100 * x:g}%" for x in rates])
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{kind} noise: {metric}")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def removal_curves_figure(curves: pd.DataFrame) -> plt.Figure:
    """FedBary fig. 5 (b, d): holdout accuracy of a logistic regression refitted after removing the most
    suspicious data first, one panel per (noise kind, rate)."""
    cells = curves[["kind", "rate"]].drop_duplicates().itertuples(index=False)
    cells = list(cells)
    kinds = list(dict.fromkeys(c.kind for c in cells))
    rates = sorted({c.rate for c in cells})
    fig, axes = plt.subplots(len(kinds), len(rates), figsize=(3.8 * len(rates), 3.2 * len(kinds)), squeeze=False)
    for i, kind in enumerate(kinds):
        for j, rate in enumerate(rates):
            ax = axes[i][j]
            sub = curves[(curves.kind == kind) & (curves.rate == rate)]
            for method, line in sub.groupby("method", sort=False):
                ax.plot(100 * line.fraction, line.accuracy, marker=".", label=method, color=METHOD_COLORS.get(method))
            ax.axvline(100 * rate, color="k", lw=0.6, ls=":")
            ax.set_title(f"{kind} noise {100 * rate:g}%")
            ax.set_xlabel("data removed (%)")
            ax.set_ylabel("holdout accuracy")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def removal_figure(summary: pd.DataFrame, budgets: pd.DataFrame | None = None) -> plt.Figure:
    """FedBary table 4: FedAvg test accuracy before removal, after the g > 0 rule, after the
    validation-chosen budget, after the calibrated threshold (when ``summary`` has it), after oracle and random removal — means over seeds with 95% CI bars; and,
    when ``budgets`` is given, validation and test accuracy against the share of data removed (means over
    seeds), one line pair per federation."""
    cols = [("accuracy_before", "before"), ("accuracy_flagged", "FedBary g > 0 removed"),
            ("accuracy_budget", "FedBary budget (validation-chosen)"),
            ("accuracy_calibrated", "FedBary g > τ, calibrated" + (f" (α = {summary['alpha'].iloc[0]:g})"
                                                                   if "alpha" in summary else "")),
            ("accuracy_oracle_removal", "noisy removed (oracle)"), ("accuracy_random_removal", "random removal")]
    cols = [(c, label) for c, label in cols if c in summary]
    panels = 1 if budgets is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(3.0 + 2.4 * len(summary) + 4.0 * (panels - 1), 3.6), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(cols)
    for j, (col, label) in enumerate(cols):
        x = np.arange(len(summary)) + (j - (len(cols) - 1) / 2) * width
        err = summary.get(f"{col}_ci95")
        ax.bar(x, summary[col], width, label=label,
               yerr=None if err is None else np.nan_to_num(err.to_numpy(dtype=float)), capsize=2)
        for xi, v in zip(x, summary[col]):  # the values tell the gaps
            ax.text(xi, 0.02, f"{v:.3f}", ha="center", va="bottom", fontsize=6, rotation=90, color="white")
    ax.set_xticks(range(len(summary)), summary.federation, fontsize=7)
    ax.set_ylabel("FedAvg test accuracy (mean ± 95% CI)")
    ax.set_ylim(0, 1.0)
    if budgets is not None:
        bx = axes[0][1]
        for k, (name, sub) in enumerate(budgets.groupby("federation", sort=False)):
            mean = sub.groupby("budget").agg(validation=("validation_accuracy", "mean"),
                                             test=("test_accuracy", "mean"))
            color = f"C{k}"
            bx.plot(100 * mean.index, mean.validation, "o-", color=color, ms=3, label=f"{name} validation")
            bx.plot(100 * mean.index, mean.test, "s--", color=color, ms=3, label=f"{name} test")
        bx.set_xlabel("share of each client's data removed, largest g first (%)")
        bx.set_ylabel("FedAvg accuracy (mean over seeds)")
        bx.legend(fontsize=6)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


DUPLICATION_SERIES = (("exact_w", "exact W (POT emd)", "black"), ("fedbary_validation", "FedBary, Q = validation",
                                                                   "tab:blue"),
                      ("fedbary_barycenter", "FedBary, Q = barycenter", "tab:cyan"))


def duplication_figure(table: pd.DataFrame, spread: dict[str, list[float]] | None = None) -> plt.Figure:
    """FedBary table 3 as a figure: (left) the client's distance vs how many times its whole dataset
    appears (solid: the same measure; dashed: class statistics re-estimated on the duplicated rows);
    (right) relative change (%) of each distance when one datum is duplicated. ``spread``: FedBary's
    distances over several seeds on the original data, quoted as a coefficient of variation."""
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 3.8))
    ax = axes[0]
    dataset = table[table.experiment == "dataset"]
    for stats, ls in (("original", "-"), ("refit", "--")):
        sub = dataset[dataset.stats == stats].sort_values("copies")
        for col, label, color in DUPLICATION_SERIES:
            ax.plot(sub.copies, sub[col], ls=ls, marker="o" if stats == "original" else "x", color=color,
                    label=f"{label} ({'same measure' if stats == 'original' else 'stats refitted'})")
    ax.set_xticks(sorted(dataset.copies.unique()))
    ax.set(xlabel="copies of the client's dataset", ylabel="$W_2(P_i, Q)$", title="whole dataset duplicated")
    ax.legend(fontsize=6)
    ax = axes[1]
    datum = table[table.experiment == "datum"]
    width = 0.8 / len(DUPLICATION_SERIES)
    for j, (col, label, color) in enumerate(DUPLICATION_SERIES):
        cv = ""
        if spread and len(spread.get(col, [])) > 1:
            vals = np.asarray(spread[col])
            cv = f" (seed sd {100 * vals.std(ddof=1) / vals.mean():.1f}%)"
        ax.bar(np.arange(len(datum)) + (j - 1) * width, 100 * datum[f"{col}_rel_change"], width, color=color,
               label=label + cv)
    ax.axhline(0, color="k", lw=0.6)
    copies = int(datum.copies.iloc[0]) if len(datum) else 0
    ax.set_xticks(range(len(datum)), [f"{d.replace('_', ' ')}\n(g = {v:.3g})" for d, v in zip(datum.datum, datum.datum_value)])
    ax.set(ylabel="relative change of the distance (%)", title=f"one datum × {copies} copies")
    ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def dp_detection_figure(table: pd.DataFrame) -> plt.Figure:
    """DP FedBary vs ε, one line per noise kind (mean over seeds, the seeds as dots): left, the detection ROC
    AUC of the clients' datum values, plain FedBary dashed, chance (0.5) dotted; right, the closing distances'
    mean relative error against plain FedBary (log scale). ε = ∞ (clipping, no noise) at the right end."""
    dp = table[table.epsilon.notna()]
    finite = sorted(e for e in dp.epsilon.unique() if np.isfinite(e))
    eps = finite + ([np.inf] if np.isinf(dp.epsilon).any() else [])
    pos = {e: i for i, e in enumerate(eps)}
    labels = [f"{e:g}" if np.isfinite(e) else "∞" for e in eps]
    fig, (ax_auc, ax_err) = plt.subplots(1, 2, figsize=(10, 3.8))
    for j, (kind, sub) in enumerate(dp.groupby("kind", sort=False)):
        color = f"C{j}"
        x = sub.epsilon.map(pos).to_numpy()
        means = sub.groupby("epsilon").agg(auc=("auc", "mean"), err=("distance_rel_error", "mean"))
        ax_auc.plot([pos[e] for e in means.index], means.auc, "-o", color=color, label=f"{kind} noise, DP FedBary")
        ax_auc.scatter(x, sub.auc, s=8, color=color, alpha=0.4)
        plain = table[(table.kind == kind) & table.epsilon.isna()].auc.mean()
        ax_auc.axhline(plain, color=color, ls="--", lw=1, label=f"{kind} noise, FedBary (no DP)")
        ax_err.plot([pos[e] for e in means.index], np.maximum(means.err, 1e-6), "-o", color=color, label=f"{kind} noise")
    ax_auc.axhline(0.5, color="k", ls=":", lw=0.8, label="chance")
    for ax in (ax_auc, ax_err):
        ax.set_xticks(range(len(eps)), labels)
        ax.set_xlabel("total ε per client (δ = {:g})".format(float(dp.delta.iloc[0])))
    ax_auc.set_ylabel("detection ROC AUC (datum values)")
    ax_auc.set_ylim(0.4, 1.03)
    ax_auc.legend(fontsize=7, loc="lower center")
    ax_err.set_yscale("log")
    ax_err.set_ylabel("closing distances: mean |DP − plain| / plain")
    ax_err.legend(fontsize=7)
    fig.suptitle(f"DP FedBary: noisy-data detection vs ε ({float(dp.rate.iloc[0]):.0%} of the data noisy)")
    fig.tight_layout()
    return fig
