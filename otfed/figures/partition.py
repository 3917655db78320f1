"""Figure of stage ``partition``: class histogram per client, one panel per federation."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def class_histograms(manifest: dict) -> plt.Figure:
    """Clients × classes heatmaps of training-set class counts (corrupted counts in the row labels)."""
    names = list(manifest)
    cols = min(3, len(names))
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        clients = manifest[name]["clients"]
        width = max(len(c["class_counts"]) for c in clients)
        counts = np.array([c["class_counts"] + [0] * (width - len(c["class_counts"])) for c in clients])
        ax.imshow(counts, aspect="auto", cmap="Blues")
        ax.set_yticks(range(len(clients)),
                      [f"{c['name']}" + (f" ({c['n_corrupted']} noisy)" if c["n_corrupted"] else "") for c in clients],
                      fontsize=6)
        ax.set_xticks(range(width))
        ax.set(title=f"{name} ({manifest[name]['spec']['scheme']})", xlabel="class")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    return fig
