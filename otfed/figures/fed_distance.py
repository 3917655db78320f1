"""Figures of stage ``fed_distance`` (matplotlib, Agg backend): each returns a Figure for the report step."""
from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

METHOD_STYLE = {"exact_ot": ("black", "-"), "fedwad_approx": ("tab:blue", "-"),
                "fedwad_exact_interp": ("tab:orange", "--")}


def toy_error_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 2 (relative error): |estimate − W| / W vs n of every FedWaD variant, one panel per
    (d, ratio). ``rows``: the toy table (method, dim, ratio, n, support, rel_error), mean over repeats."""
    return _toy_panels(rows[rows.method != "exact_ot"], "rel_error", "|est − W| / W", "relative error", floor=1e-8)


def toy_time_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 2 (running time): wall time vs n of the exact W and every FedWaD variant, one panel per
    (d, ratio). ``rows``: the toy table with its ``seconds`` column, mean over repeats. Wall times differ on
    every run (and machine): keep this figure apart from the reproducible ones."""
    return _toy_panels(rows, "seconds", "time (s)", "running time")


def _toy_panels(rows: pd.DataFrame, column: str, ylabel: str, what: str, floor: float | None = None) -> plt.Figure:
    """``column`` vs n (log-log), one line per method × support, one panel per (d, ratio), two per row."""
    combos = list(rows[["dim", "ratio"]].drop_duplicates().sort_values(["dim", "ratio"]).itertuples(index=False))
    ncols = max(min(2, len(combos)), 1)
    nrows = max(-(-len(combos) // ncols), 1)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.5 * ncols, 3.3 * nrows), squeeze=False)
    rows = rows.assign(support=rows.support.where(rows.method != "fedwad_exact_interp", -1))
    agg = rows.groupby(["method", "dim", "ratio", "n", "support"], as_index=False)[column].mean()
    for ax, (dim, ratio) in zip(axes.flat, combos):
        sub = agg[(agg.dim == dim) & (agg.ratio == ratio)]
        for (method, support), line in sub.groupby(["method", "support"]):
            color, ls = METHOD_STYLE.get(method, ("gray", ":"))
            label = {"exact_ot": "exact W (POT)", "fedwad_exact_interp": "FedWaD exact interp. (S=n)"}.get(
                method, f"FedWaD approx S={support}")
            alpha = 0.4 + 0.6 * (np.log10(support) / 2.0 if support > 0 else 1.0)
            values = line[column] if floor is None else line[column].clip(lower=floor)
            ax.plot(line.n, values, color=color, ls=ls, marker="o", ms=3, alpha=min(alpha, 1), label=label)
        ax.set(xscale="log", yscale="log", xlabel="n (samples of μ)", ylabel=ylabel,
               title=f"d={dim}, ratio 1:{ratio} — {what}")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(combos):]:
        ax.set_axis_off()
    fig.tight_layout()
    return fig


def convergence_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 3: A^k / W − 1 per iteration, one panel per dimension; a last panel (when the rows have
    ``estimate_rel_error``) with the final estimate's relative error vs the support S (approximate
    interpolation, random t), one line per dimension, and the 5% line."""
    dims = sorted(rows.dim.unique())
    sweep = "estimate_rel_error" in rows
    fig, axes = plt.subplots(1, len(dims) + sweep, figsize=(5.5 * (len(dims) + sweep), 4.2), squeeze=False)
    if sweep:
        ax = axes[0][-1]
        last = rows.sort_values("iteration").groupby(["dim", "setting"]).tail(1)
        last = last[(last.interpolation == "approx") & (last.t.astype(str) == "random")]
        for dim, line in last.groupby("dim"):
            line = line.sort_values("support")
            ax.plot(line.support, line.estimate_rel_error.clip(lower=1e-10), "o-", label=f"d = {dim}")
        ax.axhline(0.05, color="k", ls=":", lw=0.8)
        ax.set(yscale="log", xlabel="support S (n = samples per client)", ylabel="|estimate − W| / W",
               title=f"final error vs S, n = {int(rows.n.iloc[0])}")
        ax.legend(fontsize=8)
    for ax, dim in zip(axes[0], dims):
        for setting, line in rows[rows.dim == dim].groupby("setting"):
            exact = str(setting).startswith("exact")  # coincides with approx at S = n (theorem 1): dashed on top
            ax.plot(line.iteration, line.rel_gap.clip(lower=1e-10), marker="x" if exact else ".",
                    ls="--" if exact else "-", label=setting)
        ax.set(yscale="log", xlabel="iteration k", ylabel="A(k) / W − 1", title=f"convergence, d={dim}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07 * ((len(labels) + 4) // 5), 1, 1))
    return fig


def otdd_heatmaps(names: Sequence[str], federated: np.ndarray, exact: np.ndarray, order_fraction: float) -> plt.Figure:
    """FedWaD fig. 6: federated vs exact OTDD matrices side by side (shared colour scale)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.3))
    vmax = float(max(np.max(federated), np.max(exact)))
    for ax, mat, title in [(axes[0], exact, "exact OTDD"), (axes[1], federated, "federated OTDD (FedWaD)")]:
        im = ax.imshow(mat, vmin=0, vmax=vmax, cmap="viridis")
        ax.set_xticks(range(len(names)), names, rotation=30)
        ax.set_yticks(range(len(names)), names if ax is axes[0] else [])  # same order: names once
        for i in range(len(names)):
            for j in range(len(names)):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
        ax.set_title(title)
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle(f"order relations preserved: {order_fraction:.1%}")
    return fig


