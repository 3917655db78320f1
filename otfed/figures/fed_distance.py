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


def toy_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 2: running time and relative error vs n, one row of panels per (d, ratio)."""
    combos = rows[["dim", "ratio"]].drop_duplicates().sort_values(["dim", "ratio"]).itertuples(index=False)
    combos = list(combos)
    fig, axes = plt.subplots(len(combos), 2, figsize=(11, 3.3 * len(combos)), squeeze=False)
    rows = rows.assign(support=rows.support.where(rows.method != "fedwad_exact_interp", -1))
    agg = rows.groupby(["method", "dim", "ratio", "n", "support"], as_index=False)[["seconds", "rel_error"]].mean()
    for r, (dim, ratio) in enumerate(combos):
        sub = agg[(agg.dim == dim) & (agg.ratio == ratio)]
        for (method, support), line in sub.groupby(["method", "support"]):
            color, ls = METHOD_STYLE.get(method, ("gray", ":"))
            label = {"exact_ot": "exact W (POT)", "fedwad_exact_interp": "FedWaD exact interp. (S=n)"}.get(
                method, f"FedWaD approx S={support}")
            alpha = 0.4 + 0.6 * (np.log10(support) / 2.0 if support > 0 else 1.0)
            axes[r, 0].plot(line.n, line.seconds, color=color, ls=ls, marker="o", ms=3, alpha=min(alpha, 1), label=label)
            if method != "exact_ot":
                axes[r, 1].plot(line.n, line.rel_error.clip(lower=1e-8), color=color, ls=ls, marker="o", ms=3,
                                alpha=min(alpha, 1), label=label)
        axes[r, 0].set(xscale="log", yscale="log", xlabel="n (samples of μ)", ylabel="time (s)",
                       title=f"d={dim}, ratio 1:{ratio} — running time")
        axes[r, 1].set(xscale="log", yscale="log", xlabel="n (samples of μ)", ylabel="|est − W| / W",
                       title=f"d={dim}, ratio 1:{ratio} — relative error")
        axes[r, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def convergence_figure(rows: pd.DataFrame) -> plt.Figure:
    """FedWaD fig. 3: A^k / W − 1 per iteration, one panel per dimension."""
    dims = sorted(rows.dim.unique())
    fig, axes = plt.subplots(1, len(dims), figsize=(5.5 * len(dims), 3.8), squeeze=False)
    for ax, dim in zip(axes[0], dims):
        for setting, line in rows[rows.dim == dim].groupby("setting"):
            exact = str(setting).startswith("exact")  # coincides with approx at S = n (theorem 1): dashed on top
            ax.plot(line.iteration, line.rel_gap.clip(lower=1e-10), marker="x" if exact else ".",
                    ls="--" if exact else "-", label=setting)
        ax.set(yscale="log", xlabel="iteration k", ylabel="A(k) / W − 1", title=f"convergence, d={dim}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
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