def clustering_heatmap(distances: np.ndarray, groups: np.ndarray, title: str) -> plt.Figure:
    """Pairwise federated OTDD between clients, sorted by planted group (block structure ⇒ clusterable)."""
    order = np.argsort(groups, kind="stable")
    fig, ax = plt.subplots(figsize=(5.5, 4.8))
    im = ax.imshow(distances[np.ix_(order, order)], cmap="magma")
    ax.set_xticks(range(len(order)), [str(g) for g in groups[order]], fontsize=6)
    ax.set_yticks(range(len(order)), [str(g) for g in groups[order]], fontsize=6)
    ax.set(xlabel="client (planted group)", ylabel="client (planted group)", title=title)
    fig.colorbar(im, ax=ax, label="federated OTDD")
    fig.tight_layout()
    return fig


def clustered_fl_figure(summary: pd.DataFrame) -> plt.Figure:
    """FedWaD tables 1–5 as bars: pooled held-out accuracy (mean ± 95% CI over seeds) of each algorithm
    trained globally, within the federated-OTDD clusters and within the planted groups; one panel per
    federation. ``summary``: federation, clustering, algorithm, accuracy, accuracy_ci95."""
    feds = list(dict.fromkeys(summary.federation))
    fig, axes = plt.subplots(1, len(feds), figsize=(4.6 * len(feds), 3.6), squeeze=False, sharey=True)
    for ax, fed in zip(axes[0], feds):
        sub = summary[summary.federation == fed]
        algorithms = list(dict.fromkeys(sub.algorithm))
        clusterings = list(dict.fromkeys(sub.clustering))
        width = 0.8 / len(clusterings)
        for j, clustering in enumerate(clusterings):
            cell = sub[sub.clustering == clustering].set_index("algorithm").reindex(algorithms)
            x = np.arange(len(algorithms)) + (j - (len(clusterings) - 1) / 2) * width
            ax.bar(x, cell.accuracy, width, yerr=np.nan_to_num(cell.accuracy_ci95.to_numpy(dtype=float)),
                   capsize=2, label=clustering)
            for xi, v in zip(x, cell.accuracy):
                ax.text(xi, 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=6, rotation=90, color="white")
        ax.set_xticks(range(len(algorithms)), algorithms)
        ax.set_ylim(0, 1.0)
        ax.set_title(fed)
    axes[0][0].set_ylabel("pooled held-out accuracy (mean ± 95% CI)")
    axes[0][-1].legend(title="trained within", fontsize=7, title_fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def coreset_figure(summary: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 5 / 12 as bars: pooled held-out accuracy (mean ± 95% CI over seeds) of the 1-NN
    classifier over all clients' coresets (federated and exact, per coreset size) next to global FedAvg /
    FedPer / FedRep on the same splits; one panel per federation. ``summary``: federation, method,
    accuracy, accuracy_ci95."""
    feds = list(dict.fromkeys(summary.federation))
    fig, axes = plt.subplots(1, len(feds), figsize=(4.8 * len(feds), 3.8), squeeze=False, sharey=True)
    for ax, fed in zip(axes[0], feds):
        sub = summary[summary.federation == fed]
        colors = ["tab:blue" if "fedwad" in m else "tab:gray" if "exact" in m else "tab:orange" for m in sub.method]
        ax.bar(range(len(sub)), sub.accuracy, yerr=np.nan_to_num(sub.accuracy_ci95.to_numpy(dtype=float)),
               capsize=2, color=colors)
        for k, v in enumerate(sub.accuracy):
            ax.text(k, 0.02, f"{v:.2f}", ha="center", va="bottom", fontsize=6, rotation=90, color="white")
        ax.set_xticks(range(len(sub)), sub.method, rotation=45, ha="right", fontsize=7)
        ax.set_ylim(0, 1.0)
        ax.set_title(fed)
    axes[0][0].set_ylabel("pooled held-out accuracy (mean ± 95% CI)")
    fig.tight_layout()
    return fig


PROTOCOL_STYLE = {"fedwad": ("tab:blue", "FedWaD"), "otdd": ("tab:green", "federated OTDD"),
                  "fedbary": ("tab:red", "FedBary")}


def _epsilon_positions(epsilons: Sequence[float]) -> tuple[dict[float, float], list[float], list[str]]:
    """x positions of ε values on a log10 axis, ε = ∞ one decade right of the largest finite ε; ticks, labels."""
    finite = sorted(e for e in set(epsilons) if np.isfinite(e))
    top = np.log10(finite[-1]) + 1.0 if finite else 0.0
    pos = {e: (float(np.log10(e)) if np.isfinite(e) else top) for e in set(epsilons)}
    ticks = sorted(pos.values())
    labels = ["∞" if not np.isfinite(e) else f"{e:g}" for e in sorted(pos, key=pos.get)]
    return pos, ticks, labels


def privacy_figure(attack: pd.DataFrame, dp: pd.DataFrame | None = None,
                   clustering: pd.DataFrame | None = None, dp_fedbary: pd.DataFrame | None = None) -> plt.Figure:
    """The honest-but-curious server's attack and the DP defence (FedWaD §3, FedBary §4.4).

    Left: fraction of the target's samples the server recovers vs the support S, per protocol, under the papers'
    defences (approximate interpolation, random t, distances only at the end, the largest K; solid) and with
    a public fixed t (dashed); FedBary with a server validation set dotted; grey: the non-member baseline.
    With ``dp`` (summary rows per DP cell: support, t, epsilon, recovered,
    non_member, rel_error, fedwad_rel_error): the attack's recovered fraction vs ε per DP setting with its
    non-member baseline, and the DP estimate's relative error vs ε with the non-DP FedWaD error (dashed); with
    ``clustering`` (rows epsilon, method, ari): the spectral clustering's ARI vs ε; with ``dp_fedbary`` (rows
    support, epsilon, recovered, non_member): the attack on DP FedBary vs ε, dash-dotted in the attack panel.
    ``attack``: summary rows (protocol, interpolation, support, t, iterations, distances, validation,
    recovered, non_member)."""
    panels = 1 + (2 if dp is not None and len(dp) else 0) + (1 if clustering is not None and len(clustering) else 0)
    fig, axes = plt.subplots(1, panels, figsize=(4.8 * panels, 3.9), squeeze=False)
    ax = axes[0][0]
    k = attack.iterations.max()
    supports = list(dict.fromkeys(attack.support))
    x = {s: i for i, s in enumerate(supports)}
    approx = attack[(attack.interpolation == "approx") & (attack.iterations == k)
                    & ((attack.distances == "last") | (attack.protocol == "fedbary"))]
    for protocol, color_label in PROTOCOL_STYLE.items():
        color, label = color_label
        for t_kind, ls in (("random", "-"), ("fixed", "--")):
            for validation in (False, True):
                sub = approx[(approx.protocol == protocol) & (approx.validation == validation)
                             & ((approx.t == "random") == (t_kind == "random"))]
                if sub.empty:
                    continue
                sub = sub.drop_duplicates("support")
                name = f"{label}, t {'random' if t_kind == 'random' else sub.t.iloc[0]}"
                ax.plot([x[s] for s in sub.support], sub.recovered, color=color, ls=":" if validation else ls,
                        marker="o", ms=4, label=name + (", validation Q" if validation else ""))
    base = approx.groupby("support", sort=False).non_member.mean()
    ax.plot([x[s] for s in base.index], base.to_numpy(), color="gray", ls="-", lw=3, alpha=0.4,
            label="non-members (baseline)")
    ax.set_xticks(range(len(supports)), [f"S = {s}" for s in supports])
    ax.set(ylim=(-0.03, 1.03), ylabel="fraction of the target's samples recovered",
           title=f"attack under the papers' defences (K = {k})")
    ax.legend(fontsize=6)
    col = 1
    if dp is not None and len(dp):
        pos, ticks, labels = _epsilon_positions(dp.epsilon.tolist())
        ax_r, ax_e = axes[0][col], axes[0][col + 1]
        col += 2
        for i, ((support, t), sub) in enumerate(dp.groupby(["support", "t"], sort=False)):
            sub = sub.sort_values("epsilon")
            xs = [pos[e] for e in sub.epsilon]
            color = f"C{i}"
            ax_r.plot(xs, sub.recovered, "o-", color=color, label=f"FedWaD, S = {support}, t {t}")
            ax_r.plot(xs, sub.non_member, ":", color=color, alpha=0.7)
            ax_e.plot(xs, sub.rel_error.clip(lower=1e-6), "o-", color=color, label=f"DP, S = {support}, t {t}")
            ax_e.axhline(float(sub.fedwad_rel_error.mean()), color=color, ls="--", lw=0.8)
        if dp_fedbary is not None and len(dp_fedbary):
            for j, (support, sub) in enumerate(dp_fedbary.groupby("support", sort=False)):
                sub = sub[sub.epsilon.isin(list(pos))].sort_values("epsilon")
                color = f"C{j + 5}"
                ax_r.plot([pos[e] for e in sub.epsilon], sub.recovered, "s-.", color=color,
                          label=f"FedBary, S = {support}, t random, validation Q")
                ax_r.plot([pos[e] for e in sub.epsilon], sub.non_member, ":", color=color, alpha=0.7)
        for a in (ax_r, ax_e):
            a.set_xticks(ticks, labels)
            a.set_xlabel("ε per client (δ fixed; ∞: no noise)")
        ax_r.set(ylim=(-0.03, 1.03), ylabel="recovered (dotted: non-members)",
                 title="attack on DP messages (every client DP)")
        ax_e.set(yscale="log", ylabel="|estimate − W2| / W2", title="DP FedWaD error (dashed: non-DP FedWaD)")
        ax_r.legend(fontsize=7)
        ax_e.legend(fontsize=7)
    if clustering is not None and len(clustering):
        ax_c = axes[0][col]
        pos, ticks, labels = _epsilon_positions(clustering.epsilon.tolist())
        for method, sub in clustering.groupby("method", sort=False):
            sub = sub.sort_values("epsilon")
            ax_c.plot([pos[e] for e in sub.epsilon], sub.ari, "o-", label=method)
        ax_c.set_xticks(ticks, labels)
        ax_c.set(ylim=(min(-0.1, float(clustering.ari.min()) - 0.05), 1.05),
                 xlabel="ε per client (over its n − 1 sessions)", ylabel="ARI vs planted groups",
                 title=f"clustering on DP FedWaD ({int(clustering.clients.iloc[0])} clients)")
        ax_c.legend(fontsize=7)
    fig.tight_layout()
    return fig
